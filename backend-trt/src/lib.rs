//! The TensorRT backend: a module (compiled for the `trt` target) written as a package that
//! `trtexec` builds into an engine — TensorRT-ready ONNX with its quantization as Q/DQ by
//! TensorRT's rules, `build_engine.sh` (strongly typed, one optimization profile from the
//! symbols' ranges) and `manifest.json` — and [`lint`], which checks a module against what
//! TensorRT's ONNX parser and explicit-quantization rules accept, so problems show before the
//! GPU machine.

mod lint;
mod package;
pub mod plugins;

pub use lint::{Finding, lint, lint_graph};
pub use package::{
    Package, PackageOptions, Profile, ProfileError, Reference, TrtError, default_profile,
    write_package,
};
