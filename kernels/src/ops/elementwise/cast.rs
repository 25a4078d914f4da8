//! `Cast` and `CastLike`: every pair of dtypes, with numpy's conversions (float to integer
//! truncates; out-of-range values behave as numpy's `astype` on x86-64), ONNX's saturation for
//! the fp8 types, and ONNX Runtime's text for floats cast to strings.

use half::{bf16, f16};
use mmq_ir::{DType, Op};

use super::single;
use crate::error::KernelError;
use crate::numeric;
use crate::ops::util::tensor;
use crate::ops::{OpCtx, OpResult};
use crate::tensor::{Data, RtValue, Tensor};

/// `x` truncated to i64 as x86-64 `cvttsd2si` does: NaN and out-of-range values give `i64::MIN`.
fn f2i64(x: f64) -> i64 {
    if !(-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&x) {
        i64::MIN
    } else {
        x as i64
    }
}

/// `x` truncated to i32 as the 32-bit `cvttsd2si` does.
fn f2i32(x: f64) -> i32 {
    if x.is_nan() || x >= 2_147_483_648.0 || x <= -2_147_483_649.0 {
        i32::MIN
    } else {
        x as i32
    }
}

fn f2u64(x: f64) -> u64 {
    const TWO63: f64 = 9_223_372_036_854_775_808.0;
    if (TWO63..18_446_744_073_709_551_616.0).contains(&x) {
        ((x - TWO63) as u64) | (1u64 << 63)
    } else {
        f2i64(x) as u64
    }
}

/// E8M0 code of `x` with a rounding mode (`up`, `down`, `nearest`), as the ONNX reference does
/// it on the f32 bits: the biased exponent, rounded by the mantissa, sign ignored; NaN and
/// infinities give 0xff; with `saturate`, rounding never goes past 0xfe.
fn e8m0(x: f32, saturate: bool, mode: &str) -> u8 {
    let bits = x.to_bits();
    let exponent = (bits >> 23) & 0xff;
    if exponent == 0xff {
        return 0xff;
    }
    let round_up = match mode {
        "nearest" => {
            let g = bits & 0x40_0000 != 0;
            let r = bits & 0x20_0000 != 0;
            let s = bits & 0x1f_ffff != 0;
            g && (r || s || exponent > 0)
        }
        "up" => bits & 0x7f_ffff != 0,
        _ => false,
    };
    let round_up = round_up && !(saturate && exponent == 0xfe);
    (exponent + u32::from(round_up)).min(0xff) as u8
}

/// The code of `x` in a small type, as numpy with `ml_dtypes` casts: the 4- and 2-bit integers
/// truncate and give 0 out of range; fp4 has no NaN and gives -0 for it.
fn small_code(to: DType, x: f64, saturate: bool) -> u8 {
    let int_range = match to {
        DType::U4 => Some((0.0, 15.0)),
        DType::I4 => Some((-8.0, 7.0)),
        DType::U2 => Some((0.0, 3.0)),
        DType::I2 => Some((-2.0, 1.0)),
        _ => None,
    };
    if let Some((lo, hi)) = int_range {
        let t = x.trunc();
        let t = if (lo..=hi).contains(&t) { t } else { 0.0 };
        return numeric::encode(to, t as f32, true);
    }
    if to == DType::F4E2M1 && x.is_nan() {
        return 0x8;
    }
    numeric::encode(to, x as f32, saturate)
}

