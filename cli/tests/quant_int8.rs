//! `mmq compile --quant int8|int8-dynamic`: ONNX Runtime runs the output with the integer
//! kernels fused and stays close to FP32; bad calibration options are usage or user errors.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{repo, run_in, scratch};

fn fixture(name: &str) -> String {
    repo()
        .join(format!("tests/fixtures/{name}/model.onnx"))
        .display()
        .to_string()
}

fn python() -> PathBuf {
    let py = repo().join(".venv/bin/python");
    assert!(
        py.exists(),
        "{} is missing: run tools/setup-venv.sh",
        py.display()
    );
    py
}

/// Cosine of the first output against the FP32 model, and the op types of ONNX Runtime's
/// optimized graph.
const CHECK: &str = r#"
import sys, numpy as np, onnx, onnxruntime as ort
ref, q, inputs, opt = sys.argv[1:5]
x = dict(np.load(inputs))
a = ort.InferenceSession(ref, providers=["CPUExecutionProvider"]).run(None, x)[0].ravel()
o = ort.SessionOptions(); o.optimized_model_filepath = opt
b = ort.InferenceSession(q, o, providers=["CPUExecutionProvider"]).run(None, x)[0].ravel()
print(float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b)))
print(" ".join(sorted({n.op_type for n in onnx.load(opt).graph.node})))
"#;

fn ort_check(name: &str, scheme: &str, floor: f64, fused: &str) {
    let dir = scratch(&format!("quant-{name}-{scheme}"));
    let out = dir.join("q.onnx");
    let (code, _, err) = run_in(
        &dir,
        &[
            "compile",
            &fixture(name),
            "--target",
            "ort",
            "--quant",
            scheme,
            "--calib-random",
            "4",
            "-o",
            out.to_str().expect("utf-8"),
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("quantized"), "{err}");
    let run = Command::new(python())
        .args(["-c", CHECK, &fixture(name), out.to_str().expect("utf-8")])
        .arg(repo().join(format!("tests/fixtures/{name}/inputs.npz")))
        .arg(dir.join("opt.onnx"))
        .output()
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let mut lines = stdout.lines();
    let cos: f64 = lines
        .next()
        .and_then(|l| l.parse().ok())
        .expect("cosine line");
    let ops = lines.next().unwrap_or_default();
    assert!(cos >= floor, "{name} {scheme}: cosine {cos} < {floor}");
    assert!(
        ops.split(' ').any(|o| o == fused),
        "{name} {scheme}: no {fused} in {ops}"
    );
    assert!(
        !ops.split(' ').any(|o| o == "MatMul"),
        "{name} {scheme}: a float MatMul is left: {ops}"
    );
}

#[test]
fn vit_int8_fuses_into_integer_kernels_in_onnx_runtime() {
    ort_check("vit", "int8", 0.995, "MatMulIntegerToFloat");
}

#[test]
fn clip_int8_dynamic_fuses_into_dynamic_quantize_matmul() {
    ort_check("clip", "int8-dynamic", 0.99, "DynamicQuantizeMatMul");
}

#[test]
fn gpt2_int8_quantizes_gemm_weights() {
    ort_check("gpt2_kv", "int8", 0.99, "MatMulIntegerToFloat");
}

#[test]
fn calibration_option_errors() {
    let dir = scratch("quant-errors");
    let vit = fixture("vit");
    let cases: &[(&[&str], i32, &str)] = &[
        (&["--observer", "max"], 2, "unknown observer 'max'"),
        (&["--observer", "ema:1.5"], 2, "momentum must be in [0, 1)"),
        (
            &["--calib", "nowhere", "--calib-random", "3"],
            2,
            "cannot be used together",
        ),
        (&["--calib-random", "0"], 2, "at least one sample"),
        (&["--calib", "nowhere"], 1, "cannot read the folder"),
        (&["--calib", "."], 1, "no .npz files"),
    ];
    for (extra, want_code, want) in cases {
        let mut args = vec![
            "compile",
            vit.as_str(),
            "--target",
            "ort",
            "--quant",
            "int8",
        ];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["-o", "out.onnx"]);
        let (code, _, err) = run_in(&dir, &args);
        assert_eq!(code, *want_code, "{extra:?}: {err}");
        assert!(err.contains(want), "{extra:?}: {err}");
    }
    // A sample that does not fit the graph names the file and the input.
    let bad = dir.join("bad");
    std::fs::create_dir_all(&bad).expect("dir");
    std::fs::copy(
        repo().join("tests/fixtures/gpt2_kv/inputs.npz"),
        bad.join("a.npz"),
    )
    .expect("copy");
    let (code, _, err) = run_in(
        &dir,
        &[
            "compile", &vit, "--target", "ort", "--quant", "int8", "--calib", "bad", "-o",
            "out.onnx",
        ],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("sample 0"), "{err}");
    assert!(!dir.join("out.onnx").exists());
}
