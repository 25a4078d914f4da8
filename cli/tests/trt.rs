//! `mmq compile --target trt` from the command line, and `mmq inspect` of the package it writes.

mod common;

use common::{fixture, run_in, scratch};

#[test]
fn inspect_summarizes_a_package_and_the_plugins_it_needs() {
    let dir = scratch("trt-inspect");
    let vit = fixture("vit_dynamic");
    let (code, _, stderr) = run_in(
        &dir,
        &[
            "compile",
            &vit,
            "--target",
            "trt",
            "--quant",
            "int8",
            "--calib-random",
            "4",
            "--symbol",
            "batch=1:2:4",
            "--no-accuracy",
            "-o",
            "pkg",
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("trt: wrote pkg: model.onnx"), "{stderr}");
    let (code, text, stderr) = run_in(&dir, &["inspect", "pkg"]);
    assert_eq!(code, 0, "{stderr}");
    for want in [
        "TensorRT package pkg",
        "model model.onnx",
        "QuantizeLinear i8",
        "reference: model.reference_inputs.npz, model.reference_outputs.npz",
        "profile batch = 1:2:4",
        "plugins: none",
        "TensorRT rules: no finding",
    ] {
        assert!(text.contains(want), "no '{want}' in\n{text}");
    }
    let (code, json, _) = run_in(&dir, &["inspect", "pkg", "--format", "json"]);
    assert_eq!(code, 0);
    assert_eq!(
        json,
        std::fs::read_to_string(dir.join("pkg/manifest.json")).expect("manifest")
    );
    // The QAT model's u8 units with zero points other than 128: plugins, listed with the nodes
    // and why.
    let qat = fixture("qat_cnn");
    let (code, _, stderr) = run_in(&dir, &["compile", &qat, "--target", "trt", "-o", "qat"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("plugins/build.sh"), "{stderr}");
    assert!(!stderr.contains("will refuse"), "{stderr}");
    let (_, text, _) = run_in(&dir, &["inspect", "qat"]);
    for want in [
        "plugins: 2 (plugins/libmmq_plugins.so",
        "MmqQuantize v1 (4 nodes)",
        "MmqDequantize v1 (4 nodes)",
        "why: TensorRT's Q/DQ layers are symmetric",
        "nodes: /input_fq/QuantizeLinear",
        "TensorRT rules: no finding",
    ] {
        assert!(text.contains(want), "no '{want}' in\n{text}");
    }
}
