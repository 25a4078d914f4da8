//! Type and shape inference.
//!
//! [`infer_module`] walks every graph in topological order (an enclosing graph before the bodies
//! of its control-flow nodes, so bodies see the types of outer values) and writes each node's
//! result types into the IR with [`Module::set_type`]. Rules follow the ONNX operator at the
//! default-domain opset of the model holding the graph ([`Module::onnx_opset`]).
//!
//! # Merge rule
//! A value that already has a type (an ONNX `value_info` or graph output type) keeps whatever is
//! more specific in it: inference only fills in [`Type::Unknown`], an unknown dtype, an unknown
//! rank and [`Dim::Unknown`] entries. Where a declared constant dim contradicts an inferred
//! constant dim (or a declared dtype or rank contradicts the inferred one), the declared one is
//! kept and a warning names the value. Ops without a rule (custom ops) keep their result types.
//!
//! # Assumptions about symbolic dims
//! A symbol is at least its declared minimum ([`crate::SymbolData::min`], 1 when undeclared).
//! Slices with symbolic bounds are taken to lie inside the sliced dim, as exporters emit them
//! (`x[:, :seq]` has length `seq`, `x[:, 1:]` has length `dim - 1`); a constant end short of a
//! symbolic dim counts only when the symbol's minimum proves it. Graphs whose model imports no
//! default-domain opset are read at [`DEFAULT_OPSET`].
//!
//! # Shape values
//! Exporters compute shapes at run time (`Shape → Gather → Unsqueeze → Concat → Reshape`).
//! Inference tracks the contents of small integer tensors (at most [`MAX_SHAPE_VALUE_LEN`]
//! elements, rank 0 or 1; a rank-0 tensor has one element) as [`Dim`]s in a [`ShapeValues`] side
//! table, so that such a reshape target stays `[batch, seq, 4, 16]`.

mod contrib;
mod dims;
mod ops;
mod tail;
mod values;

#[cfg(test)]
pub(crate) mod tests;

use std::collections::HashSet;

use crate::arena::SecondaryMap;
use crate::constant::Const;
use crate::diag::{Entity, IrError};
use crate::dim::Dim;
use crate::dtype::DType;
use crate::module::{GraphId, Module, Node, NodeData, Value, ValueDef};
use crate::op::Op;
use crate::types::{TensorType, Type};

pub use dims::{broadcast_dims, broadcast_shapes, ceil_div, exact_div, floor_div};

/// The opset assumed for graphs whose model does not declare the default domain.
pub const DEFAULT_OPSET: i64 = 23;

/// Integer tensors with at most this many elements are tracked as shape values.
pub const MAX_SHAPE_VALUE_LEN: usize = 64;

/// Side table of shape values: for small rank-0 and rank-1 integer tensors, their contents as
/// [`Dim`]s (an entry is [`Dim::Unknown`] where that element is not known).
#[derive(Clone, Debug, Default)]
pub struct ShapeValues {
    map: SecondaryMap<Value, Vec<Dim>>,
}

impl ShapeValues {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// The known contents of `v`.
    pub fn get(&self, v: Value) -> Option<&[Dim]> {
        self.map.get(v).map(Vec::as_slice)
    }

    /// The contents of `v` when every element is a known constant.
    pub fn get_ints(&self, v: Value) -> Option<Vec<i64>> {
        self.get(v)?.iter().map(Dim::as_known).collect()
    }

    /// Records the contents of `v`.
    pub fn insert(&mut self, v: Value, dims: Vec<Dim>) {
        self.map.insert(v, dims);
    }
}

/// Infers the types of every value of every graph in `m` and writes them into the IR. Returns
/// the warnings raised where declared types contradict inferred ones.
pub fn infer_module(m: &mut Module) -> Vec<IrError> {
    infer_module_with_values(m).0
}

/// [`infer_module`] for a model read from another tool's file, whose declared types are the
/// exporter's claims: where one contradicts what the op computes (an output declared `[1, seq]`
/// that the graph computes as `[16, 1, 8210]`), the computed type replaces it, as ONNX Runtime
/// trusts the computed shape, and the warning says so.
pub fn infer_module_correcting(m: &mut Module) -> Vec<IrError> {
    infer_with(m, Conflicts::Correct).0
}

