//! Where quantization pays: the e-graph and the target's cost model decide which quantized units
//! stay integer.
//!
//! The INT8 pass builds every eligible unit (a `MatMul` fed by `DQ(Q(x))` and `DQ(W_q)`, a `Conv`
//! unit ONNX Runtime fuses into `QLinearConv`, a dynamic `MatMulInteger` chain). A unit is not
//! always faster than the float op it replaces: quantizing the activation is a pass over it, the
//! integer kernel's gain grows with the product's size, and a `QLinearConv` result read by a float
//! op is dequantized by a separate kernel. So each unit's result class in the graph's e-graph also
//! receives the float node it came from (same operands before quantization, the original float
//! weight), and the target's placement cost ([`PlaceCost`]) extracts the cheaper form per unit,
//! with the DAG-aware extractor: a `QuantizeLinear` shared by the Q, K and V projections of one
//! norm output is paid once, and kept only if the three integer products together repay it.
//!
//! The cost model estimates run time in microseconds on ONNX Runtime's CPU provider: a fixed
//! dispatch cost per kernel plus a per-element or per-multiply-accumulate rate (integer products
//! about three times the float rate, and four times less weight memory to stream), activation
//! quantization and standalone dequantization at two elements per nanosecond, and DQ
//! nodes absorbed into the integer kernel that reads them costing nothing. Dimensions that are
//! not known at compile time take the sizes the calibration samples gave the quantized
//! activations and Conv results; unobserved ones count as [`SYMBOLIC_DIM`] (one token, one
//! image: the decision then rests on the weight's size, which is what makes a product worth
//! quantizing on a CPU). Other targets get their own rates here.

use std::collections::HashMap;

use egg::Id;
use mmq_ir::{GraphId, Module, Op, OpKind, Value};

use crate::egraph::convert::{self, EG};
use crate::egraph::cost::CostModel;
use crate::egraph::extract;
use crate::egraph::facts::Facts;
use crate::egraph::lang::{TNode, kind_of};
use crate::targets::{PlaceRates, TargetRef};

/// The size assumed for a dimension that is not known at compile time.
pub const SYMBOLIC_DIM: f64 = 1.0;

/// How the INT8 pass places its units.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Placement {
    /// The target's cost model keeps a unit integer only where it is estimated faster.
    #[default]
    Cost,
    /// Every eligible node is quantized (smallest weights, whatever the speed).
    All,
}

/// One quantized unit: the value that replaced the float result, and the float node it came
/// from.
#[derive(Clone, Debug)]
pub(crate) struct Unit {
    /// The unit's float result (read by the unit's consumers).
    pub out: Value,
    /// The float op (attributes included).
    pub op: Op,
    /// Its operands before quantization (the float weight included).
    pub inputs: Vec<Option<Value>>,
}

/// What placement decided for a graph.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Decision {
    /// Units kept integer.
    pub integer: usize,
    /// Units returned to float.
    pub float: usize,
    /// Estimated cost of the graph as extracted.
    pub cost: f64,
}

