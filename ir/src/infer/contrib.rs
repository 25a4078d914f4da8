//! Inference rules for the ops of other domains that mmq emits and ONNX Runtime runs: the
//! `com.microsoft` contrib ops and `SimplifiedLayerNormalization` (which ONNX Runtime registers in
//! the default domain), and mmq's TensorRT plugins (domain `mmq.trt`); `ops::infer_op` picks
//! them per typed op. Custom ops infer nothing; their declared types are kept.

use super::Cx;
use super::dims::product_div;
use super::ops::{same, shape_of, t};
use crate::DType;
use crate::dim::Dim;
use crate::module::NodeData;
use crate::op::Op;
use crate::types::{TensorType, Type};

/// Operand `i`'s type with its last dim replaced by `last`.
fn with_last(cx: &Cx, i: usize, last: Dim) -> Type {
    let Some(tt) = cx.tt(i) else {
        return Type::Unknown;
    };
    let shape = tt.shape.as_ref().map(|s| {
        let mut s = s.clone();
        if let Some(l) = s.last_mut() {
            *l = last;
        }
        s
    });
    Type::Tensor(TensorType {
        dtype: tt.dtype,
        shape,
    })
}

/// The result types of the standard op `op_type` with the node's attributes less `drop` (the
/// fused activation's), for a contrib op that computes it and then something elementwise.
pub(super) fn as_standard(
    cx: &Cx,
    op_type: &str,
    drop: &[&str],
    infer: fn(&Cx) -> Vec<Type>,
) -> Vec<Type> {
    let attrs = cx
        .node
        .op
        .attrs()
        .into_iter()
        .filter(|(n, _)| !drop.contains(n))
        .map(|(n, a)| (n.to_owned(), a))
        .collect();
    let op = Op::from_parts("", op_type, attrs);
    if op.is_custom() {
        return Vec::new();
    }
    let node = NodeData {
        op,
        ..cx.node.clone()
    };
    infer(&Cx {
        m: cx.m,
        sv: cx.sv,
        opset: cx.opset,
        node: &node,
        given: cx.given,
    })
}

/// The last two dims of a shape swapped.
fn transposed(s: &[Dim]) -> Option<Vec<Dim>> {
    let mut s = s.to_vec();
    let r = s.len();
    (r >= 2).then(|| {
        s.swap(r - 1, r - 2);
        s
    })
}

/// `MmqDynamicQuantize`: int8 codes of the input's shape, and f32 scales with the last dim
/// `ceil(last / block)` (one per row for block 0).
pub(super) fn dynamic_quantize(cx: &Cx, block: i64) -> Vec<Type> {
    let last = match cx.shape(0).and_then(|s| s.last()) {
        Some(d) if block > 0 => d.ceil_div(&Dim::known(block)),
        _ => Dim::known(1),
    };
    let scale = match with_last(cx, 0, last) {
        Type::Tensor(t) => Type::Tensor(TensorType {
            dtype: Some(DType::F32),
            shape: t.shape,
        }),
        other => other,
    };
    vec![t(Some(DType::I8), shape_of(cx, 0)), scale]
}

/// `MatMulNBits` (and its plugin): A `[..., K]` times the packed `[N, K]` weight.
pub(super) fn matmul_nbits(cx: &Cx, n: Option<i64>) -> Vec<Type> {
    n.map_or_else(Vec::new, |n| vec![with_last(cx, 0, Dim::known(n))])
}

/// `FusedMatMul`: `MatMul` of the operands with their last two axes swapped where asked
/// (nothing inferred for the batch transposes).
pub(super) fn fused_matmul(cx: &Cx, trans: [Option<i64>; 4]) -> Vec<Type> {
    let on = |t: Option<i64>| t.unwrap_or(0) != 0;
    if on(trans[2]) || on(trans[3]) {
        return Vec::new();
    }
    let pick = |i: usize, t: Option<i64>| {
        let s = cx.shape(i)?;
        if on(t) {
            transposed(s)
        } else {
            Some(s.to_vec())
        }
    };
    let a = pick(0, trans[0]);
    let b = pick(1, trans[1]);
    let shape = super::ops::matmul_shape(a.as_deref(), b.as_deref());
    vec![Type::Tensor(TensorType {
        dtype: cx.dtype(0),
        shape,
    })]
}

/// `com.microsoft.Attention`: input `[B, S, D]` projected by weights `[D, 3 * D']` (or
/// `qkv_hidden_sizes`).
pub(super) fn packed_attention(cx: &Cx, qkv_hidden_sizes: Option<&[i64]>) -> Vec<Type> {
    let v = qkv_hidden_sizes
        .and_then(|h| h.get(2).copied())
        .map(Dim::known)
        .or_else(|| {
            let w = cx.shape(1)?;
            Some(product_div(&[w.last()?.clone()], &[Dim::known(3)]))
        });
    v.map_or_else(Vec::new, |v| vec![with_last(cx, 0, v)])
}

/// `MultiHeadAttention`: the query's type with the value hidden size last (value `[B, L, Dv]`
/// or `[B, N, L, H]`; unknown for packed inputs).
pub(super) fn mha_output(cx: &Cx) -> Type {
    if cx.rank(0) != Some(3) {
        return Type::Unknown;
    }
    let dv = match cx.shape(2) {
        Some([_, _, dv]) => Some(dv.clone()),
        Some([_, n, _, h]) => Some(n.mul(h)),
        _ => None,
    };
    dv.map_or(Type::Unknown, |dv| with_last(cx, 0, dv))
}

/// `GroupQueryAttention`: `[B, S, num_heads * head_size]`, from the query (`[B, S, D]`, or the
/// packed `[B, S, (N + 2 kvN) H]` when no key is given).
pub(super) fn gqa_output(cx: &Cx, num_heads: Option<i64>, kv_num_heads: Option<i64>) -> Type {
    let (Some(n), Some(d)) = (num_heads, cx.shape(0).and_then(|s| s.get(2))) else {
        return Type::Unknown;
    };
    if cx.input(1).is_some() {
        return same(cx, 0);
    }
    let Some(kv) = kv_num_heads else {
        return Type::Unknown;
    };
    let h = product_div(std::slice::from_ref(d), &[Dim::known(n + 2 * kv)]);
    with_last(cx, 0, h.mul(&Dim::known(n)))
}
