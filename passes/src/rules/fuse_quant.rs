//! `fuse-quant`: quantized convolutions from fake-quantized float chains, and Q/DQ clean-up.
//!
//! `QuantizeLinear(Relu?(Conv(DequantizeLinear(x_q), DequantizeLinear(w_q), b)), y_s, y_zp)`
//! becomes the standard `QLinearConv(x_q, x_s, x_zp, w_q, w_s, w_zp, y_s, y_zp, b_q)` with
//! `b_q = int32(round(b / (x_s * w_s)))` built as constant-expression ops. With `fold-bn` in
//! the same or an earlier run, Conv→BatchNormalization→Relu→FakeQuant chains take this form once
//! the BN is folded (the weight keeps its per-channel quantized form).
//!
//! **Bound.** The integer kernel accumulates `Σ (x_q - x_zp)(w_q - w_zp) + b_q` exactly and
//! requantizes once; the float chain computes the same sum in float plus `b`. The two
//! pre-rounding values differ by the bias rounding (at most `x_s * w_s / 2`) and float
//! accumulation error, so when `x_s * w_s` is below `y_s` (as in every calibrated model: the
//! product scale is orders of magnitude finer than the output scale) the quantized results
//! differ by at most one step: `|Δ| ≤ y_s` after dequantization.
//!
//! **Relu.** Absorbed exactly when the output zero point is the quantized minimum (u8 0, i8
//! -128): then saturation clamps every negative value to the zero point, which is what
//! quantizing `Relu`'s 0 gives. Otherwise no fusion.
//!
//! Conditions: `x` and `y` share the 8-bit dtype (what ONNX Runtime's CPU kernel runs); `x_s`,
//! `x_zp`, `y_s`, `y_zp` are per-tensor constants; the weight is a constant expression of 8-bit
//! integers quantized per tensor or per output channel (axis 0) with a constant zero point.

use egg::{Id, Subst};
use mmq_ir::{DType, Op};

use super::*;

/// A per-tensor (scalar or one-element) compile-time constant.
fn scalar_const(eg: &EG, s: &Subst, v: &str) -> bool {
    is_const(eg, s, v)
        && !matches!(eg[at(s, v)].data.konst, Konst::Absent)
        && shape_of(eg, s, v).is_some_and(|sh| sh.iter().all(|d| d.as_known() == Some(1)))
}

fn is_8bit(d: Option<DType>) -> bool {
    matches!(d, Some(DType::U8 | DType::I8))
}

/// The quantized minimum of an 8-bit dtype.
fn qmin(d: DType) -> f64 {
    if d == DType::I8 { -128.0 } else { 0.0 }
}

/// A `QuantizeLinear` / `DequantizeLinear` bound to `v` is plain per-tensor or per-axis (no
/// blocks, no output dtype override).
fn plain_q(eg: &EG, s: &Subst, v: &str) -> bool {
    match op(eg, s, v) {
        Some(Op::QuantizeLinear {
            block_size,
            output_dtype,
            saturate,
            ..
        }) => {
            block_size.unwrap_or(0) == 0
                && output_dtype.unwrap_or(0) == 0
                && saturate.unwrap_or(1) == 1
        }
        Some(Op::DequantizeLinear {
            block_size,
            output_dtype,
            ..
        }) => block_size.unwrap_or(0) == 0 && output_dtype.unwrap_or(0) == 0,
        _ => false,
    }
}

