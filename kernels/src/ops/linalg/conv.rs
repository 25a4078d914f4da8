//! Conv and ConvTranspose: im2col / col2im around GEMM, parallel over images and groups, and
//! within one image and group among threads when there are fewer of those than threads.

use mmq_ir::Op;
use rayon::prelude::*;

use super::{Real, by_real, gemm, is_float};
use crate::error::KernelError;
use crate::ops::util::{opt_tensor, tensor};
use crate::ops::{OpCtx, OpResult};
use crate::tensor::{RtValue, Tensor};

/// Spatial geometry of a sliding-window op.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Geometry {
    /// Input spatial dims.
    pub input: Vec<usize>,
    /// Kernel dims.
    pub kernel: Vec<usize>,
    /// Strides.
    pub strides: Vec<usize>,
    /// Dilations.
    pub dilations: Vec<usize>,
    /// Padding before each spatial dim.
    pub pad_begin: Vec<usize>,
    /// Padding after each spatial dim.
    pub pad_end: Vec<usize>,
    /// Output spatial dims.
    pub output: Vec<usize>,
}

/// The sliding-window attributes shared by Conv and the pools.
pub(crate) struct WindowAttrs<'a> {
    pub auto_pad: Option<&'a str>,
    pub dilations: Option<&'a [i64]>,
    pub kernel_shape: Option<&'a [i64]>,
    pub pads: Option<&'a [i64]>,
    pub strides: Option<&'a [i64]>,
    pub ceil_mode: bool,
}

fn positive(
    cx: &OpCtx<'_>,
    what: &str,
    v: Option<&[i64]>,
    n: usize,
) -> Result<Vec<usize>, KernelError> {
    match v {
        None => Ok(vec![1; n]),
        Some(v) if v.len() == n && v.iter().all(|&x| x >= 1) => {
            Ok(v.iter().map(|&x| x as usize).collect())
        }
        Some(v) => Err(cx.invalid(format!("{what} {v:?} must have {n} positive entries"))),
    }
}

/// Computes the geometry for `input` spatial dims; `kernel` defaults to `default_kernel`.
pub(crate) fn geometry(
    cx: &OpCtx<'_>,
    a: &WindowAttrs<'_>,
    input: &[usize],
    default_kernel: Option<&[usize]>,
) -> Result<Geometry, KernelError> {
    let n = input.len();
    let kernel: Vec<usize> = match (a.kernel_shape, default_kernel) {
        (Some(k), _) => positive(cx, "kernel_shape", Some(k), n)?,
        (None, Some(k)) if k.len() == n => k.to_vec(),
        _ => return Err(cx.invalid("kernel_shape is missing or has the wrong rank")),
    };
    let strides = positive(cx, "strides", a.strides, n)?;
    let dilations = positive(cx, "dilations", a.dilations, n)?;
    let mut pad_begin = vec![0usize; n];
    let mut pad_end = vec![0usize; n];
    let mut output = vec![0usize; n];
    let auto = a.auto_pad.unwrap_or("NOTSET");
    for i in 0..n {
        let span = (kernel[i] - 1) * dilations[i] + 1;
        match auto {
            "SAME_UPPER" | "SAME_LOWER" => {
                let out = input[i].div_ceil(strides[i]);
                let total = ((out.max(1) - 1) * strides[i] + span).saturating_sub(input[i]);
                let small = total / 2;
                if auto == "SAME_UPPER" {
                    pad_begin[i] = small;
                    pad_end[i] = total - small;
                } else {
                    pad_begin[i] = total - small;
                    pad_end[i] = small;
                }
                output[i] = out;
            }
            "VALID" => {
                output[i] = if input[i] >= span {
                    (input[i] - span) / strides[i] + 1
                } else {
                    0
                };
            }
            "NOTSET" | "" => {
                if let Some(p) = a.pads {
                    if p.len() != 2 * n || p.iter().any(|&x| x < 0) {
                        return Err(cx.invalid(format!(
                            "pads {p:?} must have {} non-negative entries",
                            2 * n
                        )));
                    }
                    pad_begin[i] = p[i] as usize;
                    pad_end[i] = p[i + n] as usize;
                }
                let padded = input[i] + pad_begin[i] + pad_end[i];
                output[i] = if padded < span {
                    0
                } else if a.ceil_mode {
                    let mut o = (padded - span).div_ceil(strides[i]) + 1;
                    if (o - 1) * strides[i] >= input[i] + pad_begin[i] {
                        o -= 1;
                    }
                    o
                } else {
                    (padded - span) / strides[i] + 1
                };
            }
            other => return Err(cx.invalid(format!("unknown auto_pad '{other}'"))),
        }
    }
    Ok(Geometry {
        input: input.to_vec(),
        kernel,
        strides,
        dilations,
        pad_begin,
        pad_end,
        output,
    })
}

/// Elements of the im2col buffer filled at a time (1 MiB of f32): one band of output rows, so
/// the buffer is still in cache when the GEMM reads it.
const BAND_ELEMS: usize = 1 << 18;

/// The outputs `j0..j1` (of `ow`) whose input position `j · stride + off` lies inside a row of
/// `iw` (the others read padding).
fn valid_span(off: isize, stride: usize, iw: usize, ow: usize) -> (usize, usize) {
    let j0 = if off >= 0 {
        0
    } else {
        off.unsigned_abs().div_ceil(stride).min(ow)
    };
    let j1 = if (iw as isize) > off {
        ((iw as isize - off) as usize)
            .div_ceil(stride)
            .clamp(j0, ow)
    } else {
        j0
    };
    (j0, j1)
}

