//! Kernels: elementwise ops (arithmetic, comparison, logic, unary math, activations), `Cast`,
//! reductions, `ArgMax`/`ArgMin`, the softmax family and `CumSum`.
//!
//! Binary ops go through one broadcasting driver ([`binary::zip`]) that dispatches once per tensor
//! on the storage variant and runs a tight loop, with fast paths for equal shapes, scalar operands
//! and merged (contiguous) broadcast dims. f16/bf16 math runs in f32 and rounds back once.

mod binary;
mod cast;
mod reduce;
pub(crate) mod unary;

#[cfg(test)]
mod tests;

use mmq_ir::Op;

use crate::ops::{OpCtx, OpResult};
use crate::tensor::{RtValue, Tensor};

/// One tensor as the node's single result.
fn single(t: Tensor) -> OpResult {
    Ok(vec![Some(RtValue::from(t))])
}

/// Runs the node when it is one of this family's ops.
pub(crate) fn eval(cx: &OpCtx<'_>, inputs: &[Option<RtValue>]) -> Option<OpResult> {
    let op = &cx.node.op;
    if let Some(r) = binary::eval(cx, op, inputs) {
        return Some(r);
    }
    if let Some(r) = unary::eval(cx, op, inputs) {
        return Some(r);
    }
    if let Some(r) = reduce::eval(cx, op, inputs) {
        return Some(r);
    }
    match op {
        Op::Cast { .. } | Op::CastLike { .. } => Some(cast::eval(cx, op, inputs)),
        Op::Identity {} => Some(match inputs.first() {
            Some(Some(v)) => Ok(vec![Some(v.clone())]),
            _ => Err(cx.invalid("operand 0 is missing")),
        }),
        _ => None,
    }
}