/// Gives each unit's result class its float alternative, extracts the cheaper graph for
/// `target` and writes it back into `graph`. `sizes` holds element counts observed on the
/// calibration samples (they replace [`SYMBOLIC_DIM`] guesses where a dim is symbolic).
pub(crate) fn place(
    m: &mut Module,
    graph: GraphId,
    units: &[Unit],
    target: TargetRef,
    sizes: &HashMap<Value, usize>,
) -> Decision {
    if units.is_empty() {
        return Decision::default();
    }
    let mut built = convert::build(m, graph, Facts::new(target));
    let class_of: HashMap<Value, Id> = built.defined.iter().copied().collect();
    let mut alternatives = Vec::new();
    for u in units {
        let Some(&out) = class_of.get(&u.out) else {
            continue;
        };
        let eg = &mut built.egraph;
        let mut args = Vec::with_capacity(u.inputs.len() + 1);
        for i in &u.inputs {
            args.push(match i {
                None => eg.add(TNode::None),
                Some(v) => match class_of.get(v) {
                    Some(&id) => id,
                    None => {
                        eg.analysis.describe_value(m, *v);
                        eg.add(TNode::Value(v.index() as u32))
                    }
                },
            });
        }
        let k = eg.analysis.intern_op(u.op.clone());
        args.push(eg.add(TNode::Attrs(k)));
        let float = eg.add(TNode::Op {
            kind: kind_of(&u.op),
            outs: 1,
            args,
        });
        eg.union(out, float);
        alternatives.push(out);
    }
    built.egraph.rebuild();
    let eg = &built.egraph;
    let mut observed: HashMap<Id, f64> = HashMap::new();
    for (&v, &n) in sizes {
        let id = class_of
            .get(&v)
            .copied()
            .or_else(|| eg.lookup(TNode::Value(v.index() as u32)));
        if let Some(id) = id {
            observed.insert(eg.find(id), n as f64);
        }
    }
    // Q and DQ keep their operand's element count.
    for _ in 0..3 {
        for c in eg.classes() {
            if observed.contains_key(&c.id) {
                continue;
            }
            let n = c.nodes.iter().find_map(|n| match n {
                TNode::Op { kind, args, .. }
                    if matches!(
                        kind.kind(),
                        OpKind::QuantizeLinear | OpKind::DequantizeLinear
                    ) =>
                {
                    observed.get(&eg.find(args[0])).copied()
                }
                _ => None,
            });
            if let Some(n) = n {
                observed.insert(c.id, n);
            }
        }
    }
    let cost = PlaceCost { target, observed };
    let choice = extract::extract(&built.egraph, built.root, &cost);
    let eg = &built.egraph;
    let mut d = Decision::default();
    for out in alternatives {
        if choice
            .get(&eg.find(out))
            .is_some_and(|n| is_float_alternative(eg, n))
        {
            d.float += 1;
        } else {
            d.integer += 1;
        }
    }
    d.cost = choice
        .iter()
        .map(|(&c, n)| cost.cost(&built.egraph, c, n))
        .sum();
    convert::write_back(m, graph, &built, &choice);
    d
}

/// A chosen node is the float alternative when no operand class holds a quantization op.
fn is_float_alternative(eg: &EG, n: &TNode) -> bool {
    let TNode::Op { kind, args, .. } = n else {
        return false;
    };
    matches!(kind.kind(), OpKind::MatMul | OpKind::Gemm | OpKind::Conv)
        && !args[..args.len().saturating_sub(1)]
            .iter()
            .any(|&a| holds(eg, a, OpKind::DequantizeLinear))
}

/// Whether class `id` holds an e-node of op type `kind`.
fn holds(eg: &EG, id: Id, kind: OpKind) -> bool {
    eg[id]
        .nodes
        .iter()
        .any(|n| matches!(n, TNode::Op { kind: k, .. } if k.is(kind)))
}

/// Whether class `id` holds an e-node of op type `kind` one of whose operand classes holds
/// `inner`.
fn holds_over(eg: &EG, id: Id, kind: OpKind, inner: OpKind) -> bool {
    eg[id].nodes.iter().any(|n| match n {
        TNode::Op { kind: k, args, .. } if k.is(kind) => {
            args[..args.len() - 1].iter().any(|&a| holds(eg, a, inner))
        }
        _ => false,
    })
}

/// Elements of class `id`'s value ([`SYMBOLIC_DIM`] per unknown dimension), if its shape is
/// known.
fn static_elements(eg: &EG, id: Id) -> Option<f64> {
    type_elements(eg[id].data.ty.as_ref()?)
}

/// Elements of a value of type `ty` ([`SYMBOLIC_DIM`] per unknown dimension), if its shape is
/// known.
pub(crate) fn type_elements(ty: &mmq_ir::Type) -> Option<f64> {
    Some(
        ty.shape()?
            .iter()
            .map(|d| d.as_known().map_or(SYMBOLIC_DIM, |k| k.max(0) as f64))
            .product(),
    )
}

/// The placement cost: estimated microseconds on the target for the quantization-related ops
/// (products, Q, DQ); one unit for any other op (the same in both forms of a unit, whatever the
/// target can run: the graph may already hold the target's fused ops).
pub(crate) struct PlaceCost {
    target: TargetRef,
    /// Element counts seen on the calibration samples, by class.
    observed: HashMap<Id, f64>,
}

impl PlaceCost {
    /// Elements of class `id`: as observed on the calibration samples, else from its type.
    fn elements(&self, eg: &EG, id: Id) -> Option<f64> {
        let id = eg.find(id);
        self.observed
            .get(&id)
            .copied()
            .or_else(|| static_elements(eg, id))
    }

