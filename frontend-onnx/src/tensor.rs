//! `TensorProto` and `SparseTensorProto` → [`ConstData`].
//!
//! `raw_data` is shared with the decoded buffer (no copy); typed fields (`float_data`,
//! `int32_data`, ...) are packed into the little-endian bytes that `raw_data` would hold;
//! external data is memory-mapped and referenced by offset, never read.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use mmq_ir::{ConstData, DType, ExternalFile, Storage};

use crate::error::{Result, err};
use crate::proto::onnx::{SparseTensorProto, TensorProto, tensor_proto::DataLocation};

/// Resolves and maps external data files, each distinct file once.
#[derive(Debug, Default)]
pub(crate) struct ExternalFiles {
    files: HashMap<PathBuf, Arc<ExternalFile>>,
}

impl ExternalFiles {
    /// The mapped file for `location` relative to `dir`.
    fn open(
        &mut self,
        dir: Option<&Path>,
        location: &str,
        tensor: &str,
    ) -> Result<Arc<ExternalFile>> {
        let rel = Path::new(location);
        if location.is_empty() {
            return Err(err!(
                ExternalData,
                "tensor '{tensor}': external data has an empty location"
            ));
        }
        if rel.is_absolute()
            || rel
                .components()
                .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(err!(
                ExternalData,
                "tensor '{tensor}': external data location '{location}' must be a relative path \
                 inside the model's directory"
            ));
        }
        let Some(dir) = dir else {
            return Err(err!(
                ExternalData,
                "tensor '{tensor}': external data '{location}' cannot be resolved: the model was \
                 not loaded from a directory"
            ));
        };
        let path = dir.join(rel);
        if let Some(f) = self.files.get(&path) {
            return Ok(f.clone());
        }
        let file = ExternalFile::open_contained(dir, location).map_err(|e| {
            err!(
                ExternalData,
                "tensor '{tensor}': cannot open external data '{}': {e}",
                path.display()
            )
        })?;
        let file = Arc::new(file);
        self.files.insert(path, file.clone());
        Ok(file)
    }
}

/// Where tensors get external data from.
pub(crate) struct TensorCtx<'a> {
    /// The model's directory.
    pub dir: Option<&'a Path>,
    /// Files mapped so far.
    pub files: &'a mut ExternalFiles,
}

fn dtype_of(t: &TensorProto, name: &str) -> Result<DType> {
    let code = t.data_type.unwrap_or(0);
    DType::from_onnx_code(code).ok_or_else(|| {
        err!(
            UnknownDType,
            "tensor '{name}': unknown element type code {code}"
        )
    })
}

fn shape_elems(dims: &[i64], name: &str) -> Result<usize> {
    let mut n: usize = 1;
    for &d in dims {
        let d = usize::try_from(d).map_err(|_| {
            err!(
                Invalid,
                "tensor '{name}': negative dimension {d} in {dims:?}"
            )
        })?;
        n = n
            .checked_mul(d)
            .ok_or_else(|| err!(Invalid, "tensor '{name}': shape {dims:?} overflows"))?;
    }
    Ok(n)
}

/// Refuses a tensor whose byte size does not fit in 64 bits (f32[2^62, 1]: 2^64 bytes).
fn check_bytes(dtype: DType, n: usize, dims: &[i64], name: &str) -> Result<()> {
    if dtype != DType::String && dtype.checked_storage_bytes(n).is_none() {
        return Err(err!(
            Invalid,
            "tensor '{name}': {} takes more bytes than fit in 64 bits",
            describe(dtype, dims)
        ));
    }
    Ok(())
}

/// A zero-filled buffer of `len` items for densifying sparse tensor `name`, allocated fallibly:
/// a size the system cannot provide is an error, not an aborted process.
fn dense_buffer<T: Clone>(len: usize, fill: T, name: &str) -> Result<Vec<T>> {
    mmq_ir::alloc::try_filled(len, fill).map_err(|_| {
        err!(
            Invalid,
            "sparse tensor '{name}': its dense form of {len} elements cannot be allocated: the \
             system refused {} bytes",
            len.saturating_mul(std::mem::size_of::<T>())
        )
    })
}

