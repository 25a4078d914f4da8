//! Module → `ModelProto`.

use std::collections::{HashMap, HashSet};

use mmq_ir::{
    Attr, Const, ConstData, DType, Dim, GraphId, ModelInfo, Module, Node, Storage, TensorType,
    Type, Value, ValueData, ValueDef,
};

use crate::error::ExportError;
use crate::external::{ExternalSink, inline_bytes};
use crate::proto as pb;
use pb::attribute_proto::AttributeType;
use pb::tensor_proto::DataLocation;
use pb::tensor_shape_proto::{Dimension, dimension};
use pb::type_proto;

/// Default-domain opset used when the module records none.
pub(crate) const DEFAULT_OPSET: i64 = 21;

/// Tensor bytes placed inline and externally by one export.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Stats {
    pub inline: u64,
    pub external: u64,
}

/// Builds the ONNX model for top-level graph `graph` of `m`.
///
/// Tensor bytes are offered to `ext`, which stores them externally or leaves them inline (use
/// [`crate::InlineSink`] for a self-contained model). See the crate documentation for naming,
/// initializers and types.
pub fn to_model_proto(
    m: &Module,
    graph: GraphId,
    ext: &mut dyn ExternalSink,
) -> Result<pb::ModelProto, ExportError> {
    export_model(m, graph, ext).map(|(model, _)| model)
}

pub(crate) fn export_model(
    m: &Module,
    graph: GraphId,
    ext: &mut dyn ExternalSink,
) -> Result<(pb::ModelProto, Stats), ExportError> {
    let tree = graph_tree(m, graph)?;
    let info = m.model_of(graph).cloned().unwrap_or_default();
    let mut ex = Exporter {
        m,
        sink: ext,
        names: assign_names(m, &tree)?,
        homes: const_homes(m, &tree),
        top: graph,
        initializers: Vec::new(),
        sub_initializers: HashMap::new(),
        emitted: HashSet::new(),
        min_ir: 3,
        domains: Vec::new(),
        stats: Stats::default(),
    };
    let g = ex.graph(graph)?;
    let mut model = ex.model(&info, g);
    for (i, f) in info.functions.iter().enumerate() {
        let f = <pb::FunctionProto as prost::Message>::decode(f.clone()).map_err(|e| {
            ExportError::malformed(format!("model-local function {i} does not decode: {e}"))
        })?;
        model.functions.push(f);
    }
    Ok((model, ex.stats))
}

/// The graph and every graph nested in it, parents first; fails on a handle that points nowhere,
/// a subgraph reached twice, or a graph that is not top-level.
/// A tensor type whose element type is not known (written with `elem_type` 0 it would make
/// ONNX Runtime reject the model).
fn untyped(ty: &Type) -> bool {
    matches!(ty, Type::Unknown) || matches!(ty, Type::Tensor(t) if t.dtype.is_none())
}

/// The graph each constant operand is written in: the innermost graph of `tree` that holds
/// every use of it (subgraphs see their ancestors' initializers). A weight only an `If` branch
/// or a `Loop` body reads stays in that graph, as exporters write it; ONNX Runtime pre-packs
/// a subgraph's own initializers (an `LSTM`'s weights), not those it reads from outer scopes,
/// and feeds every outer-scope value into the subgraph at each run.
fn const_homes(m: &Module, tree: &[GraphId]) -> HashMap<Value, GraphId> {
    let parent = |g: GraphId| {
        m.graphs[g]
            .parent
            .and_then(|n| m.nodes.get(n))
            .map(|n| n.graph)
    };
    let mut depth: HashMap<GraphId, usize> = HashMap::new();
    for &g in tree {
        // `tree` lists parents first.
        let d = parent(g).and_then(|p| depth.get(&p)).map_or(0, |d| d + 1);
        depth.insert(g, d);
    }
    let depth_of = |g: GraphId| depth.get(&g).copied().unwrap_or(0);
    // The innermost graph holding both `a` and `b`.
    let common = |mut a: GraphId, mut b: GraphId| {
        while a != b {
            let (step, other) = if depth_of(a) >= depth_of(b) {
                (&mut a, b)
            } else {
                (&mut b, a)
            };
            match parent(*step) {
                Some(p) => *step = p,
                None => return other,
            }
        }
        a
    };
    let mut homes: HashMap<Value, GraphId> = HashMap::new();
    for &g in tree {
        let gd = &m.graphs[g];
        let nodes = gd.nodes().iter().filter_map(|&n| m.nodes.get(n));
        let used = nodes
            .flat_map(|nd| nd.inputs.iter().flatten())
            .chain(&gd.outputs);
        for &v in used {
            if matches!(m.values[v].def, ValueDef::Const(_)) {
                let home = homes.get(&v).map_or(g, |&h| common(h, g));
                homes.insert(v, home);
            }
        }
    }
    homes
}

