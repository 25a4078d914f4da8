//! The decoder form onnxruntime-genai runs fastest: each layer's standard `Attention` over
//! `Concat(past, new)` becomes `com.microsoft.GroupQueryAttention` on the `[B, S, H*D]`
//! projections, so the past and the present can share one buffer (`past_present_share_buffer`)
//! and no step copies the cache (measured by `tools/gqa_probe.py`, `docs/benchmarks.md`).
//!
//! GQA takes the mask as sequence lengths (`seqlens_k = ReduceSum(attention_mask) - 1`), causal
//! with the keys' padding: what onnxruntime-genai's model builder assumes of a decoder. The
//! rewrite makes the same assumption, and only where the mask depends on no input value but
//! `attention_mask` (the past and token inputs only through their shapes) and the past's length
//! is symbolic (a fixed-shape export is left alone). A sliding window in the mask becomes GQA's
//! `local_window_size`, read from the mask computed for the context's last position
//! ([`window`]); a mask that is not a causal band over the last keys keeps its layer as it is.
//! A layer that does not
//! have the export form (`Transpose(Reshape(x))` into the attention, optionally through a
//! `RotaryEmbedding`, and `Reshape(Transpose(y))` out of it) is left as it is.
//!
//! Where the rotary angles are computed from the `position_ids` input alone and ONNX Runtime can
//! rotate the heads (head size a multiple of 16), the rotary embedding moves into GQA
//! (`do_rotary`): the angles are tabulated once for every position of the context (the export's
//! own computation, run in the interpreter on the ids `0..context`) and GQA reads them at
//! `position_ids`. Q, K and V split from one projection (the INT4 siblings packed) then reach GQA
//! packed, without the `Split`. That is the form onnxruntime-genai's model builder writes.
//!
//! [`quantize_caches`] then gives the layers GQA's own INT8 cache (`--kv-cache int8`): int8
//! codes with static per-channel scales ([`cache_probes`] says which values calibrate them).

use std::collections::{HashMap, HashSet};

use mmq_ir::edit::{Emit, NewNode};
use mmq_ir::{At, Attr, DType, GraphId, Module, Node, Op, Value, ValueDef};

use crate::dce::Dce;
use crate::pass::{Pass, PassError, PassOptions};

/// What [`rewrite`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rewritten {
    /// Attention nodes that became `GroupQueryAttention`.
    pub layers: usize,
    /// Attention nodes left as they were.
    pub kept: usize,
    /// A graph's layers were rewritten, each of them, and nothing else reads a past's sequence
    /// length: its pasts may be the presents' buffers.
    pub shared: bool,
}

/// One layer's parts.
struct Layer {
    attention: Node,
    q: Value,
    k: Value,
    v: Value,
    /// The rotary embedding of Q and K: the node (its cos, sin and attributes).
    rotary: Option<(Node, Node)>,
    /// The `[B, S, (H + 2 kvH) D]` projection Q, K and V are split from (`Split` along the
    /// last axis), which GQA can take packed, with the biases each adds after the split.
    packed: Option<Packed>,
    /// Values per head.
    head_dim: i64,
    past: (Value, Value),
    present: (Value, Value),
    /// The 3-D value the attention's output becomes.
    out: Value,
    heads: (i64, i64),
    scale: Option<f32>,
    /// The attention bias (computed from the mask alone), where the layer has one.
    bias: Option<Value>,
    /// The sliding window: the keys a token attends, its own included (`local_window_size`).
    window: Option<i64>,
}

/// How [`rewrite`] writes the layers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Form {
    /// Positions the rotary tables hold (the context length). Where the export's rotary angles
    /// are computed from `position_ids` alone and the head size is a multiple of 16, the rotary
    /// embedding moves into `GroupQueryAttention` (`do_rotary`, cos/sin tables of this many
    /// positions, the `position_ids` input) and GQA takes Q, K and V packed where they are one
    /// projection split in three; 0 keeps the rotary embedding outside.
    pub positions: usize,
}

/// Rewrites the attention layers of each entry graph (see the module documentation) where
/// every layer of the graph has the form and its pasts can then share the presents' buffers;
/// leaves the other graphs as they are (and says how many layers they had).
pub fn rewrite(m: &mut Module, form: Form) -> Result<Rewritten, PassError> {
    let mut total = Rewritten::default();
    let graphs: Vec<GraphId> = m.entries.iter().map(|e| e.graph).collect();
    for g in graphs {
        let mut c = m.clone();
        let done = rewrite_graph(&mut c, g, form)?;
        if done.shared {
            *m = c;
            total.layers += done.layers;
            total.shared = true;
        } else {
            total.kept += done.kept + done.layers;
        }
    }
    Ok(total)
}

fn rewrite_graph(m: &mut Module, g: GraphId, form: Form) -> Result<Rewritten, PassError> {
    let Some(mask) = input_named(m, g, "attention_mask") else {
        return Ok(Rewritten::default());
    };
    let readers = readers(m, g);
    let outputs: HashSet<Value> = m.graphs[g].outputs.iter().copied().collect();
    let mut layers = Vec::new();
    let mut kept = 0;
    for &n in m.graphs[g].nodes() {
        let found = match m.nodes[n].op {
            Op::Attention { .. } => layer(m, g, n, mask, &readers, &outputs),
            Op::MultiHeadAttention { .. } => mha_layer(m, g, n, mask, &readers, &outputs),
            _ => continue,
        };
        match found {
            Some(l) => layers.push(l),
            None => kept += 1,
        }
    }
    // Each mask's sliding window, once per mask; a layer whose mask holds something else than
    // a causal band over the last keys is left as it is.
    let mut windows: HashMap<Value, Result<Option<i64>, ()>> = HashMap::new();
    let before = layers.len();
    layers.retain_mut(|l| {
        let Some(bias) = l.bias else {
            return true;
        };
        let found = *windows
            .entry(bias)
            .or_insert_with(|| window(m, g, bias, mask, form.positions.max(2)));
        found.map(|w| l.window = w).is_ok()
    });
    kept += before - layers.len();
    if layers.is_empty() {
        return Ok(Rewritten {
            kept,
            ..Rewritten::default()
        });
    }
    // The sequence lengths, once: valid keys per row less one, and the total length.
    let mut e = Emit::new(m, g, "gqa");
    let axes = e.i64s(m, &[1]);
    let sum = e.op(
        m,
        Op::from_parts("", "ReduceSum", vec![("keepdims".into(), Attr::Int(0))]),
        vec![mask, axes],
    );
    let one = e.i64s(m, &[1]);
    let less = e.binary(m, Op::Sub {}, sum, one);
    let seqlens = e.cast(m, less, DType::I32);
    let total = e.op(
        m,
        Op::Shape {
            start: Some(1),
            end: Some(2),
        },
        vec![mask],
    );
    let total = e.cast(m, total, DType::I32);
    let total = e.op(m, Op::Squeeze { axes: None }, vec![total]);
    mmq_ir::edit::place(m, e, true);
    // The rotary tables, once for each pair of angle values the layers share.
    let mut tables: HashMap<(Value, Value), Option<Tables>> = HashMap::new();
    let count = layers.len();
    for l in layers {
        let inside = match l.rotary {
            Some((qr, kr)) if form.positions > 0 && same_rotation(m, qr, kr) => {
                let angles = (m.nodes[qr].inputs[1], m.nodes[qr].inputs[2]);
                match angles {
                    // ONNX Runtime rotates head sizes that are multiples of 16, and multiples
                    // of 16 channels.
                    (Some(cos), Some(sin)) if l.head_dim % 16 == 0 => tables
                        .entry((cos, sin))
                        .or_insert_with(|| rotary_tables(m, g, cos, sin, form.positions))
                        .filter(|t| t.half % 8 == 0 && 2 * t.half <= l.head_dim),
                    _ => None,
                }
            }
            _ => None,
        };
        emit_layer(m, g, &l, seqlens, total, inside);
    }
    past_lengths_from_mask(m, g, mask);
    Dce.run(m, &PassOptions::default())?;
    let shared = kept == 0 && pasts_read_by_gqa_only(m, g);
    Ok(Rewritten {
        layers: count,
        kept,
        shared,
    })
}

