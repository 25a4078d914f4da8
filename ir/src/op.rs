//! The closed set of operations.
//!
//! Each modeled op is a variant named after its ONNX operator, with one typed, optional field per
//! attribute (`None` = absent, so the ONNX default applies; see the accessors on [`Op`] for the
//! defaults that passes rely on). Legacy attributes of older opsets are modeled too where the op
//! kept its name (`Squeeze { axes }` before opset 13), so importing any opset stays lossless.
//! Semantics are those of the ONNX operator at the opset that the module imports for the default
//! domain ([`crate::ModelInfo::opsets`]).
//!
//! Anything else, including every op outside the default domain and any node whose attributes
//! do not fit the typed fields, is [`Op::Custom`], which keeps domain, type and attributes
//! losslessly.

use crate::attr::{Attr, AttrValue};
use crate::constant::Const;
use crate::module::GraphId;
use crate::types::Type;

/// An op outside the modeled set, kept losslessly.
#[derive(Clone, Debug, PartialEq)]
pub struct CustomOp {
    /// Operator domain (`""` is the ONNX default domain, `com.microsoft`, ...).
    pub domain: String,
    /// Operator type.
    pub op_type: String,
    /// Attributes in source order.
    pub attrs: Vec<(String, Attr)>,
}

macro_rules! attr_name {
    ($f:ident) => {
        stringify!($f)
    };
    ($f:ident, $n:literal) => {
        $n
    };
}

macro_rules! ops {
    ($(
        $(#[doc = $doc:literal])*
        $variant:ident { $($field:ident : $fty:ty $(= $aname:literal)?),* $(,)? }
    )*) => {
        /// An operation. See the module documentation for the conventions.
        #[derive(Clone, Debug, PartialEq)]
        #[allow(missing_docs, reason = "attribute fields carry the ONNX attribute of the same name")]
        pub enum Op {
            $(
                $(#[doc = $doc])*
                $variant { $($field: Option<$fty>),* },
            )*
            /// Any other op.
            Custom(CustomOp),
        }

        impl Op {
            /// Every modeled op type, in declaration order.
            pub const MODELED: &'static [&'static str] = &[$(stringify!($variant)),*];

            /// The attribute names of a modeled op type, in declaration order; `None` when
            /// `op_type` is not modeled.
            pub fn attr_names(op_type: &str) -> Option<&'static [&'static str]> {
                match op_type {
                    $(stringify!($variant) => Some(&[$(attr_name!($field $(, $aname)?)),*]),)*
                    _ => None,
                }
            }

            /// The operator type (ONNX `op_type`).
            pub fn op_type(&self) -> &str {
                match self {
                    $(Op::$variant { .. } => stringify!($variant),)*
                    Op::Custom(c) => &c.op_type,
                }
            }

            /// The operator domain; `""` for every modeled op.
            pub fn domain(&self) -> &str {
                match self {
                    Op::Custom(c) => &c.domain,
                    _ => "",
                }
            }

            /// The attributes that are set, in declaration (or, for custom ops, source) order.
            pub fn attrs(&self) -> Vec<(&str, Attr)> {
                match self {
                    $(
                        #[allow(unused_mut, reason = "ops without attributes")]
                        Op::$variant { $($field),* } => {
                            let mut out = Vec::new();
                            $(
                                if let Some(v) = $field {
                                    out.push((attr_name!($field $(, $aname)?), v.to_attr()));
                                }
                            )*
                            out
                        }
                    )*
                    Op::Custom(c) => c.attrs.iter().map(|(n, a)| (n.as_str(), a.clone())).collect(),
                }
            }

            /// The typed op for `op_type` in the default domain, when it is modeled and every
            /// attribute fits a typed field.
            fn typed(op_type: &str, attrs: &[(String, Attr)]) -> Option<Op> {
                match op_type {
                    $(
                        stringify!($variant) => {
                            $(let mut $field: Option<$fty> = None;)*
                            for (name, attr) in attrs {
                                match name.as_str() {
                                    $(attr_name!($field $(, $aname)?) => {
                                        if $field.is_some() {
                                            return None;
                                        }
                                        $field = Some(<$fty as AttrValue>::from_attr(attr)?);
                                    })*
                                    _ => {
                                        let _ = attr;
                                        return None;
                                    }
                                }
                            }
                            Some(Op::$variant { $($field),* })
                        }
                    )*
                    _ => None,
                }
            }
        }
    };
}

