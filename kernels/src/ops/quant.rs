//! Kernels: quantization (`QuantizeLinear`, `DequantizeLinear`, `DynamicQuantizeLinear`).
//!
//! The per-element math is in small public functions ([`quantize_value`], [`quantize_float`],
//! [`dequantize_value`], [`round_saturate`], [`dynamic_qparams`]) that quantization passes reuse.
//! Scales and zero points apply per tensor, per axis (a 1-d parameter along `axis`) or per block
//! (a parameter of the input's rank whose `axis` dim is `ceil(len / block_size)`).

use half::{bf16, f16};
use mmq_ir::{DType, Op};

use crate::error::KernelError;
use crate::numeric::{self, round_half_even};
use crate::ops::util::{self, opt_tensor, tensor};
use crate::ops::{OpCtx, OpResult};
use crate::tensor::{Data, RtValue, Tensor};

/// The value range of an integer quantization type (`u8`, `i8`, `u16`, `i16`, `u4`, `i4`, `u2`,
/// `i2`); `None` for other types.
pub fn integer_range(dtype: DType) -> Option<(i32, i32)> {
    Some(match dtype {
        DType::U8 => (0, 255),
        DType::I8 => (-128, 127),
        DType::U16 => (0, 65535),
        DType::I16 => (-32768, 32767),
        DType::U4 => (0, 15),
        DType::I4 => (-8, 7),
        DType::U2 => (0, 3),
        DType::I2 => (-2, 1),
        _ => return None,
    })
}

/// `clamp(round_half_even(q) + zero_point, lo, hi)` for a quotient `q = x / scale`. NaN maps to
/// the zero point.
pub fn round_saturate(q: f64, zero_point: i32, (lo, hi): (i32, i32)) -> i32 {
    let r = if q.is_nan() { 0.0 } else { round_half_even(q) };
    (r + f64::from(zero_point)).clamp(f64::from(lo), f64::from(hi)) as i32
}

/// ONNX `QuantizeLinear` of one f32 value to an integer type of value range `range` (see
/// [`integer_range`]): `saturate(round_half_even(x / scale) + zero_point)`, dividing in f32.
pub fn quantize_value(x: f32, scale: f32, zero_point: i32, range: (i32, i32)) -> i32 {
    round_saturate(f64::from(x / scale), zero_point, range)
}

/// ONNX `QuantizeLinear` of one f32 value to a small float type (fp8, fp4): the code of
/// `x / scale`, rounded to nearest even; out-of-range values saturate when `saturate` is set
/// (fp4 always saturates).
pub fn quantize_float(x: f32, scale: f32, dtype: DType, saturate: bool) -> u8 {
    numeric::encode(dtype, x / scale, saturate)
}

/// ONNX `DequantizeLinear` of one value: `(q - zero_point) * scale`. In f64 the product of an
/// integer code of up to 24 bits and an f32 scale is exact, so rounding the result once to the
/// output type gives ONNX's value.
pub fn dequantize_value(q: f64, scale: f64, zero_point: f64) -> f64 {
    (q - zero_point) * scale
}

/// The scale and zero point of `DynamicQuantizeLinear` (u8) for data whose minimum and maximum are
/// `min` and `max`: the range is widened to include 0, `scale = (max - min) / 255` (1/255 when the
/// range is empty), `zero_point = round(saturate(-min / scale))`.
pub fn dynamic_qparams(min: f32, max: f32) -> (f32, u8) {
    let maxx = max.max(0.0);
    let minx = min.min(0.0);
    let range = if maxx == minx { 1.0 } else { maxx - minx };
    let scale = range / 255.0f32;
    let zp = (0.0f32 - minx / scale).clamp(0.0, 255.0);
    (scale, round_half_even(f64::from(zp)) as u8)
}

