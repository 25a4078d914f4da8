//! Quantized caches at the graph interface.
//!
//! `--kv-cache FORMAT` ([`KvCachePass`]): every KV-cache input `past…` whose output `present…`
//! follows the present→past naming convention (`past_key_values.0.key` ↔ `present.0.key`,
//! `past_key_0` ↔ `present_key_0`) becomes quantized codes plus scales, in the layout of
//! [`mmq_kernels::cache`]: the input `past_key_values.0.key` holds the codes and a new input
//! `past_key_values.0.key_scale` the scales; the output `present.0.key` holds codes and
//! `present.0.key_scale` scales, so a decode loop feeds every `present*` output back to the
//! `past*` input of the same name. Inside the graph the codes are dequantized where the
//! model read the float cache, and the float present is quantized where the model wrote it.
//!
//! `--image-cache int4` ([`ImageCachePass`]): every graph output computed from vision inputs
//! only (modality `vision`) becomes INT4 codes in groups of 64 with binary16 scales
//! (`image_embeds` + `image_embeds_scale`); a graph of the same module that reads an input of that
//! name reads the codes and scales and dequantizes them.
//!
//! The forms are standard ONNX ops (`ReduceMax`, `Round`, `Clip`, `Cast`), emitted where the
//! target's [`QdqRules::cache_io`](crate::targets::QdqRules::cache_io) allows them. Where the
//! present is the past followed by the new tokens (`Concat(past, new)` along the tokens, as
//! exporters write it), INT8 codes of the past's whole blocks pass to the present unchanged and only the last, partial block and the new tokens are quantized: the
//! last block's scale grows with its content, as in the CUDA kernels' append. Elsewhere (and for
//! FP8 and INT4 codes, which ONNX Runtime does not slice or concatenate) the whole present is
//! quantized from its float value every step.

use mmq_ir::modality::{self, Modality};
use mmq_ir::{DType, Dim, GraphId, Module, Node, Op, Type, Value, ValueDef};
use mmq_kernels::cache::{CacheFormat, CacheScales};

use crate::targets::trt::lower::plugin_op;
use crate::{Pass, PassError, PassOptions, PassReport};
use mmq_ir::edit::{Emit, place};

/// `--kv-cache FORMAT`: quantized KV-cache inputs and outputs.
#[derive(Clone, Debug)]
pub struct KvCachePass {
    /// The code format.
    pub format: CacheFormat,
}

/// `--image-cache int4`: vision feature outputs as INT4 groups.
#[derive(Clone, Debug)]
pub struct ImageCachePass {
    /// The code format (INT4).
    pub format: CacheFormat,
    /// Modality overrides (input name, label), as `--modality` gives them.
    pub modality: Vec<(String, Modality)>,
}

fn fail(pass: &str, message: impl Into<String>) -> PassError {
    PassError::Failed {
        pass: pass.to_owned(),
        message: message.into(),
    }
}

/// A KV-cache input and the output that continues it.
#[derive(Clone, Debug)]
pub struct KvPair {
    /// The graph.
    pub graph: GraphId,
    /// The `past…` input.
    pub past: Value,
    /// The `present…` output.
    pub present: Value,
    /// Elements per token (the last dim).
    pub width: usize,
}

/// The names the output that continues input `past` may have, by the conventions exporters
/// follow (`past_key_values.0.key` -> `present.0.key`, `past_key_0` -> `present_key_0`).
pub fn present_name(past: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (from, to) in [
        ("past_key_values", "present"),
        ("past_key_values", "present_key_values"),
        ("past", "present"),
        ("Past", "Present"),
    ] {
        if past.contains(from) {
            out.push(past.replacen(from, to, 1));
        }
    }
    out
}

/// The position among top-level graph `g`'s outputs of the one that continues its input named
/// `past` ([`present_name`]'s conventions).
pub fn continuing_output(m: &Module, g: GraphId, past: &str) -> Option<usize> {
    let outputs = &m.graphs[g].outputs;
    present_name(past).into_iter().find_map(|p| {
        outputs
            .iter()
            .position(|&o| m.values[o].name.as_deref() == Some(p.as_str()))
    })
}

