//! Indexing ops: gathers, scatters, one-hot, non-zero, top-k, triangles.

use half::{bf16, f16};
use mmq_ir::DType;

use crate::error::KernelError;
use crate::ops::data::{append, axis_in, ints, like, map_any, norm_index, sdim, take};
use crate::ops::shape::single;
use crate::ops::util::{opt_tensor, strides, tensor};
use crate::ops::{OpCtx, OpResult};
use crate::tensor::{Data, RtValue, Tensor};

/// The elements of an index operand (int32 or int64).
fn indices(cx: &OpCtx<'_>, t: &Tensor) -> Result<Vec<i64>, KernelError> {
    match t.dtype {
        DType::I64 | DType::I32 => t.to_i64(),
        d => Err(cx.invalid(format!("indices must be int32 or int64, got {d}"))),
    }
}

/// Copies runs of `len` elements starting at each of `starts`.
fn copy_runs(data: &Data, starts: &[usize], len: usize) -> Data {
    map_any!(data, |v| {
        let mut out = Vec::with_capacity(starts.len() * len);
        for &s in starts {
            out.extend_from_slice(&v[s..s + len]);
        }
        out
    })
}

pub(super) fn gather(cx: &OpCtx<'_>, inputs: &[Option<RtValue>], axis: i64) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let it = tensor(cx, inputs, 1)?;
    let a = axis_in(cx, axis, x.rank())?;
    let dim = x.shape[a];
    let idx = indices(cx, it)?
        .into_iter()
        .map(|i| norm_index(cx, i, dim, "index"))
        .collect::<Result<Vec<_>, _>>()?;
    let outer: usize = x.shape[..a].iter().product();
    let inner: usize = x.shape[a + 1..].iter().product();
    let mut shape = x.shape[..a].to_vec();
    shape.extend_from_slice(&it.shape);
    shape.extend_from_slice(&x.shape[a + 1..]);
    let data = if inner == 1 {
        let flat: Vec<usize> = (0..outer)
            .flat_map(|o| idx.iter().map(move |&i| o * dim + i))
            .collect();
        take(&x.data, &flat)
    } else {
        let starts: Vec<usize> = (0..outer)
            .flat_map(|o| idx.iter().map(move |&i| (o * dim + i) * inner))
            .collect();
        copy_runs(&x.data, &starts, inner)
    };
    single(like(x, shape, data)?)
}

