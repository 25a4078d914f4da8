//! Loss functions and a few small default-domain ops kept as custom ops:
//! `NegativeLogLikelihoodLoss`, `SoftmaxCrossEntropyLoss`, `BitCast`, `AffineGrid`, `Upsample`.

use mmq_ir::{Attr, ConstData, CustomOp, DType, OpKind, Storage};

use super::{Tail, attr, attr_i64, attr_str};
use crate::ops::data::map_any;
use crate::ops::util::{opt_tensor, tensor};
use crate::ops::{OpCtx, OpResult};
use crate::tensor::{RtValue, Tensor};

/// Runs the op when it is one of this file's ops.
pub(super) fn eval(t: Tail<'_, '_>) -> Option<OpResult> {
    let (cx, kind, c, inputs) = (t.cx, t.kind, t.c, t.inputs);
    Some(match kind {
        OpKind::NegativeLogLikelihoodLoss => nll_loss(cx, c, inputs, false),
        OpKind::SoftmaxCrossEntropyLoss => nll_loss(cx, c, inputs, true),
        OpKind::BitCast => bit_cast(cx, c, inputs),
        OpKind::AffineGrid => affine_grid(cx, c, inputs),
        OpKind::Upsample => upsample(cx, c, inputs),
        _ => return None,
    })
}

/// How the per-element losses are combined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reduction {
    None,
    Sum,
    Mean,
}

/// Log-softmax along axis 1 of a `[N, C, rest]` tensor held in `x`.
fn log_softmax_axis1(x: &mut [f64], n: usize, c: usize, rest: usize) {
    for b in 0..n {
        let base = b * c * rest;
        for r in 0..rest {
            let mut max = f64::NEG_INFINITY;
            for k in 0..c {
                max = max.max(x[base + k * rest + r]);
            }
            let mut sum = 0.0;
            for k in 0..c {
                sum += (x[base + k * rest + r] - max).exp();
            }
            let log_sum = sum.ln();
            for k in 0..c {
                let v = &mut x[base + k * rest + r];
                *v = *v - max - log_sum;
            }
        }
    }
}

/// The negative log-likelihood of `x` (`[N, C, rest]`, log-probabilities) at `target`
/// (`[N, rest]`), weighted by `weight[target]` and zero where the target is `ignore_index`.
///
/// Returns the per-element losses for [`Reduction::None`], else one value; the mean divides
/// by the sum of the weights of the targets that are not ignored.
fn nll_core(
    x: &[f64],
    target: &[i64],
    weight: Option<&[f64]>,
    (n, c, rest): (usize, usize, usize),
    ignore_index: Option<i64>,
    reduction: Reduction,
) -> Result<Vec<f64>, String> {
    let mut loss = vec![0.0; n * rest];
    let mut weights = vec![0.0; n * rest];
    for b in 0..n {
        for r in 0..rest {
            let i = b * rest + r;
            let t = target[i];
            if ignore_index == Some(t) {
                continue;
            }
            let k = usize::try_from(t)
                .ok()
                .filter(|&k| k < c)
                .ok_or_else(|| format!("target {t} at flat index {i} is outside [0, {c})"))?;
            let w = weight.map_or(1.0, |w| w[k]);
            loss[i] = -x[(b * c + k) * rest + r] * w;
            weights[i] = w;
        }
    }
    Ok(match reduction {
        Reduction::None => loss,
        Reduction::Sum => vec![loss.iter().sum()],
        Reduction::Mean => vec![loss.iter().sum::<f64>() / weights.iter().sum::<f64>()],
    })
}