/// The conditions of a quantized Conv (see the module documentation).
fn qconv_ok(eg: &EG, s: &Subst) -> bool {
    let xd = dtype_of(eg, s, "?xq");
    let (Some(xdt), Some(wdt)) = (xd, dtype_of(eg, s, "?wq")) else {
        return false;
    };
    let w_rank = shape_of(eg, s, "?wq").map_or(0, |sh| sh.len());
    let w_axis = match op(eg, s, "?adw") {
        Some(Op::DequantizeLinear { axis, .. }) => {
            axis.unwrap_or(1).rem_euclid(w_rank.max(1) as i64)
        }
        _ => return false,
    };
    let ws_shape = shape_of(eg, s, "?ws");
    let w_per_channel = ws_shape.as_ref().is_some_and(|sh| sh.len() == 1) && w_axis == 0;
    let w_per_tensor = scalar_const(eg, s, "?ws");
    is_8bit(xd)
        && is_8bit(Some(wdt))
        && dtype_of(eg, s, "?yz") == Some(xdt)
        && dtype_of(eg, s, "?xz") == Some(xdt)
        && dtype_of(eg, s, "?wz") == Some(wdt)
        && ["?xs", "?xz", "?ys", "?yz"]
            .iter()
            .all(|v| scalar_const(eg, s, v))
        && is_const(eg, s, "?wq")
        && is_const(eg, s, "?ws")
        && is_const(eg, s, "?wz")
        && (w_per_channel || w_per_tensor)
        && ["?adx", "?adw", "?aq"].iter().all(|v| plain_q(eg, s, v))
        && matches!(op(eg, s, "?ac"), Some(Op::Conv { .. }))
}

/// The Relu is absorbed: the output zero point is the quantized minimum.
fn relu_absorbed(eg: &EG, s: &Subst) -> bool {
    dtype_of(eg, s, "?yz").is_some_and(|d| all_eq(eg, s, "?yz", qmin(d)))
}

/// Builds the `QLinearConv`.
fn qlinear_conv(eg: &mut EG, _root: Id, s: &Subst) -> Option<Id> {
    let Op::Conv {
        auto_pad,
        dilations,
        group,
        kernel_shape,
        pads,
        strides,
    } = op(eg, s, "?ac")?.clone()
    else {
        return None;
    };
    let b = s
        .get(var("?b"))
        .copied()
        .filter(|&b| !matches!(eg[b].data.konst, Konst::Absent));
    let bq = match b {
        Some(b) => {
            if !eg[b].data.konst.is_const() {
                return None;
            }
            let prod = add_op(eg, Op::Mul {}, &[Some(at(s, "?xs")), Some(at(s, "?ws"))], 1);
            let d = add_op(eg, Op::Div {}, &[Some(b), Some(prod)], 1);
            let r = add_op(eg, Op::Round {}, &[Some(d)], 1);
            let cast = Op::Cast {
                round_mode: None,
                saturate: None,
                to: Some(DType::I32.onnx_code() as i64),
            };
            Some(add_op(eg, cast, &[Some(r)], 1))
        }
        None => None,
    };
    let q = Op::QLinearConv {
        auto_pad,
        dilations,
        group,
        kernel_shape,
        pads,
        strides,
    };
    let ins = ["?xq", "?xs", "?xz", "?wq", "?ws", "?wz", "?ys", "?yz"].map(|v| Some(at(s, v)));
    let mut ins = ins.to_vec();
    if bq.is_some() {
        ins.push(bq);
    }
    Some(add_op(eg, q, &ins, 1))
}

/// `Q(DQ(q, s, zp), s, zp) -> q`: same scale and zero point classes, same axis, same dtype.
/// Exact: `(q - zp) * s / s` is within an ulp of the integer `q - zp`, which rounds back.
fn qdq_elim(eg: &mut EG, root: Id, s: &Subst) -> Option<Id> {
    let rank = shape_of(eg, s, "?q")?.len() as i64;
    let axis = |v: &str| match op(eg, s, v) {
        Some(Op::QuantizeLinear { axis, .. } | Op::DequantizeLinear { axis, .. }) => {
            Some(axis.unwrap_or(1).rem_euclid(rank.max(1)))
        }
        _ => None,
    };
    let per_tensor = scalar_const(eg, s, "?s");
    let same_axis = per_tensor || (axis("?ad").is_some() && axis("?ad") == axis("?aq"));
    let root_dt = eg[root].data.ty.as_ref().and_then(|t| t.dtype());
    (same_axis
        && plain_q(eg, s, "?ad")
        && plain_q(eg, s, "?aq")
        && root_dt.is_some()
        && root_dt == dtype_of(eg, s, "?q"))
    .then(|| at(s, "?q"))
}

