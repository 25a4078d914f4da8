//! Opset-23 ops a target lacks, in standard ops: `RMSNormalization`, `RotaryEmbedding` and
//! `Attention` (what PyTorch's dynamo exporter writes at opset 23). The `trt` target runs this
//! first ([`crate::targets::Target::legalize`]): TensorRT's ONNX parser has none of them, and it
//! fuses the decomposed forms (normalization, attention) itself.
//!
//! - `RMSNormalization(x, scale)`: `x / sqrt(ReduceMean(x², axes ≥ axis) + epsilon) * scale`, in
//!   f32 (the default `stash_type`) and back.
//! - `RotaryEmbedding(x, cos, sin[, position_ids])` (not interleaved): the first
//!   `rotary_embedding_dim` of each head split in halves `x1`, `x2`, then
//!   `x1·cos − x2·sin ‖ x1·sin + x2·cos ‖ rest`, the caches gathered by `position_ids` when given.
//! - `Attention(Q, K, V[, mask, past_key, past_value])`: heads split for 3-D inputs, the past
//!   concatenated (the `present` outputs), kv heads repeated for grouped queries,
//!   `Softmax(Q·Kᵀ · scale (softcapped) + mask (or −∞ where a boolean mask is false, or where
//!   `is_causal` hides a later key)) · V`.
//!
//! A node in a form outside these (interleaved rotary, `position_ids` other than `[batch, seq]`,
//! the `qk_matmul_output` output, sliding windows, `nonpad_kv_seqlen`, heads or head sizes not
//! known statically) stays, with a note; the target's linter names it. A query row that a mask
//! hides entirely (padding) is 0, as in the reference, not Softmax's NaN.

use mmq_ir::{DType, GraphId, Module, Node, Op, OpKind, Value};

use crate::dce::live_graphs;
use crate::pass::{Pass, PassError, PassOptions, PassReport};
use mmq_ir::edit::{Emit, place_before};

/// Decomposes the ops of kinds `ops` (of those this module knows).
pub struct Decompose {
    /// The kinds to decompose.
    pub ops: Vec<OpKind>,
}

impl Pass for Decompose {
    fn name(&self) -> &str {
        "decompose"
    }

    fn run(&self, m: &mut Module, _opts: &PassOptions) -> Result<PassReport, PassError> {
        let mut report = PassReport::default();
        for g in live_graphs(m) {
            for n in m.graphs[g].nodes().to_vec() {
                if !self.ops.contains(&m.nodes[n].op.kind()) {
                    continue;
                }
                let op = m.nodes[n].op.op_type().to_owned();
                let done = match m.nodes[n].op {
                    Op::RMSNormalization { .. } => rms_norm(m, g, n),
                    Op::RotaryEmbedding { .. } => rotary(m, g, n),
                    Op::Attention { .. } => attention(m, g, n),
                    _ => continue,
                };
                let name = m.nodes[n].name.clone().unwrap_or_else(|| op.clone());
                match done {
                    Ok(()) => {
                        report.count(&format!("decomposed-{op}"), 1);
                        report.changed = true;
                    }
                    Err(why) => report.notes.push(format!("{name} ({op}) kept: {why}")),
                }
            }
        }
        Ok(report)
    }
}

/// The static dims of `v`, `None` per unknown dim; `None` when the rank is unknown.
fn dims(m: &Module, v: Value) -> Option<Vec<Option<i64>>> {
    Some(
        m.value_type(v)
            .shape()?
            .iter()
            .map(|d| d.as_known())
            .collect(),
    )
}

/// Result `i` of `n` now computed as `new` (the nodes in `e` are placed before `n`, which leaves
/// the graph): every reader and the graph outputs read `new`, which takes the old name and type
/// (through an `Identity` when `new` is not one of the emitted results, such as an input).
fn replace_result(m: &mut Module, g: GraphId, n: Node, i: usize, new: Value, e: &mut Emit) {
    let Some(old) = m.nodes[n].outputs.get(i).copied().flatten() else {
        return;
    };
    let emitted = e
        .nodes
        .iter()
        .any(|&x| m.nodes[x].outputs.contains(&Some(new)));
    let new = if emitted {
        new
    } else {
        e.op(m, Op::Identity {}, vec![new])
    };
    m.replace_uses(old, new, g, &e.nodes);
    let ty = m.value_type(old).clone();
    m.set_type(new, ty);
    m.values[new].name = m.values[old].name.take();
}

