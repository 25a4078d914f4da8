//! Quantizing a model with external weights streams them: the weights are decoded with
//! positional reads (the data file's pages never count as the process's resident memory), INT8
//! holds one weight's f32 copy at a time, and calibration keeps at most 256 MiB of weights
//! decoded between uses. Peak resident memory of the `mmq` child process (`getrusage`), on a
//! 384 MiB model of twelve 2048 x 4096 f32 weights:
//!
//! - `--quant int8-dynamic`: at most 1.5x the output plus 64 MiB for the program itself
//!   (reading the weights through the memory map, as before, put the whole model on top);
//! - `--quant int8 --calib-random 2`: at most the model's size plus 96 MiB (before: the model
//!   mapped plus a decoded copy of every weight, twice its size).

mod common;

use std::io::Write;
use std::path::Path;

use common::{mmq, scratch, value_info};
use mmq_onnx::proto::onnx as pb;
use prost::Message;

const K: usize = 2048;
const N: usize = 4096;
const LAYERS: usize = 6;

/// `x [1, 8, K]` through `LAYERS` pairs of MatMuls (`K x N`, then `N x K`), every weight in
/// `model.onnx.data`; returns the data file's size.
fn write_model(dir: &Path) -> u64 {
    let mut data = std::io::BufWriter::new(
        std::fs::File::create(dir.join("model.onnx.data")).expect("data file"),
    );
    let mut nodes = Vec::new();
    let mut inits = Vec::new();
    let mut offset = 0u64;
    // One MiB of pseudo-random values (an LCG), repeated with a shift per weight.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let pattern: Vec<u8> = (0..1 << 18)
        .flat_map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.05).to_le_bytes()
        })
        .collect();
    let mut x = "x".to_owned();
    for i in 0..2 * LAYERS {
        let (rows, cols) = if i % 2 == 0 { (K, N) } else { (N, K) };
        let len = rows * cols * 4;
        let bytes: Vec<u8> = pattern
            .iter()
            .cycle()
            .skip(4 * i)
            .take(len)
            .copied()
            .collect();
        data.write_all(&bytes).expect("write weights");
        let name = format!("w{i}");
        inits.push(pb::TensorProto {
            name: Some(name.clone()),
            dims: vec![rows as i64, cols as i64],
            data_type: Some(1),
            data_location: Some(pb::tensor_proto::DataLocation::External as i32),
            external_data: [
                ("location", "model.onnx.data".to_owned()),
                ("offset", offset.to_string()),
                ("length", bytes.len().to_string()),
            ]
            .into_iter()
            .map(|(k, v)| pb::StringStringEntryProto {
                key: Some(k.into()),
                value: Some(v),
            })
            .collect(),
            ..Default::default()
        });
        offset += bytes.len() as u64;
        let y = format!("h{i}");
        nodes.push(pb::NodeProto {
            name: Some(format!("matmul{i}")),
            op_type: Some("MatMul".into()),
            input: vec![x.clone(), name],
            output: vec![y.clone()],
            ..Default::default()
        });
        x = y;
    }
    data.flush().expect("flush");
    let model = pb::ModelProto {
        ir_version: Some(9),
        opset_import: vec![pb::OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(17),
        }],
        graph: Some(pb::GraphProto {
            name: Some("g".into()),
            node: nodes,
            initializer: inits,
            input: vec![value_info("x", 1, &[1, 8, K as i64])],
            output: vec![value_info(&x, 1, &[1, 8, K as i64])],
            ..Default::default()
        }),
        ..Default::default()
    };
    std::fs::write(dir.join("model.onnx"), model.encode_to_vec()).expect("write model");
    offset
}

/// The largest resident set of any child process waited for so far, in bytes.
fn children_peak_rss() -> u64 {
    // SAFETY: getrusage writes one plain C struct; a zeroed `rusage` is a valid value.
    #[allow(unsafe_code, reason = "getrusage fills a C struct")]
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable `rusage`.
    #[allow(unsafe_code, reason = "getrusage fills a C struct")]
    let rc = unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) };
    assert_eq!(rc, 0, "getrusage");
    u.ru_maxrss as u64 * 1024
}

/// Bytes of `dir/model.onnx` and its external data.
fn output_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .expect("output dir")
        .map(|e| e.expect("entry").metadata().expect("metadata").len())
        .sum()
}

#[test]
fn int8_quantization_streams_the_weights() {
    let dir = scratch("streaming");
    let model_bytes = write_model(&dir);
    let model = dir.join("model.onnx");
    const MIB: u64 = 1 << 20;

    // Dynamic first: the children's peak only grows, and the static run's bound is larger.
    let dynamic = dir.join("dynamic");
    std::fs::create_dir_all(&dynamic).expect("dir");
    mmq()
        .arg("compile")
        .arg(&model)
        .args([
            "--target",
            "ort",
            "--quant",
            "int8-dynamic",
            "--no-accuracy",
            "-o",
        ])
        .arg(dynamic.join("model.onnx"))
        .assert()
        .success();
    let out = output_bytes(&dynamic);
    let peak = children_peak_rss();
    assert!(
        out > model_bytes / 5,
        "the output holds the int8 weights: {out} bytes"
    );
    assert!(
        peak <= out + out / 2 + 64 * MIB,
        "int8-dynamic peaked at {} MiB for a {} MiB output (model {} MiB)",
        peak / MIB,
        out / MIB,
        model_bytes / MIB
    );

    let stat = dir.join("static");
    std::fs::create_dir_all(&stat).expect("dir");
    mmq()
        .arg("compile")
        .arg(&model)
        .args(["--target", "ort", "--quant", "int8", "--calib-random", "2"])
        .args(["--no-accuracy", "-o"])
        .arg(stat.join("model.onnx"))
        .assert()
        .success();
    let peak = children_peak_rss();
    assert!(
        peak <= model_bytes + 96 * MIB,
        "int8 with calibration peaked at {} MiB for a {} MiB model",
        peak / MIB,
        model_bytes / MIB
    );
}
