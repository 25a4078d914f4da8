//! One inference rule per modeled op.

use super::Cx;
use super::dims::{
    broadcast_dims, broadcast_shapes, ceil_div, exact_div, floor_div, product, product_div,
    unify_dim,
};
use super::{contrib, tail};
use crate::dim::{Dim, DimExpr};
use crate::dtype::DType;
use crate::op::Op;
use crate::types::{TensorType, Type};

/// A tensor type, or [`Type::Unknown`] when nothing is known.
pub(super) fn t(dtype: Option<DType>, shape: Option<Vec<Dim>>) -> Type {
    if dtype.is_none() && shape.is_none() {
        Type::Unknown
    } else {
        Type::Tensor(TensorType { dtype, shape })
    }
}

/// The type of operand `i` as a tensor (for ops whose result has the operand's type).
pub(super) fn same(cx: &Cx, i: usize) -> Type {
    cx.tt(i)
        .map_or(Type::Unknown, |tt| Type::Tensor(tt.clone()))
}

pub(super) fn shape_of(cx: &Cx, i: usize) -> Option<Vec<Dim>> {
    cx.shape(i).map(<[Dim]>::to_vec)
}

/// `axis` in `[-rank, rank)` normalized to `[0, rank)`.
pub(crate) fn norm_axis(axis: i64, rank: usize) -> Option<usize> {
    let r = i64::try_from(rank).ok()?;
    let a = if axis < 0 { axis + r } else { axis };
    (0..r).contains(&a).then_some(a as usize)
}

/// Normalizes a list of axes; `None` if one is out of range or repeated.
fn norm_axes(axes: &[i64], rank: usize) -> Option<Vec<usize>> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let a = norm_axis(a, rank)?;
        if out.contains(&a) {
            return None;
        }
        out.push(a);
    }
    Some(out)
}

/// A rank or length read from the IR, when it is small enough to materialize dims for.
fn small(k: i64) -> Option<usize> {
    usize::try_from(k)
        .ok()
        .filter(|&k| k <= super::MAX_SHAPE_VALUE_LEN)
}

pub(super) fn dims_unknown(n: usize) -> Vec<Dim> {
    vec![Dim::Unknown; n]
}

/// The single element of operand `i`'s shape value, or unknown.
pub(super) fn scalar_dim(cx: &Cx, i: usize) -> Dim {
    match cx.vals(i) {
        Some([d]) => d.clone(),
        _ => Dim::Unknown,
    }
}

/// Combines two types that describe the same value (control-flow branches, loop state).
pub(crate) fn unify_types(a: &Type, b: &Type) -> Type {
    match (a, b) {
        (Type::Unknown, _) => b.clone(),
        (_, Type::Unknown) => a.clone(),
        (Type::Tensor(x), Type::Tensor(y)) => {
            let dtype = match (x.dtype, y.dtype) {
                (Some(p), Some(q)) if p != q => None,
                (p, q) => p.or(q),
            };
            let shape = match (&x.shape, &y.shape) {
                (Some(p), Some(q)) if p.len() == q.len() => Some(
                    p.iter()
                        .zip(q)
                        .map(|(d, e)| {
                            if d.provably_eq(e) {
                                d.clone()
                            } else {
                                Dim::Unknown
                            }
                        })
                        .collect(),
                ),
                _ => None,
            };
            t(dtype, shape)
        }
        _ if a == b => a.clone(),
        _ => Type::Unknown,
    }
}

/// Result types of `If` from its branches' output types: where the branches agree, that type;
/// otherwise what they have in common.
pub(crate) fn if_outputs(branches: &[Vec<Type>], n: usize) -> Vec<Type> {
    (0..n)
        .map(|i| {
            let mut it = branches
                .iter()
                .map(|b| b.get(i).cloned().unwrap_or(Type::Unknown));
            let first = it.next().unwrap_or(Type::Unknown);
            it.fold(first, |acc, ty| {
                if acc == ty {
                    acc
                } else if acc == Type::Unknown || ty == Type::Unknown {
                    // One branch says nothing: only the element type can be trusted.
                    let known = if acc == Type::Unknown { ty } else { acc };
                    t(known.dtype(), None)
                } else {
                    unify_types(&acc, &ty)
                }
            })
        })
        .collect()
}

/// `ty` with `dim` inserted at `axis` (a scan or loop output stacking per-iteration values).
pub(crate) fn with_leading_dim(ty: &Type, dim: Dim, axis: i64) -> Type {
    match ty.as_tensor() {
        Some(tt) => {
            let shape = tt.shape.as_ref().and_then(|s| {
                let a = norm_axis(axis, s.len() + 1)?;
                let mut s = s.clone();
                s.insert(a, dim);
                Some(s)
            });
            t(tt.dtype, shape)
        }
        None => Type::Unknown,
    }
}

/// Broadcasting elementwise op over every present operand.
fn bcast(cx: &Cx, dtype: Option<DType>) -> Type {
    let shapes: Vec<Option<&[Dim]>> = (0..cx.num_inputs())
        .filter(|&i| cx.input(i).is_some())
        .map(|i| cx.shape(i))
        .collect();
    t(dtype, broadcast_shapes(&shapes))
}

pub(super) fn matmul_shape(a: Option<&[Dim]>, b: Option<&[Dim]>) -> Option<Vec<Dim>> {
    let (a, b) = (a?, b?);
    if a.is_empty() || b.is_empty() {
        return None;
    }
    let (mut a2, mut b2) = (a.to_vec(), b.to_vec());
    if a.len() == 1 {
        a2.insert(0, Dim::known(1));
    }
    if b.len() == 1 {
        b2.push(Dim::known(1));
    }
    let mut out = broadcast_shapes(&[Some(&a2[..a2.len() - 2]), Some(&b2[..b2.len() - 2])])?;
    if a.len() > 1 {
        out.push(a2[a2.len() - 2].clone());
    }
    if b.len() > 1 {
        out.push(b2[b2.len() - 1].clone());
    }
    Some(out)
}

/// Window attributes of conv and pool ops.
struct Window<'a> {
    auto_pad: Option<&'a str>,
    dilations: Option<&'a [i64]>,
    pads: Option<&'a [i64]>,
    strides: Option<&'a [i64]>,
    ceil: bool,
}

/// Output spatial dims of a convolution or pooling window over `input`.
fn window_out(input: &[Dim], kernel: &[i64], w: &Window) -> Option<Vec<Dim>> {
    let n = input.len();
    if kernel.len() != n {
        return None;
    }
    let mut out = Vec::with_capacity(n);
    for (i, d) in input.iter().enumerate() {
        let s = w.strides.and_then(|s| s.get(i)).copied().unwrap_or(1);
        let dil = w.dilations.and_then(|s| s.get(i)).copied().unwrap_or(1);
        if s <= 0 || dil <= 0 {
            return None;
        }
        let ek = dil.checked_mul(kernel[i].checked_sub(1)?)?.checked_add(1)?;
        let o = match w.auto_pad.unwrap_or("NOTSET") {
            "SAME_UPPER" | "SAME_LOWER" => ceil_div(d, s),
            "VALID" => floor_div(&d.sub(&Dim::known(ek)), s).add(&Dim::known(1)),
            _ => {
                let pb = w.pads.and_then(|p| p.get(i)).copied().unwrap_or(0);
                let pe = w.pads.and_then(|p| p.get(i + n)).copied().unwrap_or(0);
                let num = d.add(&Dim::known(pb.checked_add(pe)?.checked_sub(ek)?));
                let o = if w.ceil {
                    ceil_div(&num, s)
                } else {
                    floor_div(&num, s)
                }
                .add(&Dim::known(1));
                // The last window must start inside the (left-padded) input.
                match (o.as_known(), d.as_known()) {
                    (Some(ov), Some(dv))
                        if w.ceil && (ov - 1).checked_mul(s)? >= dv.checked_add(pb)? =>
                    {
                        Dim::known(ov - 1)
                    }
                    _ => o,
                }
            }
        };
        out.push(o);
    }
    Some(out)
}

