//! Broadcasting binary and variadic ops: arithmetic, `Pow`, `Mod`, `Min`/`Max`/`Sum`/`Mean`,
//! bit ops, comparisons, logic, `Where`, `PRelu`.

use half::{bf16, f16};
use mmq_ir::{DType, Op};

use super::single;
use crate::error::KernelError;
use crate::ops::util::{broadcast_indices, broadcast_shapes, tensor};
use crate::ops::{OpCtx, OpResult};
use crate::tensor::{Data, RtValue, Tensor};

/// How the two operands of a binary op map onto the output.
#[derive(Debug)]
enum Kind {
    /// Equal shapes: element `i` of both operands.
    Same,
    /// The first operand has one element.
    AScalar,
    /// The second operand has one element.
    BScalar,
    /// General broadcast over merged dims: sizes and the operands' strides (0 = broadcast).
    General {
        dims: Vec<usize>,
        sa: Vec<usize>,
        sb: Vec<usize>,
    },
}

/// A broadcast plan for two shapes.
#[derive(Debug)]
pub(super) struct Plan {
    /// The output shape.
    pub(super) shape: Vec<usize>,
    kind: Kind,
}

/// The plan for operands of shapes `a` and `b`; an error when they do not broadcast.
pub(super) fn plan(cx: &OpCtx<'_>, a: &[usize], b: &[usize]) -> Result<Plan, KernelError> {
    let shape = broadcast_shapes(&[a, b])
        .ok_or_else(|| cx.invalid(format!("shapes {a:?} and {b:?} do not broadcast")))?;
    let n: usize = shape.iter().product();
    let (na, nb): (usize, usize) = (a.iter().product(), b.iter().product());
    let kind = if a == b || (na == n && nb == n) {
        Kind::Same
    } else if na == 1 && nb == n {
        Kind::AScalar
    } else if nb == 1 && na == n {
        Kind::BScalar
    } else {
        let r = shape.len();
        let stride_of = |s: &[usize]| -> Vec<usize> {
            let off = r - s.len();
            let mut st = vec![0usize; r];
            let mut acc = 1usize;
            for i in (0..s.len()).rev() {
                st[off + i] = if s[i] == 1 { 0 } else { acc };
                acc *= s[i];
            }
            st
        };
        let (fa, fb) = (stride_of(a), stride_of(b));
        let (mut dims, mut sa, mut sb) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..r {
            if shape[i] == 1 {
                continue;
            }
            if let (Some(&d), Some(&pa), Some(&pb)) = (dims.last(), sa.last(), sb.last())
                && pa == fa[i] * shape[i]
                && pb == fb[i] * shape[i]
            {
                let k = dims.len() - 1;
                dims[k] = d * shape[i];
                sa[k] = fa[i];
                sb[k] = fb[i];
                continue;
            }
            dims.push(shape[i]);
            sa.push(fa[i]);
            sb.push(fb[i]);
        }
        if dims.is_empty() {
            Kind::Same
        } else {
            Kind::General { dims, sa, sb }
        }
    };
    Ok(Plan { shape, kind })
}

