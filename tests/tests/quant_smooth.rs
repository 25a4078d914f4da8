//! SmoothQuant and AWQ through the interpreter: scale migration keeps the float function
//! (folded into a norm for a Q/K/V trio, a `Mul` where folding is not allowed, the ViT
//! fixture), SmoothQuant raises INT8 static accuracy and AWQ lowers INT4 error on models with
//! activation outlier channels.

#![allow(
    clippy::print_stderr,
    reason = "the tests report the accuracies they measured"
)]

use std::path::Path;

use mmq_ir::{ConstData, DType, Dim, Entry, GraphId, ModelInfo, Module, Op, Storage, Type, Value};
use mmq_kernels::{Interpreter, RtValue};
use mmq_passes::quant::awq::{self, AwqPass};
use mmq_passes::quant::calibrate::{self, Observer, Sample};
use mmq_passes::quant::int8::{Int8Pass, Int8Scheme};
use mmq_passes::quant::place::Placement;
use mmq_passes::quant::smooth::{self, SmoothQuantPass};
use mmq_passes::quant::weight_only::{WeightOnlyConfig, WeightOnlyPass};
use mmq_passes::{Pass, PassManager, PassOptions, PassReport};
use mmq_tests::{cosine, repo_root};

/// Hidden size of the built models.
const D: i64 = 64;
/// Tokens per sample.
const T: i64 = 16;
/// Outlier channels of the built models and their magnitude factor.
const OUTLIERS: [usize; 3] = [3, 17, 40];
const FACTOR: f32 = 50.0;

