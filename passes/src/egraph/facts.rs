//! The e-class analysis: types (from the IR's inference), constness and small constant
//! contents, plus the tables the leaves point into (attribute sets, literals).

use std::collections::HashMap;

use bytes::Bytes;
use egg::{Analysis, DidMerge, EGraph, Id};
use mmq_ir::{ConstData, DType, Module, Op, OpKind, Storage, Type, Value};
use mmq_kernels::Tensor;

use super::lang::TNode;
use crate::targets::TargetRef;

/// Constants with at most this many elements have their contents in the analysis.
pub(crate) const SMALL_CONST: usize = 64;

/// Float constants with at most this many elements have their smallest element recorded
/// ([`Facts::mins`]): per-channel parameters, never weight matrices.
pub(crate) const SIGN_CONST: usize = 1 << 16;

/// What is known about the value of an e-class.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) enum Konst {
    /// Depends on graph inputs.
    #[default]
    No,
    /// An absent optional operand.
    Absent,
    /// Computed from constants only (const-fold evaluates it after extraction).
    Expr,
    /// A constant; `vals` holds its elements when it has at most [`SMALL_CONST`].
    Const {
        /// Elements as f64, for small constants.
        vals: Option<Vec<f64>>,
    },
}

impl Konst {
    /// Known at compile time (or absent).
    pub(crate) fn is_const(&self) -> bool {
        !matches!(self, Konst::No)
    }

    fn rank(&self) -> u8 {
        match self {
            Konst::No => 0,
            Konst::Expr => 1,
            Konst::Absent => 2,
            Konst::Const { vals: None } => 3,
            Konst::Const { vals: Some(_) } => 4,
        }
    }
}

/// Per-class data.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Data {
    /// The value's type, when known.
    pub ty: Option<Type>,
    /// Constness.
    pub konst: Konst,
}

/// The analysis and its tables.
#[derive(Debug, Default)]
pub(crate) struct Facts {
    /// The target (rules that emit target-specific ops check it).
    pub target: TargetRef,
    /// Attribute sets ([`TNode::Attrs`] leaves).
    pub ops: Vec<Op>,
    op_index: HashMap<String, u32>,
    /// Literals ([`TNode::Lit`] leaves).
    pub lits: Vec<ConstData>,
    lit_index: HashMap<(DType, Vec<i64>, Bytes), u32>,
    /// Data of [`TNode::Value`] leaves, by value index.
    pub values: HashMap<u32, Data>,
    /// The smallest element of float constants with at most [`SIGN_CONST`] elements, by value
    /// index: what proves a scale positive (BatchNormalization's `gamma` and `var`, a
    /// per-channel divisor) where [`SMALL_CONST`] keeps no contents.
    pub mins: HashMap<u32, f64>,
    /// Default-domain opset of the graph being rewritten.
    pub opset: i64,
    /// The highest default-domain opset the graph may be raised to for a fused form that
    /// exists only from a later version ([`crate::opset::can_raise`]); at least `opset`.
    pub max_opset: i64,
    /// Rule firings (rule, matched class), recorded by every rule's applier.
    pub log: Vec<(egg::Symbol, Id)>,
}

impl Facts {
    /// Empty tables for `target`.
    pub(crate) fn new(target: TargetRef) -> Self {
        Facts {
            target,
            ..Default::default()
        }
    }

    /// Interns an attribute set.
    pub(crate) fn intern_op(&mut self, op: Op) -> u32 {
        let key = format!("{op:?}");
        if let Some(&k) = self.op_index.get(&key) {
            return k;
        }
        let k = self.ops.len() as u32;
        self.ops.push(op);
        self.op_index.insert(key, k);
        k
    }

    /// Interns a literal.
    pub(crate) fn intern_lit(&mut self, c: ConstData) -> u32 {
        let bytes = match &c.storage {
            Storage::Inline(b) => b.clone(),
            _ => Bytes::new(),
        };
        let key = (c.dtype, c.shape.clone(), bytes);
        if let Some(&k) = self.lit_index.get(&key) {
            return k;
        }
        let k = self.lits.len() as u32;
        self.lits.push(c);
        self.lit_index.insert(key, k);
        k
    }

