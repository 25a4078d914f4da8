//! Kernels: shape and indexing ops. They move elements without arithmetic (Resize and the
//! scatter reductions aside), so they are written once over every [`crate::Data`] variant,
//! strings and small-type codes included.

mod index;
mod layout;
mod misc;
mod resize;

use mmq_ir::{Attr, CustomOp, Op, OpKind};

use crate::ops::{OpCtx, OpResult};
use crate::tensor::{RtValue, Tensor};

/// One tensor output.
fn single(t: Tensor) -> OpResult {
    Ok(vec![Some(RtValue::from(t))])
}

/// Legacy or newer forms of this family's ops that the typed `Op` does not model: `Scatter`
/// (ScatterElements before opset 11) and `SpaceToDepth` with a `mode`.
fn custom(cx: &OpCtx<'_>, i: &[Option<RtValue>], c: &CustomOp) -> Option<OpResult> {
    let int = |name: &str| {
        c.attrs.iter().find_map(|(n, a)| match a {
            Attr::Int(v) if n == name => Some(*v),
            _ => None,
        })
    };
    let string = |name: &str| {
        c.attrs.iter().find_map(|(n, a)| match a {
            Attr::String(v) if n == name => Some(v.as_str()),
            _ => None,
        })
    };
    Some(match OpKind::of(&c.domain, &c.op_type) {
        OpKind::Scatter => index::scatter_elements(cx, i, int("axis").unwrap_or(0), None),
        OpKind::SpaceToDepth => layout::space_to_depth(cx, i, int("blocksize"), string("mode")),
        _ => return None,
    })
}

/// Runs the node when it is one of this family's ops.
pub(crate) fn eval(cx: &OpCtx<'_>, inputs: &[Option<RtValue>]) -> Option<OpResult> {
    let i = inputs;
    Some(match &cx.node.op {
        Op::Shape { start, end } => misc::shape(cx, i, *start, *end),
        Op::Size {} => misc::size(cx, i),
        Op::Range {} => misc::range(cx, i),
        Op::ConstantOfShape { value } => misc::constant_of_shape(cx, i, *value),
        Op::Constant { .. } => misc::constant(cx),
        Op::Dropout { ratio, .. } => misc::dropout(cx, i, *ratio),
        Op::Gather { axis } => index::gather(cx, i, axis.unwrap_or(0)),
        Op::GatherElements { axis } => index::gather_elements(cx, i, axis.unwrap_or(0)),
        Op::GatherND { batch_dims } => index::gather_nd(cx, i, batch_dims.unwrap_or(0)),
        Op::ScatterND { reduction } => index::scatter_nd(cx, i, reduction.as_deref()),
        Op::ScatterElements { axis, reduction } => {
            index::scatter_elements(cx, i, axis.unwrap_or(0), reduction.as_deref())
        }
        Op::NonZero {} => index::non_zero(cx, i),
        Op::OneHot { axis } => index::one_hot(cx, i, axis.unwrap_or(-1)),
        Op::TopK {
            axis,
            largest,
            sorted: _,
        } => index::top_k(cx, i, axis.unwrap_or(-1), largest.unwrap_or(1) != 0),
        Op::Trilu { upper } => index::trilu(cx, i, upper.unwrap_or(1) != 0),
        Op::Slice { starts, ends, axes } => layout::slice(cx, i, starts, ends, axes),
        Op::Concat { axis } => layout::concat(cx, i, *axis),
        Op::Split {
            axis,
            num_outputs,
            split,
        } => layout::split(cx, i, axis.unwrap_or(0), *num_outputs, split.as_deref()),
        Op::Reshape { allowzero } => layout::reshape(cx, i, allowzero.unwrap_or(0) != 0),
        Op::Expand {} => layout::expand(cx, i),
        Op::Squeeze { axes } => layout::squeeze(cx, i, axes.as_deref()),
        Op::Unsqueeze { axes } => layout::unsqueeze(cx, i, axes.as_deref()),
        Op::Flatten { axis } => layout::flatten(cx, i, axis.unwrap_or(1)),
        Op::Transpose { perm } => layout::transpose(cx, i, perm.as_deref()),
        Op::Tile {} => layout::tile(cx, i),
        Op::Pad { mode, pads, value } => {
            layout::pad(cx, i, mode.as_deref(), pads.as_deref(), *value)
        }
        Op::DepthToSpace { blocksize, mode } => {
            layout::depth_to_space(cx, i, *blocksize, mode.as_deref())
        }
        Op::SpaceToDepth { blocksize } => layout::space_to_depth(cx, i, *blocksize, None),
        Op::Scatter { axis } => index::scatter_elements(cx, i, axis.unwrap_or(0), None),
        Op::Custom(c) if c.domain.is_empty() => return custom(cx, i, c),
        Op::Resize { .. } => resize::resize(cx, i),
        _ => return None,
    })
}