/// Graph `g`'s input named `name`.
fn input_named(m: &Module, g: GraphId, name: &str) -> Option<Value> {
    m.graphs[g]
        .inputs
        .iter()
        .copied()
        .find(|&v| m.values[v].name.as_deref() == Some(name))
}

/// The nodes reading each value of graph `g`.
fn readers(m: &Module, g: GraphId) -> HashMap<Value, Vec<Node>> {
    let mut out: HashMap<Value, Vec<Node>> = HashMap::new();
    for &n in m.graphs[g].nodes() {
        for &v in m.nodes[n].inputs.iter().flatten() {
            out.entry(v).or_default().push(n);
        }
    }
    out
}

/// The node defining `v`, when it is a node of `op`'s kind.
fn def_of(m: &Module, v: Value, kind: mmq_ir::OpKind) -> Option<Node> {
    match m.values[v].def {
        ValueDef::Output { node, .. } if m.nodes[node].op.kind() == kind => Some(node),
        _ => None,
    }
}

/// Whether `n` is `Transpose` with the head swap `[0, 2, 1, 3]`.
fn swaps_heads(m: &Module, n: Node) -> bool {
    matches!(&m.nodes[n].op, Op::Transpose { perm: Some(p) } if p == &[0, 2, 1, 3])
}

/// The 3-D value behind `Transpose(Reshape(x3))` (`[B, heads, S, D]` from `[B, S, heads*D]`).
fn behind(m: &Module, x4: Value) -> Option<Value> {
    let t = def_of(m, x4, mmq_ir::OpKind::Transpose).filter(|&t| swaps_heads(m, t))?;
    let r = def_of(
        m,
        m.nodes[t].inputs.first().copied().flatten()?,
        mmq_ir::OpKind::Reshape,
    )?;
    let x3 = m.nodes[r].inputs.first().copied().flatten()?;
    (m.value_type(x3).shape().map(<[_]>::len) == Some(3)).then_some(x3)
}

/// `past`, when `concat` is `Concat(past, new)` along the sequence axis with `past` a graph
/// input: (past, new).
fn past_concat(m: &Module, g: GraphId, v: Value) -> Option<(Value, Value)> {
    let c = def_of(m, v, mmq_ir::OpKind::Concat)?;
    let Op::Concat { axis: Some(axis) } = m.nodes[c].op else {
        return None;
    };
    let ins = &m.nodes[c].inputs;
    if !(axis == 2 || axis == -2) || ins.len() != 2 {
        return None;
    }
    let (past, new) = (ins[0]?, ins[1]?);
    m.graphs[g].inputs.contains(&past).then_some((past, new))
}

/// The layer of `com.microsoft.MultiHeadAttention` node `n`, when it has the export form GPT-2
/// decoders compile to: the 3-D query, the key and value `Concat(past, Transpose(Reshape(x)))`
/// (presents read by this node alone), an attention bias computed from `mask` alone, no other
/// input, a 3-D result (with or without a NaN guard, [`unguarded`]); no rotary embedding.
fn mha_layer(
    m: &Module,
    g: GraphId,
    n: Node,
    mask: Value,
    readers: &HashMap<Value, Vec<Node>>,
    outputs: &HashSet<Value>,
) -> Option<Layer> {
    let node = &m.nodes[n];
    let Op::MultiHeadAttention {
        num_heads: Some(h),
        scale,
        unidirectional,
        ..
    } = &node.op
    else {
        return None;
    };
    let at = |i: usize| node.inputs.get(i).copied().flatten();
    if unidirectional.unwrap_or(0) != 0
        || [3, 4]
            .into_iter()
            .chain(6..node.inputs.len())
            .any(|i| at(i).is_some())
        || node.outputs.iter().skip(1).any(Option::is_some)
        || !at(5).is_some_and(|b| depends_only_on(m, g, b, mask, true))
    {
        return None;
    }
    let (q, kcat, vcat) = (at(0)?, at(1)?, at(2)?);
    let (past_k, k4) = past_concat(m, g, kcat)?;
    let (past_v, v4) = past_concat(m, g, vcat)?;
    if m.value_type(past_k).shape()?.get(2)?.as_known().is_some() {
        return None;
    }
    // The presents are graph outputs this attention reads (their other readers are the
    // exporter's shape plumbing, which reads them only through `Shape`).
    for p in [kcat, vcat] {
        if !outputs.contains(&p) {
            return None;
        }
    }
    let (k, v) = (behind(m, k4)?, behind(m, v4)?);
    let y = node.outputs.first().copied().flatten()?;
    let out = unguarded(m, readers, y).unwrap_or(y);
    let shape = m.value_type(past_k).shape()?;
    let (kvh, d) = (shape.get(1)?.as_known()?, shape.get(3)?.as_known()?);
    let width = m.value_type(q).shape()?.get(2)?.as_known()?;
    if outputs.contains(&out) || width != h * d || h % kvh != 0 {
        return None;
    }
    Some(Layer {
        attention: n,
        q,
        k,
        v,
        rotary: None,
        packed: split_of(m, [q, k, v], [h * d, kvh * d, kvh * d]),
        head_dim: d,
        past: (past_k, past_v),
        present: (kcat, vcat),
        out,
        heads: (*h, kvh),
        scale: *scale,
        bias: at(5),
        window: None,
    })
}

