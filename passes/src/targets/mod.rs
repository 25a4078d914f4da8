//! Targets: what differs between the runtimes mmq compiles for, one module per target.
//!
//! A [`Target`] gives the e-graph's cost of each op (ops it cannot run cost infinity), the op
//! domains it runs beside the default one, the forms fused activations and norms take, the
//! rates the INT8 placement cost model uses, and how FP16 is realized. Passes ask the target
//! through these methods and never match on its name.
//!
//! - [`generic`]: standard ONNX ops only; what the reference interpreter runs.
//! - [`ort`]: ONNX Runtime's CPU provider, with the `com.microsoft` contrib ops.
//! - [`trt`]: TensorRT's ONNX parser with explicit (Q/DQ) quantization.

pub mod generic;
pub mod ort;
pub mod trt;

use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;

use mmq_ir::{Op, OpKind};

use crate::quant::fp16::Fp16Form;

/// An op as a target prices it: its kind, with the domain and op type (which only an op the
/// table does not model, [`OpKind::Custom`], needs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpName<'a> {
    /// The kind.
    pub kind: OpKind,
    /// The domain (`""` for the default domain).
    pub domain: &'a str,
    /// The operator type.
    pub op_type: &'a str,
}

impl OpName<'static> {
    /// A modeled op.
    pub fn of(kind: OpKind) -> OpName<'static> {
        OpName {
            kind,
            domain: kind.domain(),
            op_type: kind.op_type(),
        }
    }
}

impl OpName<'_> {
    /// Whether the op is in the default domain.
    pub fn is_standard(&self) -> bool {
        self.domain.is_empty() || self.domain == "ai.onnx"
    }
}

/// What a target decides.
pub trait Target: Send + Sync + std::panic::RefUnwindSafe {
    /// The target's name as the command line spells it.
    fn name(&self) -> &'static str;

    /// Whether the target runs ops of `domain` (the default domain is `""`).
    fn runs_domain(&self, domain: &str) -> bool;

    /// The relative cost of one `op` on non-constant operands; infinity for ops the target
    /// cannot run. Fused ops cost less than the ops they replace where the target runs them
    /// faster.
    fn op_cost(&self, op: OpName<'_>) -> f64;

    /// The fused GELU: exact (`approximate = false`) or tanh, for a graph at default-domain
    /// opset `opset`; `None` when the target has none.
    fn gelu(&self, approximate: bool, opset: i64) -> Option<Op>;

    /// The fused RMS normalization over the last axis with `epsilon`; `None` when the target
    /// has none at `opset`.
    fn rms_norm(&self, epsilon: f32, opset: i64) -> Option<Op>;

    /// Rates of the INT8 placement cost model (see [`crate::quant::place`]).
    fn place_rates(&self) -> &'static PlaceRates;

    /// How quantized units must look on this target.
    fn qdq_rules(&self) -> &'static QdqRules;

    /// How FP16 is realized.
    fn fp16_form(&self) -> Fp16Form;

    /// The `accuracy_level` of the INT4 `MatMulNBits` it runs (the compute type of the
    /// activations: 4 is int8), or `None` to leave the attribute out.
    fn int4_accuracy_level(&self) -> Option<i64> {
        None
    }

    /// Rates of INT4 placement (`--quant int4 --placement cost`): what a float product and its
    /// INT4 weight-only form cost; `None` where every eligible product is quantized.
    fn int4_rates(&self) -> Option<&'static Int4Rates> {
        None
    }

    /// The pass that runs last at `-O2` (before [`Target::lowering`]): op forms chosen for what
    /// the runtime itself does when it loads the model; `None` when nothing needs it.
    fn load_forms(&self) -> Option<Box<dyn crate::pass::Pass>> {
        None
    }

    /// The pass that runs at the end of `-O2` (before [`Target::load_forms`]): op forms for the
    /// graphs that run a token a step (decoders reading a KV cache), where what an op costs at
    /// one row decides rather than the per-kind cost; `None` when nothing differs.
    fn decode_forms(&self) -> Option<Box<dyn crate::pass::Pass>> {
        None
    }

    /// The pass that runs first, writing ops the target lacks (opset-23 `Attention`,
    /// `RMSNormalization`, `RotaryEmbedding`) in ops it runs; `None` when it runs them all.
    fn legalize(&self) -> Option<Box<dyn crate::pass::Pass>> {
        None
    }

    /// The pass that runs last, turning what the target cannot run natively into its plugins;
    /// `None` when the target has none.
    fn lowering(&self) -> Option<Box<dyn crate::pass::Pass>> {
        None
    }
}