fn describe(dtype: DType, dims: &[i64]) -> String {
    let dims: Vec<String> = dims.iter().map(i64::to_string).collect();
    format!("{dtype}[{}]", dims.join(", "))
}

/// Converts a dense tensor. `fallback_name` names unnamed tensors in messages.
pub(crate) fn tensor_to_const(
    t: &TensorProto,
    fallback_name: &str,
    ctx: &mut TensorCtx<'_>,
) -> Result<ConstData> {
    let name = t.name.as_deref().filter(|n| !n.is_empty());
    let label = name.unwrap_or(fallback_name);
    let dtype = dtype_of(t, label)?;
    let n = shape_elems(&t.dims, label)?;
    check_bytes(dtype, n, &t.dims, label)?;
    if t.segment.is_some() {
        return Err(err!(
            Invalid,
            "tensor '{label}': segmented tensors are not supported"
        ));
    }
    let storage = if t.data_location == Some(DataLocation::External as i32) {
        external(t, label, dtype, n, ctx)?
    } else if dtype == DType::String {
        if t.raw_data.is_some() {
            return Err(err!(
                Invalid,
                "tensor '{label}': string tensors must use string_data, not raw_data"
            ));
        }
        if t.string_data.len() != n {
            return Err(err!(
                Invalid,
                "tensor '{label}': {} has {} strings",
                describe(dtype, &t.dims),
                t.string_data.len()
            ));
        }
        Storage::Strings(
            t.string_data
                .iter()
                .map(|s| Bytes::from(s.clone()))
                .collect(),
        )
    } else {
        let need = dtype.storage_bytes(n).unwrap_or(0);
        let bytes = match &t.raw_data {
            Some(raw) => raw.clone(),
            None => Bytes::from(typed_bytes(t, label, dtype, n)?),
        };
        if bytes.len() != need {
            return Err(err!(
                Invalid,
                "tensor '{label}': {} needs {need} bytes of data, found {}",
                describe(dtype, &t.dims),
                bytes.len()
            ));
        }
        Storage::Inline(bytes)
    };
    Ok(ConstData::new(
        name.map(str::to_owned),
        dtype,
        t.dims.clone(),
        storage,
    ))
}

fn external(
    t: &TensorProto,
    label: &str,
    dtype: DType,
    n: usize,
    ctx: &mut TensorCtx<'_>,
) -> Result<Storage> {
    let Some(need) = dtype.storage_bytes(n) else {
        return Err(err!(
            ExternalData,
            "tensor '{label}': string tensors cannot use external data"
        ));
    };
    let mut location = None;
    let mut offset = 0u64;
    let mut length = None;
    for kv in &t.external_data {
        let value = kv.value.as_deref().unwrap_or("");
        let number = || {
            value.trim().parse::<u64>().map_err(|_| {
                err!(
                    ExternalData,
                    "tensor '{label}': external data {} '{value}' is not a non-negative integer",
                    kv.key.as_deref().unwrap_or("")
                )
            })
        };
        match kv.key.as_deref().unwrap_or("") {
            "location" => location = Some(value),
            "offset" => offset = number()?,
            "length" => length = Some(number()?),
            _ => {}
        }
    }
    let Some(location) = location else {
        return Err(err!(
            ExternalData,
            "tensor '{label}': external data has no location"
        ));
    };
    let need = need as u64;
    let len = length.unwrap_or(need);
    if len != need {
        return Err(err!(
            ExternalData,
            "tensor '{label}': external data length {len} does not match {} ({need} bytes)",
            describe(dtype, &t.dims)
        ));
    }
    let file = ctx.files.open(ctx.dir, location, label)?;
    let end = offset.checked_add(len);
    if end.is_none_or(|end| end > file.len()) {
        return Err(err!(
            ExternalData,
            "tensor '{label}': external data '{}' has {} bytes, but the tensor needs bytes \
             {offset}..{} ({len} bytes at offset {offset})",
            file.path.display(),
            file.len(),
            offset.saturating_add(len)
        ));
    }
    Ok(Storage::External { file, offset, len })
}

