//! TensorRT, through its ONNX parser with explicit quantization (strongly typed networks): the
//! standard ops the parser supports, Q/DQ by TensorRT's rules (symmetric, per-channel only on
//! weights), every weighted op quantized (TensorRT fuses Conv+BN+ReLU and the next layer's input
//! quantization itself, so there is no placement trade-off to make).

pub mod legalize;
pub mod lower;

use mmq_ir::Op;

use super::{PlaceRates, QdqRules, Target, standard_cost};
use crate::quant::fp16::Fp16Form;

/// The TensorRT target.
#[derive(Clone, Copy, Debug)]
pub struct Trt;

/// The ops TensorRT's ONNX parser supports (its operator support matrix, TensorRT 10: opsets 9
/// to 20). Restrictions that depend on operands (`axes` as initializers, zero points of 0, 2D/3D
/// pooling) are checked on the emitted model by `mmq_backend_trt::lint`.
pub const PARSER_OPS: &[&str] = &[
    "Abs",
    "Acos",
    "Acosh",
    "Add",
    "And",
    "ArgMax",
    "ArgMin",
    "Asin",
    "Asinh",
    "Atan",
    "Atanh",
    "AveragePool",
    "BatchNormalization",
    "Cast",
    "CastLike",
    "Ceil",
    "Celu",
    "Clip",
    "Concat",
    "Constant",
    "ConstantOfShape",
    "Conv",
    "ConvTranspose",
    "Cos",
    "Cosh",
    "CumSum",
    "DeformConv",
    "DepthToSpace",
    "DequantizeLinear",
    "Div",
    "Dropout",
    "Einsum",
    "Elu",
    "Equal",
    "Erf",
    "Exp",
    "Expand",
    "EyeLike",
    "Flatten",
    "Floor",
    "Gather",
    "GatherElements",
    "GatherND",
    "Gelu",
    "Gemm",
    "GlobalAveragePool",
    "GlobalLpPool",
    "GlobalMaxPool",
    "Greater",
    "GreaterOrEqual",
    "GridSample",
    "GroupNormalization",
    "GRU",
    "HardSigmoid",
    "HardSwish",
    "Hardmax",
    "Identity",
    "If",
    "ImageScaler",
    "InstanceNormalization",
    "IsInf",
    "IsNaN",
    "LayerNormalization",
    "LeakyRelu",
    "Less",
    "LessOrEqual",
    "Log",
    "LogSoftmax",
    "Loop",
    "LRN",
    "LSTM",
    "LpNormalization",
    "LpPool",
    "MatMul",
    "Max",
    "MaxPool",
    "Mean",
    "MeanVarianceNormalization",
    "Min",
    "Mish",
    "Mod",
    "Mul",
    "Neg",
    "NonMaxSuppression",
    "NonZero",
    "Not",
    "OneHot",
    "Or",
    "Pad",
    "ParametricSoftplus",
    "Pow",
    "PRelu",
    "QuantizeLinear",
    "RandomNormal",
    "RandomNormalLike",
    "RandomUniform",
    "RandomUniformLike",
    "Range",
    "Reciprocal",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSum",
    "ReduceSumSquare",
    "Relu",
    "Reshape",
    "Resize",
    "ReverseSequence",
    "RNN",
    "RoiAlign",
    "Round",
    "ScaledTanh",
    "Scan",
    "Scatter",
    "ScatterElements",
    "ScatterND",
    "Selu",
    "Shape",
    "Shrink",
    "Sigmoid",
    "Sign",
    "Sin",
    "Sinh",
    "Size",
    "Slice",
    "Softmax",
    "Softplus",
    "Softsign",
    "SpaceToDepth",
    "Split",
    "Sqrt",
    "Squeeze",
    "Sub",
    "Sum",
    "Tan",
    "Tanh",
    "ThresholdedRelu",
    "Tile",
    "TopK",
    "Transpose",
    "Trilu",
    "Unsqueeze",
    "Upsample",
    "Where",
    "Xor",
];

/// Whether the parser supports the default-domain op `op_type`.
pub fn parser_supports(op_type: &str) -> bool {
    PARSER_OPS.contains(&op_type)
}

/// The cost of a default-domain op the parser does not support (see [`Trt::op_cost`]).
pub const UNSUPPORTED_COST: f64 = 1.0e6;

/// TensorRT's integer kernels absorb the Q/DQ around them and run products several times faster
/// than float; the rates only need to make every eligible unit integer.
pub const RATES: PlaceRates = PlaceRates {
    kernel: 1.0,
    int_kernel: 1.0,
    q_kernel: 1.0,
    float_mac: 1.0 / 10_000.0,
    int_mac: 1.0 / 40_000.0,
    element: 1.0 / 1_000_000.0,
    absorbed: 0.0,
};

/// TensorRT's explicit-quantization rules.
pub const QDQ: QdqRules = QdqRules {
    symmetric_activations: true,
    reduce_range: false,
    int32_conv_bias: false,
    quantize_all: true,
    dynamic_activations: false,
    int4_matmul_nbits: false,
    cache_io: false,
    plugins: true,
};

impl Target for Trt {
    fn name(&self) -> &'static str {
        "trt"
    }

    fn runs_domain(&self, domain: &str) -> bool {
        domain.is_empty() || domain == "ai.onnx"
    }

    /// Parser ops: the standard table. A default-domain op the parser lacks (`Attention` or
    /// `RMSNormalization` of opset 23) costs [`UNSUPPORTED_COST`]: extraction never picks it over
    /// a supported form, yet keeps it where the source has no other (the linter reports it). Other
    /// domains cannot run at all.
    fn op_cost(&self, kind: &str) -> f64 {
        if parser_supports(kind) {
            standard_cost(kind)
        } else if kind.contains('.') {
            f64::INFINITY
        } else {
            UNSUPPORTED_COST
        }
    }

    /// ONNX `Gelu` (opset 20, which the parser reads).
    fn gelu(&self, approximate: bool, opset: i64) -> Option<Op> {
        (opset >= 20).then(|| Op::Gelu {
            approximate: approximate.then(|| "tanh".into()),
        })
    }

    /// None: `RMSNormalization` (opset 23) is past the parser's opsets; TensorRT fuses the
    /// decomposed form itself.
    fn rms_norm(&self, _epsilon: f32, _opset: i64) -> Option<Op> {
        None
    }

    fn place_rates(&self) -> &'static PlaceRates {
        &RATES
    }

    fn qdq_rules(&self) -> &'static QdqRules {
        &QDQ
    }

    fn fp16_form(&self) -> Fp16Form {
        Fp16Form::WeightStorage
    }

    fn legalize(&self) -> Option<Box<dyn crate::pass::Pass>> {
        let ops = ["Attention", "RMSNormalization", "RotaryEmbedding"]
            .into_iter()
            .filter(|op| !parser_supports(op))
            .collect();
        Some(Box::new(legalize::Decompose { ops }))
    }

    fn lowering(&self) -> Option<Box<dyn crate::pass::Pass>> {
        Some(Box::new(lower::TrtPlugins))
    }
}
