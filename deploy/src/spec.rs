//! `pipeline.json`: what a package holds and how its models run together (schema version 1).
//!
//! ```json
//! {
//!   "format": "mmq-pipeline", "version": 1, "target": "ort",
//!   "stages": [
//!     {"name": "vision_encoder", "file": "vision_encoder.onnx", "role": "vision_encoder",
//!      "inputs": [{"name": "pixel_values", "dtype": "f32", "shape": ["batch", 3, 32, 32]}],
//!      "outputs": [...], "files": [{"file": "vision_encoder.onnx", "bytes": 1234, "sha256": "…"}]},
//!     {"name": "language_model", "file": "language_model.onnx", "role": "decoder", ...}
//!   ],
//!   "bindings": [{"from": {"stage": "vision_encoder", "port": "linear_13"},
//!                 "to": {"stage": "language_model", "port": "linear_13"}}],
//!   "kv_cache": {"stage": "language_model", "format": "int8", "code_dtype": "i8",
//!                "scales": {"kind": "blocks", "tokens": 32}, "scale_dtype": "f32",
//!                "pairs": [{"past": "past_key_values.0.key", "present": "present.0.key",
//!                           "past_scale": "past_key_values.0.key_scale",
//!                           "present_scale": "present.0.key_scale"}]},
//!   "image_cache": {"stage": "vision_encoder", "format": "int4",
//!                   "outputs": [{"name": "linear_13", "scale": "linear_13_scale", "group": 64}]},
//!   "cache_plan": {...},
//!   "generation": {"input_ids": "input_ids", "attention_mask": "attention_mask",
//!                  "position_ids": null, "logits": "logits", "bos_token_id": 1,
//!                  "eos_token_id": [2], "pad_token_id": 0, "context_length": 2048,
//!                  "vocab_size": 256},
//!   "onnxruntime_genai": {"config": "genai_config.json", "reason": null},
//!   "tokenizer": "tokenizer.json"
//! }
//! ```
//!
//! A dim is an integer or the text of a symbolic dim (`past_seq + seq`). Stages are listed in
//! the order they run; a binding feeds an output of an earlier stage to an input of a later one.

use serde::{Deserialize, Serialize};

/// The `format` value of every `pipeline.json`.
pub const FORMAT: &str = "mmq-pipeline";
/// The schema version this crate writes and reads.
pub const VERSION: u32 = 1;

/// The whole of `pipeline.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineSpec {
    /// Always [`FORMAT`].
    pub format: String,
    /// Always [`VERSION`].
    pub version: u32,
    /// The target the models were compiled for (`ort`).
    pub target: String,
    /// The models, in the order they run.
    pub stages: Vec<Stage>,
    /// Which outputs feed which inputs.
    pub bindings: Vec<Binding>,
    /// The decoder's KV cache, when it has one.
    pub kv_cache: Option<KvCache>,
    /// The vision encoder's quantized features, when `--image-cache` made them.
    pub image_cache: Option<ImageCache>,
    /// The cache pool's layout (`mmq plan-cache`'s plan), where the package's caches are ones
    /// the planner lays out as the models hold them.
    pub cache_plan: Option<serde_json::Value>,
    /// How to generate tokens, when a stage is a decoder.
    pub generation: Option<Generation>,
    /// Whether onnxruntime-genai can run the package, and why not.
    pub onnxruntime_genai: Genai,
    /// The tokenizer file copied into the package, if any.
    pub tokenizer: Option<FileEntry>,
}

/// What a stage is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Image inputs to image features.
    VisionEncoder,
    /// Tokens (and features, and a KV cache) to logits.
    Decoder,
    /// Anything else.
    Model,
}

/// One model of the package.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stage {
    /// The stage's name: its file's stem (the graph's name for the graphs of a split).
    pub name: String,
    /// The ONNX file, relative to the package.
    pub file: String,
    /// What it is for.
    pub role: Role,
    /// Its inputs.
    pub inputs: Vec<Port>,
    /// Its outputs.
    pub outputs: Vec<Port>,
    /// The files it consists of (the model, its external data), with their hashes.
    pub files: Vec<FileEntry>,
}

/// A graph input or output.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Port {
    /// Its name.
    pub name: String,
    /// Element type (`f32`, `i64`, `i8`, ...).
    pub dtype: String,
    /// Dims: integers or symbolic expressions.
    pub shape: Vec<serde_json::Value>,
}

