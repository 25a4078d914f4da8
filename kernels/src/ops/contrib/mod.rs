//! Kernels: ONNX Runtime's `com.microsoft` contrib ops that mmq's ONNX Runtime target emits
//! (fused convolutions, normalizations, activations, attention), so the interpreter can run
//! and check every rewrite. Semantics follow ONNX Runtime's contrib op schemas.

use mmq_ir::{CustomOp, Op};

use crate::ops::{OpCtx, OpResult};
use crate::tensor::RtValue;

mod activation;
mod attention;
mod conv;
mod matmul_nbits;

pub(crate) use matmul_nbits::matmul_nbits as matmul_nbits_op;
mod norm;

/// The contrib op family.
pub(crate) fn eval(cx: &OpCtx<'_>, inputs: &[Option<RtValue>]) -> Option<OpResult> {
    let Op::Custom(op) = &cx.node.op else {
        return None;
    };
    // ONNX Runtime registers a few of its own ops in the default domain.
    let ort_default_domain = op.domain.is_empty() && op.op_type == "SimplifiedLayerNormalization";
    if op.domain != "com.microsoft" && !ort_default_domain {
        return None;
    }
    type Family = fn(&OpCtx<'_>, &CustomOp, &[Option<RtValue>]) -> Option<OpResult>;
    const FAMILIES: [Family; 5] = [
        norm::eval,
        activation::eval,
        conv::eval,
        attention::eval,
        matmul_nbits::eval,
    ];
    FAMILIES.iter().find_map(|f| f(cx, op, inputs))
}
