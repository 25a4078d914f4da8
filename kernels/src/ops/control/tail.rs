//! The long tail of default-domain ops that the IR keeps as custom ops: `CumProd`, `Compress`,
//! `EyeLike`, `Shrink`, `ReverseSequence`, `Det`, window functions, `StringConcat`,
//! `StringSplit`, `Unique`, `CenterCropPad`, `Col2Im`.

use mmq_ir::{Attr, CustomOp, DType, OpKind};

use super::{Tail, attr, attr_f32, attr_i64, attr_ints, attr_str};
use crate::error::KernelError;
use crate::ops::data::{self, map_any};
use crate::ops::util::{self, opt_tensor, tensor};
use crate::ops::{OpCtx, OpResult};
use crate::tensor::{Data, RtValue, Tensor};

/// Runs the op when it is one of the long-tail ops.
pub(super) fn eval(t: Tail<'_, '_>) -> Option<OpResult> {
    let (cx, kind, c, inputs) = (t.cx, t.kind, t.c, t.inputs);
    Some(match kind {
        OpKind::CumProd => cum_prod(cx, c, inputs),
        OpKind::Compress => compress(cx, c, inputs),
        OpKind::EyeLike => eye_like(cx, c, inputs),
        OpKind::Shrink => shrink(cx, c, inputs),
        OpKind::ReverseSequence => reverse_sequence(cx, c, inputs),
        OpKind::Det => det(cx, inputs),
        OpKind::HannWindow | OpKind::HammingWindow | OpKind::BlackmanWindow => {
            window(cx, c, inputs)
        }
        OpKind::StringConcat => string_concat(cx, inputs),
        OpKind::StringSplit => string_split(cx, c, inputs),
        OpKind::Unique => unique(cx, c, inputs),
        OpKind::CenterCropPad => center_crop_pad(cx, c, inputs),
        OpKind::Col2Im => col2im(cx, c, inputs),
        OpKind::DFT => dft(cx, c, inputs),
        OpKind::STFT => stft(cx, c, inputs),
        OpKind::NonMaxSuppression => non_max_suppression(cx, c, inputs),
        OpKind::GridSample => grid_sample(cx, c, inputs),
        OpKind::StringNormalizer => string_normalizer(cx, c, inputs),
        OpKind::SwiGLU => swiglu(cx, c, inputs),
        OpKind::TensorScatter => tensor_scatter(cx, c, inputs),
        OpKind::MaxUnpool => max_unpool(cx, c, inputs),
        OpKind::TfIdfVectorizer => tfidf(cx, c, inputs),
        OpKind::MelWeightMatrix => mel_weight_matrix(cx, c, inputs),
        OpKind::RoiAlign => roi_align(cx, c, inputs),
        _ => return None,
    })
}

fn one(t: Tensor) -> OpResult {
    Ok(vec![Some(t.into())])
}

/// A scalar integer operand.
fn scalar(cx: &OpCtx<'_>, inputs: &[Option<RtValue>], i: usize) -> Result<i64, KernelError> {
    tensor(cx, inputs, i)?
        .to_i64()?
        .first()
        .copied()
        .ok_or_else(|| cx.invalid(format!("operand {i} is empty")))
}

/// The elements of `v` at `idx`, with the default value where `idx` is `None`.
fn gather_or_default<T: Clone + Default>(v: &[T], idx: &[Option<usize>]) -> Vec<T> {
    idx.iter()
        .map(|i| i.map_or_else(T::default, |i| v[i].clone()))
        .collect()
}

/// The elements of `v` at `idx`.
fn gather<T: Clone>(v: &[T], idx: &[usize]) -> Vec<T> {
    idx.iter().map(|&i| v[i].clone()).collect()
}

fn cum_prod(cx: &OpCtx<'_>, c: &CustomOp, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let axis = util::axis(cx, scalar(cx, inputs, 1)?, x.rank())?;
    let exclusive = attr_i64(c, "exclusive", 0) != 0;
    let reverse = attr_i64(c, "reverse", 0) != 0;
    if x.rank() == 0 {
        return one((**x).clone());
    }
    let (outer, len, inner) = data::split_at_axis(&x.shape, axis);
    fn run<T: Copy + std::ops::Mul<Output = T>>(
        v: &[T],
        unit: T,
        (outer, len, inner): (usize, usize, usize),
        exclusive: bool,
        reverse: bool,
    ) -> Vec<T> {
        let mut out = vec![unit; v.len()];
        for o in 0..outer {
            for i in 0..inner {
                let mut acc = unit;
                for k in 0..len {
                    let a = if reverse { len - 1 - k } else { k };
                    let idx = (o * len + a) * inner + i;
                    if exclusive {
                        out[idx] = acc;
                        acc = acc * v[idx];
                    } else {
                        acc = acc * v[idx];
                        out[idx] = acc;
                    }
                }
            }
        }
        out
    }
    let dims = (outer, len, inner);
    let data = match &x.data {
        Data::F32(v) => Data::F32(run(v, 1.0, dims, exclusive, reverse)),
        Data::F64(v) => Data::F64(run(v, 1.0, dims, exclusive, reverse)),
        Data::I32(v) => Data::I32(run(v, 1, dims, exclusive, reverse)),
        Data::I64(v) => Data::I64(run(v, 1, dims, exclusive, reverse)),
        Data::U32(v) => Data::U32(run(v, 1, dims, exclusive, reverse)),
        Data::U64(v) => Data::U64(run(v, 1, dims, exclusive, reverse)),
        Data::F16(_) | Data::BF16(_) => {
            let v = run(&x.to_f32()?, 1.0, dims, exclusive, reverse);
            let v: Vec<f64> = v.into_iter().map(f64::from).collect();
            return one(Tensor::from_f64_as(x.dtype, x.shape.clone(), &v)?);
        }
        _ => return Err(cx.unsupported(format!("CumProd of {}", x.dtype))),
    };
    one(Tensor::new(x.dtype, x.shape.clone(), data)?)
}

fn compress(cx: &OpCtx<'_>, c: &CustomOp, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let cond = tensor(cx, inputs, 1)?.to_i64()?;
    let (flat, axis) = match attr(c, "axis") {
        Some(Attr::Int(a)) => (false, util::axis(cx, *a, x.rank())?),
        _ => (true, 0),
    };
    let shape = if flat { vec![x.len()] } else { x.shape.clone() };
    let (outer, len, inner) = data::split_at_axis(&shape, axis);
    if cond.len() > len {
        return Err(cx.invalid(format!(
            "the condition has {} elements, the axis only {len}",
            cond.len()
        )));
    }
    let keep: Vec<usize> = (0..len)
        .filter(|&i| cond.get(i).is_some_and(|&b| b != 0))
        .collect();
    let mut idx = Vec::with_capacity(outer * keep.len() * inner);
    for o in 0..outer {
        for &k in &keep {
            idx.extend((0..inner).map(|i| (o * len + k) * inner + i));
        }
    }
    let mut out_shape = shape;
    out_shape[axis] = keep.len();
    let data = map_any!(&x.data, |v, _get| gather(v, &idx));
    one(Tensor::new(x.dtype, out_shape, data)?)
}

fn eye_like(cx: &OpCtx<'_>, c: &CustomOp, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    if x.rank() != 2 {
        return Err(cx.invalid(format!("EyeLike needs a 2-d input, got {:?}", x.shape)));
    }
    let dtype = match attr(c, "dtype") {
        Some(Attr::Int(code)) => i32::try_from(*code)
            .ok()
            .and_then(DType::from_onnx_code)
            .ok_or_else(|| cx.invalid(format!("unknown dtype {code}")))?,
        _ => x.dtype,
    };
    let k = attr_i64(c, "k", 0);
    let (rows, cols) = (x.shape[0], x.shape[1]);
    let mut v = vec![0.0; rows * cols];
    for r in 0..rows {
        let col = r as i64 + k;
        if col >= 0 && (col as usize) < cols {
            v[r * cols + col as usize] = 1.0;
        }
    }
    one(Tensor::from_f64_as(dtype, x.shape.clone(), &v)?)
}

