//! Integer and quantized products: MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv.
//!
//! Zero-point-centred operands are exact in f64, so the products run through f64 GEMM and are
//! exact for any realistic reduction length (< 2^37 for 8-bit operands).

use mmq_ir::DType;

use super::conv::{conv_compute, conv_shape};
use super::{batched_matmul, int_store};
use crate::error::KernelError;
use crate::numeric::round_half_even;
use crate::ops::util::{broadcast_indices, broadcast_shapes, opt_tensor, tensor};
use crate::ops::{OpCtx, OpResult};
use crate::tensor::{Data, RtValue, Tensor};

fn is_q8(d: DType) -> bool {
    matches!(d, DType::U8 | DType::I8)
}

/// The shape a per-row (`row_axis`) or per-channel 1-D parameter takes for broadcasting.
fn param_shape(p: &Tensor, xshape: &[usize], row_axis: Option<usize>) -> Vec<usize> {
    if let Some(ax) = row_axis
        && p.rank() == 1
        && p.len() > 1
        && xshape.get(ax) == Some(&p.len())
    {
        let mut s = vec![p.len()];
        s.resize(xshape.len() - ax, 1);
        return s;
    }
    p.shape.clone()
}

/// `x - zp` as f64, with `zp` broadcast (per-row along `row_axis` when 1-D of that length).
fn centered(
    cx: &OpCtx<'_>,
    x: &Tensor,
    zp: Option<&Tensor>,
    row_axis: Option<usize>,
    what: &str,
) -> Result<Vec<f64>, KernelError> {
    let mut v = x.to_f64()?;
    let Some(zp) = zp else { return Ok(v) };
    let zv = zp.to_f64()?;
    if zv.len() == 1 {
        v.iter_mut().for_each(|x| *x -= zv[0]);
        return Ok(v);
    }
    let zs = param_shape(zp, &x.shape, row_axis);
    if broadcast_shapes(&[&zs, &x.shape]).as_deref() != Some(&x.shape[..]) {
        return Err(cx.invalid(format!(
            "{what} zero point {:?} does not fit {:?}",
            zp.shape, x.shape
        )));
    }
    for (x, i) in v.iter_mut().zip(broadcast_indices(&zs, &x.shape)) {
        *x -= zv[i];
    }
    Ok(v)
}

fn matmul_f64(
    cx: &OpCtx<'_>,
    a: &Tensor,
    av: &[f64],
    b: &Tensor,
    bv: &[f64],
) -> Result<(Vec<usize>, Vec<f64>), KernelError> {
    if a.rank() == 0 || b.rank() == 0 {
        return Err(cx.invalid("operands must have rank at least 1"));
    }
    let mut sa = a.shape.clone();
    let mut sb = b.shape.clone();
    let (dm, dn) = (sa.len() == 1, sb.len() == 1);
    if dm {
        sa.insert(0, 1);
    }
    if dn {
        sb.push(1);
    }
    let (mut shape, out) = batched_matmul(av, &sa, bv, &sb).ok_or_else(|| {
        cx.invalid(format!(
            "shapes {:?} and {:?} do not multiply",
            a.shape, b.shape
        ))
    })?;
    let r = shape.len();
    if dn {
        shape.remove(r - 1);
    }
    if dm {
        shape.remove(r - 2);
    }
    Ok((shape, out))
}

/// MatMulInteger.
pub(super) fn matmul_integer(cx: &OpCtx<'_>, inputs: &[Option<RtValue>]) -> OpResult {
    let a = tensor(cx, inputs, 0)?;
    let b = tensor(cx, inputs, 1)?;
    if !is_q8(a.dtype) || !is_q8(b.dtype) {
        return Err(cx.unsupported(format!("MatMulInteger on {} and {}", a.dtype, b.dtype)));
    }
    let row = a.rank().checked_sub(2);
    let av = centered(cx, a, opt_tensor(inputs, 2).map(|t| &**t), row, "A")?;
    let bv = centered(cx, b, opt_tensor(inputs, 3).map(|t| &**t), None, "B")?;
    let (shape, out) = matmul_f64(cx, a, &av, b, &bv)?;
    let iv: Vec<i64> = out.iter().map(|&x| x as i64).collect();
    Ok(vec![Some(int_store(DType::I32, shape, &iv)?.into())])
}

/// Saturating cast of rounded values to an 8-bit dtype.
fn saturate_q8(dtype: DType, shape: Vec<usize>, v: &[f64]) -> Result<Tensor, KernelError> {
    let data = match dtype {
        DType::U8 => Data::U8(
            v.iter()
                .map(|&x| round_half_even(x).clamp(0.0, 255.0) as u8)
                .collect(),
        ),
        DType::I8 => Data::I8(
            v.iter()
                .map(|&x| round_half_even(x).clamp(-128.0, 127.0) as i8)
                .collect(),
        ),
        _ => {
            return Err(KernelError::Module(format!(
                "quantized output dtype {dtype} is not supported"
            )));
        }
    };
    Tensor::new(dtype, shape, data)
}

