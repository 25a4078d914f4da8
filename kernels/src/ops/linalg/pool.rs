//! MaxPool, AveragePool, LpPool and their global forms.

use mmq_ir::{DType, Op};
use rayon::prelude::*;

use super::conv::{Geometry, WindowAttrs, geometry};
use super::{Real, by_real, is_float};
use crate::error::KernelError;
use crate::ops::util::tensor;
use crate::ops::{OpCtx, OpResult};
use crate::tensor::{RtValue, Tensor};

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Max,
    Avg { include_pad: bool },
    Lp(f64),
}

/// For one spatial dim: per output index, the valid input positions and the count of window
/// positions inside the padded extent.
struct DimWindows {
    valid: Vec<Vec<usize>>,
    padded_count: Vec<usize>,
}

fn windows(g: &Geometry, d: usize) -> DimWindows {
    let mut valid = Vec::with_capacity(g.output[d]);
    let mut padded_count = Vec::with_capacity(g.output[d]);
    let (inp, pb, pe) = (
        g.input[d] as isize,
        g.pad_begin[d] as isize,
        g.pad_end[d] as isize,
    );
    for o in 0..g.output[d] {
        let start = (o * g.strides[d]) as isize - pb;
        let mut v = Vec::with_capacity(g.kernel[d]);
        let mut pc = 0;
        for k in 0..g.kernel[d] {
            let p = start + (k * g.dilations[d]) as isize;
            if p >= -pb && p < inp + pe {
                pc += 1;
            }
            if p >= 0 && p < inp {
                v.push(p as usize);
            }
        }
        valid.push(v);
        padded_count.push(pc);
    }
    DimWindows {
        valid,
        padded_count,
    }
}

/// Pools every `[N·C]` plane of `x`; returns values and (for max) flat input indices.
fn pool_planes<T: Real>(
    x: &[T],
    planes: usize,
    g: &Geometry,
    kind: Kind,
    want_idx: bool,
    col_major: bool,
) -> (Vec<T>, Vec<i64>) {
    let nd = g.input.len();
    let in_size: usize = g.input.iter().product();
    let out_size: usize = g.output.iter().product();
    let wins: Vec<DimWindows> = (0..nd).map(|d| windows(g, d)).collect();
    // Input strides (row-major) and index strides (row- or column-major).
    let mut st = vec![1usize; nd];
    for d in (0..nd.saturating_sub(1)).rev() {
        st[d] = st[d + 1] * g.input[d + 1];
    }
    let mut ist = vec![1usize; nd];
    if col_major {
        for d in 1..nd {
            ist[d] = ist[d - 1] * g.input[d - 1];
        }
    } else {
        ist.clone_from(&st);
    }
    let mut y = vec![T::ZERO; planes * out_size];
    let mut idx = vec![0i64; if want_idx { planes * out_size } else { 0 }];
    let plane = |p: usize, yp: &mut [T], ip: &mut [i64]| {
        let xp = &x[p * in_size..(p + 1) * in_size];
        if nd == 2 && !want_idx {
            return plane_2d(xp, yp, g, &wins, kind);
        }
        let mut oidx = vec![0usize; nd];
        let mut kpos = vec![0usize; nd];
        let mut lists: Vec<&[usize]> = Vec::with_capacity(nd);
        for (o, yo) in yp.iter_mut().enumerate() {
            let mut r = o;
            for d in (0..nd).rev() {
                oidx[d] = r % g.output[d];
                r /= g.output[d];
            }
            lists.clear();
            lists.extend((0..nd).map(|d| wins[d].valid[oidx[d]].as_slice()));
            let total: usize = lists.iter().map(|l| l.len()).product();
            let mut best = T::NEG_INF;
            let mut best_i = 0usize;
            let mut found = false;
            let mut acc = 0f64;
            kpos.iter_mut().for_each(|k| *k = 0);
            for _ in 0..total {
                let mut off = 0usize;
                for d in 0..nd {
                    off += lists[d][kpos[d]] * st[d];
                }
                let v = xp[off];
                match kind {
                    Kind::Max => {
                        if !found || v > best {
                            best = v;
                            best_i = off;
                            found = true;
                        }
                    }
                    Kind::Avg { .. } => acc += v.to_f64(),
                    Kind::Lp(pw) => acc += v.to_f64().abs().powf(pw),
                }
                for d in (0..nd).rev() {
                    kpos[d] += 1;
                    if kpos[d] < lists[d].len() {
                        break;
                    }
                    kpos[d] = 0;
                }
            }
            *yo = match kind {
                Kind::Max => best,
                Kind::Avg { include_pad } => {
                    let cnt = if include_pad {
                        (0..nd).map(|d| wins[d].padded_count[oidx[d]]).product()
                    } else {
                        total
                    };
                    T::from_f64(acc / cnt as f64)
                }
                Kind::Lp(pw) => T::from_f64(acc.powf(1.0 / pw)),
            };
            if want_idx {
                let mut rem = best_i;
                let mut flat = p * in_size;
                for d in 0..nd {
                    flat += rem / st[d] * ist[d];
                    rem %= st[d];
                }
                ip[o] = flat as i64;
            }
        }
    };
    let heavy = planes > 1 && planes * out_size * g.kernel.iter().product::<usize>() >= 1 << 18;
    if want_idx {
        for (p, (yp, ip)) in y
            .chunks_mut(out_size.max(1))
            .zip(idx.chunks_mut(out_size.max(1)))
            .enumerate()
        {
            plane(p, yp, ip);
        }
    } else if heavy {
        y.par_chunks_mut(out_size.max(1))
            .enumerate()
            .for_each(|(p, yp)| plane(p, yp, &mut []));
    } else {
        y.chunks_mut(out_size.max(1))
            .enumerate()
            .for_each(|(p, yp)| plane(p, yp, &mut []));
    }
    (y, idx)
}