/// Deterministic values in [-1, 1).
fn noise(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn f32_ty(shape: &[i64]) -> Type {
    Type::tensor(DType::F32, shape.iter().map(|&d| Dim::known(d)).collect())
}

fn konst(m: &mut Module, name: &str, shape: &[i64], v: &[f32]) -> Value {
    m.add_const(ConstData::new(
        Some(name.to_owned()),
        DType::F32,
        shape.to_vec(),
        Storage::Inline(
            v.iter()
                .flat_map(|x| x.to_le_bytes())
                .collect::<Vec<u8>>()
                .into(),
        ),
    ))
}

fn module() -> (Module, GraphId) {
    let mut m = Module::new();
    let g = m.add_graph("g", None);
    m.entries.push(Entry {
        graph: g,
        model: ModelInfo {
            ir_version: 10,
            opsets: vec![(String::new(), 20), ("com.microsoft".to_owned(), 1)],
            ..ModelInfo::default()
        },
    });
    (m, g)
}

fn node(m: &mut Module, g: GraphId, op: Op, inputs: &[Value], out: &str, shape: &[i64]) -> Value {
    let n = m.add_node(
        g,
        op,
        inputs.iter().map(|&v| Some(v)).collect(),
        vec![Some((Some(out.to_owned()), f32_ty(shape)))],
        Some(out.to_owned()),
    );
    m.nodes[n].outputs[0].expect("one result")
}

fn layer_norm(m: &mut Module, g: GraphId, x: Value, gamma: Value, beta: Value, out: &str) -> Value {
    node(
        m,
        g,
        Op::LayerNormalization {
            axis: Some(-1),
            epsilon: Some(1e-5),
            stash_type: None,
        },
        &[x, gamma, beta],
        out,
        &[1, T, D],
    )
}

/// A gamma with outlier channels `FACTOR` times larger.
fn outlier_gamma() -> Vec<f32> {
    (0..D as usize)
        .map(|j| {
            let base = 0.8 + 0.2 * noise(1, j as u64)[0];
            if OUTLIERS.contains(&j) {
                base * FACTOR
            } else {
                base
            }
        })
        .collect()
}

/// A `[D, n]` weight whose outlier rows are `FACTOR` times smaller (so every channel matters
/// to the output, as in trained models).
fn weight(n: usize, seed: u64) -> Vec<f32> {
    let mut w = noise(D as usize * n, seed);
    for &j in &OUTLIERS {
        for v in &mut w[j * n..(j + 1) * n] {
            *v /= FACTOR;
        }
    }
    w
}

/// `x [1, T, D] → LayerNorm (outlier gamma) → Q, K, V MatMuls [D, D]`, plus a second norm that
/// shares the first one's gamma and feeds an output directly.
fn trio_model() -> (Module, GraphId) {
    let (mut m, g) = module();
    let x = m.add_input(g, Some("x".into()), f32_ty(&[1, T, D]));
    let gamma = konst(&mut m, "gamma", &[D], &outlier_gamma());
    let beta = konst(&mut m, "beta", &[D], &noise(D as usize, 99));
    let h = layer_norm(&mut m, g, x, gamma, beta, "h");
    let mut outs = Vec::new();
    for (i, name) in ["q", "k", "v"].iter().enumerate() {
        let w = konst(
            &mut m,
            &format!("w_{name}"),
            &[D, D],
            &weight(D as usize, i as u64),
        );
        outs.push(node(&mut m, g, Op::MatMul {}, &[h, w], name, &[1, T, D]));
    }
    let other = layer_norm(&mut m, g, x, gamma, beta, "other");
    outs.push(other);
    m.graphs[g].outputs = outs;
    (m, g)
}

/// Products that cannot fold: one on a graph input, one on a norm output that an `Add` also
/// reads, and a `Gemm` with `transB` and a bias on a 2-d input.
fn mul_model() -> (Module, GraphId) {
    let (mut m, g) = module();
    let x = m.add_input(g, Some("x".into()), f32_ty(&[1, T, D]));
    let x2 = m.add_input(g, Some("x2".into()), f32_ty(&[T, D]));
    let w1 = konst(&mut m, "w1", &[D, 32], &weight(32, 1));
    let a = node(&mut m, g, Op::MatMul {}, &[x, w1], "a", &[1, T, 32]);
    let gamma = konst(&mut m, "gamma", &[D], &outlier_gamma());
    let beta = konst(&mut m, "beta", &[D], &noise(D as usize, 5));
    let h = layer_norm(&mut m, g, x, gamma, beta, "h");
    let w2 = konst(&mut m, "w2", &[D, 32], &weight(32, 2));
    let b = node(&mut m, g, Op::MatMul {}, &[h, w2], "b", &[1, T, 32]);
    let hh = node(&mut m, g, Op::Add {}, &[h, h], "hh", &[1, T, D]);
    let mut wt = noise(24 * D as usize, 3);
    for row in wt.chunks_exact_mut(D as usize) {
        for &j in &OUTLIERS {
            row[j] /= FACTOR;
        }
    }
    let w3 = konst(&mut m, "w3", &[24, D], &wt);
    let c3 = konst(&mut m, "c3", &[24], &noise(24, 4));
    let c = node(
        &mut m,
        g,
        Op::Gemm {
            alpha: None,
            beta: None,
            trans_a: None,
            trans_b: Some(1),
        },
        &[x2, w3, c3],
        "c",
        &[T, 24],
    );
    m.graphs[g].outputs = vec![a, b, hh, c];
    (m, g)
}

fn samples(m: &Module, g: GraphId, n: usize, seed: u64) -> Vec<Sample> {
    calibrate::random_samples(m, g, n, seed)
        .expect("drawable inputs")
        .collect::<Result<_, _>>()
        .expect("samples")
}

fn outputs(m: &Module, g: GraphId, x: &Sample) -> Vec<Vec<f64>> {
    Interpreter::new(m)
        .run(g, x)
        .expect("interpreter runs")
        .into_iter()
        .map(|(_, v)| v.as_tensor().expect("tensor").to_f64().expect("float"))
        .collect()
}

/// Largest |a - b| over the largest |b|, over every output.
fn rel_diff(a: &[Vec<f64>], b: &[Vec<f64>]) -> f64 {
    assert_eq!(a.len(), b.len());
    let mut worst: f64 = 0.0;
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.len(), y.len());
        let scale = y.iter().fold(0f64, |s, v| s.max(v.abs())).max(1e-30);
        let d = x.iter().zip(y).fold(0f64, |s, (p, q)| s.max((p - q).abs()));
        worst = worst.max(d / scale);
    }
    worst
}

fn op_count(m: &Module, g: GraphId, op: &str) -> usize {
    m.graphs[g]
        .nodes()
        .iter()
        .filter(|&&n| m.nodes[n].op.op_type() == op)
        .count()
}

fn counter(r: &PassReport, name: &str) -> usize {
    r.counters.get(name).copied().unwrap_or(0)
}

/// Runs SmoothQuant with statistics from `n` random samples; returns the report.
fn smooth_with(m: &mut Module, g: GraphId, alpha: f32, n: usize) -> PassReport {
    let sites = smooth::sites(m);
    let acts: Vec<Value> = sites.iter().map(|s| s.x).collect();
    let stats = calibrate::channel_stats(m, g, &acts, samples(m, g, n, 11).into_iter().map(Ok), 0)
        .expect("stats");
    let mut pm = PassManager::new(vec![Box::new(SmoothQuantPass::new(alpha, stats))]);
    pm.verify = true;
    let mut r = pm
        .run(m, &PassOptions::default())
        .expect("smoothquant runs");
    r.passes.remove(0).report
}

