//! `genai_config.json`: the config onnxruntime-genai (0.18) reads to run a decoder package
//! (`onnxruntime_genai.Model(DIR)`), written where the package fits its decoder contract.
//!
//! The contract, as onnxruntime-genai 0.18 on the CPU holds it: one decoder model whose inputs
//! are the token ids, optionally the attention mask and the positions, and a float KV cache (one
//! `past` input and one `present` output per layer for keys and for values, named by a pattern
//! with the layer number); its outputs the logits and the presents. It takes the layer count,
//! the KV heads and the head size from the cache tensors' shapes; the config names them too.
//! What does not fit, and why:
//! - a quantized KV cache (codes plus `…_scale` inputs): it feeds no scale inputs;
//! - several stages (a vision encoder and a language model): its multimodal model types are
//!   tied to their own architectures' inputs (`phi3v`, `qwen2_5_vl`, ...);
//! - a decoder without a KV cache: it feeds one new token a step;
//! - any other input (`token_type_ids`, `past_sequence_length`, image features): it feeds only
//!   the inputs it knows;
//! - static token dims: it feeds prompts and steps of any length.
//!
//! `"type": "llama"` selects its generic decoder loop, which runs every such model (GPT-2
//! included: its `gpt2` type expects the older combined `past_%d` cache).

use serde_json::json;

use mmq_ir::{GraphId, Module};

use crate::describe;
use crate::spec::{Generation, KvCache, ScaleLayout, Stage};

/// The pattern `names` follow with the layer number as `%d` (`past_key_values.%d.key`), if
/// they are layers `0..n` of one pattern in order.
fn layer_pattern(names: &[&str]) -> Option<String> {
    let first = names.first()?;
    // Try each run of digits of the first name that reads `0`.
    let bytes = first.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_digit() {
            let start = i;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
            if &first[start..i] == "0" {
                let pattern = format!("{}%d{}", &first[..start], &first[i..]);
                let fits = names
                    .iter()
                    .enumerate()
                    .all(|(k, n)| *n == pattern.replace("%d", &k.to_string()));
                if fits {
                    return Some(pattern);
                }
            }
        } else {
            i += 1;
        }
    }
    None
}

/// The keys' and the values' names of `kv`, as (past key, past value, present key, present
/// value) patterns.
fn kv_patterns(kv: &KvCache) -> Result<[String; 4], String> {
    // The later of "key" and "value" in the name decides (`past_key_values.0.value`).
    let is_key = |n: &str| {
        let l = n.to_ascii_lowercase();
        match (l.rfind("key"), l.rfind("value")) {
            (Some(k), Some(v)) => k > v,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => l.ends_with(".k") || l.ends_with("_k"),
        }
    };
    let (keys, values): (Vec<_>, Vec<_>) = kv.pairs.iter().partition(|p| is_key(&p.past));
    if keys.len() != values.len() || keys.is_empty() {
        return Err(format!(
            "its {} KV inputs do not pair into keys and values by name",
            kv.pairs.len()
        ));
    }
    let pattern = |names: Vec<&str>, what: &str| {
        layer_pattern(&names).ok_or_else(|| {
            format!(
                "the {what} names ({}, ...) follow no pattern with the layer number",
                names.first().copied().unwrap_or("")
            )
        })
    };
    Ok([
        pattern(keys.iter().map(|p| p.past.as_str()).collect(), "past key")?,
        pattern(
            values.iter().map(|p| p.past.as_str()).collect(),
            "past value",
        )?,
        pattern(
            keys.iter().map(|p| p.present.as_str()).collect(),
            "present key",
        )?,
        pattern(
            values.iter().map(|p| p.present.as_str()).collect(),
            "present value",
        )?,
    ])
}

