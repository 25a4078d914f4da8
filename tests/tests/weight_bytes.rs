//! No pipeline makes the weights grow: the bytes of the constants a module reads, before and
//! after every pipeline (`-O1`, `-O2` for ONNX Runtime and TensorRT, INT8 dynamic, INT4; INT8
//! static and FP8 on the committed fixtures), on every fixture and export-matrix cell. Weights a
//! model already stores quantized (`tests/fixtures/prequant`: `Cast` of int8 codes times a
//! scale, weight-only `DequantizeLinear`) stay codes: `-O2` once folded them into f32 copies of
//! 4x the bytes. FP16 (which widens on purpose, through a `Cast` the runtime folds at load) is
//! not among the pipelines.

use std::collections::HashSet;

use mmq_compiler::{Accuracy, CalibrationSource, CompileOptions, Precision, Scheme, compile};
use mmq_ir::{Module, Op, ValueDef};
use mmq_passes::{OptLevel, TargetRef};
use mmq_tests::{Fixture, fixtures, matrix_fixtures};
use rayon::prelude::*;

/// Bytes of the constants read by a node of any graph or given as a graph output, and of the
/// tensors of `Constant` nodes.
fn live_weight_bytes(m: &Module) -> u64 {
    let mut read = HashSet::new();
    let mut consts: HashSet<mmq_ir::Const> = HashSet::new();
    for (_, g) in m.graphs.iter() {
        read.extend(g.outputs.iter().copied());
        for &n in g.nodes() {
            read.extend(m.nodes[n].inputs.iter().flatten().copied());
            if let Op::Constant { value: Some(c), .. } = &m.nodes[n].op {
                consts.insert(*c);
            }
        }
    }
    consts.extend(read.iter().filter_map(|&v| match m.values[v].def {
        ValueDef::Const(c) => Some(c),
        _ => None,
    }));
    consts.iter().map(|&c| m.consts[c].byte_len()).sum()
}

fn load(f: &Fixture) -> Module {
    mmq_compiler::load::load(&f.models)
        .and_then(|l| l.verified())
        .unwrap_or_else(|e| panic!("{}: {}", f.name, e.rendered))
        .0
}

/// The pipelines as (label, options).
fn pipelines(with_calibration: bool) -> Vec<(&'static str, CompileOptions)> {
    let base = || CompileOptions {
        accuracy: Accuracy::Off,
        calibration: CalibrationSource::Random { count: 2, seed: 0 },
        ..CompileOptions::default()
    };
    let scheme = |s| CompileOptions {
        precision: Precision::of(s),
        ..base()
    };
    let mut out = vec![
        (
            "-O1",
            CompileOptions {
                level: OptLevel::O1,
                ..base()
            },
        ),
        ("-O2 ort", base()),
        (
            "-O2 trt",
            CompileOptions {
                target: TargetRef::by_name("trt").expect("trt"),
                ..base()
            },
        ),
        ("int8-dynamic", scheme(Scheme::Int8Dynamic)),
        ("int4", scheme(Scheme::Int4)),
    ];
    if with_calibration {
        out.push(("int8", scheme(Scheme::Int8)));
        out.push(("fp8", scheme(Scheme::Fp8)));
    }
    out
}

/// Each pipeline's bytes against the source's: a failure line per growth past 1 % + 2 KiB (new
/// scales and zero points).
fn check(f: &Fixture, with_calibration: bool) -> Vec<String> {
    let before = live_weight_bytes(&load(f));
    let mut bad = Vec::new();
    for (label, options) in pipelines(with_calibration) {
        let mut m = load(f);
        if let Err(e) = compile(&mut m, &options) {
            // A pipeline a model does not fit (fp8 below opset 19, calibration of a module of
            // several models) says so; that is not growth.
            let text = e.to_string();
            if !e.is_usage() && !text.contains("opset") && !text.contains("one model at a time") {
                bad.push(format!("{} {label}: {e}", f.name));
            }
            continue;
        }
        let after = live_weight_bytes(&m);
        if after > before + before / 100 + 2048 {
            bad.push(format!("{} {label}: {before} -> {after} bytes", f.name));
        }
    }
    bad
}

#[test]
fn no_pipeline_makes_the_weights_grow() {
    let mut bad: Vec<String> = fixtures().par_iter().flat_map(|f| check(f, true)).collect();
    bad.extend(
        matrix_fixtures()
            .par_iter()
            .flat_map(|f| check(f, false))
            .collect::<Vec<_>>(),
    );
    assert!(bad.is_empty(), "weights grew:\n{}", bad.join("\n"));
}

/// The pre-quantized fixture keeps its codes: every weight stays an 8-bit constant read by a
/// `DequantizeLinear` at `-O2`.
#[test]
fn prequantized_weights_stay_codes() {
    let f = fixtures()
        .into_iter()
        .find(|f| f.name == "prequant")
        .expect("fixture prequant");
    let mut m = load(&f);
    compile(&mut m, &CompileOptions::default()).expect("compiles");
    let g = m.entries[0].graph;
    let dq = m.graphs[g]
        .nodes()
        .iter()
        .filter(|&&n| matches!(m.nodes[n].op, mmq_ir::Op::DequantizeLinear { .. }))
        .count();
    assert_eq!(dq, 4, "{}", mmq_ir::text::print(&m));
    let float_bytes: u64 = m
        .consts
        .iter()
        .filter(|(_, c)| c.dtype == mmq_ir::DType::F32)
        .map(|(_, c)| c.byte_len())
        .sum();
    assert!(float_bytes < 2048, "f32 weights of {float_bytes} bytes");
}
