//! Run-time tensors and values.

use std::sync::Arc;

use half::{bf16, f16};
use mmq_ir::{ConstData, DType, Storage};

use crate::error::KernelError;
use crate::numeric;

/// Typed element storage, row-major. Small types (fp8, fp4, e8m0, int4, int2) are kept unpacked,
/// one code per element ([`Data::Codes`]); their values are given by [`numeric::decode`].
#[derive(Clone, Debug, PartialEq)]
#[allow(missing_docs, reason = "one variant per element type, named after it")]
pub enum Data {
    Bool(Vec<bool>),
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Str(Vec<String>),
    Codes(Vec<u8>),
}

/// Applies `$body` to the vector inside any non-string, non-code variant, bound as `$v`.
macro_rules! with_numeric {
    ($data:expr, $v:ident => $body:expr, else $other:expr) => {
        match $data {
            Data::Bool($v) => $body,
            Data::U8($v) => $body,
            Data::I8($v) => $body,
            Data::U16($v) => $body,
            Data::I16($v) => $body,
            Data::U32($v) => $body,
            Data::I32($v) => $body,
            Data::U64($v) => $body,
            Data::I64($v) => $body,
            Data::F16($v) => $body,
            Data::BF16($v) => $body,
            Data::F32($v) => $body,
            Data::F64($v) => $body,
            _ => $other,
        }
    };
}

/// A tensor: dtype, concrete shape, elements.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// Element type; always agrees with the [`Data`] variant.
    pub dtype: DType,
    /// Dimensions.
    pub shape: Vec<usize>,
    /// Elements, row-major.
    pub data: Data,
}

/// A run-time value.
#[derive(Clone, Debug, PartialEq)]
pub enum RtValue {
    /// A tensor (shared: constants and `Identity` never copy).
    Tensor(Arc<Tensor>),
    /// A sequence of tensors.
    Sequence(Vec<Arc<Tensor>>),
    /// An optional value.
    Optional(Option<Box<RtValue>>),
}

impl RtValue {
    /// The tensor, if this is one.
    pub fn as_tensor(&self) -> Option<&Arc<Tensor>> {
        match self {
            RtValue::Tensor(t) => Some(t),
            _ => None,
        }
    }

    /// Bytes held (tensors: element storage; strings count their lengths).
    pub fn byte_size(&self) -> usize {
        match self {
            RtValue::Tensor(t) => t.byte_size(),
            RtValue::Sequence(v) => v.iter().map(|t| t.byte_size()).sum(),
            RtValue::Optional(o) => o.as_ref().map_or(0, |v| v.byte_size()),
        }
    }
}

impl From<Tensor> for RtValue {
    fn from(t: Tensor) -> RtValue {
        RtValue::Tensor(Arc::new(t))
    }
}

/// `n` copies of `fill`, allocated fallibly: an allocation the system refuses is an error, not
/// an aborted process.
pub(crate) fn filled<T: Clone>(n: usize, fill: T) -> Result<Vec<T>, KernelError> {
    mmq_ir::alloc::try_filled(n, fill).map_err(|_| {
        KernelError::Module(format!(
            "{n} elements of {} bytes cannot be allocated: the system refused them",
            std::mem::size_of::<T>()
        ))
    })
}

