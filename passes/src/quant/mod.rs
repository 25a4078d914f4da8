//! Quantization: calibration through the reference interpreter, schemes (INT8 static and
//! dynamic, INT4 weight-only, FP8), precision maps, and the accuracy report.
pub mod calibrate;
pub mod int8;
pub mod precision;
pub mod report;
pub mod weight_only;
