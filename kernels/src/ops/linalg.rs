//! Kernels: linear algebra, convolution, pooling, normalization and attention.
//!
//! Floating-point kernels are generic over [`Real`] (`f32`, `f64`): f16/bf16 operands are widened
//! to f32, computed, and rounded back once. Matrix products go through `matrixmultiply`.

#![allow(
    unsafe_code,
    reason = "matrixmultiply's GEMM takes raw pointers and strides"
)]

mod attention;
mod conv;
mod einsum;
mod integer;
mod norm;
mod pool;

use std::borrow::Cow;
use std::ops::{Add, AddAssign, Div, Mul, Neg, Sub};

use half::{bf16, f16};
use mmq_ir::{DType, Op};
use rayon::prelude::*;

use crate::error::KernelError;
use crate::ops::util::{broadcast_indices, broadcast_shapes, opt_tensor, tensor};
use crate::ops::{OpCtx, OpResult};
use crate::tensor::{Data, RtValue, Tensor};

/// Runs the node when it is one of this family's ops.
pub(crate) fn eval(cx: &OpCtx<'_>, inputs: &[Option<RtValue>]) -> Option<OpResult> {
    let r = match &cx.node.op {
        Op::MatMul {} => matmul_op(cx, inputs),
        Op::Gemm {
            alpha,
            beta,
            trans_a,
            trans_b,
        } => gemm_op(
            cx,
            inputs,
            alpha.unwrap_or(1.0),
            beta.unwrap_or(1.0),
            trans_a.unwrap_or(0) != 0,
            trans_b.unwrap_or(0) != 0,
        ),
        Op::Einsum { equation } => einsum::einsum_op(cx, inputs, equation.as_deref()),
        Op::MatMulInteger {} => integer::matmul_integer(cx, inputs),
        Op::QLinearMatMul {} => integer::qlinear_matmul(cx, inputs),
        Op::Conv { .. } => conv::conv_op(cx, inputs),
        Op::ConvInteger { .. } => integer::conv_integer(cx, inputs),
        Op::QLinearConv { .. } => integer::qlinear_conv(cx, inputs),
        Op::ConvTranspose { .. } => conv::conv_transpose_op(cx, inputs),
        Op::MaxPool { .. }
        | Op::AveragePool { .. }
        | Op::LpPool { .. }
        | Op::GlobalAveragePool {}
        | Op::GlobalMaxPool {}
        | Op::GlobalLpPool { .. } => pool::pool_op(cx, inputs),
        Op::BatchNormalization { .. }
        | Op::LayerNormalization { .. }
        | Op::InstanceNormalization { .. }
        | Op::GroupNormalization { .. }
        | Op::RMSNormalization { .. }
        | Op::LpNormalization { .. }
        | Op::LRN { .. }
        | Op::MeanVarianceNormalization { .. } => norm::norm_op(cx, inputs),
        Op::Attention { .. } => attention::attention_op(cx, inputs),
        Op::RotaryEmbedding { .. } => attention::rotary_op(cx, inputs),
        _ => return None,
    };
    Some(r)
}

/// A floating-point element type the kernels compute in.
pub(crate) trait Real:
    Copy
    + Default
    + PartialOrd
    + Send
    + Sync
    + std::fmt::Debug
    + 'static
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
{
    /// 0.
    const ZERO: Self;
    /// 1.
    const ONE: Self;
    /// -∞.
    const NEG_INF: Self;
    /// From f64 (rounding).
    fn from_f64(x: f64) -> Self;
    /// To f64.
    fn to_f64(self) -> f64;
    /// e^x.
    fn exp(self) -> Self;
    /// The tensor's elements in this type (borrowed when the storage already is).
    fn load(t: &Tensor) -> Result<Cow<'_, [Self]>, KernelError>;
    /// A tensor of `dtype` from values of this type (rounded once).
    fn store(dtype: DType, shape: Vec<usize>, v: Vec<Self>) -> Result<Tensor, KernelError>;
    /// Runs `f` with this thread's scratch vector of this type (its length is whatever the
    /// last user left: callers resize it). Kept between calls, so that a buffer every call
    /// overwrites (a convolution's im2col band) is not allocated and zero-filled each time.
    fn with_scratch<R>(f: impl FnOnce(&mut Vec<Self>) -> R) -> R;
    /// `C = alpha * A B + beta * C` with element strides; `beta == 0` ignores the old `C`.
    ///
    /// # Safety
    /// Every addressed element must lie inside the slices (checked by [`gemm`]).
    #[allow(clippy::too_many_arguments, reason = "BLAS-style signature")]
    unsafe fn gemm_raw(
        m: usize,
        k: usize,
        n: usize,
        alpha: Self,
        a: *const Self,
        rsa: isize,
        csa: isize,
        b: *const Self,
        rsb: isize,
        csb: isize,
        beta: Self,
        c: *mut Self,
        rsc: isize,
        csc: isize,
    );
}

