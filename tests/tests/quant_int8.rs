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
use mmq_passes::quant::place::Placement;
use mmq_passes::{PassManager, PassOptions};
use mmq_tests::{cosine, repo_root, scratch_dir};

fn load(name: &str) -> Module {
    mmq_tests::load_fixture_o2(name)
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

fn count(m: &Module, op: &str) -> usize {
    m.entries
        .iter()
        .flat_map(|e| m.graphs[e.graph].nodes().iter())
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
    // Every eligible node: these fixtures are too small for integer products to pay, and the
    // accuracy of the quantized form is what is measured here.
    let pass = Int8Pass::new(scheme).with_placement(Placement::All);
    let mut pm = PassManager::new(vec![Box::new(pass)]);
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
    let m = load("vit");
    let graph = m.entries[0].graph;
    let fixture = repo_root().join("tests/fixtures/vit");
    let dir = scratch_dir("dir-samples");
    for name in ["a.npz", "b.npz"] {
        std::fs::copy(fixture.join("inputs.npz"), dir.join(name)).expect("copy");
    }
    let samples: Vec<_> = calibrate::dir_samples(&m, graph, &dir)
        .expect("folder")
        .collect::<Result<_, _>>()
        .expect("npz files");
    assert_eq!(samples.len(), 2);
    // A file of arrays that are no inputs (the fixture's expected outputs) is refused from its
    // headers, as its run would be: the third sample, naming the array.
    std::fs::copy(fixture.join("outputs.npz"), dir.join("c.npz")).expect("copy");
    let err = calibrate::dir_samples(&m, graph, &dir)
        .expect("folder")
        .collect::<Result<Vec<_>, _>>()
        .expect_err("outputs are no inputs");
    let text = err.to_string();
    assert!(
        text.starts_with("sample 2: input last_hidden_state: not an input of graph"),
        "{text}"
    );
    let err = calibrate::dir_samples(&m, graph, &repo_root().join("tests/no-such-dir"))
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
    for &n in q.graphs[g].nodes() {
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

// ---- Weights in `Constant` nodes and in `If`/`Loop` bodies ----

mod sources {
    use std::collections::HashMap;
    use std::ffi::OsStr;

    use mmq_ir::{
        ConstData, DType, Dim, Entry, GraphId, ModelInfo, Module, Op, Storage, Type, Value,
    };
    use mmq_kernels::{Data, Interpreter, RtValue, Tensor};
    use mmq_passes::quant::calibrate::{self, Observer};
    use mmq_passes::quant::int8::{Int8Pass, Int8Scheme};
    use mmq_passes::quant::place::Placement;
    use mmq_passes::{PassManager, PassOptions, TargetRef};
    use mmq_tests::{cosine, oracle, scratch_dir};

    pub(super) fn f32_ty(dims: &[i64]) -> Type {
        Type::tensor(DType::F32, dims.iter().map(|&d| Dim::known(d)).collect())
    }

    /// Deterministic values in [-1, 1).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn data(name: &str, dtype: DType, shape: Vec<i64>, bytes: Vec<u8>) -> ConstData {
        ConstData::new(
            Some(name.into()),
            dtype,
            shape,
            Storage::Inline(bytes.into()),
        )
    }

    pub(super) fn f32_data(name: &str, shape: &[i64], seed: u64) -> ConstData {
        let n = shape.iter().product::<i64>() as usize;
        let bytes = values(n, seed)
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        data(name, DType::F32, shape.to_vec(), bytes)
    }

    pub(super) fn module() -> (Module, GraphId) {
        let mut m = Module::new();
        let g = m.add_graph("main", None);
        m.entries.push(Entry {
            graph: g,
            model: ModelInfo {
                opsets: vec![(String::new(), 17)],
                ..Default::default()
            },
        });
        (m, g)
    }

    /// A `Constant` node holding `data` in `graph`; returns its result.
    fn constant(m: &mut Module, graph: GraphId, data: ConstData, name: &str) -> Value {
        let shape: Vec<i64> = data.shape.clone();
        let c = m.add_attr_const(data);
        let n = m.add_node(
            graph,
            Op::Constant {
                value: Some(c),
                value_float: None,
                value_floats: None,
                value_int: None,
                value_ints: None,
                value_string: None,
                value_strings: None,
            },
            vec![],
            vec![Some((Some(name.into()), f32_ty(&shape)))],
            None,
        );
        m.nodes[n].outputs[0].expect("result")
    }

    pub(super) fn matmul(
        m: &mut Module,
        graph: GraphId,
        a: Value,
        w: Value,
        out: &str,
        dims: &[i64],
    ) -> Value {
        let n = m.add_node(
            graph,
            Op::MatMul {},
            vec![Some(a), Some(w)],
            vec![Some((Some(out.into()), f32_ty(dims)))],
            Some(out.into()),
        );
        m.nodes[n].outputs[0].expect("result")
    }

    /// `y = MatMul(x [4, 64], W)` with W [64, 32] from a `Constant` node, and a second MatMul
    /// whose weight goes through `Gemm` (transB) from a `Constant` node.
    fn constant_model() -> Module {
        let (mut m, g) = module();
        let x = m.add_input(g, Some("x".into()), f32_ty(&[4, 64]));
        let w = constant(&mut m, g, f32_data("w", &[64, 32], 1), "w_out");
        let h = matmul(&mut m, g, x, w, "h", &[4, 32]);
        let w2 = constant(&mut m, g, f32_data("w2", &[16, 32], 2), "w2_out");
        let n = m.add_node(
            g,
            Op::Gemm {
                alpha: None,
                beta: None,
                trans_a: None,
                trans_b: Some(1),
            },
            vec![Some(h), Some(w2)],
            vec![Some((Some("y".into()), f32_ty(&[4, 16])))],
            Some("gemm".into()),
        );
        m.graphs[g].outputs = vec![m.nodes[n].outputs[0].expect("y")];
        m
    }

    /// `If(cond)`: then `MatMul(x, W initializer)`, else `MatMul(x, W' from a Constant node in
    /// the branch)`.
    fn if_model() -> Module {
        let (mut m, g) = module();
        let x = m.add_input(g, Some("x".into()), f32_ty(&[4, 64]));
        let cond = m.add_input(g, Some("cond".into()), Type::tensor(DType::Bool, vec![]));
        let then_g = m.add_graph("then", None);
        let else_g = m.add_graph("else", None);
        let w = m.add_const(f32_data("w_then", &[64, 32], 3));
        let t = matmul(&mut m, then_g, x, w, "t", &[4, 32]);
        m.graphs[then_g].outputs = vec![t];
        let w2 = constant(
            &mut m,
            else_g,
            f32_data("w_else", &[64, 32], 4),
            "w_else_out",
        );
        let e = matmul(&mut m, else_g, x, w2, "e", &[4, 32]);
        m.graphs[else_g].outputs = vec![e];
        let n = m.add_node(
            g,
            Op::If {
                then_branch: Some(then_g),
                else_branch: Some(else_g),
            },
            vec![Some(cond)],
            vec![Some((Some("y".into()), f32_ty(&[4, 32])))],
            None,
        );
        m.graphs[then_g].parent = Some(n);
        m.graphs[else_g].parent = Some(n);
        m.graphs[g].outputs = vec![m.nodes[n].outputs[0].expect("y")];
        m
    }

    /// `Loop` 3 times: `s = Tanh(MatMul(s, W))`, W [64, 64] an initializer.
    fn loop_model() -> Module {
        let (mut m, g) = module();
        let x = m.add_input(g, Some("x".into()), f32_ty(&[4, 64]));
        let trips = m.add_const(data(
            "trips",
            DType::I64,
            vec![],
            3i64.to_le_bytes().to_vec(),
        ));
        let go = m.add_const(data("go", DType::Bool, vec![], vec![1]));
        let body = m.add_graph("body", None);
        let _i = m.add_input(body, Some("i".into()), Type::tensor(DType::I64, vec![]));
        let c = m.add_input(body, Some("c".into()), Type::tensor(DType::Bool, vec![]));
        let s = m.add_input(body, Some("s".into()), f32_ty(&[4, 64]));
        let w = m.add_const(f32_data("w_loop", &[64, 64], 5));
        let p = matmul(&mut m, body, s, w, "p", &[4, 64]);
        let tn = m.add_node(
            body,
            Op::Tanh {},
            vec![Some(p)],
            vec![Some((Some("s_next".into()), f32_ty(&[4, 64])))],
            None,
        );
        let cn = m.add_node(
            body,
            Op::Identity {},
            vec![Some(c)],
            vec![Some((
                Some("c_next".into()),
                Type::tensor(DType::Bool, vec![]),
            ))],
            None,
        );
        m.graphs[body].outputs = vec![
            m.nodes[cn].outputs[0].expect("c"),
            m.nodes[tn].outputs[0].expect("s"),
        ];
        let n = m.add_node(
            g,
            Op::Loop { body: Some(body) },
            vec![Some(trips), Some(go), Some(x)],
            vec![Some((Some("y".into()), f32_ty(&[4, 64])))],
            None,
        );
        m.graphs[body].parent = Some(n);
        m.graphs[g].outputs = vec![m.nodes[n].outputs[0].expect("y")];
        m
    }

    fn count_all(m: &Module, op: &str) -> usize {
        m.entries
            .iter()
            .flat_map(|e| m.graph_tree(e.graph))
            .flat_map(|g| m.graphs[g].nodes().iter())
            .filter(|&&n| m.nodes[n].op.op_type() == op)
            .count()
    }

    fn quantize(m: &Module, dynamic: bool) -> (Module, mmq_passes::PassReport) {
        let g = m.entries[0].graph;
        let scheme = if dynamic {
            Int8Scheme::Dynamic
        } else {
            let acts = Int8Pass::activations(m, None);
            let samples = calibrate::random_samples(m, g, 4, 3).expect("drawable inputs");
            let ranges = calibrate::calibrate(m, g, &acts[0].1, samples, Observer::MinMax)
                .expect("calibration runs");
            Int8Scheme::Static {
                ranges,
                symmetric: false,
            }
        };
        let mut q = m.clone();
        // Every eligible node, so that the count does not depend on the cost model.
        let pass = Int8Pass::new(scheme).with_placement(Placement::All);
        let mut pm = PassManager::new(vec![Box::new(pass)]);
        pm.verify = true;
        let opts = PassOptions {
            target: TargetRef::ORT,
            explain: false,
        };
        let r = pm.run(&mut q, &opts).expect("int8 pass runs");
        let report = r.passes[0].report.clone();
        (q, report)
    }

    /// The first output of `m` in ONNX Runtime on `feeds` (through the exported model).
    fn ort(m: &Module, feeds: &[(&str, &Tensor)], tag: &str) -> Vec<f64> {
        let dir = scratch_dir(&format!("quant_int8_sources_{tag}"));
        let model = dir.join("model.onnx");
        let g = m.entries[0].graph;
        mmq_backend_ort::write_model(m, g, &model, &Default::default())
            .unwrap_or_else(|e| panic!("{tag}: export: {e}"));
        let inputs = dir.join("inputs.npz");
        mmq_kernels::io::write_npz(&inputs, feeds).expect("write inputs");
        let out = dir.join("out.npz");
        let run = oracle(&[
            OsStr::new("run"),
            model.as_os_str(),
            inputs.as_os_str(),
            OsStr::new("-o"),
            out.as_os_str(),
        ]);
        assert!(
            run.status.success(),
            "{tag}: ONNX Runtime cannot run {}: {}",
            model.display(),
            String::from_utf8_lossy(&run.stderr)
        );
        let outs = mmq_kernels::io::read_npz(&out).expect("outputs");
        let name = m.values[m.graphs[g].outputs[0]]
            .name
            .clone()
            .expect("named");
        outs.into_iter()
            .find(|(k, _)| *k == name)
            .expect("main output")
            .1
            .to_f64()
            .expect("float")
    }

    fn interp(m: &Module, feeds: &[(&str, &Tensor)]) -> Vec<f64> {
        let x: HashMap<String, RtValue> = feeds
            .iter()
            .map(|(k, t)| ((*k).to_owned(), RtValue::from((*t).clone())))
            .collect();
        let outs = Interpreter::new(m)
            .run(m.entries[0].graph, &x)
            .expect("runs");
        outs[0]
            .1
            .as_tensor()
            .expect("tensor")
            .to_f64()
            .expect("float")
    }

    /// Quantizes `m` both ways; every `MatMul` (and `Gemm`) must be quantized (`want` of them,
    /// `in_bodies` inside bodies) and ONNX Runtime's output must stay close to FP32.
    fn check(tag: &str, m: &Module, feeds: &[(&str, &Tensor)], want: usize, in_bodies: usize) {
        let reference = ort(m, feeds, &format!("{tag}_fp32"));
        let float = interp(m, feeds);
        assert!(
            cosine(&reference, &float) > 0.99999,
            "{tag}: FP32 disagrees"
        );
        for dynamic in [false, true] {
            let (q, report) = quantize(m, dynamic);
            let kind = if dynamic { "dynamic" } else { "static" };
            assert_eq!(
                report.counters.get("quantized-matmul"),
                Some(&want),
                "{tag} {kind}: {report:?}"
            );
            assert_eq!(
                report
                    .counters
                    .get("quantized-subgraph")
                    .copied()
                    .unwrap_or(0),
                in_bodies,
                "{tag} {kind}: {report:?}"
            );
            if in_bodies > 0 && !dynamic {
                assert!(
                    report
                        .notes
                        .iter()
                        .any(|n| n.contains("quantized dynamically")),
                    "{tag}: {:?}",
                    report.notes
                );
            }
            // Static MatMuls read a dequantized weight; dynamic ones are gone.
            for g in q.graph_tree(q.entries[0].graph) {
                for &n in q.graphs[g].nodes() {
                    let node = &q.nodes[n];
                    assert_ne!(node.op.op_type(), "Gemm", "{tag} {kind}");
                    if node.op.op_type() == "MatMul" {
                        assert!(!dynamic, "{tag}: float MatMul left");
                        let w = node.inputs[1].expect("weight");
                        let mmq_ir::ValueDef::Output { node: p, .. } = q.values[w].def else {
                            panic!("{tag} {kind}: MatMul weight not dequantized");
                        };
                        assert_eq!(q.nodes[p].op.op_type(), "DequantizeLinear", "{tag} {kind}");
                    }
                }
            }
            assert_eq!(
                count_all(&q, "Constant"),
                0,
                "{tag} {kind}: dead Constant kept"
            );
            let bodies_dynamic = count_all(&q, "MatMulInteger");
            assert!(bodies_dynamic >= in_bodies, "{tag} {kind}");
            let got = ort(&q, feeds, &format!("{tag}_{kind}"));
            let c = cosine(&reference, &got);
            eprintln!("{tag} {kind}: ONNX Runtime cosine vs FP32 {c:.6}");
            assert!(c >= 0.99, "{tag} {kind}: cosine {c}");
            let c = cosine(&float, &interp(&q, feeds));
            assert!(c >= 0.99, "{tag} {kind}: interpreter cosine {c}");
        }
    }

    fn x() -> Tensor {
        Tensor::from_f32(vec![4, 64], values(256, 9)).expect("tensor")
    }

    #[test]
    fn constant_node_weights_are_quantized_static_and_dynamic() {
        let x = x();
        check("constant", &constant_model(), &[("x", &x)], 2, 0);
    }

    #[test]
    fn if_branch_weights_are_quantized_dynamically() {
        let x = x();
        for (cond, tag) in [(true, "if_then"), (false, "if_else")] {
            let c = Tensor::new(DType::Bool, vec![], Data::Bool(vec![cond])).expect("tensor");
            check(tag, &if_model(), &[("x", &x), ("cond", &c)], 2, 2);
        }
    }

    /// Below opset 13 `DequantizeLinear` has no `axis`: static weights are quantized per tensor
    /// (scalar scale, no axis) and ONNX Runtime runs the result (its own `quantize_static`
    /// writes per-channel `axis` there, which ONNX Runtime rejects).
    #[test]
    fn opset_12_weights_are_quantized_per_tensor() {
        let x = x();
        let mut m = constant_model();
        m.entries[0].model.opsets = vec![(String::new(), 12)];
        check("opset12", &m, &[("x", &x)], 2, 0);
        let (q, report) = quantize(&m, false);
        assert!(
            report.notes.iter().any(|n| n.contains("per tensor")),
            "{report:?}"
        );
        let g = q.entries[0].graph;
        let mut weights = 0;
        for &n in q.graphs[g].nodes() {
            if let Op::DequantizeLinear { axis, .. } = &q.nodes[n].op {
                assert_eq!(*axis, None);
                let scale = q.nodes[n].inputs[1].expect("scale");
                assert_eq!(q.value_type(scale).shape().map(<[_]>::len), Some(0));
                weights += 1;
            }
        }
        assert!(weights >= 4, "{weights} DequantizeLinear");
    }

    #[test]
    fn loop_body_weights_are_quantized_dynamically() {
        let x = x();
        check("loop", &loop_model(), &[("x", &x)], 1, 1);
    }
}

// ---- Placement by the target's cost model ----

mod placement {
    use mmq_ir::{Module, Value, ValueDef};
    use mmq_passes::quant::calibrate::{self, Observer};
    use mmq_passes::quant::int8::{Int8Pass, Int8Scheme};
    use mmq_passes::quant::place::Placement;
    use mmq_passes::{PassManager, PassOptions, PassReport, TargetRef};

    use super::sources::{f32_data, f32_ty, matmul, module};

    /// Two independent products on one token: `big = x [1, 768] · W [768, 768]` and
    /// `small = z [1, 32] · V [32, 32]`.
    fn two_products() -> Module {
        let (mut m, g) = module();
        let x = m.add_input(g, Some("x".into()), f32_ty(&[1, 768]));
        let z = m.add_input(g, Some("z".into()), f32_ty(&[1, 32]));
        let w = m.add_const(f32_data("w", &[768, 768], 11));
        let v = m.add_const(f32_data("v", &[32, 32], 12));
        let big = matmul(&mut m, g, x, w, "big", &[1, 768]);
        let small = matmul(&mut m, g, z, v, "small", &[1, 32]);
        m.graphs[g].outputs = vec![big, small];
        m
    }

    fn run(m: &Module, dynamic: bool, placement: Placement) -> (Module, PassReport) {
        let g = m.entries[0].graph;
        let scheme = if dynamic {
            Int8Scheme::Dynamic
        } else {
            let acts = Int8Pass::activations(m, None);
            let samples = calibrate::random_samples(m, g, 4, 1).expect("samples");
            Int8Scheme::Static {
                ranges: calibrate::calibrate(m, g, &acts[0].1, samples, Observer::MinMax)
                    .expect("calibration"),
                symmetric: false,
            }
        };
        let mut q = m.clone();
        let mut pm = PassManager::new(vec![Box::new(
            Int8Pass::new(scheme).with_placement(placement),
        )]);
        pm.verify = true;
        let opts = PassOptions {
            target: TargetRef::ORT,
            explain: false,
        };
        let r = pm.run(&mut q, &opts).expect("int8 runs");
        (q, r.passes[0].report.clone())
    }

    /// The op types of the producers of output `i`'s producer's operands.
    fn operand_producers(m: &Module, i: usize) -> Vec<String> {
        let g = m.entries[0].graph;
        let producer = |v: Value| match m.values[v].def {
            ValueDef::Output { node, .. } => m.nodes[node].op.op_type().to_owned(),
            ValueDef::Const(_) => "const".into(),
            ValueDef::Input { .. } => "input".into(),
        };
        let ValueDef::Output { node, .. } = m.values[m.graphs[g].outputs[i]].def else {
            panic!("output {i} has no producer");
        };
        m.nodes[node]
            .inputs
            .iter()
            .flatten()
            .map(|&v| producer(v))
            .collect()
    }

    /// The 768×768 product is worth quantizing on one token (four times less weight to
    /// stream, integer multiply-accumulates); the 32×32 one is not (the quantization kernel
    /// costs more than the product): the cost model keeps the first integer and the second
    /// float, and `Placement::All` quantizes both.
    #[test]
    fn static_units_stay_integer_only_where_they_pay() {
        let m = two_products();
        let (q, r) = run(&m, false, Placement::Cost);
        assert_eq!(r.counters.get("placed-integer"), Some(&1), "{r:?}");
        assert_eq!(r.counters.get("placed-float"), Some(&1), "{r:?}");
        assert_eq!(
            operand_producers(&q, 0),
            ["DequantizeLinear", "DequantizeLinear"]
        );
        assert_eq!(operand_producers(&q, 1), ["input", "const"]);
        let (all, r) = run(&m, false, Placement::All);
        assert_eq!(r.counters.get("placed-integer"), None);
        assert_eq!(
            operand_producers(&all, 1),
            ["DequantizeLinear", "DequantizeLinear"]
        );
        // The float unit is the original product: bit-identical results.
        let g = m.entries[0].graph;
        let sample = calibrate::random_samples(&m, g, 1, 9)
            .expect("sample")
            .next()
            .expect("one")
            .expect("drawn");
        let a = mmq_kernels::Interpreter::new(&m)
            .run(g, &sample)
            .expect("runs");
        let b = mmq_kernels::Interpreter::new(&q)
            .run(g, &sample)
            .expect("runs");
        let t = |r: &mmq_kernels::RtValue| r.as_tensor().expect("tensor").to_f32().expect("f32");
        assert_eq!(t(&a[1].1), t(&b[1].1));
        let (x, y) = (t(&a[0].1), t(&b[0].1));
        let dot: f64 = x
            .iter()
            .zip(&y)
            .map(|(&p, &q)| f64::from(p) * f64::from(q))
            .sum();
        let nx: f64 = x
            .iter()
            .map(|&p| f64::from(p) * f64::from(p))
            .sum::<f64>()
            .sqrt();
        let ny: f64 = y
            .iter()
            .map(|&p| f64::from(p) * f64::from(p))
            .sum::<f64>()
            .sqrt();
        assert!(dot / (nx * ny) > 0.999, "cosine {}", dot / (nx * ny));
    }

    /// `x [seq, 64] · W [64, 256]` with `seq` symbolic: the cost model sizes the product from
    /// the calibration samples (one token guessed otherwise): integer when they hold 256
    /// tokens, float when they hold one.
    #[test]
    fn placement_sizes_symbolic_dims_from_the_calibration_samples() {
        let (mut m, g) = module();
        let seq = m.symbol("seq");
        let x = m.add_input(
            g,
            Some("x".into()),
            mmq_ir::Type::tensor(
                mmq_ir::DType::F32,
                vec![mmq_ir::Dim::sym(seq), mmq_ir::Dim::known(64)],
            ),
        );
        let w = m.add_const(f32_data("w", &[64, 256], 13));
        let n = m.add_node(
            g,
            mmq_ir::Op::MatMul {},
            vec![Some(x), Some(w)],
            vec![Some((
                Some("y".into()),
                mmq_ir::Type::tensor(
                    mmq_ir::DType::F32,
                    vec![mmq_ir::Dim::sym(seq), mmq_ir::Dim::known(256)],
                ),
            ))],
            Some("y".into()),
        );
        m.graphs[g].outputs = vec![m.nodes[n].outputs[0].expect("y")];
        let placed = |tokens: usize| {
            let sample = || {
                let v: Vec<f32> = (0..tokens * 64)
                    .map(|i| ((i % 17) as f32 - 8.0) / 8.0)
                    .collect();
                let t = mmq_kernels::Tensor::from_f32(vec![tokens, 64], v).expect("tensor");
                Ok(calibrate::Sample::from([(
                    "x".to_owned(),
                    mmq_kernels::RtValue::Tensor(std::sync::Arc::new(t)),
                )]))
            };
            let acts = Int8Pass::activations(&m, None);
            let ranges =
                calibrate::calibrate(&m, g, &acts[0].1, [sample(), sample()], Observer::MinMax)
                    .expect("calibration");
            assert_eq!(ranges.elements(x), Some(tokens * 64));
            let mut q = m.clone();
            let pass = Int8Pass::new(Int8Scheme::Static {
                ranges,
                symmetric: false,
            });
            let opts = PassOptions {
                target: TargetRef::ORT,
                explain: false,
            };
            let r = PassManager::new(vec![Box::new(pass)])
                .run(&mut q, &opts)
                .expect("int8 runs");
            r.passes[0]
                .report
                .counters
                .get("placed-integer")
                .copied()
                .unwrap_or(0)
        };
        assert_eq!(placed(256), 1);
        assert_eq!(placed(1), 0);
    }

    #[test]
    fn dynamic_units_stay_integer_only_where_they_pay() {
        let m = two_products();
        let (q, r) = run(&m, true, Placement::Cost);
        assert_eq!(r.counters.get("placed-integer"), Some(&1), "{r:?}");
        assert_eq!(r.counters.get("placed-float"), Some(&1), "{r:?}");
        assert_eq!(operand_producers(&q, 0), ["Cast", "Mul"]);
        assert_eq!(operand_producers(&q, 1), ["input", "const"]);
    }
}
