//! Optional and sequence ops that the IR keeps as custom default-domain ops: `OptionalHasElement`,
//! `OptionalGetElement`, `SequenceConstruct`, `SequenceEmpty`, `SequenceInsert`, `SequenceAt`,
//! `SequenceErase`, `SequenceLength`, `SplitToSequence`, `ConcatFromSequence`, `SequenceMap`.

use std::sync::Arc;

use mmq_ir::{Attr, CustomOp, OpKind};

use super::{Tail, attr, attr_i64, scalar_bool, scalar_i64};
use crate::error::KernelError;
use crate::ops::data;
use crate::ops::util::{self, opt_tensor, tensor};
use crate::ops::{OpCtx, OpResult};
use crate::tensor::{RtValue, Tensor};

/// Runs the op when it is one of the sequence or optional ops.
pub(super) fn eval(t: Tail<'_, '_>) -> Option<OpResult> {
    let (cx, kind, c, inputs) = (t.cx, t.kind, t.c, t.inputs);
    Some(match kind {
        OpKind::OptionalHasElement => Ok(vec![Some(scalar_bool(match inputs.first() {
            Some(Some(RtValue::Optional(o))) => o.is_some(),
            Some(Some(_)) => true,
            _ => false,
        }))]),
        OpKind::OptionalGetElement => match inputs.first() {
            Some(Some(RtValue::Optional(Some(v)))) => Ok(vec![Some((**v).clone())]),
            Some(Some(RtValue::Optional(None))) | Some(None) | None => {
                Err(cx.invalid("the optional input is empty"))
            }
            Some(Some(v)) => Ok(vec![Some(v.clone())]),
        },
        OpKind::SequenceEmpty => Ok(vec![Some(RtValue::Sequence(Vec::new()))]),
        OpKind::SequenceConstruct => inputs
            .iter()
            .enumerate()
            .map(|(i, _)| tensor(cx, inputs, i).cloned())
            .collect::<Result<Vec<_>, _>>()
            .map(|v| vec![Some(RtValue::Sequence(v))]),
        OpKind::SequenceLength => {
            sequence(cx, inputs).map(|s| vec![Some(scalar_i64(s.len() as i64))])
        }
        OpKind::SequenceAt => sequence_at(cx, inputs),
        OpKind::SequenceInsert => sequence_insert(cx, inputs),
        OpKind::SequenceErase => sequence_erase(cx, inputs),
        OpKind::SplitToSequence => split_to_sequence(cx, c, inputs),
        OpKind::ConcatFromSequence => concat_from_sequence(cx, c, inputs),
        OpKind::SequenceMap => sequence_map(cx, c, inputs),
        _ => return None,
    })
}

/// Operand 0 as a sequence.
fn sequence<'a>(
    cx: &OpCtx<'_>,
    inputs: &'a [Option<RtValue>],
) -> Result<&'a Vec<Arc<Tensor>>, KernelError> {
    match inputs.first() {
        Some(Some(RtValue::Sequence(s))) => Ok(s),
        Some(Some(_)) => Err(cx.invalid("operand 0 is not a sequence")),
        _ => Err(cx.invalid("operand 0 is missing")),
    }
}

/// A position operand: `None` when absent; checked against `[-len, len + extra)`.
fn position(
    cx: &OpCtx<'_>,
    inputs: &[Option<RtValue>],
    i: usize,
    len: usize,
    extra: usize,
) -> Result<Option<usize>, KernelError> {
    let Some(t) = opt_tensor(inputs, i) else {
        return Ok(None);
    };
    let p = *t
        .to_i64()?
        .first()
        .ok_or_else(|| cx.invalid("the position is empty"))?;
    let n = len as i64;
    if p < -n || p >= n + extra as i64 {
        return Err(cx.invalid(format!(
            "position {p} is out of range for a sequence of length {len}"
        )));
    }
    Ok(Some(if p < 0 { p + n } else { p } as usize))
}

fn sequence_at(cx: &OpCtx<'_>, inputs: &[Option<RtValue>]) -> OpResult {
    let s = sequence(cx, inputs)?;
    let p = position(cx, inputs, 1, s.len(), 0)?
        .ok_or_else(|| cx.invalid("the position is missing"))?;
    Ok(vec![Some(RtValue::Tensor(s[p].clone()))])
}

fn sequence_insert(cx: &OpCtx<'_>, inputs: &[Option<RtValue>]) -> OpResult {
    let s = sequence(cx, inputs)?;
    let t = tensor(cx, inputs, 1)?;
    let p = position(cx, inputs, 2, s.len(), 1)?.unwrap_or(s.len());
    let mut out = s.clone();
    out.insert(p, t.clone());
    Ok(vec![Some(RtValue::Sequence(out))])
}

