//! Writing `.onnx` (and `.onnx.data`) files atomically.

use std::fmt;
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use mmq_ir::fsio::{AtomicFile, lock_dir};
use mmq_ir::{ConstData, GraphId, Module, Storage};
use prost::Message;

use crate::error::ExportError;
use crate::export::{export_model, used_consts};
use crate::external::{DataFileSink, ExternalLocation, ExternalSink, InlineSink};
use crate::proto as pb;

/// The largest protobuf message ONNX tools can read (2 GiB - 1).
pub const PROTOBUF_LIMIT: u64 = (1 << 31) - 1;

/// With [`ExternalData::Auto`], weights go to an external data file when the model's tensor
/// data exceeds this many bytes (about 1.8 GiB, leaving room below [`PROTOBUF_LIMIT`]).
pub const AUTO_EXTERNAL_ABOVE: u64 = (PROTOBUF_LIMIT / 10) * 9;

/// When tensor data is written to a `<model file name>.data` file beside the model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExternalData {
    /// When the tensor data would exceed [`AUTO_EXTERNAL_ABOVE`] bytes, or when any tensor of
    /// the source was already external.
    #[default]
    Auto,
    /// Always (tensors of at least [`ExportOptions::size_threshold`] bytes).
    Always,
    /// Never: everything inline; a model above the protobuf limit is an error.
    Never,
}

/// Options for [`write_model`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportOptions {
    /// Whether to use an external data file.
    pub external_data: ExternalData,
    /// When an external data file is used, tensors of at least this many bytes go into it
    /// (default 1024). Smaller tensors and string tensors stay inline.
    pub size_threshold: u64,
    /// Flush the written files to stable storage (fsync) before renaming them into place. Off by
    /// default: the temporary-file-then-rename already guarantees that an interrupted run never
    /// leaves a half-written model; the flush adds durability across power loss at the cost of
    /// writing every weight to disk before returning.
    pub sync: bool,
    /// Tensors whose bytes already lie in a file beside the model (a quantization-parameter
    /// table): by tensor name, where they are. They are written as `external_data` references
    /// to that file, never copied, whatever `external_data` says for the other tensors.
    pub references: Vec<(String, ExternalLocation)>,
}

impl Default for ExportOptions {
    fn default() -> Self {
        ExportOptions {
            external_data: ExternalData::Auto,
            size_threshold: 1024,
            sync: false,
            references: Vec::new(),
        }
    }
}

/// Answers the tensors of `refs` with their location, and offers the others to `inner`.
struct ReferenceSink<'a> {
    refs: &'a [(String, ExternalLocation)],
    inner: &'a mut dyn ExternalSink,
}

impl ExternalSink for ReferenceSink<'_> {
    fn offer(
        &mut self,
        name: &str,
        data: &ConstData,
    ) -> Result<Option<ExternalLocation>, ExportError> {
        match self.refs.iter().find(|(n, _)| n == name) {
            Some((_, loc)) if loc.length == data.byte_len() => Ok(Some(loc.clone())),
            Some((_, loc)) => Err(ExportError::BadTensor {
                tensor: name.to_owned(),
                reason: format!(
                    "{} bytes, but its reference into {} holds {}",
                    data.byte_len(),
                    loc.location,
                    loc.length
                ),
            }),
            None => self.inner.offer(name, data),
        }
    }
}

/// What [`write_model`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteReport {
    /// The model file.
    pub model_path: PathBuf,
    /// Size of the model file in bytes.
    pub model_bytes: u64,
    /// Tensor bytes stored inside the model file.
    pub inline_bytes: u64,
    /// The external data file, when one was written.
    pub data_path: Option<PathBuf>,
    /// Tensor bytes stored in the external data file (alignment padding excluded).
    pub external_bytes: u64,
    /// Number of tensors in the external data file.
    pub external_tensors: usize,
    /// Every file written, the model last.
    pub files: Vec<PathBuf>,
}

impl fmt::Display for WriteReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} bytes, {} bytes of tensor data inline",
            self.model_bytes, self.inline_bytes
        )?;
        if let Some(p) = &self.data_path {
            write!(
                f,
                ", {} bytes in {} tensors in {}",
                self.external_bytes,
                self.external_tensors,
                p.display()
            )?;
        }
        Ok(())
    }
}

/// A file the module was read from.
struct InputFile {
    path: PathBuf,
    canonical: Option<PathBuf>,
    id: Option<(u64, u64)>,
}

fn file_id(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|md| (md.dev(), md.ino()))
}

fn module_inputs(m: &Module) -> Vec<InputFile> {
    let mut paths: Vec<&Path> = m
        .entries
        .iter()
        .filter_map(|e| e.model.source.as_deref())
        .collect();
    for (_, c) in m.consts.iter() {
        if let Storage::External { file, .. } = &c.storage {
            paths.push(&file.path);
        }
    }
    paths.sort();
    paths.dedup();
    paths
        .into_iter()
        .map(|p| InputFile {
            path: p.to_owned(),
            canonical: p.canonicalize().ok(),
            id: file_id(p),
        })
        .collect()
}