/// Places `e` before `n` and drops `n`.
fn finish(m: &mut Module, n: Node, e: Emit) {
    place_before(m, e, n);
    m.remove_node(n);
}

fn input(m: &Module, n: Node, i: usize) -> Option<Value> {
    m.nodes[n].inputs.get(i).copied().flatten()
}

fn slice_last(e: &mut Emit, m: &mut Module, x: Value, start: i64, end: i64) -> Value {
    let (s, t, a) = (e.i64s(m, &[start]), e.i64s(m, &[end]), e.i64s(m, &[-1]));
    let op = Op::Slice {
        starts: None,
        ends: None,
        axes: None,
    };
    e.op(m, op, vec![x, s, t, a])
}

fn unsqueeze(e: &mut Emit, m: &mut Module, x: Value, axes: &[i64]) -> Value {
    let a = e.i64s(m, axes);
    e.op(m, Op::Unsqueeze { axes: None }, vec![x, a])
}

fn transpose(e: &mut Emit, m: &mut Module, x: Value, perm: &[i64]) -> Value {
    let op = Op::Transpose {
        perm: Some(perm.to_vec()),
    };
    e.op(m, op, vec![x])
}

/// A scalar of `x`'s float type.
fn scalar_like(e: &mut Emit, m: &mut Module, v: f32, dtype: DType) -> Value {
    let c = e.f32(m, v);
    if dtype == DType::F32 {
        c
    } else {
        e.cast(m, c, dtype)
    }
}

fn rms_norm(m: &mut Module, g: GraphId, n: Node) -> Result<(), String> {
    let Op::RMSNormalization { axis, epsilon, .. } = m.nodes[n].op.clone() else {
        return Err("not RMSNormalization".into());
    };
    let x = input(m, n, 0).ok_or("no input")?;
    let scale = input(m, n, 1).ok_or("no scale")?;
    let rank = dims(m, x).ok_or("the input's rank is unknown")?.len() as i64;
    let axis = axis.unwrap_or(-1);
    let first = if axis < 0 { axis + rank } else { axis };
    if !(0..rank).contains(&first) {
        return Err(format!("axis {axis} is outside rank {rank}"));
    }
    let dtype = m
        .value_type(x)
        .dtype()
        .ok_or("the input's type is unknown")?;
    let mut e = Emit::new(
        m,
        g,
        &format!("{}_rms", m.nodes[n].name.as_deref().unwrap_or("rms")),
    );
    let xf = if dtype == DType::F32 {
        x
    } else {
        e.cast(m, x, DType::F32)
    };
    let sq = e.binary(m, Op::Mul {}, xf, xf);
    let axes: Vec<i64> = (first..rank).collect();
    let axes = e.i64s(m, &axes);
    let reduce = Op::ReduceMean {
        axes: None,
        keepdims: Some(1),
        noop_with_empty_axes: None,
    };
    let ms = e.op(m, reduce, vec![sq, axes]);
    let eps = e.f32(m, epsilon.unwrap_or(1e-5));
    let var = e.binary(m, Op::Add {}, ms, eps);
    let rms = e.op(m, Op::Sqrt {}, vec![var]);
    let mut normed = e.binary(m, Op::Div {}, xf, rms);
    if dtype != DType::F32 {
        normed = e.cast(m, normed, dtype);
    }
    let y = e.binary(m, Op::Mul {}, normed, scale);
    replace_result(m, g, n, 0, y, &mut e);
    finish(m, n, e);
    Ok(())
}

