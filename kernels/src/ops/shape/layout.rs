//! Ops that rearrange elements by shape alone: reshapes, transposes, slices, concatenation,
//! splits, broadcasts, tiling, padding, depth/space shuffles.

use crate::error::KernelError;
use crate::ops::data::{
    self, append, axis_in, ints, istrides, like, norm_axes, sdim, strided, take,
};
use crate::ops::shape::single;
use crate::ops::util::{broadcast_shapes, opt_tensor, strides, tensor};
use crate::ops::{OpCtx, OpResult};
use crate::tensor::{RtValue, Tensor};

/// The same elements under a new shape (one copy of the storage).
fn reshaped(t: &Tensor, shape: Vec<usize>) -> Tensor {
    Tensor {
        dtype: t.dtype,
        shape,
        data: t.data.clone(),
    }
}

/// Axes from the attribute (before opset 13) or the operand `i` (from 13).
fn axes_operand(
    cx: &OpCtx<'_>,
    inputs: &[Option<RtValue>],
    attr: Option<&[i64]>,
    i: usize,
) -> Result<Option<Vec<i64>>, KernelError> {
    if cx.opset < 13 {
        return Ok(attr.map(<[i64]>::to_vec));
    }
    match opt_tensor(inputs, i) {
        Some(t) => Ok(Some(ints(cx, t, "axes")?)),
        None => Ok(attr.map(<[i64]>::to_vec)),
    }
}

pub(super) fn reshape(cx: &OpCtx<'_>, inputs: &[Option<RtValue>], allowzero: bool) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let spec = ints(cx, tensor(cx, inputs, 1)?, "shape")?;
    let mut shape = Vec::with_capacity(spec.len());
    let mut infer = None;
    for (i, &d) in spec.iter().enumerate() {
        match d {
            -1 if infer.is_none() => {
                infer = Some(i);
                shape.push(1);
            }
            -1 => return Err(cx.invalid("shape has more than one -1")),
            0 if !allowzero => match x.shape.get(i) {
                Some(&d) => shape.push(d),
                None => {
                    return Err(cx.invalid(format!(
                        "shape {spec:?}: 0 at position {i} copies a dim the input of shape {:?} \
                         does not have",
                        x.shape
                    )));
                }
            },
            d if d < 0 => return Err(cx.invalid(format!("shape {spec:?} has the dim {d}"))),
            d => shape.push(d as usize),
        }
    }
    let n = x.len();
    if let Some(i) = infer {
        let rest: usize = shape.iter().product();
        if rest == 0 || n % rest != 0 {
            return Err(cx.invalid(format!(
                "cannot reshape {:?} to {spec:?}: -1 cannot be inferred",
                x.shape
            )));
        }
        shape[i] = n / rest;
    }
    if shape.iter().product::<usize>() != n {
        return Err(cx.invalid(format!(
            "cannot reshape {:?} ({n} elements) to {spec:?}",
            x.shape
        )));
    }
    single(reshaped(x, shape))
}

pub(super) fn squeeze(
    cx: &OpCtx<'_>,
    inputs: &[Option<RtValue>],
    attr: Option<&[i64]>,
) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let shape = match axes_operand(cx, inputs, attr, 1)? {
        None => x.shape.iter().copied().filter(|&d| d != 1).collect(),
        Some(axes) => {
            let axes = norm_axes(cx, &axes, x.rank())?;
            for &a in &axes {
                if x.shape[a] != 1 {
                    return Err(cx.invalid(format!(
                        "cannot squeeze axis {a} of size {} (shape {:?})",
                        x.shape[a], x.shape
                    )));
                }
            }
            x.shape
                .iter()
                .enumerate()
                .filter(|(i, _)| !axes.contains(i))
                .map(|(_, &d)| d)
                .collect()
        }
    };
    single(reshaped(x, shape))
}