fn nll_loss(cx: &OpCtx<'_>, c: &CustomOp, inputs: &[Option<RtValue>], softmax: bool) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let target = tensor(cx, inputs, 1)?;
    let weight = opt_tensor(inputs, 2);
    if !x.dtype.is_float() {
        return Err(cx.unsupported(format!("{} of {}", c.op_type, x.dtype)));
    }
    if x.rank() < 2 {
        return Err(cx.invalid(format!(
            "input must have rank >= 2 ([N, C, ...]), got shape {:?}",
            x.shape
        )));
    }
    let (n, classes) = (x.shape[0], x.shape[1]);
    let mut target_shape = vec![n];
    target_shape.extend_from_slice(&x.shape[2..]);
    if target.shape != target_shape {
        return Err(cx.invalid(format!(
            "target shape {:?} does not match input shape {:?} (expected {target_shape:?})",
            target.shape, x.shape
        )));
    }
    let reduction = match attr_str(c, "reduction").unwrap_or("mean") {
        "none" => Reduction::None,
        "sum" => Reduction::Sum,
        "mean" => Reduction::Mean,
        other => return Err(cx.invalid(format!("unknown reduction '{other}'"))),
    };
    let ignore_index = c
        .attrs
        .iter()
        .any(|(k, _)| k == "ignore_index")
        .then(|| attr_i64(c, "ignore_index", 0));
    let weight = match weight {
        Some(w) => {
            if w.shape != [classes] {
                return Err(cx.invalid(format!(
                    "weight shape {:?} must be [C] = [{classes}]",
                    w.shape
                )));
            }
            Some(w.to_f64()?)
        }
        None => None,
    };
    let rest: usize = x.shape[2..].iter().product();
    let mut xv = x.to_f64()?;
    if softmax {
        log_softmax_axis1(&mut xv, n, classes, rest);
    }
    let loss = nll_core(
        &xv,
        &target.to_i64()?,
        weight.as_deref(),
        (n, classes, rest),
        ignore_index,
        reduction,
    )
    .map_err(|e| cx.invalid(e))?;
    let loss_shape = if reduction == Reduction::None {
        target_shape
    } else {
        Vec::new()
    };
    let mut out = vec![Some(
        Tensor::from_f64_as(x.dtype, loss_shape, &loss)?.into(),
    )];
    if softmax && cx.num_outputs() > 1 {
        out.push(Some(
            Tensor::from_f64_as(x.dtype, x.shape.clone(), &xv)?.into(),
        ));
    }
    Ok(out)
}

fn bit_cast(cx: &OpCtx<'_>, c: &CustomOp, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let to = attr_i64(c, "to", 0);
    let to = i32::try_from(to)
        .ok()
        .and_then(DType::from_onnx_code)
        .ok_or_else(|| cx.invalid(format!("BitCast: unknown target type code {to}")))?;
    if x.dtype == DType::String || to == DType::String {
        return Err(cx.invalid("BitCast from or to string is not allowed"));
    }
    if x.dtype.bits() != to.bits() {
        return Err(cx.invalid(format!(
            "BitCast needs types of equal width, got {} ({} bits) and {to} ({} bits)",
            x.dtype,
            x.dtype.bits(),
            to.bits()
        )));
    }
    let bytes = x
        .to_bytes()
        .ok_or_else(|| cx.unsupported(format!("BitCast of {}", x.dtype)))?;
    let shape = x.shape.iter().map(|&d| d as i64).collect();
    let data = ConstData::new(None, to, shape, Storage::Inline(bytes.into()));
    Ok(vec![Some(Tensor::from_const(&data)?.into())])
}

/// The normalised coordinate of sample `i` of `n` along one axis in `[-1, 1]`.
fn grid_coord(i: usize, n: usize, align_corners: bool) -> f64 {
    if align_corners {
        if n <= 1 {
            -1.0
        } else {
            -1.0 + 2.0 * i as f64 / (n - 1) as f64
        }
    } else {
        -1.0 + (2 * i + 1) as f64 / n as f64
    }
}