/// What a product `[rows, k] x [k, n]` costs as a float `MatMul` and as the target's INT4
/// weight-only form, in microseconds: a dispatch cost, a cost per weight (streaming it from
/// memory: what dominates one-row products) and one per multiply-accumulate (what dominates
/// many rows). Fitted by `tools/place_rates.py` on relative error.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Int4Rates {
    /// Dispatch cost of the float product.
    pub float_kernel: f64,
    /// One float32 weight read.
    pub float_weight: f64,
    /// One float multiply-accumulate.
    pub float_mac: f64,
    /// Dispatch cost of the INT4 product.
    pub nbits_kernel: f64,
    /// One INT4 weight read (with its share of the block's scale).
    pub nbits_weight: f64,
    /// One INT4 multiply-accumulate (activation quantization included).
    pub nbits_mac: f64,
}

impl Int4Rates {
    /// The float product's estimated time.
    pub fn float(&self, rows: f64, k: f64, n: f64) -> f64 {
        self.float_kernel + k * n * (self.float_weight + rows * self.float_mac)
    }

    /// The INT4 product's estimated time.
    pub fn nbits(&self, rows: f64, k: f64, n: f64) -> f64 {
        self.nbits_kernel + k * n * (self.nbits_weight + rows * self.nbits_mac)
    }
}

/// Rates of the INT8 placement cost model on one target, in microseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlaceRates {
    /// Dispatch cost of one float kernel.
    pub kernel: f64,
    /// Dispatch cost of one integer product (it also converts its result to float).
    pub int_kernel: f64,
    /// Dispatch cost of a standalone quantization or dequantization.
    pub q_kernel: f64,
    /// One float multiply-accumulate.
    pub float_mac: f64,
    /// One 8-bit multiply-accumulate.
    pub int_mac: f64,
    /// Quantizing or dequantizing one element in a standalone kernel.
    pub element: f64,
    /// A Q/DQ absorbed into the integer kernel next to it.
    pub absorbed: f64,
}

/// The forms quantization may take on a target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QdqRules {
    /// Activations are quantized symmetric (i8, zero point 0) only.
    pub symmetric_activations: bool,
    /// INT8 weights in 7 bits by default (see `Int8Pass::reduce_range`).
    pub reduce_range: bool,
    /// A quantized `Conv`'s bias becomes an int32 `DequantizeLinear` (`QLinearConv`'s form);
    /// otherwise it stays float.
    pub int32_conv_bias: bool,
    /// Every eligible node is quantized (the runtime fuses Q/DQ itself), instead of the placement
    /// cost model's choice.
    pub quantize_all: bool,
    /// Activations may be quantized at run time (`DynamicQuantizeLinear`).
    pub dynamic_activations: bool,
    /// INT4 weights as `com.microsoft.MatMulNBits`.
    pub int4_matmul_nbits: bool,
    /// Quantized caches cross the graph interface as codes and scales, quantized and
    /// dequantized by standard ops in the graph; `false` where the target has no such form
    /// (TensorRT writes INT8 KV blocks through its plugins instead).
    pub cache_io: bool,
    /// Forms the target's own ops lack (zero points, INT4 with zero points) are emitted in
    /// ONNX Runtime's form and lowered into the target's plugins ([`Target::lowering`]).
    pub plugins: bool,
}

/// The relative cost of a standard ONNX op, shared by the targets that have no measured table
/// of their own.
pub fn standard_cost(op: OpKind) -> f64 {
    use OpKind as K;
    match op {
        K::Identity | K::Dropout => 0.5,
        K::Reshape | K::Squeeze | K::Unsqueeze | K::Flatten | K::Shape | K::Size => 0.5,
        K::Cast | K::Expand | K::Concat | K::Slice | K::Gather | K::Split => 2.0,
        K::Transpose => 3.0,
        K::MatMul | K::Conv | K::ConvTranspose | K::ConvInteger | K::MatMulInteger => 20.0,
        K::Gemm => 20.5,
        K::QLinearConv | K::QLinearMatMul => 18.0,
        K::LayerNormalization | K::RMSNormalization => 5.0,
        K::Gelu => 4.0,
        K::Attention => 30.0,
        _ => 4.0,
    }
}

/// A target, as passes hold it: a copyable reference to one of the static targets, equal by
/// name.
#[derive(Clone, Copy)]
pub struct TargetRef(&'static dyn Target);

impl TargetRef {
    /// ONNX Runtime (CPU).
    pub const ORT: TargetRef = TargetRef(&ort::Ort);
    /// Standard ONNX ops only.
    pub const GENERIC: TargetRef = TargetRef(&generic::Generic);
    /// TensorRT.
    pub const TRT: TargetRef = TargetRef(&trt::Trt);
    /// Every target.
    pub const ALL: [TargetRef; 3] = [TargetRef::GENERIC, TargetRef::ORT, TargetRef::TRT];

    /// The target named `name`.
    pub fn by_name(name: &str) -> Option<TargetRef> {
        TargetRef::ALL.into_iter().find(|t| t.name() == name)
    }
}

impl Deref for TargetRef {
    type Target = dyn Target;

    fn deref(&self) -> &(dyn Target + 'static) {
        self.0
    }
}

impl Default for TargetRef {
    fn default() -> Self {
        TargetRef::GENERIC
    }
}

impl PartialEq for TargetRef {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name()
    }
}

