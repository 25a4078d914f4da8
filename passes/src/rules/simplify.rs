//! `simplify`: removes ops that do nothing and merges chains of data movement.

use egg::{Id, Subst};
use mmq_ir::{DType, Op, Type};

use super::*;

/// The type of the matched class (the value the rule replaces).
fn root_ty(eg: &EG, root: Id) -> Option<&Type> {
    eg[root].data.ty.as_ref()
}

/// `x` can stand in for the matched value: same known type (dtype and every dim).
fn same_as_root(eg: &EG, root: Id, s: &Subst, x: &str) -> bool {
    match (root_ty(eg, root), ty(eg, s, x)) {
        (Some(a), Some(b)) => a == b && a.shape().is_some() && a.dtype().is_some(),
        _ => false,
    }
}

/// Replaces the matched value by `x` when types agree exactly.
fn forward(x: &'static str) -> impl Fn(&mut EG, Id, &Subst) -> Option<Id> + Send + Sync {
    move |eg, root, s| same_as_root(eg, root, s, x).then(|| at(s, x))
}

/// The permutation of a Transpose (reversed axes when absent).
fn perm(op: &Op, rank: usize) -> Option<Vec<i64>> {
    match op {
        Op::Transpose { perm: Some(p) } => Some(p.clone()),
        Op::Transpose { perm: None } => Some((0..rank as i64).rev().collect()),
        _ => None,
    }
}

/// Whether every value of `from` converts to `to` and back exactly.
fn widens(from: DType, to: DType) -> bool {
    use DType::*;
    if from == to {
        return true;
    }
    matches!(
        (from, to),
        (F16 | BF16, F32 | F64)
            | (F32, F64)
            | (Bool, _)
            | (
                U8,
                U16 | U32 | U64 | I16 | I32 | I64 | F16 | BF16 | F32 | F64
            )
            | (I8, I16 | I32 | I64 | F16 | BF16 | F32 | F64)
            | (U16, U32 | U64 | I32 | I64 | F32 | F64)
            | (I16, I32 | I64 | F32 | F64)
            | (U32, U64 | I64 | F64)
            | (I32, I64 | F64)
    )
}