/// Applies `f` to every pair of broadcast elements, in output order.
pub(super) fn zip<A, B, O>(p: &Plan, a: &[A], b: &[B], f: impl Fn(&A, &B) -> O) -> Vec<O> {
    match &p.kind {
        Kind::Same => a.iter().zip(b).map(|(x, y)| f(x, y)).collect(),
        Kind::AScalar => match a.first() {
            Some(x) => b.iter().map(|y| f(x, y)).collect(),
            None => Vec::new(),
        },
        Kind::BScalar => match b.first() {
            Some(y) => a.iter().map(|x| f(x, y)).collect(),
            None => Vec::new(),
        },
        Kind::General { dims, sa, sb } => {
            let n: usize = dims.iter().product();
            let mut out = Vec::with_capacity(n);
            if n == 0 {
                return out;
            }
            let r = dims.len();
            let (last, la, lb) = (dims[r - 1], sa[r - 1], sb[r - 1]);
            let mut idx = vec![0usize; r];
            let (mut ia, mut ib) = (0usize, 0usize);
            loop {
                match (la, lb) {
                    (1, 1) => out.extend(
                        a[ia..ia + last]
                            .iter()
                            .zip(&b[ib..ib + last])
                            .map(|(x, y)| f(x, y)),
                    ),
                    (0, 1) => {
                        let x = &a[ia];
                        out.extend(b[ib..ib + last].iter().map(|y| f(x, y)));
                    }
                    (1, 0) => {
                        let y = &b[ib];
                        out.extend(a[ia..ia + last].iter().map(|x| f(x, y)));
                    }
                    _ => out.extend((0..last).map(|k| f(&a[ia + k * la], &b[ib + k * lb]))),
                }
                let mut d = r - 1;
                loop {
                    if d == 0 {
                        return out;
                    }
                    d -= 1;
                    idx[d] += 1;
                    ia += sa[d];
                    ib += sb[d];
                    if idx[d] < dims[d] {
                        break;
                    }
                    ia -= sa[d] * dims[d];
                    ib -= sb[d] * dims[d];
                    idx[d] = 0;
                }
            }
        }
    }
}

/// Element arithmetic with ONNX semantics (integers wrap; division truncates).
pub(super) trait Arith: Copy + PartialOrd {
    fn add(&self, o: &Self) -> Self;
    fn sub(&self, o: &Self) -> Self;
    fn mul(&self, o: &Self) -> Self;
    /// Division; callers reject integer zero divisors first.
    fn div(&self, o: &Self) -> Self;
    /// Remainder with the sign of the divisor (`Mod`, fmod=0).
    fn rem_floor(&self, o: &Self) -> Self;
    /// Remainder with the sign of the dividend (C `fmod`).
    fn rem_trunc(&self, o: &Self) -> Self;
    /// Maximum, propagating NaN.
    fn maxv(&self, o: &Self) -> Self;
    /// Minimum, propagating NaN.
    fn minv(&self, o: &Self) -> Self;
    /// Whether this is an integer zero (an invalid divisor).
    fn int_zero(&self) -> bool;
    /// Zero.
    fn zero() -> Self;
    /// `self / n` for `Mean`.
    fn div_count(&self, n: usize) -> Self;
}

macro_rules! arith_int {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            fn add(&self, o: &Self) -> Self { self.wrapping_add(*o) }
            fn sub(&self, o: &Self) -> Self { self.wrapping_sub(*o) }
            fn mul(&self, o: &Self) -> Self { self.wrapping_mul(*o) }
            fn div(&self, o: &Self) -> Self { if *o == 0 { 0 } else { self.wrapping_div(*o) } }
            fn rem_floor(&self, o: &Self) -> Self {
                if *o == 0 {
                    return 0;
                }
                let r = self.wrapping_rem(*o);
                #[allow(unused_comparisons, reason = "shared by signed and unsigned types")]
                let flip = r != 0 && ((r < 0) != (*o < 0));
                if flip { r.wrapping_add(*o) } else { r }
            }
            fn rem_trunc(&self, o: &Self) -> Self { if *o == 0 { 0 } else { self.wrapping_rem(*o) } }
            fn maxv(&self, o: &Self) -> Self { if self >= o { *self } else { *o } }
            fn minv(&self, o: &Self) -> Self { if self <= o { *self } else { *o } }
            fn int_zero(&self) -> bool { *self == 0 }
            fn zero() -> Self { 0 }
            fn div_count(&self, n: usize) -> Self { self.wrapping_div(n.max(1) as $t) }
        }
    )*};
}
arith_int!(u8, i8, u16, i16, u32, i32, u64, i64);

