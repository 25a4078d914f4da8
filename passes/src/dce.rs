//! Dead code elimination, and the use and reachability helpers the other passes share.

use std::collections::{HashMap, HashSet};

use mmq_ir::{GraphId, Module, Node, Value};

use crate::pass::{Pass, PassError, PassOptions, PassReport};

/// Removes nodes none of whose results is used, transitively. A value counts as used when a
/// live node reads it (a read inside a node's subgraphs, at any depth, counts as a read by that
/// node) or when it is an output of a live graph (an entry graph, or a body of a live node).
/// Every op is taken to be free of side effects, as every ONNX op is.
///
/// Counter: `removed-nodes`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Dce;

impl Pass for Dce {
    fn name(&self) -> &str {
        "dce"
    }

    fn run(&self, m: &mut Module, _opts: &PassOptions) -> Result<PassReport, PassError> {
        let mut report = PassReport::default();
        let mut used: HashSet<Value> = HashSet::new();
        let mut live: HashSet<Node> = HashSet::new();
        for root in entry_graphs(m) {
            mark_graph(m, root, &mut used, &mut live);
        }
        let mut removed = 0;
        let mut removed_bodies = false;
        for g in live_graphs(m) {
            // Bodies of removed nodes go with them (and do not count).
            if m.graphs[g].parent.is_some_and(|p| !live.contains(&p)) {
                continue;
            }
            let (keep, drop): (Vec<Node>, Vec<Node>) =
                m.graphs[g].nodes().iter().partition(|n| live.contains(n));
            removed += drop.len();
            removed_bodies |= drop.iter().any(|&n| !m.nodes[n].op.subgraphs().is_empty());
            m.set_node_order(g, keep);
        }
        report.count("removed-nodes", removed);
        if removed_bodies {
            // The bodies of removed control-flow nodes would still name their old parent, which
            // the verifier rejects; renumbering drops every entity no entry reaches.
            *m = mmq_ir::text::canonicalize(m);
        }
        Ok(report)
    }
}

/// Marks the live nodes of `g` (walking backwards from its outputs) and, recursively, of the
/// bodies of its live nodes.
fn mark_graph(m: &Module, g: GraphId, used: &mut HashSet<Value>, live: &mut HashSet<Node>) {
    let Some(data) = m.graphs.get(g) else { return };
    used.extend(data.outputs.iter().copied());
    mark_nodes(m, g, used, live);
}

/// The nodes of `g` (and of their bodies) that `roots`, values of `g`, depend on.
pub(crate) fn needed_by(m: &Module, g: GraphId, roots: &[Value]) -> HashSet<Node> {
    let mut used: HashSet<Value> = roots.iter().copied().collect();
    let mut live = HashSet::new();
    mark_nodes(m, g, &mut used, &mut live);
    live
}

/// Marks the nodes of `g` whose results are in `used`, walking backwards.
fn mark_nodes(m: &Module, g: GraphId, used: &mut HashSet<Value>, live: &mut HashSet<Node>) {
    let Some(data) = m.graphs.get(g) else { return };
    for &n in data.nodes().iter().rev() {
        let Some(node) = m.nodes.get(n) else { continue };
        if !node.outputs.iter().flatten().any(|v| used.contains(v)) {
            continue;
        }
        live.insert(n);
        used.extend(node.inputs.iter().flatten().copied());
        // A body reads outer values defined before this node, which the backward walk of the
        // enclosing graphs reaches later.
        for sub in node.op.subgraphs() {
            mark_graph(m, sub, used, live);
        }
    }
}

/// The entry graphs, without repeats.
pub(crate) fn entry_graphs(m: &Module) -> Vec<GraphId> {
    let mut seen = HashSet::new();
    m.entries
        .iter()
        .map(|e| e.graph)
        .filter(|&g| m.graphs.get(g).is_some() && seen.insert(g))
        .collect()
}

