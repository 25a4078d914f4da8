//! Interpreter time (one thread) against ONNX Runtime (1 and 2 threads) on every fixture, in
//! one run: `cargo bench -p mmq-tests --bench interp [-- RUNS]`. Prints medians and ratios.
//!
//! With `MMQ_REAL_MODELS=DIR` (a directory written by `tools/real_models.py`: real-weight models
//! shipped in PyPI packages, with held-back samples) those models are timed too, on their first
//! held-back sample; the row `<name> e2e` adds loading the model to the run (a fresh
//! interpreter, constants decoded) against an ONNX Runtime session created and run once.

#![allow(clippy::print_stdout, reason = "a benchmark reports on stdout")]

use std::collections::HashMap;
use std::process::Command;
use std::time::Instant;

use mmq_kernels::{Interpreter, RtValue};
use mmq_tests::{fixtures, python, repo_root};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let runs: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10);
    // The interpreter's kernels use rayon; compare like with like at one thread.
    rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build_global()
        .expect("configure rayon");
    println!(
        "{:<16} {:<20} {:>10} {:>10} {:>10} {:>8} {:>8}",
        "fixture", "model", "mmq 1t", "ort 1t", "ort 2t", "x 1t", "x 2t"
    );
    let mut ratios = Vec::new();
    for f in fixtures() {
        for model in &f.models {
            let r = bench_model(&f.name, model, &f.dir.join("inputs.npz"), runs);
            ratios.push(r);
        }
    }
    // Single ops at a MiniLM-L6 MLP's size (batch 4): the elementwise math alone.
    let ops = repo_root().join("target/bench-ops");
    let made = Command::new(python())
        .arg(repo_root().join("tools/gen_op_bench.py"))
        .arg(&ops)
        .status()
        .expect("gen_op_bench");
    assert!(made.success(), "tools/gen_op_bench.py failed");
    for op in ["gelu", "erf"] {
        let dir = ops.join(op);
        bench_model(op, &dir.join("model.onnx"), &dir.join("inputs.npz"), runs);
    }
    println!(
        "median interpreter / onnxruntime (1 thread): {:.2}x",
        median(ratios)
    );
    if let Some(dir) = std::env::var_os("MMQ_REAL_MODELS") {
        real_models(std::path::Path::new(&dir), runs);
    }
}

/// Times every model listed in `dir/models.json` on `dir/NAME/held/0000.npz`.
fn real_models(dir: &std::path::Path, runs: usize) {
    let list: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("models.json")).expect("read models.json"))
            .expect("parse models.json");
    let mut ratios = Vec::new();
    for (name, rec) in list.as_object().expect("models.json is an object") {
        let model = std::path::PathBuf::from(rec["model"].as_str().expect("model path"));
        let sample = dir.join(name).join("held/0000.npz");
        ratios.push(bench_model(name, &model, &sample, runs));
        end_to_end(name, &model, &sample, runs);
    }
    println!(
        "median interpreter / onnxruntime on the real models (1 thread): {:.2}x",
        median(ratios)
    );
}

/// Load + one run, mmq (one thread, in process) against ONNX Runtime (session + one run).
fn end_to_end(name: &str, model: &std::path::Path, inputs: &std::path::Path, runs: usize) {
    let all: HashMap<String, mmq_kernels::Tensor> = mmq_kernels::io::read_npz(inputs)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .into_iter()
        .collect();
    let times: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            let m = mmq_onnx::load_files(&[model], &Default::default())
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let g = &m.graphs[m.entries[0].graph];
            let feeds: HashMap<String, RtValue> = g
                .inputs
                .iter()
                .filter_map(|&v| m.values[v].name.clone())
                .filter_map(|n| all.get(&n).map(|t| (n, RtValue::from(t.clone()))))
                .collect();
            Interpreter::new(&m)
                .run(m.entries[0].graph, &feeds)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            t.elapsed().as_secs_f64()
        })
        .collect();
    let ours = median(times);
    let j = ort_bench(model, inputs, &["--threads", "1", "--cold"], runs);
    let o1 = j["1"].as_f64().unwrap_or(f64::NAN);
    println!(
        "{:<16} {:<20} {:>8.3}ms {:>8.3}ms {:>10} {:>7.2}x",
        format!("{name} e2e"),
        "load + run",
        ours * 1e3,
        o1 * 1e3,
        "",
        ours / o1
    );
}

/// Times the interpreter (one thread) and ONNX Runtime (1 and 2 threads) on `model` with the
/// inputs it declares from `inputs`; prints a row; returns interpreter / ONNX Runtime (1 thread).
fn bench_model(name: &str, model: &std::path::Path, inputs: &std::path::Path, runs: usize) -> f64 {
    let all: HashMap<String, RtValue> = mmq_kernels::io::read_npz(inputs)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .into_iter()
        .map(|(k, t)| (k, RtValue::from(t)))
        .collect();
    let m = mmq_onnx::load_files(&[model], &Default::default())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let g = m.graphs[m.entries[0].graph].clone();
    let names: Vec<String> = g
        .inputs
        .iter()
        .filter_map(|&v| m.values[v].name.clone())
        .collect();
    let feeds: HashMap<String, RtValue> = all
        .iter()
        .filter(|(k, _)| names.contains(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let interp = Interpreter::new(&m);
    let graph = m.entries[0].graph;
    interp
        .run(graph, &feeds)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let times: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            let _ = interp.run(graph, &feeds);
            t.elapsed().as_secs_f64()
        })
        .collect();
    let ours = median(times);
    let j = ort_bench(model, inputs, &["--threads", "1,2"], runs);
    let o1 = j["1"].as_f64().unwrap_or(f64::NAN);
    let o2 = j["2"].as_f64().unwrap_or(f64::NAN);
    let file = model
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    println!(
        "{:<16} {:<20} {:>8.3}ms {:>8.3}ms {:>8.3}ms {:>7.2}x {:>7.2}x",
        name,
        file,
        ours * 1e3,
        o1 * 1e3,
        o2 * 1e3,
        ours / o1,
        ours / o2
    );
    ours / o1
}

/// `tools/ort_bench.py MODEL INPUTS ARGS --runs RUNS`: median seconds by thread count.
fn ort_bench(
    model: &std::path::Path,
    inputs: &std::path::Path,
    args: &[&str],
    runs: usize,
) -> serde_json::Value {
    let out = Command::new(python())
        .arg(repo_root().join("tools/ort_bench.py"))
        .arg(model)
        .arg(inputs)
        .args(args)
        .args(["--runs", &runs.to_string()])
        .output()
        .expect("run ort_bench");
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("ort_bench: {}", String::from_utf8_lossy(&out.stderr)))
}