fn graph_tree(m: &Module, top: GraphId) -> Result<Vec<GraphId>, ExportError> {
    let g = m.graphs.get(top).ok_or_else(|| ExportError::NoSuchGraph {
        graph: format!("{top:?}"),
    })?;
    if g.parent.is_some() {
        return Err(ExportError::NotTopLevel {
            graph: g.name.clone(),
        });
    }
    let mut out = vec![top];
    let mut seen = HashSet::from([top]);
    let mut i = 0;
    while i < out.len() {
        let gid = out[i];
        for &n in m.graphs[gid].nodes() {
            let nd = node(m, n)?;
            for sub in nd.op.subgraphs() {
                if m.graphs.get(sub).is_none() {
                    return Err(ExportError::malformed(format!(
                        "node `{}` refers to missing graph {sub:?}",
                        node_label(m, n)
                    )));
                }
                if !seen.insert(sub) {
                    return Err(ExportError::malformed(format!(
                        "graph `{}` is used by more than one node attribute (second use at node `{}`)",
                        m.graphs[sub].name,
                        node_label(m, n)
                    )));
                }
                out.push(sub);
            }
        }
        i += 1;
    }
    Ok(out)
}

fn node(m: &Module, n: Node) -> Result<&mmq_ir::NodeData, ExportError> {
    m.nodes
        .get(n)
        .ok_or_else(|| ExportError::malformed(format!("a graph lists missing node {n:?}")))
}

fn node_label(m: &Module, n: Node) -> String {
    match m.nodes.get(n) {
        Some(nd) => match &nd.name {
            Some(name) if !name.is_empty() => name.clone(),
            _ => format!("{} {n:?}", nd.op.op_type()),
        },
        None => format!("{n:?}"),
    }
}

fn value<'m>(
    m: &'m Module,
    v: Value,
    at: &dyn Fn() -> String,
) -> Result<&'m ValueData, ExportError> {
    m.values
        .get(v)
        .ok_or_else(|| ExportError::malformed(format!("{} refers to missing value {v:?}", at())))
}

fn source_name(vd: &ValueData) -> Option<&str> {
    vd.name.as_deref().filter(|n| !n.is_empty())
}

