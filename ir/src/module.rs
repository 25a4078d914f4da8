//! Modules, graphs, nodes and values.

use std::collections::HashMap;

use crate::arena::{Arena, entity};
use crate::constant::{Const, ConstData};
use crate::dim::{Dim, DimExpr, Sym, SymbolData};
use crate::op::Op;
use crate::types::{Ty, Type, TypeTable};

entity!(
    /// A graph in [`Module::graphs`]: a top-level model graph or the body of a control-flow op.
    GraphId,
    "@"
);
entity!(
    /// A node in [`Module::nodes`].
    Node,
    "node"
);
entity!(
    /// A value (an SSA tensor) in [`Module::values`].
    Value,
    "%"
);

/// Where a value comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ValueDef {
    /// Input `index` of `graph`. `default` is an initializer that gives the input a default value
    /// (ONNX: an initializer with the same name as a graph input).
    Input {
        /// The graph.
        graph: GraphId,
        /// Position in the graph's input list.
        index: u32,
        /// Default value, if any.
        default: Option<Const>,
    },
    /// Output `index` of `node`.
    Output {
        /// The producing node.
        node: Node,
        /// Position in the node's output list.
        index: u32,
    },
    /// A constant (initializer).
    Const(Const),
}

/// A value.
#[derive(Clone, Debug, PartialEq)]
pub struct ValueData {
    /// Source name (ONNX tensor name), if any.
    pub name: Option<String>,
    /// Type (possibly [`Type::Unknown`] before inference).
    pub ty: Ty,
    /// Definition.
    pub def: ValueDef,
}

/// A node: an op applied to ordered operands, producing ordered results. Missing optional
/// operands and results (ONNX `""`) are `None`.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeData {
    /// The operation.
    pub op: Op,
    /// Operands in order.
    pub inputs: Vec<Option<Value>>,
    /// Results in order.
    pub outputs: Vec<Option<Value>>,
    /// Source node name, if any.
    pub name: Option<String>,
    /// The graph whose node list holds this node.
    pub graph: GraphId,
}

/// A graph: inputs, nodes in topological order, outputs.
#[derive(Clone, Debug, PartialEq)]
pub struct GraphData {
    /// Name (the ONNX graph name).
    pub name: String,
    /// Graph inputs (values defined as [`ValueDef::Input`]).
    pub inputs: Vec<Value>,
    /// Graph outputs (any values visible in the graph).
    pub outputs: Vec<Value>,
    /// Nodes in topological order ([`GraphData::nodes`]; changed through [`crate::edit`]).
    pub(crate) nodes: Vec<Node>,
    /// The node whose attribute holds this graph, for subgraphs.
    pub parent: Option<Node>,
    /// Source documentation string.
    pub doc: String,
}

impl GraphData {
    /// The nodes, in topological order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }
}

/// Facts about the model file a top-level graph came from, kept so export can reproduce them.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ModelInfo {
    /// ONNX IR version.
    pub ir_version: i64,
    /// Opset imports: (domain, version); `""` is the default domain.
    pub opsets: Vec<(String, i64)>,
    /// Producer name.
    pub producer_name: String,
    /// Producer version.
    pub producer_version: String,
    /// Model domain.
    pub domain: String,
    /// Model version.
    pub model_version: i64,
    /// Model documentation string.
    pub doc: String,
    /// Metadata key/value pairs in source order.
    pub metadata: Vec<(String, String)>,
    /// The file the model was read from, if any.
    pub source: Option<std::path::PathBuf>,
    /// Model-local functions (`ModelProto.functions`), each an encoded ONNX `FunctionProto`,
    /// kept so that export can write them back unchanged.
    pub functions: Vec<bytes::Bytes>,
}

impl ModelInfo {
    /// The version imported for `domain` (`""` and `ai.onnx` are the same).
    pub fn opset(&self, domain: &str) -> Option<i64> {
        let norm = |d: &str| {
            if d == "ai.onnx" {
                String::new()
            } else {
                d.to_owned()
            }
        };
        let want = norm(domain);
        self.opsets
            .iter()
            .find(|(d, _)| norm(d) == want)
            .map(|(_, v)| *v)
    }
}

/// A top-level graph and the model it came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// The graph.
    pub graph: GraphId,
    /// Model facts.
    pub model: ModelInfo,
}

/// Declares that output `from.1` of graph `from.0` feeds input `to.1` of graph `to.0`
/// (a multi-file pipeline such as vision encoder → decoder).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Link {
    /// Producing graph and output index.
    pub from: (GraphId, u32),
    /// Consuming graph and input index.
    pub to: (GraphId, u32),
}

/// Where a [`crate::edit::Cursor`] puts a node in its graph's node list (which is in topological
/// order: a node goes before its first reader and after what it reads).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum At {
    /// First.
    Start,
    /// Last.
    End,
    /// Right before this node (last when it is not in the list).
    Before(Node),
    /// Right after this node (last when it is not in the list).
    After(Node),
    /// Not listed: the caller places the node in a list it builds (the node still belongs to
    /// the graph).
    Unlisted,
}

