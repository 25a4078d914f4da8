//! Quantized caches through the compile API and the reference interpreter: the interface the
//! KV-cache and image-cache passes leave (names, element types, scale shapes), a prefill and
//! decode steps of the `llama_gqa_kv` fixture in every cache format against the float model
//! (the interpreter runs the emitted quantize and dequantize forms), and the errors.
//! The 64-step decode loops in ONNX Runtime are in `python/tests/test_caches.py`.

#![allow(
    clippy::print_stderr,
    reason = "the test reports the figures it measured"
)]

use std::collections::HashMap;

use mmq_compiler::{CompileOptions, compile};
use mmq_ir::{DType, Module};
use mmq_kernels::cache::CacheFormat;
use mmq_kernels::{Interpreter, RtValue, Tensor};
use mmq_passes::TargetRef;
use mmq_tests::{cosine, repo_root};

fn load(rel: &str) -> Module {
    let path = repo_root().join(rel);
    let (m, _) = mmq_compiler::load::load(&[path])
        .and_then(|l| l.verified())
        .unwrap_or_else(|e| panic!("{rel}: {}", e.rendered));
    m
}

fn compiled(rel: &str, options: &CompileOptions) -> Module {
    let mut m = load(rel);
    compile(&mut m, options).unwrap_or_else(|e| panic!("{rel}: {e}"));
    m
}

fn kv(format: CacheFormat) -> CompileOptions {
    CompileOptions {
        kv_cache: Some(format),
        ..CompileOptions::default()
    }
}

/// (name, element type, dims as text) of a graph's inputs or outputs.
fn interface(m: &Module, outputs: bool) -> Vec<(String, DType, String)> {
    let g = &m.graphs[m.entries[0].graph];
    let list = if outputs { &g.outputs } else { &g.inputs };
    list.iter()
        .map(|&v| {
            let ty = m.value_type(v);
            let dims: Vec<String> = ty
                .shape()
                .unwrap_or_default()
                .iter()
                .map(|d| d.render(&|s| m.symbols[s].name.clone()))
                .collect();
            (
                m.values[v].name.clone().unwrap_or_default(),
                ty.dtype().expect("tensor"),
                dims.join(","),
            )
        })
        .collect()
}

#[test]
fn kv_cache_interface_follows_the_present_to_past_naming() {
    let m = compiled(
        "tests/fixtures/llama_gqa_kv/model.onnx",
        &kv(CacheFormat::Int8),
    );
    let inputs = interface(&m, false);
    let find = |list: &[(String, DType, String)], name: &str| {
        list.iter()
            .find(|(n, ..)| n == name)
            .unwrap_or_else(|| panic!("no {name} in {list:?}"))
            .clone()
    };
    assert_eq!(
        find(&inputs, "past_key_values.0.key"),
        (
            "past_key_values.0.key".into(),
            DType::I8,
            "batch,2,past_seq,16".into()
        )
    );
    // 512-byte blocks of 16-element tokens: 32 tokens per block, one f32 scale per head.
    let (_, dtype, dims) = find(&inputs, "past_key_values.0.key_scale");
    assert_eq!(
        (dtype, dims.as_str()),
        (DType::F32, "batch,2,(past_seq + 31) / 32")
    );
    let outputs = interface(&m, true);
    let (_, dtype, _) = find(&outputs, "present.1.value");
    assert_eq!(dtype, DType::I8);
    // Every present* output continues the past* input of the same name.
    for (name, dtype, _) in outputs.iter().filter(|(n, ..)| n.starts_with("present")) {
        let past = name.replacen("present", "past_key_values", 1);
        assert_eq!(find(&inputs, &past).1, *dtype, "{name}");
    }

    let m = compiled(
        "tests/fixtures/llama_gqa_kv/model.onnx",
        &kv(CacheFormat::Int4),
    );
    let inputs = interface(&m, false);
    assert_eq!(
        find(&inputs, "past_key_values.1.value_scale"),
        (
            "past_key_values.1.value_scale".into(),
            DType::F16,
            "batch,2,past_seq,1".into()
        )
    );
    let opset = m.onnx_opset(m.entries[0].graph);
    // 21 for the INT4 codes; 23 where the grouped-query attention became the standard
    // `Attention`.
    assert_eq!(opset, Some(23), "INT4 codes need opset 21, Attention 23");
}