#[test]
fn smoothing_a_norm_fed_trio_folds_into_the_norm_and_keeps_the_function() {
    let (m, g) = trio_model();
    let mut s = m.clone();
    let r = smooth_with(&mut s, g, 0.5, 4);
    assert_eq!(counter(&r, "smoothed-matmuls"), 3, "{r:?}");
    assert_eq!(counter(&r, "folded-into-norm"), 1, "{r:?}");
    assert_eq!(counter(&r, "mul-inserted"), 0, "{r:?}");
    assert_eq!(op_count(&s, g, "Mul"), 0);
    // The shared gamma was copied: the other norm still reads the original constant.
    let norms: Vec<_> = s.graphs[g]
        .nodes()
        .iter()
        .filter(|&&n| s.nodes[n].op.op_type() == "LayerNormalization")
        .map(|&n| s.nodes[n].inputs[1])
        .collect();
    assert_eq!(norms.len(), 2);
    assert_ne!(
        norms[0], norms[1],
        "the folded norm must not share its gamma"
    );
    for x in samples(&m, g, 3, 42) {
        let d = rel_diff(&outputs(&s, g, &x), &outputs(&m, g, &x));
        assert!(d <= 1e-5, "smoothing changed the function: {d}");
    }
    // And the scales did something: the weights changed.
    let w = |m: &Module, name: &str| {
        let n = m.graphs[g]
            .nodes()
            .iter()
            .find(|&&n| m.nodes[n].name.as_deref() == Some(name))
            .copied()
            .expect("node");
        m.nodes[n].inputs[1]
    };
    assert_ne!(w(&s, "q"), w(&m, "q"));
}

#[test]
fn smoothing_inserts_a_mul_where_folding_is_not_allowed() {
    let (m, g) = mul_model();
    let mut s = m.clone();
    let r = smooth_with(&mut s, g, 0.5, 4);
    assert_eq!(counter(&r, "smoothed-matmuls"), 3, "{r:?}");
    assert_eq!(counter(&r, "folded-into-norm"), 0, "{r:?}");
    assert_eq!(counter(&r, "mul-inserted"), 3, "{r:?}");
    assert_eq!(op_count(&s, g, "Mul"), 3);
    for x in samples(&m, g, 3, 43) {
        let d = rel_diff(&outputs(&s, g, &x), &outputs(&m, g, &x));
        assert!(d <= 1e-5, "smoothing changed the function: {d}");
    }
}

fn load(name: &str) -> Module {
    mmq_tests::load_fixture_o2(name)
}

fn fixture_inputs(name: &str) -> Sample {
    let path = repo_root().join(format!("tests/fixtures/{name}/inputs.npz"));
    mmq_kernels::io::read_npz(Path::new(&path))
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .into_iter()
        .map(|(k, t)| (k, RtValue::from(t)))
        .collect()
}

#[test]
fn smoothing_the_vit_fixture_keeps_its_function() {
    let m = load("vit");
    let g = m.entries[0].graph;
    let mut s = m.clone();
    let r = smooth_with(&mut s, g, 0.5, 2);
    let smoothed = counter(&r, "smoothed-matmuls");
    eprintln!("vit: {:?}", r.counters);
    assert!(smoothed >= 12, "{r:?}");
    assert!(counter(&r, "folded-into-norm") >= 4, "{r:?}");
    let x = fixture_inputs("vit");
    let d = rel_diff(&outputs(&s, g, &x), &outputs(&m, g, &x));
    assert!(d <= 1e-5, "smoothing changed the function: {d}");
}

/// `x → LayerNorm (outlier gamma) → MatMul [D, D] → y`: activations with outlier channels.
fn outlier_model() -> (Module, GraphId) {
    let (mut m, g) = module();
    let x = m.add_input(g, Some("x".into()), f32_ty(&[1, T, D]));
    let gamma = konst(&mut m, "gamma", &[D], &outlier_gamma());
    let beta = konst(&mut m, "beta", &[D], &vec![0.0; D as usize]);
    let h = layer_norm(&mut m, g, x, gamma, beta, "h");
    let w = konst(&mut m, "w", &[D, D], &weight(D as usize, 21));
    let y = node(&mut m, g, Op::MatMul {}, &[h, w], "y", &[1, T, D]);
    m.graphs[g].outputs = vec![y];
    (m, g)
}

/// Mean cosine of the first output of `q` against `m` over held-out samples.
fn mean_cosine(m: &Module, q: &Module, g: GraphId) -> f64 {
    let xs = samples(m, g, 4, 1234);
    xs.iter()
        .map(|x| cosine(&outputs(q, g, x)[0], &outputs(m, g, x)[0]))
        .sum::<f64>()
        / xs.len() as f64
}

/// Squared error of the first output of `q` against `m` over held-out samples.
fn squared_error(m: &Module, q: &Module, g: GraphId) -> f64 {
    samples(m, g, 4, 4321)
        .iter()
        .map(|x| {
            let (a, b) = (&outputs(q, g, x)[0], &outputs(m, g, x)[0]);
            a.iter().zip(b).map(|(p, r)| (p - r) * (p - r)).sum::<f64>()
        })
        .sum()
}

