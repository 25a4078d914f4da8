//! The e-graph rewrite engine (on `egg`).
//!
//! A top-level graph becomes one e-graph ([`convert::build`]): every node an e-node whose
//! children are its operands plus a leaf holding its attributes; graph inputs and constants are
//! leaves that refer to the IR (weights never enter the e-graph); the graph outputs hang off
//! one root. Types come from the IR's inference and live in the e-class analysis
//! ([`facts::Facts`]). The named rule sets saturate the e-graph within fixed limits, the
//! target's cost model picks one e-node per class ([`extract::extract`]), and
//! [`convert::write_back`] rewrites the graph: nodes whose e-node was kept stay as they are,
//! new e-nodes become new nodes.

pub(crate) mod convert;
pub(crate) mod cost;
pub(crate) mod extract;
pub(crate) mod facts;
pub(crate) mod lang;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use egg::{Runner, SimpleScheduler, StopReason};
use mmq_ir::{Module, Op};

use crate::pass::{EGraphStats, Firing, Pass, PassError, PassOptions, PassReport};
use crate::rules::{Rw, rule_set};

/// The opset of the standard fused forms the rules may write (`Attention`, `RotaryEmbedding`):
/// a graph below it is raised to it when the extracted graph holds one.
pub(crate) const OPSET_FORMS: i64 = 23;

/// A rule set: the rules of one topic, run together by a [`RewritePass`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RuleSet {
    /// Algebraic and shape clean-ups.
    Simplify,
    /// BatchNormalization folded into the Conv or Gemm before it.
    FoldBn,
    /// Activations fused into the Conv or Gemm before them.
    FuseAct,
    /// Quantized units fused (Conv + ReLU + Q/DQ).
    FuseQuant,
    /// Norms, GELU, attention and rotary embeddings of transformers.
    Transformer,
}

impl RuleSet {
    /// Every rule set, in the order `-O2` runs them.
    pub const ALL: [RuleSet; 5] = [
        RuleSet::Simplify,
        RuleSet::FoldBn,
        RuleSet::FuseAct,
        RuleSet::FuseQuant,
        RuleSet::Transformer,
    ];

    /// The set's name (`fold-bn`), as `mmq opt --rules` and rule fixtures spell it.
    pub fn name(self) -> &'static str {
        match self {
            RuleSet::Simplify => "simplify",
            RuleSet::FoldBn => "fold-bn",
            RuleSet::FuseAct => "fuse-act",
            RuleSet::FuseQuant => "fuse-quant",
            RuleSet::Transformer => "transformer",
        }
    }

    /// The names of the set's rules.
    pub fn rule_names(self) -> Vec<String> {
        rule_set(self)
            .iter()
            .map(|r| r.name.as_str().to_owned())
            .collect()
    }
}

impl std::fmt::Display for RuleSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A rule set name that names none.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown rule set '{0}' (known: simplify, fold-bn, fuse-act, fuse-quant, transformer)")]
pub struct UnknownRuleSet(pub String);

impl std::str::FromStr for RuleSet {
    type Err = UnknownRuleSet;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RuleSet::ALL
            .into_iter()
            .find(|r| r.name() == s)
            .ok_or_else(|| UnknownRuleSet(s.to_owned()))
    }
}

/// Fixed limits for one saturation run. There is no time limit, so a run's result does not
/// depend on the machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Saturation iterations.
    pub iterations: usize,
    /// E-nodes allowed, as a multiple of the graph's node count (plus a fixed allowance).
    pub nodes_per_graph_node: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            iterations: 12,
            nodes_per_graph_node: 8,
        }
    }
}

/// Runs named rule sets over every top-level graph: the graph becomes one e-graph, the rules
/// saturate it (within fixed limits), and the cheapest equivalent graph for the target is
/// extracted.
#[derive(Clone, Debug)]
pub struct RewritePass {
    sets: Vec<RuleSet>,
    name: String,
    limits: Limits,
}

impl RewritePass {
    /// A pass running `sets` together; named `rewrite(set,set)`.
    pub fn new(sets: &[RuleSet]) -> Self {
        let names: Vec<&str> = sets.iter().map(|s| s.name()).collect();
        RewritePass {
            sets: sets.to_vec(),
            name: format!("rewrite({})", names.join(",")),
            limits: Limits::default(),
        }
    }