fn sequence_erase(cx: &OpCtx<'_>, inputs: &[Option<RtValue>]) -> OpResult {
    let s = sequence(cx, inputs)?;
    if s.is_empty() {
        return Err(cx.invalid("cannot erase from an empty sequence"));
    }
    let p = position(cx, inputs, 1, s.len(), 0)?.unwrap_or(s.len() - 1);
    let mut out = s.clone();
    out.remove(p);
    Ok(vec![Some(RtValue::Sequence(out))])
}

fn split_to_sequence(cx: &OpCtx<'_>, c: &CustomOp, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let axis = util::axis(cx, attr_i64(c, "axis", 0), x.rank())?;
    if x.rank() == 0 {
        return Err(cx.invalid("cannot split a scalar"));
    }
    let len = x.shape[axis];
    let keepdims = attr_i64(c, "keepdims", 1) != 0;
    let mut out = Vec::new();
    match opt_tensor(inputs, 1) {
        None => {
            for i in 0..len {
                let t = if keepdims {
                    data::slice_axis(x, axis, i, 1)
                } else {
                    data::select_axis(x, axis, i)
                };
                out.push(Arc::new(t));
            }
        }
        Some(split) => {
            let sizes = split.to_i64()?;
            let sizes: Vec<usize> = if split.rank() == 0 {
                let k = sizes.first().copied().unwrap_or(0);
                if k <= 0 {
                    return Err(cx.invalid(format!("split size {k} must be positive")));
                }
                let k = k as usize;
                (0..len.div_ceil(k)).map(|i| k.min(len - i * k)).collect()
            } else {
                if sizes.iter().any(|&s| s < 0) || sizes.iter().sum::<i64>() != len as i64 {
                    return Err(
                        cx.invalid(format!("split sizes {sizes:?} do not add up to dim {len}"))
                    );
                }
                sizes.iter().map(|&s| s as usize).collect()
            };
            let mut start = 0;
            for s in sizes {
                out.push(Arc::new(data::slice_axis(x, axis, start, s)));
                start += s;
            }
        }
    }
    Ok(vec![Some(RtValue::Sequence(out))])
}

fn concat_from_sequence(cx: &OpCtx<'_>, c: &CustomOp, inputs: &[Option<RtValue>]) -> OpResult {
    let s = sequence(cx, inputs)?;
    let new_axis = attr_i64(c, "new_axis", 0) != 0;
    let Some(Attr::Int(axis)) = attr(c, "axis") else {
        return Err(cx.invalid("the axis attribute is required"));
    };
    let Some(first) = s.first() else {
        return Err(cx.invalid("cannot concatenate an empty sequence"));
    };
    let rank = first.rank() + usize::from(new_axis);
    let axis = util::axis(cx, *axis, rank)?;
    let parts: Vec<&Tensor> = s.iter().map(|t| t.as_ref()).collect();
    let t = data::concat(&parts, axis, new_axis).map_err(|e| cx.invalid(e))?;
    Ok(vec![Some(t.into())])
}

fn sequence_map(cx: &OpCtx<'_>, c: &CustomOp, inputs: &[Option<RtValue>]) -> OpResult {
    let Some(Attr::Graph(body)) = attr(c, "body") else {
        return Err(cx.invalid("the body attribute is missing"));
    };
    let s = sequence(cx, inputs)?;
    for (i, v) in inputs.iter().enumerate().skip(1) {
        if let Some(RtValue::Sequence(o)) = v
            && o.len() != s.len()
        {
            return Err(cx.invalid(format!(
                "sequence operand {i} has {} elements, the first has {}",
                o.len(),
                s.len()
            )));
        }
    }
    let n_out = cx.num_outputs();
    let mut outs: Vec<Vec<Arc<Tensor>>> = vec![Vec::with_capacity(s.len()); n_out];
    for (k, t) in s.iter().enumerate() {
        let mut args = vec![Some(RtValue::Tensor(t.clone()))];
        for v in &inputs[1..] {
            args.push(match v {
                Some(RtValue::Sequence(o)) => Some(RtValue::Tensor(o[k].clone())),
                other => other.clone(),
            });
        }
        let res = cx.run_graph(*body, args)?;
        for (o, v) in res.into_iter().enumerate().take(n_out) {
            match v {
                RtValue::Tensor(t) => outs[o].push(t),
                _ => return Err(cx.unsupported("SequenceMap bodies must return tensors")),
            }
        }
    }
    Ok(outs
        .into_iter()
        .map(|v| Some(RtValue::Sequence(v)))
        .collect())
}
