//! `mmq run`: the vit fixture through the interpreter matches ONNX Runtime's outputs; input
//! errors name the input and what was expected (snapshot-tested).

mod common;

use std::path::{Path, PathBuf};

use common::{repo, run_in, scratch};

use mmq_kernels::io::{read_npz, write_npz};
use mmq_kernels::{Data, Tensor};

fn vit() -> PathBuf {
    repo().join("tests/fixtures/vit")
}

fn pixel_values() -> Tensor {
    read_npz(&vit().join("inputs.npz"))
        .expect("vit inputs")
        .into_iter()
        .find(|(n, _)| n == "pixel_values")
        .expect("pixel_values")
        .1
}

fn max_rel_err(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!((a.dtype, &a.shape), (b.dtype, &b.shape));
    let (x, y) = (a.to_f64().expect("numbers"), b.to_f64().expect("numbers"));
    x.iter()
        .zip(&y)
        .map(|(p, q)| (p - q).abs() / (1.0 + q.abs()))
        .fold(0.0, f64::max)
}

#[test]
fn vit_outputs_match_onnx_runtime() {
    let dir = scratch("run-vit");
    let model = vit().join("model.onnx");
    let inputs = vit().join("inputs.npz");
    let out = dir.join("out.npz");
    let (code, stdout, stderr) = run_in(
        &dir,
        &[
            "run",
            model.to_str().expect("utf-8 path"),
            "--inputs",
            inputs.to_str().expect("utf-8 path"),
            "-o",
            "out.npz",
            "--stats",
        ],
    );
    assert_eq!(code, 0, "stderr: {stderr}");
    assert!(stdout.contains("peak live tensor bytes:"), "{stdout}");
    assert!(stdout.contains("MatMul"), "{stdout}");
    let got = read_npz(&out).expect("output npz");
    let want = read_npz(&vit().join("outputs.npz")).expect("expected npz");
    assert_eq!(
        got.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        want.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    for ((name, a), (_, b)) in got.iter().zip(&want) {
        let e = max_rel_err(a, b);
        assert!(e <= 1e-4, "{name}: max |a-b|/(1+|b|) = {e:e}");
    }
    // No temporary files are left beside the output.
    let left: Vec<_> = std::fs::read_dir(&dir)
        .expect("dir")
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .collect();
    assert_eq!(left, ["out.npz"]);
}

/// `--repeat N`: the times are the mean of N warm runs (calls per run, not summed), and the
/// outputs the last run's, equal to one run's.
#[test]
fn repeat_reports_warm_runs_per_run() {
    let dir = scratch("run-repeat");
    let model = vit().join("model.onnx");
    let inputs = vit().join("inputs.npz");
    let args = |extra: &[&'static str], out: &'static str| {
        let mut a = vec![
            "run".to_owned(),
            model.to_str().expect("utf-8 path").to_owned(),
            "--inputs".to_owned(),
            inputs.to_str().expect("utf-8 path").to_owned(),
            "--stats".to_owned(),
            "-o".to_owned(),
            out.to_owned(),
        ];
        a.extend(extra.iter().map(|s| (*s).to_owned()));
        a
    };
    let calls = |stdout: &str, op: &str| -> String {
        stdout
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{op} ")))
            .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
            .unwrap_or_else(|| panic!("no {op} line in {stdout}"))
    };
    let run = |a: Vec<String>| {
        let refs: Vec<&str> = a.iter().map(String::as_str).collect();
        let (code, stdout, stderr) = run_in(&dir, &refs);
        assert_eq!(code, 0, "stderr: {stderr}");
        stdout
    };
    let once = run(args(&[], "once.npz"));
    let many = run(args(&["--repeat", "3"], "many.npz"));
    assert!(once.contains("time per op:\n"), "{once}");
    assert!(
        many.contains("time per op (mean of 3 runs after the first):"),
        "{many}"
    );
    assert_eq!(calls(&once, "MatMul"), calls(&many, "MatMul"));
    let a = read_npz(&dir.join("once.npz")).expect("npz");
    let b = read_npz(&dir.join("many.npz")).expect("npz");
    assert_eq!(a, b);
}

#[test]
fn summary_without_output_file() {
    let dir = scratch("run-summary");
    let pix = dir.join("pix.npy");
    // `--input NAME=FILE.npy` alone supplies the graph's only input.
    write_single_npy(&pix, &pixel_values());
    let model = vit().join("model.onnx");
    let (code, stdout, stderr) = run_in(
        &dir,
        &[
            "run",
            model.to_str().expect("utf-8 path"),
            "--input",
            "pixel_values=pix.npy",
        ],
    );
    assert_eq!(code, 0, "stderr: {stderr}");
    assert!(
        stdout.starts_with("last_hidden_state: f32[2, 17, 64] min "),
        "{stdout}"
    );
    assert!(
        stdout.contains("\npooler_output: f32[2, 64] min "),
        "{stdout}"
    );
}

/// A `.npy` file: the member of a one-array `.npz` (stored uncompressed) is exactly that.
fn write_single_npy(path: &Path, t: &Tensor) {
    let tmp = path.with_extension("tmp.npz");
    write_npz(&tmp, &[("x", t)]).expect("write");
    let bytes = std::fs::read(&tmp).expect("read");
    // Local file header: 30 bytes + name + extra; the data follows, stored.
    let name_len = u16::from_le_bytes([bytes[26], bytes[27]]) as usize;
    let extra_len = u16::from_le_bytes([bytes[28], bytes[29]]) as usize;
    let size = u32::from_le_bytes([bytes[18], bytes[19], bytes[20], bytes[21]]) as usize;
    let start = 30 + name_len + extra_len;
    std::fs::write(path, &bytes[start..start + size]).expect("write npy");
    let _ = std::fs::remove_file(&tmp);
    assert_eq!(mmq_kernels::io::read_npy(path).expect("npy"), *t);
}

/// Runs the vit model on `arrays`; returns (exit code, stderr).
fn run_with(name: &str, arrays: &[(&str, &Tensor)]) -> (i32, String) {
    let dir = scratch(name);
    write_npz(&dir.join("in.npz"), arrays).expect("write inputs");
    let model = vit().join("model.onnx");
    let (code, stdout, stderr) = run_in(
        &dir,
        &[
            "run",
            model.to_str().expect("utf-8 path"),
            "--inputs",
            "in.npz",
            "-o",
            "out.npz",
        ],
    );
    assert!(stdout.is_empty(), "{stdout}");
    assert!(!dir.join("out.npz").exists(), "no output on failure");
    (code, stderr)
}

#[test]
fn input_errors_name_the_input() {
    let good = pixel_values();
    let as_f64 = Tensor::from_f64_as(
        mmq_ir::DType::F64,
        good.shape.clone(),
        &good.to_f64().expect("numbers"),
    )
    .expect("f64");
    let rank3 = Tensor::new(
        good.dtype,
        good.shape[1..].to_vec(),
        match &good.data {
            Data::F32(v) => Data::F32(v[..v.len() / good.shape[0]].to_vec()),
            _ => panic!("f32 input expected"),
        },
    )
    .expect("rank 3");
    let wrong_dim = Tensor::from_f32(vec![1, 3, 32, 31], vec![0.0; 3 * 32 * 31]).expect("t");
    let extra = Tensor::from_i64(vec![1], vec![1]).expect("t");
    let cases: Vec<(&str, Vec<(&str, &Tensor)>)> = vec![
        ("missing", vec![]),
        ("wrong_dtype", vec![("pixel_values", &as_f64)]),
        ("wrong_rank", vec![("pixel_values", &rank3)]),
        ("wrong_dim", vec![("pixel_values", &wrong_dim)]),
        (
            "extra",
            vec![("pixel_values", &good), ("attention_mask", &extra)],
        ),
    ];
    let mut report = String::new();
    for (name, arrays) in &cases {
        let (code, stderr) = run_with(&format!("run-err-{name}"), arrays);
        assert_eq!(code, 1, "{name}: {stderr}");
        let expected_name = if *name == "extra" {
            "attention_mask"
        } else {
            "pixel_values"
        };
        // What the archive's headers show is refused before its arrays are read, naming it.
        let file = if *name == "missing" { "" } else { "in.npz: " };
        assert!(
            stderr.starts_with(&format!("error: {file}input {expected_name}:")),
            "{name}: {stderr}"
        );
        report.push_str(&format!("--- {name}\n{stderr}"));
    }
    insta::assert_snapshot!("run_input_errors", report);
}

#[test]
fn bad_files_are_user_errors() {
    let dir = scratch("run-bad-files");
    std::fs::write(dir.join("junk.npz"), b"junk").expect("write");
    let model = vit().join("model.onnx");
    let model = model.to_str().expect("utf-8 path");
    let (code, _, stderr) = run_in(&dir, &["run", model, "--inputs", "junk.npz"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.starts_with("error: junk.npz: not an .npz archive"),
        "{stderr}"
    );
    let (code, _, stderr) = run_in(&dir, &["run", model, "--input", "pixel_values"]);
    assert_eq!(code, 2, "{stderr}");
    // The output may never replace an input.
    write_npz(&dir.join("in.npz"), &[("pixel_values", &pixel_values())]).expect("write");
    let before = std::fs::read(dir.join("in.npz")).expect("read");
    let (code, _, stderr) = run_in(&dir, &["run", model, "--inputs", "in.npz", "-o", "in.npz"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("-o in.npz: that is an input (in.npz), which this run reads"),
        "{stderr}"
    );
    assert_eq!(std::fs::read(dir.join("in.npz")).expect("read"), before);
}