/// Runs the node when it is one of this family's ops.
pub(crate) fn eval(cx: &OpCtx<'_>, inputs: &[Option<RtValue>]) -> Option<OpResult> {
    Some(match &cx.node.op {
        Op::QuantizeLinear {
            axis,
            block_size,
            output_dtype,
            precision,
            saturate,
        } => quantize_linear(
            cx,
            inputs,
            &QuantAttrs {
                axis: axis.unwrap_or(1),
                block_size: block_size.unwrap_or(0),
                output_dtype: output_dtype.unwrap_or(0),
                precision: precision.unwrap_or(0),
                saturate: saturate.unwrap_or(1) != 0,
            },
        ),
        Op::DequantizeLinear {
            axis,
            block_size,
            output_dtype,
        } => dequantize_linear(
            cx,
            inputs,
            &QuantAttrs {
                axis: axis.unwrap_or(1),
                block_size: block_size.unwrap_or(0),
                output_dtype: output_dtype.unwrap_or(0),
                precision: 0,
                saturate: true,
            },
        ),
        Op::DynamicQuantizeLinear {} => dynamic_quantize_linear(cx, inputs),
        _ => return None,
    })
}

pub(crate) struct QuantAttrs {
    pub(crate) axis: i64,
    pub(crate) block_size: i64,
    pub(crate) output_dtype: i64,
    pub(crate) precision: i64,
    pub(crate) saturate: bool,
}

/// How a scale / zero point maps onto the elements of the input viewed as `[outer, len, inner]`
/// around the quantization axis.
#[derive(Clone, Copy, Debug)]
enum Granularity {
    Tensor,
    Axis {
        outer: usize,
        len: usize,
        inner: usize,
    },
    Block {
        outer: usize,
        len: usize,
        inner: usize,
        block: usize,
        blocks: usize,
    },
}

impl Granularity {
    /// Calls `f(element index, parameter index)` for every element, in order.
    #[inline]
    fn for_each(self, n: usize, mut f: impl FnMut(usize, usize)) {
        match self {
            Granularity::Tensor => (0..n).for_each(|i| f(i, 0)),
            Granularity::Axis { outer, len, inner } => {
                let mut e = 0;
                for _ in 0..outer {
                    for a in 0..len {
                        for _ in 0..inner {
                            f(e, a);
                            e += 1;
                        }
                    }
                }
            }
            Granularity::Block {
                outer,
                len,
                inner,
                block,
                blocks,
            } => {
                let mut e = 0;
                for o in 0..outer {
                    for a in 0..len {
                        let base = (o * blocks + a / block) * inner;
                        for i in 0..inner {
                            f(e, base + i);
                            e += 1;
                        }
                    }
                }
            }
        }
    }
}

/// Works out the granularity from the input shape, the scale shape and the attributes.
fn granularity(
    cx: &OpCtx<'_>,
    x_shape: &[usize],
    scale_shape: &[usize],
    axis: i64,
    block_size: i64,
) -> Result<Granularity, KernelError> {
    let count: usize = scale_shape.iter().product();
    if count == 1 {
        return Ok(Granularity::Tensor);
    }
    let ax = util::axis(cx, axis, x_shape.len())?;
    let outer: usize = x_shape[..ax].iter().product();
    let len = x_shape[ax];
    let inner: usize = x_shape[ax + 1..].iter().product();
    if block_size <= 0 {
        if scale_shape.len() != 1 || scale_shape[0] != len {
            return Err(cx.invalid(format!(
                "per-axis scale of shape {scale_shape:?} does not match dim {ax} of input \
                 shape {x_shape:?}"
            )));
        }
        return Ok(Granularity::Axis { outer, len, inner });
    }
    let block = block_size as usize;
    let blocks = scale_shape.get(ax).copied().unwrap_or(0);
    let fits = scale_shape.len() == x_shape.len()
        && scale_shape
            .iter()
            .zip(x_shape)
            .enumerate()
            .all(|(i, (s, x))| i == ax || s == x)
        && blocks == len.div_ceil(block);
    if !fits {
        return Err(cx.invalid(format!(
            "blocked scale of shape {scale_shape:?} does not match input shape {x_shape:?} \
             with block_size {block_size} on axis {ax}"
        )));
    }
    Ok(Granularity::Block {
        outer,
        len,
        inner,
        block,
        blocks,
    })
}