fn shrink(cx: &OpCtx<'_>, c: &CustomOp, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let lambd = f64::from(attr_f32(c, "lambd", 0.5));
    let bias = f64::from(attr_f32(c, "bias", 0.0));
    let v: Vec<f64> = x
        .to_f64()?
        .into_iter()
        .map(|e| {
            if e < -lambd {
                e + bias
            } else if e > lambd {
                e - bias
            } else {
                0.0
            }
        })
        .collect();
    one(Tensor::from_f64_as(x.dtype, x.shape.clone(), &v)?)
}

fn reverse_sequence(cx: &OpCtx<'_>, c: &CustomOp, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let lens = tensor(cx, inputs, 1)?.to_i64()?;
    let batch_axis = util::axis(cx, attr_i64(c, "batch_axis", 1), x.rank())?;
    let time_axis = util::axis(cx, attr_i64(c, "time_axis", 0), x.rank())?;
    if x.rank() < 2 || batch_axis == time_axis {
        return Err(cx.invalid("needs rank >= 2 and distinct batch and time axes"));
    }
    let (batch, time) = (x.shape[batch_axis], x.shape[time_axis]);
    if lens.len() != batch || lens.iter().any(|&l| l < 0 || l as usize > time) {
        return Err(cx.invalid(format!(
            "sequence_lens {lens:?} do not fit batch {batch} and time {time}"
        )));
    }
    let strides = util::strides(&x.shape);
    let n = x.len();
    let mut idx = Vec::with_capacity(n);
    let mut pos = vec![0usize; x.rank()];
    for _ in 0..n {
        let b = pos[batch_axis];
        let t = pos[time_axis];
        let l = lens[b] as usize;
        let src_t = if t < l { l - 1 - t } else { t };
        let lin: usize = pos
            .iter()
            .zip(&strides)
            .enumerate()
            .map(|(d, (&p, &s))| if d == time_axis { src_t * s } else { p * s })
            .sum();
        idx.push(lin);
        for d in (0..pos.len()).rev() {
            pos[d] += 1;
            if pos[d] < x.shape[d] {
                break;
            }
            pos[d] = 0;
        }
    }
    let data = map_any!(&x.data, |v, _get| gather(v, &idx));
    one(Tensor::new(x.dtype, x.shape.clone(), data)?)
}

/// The determinant of a row-major `n × n` matrix (LU with partial pivoting).
pub(crate) fn determinant(a: &mut [f64], n: usize) -> f64 {
    let mut det = 1.0;
    for col in 0..n {
        let pivot = (col..n)
            .max_by(|&i, &j| a[i * n + col].abs().total_cmp(&a[j * n + col].abs()))
            .unwrap_or(col);
        if a[pivot * n + col] == 0.0 {
            return 0.0;
        }
        if pivot != col {
            for k in 0..n {
                a.swap(col * n + k, pivot * n + k);
            }
            det = -det;
        }
        let p = a[col * n + col];
        det *= p;
        for r in col + 1..n {
            let f = a[r * n + col] / p;
            if f != 0.0 {
                for k in col..n {
                    a[r * n + k] -= f * a[col * n + k];
                }
            }
        }
    }
    det
}

fn det(cx: &OpCtx<'_>, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let r = x.rank();
    if r < 2 || x.shape[r - 1] != x.shape[r - 2] {
        return Err(cx.invalid(format!("Det needs [*, M, M], got {:?}", x.shape)));
    }
    let n = x.shape[r - 1];
    let v = x.to_f64()?;
    let out: Vec<f64> = if n == 0 {
        vec![1.0; x.shape[..r - 2].iter().product()]
    } else {
        v.chunks(n * n)
            .map(|m| determinant(&mut m.to_vec(), n))
            .collect()
    };
    one(Tensor::from_f64_as(
        x.dtype,
        x.shape[..r - 2].to_vec(),
        &out,
    )?)
}

fn window(cx: &OpCtx<'_>, c: &CustomOp, inputs: &[Option<RtValue>]) -> OpResult {
    let size = scalar(cx, inputs, 0)?;
    if size < 0 {
        return Err(cx.invalid(format!("window size {size} is negative")));
    }
    let dtype = i32::try_from(attr_i64(c, "output_datatype", 1))
        .ok()
        .and_then(DType::from_onnx_code)
        .ok_or_else(|| cx.invalid("unknown output_datatype"))?;
    let periodic = attr_i64(c, "periodic", 1) != 0;
    let n = if periodic { size } else { size - 1 } as f64;
    let tau = 2.0 * std::f64::consts::PI;
    let v: Vec<f64> = (0..size)
        .map(|i| {
            let x = tau * i as f64 / n;
            match c.op_type.as_str() {
                "HannWindow" => 0.5 - 0.5 * x.cos(),
                "HammingWindow" => 25.0 / 46.0 - (1.0 - 25.0 / 46.0) * x.cos(),
                _ => 0.42 - 0.5 * x.cos() + 0.08 * (2.0 * x).cos(),
            }
        })
        .collect();
    one(Tensor::from_f64_as(dtype, vec![size as usize], &v)?)
}

/// Operand `i` as a string tensor.
fn strings<'a>(
    cx: &OpCtx<'_>,
    inputs: &'a [Option<RtValue>],
    i: usize,
) -> Result<(&'a Tensor, &'a [String]), KernelError> {
    let t = tensor(cx, inputs, i)?;
    match &t.data {
        Data::Str(v) => Ok((t, v)),
        _ => Err(cx.invalid(format!("operand {i} is not a string tensor"))),
    }
}

fn string_concat(cx: &OpCtx<'_>, inputs: &[Option<RtValue>]) -> OpResult {
    let (a, av) = strings(cx, inputs, 0)?;
    let (b, bv) = strings(cx, inputs, 1)?;
    let shape = util::broadcast_shapes(&[&a.shape, &b.shape]).ok_or_else(|| {
        cx.invalid(format!(
            "shapes {:?} and {:?} do not broadcast",
            a.shape, b.shape
        ))
    })?;
    let ia = util::broadcast_indices(&a.shape, &shape);
    let ib = util::broadcast_indices(&b.shape, &shape);
    let v = ia
        .iter()
        .zip(&ib)
        .map(|(&i, &j)| format!("{}{}", av[i], bv[j]))
        .collect();
    one(Tensor::new(DType::String, shape, Data::Str(v))?)
}

/// Python's `str.split(sep, maxsplit)`: `None` splits on runs of whitespace and drops empty
/// pieces.
fn py_split(s: &str, sep: Option<&str>, maxsplit: Option<usize>) -> Vec<String> {
    let max = maxsplit.unwrap_or(usize::MAX);
    match sep {
        Some(sep) => {
            let mut out = Vec::new();
            let mut rest = s;
            while out.len() < max {
                match rest.find(sep) {
                    Some(p) => {
                        out.push(rest[..p].to_owned());
                        rest = &rest[p + sep.len()..];
                    }
                    None => break,
                }
            }
            out.push(rest.to_owned());
            out
        }
        None => {
            let mut out = Vec::new();
            let mut rest = s.trim_start();
            while !rest.is_empty() {
                if out.len() == max {
                    out.push(rest.to_owned());
                    break;
                }
                let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
                out.push(rest[..end].to_owned());
                rest = rest[end..].trim_start();
            }
            out
        }
    }
}

