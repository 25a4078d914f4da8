//! Contrib kernels: convolution and Gemm with a fused activation (`FusedConv`, `FusedGemm`),
//! per ONNX Runtime's CPU contrib schemas.
//!
//! - `FusedConv(X, W, B?, Z?)`: the Conv attributes plus `activation` and
//!   `activation_params`; `Y = act(Conv(X, W, B) + Z)`.
//! - `FusedGemm(A, B, C?)`: the Gemm attributes plus `activation` and `activation_alpha`,
//!   `activation_beta`; `Y = act(Gemm(A, B, C))`.
//!
//! The convolution and product run through the interpreter's own `Conv` / `Gemm` kernels.

use mmq_ir::{Attr, NodeData, Op};

use crate::error::KernelError;
use crate::ops::{OpCtx, OpResult};
use crate::tensor::{RtValue, Tensor};

/// An activation with its parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Act {
    Relu,
    Tanh,
    Sigmoid,
    LeakyRelu(f64),
    Clip(f64, f64),
    HardSigmoid(f64, f64),
}

impl Act {
    fn apply(self, x: f64) -> f64 {
        match self {
            Act::Relu => x.max(0.0),
            Act::Tanh => x.tanh(),
            Act::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            Act::LeakyRelu(a) => {
                if x >= 0.0 {
                    x
                } else {
                    a * x
                }
            }
            Act::Clip(lo, hi) => x.max(lo).min(hi),
            Act::HardSigmoid(a, b) => (a * x + b).clamp(0.0, 1.0),
        }
    }
}

/// The activation named by `activation`, its parameters from `activation_params` (FusedConv)
/// or `activation_alpha` / `activation_beta` (FusedGemm).
fn activation(cx: &OpCtx<'_>, op: &Op) -> Result<Act, KernelError> {
    let name = op.attr("activation");
    let name = match &name {
        Some(Attr::String(s)) => s.as_str(),
        None => return Err(cx.invalid("missing attribute 'activation'")),
        Some(a) => return Err(cx.invalid(format!("attribute 'activation' is {a:?}, not a string"))),
    };
    let params: Vec<f64> = match op.attr("activation_params") {
        Some(Attr::Floats(v)) => v.iter().map(|&x| f64::from(x)).collect(),
        _ => ["activation_alpha", "activation_beta"]
            .iter()
            .map_while(|n| match op.attr(n) {
                Some(Attr::Float(x)) => Some(f64::from(x)),
                _ => None,
            })
            .collect(),
    };
    let p =
        |i: usize, default: Option<f64>| -> Result<f64, KernelError> {
            params.get(i).copied().or(default).ok_or_else(|| {
                cx.invalid(format!("activation {name} needs {} parameter(s)", i + 1))
            })
        };
    Ok(match name {
        "Relu" => Act::Relu,
        "Tanh" => Act::Tanh,
        "Sigmoid" => Act::Sigmoid,
        "LeakyRelu" => Act::LeakyRelu(p(0, Some(0.01))?),
        "Clip" => Act::Clip(p(0, None)?, p(1, None)?),
        "HardSigmoid" => Act::HardSigmoid(p(0, Some(0.2))?, p(1, Some(0.5))?),
        other => return Err(cx.unsupported(format!("activation '{other}'"))),
    })
}

/// Runs the base op (`Conv` or `Gemm`) on the first `base_inputs` operands with the node's
/// attributes other than the activation's, adds `Z` (FusedConv's fourth operand), applies the
/// activation.
pub(super) fn fused(
    cx: &OpCtx<'_>,
    op: &Op,
    inputs: &[Option<RtValue>],
    base: &str,
    base_inputs: usize,
) -> OpResult {
    let act = activation(cx, op)?;
    let attrs: Vec<(String, Attr)> = op
        .attrs()
        .into_iter()
        .filter(|(n, _)| !n.starts_with("activation"))
        .map(|(n, a)| (n.to_owned(), a))
        .collect();
    let base_op = Op::from_parts("", base, attrs);
    if base_op.is_custom() {
        return Err(cx.invalid(format!("attributes do not fit {base}")));
    }
    let node = NodeData {
        op: base_op,
        inputs: cx.node.inputs.iter().take(base_inputs).copied().collect(),
        outputs: cx.node.outputs.iter().take(1).copied().collect(),
        name: cx.node.name.clone(),
        graph: cx.node.graph,
    };
    let inner = OpCtx {
        interp: cx.interp,
        node: &node,
        opset: cx.opset.max(11),
        env: cx.env,
    };
    let n = inputs.len().min(base_inputs);
    let mut out = crate::ops::eval(&inner, &inputs[..n])?;
    let y = out
        .first_mut()
        .and_then(Option::take)
        .ok_or_else(|| cx.invalid(format!("{base} gave no result")))?;
    let y = y
        .as_tensor()
        .ok_or_else(|| cx.invalid(format!("{base} result is not a tensor")))?;
    let mut v = y.to_f64()?;
    if let Some(Some(z)) = inputs.get(3).filter(|_| base == "Conv") {
        let z = z
            .as_tensor()
            .ok_or_else(|| cx.invalid("Z is not a tensor"))?;
        if z.shape != y.shape {
            return Err(cx.invalid(format!(
                "Z {:?} must have the result's shape {:?}",
                z.shape, y.shape
            )));
        }
        for (a, b) in v.iter_mut().zip(z.to_f64()?) {
            *a += b;
        }
    }
    for x in &mut v {
        *x = act.apply(*x);
    }
    let t = Tensor::from_f64_as(y.dtype, y.shape.clone(), &v)?;
    Ok(vec![Some(t.into())])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activations_match_their_onnx_definitions() {
        assert_eq!(Act::Relu.apply(-1.0), 0.0);
        assert_eq!(Act::LeakyRelu(0.1).apply(-2.0), -0.2);
        assert_eq!(Act::Clip(0.0, 6.0).apply(7.0), 6.0);
        assert_eq!(Act::HardSigmoid(0.2, 0.5).apply(10.0), 1.0);
        assert!((Act::Sigmoid.apply(0.0) - 0.5).abs() < 1e-12);
    }
}