/// Values of a (scale) tensor broadcast to `shape`.
fn broadcast_to(
    cx: &OpCtx<'_>,
    t: &Tensor,
    tshape: &[usize],
    shape: &[usize],
    what: &str,
) -> Result<Vec<f64>, KernelError> {
    let v = t.to_f64()?;
    if v.len() == 1 {
        return Ok(vec![v[0]; shape.iter().product()]);
    }
    if broadcast_shapes(&[tshape, shape]).as_deref() != Some(shape) {
        return Err(cx.invalid(format!("{what} {:?} does not fit {shape:?}", t.shape)));
    }
    Ok(broadcast_indices(tshape, shape)
        .into_iter()
        .map(|i| v[i])
        .collect())
}

/// QLinearMatMul.
pub(super) fn qlinear_matmul(cx: &OpCtx<'_>, inputs: &[Option<RtValue>]) -> OpResult {
    let a = tensor(cx, inputs, 0)?;
    let a_scale = tensor(cx, inputs, 1)?;
    let a_zp = opt_tensor(inputs, 2);
    let b = tensor(cx, inputs, 3)?;
    let b_scale = tensor(cx, inputs, 4)?;
    let b_zp = opt_tensor(inputs, 5);
    let y_scale = tensor(cx, inputs, 6)?;
    let y_zp = opt_tensor(inputs, 7);
    if !is_q8(a.dtype) || !is_q8(b.dtype) {
        return Err(cx.unsupported(format!("QLinearMatMul on {} and {}", a.dtype, b.dtype)));
    }
    let row = a.rank().checked_sub(2);
    let av = centered(cx, a, a_zp.map(|t| &**t), row, "a")?;
    let bv = centered(cx, b, b_zp.map(|t| &**t), None, "b")?;
    let (shape, c) = matmul_f64(cx, a, &av, b, &bv)?;
    // Per-row a_scale applies along the rows of the output.
    let out_row = shape.len().checked_sub(2).filter(|_| a.rank() >= 2);
    let sa = broadcast_to(
        cx,
        a_scale,
        &param_shape(a_scale, &shape, out_row),
        &shape,
        "a_scale",
    )?;
    let sb = broadcast_to(cx, b_scale, &b_scale.shape, &shape, "b_scale")?;
    let sy = broadcast_to(
        cx,
        y_scale,
        &param_shape(y_scale, &shape, out_row),
        &shape,
        "y_scale",
    )?;
    let zy = match y_zp {
        Some(z) => broadcast_to(cx, z, &z.shape, &shape, "y_zero_point")?,
        None => vec![0.0; c.len()],
    };
    let y: Vec<f64> = (0..c.len())
        .map(|i| {
            let s = (sa[i] as f32 * sb[i] as f32 / sy[i] as f32) as f64;
            c[i] * s + zy[i]
        })
        .collect();
    let dtype = y_zp.map_or(a.dtype, |z| z.dtype);
    Ok(vec![Some(saturate_q8(dtype, shape, &y)?.into())])
}

/// Centred X and W of an integer convolution (W zero point scalar or per output channel).
fn conv_operands(
    cx: &OpCtx<'_>,
    x: &Tensor,
    x_zp: Option<&Tensor>,
    w: &Tensor,
    w_zp: Option<&Tensor>,
) -> Result<(Vec<f64>, Vec<f64>), KernelError> {
    if !is_q8(x.dtype) || !is_q8(w.dtype) {
        return Err(cx.unsupported(format!(
            "{} on {} and {}",
            cx.node.op.op_type(),
            x.dtype,
            w.dtype
        )));
    }
    if let Some(z) = x_zp
        && z.len() != 1
    {
        return Err(cx.invalid(format!("x zero point {:?} must be a scalar", z.shape)));
    }
    let xv = centered(cx, x, x_zp, None, "x")?;
    let wv = centered(cx, w, w_zp, Some(0), "w")?;
    Ok((xv, wv))
}

/// ConvInteger.
pub(super) fn conv_integer(cx: &OpCtx<'_>, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let w = tensor(cx, inputs, 1)?;
    let s = conv_shape(cx, &x.shape, &w.shape)?;
    let (xv, wv) = conv_operands(
        cx,
        x,
        opt_tensor(inputs, 2).map(|t| &**t),
        w,
        opt_tensor(inputs, 3).map(|t| &**t),
    )?;
    let y = conv_compute(&s, &xv, &wv, None);
    let mut shape = vec![s.n, s.m];
    shape.extend(&s.geo.output);
    let iv: Vec<i64> = y.iter().map(|&v| v as i64).collect();
    Ok(vec![Some(int_store(DType::I32, shape, &iv)?.into())])
}

