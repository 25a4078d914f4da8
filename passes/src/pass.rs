//! The [`Pass`] trait and what a pass reports.

use std::collections::BTreeMap;

use mmq_ir::{IrError, Module};

use crate::targets::TargetRef;

/// Options every pass sees.
#[derive(Clone, Debug, Default)]
pub struct PassOptions {
    /// The target (its cost model, fused ops and forms; see [`crate::targets`]).
    pub target: TargetRef,
    /// Record each rule firing with the nodes it rewrote (`mmq opt --explain`).
    pub explain: bool,
}

/// A request to stop, set from another thread (Ctrl-C in a Python session): the pass manager
/// checks it between passes, and calibration before each sample. Clones share one flag.
#[derive(Clone, Debug, Default)]
pub struct Interrupt(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Interrupt {
    /// A flag that is not set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks the work to stop at its next check.
    pub fn set(&self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether stopping was asked for.
    pub fn is_set(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// One rule application recorded for `--explain`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Firing {
    /// The rule name.
    pub rule: String,
    /// The source names of the values the matched pattern root stood for (empty when the
    /// root was built by another rule).
    pub nodes: Vec<String>,
}

/// What a pass did.
#[derive(Clone, Debug, Default)]
pub struct PassReport {
    /// Whether the module changed.
    pub changed: bool,
    /// Named counters (rule firings by rule name, folded nodes, removed nodes, ...).
    pub counters: BTreeMap<String, usize>,
    /// Rule firings in order, when [`PassOptions::explain`] is set.
    pub firings: Vec<Firing>,
    /// Free-form facts about the run (e-graph size, iterations, stop reason).
    pub notes: Vec<String>,
    /// The e-graph of each graph a rewrite pass ran on.
    pub egraphs: Vec<EGraphStats>,
}

/// The size of one e-graph run.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct EGraphStats {
    /// The graph's name.
    pub graph: String,
    /// Iterations run.
    pub iterations: usize,
    /// E-nodes at the end.
    pub nodes: usize,
    /// E-classes at the end.
    pub classes: usize,
    /// Why the run stopped (`Saturated`, `IterationLimit(n)`, `NodeLimit(n)`).
    pub stop: String,
}

impl PassReport {
    /// Adds `n` to counter `name`.
    pub fn count(&mut self, name: &str, n: usize) {
        if n > 0 {
            *self.counters.entry(name.to_owned()).or_default() += n;
            self.changed = true;
        }
    }
}

/// A pass failed.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    /// The module is invalid (input to the pass, or its result when verification is on).
    #[error("{pass}: invalid module: {}", .errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
    Invalid {
        /// The pass after (or before) which verification failed.
        pass: String,
        /// The verifier's errors.
        errors: Vec<IrError>,
    },
    /// The pass cannot handle something in the module.
    #[error("{pass}: {message}")]
    Failed {
        /// The pass.
        pass: String,
        /// What went wrong and where.
        message: String,
    },
    /// The work was asked to stop ([`Interrupt`]) before the pass.
    #[error("interrupted before {pass}")]
    Interrupted {
        /// The pass that did not run.
        pass: String,
    },
}

/// A transformation of a module.
pub trait Pass {
    /// The pass name (kebab-case), as `--dump-after` and `--time-passes` print it.
    fn name(&self) -> &str;
    /// Runs the pass on every graph of `module`.
    fn run(&self, module: &mut Module, opts: &PassOptions) -> Result<PassReport, PassError>;
}
