//! `fold-bn`: folds an inference-form `BatchNormalization` into the linear op before it.
//!
//! `BN(y) = (y - mean) * k + beta` per channel with `k = gamma / sqrt(var + eps)`. When `y` is
//! a Conv / ConvTranspose / Gemm / MatMul with a constant weight, `BN(op(x, w, b)) =
//! op(x, w * k, (b - mean) * k + beta)`, with `k` reshaped to broadcast along the weight's
//! output-channel axis (axis 0 for Conv, axis 1 for ConvTranspose per group, the output column
//! for Gemm/MatMul). Exact in real arithmetic; in floating point the folded weights and bias
//! differ from the unfolded computation by rounding only (a few ulp of each product).
//!
//! A BN after the sum of two Convs (`BN(Conv1 + Conv2)`, a residual shortcut's BN after its
//! `Add`) folds into both: the scale `k` into both weights (and the second bias), the shift
//! into the first bias.
//!
//! A Conv weight that is quantized per output channel keeps its quantized form so that
//! `fuse-quant` can still turn the Conv into an integer kernel:
//! - `DequantizeLinear(w_q, s, zp)` (axis 0, `w_q` a constant): `k * (w_q - zp) * s =
//!   (w_q - zp) * (s * k)`, so the weight becomes `DequantizeLinear(w_q, s * k, zp)`;
//! - `DequantizeLinear(QuantizeLinear(W, s, zp), s, zp)` (axis 0, fake quantization):
//!   `fq_{k s}(k W) = k fq_s(W)` holds when `k > 0` and `zp = 0` (rounding and saturation
//!   commute with a positive per-channel scale), so the weight becomes
//!   `DequantizeLinear(QuantizeLinear(W * k, s * k, 0), s * k, 0)`.
//!
//! Both forms require `k > 0` (scales stay positive), which a rule can only prove when `gamma`
//! and `var` are small constants (at most 64 elements, whose values the analysis keeps): every
//! `gamma > 0` and every `var + eps > 0`. Otherwise the plain rule folds into a float weight
//! (exact, but the quantized form is lost).

use egg::{Id, Subst};
use mmq_ir::{DType, Dim, Op, OpKind};

use super::*;

/// The epsilon of an inference-form BatchNormalization bound to `?abn` (training mode absent
/// or 0, per-channel `spatial`), or `None`.
fn bn_eps(eg: &EG, s: &Subst) -> Option<f32> {
    match op(eg, s, "?abn")? {
        Op::BatchNormalization {
            epsilon,
            training_mode,
            spatial,
            ..
        } if training_mode.unwrap_or(0) == 0 && spatial.unwrap_or(1) == 1 => {
            Some(epsilon.unwrap_or(1e-5))
        }
        _ => None,
    }
}

/// The float dtype shared by the BN operands and the weight `?w`, when every operand is a
/// compile-time constant and the weight's shape is known.
fn bn_operands_ok(eg: &EG, s: &Subst) -> bool {
    let Some(dt) = dtype_of(eg, s, "?w") else {
        return false;
    };
    bn_eps(eg, s).is_some()
        && dt.is_float()
        && shape_of(eg, s, "?w").is_some()
        && ["?w", "?g", "?be", "?m", "?v"]
            .iter()
            .all(|v| is_const(eg, s, v) && dtype_of(eg, s, v) == Some(dt))
}

/// `k > 0` is provable: `gamma` and `var` are constants (per-channel sized), every
/// `gamma > 0` and `var + eps > 0`.
fn k_positive(eg: &EG, s: &Subst) -> bool {
    bn_eps(eg, s)
        .is_some_and(|eps| all_above(eg, s, "?g", 0.0) && all_above(eg, s, "?v", -f64::from(eps)))
}

/// `k = gamma / sqrt(var + eps)` as constant-expression ops.
fn build_k(eg: &mut EG, s: &Subst) -> Option<Id> {
    let dt = dtype_of(eg, s, "?g")?;
    let eps = bn_eps(eg, s)?;
    let e = lit(eg, dt, vec![], &[f64::from(eps)])?;
    let (g, v) = (at(s, "?g"), at(s, "?v"));
    let ve = add_op(eg, Op::Add {}, &[Some(v), Some(e)], 1);
    let sd = add_op(eg, Op::Sqrt {}, &[Some(ve)], 1);
    Some(add_op(eg, Op::Div {}, &[Some(g), Some(sd)], 1))
}

