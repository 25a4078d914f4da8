//! The package directory: `model.onnx` (one file per entry graph, with external data where the
//! weights are large), `build_engine.sh` (trtexec, strongly typed, one optimization profile from
//! the symbols' ranges) and `manifest.json` (files with hashes, inputs, outputs, profiles,
//! quantization, findings).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use mmq_backend_ort::ExportOptions;
use mmq_ir::fsio::AtomicFile;
use mmq_ir::{DType, Dim, GraphId, Module, Op, Sym, Type, Value};
use mmq_kernels::Tensor;
use sha2::{Digest, Sha256};

use crate::lint::{Finding, lint};

/// An optimization-profile range of one symbol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Profile {
    pub min: i64,
    pub opt: i64,
    pub max: i64,
}

/// A profile that is not `MIN:OPT:MAX` with `1 <= MIN <= OPT <= MAX`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ProfileError(pub String);

impl std::str::FromStr for Profile {
    type Err = ProfileError;

    /// `MIN:OPT:MAX`, or one value for all three.
    fn from_str(s: &str) -> Result<Self, ProfileError> {
        Profile::parse(s).map_err(ProfileError)
    }
}

impl Profile {
    fn parse(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split(':').collect();
        let num = |p: &str| {
            p.trim()
                .parse::<i64>()
                .ok()
                .filter(|v| *v >= 1)
                .ok_or_else(|| format!("'{p}' is not a dimension (an integer of at least 1)"))
        };
        let (min, opt, max) = match parts.as_slice() {
            [v] => {
                let v = num(v)?;
                (v, v, v)
            }
            [a, b, c] => (num(a)?, num(b)?, num(c)?),
            _ => return Err(format!("'{s}' is not MIN:OPT:MAX")),
        };
        if !(min <= opt && opt <= max) {
            return Err(format!("'{s}': need MIN <= OPT <= MAX"));
        }
        Ok(Profile { min, opt, max })
    }
}

/// The profile of a symbol without one given: its declared bounds where the model has them,
/// else 1..16 (opt 1) for batch-like names and 1..2048 (opt 128) for sequence-like ones, 1..1024
/// (opt 224) for spatial ones, and 1..64 (opt 1) otherwise.
pub fn default_profile(name: &str, min: Option<i64>, max: Option<i64>) -> Profile {
    let n = name.to_ascii_lowercase();
    let (lo, opt, hi) = if n.contains("batch") || n == "n" || n == "b" {
        (1, 1, 16)
    } else if ["seq", "len", "token", "past", "total", "step", "position"]
        .iter()
        .any(|k| n.contains(k))
    {
        (1, 128, 2048)
    } else if ["height", "width"].iter().any(|k| n.contains(k)) || n == "h" || n == "w" {
        (1, 224, 1024)
    } else {
        (1, 1, 64)
    };
    let min = min.unwrap_or(lo).max(1);
    let max = max.unwrap_or(hi).max(min);
    Profile {
        min,
        opt: opt.clamp(min, max),
        max,
    }
}

/// Inputs and the outputs the reference interpreter computes from them, for one model: what an
/// engine built from the package must reproduce.
#[derive(Clone, Debug, Default)]
pub struct Reference {
    pub inputs: Vec<(String, Tensor)>,
    pub outputs: Vec<(String, Tensor)>,
    /// Why the inputs are not at the profile's opt point, when they are not.
    pub note: Option<String>,
}

/// What to write.
#[derive(Clone, Debug, Default)]
pub struct PackageOptions {
    /// Profiles by symbol name; the others get [`default_profile`].
    pub profiles: BTreeMap<String, Profile>,
    /// Per entry graph, in order: the reference to store (`<model>.reference_inputs.npz`,
    /// `<model>.reference_outputs.npz`), or why there is none.
    pub references: Vec<Result<Reference, String>>,
}

/// What was written.
#[derive(Clone, Debug)]
pub struct Package {
    /// Every file, model files first.
    pub files: Vec<PathBuf>,
    /// What TensorRT's rules refuse in the written models (empty when it will parse them).
    pub findings: Vec<Finding>,
    /// The profile of every symbol of the models' inputs.
    pub profiles: BTreeMap<String, Profile>,
    /// What the user should know (a reference that could not be made at the opt point).
    pub notes: Vec<String>,
}

