//! `transformer` rules, normalization: LayerNormalization and RMS normalization from their
//! primitive spellings, the affine parts folded in, and the residual add fused into ONNX
//! Runtime's skip normalizations.

use std::collections::HashSet;

use egg::{Id, Language, Subst};
use mmq_ir::{Attr, DType, Op, OpKind, Type};

use super::*;

/// The two spellings of a mean over the last axis: axes as attribute (before opset 18) or as
/// a constant operand (from 18).
fn reduce_mean(x: &str, n: &str, axes_operand: bool) -> String {
    if axes_operand {
        format!("(ReduceMean {x} ?ax{n} ?ra{n})")
    } else {
        format!("(ReduceMean {x} ?ra{n})")
    }
}

/// Every pattern of LayerNorm without its affine part:
/// `(x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps)`, the square as `Pow 2` or `d * d`, the
/// division as `Div` or `Mul` by `Reciprocal`.
fn layer_norm_patterns() -> Vec<String> {
    let mut out = Vec::new();
    for axes in [false, true] {
        let d = format!("(Sub ?x {} ?as)", reduce_mean("?x", "1", axes));
        for sq in [format!("(Pow {d} ?two ?ap)"), format!("(Mul {d} {d} ?aq)")] {
            let var = reduce_mean(&sq, "2", axes);
            let s = format!("(Sqrt (Add {var} ?eps ?ae) ?at)");
            out.push(format!("(Div {d} {s} ?ad)"));
            out.push(format!("(Mul {d} (Reciprocal {s} ?ar) ?am)"));
        }
    }
    out
}

/// Every pattern of RMS normalization without its scale: `x / sqrt(mean(x^2) + eps)`, the
/// square as `Pow 2` or `x * x`, the division as `Div` or either order of `Mul` by
/// `Reciprocal`.
fn rms_norm_patterns() -> Vec<String> {
    let mut out = Vec::new();
    for axes in [false, true] {
        for sq in ["(Pow ?x ?two ?ap)", "(Mul ?x ?x ?aq)"] {
            let var = reduce_mean(sq, "2", axes);
            let s = format!("(Sqrt (Add {var} ?eps ?ae) ?at)");
            out.push(format!("(Div ?x {s} ?ad)"));
            out.push(format!("(Mul ?x (Reciprocal {s} ?ar) ?am)"));
            out.push(format!("(Mul (Reciprocal {s} ?ar) ?x ?am)"));
        }
    }
    out
}

/// The known last dim of `v` (the hidden size), for a float tensor of rank at least 1.
fn hidden(eg: &EG, s: &Subst, v: &str) -> Option<i64> {
    let t = ty(eg, s, v)?;
    if !t.dtype().is_some_and(|d| d.is_float()) {
        return None;
    }
    t.shape()?.last()?.as_known()
}

/// The rank of `v`.
fn rank(eg: &EG, s: &Subst, v: &str) -> Option<usize> {
    Some(ty(eg, s, v)?.shape()?.len())
}

/// Whether `axis` names the last of `rank` axes.
fn is_last(axis: i64, rank: usize) -> bool {
    axis == -1 || axis == rank as i64 - 1
}

/// The ReduceMean numbered `n` reduces only the last axis of `x` and keeps it.
fn mean_over_last(eg: &EG, s: &Subst, n: &str, x: &str) -> bool {
    let Some(r) = rank(eg, s, x) else {
        return false;
    };
    let Some(Op::ReduceMean { axes, keepdims, .. }) = op(eg, s, &format!("?ra{n}")) else {
        return false;
    };
    if keepdims.unwrap_or(1) != 1 {
        return false;
    }
    let axes: Option<Vec<f64>> = match bound(s, &format!("?ax{n}")) {
        Some(id) => match &eg[id].data.konst {
            crate::egraph::facts::Konst::Const { vals: Some(v) } => Some(v.clone()),
            _ => None,
        },
        None => axes.as_ref().map(|a| a.iter().map(|&i| i as f64).collect()),
    };
    matches!(axes.as_deref(), Some([a]) if is_last(*a as i64, r))
}

/// `?eps` is one positive scalar; `?two`, when bound, is 2.
fn eps_and_square(eg: &EG, s: &Subst) -> Option<f32> {
    if bound(s, "?two").is_some() && !all_eq(eg, s, "?two", 2.0) {
        return None;
    }
    match consts(eg, s, "?eps")? {
        [e] if *e > 0.0 && e.is_finite() => Some(*e as f32),
        _ => None,
    }
}

/// A tensor of `n` ones of `dtype` (the scale of a normalization without one).
fn ones(eg: &mut EG, dtype: DType, n: i64) -> Option<Id> {
    lit(eg, dtype, vec![n], &vec![1.0; usize::try_from(n).ok()?])
}

