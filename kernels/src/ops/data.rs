//! Element movement shared by the kernels: dtype-generic gathers, slices and concatenations over
//! any [`Data`] variant (strings and codes included), strided copies that move contiguous runs at
//! once, and readers for the small integer operands (shapes, axes, pads).

use mmq_ir::DType;

use crate::error::KernelError;
use crate::ops::OpCtx;
use crate::tensor::{Data, Tensor};

/// Applies `$body` (a `Vec` of the same element type) to the vector inside any variant of
/// `$data`, bound as `$v`, and wraps the result in the same variant. `$get` is bound to a
/// function `&Data -> Option<&[T]>` that views another operand of the same variant.
macro_rules! map_any {
    ($data:expr, |$v:ident, $get:ident| $body:expr) => {
        map_any!(@arms $data, $v, $get, $body,
            Bool: bool, U8: u8, I8: i8, U16: u16, I16: i16, U32: u32, I32: i32, U64: u64,
            I64: i64, F16: half::f16, BF16: half::bf16, F32: f32, F64: f64, Str: String,
            Codes: u8)
    };
    ($data:expr, |$v:ident| $body:expr) => {
        map_any!($data, |$v, _get| $body)
    };
    (@arms $data:expr, $v:ident, $get:ident, $body:expr, $($var:ident: $t:ty),*) => {
        match $data {
            $(
                $crate::tensor::Data::$var($v) => {
                    #[allow(dead_code, reason = "only some bodies view other operands")]
                    fn $get(d: &$crate::tensor::Data) -> Option<&[$t]> {
                        match d {
                            $crate::tensor::Data::$var(x) => Some(x.as_slice()),
                            _ => None,
                        }
                    }
                    $crate::tensor::Data::$var($body)
                }
            )*
        }
    };
}
pub(crate) use map_any;

/// The elements of `data` at `idx`, in order (`idx` must be in range).
pub(crate) fn take(data: &Data, idx: &[usize]) -> Data {
    map_any!(data, |v| take_vec(v, idx))
}

fn take_vec<T: Clone>(v: &[T], idx: &[usize]) -> Vec<T> {
    idx.iter().map(|&i| v[i].clone()).collect()
}

fn repeat_vec<T: Clone>(v: &[T], i: usize, n: usize) -> Vec<T> {
    vec![v[i].clone(); n]
}

/// `data` followed by the elements of `extra` (same variant; anything else is ignored).
pub(crate) fn append(data: &Data, extra: &Data) -> Data {
    map_any!(data, |v, get| {
        let mut out = v.clone();
        out.extend_from_slice(get(extra).unwrap_or(&[]));
        out
    })
}

/// One element of `data`, repeated `n` times.
pub(crate) fn repeat_elem(data: &Data, i: usize, n: usize) -> Data {
    map_any!(data, |v| repeat_vec(v, i, n))
}

/// Drops axes of size 1 and merges adjacent axes whose strides make them one run.
fn coalesce(shape: &[usize], strides: &[isize]) -> (Vec<usize>, Vec<isize>) {
    let mut s: Vec<usize> = Vec::with_capacity(shape.len());
    let mut st: Vec<isize> = Vec::with_capacity(shape.len());
    for (&d, &k) in shape.iter().zip(strides) {
        if d == 1 {
            continue;
        }
        if let (Some(&pd), Some(&pk)) = (s.last(), st.last())
            && pk == k * d as isize
        {
            let last = s.len() - 1;
            s[last] = pd * d;
            st[last] = k;
            continue;
        }
        s.push(d);
        st.push(k);
    }
    (s, st)
}

/// `out[i0, .., in] = src[base + Σ i_k * strides[k]]` for an output of `shape`; every
/// addressed element must be in `src`. Runs along a unit-stride innermost axis are copied whole.
pub(crate) fn strided_vec<T: Clone>(
    src: &[T],
    base: usize,
    shape: &[usize],
    strides: &[isize],
) -> Vec<T> {
    let n: usize = shape.iter().product();
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    let (shape, strides) = coalesce(shape, strides);
    let rank = shape.len();
    if rank == 0 {
        out.push(src[base].clone());
        return out;
    }
    let inner = shape[rank - 1];
    let inner_stride = strides[rank - 1];
    let mut idx = vec![0usize; rank - 1];
    let mut off = base as isize;
    loop {
        let o = off as usize;
        if inner_stride == 1 {
            out.extend_from_slice(&src[o..o + inner]);
        } else if inner_stride == 0 {
            out.extend(std::iter::repeat_n(src[o].clone(), inner));
        } else {
            let mut p = off;
            for _ in 0..inner {
                out.push(src[p as usize].clone());
                p += inner_stride;
            }
        }
        // Advance the outer odometer.
        let mut d = rank - 1;
        loop {
            if d == 0 {
                return out;
            }
            d -= 1;
            idx[d] += 1;
            off += strides[d];
            if idx[d] < shape[d] {
                break;
            }
            off -= strides[d] * idx[d] as isize;
            idx[d] = 0;
        }
    }
}

