//! `TypeProto` → [`Type`], with `dim_param` strings parsed into symbolic dim expressions.

use std::collections::HashMap;

use mmq_ir::dim::parse_dim_expr;
use mmq_ir::{DType, Dim, Module, Sym, TensorType, Type};

use crate::error::{Result, err};
use crate::proto::onnx::{TensorShapeProto, TypeProto, tensor_shape_proto::dimension, type_proto};

/// Converts types into a module, caching parsed `dim_param` strings (models repeat the same few
/// hundreds of times).
#[derive(Debug, Default)]
pub(crate) struct TypeConv {
    dims: HashMap<String, Dim>,
}

impl TypeConv {
    /// The type of the value `what` (used in error messages).
    pub fn convert(&mut self, m: &mut Module, tp: &TypeProto, what: &str) -> Result<Type> {
        use type_proto::Value;
        Ok(match &tp.value {
            None | Some(Value::OpaqueType(_)) => Type::Unknown,
            Some(Value::TensorType(t)) => {
                Type::Tensor(self.tensor(m, t.elem_type, t.shape.as_ref(), what)?)
            }
            Some(Value::SparseTensorType(t)) => {
                Type::SparseTensor(self.tensor(m, t.elem_type, t.shape.as_ref(), what)?)
            }
            Some(Value::SequenceType(s)) => {
                Type::Sequence(Box::new(self.inner(m, s.elem_type.as_deref(), what)?))
            }
            Some(Value::OptionalType(o)) => {
                Type::Optional(Box::new(self.inner(m, o.elem_type.as_deref(), what)?))
            }
            Some(Value::MapType(map)) => {
                let code = map.key_type.unwrap_or(0);
                let key = DType::from_onnx_code(code).ok_or_else(|| {
                    err!(
                        UnknownDType,
                        "value '{what}': unknown map key type code {code}"
                    )
                })?;
                Type::Map(
                    key,
                    Box::new(self.inner(m, map.value_type.as_deref(), what)?),
                )
            }
        })
    }

    fn inner(&mut self, m: &mut Module, tp: Option<&TypeProto>, what: &str) -> Result<Type> {
        match tp {
            Some(tp) => self.convert(m, tp, what),
            None => Ok(Type::Unknown),
        }
    }

    fn tensor(
        &mut self,
        m: &mut Module,
        elem: Option<i32>,
        shape: Option<&TensorShapeProto>,
        what: &str,
    ) -> Result<TensorType> {
        let dtype = match elem.unwrap_or(0) {
            0 => None,
            code => Some(DType::from_onnx_code(code).ok_or_else(|| {
                err!(
                    UnknownDType,
                    "value '{what}': unknown element type code {code}"
                )
            })?),
        };
        let shape = shape.map(|s| {
            s.dim
                .iter()
                .map(|d| self.dim(m, d.value.as_ref()))
                .collect()
        });
        Ok(TensorType { dtype, shape })
    }

    fn dim(&mut self, m: &mut Module, d: Option<&dimension::Value>) -> Dim {
        match d {
            Some(dimension::Value::DimValue(v)) if *v >= 0 => Dim::known(*v),
            Some(dimension::Value::DimParam(p)) if !is_anonymous(p) => {
                if let Some(d) = self.dims.get(p) {
                    return d.clone();
                }
                let d = param_dim(m, p);
                self.dims.insert(p.clone(), d.clone());
                d
            }
            _ => Dim::Unknown,
        }
    }
}

/// A `dim_param` that names no size: empty, or only punctuation and digits (`?`, `-1`, `*`),
/// as paddle2onnx and some other exporters write every dynamic dim. Each occurrence is a
/// distinct unknown, like an absent dim: binding all `?` to one symbol would claim that a
/// 48-high, 192-wide image is square.
fn is_anonymous(p: &str) -> bool {
    !p.chars().any(char::is_alphabetic)
}

/// A `dim_param`: a dim expression over symbols (`past_seq + seq`, `16*h_patches`) when it
/// parses as one, else one symbol named by the whole text (`unk__0.x`). The text is parsed once
/// without declaring symbols, so a failed parse leaves no stray symbols behind.
fn param_dim(m: &mut Module, text: &str) -> Dim {
    let parses = parse_dim_expr(text, &mut |_| Sym::from_index(0)).is_some();
    let expr = if parses {
        parse_dim_expr(text, &mut |n| m.symbol(n))
    } else {
        None
    };
    match expr {
        Some(e) => Dim::Expr(e),
        None => Dim::sym(m.symbol(text)),
    }
}