/// Writing the package failed.
#[derive(Debug, thiserror::Error)]
pub enum TrtError {
    /// A file could not be written.
    #[error("cannot write {path}: {message}")]
    Write { path: PathBuf, message: String },
    /// A `--symbol` names no symbol of the model.
    #[error("--symbol {0}: the model has no symbol of that name (its symbols: {1})")]
    UnknownSymbol(String, String),
}

fn write_err(path: &Path, e: impl std::fmt::Display) -> TrtError {
    TrtError::Write {
        path: path.to_owned(),
        message: e.to_string(),
    }
}

/// Writes `bytes` to `path` through a temporary file in the same directory.
fn write_atomic(path: &Path, bytes: &[u8], executable: bool) -> Result<(), TrtError> {
    let mut tmp = AtomicFile::create(path).map_err(|e| write_err(path, e))?;
    tmp.write_all(bytes).map_err(|e| write_err(path, e))?;
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = if executable { 0o755 } else { 0o644 };
        tmp.file()
            .set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(|e| write_err(path, e))?;
    }
    tmp.persist().map_err(|e| write_err(path, e))
}

fn sha256(path: &Path) -> Result<String, TrtError> {
    let mut f = std::fs::File::open(path).map_err(|e| write_err(path, e))?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).map_err(|e| write_err(path, e))?;
    Ok(h.finalize().iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    }))
}

/// A tensor as the manifest lists it.
#[derive(serde::Serialize)]
struct TensorInfo {
    name: String,
    dtype: String,
    shape: Vec<String>,
}

fn tensor_info(m: &Module, v: Value) -> TensorInfo {
    let (dtype, shape) = match m.value_type(v) {
        Type::Tensor(t) => (
            t.dtype.map_or("unknown".to_owned(), |d| d.to_string()),
            t.shape
                .as_ref()
                .map_or_else(Vec::new, |s| s.iter().map(|d| dim_text(m, d)).collect()),
        ),
        other => (format!("{other:?}"), Vec::new()),
    };
    TensorInfo {
        name: m.values[v].name.clone().unwrap_or_default(),
        dtype,
        shape,
    }
}

fn dim_text(m: &Module, d: &Dim) -> String {
    match d.expr() {
        Some(e) => e.render(&|s| m.symbols[s].name.clone()),
        None => "?".into(),
    }
}

fn symbols_of(m: &Module, graph: GraphId, out: &mut Vec<Sym>) {
    for &v in &m.graphs[graph].inputs {
        if let Type::Tensor(t) = m.value_type(v) {
            for d in t.shape.iter().flatten() {
                if let Some(e) = d.expr() {
                    e.symbols(out);
                }
            }
        }
    }
}

/// Counts of Q/DQ by element type, over every graph of the entry.
fn quantization(m: &Module, graph: GraphId) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for g in m.graph_tree(graph) {
        for &n in m.graphs[g].nodes() {
            let nd = &m.nodes[n];
            let (kind, v) = match nd.op {
                Op::QuantizeLinear { .. } => ("QuantizeLinear", nd.outputs.first()),
                Op::DequantizeLinear { .. } => ("DequantizeLinear", nd.inputs.first()),
                _ => continue,
            };
            let dt = v
                .copied()
                .flatten()
                .and_then(|v| m.value_type(v).as_tensor().and_then(|t| t.dtype))
                .map_or("unknown".to_owned(), |d: DType| d.to_string());
            *out.entry(format!("{kind} {dt}")).or_insert(0) += 1;
        }
    }
    out
}

