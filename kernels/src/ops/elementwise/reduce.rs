//! Reductions (`Reduce*`), `ArgMax`/`ArgMin`, `Softmax`/`LogSoftmax`/`Hardmax`, `CumSum`.
//!
//! Every kernel views its input as `(outer, reduced, inner)` blocks; reductions over several
//! axes that are not adjacent first move the reduced axes last.

use mmq_ir::{DType, Op};

use super::binary::Arith;
use super::single;
use crate::error::KernelError;
use crate::ops::util::{axis as norm_axis, opt_tensor, strides, tensor};
use crate::ops::{OpCtx, OpResult};
use crate::tensor::{Data, RtValue, Tensor};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Red {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
    L1,
    L2,
    LogSum,
    LogSumExp,
    SumSquare,
}

/// Folds blocks of `x` viewed as `(outer, red, inner)` into `(outer, inner)`.
fn fold_blocks<T: Copy>(
    x: &[T],
    (outer, red, inner): (usize, usize, usize),
    init: T,
    f: impl Fn(T, T) -> T,
) -> Vec<T> {
    if inner == 1 {
        if red == 0 {
            return vec![init; outer];
        }
        return x
            .chunks_exact(red)
            .map(|row| row.iter().fold(init, |a, &b| f(a, b)))
            .collect();
    }
    let mut out = vec![init; outer * inner];
    if inner == 0 {
        return out;
    }
    for (o, dst) in out.chunks_exact_mut(inner).enumerate() {
        for r in 0..red {
            let base = (o * red + r) * inner;
            for (d, &s) in dst.iter_mut().zip(&x[base..base + inner]) {
                *d = f(*d, s);
            }
        }
    }
    out
}

/// Moves the axes in `red` (sorted) after the others; returns the permuted data.
fn move_last<T: Copy>(x: &[T], shape: &[usize], red: &[usize]) -> Vec<T> {
    let kept: Vec<usize> = (0..shape.len()).filter(|a| !red.contains(a)).collect();
    let perm: Vec<usize> = kept.iter().chain(red).copied().collect();
    let st = strides(shape);
    let pshape: Vec<usize> = perm.iter().map(|&a| shape[a]).collect();
    let pst: Vec<usize> = perm.iter().map(|&a| st[a]).collect();
    let n = x.len();
    let mut out = Vec::with_capacity(n);
    let mut idx = vec![0usize; pshape.len()];
    let mut lin = 0usize;
    for _ in 0..n {
        out.push(x[lin]);
        for d in (0..pshape.len()).rev() {
            idx[d] += 1;
            lin += pst[d];
            if idx[d] < pshape[d] {
                break;
            }
            lin -= pst[d] * idx[d];
            idx[d] = 0;
        }
    }
    out
}

/// The reduction view of `shape` over sorted `axes`: (outer, red, inner) and whether the data must
/// first be permuted (axes not adjacent).
fn view(shape: &[usize], axes: &[usize]) -> ((usize, usize, usize), bool) {
    let red: usize = axes.iter().map(|&a| shape[a]).product();
    let total: usize = shape.iter().product();
    // Axes of size 1 do not matter for adjacency.
    let big: Vec<usize> = axes.iter().copied().filter(|&a| shape[a] != 1).collect();
    let (Some(&lo), Some(&hi)) = (big.first(), big.last()) else {
        return ((total, 1, 1), false);
    };
    if (lo..=hi).all(|a| shape[a] == 1 || axes.contains(&a)) {
        let outer: usize = shape[..lo].iter().product();
        let inner: usize = shape[hi + 1..].iter().product();
        return ((outer, red, inner), false);
    }
    let outer: usize = (0..shape.len())
        .filter(|a| !axes.contains(a))
        .map(|a| shape[a])
        .product();
    ((outer, red, 1), true)
}

