//! INT8 quantization end to end through the interpreter: calibrate on random samples, quantize
//! (static W8A8 and dynamic), run the fixture's stored inputs, and compare the main output with
//! FP32 under a cosine floor per fixture and scheme. Also checks the inserted Q/DQ against the
//! interpreter's own QuantizeLinear on the same data.

#![allow(
    clippy::print_stderr,
    reason = "the test reports the cosines it measured"
)]

use std::collections::HashMap;
use std::path::Path;

use mmq_ir::{Module, Op};
use mmq_kernels::{Interpreter, RtValue};
use mmq_passes::quant::calibrate::{self, Observer};
use mmq_passes::quant::int8::{Int8Pass, Int8Scheme};
use mmq_passes::{OptLevel, PassManager, PassOptions, Target, pipeline};
use mmq_tests::repo_root;

fn load(name: &str) -> Module {
    let path = repo_root().join(format!("tests/fixtures/{name}/model.onnx"));
    let mut m = mmq_onnx::load_files(&[path.as_path()], &mmq_onnx::LoadOptions::default())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let opts = PassOptions {
        target: Target::Ort,
        explain: false,
    };
    pipeline(Target::Ort, OptLevel::O2)
        .run(&mut m, &opts)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    m
}

fn inputs(name: &str) -> HashMap<String, RtValue> {
    let path = repo_root().join(format!("tests/fixtures/{name}/inputs.npz"));
    mmq_kernels::io::read_npz(Path::new(&path))
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .into_iter()
        .map(|(k, t)| (k, RtValue::from(t)))
        .collect()
}

fn main_output(m: &Module, x: &HashMap<String, RtValue>) -> Vec<f64> {
    let g = m.entries[0].graph;
    let outs = Interpreter::new(m).run(g, x).expect("interpreter runs");
    outs[0]
        .1
        .as_tensor()
        .expect("tensor output")
        .to_f64()
        .expect("float output")
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f64 = a.iter().map(|x| x * x).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (na * nb)
}

fn count(m: &Module, op: &str) -> usize {
    m.entries
        .iter()
        .flat_map(|e| m.graphs[e.graph].nodes.iter())
        .filter(|&&n| m.nodes[n].op.op_type() == op)
        .count()
}

fn quantize(m: &Module, dynamic: bool, observer: Observer) -> Module {
    let mut q = m.clone();
    let scheme = if dynamic {
        Int8Scheme::Dynamic
    } else {
        let g = m.entries[0].graph;
        let acts = Int8Pass::activations(m, None);
        let samples = calibrate::random_samples(m, g, 6, 7).expect("drawable inputs");
        let ranges =
            calibrate::calibrate(m, g, &acts[0].1, samples, observer).expect("calibration runs");
        assert_eq!(ranges.samples, 6);
        Int8Scheme::Static {
            ranges,
            symmetric: false,
        }
    };
    let mut pm = PassManager::new(vec![Box::new(Int8Pass::new(scheme))]);
    pm.verify = true;
    pm.run(&mut q, &PassOptions::default())
        .expect("int8 pass runs");
    q
}

fn check(name: &str, dynamic: bool, observer: Observer, floor: f64) {
    let m = load(name);
    let q = quantize(&m, dynamic, observer);
    let x = inputs(name);
    let c = cosine(&main_output(&m, &x), &main_output(&q, &x));
    let quantized = if dynamic {
        count(&q, "MatMulInteger")
    } else {
        count(&q, "QuantizeLinear")
    };
    assert!(quantized > 0, "{name}: nothing was quantized");
    eprintln!("{name} dynamic={dynamic} {observer}: cosine {c:.6}");
    assert!(
        c >= floor,
        "{name} ({}): cosine {c} below {floor}",
        if dynamic { "dynamic" } else { "static" }
    );
}

#[test]
fn vit_static_minmax() {
    check("vit", false, Observer::MinMax, 0.999);
}

#[test]
fn vit_static_percentile() {
    check(
        "vit",
        false,
        Observer::Percentile { percentile: 99.99 },
        0.999,
    );
}

#[test]
fn vit_dynamic() {
    check("vit", true, Observer::MinMax, 0.9999);
}

#[test]
fn clip_static_entropy() {
    check("clip", false, Observer::Entropy, 0.99);
}

#[test]
fn gpt2_dynamic() {
    check("gpt2_kv", true, Observer::MinMax, 0.999);
}

#[test]
fn clip_dynamic() {
    check("clip", true, Observer::MinMax, 0.995);
}

#[test]
fn gpt2_static_mse() {
    check("gpt2_kv", false, Observer::Mse, 0.999);
}