    /// Records the facts of an outside value (its type; constness and small contents for
    /// constants).
    pub(crate) fn describe_value(&mut self, m: &Module, v: Value) {
        let ty = m.value_type(v).clone();
        let konst = match m.values[v].def {
            mmq_ir::ValueDef::Const(c) => {
                let cd = &m.consts[c];
                if cd.dtype.is_float() && cd.num_elements() <= SIGN_CONST {
                    let min = Tensor::from_const(cd)
                        .ok()
                        .and_then(|t| t.to_f64().ok())
                        .and_then(|x| {
                            x.iter()
                                .try_fold(f64::INFINITY, |a, &e| e.is_finite().then(|| a.min(e)))
                        });
                    if let Some(min) = min {
                        self.mins.insert(v.index() as u32, min);
                    }
                }
                Konst::Const {
                    vals: small_values(cd),
                }
            }
            _ => Konst::No,
        };
        self.values.insert(
            v.index() as u32,
            Data {
                ty: Some(ty),
                konst,
            },
        );
    }
}

/// The elements of a constant with at most [`SMALL_CONST`] of them, as f64.
pub(crate) fn small_values(c: &ConstData) -> Option<Vec<f64>> {
    if c.num_elements() > SMALL_CONST || c.dtype == DType::String {
        return None;
    }
    Tensor::from_const(c).ok()?.to_f64().ok()
}

/// A literal constant.
pub(crate) fn literal(dtype: DType, shape: Vec<i64>, vals: &[f64]) -> Option<ConstData> {
    let dims: Vec<usize> = shape.iter().map(|&d| d.max(0) as usize).collect();
    let t = Tensor::from_f64_as(dtype, dims, vals).ok()?;
    let bytes = t.to_bytes()?;
    Some(ConstData::new(
        None,
        dtype,
        shape,
        Storage::Inline(Bytes::from(bytes)),
    ))
}

impl Analysis<TNode> for Facts {
    type Data = Data;

    fn make(egraph: &mut EGraph<TNode, Self>, enode: &TNode, _id: Id) -> Data {
        match enode {
            TNode::Value(v) => egraph.analysis.values.get(v).cloned().unwrap_or_default(),
            TNode::Lit(l) => {
                let c = &egraph.analysis.lits[*l as usize];
                Data {
                    ty: Some(Type::tensor(
                        c.dtype,
                        c.shape.iter().map(|&d| mmq_ir::Dim::known(d)).collect(),
                    )),
                    konst: Konst::Const {
                        vals: small_values(c),
                    },
                }
            }
            TNode::None => Data {
                ty: None,
                konst: Konst::Absent,
            },
            TNode::Op { kind, args, .. } => {
                // The random ops: `Dropout`, and the ones the op table does not model.
                let op = kind.name();
                let random = op.kind == OpKind::Dropout
                    || (op.kind == OpKind::Custom
                        && (op.op_type.starts_with("Random")
                            || matches!(op.op_type, "Bernoulli" | "Multinomial")));
                let operands = &args[..args.len().saturating_sub(1)];
                let all_const =
                    !random && operands.iter().all(|&a| egraph[a].data.konst.is_const());
                Data {
                    ty: None,
                    konst: if all_const { Konst::Expr } else { Konst::No },
                }
            }
            TNode::Get(_, [t]) => Data {
                ty: None,
                konst: if egraph[*t].data.konst.is_const() {
                    Konst::Expr
                } else {
                    Konst::No
                },
            },
            TNode::Attrs(_) | TNode::Root(_) => Data::default(),
        }
    }

    fn merge(&mut self, a: &mut Data, b: Data) -> DidMerge {
        let mut changed_a = false;
        let mut changed_b = false;
        match (&a.ty, b.ty) {
            (None, Some(t)) => {
                a.ty = Some(t);
                changed_a = true;
            }
            (Some(_), None) => changed_b = true,
            _ => {}
        }
        let (ra, rb) = (a.konst.rank(), b.konst.rank());
        if rb > ra {
            a.konst = b.konst;
            changed_a = true;
        } else if ra > rb {
            changed_b = true;
        }
        DidMerge(changed_a, changed_b)
    }
}
