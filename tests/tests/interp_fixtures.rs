//! Every committed fixture through the reference interpreter: each entry graph of the module
//! runs on the arrays of `inputs.npz` it names, and every output it produces must match the
//! array of the same name in `outputs.npz` (computed by ONNX Runtime) within
//! max |a - b| / (1 + |b|) <= 1e-4.

#![allow(clippy::print_stderr, reason = "the test reports what it compared")]

use std::collections::HashMap;

use mmq_kernels::io::read_npz;
use mmq_kernels::{Data, Interpreter, RtValue, Tensor};
use mmq_tests::{Fixture, fixtures};

const TOLERANCE: f64 = 1e-4;
/// The bound for the QAT cells of the export matrix: float rounding before a QuantizeLinear
/// may land on the other side of a rounding boundary, moving an output by one quantization
/// step (the largest logits step these cells use is below 1e-2).
const TOLERANCE_QAT: f64 = 1e-2;

/// The largest |a - b| / (1 + |b|), or an error for a dtype/shape/NaN mismatch.
fn relative_error(actual: &Tensor, expected: &Tensor) -> Result<f64, String> {
    if actual.dtype != expected.dtype || actual.shape != expected.shape {
        return Err(format!(
            "{}{:?} != expected {}{:?}",
            actual.dtype, actual.shape, expected.dtype, expected.shape
        ));
    }
    if let (Data::Str(a), Data::Str(b)) = (&actual.data, &expected.data) {
        return if a == b {
            Ok(0.0)
        } else {
            Err("strings differ".to_owned())
        };
    }
    let a = actual.to_f64().map_err(|e| e.to_string())?;
    let b = expected.to_f64().map_err(|e| e.to_string())?;
    let mut worst = 0.0f64;
    for (i, (&x, &y)) in a.iter().zip(&b).enumerate() {
        if x.is_nan() || y.is_nan() {
            if x.is_nan() != y.is_nan() {
                return Err(format!("element {i}: {x} != expected {y}"));
            }
            continue;
        }
        if x == y {
            continue;
        }
        let e = (x - y).abs() / (1.0 + y.abs());
        if e.is_nan() {
            return Err(format!("element {i}: {x} != expected {y}"));
        }
        worst = worst.max(e);
    }
    Ok(worst)
}

/// Runs every entry of the fixture's module; returns one line per problem.
fn check(fx: &Fixture, tolerance: f64) -> Vec<String> {
    let paths: Vec<&std::path::Path> = fx.models.iter().map(|p| p.as_path()).collect();
    let m = match mmq_onnx::load_files(&paths, &mmq_onnx::LoadOptions::default()) {
        Ok(m) => m,
        Err(e) => return vec![format!("import: {e}")],
    };
    let inputs: HashMap<String, Tensor> = match read_npz(&fx.dir.join("inputs.npz")) {
        Ok(v) => v.into_iter().collect(),
        Err(e) => return vec![e.to_string()],
    };
    let expected: HashMap<String, Tensor> = match read_npz(&fx.dir.join("outputs.npz")) {
        Ok(v) => v.into_iter().collect(),
        Err(e) => return vec![e.to_string()],
    };
    let mut problems = Vec::new();
    let mut compared = 0usize;
    let interp = Interpreter::new(&m);
    for entry in &m.entries {
        let g = &m.graphs[entry.graph];
        let label = format!("graph '{}'", g.name);
        let mut feeds = HashMap::new();
        for &v in &g.inputs {
            let name = m.values[v].name.clone().unwrap_or_default();
            if let Some(t) = inputs.get(&name) {
                feeds.insert(name, RtValue::from(t.clone()));
            }
        }
        let start = std::time::Instant::now();
        let outs = match interp.run(entry.graph, &feeds) {
            Ok(o) => o,
            Err(e) => {
                problems.push(format!("{label}: {e}"));
                continue;
            }
        };
        let elapsed = start.elapsed();
        for (name, value) in &outs {
            let Some(want) = expected.get(name) else {
                continue;
            };
            compared += 1;
            let Some(got) = value.as_tensor() else {
                problems.push(format!("{label}: output {name} is not a tensor"));
                continue;
            };
            match relative_error(got, want) {
                Ok(e) if e <= tolerance => {}
                Ok(e) => problems.push(format!(
                    "{label}: output {name}: max |a-b|/(1+|b|) = {e:.3e} > {tolerance:e}"
                )),
                Err(msg) => problems.push(format!("{label}: output {name}: {msg}")),
            }
        }
        eprintln!(
            "{}: {label} ran in {:.1} ms",
            fx.name,
            elapsed.as_secs_f64() * 1e3
        );
    }
    if compared < expected.len() && problems.is_empty() {
        let produced: Vec<String> = m
            .entries
            .iter()
            .flat_map(|e| m.graphs[e.graph].outputs.iter())
            .filter_map(|&v| m.values[v].name.clone())
            .collect();
        let mut missing: Vec<&String> = expected.keys().filter(|k| !produced.contains(k)).collect();
        missing.sort();
        problems.push(format!("expected outputs never produced: {missing:?}"));
    }
    problems
}

fn run_fixture(name: &str) {
    let all = fixtures();
    let fx = all
        .iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("no fixture {name}"));
    let problems = check(fx, TOLERANCE);
    assert!(
        problems.is_empty(),
        "fixture {name} through the interpreter:\n  {}",
        problems.join("\n  ")
    );
}

macro_rules! fixture_tests {
    ($($name:ident),* $(,)?) => {
        $(#[test] fn $name() { run_fixture(stringify!($name)); })*

        #[test]
        fn every_fixture_has_a_test() {
            let known = [$(stringify!($name)),*];
            for f in fixtures() {
                assert!(known.contains(&f.name.as_str()), "add fixture {} to fixture_tests!", f.name);
            }
        }
    };
}

fixture_tests!(
    clip,
    gpt2_kv,
    llama_gqa_kv,
    mistral_sw_kv,
    llava,
    pipeline,
    prequant,
    qat_cnn,
    vit,
    vit_dynamic
);

/// Every export-matrix cell (other exporters, opsets, attention implementations, QAT, paddle
/// dims, weights in subgraphs) through the interpreter against ONNX Runtime's outputs; the QAT
/// cells within [`TOLERANCE_QAT`].
#[test]
fn export_matrix() {
    use rayon::prelude::*;
    let problems: Vec<String> = mmq_tests::matrix_fixtures()
        .par_iter()
        .flat_map(|fx| {
            let tol = if fx.name.contains("qat_") {
                TOLERANCE_QAT
            } else {
                TOLERANCE
            };
            check(fx, tol)
                .into_iter()
                .map(|p| format!("{}: {p}", fx.name))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
