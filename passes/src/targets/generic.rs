//! The generic target: standard ONNX ops only (what the reference interpreter runs). Fused
//! forms exist where the standard has them: `Gelu` from opset 20, `RMSNormalization` from 23.

use mmq_ir::Op;

use super::{OpName, PlaceRates, QdqRules, Target, standard_cost};
use crate::quant::fp16::Fp16Form;

/// The generic target.
#[derive(Clone, Copy, Debug)]
pub struct Generic;

/// The interpreter runs every form; ONNX Runtime's stand in.
pub const QDQ: QdqRules = super::ort::QDQ;

impl Target for Generic {
    fn name(&self) -> &'static str {
        "generic"
    }

    fn runs_domain(&self, domain: &str) -> bool {
        domain.is_empty() || domain == "ai.onnx"
    }

    fn op_cost(&self, op: OpName<'_>) -> f64 {
        if !op.is_standard() {
            return f64::INFINITY;
        }
        standard_cost(op.kind)
    }

    fn gelu(&self, approximate: bool, opset: i64) -> Option<Op> {
        (opset >= 20).then(|| Op::Gelu {
            approximate: approximate.then(|| "tanh".into()),
        })
    }

    fn rms_norm(&self, epsilon: f32, opset: i64) -> Option<Op> {
        (opset >= 23).then_some(Op::RMSNormalization {
            axis: Some(-1),
            epsilon: Some(epsilon),
            stash_type: Some(1),
        })
    }

    /// No runtime of its own: ONNX Runtime's CPU rates stand in.
    fn place_rates(&self) -> &'static PlaceRates {
        &super::ort::CPU_RATES
    }

    fn qdq_rules(&self) -> &'static QdqRules {
        &QDQ
    }

    fn fp16_form(&self) -> Fp16Form {
        Fp16Form::WeightStorage
    }
}