/// Every graph an entry reaches (entry graphs and nested bodies), each once, every graph
/// before the bodies it holds.
pub(crate) fn live_graphs(m: &Module) -> Vec<GraphId> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for root in entry_graphs(m) {
        if !seen.insert(root) {
            continue;
        }
        let mut i = out.len();
        out.push(root);
        while i < out.len() {
            let g = out[i];
            i += 1;
            for &n in m.graphs[g].nodes() {
                let Some(node) = m.nodes.get(n) else { continue };
                for sub in node.op.subgraphs() {
                    if m.graphs.get(sub).is_some() && seen.insert(sub) {
                        out.push(sub);
                    }
                }
            }
        }
    }
    out
}

/// Every value that is an output of a reachable graph.
pub(crate) fn graph_outputs(m: &Module) -> HashSet<Value> {
    live_graphs(m)
        .into_iter()
        .flat_map(|g| m.graphs[g].outputs.clone())
        .collect()
}

/// Replaces every operand `v` of every reachable node by `map[v]` (graph outputs are left as
/// they are, so their names survive). Returns how many operands changed.
pub(crate) fn redirect_uses(m: &mut Module, map: &HashMap<Value, Value>) -> usize {
    if map.is_empty() {
        return 0;
    }
    let mut changed = 0;
    for g in live_graphs(m) {
        for i in 0..m.graphs[g].nodes().len() {
            let n = m.graphs[g].nodes()[i];
            let Some(node) = m.nodes.get(n) else { continue };
            if !node.inputs.iter().flatten().any(|v| map.contains_key(v)) {
                continue;
            }
            for slot in m.nodes[n].inputs.iter_mut().flatten() {
                if let Some(&to) = map.get(slot) {
                    *slot = to;
                    changed += 1;
                }
            }
        }
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::test_util::*;
    use mmq_ir::{Dim, Op};

    #[test]
    fn removes_dead_chains_and_keeps_what_outputs_need() {
        let (mut m, g) = module();
        let x = m.add_input(g, Some("x".into()), f32_ty(vec![Dim::known(4)]));
        let live = unary(&mut m, g, Op::Relu {}, vec![x], "live");
        let dead1 = unary(&mut m, g, Op::Exp {}, vec![x], "dead1");
        let _dead2 = unary(&mut m, g, Op::Neg {}, vec![dead1], "dead2");
        m.graphs[g].outputs = vec![live];
        let report = Dce.run(&mut m, &PassOptions::default()).expect("dce runs");
        assert_eq!(report.counters.get("removed-nodes"), Some(&2));
        let ops: Vec<&str> = m.graphs[g]
            .nodes()
            .iter()
            .map(|&n| m.nodes[n].op.op_type())
            .collect();
        assert_eq!(ops, ["Relu"]);
        assert!(mmq_ir::verify::verify(&m).is_ok());
        // Nothing left to remove.
        let again = Dce.run(&mut m, &PassOptions::default()).expect("dce runs");
        assert!(!again.changed);
    }

    #[test]
    fn uses_inside_bodies_keep_outer_nodes_and_dead_control_flow_goes() {
        let (mut m, g) = module();
        let x = m.add_input(g, Some("x".into()), f32_ty(vec![Dim::known(4)]));
        let cond = m.add_input(
            g,
            Some("cond".into()),
            mmq_ir::Type::tensor(mmq_ir::DType::Bool, vec![]),
        );
        // Read only inside the live If's then-branch.
        let outer = unary(&mut m, g, Op::Exp {}, vec![x], "outer");
        let y = if_node(&mut m, g, cond, outer, x, "y");
        // A dead If whose body reads x.
        let _dead = if_node(&mut m, g, cond, x, x, "dead");
        m.graphs[g].outputs = vec![y];
        let graphs_before = m.graphs.len();
        let report = Dce.run(&mut m, &PassOptions::default()).expect("dce runs");
        assert_eq!(report.counters.get("removed-nodes"), Some(&1));
        let ops: Vec<&str> = m.graphs[m.entries[0].graph]
            .nodes()
            .iter()
            .map(|&n| m.nodes[n].op.op_type())
            .collect();
        assert_eq!(ops, ["Exp", "If"]);
        assert_eq!(m.graphs.len(), graphs_before - 2, "dead bodies are dropped");
        let errors = mmq_ir::verify::verify_all(&m);
        assert!(errors.is_empty(), "{errors:?}");
    }
}