fn string_split(cx: &OpCtx<'_>, c: &CustomOp, inputs: &[Option<RtValue>]) -> OpResult {
    let (x, xv) = strings(cx, inputs, 0)?;
    let sep = attr_str(c, "delimiter").filter(|s| !s.is_empty());
    let maxsplit = match attr(c, "maxsplit") {
        Some(Attr::Int(m)) if *m >= 0 => Some(*m as usize),
        _ => None,
    };
    let pieces: Vec<Vec<String>> = xv.iter().map(|s| py_split(s, sep, maxsplit)).collect();
    let width = pieces.iter().map(Vec::len).max().unwrap_or(0);
    let counts: Vec<i64> = pieces.iter().map(|p| p.len() as i64).collect();
    let mut flat = Vec::with_capacity(pieces.len() * width);
    for mut p in pieces {
        p.resize(width, String::new());
        flat.extend(p);
    }
    let mut shape = x.shape.clone();
    shape.push(width);
    Ok(vec![
        Some(Tensor::new(DType::String, shape, Data::Str(flat))?.into()),
        Some(Tensor::from_i64(x.shape.clone(), counts)?.into()),
    ])
}

fn unique(cx: &OpCtx<'_>, c: &CustomOp, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let sorted = attr_i64(c, "sorted", 1) != 0;
    let (src, axis) = match attr(c, "axis") {
        Some(Attr::Int(a)) => ((**x).clone(), util::axis(cx, *a, x.rank())?),
        _ => (Tensor::new(x.dtype, vec![x.len()], x.data.clone())?, 0),
    };
    let (outer, len, inner) = data::split_at_axis(&src.shape, axis);
    // One key per slice along the axis: its elements in order.
    let key_of = |k: usize| -> Vec<usize> {
        (0..outer)
            .flat_map(|o| (0..inner).map(move |i| (o * len + k) * inner + i))
            .collect()
    };
    let keys: Vec<Vec<f64>> = match &src.data {
        Data::Str(_) => Vec::new(),
        _ => {
            let v = src.to_f64()?;
            (0..len)
                .map(|k| key_of(k).into_iter().map(|i| v[i]).collect())
                .collect()
        }
    };
    let skeys: Vec<Vec<&str>> = match &src.data {
        Data::Str(v) => (0..len)
            .map(|k| key_of(k).into_iter().map(|i| v[i].as_str()).collect())
            .collect(),
        _ => Vec::new(),
    };
    let cmp = |a: usize, b: usize| -> std::cmp::Ordering {
        if skeys.is_empty() {
            keys[a]
                .iter()
                .zip(&keys[b])
                .map(|(x, y)| x.total_cmp(y))
                .find(|o| o.is_ne())
                .unwrap_or(std::cmp::Ordering::Equal)
        } else {
            skeys[a].cmp(&skeys[b])
        }
    };
    // Stable sort keeps the first occurrence first within each group.
    let mut order: Vec<usize> = (0..len).collect();
    order.sort_by(|&a, &b| cmp(a, b));
    // Groups: (first occurrence, members).
    let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
    for &k in &order {
        match groups.last_mut() {
            Some((first, members)) if cmp(*first, k).is_eq() => members.push(k),
            _ => groups.push((k, vec![k])),
        }
    }
    if !sorted {
        groups.sort_by_key(|(first, _)| *first);
    }
    let mut inverse = vec![0i64; len];
    for (g, (_, members)) in groups.iter().enumerate() {
        for &m in members {
            inverse[m] = g as i64;
        }
    }
    let firsts: Vec<usize> = groups.iter().map(|(f, _)| *f).collect();
    let mut idx = Vec::with_capacity(outer * firsts.len() * inner);
    for o in 0..outer {
        for &k in &firsts {
            idx.extend((0..inner).map(|i| (o * len + k) * inner + i));
        }
    }
    let mut y_shape = src.shape.clone();
    y_shape[axis] = firsts.len();
    let y = Tensor::new(
        src.dtype,
        y_shape,
        map_any!(&src.data, |v, _get| gather(v, &idx)),
    )?;
    let n = firsts.len();
    Ok(vec![
        Some(y.into()),
        Some(Tensor::from_i64(vec![n], firsts.iter().map(|&f| f as i64).collect())?.into()),
        Some(Tensor::from_i64(vec![len], inverse)?.into()),
        Some(
            Tensor::from_i64(
                vec![n],
                groups.iter().map(|(_, m)| m.len() as i64).collect(),
            )?
            .into(),
        ),
    ])
}

fn center_crop_pad(cx: &OpCtx<'_>, c: &CustomOp, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let target = tensor(cx, inputs, 1)?.to_i64()?;
    let rank = x.rank();
    let axes: Vec<usize> = match attr_ints(c, "axes") {
        Some(a) => a
            .iter()
            .map(|&a| util::axis(cx, a, rank))
            .collect::<Result<_, _>>()?,
        None => (0..rank).collect(),
    };
    if target.len() != axes.len() || target.iter().any(|&t| t < 0) {
        return Err(cx.invalid(format!("shape {target:?} does not fit axes {axes:?}")));
    }
    let mut out_shape = x.shape.clone();
    // Per axis: output index o maps to input index o + shift (shift < 0 pads, > 0 crops).
    let mut shift = vec![0i64; rank];
    for (&a, &t) in axes.iter().zip(&target) {
        let dim = x.shape[a] as i64;
        out_shape[a] = t as usize;
        shift[a] = if t <= dim {
            (dim - t) / 2
        } else {
            -((t - dim) / 2)
        };
    }
    let n: usize = out_shape.iter().product();
    let in_strides = util::strides(&x.shape);
    let mut idx = Vec::with_capacity(n);
    let mut pos = vec![0usize; rank];
    for _ in 0..n {
        let mut lin = Some(0usize);
        for d in 0..rank {
            let s = pos[d] as i64 + shift[d];
            if s < 0 || s >= x.shape[d] as i64 {
                lin = None;
                break;
            }
            lin = lin.map(|l| l + s as usize * in_strides[d]);
        }
        idx.push(lin);
        for d in (0..rank).rev() {
            pos[d] += 1;
            if pos[d] < out_shape[d] {
                break;
            }
            pos[d] = 0;
        }
    }
    let data = match &x.data {
        Data::Codes(v) => Data::Codes(
            idx.iter()
                .map(|i| i.map_or(crate::numeric::encode(x.dtype, 0.0, true), |i| v[i]))
                .collect(),
        ),
        d => map_any!(d, |v, _get| gather_or_default(v, &idx)),
    };
    one(Tensor::new(x.dtype, out_shape, data)?)
}

fn col2im(cx: &OpCtx<'_>, c: &CustomOp, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let image: Vec<i64> = tensor(cx, inputs, 1)?.to_i64()?;
    let block: Vec<i64> = tensor(cx, inputs, 2)?.to_i64()?;
    let nd = image.len();
    if x.rank() != 3 || block.len() != nd || image.iter().chain(&block).any(|&d| d <= 0) {
        return Err(cx.invalid("Col2Im needs a [N, C*prod(block), L] input and positive shapes"));
    }
    let dil = attr_ints(c, "dilations").map_or(vec![1; nd], <[i64]>::to_vec);
    let strides = attr_ints(c, "strides").map_or(vec![1; nd], <[i64]>::to_vec);
    let pads = attr_ints(c, "pads").map_or(vec![0; 2 * nd], <[i64]>::to_vec);
    if dil.len() != nd || strides.len() != nd || pads.len() != 2 * nd {
        return Err(cx.invalid("dilations, strides or pads do not match the image rank"));
    }
    let kprod: i64 = block.iter().product();
    let (n, ck, l) = (x.shape[0], x.shape[1], x.shape[2]);
    if ck as i64 % kprod != 0 {
        return Err(cx.invalid(format!("dim 1 ({ck}) is not a multiple of {kprod}")));
    }
    let ch = ck / kprod as usize;
    let blocks: Vec<i64> = (0..nd)
        .map(|i| (image[i] + pads[i] + pads[i + nd] - dil[i] * (block[i] - 1) - 1) / strides[i] + 1)
        .collect();
    if blocks.iter().any(|&b| b < 1) || blocks.iter().product::<i64>() != l as i64 {
        return Err(cx.invalid(format!(
            "dim 2 ({l}) does not match the {blocks:?} sliding blocks"
        )));
    }
    let img: usize = image.iter().map(|&d| d as usize).product();
    let v = x.to_f64()?;
    let mut out = vec![0.0; n * ch * img];
    let mut kpos = vec![0i64; nd];
    let mut bpos = vec![0i64; nd];
    for b in 0..n {
        for cc in 0..ch {
            for k in 0..kprod as usize {
                // Kernel offset of column row k.
                let mut r = k as i64;
                for d in (0..nd).rev() {
                    kpos[d] = r % block[d];
                    r /= block[d];
                }
                for li in 0..l {
                    let mut r = li as i64;
                    for d in (0..nd).rev() {
                        bpos[d] = r % blocks[d];
                        r /= blocks[d];
                    }
                    let mut lin = 0i64;
                    let mut inside = true;
                    for d in 0..nd {
                        let p = bpos[d] * strides[d] - pads[d] + kpos[d] * dil[d];
                        if p < 0 || p >= image[d] {
                            inside = false;
                            break;
                        }
                        lin = lin * image[d] + p;
                    }
                    if inside {
                        let src = (b * ck + cc * kprod as usize + k) * l + li;
                        out[(b * ch + cc) * img + lin as usize] += v[src];
                    }
                }
            }
        }
    }
    let mut shape = vec![n, ch];
    shape.extend(image.iter().map(|&d| d as usize));
    one(Tensor::from_f64_as(x.dtype, shape, &out)?)
}