/// [`infer_module`], also returning the shape values it tracked.
pub fn infer_module_with_values(m: &mut Module) -> (Vec<IrError>, ShapeValues) {
    infer_with(m, Conflicts::Keep)
}

/// The declared types of `m` that contradict inference, one warning each saying what is
/// declared and what is inferred (`m` is typed as [`infer_module`] types it): the verifier's
/// check 8.
pub(crate) fn conflicts(m: &mut Module) -> Vec<IrError> {
    infer_with(m, Conflicts::Report).0
}

/// What inference does with a declared type that contradicts the inferred one.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Conflicts {
    /// Keep the declared type, and say so.
    Keep,
    /// Replace it by the inferred one, and say so ([`infer_module_correcting`]).
    Correct,
    /// Keep it; the message names the conflict alone, for a caller that words the outcome.
    Report,
}

fn infer_with(m: &mut Module, mode: Conflicts) -> (Vec<IrError>, ShapeValues) {
    let (errors, sv, learned) = infer_once(m, mode);
    if !learned {
        return (errors, sv);
    }
    // A declared symbol turned out to stand for an expression: write the expression everywhere
    // (values typed before it was learned included) and infer again with it known from the start.
    canon_value_types(m);
    let (mut again, sv, _) = infer_once(m, mode);
    if mode == Conflicts::Correct {
        // Corrections of the first pass are not conflicts in the second: keep their warnings.
        let mut all = errors;
        for e in again.drain(..) {
            if !all
                .iter()
                .any(|a| a.entity == e.entity && a.message == e.message)
            {
                all.push(e);
            }
        }
        return (all, sv);
    }
    (again, sv)
}

/// Rewrites every value type with the module's symbol equalities, except the inputs of
/// top-level graphs: those keep the names the caller binds.
fn canon_value_types(m: &mut Module) {
    let inputs: HashSet<Value> = m
        .graphs
        .iter()
        .filter(|(_, g)| g.parent.is_none())
        .flat_map(|(_, g)| g.inputs.iter().copied())
        .collect();
    let values: Vec<Value> = m.values.keys().collect();
    for v in values {
        if inputs.contains(&v) || m.values[v].ty.index() >= m.types.len() {
            continue;
        }
        let old = m.types[m.values[v].ty].clone();
        let new = m.canon_type(&old);
        if new != old {
            m.set_type(v, new);
        }
    }
}

fn infer_once(m: &mut Module, mode: Conflicts) -> (Vec<IrError>, ShapeValues, bool) {
    let equalities = m.has_symbol_equalities();
    let mut cx = Infer {
        m,
        sv: ShapeValues::new(),
        errors: Vec::new(),
        done: HashSet::new(),
        learned: false,
        equalities,
        mode,
    };
    cx.seed_consts();
    let entries: Vec<GraphId> = cx.m.entries.iter().map(|e| e.graph).collect();
    for g in entries {
        cx.infer_graph(g);
    }
    let all: Vec<GraphId> = cx.m.graphs.keys().collect();
    for &g in &all {
        if cx.m.graphs[g].parent.is_none() {
            cx.infer_graph(g);
        }
    }
    for g in all {
        cx.infer_graph(g);
    }
    (cx.errors, cx.sv, cx.learned)
}

/// The shape values of `m` as inference would track them (`m` itself is left unchanged).
pub fn shape_values(m: &Module) -> ShapeValues {
    let mut copy = m.clone();
    infer_module_with_values(&mut copy).1
}

/// The default-domain opset of the model holding `g`, robust to malformed parent chains.
pub(crate) fn opset_of(m: &Module, g: GraphId) -> Option<i64> {
    let mut g = g;
    for _ in 0..=m.graphs.len() {
        let parent = m.graphs.get(g)?.parent;
        match parent {
            Some(p) => g = m.nodes.get(p)?.graph,
            None => return m.entries.iter().find(|e| e.graph == g)?.model.opset(""),
        }
    }
    None
}