fn affine_grid(cx: &OpCtx<'_>, c: &CustomOp, inputs: &[Option<RtValue>]) -> OpResult {
    let theta = tensor(cx, inputs, 0)?;
    let size = tensor(cx, inputs, 1)?.to_i64()?;
    let align = attr_i64(c, "align_corners", 0) != 0;
    let spatial = match size.len() {
        4 => 2,
        5 => 3,
        k => {
            return Err(cx.invalid(format!(
                "size must have 4 (2-D) or 5 (3-D) elements, got {k}"
            )));
        }
    };
    let dims = size
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<Result<Vec<usize>, _>>()
        .map_err(|_| cx.invalid(format!("size {size:?} has a negative entry")))?;
    let n = dims[0];
    if theta.shape != [n, spatial, spatial + 1] {
        return Err(cx.invalid(format!(
            "theta shape {:?} must be [{n}, {spatial}, {}]",
            theta.shape,
            spatial + 1
        )));
    }
    if !theta.dtype.is_float() {
        return Err(cx.unsupported(format!("AffineGrid of {}", theta.dtype)));
    }
    let th = theta.to_f64()?;
    // Spatial sizes as (D, H, W), D = 1 in 2-D.
    let (d, h, w) = if spatial == 2 {
        (1, dims[2], dims[3])
    } else {
        (dims[2], dims[3], dims[4])
    };
    let points = d * h * w;
    let mut out = Vec::with_capacity(n * points * spatial);
    let cols = spatial + 1;
    let mut homo = [0.0f64; 4];
    for b in 0..n {
        let m = &th[b * spatial * cols..(b + 1) * spatial * cols];
        for z in 0..d {
            for y in 0..h {
                for x in 0..w {
                    homo[0] = grid_coord(x, w, align);
                    homo[1] = grid_coord(y, h, align);
                    if spatial == 3 {
                        homo[2] = grid_coord(z, d, align);
                    }
                    homo[spatial] = 1.0;
                    for row in m.chunks_exact(cols) {
                        out.push(row.iter().zip(&homo).map(|(a, b)| a * b).sum::<f64>());
                    }
                }
            }
        }
    }
    let mut shape = vec![n];
    if spatial == 3 {
        shape.push(d);
    }
    shape.extend([h, w, spatial]);
    Ok(vec![Some(
        Tensor::from_f64_as(theta.dtype, shape, &out)?.into(),
    )])
}

/// The elements of `v` at `idx`.
fn gather<T: Clone>(v: &[T], idx: &[usize]) -> Vec<T> {
    idx.iter().map(|&i| v[i].clone()).collect()
}

/// The output size of an axis of `len` elements upsampled by `scale`.
fn scaled_len(len: usize, scale: f64) -> usize {
    (len as f64 * scale).floor().max(0.0) as usize
}

/// Linear interpolation of `x` (shape `shape`) along `axis` to `out_len` samples, with the
/// asymmetric coordinate `i / scale` clamped to the last input sample.
fn linear_axis(x: &[f64], shape: &[usize], axis: usize, out_len: usize, scale: f64) -> Vec<f64> {
    let outer: usize = shape[..axis].iter().product();
    let len = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let mut out = vec![0.0; outer * out_len * inner];
    if len == 0 {
        return out;
    }
    for i in 0..out_len {
        let pos = (i as f64 / scale).min((len - 1) as f64);
        let lo = pos.floor() as usize;
        let hi = (lo + 1).min(len - 1);
        let f = pos - lo as f64;
        for o in 0..outer {
            let src_lo = &x[(o * len + lo) * inner..][..inner];
            let src_hi = &x[(o * len + hi) * inner..][..inner];
            let dst = &mut out[(o * out_len + i) * inner..][..inner];
            for ((d, a), b) in dst.iter_mut().zip(src_lo).zip(src_hi) {
                *d = a * (1.0 - f) + b * f;
            }
        }
    }
    out
}

