//! Kernels: ONNX Runtime's `com.microsoft` contrib ops that mmq's ONNX Runtime target emits
//! (fused convolutions, normalizations, activations, attention), so the interpreter can run
//! and check every rewrite. Semantics follow ONNX Runtime's contrib op schemas.

use mmq_ir::Op;

use crate::ops::{OpCtx, OpResult};
use crate::tensor::RtValue;

mod activation;
mod attention;
mod conv;
mod matmul_nbits;

pub(crate) use matmul_nbits::matmul_nbits as matmul_nbits_op;
mod norm;

/// The contrib op family: every ONNX Runtime op of the op table has its kernel here.
pub(crate) fn eval(cx: &OpCtx<'_>, inputs: &[Option<RtValue>]) -> Option<OpResult> {
    let op = &cx.node.op;
    Some(match op {
        Op::SkipLayerNormalization { .. } => norm::skip_norm(cx, op, inputs, false),
        Op::SkipSimplifiedLayerNormalization { .. } => norm::skip_norm(cx, op, inputs, true),
        Op::SimplifiedLayerNormalization { .. } => norm::simplified(cx, op, inputs),
        Op::MsGelu {} | Op::BiasGelu {} | Op::FastGelu {} | Op::QuickGelu { .. } => {
            activation::gelu(cx, op, inputs)
        }
        Op::FusedMatMul { .. } => activation::fused_matmul(cx, op, inputs),
        Op::FusedConv { .. } => conv::fused(cx, op, inputs, "Conv", 3),
        Op::FusedGemm { .. } => conv::fused(cx, op, inputs, "Gemm", 3),
        Op::MultiHeadAttention { .. } => attention::multi_head_attention(cx, op, inputs),
        Op::MatMulNBits { .. } => matmul_nbits_op(cx, op, inputs),
        Op::MsRotaryEmbedding { .. } => attention::rotary_embedding(cx, op, inputs),
        Op::GroupQueryAttention { .. } => attention::group_query_attention(cx, op, inputs),
        // Typed and inferred, not run: the interpreter reports it as not implemented.
        Op::MsAttention { .. } => return None,
        _ => return None,
    })
}
