//! The modality split: a merged multimodal graph (one graph from `pixel_values` and `input_ids`
//! to `logits`) becomes a vision-encoder graph and a language graph, linked.
//!
//! The cut lies at the modality boundary [`mmq_ir::modality`] computes: the values computed
//! from vision inputs alone (label `vision`) that a node of another label reads, or that the
//! graph outputs. The vision graph (`vision_encoder`) takes the vision inputs and computes those
//! values as its outputs; the language graph (`language_model`, the original graph) takes them as
//! inputs of the same names, linked to the vision outputs ([`mmq_ir::Link`]), and keeps
//! everything else. Nodes that depend on no input at all (label `shared`) and that the vision
//! part reads are copied into it; the copies left unread in the language graph go at the next
//! dead-code pass. A vision input that the language part also reads stays an input of both.
//!
//! The two graphs together compute exactly what the merged graph computes: every node runs once,
//! on the same operands, in the same order. A graph whose vision inputs come from another graph
//! of the module (an already split pipeline) or that has no boundary is left as it is.
//!
//! Counters: `split-graphs`, `vision-nodes` (moved), `boundary-values`.

use std::collections::{HashMap, HashSet};

use mmq_ir::modality::{self, InputSource, Modality};
use mmq_ir::{Entry, GraphId, Link, Module, Node, Op, Value, ValueDef};

use crate::pass::{Pass, PassError, PassOptions, PassReport};

/// The modality split; see the module documentation.
#[derive(Clone, Debug, Default)]
pub struct ModalitySplit {
    /// Modality overrides (input name, label), as `--modality` gives them.
    pub modality: Vec<(String, Modality)>,
}

/// The name of the vision graph (and its file in a package).
pub const VISION_GRAPH: &str = "vision_encoder";
/// The name the language graph takes.
pub const LANGUAGE_GRAPH: &str = "language_model";

fn fail(message: impl Into<String>) -> PassError {
    PassError::Failed {
        pass: "modality-split".to_owned(),
        message: message.into(),
    }
}

/// The values node `n` reads: its operands and, at any depth, the operands and outputs of the
/// graphs nested in it (outer-scope reads included).
fn reads(m: &Module, n: Node) -> Vec<Value> {
    let mut out: Vec<Value> = m.nodes[n].inputs.iter().flatten().copied().collect();
    for sub in m.nodes[n].op.subgraphs() {
        for g in m.graph_tree(sub) {
            out.extend(m.graphs[g].outputs.iter().copied());
            for &inner in m.graphs[g].nodes() {
                out.extend(m.nodes[inner].inputs.iter().flatten().copied());
            }
        }
    }
    out
}

/// What one graph's split looks like, before anything changes.
struct Cut {
    /// The vision inputs (labelled from their names or `--modality`).
    vision_inputs: Vec<Value>,
    /// The nodes that move, in order.
    vision_nodes: Vec<Node>,
    /// The nodes that depend on no labelled input and that the vision part reads, copied into
    /// it, in order.
    shared_nodes: Vec<Node>,
    /// `Shape` nodes among `shared_nodes` whose copy reads a vision input instead: (vision input,
    /// start, end).
    rebased: HashMap<Node, (Value, i64, i64)>,
    /// The values the language part reads from the vision part, in definition order.
    boundary: Vec<Value>,
}

/// Where each node of the merged graph goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    /// Computed from vision inputs alone.
    Vision,
    /// Computed from no labelled input (constants, and dims the vision inputs also have).
    Shared,
    /// Everything else (text, audio, fusion).
    Rest,
}

/// A `Shape` of `x` whose selected dims (all constants or symbols) a vision input has too, at
/// some position: exporters take `batch` from whichever input comes first
/// (`Shape(input_ids)[0]` feeding the vision tower's class embedding), a dependence on a size
/// rather than on text. Returns the vision input and the range to read there.
fn rebase_shape(m: &Module, n: Node, vision_inputs: &[Value]) -> Option<(Value, i64, i64)> {
    let Op::Shape { start, end } = &m.nodes[n].op else {
        return None;
    };
    let x = (*m.nodes[n].inputs.first()?)?;
    let dims = m.value_type(x).shape()?;
    let rank = dims.len() as i64;
    let norm = |i: i64| {
        if i < 0 {
            (i + rank).max(0)
        } else {
            i.min(rank)
        }
    };
    let (s, e) = (norm(start.unwrap_or(0)), norm(end.unwrap_or(rank)));
    let wanted = dims.get(s as usize..e.max(s) as usize)?;
    if wanted.is_empty() {
        return None;
    }
    for &y in vision_inputs {
        let Some(have) = m.value_type(y).shape() else {
            continue;
        };
        let found = (0..=have.len().saturating_sub(wanted.len()))
            .find(|&o| have.get(o..o + wanted.len()) == Some(wanted));
        if let Some(o) = found {
            return Some((y, o as i64, (o + wanted.len()) as i64));
        }
    }
    None
}