pub(super) fn unsqueeze(
    cx: &OpCtx<'_>,
    inputs: &[Option<RtValue>],
    attr: Option<&[i64]>,
) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let axes = axes_operand(cx, inputs, attr, 1)?.ok_or_else(|| cx.invalid("axes are required"))?;
    let rank = x.rank() + axes.len();
    let axes = norm_axes(cx, &axes, rank)?;
    let mut dims = x.shape.iter();
    let shape = (0..rank)
        .map(|i| {
            if axes.contains(&i) {
                1
            } else {
                dims.next().copied().unwrap_or(1)
            }
        })
        .collect();
    single(reshaped(x, shape))
}

pub(super) fn flatten(cx: &OpCtx<'_>, inputs: &[Option<RtValue>], axis: i64) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let r = sdim(x.rank());
    if axis < -r || axis > r {
        return Err(cx.invalid(format!("axis {axis} is out of range for rank {r}")));
    }
    let a = if axis < 0 { axis + r } else { axis } as usize;
    let outer = x.shape[..a].iter().product();
    let inner = x.shape[a..].iter().product();
    single(reshaped(x, vec![outer, inner]))
}

pub(super) fn transpose(
    cx: &OpCtx<'_>,
    inputs: &[Option<RtValue>],
    perm: Option<&[i64]>,
) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let r = x.rank();
    let perm: Vec<usize> = match perm {
        None => (0..r).rev().collect(),
        Some(p) => {
            if p.len() != r {
                return Err(cx.invalid(format!("perm {p:?} does not fit rank {r}")));
            }
            norm_axes(cx, p, r)?
        }
    };
    let st = istrides(&x.shape);
    let shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
    let pst: Vec<isize> = perm.iter().map(|&p| st[p]).collect();
    let data = strided(&x.data, 0, &shape, &pst);
    single(like(x, shape, data)?)
}

/// The first index and the length of a slice of a dim (negative bounds count from the end;
/// bounds are clamped to the dim, `step` is non-zero).
fn slice_axis(dim: i64, start: i64, end: i64, step: i64) -> (i64, i64) {
    let norm = |v: i64| if v < 0 { v.saturating_add(dim) } else { v };
    let (start, end) = (norm(start), norm(end));
    if dim == 0 {
        (0, 0)
    } else if step > 0 {
        let s = start.clamp(0, dim);
        let e = end.clamp(0, dim);
        // ceil((e - s) / step) without overflow for steps near i64::MAX.
        (s, if e > s { (e - s - 1) / step + 1 } else { 0 })
    } else {
        let s = start.clamp(0, dim - 1);
        let e = end.clamp(-1, dim - 1);
        // The same with |step| (i64::MIN has no i64 negation).
        let len = ((s - e - 1) as u64 / step.unsigned_abs()) as i64 + 1;
        (s, if s > e { len } else { 0 })
    }
}

pub(super) fn slice(
    cx: &OpCtx<'_>,
    inputs: &[Option<RtValue>],
    a_starts: &Option<Vec<i64>>,
    a_ends: &Option<Vec<i64>>,
    a_axes: &Option<Vec<i64>>,
) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let (starts, ends, axes, steps) = if cx.opset < 10 {
        let starts = a_starts
            .clone()
            .ok_or_else(|| cx.invalid("starts are required"))?;
        let ends = a_ends
            .clone()
            .ok_or_else(|| cx.invalid("ends are required"))?;
        (starts, ends, a_axes.clone(), None)
    } else {
        let starts = ints(cx, tensor(cx, inputs, 1)?, "starts")?;
        let ends = ints(cx, tensor(cx, inputs, 2)?, "ends")?;
        let axes = opt_tensor(inputs, 3)
            .map(|t| ints(cx, t, "axes"))
            .transpose()?;
        let steps = opt_tensor(inputs, 4)
            .map(|t| ints(cx, t, "steps"))
            .transpose()?;
        (starts, ends, axes, steps)
    };
    let r = x.rank();
    let axes = match axes {
        Some(a) => norm_axes(cx, &a, r)?,
        None => (0..starts.len()).collect(),
    };
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err(cx.invalid(format!(
            "starts ({}), ends ({}), axes ({}) and steps ({}) differ in length",
            starts.len(),
            ends.len(),
            axes.len(),
            steps.len()
        )));
    }
    if let Some(&a) = axes.iter().find(|&&a| a >= r) {
        return Err(cx.invalid(format!("axis {a} is out of range for rank {r}")));
    }
    let st = istrides(&x.shape);
    let mut shape = x.shape.clone();
    let mut pst = st.clone();
    let mut base = 0isize;
    for (k, &a) in axes.iter().enumerate() {
        let dim = sdim(x.shape[a]);
        let step = steps[k];
        if step == 0 {
            return Err(cx.invalid(format!("step 0 on axis {a}")));
        }
        let (start, len) = slice_axis(dim, starts[k], ends[k], step);
        shape[a] = len as usize;
        if len > 0 {
            base += start as isize * st[a];
        }
        // One element or none: the stride is never taken (and `step` may be near i64::MAX).
        pst[a] = if len > 1 { st[a] * step as isize } else { 0 };
    }
    let data = if shape.contains(&0) {
        take(&x.data, &[])
    } else {
        strided(&x.data, base as usize, &shape, &pst)
    };
    single(like(x, shape, data)?)
}

