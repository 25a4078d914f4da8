//! Shared support for the end-to-end, round-trip and conformance tests: where the repository,
//! the fixtures and the Python oracle (ONNX + ONNX Runtime in `.venv`) are.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// A scratch directory under the build's target directory, emptied first.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = repo_root()
        .join("target")
        .join("mmq-test-scratch")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    dir
}

/// The oracle's Python interpreter. Panics (never skips) when the virtualenv is missing.
pub fn python() -> PathBuf {
    let py = repo_root().join(".venv/bin/python");
    assert!(
        py.exists(),
        "the Python oracle is missing: run `tools/setup-venv.sh` (the README's test command does)"
    );
    py
}

/// Runs the oracle's Python with `args` (`what` names it in the panic); its stdout. Panics with
/// its stderr unless it succeeds.
pub fn python_ok<S: AsRef<std::ffi::OsStr>>(what: &str, args: &[S]) -> String {
    let out = Command::new(python())
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `tools/oracle.py` with `args`.
pub fn oracle(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(python())
        .arg(repo_root().join("tools/oracle.py"))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the oracle: {e}"))
}

/// An expectations file (`CASE REASON` per line, `#` comments), relative to the repository root:
/// the cases that do not pass yet, with why. A missing file is an empty list.
pub fn read_expectations(path: &str) -> std::collections::BTreeMap<String, String> {
    let text = std::fs::read_to_string(repo_root().join(path)).unwrap_or_default();
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| match l.split_once(' ') {
            Some((name, reason)) => (name.to_owned(), reason.trim().to_owned()),
            None => (l.to_owned(), String::new()),
        })
        .collect()
}

