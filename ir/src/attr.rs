//! Generic attribute values: the form every attribute takes in ONNX and in `.mmir` text, and the
//! conversions to the typed fields of [`crate::Op`].

use crate::constant::Const;
use crate::module::GraphId;
use crate::types::Type;

/// An attribute value. Tensors and graphs are handles into the module.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    /// A 64-bit integer.
    Int(i64),
    /// A 32-bit float.
    Float(f32),
    /// A string.
    String(String),
    /// A tensor.
    Tensor(Const),
    /// A graph (the body of `If`, `Loop`, `Scan`, ...).
    Graph(GraphId),
    /// A type (ONNX `TYPE_PROTO` attributes).
    Type(Type),
    /// Integers.
    Ints(Vec<i64>),
    /// Floats.
    Floats(Vec<f32>),
    /// Strings.
    Strings(Vec<String>),
    /// Tensors.
    Tensors(Vec<Const>),
    /// Graphs.
    Graphs(Vec<GraphId>),
    /// Types.
    Types(Vec<Type>),
}

/// A Rust type that one [`Attr`] variant converts to and from.
pub trait AttrValue: Sized {
    /// The value, if `attr` has the matching variant.
    fn from_attr(attr: &Attr) -> Option<Self>;
    /// The attribute for this value.
    fn to_attr(&self) -> Attr;
}

macro_rules! attr_value {
    ($($t:ty => $v:ident),* $(,)?) => {$(
        impl AttrValue for $t {
            fn from_attr(attr: &Attr) -> Option<Self> {
                match attr {
                    Attr::$v(x) => Some(x.clone()),
                    _ => None,
                }
            }
            fn to_attr(&self) -> Attr {
                Attr::$v(self.clone())
            }
        }
    )*};
}

attr_value! {
    i64 => Int, f32 => Float, String => String, Const => Tensor, GraphId => Graph, Type => Type,
    Vec<i64> => Ints, Vec<f32> => Floats, Vec<String> => Strings, Vec<Const> => Tensors,
    Vec<GraphId> => Graphs, Vec<Type> => Types,
}

impl Attr {
    /// The graphs this attribute refers to.
    pub fn graphs(&self) -> &[GraphId] {
        match self {
            Attr::Graph(g) => std::slice::from_ref(g),
            Attr::Graphs(gs) => gs,
            _ => &[],
        }
    }

    /// The constants this attribute refers to.
    pub fn consts(&self) -> &[Const] {
        match self {
            Attr::Tensor(c) => std::slice::from_ref(c),
            Attr::Tensors(cs) => cs,
            _ => &[],
        }
    }
}
