//! Kernels: control flow (`If`, `Loop`, `Scan`), optionals and sequences, and the long tail of
//! default-domain ops that the IR keeps as [`mmq_ir::CustomOp`].
//!
//! Bodies run through [`OpCtx::run_graph`] in the scope of the node, so they see outer values.

mod loss;
mod rnn;
mod seq;
mod tail;

use std::sync::Arc;

use mmq_ir::{Attr, CustomOp, DType, GraphId, Op, OpKind};

use crate::error::KernelError;
use crate::ops::data;
use crate::ops::util::{self, tensor};
use crate::ops::{OpCtx, OpResult};
use crate::tensor::{Data, RtValue, Tensor};

/// Runs the node when it is one of this family's ops.
pub(crate) fn eval(cx: &OpCtx<'_>, inputs: &[Option<RtValue>]) -> Option<OpResult> {
    Some(match &cx.node.op {
        Op::If {
            then_branch,
            else_branch,
        } => if_op(cx, inputs, *then_branch, *else_branch),
        Op::Loop { body } => match body {
            Some(b) => loop_op(cx, inputs, *b),
            None => Err(cx.invalid("Loop has no body")),
        },
        Op::Scan {
            body,
            num_scan_inputs,
            scan_input_axes,
            scan_input_directions,
            scan_output_axes,
            scan_output_directions,
        } => match (body, num_scan_inputs) {
            (Some(body), Some(m)) => scan_op(
                cx,
                inputs,
                &ScanAttrs {
                    body: *body,
                    num_scan_inputs: *m,
                    input_axes: scan_input_axes.clone().unwrap_or_default(),
                    input_directions: scan_input_directions.clone().unwrap_or_default(),
                    output_axes: scan_output_axes.clone().unwrap_or_default(),
                    output_directions: scan_output_directions.clone().unwrap_or_default(),
                },
            ),
            _ => Err(cx.invalid("Scan needs the body and num_scan_inputs attributes")),
        },
        Op::Optional { .. } => Ok(vec![Some(RtValue::Optional(
            inputs.first().cloned().flatten().map(Box::new),
        ))]),
        Op::Custom(c) if c.domain.is_empty() || c.domain == "ai.onnx" => {
            return long_tail(cx, c, inputs);
        }
        // The typed long-tail ops (`family` sends only those here); their kernels read
        // attributes by name, as for a node kept opaque.
        op if op.domain().is_empty() => {
            let c = CustomOp {
                domain: String::new(),
                op_type: op.op_type().to_owned(),
                attrs: op
                    .attrs()
                    .into_iter()
                    .map(|(n, a)| (n.to_owned(), a))
                    .collect(),
            };
            return long_tail(cx, &c, inputs);
        }
        _ => return None,
    })
}

/// The sequence, signal, string, recurrent and loss ops.
fn long_tail(cx: &OpCtx<'_>, c: &CustomOp, inputs: &[Option<RtValue>]) -> Option<OpResult> {
    let t = Tail {
        cx,
        kind: OpKind::of(&c.domain, &c.op_type),
        c,
        inputs,
    };
    seq::eval(t)
        .or_else(|| tail::eval(t))
        .or_else(|| rnn::eval(t))
        .or_else(|| loss::eval(t))
}

/// A node of the long tail: its context, its kind, its attributes (as an opaque op) and its
/// operands.
#[derive(Clone, Copy)]
pub(super) struct Tail<'a, 'c> {
    cx: &'a OpCtx<'c>,
    kind: OpKind,
    c: &'a CustomOp,
    inputs: &'a [Option<RtValue>],
}

/// The single boolean of a condition tensor.
fn condition(cx: &OpCtx<'_>, t: &Tensor, what: &str) -> Result<bool, KernelError> {
    if t.len() != 1 {
        return Err(cx.invalid(format!(
            "{what} must hold one element, got shape {:?}",
            t.shape
        )));
    }
    Ok(match &t.data {
        Data::Bool(v) => v[0],
        _ => t.to_f64()?[0] != 0.0,
    })
}

fn if_op(
    cx: &OpCtx<'_>,
    inputs: &[Option<RtValue>],
    then_branch: Option<GraphId>,
    else_branch: Option<GraphId>,
) -> OpResult {
    let cond = condition(cx, tensor(cx, inputs, 0)?, "the condition")?;
    let branch = if cond { then_branch } else { else_branch };
    let branch = branch.ok_or_else(|| cx.invalid("If is missing a branch attribute"))?;
    let outs = cx.run_graph(branch, vec![])?;
    if outs.len() != cx.num_outputs() {
        return Err(cx.invalid(format!(
            "the {} branch returned {} values for {} outputs",
            if cond { "then" } else { "else" },
            outs.len(),
            cx.num_outputs()
        )));
    }
    Ok(outs.into_iter().map(Some).collect())
}