/// Whether top-level graph `g` reads a KV cache: an input named `past…` that an output continues,
/// whatever its form (float, codes, or a buffer the present shares).
pub fn reads_kv_cache(m: &Module, g: GraphId) -> bool {
    m.graphs[g].inputs.iter().any(|&v| {
        m.values[v].name.as_deref().is_some_and(|name| {
            name.to_ascii_lowercase().contains("past") && continuing_output(m, g, name).is_some()
        })
    })
}

/// The static width of a `[..., tokens, width]` float tensor type.
fn cache_width(ty: &Type) -> Option<(DType, usize, usize)> {
    let dtype = ty.dtype()?;
    let shape = ty.shape()?;
    if !dtype.is_float() || shape.len() < 2 {
        return None;
    }
    let width = shape.last()?.as_known()?;
    Some((dtype, shape.len(), usize::try_from(width).ok()?))
}

/// The KV-cache pairs of top-level graph `g`, and a note for each `past…` input left alone.
pub fn kv_pairs(m: &Module, g: GraphId) -> (Vec<KvPair>, Vec<String>) {
    let (mut pairs, mut notes) = (Vec::new(), Vec::new());
    let gd = &m.graphs[g];
    for &past in &gd.inputs {
        let Some(name) = m.values[past].name.as_deref() else {
            continue;
        };
        if !name.to_ascii_lowercase().contains("past") {
            continue;
        }
        let Some(present_index) = continuing_output(m, g, name) else {
            notes.push(format!("input '{name}': no output continues it (present…)"));
            continue;
        };
        let (pt, ot) = (m.value_type(past), m.value_type(gd.outputs[present_index]));
        match (cache_width(pt), cache_width(ot)) {
            (Some((d1, r1, w1)), Some((d2, r2, w2))) if d1 == d2 && r1 == r2 && w1 == w2 => {
                if let ValueDef::Input {
                    default: Some(_), ..
                } = m.values[past].def
                {
                    notes.push(format!("input '{name}': has a default value; left float"));
                    continue;
                }
                pairs.push(KvPair {
                    graph: g,
                    past,
                    present: gd.outputs[present_index],
                    width: w1,
                });
            }
            _ => notes.push(format!(
                "input '{name}': not a float [..., tokens, width] tensor of static width like \
                 its output; left float"
            )),
        }
    }
    (pairs, notes)
}

impl Pass for KvCachePass {
    fn name(&self) -> &str {
        "kv-cache"
    }

    fn run(&self, m: &mut Module, opts: &PassOptions) -> Result<PassReport, PassError> {
        let pass = self.name();
        // Where the target has no standard-op cache form, INT8 blocks go through its plugins.
        let plugin = kv_through_plugin(self.format, opts);
        if !plugin {
            check_target(pass, opts)?;
        }
        let mut report = PassReport::default();
        let roots: Vec<GraphId> = m.entries.iter().map(|e| e.graph).collect();
        let mut all = Vec::new();
        for &g in &roots {
            let (pairs, notes) = kv_pairs(m, g);
            report.notes.extend(notes);
            all.extend(pairs);
        }
        if all.is_empty() {
            return Err(fail(
                pass,
                "no graph has a KV cache: an input named past… whose output present… follows \
                 the present→past naming (past_key_values.N.key ↔ present.N.key)",
            ));
        }
        let mut geometry = Vec::new();
        for p in &all {
            let name = m.values[p.past].name.clone().unwrap_or_default();
            let scales = self
                .format
                .scales(p.width)
                .map_err(|e| fail(pass, format!("input '{name}': {e}")))?;
            geometry.push(scales);
        }
        prepare_opset(m, self.format, pass, &mut report)?;
        let first = geometry[0];
        for (p, scales) in all.iter().zip(geometry) {
            let past_name = m.values[p.past].name.clone().unwrap_or_default();
            let (past_float, past_scales) =
                dequantize_input(m, p.graph, p.past, self.format, scales, plugin)
                    .map_err(|e| fail(pass, format!("input '{past_name}': {e}")))?;
            let rank = m.value_type(p.past).shape().map_or(0, <[Dim]>::len);
            // ONNX Runtime slices and concatenates INT8 codes, not FP8 or INT4 ones.
            let past = (self.format.code_dtype() == DType::I8
                && continues(m, p.present, past_float, rank))
            .then_some((p.past, past_scales));
            if past.is_some() {
                report.count("kv-cache-blocks-kept", 1);
            }
            let index = m.graphs[p.graph]
                .outputs
                .iter()
                .position(|&o| o == p.present);
            let index = index.ok_or_else(|| fail(pass, "the present output went away"))?;
            quantize_output(m, p.graph, index, self.format, scales, plugin, past)
                .map_err(|e| fail(pass, format!("input '{past_name}': {e}")))?;
            report.count("kv-cache-tensors", 1);
        }
        report.notes.push(format!(
            "{} KV-cache tensors as {} ({})",
            all.len(),
            self.format,
            describe(first)
        ));
        report.changed = true;
        Ok(report)
    }
}