/// Writes the package for `m` into `dir` (created if needed). `inputs` are the files `m` was
/// loaded from (they name the models of a several-graph module).
pub fn write_package(
    m: &Module,
    inputs: &[PathBuf],
    dir: &Path,
    opts: &PackageOptions,
) -> Result<Package, TrtError> {
    std::fs::create_dir_all(dir).map_err(|e| write_err(dir, e))?;
    // Profiles: every symbol of the entry inputs.
    let mut syms = Vec::new();
    for e in &m.entries {
        symbols_of(m, e.graph, &mut syms);
    }
    syms.sort();
    syms.dedup();
    let names: Vec<String> = syms.iter().map(|&s| m.symbols[s].name.clone()).collect();
    for given in opts.profiles.keys() {
        if !names.contains(given) {
            return Err(TrtError::UnknownSymbol(given.clone(), names.join(", ")));
        }
    }
    let mut profiles: BTreeMap<String, Profile> = syms
        .iter()
        .map(|&s| {
            let sd = &m.symbols[s];
            let p = opts
                .profiles
                .get(&sd.name)
                .copied()
                .unwrap_or_else(|| default_profile(&sd.name, sd.min, sd.max));
            (sd.name.clone(), p)
        })
        .collect();
    let tie = tie_total_to_past_and_seq(&mut profiles, &opts.profiles);

    let mut files = Vec::new();
    let uses = crate::plugins::uses(m);
    let mut models = Vec::new();
    let mut notes = Vec::new();
    let single = m.entries.len() == 1;
    let stems = if single {
        vec!["model".to_owned()]
    } else {
        mmq_backend_ort::entry_stems(m, inputs).map_err(|e| write_err(dir, e))?
    };
    for (i, (e, stem)) in m.entries.iter().zip(stems).enumerate() {
        let path = dir.join(format!("{stem}.onnx"));
        let report = mmq_backend_ort::write_model(m, e.graph, &path, &ExportOptions::default())
            .map_err(|err| write_err(&path, err))?;
        let mut model_files = vec![path.clone()];
        model_files.extend(report.data_path.clone());
        let hashes: Vec<(String, String)> = model_files
            .iter()
            .map(|p| {
                Ok((
                    p.file_name()
                        .unwrap_or_default()
                        .to_string_lossy()
                        .into_owned(),
                    sha256(p)?,
                ))
            })
            .collect::<Result<_, TrtError>>()?;
        let mut ref_files = Vec::new();
        let reference = match opts.references.get(i) {
            Some(Ok(r)) => {
                let mut out = serde_json::Map::new();
                if let Some(note) = &r.note {
                    out.insert("note".into(), note.clone().into());
                    notes.push(format!("{stem}: {note}"));
                }
                for (kind, arrays) in [("inputs", &r.inputs), ("outputs", &r.outputs)] {
                    let file = dir.join(format!("{stem}.reference_{kind}.npz"));
                    let refs: Vec<(&str, &Tensor)> =
                        arrays.iter().map(|(n, t)| (n.as_str(), t)).collect();
                    mmq_kernels::io::write_npz(&file, &refs).map_err(|e| write_err(&file, e))?;
                    out.insert(
                        kind.to_owned(),
                        serde_json::json!({
                            "file": file.file_name().unwrap_or_default().to_string_lossy(),
                            "sha256": sha256(&file)?,
                        }),
                    );
                    ref_files.push(file);
                }
                serde_json::Value::Object(out)
            }
            Some(Err(why)) => {
                notes.push(format!("{stem}: no reference outputs: {why}"));
                serde_json::json!({ "missing": why })
            }
            None => serde_json::Value::Null,
        };
        let g = &m.graphs[e.graph];
        models.push(serde_json::json!({
            "reference": reference,
            "file": format!("{stem}.onnx"),
            "sha256": hashes.iter().map(|(f, h)| (f.clone(), serde_json::Value::from(h.clone()))).collect::<serde_json::Map<_, _>>(),
            "inputs": g.inputs.iter().map(|&v| tensor_info(m, v)).collect::<Vec<_>>(),
            "outputs": g.outputs.iter().map(|&v| tensor_info(m, v)).collect::<Vec<_>>(),
            "quantization": quantization(m, e.graph),
            "opset": m.onnx_opset(e.graph),
        }));
        files.extend(model_files);
        files.extend(ref_files);
        let script = dir.join(if single {
            "build_engine.sh".to_owned()
        } else {
            format!("build_engine_{stem}.sh")
        });
        write_atomic(
            &script,
            build_script(m, e.graph, &stem, &profiles, tie.as_ref(), !uses.is_empty()).as_bytes(),
            true,
        )?;
        files.push(script);
    }
    // The plugin library's sources, where the models use plugins.
    let mut plugin_library = serde_json::Value::Null;
    if !uses.is_empty() {
        let pdir = dir.join("plugins");
        std::fs::create_dir_all(&pdir).map_err(|e| write_err(&pdir, e))?;
        let mut hashes = serde_json::Map::new();
        for (name, text, executable) in crate::plugins::SOURCES {
            let path = pdir.join(name);
            write_atomic(&path, text.as_bytes(), executable)?;
            hashes.insert(format!("plugins/{name}"), sha256(&path)?.into());
            files.push(path);
        }
        plugin_library = serde_json::json!({
            "library": crate::plugins::LIBRARY,
            "build": "plugins/build.sh (nvcc; TENSORRT_INCLUDE names TensorRT's headers), or CMakeLists.txt",
            "sm": crate::plugins::SMS,
            "ptx": crate::plugins::SMS[crate::plugins::SMS.len() - 1],
            "cuda": "nvcc 12.x or 13.x, C++17",
            "tensorrt": "10.x or 11.x headers (IPluginV3); loaded with trtexec --dynamicPlugins and serialized into the engine",
            "sources": hashes,
        });
    }
    let findings = lint(m);
    let manifest = serde_json::json!({
        "format": "mmq-tensorrt-package",
        "version": 1,
        "producer": format!("mmq {}", env!("CARGO_PKG_VERSION")),
        "tensorrt": {
            "versions": ["10.x", "11.x"],
            "strongly_typed": true,
            "parser_opsets": "9..=20 (TensorRT 10; later releases read more)",
        },
        "models": models,
        "profiles": profiles,
        "plugins": crate::plugins::manifest(&uses),
        "plugin_library": plugin_library,
        "findings": findings,
    });
    let mpath = dir.join("manifest.json");
    let text = serde_json::to_string_pretty(&manifest).map_err(|e| write_err(&mpath, e))? + "\n";
    write_atomic(&mpath, text.as_bytes(), false)?;
    files.push(mpath);
    Ok(Package {
        files,
        findings,
        profiles,
        notes,
    })
}

