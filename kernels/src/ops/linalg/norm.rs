//! Normalizations: Batch, Layer, Instance, Group, RMS, Lp, LRN, MeanVariance.

use std::borrow::Cow;

use mmq_ir::Op;
use rayon::prelude::*;

use super::{Real, by_real, is_float};
use crate::error::KernelError;
use crate::ops::util::{
    axis as norm_axis, broadcast_indices, broadcast_shapes, opt_tensor, tensor,
};
use crate::ops::{OpCtx, OpResult};
use crate::tensor::{RtValue, Tensor};

/// Every normalization op.
pub(super) fn norm_op(cx: &OpCtx<'_>, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    if !is_float(x.dtype) {
        return Err(cx.unsupported(format!("{} on {}", cx.node.op.op_type(), x.dtype)));
    }
    by_real!(x.dtype, norm_float(cx, inputs, x))
}

fn load_param<'a, T: Real>(
    cx: &OpCtx<'_>,
    t: &'a Tensor,
    what: &str,
    len: usize,
) -> Result<Cow<'a, [T]>, KernelError> {
    if t.len() != len {
        return Err(cx.invalid(format!(
            "{what} of shape {:?} must have {len} elements",
            t.shape
        )));
    }
    T::load(t)
}

/// A per-row-element parameter (scale/bias) broadcast to a `[rows, cols]` view of `x`: either
/// indexed by column (`Cols`) or fully broadcast (`Full`).
enum Param<'a, T: Real> {
    Cols(Cow<'a, [T]>),
    Full(Cow<'a, [T]>, Vec<usize>),
}

impl<T: Real> Param<'_, T> {
    fn at(&self, i: usize, j: usize, cols: usize) -> T {
        match self {
            Param::Cols(v) => v[j],
            Param::Full(v, idx) => v[idx[i * cols + j]],
        }
    }
}

fn param<'a, T: Real>(
    cx: &OpCtx<'_>,
    t: &'a Tensor,
    xshape: &[usize],
    axis: usize,
) -> Result<Param<'a, T>, KernelError> {
    let v = T::load(t)?;
    let tail = &xshape[axis..];
    let mut s: &[usize] = &t.shape;
    while s.len() > tail.len() && s[0] == 1 {
        s = &s[1..];
    }
    if s == tail {
        return Ok(Param::Cols(v));
    }
    if broadcast_shapes(&[&t.shape, xshape]).as_deref() != Some(xshape) {
        return Err(cx.invalid(format!(
            "parameter of shape {:?} does not broadcast to {xshape:?}",
            t.shape
        )));
    }
    Ok(Param::Full(v, broadcast_indices(&t.shape, xshape)))
}