/// Packs the typed data field of `t` as `raw_data` would hold it.
fn typed_bytes(t: &TensorProto, label: &str, dtype: DType, n: usize) -> Result<Vec<u8>> {
    use DType::*;
    // `per` values per element (complex numbers take two).
    let count = |have: usize, per: usize| -> Result<()> {
        if Some(have) == n.checked_mul(per) {
            Ok(())
        } else {
            Err(err!(
                Invalid,
                "tensor '{label}': {} has {have} values in its typed data field",
                describe(dtype, &t.dims)
            ))
        }
    };
    let i32s = &t.int32_data;
    Ok(match dtype {
        F32 => {
            count(t.float_data.len(), 1)?;
            t.float_data.iter().flat_map(|v| v.to_le_bytes()).collect()
        }
        C64 => {
            count(t.float_data.len(), 2)?;
            t.float_data.iter().flat_map(|v| v.to_le_bytes()).collect()
        }
        F64 => {
            count(t.double_data.len(), 1)?;
            t.double_data.iter().flat_map(|v| v.to_le_bytes()).collect()
        }
        C128 => {
            count(t.double_data.len(), 2)?;
            t.double_data.iter().flat_map(|v| v.to_le_bytes()).collect()
        }
        I64 => {
            count(t.int64_data.len(), 1)?;
            t.int64_data.iter().flat_map(|v| v.to_le_bytes()).collect()
        }
        U64 => {
            count(t.uint64_data.len(), 1)?;
            t.uint64_data.iter().flat_map(|v| v.to_le_bytes()).collect()
        }
        U32 => {
            count(t.uint64_data.len(), 1)?;
            t.uint64_data
                .iter()
                .flat_map(|&v| (v as u32).to_le_bytes())
                .collect()
        }
        I32 => {
            count(i32s.len(), 1)?;
            i32s.iter().flat_map(|v| v.to_le_bytes()).collect()
        }
        I16 | U16 | F16 | BF16 => {
            count(i32s.len(), 1)?;
            i32s.iter()
                .flat_map(|&v| (v as u16).to_le_bytes())
                .collect()
        }
        I8 | U8 | Bool | F8E4M3FN | F8E4M3FNUZ | F8E5M2 | F8E5M2FNUZ | F8E8M0 => {
            count(i32s.len(), 1)?;
            i32s.iter().map(|&v| v as u8).collect()
        }
        U4 | I4 | F4E2M1 => sub_byte(i32s, n, 4, label, dtype, &t.dims)?,
        U2 | I2 => sub_byte(i32s, n, 2, label, dtype, &t.dims)?,
        String => Vec::new(),
    })
}

/// Sub-byte elements from `int32_data`: one packed byte per entry (onnx.proto), or, as some
/// writers emit, one element per entry, which is packed here.
fn sub_byte(
    data: &[i32],
    n: usize,
    bits: usize,
    label: &str,
    dtype: DType,
    dims: &[i64],
) -> Result<Vec<u8>> {
    let per = 8 / bits;
    let packed = n.div_ceil(per);
    if data.len() == packed {
        return Ok(data.iter().map(|&v| v as u8).collect());
    }
    if data.len() == n {
        let mask = (1u8 << bits) - 1;
        let mut out = vec![0u8; packed];
        for (i, &v) in data.iter().enumerate() {
            out[i / per] |= (v as u8 & mask) << ((i % per) * bits);
        }
        return Ok(out);
    }
    Err(err!(
        Invalid,
        "tensor '{label}': {} needs {packed} packed int32_data entries, found {}",
        describe(dtype, dims),
        data.len()
    ))
}

