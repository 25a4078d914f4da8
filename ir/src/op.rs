//! The closed set of operations.
//!
//! Each modeled op is a variant named after its ONNX operator, with one typed, optional field per
//! attribute (`None` = absent, so the ONNX default applies: [`Op::attr`] gives it). Legacy
//! attributes of older opsets are modeled too where the op kept its name (`Squeeze { axes }`
//! before opset 13), so importing any opset stays lossless.
//! Semantics are those of the ONNX operator at the opset that the module imports for the default
//! domain ([`crate::ModelInfo::opsets`]).
//!
//! Ops of other domains that mmq emits or runs are modeled the same way, under their domain:
//! ONNX Runtime's contrib ops (`com.microsoft`, and `SimplifiedLayerNormalization`, which ONNX
//! Runtime registers in the default domain) and mmq's TensorRT plugins (`mmq.trt`). A variant
//! whose op type is taken in the default domain carries a prefix (`MsGelu` is
//! `com.microsoft.Gelu`).
//!
//! Anything else, and any node whose attributes do not fit the typed fields, is
//! [`Op::Custom`], which keeps domain, type and attributes losslessly.
//!
//! The table at the end of this file is the op schema: per op its operand and result counts
//! ([`Op::arity`], checked by the verifier), its properties ([`Op::properties`]: elementwise,
//! commutative, layout), and per attribute its type, ONNX name and ONNX default
//! ([`Op::attr`], [`Op::get`], [`Op::epsilon`]).

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

macro_rules! op_domain {
    () => {
        ""
    };
    ($d:literal) => {
        $d
    };
}

macro_rules! op_name {
    ($v:ident) => {
        stringify!($v)
    };
    ($v:ident, $n:literal) => {
        $n
    };
}

macro_rules! attr_name {
    ($f:ident) => {
        stringify!($f)
    };
    ($f:ident, $n:literal) => {
        $n
    };
}

macro_rules! arity_max {
    ($min:literal) => {
        $min
    };
    ($min:literal, *) => {
        usize::MAX
    };
    ($min:literal, $max:literal) => {
        $max
    };
}

macro_rules! attr_default {
    ($t:ty) => {
        None
    };
    ($t:ty, $d:literal) => {
        Some(<$t as AttrValue>::to_attr(
            &<$t as FromDefault<_>>::from_default($d),
        ))
    };
}

/// Converts a default written in the op table (a Rust literal) to the field's type.
trait FromDefault<L> {
    fn from_default(literal: L) -> Self;
}

impl FromDefault<i64> for i64 {
    fn from_default(literal: i64) -> i64 {
        literal
    }
}

impl FromDefault<f64> for f32 {
    fn from_default(literal: f64) -> f32 {
        literal as f32
    }
}

impl FromDefault<&'static str> for String {
    fn from_default(literal: &'static str) -> String {
        literal.to_owned()
    }
}

/// How many operands and results a node of a modeled op may have (omitted optional operands
/// at the end do not count; `usize::MAX` is unbounded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arity {
    /// Fewest operands.
    pub min_inputs: usize,
    /// Most operands.
    pub max_inputs: usize,
    /// Fewest results.
    pub min_outputs: usize,
    /// Most results.
    pub max_outputs: usize,
}

/// A property of a modeled op (the op table's parenthesized list).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpProperty {
    /// Each result element is a function of the operand elements at the same (broadcast)
    /// position.
    Elementwise,
    /// The operands can be swapped (or permuted) without changing the result.
    Commutative,
    /// Rearranges elements without changing their values or count (reshapes, transposes,
    /// `Identity`): a quantization scale or a calibrated range passes through it.
    Layout,
}

macro_rules! prop {
    (elementwise) => {
        OpProperty::Elementwise
    };
    (commutative) => {
        OpProperty::Commutative
    };
    (layout) => {
        OpProperty::Layout
    };
}