#[allow(clippy::too_many_lines, reason = "one arm per op")]
fn norm_float<T: Real>(
    cx: &OpCtx<'_>,
    inputs: &[Option<RtValue>],
    x: &Tensor,
) -> Result<Vec<Option<RtValue>>, KernelError> {
    let xv = T::load(x)?;
    let shape = x.shape.clone();
    let rank = shape.len();
    let n = xv.len();
    let store = |v: Vec<T>, s: Vec<usize>| -> Result<Option<RtValue>, KernelError> {
        Ok(Some(T::store(x.dtype, s, v)?.into()))
    };
    match &cx.node.op {
        Op::BatchNormalization {
            epsilon,
            momentum,
            training_mode,
            ..
        } => {
            if rank < 2 {
                return Err(cx.invalid(format!("X {shape:?} must have rank at least 2")));
            }
            let eps = f64::from(epsilon.unwrap_or(1e-5));
            let c = shape[1];
            let spatial: usize = shape[2..].iter().product();
            let scale = load_param::<T>(cx, tensor(cx, inputs, 1)?, "scale", c)?;
            let bias = load_param::<T>(cx, tensor(cx, inputs, 2)?, "B", c)?;
            let mean = load_param::<T>(cx, tensor(cx, inputs, 3)?, "input_mean", c)?;
            let var = load_param::<T>(cx, tensor(cx, inputs, 4)?, "input_var", c)?;
            let training = training_mode.unwrap_or(0) != 0 && cx.opset >= 14;
            let (use_mean, use_var): (Vec<f64>, Vec<f64>) = if training {
                let cnt = (n / c.max(1)) as f64;
                let mut m = vec![0f64; c];
                let mut q = vec![0f64; c];
                for (i, &v) in xv.iter().enumerate() {
                    m[(i / spatial.max(1)) % c] += v.to_f64();
                }
                m.iter_mut().for_each(|v| *v /= cnt);
                for (i, &v) in xv.iter().enumerate() {
                    let ch = (i / spatial.max(1)) % c;
                    let d = v.to_f64() - m[ch];
                    q[ch] += d * d;
                }
                q.iter_mut().for_each(|v| *v /= cnt);
                (m, q)
            } else {
                (
                    mean.iter().map(|v| v.to_f64()).collect(),
                    var.iter().map(|v| v.to_f64()).collect(),
                )
            };
            // y = x * a + b per channel.
            let a: Vec<T> = (0..c)
                .map(|ch| T::from_f64(scale[ch].to_f64() / (use_var[ch] + eps).sqrt()))
                .collect();
            let b: Vec<T> = (0..c)
                .map(|ch| T::from_f64(bias[ch].to_f64() - use_mean[ch] * a[ch].to_f64()))
                .collect();
            let mut y = vec![T::ZERO; n];
            for (i, (yc, xc)) in y
                .chunks_mut(spatial.max(1))
                .zip(xv.chunks(spatial.max(1)))
                .enumerate()
            {
                let ch = i % c;
                for (o, &v) in yc.iter_mut().zip(xc) {
                    *o = v * a[ch] + b[ch];
                }
            }
            let mut outs = vec![store(y, shape.clone())?];
            if training {
                let mom = f64::from(momentum.unwrap_or(0.9));
                let rm: Vec<T> = (0..c)
                    .map(|ch| T::from_f64(mean[ch].to_f64() * mom + use_mean[ch] * (1.0 - mom)))
                    .collect();
                let rv: Vec<T> = (0..c)
                    .map(|ch| T::from_f64(var[ch].to_f64() * mom + use_var[ch] * (1.0 - mom)))
                    .collect();
                outs.push(store(rm, vec![c])?);
                outs.push(store(rv, vec![c])?);
            }
            Ok(outs)
        }
        Op::LayerNormalization { axis, epsilon, .. }
        | Op::RMSNormalization { axis, epsilon, .. } => {
            let rms = matches!(cx.node.op, Op::RMSNormalization { .. });
            let ax = norm_axis(cx, axis.unwrap_or(-1), rank)?;
            let eps = f64::from(epsilon.unwrap_or(1e-5));
            let cols: usize = shape[ax..].iter().product();
            let rows: usize = shape[..ax].iter().product();
            let scale = param::<T>(cx, tensor(cx, inputs, 1)?, &shape, ax)?;
            let bias = if rms {
                None
            } else {
                opt_tensor(inputs, 2)
                    .map(|b| param::<T>(cx, b, &shape, ax))
                    .transpose()?
            };
            let mut y = vec![T::ZERO; n];
            let mut means = vec![T::ZERO; rows];
            let mut invs = vec![T::ZERO; rows];
            let row = |i: usize, yr: &mut [T]| -> (T, T) {
                let xr = &xv[i * cols..(i + 1) * cols];
                let mean = if rms {
                    0.0
                } else {
                    xr.iter().map(|v| v.to_f64()).sum::<f64>() / cols as f64
                };
                let var = xr
                    .iter()
                    .map(|v| {
                        let d = v.to_f64() - mean;
                        d * d
                    })
                    .sum::<f64>()
                    / cols as f64;
                let inv = 1.0 / (var + eps).sqrt();
                let (tm, ti) = (T::from_f64(mean), T::from_f64(inv));
                for (j, (o, &v)) in yr.iter_mut().zip(xr).enumerate() {
                    let mut r = (v - tm) * ti * scale.at(i, j, cols);
                    if let Some(b) = &bias {
                        r += b.at(i, j, cols);
                    }
                    *o = r;
                }
                (tm, ti)
            };
            if cols > 0 {
                if n >= 1 << 16 && rows > 1 {
                    y.par_chunks_mut(cols)
                        .zip(means.par_iter_mut().zip(invs.par_iter_mut()))
                        .enumerate()
                        .for_each(|(i, (yr, (m, s)))| (*m, *s) = row(i, yr));
                } else {
                    for (i, yr) in y.chunks_mut(cols).enumerate() {
                        (means[i], invs[i]) = row(i, yr);
                    }
                }
            }
            let mut rshape = shape[..ax].to_vec();
            rshape.resize(rank, 1);
            let mut outs = vec![store(y, shape.clone())?];
            if !rms {
                outs.push(store(means, rshape.clone())?);
                outs.push(store(invs, rshape)?);
            }
            Ok(outs)
        }
        Op::InstanceNormalization { epsilon } | Op::GroupNormalization { epsilon, .. } => {
            if rank < 2 {
                return Err(cx.invalid(format!("X {shape:?} must have rank at least 2")));
            }
            let eps = f64::from(epsilon.unwrap_or(1e-5));
            let c = shape[1];
            let (groups, per_group_params) = match &cx.node.op {
                Op::GroupNormalization { num_groups, .. } => {
                    let g = num_groups.ok_or_else(|| cx.invalid("num_groups is required"))?;
                    if g < 1 || !c.is_multiple_of(g as usize) {
                        return Err(
                            cx.invalid(format!("num_groups {g} does not divide {c} channels"))
                        );
                    }
                    (g as usize, cx.opset < 21)
                }
                _ => (c, false),
            };
            let plen = if per_group_params { groups } else { c };
            let scale = load_param::<T>(cx, tensor(cx, inputs, 1)?, "scale", plen)?;
            let bias = load_param::<T>(cx, tensor(cx, inputs, 2)?, "bias", plen)?;
            let spatial: usize = shape[2..].iter().product();
            let cg = c / groups.max(1);
            let block = cg * spatial;
            let mut y = vec![T::ZERO; n];
            if block > 0 {
                for (bi, (yb, xb)) in y.chunks_mut(block).zip(xv.chunks(block)).enumerate() {
                    let g = bi % groups;
                    let mean = xb.iter().map(|v| v.to_f64()).sum::<f64>() / block as f64;
                    let var =
                        xb.iter().map(|v| (v.to_f64() - mean).powi(2)).sum::<f64>() / block as f64;
                    let inv = 1.0 / (var + eps).sqrt();
                    for (k, (yc, xc)) in yb
                        .chunks_mut(spatial.max(1))
                        .zip(xb.chunks(spatial.max(1)))
                        .enumerate()
                    {
                        let p = if per_group_params { g } else { g * cg + k };
                        let a = scale[p].to_f64() * inv;
                        let b = bias[p].to_f64() - mean * a;
                        let (a, b) = (T::from_f64(a), T::from_f64(b));
                        for (o, &v) in yc.iter_mut().zip(xc) {
                            *o = v * a + b;
                        }
                    }
                }
            }
            Ok(vec![store(y, shape)?])
        }
        Op::LpNormalization { axis, p } => {
            let ax = norm_axis(cx, axis.unwrap_or(-1), rank)?;
            let p = p.unwrap_or(2);
            if p != 1 && p != 2 {
                return Err(cx.invalid(format!("p must be 1 or 2, got {p}")));
            }
            let (outer, len): (usize, usize) = (shape[..ax].iter().product(), shape[ax]);
            let inner: usize = shape[ax + 1..].iter().product();
            let mut y = vec![T::ZERO; n];
            for o in 0..outer {
                for i in 0..inner {
                    let at = |k: usize| o * len * inner + k * inner + i;
                    let s: f64 = (0..len)
                        .map(|k| {
                            let v = xv[at(k)].to_f64();
                            if p == 1 { v.abs() } else { v * v }
                        })
                        .sum();
                    let norm = if p == 1 { s } else { s.sqrt() };
                    for k in 0..len {
                        y[at(k)] = if norm == 0.0 {
                            T::ZERO
                        } else {
                            T::from_f64(xv[at(k)].to_f64() / norm)
                        };
                    }
                }
            }
            Ok(vec![store(y, shape)?])
        }
        Op::LRN {
            alpha,
            beta,
            bias,
            size,
        } => {
            let size = size.ok_or_else(|| cx.invalid("size is required"))?;
            if size < 1 || rank < 2 {
                return Err(cx.invalid(format!("size {size} / X {shape:?} are invalid")));
            }
            let (alpha, beta, bias) = (
                f64::from(alpha.unwrap_or(1e-4)),
                f64::from(beta.unwrap_or(0.75)),
                f64::from(bias.unwrap_or(1.0)),
            );
            let c = shape[1];
            let spatial: usize = shape[2..].iter().product();
            let (lo, hi) = (((size - 1) / 2) as usize, (size as usize - 1).div_ceil(2));
            let mut y = vec![T::ZERO; n];
            for img in 0..shape[0] {
                for ch in 0..c {
                    let from = ch.saturating_sub(lo);
                    let to = (ch + hi).min(c - 1);
                    for s in 0..spatial {
                        let sq: f64 = (from..=to)
                            .map(|k| xv[(img * c + k) * spatial + s].to_f64().powi(2))
                            .sum();
                        let i = (img * c + ch) * spatial + s;
                        y[i] = T::from_f64(
                            xv[i].to_f64() / (bias + alpha / size as f64 * sq).powf(beta),
                        );
                    }
                }
            }
            Ok(vec![store(y, shape)?])
        }
        Op::MeanVarianceNormalization { axes } => {
            let axes: Vec<i64> = axes.clone().unwrap_or_else(|| vec![0, 2, 3]);
            let mut reduce = vec![false; rank];
            for &a in &axes {
                reduce[norm_axis(cx, a, rank)?] = true;
            }
            // Group id of each element: its index over the kept axes.
            let kept: Vec<usize> = (0..rank).filter(|&d| !reduce[d]).collect();
            let groups: usize = kept.iter().map(|&d| shape[d]).product();
            let strides = crate::ops::util::strides(&shape);
            let gid = |i: usize| {
                kept.iter().fold(0usize, |acc, &d| {
                    acc * shape[d] + (i / strides[d]) % shape[d]
                })
            };
            let mut s1 = vec![0f64; groups];
            let mut s2 = vec![0f64; groups];
            let mut cnt = vec![0usize; groups];
            for (i, &v) in xv.iter().enumerate() {
                let g = gid(i);
                let v = v.to_f64();
                s1[g] += v;
                s2[g] += v * v;
                cnt[g] += 1;
            }
            let y: Vec<T> = xv
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    let g = gid(i);
                    let m = s1[g] / cnt[g] as f64;
                    let var = s2[g] / cnt[g] as f64 - m * m;
                    T::from_f64((v.to_f64() - m) / (var.max(0.0).sqrt() + 1e-9))
                })
                .collect();
            Ok(vec![store(y, shape)?])
        }
        _ => Err(cx.invalid("not a normalization op")),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{close, f32t, out, run_op};
    use mmq_ir::Op;

    #[test]
    fn layer_norm_outputs() {
        let op = Op::LayerNormalization {
            axis: None,
            epsilon: Some(0.0),
            stash_type: None,
        };
        let x = [1.0f32, 3.0, 2.0, 6.0];
        let r = run_op(
            op,
            vec![
                f32t(&[2, 2], &x),
                f32t(&[2], &[1.0, 2.0]),
                f32t(&[2], &[0.0, 1.0]),
            ],
            3,
            17,
        )
        .expect("run");
        close(&out(&r, 0).1, &[-1.0, 3.0, -1.0, 3.0], 1e-6);
        assert_eq!(out(&r, 1), (vec![2, 1], vec![2.0, 4.0]));
        close(&out(&r, 2).1, &[1.0, 0.5], 1e-6);
    }

    #[test]
    fn batch_norm_inference_and_training() {
        let x = [1.0f32, 3.0, 10.0, 20.0];
        let ins = || {
            vec![
                f32t(&[1, 2, 2], &x),
                f32t(&[2], &[1.0, 1.0]),
                f32t(&[2], &[0.0, 0.0]),
                f32t(&[2], &[2.0, 15.0]),
                f32t(&[2], &[1.0, 25.0]),
            ]
        };
        let op = |t: Option<i64>| Op::BatchNormalization {
            epsilon: Some(0.0),
            momentum: None,
            training_mode: t,
            spatial: None,
            is_test: None,
        };
        let r = run_op(op(None), ins(), 1, 15).expect("run");
        close(&out(&r, 0).1, &[-1.0, 1.0, -1.0, 1.0], 1e-6);
        let r = run_op(op(Some(1)), ins(), 3, 15).expect("run");
        close(&out(&r, 0).1, &[-1.0, 1.0, -1.0, 1.0], 1e-6);
        // running mean = 0.9 * input + 0.1 * batch
        close(&out(&r, 1).1, &[2.0, 15.0], 1e-6);
        close(&out(&r, 2).1, &[0.9 + 0.1, 22.5 + 2.5], 1e-6);
    }

    #[test]
    fn group_norm_opsets_and_lp() {
        let x = [1.0f32, 3.0, 5.0, 7.0];
        let op = Op::GroupNormalization {
            epsilon: Some(0.0),
            num_groups: Some(1),
            stash_type: None,
        };
        // Opset 21: per-channel scale.
        let r = run_op(
            op.clone(),
            vec![
                f32t(&[1, 2, 2], &x),
                f32t(&[2], &[1.0, 2.0]),
                f32t(&[2], &[0.0, 0.0]),
            ],
            1,
            21,
        )
        .expect("run");
        let s = 5f64.sqrt();
        close(&out(&r, 0).1, &[-3.0 / s, -1.0 / s, 2.0 / s, 6.0 / s], 1e-6);
        // Opset 18: per-group scale.
        let r = run_op(
            op,
            vec![f32t(&[1, 2, 2], &x), f32t(&[1], &[2.0]), f32t(&[1], &[0.0])],
            1,
            18,
        )
        .expect("run");
        close(&out(&r, 0).1, &[-6.0 / s, -2.0 / s, 2.0 / s, 6.0 / s], 1e-6);
        let r = run_op(
            Op::LpNormalization {
                axis: None,
                p: Some(1),
            },
            vec![f32t(&[2], &[3.0, -1.0])],
            1,
            17,
        )
        .expect("run");
        close(&out(&r, 0).1, &[0.75, -0.25], 1e-6);
    }
}
