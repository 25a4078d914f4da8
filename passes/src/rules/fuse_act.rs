//! `fuse-act` (ONNX Runtime only): an activation after a Conv or a Gemm becomes part of the
//! op, as ONNX Runtime's CPU contrib ops `com.microsoft.FusedConv` and `com.microsoft.FusedGemm`.
//!
//! - `FusedConv`: the Conv's attributes plus `activation` (`Relu`, `Tanh`, `Sigmoid`,
//!   `LeakyRelu`, `Clip`, `HardSigmoid`) and `activation_params` (LeakyRelu: alpha; Clip:
//!   min, max; HardSigmoid: alpha, beta).
//! - `FusedGemm`: the Gemm's attributes plus `activation` (`Relu`, `Tanh`, `Sigmoid`,
//!   `LeakyRelu`, `HardSigmoid`; ONNX Runtime's FusedGemm has no Clip) and the parameters as
//!   `activation_alpha` / `activation_beta`.
//!
//! Exact: the fused kernel applies the same activation to the same float result (ONNX Runtime
//! may use its vectorized activation routines, which agree with the standalone ops to float
//! rounding). Conditions: float32 (the only type the contrib kernels register); FusedGemm
//! activation parameters as above. Other users of the Conv / Gemm result keep reading the
//! unfused op (both stay in the e-graph; the cost model decides).

use egg::{Id, Subst};
use mmq_ir::{Attr, DType, Op, OpKind};

use super::*;

/// An activation and its parameters, read from the matched activation op `?aa` (and, for
/// `Clip`, its constant `?lo` / `?hi` operands).
fn activation(eg: &EG, s: &Subst) -> Option<(&'static str, Vec<f32>)> {
    Some(match op(eg, s, "?aa")? {
        Op::Relu {} => ("Relu", vec![]),
        Op::Tanh {} => ("Tanh", vec![]),
        Op::Sigmoid {} => ("Sigmoid", vec![]),
        Op::LeakyRelu { alpha } => ("LeakyRelu", vec![alpha.unwrap_or(0.01)]),
        Op::HardSigmoid { alpha, beta } => (
            "HardSigmoid",
            vec![alpha.unwrap_or(0.2), beta.unwrap_or(0.5)],
        ),
        Op::Clip { .. } => {
            let lo = consts(eg, s, "?lo")?;
            let hi = consts(eg, s, "?hi")?;
            if lo.len() != 1 || hi.len() != 1 {
                return None;
            }
            ("Clip", vec![lo[0] as f32, hi[0] as f32])
        }
        _ => return None,
    })
}

/// The matched value `?y` is f32.
fn is_f32(eg: &EG, s: &Subst) -> bool {
    dtype_of(eg, s, "?y") == Some(DType::F32)
}

/// `Conv` in `?y`'s class → `FusedConv` with the activation.
fn fused_conv(eg: &mut EG, _root: Id, s: &Subst) -> Option<Id> {
    let (act, params) = activation(eg, s)?;
    let (ins, conv) = node_of(eg, at(s, "?y"), OpKind::Conv)?;
    let Op::Conv { .. } = conv else { return None };
    let mut extra = vec![("activation".to_owned(), Attr::String(act.into()))];
    if !params.is_empty() {
        extra.push(("activation_params".into(), Attr::Floats(params)));
    }
    let fused = contrib("FusedConv", conv, extra);
    Some(add_present(eg, fused, &ins))
}

/// `Gemm` in `?y`'s class → `FusedGemm` with the activation (no Clip in ONNX Runtime's).
fn fused_gemm(eg: &mut EG, _root: Id, s: &Subst) -> Option<Id> {
    let (act, params) = activation(eg, s)?;
    if act == "Clip" {
        return None;
    }
    let (ins, gemm) = node_of(eg, at(s, "?y"), OpKind::Gemm)?;
    let Op::Gemm { .. } = gemm else { return None };
    let mut extra = vec![("activation".to_owned(), Attr::String(act.into()))];
    for (name, p) in ["activation_alpha", "activation_beta"].iter().zip(&params) {
        extra.push(((*name).into(), Attr::Float(*p)));
    }
    let fused = contrib("FusedGemm", gemm, extra);
    Some(add_present(eg, fused, &ins))
}

/// A `com.microsoft` op named `op_type` with `base`'s attributes followed by `extra`.
fn contrib(op_type: &str, base: &Op, extra: Vec<(String, Attr)>) -> Op {
    let mut attrs: Vec<(String, Attr)> = base
        .attrs()
        .into_iter()
        .map(|(n, a)| (n.to_owned(), a))
        .collect();
    attrs.extend(extra);
    Op::from_parts("com.microsoft", op_type, attrs)
}

/// Adds `op` over `ins`, keeping absent operands absent.
fn add_present(eg: &mut EG, op: Op, ins: &[Id]) -> Id {
    let ins: Vec<Option<Id>> = ins
        .iter()
        .map(|&i| (!matches!(eg[i].data.konst, Konst::Absent)).then_some(i))
        .collect();
    add_op(eg, op, &ins, 1)
}

/// The class bound to `?y` holds a node of `kind`.
fn has(kind: OpKind) -> Cond {
    when(move |eg, s| node_of(eg, at(s, "?y"), kind).is_some())
}

#[rustfmt::skip]
pub(crate) fn rules() -> Vec<Rw> {
    let c = || vec![for_ort(), when(is_f32), has(OpKind::Conv)];
    let g = || vec![for_ort(), when(is_f32), has(OpKind::Gemm)];
    vec![
        rule("fuse-conv-relu",        "(Relu ?y ?aa)",                c(), fused_conv),
        rule("fuse-conv-tanh",        "(Tanh ?y ?aa)",                c(), fused_conv),
        rule("fuse-conv-sigmoid",     "(Sigmoid ?y ?aa)",             c(), fused_conv),
        rule("fuse-conv-leaky-relu",  "(LeakyRelu ?y ?aa)",           c(), fused_conv),
        rule("fuse-conv-hard-sigmoid", "(HardSigmoid ?y ?aa)",        c(), fused_conv),
        rule("fuse-conv-clip",        "(Clip ?y ?lo ?hi ?aa)",        c(), fused_conv),
        rule("fuse-gemm-relu",        "(Relu ?y ?aa)",                g(), fused_gemm),
        rule("fuse-gemm-tanh",        "(Tanh ?y ?aa)",                g(), fused_gemm),
        rule("fuse-gemm-sigmoid",     "(Sigmoid ?y ?aa)",             g(), fused_gemm),
        rule("fuse-gemm-leaky-relu",  "(LeakyRelu ?y ?aa)",           g(), fused_gemm),
        rule("fuse-gemm-hard-sigmoid", "(HardSigmoid ?y ?aa)",        g(), fused_gemm),
    ]
}