fn int_bounds(dtype: DType) -> (i64, i64) {
    match dtype {
        DType::I8 => (i64::from(i8::MIN), i64::from(i8::MAX)),
        DType::U8 => (0, i64::from(u8::MAX)),
        DType::I16 => (i64::from(i16::MIN), i64::from(i16::MAX)),
        DType::U16 => (0, i64::from(u16::MAX)),
        DType::I32 => (i64::from(i32::MIN), i64::from(i32::MAX)),
        DType::U32 => (0, i64::from(u32::MAX)),
        DType::U64 => (0, -1),
        DType::Bool => (0, 1),
        _ => (i64::MIN, i64::MAX),
    }
}

/// An integer (or bool) tensor from i64 values, wrapping like a C cast.
fn from_i64_as(dtype: DType, shape: Vec<usize>, v: Vec<i64>) -> Result<Tensor, KernelError> {
    let data = match dtype {
        DType::I64 => Data::I64(v),
        DType::I32 => Data::I32(v.into_iter().map(|x| x as i32).collect()),
        DType::I16 => Data::I16(v.into_iter().map(|x| x as i16).collect()),
        DType::I8 => Data::I8(v.into_iter().map(|x| x as i8).collect()),
        DType::U8 => Data::U8(v.into_iter().map(|x| x as u8).collect()),
        DType::U16 => Data::U16(v.into_iter().map(|x| x as u16).collect()),
        DType::U32 => Data::U32(v.into_iter().map(|x| x as u32).collect()),
        DType::U64 => Data::U64(v.into_iter().map(|x| x as u64).collect()),
        DType::Bool => Data::Bool(v.into_iter().map(|x| x != 0).collect()),
        _ => {
            let f: Vec<f64> = v.into_iter().map(|x| x as f64).collect();
            return Tensor::from_f64_as(dtype, shape, &f);
        }
    };
    Tensor::new(dtype, shape, data)
}

fn max_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || b > a || b.is_nan() {
        b
    } else {
        a
    }
}

fn min_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || b < a || b.is_nan() {
        b
    } else {
        a
    }
}

fn reduce_f64(kind: Red, x: &[f64], v: (usize, usize, usize)) -> Vec<f64> {
    let n = v.1 as f64;
    match kind {
        Red::Sum => fold_blocks(x, v, 0.0, |a, b| a + b),
        Red::Mean => fold_blocks(x, v, 0.0, |a, b| a + b)
            .into_iter()
            .map(|s| s / n)
            .collect(),
        Red::Max => fold_blocks(x, v, f64::NEG_INFINITY, max_nan),
        Red::Min => fold_blocks(x, v, f64::INFINITY, min_nan),
        Red::Prod => fold_blocks(x, v, 1.0, |a, b| a * b),
        Red::L1 => fold_blocks(x, v, 0.0, |a, b| a + b.abs()),
        Red::L2 => fold_blocks(x, v, 0.0, |a, b| a + b * b)
            .into_iter()
            .map(f64::sqrt)
            .collect(),
        Red::SumSquare => fold_blocks(x, v, 0.0, |a, b| a + b * b),
        Red::LogSum => fold_blocks(x, v, 0.0, |a, b| a + b)
            .into_iter()
            .map(f64::ln)
            .collect(),
        Red::LogSumExp => {
            let (outer, red, inner) = v;
            let m = fold_blocks(x, v, f64::NEG_INFINITY, max_nan);
            let mut s = vec![0.0; outer * inner];
            for o in 0..outer {
                for r in 0..red {
                    let base = (o * red + r) * inner;
                    for i in 0..inner {
                        let mi = m[o * inner + i];
                        let mi = if mi.is_finite() { mi } else { 0.0 };
                        s[o * inner + i] += (x[base + i] - mi).exp();
                    }
                }
            }
            s.iter()
                .zip(&m)
                .map(|(&s, &mi)| s.ln() + if mi.is_finite() { mi } else { 0.0 })
                .collect()
        }
    }
}