/// A scalar i64 tensor.
fn scalar_i64(v: i64) -> RtValue {
    Tensor {
        dtype: DType::I64,
        shape: vec![],
        data: Data::I64(vec![v]),
    }
    .into()
}

/// A scalar bool tensor.
fn scalar_bool(v: bool) -> RtValue {
    Tensor {
        dtype: DType::Bool,
        shape: vec![],
        data: Data::Bool(vec![v]),
    }
    .into()
}

/// An empty tensor standing for a scan output that got no iteration: leading dim 0, trailing
/// dims and dtype from the body's declared output when known (f32 and no trailing dims else).
fn empty_scan_output(
    cx: &OpCtx<'_>,
    body: GraphId,
    out_index: usize,
    at: usize,
) -> Result<Tensor, KernelError> {
    let m = cx.interp.module();
    let ty = m.graphs[body]
        .outputs
        .get(out_index)
        .map(|&v| m.value_type(v).clone());
    let dtype = ty.as_ref().and_then(|t| t.dtype()).unwrap_or(DType::F32);
    let mut shape: Vec<usize> = ty
        .as_ref()
        .and_then(|t| t.shape())
        .and_then(|dims| {
            dims.iter()
                .map(|d| d.as_known().and_then(|k| usize::try_from(k).ok()))
                .collect()
        })
        .unwrap_or_default();
    shape.insert(at.min(shape.len()), 0);
    Tensor::zeros(dtype, shape)
}

/// Stacks per-iteration scan outputs along a new axis `at`.
fn stack(cx: &OpCtx<'_>, parts: &[Arc<Tensor>], at: usize) -> Result<Tensor, KernelError> {
    let refs: Vec<&Tensor> = parts.iter().map(|t| t.as_ref()).collect();
    data::concat(&refs, at, true)
        .map_err(|e| cx.invalid(format!("scan outputs of different iterations differ: {e}")))
}

fn loop_op(cx: &OpCtx<'_>, inputs: &[Option<RtValue>], body: GraphId) -> OpResult {
    let max_trips = match inputs.first() {
        Some(Some(RtValue::Tensor(t))) => {
            let v = t.to_i64()?;
            Some(
                *v.first()
                    .ok_or_else(|| cx.invalid("the trip count M is empty"))?,
            )
        }
        _ => None,
    };
    let mut cond = match inputs.get(1) {
        Some(Some(RtValue::Tensor(t))) => Some(condition(cx, t, "the condition")?),
        _ => None,
    };
    let mut carried: Vec<RtValue> = inputs
        .iter()
        .skip(2)
        .enumerate()
        .map(|(i, v)| {
            v.clone()
                .ok_or_else(|| cx.invalid(format!("loop-carried input {i} is missing")))
        })
        .collect::<Result<_, _>>()?;
    let n_carried = carried.len();
    let n_body_outputs = cx.interp.module().graphs[body].outputs.len();
    if n_body_outputs < 1 + n_carried {
        return Err(cx.invalid(format!(
            "the body has {n_body_outputs} outputs, fewer than 1 + {n_carried} loop-carried values"
        )));
    }
    let n_scan = n_body_outputs - 1 - n_carried;
    let mut scans: Vec<Vec<Arc<Tensor>>> = vec![Vec::new(); n_scan];
    let mut i = 0i64;
    while max_trips.is_none_or(|m| i < m) && cond.unwrap_or(true) {
        let mut args = Vec::with_capacity(2 + n_carried);
        args.push(Some(scalar_i64(i)));
        args.push(Some(scalar_bool(cond.unwrap_or(true))));
        args.extend(carried.iter().cloned().map(Some));
        let mut outs = cx.run_graph(body, args)?.into_iter();
        let c = outs
            .next()
            .ok_or_else(|| cx.invalid("the body returned no condition"))?;
        let c = c
            .as_tensor()
            .ok_or_else(|| cx.invalid("the body's condition is not a tensor"))?;
        cond = Some(condition(cx, c, "the body's condition")?);
        carried = outs.by_ref().take(n_carried).collect();
        for (k, v) in outs.enumerate() {
            match v {
                RtValue::Tensor(t) => scans[k].push(t),
                _ => {
                    return Err(
                        cx.unsupported(format!("scan output {k} of the body is not a tensor"))
                    );
                }
            }
        }
        i += 1;
    }
    let mut results: Vec<Option<RtValue>> = carried.into_iter().map(Some).collect();
    for (k, parts) in scans.iter().enumerate() {
        let t = if parts.is_empty() {
            empty_scan_output(cx, body, 1 + n_carried + k, 0)?
        } else {
            stack(cx, parts, 0)?
        };
        results.push(Some(t.into()));
    }
    Ok(results)
}

