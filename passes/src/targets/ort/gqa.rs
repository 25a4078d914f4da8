//! The decoder form onnxruntime-genai runs fastest: each layer's standard `Attention` over
//! `Concat(past, new)` becomes `com.microsoft.GroupQueryAttention` on the `[B, S, H*D]`
//! projections, so the past and the present can share one buffer (`past_present_share_buffer`)
//! and no step copies the cache (measured by `tools/gqa_probe.py`, `docs/benchmarks.md`).
//!
//! GQA takes the mask as sequence lengths (`seqlens_k = ReduceSum(attention_mask) - 1`), causal
//! with the keys' padding: what onnxruntime-genai's model builder assumes of a decoder. The
//! rewrite makes the same assumption, and only where the mask depends on no input value but
//! `attention_mask` (the past and token inputs only through their shapes) and the past's length
//! is symbolic (a fixed-shape export is left alone). A layer that does not
//! have the export form (`Transpose(Reshape(x))` into the attention, optionally through a
//! `RotaryEmbedding`, and `Reshape(Transpose(y))` out of it) is left as it is.

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
    /// Every layer was rewritten and nothing else reads a past's sequence length: the past may
    /// be the present's buffer (else nothing was rewritten).
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
    past: (Value, Value),
    present: (Value, Value),
    /// The 3-D value the attention's output becomes.
    out: Value,
    heads: (i64, i64),
    scale: Option<f32>,
}

/// Rewrites the entry graph's attention layers (see the module documentation) when every layer
/// has the form and the pasts can then share the presents' buffers; otherwise leaves `m` as it
/// is (and says how many layers had the form).
pub fn rewrite(m: &mut Module) -> Result<Rewritten, PassError> {
    let mut c = m.clone();
    let done = rewrite_all(&mut c)?;
    if done.shared {
        *m = c;
        Ok(done)
    } else {
        Ok(Rewritten {
            kept: done.kept + done.layers,
            layers: 0,
            shared: false,
        })
    }
}

fn rewrite_all(m: &mut Module) -> Result<Rewritten, PassError> {
    let Some(entry) = m.entries.first() else {
        return Ok(Rewritten::default());
    };
    let g = entry.graph;
    let Some(mask) = m.graphs[g]
        .inputs
        .iter()
        .copied()
        .find(|&v| m.values[v].name.as_deref() == Some("attention_mask"))
    else {
        return Ok(Rewritten::default());
    };
    let readers = readers(m, g);
    let outputs: HashSet<Value> = m.graphs[g].outputs.iter().copied().collect();
    let mut layers = Vec::new();
    let mut kept = 0;
    for &n in m.graphs[g].nodes() {
        if !matches!(m.nodes[n].op, Op::Attention { .. }) {
            continue;
        }
        match layer(m, g, n, mask, &readers, &outputs) {
            Some(l) => layers.push(l),
            None => kept += 1,
        }
    }
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
    let count = layers.len();
    for l in layers {
        emit_layer(m, g, &l, seqlens, total);
    }
    Dce.run(m, &PassOptions::default())?;
    let shared = kept == 0 && pasts_read_by_gqa_only(m, g);
    Ok(Rewritten {
        layers: count,
        kept,
        shared,
    })
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

/// Whether `v`'s value depends on no graph input's values but `mask`'s (shapes read through
/// `Shape` do not count).
fn reads_only(m: &Module, g: GraphId, v: Value, mask: Value) -> bool {
    let mut stack = vec![v];
    let mut seen = HashSet::new();
    while let Some(v) = stack.pop() {
        if !seen.insert(v) {
            continue;
        }
        match m.values[v].def {
            ValueDef::Input { .. } if v != mask && m.graphs[g].inputs.contains(&v) => return false,
            ValueDef::Output { node, .. } => {
                if matches!(m.nodes[node].op, Op::Shape { .. } | Op::Size {}) {
                    continue;
                }
                if !m.nodes[node].op.subgraphs().is_empty() {
                    return false;
                }
                stack.extend(m.nodes[node].inputs.iter().flatten());
            }
            _ => {}
        }
    }
    true
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
            if !reads_only(m, g, bias, mask) {
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
    // Out: Reshape(Transpose(y)) back to [B, S, heads*D], each read by the next alone.
    let y = node.outputs.first().copied().flatten()?;
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
    (m.value_type(out).shape().map(<[_]>::len) == Some(3) && d == kd && h % kvh == 0).then_some(
        Layer {
            attention: n,
            q,
            k,
            v,
            rotary,
            past: (past_k, past_v),
            present: (kcat, vcat),
            out,
            heads: (h, kvh),
            scale: *scale,
        },
    )
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

/// Emits layer `l`'s `GroupQueryAttention` and moves the readers of its values onto it.
fn emit_layer(m: &mut Module, g: GraphId, l: &Layer, seqlens: Value, total: Value) {
    let (h, kvh) = l.heads;
    let (q, k) = match l.rotary {
        Some((qr, kr)) => (
            rotary_3d(m, g, qr, l.q, h, l.attention),
            rotary_3d(m, g, kr, l.k, kvh, l.attention),
        ),
        None => (l.q, l.k),
    };
    let mut attrs = vec![
        ("kv_num_heads".to_owned(), Attr::Int(kvh)),
        ("num_heads".to_owned(), Attr::Int(h)),
    ];
    if let Some(s) = l.scale {
        attrs.push(("scale".to_owned(), Attr::Float(s)));
    }
    // The new results take the names of the values they replace (the presents are outputs).
    let result = |m: &mut Module, v: Value| {
        let name = m.values[v].name.take();
        Some((name, m.value_type(v).clone()))
    };
    let outputs = vec![
        result(m, l.out),
        result(m, l.present.0),
        result(m, l.present.1),
    ];
    let name = m.nodes[l.attention]
        .name
        .clone()
        .map(|n| format!("{n}_gqa"));
    let gqa = m.cursor(g, At::Before(l.attention)).insert(NewNode {
        op: Op::from_parts("com.microsoft", "GroupQueryAttention", attrs),
        inputs: vec![
            Some(q),
            Some(k),
            Some(l.v),
            Some(l.past.0),
            Some(l.past.1),
            Some(seqlens),
            Some(total),
        ],
        outputs,
        name,
    });
    let made = m.nodes[gqa].outputs.clone();
    for (old, new) in [l.out, l.present.0, l.present.1].into_iter().zip(made) {
        if let Some(new) = new {
            m.replace_uses(old, new, g, &[]);
        }
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
