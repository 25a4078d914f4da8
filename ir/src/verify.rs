//! The verifier: checks the invariants stated in the crate documentation and collects every
//! violation, each naming its entity. It never panics, even on modules with dangling handles.
//!
//! Checks, in order:
//! 1. every handle is in range (types, values, nodes, graphs, constants, subgraph references);
//! 2. definitions agree with the lists holding them (`ValueDef::Input` ↔ graph inputs,
//!    `ValueDef::Output` ↔ node results, `NodeData::graph` ↔ the graph listing the node), each
//!    node is listed by at most one graph, and no value is defined twice;
//! 3. subgraphs: referenced by exactly one node, whose `parent` link points back, without cycles;
//! 4. scoping and order: each operand is a graph input, a constant, a result of an earlier node of
//!    the same graph or a value visible from an enclosing graph; graph outputs are visible;
//! 5. arity of modeled ops and attribute sanity (permutations, dtype codes, axes in range);
//! 6. value names are unique within a top-level graph and its subgraphs;
//! 7. sizes: no known dim is negative, and no static shape holds more than 2^63 − 1 elements;
//! 8. when the module is otherwise valid, declared types that contradict inference (an element
//!    type, a rank or a known dim other than the op computes): errors, since the kernels would
//!    produce another type than the one every pass reads.

use std::collections::{HashMap, HashSet};

use crate::diag::{Entity, IrError, Severity};
use crate::dtype::DType;
use crate::infer::{conflicts, node_label, value_label};
use crate::module::{GraphId, Module, Node, Value, ValueDef};
use crate::op::Op;

/// Verifies `m`. Returns every diagnostic (errors and warnings) when at least one is an error;
/// `Ok(())` when there are none or only warnings (see [`verify_all`] to get those too).
pub fn verify(m: &Module) -> Result<(), Vec<IrError>> {
    let all = verify_all(m);
    if all.iter().any(|e| e.severity == Severity::Error) {
        Err(all)
    } else {
        Ok(())
    }
}

/// Every error and warning about `m`, in check order.
pub fn verify_all(m: &Module) -> Vec<IrError> {
    let mut v = Verifier {
        m,
        errors: Vec::new(),
        listed: vec![Vec::new(); m.nodes.len()],
    };
    v.handles();
    v.symbol_equalities();
    v.definitions();
    v.subgraphs();
    v.scopes();
    v.ops();
    v.names();
    v.sizes();
    if !v.errors.iter().any(|e| e.severity == Severity::Error) {
        let mut copy = m.clone();
        for w in conflicts(&mut copy) {
            v.errors.push(IrError::error(
                w.entity,
                format!("{}, which its definition does not compute", w.message),
            ));
        }
    }
    v.errors
}

struct Verifier<'a> {
    m: &'a Module,
    errors: Vec<IrError>,
    /// For each node, the graphs whose lists hold it (once per occurrence).
    listed: Vec<Vec<GraphId>>,
}

/// Unbounded arity (the op table's `*`).
const MANY: usize = usize::MAX;

/// Every operator name of the ONNX default domain (all opsets; `tools/onnx_op_names.py`).
const ONNX_OPS: &str = include_str!("onnx_ops.txt");

/// Ops that ONNX Runtime registers in the default domain although ONNX does not define them
/// (its RMS norm, which mmq's ONNX Runtime target emits, and ORT's optimizer writes).
const RUNTIME_DEFAULT_DOMAIN_OPS: &[&str] = &["SimplifiedLayerNormalization"];

/// Whether `op_type` is an operator of the ONNX default domain in some opset, or one that ONNX
/// Runtime adds to it.
pub fn is_onnx_op(op_type: &str) -> bool {
    RUNTIME_DEFAULT_DOMAIN_OPS.contains(&op_type)
        || ONNX_OPS
            .lines()
            .filter(|l| !l.starts_with('#'))
            .any(|l| l == op_type)
}

/// Why a default-domain node of a modeled op type did not become the typed op: the first
/// attribute that is unknown, repeated, or of another kind than the op table's.
fn custom_fallback_reason(c: &crate::op::CustomOp, known: &[&str]) -> String {
    let mut seen = HashSet::new();
    for (name, attr) in &c.attrs {
        if !known.contains(&name.as_str()) {
            return if known.is_empty() {
                format!("{} takes no attributes, but '{name}' is set", c.op_type)
            } else {
                format!(
                    "'{name}' is not an attribute of {}: {}",
                    c.op_type,
                    known.join(", ")
                )
            };
        }
        if !seen.insert(name.as_str()) {
            return format!("attribute '{name}' is given twice");
        }
        if Op::from_parts(&c.domain, &c.op_type, vec![(name.clone(), attr.clone())]).is_custom() {
            return format!("attribute '{name}' is not of the kind the op takes");
        }
    }
    "its attributes do not fit the op".to_owned()
}