fn pool(cx: &Cx, kernel: Option<&[i64]>, w: &Window) -> Type {
    let shape = cx.shape(0).and_then(|x| {
        if x.len() < 2 {
            return None;
        }
        let mut out = x[..2].to_vec();
        out.extend(window_out(&x[2..], kernel?, w)?);
        Some(out)
    });
    let shape = shape.or_else(|| cx.rank(0).map(dims_unknown));
    t(cx.dtype(0), shape)
}

fn conv(cx: &Cx, w_idx: usize, dtype: Option<DType>, kernel: Option<&[i64]>, win: &Window) -> Type {
    let shape = cx.shape(0).and_then(|xs| {
        if xs.len() < 2 {
            return None;
        }
        let ws = cx.shape(w_idx);
        let k: Option<Vec<i64>> = match kernel {
            Some(k) => Some(k.to_vec()),
            None => ws
                .and_then(|w| w.get(2..))
                .and_then(|k| k.iter().map(Dim::as_known).collect()),
        };
        let m = ws.and_then(|w| w.first()).cloned().unwrap_or(Dim::Unknown);
        let mut out = vec![xs[0].clone(), m];
        let spatial = k.and_then(|k| window_out(&xs[2..], &k, win));
        out.extend(spatial.unwrap_or_else(|| dims_unknown(xs.len() - 2)));
        Some(out)
    });
    let shape = shape.or_else(|| cx.rank(0).map(dims_unknown));
    t(dtype, shape)
}

/// Attributes of `ConvTranspose`.
struct Deconv<'a> {
    auto_pad: Option<&'a str>,
    dilations: Option<&'a [i64]>,
    group: Option<i64>,
    kernel: Option<&'a [i64]>,
    output_padding: Option<&'a [i64]>,
    output_shape: Option<&'a [i64]>,
    pads: Option<&'a [i64]>,
    strides: Option<&'a [i64]>,
}

fn conv_transpose(cx: &Cx, a: &Deconv) -> Type {
    let shape = cx.shape(0).and_then(|xs| {
        if xs.len() < 2 {
            return None;
        }
        let n = xs.len() - 2;
        let ws = cx.shape(1);
        let m = ws
            .and_then(|w| w.get(1))
            .map_or(Dim::Unknown, |d| d.mul(&Dim::known(a.group.unwrap_or(1))));
        let mut out = vec![xs[0].clone(), m];
        if let Some(os) = a.output_shape
            && os.len() >= n
        {
            out.extend(os[os.len() - n..].iter().map(|&d| Dim::known(d)));
            return Some(out);
        }
        let k: Option<Vec<i64>> = match a.kernel {
            Some(k) => Some(k.to_vec()),
            None => ws
                .and_then(|w| w.get(2..))
                .and_then(|k| k.iter().map(Dim::as_known).collect()),
        };
        for (i, d) in xs[2..].iter().enumerate() {
            let Some(k) = k.as_ref().and_then(|k| k.get(i)) else {
                out.push(Dim::Unknown);
                continue;
            };
            let s = a.strides.and_then(|s| s.get(i)).copied().unwrap_or(1);
            let dil = a.dilations.and_then(|s| s.get(i)).copied().unwrap_or(1);
            let op = a
                .output_padding
                .and_then(|s| s.get(i))
                .copied()
                .unwrap_or(0);
            let o = match a.auto_pad.unwrap_or("NOTSET") {
                "SAME_UPPER" | "SAME_LOWER" => d.mul(&Dim::known(s)),
                _ => {
                    let pb = a.pads.and_then(|p| p.get(i)).copied().unwrap_or(0);
                    let pe = a.pads.and_then(|p| p.get(i + n)).copied().unwrap_or(0);
                    d.sub(&Dim::known(1)).mul(&Dim::known(s)).add(
                        &(k - 1)
                            .checked_mul(dil)
                            .and_then(|x| x.checked_add(op + 1)?.checked_sub(pb)?.checked_sub(pe))
                            .map_or(Dim::Unknown, Dim::known),
                    )
                }
            };
            out.push(o);
        }
        Some(out)
    });
    let shape = shape.or_else(|| cx.rank(0).map(dims_unknown));
    t(cx.dtype(0), shape)
}

fn global_pool(cx: &Cx) -> Type {
    let shape = cx.shape(0).map(|x| {
        x.iter()
            .enumerate()
            .map(|(i, d)| if i < 2 { d.clone() } else { Dim::known(1) })
            .collect()
    });
    t(cx.dtype(0), shape)
}

fn reduce(
    cx: &Cx,
    axes_attr: Option<&Vec<i64>>,
    keepdims: Option<i64>,
    noop: Option<i64>,
    attr_era: bool,
) -> Type {
    let dtype = cx.dtype(0);
    let keep = keepdims.unwrap_or(1) != 0;
    let axes: Option<Vec<i64>> = if attr_era {
        Some(axes_attr.cloned().unwrap_or_default())
    } else if cx.input(1).is_some() {
        cx.ints(1)
    } else {
        Some(Vec::new())
    };
    let Some(x) = cx.shape(0) else {
        return t(dtype, None);
    };
    let Some(axes) = axes else {
        // Unknown axes: with keepdims the rank stays; without, it drops by their count.
        let count = cx.shape(1).and_then(|s| match s {
            [d] => small(d.as_known()?),
            _ => None,
        });
        let rank = match (keep, count) {
            (true, _) => Some(x.len()),
            (false, Some(k)) if k > 0 => x.len().checked_sub(k),
            _ => None,
        };
        return t(dtype, rank.map(dims_unknown));
    };
    if axes.is_empty() && noop.unwrap_or(0) != 0 {
        return t(dtype, Some(x.to_vec()));
    }
    let axes = if axes.is_empty() {
        (0..x.len()).collect()
    } else {
        match norm_axes(&axes, x.len()) {
            Some(a) => a,
            None => return t(dtype, None),
        }
    };
    let shape = x
        .iter()
        .enumerate()
        .filter_map(|(i, d)| match (axes.contains(&i), keep) {
            (false, _) => Some(d.clone()),
            (true, true) => Some(Dim::known(1)),
            (true, false) => None,
        })
        .collect();
    t(dtype, Some(shape))
}

fn arg_reduce(cx: &Cx, axis: Option<i64>, keepdims: Option<i64>) -> Type {
    let keep = keepdims.unwrap_or(1) != 0;
    let shape = cx.shape(0).and_then(|x| {
        let a = norm_axis(axis.unwrap_or(0), x.len())?;
        let mut s = x.to_vec();
        if keep {
            s[a] = Dim::known(1);
        } else {
            s.remove(a);
        }
        Some(s)
    });
    t(Some(DType::I64), shape)
}