/// Zero-token caches for every `past*` input of `m`.
fn empty_cache(m: &Module) -> HashMap<String, RtValue> {
    let g = &m.graphs[m.entries[0].graph];
    g.inputs
        .iter()
        .filter_map(|&v| {
            let name = m.values[v].name.clone()?;
            if !name.contains("past") {
                return None;
            }
            let ty = m.value_type(v);
            let shape: Vec<usize> = ty
                .shape()?
                .iter()
                .enumerate()
                .map(|(i, d)| {
                    if i == 0 {
                        1
                    } else {
                        d.as_known().unwrap_or(0) as usize
                    }
                })
                .collect();
            let t = Tensor::zeros(ty.dtype()?, shape).expect("tensor");
            Some((name, RtValue::from(t)))
        })
        .collect()
}

/// Runs `steps` steps (the prompt, then the tokens of `forced`); returns the last-position
/// logits of each.
fn decode(m: &Module, prompt: &[i64], forced: &[i64]) -> Vec<Vec<f64>> {
    let interp = Interpreter::new(m);
    let mut cache = empty_cache(m);
    let mut out = Vec::new();
    let mut total = 0;
    let mut ids = prompt.to_vec();
    for step in 0..=forced.len() {
        let seq = ids.len();
        let mut feeds = cache.clone();
        let t = |shape: Vec<usize>, v: Vec<i64>| RtValue::from(Tensor::from_i64(shape, v).unwrap());
        feeds.insert("input_ids".into(), t(vec![1, seq], ids.clone()));
        feeds.insert(
            "attention_mask".into(),
            t(vec![1, total + seq], vec![1; total + seq]),
        );
        let pos = (total as i64..(total + seq) as i64).collect();
        feeds.insert("position_ids".into(), t(vec![1, seq], pos));
        let result = interp
            .run(m.entries[0].graph, &feeds)
            .unwrap_or_else(|e| panic!("step {step}: {e}"));
        for (name, v) in result {
            if name == "logits" {
                let all = v.as_tensor().unwrap().to_f64().unwrap();
                out.push(all[all.len() - 256..].to_vec());
            } else if name.starts_with("present") {
                cache.insert(name.replacen("present", "past_key_values", 1), v);
            }
        }
        total += seq;
        if step < forced.len() {
            ids = vec![forced[step]];
        }
    }
    out
}

#[test]
fn interpreter_decodes_with_every_cache_format_close_to_float() {
    let rel = "tests/fixtures/llama_gqa_kv/model.onnx";
    let float = compiled(rel, &CompileOptions::default());
    let prompt = [5, 17, 42, 99, 3];
    // The float model's greedy continuation, then both models on that history.
    let mut forced = Vec::new();
    for _ in 0..12 {
        let logits = decode(&float, &prompt, &forced);
        let last = logits.last().unwrap();
        let next = (0..last.len())
            .max_by(|&a, &b| last[a].total_cmp(&last[b]))
            .unwrap();
        forced.push(next as i64);
    }
    let reference = decode(&float, &prompt, &forced);
    for (format, bound) in [
        (CacheFormat::Int8, 0.9999),
        (CacheFormat::Fp8, 0.999),
        (CacheFormat::Int4, 0.995),
    ] {
        let m = compiled(rel, &kv(format));
        let got = decode(&m, &prompt, &forced);
        let worst = reference
            .iter()
            .zip(&got)
            .map(|(a, b)| cosine(a, b))
            .fold(1.0, f64::min);
        eprintln!("interpreter, kv {format}: min logits cosine {worst:.5} over 13 steps");
        assert!(worst >= bound, "{format}: {worst}");
        // The prefill reads an empty cache: its logits are the float model's.
        assert!(
            cosine(&reference[0], &got[0]) > 0.999_999,
            "{format} prefill"
        );
    }
}

