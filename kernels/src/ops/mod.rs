//! Kernels, one module per op family. Each family's `eval` returns `None` for ops it does not
//! handle; [`eval`] tries them in turn.

mod contrib;
mod control;
pub(crate) mod data;
mod elementwise;
mod linalg;
mod plugin;
pub mod quant;
mod shape;
pub(crate) mod util;

use mmq_ir::{GraphId, NodeData, Op};

use crate::error::KernelError;
use crate::interp::{Env, Interpreter};
use crate::tensor::RtValue;

/// The result of a kernel: one entry per node output (`None` for an omitted optional output).
pub type OpResult = Result<Vec<Option<RtValue>>, KernelError>;

/// What a kernel sees besides its operands.
pub struct OpCtx<'a> {
    /// The interpreter (constants, nested graphs).
    pub interp: &'a Interpreter<'a>,
    /// The node being run.
    pub node: &'a NodeData,
    /// The default-domain opset of the model (semantics differ between opsets).
    pub opset: i64,
    /// The scope of the running graph, for subgraphs.
    pub env: &'a Env<'a>,
}

impl OpCtx<'_> {
    /// `name (Op)` for messages.
    /// Refuses a result of `shape` that does not fit the memory limit, before a kernel sizing
    /// its result from the data (a shape tensor, repeats, pads, scales) allocates it: an error
    /// naming the node and the size, never an aborted process.
    pub(crate) fn check_result(
        &self,
        dtype: mmq_ir::DType,
        shape: &[usize],
    ) -> Result<(), KernelError> {
        crate::tensor::check_size_with(|| format!("{} result", self.label()), dtype, shape)
            .map(|_| ())
    }

    /// `dims` multiplied elementwise by `factors`; an error when a product does not fit.
    pub(crate) fn scaled_dims(
        &self,
        dims: &[usize],
        factors: &[usize],
    ) -> Result<Vec<usize>, KernelError> {
        dims.iter()
            .zip(factors)
            .map(|(&d, &f)| {
                d.checked_mul(f).ok_or_else(|| {
                    self.invalid(format!("a result dim of {d} x {f} does not fit in memory"))
                })
            })
            .collect()
    }

    pub fn label(&self) -> String {
        match &self.node.name {
            Some(n) if !n.is_empty() => format!("node '{n}' ({})", self.node.op.op_type()),
            _ => format!("{} node", self.node.op.op_type()),
        }
    }

    /// An "unsupported" error at this node.
    pub fn unsupported(&self, message: impl Into<String>) -> KernelError {
        KernelError::Unsupported {
            node: self.label(),
            message: message.into(),
        }
    }

    /// An "invalid operands" error at this node.
    pub fn invalid(&self, message: impl Into<String>) -> KernelError {
        KernelError::Invalid {
            node: self.label(),
            message: message.into(),
        }
    }

    /// Runs a nested graph (a body of `If`, `Loop`, `Scan`) in the current scope.
    pub fn run_graph(
        &self,
        g: GraphId,
        inputs: Vec<Option<RtValue>>,
    ) -> Result<Vec<RtValue>, KernelError> {
        self.interp.run_graph(g, inputs, self.env)
    }

    /// Number of outputs the node declares (including omitted optional ones).
    pub fn num_outputs(&self) -> usize {
        self.node.outputs.len()
    }
}