macro_rules! arith_float {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            fn add(&self, o: &Self) -> Self { self + o }
            fn sub(&self, o: &Self) -> Self { self - o }
            fn mul(&self, o: &Self) -> Self { self * o }
            fn div(&self, o: &Self) -> Self { self / o }
            fn rem_floor(&self, o: &Self) -> Self {
                let r = self % o;
                if r == 0.0 {
                    <$t>::copysign(0.0, *o)
                } else if (r < 0.0) != (*o < 0.0) { r + o } else { r }
            }
            fn rem_trunc(&self, o: &Self) -> Self { self % o }
            fn maxv(&self, o: &Self) -> Self {
                if self.is_nan() || o.is_nan() { <$t>::NAN } else if self >= o { *self } else { *o }
            }
            fn minv(&self, o: &Self) -> Self {
                if self.is_nan() || o.is_nan() { <$t>::NAN } else if self <= o { *self } else { *o }
            }
            fn int_zero(&self) -> bool { false }
            fn zero() -> Self { 0.0 }
            fn div_count(&self, n: usize) -> Self { self / n as $t }
        }
    )*};
}
arith_float!(f32, f64);

macro_rules! arith_half {
    ($($t:ty),*) => {$(
        impl Arith for $t {
            fn add(&self, o: &Self) -> Self { <$t>::from_f32(self.to_f32() + o.to_f32()) }
            fn sub(&self, o: &Self) -> Self { <$t>::from_f32(self.to_f32() - o.to_f32()) }
            fn mul(&self, o: &Self) -> Self { <$t>::from_f32(self.to_f32() * o.to_f32()) }
            fn div(&self, o: &Self) -> Self { <$t>::from_f32(self.to_f32() / o.to_f32()) }
            fn rem_floor(&self, o: &Self) -> Self {
                <$t>::from_f32(self.to_f32().rem_floor(&o.to_f32()))
            }
            fn rem_trunc(&self, o: &Self) -> Self { <$t>::from_f32(self.to_f32() % o.to_f32()) }
            fn maxv(&self, o: &Self) -> Self { <$t>::from_f32(self.to_f32().maxv(&o.to_f32())) }
            fn minv(&self, o: &Self) -> Self { <$t>::from_f32(self.to_f32().minv(&o.to_f32())) }
            fn int_zero(&self) -> bool { false }
            fn zero() -> Self { <$t>::ZERO }
            fn div_count(&self, n: usize) -> Self { <$t>::from_f32(self.to_f32() / n as f32) }
        }
    )*};
}
arith_half!(f16, bf16);

/// Matches two storages of the same arithmetic variant, binding their vectors to `$x`, `$y`; the
/// body yields a `Vec` of the same element type, wrapped back into that variant.
macro_rules! same_arith {
    ($a:expr, $b:expr, $x:ident, $y:ident => $body:expr, else $other:expr) => {
        match ($a, $b) {
            (Data::U8($x), Data::U8($y)) => Data::U8($body),
            (Data::I8($x), Data::I8($y)) => Data::I8($body),
            (Data::U16($x), Data::U16($y)) => Data::U16($body),
            (Data::I16($x), Data::I16($y)) => Data::I16($body),
            (Data::U32($x), Data::U32($y)) => Data::U32($body),
            (Data::I32($x), Data::I32($y)) => Data::I32($body),
            (Data::U64($x), Data::U64($y)) => Data::U64($body),
            (Data::I64($x), Data::I64($y)) => Data::I64($body),
            (Data::F16($x), Data::F16($y)) => Data::F16($body),
            (Data::BF16($x), Data::BF16($y)) => Data::BF16($body),
            (Data::F32($x), Data::F32($y)) => Data::F32($body),
            (Data::F64($x), Data::F64($y)) => Data::F64($body),
            _ => $other,
        }
    };
}