fn rotary(m: &mut Module, g: GraphId, n: Node) -> Result<(), String> {
    let Op::RotaryEmbedding {
        interleaved,
        num_heads,
        rotary_embedding_dim,
    } = m.nodes[n].op.clone()
    else {
        return Err("not RotaryEmbedding".into());
    };
    if interleaved.unwrap_or(0) != 0 {
        return Err("interleaved rotation".into());
    }
    let x = input(m, n, 0).ok_or("no input")?;
    let (mut cos, mut sin) = (
        input(m, n, 1).ok_or("no cos")?,
        input(m, n, 2).ok_or("no sin")?,
    );
    let xd = dims(m, x).ok_or("the input's rank is unknown")?;
    let head = match (xd.len(), num_heads) {
        (4, _) => xd[3].ok_or("the head size is not static")?,
        (3, Some(h)) if h > 0 => xd[2].ok_or("the hidden size is not static")? / h,
        _ => return Err("a 3-D input without num_heads, or another rank".into()),
    };
    let rd = rotary_embedding_dim.filter(|&r| r > 0).unwrap_or(head);
    if rd > head || rd % 2 != 0 {
        return Err(format!(
            "rotary_embedding_dim {rd} does not fit head size {head}"
        ));
    }
    let half = rd / 2;
    let mut e = Emit::new(
        m,
        g,
        &format!("{}_rope", m.nodes[n].name.as_deref().unwrap_or("rope")),
    );
    if let Some(pos) = input(m, n, 3) {
        if dims(m, pos).map(|d| d.len()) != Some(2) {
            return Err("position_ids other than [batch, seq]".into());
        }
        cos = e.op(m, Op::Gather { axis: Some(0) }, vec![cos, pos]);
        sin = e.op(m, Op::Gather { axis: Some(0) }, vec![sin, pos]);
    }
    let cache_rank = if input(m, n, 3).is_some() {
        3
    } else {
        dims(m, cos).ok_or("the cache's rank is unknown")?.len()
    };
    // Heads as [B, H, S, D] (4-D input) or [B, S, H, D] (3-D input split); the caches broadcast
    // over the head axis.
    let (xh, head_axis) = if xd.len() == 4 {
        (x, 1)
    } else {
        let shape = e.i64s(m, &[0, 0, num_heads.unwrap_or(1), head]);
        (e.reshape(m, x, shape), 2)
    };
    let (c, s) = match (cache_rank, head_axis) {
        (3, axis) => (
            unsqueeze(&mut e, m, cos, &[axis]),
            unsqueeze(&mut e, m, sin, &[axis]),
        ),
        (2, 1) => (cos, sin),
        (2, _) => (
            unsqueeze(&mut e, m, cos, &[1]),
            unsqueeze(&mut e, m, sin, &[1]),
        ),
        (r, _) => return Err(format!("caches of rank {r}")),
    };
    let x1 = slice_last(&mut e, m, xh, 0, half);
    let x2 = slice_last(&mut e, m, xh, half, rd);
    let x1c = e.binary(m, Op::Mul {}, x1, c);
    let x2s = e.binary(m, Op::Mul {}, x2, s);
    let y1 = e.binary(m, Op::Sub {}, x1c, x2s);
    let x1s = e.binary(m, Op::Mul {}, x1, s);
    let x2c = e.binary(m, Op::Mul {}, x2, c);
    let y2 = e.binary(m, Op::Add {}, x1s, x2c);
    let mut parts = vec![y1, y2];
    if rd < head {
        parts.push(slice_last(&mut e, m, xh, rd, head));
    }
    let mut y = e.op(m, Op::Concat { axis: Some(-1) }, parts);
    if xd.len() == 3 {
        let shape = e.shape(m, x);
        y = e.reshape(m, y, shape);
    }
    replace_result(m, g, n, 0, y, &mut e);
    finish(m, n, e);
    Ok(())
}