fn int8_static(m: &mut Module, g: GraphId) {
    let acts = Int8Pass::activations(m, None);
    let ranges = calibrate::calibrate(
        m,
        g,
        &acts[0].1,
        samples(m, g, 4, 11).into_iter().map(Ok),
        Observer::MinMax,
    )
    .expect("calibration runs");
    // Every unit integer: the accuracy, not the speed, is under test.
    let r = Int8Pass::new(Int8Scheme::Static {
        ranges,
        symmetric: false,
    })
    .with_placement(Placement::All)
    .run(m, &PassOptions::default())
    .expect("int8 runs");
    assert!(r.changed, "{r:?}");
}

#[test]
fn smoothquant_raises_int8_static_cosine_on_outlier_channels() {
    let (m, g) = outlier_model();
    let mut plain = m.clone();
    int8_static(&mut plain, g);
    let mut smoothed = m.clone();
    let r = smooth_with(&mut smoothed, g, 0.5, 4);
    assert_eq!(counter(&r, "folded-into-norm"), 1, "{r:?}");
    int8_static(&mut smoothed, g);
    assert!(op_count(&smoothed, g, "QuantizeLinear") > 0);
    let (c_plain, c_smooth) = (mean_cosine(&m, &plain, g), mean_cosine(&m, &smoothed, g));
    eprintln!("int8 static: cosine {c_plain:.6} plain, {c_smooth:.6} with smoothquant 0.5");
    assert!(
        1.0 - c_smooth < 0.5 * (1.0 - c_plain),
        "smoothquant did not help enough: {c_smooth} vs {c_plain}"
    );
}

#[test]
fn awq_lowers_int4_error_on_outlier_channels() {
    let (m, g) = outlier_model();
    let config = WeightOnlyConfig::default();
    let mut plain = m.clone();
    WeightOnlyPass::new(config.clone())
        .run(&mut plain, &PassOptions::default())
        .expect("int4 runs");
    assert_eq!(op_count(&plain, g, "MatMulNBits"), 1);

    let mut scaled = m.clone();
    let sites = awq::sites(&scaled);
    assert_eq!(sites.len(), 1);
    let acts: Vec<Value> = sites.iter().map(|s| s.x).collect();
    let stats = calibrate::channel_stats(
        &scaled,
        g,
        &acts,
        samples(&m, g, 4, 11).into_iter().map(Ok),
        awq::MAX_ROWS,
    )
    .expect("stats");
    assert_eq!(
        stats[&acts[0]].sampled_rows(),
        awq::MAX_ROWS.min(4 * T as usize)
    );
    let mut pm = PassManager::new(vec![
        Box::new(AwqPass::new(config.clone(), stats)),
        Box::new(WeightOnlyPass::new(config)),
    ]);
    pm.verify = true;
    let r = pm
        .run(&mut scaled, &PassOptions::default())
        .expect("awq and int4 run");
    let awq_report = &r.passes[0].report;
    assert_eq!(counter(awq_report, "awq-matmuls"), 1, "{awq_report:?}");
    assert_eq!(counter(awq_report, "folded-into-norm"), 1, "{awq_report:?}");
    assert_eq!(op_count(&scaled, g, "MatMulNBits"), 1);
    let (e_plain, e_awq) = (squared_error(&m, &plain, g), squared_error(&m, &scaled, g));
    let (c_plain, c_awq) = (mean_cosine(&m, &plain, g), mean_cosine(&m, &scaled, g));
    eprintln!(
        "int4: error {e_plain:.4e} plain, {e_awq:.4e} with awq ({:?}); cosine {c_plain:.6} / {c_awq:.6}",
        awq_report.notes
    );
    assert!(
        e_awq < 0.7 * e_plain,
        "awq did not lower the error: {e_awq} vs {e_plain}"
    );
    assert!(c_awq > c_plain);
}

#[test]
fn channel_stats_stream_maxima_means_and_a_bounded_row_sample() {
    let mut obs = calibrate::ChannelObserver::new(3, 0);
    obs.observe(&[1.0, -2.0, 3.0, 4.0], 2).expect("rows of 2");
    obs.observe(&[-5.0, 0.5, f32::NAN, 1.0], 2)
        .expect("rows of 2");
    assert!(
        obs.observe(&[1.0, 2.0, 3.0], 3).is_err(),
        "channel count changed"
    );
    let st = obs.finish();
    assert_eq!(st.channels, 2);
    assert_eq!(st.rows, 4);
    assert_eq!(st.abs_max, vec![5.0, 4.0]);
    assert_eq!(st.abs_mean(), vec![9.0 / 4.0, 7.5 / 4.0]);
    assert_eq!(st.sampled_rows(), 3);
    assert!(st.row_sample.iter().all(|v| v.is_finite()));
}