/// The cut of top-level graph `g`, or why there is none.
fn plan(m: &Module, g: GraphId, overrides: &[(String, Modality)]) -> Result<Cut, String> {
    let labels = modality::analyze(m, g, overrides).map_err(|e| e.to_string())?;
    let vision_inputs: Vec<Value> = labels
        .inputs()
        .iter()
        .filter(|l| l.modality == Modality::Vision)
        .map(|l| l.value)
        .collect();
    if vision_inputs.is_empty() {
        return Err("it has no vision input (label one with --modality NAME=vision)".to_owned());
    }
    if labels
        .inputs()
        .iter()
        .any(|l| l.modality == Modality::Vision && l.source == InputSource::Link)
    {
        return Err("its vision inputs come from another graph: it is split already".to_owned());
    }
    // (depends on a vision input, depends on another labelled input) per value.
    let mut deps: HashMap<Value, (bool, bool)> = HashMap::new();
    for l in labels.inputs() {
        let d = match l.modality {
            Modality::Vision => (true, false),
            Modality::Shared => (false, false),
            _ => (false, true),
        };
        deps.insert(l.value, d);
    }
    let gd = &m.graphs[g];
    let read: HashMap<Node, Vec<Value>> = gd.nodes().iter().map(|&n| (n, reads(m, n))).collect();
    let mut side: HashMap<Node, Side> = HashMap::new();
    let mut rebased = HashMap::new();
    for &n in gd.nodes() {
        let (mut vis, mut other) = (false, false);
        if let Some(r) = rebase_shape(m, n, &vision_inputs) {
            rebased.insert(n, r);
        } else {
            for &v in &read[&n] {
                let (a, b) = deps.get(&v).copied().unwrap_or((false, false));
                vis |= a;
                other |= b;
            }
        }
        for &o in m.nodes[n].outputs.iter().flatten() {
            deps.insert(o, (vis, other));
        }
        side.insert(
            n,
            match (vis, other) {
                (true, false) => Side::Vision,
                (false, false) => Side::Shared,
                _ => Side::Rest,
            },
        );
    }
    let is = |n: Node, s: Side| side.get(&n) == Some(&s);
    let vision_nodes: Vec<Node> = gd
        .nodes()
        .iter()
        .copied()
        .filter(|&n| is(n, Side::Vision))
        .collect();
    let defined: HashSet<Value> = vision_nodes
        .iter()
        .flat_map(|&n| m.nodes[n].outputs.iter().flatten().copied())
        .collect();
    // Values the rest of the graph reads from the vision part.
    let mut read_outside: HashSet<Value> = gd.outputs.iter().copied().collect();
    let mut crosses = false;
    for &n in gd.nodes().iter().filter(|&&n| !is(n, Side::Vision)) {
        let r = &read[&n];
        crosses |= is(n, Side::Rest) && r.iter().any(|v| defined.contains(v));
        read_outside.extend(r);
    }
    if !crosses {
        return Err(
            "no node of another modality reads a value computed from vision inputs alone: \
             it is not a merged multimodal graph"
                .to_owned(),
        );
    }
    let boundary: Vec<Value> = vision_nodes
        .iter()
        .flat_map(|&n| m.nodes[n].outputs.iter().flatten().copied())
        .filter(|v| read_outside.contains(v))
        .collect();
    // The shared nodes the vision part reads, transitively.
    let producer: HashMap<Value, Node> = gd
        .nodes()
        .iter()
        .flat_map(|&n| m.nodes[n].outputs.iter().flatten().map(move |&v| (v, n)))
        .collect();
    let mut needed: HashSet<Node> = HashSet::new();
    let mut stack: Vec<Value> = vision_nodes
        .iter()
        .flat_map(|n| &read[n])
        .copied()
        .collect();
    while let Some(v) = stack.pop() {
        let Some(&p) = producer.get(&v) else { continue };
        if is(p, Side::Shared) && needed.insert(p) && !rebased.contains_key(&p) {
            stack.extend(&read[&p]);
        }
    }
    let shared_nodes: Vec<Node> = gd
        .nodes()
        .iter()
        .copied()
        .filter(|n| needed.contains(n))
        .collect();
    if let Some(&n) = shared_nodes
        .iter()
        .find(|&&n| !m.nodes[n].op.subgraphs().is_empty())
    {
        return Err(format!(
            "node '{}' ({}) depends on no input, holds a subgraph and is read by the vision part; \
             fold constants first (-O1 or higher)",
            m.nodes[n].name.as_deref().unwrap_or("?"),
            m.nodes[n].op.op_type()
        ));
    }
    rebased.retain(|n, _| needed.contains(n));
    Ok(Cut {
        vision_inputs,
        vision_nodes,
        shared_nodes,
        rebased,
        boundary,
    })
}