/// Matches two storages of the same variant (any numeric type, bool, string); the body yields a
/// value of one type for every arm.
macro_rules! same_any {
    ($a:expr, $b:expr, $x:ident, $y:ident => $body:expr, else $other:expr) => {
        match ($a, $b) {
            (Data::Bool($x), Data::Bool($y)) => $body,
            (Data::U8($x), Data::U8($y)) => $body,
            (Data::I8($x), Data::I8($y)) => $body,
            (Data::U16($x), Data::U16($y)) => $body,
            (Data::I16($x), Data::I16($y)) => $body,
            (Data::U32($x), Data::U32($y)) => $body,
            (Data::I32($x), Data::I32($y)) => $body,
            (Data::U64($x), Data::U64($y)) => $body,
            (Data::I64($x), Data::I64($y)) => $body,
            (Data::F16($x), Data::F16($y)) => $body,
            (Data::BF16($x), Data::BF16($y)) => $body,
            (Data::F32($x), Data::F32($y)) => $body,
            (Data::F64($x), Data::F64($y)) => $body,
            (Data::Str($x), Data::Str($y)) => $body,
            _ => $other,
        }
    };
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum AOp {
    Add,
    Sub,
    Mul,
    Div,
    ModFloor,
    ModTrunc,
    Max,
    Min,
    PRelu,
}

fn arith<T: Arith>(
    cx: &OpCtx<'_>,
    p: &Plan,
    op: AOp,
    a: &[T],
    b: &[T],
) -> Result<Vec<T>, KernelError> {
    if matches!(op, AOp::Div | AOp::ModFloor | AOp::ModTrunc) && b.iter().any(Arith::int_zero) {
        return Err(cx.invalid("integer division by zero"));
    }
    Ok(match op {
        AOp::Add => zip(p, a, b, T::add),
        AOp::Sub => zip(p, a, b, T::sub),
        AOp::Mul => zip(p, a, b, T::mul),
        AOp::Div => zip(p, a, b, T::div),
        AOp::ModFloor => zip(p, a, b, T::rem_floor),
        AOp::ModTrunc => zip(p, a, b, T::rem_trunc),
        AOp::Max => zip(p, a, b, T::maxv),
        AOp::Min => zip(p, a, b, T::minv),
        AOp::PRelu => {
            let z = T::zero();
            zip(p, a, b, |x, s| if *x < z { x.mul(s) } else { *x })
        }
    })
}

fn type_mismatch(cx: &OpCtx<'_>, a: &Tensor, b: &Tensor) -> KernelError {
    if a.dtype != b.dtype {
        cx.invalid(format!(
            "operand dtypes differ: {} and {}",
            a.dtype, b.dtype
        ))
    } else {
        cx.unsupported(format!("dtype {} is not supported", a.dtype))
    }
}

/// `a op b` for two tensors of one arithmetic dtype, broadcasting.
fn arith_tensors(cx: &OpCtx<'_>, op: AOp, a: &Tensor, b: &Tensor) -> Result<Tensor, KernelError> {
    let p = plan(cx, &a.shape, &b.shape)?;
    let data = same_arith!(&a.data, &b.data, x, y => arith(cx, &p, op, x, y)?,
        else return Err(type_mismatch(cx, a, b)));
    Tensor::new(a.dtype, p.shape, data)
}

fn operand_tensors<'a>(
    cx: &OpCtx<'_>,
    inputs: &'a [Option<RtValue>],
) -> Result<Vec<&'a Tensor>, KernelError> {
    let mut v = Vec::with_capacity(inputs.len());
    for i in 0..inputs.len() {
        v.push(tensor(cx, inputs, i)?.as_ref());
    }
    if v.is_empty() {
        return Err(cx.invalid("needs at least one operand"));
    }
    Ok(v)
}