/// Calls `f(linear, multi_index)` for every element of `shape`, row-major.
fn for_each_index(shape: &[usize], mut f: impl FnMut(usize, &[usize])) {
    let n: usize = shape.iter().product();
    let mut idx = vec![0usize; shape.len()];
    for lin in 0..n {
        f(lin, &idx);
        for d in (0..shape.len()).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// For `take_along_axis`-style ops: the linear index into `x` for each element of an index
/// tensor of shape `ishape` holding `idx`, along axis `a`.
fn along_axis(
    cx: &OpCtx<'_>,
    xshape: &[usize],
    ishape: &[usize],
    idx: &[i64],
    a: usize,
) -> Result<Vec<usize>, KernelError> {
    if ishape.len() != xshape.len()
        || ishape
            .iter()
            .zip(xshape)
            .enumerate()
            .any(|(k, (i, d))| k != a && i > d)
    {
        return Err(cx.invalid(format!(
            "indices of shape {ishape:?} do not fit data of shape {xshape:?}"
        )));
    }
    let st = strides(xshape);
    let dim = xshape[a];
    let mut out = Vec::with_capacity(idx.len());
    let mut err = None;
    for_each_index(ishape, |lin, p| {
        match norm_index(cx, idx[lin], dim, "index") {
            Ok(j) => {
                let base: usize = p
                    .iter()
                    .zip(&st)
                    .enumerate()
                    .map(|(k, (&i, &s))| if k == a { j * s } else { i * s })
                    .sum();
                out.push(base);
            }
            Err(e) => {
                err.get_or_insert(e);
                out.push(0);
            }
        }
    });
    match err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

pub(super) fn gather_elements(cx: &OpCtx<'_>, inputs: &[Option<RtValue>], axis: i64) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let it = tensor(cx, inputs, 1)?;
    let a = axis_in(cx, axis, x.rank())?;
    let src = along_axis(cx, &x.shape, &it.shape, &indices(cx, it)?, a)?;
    single(like(x, it.shape.clone(), take(&x.data, &src))?)
}

/// GatherND/ScatterND addressing: for each index tuple, the start of its slice in the data,
/// the slice length, and the shape of the index tuples (indices shape without the last axis).
fn nd_slices(
    cx: &OpCtx<'_>,
    xshape: &[usize],
    it: &Tensor,
    batch_dims: usize,
) -> Result<(Vec<usize>, usize), KernelError> {
    let q = it.rank();
    let r = xshape.len();
    let b = batch_dims;
    if b >= q.min(r) {
        return Err(cx.invalid(format!(
            "batch_dims {b} does not fit indices of rank {q} and data of rank {r}"
        )));
    }
    let m = it.shape[q - 1];
    if b + m > r || it.shape[..b] != xshape[..b] {
        return Err(cx.invalid(format!(
            "indices of shape {:?} (batch_dims {b}) do not fit data of shape {xshape:?}",
            it.shape
        )));
    }
    let idx = indices(cx, it)?;
    let st = strides(xshape);
    let slice: usize = xshape[b + m..].iter().product();
    let batch_size: usize = xshape[b..].iter().product();
    let tuples: usize = it.shape[..q - 1].iter().product();
    let per_batch: usize = it.shape[b..q - 1].iter().product();
    let mut starts = Vec::with_capacity(tuples);
    for t in 0..tuples {
        let bi = t / per_batch.max(1);
        let mut off = bi * batch_size;
        for j in 0..m {
            let k = norm_index(cx, idx[t * m + j], xshape[b + j], "index")?;
            off += k * st[b + j];
        }
        starts.push(off);
    }
    Ok((starts, slice))
}

pub(super) fn gather_nd(cx: &OpCtx<'_>, inputs: &[Option<RtValue>], batch_dims: i64) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let it = tensor(cx, inputs, 1)?;
    let b = usize::try_from(batch_dims)
        .map_err(|_| cx.invalid(format!("batch_dims {batch_dims} is negative")))?;
    let (starts, slice) = nd_slices(cx, &x.shape, it, b)?;
    let q = it.rank();
    let m = it.shape[q - 1];
    let mut shape = it.shape[..q - 1].to_vec();
    shape.extend_from_slice(&x.shape[b + m..]);
    single(like(x, shape, copy_runs(&x.data, &starts, slice))?)
}

/// How scattered updates combine with the existing element.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reduction {
    None,
    Add,
    Mul,
    Max,
    Min,
}

/// Element arithmetic for the scatter reductions (numpy semantics: integers wrap, NaN
/// propagates through max/min, bool add/mul are or/and).
trait Arith: Copy {
    fn combine(self, o: Self, r: Reduction) -> Self;
}

macro_rules! int_arith {
    ($($t:ty)*) => {$(
        impl Arith for $t {
            fn combine(self, o: Self, r: Reduction) -> Self {
                match r {
                    Reduction::None => o,
                    Reduction::Add => self.wrapping_add(o),
                    Reduction::Mul => self.wrapping_mul(o),
                    Reduction::Max => self.max(o),
                    Reduction::Min => self.min(o),
                }
            }
        }
    )*};
}
int_arith!(u8 i8 u16 i16 u32 i32 u64 i64);

impl Arith for bool {
    fn combine(self, o: Self, r: Reduction) -> Self {
        match r {
            Reduction::None => o,
            Reduction::Add | Reduction::Max => self | o,
            Reduction::Mul | Reduction::Min => self & o,
        }
    }
}

fn float_combine(a: f64, b: f64, r: Reduction) -> f64 {
    match r {
        Reduction::None => b,
        Reduction::Add => a + b,
        Reduction::Mul => a * b,
        Reduction::Max if a.is_nan() || b.is_nan() => f64::NAN,
        Reduction::Max => a.max(b),
        Reduction::Min if a.is_nan() || b.is_nan() => f64::NAN,
        Reduction::Min => a.min(b),
    }
}

impl Arith for f32 {
    fn combine(self, o: Self, r: Reduction) -> Self {
        match r {
            Reduction::Add => self + o,
            Reduction::Mul => self * o,
            _ => float_combine(f64::from(self), f64::from(o), r) as f32,
        }
    }
}

impl Arith for f64 {
    fn combine(self, o: Self, r: Reduction) -> Self {
        float_combine(self, o, r)
    }
}

impl Arith for f16 {
    fn combine(self, o: Self, r: Reduction) -> Self {
        f16::from_f32(f32::from(self).combine(f32::from(o), r))
    }
}

impl Arith for bf16 {
    fn combine(self, o: Self, r: Reduction) -> Self {
        bf16::from_f32(f32::from(self).combine(f32::from(o), r))
    }
}

fn apply<T: Arith>(out: &mut [T], upd: &[T], pairs: &[(usize, usize)], r: Reduction) {
    for &(d, s) in pairs {
        out[d] = out[d].combine(upd[s], r);
    }
}

fn reduction(cx: &OpCtx<'_>, r: Option<&str>) -> Result<Reduction, KernelError> {
    Ok(match r.unwrap_or("none") {
        "none" => Reduction::None,
        "add" => Reduction::Add,
        "mul" => Reduction::Mul,
        "max" => Reduction::Max,
        "min" => Reduction::Min,
        o => return Err(cx.invalid(format!("unknown reduction '{o}'"))),
    })
}

/// `data` with `updates[s]` combined into element `d` for each `(d, s)` pair, in order.
fn scatter(
    cx: &OpCtx<'_>,
    x: &Tensor,
    upd: &Tensor,
    pairs: &[(usize, usize)],
    r: Reduction,
) -> Result<Tensor, KernelError> {
    if upd.dtype != x.dtype {
        return Err(cx.invalid(format!("updates are {}, the data {}", upd.dtype, x.dtype)));
    }
    let mut out = x.data.clone();
    macro_rules! arith {
        ($($var:ident)*) => {
            match (&mut out, &upd.data) {
                $((Data::$var(o), Data::$var(u)) => apply(o, u, pairs, r),)*
                _ => return Err(cx.unsupported(format!("reduction on {}", x.dtype))),
            }
        };
    }
    if r == Reduction::None {
        // Assignment works for every variant.
        map_assign(&mut out, &upd.data, pairs);
    } else {
        arith!(Bool U8 I8 U16 I16 U32 I32 U64 I64 F16 BF16 F32 F64);
    }
    like(x, x.shape.clone(), out)
}

fn assign_vec<T: Clone>(o: &mut [T], u: &[T], pairs: &[(usize, usize)]) {
    for &(d, s) in pairs {
        o[d] = u[s].clone();
    }
}

/// `out[d] = upd[s]` for each pair, over any variant (both of the same variant).
fn map_assign(out: &mut Data, upd: &Data, pairs: &[(usize, usize)]) {
    macro_rules! assign {
        ($($var:ident)*) => {
            match (out, upd) {
                $((Data::$var(o), Data::$var(u)) => assign_vec(o, u, pairs),)*
                _ => {}
            }
        };
    }
    assign!(Bool U8 I8 U16 I16 U32 I32 U64 I64 F16 BF16 F32 F64 Str Codes);
}

pub(super) fn scatter_nd(
    cx: &OpCtx<'_>,
    inputs: &[Option<RtValue>],
    red: Option<&str>,
) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let it = tensor(cx, inputs, 1)?;
    let upd = tensor(cx, inputs, 2)?;
    let r = reduction(cx, red)?;
    let (starts, slice) = nd_slices(cx, &x.shape, it, 0)?;
    let q = it.rank();
    let m = it.shape[q - 1];
    let mut ushape = it.shape[..q - 1].to_vec();
    ushape.extend_from_slice(&x.shape[m..]);
    if upd.shape != ushape {
        return Err(cx.invalid(format!(
            "updates have shape {:?}, expected {ushape:?}",
            upd.shape
        )));
    }
    let pairs: Vec<(usize, usize)> = starts
        .iter()
        .enumerate()
        .flat_map(|(t, &s)| (0..slice).map(move |j| (s + j, t * slice + j)))
        .collect();
    single(scatter(cx, x, upd, &pairs, r)?)
}

pub(super) fn scatter_elements(
    cx: &OpCtx<'_>,
    inputs: &[Option<RtValue>],
    axis: i64,
    red: Option<&str>,
) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let it = tensor(cx, inputs, 1)?;
    let upd = tensor(cx, inputs, 2)?;
    let r = reduction(cx, red)?;
    let a = axis_in(cx, axis, x.rank())?;
    if upd.shape != it.shape {
        return Err(cx.invalid(format!(
            "updates of shape {:?} differ from indices of shape {:?}",
            upd.shape, it.shape
        )));
    }
    let dst = along_axis(cx, &x.shape, &it.shape, &indices(cx, it)?, a)?;
    let pairs: Vec<(usize, usize)> = dst.into_iter().enumerate().map(|(s, d)| (d, s)).collect();
    single(scatter(cx, x, upd, &pairs, r)?)
}