/// [`strided_vec`] over any variant.
pub(crate) fn strided(data: &Data, base: usize, shape: &[usize], strides: &[isize]) -> Data {
    map_any!(data, |v| strided_vec(v, base, shape, strides))
}

/// Signed row-major strides.
pub(crate) fn istrides(shape: &[usize]) -> Vec<isize> {
    crate::ops::util::strides(shape)
        .into_iter()
        .map(|s| s as isize)
        .collect()
}

/// A new tensor of the same dtype.
pub(crate) fn like(t: &Tensor, shape: Vec<usize>, data: Data) -> Result<Tensor, KernelError> {
    Tensor::new(t.dtype, shape, data)
}

/// The elements of an integer operand (shapes, axes, pads, indices).
pub(crate) fn ints(cx: &OpCtx<'_>, t: &Tensor, what: &str) -> Result<Vec<i64>, KernelError> {
    match t.dtype {
        DType::I64
        | DType::I32
        | DType::I16
        | DType::I8
        | DType::U8
        | DType::U16
        | DType::U32
        | DType::U64 => t.to_i64(),
        d => Err(cx.invalid(format!("{what} must be an integer tensor, got {d}"))),
    }
}

/// A dimension as a signed value.
pub(crate) fn sdim(d: usize) -> i64 {
    d as i64
}

/// Normalizes axes for `rank` (negative counts from the end); rejects out-of-range and
/// repeated axes.
pub(crate) fn norm_axes(
    cx: &OpCtx<'_>,
    axes: &[i64],
    rank: usize,
) -> Result<Vec<usize>, KernelError> {
    let r = rank as i64;
    let mut seen = vec![false; rank];
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        if a < -r || a >= r {
            return Err(cx.invalid(format!("axis {a} is out of range for rank {rank}")));
        }
        let a = if a < 0 { a + r } else { a } as usize;
        if seen[a] {
            return Err(cx.invalid(format!("axis {a} is repeated")));
        }
        seen[a] = true;
        out.push(a);
    }
    Ok(out)
}

/// Normalizes an axis of a tensor of rank at least 1.
pub(crate) fn axis_in(cx: &OpCtx<'_>, axis: i64, rank: usize) -> Result<usize, KernelError> {
    if rank == 0 {
        return Err(cx.invalid("the operand is a scalar; it has no axis"));
    }
    crate::ops::util::axis(cx, axis, rank)
}

/// Normalizes an index into `0..dim` (negative counts from the end).
pub(crate) fn norm_index(
    cx: &OpCtx<'_>,
    i: i64,
    dim: usize,
    what: &str,
) -> Result<usize, KernelError> {
    let d = dim as i64;
    let j = if i < 0 { i + d } else { i };
    if j < 0 || j >= d {
        return Err(cx.invalid(format!("{what} {i} is out of range for a dim of {dim}")));
    }
    Ok(j as usize)
}

/// `(outer, len, inner)` of `shape` around `axis`.
pub(crate) fn split_at_axis(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    (
        shape[..axis].iter().product(),
        shape[axis],
        shape[axis + 1..].iter().product(),
    )
}

/// Elements `start..start + count` of `t` along `axis` (in range; callers check).
pub(crate) fn slice_axis(t: &Tensor, axis: usize, start: usize, count: usize) -> Tensor {
    let (outer, len, inner) = split_at_axis(&t.shape, axis);
    let data = map_any!(&t.data, |v, _get| {
        let mut out = Vec::with_capacity(outer * count * inner);
        for o in 0..outer {
            let base = (o * len + start) * inner;
            out.extend_from_slice(&v[base..base + count * inner]);
        }
        out
    });
    let mut shape = t.shape.clone();
    shape[axis] = count;
    Tensor {
        dtype: t.dtype,
        shape,
        data,
    }
}

