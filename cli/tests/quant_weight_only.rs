//! `mmq compile --quant int4|fp8`: the output holds `MatMulNBits` (INT4) or FP8
//! `DequantizeLinear` weights and loads in ONNX Runtime; bad `--block` / `--asym` uses are usage
//! errors that write nothing.

mod common;

use std::process::Command;

use common::{fixture, repo, run_in, scratch};

/// Op types of the model and the cosine of its first output against the FP32 model, both
/// run in ONNX Runtime on the fixture's inputs.
const CHECK: &str = r#"
import sys, numpy as np, onnx, onnxruntime as ort
ref, q, inputs = sys.argv[1:4]
x = dict(np.load(inputs))
a = ort.InferenceSession(ref, providers=["CPUExecutionProvider"]).run(None, x)[0].ravel()
b = ort.InferenceSession(q, providers=["CPUExecutionProvider"]).run(None, x)[0].ravel()
print(float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b)))
print(" ".join(sorted({n.op_type for n in onnx.load(q).graph.node})))
"#;

fn ort_check(name: &str, model: &std::path::Path) -> (f64, String) {
    let out = Command::new(repo().join(".venv/bin/python"))
        .args(["-c", CHECK, &fixture(name)])
        .arg(model)
        .arg(repo().join(format!("tests/fixtures/{name}/inputs.npz")))
        .output()
        .expect("python runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines = text.lines();
    let cos = lines.next().and_then(|l| l.parse().ok()).expect("cosine");
    (cos, lines.next().unwrap_or_default().to_owned())
}

#[test]
fn int4_and_fp8_outputs_run_in_onnx_runtime() {
    let dir = scratch("quant_weight_only_cli");
    for (name, args, op, floor) in [
        (
            "llama_gqa_kv",
            &["--quant", "int4"][..],
            "MatMulNBits",
            0.99,
        ),
        (
            "gpt2_kv",
            &["--quant", "int4", "--block", "64", "--asym"][..],
            "MatMulNBits",
            0.99,
        ),
        ("vit", &["--quant", "fp8"][..], "DequantizeLinear", 0.999),
    ] {
        let out = dir.join(format!("{name}.onnx"));
        let mut argv = vec!["compile", &fixture(name), "--target", "ort", "-o"]
            .into_iter()
            .map(str::to_owned)
            .collect::<Vec<_>>();
        argv.push(out.display().to_string());
        argv.extend(args.iter().map(|s| (*s).to_owned()));
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let (code, _, err) = run_in(&dir, &argv);
        assert_eq!(code, 0, "{name}: {err}");
        assert!(
            err.contains("quant-"),
            "{name}: the pass reports its counters: {err}"
        );
        let (cos, ops) = ort_check(name, &out);
        assert!(ops.split(' ').any(|o| o == op), "{name}: {ops}");
        assert!(cos >= floor, "{name} {args:?}: cosine {cos} < {floor}");
    }
}

#[test]
fn bad_block_and_asym_are_usage_errors() {
    let dir = scratch("quant_weight_only_cli_errors");
    let vit = fixture("vit");
    for (extra, want) in [
        (&["--quant", "int4", "--block", "48"][..], "--block 48"),
        (
            &["--quant", "fp8", "--asym"][..],
            "--asym needs --quant int4, mixed or --auto, not --quant fp8",
        ),
        (
            &["--quant", "int8", "--block", "64"][..],
            "--block 64 needs --quant int4, mixed or --auto, not --quant int8",
        ),
        (
            &["--quant", "int5"][..],
            "possible values: int8, int8-dynamic",
        ),
    ] {
        let mut args = vec!["compile", vit.as_str(), "--target", "ort", "-o", "out.onnx"];
        args.extend_from_slice(extra);
        let (code, _, err) = run_in(&dir, &args);
        assert_eq!(code, 2, "{extra:?}: {err}");
        assert!(err.contains(want), "{extra:?}: {err}");
        assert!(!dir.join("out.onnx").exists());
    }
    // FP8 needs opset 19; the CNN fixture imports 17: a user error naming the opset.
    let (code, _, err) = run_in(
        &dir,
        &[
            "compile",
            &fixture("qat_cnn"),
            "--target",
            "ort",
            "--quant",
            "fp8",
            "-o",
            "out.onnx",
        ],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("opset 17"), "{err}");
    assert!(!dir.join("out.onnx").exists());
}

/// The counter `name=N` of the `quant-int4:` line, 0 when absent.
fn int4_counter(err: &str, name: &str) -> usize {
    err.lines()
        .filter(|l| l.starts_with("quant-int4:"))
        .flat_map(|l| l.split_whitespace())
        .find_map(|w| w.strip_prefix(&format!("{name}=")))
        .map_or(0, |n| n.parse().expect("count"))
}

#[test]
fn int4_placement_keeps_small_slower_products_float_unless_all() {
    // llava's vision tower runs its products over 17 patch rows, where MatMulNBits is estimated
    // slower than float (docs/benchmarks.md); its smallest such weight is under 1 % of the
    // eligible bytes.
    let dir = scratch("int4-placement");
    let fx = fixture("llava");
    let mut ops = Vec::new();
    for (placement, kept) in [("cost", 1), ("all", 0)] {
        let out = format!("{placement}.onnx");
        let (code, _, err) = run_in(
            &dir,
            &[
                "compile",
                &fx,
                "--quant",
                "int4",
                "--placement",
                placement,
                "-o",
                &out,
            ],
        );
        assert_eq!(code, 0, "{err}");
        assert_eq!(
            int4_counter(&err, "int4-kept-float"),
            kept,
            "{placement}: {err}"
        );
        if kept > 0 {
            assert!(
                err.contains("1 product(s) stay float: MatMulNBits is estimated slower")
                    && err.contains("--placement all quantizes them"),
                "{err}"
            );
        }
        let (cos, op_types) = ort_check("llava", &dir.join(&out));
        assert!(cos > 0.99, "{placement}: cosine {cos}");
        assert!(op_types.contains("MatMulNBits"), "{op_types}");
        ops.push(int4_counter(&err, "int4-matmul") + int4_counter(&err, "int4-gemm"));
    }
    assert_eq!(ops[0] + 1, ops[1], "{ops:?}");
}
