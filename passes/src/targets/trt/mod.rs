//! TensorRT, through its ONNX parser with explicit quantization (strongly typed networks): the
//! standard ops the parser supports, Q/DQ by TensorRT's rules (symmetric, per-channel only on
//! weights), every weighted op quantized (TensorRT fuses Conv+BN+ReLU and the next layer's input
//! quantization itself, so there is no placement trade-off to make).

pub mod legalize;
pub mod lower;

use mmq_ir::{Op, OpKind};

use super::{OpName, PlaceRates, QdqRules, Target, standard_cost};
use crate::quant::fp16::Fp16Form;

/// The TensorRT target.
#[derive(Clone, Copy, Debug)]
pub struct Trt;

/// The ops TensorRT's ONNX parser supports (its operator support matrix, TensorRT 10: opsets 9
/// to 20). Restrictions that depend on operands (`axes` as initializers, zero points of 0, 2D/3D
/// pooling) are checked on the emitted model by `mmq_backend_trt::lint`.
pub const PARSER_OPS: &[OpKind] = &[
    OpKind::Abs,
    OpKind::Acos,
    OpKind::Acosh,
    OpKind::Add,
    OpKind::And,
    OpKind::ArgMax,
    OpKind::ArgMin,
    OpKind::Asin,
    OpKind::Asinh,
    OpKind::Atan,
    OpKind::Atanh,
    OpKind::AveragePool,
    OpKind::BatchNormalization,
    OpKind::Cast,
    OpKind::CastLike,
    OpKind::Ceil,
    OpKind::Celu,
    OpKind::Clip,
    OpKind::Concat,
    OpKind::Constant,
    OpKind::ConstantOfShape,
    OpKind::Conv,
    OpKind::ConvTranspose,
    OpKind::Cos,
    OpKind::Cosh,
    OpKind::CumSum,
    OpKind::DepthToSpace,
    OpKind::DequantizeLinear,
    OpKind::Div,
    OpKind::Dropout,
    OpKind::Einsum,
    OpKind::Elu,
    OpKind::Equal,
    OpKind::Erf,
    OpKind::Exp,
    OpKind::Expand,
    OpKind::EyeLike,
    OpKind::Flatten,
    OpKind::Floor,
    OpKind::Gather,
    OpKind::GatherElements,
    OpKind::GatherND,
    OpKind::Gelu,
    OpKind::Gemm,
    OpKind::GlobalAveragePool,
    OpKind::GlobalLpPool,
    OpKind::GlobalMaxPool,
    OpKind::Greater,
    OpKind::GreaterOrEqual,
    OpKind::GridSample,
    OpKind::GroupNormalization,
    OpKind::GRU,
    OpKind::HardSigmoid,
    OpKind::HardSwish,
    OpKind::Hardmax,
    OpKind::Identity,
    OpKind::If,
    OpKind::InstanceNormalization,
    OpKind::IsInf,
    OpKind::IsNaN,
    OpKind::LayerNormalization,
    OpKind::LeakyRelu,
    OpKind::Less,
    OpKind::LessOrEqual,
    OpKind::Log,
    OpKind::LogSoftmax,
    OpKind::Loop,
    OpKind::LRN,
    OpKind::LSTM,
    OpKind::LpNormalization,
    OpKind::LpPool,
    OpKind::MatMul,
    OpKind::Max,
    OpKind::MaxPool,
    OpKind::Mean,
    OpKind::MeanVarianceNormalization,
    OpKind::Min,
    OpKind::Mish,
    OpKind::Mod,
    OpKind::Mul,
    OpKind::Neg,
    OpKind::NonMaxSuppression,
    OpKind::NonZero,
    OpKind::Not,
    OpKind::OneHot,
    OpKind::Or,
    OpKind::Pad,
    OpKind::Pow,
    OpKind::PRelu,
    OpKind::QuantizeLinear,
    OpKind::Range,
    OpKind::Reciprocal,
    OpKind::ReduceL1,
    OpKind::ReduceL2,
    OpKind::ReduceLogSum,
    OpKind::ReduceLogSumExp,
    OpKind::ReduceMax,
    OpKind::ReduceMean,
    OpKind::ReduceMin,
    OpKind::ReduceProd,
    OpKind::ReduceSum,
    OpKind::ReduceSumSquare,
    OpKind::Relu,
    OpKind::Reshape,
    OpKind::Resize,
    OpKind::ReverseSequence,
    OpKind::RNN,
    OpKind::RoiAlign,
    OpKind::Round,
    OpKind::Scan,
    OpKind::Scatter,
    OpKind::ScatterElements,
    OpKind::ScatterND,
    OpKind::Selu,
    OpKind::Shape,
    OpKind::Shrink,
    OpKind::Sigmoid,
    OpKind::Sign,
    OpKind::Sin,
    OpKind::Sinh,
    OpKind::Size,
    OpKind::Slice,
    OpKind::Softmax,
    OpKind::Softplus,
    OpKind::Softsign,
    OpKind::SpaceToDepth,
    OpKind::Split,
    OpKind::Sqrt,
    OpKind::Squeeze,
    OpKind::Sub,
    OpKind::Sum,
    OpKind::Tan,
    OpKind::Tanh,
    OpKind::ThresholdedRelu,
    OpKind::Tile,
    OpKind::TopK,
    OpKind::Transpose,
    OpKind::Trilu,
    OpKind::Unsqueeze,
    OpKind::Upsample,
    OpKind::Where,
    OpKind::Xor,
];

/// The ops the parser supports that the op table does not model (they are [`OpKind::Custom`]
/// in the IR), by `op_type`.
pub const PARSER_CUSTOM_OPS: &[&str] = &[
    "DeformConv",
    "ImageScaler",
    "ParametricSoftplus",
    "RandomNormal",
    "RandomNormalLike",
    "RandomUniform",
    "RandomUniformLike",
    "ScaledTanh",
];

/// Whether the parser supports `op` (a default-domain op).
pub fn parser_supports(op: OpName<'_>) -> bool {
    op.is_standard()
        && match op.kind {
            OpKind::Custom => PARSER_CUSTOM_OPS.contains(&op.op_type),
            kind => PARSER_OPS.contains(&kind),
        }
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
    fn op_cost(&self, op: OpName<'_>) -> f64 {
        if !op.is_standard() {
            f64::INFINITY
        } else if parser_supports(op) {
            standard_cost(op.kind)
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
        let ops = [
            OpKind::Attention,
            OpKind::RMSNormalization,
            OpKind::RotaryEmbedding,
        ]
        .into_iter()
        .filter(|&op| !parser_supports(OpName::of(op)))
        .collect();
        Some(Box::new(legalize::Decompose { ops }))
    }

    fn lowering(&self) -> Option<Box<dyn crate::pass::Pass>> {
        Some(Box::new(lower::TrtPlugins))
    }
}
