//! TensorRT packages whose models need mmq's plugins: asymmetric INT4 weights
//! (`--quant int4 --asym`, the `MmqMatMulNBits` plugin), per-token INT8 activations
//! (`--quant int8-dynamic --granularity per-token`, `MmqDynamicQuantize` + `MmqDequantize`), the
//! INT8 KV cache (`--kv-cache int8`: the same plugins in blocks of 512 codes, checked against
//! ONNX Runtime running the `ort` target's standard-op form of the same cache) and the PyTorch
//! QAT model's asymmetric uint8 fake-quant units (`MmqQuantize` / `MmqDequantize`).
//!
//! Per package: no linter finding (every plugin node matches a plugin of the manifest), the full
//! ONNX checker, the package's reference outputs equal to what `mmq run` computes from the
//! written `model.onnx` and its reference inputs, and the written model within cosine 0.99 (INT8)
//! or 0.98 (INT4) of the float references. Then the plugin library: its sources type-check with
//! g++ against TensorRT 11.4's headers, `plugins/build.sh` builds `libmmq_plugins.so` with nvcc,
//! and a CPU harness dlopens it and checks every plugin node of the packages (creation from the
//! node's fields, output types and shapes through a mock `IExprBuilder`, formats, the
//! serialization round trip) and each creator's fields against the manifest. On a GPU
//! (`REQUIRE_GPU=1` turns the skip into a failure) the harness also runs two nodes of each
//! plugin per package through `enqueue` on device buffers against the interpreter's results.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use mmq_compiler::{Accuracy, CalibrationSource, CompileOptions, Precision};
use mmq_ir::{DType, Module};
use mmq_kernels::cache::CacheFormat;
use mmq_kernels::{Interpreter, RtValue, Tensor};
use mmq_passes::quant::int8::ActGranularity;
use mmq_passes::{OptLevel, TargetRef};
use mmq_tests::{Fixture, cosine, cuda_tools, fixtures, oracle, repo_root, scratch_dir};
use rayon::prelude::*;

/// One package to build: a fixture and how it is quantized.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Case {
    /// Unquantized (the QAT model's own units).
    Float,
    Int4Asym,
    Int8PerToken,
    /// `--kv-cache int8`: the cache written in INT8 blocks by the plugins.
    KvInt8,
}

impl Case {
    fn tag(self) -> &'static str {
        match self {
            Case::Float => "fp32",
            Case::Int4Asym => "int4-asym",
            Case::Int8PerToken => "int8-per-token",
            Case::KvInt8 => "kv-int8",
        }
    }

    fn options(self) -> CompileOptions {
        let mut o = CompileOptions {
            target: TargetRef::TRT,
            level: OptLevel::O2,
            accuracy: Accuracy::Off,
            calibration: CalibrationSource::Random { count: 4, seed: 0 },
            ..CompileOptions::default()
        };
        match self {
            // Samples are read only to quantize.
            Case::Float => o.calibration = CalibrationSource::Default,
            Case::Int4Asym => {
                o.precision = Precision::Int4 {
                    int4: mmq_compiler::Int4Options {
                        symmetric: false,
                        ..Default::default()
                    },
                    awq: false,
                };
            }
            Case::Int8PerToken => {
                o.precision = Precision::Int8Dynamic {
                    granularity: ActGranularity::PerToken,
                    smoothquant: None,
                };
            }
            Case::KvInt8 => {
                o.calibration = CalibrationSource::Default;
                o.kv_cache = Some(CacheFormat::Int8);
            }
        }
        o
    }

    /// The least cosine to the float references.
    fn least_cosine(self) -> f64 {
        match self {
            Case::Float => 0.9999,
            Case::Int4Asym => 0.98,
            Case::Int8PerToken | Case::KvInt8 => 0.99,
        }
    }
}

/// Every case: the QAT CNN as it is, every single-model transformer fixture with asymmetric INT4
/// and per-token INT8.
fn cases() -> Vec<(Fixture, Case)> {
    let mut out = Vec::new();
    for fx in fixtures() {
        if fx.models.len() != 1 {
            continue;
        }
        if fx.name == "qat_cnn" {
            out.push((fx, Case::Float));
        } else {
            out.push((fx.clone(), Case::Int4Asym));
            if fx.name.ends_with("_kv") {
                out.push((fx.clone(), Case::KvInt8));
            }
            out.push((fx, Case::Int8PerToken));
        }
    }
    out
}

