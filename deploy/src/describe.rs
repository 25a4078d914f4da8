//! What a compiled module is as a pipeline: each entry graph's role, the decoder's KV cache and
//! generation interface, the vision encoder's quantized features. Read from the graphs alone
//! (names, element types, shapes, modality), so a package written by any compile describes
//! itself.

use mmq_ir::modality::{self, Modality};
use mmq_ir::{DType, Dim, GraphId, Module, Value};
use mmq_kernels::cache::{CacheFormat, CacheScales};
use mmq_passes::quant::cache::present_name;

use crate::spec::{Generation, ImageCache, ImageFeature, KvCache, KvPair, Port, Role, ScaleLayout};

/// Generation settings a model's files do not say: from `--generation-config` (a Hugging Face
/// `generation_config.json` or `config.json`) or given directly.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GenerationConfig {
    /// The beginning-of-sequence token.
    pub bos_token_id: Option<i64>,
    /// The end-of-sequence tokens.
    pub eos_token_id: Vec<i64>,
    /// The padding token.
    pub pad_token_id: Option<i64>,
    /// The most tokens a sequence may hold.
    pub context_length: Option<u64>,
}

/// The context length a package states when nothing says it.
pub const DEFAULT_CONTEXT_LENGTH: u64 = 2048;

/// A generation config [`GenerationConfig::from_json`] cannot read: what is wrong (the
/// caller names the file).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl GenerationConfig {
    /// Reads the settings from a Hugging Face `generation_config.json` or `config.json`:
    /// `bos_token_id`, `eos_token_id` (a number or a list), `pad_token_id`, and the context
    /// length from `max_position_embeddings`, `n_positions`, `max_sequence_length` or
    /// `max_length`.
    pub fn from_json(text: &str) -> Result<GenerationConfig, ConfigError> {
        GenerationConfig::read(text).map_err(ConfigError)
    }

    fn read(text: &str) -> Result<GenerationConfig, String> {
        let v: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| format!("not JSON: {e} (line {}, column {})", e.line(), e.column()))?;
        let obj = v
            .as_object()
            .ok_or_else(|| "not a JSON object".to_owned())?;
        let int = |key: &str| -> Result<Option<i64>, String> {
            match obj.get(key) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(x) => x
                    .as_i64()
                    .map(Some)
                    .ok_or_else(|| format!("'{key}' is {x}, not an integer")),
            }
        };
        let eos = match obj.get("eos_token_id") {
            None | Some(serde_json::Value::Null) => Vec::new(),
            Some(serde_json::Value::Array(a)) => a
                .iter()
                .map(|x| {
                    x.as_i64()
                        .ok_or_else(|| format!("'eos_token_id' holds {x}, not an integer"))
                })
                .collect::<Result<_, _>>()?,
            Some(x) => vec![
                x.as_i64()
                    .ok_or_else(|| format!("'eos_token_id' is {x}, not an integer"))?,
            ],
        };
        let mut context = None;
        for key in [
            "max_position_embeddings",
            "n_positions",
            "max_sequence_length",
            "max_length",
        ] {
            if let Some(n) = int(key)? {
                context = Some(
                    u64::try_from(n)
                        .ok()
                        .filter(|&n| n > 0)
                        .ok_or_else(|| format!("'{key}' is {n}, not a positive length"))?,
                );
                break;
            }
        }
        Ok(GenerationConfig {
            bos_token_id: int("bos_token_id")?,
            eos_token_id: eos,
            pad_token_id: int("pad_token_id")?,
            context_length: context,
        })
    }
}

/// A value's name (empty when it has none).
pub(crate) fn name(m: &Module, v: Value) -> String {
    m.values[v].name.clone().unwrap_or_default()
}

/// A graph input or output as `pipeline.json` lists it.
pub(crate) fn port(m: &Module, v: Value) -> Port {
    let ty = m.value_type(v);
    let shape = ty
        .shape()
        .unwrap_or_default()
        .iter()
        .map(|d| match d.as_known() {
            Some(n) => serde_json::Value::from(n),
            None => serde_json::Value::from(d.render(&|s| m.symbols[s].name.clone())),
        })
        .collect();
    Port {
        name: name(m, v),
        dtype: ty.dtype().map_or_else(|| "?".to_owned(), |d| d.to_string()),
        shape,
    }
}

fn find(m: &Module, list: &[Value], wanted: &str) -> Option<Value> {
    list.iter()
        .copied()
        .find(|&v| m.values[v].name.as_deref() == Some(wanted))
}

