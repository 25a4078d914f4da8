//! Kernels: control ops.

use crate::ops::{OpCtx, OpResult};
use crate::tensor::RtValue;

/// Runs the node when it is one of this family's ops.
pub(crate) fn eval(_cx: &OpCtx<'_>, _inputs: &[Option<RtValue>]) -> Option<OpResult> {
    None
}
