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
    let gqa = m
        .entries
        .iter()
        .any(|e| !gqa_int8_pairs(m, e.graph).is_empty());
    let blocks = options.kv_cache.filter(|_| {
        m.entries
            .iter()
            .any(|e| !block_pairs(m, e.graph).is_empty())
    });
    let float_kv = m
        .entries
        .iter()
        .any(|e| !float_pairs(m, e.graph).is_empty());
    if float_kv || !(gqa || blocks.is_some() || options.image_cache.is_some()) {
        return None;
    }
    let mut o = PlanOptions {
        kv_format: blocks.unwrap_or(CacheFormat::Int8),
        images: u64::from(options.image_cache.is_some()),
        budget: u64::MAX / 4,
        modality: options.modality.clone(),
    };
    // The layout first, then the budget that holds `context` tokens besides the image slots.
    let layout = plan_models(m, &o).ok()?;
    let images = layout.kv_offset;
    let pages = match &layout.kv_page {
        Some(p) => context.div_ceil(p.tokens) * p.bytes,
        None => 0,
    };
    o.budget = images + pages;
    plan_models(m, &o).ok()
}

/// A module whose caches cannot be planned: what does not fit.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PlanModuleError(pub String);

fn plan_models(m: &Module, options: &PlanOptions) -> Result<CachePlan, String> {
    let mut kv = Vec::new();
    let mut image = None;
    let mut static_scales = false;
    for e in &m.entries {
        let pairs = float_pairs(m, e.graph);
        // A package's GroupQueryAttention cache: int8 codes whose scales are constants of the
        // model, pages of codes only.
        let gqa = gqa_int8_pairs(m, e.graph);
        if !gqa.is_empty() {
            if options.kv_format != CacheFormat::Int8 {
                return Err(format!(
                    "the KV cache already holds int8 codes (a package's GroupQueryAttention \
                     cache), not {}",
                    options.kv_format
                ));
            }
            static_scales = true;
        }
        // `--kv-cache`'s codes at the interface, each with its `…_scale` input.
        for (name, heads, head_dim, format) in block_pairs(m, e.graph) {
            if format != options.kv_format {
                return Err(format!(
                    "KV input '{name}' already holds {format} codes, not {}",
                    options.kv_format
                ));
            }
            kv.push(KvTensor {
                name,
                heads,
                head_dim,
            });
        }
        for (name, heads, head_dim) in gqa {
            kv.push(KvTensor {
                name,
                heads,
                head_dim,
            });
        }
        for p in pairs {
            let ty = m.value_type(p.past);
            let name = m.values[p.past].name.clone().unwrap_or_default();
            let shape = ty.shape().unwrap_or_default();
            // [batch, heads, tokens, head_dim]: the heads are the dims between batch and tokens.
            let heads = shape[1..shape.len().saturating_sub(2)]
                .iter()
                .map(|d| d.as_known().and_then(|n| u64::try_from(n).ok()))
                .try_fold(1u64, |acc, d| d.map(|d| acc * d))
                .ok_or_else(|| format!("KV input '{name}': the head count is not static"))?;
            kv.push(KvTensor {
                name,
                heads,
                head_dim: p.width as u64,
            });
        }
        let labels = modality::analyze(m, e.graph, &options.modality).map_err(|e| e.to_string())?;
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
    plan(PlanRequest {
        kv,
        kv_format: options.kv_format,
        kv_static_scales: static_scales,
        image,
        images: options.images,
        budget: options.budget,
    })
    .map_err(|e| e.to_string())
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

/// The `past…` inputs of graph `g` that hold `--kv-cache`'s codes (`[batch, heads, tokens,
/// head_dim]`, int8, FP8 or INT4, each with its `…_scale` input): (name, heads, head_dim,
/// format).
fn block_pairs(m: &Module, g: mmq_ir::GraphId) -> Vec<(String, u64, u64, CacheFormat)> {
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
        let ty = m.value_type(v);
        let format = match ty.dtype() {
            Some(mmq_ir::DType::I8) => CacheFormat::Int8,
            Some(mmq_ir::DType::F8E4M3FN) => CacheFormat::Fp8,
            Some(mmq_ir::DType::I4) => CacheFormat::Int4,
            _ => continue,
        };
        let known = |i: usize| {
            ty.shape()
                .filter(|s| s.len() == 4)
                .and_then(|s| s[i].as_known())
                .and_then(|x| u64::try_from(x).ok())
        };
        if let (Some(heads), Some(head_dim)) = (known(1), known(3)) {
            out.push((name.to_owned(), heads, head_dim, format));
        }
    }
    out
}

/// The `past…` inputs of graph `g` that a `GroupQueryAttention` reads as its INT8 cache
/// (`k_quant_type` / `v_quant_type` `PER_CHANNEL`, int8 codes): (name, heads, head_dim).
fn gqa_int8_pairs(m: &Module, g: mmq_ir::GraphId) -> Vec<(String, u64, u64)> {
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
        for v in [3, 4]
            .into_iter()
            .filter_map(|i| node.inputs.get(i).copied().flatten())
        {
            let ty = m.value_type(v);
            let dims: Option<Vec<u64>> = ty.shape().map(|s| {
                s.iter()
                    .map(|d| {
                        d.as_known()
                            .and_then(|x| u64::try_from(x).ok())
                            .unwrap_or(0)
                    })
                    .collect()
            });
            if let (Some(mmq_ir::DType::I8), Some(&[_, heads, _, head_dim])) =
                (ty.dtype(), dims.as_deref())
            {
                out.push((
                    m.values[v].name.clone().unwrap_or_default(),
                    heads,
                    head_dim,
                ));
            }
        }
    }
    out
}