#[test]
fn cache_errors_say_what_is_missing() {
    let mut m = load("tests/fixtures/vit/model.onnx");
    let e = compile(&mut m, &kv(CacheFormat::Int8))
        .unwrap_err()
        .to_string();
    assert!(e.contains("no graph has a KV cache"), "{e}");

    let mut m = load("tests/fixtures/llama_gqa_kv/model.onnx");
    let options = CompileOptions {
        image_cache: Some(CacheFormat::Int4),
        ..CompileOptions::default()
    };
    let e = compile(&mut m, &options).unwrap_err().to_string();
    assert!(
        e.contains("no graph output is computed from vision inputs"),
        "{e}"
    );

    let options = CompileOptions {
        image_cache: Some(CacheFormat::Int8),
        ..CompileOptions::default()
    };
    let e = compile(&mut m, &options).unwrap_err().to_string();
    assert!(e.contains("image features are cached as int4"), "{e}");

    // TensorRT writes INT8 blocks through its plugins (trt_plugins.rs); the other formats
    // and the image cache have no TensorRT form.
    let options = CompileOptions {
        target: TargetRef::TRT,
        ..kv(CacheFormat::Fp8)
    };
    let e = compile(&mut m, &options).unwrap_err().to_string();
    assert!(e.contains("int8 blocks through its plugins"), "{e}");
    let options = CompileOptions {
        target: TargetRef::TRT,
        image_cache: Some(CacheFormat::Int4),
        ..CompileOptions::default()
    };
    let e = compile(&mut m, &options).unwrap_err().to_string();
    assert!(e.contains("--image-cache") && e.contains("trt"), "{e}");
}

#[test]
fn image_cache_quantizes_vision_outputs_in_groups_of_64() {
    let m = compiled(
        "tests/fixtures/pipeline/vision_encoder.onnx",
        &CompileOptions {
            image_cache: Some(CacheFormat::Int4),
            ..CompileOptions::default()
        },
    );
    let outputs = interface(&m, true);
    assert_eq!(
        outputs,
        [
            ("image_embeds".into(), DType::I4, "batch,16,64".into()),
            ("image_embeds_scale".into(), DType::F16, "batch,16,1".into()),
        ]
    );
    // The interpreter's codes and scales dequantize to the float features.
    let feeds: HashMap<String, RtValue> =
        mmq_kernels::io::read_npz(&repo_root().join("tests/fixtures/pipeline/inputs.npz"))
            .unwrap()
            .into_iter()
            .filter(|(n, _)| n == "pixel_values")
            .map(|(n, t)| (n, RtValue::from(t)))
            .collect();
    let out = Interpreter::new(&m)
        .run(m.entries[0].graph, &feeds)
        .unwrap();
    let codes = out[0].1.as_tensor().unwrap().to_f64().unwrap();
    let scales = out[1].1.as_tensor().unwrap().to_f64().unwrap();
    let deq: Vec<f64> = codes
        .iter()
        .enumerate()
        .map(|(i, c)| c * scales[i / 64])
        .collect();
    let want: Vec<f64> =
        mmq_kernels::io::read_npz(&repo_root().join("tests/fixtures/pipeline/outputs.npz"))
            .unwrap()
            .into_iter()
            .find(|(n, _)| n == "image_embeds")
            .unwrap()
            .1
            .to_f64()
            .unwrap();
    let c = cosine(&deq, &want);
    eprintln!("image cache int4: cosine {c:.5} against the float features");
    assert!(c > 0.99, "{c}");
    assert!(
        codes
            .iter()
            .all(|&c| (-8.0..=7.0).contains(&c) && c.fract() == 0.0)
    );
}
