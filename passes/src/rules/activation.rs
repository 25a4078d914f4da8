//! `transformer` rules, activations and projections: GELU (erf and tanh forms), QuickGELU,
//! SiLU, bias folding into GELU, MatMul + bias into Gemm, and transposes and scales folded
//! into ONNX Runtime's `FusedMatMul`.

use egg::Subst;
use mmq_ir::{Attr, Op};

use super::*;

/// A `com.microsoft` op.
fn ms(op_type: &str, attrs: Vec<(&str, Attr)>) -> Op {
    Op::from_parts(
        "com.microsoft",
        op_type,
        attrs.into_iter().map(|(k, a)| (k.into(), a)).collect(),
    )
}

/// `x * (h * p)` in the usual operand orders and groupings, `?h` the constant one half and
/// `p` the pattern of `1 + f(x)`.
fn half_x_times(p: &str) -> Vec<String> {
    [
        format!("(Mul (Mul ?x ?h ?m1) {p} ?m2)"),
        format!("(Mul {p} (Mul ?x ?h ?m1) ?m2)"),
        format!("(Mul (Mul ?h ?x ?m1) {p} ?m2)"),
        format!("(Mul {p} (Mul ?h ?x ?m1) ?m2)"),
        format!("(Mul ?x (Mul {p} ?h ?m1) ?m2)"),
        format!("(Mul ?x (Mul ?h {p} ?m1) ?m2)"),
        format!("(Mul (Mul {p} ?h ?m1) ?x ?m2)"),
        format!("(Mul (Mul ?h {p} ?m1) ?x ?m2)"),
        format!("(Mul (Mul ?x {p} ?m1) ?h ?m2)"),
        format!("(Mul ?h (Mul ?x {p} ?m1) ?m2)"),
        format!("(Mul (Mul {p} ?x ?m1) ?h ?m2)"),
        format!("(Mul ?h (Mul {p} ?x ?m1) ?m2)"),
    ]
    .into()
}

/// `1 + e` in both operand orders.
fn one_plus(e: &str) -> [String; 2] {
    [format!("(Add {e} ?one ?a1)"), format!("(Add ?one {e} ?a1)")]
}

/// GELU, erf form: `0.5 x (1 + erf(x / √2))`, the argument as `x / c` or `x * c`.
fn gelu_erf_patterns() -> Vec<String> {
    let mut out = Vec::new();
    for e in ["(Erf (Div ?x ?cd ?ad) ?ae)", "(Erf (Mul ?x ?cm ?ad) ?ae)"] {
        for p in one_plus(e) {
            out.extend(half_x_times(&p));
        }
    }
    out
}

/// GELU, tanh form: `0.5 x (1 + tanh(s (x + k x^3)))`, the cube written `Pow(x, 3)` (the
/// product spellings become it first: `cube-to-pow`).
fn gelu_tanh_patterns() -> Vec<String> {
    gelu_tanh_spellings(&[
        "(Mul (Pow ?x ?three ?ap) ?k ?ak)",
        "(Mul ?k (Pow ?x ?three ?ap) ?ak)",
    ])
}

fn gelu_tanh_spellings(cubes: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for cube in cubes {
        let inner = format!("(Add ?x {cube} ?ai)");
        for t in [
            format!("(Tanh (Mul {inner} ?s ?as) ?at)"),
            format!("(Tanh (Mul ?s {inner} ?as) ?at)"),
        ] {
            for p in one_plus(&t) {
                out.extend(half_x_times(&p));
            }
        }
    }
    out
}

/// The constants of the tanh GELU: `k` = 0.044715 within 1e-6, `s` = √(2/π) within 1e-4.
fn gelu_tanh_consts() -> Cond {
    when(|eg, s| {
        float_x(eg, s, "?x")
            && near(eg, s, "?k", 0.044715, 1e-6)
            && near(eg, s, "?s", (2.0 / std::f64::consts::PI).sqrt(), 1e-4)
    })
}

/// `com.microsoft.FastGelu(x)` (ort) or `Gelu approximate="tanh"` (generic, opset ≥ 20).
fn build_fast_gelu(eg: &mut EG, _root: Id, s: &Subst) -> Option<Id> {
    let o = eg.analysis.target.gelu(true, eg.analysis.opset)?;
    Some(add_op(eg, o, &[Some(at(s, "?x"))], 1))
}

