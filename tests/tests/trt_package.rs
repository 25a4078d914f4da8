//! `--target trt` on every committed fixture, unquantized, INT8, FP8 and INT4 (weight-only, as
//! blockwise `DequantizeLinear`): the package (model files,
//! `build_engine.sh`, `manifest.json`) is written; the models read back from disk pass the
//! TensorRT-rules linter (parser ops and their restrictions, symmetric Q/DQ with per-channel
//! scales on weights only, plugin nodes that match mmq's plugins) and the full ONNX checker; ONNX
//! Runtime runs them (`mmq run` where the model uses mmq's plugins, which ONNX Runtime lacks):
//! within 1e-4 of the stored float references unquantized (2e-2 for the QAT model, whose Q/DQ
//! ONNX Runtime runs as integer kernels), and at cosine >= 0.99 to them with INT8 and FP8, 0.98
//! with INT4. The PyTorch QAT model's asymmetric uint8 units become plugins (trt_plugins.rs
//! checks the plugin packages and library).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use mmq_compiler::{Accuracy, CalibrationSource, CompileOptions, Precision, Scheme};
use mmq_passes::quant::int8::ActGranularity;
use mmq_passes::{OptLevel, TargetRef};
use mmq_tests::{Fixture, cosine, fixtures, oracle, scratch_dir};
use rayon::prelude::*;

/// The fixture's models loaded and compiled with `options`.
fn compiled(fx: &Fixture, options: &CompileOptions) -> mmq_ir::Module {
    let (mut m, _) = mmq_compiler::load::load(&fx.models)
        .and_then(|l| l.verified())
        .unwrap_or_else(|e| panic!("{}: {e}", fx.name));
    mmq_compiler::compile(&mut m, options).unwrap_or_else(|e| panic!("{}: {e}", fx.name));
    m
}

/// The TensorRT target's defaults, without the accuracy measurement.
fn trt_defaults() -> CompileOptions {
    CompileOptions {
        target: TargetRef::TRT,
        accuracy: Accuracy::Off,
        ..CompileOptions::default()
    }
}

/// Runs the package's `build_engine.sh` with `args` and a fake trtexec that prints its own
/// arguments: (exit code, trtexec's arguments, stderr).
fn run_build_script(dir: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let fake = dir.join("fake-trtexec");
    std::fs::write(&fake, "#!/bin/sh\nprintf '%s\\n' \"$@\"\n").expect("write");
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(&fake)
        .status()
        .expect("chmod");
    let out = std::process::Command::new("bash")
        .arg(dir.join("build_engine.sh"))
        .args(["--trtexec", &fake.to_string_lossy()])
        .args(args)
        .output()
        .expect("bash");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn compile_package(fx: &Fixture, tag: &str, precision: Precision) -> (PathBuf, Vec<PathBuf>) {
    let m = compiled(
        fx,
        &CompileOptions {
            level: OptLevel::O2,
            calibration: if precision.quantizes() {
                CalibrationSource::Random { count: 8, seed: 0 }
            } else {
                CalibrationSource::Default
            },
            precision,
            ..trt_defaults()
        },
    );
    let dir = scratch_dir(&format!("trt/{}-{tag}", fx.name.replace('/', "-")));
    let _ = std::fs::remove_dir_all(&dir);
    let package = mmq_compiler::export::write_trt(
        &m,
        &fx.models,
        &dir,
        &mmq_backend_trt::PackageOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{} {tag}: {e}", fx.name));
    assert!(
        package.findings.is_empty(),
        "{} {tag}: {:?}",
        fx.name,
        package.findings
    );
    let models: Vec<PathBuf> = package
        .files
        .iter()
        .filter(|f| f.extension().is_some_and(|x| x == "onnx"))
        .cloned()
        .collect();
    assert_eq!(models.len(), fx.models.len(), "{} {tag}", fx.name);
    assert!(
        dir.join("manifest.json").is_file(),
        "{} {tag}: no manifest.json",
        fx.name
    );
    // The reference of each model: inputs and the interpreter's outputs, listed with hashes.
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).expect("manifest"))
            .expect("JSON");
    for model in manifest["models"].as_array().expect("models") {
        for kind in ["inputs", "outputs"] {
            let file = model["reference"][kind]["file"]
                .as_str()
                .unwrap_or_else(|| panic!("{} {tag}: no reference {kind}: {model}", fx.name));
            let arrays = mmq_kernels::io::read_npz(&dir.join(file)).expect("reference npz");
            assert!(!arrays.is_empty(), "{} {tag}: empty {file}", fx.name);
        }
    }
    let scripts = package
        .files
        .iter()
        .filter(|f| f.extension().is_some_and(|x| x == "sh") && f.parent() == Some(&*dir))
        .count();
    assert_eq!(scripts, fx.models.len(), "{} {tag}: build scripts", fx.name);
    (dir, models)
}