/// Fills `col[(c, k...), out...]` from one image `x[c, in...]` of `channels` channels, for the
/// output positions of the outer (all but the last) output index range `band` only: `col` holds
/// `band.len() · ow` columns.
fn im2col<T: Real>(
    x: &[T],
    channels: usize,
    g: &Geometry,
    band: std::ops::Range<usize>,
    col: &mut [T],
) {
    let nd = g.input.len();
    let in_size: usize = g.input.iter().product();
    let ksize: usize = g.kernel.iter().product();
    let last = nd - 1;
    let (ow, iw) = (g.output[last], g.input[last]);
    let out_size = band.len() * ow;
    let (sw, dw, pw) = (
        g.strides[last],
        g.dilations[last],
        g.pad_begin[last] as isize,
    );
    let mut kidx = vec![0usize; nd];
    let mut oidx = vec![0usize; nd];
    for c in 0..channels {
        let xc = &x[c * in_size..(c + 1) * in_size];
        for kk in 0..ksize {
            // Kernel multi-index.
            let mut r = kk;
            for d in (0..nd).rev() {
                kidx[d] = r % g.kernel[d];
                r /= g.kernel[d];
            }
            let row = &mut col[(c * ksize + kk) * out_size..(c * ksize + kk + 1) * out_size];
            let kw_off = (kidx[last] * dw) as isize - pw;
            for (i, o) in band.clone().enumerate() {
                let mut r = o;
                for d in (0..last).rev() {
                    oidx[d] = r % g.output[d];
                    r /= g.output[d];
                }
                let seg = &mut row[i * ow..(i + 1) * ow];
                // Input offset of the outer dims, or None when in padding.
                let mut base = 0usize;
                let mut inside = true;
                for d in 0..last {
                    let p = (oidx[d] * g.strides[d] + kidx[d] * g.dilations[d]) as isize
                        - g.pad_begin[d] as isize;
                    if p < 0 || p >= g.input[d] as isize {
                        inside = false;
                        break;
                    }
                    base = base * g.input[d] + p as usize;
                }
                if !inside {
                    seg.fill(T::ZERO);
                    continue;
                }
                let xrow = &xc[base * iw..(base + 1) * iw];
                // The rest of the row is padding.
                let (j0, j1) = valid_span(kw_off, sw, iw, ow);
                seg[..j0].fill(T::ZERO);
                seg[j1..].fill(T::ZERO);
                let start = (j0 * sw) as isize + kw_off;
                if j1 > j0 {
                    let start = start as usize;
                    strided_copy(&xrow[start..], sw, &mut seg[j0..j1]);
                }
            }
        }
    }
}

/// [`im2col`] for two spatial dims, the common case: the kernel row's valid span and the input
/// row of each output row computed once, not through a multi-index per output row.
fn im2col_2d<T: Real>(
    x: &[T],
    channels: usize,
    g: &Geometry,
    band: std::ops::Range<usize>,
    col: &mut [T],
) {
    let (ih, iw) = (g.input[0], g.input[1]);
    let ow = g.output[1];
    let (kh, kw) = (g.kernel[0], g.kernel[1]);
    let (sh, sw) = (g.strides[0], g.strides[1]);
    let (dh, dw) = (g.dilations[0], g.dilations[1]);
    let (ph, pw) = (g.pad_begin[0] as isize, g.pad_begin[1] as isize);
    let out_size = band.len() * ow;
    let mut rows = col.chunks_exact_mut(out_size.max(1));
    for xc in x.chunks_exact(ih * iw).take(channels) {
        for a in 0..kh {
            for b in 0..kw {
                let Some(row) = rows.next() else { return };
                let off = (b * dw) as isize - pw;
                let (j0, j1) = valid_span(off, sw, iw, ow);
                let start = (j0 * sw) as isize + off;
                for (seg, o) in row.chunks_exact_mut(ow).zip(band.clone()) {
                    let p = (o * sh + a * dh) as isize - ph;
                    if p < 0 || p >= ih as isize || j1 == j0 {
                        seg.fill(T::ZERO);
                        continue;
                    }
                    seg[..j0].fill(T::ZERO);
                    seg[j1..].fill(T::ZERO);
                    let src = &xc[p as usize * iw + start as usize..];
                    let dst = &mut seg[j0..j1];
                    strided_copy(src, sw, dst);
                }
            }
        }
    }
}

/// `dst[j] = src[j · stride]`, with the common strides as fixed-step loops the compiler
/// vectorizes.
fn strided_copy<T: Real>(src: &[T], stride: usize, dst: &mut [T]) {
    let n = dst.len();
    if n == 0 {
        return;
    }
    let src = &src[..(n - 1) * stride + 1];
    match stride {
        1 => dst.copy_from_slice(src),
        2 => {
            let (head, last) = dst.split_at_mut(n - 1);
            for (d, s) in head.iter_mut().zip(src.chunks_exact(2)) {
                *d = s[0];
            }
            last[0] = src[(n - 1) * 2];
        }
        _ => {
            for (d, s) in dst.iter_mut().zip(src.iter().step_by(stride)) {
                *d = *s;
            }
        }
    }
}

/// Scatter-adds `col[(m, k...), in...]` into one image `y[m, out...]` (ConvTranspose); here
/// `g.input` is the transposed conv's input and `g.output` its output.
fn col2im<T: Real>(col: &[T], channels: usize, g: &Geometry, y: &mut [T]) {
    let nd = g.input.len();
    let in_size: usize = g.input.iter().product();
    let out_size: usize = g.output.iter().product();
    let ksize: usize = g.kernel.iter().product();
    let mut kidx = vec![0usize; nd];
    let mut iidx = vec![0usize; nd];
    for c in 0..channels {
        let yc = &mut y[c * out_size..(c + 1) * out_size];
        for kk in 0..ksize {
            let mut r = kk;
            for d in (0..nd).rev() {
                kidx[d] = r % g.kernel[d];
                r /= g.kernel[d];
            }
            let row = &col[(c * ksize + kk) * in_size..(c * ksize + kk + 1) * in_size];
            for (i, &v) in row.iter().enumerate() {
                let mut r = i;
                for d in (0..nd).rev() {
                    iidx[d] = r % g.input[d];
                    r /= g.input[d];
                }
                let mut off = 0usize;
                let mut inside = true;
                for d in 0..nd {
                    let p = (iidx[d] * g.strides[d] + kidx[d] * g.dilations[d]) as isize
                        - g.pad_begin[d] as isize;
                    if p < 0 || p >= g.output[d] as isize {
                        inside = false;
                        break;
                    }
                    off = off * g.output[d] + p as usize;
                }
                if inside {
                    yc[off] += v;
                }
            }
        }
    }
}