/// QLinearConv.
pub(super) fn qlinear_conv(cx: &OpCtx<'_>, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let x_scale = tensor(cx, inputs, 1)?;
    let x_zp = opt_tensor(inputs, 2);
    let w = tensor(cx, inputs, 3)?;
    let w_scale = tensor(cx, inputs, 4)?;
    let w_zp = opt_tensor(inputs, 5);
    let y_scale = tensor(cx, inputs, 6)?;
    let y_zp = opt_tensor(inputs, 7);
    let bias = opt_tensor(inputs, 8);
    let s = conv_shape(cx, &x.shape, &w.shape)?;
    let (xv, wv) = conv_operands(cx, x, x_zp.map(|t| &**t), w, w_zp.map(|t| &**t))?;
    let bv = match bias {
        Some(b) if b.len() != s.m => {
            return Err(cx.invalid(format!("B {:?} must have {} elements", b.shape, s.m)));
        }
        Some(b) => Some(b.to_f64()?),
        None => None,
    };
    let y = conv_compute(&s, &xv, &wv, bv.as_deref());
    let ws = w_scale.to_f64()?;
    if ws.len() != 1 && ws.len() != s.m {
        return Err(cx.invalid(format!(
            "w_scale {:?} must be a scalar or have {} elements",
            w_scale.shape, s.m
        )));
    }
    let xs = x_scale.to_f64()?.first().copied().unwrap_or(1.0) as f32;
    let ys = y_scale.to_f64()?.first().copied().unwrap_or(1.0) as f32;
    let zy = match y_zp {
        Some(z) => z.to_f64()?.first().copied().unwrap_or(0.0),
        None => 0.0,
    };
    let out_size: usize = s.geo.output.iter().product();
    let yv: Vec<f64> = y
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let m = (i / out_size.max(1)) % s.m.max(1);
            let wsm = if ws.len() == 1 { ws[0] } else { ws[m] } as f32;
            v * f64::from(xs * wsm / ys) + zy
        })
        .collect();
    let mut shape = vec![s.n, s.m];
    shape.extend(&s.geo.output);
    let dtype = y_zp.map_or(x.dtype, |z| z.dtype);
    Ok(vec![Some(saturate_q8(dtype, shape, &yv)?.into())])
}

#[cfg(test)]
mod tests {
    use super::super::tests::{out, run_op};
    use crate::tensor::{Data, Tensor};
    use mmq_ir::{DType, Op};

    fn u8t(shape: &[usize], v: &[u8]) -> Option<Tensor> {
        Some(Tensor::new(DType::U8, shape.to_vec(), Data::U8(v.to_vec())).expect("t"))
    }

    #[test]
    fn matmul_integer_zero_points() {
        // A - 1 = [[1,2],[3,4]], B - [0, 1] per column = [[1,0],[2,1]]
        let r = run_op(
            Op::MatMulInteger {},
            vec![
                u8t(&[2, 2], &[2, 3, 4, 5]),
                u8t(&[2, 2], &[1, 1, 2, 2]),
                u8t(&[], &[1]),
                u8t(&[2], &[0, 1]),
            ],
            1,
            10,
        )
        .expect("run");
        assert_eq!(out(&r, 0), (vec![2, 2], vec![5.0, 2.0, 11.0, 4.0]));
        // Per-row A zero point [1, 2]: rows [1,2], [2,3].
        let r = run_op(
            Op::MatMulInteger {},
            vec![
                u8t(&[2, 2], &[2, 3, 4, 5]),
                u8t(&[2, 2], &[1, 0, 0, 1]),
                u8t(&[2], &[1, 2]),
            ],
            1,
            10,
        )
        .expect("run");
        assert_eq!(out(&r, 0).1, vec![1.0, 2.0, 2.0, 3.0]);
    }

    #[test]
    fn qlinear_matmul_rounds_half_even() {
        let f = |v: f32| Some(Tensor::from_f32(vec![], vec![v]).expect("t"));
        // a=[1,3] (zp 0), b=[[1],[1]] → 4; scale 0.5*1/0.8 → 2.5 → 2 (half even) + zp 10 = 12.
        let r = run_op(
            Op::QLinearMatMul {},
            vec![
                u8t(&[1, 2], &[1, 3]),
                f(0.5),
                u8t(&[], &[0]),
                u8t(&[2, 1], &[1, 1]),
                f(1.0),
                u8t(&[], &[0]),
                f(0.8),
                u8t(&[], &[10]),
            ],
            1,
            10,
        )
        .expect("run");
        assert_eq!(out(&r, 0).1, vec![12.0]);
    }

    #[test]
    fn conv_integer_basic() {
        let op = Op::ConvInteger {
            auto_pad: None,
            dilations: None,
            group: None,
            kernel_shape: None,
            pads: Some(vec![1, 1]),
            strides: None,
        };
        // x - 1 = [1, 2], w = [1, 1]; padded zeros contribute nothing.
        let r = run_op(
            op,
            vec![
                u8t(&[1, 1, 2], &[2, 3]),
                u8t(&[1, 1, 2], &[1, 1]),
                u8t(&[], &[1]),
            ],
            1,
            10,
        )
        .expect("run");
        assert_eq!(out(&r, 0), (vec![1, 1, 3], vec![1.0, 3.0, 2.0]));
    }
}