fn describe(scales: CacheScales) -> String {
    match scales {
        CacheScales::Blocks { tokens } => {
            format!("blocks of {tokens} tokens, one f32 scale per head and block")
        }
        CacheScales::Groups { group } => {
            format!("groups of {group} per token, binary16 scales")
        }
    }
}

/// Whether the KV cache of `format` is written through the target's plugins (INT8 blocks on a
/// target without the standard-op form, TensorRT).
fn kv_through_plugin(format: CacheFormat, opts: &PassOptions) -> bool {
    let rules = opts.target.qdq_rules();
    !rules.cache_io && rules.plugins && format == CacheFormat::Int8
}

/// Quantized caches at the interface are the target's decision.
fn check_target(pass: &str, opts: &PassOptions) -> Result<(), PassError> {
    if opts.target.qdq_rules().cache_io {
        return Ok(());
    }
    Err(fail(
        pass,
        format!(
            "target {} writes KV caches as int8 blocks through its plugins and has no image \
             cache form; use --kv-cache int8, or compile for ort",
            opts.target
        ),
    ))
}

fn prepare_opset(
    m: &mut Module,
    format: CacheFormat,
    pass: &str,
    report: &mut PassReport,
) -> Result<(), PassError> {
    for e in &m.entries {
        let opset = m.onnx_opset(e.graph).unwrap_or(0);
        if opset < 13 {
            return Err(fail(
                pass,
                format!(
                    "graph '{}' imports opset {opset}; quantized caches need opset 13 or later",
                    m.graphs[e.graph].name
                ),
            ));
        }
    }
    let what = format!("{} cache codes", format.name().to_uppercase());
    let notes = super::raise_opset(m, format.min_opset(), &what).map_err(|e| fail(pass, e))?;
    report.notes.extend(notes);
    Ok(())
}

impl Pass for ImageCachePass {
    fn name(&self) -> &str {
        "image-cache"
    }

