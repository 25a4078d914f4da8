//! `--modality`, `inspect --labels` / `--stats` per modality, and `compile --quant mixed
//! --precision-map`: map diagnostics (snapshot), usage errors, and mixed plans end to end with a
//! cosine floor per fixture.

mod common;

use std::path::Path;

use common::{fixture, repo, run_in, scratch};

#[test]
fn inspect_shows_modality_stats_and_labels() {
    let dir = scratch("precision-inspect");
    let clip = fixture("clip");
    let (code, out, err) = run_in(&dir, &["inspect", &clip, "--stats"]);
    assert_eq!(code, 0, "{err}");
    let stats = &out[out.find("// modality of").expect("modality section")..];
    assert!(
        stats.contains("input pixel_values             vision  (name)"),
        "{stats}"
    );
    assert!(
        stats.contains("input input_ids                text    (name)"),
        "{stats}"
    );
    for label in ["vision", "text", "fusion"] {
        assert!(
            stats
                .lines()
                .any(|l| l.starts_with(&format!("//   {label} "))),
            "{label}: {stats}"
        );
    }
    // An override relabels everything that depends on the input.
    let (code, out, _) = run_in(
        &dir,
        &[
            "inspect",
            &clip,
            "--stats",
            "--modality",
            "pixel_values=text",
        ],
    );
    assert_eq!(code, 0);
    let stats = &out[out.find("// modality of").expect("modality section")..];
    assert!(
        stats.contains("pixel_values             text    (--modality)"),
        "{stats}"
    );
    assert!(
        !stats.lines().any(|l| l.starts_with("//   vision ")),
        "{stats}"
    );
    assert!(
        !stats.lines().any(|l| l.starts_with("//   fusion ")),
        "{stats}"
    );
    // Labels as comments; the dump still parses back.
    let (code, out, _) = run_in(&dir, &["inspect", &clip, "--labels"]);
    assert_eq!(code, 0);
    let conv = out.lines().find(|l| l.contains(" = Conv(")).expect("conv");
    assert!(conv.ends_with("// vision"), "{conv}");
    std::fs::write(dir.join("labels.mmir"), &out).unwrap();
    let (code, _, err) = run_in(&dir, &["verify", "labels.mmir"]);
    assert_eq!(code, 0, "{err}");
    // JSON.
    let (code, out, _) = run_in(&dir, &["inspect", &clip, "--stats", "--format", "json"]);
    assert_eq!(code, 0);
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    let m = &j["modality"][0];
    assert_eq!(m["inputs"]["pixel_values"]["modality"], "vision");
    assert!(m["labels"]["vision"]["nodes"].as_u64().unwrap() > 50);
    assert!(m["labels"]["text"]["weight_bytes"].as_u64().unwrap() > 0);
}

#[test]
fn modality_and_map_usage_errors() {
    let dir = scratch("precision-usage");
    let clip = fixture("clip");
    let (code, _, err) = run_in(&dir, &["inspect", &clip, "--modality", "nope=vision"]);
    assert_eq!(code, 1);
    assert!(
        err.contains(
            "the model has no input 'nope' (inputs: input_ids, attention_mask, pixel_values)"
        ),
        "{err}"
    );
    let (code, _, err) = run_in(
        &dir,
        &["inspect", &clip, "--modality", "pixel_values=fusion"],
    );
    assert_eq!(code, 1);
    assert!(
        err.contains("an input can be vision, text, audio or shared"),
        "{err}"
    );
    let (code, _, err) = run_in(&dir, &["inspect", &clip, "--modality", "pixel_values"]);
    assert_eq!(code, 2);
    assert!(err.contains("is not INPUT=KIND"), "{err}");
    let (code, _, err) = run_in(&dir, &["inspect", &clip, "--modality", "x=pixels"]);
    assert_eq!(code, 2);
    assert!(err.contains("unknown modality 'pixels'"), "{err}");
    let out = dir.join("o.onnx").display().to_string();
    let (code, _, err) = run_in(
        &dir,
        &[
            "compile", &clip, "--target", "ort", "--quant", "mixed", "-o", &out,
        ],
    );
    assert_eq!(code, 2);
    assert!(err.contains("--quant mixed needs --precision-map"), "{err}");
    let map = repo().join("tests/fixtures/precision_maps/clip.toml");
    let map = map.display().to_string();
    let (code, _, err) = run_in(
        &dir,
        &[
            "compile",
            &clip,
            "--target",
            "ort",
            "--quant",
            "int8",
            "--precision-map",
            &map,
            "-o",
            &out,
        ],
    );
    assert_eq!(code, 2);
    assert!(err.contains("--precision-map needs --quant mixed"), "{err}");
    let (code, _, err) = run_in(
        &dir,
        &[
            "compile",
            &clip,
            "--target",
            "ort",
            "--precision-map",
            "missing.toml",
            "-o",
            &out,
        ],
    );
    assert_eq!(code, 1);
    assert!(
        err.contains("cannot read precision map missing.toml"),
        "{err}"
    );
    assert!(!Path::new(&out).exists());
}

