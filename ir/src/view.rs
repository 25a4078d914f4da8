//! petgraph views of a graph, built on demand for algorithms (topological order, cycles, SCCs,
//! DOT). The IR itself stays in arenas; a view is a snapshot.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};

use petgraph::graph::{DiGraph, NodeIndex};

use crate::module::{GraphId, Module, Node, Value, ValueDef};

/// Edge weight of a dependency through a subgraph (a body reading a value of the enclosing graph
/// that this graph's node produces), rather than through an operand.
pub const CAPTURE_EDGE: u32 = u32::MAX;

/// The dataflow of graph `g`: one petgraph node per node listed by `g` (in list order, so the
/// `i`-th petgraph node is `g.nodes[i]`), and one edge per operand from its producer to its
/// consumer, weighted by the operand position. A node whose subgraphs read a value produced in
/// `g` gets an edge weighted [`CAPTURE_EDGE`]. Operands that are graph inputs, constants or
/// outer values have no edge. Out-of-range handles are skipped.
pub fn dataflow_view(m: &Module, g: GraphId) -> DiGraph<Node, u32> {
    let mut dg = DiGraph::new();
    let Some(graph) = m.graphs.get(g) else {
        return dg;
    };
    let mut index: HashMap<Node, NodeIndex> = HashMap::new();
    let mut producer: HashMap<Value, NodeIndex> = HashMap::new();
    for &n in &graph.nodes {
        let Some(data) = m.nodes.get(n) else {
            continue;
        };
        let ix = dg.add_node(n);
        index.entry(n).or_insert(ix);
        for v in data.outputs.iter().flatten() {
            producer.entry(*v).or_insert(ix);
        }
    }
    for &n in &graph.nodes {
        let (Some(data), Some(&to)) = (m.nodes.get(n), index.get(&n)) else {
            continue;
        };
        for (i, v) in data.inputs.iter().enumerate() {
            if let Some(&from) = v.and_then(|v| producer.get(&v)) {
                dg.add_edge(from, to, i as u32);
            }
        }
        let mut captured: Vec<NodeIndex> = captures(m, n)
            .into_iter()
            .filter_map(|v| producer.get(&v).copied())
            .collect();
        captured.sort_unstable();
        captured.dedup();
        for from in captured {
            dg.add_edge(from, to, CAPTURE_EDGE);
        }
    }
    dg
}

/// Every value read inside the subgraphs of `n` (operands and graph outputs), at any depth.
pub(crate) fn captures(m: &Module, n: Node) -> Vec<Value> {
    let mut out = Vec::new();
    let Some(data) = m.nodes.get(n) else {
        return out;
    };
    let mut stack = data.op.subgraphs();
    let mut seen = HashSet::new();
    while let Some(g) = stack.pop() {
        let Some(gd) = m.graphs.get(g) else {
            continue;
        };
        if !seen.insert(g) {
            continue;
        }
        out.extend(gd.outputs.iter().copied());
        for &inner in &gd.nodes {
            if let Some(nd) = m.nodes.get(inner) {
                out.extend(nd.inputs.iter().flatten().copied());
                stack.extend(nd.op.subgraphs());
            }
        }
    }
    out.retain(|v| {
        m.values
            .get(*v)
            .is_some_and(|d| matches!(d.def, ValueDef::Output { .. }))
    });
    out
}

/// The nodes of `g` in a topological order of [`dataflow_view`], keeping the listed order
/// wherever dependencies allow (so an already ordered graph comes back unchanged). On a cycle,
/// returns a node that lies on one.
pub fn topo_order(m: &Module, g: GraphId) -> Result<Vec<Node>, Node> {
    let dg = dataflow_view(m, g);
    let mut indegree: Vec<usize> = dg
        .node_indices()
        .map(|i| {
            dg.neighbors_directed(i, petgraph::Direction::Incoming)
                .count()
        })
        .collect();
    let mut ready: BinaryHeap<Reverse<usize>> = indegree
        .iter()
        .enumerate()
        .filter(|(_, d)| **d == 0)
        .map(|(i, _)| Reverse(i))
        .collect();
    let mut order = Vec::with_capacity(dg.node_count());
    while let Some(Reverse(i)) = ready.pop() {
        let ix = NodeIndex::new(i);
        order.push(dg[ix]);
        for next in dg.neighbors_directed(ix, petgraph::Direction::Outgoing) {
            let d = &mut indegree[next.index()];
            *d -= 1;
            if *d == 0 {
                ready.push(Reverse(next.index()));
            }
        }
    }
    if order.len() == dg.node_count() {
        return Ok(order);
    }
    let on_cycle = petgraph::algo::tarjan_scc(&dg)
        .into_iter()
        .filter(|scc| scc.len() > 1 || dg.contains_edge(scc[0], scc[0]))
        .filter_map(|scc| scc.into_iter().min())
        .min();
    match on_cycle {
        Some(ix) => Err(dg[ix]),
        // Unreachable for a finite graph: Kahn's algorithm only stalls on a cycle.
        None => Err(dg[NodeIndex::new(indegree.iter().position(|&d| d > 0).unwrap_or(0))]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;
    use crate::infer::tests::B;

    #[test]
    fn orders_and_finds_cycles() {
        let mut b = B::new(17);
        let x = b.input("x", DType::F32, vec![4.into()]);
        let a = b.op("Relu", vec![], &[x]);
        let c = b.op("Add", vec![], &[a, x]);
        let d = b.op("Mul", vec![], &[c, a]);
        let nodes = b.m.graphs[b.g].nodes.clone();
        let dg = dataflow_view(&b.m, b.g);
        assert_eq!(dg.node_count(), 3);
        assert_eq!(dg.edge_count(), 3);
        assert_eq!(topo_order(&b.m, b.g), Ok(nodes.clone()));
        // Reversed list: the order is recovered.
        b.m.graphs[b.g].nodes.reverse();
        assert_eq!(topo_order(&b.m, b.g), Ok(nodes.clone()));
        // a = Relu(d) closes a cycle a → c → d → a.
        b.m.nodes[nodes[0]].inputs[0] = Some(d);
        let err = topo_order(&b.m, b.g).unwrap_err();
        assert!(nodes.contains(&err));
    }
}