/// One 2-D plane without indices: the common case (`MaxPool`, `AveragePool`, the global pools
/// of image models), walked row by row with no per-output bookkeeping. Same results as the
/// general walk: the first element seeds the max, averages accumulate in f64.
fn plane_2d<T: Real>(xp: &[T], yp: &mut [T], g: &Geometry, wins: &[DimWindows], kind: Kind) {
    let w = g.input[1];
    // Max at stride 1 over the outputs whose window lies inside the row (all of the kernel's
    // columns), a whole row of them per tap: the taps in the same order as below, so the same
    // result (the first tap, then each later one that is greater).
    let full = |ow: usize| wins[1].valid[ow].len() == g.kernel[1];
    let a = (0..g.output[1]).find(|&o| full(o)).unwrap_or(g.output[1]);
    let b = (a..g.output[1]).find(|&o| !full(o)).unwrap_or(g.output[1]);
    let (sw, dw, pw) = (g.strides[1], g.dilations[1], g.pad_begin[1]);
    for (oh, yrow) in yp.chunks_mut(g.output[1].max(1)).enumerate() {
        let rows = &wins[0].valid[oh];
        let inner = matches!(kind, Kind::Max) && sw == 1 && !rows.is_empty() && a < b;
        if inner {
            for (i, &r) in rows.iter().enumerate() {
                let xr = &xp[r * w..(r + 1) * w];
                for kc in 0..g.kernel[1] {
                    // Column of output `a` at this tap (inside the row: `a` is full).
                    let c0 = a + kc * dw - pw;
                    let taps = &xr[c0..c0 + (b - a)];
                    let ys = &mut yrow[a..b];
                    if i == 0 && kc == 0 {
                        ys.copy_from_slice(taps);
                    } else {
                        for (y, &v) in ys.iter_mut().zip(taps) {
                            *y = if v > *y { v } else { *y };
                        }
                    }
                }
            }
        }
        for (ow, yo) in yrow.iter_mut().enumerate() {
            if inner && (a..b).contains(&ow) {
                continue;
            }
            let cols = &wins[1].valid[ow];
            *yo = match kind {
                Kind::Max => {
                    let mut best: Option<T> = None;
                    for &r in rows {
                        let xr = &xp[r * w..(r + 1) * w];
                        for &c in cols {
                            let v = xr[c];
                            if best.is_none_or(|b| v > b) {
                                best = Some(v);
                            }
                        }
                    }
                    best.unwrap_or(T::NEG_INF)
                }
                Kind::Avg { include_pad } => {
                    let mut acc = 0f64;
                    for &r in rows {
                        let xr = &xp[r * w..(r + 1) * w];
                        for &c in cols {
                            acc += xr[c].to_f64();
                        }
                    }
                    let cnt = if include_pad {
                        wins[0].padded_count[oh] * wins[1].padded_count[ow]
                    } else {
                        rows.len() * cols.len()
                    };
                    T::from_f64(acc / cnt as f64)
                }
                Kind::Lp(pw) => {
                    let mut acc = 0f64;
                    for &r in rows {
                        let xr = &xp[r * w..(r + 1) * w];
                        for &c in cols {
                            acc += xr[c].to_f64().abs().powf(pw);
                        }
                    }
                    T::from_f64(acc.powf(1.0 / pw))
                }
            };
        }
    }
}