/// A `com.microsoft` op with an `epsilon` attribute.
fn ms_norm(op_type: &str, epsilon: f32) -> Op {
    Op::from_parts(
        "com.microsoft",
        op_type,
        vec![("epsilon".into(), Attr::Float(epsilon))],
    )
}

/// The epsilon of a normalization's attributes, when it normalizes the last of `rank` axes.
fn last_axis_eps(o: &Op, rank: usize) -> Option<f32> {
    match o {
        Op::LayerNormalization { axis, epsilon, .. }
        | Op::RMSNormalization { axis, epsilon, .. }
        | Op::SimplifiedLayerNormalization { axis, epsilon, .. } => {
            is_last(axis.unwrap_or(-1), rank).then_some(epsilon.unwrap_or(1e-5))
        }
        _ => None,
    }
}

/// `v` is 1-D of the hidden size `h`.
fn is_vec(eg: &EG, s: &Subst, v: &str, h: i64) -> bool {
    ty(eg, s, v)
        .and_then(Type::shape)
        .is_some_and(|d| d.len() == 1 && d[0].as_known() == Some(h))
}

/// Whether the sum `add` is read by something other than the normalization rooted at `root`
/// (the residual stream): a parent of its class outside the classes between `root` and it.
fn used_outside(eg: &EG, root: Id, add: Id) -> bool {
    let (root, add) = (eg.find(root), eg.find(add));
    let mut inside: HashSet<Id> = HashSet::from([root]);
    let mut level = vec![root];
    // The primitive spellings put at most 8 ops between the root and the sum.
    for _ in 0..8 {
        let mut next = Vec::new();
        for c in level {
            for n in eg[c].nodes.iter() {
                for &ch in n.children() {
                    let ch = eg.find(ch);
                    if ch != add && !eg[ch].data.konst.is_const() && inside.insert(ch) {
                        next.push(ch);
                    }
                }
            }
        }
        level = next;
    }
    // Another normalization of the same sum (one spelling of the same value) is not a use.
    let norm_of_sum = |p: Id| match eg.id_to_node(p) {
        TNode::Op { kind, .. } => matches!(
            kind.kind(),
            OpKind::LayerNormalization
                | OpKind::RMSNormalization
                | OpKind::SimplifiedLayerNormalization
        ),
        _ => false,
    };
    eg[add]
        .parents()
        .any(|p| !inside.contains(&eg.find(p)) && !norm_of_sum(p))
}

/// Builds a skip normalization over `inputs`: the one-result form when the sum `add` is read
/// only by the normalization, else the form that also returns the sum (result 3), whose
/// class is merged with `add` so the sum is computed once.
fn skip_node(eg: &mut EG, root: Id, add: Id, o: Op, inputs: &[Option<Id>]) -> Id {
    if used_outside(eg, root, add) {
        let t = add_op(eg, o, inputs, 0b1001);
        let sum = get(eg, t, 3);
        eg.union(sum, add);
        get(eg, t, 0)
    } else {
        add_op(eg, o, inputs, 1)
    }
}

/// Whether `g` is a scale a rule built (a literal) while the normalization `root` is still
/// multiplied by a constant that `norm-absorb-scale` folds into it: the skip fusion waits for
/// that form instead of fusing both.
fn scale_pending(eg: &EG, root: Id, s: &Subst) -> bool {
    let g = eg.find(at(s, "?g"));
    if !eg[g].nodes.iter().any(|n| matches!(n, TNode::Lit(_))) {
        return false;
    }
    let root = eg.find(root);
    eg[root].parents().any(|p| match eg.id_to_node(p) {
        TNode::Op { kind, args, .. } if kind.is(OpKind::Mul) && args.len() == 3 => {
            let other = if eg.find(args[0]) == root {
                args[1]
            } else {
                args[0]
            };
            eg[other].data.konst.is_const()
        }
        _ => false,
    })
}

/// Shared conditions of the skip fusions: ONNX Runtime, the norm over the last axis of a 2-D
/// or 3-D input, both summands of the same type, gamma (and beta, bias) 1-D of the hidden size.
fn skip_ok(eg: &EG, root: Id, s: &Subst, a: &str, b: &str, vecs: &[&str]) -> Option<f32> {
    if !eg.analysis.target.runs_domain("com.microsoft") || scale_pending(eg, root, s) {
        return None;
    }
    let r = rank(eg, s, a)?;
    if !(2..=3).contains(&r) || ty(eg, s, a) != ty(eg, s, b) {
        return None;
    }
    let h = hidden(eg, s, a)?;
    if !vecs
        .iter()
        .all(|v| bound(s, v).is_none() || is_vec(eg, s, v, h))
    {
        return None;
    }
    last_axis_eps(op(eg, s, "?ln")?, r)
}

