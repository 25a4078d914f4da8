//! Unary ops: math, activations, `Clip`, `IsNaN`/`IsInf`, `Not`, `BitwiseNot`.

use half::{bf16, f16};
use mmq_ir::{DType, Op};

use super::single;
use crate::error::KernelError;
use crate::ops::util::{opt_tensor, tensor};
use crate::ops::{OpCtx, OpResult};
use crate::tensor::{Data, RtValue, Tensor};

/// The float types math runs in (f16/bf16 compute in f32). The f32 forms of the transcendental
/// functions are [`crate::vmath`]'s branch-free ones, so that [`float_map!`]'s loops vectorize;
/// f64 keeps the C library's.
pub(super) trait Flt: Copy {
    /// `v` in this type.
    fn c(v: f64) -> Self;
    /// The error function.
    fn erfv(self) -> Self;
    /// `e^x`.
    fn expv(self) -> Self;
    /// `tanh x`.
    fn tanhv(self) -> Self;
    /// The logistic function.
    fn sigmoidv(self) -> Self;
}

impl Flt for f32 {
    fn c(v: f64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn erfv(self) -> Self {
        crate::vmath::erf(self)
    }
    #[inline(always)]
    fn expv(self) -> Self {
        crate::vmath::exp(self)
    }
    #[inline(always)]
    fn tanhv(self) -> Self {
        crate::vmath::tanh(self)
    }
    #[inline(always)]
    fn sigmoidv(self) -> Self {
        crate::vmath::sigmoid(self)
    }
}

impl Flt for f64 {
    fn c(v: f64) -> Self {
        v
    }
    fn erfv(self) -> Self {
        erf(self)
    }
    fn expv(self) -> Self {
        self.exp()
    }
    fn tanhv(self) -> Self {
        self.tanh()
    }
    fn sigmoidv(self) -> Self {
        // Stable for large |x|.
        if self >= 0.0 {
            1.0 / (1.0 + (-self).exp())
        } else {
            let e = self.exp();
            e / (1.0 + e)
        }
    }
}

/// The error function (musl's, through the `libm` crate: within an ulp, and no series to sum).
pub(crate) fn erf(x: f64) -> f64 {
    libm::erf(x)
}

/// Maps every element of a float tensor through `$body` (with `$x` bound to the element as f32
/// or f64). `$p` are f64 locals converted to the compute type first.
macro_rules! float_map {
    ($cx:expr, $t:expr, [$($p:ident),*], |$x:ident| $body:expr) => {{
        let t: &Tensor = $t;
        let data = match &t.data {
            Data::F32(v) => {
                $(let $p = <f32 as Flt>::c($p);)*
                Data::F32(crate::vmath::map_vec(v, |$x| $body))
            }
            Data::F64(v) => {
                $(let $p = <f64 as Flt>::c($p);)*
                Data::F64(v.iter().map(|&$x| $body).collect())
            }
            Data::F16(v) => {
                $(let $p = <f32 as Flt>::c($p);)*
                Data::F16(v.iter().map(|h| { let $x = h.to_f32(); f16::from_f32($body) }).collect())
            }
            Data::BF16(v) => {
                $(let $p = <f32 as Flt>::c($p);)*
                Data::BF16(v.iter().map(|h| { let $x = h.to_f32(); bf16::from_f32($body) }).collect())
            }
            _ => return Err($cx.unsupported(format!("dtype {} is not supported", t.dtype))),
        };
        Tensor::new(t.dtype, t.shape.clone(), data)?
    }};
}

/// Like [`float_map!`], with a separate body for signed integers (`$i`) and unsigned ones (`$u`).
macro_rules! num_map {
    ($cx:expr, $t:expr, |$x:ident| float: $body:expr, signed: $i:expr, unsigned: $u:expr) => {{
        let t: &Tensor = $t;
        match &t.data {
            Data::I8(v) => Tensor::new(
                t.dtype,
                t.shape.clone(),
                Data::I8(v.iter().map(|&$x| $i).collect()),
            )?,
            Data::I16(v) => Tensor::new(
                t.dtype,
                t.shape.clone(),
                Data::I16(v.iter().map(|&$x| $i).collect()),
            )?,
            Data::I32(v) => Tensor::new(
                t.dtype,
                t.shape.clone(),
                Data::I32(v.iter().map(|&$x| $i).collect()),
            )?,
            Data::I64(v) => Tensor::new(
                t.dtype,
                t.shape.clone(),
                Data::I64(v.iter().map(|&$x| $i).collect()),
            )?,
            Data::U8(v) => Tensor::new(
                t.dtype,
                t.shape.clone(),
                Data::U8(v.iter().map(|&$x| $u).collect()),
            )?,
            Data::U16(v) => Tensor::new(
                t.dtype,
                t.shape.clone(),
                Data::U16(v.iter().map(|&$x| $u).collect()),
            )?,
            Data::U32(v) => Tensor::new(
                t.dtype,
                t.shape.clone(),
                Data::U32(v.iter().map(|&$x| $u).collect()),
            )?,
            Data::U64(v) => Tensor::new(
                t.dtype,
                t.shape.clone(),
                Data::U64(v.iter().map(|&$x| $u).collect()),
            )?,
            _ => float_map!($cx, t, [], |$x| $body),
        }
    }};
}

/// The generic helper [`sign_f`] shares between the f32 and f64 bodies.
mod num_like {
    /// The float operations the generic helpers need.
    pub(super) trait F: Copy + PartialOrd {
        fn one() -> Self;
        fn zero() -> Self;
        fn neg(self) -> Self;
    }
    macro_rules! f {
        ($($t:ty),*) => {$(
            impl F for $t {
                fn one() -> Self { 1.0 }
                fn zero() -> Self { 0.0 }
                fn neg(self) -> Self { -self }
            }
        )*};
    }
    f!(f32, f64);
}

fn softplus_f32(x: f32) -> f32 {
    if x > 0.0 {
        x + (-x).exp().ln_1p()
    } else {
        x.exp().ln_1p()
    }
}

fn softplus_f64(x: f64) -> f64 {
    if x > 0.0 {
        x + (-x).exp().ln_1p()
    } else {
        x.exp().ln_1p()
    }
}

/// Softplus in the compute type.
trait Softplus {
    fn softplus(self) -> Self;
}
impl Softplus for f32 {
    fn softplus(self) -> Self {
        softplus_f32(self)
    }
}
impl Softplus for f64 {
    fn softplus(self) -> Self {
        softplus_f64(self)
    }
}

fn sign_f<T: num_like::F>(x: T) -> T {
    if x > T::zero() {
        T::one()
    } else if x < T::zero() {
        T::one().neg()
    } else {
        // 0, -0 and NaN stay as they are.
        x
    }
}

fn clip_slice<T: PartialOrd + Copy>(v: &[T], lo: Option<T>, hi: Option<T>) -> Vec<T> {
    v.iter()
        .map(|&x| {
            let y = match lo {
                Some(l) if x < l => l,
                _ => x,
            };
            match hi {
                Some(h) if y > h => h,
                _ => y,
            }
        })
        .collect()
}

fn clip(cx: &OpCtx<'_>, op: &Op, inputs: &[Option<RtValue>]) -> Result<Tensor, KernelError> {
    let x = tensor(cx, inputs, 0)?;
    if cx.opset < 11 {
        let Op::Clip { min, max } = op else {
            return Err(cx.invalid("not a Clip node"));
        };
        let lo = f64::from(min.unwrap_or(f32::NEG_INFINITY));
        let hi = f64::from(max.unwrap_or(f32::INFINITY));
        return Ok(float_map!(cx, x, [lo, hi], |v| {
            let y = if v < lo { lo } else { v };
            if y > hi { hi } else { y }
        }));
    }
    let (lo_t, hi_t) = (opt_tensor(inputs, 1), opt_tensor(inputs, 2));
    for b in [lo_t, hi_t].into_iter().flatten() {
        if b.dtype != x.dtype {
            return Err(cx.invalid(format!(
                "min/max dtype {} differs from the input's {}",
                b.dtype, x.dtype
            )));
        }
        if b.len() > 1 {
            return Err(cx.invalid(format!("min/max must be scalars, got shape {:?}", b.shape)));
        }
    }
    macro_rules! arms {
        ($($v:ident),*) => {
            match &x.data {
                $(Data::$v(v) => {
                    let bound = |b: Option<&std::sync::Arc<Tensor>>| match b.map(|t| &t.data) {
                        Some(Data::$v(m)) => m.first().copied(),
                        _ => None,
                    };
                    Data::$v(clip_slice(v, bound(lo_t), bound(hi_t)))
                })*
                _ => return Err(cx.unsupported(format!("Clip of {} tensors", x.dtype))),
            }
        };
    }
    let data = arms!(U8, I8, U16, I16, U32, I32, U64, I64, F16, BF16, F32, F64);
    Tensor::new(x.dtype, x.shape.clone(), data)
}

fn bool_of(cx: &OpCtx<'_>, inputs: &[Option<RtValue>], f: impl Fn(f64) -> bool) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    if !x.dtype.is_float() {
        return Err(cx.unsupported(format!("dtype {} is not supported", x.dtype)));
    }
    let v: Vec<bool> = match &x.data {
        Data::F32(v) => v.iter().map(|&e| f(f64::from(e))).collect(),
        _ => x.to_f64()?.into_iter().map(f).collect(),
    };
    single(Tensor::new(DType::Bool, x.shape.clone(), Data::Bool(v))?)
}