/// Whether each element is non-zero (strings: non-empty).
fn nonzero_mask(t: &Tensor) -> Result<Vec<bool>, KernelError> {
    Ok(match &t.data {
        Data::Bool(v) => v.clone(),
        Data::Str(v) => v.iter().map(|s| !s.is_empty()).collect(),
        Data::F32(v) => v.iter().map(|&x| x != 0.0).collect(),
        _ => t.to_f64()?.into_iter().map(|x| x != 0.0).collect(),
    })
}

pub(super) fn non_zero(cx: &OpCtx<'_>, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let mask = nonzero_mask(x).map_err(|e| cx.invalid(e.to_string()))?;
    // A scalar counts as a 1-d tensor of one element.
    let shape = if x.rank() == 0 {
        vec![1]
    } else {
        x.shape.clone()
    };
    let r = shape.len();
    let hits: Vec<usize> = (0..mask.len()).filter(|&i| mask[i]).collect();
    let n = hits.len();
    let st = strides(&shape);
    let mut out = vec![0i64; r * n];
    for (j, &lin) in hits.iter().enumerate() {
        for k in 0..r {
            out[k * n + j] = ((lin / st[k]) % shape[k]) as i64;
        }
    }
    single(Tensor::from_i64(vec![r, n], out)?)
}

