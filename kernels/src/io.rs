//! Tensors from and to NumPy files: `.npy` (one array) and `.npz` (a zip of named `.npy`
//! members, as written by `numpy.savez` and `numpy.savez_compressed`).
//!
//! Element types: bool, i8..i64, u8..u64, f16, f32, f64 and unicode strings (`<U`). Types NumPy
//! has no dtype for (bf16, fp8, int4, ...) are an error on writing; on reading, an array of
//! another NumPy dtype (complex, bytes, objects, raw `V` blobs such as ml_dtypes' bfloat16) is an
//! error naming it. Fortran-ordered arrays are read into row-major order.

use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};

use half::f16;
use mmq_ir::DType;
use npyz::{Deserialize, NpyFile, Order, TypeChar, WriterBuilder};

use crate::tensor::{Data, Tensor};

/// Why reading or writing a NumPy file failed.
#[derive(Debug, thiserror::Error)]
#[error("{}{}: {message}", path.display(), member.as_ref().map(|m| format!(" ({m})")).unwrap_or_default())]
pub struct NpyError {
    /// The file.
    pub path: PathBuf,
    /// The array inside an `.npz` archive, when the problem is with one array.
    pub member: Option<String>,
    /// What is wrong.
    pub message: String,
}

fn error(path: &Path, member: Option<&str>, message: impl Into<String>) -> NpyError {
    NpyError {
        path: path.to_path_buf(),
        member: member.map(str::to_owned),
        message: message.into(),
    }
}

/// Opens a regular file for reading (a FIFO would block the open).
fn open(path: &Path) -> Result<File, NpyError> {
    mmq_ir::check_regular_file(path)
        .and_then(|()| File::open(path))
        .map_err(|e| error(path, None, format!("cannot open: {e}")))
}

/// Reads one `.npy` file.
pub fn read_npy(path: &Path) -> Result<Tensor, NpyError> {
    let file = open(path)?;
    npy_from_reader(BufReader::new(file)).map_err(|m| error(path, None, m))
}

/// Reads every array of an `.npz` archive, in archive order, keyed by array name (the member
/// name without its `.npy` suffix).
pub fn read_npz(path: &Path) -> Result<Vec<(String, Tensor)>, NpyError> {
    let file = open(path)?;
    npz_from_reader(BufReader::new(file)).map_err(|(name, m)| error(path, name.as_deref(), m))
}

/// Parses the bytes of an `.npz` archive (see [`read_npz`]); an error names the member.
pub fn npz_from_bytes(bytes: &[u8]) -> Result<Vec<(String, Tensor)>, ArrayError> {
    npz_from_reader(std::io::Cursor::new(bytes)).map_err(ArrayError::from)
}