#[rustfmt::skip]
pub(crate) fn rules() -> Vec<Rw> {
    vec![
        rule("identity-elim", "(Identity ?x ?a)", vec![], forward("?x")),
        rule("dropout-elim", "(Dropout ?x ?a)",
             vec![when(|eg, s| !matches!(op(eg, s, "?a"), Some(Op::Dropout { is_test: Some(0), .. })))],
             forward("?x")),
        rule("dropout-elim-ratio", "(Dropout ?x ?r ?a)", vec![], forward("?x")),
        rule("dropout-elim-inference", "(Dropout ?x ?r ?t ?a)",
             vec![when(|eg, s| all_eq(eg, s, "?t", 0.0)
                 || matches!(eg[at(s, "?t")].data.konst, crate::egraph::facts::Konst::Absent))],
             forward("?x")),
        rule("mul-by-one", "(Mul ?x ?c ?a)", vec![is_all("?c", 1.0)], forward("?x")),
        rule("mul-by-one-left", "(Mul ?c ?x ?a)", vec![is_all("?c", 1.0)], forward("?x")),
        rule("div-by-one", "(Div ?x ?c ?a)", vec![is_all("?c", 1.0)], forward("?x")),
        rule("add-zero", "(Add ?x ?c ?a)", vec![is_all("?c", 0.0)], forward("?x")),
        rule("add-zero-left", "(Add ?c ?x ?a)", vec![is_all("?c", 0.0)], forward("?x")),
        rule("sub-zero", "(Sub ?x ?c ?a)", vec![is_all("?c", 0.0)], forward("?x")),
        rule("reshape-noop", "(Reshape ?x ?s ?a)", vec![], forward("?x")),
        rule("expand-noop", "(Expand ?x ?s ?a)", vec![], forward("?x")),
        rule("cast-noop", "(Cast ?x ?a)", vec![], forward("?x")),
        rule("concat-single", "(Concat ?x ?a)", vec![], forward("?x")),
        rule("transpose-transpose", "(Transpose (Transpose ?x ?a1) ?a2)", vec![],
             |eg, root, s| {
                 let rank = ty(eg, s, "?x")?.shape()?.len();
                 let p1 = perm(op(eg, s, "?a1")?, rank)?;
                 let p2 = perm(op(eg, s, "?a2")?, rank)?;
                 // out[i] = mid[p2[i]] = x[p1[p2[i]]]
                 let composed: Option<Vec<i64>> = p2
                     .iter()
                     .map(|&j| p1.get(usize::try_from(j).ok()?).copied())
                     .collect();
                 let composed = composed?;
                 if composed.iter().enumerate().all(|(i, &p)| p == i as i64) {
                     return same_as_root(eg, root, s, "?x").then(|| at(s, "?x"));
                 }
                 let x = at(s, "?x");
                 Some(add_op(eg, Op::Transpose { perm: Some(composed) }, &[Some(x)], 1))
             }),
        rw("reshape-reshape", "(Reshape (Reshape ?x ?s1 ?a1) ?s2 ?a2)", "(Reshape ?x ?s2 ?a2)",
           vec![when(|eg, s| {
               // A 0 in the outer target copies a dim of the intermediate shape (unless
               // allowzero), so only targets without 0 are independent of it.
               let allowzero = matches!(op(eg, s, "?a2"), Some(Op::Reshape { allowzero: Some(1) }));
               consts(eg, s, "?s2").is_some_and(|v| allowzero || v.iter().all(|&d| d != 0.0))
           })]),
        rule("cast-cast", "(Cast (Cast ?x ?a1) ?a2)",
             vec![when(|eg, s| {
                 let (Some(from), Some(mid)) = (dtype_of(eg, s, "?x"), cast_to(eg, s, "?a1")) else {
                     return false;
                 };
                 widens(from, mid)
             })],
             |eg, _, s| {
                 let x = at(s, "?x");
                 let o = op(eg, s, "?a2")?.clone();
                 Some(add_op(eg, o, &[Some(x)], 1))
             }),
        // `CastLike(x, like)` → `Cast(x, to = dtype(like))` when `like`'s dtype is known: the
        // result no longer reads `like` (a graph input, in exports that build constants with
        // `CastLike(0.0, input)`), so constant folding can evaluate it. Exact.
        rule("cast-like-to-cast", "(CastLike ?x ?like ?a)", vec![], |eg, _, s| {
            let to = dtype_of(eg, s, "?like")?;
            let Op::CastLike { round_mode, saturate } = op(eg, s, "?a")?.clone() else {
                return None;
            };
            let cast = Op::Cast { round_mode, saturate, to: Some(i64::from(to.onnx_code())) };
            Some(add_op(eg, cast, &[Some(at(s, "?x"))], 1))
        }),
        rule("shape-of-known-shape", "(Shape ?x ?a)", vec![], |eg, _, s| {
            let dims = ty(eg, s, "?x")?.shape()?.to_vec();
            let known: Option<Vec<i64>> = dims.iter().map(|d| d.as_known()).collect();
            let known = known?;
            let (start, end) = match op(eg, s, "?a")? {
                Op::Shape { start, end } => (start.unwrap_or(0), *end),
                _ => return None,
            };
            let r = known.len() as i64;
            let clamp = |i: i64| if i < 0 { (i + r).clamp(0, r) } else { i.min(r) };
            let (a, b) = (clamp(start), clamp(end.unwrap_or(r)));
            let vals: Vec<f64> = known[a as usize..(b.max(a)) as usize].iter().map(|&d| d as f64).collect();
            lit(eg, DType::I64, vec![vals.len() as i64], &vals)
        }),
    ]
}

fn cast_to(eg: &EG, s: &Subst, v: &str) -> Option<DType> {
    match op(eg, s, v)? {
        Op::Cast { to: Some(t), .. } => DType::from_onnx_code(*t as i32),
        _ => None,
    }
}