#[test]
fn bad_map_diagnostics() {
    let dir = scratch("precision-bad-map");
    std::fs::write(
        dir.join("bad.toml"),
        r#"[[rule]]
name = "all matmuls"
ops = ["MatMul"]
scheme = "int8"

[[rule]]
name = "vision matmuls"
ops = ["MatMul"]
modality = "vision"
scheme = "int4"

[[rule]]
nodes = ["/vision/**", "/text/[a-"]
sheme = "fp8"
"#,
    )
    .unwrap();
    let out = dir.join("o.onnx").display().to_string();
    let (code, stdout, err) = run_in(
        &dir,
        &[
            "compile",
            &fixture("vit"),
            "--target",
            "ort",
            "--precision-map",
            "bad.toml",
            "-o",
            &out,
        ],
    );
    assert_eq!(code, 1, "{err}");
    assert!(stdout.is_empty());
    assert!(!Path::new(&out).exists());
    insta::assert_snapshot!("precision_bad_map", err);
}

/// Cosine between the first output (or `output`) of two runs written by `mmq run -o`.
fn cosine(a: &Path, b: &Path, output: &str) -> f64 {
    let read = |p: &Path| {
        mmq_kernels::io::read_npz(p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .into_iter()
            .find(|(k, _)| k == output)
            .unwrap_or_else(|| panic!("{}: no {output}", p.display()))
            .1
    };
    let f = |t: mmq_kernels::Tensor| -> Vec<f64> {
        t.to_f32()
            .expect("float output")
            .into_iter()
            .map(f64::from)
            .collect()
    };
    let x = f(read(a));
    let y = f(read(b));
    assert_eq!(x.len(), y.len());
    let dot: f64 = x.iter().zip(&y).map(|(a, b)| a * b).sum();
    let n = |v: &[f64]| v.iter().map(|a| a * a).sum::<f64>().sqrt();
    dot / (n(&x) * n(&y))
}

#[test]
fn mixed_maps_end_to_end() {
    let dir = scratch("precision-mixed");
    std::fs::write(
        dir.join("towers.toml"),
        r#"[[rule]]
ops = ["MatMul", "Gemm"]
modality = ["text", "fusion"]
scheme = "int4"
block = 32

[[rule]]
ops = ["MatMul", "Gemm", "Conv"]
modality = "vision"
scheme = "int8"
"#,
    )
    .unwrap();
    // With every input relabelled text, the vision rule has nothing to match.
    let (code, _, err) = run_in(
        &dir,
        &[
            "compile",
            &fixture("clip"),
            "--target",
            "ort",
            "--precision-map",
            "towers.toml",
            "--modality",
            "pixel_values=text",
            "-o",
            "relabelled.onnx",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("warning: rule at line 7 matches no node of graph @main_graph"),
        "{err}"
    );
    let clip_map = repo().join("tests/fixtures/precision_maps/clip.toml");
    // (fixture, map, output, cosine floor, op the map must have produced)
    let cases: &[(&str, &str, &str, f64, &str)] = &[
        ("llava", "towers.toml", "logits", 0.98, "MatMulNBits"),
        ("vit", "towers.toml", "last_hidden_state", 0.999, "QLinear"),
        (
            "clip",
            clip_map.to_str().unwrap(),
            "image_embeds",
            0.99,
            "MatMulNBits",
        ),
        (
            "clip",
            clip_map.to_str().unwrap(),
            "text_embeds",
            0.95,
            "MatMulNBits",
        ),
    ];
    for &(name, map, output, floor, op) in cases {
        let model = fixture(name);
        let inputs = repo().join(format!("tests/fixtures/{name}/inputs.npz"));
        let inputs = inputs.to_str().unwrap();
        let q = format!("{name}.onnx");
        let (code, _, err) = run_in(
            &dir,
            &[
                "compile",
                &model,
                "--target",
                "ort",
                "--precision-map",
                map,
                // Every eligible node: the fixtures are too small for integer products to
                // pay, and the maps' quantized forms are what is checked.
                "--placement",
                "all",
                "-o",
                &q,
            ],
        );
        assert_eq!(code, 0, "{name}: {err}");
        assert!(err.contains("nodes by scheme:"), "{name}: {err}");
        if name == "clip" {
            // Rules whose scheme cannot quantize what they matched say so, by rule and node.
            assert!(
                err.contains("warning: rule 'patch embedding' (line 9): fp8 left 1 of the nodes it matched float on target ort (Conv 'node_Conv_253'); the scheme does not apply to them there"),
                "{err}"
            );
            assert!(
                err.contains("warning: rule 'text token embedding' (line 25): int8 left 2 of the nodes it matched float"),
                "{err}"
            );
            assert!(
                !err.contains("rule 'vision projections' (line 33): int4 left"),
                "{err}"
            );
        }
        let (code, text, _) = run_in(&dir, &["inspect", &q, "--stats"]);
        assert_eq!(code, 0);
        assert!(
            text.contains(op) || text.contains("MatMulInteger") || text.contains("QuantizeLinear"),
            "{name}: no quantized op in\n{}",
            &text[text.find("// ----").unwrap_or(0)..]
        );
        let (code, _, err) = run_in(&dir, &["run", &model, "--inputs", inputs, "-o", "f32.npz"]);
        assert_eq!(code, 0, "{err}");
        let (code, _, err) = run_in(&dir, &["run", &q, "--inputs", inputs, "-o", "q.npz"]);
        assert_eq!(code, 0, "{name}: {err}");
        let c = cosine(&dir.join("f32.npz"), &dir.join("q.npz"), output);
        assert!(c >= floor, "{name} {output}: cosine {c} < {floor}");
    }
}