/// Whether `x` is an "until the end" sentinel such as `INT64_MAX` or `INT32_MAX`.
fn is_huge(x: i64) -> bool {
    x >= i64::from(i32::MAX)
}

/// Length of `start..end` by `step` over a dim of size `d`. With a symbolic `d`, the slice is
/// assumed to lie inside the dim (as exporters produce it), except that a constant end short of
/// a symbolic dim cannot be proven in range and gives an unknown length.
fn slice_dim(d: &Dim, start: &Dim, end: &Dim, step: i64, lower: Option<i64>) -> Dim {
    if step == 0 || step == i64::MIN || d.as_known().is_some_and(|d| d < 0) {
        return Dim::Unknown;
    }
    if let (Some(d), Some(s), Some(e)) = (d.as_known(), start.as_known(), end.as_known()) {
        let len = if step > 0 {
            let s = (if s < 0 { s.saturating_add(d) } else { s }).clamp(0, d);
            let e = (if e < 0 { e.saturating_add(d) } else { e }).clamp(0, d);
            (e - s).max(0).saturating_add(step - 1) / step
        } else {
            let s = (if s < 0 { s.saturating_add(d) } else { s }).clamp(0, (d - 1).max(0));
            let e = (if e < 0 { e.saturating_add(d) } else { e }).clamp(-1, d - 1);
            (s - e).max(0).saturating_add(-step - 1) / -step
        };
        return Dim::known(len.max(0));
    }
    if step < 0 || matches!(d, Dim::Unknown) {
        return Dim::Unknown;
    }
    let start = match start.as_known() {
        Some(v) if v < 0 && v > i64::from(i32::MIN) => d.add(&Dim::known(v)),
        Some(v) if v < 0 => Dim::known(0),
        Some(v) => Dim::known(v),
        None => start.clone(),
    };
    let end = match end.as_known() {
        Some(v) if is_huge(v) => d.clone(),
        Some(v) if v < 0 && v > i64::from(i32::MIN) => d.add(&Dim::known(v)),
        // A constant end inside a symbolic dim only when the dim's lower bound proves it.
        Some(v) if d.as_known().is_none() && lower.is_none_or(|lb| lb < v) => return Dim::Unknown,
        Some(v) => Dim::known(v),
        None => end.clone(),
    };
    let len = end.sub(&start);
    let len = if step == 1 { len } else { ceil_div(&len, step) };
    match len.as_known() {
        Some(v) if v < 0 => Dim::known(0),
        _ => len,
    }
}

fn slice(
    cx: &Cx,
    a_starts: Option<&Vec<i64>>,
    a_ends: Option<&Vec<i64>>,
    a_axes: Option<&Vec<i64>>,
) -> Type {
    let dtype = cx.dtype(0);
    let Some(x) = cx.shape(0) else {
        return t(dtype, None);
    };
    let to_dims = |v: &Vec<i64>| v.iter().map(|&x| Dim::known(x)).collect::<Vec<_>>();
    let (starts, ends, axes, steps) = if cx.opset < 10 {
        let n = a_starts.map_or(0, Vec::len);
        (
            a_starts.map(to_dims),
            a_ends.map(to_dims),
            Some(a_axes.cloned().unwrap_or_else(|| (0..n as i64).collect())),
            Some(vec![1; n]),
        )
    } else {
        let starts = cx.vals(1).map(<[Dim]>::to_vec);
        let n = starts
            .as_ref()
            .map(Vec::len)
            .or_else(|| cx.shape(1).and_then(|s| small(s.first()?.as_known()?)));
        let axes = if cx.input(3).is_some() {
            cx.ints(3)
        } else {
            n.map(|n| (0..n as i64).collect())
        };
        let steps = if cx.input(4).is_some() {
            cx.ints(4)
        } else {
            n.map(|n| vec![1; n])
        };
        (starts, cx.vals(2).map(<[Dim]>::to_vec), axes, steps)
    };
    let Some(axes) = axes.and_then(|a| norm_axes(&a, x.len())) else {
        return t(dtype, Some(dims_unknown(x.len())));
    };
    let mut out = x.to_vec();
    for (j, &a) in axes.iter().enumerate() {
        let s = starts.as_ref().and_then(|v| v.get(j));
        let e = ends.as_ref().and_then(|v| v.get(j));
        let st = steps.as_ref().and_then(|v| v.get(j));
        out[a] = match (s, e, st) {
            (Some(s), Some(e), Some(&st)) => {
                slice_dim(&x[a], s, e, st, super::dims::lower_bound(cx.m, &x[a]))
            }
            _ => Dim::Unknown,
        };
    }
    t(dtype, Some(out))
}

fn concat(cx: &Cx, axis: Option<i64>) -> Type {
    let dtype = (0..cx.num_inputs()).find_map(|i| cx.dtype(i));
    let shapes: Option<Vec<&[Dim]>> = (0..cx.num_inputs())
        .filter(|&i| cx.input(i).is_some())
        .map(|i| cx.shape(i))
        .collect();
    let shape = shapes.and_then(|shapes| {
        let first = shapes.first()?;
        let rank = first.len();
        if shapes.iter().any(|s| s.len() != rank) {
            return None;
        }
        let a = norm_axis(axis.unwrap_or(0), rank)?;
        let mut out = first.to_vec();
        out[a] = Dim::known(0);
        for s in &shapes {
            for (i, d) in s.iter().enumerate() {
                out[i] = if i == a {
                    out[i].add(d)
                } else {
                    unify_dim(&out[i], d)
                };
            }
        }
        Some(out)
    });
    t(dtype, shape)
}

fn split(
    cx: &Cx,
    axis: Option<i64>,
    num_outputs: Option<i64>,
    split_attr: Option<&Vec<i64>>,
) -> Vec<Type> {
    let n = cx.node.outputs.len();
    let dtype = cx.dtype(0);
    let Some(x) = cx.shape(0) else {
        return vec![t(dtype, None); n];
    };
    let Some(a) = norm_axis(axis.unwrap_or(0), x.len()) else {
        return vec![t(dtype, None); n];
    };
    let sizes: Vec<Dim> = if cx.opset >= 13 && cx.input(1).is_some() {
        cx.vals(1).map_or_else(|| dims_unknown(n), <[Dim]>::to_vec)
    } else if let (true, Some(s)) = (cx.opset < 13, split_attr) {
        s.iter().map(|&d| Dim::known(d)).collect()
    } else {
        let parts = num_outputs.unwrap_or(n as i64).max(1);
        let d = &x[a];
        match d.as_known() {
            Some(dv) if dv < 0 => dims_unknown(n),
            // Not splittable into `parts` non-empty chunks of ceil(dv / parts) (the ONNX rule):
            // the node can never run, so claim nothing.
            Some(dv)
                if dv - (dv.saturating_add(parts - 1) / parts).saturating_mul(parts - 1) <= 0 =>
            {
                dims_unknown(n)
            }
            Some(dv) => {
                let chunk = dv.saturating_add(parts - 1) / parts;
                (0..parts.min(n as i64))
                    .map(|i| Dim::known(dv.saturating_sub(chunk.saturating_mul(i)).clamp(0, chunk)))
                    .collect()
            }
            None => {
                let part = d
                    .expr()
                    .and_then(|e| exact_div(e, &DimExpr::constant(parts)))
                    .map_or(Dim::Unknown, Dim::Expr);
                vec![part; n]
            }
        }
    };
    (0..n)
        .map(|i| {
            let mut s = x.to_vec();
            s[a] = sizes.get(i).cloned().unwrap_or(Dim::Unknown);
            t(dtype, Some(s))
        })
        .collect()
}

