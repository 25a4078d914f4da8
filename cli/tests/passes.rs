//! `mmq compile` and `mmq opt`: the optimized vit fixture still matches ONNX Runtime's outputs,
//! `opt` output on a small module (snapshot), and the error messages (snapshot).
//!
//! The ONNX Runtime check needs the repository's Python environment (`tools/setup-venv.sh`
//! creates `.venv`); without it the test fails and says so.

mod common;

use std::path::Path;
use std::process::Command;

use common::{python, repo, run_in, scratch};

fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Runs the model in ONNX Runtime on the fixture inputs and compares with the fixture outputs.
fn assert_matches_onnx_runtime(model: &Path, fixture: &Path) {
    let out = Command::new(python())
        .arg(repo().join("tools/oracle.py"))
        .arg("run-compare")
        .arg(model)
        .arg(fixture.join("inputs.npz"))
        .arg(fixture.join("outputs.npz"))
        .args(["--tol", "1e-4", "--atol", "1e-4"])
        .output()
        .expect("the oracle runs");
    assert!(
        out.status.success(),
        "{} does not match ONNX Runtime's outputs:\n{}\n{}",
        model.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn compiled_vit_matches_onnx_runtime() {
    let dir = scratch("compile-vit");
    let fixture = repo().join("tests/fixtures/vit");
    let model = fixture.join("model.onnx");
    for level in ["-O1", "-O2"] {
        let out = format!("vit{level}.onnx");
        let (code, _, stderr) = run_in(
            &dir,
            &[
                "compile",
                path_str(&model),
                "--target",
                "ort",
                level,
                "-o",
                &out,
                "--time-passes",
            ],
        );
        assert_eq!(code, 0, "stderr: {stderr}");
        for pass in ["canonicalize", "const-fold", "dce", "total"] {
            assert!(stderr.contains(pass), "no {pass} row in:\n{stderr}");
        }
        assert_matches_onnx_runtime(&dir.join(&out), &fixture);
    }
}

#[test]
fn compiled_qat_cnn_keeps_quantized_execution() {
    // Folding the weights' DequantizeLinear would change what ONNX Runtime computes. (At -O2
    // the convolutions become integer QLinearConv, within one quantization step per layer:
    // tests/tests/compile_fixtures.rs checks that bound.)
    let dir = scratch("compile-qat");
    let fixture = repo().join("tests/fixtures/qat_cnn");
    let (code, _, stderr) = run_in(
        &dir,
        &[
            "compile",
            path_str(&fixture.join("model.onnx")),
            "--target",
            "ort",
            "-O1",
            "-o",
            "qat.onnx",
        ],
    );
    assert_eq!(code, 0, "stderr: {stderr}");
    assert_matches_onnx_runtime(&dir.join("qat.onnx"), &fixture);
}

#[test]
fn dump_after_prints_the_module_after_the_pass() {
    let dir = scratch("compile-dump");
    let model = repo().join("tests/fixtures/vit/model.onnx");
    let (code, stdout, stderr) = run_in(
        &dir,
        &[
            "compile",
            path_str(&model),
            "--target",
            "ort",
            "-O1",
            "-o",
            "out.onnx",
            "--dump-after",
            "dce",
        ],
    );
    assert_eq!(code, 0, "stderr: {stderr}");
    assert!(stdout.is_empty());
    assert!(stderr.starts_with("// ----- after dce -----\n"), "{stderr}");
    assert!(stderr.contains("graph @"), "{stderr}");
    assert_eq!(stderr.matches("// ----- after").count(), 1);
}

/// A reshape target computed from a static shape, a foldable product behind an Identity, and a
/// dead node.
const SMALL: &str = r#"const $idx : i64[] = dense<[0]>
const $axes : i64[1] = dense<[0]>
const $rest : i64[1] = dense<[-1]>
const $a : f32[4] = dense<[1.0, 2.0, 3.0, 4.0]>
const $b : f32[4] = dense<[0.5, 0.5, 0.5, 0.5]>
graph @main(%x: f32[2, 3, 4]) -> (f32[2, 12], f32[2, 3, 4]) {
  %shape = Shape(%x) : i64[3]
  %batch = Gather(%shape, $idx) {axis = 0} : i64[]
  %batch1 = Unsqueeze(%batch, $axes) : i64[1]
  %target = Concat(%batch1, $rest) {axis = 0} : i64[2]
  %y = Reshape(%x, %target) : f32[2, 12]
  %ab = Mul($a, $b) : f32[4]
  %id = Identity(%ab) : f32[4]
  %z = Add(%x, %id) : f32[2, 3, 4]
  %dead = Exp(%x) : f32[2, 3, 4]
  return %y, %z
}
"#;

#[test]
fn opt_folds_a_small_module() {
    let dir = scratch("opt-small");
    std::fs::write(dir.join("small.mmir"), SMALL).expect("write fixture");
    let (code, stdout, stderr) = run_in(&dir, &["opt", "small.mmir", "--rules", "simplify"]);
    assert_eq!(code, 0, "stderr: {stderr}");
    assert!(stderr.is_empty(), "{stderr}");
    insta::assert_snapshot!("opt_small", stdout);
    // The printed result parses and verifies.
    std::fs::write(dir.join("out.mmir"), &stdout).expect("write result");
    let (code, _, stderr) = run_in(&dir, &["verify", "out.mmir"]);
    assert_eq!(code, 0, "stderr: {stderr}");

    // --explain: firings and a counter table on stderr; -o writes the file instead of stdout.
    let (code, stdout, stderr) = run_in(
        &dir,
        &[
            "opt",
            "small.mmir",
            "--rules",
            "simplify",
            "--explain",
            "-o",
            "o.mmir",
        ],
    );
    assert_eq!(code, 0, "stderr: {stderr}");
    assert!(stdout.is_empty());
    assert!(
        stderr.contains("pass") && stderr.contains("const-fold"),
        "{stderr}"
    );
    assert!(dir.join("o.mmir").exists());
    let (code, _, stderr) = run_in(
        &dir,
        &["opt", "small.mmir", "--rules", "simplify", "-o", "o.onnx"],
    );
    assert_eq!(code, 0, "stderr: {stderr}");
    assert!(dir.join("o.onnx").exists());
}

#[test]
fn opt_and_compile_errors() {
    let dir = scratch("passes-errors");
    std::fs::write(dir.join("small.mmir"), SMALL).expect("write fixture");
    let vit = repo().join("tests/fixtures/vit/model.onnx");
    let vit = path_str(&vit);
    let cases: Vec<Vec<&str>> = vec![
        vec!["opt", "missing.mmir", "--rules", "simplify"],
        vec!["opt", "missing.onnx", "--rules", "simplify"],
        vec!["opt", "small.mmir", "--rules", "simplify,no-such-set"],
        vec!["opt", "small.mmir", "--rules", "simplify", "-o", "out.txt"],
        vec![
            "compile",
            vit,
            "--target",
            "trt",
            "--quant",
            "int8-dynamic",
            "-o",
            "out",
        ],
        vec![
            "compile",
            vit,
            "--target",
            "ort",
            "--symbol",
            "batch=1:2:4",
            "-o",
            "out.onnx",
        ],
        vec![
            "compile",
            vit,
            "--target",
            "trt",
            "--symbol",
            "batch=4:2:1",
            "-o",
            "out",
        ],
        vec![
            "compile",
            "missing.onnx",
            "--target",
            "ort",
            "-o",
            "out.onnx",
        ],
        vec!["compile", vit, "--target", "ort", "-O3", "-o", "out.onnx"],
        vec![
            "compile",
            vit,
            "--target",
            "ort",
            "-O1",
            "--dump-after",
            "rewrite",
            "-o",
            "out.onnx",
        ],
    ];
    let mut report = String::new();
    for args in cases {
        let (code, stdout, stderr) = run_in(&dir, &args);
        assert!(code == 1 || code == 2, "{args:?}: exit {code}");
        assert!(stdout.is_empty(), "{args:?}: {stdout}");
        let shown: Vec<&str> = args
            .iter()
            .map(|a| if *a == vit { "vit/model.onnx" } else { a })
            .collect();
        report.push_str(&format!(
            "$ mmq {}  # exit {code}\n{stderr}\n",
            shown.join(" ")
        ));
    }
    assert!(
        !dir.join("out.onnx").exists(),
        "failed commands write nothing"
    );
    insta::assert_snapshot!("passes_errors", report);
}
