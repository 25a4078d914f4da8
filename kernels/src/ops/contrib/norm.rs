//! Contrib kernels: normalizations over the last axis with an optional residual add
//! (`SkipLayerNormalization`, `SkipSimplifiedLayerNormalization`) and RMS normalization
//! (`SimplifiedLayerNormalization`, which ONNX Runtime registers in the default domain).
//!
//! Statistics are computed in f64 and results rounded once to the input's dtype.

use mmq_ir::Op;

use crate::error::KernelError;
use crate::ops::util::{axis as norm_axis, opt_tensor, tensor};
use crate::ops::{OpCtx, OpResult};
use crate::tensor::{RtValue, Tensor};

/// A float attribute (set, or its default in the op table), else `default`.
pub(super) fn float_attr(op: &Op, name: &str, default: f32) -> f32 {
    op.get(name).unwrap_or(default)
}

/// An integer attribute (set, or its default in the op table), else `default`.
pub(super) fn int_attr(op: &Op, name: &str, default: i64) -> i64 {
    op.get(name).unwrap_or(default)
}

/// A parameter of the normalized axis (`gamma`, `beta`, `bias`): 1-D of `hidden` elements.
fn param(cx: &OpCtx<'_>, t: &Tensor, name: &str, hidden: usize) -> Result<Vec<f64>, KernelError> {
    if t.len() != hidden || t.shape.iter().filter(|&&d| d != 1).count() > 1 {
        return Err(cx.invalid(format!(
            "{name} {:?} must have the hidden size {hidden}",
            t.shape
        )));
    }
    t.to_f64()
}

/// One row's mean (0 for RMS) and `1 / sqrt(var + eps)`.
fn stats(row: &[f64], rms: bool, eps: f64) -> (f64, f64) {
    let n = row.len().max(1) as f64;
    let mean = if rms {
        0.0
    } else {
        row.iter().sum::<f64>() / n
    };
    let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    (mean, 1.0 / (var + eps).sqrt())
}

/// Results for the declared output slots only.
fn declared(cx: &OpCtx<'_>, outs: Vec<Tensor>) -> Vec<Option<RtValue>> {
    outs.into_iter()
        .enumerate()
        .take(cx.num_outputs())
        .map(|(i, t)| {
            cx.node
                .outputs
                .get(i)
                .copied()
                .flatten()
                .map(|_| RtValue::Tensor(t.into()))
        })
        .collect()
}

/// `SkipLayerNormalization` (inputs input, skip, gamma, beta?, bias?) and
/// `SkipSimplifiedLayerNormalization` (inputs input, skip, gamma, bias?); results output,
/// mean, inv_std_var, input_skip_bias_sum. `skip` has the input's shape or broadcasts over its
/// leading dims.
pub(super) fn skip_norm(
    cx: &OpCtx<'_>,
    op: &Op,
    inputs: &[Option<RtValue>],
    rms: bool,
) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let skip = tensor(cx, inputs, 1)?;
    let gamma = tensor(cx, inputs, 2)?;
    if !x.dtype.is_float() {
        return Err(cx.unsupported(format!("input dtype {:?}", x.dtype)));
    }
    let shape = x.shape.clone();
    let hidden = *shape
        .last()
        .ok_or_else(|| cx.invalid("input must have rank at least 1"))?;
    let (beta, bias) = if rms {
        (None, opt_tensor(inputs, 3))
    } else {
        (opt_tensor(inputs, 3), opt_tensor(inputs, 4))
    };
    let gamma = param(cx, gamma, "gamma", hidden)?;
    let beta = beta.map(|b| param(cx, b, "beta", hidden)).transpose()?;
    let bias = bias.map(|b| param(cx, b, "bias", hidden)).transpose()?;
    let xv = x.to_f64()?;
    let sv = skip.to_f64()?;
    if sv.is_empty() && !xv.is_empty() || !sv.is_empty() && !xv.len().is_multiple_of(sv.len()) {
        return Err(cx.invalid(format!(
            "skip {:?} does not broadcast to input {shape:?}",
            skip.shape
        )));
    }
    if skip.shape.last() != Some(&hidden) {
        return Err(cx.invalid(format!(
            "skip {:?} must end in the hidden size {hidden}",
            skip.shape
        )));
    }
    let sum: Vec<f64> = xv
        .iter()
        .enumerate()
        .map(|(i, v)| v + sv[i % sv.len()] + bias.as_ref().map_or(0.0, |b| b[i % hidden]))
        .collect();
    let eps = f64::from(float_attr(op, "epsilon", 1e-12));
    let rows = sum.len().checked_div(hidden).unwrap_or(0);
    let mut y = vec![0.0; sum.len()];
    let mut means = vec![0.0; rows];
    let mut invs = vec![0.0; rows];
    for r in 0..rows {
        let row = &sum[r * hidden..(r + 1) * hidden];
        let (mean, inv) = stats(row, rms, eps);
        (means[r], invs[r]) = (mean, inv);
        for (j, v) in row.iter().enumerate() {
            let mut o = (v - mean) * inv * gamma[j];
            if let Some(b) = &beta {
                o += b[j];
            }
            y[r * hidden + j] = o;
        }
    }
    let mut sshape = shape.clone();
    if let Some(l) = sshape.last_mut() {
        *l = 1;
    }
    let outs = vec![
        Tensor::from_f64_as(x.dtype, shape.clone(), &y)?,
        Tensor::from_f64_as(mmq_ir::DType::F32, sshape.clone(), &means)?,
        Tensor::from_f64_as(mmq_ir::DType::F32, sshape, &invs)?,
        Tensor::from_f64_as(x.dtype, shape, &sum)?,
    ];
    Ok(declared(cx, outs))
}

/// `SimplifiedLayerNormalization` (inputs X, scale; attributes axis, epsilon): RMS
/// normalization over the axes from `axis` on; results Y and inv_std_var.
pub(super) fn simplified(cx: &OpCtx<'_>, op: &Op, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let scale = tensor(cx, inputs, 1)?;
    if !x.dtype.is_float() {
        return Err(cx.unsupported(format!("input dtype {:?}", x.dtype)));
    }
    let shape = x.shape.clone();
    let ax = norm_axis(cx, int_attr(op, "axis", -1), shape.len())?;
    let cols: usize = shape[ax..].iter().product();
    if scale.len() != cols {
        return Err(cx.invalid(format!(
            "scale {:?} must match the normalized dims {:?}",
            scale.shape,
            &shape[ax..]
        )));
    }
    let sc = scale.to_f64()?;
    let xv = x.to_f64()?;
    let eps = f64::from(float_attr(op, "epsilon", 1e-5));
    let rows = xv.len().checked_div(cols).unwrap_or(0);
    let mut y = vec![0.0; xv.len()];
    let mut invs = vec![0.0; rows];
    for r in 0..rows {
        let row = &xv[r * cols..(r + 1) * cols];
        let (_, inv) = stats(row, true, eps);
        invs[r] = inv;
        for (j, v) in row.iter().enumerate() {
            y[r * cols + j] = v * inv * sc[j];
        }
    }
    let mut ishape = shape[..ax].to_vec();
    ishape.resize(shape.len(), 1);
    let outs = vec![
        Tensor::from_f64_as(x.dtype, shape, &y)?,
        Tensor::from_f64_as(mmq_ir::DType::F32, ishape, &invs)?,
    ];
    Ok(declared(cx, outs))
}
