//! `GraphProto` → graph of a [`Module`]: inputs, initializers, nodes (sorted topologically when
//! the source is not), attributes with nested subgraphs, and outputs.
//!
//! Value names resolve through a chain of scopes, innermost first, so a subgraph node may use a
//! value of any enclosing graph (ONNX outer-scope references).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::path::Path;

use mmq_ir::{Attr, ConstData, CustomOp, GraphId, Module, Node, Op, Type, Value, ValueDef};
use prost::Message;

use crate::error::{Result, err};
use crate::proto::onnx::{
    AttributeProto, GraphProto, ModelProto, NodeProto, TypeProto, attribute_proto::AttributeType,
};
use crate::tensor::{ExternalFiles, TensorCtx, sparse_to_const, tensor_to_const};
use crate::types::TypeConv;

/// Supported ONNX IR versions.
pub(crate) const IR_VERSIONS: std::ops::RangeInclusive<i64> = 3..=14;
/// Supported default-domain opset versions.
pub(crate) const ONNX_OPSETS: std::ops::RangeInclusive<i64> = 1..=28;

type Scope = HashMap<String, Value>;

/// State shared by every graph imported into one module.
pub(crate) struct Importer<'a> {
    /// The module being built.
    pub m: &'a mut Module,
    /// Type conversion with its `dim_param` cache.
    pub types: &'a mut TypeConv,
    /// External data files mapped so far.
    pub files: &'a mut ExternalFiles,
    /// Directory external data locations are relative to.
    pub dir: Option<&'a Path>,
}

/// The label of node `index` in messages: its name, else `op_type#index`.
fn node_label(n: &NodeProto, index: usize) -> String {
    match n.name.as_deref() {
        Some(name) if !name.is_empty() => name.to_owned(),
        _ => format!("{}#{index}", n.op_type()),
    }
}

fn lookup(scopes: &[Scope], name: &str) -> Option<Value> {
    scopes.iter().rev().find_map(|s| s.get(name).copied())
}

/// The names a graph uses but does not define (inputs of its nodes and of nested subgraphs, and
/// its outputs), in first-use order.
fn free_names<'g>(g: &'g GraphProto, out: &mut Vec<&'g str>) {
    let mut defined: HashSet<&str> = HashSet::new();
    defined.extend(g.input.iter().map(|v| v.name()));
    defined.extend(g.initializer.iter().map(|t| t.name()));
    defined.extend(
        g.sparse_initializer
            .iter()
            .filter_map(|s| s.values.as_ref().map(|v| v.name())),
    );
    defined.extend(
        g.node
            .iter()
            .flat_map(|n| n.output.iter().map(String::as_str)),
    );
    let push = |name: &'g str, out: &mut Vec<&'g str>| {
        if !name.is_empty() && !defined.contains(name) {
            out.push(name);
        }
    };
    for n in &g.node {
        for i in &n.input {
            push(i, out);
        }
        for a in &n.attribute {
            for sub in a.g.iter().chain(&a.graphs) {
                let mut inner = Vec::new();
                free_names(sub, &mut inner);
                for name in inner {
                    push(name, out);
                }
            }
        }
    }
    for o in &g.output {
        push(o.name(), out);
    }
}

/// Subgraphs held by a node's attributes.
fn subgraphs(n: &NodeProto) -> impl Iterator<Item = &GraphProto> {
    n.attribute.iter().flat_map(|a| a.g.iter().chain(&a.graphs))
}