/// Gives every value used by the graphs in `tree` a unique, non-empty name.
fn assign_names(m: &Module, tree: &[GraphId]) -> Result<HashMap<Value, String>, ExportError> {
    let mut order = Vec::new();
    let mut seen = HashSet::new();
    let mut visit = |v: Value, at: &dyn Fn() -> String| -> Result<(), ExportError> {
        value(m, v, at)?;
        if seen.insert(v) {
            order.push(v);
        }
        Ok(())
    };
    let top = &m.graphs[tree[0]];
    for &v in top.inputs.iter().chain(&top.outputs) {
        visit(v, &|| format!("graph `{}`", top.name))?;
    }
    for &gid in tree {
        let g = &m.graphs[gid];
        let at = || format!("graph `{}`", g.name);
        for &v in &g.inputs {
            visit(v, &at)?;
        }
        for &n in g.nodes() {
            let nd = node(m, n)?;
            let at = || format!("node `{}`", node_label(m, n));
            for v in nd.inputs.iter().chain(&nd.outputs).flatten() {
                visit(*v, &at)?;
            }
        }
        for &v in &g.outputs {
            visit(v, &at)?;
        }
    }

    let reserved: HashSet<&str> = m
        .values
        .iter()
        .filter_map(|(_, vd)| source_name(vd))
        .collect();
    let mut taken: HashSet<String> = HashSet::new();
    let mut names = HashMap::with_capacity(order.len());
    for &v in &order {
        if let Some(name) = source_name(&m.values[v])
            && taken.insert(name.to_owned())
        {
            names.insert(v, name.to_owned());
        }
    }
    let mut counter = 0u64;
    for &v in &order {
        if names.contains_key(&v) {
            continue;
        }
        let name = loop {
            let candidate = format!("mmq_v{counter}");
            counter += 1;
            if !reserved.contains(candidate.as_str()) && !taken.contains(&candidate) {
                break candidate;
            }
        };
        taken.insert(name.clone());
        names.insert(v, name);
    }
    Ok(names)
}

/// The smallest ONNX IR version that the default-domain opset `opset` was released with.
fn ir_for_opset(opset: i64) -> i64 {
    match opset {
        ..=8 => 3,
        9 => 4,
        10 => 5,
        11 => 6,
        12..=14 => 7,
        15..=18 => 8,
        19..=20 => 9,
        21..=22 => 10,
        23 => 11,
        24 => 12,
        25..=27 => 13,
        _ => 14,
    }
}

/// The smallest ONNX IR version that has `dtype`.
fn ir_for_dtype(dtype: DType) -> i64 {
    use DType::*;
    match dtype {
        F8E4M3FN | F8E4M3FNUZ | F8E5M2 | F8E5M2FNUZ => 9,
        U4 | I4 => 10,
        F4E2M1 => 11,
        F8E8M0 => 12,
        U2 | I2 => 13,
        _ => 3,
    }
}

fn norm_domain(d: &str) -> &str {
    if d == "ai.onnx" { "" } else { d }
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
}

struct Exporter<'m, 's> {
    m: &'m Module,
    sink: &'s mut dyn ExternalSink,
    names: HashMap<Value, String>,
    /// The graph each constant operand is written in ([`const_homes`]).
    homes: HashMap<Value, GraphId>,
    /// The top-level graph.
    top: GraphId,
    /// Initializers of the top-level graph.
    initializers: Vec<pb::TensorProto>,
    /// Initializers of subgraphs, collected while their nodes are written.
    sub_initializers: HashMap<GraphId, Vec<pb::TensorProto>>,
    emitted: HashSet<Value>,
    min_ir: i64,
    /// Operator domains used by nodes, in first-use order.
    domains: Vec<String>,
    stats: Stats,
}

impl Exporter<'_, '_> {
    fn name(&self, v: Value) -> String {
        // Every value reachable from the exported graphs was named by `assign_names`.
        self.names.get(&v).cloned().unwrap_or_default()
    }