fn unary(cx: &OpCtx<'_>, op: &Op, inputs: &[Option<RtValue>]) -> Result<Tensor, KernelError> {
    let t: &Tensor = tensor(cx, inputs, 0)?;
    Ok(match op {
        Op::Neg {} => {
            num_map!(cx, t, |x| float: -x, signed: x.wrapping_neg(), unsigned: x.wrapping_neg())
        }
        Op::Abs {} => num_map!(cx, t, |x| float: x.abs(), signed: x.wrapping_abs(), unsigned: x),
        Op::Sign {} => {
            num_map!(cx, t, |x| float: sign_f(x), signed: x.signum(), unsigned: x.min(1))
        }
        Op::Relu {} => {
            num_map!(cx, t, |x| float: if x > 0.0 || x.is_nan() { x } else { 0.0 }, signed: x.max(0), unsigned: x)
        }
        Op::Sqrt {} => float_map!(cx, t, [], |x| x.sqrt()),
        Op::Exp {} => float_map!(cx, t, [], |x| x.expv()),
        Op::Log {} => float_map!(cx, t, [], |x| x.ln()),
        Op::Reciprocal {} => float_map!(cx, t, [], |x| 1.0 / x),
        Op::Floor {} => float_map!(cx, t, [], |x| x.floor()),
        Op::Ceil {} => float_map!(cx, t, [], |x| x.ceil()),
        Op::Round {} => float_map!(cx, t, [], |x| x.round_ties_even()),
        Op::Sin {} => float_map!(cx, t, [], |x| x.sin()),
        Op::Cos {} => float_map!(cx, t, [], |x| x.cos()),
        Op::Tan {} => float_map!(cx, t, [], |x| x.tan()),
        Op::Asin {} => float_map!(cx, t, [], |x| x.asin()),
        Op::Acos {} => float_map!(cx, t, [], |x| x.acos()),
        Op::Atan {} => float_map!(cx, t, [], |x| x.atan()),
        Op::Sinh {} => float_map!(cx, t, [], |x| x.sinh()),
        Op::Cosh {} => float_map!(cx, t, [], |x| x.cosh()),
        Op::Asinh {} => float_map!(cx, t, [], |x| x.asinh()),
        Op::Acosh {} => float_map!(cx, t, [], |x| x.acosh()),
        Op::Atanh {} => float_map!(cx, t, [], |x| x.atanh()),
        Op::Tanh {} => float_map!(cx, t, [], |x| x.tanhv()),
        Op::Sigmoid {} => float_map!(cx, t, [], |x| x.sigmoidv()),
        Op::Erf {} => float_map!(cx, t, [], |x| x.erfv()),
        Op::LeakyRelu { alpha } => {
            let alpha = f64::from(alpha.unwrap_or(0.01));
            float_map!(cx, t, [alpha], |x| if x < 0.0 { alpha * x } else { x })
        }
        Op::Elu { alpha } => {
            let alpha = f64::from(alpha.unwrap_or(1.0));
            float_map!(cx, t, [alpha], |x| if x < 0.0 {
                alpha * (x.expv() - 1.0)
            } else {
                x
            })
        }
        Op::Selu { alpha, gamma } => {
            let alpha = f64::from(alpha.unwrap_or(1.673_263_2));
            let gamma = f64::from(gamma.unwrap_or(1.050_701));
            float_map!(cx, t, [alpha, gamma], |x| if x > 0.0 {
                gamma * x
            } else {
                gamma * (alpha * x.expv() - alpha)
            })
        }
        Op::Celu { alpha } => {
            let alpha = f64::from(alpha.unwrap_or(1.0));
            float_map!(cx, t, [alpha], |x| x.max(0.0)
                + (alpha * ((x / alpha).expv() - 1.0)).min(0.0))
        }
        Op::Gelu { approximate } => match approximate.as_deref().unwrap_or("none") {
            "none" => {
                let r = std::f64::consts::FRAC_1_SQRT_2;
                float_map!(cx, t, [r], |x| 0.5 * x * (1.0 + (x * r).erfv()))
            }
            "tanh" => {
                let k = (2.0 / std::f64::consts::PI).sqrt();
                float_map!(cx, t, [k], |x| 0.5
                    * x
                    * (1.0 + (k * (x + 0.044715 * x * x * x)).tanhv()))
            }
            a => return Err(cx.invalid(format!("approximate must be none or tanh, got '{a}'"))),
        },
        Op::HardSigmoid { alpha, beta } => {
            let alpha = f64::from(alpha.unwrap_or(0.2));
            let beta = f64::from(beta.unwrap_or(0.5));
            float_map!(cx, t, [alpha, beta], |x| (alpha * x + beta).clamp(0.0, 1.0))
        }
        Op::HardSwish {} => {
            let sixth = 1.0 / 6.0;
            float_map!(cx, t, [sixth], |x| x * (x * sixth + 0.5).clamp(0.0, 1.0))
        }
        Op::Softplus {} => float_map!(cx, t, [], |x| x.softplus()),
        Op::Softsign {} => float_map!(cx, t, [], |x| x / (1.0 + x.abs())),
        Op::Mish {} => float_map!(cx, t, [], |x| x * x.softplus().tanh()),
        Op::ThresholdedRelu { alpha } => {
            let alpha = f64::from(alpha.unwrap_or(1.0));
            float_map!(cx, t, [alpha], |x| if x > alpha { x } else { 0.0 })
        }
        Op::Swish { alpha } => {
            let alpha = f64::from(alpha.unwrap_or(1.0));
            float_map!(cx, t, [alpha], |x| x * (alpha * x).sigmoidv())
        }
        Op::Not {} => match &t.data {
            Data::Bool(v) => Tensor::new(
                DType::Bool,
                t.shape.clone(),
                Data::Bool(v.iter().map(|b| !b).collect()),
            )?,
            _ => return Err(cx.invalid(format!("operand must be bool, got {}", t.dtype))),
        },
        Op::BitwiseNot {} => {
            let data = match &t.data {
                Data::Bool(v) => Data::Bool(v.iter().map(|b| !b).collect()),
                Data::U8(v) => Data::U8(v.iter().map(|b| !b).collect()),
                Data::I8(v) => Data::I8(v.iter().map(|b| !b).collect()),
                Data::U16(v) => Data::U16(v.iter().map(|b| !b).collect()),
                Data::I16(v) => Data::I16(v.iter().map(|b| !b).collect()),
                Data::U32(v) => Data::U32(v.iter().map(|b| !b).collect()),
                Data::I32(v) => Data::I32(v.iter().map(|b| !b).collect()),
                Data::U64(v) => Data::U64(v.iter().map(|b| !b).collect()),
                Data::I64(v) => Data::I64(v.iter().map(|b| !b).collect()),
                _ => return Err(cx.unsupported(format!("dtype {} is not supported", t.dtype))),
            };
            Tensor::new(t.dtype, t.shape.clone(), data)?
        }
        _ => return Err(cx.invalid("not a unary op")),
    })
}