/// The folded bias: `(b - mean) * k + beta`, or `beta - mean * k` without a bias.
fn build_bias(eg: &mut EG, s: &Subst, b: Option<Id>, k: Id) -> Id {
    let (m, be) = (at(s, "?m"), at(s, "?be"));
    match b {
        Some(b) => {
            let d = add_op(eg, Op::Sub {}, &[Some(b), Some(m)], 1);
            let dk = add_op(eg, Op::Mul {}, &[Some(d), Some(k)], 1);
            add_op(eg, Op::Add {}, &[Some(dk), Some(be)], 1)
        }
        None => {
            let mk = add_op(eg, Op::Mul {}, &[Some(m), Some(k)], 1);
            add_op(eg, Op::Sub {}, &[Some(be), Some(mk)], 1)
        }
    }
}

/// `Reshape(t, shape)` with a literal i64 shape.
fn reshape(eg: &mut EG, t: Id, shape: &[i64]) -> Option<Id> {
    let vals: Vec<f64> = shape.iter().map(|&d| d as f64).collect();
    let sh = lit(eg, DType::I64, vec![shape.len() as i64], &vals)?;
    Some(add_op(
        eg,
        Op::Reshape { allowzero: None },
        &[Some(t), Some(sh)],
        1,
    ))
}

/// `w * k` with `k` broadcast along `axis` of the rank-`rank` weight.
fn scale_axis(eg: &mut EG, w: Id, k: Id, rank: usize, axis: usize) -> Option<Id> {
    let shape: Vec<i64> = (0..rank).map(|i| if i == axis { -1 } else { 1 }).collect();
    let kr = reshape(eg, k, &shape)?;
    Some(add_op(eg, Op::Mul {}, &[Some(w), Some(kr)], 1))
}

/// The bias operand `?b` when present (an absent operand is `None`).
fn bias(eg: &EG, s: &Subst) -> Option<Id> {
    present(eg, s, "?b")
}

/// The operand bound to `v` when the match bound it and it is not an absent optional operand.
fn present(eg: &EG, s: &Subst, v: &str) -> Option<Id> {
    let b = *s.get(var(v))?;
    (!matches!(eg[b].data.konst, Konst::Absent)).then_some(b)
}
/// The known static dims of `?w`.
fn w_dims(eg: &EG, s: &Subst) -> Option<Vec<i64>> {
    shape_of(eg, s, "?w")?
        .iter()
        .map(|d| d.as_known())
        .collect()
}

/// A Conv weight quantized per output channel, as found in `?w`'s class.
enum QWeight {
    /// `DequantizeLinear(w_q, s, zp)` with a constant `w_q`.
    Int {
        q: Id,
        s: Id,
        zp: Option<Id>,
        dq: Op,
    },
    /// `DequantizeLinear(QuantizeLinear(W, s, zp), s, zp)` with a constant float `W`, zp 0.
    Fake {
        w: Id,
        qc: Id,
        s: Id,
        zp: Option<Id>,
        q: Box<Op>,
        dq: Op,
    },
}

fn quant_axis(op: &Op, rank: usize) -> Option<usize> {
    let (axis, block) = match op {
        Op::DequantizeLinear {
            axis, block_size, ..
        }
        | Op::QuantizeLinear {
            axis, block_size, ..
        } => (axis.unwrap_or(1), block_size.unwrap_or(0)),
        _ => return None,
    };
    let r = rank as i64;
    (block == 0 && (-r..r).contains(&axis)).then(|| axis.rem_euclid(r) as usize)
}

