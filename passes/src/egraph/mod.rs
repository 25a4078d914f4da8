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

/// Names of every rule set, in the order `-O2` runs them.
pub fn rule_sets() -> &'static [&'static str] {
    &[
        "simplify",
        "fold-bn",
        "fuse-act",
        "fuse-quant",
        "transformer",
    ]
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
    sets: Vec<String>,
    name: String,
    limits: Limits,
}

impl RewritePass {
    /// A pass running `sets` (names from [`rule_sets`]) together.
    pub fn new<S: AsRef<str>>(sets: &[S]) -> Result<Self, PassError> {
        let mut out = Vec::new();
        for s in sets {
            let s = s.as_ref();
            if !rule_sets().contains(&s) {
                return Err(PassError::Failed {
                    pass: "rewrite".into(),
                    message: format!("unknown rule set '{s}' (known: {})", rule_sets().join(", ")),
                });
            }
            out.push(s.to_owned());
        }
        let name = format!("rewrite({})", out.join(","));
        Ok(RewritePass {
            sets: out,
            name,
            limits: Limits::default(),
        })
    }

    /// The same pass with other limits.
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    fn rules(&self) -> Vec<Rw> {
        self.sets
            .iter()
            .flat_map(|s| rule_set(s).unwrap_or_default())
            .collect()
    }
}

/// The names of every rule in `set`, or `None` for an unknown set.
pub fn rule_names(set: &str) -> Option<Vec<String>> {
    Some(
        rule_set(set)?
            .iter()
            .map(|r| r.name.as_str().to_owned())
            .collect(),
    )
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
            let size = module.graphs[g].nodes.len();
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
            let later = module.graphs[g].nodes.iter().find_map(|&n| {
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