/// Compiles the case into a package; returns its directory.
fn package(fx: &Fixture, case: Case) -> PathBuf {
    let (mut m, _) = mmq_compiler::load::load(&fx.models)
        .and_then(|l| l.verified())
        .unwrap_or_else(|e| panic!("{}: {e}", fx.name));
    mmq_compiler::compile(&mut m, &case.options())
        .unwrap_or_else(|e| panic!("{} {}: {e}", fx.name, case.tag()));
    let dir = scratch_dir(&format!("trt-plugins/{}-{}", fx.name, case.tag()));
    let package = mmq_compiler::export::write_trt(
        &m,
        &fx.models,
        &dir,
        &mmq_backend_trt::PackageOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{} {}: {e}", fx.name, case.tag()));
    assert!(
        package.findings.is_empty(),
        "{} {}: {:?}",
        fx.name,
        case.tag(),
        package.findings
    );
    dir
}

fn load(model: &Path) -> Module {
    mmq_onnx::load_files(&[model], &mmq_onnx::LoadOptions::default())
        .unwrap_or_else(|e| panic!("{} does not load back: {e}", model.display()))
}

fn npz(path: &Path) -> HashMap<String, Tensor> {
    mmq_kernels::io::read_npz(path)
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .collect()
}

/// `mmq run`: the interpreter on `m`'s entry with `inputs`.
fn run(m: &Module, inputs: &HashMap<String, Tensor>) -> Vec<(String, RtValue)> {
    let feeds: HashMap<String, RtValue> = inputs
        .iter()
        .map(|(n, t)| (n.clone(), RtValue::from(t.clone())))
        .collect();
    Interpreter::new(m)
        .run(m.entries[0].graph, &feeds)
        .unwrap_or_else(|e| panic!("mmq run: {e}"))
}

fn f64s(v: &RtValue) -> Vec<f64> {
    v.as_tensor()
        .and_then(|t| t.to_f64().ok())
        .unwrap_or_default()
}

/// Checks one package; returns its plugin uses as harness spec lines.
fn check_package(fx: &Fixture, case: Case, dir: &Path) -> Vec<SpecLine> {
    let tag = format!("{} {}", fx.name, case.tag());
    let model = dir.join("model.onnx");
    let m = load(&model);
    let findings = mmq_backend_trt::lint(&m);
    assert!(findings.is_empty(), "{tag}: {findings:?}");
    let out = oracle(&[std::ffi::OsStr::new("check"), model.as_os_str()]);
    assert!(
        out.status.success(),
        "{tag}: onnx.checker: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The manifest lists the plugins the model uses, with the nodes.
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).expect("manifest"))
            .expect("JSON");
    let uses = mmq_backend_trt::plugins::uses(&m);
    assert!(!uses.is_empty(), "{tag}: no plugin in the model");
    let listed: Vec<&str> = manifest["plugins"]
        .as_array()
        .expect("plugins")
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(
        listed,
        uses.keys().copied().collect::<Vec<_>>(),
        "{tag}: manifest plugins"
    );
    // `mmq run` on the written model reproduces the package's reference outputs.
    let ref_in = npz(&dir.join("model.reference_inputs.npz"));
    let ref_out = npz(&dir.join("model.reference_outputs.npz"));
    for (name, got) in run(&m, &ref_in) {
        let want = ref_out[&name].to_f64().expect("numbers");
        let got = f64s(&got);
        assert_eq!(got.len(), want.len(), "{tag} {name}");
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
                "{tag} reference {name}: {g} vs {w}"
            );
        }
    }
    if case == Case::KvInt8 {
        same_as_the_ort_cache_form(fx, dir, &ref_in, &ref_out);
        return spec_lines(&m, &ref_in, &format!("{}-{}", fx.name, case.tag()));
    }
    // Against the float references on the fixture's inputs.
    let inputs = npz(&fx.dir.join("inputs.npz"));
    let reference = npz(&fx.dir.join("outputs.npz"));
    let mut compared = 0;
    for (name, got) in run(&m, &inputs) {
        let Some(want) = reference.get(&name) else {
            continue;
        };
        let want = want.to_f64().expect("numbers");
        // CLIP's similarity logits are differences of nearly equal similarities on this
        // random-weight fixture (see trt_package.rs): INT4 is judged on the embeddings.
        if case == Case::Int4Asym && name.starts_with("logits_per_") {
            continue;
        }
        compared += 1;
        let c = cosine(&f64s(&got), &want);
        assert!(c >= case.least_cosine(), "{tag} {name}: cosine {c}");
    }
    assert!(compared > 0, "{tag}: no output compared");
    spec_lines(&m, &ref_in, &format!("{}-{}", fx.name, case.tag()))
}

