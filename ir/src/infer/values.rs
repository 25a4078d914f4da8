//! Shape-value propagation: the contents of small integer tensors through the ops exporters use
//! to compute shapes.

use super::dims::{exact_div, floor_div, product};
use super::{Cx, MAX_SHAPE_VALUE_LEN, const_ints};
use crate::dim::Dim;
use crate::dtype::DType;
use crate::op::Op;

/// Elementwise `f` over two shape values, broadcasting a one-element operand.
fn zip(a: &[Dim], b: &[Dim], f: impl Fn(&Dim, &Dim) -> Dim) -> Option<Vec<Dim>> {
    match (a.len(), b.len()) {
        (x, y) if x == y => Some(a.iter().zip(b).map(|(p, q)| f(p, q)).collect()),
        (1, _) => Some(b.iter().map(|q| f(&a[0], q)).collect()),
        (_, 1) => Some(a.iter().map(|p| f(p, &b[0])).collect()),
        _ => None,
    }
}

/// `a / b` for shape values: floor division by a positive constant, exact division by a
/// symbolic monomial, unknown otherwise.
fn div(a: &Dim, b: &Dim) -> Dim {
    match (a, b.as_known()) {
        (_, Some(k)) if k > 0 => floor_div(a, k),
        (Dim::Expr(x), None) => match b.expr() {
            Some(y) => exact_div(x, y).map_or(Dim::Unknown, Dim::Expr),
            None => Dim::Unknown,
        },
        _ => Dim::Unknown,
    }
}

/// Elements `idx` of `vals` (negative indices count from the end).
fn select(vals: &[Dim], idx: &[i64]) -> Option<Vec<Dim>> {
    let n = vals.len() as i64;
    idx.iter()
        .map(|&i| {
            let i = if i < 0 { i + n } else { i };
            (0..n).contains(&i).then(|| vals[i as usize].clone())
        })
        .collect()
}

/// Shape values of each result of `cx.node` (`None` where not tracked). Only integer and bool
/// results are tracked (bools as 0 and 1, for conditions).
pub(crate) fn propagate(cx: &Cx) -> Vec<Option<Vec<Dim>>> {
    let mut out = vec![None; cx.node.outputs.len()];
    let Some(first) = out.first_mut() else {
        return out;
    };
    let int_result = cx.node.outputs[0]
        .and_then(|v| cx.m.values.get(v))
        .filter(|d| d.ty.index() < cx.m.types.len())
        .is_none_or(|d| {
            cx.m.types[d.ty]
                .dtype()
                .is_none_or(|t| t.is_int() || t == DType::Bool)
        });
    if int_result {
        *first = compute(cx).filter(|v| v.len() <= MAX_SHAPE_VALUE_LEN);
    }
    out
}

