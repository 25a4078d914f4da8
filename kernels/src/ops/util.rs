//! Helpers shared by the kernel families: operand access, axes, broadcasting.

use std::sync::Arc;

use crate::error::KernelError;
use crate::ops::OpCtx;
use crate::tensor::{RtValue, Tensor};

/// Operand `i` as a tensor; an error naming the node when it is missing or not a tensor.
pub(crate) fn tensor<'a>(
    cx: &OpCtx<'_>,
    inputs: &'a [Option<RtValue>],
    i: usize,
) -> Result<&'a Arc<Tensor>, KernelError> {
    match inputs.get(i) {
        Some(Some(RtValue::Tensor(t))) => Ok(t),
        Some(Some(_)) => Err(cx.invalid(format!("operand {i} is not a tensor"))),
        _ => Err(cx.invalid(format!("operand {i} is missing"))),
    }
}

/// Operand `i` as a tensor when present (optional operands).
pub(crate) fn opt_tensor(inputs: &[Option<RtValue>], i: usize) -> Option<&Arc<Tensor>> {
    match inputs.get(i) {
        Some(Some(RtValue::Tensor(t))) => Some(t),
        _ => None,
    }
}

/// Normalizes a possibly negative axis for `rank`.
pub(crate) fn axis(cx: &OpCtx<'_>, axis: i64, rank: usize) -> Result<usize, KernelError> {
    let r = rank as i64;
    if axis < -r || axis >= r.max(1) {
        return Err(cx.invalid(format!("axis {axis} is out of range for rank {rank}")));
    }
    Ok(if axis < 0 {
        (axis + r) as usize
    } else {
        axis as usize
    })
}

/// Row-major strides of `shape`.
pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// The multidirectional (numpy) broadcast of several shapes, or `None` if they do not broadcast.
pub(crate) fn broadcast_shapes(shapes: &[&[usize]]) -> Option<Vec<usize>> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1usize; rank];
    for s in shapes {
        let off = rank - s.len();
        for (i, &d) in s.iter().enumerate() {
            let o = &mut out[off + i];
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                return None;
            }
        }
    }
    Some(out)
}

/// For every element of `out_shape` (row-major), the linear index of the element of a tensor of
/// `in_shape` that broadcasts to it.
pub(crate) fn broadcast_indices(in_shape: &[usize], out_shape: &[usize]) -> Vec<usize> {
    let n: usize = out_shape.iter().product();
    if in_shape == out_shape {
        return (0..n).collect();
    }
    let off = out_shape.len() - in_shape.len();
    let in_strides = strides(in_shape);
    // Stride of the input along each output axis (0 where it broadcasts).
    let bstride: Vec<usize> = (0..out_shape.len())
        .map(|i| {
            if i < off || in_shape[i - off] == 1 {
                0
            } else {
                in_strides[i - off]
            }
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    let mut idx = vec![0usize; out_shape.len()];
    let mut lin = 0usize;
    for _ in 0..n {
        out.push(lin);
        for d in (0..out_shape.len()).rev() {
            idx[d] += 1;
            lin += bstride[d];
            if idx[d] < out_shape[d] {
                break;
            }
            lin -= bstride[d] * idx[d];
            idx[d] = 0;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting() {
        assert_eq!(
            broadcast_shapes(&[&[2, 1, 3], &[4, 1]]),
            Some(vec![2, 4, 3])
        );
        assert_eq!(broadcast_shapes(&[&[2, 3], &[4]]), None);
        assert_eq!(broadcast_indices(&[3], &[2, 3]), vec![0, 1, 2, 0, 1, 2]);
        assert_eq!(broadcast_indices(&[2, 1], &[2, 3]), vec![0, 0, 0, 1, 1, 1]);
        assert_eq!(broadcast_indices(&[], &[2]), vec![0, 0]);
    }
}