fn reshape(cx: &Cx, allowzero: Option<i64>) -> Type {
    let dtype = cx.dtype(0);
    let Some(target) = cx.vals(1) else {
        let rank = cx
            .shape(1)
            .and_then(|s| s.first()?.as_known())
            .and_then(small);
        return t(dtype, rank.map(dims_unknown));
    };
    let x = cx.shape(0);
    let allowzero = allowzero.unwrap_or(0) != 0;
    let mut out = Vec::with_capacity(target.len());
    let mut infer_at = None;
    for (i, d) in target.iter().enumerate() {
        match d.as_known() {
            Some(0) if !allowzero => {
                out.push(x.and_then(|x| x.get(i)).cloned().unwrap_or(Dim::Unknown));
            }
            Some(-1) if infer_at.is_none() => {
                infer_at = Some(i);
                out.push(Dim::Unknown);
            }
            Some(v) if v < 0 => out.push(Dim::Unknown),
            _ => out.push(d.clone()),
        }
    }
    if let (Some(i), Some(x)) = (infer_at, x) {
        let others: Vec<Dim> = out
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != i)
            .map(|(_, d)| d.clone())
            .collect();
        out[i] = product_div(x, &others);
    }
    t(dtype, Some(out))
}

fn squeeze(cx: &Cx, axes_attr: Option<&Vec<i64>>) -> Type {
    let dtype = cx.dtype(0);
    // Outer None: axes given but not known; inner None: no axes (squeeze every 1).
    let axes: Option<Option<Vec<i64>>> = if cx.opset < 13 {
        Some(axes_attr.cloned())
    } else if cx.input(1).is_some() {
        cx.ints(1).map(Some)
    } else {
        Some(None)
    };
    let (Some(x), Some(axes)) = (cx.shape(0), axes) else {
        return t(dtype, None);
    };
    let shape = match axes {
        Some(axes) => norm_axes(&axes, x.len()).map(|axes| {
            x.iter()
                .enumerate()
                .filter(|(i, _)| !axes.contains(i))
                .map(|(_, d)| d.clone())
                .collect()
        }),
        None => x
            .iter()
            .map(|d| d.as_known().map(|v| (v != 1).then(|| d.clone())))
            .collect::<Option<Vec<_>>>()
            .map(|v| v.into_iter().flatten().collect()),
    };
    t(dtype, shape)
}

fn unsqueeze(cx: &Cx, axes_attr: Option<&Vec<i64>>) -> Type {
    let dtype = cx.dtype(0);
    let axes = if cx.opset < 13 {
        axes_attr.cloned()
    } else {
        cx.ints(1)
    };
    let shape = cx.shape(0).and_then(|x| {
        let axes = axes?;
        let rank = x.len() + axes.len();
        let mut axes = norm_axes(&axes, rank)?;
        axes.sort_unstable();
        let mut out = x.to_vec();
        for a in axes {
            out.insert(a, Dim::known(1));
        }
        Some(out)
    });
    let shape = shape.or_else(|| {
        let n = if cx.opset < 13 {
            axes_attr.map(Vec::len)
        } else {
            cx.shape(1).and_then(|s| match s {
                [] => Some(1),
                [d] => small(d.as_known()?),
                _ => None,
            })
        };
        Some(dims_unknown(cx.rank(0)? + n?))
    });
    t(dtype, shape)
}

/// Result shape of an einsum `equation` over operands of `shapes`.
fn einsum(eq: &str, shapes: &[Option<&[Dim]>]) -> Option<Vec<Dim>> {
    let eq = crate::einsum::parse(eq, shapes.len()).ok()?;
    let mut letters: Vec<(char, Dim, usize)> = Vec::new();
    let mut ellipsis: Option<Vec<Dim>> = None;
    for (term, shape) in eq.inputs.iter().zip(shapes) {
        let shape = (*shape)?;
        let (pre_n, post_n) = (term.pre.len(), term.post.len());
        if pre_n + post_n > shape.len() || (!term.ellipsis && pre_n + post_n != shape.len()) {
            return None;
        }
        let ell_len = shape.len() - pre_n - post_n;
        let named = term
            .pre
            .iter()
            .zip(&shape[..pre_n])
            .chain(term.post.iter().zip(&shape[pre_n + ell_len..]));
        for (&c, d) in named {
            match letters.iter_mut().find(|(l, _, _)| *l == c) {
                Some((_, old, count)) => {
                    *old = broadcast_dims(old, d);
                    *count += 1;
                }
                None => letters.push((c, d.clone(), 1)),
            }
        }
        if term.ellipsis {
            let e = &shape[pre_n..pre_n + ell_len];
            ellipsis = Some(match ellipsis {
                Some(old) => broadcast_shapes(&[Some(&old), Some(e)])?,
                None => e.to_vec(),
            });
        }
    }
    let find = |c: char| {
        letters
            .iter()
            .find(|(l, _, _)| *l == c)
            .map(|(_, d, _)| d.clone())
    };
    let mut out = Vec::new();
    match &eq.output {
        Some(t) => {
            for &c in &t.pre {
                out.push(find(c)?);
            }
            if t.ellipsis {
                out.extend(ellipsis.clone().unwrap_or_default());
            }
            for &c in &t.post {
                out.push(find(c)?);
            }
        }
        None => {
            out.extend(ellipsis.unwrap_or_default());
            let mut once: Vec<&(char, Dim, usize)> =
                letters.iter().filter(|(_, _, n)| *n == 1).collect();
            once.sort_by_key(|(c, _, _)| *c);
            out.extend(once.into_iter().map(|(_, d, _)| d.clone()));
        }
    }
    Some(out)
}

fn resize(cx: &Cx, axes_attr: Option<&Vec<i64>>, policy: Option<&str>) -> Type {
    let dtype = cx.dtype(0);
    let Some(x) = cx.shape(0) else {
        return t(dtype, None);
    };
    let (scales_i, sizes_i) = if cx.opset < 11 {
        (1, None)
    } else {
        (2, Some(3))
    };
    let axes: Vec<usize> = match axes_attr {
        Some(a) => match norm_axes(a, x.len()) {
            Some(a) => a,
            None => return t(dtype, Some(dims_unknown(x.len()))),
        },
        None => (0..x.len()).collect(),
    };
    let mut out = x.to_vec();
    // An empty `sizes` tensor means "use scales".
    let sizes_i =
        sizes_i.filter(|&i| cx.input(i).is_some() && cx.vals(i).is_none_or(|v| !v.is_empty()));
    if let Some(si) = sizes_i {
        match cx.vals(si) {
            Some(s) if s.len() == axes.len() && policy.unwrap_or("stretch") == "stretch" => {
                for (j, &a) in axes.iter().enumerate() {
                    out[a] = s[j].clone();
                }
            }
            _ => {
                for &a in &axes {
                    out[a] = Dim::Unknown;
                }
            }
        }
        return t(dtype, Some(out));
    }
    match cx.floats(scales_i) {
        Some(s) if s.len() == axes.len() => {
            for (j, &a) in axes.iter().enumerate() {
                out[a] = scale_dim(&x[a], s[j]);
            }
        }
        _ => {
            for &a in &axes {
                out[a] = Dim::Unknown;
            }
        }
    }
    t(dtype, Some(out))
}