fn attrs_of(op: &Op) -> Option<(WindowAttrs<'_>, i64)> {
    match op {
        Op::Conv {
            auto_pad,
            dilations,
            group,
            kernel_shape,
            pads,
            strides,
        }
        | Op::ConvInteger {
            auto_pad,
            dilations,
            group,
            kernel_shape,
            pads,
            strides,
        }
        | Op::QLinearConv {
            auto_pad,
            dilations,
            group,
            kernel_shape,
            pads,
            strides,
        }
        | Op::ConvTranspose {
            auto_pad,
            dilations,
            group,
            kernel_shape,
            pads,
            strides,
            ..
        } => Some((
            WindowAttrs {
                auto_pad: auto_pad.as_deref(),
                dilations: dilations.as_deref(),
                kernel_shape: kernel_shape.as_deref(),
                pads: pads.as_deref(),
                strides: strides.as_deref(),
                ceil_mode: false,
            },
            group.unwrap_or(1),
        )),
        _ => None,
    }
}

/// Validated shapes of a convolution: (batch, in channels, out channels, group, geometry).
pub(crate) struct ConvShape {
    pub n: usize,
    pub c: usize,
    pub m: usize,
    pub group: usize,
    pub geo: Geometry,
}

/// Checks X `[N, C, ...]` and W `[M, C/group, k...]` and computes the geometry.
pub(crate) fn conv_shape(
    cx: &OpCtx<'_>,
    xs: &[usize],
    ws: &[usize],
) -> Result<ConvShape, KernelError> {
    let (a, group) = attrs_of(&cx.node.op).ok_or_else(|| cx.invalid("not a convolution"))?;
    if xs.len() < 3 || ws.len() != xs.len() {
        return Err(cx.invalid(format!(
            "X {xs:?} and W {ws:?} must have the same rank, at least 3"
        )));
    }
    if group < 1 {
        return Err(cx.invalid(format!("group {group} must be positive")));
    }
    let group = group as usize;
    let (n, c, m) = (xs[0], xs[1], ws[0]);
    if c % group != 0 || m % group != 0 || ws[1] * group != c {
        return Err(cx.invalid(format!("X {xs:?} and W {ws:?} do not fit group {group}")));
    }
    let geo = geometry(cx, &a, &xs[2..], Some(&ws[2..]))?;
    if geo.kernel != ws[2..] {
        return Err(cx.invalid(format!(
            "kernel_shape {:?} differs from W {ws:?}",
            geo.kernel
        )));
    }
    Ok(ConvShape {
        n,
        c,
        m,
        group,
        geo,
    })
}

/// `g` without the spatial dims that change nothing (input, kernel and output 1, no padding),
/// so that a `[5, 1]` kernel over `[L, 1]` runs as the 1-D convolution it is. One dim is kept.
fn squeeze_unit_dims(g: &Geometry) -> Geometry {
    let keep: Vec<usize> = (0..g.input.len())
        .filter(|&d| {
            !(g.input[d] == 1
                && g.kernel[d] == 1
                && g.output[d] == 1
                && g.pad_begin[d] == 0
                && g.pad_end[d] == 0)
        })
        .collect();
    let keep = if keep.is_empty() { vec![0] } else { keep };
    let pick = |v: &[usize]| keep.iter().map(|&d| v[d]).collect::<Vec<_>>();
    Geometry {
        input: pick(&g.input),
        kernel: pick(&g.kernel),
        strides: pick(&g.strides),
        dilations: pick(&g.dilations),
        pad_begin: pick(&g.pad_begin),
        pad_end: pick(&g.pad_end),
        output: pick(&g.output),
    }
}

/// One output plane of a 2-D convolution over one input plane `x` with the taps `w`
/// (`kh × kw`): each output sums its taps in kernel order (`y` starts at zero).
fn depthwise_2d<T: Real>(x: &[T], w: &[T], g: &Geometry, y: &mut [T]) {
    let (ih, iw) = (g.input[0], g.input[1]);
    let (oh, ow) = (g.output[0], g.output[1]);
    let (kh, kw) = (g.kernel[0], g.kernel[1]);
    let (sh, sw) = (g.strides[0], g.strides[1]);
    let (dh, dw) = (g.dilations[0], g.dilations[1]);
    let (ph, pw) = (g.pad_begin[0] as isize, g.pad_begin[1] as isize);
    y.fill(T::ZERO);
    for (r, yrow) in y.chunks_mut(ow).enumerate().take(oh) {
        for a in 0..kh {
            let p = (r * sh + a * dh) as isize - ph;
            if p < 0 || p >= ih as isize {
                continue;
            }
            let xrow = &x[p as usize * iw..(p as usize + 1) * iw];
            for b in 0..kw {
                let wv = w[a * kw + b];
                let off = (b * dw) as isize - pw;
                let (j0, j1) = valid_span(off, sw, iw, ow);
                if j1 == j0 {
                    continue;
                }
                let start = (j0 * sw) as isize + off;
                let src = &xrow[start as usize..];
                let dst = &mut yrow[j0..j1];
                if sw == 1 {
                    dst.iter_mut().zip(src).for_each(|(o, &v)| *o += wv * v);
                } else {
                    dst.iter_mut()
                        .zip(src.iter().step_by(sw))
                        .for_each(|(o, &v)| *o += wv * v);
                }
            }
        }
    }
}

/// The fewest multiply-adds of a convolution whose output columns [`conv_compute`] splits
/// among threads: below it (a sixth of a millisecond on one core) waking the other threads
/// costs more than they save.
const SPLIT_MIN_MACS: usize = 1 << 24;

/// The fewest output columns of a piece of a band computed on its own thread
/// ([`conv_compute`]).
const SPLIT_MIN_COLS: usize = 256;

/// Output columns up to which [`weights_times`] takes dot products of W's rows and the
/// columns of B instead of a GEMM: packing W for a GEMM over a few columns costs more than the
/// products (silero-vad's 1-D convolutions: 258 × 256 × 4, 64 × 128 × 2, …).
const DOT_MAX_COLS: usize = 8;