/// The result of the NaN guard `Where(IsNaN(y), 0, y)` on attention result `y`, when the guard
/// alone reads `y` (the TorchScript exporter's SDPA fills masked scores with `-inf`, so a fully
/// masked row is NaN, which the guard zeroes; `attn-mha-guarded` keeps it after the fused op).
/// GQA drops it: under the decoder contract every row attends at least its own token.
fn unguarded(m: &Module, readers: &HashMap<Value, Vec<Node>>, y: Value) -> Option<Value> {
    let [a, b] = readers.get(&y)?.as_slice() else {
        return None;
    };
    let (nan, guard) = match (&m.nodes[*a].op, &m.nodes[*b].op) {
        (Op::IsNaN {}, Op::Where {}) => (*a, *b),
        (Op::Where {}, Op::IsNaN {}) => (*b, *a),
        _ => return None,
    };
    let is_nan = m.nodes[nan].outputs.first().copied().flatten()?;
    let ins = &m.nodes[guard].inputs;
    let values = const_f32s(m, ins.get(1).copied().flatten()?)?;
    let zeros = !values.is_empty() && values.iter().all(|&x| x == 0.0);
    let guarded = ins.first().copied().flatten() == Some(is_nan)
        && ins.get(2).copied().flatten() == Some(y)
        && readers.get(&is_nan).is_some_and(|r| r == &[guard]);
    (zeros && guarded).then(|| m.nodes[guard].outputs.first().copied().flatten())?
}

/// The layer of attention node `n`, when it has the export form.
fn layer(
    m: &Module,
    g: GraphId,
    n: Node,
    mask: Value,
    readers: &HashMap<Value, Vec<Node>>,
    outputs: &HashSet<Value>,
) -> Option<Layer> {
    let node = &m.nodes[n];
    let Op::Attention {
        scale,
        is_causal,
        softcap,
        ..
    } = &node.op
    else {
        return None;
    };
    if softcap.is_some_and(|c| c != 0.0) || node.outputs.iter().skip(1).any(Option::is_some) {
        return None;
    }
    let ins: Vec<Option<Value>> = node.inputs.clone();
    if ins.len() > 4 {
        return None;
    }
    match ins.get(3).copied().flatten() {
        Some(bias) => {
            if !depends_only_on(m, g, bias, mask, true) {
                return None;
            }
        }
        None if is_causal.unwrap_or(0) == 1 => {}
        None => return None,
    }
    let (q4, kcat, vcat) = (ins[0]?, ins[1]?, ins[2]?);
    let (past_k, k4) = past_concat(m, g, kcat)?;
    let (past_v, v4) = past_concat(m, g, vcat)?;
    // A past of static length is a fixed-shape export, outside the decoder contract.
    if m.value_type(past_k).shape()?.get(2)?.as_known().is_some() {
        return None;
    }
    // The presents are graph outputs read by this attention alone.
    for p in [kcat, vcat] {
        if !outputs.contains(&p) || readers.get(&p).is_some_and(|r| r != &[n]) {
            return None;
        }
    }
    let unrotated = |x4: Value| -> Option<(Value, Option<Node>)> {
        match def_of(m, x4, mmq_ir::OpKind::RotaryEmbedding) {
            Some(r) => {
                let x = m.nodes[r].inputs.first().copied().flatten()?;
                Some((behind(m, x)?, Some(r)))
            }
            None => Some((behind(m, x4)?, None)),
        }
    };
    let (q, qrot) = unrotated(q4)?;
    let (k, krot) = unrotated(k4)?;
    let v = behind(m, v4)?;
    let rotary = match (qrot, krot) {
        (Some(a), Some(b)) => Some((a, b)),
        (None, None) => None,
        _ => return None,
    };
    // Out: Reshape(Transpose(y)) back to [B, S, heads*D], each read by the next alone, with
    // or without a NaN guard in between.
    let y = node.outputs.first().copied().flatten()?;
    let y = unguarded(m, readers, y).unwrap_or(y);
    let [t] = readers.get(&y)?.as_slice() else {
        return None;
    };
    let ty = m.nodes[*t].outputs.first().copied().flatten()?;
    if !swaps_heads(m, *t) || outputs.contains(&y) || outputs.contains(&ty) {
        return None;
    }
    let [r] = readers.get(&ty)?.as_slice() else {
        return None;
    };
    if !matches!(m.nodes[*r].op, Op::Reshape { .. }) {
        return None;
    }
    let out = m.nodes[*r].outputs.first().copied().flatten()?;
    let dims = |x: Value| -> Option<(i64, i64)> {
        let s = m.value_type(x).shape()?;
        Some((s.get(1)?.as_known()?, s.get(3)?.as_known()?))
    };
    let ((h, d), (kvh, kd)) = (dims(q4)?, dims(k4)?);
    let packed = split_of(m, [q, k, v], [h * d, kvh * d, kvh * d]);
    // The result `[B, S, H*D]`, or `[B*S, H*D]` for a `Gemm` (GPT-2 at opset 23).
    let rank = m.value_type(out).shape().map(<[_]>::len);
    (matches!(rank, Some(2 | 3)) && d == kd && h % kvh == 0).then_some(Layer {
        attention: n,
        q,
        k,
        v,
        rotary,
        packed,
        head_dim: d,
        past: (past_k, past_v),
        present: (kcat, vcat),
        out,
        heads: (h, kvh),
        scale: *scale,
        bias: ins.get(3).copied().flatten(),
        window: None,
    })
}

/// Q, K and V as one projection: `x` split in three along the last axis, each part plus its
/// bias where `bias` (f32, Q's, K's and V's concatenated).
#[derive(Clone, Debug)]
struct Packed {
    x: Value,
    bias: Option<Vec<f32>>,
}

/// `v` as `Add(part, bias)` with `bias` a 1-D f32 constant: (part, the bias's values).
fn biased(m: &Module, v: Value) -> Option<(Value, Vec<f32>)> {
    let n = m.producer(v).filter(|n| matches!(n.op, Op::Add {}))?;
    let (a, b) = (n.inputs.first().copied()??, n.inputs.get(1).copied()??);
    let constant = |c: Value| {
        let data = &m.consts[m.const_source(c)?];
        (data.dtype == DType::F32 && data.shape.len() == 1)
            .then(|| const_f32s(m, c))
            .flatten()
    };
    match (constant(b), constant(a)) {
        (Some(bias), _) => Some((a, bias)),
        (None, Some(bias)) => Some((b, bias)),
        (None, None) => None,
    }
}

