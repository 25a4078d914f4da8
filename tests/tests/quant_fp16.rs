//! FP16 weight storage end to end: the ViT fixture after the ONNX Runtime -O2 pipeline, its
//! weights converted to float16 + `Cast`. The interpreter's output stays within a cosine and a
//! relative-error bound of FP32, the exported weights take half the bytes, and ONNX Runtime runs
//! the result close to the stored FP32 reference. A node filter converts only what it selects;
//! out-of-range values saturate; `Constant` nodes in `If` bodies are converted too.

#![allow(
    clippy::print_stderr,
    reason = "the test reports the figures it measured"
)]

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::Path;

use mmq_ir::{ConstData, DType, Dim, Entry, ModelInfo, Module, Op, Storage, Type, ValueDef};
use mmq_kernels::{Interpreter, RtValue, Tensor};
use mmq_passes::quant::fp16::Fp16Pass;
use mmq_passes::{PassManager, PassOptions, PassReport, TargetRef};
use mmq_tests::{cosine, oracle, repo_root, scratch_dir};

fn opts() -> PassOptions {
    PassOptions {
        target: TargetRef::ORT,
        explain: false,
    }
}

fn load(name: &str) -> Module {
    mmq_tests::load_fixture_o2(name)
}

fn npz(path: &Path) -> HashMap<String, Tensor> {
    mmq_kernels::io::read_npz(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .into_iter()
        .collect()
}

fn run(m: &Module, feeds: &HashMap<String, RtValue>) -> Vec<f64> {
    let outs = Interpreter::new(m)
        .run(m.entries[0].graph, feeds)
        .expect("interpreter runs");
    outs[0]
        .1
        .as_tensor()
        .expect("tensor")
        .to_f64()
        .expect("float")
}

/// Largest absolute difference over the largest reference magnitude.
fn max_rel(got: &[f64], want: &[f64]) -> f64 {
    let scale = want.iter().fold(0f64, |a, x| a.max(x.abs()));
    let diff = got
        .iter()
        .zip(want)
        .fold(0f64, |a, (x, y)| a.max((x - y).abs()));
    diff / scale
}

fn fp16(m: &mut Module, pass: Fp16Pass) -> PassReport {
    let mut pm = PassManager::new(vec![Box::new(pass)]);
    pm.verify = true;
    let r = pm.run(m, &opts()).expect("fp16 pass runs");
    r.passes[0].report.clone()
}

/// Exports `m` and loads it back: the bytes of the weights a file really holds.
fn exported_weight_bytes(m: &Module, path: &Path) -> u64 {
    mmq_backend_ort::write_model(m, m.entries[0].graph, path, &Default::default())
        .unwrap_or_else(|e| panic!("export: {e}"));
    mmq_onnx::load_files(&[path], &mmq_onnx::LoadOptions::default())
        .unwrap_or_else(|e| panic!("reload {}: {e}", path.display()))
        .weight_bytes()
}

#[test]
fn vit_fp16_halves_weights_and_stays_close_in_the_interpreter_and_onnx_runtime() {
    let dir = repo_root().join("tests/fixtures/vit");
    let m = load("vit");
    let mut q = m.clone();
    let report = fp16(&mut q, Fp16Pass::new());
    let converted = report.counters.get("fp16-weights").copied().unwrap_or(0);
    assert!(converted > 10, "{report:?}");
    assert!(!report.counters.contains_key("fp16-saturated"));

    let feeds: HashMap<String, RtValue> = npz(&dir.join("inputs.npz"))
        .into_iter()
        .map(|(k, t)| (k, RtValue::from(t)))
        .collect();
    let (want, got) = (run(&m, &feeds), run(&q, &feeds));
    let (c, rel) = (cosine(&got, &want), max_rel(&got, &want));
    eprintln!("vit fp16: {converted} weights, interpreter cosine {c:.7}, max rel error {rel:.2e}");
    assert!(c >= 0.9999, "cosine {c}");
    assert!(rel <= 5e-3, "max relative error {rel}");

    let scratch = scratch_dir("quant_fp16_vit");
    let before = exported_weight_bytes(&m, &scratch.join("fp32.onnx"));
    let model = scratch.join("fp16.onnx");
    let after = exported_weight_bytes(&q, &model);
    let ratio = after as f64 / before as f64;
    eprintln!("vit fp16: weights {before} -> {after} bytes ({ratio:.3})");
    assert!((0.49..0.52).contains(&ratio), "{before} -> {after}");

    let out = scratch.join("ort.npz");
    let r = oracle(&[
        OsStr::new("run"),
        model.as_os_str(),
        dir.join("inputs.npz").as_os_str(),
        OsStr::new("-o"),
        out.as_os_str(),
    ]);
    assert!(
        r.status.success(),
        "ONNX Runtime cannot run {}: {}",
        model.display(),
        String::from_utf8_lossy(&r.stderr)
    );
    let g = m.entries[0].graph;
    let main = m.values[m.graphs[g].outputs[0]]
        .name
        .clone()
        .expect("named output");
    let reference = npz(&dir.join("outputs.npz"))[&main]
        .to_f64()
        .expect("float");
    let ort = npz(&out)[&main].to_f64().expect("float");
    let c = cosine(&ort, &reference);
    eprintln!("vit fp16: ONNX Runtime cosine vs FP32 reference {c:.7}");
    assert!(c >= 0.9999, "ONNX Runtime cosine {c}");
    assert!(
        cosine(&ort, &got) > 0.99999,
        "interpreter and ONNX Runtime disagree"
    );
}

/// The dtype of the constant behind operand `i` of `n`, seen through one `Cast`.
fn weight_dtype(m: &Module, n: mmq_ir::Node, i: usize) -> Option<DType> {
    let v = m.nodes[n].inputs.get(i).copied().flatten()?;
    match m.values[v].def {
        ValueDef::Const(c) => Some(m.consts[c].dtype),
        ValueDef::Output { node, .. } if matches!(m.nodes[node].op, Op::Cast { .. }) => {
            let src = m.nodes[node].inputs[0]?;
            match m.values[src].def {
                ValueDef::Const(c) => Some(m.consts[c].dtype),
                _ => None,
            }
        }
        _ => None,
    }
}

#[test]
fn a_filter_converts_only_the_weights_of_the_nodes_it_selects() {
    let mut m = load("vit");
    let g = m.entries[0].graph;
    let is_norm = |m: &Module, n: mmq_ir::Node| m.nodes[n].op.op_type() == "LayerNormalization";
    let norms: Vec<_> = m.graphs[g]
        .nodes()
        .iter()
        .copied()
        .filter(|&n| is_norm(&m, n))
        .collect();
    assert!(!norms.is_empty());
    // The float32 constants of 16 or more elements the norms read (gamma and beta; layers may
    // share them).
    let mut wanted: Vec<mmq_ir::Value> = Vec::new();
    for &n in &norms {
        for v in m.nodes[n].inputs.iter().skip(1).flatten() {
            if let ValueDef::Const(c) = m.values[*v].def
                && m.consts[c].dtype == DType::F32
                && m.consts[c].num_elements() >= 16
                && !wanted.contains(v)
            {
                wanted.push(*v);
            }
        }
    }
    assert!(!wanted.is_empty());

    let report = fp16(&mut m, Fp16Pass::new().with_filter(Box::new(is_norm)));
    assert_eq!(
        report.counters.get("fp16-weights"),
        Some(&wanted.len()),
        "{report:?}"
    );
    // Every norm reads float16 weights; another node reads one only where it shares it with a
    // norm.
    // (The pass manager may renumber nodes: find the norms again.)
    let norm_reads: Vec<mmq_ir::Value> = m.graphs[g]
        .nodes()
        .iter()
        .filter(|&&n| is_norm(&m, n))
        .flat_map(|&n| m.nodes[n].inputs.iter().skip(1).flatten().copied())
        .collect();
    let mut other = 0;
    for &n in m.graphs[g].nodes() {
        if matches!(m.nodes[n].op, Op::Cast { .. }) {
            continue;
        }
        for i in 1..m.nodes[n].inputs.len() {
            let Some(v) = m.nodes[n].inputs[i] else {
                continue;
            };
            match weight_dtype(&m, n, i) {
                Some(DType::F16) if !is_norm(&m, n) => {
                    assert!(norm_reads.contains(&v), "{}", m.nodes[n].op.op_type());
                }
                Some(DType::F32) if is_norm(&m, n) => {
                    panic!("a norm weight left in float32");
                }
                Some(DType::F32) => other += 1,
                _ => {}
            }
        }
    }
    // MatMul weights and biases stay float32.
    assert!(other > 10, "{other}");
}

#[test]
fn out_of_range_values_saturate_and_constant_nodes_in_bodies_convert() {
    // If(true) { Mul(x, W from a Constant node) } else { Mul(x, W2 initializer) }; both 16-wide.
    let mut m = Module::new();
    let g = m.add_graph("main", None);
    m.entries.push(Entry {
        graph: g,
        model: ModelInfo {
            opsets: vec![(String::new(), 17)],
            ..Default::default()
        },
    });
    let ty = Type::tensor(DType::F32, vec![Dim::known(16)]);
    let x = m.add_input(g, Some("x".into()), ty.clone());
    let cond = m.add_const(ConstData::new(
        Some("cond".into()),
        DType::Bool,
        vec![],
        Storage::Inline(vec![1u8].into()),
    ));
    let mut w: Vec<f32> = (0..16).map(|i| i as f32 * 0.1 + 0.05).collect();
    w[3] = 1e6;
    w[4] = -7e4;
    w[5] = 65519.0; // rounds to 65504: in range
    w[6] = f32::INFINITY;
    let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let then_g = m.add_graph("then", None);
    let else_g = m.add_graph("else", None);
    let wc = m.add_attr_const(ConstData::new(
        Some("w".into()),
        DType::F32,
        vec![16],
        Storage::Inline(bytes(&w).into()),
    ));
    let cn = m.add_node(
        then_g,
        Op::Constant {
            value: Some(wc),
            value_float: None,
            value_floats: None,
            value_int: None,
            value_ints: None,
            value_string: None,
            value_strings: None,
        },
        vec![],
        vec![Some((Some("w_out".into()), ty.clone()))],
        None,
    );
    let wv = m.nodes[cn].outputs[0];
    let t = m.add_node(
        then_g,
        Op::Mul {},
        vec![Some(x), wv],
        vec![Some((Some("t".into()), ty.clone()))],
        None,
    );
    m.graphs[then_g].outputs = vec![m.nodes[t].outputs[0].expect("t")];
    let w2 = m.add_const(ConstData::new(
        Some("w2".into()),
        DType::F32,
        vec![16],
        Storage::Inline(bytes(&[0.5; 16]).into()),
    ));
    let e = m.add_node(
        else_g,
        Op::Mul {},
        vec![Some(x), Some(w2)],
        vec![Some((Some("e".into()), ty.clone()))],
        None,
    );
    m.graphs[else_g].outputs = vec![m.nodes[e].outputs[0].expect("e")];
    let n = m.add_node(
        g,
        Op::If {
            then_branch: Some(then_g),
            else_branch: Some(else_g),
        },
        vec![Some(cond)],
        vec![Some((Some("y".into()), ty))],
        None,
    );
    m.graphs[then_g].parent = Some(n);
    m.graphs[else_g].parent = Some(n);
    m.graphs[g].outputs = vec![m.nodes[n].outputs[0].expect("y")];

    let report = fp16(&mut m, Fp16Pass::new());
    assert_eq!(report.counters.get("fp16-weights"), Some(&2), "{report:?}");
    assert_eq!(
        report.counters.get("fp16-saturated"),
        Some(&2),
        "{report:?}"
    );
    assert!(
        report
            .notes
            .iter()
            .any(|n| n.contains("2 values in 1 weights")),
        "{:?}",
        report.notes
    );
    // The Constant node holds float16 now and a Cast follows it in the branch.
    let ops: Vec<&str> = m.graphs[then_g]
        .nodes()
        .iter()
        .map(|&n| m.nodes[n].op.op_type())
        .collect();
    assert_eq!(ops, ["Constant", "Cast", "Mul"]);
    let feeds = HashMap::from([(
        "x".to_owned(),
        RtValue::from(Tensor::from_f32(vec![16], vec![1.0; 16]).expect("tensor")),
    )]);
    let y = run(&m, &feeds);
    assert_eq!(&y[3..7], &[65504.0, -65504.0, 65504.0, f64::INFINITY]);
    for i in (0..16).filter(|i| !(3..7).contains(i)) {
        assert!(
            (y[i] - f64::from(w[i])).abs() <= f64::from(w[i]) * 1e-3,
            "{i}: {}",
            y[i]
        );
    }
}