/// The per-output-channel quantized form of the Conv weight `?w` (rank `r`, `m` output
/// channels): scale of shape `[m]` on axis 0, zero point absent or a constant of the same
/// shape.
fn qweight(eg: &EG, s: &Subst) -> Option<QWeight> {
    let dims = w_dims(eg, s)?;
    let (ops, dq) = node_of(eg, at(s, "?w"), OpKind::DequantizeLinear)?;
    let (q, sc) = (*ops.first()?, *ops.get(1)?);
    let zp = ops
        .get(2)
        .copied()
        .filter(|&z| !matches!(eg[z].data.konst, Konst::Absent));
    let per_channel = quant_axis(dq, dims.len()) == Some(0)
        && eg[sc]
            .data
            .ty
            .as_ref()
            .and_then(|t| t.shape())
            .is_some_and(|sh| sh.len() == 1 && sh[0].as_known() == Some(dims[0]))
        && is_const_id(eg, sc)
        && zp.is_none_or(|z| is_const_id(eg, z));
    if !per_channel {
        return None;
    }
    let qty = eg[q].data.ty.as_ref().and_then(|t| t.dtype());
    if matches!(eg[q].data.konst, Konst::Const { .. }) && matches!(qty, Some(DType::I8 | DType::U8))
    {
        return Some(QWeight::Int {
            q,
            s: sc,
            zp,
            dq: dq.clone(),
        });
    }
    let (qops, qop) = node_of(eg, q, OpKind::QuantizeLinear)?;
    let same = qops.get(1) == Some(&sc)
        && qops
            .get(2)
            .copied()
            .filter(|&z| !matches!(eg[z].data.konst, Konst::Absent))
            == zp
        && quant_axis(qop, dims.len()) == Some(0);
    let zero = zp.is_none_or(|z| consts_of(eg, z).is_some_and(|v| v.iter().all(|&x| x == 0.0)));
    let w = *qops.first()?;
    (same && zero && matches!(eg[w].data.konst, Konst::Const { .. })).then(|| QWeight::Fake {
        w,
        qc: q,
        s: sc,
        zp,
        q: Box::new(qop.clone()),
        dq: dq.clone(),
    })
}

fn is_const_id(eg: &EG, id: Id) -> bool {
    eg[id].data.konst.is_const()
}

/// The weight of a Conv scaled per output channel by `k`: quantized forms kept when `k > 0`
/// is provable, else `w * k`.
fn conv_weight(eg: &mut EG, s: &Subst, k: Id, keep_quant: bool) -> Option<Id> {
    let rank = w_dims(eg, s)?.len();
    if keep_quant {
        let qw = qweight(eg, s)?;
        let ty_of = |eg: &EG, id: Id| eg[id].data.ty.clone();
        let w_ty = ty(eg, s, "?w").cloned()?;
        return Some(match qw {
            QWeight::Int { q, s: sc, zp, dq } => {
                let s_ty = ty_of(eg, sc)?;
                let sk = add_op(eg, Op::Mul {}, &[Some(sc), Some(k)], 1);
                set_ty(eg, sk, s_ty);
                let d = add_op(eg, dq, &[Some(q), Some(sk), zp], 1);
                set_ty(eg, d, w_ty);
                d
            }
            QWeight::Fake {
                w,
                qc,
                s: sc,
                zp,
                q,
                dq,
            } => {
                let (s_ty, q_ty) = (ty_of(eg, sc)?, ty_of(eg, qc)?);
                let wk = scale_axis(eg, w, k, rank, 0)?;
                set_ty(eg, wk, w_ty.clone());
                let sk = add_op(eg, Op::Mul {}, &[Some(sc), Some(k)], 1);
                set_ty(eg, sk, s_ty);
                let qn = add_op(eg, *q, &[Some(wk), Some(sk), zp], 1);
                set_ty(eg, qn, q_ty);
                let d = add_op(eg, dq, &[Some(qn), Some(sk), zp], 1);
                set_ty(eg, d, w_ty);
                d
            }
        });
    }
    scale_axis(eg, at(s, "?w"), k, rank, 0)
}

/// The quantized-weight form applies: the weight is quantized per output channel and `k > 0`.
fn keeps_quant(eg: &EG, s: &Subst) -> bool {
    k_positive(eg, s) && qweight(eg, s).is_some()
}

/// Folds into a Conv (`keep_quant`: the weight keeps its quantized form).
fn fold_conv(keep_quant: bool) -> impl Fn(&mut EG, Id, &Subst) -> Option<Id> + Send + Sync {
    move |eg, _, s| {
        if keeps_quant(eg, s) != keep_quant {
            return None;
        }
        let conv = op(eg, s, "?ac")?.clone();
        let k = build_k(eg, s)?;
        let w = conv_weight(eg, s, k, keep_quant)?;
        let b = bias(eg, s);
        let b = build_bias(eg, s, b, k);
        Some(add_op(eg, conv, &[Some(at(s, "?x")), Some(w), Some(b)], 1))
    }
}