/// Fails when writing `target` (whose canonical form, were it created, is `canonical`) would
/// replace one of `inputs`.
fn check_not_input(
    target: &Path,
    canonical: &Path,
    inputs: &[InputFile],
) -> Result<(), ExportError> {
    let existing = target.canonicalize().ok();
    let id = file_id(target);
    for input in inputs {
        let same_path = input
            .canonical
            .as_deref()
            .is_some_and(|c| c == canonical || existing.as_deref() == Some(c));
        let same_file = id.is_some() && id == input.id;
        if same_path || same_file {
            return Err(ExportError::OverwritesInput {
                output: target.to_owned(),
                input: input.path.clone(),
            });
        }
    }
    Ok(())
}

/// The file stem each entry graph is written under when a module of several graphs goes to one
/// directory: the stem of the file it was loaded from (`inputs`, in entry order, when there is
/// one file per entry), else the graph's name (the graphs of a split: `vision_encoder`,
/// `language_model`). Two graphs with one stem would overwrite each other: that is an error naming
/// both sources, found before any work (the stems depend on the input paths alone).
pub fn entry_stems(m: &Module, inputs: &[PathBuf]) -> Result<Vec<String>, StemClash> {
    let inputs = if inputs.len() == m.entries.len() {
        inputs
    } else {
        &[]
    };
    let stems: Vec<(String, String)> = m
        .entries
        .iter()
        .enumerate()
        .map(|(i, e)| match inputs.get(i).and_then(|p| p.file_stem()) {
            Some(s) => (
                s.to_string_lossy().into_owned(),
                inputs[i].display().to_string(),
            ),
            None => {
                let name = m.graphs[e.graph].name.clone();
                (name.clone(), format!("graph '{name}'"))
            }
        })
        .collect();
    check_distinct(&stems)?;
    Ok(stems.into_iter().map(|(s, _)| s).collect())
}

/// [`entry_stems`]' check on the input paths alone, for callers that have not loaded them yet.
pub fn check_distinct_stems(inputs: &[PathBuf]) -> Result<(), StemClash> {
    let stems: Vec<(String, String)> = inputs
        .iter()
        .map(|p| {
            let stem = p.file_stem().map(|s| s.to_string_lossy().into_owned());
            (stem.unwrap_or_default(), p.display().to_string())
        })
        .collect();
    check_distinct(&stems)
}

/// Two graphs that would be written under one file name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{first} and {second} would both be written as {stem}.onnx in the output directory; rename \
     one of them"
)]
pub struct StemClash {
    /// Where the first came from (its file, or `graph 'NAME'`).
    pub first: String,
    /// Where the second came from.
    pub second: String,
    /// The stem.
    pub stem: String,
}

fn check_distinct(stems: &[(String, String)]) -> Result<(), StemClash> {
    for (i, (stem, from)) in stems.iter().enumerate() {
        if let Some((_, other)) = stems[..i].iter().find(|(s, _)| s == stem) {
            return Err(StemClash {
                first: other.clone(),
                second: from.clone(),
                stem: stem.clone(),
            });
        }
    }
    Ok(())
}

/// The deepest subgraph nesting ONNX readers load. Every level of nesting is three protobuf
/// messages deeper (node, attribute, graph) and protobuf's parsers stop at 100 by default
/// (Python's `onnx.load`, ONNX Runtime); the model, the top graph and a tensor attribute in the
/// innermost graph take the rest.
pub const MAX_SUBGRAPH_DEPTH: usize = 31;

/// Refuses a graph whose subgraphs nest deeper than [`MAX_SUBGRAPH_DEPTH`].
fn check_depth(m: &Module, graph: GraphId) -> Result<(), ExportError> {
    let mut stack = vec![(graph, 0usize)];
    while let Some((g, depth)) = stack.pop() {
        if depth > MAX_SUBGRAPH_DEPTH {
            return Err(ExportError::TooDeep {
                graph: m.graphs[g].name.clone(),
                depth,
                limit: MAX_SUBGRAPH_DEPTH,
            });
        }
        for &n in m.graphs[g].nodes() {
            stack.extend(
                m.nodes[n]
                    .op
                    .subgraphs()
                    .into_iter()
                    .map(|s| (s, depth + 1)),
            );
        }
    }
    Ok(())
}

fn temp_for(path: &Path) -> Result<AtomicFile, ExportError> {
    AtomicFile::create(path).map_err(|e| ExportError::io("cannot create a file for", path, e))
}