fn reduce(cx: &OpCtx<'_>, kind: Red, op: &Op, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let (axes_attr, keepdims, noop) = match op {
        Op::ReduceSum {
            axes,
            keepdims,
            noop_with_empty_axes,
        }
        | Op::ReduceMean {
            axes,
            keepdims,
            noop_with_empty_axes,
        }
        | Op::ReduceMax {
            axes,
            keepdims,
            noop_with_empty_axes,
        }
        | Op::ReduceMin {
            axes,
            keepdims,
            noop_with_empty_axes,
        }
        | Op::ReduceProd {
            axes,
            keepdims,
            noop_with_empty_axes,
        }
        | Op::ReduceL1 {
            axes,
            keepdims,
            noop_with_empty_axes,
        }
        | Op::ReduceL2 {
            axes,
            keepdims,
            noop_with_empty_axes,
        }
        | Op::ReduceLogSum {
            axes,
            keepdims,
            noop_with_empty_axes,
        }
        | Op::ReduceLogSumExp {
            axes,
            keepdims,
            noop_with_empty_axes,
        }
        | Op::ReduceSumSquare {
            axes,
            keepdims,
            noop_with_empty_axes,
        } => (
            axes.clone(),
            keepdims.unwrap_or(1) != 0,
            noop_with_empty_axes.unwrap_or(0) != 0,
        ),
        _ => return Err(cx.invalid("not a reduction")),
    };
    let axes: Vec<i64> = match (axes_attr, opt_tensor(inputs, 1)) {
        (Some(a), _) => a,
        (None, Some(t)) => t.to_i64()?,
        (None, None) => Vec::new(),
    };
    let rank = x.rank();
    let mut red: Vec<usize> = Vec::with_capacity(axes.len());
    for &a in &axes {
        let a = norm_axis(cx, a, rank)?;
        if !red.contains(&a) {
            red.push(a);
        }
    }
    red.sort_unstable();
    if red.is_empty() {
        if noop {
            // Axes empty with noop: the input is returned unchanged.
            return Ok(vec![inputs[0].clone()]);
        }
        red = (0..rank).collect();
    }
    let out_shape: Vec<usize> = if keepdims {
        (0..rank)
            .map(|a| if red.contains(&a) { 1 } else { x.shape[a] })
            .collect()
    } else {
        (0..rank)
            .filter(|a| !red.contains(a))
            .map(|a| x.shape[a])
            .collect()
    };
    let (v, permute) = view(&x.shape, &red);
    let int_path = (x.dtype.is_int() || x.dtype == DType::Bool)
        && matches!(
            kind,
            Red::Sum | Red::Max | Red::Min | Red::Prod | Red::L1 | Red::SumSquare
        );
    if int_path {
        let mut xi = x.to_i64()?;
        if permute {
            xi = move_last(&xi, &x.shape, &red);
        }
        let (lo, hi) = int_bounds(x.dtype);
        let u64_ = x.dtype == DType::U64;
        let r = match kind {
            Red::Sum => fold_blocks(&xi, v, 0, i64::wrapping_add),
            Red::Prod => fold_blocks(&xi, v, 1, i64::wrapping_mul),
            Red::L1 => fold_blocks(&xi, v, 0, |a, b| a.wrapping_add(b.wrapping_abs())),
            Red::SumSquare => fold_blocks(&xi, v, 0, |a, b| a.wrapping_add(b.wrapping_mul(b))),
            Red::Max if u64_ => {
                fold_blocks(
                    &xi,
                    v,
                    lo,
                    |a, b| {
                        if (b as u64) > (a as u64) { b } else { a }
                    },
                )
            }
            Red::Min if u64_ => {
                fold_blocks(
                    &xi,
                    v,
                    hi,
                    |a, b| {
                        if (b as u64) < (a as u64) { b } else { a }
                    },
                )
            }
            Red::Max => fold_blocks(&xi, v, lo, i64::max),
            _ => fold_blocks(&xi, v, hi, i64::min),
        };
        return single(from_i64_as(x.dtype, out_shape, r)?);
    }
    if matches!(x.data, Data::Str(_)) {
        return Err(cx.unsupported("reduction of string tensors"));
    }
    let mut xf = x.to_f64()?;
    if permute {
        xf = move_last(&xf, &x.shape, &red);
    }
    let r = reduce_f64(kind, &xf, v);
    if x.dtype.is_int() {
        // Mean, L2, LogSum... of integers: computed in f64, truncated back.
        let ri: Vec<i64> = r.iter().map(|&f| f as i64).collect();
        return single(from_i64_as(x.dtype, out_shape, ri)?);
    }
    single(Tensor::from_f64_as(x.dtype, out_shape, &r)?)
}