/// The discrete Fourier transform of `(re, im)` zero-padded or cropped to `n` points; the first
/// `bins` frequencies. `inverse` uses the positive exponent and divides by `n`.
fn dft_1d(re: &[f64], im: &[f64], n: usize, bins: usize, inverse: bool) -> Vec<(f64, f64)> {
    let tau = 2.0 * std::f64::consts::PI;
    let sign = if inverse { 1.0 } else { -1.0 };
    let table: Vec<(f64, f64)> = (0..n)
        .map(|j| {
            let a = sign * tau * j as f64 / n as f64;
            (a.cos(), a.sin())
        })
        .collect();
    let m = re.len().min(n);
    (0..bins)
        .map(|k| {
            let (mut sr, mut si) = (0.0, 0.0);
            for t in 0..m {
                let (c, s) = table[(k * t) % n];
                sr += re[t] * c - im[t] * s;
                si += re[t] * s + im[t] * c;
            }
            if inverse {
                (sr / n as f64, si / n as f64)
            } else {
                (sr, si)
            }
        })
        .collect()
}

fn dft(cx: &OpCtx<'_>, c: &CustomOp, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let rank = x.rank();
    let inverse = attr_i64(c, "inverse", 0) != 0;
    let onesided = attr_i64(c, "onesided", 0) != 0;
    let axis = if cx.opset >= 20 {
        match opt_tensor(inputs, 2) {
            Some(_) => scalar(cx, inputs, 2)?,
            None => -2,
        }
    } else {
        attr_i64(c, "axis", 1)
    };
    let axis = util::axis(cx, axis, rank)?;
    let ch = x.shape.last().copied().unwrap_or(0);
    if rank < 2 || axis == rank - 1 || !(ch == 1 || ch == 2) {
        return Err(cx.invalid(format!(
            "DFT needs [..., n, ..., 1|2] with the axis before the last, got {:?} axis {axis}",
            x.shape
        )));
    }
    let len = x.shape[axis];
    let n = match opt_tensor(inputs, 1) {
        Some(_) => usize::try_from(scalar(cx, inputs, 1)?)
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| cx.invalid("dft_length must be positive"))?,
        None if inverse && onesided => 2 * len.saturating_sub(1),
        None => len,
    };
    if n == 0 {
        return Err(cx.invalid("the DFT length is 0"));
    }
    let real_out = inverse && onesided;
    let bins = if onesided && !inverse { n / 2 + 1 } else { n };
    let outer: usize = x.shape[..axis].iter().product();
    let inner: usize = x.shape[axis + 1..rank - 1].iter().product();
    let v = x.to_f64()?;
    let out_ch = if real_out { 1 } else { 2 };
    let mut out = vec![0.0; outer * bins * inner * out_ch];
    let mut re = vec![0.0; len];
    let mut im = vec![0.0; len];
    for o in 0..outer {
        for i in 0..inner {
            for t in 0..len {
                let base = ((o * len + t) * inner + i) * ch;
                re[t] = v[base];
                im[t] = if ch == 2 { v[base + 1] } else { 0.0 };
            }
            let spectrum = if real_out {
                // Rebuild the Hermitian spectrum from its first n/2 + 1 bins (numpy irfft).
                let half = n / 2 + 1;
                let mut fr = vec![0.0; n];
                let mut fi = vec![0.0; n];
                let m = half.min(len).min(n);
                fr[..m].copy_from_slice(&re[..m]);
                fi[..m].copy_from_slice(&im[..m]);
                fi[0] = 0.0;
                if n % 2 == 0 && n / 2 < m {
                    fi[n / 2] = 0.0;
                }
                for k in 1..n.div_ceil(2) {
                    fr[n - k] = fr[k];
                    fi[n - k] = -fi[k];
                }
                dft_1d(&fr, &fi, n, n, true)
            } else {
                dft_1d(&re, &im, n, bins, inverse)
            };
            for (k, (r, m)) in spectrum.into_iter().enumerate() {
                let base = ((o * bins + k) * inner + i) * out_ch;
                out[base] = r;
                if !real_out {
                    out[base + 1] = m;
                }
            }
        }
    }
    let mut shape = x.shape.clone();
    shape[axis] = bins;
    shape[rank - 1] = out_ch;
    one(Tensor::from_f64_as(x.dtype, shape, &out)?)
}

fn stft(cx: &OpCtx<'_>, c: &CustomOp, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let step = usize::try_from(scalar(cx, inputs, 1)?)
        .ok()
        .filter(|&s| s > 0)
        .ok_or_else(|| cx.invalid("frame_step must be positive"))?;
    let window = opt_tensor(inputs, 2).map(|w| w.to_f64()).transpose()?;
    let frame_len = match (&window, opt_tensor(inputs, 3)) {
        (_, Some(_)) => usize::try_from(scalar(cx, inputs, 3)?)
            .map_err(|_| cx.invalid("frame_length is negative"))?,
        (Some(w), None) => w.len(),
        (None, None) => return Err(cx.invalid("needs a window or a frame_length")),
    };
    if window.as_ref().is_some_and(|w| w.len() != frame_len) || frame_len == 0 {
        return Err(cx.invalid("the window length differs from frame_length"));
    }
    let onesided = attr_i64(c, "onesided", 1) != 0;
    if x.rank() != 3 || !(x.shape[2] == 1 || x.shape[2] == 2) || x.shape[1] < frame_len {
        return Err(cx.invalid(format!(
            "STFT needs a [batch, length >= {frame_len}, 1|2] signal, got {:?}",
            x.shape
        )));
    }
    let (batch, len, ch) = (x.shape[0], x.shape[1], x.shape[2]);
    let frames = (len - frame_len) / step + 1;
    let bins = if onesided {
        frame_len / 2 + 1
    } else {
        frame_len
    };
    let v = x.to_f64()?;
    let mut out = Vec::with_capacity(batch * frames * bins * 2);
    let mut re = vec![0.0; frame_len];
    let mut im = vec![0.0; frame_len];
    for b in 0..batch {
        for f in 0..frames {
            for t in 0..frame_len {
                let w = window.as_ref().map_or(1.0, |w| w[t]);
                let base = (b * len + f * step + t) * ch;
                re[t] = v[base] * w;
                im[t] = if ch == 2 { v[base + 1] * w } else { 0.0 };
            }
            for (r, m) in dft_1d(&re, &im, frame_len, bins, false) {
                out.push(r);
                out.push(m);
            }
        }
    }
    one(Tensor::from_f64_as(
        x.dtype,
        vec![batch, frames, bins, 2],
        &out,
    )?)
}