    fn run(&self, m: &mut Module, opts: &PassOptions) -> Result<PassReport, PassError> {
        let pass = self.name();
        check_target(pass, opts)?;
        let mut report = PassReport::default();
        let roots: Vec<GraphId> = m.entries.iter().map(|e| e.graph).collect();
        let mut outputs = Vec::new();
        for &g in &roots {
            let labels =
                modality::analyze(m, g, &self.modality).map_err(|e| fail(pass, e.to_string()))?;
            for &o in &m.graphs[g].outputs {
                let name = m.values[o].name.clone().unwrap_or_default();
                if labels.value(o) != Modality::Vision {
                    continue;
                }
                let Some((_, _, width)) = cache_width(m.value_type(o)) else {
                    report.notes.push(format!(
                        "output '{name}': not a float [..., tokens, width] tensor of static \
                         width; left float"
                    ));
                    continue;
                };
                let scales = self
                    .format
                    .scales(width)
                    .map_err(|e| fail(pass, format!("output '{name}': {e}")))?;
                outputs.push((g, o, name, scales));
            }
        }
        if outputs.is_empty() {
            return Err(fail(
                pass,
                "no graph output is computed from vision inputs alone (label the image input \
                 with --modality NAME=vision)",
            ));
        }
        prepare_opset(m, self.format, pass, &mut report)?;
        for (g, o, name, scales) in outputs {
            let Some(i) = m.graphs[g].outputs.iter().position(|&x| x == o) else {
                continue;
            };
            quantize_output(m, g, i, self.format, scales, false, None)
                .map_err(|e| fail(pass, format!("output '{name}': {e}")))?;
            report.count("image-cache-outputs", 1);
            report.notes.push(format!(
                "output '{name}' as {} ({})",
                self.format,
                describe(scales)
            ));
            // A graph of the module that reads the features by name reads the codes.
            for &other in &roots {
                let input = m.graphs[other]
                    .inputs
                    .iter()
                    .copied()
                    .find(|&v| m.values[v].name.as_deref() == Some(name.as_str()));
                if let Some(v) = input.filter(|_| other != g) {
                    dequantize_input(m, other, v, self.format, scales, false)
                        .map_err(|e| fail(pass, format!("input '{name}': {e}")))?;
                    report.notes.push(format!(
                        "graph '{}' reads '{name}' as {} codes",
                        m.graphs[other].name, self.format
                    ));
                }
            }
        }
        report.changed = true;
        Ok(report)
    }
}

/// Splits float `x [..., tokens, width]` (f32) into rows that share one scale: `[..., NB,
/// tokens·width]` for blocks (padded), `[..., T, width / group, group]` for groups. Returns the
/// rows and how to undo the cut.
enum Cut {
    Blocks { padded_shape: Value, tokens: Value },
    Groups { shape: Value },
}

fn cut(
    m: &mut Module,
    e: &mut Emit,
    x: Value,
    rank: usize,
    width: usize,
    scales: CacheScales,
) -> (Value, Cut) {
    match scales {
        CacheScales::Blocks { tokens } => {
            let (padded, t) = e.pad_tokens(m, x, rank, tokens as i64);
            let shape = e.rows(m, rank - 2, &[(tokens * width) as i64]);
            let rows = e.reshape(m, padded, shape);
            let padded_shape = e.op(
                m,
                Op::Shape {
                    start: None,
                    end: None,
                },
                vec![padded],
            );
            (
                rows,
                Cut::Blocks {
                    padded_shape,
                    tokens: t,
                },
            )
        }
        CacheScales::Groups { group } => {
            // Explicit dims, not 0 and -1: a cache may hold no token yet.
            let shape = e.op(
                m,
                Op::Shape {
                    start: None,
                    end: None,
                },
                vec![x],
            );
            let (zero, lead) = (e.i64s(m, &[0]), e.i64s(m, &[rank as i64 - 1]));
            let slice = Op::Slice {
                starts: None,
                ends: None,
                axes: None,
            };
            let leading = e.op(m, slice, vec![shape, zero, lead]);
            let tail = e.i64s(m, &[(width / group) as i64, group as i64]);
            let target = e.op(m, Op::Concat { axis: Some(0) }, vec![leading, tail]);
            let rows = e.reshape(m, x, target);
            (rows, Cut::Groups { shape })
        }
    }
}

fn uncut(m: &mut Module, e: &mut Emit, rows: Value, rank: usize, how: Cut) -> Value {
    match how {
        Cut::Blocks {
            padded_shape,
            tokens,
        } => {
            let back = e.reshape(m, rows, padded_shape);
            e.take_tokens(m, back, rank, tokens)
        }
        Cut::Groups { shape } => e.reshape(m, rows, shape),
    }
}