fn pool_float<T: Real>(cx: &OpCtx<'_>, x: &Tensor) -> Result<Vec<Option<RtValue>>, KernelError> {
    if x.rank() < 3 {
        return Err(cx.invalid(format!("X {:?} must have rank at least 3", x.shape)));
    }
    let spatial = &x.shape[2..];
    let planes = x.shape[0] * x.shape[1];
    let global = |kind: Kind| -> Result<(Kind, Geometry, bool), KernelError> {
        let a = WindowAttrs {
            auto_pad: None,
            dilations: None,
            kernel_shape: None,
            pads: None,
            strides: None,
            ceil_mode: false,
        };
        Ok((kind, geometry(cx, &a, spatial, Some(spatial))?, false))
    };
    let (kind, geo, col_major) = match &cx.node.op {
        Op::GlobalAveragePool {} => global(Kind::Avg { include_pad: false })?,
        Op::GlobalMaxPool {} => global(Kind::Max)?,
        Op::GlobalLpPool { p } => global(Kind::Lp(p.unwrap_or(2) as f64))?,
        Op::MaxPool {
            auto_pad,
            ceil_mode,
            dilations,
            kernel_shape,
            pads,
            storage_order,
            strides,
        } => {
            let a = WindowAttrs {
                auto_pad: auto_pad.as_deref(),
                dilations: dilations.as_deref(),
                kernel_shape: kernel_shape.as_deref(),
                pads: pads.as_deref(),
                strides: strides.as_deref(),
                ceil_mode: ceil_mode.unwrap_or(0) != 0,
            };
            (
                Kind::Max,
                geometry(cx, &a, spatial, None)?,
                storage_order.unwrap_or(0) != 0,
            )
        }
        Op::AveragePool {
            auto_pad,
            ceil_mode,
            count_include_pad,
            dilations,
            kernel_shape,
            pads,
            strides,
        } => {
            let a = WindowAttrs {
                auto_pad: auto_pad.as_deref(),
                dilations: dilations.as_deref(),
                kernel_shape: kernel_shape.as_deref(),
                pads: pads.as_deref(),
                strides: strides.as_deref(),
                ceil_mode: ceil_mode.unwrap_or(0) != 0,
            };
            let include_pad = count_include_pad.unwrap_or(0) != 0;
            (
                Kind::Avg { include_pad },
                geometry(cx, &a, spatial, None)?,
                false,
            )
        }
        Op::LpPool {
            auto_pad,
            ceil_mode,
            dilations,
            kernel_shape,
            p,
            pads,
            strides,
        } => {
            let a = WindowAttrs {
                auto_pad: auto_pad.as_deref(),
                dilations: dilations.as_deref(),
                kernel_shape: kernel_shape.as_deref(),
                pads: pads.as_deref(),
                strides: strides.as_deref(),
                ceil_mode: ceil_mode.unwrap_or(0) != 0,
            };
            (
                Kind::Lp(p.unwrap_or(2) as f64),
                geometry(cx, &a, spatial, None)?,
                false,
            )
        }
        _ => return Err(cx.invalid("not a pooling op")),
    };
    let want_idx = kind == Kind::Max && cx.node.outputs.get(1).is_some_and(Option::is_some);
    let xv = T::load(x)?;
    let (y, idx) = pool_planes(&xv, planes, &geo, kind, want_idx, col_major);
    let mut shape = x.shape[..2].to_vec();
    shape.extend(&geo.output);
    let mut outs = vec![Some(T::store(x.dtype, shape.clone(), y)?.into())];
    if want_idx {
        outs.push(Some(Tensor::from_i64(shape, idx)?.into()));
    }
    Ok(outs)
}

/// Every pooling op.
pub(super) fn pool_op(cx: &OpCtx<'_>, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let ok = is_float(x.dtype)
        || (matches!(cx.node.op, Op::MaxPool { .. } | Op::GlobalMaxPool {})
            && matches!(x.dtype, DType::I8 | DType::U8));
    if !ok {
        return Err(cx.unsupported(format!("{} on {}", cx.node.op.op_type(), x.dtype)));
    }
    by_real!(x.dtype, pool_float(cx, x))
}

#[cfg(test)]
mod tests {
    use super::super::tests::{close, f32t, out, run_op};
    use mmq_ir::Op;

    #[test]
    fn maxpool_with_indices_and_padding() {
        let x: Vec<f32> = (0..16).map(|v| v as f32).collect();
        let op = Op::MaxPool {
            auto_pad: None,
            ceil_mode: None,
            dilations: None,
            kernel_shape: Some(vec![2, 2]),
            pads: None,
            storage_order: Some(1),
            strides: Some(vec![2, 2]),
        };
        let r = run_op(op, vec![f32t(&[1, 1, 4, 4], &x)], 2, 12).expect("run");
        assert_eq!(out(&r, 0), (vec![1, 1, 2, 2], vec![5.0, 7.0, 13.0, 15.0]));
        // Column-major indices: h + w*H.
        assert_eq!(out(&r, 1).1, vec![5.0, 13.0, 7.0, 15.0]);
    }