fn arg(cx: &OpCtx<'_>, max: bool, op: &Op, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let (axis, keepdims, last) = match op {
        Op::ArgMax {
            axis,
            keepdims,
            select_last_index,
        }
        | Op::ArgMin {
            axis,
            keepdims,
            select_last_index,
        } => (
            axis.unwrap_or(0),
            keepdims.unwrap_or(1) != 0,
            select_last_index.unwrap_or(0) != 0,
        ),
        _ => return Err(cx.invalid("not ArgMax/ArgMin")),
    };
    let a = norm_axis(cx, axis, x.rank())?;
    let outer: usize = x.shape[..a].iter().product();
    let red = x.shape.get(a).copied().unwrap_or(1);
    let inner: usize = x.shape[(a + 1).min(x.rank())..].iter().product();
    if red == 0 && outer * inner > 0 {
        return Err(cx.invalid(format!("axis {axis} of shape {:?} is empty", x.shape)));
    }
    let mut out_shape = x.shape.clone();
    if keepdims {
        if let Some(d) = out_shape.get_mut(a) {
            *d = 1;
        }
    } else if a < out_shape.len() {
        out_shape.remove(a);
    }
    let xf = x.to_f64()?;
    let mut res = vec![0i64; outer * inner];
    for o in 0..outer {
        for i in 0..inner {
            let at = |r: usize| xf[(o * red + r) * inner + i];
            let mut best = 0usize;
            let mut bv = at(0);
            for r in 1..red {
                let v = at(r);
                if bv.is_nan() {
                    break;
                }
                let better = if v.is_nan() {
                    true
                } else if max {
                    v > bv || (last && v == bv)
                } else {
                    v < bv || (last && v == bv)
                };
                if better {
                    best = r;
                    bv = v;
                }
            }
            res[o * inner + i] = best as i64;
        }
    }
    single(Tensor::from_i64(out_shape, res)?)
}

#[derive(Clone, Copy, PartialEq)]
enum Sm {
    Soft,
    LogSoft,
    Hard,
}

/// Float math for the softmax family.
trait SmF:
    Copy
    + PartialOrd
    + std::ops::Sub<Output = Self>
    + std::ops::Div<Output = Self>
    + std::ops::AddAssign
{
    /// `v[i] = e^v[i]` (vectorized for f32).
    fn exp_in_place(v: &mut [Self]);
    fn ln(self) -> Self;
    const ZERO: Self;
    const ONE: Self;
    const NEG_INF: Self;
}
impl SmF for f32 {
    fn exp_in_place(v: &mut [Self]) {
        crate::vmath::map_in_place(v, crate::vmath::exp);
    }
    fn ln(self) -> Self {
        self.ln()
    }
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const NEG_INF: Self = f32::NEG_INFINITY;
}
impl SmF for f64 {
    fn exp_in_place(v: &mut [Self]) {
        v.iter_mut().for_each(|e| *e = e.exp());
    }
    fn ln(self) -> Self {
        self.ln()
    }
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const NEG_INF: Self = f64::NEG_INFINITY;
}