/// How a value is named in messages: `'name'` or its handle.
pub(crate) fn value_label(m: &Module, v: Value) -> String {
    match m.values.get(v).and_then(|d| d.name.as_deref()) {
        Some(n) => format!("'{n}'"),
        None => format!("{v:?}"),
    }
}

/// How a node is named in messages: `Conv 'name'` or `Conv node3`.
pub(crate) fn node_label(m: &Module, n: Node) -> String {
    match m.nodes.get(n) {
        Some(d) => match &d.name {
            Some(name) => format!("{} '{name}'", d.op.op_type()),
            None => format!("{} {n:?}", d.op.op_type()),
        },
        None => format!("{n:?}"),
    }
}

/// Reads the elements of a small integer constant.
pub(crate) fn const_ints(m: &Module, c: Const) -> Option<Vec<i64>> {
    let data = m.consts.get(c)?;
    if data.shape.len() > 1 || data.num_elements() > MAX_SHAPE_VALUE_LEN {
        return None;
    }
    let n = data.num_elements();
    let bytes = data.raw_bytes()?;
    let width = match data.dtype {
        DType::I64 | DType::U64 => 8,
        DType::I32 | DType::U32 => 4,
        DType::I16 | DType::U16 => 2,
        DType::I8 | DType::U8 | DType::Bool => 1,
        _ => return None,
    };
    if bytes.len() < n * width {
        return None;
    }
    let out = bytes[..n * width]
        .chunks_exact(width)
        .map(|b| match data.dtype {
            DType::I64 | DType::U64 => {
                i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
            }
            DType::I32 => i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            DType::U32 => i64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            DType::I16 => i64::from(i16::from_le_bytes([b[0], b[1]])),
            DType::U16 => i64::from(u16::from_le_bytes([b[0], b[1]])),
            DType::I8 => i64::from(b[0] as i8),
            _ => i64::from(b[0]),
        })
        .collect();
    Some(out)
}

/// Reads the elements of a small floating-point constant (f32 or f64).
pub(crate) fn const_floats(m: &Module, c: Const) -> Option<Vec<f64>> {
    let data = m.consts.get(c)?;
    if data.num_elements() > MAX_SHAPE_VALUE_LEN {
        return None;
    }
    let n = data.num_elements();
    let bytes = data.raw_bytes()?;
    match data.dtype {
        DType::F32 if bytes.len() >= n * 4 => Some(
            bytes[..n * 4]
                .chunks_exact(4)
                .map(|b| f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
                .collect(),
        ),
        DType::F64 if bytes.len() >= n * 8 => Some(
            bytes[..n * 8]
                .chunks_exact(8)
                .map(|b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
                .collect(),
        ),
        _ => None,
    }
}

/// Read-only view of one node for the inference rules.
pub(crate) struct Cx<'a> {
    pub m: &'a Module,
    pub sv: &'a ShapeValues,
    pub opset: i64,
    pub node: &'a NodeData,
    /// Operand types and contents known from outside the module (a run's concrete operands),
    /// read instead of the module's types and shape values.
    pub given: Option<&'a Operands<'a>>,
}

/// The operands of one node as a run sees them: a type per operand slot and, for small integer
/// tensors, their contents.
pub struct Operands<'a> {
    /// The type of each operand slot (`Type::Unknown` for an omitted one).
    pub types: &'a [Type],
    /// The contents of small rank-0 or rank-1 integer operands, per slot, as known dims.
    pub vals: &'a [Option<Vec<Dim>>],
}

/// The result types of `node` (not a control-flow node) in `m` at `opset`, with its operands
/// given by `operands` instead of the module's types: what a run of concrete shapes produces,
/// for sizing results before a kernel allocates them. Control-flow nodes give no types.
pub fn infer_node_types(m: &Module, node: &NodeData, opset: i64, operands: &Operands) -> Vec<Type> {
    if !node.op.subgraphs().is_empty() {
        return vec![Type::Unknown; node.outputs.len()];
    }
    let sv = ShapeValues::new();
    ops::infer(&Cx {
        m,
        sv: &sv,
        opset,
        node,
        given: Some(operands),
    })
}