fn upsample(cx: &OpCtx<'_>, c: &CustomOp, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let scales: Vec<f64> = match opt_tensor(inputs, 1) {
        Some(s) => s.to_f64()?,
        None => match attr(c, "scales") {
            Some(Attr::Floats(v)) => v.iter().map(|&s| f64::from(s)).collect(),
            _ => return Err(cx.invalid("Upsample needs scales (input 1 or attribute)")),
        },
    };
    if scales.len() != x.rank() {
        return Err(cx.invalid(format!(
            "{} scales for an input of rank {}",
            scales.len(),
            x.rank()
        )));
    }
    if let Some(s) = scales.iter().find(|s| !(s.is_finite() && **s >= 1.0)) {
        return Err(cx.invalid(format!("Upsample scale {s} must be a finite value >= 1")));
    }
    let out_shape: Vec<usize> = x
        .shape
        .iter()
        .zip(&scales)
        .map(|(&d, &s)| scaled_len(d, s))
        .collect();
    cx.check_result(x.dtype, &out_shape)?;
    match attr_str(c, "mode").unwrap_or("nearest") {
        "nearest" => {
            let rank = x.rank();
            let mut in_strides = vec![1usize; rank];
            for a in (0..rank.saturating_sub(1)).rev() {
                in_strides[a] = in_strides[a + 1] * x.shape[a + 1];
            }
            // Per axis, the source offset of each output coordinate.
            let offsets: Vec<Vec<usize>> = (0..rank)
                .map(|a| {
                    (0..out_shape[a])
                        .map(|i| {
                            let src = ((i as f64 / scales[a]).floor() as usize)
                                .min(x.shape[a].saturating_sub(1));
                            src * in_strides[a]
                        })
                        .collect()
                })
                .collect();
            let total: usize = out_shape.iter().product();
            let mut idx = Vec::with_capacity(total);
            if total > 0 {
                let mut coord = vec![0usize; rank];
                for _ in 0..total {
                    idx.push((0..rank).map(|a| offsets[a][coord[a]]).sum::<usize>());
                    for a in (0..rank).rev() {
                        coord[a] += 1;
                        if coord[a] < out_shape[a] {
                            break;
                        }
                        coord[a] = 0;
                    }
                }
            }
            let data = map_any!(&x.data, |v, _get| gather(v, &idx));
            Ok(vec![Some(Tensor::new(x.dtype, out_shape, data)?.into())])
        }
        "linear" | "bilinear" => {
            if !x.dtype.is_float() {
                return Err(cx.unsupported(format!("linear Upsample of {}", x.dtype)));
            }
            let mut v = x.to_f64()?;
            let mut shape = x.shape.clone();
            for a in 0..shape.len() {
                if out_shape[a] != shape[a] || scales[a] != 1.0 {
                    v = linear_axis(&v, &shape, a, out_shape[a], scales[a]);
                    shape[a] = out_shape[a];
                }
            }
            Ok(vec![Some(Tensor::from_f64_as(x.dtype, shape, &v)?.into())])
        }
        other => Err(cx.invalid(format!("unknown Upsample mode '{other}'"))),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use mmq_ir::{Dim, Module, Op, Type};

    use super::*;
    use crate::interp::Interpreter;
    use crate::tensor::Data;

    /// Runs one custom op of the default domain on `x` and returns its first output.
    fn run_one(op_type: &str, attrs: Vec<(String, Attr)>, x: Tensor, out: DType) -> Tensor {
        let mut m = Module::new();
        let g = m.add_graph("main", None);
        let dims = x.shape.iter().map(|&d| Dim::known(d as i64)).collect();
        let xv = m.add_input(g, Some("x".into()), Type::tensor(x.dtype, dims));
        let n = m.add_node(
            g,
            Op::Custom(CustomOp {
                domain: String::new(),
                op_type: op_type.to_owned(),
                attrs,
            }),
            vec![Some(xv)],
            vec![Some((Some("y".into()), Type::tensor(out, vec![])))],
            None,
        );
        let y = m.nodes[n].outputs[0].expect("output");
        m.graphs[g].outputs.push(y);
        let inputs: HashMap<String, RtValue> = [("x".to_owned(), x.into())].into();
        let outs = Interpreter::new(&m).run(g, &inputs).expect("run");
        let t = outs[0].1.as_tensor().expect("a tensor");
        (**t).clone()
    }

    #[test]
    fn bit_cast_reinterprets_bytes() {
        let x = Tensor::from_f32(vec![2], vec![1.0, -2.0]).unwrap();
        let to = i64::from(DType::I32.onnx_code());
        let y = run_one("BitCast", vec![("to".into(), Attr::Int(to))], x, DType::I32);
        assert_eq!(y.shape, vec![2]);
        match y.data {
            Data::I32(v) => {
                assert_eq!(v, vec![1.0f32.to_bits() as i32, (-2.0f32).to_bits() as i32])
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn upsample_nearest_repeats() {
        let x = Tensor::from_i64(vec![1, 2], vec![5, 7]).unwrap();
        let attrs = vec![("scales".into(), Attr::Floats(vec![2.0, 1.5]))];
        let y = run_one("Upsample", attrs, x, DType::I64);
        assert_eq!(y.shape, vec![2, 3]);
        assert_eq!(y.to_i64().unwrap(), vec![5, 5, 7, 5, 5, 7]);
    }

    #[test]
    fn nll_reductions_and_ignore_index() {
        // N = 2, C = 3, no spatial dims.
        let x = [-1.0, -2.0, -3.0, -4.0, -5.0, -6.0];
        let t = [2, 0];
        let dims = (2, 3, 1);
        assert_eq!(
            nll_core(&x, &t, None, dims, None, Reduction::None).unwrap(),
            vec![3.0, 4.0]
        );
        assert_eq!(
            nll_core(&x, &t, None, dims, None, Reduction::Sum).unwrap(),
            vec![7.0]
        );
        assert_eq!(
            nll_core(&x, &t, None, dims, None, Reduction::Mean).unwrap(),
            vec![3.5]
        );
        // Ignoring the second target: the mean is over the remaining one.
        assert_eq!(
            nll_core(&x, &t, None, dims, Some(0), Reduction::Mean).unwrap(),
            vec![3.0]
        );
        // Weighted mean divides by the weights of the kept targets.
        let w = [0.5, 1.0, 2.0];
        assert_eq!(
            nll_core(&x, &t, Some(&w), dims, None, Reduction::Mean).unwrap(),
            vec![(3.0 * 2.0 + 4.0 * 0.5) / 2.5]
        );
        assert!(nll_core(&x, &[3, 0], None, dims, None, Reduction::Sum).is_err());
        assert!(nll_core(&x, &[-1, 0], None, dims, None, Reduction::Sum).is_err());
    }

    #[test]
    fn nll_spatial_layout() {
        // N = 1, C = 2, rest = 2: x[0, k, r].
        let x = [-1.0, -2.0, -3.0, -4.0];
        let t = [1, 0];
        assert_eq!(
            nll_core(&x, &t, None, (1, 2, 2), None, Reduction::None).unwrap(),
            vec![3.0, 2.0]
        );
    }

    #[test]
    fn log_softmax_rows_normalise() {
        let mut x = [1.0, 2.0, 3.0, 0.0, 0.0, 0.0];
        log_softmax_axis1(&mut x, 2, 3, 1);
        for row in x.chunks(3) {
            let s: f64 = row.iter().map(|v| v.exp()).sum();
            assert!((s - 1.0).abs() < 1e-12);
        }
        assert!((x[3] + 3f64.ln()).abs() < 1e-12);
    }

    #[test]
    fn linear_upsample_axis() {
        // [1, 3] doubled: positions 0, 0.5, 1, 1.5 -> clamped to 1.
        let v = linear_axis(&[1.0, 3.0], &[2], 0, 4, 2.0);
        assert_eq!(v, vec![1.0, 2.0, 3.0, 3.0]);
        assert_eq!(scaled_len(3, 1.5), 4);
    }

    #[test]
    fn grid_coords() {
        assert_eq!(grid_coord(0, 3, true), -1.0);
        assert_eq!(grid_coord(2, 3, true), 1.0);
        assert_eq!(grid_coord(0, 2, false), -0.5);
        assert_eq!(grid_coord(0, 1, true), -1.0);
    }
}