impl Importer<'_> {
    fn tensors(&mut self) -> TensorCtx<'_> {
        TensorCtx {
            dir: self.dir,
            files: self.files,
        }
    }

    /// Imports a whole model as a new entry of the module.
    pub fn model(&mut self, model: &ModelProto, fallback_name: &str) -> Result<GraphId> {
        let ir = model.ir_version();
        if !IR_VERSIONS.contains(&ir) {
            return Err(err!(
                UnsupportedOpset,
                "IR version {ir} is not supported (supported: {} to {})",
                IR_VERSIONS.start(),
                IR_VERSIONS.end()
            ));
        }
        let mut opsets = Vec::with_capacity(model.opset_import.len());
        for o in &model.opset_import {
            let domain = o.domain().to_owned();
            let version = o.version();
            if (domain.is_empty() || domain == "ai.onnx") && !ONNX_OPSETS.contains(&version) {
                return Err(err!(
                    UnsupportedOpset,
                    "default-domain opset {version} is not supported (supported: {} to {})",
                    ONNX_OPSETS.start(),
                    ONNX_OPSETS.end()
                ));
            }
            opsets.push((domain, version));
        }
        let Some(graph) = &model.graph else {
            return Err(err!(NotOnnx, "not an ONNX model: no graph field"));
        };
        let mut scopes = Vec::new();
        let gid = self.graph(graph, None, &mut scopes, fallback_name)?;
        if !opsets.iter().any(|(d, _)| d.is_empty() || d == "ai.onnx") {
            // Every node of the default domain needs the domain's opset to have a meaning.
            let first = self.m.graph_tree(gid).into_iter().find_map(|g| {
                self.m.graphs[g]
                    .nodes()
                    .iter()
                    .copied()
                    .find(|&n| matches!(self.m.nodes[n].op.domain(), "" | "ai.onnx"))
            });
            if let Some(n) = first {
                let nd = &self.m.nodes[n];
                let node = match nd.name.as_deref().filter(|s| !s.is_empty()) {
                    Some(name) => format!("node '{name}' ({})", nd.op.op_type()),
                    None => format!("an unnamed {} node", nd.op.op_type()),
                };
                return Err(err!(
                    Invalid,
                    "the model imports no opset for the ONNX default domain (opset_import), but \
                     {node} is in it"
                ));
            }
        }
        let info = mmq_ir::ModelInfo {
            ir_version: ir,
            opsets,
            producer_name: model.producer_name().to_owned(),
            producer_version: model.producer_version().to_owned(),
            domain: model.domain().to_owned(),
            model_version: model.model_version(),
            doc: model.doc_string().to_owned(),
            metadata: model
                .metadata_props
                .iter()
                .map(|kv| (kv.key().to_owned(), kv.value().to_owned()))
                .collect(),
            source: None,
            functions: model
                .functions
                .iter()
                .map(|f| bytes::Bytes::from(f.encode_to_vec()))
                .collect(),
        };
        self.m.entries.push(mmq_ir::Entry {
            graph: gid,
            model: info,
        });
        Ok(gid)
    }

    /// Imports `g` as a new graph; `scopes` holds the enclosing graphs' names.
    pub fn graph(
        &mut self,
        g: &GraphProto,
        parent: Option<Node>,
        scopes: &mut Vec<Scope>,
        fallback_name: &str,
    ) -> Result<GraphId> {
        let name = match g.name() {
            "" => fallback_name,
            n => n,
        };
        let gid = self.m.add_graph(name, parent);
        self.m.graphs[gid].doc = g.doc_string().to_owned();
        scopes.push(Scope::new());
        let r = self.graph_body(g, gid, scopes);
        scopes.pop();
        r.map(|()| gid)
    }

    fn graph_body(&mut self, g: &GraphProto, gid: GraphId, scopes: &mut Vec<Scope>) -> Result<()> {
        // Declared types of values, by name.
        let mut declared: HashMap<&str, &TypeProto> = HashMap::new();
        for vi in g.value_info.iter().chain(&g.output) {
            if let Some(tp) = &vi.r#type {
                declared.insert(vi.name(), tp);
            }
        }

        // Initializers, dense and sparse, in source order.
        let mut inits: Vec<(String, ConstData)> = Vec::new();
        let mut init_index: HashMap<String, usize> = HashMap::new();
        for (i, t) in g.initializer.iter().enumerate() {
            let c = tensor_to_const(t, &format!("initializer#{i}"), &mut self.tensors())?;
            self.push_init(&mut inits, &mut init_index, t.name(), c)?;
        }
        for (i, s) in g.sparse_initializer.iter().enumerate() {
            let c = sparse_to_const(s, &format!("sparse_initializer#{i}"), &mut self.tensors())?;
            let name = s.values.as_ref().map_or("", |v| v.name());
            self.push_init(&mut inits, &mut init_index, name, c)?;
        }

        // Inputs; an initializer of the same name is the input's default.
        let mut inits: Vec<Option<(String, ConstData)>> = inits.into_iter().map(Some).collect();
        for vi in &g.input {
            let name = vi.name();
            if name.is_empty() {
                return Err(err!(Invalid, "graph '{}' has an unnamed input", g.name()));
            }
            if scopes.last().is_some_and(|s| s.contains_key(name)) {
                return Err(err!(DuplicateName, "graph input '{name}' is listed twice"));
            }
            let default = init_index
                .get(name)
                .and_then(|&i| inits[i].take())
                .map(|(_, c)| c);
            let ty = match (&vi.r#type, &default) {
                (Some(tp), _) => self.types.convert(self.m, tp, name)?,
                (None, Some(c)) => const_type(c),
                (None, None) => Type::Unknown,
            };
            let v = self.m.add_input(gid, Some(name.to_owned()), ty);
            if let Some(c) = default {
                let c = self.m.add_attr_const(c);
                if let ValueDef::Input { default, .. } = &mut self.m.values[v].def {
                    *default = Some(c);
                }
            }
            insert(scopes, name, v);
        }
        for (name, c) in inits.into_iter().flatten() {
            let v = self.m.add_const(c);
            insert(scopes, &name, v);
        }

        // Nodes, in dependency order.
        let order = self.order(g, scopes)?;
        for i in order {
            let n = &g.node[i];
            self.node(n, gid, scopes, &declared)
                .map_err(|e| e.in_node(node_label(n, i)))?;
        }

        // Outputs.
        for vi in &g.output {
            let name = vi.name();
            let v = lookup(scopes, name).ok_or_else(|| {
                err!(
                    DanglingInput,
                    "graph '{}' output '{name}' is never defined",
                    g.name()
                )
            })?;
            self.m.graphs[gid].outputs.push(v);
        }
        Ok(())
    }

    fn push_init(
        &mut self,
        inits: &mut Vec<(String, ConstData)>,
        index: &mut HashMap<String, usize>,
        name: &str,
        c: ConstData,
    ) -> Result<()> {
        if name.is_empty() {
            return Err(err!(Invalid, "an initializer has no name"));
        }
        if index.insert(name.to_owned(), inits.len()).is_some() {
            return Err(err!(DuplicateName, "initializer '{name}' is defined twice"));
        }
        inits.push((name.to_owned(), c));
        Ok(())
    }

    /// A topological order of `g.node`: the source order when it is one, else Kahn's algorithm
    /// preferring source order. Checks that every name is defined exactly once.
    fn order(&self, g: &GraphProto, scopes: &[Scope]) -> Result<Vec<usize>> {
        let empty = Scope::new();
        let local = scopes.last().unwrap_or(&empty);
        let mut producer: HashMap<&str, usize> = HashMap::with_capacity(g.node.len() * 2);
        for (i, n) in g.node.iter().enumerate() {
            for o in n.output.iter().filter(|o| !o.is_empty()) {
                if local.contains_key(o.as_str()) {
                    return Err(err!(
                        DuplicateName,
                        "output '{o}' is already defined as a graph input or initializer"
                    )
                    .in_node(node_label(n, i)));
                }
                if let Some(j) = producer.insert(o, i) {
                    return Err(err!(
                        DuplicateName,
                        "output '{o}' is already defined by node '{}'",
                        node_label(&g.node[j], j)
                    )
                    .in_node(node_label(n, i)));
                }
            }
        }

        // deps[i]: nodes whose outputs node i uses (directly or inside its subgraphs).
        let mut deps: Vec<Vec<usize>> = Vec::with_capacity(g.node.len());
        let mut sorted = true;
        for (i, n) in g.node.iter().enumerate() {
            let mut used: Vec<&str> = n.input.iter().map(String::as_str).collect();
            for sub in subgraphs(n) {
                free_names(sub, &mut used);
            }
            let mut d = Vec::new();
            for name in used.into_iter().filter(|s| !s.is_empty()) {
                if let Some(&j) = producer.get(name) {
                    sorted &= j < i;
                    d.push(j);
                } else if lookup(scopes, name).is_none() {
                    return Err(err!(DanglingInput, "input '{name}' is never defined")
                        .in_node(node_label(n, i)));
                }
            }
            deps.push(d);
        }
        if sorted {
            return Ok((0..g.node.len()).collect());
        }

        let mut users: Vec<Vec<usize>> = vec![Vec::new(); g.node.len()];
        let mut pending: Vec<usize> = vec![0; g.node.len()];
        for (i, d) in deps.iter().enumerate() {
            for &j in d {
                users[j].push(i);
                pending[i] += 1;
            }
        }
        let mut ready: BinaryHeap<Reverse<usize>> = (0..g.node.len())
            .filter(|&i| pending[i] == 0)
            .map(Reverse)
            .collect();
        let mut order = Vec::with_capacity(g.node.len());
        while let Some(Reverse(i)) = ready.pop() {
            order.push(i);
            for &u in &users[i] {
                pending[u] -= 1;
                if pending[u] == 0 {
                    ready.push(Reverse(u));
                }
            }
        }
        if order.len() == g.node.len() {
            return Ok(order);
        }

        // Every node left waits on another node left: walk back until a node repeats.
        let start = (0..g.node.len()).find(|&i| pending[i] > 0).unwrap_or(0);
        let mut path = vec![start];
        let mut seen: HashMap<usize, usize> = HashMap::from([(start, 0)]);
        let mut cur = start;
        while let Some(&next) = deps[cur].iter().find(|&&j| pending[j] > 0) {
            if let Some(&at) = seen.get(&next) {
                path.drain(..at);
                break;
            }
            seen.insert(next, path.len());
            path.push(next);
            cur = next;
        }
        path.reverse();
        let mut names: Vec<String> = path.iter().map(|&i| node_label(&g.node[i], i)).collect();
        let first = names[0].clone();
        names.push(first.clone());
        Err(err!(
            Cycle,
            "node is on a dependency cycle: {}",
            names.join(" -> ")
        )
        .in_node(first))
    }

    fn node(
        &mut self,
        n: &NodeProto,
        gid: GraphId,
        scopes: &mut Vec<Scope>,
        declared: &HashMap<&str, &TypeProto>,
    ) -> Result<()> {
        let inputs = n
            .input
            .iter()
            .map(|name| {
                if name.is_empty() {
                    Ok(None)
                } else {
                    lookup(scopes, name)
                        .map(Some)
                        .ok_or_else(|| err!(DanglingInput, "input '{name}' is never defined"))
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let mut outputs = Vec::with_capacity(n.output.len());
        for name in &n.output {
            outputs.push(if name.is_empty() {
                None
            } else {
                let ty = match declared.get(name.as_str()) {
                    Some(tp) => self.types.convert(self.m, tp, name)?,
                    None => Type::Unknown,
                };
                Some((Some(name.clone()), ty))
            });
        }
        let placeholder = Op::Custom(CustomOp {
            domain: n.domain().to_owned(),
            op_type: n.op_type().to_owned(),
            attrs: Vec::new(),
        });
        let name = n.name.clone().filter(|s| !s.is_empty());
        let node = self.m.add_node(gid, placeholder, inputs, outputs, name);

        let mut attrs = Vec::with_capacity(n.attribute.len());
        for a in &n.attribute {
            let value = self.attr(a, node, scopes)?;
            attrs.push((a.name().to_owned(), value));
        }
        self.m.nodes[node].op = Op::from_parts(n.domain(), n.op_type(), attrs);

        let results = self.m.nodes[node].outputs.clone();
        for (name, v) in n.output.iter().zip(results) {
            if let Some(v) = v {
                insert(scopes, name, v);
            }
        }
        Ok(())
    }

    fn attr(&mut self, a: &AttributeProto, node: Node, scopes: &mut Vec<Scope>) -> Result<Attr> {
        let name = a.name();
        let ty = match a.r#type.and_then(|t| AttributeType::try_from(t).ok()) {
            Some(AttributeType::Undefined) | None => infer_attr_type(a)
                .ok_or_else(|| err!(Invalid, "attribute '{name}' has no type and no value"))?,
            Some(t) => t,
        };
        let missing = || err!(Invalid, "attribute '{name}' of type {ty:?} has no value");
        let label = |i: usize| format!("{name}[{i}]");
        Ok(match ty {
            AttributeType::Undefined => return Err(missing()),
            AttributeType::Float => Attr::Float(a.f()),
            AttributeType::Int => Attr::Int(a.i()),
            AttributeType::String => Attr::String(String::from_utf8_lossy(a.s()).into_owned()),
            AttributeType::Floats => Attr::Floats(a.floats.clone()),
            AttributeType::Ints => Attr::Ints(a.ints.clone()),
            AttributeType::Strings => Attr::Strings(
                a.strings
                    .iter()
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                    .collect(),
            ),
            AttributeType::Tensor => {
                let t = a.t.as_ref().ok_or_else(missing)?;
                let c = tensor_to_const(t, name, &mut self.tensors())?;
                Attr::Tensor(self.m.add_attr_const(c))
            }
            AttributeType::SparseTensor => {
                let s = a.sparse_tensor.as_ref().ok_or_else(missing)?;
                let c = sparse_to_const(s, name, &mut self.tensors())?;
                Attr::Tensor(self.m.add_attr_const(c))
            }
            AttributeType::Tensors => {
                let mut out = Vec::with_capacity(a.tensors.len());
                for (i, t) in a.tensors.iter().enumerate() {
                    let c = tensor_to_const(t, &label(i), &mut self.tensors())?;
                    out.push(self.m.add_attr_const(c));
                }
                Attr::Tensors(out)
            }
            AttributeType::SparseTensors => {
                let mut out = Vec::with_capacity(a.sparse_tensors.len());
                for (i, s) in a.sparse_tensors.iter().enumerate() {
                    let c = sparse_to_const(s, &label(i), &mut self.tensors())?;
                    out.push(self.m.add_attr_const(c));
                }
                Attr::Tensors(out)
            }
            AttributeType::Graph => {
                let g = a.g.as_ref().ok_or_else(missing)?;
                Attr::Graph(self.graph(g, Some(node), scopes, name)?)
            }
            AttributeType::Graphs => {
                let mut out = Vec::with_capacity(a.graphs.len());
                for (i, g) in a.graphs.iter().enumerate() {
                    out.push(self.graph(g, Some(node), scopes, &label(i))?);
                }
                Attr::Graphs(out)
            }
            AttributeType::TypeProto => {
                let tp = a.tp.as_ref().ok_or_else(missing)?;
                Attr::Type(self.types.convert(self.m, tp, name)?)
            }
            AttributeType::TypeProtos => {
                let mut out = Vec::with_capacity(a.type_protos.len());
                for (i, tp) in a.type_protos.iter().enumerate() {
                    out.push(self.types.convert(self.m, tp, &label(i))?);
                }
                Attr::Types(out)
            }
        })
    }
}

fn insert(scopes: &mut [Scope], name: &str, v: Value) {
    if let Some(s) = scopes.last_mut() {
        s.insert(name.to_owned(), v);
    }
}

fn const_type(c: &ConstData) -> Type {
    Type::tensor(
        c.dtype,
        c.shape.iter().map(|&d| mmq_ir::Dim::known(d)).collect(),
    )
}

/// The type of an attribute written without one (very old exporters), from the field that is set.
fn infer_attr_type(a: &AttributeProto) -> Option<AttributeType> {
    Some(if a.g.is_some() {
        AttributeType::Graph
    } else if a.t.is_some() {
        AttributeType::Tensor
    } else if a.sparse_tensor.is_some() {
        AttributeType::SparseTensor
    } else if a.tp.is_some() {
        AttributeType::TypeProto
    } else if a.s.is_some() {
        AttributeType::String
    } else if a.f.is_some() {
        AttributeType::Float
    } else if a.i.is_some() {
        AttributeType::Int
    } else if !a.graphs.is_empty() {
        AttributeType::Graphs
    } else if !a.tensors.is_empty() {
        AttributeType::Tensors
    } else if !a.sparse_tensors.is_empty() {
        AttributeType::SparseTensors
    } else if !a.type_protos.is_empty() {
        AttributeType::TypeProtos
    } else if !a.floats.is_empty() {
        AttributeType::Floats
    } else if !a.ints.is_empty() {
        AttributeType::Ints
    } else if !a.strings.is_empty() {
        AttributeType::Strings
    } else {
        return None;
    })
}
