//! Cost models, one per target: the own cost of an e-node (its children are costed by the
//! extractor).

use egg::Id;

use super::convert::EG;
use super::lang::TNode;
use crate::targets::TargetRef;

/// The own cost of one e-node in class `class`.
pub(crate) trait CostModel {
    fn cost(&self, eg: &EG, class: Id, node: &TNode) -> f64;
}

/// Relative op costs for a target ([`crate::targets::Target::op_cost`]): fused ops cost less
/// than the ops they replace; ops the target cannot run cost infinity; computations over
/// constants cost almost nothing (const-fold evaluates them after extraction).
pub(crate) struct TargetCost(pub TargetRef);

impl CostModel for TargetCost {
    fn cost(&self, eg: &EG, _class: Id, node: &TNode) -> f64 {
        let TNode::Op { kind, args, .. } = node else {
            return 0.0;
        };
        let operands = &args[..args.len().saturating_sub(1)];
        let op = kind.name();
        // Ops of other domains are the target's fused ops (or ones it cannot run): priced as
        // the target says even on constants, which const-fold cannot evaluate.
        if op.is_standard()
            && !operands.is_empty()
            && operands.iter().all(|&a| eg[a].data.konst.is_const())
        {
            return 0.01;
        }
        self.0.op_cost(op)
    }
}