/// Element `index` of `t` along `axis`, with that axis removed.
pub(crate) fn select_axis(t: &Tensor, axis: usize, index: usize) -> Tensor {
    let mut out = slice_axis(t, axis, index, 1);
    out.shape.remove(axis);
    out
}

/// Concatenates `parts` along `axis`; with `new_axis`, stacks them along a new axis at `axis`
/// (`axis` may then equal the rank). Every part must have the same dtype and the same dims
/// except along `axis` (all dims, when stacking).
pub(crate) fn concat(parts: &[&Tensor], axis: usize, new_axis: bool) -> Result<Tensor, String> {
    let Some(first) = parts.first() else {
        return Err("nothing to concatenate".to_owned());
    };
    let rank = first.rank();
    if axis > rank || !new_axis && axis >= rank {
        return Err(format!("axis {axis} is out of range for rank {rank}"));
    }
    let mut shape = first.shape.clone();
    if new_axis {
        shape.insert(axis, 0);
    } else {
        shape[axis] = 0;
    }
    for p in parts {
        let compatible = p.dtype == first.dtype
            && p.rank() == rank
            && p.shape
                .iter()
                .zip(&first.shape)
                .enumerate()
                .all(|(i, (a, b))| a == b || !new_axis && i == axis);
        if !compatible {
            return Err(format!(
                "cannot concatenate {}{:?} with {}{:?}",
                p.dtype, p.shape, first.dtype, first.shape
            ));
        }
        shape[axis] += if new_axis { 1 } else { p.shape[axis] };
    }
    let outer: usize = first.shape[..axis].iter().product();
    // Elements each part contributes per outer index.
    let chunks: Vec<usize> = parts
        .iter()
        .map(|p| p.shape[axis..].iter().product())
        .collect();
    let total: usize = shape.iter().product();
    let data = map_any!(&first.data, |v, get| {
        let _ = v;
        let views: Vec<&[_]> = parts.iter().map(|p| get(&p.data).unwrap_or(&[])).collect();
        let mut out = Vec::with_capacity(total);
        for o in 0..outer {
            for (view, &c) in views.iter().zip(&chunks) {
                out.extend_from_slice(&view[o * c..(o + 1) * c]);
            }
        }
        out
    });
    Ok(Tensor {
        dtype: first.dtype,
        shape,
        data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strided_transposes_and_broadcasts() {
        let src: Vec<i32> = (0..6).collect();
        // [2, 3] transposed to [3, 2].
        assert_eq!(
            strided_vec(&src, 0, &[3, 2], &[1, 3]),
            vec![0, 3, 1, 4, 2, 5]
        );
        // Reverse along the last axis.
        assert_eq!(
            strided_vec(&src, 2, &[2, 3], &[3, -1]),
            vec![2, 1, 0, 5, 4, 3]
        );
        // Broadcast a row.
        assert_eq!(
            strided_vec(&src[..3], 0, &[2, 3], &[0, 1]),
            vec![0, 1, 2, 0, 1, 2]
        );
        // Repeat each element.
        assert_eq!(
            strided_vec(&src[..2], 0, &[2, 2], &[1, 0]),
            vec![0, 0, 1, 1]
        );
        assert!(strided_vec(&src, 0, &[0, 3], &[3, 1]).is_empty());
        let s = Data::Str(vec!["a".into(), "b".into()]);
        assert_eq!(
            take(&s, &[1, 1, 0]),
            Data::Str(vec!["b".into(), "b".into(), "a".into()])
        );
    }
    #[test]
    fn slicing_and_concatenation() {
        let t = Tensor::from_i64(vec![2, 3], vec![0, 1, 2, 3, 4, 5]).expect("tensor");
        let s = slice_axis(&t, 1, 1, 2);
        assert_eq!(s.shape, vec![2, 2]);
        assert_eq!(s.data, Data::I64(vec![1, 2, 4, 5]));
        let c = select_axis(&t, 0, 1);
        assert_eq!(
            (c.shape.clone(), c.data.clone()),
            (vec![3], Data::I64(vec![3, 4, 5]))
        );
        let cat = concat(&[&t, &s], 1, false).expect("concat");
        assert_eq!(cat.shape, vec![2, 5]);
        assert_eq!(cat.data, Data::I64(vec![0, 1, 2, 1, 2, 3, 4, 5, 4, 5]));
        let st = concat(&[&t, &t], 2, true).expect("stack");
        assert_eq!(st.shape, vec![2, 3, 2]);
        assert_eq!(st.data, Data::I64(vec![0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]));
        assert!(concat(&[&t, &c], 0, false).is_err());
    }
}
