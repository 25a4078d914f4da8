//! A graph into one e-graph, and the extracted choice back into the graph.

use std::collections::{HashMap, HashSet};

use egg::{EGraph, Id, Language};
use mmq_ir::edit::NewNode;
use mmq_ir::{At, GraphId, Module, Node, Op, Type, Value, ValueDef};

use super::facts::Facts;
use super::lang::{TNode, kind_of};

pub(crate) type EG = EGraph<TNode, Facts>;

/// A graph as an e-graph, with what is needed to map the result back.
pub(crate) struct Built {
    pub egraph: EG,
    /// The [`TNode::Root`] class.
    pub root: Id,
    /// Class of each graph output.
    pub outputs: Vec<Id>,
    /// Values of this graph that subgraphs read, with their classes.
    pub pinned: Vec<(Value, Id)>,
    /// Every node of the graph as added (children at add time).
    pub originals: Vec<(Node, TNode)>,
    /// Every value the graph's nodes define, with its class.
    pub defined: Vec<(Value, Id)>,
}

/// Values defined outside `graph`'s nodes but read inside subgraphs nested in it are not a
/// concern; values *of* `graph` read by nested subgraphs must stay visible under their handle.
fn values_read_by_subgraphs(m: &Module, graph: GraphId) -> HashSet<Value> {
    let mut out = HashSet::new();
    let mut stack: Vec<GraphId> = Vec::new();
    for &n in m.graphs[graph].nodes() {
        stack.extend(m.nodes[n].op.subgraphs());
    }
    while let Some(g) = stack.pop() {
        for &n in m.graphs[g].nodes() {
            out.extend(m.nodes[n].inputs.iter().flatten().copied());
            stack.extend(m.nodes[n].op.subgraphs());
        }
        out.extend(m.graphs[g].outputs.iter().copied());
    }
    out
}

/// Builds the e-graph of top-level or nested graph `graph`.
pub(crate) fn build(m: &Module, graph: GraphId, mut facts: Facts) -> Built {
    facts.opset = m.onnx_opset(graph).unwrap_or(mmq_ir::infer::DEFAULT_OPSET);
    facts.max_opset = facts.max_opset.max(facts.opset);
    let mut eg = EG::new(facts);
    let mut class: HashMap<Value, Id> = HashMap::new();
    let none = eg.add(TNode::None);
    let mut originals = Vec::new();
    let mut defined = Vec::new();
    let mut types: Vec<(Id, Type)> = Vec::new();

    fn leaf(m: &Module, eg: &mut EG, class: &mut HashMap<Value, Id>, v: Value) -> Id {
        if let Some(&id) = class.get(&v) {
            return id;
        }
        eg.analysis.describe_value(m, v);
        let id = eg.add(TNode::Value(v.index() as u32));
        class.insert(v, id);
        id
    }

    for &n in m.graphs[graph].nodes() {
        let nd = &m.nodes[n];
        let mut args: Vec<Id> = nd
            .inputs
            .iter()
            .map(|i| match i {
                Some(v) => leaf(m, &mut eg, &mut class, *v),
                None => none,
            })
            .collect();
        let k = eg.analysis.intern_op(nd.op.clone());
        args.push(eg.add(TNode::Attrs(k)));
        let mut outs = 0u32;
        for (i, o) in nd.outputs.iter().enumerate() {
            if o.is_some() && i < 32 {
                outs |= 1 << i;
            }
        }
        let enode = TNode::Op {
            kind: kind_of(&nd.op),
            outs,
            args,
        };
        let id = eg.add(enode.clone());
        originals.push((n, enode));
        if outs == 1 {
            let v = nd.outputs[0].expect("slot 0 present");
            class.insert(v, id);
            defined.push((v, id));
            types.push((id, m.value_type(v).clone()));
        } else {
            for (i, o) in nd.outputs.iter().enumerate() {
                if let Some(v) = o {
                    let gid = eg.add(TNode::Get(i as u32, [id]));
                    class.insert(*v, gid);
                    defined.push((*v, gid));
                    types.push((gid, m.value_type(*v).clone()));
                }
            }
        }
    }
    let outputs: Vec<Id> = m.graphs[graph]
        .outputs
        .iter()
        .map(|&v| leaf(m, &mut eg, &mut class, v))
        .collect();
    let mut pinned: Vec<(Value, Id)> = values_read_by_subgraphs(m, graph)
        .into_iter()
        .filter_map(|v| class.get(&v).map(|&id| (v, id)))
        .collect();
    pinned.sort_by_key(|(v, _)| v.index());
    let mut roots = outputs.clone();
    roots.extend(pinned.iter().map(|&(_, id)| id));
    let root = eg.add(TNode::Root(roots));
    for (id, ty) in types {
        if !matches!(ty, Type::Unknown) {
            let id = eg.find(id);
            eg[id].data.ty = Some(ty);
        }
    }
    eg.rebuild();
    Built {
        egraph: eg,
        root,
        outputs,
        pinned,
        originals,
        defined,
    }
}