struct ScanAttrs {
    body: GraphId,
    num_scan_inputs: i64,
    input_axes: Vec<i64>,
    input_directions: Vec<i64>,
    output_axes: Vec<i64>,
    output_directions: Vec<i64>,
}

fn scan_op(cx: &OpCtx<'_>, inputs: &[Option<RtValue>], at: &ScanAttrs) -> OpResult {
    if cx.opset < 9 {
        return scan8(cx, inputs, at);
    }
    let m = usize::try_from(at.num_scan_inputs)
        .ok()
        .filter(|&m| m <= inputs.len())
        .ok_or_else(|| {
            cx.invalid(format!(
                "num_scan_inputs {} does not fit {} inputs",
                at.num_scan_inputs,
                inputs.len()
            ))
        })?;
    let n = inputs.len() - m;
    let states: Vec<RtValue> = (0..n)
        .map(|i| {
            inputs[i]
                .clone()
                .ok_or_else(|| cx.invalid(format!("state input {i} is missing")))
        })
        .collect::<Result<_, _>>()?;
    let scan_inputs: Vec<Arc<Tensor>> = (n..n + m)
        .map(|i| tensor(cx, inputs, i).cloned())
        .collect::<Result<_, _>>()?;
    let outs = scan_core(cx, at, states, &scan_inputs)?;
    Ok(outs.into_iter().map(Some).collect())
}

/// Scan at opset 9+: `states` are the initial state values, `scan_inputs` the sequences.
fn scan_core(
    cx: &OpCtx<'_>,
    at: &ScanAttrs,
    mut states: Vec<RtValue>,
    scan_inputs: &[Arc<Tensor>],
) -> Result<Vec<RtValue>, KernelError> {
    let n = states.len();
    let m = scan_inputs.len();
    let mut axes = Vec::with_capacity(m);
    let mut seq_len: Option<usize> = None;
    for (j, t) in scan_inputs.iter().enumerate() {
        let a = util::axis(cx, at.input_axes.get(j).copied().unwrap_or(0), t.rank())?;
        if t.rank() == 0 {
            return Err(cx.invalid(format!("scan input {j} is a scalar")));
        }
        let len = t.shape[a];
        if seq_len.is_some_and(|l| l != len) {
            return Err(cx.invalid(format!(
                "scan input {j} has {len} steps along axis {a}, others have {}",
                seq_len.unwrap_or(0)
            )));
        }
        seq_len = Some(len);
        axes.push(a);
    }
    let seq_len = seq_len.unwrap_or(0);
    let n_body_outputs = cx.interp.module().graphs[at.body].outputs.len();
    if n_body_outputs < n {
        return Err(cx.invalid(format!(
            "the body has {n_body_outputs} outputs, fewer than {n} states"
        )));
    }
    let k = n_body_outputs - n;
    let mut scans: Vec<Vec<Arc<Tensor>>> = vec![Vec::with_capacity(seq_len); k];
    for t in 0..seq_len {
        let mut args: Vec<Option<RtValue>> = states.iter().cloned().map(Some).collect();
        for (j, x) in scan_inputs.iter().enumerate() {
            let idx = if at.input_directions.get(j).copied().unwrap_or(0) != 0 {
                seq_len - 1 - t
            } else {
                t
            };
            args.push(Some(data::select_axis(x, axes[j], idx).into()));
        }
        let mut outs = cx.run_graph(at.body, args)?.into_iter();
        states = outs.by_ref().take(n).collect();
        for (o, v) in outs.enumerate() {
            match v {
                RtValue::Tensor(t) => scans[o].push(t),
                _ => {
                    return Err(
                        cx.unsupported(format!("scan output {o} of the body is not a tensor"))
                    );
                }
            }
        }
    }
    let mut results = states;
    for (o, mut parts) in scans.into_iter().enumerate() {
        if at.output_directions.get(o).copied().unwrap_or(0) != 0 {
            parts.reverse();
        }
        let out_rank = parts.first().map_or(0, |p| p.rank()) + 1;
        let axis = util::axis(cx, at.output_axes.get(o).copied().unwrap_or(0), out_rank)?;
        let t = if parts.is_empty() {
            empty_scan_output(cx, at.body, n + o, axis)?
        } else {
            stack(cx, &parts, axis)?
        };
        results.push(t.into());
    }
    Ok(results)
}