/// In-memory `.npy` or `.npz` bytes that cannot be read, or a tensor that cannot be written as
/// `.npy`: the archive member it concerns, if one, and what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("{}{message}", member.as_ref().map(|m| format!("array '{m}': ")).unwrap_or_default())]
pub struct ArrayError {
    /// The archive member.
    pub member: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl From<NpzError> for ArrayError {
    fn from((member, message): NpzError) -> ArrayError {
        ArrayError { member, message }
    }
}

impl From<String> for ArrayError {
    fn from(message: String) -> ArrayError {
        ArrayError {
            member: None,
            message,
        }
    }
}

/// An `.npz` problem: the member it concerns, if one, and what is wrong.
type NpzError = (Option<String>, String);

/// The arrays of an `.npz` archive; an error with the member's name when it concerns one.
fn npz_from_reader<R: Read + std::io::Seek>(reader: R) -> Result<Vec<(String, Tensor)>, NpzError> {
    let mut out = Vec::new();
    each_member(reader, |name, member| {
        let t = npy_from_reader(&mut *member)?;
        // The member's CRC-32 is checked when it is read to its end.
        let rest = std::io::copy(member, &mut std::io::sink())
            .map_err(|e| format!("the member is corrupt: {e}"))?;
        if rest > 0 {
            return Err(format!(
                "{rest} bytes follow the array's data in its member"
            ));
        }
        out.push((name.to_owned(), t));
        Ok(())
    })?;
    Ok(out)
}

/// Parses the bytes of one `.npy` array (as `numpy.save` writes them).
pub fn npy_from_bytes(bytes: &[u8]) -> Result<Tensor, ArrayError> {
    Ok(npy_from_reader(bytes)?)
}

/// The deepest bracket nesting a `.npy` header may have.
const MAX_HEADER_NESTING: usize = 8;

/// Reads the header of a `.npy` stream and checks its shape's element count before the array
/// reader sees it (it multiplies the dims unchecked); returns the header bytes read.
fn checked_header(r: &mut impl Read) -> Result<Vec<u8>, String> {
    let mut head = vec![0u8; 10];
    r.read_exact(&mut head)
        .map_err(|e| format!("not a .npy array: {e}"))?;
    if &head[..6] != b"\x93NUMPY" {
        return Err("not a .npy array: no magic string".into());
    }
    let (len, extra) = if head[6] == 1 {
        (usize::from(u16::from_le_bytes([head[8], head[9]])), 0)
    } else {
        let mut more = [0u8; 2];
        r.read_exact(&mut more)
            .map_err(|e| format!("not a .npy array: {e}"))?;
        head.extend_from_slice(&more);
        (
            u32::from_le_bytes([head[8], head[9], more[0], more[1]]) as usize,
            2,
        )
    };
    if len > 1 << 20 {
        return Err(format!("not a .npy array: a header of {len} bytes"));
    }
    let start = head.len();
    head.resize(start + len, 0);
    r.read_exact(&mut head[start..])
        .map_err(|e| format!("not a .npy array: the header is cut short ({e})"))?;
    let text = String::from_utf8_lossy(&head[10 + extra..]);
    // A header is a dict of a dtype, a flag and a shape tuple: two levels of brackets (a
    // structured dtype, which is not read, a few more). The array reader's header parser takes
    // time exponential in the nesting (a 293-byte header of 50 '[' took minutes).
    let mut depth = 0usize;
    for c in text.chars() {
        match c {
            '(' | '[' | '{' => {
                depth += 1;
                if depth > MAX_HEADER_NESTING {
                    return Err(format!(
                        "not a .npy array: the header nests brackets more than \
                         {MAX_HEADER_NESTING} deep"
                    ));
                }
            }
            ')' | ']' | '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    if let Some(at) = text.find("'shape'")
        && let Some(open) = text[at..].find('(')
        && let Some(close) = text[at + open..].find(')')
    {
        let tuple = &text[at + open + 1..at + open + close];
        let mut count: u128 = 1;
        for d in tuple.split(',').map(str::trim).filter(|d| !d.is_empty()) {
            let d: u128 = d
                .trim_end_matches('L')
                .parse()
                .map_err(|_| format!("not a .npy array: dimension '{d}' in the shape"))?;
            count = count.saturating_mul(d);
        }
        // Bytes per element from the dtype string ('<f4', '|b1', '<U10': 4 bytes per char).
        let item: u128 = text
            .find("'descr'")
            .and_then(|at| {
                let rest = &text[at + 7..];
                let q = rest.find('\'')?;
                let end = rest[q + 1..].find('\'')?;
                let descr = &rest[q + 1..q + 1 + end];
                let digits: String = descr.chars().filter(char::is_ascii_digit).collect();
                let n: u128 = digits.parse().ok()?;
                Some(if descr.contains('U') { n * 4 } else { n })
            })
            .unwrap_or(8)
            .max(1);
        let bytes = count.saturating_mul(item);
        if count > usize::MAX as u128 / 16 || bytes > u128::from(crate::tensor::memory_limit()) {
            return Err(format!(
                "shape ({tuple}): {bytes} bytes, more than the memory limit of {} bytes \
                 (--max-memory; a corrupt or hostile header?)",
                crate::tensor::memory_limit()
            ));
        }
    }
    Ok(head)
}

/// What an array's header says: its element type and shape, known before its data is read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NpyHeader {
    /// The array's name (an `.npz` member name without `.npy`; empty for a `.npy` file).
    pub name: String,
    /// The element type.
    pub dtype: DType,
    /// The shape, row-major.
    pub shape: Vec<usize>,
}

/// The headers of every array of an `.npz` archive, in archive order, read without inflating
/// the arrays' data: a caller checks the shapes against what it expects before [`read_npz`]
/// inflates a member that claims a gigabyte.
pub fn npz_headers(path: &Path) -> Result<Vec<NpyHeader>, NpyError> {
    let file = open(path)?;
    headers_from_reader(BufReader::new(file)).map_err(|(name, m)| error(path, name.as_deref(), m))
}

/// [`npz_headers`] of an archive's bytes; an error names the member.
pub fn npz_headers_from_bytes(bytes: &[u8]) -> Result<Vec<NpyHeader>, ArrayError> {
    headers_from_reader(std::io::Cursor::new(bytes)).map_err(ArrayError::from)
}

fn headers_from_reader<R: Read + std::io::Seek>(reader: R) -> Result<Vec<NpyHeader>, NpzError> {
    let mut out: Vec<NpyHeader> = Vec::new();
    each_member(reader, |name, member| {
        let (dtype, shape) = npy_header(member).and_then(|npy| header_type(&npy))?;
        out.push(NpyHeader {
            name: name.to_owned(),
            dtype,
            shape,
        });
        Ok(())
    })?;
    Ok(out)
}

/// Calls `f` with each member of an `.npz` archive and its array name, in archive order
/// (directories skipped, an array named twice refused); an error of `f` names the member.
fn each_member<R: Read + std::io::Seek>(
    reader: R,
    mut f: impl FnMut(&str, &mut zip::read::ZipFile<'_, R>) -> Result<(), String>,
) -> Result<(), NpzError> {
    let mut reader = reader;
    let listed = listed_members(&mut reader);
    let mut zip =
        zip::ZipArchive::new(reader).map_err(|e| (None, format!("not an .npz archive: {e}")))?;
    // The archive reader keys members by name: two members of one name become one.
    if let Some(listed) = listed
        && listed != zip.len() as u64
    {
        return Err((
            None,
            format!(
                "the archive lists {listed} members under {} distinct names: a member name \
                 appears twice (an archive holds each array once)",
                zip.len()
            ),
        ));
    }
    let mut names: Vec<String> = Vec::with_capacity(zip.len());
    for i in 0..zip.len() {
        let mut member = zip
            .by_index(i)
            .map_err(|e| (None, format!("member #{i}: {e}")))?;
        if member.is_dir() {
            continue;
        }
        let name = member_name(&member, i, names.iter().map(String::as_str))?;
        f(&name, &mut member).map_err(|m| (Some(name.clone()), m))?;
        names.push(name);
    }
    Ok(())
}

/// The member count an archive's end-of-central-directory record states (`None` when it
/// cannot be read or defers to a ZIP64 record); the reader is left at the start.
fn listed_members<R: Read + std::io::Seek>(r: &mut R) -> Option<u64> {
    use std::io::SeekFrom;
    let len = r.seek(SeekFrom::End(0)).ok()?;
    // The record is 22 bytes plus a comment of at most 65,535.
    let tail = len.min(22 + 65_535);
    r.seek(SeekFrom::Start(len - tail)).ok()?;
    let mut buf = vec![0u8; usize::try_from(tail).ok()?];
    let read = r.read_exact(&mut buf);
    r.seek(SeekFrom::Start(0)).ok()?;
    read.ok()?;
    let at = buf
        .windows(4)
        .rposition(|w| w == [0x50, 0x4b, 0x05, 0x06])?;
    let count = u16::from_le_bytes([*buf.get(at + 10)?, *buf.get(at + 11)?]);
    (count != u16::MAX).then_some(u64::from(count))
}

/// A member's array name (its name without `.npy`), refused when an earlier member in `seen`
/// already gave that array.
fn member_name<'a, R: Read>(
    member: &zip::read::ZipFile<'_, R>,
    i: usize,
    mut seen: impl Iterator<Item = &'a str>,
) -> Result<String, NpzError> {
    let full = member
        .name()
        .map_err(|e| (None, format!("member #{i}: {e}")))?
        .into_owned();
    let name = full.strip_suffix(".npy").unwrap_or(&full).to_owned();
    if let Some(other) = seen.find(|n| *n == name) {
        return Err((
            Some(name.clone()),
            format!(
                "member '{full}' names the array '{other}' a second time (an archive holds each \
                 array once)"
            ),
        ));
    }
    Ok(name)
}

/// The array reader over a stream whose header was checked ([`checked_header`]).
type Npy<R> = NpyFile<std::io::Chain<std::io::Cursor<Vec<u8>>, R>>;

/// Reads and checks the header of a `.npy` stream; the reader then reads the data.
fn npy_header<R: Read>(mut r: R) -> Result<Npy<R>, String> {
    let head = checked_header(&mut r)?;
    NpyFile::new(std::io::Cursor::new(head).chain(r)).map_err(|e| format!("not a .npy array: {e}"))
}

/// The element type and shape a header declares; an error for what cannot be read.
fn header_type<R: Read>(npy: &NpyFile<R>) -> Result<(DType, Vec<usize>), String> {
    let shape: Vec<usize> = npy
        .shape()
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| format!("dimension {d} is too large")))
        .collect::<Result<_, _>>()?;
    if crate::tensor::numel(&shape).is_none() {
        return Err(format!(
            "shape {shape:?}: more elements than fit in memory (the header is corrupt or hostile)"
        ));
    }
    let ts = match npy.dtype() {
        npyz::DType::Plain(ts) => ts,
        other => {
            return Err(format!(
                "structured dtype {} is not supported",
                other.descr()
            ));
        }
    };
    let dtype = match (ts.type_char(), ts.size_field()) {
        (TypeChar::Bool, 1) => DType::Bool,
        (TypeChar::Int, 1) => DType::I8,
        (TypeChar::Int, 2) => DType::I16,
        (TypeChar::Int, 4) => DType::I32,
        (TypeChar::Int, 8) => DType::I64,
        (TypeChar::Uint, 1) => DType::U8,
        (TypeChar::Uint, 2) => DType::U16,
        (TypeChar::Uint, 4) => DType::U32,
        (TypeChar::Uint, 8) => DType::U64,
        (TypeChar::Float, 2) => DType::F16,
        (TypeChar::Float, 4) => DType::F32,
        (TypeChar::Float, 8) => DType::F64,
        (TypeChar::UnicodeStr, _) => DType::String,
        _ => {
            let hint = if ts.type_char() == TypeChar::RawData {
                " (bf16, fp8 and int4 arrays have no NumPy dtype; store them as their integer \
                 codes)"
            } else {
                ""
            };
            return Err(format!("dtype '{ts}' is not supported{hint}"));
        }
    };
    Ok((dtype, shape))
}

