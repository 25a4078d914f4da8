//! Element types: every ONNX `TensorProto.DataType`.

use std::fmt;
use std::str::FromStr;

macro_rules! dtypes {
    ($($(#[$m:meta])* $v:ident = $code:literal, $name:literal, $bits:literal;)*) => {
        /// A tensor element type. The discriminant is the ONNX `TensorProto.DataType` code.
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
        #[repr(i32)]
        pub enum DType {
            $($(#[$m])* $v = $code,)*
        }

        impl DType {
            /// Every dtype, in ONNX code order.
            pub const ALL: &'static [DType] = &[$(DType::$v),*];

            /// The ONNX `TensorProto.DataType` code.
            pub fn onnx_code(self) -> i32 {
                self as i32
            }

            /// The dtype for an ONNX code, or `None` for `UNDEFINED` and unknown codes.
            pub fn from_onnx_code(code: i32) -> Option<DType> {
                match code {
                    $($code => Some(DType::$v),)*
                    _ => None,
                }
            }

            /// The `.mmir` spelling (`f32`, `bf16`, `f8e4m3fn`, ...).
            pub fn name(self) -> &'static str {
                match self {
                    $(DType::$v => $name,)*
                }
            }

            /// Bits per element; 0 for `string` (variable length).
            pub fn bits(self) -> usize {
                match self {
                    $(DType::$v => $bits,)*
                }
            }
        }

        impl FromStr for DType {
            type Err = ();
            fn from_str(s: &str) -> Result<Self, ()> {
                match s {
                    $($name => Ok(DType::$v),)*
                    _ => Err(()),
                }
            }
        }
    };
}

dtypes! {
    /// 32-bit IEEE float.
    F32 = 1, "f32", 32;
    /// Unsigned 8-bit integer.
    U8 = 2, "u8", 8;
    /// Signed 8-bit integer.
    I8 = 3, "i8", 8;
    /// Unsigned 16-bit integer.
    U16 = 4, "u16", 16;
    /// Signed 16-bit integer.
    I16 = 5, "i16", 16;
    /// Signed 32-bit integer.
    I32 = 6, "i32", 32;
    /// Signed 64-bit integer.
    I64 = 7, "i64", 64;
    /// Variable-length byte string.
    String = 8, "string", 0;
    /// Boolean, one byte per element.
    Bool = 9, "bool", 8;
    /// 16-bit IEEE float.
    F16 = 10, "f16", 16;
    /// 64-bit IEEE float.
    F64 = 11, "f64", 64;
    /// Unsigned 32-bit integer.
    U32 = 12, "u32", 32;
    /// Unsigned 64-bit integer.
    U64 = 13, "u64", 64;
    /// Complex with f32 parts.
    C64 = 14, "c64", 64;
    /// Complex with f64 parts.
    C128 = 15, "c128", 128;
    /// bfloat16.
    BF16 = 16, "bf16", 16;
    /// FP8 E4M3, finite only (no infinities), NaN = 0x7f/0xff.
    F8E4M3FN = 17, "f8e4m3fn", 8;
    /// FP8 E4M3, finite, unsigned-zero (NaN = 0x80).
    F8E4M3FNUZ = 18, "f8e4m3fnuz", 8;
    /// FP8 E5M2.
    F8E5M2 = 19, "f8e5m2", 8;
    /// FP8 E5M2, finite, unsigned-zero.
    F8E5M2FNUZ = 20, "f8e5m2fnuz", 8;
    /// Unsigned 4-bit integer, two per byte, low nibble first.
    U4 = 21, "u4", 4;
    /// Signed 4-bit integer, two per byte, low nibble first.
    I4 = 22, "i4", 4;
    /// FP4 E2M1, two per byte, low nibble first.
    F4E2M1 = 23, "f4e2m1", 4;
    /// FP8 E8M0 (exponent only, used for MX scales).
    F8E8M0 = 24, "f8e8m0", 8;
    /// Unsigned 2-bit integer, four per byte.
    U2 = 25, "u2", 2;
    /// Signed 2-bit integer, four per byte.
    I2 = 26, "i2", 2;
}

impl DType {
    /// Whether this is a floating-point type (including fp8/fp4).
    pub fn is_float(self) -> bool {
        use DType::*;
        matches!(
            self,
            F32 | F16 | F64 | BF16 | F8E4M3FN | F8E4M3FNUZ | F8E5M2 | F8E5M2FNUZ | F4E2M1 | F8E8M0
        )
    }

    /// Whether this is an integer type (signed or unsigned, any width).
    pub fn is_int(self) -> bool {
        use DType::*;
        matches!(
            self,
            U8 | I8 | U16 | I16 | I32 | I64 | U32 | U64 | U4 | I4 | U2 | I2
        )
    }

    /// Bytes needed to store `count` packed elements (sub-byte types round up); `None` for strings.
    /// Saturates at `usize::MAX` bits: a count read from a file never overflows here (see
    /// [`DType::checked_storage_bytes`] to tell).
    pub fn storage_bytes(self, count: usize) -> Option<usize> {
        match self.bits() {
            0 => None,
            bits => Some(count.saturating_mul(bits).div_ceil(8)),
        }
    }

    /// Bytes needed to store `count` packed elements; `None` for strings and where the size does
    /// not fit in 64 bits of bits.
    pub fn checked_storage_bytes(self, count: usize) -> Option<usize> {
        match self.bits() {
            0 => None,
            bits => Some(count.checked_mul(bits)?.div_ceil(8)),
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