/// The single element of the small constant `v`.
fn scalar(eg: &EG, s: &Subst, v: &str) -> Option<f64> {
    match consts(eg, s, v)? {
        [c] => Some(*c),
        _ => None,
    }
}

/// `v` is the scalar `c` within `tol`.
fn near(eg: &EG, s: &Subst, v: &str, c: f64, tol: f64) -> bool {
    scalar(eg, s, v).is_some_and(|x| (x - c).abs() <= tol)
}

/// `x` is a float tensor of known rank.
fn float_x(eg: &EG, s: &Subst, x: &str) -> bool {
    ty(eg, s, x).is_some_and(|t| t.shape().is_some() && t.dtype().is_some_and(|d| d.is_float()))
}

/// `b` is a constant 1-D vector as long as `x`'s (known) last dim.
fn bias_of(eg: &EG, s: &Subst, x: &str, b: &str) -> bool {
    let last = ty(eg, s, x).and_then(|t| t.shape()?.last()?.as_known());
    let bd = ty(eg, s, b).and_then(|t| t.shape().map(<[_]>::to_vec));
    is_const(eg, s, b)
        && !is_const(eg, s, x)
        && matches!((last, bd.as_deref()), (Some(n), Some([d])) if d.as_known() == Some(n))
}

/// The permutation of a Transpose swaps exactly the last two of `rank` axes.
fn swaps_last_two(o: &Op, rank: usize) -> bool {
    match o {
        Op::Transpose { perm: Some(p) } => {
            rank >= 2
                && p.len() == rank
                && p.iter().enumerate().all(|(i, &a)| {
                    let want = if i + 2 == rank {
                        rank - 1
                    } else if i + 1 == rank {
                        rank - 2
                    } else {
                        i
                    };
                    a == want as i64
                })
        }
        Op::Transpose { perm: None } => rank == 2,
        _ => false,
    }
}

/// The rank of `v`.
fn rank(eg: &EG, s: &Subst, v: &str) -> Option<usize> {
    Some(ty(eg, s, v)?.shape()?.len())
}

/// `FusedMatMul` attributes.
fn fused(alpha: f32, trans_a: i64, trans_b: i64) -> Op {
    ms(
        "FusedMatMul",
        vec![
            ("alpha", Attr::Float(alpha)),
            ("transA", Attr::Int(trans_a)),
            ("transB", Attr::Int(trans_b)),
        ],
    )
}