/// Parses `.npy` bytes from a reader.
fn npy_from_reader(r: impl Read) -> Result<Tensor, String> {
    let npy = npy_header(r)?;
    let (dtype, shape) = header_type(&npy)?;
    let fortran = npy.order() == Order::Fortran;
    fn read<T: Deserialize, R: Read>(npy: NpyFile<R>) -> Result<Vec<T>, String> {
        npy.into_vec::<T>()
            .map_err(|e| format!("cannot read the elements: {e}"))
    }
    let data = match dtype {
        DType::Bool => Data::Bool(read(npy)?),
        DType::I8 => Data::I8(read(npy)?),
        DType::I16 => Data::I16(read(npy)?),
        DType::I32 => Data::I32(read(npy)?),
        DType::I64 => Data::I64(read(npy)?),
        DType::U8 => Data::U8(read(npy)?),
        DType::U16 => Data::U16(read(npy)?),
        DType::U32 => Data::U32(read(npy)?),
        DType::U64 => Data::U64(read(npy)?),
        DType::F16 => Data::F16(read::<f16, _>(npy)?),
        DType::F32 => Data::F32(read(npy)?),
        DType::F64 => Data::F64(read(npy)?),
        _ => Data::Str(read(npy)?),
    };
    let data = if fortran && shape.len() > 1 {
        to_row_major(data, &shape)
    } else {
        data
    };
    Tensor::new(dtype, shape, data).map_err(|e| e.to_string())
}