/// Numbers (as f64) to `to`, which is neither a string nor an integer read from integers.
fn from_f64(
    to: DType,
    shape: Vec<usize>,
    v: &[f64],
    saturate: bool,
    mode: &str,
) -> Result<Tensor, KernelError> {
    use DType::*;
    let data = match to {
        Bool => Data::Bool(v.iter().map(|&x| x != 0.0).collect()),
        I64 => Data::I64(v.iter().map(|&x| f2i64(x)).collect()),
        I32 => Data::I32(v.iter().map(|&x| f2i32(x)).collect()),
        I16 => Data::I16(v.iter().map(|&x| f2i32(x) as i16).collect()),
        I8 => Data::I8(v.iter().map(|&x| f2i32(x) as i8).collect()),
        U8 => Data::U8(v.iter().map(|&x| f2i32(x) as u8).collect()),
        U16 => Data::U16(v.iter().map(|&x| f2i32(x) as u16).collect()),
        U32 => Data::U32(v.iter().map(|&x| f2i64(x) as u32).collect()),
        U64 => Data::U64(v.iter().map(|&x| f2u64(x)).collect()),
        F16 => Data::F16(v.iter().map(|&x| f16::from_f64(x)).collect()),
        BF16 => Data::BF16(v.iter().map(|&x| bf16::from_f64(x)).collect()),
        F32 => Data::F32(v.iter().map(|&x| x as f32).collect()),
        F64 => Data::F64(v.to_vec()),
        F8E8M0 => Data::Codes(v.iter().map(|&x| e8m0(x as f32, saturate, mode)).collect()),
        F8E4M3FN | F8E4M3FNUZ | F8E5M2 | F8E5M2FNUZ | F4E2M1 | U4 | I4 | U2 | I2 => {
            Data::Codes(v.iter().map(|&x| small_code(to, x, saturate)).collect())
        }
        String | C64 | C128 => {
            return Err(KernelError::Module(format!("cannot cast numbers to {to}")));
        }
    };
    Tensor::new(to, shape, data)
}

/// Integers (as i64) to another integer or bool type, wrapping like a C cast.
fn from_i64(to: DType, shape: Vec<usize>, v: &[i64]) -> Result<Tensor, KernelError> {
    use DType::*;
    let data = match to {
        Bool => Data::Bool(v.iter().map(|&x| x != 0).collect()),
        I64 => Data::I64(v.to_vec()),
        I32 => Data::I32(v.iter().map(|&x| x as i32).collect()),
        I16 => Data::I16(v.iter().map(|&x| x as i16).collect()),
        I8 => Data::I8(v.iter().map(|&x| x as i8).collect()),
        U8 => Data::U8(v.iter().map(|&x| x as u8).collect()),
        U16 => Data::U16(v.iter().map(|&x| x as u16).collect()),
        U32 => Data::U32(v.iter().map(|&x| x as u32).collect()),
        U64 => Data::U64(v.iter().map(|&x| x as u64).collect()),
        _ => return Err(KernelError::Module(format!("{to} is not an integer type"))),
    };
    Tensor::new(to, shape, data)
}

/// A float as ONNX Runtime writes it: `NaN`, `INF`, `-INF`, otherwise C's `%.8g` (8 significant
/// digits, trailing zeros dropped, scientific below 1e-4 and from 1e8), for every float type.
fn float_text(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "INF".into() } else { "-INF".into() };
    }
    const DIGITS: i32 = 8;
    // The exponent after rounding to DIGITS significant digits decides the style, as in C.
    let sci = format!("{x:.*e}", (DIGITS - 1) as usize);
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let trim = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_owned()
        } else {
            s.to_owned()
        }
    };
    if !(-4..DIGITS).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(mantissa), exp.abs())
    } else {
        trim(&format!("{x:.*}", (DIGITS - 1 - exp) as usize))
    }
}

fn to_strings(x: &Tensor) -> Result<Vec<String>, KernelError> {
    Ok(match &x.data {
        Data::Str(v) => v.clone(),
        Data::Bool(v) => v
            .iter()
            .map(|&b| if b { "1" } else { "0" }.to_owned())
            .collect(),
        Data::F64(v) => v.iter().map(|&f| float_text(f)).collect(),
        _ if x.dtype.is_float() => x
            .to_f32()?
            .into_iter()
            .map(|f| float_text(f64::from(f)))
            .collect(),
        Data::U64(v) => v.iter().map(u64::to_string).collect(),
        _ => x.to_i64()?.iter().map(i64::to_string).collect(),
    })
}