    fn model(&mut self, info: &ModelInfo, mut graph: pb::GraphProto) -> pb::ModelProto {
        graph
            .initializer
            .splice(0..0, std::mem::take(&mut self.initializers));
        // IR 3 requires every initializer to be a graph input; keep a source's IR 3 (where
        // inputs with initializers cannot be overridden) when that still holds.
        let all_inputs = graph
            .initializer
            .iter()
            .all(|t| graph.input.iter().any(|i| i.name == t.name));
        if !all_inputs {
            self.min_ir = self.min_ir.max(4);
        }

        let mut opsets: Vec<(String, i64)> = info.opsets.clone();
        if !opsets.iter().any(|(d, _)| norm_domain(d).is_empty()) {
            opsets.insert(0, (String::new(), DEFAULT_OPSET));
        }
        for d in &self.domains {
            if !opsets
                .iter()
                .any(|(have, _)| norm_domain(have) == norm_domain(d))
            {
                opsets.push((d.clone(), 1));
            }
        }
        let default_opset = opsets
            .iter()
            .find(|(d, _)| norm_domain(d).is_empty())
            .map_or(DEFAULT_OPSET, |(_, v)| *v);
        let ir_version = info
            .ir_version
            .max(self.min_ir)
            .max(ir_for_opset(default_opset));

        pb::ModelProto {
            ir_version: Some(ir_version),
            opset_import: opsets
                .into_iter()
                .map(|(domain, version)| pb::OperatorSetIdProto {
                    domain: Some(domain),
                    version: Some(version),
                })
                .collect(),
            producer_name: Some("mmq".to_owned()),
            producer_version: Some(env!("CARGO_PKG_VERSION").to_owned()),
            domain: non_empty(&info.domain),
            model_version: (info.model_version != 0).then_some(info.model_version),
            doc_string: non_empty(&info.doc),
            graph: Some(graph),
            metadata_props: info
                .metadata
                .iter()
                .map(|(k, v)| pb::StringStringEntryProto {
                    key: Some(k.clone()),
                    value: Some(v.clone()),
                })
                .collect(),
            ..Default::default()
        }
    }

    fn graph(&mut self, gid: GraphId) -> Result<pb::GraphProto, ExportError> {
        let m = self.m;
        let g = &m.graphs[gid];
        let mut gp = pb::GraphProto {
            name: Some(g.name.clone()),
            doc_string: non_empty(&g.doc),
            ..Default::default()
        };
        // Subgraph inputs and outputs may leave their type to the runtime (the checker asks
        // for types on the main graph only); `elem_type` 0 anywhere makes ONNX Runtime reject
        // the whole model.
        let sub = g.parent.is_some();
        for &v in &g.inputs {
            let vd = &m.values[v];
            gp.input.push(self.io_info(v, &m.types[vd.ty], sub));
            if let ValueDef::Input {
                default: Some(c), ..
            } = vd.def
            {
                let t = self.tensor(c, Some(self.name(v)))?;
                gp.initializer.push(t);
            }
        }
        let outputs: HashSet<Value> = g.outputs.iter().copied().collect();
        for &n in g.nodes() {
            let np = self.node(n)?;
            gp.node.push(np);
            for &v in m.nodes[n].outputs.iter().flatten() {
                let ty = &m.types[m.values[v].ty];
                // A tensor whose element type inference could not tell is left to the runtime.
                if !outputs.contains(&v) && !untyped(ty) {
                    gp.value_info.push(self.value_info(v, ty));
                }
            }
        }
        for &v in &g.outputs {
            self.use_value(v)?;
            gp.output
                .push(self.io_info(v, &m.types[m.values[v].ty], sub));
        }
        if let Some(inits) = self.sub_initializers.remove(&gid) {
            gp.initializer.extend(inits);
        }
        Ok(gp)
    }

    /// Records that `v` is used; a constant becomes an initializer of its home graph on first
    /// use.
    fn use_value(&mut self, v: Value) -> Result<(), ExportError> {
        if let ValueDef::Const(c) = self.m.values[v].def
            && self.emitted.insert(v)
        {
            let t = self.tensor(c, Some(self.name(v)))?;
            match self.homes.get(&v) {
                Some(&g) if g != self.top => {
                    // IR 3 wants every initializer listed as a graph input, which a branch
                    // (no inputs) cannot do.
                    self.min_ir = self.min_ir.max(4);
                    self.sub_initializers.entry(g).or_default().push(t);
                }
                _ => self.initializers.push(t),
            }
        }
        Ok(())
    }

