//! Exported models pass `onnx.checker.check_model(full_check=True)` and run in ONNX Runtime.
//!
//! Needs the repository's Python environment (`tools/setup-venv.sh` creates `.venv` with onnx,
//! onnxruntime and numpy); without it this test fails and says so.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use mmq_backend_ort::{ExportOptions, ExternalData, write_model};
use mmq_ir::{DType, Dim, Module, Op, Type};

fn venv_python() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("crate is inside the workspace")
        .to_owned();
    let python = root.join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run tools/setup-venv.sh to create the Python environment with onnx and \
         onnxruntime used by this test",
        python.display()
    );
    python
}

/// `y = cond ? relu(x @ w + b) : -(x @ w + b)` with a symbolic batch dim; `w` is large enough to
/// go to external data.
fn model() -> (Module, mmq_ir::GraphId) {
    let (mut m, g) = module("mlp");
    let batch = m.symbol("batch");
    let x = m.add_input(
        g,
        Some("x".into()),
        f32_ty(vec![Dim::sym(batch), Dim::known(16)]),
    );
    let cond = m.add_input(g, Some("cond".into()), Type::tensor(DType::Bool, vec![]));
    let wv: Vec<f32> = (0..16 * 32)
        .map(|i| ((i % 7) as f32 - 3.0) * 0.25)
        .collect();
    let bv: Vec<f32> = (0..32).map(|i| i as f32 * 0.1 - 1.0).collect();
    let w = m.add_const(f32_const(Some("w"), vec![16, 32], &wv));
    let b = m.add_const(f32_const(Some("b"), vec![32], &bv));
    let hidden = f32_ty(vec![Dim::sym(batch), Dim::known(32)]);
    let mm = unary(&mut m, g, Op::MatMul {}, vec![x, w], None, hidden.clone());
    let h = unary(&mut m, g, Op::Add {}, vec![mm, b], None, hidden.clone());

    let (_, y, then_g, else_g) = if_node(&mut m, g, cond, "y", hidden.clone(), Some("choose"));
    let t = unary(&mut m, then_g, Op::Relu {}, vec![h], None, hidden.clone());
    m.graphs[then_g].outputs = vec![t];
    let e = unary(&mut m, else_g, Op::Neg {}, vec![h], None, hidden);
    m.graphs[else_g].outputs = vec![e];
    m.graphs[g].outputs = vec![y];
    (m, g)
}

const CHECK: &str = r#"
import sys
import numpy as np
import onnx
import onnxruntime as ort

path = sys.argv[1]
onnx.checker.check_model(path, full_check=True)
m = onnx.load(path)
w = onnx.numpy_helper.to_array(next(t for t in m.graph.initializer if t.name == "w"), base_dir=sys.argv[2])
b = onnx.numpy_helper.to_array(next(t for t in m.graph.initializer if t.name == "b"), base_dir=sys.argv[2])
sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
x = np.arange(3 * 16, dtype=np.float32).reshape(3, 16) / 10.0
h = x @ w + b
for cond, want in [(True, np.maximum(h, 0)), (False, -h)]:
    (y,) = sess.run(None, {"x": x, "cond": np.array(cond)})
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
print("ok")
"#;

fn check(path: &Path) {
    let python = venv_python();
    let dir = path.parent().expect("file in a directory");
    let out = Command::new(&python)
        .arg("-c")
        .arg(CHECK)
        .arg(path)
        .arg(dir)
        .output()
        .expect("python runs");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok",
        "checking {} failed:\n{}\n{}",
        path.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn exported_models_pass_the_onnx_checker_and_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (m, g) = model();

    let inline = dir.path().join("inline.onnx");
    let opts = ExportOptions {
        external_data: ExternalData::Never,
        ..Default::default()
    };
    write_model(&m, g, &inline, &opts).expect("write succeeds");
    check(&inline);

    let external = dir.path().join("external.onnx");
    let opts = ExportOptions {
        external_data: ExternalData::Always,
        size_threshold: 1024,
        ..Default::default()
    };
    let report = write_model(&m, g, &external, &opts).expect("write succeeds");
    assert_eq!(
        report.external_tensors, 1,
        "w goes external, b stays inline"
    );
    check(&external);
}