/// Whether box `b` overlaps the selected box `a` by more than `iou_threshold` (ONNX
/// `NonMaxSuppression`; `center` selects `[xc, yc, w, h]` over corner boxes `[y1, x1, y2, x2]`).
fn suppresses(a: &[f64], b: &[f64], center: bool, iou_threshold: f64) -> bool {
    // (x_min, x_max, y_min, y_max)
    let extent = |v: &[f64]| {
        if center {
            (
                v[0] - v[2] / 2.0,
                v[0] + v[2] / 2.0,
                v[1] - v[3] / 2.0,
                v[1] + v[3] / 2.0,
            )
        } else {
            (
                v[1].min(v[3]),
                v[1].max(v[3]),
                v[0].min(v[2]),
                v[0].max(v[2]),
            )
        }
    };
    let (ax0, ax1, ay0, ay1) = extent(a);
    let (bx0, bx1, by0, by1) = extent(b);
    let (ix0, ix1) = (ax0.max(bx0), ax1.min(bx1));
    let (iy0, iy1) = (ay0.max(by0), ay1.min(by1));
    if ix1 <= ix0 || iy1 <= iy0 {
        return false;
    }
    let inter = (ix1 - ix0) * (iy1 - iy0);
    let area_a = (ax1 - ax0) * (ay1 - ay0);
    let area_b = (bx1 - bx0) * (by1 - by0);
    let union = area_a + area_b - inter;
    if inter <= 0.0 || area_a <= 0.0 || area_b <= 0.0 || union <= 0.0 {
        return false;
    }
    inter / union > iou_threshold
}

fn non_max_suppression(cx: &OpCtx<'_>, c: &CustomOp, inputs: &[Option<RtValue>]) -> OpResult {
    let boxes = tensor(cx, inputs, 0)?;
    let scores = tensor(cx, inputs, 1)?;
    let first_f64 = |i: usize| -> Result<Option<f64>, KernelError> {
        Ok(match opt_tensor(inputs, i) {
            Some(t) => t.to_f64()?.first().copied(),
            None => None,
        })
    };
    let max_out = match opt_tensor(inputs, 2) {
        Some(t) => t.to_i64()?.first().copied().unwrap_or(0).max(0) as usize,
        None => 0,
    };
    let iou_threshold = first_f64(3)?.unwrap_or(0.0);
    let score_threshold = first_f64(4)?;
    let center = attr_i64(c, "center_point_box", 0) != 0;
    if boxes.rank() != 3 || boxes.shape[2] != 4 || scores.rank() != 3 {
        return Err(cx.invalid(format!(
            "boxes must be [B, N, 4] and scores [B, C, N], got {:?} and {:?}",
            boxes.shape, scores.shape
        )));
    }
    let (batch, n) = (boxes.shape[0], boxes.shape[1]);
    let classes = scores.shape[1];
    if scores.shape[0] != batch || scores.shape[2] != n {
        return Err(cx.invalid("boxes and scores disagree on batch or box count"));
    }
    let bv = boxes.to_f64()?;
    let sv = scores.to_f64()?;
    let mut out: Vec<i64> = Vec::new();
    for b in 0..batch {
        let bx = &bv[b * n * 4..(b + 1) * n * 4];
        for cl in 0..classes {
            let sc = &sv[(b * classes + cl) * n..(b * classes + cl + 1) * n];
            let mut cand: Vec<usize> = (0..n)
                .filter(|&i| score_threshold.is_none_or(|t| sc[i] > t))
                .collect();
            // Highest score first; ties keep the lower index first.
            cand.sort_by(|&i, &j| sc[j].total_cmp(&sc[i]).then(i.cmp(&j)));
            let mut selected: Vec<usize> = Vec::new();
            for i in cand {
                if selected.len() >= max_out {
                    break;
                }
                let boxi = &bx[i * 4..i * 4 + 4];
                if selected
                    .iter()
                    .all(|&s| !suppresses(&bx[s * 4..s * 4 + 4], boxi, center, iou_threshold))
                {
                    selected.push(i);
                    out.extend([b as i64, cl as i64, i as i64]);
                }
            }
        }
    }
    let rows = out.len() / 3;
    one(Tensor::from_i64(vec![rows, 3], out)?)
}

/// Reflects `x` by the nearer border until it lies in `[lo, hi]`.
fn reflect(x: f64, lo: f64, hi: f64) -> f64 {
    let range = hi - lo;
    if range <= 0.0 {
        return lo;
    }
    if x < lo {
        let dx = lo - x;
        let n = (dx / range) as i64;
        let r = dx - n as f64 * range;
        if n % 2 == 0 { lo + r } else { hi - r }
    } else if x > hi {
        let dx = x - hi;
        let n = (dx / range) as i64;
        let r = dx - n as f64 * range;
        if n % 2 == 0 { hi - r } else { lo + r }
    } else {
        x
    }
}

/// Keys' cubic convolution weights (alpha = -0.75) for the taps at -1, 0, 1, 2 around `t`.
fn cubic_weights(t: f64) -> [f64; 4] {
    let a = -0.75;
    let x = t.abs();
    [
        ((a * (x + 1.0) - 5.0 * a) * (x + 1.0) + 8.0 * a) * (x + 1.0) - 4.0 * a,
        ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0,
        ((a + 2.0) * (1.0 - x) - (a + 3.0)) * (1.0 - x) * (1.0 - x) + 1.0,
        ((a * (2.0 - x) - 5.0 * a) * (2.0 - x) + 8.0 * a) * (2.0 - x) - 4.0 * a,
    ]
}

#[derive(Clone, Copy, PartialEq)]
enum Padding {
    Zeros,
    Border,
    Reflection,
}