/// Q, K and V (`qkv`, of `widths`) as one projection, when they are the three results of one
/// `Split` along the last axis of a 3-D value, each with or each without a bias added.
fn split_of(m: &Module, qkv: [Value; 3], widths: [i64; 3]) -> Option<Packed> {
    let parts: Vec<(Value, Vec<f32>)> = qkv.iter().filter_map(|&v| biased(m, v)).collect();
    let (qkv, bias) = match parts.len() {
        3 => {
            let mut bias = Vec::new();
            for ((_, b), &w) in parts.iter().zip(&widths) {
                if b.len() as i64 != w {
                    return None;
                }
                bias.extend_from_slice(b);
            }
            ([parts[0].0, parts[1].0, parts[2].0], Some(bias))
        }
        0 => (qkv, None),
        _ => return None,
    };
    let x = split_input(m, qkv, widths)?;
    Some(Packed { x, bias })
}

/// The 3-D value `qkv` are the three results of, by one `Split` of its last axis into `widths`
/// or by three `Slice`s of it that cover the axis in that order (Phi-3's fused `qkv_proj`).
fn split_input(m: &Module, qkv: [Value; 3], widths: [i64; 3]) -> Option<Value> {
    sliced_input(m, qkv, widths).or_else(|| split_result(m, qkv, widths))
}

/// The 3-D value `qkv` are `Slice`s of along its last axis, `[0, w0)`, `[w0, w0 + w1)`,
/// `[w0 + w1, end)`, `end` the axis's length.
fn sliced_input(m: &Module, qkv: [Value; 3], widths: [i64; 3]) -> Option<Value> {
    let mut x = None;
    let mut offset = 0;
    for (v, w) in qkv.into_iter().zip(widths) {
        let n = &m.nodes[def_of(m, v, mmq_ir::OpKind::Slice)?];
        let at = |i: usize| n.inputs.get(i).copied().flatten();
        let src = at(0)?;
        if x.is_some_and(|x| x != src) {
            return None;
        }
        x = Some(src);
        let shape = m.value_type(src).shape()?;
        let total = shape.get(2)?.as_known()?;
        let (starts, ends, axes) = (
            const_i64s(m, at(1)?)?,
            const_i64s(m, at(2)?)?,
            const_i64s(m, at(3)?)?,
        );
        let unit = at(4).is_none_or(|s| const_i64s(m, s).is_some_and(|s| s == [1]));
        let end = ends.first().map(|&e| e.min(total));
        if shape.len() != 3
            || !matches!(axes.as_slice(), [2] | [-1])
            || starts != [offset]
            || end != Some(offset + w)
            || !unit
        {
            return None;
        }
        offset += w;
    }
    let x = x?;
    (m.value_type(x).shape()?.get(2)?.as_known()? == offset).then_some(x)
}

/// The values of a float constant `v`, as f32.
fn const_f32s(m: &Module, v: Value) -> Option<Vec<f32>> {
    let data = &m.consts[m.const_source(v)?];
    let mut values = vec![0.0; data.num_elements()];
    data.read_f32(0, &mut values, &mut Vec::new()).ok()?;
    Some(values)
}

/// The values of an i64 constant `v`.
fn const_i64s(m: &Module, v: Value) -> Option<Vec<i64>> {
    let c = &m.consts[m.const_source(v)?];
    if c.dtype != DType::I64 {
        return None;
    }
    let bytes = c.raw_bytes()?;
    Some(
        bytes
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap_or_default()))
            .collect(),
    )
}

/// The 3-D value `qkv` are the three results of, by one `Split` of its last axis into `widths`.
fn split_result(m: &Module, qkv: [Value; 3], widths: [i64; 3]) -> Option<Value> {
    let mut node = None;
    for (i, v) in qkv.into_iter().enumerate() {
        match m.values[v].def {
            ValueDef::Output { node: n, index } if index as usize == i => {
                if node.is_some_and(|x| x != n) {
                    return None;
                }
                node = Some(n);
            }
            _ => return None,
        }
        let width = m.value_type(v).shape()?.get(2)?.as_known()?;
        if width != widths[i] {
            return None;
        }
    }
    let n = &m.nodes[node?];
    let Op::Split { axis, .. } = &n.op else {
        return None;
    };
    let x = n.inputs.first().copied().flatten()?;
    let rank = m.value_type(x).shape()?.len();
    (rank == 3 && matches!(axis.unwrap_or(0), 2 | -1) && n.outputs.len() == 3).then_some(x)
}

/// Whether rotary nodes `a` and `b` rotate alike: the same angles, pairing and rotated width,
/// with the angles given per token (`[B, S, rotary_dim / 2]`, no `position_ids` of their own).
fn same_rotation(m: &Module, a: Node, b: Node) -> bool {
    let (na, nb) = (&m.nodes[a], &m.nodes[b]);
    let key = |n: &mmq_ir::NodeData| match &n.op {
        Op::RotaryEmbedding {
            interleaved,
            rotary_embedding_dim,
            ..
        } => Some((
            interleaved.unwrap_or(0),
            rotary_embedding_dim.unwrap_or(0),
            n.inputs.get(1).copied().flatten(),
            n.inputs.get(2).copied().flatten(),
            n.inputs.get(3).copied().flatten(),
        )),
        _ => None,
    };
    match (key(na), key(nb)) {
        (Some(x), Some(y)) => x == y && x.2.is_some() && x.3.is_some() && x.4.is_none(),
        _ => false,
    }
}

/// Rotary tables for `GroupQueryAttention`: cos and sin `[positions, rotary_dim / 2]`, and the
/// `position_ids` input the angles were computed from.
#[derive(Clone, Copy, Debug)]
struct Tables {
    cos: Value,
    sin: Value,
    positions: Value,
    /// Angles per position (`rotary_dim / 2`).
    half: i64,
}