/// The op table. Each row is
/// `Variant [in "domain"] [as "OpType"] [OPERANDS -> RESULTS] (PROPERTIES)
/// { field: Type [as "onnxName"] [= default], ... }`
/// where the domain is the default domain and the op type the variant's name unless given,
/// counts are `n` or `min..max` (`*` unbounded) and a default is the ONNX default of an
/// attribute whose default does not depend on the opset or the operand shapes.
macro_rules! ops {
    ($(
        $(#[doc = $doc:literal])*
        $variant:ident
        $(in $domain:literal)?
        $(as $optype:literal)?
        [ $imin:literal $(.. $imax:tt)? -> $omin:literal $(.. $omax:tt)? ]
        $( ( $($prop:ident),* ) )?
        { $($field:ident : $fty:ty $(as $aname:literal)? $(= $default:literal)?),* $(,)? }
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

        /// An op's kind: its variant without attributes ([`OpKind::Custom`] for any op the
        /// table does not model). Costs, placement and targets' support lists match on it.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[allow(missing_docs, reason = "each kind is the op of the same name")]
        pub enum OpKind {
            $($variant,)*
            /// An op the table does not model.
            Custom,
        }

        impl OpKind {
            /// Every modeled kind, in declaration order.
            pub const MODELED: &'static [OpKind] = &[$(OpKind::$variant),*];

            /// The kind of `op_type` in `domain` (`""` and `ai.onnx` are the default domain);
            /// [`OpKind::Custom`] when the table does not model it.
            pub fn of(domain: &str, op_type: &str) -> OpKind {
                match (default_domain(domain), op_type) {
                    $((op_domain!($($domain)?), op_name!($variant $(, $optype)?)) => OpKind::$variant,)*
                    _ => OpKind::Custom,
                }
            }

            /// The operator type (`""` for [`OpKind::Custom`]).
            pub fn op_type(self) -> &'static str {
                match self {
                    $(OpKind::$variant => op_name!($variant $(, $optype)?),)*
                    OpKind::Custom => "",
                }
            }

            /// The operator domain (`""` for the default domain and for [`OpKind::Custom`]).
            pub fn domain(self) -> &'static str {
                match self {
                    $(OpKind::$variant => op_domain!($($domain)?),)*
                    OpKind::Custom => "",
                }
            }
        }

        impl Op {
            /// Every modeled op as `(domain, op_type)`, in declaration order.
            pub const MODELED: &'static [(&'static str, &'static str)] =
                &[$((op_domain!($($domain)?), op_name!($variant $(, $optype)?))),*];

            /// The attribute names of a modeled op, in declaration order; `None` when
            /// `op_type` is not modeled in `domain` (`""` and `ai.onnx` are the default domain).
            pub fn attr_names(domain: &str, op_type: &str) -> Option<&'static [&'static str]> {
                match (default_domain(domain), op_type) {
                    $((op_domain!($($domain)?), op_name!($variant $(, $optype)?)) => Some(&[$(attr_name!($field $(, $aname)?)),*]),)*
                    _ => None,
                }
            }

            /// The default of attribute `name` of a modeled op, when the op table gives one
            /// (it leaves out defaults that depend on the opset or the operands).
            pub fn attr_default(domain: &str, op_type: &str, name: &str) -> Option<Attr> {
                match (default_domain(domain), op_type) {
                    $(
                        (op_domain!($($domain)?), op_name!($variant $(, $optype)?)) => {
                            let defaults: [(&str, Option<Attr>); 0 $(+ { let _ = stringify!($field); 1 })*] =
                                [$((attr_name!($field $(, $aname)?), attr_default!($fty $(, $default)?))),*];
                            defaults.into_iter().find(|(n, _)| *n == name).and_then(|(_, d)| d)
                        }
                    )*
                    _ => None,
                }
            }

            /// The op's kind.
            pub fn kind(&self) -> OpKind {
                match self {
                    $(Op::$variant { .. } => OpKind::$variant,)*
                    Op::Custom(_) => OpKind::Custom,
                }
            }

            /// Operand and result counts; `None` for [`Op::Custom`].
            pub fn arity(&self) -> Option<Arity> {
                match self {
                    $(Op::$variant { .. } => Some(Arity {
                        min_inputs: $imin,
                        max_inputs: arity_max!($imin $(, $imax)?),
                        min_outputs: $omin,
                        max_outputs: arity_max!($omin $(, $omax)?),
                    }),)*
                    Op::Custom(_) => None,
                }
            }

            /// The op's properties (none for [`Op::Custom`]).
            pub fn properties(&self) -> &'static [OpProperty] {
                match self {
                    $(Op::$variant { .. } => &[$($(prop!($prop)),*)?],)*
                    Op::Custom(_) => &[],
                }
            }

            /// The operator type (ONNX `op_type`).
            pub fn op_type(&self) -> &str {
                match self {
                    $(Op::$variant { .. } => op_name!($variant $(, $optype)?),)*
                    Op::Custom(c) => &c.op_type,
                }
            }

            /// The operator domain (`""` for the default domain).
            pub fn domain(&self) -> &str {
                match self {
                    $(Op::$variant { .. } => op_domain!($($domain)?),)*
                    Op::Custom(c) => &c.domain,
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

            /// The typed op for `op_type` in `domain` (`""` for the default domain), when it
            /// is modeled and every attribute fits a typed field.
            fn typed(domain: &str, op_type: &str, attrs: &[(String, Attr)]) -> Option<Op> {
                match (domain, op_type) {
                    $(
                        (op_domain!($($domain)?), op_name!($variant $(, $optype)?)) => {
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

/// `""` for the default domain's two names (`""` and `ai.onnx`), else `domain`.
fn default_domain(domain: &str) -> &str {
    if domain == "ai.onnx" { "" } else { domain }
}

impl Op {
    /// Builds the op for a node: typed when modeled, else [`Op::Custom`]. The domains `""` and
    /// `ai.onnx` are the same default domain.
    pub fn from_parts(domain: &str, op_type: &str, attrs: Vec<(String, Attr)>) -> Op {
        if let Some(op) = Op::typed(default_domain(domain), op_type, &attrs) {
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

    /// Attribute `name`: its value when set, else its ONNX default from the op table.
    pub fn attr(&self, name: &str) -> Option<Attr> {
        self.attrs()
            .into_iter()
            .find(|(n, _)| *n == name)
            .map(|(_, a)| a)
            .or_else(|| {
                if self.is_custom() {
                    None
                } else {
                    Op::attr_default(self.domain(), self.op_type(), name)
                }
            })
    }

    /// [`Op::attr`] as a typed value (`None` when absent without a default, or of another
    /// kind).
    pub fn get<T: AttrValue>(&self, name: &str) -> Option<T> {
        T::from_attr(&self.attr(name)?)
    }

    /// `epsilon` of a normalization, set or defaulted (1e-5 for every norm ONNX defines).
    pub fn epsilon(&self) -> Option<f32> {
        self.get("epsilon")
    }

    /// Whether the op has property `p`.
    pub fn has(&self, p: OpProperty) -> bool {
        self.properties().contains(&p)
    }

    /// [`OpProperty::Elementwise`].
    pub fn is_elementwise(&self) -> bool {
        self.has(OpProperty::Elementwise)
    }

    /// [`OpProperty::Commutative`].
    pub fn is_commutative(&self) -> bool {
        self.has(OpProperty::Commutative)
    }

    /// [`OpProperty::Layout`].
    pub fn is_layout(&self) -> bool {
        self.has(OpProperty::Layout)
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
    Add [2 -> 1] (elementwise, commutative) {}
    /// `a - b`.
    Sub [2 -> 1] (elementwise) {}
    /// `a * b`.
    Mul [2 -> 1] (elementwise, commutative) {}
    /// `a / b` (integer division truncates).
    Div [2 -> 1] (elementwise) {}
    /// `a ^ b`.
    Pow [2 -> 1] (elementwise) {}
    /// Remainder; `fmod = 1` gives C `fmod` semantics.
    Mod [2 -> 1] (elementwise) { fmod: i64 = 0 }
    /// Elementwise minimum of all inputs.
    Min [1..* -> 1] (elementwise, commutative) {}
    /// Elementwise maximum of all inputs.
    Max [1..* -> 1] (elementwise, commutative) {}
    /// Elementwise sum of all inputs.
    Sum [1..* -> 1] (elementwise, commutative) {}
    /// Elementwise mean of all inputs.
    Mean [1..* -> 1] (elementwise, commutative) {}
    /// Bit shift by `direction` (`LEFT` or `RIGHT`).
    BitShift [2 -> 1] (elementwise) { direction: String }
    /// Bitwise and.
    BitwiseAnd [2 -> 1] (elementwise, commutative) {}
    /// Bitwise or.
    BitwiseOr [2 -> 1] (elementwise, commutative) {}
    /// Bitwise xor.
    BitwiseXor [2 -> 1] (elementwise, commutative) {}
    /// Bitwise not.
    BitwiseNot [1 -> 1] (elementwise) {}
    // ---- comparison and logic ----
    /// `a == b` → bool.
    Equal [2 -> 1] (elementwise, commutative) {}
    /// `a < b` → bool.
    Less [2 -> 1] (elementwise) {}
    /// `a > b` → bool.
    Greater [2 -> 1] (elementwise) {}
    /// `a <= b` → bool.
    LessOrEqual [2 -> 1] (elementwise) {}
    /// `a >= b` → bool.
    GreaterOrEqual [2 -> 1] (elementwise) {}
    /// Logical and.
    And [2 -> 1] (elementwise, commutative) {}
    /// Logical or.
    Or [2 -> 1] (elementwise, commutative) {}
    /// Logical xor.
    Xor [2 -> 1] (elementwise, commutative) {}
    /// Logical not.
    Not [1 -> 1] (elementwise) {}
    /// `cond ? a : b` with broadcasting.
    Where [3 -> 1] (elementwise) {}
    /// NaN test → bool.
    IsNaN [1 -> 1] (elementwise) {}
    /// Infinity test → bool.
    IsInf [1 -> 1] (elementwise) { detect_negative: i64 = 1, detect_positive: i64 = 1 }
    // ---- elementwise unary math ----
    /// `-x`.
    Neg [1 -> 1] (elementwise) {}
    /// `|x|`.
    Abs [1 -> 1] (elementwise) {}
    /// Square root.
    Sqrt [1 -> 1] (elementwise) {}
    /// `e^x`.
    Exp [1 -> 1] (elementwise) {}
    /// Natural logarithm.
    Log [1 -> 1] (elementwise) {}
    /// `1 / x`.
    Reciprocal [1 -> 1] (elementwise) {}
    /// Round down.
    Floor [1 -> 1] (elementwise) {}
    /// Round up.
    Ceil [1 -> 1] (elementwise) {}
    /// Round half to even.
    Round [1 -> 1] (elementwise) {}
    /// Sign (-1, 0, 1).
    Sign [1 -> 1] (elementwise) {}
    /// Sine.
    Sin [1 -> 1] (elementwise) {}
    /// Cosine.
    Cos [1 -> 1] (elementwise) {}
    /// Tangent.
    Tan [1 -> 1] (elementwise) {}
    /// Arcsine.
    Asin [1 -> 1] (elementwise) {}
    /// Arccosine.
    Acos [1 -> 1] (elementwise) {}
    /// Arctangent.
    Atan [1 -> 1] (elementwise) {}
    /// Hyperbolic sine.
    Sinh [1 -> 1] (elementwise) {}
    /// Hyperbolic cosine.
    Cosh [1 -> 1] (elementwise) {}
    /// Inverse hyperbolic sine.
    Asinh [1 -> 1] (elementwise) {}
    /// Inverse hyperbolic cosine.
    Acosh [1 -> 1] (elementwise) {}
    /// Inverse hyperbolic tangent.
    Atanh [1 -> 1] (elementwise) {}
    /// Hyperbolic tangent.
    Tanh [1 -> 1] (elementwise) {}
    /// Logistic sigmoid.
    Sigmoid [1 -> 1] (elementwise) {}
    /// Error function.
    Erf [1 -> 1] (elementwise) {}
    /// The input, unchanged.
    Identity [1 -> 1] (elementwise, layout) {}
    /// Clamp to `[min, max]` (inputs from opset 11; attributes before).
    Clip [1..3 -> 1] (elementwise) { min: f32, max: f32 }
    // ---- activations ----
    /// `max(x, 0)`.
    Relu [1 -> 1] (elementwise) {}
    /// `x < 0 ? alpha * x : x` (alpha default 0.01).
    LeakyRelu [1 -> 1] (elementwise) { alpha: f32 = 0.01 }
    /// Exponential linear unit (alpha default 1).
    Elu [1 -> 1] (elementwise) { alpha: f32 = 1.0 }
    /// Scaled ELU.
    Selu [1 -> 1] (elementwise) { alpha: f32 = 1.6732631921768188, gamma: f32 = 1.0507010221481323 }
    /// Continuously differentiable ELU.
    Celu [1 -> 1] (elementwise) { alpha: f32 = 1.0 }
    /// GELU; `approximate` is `none` (erf) or `tanh`.
    Gelu [1 -> 1] (elementwise) { approximate: String = "none" }
    /// `max(0, min(1, alpha * x + beta))`.
    HardSigmoid [1 -> 1] (elementwise) { alpha: f32 = 0.2, beta: f32 = 0.5 }
    /// `x * hard_sigmoid(x)` with alpha 1/6, beta 0.5.
    HardSwish [1 -> 1] (elementwise) {}
    /// `ln(1 + e^x)`.
    Softplus [1 -> 1] (elementwise) {}
    /// `x / (1 + |x|)`.
    Softsign [1 -> 1] (elementwise) {}
    /// Leaky ReLU with a learned slope input.
    PRelu [2 -> 1] (elementwise) {}
    /// `x * tanh(softplus(x))`.
    Mish [1 -> 1] (elementwise) {}
    /// `x > alpha ? x : 0`.
    ThresholdedRelu [1 -> 1] (elementwise) { alpha: f32 = 1.0 }
    /// `x * sigmoid(alpha * x)`.
    Swish [1 -> 1] (elementwise) { alpha: f32 = 1.0 }
    // ---- linear algebra and convolution ----
    /// Matrix product with numpy batching.
    MatMul [2 -> 1] {}
    /// Integer matrix product with zero points.
    MatMulInteger [2..4 -> 1] {}
    /// `alpha * op(A) * op(B) + beta * C`.
    Gemm [2..3 -> 1] { alpha: f32 = 1.0, beta: f32 = 1.0, trans_a: i64 as "transA" = 0, trans_b: i64 as "transB" = 0 }
    /// N-d convolution (NCHW).
    Conv [2..3 -> 1] { auto_pad: String = "NOTSET", dilations: Vec<i64>, group: i64 = 1, kernel_shape: Vec<i64>, pads: Vec<i64>, strides: Vec<i64> }
    /// Integer convolution with zero points.
    ConvInteger [2..4 -> 1] { auto_pad: String = "NOTSET", dilations: Vec<i64>, group: i64 = 1, kernel_shape: Vec<i64>, pads: Vec<i64>, strides: Vec<i64> }
    /// Transposed convolution.
    ConvTranspose [2..3 -> 1] { auto_pad: String = "NOTSET", dilations: Vec<i64>, group: i64 = 1, kernel_shape: Vec<i64>, output_padding: Vec<i64>, output_shape: Vec<i64>, pads: Vec<i64>, strides: Vec<i64> }
    /// Quantized convolution (x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, bias).
    QLinearConv [8..9 -> 1] { auto_pad: String = "NOTSET", dilations: Vec<i64>, group: i64 = 1, kernel_shape: Vec<i64>, pads: Vec<i64>, strides: Vec<i64> }
    /// Quantized matrix product.
    QLinearMatMul [8 -> 1] {}
    /// Einstein summation.
    Einsum [1..* -> 1] { equation: String }
    // ---- pooling ----
    /// Max pooling; optional second output holds indices.
    MaxPool [1 -> 1..2] { auto_pad: String = "NOTSET", ceil_mode: i64 = 0, dilations: Vec<i64>, kernel_shape: Vec<i64>, pads: Vec<i64>, storage_order: i64 = 0, strides: Vec<i64> }
    /// Average pooling.
    AveragePool [1 -> 1] { auto_pad: String = "NOTSET", ceil_mode: i64 = 0, count_include_pad: i64 = 0, dilations: Vec<i64>, kernel_shape: Vec<i64>, pads: Vec<i64>, strides: Vec<i64> }
    /// Lp pooling.
    LpPool [1 -> 1] { auto_pad: String = "NOTSET", ceil_mode: i64 = 0, dilations: Vec<i64>, kernel_shape: Vec<i64>, p: i64 = 2, pads: Vec<i64>, strides: Vec<i64> }
    /// Mean over all spatial axes (keeps them as size 1).
    GlobalAveragePool [1 -> 1] {}
    /// Max over all spatial axes.
    GlobalMaxPool [1 -> 1] {}
    /// Lp norm over all spatial axes.
    GlobalLpPool [1 -> 1] { p: i64 = 2 }
    // ---- normalization ----
    /// Batch normalization (inference form unless `training_mode = 1`).
    BatchNormalization [5 -> 1..5] { epsilon: f32 = 1e-5, momentum: f32 = 0.9, training_mode: i64 = 0, spatial: i64, is_test: i64 }
    /// Layer normalization over axes `axis..rank`.
    LayerNormalization [2..3 -> 1..3] { axis: i64 = -1, epsilon: f32 = 1e-5, stash_type: i64 = 1 }
    /// Instance normalization.
    InstanceNormalization [3 -> 1] { epsilon: f32 = 1e-5 }
    /// Group normalization.
    GroupNormalization [3 -> 1] { epsilon: f32 = 1e-5, num_groups: i64, stash_type: i64 = 1 }
    /// RMS normalization over axes `axis..rank`.
    RMSNormalization [2 -> 1] { axis: i64 = -1, epsilon: f32 = 1e-5, stash_type: i64 = 1 }
    /// Lp normalization along `axis`.
    LpNormalization [1 -> 1] { axis: i64 = -1, p: i64 = 2 }
    /// Local response normalization.
    LRN [1 -> 1] { alpha: f32 = 0.0001, beta: f32 = 0.75, bias: f32 = 1.0, size: i64 }
    /// Mean-variance normalization over `axes`.
    MeanVarianceNormalization [1 -> 1] { axes: Vec<i64> }
    // ---- reductions (axes attribute before opset 18, input after; ReduceSum from 13) ----
    /// Sum.
    ReduceSum [1..2 -> 1] { axes: Vec<i64>, keepdims: i64 = 1, noop_with_empty_axes: i64 = 0 }
    /// Mean.
    ReduceMean [1..2 -> 1] { axes: Vec<i64>, keepdims: i64 = 1, noop_with_empty_axes: i64 = 0 }
    /// Maximum.
    ReduceMax [1..2 -> 1] { axes: Vec<i64>, keepdims: i64 = 1, noop_with_empty_axes: i64 = 0 }
    /// Minimum.
    ReduceMin [1..2 -> 1] { axes: Vec<i64>, keepdims: i64 = 1, noop_with_empty_axes: i64 = 0 }
    /// Product.
    ReduceProd [1..2 -> 1] { axes: Vec<i64>, keepdims: i64 = 1, noop_with_empty_axes: i64 = 0 }
    /// L1 norm.
    ReduceL1 [1..2 -> 1] { axes: Vec<i64>, keepdims: i64 = 1, noop_with_empty_axes: i64 = 0 }
    /// L2 norm.
    ReduceL2 [1..2 -> 1] { axes: Vec<i64>, keepdims: i64 = 1, noop_with_empty_axes: i64 = 0 }
    /// Log of sum.
    ReduceLogSum [1..2 -> 1] { axes: Vec<i64>, keepdims: i64 = 1, noop_with_empty_axes: i64 = 0 }
    /// Log of sum of exponentials.
    ReduceLogSumExp [1..2 -> 1] { axes: Vec<i64>, keepdims: i64 = 1, noop_with_empty_axes: i64 = 0 }
    /// Sum of squares.
    ReduceSumSquare [1..2 -> 1] { axes: Vec<i64>, keepdims: i64 = 1, noop_with_empty_axes: i64 = 0 }
    /// Index of the maximum along `axis` (i64).
    ArgMax [1 -> 1] { axis: i64 = 0, keepdims: i64 = 1, select_last_index: i64 = 0 }
    /// Index of the minimum along `axis` (i64).
    ArgMin [1 -> 1] { axis: i64 = 0, keepdims: i64 = 1, select_last_index: i64 = 0 }
    /// Softmax along `axis` (before opset 13: over the flattened axes `axis..`).
    Softmax [1 -> 1] { axis: i64 }
    /// Log-softmax along `axis`.
    LogSoftmax [1 -> 1] { axis: i64 }
    /// One-hot of the maximum along `axis`.
    Hardmax [1 -> 1] { axis: i64 }
    /// Cumulative sum along the axis input.
    CumSum [2 -> 1] { exclusive: i64 = 0, reverse: i64 = 0 }
    /// The `k` largest (or smallest) elements and their indices.
    TopK [1..2 -> 2] { axis: i64 = -1, largest: i64 = 1, sorted: i64 = 1 }
    // ---- shape and indexing ----
    /// The shape as a 1-d i64 tensor, optionally sliced by `start..end`.
    Shape [1 -> 1] { start: i64 = 0, end: i64 }
    /// Number of elements as an i64 scalar.
    Size [1 -> 1] {}
    /// Gather along `axis`.
    Gather [2 -> 1] { axis: i64 = 0 }
    /// Gather elements along `axis` (`take_along_axis`).
    GatherElements [2 -> 1] { axis: i64 = 0 }
    /// Gather slices by N-d indices.
    GatherND [2 -> 1] { batch_dims: i64 = 0 }
    /// Scatter slices by N-d indices.
    ScatterND [3 -> 1] { reduction: String = "none" }
    /// Scatter elements along `axis`.
    ScatterElements [3 -> 1] { axis: i64 = 0, reduction: String = "none" }
    /// Slice by inputs (starts, ends, axes, steps); attributes before opset 10.
    Slice [1..5 -> 1] { starts: Vec<i64>, ends: Vec<i64>, axes: Vec<i64> }
    /// Concatenate along `axis`.
    Concat [1..* -> 1] { axis: i64 }
    /// Split along `axis` by the `split` input (attribute before opset 13) or into `num_outputs`.
    Split [1..2 -> 1..*] { axis: i64 = 0, num_outputs: i64, split: Vec<i64> }
    /// Reshape to the shape input (0 copies the input dim unless `allowzero`, -1 infers).
    Reshape [2 -> 1] (layout) { allowzero: i64 = 0 }
    /// Broadcast to the shape input.
    Expand [2 -> 1] {}
    /// Remove size-1 axes (axes input from opset 13, attribute before).
    Squeeze [1..2 -> 1] (layout) { axes: Vec<i64> }
    /// Insert size-1 axes (axes input from opset 13, attribute before).
    Unsqueeze [1..2 -> 1] (layout) { axes: Vec<i64> }
    /// Reshape to 2-d at `axis`.
    Flatten [1 -> 1] (layout) { axis: i64 = 1 }
    /// Permute axes (`perm` default: reverse).
    Transpose [1 -> 1] (layout) { perm: Vec<i64> }
    /// `[start, limit)` by `delta`.
    Range [3 -> 1] {}
    /// Repeat along each axis.
    Tile [2 -> 1] {}
    /// Pad (pads input from opset 11, attributes before).
    Pad [1..4 -> 1] { mode: String = "constant", pads: Vec<i64>, value: f32 }
    /// Resize by scales or sizes.
    Resize [1..4 -> 1] { antialias: i64 = 0, axes: Vec<i64>, coordinate_transformation_mode: String = "half_pixel", cubic_coeff_a: f32 = -0.75, exclude_outside: i64 = 0, extrapolation_value: f32 = 0.0, keep_aspect_ratio_policy: String = "stretch", mode: String = "nearest", nearest_mode: String = "round_prefer_floor" }
    /// Convert the element type to `to`.
    Cast [1 -> 1] (elementwise) { round_mode: String, saturate: i64 = 1, to: i64 }
    /// Convert the element type to that of the second input.
    CastLike [2 -> 1] (elementwise) { round_mode: String, saturate: i64 = 1 }
    /// A tensor of the shape input filled with `value` (default f32 zero).
    ConstantOfShape [1 -> 1] { value: Const }
    /// A constant; exactly one attribute is set.
    Constant [0 -> 1] { value: Const, value_float: f32, value_floats: Vec<f32>, value_int: i64, value_ints: Vec<i64>, value_string: String, value_strings: Vec<String> }
    /// Identity at inference; optional mask output.
    Dropout [1..3 -> 1..2] { seed: i64, ratio: f32 = 0.5, is_test: i64 }
    /// Indices of non-zero elements, shape `[rank, n]`.
    NonZero [1 -> 1] {}
    /// Upper or lower triangle.
    Trilu [1..2 -> 1] { upper: i64 = 1 }
    /// Rearrange depth into blocks of space.
    DepthToSpace [1 -> 1] { blocksize: i64, mode: String = "DCR" }
    /// Rearrange blocks of space into depth.
    SpaceToDepth [1 -> 1] { blocksize: i64 }
    /// One-hot encoding along `axis`.
    OneHot [3 -> 1] { axis: i64 = -1 }
    // ---- quantization ----
    /// `saturate(round(x / scale) + zero_point)`; per-tensor, per-axis or per-block.
    QuantizeLinear [2..3 -> 1] { axis: i64 = 1, block_size: i64 = 0, output_dtype: i64 = 0, precision: i64, saturate: i64 = 1 }
    /// `(x - zero_point) * scale`; per-tensor, per-axis or per-block.
    DequantizeLinear [2..3 -> 1] { axis: i64 = 1, block_size: i64 = 0, output_dtype: i64 = 0 }
    /// Dynamic u8 quantization with computed scale and zero point.
    DynamicQuantizeLinear [1 -> 3] {}
    // ---- attention ----
    /// Scaled dot-product attention (opset 23; sliding windows from opset 25).
    Attention [3..7 -> 1..4] { is_causal: i64 = 0, kv_num_heads: i64, left_window_size: i64, q_num_heads: i64, qk_matmul_output_mode: i64 = 0, right_window_size: i64, scale: f32, softcap: f32 = 0.0, softmax_precision: i64 = 0 }
    /// Rotary position embedding (opset 23).
    RotaryEmbedding [3..4 -> 1] { interleaved: i64 = 0, num_heads: i64, rotary_embedding_dim: i64 }
    // ---- control flow ----
    /// Runs `then_branch` or `else_branch`.
    If [1 -> 1..*] { then_branch: GraphId, else_branch: GraphId }
    /// Runs `body` while the condition holds, up to the trip count.
    Loop [2..* -> 0..*] { body: GraphId }
    /// Runs `body` over slices of the scan inputs.
    Scan [0..* -> 1..*] { body: GraphId, num_scan_inputs: i64, scan_input_axes: Vec<i64>, scan_input_directions: Vec<i64>, scan_output_axes: Vec<i64>, scan_output_directions: Vec<i64> }
    // ---- optional and sequence ----
    /// Wraps a value (or nothing, with `type`) as an optional.
    Optional [0..1 -> 1] { r#type: Type as "type" }
    /// `OptionalHasElement`: whether the optional (or tensor) input holds a value.
    OptionalHasElement [0..1 -> 1] {}
    /// The value inside an optional (a tensor or sequence passes through).
    OptionalGetElement [1 -> 1] {}
    /// An empty sequence of `dtype` tensors (default f32).
    SequenceEmpty [0 -> 1] { dtype: i64 }
    /// A sequence of the inputs.
    SequenceConstruct [1..* -> 1] {}
    /// Number of tensors in a sequence (i64 scalar).
    SequenceLength [1 -> 1] {}
    /// The tensor at a position of a sequence.
    SequenceAt [2 -> 1] {}
    /// A sequence with a tensor inserted (at the end by default).
    SequenceInsert [2..3 -> 1] {}
    /// A sequence with a tensor removed (the last by default).
    SequenceErase [1..2 -> 1] {}
    /// Splits a tensor into a sequence along `axis`.
    SplitToSequence [1..2 -> 1] { axis: i64 = 0, keepdims: i64 = 1 }
    /// Concatenates (or stacks, `new_axis`) a sequence along `axis`.
    ConcatFromSequence [1 -> 1] { axis: i64, new_axis: i64 = 0 }
    /// Runs `body` over the elements of sequences.
    SequenceMap [1..* -> 1..*] { body: GraphId }
    // ---- recurrent ----
    /// Elman RNN over a sequence: all hidden states and the last.
    RNN [3..6 -> 0..2] { activation_alpha: Vec<f32>, activation_beta: Vec<f32>, activations: Vec<String>, clip: f32, direction: String = "forward", hidden_size: i64, layout: i64 = 0, output_sequence: i64 }
    /// GRU over a sequence: all hidden states and the last.
    GRU [3..6 -> 0..2] { activation_alpha: Vec<f32>, activation_beta: Vec<f32>, activations: Vec<String>, clip: f32, direction: String = "forward", hidden_size: i64, layout: i64 = 0, linear_before_reset: i64 = 0, output_sequence: i64 }
    /// LSTM over a sequence: all hidden states, the last hidden state and the last cell.
    LSTM [3..8 -> 0..3] { activation_alpha: Vec<f32>, activation_beta: Vec<f32>, activations: Vec<String>, clip: f32, direction: String = "forward", hidden_size: i64, input_forget: i64 = 0, layout: i64 = 0, output_sequence: i64 }
    // ---- the long tail ----
    /// Cumulative product along the axis input.
    CumProd [2 -> 1] { exclusive: i64 = 0, reverse: i64 = 0 }
    /// The slices along `axis` (or elements of the flattened input) where the condition holds.
    Compress [2 -> 1] { axis: i64 }
    /// A 2-D tensor with ones on the `k`-th diagonal, of the input's shape.
    EyeLike [1 -> 1] { dtype: i64, k: i64 = 0 }
    /// `x < -lambd ? x + bias : x > lambd ? x - bias : 0`.
    Shrink [1 -> 1] (elementwise) { bias: f32 = 0.0, lambd: f32 = 0.5 }
    /// Reverses each batch entry's first `sequence_lens` steps along `time_axis`.
    ReverseSequence [2 -> 1] { batch_axis: i64 = 1, time_axis: i64 = 0 }
    /// Determinant of the last two (square) axes.
    Det [1 -> 1] {}
    /// A Hann window of the size input.
    HannWindow [1 -> 1] { output_datatype: i64 = 1, periodic: i64 = 1 }
    /// A Hamming window of the size input.
    HammingWindow [1 -> 1] { output_datatype: i64 = 1, periodic: i64 = 1 }
    /// A Blackman window of the size input.
    BlackmanWindow [1 -> 1] { output_datatype: i64 = 1, periodic: i64 = 1 }
    /// String concatenation with broadcasting.
    StringConcat [2 -> 1] (elementwise) {}
    /// Splits each string by `delimiter`: the substrings (padded) and their counts.
    StringSplit [1 -> 2] { delimiter: String, maxsplit: i64 }
    /// Unique elements (or slices along `axis`) with indices, inverse indices and counts.
    Unique [1 -> 1..4] { axis: i64, sorted: i64 = 1 }
    /// Center crop or pad to the shape input along `axes`.
    CenterCropPad [2 -> 1] { axes: Vec<i64> }
    /// Rearranges column blocks back into an image (the inverse of im2col).
    Col2Im [3 -> 1] { dilations: Vec<i64>, pads: Vec<i64>, strides: Vec<i64> }
    /// Discrete Fourier transform (axis attribute before opset 20, input after).
    DFT [1..3 -> 1] { axis: i64, inverse: i64 = 0, onesided: i64 = 0 }
    /// Short-time Fourier transform.
    STFT [2..4 -> 1] { onesided: i64 = 1 }
    /// Selected box indices `[n, 3]` (batch, class, box) by IoU suppression.
    NonMaxSuppression [2..5 -> 1] { center_point_box: i64 = 0 }
    /// Samples the input at the grid's coordinates (mode names changed in opset 20).
    GridSample [2 -> 1] { align_corners: i64 = 0, mode: String, padding_mode: String = "zeros" }
    /// Case change and stop-word removal on strings.
    StringNormalizer [1 -> 1] { case_change_action: String = "NONE", is_case_sensitive: i64 = 0, locale: String, stopwords: Vec<String> }
    /// `a * sigmoid(alpha * a) * b`.
    SwiGLU [2 -> 1] (elementwise) { alpha: f32 = 1.0 }
    /// Writes updates into a cache tensor along `axis` at per-batch positions.
    TensorScatter [2..3 -> 1] { axis: i64 = -2, mode: String = "linear" }
    /// Scatters pooled values back to their max positions.
    MaxUnpool [2..3 -> 1] { kernel_shape: Vec<i64>, pads: Vec<i64>, strides: Vec<i64> }
    /// n-gram counts (TF, IDF or TF-IDF) of integer or string sequences.
    TfIdfVectorizer [1 -> 1] { max_gram_length: i64, max_skip_count: i64, min_gram_length: i64, mode: String, ngram_counts: Vec<i64>, ngram_indexes: Vec<i64>, pool_int64s: Vec<i64>, pool_strings: Vec<String>, weights: Vec<f32> }
    /// Mel filter bank weights `[dft_length / 2 + 1, num_mel_bins]`.
    MelWeightMatrix [5 -> 1] { output_datatype: i64 = 1 }
    /// Region-of-interest align: `[num_rois, C, output_height, output_width]`.
    RoiAlign [3 -> 1] { coordinate_transformation_mode: String = "half_pixel", mode: String = "avg", output_height: i64 = 1, output_width: i64 = 1, sampling_ratio: i64 = 0, spatial_scale: f32 = 1.0 }
    /// Negative log-likelihood loss.
    NegativeLogLikelihoodLoss [2..3 -> 1] { ignore_index: i64, reduction: String = "mean" }
    /// Softmax cross-entropy loss, and optionally the log-probabilities.
    SoftmaxCrossEntropyLoss [2..3 -> 1..2] { ignore_index: i64, reduction: String = "mean" }
    /// Reinterprets the bits of the input as `to`.
    BitCast [1 -> 1] { to: i64 }
    /// Sampling grids from affine matrices `[N, 2, 3]` (2-D) or `[N, 3, 4]` (3-D).
    AffineGrid [2 -> 1] { align_corners: i64 = 0 }
    /// Upsampling by scales (input from opset 9, attribute before); `Resize` replaced it.
    Upsample [1..2 -> 1] { mode: String = "nearest", scales: Vec<f32> }
    /// `ScatterElements` before opset 11.
    Scatter [3 -> 1] { axis: i64 = 0 }
    // ---- ONNX Runtime's own ops (contrib schemas of ONNX Runtime 1.2x) ----
    /// RMS normalization over axes `axis..rank`, which ONNX Runtime registers in the default
    /// domain; the optional second result is the inverse RMS.
    SimplifiedLayerNormalization [2 -> 1..2] { axis: i64 = -1, epsilon: f32 = 1e-5, stash_type: i64 = 1 }
    /// `x * Φ(x)` (erf form).
    MsGelu in "com.microsoft" as "Gelu" [1 -> 1] (elementwise) {}
    /// GELU in its tanh form, with an optional bias added first.
    FastGelu in "com.microsoft" [1..2 -> 1] {}
    /// GELU (erf form) of `x + bias`.
    BiasGelu in "com.microsoft" [2 -> 1] {}
    /// `x * sigmoid(alpha * x)`.
    QuickGelu in "com.microsoft" [1 -> 1] (elementwise) { alpha: f32 = 1.702 }
    /// `x + skip (+ bias)`, then layer normalization over the last axis; results: output,
    /// mean, inverse standard deviation, the sum.
    SkipLayerNormalization in "com.microsoft" [3..5 -> 1..4] { epsilon: f32 = 1e-12 }
    /// `x + skip (+ bias)`, then RMS normalization over the last axis; results as
    /// `SkipLayerNormalization`'s.
    SkipSimplifiedLayerNormalization in "com.microsoft" [3..4 -> 1..4] { epsilon: f32 = 1e-12 }
    /// `Conv` followed by `activation` (with `activation_params`).
    FusedConv in "com.microsoft" [2..4 -> 1] { auto_pad: String = "NOTSET", dilations: Vec<i64>, group: i64 = 1, kernel_shape: Vec<i64>, pads: Vec<i64>, strides: Vec<i64>, activation: String, activation_params: Vec<f32> }
    /// `Gemm` followed by `activation` (with up to three parameters).
    FusedGemm in "com.microsoft" [2..3 -> 1] { alpha: f32 = 1.0, beta: f32 = 1.0, trans_a: i64 as "transA" = 0, trans_b: i64 as "transB" = 0, activation: String, activation_alpha: f32, activation_beta: f32, activation_gamma: f32 }
    /// `alpha * op(A) · op(B)` with optional transposes of the last two axes (or the batch).
    FusedMatMul in "com.microsoft" [2 -> 1] { alpha: f32 = 1.0, trans_a: i64 as "transA" = 0, trans_b: i64 as "transB" = 0, trans_batch_a: i64 as "transBatchA" = 0, trans_batch_b: i64 as "transBatchB" = 0 }
    /// `A · dequant(B)ᵀ (+ bias)`, B packed in `bits`-bit codes in blocks along K.
    MatMulNBits in "com.microsoft" [3..6 -> 1] { k: i64 as "K", n: i64 as "N", bits: i64 = 4, block_size: i64, accuracy_level: i64 = 0, weight_prepacked: i64 = 0 }
    /// Attention over separate (or packed) query, key and value with optional bias, masks
    /// and past; results: output, present key, present value, QK.
    MultiHeadAttention in "com.microsoft" [1..10 -> 1..4] { num_heads: i64, scale: f32, mask_filter_value: f32, unidirectional: i64 = 0 }
    /// Grouped-query attention with a KV cache, optional rotary embedding and local window.
    GroupQueryAttention in "com.microsoft" [7..17 -> 1..4] { causal: i64 = 1, do_rotary: i64, k_norm_epsilon: f32, k_quant_type: String = "NONE", kv_cache_bit_width: i64, kv_num_heads: i64, local_window_size: i64 = -1, num_heads: i64, q_norm_epsilon: f32, qk_norm_epsilon: f32, qk_output: i64 = 0, rotary_interleaved: i64, scale: f32, sliding_window_cache: i64 = 0, smooth_softmax: i64 = -1, softcap: f32, v_quant_type: String = "NONE" }
    /// Attention with the QKV projection inside: input `[B, S, D]`, packed weights and bias.
    MsAttention in "com.microsoft" as "Attention" [2..7 -> 1..2] { do_rotary: i64, mask_filter_value: f32, num_heads: i64, past_present_share_buffer: i64, qkv_hidden_sizes: Vec<i64>, rotary_embedding_dim: i64, scale: f32, unidirectional: i64 = 0 }
    /// Rotary embedding by position ids and cos/sin caches.
    MsRotaryEmbedding in "com.microsoft" as "RotaryEmbedding" [4 -> 1] { interleaved: i64, is_packed_batching: i64, num_heads: i64, rotary_embedding_dim: i64, scale: f32 }
    // ---- mmq's TensorRT plugins ([`crate::plugin`] holds their interface) ----
    /// `QuantizeLinear` to int8 with zero points.
    MmqQuantize in "mmq.trt" [2..3 -> 1] { plugin_namespace: String, plugin_version: String, axis: i64 = 1, block_size: i64 = 0 }
    /// `DequantizeLinear` of int8 with zero points.
    MmqDequantize in "mmq.trt" [2..3 -> 1] { plugin_namespace: String, plugin_version: String, axis: i64 = 1, block_size: i64 = 0 }
    /// Run-time symmetric int8 quantization in blocks along the last axis: codes and scales.
    MmqDynamicQuantize in "mmq.trt" [1 -> 2] { plugin_namespace: String, plugin_version: String, block_size: i64 = 0 }
    /// INT4 group GEMM in `MatMulNBits`' layout.
    MmqMatMulNBits in "mmq.trt" [4..5 -> 1] { plugin_namespace: String, plugin_version: String, k: i64 as "K", n: i64 as "N", bits: i64 = 4, block_size: i64 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_modeled_op_has_one_kind_that_names_it() {
        assert_eq!(OpKind::MODELED.len(), Op::MODELED.len());
        for (&kind, &(domain, op_type)) in OpKind::MODELED.iter().zip(Op::MODELED) {
            assert_eq!((kind.domain(), kind.op_type()), (domain, op_type));
            assert_eq!(OpKind::of(domain, op_type), kind);
            assert_eq!(Op::from_parts(domain, op_type, vec![]).kind(), kind);
        }
        assert_eq!(OpKind::of("ai.onnx", "Gelu"), OpKind::Gelu);
        assert_eq!(OpKind::of("com.microsoft", "Gelu"), OpKind::MsGelu);
        assert_eq!(OpKind::of("com.example", "Gelu"), OpKind::Custom);
        assert_eq!(
            Op::from_parts("com.example", "Gelu", vec![]).kind(),
            OpKind::Custom
        );
    }

    #[test]
    fn the_table_gives_arity() {
        let add = Op::Add {}.arity().expect("modeled");
        assert_eq!(
            (
                add.min_inputs,
                add.max_inputs,
                add.min_outputs,
                add.max_outputs
            ),
            (2, 2, 1, 1)
        );
        let split = Op::from_parts("", "Split", vec![])
            .arity()
            .expect("modeled");
        assert_eq!((split.min_inputs, split.max_inputs), (1, 2));
        assert_eq!((split.min_outputs, split.max_outputs), (1, usize::MAX));
        let fused = Op::from_parts("com.microsoft", "FusedConv", vec![]);
        assert_eq!(
            fused.arity().map(|a| (a.min_inputs, a.max_inputs)),
            Some((2, 4))
        );
        let custom = Op::from_parts("com.example", "FusedConv", vec![]);
        assert_eq!(custom.arity(), None);
    }

    #[test]
    fn the_table_gives_attribute_defaults() {
        let ln = Op::from_parts("", "LayerNormalization", vec![]);
        assert_eq!(ln.epsilon(), Some(1e-5));
        assert_eq!(ln.get::<i64>("axis"), Some(-1));
        let set = Op::from_parts(
            "",
            "LayerNormalization",
            vec![("epsilon".into(), Attr::Float(1e-6))],
        );
        assert_eq!(set.epsilon(), Some(1e-6));
        // ONNX names, not field names.
        assert_eq!(Op::attr_default("", "Gemm", "transB"), Some(Attr::Int(0)));
        assert_eq!(
            Op::attr_default("ai.onnx", "Gemm", "transB"),
            Some(Attr::Int(0))
        );
        assert_eq!(Op::attr_default("", "Gemm", "trans_b"), None);
        assert_eq!(
            Op::attr_default("", "Resize", "mode"),
            Some(Attr::String("nearest".into()))
        );
        // Defaults of other domains are their own: ONNX Runtime's SkipLayerNormalization
        // defaults to 1e-12, the standard norms to 1e-5.
        let skip = Op::from_parts("com.microsoft", "SkipLayerNormalization", vec![]);
        assert_eq!(skip.epsilon(), Some(1e-12));
        assert_eq!(
            Op::attr_default("", "SkipLayerNormalization", "epsilon"),
            None
        );
        let selu = Op::from_parts("", "Selu", vec![]);
        assert_eq!(selu.get::<f32>("alpha"), Some(1.673_263_2));
        // Opset-dependent defaults are left out: Softmax's axis was 1 before opset 13.
        assert_eq!(Op::from_parts("", "Softmax", vec![]).attr("axis"), None);
        assert_eq!(Op::from_parts("", "Relu", vec![]).epsilon(), None);
        // Every default converts back to its field: a typed op built from the defaults.
        for &(domain, op_type) in Op::MODELED {
            let names = Op::attr_names(domain, op_type).expect("modeled");
            let attrs: Vec<(String, Attr)> = names
                .iter()
                .filter_map(|n| Some(((*n).to_owned(), Op::attr_default(domain, op_type, n)?)))
                .collect();
            let op = Op::from_parts(domain, op_type, attrs);
            assert!(!op.is_custom(), "{domain}.{op_type}");
            assert_eq!((op.domain(), op.op_type()), (domain, op_type));
        }
    }

    #[test]
    fn the_table_gives_properties() {
        assert!(Op::Add {}.is_elementwise() && Op::Add {}.is_commutative());
        assert!(Op::Sub {}.is_elementwise() && !Op::Sub {}.is_commutative());
        assert!(Op::from_parts("", "Reshape", vec![]).is_layout());
        assert!(!Op::MatMul {}.is_elementwise() && !Op::MatMul {}.is_layout());
        let custom = Op::from_parts("com.example", "Gelu", vec![]);
        assert!(custom.properties().is_empty());
    }

    #[test]
    fn ops_of_other_domains_are_typed_by_domain_and_name() {
        // Same name, two domains, two ops.
        let standard = Op::from_parts("", "Gelu", vec![]);
        let contrib = Op::from_parts("com.microsoft", "Gelu", vec![]);
        assert_eq!(standard, Op::Gelu { approximate: None });
        assert_eq!(contrib, Op::MsGelu {});
        assert_eq!(
            (contrib.domain(), contrib.op_type()),
            ("com.microsoft", "Gelu")
        );
        assert_eq!(
            Op::from_parts("com.microsoft", "Attention", vec![]).op_type(),
            "Attention"
        );
        // ONNX names map to fields, in the table's order, and round-trip.
        let nbits = Op::from_parts(
            "com.microsoft",
            "MatMulNBits",
            vec![
                ("K".into(), Attr::Int(64)),
                ("N".into(), Attr::Int(8)),
                ("block_size".into(), Attr::Int(32)),
            ],
        );
        let Op::MatMulNBits {
            k, n, block_size, ..
        } = &nbits
        else {
            panic!("typed: {nbits:?}")
        };
        assert_eq!((*k, *n, *block_size), (Some(64), Some(8), Some(32)));
        assert_eq!(nbits.get::<i64>("bits"), Some(4));
        let names: Vec<&str> = nbits.attrs().iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["K", "N", "block_size"]);
        // An attribute the table does not know keeps the node opaque, in its domain.
        let odd = Op::from_parts(
            "com.microsoft",
            "MatMulNBits",
            vec![("future".into(), Attr::Int(1))],
        );
        assert!(odd.is_custom());
        assert_eq!(odd.domain(), "com.microsoft");
        // A modeled op type in a domain that does not model it stays custom.
        assert!(Op::from_parts("com.example", "MatMulNBits", vec![]).is_custom());
        assert!(Op::from_parts("", "MatMulNBits", vec![]).is_custom());
    }
}
