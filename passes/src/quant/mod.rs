//! Quantization: calibration through the reference interpreter, schemes (INT8 static and
//! dynamic, INT4 weight-only, FP8, FP16 weight storage), precision maps (written by hand or
//! chosen automatically for a target cosine), and the accuracy report.
pub mod auto;
pub mod awq;
pub mod cache;
pub mod calibrate;
pub mod fp16;
pub mod granularity;
pub mod int8;
pub mod place;
pub mod precision;
pub mod report;
pub mod smooth;
pub mod weight_only;

pub(crate) use crate::opset::raise_opset;
