//! The `mmq` command line: exit codes, diagnostics for malformed input (snapshot-tested), atomic
//! outputs, and the JSON summary schema.

mod common;

use std::path::{Path, PathBuf};

use common::{mmq, repo, run_in, scratch, succeeded, value_info};

use mmq_onnx::proto::onnx as pb;
use prost::Message;

fn node(name: &str, op: &str, inputs: &[&str], outputs: &[&str]) -> pb::NodeProto {
    pb::NodeProto {
        name: Some(name.into()),
        op_type: Some(op.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// `y = Relu(Add(x, w))` with `w` a 6-element initializer.
fn small_model() -> pb::ModelProto {
    let w = pb::TensorProto {
        name: Some("w".into()),
        dims: vec![2, 3],
        data_type: Some(1),
        raw_data: Some(bytes::Bytes::from(vec![0u8; 24])),
        ..Default::default()
    };
    pb::ModelProto {
        ir_version: Some(8),
        opset_import: vec![pb::OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(17),
        }],
        producer_name: Some("test".into()),
        graph: Some(pb::GraphProto {
            name: Some("g".into()),
            node: vec![
                node("add", "Add", &["x", "w"], &["s"]),
                node("relu", "Relu", &["s"], &["y"]),
            ],
            initializer: vec![w],
            input: vec![value_info("x", 1, &[2, 3])],
            output: vec![value_info("y", 1, &[2, 3])],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn write(dir: &Path, name: &str, m: &pb::ModelProto) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, m.encode_to_vec()).expect("write model");
    p
}

/// Every malformed-ONNX case: its model file (or bytes) and the diagnostic it must produce.
#[test]
fn malformed_onnx_diagnostics() {
    let dir = scratch("malformed");
    let good = small_model();
    write(&dir, "good.onnx", &good);
    std::fs::write(dir.join("not_onnx.onnx"), b"this is not a protobuf model\n").expect("write");
    let bytes = good.encode_to_vec();
    std::fs::write(dir.join("truncated.onnx"), &bytes[..bytes.len() - 7]).expect("write");

    let mut external = small_model();
    let g = external.graph.as_mut().expect("graph");
    let w = &mut g.initializer[0];
    w.raw_data = None;
    w.data_location = Some(pb::tensor_proto::DataLocation::External as i32);
    w.external_data = vec![
        pb::StringStringEntryProto {
            key: Some("location".into()),
            value: Some("w.bin".into()),
        },
        pb::StringStringEntryProto {
            key: Some("offset".into()),
            value: Some("0".into()),
        },
        pb::StringStringEntryProto {
            key: Some("length".into()),
            value: Some("24".into()),
        },
    ];
    write(&dir, "missing_external.onnx", &external);
    let short_dir = dir.join("short");
    std::fs::create_dir_all(&short_dir).expect("dir");
    write(&short_dir, "short_external.onnx", &external);
    std::fs::write(short_dir.join("w.bin"), [0u8; 10]).expect("write");

    let mut dtype = small_model();
    dtype.graph.as_mut().expect("graph").input[0] = value_info("x", 99, &[2, 3]);
    write(&dir, "unknown_dtype.onnx", &dtype);

    let mut opset = small_model();
    opset.opset_import[0].version = Some(99);
    write(&dir, "unknown_opset.onnx", &opset);

    let mut cycle = small_model();
    cycle.graph.as_mut().expect("graph").node = vec![
        node("a", "Add", &["x", "t"], &["s"]),
        node("b", "Relu", &["s"], &["t"]),
        node("c", "Relu", &["s"], &["y"]),
    ];
    write(&dir, "cycle.onnx", &cycle);

    let mut dangling = small_model();
    dangling.graph.as_mut().expect("graph").node[1] = node("relu", "Relu", &["nowhere"], &["y"]);
    write(&dir, "dangling.onnx", &dangling);

    let mut duplicate = small_model();
    duplicate.graph.as_mut().expect("graph").node = vec![
        node("add", "Add", &["x", "w"], &["y"]),
        node("relu", "Relu", &["x"], &["y"]),
    ];
    write(&dir, "duplicate.onnx", &duplicate);

    let mut report = String::new();
    for case in [
        "missing.onnx",
        "not_onnx.onnx",
        "truncated.onnx",
        "missing_external.onnx",
        "short/short_external.onnx",
        "unknown_dtype.onnx",
        "unknown_opset.onnx",
        "cycle.onnx",
        "dangling.onnx",
        "duplicate.onnx",
    ] {
        let (code, stdout, stderr) = run_in(&dir, &["convert", case, "-o", "out.onnx"]);
        assert_eq!(code, 1, "{case}: exit code {code}, stderr: {stderr}");
        assert!(stdout.is_empty(), "{case}: unexpected stdout {stdout}");
        assert!(!stderr.contains("panicked"), "{case}: {stderr}");
        assert!(
            !dir.join("out.onnx").exists(),
            "{case}: left an output file"
        );
        report.push_str(&format!(
            "$ mmq convert {case} -o out.onnx  # exit {code}\n{stderr}\n"
        ));
    }
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .expect("dir")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("tmp") || n.starts_with('.'))
        .collect();
    assert!(
        leftovers.is_empty(),
        "temporary files left behind: {leftovers:?}"
    );
    insta::assert_snapshot!("malformed_onnx", report);
}

#[test]
fn convert_round_trips_and_refuses_to_overwrite_input() {
    let dir = scratch("convert");
    let model = write(&dir, "m.onnx", &small_model());
    let before = std::fs::read(&model).expect("read");
    let (code, _, stderr) = run_in(&dir, &["convert", "m.onnx", "-o", "m.onnx"]);
    // Refused before the model is read: a usage error naming both.
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("-o m.onnx: that is an input (m.onnx)"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read(&model).expect("read"),
        before,
        "input was modified"
    );
    let (code, _, stderr) = run_in(&dir, &["convert", "m.onnx", "-o", "out.onnx"]);
    assert_eq!(code, 0, "{stderr}");
    let out = pb::ModelProto::decode(
        std::fs::read(dir.join("out.onnx"))
            .expect("read")
            .as_slice(),
    )
    .expect("valid protobuf");
    let g = out.graph.expect("graph");
    assert_eq!(g.node.len(), 2);
    assert_eq!(g.input[0].name(), "x");
    assert_eq!(g.output[0].name(), "y");
    assert_eq!(g.initializer[0].name(), "w");
}

#[test]
fn usage_errors_exit_2() {
    let dir = scratch("usage");
    assert_eq!(run_in(&dir, &["convert", "m.onnx"]).0, 2);
    assert_eq!(run_in(&dir, &["inspect"]).0, 2);
    assert_eq!(run_in(&dir, &["frobnicate"]).0, 2);
    assert_eq!(
        run_in(&dir, &["inspect", "m.onnx", "--format", "yaml"]).0,
        2
    );
}

#[test]
fn malformed_mmir_diagnostics() {
    let dir = scratch("mmir");
    let cases = [
        (
            "undefined.mmir",
            "graph @g(%x: f32[2]) -> (f32[2]) {\n  %y = Relu(%z) : f32[2]\n  return %y\n}\n",
        ),
        (
            "bad_dtype.mmir",
            "graph @g(%x: f33[2]) -> (f32[2]) {\n  return %x\n}\n",
        ),
        (
            "bad_attr.mmir",
            "graph @g(%x: f32[2, 3]) -> (f32[3, 2]) {\n  %y = Transpose(%x) {prem = [1, 0]} : f32[3, 2]\n  return %y\n}\n",
        ),
        (
            "duplicate.mmir",
            "graph @g(%x: f32[2]) -> (f32[2]) {\n  %y = Relu(%x) : f32[2]\n  %y = Neg(%x) : f32[2]\n  return %y\n}\n",
        ),
    ];
    let mut report = String::new();
    for (name, text) in cases {
        std::fs::write(dir.join(name), text).expect("write");
        let (code, _, stderr) = run_in(&dir, &["verify", name]);
        assert_eq!(code, 1, "{name}: {stderr}");
        assert!(!stderr.contains("panicked"), "{name}: {stderr}");
        report.push_str(&format!("$ mmq verify {name}  # exit {code}\n{stderr}\n"));
    }
    insta::assert_snapshot!("malformed_mmir", report);
}

#[test]
fn inspect_json_schema() {
    let vit = repo().join("tests/fixtures/vit/model.onnx");
    let out = succeeded(
        mmq()
            .args(["inspect", "--format", "json"])
            .arg(&vit)
            .output()
            .expect("run"),
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    for key in ["symbols", "graphs", "constants", "weight_bytes"] {
        assert!(j.get(key).is_some(), "missing {key}");
    }
    let g = &j["graphs"][0];
    assert!(g["nodes"].as_u64().unwrap_or(0) > 10);
    assert!(g["ops"]["MatMul"].as_u64().unwrap_or(0) > 0);
    let input = &g["inputs"][0];
    assert_eq!(input["dtype"], "f32");
    assert!(
        input["shape"][0].is_string(),
        "batch should be symbolic: {input}"
    );
    assert!(j["weight_bytes"].as_u64().unwrap_or(0) > 1000);
}

#[test]
fn inspect_pipeline_shares_symbols() {
    let dir = repo().join("tests/fixtures/pipeline");
    let out = succeeded(
        mmq()
            .args(["inspect", "--format", "json"])
            .arg(dir.join("vision_encoder.onnx"))
            .arg(dir.join("decoder.onnx"))
            .output()
            .expect("run"),
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(j["graphs"].as_array().map(Vec::len), Some(2));
    let batch: Vec<_> = j["symbols"]
        .as_array()
        .expect("symbols")
        .iter()
        .filter(|s| s["name"] == "batch")
        .collect();
    assert_eq!(batch.len(), 1, "one shared `batch` symbol");
    assert_eq!(j["graphs"][0]["inputs"][0]["shape"][0], "batch");
    assert_eq!(j["graphs"][1]["inputs"][0]["shape"][0], "batch");
}

#[test]
fn inspect_text_stats_and_dot() {
    let vit = repo().join("tests/fixtures/vit/model.onnx");
    let out = mmq()
        .args(["inspect", "--stats"])
        .arg(&vit)
        .output()
        .expect("run");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("graph @"), "{text}");
    assert!(text.contains("// weights:"), "{text}");
    let out = mmq()
        .args(["inspect", "--format", "dot"])
        .arg(&vit)
        .output()
        .expect("run");
    assert!(out.status.success());
    let dot = String::from_utf8_lossy(&out.stdout);
    assert!(dot.starts_with("digraph"), "{dot}");
    assert!(dot.contains("MatMul"));
}

/// An output whose directory does not exist is refused before any work (and nothing is
/// written).
#[test]
fn compile_to_a_missing_directory_fails_early() {
    let dir = scratch("compile-missing-dir");
    let model = repo().join("tests/fixtures/vit/model.onnx");
    let (code, _, err) = run_in(
        &dir,
        &[
            "compile",
            model.to_str().expect("utf-8"),
            "--target",
            "ort",
            "--quant",
            "int8",
            "-o",
            "missing/out.onnx",
        ],
    );
    assert_eq!(code, 1, "{err}");
    assert_eq!(
        err,
        "error: cannot write missing/out.onnx: the directory missing does not exist\n"
    );
    assert!(!dir.join("missing").exists());
}

/// A default-domain node of a modeled op with an attribute the op does not take stays an opaque
/// custom op: `verify` and `compile` succeed and print a warning naming the node and the
/// attribute; the node is exported unchanged.
#[test]
fn a_modeled_op_with_an_unknown_attribute_is_warned_about() {
    let dir = scratch("custom-fallback-warning");
    let mut m = small_model();
    let relu = &mut m.graph.as_mut().expect("graph").node[1];
    relu.attribute.push(pb::AttributeProto {
        name: Some("alpha".into()),
        r#type: Some(pb::attribute_proto::AttributeType::Float as i32),
        f: Some(0.1),
        ..Default::default()
    });
    write(&dir, "m.onnx", &m);
    for args in [
        &["verify", "m.onnx"][..],
        &["compile", "m.onnx", "--target", "ort", "-o", "out.onnx"][..],
    ] {
        let (code, _, err) = run_in(&dir, args);
        assert_eq!(code, 0, "{args:?}: {err}");
        assert!(
            err.contains("warning: node Relu 'relu' is kept opaque")
                && err.contains("Relu takes no attributes, but 'alpha' is set")
                && err.contains("--> m.onnx: node 'relu' (Relu)"),
            "{args:?}: {err}"
        );
    }
    let out = pb::ModelProto::decode(&*std::fs::read(dir.join("out.onnx")).expect("written"))
        .expect("decodes");
    let relu = out
        .graph
        .expect("graph")
        .node
        .into_iter()
        .find(|n| n.op_type.as_deref() == Some("Relu"))
        .expect("Relu kept");
    assert_eq!(relu.attribute.len(), 1);
}

#[test]
fn compile_targets_onnx_runtime_unless_told_otherwise() {
    let dir = scratch("compile-default-target");
    let model = repo().join("tests/fixtures/vit/model.onnx");
    let model = model.to_str().expect("utf-8");
    let (code, _, stderr) = run_in(&dir, &["compile", model, "-o", "default.onnx"]);
    assert_eq!(code, 0, "{stderr}");
    let (code, _, stderr) = run_in(
        &dir,
        &["compile", model, "--target", "ort", "-o", "ort.onnx"],
    );
    assert_eq!(code, 0, "{stderr}");
    let read = |n: &str| std::fs::read(dir.join(n)).expect("read");
    assert_eq!(read("default.onnx"), read("ort.onnx"));
}

/// Names may hold any character; DOT output escapes control characters (a terminal acts on ESC
/// and BEL) and keeps quotes and newlines inside their string.
#[test]
fn dot_output_escapes_control_characters_of_names() {
    let dir = scratch("dot-control");
    let mut m = small_model();
    let g = m.graph.as_mut().expect("graph");
    g.name = Some("g\u{1b}[31m".into());
    g.input[0].name = Some("x\u{7}".into());
    g.node[0].input[0] = "x\u{7}".into();
    g.output[0].name = Some("y\"\n}".into());
    g.node[1].output[0] = "y\"\n}".into();
    let path = write(&dir, "m.onnx", &m);
    let out = succeeded(
        mmq()
            .args(["inspect", "--format", "dot"])
            .arg(&path)
            .output()
            .expect("run"),
    );
    let dot = String::from_utf8_lossy(&out.stdout);
    assert!(!dot.chars().any(|c| c.is_control() && c != '\n'), "{dot:?}");
    assert!(dot.contains(r#"digraph "g\\u{1b}[31m""#), "{dot}");
    assert!(dot.contains(r#"label="x\\u{7}\nf32[2, 3]""#), "{dot}");
    assert!(dot.contains(r#"label="y\"\n}""#), "{dot}");
}

/// `inspect DIR`: a deployment package prints its stages' graphs; a directory that is no
/// package says what `inspect` reads and that the directory holds neither kind.
#[test]
fn inspect_reads_packages_and_explains_other_directories() {
    let dir = scratch("inspect-dirs");
    std::fs::create_dir_all(dir.join("empty")).expect("dir");
    let (code, out, err) = run_in(&dir, &["inspect", "empty"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("empty: it is a directory, not a regular file or a package"),
        "{err}"
    );
    assert!(
        err.contains("manifest.json") && err.contains("pipeline.json"),
        "{err}"
    );
    let model = repo().join("tests/fixtures/llama_gqa_kv/model.onnx");
    let model = model.to_str().expect("utf-8");
    let (code, _, err) = run_in(&dir, &["compile", model, "--package", "-o", "pkg"]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = run_in(&dir, &["inspect", "pkg"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("graph @") && out.contains("%logits"), "{out}");
}

/// Names may hold any character; a terminal acts on ESC and BEL. Everything mmq prints (errors,
/// warnings, notes, `inspect`, the run summary) writes control characters as `\u{..}` text.
#[test]
fn control_characters_in_names_never_reach_the_terminal() {
    let dir = scratch("control-chars");
    let evil_in = "x\u{1b}[31mred\u{7}";
    let evil_out = "y\u{1b}]0;title\u{7}";
    let mut m = small_model();
    let g = m.graph.as_mut().expect("graph");
    g.input = vec![value_info(evil_in, 1, &[2, 3])];
    g.output = vec![value_info(evil_out, 1, &[2, 3])];
    g.node = vec![
        node("add\u{1b}[2J", "Add", &[evil_in, "w"], &["s"]),
        node("relu\u{7}", "Relu", &["s"], &[evil_out]),
    ];
    let model = write(&dir, "evil.onnx", &m);
    let model = model.to_str().expect("utf-8");
    std::fs::write(
        dir.join("map.toml"),
        "[[rule]]\nname = \"r\\u001b[5m\"\nops = [\"Conv\"]\nscheme = \"int8\"\n",
    )
    .expect("map");
    let runs: &[&[&str]] = &[
        &["verify", model],
        &["inspect", model, "--stats"],
        &["inspect", model, "--format", "json"],
        &["run", model, "--inputs", "missing.npz"],
        &["run", model],
        &[
            "compile",
            model,
            "--precision-map",
            "map.toml",
            "-o",
            "out.onnx",
        ],
        &["compile", model, "--time-passes", "-o", "out2.onnx"],
    ];
    let mut escaped = 0;
    for args in runs {
        let out = common::mmq()
            .current_dir(&dir)
            .args(*args)
            .output()
            .expect("runs");
        for bytes in [&out.stdout, &out.stderr] {
            assert!(
                !bytes.iter().any(|&b| b == 0x1b || b == 0x07),
                "{args:?}: {}",
                String::from_utf8_lossy(bytes)
            );
            escaped += usize::from(String::from_utf8_lossy(bytes).contains("\\u{1b}"));
        }
    }
    assert!(
        escaped >= 3,
        "names were printed escaped in {escaped} outputs"
    );
}
