//! The cache pool of a set of models (`mmq plan-cache`): the KV tensors of the decoders (the
//! `past…` inputs the KV-cache pass quantizes) and the image features of the vision encoders
//! (their vision-only outputs), planned by [`mmq_kernels::cache::plan`].

use mmq_ir::Module;
use mmq_ir::modality::{self, Modality};
use mmq_kernels::cache::CacheFormat;
use mmq_kernels::cache::plan::{CachePlan, ImageTensor, KvTensor, PlanRequest, plan};
use mmq_passes::quant::cache::kv_pairs;

/// What to plan besides the models.
#[derive(Clone, Debug)]
pub struct PlanOptions {
    /// The KV code format.
    pub kv_format: CacheFormat,
    /// Image slots to reserve.
    pub images: u64,
    /// The pool's size limit in bytes.
    pub budget: u64,
    /// Modality overrides (input name, label).
    pub modality: Vec<(String, Modality)>,
}

/// Plans the pool for the models of `m`.
pub fn plan_module(m: &Module, options: &PlanOptions) -> Result<CachePlan, PlanModuleError> {
    plan_models(m, options).map_err(PlanModuleError)
}

/// The pool of a deployment package's quantized caches, as its models hold them: `--kv-cache`'s
/// blocks, `GroupQueryAttention`'s INT8 pages of codes, INT4 image features; sized for one
/// sequence of `context` tokens and one image. `None` where the KV cache is float (there is no
/// quantized pool to describe), where there is no cache to plan, or where planning fails.
pub fn package_plan(
    m: &Module,
    options: &crate::CompileOptions,
    context: u64,
) -> Option<CachePlan> {
    let caches = caches(m, &options.modality).ok()?;
    let held = |h: fn(&Held) -> bool| caches.kv.iter().any(|(_, x)| h(x));
    if held(|h| matches!(h, Held::Float))
        || !(held(|h| !matches!(h, Held::Float)) || options.image_cache.is_some())
    {
        return None;
    }
    let kv_format = caches
        .kv
        .iter()
        .find_map(|(_, h)| match h {
            Held::Blocks(f) => Some(*f),
            _ => None,
        })
        .unwrap_or(CacheFormat::Int8);
    let images = u64::from(options.image_cache.is_some());
    // The layout first, then the budget that holds `context` tokens besides the image slots.
    let layout = plan(request(&caches, kv_format, images, u64::MAX / 4).ok()?).ok()?;
    let pages = layout
        .kv_page
        .as_ref()
        .map_or(0, |p| context.div_ceil(p.tokens) * p.bytes);
    plan(request(&caches, kv_format, images, layout.kv_offset + pages).ok()?).ok()
}

/// A module whose caches cannot be planned: what does not fit.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PlanModuleError(pub String);

/// How a model holds a KV tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Held {
    /// Float: the pool holds it quantized in the requested format.
    Float,
    /// `--kv-cache`'s codes of this format, with their `…_scale` input.
    Blocks(CacheFormat),
    /// `GroupQueryAttention`'s INT8 codes, its scales static in the model.
    Static,
}

/// The caches of the models' entry graphs: the KV tensors in input order, and the first image
/// feature output.
struct Caches {
    kv: Vec<(KvTensor, Held)>,
    image: Option<ImageTensor>,
}

fn plan_models(m: &Module, options: &PlanOptions) -> Result<CachePlan, String> {
    let caches = caches(m, &options.modality)?;
    let r = request(&caches, options.kv_format, options.images, options.budget)?;
    plan(r).map_err(|e| e.to_string())
}

/// The plan's request for `caches`, the KV tensors in `format` (the one their codes have where
/// the models hold codes).
fn request(
    caches: &Caches,
    format: CacheFormat,
    images: u64,
    budget: u64,
) -> Result<PlanRequest, String> {
    let mut static_scales = false;
    for (t, held) in &caches.kv {
        match held {
            Held::Blocks(f) if *f != format => {
                return Err(format!(
                    "KV input '{}' already holds {f} codes, not {format}",
                    t.name
                ));
            }
            Held::Static if format != CacheFormat::Int8 => {
                return Err(format!(
                    "the KV cache already holds int8 codes (a package's GroupQueryAttention \
                     cache), not {format}"
                ));
            }
            Held::Static => static_scales = true,
            _ => {}
        }
    }
    Ok(PlanRequest {
        kv: caches.kv.iter().map(|(t, _)| t.clone()).collect(),
        kv_format: format,
        kv_static_scales: static_scales,
        image: caches.image.clone(),
        images,
        budget,
    })
}