impl<'a> Cx<'a> {
    /// Operand `i`, when present.
    pub fn input(&self, i: usize) -> Option<Value> {
        self.node.inputs.get(i).copied().flatten()
    }

    /// Number of operand slots.
    pub fn num_inputs(&self) -> usize {
        self.node.inputs.len()
    }

    /// Type of operand `i`.
    pub fn ty(&self, i: usize) -> Option<&'a Type> {
        if let Some(given) = self.given {
            return given.types.get(i).filter(|t| !matches!(t, Type::Unknown));
        }
        let v = self.input(i)?;
        let ty = self.m.values.get(v)?.ty;
        (ty.index() < self.m.types.len()).then(|| &self.m.types[ty])
    }

    /// Tensor type of operand `i`.
    pub fn tt(&self, i: usize) -> Option<&'a TensorType> {
        self.ty(i)?.as_tensor()
    }

    /// Element type of operand `i`.
    pub fn dtype(&self, i: usize) -> Option<DType> {
        self.tt(i)?.dtype
    }

    /// Dims of operand `i`.
    pub fn shape(&self, i: usize) -> Option<&'a [Dim]> {
        self.tt(i)?.shape.as_deref()
    }

    /// Rank of operand `i`.
    pub fn rank(&self, i: usize) -> Option<usize> {
        self.shape(i).map(<[Dim]>::len)
    }

    /// Shape value of operand `i`.
    pub fn vals(&self, i: usize) -> Option<&'a [Dim]> {
        if let Some(given) = self.given {
            return given.vals.get(i)?.as_deref();
        }
        self.sv.get(self.input(i)?)
    }

    /// Contents of operand `i` when every element is a known integer.
    pub fn ints(&self, i: usize) -> Option<Vec<i64>> {
        self.vals(i)?.iter().map(Dim::as_known).collect()
    }

    /// The single integer held by operand `i`.
    pub fn int(&self, i: usize) -> Option<i64> {
        match self.ints(i)?.as_slice() {
            [x] => Some(*x),
            _ => None,
        }
    }

    /// Contents of operand `i` when it is a small float constant (initializer or `Constant`).
    pub fn floats(&self, i: usize) -> Option<Vec<f64>> {
        let v = self.input(i)?;
        match self.m.values.get(v)?.def {
            ValueDef::Const(c) => const_floats(self.m, c),
            ValueDef::Input {
                default: Some(c), ..
            } => const_floats(self.m, c),
            ValueDef::Output { node, .. } => match &self.m.nodes.get(node)?.op {
                Op::Constant { value: Some(c), .. } => const_floats(self.m, *c),
                Op::Constant {
                    value_floats: Some(f),
                    ..
                } => Some(f.iter().map(|&x| f64::from(x)).collect()),
                Op::Constant {
                    value_float: Some(f),
                    ..
                } => Some(vec![f64::from(*f)]),
                _ => None,
            },
            ValueDef::Input { .. } => None,
        }
    }
}

struct Infer<'m> {
    m: &'m mut Module,
    sv: ShapeValues,
    errors: Vec<IrError>,
    done: HashSet<GraphId>,
    /// Whether this run recorded a symbol equality ([`Module::assume_equal`]).
    learned: bool,
    /// Whether the module has any symbol equality (then every written type is rewritten with
    /// them).
    equalities: bool,
    /// What a declared type that contradicts the inferred one becomes.
    mode: Conflicts,
}