    fn rates(&self) -> &'static PlaceRates {
        self.target.place_rates()
    }

    /// Multiply-accumulates of a product whose result is `class`.
    fn macs(&self, eg: &EG, class: Id, kind: OpKind, operands: &[Id]) -> f64 {
        let last = |id: Id| -> Option<f64> {
            Some(eg[id].data.ty.as_ref()?.shape()?.last()?.as_known()? as f64)
        };
        match kind {
            // A's elements times N (the weight's last dimension), else out × K.
            OpKind::MatMul | OpKind::MatMulInteger | OpKind::Gemm => {
                let a = operands.first().copied();
                let w = operands.get(1).copied();
                let observed = a.and_then(|a| self.observed.get(&eg.find(a)).copied());
                match (observed, w.and_then(last)) {
                    (Some(a), Some(n)) if kind != OpKind::Gemm => a * n,
                    _ => {
                        let out = self.elements(eg, class).unwrap_or(SYMBOLIC_DIM);
                        out * a.and_then(last).unwrap_or(SYMBOLIC_DIM)
                    }
                }
            }
            // Output elements times Cin/group · kernel (the weight's elements per output channel).
            _ => {
                let out = self.elements(eg, class).unwrap_or(SYMBOLIC_DIM);
                let depth = operands
                    .get(1)
                    .and_then(|&w| {
                        let s = eg[w].data.ty.as_ref()?.shape()?;
                        let cout = s.first()?.as_known()? as f64;
                        Some(static_elements(eg, w)? / cout.max(1.0))
                    })
                    .unwrap_or(SYMBOLIC_DIM);
                out * depth
            }
        }
    }
}

impl CostModel for PlaceCost {
    fn cost(&self, eg: &EG, class: Id, node: &TNode) -> f64 {
        let TNode::Op { kind, args, .. } = node else {
            return 0.0;
        };
        let operands = &args[..args.len().saturating_sub(1)];
        let r = self.rates();
        let kind = kind.kind();
        let on_consts =
            !operands.is_empty() && operands.iter().all(|&a| eg[a].data.konst.is_const());
        if on_consts {
            return 0.01;
        }
        let dq = |i: usize| {
            operands
                .get(i)
                .is_some_and(|&a| holds(eg, a, OpKind::DequantizeLinear))
        };
        match kind {
            OpKind::MatMul | OpKind::Gemm | OpKind::Conv => {
                let macs = self.macs(eg, class, kind, operands);
                if dq(0) && dq(1) {
                    r.int_kernel + macs * r.int_mac
                } else {
                    r.kernel + macs * r.float_mac
                }
            }
            OpKind::MatMulInteger => r.int_kernel + self.macs(eg, class, kind, operands) * r.int_mac,
            OpKind::QuantizeLinear | OpKind::DynamicQuantizeLinear => {
                let x = operands[0];
                if holds(eg, x, OpKind::Conv) {
                    // The requantization inside QLinearConv.
                    r.absorbed
                } else {
                    let scan = if kind == OpKind::DynamicQuantizeLinear {
                        2.0
                    } else {
                        1.0
                    };
                    r.q_kernel + scan * self.elements(eg, x).unwrap_or(SYMBOLIC_DIM) * r.element
                }
            }
            OpKind::DequantizeLinear => {
                if holds_over(eg, operands[0], OpKind::QuantizeLinear, OpKind::Conv) {
                    // QLinearConv's integer result read by a float op.
                    r.q_kernel + self.elements(eg, class).unwrap_or(SYMBOLIC_DIM) * r.element
                } else {
                    r.absorbed
                }
            }
            // The conversion and rescale that DynamicQuantizeMatMul absorbs.
            OpKind::Cast if holds(eg, operands[0], OpKind::MatMulInteger) => r.absorbed,
            OpKind::Mul
                if operands.iter().any(|&a| {
                    holds_over(eg, a, OpKind::Cast, OpKind::MatMulInteger)
                        || eg[a].nodes.iter().any(|n| {
                            matches!(n, TNode::Get(_, [t]) if holds(eg, *t, OpKind::DynamicQuantizeLinear))
                        })
                }) =>
            {
                r.absorbed
            }
            _ => 1.0,
        }
    }
}