/// Rounds a quotient to the precision it is computed in.
#[inline]
fn round_to(q: f64, precision: DType) -> f64 {
    match precision {
        DType::F32 => f64::from(q as f32),
        DType::F16 => f64::from(f16::from_f64(q)),
        DType::BF16 => f64::from(bf16::from_f64(q)),
        _ => q,
    }
}

/// The dtype of `x / scale` under numpy promotion (the ONNX reference): integers divide in f64,
/// equal float types in that type, mixed float types in f32.
fn division_precision(x: DType, scale: DType) -> DType {
    if !x.is_float() || !scale.is_float() {
        return DType::F64;
    }
    if x == scale {
        return x;
    }
    match (x, scale) {
        (DType::F64, _) | (_, DType::F64) => DType::F64,
        _ => DType::F32,
    }
}

/// Calls `$body` with `$get` bound to a closure returning element `i` of a float or i32 tensor as
/// f64; `$other` for any other element type.
macro_rules! with_f64_reader {
    ($data:expr, $get:ident => $body:expr, else $other:expr) => {
        match $data {
            Data::F32(v) => {
                let $get = |i: usize| f64::from(v[i]);
                $body
            }
            Data::F16(v) => {
                let $get = |i: usize| f64::from(v[i]);
                $body
            }
            Data::BF16(v) => {
                let $get = |i: usize| f64::from(v[i]);
                $body
            }
            Data::F64(v) => {
                let $get = |i: usize| v[i];
                $body
            }
            Data::I32(v) => {
                let $get = |i: usize| f64::from(v[i]);
                $body
            }
            _ => $other,
        }
    };
}