    fn node(&mut self, n: Node) -> Result<pb::NodeProto, ExportError> {
        let m = self.m;
        let nd = &m.nodes[n];
        let mut input = Vec::with_capacity(nd.inputs.len());
        for v in &nd.inputs {
            match v {
                Some(v) => {
                    self.use_value(*v)?;
                    input.push(self.name(*v));
                }
                None => input.push(String::new()),
            }
        }
        let output = nd
            .outputs
            .iter()
            .map(|v| v.map(|v| self.name(v)).unwrap_or_default())
            .collect();
        let domain = nd.op.domain();
        if !self.domains.iter().any(|d| d == domain) {
            self.domains.push(domain.to_owned());
        }
        let mut attribute = Vec::new();
        for (name, a) in nd.op.attrs() {
            let ap = self.attr(n, name, &a)?;
            attribute.push(ap);
        }
        Ok(pb::NodeProto {
            input,
            output,
            name: nd.name.clone(),
            op_type: Some(nd.op.op_type().to_owned()),
            domain: non_empty(domain),
            attribute,
            ..Default::default()
        })
    }

    fn attr(&mut self, n: Node, name: &str, a: &Attr) -> Result<pb::AttributeProto, ExportError> {
        let mut p = pb::AttributeProto {
            name: Some(name.to_owned()),
            ..Default::default()
        };
        let ty = match a {
            Attr::Int(i) => {
                p.i = Some(*i);
                AttributeType::Int
            }
            Attr::Float(f) => {
                p.f = Some(*f);
                AttributeType::Float
            }
            Attr::String(s) => {
                p.s = Some(s.as_bytes().to_vec());
                AttributeType::String
            }
            Attr::Tensor(c) => {
                p.t = Some(self.attr_tensor(n, name, *c)?);
                AttributeType::Tensor
            }
            Attr::Graph(g) => {
                p.g = Some(self.subgraph(n, *g)?);
                AttributeType::Graph
            }
            Attr::Type(t) => {
                p.tp = Some(self.type_proto(t));
                AttributeType::TypeProto
            }
            Attr::Ints(v) => {
                p.ints = v.clone();
                AttributeType::Ints
            }
            Attr::Floats(v) => {
                p.floats = v.clone();
                AttributeType::Floats
            }
            Attr::Strings(v) => {
                p.strings = v.iter().map(|s| s.as_bytes().to_vec()).collect();
                AttributeType::Strings
            }
            Attr::Tensors(cs) => {
                for &c in cs {
                    let t = self.attr_tensor(n, name, c)?;
                    p.tensors.push(t);
                }
                AttributeType::Tensors
            }
            Attr::Graphs(gs) => {
                for &g in gs {
                    let gp = self.subgraph(n, g)?;
                    p.graphs.push(gp);
                }
                AttributeType::Graphs
            }
            Attr::Types(ts) => {
                p.type_protos = ts.iter().map(|t| self.type_proto(t)).collect();
                AttributeType::TypeProtos
            }
        };
        p.r#type = Some(ty as i32);
        Ok(p)
    }

    fn attr_tensor(
        &mut self,
        n: Node,
        attr: &str,
        c: Const,
    ) -> Result<pb::TensorProto, ExportError> {
        let Some(cd) = self.m.consts.get(c) else {
            return Err(ExportError::malformed(format!(
                "attribute `{attr}` of node `{}` refers to missing tensor {c:?}",
                node_label(self.m, n)
            )));
        };
        let name = cd.name.clone().filter(|s| !s.is_empty());
        self.tensor(c, name)
    }

    fn subgraph(&mut self, n: Node, g: GraphId) -> Result<pb::GraphProto, ExportError> {
        // `graph_tree` has checked that `g` exists and is used once.
        if self.m.graphs[g].parent != Some(n) {
            return Err(ExportError::malformed(format!(
                "graph `{}` is an attribute of node `{}` but names another parent",
                self.m.graphs[g].name,
                node_label(self.m, n)
            )));
        }
        self.graph(g)
    }