/// Exporters of decoders with a KV cache name the attention length `total_seq` without saying it
/// is `past + seq`; every profile point must keep that sum, or the mask and the cache disagree.
/// Applies unless the total's profile was given.
fn tie_total_to_past_and_seq(
    profiles: &mut BTreeMap<String, Profile>,
    given: &BTreeMap<String, Profile>,
) -> Option<[String; 3]> {
    let find = |f: &dyn Fn(&str) -> bool| {
        profiles
            .keys()
            .find(|k| f(&k.to_ascii_lowercase()))
            .cloned()
    };
    let (Some(total), Some(past), Some(seq)) = (
        find(&|n| n.contains("total")),
        find(&|n| n.contains("past")),
        find(&|n| n.contains("seq") && !n.contains("past") && !n.contains("total")),
    ) else {
        return None;
    };
    if given.contains_key(&total) {
        return None;
    }
    let (p, q) = (profiles[&past], profiles[&seq]);
    profiles.insert(
        total.clone(),
        Profile {
            min: p.min + q.min,
            opt: p.opt + q.opt,
            max: p.max + q.max,
        },
    );
    Some([total, past, seq])
}

/// `build_engine.sh` for one model.
fn build_script(
    m: &Module,
    graph: GraphId,
    stem: &str,
    profiles: &BTreeMap<String, Profile>,
    tie: Option<&[String; 3]>,
    plugins: bool,
) -> String {
    let g = &m.graphs[graph];
    // Inputs with symbolic dims, each dim as a literal or a symbol.
    let mut dynamic: Vec<(String, Vec<String>)> = Vec::new();
    for &v in &g.inputs {
        let Type::Tensor(t) = m.value_type(v) else {
            continue;
        };
        let Some(shape) = &t.shape else { continue };
        if shape.iter().all(|d| d.as_known().is_some()) {
            continue;
        }
        // Literals, or shell arithmetic over the symbols' variables (`@` becomes the profile
        // point).
        let dims = shape
            .iter()
            .map(|d| match (d.as_known(), d.expr()) {
                (Some(k), _) => k.to_string(),
                (None, Some(e)) => format!(
                    "$(({}))",
                    e.render(&|s| format!("${{{}_@}}", shell_var(&m.symbols[s].name)))
                ),
                (None, None) => "1".to_owned(),
            })
            .collect();
        dynamic.push((m.values[v].name.clone().unwrap_or_default(), dims));
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        "#!/usr/bin/env bash\n\
         # Builds a TensorRT engine from {stem}.onnx (written by `mmq compile --target trt`).\n\
         # The model carries its quantization as Q/DQ nodes, so the network is built strongly\n\
         # typed: TensorRT 10.x and 11.x take --stronglyTyped and no precision flags.\n\
         #\n\
         #   ./build_engine.sh [--symbol NAME=MIN:OPT:MAX]... [--trtexec PATH] [trtexec options]\n\
         #\n\
         # Needs trtexec (TensorRT 10 or 11) and a GPU; writes {stem}.engine.\n\
         set -euo pipefail\n\
         cd \"$(dirname \"$0\")\"\n\
         trtexec=\"${{TRTEXEC:-trtexec}}\""
    );
    for (name, p) in profiles {
        let v = shell_var(name);
        let _ = writeln!(
            s,
            "{v}_MIN={}; {v}_OPT={}; {v}_MAX={}  # {name}",
            p.min, p.opt, p.max
        );
    }
    let _ = writeln!(
        s,
        "extra=()\n\
         while [[ $# -gt 0 ]]; do\n\
         \x20   case \"$1\" in\n\
         \x20       --symbol)\n\
         \x20           [[ \"${{2:-}}\" =~ ^([A-Za-z0-9_.:-]+)=([0-9]+):([0-9]+):([0-9]+)$ ]] \\\n\
         \x20               || {{ echo \"build_engine.sh: --symbol NAME=MIN:OPT:MAX, not '${{2:-}}'\" >&2; exit 2; }}\n\
         \x20           var=\"$(printf '%s' \"${{BASH_REMATCH[1]}}\" | tr -c 'A-Za-z0-9_' '_')\"\n\
         \x20           var=\"SYM_${{var}}\"\n\
         \x20           declare -p \"${{var}}_MIN\" >/dev/null 2>&1 \\\n\
         \x20               || {{ echo \"build_engine.sh: the model has no symbol ${{BASH_REMATCH[1]}}\" >&2; exit 2; }}\n\
         \x20           printf -v \"${{var}}_MIN\" %s \"${{BASH_REMATCH[2]}}\"\n\
         \x20           printf -v \"${{var}}_OPT\" %s \"${{BASH_REMATCH[3]}}\"\n\
         \x20           printf -v \"${{var}}_MAX\" %s \"${{BASH_REMATCH[4]}}\"\n\
         \x20           printf -v \"given_${{var}}\" %s 1\n\
         \x20           shift 2 ;;\n\
         \x20       --trtexec) trtexec=\"$2\"; shift 2 ;;\n\
         \x20       *) extra+=(\"$1\"); shift ;;\n\
         \x20   esac\n\
         done"
    );
    if let Some([total, past, seq]) = tie {
        let (t, p, q) = (shell_var(total), shell_var(past), shell_var(seq));
        let _ = writeln!(
            s,
            "# {total} is {past} + {seq} at every profile point unless given.\n\
             if [[ -z \"${{given_{t}:-}}\" ]]; then\n\
             \x20   for point in MIN OPT MAX; do\n\
             \x20       p=\"{p}_$point\"; q=\"{q}_$point\"\n\
             \x20       printf -v \"{t}_$point\" %s \"$(( ${{!p}} + ${{!q}} ))\"\n\
             \x20   done\n\
             fi"
        );
    }
    let mut args = vec![
        format!("--onnx={stem}.onnx"),
        "--stronglyTyped".to_owned(),
        format!("--saveEngine={stem}.engine"),
    ];
    if plugins {
        let lib = crate::plugins::LIBRARY;
        let _ = writeln!(
            s,
            "# The model uses mmq's plugins (manifest.json lists them): build the library first.\n\
             if [[ ! -f {lib} ]]; then\n\
             \x20   plugins/build.sh\n\
             fi"
        );
        args.push(format!("--dynamicPlugins={lib}"));
        args.push(format!("--setPluginsToSerialize={lib}"));
    }
    if !dynamic.is_empty() {
        for (flag, point) in [("min", "MIN"), ("opt", "OPT"), ("max", "MAX")] {
            let shapes: Vec<String> = dynamic
                .iter()
                .map(|(name, dims)| {
                    let dims: Vec<String> = dims.iter().map(|d| d.replace('@', point)).collect();
                    format!("{name}:{}", dims.join("x"))
                })
                .collect();
            args.push(format!("--{flag}Shapes={}", shapes.join(",")));
        }
    }
    let _ = writeln!(
        s,
        "set -x\n\"$trtexec\" {} \"${{extra[@]}}\"",
        args.iter()
            .map(|a| format!("\"{a}\""))
            .collect::<Vec<_>>()
            .join(" ")
    );
    s
}