    /// The same pass with other limits.
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    fn rules(&self) -> Vec<Rw> {
        self.sets.iter().flat_map(|&s| rule_set(s)).collect()
    }
}

impl Pass for RewritePass {
    fn name(&self) -> &str {
        &self.name
    }

    fn run(&self, module: &mut Module, opts: &PassOptions) -> Result<PassReport, PassError> {
        let rules = self.rules();
        let mut report = PassReport::default();
        let graphs: Vec<_> = module.entries.iter().map(|e| e.graph).collect();
        for g in graphs {
            let mut facts = facts::Facts::new(opts.target);
            facts.max_opset = if crate::opset::can_raise(module, g, OPSET_FORMS) {
                OPSET_FORMS
            } else {
                0
            };
            let mut built = convert::build(module, g, facts);
            let size = module.graphs[g].nodes().len();
            let runner = Runner::default()
                .with_egraph(std::mem::take(&mut built.egraph))
                .with_scheduler(SimpleScheduler)
                .with_iter_limit(self.limits.iterations)
                .with_node_limit(size * self.limits.nodes_per_graph_node + 10_000)
                .with_time_limit(Duration::from_secs(86_400))
                .run(&rules);
            if let Some(StopReason::Other(why)) = &runner.stop_reason {
                return Err(PassError::Failed {
                    pass: self.name.clone(),
                    message: why.clone(),
                });
            }
            let mut applied: BTreeMap<String, usize> = BTreeMap::new();
            for it in &runner.iterations {
                for (rule, n) in &it.applied {
                    *applied.entry(rule.as_str().to_owned()).or_default() += n;
                }
            }
            let stats = EGraphStats {
                graph: module.graphs[g].name.clone(),
                iterations: runner.iterations.len(),
                nodes: runner.egraph.total_number_of_nodes(),
                classes: runner.egraph.number_of_classes(),
                stop: runner
                    .stop_reason
                    .as_ref()
                    .map_or_else(|| "none".to_owned(), |r| format!("{r:?}")),
            };
            report.notes.push(format!(
                "graph '{}': {} iterations, {} e-nodes, {} e-classes, stop: {}",
                stats.graph, stats.iterations, stats.nodes, stats.classes, stats.stop
            ));
            report.egraphs.push(stats);
            built.egraph = runner.egraph;
            if opts.explain {
                report.firings.extend(firings(module, &built));
            }
            if applied.is_empty() {
                continue;
            }
            for (rule, n) in applied {
                report.count(&rule, n);
            }
            let cost = cost::TargetCost(opts.target);
            let choice = extract::extract(&built.egraph, built.root, &cost);
            convert::write_back(module, g, &built, &choice);
            let later = module.graphs[g].nodes().iter().find_map(|&n| {
                let op = &module.nodes[n].op;
                matches!(op, Op::Attention { .. } | Op::RotaryEmbedding { .. })
                    .then(|| op.op_type())
            });
            if let Some(kind) = later {
                let note =
                    crate::opset::raise_graph(module, g, OPSET_FORMS, &format!("fused {kind}"))
                        .map_err(|message| PassError::Failed {
                            pass: self.name.clone(),
                            message,
                        })?;
                report.notes.extend(note);
            }
        }
        Ok(report)
    }
}

/// The rule firings recorded during a run, with the source names of the values each rewrote.
fn firings(m: &Module, built: &convert::Built) -> Vec<Firing> {
    let eg = &built.egraph;
    let mut by_class: HashMap<egg::Id, Vec<String>> = HashMap::new();
    for &(v, id) in &built.defined {
        let name = m.values[v].name.clone().unwrap_or_else(|| format!("{v:?}"));
        by_class.entry(eg.find(id)).or_default().push(name);
    }
    eg.analysis
        .log
        .iter()
        .map(|(rule, id)| Firing {
            rule: rule.as_str().to_owned(),
            nodes: by_class.get(&eg.find(*id)).cloned().unwrap_or_default(),
        })
        .collect()
}

#[cfg(test)]
mod tests;