/// The decoder interface of graph `g`: its token input and logits output.
fn decoder_ports(m: &Module, g: GraphId) -> Option<(Value, Value)> {
    let gd = &m.graphs[g];
    let ids = find(m, &gd.inputs, "input_ids")?;
    let logits = find(m, &gd.outputs, "logits").or_else(|| {
        gd.outputs.iter().copied().find(|&o| {
            let ty = m.value_type(o);
            ty.dtype().is_some_and(DType::is_float)
                && ty
                    .shape()
                    .is_some_and(|s| s.len() == 3 && s.last().and_then(Dim::as_known).is_some())
        })
    })?;
    Some((ids, logits))
}

/// The role of entry graph `g`.
pub(crate) fn role(m: &Module, g: GraphId, overrides: &[(String, Modality)]) -> Role {
    if decoder_ports(m, g).is_some() {
        return Role::Decoder;
    }
    let vision_only = modality::analyze(m, g, overrides).is_ok_and(|labels| {
        let gd = &m.graphs[g];
        !gd.outputs.is_empty()
            && gd
                .outputs
                .iter()
                .all(|&o| labels.value(o) == Modality::Vision)
    });
    if vision_only {
        Role::VisionEncoder
    } else {
        Role::Model
    }
}

/// The KV cache of graph `g` (stage `stage`): every `past…` input whose `present…` output
/// continues it, with the `…_scale` companions a quantized cache has.
pub(crate) fn kv_cache(
    m: &Module,
    g: GraphId,
    stage: &str,
    format: Option<CacheFormat>,
) -> Result<Option<KvCache>, String> {
    let gd = &m.graphs[g];
    let mut pairs = Vec::new();
    let mut first: Option<Value> = None;
    for &past in &gd.inputs {
        let past_name = name(m, past);
        if !past_name.to_ascii_lowercase().contains("past") || past_name.ends_with("_scale") {
            continue;
        }
        let Some(present) = present_name(&past_name)
            .into_iter()
            .find_map(|p| find(m, &gd.outputs, &p))
        else {
            continue;
        };
        let present_name = name(m, present);
        let scale_of = |list: &[Value], of: &str| {
            let scale = format!("{of}_scale");
            find(m, list, &scale).map(|_| scale)
        };
        let past_scale = scale_of(&gd.inputs, &past_name);
        let present_scale = scale_of(&gd.outputs, &present_name);
        if past_scale.is_some() != present_scale.is_some() {
            return Err(format!(
                "KV input '{past_name}' and output '{present_name}': one has scales, the other not"
            ));
        }
        first.get_or_insert(past);
        pairs.push(KvPair {
            past: past_name,
            present: present_name,
            past_scale,
            present_scale,
        });
    }
    let Some(first) = first else {
        return Ok(None);
    };
    let ty = m.value_type(first);
    let shape = ty.shape().unwrap_or_default();
    let head_dim = shape
        .last()
        .and_then(Dim::as_known)
        .and_then(|n| u64::try_from(n).ok())
        .ok_or_else(|| {
            format!(
                "KV input '{}': the last dim (values per token) is not static",
                name(m, first)
            )
        })?;
    let heads = (shape.len() == 4)
        .then(|| shape[1].as_known().and_then(|n| u64::try_from(n).ok()))
        .flatten();
    let quantized = pairs.iter().any(|p| p.past_scale.is_some());
    let codes = ty.dtype().is_some_and(|d| !d.is_float());
    let (format_name, scales, scale_dtype) = match (quantized, format) {
        // INT8 codes with no scales at the interface: `GroupQueryAttention`'s own cache.
        (false, Some(f @ CacheFormat::Int8)) if codes => (
            f.name().to_owned(),
            Some(ScaleLayout::Channels),
            Some("f32".to_owned()),
        ),
        (false, _) => ("float".to_owned(), None, None),
        (true, Some(f)) => {
            let scales = match f.scales(head_dim as usize).map_err(|e| e.0)? {
                CacheScales::Blocks { tokens } => ScaleLayout::Blocks {
                    tokens: tokens as u64,
                },
                CacheScales::Groups { group } => ScaleLayout::Groups {
                    group: group as u64,
                },
            };
            let scale = pairs[0]
                .past_scale
                .as_deref()
                .and_then(|s| find(m, &gd.inputs, s))
                .and_then(|v| m.value_type(v).dtype())
                .map(|d| d.to_string());
            (f.name().to_owned(), Some(scales), scale)
        }
        (true, None) => {
            return Err("the KV cache has scale inputs but no --kv-cache format was given".into());
        }
    };
    let shared_buffer = shares_buffer(m, g, &pairs);
    Ok(Some(KvCache {
        shared_buffer,
        stage: stage.to_owned(),
        format: format_name,
        code_dtype: ty.dtype().map_or_else(|| "?".to_owned(), |d| d.to_string()),
        heads,
        head_dim,
        scales,
        scale_dtype,
        pairs,
    }))
}