/// `y[i, j] = Σ_p w[i, p] · b[p, j]` for `i < m`, `j < n`: `w` is `m × k` (row-major), row
/// `p` of `b` starts at `p · ldb`, row `i` of `y` at `i · ystride`.
#[allow(clippy::too_many_arguments, reason = "a GEMM's operands and layout")]
fn weights_times<T: Real>(
    m: usize,
    k: usize,
    n: usize,
    w: &[T],
    b: &[T],
    ldb: usize,
    y: &mut [T],
    ystride: usize,
) {
    if n > DOT_MAX_COLS {
        gemm(
            m,
            k,
            n,
            T::ONE,
            w,
            (k, 1),
            b,
            (ldb, 1),
            T::ZERO,
            y,
            (ystride, 1),
        );
        return;
    }
    // B's columns as contiguous rows, then one dot product per output.
    let mut bt = vec![T::ZERO; n * k];
    for p in 0..k {
        for (j, &v) in b[p * ldb..p * ldb + n].iter().enumerate() {
            bt[j * k + p] = v;
        }
    }
    for (i, wrow) in w.chunks_exact(k.max(1)).enumerate().take(m) {
        let yrow = &mut y[i * ystride..i * ystride + n];
        for (j, o) in yrow.iter_mut().enumerate() {
            *o = dot(wrow, &bt[j * k..(j + 1) * k]);
        }
    }
}

/// `a · b` over eight partial sums (they vectorize), then the rest in order.
fn dot<T: Real>(a: &[T], b: &[T]) -> T {
    let mut acc = [T::ZERO; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s = acc.iter().fold(T::ZERO, |s, &v| s + v);
    for (&x, &y) in ar.iter().zip(br) {
        s += x * y;
    }
    s
}

/// Runs a convolution on typed data: `y[n, m, out...]` (bias added when given).
pub(crate) fn conv_compute<T: Real>(s: &ConvShape, x: &[T], w: &[T], bias: Option<&[T]>) -> Vec<T> {
    let g = &squeeze_unit_dims(&s.geo);
    let in_size: usize = g.input.iter().product();
    let out_size: usize = g.output.iter().product();
    let ksize: usize = g.kernel.iter().product();
    let (cg, mg) = (s.c / s.group, s.m / s.group);
    let kdim = cg * ksize;
    let mut y = vec![T::ZERO; s.n * s.m * out_size];
    if y.is_empty() {
        return y;
    }
    let pointwise = ksize == 1
        && g.strides.iter().all(|&v| v == 1)
        && g.pad_begin.iter().chain(&g.pad_end).all(|&p| p == 0);
    // One input channel per group: taps accumulate straight into the output planes.
    let depthwise = cg == 1 && g.input.len() == 2;
    let flops = s.n * s.m * out_size * kdim;
    // Fewer images × groups than threads: each one's output is split among them (a batch-1
    // detector's convolutions would otherwise run on one core).
    let threads = rayon::current_num_threads();
    let split = threads > 1 && s.n * s.group < threads && flops >= SPLIT_MIN_MACS;
    // The output columns computed at a time: bands of whole output rows whose im2col stays in
    // cache (all columns at once for a pointwise convolution); when split, each band cut into
    // pieces for two per thread. A band of at most `DOT_MAX_COLS` columns takes dot products
    // instead of the GEMM, so a band is only cut into pieces wider than that: every output is
    // computed as it is without the split, bit for bit.
    let ow = if pointwise {
        1
    } else {
        *g.output.last().unwrap_or(&1)
    };
    let outer = out_size / ow.max(1);
    let rows = if pointwise {
        outer
    } else {
        (BAND_ELEMS / (kdim * ow).max(1)).clamp(1, outer.max(1))
    };
    let mut bands: Vec<(usize, usize)> = (0..outer)
        .step_by(rows.max(1))
        .map(|r0| (r0, (r0 + rows).min(outer)))
        .collect();
    // Split among threads by output channels (W's rows: each thread packs the band's im2col
    // again) when W has more rows than a band has columns, else by columns (each packs W
    // again) when that makes several pieces, else by channels when there are enough of them.
    let channels_ok = mg >= 32 * threads;
    let mut by_channels =
        split && channels_ok && mg >= bands.first().map_or(0, |b| (b.1 - b.0) * ow);
    let mut by_columns = false;
    if split && !by_channels {
        let pieces = (2 * threads).div_ceil(bands.len().max(1));
        // Pieces of at least `SPLIT_MIN_COLS` columns: each packs all of W again.
        let min_rows = (DOT_MAX_COLS / ow.max(1) + 1).max(SPLIT_MIN_COLS.div_ceil(ow.max(1)));
        let cut: Vec<(usize, usize)> = bands
            .iter()
            .flat_map(|&(r0, r1)| {
                let len = r1 - r0;
                let p = if len * ow > DOT_MAX_COLS {
                    pieces.min(len / min_rows).max(1)
                } else {
                    1
                };
                (0..p).map(move |i| (r0 + i * len / p, r0 + (i + 1) * len / p))
            })
            .collect();
        if cut.len() >= 2 {
            bands = cut;
            by_columns = true;
        } else {
            by_channels = channels_ok;
        }
    }
    let bands: Vec<(usize, usize)> = bands.iter().map(|&(a, b)| (a * ow, b * ow)).collect();
    // B of output columns `c0..c1` of image and group `xg` (the input itself for a pointwise
    // convolution, else their im2col in `col`) and its row stride.
    let matrix = |xg: &'_ [T], (c0, c1): (usize, usize), col: &mut Vec<T>| -> usize {
        if pointwise {
            return out_size;
        }
        let cols = c1 - c0;
        col.resize(kdim * cols, T::ZERO);
        let rows = c0 / ow..c1 / ow;
        if g.input.len() == 2 {
            im2col_2d(xg, cg, g, rows, &mut col[..kdim * cols]);
        } else {
            im2col(xg, cg, g, rows, &mut col[..kdim * cols]);
        }
        cols
    };
    // Output columns `c0..c1` of image and group `xg`, `wg`, into `out` (row stride `ld`).
    let band = |xg: &[T],
                wg: &[T],
                (c0, c1): (usize, usize),
                out: &mut [T],
                ld: usize,
                col: &mut Vec<T>| {
        let ldb = matrix(xg, (c0, c1), col);
        let b = if pointwise { &xg[c0..] } else { &col[..] };
        weights_times(mg, kdim, c1 - c0, wg, b, ldb, out, ld);
    };
    let work = |(ng, yg): (usize, &mut [T]), col: &mut Vec<T>| {
        let (img, grp) = (ng / s.group, ng % s.group);
        let xg = &x[(img * s.c + grp * cg) * in_size..(img * s.c + (grp + 1) * cg) * in_size];
        let wg = &w[grp * mg * kdim..(grp + 1) * mg * kdim];
        if depthwise {
            let plane =
                |(j, yo): (usize, &mut [T])| depthwise_2d(xg, &wg[j * kdim..(j + 1) * kdim], g, yo);
            if split {
                yg.par_chunks_mut(out_size).enumerate().for_each(plane);
            } else {
                yg.chunks_mut(out_size).enumerate().for_each(plane);
            }
        } else if by_channels {
            // Each band's B once, then W's rows in pieces of whole panels, in parallel.
            let rows = mg.div_ceil(2 * threads).next_multiple_of(16);
            T::with_scratch(|col| {
                for &(c0, c1) in &bands {
                    let cols = c1 - c0;
                    let ldb = matrix(xg, (c0, c1), col);
                    let b = if pointwise { &xg[c0..] } else { &col[..] };
                    yg.par_chunks_mut(rows * out_size)
                        .zip(wg.par_chunks(rows * kdim))
                        .for_each(|(yr, wr)| {
                            let r = yr.len() / out_size;
                            weights_times(r, kdim, cols, wr, b, ldb, &mut yr[c0..], out_size);
                        });
                }
            });
        } else if by_columns {
            // Each band into its own buffer, in parallel, then into place.
            let outs: Vec<Vec<T>> = bands
                .par_iter()
                .map(|&(c0, c1)| {
                    let mut out = vec![T::ZERO; mg * (c1 - c0)];
                    T::with_scratch(|col| band(xg, wg, (c0, c1), &mut out, c1 - c0, col));
                    out
                })
                .collect();
            for (&(c0, c1), out) in bands.iter().zip(&outs) {
                for (j, row) in out.chunks_exact(c1 - c0).enumerate() {
                    yg[j * out_size + c0..j * out_size + c1].copy_from_slice(row);
                }
            }
        } else {
            for &(c0, c1) in &bands {
                band(xg, wg, (c0, c1), &mut yg[c0..], out_size, col);
            }
        }
        if let Some(bias) = bias {
            for (j, row) in yg.chunks_mut(out_size).enumerate() {
                let bv = bias[grp * mg + j];
                row.iter_mut().for_each(|v| *v += bv);
            }
        }
    };
    let chunk = mg * out_size;
    // The im2col band lives in the thread's scratch vector: `resize` zero-fills only what
    // grows, and `im2col` writes every element of the band.
    let work = |item, col: &mut Vec<T>| {
        work(item, col);
        if col.capacity() > 4 * BAND_ELEMS {
            // A band of one very wide output row: not kept.
            *col = Vec::new();
        }
    };
    let within = split && (depthwise || by_channels || by_columns);
    if s.n * s.group > 1 && flops >= 1 << 20 && !within {
        y.par_chunks_mut(chunk)
            .enumerate()
            .for_each(|item| T::with_scratch(|col| work(item, col)));
    } else if within {
        // The bands take the threads' scratch vectors.
        y.chunks_mut(chunk)
            .enumerate()
            .for_each(|item| work(item, &mut Vec::new()));
    } else {
        T::with_scratch(|col| {
            y.chunks_mut(chunk)
                .enumerate()
                .for_each(|item| work(item, col))
        });
    }
    y
}