impl Verifier<'_> {
    fn err(&mut self, entity: Entity, msg: String) {
        self.errors.push(IrError::error(entity, msg));
    }

    fn graph_label(&self, g: GraphId) -> String {
        match self.m.graphs.get(g) {
            Some(d) if !d.name.is_empty() => format!("graph '{}'", d.name),
            _ => format!("graph {g:?}"),
        }
    }

    fn vl(&self, v: Value) -> String {
        format!("value {}", value_label(self.m, v))
    }

    fn nl(&self, n: Node) -> String {
        format!("node {}", node_label(self.m, n))
    }

    fn value_ok(&self, v: Value) -> bool {
        self.m.values.get(v).is_some()
    }

    /// Check 1: handles in range.
    fn handles(&mut self) {
        let m = self.m;
        for (v, d) in m.values.iter() {
            if d.ty.index() >= m.types.len() {
                self.err(
                    Entity::Value(v),
                    format!("{} has a dangling type handle {:?}", self.vl(v), d.ty),
                );
            }
            match d.def {
                ValueDef::Input { graph, default, .. } => {
                    if m.graphs.get(graph).is_none() {
                        self.err(
                            Entity::Value(v),
                            format!("{} is an input of missing graph {graph:?}", self.vl(v)),
                        );
                    }
                    if let Some(c) = default
                        && m.consts.get(c).is_none()
                    {
                        self.err(
                            Entity::Value(v),
                            format!("{} has a dangling default constant {c:?}", self.vl(v)),
                        );
                    }
                }
                ValueDef::Output { node, .. } => {
                    if m.nodes.get(node).is_none() {
                        self.err(
                            Entity::Value(v),
                            format!("{} is a result of missing node {node:?}", self.vl(v)),
                        );
                    }
                }
                ValueDef::Const(c) => {
                    if m.consts.get(c).is_none() {
                        self.err(
                            Entity::Value(v),
                            format!("{} refers to missing constant {c:?}", self.vl(v)),
                        );
                    }
                }
            }
        }
        for (g, d) in m.graphs.iter() {
            let gl = self.graph_label(g);
            for (what, list) in [("input", &d.inputs), ("output", &d.outputs)] {
                for (i, &v) in list.iter().enumerate() {
                    if !self.value_ok(v) {
                        self.err(
                            Entity::Graph(g),
                            format!("{gl}: {what} #{i} is a dangling value handle {v:?}"),
                        );
                    }
                }
            }
            for (i, &n) in d.nodes.iter().enumerate() {
                match self.listed.get_mut(n.index()) {
                    Some(l) => l.push(g),
                    None => self.err(
                        Entity::Graph(g),
                        format!("{gl}: node #{i} is a dangling node handle {n:?}"),
                    ),
                }
            }
            if let Some(p) = d.parent
                && m.nodes.get(p).is_none()
            {
                self.err(
                    Entity::Graph(g),
                    format!("{gl}: parent is a dangling node handle {p:?}"),
                );
            }
        }
        for (n, d) in m.nodes.iter() {
            if self.listed[n.index()].is_empty() {
                continue;
            }
            if m.graphs.get(d.graph).is_none() {
                self.err(
                    Entity::Node(n),
                    format!("{}: graph is a dangling handle {:?}", self.nl(n), d.graph),
                );
            }
            for (what, list) in [("operand", &d.inputs), ("result", &d.outputs)] {
                for (i, v) in list.iter().enumerate() {
                    if let Some(v) = v
                        && !self.value_ok(*v)
                    {
                        self.err(
                            Entity::Node(n),
                            format!(
                                "{}: {what} #{i} is a dangling value handle {v:?}",
                                self.nl(n)
                            ),
                        );
                    }
                }
            }
            for g in d.op.subgraphs() {
                if m.graphs.get(g).is_none() {
                    self.err(
                        Entity::Node(n),
                        format!("{}: attribute refers to missing graph {g:?}", self.nl(n)),
                    );
                }
            }
            for c in d.op.attr_consts() {
                if m.consts.get(c).is_none() {
                    self.err(
                        Entity::Node(n),
                        format!("{}: attribute refers to missing constant {c:?}", self.nl(n)),
                    );
                }
            }
        }
        for (i, e) in m.entries.iter().enumerate() {
            match m.graphs.get(e.graph) {
                None => self.err(
                    Entity::Module,
                    format!("entry #{i} refers to missing graph {:?}", e.graph),
                ),
                Some(d) if d.parent.is_some() => self.err(
                    Entity::Graph(e.graph),
                    format!(
                        "{} is an entry but has a parent node",
                        self.graph_label(e.graph)
                    ),
                ),
                Some(_) => {}
            }
        }
        for (i, l) in m.links.iter().enumerate() {
            let out_ok = m
                .graphs
                .get(l.from.0)
                .is_some_and(|d| (l.from.1 as usize) < d.outputs.len());
            let in_ok = m
                .graphs
                .get(l.to.0)
                .is_some_and(|d| (l.to.1 as usize) < d.inputs.len());
            if !out_ok || !in_ok {
                self.err(
                    Entity::Module,
                    format!("link #{i} refers to a missing graph output or input"),
                );
            }
        }
    }

    /// Check 2: definitions agree with the lists that hold them.
    fn definitions(&mut self) {
        let m = self.m;
        let mut defs: HashMap<Value, Vec<String>> = HashMap::new();
        for (g, d) in m.graphs.iter() {
            for (i, &v) in d.inputs.iter().enumerate() {
                let Some(vd) = m.values.get(v) else { continue };
                defs.entry(v)
                    .or_default()
                    .push(format!("input #{i} of {}", self.graph_label(g)));
                let ok = matches!(vd.def, ValueDef::Input { graph, index, .. } if graph == g && index as usize == i);
                if !ok {
                    self.err(
                        Entity::Value(v),
                        format!(
                            "{} is input #{i} of {} but its definition says {:?}",
                            self.vl(v),
                            self.graph_label(g),
                            vd.def
                        ),
                    );
                }
            }
        }
        for (n, d) in m.nodes.iter() {
            let listed = self.listed[n.index()].clone();
            if listed.is_empty() {
                continue;
            }
            let mut uniq = listed.clone();
            uniq.sort();
            uniq.dedup();
            if listed.len() > 1 {
                let names: Vec<String> = uniq.iter().map(|&g| self.graph_label(g)).collect();
                self.err(
                    Entity::Node(n),
                    format!(
                        "{} is listed {} times (by {})",
                        self.nl(n),
                        listed.len(),
                        names.join(", ")
                    ),
                );
            }
            if !uniq.contains(&d.graph) {
                self.err(
                    Entity::Node(n),
                    format!(
                        "{} says it belongs to {} but is listed by {}",
                        self.nl(n),
                        self.graph_label(d.graph),
                        self.graph_label(uniq[0])
                    ),
                );
            }
            for (i, v) in d.outputs.iter().enumerate() {
                let Some(v) = *v else { continue };
                let Some(vd) = m.values.get(v) else { continue };
                defs.entry(v)
                    .or_default()
                    .push(format!("result #{i} of {}", self.nl(n)));
                let ok = matches!(vd.def, ValueDef::Output { node, index } if node == n && index as usize == i);
                if !ok {
                    self.err(
                        Entity::Value(v),
                        format!(
                            "{} is result #{i} of {} but its definition says {:?}",
                            self.vl(v),
                            self.nl(n),
                            vd.def
                        ),
                    );
                }
            }
        }
        let mut twice: Vec<(Value, Vec<String>)> =
            defs.into_iter().filter(|(_, d)| d.len() > 1).collect();
        twice.sort_by_key(|(v, _)| *v);
        for (v, places) in twice {
            self.err(
                Entity::Value(v),
                format!(
                    "{} is defined {} times: {}",
                    self.vl(v),
                    places.len(),
                    places.join(", ")
                ),
            );
        }
        for (v, vd) in m.values.iter() {
            match vd.def {
                ValueDef::Input { graph, index, .. } => {
                    if m.graphs
                        .get(graph)
                        .is_some_and(|g| g.inputs.get(index as usize) != Some(&v))
                    {
                        self.err(
                            Entity::Value(v),
                            format!(
                                "{} claims to be input #{index} of {}, which does not hold it",
                                self.vl(v),
                                self.graph_label(graph)
                            ),
                        );
                    }
                }
                ValueDef::Output { node, index } => {
                    if let Some(nd) = m.nodes.get(node)
                        && !self.listed[node.index()].is_empty()
                        && nd.outputs.get(index as usize) != Some(&Some(v))
                    {
                        self.err(
                            Entity::Value(v),
                            format!(
                                "{} claims to be result #{index} of {}, which does not produce it",
                                self.vl(v),
                                self.nl(node)
                            ),
                        );
                    }
                }
                ValueDef::Const(_) => {}
            }
        }
    }

    /// Check 3: subgraph ownership.
    fn subgraphs(&mut self) {
        let m = self.m;
        let mut owners: HashMap<GraphId, Vec<Node>> = HashMap::new();
        for (n, d) in m.nodes.iter() {
            if self.listed[n.index()].is_empty() {
                continue;
            }
            for g in d.op.subgraphs() {
                if m.graphs.get(g).is_some() {
                    owners.entry(g).or_default().push(n);
                }
            }
        }
        for (g, d) in m.graphs.iter() {
            let holders = owners.get(&g).cloned().unwrap_or_default();
            if holders.len() > 1 {
                let names: Vec<String> = holders.iter().map(|&n| self.nl(n)).collect();
                self.err(
                    Entity::Graph(g),
                    format!(
                        "{} is the body of {} nodes: {}",
                        self.graph_label(g),
                        holders.len(),
                        names.join(", ")
                    ),
                );
            }
            match (d.parent, holders.first()) {
                (Some(p), _) if !holders.contains(&p) && m.nodes.get(p).is_some() => {
                    self.err(
                        Entity::Graph(g),
                        format!(
                            "{} names {} as parent, but that node does not hold it",
                            self.graph_label(g),
                            self.nl(p)
                        ),
                    );
                }
                (None, Some(&h)) => {
                    self.err(
                        Entity::Graph(g),
                        format!(
                            "{} is the body of {} but has no parent",
                            self.graph_label(g),
                            self.nl(h)
                        ),
                    );
                }
                _ => {}
            }
            // Parent chains must end at a top-level graph.
            let mut cur = g;
            let mut steps = 0;
            while let Some(p) = m.graphs.get(cur).and_then(|d| d.parent) {
                let Some(pn) = m.nodes.get(p) else { break };
                cur = pn.graph;
                steps += 1;
                if cur == g || steps > m.graphs.len() {
                    self.err(
                        Entity::Graph(g),
                        format!("{} is nested in itself", self.graph_label(g)),
                    );
                    break;
                }
            }
        }
    }

    /// Check 4: every operand visible and defined earlier; graph outputs visible.
    fn scopes(&mut self) {
        let m = self.m;
        let mut visible = vec![false; m.values.len()];
        for (v, d) in m.values.iter() {
            if matches!(d.def, ValueDef::Const(_)) {
                visible[v.index()] = true;
            }
        }
        // Where each node is listed: graph and position.
        let mut position: HashMap<Node, (GraphId, usize)> = HashMap::new();
        for (g, d) in m.graphs.iter() {
            for (i, &n) in d.nodes.iter().enumerate() {
                position.entry(n).or_insert((g, i));
            }
        }
        let mut done = HashSet::new();
        let roots: Vec<GraphId> = m
            .graphs
            .iter()
            .filter(|(_, d)| d.parent.is_none())
            .map(|(g, _)| g)
            .collect();
        for g in roots {
            self.scope_graph(g, &mut visible, &mut done, &position);
        }
        let rest: Vec<GraphId> = m.graphs.keys().collect();
        for g in rest {
            self.scope_graph(g, &mut visible, &mut done, &position);
        }
    }

    fn scope_graph(
        &mut self,
        g: GraphId,
        visible: &mut [bool],
        done: &mut HashSet<GraphId>,
        position: &HashMap<Node, (GraphId, usize)>,
    ) {
        let m = self.m;
        let Some(gd) = m.graphs.get(g) else { return };
        if !done.insert(g) {
            return;
        }
        let mut added: Vec<Value> = Vec::new();
        let show = |v: Value, visible: &mut [bool], added: &mut Vec<Value>| {
            if let Some(slot) = visible.get_mut(v.index())
                && !*slot
            {
                *slot = true;
                added.push(v);
            }
        };
        for &v in &gd.inputs {
            show(v, visible, &mut added);
        }
        for (pos, &n) in gd.nodes.iter().enumerate() {
            let Some(nd) = m.nodes.get(n) else { continue };
            for (i, v) in nd.inputs.iter().enumerate() {
                let Some(v) = *v else { continue };
                if visible.get(v.index()).copied().unwrap_or(true) {
                    continue;
                }
                let why = self.why_invisible(v, g, pos, position);
                self.err(
                    Entity::Node(n),
                    format!("{}: operand #{i} {} {why}", self.nl(n), self.vl(v)),
                );
            }
            for sg in nd.op.subgraphs() {
                self.scope_graph(sg, visible, done, position);
            }
            for v in nd.outputs.iter().flatten() {
                show(*v, visible, &mut added);
            }
        }
        for (i, &v) in gd.outputs.iter().enumerate() {
            if !visible.get(v.index()).copied().unwrap_or(true) {
                let why = self.why_invisible(v, g, gd.nodes.len(), position);
                self.err(
                    Entity::Graph(g),
                    format!("{}: output #{i} {} {why}", self.graph_label(g), self.vl(v)),
                );
            }
        }
        for v in added {
            visible[v.index()] = false;
        }
    }

    fn why_invisible(
        &self,
        v: Value,
        g: GraphId,
        pos: usize,
        position: &HashMap<Node, (GraphId, usize)>,
    ) -> String {
        match self.m.values.get(v).map(|d| d.def) {
            Some(ValueDef::Output { node, .. }) => match position.get(&node) {
                Some(&(pg, p)) if pg == g && p >= pos => format!(
                    "is used before its definition by {} (nodes are not in topological order)",
                    self.nl(node)
                ),
                Some(&(pg, _)) => format!(
                    "is defined in {}, which is not visible here",
                    self.graph_label(pg)
                ),
                None => format!(
                    "is used but never defined ({} is not in any graph)",
                    self.nl(node)
                ),
            },
            Some(ValueDef::Input { graph, .. }) => {
                format!(
                    "is an input of {}, which is not visible here",
                    self.graph_label(graph)
                )
            }
            _ => "is not defined".to_owned(),
        }
    }

    /// Check 5: arity and attributes of modeled ops.
    fn ops(&mut self) {
        let m = self.m;
        for (n, d) in m.nodes.iter() {
            if self.listed[n.index()].is_empty() {
                continue;
            }
            if let Op::Custom(c) = &d.op
                && matches!(c.domain.as_str(), "" | "ai.onnx")
                && Op::attr_names("", &c.op_type).is_none()
                && !is_onnx_op(&c.op_type)
            {
                self.err(
                    Entity::Node(n),
                    format!(
                        "{}: '{}' is not an operator of the ONNX default domain (in any opset \
                         up to 28); an op of one's own needs a domain of its own",
                        self.nl(n),
                        c.op_type
                    ),
                );
            }
            if let Op::If {
                then_branch,
                else_branch,
            } = &d.op
            {
                for (which, g) in [("then", then_branch), ("else", else_branch)] {
                    let count = g.and_then(|g| m.graphs.get(g)).map(|gd| gd.outputs.len());
                    if let Some(count) = count.filter(|&c| c != d.outputs.len()) {
                        self.err(
                            Entity::Node(n),
                            format!(
                                "{}: its {which} branch returns {count} values, the node has \
                                 {} results",
                                self.nl(n),
                                d.outputs.len()
                            ),
                        );
                    }
                }
                // Each result has one element type, whichever branch runs.
                let outs =
                    |g: &Option<GraphId>| g.and_then(|g| m.graphs.get(g)).map(|gd| &gd.outputs);
                if let (Some(t), Some(e)) = (outs(then_branch), outs(else_branch)) {
                    for (i, (&a, &b)) in t.iter().zip(e).enumerate() {
                        let (ta, tb) = (m.value_type(a).dtype(), m.value_type(b).dtype());
                        if let (Some(ta), Some(tb)) = (ta, tb)
                            && ta != tb
                        {
                            self.err(
                                Entity::Node(n),
                                format!(
                                    "{}: result {i} is {ta} from the then branch and {tb} from \
                                     the else branch; both branches must return one type",
                                    self.nl(n)
                                ),
                            );
                        }
                    }
                }
            }
            // Operators whose operands share one element type (ONNX's `T` for all of them).
            if matches!(
                d.op.op_type(),
                "Add"
                    | "Sub"
                    | "Mul"
                    | "Div"
                    | "Max"
                    | "Min"
                    | "Sum"
                    | "Mean"
                    | "Equal"
                    | "Less"
                    | "LessOrEqual"
                    | "Greater"
                    | "GreaterOrEqual"
                    | "And"
                    | "Or"
                    | "Xor"
                    | "BitwiseAnd"
                    | "BitwiseOr"
                    | "BitwiseXor"
            ) && d.op.domain().is_empty()
            {
                let types: Vec<(usize, DType)> = d
                    .inputs
                    .iter()
                    .enumerate()
                    .filter_map(|(i, v)| Some((i, m.value_type((*v)?).dtype()?)))
                    .collect();
                if let Some(&(i, ti)) = types.iter().find(|(_, t)| *t != types[0].1) {
                    self.err(
                        Entity::Node(n),
                        format!(
                            "{}: operand {} is {} and operand {i} is {ti}; {} takes operands of \
                             one element type (Cast one of them)",
                            self.nl(n),
                            types[0].0,
                            types[0].1,
                            d.op.op_type()
                        ),
                    );
                }
            }
            if let Op::Einsum { equation: Some(eq) } = &d.op {
                match crate::einsum::parse(eq, d.inputs.len()) {
                    Err(why) => self.err(
                        Entity::Node(n),
                        format!("{}: equation '{eq}': {why}", self.nl(n)),
                    ),
                    Ok(parsed) => {
                        if let Some(why) = einsum_operand_mismatch(m, &d.inputs, &parsed) {
                            self.err(
                                Entity::Node(n),
                                format!("{}: equation '{eq}': {why}", self.nl(n)),
                            );
                        }
                    }
                }
            }
            // A Reshape's constant shape infers at most one dim.
            if let Op::Reshape { .. } = d.op
                && let Some(Some(shape)) = d.inputs.get(1)
                && let ValueDef::Const(c) = m.values[*shape].def
                && m.consts[c].dtype == DType::I64
                && let Some(bytes) = m.consts[c].raw_bytes()
            {
                let inferred = bytes
                    .chunks_exact(8)
                    .filter(|b| i64::from_le_bytes((*b).try_into().unwrap_or_default()) == -1)
                    .count();
                if inferred > 1 {
                    self.err(
                        Entity::Node(n),
                        format!(
                            "{}: its shape has {inferred} entries of -1; at most one dim is \
                             inferred from the others",
                            self.nl(n)
                        ),
                    );
                }
            }
            if let Op::Custom(c) = &d.op
                && let Some(known) = Op::attr_names(&c.domain, &c.op_type)
            {
                let why = custom_fallback_reason(c, known);
                self.errors.push(IrError::warning(
                    Entity::Node(n),
                    format!(
                        "{} is kept opaque ({why}): inference, rules and quantization \
                         do not look into it",
                        self.nl(n)
                    ),
                ));
            }
            if let Some(arity) = d.op.arity() {
                let (min_in, max_in, min_out, max_out) = (
                    arity.min_inputs,
                    arity.max_inputs,
                    arity.min_outputs,
                    arity.max_outputs,
                );
                let n_in = d
                    .inputs
                    .iter()
                    .rposition(Option::is_some)
                    .map_or(0, |p| p + 1);
                let n_out = d.outputs.len();
                let range = |a: usize, b: usize| match (a, b) {
                    (a, b) if a == b => format!("{a}"),
                    (a, MANY) => format!("at least {a}"),
                    (a, b) => format!("{a} to {b}"),
                };
                if n_in < min_in || n_in > max_in {
                    self.err(
                        Entity::Node(n),
                        format!(
                            "{} has {n_in} operands, expected {}",
                            self.nl(n),
                            range(min_in, max_in)
                        ),
                    );
                } else if let Some(i) = d
                    .inputs
                    .iter()
                    .take(min_in)
                    .enumerate()
                    .position(|(i, x)| x.is_none() && !optional_within_min(&d.op, i))
                {
                    self.err(
                        Entity::Node(n),
                        format!("{}: required operand #{i} is missing", self.nl(n)),
                    );
                }
                if n_out < min_out || n_out > max_out {
                    self.err(
                        Entity::Node(n),
                        format!(
                            "{} has {n_out} results, expected {}",
                            self.nl(n),
                            range(min_out, max_out)
                        ),
                    );
                }
            }
            self.attrs(n);
        }
    }

    fn rank_of(&self, v: Option<Value>) -> Option<usize> {
        let d = self.m.values.get(v?)?;
        if d.ty.index() >= self.m.types.len() {
            return None;
        }
        self.m.types[d.ty].shape().map(<[_]>::len)
    }

    fn attrs(&mut self, n: Node) {
        let d = &self.m.nodes[n];
        let rank0 = self.rank_of(d.inputs.first().copied().flatten());
        let check_axis = |axis: Option<i64>, rank: Option<usize>, extra: i64| -> bool {
            match (axis, rank) {
                (Some(a), Some(r)) => {
                    let r = r as i64 + extra;
                    (-r..r).contains(&a)
                }
                _ => true,
            }
        };
        let mut problems: Vec<String> = Vec::new();
        match &d.op {
            Op::Transpose { perm: Some(p) } => {
                let mut sorted = p.clone();
                sorted.sort_unstable();
                let is_perm = sorted.iter().enumerate().all(|(i, &x)| x == i as i64);
                if !is_perm {
                    problems.push(format!("perm {p:?} is not a permutation"));
                } else if let Some(r) = rank0
                    && r != p.len()
                {
                    problems.push(format!(
                        "perm {p:?} has {} entries but the operand has rank {r}",
                        p.len()
                    ));
                }
            }
            Op::Cast { to, .. } => match to {
                None => problems.push("'to' is required".to_owned()),
                Some(c)
                    if i32::try_from(*c)
                        .ok()
                        .and_then(DType::from_onnx_code)
                        .is_none() =>
                {
                    problems.push(format!("'to' = {c} is not a known element type"));
                }
                _ => {}
            },
            Op::QuantizeLinear {
                output_dtype: Some(c),
                ..
            }
            | Op::DequantizeLinear {
                output_dtype: Some(c),
                ..
            } if *c != 0
                && i32::try_from(*c)
                    .ok()
                    .and_then(DType::from_onnx_code)
                    .is_none() =>
            {
                problems.push(format!("'output_dtype' = {c} is not a known element type"));
            }
            Op::Concat { axis } => {
                if axis.is_none() {
                    problems.push("'axis' is required".to_owned());
                } else if !check_axis(*axis, rank0, 0) {
                    problems.push(format!(
                        "axis {} is out of range for rank {}",
                        axis.unwrap_or(0),
                        rank0.unwrap_or(0)
                    ));
                }
            }
            Op::Gather { axis }
            | Op::Softmax { axis }
            | Op::LogSoftmax { axis }
            | Op::ArgMax { axis, .. }
            | Op::ArgMin { axis, .. }
                if !check_axis(*axis, rank0, 0) =>
            {
                problems.push(format!(
                    "axis {} is out of range for rank {}",
                    axis.unwrap_or(0),
                    rank0.unwrap_or(0)
                ));
            }
            Op::Flatten { axis } if !check_axis(*axis, rank0, 1) => {
                problems.push(format!(
                    "axis {} is out of range for rank {}",
                    axis.unwrap_or(0),
                    rank0.unwrap_or(0)
                ));
            }
            Op::Conv {
                strides,
                dilations,
                kernel_shape,
                pads,
                ..
            }
            | Op::MaxPool {
                strides,
                dilations,
                kernel_shape,
                pads,
                ..
            }
            | Op::AveragePool {
                strides,
                dilations,
                kernel_shape,
                pads,
                ..
            } => {
                for (name, list) in [("strides", strides), ("dilations", dilations)] {
                    if list.as_ref().is_some_and(|l| l.iter().any(|&x| x <= 0)) {
                        problems.push(format!("'{name}' must be positive"));
                    }
                }
                if let (Some(k), Some(r)) = (kernel_shape, rank0)
                    && k.len() + 2 != r
                {
                    problems.push(format!(
                        "kernel_shape has {} dims but the operand has rank {r}",
                        k.len()
                    ));
                }
                if let (Some(k), Some(p)) = (kernel_shape, pads)
                    && p.len() != 2 * k.len()
                {
                    problems.push(format!(
                        "pads has {} entries, expected {}",
                        p.len(),
                        2 * k.len()
                    ));
                }
                if matches!(d.op, Op::MaxPool { .. } | Op::AveragePool { .. })
                    && kernel_shape.is_none()
                {
                    problems.push("'kernel_shape' is required".to_owned());
                }
            }
            Op::Einsum { equation: None } => problems.push("'equation' is required".to_owned()),
            Op::If {
                then_branch,
                else_branch,
            } if then_branch.is_none() || else_branch.is_none() => {
                problems.push("both branches are required".to_owned());
            }
            Op::Loop { body: None } | Op::Scan { body: None, .. } => {
                problems.push("'body' is required".to_owned())
            }
            Op::Constant {
                value,
                value_float,
                value_floats,
                value_int,
                value_ints,
                value_string,
                value_strings,
            } => {
                let set = [
                    value.is_some(),
                    value_float.is_some(),
                    value_floats.is_some(),
                    value_int.is_some(),
                    value_ints.is_some(),
                    value_string.is_some(),
                    value_strings.is_some(),
                ]
                .iter()
                .filter(|&&b| b)
                .count();
                if set != 1 {
                    problems.push(format!(
                        "exactly one value attribute must be set, found {set}"
                    ));
                }
            }
            Op::Squeeze { axes: Some(a) } | Op::Unsqueeze { axes: Some(a) } => {
                let mut s = a.clone();
                s.sort_unstable();
                s.dedup();
                if s.len() != a.len() {
                    problems.push(format!("axes {a:?} repeat an axis"));
                }
            }
            _ => {}
        }
        for p in problems {
            self.err(Entity::Node(n), format!("{}: {p}", self.nl(n)));
        }
    }

    /// Check 6: unique value names per top-level graph tree.
    /// A symbol that stands for an expression ([`crate::SymbolData::equals`]) names only
    /// declared symbols that do not stand for expressions themselves (so substitution ends).
    fn symbol_equalities(&mut self) {
        let m = self.m;
        for (s, d) in m.symbols.iter() {
            let Some(e) = &d.equals else { continue };
            let mut mentioned = Vec::new();
            e.symbols(&mut mentioned);
            for x in mentioned {
                let problem = match m.symbols.get(x) {
                    None => Some(format!("an undeclared symbol ({x:?})")),
                    Some(_) if x == s => Some("itself".to_owned()),
                    Some(xd) if xd.equals.is_some() => Some(format!(
                        "'{}', which stands for an expression itself",
                        xd.name
                    )),
                    Some(_) => None,
                };
                if let Some(p) = problem {
                    self.errors.push(IrError::error(
                        Entity::Sym(s),
                        format!(
                            "symbol '{}' is assumed equal to an expression of {p}",
                            d.name
                        ),
                    ));
                }
            }
        }
    }

    /// Check 7: dims and element counts of declared and inferred types.
    fn sizes(&mut self) {
        let m = self.m;
        for (v, d) in m.values.iter() {
            if d.ty.index() >= m.types.len() {
                continue;
            }
            let Some(shape) = m.types[d.ty].shape() else {
                continue;
            };
            let known: Vec<i64> = shape.iter().filter_map(|x| x.as_known()).collect();
            if let Some(bad) = known.iter().find(|&&x| x < 0) {
                self.err(
                    Entity::Value(v),
                    format!("{} has a negative dim {bad}", self.vl(v)),
                );
            } else if known
                .iter()
                .try_fold(1i64, |acc, &x| acc.checked_mul(x))
                .is_none()
            {
                self.err(
                    Entity::Value(v),
                    format!(
                        "{} has dims {known:?}: more than 2^63 - 1 elements",
                        self.vl(v)
                    ),
                );
            }
        }
    }

    fn names(&mut self) {
        let m = self.m;
        let roots: Vec<GraphId> = m
            .graphs
            .iter()
            .filter(|(_, d)| d.parent.is_none())
            .map(|(g, _)| g)
            .collect();
        for root in roots {
            let mut seen: HashMap<&str, Value> = HashMap::new();
            let mut counted: HashSet<Value> = HashSet::new();
            let mut reports: Vec<(Value, Value, &str)> = Vec::new();
            let mut stack = vec![root];
            let mut visited = HashSet::new();
            while let Some(g) = stack.pop() {
                let Some(gd) = m.graphs.get(g) else { continue };
                if !visited.insert(g) {
                    continue;
                }
                let mut vals: Vec<Value> = gd.inputs.clone();
                for &n in &gd.nodes {
                    let Some(nd) = m.nodes.get(n) else { continue };
                    for v in nd.inputs.iter().flatten() {
                        if m.values
                            .get(*v)
                            .is_some_and(|d| matches!(d.def, ValueDef::Const(_)))
                        {
                            vals.push(*v);
                        }
                    }
                    vals.extend(nd.outputs.iter().flatten().copied());
                    stack.extend(nd.op.subgraphs());
                }
                for v in vals {
                    let Some(name) = m.values.get(v).and_then(|d| d.name.as_deref()) else {
                        continue;
                    };
                    if !counted.insert(v) {
                        continue;
                    }
                    match seen.get(name) {
                        Some(&first) => reports.push((v, first, name)),
                        None => {
                            seen.insert(name, v);
                        }
                    }
                }
            }
            let root_label = self.graph_label(root);
            for (v, first, name) in reports {
                self.err(Entity::Value(v), format!("value name '{name}' is used by both {first:?} and {v:?} in {root_label} and its subgraphs"));
            }
        }
    }
}