#[rustfmt::skip]
pub(crate) fn rules() -> Vec<Rw> {
    vec![
        // `Div(1, y)` → `Reciprocal(y)` for float `y` (how the TorchScript exporter writes
        // `rsqrt`): one IEEE division either way, exact. Lets the RMSNorm rules read it.
        rule("div-one-to-reciprocal", "(Div ?one ?y ?a)",
             vec![is_all("?one", 1.0), when(|eg, s| {
                 dtype_of(eg, s, "?y").is_some_and(DType::is_float)
                     && dtype_of(eg, s, "?one") == dtype_of(eg, s, "?y")
                     && shape_of(eg, s, "?one").is_some_and(|d| d.iter().all(|x| x.as_known() == Some(1)))
             })],
             |eg, root, s| {
                 let r = add_op(eg, Op::Reciprocal {}, &[Some(at(s, "?y"))], 1);
                 if let Some(t) = eg[root].data.ty.clone() {
                     set_ty(eg, r, t);
                 }
                 Some(r)
             }),
        // LayerNorm without affine part -> LayerNormalization(x, ones). Exact up to rounding.
        // Both means over the last axis (keepdims), eps a positive scalar, opset >= 17.
        rule_any("layer-norm-from-primitives", &layer_norm_patterns(),
            vec![when(|eg, s| eg.analysis.opset >= 17 && mean_over_last(eg, s, "1", "?x")
                && mean_over_last(eg, s, "2", "?x"))],
            |eg, _, s| {
                let eps = eps_and_square(eg, s)?;
                let h = hidden(eg, s, "?x")?;
                let scale = ones(eg, dtype_of(eg, s, "?x")?, h)?;
                let o = Op::LayerNormalization { axis: Some(-1), epsilon: Some(eps), stash_type: Some(1) };
                Some(add_op(eg, o, &[Some(at(s, "?x")), Some(scale)], 1))
            }),
        // RMS norm without scale -> SimplifiedLayerNormalization(x, ones) on ort,
        // RMSNormalization(x, ones) on generic from opset 23. Exact up to rounding.
        rule_any("rms-norm-from-primitives", &rms_norm_patterns(),
            vec![when(|eg, s| mean_over_last(eg, s, "2", "?x"))],
            |eg, _, s| {
                let eps = eps_and_square(eg, s)?;
                let h = hidden(eg, s, "?x")?;
                let o = eg.analysis.target.rms_norm(eps, eg.analysis.opset)?;
                let scale = ones(eg, dtype_of(eg, s, "?x")?, h)?;
                Some(add_op(eg, o, &[Some(at(s, "?x")), Some(scale)], 1))
            }),
        // norm(x, s) * g -> norm(x, s * g) for a normalization without bias over the last
        // axis, s and g constant, g 1-D of the hidden size. Exact up to rounding.
        rule_any("norm-absorb-scale", &[
                "(Mul (LayerNormalization ?x ?s ?ln) ?g ?am)".into(),
                "(Mul ?g (LayerNormalization ?x ?s ?ln) ?am)".into(),
                "(Mul (RMSNormalization ?x ?s ?ln) ?g ?am)".into(),
                "(Mul ?g (RMSNormalization ?x ?s ?ln) ?am)".into(),
                "(Mul (SimplifiedLayerNormalization ?x ?s ?ln) ?g ?am)".into(),
                "(Mul ?g (SimplifiedLayerNormalization ?x ?s ?ln) ?am)".into(),
            ],
            vec![when(|eg, s| {
                let (Some(r), Some(h)) = (rank(eg, s, "?x"), hidden(eg, s, "?x")) else { return false };
                is_const(eg, s, "?s") && is_const(eg, s, "?g") && is_vec(eg, s, "?g", h)
                    && is_vec(eg, s, "?s", h)
                    && op(eg, s, "?ln").and_then(|o| last_axis_eps(o, r)).is_some()
            })],
            |eg, _, s| {
                let o = op(eg, s, "?ln")?.clone();
                let gty = ty(eg, s, "?g")?.clone();
                let g = add_op(eg, Op::Mul {}, &[Some(at(s, "?s")), Some(at(s, "?g"))], 1);
                set_ty(eg, g, gty);
                Some(add_op(eg, o, &[Some(at(s, "?x")), Some(g)], 1))
            }),
        // LayerNormalization(x, g) + b -> LayerNormalization(x, g, b), b constant 1-D of the
        // hidden size. Exact.
        rule_any("layer-norm-absorb-bias", &[
                "(Add (LayerNormalization ?x ?g ?ln) ?b ?aa)".into(),
                "(Add ?b (LayerNormalization ?x ?g ?ln) ?aa)".into(),
            ],
            vec![when(|eg, s| {
                let (Some(r), Some(h)) = (rank(eg, s, "?x"), hidden(eg, s, "?x")) else { return false };
                is_const(eg, s, "?b") && is_vec(eg, s, "?b", h)
                    && op(eg, s, "?ln").and_then(|o| last_axis_eps(o, r)).is_some()
            })],
            |eg, _, s| {
                let o = op(eg, s, "?ln")?.clone();
                Some(add_op(eg, o, &[Some(at(s, "?x")), Some(at(s, "?g")), Some(at(s, "?b"))], 1))
            }),
        // LayerNormalization(a + b) -> SkipLayerNormalization(a, b) (ort). Exact up to
        // rounding. a, b of one 2-D/3-D type, last axis, gamma/beta 1-D of the hidden size.
        rule_any("skip-layer-norm", &[
                "(LayerNormalization (Add ?a ?b ?aa) ?g ?beta ?ln)".into(),
                "(LayerNormalization (Add ?a ?b ?aa) ?g ?ln)".into(),
            ],
            vec![],
            |eg, root, s| {
                let eps = skip_ok(eg, root, s, "?a", "?b", &["?g", "?beta"])?;
                let ins = [Some(at(s, "?a")), Some(at(s, "?b")), Some(at(s, "?g")), bound(s, "?beta")];
                let n = if ins[3].is_some() { 4 } else { 3 };
                let sum = lookup_add(eg, at(s, "?a"), at(s, "?b"), at(s, "?aa"))?;
                Some(skip_node(eg, root, sum, ms_norm("SkipLayerNormalization", eps), &ins[..n]))
            }),
        // LayerNormalization((x + bias) + skip) -> SkipLayerNormalization(x, skip, g, beta,
        // bias) (ort), bias constant 1-D of the hidden size. Exact up to rounding.
        rule_any("skip-layer-norm-bias", &[
                "(LayerNormalization (Add (Add ?a ?bias ?ab) ?b ?aa) ?g ?beta ?ln)".into(),
                "(LayerNormalization (Add ?b (Add ?a ?bias ?ab) ?aa) ?g ?beta ?ln)".into(),
                "(LayerNormalization (Add (Add ?a ?bias ?ab) ?b ?aa) ?g ?ln)".into(),
                "(LayerNormalization (Add ?b (Add ?a ?bias ?ab) ?aa) ?g ?ln)".into(),
            ],
            vec![when(|eg, s| is_const(eg, s, "?bias") && !is_const(eg, s, "?a"))],
            |eg, root, s| {
                let eps = skip_ok(eg, root, s, "?a", "?b", &["?g", "?beta", "?bias"])?;
                let beta = bound(s, "?beta").unwrap_or_else(|| eg.add(TNode::None));
                let ins = [Some(at(s, "?a")), Some(at(s, "?b")), Some(at(s, "?g")), Some(beta),
                           Some(at(s, "?bias"))];
                let inner = lookup_add(eg, at(s, "?a"), at(s, "?bias"), at(s, "?ab"))?;
                let sum = lookup_add(eg, inner, at(s, "?b"), at(s, "?aa"))?;
                Some(skip_node(eg, root, sum, ms_norm("SkipLayerNormalization", eps), &ins))
            }),
        // SimplifiedLayerNormalization(a + b) -> SkipSimplifiedLayerNormalization(a, b)
        // (ort). Exact up to rounding; same conditions as skip-layer-norm.
        rule("skip-simplified-layer-norm",
            "(SimplifiedLayerNormalization (Add ?a ?b ?aa) ?g ?ln)",
            vec![],
            |eg, root, s| {
                let eps = skip_ok(eg, root, s, "?a", "?b", &["?g"])?;
                let ins = [Some(at(s, "?a")), Some(at(s, "?b")), Some(at(s, "?g"))];
                let sum = lookup_add(eg, at(s, "?a"), at(s, "?b"), at(s, "?aa"))?;
                Some(skip_node(eg, root, sum, ms_norm("SkipSimplifiedLayerNormalization", eps), &ins))
            }),
    ]
}

/// The class of `Add(x, y)` (either operand order) with attributes `attrs`, when present.
fn lookup_add(eg: &EG, x: Id, y: Id, attrs: Id) -> Option<Id> {
    let node = |p: Id, q: Id| TNode::Op {
        kind: crate::egraph::lang::Key::Kind(OpKind::Add),
        outs: 1,
        args: vec![p, q, attrs],
    };
    eg.lookup(node(x, y)).or_else(|| eg.lookup(node(y, x)))
}
