//! `transformer` / rotary position embedding: the `rotate_half` form exporters write,
//! `x · cos + rotate_half(x) · sin` with `rotate_half(x) = Concat(-x[..., H/2:], x[..., :H/2])`
//! and `cos`, `sin` the `[B, 1, S, H]` unsqueezed `Cos`/`Sin` of `Concat(f, f)` (the angles
//! `f` `[B, S, H/2]` computed from the position ids), becomes the standard (opset-23)
//! `RotaryEmbedding(x, Cos(f), Sin(f))` on the `[B, N, S, H]` heads: the caches given per
//! position, no position ids. ONNX Runtime target only (the graph's opset is raised to 23 where
//! the rewritten graph uses it, as for the grouped-query `Attention`).

use egg::{Id, Subst};
use mmq_ir::{DType, Dim, Op, OpKind, Type};

use super::*;

/// `(Slice ?x ?st ?en ?ax [?sp] ?a)` bound under `name`: the 4- and 5-operand spellings.
fn slice(name: &str) -> [String; 2] {
    [
        format!("(Slice ?x ?st{name} ?en{name} ?ax{name} ?a{name})"),
        format!("(Slice ?x ?st{name} ?en{name} ?ax{name} ?sp{name} ?a{name})"),
    ]
}

fn patterns() -> Vec<String> {
    let mut out = Vec::new();
    for hi in slice("h") {
        for lo in slice("l") {
            out.push(format!(
                "(Add (Mul ?x (Unsqueeze (Cos ?e ?ac) ?u1 ?au1) ?m1) \
                 (Mul (Concat (Neg {hi} ?an) {lo} ?acat) (Unsqueeze (Sin ?e ?as) ?u2 ?au2) ?m2) ?aa)"
            ));
        }
    }
    out
}

/// One-element integer constant `v` (or `None`).
fn one(eg: &EG, s: &Subst, v: &str) -> Option<i64> {
    match bound(s, v).and_then(|id| consts_of(eg, id)) {
        Some([x]) => Some(*x as i64),
        _ => None,
    }
}

/// The slice named `name` takes `[from, to)` of the last axis (of rank 4, length `len`) with
/// step 1; an end at or past the axis's length takes the rest of it.
fn takes(eg: &EG, s: &Subst, name: &str, (from, to): (i64, i64), len: i64) -> bool {
    let axis_ok = matches!(one(eg, s, &format!("?ax{name}")), Some(-1 | 3));
    let step = format!("?sp{name}");
    let step_ok = bound(s, &step).is_none() || one(eg, s, &step) == Some(1);
    let end_ok = match one(eg, s, &format!("?en{name}")) {
        Some(e) if to == len => e >= len,
        Some(e) => e == to,
        None => false,
    };
    axis_ok && step_ok && end_ok && one(eg, s, &format!("?st{name}")) == Some(from)
}

/// `Unsqueeze(·, [1])` bound under `u`/`a` (the axes as operand or attribute).
fn unsqueezed_at_1(eg: &EG, s: &Subst, u: &str, a: &str) -> bool {
    match op(eg, s, a) {
        Some(Op::Unsqueeze { axes: Some(ax) }) => ax == &[1],
        Some(Op::Unsqueeze { axes: None }) => {
            matches!(bound(s, u).and_then(|id| consts_of(eg, id)), Some([x]) if *x == 1.0)
        }
        _ => false,
    }
}

/// The angles `f` (`[B, S, H/2]`) when `e` is `Concat(f, f)` along its last axis.
fn angles(eg: &EG, e: Id, half: i64) -> Option<Id> {
    nodes_of(eg, e, OpKind::Concat).find_map(|(ops, a)| {
        let last = matches!(attrs_op(eg, a)?, Op::Concat { axis: Some(-1 | 2) });
        let f = *ops.first()?;
        let d = eg[f].data.ty.as_ref()?.shape()?;
        (last && ops.len() == 2 && ops[1] == f && d.len() == 3 && d[2].as_known() == Some(half))
            .then_some(f)
    })
}

/// Builds `RotaryEmbedding(x, Cos(f), Sin(f))` (see the module docs).
fn build(eg: &mut EG, root: Id, s: &Subst) -> Option<Id> {
    if eg.analysis.max_opset < crate::egraph::OPSET_FORMS {
        return None;
    }
    let t = ty(eg, s, "?x")?.clone();
    let dtype = t.dtype()?;
    let [b, _, sq, h] = <[Dim; 4]>::try_from(t.shape()?.to_vec()).ok()?;
    let h = h.as_known().filter(|h| *h > 0 && h % 2 == 0)?;
    let half = h / 2;
    let shapes_ok = matches!(dtype, DType::F32 | DType::F16)
        && eg[root].data.ty.as_ref() == Some(&t)
        && takes(eg, s, "h", (half, h), h)
        && takes(eg, s, "l", (0, half), h)
        && matches!(op(eg, s, "?acat")?, Op::Concat { axis: Some(-1 | 3) })
        && unsqueezed_at_1(eg, s, "?u1", "?au1")
        && unsqueezed_at_1(eg, s, "?u2", "?au2")
        && dtype_of(eg, s, "?e") == Some(dtype);
    if !shapes_ok {
        return None;
    }
    let f = angles(eg, at(s, "?e"), half)?;
    let fd = eg[f].data.ty.as_ref()?.shape()?.to_vec();
    if !(fd[0] == b && fd[1] == sq) {
        return None;
    }
    let cache = Type::tensor(dtype, fd);
    let cos = add_op(eg, Op::Cos {}, &[Some(f)], 1);
    set_ty(eg, cos, cache.clone());
    let sin = add_op(eg, Op::Sin {}, &[Some(f)], 1);
    set_ty(eg, sin, cache);
    let rot = Op::RotaryEmbedding {
        interleaved: None,
        num_heads: None,
        rotary_embedding_dim: None,
    };
    let r = add_op(eg, rot, &[Some(at(s, "?x")), Some(cos), Some(sin)], 1);
    set_ty(eg, r, t);
    Some(r)
}

#[rustfmt::skip]
pub(crate) fn rules() -> Vec<Rw> {
    vec![
        // `x·cos + rotate_half(x)·sin` → `RotaryEmbedding(x, Cos(f), Sin(f))`. Exact up to the
        // kernel's rounding. Conditions: `x` `[B, N, S, H]` (H known, even), the halves
        // sliced exactly, `cos`/`sin` of the same `Concat(f, f)` unsqueezed at axis 1.
        rule_any("rotary-half", &patterns(), vec![for_ort()], build),
    ]
}