fn softmax_slice<T: SmF>(kind: Sm, x: &[T], (outer, red, inner): (usize, usize, usize)) -> Vec<T> {
    let mut out = vec![T::ZERO; x.len()];
    if inner == 1 && red > 0 && kind != Sm::Hard {
        softmax_rows(kind, x, red, &mut out);
        return out;
    }
    let mut row = vec![T::ZERO; red];
    let mut ex = vec![T::ZERO; red];
    for o in 0..outer {
        for i in 0..inner {
            let at = |r: usize| (o * red + r) * inner + i;
            let mut m = T::NEG_INF;
            let mut arg = 0;
            for (r, e) in row.iter_mut().enumerate() {
                *e = x[at(r)];
                if *e > m {
                    m = *e;
                    arg = r;
                }
            }
            if kind == Sm::Hard {
                if red > 0 {
                    out[at(arg)] = T::ONE;
                }
                continue;
            }
            let m = if m == T::NEG_INF { T::ZERO } else { m };
            for e in row.iter_mut() {
                *e = *e - m;
            }
            ex.copy_from_slice(&row);
            T::exp_in_place(&mut ex);
            let mut s = T::ZERO;
            for &e in &ex {
                s += e;
            }
            if kind == Sm::Soft {
                for (r, &e) in ex.iter().enumerate() {
                    out[at(r)] = e / s;
                }
            } else {
                let ls = s.ln();
                for (r, e) in row.iter().enumerate() {
                    out[at(r)] = *e - ls;
                }
            }
        }
    }
    out
}

/// [`softmax_slice`] over contiguous rows of `red` (the common last-axis case), in passes the
/// compiler vectorizes: the maximum over eight running maxima (the same value), `x - max` and
/// its `exp` in the output row, the sum in order, then the quotients.
fn softmax_rows<T: SmF>(kind: Sm, x: &[T], red: usize, out: &mut [T]) {
    for (row, o) in x.chunks_exact(red).zip(out.chunks_exact_mut(red)) {
        let mut lanes = [T::NEG_INF; 8];
        let chunks = row.chunks_exact(8);
        let rest = chunks.remainder();
        for c in chunks {
            for (m, &e) in lanes.iter_mut().zip(c) {
                *m = if e > *m { e } else { *m };
            }
        }
        let mut m = T::NEG_INF;
        for &e in lanes.iter().chain(rest) {
            if e > m {
                m = e;
            }
        }
        let m = if m == T::NEG_INF { T::ZERO } else { m };
        for (d, &e) in o.iter_mut().zip(row) {
            *d = e - m;
        }
        T::exp_in_place(o);
        let mut s = T::ZERO;
        for &e in o.iter() {
            s += e;
        }
        if kind == Sm::Soft {
            for d in o.iter_mut() {
                *d = *d / s;
            }
        } else {
            let ls = s.ln();
            for (d, &e) in o.iter_mut().zip(row) {
                *d = (e - m) - ls;
            }
        }
    }
}

fn softmax(cx: &OpCtx<'_>, kind: Sm, axis: Option<i64>, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let rank = x.rank();
    let v = if cx.opset < 13 {
        let a = norm_axis(cx, axis.unwrap_or(1), rank)?;
        let outer: usize = x.shape[..a.min(rank)].iter().product();
        let red: usize = x.shape[a.min(rank)..].iter().product();
        (outer, red, 1)
    } else {
        let a = norm_axis(cx, axis.unwrap_or(-1), rank)?;
        let outer: usize = x.shape[..a].iter().product();
        let red = x.shape.get(a).copied().unwrap_or(1);
        let inner: usize = x.shape[(a + 1).min(rank)..].iter().product();
        (outer, red, inner)
    };
    if let Data::F32(d) = &x.data {
        let r = softmax_slice(kind, d, v);
        return single(Tensor::new(DType::F32, x.shape.clone(), Data::F32(r))?);
    }
    if !x.dtype.is_float() {
        return Err(cx.unsupported(format!("dtype {} is not supported", x.dtype)));
    }
    let r = softmax_slice(kind, &x.to_f64()?, v);
    single(Tensor::from_f64_as(x.dtype, x.shape.clone(), &r)?)
}