/// The angles `cos` and `sin` of graph `g` tabulated for positions `0..positions`, where they
/// are computed from the `position_ids` input alone (`[B, S]` ids to `[B, S, rotary_dim / 2]`):
/// the computation runs once in the interpreter on the ids `[0, 1, ..., positions - 1]`.
fn rotary_tables(
    m: &mut Module,
    g: GraphId,
    cos: Value,
    sin: Value,
    positions: usize,
) -> Option<Tables> {
    let ids = input_named(m, g, "position_ids")?;
    if m.value_type(ids).dtype() != Some(DType::I64)
        || m.value_type(ids).shape().map(<[_]>::len) != Some(2)
        || !depends_only_on(m, g, cos, ids, false)
        || !depends_only_on(m, g, sin, ids, false)
    {
        return None;
    }
    let mut c = m.clone();
    let mut e = Emit::new(&c, g, "rotary_positions");
    let all: Vec<i64> = (0..positions as i64).collect();
    let table_ids = e.i64_tensor(&mut c, vec![1, positions as i64], &all);
    c.replace_uses(ids, table_ids, g, &[]);
    c.graphs[g].outputs = vec![cos, sin];
    c.graphs[g].inputs.clear();
    Dce.run(&mut c, &PassOptions::default()).ok()?;
    let out = mmq_kernels::Interpreter::new(&c)
        .run(g, &HashMap::new())
        .ok()?;
    let mut tables = Vec::new();
    for (_, v) in out {
        let t = v.as_tensor()?;
        let &[1, rows, half] = t.shape.as_slice() else {
            return None;
        };
        if rows != positions || t.dtype != DType::F32 {
            return None;
        }
        tables.push((half as i64, t.to_f32().ok()?));
    }
    let [(half, cos_t), (_, sin_t)] = <[_; 2]>::try_from(tables).ok()?;
    let mut e = Emit::new(m, g, "rotary");
    let shape = vec![positions as i64, half];
    let cos = e.f32s(m, shape.clone(), &cos_t);
    let sin = e.f32s(m, shape, &sin_t);
    Some(Tables {
        cos,
        sin,
        positions: ids,
        half,
    })
}

/// The sliding window of attention bias `bias` of graph `g` (a function of `mask` and of input
/// shapes alone), read from the bias itself: computed in the interpreter for one decode step at
/// the context's last position (`context` keys, the mask all ones, the pasts `context - 1`
/// long, one new token of id 0, other inputs empty). `Ok(None)` where that token attends every
/// key (no window within the context), `Ok(Some(w))` where it attends its last `w` keys alone
/// (a sliding window: Mistral's, Phi-3's); `Err` where it attends another set of keys, or the
/// bias cannot be computed so.
fn window(
    m: &Module,
    g: GraphId,
    bias: Value,
    mask: Value,
    context: usize,
) -> Result<Option<i64>, ()> {
    let mut c = m.clone();
    c.graphs[g].outputs = vec![bias];
    Dce.run(&mut c, &PassOptions::default()).map_err(|_| ())?;
    let mut e = Emit::new(&c, g, "window_probe");
    let ones = e.i64_tensor(&mut c, vec![1, context as i64], &vec![1; context]);
    c.replace_uses(mask, ones, g, &[]);
    // The other inputs count through their shapes alone (the mask depends on no other input
    // value): those of the probe step. A shape read of an input becomes a constant; an input
    // still read otherwise (the token ids, through the embedding whose shape the mask reads)
    // is fed zeros of its probe shape.
    let inputs: Vec<Value> = c.graphs[g]
        .inputs
        .iter()
        .copied()
        .filter(|&v| v != mask)
        .collect();
    let readers = readers(&c, g);
    let (mut feeds, mut fed) = (HashMap::new(), Vec::new());
    for v in inputs {
        let dims = probe_dims(&c, v, context).ok_or(())?;
        let mut other = false;
        for &n in readers.get(&v).map_or(&[][..], Vec::as_slice) {
            let Op::Shape { start, end } = c.nodes[n].op else {
                other = true;
                continue;
            };
            let rank = dims.len() as i64;
            let at = |i: i64| (if i < 0 { i + rank } else { i }).clamp(0, rank) as usize;
            let (a, b) = (at(start.unwrap_or(0)), at(end.unwrap_or(rank)));
            let shape = e.i64s(&mut c, &dims[a..b.max(a)]);
            let old = c.nodes[n].outputs.first().copied().flatten().ok_or(())?;
            c.replace_uses(old, shape, g, &[]);
        }
        if other {
            let name = c.values[v].name.clone().ok_or(())?;
            let dtype = c.value_type(v).dtype().ok_or(())?;
            let shape = dims
                .iter()
                .map(|&d| usize::try_from(d))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| ())?;
            // Small by construction: one new token, or empty features.
            if shape.iter().product::<usize>() > 1 << 20 {
                return Err(());
            }
            let zeros = mmq_kernels::Tensor::zeros(dtype, shape).map_err(|_| ())?;
            feeds.insert(
                name,
                mmq_kernels::RtValue::Tensor(std::sync::Arc::new(zeros)),
            );
            fed.push(v);
        }
    }
    c.graphs[g].inputs = fed;
    Dce.run(&mut c, &PassOptions::default()).map_err(|_| ())?;
    let out = mmq_kernels::Interpreter::new(&c)
        .run(g, &feeds)
        .map_err(|_| ())?;
    let t = out.first().and_then(|(_, v)| v.as_tensor()).ok_or(())?;
    if t.shape.last() != Some(&context) {
        return Err(());
    }
    // The last query row over the keys.
    let attends: Vec<bool> = match &t.data {
        mmq_kernels::Data::Bool(b) => b[b.len() - context..].to_vec(),
        _ => {
            let v = t.to_f32().map_err(|_| ())?;
            v[v.len() - context..].iter().map(|&x| x > -1e30).collect()
        }
    };
    let first = attends.iter().position(|&a| a).ok_or(())?;
    if !attends[first..].iter().all(|&a| a) {
        return Err(());
    }
    Ok((first > 0).then_some((context - first) as i64))
}

/// The shape input `v` has in [`window`]'s probe step: batch 1, a past's tokens `context - 1`,
/// `input_ids`' and `position_ids`' one new token, any other symbolic dim 0 (image features
/// at a decode step); `None` where a dim is left unknown.
fn probe_dims(m: &Module, v: Value, context: usize) -> Option<Vec<i64>> {
    let shape = m.value_type(v).shape()?;
    let name = m.values[v].name.as_deref().unwrap_or("");
    let past = name.to_ascii_lowercase().contains("past");
    let rank = shape.len();
    Some(
        shape
            .iter()
            .enumerate()
            .map(|(i, d)| match d.as_known() {
                Some(n) => n,
                None if i == 0 => 1,
                None if past && rank == 4 && i == 2 => context as i64 - 1,
                None if matches!(name, "input_ids" | "position_ids") => 1,
                None => 0,
            })
            .collect(),
    )
}

