//! Quantized caches: the formats of the KV cache and of the image-feature cache, how each cuts a
//! tensor for its scales, and (in [`plan`]) the 128-byte-aligned pool that holds both.
//!
//! A cache tensor is `[..., tokens, width]` (a KV tensor `[batch, heads, seq, head_dim]`, image
//! features `[batch, patches, hidden]`). INT8 and FP8 KV tensors are cut into blocks of
//! [`KV_BLOCK_BYTES`] (`KV_BLOCK_BYTES / head_dim` whole tokens of one head) with one f32 scale
//! per leading index and block; INT4 tensors (KV and image features) into groups of at most
//! [`INT4_GROUP`] codes along the width, one binary16 scale per token and group. Both are
//! symmetric: INT8 codes in [-127, 127] (`scale = amax / 127`), INT4 in [-8, 7]
//! (`scale = amax / 7`), FP8 E4M3 saturating at ±448 (`scale = amax / 448`); rounding is half to
//! even. These are the layouts the CUDA kernels write ([`crate::packed::kv_append`],
//! [`crate::cuda::Device::image_features_int4`]).

pub mod plan;
pub mod pool;

use std::fmt;
use std::str::FromStr;

use mmq_ir::DType;

use crate::packed::{Format, KV_BLOCK_BYTES};

/// Codes per group of an INT4 cache (image features: 64 codes, 32 bytes, one binary16 scale).
pub const INT4_GROUP: usize = 64;

/// The code format of a quantized cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheFormat {
    /// INT8 blocks of 512 bytes.
    Int8,
    /// FP8 E4M3 blocks of 512 bytes.
    Fp8,
    /// INT4 groups along the width.
    Int4,
}

/// A cache layout that does not fit a tensor: what does not divide.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CacheError(pub String);

impl CacheFormat {
    /// Every format, in the order help texts list them.
    pub const ALL: [CacheFormat; 3] = [CacheFormat::Int8, CacheFormat::Fp8, CacheFormat::Int4];

    /// The name `--kv-cache` takes.
    pub fn name(self) -> &'static str {
        match self {
            CacheFormat::Int8 => "int8",
            CacheFormat::Fp8 => "fp8",
            CacheFormat::Int4 => "int4",
        }
    }

    /// The packed code format.
    pub fn format(self) -> Format {
        match self {
            CacheFormat::Int8 => Format::I8,
            CacheFormat::Fp8 => Format::E4M3,
            CacheFormat::Int4 => Format::I4,
        }
    }

    /// The element type of the codes.
    pub fn code_dtype(self) -> DType {
        self.format().dtype()
    }

    /// The code `amax` maps to (`scale = amax / qmax`).
    pub fn qmax(self) -> f32 {
        match self {
            CacheFormat::Int8 => 127.0,
            CacheFormat::Fp8 => 448.0,
            CacheFormat::Int4 => 7.0,
        }
    }

    /// The integer code range (clipping bounds); `None` for FP8, whose cast saturates.
    pub fn clip(self) -> Option<(f32, f32)> {
        match self {
            CacheFormat::Int8 => Some((-127.0, 127.0)),
            CacheFormat::Fp8 => None,
            CacheFormat::Int4 => Some((-8.0, 7.0)),
        }
    }

    /// The ONNX default-domain opset that has the code type (INT8 13, FP8 19, INT4 21).
    pub fn min_opset(self) -> i64 {
        match self {
            CacheFormat::Int8 => 13,
            CacheFormat::Fp8 => 19,
            CacheFormat::Int4 => 21,
        }
    }

    /// How a cache tensor whose tokens are `width` elements wide is cut for its scales.
    pub fn scales(self, width: usize) -> Result<CacheScales, CacheError> {
        match self {
            CacheFormat::Int8 | CacheFormat::Fp8 => {
                if width == 0 || width > KV_BLOCK_BYTES || !KV_BLOCK_BYTES.is_multiple_of(width) {
                    return Err(CacheError(format!(
                        "a token of {width} elements does not divide the {KV_BLOCK_BYTES}-byte \
                         block of the {} cache",
                        self.name()
                    )));
                }
                Ok(CacheScales::Blocks {
                    tokens: KV_BLOCK_BYTES / width,
                })
            }
            CacheFormat::Int4 => {
                let group = width.min(INT4_GROUP);
                if group == 0 || !width.is_multiple_of(group) {
                    return Err(CacheError(format!(
                        "a token of {width} elements does not split into INT4 groups of \
                         {INT4_GROUP}"
                    )));
                }
                Ok(CacheScales::Groups { group })
            }
        }
    }
}

impl fmt::Display for CacheFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CacheFormat {
    type Err = mmq_ir::UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CacheFormat::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| mmq_ir::UnknownName {
                what: "cache format",
                value: s.to_owned(),
                expected: CacheFormat::ALL.map(CacheFormat::name).join(", "),
            })
    }
}

/// How a cache tensor `[..., tokens, width]` is cut for its scales.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheScales {
    /// Blocks of `tokens` whole tokens; scales `[..., ceil(tokens_total / tokens)]`, f32.
    Blocks {
        /// Tokens per block.
        tokens: usize,
    },
    /// Groups of `group` codes along the width; scales `[..., tokens_total, width / group]`,
    /// binary16.
    Groups {
        /// Codes per group.
        group: usize,
    },
}

impl CacheScales {
    /// The element type of the scales.
    pub fn dtype(self) -> DType {
        match self {
            CacheScales::Blocks { .. } => DType::F32,
            CacheScales::Groups { .. } => DType::F16,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_cut_tokens_as_the_kernels_do() {
        assert_eq!(
            CacheFormat::Int8.scales(64),
            Ok(CacheScales::Blocks { tokens: 8 })
        );
        assert_eq!(
            CacheFormat::Fp8.scales(128),
            Ok(CacheScales::Blocks { tokens: 4 })
        );
        assert_eq!(
            CacheFormat::Int4.scales(256),
            Ok(CacheScales::Groups { group: 64 })
        );
        assert_eq!(
            CacheFormat::Int4.scales(16),
            Ok(CacheScales::Groups { group: 16 })
        );
        assert!(CacheFormat::Int8.scales(96).is_err());
        assert!(CacheFormat::Int4.scales(96).is_err());
        assert_eq!("fp8".parse(), Ok(CacheFormat::Fp8));
        assert!(
            "int2"
                .parse::<CacheFormat>()
                .unwrap_err()
                .to_string()
                .contains("int8, fp8, int4")
        );
    }
}