/// Folds into a ConvTranspose: weight `[C_in, M/group, k...]`, output channel
/// `o = g * (M/group) + j` for weight row block `g` and column `j`.
fn fold_conv_transpose(eg: &mut EG, _root: Id, s: &Subst) -> Option<Id> {
    let conv = op(eg, s, "?ac")?.clone();
    let Op::ConvTranspose { group, .. } = &conv else {
        return None;
    };
    let group = group.unwrap_or(1);
    let dims = w_dims(eg, s)?;
    if group < 1 || dims.len() < 3 || dims[0] % group != 0 {
        return None;
    }
    let k = build_k(eg, s)?;
    let w = if group == 1 {
        scale_axis(eg, at(s, "?w"), k, dims.len(), 1)?
    } else {
        // [C_in, M/g, ...] -> [g, C_in/g, M/g, ...] * k[g, 1, M/g, 1...] -> back.
        let mut split = vec![group, dims[0] / group];
        split.extend(&dims[1..]);
        let wg = reshape(eg, at(s, "?w"), &split)?;
        let mut ks = vec![group, 1, dims[1]];
        ks.extend(std::iter::repeat_n(1, dims.len() - 2));
        let kr = reshape(eg, k, &ks)?;
        let m = add_op(eg, Op::Mul {}, &[Some(wg), Some(kr)], 1);
        reshape(eg, m, &dims)?
    };
    let b = bias(eg, s);
    let b = build_bias(eg, s, b, k);
    Some(add_op(eg, conv, &[Some(at(s, "?x")), Some(w), Some(b)], 1))
}

/// Folds into a Gemm (2-D constant `B`; the output column is the BN channel). A Gemm `beta`
/// other than 1 is folded into the new `C`, whose Gemm has `beta = 1`.
fn fold_gemm(eg: &mut EG, _root: Id, s: &Subst) -> Option<Id> {
    let Op::Gemm {
        alpha,
        beta,
        trans_a,
        trans_b,
    } = op(eg, s, "?ag")?.clone()
    else {
        return None;
    };
    if w_dims(eg, s)?.len() != 2 {
        return None;
    }
    let k = build_k(eg, s)?;
    let axis = if trans_b.unwrap_or(0) != 0 { 0 } else { 1 };
    let w = scale_axis(eg, at(s, "?w"), k, 2, axis)?;
    let c = match bias(eg, s) {
        Some(c) if beta.unwrap_or(1.0) != 1.0 => {
            let dt = dtype_of(eg, s, "?w")?;
            let bl = lit(eg, dt, vec![], &[f64::from(beta.unwrap_or(1.0))])?;
            Some(add_op(eg, Op::Mul {}, &[Some(c), Some(bl)], 1))
        }
        c => c,
    };
    let c = build_bias(eg, s, c, k);
    let g = Op::Gemm {
        alpha,
        beta: None,
        trans_a,
        trans_b,
    };
    Some(add_op(eg, g, &[Some(at(s, "?x")), Some(w), Some(c)], 1))
}

/// Folds into a 2-D MatMul, which becomes a Gemm with the folded bias as `C`.
fn fold_matmul(eg: &mut EG, _root: Id, s: &Subst) -> Option<Id> {
    let xr = shape_of(eg, s, "?x")?.len();
    if xr != 2 || w_dims(eg, s)?.len() != 2 {
        return None;
    }
    let k = build_k(eg, s)?;
    let w = scale_axis(eg, at(s, "?w"), k, 2, 1)?;
    let c = build_bias(eg, s, None, k);
    let g = Op::Gemm {
        alpha: None,
        beta: None,
        trans_a: None,
        trans_b: None,
    };
    Some(add_op(eg, g, &[Some(at(s, "?x")), Some(w), Some(c)], 1))
}

fn ok() -> Cond {
    when(bn_operands_ok)
}

/// `?c` is a constant of `?w`'s dtype that multiplies a Conv result (rank `rank`, `ch` output
/// channels) per channel without changing its shape: its dims are 1 except, in the channel
/// position, 1 or `ch` (`[1, C, 1, 1]`, `[C, 1, 1]`, `[1]`, a scalar).
fn channel_const(eg: &EG, s: &Subst) -> bool {
    let (Some(dims), Some(cs)) = (w_dims(eg, s), shape_of(eg, s, "?c")) else {
        return false;
    };
    let (rank, ch) = (dims.len(), dims[0]);
    let Some(cs) = cs.iter().map(Dim::as_known).collect::<Option<Vec<i64>>>() else {
        return false;
    };
    let channel_pos = (cs.len() + 1).checked_sub(rank);
    is_const(eg, s, "?c")
        && !matches!(eg[at(s, "?c")].data.konst, Konst::Absent)
        && dtype_of(eg, s, "?c") == dtype_of(eg, s, "?w")
        && dtype_of(eg, s, "?w").is_some_and(DType::is_float)
        && cs.len() <= rank
        && cs
            .iter()
            .enumerate()
            .all(|(i, &d)| d == 1 || (Some(i) == channel_pos && d == ch))
}