/// Whether `v` of graph `g` depends on no graph input but `input`, and on no subgraph. With
/// `shapes_free`, what is read only through `Shape` or `Size` does not count.
fn depends_only_on(m: &Module, g: GraphId, v: Value, input: Value, shapes_free: bool) -> bool {
    let mut stack = vec![v];
    let mut seen = HashSet::new();
    while let Some(v) = stack.pop() {
        if !seen.insert(v) {
            continue;
        }
        match m.values[v].def {
            ValueDef::Input { .. } if v != input => return false,
            ValueDef::Output { node, .. } => {
                let n = &m.nodes[node];
                if shapes_free && matches!(n.op, Op::Shape { .. } | Op::Size {}) {
                    continue;
                }
                if !n.op.subgraphs().is_empty() || n.graph != g {
                    return false;
                }
                stack.extend(n.inputs.iter().flatten());
            }
            _ => {}
        }
    }
    true
}

/// The packed projection GQA reads: `p.x`, plus the concatenated biases where the parts had them
/// (one `Add` before node `at`).
fn packed_value(m: &mut Module, g: GraphId, p: &Packed, at: Node) -> Value {
    let Some(bias) = &p.bias else {
        return p.x;
    };
    let mut e = Emit::new(m, g, "qkv_bias");
    let b = e.f32s(m, vec![bias.len() as i64], bias);
    mmq_ir::edit::place(m, e, true);
    let ty = m.value_type(p.x).clone();
    let add = m
        .cursor(g, At::Before(at))
        .insert(NewNode::new(Op::Add {}, vec![Some(p.x), Some(b)]).outputs(vec![Some((None, ty))]));
    m.nodes[add].outputs[0].expect("one result")
}

/// The rotary node `r` again, on the 3-D `x` with `heads` heads.
fn rotary_3d(m: &mut Module, g: GraphId, r: Node, x: Value, heads: i64, at: Node) -> Value {
    let mut attrs: Vec<(String, Attr)> = m.nodes[r]
        .op
        .attrs()
        .into_iter()
        .filter(|(n, _)| *n != "num_heads")
        .map(|(n, a)| (n.to_owned(), a))
        .collect();
    attrs.push(("num_heads".into(), Attr::Int(heads)));
    let mut inputs = m.nodes[r].inputs.clone();
    inputs[0] = Some(x);
    let ty = m.value_type(x).clone();
    let node = m.cursor(g, At::Before(at)).insert(
        NewNode::new(Op::from_parts("", "RotaryEmbedding", attrs), inputs)
            .outputs(vec![Some((None, ty))]),
    );
    m.nodes[node].outputs[0].expect("one result")
}

/// Emits layer `l`'s `GroupQueryAttention` (the rotary embedding inside it with `inside`'s
/// tables) and moves the readers of its values onto it.
fn emit_layer(
    m: &mut Module,
    g: GraphId,
    l: &Layer,
    seqlens: Value,
    total: Value,
    inside: Option<Tables>,
) {
    let (h, kvh) = l.heads;
    let mut attrs = vec![
        ("kv_num_heads".to_owned(), Attr::Int(kvh)),
        ("num_heads".to_owned(), Attr::Int(h)),
    ];
    let mut rest = Vec::new();
    let (q, k, v) = match (l.rotary, inside) {
        (Some((qr, _)), Some(t)) => {
            let interleaved = match m.nodes[qr].op {
                Op::RotaryEmbedding { interleaved, .. } => interleaved.unwrap_or(0),
                _ => 0,
            };
            attrs.push(("do_rotary".to_owned(), Attr::Int(1)));
            attrs.push(("rotary_interleaved".to_owned(), Attr::Int(interleaved)));
            rest = vec![Some(t.cos), Some(t.sin), Some(t.positions)];
            match &l.packed {
                Some(p) => (packed_value(m, g, p, l.attention), None, None),
                None => (l.q, Some(l.k), Some(l.v)),
            }
        }
        (Some((qr, kr)), None) => (
            rotary_3d(m, g, qr, l.q, h, l.attention),
            Some(rotary_3d(m, g, kr, l.k, kvh, l.attention)),
            Some(l.v),
        ),
        (None, _) => match &l.packed {
            Some(p) => (packed_value(m, g, p, l.attention), None, None),
            None => (l.q, Some(l.k), Some(l.v)),
        },
    };
    if let Some(s) = l.scale {
        attrs.push(("scale".to_owned(), Attr::Float(s)));
    }
    if let Some(w) = l.window {
        attrs.push(("local_window_size".to_owned(), Attr::Int(w)));
    }
    // The new results take the names of the values they replace (the presents are outputs).
    let result = |m: &mut Module, v: Value| {
        let name = m.values[v].name.take();
        Some((name, m.value_type(v).clone()))
    };
    // A 2-D result (`[B*S, H*D]`) is GQA's `[B, S, H*D]` reshaped.
    let flat = m.value_type(l.out).shape().map(<[_]>::len) == Some(2);
    let y = if flat {
        let dims = m.value_type(q).shape().map(|s| s[..2].to_vec());
        let ty = match (dims, m.value_type(q).dtype()) {
            (Some(mut d), Some(dt)) => {
                d.push(mmq_ir::Dim::known(h * l.head_dim));
                mmq_ir::Type::tensor(dt, d)
            }
            _ => mmq_ir::Type::Unknown,
        };
        Some((None, ty))
    } else {
        result(m, l.out)
    };
    let outputs = vec![y, result(m, l.present.0), result(m, l.present.1)];
    let name = m.nodes[l.attention]
        .name
        .clone()
        .map(|n| format!("{n}_gqa"));
    let gqa = m.cursor(g, At::Before(l.attention)).insert(NewNode {
        op: Op::from_parts("com.microsoft", "GroupQueryAttention", attrs),
        inputs: [
            Some(q),
            k,
            v,
            Some(l.past.0),
            Some(l.past.1),
            Some(seqlens),
            Some(total),
        ]
        .into_iter()
        .chain(rest)
        .collect(),
        outputs,
        name,
    });
    let mut made = m.nodes[gqa].outputs.clone();
    if let (true, Some(y)) = (flat, made[0]) {
        let mut e = Emit::new(m, g, "gqa_flat");
        let shape = e.i64s(m, &[-1, h * l.head_dim]);
        mmq_ir::edit::place(m, e, true);
        let out = result(m, l.out);
        let r = m.cursor(g, At::Before(l.attention)).insert(
            NewNode::new(Op::Reshape { allowzero: None }, vec![Some(y), Some(shape)])
                .outputs(vec![out]),
        );
        made[0] = m.nodes[r].outputs[0];
    }
    for (old, new) in [l.out, l.present.0, l.present.1].into_iter().zip(made) {
        if let Some(new) = new {
            m.replace_uses(old, new, g, &[]);
        }
    }
}

