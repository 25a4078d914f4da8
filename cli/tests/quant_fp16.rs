//! `mmq compile --quant fp16` and precision-map rules with `scheme = "fp16"`: the model file
//! holds float16 weights (about half the bytes), ONNX Runtime folds every widening `Cast` when
//! the session starts (its optimized graph has no float16 initializer and no more `Cast` nodes
//! than the FP32 model's) and stays close to FP32; a map converts only the weights of the nodes
//! it gives fp16.

mod common;

use std::path::Path;
use std::process::Command;

use common::{fixture, python, repo, run_in, scratch, succeeded};

/// Prints: the cosine of the first output against the FP32 model; the Cast nodes of ONNX
/// Runtime's optimized FP32 and quantized graphs; the float16 initializers left in the optimized
/// quantized graph; then, for the quantized model as written, the op types reading each Cast of
/// a float16 initializer (one line each).
const CHECK: &str = r#"
import sys, numpy as np, onnx, onnxruntime as ort
ref, q, inputs, d = sys.argv[1:5]
x = dict(np.load(inputs))
def run(path, opt):
    o = ort.SessionOptions(); o.optimized_model_filepath = opt
    return ort.InferenceSession(path, o, providers=["CPUExecutionProvider"]).run(None, x)[0].ravel()
a = run(ref, d + "/ref_opt.onnx")
b = run(q, d + "/q_opt.onnx")
print(float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b)))
casts = lambda m: sum(n.op_type == "Cast" for n in m.graph.node)
oq = onnx.load(d + "/q_opt.onnx")
print(casts(onnx.load(d + "/ref_opt.onnx")), casts(oq))
print(sum(t.data_type == onnx.TensorProto.FLOAT16 for t in oq.graph.initializer))
m = onnx.load(q)
f16 = {t.name for t in m.graph.initializer if t.data_type == onnx.TensorProto.FLOAT16}
for c in m.graph.node:
    if c.op_type == "Cast" and c.input[0] in f16:
        print(" ".join(sorted({n.op_type for n in m.graph.node if c.output[0] in n.input})))
"#;

struct Checked {
    cosine: f64,
    casts: (usize, usize),
    f16_left: usize,
    readers: Vec<String>,
}

fn check(dir: &Path, name: &str, q: &Path) -> Checked {
    let run = succeeded(
        Command::new(python())
            .args(["-c", CHECK, &fixture(name), q.to_str().expect("utf-8")])
            .arg(repo().join(format!("tests/fixtures/{name}/inputs.npz")))
            .arg(dir)
            .output()
            .expect("python runs"),
    );
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    let mut lines = stdout.lines();
    let cosine = lines
        .next()
        .and_then(|l| l.parse().ok())
        .expect("cosine line");
    let casts: Vec<usize> = lines
        .next()
        .unwrap_or_default()
        .split(' ')
        .filter_map(|x| x.parse().ok())
        .collect();
    let f16_left = lines
        .next()
        .and_then(|l| l.parse().ok())
        .expect("count line");
    Checked {
        cosine,
        casts: (casts[0], casts[1]),
        f16_left,
        readers: lines.map(str::to_owned).collect(),
    }
}

fn compile(dir: &Path, name: &str, out: &str, extra: &[&str]) -> String {
    let model = fixture(name);
    let mut args = vec![
        "compile",
        model.as_str(),
        "--target",
        "ort",
        "-O2",
        "-o",
        out,
    ];
    args.extend_from_slice(extra);
    let (code, _, err) = run_in(dir, &args);
    assert_eq!(code, 0, "{err}");
    err
}

fn counter(stderr: &str, name: &str) -> usize {
    stderr
        .split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}=")))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[test]
fn clip_fp16_halves_the_file_and_onnx_runtime_folds_the_casts() {
    let dir = scratch("quant-fp16-clip");
    compile(&dir, "clip", "fp32.onnx", &[]);
    let err = compile(&dir, "clip", "fp16.onnx", &["--quant", "fp16"]);
    let converted = counter(&err, "fp16-weights");
    assert!(converted > 20, "{err}");
    let size = |f: &str| std::fs::metadata(dir.join(f)).expect("written").len() as f64;
    let ratio = size("fp16.onnx") / size("fp32.onnx");
    assert!(ratio < 0.6, "file size ratio {ratio}");
    let c = check(&dir, "clip", &dir.join("fp16.onnx"));
    assert!(c.cosine >= 0.9999, "cosine {}", c.cosine);
    assert_eq!(c.casts.0, c.casts.1, "ONNX Runtime kept widening casts");
    assert_eq!(c.f16_left, 0, "float16 initializers left after folding");
    assert_eq!(c.readers.len(), converted);
}

#[test]
fn precision_map_fp16_rules_convert_only_the_matched_nodes() {
    let dir = scratch("quant-fp16-map");
    std::fs::write(
        dir.join("map.toml"),
        r#"[default]
scheme = "float"

[[rule]]
name = "norms"
ops = ["LayerNormalization", "com.microsoft.SkipLayerNormalization"]
scheme = "fp16"
"#,
    )
    .expect("map");
    let err = compile(&dir, "clip", "mixed.onnx", &["--precision-map", "map.toml"]);
    assert!(!err.contains("no fp16 pass"), "{err}");
    let converted = counter(&err, "fp16-weights");
    assert!(converted > 0, "{err}");
    let c = check(&dir, "clip", &dir.join("mixed.onnx"));
    assert!(c.cosine >= 0.9999, "cosine {}", c.cosine);
    assert_eq!(c.readers.len(), converted);
    for r in &c.readers {
        assert!(
            r.split(' ')
                .all(|op| op == "LayerNormalization" || op == "SkipLayerNormalization"),
            "a float16 weight is read by {r}"
        );
    }
}
