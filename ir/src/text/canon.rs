//! The canonical entity order of the text format, and [`canonicalize`].

use std::collections::{HashMap, HashSet};

use crate::attr::Attr;
use crate::constant::Const;
use crate::module::{Entry, GraphData, GraphId, Link, Module, Node, Value, ValueData, ValueDef};
use crate::op::Op;

/// For each constant, whether some value refers to it (it prints as `const`, else `tensor`).
pub(crate) fn const_has_value(m: &Module) -> Vec<bool> {
    let mut has = vec![false; m.consts.len()];
    for (_, v) in m.values.iter() {
        if let ValueDef::Const(c) = v.def
            && let Some(h) = has.get_mut(c.index())
        {
            *h = true;
        }
    }
    has
}

/// Adds every graph of the tree of `g` to `seen` (in print order), skipping graphs already in it.
fn mark_tree(m: &Module, g: GraphId, seen: &mut HashSet<GraphId>) {
    let Some(data) = m.graphs.get(g) else { return };
    if !seen.insert(g) {
        return;
    }
    for &n in &data.nodes {
        if let Some(node) = m.nodes.get(n) {
            for sg in node.op.subgraphs() {
                mark_tree(m, sg, seen);
            }
        }
    }
}

/// For each entry, whether it prints: its graph exists and no earlier entry's tree holds it.
pub(crate) fn printed_entries(m: &Module) -> Vec<bool> {
    let mut seen = HashSet::new();
    m.entries
        .iter()
        .map(|e| {
            if m.graphs.get(e.graph).is_none() || seen.contains(&e.graph) {
                false
            } else {
                mark_tree(m, e.graph, &mut seen);
                true
            }
        })
        .collect()
}

/// The links that print (both ends are printed entries), with the entry indices of their ends.
pub(crate) fn printed_links(m: &Module) -> Vec<(Link, usize, usize)> {
    let printed = printed_entries(m);
    let entry_of = |g: GraphId| {
        m.entries
            .iter()
            .enumerate()
            .position(|(i, e)| printed[i] && e.graph == g)
    };
    m.links
        .iter()
        .filter_map(|l| Some((*l, entry_of(l.from.0)?, entry_of(l.to.0)?)))
        .collect()
}

/// `op` with every graph handle in its attributes passed through `graph` and every constant
/// handle through `konst`.
fn remap_handles(
    op: &Op,
    graph: &dyn Fn(GraphId) -> GraphId,
    konst: &dyn Fn(Const) -> Const,
) -> Op {
    if op.subgraphs().is_empty() && op.attr_consts().is_empty() {
        return op.clone();
    }
    let attrs: Vec<(String, Attr)> = op
        .attrs()
        .into_iter()
        .map(|(n, a)| {
            let a = match a {
                Attr::Graph(g) => Attr::Graph(graph(g)),
                Attr::Graphs(gs) => Attr::Graphs(gs.into_iter().map(graph).collect()),
                Attr::Tensor(c) => Attr::Tensor(konst(c)),
                Attr::Tensors(cs) => Attr::Tensors(cs.into_iter().map(konst).collect()),
                a => a,
            };
            (n.to_owned(), a)
        })
        .collect();
    // As the parser builds it: typed where the op table models it and the attributes fit.
    Op::from_parts(op.domain(), op.op_type(), attrs)
}

/// Renumbers the arenas of `m` into the order in which the text format prints (and the parser
/// creates) them, so that `parse(&print(m))` equals `canonicalize(m)`.
///
/// The canonical order: symbols and constants keep their arena order, and each constant that a
/// value refers to gets its value right after it; then, entry by entry, a graph, its inputs,
/// and for each node in the graph's order the subgraphs in its attributes (recursively), the
/// node, and its results. Entities that no entry reaches (nodes no graph lists, graphs no entry
/// or node attribute holds, values they define) are dropped, as are links between graphs that
/// are not entries. The value of a constant takes the constant's name and its static type, and
/// references to a value that is not defined in the canonical order become missing operands
/// (or are dropped from graph outputs). A module that is already canonical is returned equal.
pub fn canonicalize(m: &Module) -> Module {
    canonicalize_impl(m, false)
}

/// [`canonicalize`], also dropping the constants that nothing reads: no operand, graph output,
/// graph input default or attribute of a printed graph refers to them. Passes leave such
/// constants behind when they replace the ops that read them.
pub fn canonicalize_pruned(m: &Module) -> Module {
    canonicalize_impl(m, true)
}

/// For each constant, whether a printed graph reads it.
fn consts_in_use(m: &Module) -> Vec<bool> {
    let mut used = vec![false; m.consts.len()];
    let mut mark = |c: Const| {
        if let Some(u) = used.get_mut(c.index()) {
            *u = true;
        }
    };
    let mut seen = HashSet::new();
    for (i, e) in m.entries.iter().enumerate() {
        if printed_entries(m)[i] {
            mark_tree(m, e.graph, &mut seen);
        }
    }
    let value_const = |v: Value| match m.values.get(v).map(|d| d.def) {
        Some(ValueDef::Const(c)) => Some(c),
        Some(ValueDef::Input { default, .. }) => default,
        _ => None,
    };
    for &g in &seen {
        let data = &m.graphs[g];
        for &v in data.inputs.iter().chain(&data.outputs) {
            if let Some(c) = value_const(v) {
                mark(c);
            }
        }
        for &n in &data.nodes {
            let Some(node) = m.nodes.get(n) else { continue };
            for v in node.inputs.iter().flatten() {
                if let Some(c) = value_const(*v) {
                    mark(c);
                }
            }
            for c in node.op.attr_consts() {
                mark(c);
            }
        }
    }
    used
}