/// Where graph `g` reads a past's length (`Shape(past)[2:3]`, or `Gather(Shape(past), 2)` as
/// the TorchScript exporter writes it; GPT-2 exports without a `position_ids` input read it for
/// their positions), it reads `mask`'s length less the new tokens' (`input_ids`' dim 1)
/// instead: the same number under the decoder contract (the mask covers the past and the new
/// tokens), and one that stays right when the past is a buffer of the context's length.
fn past_lengths_from_mask(m: &mut Module, g: GraphId, mask: Value) {
    let Some(ids) = input_named(m, g, "input_ids") else {
        return;
    };
    let pasts: HashSet<Value> = m.graphs[g]
        .nodes()
        .iter()
        .filter(|&&n| matches!(m.nodes[n].op, Op::GroupQueryAttention { .. }))
        .flat_map(|&n| [3, 4].map(|i| m.nodes[n].inputs.get(i).copied().flatten()))
        .flatten()
        .collect();
    let lengths: Vec<(Node, bool)> = m.graphs[g]
        .nodes()
        .iter()
        .filter_map(|&n| past_length_read(m, n, &pasts).map(|scalar| (n, scalar)))
        .collect();
    for (n, scalar) in lengths {
        let Some(old) = m.nodes[n].outputs.first().copied().flatten() else {
            continue;
        };
        let mut e = Emit::new(m, g, "past_length");
        let dim1 = || Op::Shape {
            start: Some(1),
            end: Some(2),
        };
        let total = e.op(m, dim1(), vec![mask]);
        let new = e.op(m, dim1(), vec![ids]);
        let mut len = e.binary(m, Op::Sub {}, total, new);
        if scalar {
            len = e.op(m, Op::Squeeze { axes: None }, vec![len]);
        }
        mmq_ir::edit::place(m, e, true);
        m.replace_uses(old, len, g, &[]);
    }
}

/// Whether node `n` reads the length of one of the 4-D `pasts`: `Some(false)` for
/// `Shape(past)[2:3]` (`[1]`), `Some(true)` for `Gather(Shape(past), 2)` (a scalar).
fn past_length_read(m: &Module, n: Node, pasts: &HashSet<Value>) -> Option<bool> {
    let node = &m.nodes[n];
    let of_past = |shape: &mmq_ir::NodeData| {
        shape
            .inputs
            .first()
            .copied()
            .flatten()
            .filter(|v| pasts.contains(v))
            .and_then(|v| m.value_type(v).shape().map(<[_]>::len))
            == Some(4)
    };
    match node.op {
        Op::Shape {
            start: Some(2 | -2),
            end: Some(3 | -1),
        } => of_past(node).then_some(false),
        Op::Gather {
            axis: None | Some(0),
        } => {
            let shape = def_of(m, node.inputs.first().copied()??, mmq_ir::OpKind::Shape)?;
            let whole = matches!(
                m.nodes[shape].op,
                Op::Shape {
                    start: None | Some(0),
                    end: None
                }
            );
            let index = node.inputs.get(1).copied()??;
            let two = m.value_type(index).shape().is_some_and(<[_]>::is_empty)
                && matches!(const_i64s(m, index)?.as_slice(), [2 | -2]);
            (whole && two && of_past(&m.nodes[shape])).then_some(true)
        }
        _ => None,
    }
}

/// Whether every reader of a past cache input is a `GroupQueryAttention` or a `Shape` of its
/// leading dims (a shared buffer's sequence length is the buffer's, not the past's).
fn pasts_read_by_gqa_only(m: &Module, g: GraphId) -> bool {
    let gqa: Vec<Node> = m.graphs[g]
        .nodes()
        .iter()
        .copied()
        .filter(|&n| matches!(m.nodes[n].op, Op::GroupQueryAttention { .. }))
        .collect();
    let pasts: HashSet<Value> = gqa
        .iter()
        .flat_map(|&n| [3, 4].map(|i| m.nodes[n].inputs.get(i).copied().flatten()))
        .flatten()
        .collect();
    m.graphs[g].nodes().iter().all(|&n| {
        let node = &m.nodes[n];
        if !node.inputs.iter().flatten().any(|v| pasts.contains(v)) {
            return true;
        }
        match node.op {
            Op::GroupQueryAttention { .. } => node.inputs[..3]
                .iter()
                .flatten()
                .chain(node.inputs.iter().skip(5).flatten())
                .all(|v| !pasts.contains(v)),
            Op::Shape { end: Some(end), .. } => (0..=2).contains(&end),
            _ => false,
        }
    })
}

/// What gives one `GroupQueryAttention` layer's static INT8 cache scales ([`quantize_caches`]):
/// the largest |x| of each channel of its key and value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheProbe {
    /// The layer.
    pub node: Node,
    /// The value whose last-axis channels `key.1 .. key.1 + width` are the key (Q, K and V
    /// packed in one value have the key at an offset), before its rotary embedding when it has
    /// one: the rotation mixes channel pairs, so a pair's ranges before it bound the rotated key
    /// at every position.
    pub key: (Value, usize),
    /// The value's channels, likewise.
    pub value: (Value, usize),
    /// The rotation of the key: (rotated channels per head, interleaved pairs).
    pub rotary: Option<(usize, bool)>,
    /// Values per head.
    pub head_dim: usize,
    /// Channels of one cache (`kvN * head_dim`).
    pub width: usize,
}