/// The INT8 KV cache through the plugins has the interface of ONNX Runtime's standard-op form
/// and its arithmetic: ONNX Runtime runs that form (compiled for `ort`) on the package's
/// reference inputs, and its logits and cache codes agree with the package's references.
fn same_as_the_ort_cache_form(
    fx: &Fixture,
    dir: &Path,
    ref_in: &HashMap<String, Tensor>,
    ref_out: &HashMap<String, Tensor>,
) {
    let (mut m, _) = mmq_compiler::load::load(&fx.models)
        .and_then(|l| l.verified())
        .unwrap_or_else(|e| panic!("{}: {e}", fx.name));
    let options = CompileOptions {
        target: TargetRef::ORT,
        ..Case::KvInt8.options()
    };
    mmq_compiler::compile(&mut m, &options).unwrap_or_else(|e| panic!("{}: {e}", fx.name));
    let ort_model = dir.join("ort-form.onnx");
    mmq_backend_ort::write_model(
        &m,
        m.entries[0].graph,
        &ort_model,
        &mmq_backend_ort::ExportOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{}: {e}", fx.name));
    let inputs = dir.join("model.reference_inputs.npz");
    let out_path = dir.join("ort-form.outputs.npz");
    let out = oracle(&[
        std::ffi::OsStr::new("run"),
        ort_model.as_os_str(),
        inputs.as_os_str(),
        std::ffi::OsStr::new("-o"),
        out_path.as_os_str(),
    ]);
    assert!(
        out.status.success(),
        "{}: ONNX Runtime on the ort cache form: {}",
        fx.name,
        String::from_utf8_lossy(&out.stderr)
    );
    let ort = npz(&out_path);
    assert_eq!(ref_in.len(), m.graphs[m.entries[0].graph].inputs.len());
    for (name, want) in ref_out {
        let got = ort[name].to_f64().expect("numbers");
        let want = want.to_f64().expect("numbers");
        if name.ends_with("_scale") || name == "logits" {
            let c = cosine(&got, &want);
            assert!(
                c >= 0.99999,
                "{} kv-int8 {name}: cosine {c} to ONNX Runtime",
                fx.name
            );
        } else {
            let same = got.iter().zip(&want).filter(|(g, w)| g == w).count();
            assert!(
                same * 1000 >= want.len() * 999,
                "{} kv-int8 {name}: {same} of {} codes equal to ONNX Runtime's",
                fx.name,
                want.len()
            );
        }
    }
}

fn type_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::I8 => "i8",
        DType::U8 => "u8",
        DType::I32 => "i32",
        DType::I64 => "i64",
        other => panic!("a plugin tensor of type {other}"),
    }
}

/// Device data of a spec line: the operands and results of one plugin node, raw.
struct Data {
    prefix: String,
    files: Vec<(String, Vec<u8>)>,
}

/// A spec line and, for the first nodes of each plugin in a package, its device data.
type SpecLine = (String, Option<Data>);

