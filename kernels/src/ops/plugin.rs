//! Kernels: the TensorRT plugins of [`mmq_ir::plugin`], on the CPU. Each computes what the plugin's
//! CUDA kernel computes (the same round-half-even quantization, the same blocked INT4 layout), so
//! a plugin network runs under the interpreter and its outputs are the reference the engine is
//! checked against.

use mmq_ir::{DType, Op};

use super::contrib::matmul_nbits_op;
use super::quant::{QuantAttrs, dequantize_linear, quantize_linear};
use super::util::tensor;
use super::{OpCtx, OpResult};
use crate::packed::{self, Format};
use crate::tensor::{Data, RtValue, Tensor};
use mmq_ir::plugin::{self, DOMAIN};

/// Runs the node when it is one of mmq's plugins.
pub(crate) fn eval(cx: &OpCtx<'_>, inputs: &[Option<RtValue>]) -> Option<OpResult> {
    let op = &cx.node.op;
    let schema = plugin::schema(op.op_type()).filter(|_| op.domain() == DOMAIN)?;
    let field = |name: &str| {
        let default = schema
            .fields
            .iter()
            .find(|f| f.name == name)
            .map_or(0, |f| f.default);
        op.get(name).unwrap_or(default)
    };
    Some(match op {
        Op::MmqQuantize { .. } | Op::MmqDequantize { .. } => quant(cx, inputs, schema.name, field),
        Op::MmqDynamicQuantize { .. } => dynamic_quantize(cx, inputs, field("block_size")),
        Op::MmqMatMulNBits { .. } => matmul_nbits(cx, op, inputs),
        _ => return None,
    })
}

/// `MmqQuantize` / `MmqDequantize`: ONNX `QuantizeLinear` / `DequantizeLinear` restricted to
/// int8 codes with an int8 zero point.
fn quant(
    cx: &OpCtx<'_>,
    inputs: &[Option<RtValue>],
    name: &str,
    field: impl Fn(&str) -> i64,
) -> OpResult {
    if !(2..=3).contains(&inputs.len()) {
        return Err(cx.invalid(format!(
            "{name} takes 2 or 3 inputs (data, scale, zero point), not {}",
            inputs.len()
        )));
    }
    if inputs.len() == 3 {
        let zp = tensor(cx, inputs, 2)?;
        if zp.dtype != DType::I8 {
            return Err(cx.invalid(format!("the zero point must be int8, not {}", zp.dtype)));
        }
    }
    let scale = tensor(cx, inputs, 1)?;
    if scale.dtype != DType::F32 {
        return Err(cx.invalid(format!("the scale must be float32, not {}", scale.dtype)));
    }
    let at = QuantAttrs {
        axis: field("axis"),
        block_size: field("block_size"),
        output_dtype: 0,
        precision: 0,
        saturate: true,
    };
    if name == "MmqQuantize" {
        // Without a zero point the codes are still int8.
        let at = QuantAttrs {
            output_dtype: i64::from(DType::I8.onnx_code()),
            ..at
        };
        quantize_linear(cx, inputs, &at)
    } else {
        let q = tensor(cx, inputs, 0)?;
        if q.dtype != DType::I8 {
            return Err(cx.invalid(format!("the codes must be int8, not {}", q.dtype)));
        }
        dequantize_linear(cx, inputs, &at)
    }
}

/// `MmqDynamicQuantize`: one symmetric int8 scale per block of `block` along the last axis
/// (`0`: per row).
fn dynamic_quantize(cx: &OpCtx<'_>, inputs: &[Option<RtValue>], block: i64) -> OpResult {
    let x = tensor(cx, inputs, 0)?;
    if !matches!(x.dtype, DType::F32 | DType::F16) {
        return Err(cx.invalid(format!(
            "the input must be float32 or float16, not {}",
            x.dtype
        )));
    }
    let Some(&row) = x.shape.last().filter(|&&r| r > 0) else {
        return Err(cx.invalid(format!(
            "the input {:?} needs a non-empty last axis",
            x.shape
        )));
    };
    let group = match block {
        0 => row,
        b if b > 0 => b as usize,
        b => return Err(cx.invalid(format!("block_size {b} must be 0 or positive"))),
    };
    let d = packed::quantize_dynamic(&x.to_f32()?, row, group, Format::I8, true, false);
    let codes: Vec<i8> = d.codes.iter().map(|&c| c as i8).collect();
    let mut scale_shape = x.shape.clone();
    *scale_shape.last_mut().unwrap_or(&mut 0) = row.div_ceil(group);
    Ok(vec![
        Some(Tensor::new(DType::I8, x.shape.clone(), Data::I8(codes))?.into()),
        Some(Tensor::from_f32(scale_shape, d.scales)?.into()),
    ])
}

/// `MmqMatMulNBits`: `com.microsoft.MatMulNBits` with binary16 A and scales, zero points always
/// given and the bias as the fifth input.
fn matmul_nbits(cx: &OpCtx<'_>, op: &Op, inputs: &[Option<RtValue>]) -> OpResult {
    if !(4..=5).contains(&inputs.len()) {
        return Err(cx.invalid(format!(
            "MmqMatMulNBits takes 4 or 5 inputs (A, B, scales, zero points, bias), not {}",
            inputs.len()
        )));
    }
    let a = tensor(cx, inputs, 0)?;
    if a.dtype != DType::F16 {
        return Err(cx.invalid(format!("A must be float16, not {}", a.dtype)));
    }
    let mut as_nbits: Vec<Option<RtValue>> = inputs[..4].to_vec();
    if let Some(bias) = inputs.get(4) {
        as_nbits.push(None);
        as_nbits.push(bias.clone());
    }
    matmul_nbits_op(cx, op, &as_nbits)
}
