//! Helpers shared by the command-line tests.

#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use mmq_onnx::proto::onnx as pb;

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repo root")
        .to_path_buf()
}

/// An empty scratch directory under `target/mmq-cli-tests/`.
pub fn scratch(name: &str) -> PathBuf {
    let dir = repo().join("target/mmq-cli-tests").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// The `mmq` binary.
pub fn mmq() -> Command {
    Command::cargo_bin("mmq").expect("mmq binary")
}

/// Runs mmq in `dir`; returns (exit code, stdout, stderr), with `dir` replaced by `[DIR]`.
pub fn run_in(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let out = mmq().current_dir(dir).args(args).output().expect("run mmq");
    let clean = |b: &[u8]| String::from_utf8_lossy(b).replace(&dir.display().to_string(), "[DIR]");
    (
        out.status.code().unwrap_or(-1),
        clean(&out.stdout),
        clean(&out.stderr),
    )
}

/// `out` of a command that must have succeeded; otherwise fails the test with its stderr.
pub fn succeeded(out: std::process::Output) -> std::process::Output {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A fixture model's path.
pub fn fixture(name: &str) -> String {
    repo()
        .join(format!("tests/fixtures/{name}/model.onnx"))
        .display()
        .to_string()
}

/// The test environment's Python (onnx and onnxruntime for the oracle).
pub fn python() -> PathBuf {
    let py = repo().join(".venv/bin/python");
    assert!(
        py.exists(),
        "{} is missing: run tools/setup-venv.sh (onnx and onnxruntime for the oracle)",
        py.display()
    );
    py
}

/// A tensor type of element type `elem` and static `dims`.
pub fn tensor_type(elem: i32, dims: &[i64]) -> pb::TypeProto {
    pb::TypeProto {
        value: Some(pb::type_proto::Value::TensorType(pb::type_proto::Tensor {
            elem_type: Some(elem),
            shape: Some(pb::TensorShapeProto {
                dim: dims
                    .iter()
                    .map(|&d| pb::tensor_shape_proto::Dimension {
                        value: Some(pb::tensor_shape_proto::dimension::Value::DimValue(d)),
                        ..Default::default()
                    })
                    .collect(),
            }),
        })),
        ..Default::default()
    }
}

/// A graph input or output of element type `elem` and static `dims`.
pub fn value_info(name: &str, elem: i32, dims: &[i64]) -> pb::ValueInfoProto {
    pb::ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(tensor_type(elem, dims)),
        ..Default::default()
    }
}