fn grid_sample(cx: &OpCtx<'_>, c: &CustomOp, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let grid = tensor(cx, inputs, 1)?;
    let r = x.rank().saturating_sub(2);
    if x.rank() < 3 || grid.rank() != r + 2 || grid.shape[r + 1] != r || grid.shape[0] != x.shape[0]
    {
        return Err(cx.invalid(format!(
            "GridSample needs X [N, C, D...] and grid [N, H..., {r}], got {:?} and {:?}",
            x.shape, grid.shape
        )));
    }
    let mode = match attr_str(c, "mode").unwrap_or("linear") {
        "linear" | "bilinear" => 1,
        "nearest" => 0,
        "cubic" | "bicubic" => 2,
        m => return Err(cx.unsupported(format!("mode '{m}'"))),
    };
    let padding = match attr_str(c, "padding_mode").unwrap_or("zeros") {
        "zeros" => Padding::Zeros,
        "border" => Padding::Border,
        "reflection" => Padding::Reflection,
        p => return Err(cx.unsupported(format!("padding_mode '{p}'"))),
    };
    let align = attr_i64(c, "align_corners", 0) != 0;
    let (n, ch) = (x.shape[0], x.shape[1]);
    let dims: Vec<usize> = x.shape[2..].to_vec();
    let out_sp: Vec<usize> = grid.shape[1..=r].to_vec();
    let npts: usize = out_sp.iter().product();
    let img: usize = dims.iter().product();
    let xs = util::strides(&dims);
    let xv = x.to_f64()?;
    let gv = grid.to_f64()?;
    let border: Vec<(f64, f64)> = dims
        .iter()
        .map(|&d| {
            if align {
                (0.0, d as f64 - 1.0)
            } else {
                (-0.5, d as f64 - 0.5)
            }
        })
        .collect();
    // Index along one dim after padding; `None` reads zero.
    let fetch_index = |i: i64, d: usize| -> Option<usize> {
        let len = dims[d] as i64;
        match padding {
            Padding::Zeros => (0..len).contains(&i).then_some(i as usize),
            Padding::Border => Some(i.clamp(0, len - 1) as usize),
            Padding::Reflection => {
                let v = reflect(i as f64, border[d].0, border[d].1) as i64;
                Some(v.clamp(0, len - 1) as usize)
            }
        }
    };
    let taps = [1usize, 2, 4][mode];
    let mut out = vec![0.0; n * ch * npts];
    // Per dim: (first tap index, weights).
    let mut tap_start = vec![0i64; r];
    let mut weights = vec![[0.0f64; 4]; r];
    let mut tap = vec![0usize; r];
    for b in 0..n {
        for p in 0..npts {
            let g = &gv[(b * npts + p) * r..(b * npts + p + 1) * r];
            for d in 0..r {
                // The grid lists coordinates innermost dim first (x, y, z).
                let gn = g[r - 1 - d];
                let len = dims[d] as f64;
                let mut v = if align {
                    (gn + 1.0) / 2.0 * (len - 1.0)
                } else {
                    ((gn + 1.0) * len - 1.0) / 2.0
                };
                if mode == 0 {
                    v = crate::numeric::round_half_even(v);
                }
                let (lo, hi) = border[d];
                if v < lo || v > hi {
                    match padding {
                        Padding::Border => v = v.clamp(0.0, len - 1.0),
                        Padding::Reflection => v = reflect(v, lo, hi),
                        Padding::Zeros => {}
                    }
                }
                match mode {
                    0 => {
                        tap_start[d] = v as i64;
                        weights[d][0] = 1.0;
                    }
                    1 => {
                        let f = v.floor();
                        tap_start[d] = f as i64;
                        weights[d][0] = 1.0 - (v - f);
                        weights[d][1] = v - f;
                    }
                    _ => {
                        let f = v.floor();
                        tap_start[d] = f as i64 - 1;
                        weights[d] = cubic_weights(v - f);
                    }
                }
            }
            for cc in 0..ch {
                let base = (b * ch + cc) * img;
                let mut acc = 0.0;
                tap.iter_mut().for_each(|t| *t = 0);
                loop {
                    let mut w = 1.0;
                    let mut lin = Some(0usize);
                    for d in 0..r {
                        w *= weights[d][tap[d]];
                        lin = match (lin, fetch_index(tap_start[d] + tap[d] as i64, d)) {
                            (Some(l), Some(i)) => Some(l + i * xs[d]),
                            _ => None,
                        };
                    }
                    if let Some(l) = lin {
                        acc += w * xv[base + l];
                    }
                    // Next tap combination (odometer); done when it wraps around.
                    let mut wrapped = true;
                    for d in (0..r).rev() {
                        tap[d] += 1;
                        if tap[d] < taps {
                            wrapped = false;
                            break;
                        }
                        tap[d] = 0;
                    }
                    if wrapped {
                        break;
                    }
                }
                out[(b * ch + cc) * npts + p] = acc;
            }
        }
    }
    let mut shape = vec![n, ch];
    shape.extend(out_sp);
    one(Tensor::from_f64_as(x.dtype, shape, &out)?)
}

fn string_normalizer(cx: &OpCtx<'_>, c: &CustomOp, inputs: &[Option<RtValue>]) -> OpResult {
    let (x, xv) = strings(cx, inputs, 0)?;
    let two_d = match x.shape.as_slice() {
        [_] => false,
        [1, _] => true,
        s => return Err(cx.invalid(format!("input must be [C] or [1, C], got {s:?}"))),
    };
    let case_sensitive = attr_i64(c, "is_case_sensitive", 0) != 0;
    let stops: Vec<String> = match attr(c, "stopwords") {
        Some(Attr::Strings(v)) => v
            .iter()
            .map(|w| {
                if case_sensitive {
                    w.clone()
                } else {
                    w.to_lowercase()
                }
            })
            .collect(),
        _ => Vec::new(),
    };
    let action = attr_str(c, "case_change_action").unwrap_or("NONE");
    let mut out: Vec<String> = xv
        .iter()
        .filter(|w| {
            let key = if case_sensitive {
                (*w).clone()
            } else {
                w.to_lowercase()
            };
            !stops.contains(&key)
        })
        .map(|w| match action {
            "LOWER" => w.to_lowercase(),
            "UPPER" => w.to_uppercase(),
            _ => w.clone(),
        })
        .collect();
    if out.is_empty() {
        out.push(String::new());
    }
    let shape = if two_d {
        vec![1, out.len()]
    } else {
        vec![out.len()]
    };
    one(Tensor::new(DType::String, shape, Data::Str(out))?)
}

fn swiglu(cx: &OpCtx<'_>, c: &CustomOp, inputs: &[Option<RtValue>]) -> OpResult {
    let a = tensor(cx, inputs, 0)?;
    let b = tensor(cx, inputs, 1)?;
    if a.shape != b.shape || a.dtype != b.dtype {
        return Err(cx.invalid(format!(
            "A and B must have the same type, got {}{:?} and {}{:?}",
            a.dtype, a.shape, b.dtype, b.shape
        )));
    }
    let alpha = attr_f32(c, "alpha", 1.0);
    let data = match (&a.data, &b.data) {
        (Data::F64(av), Data::F64(bv)) => {
            let alpha = f64::from(alpha);
            Data::F64(
                av.iter()
                    .zip(bv)
                    .map(|(&x, &y)| x * (1.0 / (1.0 + (-alpha * x).exp())) * y)
                    .collect(),
            )
        }
        _ => {
            let av = a.to_f32()?;
            let bv = b.to_f32()?;
            let v: Vec<f64> = av
                .iter()
                .zip(&bv)
                .map(|(&x, &y)| f64::from(x * (1.0 / (1.0 + (-alpha * x).exp())) * y))
                .collect();
            return one(Tensor::from_f64_as(a.dtype, a.shape.clone(), &v)?);
        }
    };
    one(Tensor::new(a.dtype, a.shape.clone(), data)?)
}

fn tensor_scatter(cx: &OpCtx<'_>, c: &CustomOp, inputs: &[Option<RtValue>]) -> OpResult {
    let past = tensor(cx, inputs, 0)?;
    let update = tensor(cx, inputs, 1)?;
    let rank = past.rank();
    let axis = util::axis(cx, attr_i64(c, "axis", -2), rank)?;
    let circular = match attr_str(c, "mode").unwrap_or("linear") {
        "linear" => false,
        "circular" => true,
        m => return Err(cx.invalid(format!("unknown mode '{m}'"))),
    };
    let fits = axis >= 1
        && update.rank() == rank
        && update.dtype == past.dtype
        && (0..rank).all(|i| {
            if i == axis {
                update.shape[i] <= past.shape[i]
            } else {
                update.shape[i] == past.shape[i]
            }
        });
    if !fits {
        return Err(cx.invalid(format!(
            "update {:?} does not fit cache {:?} on axis {axis}",
            update.shape, past.shape
        )));
    }
    let batch = past.shape[0];
    let write: Vec<i64> = match opt_tensor(inputs, 2) {
        Some(t) => t.to_i64()?,
        None => vec![0; batch],
    };
    if write.len() < batch {
        return Err(cx.invalid("write_indices needs one entry per batch"));
    }
    let (outer, max_len, inner) = data::split_at_axis(&past.shape, axis);
    let seq = update.shape[axis];
    let per_batch = outer / batch.max(1);
    // (destination row, source row) pairs, checked before any copy.
    let mut moves = Vec::with_capacity(outer * seq);
    for o in 0..outer {
        let b = o / per_batch.max(1);
        for s in 0..seq {
            let mut dst = write[b] + s as i64;
            if circular {
                dst = dst.rem_euclid(max_len as i64);
            }
            if dst < 0 || dst >= max_len as i64 {
                return Err(cx.invalid(format!(
                    "write index {dst} is out of range for a cache of length {max_len}"
                )));
            }
            moves.push(((o * max_len + dst as usize) * inner, (o * seq + s) * inner));
        }
    }
    let data = map_any!(&past.data, |v, get| {
        let mut out = v.clone();
        let src = get(&update.data).unwrap_or(&[]);
        for &(d, s) in &moves {
            out[d..d + inner].clone_from_slice(&src[s..s + inner]);
        }
        out
    });
    one(Tensor::new(past.dtype, past.shape.clone(), data)?)
}

