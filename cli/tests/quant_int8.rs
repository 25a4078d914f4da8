//! `mmq compile --quant int8|int8-dynamic`: ONNX Runtime runs the output with the integer
//! kernels fused and stays close to FP32; bad calibration options are usage or user errors.

mod common;

use std::process::Command;

use common::{fixture, python, repo, run_in, scratch, succeeded};

/// Cosine of the first output against the FP32 model, and the op types of ONNX Runtime's
/// optimized graph.
const CHECK: &str = r#"
import sys, numpy as np, onnx, onnxruntime as ort
ref, q, inputs, opt = sys.argv[1:5]
x = dict(np.load(inputs))
a = ort.InferenceSession(ref, providers=["CPUExecutionProvider"]).run(None, x)[0].ravel()
o = ort.SessionOptions(); o.optimized_model_filepath = opt
b = ort.InferenceSession(q, o, providers=["CPUExecutionProvider"]).run(None, x)[0].ravel()
print(float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b)))
print(" ".join(sorted({n.op_type for n in onnx.load(opt).graph.node})))
"#;

fn ort_check(name: &str, scheme: &str, floor: f64, fused: &str) {
    let dir = scratch(&format!("quant-{name}-{scheme}"));
    let out = dir.join("q.onnx");
    let (code, _, err) = run_in(
        &dir,
        &[
            "compile",
            &fixture(name),
            "--target",
            "ort",
            "--quant",
            scheme,
            "--calib-random",
            "4",
            // Every eligible node: ONNX Runtime's fusion of each unit is what is checked (by
            // default these small products stay float, as the cost model estimates them
            // faster there).
            "--placement",
            "all",
            "-o",
            out.to_str().expect("utf-8"),
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("quantized"), "{err}");
    let run = succeeded(
        Command::new(python())
            .args(["-c", CHECK, &fixture(name), out.to_str().expect("utf-8")])
            .arg(repo().join(format!("tests/fixtures/{name}/inputs.npz")))
            .arg(dir.join("opt.onnx"))
            .output()
            .expect("python runs"),
    );
    let stdout = String::from_utf8_lossy(&run.stdout);
    let mut lines = stdout.lines();
    let cos: f64 = lines
        .next()
        .and_then(|l| l.parse().ok())
        .expect("cosine line");
    let ops = lines.next().unwrap_or_default();
    assert!(cos >= floor, "{name} {scheme}: cosine {cos} < {floor}");
    assert!(
        ops.split(' ').any(|o| o == fused),
        "{name} {scheme}: no {fused} in {ops}"
    );
    assert!(
        !ops.split(' ').any(|o| o == "MatMul"),
        "{name} {scheme}: a float MatMul is left: {ops}"
    );
}

#[test]
fn vit_int8_fuses_into_integer_kernels_in_onnx_runtime() {
    ort_check("vit", "int8", 0.995, "MatMulIntegerToFloat");
}

#[test]
fn clip_int8_dynamic_fuses_into_dynamic_quantize_matmul() {
    ort_check("clip", "int8-dynamic", 0.99, "DynamicQuantizeMatMul");
}

#[test]
fn gpt2_int8_quantizes_gemm_weights() {
    ort_check("gpt2_kv", "int8", 0.99, "MatMulIntegerToFloat");
}

#[test]
fn calibration_option_errors() {
    let dir = scratch("quant-errors");
    let vit = fixture("vit");
    let cases: &[(&[&str], i32, &str)] = &[
        (&["--observer", "max"], 2, "unknown observer 'max'"),
        (&["--observer", "ema:1.5"], 2, "momentum must be in [0, 1)"),
        (
            &["--calib", "nowhere", "--calib-random", "3"],
            2,
            "--calib cannot be used with --calib-random",
        ),
        (&["--calib-random", "0"], 2, "at least one sample"),
        (&["--calib", "nowhere"], 1, "cannot read the folder"),
        (&["--calib", "."], 1, "no .npz files"),
    ];
    for (extra, want_code, want) in cases {
        let mut args = vec![
            "compile",
            vit.as_str(),
            "--target",
            "ort",
            "--quant",
            "int8",
        ];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["-o", "out.onnx"]);
        let (code, _, err) = run_in(&dir, &args);
        assert_eq!(code, *want_code, "{extra:?}: {err}");
        assert!(err.contains(want), "{extra:?}: {err}");
    }
    // A sample that does not fit the graph names the file and the input.
    let bad = dir.join("bad");
    std::fs::create_dir_all(&bad).expect("dir");
    std::fs::copy(
        repo().join("tests/fixtures/gpt2_kv/inputs.npz"),
        bad.join("a.npz"),
    )
    .expect("copy");
    let (code, _, err) = run_in(
        &dir,
        &[
            "compile", &vit, "--target", "ort", "--quant", "int8", "--calib", "bad", "-o",
            "out.onnx",
        ],
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("bad/a.npz: input input_ids: not an input of graph 'main_graph'"),
        "{err}"
    );
    assert!(
        err.contains("the file holds attention_mask i64[2, 8]"),
        "{err}"
    );
    assert!(
        err.contains("the graph reads pixel_values f32[batch, 3, 32, 32]"),
        "{err}"
    );
    assert!(!dir.join("out.onnx").exists());
}