/// The storage variant for a dtype, zero-filled (see [`filled`]).
fn empty_data(dtype: DType, n: usize) -> Result<Data, KernelError> {
    use DType::*;
    Ok(match dtype {
        Bool => Data::Bool(filled(n, false)?),
        U8 => Data::U8(filled(n, 0)?),
        I8 => Data::I8(filled(n, 0)?),
        U16 => Data::U16(filled(n, 0)?),
        I16 => Data::I16(filled(n, 0)?),
        U32 => Data::U32(filled(n, 0)?),
        I32 => Data::I32(filled(n, 0)?),
        U64 => Data::U64(filled(n, 0)?),
        I64 => Data::I64(filled(n, 0)?),
        F16 => Data::F16(filled(n, f16::ZERO)?),
        BF16 => Data::BF16(filled(n, bf16::ZERO)?),
        F32 => Data::F32(filled(n, 0.0)?),
        F64 => Data::F64(filled(n, 0.0)?),
        String => Data::Str(filled(n, std::string::String::new())?),
        F8E4M3FN | F8E4M3FNUZ | F8E5M2 | F8E5M2FNUZ | F8E8M0 | F4E2M1 | U4 | I4 | U2 | I2 => {
            Data::Codes(filled(n, numeric::encode(dtype, 0.0, true))?)
        }
        C64 | C128 => {
            return Err(KernelError::Module(format!(
                "dtype {dtype} is not supported"
            )));
        }
    })
}

impl Data {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Data::Str(v) => v.len(),
            Data::Codes(v) => v.len(),
            d => with_numeric!(d, v => v.len(), else 0),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The element count of `shape`; `None` when it overflows `usize`.
pub fn numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

static MEMORY_LIMIT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The most bytes one tensor may take (see [`set_memory_limit`]); by default three quarters of
/// the machine's physical memory (`MemTotal` of `/proc/meminfo`), or 64 GiB where that is
/// unknown.
pub fn memory_limit() -> u64 {
    use std::sync::atomic::Ordering;
    let v = MEMORY_LIMIT.load(Ordering::Relaxed);
    if v != 0 {
        return v;
    }
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|r| r.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(64 << 30, |kb| kb.saturating_mul(1024) / 4 * 3);
    MEMORY_LIMIT.store(total, Ordering::Relaxed);
    total
}

/// Sets the most bytes one tensor may take (`--max-memory`); 0 restores the default.
pub fn set_memory_limit(bytes: u64) {
    MEMORY_LIMIT.store(bytes, std::sync::atomic::Ordering::Relaxed);
}

/// Checks that `n` elements of `dtype` (shape `shape`, for the message) fit the memory limit;
/// `what` names the tensor or node.
pub fn check_size(what: &str, dtype: DType, shape: &[usize]) -> Result<usize, KernelError> {
    check_size_with(|| what.to_owned(), dtype, shape)
}

/// [`check_size`] naming the tensor with `what()`, called only for the error (a node's label is
/// formatted once per refusal, not once per node run).
pub fn check_size_with(
    what: impl FnOnce() -> String,
    dtype: DType,
    shape: &[usize],
) -> Result<usize, KernelError> {
    let too_big = |bytes: String| {
        let what = what();
        KernelError::Module(format!(
            "{what}: a {dtype} tensor of shape {shape:?} ({bytes}) exceeds the memory limit of \
             {} bytes (--max-memory)",
            memory_limit()
        ))
    };
    let Some(n) = numel(shape) else {
        return Err(too_big("more elements than fit in 64 bits".into()));
    };
    let bits = match dtype.bits() {
        0 => 64,
        b => b,
    };
    let bytes = n
        .checked_mul(bits)
        .map_or(u64::MAX, |b| b.div_ceil(8) as u64);
    if bytes > memory_limit() {
        return Err(too_big(format!("{bytes} bytes")));
    }
    Ok(n)
}

impl Tensor {
    /// A tensor; fails when the element count does not match the shape.
    pub fn new(dtype: DType, shape: Vec<usize>, data: Data) -> Result<Tensor, KernelError> {
        let n = numel(&shape).ok_or_else(|| {
            KernelError::Module(format!(
                "{dtype} tensor of shape {shape:?}: the element count overflows"
            ))
        })?;
        if data.len() != n {
            return Err(KernelError::Module(format!(
                "{dtype} tensor of shape {shape:?} needs {n} elements, got {}",
                data.len()
            )));
        }
        Ok(Tensor { dtype, shape, data })
    }