fn conv_float<T: Real>(
    cx: &OpCtx<'_>,
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
) -> Result<Tensor, KernelError> {
    let s = conv_shape(cx, &x.shape, &w.shape)?;
    let xv = T::load(x)?;
    let wv = T::load(w)?;
    let bv = match b {
        Some(b) => {
            if b.shape != [s.m] {
                return Err(cx.invalid(format!("B {:?} must be [{}]", b.shape, s.m)));
            }
            Some(T::load(b)?)
        }
        None => None,
    };
    let y = conv_compute(&s, &xv, &wv, bv.as_deref());
    let mut shape = vec![s.n, s.m];
    shape.extend(&s.geo.output);
    T::store(x.dtype, shape, y)
}

/// Conv.
pub(super) fn conv_op(cx: &OpCtx<'_>, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let w = tensor(cx, inputs, 1)?;
    let b = opt_tensor(inputs, 2);
    if !is_float(x.dtype) || w.dtype != x.dtype {
        return Err(cx.unsupported(format!("Conv on {} and {}", x.dtype, w.dtype)));
    }
    let y = by_real!(x.dtype, conv_float(cx, x, w, b.map(|b| &**b)))?;
    Ok(vec![Some(y.into())])
}

fn conv_transpose_float<T: Real>(
    cx: &OpCtx<'_>,
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
) -> Result<Tensor, KernelError> {
    let Op::ConvTranspose {
        auto_pad,
        dilations,
        group,
        kernel_shape,
        output_padding,
        output_shape,
        pads,
        strides,
    } = &cx.node.op
    else {
        return Err(cx.invalid("not a ConvTranspose"));
    };
    let (xs, ws) = (&x.shape, &w.shape);
    if xs.len() < 3 || ws.len() != xs.len() {
        return Err(cx.invalid(format!(
            "X {xs:?} and W {ws:?} must have the same rank, at least 3"
        )));
    }
    let nd = xs.len() - 2;
    let group = group.unwrap_or(1);
    if group < 1 || xs[1] % group as usize != 0 || ws[0] != xs[1] {
        return Err(cx.invalid(format!("X {xs:?} and W {ws:?} do not fit group {group}")));
    }
    let group = group as usize;
    let (n, c) = (xs[0], xs[1]);
    let m = ws[1] * group;
    let input = xs[2..].to_vec();
    let kernel = match kernel_shape {
        Some(k) => positive(cx, "kernel_shape", Some(k), nd)?,
        None => ws[2..].to_vec(),
    };
    if kernel != ws[2..] {
        return Err(cx.invalid(format!("kernel_shape {kernel:?} differs from W {ws:?}")));
    }
    let strides = positive(cx, "strides", strides.as_deref(), nd)?;
    let dilations = positive(cx, "dilations", dilations.as_deref(), nd)?;
    let opad: Vec<i64> = match output_padding {
        Some(p) if p.len() >= nd => p[..nd].to_vec(),
        Some(p) => return Err(cx.invalid(format!("output_padding {p:?} has the wrong length"))),
        None => vec![0; nd],
    };
    let auto = auto_pad.as_deref().unwrap_or("NOTSET");
    let span = |i: usize| ((kernel[i] - 1) * dilations[i] + 1) as i64;
    let full = |i: usize| strides[i] as i64 * (input[i] as i64 - 1) + opad[i] + span(i);
    let explicit = match pads {
        Some(p) if !matches!(auto, "SAME_UPPER" | "SAME_LOWER") => {
            if p.len() != 2 * nd {
                return Err(cx.invalid(format!("pads {p:?} must have {} entries", 2 * nd)));
            }
            Some(p.clone())
        }
        None if !matches!(auto, "SAME_UPPER" | "SAME_LOWER") && output_shape.is_none() => {
            Some(vec![0; 2 * nd])
        }
        _ => None,
    };
    let (pb, pe, out): (Vec<i64>, Vec<i64>, Vec<i64>) = match explicit {
        Some(p) => {
            let out: Vec<i64> = match output_shape {
                Some(os) => os[os.len().saturating_sub(nd)..].to_vec(),
                None => (0..nd).map(|i| full(i) - p[i] - p[i + nd]).collect(),
            };
            (p[..nd].to_vec(), p[nd..].to_vec(), out)
        }
        None => {
            let out: Vec<i64> = match output_shape {
                Some(os) => os[os.len().saturating_sub(nd)..].to_vec(),
                None => (0..nd)
                    .map(|i| input[i] as i64 * strides[i] as i64)
                    .collect(),
            };
            if out.len() != nd {
                return Err(cx.invalid("output_shape has the wrong length"));
            }
            let mut pb = vec![0; nd];
            let mut pe = vec![0; nd];
            for i in 0..nd {
                let total = full(i) - out[i];
                let half = total.div_euclid(2);
                if auto == "SAME_UPPER" {
                    pb[i] = half;
                    pe[i] = total - half;
                } else {
                    pb[i] = total - half;
                    pe[i] = half;
                }
            }
            (pb, pe, out)
        }
    };
    // A negative end padding only means output positions that no input reaches.
    if out.len() != nd || out.iter().any(|&o| o < 0) || pb.iter().any(|&p| p < 0) {
        return Err(cx.invalid(format!(
            "output shape {out:?} / pads {pb:?}+{pe:?} are invalid"
        )));
    }
    let geo = Geometry {
        input,
        kernel,
        strides,
        dilations,
        pad_begin: pb.iter().map(|&p| p as usize).collect(),
        pad_end: pe.iter().map(|&p| p.max(0) as usize).collect(),
        output: out.iter().map(|&o| o as usize).collect(),
    };
    let xv = T::load(x)?;
    let wv = T::load(w)?;
    let bv = match b {
        Some(b) if b.shape != [m] => {
            return Err(cx.invalid(format!("B {:?} must be [{m}]", b.shape)));
        }
        Some(b) => Some(T::load(b)?),
        None => None,
    };
    let in_size: usize = geo.input.iter().product();
    let out_size: usize = geo.output.iter().product();
    let ksize: usize = geo.kernel.iter().product();
    let (cg, mg) = (c / group, m / group);
    let rows = mg * ksize;
    let mut y = vec![T::ZERO; n * m * out_size];
    if !y.is_empty() {
        let work = |(ng, yg): (usize, &mut [T]), col: &mut Vec<T>| {
            let (img, grp) = (ng / group, ng % group);
            let xg = &xv[(img * c + grp * cg) * in_size..(img * c + (grp + 1) * cg) * in_size];
            let wg = &wv[grp * cg * rows..(grp + 1) * cg * rows];
            col.resize(rows * in_size, T::ZERO);
            // col[rows, in] = Wg^T [rows, cg] · Xg [cg, in]
            gemm(
                rows,
                cg,
                in_size,
                T::ONE,
                wg,
                (1, rows),
                xg,
                (in_size, 1),
                T::ZERO,
                col,
                (in_size, 1),
            );
            col2im(col, mg, &geo, yg);
            if let Some(bias) = &bv {
                for (j, row) in yg.chunks_mut(out_size).enumerate() {
                    let b = bias[grp * mg + j];
                    row.iter_mut().for_each(|v| *v += b);
                }
            }
        };
        if n * group > 1 && n * m * in_size * ksize * cg >= 1 << 20 {
            y.par_chunks_mut(mg * out_size)
                .enumerate()
                .for_each_init(Vec::new, |col, item| work(item, col));
        } else {
            let mut col = Vec::new();
            y.chunks_mut((mg * out_size).max(1))
                .enumerate()
                .for_each(|item| work(item, &mut col));
        }
    }
    let mut shape = vec![n, m];
    shape.extend(&geo.output);
    T::store(x.dtype, shape, y)
}