/// Options that would silently do nothing are refused before any work, naming the option and
/// what to do; a table that would be empty is not written; the placement note says plainly
/// that the units were kept float and how to quantize them anyway.
#[test]
fn options_that_would_do_nothing_say_so() {
    let dir = scratch("quant-nothing");
    let clip = fixture("clip");
    let llama = fixture("llama_gqa_kv");
    let cases: &[(&[&str], i32, &str)] = &[
        (&["--calib", "."], 2, "--calib: nothing is quantized"),
        (
            &["--calib-random", "4"],
            2,
            "--calib-random: nothing is quantized",
        ),
        (
            &["--qparams", "t.qpqr"],
            2,
            "--qparams: nothing is quantized",
        ),
    ];
    for (extra, want_code, want) in cases {
        let mut args = vec!["compile", clip.as_str()];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["-o", "out.onnx"]);
        let (code, _, err) = run_in(&dir, &args);
        assert_eq!(code, *want_code, "{extra:?}: {err}");
        assert!(err.contains(want), "{extra:?}: {err}");
        assert!(err.contains("add --quant int8"), "{extra:?}: {err}");
        assert!(!dir.join("out.onnx").exists() && !dir.join("t.qpqr").exists());
    }
    // INT8 whose every unit the cost model keeps float: said in those words, and a --qparams
    // table would be empty, so neither it nor the model is written.
    let (code, _, err) = run_in(
        &dir,
        &["compile", &llama, "--quant", "int8", "-o", "out.onnx"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("15 of 15 quantized units kept float: estimated faster in float at these sizes on ort; --placement all quantizes them"),
        "{err}"
    );
    // --quiet keeps only the lines that warn.
    let (code, _, err) = run_in(
        &dir,
        &["compile", &llama, "--quant", "int8", "-q", "-o", "out.onnx"],
    );
    assert_eq!((code, err.as_str()), (0, ""));
    let clip_map = repo().join("tests/fixtures/precision_maps/clip.toml");
    let (code, _, err) = run_in(
        &dir,
        &[
            "compile",
            &clip,
            "--precision-map",
            clip_map.to_str().expect("utf-8"),
            "--quiet",
            "-o",
            "out.onnx",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(err.lines().count(), 2, "{err}");
    assert!(err.lines().all(|l| l.contains("warning: rule")), "{err}");
    let (code, _, err) = run_in(
        &dir,
        &[
            "compile",
            &llama,
            "--quant",
            "int8",
            "--qparams",
            "t.qpqr",
            "-o",
            "q.onnx",
        ],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("no quantization parameters"), "{err}");
    assert!(err.contains("--placement all"), "{err}");
    assert!(!dir.join("t.qpqr").exists() && !dir.join("q.onnx").exists());
}

/// Conv → Relu → Conv at `-O2`: activation fusion waits until after quantization, so both Convs
/// are quantized (not the first left as a float `FusedConv`), and ONNX Runtime runs both as
/// `QLinearConv`, close to FP32.
#[test]
fn the_main_output_is_chosen_by_name_and_can_be_named() {
    let dir = scratch("main-output");
    let vit = fixture("vit");
    let args = |extra: &[&str]| {
        let mut a = vec!["compile", &vit, "--quant", "int8", "-o", "out.onnx"];
        a.extend_from_slice(extra);
        a.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let run = |extra: &[&str]| {
        let a = args(extra);
        run_in(&dir, &a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    // The pooled output, not the first one (last_hidden_state).
    let (code, _, err) = run(&[]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("accuracy: 'pooler_output' cosine"), "{err}");
    let (code, _, err) = run(&["--main-output", "last_hidden_state"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("accuracy: 'last_hidden_state' cosine"),
        "{err}"
    );
    let (code, _, err) = run(&["--main-output", "logits"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(
            "--main-output logits: the model has no output of that name (outputs: \
             last_hidden_state, pooler_output)"
        ),
        "{err}"
    );
}

#[test]
fn conv_relu_is_quantized_at_o2() {
    const MAKE: &str = r#"
import sys, numpy as np, onnx
from onnx import helper as h, TensorProto as T, numpy_helper as nh
rng = np.random.default_rng(0)
w = nh.from_array(rng.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.2, "w")
b = nh.from_array(rng.standard_normal(16).astype(np.float32) * 0.1, "b")
w2 = nh.from_array(rng.standard_normal((16, 16, 3, 3)).astype(np.float32) * 0.2, "w2")
nodes = [h.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
         h.make_node("Relu", ["c"], ["r"]),
         h.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1])]
g = h.make_graph(nodes, "conv_relu", [h.make_tensor_value_info("x", T.FLOAT, [1, 8, 16, 16])],
                 [h.make_tensor_value_info("y", T.FLOAT, [1, 16, 16, 16])], [w, b, w2])
onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), sys.argv[1])
np.savez(sys.argv[2], x=rng.standard_normal((1, 8, 16, 16)).astype(np.float32))
"#;
    let dir = scratch("quant-conv-relu");
    let (model, inputs) = (dir.join("m.onnx"), dir.join("x.npz"));
    succeeded(
        Command::new(python())
            .args(["-c", MAKE])
            .arg(&model)
            .arg(&inputs)
            .output()
            .expect("python runs"),
    );
    let out = dir.join("q.onnx");
    let (code, _, err) = run_in(
        &dir,
        &[
            "compile",
            model.to_str().expect("utf-8"),
            "--target",
            "ort",
            "-O2",
            "--quant",
            "int8",
            "--calib-random",
            "4",
            "--placement",
            "all",
            "-o",
            out.to_str().expect("utf-8"),
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("quantized-conv=2"), "{err}");
    let run = Command::new(python())
        .args(["-c", CHECK])
        .arg(&model)
        .arg(&out)
        .arg(&inputs)
        .arg(dir.join("opt.onnx"))
        .output()
        .expect("python runs");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let stdout = String::from_utf8_lossy(&run.stdout);
    let mut lines = stdout.lines();
    let cos: f64 = lines.next().and_then(|l| l.parse().ok()).expect("cosine");
    let ops = lines.next().unwrap_or_default();
    assert!(cos >= 0.99, "cosine {cos}");
    assert!(ops.split(' ').any(|o| o == "QLinearConv"), "{ops}");
    assert!(
        !ops.split(' ').any(|o| o == "FusedConv" || o == "Conv"),
        "{ops}"
    );
}

/// The quantization passes run in the one pass manager: `--time-passes` lists them with the
/// optimization passes, and `--dump-after int8` prints the module right after INT8, before
/// `fuse-act` runs.
#[test]
fn time_passes_and_dump_after_see_the_quantization_passes() {
    let dir = scratch("quant-int8-time-dump");
    let fx = fixture("qat_cnn");
    let (code, _, err) = run_in(
        &dir,
        &[
            "compile",
            &fx,
            "--target",
            "ort",
            "-o",
            "out.onnx",
            "--quant",
            "int8",
            "--calib-random",
            "2",
            "--no-accuracy",
            "--time-passes",
            "--dump-after",
            "int8",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let table: Vec<&str> = err
        .lines()
        .skip_while(|l| !l.starts_with("pass "))
        .take_while(|l| !l.starts_with("total"))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let at = |name: &str| {
        table
            .iter()
            .position(|p| *p == name)
            .unwrap_or_else(|| panic!("{name} not in {table:?}\n{err}"))
    };
    assert!(at("rewrite(simplify)") < at("int8"), "{table:?}");
    assert!(at("int8") < at("rewrite(fuse-act)"), "{table:?}");
    let row = err
        .lines()
        .find(|l| l.starts_with("int8 "))
        .expect("int8 row");
    assert!(row.contains("quantized-matmul="), "{row}");
    let dump = err
        .split("// ----- after int8 -----")
        .nth(1)
        .unwrap_or_else(|| panic!("no dump after int8:\n{err}"));
    assert!(dump.contains("QuantizeLinear"), "{dump}");
    assert!(!dump.contains("// ----- after"), "one dump only");
    assert!(dir.join("out.onnx").exists());

    // A pass that does not run is refused with the list that does.
    let (code, _, err) = run_in(
        &dir,
        &[
            "compile",
            &fx,
            "--target",
            "ort",
            "-o",
            "o2.onnx",
            "--quant",
            "int8-dynamic",
            "--dump-after",
            "int8",
        ],
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("no such pass") && err.contains("int8-dynamic"),
        "{err}"
    );
}

/// The command line is a front end of the library: the same model and options give the same
/// bytes through `mmq compile` and through `mmq_compiler::compile` + `export::write`.
#[test]
fn the_command_and_the_library_write_the_same_bytes() {
    use mmq_compiler::{CalibrationSource, CompileOptions, Precision};
    let dir = scratch("quant-int8-library");
    let fx = fixture("clip");
    let (code, _, err) = run_in(
        &dir,
        &[
            "compile",
            &fx,
            "--target",
            "ort",
            "-o",
            "cli.onnx",
            "--quant",
            "int8",
            "--calib-random",
            "3",
            "--smoothquant",
            "0.5",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let (mut m, warnings) = mmq_compiler::load::load(&[fx.clone().into()])
        .and_then(|l| l.verified())
        .expect("loads");
    assert!(warnings.is_empty(), "{warnings}");
    let options = CompileOptions {
        precision: Precision::Int8 {
            observer: Default::default(),
            smoothquant: Some(0.5),
        },
        calibration: CalibrationSource::Random { count: 3, seed: 0 },
        ..CompileOptions::default()
    };
    let report = mmq_compiler::compile(&mut m, &options).expect("compiles");
    let names: Vec<&str> = report.passes.iter().map(|p| p.name.as_str()).collect();
    assert!(
        names.contains(&"smoothquant") && names.contains(&"int8"),
        "{names:?}"
    );
    let lib = dir.join("lib.onnx");
    mmq_compiler::export::write(&m, &[], &lib).expect("writes");
    let a = std::fs::read(dir.join("cli.onnx")).expect("cli output");
    let b = std::fs::read(&lib).expect("library output");
    assert!(a == b, "cli {} bytes vs library {} bytes", a.len(), b.len());
}