impl Op {
    /// Builds the op for a node: typed when modeled, else [`Op::Custom`]. The domains `""` and
    /// `ai.onnx` are the same default domain.
    pub fn from_parts(domain: &str, op_type: &str, attrs: Vec<(String, Attr)>) -> Op {
        if (domain.is_empty() || domain == "ai.onnx")
            && let Some(op) = Op::typed(op_type, &attrs)
        {
            return op;
        }
        Op::Custom(CustomOp {
            domain: domain.to_owned(),
            op_type: op_type.to_owned(),
            attrs,
        })
    }

    /// Whether this is [`Op::Custom`].
    pub fn is_custom(&self) -> bool {
        matches!(self, Op::Custom(_))
    }

    /// The graphs referenced from attributes (bodies of `If`, `Loop`, `Scan`, custom ops).
    pub fn subgraphs(&self) -> Vec<GraphId> {
        self.attrs()
            .iter()
            .flat_map(|(_, a)| a.graphs().to_vec())
            .collect()
    }

    /// The constants referenced from attributes.
    pub fn attr_consts(&self) -> Vec<Const> {
        self.attrs()
            .iter()
            .flat_map(|(_, a)| a.consts().to_vec())
            .collect()
    }
}

ops! {
    // ---- elementwise arithmetic (ONNX multidirectional broadcasting) ----
    /// `a + b`.
    Add {}
    /// `a - b`.
    Sub {}
    /// `a * b`.
    Mul {}
    /// `a / b` (integer division truncates).
    Div {}
    /// `a ^ b`.
    Pow {}
    /// Remainder; `fmod = 1` gives C `fmod` semantics.
    Mod { fmod: i64 }
    /// Elementwise minimum of all inputs.
    Min {}
    /// Elementwise maximum of all inputs.
    Max {}
    /// Elementwise sum of all inputs.
    Sum {}
    /// Elementwise mean of all inputs.
    Mean {}
    /// Bit shift by `direction` (`LEFT` or `RIGHT`).
    BitShift { direction: String }
    /// Bitwise and.
    BitwiseAnd {}
    /// Bitwise or.
    BitwiseOr {}
    /// Bitwise xor.
    BitwiseXor {}
    /// Bitwise not.
    BitwiseNot {}
    // ---- comparison and logic ----
    /// `a == b` → bool.
    Equal {}
    /// `a < b` → bool.
    Less {}
    /// `a > b` → bool.
    Greater {}
    /// `a <= b` → bool.
    LessOrEqual {}
    /// `a >= b` → bool.
    GreaterOrEqual {}
    /// Logical and.
    And {}
    /// Logical or.
    Or {}
    /// Logical xor.
    Xor {}
    /// Logical not.
    Not {}
    /// `cond ? a : b` with broadcasting.
    Where {}
    /// NaN test → bool.
    IsNaN {}
    /// Infinity test → bool.
    IsInf { detect_negative: i64, detect_positive: i64 }
    // ---- elementwise unary math ----
    /// `-x`.
    Neg {}
    /// `|x|`.
    Abs {}
    /// Square root.
    Sqrt {}
    /// `e^x`.
    Exp {}
    /// Natural logarithm.
    Log {}
    /// `1 / x`.
    Reciprocal {}
    /// Round down.
    Floor {}
    /// Round up.
    Ceil {}
    /// Round half to even.
    Round {}
    /// Sign (-1, 0, 1).
    Sign {}
    /// Sine.
    Sin {}
    /// Cosine.
    Cos {}
    /// Tangent.
    Tan {}
    /// Arcsine.
    Asin {}
    /// Arccosine.
    Acos {}
    /// Arctangent.
    Atan {}
    /// Hyperbolic sine.
    Sinh {}
    /// Hyperbolic cosine.
    Cosh {}
    /// Inverse hyperbolic sine.
    Asinh {}
    /// Inverse hyperbolic cosine.
    Acosh {}
    /// Inverse hyperbolic tangent.
    Atanh {}
    /// Hyperbolic tangent.
    Tanh {}
    /// Logistic sigmoid.
    Sigmoid {}
    /// Error function.
    Erf {}
    /// The input, unchanged.
    Identity {}
    /// Clamp to `[min, max]` (inputs from opset 11; attributes before).
    Clip { min: f32, max: f32 }
    // ---- activations ----
    /// `max(x, 0)`.
    Relu {}
    /// `x < 0 ? alpha * x : x` (alpha default 0.01).
    LeakyRelu { alpha: f32 }
    /// Exponential linear unit (alpha default 1).
    Elu { alpha: f32 }
    /// Scaled ELU.
    Selu { alpha: f32, gamma: f32 }
    /// Continuously differentiable ELU.
    Celu { alpha: f32 }
    /// GELU; `approximate` is `none` (erf) or `tanh`.
    Gelu { approximate: String }
    /// `max(0, min(1, alpha * x + beta))`.
    HardSigmoid { alpha: f32, beta: f32 }
    /// `x * hard_sigmoid(x)` with alpha 1/6, beta 0.5.
    HardSwish {}
    /// `ln(1 + e^x)`.
    Softplus {}
    /// `x / (1 + |x|)`.
    Softsign {}
    /// Leaky ReLU with a learned slope input.
    PRelu {}
    /// `x * tanh(softplus(x))`.
    Mish {}
    /// `x > alpha ? x : 0`.
    ThresholdedRelu { alpha: f32 }
    /// `x * sigmoid(alpha * x)`.
    Swish { alpha: f32 }
    // ---- linear algebra and convolution ----
    /// Matrix product with numpy batching.
    MatMul {}
    /// Integer matrix product with zero points.
    MatMulInteger {}
    /// `alpha * op(A) * op(B) + beta * C`.
    Gemm { alpha: f32, beta: f32, trans_a: i64 = "transA", trans_b: i64 = "transB" }
    /// N-d convolution (NCHW).
    Conv { auto_pad: String, dilations: Vec<i64>, group: i64, kernel_shape: Vec<i64>, pads: Vec<i64>, strides: Vec<i64> }
    /// Integer convolution with zero points.
    ConvInteger { auto_pad: String, dilations: Vec<i64>, group: i64, kernel_shape: Vec<i64>, pads: Vec<i64>, strides: Vec<i64> }
    /// Transposed convolution.
    ConvTranspose { auto_pad: String, dilations: Vec<i64>, group: i64, kernel_shape: Vec<i64>, output_padding: Vec<i64>, output_shape: Vec<i64>, pads: Vec<i64>, strides: Vec<i64> }
    /// Quantized convolution (x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, bias).
    QLinearConv { auto_pad: String, dilations: Vec<i64>, group: i64, kernel_shape: Vec<i64>, pads: Vec<i64>, strides: Vec<i64> }
    /// Quantized matrix product.
    QLinearMatMul {}
    /// Einstein summation.
    Einsum { equation: String }
    // ---- pooling ----
    /// Max pooling; optional second output holds indices.
    MaxPool { auto_pad: String, ceil_mode: i64, dilations: Vec<i64>, kernel_shape: Vec<i64>, pads: Vec<i64>, storage_order: i64, strides: Vec<i64> }
    /// Average pooling.
    AveragePool { auto_pad: String, ceil_mode: i64, count_include_pad: i64, dilations: Vec<i64>, kernel_shape: Vec<i64>, pads: Vec<i64>, strides: Vec<i64> }
    /// Lp pooling.
    LpPool { auto_pad: String, ceil_mode: i64, dilations: Vec<i64>, kernel_shape: Vec<i64>, p: i64, pads: Vec<i64>, strides: Vec<i64> }
    /// Mean over all spatial axes (keeps them as size 1).
    GlobalAveragePool {}
    /// Max over all spatial axes.
    GlobalMaxPool {}
    /// Lp norm over all spatial axes.
    GlobalLpPool { p: i64 }
    // ---- normalization ----
    /// Batch normalization (inference form unless `training_mode = 1`).
    BatchNormalization { epsilon: f32, momentum: f32, training_mode: i64, spatial: i64, is_test: i64 }
    /// Layer normalization over axes `axis..rank`.
    LayerNormalization { axis: i64, epsilon: f32, stash_type: i64 }
    /// Instance normalization.
    InstanceNormalization { epsilon: f32 }
    /// Group normalization.
    GroupNormalization { epsilon: f32, num_groups: i64, stash_type: i64 }
    /// RMS normalization over axes `axis..rank`.
    RMSNormalization { axis: i64, epsilon: f32, stash_type: i64 }
    /// Lp normalization along `axis`.
    LpNormalization { axis: i64, p: i64 }
    /// Local response normalization.
    LRN { alpha: f32, beta: f32, bias: f32, size: i64 }
    /// Mean-variance normalization over `axes`.
    MeanVarianceNormalization { axes: Vec<i64> }
    // ---- reductions (axes attribute before opset 18, input after; ReduceSum from 13) ----
    /// Sum.
    ReduceSum { axes: Vec<i64>, keepdims: i64, noop_with_empty_axes: i64 }
    /// Mean.
    ReduceMean { axes: Vec<i64>, keepdims: i64, noop_with_empty_axes: i64 }
    /// Maximum.
    ReduceMax { axes: Vec<i64>, keepdims: i64, noop_with_empty_axes: i64 }
    /// Minimum.
    ReduceMin { axes: Vec<i64>, keepdims: i64, noop_with_empty_axes: i64 }
    /// Product.
    ReduceProd { axes: Vec<i64>, keepdims: i64, noop_with_empty_axes: i64 }
    /// L1 norm.
    ReduceL1 { axes: Vec<i64>, keepdims: i64, noop_with_empty_axes: i64 }
    /// L2 norm.
    ReduceL2 { axes: Vec<i64>, keepdims: i64, noop_with_empty_axes: i64 }
    /// Log of sum.
    ReduceLogSum { axes: Vec<i64>, keepdims: i64, noop_with_empty_axes: i64 }
    /// Log of sum of exponentials.
    ReduceLogSumExp { axes: Vec<i64>, keepdims: i64, noop_with_empty_axes: i64 }
    /// Sum of squares.
    ReduceSumSquare { axes: Vec<i64>, keepdims: i64, noop_with_empty_axes: i64 }
    /// Index of the maximum along `axis` (i64).
    ArgMax { axis: i64, keepdims: i64, select_last_index: i64 }
    /// Index of the minimum along `axis` (i64).
    ArgMin { axis: i64, keepdims: i64, select_last_index: i64 }
    /// Softmax along `axis` (before opset 13: over the flattened axes `axis..`).
    Softmax { axis: i64 }
    /// Log-softmax along `axis`.
    LogSoftmax { axis: i64 }
    /// One-hot of the maximum along `axis`.
    Hardmax { axis: i64 }
    /// Cumulative sum along the axis input.
    CumSum { exclusive: i64, reverse: i64 }
    /// The `k` largest (or smallest) elements and their indices.
    TopK { axis: i64, largest: i64, sorted: i64 }
    // ---- shape and indexing ----
    /// The shape as a 1-d i64 tensor, optionally sliced by `start..end`.
    Shape { start: i64, end: i64 }
    /// Number of elements as an i64 scalar.
    Size {}
    /// Gather along `axis`.
    Gather { axis: i64 }
    /// Gather elements along `axis` (`take_along_axis`).
    GatherElements { axis: i64 }
    /// Gather slices by N-d indices.
    GatherND { batch_dims: i64 }
    /// Scatter slices by N-d indices.
    ScatterND { reduction: String }
    /// Scatter elements along `axis`.
    ScatterElements { axis: i64, reduction: String }
    /// Slice by inputs (starts, ends, axes, steps); attributes before opset 10.
    Slice { starts: Vec<i64>, ends: Vec<i64>, axes: Vec<i64> }
    /// Concatenate along `axis`.
    Concat { axis: i64 }
    /// Split along `axis` by the `split` input (attribute before opset 13) or into `num_outputs`.
    Split { axis: i64, num_outputs: i64, split: Vec<i64> }
    /// Reshape to the shape input (0 copies the input dim unless `allowzero`, -1 infers).
    Reshape { allowzero: i64 }
    /// Broadcast to the shape input.
    Expand {}
    /// Remove size-1 axes (axes input from opset 13, attribute before).
    Squeeze { axes: Vec<i64> }
    /// Insert size-1 axes (axes input from opset 13, attribute before).
    Unsqueeze { axes: Vec<i64> }
    /// Reshape to 2-d at `axis`.
    Flatten { axis: i64 }
    /// Permute axes (`perm` default: reverse).
    Transpose { perm: Vec<i64> }
    /// `[start, limit)` by `delta`.
    Range {}
    /// Repeat along each axis.
    Tile {}
    /// Pad (pads input from opset 11, attributes before).
    Pad { mode: String, pads: Vec<i64>, value: f32 }
    /// Resize by scales or sizes.
    Resize { antialias: i64, axes: Vec<i64>, coordinate_transformation_mode: String, cubic_coeff_a: f32, exclude_outside: i64, extrapolation_value: f32, keep_aspect_ratio_policy: String, mode: String, nearest_mode: String }
    /// Convert the element type to `to`.
    Cast { round_mode: String, saturate: i64, to: i64 }
    /// Convert the element type to that of the second input.
    CastLike { round_mode: String, saturate: i64 }
    /// A tensor of the shape input filled with `value` (default f32 zero).
    ConstantOfShape { value: Const }
    /// A constant; exactly one attribute is set.
    Constant { value: Const, value_float: f32, value_floats: Vec<f32>, value_int: i64, value_ints: Vec<i64>, value_string: String, value_strings: Vec<String> }
    /// Identity at inference; optional mask output.
    Dropout { seed: i64, ratio: f32, is_test: i64 }
    /// Indices of non-zero elements, shape `[rank, n]`.
    NonZero {}
    /// Upper or lower triangle.
    Trilu { upper: i64 }
    /// Rearrange depth into blocks of space.
    DepthToSpace { blocksize: i64, mode: String }
    /// Rearrange blocks of space into depth.
    SpaceToDepth { blocksize: i64 }
    /// One-hot encoding along `axis`.
    OneHot { axis: i64 }
    // ---- quantization ----
    /// `saturate(round(x / scale) + zero_point)`; per-tensor, per-axis or per-block.
    QuantizeLinear { axis: i64, block_size: i64, output_dtype: i64, precision: i64, saturate: i64 }
    /// `(x - zero_point) * scale`; per-tensor, per-axis or per-block.
    DequantizeLinear { axis: i64, block_size: i64, output_dtype: i64 }
    /// Dynamic u8 quantization with computed scale and zero point.
    DynamicQuantizeLinear {}
    // ---- attention ----
    /// Scaled dot-product attention (opset 23; sliding windows from opset 25).
    Attention { is_causal: i64, kv_num_heads: i64, left_window_size: i64, q_num_heads: i64, qk_matmul_output_mode: i64, right_window_size: i64, scale: f32, softcap: f32, softmax_precision: i64 }
    /// Rotary position embedding (opset 23).
    RotaryEmbedding { interleaved: i64, num_heads: i64, rotary_embedding_dim: i64 }
    // ---- control flow ----
    /// Runs `then_branch` or `else_branch`.
    If { then_branch: GraphId, else_branch: GraphId }
    /// Runs `body` while the condition holds, up to the trip count.
    Loop { body: GraphId }
    /// Runs `body` over slices of the scan inputs.
    Scan { body: GraphId, num_scan_inputs: i64, scan_input_axes: Vec<i64>, scan_input_directions: Vec<i64>, scan_output_axes: Vec<i64>, scan_output_directions: Vec<i64> }
    // ---- optional and sequence ----
    /// Wraps a value (or nothing, with `type`) as an optional.
    Optional { r#type: Type = "type" }
}