fn max_unpool(cx: &OpCtx<'_>, c: &CustomOp, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let idx = tensor(cx, inputs, 1)?.to_i64()?;
    let r = x.rank().saturating_sub(2);
    let kernel = attr_ints(c, "kernel_shape")
        .ok_or_else(|| cx.invalid("kernel_shape is required"))?
        .to_vec();
    let strides = attr_ints(c, "strides").map_or(vec![1; r], <[i64]>::to_vec);
    let pads = attr_ints(c, "pads").map_or(vec![0; 2 * r], <[i64]>::to_vec);
    if x.rank() < 3 || kernel.len() != r || strides.len() != r || pads.len() != 2 * r {
        return Err(cx.invalid("kernel_shape, strides and pads must match the spatial rank"));
    }
    if idx.len() != x.len() {
        return Err(cx.invalid("indices must have the shape of X"));
    }
    let mut inferred = x.shape[..2].to_vec();
    for d in 0..r {
        let v = (x.shape[d + 2] as i64 - 1) * strides[d] + kernel[d] - pads[d] - pads[d + r];
        inferred.push(v.max(0) as usize);
    }
    let total: usize = inferred.iter().product();
    let xv = x.to_f64()?;
    let mut out = vec![0.0; total];
    for (&i, &v) in idx.iter().zip(&xv) {
        let i = usize::try_from(i)
            .ok()
            .filter(|&i| i < total)
            .ok_or_else(|| cx.invalid(format!("index {i} is out of range for {total}")))?;
        out[i] = v;
    }
    let Some(target) = opt_tensor(inputs, 2) else {
        return one(Tensor::from_f64_as(x.dtype, inferred, &out)?);
    };
    // An explicit output shape holds the unpooled tensor in its leading corner.
    let shape: Vec<usize> = target
        .to_i64()?
        .iter()
        .map(|&d| d.max(0) as usize)
        .collect();
    if shape.len() != inferred.len() || shape.iter().zip(&inferred).any(|(s, i)| s < i) {
        return Err(cx.invalid(format!(
            "output_shape {shape:?} is smaller than the unpooled shape {inferred:?}"
        )));
    }
    let n: usize = shape.iter().product();
    let mut res = vec![0.0; n];
    let dst_strides = util::strides(&shape);
    let mut pos = vec![0usize; inferred.len()];
    for &v in &out {
        let lin: usize = pos.iter().zip(&dst_strides).map(|(p, s)| p * s).sum();
        res[lin] = v;
        for d in (0..pos.len()).rev() {
            pos[d] += 1;
            if pos[d] < inferred[d] {
                break;
            }
            pos[d] = 0;
        }
    }
    let (shape, out) = (shape, res);
    one(Tensor::from_f64_as(x.dtype, shape, &out)?)
}

fn tfidf(cx: &OpCtx<'_>, c: &CustomOp, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let words: Vec<String> = match &x.data {
        Data::Str(v) => v.clone(),
        _ => x.to_i64()?.iter().map(i64::to_string).collect(),
    };
    let pool: Vec<String> = match (attr(c, "pool_strings"), attr(c, "pool_int64s")) {
        (Some(Attr::Strings(v)), _) => v.clone(),
        (_, Some(Attr::Ints(v))) => v.iter().map(i64::to_string).collect(),
        _ => return Err(cx.invalid("needs pool_strings or pool_int64s")),
    };
    let counts = attr_ints(c, "ngram_counts").unwrap_or(&[]);
    let indexes = attr_ints(c, "ngram_indexes").unwrap_or(&[]);
    let weights: Vec<f32> = match attr(c, "weights") {
        Some(Attr::Floats(v)) => v.clone(),
        _ => Vec::new(),
    };
    let min_n = attr_i64(c, "min_gram_length", 1).max(1) as usize;
    let max_n = attr_i64(c, "max_gram_length", 1).max(1) as usize;
    let max_skip = attr_i64(c, "max_skip_count", 0).max(0) as usize;
    let mode = attr_str(c, "mode").unwrap_or("TF");
    // Pool n-gram → position in pool order (the index into ngram_indexes).
    let mut table: std::collections::HashMap<(usize, &[String]), usize> =
        std::collections::HashMap::new();
    let mut k = 0usize;
    for (gi, &start) in counts.iter().enumerate() {
        let n = gi + 1;
        let end = counts.get(gi + 1).map_or(pool.len() as i64, |&e| e);
        if start < 0 || end < start || end as usize > pool.len() {
            return Err(cx.invalid("ngram_counts do not fit the pool"));
        }
        for chunk in pool[start as usize..end as usize].chunks(n) {
            table.insert((n, chunk), k);
            k += 1;
        }
    }
    if indexes.len() != k || indexes.iter().any(|&i| i < 0) {
        return Err(cx.invalid("ngram_indexes must hold one index per pool n-gram"));
    }
    let width = indexes.iter().max().map_or(0, |&m| m as usize + 1);
    let (rows, len) = match x.shape.as_slice() {
        [n] => (1, *n),
        [b, n] => (*b, *n),
        s => return Err(cx.invalid(format!("input must be 1-d or 2-d, got {s:?}"))),
    };
    let mut out = vec![0f32; rows * width];
    let mut gram: Vec<String> = Vec::with_capacity(max_n);
    for r in 0..rows {
        let row = &words[r * len..(r + 1) * len];
        for n in min_n..=max_n {
            let skips = if n == 1 { 0 } else { max_skip };
            for skip in 0..=skips {
                let span = (n - 1) * (skip + 1);
                for s0 in 0..len.saturating_sub(span) {
                    gram.clear();
                    gram.extend((0..n).map(|j| row[s0 + j * (skip + 1)].clone()));
                    if let Some(&p) = table.get(&(n, gram.as_slice())) {
                        out[r * width + indexes[p] as usize] += 1.0;
                    }
                }
            }
        }
    }
    for (p, &oi) in indexes.iter().enumerate() {
        let w = weights.get(p).copied().unwrap_or(1.0);
        for r in 0..rows {
            let v = &mut out[r * width + oi as usize];
            *v = match mode {
                "IDF" => {
                    if *v > 0.0 {
                        w
                    } else {
                        0.0
                    }
                }
                "TFIDF" => *v * w,
                _ => *v,
            };
        }
    }
    let shape = if x.rank() == 1 {
        vec![width]
    } else {
        vec![rows, width]
    };
    one(Tensor::from_f32(shape, out)?)
}