/// Writes the chosen nodes (`choice[class]`) back into `graph`: original nodes whose e-node
/// was chosen are kept (handles, names and types unchanged) with their operands redirected;
/// other chosen e-nodes become new nodes. Returns the number of new nodes.
pub(crate) fn write_back(
    m: &mut Module,
    graph: GraphId,
    built: &Built,
    choice: &HashMap<Id, TNode>,
) -> usize {
    let eg = &built.egraph;
    let canon = |n: &TNode| n.clone().map_children(|c| eg.find(c));
    let mut original_of: HashMap<TNode, Node> = HashMap::new();
    for (n, e) in &built.originals {
        original_of.entry(canon(e)).or_insert(*n);
    }
    // Post-order over the chosen DAG from the root.
    let root = eg.find(built.root);
    let mut order: Vec<Id> = Vec::new();
    let mut seen: HashSet<Id> = HashSet::new();
    let mut stack: Vec<(Id, bool)> = vec![(root, false)];
    while let Some((c, expanded)) = stack.pop() {
        if expanded {
            order.push(c);
            continue;
        }
        if !seen.insert(c) {
            continue;
        }
        stack.push((c, true));
        if let Some(n) = choice.get(&c) {
            for &ch in n.children().iter().rev() {
                let ch = eg.find(ch);
                if !seen.contains(&ch) {
                    stack.push((ch, false));
                }
            }
        }
    }
    // Original values, by class, whose names a new node may take.
    let mut names_of: HashMap<Id, Vec<Value>> = HashMap::new();
    for &(v, id) in &built.defined {
        names_of.entry(eg.find(id)).or_default().push(v);
    }

    let mut val: HashMap<Id, Option<Value>> = HashMap::new();
    let mut tuple: HashMap<Id, Vec<Option<Value>>> = HashMap::new();
    let mut lits: HashMap<u32, Value> = HashMap::new();
    let mut nodes: Vec<Node> = Vec::new();
    let mut reused: HashSet<Node> = HashSet::new();
    let mut fresh: Vec<(Id, Vec<Option<Value>>, Node)> = Vec::new();
    let mut created = 0usize;
    let mut got: Vec<(Id, Value)> = Vec::new();
    for c in order {
        let Some(n) = choice.get(&c) else { continue };
        match n {
            TNode::Value(v) => {
                val.insert(c, Some(Value::from_index(*v as usize)));
            }
            TNode::Lit(l) => {
                let v = *lits
                    .entry(*l)
                    .or_insert_with(|| m.add_const(eg.analysis.lits[*l as usize].clone()));
                val.insert(c, Some(v));
            }
            TNode::None => {
                val.insert(c, None);
            }
            TNode::Attrs(_) | TNode::Root(_) => {}
            TNode::Get(i, [t]) => {
                let t = eg.find(*t);
                let v = tuple
                    .get(&t)
                    .and_then(|outs| outs.get(*i as usize).copied().flatten());
                if let (Some(v), Some(ty)) = (v, &eg[c].data.ty)
                    && matches!(m.value_type(v), Type::Unknown)
                {
                    m.set_type(v, ty.clone());
                }
                if let Some(v) = v {
                    got.push((c, v));
                }
                val.insert(c, v);
            }
            TNode::Op { outs, args, .. } => {
                let (operands, attrs) = args.split_at(args.len() - 1);
                let inputs: Vec<Option<Value>> = operands
                    .iter()
                    .map(|&a| val.get(&eg.find(a)).copied().flatten())
                    .collect();
                let node = match original_of.get(&canon(n)) {
                    Some(&orig) if reused.insert(orig) => {
                        m.set_operands(orig, inputs);
                        orig
                    }
                    _ => {
                        let op = match choice.get(&eg.find(attrs[0])) {
                            Some(TNode::Attrs(k)) => eg.analysis.ops[*k as usize].clone(),
                            _ => Op::Identity {},
                        };
                        let width = 32 - outs.leading_zeros() as usize;
                        let slots: Vec<Option<(Option<String>, Type)>> = (0..width)
                            .map(|i| {
                                (outs & (1 << i) != 0).then(|| {
                                    let ty = if *outs == 1 {
                                        eg[c].data.ty.clone().unwrap_or(Type::Unknown)
                                    } else {
                                        Type::Unknown
                                    };
                                    (None, ty)
                                })
                            })
                            .collect();
                        created += 1;
                        // The graph's list is rebuilt below.
                        let node = m.cursor(graph, At::Unlisted).insert(NewNode {
                            op,
                            inputs,
                            outputs: slots,
                            name: None,
                        });
                        fresh.push((c, m.nodes[node].outputs.clone(), node));
                        node
                    }
                };
                nodes.push(node);
                let results = m.nodes[node].outputs.clone();
                if *outs == 1 {
                    val.insert(c, results.first().copied().flatten());
                } else {
                    tuple.insert(c, results);
                }
            }
        }
    }
    // Names: a new result takes the name of an original value of its class that is gone.
    let live: HashSet<Value> = nodes
        .iter()
        .flat_map(|&n| m.nodes[n].outputs.iter().flatten().copied())
        .collect();
    for (c, outs, node) in &fresh {
        let single =
            outs.iter().flatten().count() == 1 && outs.first().is_some_and(|o| o.is_some());
        if !single {
            continue;
        }
        let Some(v) = outs[0] else { continue };
        if let Some(dead) = names_of
            .get(c)
            .and_then(|vs| vs.iter().find(|x| !live.contains(x)))
        {
            m.values[v].name = m.values[*dead].name.clone();
            if let ValueDef::Output { node: dn, .. } = m.values[*dead].def {
                m.nodes[*node].name = m.nodes[dn].name.clone();
            }
        }
    }
    // Results of new multi-result nodes, the same way.
    let fresh_values: HashSet<Value> = fresh
        .iter()
        .flat_map(|(_, outs, _)| outs.iter().flatten().copied())
        .collect();
    for (c, v) in got {
        if fresh_values.contains(&v)
            && m.values[v].name.is_none()
            && let Some(dead) = names_of
                .get(&c)
                .and_then(|vs| vs.iter().find(|x| !live.contains(x)))
        {
            m.values[v].name = m.values[*dead].name.clone();
        }
    }
    // Values read by subgraphs: redirect to their replacements.
    let mut subst: HashMap<Value, Value> = HashMap::new();
    for &(v, id) in &built.pinned {
        if let Some(Some(w)) = val.get(&eg.find(id))
            && *w != v
        {
            subst.insert(v, *w);
        }
    }
    if !subst.is_empty() {
        let mut stack: Vec<GraphId> = nodes
            .iter()
            .flat_map(|&n| m.nodes[n].op.subgraphs())
            .collect();
        while let Some(g) = stack.pop() {
            for n in m.graphs[g].nodes().to_vec() {
                for i in m.nodes[n].inputs.iter_mut().flatten() {
                    if let Some(w) = subst.get(i) {
                        *i = *w;
                    }
                }
                stack.extend(m.nodes[n].op.subgraphs());
            }
            for o in m.graphs[g].outputs.iter_mut() {
                if let Some(w) = subst.get(o) {
                    *o = *w;
                }
            }
        }
    }
    // Graph outputs keep their names.
    let old_outputs = m.graphs[graph].outputs.clone();
    let mut new_outputs = Vec::with_capacity(old_outputs.len());
    let mut taken: HashSet<Value> = HashSet::new();
    for (i, &old) in old_outputs.iter().enumerate() {
        let Some(w) = val.get(&eg.find(built.outputs[i])).copied().flatten() else {
            new_outputs.push(old);
            continue;
        };
        // A result of this graph's nodes takes the output's name (intermediate names are not
        // part of the interface); an input, a constant or a value that already is another
        // output is passed through an Identity instead.
        if w == old || (!taken.contains(&w) && !is_outside(m, w)) {
            if w != old {
                m.values[w].name = m.values[old].name.clone();
            }
            taken.insert(w);
            new_outputs.push(w);
        } else {
            let ty = m.value_type(old).clone();
            let name = m.values[old].name.clone();
            let idn = m.cursor(graph, At::Unlisted).insert(NewNode {
                op: Op::Identity {},
                inputs: vec![Some(w)],
                outputs: vec![Some((name, ty))],
                name: None,
            });
            nodes.push(idn);
            created += 1;
            let o = m.nodes[idn].outputs[0].expect("identity result");
            taken.insert(o);
            new_outputs.push(o);
        }
    }
    m.graphs[graph].outputs = new_outputs;
    let nested = nodes.iter().any(|&n| !m.nodes[n].op.subgraphs().is_empty());
    m.set_node_order(graph, nodes);
    // The post-order above follows operands only: a node whose subgraph reads a value of this
    // graph may come before that value's definition. Reorder with the captures as edges
    // (the listed order is kept wherever it already holds).
    if nested && let Ok(order) = mmq_ir::view::topo_order(m, graph) {
        m.set_node_order(graph, order);
    }
    created
}

/// A value not defined by a node (input or constant).
fn is_outside(m: &Module, v: Value) -> bool {
    !matches!(m.values[v].def, ValueDef::Output { .. })
}