/// The harness's spec lines for the plugin nodes of `m`, with the concrete types and shapes of
/// their operands and results on `inputs` (found by running `m` with them as extra outputs);
/// the first two nodes of each plugin carry their operands and results for the device check.
fn spec_lines(m: &Module, inputs: &HashMap<String, Tensor>, package: &str) -> Vec<SpecLine> {
    let mut probe = m.clone();
    let g = probe.entries[0].graph;
    let plugin_nodes: Vec<mmq_ir::Node> = probe.graphs[g]
        .nodes()
        .iter()
        .copied()
        .filter(|&n| probe.nodes[n].op.domain() == mmq_ir::plugin::DOMAIN)
        .collect();
    let mut watched = Vec::new();
    for &n in &plugin_nodes {
        let nd = &probe.nodes[n];
        watched.extend(nd.inputs.iter().flatten().copied());
        watched.extend(nd.outputs.iter().flatten().copied());
    }
    let first_extra = probe.graphs[g].outputs.len();
    probe.graphs[g].outputs.extend(watched.iter().copied());
    let outs = run(&probe, inputs);
    let seen: HashMap<mmq_ir::Value, &RtValue> = watched
        .iter()
        .copied()
        .zip(outs[first_extra..].iter().map(|(_, v)| v))
        .collect();
    let tensors = |vals: &[Option<mmq_ir::Value>]| {
        vals.iter()
            .flatten()
            .map(|v| {
                let t = seen[v].as_tensor().expect("a tensor");
                let dims: Vec<String> = t.shape.iter().map(ToString::to_string).collect();
                format!("{}:{}", type_name(t.dtype), dims.join("x"))
            })
            .collect::<Vec<_>>()
            .join(";")
    };
    let mut per_plugin: HashMap<String, usize> = HashMap::new();
    plugin_nodes
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let nd = &probe.nodes[n];
            let count = per_plugin.entry(nd.op.op_type().to_owned()).or_default();
            *count += 1;
            let data = (*count <= 2).then(|| {
                let prefix = format!("data/{package}-{i}");
                let mut files = Vec::new();
                for (kind, vals) in [("in", &nd.inputs), ("out", &nd.outputs)] {
                    for (j, v) in vals.iter().flatten().enumerate() {
                        let t = seen[v].as_tensor().expect("a tensor");
                        files.push((
                            format!("{prefix}.{kind}{j}.bin"),
                            t.to_bytes().expect("raw bytes"),
                        ));
                    }
                }
                Data { prefix, files }
            });
            let fields: Vec<String> = nd
                .op
                .attrs()
                .into_iter()
                .filter(|(k, _)| !k.starts_with("plugin_"))
                .map(|(k, a)| match a {
                    mmq_ir::Attr::Int(v) => format!("{k}={v}"),
                    other => panic!("field {k} = {other:?}"),
                })
                .collect();
            let mut line = format!(
                "{}|{}|{}|{}",
                nd.op.op_type(),
                fields.join(","),
                tensors(&nd.inputs),
                tensors(&nd.outputs)
            );
            if let Some(d) = &data {
                line.push('|');
                line.push_str(&d.prefix);
            }
            (line, data)
        })
        .collect()
}

#[test]
fn plugin_packages_pass_every_check_and_the_library_builds_and_loads() {
    let results: Vec<Result<(PathBuf, Vec<SpecLine>), String>> = cases()
        .par_iter()
        .map(|(fx, case)| {
            std::panic::catch_unwind(|| {
                let dir = package(fx, *case);
                let spec = check_package(fx, *case, &dir);
                (dir, spec)
            })
            .map_err(|e| {
                e.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| format!("{} {}: panicked", fx.name, case.tag()))
            })
        })
        .collect();
    let failures: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        failures.is_empty(),
        "{}",
        failures
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    let packages: Vec<(PathBuf, Vec<SpecLine>)> = results.into_iter().flatten().collect();
    // The library of one package (every package writes the same sources), built apart, with the
    // harness, its spec and the device data: what tools/gpu-check.sh takes to the GPU.
    let lib_dir = scratch_dir("trt-plugins-library");
    for entry in std::fs::read_dir(packages[0].0.join("plugins")).expect("plugins/") {
        let path = entry.expect("entry").path();
        std::fs::copy(&path, lib_dir.join(path.file_name().expect("name"))).expect("copy");
    }
    std::fs::create_dir_all(lib_dir.join("data")).expect("data/");
    let mut spec: Vec<String> = Vec::new();
    for (line, data) in packages.iter().flat_map(|(_, s)| s) {
        for (file, bytes) in data.iter().flat_map(|d| &d.files) {
            std::fs::write(lib_dir.join(file), bytes).expect("device data");
        }
        spec.push(line.clone());
    }
    // Every plugin of the schema is used somewhere.
    for p in &mmq_ir::plugin::PLUGINS {
        assert!(
            spec.iter().any(|l| l.starts_with(&format!("{}|", p.name))),
            "no case uses {}",
            p.name
        );
        let fields: Vec<&str> = p.fields.iter().map(|f| f.name).collect();
        spec.push(format!("fields {} {}", p.name, fields.join(",")));
    }
    build_and_load(&lib_dir, &spec);
}

