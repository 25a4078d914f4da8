//! `mmq compile --smoothquant ALPHA` and `--awq`: ONNX Runtime runs the outputs close to FP32,
//! the summary lines are printed, and misplaced or out-of-range options are usage errors.

mod common;

use std::process::Command;

use common::{fixture, python, repo, run_in, scratch};

/// Cosine of the first output against the FP32 model in ONNX Runtime, and the op types of the
/// compiled model.
const CHECK: &str = r#"
import sys, numpy as np, onnx, onnxruntime as ort
ref, q, inputs = sys.argv[1:4]
x = dict(np.load(inputs))
a = ort.InferenceSession(ref, providers=["CPUExecutionProvider"]).run(None, x)[0].ravel()
b = ort.InferenceSession(q, providers=["CPUExecutionProvider"]).run(None, x)[0].ravel()
print(float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b)))
print(" ".join(sorted({n.op_type for n in onnx.load(q).graph.node})))
"#;

/// Compiles `name` with `extra`, checks the summary line, runs both models in ONNX Runtime;
/// returns the cosine and the op types.
fn compile_and_run(name: &str, tag: &str, extra: &[&str], summary: &str) -> (f64, String) {
    let dir = scratch(&format!("quant-smooth-{name}-{tag}"));
    let out = dir.join("q.onnx");
    let mut args = vec!["compile", &fixture(name), "--target", "ort"]
        .into_iter()
        .map(str::to_owned)
        .collect::<Vec<_>>();
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    args.extend(["-o".to_owned(), out.display().to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, _, err) = run_in(&dir, &args);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains(summary), "no '{summary}' line in:\n{err}");
    let run = Command::new(python())
        .args(["-c", CHECK, &fixture(name), out.to_str().expect("utf-8")])
        .arg(repo().join(format!("tests/fixtures/{name}/inputs.npz")))
        .output()
        .expect("python runs");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let stdout = String::from_utf8_lossy(&run.stdout);
    let mut lines = stdout.lines();
    let cos: f64 = lines
        .next()
        .and_then(|l| l.parse().ok())
        .expect("cosine line");
    (cos, lines.next().unwrap_or_default().to_owned())
}

#[test]
fn vit_int8_with_smoothquant_runs_in_onnx_runtime() {
    let (cos, ops) = compile_and_run(
        "vit",
        "int8",
        &[
            "--quant",
            "int8",
            "--smoothquant",
            "0.5",
            "--calib-random",
            "4",
            "--placement",
            "all",
        ],
        "smoothquant: 13 matmuls, ",
    );
    assert!(cos >= 0.99, "vit int8 + smoothquant: cosine {cos}");
    assert!(ops.contains("QuantizeLinear"), "{ops}");
}

#[test]
fn llama_int4_with_awq_runs_in_onnx_runtime() {
    let (cos, ops) = compile_and_run(
        "llama_gqa_kv",
        "int4",
        &["--quant", "int4", "--awq", "--calib-random", "4"],
        "awq: ",
    );
    assert!(cos >= 0.99, "llama int4 + awq: cosine {cos}");
    assert!(ops.contains("MatMulNBits"), "{ops}");
}

#[test]
fn misplaced_and_out_of_range_options_are_usage_errors() {
    let dir = scratch("quant-smooth-errors");
    let vit = fixture("vit");
    let cases: &[(&[&str], &str)] = &[
        (
            &["--quant", "int4", "--smoothquant", "0.5"],
            "--smoothquant needs --quant int8 or int8-dynamic, not --quant int4",
        ),
        (
            &["--quant", "int8", "--smoothquant", "1.5"],
            "--smoothquant 1.5: alpha must be in [0, 1]",
        ),
        (
            &["--quant", "int8", "--smoothquant=-0.1"],
            "alpha must be in [0, 1]",
        ),
        (
            &["--smoothquant", "0.5"],
            "--smoothquant needs --quant int8 or int8-dynamic, not no --quant",
        ),
        (
            &["--quant", "int8", "--awq"],
            "--awq needs --quant int4, not --quant int8",
        ),
        (&["--quant", "fp8", "--awq"], "--awq needs --quant int4"),
        (
            &["--quant", "int8", "--smoothquant", "half"],
            "invalid value",
        ),
    ];
    for (extra, want) in cases {
        let mut args = vec!["compile", vit.as_str(), "--target", "ort"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["-o", "out.onnx"]);
        let (code, _, err) = run_in(&dir, &args);
        assert_eq!(code, 2, "{extra:?}: {err}");
        assert!(err.contains(want), "{extra:?}: {err}");
        assert!(!dir.join("out.onnx").exists());
    }
}