fn variadic(cx: &OpCtx<'_>, op: AOp, inputs: &[Option<RtValue>], mean: bool) -> OpResult {
    let ts = operand_tensors(cx, inputs)?;
    if ts.len() == 1 && !mean {
        return Ok(vec![inputs[0].clone()]);
    }
    let mut acc = ts[0].clone();
    for t in &ts[1..] {
        acc = arith_tensors(cx, op, &acc, t)?;
    }
    if mean {
        let n = ts.len();
        acc.data = match &acc.data {
            Data::F16(v) => Data::F16(v.iter().map(|x| x.div_count(n)).collect()),
            Data::BF16(v) => Data::BF16(v.iter().map(|x| x.div_count(n)).collect()),
            Data::F32(v) => Data::F32(v.iter().map(|x| x.div_count(n)).collect()),
            Data::F64(v) => Data::F64(v.iter().map(|x| x.div_count(n)).collect()),
            _ => return Err(cx.unsupported(format!("Mean of {} tensors", acc.dtype))),
        };
    }
    single(acc)
}

#[derive(Clone, Copy)]
enum Cmp {
    Eq,
    Lt,
    Gt,
    Le,
    Ge,
}

fn compare<T: PartialOrd>(p: &Plan, c: Cmp, a: &[T], b: &[T]) -> Vec<bool> {
    match c {
        Cmp::Eq => zip(p, a, b, |x, y| x == y),
        Cmp::Lt => zip(p, a, b, |x, y| x < y),
        Cmp::Gt => zip(p, a, b, |x, y| x > y),
        Cmp::Le => zip(p, a, b, |x, y| x <= y),
        Cmp::Ge => zip(p, a, b, |x, y| x >= y),
    }
}

fn compare_op(cx: &OpCtx<'_>, c: Cmp, inputs: &[Option<RtValue>]) -> OpResult {
    let (a, b) = (tensor(cx, inputs, 0)?, tensor(cx, inputs, 1)?);
    let p = plan(cx, &a.shape, &b.shape)?;
    let v = same_any!(&a.data, &b.data, x, y => compare(&p, c, x, y),
    else {
        match (&a.data, &b.data) {
            (Data::Codes(x), Data::Codes(y)) if a.dtype == b.dtype => {
                let (fx, fy) = (a.to_f32()?, b.to_f32()?);
                let _ = (x, y);
                compare(&p, c, &fx, &fy)
            }
            _ => return Err(type_mismatch(cx, a, b)),
        }
    });
    single(Tensor::new(DType::Bool, p.shape, Data::Bool(v))?)
}

fn logic(cx: &OpCtx<'_>, op: &Op, inputs: &[Option<RtValue>]) -> OpResult {
    let (a, b) = (tensor(cx, inputs, 0)?, tensor(cx, inputs, 1)?);
    let p = plan(cx, &a.shape, &b.shape)?;
    let (Data::Bool(x), Data::Bool(y)) = (&a.data, &b.data) else {
        return Err(cx.invalid(format!(
            "operands must be bool, got {} and {}",
            a.dtype, b.dtype
        )));
    };
    let v = match op {
        Op::And {} => zip(&p, x, y, |x, y| *x && *y),
        Op::Or {} => zip(&p, x, y, |x, y| *x || *y),
        _ => zip(&p, x, y, |x, y| x != y),
    };
    single(Tensor::new(DType::Bool, p.shape, Data::Bool(v))?)
}

/// Integer bit operations.
trait Bits: Copy {
    fn and(&self, o: &Self) -> Self;
    fn or(&self, o: &Self) -> Self;
    fn xor(&self, o: &Self) -> Self;
    fn shl(&self, o: &Self) -> Self;
    fn shr(&self, o: &Self) -> Self;
}

macro_rules! bits {
    ($($t:ty),*) => {$(
        impl Bits for $t {
            fn and(&self, o: &Self) -> Self { self & o }
            fn or(&self, o: &Self) -> Self { self | o }
            fn xor(&self, o: &Self) -> Self { self ^ o }
            fn shl(&self, o: &Self) -> Self {
                u32::try_from(*o).ok().and_then(|s| self.checked_shl(s)).unwrap_or(0)
            }
            fn shr(&self, o: &Self) -> Self {
                #[allow(unused_comparisons, reason = "shared by signed and unsigned types")]
                let fill = if *self < 0 { !0 } else { 0 };
                u32::try_from(*o).ok().and_then(|s| self.checked_shr(s)).unwrap_or(fill)
            }
        }
    )*};
}
bits!(u8, i8, u16, i16, u32, i32, u64, i64);

