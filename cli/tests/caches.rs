//! `mmq plan-cache` and `mmq compile --kv-cache/--image-cache` from the command line.

mod common;

use common::{fixture, run_in, scratch};

#[test]
fn plan_cache_lays_out_a_llava_style_pair_and_writes_json() {
    let dir = scratch("plan-cache");
    let enc = common::repo()
        .join("tests/fixtures/pipeline/vision_encoder.onnx")
        .display()
        .to_string();
    let dec = fixture("llama_gqa_kv");
    let (code, text, stderr) = run_in(
        &dir,
        &[
            "plan-cache",
            &enc,
            &dec,
            "--budget",
            "1MiB",
            "--images",
            "2",
            "-o",
            "plan.json",
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    // 2 layers x {key, value} x 2 heads of 16: 8 blocks of 512 bytes + 32 scale bytes aligned.
    for want in [
        "kv: 4 tensors (8 heads in all, head_dim 16)",
        "pages of 32 tokens, 4224 bytes each at offset 1280",
        "132.00 bytes per token (66.00 per layer), fp32 512 (3.88x smaller)",
        "'image_embeds' [16 tokens, 64] as INT4 groups of 64, 2 slots of 640 bytes",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("plan.json")).unwrap()).unwrap();
    let pages = plan["kv_pages"].as_u64().unwrap();
    assert_eq!(pages, (1_048_576 - 1280) / 4224);
    assert_eq!(plan["token_capacity"].as_u64(), Some(pages * 32));
    assert_eq!(plan["kv_page"]["scales"]["offset"].as_u64(), Some(4096));
    assert_eq!(plan["align"].as_u64(), Some(128));
}

#[test]
fn plan_cache_plans_image_slots_without_a_kv_cache() {
    let dir = scratch("plan-cache-images");
    let enc = common::repo()
        .join("tests/fixtures/pipeline/vision_encoder.onnx")
        .display()
        .to_string();
    let (code, text, stderr) = run_in(
        &dir,
        &[
            "plan-cache",
            &enc,
            "--budget",
            "1MiB",
            "--images",
            "3",
            "-o",
            "plan.json",
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    for want in [
        "pool: 1920 bytes",
        "kv: none (no past…/present… pairs in the models)",
        "'image_embeds' [16 tokens, 64] as INT4 groups of 64, 3 slots of 640 bytes",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("plan.json")).unwrap()).unwrap();
    assert_eq!(plan["kv_pages"].as_u64(), Some(0));
    assert!(plan["kv_page"].is_null());
    assert_eq!(plan["image_slots"].as_u64(), Some(3));
}

#[test]
fn plan_cache_errors_say_why() {
    let dir = scratch("plan-cache-errors");
    // A text model without a KV cache has nothing to plan.
    let bert = common::repo()
        .join("tests/fixtures/matrix/bert_dynamo18_sdpa_dynamic/model.onnx")
        .display()
        .to_string();
    let (code, _, stderr) = run_in(&dir, &["plan-cache", &bert, "--budget", "1GiB"]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("no KV cache (past…/present… pairs) and no vision feature output"),
        "{stderr}"
    );
    let (code, _, stderr) = run_in(
        &dir,
        &[
            "plan-cache",
            &fixture("vit"),
            "--budget",
            "1GiB",
            "--images",
            "0",
        ],
    );
    assert_eq!(code, 1);
    assert!(
        stderr.contains("ask for image slots (--images N)"),
        "{stderr}"
    );
    let (code, _, stderr) = run_in(
        &dir,
        &["plan-cache", &fixture("llama_gqa_kv"), "--budget", "4000"],
    );
    assert_eq!(code, 1);
    assert!(
        stderr.contains("at least 4224 bytes are needed"),
        "{stderr}"
    );
    let (code, _, stderr) = run_in(
        &dir,
        &[
            "plan-cache",
            &fixture("llama_gqa_kv"),
            "--budget",
            "16 parsecs",
        ],
    );
    assert_eq!(code, 2);
    assert!(stderr.contains("unknown unit"), "{stderr}");
    // A package's GroupQueryAttention INT8 cache: pages of codes only (its scales are static,
    // in the model), and no other format.
    let (code, _, stderr) = run_in(
        &dir,
        &[
            "compile",
            &fixture("llama_gqa_kv"),
            "--package",
            "--kv-cache",
            "int8",
            "-q",
            "-o",
            "pkg",
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    let (code, text, stderr) = run_in(&dir, &["plan-cache", "pkg/model.onnx", "--budget", "1MiB"]);
    assert_eq!(code, 0, "{stderr}");
    for want in [
        "256 pages of 32 tokens, 4096 bytes each",
        "codes: 8 blocks of 512 bytes at +0; scales static (per head and channel, in the model)",
        "128.00 bytes per token (64.00 per layer), fp32 512 (4.00x smaller)",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    let (code, _, stderr) = run_in(
        &dir,
        &[
            "plan-cache",
            "pkg/model.onnx",
            "--budget",
            "1MiB",
            "--kv",
            "fp8",
        ],
    );
    assert_eq!(code, 1);
    assert!(
        stderr
            .contains("already holds int8 codes (a package's GroupQueryAttention cache), not fp8"),
        "{stderr}"
    );
    // A model compiled with `--kv-cache int4`: its codes and scales at the interface.
    let (code, _, stderr) = run_in(
        &dir,
        &[
            "compile",
            &fixture("llama_gqa_kv"),
            "--kv-cache",
            "int4",
            "-q",
            "-o",
            "kv4.onnx",
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    let (code, text, stderr) = run_in(
        &dir,
        &["plan-cache", "kv4.onnx", "--budget", "1MiB", "--kv", "int4"],
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(text.contains("scales (f16) at +"), "{text}");
    let (code, _, stderr) = run_in(&dir, &["plan-cache", "kv4.onnx", "--budget", "1MiB"]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("KV input 'past_key_values.0.key' already holds int4 codes, not int8"),
        "{stderr}"
    );
}

#[test]
fn compile_with_a_kv_cache_reports_the_pass() {
    let dir = scratch("kv-compile");
    let llama = fixture("llama_gqa_kv");
    let compile = |format: &str, extra: &[&str]| {
        let mut args = vec!["compile", &llama, "--target", "ort", "--kv-cache", format];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["-o", "out.onnx"]);
        run_in(&dir, &args)
    };
    let (code, _, stderr) = compile("int8", &["--time-passes"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains(
            "4 KV-cache tensors as int8 (blocks of 32 tokens, one f32 scale per head and block)"
        ),
        "{stderr}"
    );
    let (code, _, stderr) = compile("int3", &[]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("unknown cache format 'int3' (expected int8, fp8, int4)"),
        "{stderr}"
    );
}