/// Scan at opset 8: an optional `sequence_lens` first input and a leading batch axis on every
/// state and scan input; each batch entry is scanned on its own.
fn scan8(cx: &OpCtx<'_>, inputs: &[Option<RtValue>], at: &ScanAttrs) -> OpResult {
    let m = usize::try_from(at.num_scan_inputs)
        .ok()
        .filter(|&m| m < inputs.len())
        .ok_or_else(|| cx.invalid("num_scan_inputs does not fit the inputs"))?;
    let n = inputs.len() - 1 - m;
    let all: Vec<Arc<Tensor>> = (1..inputs.len())
        .map(|i| tensor(cx, inputs, i).cloned())
        .collect::<Result<_, _>>()?;
    let batch = all
        .first()
        .and_then(|t| t.shape.first().copied())
        .unwrap_or(0);
    if all.iter().any(|t| t.shape.first() != Some(&batch)) {
        return Err(cx.invalid("every state and scan input needs the same batch dim"));
    }
    if let Some(lens) = util::opt_tensor(inputs, 0) {
        let full = all
            .get(n)
            .and_then(|t| t.shape.get(1).copied())
            .unwrap_or(0);
        if lens.to_i64()?.iter().any(|&l| l != full as i64) {
            return Err(cx.unsupported("sequence_lens shorter than the scan inputs"));
        }
    }
    // The batch axis is gone inside each run, so the scan axes shift down by one.
    let per = ScanAttrs {
        body: at.body,
        num_scan_inputs: at.num_scan_inputs,
        input_axes: vec![0; m],
        input_directions: at.input_directions.clone(),
        output_axes: Vec::new(),
        output_directions: at.output_directions.clone(),
    };
    let mut per_batch: Vec<Vec<Arc<Tensor>>> = Vec::with_capacity(batch);
    for b in 0..batch {
        let states = all[..n]
            .iter()
            .map(|t| data::select_axis(t, 0, b).into())
            .collect();
        let scans: Vec<Arc<Tensor>> = all[n..]
            .iter()
            .map(|t| Arc::new(data::select_axis(t, 0, b)))
            .collect();
        let outs = scan_core(cx, &per, states, &scans)?;
        per_batch.push(
            outs.into_iter()
                .map(|v| match v {
                    RtValue::Tensor(t) => Ok(t),
                    _ => Err(cx.unsupported("Scan outputs must be tensors")),
                })
                .collect::<Result<_, _>>()?,
        );
    }
    let n_out = cx.num_outputs();
    let mut results = Vec::with_capacity(n_out);
    for o in 0..n_out {
        let parts: Vec<Arc<Tensor>> = per_batch
            .iter()
            .filter_map(|outs| outs.get(o).cloned())
            .collect();
        if parts.is_empty() {
            results.push(Some(empty_scan_output(cx, at.body, o, 0)?.into()));
        } else {
            results.push(Some(stack(cx, &parts, 0)?.into()));
        }
    }
    Ok(results)
}

/// The attribute `name` of a custom op.
fn attr<'a>(c: &'a CustomOp, name: &str) -> Option<&'a Attr> {
    c.attrs.iter().find(|(n, _)| n == name).map(|(_, a)| a)
}

/// An integer attribute of a custom op, or `default`.
fn attr_i64(c: &CustomOp, name: &str, default: i64) -> i64 {
    match attr(c, name) {
        Some(Attr::Int(v)) => *v,
        _ => default,
    }
}

/// A float attribute of a custom op, or `default`.
fn attr_f32(c: &CustomOp, name: &str, default: f32) -> f32 {
    match attr(c, name) {
        Some(Attr::Float(v)) => *v,
        _ => default,
    }
}

/// A string attribute of a custom op.
fn attr_str<'a>(c: &'a CustomOp, name: &str) -> Option<&'a str> {
    match attr(c, name) {
        Some(Attr::String(v)) => Some(v),
        _ => None,
    }
}

/// An integer-list attribute of a custom op.
fn attr_ints<'a>(c: &'a CustomOp, name: &str) -> Option<&'a [i64]> {
    match attr(c, name) {
        Some(Attr::Ints(v)) => Some(v),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