fn bit_op<T: Bits>(p: &Plan, op: &Op, a: &[T], b: &[T]) -> Vec<T> {
    match op {
        Op::BitwiseAnd {} => zip(p, a, b, T::and),
        Op::BitwiseOr {} => zip(p, a, b, T::or),
        Op::BitwiseXor {} => zip(p, a, b, T::xor),
        Op::BitShift { direction } if direction.as_deref() == Some("LEFT") => zip(p, a, b, T::shl),
        _ => zip(p, a, b, T::shr),
    }
}

fn bits_tensors(cx: &OpCtx<'_>, op: &Op, inputs: &[Option<RtValue>]) -> OpResult {
    let (a, b) = (tensor(cx, inputs, 0)?, tensor(cx, inputs, 1)?);
    if let Op::BitShift { direction } = op {
        match direction.as_deref() {
            Some("LEFT" | "RIGHT") => {}
            d => return Err(cx.invalid(format!("direction must be LEFT or RIGHT, got {d:?}"))),
        }
    }
    let p = plan(cx, &a.shape, &b.shape)?;
    let data = match (&a.data, &b.data) {
        (Data::U8(x), Data::U8(y)) => Data::U8(bit_op(&p, op, x, y)),
        (Data::I8(x), Data::I8(y)) => Data::I8(bit_op(&p, op, x, y)),
        (Data::U16(x), Data::U16(y)) => Data::U16(bit_op(&p, op, x, y)),
        (Data::I16(x), Data::I16(y)) => Data::I16(bit_op(&p, op, x, y)),
        (Data::U32(x), Data::U32(y)) => Data::U32(bit_op(&p, op, x, y)),
        (Data::I32(x), Data::I32(y)) => Data::I32(bit_op(&p, op, x, y)),
        (Data::U64(x), Data::U64(y)) => Data::U64(bit_op(&p, op, x, y)),
        (Data::I64(x), Data::I64(y)) => Data::I64(bit_op(&p, op, x, y)),
        (Data::Bool(x), Data::Bool(y)) if !matches!(op, Op::BitShift { .. }) => {
            Data::Bool(match op {
                Op::BitwiseAnd {} => zip(&p, x, y, |x, y| *x & *y),
                Op::BitwiseOr {} => zip(&p, x, y, |x, y| *x | *y),
                _ => zip(&p, x, y, |x, y| *x ^ *y),
            })
        }
        _ => return Err(type_mismatch(cx, a, b)),
    };
    single(Tensor::new(a.dtype, p.shape, data)?)
}

fn pow(cx: &OpCtx<'_>, inputs: &[Option<RtValue>]) -> OpResult {
    let (a, b) = (tensor(cx, inputs, 0)?, tensor(cx, inputs, 1)?);
    let p = plan(cx, &a.shape, &b.shape)?;
    if let (Data::F32(x), Data::F32(y)) = (&a.data, &b.data) {
        let v = if y.len() == 1 && y[0] == 2.0 {
            zip(&p, x, y, |x, _| x * x)
        } else {
            zip(&p, x, y, |x, y| x.powf(*y))
        };
        return single(Tensor::new(DType::F32, p.shape, Data::F32(v))?);
    }
    if matches!(a.data, Data::Str(_) | Data::Bool(_)) || matches!(b.data, Data::Str(_)) {
        return Err(cx.unsupported(format!("Pow of {} by {}", a.dtype, b.dtype)));
    }
    if a.dtype.is_int()
        && b.dtype.is_int()
        && let (Ok(x), Ok(y)) = (a.to_i64(), b.to_i64())
    {
        let v = zip(&p, &x, &y, |x, y| {
            if *y < 0 {
                // numpy raises; match the float result truncated toward zero.
                (*x as f64).powf(*y as f64) as i64
            } else {
                x.wrapping_pow(u32::try_from(*y).unwrap_or(u32::MAX))
            }
        });
        let t = Tensor::from_i64(p.shape, v)?;
        let f = t.to_f64()?;
        // Narrow by wrapping like a C cast.
        return single(match a.dtype {
            DType::I64 => t,
            _ => narrow_int(a.dtype, &t, &f)?,
        });
    }
    let (x, y) = (a.to_f64()?, b.to_f64()?);
    let v = zip(&p, &x, &y, |x, y| x.powf(*y));
    single(Tensor::from_f64_as(a.dtype, p.shape, &v)?)
}