    /// A tensor with `name` (the value's name for initializers, the constant's for attributes).
    fn tensor(&mut self, c: Const, name: Option<String>) -> Result<pb::TensorProto, ExportError> {
        let m = self.m;
        let Some(cd) = m.consts.get(c) else {
            return Err(ExportError::malformed(format!(
                "tensor `{}` refers to missing constant {c:?}",
                name.unwrap_or_default()
            )));
        };
        let label = name
            .clone()
            .or_else(|| cd.name.clone())
            .unwrap_or_else(|| format!("{c:?}"));
        self.min_ir = self.min_ir.max(ir_for_dtype(cd.dtype));
        let count = element_count(&label, cd)?;
        let mut t = pb::TensorProto {
            dims: cd.shape.clone(),
            data_type: Some(cd.dtype.onnx_code()),
            name,
            ..Default::default()
        };
        let bad = |reason: String| ExportError::BadTensor {
            tensor: label.clone(),
            reason,
        };
        match &cd.storage {
            Storage::Absent => return Err(ExportError::AbsentData { tensor: label }),
            Storage::Strings(v) => {
                if cd.dtype != DType::String {
                    return Err(bad(format!("dtype {} but string data", cd.dtype)));
                }
                if v.len() as u64 != count {
                    return Err(bad(format!("{} strings for {count} elements", v.len())));
                }
                t.string_data = v.iter().map(|b| b.to_vec()).collect();
                self.stats.inline += cd.byte_len();
            }
            Storage::Inline(_) | Storage::External { .. } => {
                let expected = usize::try_from(count)
                    .ok()
                    .and_then(|n| cd.dtype.storage_bytes(n))
                    .ok_or_else(|| bad(format!("dtype {} cannot hold raw bytes", cd.dtype)))?;
                let len = cd.byte_len();
                if len != expected as u64 {
                    return Err(bad(format!(
                        "{len} bytes of data, but {} {:?} needs {expected}",
                        cd.dtype, cd.shape
                    )));
                }
                match self.sink.offer(&label, cd)? {
                    Some(loc) => {
                        t.data_location = Some(DataLocation::External as i32);
                        t.external_data = [
                            ("location", loc.location),
                            ("offset", loc.offset.to_string()),
                            ("length", loc.length.to_string()),
                        ]
                        .into_iter()
                        .map(|(k, v)| pb::StringStringEntryProto {
                            key: Some(k.to_owned()),
                            value: Some(v),
                        })
                        .collect();
                        self.stats.external += len;
                    }
                    None => {
                        t.raw_data = Some(inline_bytes(&label, cd)?);
                        self.stats.inline += len;
                    }
                }
            }
        }
        Ok(t)
    }

    /// A graph input's or output's value info: without a type when `sub` (a subgraph) and the
    /// element type is unknown.
    fn io_info(&mut self, v: Value, ty: &Type, sub: bool) -> pb::ValueInfoProto {
        if sub && untyped(ty) {
            return pb::ValueInfoProto {
                name: Some(self.name(v)),
                ..Default::default()
            };
        }
        self.value_info(v, ty)
    }

    fn value_info(&mut self, v: Value, ty: &Type) -> pb::ValueInfoProto {
        pb::ValueInfoProto {
            name: Some(self.name(v)),
            r#type: Some(self.type_proto(ty)),
            ..Default::default()
        }
    }