/// Builds every case of the ONNX node test suite into `dir` (`DIR/<case>/model.onnx`) with the
/// oracle and returns the case names.
pub fn node_suite_cases(dir: &Path) -> Vec<String> {
    let out = oracle(&[std::ffi::OsStr::new("node-dump"), dir.as_os_str()]);
    assert!(
        out.status.success(),
        "node-dump failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names: Vec<String> = std::fs::read_to_string(dir.join("cases.txt"))
        .expect("cases.txt")
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    assert!(
        names.len() > 1500,
        "the node suite has {} cases, expected ~1900",
        names.len()
    );
    names
}

/// Runs the oracle's `node-eval` on the cases in `cases` and the models converted from them in
/// `converted`; returns the path of the JSON result it wrote (in `converted`).
pub fn node_suite_eval(cases: &Path, converted: &Path) -> PathBuf {
    let result = converted.join("result.json");
    let out = oracle(&[
        std::ffi::OsStr::new("node-eval"),
        cases.as_os_str(),
        std::ffi::OsStr::new("--converted"),
        converted.as_os_str(),
        std::ffi::OsStr::new("-o"),
        result.as_os_str(),
    ]);
    assert!(
        out.status.success(),
        "node-eval failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    result
}

/// Checks failing cases (name → reason) against an expectations file exactly: writes the
/// actual list to `actual` (relative to the repository root) and returns a message naming the
/// cases that newly fail and the listed cases that now pass, or `Ok` when the list is exact.
pub fn check_expectations(
    expectations: &str,
    failing: &std::collections::BTreeMap<String, String>,
    actual: &str,
) -> Result<(), String> {
    let actual_path = repo_root().join(actual);
    let text: String = failing.iter().map(|(k, v)| format!("{k} {v}\n")).collect();
    let _ = std::fs::write(&actual_path, text);
    let expected = read_expectations(expectations);
    let newly_failing: Vec<String> = failing
        .iter()
        .filter(|(k, _)| !expected.contains_key(*k))
        .map(|(k, v)| format!("{k}: {v}"))
        .collect();
    let newly_passing: Vec<&String> = expected
        .keys()
        .filter(|k| !failing.contains_key(*k))
        .collect();
    if newly_failing.is_empty() && newly_passing.is_empty() {
        return Ok(());
    }
    Err(format!(
        "expectations out of date ({expectations}).\nnewly failing ({}): {newly_failing:#?}\n\
         newly passing ({}): {newly_passing:?}\n(the full actual list is in {})",
        newly_failing.len(),
        newly_passing.len(),
        actual_path.display()
    ))
}

/// A committed fixture: a directory with one or more `.onnx` files, `inputs.npz`, `outputs.npz`.
#[derive(Debug, Clone)]
pub struct Fixture {
    /// Directory name (`vit`, `clip`, ...).
    pub name: String,
    /// The directory.
    pub dir: PathBuf,
    /// The ONNX files, sorted.
    pub models: Vec<PathBuf>,
}

/// Every fixture under `tests/fixtures/`, sorted by name.
pub fn fixtures() -> Vec<Fixture> {
    let out = fixtures_in("tests/fixtures", "");
    assert!(
        out.len() >= 8,
        "expected the committed fixtures under tests/fixtures"
    );
    out
}

/// Every cell of the export matrix under `tests/fixtures/matrix/` (models from other exporters,
/// opsets and attention implementations; `tools/gen_matrix.py`, `tools/gen_cnn_cases.py`),
/// named `matrix/CELL`, sorted.
pub fn matrix_fixtures() -> Vec<Fixture> {
    let out = fixtures_in("tests/fixtures/matrix", "matrix/");
    assert!(
        out.len() >= 40,
        "expected the export matrix under tests/fixtures/matrix"
    );
    out
}

/// The directories under `rel` (relative to the repository) that hold ONNX files, named
/// `prefix` + directory name.
fn fixtures_in(rel: &str, prefix: &str) -> Vec<Fixture> {
    let root = repo_root().join(rel);
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&root).unwrap_or_else(|e| panic!("{}: {e}", root.display())) {
        let dir = entry.expect("readable fixture directory").path();
        if !dir.is_dir() {
            continue;
        }
        let mut models: Vec<PathBuf> = std::fs::read_dir(&dir)
            .expect("readable fixture directory")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "onnx"))
            .collect();
        models.sort();
        if models.is_empty() {
            continue;
        }
        let name = dir
            .file_name()
            .map(|n| format!("{prefix}{}", n.to_string_lossy()))
            .unwrap_or_default();
        out.push(Fixture { name, dir, models });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Cosine similarity of two equally long vectors.
pub fn cosine(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f64 = a.iter().map(|x| x * x).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// A fixture (`tests/fixtures/NAME/model.onnx`) after the `-O2` pipeline for ONNX Runtime, the
/// form the quantization passes see in `mmq compile`.
pub fn load_fixture_o2(name: &str) -> mmq_ir::Module {
    use mmq_passes::{OptLevel, PassOptions, Phase, TargetRef, pipeline};
    let path = repo_root().join(format!("tests/fixtures/{name}/model.onnx"));
    let mut m = mmq_onnx::load_files(&[path.as_path()], &mmq_onnx::LoadOptions::default())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let opts = PassOptions {
        target: TargetRef::ORT,
        explain: false,
    };
    pipeline(TargetRef::ORT, OptLevel::O2, Phase::Float)
        .run(&mut m, &opts)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    m
}

/// TensorRT's C++ headers (11.4, shipped by the `trtx-sys` crate, which `tools/trt-headers`
/// names): cargo downloads the crate on first use and says where it is. Panics when they cannot
/// be had.
pub fn tensorrt_headers() -> PathBuf {
    let manifest = repo_root().join("tools/trt-headers/Cargo.toml");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--locked",
            "--manifest-path",
        ])
        .arg(&manifest)
        .output()
        .unwrap_or_else(|e| panic!("cannot run cargo metadata: {e}"));
    assert!(
        out.status.success(),
        "cargo metadata {}: {}",
        manifest.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("cargo metadata: {e}"));
    let crate_dir = meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "trtx-sys")
        .and_then(|p| p["manifest_path"].as_str())
        .and_then(|p| Path::new(p).parent().map(Path::to_path_buf))
        .unwrap_or_else(|| panic!("cargo metadata names no trtx-sys"));
    let dir = crate_dir.join("TensorRT-Headers/TRT-Enterprise-11.4");
    assert!(
        dir.join("NvInferRuntime.h").is_file(),
        "no NvInferRuntime.h in {}",
        dir.display()
    );
    dir
}

/// nvcc and the CUDA headers beside it, from `MMQ_NVCC` (the README's test command sets it to
/// the Python registry's nvcc). `None` when it is unset, after printing why; with
/// `MMQ_REQUIRE_CUDA_TOOLS=1` that is a failure instead.
pub fn cuda_tools(what: &str) -> Option<(PathBuf, PathBuf)> {
    let nvcc = std::env::var_os("MMQ_NVCC")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from);
    let Some(nvcc) = nvcc.filter(|p| p.is_file()) else {
        assert!(
            std::env::var("MMQ_REQUIRE_CUDA_TOOLS").as_deref() != Ok("1"),
            "MMQ_REQUIRE_CUDA_TOOLS=1 but MMQ_NVCC names no nvcc"
        );
        // To stderr, past the test harness's capture, so the skip shows in every run.
        let _ = writeln!(
            std::io::stderr(),
            "skipping {what}: MMQ_NVCC is not set (the README's test command sets it)"
        );
        return None;
    };
    let include = nvcc
        .parent()
        .and_then(Path::parent)
        .map(|p| p.join("include"))
        .unwrap_or_default();
    assert!(
        include.join("cuda_runtime_api.h").is_file(),
        "no cuda_runtime_api.h beside {}",
        nvcc.display()
    );
    Some((nvcc, include))
}