pub(super) fn one_hot(cx: &OpCtx<'_>, inputs: &[Option<RtValue>], axis: i64) -> OpResult {
    let it = tensor(cx, inputs, 0)?;
    let dt = tensor(cx, inputs, 1)?;
    let vals = tensor(cx, inputs, 2)?;
    if vals.len() != 2 {
        return Err(cx.invalid(format!("values must have 2 elements, got {}", vals.len())));
    }
    if dt.len() != 1 {
        return Err(cx.invalid("depth must have one element"));
    }
    let depth = dt.to_f64().map_err(|e| cx.invalid(e.to_string()))?[0] as i64;
    if depth <= 0 {
        return Err(cx.invalid(format!("depth {depth} is not positive")));
    }
    let idx: Vec<i64> = match it.dtype {
        DType::F32 | DType::F64 | DType::F16 | DType::BF16 => it
            .to_f64()
            .map_err(|e| cx.invalid(e.to_string()))?
            .into_iter()
            .map(|x| x as i64)
            .collect(),
        _ => ints(cx, it, "indices")?,
    };
    let r = sdim(it.rank());
    if axis < -r - 1 || axis > r {
        return Err(cx.invalid(format!("axis {axis} is out of range for rank {}", r + 1)));
    }
    let a = if axis < 0 { axis + r + 1 } else { axis } as usize;
    let outer: usize = it.shape[..a].iter().product();
    let inner: usize = it.shape[a..].iter().product();
    let d = depth as usize;
    let mut out_shape = it.shape[..a].to_vec();
    out_shape.push(d);
    out_shape.extend_from_slice(&it.shape[a..]);
    cx.check_result(vals.dtype, &out_shape)?;
    let mut sel = Vec::with_capacity(outer * d * inner);
    for o in 0..outer {
        for k in 0..depth {
            for i in 0..inner {
                let v = idx[o * inner + i];
                let v = if v < 0 { v + depth } else { v };
                sel.push(usize::from(v == k));
            }
        }
    }
    let mut shape = it.shape[..a].to_vec();
    shape.push(d);
    shape.extend_from_slice(&it.shape[a..]);
    single(like(vals, shape, take(&vals.data, &sel))?)
}