/// A module: symbols, types, constants, and one or more graphs sharing them.
///
/// Values and nodes live in module-wide arenas, so a subgraph refers to a value of an enclosing
/// graph with the same handle (ONNX outer-scope references).
#[derive(Clone, Debug, Default)]
pub struct Module {
    /// Dimension symbols.
    pub symbols: Arena<Sym, SymbolData>,
    /// Interned types.
    pub types: TypeTable,
    /// Constants.
    pub consts: Arena<Const, ConstData>,
    /// Values.
    pub values: Arena<Value, ValueData>,
    /// Nodes (a graph lists the ones it holds).
    pub nodes: Arena<Node, NodeData>,
    /// Graphs.
    pub graphs: Arena<GraphId, GraphData>,
    /// Top-level graphs in order.
    pub entries: Vec<Entry>,
    /// Dataflow between top-level graphs.
    pub links: Vec<Link>,
    sym_index: HashMap<String, Sym>,
    const_values: HashMap<Const, Value>,
}

impl PartialEq for Module {
    fn eq(&self, o: &Self) -> bool {
        self.symbols == o.symbols
            && self.consts == o.consts
            && self.values.len() == o.values.len()
            && self
                .values
                .iter()
                .zip(o.values.iter())
                .all(|((_, a), (_, b))| {
                    a.name == b.name && a.def == b.def && self.types[a.ty] == o.types[b.ty]
                })
            && self.nodes == o.nodes
            && self.graphs == o.graphs
            && self.entries == o.entries
            && self.links == o.links
    }
}

impl Module {
    /// An empty module.
    pub fn new() -> Self {
        Self::default()
    }

    /// The symbol named `name`, declared (unbounded) if new.
    pub fn symbol(&mut self, name: &str) -> Sym {
        if let Some(&s) = self.sym_index.get(name) {
            return s;
        }
        let s = self.symbols.push(SymbolData {
            name: name.to_owned(),
            min: None,
            max: None,
            equals: None,
        });
        self.sym_index.insert(name.to_owned(), s);
        s
    }

    /// The symbol named `name`, if declared.
    pub fn find_symbol(&self, name: &str) -> Option<Sym> {
        self.sym_index.get(name).copied()
    }

    /// Whether any symbol stands for an expression ([`SymbolData::equals`]).
    pub fn has_symbol_equalities(&self) -> bool {
        self.symbols.iter().any(|(_, d)| d.equals.is_some())
    }

    /// `e` with every symbol that stands for an expression replaced by it.
    pub fn canon_expr(&self, e: &DimExpr) -> DimExpr {
        let def = |s: Sym| self.symbols.get(s).and_then(|d| d.equals.clone());
        e.substitute(&def).unwrap_or_else(|| e.clone())
    }

    /// [`Module::canon_expr`] on a dim.
    pub fn canon_dim(&self, d: &Dim) -> Dim {
        match d {
            Dim::Expr(e) => Dim::Expr(self.canon_expr(e)),
            Dim::Unknown => Dim::Unknown,
        }
    }

    /// [`Module::canon_dim`] on every dim of a type.
    pub fn canon_type(&self, t: &Type) -> Type {
        if !self.has_symbol_equalities() {
            return t.clone();
        }
        let tensor = |tt: &crate::types::TensorType| crate::types::TensorType {
            dtype: tt.dtype,
            shape: tt
                .shape
                .as_ref()
                .map(|dims| dims.iter().map(|d| self.canon_dim(d)).collect()),
        };
        match t {
            Type::Unknown => Type::Unknown,
            Type::Tensor(tt) => Type::Tensor(tensor(tt)),
            Type::SparseTensor(tt) => Type::SparseTensor(tensor(tt)),
            Type::Sequence(x) => Type::Sequence(Box::new(self.canon_type(x))),
            Type::Optional(x) => Type::Optional(Box::new(self.canon_type(x))),
            Type::Map(k, x) => Type::Map(*k, Box::new(self.canon_type(x))),
        }
    }

    /// Whether symbol `s` appears in the type of an input or output of a graph.
    fn on_interface(&self, s: Sym) -> bool {
        self.graphs.iter().any(|(_, g)| {
            g.inputs.iter().chain(&g.outputs).any(|&v| {
                self.value_type(v).shape().is_some_and(|dims| {
                    dims.iter().any(|d| {
                        d.expr().is_some_and(|e| {
                            let mut syms = Vec::new();
                            e.symbols(&mut syms);
                            syms.contains(&s)
                        })
                    })
                })
            })
        })
    }