/// ConvTranspose.
pub(super) fn conv_transpose_op(cx: &OpCtx<'_>, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let w = tensor(cx, inputs, 1)?;
    let b = opt_tensor(inputs, 2);
    if !is_float(x.dtype) || w.dtype != x.dtype {
        return Err(cx.unsupported(format!("ConvTranspose on {} and {}", x.dtype, w.dtype)));
    }
    let y = by_real!(x.dtype, conv_transpose_float(cx, x, w, b.map(|b| &**b)))?;
    Ok(vec![Some(y.into())])
}

#[cfg(test)]
mod tests {
    use super::super::tests::{close, f32t, out, run_op};
    use mmq_ir::Op;

    fn conv(pads: Option<Vec<i64>>, strides: Option<Vec<i64>>, auto_pad: Option<&str>) -> Op {
        Op::Conv {
            auto_pad: auto_pad.map(str::to_owned),
            dilations: None,
            group: None,
            kernel_shape: None,
            pads,
            strides,
        }
    }

    #[test]
    fn conv_2d_padded_and_strided() {
        // ONNX doc example: 5x5 input 0..25, 3x3 ones kernel.
        let x: Vec<f32> = (0..25).map(|v| v as f32).collect();
        let w = [1.0f32; 9];
        let r = run_op(
            conv(Some(vec![1, 1, 1, 1]), None, None),
            vec![f32t(&[1, 1, 5, 5], &x), f32t(&[1, 1, 3, 3], &w)],
            1,
            11,
        )
        .expect("run");
        let (s, v) = out(&r, 0);
        assert_eq!(s, vec![1, 1, 5, 5]);
        assert_eq!(&v[..5], &[12.0, 21.0, 27.0, 33.0, 24.0]);
        assert_eq!(v[12], 108.0);
        let r = run_op(
            conv(Some(vec![1, 0, 1, 0]), Some(vec![2, 2]), None),
            vec![f32t(&[1, 1, 5, 5], &x), f32t(&[1, 1, 3, 3], &w)],
            1,
            11,
        )
        .expect("run");
        let (s, v) = out(&r, 0);
        assert_eq!(s, vec![1, 1, 3, 2]);
        assert_eq!(v, vec![21.0, 33.0, 99.0, 117.0, 111.0, 123.0]);
        // SAME_LOWER on 5x5 stride 2 → 3x3 with pads 1 before.
        let r = run_op(
            conv(None, Some(vec![2, 2]), Some("SAME_LOWER")),
            vec![f32t(&[1, 1, 5, 5], &x), f32t(&[1, 1, 3, 3], &w)],
            1,
            11,
        )
        .expect("run");
        let (s, v) = out(&r, 0);
        assert_eq!(s, vec![1, 1, 3, 3]);
        assert_eq!(&v[..3], &[12.0, 27.0, 24.0]);
    }