/// Orders keys descending (`largest`) or ascending, NaN above every number; ties keep the
/// lower index first.
fn key_order(a: f64, b: f64, largest: bool) -> std::cmp::Ordering {
    let o = a
        .partial_cmp(&b)
        .unwrap_or_else(|| a.is_nan().cmp(&b.is_nan()));
    if largest { o.reverse() } else { o }
}

pub(super) fn top_k(
    cx: &OpCtx<'_>,
    inputs: &[Option<RtValue>],
    axis: i64,
    largest: bool,
) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let kt = tensor(cx, inputs, 1)?;
    let k = ints(cx, kt, "k")?;
    let &[k] = k.as_slice() else {
        return Err(cx.invalid("k must have one element"));
    };
    let a = axis_in(cx, axis, x.rank())?;
    let dim = x.shape[a];
    if k < 0 || k as usize > dim {
        return Err(cx.invalid(format!("k {k} is out of range for a dim of {dim}")));
    }
    let k = k as usize;
    let keys = match &x.data {
        Data::F32(v) => v.iter().map(|&x| f64::from(x)).collect(),
        Data::Str(_) => return Err(cx.unsupported("TopK on strings")),
        _ => x.to_f64()?,
    };
    let outer: usize = x.shape[..a].iter().product();
    let inner: usize = x.shape[a + 1..].iter().product();
    let mut shape = x.shape.clone();
    shape[a] = k;
    let n_out = outer * k * inner;
    let mut src = vec![0usize; n_out];
    let mut pos = vec![0i64; n_out];
    let mut order: Vec<usize> = Vec::with_capacity(dim);
    for o in 0..outer {
        for i in 0..inner {
            let at = |j: usize| (o * dim + j) * inner + i;
            order.clear();
            order.extend(0..dim);
            order.sort_by(|&p, &q| key_order(keys[at(p)], keys[at(q)], largest));
            for (j, &p) in order[..k].iter().enumerate() {
                let dst = (o * k + j) * inner + i;
                src[dst] = at(p);
                pos[dst] = p as i64;
            }
        }
    }
    let values = like(x, shape.clone(), take(&x.data, &src))?;
    let idx = Tensor::from_i64(shape, pos)?;
    Ok(vec![Some(RtValue::from(values)), Some(RtValue::from(idx))])
}

pub(super) fn trilu(cx: &OpCtx<'_>, inputs: &[Option<RtValue>], upper: bool) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    if x.rank() < 2 {
        return Err(cx.invalid(format!("expected rank >= 2, got {:?}", x.shape)));
    }
    let k = match opt_tensor(inputs, 1) {
        Some(t) => match ints(cx, t, "k")?.as_slice() {
            [k] => *k,
            _ => return Err(cx.invalid("k must have one element")),
        },
        None => 0,
    };
    let r = x.rank();
    let (rows, cols) = (x.shape[r - 2], x.shape[r - 1]);
    let n = x.len();
    let idx: Vec<usize> = (0..n)
        .map(|lin| {
            let j = sdim(lin % cols);
            let i = sdim((lin / cols) % rows.max(1));
            let keep = if upper { j - i >= k } else { j - i <= k };
            if keep { lin } else { n }
        })
        .collect();
    let zero = Tensor::zeros(x.dtype, vec![1]).map_err(|e| cx.invalid(e.to_string()))?;
    single(like(
        x,
        x.shape.clone(),
        take(&append(&x.data, &zero.data), &idx),
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_order_keeps_lower_index_first_on_ties() {
        let keys = [1.0, 3.0, 3.0, f64::NAN, 2.0];
        let mut o: Vec<usize> = (0..5).collect();
        o.sort_by(|&p, &q| key_order(keys[p], keys[q], true));
        assert_eq!(o, vec![3, 1, 2, 4, 0]);
        o.sort_by(|&p, &q| key_order(keys[p], keys[q], false));
        assert_eq!(o, vec![0, 4, 1, 2, 3]);
    }

    #[test]
    fn reductions_follow_numpy() {
        assert_eq!(200u8.combine(100, Reduction::Add), 44);
        assert!(1.0f32.combine(f32::NAN, Reduction::Max).is_nan());
        assert!(true.combine(false, Reduction::Add));
        assert!(!true.combine(false, Reduction::Mul));
    }
}