impl Eq for TargetRef {}

impl Hash for TargetRef {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.name().hash(state);
    }
}

impl fmt::Debug for TargetRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Target({})", self.name())
    }
}

impl fmt::Display for TargetRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_found_by_name_and_compare_by_name() {
        assert_eq!(TargetRef::by_name("ort"), Some(TargetRef::ORT));
        assert_eq!(TargetRef::by_name("generic"), Some(TargetRef::GENERIC));
        assert_eq!(TargetRef::by_name("trt"), Some(TargetRef::TRT));
        assert_eq!(TargetRef::by_name("tensorrt"), None);
        assert_ne!(TargetRef::ORT, TargetRef::GENERIC);
        assert_eq!(TargetRef::default(), TargetRef::GENERIC);
    }

    /// The op a pattern spells `text` (`op_type`, or `domain.op_type`).
    fn name(text: &str) -> OpName<'_> {
        let (domain, op_type) = text.rsplit_once('.').unwrap_or(("", text));
        OpName {
            kind: OpKind::of(domain, op_type),
            domain,
            op_type,
        }
    }

    #[test]
    fn contrib_ops_run_on_ort_only() {
        let ort = TargetRef::ORT;
        let generic = TargetRef::GENERIC;
        assert!(ort.runs_domain("com.microsoft") && !generic.runs_domain("com.microsoft"));
        assert!(ort.op_cost(name("com.microsoft.FusedConv")) < ort.op_cost(name("Conv")) + 1.0);
        assert!(
            generic
                .op_cost(name("com.microsoft.FusedConv"))
                .is_infinite()
        );
        assert_eq!(ort.op_cost(name("MatMul")), generic.op_cost(name("MatMul")));
        // ORT's fused GELU is the contrib op at any opset; generic needs opset 20.
        assert_eq!(ort.gelu(false, 17), Some(Op::MsGelu {}));
        assert!(generic.gelu(false, 17).is_none());
        assert!(matches!(generic.gelu(true, 20), Some(Op::Gelu { .. })));
        assert!(generic.rms_norm(1e-6, 22).is_none());
        assert!(matches!(
            generic.rms_norm(1e-6, 23),
            Some(Op::RMSNormalization { .. })
        ));
    }

    #[test]
    fn trt_runs_parser_ops_only_and_quantizes_by_its_rules() {
        let trt = TargetRef::TRT;
        assert!(!trt.runs_domain("com.microsoft"));
        assert!(trt.op_cost(name("com.microsoft.FusedConv")).is_infinite());
        // Ops the parser lacks: never chosen over a supported form, kept where the source has
        // no other (an infinite cost would leave extraction without a term).
        assert_eq!(trt.op_cost(name("RMSNormalization")), trt::UNSUPPORTED_COST);
        assert!(trt.op_cost(name("MatMulInteger")) > 1000.0 * trt.op_cost(name("MatMul")));
        assert_eq!(
            trt.op_cost(name("MatMul")),
            TargetRef::GENERIC.op_cost(name("MatMul"))
        );
        assert!(trt.gelu(false, 17).is_none());
        assert!(matches!(trt.gelu(false, 20), Some(Op::Gelu { .. })));
        let rules = trt.qdq_rules();
        assert!(rules.symmetric_activations && rules.quantize_all);
        assert!(!rules.reduce_range && !rules.int32_conv_bias && !rules.int4_matmul_nbits);
        assert!(TargetRef::ORT.qdq_rules().int32_conv_bias);
    }

    /// The skip norms ONNX Runtime runs slower than `Add` + norm are costed above them, so
    /// extraction keeps the unfused form (`tools/norm_rates.py`).
    #[test]
    fn ort_prices_skip_norms_above_add_and_norm() {
        let ort = TargetRef::ORT;
        for (skip, norm) in [
            ("com.microsoft.SkipLayerNormalization", "LayerNormalization"),
            (
                "com.microsoft.SkipSimplifiedLayerNormalization",
                "SimplifiedLayerNormalization",
            ),
        ] {
            let unfused = 2.0 * ort.op_cost(name("Add")) + ort.op_cost(name(norm));
            assert!(ort.op_cost(name(skip)) > unfused, "{skip}");
        }
    }
}
