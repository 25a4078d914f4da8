//! Dtype-generic element movement for the control and sequence kernels: slicing along an axis
//! and concatenating along an axis, over every [`Data`] variant (strings and codes included).

use crate::tensor::{Data, Tensor};

/// Applies `$body` to the vector of any variant of `$data` (bound as `$v`); `$get` views another
/// operand of the same variant (`&Data -> Option<&[T]>`). The result is wrapped in that variant.
macro_rules! each_variant {
    ($data:expr, |$v:ident, $get:ident| $body:expr) => {
        each_variant!(@arms $data, $v, $get, $body,
            Bool: bool, U8: u8, I8: i8, U16: u16, I16: i16, U32: u32, I32: i32, U64: u64,
            I64: i64, F16: half::f16, BF16: half::bf16, F32: f32, F64: f64, Str: String,
            Codes: u8)
    };
    (@arms $data:expr, $v:ident, $get:ident, $body:expr, $($var:ident: $t:ty),*) => {
        match $data {
            $(
                Data::$var($v) => {
                    #[allow(dead_code, reason = "only some bodies view other operands")]
                    fn $get(d: &Data) -> Option<&[$t]> {
                        match d {
                            Data::$var(x) => Some(x.as_slice()),
                            _ => None,
                        }
                    }
                    Data::$var($body)
                }
            )*
        }
    };
}
pub(crate) use each_variant;

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
    let data = each_variant!(&t.data, |v, _get| {
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
    let data = each_variant!(&first.data, |v, get| {
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