/// Operands counted in an op's minimum arity that may still be absent (`""` in ONNX): Loop's
/// trip count and condition; `GroupQueryAttention`'s key and value (a packed QKV query) and its
/// past key and value (a first step without a cache).
fn optional_within_min(op: &Op, i: usize) -> bool {
    match op {
        Op::Loop { .. } => true,
        Op::GroupQueryAttention { .. } => (1..=4).contains(&i),
        _ => false,
    }
}

/// Why an `Einsum`'s operands do not fit its parsed equation: a term without `...` naming
/// fewer or more labels than its operand's rank (with `...`: more), or one label on dims of
/// two known sizes other than 1 (within an operand or across operands).
fn einsum_operand_mismatch(
    m: &Module,
    inputs: &[Option<Value>],
    eq: &crate::einsum::Equation,
) -> Option<String> {
    // Each label's first known size, and the operand that gave it.
    let mut sizes: Vec<(char, i64, usize)> = Vec::new();
    for (i, (term, v)) in eq.inputs.iter().zip(inputs).enumerate() {
        let Some(dims) = v.and_then(|v| m.value_type(v).shape()) else {
            continue;
        };
        let named = term.pre.len() + term.post.len();
        if (!term.ellipsis && named != dims.len()) || (term.ellipsis && named > dims.len()) {
            return Some(format!(
                "operand {i} has rank {} but its term names {named} labels",
                dims.len()
            ));
        }
        // Labels before `...` take the leading dims, those after it the trailing ones.
        let at = term
            .pre
            .iter()
            .enumerate()
            .chain(
                term.post
                    .iter()
                    .enumerate()
                    .map(|(k, c)| (dims.len() - term.post.len() + k, c)),
            )
            .filter_map(|(k, &c)| Some((c, dims[k].as_known()?)));
        for (c, size) in at {
            match sizes.iter().find(|(l, _, _)| *l == c) {
                // A dim of 1 broadcasts against the label's other size (numpy, ONNX Runtime).
                Some(&(_, other, j)) if other != size && other != 1 && size != 1 => {
                    return Some(if j == i {
                        format!("operand {i} gives label '{c}' the sizes {other} and {size}")
                    } else {
                        format!("label '{c}' is {other} in operand {j} and {size} in operand {i}")
                    });
                }
                Some(_) => {}
                None => sizes.push((c, size, i)),
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infer::tests::B;
    use crate::{Attr, Type};

    fn has(errs: &[IrError], entity: Entity, needle: &str) -> bool {
        errs.iter()
            .any(|e| e.entity == entity && e.message.contains(needle))
    }

    #[test]
    fn valid_module_passes() {
        let mut b = B::new(17);
        let x = b.input("x", DType::F32, vec![2.into(), 3.into()]);
        let y = b.op("Relu", vec![], &[x]);
        let z = b.op("Transpose", vec![("perm", Attr::Ints(vec![1, 0]))], &[y]);
        b.m.graphs[b.g].outputs.push(z);
        assert_eq!(verify(&b.m), Ok(()));
    }

    #[test]
    fn reports_every_error_in_one_run() {
        let mut b = B::new(17);
        let x = b.input("x", DType::F32, vec![2.into(), 3.into()]);
        let a = b.op("Relu", vec![], &[x]);
        let c = b.op("Neg", vec![], &[a]);
        // Out of order: swap the two nodes.
        b.m.graphs[b.g].nodes.swap(0, 1);
        let relu = b.m.graphs[b.g].nodes[1];
        let neg = b.m.graphs[b.g].nodes[0];
        // Wrong arity: Add with one operand.
        let add = b.m.add_node(
            b.g,
            Op::Add {},
            vec![Some(x)],
            vec![Some((None, Type::Unknown))],
            Some("add0".into()),
        );
        // Bad perm.
        let tr = b.m.add_node(
            b.g,
            Op::Transpose {
                perm: Some(vec![0, 0]),
            },
            vec![Some(x)],
            vec![Some((None, Type::Unknown))],
            None,
        );
        // Perm of the wrong length for a rank-2 operand.
        let tr3 = b.m.add_node(
            b.g,
            Op::Transpose {
                perm: Some(vec![2, 0, 1]),
            },
            vec![Some(x)],
            vec![Some((None, Type::Unknown))],
            None,
        );
        // Dangling operand handle.
        let dangling = Value::from_index(9999);
        let dn = b.m.add_node(
            b.g,
            Op::Relu {},
            vec![Some(dangling)],
            vec![Some((None, Type::Unknown))],
            None,
        );
        // Duplicate names: a node result named like the graph input.
        let dup = b.m.add_node(
            b.g,
            Op::Sigmoid {},
            vec![Some(c)],
            vec![Some((Some("x".into()), Type::Unknown))],
            None,
        );
        let dup_v = b.m.nodes[dup].outputs[0].unwrap();
        // Bad Cast target.
        let cast = b.m.add_node(
            b.g,
            Op::Cast {
                round_mode: None,
                saturate: None,
                to: Some(99),
            },
            vec![Some(x)],
            vec![Some((None, Type::Unknown))],
            None,
        );
        // A node listed twice.
        b.m.graphs[b.g].nodes.push(cast);
        // A graph output never defined (its producer is in no graph).
        let orphan = b.m.add_graph("orphan", None);
        let lost = b.m.add_node(
            orphan,
            Op::Relu {},
            vec![Some(x)],
            vec![Some((None, Type::Unknown))],
            None,
        );
        b.m.graphs[orphan].nodes.clear();
        let lost_v = b.m.nodes[lost].outputs[0].unwrap();
        b.m.graphs[b.g].outputs.push(lost_v);
        // Dangling graph output and a broken value definition.
        b.m.graphs[b.g].outputs.push(Value::from_index(7777));
        // A node result also listed as a graph input: defined twice.
        b.m.graphs[b.g].inputs.push(c);
        b.m.values[a].def = ValueDef::Output {
            node: relu,
            index: 3,
        };

        let errs = verify(&b.m).unwrap_err();
        let want = [
            (Entity::Node(neg), "used before its definition"),
            (Entity::Node(add), "has 1 operands, expected 2"),
            (Entity::Node(add), "'add0'"),
            (Entity::Node(tr), "is not a permutation"),
            (
                Entity::Node(tr3),
                "has 3 entries but the operand has rank 2",
            ),
            (Entity::Node(dn), "dangling value handle"),
            (Entity::Value(dup_v), "value name 'x'"),
            (Entity::Node(cast), "99 is not a known element type"),
            (Entity::Node(cast), "is listed 2 times"),
            (Entity::Graph(b.g), "never defined"),
            (Entity::Graph(b.g), "dangling value handle"),
            (Entity::Value(a), "is result #0 of node Relu"),
            (Entity::Value(c), "is defined 2 times"),
            (Entity::Value(c), "is input #1 of graph 'main'"),
        ];
        for (entity, needle) in want {
            assert!(
                has(&errs, entity, needle),
                "missing {entity:?} {needle:?} in {errs:#?}"
            );
        }
    }

    #[test]
    fn subgraph_links_and_scopes() {
        let mut b = B::new(17);
        let cond = b.input("cond", DType::Bool, vec![]);
        let x = b.input("x", DType::F32, vec![2.into()]);
        let then_g = b.m.add_graph("then", None);
        let else_g = b.m.add_graph("else", None);
        let node = b.m.add_node(
            b.g,
            Op::If {
                then_branch: Some(then_g),
                else_branch: Some(else_g),
            },
            vec![Some(cond)],
            vec![Some((Some("y".into()), Type::Unknown))],
            None,
        );
        b.m.graphs[then_g].parent = Some(node);
        // else_g lacks its parent link.
        let t = b.node_in(then_g, Op::Relu {}, &[x], 1)[0];
        b.m.graphs[then_g].outputs = vec![t];
        // The else branch reads a value of the then branch: not visible.
        let e = b.node_in(else_g, Op::Neg {}, &[t], 1)[0];
        b.m.graphs[else_g].outputs = vec![e];
        let e_node = b.m.graphs[else_g].nodes[0];
        let errs = verify(&b.m).unwrap_err();
        assert!(
            has(&errs, Entity::Graph(else_g), "has no parent"),
            "{errs:#?}"
        );
        assert!(
            has(&errs, Entity::Node(e_node), "defined in graph 'then'"),
            "{errs:#?}"
        );
        // Fixing both makes the module valid; outer references are fine.
        b.m.graphs[else_g].parent = Some(node);
        b.m.nodes[e_node].inputs[0] = Some(x);
        assert_eq!(verify(&b.m), Ok(()));
    }

    /// A node of a modeled op type (any domain) whose attributes do not fit the op table stays
    /// an opaque custom op; the verifier says so (a warning naming the node and the
    /// attribute), and the module stays valid.
    #[test]
    fn a_modeled_op_kept_custom_is_a_warning_naming_the_attribute() {
        let mut b = B::new(17);
        let x = b.input("x", DType::F32, vec![2.into()]);
        for (i, (domain, op_type, attrs, why)) in [
            (
                "",
                "Relu",
                vec![("alpha".to_owned(), Attr::Float(0.1))],
                "Relu takes no attributes, but 'alpha' is set",
            ),
            (
                "",
                "Softmax",
                vec![("axis".to_owned(), Attr::String("x".into()))],
                "attribute 'axis' is not of the kind the op takes",
            ),
            (
                "com.microsoft",
                "QuickGelu",
                vec![("beta".to_owned(), Attr::Float(1.0))],
                "'beta' is not an attribute of QuickGelu: alpha",
            ),
            (
                "com.microsoft",
                "QuickGelu",
                vec![("alpha".to_owned(), Attr::Int(1))],
                "attribute 'alpha' is not of the kind the op takes",
            ),
        ]
        .into_iter()
        .enumerate()
        {
            let op = Op::from_parts(domain, op_type, attrs);
            assert!(op.is_custom());
            let op_type = format!("{op_type}{i}");
            let n = b.m.add_node(
                b.g,
                op,
                vec![Some(x)],
                vec![Some((Some(format!("{op_type}_out")), Type::Unknown))],
                Some(format!("my_{op_type}")),
            );
            let all = verify_all(&b.m);
            let w = all
                .iter()
                .find(|e| e.entity == Entity::Node(n))
                .unwrap_or_else(|| panic!("no warning for {op_type}: {all:#?}"));
            assert_eq!(w.severity, Severity::Warning);
            assert!(
                w.message.contains(&format!("my_{op_type}")),
                "{}",
                w.message
            );
            assert!(w.message.contains(why), "{}", w.message);
            assert_eq!(verify(&b.m), Ok(()));
        }
    }

    #[test]
    fn garbage_does_not_panic() {
        let mut b = B::new(17);
        let x = b.input("x", DType::F32, vec![2.into()]);
        let n = b.m.add_node(
            b.g,
            Op::Relu {},
            vec![Some(x)],
            vec![Some((None, Type::Unknown))],
            None,
        );
        b.m.nodes[n].graph = GraphId::from_index(42);
        b.m.graphs[b.g].nodes.push(Node::from_index(500));
        b.m.graphs[b.g].parent = Some(Node::from_index(600));
        b.m.values[x].def = ValueDef::Input {
            graph: GraphId::from_index(77),
            index: 9,
            default: None,
        };
        let sub = b.m.add_graph("loop", Some(n));
        b.m.graphs[b.g].parent = Some(n);
        b.m.nodes[n].op = Op::Loop { body: Some(sub) };
        let errs = verify(&b.m).unwrap_err();
        assert!(errs.len() >= 4, "{errs:#?}");
        assert!(errs.iter().all(|e| !e.message.is_empty()));
    }

    #[test]
    fn declared_type_conflict_is_an_error() {
        let mut b = B::new(17);
        let x = b.input("x", DType::F32, vec![2.into(), 3.into()]);
        let n = b.m.add_node(
            b.g,
            Op::Relu {},
            vec![Some(x)],
            vec![Some((
                Some("y".into()),
                Type::tensor(DType::F32, vec![2.into(), 5.into()]),
            ))],
            None,
        );
        let y = b.m.nodes[n].outputs[0].unwrap();
        b.m.graphs[b.g].outputs.push(y);
        let all = verify(&b.m).expect_err("Relu does not change [2, 3] into [2, 5]");
        assert_eq!(all.len(), 1, "{all:#?}");
        assert_eq!(all[0].severity, Severity::Error);
        assert!(has(&all, Entity::Value(y), "dim 1 as 5 but inferred 3"));
    }
}