/// `x` converted to `to`.
pub(super) fn cast_tensor(
    cx: &OpCtx<'_>,
    x: &Tensor,
    to: DType,
    saturate: bool,
    mode: &str,
) -> Result<Tensor, KernelError> {
    let shape = x.shape.clone();
    if x.dtype == to {
        return Ok(x.clone());
    }
    if matches!(to, DType::C64 | DType::C128) || matches!(x.dtype, DType::C64 | DType::C128) {
        return Err(cx.unsupported(format!("cast from {} to {to}", x.dtype)));
    }
    if to == DType::String {
        return Tensor::new(to, shape, Data::Str(to_strings(x)?));
    }
    if let Data::Str(v) = &x.data {
        let parse_err = |s: &str| cx.invalid(format!("cannot parse '{s}' as {to}"));
        if to.is_int() && to.bits() >= 8 || to == DType::Bool {
            let mut out = Vec::with_capacity(v.len());
            for s in v {
                let t = s.trim();
                let n = match t {
                    "True" | "true" => 1,
                    "False" | "false" => 0,
                    _ => match t.parse::<i64>() {
                        Ok(n) => n,
                        Err(_) => match t.parse::<u64>() {
                            Ok(n) => n as i64,
                            Err(_) => f2i64(t.parse::<f64>().map_err(|_| parse_err(s))?),
                        },
                    },
                };
                out.push(n);
            }
            return from_i64(to, shape, &out);
        }
        let mut out = Vec::with_capacity(v.len());
        for s in v {
            out.push(s.trim().parse::<f64>().map_err(|_| parse_err(s))?);
        }
        return from_f64(to, shape, &out, saturate, mode);
    }
    // Integer (or bool) to integer (or bool): exact, wrapping.
    let int_like = |d: DType| (d.is_int() && d.bits() >= 8) || d == DType::Bool;
    if int_like(x.dtype) && int_like(to) {
        return from_i64(to, shape, &x.to_i64()?);
    }
    // Bool and integers to f32 directly (one rounding, as a C cast).
    if to == DType::F32 {
        let v: Option<Vec<f32>> = match &x.data {
            Data::Bool(v) => Some(v.iter().map(|&b| if b { 1.0 } else { 0.0 }).collect()),
            Data::U8(v) => Some(v.iter().map(|&i| f32::from(i)).collect()),
            Data::I8(v) => Some(v.iter().map(|&i| f32::from(i)).collect()),
            Data::I32(v) => Some(v.iter().map(|&i| i as f32).collect()),
            Data::I64(v) => Some(v.iter().map(|&i| i as f32).collect()),
            _ => None,
        };
        if let Some(v) = v {
            return Tensor::new(to, shape, Data::F32(v));
        }
    }
    // f32 to the half and small float types: round once, from f32.
    if let Data::F32(v) = &x.data {
        let data = match to {
            DType::F16 => Some(Data::F16(v.iter().map(|&f| f16::from_f32(f)).collect())),
            DType::BF16 => Some(Data::BF16(v.iter().map(|&f| bf16::from_f32(f)).collect())),
            DType::F64 => Some(Data::F64(v.iter().map(|&f| f64::from(f)).collect())),
            DType::F8E4M3FN
            | DType::F8E4M3FNUZ
            | DType::F8E5M2
            | DType::F8E5M2FNUZ
            | DType::F4E2M1
            | DType::U4
            | DType::I4
            | DType::U2
            | DType::I2 => Some(Data::Codes(
                v.iter()
                    .map(|&f| small_code(to, f64::from(f), saturate))
                    .collect(),
            )),
            _ => None,
        };
        if let Some(data) = data {
            return Tensor::new(to, shape, data);
        }
    }
    if let Data::U64(v) = &x.data {
        let f: Vec<f64> = v.iter().map(|&u| u as f64).collect();
        return from_f64(to, shape, &f, saturate, mode);
    }
    from_f64(to, shape, &x.to_f64()?, saturate, mode)
}

/// Runs `Cast` or `CastLike`.
pub(super) fn eval(cx: &OpCtx<'_>, op: &Op, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let (to, saturate, mode) = match op {
        Op::Cast {
            to,
            saturate,
            round_mode,
        } => {
            let code = to.ok_or_else(|| cx.invalid("attribute 'to' is missing"))?;
            let to = i32::try_from(code)
                .ok()
                .and_then(DType::from_onnx_code)
                .ok_or_else(|| cx.invalid(format!("'to' = {code} is not a dtype")))?;
            (to, *saturate, round_mode.as_deref())
        }
        Op::CastLike {
            saturate,
            round_mode,
        } => (
            tensor(cx, inputs, 1)?.dtype,
            *saturate,
            round_mode.as_deref(),
        ),
        _ => return Err(cx.invalid("not a cast")),
    };
    let mode = mode.unwrap_or("up");
    if !matches!(mode, "up" | "down" | "nearest") {
        return Err(cx.invalid(format!(
            "round_mode must be up, down or nearest, got '{mode}'"
        )));
    }
    if x.dtype == to {
        return Ok(vec![inputs[0].clone()]);
    }
    single(cast_tensor(cx, x, to, saturate.unwrap_or(1) != 0, mode)?)
}