/// An i64 tensor narrowed to another integer dtype by wrapping.
fn narrow_int(dtype: DType, t: &Tensor, f: &[f64]) -> Result<Tensor, KernelError> {
    let Data::I64(v) = &t.data else {
        return Tensor::from_f64_as(dtype, t.shape.clone(), f);
    };
    let data = match dtype {
        DType::I32 => Data::I32(v.iter().map(|&x| x as i32).collect()),
        DType::I16 => Data::I16(v.iter().map(|&x| x as i16).collect()),
        DType::I8 => Data::I8(v.iter().map(|&x| x as i8).collect()),
        DType::U8 => Data::U8(v.iter().map(|&x| x as u8).collect()),
        DType::U16 => Data::U16(v.iter().map(|&x| x as u16).collect()),
        DType::U32 => Data::U32(v.iter().map(|&x| x as u32).collect()),
        DType::U64 => Data::U64(v.iter().map(|&x| x as u64).collect()),
        _ => return Tensor::from_f64_as(dtype, t.shape.clone(), f),
    };
    Tensor::new(dtype, t.shape.clone(), data)
}

fn gather<T: Clone>(v: &[T], idx: &[usize]) -> Vec<T> {
    idx.iter().map(|&i| v[i].clone()).collect()
}

fn where_op(cx: &OpCtx<'_>, inputs: &[Option<RtValue>]) -> OpResult {
    let (c, x, y) = (
        tensor(cx, inputs, 0)?,
        tensor(cx, inputs, 1)?,
        tensor(cx, inputs, 2)?,
    );
    let Data::Bool(cv) = &c.data else {
        return Err(cx.invalid(format!("condition must be bool, got {}", c.dtype)));
    };
    if x.dtype != y.dtype {
        return Err(type_mismatch(cx, x, y));
    }
    let shape = broadcast_shapes(&[&c.shape, &x.shape, &y.shape]).ok_or_else(|| {
        cx.invalid(format!(
            "shapes {:?}, {:?} and {:?} do not broadcast",
            c.shape, x.shape, y.shape
        ))
    })?;
    let same = c.shape == shape && x.shape == shape && y.shape == shape;
    let (ic, ix, iy) = if same {
        (Vec::new(), Vec::new(), Vec::new())
    } else {
        (
            broadcast_indices(&c.shape, &shape),
            broadcast_indices(&x.shape, &shape),
            broadcast_indices(&y.shape, &shape),
        )
    };
    macro_rules! pick {
        ($a:ident, $b:ident) => {
            if same {
                cv.iter()
                    .zip($a.iter().zip($b.iter()))
                    .map(|(&c, (a, b))| if c { a.clone() } else { b.clone() })
                    .collect()
            } else {
                let (ca, cb) = (gather(cv, &ic), gather($a, &ix));
                let cc = gather($b, &iy);
                ca.into_iter()
                    .zip(cb.into_iter().zip(cc))
                    .map(|(c, (a, b))| if c { a } else { b })
                    .collect()
            }
        };
    }
    let data = match (&x.data, &y.data) {
        (Data::Bool(a), Data::Bool(b)) => Data::Bool(pick!(a, b)),
        (Data::U8(a), Data::U8(b)) => Data::U8(pick!(a, b)),
        (Data::I8(a), Data::I8(b)) => Data::I8(pick!(a, b)),
        (Data::U16(a), Data::U16(b)) => Data::U16(pick!(a, b)),
        (Data::I16(a), Data::I16(b)) => Data::I16(pick!(a, b)),
        (Data::U32(a), Data::U32(b)) => Data::U32(pick!(a, b)),
        (Data::I32(a), Data::I32(b)) => Data::I32(pick!(a, b)),
        (Data::U64(a), Data::U64(b)) => Data::U64(pick!(a, b)),
        (Data::I64(a), Data::I64(b)) => Data::I64(pick!(a, b)),
        (Data::F16(a), Data::F16(b)) => Data::F16(pick!(a, b)),
        (Data::BF16(a), Data::BF16(b)) => Data::BF16(pick!(a, b)),
        (Data::F32(a), Data::F32(b)) => Data::F32(pick!(a, b)),
        (Data::F64(a), Data::F64(b)) => Data::F64(pick!(a, b)),
        (Data::Str(a), Data::Str(b)) => Data::Str(pick!(a, b)),
        (Data::Codes(a), Data::Codes(b)) => Data::Codes(pick!(a, b)),
        _ => return Err(type_mismatch(cx, x, y)),
    };
    single(Tensor::new(x.dtype, shape, data)?)
}