pub(super) fn concat(cx: &OpCtx<'_>, inputs: &[Option<RtValue>], axis: Option<i64>) -> OpResult {
    let axis = match axis {
        Some(a) => a,
        None if cx.opset < 4 => 1,
        None => return Err(cx.invalid("axis is required")),
    };
    let ts: Vec<&Tensor> = (0..inputs.len())
        .map(|i| tensor(cx, inputs, i).map(|t| &**t))
        .collect::<Result<_, _>>()?;
    let first = *ts.first().ok_or_else(|| cx.invalid("no operands"))?;
    let a = axis_in(cx, axis, first.rank())?;
    single(data::concat(&ts, a, false).map_err(|e| cx.invalid(e))?)
}

pub(super) fn split(
    cx: &OpCtx<'_>,
    inputs: &[Option<RtValue>],
    axis: i64,
    num_outputs: Option<i64>,
    attr: Option<&[i64]>,
) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let a = axis_in(cx, axis, x.rank())?;
    let dim = x.shape[a];
    let split = if cx.opset >= 13 {
        opt_tensor(inputs, 1)
            .map(|t| ints(cx, t, "split"))
            .transpose()?
    } else {
        attr.map(<[i64]>::to_vec)
    };
    let n_out = cx.num_outputs();
    let sizes: Vec<usize> = match split {
        Some(s) => {
            if s.iter().any(|&v| v < 0) || s.iter().sum::<i64>() != sdim(dim) {
                return Err(cx.invalid(format!(
                    "split {s:?} does not add up to the dim {dim} of axis {a}"
                )));
            }
            s.iter().map(|&v| v as usize).collect()
        }
        None => {
            let n = match num_outputs {
                Some(n) if n > 0 => n as usize,
                Some(n) => return Err(cx.invalid(format!("num_outputs {n} is not positive"))),
                None => n_out,
            };
            if n == 0 {
                return Err(cx.invalid("no outputs"));
            }
            if num_outputs.is_none() && dim % n != 0 {
                return Err(cx.invalid(format!(
                    "the dim {dim} of axis {a} does not split evenly into {n} outputs"
                )));
            }
            let chunk = dim.div_ceil(n);
            let mut left = dim;
            (0..n)
                .map(|_| {
                    let c = chunk.min(left);
                    left -= c;
                    c
                })
                .collect()
        }
    };
    if sizes.len() != n_out {
        return Err(cx.invalid(format!("{} pieces for {n_out} outputs", sizes.len())));
    }
    let outer: usize = x.shape[..a].iter().product();
    let inner: usize = x.shape[a + 1..].iter().product();
    let mut offset = 0;
    let mut outs = Vec::with_capacity(n_out);
    for s in sizes {
        let mut shape = x.shape.clone();
        shape[a] = s;
        let data = strided(
            &x.data,
            offset * inner,
            &[outer, s * inner],
            &[(dim * inner) as isize, 1],
        );
        offset += s;
        outs.push(Some(RtValue::from(like(x, shape, data)?)));
    }
    Ok(outs)
}