    /// The 2-D walk (no indices asked) gives the general walk's values (indices asked), over
    /// padding, dilation, strides and ceil mode, on values with NaN.
    #[test]
    fn the_2d_walk_is_the_general_walk() {
        let mut x: Vec<f32> = (0..2 * 3 * 11 * 9)
            .map(|i| ((i * 37) % 23) as f32 - 11.0)
            .collect();
        // NaN as the first tap of a window and as a later one, and -inf.
        x[17] = f32::NAN;
        x[0] = f32::NAN;
        x[40] = f32::NAN;
        x[101] = f32::NEG_INFINITY;
        for (k, pads, dil, st, ceil) in [
            (3, vec![0, 0, 0, 0], vec![1, 1], vec![1, 1], 0),
            (3, vec![1, 2, 1, 0], vec![1, 1], vec![2, 2], 1),
            (3, vec![2, 2, 2, 2], vec![2, 2], vec![1, 3], 0),
            (2, vec![0, 0, 1, 1], vec![1, 1], vec![1, 1], 0),
            (5, vec![2, 2, 2, 2], vec![1, 1], vec![1, 1], 0),
            (3, vec![2, 2, 2, 2], vec![2, 2], vec![1, 1], 0),
            (9, vec![0, 0, 0, 0], vec![1, 1], vec![1, 1], 0),
        ] {
            let op = Op::MaxPool {
                auto_pad: None,
                ceil_mode: Some(ceil),
                dilations: Some(dil),
                kernel_shape: Some(vec![k, k]),
                pads: Some(pads),
                storage_order: None,
                strides: Some(st),
            };
            let fast = run_op(op.clone(), vec![f32t(&[2, 3, 11, 9], &x)], 1, 12).expect("run");
            let general = run_op(op, vec![f32t(&[2, 3, 11, 9], &x)], 2, 12).expect("run");
            let (a, b) = (out(&fast, 0), out(&general, 0));
            assert_eq!(a.0, b.0);
            for (p, q) in a.1.iter().zip(&b.1) {
                assert!(
                    p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan()),
                    "{p} {q}"
                );
            }
        }
    }

    #[test]
    fn averagepool_pads_and_ceil() {
        let x = [1.0f32, 2.0, 3.0, 4.0];
        let op = |include: i64, ceil: i64, pads: Option<Vec<i64>>| Op::AveragePool {
            auto_pad: None,
            ceil_mode: Some(ceil),
            count_include_pad: Some(include),
            dilations: None,
            kernel_shape: Some(vec![2]),
            pads,
            strides: Some(vec![2]),
        };
        // pads [1,1]: windows [-1,0], [1,2], [3,4].
        let r = run_op(
            op(0, 0, Some(vec![1, 1])),
            vec![f32t(&[1, 1, 4], &x)],
            1,
            19,
        )
        .expect("run");
        close(&out(&r, 0).1, &[1.0, 2.5, 4.0], 1e-6);
        let r = run_op(
            op(1, 0, Some(vec![1, 1])),
            vec![f32t(&[1, 1, 4], &x)],
            1,
            19,
        )
        .expect("run");
        close(&out(&r, 0).1, &[0.5, 2.5, 2.0], 1e-6);
        // ceil_mode on 5 elements, no pads: windows [0,1],[2,3],[4].
        let x5 = [1.0f32, 2.0, 3.0, 4.0, 5.0];
        let r = run_op(op(1, 1, None), vec![f32t(&[1, 1, 5], &x5)], 1, 19).expect("run");
        close(&out(&r, 0).1, &[1.5, 3.5, 5.0], 1e-6);
    }

    #[test]
    fn global_pools() {
        let x = [1.0f32, -2.0, 3.0, 4.0];
        let r = run_op(Op::GlobalAveragePool {}, vec![f32t(&[1, 2, 2], &x)], 1, 17).expect("run");
        assert_eq!(out(&r, 0), (vec![1, 2, 1], vec![-0.5, 3.5]));
        let r = run_op(Op::GlobalMaxPool {}, vec![f32t(&[1, 2, 2], &x)], 1, 17).expect("run");
        assert_eq!(out(&r, 0).1, vec![1.0, 4.0]);
        let r = run_op(
            Op::GlobalLpPool { p: None },
            vec![f32t(&[1, 2, 2], &x)],
            1,
            17,
        )
        .expect("run");
        close(&out(&r, 0).1, &[5f64.sqrt(), 5.0], 1e-6);
    }
}
