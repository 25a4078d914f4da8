//! Inference rules for the ops of other domains that mmq emits and ONNX Runtime runs: the
//! `com.microsoft` contrib ops and `SimplifiedLayerNormalization` (which ONNX Runtime registers in
//! the default domain), and mmq's TensorRT plugins (domain `mmq.trt`). Other custom ops infer
//! nothing; their declared types are kept.

use super::Cx;
use super::dims::product_div;
use crate::attr::Attr;
use crate::dim::Dim;
use crate::module::NodeData;
use crate::op::{CustomOp, Op};
use crate::types::{TensorType, Type};

fn same(cx: &Cx, i: usize) -> Type {
    cx.tt(i)
        .map_or(Type::Unknown, |tt| Type::Tensor(tt.clone()))
}

fn int(c: &CustomOp, name: &str) -> Option<i64> {
    c.attrs.iter().find_map(|(n, a)| match a {
        Attr::Int(v) if n == name => Some(*v),
        _ => None,
    })
}

fn ints(c: &CustomOp, name: &str) -> Option<Vec<i64>> {
    c.attrs.iter().find_map(|(n, a)| match a {
        Attr::Ints(v) if n == name => Some(v.clone()),
        _ => None,
    })
}

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

/// The result types of the standard op `op_type` with `c`'s attributes less `drop` (the fused
/// activation's), for a contrib op that computes it and then something elementwise.
fn as_standard(
    cx: &Cx,
    c: &CustomOp,
    op_type: &str,
    drop: &[&str],
    infer: fn(&Cx) -> Vec<Type>,
) -> Vec<Type> {
    let attrs = c
        .attrs
        .iter()
        .filter(|(n, _)| !drop.contains(&n.as_str()))
        .cloned()
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

/// Result types of `c`, or nothing when `c` is not one of the ops modeled here.
pub(super) fn infer(cx: &Cx, c: &CustomOp, standard: fn(&Cx) -> Vec<Type>) -> Vec<Type> {
    match (c.domain.as_str(), c.op_type.as_str()) {
        ("" | "ai.onnx", "SimplifiedLayerNormalization") => vec![same(cx, 0)],
        ("com.microsoft", op) => microsoft(cx, c, op, standard),
        ("mmq.trt", op) => plugin(cx, c, op),
        _ => Vec::new(),
    }
}

/// mmq's TensorRT plugins (`mmq_kernels::plugin`).
fn plugin(cx: &Cx, c: &CustomOp, op: &str) -> Vec<Type> {
    let as_type = |i: usize, dtype| {
        Type::Tensor(TensorType {
            dtype,
            shape: cx.shape(i).map(<[Dim]>::to_vec),
        })
    };
    match op {
        "MmqQuantize" => vec![as_type(0, Some(crate::DType::I8))],
        "MmqDequantize" => vec![as_type(0, cx.dtype(1))],
        "MmqDynamicQuantize" => {
            let block = int(c, "block_size").unwrap_or(0);
            let last = match cx.shape(0).and_then(|s| s.last()) {
                Some(d) if block > 0 => d.ceil_div(&Dim::known(block)),
                _ => Dim::known(1),
            };
            let scale = match with_last(cx, 0, last) {
                Type::Tensor(t) => Type::Tensor(TensorType {
                    dtype: Some(crate::DType::F32),
                    shape: t.shape,
                }),
                other => other,
            };
            vec![as_type(0, Some(crate::DType::I8)), scale]
        }
        "MmqMatMulNBits" => match int(c, "N") {
            Some(n) => vec![with_last(cx, 0, Dim::known(n))],
            None => Vec::new(),
        },
        _ => Vec::new(),
    }
}

fn microsoft(cx: &Cx, c: &CustomOp, op: &str, standard: fn(&Cx) -> Vec<Type>) -> Vec<Type> {
    const ACTIVATION: &[&str] = &["activation", "activation_params"];
    match op {
        "Gelu" | "FastGelu" | "BiasGelu" | "QuickGelu" | "RotaryEmbedding" => vec![same(cx, 0)],
        // Output, then mean and inverse standard deviation (not typed here), then the sum.
        "SkipLayerNormalization" | "SkipSimplifiedLayerNormalization" => {
            vec![same(cx, 0), Type::Unknown, Type::Unknown, same(cx, 0)]
        }
        "FusedConv" => as_standard(cx, c, "Conv", ACTIVATION, standard),
        "FusedGemm" => as_standard(cx, c, "Gemm", ACTIVATION, standard),
        "FusedMatMul" => {
            if int(c, "transBatchA").unwrap_or(0) != 0 || int(c, "transBatchB").unwrap_or(0) != 0 {
                return Vec::new();
            }
            let pick = |i: usize, trans: &str| {
                let s = cx.shape(i)?;
                if int(c, trans).unwrap_or(0) != 0 {
                    transposed(s)
                } else {
                    Some(s.to_vec())
                }
            };
            let a = pick(0, "transA");
            let b = pick(1, "transB");
            let shape = super::ops::matmul_shape(a.as_deref(), b.as_deref());
            vec![Type::Tensor(TensorType {
                dtype: cx.dtype(0),
                shape,
            })]
        }
        // A [..., K] times the packed [N, K] weight.
        "MatMulNBits" => match int(c, "N") {
            Some(n) => vec![with_last(cx, 0, Dim::known(n))],
            None => Vec::new(),
        },
        "MultiHeadAttention" => vec![mha_output(cx)],
        "GroupQueryAttention" => vec![gqa_output(cx, c)],
        // Input [B, S, D] projected by weights [D, 3 * D'] (or `qkv_hidden_sizes`).
        "Attention" => {
            let v = ints(c, "qkv_hidden_sizes")
                .and_then(|h| h.get(2).copied())
                .map(Dim::known)
                .or_else(|| {
                    let w = cx.shape(1)?;
                    Some(product_div(&[w.last()?.clone()], &[Dim::known(3)]))
                });
            match v {
                Some(v) => vec![with_last(cx, 0, v)],
                None => Vec::new(),
            }
        }
        _ => Vec::new(),
    }
}

/// `MultiHeadAttention`: the query's type with the value hidden size last (value `[B, L, Dv]`
/// or `[B, N, L, H]`; unknown for packed inputs).
fn mha_output(cx: &Cx) -> Type {
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
fn gqa_output(cx: &Cx, c: &CustomOp) -> Type {
    let (Some(n), Some(d)) = (int(c, "num_heads"), cx.shape(0).and_then(|s| s.get(2))) else {
        return Type::Unknown;
    };
    if cx.input(1).is_some() {
        return same(cx, 0);
    }
    let Some(kv) = int(c, "kv_num_heads") else {
        return Type::Unknown;
    };
    let h = product_div(std::slice::from_ref(d), &[Dim::known(n + 2 * kv)]);
    with_last(cx, 0, h.mul(&Dim::known(n)))
}