/// One case an oracle script wrote: its name, the model it ran, its inputs and ONNX Runtime's
/// outputs by name.
pub struct OracleCase {
    /// The case's name.
    pub name: String,
    /// The model, loaded.
    pub module: mmq_ir::Module,
    /// The inputs.
    pub feeds: std::collections::HashMap<String, mmq_kernels::RtValue>,
    /// ONNX Runtime's outputs.
    pub want: std::collections::HashMap<String, mmq_kernels::Tensor>,
}

/// Runs the Python `script` with a scratch directory `scratch` as its argument; the script writes
/// `CASE/model.onnx`, `CASE/inputs.npz` and `CASE/outputs.npz` (ONNX Runtime's) per case and
/// prints the case names, one per line. Returns the cases, loaded.
pub fn oracle_cases(scratch: &str, what: &str, script: &str) -> Vec<OracleCase> {
    let dir = scratch_dir(scratch);
    let names = python_ok(
        what,
        &[
            std::ffi::OsStr::new("-c"),
            std::ffi::OsStr::new(script),
            dir.as_os_str(),
        ],
    );
    names
        .lines()
        .filter(|l| !l.is_empty())
        .map(|name| {
            let d = dir.join(name);
            let model = d.join("model.onnx");
            let module =
                mmq_onnx::load_files(&[model.as_path()], &mmq_onnx::LoadOptions::default())
                    .unwrap_or_else(|e| panic!("{name}: {e:?}"));
            let read = |file: &str| {
                mmq_kernels::io::read_npz(&d.join(file))
                    .unwrap_or_else(|e| panic!("{name}: {file}: {e}"))
            };
            OracleCase {
                name: name.to_owned(),
                module,
                feeds: read("inputs.npz")
                    .into_iter()
                    .map(|(k, t)| (k, mmq_kernels::RtValue::from(t)))
                    .collect(),
                want: read("outputs.npz").into_iter().collect(),
            }
        })
        .collect()
}

impl OracleCase {
    /// Runs the first graph in the interpreter and checks each of ONNX Runtime's outputs: same
    /// shape, every element within `tol`.
    pub fn check(&self, tol: f64) {
        let g = self.module.entries[0].graph;
        let got = mmq_kernels::Interpreter::new(&self.module)
            .run(g, &self.feeds)
            .unwrap_or_else(|e| panic!("{}: {e}", self.name));
        for (out, want) in &self.want {
            let t = got
                .iter()
                .find(|(n, _)| n == out)
                .and_then(|(_, v)| v.as_tensor())
                .unwrap_or_else(|| panic!("{}: no output {out}", self.name));
            assert_eq!(t.shape, want.shape, "{}: {out}", self.name);
            assert_eq!(t.dtype, want.dtype, "{}: {out}", self.name);
            let (a, b) = (t.to_f64().expect("f64"), want.to_f64().expect("f64"));
            let err = a
                .iter()
                .zip(&b)
                .map(|(x, w)| (x - w).abs())
                .fold(0.0, f64::max);
            assert!(err < tol, "{}: {out}: max |mmq - ort| = {err}", self.name);
        }
    }

    /// The op of the first node of the first graph.
    pub fn first_op(&self) -> &mmq_ir::Op {
        let g = self.module.entries[0].graph;
        &self.module.nodes[self.module.graphs[g].nodes()[0]].op
    }
}

/// [`oracle_cases`], each checked to load as a `kind` node and to give ONNX Runtime's outputs
/// within `tol` ([`OracleCase::check`]); `count` cases in all.
pub fn check_oracle_cases(
    scratch: &str,
    what: &str,
    script: &str,
    kind: mmq_ir::OpKind,
    count: usize,
    tol: f64,
) {
    let cases = oracle_cases(scratch, what, script);
    for case in &cases {
        assert_eq!(
            case.first_op().kind(),
            kind,
            "{}: {:?}",
            case.name,
            case.first_op()
        );
        case.check(tol);
    }
    assert_eq!(cases.len(), count);
}