pub(crate) fn quantize_linear(
    cx: &OpCtx<'_>,
    inputs: &[Option<RtValue>],
    at: &QuantAttrs,
) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let scale = tensor(cx, inputs, 1)?;
    let zp = opt_tensor(inputs, 2);
    let out_dtype = match zp {
        Some(z) => {
            if at.output_dtype != 0 && i64::from(z.dtype.onnx_code()) != at.output_dtype {
                return Err(cx.invalid(format!(
                    "output_dtype {} disagrees with the zero point's dtype {}",
                    at.output_dtype, z.dtype
                )));
            }
            z.dtype
        }
        None if at.output_dtype != 0 => i32::try_from(at.output_dtype)
            .ok()
            .and_then(DType::from_onnx_code)
            .ok_or_else(|| cx.invalid(format!("unknown output_dtype {}", at.output_dtype)))?,
        None => DType::U8,
    };
    let is_small_float = matches!(
        out_dtype,
        DType::F8E4M3FN | DType::F8E4M3FNUZ | DType::F8E5M2 | DType::F8E5M2FNUZ | DType::F4E2M1
    );
    let range = integer_range(out_dtype);
    if range.is_none() && !is_small_float {
        return Err(cx.unsupported(format!("cannot quantize to {out_dtype}")));
    }
    if !scale.dtype.is_float() || matches!(scale.dtype, DType::F8E8M0) {
        return Err(cx.invalid(format!("scale has non-float dtype {}", scale.dtype)));
    }
    let gran = granularity(cx, &x.shape, &scale.shape, at.axis, at.block_size)?;
    if let Some(z) = zp
        && z.shape != scale.shape
        && !(z.len() == 1 && scale.len() == 1)
    {
        return Err(cx.invalid(format!(
            "zero point shape {:?} differs from scale shape {:?}",
            z.shape, scale.shape
        )));
    }
    let precision = if at.precision != 0 {
        i32::try_from(at.precision)
            .ok()
            .and_then(DType::from_onnx_code)
            .filter(|d| matches!(d, DType::F32 | DType::F16 | DType::BF16 | DType::F64))
            .ok_or_else(|| cx.invalid(format!("unsupported precision {}", at.precision)))?
    } else {
        division_precision(x.dtype, scale.dtype)
    };
    let scales: Vec<f64> = scale
        .to_f64()?
        .into_iter()
        .map(|s| round_to(s, precision))
        .collect();
    let n = x.len();
    let shape = x.shape.clone();
    if let Some(range) = range {
        let zps: Vec<i32> = match zp {
            Some(z) => z.to_i64()?.into_iter().map(|v| v as i32).collect(),
            None => vec![0; scales.len()],
        };
        let mut q = vec![0i32; n];
        if let (Data::F32(xv), Data::F32(sv), DType::F32) = (&x.data, &scale.data, precision) {
            // The hot path: f32 division is correctly rounded, as the general path's is.
            gran.for_each(n, |e, p| q[e] = quantize_value(xv[e], sv[p], zps[p], range));
        } else {
            with_f64_reader!(&x.data, get => gran.for_each(n, |e, p| {
            let quot = round_to(round_to(get(e), precision) / scales[p], precision);
            q[e] = round_saturate(quot, zps[p], range);
        }), else return Err(cx.unsupported(format!("cannot quantize a {} tensor", x.dtype))));
        }
        let data = match out_dtype {
            DType::U8 => Data::U8(q.into_iter().map(|v| v as u8).collect()),
            DType::I8 => Data::I8(q.into_iter().map(|v| v as i8).collect()),
            DType::U16 => Data::U16(q.into_iter().map(|v| v as u16).collect()),
            DType::I16 => Data::I16(q.into_iter().map(|v| v as i16).collect()),
            DType::U4 | DType::I4 => Data::Codes(q.into_iter().map(|v| (v as u8) & 0xf).collect()),
            _ => Data::Codes(q.into_iter().map(|v| (v as u8) & 0x3).collect()),
        };
        return Ok(vec![Some(Tensor::new(out_dtype, shape, data)?.into())]);
    }
    // Small float outputs; the zero point only shifts fp4 (it must be zero for fp8).
    let zps: Vec<f64> = match zp {
        Some(z) if out_dtype == DType::F4E2M1 => z.to_f64()?,
        _ => vec![0.0; scales.len()],
    };
    let mut codes = vec![0u8; n];
    if let (Data::F32(xv), Data::F32(sv), DType::F32, None) = (
        &x.data,
        &scale.data,
        precision,
        zp.filter(|_| out_dtype == DType::F4E2M1),
    ) {
        gran.for_each(n, |e, p| {
            codes[e] = quantize_float(xv[e], sv[p], out_dtype, at.saturate);
        });
    } else {
        with_f64_reader!(&x.data, get => gran.for_each(n, |e, p| {
        let quot = round_to(round_to(get(e), precision) / scales[p], precision) + zps[p];
        codes[e] = numeric::encode(out_dtype, quot as f32, at.saturate);
    }), else return Err(cx.unsupported(format!("cannot quantize a {} tensor", x.dtype))));
    }
    Ok(vec![Some(
        Tensor::new(out_dtype, shape, Data::Codes(codes))?.into(),
    )])
}

/// Calls `$body` with `$get` bound to a closure returning element `i` of an integer or small-type
/// tensor as f64; `$other` for any other element type.
macro_rules! with_q_reader {
    ($t:expr, $get:ident => $body:expr, else $other:expr) => {
        match &$t.data {
            Data::U8(v) => {
                let $get = |i: usize| f64::from(v[i]);
                $body
            }
            Data::I8(v) => {
                let $get = |i: usize| f64::from(v[i]);
                $body
            }
            Data::U16(v) => {
                let $get = |i: usize| f64::from(v[i]);
                $body
            }
            Data::I16(v) => {
                let $get = |i: usize| f64::from(v[i]);
                $body
            }
            Data::I32(v) => {
                let $get = |i: usize| f64::from(v[i]);
                $body
            }
            Data::Codes(v) => {
                let dt = $t.dtype;
                let $get = |i: usize| f64::from(numeric::decode(dt, v[i]));
                $body
            }
            _ => $other,
        }
    };
}