    fn type_proto(&mut self, ty: &Type) -> pb::TypeProto {
        let value = match ty {
            Type::Unknown => Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(0),
                shape: None,
            })),
            Type::Tensor(t) => {
                let (elem_type, shape) = self.tensor_type(t);
                Some(type_proto::Value::TensorType(type_proto::Tensor {
                    elem_type: Some(elem_type),
                    shape,
                }))
            }
            Type::SparseTensor(t) => {
                let (elem_type, shape) = self.tensor_type(t);
                Some(type_proto::Value::SparseTensorType(
                    type_proto::SparseTensor {
                        elem_type: Some(elem_type),
                        shape,
                    },
                ))
            }
            Type::Sequence(e) => Some(type_proto::Value::SequenceType(Box::new(
                type_proto::Sequence {
                    elem_type: Some(Box::new(self.type_proto(e))),
                },
            ))),
            Type::Optional(e) => Some(type_proto::Value::OptionalType(Box::new(
                type_proto::Optional {
                    elem_type: Some(Box::new(self.type_proto(e))),
                },
            ))),
            Type::Map(k, v) => {
                self.min_ir = self.min_ir.max(ir_for_dtype(*k));
                Some(type_proto::Value::MapType(Box::new(type_proto::Map {
                    key_type: Some(k.onnx_code()),
                    value_type: Some(Box::new(self.type_proto(v))),
                })))
            }
        };
        pb::TypeProto {
            value,
            ..Default::default()
        }
    }

    fn tensor_type(&mut self, t: &TensorType) -> (i32, Option<pb::TensorShapeProto>) {
        let elem_type = match t.dtype {
            Some(d) => {
                self.min_ir = self.min_ir.max(ir_for_dtype(d));
                d.onnx_code()
            }
            None => 0,
        };
        let shape = t.shape.as_ref().map(|dims| pb::TensorShapeProto {
            dim: dims.iter().map(|d| self.dim(d)).collect(),
        });
        (elem_type, shape)
    }

    fn dim(&self, d: &Dim) -> Dimension {
        let value = match d {
            Dim::Unknown => None,
            Dim::Expr(e) => Some(match e.as_constant() {
                Some(n) => dimension::Value::DimValue(n),
                None => dimension::Value::DimParam(e.render(&|s| {
                    self.m
                        .symbols
                        .get(s)
                        .map_or_else(|| format!("{s:?}"), |sd| sd.name.clone())
                })),
            }),
        };
        Dimension {
            value,
            ..Default::default()
        }
    }
}

/// The number of elements of a constant, checked for negative dims and overflow.
fn element_count(label: &str, cd: &ConstData) -> Result<u64, ExportError> {
    let mut count: u64 = 1;
    for &d in &cd.shape {
        let d = u64::try_from(d).map_err(|_| ExportError::BadTensor {
            tensor: label.to_owned(),
            reason: format!("negative dim in shape {:?}", cd.shape),
        })?;
        count = count.checked_mul(d).ok_or_else(|| ExportError::BadTensor {
            tensor: label.to_owned(),
            reason: format!("shape {:?} has too many elements", cd.shape),
        })?;
    }
    Ok(count)
}

/// Every constant whose data an export of `graph` writes (operands, input defaults and attribute
/// tensors), each once.
pub(crate) fn used_consts(m: &Module, graph: GraphId) -> Result<Vec<Const>, ExportError> {
    let tree = graph_tree(m, graph)?;
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut add = |c: Const| -> Result<(), ExportError> {
        if m.consts.get(c).is_none() {
            return Err(ExportError::malformed(format!(
                "reference to missing constant {c:?}"
            )));
        }
        if seen.insert(c) {
            out.push(c);
        }
        Ok(())
    };
    for &gid in &tree {
        let g = &m.graphs[gid];
        let at = || format!("graph `{}`", g.name);
        let mut values: Vec<Value> = g.inputs.iter().chain(&g.outputs).copied().collect();
        for &n in g.nodes() {
            let nd = node(m, n)?;
            values.extend(nd.inputs.iter().flatten());
            for c in nd.op.attr_consts() {
                add(c)?;
            }
        }
        for v in values {
            match value(m, v, &at)?.def {
                ValueDef::Const(c)
                | ValueDef::Input {
                    default: Some(c), ..
                } => add(c)?,
                _ => {}
            }
        }
    }
    Ok(out)
}