/// `move(DQ(q, s, zp)) -> DQ(move(q), s, zp)` for a per-tensor DQ (and, for MaxPool, a
/// positive scale: dequantization is then increasing, so it commutes with max; padding never
/// wins a max). Reshape, Flatten and Transpose only move elements: exact for any per-tensor
/// scale.
fn push_dq(positive: bool) -> impl Fn(&mut EG, Id, &Subst) -> Option<Id> + Send + Sync {
    move |eg, root, s| {
        if !scalar_const(eg, s, "?s") || !scalar_const(eg, s, "?z") || !plain_q(eg, s, "?ad") {
            return None;
        }
        if positive && !consts(eg, s, "?s").is_some_and(|v| v.iter().all(|&x| x > 0.0)) {
            return None;
        }
        if !is_8bit(dtype_of(eg, s, "?q")) {
            return None;
        }
        let mv = op(eg, s, "?am")?.clone();
        let mut ins = vec![Some(at(s, "?q"))];
        if let Some(&sh) = s.get(var("?shape")) {
            ins.push(Some(sh));
        }
        let dims = eg[root].data.ty.as_ref()?.shape()?.to_vec();
        let qdt = dtype_of(eg, s, "?q")?;
        let moved = add_op(eg, mv, &ins, 1);
        set_ty(eg, moved, mmq_ir::Type::tensor(qdt, dims));
        let dq = op(eg, s, "?ad")?.clone();
        Some(add_op(
            eg,
            dq,
            &[Some(moved), Some(at(s, "?s")), Some(at(s, "?z"))],
            1,
        ))
    }
}

#[rustfmt::skip]
pub(crate) fn rules() -> Vec<Rw> {
    const X: &str = "(DequantizeLinear ?xq ?xs ?xz ?adx)";
    const W: &str = "(DequantizeLinear ?wq ?ws ?wz ?adw)";
    const DQ: &str = "(DequantizeLinear ?q ?s ?z ?ad)";
    let q = |inner: String| format!("(QuantizeLinear {inner} ?ys ?yz ?aq)");
    vec![
        rule("fuse-quant-conv-relu",        &q(format!("(Relu (Conv {X} {W} ?b ?ac) ?ar)")),
             vec![when(qconv_ok), when(relu_absorbed)], qlinear_conv),
        rule("fuse-quant-conv-relu-nobias", &q(format!("(Relu (Conv {X} {W} ?ac) ?ar)")),
             vec![when(qconv_ok), when(relu_absorbed)], qlinear_conv),
        rule("fuse-quant-conv",             &q(format!("(Conv {X} {W} ?b ?ac)")),
             vec![when(qconv_ok)], qlinear_conv),
        rule("fuse-quant-conv-nobias",      &q(format!("(Conv {X} {W} ?ac)")),
             vec![when(qconv_ok)], qlinear_conv),
        rule("qdq-elim",                    "(QuantizeLinear (DequantizeLinear ?q ?s ?z ?ad) ?s ?z ?aq)",
             vec![], qdq_elim),
        rule("push-dq-maxpool",             &format!("(MaxPool {DQ} ?am)"),          vec![], push_dq(true)),
        rule("push-dq-reshape",             &format!("(Reshape {DQ} ?shape ?am)"),   vec![], push_dq(false)),
        rule("push-dq-flatten",             &format!("(Flatten {DQ} ?am)"),          vec![], push_dq(false)),
        rule("push-dq-transpose",           &format!("(Transpose {DQ} ?am)"),        vec![], push_dq(false)),
    ]
}