/// The PyTorch QAT fixture: its fake-quant units are u8 with the input's asymmetric, which
/// TensorRT runs through mmq's plugins.
const ASYMMETRIC_QAT: &str = "qat_cnn";

/// The written model, read back, against TensorRT's rules and the ONNX checker.
fn check_written(name: &str, model: &Path) {
    let m = mmq_onnx::load_files(&[model], &mmq_onnx::LoadOptions::default())
        .unwrap_or_else(|e| panic!("{name}: {} does not load back: {e}", model.display()));
    let findings = mmq_backend_trt::lint(&m);
    assert!(
        findings.is_empty(),
        "{name}: {}: {findings:?}",
        model.display()
    );
    let out = oracle(&[OsStr::new("check"), model.as_os_str()]);
    assert!(
        out.status.success(),
        "{name}: onnx.checker on {}: {}",
        model.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// ONNX Runtime's outputs of `model` on the fixture's inputs, by name.
fn ort_outputs(fx: &Fixture, model: &Path, dir: &Path) -> Vec<(String, Vec<f64>)> {
    ort_outputs_on(fx, model, dir, &fx.dir.join("inputs.npz"))
}

/// ONNX Runtime's outputs of `model` on `inputs`, by name; the reference interpreter's (`mmq
/// run`) where the model uses mmq's plugins.
fn ort_outputs_on(
    fx: &Fixture,
    model: &Path,
    dir: &Path,
    inputs: &Path,
) -> Vec<(String, Vec<f64>)> {
    let m = mmq_onnx::load_files(&[model], &mmq_onnx::LoadOptions::default())
        .unwrap_or_else(|e| panic!("{}: {e}", model.display()));
    if !mmq_backend_trt::plugins::uses(&m).is_empty() {
        let feeds: std::collections::HashMap<String, mmq_kernels::RtValue> =
            mmq_kernels::io::read_npz(inputs)
                .unwrap_or_else(|e| panic!("{e}"))
                .into_iter()
                .map(|(n, t)| (n, t.into()))
                .collect();
        return mmq_kernels::Interpreter::new(&m)
            .run(m.entries[0].graph, &feeds)
            .unwrap_or_else(|e| panic!("{}: mmq run {}: {e}", fx.name, model.display()))
            .into_iter()
            .filter_map(|(n, v)| Some((n, v.as_tensor()?.to_f64().ok()?)))
            .collect();
    }
    let out_path = dir.join(format!(
        "{}.{}.ort.npz",
        model.file_stem().unwrap_or_default().to_string_lossy(),
        inputs.file_stem().unwrap_or_default().to_string_lossy()
    ));
    let out = oracle(&[
        OsStr::new("run"),
        model.as_os_str(),
        inputs.as_os_str(),
        OsStr::new("-o"),
        out_path.as_os_str(),
    ]);
    assert!(
        out.status.success(),
        "{}: ONNX Runtime on {}: {}",
        fx.name,
        model.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    values(&out_path)
}

fn values(npz: &Path) -> Vec<(String, Vec<f64>)> {
    mmq_kernels::io::read_npz(npz)
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .filter_map(|(n, t)| t.to_f64().ok().map(|v| (n, v)))
        .collect()
}

#[test]
fn every_fixture_becomes_a_package_tensorrt_accepts_and_onnx_runtime_runs() {
    // INT8 calibrates one model at a time: several-model fixtures go unquantized only.
    let cases: Vec<(Fixture, &str)> = fixtures()
        .into_iter()
        .flat_map(|fx| {
            // FP8 needs opset 19; the QAT CNN (already quantized) is opset 17.
            let quantized: Vec<(Fixture, &str)> = match (fx.models.len(), fx.name.as_str()) {
                (1, ASYMMETRIC_QAT) => vec![(fx.clone(), "int8")],
                (1, _) => vec![
                    (fx.clone(), "int8"),
                    (fx.clone(), "fp8"),
                    (fx.clone(), "int4"),
                ],
                _ => Vec::new(),
            };
            std::iter::once((fx, "fp32")).chain(quantized)
        })
        .collect();
    let failures: Vec<String> = cases
        .par_iter()
        .filter_map(|(fx, tag)| {
            std::panic::catch_unwind(|| {
                let precision = match *tag {
                    "int8" => Precision::of(Scheme::Int8),
                    "fp8" => Precision::of(Scheme::Fp8),
                    "int4" => Precision::of(Scheme::Int4),
                    _ => Precision::Float,
                };
                let (dir, models) = compile_package(fx, tag, precision);
                let reference = values(&fx.dir.join("outputs.npz"));
                let mut compared = 0;
                for model in &models {
                    check_written(&fx.name, model);
                    // The package's reference outputs are what ONNX Runtime computes from its
                    // reference inputs (the same quantized arithmetic; ONNX Runtime runs Q/DQ
                    // units as integer kernels, so a cosine, not equality).
                    let stem = model.file_stem().unwrap_or_default().to_string_lossy();
                    let ref_in = dir.join(format!("{stem}.reference_inputs.npz"));
                    let ref_out = values(&dir.join(format!("{stem}.reference_outputs.npz")));
                    for (name, got) in ort_outputs_on(fx, model, &dir, &ref_in) {
                        let (_, want) = ref_out
                            .iter()
                            .find(|(n, _)| *n == name)
                            .unwrap_or_else(|| panic!("{} {tag}: no reference {name}", fx.name));
                        if *tag == "fp32" && fx.name != ASYMMETRIC_QAT {
                            for (g, w) in got.iter().zip(want) {
                                assert!(
                                    (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
                                    "{} reference {name}: {g} vs {w}",
                                    fx.name
                                );
                            }
                        } else if want.len() > 1 && want.iter().any(|w| *w != 0.0) {
                            let c = cosine(&got, want);
                            assert!(c >= 0.999, "{} {tag} reference {name}: cosine {c}", fx.name);
                        }
                    }
                    for (name, got) in ort_outputs(fx, model, &dir) {
                        let Some((_, want)) = reference.iter().find(|(n, _)| *n == name) else {
                            continue;
                        };
                        compared += 1;
                        assert_eq!(got.len(), want.len(), "{} {tag} {name}", fx.name);
                        if *tag == "fp32" {
                            // ONNX Runtime runs the QAT model's Q/DQ units as integer kernels,
                            // which round each layer's output (as in compile_fixtures.rs).
                            let tol = if fx.name == ASYMMETRIC_QAT {
                                2e-2
                            } else {
                                1e-4
                            };
                            for (g, w) in got.iter().zip(want) {
                                assert!(
                                    (g - w).abs() <= tol * (1.0 + w.abs()),
                                    "{} fp32 {name}: {g} vs {w}",
                                    fx.name
                                );
                            }
                        } else if want.iter().all(|w| w.is_finite())
                            && want.len() > 1
                            && !(*tag == "int4" && name.starts_with("logits_per_"))
                        {
                            // (CLIP's similarity logits are differences of nearly equal
                            // similarities on this random-weight fixture: under INT4 their
                            // cosine is 0.73 here and 0.58 with ONNX Runtime's MatMulNBits, so
                            // INT4 is judged on the embeddings.)
                            let c = cosine(&got, want);
                            let least = if *tag == "int4" { 0.98 } else { 0.99 };
                            assert!(c >= least, "{} {tag} {name}: cosine {c}", fx.name);
                        }
                    }
                }
                assert!(compared > 0, "{} {tag}: no output compared", fx.name);
            })
            .err()
            .map(|e| {
                e.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| format!("{} {tag}: panicked", fx.name))
            })
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_build_script_and_manifest_describe_the_profiles() {
    let fx = fixtures()
        .into_iter()
        .find(|f| f.name == "vit_dynamic")
        .expect("vit_dynamic fixture");
    let (dir, _) = compile_package(&fx, "profiles", Precision::Float);
    let script = std::fs::read_to_string(dir.join("build_engine.sh")).expect("script");
    assert!(script.contains("--stronglyTyped"), "{script}");
    assert!(script.contains("--minShapes=") && script.contains("--maxShapes="));
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).expect("manifest"))
            .expect("JSON");
    let profiles = manifest["profiles"].as_object().expect("profiles");
    assert!(!profiles.is_empty(), "{manifest}");
    let sha = manifest["models"][0]["sha256"]["model.onnx"]
        .as_str()
        .expect("hash");
    assert_eq!(sha.len(), 64);
    // The script runs up to trtexec, which a fake stands in for.
    let (name, _) = profiles.iter().next().expect("a symbol");
    let (code, args, stderr) = run_build_script(&dir, &["--symbol", &format!("{name}=2:3:5")]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(args.contains("--onnx=model.onnx"), "{args}");
    let min = args
        .lines()
        .find(|l| l.starts_with("--minShapes="))
        .expect("min shapes");
    let max = args
        .lines()
        .find(|l| l.starts_with("--maxShapes="))
        .expect("max shapes");
    assert!(
        min.contains(":2x") || min.contains("x2x") || min.ends_with("x2"),
        "{min}"
    );
    assert!(
        max.contains(":5x") || max.contains("x5x") || max.ends_with("x5"),
        "{max}"
    );
    let (code, _, stderr) = run_build_script(&dir, &["--symbol", "no_such_symbol=1:1:1"]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("no symbol no_such_symbol"), "{stderr}");
}

#[test]
fn what_tensorrt_cannot_take_is_refused_before_any_work() {
    // Run-time quantization per tensor has no TensorRT form; per row (through the plugin) and
    // asymmetric INT4 (through the INT4 GEMM plugin) are accepted (trt_plugins.rs).
    let options = |granularity| CompileOptions {
        target: TargetRef::TRT,
        precision: Precision::Int8Dynamic {
            granularity,
            smoothquant: None,
        },
        ..CompileOptions::default()
    };
    let e = options(ActGranularity::PerTensor)
        .check()
        .expect_err("refused")
        .to_string();
    assert!(e.contains("int8-dynamic") && e.contains("trt"), "{e}");
    assert_eq!(options(ActGranularity::PerToken).check(), Ok(()));
    let asym = CompileOptions {
        target: TargetRef::TRT,
        precision: Precision::Int4 {
            int4: mmq_compiler::Int4Options {
                symmetric: false,
                ..Default::default()
            },
            awq: false,
        },
        ..CompileOptions::default()
    };
    assert_eq!(asym.check(), Ok(()));
}

#[test]
fn the_linter_names_what_tensorrt_refuses() {
    // An ONNX Runtime INT8 compile: asymmetric u8 activations, int32 Conv bias; and its fused
    // contrib ops.
    let fx = fixtures()
        .into_iter()
        .find(|f| f.name == "qat_cnn" || f.name == "vit")
        .expect("fixture");
    let m = compiled(
        &fx,
        &CompileOptions {
            target: TargetRef::ORT,
            precision: Precision::of(Scheme::Int8),
            calibration: CalibrationSource::Random { count: 4, seed: 0 },
            accuracy: Accuracy::Off,
            ..CompileOptions::default()
        },
    );
    let findings = mmq_backend_trt::lint(&m);
    let text: Vec<String> = findings.iter().map(ToString::to_string).collect();
    assert!(
        text.iter()
            .any(|f| f.contains("zero points must be constant zeros")
                || f.contains("domain 'com.microsoft'")),
        "{text:?}"
    );
}

#[test]
fn a_precision_map_mixing_int8_int4_and_fp16_gives_a_package_tensorrt_accepts() {
    let fx = fixtures()
        .into_iter()
        .find(|f| f.name == "clip")
        .expect("clip fixture");
    // INT8 vision projections, INT4 text projections, FP16 norms (a TensorRT-friendly map: the
    // committed clip.toml has asymmetric INT4, which TensorRT cannot take).
    let (map, _) = mmq_compiler::precision_map::parse(
        r#"
[default]
scheme = "float"

[[rule]]
name = "vision projections"
ops = ["MatMul", "Gemm"]
modality = "vision"
scheme = "int8"

[[rule]]
name = "text projections"
ops = ["MatMul", "Gemm"]
modality = "text"
scheme = "int4"
block = 32

[[rule]]
name = "norms"
ops = ["LayerNormalization"]
scheme = "fp16"
"#,
        "trt.toml",
    )
    .expect("map");
    let (dir, models) = compile_package(&fx, "mixed", Precision::map(map));
    let reference = values(&fx.dir.join("outputs.npz"));
    for model in &models {
        check_written(&fx.name, model);
        let manifest = std::fs::read_to_string(dir.join("manifest.json")).expect("manifest");
        for kind in [
            "DequantizeLinear i8",
            "DequantizeLinear i4",
            "QuantizeLinear i8",
        ] {
            assert!(manifest.contains(kind), "no {kind} in {manifest}");
        }
        for (name, got) in ort_outputs(&fx, model, &dir) {
            if name.starts_with("logits_per_") {
                continue;
            }
            let (_, want) = reference
                .iter()
                .find(|(n, _)| *n == name)
                .expect("reference");
            let c = cosine(&got, want);
            assert!(c >= 0.98, "clip mixed {name}: cosine {c}");
        }
    }
}

#[test]
fn a_kv_decoder_keeps_total_equal_to_past_plus_seq_at_every_profile_point() {
    let fx = fixtures()
        .into_iter()
        .find(|f| f.name == "gpt2_kv")
        .expect("gpt2_kv fixture");
    let m = compiled(&fx, &trt_defaults());
    let dir = scratch_dir("trt/gpt2_kv-profiles");
    let _ = std::fs::remove_dir_all(&dir);
    let profiles = [("seq", "1:16:32"), ("past_seq", "1:16:64")]
        .into_iter()
        .map(|(n, p)| (n.to_owned(), p.parse().expect("profile")))
        .collect();
    let package = mmq_compiler::export::write_trt(
        &m,
        &fx.models,
        &dir,
        &mmq_backend_trt::PackageOptions {
            profiles,
            ..Default::default()
        },
    )
    .expect("package");
    // Within the model's position table, the reference runs at the opt point.
    assert!(package.notes.is_empty(), "{:?}", package.notes);
    let total = package.profiles["total_seq"];
    assert_eq!((total.min, total.opt, total.max), (2, 32, 96));
    let (code, args, stderr) = run_build_script(&dir, &["--symbol", "seq=2:4:8"]);
    assert_eq!(code, Some(0), "{stderr}");
    for (flag, mask) in [("min", "1x3"), ("opt", "1x20"), ("max", "16x72")] {
        let line = args
            .lines()
            .find(|l| l.starts_with(&format!("--{flag}Shapes=")))
            .expect("shapes");
        assert!(
            line.contains(&format!("attention_mask:{mask}")),
            "{flag}: {line}"
        );
    }
}

#[test]
fn opset_23_exports_are_decomposed_into_ops_the_parser_reads() {
    // PyTorch's dynamo exporter at opset 23 writes `Attention`, `RMSNormalization` and
    // `RotaryEmbedding`, which TensorRT's parser lacks: the `trt` target writes them in standard
    // ops, and ONNX Runtime runs the package's model to the exporter's own outputs.
    let cells: Vec<Fixture> = mmq_tests::matrix_fixtures()
        .into_iter()
        .filter(|f| f.name.contains("dynamo23"))
        .collect();
    assert!(cells.len() >= 8, "{} opset-23 cells", cells.len());
    let failures: Vec<String> = cells
        .par_iter()
        .flat_map(|fx| {
            let dir = scratch_dir(&format!("trt/{}", fx.name.replace('/', "-")));
            let m = compiled(fx, &trt_defaults());
            let mut problems: Vec<String> = mmq_backend_trt::lint(&m)
                .iter()
                .map(|f| format!("{}: {f}", fx.name))
                .collect();
            let model = dir.join("model.onnx");
            mmq_backend_ort::write_model(&m, m.entries[0].graph, &model, &Default::default())
                .unwrap_or_else(|e| panic!("{}: {e}", fx.name));
            let want = values(&fx.dir.join("outputs.npz"));
            for (name, got) in ort_outputs(fx, &model, &dir) {
                let Some((_, w)) = want.iter().find(|(n, _)| *n == name) else {
                    continue;
                };
                let worst = got
                    .iter()
                    .zip(w)
                    .map(|(g, w)| (g - w).abs() / (1.0 + w.abs()))
                    .fold(0.0f64, |a, x| if x.is_nan() || x > a { x } else { a });
                if worst.is_nan() || worst > 1e-4 {
                    problems.push(format!("{} {name}: relative error {worst:e}", fx.name));
                }
            }
            problems
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
