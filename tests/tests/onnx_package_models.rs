//! Every model that ships inside the `onnx` Python package (`onnx/backend/test/data`: real CNNs
//! such as ResNet-50, DenseNet-121 and Inception, PyTorch-converted layers, and small graphs with
//! sequences, loops and strings) converts with mmq, passes `onnx.checker` whenever the original
//! does, and gives bitwise-identical outputs in ONNX Runtime.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use mmq_tests::{python_ok, repo_root, scratch_dir};

fn onnx_data_dir() -> PathBuf {
    let out = python_ok(
        "python",
        &[
            "-c",
            "import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), 'backend', 'test', 'data'))",
        ],
    );
    PathBuf::from(out.trim())
}

fn models(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            models(&p, out);
        } else if p.extension() == Some(OsStr::new("onnx")) {
            out.push(p);
        }
    }
}

#[test]
fn onnx_package_models_round_trip() {
    let data = onnx_data_dir();
    let mut found = Vec::new();
    models(&data, &mut found);
    assert!(
        found.len() > 100,
        "expected the onnx package's test models under {}",
        data.display()
    );
    let scratch = scratch_dir("onnx-package-models");
    let mut pairs = String::new();
    let mut failures = Vec::new();
    for (i, model) in found.iter().enumerate() {
        let out = scratch.join(format!("{i}")).join("model.onnx");
        std::fs::create_dir_all(out.parent().expect("dir")).expect("scratch dir");
        let converted = mmq_onnx::load_files(&[model], &Default::default())
            .map_err(|e| e.to_string())
            .and_then(|m| {
                mmq_backend_ort::write_model(&m, m.entries[0].graph, &out, &Default::default())
                    .map_err(|e| e.to_string())
            });
        if let Err(e) = converted {
            failures.push(format!("{}: mmq: {e}", model.display()));
        }
        pairs.push_str(&format!("{}\t{}\n", model.display(), out.display()));
    }
    let list = scratch.join("pairs.tsv");
    let result = scratch.join("result.json");
    std::fs::write(&list, pairs).expect("write pairs");
    python_ok(
        "pair_eval",
        &[
            repo_root().join("tools/pair_eval.py").as_os_str(),
            list.as_os_str(),
            OsStr::new("-o"),
            result.as_os_str(),
        ],
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&result).expect("result")).expect("json");
    let mut compared = 0;
    for model in &found {
        let r = &json[model.display().to_string()];
        let checker = r["checker"].as_str().unwrap_or("missing");
        if checker != "ok" && checker != "original fails too" {
            failures.push(format!("{}: onnx.checker: {checker}", model.display()));
        }
        if r["original"] == "ok" {
            compared += 1;
            if r["converted"] != "identical" {
                failures.push(format!("{}: {}", model.display(), r["converted"]));
            }
        }
    }
    assert!(compared > 100, "only {compared} models could be compared");
    assert!(
        failures.is_empty(),
        "{} of {} models:\n{}",
        failures.len(),
        found.len(),
        failures.join("\n")
    );
}