/// Strides of `t` read as a tensor of `out` (numpy broadcasting: 0 on broadcast axes).
fn broadcast_strides(t_shape: &[usize], out: &[usize]) -> Vec<isize> {
    let st = istrides(t_shape);
    let off = out.len() - t_shape.len();
    (0..out.len())
        .map(|i| {
            if i < off || t_shape[i - off] == 1 {
                0
            } else {
                st[i - off]
            }
        })
        .collect()
}

pub(super) fn expand(cx: &OpCtx<'_>, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let spec = ints(cx, tensor(cx, inputs, 1)?, "shape")?;
    if let Some(d) = spec.iter().find(|&&d| d < 0) {
        return Err(cx.invalid(format!("shape {spec:?} has the dim {d}")));
    }
    let spec: Vec<usize> = spec.iter().map(|&d| d as usize).collect();
    let shape = broadcast_shapes(&[&x.shape, &spec])
        .ok_or_else(|| cx.invalid(format!("{:?} does not broadcast to {spec:?}", x.shape)))?;
    if shape == x.shape {
        return single(reshaped(x, shape));
    }
    cx.check_result(x.dtype, &shape)?;
    let data = strided(&x.data, 0, &shape, &broadcast_strides(&x.shape, &shape));
    single(like(x, shape, data)?)
}

pub(super) fn tile(cx: &OpCtx<'_>, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let reps = ints(cx, tensor(cx, inputs, 1)?, "repeats")?;
    if reps.len() != x.rank() || reps.iter().any(|&r| r < 0) {
        return Err(cx.invalid(format!(
            "repeats {reps:?} do not fit the input of shape {:?}",
            x.shape
        )));
    }
    let st = istrides(&x.shape);
    let mut vshape = Vec::with_capacity(2 * x.rank());
    let mut vst = Vec::with_capacity(2 * x.rank());
    for (i, &r) in reps.iter().enumerate() {
        vshape.extend([r as usize, x.shape[i]]);
        vst.extend([0, st[i]]);
    }
    let reps: Vec<usize> = reps.iter().map(|&r| r as usize).collect();
    let shape = cx.scaled_dims(&x.shape, &reps)?;
    cx.check_result(x.dtype, &shape)?;
    let data = if shape.contains(&0) {
        take(&x.data, &[])
    } else {
        strided(&x.data, 0, &vshape, &vst)
    };
    single(like(x, shape, data)?)
}

/// The input index that padded position `i` (relative to the unpadded start) reads in `mode`;
/// `None` for the constant.
fn pad_source(i: i64, dim: i64, mode: &str) -> Option<i64> {
    if (0..dim).contains(&i) {
        return Some(i);
    }
    match mode {
        "edge" => Some(i.clamp(0, dim - 1)),
        "wrap" => Some(i.rem_euclid(dim)),
        "reflect" if dim == 1 => Some(0),
        "reflect" => {
            let p = 2 * (dim - 1);
            let m = i.rem_euclid(p);
            Some(if m >= dim { p - m } else { m })
        }
        _ => None,
    }
}

