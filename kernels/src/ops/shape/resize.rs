//! Resize, following the ONNX reference implementation: the interpolation is separable, so it
//! runs one axis at a time over an f64 buffer, each output coordinate mapped back to the input
//! by the coordinate transformation mode and combined from its neighbours with the mode's
//! coefficients (nearest, linear, cubic; antialiased filters widen with the downscale).

use mmq_ir::{DType, Op};

use crate::error::KernelError;
use crate::ops::data::{map_any, norm_axes};
use crate::ops::shape::single;
use crate::ops::util::{opt_tensor, tensor};
use crate::ops::{OpCtx, OpResult};
use crate::tensor::{RtValue, Tensor};

/// The attributes, with ONNX defaults applied.
struct Params<'a> {
    mode: &'a str,
    coord: &'a str,
    nearest: &'a str,
    cubic_a: f64,
    exclude_outside: bool,
    extrapolation: f64,
    antialias: bool,
}

/// How one output coordinate along an axis is computed.
enum Tap {
    /// The extrapolation value (tf_crop_and_resize outside the input).
    Extrapolate,
    /// `Σ coeffs[j] * input[idx[j]]`.
    Weights(Vec<(usize, f64)>),
}

fn nearest_coeffs(ratio: f64, mode: &str) -> Option<Vec<f64>> {
    if ratio.fract() == 0.0 {
        return Some(vec![0.0, 1.0]);
    }
    let b = |c: bool| if c { 1.0 } else { 0.0 };
    Some(match mode {
        "round_prefer_floor" => vec![b(ratio <= 0.5), b(ratio > 0.5)],
        "round_prefer_ceil" => vec![b(ratio < 0.5), b(ratio >= 0.5)],
        "floor" => vec![1.0, 0.0],
        "ceil" => vec![0.0, 1.0],
        _ => return None,
    })
}

fn cubic_coeffs(r: f64, a: f64) -> Vec<f64> {
    let (p, q) = (r + 1.0, 2.0 - r);
    vec![
        ((a * p - 5.0 * a) * p + 8.0 * a) * p - 4.0 * a,
        ((a + 2.0) * r - (a + 3.0)) * r * r + 1.0,
        ((a + 2.0) * (1.0 - r) - (a + 3.0)) * (1.0 - r) * (1.0 - r) + 1.0,
        ((a * q - 5.0 * a) * q + 8.0 * a) * q - 4.0 * a,
    ]
}

fn cubic_coeffs_antialias(r: f64, scale: f64, a: f64) -> Vec<f64> {
    let scale = scale.min(1.0);
    let kernel = |x: f64| {
        let x = x.abs();
        let (x2, x3) = (x * x, x * x * x);
        if x <= 1.0 {
            (a + 2.0) * x3 - (a + 3.0) * x2 + 1.0
        } else if x < 2.0 {
            a * x3 - 5.0 * a * x2 + 8.0 * a * x - 4.0 * a
        } else {
            0.0
        }
    };
    let start = (-2.0 / scale).floor() as i64 + 1;
    let end = 2 - start;
    let c: Vec<f64> = (start..end)
        .map(|i| kernel(scale * (i as f64 - r)))
        .collect();
    normalized(c)
}

fn linear_coeffs_antialias(r: f64, scale: f64) -> Vec<f64> {
    let scale = scale.min(1.0);
    let start = (-1.0 / scale).floor() as i64 + 1;
    let footprint = 2 - 2 * start;
    let c: Vec<f64> = (start..start + footprint)
        .map(|i| (1.0 - ((i as f64 - r) * scale).abs()).clamp(0.0, 1.0))
        .collect();
    normalized(c)
}

fn normalized(c: Vec<f64>) -> Vec<f64> {
    let s: f64 = c.iter().sum();
    c.into_iter().map(|x| x / s).collect()
}