/// Reorders column-major elements into row-major order.
fn to_row_major(data: Data, shape: &[usize]) -> Data {
    fn reorder<T: Clone>(v: Vec<T>, shape: &[usize]) -> Vec<T> {
        // Column-major strides of the source.
        let mut strides = vec![1usize; shape.len()];
        for i in 1..shape.len() {
            strides[i] = strides[i - 1] * shape[i - 1];
        }
        let mut idx = vec![0usize; shape.len()];
        let mut out = Vec::with_capacity(v.len());
        for _ in 0..v.len() {
            let src: usize = idx.iter().zip(&strides).map(|(i, s)| i * s).sum();
            out.push(v[src].clone());
            for d in (0..shape.len()).rev() {
                idx[d] += 1;
                if idx[d] < shape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        out
    }
    match data {
        Data::Bool(v) => Data::Bool(reorder(v, shape)),
        Data::U8(v) => Data::U8(reorder(v, shape)),
        Data::I8(v) => Data::I8(reorder(v, shape)),
        Data::U16(v) => Data::U16(reorder(v, shape)),
        Data::I16(v) => Data::I16(reorder(v, shape)),
        Data::U32(v) => Data::U32(reorder(v, shape)),
        Data::I32(v) => Data::I32(reorder(v, shape)),
        Data::U64(v) => Data::U64(reorder(v, shape)),
        Data::I64(v) => Data::I64(reorder(v, shape)),
        Data::F16(v) => Data::F16(reorder(v, shape)),
        Data::BF16(v) => Data::BF16(reorder(v, shape)),
        Data::F32(v) => Data::F32(reorder(v, shape)),
        Data::F64(v) => Data::F64(reorder(v, shape)),
        Data::Str(v) => Data::Str(reorder(v, shape)),
        Data::Codes(v) => Data::Codes(reorder(v, shape)),
    }
}

/// The `.npy` bytes of a tensor (what `numpy.load` reads); an error names a dtype NumPy lacks.
pub fn npy_bytes(t: &Tensor) -> Result<Vec<u8>, ArrayError> {
    Ok(encode_npy(t)?)
}

fn encode_npy(t: &Tensor) -> Result<Vec<u8>, String> {
    let shape: Vec<u64> = t.shape.iter().map(|&d| d as u64).collect();
    let mut buf = Vec::new();
    fn put<T: npyz::Serialize + npyz::AutoSerialize + Clone>(
        buf: &mut Vec<u8>,
        shape: &[u64],
        v: &[T],
    ) -> std::io::Result<()> {
        let mut w = npyz::WriteOptions::new()
            .default_dtype()
            .shape(shape)
            .writer(buf)
            .begin_nd()?;
        w.extend(v.iter().cloned())?;
        w.finish()
    }
    let r = match &t.data {
        Data::Bool(v) => put(&mut buf, &shape, v),
        Data::U8(v) => put(&mut buf, &shape, v),
        Data::I8(v) => put(&mut buf, &shape, v),
        Data::U16(v) => put(&mut buf, &shape, v),
        Data::I16(v) => put(&mut buf, &shape, v),
        Data::U32(v) => put(&mut buf, &shape, v),
        Data::I32(v) => put(&mut buf, &shape, v),
        Data::U64(v) => put(&mut buf, &shape, v),
        Data::I64(v) => put(&mut buf, &shape, v),
        Data::F16(v) => put(&mut buf, &shape, v),
        Data::F32(v) => put(&mut buf, &shape, v),
        Data::F64(v) => put(&mut buf, &shape, v),
        Data::Str(v) => {
            let width = v
                .iter()
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
                .max(1);
            let dtype = format!("<U{width}")
                .parse::<npyz::TypeStr>()
                .map_err(|e| e.to_string())?;
            (|| {
                let mut w = npyz::WriteOptions::<str>::new()
                    .dtype(npyz::DType::Plain(dtype))
                    .shape(&shape)
                    .writer(&mut buf)
                    .begin_nd()?;
                for s in v {
                    w.push(s.as_str())?;
                }
                w.finish()
            })()
        }
        Data::BF16(_) | Data::Codes(_) => {
            return Err(format!(
                "{} has no NumPy dtype; cast it to f32 first",
                t.dtype
            ));
        }
    };
    r.map_err(|e| format!("cannot encode: {e}"))?;
    Ok(buf)
}

/// Writes tensors as an `.npz` archive (uncompressed, like `numpy.savez`). The file is written
/// to a temporary file beside `path` and renamed over it, so a failed write leaves no partial
/// file behind.
pub fn write_npz(path: &Path, arrays: &[(&str, &Tensor)]) -> Result<(), NpyError> {
    let mut members = Vec::with_capacity(arrays.len());
    for (name, t) in arrays {
        let bytes = encode_npy(t).map_err(|m| error(path, Some(name), m))?;
        members.push((*name, bytes));
    }
    let result = (|| -> Result<(), String> {
        let out = mmq_ir::fsio::AtomicFile::create(path)
            .map_err(|e| format!("cannot create a file for {}: {e}", path.display()))?;
        let mut zip = zip::ZipWriter::new(std::io::BufWriter::new(out.file()));
        for (name, bytes) in &members {
            let opts = zip::write::SimpleFileOptions::default()
                .compression_method(zip::CompressionMethod::Stored)
                .large_file(bytes.len() as u64 >= u64::from(u32::MAX));
            zip.start_file(format!("{name}.npy"), opts)
                .map_err(|e| format!("cannot write member {name}: {e}"))?;
            zip.write_all(bytes)
                .map_err(|e| format!("cannot write member {name}: {e}"))?;
        }
        let mut w = zip
            .finish()
            .map_err(|e| format!("cannot finish the archive: {e}"))?;
        w.flush().map_err(|e| format!("cannot write: {e}"))?;
        let file = w
            .into_inner()
            .map_err(|e| format!("cannot write: {}", e.error()))?;
        file.sync_all().map_err(|e| format!("cannot write: {e}"))?;
        out.persist()
            .map_err(|e| format!("cannot rename into {}: {e}", path.display()))
    })();
    if let Err(m) = result {
        return Err(error(path, None, m));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npz_round_trip_keeps_dtypes_shapes_and_order() {
        let dir = std::env::temp_dir().join(format!("mmq-io-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("t.npz");
        let a = Tensor::from_f32(vec![2, 3], vec![1.0, -2.0, 3.5, 0.0, f32::NAN, 6.0]).expect("a");
        let b = Tensor::new(DType::Bool, vec![2], Data::Bool(vec![true, false])).expect("b");
        let c = Tensor::new(DType::F16, vec![0, 4], Data::F16(Vec::new())).expect("c");
        let s = Tensor::new(
            DType::String,
            vec![2],
            Data::Str(vec!["héllo".into(), String::new()]),
        )
        .expect("s");
        let i = Tensor::from_i64(vec![], vec![-7]).expect("i");
        write_npz(
            &path,
            &[("z", &a), ("b", &b), ("c", &c), ("s", &s), ("i", &i)],
        )
        .expect("write");
        let back = read_npz(&path).expect("read");
        let names: Vec<&str> = back.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["z", "b", "c", "s", "i"]);
        let Data::F32(v) = &back[0].1.data else {
            panic!("f32 expected")
        };
        assert_eq!(back[0].1.shape, [2, 3]);
        assert!(v[4].is_nan());
        assert_eq!(v[2], 3.5);
        assert_eq!(back[1].1, b);
        assert_eq!(back[2].1, c);
        assert_eq!(back[3].1, s);
        assert_eq!(back[4].1, i);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn types_without_numpy_dtype_are_refused() {
        let t = Tensor::new(DType::BF16, vec![1], Data::BF16(vec![half::bf16::ONE])).expect("t");
        let err = write_npz(Path::new("/nonexistent/x.npz"), &[("w", &t)]).unwrap_err();
        assert!(err.to_string().contains("bf16 has no NumPy dtype"), "{err}");
    }

    #[test]
    fn fortran_order_is_reordered() {
        let d = to_row_major(Data::I64(vec![1, 4, 2, 5, 3, 6]), &[2, 3]);
        assert_eq!(d, Data::I64(vec![1, 2, 3, 4, 5, 6]));
    }

    #[test]
    fn garbage_is_an_error_naming_the_file() {
        let dir = std::env::temp_dir().join(format!("mmq-io-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let p = dir.join("bad.npy");
        std::fs::write(&p, b"not numpy").expect("write");
        let err = read_npy(&p).unwrap_err();
        assert!(err.to_string().contains("bad.npy"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