impl Port {
    /// The port as text: `name: dtype[d0, d1, ...]`.
    pub fn describe(&self) -> String {
        let dims: Vec<String> = self
            .shape
            .iter()
            .map(|d| match d {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect();
        format!("{}: {}[{}]", self.name, self.dtype, dims.join(", "))
    }
}

/// A file of the package and its hash.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// Relative to the package.
    pub file: String,
    /// Size in bytes.
    pub bytes: u64,
    /// SHA-256, lower-case hex.
    pub sha256: String,
}

/// One end of a binding.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Endpoint {
    /// The stage.
    pub stage: String,
    /// The output (`from`) or input (`to`).
    pub port: String,
}

/// An output of one stage that feeds an input of a later one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Binding {
    /// The producing output.
    pub from: Endpoint,
    /// The consuming input.
    pub to: Endpoint,
}

/// How the scales of a quantized cache are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ScaleLayout {
    /// One scale per head and block of `tokens` tokens (`[batch, heads, blocks]`).
    Blocks {
        /// Tokens a block.
        tokens: u64,
    },
    /// One scale per group of `group` consecutive values of a token's row.
    Groups {
        /// Values a group.
        group: u64,
    },
    /// One static scale per KV head and channel (`[1, heads, 1, head_dim]`), constants of the
    /// model: its `GroupQueryAttention` reads and writes the codes itself, and the cache has no
    /// scale tensors at the interface.
    Channels,
}

/// A `past…` input and the `present…` output that continues it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvPair {
    /// The input.
    pub past: String,
    /// The output that the next step feeds to `past`.
    pub present: String,
    /// The input of `past`'s scales (quantized caches).
    pub past_scale: Option<String>,
    /// The output of `present`'s scales (quantized caches).
    pub present_scale: Option<String>,
}

/// The decoder's KV cache.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvCache {
    /// The stage that has it.
    pub stage: String,
    /// `float`, or the code format (`int8`, `fp8`, `int4`).
    pub format: String,
    /// The element type of the cache tensors (codes for quantized caches).
    pub code_dtype: String,
    /// KV heads (dim 1 of a cache tensor), when static.
    pub heads: Option<u64>,
    /// Values per token and head (the last dim).
    pub head_dim: u64,
    /// The scales' layout (quantized caches).
    pub scales: Option<ScaleLayout>,
    /// The scales' element type (quantized caches).
    pub scale_dtype: Option<String>,
    /// Every pair, in input order.
    pub pairs: Vec<KvPair>,
    /// Each past may be its present's buffer (`[batch, heads, context, head_dim]`, written in
    /// place): every present is a `GroupQueryAttention` result of its past, and nothing else
    /// reads a past's length.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shared_buffer: bool,
}

/// One quantized feature output of the vision encoder.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageFeature {
    /// The codes output.
    pub name: String,
    /// The scales output.
    pub scale: String,
    /// Values a group.
    pub group: u64,
}

/// The vision encoder's quantized features.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageCache {
    /// The stage that writes them.
    pub stage: String,
    /// The code format (`int4`).
    pub format: String,
    /// The outputs.
    pub outputs: Vec<ImageFeature>,
}

/// How to generate tokens.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Generation {
    /// The decoder stage.
    pub stage: String,
    /// Its token input.
    pub input_ids: String,
    /// Its attention mask input (ones over past and new tokens), if any.
    pub attention_mask: Option<String>,
    /// Its position input (0-based positions of the new tokens), if any.
    pub position_ids: Option<String>,
    /// Its logits output (`[batch, tokens, vocab]`).
    pub logits: String,
    /// The beginning-of-sequence token, if known.
    pub bos_token_id: Option<i64>,
    /// The end-of-sequence tokens (generation stops at any of them).
    pub eos_token_id: Vec<i64>,
    /// The padding token, if known.
    pub pad_token_id: Option<i64>,
    /// The most tokens a sequence may hold (prompt and generated).
    pub context_length: u64,
    /// The logits' last dim.
    pub vocab_size: u64,
}

/// Whether onnxruntime-genai can run the package.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Genai {
    /// The config file written for it (`genai_config.json`), if the package fits its contract.
    pub config: Option<String>,
    /// Why not, otherwise.
    pub reason: Option<String>,
}