impl Infer<'_> {
    fn seed_consts(&mut self) {
        for (v, data) in self.m.values.iter() {
            if let ValueDef::Const(c) = data.def
                && let Some(ints) = const_ints(self.m, c)
            {
                self.sv
                    .insert(v, ints.into_iter().map(Dim::known).collect());
            }
        }
    }

    fn infer_graph(&mut self, g: GraphId) {
        if self.m.graphs.get(g).is_none() || !self.done.insert(g) {
            return;
        }
        let nodes = self.m.graphs[g].nodes.clone();
        let opset = opset_of(self.m, g).unwrap_or(DEFAULT_OPSET);
        for n in nodes {
            if self.m.nodes.get(n).is_some() {
                self.infer_node(n, opset);
            }
        }
    }

    /// Sets the type of a subgraph input from the enclosing node (merging).
    fn seed_input(&mut self, g: GraphId, index: usize, ty: Type) {
        if let Some(&v) = self.m.graphs.get(g).and_then(|d| d.inputs.get(index)) {
            self.write(v, ty);
        }
    }

    fn type_of(&self, v: Option<Value>) -> Type {
        v.and_then(|v| self.m.values.get(v))
            .filter(|d| d.ty.index() < self.m.types.len())
            .map_or(Type::Unknown, |d| self.m.types[d.ty].clone())
    }

    fn graph_output_types(&self, g: GraphId) -> Vec<Type> {
        self.m.graphs.get(g).map_or_else(Vec::new, |d| {
            d.outputs.iter().map(|&v| self.type_of(Some(v))).collect()
        })
    }

    fn infer_node(&mut self, n: Node, opset: i64) {
        let node = self.m.nodes[n].clone();
        // Control flow: type the bodies first (their outer references are already typed).
        let inferred: Vec<Type> = match &node.op {
            Op::If {
                then_branch,
                else_branch,
            } => {
                let mut branches = Vec::new();
                for b in [then_branch, else_branch].into_iter().flatten() {
                    self.infer_graph(*b);
                    branches.push(self.graph_output_types(*b));
                }
                // A condition known from shape values selects one branch.
                let cond = node.inputs.first().copied().flatten();
                if let (Some(c), 2) = (cond.and_then(|c| self.sv.get_ints(c)), branches.len())
                    && let [c] = c.as_slice()
                {
                    let taken = branches.swap_remove(usize::from(*c == 0));
                    branches = vec![taken];
                }
                ops::if_outputs(&branches, node.outputs.len())
            }
            Op::Loop { body: Some(body) } => self.infer_loop(&node, *body),
            Op::Scan {
                body: Some(body),
                num_scan_inputs,
                scan_input_axes,
                scan_output_axes,
                ..
            } => self.infer_scan(
                &node,
                *body,
                opset,
                num_scan_inputs.unwrap_or(0),
                scan_input_axes.as_deref(),
                scan_output_axes.as_deref(),
            ),
            op => {
                for g in op.subgraphs() {
                    self.infer_graph(g);
                }
                let cx = Cx {
                    m: self.m,
                    sv: &self.sv,
                    opset,
                    node: &node,
                    given: None,
                };
                ops::infer(&cx)
            }
        };
        for (i, ty) in inferred.into_iter().enumerate() {
            if let Some(Some(v)) = node.outputs.get(i) {
                self.write(*v, ty);
            }
        }
        let cx = Cx {
            m: self.m,
            sv: &self.sv,
            opset,
            node: &node,
            given: None,
        };
        let found = values::propagate(&cx);
        for (i, dims) in found.into_iter().enumerate() {
            if let (Some(dims), Some(Some(v))) = (dims, node.outputs.get(i)) {
                let dims = if self.equalities {
                    dims.iter().map(|d| self.m.canon_dim(d)).collect()
                } else {
                    dims
                };
                self.sv.insert(*v, dims);
            }
        }
    }

    fn infer_loop(&mut self, node: &NodeData, body: GraphId) -> Vec<Type> {
        let carried = node.inputs.len().saturating_sub(2);
        self.seed_input(body, 0, Type::tensor(DType::I64, vec![]));
        self.seed_input(body, 1, Type::tensor(DType::Bool, vec![]));
        for i in 0..carried {
            let ty = self.type_of(node.inputs[2 + i]);
            self.seed_input(body, 2 + i, ty);
        }
        self.infer_graph(body);
        let outs = self.graph_output_types(body);
        // A static trip count without a condition gives scan outputs a known length.
        let trip = match (node.inputs.first().copied().flatten(), node.inputs.get(1)) {
            (Some(m), None | Some(None)) => match self.sv.get(m) {
                Some([d]) => d.clone(),
                _ => Dim::Unknown,
            },
            _ => Dim::Unknown,
        };
        (0..node.outputs.len())
            .map(|i| {
                let body_ty = outs.get(1 + i).cloned().unwrap_or(Type::Unknown);
                if i < carried {
                    let init = self.type_of(node.inputs[2 + i]);
                    ops::unify_types(&body_ty, &init)
                } else {
                    ops::with_leading_dim(&body_ty, trip.clone(), 0)
                }
            })
            .collect()
    }

    /// `Scan`: from opset 9 operands are states then scan inputs (sliced along
    /// `scan_input_axes`); before, a `sequence_lens` operand comes first and every operand has a
    /// leading batch axis, with the scan axis second.
    fn infer_scan(
        &mut self,
        node: &NodeData,
        body: GraphId,
        opset: i64,
        num_scan: i64,
        in_axes: Option<&[i64]>,
        out_axes: Option<&[i64]>,
    ) -> Vec<Type> {
        let legacy = opset < 9;
        let operands = node.inputs.get(usize::from(legacy)..).unwrap_or(&[]);
        let num_scan = usize::try_from(num_scan).unwrap_or(0).min(operands.len());
        let states = operands.len() - num_scan;
        let mut scan_len = Dim::Unknown;
        let mut batch = Dim::Unknown;
        for (i, v) in operands.iter().enumerate() {
            let mut ty = self.type_of(*v);
            if legacy {
                let (t, b) = remove_axis(&ty, 0);
                if i == states {
                    batch = b;
                }
                ty = t;
            }
            if i >= states {
                let j = i - states;
                let axis = if legacy {
                    0
                } else {
                    in_axes.and_then(|a| a.get(j)).copied().unwrap_or(0)
                };
                let (t, len) = remove_axis(&ty, axis);
                if j == 0 {
                    scan_len = len;
                }
                ty = t;
            }
            self.seed_input(body, i, ty);
        }
        self.infer_graph(body);
        let outs = self.graph_output_types(body);
        (0..node.outputs.len())
            .map(|i| {
                let body_ty = outs.get(i).cloned().unwrap_or(Type::Unknown);
                let ty = if i < states {
                    body_ty
                } else if legacy {
                    ops::with_leading_dim(&body_ty, scan_len.clone(), 0)
                } else {
                    let axis = out_axes
                        .and_then(|a| a.get(i - states))
                        .copied()
                        .unwrap_or(0);
                    ops::with_leading_dim(&body_ty, scan_len.clone(), axis)
                };
                let ty = if legacy {
                    ops::with_leading_dim(&ty, batch.clone(), 0)
                } else {
                    ty
                };
                match operands.get(i).filter(|_| i < states) {
                    Some(v) => ops::unify_types(&ty, &self.type_of(*v)),
                    None => ty,
                }
            })
            .collect()
    }

    /// Where the type a value already has names a dim by a bare symbol and inference computes
    /// it as another expression, the source has declared the two equal: records that
    /// ([`Module::assume_equal`]). Returns whether anything was recorded.
    fn learn_equalities(&mut self, old: &Type, inferred: &Type) -> bool {
        let (Some(a), Some(b)) = (old.as_tensor(), inferred.as_tensor()) else {
            return false;
        };
        let (Some(x), Some(y)) = (&a.shape, &b.shape) else {
            return false;
        };
        if x.len() != y.len() {
            return false;
        }
        let mut learned = false;
        for (dx, dy) in x.iter().zip(y) {
            if let (Some(s), Some(e)) = (dx.expr().and_then(|e| e.as_sym()), dy.expr())
                && e.as_sym() != Some(s)
                && self.m.assume_equal(s, e)
            {
                learned = true;
            }
        }
        learned
    }

    /// Merges `inferred` into the type of `v` and records conflicts as warnings.
    fn write(&mut self, v: Value, inferred: Type) {
        let Some(data) = self.m.values.get(v) else {
            return;
        };
        if data.ty.index() >= self.m.types.len() {
            return;
        }
        let old = self.m.types[data.ty].clone();
        let (old_c, inferred) = if self.equalities {
            (self.m.canon_type(&old), self.m.canon_type(&inferred))
        } else {
            (old.clone(), inferred)
        };
        if self.learn_equalities(&old_c, &inferred) {
            self.learned = true;
            self.equalities = true;
        }
        let (mut merged, conflicts) = merge(&old_c, &inferred, self.m);
        let fix = self.mode == Conflicts::Correct && !conflicts.is_empty();
        if fix {
            merged = merge(&inferred, &old_c, self.m).0;
        }
        let merged = if self.equalities {
            self.m.canon_type(&merged)
        } else {
            merged
        };
        let outcome = match self.mode {
            Conflicts::Correct => "; the model's declaration is wrong; using the computed type",
            Conflicts::Keep => "; keeping the declared type",
            Conflicts::Report => "",
        };
        for c in conflicts {
            self.errors.push(IrError::warning(
                Entity::Value(v),
                format!("value {}: declared {c}{outcome}", value_label(self.m, v)),
            ));
        }
        if merged != old {
            self.m.set_type(v, merged);
        }
    }
}