/// The layers of graph `g`'s `GroupQueryAttention` nodes with float caches, each with the
/// values whose channel ranges give its cache scales.
pub fn cache_probes(m: &Module, g: GraphId) -> Vec<CacheProbe> {
    let mut out = Vec::new();
    for &n in m.graphs[g].nodes() {
        let node = &m.nodes[n];
        let Op::GroupQueryAttention {
            num_heads: Some(nh),
            kv_num_heads: Some(kvh),
            k_quant_type,
            v_quant_type,
            do_rotary,
            rotary_interleaved,
            ..
        } = &node.op
        else {
            continue;
        };
        let float = |t: &Option<String>| t.as_deref().is_none_or(|t| t == "NONE");
        if !(float(k_quant_type) && float(v_quant_type)) || *kvh <= 0 || *nh <= 0 {
            continue;
        }
        let (nh, kvh) = (*nh as usize, *kvh as usize);
        let at = |i: usize| node.inputs.get(i).copied().flatten();
        let last = |v: Value| -> Option<usize> {
            let w = m.value_type(v).shape()?.get(2)?.as_known()?;
            usize::try_from(w).ok()
        };
        let Some(q) = at(0) else {
            continue;
        };
        let (key, value, head_dim) = match (at(1), at(2)) {
            (Some(k), Some(v)) => match last(k) {
                Some(w) => ((k, 0), (v, 0), w / kvh),
                None => continue,
            },
            (None, None) => match last(q) {
                Some(w) => {
                    let d = w / (nh + 2 * kvh);
                    ((q, nh * d), (q, (nh + kvh) * d), d)
                }
                None => continue,
            },
            _ => continue,
        };
        let (key, rotary) = if do_rotary.unwrap_or(0) != 0 {
            let half = at(7)
                .and_then(|c| m.value_type(c).shape()?.get(1)?.as_known())
                .and_then(|h| usize::try_from(h).ok());
            let Some(half) = half else {
                continue;
            };
            (key, Some((2 * half, rotary_interleaved.unwrap_or(0) != 0)))
        } else {
            match m.producer(key.0).map(|p| (&p.op, p.inputs.first())) {
                Some((
                    Op::RotaryEmbedding {
                        interleaved,
                        rotary_embedding_dim,
                        ..
                    },
                    Some(Some(x)),
                )) if key.1 == 0 => {
                    let dims = rotary_embedding_dim
                        .filter(|&r| r > 0)
                        .map_or(head_dim, |r| r as usize);
                    ((*x, 0), Some((dims, interleaved.unwrap_or(0) != 0)))
                }
                _ => (key, None),
            }
        };
        out.push(CacheProbe {
            node: n,
            key,
            rotary,
            value,
            head_dim,
            width: kvh * head_dim,
        });
    }
    out
}

/// Per-channel INT8 scales (`abs_max / 127`) of a cache from the largest |x| of each of its
/// `kvN * head_dim` channels. Where `rotary` says the channels are rotated in pairs, both
/// channels of a pair get the pair's bound `sqrt(a² + b²)`: no rotation of values within the
/// ranges leaves it. A channel never seen away from zero gets the smallest normal scale.
pub fn channel_scales(abs_max: &[f32], head_dim: usize, rotary: Option<(usize, bool)>) -> Vec<f32> {
    let mut bound = abs_max.to_vec();
    if let Some((dims, interleaved)) = rotary {
        let dims = dims.min(head_dim) & !1;
        for head in abs_max.chunks_exact(head_dim).enumerate() {
            let (h, a) = head;
            for i in 0..dims / 2 {
                let (x, y) = if interleaved {
                    (2 * i, 2 * i + 1)
                } else {
                    (i, i + dims / 2)
                };
                let r = a[x].hypot(a[y]);
                bound[h * head_dim + x] = r;
                bound[h * head_dim + y] = r;
            }
        }
    }
    bound
        .into_iter()
        .map(|b| (b / 127.0).max(f32::MIN_POSITIVE))
        .collect()
}

/// Makes the caches of the given `GroupQueryAttention` layers INT8 codes with static
/// per-channel scales (`[1, kvN, 1, H]` constants; ONNX Runtime's `k_quant_type` /
/// `v_quant_type` `PER_CHANNEL`, `kv_cache_bit_width` 8): the pasts and presents become int8.
/// Each entry is (layer, key scales, value scales), `kvN * H` each.
pub fn quantize_caches(m: &mut Module, layers: &[(Node, Vec<f32>, Vec<f32>)]) {
    for (n, kscale, vscale) in layers {
        let n = *n;
        let g = m.nodes[n].graph;
        let Op::GroupQueryAttention {
            kv_num_heads: Some(kvh),
            ..
        } = m.nodes[n].op
        else {
            continue;
        };
        let head_dim = (kscale.len() as i64) / kvh.max(1);
        let mut e = Emit::new(m, g, "kv_scale");
        let shape = vec![1, kvh, 1, head_dim];
        let ks = e.f32s(m, shape.clone(), kscale);
        let vs = e.f32s(m, shape, vscale);
        mmq_ir::edit::place(m, e, true);
        let mut attrs: Vec<(String, Attr)> = m.nodes[n]
            .op
            .attrs()
            .into_iter()
            .filter(|(k, _)| !matches!(*k, "k_quant_type" | "v_quant_type" | "kv_cache_bit_width"))
            .map(|(k, a)| (k.to_owned(), a))
            .collect();
        attrs.extend([
            (
                "k_quant_type".to_owned(),
                Attr::String("PER_CHANNEL".into()),
            ),
            (
                "v_quant_type".to_owned(),
                Attr::String("PER_CHANNEL".into()),
            ),
            ("kv_cache_bit_width".to_owned(), Attr::Int(8)),
        ]);
        m.nodes[n].op = Op::from_parts("com.microsoft", "GroupQueryAttention", attrs);
        let mut inputs = m.nodes[n].inputs.clone();
        inputs.resize(14, None);
        inputs[12] = Some(ks);
        inputs[13] = Some(vs);
        let caches: Vec<Value> = [inputs[3], inputs[4]]
            .into_iter()
            .flatten()
            .chain(m.nodes[n].outputs.iter().skip(1).copied().flatten())
            .collect();
        m.set_operands(n, inputs);
        for v in caches {
            let ty = match m.value_type(v).shape() {
                Some(s) => mmq_ir::Type::tensor(DType::I8, s.to_vec()),
                None => continue,
            };
            m.set_type(v, ty);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::channel_scales;

    #[test]
    fn rotated_pairs_share_the_bound_no_rotation_exceeds() {
        // Two heads of 4 channels; half rotation pairs (0, 2) and (1, 3).
        let abs = [3.0, 1.0, 4.0, 0.0, 1.0, 1.0, 1.0, 1.0];
        let s = channel_scales(&abs, 4, Some((4, false)));
        let pair = |a: f32, b: f32| a.hypot(b) / 127.0;
        assert_eq!(s[0], pair(3.0, 4.0));
        assert_eq!(s[2], pair(3.0, 4.0));
        assert_eq!(s[1], pair(1.0, 0.0));
        assert_eq!(s[3], pair(1.0, 0.0));
        assert_eq!(s[4], pair(1.0, 1.0));
        // Interleaved pairs (0, 1) and (2, 3); a rotation of 2 channels leaves the rest alone.
        let s = channel_scales(&abs, 4, Some((2, true)));
        assert_eq!(s[0], pair(3.0, 1.0));
        assert_eq!(s[1], pair(3.0, 1.0));
        assert_eq!(s[2], 4.0 / 127.0);
        // No rotation: each channel its own; a channel never away from zero stays positive.
        let s = channel_scales(&abs, 4, None);
        assert_eq!(s[2], 4.0 / 127.0);
        assert_eq!(s[3], f32::MIN_POSITIVE);
    }
}