/// For every output element (row-major over `tables`' lengths), `base + Σ table_k[i_k]`, or
/// `sentinel` when any table entry is `None`.
fn gather_tables(tables: &[Vec<Option<usize>>], sentinel: usize) -> Vec<usize> {
    let n: usize = tables.iter().map(Vec::len).product();
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    let rank = tables.len();
    let mut idx = vec![0usize; rank];
    for _ in 0..n {
        let mut lin = Some(0usize);
        for (t, &i) in tables.iter().zip(&idx) {
            lin = match (lin, t[i]) {
                (Some(l), Some(v)) => Some(l + v),
                _ => None,
            };
        }
        out.push(lin.unwrap_or(sentinel));
        for d in (0..rank).rev() {
            idx[d] += 1;
            if idx[d] < tables[d].len() {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}

pub(super) fn pad(
    cx: &OpCtx<'_>,
    inputs: &[Option<RtValue>],
    mode: Option<&str>,
    attr_pads: Option<&[i64]>,
    attr_value: Option<f32>,
) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let r = x.rank();
    let mode = mode.unwrap_or("constant");
    let (pads, fill, axes) = if cx.opset < 11 {
        let pads = attr_pads
            .ok_or_else(|| cx.invalid("pads are required"))?
            .to_vec();
        let v = f64::from(attr_value.unwrap_or(0.0));
        let fill = Tensor::from_f64_as(x.dtype, vec![1], &[v])
            .map_err(|e| cx.invalid(e.to_string()))?
            .data;
        (pads, fill, None)
    } else {
        let pads = ints(cx, tensor(cx, inputs, 1)?, "pads")?;
        let fill = match opt_tensor(inputs, 2) {
            Some(c) if !c.is_empty() => {
                if c.dtype != x.dtype {
                    return Err(cx.invalid(format!(
                        "constant_value is {}, the data {}",
                        c.dtype, x.dtype
                    )));
                }
                take(&c.data, &[0])
            }
            _ => {
                Tensor::zeros(x.dtype, vec![1])
                    .map_err(|e| cx.invalid(e.to_string()))?
                    .data
            }
        };
        let axes = if cx.opset >= 18 {
            opt_tensor(inputs, 3)
                .map(|t| ints(cx, t, "axes"))
                .transpose()?
        } else {
            None
        };
        (pads, fill, axes)
    };
    let axes = match axes {
        Some(a) => norm_axes(cx, &a, r)?,
        None => (0..r).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(cx.invalid(format!("{} pads for {} axes", pads.len(), axes.len())));
    }
    let mut begin = vec![0i64; r];
    let mut end = vec![0i64; r];
    for (k, &a) in axes.iter().enumerate() {
        begin[a] = pads[k];
        end[a] = pads[k + axes.len()];
    }
    let st = strides(&x.shape);
    let mut shape = Vec::with_capacity(r);
    for a in 0..r {
        let dim = sdim(x.shape[a]);
        let len = dim
            .checked_add(begin[a])
            .and_then(|l| l.checked_add(end[a]))
            .ok_or_else(|| cx.invalid(format!("pads {} and {} overflow", begin[a], end[a])))?;
        if len < 0 {
            return Err(cx.invalid(format!(
                "pads {} and {} crop more than the dim {dim} of axis {a}",
                begin[a], end[a]
            )));
        }
        if dim == 0 && len > 0 && mode != "constant" {
            return Err(cx.invalid(format!("cannot pad the empty axis {a} in {mode} mode")));
        }
        shape.push(len as usize);
    }
    cx.check_result(x.dtype, &shape)?;
    let mut tables = Vec::with_capacity(r);
    for a in 0..r {
        let dim = sdim(x.shape[a]);
        let len = shape[a] as i64;
        let table: Vec<Option<usize>> = (0..len)
            .map(|o| {
                let i = o - begin[a];
                let src = pad_source(i, dim, mode);
                src.map(|s| s as usize * st[a])
            })
            .collect();
        tables.push(table);
    }
    if !matches!(mode, "constant" | "edge" | "wrap" | "reflect") {
        return Err(cx.unsupported(format!("mode '{mode}'")));
    }
    let idx = gather_tables(&tables, x.len());
    let data = take(&append(&x.data, &fill), &idx);
    single(like(x, shape, data)?)
}

/// `[N, C, H, W]` dims of a rank-4 operand and a positive block size dividing `what`.
fn nchw(
    cx: &OpCtx<'_>,
    x: &Tensor,
    blocksize: Option<i64>,
) -> Result<([usize; 4], usize), KernelError> {
    let b = blocksize.ok_or_else(|| cx.invalid("blocksize is required"))?;
    if b <= 0 {
        return Err(cx.invalid(format!("blocksize {b} is not positive")));
    }
    match x.shape[..] {
        [n, c, h, w] => Ok(([n, c, h, w], b as usize)),
        _ => Err(cx.invalid(format!("expected a rank-4 input, got {:?}", x.shape))),
    }
}

pub(super) fn depth_to_space(
    cx: &OpCtx<'_>,
    inputs: &[Option<RtValue>],
    blocksize: Option<i64>,
    mode: Option<&str>,
) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let ([n, c, h, w], b) = nchw(cx, x, blocksize)?;
    if c % (b * b) != 0 {
        return Err(cx.invalid(format!("channels {c} are not a multiple of {}", b * b)));
    }
    let c2 = c / (b * b);
    let hw = (h * w) as isize;
    let (sc2, sb1, sb2) = match mode.unwrap_or("DCR") {
        "DCR" => (hw, (b * c2) as isize * hw, c2 as isize * hw),
        "CRD" => ((b * b) as isize * hw, b as isize * hw, hw),
        m => return Err(cx.invalid(format!("unknown mode '{m}'"))),
    };
    let vshape = [n, c2, h, b, w, b];
    let vst = [(c * h * w) as isize, sc2, w as isize, sb1, 1, sb2];
    let data = strided(&x.data, 0, &vshape, &vst);
    single(like(x, vec![n, c2, h * b, w * b], data)?)
}

pub(super) fn space_to_depth(
    cx: &OpCtx<'_>,
    inputs: &[Option<RtValue>],
    blocksize: Option<i64>,
    mode: Option<&str>,
) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let ([n, c, h, w], b) = nchw(cx, x, blocksize)?;
    if h % b != 0 || w % b != 0 {
        return Err(cx.invalid(format!("{h}x{w} is not a multiple of the block size {b}")));
    }
    let (h2, w2) = (h / b, w / b);
    let (wi, hw, bi) = (w as isize, (h * w) as isize, b as isize);
    let chw = (c * h * w) as isize;
    let (vshape, vst) = match mode.unwrap_or("DCR") {
        "DCR" => ([n, b, b, c, h2, w2], [chw, wi, 1, hw, bi * wi, bi]),
        "CRD" => ([n, c, b, b, h2, w2], [chw, hw, wi, 1, bi * wi, bi]),
        m => return Err(cx.invalid(format!("unknown mode '{m}'"))),
    };
    let data = strided(&x.data, 0, &vshape, &vst);
    single(like(x, vec![n, c * b * b, h2, w2], data)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_bounds() {
        // x[::-1] on 5 elements: start INT_MAX clamps to 4, end INT_MIN to -1.
        assert_eq!(slice_axis(5, i64::MAX, i64::MIN, -1), (4, 5));
        // x[-1:-4:-2] -> indices 4, 2.
        assert_eq!(slice_axis(5, -1, -4, -2), (4, 2));
        assert_eq!(slice_axis(5, 1, i64::MAX, 2), (1, 2));
        assert_eq!(slice_axis(5, 3, 1, 1), (3, 0));
        assert_eq!(slice_axis(0, 0, -1, -1), (0, 0));
        // INT64 extremes (ONNX Runtime 1.32 and numpy on 5 elements): one element each, where
        // `(e - s + step - 1) / step` overflowed and gave none.
        let (min, max) = (i64::MIN, i64::MAX);
        assert_eq!(slice_axis(5, min, max, max), (0, 1));
        assert_eq!(slice_axis(5, 0, max, max), (0, 1));
        assert_eq!(slice_axis(5, 2, max, max), (2, 1));
        assert_eq!(slice_axis(5, max, min, min), (4, 1));
        assert_eq!(slice_axis(5, -1, min, -max), (4, 1));
        assert_eq!(slice_axis(5, min, max, 2), (0, 3));
    }

    #[test]
    fn pad_modes() {
        // numpy: pad([0, 1, 2], 3, reflect) = [1, 2, 1, 0, 1, 2, 1, 0, 1]
        let r: Vec<i64> = (-3..6)
            .filter_map(|i| pad_source(i, 3, "reflect"))
            .collect();
        assert_eq!(r, vec![1, 2, 1, 0, 1, 2, 1, 0, 1]);
        let e: Vec<i64> = (-2..5).filter_map(|i| pad_source(i, 3, "edge")).collect();
        assert_eq!(e, vec![0, 0, 0, 1, 2, 2, 2]);
        let w: Vec<i64> = (-2..5).filter_map(|i| pad_source(i, 3, "wrap")).collect();
        assert_eq!(w, vec![1, 2, 0, 1, 2, 0, 1]);
        assert_eq!(pad_source(-1, 3, "constant"), None);
    }
}