fn mel_weight_matrix(cx: &OpCtx<'_>, c: &CustomOp, inputs: &[Option<RtValue>]) -> OpResult {
    let bins = scalar(cx, inputs, 0)?;
    let dft_length = scalar(cx, inputs, 1)?;
    let rate = scalar(cx, inputs, 2)?;
    let edge = |i: usize| -> Result<f32, KernelError> {
        tensor(cx, inputs, i)?
            .to_f32()?
            .first()
            .copied()
            .ok_or_else(|| cx.invalid(format!("operand {i} is empty")))
    };
    let (lo, hi) = (edge(3)?, edge(4)?);
    if bins <= 0 || dft_length <= 0 || rate <= 0 {
        return Err(cx.invalid("num_mel_bins, dft_length and sample_rate must be positive"));
    }
    let dtype = i32::try_from(attr_i64(c, "output_datatype", 1))
        .ok()
        .and_then(DType::from_onnx_code)
        .ok_or_else(|| cx.invalid("unknown output_datatype"))?;
    let (nb, spec) = (bins as usize, (dft_length / 2 + 1) as usize);
    // Mel edges in f32 and the bin grid in f64, as the ONNX reference computes them.
    let ln10 = std::f32::consts::LN_10;
    let lo_mel = 2595.0f32 * (lo / 700.0).ln_1p() / ln10;
    let hi_mel = 2595.0f32 * (hi / 700.0).ln_1p() / ln10;
    let step = (hi_mel - lo_mel) / (nb + 2) as f32;
    let points: Vec<i64> = (0..nb + 2)
        .map(|k| {
            let mel = k as f64 * f64::from(step) + f64::from(lo_mel);
            let hz = 700.0 * (mel / 2595.0 * std::f64::consts::LN_10).exp_m1();
            (((dft_length + 1) as f64 * hz) / rate as f64).floor() as i64
        })
        .collect();
    let mut out = vec![0.0; spec * nb];
    let mut set = |j: i64, i: usize, v: f64| -> Result<(), KernelError> {
        let j = usize::try_from(j)
            .ok()
            .filter(|&j| j < spec)
            .ok_or_else(|| cx.invalid(format!("mel bin edge {j} is outside {spec} bins")))?;
        out[j * nb + i] = v;
        Ok(())
    };
    for i in 0..nb {
        let (l, m, h) = (points[i], points[i + 1], points[i + 2]);
        if m == l {
            set(m, i, 1.0)?;
        } else {
            for j in l..=m {
                set(j, i, (j - l) as f64 / (m - l) as f64)?;
            }
        }
        if h > m {
            for j in m..h {
                set(j, i, (h - j) as f64 / (h - m) as f64)?;
            }
        }
    }
    one(Tensor::from_f64_as(dtype, vec![spec, nb], &out)?)
}

fn roi_align(cx: &OpCtx<'_>, c: &CustomOp, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let rois = tensor(cx, inputs, 1)?;
    let batch_idx = tensor(cx, inputs, 2)?.to_i64()?;
    if x.rank() != 4 || rois.rank() != 2 || rois.shape[1] != 4 || rois.shape[0] != batch_idx.len() {
        return Err(cx.invalid(format!(
            "RoiAlign needs X [N, C, H, W], rois [R, 4], batch_indices [R], got {:?}, {:?}, {}",
            x.shape,
            rois.shape,
            batch_idx.len()
        )));
    }
    let default_mode = if cx.opset >= 16 {
        "half_pixel"
    } else {
        "output_half_pixel"
    };
    let half_pixel =
        attr_str(c, "coordinate_transformation_mode").unwrap_or(default_mode) == "half_pixel";
    let max_mode = attr_str(c, "mode").unwrap_or("avg") == "max";
    let oh = attr_i64(c, "output_height", 1).max(1) as usize;
    let ow = attr_i64(c, "output_width", 1).max(1) as usize;
    let ratio = attr_i64(c, "sampling_ratio", 0);
    let scale = f64::from(attr_f32(c, "spatial_scale", 1.0));
    let (n, ch, h, w) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
    let xv = x.to_f64()?;
    let rv = rois.to_f64()?;
    let nr = batch_idx.len();
    let mut out = vec![0.0; nr * ch * oh * ow];
    let (hf, wf) = (h as f64, w as f64);
    for (r, &b) in batch_idx.iter().enumerate() {
        let b = usize::try_from(b)
            .ok()
            .filter(|&b| b < n)
            .ok_or_else(|| cx.invalid(format!("batch index {b} is out of range for {n}")))?;
        let off = if half_pixel { 0.5 } else { 0.0 };
        let roi = &rv[r * 4..r * 4 + 4];
        let (sw, sh) = (roi[0] * scale - off, roi[1] * scale - off);
        let (mut rw, mut rh) = (roi[2] * scale - off - sw, roi[3] * scale - off - sh);
        if !half_pixel {
            rw = rw.max(1.0);
            rh = rh.max(1.0);
        }
        let (bh, bw) = (rh / oh as f64, rw / ow as f64);
        let gh = if ratio > 0 {
            ratio as usize
        } else {
            (rh / oh as f64).ceil().max(0.0) as usize
        };
        let gw = if ratio > 0 {
            ratio as usize
        } else {
            (rw / ow as f64).ceil().max(0.0) as usize
        };
        let count = (gh * gw).max(1) as f64;
        // Per output cell, the bilinear taps of every sample: ([positions], [weights]).
        let mut taps: Vec<([usize; 4], [f64; 4])> = Vec::with_capacity(oh * ow * gh * gw);
        for ph in 0..oh {
            for pw in 0..ow {
                for iy in 0..gh {
                    let yy = sh + ph as f64 * bh + (iy as f64 + 0.5) * bh / gh as f64;
                    for ix in 0..gw {
                        let xx = sw + pw as f64 * bw + (ix as f64 + 0.5) * bw / gw as f64;
                        if yy < -1.0 || yy > hf || xx < -1.0 || xx > wf || h == 0 || w == 0 {
                            taps.push(([0; 4], [0.0; 4]));
                            continue;
                        }
                        let (mut y, mut xq) = (yy.max(0.0), xx.max(0.0));
                        let (mut yl, mut xl) = (y as usize, xq as usize);
                        let (yh, xh);
                        if yl >= h - 1 {
                            yl = h - 1;
                            yh = yl;
                            y = yl as f64;
                        } else {
                            yh = yl + 1;
                        }
                        if xl >= w - 1 {
                            xl = w - 1;
                            xh = xl;
                            xq = xl as f64;
                        } else {
                            xh = xl + 1;
                        }
                        let (ly, lx) = (y - yl as f64, xq - xl as f64);
                        let (hy, hx) = (1.0 - ly, 1.0 - lx);
                        taps.push((
                            [yl * w + xl, yl * w + xh, yh * w + xl, yh * w + xh],
                            [hy * hx, hy * lx, ly * hx, ly * lx],
                        ));
                    }
                }
            }
        }
        let per_cell = gh * gw;
        for cc in 0..ch {
            let img = &xv[(b * ch + cc) * h * w..(b * ch + cc + 1) * h * w];
            for cell in 0..oh * ow {
                let samples = &taps[cell * per_cell..(cell + 1) * per_cell];
                let v = if max_mode {
                    samples
                        .iter()
                        .map(|(p, wt)| {
                            (0..4)
                                .map(|k| wt[k] * img.get(p[k]).copied().unwrap_or(0.0))
                                .fold(f64::NEG_INFINITY, f64::max)
                        })
                        .fold(None, |acc: Option<f64>, v| {
                            Some(acc.map_or(v, |a| a.max(v)))
                        })
                        .unwrap_or(0.0)
                } else {
                    samples
                        .iter()
                        .map(|(p, wt)| {
                            (0..4)
                                .map(|k| wt[k] * img.get(p[k]).copied().unwrap_or(0.0))
                                .sum::<f64>()
                        })
                        .sum::<f64>()
                        / count
                };
                out[(r * ch + cc) * oh * ow + cell] = v;
            }
        }
    }
    one(Tensor::from_f64_as(x.dtype, vec![nr, ch, oh, ow], &out)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_split() {
        assert_eq!(py_split("a,b,,c", Some(","), None), vec!["a", "b", "", "c"]);
        assert_eq!(py_split("a,b,c", Some(","), Some(1)), vec!["a", "b,c"]);
        assert_eq!(py_split("  a  b c ", None, None), vec!["a", "b", "c"]);
        assert_eq!(py_split("  a  b c ", None, Some(1)), vec!["a", "b c "]);
        assert!(py_split("   ", None, None).is_empty());
    }

    #[test]
    fn determinants() {
        assert_eq!(determinant(&mut [1.0, 2.0, 3.0, 4.0], 2), -2.0);
        assert_eq!(determinant(&mut [0.0, 1.0, 1.0, 0.0], 2), -1.0);
        assert_eq!(determinant(&mut [1.0, 2.0, 2.0, 4.0], 2), 0.0);
    }
}
