//! Contrib kernels: GELU variants (`Gelu`, `FastGelu`, `BiasGelu`), `QuickGelu` and
//! `FusedMatMul`, per ONNX Runtime's contrib op schemas. On f32 tensors the element math runs in
//! f32 through [`crate::vmath`] (vectorized); other dtypes compute in f64 and round once.

use mmq_ir::Op;

use super::norm::{float_attr, int_attr};
use crate::error::KernelError;
use crate::ops::elementwise::unary::erf;
use crate::ops::linalg::{matmul_padded, matmul_shapes};
use crate::ops::util::{opt_tensor, tensor};
use crate::ops::{OpCtx, OpResult};
use crate::tensor::{Data, RtValue, Tensor};
use crate::vmath;

/// The GELU family: `Gelu`, `BiasGelu`, `FastGelu` (bias optional), `QuickGelu`.
pub(super) fn gelu(cx: &OpCtx<'_>, op: &Op, inputs: &[Option<RtValue>]) -> OpResult {
    match op {
        Op::BiasGelu {} => map(cx, inputs, true, gelu_erf, gelu_erf_f32),
        Op::FastGelu {} => map(cx, inputs, false, gelu_tanh, gelu_tanh_f32),
        Op::QuickGelu { .. } => {
            let a = float_attr(op, "alpha", 1.702);
            let alpha = f64::from(a);
            map(
                cx,
                inputs,
                false,
                move |x| x / (1.0 + (-alpha * x).exp()),
                move |x| x * vmath::sigmoid(a * x),
            )
        }
        // `Gelu`.
        _ => map(cx, inputs, false, gelu_erf, gelu_erf_f32),
    }
}

/// `x * Φ(x)` (the erf form).
fn gelu_erf(x: f64) -> f64 {
    0.5 * x * (1.0 + erf(x * std::f64::consts::FRAC_1_SQRT_2))
}

/// [`gelu_erf`] in f32.
#[inline(always)]
fn gelu_erf_f32(x: f32) -> f32 {
    0.5 * x * (1.0 + vmath::erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// [`gelu_tanh`] in f32.
#[inline(always)]
fn gelu_tanh_f32(x: f32) -> f32 {
    let k = (2.0 / std::f32::consts::PI).sqrt();
    0.5 * x * (1.0 + vmath::tanh(k * (x + 0.044715 * x * x * x)))
}

/// The tanh approximation of GELU.
fn gelu_tanh(x: f64) -> f64 {
    let k = (2.0 / std::f64::consts::PI).sqrt();
    0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
}

/// `f(x + bias)`, the bias (operand 1; required when `need_bias`) 1-D over the last axis; `f32f`
/// is `f` on f32 tensors.
fn map(
    cx: &OpCtx<'_>,
    inputs: &[Option<RtValue>],
    need_bias: bool,
    f: impl Fn(f64) -> f64,
    f32f: impl Fn(f32) -> f32,
) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    if !x.dtype.is_float() {
        return Err(cx.unsupported(format!("input dtype {:?}", x.dtype)));
    }
    let bias = if need_bias {
        Some(tensor(cx, inputs, 1)?)
    } else {
        opt_tensor(inputs, 1)
    };
    let hidden = x.shape.last().copied().unwrap_or(1);
    if let Some(b) = bias
        && (b.len() != hidden || b.rank() != 1)
    {
        return Err(cx.invalid(format!(
            "bias {:?} must be 1-D of the last dim {hidden}",
            b.shape
        )));
    }
    if let Data::F32(xv) = &x.data {
        let y = match bias.map(|b| &b.data) {
            None => vmath::map_vec(xv, f32f),
            Some(Data::F32(b)) => {
                let mut xb = xv.clone();
                for row in xb.chunks_mut(hidden.max(1)) {
                    row.iter_mut().zip(b).for_each(|(v, b)| *v += b);
                }
                vmath::map_vec(&xb, f32f)
            }
            Some(_) => return Err(cx.invalid("the bias must have the input's dtype")),
        };
        return Ok(vec![Some(RtValue::Tensor(
            Tensor::new(x.dtype, x.shape.clone(), Data::F32(y))?.into(),
        ))]);
    }
    let b = bias.map(|b| b.to_f64()).transpose()?;
    let xv = x.to_f64()?;
    let y: Vec<f64> = xv
        .iter()
        .enumerate()
        .map(|(i, &v)| f(v + b.as_ref().map_or(0.0, |b| b[i % hidden])))
        .collect();
    Ok(vec![Some(RtValue::Tensor(
        Tensor::from_f64_as(x.dtype, x.shape.clone(), &y)?.into(),
    ))])
}

/// Row-major data of `t` with its last two dims swapped.
fn swap_last(t: &[f64], shape: &[usize]) -> (Vec<f64>, Vec<usize>) {
    let r = shape.len();
    let (m, n) = (shape[r - 2], shape[r - 1]);
    let mut out = vec![0.0; t.len()];
    if m * n > 0 {
        for (o, i) in out.chunks_mut(m * n).zip(t.chunks(m * n)) {
            for p in 0..m {
                for q in 0..n {
                    o[q * m + p] = i[p * n + q];
                }
            }
        }
    }
    let mut s = shape.to_vec();
    s.swap(r - 2, r - 1);
    (out, s)
}

/// `FusedMatMul`: `alpha * op(A) @ op(B)`, `op` swapping the last two dims when `transA` /
/// `transB` is set (numpy matmul broadcasting; 1-D operands as in MatMul).
pub(super) fn fused_matmul(cx: &OpCtx<'_>, op: &Op, inputs: &[Option<RtValue>]) -> OpResult {
    let a = tensor(cx, inputs, 0)?;
    let b = tensor(cx, inputs, 1)?;
    if int_attr(op, "transBatchA", 0) != 0 || int_attr(op, "transBatchB", 0) != 0 {
        return Err(cx.unsupported("transBatchA/transBatchB"));
    }
    if !a.dtype.is_float() || a.dtype != b.dtype {
        return Err(cx.unsupported(format!("dtypes {:?} and {:?}", a.dtype, b.dtype)));
    }
    let alpha = f64::from(float_attr(op, "alpha", 1.0));
    let (mut sa, mut sb, drop_m, drop_n) = matmul_shapes(&a.shape, &b.shape);
    let (mut av, mut bv) = (a.to_f64()?, b.to_f64()?);
    if int_attr(op, "transA", 0) != 0 && !drop_m {
        (av, sa) = swap_last(&av, &sa);
    }
    if int_attr(op, "transB", 0) != 0 && !drop_n {
        (bv, sb) = swap_last(&bv, &sb);
    }
    let (shape, out) = matmul_padded(cx, (a, &av, &sa), (b, &bv, &sb), drop_m, drop_n)?;
    let out: Vec<f64> = out.into_iter().map(|v| v * alpha).collect();
    let t: Result<Tensor, KernelError> = Tensor::from_f64_as(a.dtype, shape, &out);
    Ok(vec![Some(RtValue::Tensor(t?.into()))])
}