/// The Conv of a match as it is (operands `?x`, `?w`, optional `?b`) with weight `w` and
/// bias `b`.
fn rebuild_conv(eg: &mut EG, s: &Subst, w: Id, b: Option<Id>) -> Option<Id> {
    let conv = op(eg, s, "?ac")?.clone();
    if !matches!(conv, Op::Conv { .. }) {
        return None;
    }
    let mut inputs = vec![Some(at(s, "?x")), Some(w)];
    if b.is_some() {
        inputs.push(b);
    }
    Some(add_op(eg, conv, &inputs, 1))
}

/// Folds `Conv(x, w, b) · c` (`div`: `/ c`) with a per-channel constant `c` into the Conv:
/// `Conv(x, w · k, b · k)` with `k = c` (or `1 / c`) on the output-channel axis. A weight
/// quantized per output channel keeps its quantized form (`k` moves into its scale) when
/// `c > 0` is proven. Exact in real arithmetic; rounding only.
fn fold_scale(div: bool) -> impl Fn(&mut EG, Id, &Subst) -> Option<Id> + Send + Sync {
    move |eg, _, s| {
        let dt = dtype_of(eg, s, "?c")?;
        let flat = reshape(eg, at(s, "?c"), &[-1])?;
        let k = if div {
            let one = lit(eg, dt, vec![], &[1.0])?;
            add_op(eg, Op::Div {}, &[Some(one), Some(flat)], 1)
        } else {
            flat
        };
        let keep = all_above(eg, s, "?c", 0.0) && qweight(eg, s).is_some();
        let w = conv_weight(eg, s, k, keep)?;
        let b = bias(eg, s).map(|b| add_op(eg, Op::Mul {}, &[Some(b), Some(k)], 1));
        rebuild_conv(eg, s, w, b)
    }
}

/// Folds `Conv(x, w, b) + c` with a per-channel constant `c` into the bias:
/// `Conv(x, w, b + c)`. Exact in real arithmetic; one rounding.
fn fold_shift(eg: &mut EG, _root: Id, s: &Subst) -> Option<Id> {
    let ch = *w_dims(eg, s)?.first()?;
    let flat = reshape(eg, at(s, "?c"), &[-1])?;
    let b = match bias(eg, s) {
        Some(b) => add_op(eg, Op::Add {}, &[Some(b), Some(flat)], 1),
        // Without a bias the constant becomes it: it must hold every channel.
        None if shape_of(eg, s, "?c")?
            .iter()
            .filter_map(Dim::as_known)
            .product::<i64>()
            == ch =>
        {
            flat
        }
        None => return None,
    };
    rebuild_conv(eg, s, at(s, "?w"), Some(b))
}

/// The Conv bound to `?ac` reads no padding (`pads` all 0, `auto_pad` unset or `VALID`) and
/// has one group: a per-input-channel affine map before it folds into it exactly.
fn unpadded_dense_conv(eg: &EG, s: &Subst) -> bool {
    match op(eg, s, "?ac") {
        Some(Op::Conv {
            auto_pad,
            group,
            pads,
            ..
        }) => {
            matches!(auto_pad.as_deref(), None | Some("NOTSET" | "VALID"))
                && group.unwrap_or(1) == 1
                && pads.as_ref().is_none_or(|p| p.iter().all(|&x| x == 0))
        }
        _ => false,
    }
}