pub(crate) fn dequantize_linear(
    cx: &OpCtx<'_>,
    inputs: &[Option<RtValue>],
    at: &QuantAttrs,
) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let scale = tensor(cx, inputs, 1)?;
    let zp = opt_tensor(inputs, 2);
    let out_dtype = if at.output_dtype != 0 {
        i32::try_from(at.output_dtype)
            .ok()
            .and_then(DType::from_onnx_code)
            .ok_or_else(|| cx.invalid(format!("unknown output_dtype {}", at.output_dtype)))?
    } else {
        scale.dtype
    };
    if !matches!(
        out_dtype,
        DType::F32 | DType::F16 | DType::BF16 | DType::F64
    ) {
        return Err(cx.unsupported(format!("cannot dequantize to {out_dtype}")));
    }
    let gran = granularity(cx, &x.shape, &scale.shape, at.axis, at.block_size)?;
    let scales = scale.to_f64()?;
    let zps: Vec<f64> = match zp {
        Some(z) => {
            if z.len() != scales.len() {
                return Err(cx.invalid(format!(
                    "zero point shape {:?} differs from scale shape {:?}",
                    z.shape, scale.shape
                )));
            }
            if z.dtype != x.dtype {
                return Err(cx.invalid(format!(
                    "zero point dtype {} differs from input dtype {}",
                    z.dtype, x.dtype
                )));
            }
            let is_float = x.dtype.is_float() && x.dtype != DType::F4E2M1;
            if is_float {
                vec![0.0; scales.len()]
            } else {
                z.to_f64()?
            }
        }
        None => vec![0.0; scales.len()],
    };
    let n = x.len();
    let mut y = vec![0f64; n];
    with_q_reader!(x, get => gran.for_each(n, |e, p| {
        y[e] = dequantize_value(get(e), scales[p], zps[p]);
    }), else return Err(cx.unsupported(format!("cannot dequantize a {} tensor", x.dtype))));
    // The product is exact in f64 for every input type but i32, so rounding once gives ONNX's f32.
    let data = match out_dtype {
        DType::F32 => Data::F32(y.into_iter().map(|v| v as f32).collect()),
        DType::F16 => Data::F16(y.into_iter().map(|v| f16::from_f32(v as f32)).collect()),
        DType::BF16 => Data::BF16(y.into_iter().map(|v| bf16::from_f32(v as f32)).collect()),
        _ => Data::F64(y),
    };
    Ok(vec![Some(
        Tensor::new(out_dtype, x.shape.clone(), data)?.into(),
    )])
}