/// The weight codes and scales the pass computes are what the interpreter's per-axis
/// `QuantizeLinear` gives for the same scales: round half to even (ties at 0.5, 1.5, 2.5 steps),
/// saturation at the code range.
#[test]
fn weight_codes_match_the_interpreters_quantize_linear() {
    use mmq_ir::{ConstData, DType, Dim, Entry, ModelInfo, Storage, Type};
    use mmq_kernels::Tensor;
    use mmq_passes::quant::int8::quantize_weight_per_channel;

    // Column 0: amax 7.875 → scale 0.125 at qmax 63, with exact ties; column 1: other values.
    let col0 = [
        7.875f32, 0.0625, 0.1875, 0.3125, -0.0625, -0.1875, -7.875, 3.0,
    ];
    let mut w = Vec::new();
    for (i, &a) in col0.iter().enumerate() {
        w.push(a);
        w.push(((i as f32) * 0.37).sin() * 2.0);
    }
    for qmax in [63, 127] {
        let (codes, scales) = quantize_weight_per_channel(&w, &[8, 2], 1, qmax);
        let mut m = Module::new();
        let g = m.add_graph("q", None);
        m.entries.push(Entry {
            graph: g,
            model: ModelInfo {
                opsets: vec![(String::new(), 21)],
                ..Default::default()
            },
        });
        let x = m.add_input(
            g,
            Some("w".into()),
            Type::tensor(DType::F32, vec![Dim::known(8), Dim::known(2)]),
        );
        let bytes: Vec<u8> = scales.iter().flat_map(|s| s.to_le_bytes()).collect();
        let sv = m.add_const(ConstData::new(
            Some("s".into()),
            DType::F32,
            vec![2],
            Storage::Inline(bytes.into()),
        ));
        let zv = m.add_const(ConstData::new(
            Some("z".into()),
            DType::I8,
            vec![2],
            Storage::Inline(vec![0u8, 0].into()),
        ));
        let n = m.add_node(
            g,
            Op::QuantizeLinear {
                axis: Some(1),
                block_size: None,
                output_dtype: None,
                precision: None,
                saturate: None,
            },
            vec![Some(x), Some(sv), Some(zv)],
            vec![Some((
                Some("q".into()),
                Type::tensor(DType::I8, vec![Dim::known(8), Dim::known(2)]),
            ))],
            None,
        );
        let out = m.nodes[n].outputs[0].expect("result");
        m.graphs[g].outputs.push(out);
        let input = Tensor::from_f32(vec![8, 2], w.clone()).expect("tensor");
        let x = HashMap::from([("w".to_owned(), RtValue::from(input))]);
        let got = Interpreter::new(&m)
            .run(g, &x)
            .expect("QuantizeLinear runs");
        let want: Vec<i64> = got[0]
            .1
            .as_tensor()
            .expect("tensor")
            .to_i64()
            .expect("ints");
        let codes: Vec<i64> = codes.iter().map(|&c| i64::from(c)).collect();
        assert_eq!(codes, want, "qmax {qmax}");
        assert!(codes.iter().all(|c| c.abs() <= i64::from(qmax)));
        if qmax == 63 {
            // 0.5 steps → 0, 1.5 → 2, 2.5 → 2, -0.5 → 0, -1.5 → -2 (half to even).
            let c0: Vec<i64> = codes.iter().step_by(2).copied().collect();
            assert_eq!(c0, vec![63, 0, 2, 2, 0, -2, -63, 24]);
        }
    }
}

#[test]
fn random_samples_respect_vocabulary_and_symbols() {
    let m = load("gpt2_kv");
    let g = m.entries[0].graph;
    let samples: Vec<_> = calibrate::random_samples(&m, g, 4, 1)
        .expect("drawable")
        .collect::<Result<_, _>>()
        .expect("samples");
    assert_eq!(samples.len(), 4);
    for s in &samples {
        // Every sample runs: dims bind consistently and token ids index the embedding.
        Interpreter::new(&m).run(g, s).expect("sample runs");
    }
}

#[test]
fn dir_samples_reads_npz_in_order_and_reports_bad_folders() {
    let dir = repo_root().join("tests/fixtures/vit");
    let samples: Vec<_> = calibrate::dir_samples(&dir)
        .expect("folder")
        .collect::<Result<_, _>>()
        .expect("npz files");
    assert_eq!(samples.len(), 2); // inputs.npz, outputs.npz
    let err = calibrate::dir_samples(&repo_root().join("tests/no-such-dir"))
        .err()
        .expect("missing folder is an error");
    assert!(err.to_string().contains("cannot read"), "{err}");
}

/// Placement: one `QuantizeLinear` per activation source, shared by its consumers (the Q, K and
/// V projections of one norm output), never fed by a `DequantizeLinear` (no DQ → Q churn), and
/// every quantized `MatMul` reads two `DequantizeLinear` results.
#[test]
fn placement_shares_quantize_and_has_no_churn() {
    let m = load("vit");
    let q = quantize(&m, false, Observer::MinMax);
    let g = q.entries[0].graph;
    let producer = |v: mmq_ir::Value| match q.values[v].def {
        mmq_ir::ValueDef::Output { node, .. } => Some(q.nodes[node].op.op_type().to_owned()),
        _ => None,
    };
    let mut sources = std::collections::HashSet::new();
    let (mut quants, mut matmuls) = (0, 0);
    for &n in &q.graphs[g].nodes {
        let node = &q.nodes[n];
        match node.op.op_type() {
            "QuantizeLinear" => {
                quants += 1;
                let x = node.inputs[0].expect("input");
                assert_ne!(producer(x).as_deref(), Some("DequantizeLinear"));
                assert!(sources.insert(x), "two QuantizeLinear nodes on one value");
            }
            "MatMul" => {
                matmuls += 1;
                for i in 0..2 {
                    let x = node.inputs[i].expect("operand");
                    assert_eq!(producer(x).as_deref(), Some("DequantizeLinear"));
                }
            }
            _ => {}
        }
    }
    assert_eq!(matmuls, 12);
    // 12 MatMuls and the patch Conv (input and output) share 10 quantized activations.
    assert!(
        quants < matmuls,
        "{quants} QuantizeLinear for {matmuls} MatMul"
    );
}
