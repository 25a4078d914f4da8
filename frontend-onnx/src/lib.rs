//! ONNX frontend: reads `.onnx` files into an [`mmq_ir::Module`].
//!
//! Files are memory-mapped and decoded with prost straight from the map, so inline tensor data
//! (`raw_data`) becomes [`mmq_ir::Storage::Inline`] bytes that point into the mapped file, and
//! external data becomes [`mmq_ir::Storage::External`] ranges of mapped data files; weights are
//! never read while importing.
//!
//! Several files (the parts of a multimodal pipeline) load into one module: one
//! [`mmq_ir::Entry`] per file, with dimension symbols shared by name.
//!
//! Supported: ONNX IR versions 3 to 11, default-domain opsets 1 to 24 (nodes whose attributes do
//! not fit the typed [`mmq_ir::Op`] of the current opset are kept as [`mmq_ir::Op::Custom`]),
//! and any other domain (kept as custom ops).

pub mod proto;

mod decode;
mod error;
mod import;
mod tensor;
mod types;

use std::fs::File;
use std::path::Path;

use bytes::Bytes;
use memmap2::Mmap;

pub use decode::decode_model;
pub use error::{LoadError, LoadErrorKind};

use crate::error::{Result, err};
use crate::import::Importer;
use crate::tensor::ExternalFiles;
use crate::types::TypeConv;

/// Options for [`load_files`] and [`load_bytes`].
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Run type and shape inference ([`mmq_ir::infer::infer_module_correcting`]) after import (default
    /// `true`). Without it, values carry only the types the model declares (inputs, outputs,
    /// `value_info`).
    pub infer: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { infer: true }
    }
}

/// Loads ONNX files into one module: one entry (top-level graph) per file, in order, sharing
/// dimension symbols by name. External data is resolved relative to each file's directory.
pub fn load_files(paths: &[&Path], opts: &LoadOptions) -> Result<mmq_ir::Module> {
    let mut m = mmq_ir::Module::new();
    let mut files = ExternalFiles::default();
    let mut types = TypeConv::default();
    for path in paths {
        let bytes = map_file(path).map_err(|e| e.in_file(path))?;
        let dir = path.parent().map(|d| {
            if d.as_os_str().is_empty() {
                Path::new(".")
            } else {
                d
            }
        });
        let stem = path
            .file_stem()
            .map_or_else(|| "model".into(), |s| s.to_string_lossy());
        import_one(&mut m, &mut files, &mut types, bytes, dir, &stem)
            .map_err(|e| e.in_file(path))?;
        if let Some(entry) = m.entries.last_mut() {
            entry.model.source = Some(path.to_path_buf());
        }
    }
    finish(&mut m, opts);
    Ok(m)
}

/// Loads one model from bytes. `dir` is where external data locations are resolved (none: a
/// model with external data is an error); `name` labels errors and names an unnamed graph.
/// The entry's [`mmq_ir::ModelInfo::source`] is `None`.
pub fn load_bytes(
    bytes: Bytes,
    dir: Option<&Path>,
    name: &str,
    opts: &LoadOptions,
) -> Result<mmq_ir::Module> {
    let mut m = mmq_ir::Module::new();
    let mut files = ExternalFiles::default();
    let mut types = TypeConv::default();
    import_one(&mut m, &mut files, &mut types, bytes, dir, name).map_err(|e| e.in_file(name))?;
    finish(&mut m, opts);
    Ok(m)
}

fn import_one(
    m: &mut mmq_ir::Module,
    files: &mut ExternalFiles,
    types: &mut TypeConv,
    bytes: Bytes,
    dir: Option<&Path>,
    name: &str,
) -> Result<()> {
    let model = decode_model(bytes)?;
    let mut imp = Importer {
        m,
        types,
        files,
        dir,
    };
    imp.model(&model, name)?;
    Ok(())
}

/// Reads one serialized `TensorProto` file (the ONNX backend test layout's `input_0.pb`) as a
/// constant; its name is the tensor's name. External data is resolved relative to the file's
/// directory.
pub fn load_tensor(path: &Path) -> Result<mmq_ir::ConstData> {
    let bytes = map_file(path).map_err(|e| e.in_file(path))?;
    let t = <proto::onnx::TensorProto as prost::Message>::decode(bytes)
        .map_err(|e| err!(Invalid, "not a TensorProto: {e}").in_file(path))?;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    let mut files = ExternalFiles::default();
    let mut ctx = tensor::TensorCtx {
        dir: Some(dir.unwrap_or(Path::new("."))),
        files: &mut files,
    };
    let label = path
        .file_stem()
        .map_or_else(|| "tensor".into(), |s| s.to_string_lossy());
    tensor::tensor_to_const(&t, &label, &mut ctx).map_err(|e| e.in_file(path))
}

/// Post-import steps selected by `opts`.
///
/// Inference ([`mmq_ir::infer::infer_module_correcting`]) replaces declared types that
/// contradict what the nodes compute, as ONNX Runtime does, with warnings, not load errors;
/// callers that want those set `infer: false` and call it themselves.
fn finish(m: &mut mmq_ir::Module, opts: &LoadOptions) {
    if opts.infer {
        let _corrections = mmq_ir::infer::infer_module_correcting(m);
    }
}

/// Maps a file read-only and wraps the map in [`Bytes`] (no copy).
fn map_file(path: &Path) -> Result<Bytes> {
    mmq_ir::check_regular_file(path)
        .map_err(|e| err!(Io, "cannot open '{}': {e}", path.display()))?;
    let file = File::open(path).map_err(|e| err!(Io, "cannot open '{}': {e}", path.display()))?;
    let len = file
        .metadata()
        .map_err(|e| err!(Io, "cannot read '{}': {e}", path.display()))?
        .len();
    if len == 0 {
        return Ok(Bytes::new());
    }
    // SAFETY: the map is read-only; model files must not be modified while a module that refers
    // to them is alive (the same contract as `mmq_ir::ExternalFile` and ONNX Runtime's loader).
    #[allow(
        unsafe_code,
        reason = "the model file is mapped read only for lazy weights"
    )]
    let map = unsafe { Mmap::map(&file) }
        .map_err(|e| err!(Io, "cannot map '{}': {e}", path.display()))?;
    Ok(Bytes::from_owner(map))
}