macro_rules! real_impl {
    ($t:ty, $gemm:path) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const NEG_INF: Self = <$t>::NEG_INFINITY;
            fn from_f64(x: f64) -> Self {
                x as $t
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            fn load(t: &Tensor) -> Result<Cow<'_, [Self]>, KernelError> {
                load_as::<$t>(t)
            }
            fn store(dtype: DType, shape: Vec<usize>, v: Vec<Self>) -> Result<Tensor, KernelError> {
                store_from::<$t>(dtype, shape, v)
            }
            fn with_scratch<R>(f: impl FnOnce(&mut Vec<Self>) -> R) -> R {
                thread_local! {
                    static SCRATCH: std::cell::RefCell<Vec<$t>> = const {
                        std::cell::RefCell::new(Vec::new())
                    };
                }
                SCRATCH.with(|s| match s.try_borrow_mut() {
                    Ok(mut v) => f(&mut v),
                    // A nested user (none today) gets a fresh vector.
                    Err(_) => f(&mut Vec::new()),
                })
            }
            unsafe fn gemm_raw(
                m: usize,
                k: usize,
                n: usize,
                alpha: Self,
                a: *const Self,
                rsa: isize,
                csa: isize,
                b: *const Self,
                rsb: isize,
                csb: isize,
                beta: Self,
                c: *mut Self,
                rsc: isize,
                csc: isize,
            ) {
                // SAFETY: the caller guarantees every addressed element is in bounds.
                unsafe { $gemm(m, k, n, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc) }
            }
        }
    };
}
real_impl!(f32, matrixmultiply::sgemm);
real_impl!(f64, matrixmultiply::dgemm);

/// Elements of `t` as `T`; borrowed when the storage is already `T`.
fn load_as<T: Real>(t: &Tensor) -> Result<Cow<'_, [T]>, KernelError> {
    let any: &dyn std::any::Any = match &t.data {
        Data::F32(v) => v,
        Data::F64(v) => v,
        _ => &(),
    };
    if let Some(v) = any.downcast_ref::<Vec<T>>() {
        return Ok(Cow::Borrowed(v.as_slice()));
    }
    Ok(Cow::Owned(match &t.data {
        Data::F32(v) => v.iter().map(|&x| T::from_f64(f64::from(x))).collect(),
        Data::F16(v) => v.iter().map(|&x| T::from_f64(f64::from(x))).collect(),
        Data::BF16(v) => v.iter().map(|&x| T::from_f64(f64::from(x))).collect(),
        _ => t.to_f64()?.into_iter().map(T::from_f64).collect(),
    }))
}

/// A tensor of `dtype` from `T` values.
fn store_from<T: Real>(dtype: DType, shape: Vec<usize>, v: Vec<T>) -> Result<Tensor, KernelError> {
    let mut slot = Some(v);
    let any: &mut dyn std::any::Any = &mut slot;
    let data = match dtype {
        DType::F32 => match any.downcast_mut::<Option<Vec<f32>>>() {
            Some(s) => Data::F32(s.take().unwrap_or_default()),
            None => Data::F32(take(&mut slot).iter().map(|x| x.to_f64() as f32).collect()),
        },
        DType::F64 => match any.downcast_mut::<Option<Vec<f64>>>() {
            Some(s) => Data::F64(s.take().unwrap_or_default()),
            None => Data::F64(take(&mut slot).iter().map(|x| x.to_f64()).collect()),
        },
        DType::F16 => Data::F16(
            take(&mut slot)
                .iter()
                .map(|x| f16::from_f64(x.to_f64()))
                .collect(),
        ),
        DType::BF16 => Data::BF16(
            take(&mut slot)
                .iter()
                .map(|x| bf16::from_f64(x.to_f64()))
                .collect(),
        ),
        _ => {
            let v: Vec<f64> = take(&mut slot).iter().map(|x| x.to_f64()).collect();
            return Tensor::from_f64_as(dtype, shape, &v);
        }
    };
    Tensor::new(dtype, shape, data)
}