/// The kernel family of a modeled op: one exhaustive match, so a new op does not compile until
/// it is given a family (and the node-suite tests check that the family runs it). Ops outside
/// the modeled set try every family, contrib ops first.
fn family(op: &Op) -> Option<Family> {
    Some(match op {
        Op::Add { .. }
        | Op::Sub { .. }
        | Op::Mul { .. }
        | Op::Div { .. }
        | Op::Pow { .. }
        | Op::Mod { .. }
        | Op::Min { .. }
        | Op::Max { .. }
        | Op::Sum { .. }
        | Op::Mean { .. }
        | Op::BitShift { .. }
        | Op::BitwiseAnd { .. }
        | Op::BitwiseOr { .. }
        | Op::BitwiseXor { .. }
        | Op::BitwiseNot { .. }
        | Op::Equal { .. }
        | Op::Less { .. }
        | Op::Greater { .. }
        | Op::LessOrEqual { .. }
        | Op::GreaterOrEqual { .. }
        | Op::And { .. }
        | Op::Or { .. }
        | Op::Xor { .. }
        | Op::Not { .. }
        | Op::Where { .. }
        | Op::IsNaN { .. }
        | Op::IsInf { .. }
        | Op::Neg { .. }
        | Op::Abs { .. }
        | Op::Sqrt { .. }
        | Op::Exp { .. }
        | Op::Log { .. }
        | Op::Reciprocal { .. }
        | Op::Floor { .. }
        | Op::Ceil { .. }
        | Op::Round { .. }
        | Op::Sign { .. }
        | Op::Sin { .. }
        | Op::Cos { .. }
        | Op::Tan { .. }
        | Op::Asin { .. }
        | Op::Acos { .. }
        | Op::Atan { .. }
        | Op::Sinh { .. }
        | Op::Cosh { .. }
        | Op::Asinh { .. }
        | Op::Acosh { .. }
        | Op::Atanh { .. }
        | Op::Tanh { .. }
        | Op::Sigmoid { .. }
        | Op::Erf { .. }
        | Op::Identity { .. }
        | Op::Clip { .. }
        | Op::Relu { .. }
        | Op::LeakyRelu { .. }
        | Op::Elu { .. }
        | Op::Selu { .. }
        | Op::Celu { .. }
        | Op::Gelu { .. }
        | Op::HardSigmoid { .. }
        | Op::HardSwish { .. }
        | Op::Softplus { .. }
        | Op::Softsign { .. }
        | Op::PRelu { .. }
        | Op::Mish { .. }
        | Op::ThresholdedRelu { .. }
        | Op::Swish { .. }
        | Op::ReduceSum { .. }
        | Op::ReduceMean { .. }
        | Op::ReduceMax { .. }
        | Op::ReduceMin { .. }
        | Op::ReduceProd { .. }
        | Op::ReduceL1 { .. }
        | Op::ReduceL2 { .. }
        | Op::ReduceLogSum { .. }
        | Op::ReduceLogSumExp { .. }
        | Op::ReduceSumSquare { .. }
        | Op::ArgMax { .. }
        | Op::ArgMin { .. }
        | Op::Softmax { .. }
        | Op::LogSoftmax { .. }
        | Op::Hardmax { .. }
        | Op::CumSum { .. }
        | Op::Cast { .. }
        | Op::CastLike { .. } => elementwise::eval,
        Op::MatMul { .. }
        | Op::MatMulInteger { .. }
        | Op::Gemm { .. }
        | Op::Conv { .. }
        | Op::ConvInteger { .. }
        | Op::ConvTranspose { .. }
        | Op::QLinearConv { .. }
        | Op::QLinearMatMul { .. }
        | Op::Einsum { .. }
        | Op::MaxPool { .. }
        | Op::AveragePool { .. }
        | Op::LpPool { .. }
        | Op::GlobalAveragePool { .. }
        | Op::GlobalMaxPool { .. }
        | Op::GlobalLpPool { .. }
        | Op::BatchNormalization { .. }
        | Op::LayerNormalization { .. }
        | Op::InstanceNormalization { .. }
        | Op::GroupNormalization { .. }
        | Op::RMSNormalization { .. }
        | Op::LpNormalization { .. }
        | Op::LRN { .. }
        | Op::MeanVarianceNormalization { .. }
        | Op::Attention { .. }
        | Op::RotaryEmbedding { .. } => linalg::eval,
        Op::TopK { .. }
        | Op::Shape { .. }
        | Op::Size { .. }
        | Op::Gather { .. }
        | Op::GatherElements { .. }
        | Op::GatherND { .. }
        | Op::ScatterND { .. }
        | Op::ScatterElements { .. }
        | Op::Slice { .. }
        | Op::Concat { .. }
        | Op::Split { .. }
        | Op::Reshape { .. }
        | Op::Expand { .. }
        | Op::Squeeze { .. }
        | Op::Unsqueeze { .. }
        | Op::Flatten { .. }
        | Op::Transpose { .. }
        | Op::Range { .. }
        | Op::Tile { .. }
        | Op::Pad { .. }
        | Op::Resize { .. }
        | Op::ConstantOfShape { .. }
        | Op::Constant { .. }
        | Op::Dropout { .. }
        | Op::NonZero { .. }
        | Op::Trilu { .. }
        | Op::DepthToSpace { .. }
        | Op::SpaceToDepth { .. }
        | Op::OneHot { .. } => shape::eval,
        Op::QuantizeLinear { .. }
        | Op::DequantizeLinear { .. }
        | Op::DynamicQuantizeLinear { .. } => quant::eval,
        Op::If { .. } | Op::Loop { .. } | Op::Scan { .. } | Op::Optional { .. } => control::eval,
        Op::OptionalHasElement { .. }
        | Op::OptionalGetElement { .. }
        | Op::SequenceEmpty { .. }
        | Op::SequenceConstruct { .. }
        | Op::SequenceLength { .. }
        | Op::SequenceAt { .. }
        | Op::SequenceInsert { .. }
        | Op::SequenceErase { .. }
        | Op::SplitToSequence { .. }
        | Op::ConcatFromSequence { .. }
        | Op::SequenceMap { .. }
        | Op::RNN { .. }
        | Op::GRU { .. }
        | Op::LSTM { .. }
        | Op::CumProd { .. }
        | Op::Compress { .. }
        | Op::EyeLike { .. }
        | Op::Shrink { .. }
        | Op::ReverseSequence { .. }
        | Op::Det { .. }
        | Op::HannWindow { .. }
        | Op::HammingWindow { .. }
        | Op::BlackmanWindow { .. }
        | Op::StringConcat { .. }
        | Op::StringSplit { .. }
        | Op::Unique { .. }
        | Op::CenterCropPad { .. }
        | Op::Col2Im { .. }
        | Op::DFT { .. }
        | Op::STFT { .. }
        | Op::NonMaxSuppression { .. }
        | Op::GridSample { .. }
        | Op::StringNormalizer { .. }
        | Op::SwiGLU { .. }
        | Op::TensorScatter { .. }
        | Op::MaxUnpool { .. }
        | Op::TfIdfVectorizer { .. }
        | Op::MelWeightMatrix { .. }
        | Op::RoiAlign { .. }
        | Op::NegativeLogLikelihoodLoss { .. }
        | Op::SoftmaxCrossEntropyLoss { .. }
        | Op::BitCast { .. }
        | Op::AffineGrid { .. }
        | Op::Upsample { .. } => control::eval,
        Op::Scatter { .. } => shape::eval,
        Op::SimplifiedLayerNormalization { .. }
        | Op::MsGelu { .. }
        | Op::FastGelu { .. }
        | Op::BiasGelu { .. }
        | Op::QuickGelu { .. }
        | Op::SkipLayerNormalization { .. }
        | Op::SkipSimplifiedLayerNormalization { .. }
        | Op::FusedConv { .. }
        | Op::FusedGemm { .. }
        | Op::FusedMatMul { .. }
        | Op::MatMulNBits { .. }
        | Op::MultiHeadAttention { .. }
        | Op::GroupQueryAttention { .. }
        | Op::MsAttention { .. }
        | Op::MsRotaryEmbedding { .. } => contrib::eval,
        Op::MmqQuantize { .. }
        | Op::MmqDequantize { .. }
        | Op::MmqDynamicQuantize { .. }
        | Op::MmqMatMulNBits { .. } => plugin::eval,
        Op::Custom(_) => return None,
    })
}

type Family = fn(&OpCtx<'_>, &[Option<RtValue>]) -> Option<OpResult>;

/// Runs one node.
pub(crate) fn eval(cx: &OpCtx<'_>, inputs: &[Option<RtValue>]) -> OpResult {
    const CUSTOM: [Family; 5] = [
        elementwise::eval,
        linalg::eval,
        shape::eval,
        quant::eval,
        control::eval,
    ];
    let result = match family(&cx.node.op) {
        Some(f) => f(cx, inputs),
        None => CUSTOM.iter().find_map(|f| f(cx, inputs)),
    };
    if let Some(result) = result {
        return result;
    }
    let op = &cx.node.op;
    let name = match op.domain() {
        "" => op.op_type().to_owned(),
        d => format!("{d}.{}", op.op_type()),
    };
    Err(cx.unsupported(format!("op {name} is not implemented by the interpreter")))
}
