//! Weight-only quantization end to end: INT4 (`MatMulNBits`, symmetric and asymmetric) and FP8
//! on fixtures after the ONNX Runtime -O2 pipeline. The main output must stay above a cosine
//! floor per fixture and scheme against the stored FP32 reference, both in the interpreter and
//! in ONNX Runtime (the Python oracle), and the two must agree with each other, which checks
//! the interpreter's `MatMulNBits` kernel against ONNX Runtime's packing.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::Path;

use mmq_ir::Module;
use mmq_kernels::{Interpreter, RtValue, Tensor};
use mmq_passes::quant::weight_only::{WeightOnlyConfig, WeightOnlyPass, WeightScheme};
use mmq_passes::{Pass, PassOptions, TargetRef};
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

fn count(m: &Module, op: &str) -> usize {
    m.entries
        .iter()
        .flat_map(|e| m.graph_tree(e.graph))
        .flat_map(|g| m.graphs[g].nodes().iter())
        .filter(|&&n| m.nodes[n].op.op_type() == op)
        .count()
}

/// Quantizes fixture `name`, checks the main output in the interpreter and in ONNX Runtime
/// against the FP32 reference; returns both cosines.
fn check(name: &str, config: WeightOnlyConfig, tag: &str) -> (f64, f64) {
    let dir = repo_root().join(format!("tests/fixtures/{name}"));
    let mut m = load(name);
    let before = count(&m, "MatMul") + count(&m, "Gemm");
    let report = WeightOnlyPass::new(config.clone())
        .run(&mut m, &opts())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let g = m.entries[0].graph;
    let main = m.values[m.graphs[g].outputs[0]]
        .name
        .clone()
        .expect("named output");
    let reference = npz(&dir.join("outputs.npz"))[&main]
        .to_f64()
        .expect("float");
    match config.scheme {
        WeightScheme::Int4 => {
            let done = report.counters.get("int4-matmul").copied().unwrap_or(0)
                + report.counters.get("int4-gemm").copied().unwrap_or(0);
            assert!(done > 0, "{name}: nothing quantized: {report:?}");
            // Siblings reading one activation are packed into one product.
            let packed = report.counters.get("int4-packed").copied().unwrap_or(0);
            assert_eq!(count(&m, "MatMulNBits") + packed, done);
            assert!(count(&m, "MatMul") + count(&m, "Gemm") + done >= before);
        }
        WeightScheme::Fp8 => {
            let done = report.counters.get("fp8-weights").copied().unwrap_or(0);
            assert!(done > 0, "{name}: nothing quantized: {report:?}");
            assert_eq!(count(&m, "DequantizeLinear"), done);
        }
    }
    let inputs: HashMap<String, RtValue> = npz(&dir.join("inputs.npz"))
        .into_iter()
        .map(|(k, t)| (k, RtValue::from(t)))
        .collect();
    let outs = Interpreter::new(&m)
        .run(g, &inputs)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let interp = outs[0]
        .1
        .as_tensor()
        .expect("tensor")
        .to_f64()
        .expect("f64");

    let scratch = scratch_dir(&format!("quant_weight_only_{name}_{tag}"));
    let model = scratch.join("model.onnx");
    mmq_backend_ort::write_model(&m, g, &model, &Default::default())
        .unwrap_or_else(|e| panic!("{name}: export: {e}"));
    let got = scratch.join("ort.npz");
    let run = oracle(&[
        OsStr::new("run"),
        model.as_os_str(),
        dir.join("inputs.npz").as_os_str(),
        OsStr::new("-o"),
        got.as_os_str(),
    ]);
    assert!(
        run.status.success(),
        "{name}: ONNX Runtime cannot run {}: {}",
        model.display(),
        String::from_utf8_lossy(&run.stderr)
    );
    let ort = npz(&got)[&main].to_f64().expect("f64");
    let agree = cosine(&interp, &ort);
    assert!(
        agree > 0.99999,
        "{name} {tag}: interpreter and ONNX Runtime disagree (cosine {agree})"
    );
    (cosine(&interp, &reference), cosine(&ort, &reference))
}

fn int4(block_size: usize, symmetric: bool) -> WeightOnlyConfig {
    WeightOnlyConfig {
        scheme: WeightScheme::Int4,
        block_size,
        symmetric,
        ..WeightOnlyConfig::default()
    }
}

fn int4_level4(block_size: usize, symmetric: bool) -> WeightOnlyConfig {
    WeightOnlyConfig {
        accuracy_level: Some(4),
        ..int4(block_size, symmetric)
    }
}

#[test]
fn int4_and_fp8_hold_cosine_floors_in_the_interpreter_and_onnx_runtime() {
    let fp8 = WeightOnlyConfig {
        scheme: WeightScheme::Fp8,
        ..WeightOnlyConfig::default()
    };
    // (fixture, config, tag, floor). gpt2_kv quantizes Gemm weights (transB = 0, bias).
    let cases = [
        ("vit", int4(32, true), "int4-b32", 0.998),
        ("vit", int4(128, false), "int4-b128-asym", 0.995),
        ("llama_gqa_kv", int4(32, true), "int4-b32", 0.99),
        ("llama_gqa_kv", int4(64, false), "int4-b64-asym", 0.99),
        ("gpt2_kv", int4(32, true), "int4-b32", 0.99),
        // ONNX Runtime's int8 compute: the interpreter rounds A per block as its kernels do.
        ("vit", int4_level4(32, true), "int4-b32-acc4", 0.998),
        (
            "llama_gqa_kv",
            int4_level4(128, false),
            "int4-b128-asym-acc4",
            0.99,
        ),
        ("vit", fp8.clone(), "fp8", 0.9999),
        ("llama_gqa_kv", fp8.clone(), "fp8", 0.999),
        ("gpt2_kv", fp8, "fp8", 0.999),
    ];
    let mut failures = Vec::new();
    for (name, config, tag, floor) in cases {
        let (interp, ort) = check(name, config, tag);
        if interp < floor || ort < floor {
            failures.push(format!(
                "{name} {tag}: cosine interpreter {interp:.5}, ONNX Runtime {ort:.5} < {floor}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