/// The taps of every output coordinate of one axis.
fn taps(
    p: &Params<'_>,
    in_w: usize,
    out_w: usize,
    scale: f64,
    roi: (f64, f64),
) -> Result<Vec<Tap>, String> {
    let iw = in_w as f64;
    let ow = scale * iw;
    let mut out = Vec::with_capacity(out_w);
    for y in 0..out_w {
        let y = y as f64;
        let mut extrapolated = false;
        let x = match p.coord {
            "align_corners" => {
                if ow == 1.0 {
                    0.0
                } else {
                    y * (iw - 1.0) / (ow - 1.0)
                }
            }
            "asymmetric" => y / scale,
            "tf_crop_and_resize" => {
                let x = if ow == 1.0 {
                    (roi.1 - roi.0) * (iw - 1.0) / 2.0
                } else {
                    y * (roi.1 - roi.0) * (iw - 1.0) / (ow - 1.0)
                };
                let x = x + roi.0 * (iw - 1.0);
                extrapolated = x < 0.0 || x > iw - 1.0;
                x
            }
            "pytorch_half_pixel" => {
                if ow == 1.0 {
                    -0.5
                } else {
                    (y + 0.5) / scale - 0.5
                }
            }
            "half_pixel" => (y + 0.5) / scale - 0.5,
            "half_pixel_symmetric" => {
                let adjustment = out_w as f64 / ow;
                let offset = iw / 2.0 * (1.0 - adjustment);
                offset + (y + 0.5) / scale - 0.5
            }
            m => return Err(format!("unknown coordinate_transformation_mode '{m}'")),
        };
        if extrapolated {
            out.push(Tap::Extrapolate);
            continue;
        }
        let ratio = if x.fract() == 0.0 { 1.0 } else { x - x.floor() };
        let mut coeffs = match (p.mode, p.antialias) {
            ("nearest", false) => nearest_coeffs(ratio, p.nearest)
                .ok_or_else(|| format!("unknown nearest_mode '{}'", p.nearest))?,
            ("nearest", true) => return Err("antialias with nearest mode".to_owned()),
            ("linear", false) => vec![1.0 - ratio, ratio],
            ("linear", true) => linear_coeffs_antialias(ratio, scale),
            ("cubic", false) => cubic_coeffs(ratio, p.cubic_a),
            ("cubic", true) => cubic_coeffs_antialias(ratio, scale, p.cubic_a),
            (m, _) => return Err(format!("unknown mode '{m}'")),
        };
        let n = coeffs.len() as i64;
        let pad = (n + 1) / 2;
        let xp = x + pad as f64;
        let pf = xp.floor();
        let frac = xp - pf;
        let offset = if n % 2 == 0 {
            if frac == 0.0 { -(n / 2) } else { -(n / 2) + 1 }
        } else {
            let base = -((n - 1) / 2);
            if frac <= 0.5 { base } else { base + 1 }
        };
        let start = pf as i64 + offset - pad;
        let last = in_w as i64 - 1;
        if p.exclude_outside {
            for (j, c) in coeffs.iter_mut().enumerate() {
                let i = start + j as i64;
                if i < 0 || i > last {
                    *c = 0.0;
                }
            }
            let s: f64 = coeffs.iter().sum();
            let s = if s == 0.0 { 1.0 } else { s };
            coeffs.iter_mut().for_each(|c| *c /= s);
        }
        out.push(Tap::Weights(
            coeffs
                .into_iter()
                .enumerate()
                .map(|(j, c)| ((start + j as i64).clamp(0, last) as usize, c))
                .collect(),
        ));
    }
    Ok(out)
}

/// Resizes axis `a` of `buf` (shape `shape`) to `out_w` with `taps`.
fn apply_axis(
    buf: &[f64],
    shape: &[usize],
    a: usize,
    taps: &[Tap],
    extrapolation: f64,
) -> Vec<f64> {
    let outer: usize = shape[..a].iter().product();
    let in_w = shape[a];
    let inner: usize = shape[a + 1..].iter().product();
    let out_w = taps.len();
    let mut out = vec![0.0; outer * out_w * inner];
    for o in 0..outer {
        let src = &buf[o * in_w * inner..(o + 1) * in_w * inner];
        for (y, tap) in taps.iter().enumerate() {
            let dst = &mut out[(o * out_w + y) * inner..(o * out_w + y + 1) * inner];
            match tap {
                Tap::Extrapolate => dst.fill(extrapolation),
                Tap::Weights(w) => {
                    for &(i, c) in w {
                        let row = &src[i * inner..(i + 1) * inner];
                        for (d, &s) in dst.iter_mut().zip(row) {
                            *d += c * s;
                        }
                    }
                }
            }
        }
    }
    out
}

/// An axis that a resize leaves as it is (scale 1, same size, the whole axis as region).
fn shape_unchanged(scale: f64, out: usize, dim: usize, roi: (f64, f64)) -> bool {
    is_close(scale, 1.0) && out == dim && is_close(roi.0, 0.0) && is_close(roi.1, 1.0)
}

