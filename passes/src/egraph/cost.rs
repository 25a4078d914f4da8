//! Cost models, one per target: the own cost of an e-node (its children are costed by the
//! extractor).

use egg::Id;

use super::convert::EG;
use super::lang::TNode;
use crate::pass::Target;

/// The own cost of one e-node in class `class`.
pub(crate) trait CostModel {
    fn cost(&self, eg: &EG, class: Id, node: &TNode) -> f64;
}

/// Relative op costs for a target. Fused ops cost less than the ops they replace; ops the
/// target cannot run cost infinity; computations over constants cost almost nothing (const-fold
/// evaluates them after extraction).
pub(crate) struct TargetCost(pub Target);

impl CostModel for TargetCost {
    fn cost(&self, eg: &EG, _class: Id, node: &TNode) -> f64 {
        let TNode::Op { kind, args, .. } = node else {
            return 0.0;
        };
        let kind = kind.as_str();
        let operands = &args[..args.len().saturating_sub(1)];
        if let Some(contrib) = kind.strip_prefix("com.microsoft.") {
            return match self.0 {
                Target::Ort => contrib_cost(contrib),
                Target::Generic => f64::INFINITY,
            };
        }
        if !operands.is_empty() && operands.iter().all(|&a| eg[a].data.konst.is_const()) {
            return 0.01;
        }
        standard_cost(kind)
    }
}

fn contrib_cost(op: &str) -> f64 {
    match op {
        "FusedConv" | "FusedMatMul" | "FusedGemm" => 20.0,
        // Measured slower than the `Add` (+ bias `Add`) and norm they replace on ONNX Runtime's
        // CPU provider when the sum feeds the next block, as in every residual stream (which
        // ONNX Runtime's own fusion leaves alone): SkipLayerNormalization 1.06x at 17 x 32,
        // 5x at 197 x 768, 4.5x at 512 x 4096; SkipSimplifiedLayerNormalization 0.95x to 1.56x
        // (`tools/norm_rates.py`). Costed above `Add + Add + norm` so extraction keeps those.
        "SkipLayerNormalization" | "SkipSimplifiedLayerNormalization" => 14.0,
        "SimplifiedLayerNormalization" => 5.0,
        "Gelu" | "FastGelu" | "BiasGelu" | "QuickGelu" => 4.0,
        "RotaryEmbedding" => 4.0,
        "MultiHeadAttention" | "GroupQueryAttention" => 20.0, // two products and a softmax, costed as one product
        "Attention" => 36.0,
        _ => 10.0,
    }
}

fn standard_cost(op: &str) -> f64 {
    match op {
        "Identity" | "Dropout" => 0.5,
        "Reshape" | "Squeeze" | "Unsqueeze" | "Flatten" | "Shape" | "Size" => 0.5,
        "Cast" | "Expand" | "Concat" | "Slice" | "Gather" | "Split" => 2.0,
        "Transpose" => 3.0,
        "MatMul" | "Conv" | "ConvTranspose" | "ConvInteger" | "MatMulInteger" => 20.0,
        "Gemm" => 20.5,
        "QLinearConv" | "QLinearMatMul" => 18.0,
        "LayerNormalization" | "RMSNormalization" => 5.0,
        "Gelu" => 4.0,
        "Attention" => 30.0,
        _ => 4.0,
    }
}
