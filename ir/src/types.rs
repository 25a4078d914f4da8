//! Value types, interned in [`TypeTable`] so that equal types have equal [`Ty`] handles.

use std::collections::HashMap;

use crate::arena::{Arena, entity};
use crate::dim::Dim;
use crate::dtype::DType;

entity!(
    /// An interned [`Type`].
    Ty,
    "ty"
);

/// A tensor type: element type and, when the rank is known, one [`Dim`] per axis.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorType {
    /// Element type, when known.
    pub dtype: Option<DType>,
    /// Dimensions, or `None` when even the rank is unknown.
    pub shape: Option<Vec<Dim>>,
}

/// The type of a value. ONNX sequences, optionals, maps and sparse tensors are kept so that
/// every model imports losslessly, even where passes only understand tensors.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Type {
    /// Nothing is known (a value whose type inference has not run or could not decide).
    Unknown,
    /// A dense tensor.
    Tensor(TensorType),
    /// A sparse tensor (COO), typed like a dense one.
    SparseTensor(TensorType),
    /// A sequence of values of the element type.
    Sequence(Box<Type>),
    /// A value that may be absent.
    Optional(Box<Type>),
    /// A map from a key dtype to a value type (ONNX-ML).
    Map(DType, Box<Type>),
}

impl Type {
    /// A tensor type with known dtype and dims.
    pub fn tensor(dtype: DType, dims: Vec<Dim>) -> Type {
        Type::Tensor(TensorType {
            dtype: Some(dtype),
            shape: Some(dims),
        })
    }

    /// The tensor type, when this is a dense tensor.
    pub fn as_tensor(&self) -> Option<&TensorType> {
        match self {
            Type::Tensor(t) => Some(t),
            _ => None,
        }
    }

    /// The element type of a dense tensor, when known.
    pub fn dtype(&self) -> Option<DType> {
        self.as_tensor().and_then(|t| t.dtype)
    }

    /// The dims of a dense tensor, when its rank is known.
    pub fn shape(&self) -> Option<&[Dim]> {
        self.as_tensor().and_then(|t| t.shape.as_deref())
    }
}

/// Hash-consed storage of types: one [`Ty`] per distinct [`Type`].
#[derive(Clone, Debug, Default)]
pub struct TypeTable {
    arena: Arena<Ty, Type>,
    map: HashMap<Type, Ty>,
}

impl TypeTable {
    /// The handle for `ty`, adding it if new.
    pub fn intern(&mut self, ty: Type) -> Ty {
        if let Some(&t) = self.map.get(&ty) {
            return t;
        }
        let t = self.arena.push(ty.clone());
        self.map.insert(ty, t);
        t
    }

    /// The type behind a handle.
    pub fn get(&self, ty: Ty) -> &Type {
        &self.arena[ty]
    }

    /// Number of distinct types.
    pub fn len(&self) -> usize {
        self.arena.len()
    }

    /// Whether no type has been interned.
    pub fn is_empty(&self) -> bool {
        self.arena.is_empty()
    }
}

impl std::ops::Index<Ty> for TypeTable {
    type Output = Type;
    fn index(&self, ty: Ty) -> &Type {
        &self.arena[ty]
    }
}