fn take<T>(slot: &mut Option<Vec<T>>) -> Vec<T> {
    slot.take().unwrap_or_default()
}

/// Whether f64 is the compute type for `dtype` (f32 otherwise).
pub(crate) fn wide(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::F64 | DType::I64 | DType::U64 | DType::I32 | DType::U32
    )
}

/// Whether `dtype` is a floating type the float kernels accept.
pub(crate) fn is_float(dtype: DType) -> bool {
    matches!(dtype, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
}

/// Whether `dtype` is a plain integer type.
pub(crate) fn is_int(dtype: DType) -> bool {
    use DType::*;
    matches!(dtype, I8 | U8 | I16 | U16 | I32 | U32 | I64 | U64)
}

/// Checks that every slice index `off + i*rs + j*cs` for `i < rows`, `j < cols` is below `len`.
fn fits(len: usize, off: usize, rows: usize, cols: usize, rs: usize, cs: usize) -> bool {
    rows == 0 || cols == 0 || off + (rows - 1) * rs + (cols - 1) * cs < len
}

/// Safe strided GEMM: `c[m×n] = alpha * a[m×k] b[k×n] + beta * c`.
#[allow(clippy::too_many_arguments, reason = "BLAS-style signature")]
pub(crate) fn gemm<T: Real>(
    m: usize,
    k: usize,
    n: usize,
    alpha: T,
    a: &[T],
    (rsa, csa): (usize, usize),
    b: &[T],
    (rsb, csb): (usize, usize),
    beta: T,
    c: &mut [T],
    (rsc, csc): (usize, usize),
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(fits(a.len(), 0, m, k, rsa, csa), "gemm: A out of bounds");
    assert!(fits(b.len(), 0, k, n, rsb, csb), "gemm: B out of bounds");
    assert!(fits(c.len(), 0, m, n, rsc, csc), "gemm: C out of bounds");
    // SAFETY: bounds are checked above.
    unsafe {
        T::gemm_raw(
            m,
            k,
            n,
            alpha,
            a.as_ptr(),
            rsa as isize,
            csa as isize,
            b.as_ptr(),
            rsb as isize,
            csb as isize,
            beta,
            c.as_mut_ptr(),
            rsc as isize,
            csc as isize,
        );
    }
}

/// Row-major `c[m×n] = a[m×k] · b[k×n]` (overwrites `c`), split over rows with rayon when large.
pub(crate) fn matmul_rows<T: Real>(m: usize, k: usize, n: usize, a: &[T], b: &[T], c: &mut [T]) {
    const BLOCK: usize = 64;
    if m * k * n >= 1 << 22 && m >= 2 * BLOCK && rayon::current_num_threads() > 1 {
        c.par_chunks_mut(BLOCK * n.max(1))
            .enumerate()
            .for_each(|(i, cc)| {
                let rows = cc.len() / n.max(1);
                let a0 = i * BLOCK * k;
                gemm(
                    rows,
                    k,
                    n,
                    T::ONE,
                    &a[a0..a0 + rows * k],
                    (k, 1),
                    b,
                    (n, 1),
                    T::ZERO,
                    cc,
                    (n, 1),
                );
            });
    } else {
        gemm(m, k, n, T::ONE, a, (k, 1), b, (n, 1), T::ZERO, c, (n, 1));
    }
}

/// Batched row-major matmul with numpy broadcasting of the batch dims (both operands at least
/// 2-D). Returns the output shape and data.
pub(crate) fn batched_matmul<T: Real>(
    a: &[T],
    ashape: &[usize],
    b: &[T],
    bshape: &[usize],
) -> Option<(Vec<usize>, Vec<T>)> {
    let (ra, rb) = (ashape.len(), bshape.len());
    let (m, k) = (ashape[ra - 2], ashape[ra - 1]);
    let (k2, n) = (bshape[rb - 2], bshape[rb - 1]);
    if k != k2 {
        return None;
    }
    let abatch = &ashape[..ra - 2];
    let bbatch = &bshape[..rb - 2];
    let batch = broadcast_shapes(&[abatch, bbatch])?;
    let nb: usize = batch.iter().product();
    let mut shape = batch.clone();
    shape.extend([m, n]);
    let mut out = vec![T::ZERO; nb * m * n];
    if out.is_empty() {
        return Some((shape, out));
    }
    let bcount: usize = bbatch.iter().product();
    let acount: usize = abatch.iter().product();
    if bcount == 1 && acount == nb {
        // B is shared: fold the batch into the rows of A.
        matmul_rows(nb * m, k, n, a, b, &mut out);
        return Some((shape, out));
    }
    let ai = broadcast_indices(abatch, &batch);
    let bi = broadcast_indices(bbatch, &batch);
    let work = |(i, cc): (usize, &mut [T])| {
        let (ao, bo) = (ai[i] * m * k, bi[i] * k * n);
        gemm(
            m,
            k,
            n,
            T::ONE,
            &a[ao..ao + m * k],
            (k, 1),
            &b[bo..bo + k * n],
            (n, 1),
            T::ZERO,
            cc,
            (n, 1),
        );
    };
    if nb > 1 && nb * m * k * n >= 1 << 20 {
        out.par_chunks_mut(m * n).enumerate().for_each(work);
    } else {
        out.chunks_mut(m * n).enumerate().for_each(work);
    }
    Some((shape, out))
}

/// Applies numpy matmul rules for 1-D operands: returns padded shapes and the dims to drop.
pub(crate) fn matmul_shapes(a: &[usize], b: &[usize]) -> (Vec<usize>, Vec<usize>, bool, bool) {
    let mut sa = a.to_vec();
    let mut sb = b.to_vec();
    let drop_m = sa.len() == 1;
    let drop_n = sb.len() == 1;
    if drop_m {
        sa.insert(0, 1);
    }
    if drop_n {
        sb.push(1);
    }
    (sa, sb, drop_m, drop_n)
}

fn matmul_float<T: Real>(cx: &OpCtx<'_>, a: &Tensor, b: &Tensor) -> Result<Tensor, KernelError> {
    let (sa, sb, drop_m, drop_n) = matmul_shapes(&a.shape, &b.shape);
    let av = T::load(a)?;
    let bv = T::load(b)?;
    let (shape, out) = matmul_padded(cx, (a, &av, &sa), (b, &bv, &sb), drop_m, drop_n)?;
    T::store(a.dtype, shape, out)
}

/// `a @ b` on the padded shapes of [`matmul_shapes`], dropping the padded dims again.
pub(crate) fn matmul_padded<T: Real>(
    cx: &OpCtx<'_>,
    (a, av, sa): (&Tensor, &[T], &[usize]),
    (b, bv, sb): (&Tensor, &[T], &[usize]),
    drop_m: bool,
    drop_n: bool,
) -> Result<(Vec<usize>, Vec<T>), KernelError> {
    let (mut shape, out) = batched_matmul(av, sa, bv, sb).ok_or_else(|| {
        cx.invalid(format!(
            "shapes {:?} and {:?} do not multiply",
            a.shape, b.shape
        ))
    })?;
    let r = shape.len();
    if drop_n {
        shape.remove(r - 1);
    }
    if drop_m {
        shape.remove(r - 2);
    }
    Ok((shape, out))
}

/// Integer matmul in wrapping i64 arithmetic, for the integer dtypes MatMul/Gemm accept.
fn matmul_int(cx: &OpCtx<'_>, a: &Tensor, b: &Tensor) -> Result<Tensor, KernelError> {
    let (sa, sb, drop_m, drop_n) = matmul_shapes(&a.shape, &b.shape);
    let av = a.to_i64()?;
    let bv = b.to_i64()?;
    let bad = || {
        cx.invalid(format!(
            "shapes {:?} and {:?} do not multiply",
            a.shape, b.shape
        ))
    };
    let (ra, rb) = (sa.len(), sb.len());
    let (m, k, n) = (sa[ra - 2], sa[ra - 1], sb[rb - 1]);
    if sb[rb - 2] != k {
        return Err(bad());
    }
    let batch = broadcast_shapes(&[&sa[..ra - 2], &sb[..rb - 2]]).ok_or_else(bad)?;
    let ai = broadcast_indices(&sa[..ra - 2], &batch);
    let bi = broadcast_indices(&sb[..rb - 2], &batch);
    let mut out = vec![0i64; ai.len() * m * n];
    for (bt, cc) in out.chunks_mut((m * n).max(1)).enumerate().take(ai.len()) {
        let (ao, bo) = (ai[bt] * m * k, bi[bt] * k * n);
        for i in 0..m {
            for p in 0..k {
                let x = av[ao + i * k + p];
                let brow = &bv[bo + p * n..bo + p * n + n];
                for (c, &y) in cc[i * n..i * n + n].iter_mut().zip(brow) {
                    *c = c.wrapping_add(x.wrapping_mul(y));
                }
            }
        }
    }
    let mut shape = batch;
    shape.extend([m, n]);
    let r = shape.len();
    if drop_n {
        shape.remove(r - 1);
    }
    if drop_m {
        shape.remove(r - 2);
    }
    int_store(a.dtype, shape, &out)
}

/// An integer tensor of `dtype` from wrapping i64 values.
pub(crate) fn int_store(dtype: DType, shape: Vec<usize>, v: &[i64]) -> Result<Tensor, KernelError> {
    let data = match dtype {
        DType::I64 => Data::I64(v.to_vec()),
        DType::I32 => Data::I32(v.iter().map(|&x| x as i32).collect()),
        DType::U32 => Data::U32(v.iter().map(|&x| x as u32).collect()),
        DType::U64 => Data::U64(v.iter().map(|&x| x as u64).collect()),
        DType::I16 => Data::I16(v.iter().map(|&x| x as i16).collect()),
        DType::U16 => Data::U16(v.iter().map(|&x| x as u16).collect()),
        DType::I8 => Data::I8(v.iter().map(|&x| x as i8).collect()),
        DType::U8 => Data::U8(v.iter().map(|&x| x as u8).collect()),
        _ => {
            return Err(KernelError::Module(format!(
                "dtype {dtype} is not an integer type"
            )));
        }
    };
    Tensor::new(dtype, shape, data)
}

fn check_same_dtype(cx: &OpCtx<'_>, a: &Tensor, b: &Tensor) -> Result<(), KernelError> {
    if a.dtype != b.dtype {
        return Err(cx.invalid(format!(
            "operand dtypes differ: {} and {}",
            a.dtype, b.dtype
        )));
    }
    Ok(())
}

/// Dispatches a generic float kernel on the compute type for `$dtype`.
macro_rules! by_real {
    ($dtype:expr, $f:ident ( $($arg:expr),* )) => {
        if $crate::ops::linalg::wide($dtype) {
            $f::<f64>($($arg),*)
        } else {
            $f::<f32>($($arg),*)
        }
    };
}
pub(crate) use by_real;

fn matmul_op(cx: &OpCtx<'_>, inputs: &[Option<RtValue>]) -> OpResult {
    let a = tensor(cx, inputs, 0)?;
    let b = tensor(cx, inputs, 1)?;
    check_same_dtype(cx, a, b)?;
    if a.rank() == 0 || b.rank() == 0 {
        return Err(cx.invalid("MatMul operands must have rank at least 1"));
    }
    let out = if is_float(a.dtype) {
        by_real!(a.dtype, matmul_float(cx, a, b))?
    } else if is_int(a.dtype) {
        matmul_int(cx, a, b)?
    } else {
        return Err(cx.unsupported(format!("MatMul on {}", a.dtype)));
    };
    Ok(vec![Some(out.into())])
}

#[allow(clippy::too_many_arguments, reason = "Gemm attributes")]
fn gemm_float<T: Real>(
    cx: &OpCtx<'_>,
    a: &Tensor,
    b: &Tensor,
    c: Option<&Tensor>,
    alpha: f32,
    beta: f32,
    ta: bool,
    tb: bool,
) -> Result<Tensor, KernelError> {
    let (m, k, n) = gemm_dims(cx, a, b, ta, tb)?;
    let av = T::load(a)?;
    let bv = T::load(b)?;
    // `beta * C` broadcast is where the product is added (GEMM beta 1).
    let (mut out, gbeta) = match c {
        Some(c) => {
            let cv = T::load(c)?;
            let beta = T::from_f64(f64::from(beta));
            (bias_matrix(cx, &cv, &c.shape, m, n, beta)?, T::ONE)
        }
        None => (vec![T::ZERO; m * n], T::ZERO),
    };
    let sa = if ta { (1, m) } else { (k, 1) };
    let sb = if tb { (1, k) } else { (n, 1) };
    gemm(
        m,
        k,
        n,
        T::from_f64(f64::from(alpha)),
        &av,
        sa,
        &bv,
        sb,
        gbeta,
        &mut out,
        (n, 1),
    );
    T::store(a.dtype, vec![m, n], out)
}

fn gemm_dims(
    cx: &OpCtx<'_>,
    a: &Tensor,
    b: &Tensor,
    ta: bool,
    tb: bool,
) -> Result<(usize, usize, usize), KernelError> {
    if a.rank() != 2 || b.rank() != 2 {
        return Err(cx.invalid(format!(
            "Gemm needs 2-D A and B, got {:?} and {:?}",
            a.shape, b.shape
        )));
    }
    let (m, k) = if ta {
        (a.shape[1], a.shape[0])
    } else {
        (a.shape[0], a.shape[1])
    };
    let (k2, n) = if tb {
        (b.shape[1], b.shape[0])
    } else {
        (b.shape[0], b.shape[1])
    };
    if k != k2 {
        return Err(cx.invalid(format!(
            "inner dims differ: A {:?} (transA {ta}) and B {:?} (transB {tb})",
            a.shape, b.shape
        )));
    }
    Ok((m, k, n))
}

/// `beta * c` broadcast unidirectionally to `[m, n]`, row-major.
fn bias_matrix<T: Real>(
    cx: &OpCtx<'_>,
    c: &[T],
    cshape: &[usize],
    m: usize,
    n: usize,
    beta: T,
) -> Result<Vec<T>, KernelError> {
    let target = [m, n];
    if cshape.len() > 2 || broadcast_shapes(&[cshape, &target]).as_deref() != Some(&target[..]) {
        return Err(cx.invalid(format!(
            "C of shape {cshape:?} does not broadcast to [{m}, {n}]"
        )));
    }
    // C's strides over `[m, n]`, 0 along the dims it broadcasts: a bias per column is copied
    // row by row.
    let mut full = [1usize; 2];
    full[2 - cshape.len()..].copy_from_slice(cshape);
    let strides = [
        if full[0] == 1 { 0 } else { full[1] },
        usize::from(full[1] != 1),
    ];
    let mut out = gather_strided(c, &target, &strides);
    if beta != T::ONE {
        out.iter_mut().for_each(|v| *v = beta * *v);
    }
    Ok(out)
}

fn gemm_op(
    cx: &OpCtx<'_>,
    inputs: &[Option<RtValue>],
    alpha: f32,
    beta: f32,
    ta: bool,
    tb: bool,
) -> OpResult {
    let a = tensor(cx, inputs, 0)?;
    let b = tensor(cx, inputs, 1)?;
    let c = opt_tensor(inputs, 2);
    check_same_dtype(cx, a, b)?;
    let out = if is_float(a.dtype) {
        by_real!(
            a.dtype,
            gemm_float(cx, a, b, c.map(|c| &**c), alpha, beta, ta, tb)
        )?
    } else if !is_int(a.dtype) {
        return Err(cx.unsupported(format!("Gemm on {}", a.dtype)));
    } else {
        let (m, k, n) = gemm_dims(cx, a, b, ta, tb)?;
        let av = a.to_i64()?;
        let bv = b.to_i64()?;
        let mut out = vec![0i64; m * n];
        if let Some(c) = c {
            let cv = c.to_i64()?;
            let target = [m, n];
            if c.rank() > 2
                || broadcast_shapes(&[&c.shape, &target]).as_deref() != Some(&target[..])
            {
                return Err(cx.invalid(format!("C of shape {:?} does not broadcast", c.shape)));
            }
            for (o, i) in out.iter_mut().zip(broadcast_indices(&c.shape, &target)) {
                *o = (beta as i64).wrapping_mul(cv[i]);
            }
        }
        for i in 0..m {
            for j in 0..n {
                let mut s = 0i64;
                for p in 0..k {
                    let x = if ta { av[p * m + i] } else { av[i * k + p] };
                    let y = if tb { bv[j * k + p] } else { bv[p * n + j] };
                    s = s.wrapping_add(x.wrapping_mul(y));
                }
                out[i * n + j] = out[i * n + j].wrapping_add((alpha as i64).wrapping_mul(s));
            }
        }
        int_store(a.dtype, vec![m, n], &out)?
    };
    Ok(vec![Some(out.into())])
}

/// Copies a strided view (`strides` may be 0 for broadcast dims) into a contiguous vector.
pub(crate) fn gather_strided<T: Copy>(src: &[T], shape: &[usize], strides: &[usize]) -> Vec<T> {
    let n: usize = shape.iter().product();
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    let r = shape.len();
    if r == 0 {
        out.push(src[0]);
        return out;
    }
    let inner = shape[r - 1];
    let is = strides[r - 1];
    let mut idx = vec![0usize; r];
    let mut base = 0usize;
    loop {
        if is == 1 {
            out.extend_from_slice(&src[base..base + inner]);
        } else {
            out.extend((0..inner).map(|j| src[base + j * is]));
        }
        // Advance the outer index.
        let mut d = r - 1;
        loop {
            if d == 0 {
                return out;
            }
            d -= 1;
            idx[d] += 1;
            base += strides[d];
            if idx[d] < shape[d] {
                break;
            }
            base -= strides[d] * idx[d];
            idx[d] = 0;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::interp::Interpreter;
    use mmq_ir::{Dim, Entry, ModelInfo, Module, Type};
    use std::collections::HashMap;

    /// Runs `op` on `inputs` with `outputs` declared outputs at `opset` (absent inputs are
    /// omitted optional operands; trailing ones are dropped).
    pub(crate) fn run_op(
        op: Op,
        inputs: Vec<Option<Tensor>>,
        outputs: usize,
        opset: i64,
    ) -> Result<Vec<Option<RtValue>>, KernelError> {
        let mut m = Module::new();
        let g = m.add_graph("g", None);
        let mut feeds = HashMap::new();
        let mut args = Vec::new();
        for (i, t) in inputs.into_iter().enumerate() {
            match t {
                Some(t) => {
                    let name = format!("in{i}");
                    let dims = t.shape.iter().map(|&d| Dim::known(d as i64)).collect();
                    let v = m.add_input(g, Some(name.clone()), Type::tensor(t.dtype, dims));
                    feeds.insert(name, RtValue::from(t));
                    args.push(Some(v));
                }
                None => args.push(None),
            }
        }
        let outs = (0..outputs)
            .map(|i| Some((Some(format!("out{i}")), Type::tensor(DType::F32, vec![]))))
            .collect();
        let node = m.add_node(g, op, args, outs, None);
        m.graphs[g].outputs = m.nodes[node].outputs.iter().flatten().copied().collect();
        m.entries.push(Entry {
            graph: g,
            model: ModelInfo {
                opsets: vec![(String::new(), opset)],
                ..ModelInfo::default()
            },
        });
        let interp = Interpreter::new(&m);
        let r = interp.run(g, &feeds)?;
        Ok(r.into_iter().map(|(_, v)| Some(v)).collect())
    }

    /// Output `i` as f64 values and shape.
    pub(crate) fn out(r: &[Option<RtValue>], i: usize) -> (Vec<usize>, Vec<f64>) {
        let t = r[i]
            .as_ref()
            .and_then(|v| v.as_tensor())
            .expect("tensor output");
        (t.shape.clone(), t.to_f64().expect("numeric"))
    }

    pub(crate) fn f32t(shape: &[usize], v: &[f32]) -> Option<Tensor> {
        Some(Tensor::from_f32(shape.to_vec(), v.to_vec()).expect("tensor"))
    }

    pub(crate) fn close(a: &[f64], b: &[f64], tol: f64) {
        assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= tol * (1.0 + y.abs()), "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn matmul_batched_and_vectors() {
        // [2,2,3] x [3,2]
        let a: Vec<f32> = (1..=12).map(|x| x as f32).collect();
        let b = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0];
        let r = run_op(
            Op::MatMul {},
            vec![f32t(&[2, 2, 3], &a), f32t(&[3, 2], &b)],
            1,
            17,
        )
        .expect("run");
        let (s, v) = out(&r, 0);
        assert_eq!(s, vec![2, 2, 2]);
        assert_eq!(v, vec![4.0, 5.0, 10.0, 11.0, 16.0, 17.0, 22.0, 23.0]);
        // 1-D x 1-D = scalar.
        let r = run_op(
            Op::MatMul {},
            vec![f32t(&[3], &[1.0, 2.0, 3.0]), f32t(&[3], &[4.0, 5.0, 6.0])],
            1,
            17,
        )
        .expect("run");
        assert_eq!(out(&r, 0), (vec![], vec![32.0]));
        // Broadcast batch [2,1,2,2] x [3,2,1].
        let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        let b = [1.0, 1.0, 2.0, 0.0, 0.0, 1.0];
        let r = run_op(
            Op::MatMul {},
            vec![f32t(&[2, 1, 2, 2], &a), f32t(&[3, 2, 1], &b)],
            1,
            17,
        )
        .expect("run");
        let (s, v) = out(&r, 0);
        assert_eq!(s, vec![2, 3, 2, 1]);
        assert_eq!(&v[..6], &[3.0, 7.0, 2.0, 6.0, 2.0, 4.0]);
        // Mismatch is an error.
        assert!(
            run_op(
                Op::MatMul {},
                vec![f32t(&[2, 3], &[0.0; 6]), f32t(&[2, 3], &[0.0; 6])],
                1,
                17
            )
            .is_err()
        );
    }

    #[test]
    fn matmul_int_and_empty() {
        let a = Tensor::from_i64(vec![2, 2], vec![1, 2, 3, 4]).expect("t");
        let b = Tensor::from_i64(vec![2, 1], vec![5, 6]).expect("t");
        let r = run_op(Op::MatMul {}, vec![Some(a), Some(b)], 1, 17).expect("run");
        assert_eq!(out(&r, 0), (vec![2, 1], vec![17.0, 39.0]));
        let r = run_op(
            Op::MatMul {},
            vec![f32t(&[0, 3], &[]), f32t(&[3, 2], &[0.0; 6])],
            1,
            17,
        )
        .expect("run");
        assert_eq!(out(&r, 0), (vec![0, 2], vec![]));
    }

    #[test]
    fn gemm_trans_and_bias() {
        let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]; // A^T is [3,2] -> A [2,3] = [[1,3,5],[2,4,6]]
        let b = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0]; // [3,2]
        let op = Op::Gemm {
            alpha: Some(2.0),
            beta: Some(0.5),
            trans_a: Some(1),
            trans_b: None,
        };
        let r = run_op(
            op,
            vec![
                f32t(&[3, 2], &a),
                f32t(&[3, 2], &b),
                f32t(&[2], &[2.0, 4.0]),
            ],
            1,
            13,
        )
        .expect("run");
        // A·B = [[6,8],[8,10]]; *2 + [1,2]
        assert_eq!(out(&r, 0), (vec![2, 2], vec![13.0, 18.0, 17.0, 22.0]));
    }

    #[test]
    fn strided_gather() {
        let v = [0, 1, 2, 3, 4, 5];
        assert_eq!(gather_strided(&v, &[3, 2], &[1, 3]), vec![0, 3, 1, 4, 2, 5]);
        assert_eq!(gather_strided(&v, &[2, 3], &[0, 1]), vec![0, 1, 2, 0, 1, 2]);
    }

    #[test]
    #[ignore = "timing; run with --ignored --nocapture"]
    fn matmul_speed() {
        let (m, k, n) = (256, 1024, 1024);
        let a =
            Tensor::from_f32(vec![m, k], (0..m * k).map(|i| (i % 7) as f32).collect()).expect("t");
        let b =
            Tensor::from_f32(vec![k, n], (0..k * n).map(|i| (i % 5) as f32).collect()).expect("t");
        let t = std::time::Instant::now();
        let r = run_op(Op::MatMul {}, vec![Some(a), Some(b)], 1, 17).expect("run");
        let dt = t.elapsed();
        assert_eq!(out(&r, 0).0, vec![m, n]);
        #[allow(clippy::print_stderr, reason = "timing report")]
        {
            eprintln!("256x1024x1024 f32 matmul: {dt:?}");
        }
    }
}