fn shell_var(name: &str) -> String {
    let body: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("SYM_{body}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_parse_one_value_or_three_in_order() {
        let p = |s: &str| s.parse::<Profile>();
        assert_eq!(
            p("4"),
            Ok(Profile {
                min: 4,
                opt: 4,
                max: 4
            })
        );
        assert_eq!(
            p("1:8:16"),
            Ok(Profile {
                min: 1,
                opt: 8,
                max: 16
            })
        );
        for bad in ["4:2:1", "0", "1:2", "a:b:c", "-1:1:1"] {
            assert!(p(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn default_profiles_follow_the_symbol_and_its_bounds() {
        let p = default_profile;
        assert_eq!(
            (p("batch", None, None).opt, p("batch", None, None).max),
            (1, 16)
        );
        assert_eq!(p("past_seq", None, None).opt, 128);
        assert_eq!(p("height", None, None).opt, 224);
        assert_eq!(p("unk__3", None, None).max, 64);
        // Declared bounds win, and opt stays inside them.
        let b = p("seq", Some(4), Some(8));
        assert_eq!((b.min, b.opt, b.max), (4, 8, 8));
    }

    #[test]
    fn a_package_lists_its_files_with_their_hashes_and_the_profiles() {
        let src = r#"
const $w : f32[4, 4] = dense<[1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0]>
graph @g(%x: f32[batch, 4]) -> (f32[batch, 4]) {
  %y = MatMul(%x, $w) : f32[batch, 4]
  return %y
}
"#;
        let m = match mmq_ir::text::parse(src) {
            Ok((m, _)) => m,
            Err(e) => panic!("{e:?}"),
        };
        let dir = std::env::temp_dir().join(format!("mmq-trt-package-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let opts = PackageOptions {
            profiles: BTreeMap::from([(
                "batch".to_owned(),
                Profile {
                    min: 1,
                    opt: 2,
                    max: 8,
                },
            )]),
            references: Vec::new(),
        };
        let package = write_package(&m, &[PathBuf::from("model.onnx")], &dir, &opts)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(package.findings.is_empty(), "{:?}", package.findings);
        let names: Vec<String> = package
            .files
            .iter()
            .map(|f| {
                f.file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        assert_eq!(names, ["model.onnx", "build_engine.sh", "manifest.json"]);
        let manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).expect("manifest"))
                .expect("json");
        assert_eq!(manifest["format"], "mmq-tensorrt-package");
        assert_eq!(manifest["profiles"]["batch"]["opt"], 2);
        let model = &manifest["models"][0];
        assert_eq!(model["file"], "model.onnx");
        let want = format!(
            "{:x}",
            Sha256::digest(std::fs::read(dir.join("model.onnx")).expect("model"))
        );
        assert_eq!(model["sha256"]["model.onnx"], want.as_str());
        let script = std::fs::read_to_string(dir.join("build_engine.sh")).expect("script");
        assert!(script.contains("--stronglyTyped"), "{script}");
        assert!(script.contains("batch"), "{script}");
        // A profile for a symbol the model does not have is refused.
        let other = dir.join("other");
        let bad = PackageOptions {
            profiles: BTreeMap::from([("seq".to_owned(), opts.profiles["batch"])]),
            references: Vec::new(),
        };
        assert!(matches!(
            write_package(&m, &[PathBuf::from("model.onnx")], &other, &bad),
            Err(TrtError::UnknownSymbol(..))
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
