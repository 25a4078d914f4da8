//! Optimization passes for mmq modules.
//!
//! A [`Pass`] transforms a [`mmq_ir::Module`] in place and reports what changed. The pass
//! manager runs explicit pipelines per target and level. The e-graph engine (on `egg`) runs
//! named rule sets; egg types never appear in this crate's public API.

pub mod canonicalize;
pub mod const_fold;
pub mod dce;
pub mod egraph;
pub mod manager;
mod opset;
pub mod pass;
pub mod quant;
mod rules;
pub mod split;
pub mod targets;

pub use canonicalize::Canonicalize;
pub use const_fold::ConstFold;
pub use dce::Dce;
pub use egraph::{RewritePass, RuleSet, UnknownRuleSet};
pub use manager::{
    DumpAfter, OptLevel, ParseOptLevelError, PassManager, PassRun, Phase, PipelineReport, pipeline,
};
pub use pass::{EGraphStats, Firing, Interrupt, Pass, PassError, PassOptions, PassReport};
pub use targets::{Target, TargetRef};