/// Folds an inference-form BatchNormalization *before* an unpadded Conv into it:
/// `Conv(BN(x), w, b) = Conv(x, w · k[c], b + Σ_{c,j} w[o, c, j] · t[c])` with
/// `k = gamma / sqrt(var + eps)` and `t = beta - mean · k` per input channel `c`. Exact in
/// real arithmetic (no padding: every tap reads a normalized input); rounding only.
fn fold_bn_before_conv(eg: &mut EG, _root: Id, s: &Subst) -> Option<Id> {
    let dims = w_dims(eg, s)?;
    if dims.len() < 3 {
        return None;
    }
    let (o, c) = (dims[0], dims[1]);
    let taps: i64 = dims[2..].iter().product();
    let dt = dtype_of(eg, s, "?w")?;
    let k = build_k(eg, s)?;
    let mut in_axis = vec![1, -1];
    in_axis.extend(std::iter::repeat_n(1, dims.len() - 2));
    let kr = reshape(eg, k, &in_axis)?;
    let w = add_op(eg, Op::Mul {}, &[Some(at(s, "?w")), Some(kr)], 1);
    // t = beta - mean * k, spread over the taps of each input channel: [c * taps].
    let mk = add_op(eg, Op::Mul {}, &[Some(at(s, "?m")), Some(k)], 1);
    let t = add_op(eg, Op::Sub {}, &[Some(at(s, "?be")), Some(mk)], 1);
    let tc = reshape(eg, t, &[c, 1])?;
    let ones = lit(
        eg,
        dt,
        vec![1, taps],
        &vec![1.0; usize::try_from(taps).ok()?],
    )?;
    let spread = add_op(eg, Op::Mul {}, &[Some(tc), Some(ones)], 1);
    let tv = reshape(eg, spread, &[c * taps])?;
    let w2 = reshape(eg, at(s, "?w"), &[o, c * taps])?;
    let shift = add_op(eg, Op::MatMul {}, &[Some(w2), Some(tv)], 1);
    let b = match bias(eg, s) {
        Some(b) => add_op(eg, Op::Add {}, &[Some(b), Some(shift)], 1),
        None => shift,
    };
    let conv = op(eg, s, "?ac")?.clone();
    Some(add_op(eg, conv, &[Some(at(s, "?x")), Some(w), Some(b)], 1))
}

/// The second Conv of a sum (`?x2`, `?w2`, optional `?b2`, `?ac2`) can take the BN's scale:
/// a Conv with a constant weight of `?w`'s float dtype and as many output channels.
fn second_conv_ok(eg: &EG, s: &Subst) -> bool {
    let dims = |v: &str| -> Option<Vec<i64>> {
        shape_of(eg, s, v)?.iter().map(|d| d.as_known()).collect()
    };
    let (Some(d1), Some(d2)) = (dims("?w"), dims("?w2")) else {
        return false;
    };
    matches!(op(eg, s, "?ac"), Some(Op::Conv { .. }))
        && matches!(op(eg, s, "?ac2"), Some(Op::Conv { .. }))
        && d2.len() >= 3
        && d1.first() == d2.first()
        && is_const(eg, s, "?w2")
        && dtype_of(eg, s, "?w2") == dtype_of(eg, s, "?w")
        && present(eg, s, "?b2").is_none_or(|b| {
            eg[b].data.konst.is_const()
                && eg[b].data.ty.as_ref().and_then(|t| t.dtype()) == dtype_of(eg, s, "?w")
        })
}

/// Folds a BatchNormalization after the sum of two Convs into both (the shortcut of a
/// residual block whose BN follows the `Add`): `BN(Conv1 + Conv2) = Conv(x1, w1 · k,
/// (b1 - mean) · k + beta) + Conv(x2, w2 · k, b2 · k)`. Exact in real arithmetic; rounding
/// only.
fn fold_conv_sum(eg: &mut EG, _root: Id, s: &Subst) -> Option<Id> {
    let (c1, c2, add) = (
        op(eg, s, "?ac")?.clone(),
        op(eg, s, "?ac2")?.clone(),
        op(eg, s, "?aa")?.clone(),
    );
    let rank = |eg: &EG, v: &str| shape_of(eg, s, v).map(|d| d.len());
    let (r1, r2) = (rank(eg, "?w")?, rank(eg, "?w2")?);
    let k = build_k(eg, s)?;
    let w1 = scale_axis(eg, at(s, "?w"), k, r1, 0)?;
    let w2 = scale_axis(eg, at(s, "?w2"), k, r2, 0)?;
    let b1 = bias(eg, s);
    let b1 = build_bias(eg, s, b1, k);
    let b2 = present(eg, s, "?b2").map(|b| add_op(eg, Op::Mul {}, &[Some(b), Some(k)], 1));
    let first = add_op(eg, c1, &[Some(at(s, "?x")), Some(w1), Some(b1)], 1);
    let mut inputs = vec![Some(at(s, "?x2")), Some(w2)];
    if b2.is_some() {
        inputs.push(b2);
    }
    let second = add_op(eg, c2, &inputs, 1);
    Some(add_op(eg, add, &[Some(first), Some(second)], 1))
}