fn binary_arith(cx: &OpCtx<'_>, op: AOp, inputs: &[Option<RtValue>]) -> OpResult {
    let (a, b) = (tensor(cx, inputs, 0)?, tensor(cx, inputs, 1)?);
    if op == AOp::PRelu {
        let p = plan(cx, &a.shape, &b.shape)?;
        if p.shape != a.shape {
            return Err(cx.invalid(format!(
                "slope of shape {:?} does not broadcast to X of shape {:?}",
                b.shape, a.shape
            )));
        }
    }
    single(arith_tensors(cx, op, a, b)?)
}

/// Runs the node when it is one of this module's ops.
pub(super) fn eval(cx: &OpCtx<'_>, op: &Op, inputs: &[Option<RtValue>]) -> Option<OpResult> {
    Some(match op {
        Op::Add {} => binary_arith(cx, AOp::Add, inputs),
        Op::Sub {} => binary_arith(cx, AOp::Sub, inputs),
        Op::Mul {} => binary_arith(cx, AOp::Mul, inputs),
        Op::Div {} => binary_arith(cx, AOp::Div, inputs),
        Op::Mod { fmod } => {
            // fmod=0 on floats is Python's `%` (sign of the divisor), as the reference does.
            if fmod.unwrap_or(0) == 0 {
                binary_arith(cx, AOp::ModFloor, inputs)
            } else {
                binary_arith(cx, AOp::ModTrunc, inputs)
            }
        }
        Op::PRelu {} => binary_arith(cx, AOp::PRelu, inputs),
        Op::Pow {} => pow(cx, inputs),
        Op::Max {} => variadic(cx, AOp::Max, inputs, false),
        Op::Min {} => variadic(cx, AOp::Min, inputs, false),
        Op::Sum {} => variadic(cx, AOp::Add, inputs, false),
        Op::Mean {} => variadic(cx, AOp::Add, inputs, true),
        Op::Equal {} => compare_op(cx, Cmp::Eq, inputs),
        Op::Less {} => compare_op(cx, Cmp::Lt, inputs),
        Op::Greater {} => compare_op(cx, Cmp::Gt, inputs),
        Op::LessOrEqual {} => compare_op(cx, Cmp::Le, inputs),
        Op::GreaterOrEqual {} => compare_op(cx, Cmp::Ge, inputs),
        Op::And {} | Op::Or {} | Op::Xor {} => logic(cx, op, inputs),
        Op::BitwiseAnd {} | Op::BitwiseOr {} | Op::BitwiseXor {} | Op::BitShift { .. } => {
            bits_tensors(cx, op, inputs)
        }
        Op::Where {} => where_op(cx, inputs),
        _ => return None,
    })
}