/// g++ type-checks the plugin sources against TensorRT's headers, build.sh builds the library
/// with nvcc, and the CPU harness loads it and checks `spec`.
fn build_and_load(plugins: &Path, spec: &[String]) {
    let Some((nvcc, cuda_include)) = cuda_tools("the plugin library build") else {
        return;
    };
    let trt = mmq_tests::tensorrt_headers();
    let gxx = |args: &[&std::ffi::OsStr]| {
        let out = Command::new("g++")
            .args(["-std=c++17", "-Wall", "-Wextra", "-Werror", "-isystem"])
            .arg(&trt)
            .arg("-isystem")
            .arg(&cuda_include)
            .args(args)
            .output()
            .expect("g++");
        assert!(
            out.status.success(),
            "g++ {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    gxx(&[
        "-fsyntax-only".as_ref(),
        plugins.join("mmq_plugins.cpp").as_os_str(),
    ]);
    let out = Command::new("bash")
        .arg(plugins.join("build.sh"))
        .env("NVCC", &nvcc)
        .env("TENSORRT_INCLUDE", &trt)
        .env("CUDA_ARCHS", "90")
        .output()
        .expect("build.sh");
    assert!(
        out.status.success(),
        "build.sh: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let lib = plugins.join("libmmq_plugins.so");
    assert!(lib.is_file(), "build.sh wrote no {}", lib.display());
    let harness = plugins.join("harness");
    let source = repo_root().join("backend-trt/tests/plugin_harness.cpp");
    let cuda_lib = cuda_include
        .parent()
        .map(|p| p.join("lib"))
        .unwrap_or_default();
    gxx(&[
        source.as_os_str(),
        "-o".as_ref(),
        harness.as_os_str(),
        "-L".as_ref(),
        cuda_lib.as_os_str(),
        "-lcudart_static".as_ref(),
        "-ldl".as_ref(),
        "-lpthread".as_ref(),
        "-lrt".as_ref(),
    ]);
    let spec_path = plugins.join("harness.spec");
    std::fs::write(&spec_path, spec.join("\n") + "\n").expect("spec");
    let out = Command::new(&harness)
        .arg(&lib)
        .arg(&spec_path)
        .output()
        .expect("harness");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the plugin harness failed:\n{}{}",
        text.lines()
            .filter(|l| l.starts_with("FAIL"))
            .collect::<Vec<_>>()
            .join("\n"),
        String::from_utf8_lossy(&out.stderr)
    );
    let checks = text.lines().filter(|l| l.starts_with("ok ")).count();
    assert!(checks > spec.len(), "{text}");
    // On a GPU: every node with device data through enqueue, against the CPU's results.
    let out = Command::new(&harness)
        .arg(&lib)
        .arg(&spec_path)
        .arg("--enqueue")
        .output()
        .expect("harness --enqueue");
    let text = String::from_utf8_lossy(&out.stdout);
    match out.status.code() {
        Some(0) => {
            let device = text.lines().filter(|l| l.contains("device output")).count();
            assert!(device > 0, "{text}");
            let _ = writeln!(
                std::io::stderr(),
                "plugin enqueue: {device} device results match the CPU"
            );
        }
        Some(3) => {
            assert!(
                std::env::var("REQUIRE_GPU").as_deref() != Ok("1"),
                "REQUIRE_GPU=1: {text}"
            );
            let _ = writeln!(
                std::io::stderr(),
                "skipping the plugins' enqueue on the device (GPU test): {}",
                text.trim()
            );
        }
        _ => panic!(
            "the plugins' enqueue on the device failed:\n{}{}",
            text.lines()
                .filter(|l| l.starts_with("FAIL"))
                .collect::<Vec<_>>()
                .join("\n"),
            String::from_utf8_lossy(&out.stderr)
        ),
    }
    let _ = writeln!(
        std::io::stderr(),
        "plugin harness: {checks} checks passed over {} spec lines",
        spec.len()
    );
}