    /// The direct 2-D convolution by its definition (f64), for comparison.
    #[allow(
        clippy::too_many_arguments,
        reason = "the geometry of one test convolution"
    )]
    fn reference_2d(
        x: &[f32],
        (n, c, h, w): (usize, usize, usize, usize),
        wt: &[f32],
        (m, kh, kw): (usize, usize, usize),
        group: usize,
        (sh, sw): (usize, usize),
        (dh, dw): (usize, usize),
        (pt, pl, pb, pr): (usize, usize, usize, usize),
    ) -> (Vec<usize>, Vec<f64>) {
        let oh = (h + pt + pb - (dh * (kh - 1) + 1)) / sh + 1;
        let ow = (w + pl + pr - (dw * (kw - 1) + 1)) / sw + 1;
        let (cg, mg) = (c / group, m / group);
        let mut y = vec![0f64; n * m * oh * ow];
        for b in 0..n {
            for o in 0..m {
                let g = o / mg;
                for i in 0..oh {
                    for j in 0..ow {
                        let mut acc = 0f64;
                        for ci in 0..cg {
                            let ch = g * cg + ci;
                            for a in 0..kh {
                                for bb in 0..kw {
                                    let (p, q) = (
                                        (i * sh + a * dh) as isize - pt as isize,
                                        (j * sw + bb * dw) as isize - pl as isize,
                                    );
                                    if p < 0 || q < 0 || p >= h as isize || q >= w as isize {
                                        continue;
                                    }
                                    let xv = x[((b * c + ch) * h + p as usize) * w + q as usize];
                                    let wv = wt[((o * cg + ci) * kh + a) * kw + bb];
                                    acc += f64::from(xv) * f64::from(wv);
                                }
                            }
                        }
                        y[((b * m + o) * oh + i) * ow + j] = acc;
                    }
                }
            }
        }
        (vec![n, m, oh, ow], y)
    }

    /// Depthwise (with a channel multiplier), dilated, strided and asymmetrically padded
    /// convolutions, a `[5, 1]` kernel over `[L, 1]`, and a dense strided one, against the
    /// definition.
    #[test]
    fn direct_paths_match_the_definition() {
        let vals = |len: usize, seed: u32| -> Vec<f32> {
            (0..len)
                .map(|i| ((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 97)
                .map(|v| v as f32 / 16.0 - 3.0)
                .collect()
        };
        // (x dims, m, kernel, group, strides, dilations, pads)
        let cases = [
            ((2, 4, 9, 11), 8, (3, 3), 4, (1, 1), (1, 1), (1, 1, 1, 1)),
            ((1, 3, 10, 7), 3, (3, 3), 3, (2, 2), (1, 1), (1, 0, 2, 1)),
            ((1, 2, 12, 12), 4, (3, 3), 2, (1, 2), (2, 2), (2, 2, 2, 2)),
            ((1, 4, 9, 9), 4, (7, 7), 4, (1, 1), (1, 1), (3, 3, 3, 3)),
            ((1, 6, 17, 1), 4, (5, 1), 1, (1, 1), (1, 1), (0, 0, 0, 0)),
            ((2, 3, 8, 9), 5, (3, 3), 1, (2, 2), (1, 1), (1, 1, 1, 1)),
            // Two channels per group, dilated, uneven strides and pads.
            ((1, 4, 11, 13), 6, (3, 2), 2, (1, 2), (2, 1), (2, 0, 1, 3)),
            // Pads wider than the image: whole rows and columns of padding.
            ((1, 2, 3, 4), 3, (3, 3), 1, (2, 3), (1, 1), (2, 3, 2, 3)),
            // At most `DOT_MAX_COLS` output columns: dot products, not the GEMM (im2col,
            // then pointwise).
            ((1, 5, 9, 1), 6, (3, 1), 1, (2, 1), (1, 1), (1, 0, 1, 0)),
            ((2, 7, 2, 3), 5, (1, 1), 1, (1, 1), (1, 1), (0, 0, 0, 0)),
        ];
        for (xd, m, (kh, kw), group, st, dl, pads) in cases {
            let (n, c, h, w) = xd;
            let x = vals(n * c * h * w, 7);
            let wt = vals(m * (c / group) * kh * kw, 11);
            let op = Op::Conv {
                auto_pad: None,
                dilations: Some(vec![dl.0 as i64, dl.1 as i64]),
                group: Some(group as i64),
                kernel_shape: None,
                pads: Some([pads.0, pads.1, pads.2, pads.3].map(|p| p as i64).to_vec()),
                strides: Some(vec![st.0 as i64, st.1 as i64]),
            };
            let r = run_op(
                op,
                vec![f32t(&[n, c, h, w], &x), f32t(&[m, c / group, kh, kw], &wt)],
                1,
                11,
            )
            .expect("run");
            let (shape, got) = out(&r, 0);
            let (want_shape, want) = reference_2d(&x, xd, &wt, (m, kh, kw), group, st, dl, pads);
            assert_eq!(shape, want_shape, "{xd:?} m {m} k {kh}x{kw} group {group}");
            close(&got, &want, 1e-5);
        }
    }

    /// A batch-1 convolution large enough to be split among threads gives bit for bit what one
    /// thread computes: split by columns (im2col bands of wide and narrow rows, stride 2,
    /// pointwise), by channels (pointwise and 3 × 3), one input channel (the per-plane path)
    /// and two groups (fewer images × groups than threads).
    #[test]
    fn split_among_threads_matches_one_thread() {
        let vals = |len: usize, seed: u32| -> Vec<f32> {
            (0..len as u32)
                .map(|i| (i.wrapping_mul(2_654_435_761) ^ seed) % 1013)
                .map(|v| (v as f32 - 506.0) / 61.0)
                .collect()
        };
        // (x dims, m, kernel, group, stride, pad)
        let cases = [
            ((1, 32, 40, 44), 48, (3, 3), 1, 1, 1),
            ((1, 32, 81, 5), 48, (3, 3), 1, 1, 1),
            ((1, 32, 40, 44), 48, (3, 3), 1, 2, 1),
            ((1, 128, 30, 30), 96, (1, 1), 1, 1, 0),
            ((1, 1, 200, 200), 32, (3, 3), 1, 1, 1),
            ((1, 64, 33, 31), 64, (3, 3), 2, 1, 1),
            // More output channels than columns: split by channels.
            ((1, 384, 10, 10), 768, (1, 1), 1, 1, 0),
            ((1, 128, 12, 12), 256, (3, 3), 1, 1, 1),
        ];
        for (xd, m, (kh, kw), group, st, pad) in cases {
            let (n, c, h, w) = xd;
            let x = vals(n * c * h * w, 7);
            let wt = vals(m * (c / group) * kh * kw, 11);
            let b = vals(m, 13);
            let run = |threads: usize| {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .expect("pool");
                let op = Op::Conv {
                    auto_pad: None,
                    dilations: None,
                    group: Some(group as i64),
                    kernel_shape: None,
                    pads: Some(vec![pad; 4]),
                    strides: Some(vec![st; 2]),
                };
                let inputs = vec![
                    f32t(&[n, c, h, w], &x),
                    f32t(&[m, c / group, kh, kw], &wt),
                    f32t(&[m], &b),
                ];
                let r = pool.install(|| run_op(op, inputs, 1, 11)).expect("run");
                match &r[0]
                    .as_ref()
                    .and_then(|v| v.as_tensor())
                    .expect("tensor")
                    .data
                {
                    crate::tensor::Data::F32(v) => {
                        v.iter().map(|f| f.to_bits()).collect::<Vec<_>>()
                    }
                    d => panic!("{d:?}"),
                }
            };
            assert_eq!(run(1), run(3), "{xd:?} m {m} k {kh}x{kw} group {group}");
        }
    }

    #[test]
    fn conv_groups_bias_and_errors() {
        // Depthwise 1-D: 2 channels, kernel 2, bias.
        let op = Op::Conv {
            auto_pad: None,
            dilations: None,
            group: Some(2),
            kernel_shape: None,
            pads: None,
            strides: None,
        };
        let x = [1.0, 2.0, 3.0, 10.0, 20.0, 30.0];
        let w = [1.0, 1.0, 1.0, -1.0];
        let r = run_op(
            op.clone(),
            vec![
                f32t(&[1, 2, 3], &x),
                f32t(&[2, 1, 2], &w),
                f32t(&[2], &[0.5, 1.0]),
            ],
            1,
            11,
        )
        .expect("run");
        assert_eq!(out(&r, 0), (vec![1, 2, 2], vec![3.5, 5.5, -9.0, -9.0]));
        assert!(
            run_op(
                op,
                vec![f32t(&[1, 2, 3], &x), f32t(&[2, 2, 2], &[0.0; 8])],
                1,
                11
            )
            .is_err()
        );
    }

    #[test]
    fn conv_transpose_basic() {
        // 1-D: x=[1,2,3], w=[1,1,1] → full conv [1,3,6,5,3]; stride 2 → [1,1,3,2,5,3,3].
        let op = |strides: Option<Vec<i64>>| Op::ConvTranspose {
            auto_pad: None,
            dilations: None,
            group: None,
            kernel_shape: None,
            output_padding: None,
            output_shape: None,
            pads: None,
            strides,
        };
        let ins = || {
            vec![
                f32t(&[1, 1, 3], &[1.0, 2.0, 3.0]),
                f32t(&[1, 1, 3], &[1.0, 1.0, 1.0]),
            ]
        };
        let r = run_op(op(None), ins(), 1, 11).expect("run");
        close(&out(&r, 0).1, &[1.0, 3.0, 6.0, 5.0, 3.0], 0.0);
        let r = run_op(op(Some(vec![2])), ins(), 1, 11).expect("run");
        close(&out(&r, 0).1, &[1.0, 1.0, 3.0, 2.0, 5.0, 3.0, 3.0], 0.0);
    }
}