/// The quantized image features of vision stage `g`: outputs with a `…_scale` companion.
pub(crate) fn image_cache(
    m: &Module,
    g: GraphId,
    stage: &str,
    format: Option<CacheFormat>,
) -> Option<ImageCache> {
    let format = format?;
    let gd = &m.graphs[g];
    let outputs: Vec<ImageFeature> = gd
        .outputs
        .iter()
        .filter_map(|&o| {
            let n = name(m, o);
            let scale = find(m, &gd.outputs, &format!("{n}_scale"))?;
            let width = m
                .value_type(o)
                .shape()?
                .last()
                .and_then(Dim::as_known)
                .and_then(|w| usize::try_from(w).ok())?;
            let Ok(CacheScales::Groups { group }) = format.scales(width) else {
                return None;
            };
            Some(ImageFeature {
                name: n,
                scale: name(m, scale),
                group: group as u64,
            })
        })
        .collect();
    (!outputs.is_empty()).then(|| ImageCache {
        stage: stage.to_owned(),
        format: format.name().to_owned(),
        outputs,
    })
}

/// The generation interface of decoder stage `g`.
pub(crate) fn generation(
    m: &Module,
    g: GraphId,
    stage: &str,
    config: &GenerationConfig,
) -> Option<Generation> {
    let (ids, logits) = decoder_ports(m, g)?;
    let gd = &m.graphs[g];
    let vocab = m
        .value_type(logits)
        .shape()?
        .last()
        .and_then(Dim::as_known)
        .and_then(|n| u64::try_from(n).ok())?;
    Some(Generation {
        stage: stage.to_owned(),
        input_ids: name(m, ids),
        attention_mask: find(m, &gd.inputs, "attention_mask").map(|v| name(m, v)),
        position_ids: find(m, &gd.inputs, "position_ids").map(|v| name(m, v)),
        logits: name(m, logits),
        bos_token_id: config.bos_token_id,
        eos_token_id: config.eos_token_id.clone(),
        pad_token_id: config.pad_token_id,
        context_length: config.context_length.unwrap_or(DEFAULT_CONTEXT_LENGTH),
        vocab_size: vocab,
    })
}

/// The width of the token embedding table of graph `g` (a `Gather` of a constant
/// `[vocab, hidden]` table by `input_ids`), if there is one.
pub(crate) fn hidden_size(m: &Module, g: GraphId, ids: &str) -> Option<u64> {
    let ids = find(m, &m.graphs[g].inputs, ids)?;
    m.graphs[g].nodes().iter().find_map(|&n| {
        let node = &m.nodes[n];
        if node.op.op_type() != "Gather" || node.inputs.get(1).copied().flatten() != Some(ids) {
            return None;
        }
        let table = node.inputs.first().copied().flatten()?;
        let shape = m.value_type(table).shape()?;
        (shape.len() == 2)
            .then(|| shape[1].as_known())
            .flatten()
            .and_then(|h| u64::try_from(h).ok())
    })
}

/// Whether every present cache is a result of a `GroupQueryAttention` that reads the past of
/// its pair: the past may then be the present's buffer (the compiler writes that form only where
/// nothing else reads a past's sequence length).
fn shares_buffer(m: &Module, g: GraphId, pairs: &[KvPair]) -> bool {
    let gd = &m.graphs[g];
    !pairs.is_empty()
        && pairs.iter().all(|p| {
            let (Some(past), Some(present)) = (
                find(m, &gd.inputs, &p.past),
                find(m, &gd.outputs, &p.present),
            ) else {
                return false;
            };
            match m.values[present].def {
                mmq_ir::ValueDef::Output { node, index } => {
                    matches!(m.nodes[node].op, mmq_ir::Op::GroupQueryAttention { .. })
                        && m.nodes[node]
                            .inputs
                            .get(2 + index as usize)
                            .copied()
                            .flatten()
                            == Some(past)
                }
                _ => false,
            }
        })
}