fn compute(cx: &Cx) -> Option<Vec<Dim>> {
    use Op::*;
    match &cx.node.op {
        Shape { start, end } => {
            let x = cx.shape(0)?;
            let r = x.len() as i64;
            let norm = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
            let (s, e) = (norm(start.unwrap_or(0)), norm(end.unwrap_or(r)));
            Some(x[s..e.max(s)].to_vec())
        }
        Size {} => Some(vec![product(cx.shape(0)?)]),
        Constant {
            value,
            value_int,
            value_ints,
            ..
        } => {
            if let Some(c) = value {
                Some(const_ints(cx.m, *c)?.into_iter().map(Dim::known).collect())
            } else if let Some(v) = value_int {
                Some(vec![Dim::known(*v)])
            } else {
                value_ints
                    .as_ref()
                    .map(|v| v.iter().map(|&x| Dim::known(x)).collect())
            }
        }
        Identity {} | Unsqueeze { .. } | Squeeze { .. } | Reshape { .. } | Flatten { .. } => {
            cx.vals(0).map(<[Dim]>::to_vec)
        }
        Cast { .. } => {
            if cx.dtype(0).is_some_and(|d| !d.is_int()) {
                return None;
            }
            cx.vals(0).map(<[Dim]>::to_vec)
        }
        Gather { axis } => {
            if axis.unwrap_or(0) != 0 {
                return None;
            }
            select(cx.vals(0)?, &cx.ints(1)?)
        }
        Slice { starts, ends, axes } => {
            let vals = cx.vals(0)?;
            let (s, e, a, st) = if cx.opset < 10 {
                (starts.clone()?, ends.clone()?, axes.clone(), None)
            } else {
                let opt = |i: usize| match cx.input(i) {
                    Some(_) => cx.ints(i).map(Some),
                    None => Some(None),
                };
                (cx.ints(1)?, cx.ints(2)?, opt(3)?, opt(4)?)
            };
            if s.len() != 1 || e.len() != 1 || a.is_some_and(|a| a != [0] && a != [-1]) {
                return None;
            }
            let step = match st {
                Some(v) => *v.first()?,
                None => 1,
            };
            let n = vals.len() as i64;
            let wrap = |x: i64| if x < 0 { x.saturating_add(n) } else { x };
            let mut idx = Vec::new();
            if step > 0 {
                let (mut i, end) = (wrap(s[0]).clamp(0, n), wrap(e[0]).clamp(0, n));
                while i < end {
                    idx.push(i);
                    let Some(next) = i.checked_add(step) else {
                        break;
                    };
                    i = next;
                }
            } else if step < 0 && n > 0 {
                let (mut i, end) = (wrap(s[0]).clamp(0, n - 1), wrap(e[0]).clamp(-1, n - 1));
                while i > end {
                    idx.push(i);
                    let Some(next) = i.checked_add(step) else {
                        break;
                    };
                    i = next;
                }
            } else if step == 0 {
                return None;
            }
            select(vals, &idx)
        }
        Concat { .. } => {
            let mut out = Vec::new();
            for i in 0..cx.num_inputs() {
                if cx.input(i).is_some() {
                    out.extend_from_slice(cx.vals(i)?);
                }
            }
            Some(out)
        }
        Add {} => zip(cx.vals(0)?, cx.vals(1)?, Dim::add),
        Sub {} => zip(cx.vals(0)?, cx.vals(1)?, Dim::sub),
        Mul {} => zip(cx.vals(0)?, cx.vals(1)?, Dim::mul),
        Div {} => zip(cx.vals(0)?, cx.vals(1)?, div),
        Neg {} => Some(cx.vals(0)?.iter().map(|d| Dim::known(0).sub(d)).collect()),
        Max {} | Min {} => {
            let is_max = matches!(cx.node.op, Max {});
            let mut acc: Option<Vec<Dim>> = None;
            for i in 0..cx.num_inputs() {
                let v = cx.vals(i)?;
                acc = Some(match acc {
                    None => v.to_vec(),
                    Some(a) => zip(&a, v, |p, q| match (p.as_known(), q.as_known()) {
                        (Some(x), Some(y)) => Dim::known(if is_max { x.max(y) } else { x.min(y) }),
                        _ if p.provably_eq(q) => p.clone(),
                        _ => Dim::Unknown,
                    })?,
                });
            }
            acc
        }
        Equal {} => zip(cx.vals(0)?, cx.vals(1)?, |p, q| {
            // A size is never negative: `Equal(shape, -1)` (the TorchScript exporter's
            // `expand_as`) is false for every symbolic dim.
            let size_vs_negative = |a: &Dim, b: &Dim| {
                b.as_known().is_some_and(|k| k < 0)
                    && a.expr().is_some_and(crate::dim::DimExpr::provably_nonneg)
            };
            match (p.as_known(), q.as_known()) {
                (Some(x), Some(y)) => Dim::known(i64::from(x == y)),
                _ if p.provably_eq(q) => Dim::known(1),
                _ if size_vs_negative(p, q) || size_vs_negative(q, p) => Dim::known(0),
                _ => Dim::Unknown,
            }
        }),
        Where {} => {
            let c = cx.ints(0)?;
            let (a, b) = (cx.vals(1)?, cx.vals(2)?);
            let n = c.len().max(a.len()).max(b.len());
            let pick = |v: &[Dim], i: usize| -> Option<Dim> {
                match v.len() {
                    1 => Some(v[0].clone()),
                    l if l == n => Some(v[i].clone()),
                    _ => None,
                }
            };
            (0..n)
                .map(|i| {
                    let ci = match c.len() {
                        1 => c[0],
                        l if l == n => c[i],
                        _ => return None,
                    };
                    if ci != 0 { pick(a, i) } else { pick(b, i) }
                })
                .collect()
        }
        Range {} => {
            let (s, l, d) = (cx.int(0)?, cx.int(1)?, cx.int(2)?);
            if d == 0 {
                return None;
            }
            let mut out = Vec::new();
            let mut x = s;
            while (d > 0 && x < l) || (d < 0 && x > l) {
                if out.len() >= MAX_SHAPE_VALUE_LEN {
                    return None;
                }
                out.push(Dim::known(x));
                x = x.checked_add(d)?;
            }
            Some(out)
        }
        ConstantOfShape { value } => {
            let fill = match value {
                Some(c) => *const_ints(cx.m, *c)?.first()?,
                None => 0,
            };
            let n = match cx.ints(0)?.as_slice() {
                [] => 1,
                [n] => *n,
                _ => return None,
            };
            let n = usize::try_from(n)
                .ok()
                .filter(|&n| n <= MAX_SHAPE_VALUE_LEN)?;
            Some(vec![Dim::known(fill); n])
        }
        Expand {} => {
            let v = cx.vals(0)?;
            match (v, cx.ints(1)?.as_slice()) {
                ([d], [n]) => Some(vec![
                    d.clone();
                    usize::try_from(*n)
                        .ok()
                        .filter(|&n| n <= MAX_SHAPE_VALUE_LEN)?
                ]),
                (v, [n]) if v.len() as i64 == *n || *n == 1 => Some(v.to_vec()),
                _ => None,
            }
        }
        _ => None,
    }
}