fn dynamic_quantize_linear(cx: &OpCtx<'_>, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let v: std::borrow::Cow<'_, [f32]> = match &x.data {
        Data::F32(v) => std::borrow::Cow::Borrowed(v),
        Data::F16(_) | Data::BF16(_) | Data::F64(_) => std::borrow::Cow::Owned(x.to_f32()?),
        _ => {
            return Err(cx.invalid(format!("input must be a float tensor, got {}", x.dtype)));
        }
    };
    let (mut lo, mut hi) = (0f32, 0f32);
    for &e in v.iter() {
        lo = lo.min(e);
        hi = hi.max(e);
    }
    let (scale, zp) = dynamic_qparams(lo, hi);
    let y: Vec<u8> = v
        .iter()
        .map(|&e| round_saturate(f64::from(e / scale), i32::from(zp), (0, 255)) as u8)
        .collect();
    let scale_t = Tensor::from_f64_as(x.dtype, vec![], &[f64::from(scale)])?;
    Ok(vec![
        Some(Tensor::new(DType::U8, x.shape.clone(), Data::U8(y))?.into()),
        Some(scale_t.into()),
        Some(Tensor::new(DType::U8, vec![], Data::U8(vec![zp]))?.into()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_half_to_even_and_saturates() {
        let q = |x: f32, s: f32, zp: i32, dtype: DType| {
            integer_range(dtype).map(|r| quantize_value(x, s, zp, r))
        };
        assert_eq!(q(2.5, 1.0, 0, DType::U8), Some(2));
        assert_eq!(q(3.5, 1.0, 0, DType::U8), Some(4));
        assert_eq!(q(-2.5, 1.0, 0, DType::I8), Some(-2));
        assert_eq!(q(1000.0, 2.0, 128, DType::U8), Some(255));
        assert_eq!(q(-1000.0, 2.0, 128, DType::U8), Some(0));
        assert_eq!(q(-1000.0, 1.0, 0, DType::I8), Some(-128));
        assert_eq!(q(7.6, 1.0, 0, DType::I4), Some(7));
        assert_eq!(q(-9.0, 1.0, 0, DType::I4), Some(-8));
        assert_eq!(q(5.0, 1.0, 0, DType::U2), Some(3));
        assert_eq!(q(-5.0, 1.0, 0, DType::I2), Some(-2));
        assert_eq!(q(70000.0, 1.0, 0, DType::U16), Some(65535));
        assert_eq!(q(1.0, 1.0, 0, DType::F32), None);
        assert_eq!(q(f32::NAN, 1.0, 3, DType::U8), Some(3));
    }

    #[test]
    fn float_quantization_and_dequantization() {
        assert_eq!(quantize_float(896.0, 2.0, DType::F8E4M3FN, true), 0x7e);
        assert_eq!(
            numeric::decode(
                DType::F8E4M3FN,
                quantize_float(1e6, 1.0, DType::F8E4M3FN, true)
            ),
            448.0
        );
        assert!(
            numeric::decode(
                DType::F8E4M3FN,
                quantize_float(1e6, 1.0, DType::F8E4M3FN, false)
            )
            .is_nan()
        );
        assert_eq!(dequantize_value(130.0, 0.5, 128.0), 1.0);
        assert_eq!(dequantize_value(-3.0, 2.0, 0.0), -6.0);
    }

    #[test]
    fn dynamic_parameters() {
        // The ONNX example: x = [0, 2, -3, -2.5, 1.34, 0.5] → scale 5/255, zero point 153.
        let (scale, zp) = dynamic_qparams(-3.0, 2.0);
        assert_eq!(scale, 5.0f32 / 255.0);
        assert_eq!(zp, 153);
        // All positive: the range is widened to 0.
        let (scale, zp) = dynamic_qparams(1.0, 255.0);
        assert_eq!((scale, zp), (1.0, 0));
        // All zero: scale 1/255.
        assert_eq!(dynamic_qparams(0.0, 0.0), (1.0 / 255.0, 0));
    }

    #[test]
    fn granularity_indices() {
        let collect = |g: Granularity, n: usize| {
            let mut v = Vec::new();
            g.for_each(n, |e, p| v.push((e, p)));
            v.into_iter().map(|(_, p)| p).collect::<Vec<_>>()
        };
        // [2, 3] per-axis on axis 1.
        let g = Granularity::Axis {
            outer: 2,
            len: 3,
            inner: 1,
        };
        assert_eq!(collect(g, 6), vec![0, 1, 2, 0, 1, 2]);
        // [2, 5] blocked on axis 1 with block 2 → scale [2, 3].
        let g = Granularity::Block {
            outer: 2,
            len: 5,
            inner: 1,
            block: 2,
            blocks: 3,
        };
        assert_eq!(collect(g, 10), vec![0, 0, 1, 1, 2, 3, 3, 4, 4, 5]);
        // [4, 2] blocked on axis 0 with block 2 → scale [2, 2].
        let g = Granularity::Block {
            outer: 1,
            len: 4,
            inner: 2,
            block: 2,
            blocks: 2,
        };
        assert_eq!(collect(g, 8), vec![0, 1, 0, 1, 2, 3, 2, 3]);
    }

    #[test]
    fn division_precision_follows_numpy() {
        assert_eq!(division_precision(DType::F32, DType::F32), DType::F32);
        assert_eq!(division_precision(DType::F16, DType::F16), DType::F16);
        assert_eq!(division_precision(DType::F16, DType::F32), DType::F32);
        assert_eq!(division_precision(DType::I32, DType::F32), DType::F64);
    }

    /// Runs one node of `op` on graph inputs `x`, `scale`, `zp` and returns its output.
    fn run_node(op: Op, inputs: Vec<(&str, Tensor)>) -> Tensor {
        use std::collections::HashMap;

        use mmq_ir::{Module, Type};

        use crate::interp::Interpreter;

        let mut m = Module::new();
        let g = m.add_graph("main", None);
        let mut args = Vec::new();
        for (name, t) in &inputs {
            args.push(Some(
                m.add_input(
                    g,
                    Some((*name).to_owned()),
                    Type::tensor(
                        t.dtype,
                        t.shape
                            .iter()
                            .map(|&d| mmq_ir::Dim::known(d as i64))
                            .collect(),
                    ),
                ),
            ));
        }
        let n = m.add_node(g, op, args, vec![Some((None, Type::Unknown))], None);
        let y = m.nodes[n].outputs[0].expect("output");
        m.graphs[g].outputs.push(y);
        let feeds: HashMap<String, RtValue> = inputs
            .into_iter()
            .map(|(n, t)| (n.to_owned(), t.into()))
            .collect();
        let outs = Interpreter::new(&m).run(g, &feeds).expect("run");
        outs[0].1.as_tensor().expect("tensor").as_ref().clone()
    }

    #[test]
    fn per_axis_and_blocked_kernels() {
        // Per-axis on axis 1 of [2, 2]: column scales 1 and 2, zero points 0 and 10, as i8.
        let y = run_node(
            Op::QuantizeLinear {
                axis: Some(1),
                block_size: None,
                output_dtype: None,
                precision: None,
                saturate: None,
            },
            vec![
                (
                    "x",
                    Tensor::from_f32(vec![2, 2], vec![2.5, 3.0, -300.0, 5.0]).expect("x"),
                ),
                ("s", Tensor::from_f32(vec![2], vec![1.0, 2.0]).expect("s")),
                (
                    "z",
                    Tensor::new(DType::I8, vec![2], Data::I8(vec![0, 10])).expect("z"),
                ),
            ],
        );
        assert_eq!(y.data, Data::I8(vec![2, 12, -128, 12]));
        // Blocked on axis 1 of [1, 5] with block 2: scales [1, 10, 100], u4 output (from zp).
        let y = run_node(
            Op::QuantizeLinear {
                axis: Some(1),
                block_size: Some(2),
                output_dtype: None,
                precision: None,
                saturate: None,
            },
            vec![
                (
                    "x",
                    Tensor::from_f32(vec![1, 5], vec![3.0, 20.0, 30.0, 45.0, 300.0]).expect("x"),
                ),
                (
                    "s",
                    Tensor::from_f32(vec![1, 3], vec![1.0, 10.0, 100.0]).expect("s"),
                ),
                (
                    "z",
                    Tensor::new(DType::U4, vec![1, 3], Data::Codes(vec![0, 1, 2])).expect("z"),
                ),
            ],
        );
        assert_eq!(y.dtype, DType::U4);
        assert_eq!(y.data, Data::Codes(vec![3, 15, 4, 5, 5]));
        // Dequantize per axis, back to f32.
        let y = run_node(
            Op::DequantizeLinear {
                axis: Some(0),
                block_size: None,
                output_dtype: None,
            },
            vec![
                (
                    "x",
                    Tensor::new(DType::U8, vec![2, 1], Data::U8(vec![130, 0])).expect("x"),
                ),
                ("s", Tensor::from_f32(vec![2], vec![0.5, 2.0]).expect("s")),
                (
                    "z",
                    Tensor::new(DType::U8, vec![2], Data::U8(vec![128, 1])).expect("z"),
                ),
            ],
        );
        assert_eq!(y.data, Data::F32(vec![1.0, -2.0]));
    }
}