    /// A tensor of zeros (false, empty strings).
    pub fn zeros(dtype: DType, shape: Vec<usize>) -> Result<Tensor, KernelError> {
        let n = check_size("a zero tensor", dtype, &shape)?;
        Ok(Tensor {
            dtype,
            shape,
            data: empty_data(dtype, n)?,
        })
    }

    /// An f32 tensor.
    pub fn from_f32(shape: Vec<usize>, v: Vec<f32>) -> Result<Tensor, KernelError> {
        Tensor::new(DType::F32, shape, Data::F32(v))
    }

    /// An i64 tensor.
    pub fn from_i64(shape: Vec<usize>, v: Vec<i64>) -> Result<Tensor, KernelError> {
        Tensor::new(DType::I64, shape, Data::I64(v))
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Rank.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Bytes of element storage.
    pub fn byte_size(&self) -> usize {
        match &self.data {
            Data::Str(v) => v.iter().map(String::len).sum(),
            _ => self.dtype.storage_bytes(self.len()).unwrap_or(0),
        }
    }

    /// Every element as f64 (bool: 0/1; small types decoded). Strings are an error.
    pub fn to_f64(&self) -> Result<Vec<f64>, KernelError> {
        Ok(match &self.data {
            Data::Bool(v) => v.iter().map(|&b| f64::from(u8::from(b))).collect(),
            Data::U8(v) => v.iter().map(|&x| f64::from(x)).collect(),
            Data::I8(v) => v.iter().map(|&x| f64::from(x)).collect(),
            Data::U16(v) => v.iter().map(|&x| f64::from(x)).collect(),
            Data::I16(v) => v.iter().map(|&x| f64::from(x)).collect(),
            Data::U32(v) => v.iter().map(|&x| f64::from(x)).collect(),
            Data::I32(v) => v.iter().map(|&x| f64::from(x)).collect(),
            Data::U64(v) => v.iter().map(|&x| x as f64).collect(),
            Data::I64(v) => v.iter().map(|&x| x as f64).collect(),
            Data::F16(v) => v.iter().map(|&x| f64::from(x)).collect(),
            Data::BF16(v) => v.iter().map(|&x| f64::from(x)).collect(),
            Data::F32(v) => v.iter().map(|&x| f64::from(x)).collect(),
            Data::F64(v) => v.clone(),
            Data::Codes(v) => v
                .iter()
                .map(|&c| f64::from(numeric::decode(self.dtype, c)))
                .collect(),
            Data::Str(_) => {
                return Err(KernelError::Module(
                    "string tensor used as a number".to_owned(),
                ));
            }
        })
    }

    /// Every element as f32, consuming the tensor (no copy when it already is f32).
    pub fn into_f32(self) -> Result<Vec<f32>, KernelError> {
        match self.data {
            Data::F32(v) => Ok(v),
            _ => self.to_f32(),
        }
    }

    /// Every element as f32.
    pub fn to_f32(&self) -> Result<Vec<f32>, KernelError> {
        match &self.data {
            Data::F32(v) => Ok(v.clone()),
            Data::F16(v) => Ok(v.iter().map(|&x| f32::from(x)).collect()),
            Data::BF16(v) => Ok(v.iter().map(|&x| f32::from(x)).collect()),
            Data::Codes(v) => Ok(v.iter().map(|&c| numeric::decode(self.dtype, c)).collect()),
            _ => Ok(self.to_f64()?.into_iter().map(|x| x as f32).collect()),
        }
    }

    /// Every element as i64 (for indices, axes, shapes; floats truncate).
    pub fn to_i64(&self) -> Result<Vec<i64>, KernelError> {
        Ok(match &self.data {
            Data::I64(v) => v.clone(),
            Data::I32(v) => v.iter().map(|&x| i64::from(x)).collect(),
            Data::U64(v) => v.iter().map(|&x| x as i64).collect(),
            Data::U32(v) => v.iter().map(|&x| i64::from(x)).collect(),
            Data::I16(v) => v.iter().map(|&x| i64::from(x)).collect(),
            Data::U16(v) => v.iter().map(|&x| i64::from(x)).collect(),
            Data::I8(v) => v.iter().map(|&x| i64::from(x)).collect(),
            Data::U8(v) => v.iter().map(|&x| i64::from(x)).collect(),
            Data::Bool(v) => v.iter().map(|&x| i64::from(x)).collect(),
            _ => self.to_f64()?.into_iter().map(|x| x as i64).collect(),
        })
    }

    /// A tensor of `dtype` from f64 values, converting with ONNX `Cast` semantics (saturating
    /// for the small float types; integers wrap like a C cast of the truncated value).
    pub fn from_f64_as(dtype: DType, shape: Vec<usize>, v: &[f64]) -> Result<Tensor, KernelError> {
        use DType::*;
        let data = match dtype {
            Bool => Data::Bool(v.iter().map(|&x| x != 0.0).collect()),
            U8 => Data::U8(v.iter().map(|&x| x as i64 as u8).collect()),
            I8 => Data::I8(v.iter().map(|&x| x as i64 as i8).collect()),
            U16 => Data::U16(v.iter().map(|&x| x as i64 as u16).collect()),
            I16 => Data::I16(v.iter().map(|&x| x as i64 as i16).collect()),
            U32 => Data::U32(v.iter().map(|&x| x as i64 as u32).collect()),
            I32 => Data::I32(v.iter().map(|&x| x as i64 as i32).collect()),
            U64 => Data::U64(v.iter().map(|&x| x as u64).collect()),
            I64 => Data::I64(v.iter().map(|&x| x as i64).collect()),
            F16 => Data::F16(v.iter().map(|&x| f16::from_f64(x)).collect()),
            BF16 => Data::BF16(v.iter().map(|&x| bf16::from_f64(x)).collect()),
            F32 => Data::F32(v.iter().map(|&x| x as f32).collect()),
            F64 => Data::F64(v.to_vec()),
            F8E4M3FN | F8E4M3FNUZ | F8E5M2 | F8E5M2FNUZ | F8E8M0 | F4E2M1 | U4 | I4 | U2 | I2 => {
                Data::Codes(
                    v.iter()
                        .map(|&x| numeric::encode(dtype, x as f32, true))
                        .collect(),
                )
            }
            String | C64 | C128 => {
                return Err(KernelError::Module(format!(
                    "cannot build a {dtype} tensor from numbers"
                )));
            }
        };
        Tensor::new(dtype, shape, data)
    }

    /// Decodes a constant's bytes (little-endian; sub-byte types packed low bits first).
    pub fn from_const(c: &ConstData) -> Result<Tensor, KernelError> {
        let shape: Vec<usize> = c.shape.iter().map(|&d| d.max(0) as usize).collect();
        let name = c.name.as_deref().unwrap_or("<unnamed>");
        let n = check_size(&format!("constant '{name}'"), c.dtype, &shape)?;
        if let Storage::Strings(v) = &c.storage {
            let strings = v
                .iter()
                .map(|b| std::string::String::from_utf8_lossy(b).into_owned())
                .collect();
            return Tensor::new(DType::String, shape, Data::Str(strings));
        }
        // External f32 weights are read a MiB of elements at a time straight into the decoded
        // vector (no whole-weight byte buffer beside it).
        if c.dtype == DType::F32
            && let Storage::External { len, .. } = &c.storage
            && *len == 4 * n as u64
        {
            const CHUNK: usize = 1 << 20;
            let mut v = vec![0f32; n];
            let mut scratch = Vec::new();
            for (i, out) in v.chunks_mut(CHUNK).enumerate() {
                c.read_f32(i * CHUNK, out, &mut scratch)
                    .map_err(|e| KernelError::Module(format!("constant '{name}': {e}")))?;
            }
            return Tensor::new(DType::F32, shape, Data::F32(v));
        }
        // Other external data through positional reads: decoding a weight does not leave the
        // file's pages in the process's resident memory beside the decoded copy.
        let bytes = c
            .read_bytes()
            .ok_or_else(|| {
                KernelError::Module(format!(
                    "constant '{name}' has no data (module read from text without weights: \
                     `mmq inspect --weights` prints them)"
                ))
            })?
            .map_err(|e| KernelError::Module(format!("constant '{name}': {e}")))?;
        let need = c.dtype.storage_bytes(n).unwrap_or(0);
        if bytes.len() < need {
            return Err(KernelError::Module(format!(
                "constant '{name}' has {} bytes, its type needs {need}",
                bytes.len()
            )));
        }
        macro_rules! le {
            ($t:ty, $w:literal, $variant:ident) => {
                Data::$variant(
                    bytes[..need]
                        .chunks_exact($w)
                        .map(|b| <$t>::from_le_bytes(b.try_into().expect("chunk width")))
                        .collect(),
                )
            };
        }
        use DType::*;
        let data = match c.dtype {
            Bool => Data::Bool(bytes[..n].iter().map(|&b| b != 0).collect()),
            U8 => Data::U8(bytes[..n].to_vec()),
            I8 => Data::I8(bytes[..n].iter().map(|&b| b as i8).collect()),
            U16 => le!(u16, 2, U16),
            I16 => le!(i16, 2, I16),
            U32 => le!(u32, 4, U32),
            I32 => le!(i32, 4, I32),
            U64 => le!(u64, 8, U64),
            I64 => le!(i64, 8, I64),
            F16 => Data::F16(
                bytes[..need]
                    .chunks_exact(2)
                    .map(|b| f16::from_le_bytes([b[0], b[1]]))
                    .collect(),
            ),
            BF16 => Data::BF16(
                bytes[..need]
                    .chunks_exact(2)
                    .map(|b| bf16::from_le_bytes([b[0], b[1]]))
                    .collect(),
            ),
            F32 => le!(f32, 4, F32),
            F64 => le!(f64, 8, F64),
            F8E4M3FN | F8E4M3FNUZ | F8E5M2 | F8E5M2FNUZ | F8E8M0 => {
                Data::Codes(bytes[..n].to_vec())
            }
            U4 | I4 | F4E2M1 => Data::Codes(
                (0..n)
                    .map(|i| (bytes[i / 2] >> (4 * (i % 2))) & 0xf)
                    .collect(),
            ),
            U2 | I2 => Data::Codes(
                (0..n)
                    .map(|i| (bytes[i / 4] >> (2 * (i % 4))) & 0x3)
                    .collect(),
            ),
            String | C64 | C128 => {
                return Err(KernelError::Module(format!(
                    "constant '{name}': dtype {} is not supported",
                    c.dtype
                )));
            }
        };
        Tensor::new(c.dtype, shape, data)
    }

    /// The little-endian packed bytes of a non-string tensor (the inverse of [`Tensor::from_const`]).
    pub fn to_bytes(&self) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity(self.byte_size());
        match &self.data {
            Data::Str(_) => return None,
            Data::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
            Data::U8(v) => out.extend_from_slice(v),
            Data::I8(v) => out.extend(v.iter().map(|&b| b as u8)),
            Data::U16(v) => v
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Data::I16(v) => v
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Data::U32(v) => v
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Data::I32(v) => v
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Data::U64(v) => v
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Data::I64(v) => v
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Data::F16(v) => v
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Data::BF16(v) => v
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Data::F32(v) => v
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Data::F64(v) => v
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Data::Codes(v) => match self.dtype.bits() {
                4 => out.extend(
                    v.chunks(2)
                        .map(|p| p[0] & 0xf | p.get(1).map_or(0, |h| (h & 0xf) << 4)),
                ),
                2 => out.extend(v.chunks(4).map(|p| {
                    p.iter()
                        .enumerate()
                        .fold(0u8, |acc, (i, c)| acc | ((c & 0x3) << (2 * i)))
                })),
                _ => out.extend_from_slice(v),
            },
        }
        Some(out)
    }
}