    /// Records that symbol `s` equals `e` (see [`SymbolData::equals`]) unless `s` already
    /// stands for an expression or `e`, with the known equalities applied, mentions `s`.
    /// Every recorded expression is rewritten with the new one, so none refers to a symbol that
    /// stands for another. Returns whether the equality was recorded.
    pub fn assume_equal(&mut self, s: Sym, e: &DimExpr) -> bool {
        let Some(data) = self.symbols.get(s) else {
            return false;
        };
        if data.equals.is_some() {
            return false;
        }
        let e = self.canon_expr(e);
        let mut mentioned = Vec::new();
        e.symbols(&mut mentioned);
        // A symbol of a graph's inputs or outputs is the caller's to choose: a constant found
        // for it inside is not a declaration. One that names an inner dim only (an exporter's
        // `unk__35`) stands for what inference computes, a constant too.
        if mentioned.contains(&s) || (e.as_constant().is_some() && self.on_interface(s)) {
            return false;
        }
        let keys: Vec<Sym> = self.symbols.keys().collect();
        for k in keys {
            if let Some(old) = self.symbols[k].equals.clone() {
                let new = old
                    .substitute(&|x| (x == s).then(|| e.clone()))
                    .unwrap_or(old);
                self.symbols[k].equals = Some(new);
            }
        }
        self.symbols[s].equals = Some(e);
        true
    }

    /// Interns a type.
    pub fn intern(&mut self, ty: Type) -> Ty {
        self.types.intern(ty)
    }

    /// The type of a value.
    pub fn value_type(&self, v: Value) -> &Type {
        &self.types[self.values[v].ty]
    }

    /// Adds a graph with no inputs, outputs or nodes.
    pub fn add_graph(&mut self, name: &str, parent: Option<Node>) -> GraphId {
        self.graphs.push(GraphData {
            name: name.to_owned(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            nodes: Vec::new(),
            parent,
            doc: String::new(),
        })
    }

    /// Appends an input to `graph`.
    pub fn add_input(&mut self, graph: GraphId, name: Option<String>, ty: Type) -> Value {
        let ty = self.intern(ty);
        let index = self.graphs[graph].inputs.len() as u32;
        let v = self.values.push(ValueData {
            name,
            ty,
            def: ValueDef::Input {
                graph,
                index,
                default: None,
            },
        });
        self.graphs[graph].inputs.push(v);
        v
    }

    /// Adds a constant and the value that refers to it.
    pub fn add_const(&mut self, data: ConstData) -> Value {
        let ty = self.intern(Type::tensor(
            data.dtype,
            data.shape.iter().map(|&d| crate::Dim::known(d)).collect(),
        ));
        let name = data.name.clone();
        let c = self.consts.push(data);
        let v = self.values.push(ValueData {
            name,
            ty,
            def: ValueDef::Const(c),
        });
        self.const_values.insert(c, v);
        v
    }

    /// Adds a constant that is only referenced from attributes (no value).
    pub fn add_attr_const(&mut self, data: ConstData) -> Const {
        self.consts.push(data)
    }

    /// The value that refers to constant `c`, if it has one.
    pub fn const_value(&self, c: Const) -> Option<Value> {
        self.const_values.get(&c).copied()
    }

    /// Sets a value's type.
    pub fn set_type(&mut self, v: Value, ty: Type) {
        let ty = self.intern(ty);
        self.values[v].ty = ty;
    }

    /// The model facts of the entry whose graph is, or encloses, `graph`.
    pub fn model_of(&self, graph: GraphId) -> Option<&ModelInfo> {
        let mut g = graph;
        while let Some(parent) = self.graphs[g].parent {
            g = self.nodes[parent].graph;
        }
        self.entries.iter().find(|e| e.graph == g).map(|e| &e.model)
    }

    /// The opset imported for the default domain by the model holding `graph`.
    pub fn onnx_opset(&self, graph: GraphId) -> Option<i64> {
        self.model_of(graph).and_then(|m| m.opset(""))
    }

    /// Every graph nested in `graph` (through op attributes), depth first, `graph` first.
    pub fn graph_tree(&self, graph: GraphId) -> Vec<GraphId> {
        let mut out = vec![graph];
        let mut i = 0;
        while i < out.len() {
            let g = out[i];
            for &n in &self.graphs[g].nodes {
                out.extend(self.nodes[n].op.subgraphs());
            }
            i += 1;
        }
        out
    }

    /// The node that computes `v` (`None` for inputs and constants).
    pub fn producer(&self, v: Value) -> Option<&NodeData> {
        match self.values.get(v)?.def {
            ValueDef::Output { node, .. } => self.nodes.get(node),
            _ => None,
        }
    }

    /// The constant `v` holds: an initializer, or the tensor of a `Constant` node; `None` for
    /// anything computed or fed at run time.
    pub fn const_source(&self, v: Value) -> Option<Const> {
        match self.values.get(v)?.def {
            ValueDef::Const(c) => Some(c),
            ValueDef::Output { node, .. } => match &self.nodes[node].op {
                crate::Op::Constant { value: Some(c), .. } => Some(*c),
                _ => None,
            },
            ValueDef::Input { .. } => None,
        }
    }

    /// Total bytes of constant data.
    pub fn weight_bytes(&self) -> u64 {
        self.consts.iter().map(|(_, c)| c.byte_len()).sum()
    }
}