/// A name for a value of the interface: its own, or `vision_features_N`, made unique among
/// `taken`.
fn interface_name(m: &Module, v: Value, index: usize, taken: &mut HashSet<String>) -> String {
    let base = m.values[v]
        .name
        .clone()
        .unwrap_or_else(|| format!("vision_features_{index}"));
    let mut name = base.clone();
    let mut k = 1;
    while !taken.insert(name.clone()) {
        name = format!("{base}_{k}");
        k += 1;
    }
    name
}

/// Splits top-level graph `g` by `cut`; returns the vision graph.
fn apply(m: &mut Module, g: GraphId, cut: &Cut, vision_name: &str) -> GraphId {
    let v = m.add_graph(vision_name, None);
    // Copies of the shared nodes the vision part reads, then the vision nodes, in order.
    let mut copies: Vec<(Value, Value)> = Vec::new();
    let moved: HashSet<Node> = cut.vision_nodes.iter().copied().collect();
    let copied: HashSet<Node> = cut.shared_nodes.iter().copied().collect();
    let order: Vec<Node> = m.graphs[g].nodes().to_vec();
    for n in order {
        if copied.contains(&n) {
            let mut data = m.nodes[n].clone();
            if let Some(&(y, start, end)) = cut.rebased.get(&n) {
                data.op = Op::Shape {
                    start: Some(start),
                    end: Some(end),
                };
                data.inputs = vec![Some(y)];
            }
            let outputs = data
                .outputs
                .iter()
                .map(|o| o.map(|o| (m.values[o].name.clone(), m.value_type(o).clone())))
                .collect();
            let copy = m.add_node(v, data.op, data.inputs, outputs, data.name);
            for (old, new) in data.outputs.iter().zip(m.nodes[copy].outputs.clone()) {
                if let (Some(old), Some(new)) = (old, new) {
                    copies.push((*old, new));
                }
            }
        } else if moved.contains(&n) {
            m.move_node(n, v);
        }
    }
    for (old, new) in copies {
        m.replace_uses(old, new, v, &[]);
    }
    // The vision inputs: moved to the vision graph, or, where the language part reads them
    // too, an input of each under the same name.
    // What the language graph's nodes read (the vision inputs and the boundary are replaced
    // only in the vision graph until the boundary below, so one set serves both).
    let node_reads: HashSet<Value> = m.graphs[g]
        .nodes()
        .iter()
        .flat_map(|&n| reads(m, n))
        .collect();
    let mut gone = Vec::new();
    for &x in &cut.vision_inputs {
        if node_reads.contains(&x) || m.graphs[g].outputs.contains(&x) {
            let ty = m.value_type(x).clone();
            let name = m.values[x].name.clone();
            let xv = m.add_input(v, name, ty);
            m.replace_uses(x, xv, v, &[]);
        } else {
            gone.push(x);
        }
    }
    if !gone.is_empty() {
        remove_inputs(m, g, &gone);
        for &x in &gone {
            let index = m.graphs[v].inputs.len() as u32;
            if let ValueDef::Input {
                graph, index: i, ..
            } = &mut m.values[x].def
            {
                *graph = v;
                *i = index;
            }
            m.graphs[v].inputs.push(x);
        }
    }
    // Anything else the vision graph reads from the language graph's inputs (an unlabelled input
    // a copied node reads) becomes an input of it too, under the same name.
    let mut extra: Vec<Value> = Vec::new();
    for n in m.graphs[v].nodes().to_vec() {
        for x in reads(m, n) {
            if matches!(m.values[x].def, ValueDef::Input { graph, .. } if graph == g)
                && !extra.contains(&x)
            {
                extra.push(x);
            }
        }
    }
    for x in extra {
        let ty = m.value_type(x).clone();
        let name = m.values[x].name.clone();
        let xv = m.add_input(v, name, ty);
        m.replace_uses(x, xv, v, &[]);
    }
    // The boundary: outputs of the vision graph, inputs of the language graph.
    let mut taken: HashSet<String> = m.graphs[g]
        .inputs
        .iter()
        .chain(&m.graphs[g].outputs)
        .filter_map(|&x| m.values[x].name.clone())
        .collect();
    for (i, &b) in cut.boundary.iter().enumerate() {
        let out_index = m.graphs[v].outputs.len() as u32;
        m.graphs[v].outputs.push(b);
        if !node_reads.contains(&b) {
            // Only an output of the merged graph: now the vision graph's.
            m.graphs[g].outputs.retain(|&o| o != b);
            continue;
        }
        let name = match m.values[b].name.clone() {
            Some(n) if m.graphs[g].outputs.contains(&b) => n,
            _ => interface_name(m, b, i, &mut taken),
        };
        m.values[b].name = Some(name.clone());
        let ty = m.value_type(b).clone();
        let bg = m.add_input(g, Some(name), ty);
        m.replace_uses(b, bg, g, &[]);
        // A merged output that the language part also reads stays the vision graph's output.
        m.graphs[g].outputs.retain(|&o| o != bg);
        let in_index = (m.graphs[g].inputs.len() - 1) as u32;
        m.links.push(Link {
            from: (v, out_index),
            to: (g, in_index),
        });
    }
    v
}