/// `floor(d * scale)`, exact when the scale is a small rational.
pub(super) fn scale_dim(d: &Dim, scale: f64) -> Dim {
    if let Some(v) = d.as_known() {
        return Dim::known((v as f64 * scale).floor() as i64);
    }
    for q in 1..=64i64 {
        let p = scale * q as f64;
        if (p - p.round()).abs() < 1e-9 && p.round() > 0.0 {
            return floor_div(&d.mul(&Dim::known(p.round() as i64)), q);
        }
    }
    Dim::Unknown
}

/// `LayerNormalization` results: the normalized tensor, then mean and inverse standard
/// deviation with the normalized axes kept as 1.
fn layer_norm(cx: &Cx, axis: Option<i64>, stash: Option<i64>) -> Vec<Type> {
    let stat_dtype = i32::try_from(stash.unwrap_or(1))
        .ok()
        .and_then(DType::from_onnx_code);
    let stats = cx.shape(0).map(|s| {
        let a = norm_axis(axis.unwrap_or(-1), s.len()).unwrap_or(s.len());
        s.iter()
            .enumerate()
            .map(|(i, d)| if i < a { d.clone() } else { Dim::known(1) })
            .collect()
    });
    let st = t(stat_dtype, stats);
    vec![same(cx, 0), st.clone(), st]
}

/// Opset-23 `Attention` results: `Y`, `present_key`, `present_value`, `qk_matmul_output`.
fn attention(cx: &Cx, kv_heads: Option<i64>, q_heads: Option<i64>) -> Vec<Type> {
    let kvh = kv_heads.map_or(Dim::Unknown, Dim::known);
    let qh = q_heads.map_or(Dim::Unknown, Dim::known);
    // (batch, heads, seq, head size) of a 3-d or 4-d operand.
    let split = |s: Option<&[Dim]>, heads: &Dim| -> Option<[Dim; 4]> {
        match s? {
            [b, h, s, d] => Some([b.clone(), h.clone(), s.clone(), d.clone()]),
            [b, s, hidden] => Some([
                b.clone(),
                heads.clone(),
                s.clone(),
                product_div(std::slice::from_ref(hidden), std::slice::from_ref(heads)),
            ]),
            _ => None,
        }
    };
    let q3 = cx.rank(0) == Some(3);
    let qs = split(cx.shape(0), &qh);
    let ks = split(cx.shape(1), &kvh);
    let vs = split(cx.shape(2), &kvh);
    let total = ks.as_ref().map(
        |k| match (cx.input(4), cx.shape(4).and_then(|s| s.get(2))) {
            (None, _) => k[2].clone(),
            (Some(_), Some(p)) => p.add(&k[2]),
            (Some(_), None) => Dim::Unknown,
        },
    );
    let total = total.unwrap_or(Dim::Unknown);
    let y = match (&qs, &vs) {
        (Some(q), Some(v)) if q3 => Some(vec![q[0].clone(), q[2].clone(), q[1].mul(&v[3])]),
        (Some(q), Some(v)) => Some(vec![q[0].clone(), q[1].clone(), q[2].clone(), v[3].clone()]),
        _ => None,
    };
    let present = |s: &Option<[Dim; 4]>| {
        s.as_ref()
            .map(|s| vec![s[0].clone(), s[1].clone(), total.clone(), s[3].clone()])
    };
    let qk = qs
        .as_ref()
        .map(|q| vec![q[0].clone(), q[1].clone(), q[2].clone(), total.clone()]);
    vec![
        t(cx.dtype(0), y),
        t(cx.dtype(1), present(&ks)),
        t(cx.dtype(2), present(&vs)),
        t(cx.dtype(0), qk),
    ]
}

pub(super) fn dtype_code(code: Option<i64>) -> Option<DType> {
    code.filter(|&c| c != 0)
        .and_then(|c| i32::try_from(c).ok())
        .and_then(DType::from_onnx_code)
}

/// The result types of `cx.node`, one per result slot ([`Type::Unknown`] where nothing is
/// inferred).
pub(crate) fn infer(cx: &Cx) -> Vec<Type> {
    let n = cx.node.outputs.len();
    let mut out = infer_op(cx);
    out.resize(n, Type::Unknown);
    out
}

/// The attributes of a fused activation (`FusedConv`, `FusedGemm`), left out of the standard
/// op that infers their types.
const FUSED_ACTIVATION: &[&str] = &[
    "activation",
    "activation_params",
    "activation_alpha",
    "activation_beta",
    "activation_gamma",
];

