//! Decoding `ModelProto` bytes, with errors that tell a truncated model from a file that is not
//! ONNX at all.
//!
//! prost reports decode errors without a position, so on failure the top-level fields are walked
//! again with a minimal protobuf wire-format reader to find where the message breaks.

use bytes::Bytes;
use prost::Message;

use crate::error::{Result, err};
use crate::proto::onnx::ModelProto;

/// Decodes a model. Tensor `raw_data` shares `bytes` (no copy).
///
/// Errors: [`crate::LoadErrorKind::NotOnnx`] when the bytes are not a `ModelProto` with an IR
/// version and a graph, [`crate::LoadErrorKind::Truncated`] when they look like a model that ends
/// early; `offset` is set where the walk of the top-level fields finds the problem.
pub fn decode_model(bytes: Bytes) -> Result<ModelProto> {
    let len = bytes.len() as u64;
    if bytes.is_empty() {
        return Err(err!(NotOnnx, "not an ONNX model: the file is empty").at(0));
    }
    match ModelProto::decode(bytes.clone()) {
        Ok(model) => {
            if model.ir_version.is_none() {
                return Err(err!(NotOnnx, "not an ONNX model: no ir_version field").at(0));
            }
            if model.graph.is_none() {
                return Err(err!(NotOnnx, "not an ONNX model: no graph field").at(0));
            }
            Ok(model)
        }
        Err(e) => {
            let reason = e.to_string();
            Err(match walk(&bytes) {
                Walk::Truncated {
                    field,
                    field_start,
                    first_ok,
                } if first_ok => err!(
                    Truncated,
                    "truncated protobuf: field {field} starting at byte {field_start} runs past \
                     the end of the {len}-byte file ({reason})"
                )
                .at(len),
                Walk::Truncated { field_start, .. } | Walk::Bad { at: field_start } => {
                    err!(NotOnnx, "not an ONNX model ({reason})").at(field_start)
                }
                Walk::Complete { nested_start } if looks_truncated(&reason) => err!(
                    Truncated,
                    "truncated protobuf inside the field starting at byte {nested_start} \
                     ({reason})"
                )
                .at(nested_start),
                Walk::Complete { nested_start } => {
                    err!(Invalid, "malformed ONNX model ({reason})").at(nested_start)
                }
            })
        }
    }
}

fn looks_truncated(reason: &str) -> bool {
    reason.contains("buffer underflow")
        || reason.contains("unexpected EOF")
        || reason.contains("length exceeded")
}

/// The outcome of walking the top-level fields.
enum Walk {
    /// A field's declared length (or its varint) runs past the end of the buffer.
    Truncated {
        field: u64,
        field_start: u64,
        /// Whether the first field was a plausible `ModelProto` field, so the bytes look like a
        /// model that was cut short rather than some other file.
        first_ok: bool,
    },
    /// A tag or wire type that no `ModelProto` has, at byte `at`.
    Bad { at: u64 },
    /// Every top-level field is well formed; the error is nested inside one of them. The start
    /// of the last length-delimited field is the best guess of where.
    Complete { nested_start: u64 },
}

/// Field numbers of `ModelProto` (onnx-ml.proto).
const MODEL_FIELDS: &[u64] = &[1, 2, 3, 4, 5, 6, 7, 8, 14, 20, 25, 26];

fn walk(buf: &[u8]) -> Walk {
    let mut pos = 0usize;
    let mut first = true;
    let mut first_ok = false;
    let mut last_delimited = 0u64;
    while pos < buf.len() {
        let start = pos as u64;
        let Some((key, n)) = varint(&buf[pos..]) else {
            return Walk::Truncated {
                field: 0,
                field_start: start,
                first_ok: first_ok && !first,
            };
        };
        pos += n;
        let field = key >> 3;
        let wire = key & 7;
        if !MODEL_FIELDS.contains(&field) && first {
            return Walk::Bad { at: start };
        }
        if first {
            first_ok = true;
            first = false;
        }
        let truncated = Walk::Truncated {
            field,
            field_start: start,
            first_ok,
        };
        match wire {
            0 => match varint(&buf[pos..]) {
                Some((_, n)) => pos += n,
                None => return truncated,
            },
            1 => {
                if buf.len() - pos < 8 {
                    return truncated;
                }
                pos += 8;
            }
            2 => {
                let Some((len, n)) = varint(&buf[pos..]) else {
                    return truncated;
                };
                pos += n;
                if len > (buf.len() - pos) as u64 {
                    return truncated;
                }
                last_delimited = start;
                pos += len as usize;
            }
            5 => {
                if buf.len() - pos < 4 {
                    return truncated;
                }
                pos += 4;
            }
            _ => return Walk::Bad { at: start },
        }
    }
    Walk::Complete {
        nested_start: last_delimited,
    }
}

/// A base-128 varint at the start of `buf`: its value and length, or `None` when it runs past
/// the end or over ten bytes.
fn varint(buf: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (i, &b) in buf.iter().enumerate().take(10) {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints() {
        assert_eq!(varint(&[0x08]), Some((8, 1)));
        assert_eq!(varint(&[0x96, 0x01]), Some((150, 2)));
        assert_eq!(varint(&[0x96]), None);
        assert_eq!(varint(&[]), None);
    }

    #[test]
    fn text_is_not_onnx() {
        let e = decode_model(Bytes::from_static(b"hello, this is a text file\n")).unwrap_err();
        assert_eq!(e.kind, crate::LoadErrorKind::NotOnnx, "{e}");
    }
}