/// The caches of `m`'s entry graphs.
fn caches(m: &Module, modality: &[(String, Modality)]) -> Result<Caches, String> {
    let mut kv = Vec::new();
    let mut image = None;
    for e in &m.entries {
        // `--kv-cache`'s codes at the interface, each with its `…_scale` input.
        for (t, format) in block_pairs(m, e.graph) {
            kv.push((t, Held::Blocks(format)));
        }
        // A package's GroupQueryAttention cache: int8 codes whose scales are constants of the
        // model, pages of codes only.
        kv.extend(
            gqa_int8_pairs(m, e.graph)
                .into_iter()
                .map(|t| (t, Held::Static)),
        );
        for p in float_pairs(m, e.graph) {
            let ty = m.value_type(p.past);
            let name = m.values[p.past].name.clone().unwrap_or_default();
            let shape = ty.shape().unwrap_or_default();
            // [batch, heads, tokens, head_dim]: the heads are the dims between batch and tokens.
            let heads = shape[1..shape.len().saturating_sub(2)]
                .iter()
                .map(|d| d.as_known().and_then(|n| u64::try_from(n).ok()))
                .try_fold(1u64, |acc, d| d.map(|d| acc * d))
                .ok_or_else(|| format!("KV input '{name}': the head count is not static"))?;
            let t = KvTensor {
                name,
                heads,
                head_dim: p.width as u64,
            };
            kv.push((t, Held::Float));
        }
        let labels = modality::analyze(m, e.graph, modality).map_err(|e| e.to_string())?;
        for &o in &m.graphs[e.graph].outputs {
            if labels.value(o) != Modality::Vision || image.is_some() {
                continue;
            }
            let shape = m.value_type(o).shape().unwrap_or_default();
            let known: Option<Vec<u64>> = shape
                .iter()
                .skip(1)
                .map(|d| d.as_known().and_then(|n| u64::try_from(n).ok()))
                .collect();
            if let Some([tokens, width]) = known.as_deref() {
                image = Some(ImageTensor {
                    name: m.values[o].name.clone().unwrap_or_default(),
                    tokens: *tokens,
                    width: *width,
                });
            }
        }
    }
    Ok(Caches { kv, image })
}

/// The float KV pairs of graph `g` ([`kv_pairs`]) but quantized codes (FP8) and their scales
/// (`…_scale`).
fn float_pairs(m: &Module, g: mmq_ir::GraphId) -> Vec<mmq_passes::quant::cache::KvPair> {
    use mmq_ir::DType;
    let (mut pairs, _) = kv_pairs(m, g);
    pairs.retain(|p| {
        let name = m.values[p.past].name.as_deref().unwrap_or_default();
        let dtype = m.value_type(p.past).dtype();
        !name.ends_with("_scale")
            && matches!(
                dtype,
                Some(DType::F32 | DType::F16 | DType::BF16 | DType::F64)
            )
    });
    pairs
}

/// Cache input `v` as a KV tensor, when it is `[batch, heads, tokens, head_dim]` with static
/// heads and head size.
fn cache_tensor(m: &Module, v: mmq_ir::Value) -> Option<KvTensor> {
    let known = |i: usize| {
        let s = m.value_type(v).shape().filter(|s| s.len() == 4)?;
        u64::try_from(s[i].as_known()?).ok()
    };
    Some(KvTensor {
        name: m.values[v].name.clone().unwrap_or_default(),
        heads: known(1)?,
        head_dim: known(3)?,
    })
}

/// The `past…` inputs of graph `g` that hold `--kv-cache`'s codes (int8, FP8 or INT4, each with
/// its `…_scale` input), with their format.
fn block_pairs(m: &Module, g: mmq_ir::GraphId) -> Vec<(KvTensor, CacheFormat)> {
    let inputs = &m.graphs[g].inputs;
    let named = |n: &str| {
        inputs
            .iter()
            .any(|&v| m.values[v].name.as_deref() == Some(n))
    };
    let mut out = Vec::new();
    for &v in inputs {
        let Some(name) = m.values[v].name.as_deref() else {
            continue;
        };
        if !name.contains("past") || name.ends_with("_scale") || !named(&format!("{name}_scale")) {
            continue;
        }
        let format = match m.value_type(v).dtype() {
            Some(mmq_ir::DType::I8) => CacheFormat::Int8,
            Some(mmq_ir::DType::F8E4M3FN) => CacheFormat::Fp8,
            Some(mmq_ir::DType::I4) => CacheFormat::Int4,
            _ => continue,
        };
        out.extend(cache_tensor(m, v).map(|t| (t, format)));
    }
    out
}

/// The `past…` inputs of graph `g` that a `GroupQueryAttention` reads as its INT8 cache
/// (`k_quant_type` / `v_quant_type` `PER_CHANNEL`, int8 codes).
fn gqa_int8_pairs(m: &Module, g: mmq_ir::GraphId) -> Vec<KvTensor> {
    let mut out = Vec::new();
    for &n in m.graphs[g].nodes() {
        let node = &m.nodes[n];
        let mmq_ir::Op::GroupQueryAttention {
            k_quant_type,
            v_quant_type,
            ..
        } = &node.op
        else {
            continue;
        };
        if k_quant_type.as_deref() != Some("PER_CHANNEL")
            || v_quant_type.as_deref() != Some("PER_CHANNEL")
        {
            continue;
        }
        out.extend(
            [3, 4]
                .into_iter()
                .filter_map(|i| node.inputs.get(i).copied().flatten())
                .filter(|&v| m.value_type(v).dtype() == Some(mmq_ir::DType::I8))
                .filter_map(|v| cache_tensor(m, v)),
        );
    }
    out
}