fn attention(m: &mut Module, g: GraphId, n: Node) -> Result<(), String> {
    let Op::Attention {
        is_causal,
        kv_num_heads,
        left_window_size,
        q_num_heads,
        right_window_size,
        scale,
        softcap,
        ..
    } = m.nodes[n].op.clone()
    else {
        return Err("not Attention".into());
    };
    if left_window_size.is_some_and(|w| w >= 0) || right_window_size.is_some_and(|w| w >= 0) {
        return Err("a sliding window".into());
    }
    if input(m, n, 6).is_some() {
        return Err("nonpad_kv_seqlen".into());
    }
    if m.nodes[n].outputs.get(3).copied().flatten().is_some() {
        return Err("the qk_matmul_output output".into());
    }
    let (q, k, v) = (
        input(m, n, 0).ok_or("no Q")?,
        input(m, n, 1).ok_or("no K")?,
        input(m, n, 2).ok_or("no V")?,
    );
    let (mask, past_k, past_v) = (input(m, n, 3), input(m, n, 4), input(m, n, 5));
    if past_k.is_some() != past_v.is_some() {
        return Err("past_key without past_value".into());
    }
    let qd = dims(m, q).ok_or("Q's rank is unknown")?;
    let kd = dims(m, k).ok_or("K's rank is unknown")?;
    let dtype = m.value_type(q).dtype().ok_or("Q's type is unknown")?;
    let three_d = qd.len() == 3;
    let (hq, hkv, d) = match qd.len() {
        4 => (
            qd[1].ok_or("Q's heads are not static")?,
            kd.get(1)
                .copied()
                .flatten()
                .ok_or("K's heads are not static")?,
            qd[3].ok_or("the head size is not static")?,
        ),
        3 => {
            let (hq, hkv) = (
                q_num_heads.ok_or("3-D Q without q_num_heads")?,
                kv_num_heads.ok_or("3-D K without kv_num_heads")?,
            );
            let hidden = qd[2].ok_or("Q's hidden size is not static")?;
            (hq, hkv, hidden / hq.max(1))
        }
        r => return Err(format!("Q of rank {r}")),
    };
    if hkv <= 0 || hq % hkv != 0 {
        return Err(format!("{hq} query heads over {hkv} kv heads"));
    }
    let mut e = Emit::new(
        m,
        g,
        &format!("{}_attn", m.nodes[n].name.as_deref().unwrap_or("attn")),
    );
    let split = |e: &mut Emit, m: &mut Module, x: Value, heads: i64| {
        let shape = e.i64s(m, &[0, 0, heads, -1]);
        let r = e.reshape(m, x, shape);
        transpose(e, m, r, &[0, 2, 1, 3])
    };
    let (q4, mut k4, mut v4) = if three_d {
        (
            split(&mut e, m, q, hq),
            split(&mut e, m, k, hkv),
            split(&mut e, m, v, hkv),
        )
    } else {
        (q, k, v)
    };
    if let (Some(pk), Some(pv)) = (past_k, past_v) {
        k4 = e.op(m, Op::Concat { axis: Some(2) }, vec![pk, k4]);
        v4 = e.op(m, Op::Concat { axis: Some(2) }, vec![pv, v4]);
    }
    let (present_k, present_v) = (k4, v4);
    if hq != hkv {
        // V's head size may differ from Q's and K's.
        let vd = dims(m, v).ok_or("V's rank is unknown")?;
        let dv = match vd.len() {
            4 => vd[3].ok_or("V's head size is not static")?,
            _ => vd[2].ok_or("V's hidden size is not static")? / hkv,
        };
        let rep = hq / hkv;
        let expand = |e: &mut Emit, m: &mut Module, x: Value, last: i64| {
            let u = unsqueeze(e, m, x, &[2]);
            let to = e.i64s(m, &[1, 1, rep, 1, 1]);
            let x = e.op(m, Op::Expand {}, vec![u, to]);
            let shape = e.i64s(m, &[0, hq, -1, last]);
            e.reshape(m, x, shape)
        };
        k4 = expand(&mut e, m, k4, d);
        v4 = expand(&mut e, m, v4, dv);
    }
    let kt = transpose(&mut e, m, k4, &[0, 1, 3, 2]);
    let mut scores = e.binary(m, Op::MatMul {}, q4, kt);
    let scale = scale.unwrap_or(1.0 / (d as f32).sqrt());
    let sc = scalar_like(&mut e, m, scale, dtype);
    scores = e.binary(m, Op::Mul {}, scores, sc);
    if let Some(cap) = softcap.filter(|&c| c > 0.0) {
        let c = scalar_like(&mut e, m, cap, dtype);
        let t = e.binary(m, Op::Div {}, scores, c);
        let t = e.op(m, Op::Tanh {}, vec![t]);
        scores = e.binary(m, Op::Mul {}, t, c);
    }
    let neg_inf = scalar_like(&mut e, m, f32::NEG_INFINITY, dtype);
    if let Some(mask) = mask {
        scores = if m.value_type(mask).dtype() == Some(DType::Bool) {
            e.op(m, Op::Where {}, vec![mask, scores, neg_inf])
        } else {
            e.binary(m, Op::Add {}, scores, mask)
        };
    }
    if is_causal.unwrap_or(0) != 0 {
        // Query i (of S) sees key j (of T) when j <= i + T - S.
        let scalar = |e: &mut Emit, m: &mut Module, x: Value, axis: i64| {
            let d = e.dim(m, x, axis);
            let zero = e.i64s(m, &[0]);
            e.op(m, Op::Squeeze { axes: None }, vec![d, zero])
        };
        let s_len = scalar(&mut e, m, q4, 2);
        let t_len = scalar(&mut e, m, k4, 2);
        let (zero_s, one_s) = (e.i64_scalar(m, 0), e.i64_scalar(m, 1));
        let rows = e.op(m, Op::Range {}, vec![zero_s, s_len, one_s]);
        let cols = e.op(m, Op::Range {}, vec![zero_s, t_len, one_s]);
        let off = e.binary(m, Op::Sub {}, t_len, s_len);
        let last = e.binary(m, Op::Add {}, rows, off);
        let last = unsqueeze(&mut e, m, last, &[1]);
        let allowed = e.binary(m, Op::LessOrEqual {}, cols, last);
        scores = e.op(m, Op::Where {}, vec![allowed, scores, neg_inf]);
    }
    let mut probs = e.op(m, Op::Softmax { axis: Some(-1) }, vec![scores]);
    if mask.is_some() {
        // A row the mask hides entirely is 0, as the reference has it (Softmax gives NaN).
        let nan = e.op(m, Op::IsNaN {}, vec![probs]);
        let zero = scalar_like(&mut e, m, 0.0, dtype);
        probs = e.op(m, Op::Where {}, vec![nan, zero, probs]);
    }
    let mut y = e.binary(m, Op::MatMul {}, probs, v4);
    if three_d {
        let t = transpose(&mut e, m, y, &[0, 2, 1, 3]);
        let shape = e.i64s(m, &[0, 0, -1]);
        y = e.reshape(m, t, shape);
    }
    replace_result(m, g, n, 0, y, &mut e);
    replace_result(m, g, n, 1, present_k, &mut e);
    replace_result(m, g, n, 2, present_v, &mut e);
    finish(m, n, e);
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use mmq_kernels::{Interpreter, RtValue, Tensor};

    use super::*;
    use crate::targets::TargetRef;

    /// Runs `src`'s graph before and after decomposing, on deterministic inputs (`mask`: the
    /// boolean input `%mask`, if any, hides the last key of every query); the outputs must agree.
    fn agrees(src: &str, op: &'static str) {
        let (before, _) = mmq_ir::text::parse(src).unwrap_or_else(|e| panic!("{e:?}"));
        let mut after = before.clone();
        let opts = PassOptions {
            target: TargetRef::TRT,
            explain: false,
        };
        let report = Decompose {
            ops: vec![OpKind::of("", op)],
        }
        .run(&mut after, &opts)
        .expect("runs");
        assert_eq!(
            report.counters.get(&format!("decomposed-{op}")),
            Some(&1),
            "{:?}",
            report.notes
        );
        mmq_ir::infer::infer_module(&mut after);
        mmq_ir::verify::verify(&after).unwrap_or_else(|e| panic!("{e:?}"));
        let g = before.entries[0].graph;
        let mut feeds = HashMap::new();
        for (i, &v) in before.graphs[g].inputs.iter().enumerate() {
            let name = before.values[v].name.clone().unwrap_or_default();
            let shape: Vec<usize> = before
                .value_type(v)
                .shape()
                .expect("static")
                .iter()
                .map(|d| d.as_known().expect("static") as usize)
                .collect();
            let n: usize = shape.iter().product();
            let t = if before.value_type(v).dtype() == Some(DType::Bool) {
                let last = *shape.last().expect("rank");
                let vals = (0..n).map(|j| j % last != last - 1).collect();
                Tensor::new(DType::Bool, shape, mmq_kernels::Data::Bool(vals)).expect("mask")
            } else {
                let vals = (0..n)
                    .map(|j| ((j * 7 + i * 13) as f32 * 0.37).sin())
                    .collect();
                Tensor::from_f32(shape, vals).expect("tensor")
            };
            feeds.insert(name, RtValue::from(t));
        }
        let run = |m: &Module| {
            let g = m.entries[0].graph;
            Interpreter::new(m)
                .run(g, &feeds)
                .expect("runs")
                .into_iter()
                .map(|(n, v)| (n, v.as_tensor().expect("tensor").to_f64().expect("numbers")))
                .collect::<Vec<_>>()
        };
        let (want, got) = (run(&before), run(&after));
        assert_eq!(want.len(), got.len());
        for ((name, w), (_, g)) in want.iter().zip(&got) {
            assert_eq!(w.len(), g.len(), "{name}");
            for (a, b) in w.iter().zip(g) {
                assert!(
                    (a - b).abs() <= 1e-5 * (1.0 + a.abs()),
                    "{name}: {a} vs {b}"
                );
            }
        }
    }

    const MODEL: &str = r#"model {ir_version = 10, opsets = {"" = 23}}"#;

    #[test]
    fn grouped_causal_attention_with_a_past_and_softcap() {
        agrees(
            &format!(
                "graph @g(%q: f32[2, 4, 3, 8], %k: f32[2, 2, 3, 8], %v: f32[2, 2, 3, 8], \
                 %pk: f32[2, 2, 5, 8], %pv: f32[2, 2, 5, 8]) -> (f32[2, 4, 3, 8], \
                 f32[2, 2, 8, 8], f32[2, 2, 8, 8]) {MODEL} {{\n  \
                 %y, %kk, %vv = Attention(%q, %k, %v, _, %pk, %pv) {{is_causal = 1, softcap = 2.0}} : \
                 f32[2, 4, 3, 8], f32[2, 2, 8, 8], f32[2, 2, 8, 8]\n  return %y, %kk, %vv\n}}\n"
            ),
            "Attention",
        );
    }

    #[test]
    fn three_d_attention_with_a_boolean_mask_and_a_scale() {
        agrees(
            &format!(
                "graph @g(%q: f32[2, 3, 16], %k: f32[2, 5, 8], %v: f32[2, 5, 8], \
                 %mask: bool[3, 5]) -> (f32[2, 3, 16]) {MODEL} {{\n  \
                 %y = Attention(%q, %k, %v, %mask) {{q_num_heads = 4, kv_num_heads = 2, scale = 0.3}} : \
                 f32[2, 3, 16]\n  return %y\n}}\n"
            ),
            "Attention",
        );
    }

    #[test]
    fn rotary_embedding_partial_on_3d_input_with_position_ids() {
        agrees(
            &format!(
                "const $pos : i64[2, 3] = dense<[0, 1, 2, 4, 5, 6]>\n\
                 graph @g(%x: f32[2, 3, 16], %cos: f32[8, 2], %sin: f32[8, 2]) -> (f32[2, 3, 16]) {MODEL} {{\n  \
                 %y = RotaryEmbedding(%x, %cos, %sin, $pos) {{num_heads = 2, rotary_embedding_dim = 4}} : \
                 f32[2, 3, 16]\n  return %y\n}}\n"
            ),
            "RotaryEmbedding",
        );
    }

    #[test]
    fn rotary_embedding_on_4d_input_with_batched_caches() {
        agrees(
            &format!(
                "graph @g(%x: f32[2, 2, 3, 8], %cos: f32[2, 3, 4], %sin: f32[2, 3, 4]) -> \
                 (f32[2, 2, 3, 8]) {MODEL} {{\n  \
                 %y = RotaryEmbedding(%x, %cos, %sin) : f32[2, 2, 3, 8]\n  return %y\n}}\n"
            ),
            "RotaryEmbedding",
        );
    }

    #[test]
    fn rms_normalization_over_the_last_two_axes() {
        agrees(
            &format!(
                "graph @g(%x: f32[2, 3, 4], %s: f32[3, 4]) -> (f32[2, 3, 4]) {MODEL} {{\n  \
                 %y = RMSNormalization(%x, %s) {{axis = -2, epsilon = 1e-3}} : f32[2, 3, 4]\n  \
                 return %y\n}}\n"
            ),
            "RMSNormalization",
        );
    }
}