/// Removes `gone` from the inputs of top-level graph `g`, renumbering the others and the links
/// into them.
fn remove_inputs(m: &mut Module, g: GraphId, gone: &[Value]) {
    let old: Vec<Value> = m.graphs[g].inputs.clone();
    let kept: Vec<Value> = old.iter().copied().filter(|x| !gone.contains(x)).collect();
    let renumber: HashMap<u32, u32> = old
        .iter()
        .enumerate()
        .filter_map(|(i, x)| {
            kept.iter()
                .position(|k| k == x)
                .map(|j| (i as u32, j as u32))
        })
        .collect();
    for (j, &x) in kept.iter().enumerate() {
        if let ValueDef::Input { index, .. } = &mut m.values[x].def {
            *index = j as u32;
        }
    }
    m.graphs[g].inputs = kept;
    m.links.retain_mut(|l| {
        if l.to.0 != g {
            return true;
        }
        match renumber.get(&l.to.1) {
            Some(&j) => {
                l.to.1 = j;
                true
            }
            None => false,
        }
    });
}

/// Whether [`ModalitySplit`] with `overrides` would split a graph of `m`.
pub fn splits(m: &Module, overrides: &[(String, Modality)]) -> bool {
    m.entries
        .iter()
        .any(|e| plan(m, e.graph, overrides).is_ok())
}

impl Pass for ModalitySplit {
    fn name(&self) -> &str {
        "modality-split"
    }

    fn run(&self, m: &mut Module, _opts: &PassOptions) -> Result<PassReport, PassError> {
        let mut report = PassReport::default();
        let roots: Vec<GraphId> = m.entries.iter().map(|e| e.graph).collect();
        let mut cuts = Vec::new();
        for &g in &roots {
            match plan(m, g, &self.modality) {
                Ok(cut) => cuts.push((g, cut)),
                Err(why) => report
                    .notes
                    .push(format!("graph '{}' left whole: {why}", m.graphs[g].name)),
            }
        }
        let several = cuts.len() > 1;
        for (k, (g, cut)) in cuts.into_iter().enumerate() {
            let suffix = if several {
                format!("_{k}")
            } else {
                String::new()
            };
            let merged = m.graphs[g].name.clone();
            let v = apply(m, g, &cut, &format!("{VISION_GRAPH}{suffix}"));
            m.graphs[g].name = format!("{LANGUAGE_GRAPH}{suffix}");
            let position = m
                .entries
                .iter()
                .position(|e| e.graph == g)
                .ok_or_else(|| fail("the graph is not an entry"))?;
            let model = m.entries[position].model.clone();
            m.entries.insert(position, Entry { graph: v, model });
            let names = |gr: GraphId, m: &Module, inputs: bool| {
                let list = if inputs {
                    &m.graphs[gr].inputs
                } else {
                    &m.graphs[gr].outputs
                };
                list.iter()
                    .map(|&x| m.values[x].name.clone().unwrap_or_default())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            report.notes.push(format!(
                "graph '{merged}' split: '{}' ({} -> {}) and '{}' ({} -> {})",
                m.graphs[v].name,
                names(v, m, true),
                names(v, m, false),
                m.graphs[g].name,
                names(g, m, true),
                names(g, m, false),
            ));
            report.count("split-graphs", 1);
            report.count("vision-nodes", cut.vision_nodes.len());
            report.count("boundary-values", cut.boundary.len());
        }
        Ok(report)
    }
}