/// The config for the package of `stages`, or why onnxruntime-genai cannot run it.
pub(crate) fn config(
    m: &Module,
    graphs: &[GraphId],
    stages: &[Stage],
    kv: Option<&KvCache>,
    generation: Option<&Generation>,
) -> Result<serde_json::Value, String> {
    let [stage] = stages else {
        return Err(format!(
            "the package has {} models ({}); onnxruntime-genai runs multimodal models only in \
             its own architectures' forms: run it with `mmq generate` or `mmq.Pipeline`",
            stages.len(),
            stages
                .iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    };
    let g = graphs[0];
    let generation = generation.ok_or("the model is not a decoder (no input_ids and logits)")?;
    let kv = kv.ok_or(
        "the decoder has no KV cache (past…/present… pairs); onnxruntime-genai feeds one new \
         token a step",
    )?;
    // `GroupQueryAttention`'s own INT8 cache has no scale tensors at the interface:
    // onnxruntime-genai allocates it from the inputs' type and feeds it as any cache.
    if kv.format != "float" && kv.scales != Some(ScaleLayout::Channels) {
        return Err(format!(
            "its KV cache is quantized ({} codes with scale inputs), which onnxruntime-genai \
             cannot feed: run it with `mmq generate` or `mmq.Pipeline`, or compile without \
             --kv-cache for onnxruntime-genai",
            kv.format
        ));
    }
    let known = |n: &str| {
        n == generation.input_ids
            || generation.attention_mask.as_deref() == Some(n)
            || generation.position_ids.as_deref() == Some(n)
            || kv.pairs.iter().any(|p| p.past == n)
    };
    if let Some(other) = stage.inputs.iter().find(|p| !known(&p.name)) {
        return Err(format!(
            "input '{}' is not one onnxruntime-genai feeds (token ids, attention mask, \
             positions, KV cache)",
            other.name
        ));
    }
    let produced = |n: &str| n == generation.logits || kv.pairs.iter().any(|p| p.present == n);
    if let Some(other) = stage.outputs.iter().find(|p| !produced(&p.name)) {
        return Err(format!(
            "output '{}' is neither the logits nor a present KV tensor",
            other.name
        ));
    }
    let ids = stage
        .inputs
        .iter()
        .find(|p| p.name == generation.input_ids)
        .ok_or("no token input")?;
    if ids.shape.iter().all(serde_json::Value::is_number) {
        return Err(format!(
            "input '{}' has static dims {:?}; onnxruntime-genai feeds prompts and steps of any \
             length (export with dynamic batch and sequence dims)",
            ids.name, ids.shape
        ));
    }
    let [past_key, past_value, present_key, present_value] = kv_patterns(kv)?;
    let head_size = kv.head_dim;
    let kv_heads = kv
        .heads
        .ok_or("the KV heads (dim 1 of the cache tensors) are not static")?;
    let layers = kv.pairs.len() / 2;
    let hidden = describe::hidden_size(m, g, &generation.input_ids).unwrap_or(kv_heads * head_size);
    let heads = if head_size > 0 && hidden.is_multiple_of(head_size) {
        hidden / head_size
    } else {
        kv_heads
    };
    let mut inputs = serde_json::Map::new();
    inputs.insert("input_ids".into(), json!(generation.input_ids));
    if let Some(mask) = &generation.attention_mask {
        inputs.insert("attention_mask".into(), json!(mask));
    }
    if let Some(pos) = &generation.position_ids {
        inputs.insert("position_ids".into(), json!(pos));
    }
    inputs.insert("past_key_names".into(), json!(past_key));
    inputs.insert("past_value_names".into(), json!(past_value));
    let mut model = serde_json::Map::new();
    model.insert("type".into(), json!("llama"));
    if let Some(bos) = generation.bos_token_id {
        model.insert("bos_token_id".into(), json!(bos));
    }
    match generation.eos_token_id.as_slice() {
        [] => {}
        [one] => {
            model.insert("eos_token_id".into(), json!(one));
        }
        many => {
            model.insert("eos_token_id".into(), json!(many));
        }
    }
    if let Some(pad) = generation.pad_token_id {
        model.insert("pad_token_id".into(), json!(pad));
    }
    model.insert("context_length".into(), json!(generation.context_length));
    model.insert("vocab_size".into(), json!(generation.vocab_size));
    model.insert(
        "decoder".into(),
        json!({
            "filename": stage.file,
            "head_size": head_size,
            "hidden_size": hidden,
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "num_hidden_layers": layers,
            "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
            "inputs": inputs,
            "outputs": {
                "logits": generation.logits,
                "present_key_names": present_key,
                "present_value_names": present_value,
            },
        }),
    );
    Ok(json!({
        "model": model,
        "search": {
            "do_sample": false,
            "max_length": generation.context_length,
            "min_length": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": kv.shared_buffer,
            "top_k": 1,
            "top_p": 1.0,
            "temperature": 1.0,
            "repetition_penalty": 1.0,
            "early_stopping": true,
            "length_penalty": 1.0,
            "no_repeat_ngram_size": 0,
            "diversity_penalty": 0.0,
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::layer_pattern;

    #[test]
    fn layer_patterns_take_the_run_of_digits_that_counts_layers() {
        assert_eq!(
            layer_pattern(&["past_key_values.0.key", "past_key_values.1.key"]).as_deref(),
            Some("past_key_values.%d.key")
        );
        assert_eq!(
            layer_pattern(&["v2.past.0.k", "v2.past.1.k"]).as_deref(),
            Some("v2.past.%d.k")
        );
        assert_eq!(layer_pattern(&["past_0", "past_2"]), None);
        assert_eq!(layer_pattern(&["cache_a", "cache_b"]), None);
    }
}