fn canonicalize_impl(m: &Module, prune: bool) -> Module {
    let keep = if prune {
        consts_in_use(m)
    } else {
        vec![true; m.consts.len()]
    };
    let mut out = Module::new();
    for (_, s) in m.symbols.iter() {
        let new = out.symbol(&s.name);
        out.symbols[new].min = s.min;
        out.symbols[new].max = s.max;
        out.symbols[new].equals = s.equals.clone();
    }
    let has_value = const_has_value(m);
    let mut const_value = HashMap::new();
    let mut const_map = HashMap::new();
    for (c, data) in m.consts.iter() {
        if !keep[c.index()] {
            continue;
        }
        if has_value[c.index()] {
            const_value.insert(c, out.add_const(data.clone()));
            const_map.insert(c, Const::from_index(out.consts.len() - 1));
        } else {
            const_map.insert(c, out.add_attr_const(data.clone()));
        }
    }
    let mut cx = Canon {
        m,
        out,
        values: HashMap::new(),
        graphs: HashMap::new(),
        consts: if prune { Some(const_map) } else { None },
    };
    for (v, data) in m.values.iter() {
        if let ValueDef::Const(c) = data.def
            && let Some(&nv) = const_value.get(&c)
        {
            cx.values.insert(v, nv);
        }
    }
    let printed = printed_entries(m);
    let mut entry_graph = HashMap::new();
    for (i, e) in m.entries.iter().enumerate() {
        if printed[i] {
            let g = cx.graph(e.graph);
            entry_graph.entry(e.graph).or_insert(g);
            cx.out.entries.push(Entry {
                graph: g,
                model: e.model.clone(),
            });
        }
    }
    for (l, _, _) in printed_links(m) {
        if let (Some(&from), Some(&to)) = (entry_graph.get(&l.from.0), entry_graph.get(&l.to.0)) {
            cx.out.links.push(Link {
                from: (from, l.from.1),
                to: (to, l.to.1),
            });
        }
    }
    cx.out
}

struct Canon<'a> {
    m: &'a Module,
    out: Module,
    values: HashMap<Value, Value>,
    graphs: HashMap<GraphId, GraphId>,
    /// Old → new constant handles, when constants were dropped.
    consts: Option<HashMap<Const, Const>>,
}

impl Canon<'_> {
    fn graph(&mut self, g: GraphId) -> GraphId {
        let m = self.m;
        let data = &m.graphs[g];
        let ng = self.out.graphs.push(GraphData {
            name: data.name.clone(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            nodes: Vec::new(),
            parent: None,
            doc: data.doc.clone(),
        });
        self.graphs.insert(g, ng);
        for (index, &v) in data.inputs.iter().enumerate() {
            let (name, ty, default) = match m.values.get(v) {
                Some(d) => {
                    let default = match d.def {
                        ValueDef::Input { default, .. } => default,
                        _ => None,
                    };
                    let default = match (&self.consts, default) {
                        (Some(map), Some(c)) => map.get(&c).copied(),
                        (_, d) => d,
                    };
                    (d.name.clone(), m.types[d.ty].clone(), default)
                }
                None => (None, crate::Type::Unknown, None),
            };
            let ty = self.out.intern(ty);
            let nv = self.out.values.push(ValueData {
                name,
                ty,
                def: ValueDef::Input {
                    graph: ng,
                    index: index as u32,
                    default,
                },
            });
            self.out.graphs[ng].inputs.push(nv);
            self.values.insert(v, nv);
        }
        for &n in &data.nodes {
            if m.nodes.get(n).is_some() {
                self.node(n, ng);
            }
        }
        let outputs = data
            .outputs
            .iter()
            .filter_map(|v| self.values.get(v).copied())
            .collect();
        self.out.graphs[ng].outputs = outputs;
        ng
    }

    fn node(&mut self, n: Node, ng: GraphId) {
        let m = self.m;
        let data = &m.nodes[n];
        let mut subs = Vec::new();
        for sg in data.op.subgraphs() {
            if m.graphs.get(sg).is_some() && !self.graphs.contains_key(&sg) {
                subs.push(self.graph(sg));
            }
        }
        let graphs = &self.graphs;
        let consts = &self.consts;
        let op = remap_handles(&data.op, &|g| graphs.get(&g).copied().unwrap_or(g), &|c| {
            consts
                .as_ref()
                .and_then(|m| m.get(&c).copied())
                .unwrap_or(c)
        });
        let inputs = data
            .inputs
            .iter()
            .map(|o| o.and_then(|v| self.values.get(&v).copied()))
            .collect();
        let outputs = data
            .outputs
            .iter()
            .map(|o| {
                o.map(|v| match m.values.get(v) {
                    Some(d) => (d.name.clone(), m.types[d.ty].clone()),
                    None => (None, crate::Type::Unknown),
                })
            })
            .collect();
        let nn = self
            .out
            .add_node(ng, op, inputs, outputs, data.name.clone());
        for (old, new) in data.outputs.iter().zip(self.out.nodes[nn].outputs.clone()) {
            if let (Some(old), Some(new)) = (old, new) {
                self.values.insert(*old, new);
            }
        }
        for sg in subs {
            self.out.graphs[sg].parent = Some(nn);
        }
    }
}