fn infer_op(cx: &Cx) -> Vec<Type> {
    use Op::*;
    let one = |ty: Type| vec![ty];
    match &cx.node.op {
        Neg {}
        | Abs {}
        | Sqrt {}
        | Exp {}
        | Log {}
        | Reciprocal {}
        | Floor {}
        | Ceil {}
        | Round {}
        | Sign {}
        | Sin {}
        | Cos {}
        | Tan {}
        | Asin {}
        | Acos {}
        | Atan {}
        | Sinh {}
        | Cosh {}
        | Asinh {}
        | Acosh {}
        | Atanh {}
        | Tanh {}
        | Sigmoid {}
        | Erf {}
        | Identity {}
        | Clip { .. }
        | Relu {}
        | LeakyRelu { .. }
        | Elu { .. }
        | Selu { .. }
        | Celu { .. }
        | Gelu { .. }
        | HardSigmoid { .. }
        | HardSwish {}
        | Softplus {}
        | Softsign {}
        | Mish {}
        | ThresholdedRelu { .. }
        | Swish { .. }
        | BitwiseNot {}
        | Softmax { .. }
        | LogSoftmax { .. }
        | Hardmax { .. }
        | CumSum { .. }
        | LRN { .. }
        | LpNormalization { .. }
        | MeanVarianceNormalization { .. }
        | InstanceNormalization { .. }
        | GroupNormalization { .. }
        | RMSNormalization { .. }
        | Trilu { .. }
        | ScatterND { .. }
        | ScatterElements { .. }
        | RotaryEmbedding { .. } => one(same(cx, 0)),
        IsNaN {} | IsInf { .. } | Not {} => one(t(Some(DType::Bool), shape_of(cx, 0))),
        // The mask is bool from opset 10; before, it has the input's type.
        Dropout { .. } => {
            let mask = if cx.opset >= 10 {
                Some(DType::Bool)
            } else {
                cx.dtype(0)
            };
            vec![same(cx, 0), t(mask, shape_of(cx, 0))]
        }
        Add {}
        | Sub {}
        | Mul {}
        | Div {}
        | Pow {}
        | Mod { .. }
        | BitShift { .. }
        | BitwiseAnd {}
        | BitwiseOr {}
        | BitwiseXor {}
        | Min {}
        | Max {}
        | Sum {}
        | Mean {}
        | PRelu {} => one(bcast(cx, cx.dtype(0))),
        Equal {}
        | Less {}
        | Greater {}
        | LessOrEqual {}
        | GreaterOrEqual {}
        | And {}
        | Or {}
        | Xor {} => one(bcast(cx, Some(DType::Bool))),
        Where {} => one(bcast(cx, cx.dtype(1).or(cx.dtype(2)))),
        MatMul {} => one(t(cx.dtype(0), matmul_shape(cx.shape(0), cx.shape(1)))),
        MatMulInteger {} => one(t(Some(DType::I32), matmul_shape(cx.shape(0), cx.shape(1)))),
        QLinearMatMul {} => one(t(
            cx.dtype(7).or(cx.dtype(0)),
            matmul_shape(cx.shape(0), cx.shape(3)),
        )),
        Gemm {
            trans_a, trans_b, ..
        } => {
            let pick = |s: Option<&[Dim]>, first: bool| match s {
                Some([x, y]) => Some(if first { x } else { y }.clone()),
                _ => None,
            };
            let m = pick(cx.shape(0), trans_a.unwrap_or(0) == 0);
            let n = pick(cx.shape(1), trans_b.unwrap_or(0) != 0);
            let shape = match (m, n) {
                (None, None) => None,
                (m, n) => Some(vec![m.unwrap_or(Dim::Unknown), n.unwrap_or(Dim::Unknown)]),
            };
            one(t(cx.dtype(0), shape))
        }
        Conv {
            auto_pad,
            dilations,
            kernel_shape,
            pads,
            strides,
            ..
        }
        | ConvInteger {
            auto_pad,
            dilations,
            kernel_shape,
            pads,
            strides,
            ..
        }
        | QLinearConv {
            auto_pad,
            dilations,
            kernel_shape,
            pads,
            strides,
            ..
        } => {
            let w = Window {
                auto_pad: auto_pad.as_deref(),
                dilations: dilations.as_deref(),
                pads: pads.as_deref(),
                strides: strides.as_deref(),
                ceil: false,
            };
            let (w_idx, dtype) = match cx.node.op {
                ConvInteger { .. } => (1, Some(DType::I32)),
                QLinearConv { .. } => (3, cx.dtype(7).or(cx.dtype(0))),
                _ => (1, cx.dtype(0)),
            };
            one(conv(cx, w_idx, dtype, kernel_shape.as_deref(), &w))
        }
        ConvTranspose {
            auto_pad,
            dilations,
            group,
            kernel_shape,
            output_padding,
            output_shape,
            pads,
            strides,
        } => one(conv_transpose(
            cx,
            &Deconv {
                auto_pad: auto_pad.as_deref(),
                dilations: dilations.as_deref(),
                group: *group,
                kernel: kernel_shape.as_deref(),
                output_padding: output_padding.as_deref(),
                output_shape: output_shape.as_deref(),
                pads: pads.as_deref(),
                strides: strides.as_deref(),
            },
        )),
        Einsum { equation } => {
            let shapes: Vec<Option<&[Dim]>> = (0..cx.num_inputs()).map(|i| cx.shape(i)).collect();
            let shape = equation.as_deref().and_then(|e| einsum(e, &shapes));
            one(t(cx.dtype(0), shape))
        }
        MaxPool {
            auto_pad,
            ceil_mode,
            dilations,
            kernel_shape,
            pads,
            strides,
            ..
        }
        | AveragePool {
            auto_pad,
            ceil_mode,
            dilations,
            kernel_shape,
            pads,
            strides,
            ..
        }
        | LpPool {
            auto_pad,
            ceil_mode,
            dilations,
            kernel_shape,
            pads,
            strides,
            ..
        } => {
            let w = Window {
                auto_pad: auto_pad.as_deref(),
                dilations: dilations.as_deref(),
                pads: pads.as_deref(),
                strides: strides.as_deref(),
                ceil: ceil_mode.unwrap_or(0) != 0,
            };
            let y = pool(cx, kernel_shape.as_deref(), &w);
            let idx = t(Some(DType::I64), y.shape().map(<[Dim]>::to_vec));
            vec![y, idx]
        }
        GlobalAveragePool {} | GlobalMaxPool {} | GlobalLpPool { .. } => one(global_pool(cx)),
        BatchNormalization { .. } => {
            let c = cx.shape(0).and_then(|s| s.get(1)).cloned();
            let stat = t(
                cx.dtype(3).or(cx.dtype(0)),
                Some(vec![c.unwrap_or(Dim::Unknown)]),
            );
            vec![same(cx, 0), stat.clone(), stat]
        }
        LayerNormalization {
            axis, stash_type, ..
        } => layer_norm(cx, *axis, *stash_type),
        ReduceSum {
            axes,
            keepdims,
            noop_with_empty_axes,
        } => one(reduce(
            cx,
            axes.as_ref(),
            *keepdims,
            *noop_with_empty_axes,
            cx.opset < 13,
        )),
        ReduceMean {
            axes,
            keepdims,
            noop_with_empty_axes,
        }
        | ReduceMax {
            axes,
            keepdims,
            noop_with_empty_axes,
        }
        | ReduceMin {
            axes,
            keepdims,
            noop_with_empty_axes,
        }
        | ReduceProd {
            axes,
            keepdims,
            noop_with_empty_axes,
        }
        | ReduceL1 {
            axes,
            keepdims,
            noop_with_empty_axes,
        }
        | ReduceL2 {
            axes,
            keepdims,
            noop_with_empty_axes,
        }
        | ReduceLogSum {
            axes,
            keepdims,
            noop_with_empty_axes,
        }
        | ReduceLogSumExp {
            axes,
            keepdims,
            noop_with_empty_axes,
        }
        | ReduceSumSquare {
            axes,
            keepdims,
            noop_with_empty_axes,
        } => one(reduce(
            cx,
            axes.as_ref(),
            *keepdims,
            *noop_with_empty_axes,
            cx.opset < 18,
        )),
        ArgMax { axis, keepdims, .. } | ArgMin { axis, keepdims, .. } => {
            one(arg_reduce(cx, *axis, *keepdims))
        }
        TopK { axis, .. } => {
            let shape = cx.shape(0).and_then(|x| {
                let a = norm_axis(axis.unwrap_or(-1), x.len())?;
                let mut s = x.to_vec();
                s[a] = scalar_dim(cx, 1);
                Some(s)
            });
            vec![t(cx.dtype(0), shape.clone()), t(Some(DType::I64), shape)]
        }
        Shape { start, end } => {
            let len = cx.rank(0).map_or(Dim::Unknown, |r| {
                let r = r as i64;
                let norm = |x: i64| (if x < 0 { x + r } else { x }).clamp(0, r);
                let s = norm(start.unwrap_or(0));
                let e = norm(end.unwrap_or(r));
                Dim::known((e - s).max(0))
            });
            one(t(Some(DType::I64), Some(vec![len])))
        }
        Size {} => one(t(Some(DType::I64), Some(vec![]))),
        Gather { axis } => {
            let shape = match (cx.shape(0), cx.shape(1)) {
                (Some(x), Some(idx)) => norm_axis(axis.unwrap_or(0), x.len()).map(|a| {
                    let mut s = x[..a].to_vec();
                    s.extend_from_slice(idx);
                    s.extend_from_slice(&x[a + 1..]);
                    s
                }),
                _ => None,
            };
            one(t(cx.dtype(0), shape))
        }
        GatherElements { .. } => one(t(cx.dtype(0), shape_of(cx, 1))),
        GatherND { batch_dims } => {
            let shape = match (cx.shape(0), cx.shape(1)) {
                (Some(x), Some(idx)) if !idx.is_empty() => {
                    idx.last().and_then(Dim::as_known).and_then(|k| {
                        let b = usize::try_from(batch_dims.unwrap_or(0)).ok()?;
                        let k = usize::try_from(k).ok()?;
                        let mut s = idx[..idx.len() - 1].to_vec();
                        s.extend_from_slice(x.get(b + k..)?);
                        Some(s)
                    })
                }
                _ => None,
            };
            one(t(cx.dtype(0), shape))
        }
        Slice { starts, ends, axes } => {
            one(slice(cx, starts.as_ref(), ends.as_ref(), axes.as_ref()))
        }
        Concat { axis } => one(concat(cx, *axis)),
        Split {
            axis,
            num_outputs,
            split: s,
        } => split(cx, *axis, *num_outputs, s.as_ref()),
        Reshape { allowzero } => one(reshape(cx, *allowzero)),
        Expand {} => {
            let shape = match (cx.shape(0), cx.vals(1)) {
                (Some(x), Some(target)) => broadcast_shapes(&[Some(x), Some(target)]),
                (Some(x), None) => cx
                    .shape(1)
                    .and_then(|s| small(s.first()?.as_known()?))
                    .map(|k| dims_unknown(k.max(x.len()))),
                _ => None,
            };
            one(t(cx.dtype(0), shape))
        }
        Squeeze { axes } => one(squeeze(cx, axes.as_ref())),
        Unsqueeze { axes } => one(unsqueeze(cx, axes.as_ref())),
        Flatten { axis } => {
            let shape = cx.shape(0).and_then(|x| {
                let r = x.len() as i64;
                let a = axis.unwrap_or(1);
                let a = if a < 0 { a + r } else { a };
                if !(0..=r).contains(&a) {
                    return None;
                }
                let a = a as usize;
                Some(vec![product(&x[..a]), product(&x[a..])])
            });
            one(t(cx.dtype(0), shape))
        }
        Transpose { perm } => {
            let shape = cx.shape(0).and_then(|x| {
                let perm: Vec<i64> = perm
                    .clone()
                    .unwrap_or_else(|| (0..x.len() as i64).rev().collect());
                let p = norm_axes(&perm, x.len())?;
                (p.len() == x.len()).then(|| p.iter().map(|&i| x[i].clone()).collect())
            });
            let shape = shape.or_else(|| cx.rank(0).map(dims_unknown));
            one(t(cx.dtype(0), shape))
        }
        Range {} => {
            let (s, l, d) = (scalar_dim(cx, 0), scalar_dim(cx, 1), scalar_dim(cx, 2));
            let len = match (s.as_known(), l.as_known(), d.as_known()) {
                (Some(s), Some(l), Some(d)) if d != 0 => {
                    let diff = l.saturating_sub(s);
                    let q = if d > 0 {
                        diff.saturating_add(d - 1).div_euclid(d)
                    } else {
                        diff.saturating_add(d + 1).div_euclid(d)
                    };
                    Dim::known(q.max(0))
                }
                (_, _, Some(d)) if d > 0 => ceil_div(&l.sub(&s), d),
                _ => Dim::Unknown,
            };
            one(t(cx.dtype(0).or(cx.dtype(1)), Some(vec![len])))
        }
        Tile {} => {
            let shape = cx.shape(0).map(|x| match cx.vals(1) {
                Some(r) if r.len() == x.len() => x.iter().zip(r).map(|(d, r)| d.mul(r)).collect(),
                _ => dims_unknown(x.len()),
            });
            one(t(cx.dtype(0), shape))
        }
        Pad { pads, .. } => {
            let shape = cx.shape(0).map(|x| {
                let pads: Option<Vec<Dim>> = if cx.opset < 11 {
                    pads.as_ref()
                        .map(|p| p.iter().map(|&v| Dim::known(v)).collect())
                } else {
                    cx.vals(1).map(<[Dim]>::to_vec)
                };
                let axes: Option<Vec<usize>> = if cx.opset >= 18 && cx.input(3).is_some() {
                    cx.ints(3).and_then(|a| norm_axes(&a, x.len()))
                } else {
                    Some((0..x.len()).collect())
                };
                match (pads, axes) {
                    (Some(p), Some(axes)) if p.len() == 2 * axes.len() => {
                        let mut out = x.to_vec();
                        for (j, &a) in axes.iter().enumerate() {
                            out[a] = out[a].add(&p[j]).add(&p[j + axes.len()]);
                        }
                        out
                    }
                    _ => dims_unknown(x.len()),
                }
            });
            one(t(cx.dtype(0), shape))
        }
        Resize {
            axes,
            keep_aspect_ratio_policy,
            ..
        } => one(resize(
            cx,
            axes.as_ref(),
            keep_aspect_ratio_policy.as_deref(),
        )),
        Cast { to, .. } => one(t(dtype_code(*to), shape_of(cx, 0))),
        CastLike { .. } => one(t(cx.dtype(1), shape_of(cx, 0))),
        ConstantOfShape { value } => {
            let dtype = value
                .and_then(|c| cx.m.consts.get(c))
                .map_or(DType::F32, |d| d.dtype);
            let shape = shape_of_vals(cx, 0);
            one(t(Some(dtype), shape))
        }
        Constant {
            value,
            value_float,
            value_floats,
            value_int,
            value_ints,
            value_string,
            value_strings,
        } => {
            let vec1 = |dt, n: usize| Some(Type::tensor(dt, vec![Dim::known(n as i64)]));
            let ty = if let Some(c) = value {
                cx.m.consts.get(*c).map(|d| {
                    Type::tensor(d.dtype, d.shape.iter().map(|&x| Dim::known(x)).collect())
                })
            } else if value_float.is_some() {
                Some(Type::tensor(DType::F32, vec![]))
            } else if let Some(v) = value_floats {
                vec1(DType::F32, v.len())
            } else if value_int.is_some() {
                Some(Type::tensor(DType::I64, vec![]))
            } else if let Some(v) = value_ints {
                vec1(DType::I64, v.len())
            } else if value_string.is_some() {
                Some(Type::tensor(DType::String, vec![]))
            } else {
                value_strings
                    .as_ref()
                    .and_then(|v| vec1(DType::String, v.len()))
            };
            one(ty.unwrap_or(Type::Unknown))
        }
        NonZero {} => one(t(
            Some(DType::I64),
            Some(vec![
                cx.rank(0).map_or(Dim::Unknown, |r| Dim::known(r as i64)),
                Dim::Unknown,
            ]),
        )),
        DepthToSpace { blocksize, .. } | SpaceToDepth { blocksize } => {
            let to_space = matches!(cx.node.op, DepthToSpace { .. });
            let shape = cx.shape(0).and_then(|x| {
                let b = (*blocksize).filter(|&b| b > 0)?;
                let [n, c, h, w] = x else {
                    return None;
                };
                let bb = Dim::known(b);
                let b2 = Dim::known(b.checked_mul(b)?);
                Some(if to_space {
                    vec![
                        n.clone(),
                        product_div(std::slice::from_ref(c), std::slice::from_ref(&b2)),
                        h.mul(&bb),
                        w.mul(&bb),
                    ]
                } else {
                    vec![
                        n.clone(),
                        c.mul(&b2),
                        product_div(std::slice::from_ref(h), std::slice::from_ref(&bb)),
                        product_div(std::slice::from_ref(w), std::slice::from_ref(&bb)),
                    ]
                })
            });
            let shape = shape.or_else(|| cx.rank(0).map(dims_unknown));
            one(t(cx.dtype(0), shape))
        }
        OneHot { axis } => {
            let shape = cx.shape(0).and_then(|x| {
                let a = norm_axis(axis.unwrap_or(-1), x.len() + 1)?;
                let mut s = x.to_vec();
                s.insert(a, scalar_dim(cx, 1));
                Some(s)
            });
            one(t(cx.dtype(2), shape))
        }
        QuantizeLinear { output_dtype, .. } => {
            let dt = dtype_code(*output_dtype)
                .or(cx.dtype(2))
                .unwrap_or(DType::U8);
            one(t(Some(dt), shape_of(cx, 0)))
        }
        DequantizeLinear { output_dtype, .. } => {
            let dt = dtype_code(*output_dtype)
                .or(cx.dtype(1))
                .unwrap_or(DType::F32);
            one(t(Some(dt), shape_of(cx, 0)))
        }
        DynamicQuantizeLinear {} => vec![
            t(Some(DType::U8), shape_of(cx, 0)),
            Type::tensor(DType::F32, vec![]),
            Type::tensor(DType::U8, vec![]),
        ],
        Attention {
            kv_num_heads,
            q_num_heads,
            ..
        } => attention(cx, *kv_num_heads, *q_num_heads),
        Optional { r#type } => match cx.input(0) {
            Some(_) => one(Type::Optional(Box::new(
                cx.ty(0).cloned().unwrap_or(Type::Unknown),
            ))),
            None => one(r#type
                .clone()
                .map_or(Type::Unknown, |ty| Type::Optional(Box::new(ty)))),
        },
        // The long tail (`super::tail`).
        OptionalHasElement {}
        | OptionalGetElement {}
        | SequenceEmpty { .. }
        | SequenceConstruct {}
        | SequenceLength {}
        | SequenceAt {}
        | SequenceInsert {}
        | SequenceErase {}
        | SplitToSequence { .. }
        | ConcatFromSequence { .. }
        | SequenceMap { .. } => tail::sequence(cx),
        RNN {
            direction,
            hidden_size,
            layout,
            ..
        }
        | GRU {
            direction,
            hidden_size,
            layout,
            ..
        } => tail::recurrent(cx, direction.as_deref(), *hidden_size, *layout, 2),
        LSTM {
            direction,
            hidden_size,
            layout,
            ..
        } => tail::recurrent(cx, direction.as_deref(), *hidden_size, *layout, 3),
        CumProd { .. }
        | Shrink { .. }
        | ReverseSequence { .. }
        | SwiGLU { .. }
        | TensorScatter { .. }
        | Scatter { .. } => one(same(cx, 0)),
        StringConcat {} => one(bcast(cx, Some(DType::String))),
        Compress { axis } => one(tail::compress(cx, *axis)),
        EyeLike { dtype, .. } => one(tail::eye_like(cx, *dtype)),
        Det {} => one(tail::det(cx)),
        HannWindow {
            output_datatype, ..
        }
        | HammingWindow {
            output_datatype, ..
        }
        | BlackmanWindow {
            output_datatype, ..
        } => one(tail::window(cx, *output_datatype)),
        StringSplit { .. } => tail::string_split(cx),
        StringNormalizer { .. } => one(tail::string_normalizer(cx)),
        Unique { axis, .. } => tail::unique(cx, *axis),
        CenterCropPad { axes } => one(tail::center_crop_pad(cx, axes.as_deref())),
        Col2Im { .. } => one(tail::col2im(cx)),
        DFT {
            axis,
            inverse,
            onesided,
        } => one(tail::dft(
            cx,
            *axis,
            onesided.unwrap_or(0) != 0,
            inverse.unwrap_or(0) != 0,
        )),
        STFT { onesided } => one(tail::stft(cx, onesided.unwrap_or(1) != 0)),
        NonMaxSuppression { .. } => {
            one(t(Some(DType::I64), Some(vec![Dim::Unknown, Dim::known(3)])))
        }
        GridSample { .. } => one(tail::grid_sample(cx)),
        MaxUnpool {
            kernel_shape,
            pads,
            strides,
        } => one(tail::max_unpool(
            cx,
            kernel_shape.as_deref(),
            pads.as_deref(),
            strides.as_deref(),
        )),
        TfIdfVectorizer { ngram_indexes, .. } => one(tail::tfidf(cx, ngram_indexes.as_deref())),
        MelWeightMatrix { output_datatype } => one(tail::mel_weight_matrix(cx, *output_datatype)),
        RoiAlign {
            output_height,
            output_width,
            ..
        } => one(tail::roi_align(cx, *output_height, *output_width)),
        NegativeLogLikelihoodLoss { reduction, .. } => {
            tail::loss(cx, Some(reduction.as_deref().unwrap_or("mean")), false)
        }
        SoftmaxCrossEntropyLoss { reduction, .. } => {
            tail::loss(cx, Some(reduction.as_deref().unwrap_or("mean")), true)
        }
        BitCast { to } => one(tail::bit_cast(cx, *to)),
        AffineGrid { .. } => one(tail::affine_grid(cx)),
        Upsample { scales, .. } => one(tail::upsample(cx, scales.as_deref())),
        // ONNX Runtime's ops and mmq's plugins (`super::contrib`).
        SimplifiedLayerNormalization { .. }
        | MsGelu {}
        | FastGelu {}
        | BiasGelu {}
        | QuickGelu { .. }
        | MsRotaryEmbedding { .. } => one(same(cx, 0)),
        // Output, then mean and inverse standard deviation (not typed here), then the sum.
        SkipLayerNormalization { .. } | SkipSimplifiedLayerNormalization { .. } => {
            vec![same(cx, 0), Type::Unknown, Type::Unknown, same(cx, 0)]
        }
        FusedConv { .. } => contrib::as_standard(cx, "Conv", FUSED_ACTIVATION, infer_op),
        FusedGemm { .. } => contrib::as_standard(cx, "Gemm", FUSED_ACTIVATION, infer_op),
        FusedMatMul {
            trans_a,
            trans_b,
            trans_batch_a,
            trans_batch_b,
            ..
        } => contrib::fused_matmul(cx, [*trans_a, *trans_b, *trans_batch_a, *trans_batch_b]),
        MatMulNBits { n, .. } | MmqMatMulNBits { n, .. } => contrib::matmul_nbits(cx, *n),
        MultiHeadAttention { .. } => one(contrib::mha_output(cx)),
        GroupQueryAttention {
            num_heads,
            kv_num_heads,
            ..
        } => one(contrib::gqa_output(cx, *num_heads, *kv_num_heads)),
        MsAttention {
            qkv_hidden_sizes, ..
        } => contrib::packed_attention(cx, qkv_hidden_sizes.as_deref()),
        MmqQuantize { .. } => one(t(Some(DType::I8), shape_of(cx, 0))),
        MmqDequantize { .. } => one(t(cx.dtype(1), shape_of(cx, 0))),
        MmqDynamicQuantize { block_size, .. } => {
            contrib::dynamic_quantize(cx, block_size.unwrap_or(0))
        }
        Custom(_) => Vec::new(),
        If { .. } | Loop { .. } | Scan { .. } => Vec::new(),
    }
}

/// The shape held by operand `i` (a shape tensor): its shape value, or unknown dims of the
/// right count when only its length is known.
fn shape_of_vals(cx: &Cx, i: usize) -> Option<Vec<Dim>> {
    cx.vals(i).map(<[Dim]>::to_vec).or_else(|| {
        let k = cx.shape(i)?.first()?.as_known()?;
        Some(dims_unknown(small(k)?))
    })
}
