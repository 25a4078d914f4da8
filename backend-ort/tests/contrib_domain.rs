//! A node in the `com.microsoft` domain that the source model did not import: the exporter adds
//! the opset import (version 1), and ONNX Runtime runs the result.
//!
//! Needs the repository's Python environment (`tools/setup-venv.sh`); without it this test
//! fails and says so.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use mmq_backend_ort::{ExportOptions, write_model};
use mmq_ir::{Dim, Op};

const RUN: &str = r#"
import math, sys
import numpy as np
import onnxruntime as ort
sess = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
x = np.linspace(-3, 3, 6, dtype=np.float32).reshape(2, 3)
(y,) = sess.run(None, {"x": x})
want = np.vectorize(lambda v: 0.5 * v * (1 + math.erf(v / math.sqrt(2))))(x)
np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
print("ok")
"#;

#[test]
fn contrib_ops_get_their_domain_imported_and_run() {
    let (mut m, g) = module("contrib");
    assert_eq!(m.entries[0].model.opset("com.microsoft"), None);
    let x = m.add_input(
        g,
        Some("x".into()),
        f32_ty(vec![Dim::known(2), Dim::known(3)]),
    );
    let gelu = Op::MsGelu {};
    let y = unary(
        &mut m,
        g,
        gelu,
        vec![x],
        Some("y"),
        f32_ty(vec![Dim::known(2), Dim::known(3)]),
    );
    m.graphs[g].outputs = vec![y];

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("contrib.onnx");
    write_model(&m, g, &path, &ExportOptions::default()).expect("write succeeds");
    let model = read_model(&path);
    let imports: Vec<(String, i64)> = model
        .opset_import
        .iter()
        .map(|o| (o.domain.clone().unwrap_or_default(), o.version.unwrap_or(0)))
        .collect();
    assert_eq!(
        imports,
        [(String::new(), 21), ("com.microsoft".to_owned(), 1)]
    );

    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run tools/setup-venv.sh",
        python.display()
    );
    let out = Command::new(&python)
        .arg("-c")
        .arg(RUN)
        .arg(&path)
        .output()
        .expect("python runs");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "ok",
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
