//! Shape queries, constants, ranges and inference-time dropout.

use mmq_ir::{Const, DType, Op};

use crate::ops::data::{ints, repeat_elem, sdim};
use crate::ops::shape::single;
use crate::ops::util::{opt_tensor, tensor};
use crate::ops::{OpCtx, OpResult};
use crate::tensor::{Data, RtValue, Tensor};

pub(super) fn shape(
    cx: &OpCtx<'_>,
    inputs: &[Option<RtValue>],
    start: Option<i64>,
    end: Option<i64>,
) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    let r = sdim(x.rank());
    let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let s = clamp(start.unwrap_or(0));
    let e = clamp(end.unwrap_or(r));
    let dims: Vec<i64> = if s < e {
        x.shape[s..e].iter().map(|&d| sdim(d)).collect()
    } else {
        Vec::new()
    };
    single(Tensor::from_i64(vec![dims.len()], dims)?)
}

pub(super) fn size(cx: &OpCtx<'_>, inputs: &[Option<RtValue>]) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    single(Tensor::from_i64(vec![], vec![sdim(x.len())])?)
}

pub(super) fn range(cx: &OpCtx<'_>, inputs: &[Option<RtValue>]) -> OpResult {
    let ts = [
        tensor(cx, inputs, 0)?,
        tensor(cx, inputs, 1)?,
        tensor(cx, inputs, 2)?,
    ];
    let dtype = ts[0].dtype;
    if ts.iter().any(|t| t.len() != 1 || t.dtype != dtype) {
        return Err(cx.invalid("start, limit and delta must be scalars of one dtype"));
    }
    match dtype {
        DType::F32 | DType::F64 | DType::F16 | DType::BF16 => {
            let v: Vec<f64> = ts
                .iter()
                .map(|t| t.to_f64().map(|v| v[0]))
                .collect::<Result<_, _>>()?;
            let (start, limit, delta) = (v[0], v[1], v[2]);
            if delta == 0.0 || !delta.is_finite() {
                return Err(cx.invalid(format!("delta {delta} is not a finite non-zero number")));
            }
            let n = ((limit - start) / delta).ceil().max(0.0);
            if !n.is_finite() || n > 1e10 {
                return Err(cx.invalid(format!("range of {n} elements")));
            }
            let n = n as usize;
            let vals: Vec<f64> = (0..n).map(|i| start + i as f64 * delta).collect();
            single(Tensor::from_f64_as(dtype, vec![n], &vals)?)
        }
        DType::I64
        | DType::I32
        | DType::I16
        | DType::I8
        | DType::U8
        | DType::U16
        | DType::U32
        | DType::U64 => {
            let v: Vec<i64> = ts
                .iter()
                .map(|t| t.to_i64().map(|v| v[0]))
                .collect::<Result<_, _>>()?;
            let (start, limit, delta) = (i128::from(v[0]), i128::from(v[1]), i128::from(v[2]));
            if delta == 0 {
                return Err(cx.invalid("delta is 0"));
            }
            let span = limit - start;
            let n = if (span > 0) == (delta > 0) && span != 0 {
                (span.abs() + delta.abs() - 1) / delta.abs()
            } else {
                0
            };
            if n > 10_000_000_000 {
                return Err(cx.invalid(format!("range of {n} elements")));
            }
            let vals: Vec<i64> = (0..n).map(|i| (start + i * delta) as i64).collect();
            let n = vals.len();
            if dtype == DType::I64 {
                single(Tensor::from_i64(vec![n], vals)?)
            } else {
                let f: Vec<f64> = vals.iter().map(|&x| x as f64).collect();
                single(Tensor::from_f64_as(dtype, vec![n], &f)?)
            }
        }
        d => Err(cx.invalid(format!("Range does not take {d}"))),
    }
}

pub(super) fn constant_of_shape(
    cx: &OpCtx<'_>,
    inputs: &[Option<RtValue>],
    value: Option<Const>,
) -> OpResult {
    let spec = ints(cx, tensor(cx, inputs, 0)?, "shape")?;
    if let Some(d) = spec.iter().find(|&&d| d < 0) {
        return Err(cx.invalid(format!("shape {spec:?} has the dim {d}")));
    }
    let shape: Vec<usize> = spec.iter().map(|&d| d as usize).collect();
    let fill = match value {
        Some(c) => cx.interp.constant(c)?,
        None => std::sync::Arc::new(Tensor::from_f32(vec![1], vec![0.0])?),
    };
    cx.check_result(fill.dtype, &shape)?;
    let n = shape.iter().product();
    if fill.len() != 1 {
        return Err(cx.invalid(format!("value must have one element, has {}", fill.len())));
    }
    single(Tensor::new(
        fill.dtype,
        shape,
        repeat_elem(&fill.data, 0, n),
    )?)
}

pub(super) fn constant(cx: &OpCtx<'_>) -> OpResult {
    let Op::Constant {
        value,
        value_float,
        value_floats,
        value_int,
        value_ints,
        value_string,
        value_strings,
    } = &cx.node.op
    else {
        return Err(cx.invalid("not a Constant"));
    };
    let t = if let Some(c) = value {
        return Ok(vec![Some(RtValue::Tensor(cx.interp.constant(*c)?))]);
    } else if let Some(f) = value_float {
        Tensor::from_f32(vec![], vec![*f])?
    } else if let Some(v) = value_floats {
        Tensor::from_f32(vec![v.len()], v.clone())?
    } else if let Some(i) = value_int {
        Tensor::from_i64(vec![], vec![*i])?
    } else if let Some(v) = value_ints {
        Tensor::from_i64(vec![v.len()], v.clone())?
    } else if let Some(s) = value_string {
        Tensor::new(DType::String, vec![], Data::Str(vec![s.clone()]))?
    } else if let Some(v) = value_strings {
        Tensor::new(DType::String, vec![v.len()], Data::Str(v.clone()))?
    } else {
        return Err(cx.unsupported("a Constant without a value attribute (sparse_value)"));
    };
    single(t)
}

pub(super) fn dropout(cx: &OpCtx<'_>, inputs: &[Option<RtValue>], ratio: Option<f32>) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    if cx.opset >= 12 {
        let training = match opt_tensor(inputs, 2) {
            Some(t) => t.to_f64()?.first().is_some_and(|&v| v != 0.0),
            None => false,
        };
        let ratio = match opt_tensor(inputs, 1) {
            Some(t) => t.to_f64()?.first().copied().unwrap_or(0.5),
            None => 0.5,
        };
        if training && ratio != 0.0 {
            return Err(cx.unsupported(format!(
                "training-mode dropout (ratio {ratio}) is random; only inference is supported"
            )));
        }
    }
    let _ = ratio;
    let mut outs = vec![Some(RtValue::Tensor(x.clone()))];
    if cx.num_outputs() > 1 {
        let mask = if cx.opset >= 10 {
            Tensor::new(
                DType::Bool,
                x.shape.clone(),
                Data::Bool(vec![true; x.len()]),
            )?
        } else {
            Tensor::from_f64_as(x.dtype, x.shape.clone(), &vec![1.0; x.len()])?
        };
        outs.push(Some(RtValue::from(mask)));
    }
    Ok(outs)
}