/// Converts a sparse tensor (COO) into a dense constant named after its values tensor.
pub(crate) fn sparse_to_const(
    s: &SparseTensorProto,
    fallback_name: &str,
    ctx: &mut TensorCtx<'_>,
) -> Result<ConstData> {
    let Some(values) = &s.values else {
        return Err(err!(
            Invalid,
            "sparse tensor '{fallback_name}' has no values"
        ));
    };
    let name = values.name.as_deref().filter(|n| !n.is_empty());
    let label = name.unwrap_or(fallback_name);
    let vals = tensor_to_const(values, label, ctx)?;
    let dims = s.dims.clone();
    let n = shape_elems(&dims, label)?;
    let nnz = vals.num_elements();
    let indices = match &s.indices {
        Some(i) => {
            let c = tensor_to_const(i, label, ctx)?;
            read_indices(&c, label)?
        }
        None if nnz == 0 => Vec::new(),
        None => return Err(err!(Invalid, "sparse tensor '{label}' has no indices")),
    };
    let rank = dims.len();
    let linear: Vec<usize> = if indices.len() == nnz {
        // Linearized indices, shape [NNZ].
        indices
            .iter()
            .map(|&i| usize::try_from(i).ok().filter(|&i| i < n))
            .collect::<Option<_>>()
            .ok_or_else(|| err!(Invalid, "sparse tensor '{label}': index out of range"))?
    } else if rank > 0 && indices.len() == nnz * rank {
        // Coordinates, shape [NNZ, rank].
        indices
            .chunks(rank)
            .map(|coord| {
                let mut lin = 0usize;
                for (&c, &d) in coord.iter().zip(&dims) {
                    if c < 0 || c >= d {
                        return None;
                    }
                    lin = lin * d as usize + c as usize;
                }
                Some(lin)
            })
            .collect::<Option<_>>()
            .ok_or_else(|| err!(Invalid, "sparse tensor '{label}': index out of range"))?
    } else {
        return Err(err!(
            Invalid,
            "sparse tensor '{label}': {} indices do not fit {nnz} values of rank {rank}",
            indices.len()
        ));
    };
    let dtype = vals.dtype;
    let storage = match &vals.storage {
        Storage::Strings(src) => {
            let mut out = dense_buffer(n, Bytes::new(), label)?;
            for (k, &i) in linear.iter().enumerate() {
                out[i] = src[k].clone();
            }
            Storage::Strings(out)
        }
        _ => {
            let src = vals
                .raw_bytes()
                .ok_or_else(|| err!(Invalid, "sparse tensor '{label}': values are not readable"))?;
            let bits = dtype.bits();
            check_bytes(dtype, n, &dims, label)?;
            let mut out = dense_buffer(dtype.storage_bytes(n).unwrap_or(0), 0u8, label)?;
            if bits >= 8 {
                let w = bits / 8;
                for (k, &i) in linear.iter().enumerate() {
                    out[i * w..(i + 1) * w].copy_from_slice(&src[k * w..(k + 1) * w]);
                }
            } else {
                let per = 8 / bits;
                let mask = (1u8 << bits) - 1;
                for (k, &i) in linear.iter().enumerate() {
                    let v = (src[k / per] >> ((k % per) * bits)) & mask;
                    out[i / per] |= v << ((i % per) * bits);
                }
            }
            Storage::Inline(Bytes::from(out))
        }
    };
    Ok(ConstData::new(
        name.map(str::to_owned),
        dtype,
        dims,
        storage,
    ))
}

fn read_indices(c: &ConstData, label: &str) -> Result<Vec<i64>> {
    let bytes = c
        .raw_bytes()
        .ok_or_else(|| err!(Invalid, "sparse tensor '{label}': indices are not readable"))?;
    Ok(match c.dtype {
        DType::I64 => bytes
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
            .collect(),
        DType::I32 => bytes
            .chunks_exact(4)
            .map(|b| i64::from(i32::from_le_bytes(b.try_into().unwrap_or([0; 4]))))
            .collect(),
        other => {
            return Err(err!(
                Invalid,
                "sparse tensor '{label}': indices must be i64, found {other}"
            ));
        }
    })
}
