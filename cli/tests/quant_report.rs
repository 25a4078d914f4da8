//! `mmq compile --report OUT.json`: the compile report, with the accuracy of the compiled model
//! against the imported one (JSON and table), with and without quantization, and its error cases.

mod common;

use common::{fixture, repo, run_in, scratch};

/// Compiles `name` with `extra` flags and `--report`; checks the pass list of the compile
/// report and returns its accuracy section and stderr.
fn report(name: &str, tag: &str, extra: &[&str]) -> (serde_json::Value, String) {
    let dir = scratch(&format!("report-{name}-{tag}"));
    let fx = fixture(name);
    let mut args = vec![
        "compile", &fx, "--target", "ort", "-o", "out.onnx", "--report", "r.json",
    ];
    args.extend_from_slice(extra);
    let (code, _, err) = run_in(&dir, &args);
    assert_eq!(code, 0, "{name} {extra:?}: {err}");
    let text = std::fs::read_to_string(dir.join("r.json")).expect("report written");
    let full: serde_json::Value = serde_json::from_str(&text).expect("report is JSON");
    assert_eq!(full["target"], "ort", "{text}");
    let passes = full["passes"].as_array().expect("passes");
    let names: Vec<&str> = passes.iter().filter_map(|p| p["name"].as_str()).collect();
    assert!(names.contains(&"const-fold"), "{names:?}");
    if extra.contains(&"int8") {
        let int8 = passes
            .iter()
            .find(|p| p["name"] == "int8")
            .expect("int8 pass");
        assert_eq!(int8["stage"], "quantize");
        assert!(f(&int8["ms"]) >= 0.0);
        assert!(
            int8["counters"].as_object().is_some_and(|c| !c.is_empty()),
            "{int8}"
        );
    }
    let rewrites = passes
        .iter()
        .filter(|p| p["egraphs"].as_array().is_some_and(|e| !e.is_empty()));
    for p in rewrites {
        assert!(f(&p["egraphs"][0]["nodes"]) > 0.0, "{p}");
    }
    (full["accuracy"].clone(), err)
}

