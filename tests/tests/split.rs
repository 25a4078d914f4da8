//! The modality split (`--split`, implied by `--image-cache`): every merged vision + language
//! fixture and export-matrix cell (the `llava` fixture, the five `llava_*` cells, the CLIP model
//! whose towers meet in `logits_per_image`) becomes a `vision_encoder` and a `language_model`
//! whose outputs, chained, equal the merged graph's: in the reference interpreter (the package
//! runner, against the merged module at the same level) and in ONNX Runtime (the package's
//! stages chained, against the merged model compiled the same way), within 1e-5 relative.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use mmq_compiler::{Accuracy, CompileOptions, compile};
use mmq_ir::Module;
use mmq_kernels::{Interpreter, RtValue};
use mmq_passes::OptLevel;
use mmq_tests::{matrix_fixtures, oracle, repo_root, scratch_dir};

/// The merged multimodal models: (name, directory).
fn merged() -> Vec<(String, PathBuf)> {
    let mut out = vec![
        ("llava".to_owned(), repo_root().join("tests/fixtures/llava")),
        ("clip".to_owned(), repo_root().join("tests/fixtures/clip")),
    ];
    out.extend(
        matrix_fixtures()
            .into_iter()
            .filter(|f| f.name.starts_with("matrix/llava_"))
            .map(|f| (f.name, f.dir)),
    );
    assert_eq!(out.len(), 7, "the llava matrix cells: {out:?}");
    out
}

fn load(path: &Path) -> Module {
    let (m, _) = mmq_compiler::load::load(&[path.to_path_buf()])
        .and_then(|l| l.verified())
        .unwrap_or_else(|e| panic!("{}: {}", path.display(), e.rendered));
    m
}

fn options(level: OptLevel, split: bool) -> CompileOptions {
    CompileOptions {
        level,
        split,
        accuracy: Accuracy::Off,
        ..CompileOptions::default()
    }
}

fn inputs(dir: &Path) -> HashMap<String, RtValue> {
    mmq_kernels::io::read_npz(&dir.join("inputs.npz"))
        .expect("inputs")
        .into_iter()
        .map(|(n, t)| (n, RtValue::from(t)))
        .collect()
}

fn values(v: &RtValue) -> Vec<f64> {
    v.as_tensor().expect("tensor").to_f64().expect("numbers")
}

/// `|a - b| <= 1e-5 * (1 + |b|)` everywhere.
fn assert_close(what: &str, a: &[f64], b: &[f64]) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let worst = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / (1.0 + y.abs()))
        .fold(0.0, f64::max);
    assert!(worst <= 1e-5, "{what}: relative difference {worst:e}");
}