/// Runs the node when it is one of this module's ops.
pub(super) fn eval(cx: &OpCtx<'_>, op: &Op, inputs: &[Option<RtValue>]) -> Option<OpResult> {
    Some(match op {
        Op::Neg {}
        | Op::Abs {}
        | Op::Sign {}
        | Op::Relu {}
        | Op::Sqrt {}
        | Op::Exp {}
        | Op::Log {}
        | Op::Reciprocal {}
        | Op::Floor {}
        | Op::Ceil {}
        | Op::Round {}
        | Op::Sin {}
        | Op::Cos {}
        | Op::Tan {}
        | Op::Asin {}
        | Op::Acos {}
        | Op::Atan {}
        | Op::Sinh {}
        | Op::Cosh {}
        | Op::Asinh {}
        | Op::Acosh {}
        | Op::Atanh {}
        | Op::Tanh {}
        | Op::Sigmoid {}
        | Op::Erf {}
        | Op::LeakyRelu { .. }
        | Op::Elu { .. }
        | Op::Selu { .. }
        | Op::Celu { .. }
        | Op::Gelu { .. }
        | Op::HardSigmoid { .. }
        | Op::HardSwish {}
        | Op::Softplus {}
        | Op::Softsign {}
        | Op::Mish {}
        | Op::ThresholdedRelu { .. }
        | Op::Swish { .. }
        | Op::Not {}
        | Op::BitwiseNot {} => unary(cx, op, inputs).and_then(single),
        Op::Clip { .. } => clip(cx, op, inputs).and_then(single),
        Op::IsNaN {} => bool_of(cx, inputs, f64::is_nan),
        Op::IsInf {
            detect_negative,
            detect_positive,
        } => {
            let (neg, pos) = (
                detect_negative.unwrap_or(1) != 0,
                detect_positive.unwrap_or(1) != 0,
            );
            bool_of(cx, inputs, move |x| {
                x.is_infinite() && ((x > 0.0 && pos) || (x < 0.0 && neg))
            })
        }
        _ => return None,
    })
}