fn f(v: &serde_json::Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// The -O2 rewrites (fusions, folding) without quantization keep every shared layer and the
/// main output at FP32 rounding distance.
#[test]
fn optimization_alone_keeps_every_layer_exact_to_rounding() {
    for name in ["vit", "gpt2_kv"] {
        let (r, err) = report(name, "fp32", &[]);
        let layers = r["layers"].as_array().expect("layers");
        assert!(layers.len() >= 10, "{name}: {} layers", layers.len());
        for l in layers {
            assert!(f(&l["cosine"]) > 0.99999, "{name}: {l}");
            if let Some(s) = l["sqnr_db"].as_f64() {
                assert!(s > 80.0, "{name}: {l}");
            }
        }
        let e = &r["end_to_end"];
        assert!(f(&e["cosine_mean"]) > 0.99999, "{name}: {e}");
        assert_eq!(f(&e["top1_agreement"]), 1.0, "{name}: {e}");
        assert_eq!(r["held_back_samples"], 2);
        assert_eq!(r["layer_samples"], 6);
        assert!(err.contains("end to end ("), "{err}");
        assert!(err.contains("SQNR dB"), "{err}");
    }
}

/// INT8 shows measurable noise per layer (finite SQNR) while the end-to-end cosine holds a
/// floor per fixture; the report uses the calibration sample count given.
#[test]
fn int8_report_shows_noise_and_holds_a_cosine_floor() {
    for (name, floor) in [("vit", 0.999), ("gpt2_kv", 0.999), ("qat_cnn", 0.9999)] {
        let args = [
            "--quant",
            "int8",
            "--calib-random",
            "8",
            "--placement",
            "all",
        ];
        let (r, _) = report(name, "int8", &args);
        let layers = r["layers"].as_array().expect("layers");
        let noisy = layers.iter().filter(|l| l["sqnr_db"].is_f64()).count();
        assert!(noisy > 0, "{name}: no layer shows quantization noise");
        let worst = layers
            .iter()
            .filter_map(|l| l["sqnr_db"].as_f64())
            .fold(f64::INFINITY, f64::min);
        assert!(
            worst < 60.0,
            "{name}: worst SQNR {worst} dB is not INT8 noise"
        );
        let e = &r["end_to_end"];
        assert!(f(&e["cosine_mean"]) >= floor, "{name}: {e}");
        assert!(f(&e["cosine_mean"]) < 1.0, "{name}: {e}");
        assert_eq!(r["layer_samples"], 6);
    }
}

#[test]
fn report_errors_are_user_errors() {
    let dir = scratch("report-errors");
    let fx = fixture("vit");
    let (code, _, err) = run_in(
        &dir,
        &[
            "compile",
            &fx,
            "--target",
            "ort",
            "-o",
            "out.onnx",
            "--report",
            "missing/r.json",
        ],
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.starts_with("error: --report: cannot write missing/r.json:"),
        "{err}"
    );
    let (code, _, err) = run_in(
        &dir,
        &[
            "compile", &fx, "--target", "ort", "-o", "o.onnx", "--report",
        ],
    );
    assert_eq!(code, 2, "{err}");
}

/// `v` with every float rounded to 4 significant digits (integers kept as they are), so the
/// snapshot does not depend on the last bits of a machine's float arithmetic.
fn round_floats(v: &serde_json::Value) -> serde_json::Value {
    match v {
        serde_json::Value::Number(n) if n.is_f64() => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            if x == 0.0 || !x.is_finite() {
                return v.clone();
            }
            let decimals = (3 - x.abs().log10().floor() as i32).max(0) as usize;
            let text = format!("{x:.decimals$}");
            let rounded: f64 = text.parse().unwrap_or(x);
            serde_json::Number::from_f64(rounded).map_or(v.clone(), serde_json::Value::Number)
        }
        serde_json::Value::Array(items) => items.iter().map(round_floats).collect(),
        serde_json::Value::Object(map) => map
            .iter()
            .map(|(k, x)| (k.clone(), round_floats(x)))
            .collect::<serde_json::Map<_, _>>()
            .into(),
        other => other.clone(),
    }
}

#[test]
fn rounding_keeps_four_significant_digits() {
    let v = serde_json::json!({"a": 0.99998765, "b": 44.60622448, "c": 0.000577777, "n": 12288, "z": 0.0});
    assert_eq!(
        round_floats(&v).to_string(),
        r#"{"a":1.0,"b":44.61,"c":0.0005778,"n":12288,"z":0.0}"#
    );
}

/// The INT8 report of the small QAT CNN, deterministic (seeded random samples), floats rounded
/// to 4 significant digits.
#[test]
fn int8_report_snapshot() {
    let (r, _) = report(
        "qat_cnn",
        "snapshot",
        &[
            "--quant",
            "int8",
            "--calib-random",
            "8",
            "--placement",
            "all",
        ],
    );
    let text = serde_json::to_string_pretty(&round_floats(&r)).expect("JSON");
    insta::assert_snapshot!("int8_report_qat_cnn", text);
}