/// Input `v` of `graph` becomes codes, followed by a new scales input `<name>_scale`; its
/// readers read the dequantized float tensor. With `plugin` (INT8 blocks on a target without
/// the standard-op form), a head's codes are one row of `tokens · width` (a block is that many
/// consecutive codes) read by `MmqDequantize` in blocks along the row, between `Reshape`s.
fn dequantize_input(
    m: &mut Module,
    graph: GraphId,
    v: Value,
    format: CacheFormat,
    scales: CacheScales,
    plugin: bool,
) -> Result<(Value, Value), String> {
    let ty = m.value_type(v).clone();
    let (dtype, rank, width) = cache_width(&ty).ok_or("not a float tensor of static width")?;
    let dims = ty.shape().unwrap_or_default().to_vec();
    let name = m.values[v].name.clone().unwrap_or_default();
    let scale_name = format!("{name}_scale");
    check_free(m, graph, &scale_name)?;
    m.set_type(v, Type::tensor(format.code_dtype(), dims.clone()));
    let s = add_input_after(m, graph, v, &scale_name, scale_type(&dims, scales));

    let mut e = Emit::new(m, graph, &format!("{name}_dq"));
    let mut out = match (plugin, scales) {
        (true, CacheScales::Blocks { tokens }) => {
            let shape = e.rows(m, rank - 2, &[]);
            let rows = e.reshape(m, v, shape);
            let block = (tokens * width) as i64;
            let op = plugin_op("MmqDequantize", &[("axis", -1), ("block_size", block)]);
            let deq = e.op(m, op, vec![rows, s]);
            let shape = e.shape(m, v);
            e.reshape(m, deq, shape)
        }
        _ => {
            let x = e.cast(m, v, DType::F32);
            let (rows, how) = cut(m, &mut e, x, rank, width, scales);
            let s32 = match scales {
                CacheScales::Blocks { .. } => s,
                CacheScales::Groups { .. } => e.cast(m, s, DType::F32),
            };
            let s_b = e.unsqueeze_last(m, s32);
            let y = e.binary(m, Op::Mul {}, rows, s_b);
            uncut(m, &mut e, y, rank, how)
        }
    };
    if dtype != DType::F32 {
        out = e.cast(m, out, dtype);
    }
    let readers: Vec<Node> = e.nodes.clone();
    m.replace_uses(v, out, graph, &readers);
    m.set_type(out, Type::tensor(dtype, dims));
    place(m, e, true);
    Ok((out, s))
}

/// Whether output `present` is the dequantized past `past_float` followed by new tokens
/// (`Concat(past_float, ...)` along the token axis), so that the past's full blocks are
/// present's full blocks unchanged.
fn continues(m: &Module, present: Value, past_float: Value, rank: usize) -> bool {
    let ValueDef::Output { node, .. } = m.values[present].def else {
        return false;
    };
    let n = &m.nodes[node];
    let Op::Concat { axis: Some(axis) } = n.op else {
        return false;
    };
    let axis = if axis < 0 { axis + rank as i64 } else { axis };
    axis == rank as i64 - 2 && n.inputs.first().copied().flatten() == Some(past_float)
}