#[rustfmt::skip]
pub(crate) fn rules() -> Vec<Rw> {
    vec![
        // 0.5 x (1 + erf(x / √2)) -> com.microsoft.Gelu (ort) or Gelu (generic, opset >= 20).
        // Exact up to rounding; the constant within 1e-3 of √2 (or 1/√2 as a factor), which
        // moves the result by at most about 1e-4 relative.
        rule_any("gelu-erf", &gelu_erf_patterns(),
            vec![is_all("?h", 0.5), is_all("?one", 1.0), when(|eg, s| float_x(eg, s, "?x")
                && if bound(s, "?cd").is_some() {
                    near(eg, s, "?cd", std::f64::consts::SQRT_2, 1e-3)
                } else {
                    near(eg, s, "?cm", std::f64::consts::FRAC_1_SQRT_2, 1e-3)
                })],
            |eg, _, s| {
                let o = eg.analysis.target.gelu(false, eg.analysis.opset)?;
                Some(add_op(eg, o, &[Some(at(s, "?x"))], 1))
            }),
        // 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³))) -> com.microsoft.FastGelu (ort) or
        // Gelu approximate="tanh" (generic, opset >= 20). Exact (same formula); constants
        // within 1e-4 / 1e-6.
        rule_any("gelu-tanh", &gelu_tanh_patterns(),
            vec![is_all("?h", 0.5), is_all("?one", 1.0), is_all("?three", 3.0), gelu_tanh_consts()],
            build_fast_gelu),
        // `x · (x · x)` and `(x · x) · x` → `Pow(x, 3)` (TorchScript exports of SigLIP's
        // `gelu_pytorch_tanh`), so one spelling of the cube serves the GELU rules. Rounding
        // only (the products round twice, `Pow` once).
        rule_any("cube-to-pow", &["(Mul ?x (Mul ?x ?x ?m2) ?m1)".into(), "(Mul (Mul ?x ?x ?m2) ?x ?m1)".into()],
            vec![when(|eg, s| float_x(eg, s, "?x"))],
            |eg, root, s| {
                let dt = dtype_of(eg, s, "?x")?;
                let three = lit(eg, dt, vec![], &[3.0])?;
                let p = add_op(eg, Op::Pow {}, &[Some(at(s, "?x")), Some(three)], 1);
                if let Some(t) = eg[root].data.ty.clone() {
                    set_ty(eg, p, t);
                }
                Some(p)
            }),
        // Gelu(x + b) -> com.microsoft.BiasGelu(x, b) (ort), erf GELU, b a constant 1-D of
        // x's last dim. Exact.
        rule_any("bias-gelu", &[
                "(Gelu (Add ?x ?b ?aa) ?g)".into(),
                "(Gelu (Add ?b ?x ?aa) ?g)".into(),
                "(com.microsoft.Gelu (Add ?x ?b ?aa) ?g)".into(),
                "(com.microsoft.Gelu (Add ?b ?x ?aa) ?g)".into(),
            ],
            vec![for_ort(), when(|eg, s| bias_of(eg, s, "?x", "?b") && float_x(eg, s, "?x")
                && match op(eg, s, "?g") {
                    Some(Op::Gelu { approximate }) => approximate.as_deref().unwrap_or("none") == "none",
                    Some(Op::MsGelu {}) => true,
                    _ => false,
                })],
            |eg, _, s| Some(add_op(eg, ms("BiasGelu", vec![]), &[Some(at(s, "?x")), Some(at(s, "?b"))], 1))),
        // Gelu(x) approximate="tanh" -> com.microsoft.FastGelu(x) (ort). Exact.
        rule("gelu-tanh-to-fast-gelu", "(Gelu ?x ?g)",
            vec![for_ort(), when(|eg, s| float_x(eg, s, "?x") && matches!(op(eg, s, "?g"),
                Some(Op::Gelu { approximate: Some(a) }) if a == "tanh"))],
            |eg, _, s| Some(add_op(eg, ms("FastGelu", vec![]), &[Some(at(s, "?x"))], 1))),
        // FastGelu(x + b) -> FastGelu(x, b) (ort), b a constant 1-D of x's last dim. Exact.
        rule_any("fast-gelu-bias", &[
                "(com.microsoft.FastGelu (Add ?x ?b ?aa) ?g)".into(),
                "(com.microsoft.FastGelu (Add ?b ?x ?aa) ?g)".into(),
            ],
            vec![for_ort(), when(|eg, s| bias_of(eg, s, "?x", "?b") && float_x(eg, s, "?x"))],
            |eg, _, s| Some(add_op(eg, ms("FastGelu", vec![]), &[Some(at(s, "?x")), Some(at(s, "?b"))], 1))),
        // x * Sigmoid(alpha x) -> com.microsoft.QuickGelu alpha (ort), alpha a scalar
        // constant (1.702 in CLIP). Exact up to rounding.
        rule_any("quick-gelu", &[
                "(Mul ?x (Sigmoid (Mul ?x ?al ?m1) ?sg) ?m2)".into(),
                "(Mul (Sigmoid (Mul ?x ?al ?m1) ?sg) ?x ?m2)".into(),
                "(Mul ?x (Sigmoid (Mul ?al ?x ?m1) ?sg) ?m2)".into(),
                "(Mul (Sigmoid (Mul ?al ?x ?m1) ?sg) ?x ?m2)".into(),
            ],
            vec![for_ort(), when(|eg, s| float_x(eg, s, "?x") && !is_const(eg, s, "?x")
                && scalar(eg, s, "?al").is_some_and(f64::is_finite))],
            |eg, _, s| {
                let alpha = scalar(eg, s, "?al")? as f32;
                Some(add_op(eg, ms("QuickGelu", vec![("alpha", Attr::Float(alpha))]), &[Some(at(s, "?x"))], 1))
            }),
        // x * Sigmoid(x) (SiLU) -> com.microsoft.QuickGelu alpha=1 (ort). Exact up to rounding.
        rule_any("silu-to-quick-gelu", &[
                "(Mul ?x (Sigmoid ?x ?sg) ?m)".into(),
                "(Mul (Sigmoid ?x ?sg) ?x ?m)".into(),
            ],
            vec![for_ort(), when(|eg, s| float_x(eg, s, "?x"))],
            |eg, _, s| Some(add_op(eg, ms("QuickGelu", vec![("alpha", Attr::Float(1.0))]), &[Some(at(s, "?x"))], 1))),
        // MatMul(a, W) + b -> Gemm(a, W, b): a 2-D, W a 2-D constant, b a constant of shape
        // [N] or [1, N]. Exact up to rounding (both targets).
        rule_any("matmul-add-to-gemm", &[
                "(Add (MatMul ?a ?w ?am) ?b ?aa)".into(),
                "(Add ?b (MatMul ?a ?w ?am) ?aa)".into(),
            ],
            vec![when(|eg, s| {
                let n = ty(eg, s, "?w").and_then(|t| t.shape()?.last()?.as_known());
                let bd: Option<Vec<Option<i64>>> = ty(eg, s, "?b")
                    .and_then(|t| t.shape().map(|d| d.iter().map(|x| x.as_known()).collect()));
                float_x(eg, s, "?a") && rank(eg, s, "?a") == Some(2) && rank(eg, s, "?w") == Some(2)
                    && is_const(eg, s, "?w") && is_const(eg, s, "?b") && !is_const(eg, s, "?a")
                    && n.is_some() && dtype_of(eg, s, "?b") == dtype_of(eg, s, "?a")
                    && matches!(bd.as_deref(), Some([d]) | Some([Some(1), d]) if *d == n)
            })],
            |eg, _, s| {
                let o = Op::Gemm { alpha: Some(1.0), beta: Some(1.0), trans_a: Some(0), trans_b: Some(0) };
                Some(add_op(eg, o, &[Some(at(s, "?a")), Some(at(s, "?w")), Some(at(s, "?b"))], 1))
            }),
        // MatMul(Transpose(a), b) with the last two axes swapped -> FusedMatMul transA=1
        // (ort). Exact.
        rule("fused-matmul-trans-a", "(MatMul (Transpose ?a ?t) ?b ?m)",
            vec![for_ort(), when(|eg, s| float_x(eg, s, "?a") && rank(eg, s, "?b").is_some_and(|r| r >= 2)
                && rank(eg, s, "?a").zip(op(eg, s, "?t")).is_some_and(|(r, o)| swaps_last_two(o, r)))],
            |eg, _, s| Some(add_op(eg, fused(1.0, 1, 0), &[Some(at(s, "?a")), Some(at(s, "?b"))], 1))),
        // MatMul(a, Transpose(b)) with the last two axes swapped -> FusedMatMul transB=1
        // (ort). Exact.
        rule("fused-matmul-trans-b", "(MatMul ?a (Transpose ?b ?t) ?m)",
            vec![for_ort(), when(|eg, s| float_x(eg, s, "?b") && rank(eg, s, "?a").is_some_and(|r| r >= 2)
                && rank(eg, s, "?b").zip(op(eg, s, "?t")).is_some_and(|(r, o)| swaps_last_two(o, r)))],
            |eg, _, s| Some(add_op(eg, fused(1.0, 0, 1), &[Some(at(s, "?a")), Some(at(s, "?b"))], 1))),
        // MatMul(a * c, b) -> FusedMatMul alpha=c (ort), c a scalar constant. Exact up to
        // rounding.
        rule_any("fused-matmul-scale", &[
                "(MatMul (Mul ?a ?c ?ac) ?b ?m)".into(),
                "(MatMul (Mul ?c ?a ?ac) ?b ?m)".into(),
            ],
            vec![for_ort(), when(|eg, s| float_x(eg, s, "?a") && !is_const(eg, s, "?a")
                && rank(eg, s, "?a").is_some_and(|r| r >= 2) && rank(eg, s, "?b").is_some_and(|r| r >= 2)
                && scalar(eg, s, "?c").is_some_and(f64::is_finite)
                && rank(eg, s, "?c").is_some_and(|r| r <= rank(eg, s, "?a").unwrap_or(0))
                && ty(eg, s, "?c").and_then(|t| t.shape()).is_some_and(|d| d.iter().all(|x| x.as_known() == Some(1))))],
            |eg, _, s| {
                let c = scalar(eg, s, "?c")? as f32;
                Some(add_op(eg, fused(c, 0, 0), &[Some(at(s, "?a")), Some(at(s, "?b"))], 1))
            }),
    ]
}