/// Without `--report`, a quantizing run still measures: one `accuracy:` line with the
/// end-to-end cosine on the held-back samples; below 0.99 it names `--auto 0.99`. The figure
/// agrees with the full report's, and `--no-accuracy` leaves the line out.
#[test]
fn quantizing_prints_one_accuracy_line_unless_told_not_to() {
    let dir = scratch("accuracy-line");
    let fx = fixture("clip");
    let base = [
        "compile", &fx, "--target", "ort", "-o", "out.onnx", "--quant", "int4",
    ];
    let (code, _, err) = run_in(&dir, &base);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("accuracy:")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    let line = lines[0];
    assert!(line.contains("'text_embeds' cosine"), "{line}");
    assert!(line.contains("2 held-back sample(s)"), "{line}");
    let cos: f64 = line
        .split("cosine ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|x| x.parse().ok())
        .unwrap_or_else(|| panic!("no cosine in {line}"));
    // INT4 on these random weights sits below the goal: the line says how to get further.
    assert!(cos < 0.99, "{line}");
    assert!(line.contains("--auto 0.99"), "{line}");
    let (r, _) = report("clip", "int4", &["--quant", "int4"]);
    let full = f(&r["end_to_end"]["cosine_mean"]);
    assert!((full - cos).abs() < 5e-5, "line {cos} vs report {full}");

    let mut quiet = base.to_vec();
    quiet.push("--no-accuracy");
    let (code, _, err) = run_in(&dir, &quiet);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("accuracy:"), "{err}");

    // Unquantized runs print no accuracy line.
    let (code, _, err) = run_in(&dir, &base[..6]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("accuracy:"), "{err}");
}

/// `--report` and `--auto-map` never overwrite an input model, the output, a calibration sample
/// or each other: a usage error before any work, every file left as it was.
#[test]
fn side_outputs_never_overwrite_inputs_or_the_output() {
    let dir = scratch("report-overwrite");
    let model = dir.join("m.onnx");
    std::fs::copy(fixture("vit"), &model).expect("copy");
    let before = std::fs::read(&model).expect("model");
    std::fs::create_dir_all(dir.join("calib")).expect("calib");
    for (extra, want) in [
        (
            &["--report", "m.onnx"][..],
            "--report m.onnx: that is the input model",
        ),
        (
            &["--report", "out.onnx"][..],
            "--report out.onnx: that is the output",
        ),
        (
            &["--report", "./out.onnx.data"][..],
            "that is the output's external data",
        ),
        (
            &[
                "--quant",
                "int8",
                "--calib",
                "calib",
                "--report",
                "calib/s.npz",
            ][..],
            "that is in the calibration folder",
        ),
        (
            &["--auto", "0.99", "--auto-map", "m.onnx"][..],
            "--auto-map m.onnx: that is the input model",
        ),
        (
            &[
                "--auto",
                "0.99",
                "--report",
                "r.toml",
                "--auto-map",
                "r.toml",
            ][..],
            "--auto-map r.toml: that is the --report file",
        ),
    ] {
        let mut args = vec!["compile", "m.onnx", "--target", "ort", "-o", "out.onnx"];
        args.extend_from_slice(extra);
        let (code, _, err) = run_in(&dir, &args);
        assert_eq!(code, 2, "{extra:?}: {err}");
        assert!(err.contains(want), "{extra:?}: {err}");
        assert!(!dir.join("out.onnx").exists(), "{extra:?}");
        assert_eq!(std::fs::read(&model).expect("model"), before, "{extra:?}");
    }
}

/// The accuracy line says which samples it measured on: random ones are drawn afresh, so
/// held back from the calibration; a `--calib` folder's also calibrated the model.
#[test]
fn the_accuracy_line_says_whether_its_samples_calibrated_the_model() {
    let dir = scratch("accuracy-samples");
    let calib = dir.join("calib");
    std::fs::create_dir_all(&calib).expect("dir");
    let inputs = repo().join("tests/fixtures/vit/inputs.npz");
    for name in ["a.npz", "b.npz", "c.npz", "d.npz"] {
        std::fs::copy(&inputs, calib.join(name)).expect("copy");
    }
    let fx = fixture("vit");
    let base = ["compile", &fx, "-o", "out.onnx", "--quant", "int8"];
    let (code, _, err) = run_in(&dir, &base);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("held-back sample(s)"), "{err}");
    let mut with_folder = base.to_vec();
    with_folder.extend(["--calib", "calib"]);
    let (code, _, err) = run_in(&dir, &with_folder);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("on 1 sample(s) of the --calib folder (they calibrated it too)"),
        "{err}"
    );
}