/// The elements of `v` (shape `shape`) at the per-axis source indices `index` (one list per
/// axis, as long as the output axis), row by row.
fn nearest_gather<T: Clone>(v: &[T], shape: &[usize], index: &[Vec<usize>]) -> Vec<T> {
    let r = shape.len();
    let Some((last, lead)) = index.split_last() else {
        return v.to_vec();
    };
    let mut strides = vec![1usize; r];
    for a in (0..r.saturating_sub(1)).rev() {
        strides[a] = strides[a + 1] * shape[a + 1];
    }
    let rows: usize = lead.iter().map(Vec::len).product();
    let mut out = Vec::with_capacity(rows * last.len());
    let mut at = vec![0usize; lead.len()];
    for _ in 0..rows {
        let base: usize = at
            .iter()
            .zip(lead)
            .zip(&strides)
            .map(|((&o, idx), &st)| idx[o] * st)
            .sum();
        out.extend(last.iter().map(|&i| v[base + i].clone()));
        // The next output row (odometer over the leading axes).
        for a in (0..lead.len()).rev() {
            at[a] += 1;
            if at[a] < lead[a].len() {
                break;
            }
            at[a] = 0;
        }
    }
    out
}

fn is_close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
}

/// Converts the f64 result to `dtype` like `saturate_cast`: integers round half to even and
/// clamp, floats clamp to the finite range.
fn saturate(dtype: DType, shape: Vec<usize>, v: Vec<f64>) -> Result<Tensor, KernelError> {
    let (lo, hi, round) = match dtype {
        DType::U8 => (0.0, 255.0, true),
        DType::I8 => (-128.0, 127.0, true),
        DType::U16 => (0.0, 65535.0, true),
        DType::I16 => (-32768.0, 32767.0, true),
        DType::U32 => (0.0, f64::from(u32::MAX), true),
        DType::I32 => (f64::from(i32::MIN), f64::from(i32::MAX), true),
        DType::U64 => (0.0, u64::MAX as f64, true),
        DType::I64 => (i64::MIN as f64, i64::MAX as f64, true),
        DType::F16 => (-65504.0, 65504.0, false),
        DType::BF16 => (
            -f64::from(half::bf16::MAX),
            f64::from(half::bf16::MAX),
            false,
        ),
        DType::F32 => (-f64::from(f32::MAX), f64::from(f32::MAX), false),
        _ => (f64::NEG_INFINITY, f64::INFINITY, false),
    };
    let v: Vec<f64> = v
        .into_iter()
        .map(|x| {
            let x = if round { x.round_ties_even() } else { x };
            if x.is_nan() { x } else { x.clamp(lo, hi) }
        })
        .collect();
    if dtype == DType::F32 {
        return Tensor::from_f32(shape, v.into_iter().map(|x| x as f32).collect());
    }
    Tensor::from_f64_as(dtype, shape, &v)
}