#[test]
fn split_pipelines_compute_what_the_merged_graph_computes() {
    for (name, dir) in merged() {
        let model = dir.join("model.onnx");
        for level in [OptLevel::O0, OptLevel::O2] {
            let what = format!("{name} at {level}");
            let mut whole = load(&model);
            compile(&mut whole, &options(level, false)).unwrap_or_else(|e| panic!("{what}: {e}"));
            let mut split = load(&model);
            let report = compile(&mut split, &options(level, true))
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let names: Vec<&str> = split
                .entries
                .iter()
                .map(|e| split.graphs[e.graph].name.as_str())
                .collect();
            assert_eq!(names, ["vision_encoder", "language_model"], "{what}");
            assert!(!split.links.is_empty(), "{what}: no link");
            let vision = &split.graphs[split.entries[0].graph];
            assert!(
                vision
                    .inputs
                    .iter()
                    .all(|&v| split.values[v].name.as_deref() == Some("pixel_values")),
                "{what}: the vision encoder reads more than the image"
            );
            let notes: Vec<&String> = report.passes[0].notes.iter().collect();
            assert!(
                report.passes[0].name == "modality-split"
                    && notes.iter().any(|n| n.contains("split")),
                "{what}: {notes:?}"
            );

            // The interpreter: the merged module against the package runner.
            let feeds = inputs(&dir);
            let want = Interpreter::new(&whole)
                .run(whole.entries[0].graph, &feeds)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let pkg = scratch_dir(&format!("split-{}-{level}", name.replace('/', "-")));
            mmq_compiler::export::write_package(
                &split,
                std::slice::from_ref(&model),
                &pkg,
                &options(level, true),
                &Default::default(),
            )
            .unwrap_or_else(|e| panic!("{what}: {e}"));
            let package = mmq_deploy::Package::open(&pkg).unwrap_or_else(|e| panic!("{what}: {e}"));
            let got = package
                .run(&feeds)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            for (out, value) in &want {
                let found = got
                    .iter()
                    .find(|o| &o.name == out)
                    .unwrap_or_else(|| panic!("{what}: the split computes no '{out}'"));
                assert_close(
                    &format!("{what}: interpreter '{out}'"),
                    &values(&found.value),
                    &values(value),
                );
            }

            // ONNX Runtime: the merged model compiled the same way against the chained stages.
            let merged_file = pkg.join("merged.onnx");
            mmq_compiler::export::write(&whole, &[], &merged_file).expect("write merged");
            let merged_out = pkg.join("merged-out.npz");
            let inputs_npz = dir.join("inputs.npz");
            let run = oracle(&[
                OsStr::new("run"),
                merged_file.as_os_str(),
                inputs_npz.as_os_str(),
                OsStr::new("-o"),
                merged_out.as_os_str(),
            ]);
            assert!(
                run.status.success(),
                "{what}: {}",
                String::from_utf8_lossy(&run.stderr)
            );
            std::fs::remove_file(&merged_file).expect("remove");
            let split_out = pkg.join("split-out.npz");
            let run = oracle(&[
                OsStr::new("run-pipeline"),
                pkg.as_os_str(),
                inputs_npz.as_os_str(),
                OsStr::new("-o"),
                split_out.as_os_str(),
            ]);
            assert!(
                run.status.success(),
                "{what}: {}",
                String::from_utf8_lossy(&run.stderr)
            );
            let read = |p: &Path| -> HashMap<String, Vec<f64>> {
                mmq_kernels::io::read_npz(p)
                    .expect("npz")
                    .into_iter()
                    .map(|(n, t)| (n, t.to_f64().expect("numbers")))
                    .collect()
            };
            let (a, b) = (read(&merged_out), read(&split_out));
            for (out, v) in &a {
                let got = b
                    .get(out)
                    .unwrap_or_else(|| panic!("{what}: ONNX Runtime: no '{out}' from the split"));
                assert_close(&format!("{what}: ONNX Runtime '{out}'"), got, v);
            }
        }
    }
}

#[test]
fn graphs_that_are_not_merged_are_left_whole_with_a_reason() {
    for (rel, why) in [
        (
            "tests/fixtures/vit/model.onnx",
            "not a merged multimodal graph",
        ),
        (
            "tests/fixtures/gpt2_kv/model.onnx",
            "it has no vision input",
        ),
    ] {
        let mut m = load(&repo_root().join(rel));
        let report = compile(&mut m, &options(OptLevel::O1, true)).expect("compile");
        assert_eq!(m.entries.len(), 1, "{rel}");
        let notes = &report.passes[0].notes;
        assert!(notes.iter().any(|n| n.contains(why)), "{rel}: {notes:?}");
    }
    // With --image-cache the scales enter beside the features; every link still joins an output
    // and an input of one name (links count ports by position).
    let mut m = load(&repo_root().join("tests/fixtures/llava/model.onnx"));
    let cached = CompileOptions {
        image_cache: Some(mmq_kernels::cache::CacheFormat::Int4),
        ..options(OptLevel::O1, false)
    };
    compile(&mut m, &cached).expect("image cache");
    assert!(!m.links.is_empty());
    for l in &m.links {
        let from = m.graphs[l.from.0].outputs[l.from.1 as usize];
        let to = m.graphs[l.to.0].inputs[l.to.1 as usize];
        assert_eq!(m.values[from].name, m.values[to].name, "{l:?}");
    }
    // A pipeline already split (the vision encoder's output feeds the decoder by a link) stays
    // as it is when split again.
    let mut m = load(&repo_root().join("tests/fixtures/llava/model.onnx"));
    compile(&mut m, &options(OptLevel::O1, true)).expect("split");
    let before = mmq_ir::text::print(&m);
    let report = compile(&mut m, &options(OptLevel::O0, true)).expect("again");
    assert_eq!(mmq_ir::text::print(&m), before);
    assert!(
        report.passes[0]
            .notes
            .iter()
            .any(|n| n.contains("split already")),
        "{:?}",
        report.passes[0].notes
    );
}