/// Exports top-level graph `graph` of `m` to the ONNX file `out`.
///
/// External data, when used (see [`ExternalData`]), goes to `<file name of out>.data` in the
/// same directory, each tensor aligned to 4096 bytes. Both files are written as
/// [`AtomicFile`]s (anonymous until complete, so an error or a crash leaves no partial output)
/// and renamed into place together under the directory's lock, the data file first. Writing over any file the module was read from (model sources and external data
/// files) is refused.
pub fn write_model(
    m: &Module,
    graph: GraphId,
    out: &Path,
    opts: &ExportOptions,
) -> Result<WriteReport, ExportError> {
    let file_name =
        out.file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| ExportError::OutputPath {
                path: out.to_owned(),
                reason: "it has no file name, or the name is not valid UTF-8".to_owned(),
            })?;
    let dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    let dir_canonical = dir
        .canonicalize()
        .map_err(|e| ExportError::io("cannot open the output directory", &dir, e))?;
    let inputs = module_inputs(m);
    check_not_input(out, &dir_canonical.join(file_name), &inputs)?;

    check_depth(m, graph)?;
    // Decide where tensor data goes before writing anything.
    let mut total = 0u64;
    let mut small = 0u64;
    let mut any_external = false;
    for c in used_consts(m, graph)? {
        let cd = &m.consts[c];
        let len = cd.byte_len();
        total = total.saturating_add(len);
        match &cd.storage {
            Storage::External { .. } => any_external = true,
            Storage::Strings(_) => small = small.saturating_add(len),
            _ => {}
        }
        if !matches!(cd.storage, Storage::Strings(_)) && len < opts.size_threshold {
            small = small.saturating_add(len);
        }
    }
    let external = match opts.external_data {
        ExternalData::Auto => total > AUTO_EXTERNAL_ABOVE || any_external,
        ExternalData::Always => true,
        ExternalData::Never => {
            if total > PROTOBUF_LIMIT {
                return Err(ExportError::TooLarge { bytes: total });
            }
            false
        }
    };
    // Many small tensors can exceed the limit too: then every raw tensor goes out.
    let threshold = if small > AUTO_EXTERNAL_ABOVE {
        0
    } else {
        opts.size_threshold
    };

    let data_name = format!("{file_name}.data");
    let data_path = dir.join(&data_name);
    let mut external_tensors = 0;
    let (model, stats, data_tmp) = if external {
        check_not_input(&data_path, &dir_canonical.join(&data_name), &inputs)?;
        let tmp = temp_for(&data_path)?;
        let file = tmp
            .file()
            .try_clone()
            .map_err(|e| ExportError::io("cannot open", &data_path, e))?;
        let mut sink = DataFileSink::new(file, &data_path, &data_name, threshold);
        let (model, stats) = export_model(
            m,
            graph,
            &mut ReferenceSink {
                refs: &opts.references,
                inner: &mut sink,
            },
        )?;
        external_tensors = sink.tensors_written();
        sink.finish(opts.sync)?;
        (model, stats, (external_tensors > 0).then_some(tmp))
    } else {
        let mut inline = InlineSink;
        let (model, stats) = export_model(
            m,
            graph,
            &mut ReferenceSink {
                refs: &opts.references,
                inner: &mut inline,
            },
        )?;
        (model, stats, None)
    };

    let size = model.encoded_len() as u64;
    if size > PROTOBUF_LIMIT {
        return Err(ExportError::TooLarge { bytes: size });
    }
    let model_tmp = temp_for(out)?;
    {
        let mut w = BufWriter::with_capacity(1 << 20, model_tmp.file());
        encode_model(model, &mut w)
            .and_then(|()| w.flush())
            .and_then(|()| {
                if opts.sync {
                    model_tmp.file().sync_all()
                } else {
                    Ok(())
                }
            })
            .map_err(|e| ExportError::io("cannot write", out, e))?;
    }

    // The data file and the model are published as one unit: under the directory's lock, so
    // a concurrent writer of the same output cannot put its model beside this data.
    let _lock = lock_dir(&dir).map_err(|e| ExportError::io("cannot lock", &dir, e))?;
    let mut files = Vec::new();
    let data_path = match data_tmp {
        Some(tmp) => {
            tmp.persist()
                .map_err(|e| ExportError::io("cannot rename the data file to", &data_path, e))?;
            files.push(data_path.clone());
            Some(data_path)
        }
        None => None,
    };
    model_tmp
        .persist()
        .map_err(|e| ExportError::io("cannot rename the model file to", out, e))?;
    files.push(out.to_owned());
    Ok(WriteReport {
        model_path: out.to_owned(),
        model_bytes: size,
        inline_bytes: stats.inline,
        data_path,
        external_bytes: stats.external,
        external_tensors,
        files,
    })
}

/// Writes `model` in protobuf encoding without building the whole message in memory: the
/// graph's initializers are encoded one at a time (protobuf readers accept fields in any order).
fn encode_model(mut model: pb::ModelProto, w: &mut impl Write) -> io::Result<()> {
    let mut graph = model.graph.take().unwrap_or_default();
    let initializers = std::mem::take(&mut graph.initializer);
    w.write_all(&model.encode_to_vec())?;

    let mut buf = Vec::new();
    let graph_len =
        graph.encoded_len() + prost::encoding::message::encoded_len_repeated(5, &initializers);
    prost::encoding::encode_key(7, prost::encoding::WireType::LengthDelimited, &mut buf);
    prost::encoding::encode_varint(graph_len as u64, &mut buf);
    w.write_all(&buf)?;
    w.write_all(&graph.encode_to_vec())?;
    for t in &initializers {
        buf.clear();
        prost::encoding::message::encode(5, t, &mut buf);
        w.write_all(&buf)?;
    }
    Ok(())
}
