//! The hostile-input corpus (`tests/hostile/`): every case ends with exit 1 or 2 and a
//! diagnostic naming the file and the node or tensor; never a panic or an abort; the input is
//! left as it was and nothing is left behind.

mod common;

use std::path::Path;

use common::{repo, run_in, scratch};

/// Runs `args` in a fresh scratch directory; checks the exit code, that stderr holds every
/// string of `want` and no panic, that the corpus files are unchanged and that the directory
/// stays empty.
fn refused(name: &str, args: &[&str], want: &[&str]) {
    let dir = scratch(&format!("hostile-{name}"));
    let corpus = repo().join("tests/hostile");
    let before = snapshot(&corpus);
    let (code, _, stderr) = run_in(&dir, args);
    assert!(code == 1 || code == 2, "{name}: exit {code}\n{stderr}");
    assert!(
        !stderr.contains("panicked") && !stderr.contains("memory allocation"),
        "{name}: {stderr}"
    );
    for w in want {
        assert!(stderr.contains(w), "{name}: no '{w}' in\n{stderr}");
    }
    assert_eq!(snapshot(&corpus), before, "{name}: the corpus changed");
    let left: Vec<_> = std::fs::read_dir(&dir)
        .expect("scratch")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "{name}: left behind {left:?}");
}

/// Every file's name and bytes.
fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .expect("corpus")
        .flatten()
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).expect("read"),
            )
        })
        .collect();
    out.sort();
    out
}

fn file(name: &str) -> String {
    repo()
        .join("tests/hostile")
        .join(name)
        .display()
        .to_string()
}

#[test]
fn results_too_large_for_memory_are_errors_naming_the_node() {
    let x = file("x.npz");
    let i = file("i.npz");
    for (model, inputs, node) in [
        ("expand_1e12.onnx", &x, "big_expand"),
        ("cos_of_1e12.onnx", &x, "big_fill"),
        ("pad_1e12.onnx", &x, "big_pad"),
        ("onehot_1e12.onnx", &i, "big_onehot"),
    ] {
        refused(
            model,
            &["run", &file(model), "--inputs", inputs],
            &[node, "exceeds the memory limit", "--max-memory"],
        );
    }
}

#[test]
fn array_headers_whose_size_wraps_or_explodes_are_errors_naming_the_file() {
    let vit = repo()
        .join("tests/fixtures/vit/model.onnx")
        .display()
        .to_string();
    for (npy, want) in [
        ("wrapping_shape.npy", "4611686018427387904, 4"),
        ("huge_shape.npy", "memory limit"),
    ] {
        let input = format!("pixel_values={}", file(npy));
        refused(npy, &["run", &vit, "--input", &input], &[npy, want]);
    }
}

#[test]
fn the_memory_limit_is_a_command_line_option() {
    let vit = repo().join("tests/fixtures/vit");
    let model = vit.join("model.onnx").display().to_string();
    let inputs = vit.join("inputs.npz").display().to_string();
    refused(
        "max-memory",
        &["run", &model, "--inputs", &inputs, "--max-memory", "1KiB"],
        &["inputs.npz", "pixel_values", "memory limit of 1024 bytes"],
    );
    refused(
        "max-memory-unit",
        &["run", &model, "--inputs", &inputs, "--max-memory", "12X"],
        &["unknown unit"],
    );
    let dir = scratch("hostile-max-memory-ok");
    let (code, _, stderr) = run_in(
        &dir,
        &["run", &model, "--inputs", &inputs, "--max-memory", "1GiB"],
    );
    assert_eq!(code, 0, "{stderr}");
}