/// Output `index` of `graph` becomes codes (its name) and a scales output `<name>_scale` right
/// after it; the float value keeps its other readers. With `plugin`, `MmqDynamicQuantize`
/// quantizes each head's row of `tokens · width` in blocks (see [`dequantize_input`]).
///
/// `past` (the codes and scales inputs the output continues, when it provably continues them,
/// [`continues`]): the past's whole blocks (every past token, for per-token groups) go to the
/// output as they are, their codes and scales unchanged, and only the last, partial block and
/// the new tokens are quantized, so a step costs the new tokens, not the whole cache (as the
/// CUDA kernels' append does).
fn quantize_output(
    m: &mut Module,
    graph: GraphId,
    index: usize,
    format: CacheFormat,
    scales: CacheScales,
    plugin: bool,
    past: Option<(Value, Value)>,
) -> Result<(), String> {
    let v = m.graphs[graph].outputs[index];
    let ty = m.value_type(v).clone();
    let (dtype, rank, width) = cache_width(&ty).ok_or("not a float tensor of static width")?;
    let dims = ty.shape().unwrap_or_default().to_vec();
    let name = m.values[v].name.clone().unwrap_or_default();
    let scale_name = format!("{name}_scale");
    check_free(m, graph, &scale_name)?;

    let mut e = Emit::new(m, graph, &format!("{name}_q"));
    let x = if dtype == DType::F32 {
        v
    } else {
        e.cast(m, v, DType::F32)
    };
    // What is quantized: the whole output, or, where it continues the past, what follows the
    // past's whole blocks (every past token for per-token groups).
    let mut keep = None;
    let mut part = x;
    if let Some((past_codes, past_scales)) = past {
        let t = rank as i64 - 2;
        let past_tokens = e.op(
            m,
            Op::Shape {
                start: Some(t),
                end: Some(t + 1),
            },
            vec![past_codes],
        );
        let (blocks, kept) = match scales {
            CacheScales::Blocks { tokens } => {
                let per_block = e.i64s(m, &[tokens as i64]);
                let blocks = e.binary(m, Op::Div {}, past_tokens, per_block);
                (blocks, e.binary(m, Op::Mul {}, blocks, per_block))
            }
            CacheScales::Groups { .. } => (past_tokens, past_tokens),
        };
        let (zero, end) = (e.i64s(m, &[0]), e.i64s(m, &[i64::MAX]));
        let token_axis = e.i64s(m, &[t]);
        let slice = || Op::Slice {
            starts: None,
            ends: None,
            axes: None,
        };
        let codes = e.op(m, slice(), vec![past_codes, zero, kept, token_axis]);
        let scales = e.op(m, slice(), vec![past_scales, zero, blocks, token_axis]);
        part = e.op(m, slice(), vec![x, kept, end, token_axis]);
        keep = Some((codes, scales, t));
    }
    let (mut codes, mut scale) = match (plugin, scales) {
        (true, CacheScales::Blocks { tokens }) => {
            let shape = e.rows(m, rank - 2, &[]);
            let rows = e.reshape(m, part, shape);
            let block = (tokens * width) as i64;
            let op = plugin_op("MmqDynamicQuantize", &[("block_size", block)]);
            let [codes, scale] = e.op2(m, op, vec![rows]);
            let shape = e.shape(m, part);
            (e.reshape(m, codes, shape), scale)
        }
        _ => quantize_standard(m, &mut e, part, rank, width, format, scales),
    };
    if let Some((kept_codes, kept_scales, t)) = keep {
        let concat = Op::Concat { axis: Some(t) };
        codes = e.op(m, concat.clone(), vec![kept_codes, codes]);
        scale = e.op(m, concat, vec![kept_scales, scale]);
    }
    let float_name = format!("{name}_float");
    m.values[v].name = Some(float_name);
    m.values[codes].name = Some(name);
    m.values[scale].name = Some(scale_name);
    m.set_type(codes, Type::tensor(format.code_dtype(), dims.clone()));
    m.set_type(scale, scale_type(&dims, scales));
    let outs = &mut m.graphs[graph].outputs;
    outs[index] = codes;
    outs.insert(index + 1, scale);
    shift_links(m, graph, index + 1, true);
    place(m, e, false);
    Ok(())
}