fn cumsum_slice<T: Arith>(
    x: &[T],
    (outer, len, inner): (usize, usize, usize),
    exclusive: bool,
    reverse: bool,
) -> Vec<T> {
    let mut out = vec![T::zero(); x.len()];
    for o in 0..outer {
        for i in 0..inner {
            let mut acc = T::zero();
            for k in 0..len {
                let r = if reverse { len - 1 - k } else { k };
                let at = (o * len + r) * inner + i;
                if exclusive {
                    out[at] = acc;
                    acc = acc.add(&x[at]);
                } else {
                    acc = acc.add(&x[at]);
                    out[at] = acc;
                }
            }
        }
    }
    out
}

fn cumsum(cx: &OpCtx<'_>, op: &Op, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let ax = tensor(cx, inputs, 1)?.to_i64()?;
    let [axis] = ax[..] else {
        return Err(cx.invalid(format!("axis must hold one value, got {}", ax.len())));
    };
    let (exclusive, reverse) = match op {
        Op::CumSum { exclusive, reverse } => {
            (exclusive.unwrap_or(0) != 0, reverse.unwrap_or(0) != 0)
        }
        _ => (false, false),
    };
    let a = norm_axis(cx, axis, x.rank())?;
    let outer: usize = x.shape[..a].iter().product();
    let len = x.shape.get(a).copied().unwrap_or(1);
    let inner: usize = x.shape[(a + 1).min(x.rank())..].iter().product();
    let v = (outer, len, inner);
    macro_rules! arms {
        ($($var:ident),*) => {
            match &x.data {
                $(Data::$var(d) => Data::$var(cumsum_slice(d, v, exclusive, reverse)),)*
                _ => return Err(cx.unsupported(format!("dtype {} is not supported", x.dtype))),
            }
        };
    }
    let data = arms!(U8, I8, U16, I16, U32, I32, U64, I64, F16, BF16, F32, F64);
    single(Tensor::new(x.dtype, x.shape.clone(), data)?)
}

/// Runs the node when it is one of this module's ops.
pub(super) fn eval(cx: &OpCtx<'_>, op: &Op, inputs: &[Option<RtValue>]) -> Option<OpResult> {
    Some(match op {
        Op::ReduceSum { .. } => reduce(cx, Red::Sum, op, inputs),
        Op::ReduceMean { .. } => reduce(cx, Red::Mean, op, inputs),
        Op::ReduceMax { .. } => reduce(cx, Red::Max, op, inputs),
        Op::ReduceMin { .. } => reduce(cx, Red::Min, op, inputs),
        Op::ReduceProd { .. } => reduce(cx, Red::Prod, op, inputs),
        Op::ReduceL1 { .. } => reduce(cx, Red::L1, op, inputs),
        Op::ReduceL2 { .. } => reduce(cx, Red::L2, op, inputs),
        Op::ReduceLogSum { .. } => reduce(cx, Red::LogSum, op, inputs),
        Op::ReduceLogSumExp { .. } => reduce(cx, Red::LogSumExp, op, inputs),
        Op::ReduceSumSquare { .. } => reduce(cx, Red::SumSquare, op, inputs),
        Op::ArgMax { .. } => arg(cx, true, op, inputs),
        Op::ArgMin { .. } => arg(cx, false, op, inputs),
        Op::Softmax { axis } => softmax(cx, Sm::Soft, *axis, inputs),
        Op::LogSoftmax { axis } => softmax(cx, Sm::LogSoft, *axis, inputs),
        Op::Hardmax { axis } => softmax(cx, Sm::Hard, *axis, inputs),
        Op::CumSum { .. } => cumsum(cx, op, inputs),
        _ => return None,
    })
}