/// Merges a declared type with an inferred one: the declared type wins where it says something,
/// the inferred one fills the gaps. Returns the merged type and descriptions of conflicts.
pub(crate) fn merge(old: &Type, new: &Type, m: &Module) -> (Type, Vec<String>) {
    let name = |s: crate::Sym| {
        m.symbols
            .get(s)
            .map_or_else(|| format!("{s:?}"), |d| d.name.clone())
    };
    match (old, new) {
        (Type::Unknown, _) => (new.clone(), Vec::new()),
        (_, Type::Unknown) => (old.clone(), Vec::new()),
        (Type::Tensor(a), Type::Tensor(b)) => {
            let mut conflicts = Vec::new();
            let dtype = match (a.dtype, b.dtype) {
                (Some(x), Some(y)) if x != y => {
                    conflicts.push(format!("element type {x} but inferred {y}"));
                    Some(x)
                }
                (x, y) => x.or(y),
            };
            let shape = match (&a.shape, &b.shape) {
                (Some(x), Some(y)) if x.len() != y.len() => {
                    conflicts.push(format!("rank {} but inferred rank {}", x.len(), y.len()));
                    Some(x.clone())
                }
                (Some(x), Some(y)) => Some(
                    x.iter()
                        .zip(y)
                        .enumerate()
                        .map(|(i, (dx, dy))| match (dx, dy) {
                            (Dim::Unknown, _) => dy.clone(),
                            (_, Dim::Unknown) => dx.clone(),
                            _ => {
                                if let (Some(p), Some(q)) = (dx.as_known(), dy.as_known())
                                    && p != q
                                {
                                    conflicts.push(format!(
                                        "dim {i} as {} but inferred {}",
                                        dx.render(&name),
                                        dy.render(&name)
                                    ));
                                }
                                dx.clone()
                            }
                        })
                        .collect(),
                ),
                (x, y) => x.clone().or_else(|| y.clone()),
            };
            (Type::Tensor(TensorType { dtype, shape }), conflicts)
        }
        (Type::Optional(a), Type::Optional(b)) => {
            let (t, c) = merge(a, b, m);
            (Type::Optional(Box::new(t)), c)
        }
        (Type::Sequence(a), Type::Sequence(b)) => {
            let (t, c) = merge(a, b, m);
            (Type::Sequence(Box::new(t)), c)
        }
        _ => (old.clone(), Vec::new()),
    }
}

/// `ty` without axis `axis`, and the removed dim.
fn remove_axis(ty: &Type, axis: i64) -> (Type, Dim) {
    match ty.as_tensor() {
        Some(t) => match &t.shape {
            Some(s) => match ops::norm_axis(axis, s.len()) {
                Some(a) => {
                    let mut s = s.clone();
                    let d = s.remove(a);
                    let t = TensorType {
                        dtype: t.dtype,
                        shape: Some(s),
                    };
                    (Type::Tensor(t), d)
                }
                None => (Type::Unknown, Dim::Unknown),
            },
            None => (ty.clone(), Dim::Unknown),
        },
        None => (Type::Unknown, Dim::Unknown),
    }
}