/// The standard-op quantization of float `x` (rank `rank`): codes of `x`'s shape and the
/// scales (`[..., blocks]` or `[..., tokens, groups]`).
fn quantize_standard(
    m: &mut Module,
    e: &mut Emit,
    x: Value,
    rank: usize,
    width: usize,
    format: CacheFormat,
    scales: CacheScales,
) -> (Value, Value) {
    let (rows, how) = cut(m, e, x, rank, width, scales);
    let amax = e.reduce_max_last(m, rows);
    let qmax = e.f32(m, format.qmax());
    let raw = e.binary(m, Op::Div {}, amax, qmax);
    let zero = e.f32(m, 0.0);
    let one = e.f32(m, 1.0);
    let (stored, divisor) = match scales {
        CacheScales::Blocks { .. } => {
            // A zero scale is stored as 0 (codes 0), as the kernels do.
            let pos = e.binary(m, Op::Greater {}, raw, zero);
            let safe = e.op(m, Op::Where {}, vec![pos, raw, one]);
            (raw, safe)
        }
        CacheScales::Groups { .. } => {
            // Binary16 scales: a zero scale becomes 1, the rounded scale divides.
            let pos = e.binary(m, Op::Greater {}, raw, zero);
            let safe = e.op(m, Op::Where {}, vec![pos, raw, one]);
            let big = e.f32(m, 65504.0);
            let capped = e.op(m, Op::Min {}, vec![safe, big]);
            let s16 = e.cast(m, capped, DType::F16);
            let s32 = e.cast(m, s16, DType::F32);
            (s16, s32)
        }
    };
    let scaled = e.binary(m, Op::Div {}, rows, divisor);
    let coded = match format.clip() {
        Some((lo, hi)) => {
            let r = e.op(m, Op::Round {}, vec![scaled]);
            let (lo, hi) = (e.f32(m, lo), e.f32(m, hi));
            e.op(
                m,
                Op::Clip {
                    min: None,
                    max: None,
                },
                vec![r, lo, hi],
            )
        }
        None => scaled,
    };
    let back = uncut(m, e, coded, rank, how);
    let codes = e.cast(m, back, format.code_dtype());
    let scale = e.squeeze_last(m, stored);
    (codes, scale)
}

/// The scales' type for a cache tensor of `dims`.
fn scale_type(dims: &[Dim], scales: CacheScales) -> Type {
    let rank = dims.len();
    let mut out: Vec<Dim> = dims[..rank - 2].to_vec();
    match scales {
        CacheScales::Blocks { tokens } => {
            out.push(dims[rank - 2].ceil_div(&Dim::known(tokens as i64)));
        }
        CacheScales::Groups { group } => {
            out.push(dims[rank - 2].clone());
            let width = dims[rank - 1].as_known().unwrap_or(0);
            out.push(Dim::known(width / group as i64));
        }
    }
    Type::tensor(scales.dtype(), out)
}

fn check_free(m: &Module, graph: GraphId, name: &str) -> Result<(), String> {
    let g = &m.graphs[graph];
    if g.inputs
        .iter()
        .chain(&g.outputs)
        .any(|&v| m.values[v].name.as_deref() == Some(name))
    {
        return Err(format!("the graph already has a tensor named '{name}'"));
    }
    Ok(())
}

/// Adds input `name` right after input `after`, renumbering the inputs behind it.
fn add_input_after(m: &mut Module, graph: GraphId, after: Value, name: &str, ty: Type) -> Value {
    let v = m.add_input(graph, Some(name.to_owned()), ty);
    let inputs = &mut m.graphs[graph].inputs;
    inputs.pop();
    let pos = inputs
        .iter()
        .position(|&x| x == after)
        .map_or(inputs.len(), |p| p + 1);
    inputs.insert(pos, v);
    let inputs = inputs.clone();
    for (i, x) in inputs.into_iter().enumerate() {
        if let ValueDef::Input { index, .. } = &mut m.values[x].def {
            *index = i as u32;
        }
    }
    shift_links(m, graph, pos, false);
    v
}

/// Links name graph inputs and outputs by position: one inserted at `at` in `graph`'s outputs
/// (`outputs`) or inputs moves the links to the ones behind it.
fn shift_links(m: &mut Module, graph: GraphId, at: usize, outputs: bool) {
    for l in &mut m.links {
        let end = if outputs { &mut l.from } else { &mut l.to };
        if end.0 == graph && end.1 as usize >= at {
            end.1 += 1;
        }
    }
}
