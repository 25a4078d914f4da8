//! CPU reference implementation of every op of the mmq IR: the interpreter.
//!
//! The interpreter is the semantic definition of the IR: `mmq run`, constant folding, calibration
//! and numerical checks of rewrites all use it. Semantics are ONNX's at the module's opset.
//!
//! - [`Tensor`] holds a dtype, a concrete shape and typed element storage ([`Data`]).
//! - [`RtValue`] is a run-time value: a tensor, a sequence of tensors, or an optional.
//! - [`Interpreter`] runs a graph of a [`mmq_ir::Module`], binding symbolic dims from the inputs,
//!   freeing each activation after its last use.
//! - `ops` holds the kernels, one module per op family.
//! - [`packed`] defines the packed quantized layouts of the CUDA kernels, which [`cuda`] launches
//!   through cudarc.

pub mod cache;
pub mod cuda;
#[cfg(all(test, mmq_host_cuh))]
mod cuda_bodies;
#[cfg(test)]
mod cuda_host;
mod error;
mod interp;
pub mod io;
pub mod numeric;
mod ops;
pub mod packed;
mod tensor;
pub mod vmath;

pub use error::KernelError;
pub use interp::{Env, Interpreter, RunStats};
pub use ops::{OpCtx, quant};
pub use tensor::{Data, RtValue, Tensor, check_size, memory_limit, numel, set_memory_limit};