pub(super) fn resize(cx: &OpCtx<'_>, inputs: &[Option<RtValue>]) -> OpResult {
    let Op::Resize {
        antialias,
        axes,
        coordinate_transformation_mode,
        cubic_coeff_a,
        exclude_outside,
        extrapolation_value,
        keep_aspect_ratio_policy,
        mode,
        nearest_mode,
    } = &cx.node.op
    else {
        return Err(cx.invalid("not a Resize"));
    };
    let old = cx.opset < 11;
    let p = Params {
        mode: mode.as_deref().unwrap_or("nearest"),
        coord: coordinate_transformation_mode.as_deref().unwrap_or(if old {
            "asymmetric"
        } else {
            "half_pixel"
        }),
        nearest: nearest_mode.as_deref().unwrap_or(if old {
            "floor"
        } else {
            "round_prefer_floor"
        }),
        cubic_a: f64::from(cubic_coeff_a.unwrap_or(-0.75)),
        exclude_outside: exclude_outside.unwrap_or(0) != 0,
        extrapolation: f64::from(extrapolation_value.unwrap_or(0.0)),
        antialias: antialias.unwrap_or(0) != 0,
    };
    let x = tensor(cx, inputs, 0)?;
    if matches!(x.dtype, DType::String | DType::Bool) {
        return Err(cx.invalid(format!("Resize does not take {}", x.dtype)));
    }
    let r = x.rank();
    let nonempty = |i: usize| opt_tensor(inputs, i).filter(|t| !t.is_empty());
    let (roi, scales, sizes) = if old {
        (None, nonempty(1), None)
    } else {
        (nonempty(1), nonempty(2), nonempty(3))
    };
    let axes = match axes {
        Some(a) => norm_axes(cx, a, r)?,
        None => (0..r).collect(),
    };
    let na = axes.len();
    let in_dims: Vec<f64> = x.shape.iter().map(|&d| d as f64).collect();
    let mut scale = vec![1.0f64; r];
    let mut out_shape = x.shape.clone();
    match (scales, sizes) {
        (Some(s), None) => {
            let s = s.to_f64()?;
            if s.len() != na {
                return Err(cx.invalid(format!("{} scales for {na} axes", s.len())));
            }
            for (k, &a) in axes.iter().enumerate() {
                if s[k] <= 0.0 || !s[k].is_finite() {
                    return Err(cx.invalid(format!("scale {} is not positive", s[k])));
                }
                scale[a] = s[k];
                out_shape[a] = (s[k] * in_dims[a]) as usize;
            }
        }
        (None, Some(z)) => {
            let z = crate::ops::data::ints(cx, z, "sizes")?;
            if z.len() != na || z.iter().any(|&v| v < 0) {
                return Err(cx.invalid(format!("sizes {z:?} do not fit {na} axes")));
            }
            for (k, &a) in axes.iter().enumerate() {
                if x.shape[a] == 0 {
                    return Err(cx.invalid(format!("cannot resize the empty axis {a}")));
                }
                scale[a] = z[k] as f64 / in_dims[a];
                out_shape[a] = z[k] as usize;
            }
            let policy = keep_aspect_ratio_policy.as_deref().unwrap_or("stretch");
            if policy != "stretch" {
                let it = axes.iter().map(|&a| scale[a]);
                let s = match policy {
                    "not_larger" => it.fold(f64::INFINITY, f64::min),
                    "not_smaller" => it.fold(f64::NEG_INFINITY, f64::max),
                    o => return Err(cx.invalid(format!("unknown keep_aspect_ratio_policy '{o}'"))),
                };
                for &a in &axes {
                    scale[a] = s;
                    out_shape[a] = (s * in_dims[a] + 0.5) as usize;
                }
            }
        }
        (Some(_), Some(_)) => return Err(cx.invalid("both scales and sizes are given")),
        (None, None) => return Err(cx.invalid("neither scales nor sizes is given")),
    }
    cx.check_result(x.dtype, &out_shape)?;
    let mut roi_full: Option<Vec<f64>> = None;
    if let Some(t) = roi {
        let v = t.to_f64()?;
        if v.len() != 2 * na {
            return Err(cx.invalid(format!("roi has {} values for {na} axes", v.len())));
        }
        let mut full = vec![0.0; r];
        full.extend(std::iter::repeat_n(1.0, r));
        for (k, &a) in axes.iter().enumerate() {
            full[a] = v[k];
            full[r + a] = v[na + k];
        }
        roi_full = Some(full);
    }
    // The taps of each axis that changes (an axis is resized once: its input size is the
    // original's).
    let mut plan: Vec<(usize, Vec<Tap>)> = Vec::new();
    for &a in &axes {
        let ax_roi = roi_full.as_ref().map_or((0.0, 1.0), |f| (f[a], f[r + a]));
        if shape_unchanged(scale[a], out_shape[a], x.shape[a], ax_roi) {
            continue;
        }
        if x.shape[a] == 0 && out_shape[a] > 0 {
            return Err(cx.invalid(format!("cannot resize the empty axis {a}")));
        }
        let t = taps(&p, x.shape[a], out_shape[a], scale[a], ax_roi).map_err(|e| cx.invalid(e))?;
        plan.push((a, t));
    }
    if p.mode == "nearest" && !p.antialias && !p.exclude_outside {
        // Each output element is one input element: gather them in the tensor's own type.
        let mut index: Vec<Vec<usize>> = x.shape.iter().map(|&d| (0..d).collect()).collect();
        let picked = plan.iter().all(|(a, t)| {
            let one: Option<Vec<usize>> = t
                .iter()
                .map(|tap| match tap {
                    Tap::Weights(w) => w.iter().find(|(_, c)| *c == 1.0).map(|&(i, _)| i),
                    Tap::Extrapolate => None,
                })
                .collect();
            one.map(|i| index[*a] = i).is_some()
        });
        if picked {
            let data = map_any!(&x.data, |v| nearest_gather(v, &x.shape, &index));
            return single(Tensor::new(x.dtype, out_shape, data)?);
        }
    }
    let mut buf = x.to_f64()?;
    let mut shape = x.shape.clone();
    for (a, t) in &plan {
        buf = apply_axis(&buf, &shape, *a, t, p.extrapolation);
        shape[*a] = out_shape[*a];
    }
    single(saturate(x.dtype, out_shape, buf)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(mode: &'static str, coord: &'static str) -> Params<'static> {
        Params {
            mode,
            coord,
            nearest: "round_prefer_floor",
            cubic_a: -0.75,
            exclude_outside: false,
            extrapolation: 0.0,
            antialias: false,
        }
    }

    fn run(p: &Params<'_>, input: &[f64], out_w: usize, scale: f64) -> Vec<f64> {
        let t = taps(p, input.len(), out_w, scale, (0.0, 1.0)).unwrap_or_default();
        apply_axis(input, &[input.len()], 0, &t, p.extrapolation)
    }

    #[test]
    fn linear_half_pixel_upsample() {
        // numpy/onnx reference: [1, 1.25, 1.75, 2.25, 2.75, 3] for [1, 2, 3] * 2.
        let out = run(&params("linear", "half_pixel"), &[1.0, 2.0, 3.0], 6, 2.0);
        let want = [1.0, 1.25, 1.75, 2.25, 2.75, 3.0];
        assert!(
            out.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-12),
            "{out:?}"
        );
    }

    #[test]
    fn nearest_asymmetric_and_align_corners() {
        let out = run(&params("nearest", "asymmetric"), &[1.0, 2.0], 4, 2.0);
        assert_eq!(out, vec![1.0, 1.0, 2.0, 2.0]);
        let out = run(&params("linear", "align_corners"), &[0.0, 3.0], 4, 2.0);
        assert_eq!(out, vec![0.0, 1.0, 2.0, 3.0]);
    }

    /// Nearest resizing gathers the element the weighted path picks (every nearest mode and
    /// coordinate mode, up and down, two axes at once), in the tensor's own type.
    #[test]
    fn nearest_gather_picks_what_the_weights_pick() {
        let (h, w) = (3usize, 5usize);
        let input: Vec<f64> = (0..h * w).map(|i| (i * 7 % 11) as f64).collect();
        for nearest in ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"] {
            for coord in [
                "half_pixel",
                "asymmetric",
                "align_corners",
                "pytorch_half_pixel",
            ] {
                for (oh, ow) in [(7usize, 10usize), (2, 3), (3, 12)] {
                    let p = Params {
                        nearest,
                        ..params("nearest", coord)
                    };
                    let (sh, sw) = (oh as f64 / h as f64, ow as f64 / w as f64);
                    let th = taps(&p, h, oh, sh, (0.0, 1.0)).expect("taps");
                    let tw = taps(&p, w, ow, sw, (0.0, 1.0)).expect("taps");
                    let rows = apply_axis(&input, &[h, w], 0, &th, 0.0);
                    let want = apply_axis(&rows, &[oh, w], 1, &tw, 0.0);
                    let pick = |t: &[Tap]| -> Vec<usize> {
                        t.iter()
                            .map(|tap| match tap {
                                Tap::Weights(v) => {
                                    v.iter().find(|(_, c)| *c == 1.0).expect("one").0
                                }
                                Tap::Extrapolate => unreachable!(),
                            })
                            .collect()
                    };
                    let ints: Vec<i64> = input.iter().map(|&x| x as i64).collect();
                    let got = nearest_gather(&ints, &[h, w], &[pick(&th), pick(&tw)]);
                    let want: Vec<i64> = want.iter().map(|&x| x as i64).collect();
                    assert_eq!(got, want, "{nearest} {coord} {oh}x{ow}");
                }
            }
        }
    }

    #[test]
    fn cubic_reproduces_integer_positions() {
        // asymmetric x2: even outputs fall on inputs exactly.
        let input = [1.0, 5.0, 2.0, 7.0];
        let out = run(&params("cubic", "asymmetric"), &input, 8, 2.0);
        for (i, v) in input.iter().enumerate() {
            assert!((out[2 * i] - v).abs() < 1e-12);
        }
        // Coefficients sum to one.
        let c = cubic_coeffs(0.3, -0.75);
        assert!((c.iter().sum::<f64>() - 1.0).abs() < 1e-12);
    }

    #[test]
    fn crop_and_resize_extrapolates() {
        let mut p = params("linear", "tf_crop_and_resize");
        p.extrapolation = 10.0;
        let t = taps(&p, 3, 3, 1.0, (0.5, 1.5)).unwrap_or_default();
        let out = apply_axis(&[0.0, 1.0, 2.0], &[3], 0, &t, 10.0);
        assert_eq!(out, vec![1.0, 2.0, 10.0]);
    }
}