#[rustfmt::skip]
pub(crate) fn rules() -> Vec<Rw> {
    const BN: &str = "?g ?be ?m ?v ?abn)";
    let p = |inner: &str| format!("(BatchNormalization {inner} {BN}");
    vec![
        // BN(Conv(x, w, b)) -> Conv(x, w*k, (b-mean)*k+beta); float weight.
        rule("fold-bn-into-conv",               &p("(Conv ?x ?w ?b ?ac)"),          vec![ok()], fold_conv(false)),
        rule("fold-bn-into-conv-nobias",        &p("(Conv ?x ?w ?ac)"),             vec![ok()], fold_conv(false)),
        // The same, keeping a per-output-channel quantized weight (k > 0 proven).
        rule("fold-bn-into-conv-qweight",       &p("(Conv ?x ?w ?b ?ac)"),          vec![ok()], fold_conv(true)),
        rule("fold-bn-into-conv-qweight-nobias", &p("(Conv ?x ?w ?ac)"),            vec![ok()], fold_conv(true)),
        rule("fold-bn-into-conv-transpose",     &p("(ConvTranspose ?x ?w ?b ?ac)"), vec![ok()], fold_conv_transpose),
        rule("fold-bn-into-conv-transpose-nobias", &p("(ConvTranspose ?x ?w ?ac)"), vec![ok()], fold_conv_transpose),
        rule("fold-bn-into-gemm",               &p("(Gemm ?x ?w ?b ?ag)"),          vec![ok()], fold_gemm),
        rule("fold-bn-into-gemm-noc",           &p("(Gemm ?x ?w ?ag)"),             vec![ok()], fold_gemm),
        rule("fold-bn-into-matmul",             &p("(MatMul ?x ?w ?am)"),           vec![ok()], fold_matmul),
        // BN(Conv1 + Conv2) -> Conv1' + Conv2': the BN's scale into both, its shift into one.
        rule("fold-bn-into-conv-sum",
             &p("(Add (Conv ?x ?w ?b ?ac) (Conv ?x2 ?w2 ?b2 ?ac2) ?aa)"), vec![ok(), when(second_conv_ok)], fold_conv_sum),
        rule("fold-bn-into-conv-sum-nobias",
             &p("(Add (Conv ?x ?w ?ac) (Conv ?x2 ?w2 ?ac2) ?aa)"),         vec![ok(), when(second_conv_ok)], fold_conv_sum),
        // BN(x) before an unpadded dense Conv folds into that Conv's weight and bias.
        rule("fold-bn-before-conv",        &format!("(Conv (BatchNormalization ?x {BN} ?w ?b ?ac)"),
             vec![ok(), when(unpadded_dense_conv)], fold_bn_before_conv),
        rule("fold-bn-before-conv-nobias", &format!("(Conv (BatchNormalization ?x {BN} ?w ?ac)"),
             vec![ok(), when(unpadded_dense_conv)], fold_bn_before_conv),
        // A per-channel constant scale or shift after a Conv (the `conv / (gamma/sigma)` and
        // `+ bias` of PyTorch's QAT Conv-BN export) folds into its weight or bias.
        rule("fold-div-into-conv",         "(Div (Conv ?x ?w ?b ?ac) ?c ?ad)", vec![when(channel_const)], fold_scale(true)),
        rule("fold-div-into-conv-nobias",  "(Div (Conv ?x ?w ?ac) ?c ?ad)",    vec![when(channel_const)], fold_scale(true)),
        rule("fold-mul-into-conv",         "(Mul (Conv ?x ?w ?b ?ac) ?c ?am)", vec![when(channel_const)], fold_scale(false)),
        rule("fold-mul-into-conv-nobias",  "(Mul (Conv ?x ?w ?ac) ?c ?am)",    vec![when(channel_const)], fold_scale(false)),
        rule("fold-add-into-conv",         "(Add (Conv ?x ?w ?b ?ac) ?c ?aa)", vec![when(channel_const)], fold_shift),
        rule("fold-add-into-conv-nobias",  "(Add (Conv ?x ?w ?ac) ?c ?aa)",    vec![when(channel_const)], fold_shift),
    ]
}
