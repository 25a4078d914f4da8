//! QPQR: one memory-mapped table of every scale and zero point of a compiled model, shared by
//! the processes that serve it (`mmq compile --qparams OUT.qpqr`, `mmq qparams inspect|verify`).
//!
//! The format, byte by byte, is in `docs/qparams.md`: a 64-byte header (`magic` u32
//! `0x51504152` at offset 0, `length` u32 = number of (scale, zero point) pairs at offset 4), the
//! pairs (binary16 scale, u16 zero point), a versioned index (tensor name, scheme, axis, group
//! size, first pair, count, exact scales), the names, and the exact scale tensors in the model's
//! own element type, each section and tensor aligned to 64 bytes; an xxh3-64 checksum covers the
//! file. [`QParamTable::open`] maps the file read-only and shared and validates every offset and
//! count before anything is read through them, so a truncated, corrupted or hostile file is an
//! error, never an out-of-bounds read.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use half::f16;
use memmap2::{Mmap, MmapOptions};
use mmq_ir::{Const, ConstData, DType, Module, Op, Value, ValueDef};

/// `magic` at offset 0 (written little-endian).
pub const MAGIC: u32 = 0x5150_4152;
/// The format version this reader and writer speak.
pub const VERSION: u16 = 1;
/// Bytes of the header.
pub const HEADER_BYTES: u64 = 64;
/// Bytes of one index entry.
pub const ENTRY_BYTES: u64 = 48;
/// Alignment of every section and of every exact scale tensor.
pub const ALIGN: u64 = 64;
/// Offset of the checksum in the header.
const CHECKSUM_AT: usize = 56;

/// How a tensor's scales map onto its elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Layout {
    /// One scale.
    PerTensor,
    /// One scale per index of `axis`.
    PerChannel,
    /// One scale per group of `group_size` along `axis`.
    PerGroup,
}

impl Layout {
    fn code(self) -> u8 {
        match self {
            Layout::PerTensor => 0,
            Layout::PerChannel => 1,
            Layout::PerGroup => 2,
        }
    }

    fn from_code(c: u8) -> Option<Layout> {
        [Layout::PerTensor, Layout::PerChannel, Layout::PerGroup]
            .into_iter()
            .find(|s| s.code() == c)
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Layout::PerTensor => "per-tensor",
            Layout::PerChannel => "per-channel",
            Layout::PerGroup => "per-group",
        })
    }
}

/// One scale tensor of the table.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Entry {
    /// The scale tensor's name in the model.
    pub name: String,
    /// How its scales map onto its elements.
    pub scheme: Layout,
    /// The ONNX element type of the codes (INT8 3, UINT8 2, INT4 22, UINT4 21, FP8 17).
    pub code_type: i32,
    /// The ONNX element type of the exact scales (FLOAT 1, FLOAT16 10).
    pub scale_type: i32,
    /// The quantized axis (per-channel, per-group), else 0.
    pub axis: i32,
    /// The group size (per-group), else 0.
    pub group_size: u32,
    /// The first pair.
    pub first_pair: u32,
    /// Pairs (= scales).
    pub count: u32,
    /// The exact scales' offset in the file (a multiple of 64) and length.
    pub raw_offset: u64,
    /// Length of the exact scales in bytes.
    pub raw_bytes: u64,
}

/// A table problem: what and where.
#[derive(Debug, thiserror::Error)]
pub enum QParamError {
    /// The file cannot be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a valid table.
    #[error("{path}: {what}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the offset.
        what: String,
    },
    /// The model's parameters cannot be written (a non-constant scale, a shape that does not
    /// fit the format).
    #[error("{0}")]
    Model(String),
    /// The model has no quantization parameters: nothing is written.
    #[error(
        "the compiled model has no quantization parameters: every quantized unit was kept \
         float (estimated faster in float at these sizes; --placement all quantizes them); no \
         table written"
    )]
    Empty,
}

/// One scale tensor found in a module, with its zero points.
#[derive(Clone, Debug)]
pub struct Found {
    /// The value the nodes read the scales through.
    pub value: Value,
    /// Its constant.
    pub scale: Const,
    /// The zero-point constant, if any.
    pub zero: Option<Const>,
    /// Zero points packed two per byte (`MatMulNBits`).
    pub packed_zero: bool,
    /// The default zero point when `zero` is absent (`MatMulNBits`: 8).
    pub default_zero: i32,
    /// The layout, axis and group size.
    pub scheme: Layout,
    /// Axis.
    pub axis: i32,
    /// Group size.
    pub group_size: u32,
    /// Code element type.
    pub code_type: i32,
}

/// (scale operand, zero-point operand) positions of the ops that read quantization parameters.
fn roles(op: &Op) -> &'static [(usize, usize)] {
    match op {
        Op::QuantizeLinear { .. } | Op::DequantizeLinear { .. } => &[(1, 2)],
        Op::QLinearMatMul { .. } | Op::QLinearConv { .. } => &[(1, 2), (4, 5), (6, 7)],
        Op::MatMulNBits { .. } => &[(2, 3)],
        Op::Custom(c) if c.domain == "com.microsoft" => match c.op_type.as_str() {
            "DynamicQuantizeMatMul" => &[(2, 3)],
            "MatMulIntegerToFloat" => &[(2, 4), (3, 5)],
            _ => &[],
        },
        _ => &[],
    }
}

fn initializer(m: &Module, v: Value) -> Option<Const> {
    match m.values[v].def {
        ValueDef::Const(c) => Some(c),
        _ => None,
    }
}

/// Every constant scale tensor the module's nodes read, once each, in node order.
pub fn collect(m: &Module) -> Vec<Found> {
    let mut out: Vec<Found> = Vec::new();
    for e in &m.entries {
        for g in m.graph_tree(e.graph) {
            for &n in m.graphs[g].nodes() {
                let nd = &m.nodes[n];
                for &(si, zi) in roles(&nd.op) {
                    let Some(Some(sv)) = nd.inputs.get(si).copied() else {
                        continue;
                    };
                    let Some(scale) = initializer(m, sv) else {
                        continue;
                    };
                    if out.iter().any(|f| f.scale == scale) {
                        continue;
                    }
                    let zero = nd
                        .inputs
                        .get(zi)
                        .copied()
                        .flatten()
                        .and_then(|z| initializer(m, z));
                    let numel: i64 = m.consts[scale].shape.iter().product();
                    let nbits = matches!(&nd.op, Op::MatMulNBits { .. });
                    let block = nd.op.get::<i64>("block_size").unwrap_or(0);
                    let (scheme, axis, group) = if nbits {
                        (Layout::PerGroup, 1, block)
                    } else if block > 0 {
                        (
                            Layout::PerGroup,
                            nd.op.get::<i64>("axis").unwrap_or(1),
                            block,
                        )
                    } else if numel > 1 {
                        (Layout::PerChannel, nd.op.get::<i64>("axis").unwrap_or(1), 0)
                    } else {
                        (Layout::PerTensor, 0, 0)
                    };
                    let code_type = if nbits {
                        DType::U4.onnx_code()
                    } else {
                        zero.map(|z| m.consts[z].dtype)
                            .or_else(|| match &nd.op {
                                Op::DequantizeLinear { .. } => {
                                    nd.inputs[0].and_then(|x| m.value_type(x).dtype())
                                }
                                _ => None,
                            })
                            .unwrap_or(DType::U8)
                            .onnx_code()
                    };
                    out.push(Found {
                        value: sv,
                        scale,
                        zero,
                        packed_zero: nbits,
                        default_zero: if nbits { 8 } else { 0 },
                        scheme,
                        axis: axis as i32,
                        group_size: group as u32,
                        code_type,
                    });
                }
            }
        }
    }
    out
}

fn const_bytes(c: &ConstData) -> Result<Vec<u8>, QParamError> {
    c.raw_bytes().map(<[u8]>::to_vec).ok_or_else(|| {
        QParamError::Model(format!(
            "scale tensor '{}' has no bytes",
            c.name.clone().unwrap_or_default()
        ))
    })
}

fn values_f32(c: &ConstData) -> Result<Vec<f32>, QParamError> {
    let b = const_bytes(c)?;
    match c.dtype {
        DType::F32 => Ok(b
            .chunks_exact(4)
            .map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]]))
            .collect()),
        DType::F16 => Ok(b
            .chunks_exact(2)
            .map(|x| f16::from_le_bytes([x[0], x[1]]).to_f32())
            .collect()),
        DType::BF16 => Ok(b
            .chunks_exact(2)
            .map(|x| half::bf16::from_le_bytes([x[0], x[1]]).to_f32())
            .collect()),
        d => Err(QParamError::Model(format!(
            "scale tensor '{}' is {d}, not a float type",
            c.name.clone().unwrap_or_default()
        ))),
    }
}

/// Zero points as integers, `count` of them.
fn zeros(m: &Module, f: &Found, count: usize) -> Result<Vec<i32>, QParamError> {
    let Some(z) = f.zero else {
        return Ok(vec![f.default_zero; count]);
    };
    let c = &m.consts[z];
    let b = const_bytes(c)?;
    let v: Vec<i32> = if f.packed_zero {
        // MatMulNBits: rows of ceil(blocks / 2) bytes, low nibble first.
        let rows = c.shape.first().copied().unwrap_or(1).max(1) as usize;
        let per_row = count / rows;
        let row_bytes = b.len() / rows;
        (0..count)
            .map(|i| {
                let (r, j) = (i / per_row, i % per_row);
                let byte = b[r * row_bytes + j / 2];
                i32::from(if j % 2 == 0 { byte & 15 } else { byte >> 4 })
            })
            .collect()
    } else {
        match c.dtype {
            DType::I8 => b.iter().map(|&x| i32::from(x as i8)).collect(),
            DType::U8 => b.iter().map(|&x| i32::from(x)).collect(),
            DType::I16 => b
                .chunks_exact(2)
                .map(|x| i32::from(i16::from_le_bytes([x[0], x[1]])))
                .collect(),
            DType::U16 => b
                .chunks_exact(2)
                .map(|x| i32::from(u16::from_le_bytes([x[0], x[1]])))
                .collect(),
            DType::I4 | DType::U4 => (0..count)
                .map(|i| {
                    let nib = (b[i / 2] >> (4 * (i % 2))) & 15;
                    if c.dtype == DType::I4 && nib >= 8 {
                        i32::from(nib) - 16
                    } else {
                        i32::from(nib)
                    }
                })
                .collect(),
            // FP8 zero points are 0 by definition.
            _ => vec![0; count],
        }
    };
    if v.len() < count {
        return Err(QParamError::Model(format!(
            "zero points of '{}' hold {} values for {count} scales",
            c.name.clone().unwrap_or_default(),
            v.len()
        )));
    }
    Ok(v[..count].to_vec())
}

fn align(n: u64) -> u64 {
    n.div_ceil(ALIGN) * ALIGN
}

/// What [`write`] wrote.
#[derive(Clone, Debug)]
pub struct Written {
    /// The entries, as the file holds them.
    pub entries: Vec<Entry>,
    /// The file's size.
    pub bytes: u64,
}

/// Writes the table of the scales in `found` to `path` (a temporary file, then a rename), with
/// the entries named by `names` (the names the model is exported with).
pub fn write(
    m: &Module,
    found: &[Found],
    names: &[String],
    path: &Path,
) -> Result<Written, QParamError> {
    let mut pairs: Vec<u8> = Vec::new();
    let mut strings: Vec<u8> = Vec::new();
    let mut raws: Vec<Vec<u8>> = Vec::new();
    let mut entries = Vec::new();
    let mut count_total: u64 = 0;
    for (f, name) in found.iter().zip(names) {
        let c = &m.consts[f.scale];
        let scales = values_f32(c)?;
        let z = zeros(m, f, scales.len())?;
        for (s, z) in scales.iter().zip(&z) {
            pairs.extend_from_slice(&f16::from_f32(*s).to_le_bytes());
            pairs.extend_from_slice(&(*z as i16 as u16).to_le_bytes());
        }
        let count = u32::try_from(scales.len())
            .map_err(|_| QParamError::Model(format!("'{name}' has more than 2^32 scales")))?;
        entries.push(Entry {
            name: name.clone(),
            scheme: f.scheme,
            code_type: f.code_type,
            scale_type: c.dtype.onnx_code(),
            axis: f.axis,
            group_size: f.group_size,
            first_pair: u32::try_from(count_total)
                .map_err(|_| QParamError::Model("more than 2^32 scales in all".into()))?,
            count,
            raw_offset: 0,
            raw_bytes: c.byte_len(),
        });
        count_total += u64::from(count);
        strings.extend_from_slice(name.as_bytes());
        raws.push(const_bytes(c)?);
    }
    let length = u32::try_from(count_total)
        .map_err(|_| QParamError::Model("more than 2^32 scales in all".into()))?;
    let pairs_offset = HEADER_BYTES;
    let index_offset = align(pairs_offset + pairs.len() as u64);
    let strings_offset = align(index_offset + entries.len() as u64 * ENTRY_BYTES);
    let raw_offset = align(strings_offset + strings.len() as u64);
    let mut at = raw_offset;
    for (e, r) in entries.iter_mut().zip(&raws) {
        e.raw_offset = at;
        at = align(at + r.len() as u64);
    }
    let file_bytes = at;

    let mut buf = vec![0u8; file_bytes as usize];
    let put = |buf: &mut [u8], off: u64, b: &[u8]| {
        buf[off as usize..off as usize + b.len()].copy_from_slice(b)
    };
    put(&mut buf, 0, &MAGIC.to_le_bytes());
    put(&mut buf, 4, &length.to_le_bytes());
    put(&mut buf, 8, &VERSION.to_le_bytes());
    put(&mut buf, 10, &(HEADER_BYTES as u16).to_le_bytes());
    put(&mut buf, 12, &(entries.len() as u32).to_le_bytes());
    for (k, v) in [
        pairs_offset,
        index_offset,
        strings_offset,
        raw_offset,
        file_bytes,
    ]
    .iter()
    .enumerate()
    {
        put(&mut buf, 16 + 8 * k as u64, &v.to_le_bytes());
    }
    put(&mut buf, pairs_offset, &pairs);
    let mut name_at = 0u32;
    for (i, e) in entries.iter().enumerate() {
        let o = index_offset + i as u64 * ENTRY_BYTES;
        let mut rec = [0u8; ENTRY_BYTES as usize];
        rec[0..4].copy_from_slice(&name_at.to_le_bytes());
        rec[4..8].copy_from_slice(&(e.name.len() as u32).to_le_bytes());
        rec[8] = e.scheme.code();
        rec[9] = e.code_type as u8;
        rec[10] = e.scale_type as u8;
        rec[12..16].copy_from_slice(&e.axis.to_le_bytes());
        rec[16..20].copy_from_slice(&e.group_size.to_le_bytes());
        rec[20..24].copy_from_slice(&e.first_pair.to_le_bytes());
        rec[24..28].copy_from_slice(&e.count.to_le_bytes());
        rec[32..40].copy_from_slice(&e.raw_offset.to_le_bytes());
        rec[40..48].copy_from_slice(&e.raw_bytes.to_le_bytes());
        put(&mut buf, o, &rec);
        name_at += e.name.len() as u32;
    }
    put(&mut buf, strings_offset, &strings);
    for (e, r) in entries.iter().zip(&raws) {
        put(&mut buf, e.raw_offset, r);
    }
    let sum = checksum(&buf);
    put(&mut buf, CHECKSUM_AT as u64, &sum.to_le_bytes());

    let io = |e| QParamError::Io {
        path: path.to_owned(),
        source: e,
    };
    mmq_ir::fsio::write_atomic(path, &buf).map_err(io)?;
    Ok(Written {
        entries,
        bytes: file_bytes,
    })
}

/// xxh3-64 of the file with the checksum field read as zero.
fn checksum(file: &[u8]) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&file[..CHECKSUM_AT]);
    h.update(&[0u8; 8]);
    h.update(&file[CHECKSUM_AT + 8..]);
    h.digest()
}

/// A table mapped read-only and shared; every offset was validated by [`QParamTable::open`].
pub struct QParamTable {
    path: PathBuf,
    map: Mmap,
    pairs_offset: usize,
    length: usize,
    entries: Vec<Entry>,
}

impl QParamTable {
    /// Maps `path` and validates its header, sections and index (not the checksum: see
    /// [`QParamTable::verify`]).
    pub fn open(path: &Path) -> Result<QParamTable, QParamError> {
        let io = |e| QParamError::Io {
            path: path.to_owned(),
            source: e,
        };
        mmq_ir::check_regular_file(path).map_err(|e| QParamError::Invalid {
            path: path.to_owned(),
            what: e.to_string(),
        })?;
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only; a process truncating the file underneath would be a
        // SIGBUS, as for every mapped model file; the table is written by rename, never in place.
        #[allow(
            unsafe_code,
            reason = "the table is mapped read only; verify checks its checksum"
        )]
        let map = unsafe { MmapOptions::new().map(&file) }.map_err(io)?;
        let (pairs_offset, length, entries) = parse(&map).map_err(|what| QParamError::Invalid {
            path: path.to_owned(),
            what,
        })?;
        Ok(QParamTable {
            path: path.to_owned(),
            map,
            pairs_offset,
            length,
            entries,
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The mapped bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// Number of (scale, zero point) pairs.
    pub fn len(&self) -> usize {
        self.length
    }

    /// Whether the table has no pair.
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    /// The index.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The entry named `name`.
    pub fn entry(&self, name: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.name == name)
    }

    /// The raw pairs of `e` (4 bytes each: binary16 scale, u16 zero point), without copying.
    pub fn pair_bytes(&self, e: &Entry) -> &[u8] {
        let start = self.pairs_offset + e.first_pair as usize * 4;
        &self.map[start..start + e.count as usize * 4]
    }

    /// The pairs of `e` decoded: (scale, zero point as a signed 16-bit value).
    pub fn pairs(&self, e: &Entry) -> Vec<(f32, i16)> {
        self.pair_bytes(e)
            .chunks_exact(4)
            .map(|p| {
                (
                    f16::from_le_bytes([p[0], p[1]]).to_f32(),
                    i16::from_le_bytes([p[2], p[3]]),
                )
            })
            .collect()
    }

    /// The exact scales of `e` in the model's element type, without copying.
    pub fn raw(&self, e: &Entry) -> &[u8] {
        &self.map[e.raw_offset as usize..(e.raw_offset + e.raw_bytes) as usize]
    }

    /// Checks the checksum and that every pair's scale is its exact scale rounded to binary16.
    pub fn verify(&self) -> Result<(), QParamError> {
        let bad = |what: String| QParamError::Invalid {
            path: self.path.clone(),
            what,
        };
        let stored = u64::from_le_bytes(
            self.map[CHECKSUM_AT..CHECKSUM_AT + 8]
                .try_into()
                .expect("8 bytes"),
        );
        let actual = checksum(&self.map);
        if stored != actual {
            return Err(bad(format!(
                "checksum {actual:#018x} differs from the stored {stored:#018x} (offset {CHECKSUM_AT}): the file was changed"
            )));
        }
        self.check_meaning().map_err(bad)?;
        for e in &self.entries {
            let exact: Vec<f32> = match e.scale_type {
                1 => self
                    .raw(e)
                    .chunks_exact(4)
                    .map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]]))
                    .collect(),
                10 => self
                    .raw(e)
                    .chunks_exact(2)
                    .map(|x| f16::from_le_bytes([x[0], x[1]]).to_f32())
                    .collect(),
                16 => self
                    .raw(e)
                    .chunks_exact(2)
                    .map(|x| half::bf16::from_le_bytes([x[0], x[1]]).to_f32())
                    .collect(),
                t => {
                    return Err(bad(format!(
                        "entry '{}': scale element type {t} is not a float type",
                        e.name
                    )));
                }
            };
            for (i, ((s, _), x)) in self.pairs(e).iter().zip(&exact).enumerate() {
                let want = f16::from_f32(*x).to_f32();
                if s.to_bits() != want.to_bits() && !(s.is_nan() && want.is_nan()) {
                    return Err(bad(format!(
                        "entry '{}': pair {i} has scale {s}, its exact scale is {x}",
                        e.name
                    )));
                }
            }
        }
        Ok(())
    }
}

impl QParamTable {
    /// What the layout and checksum cannot show: every entry's name once, its pairs its own,
    /// its scheme's shape (one pair per tensor, a group size per group), every scale a finite
    /// number (zero only for 4-bit codes, whose constant blocks have scale 0) and every zero
    /// point in its codes' range (0 for FP8).
    fn check_meaning(&self) -> Result<(), String> {
        let mut names: HashMap<&str, usize> = HashMap::new();
        for (i, e) in self.entries.iter().enumerate() {
            if let Some(j) = names.insert(e.name.as_str(), i) {
                return Err(format!("entries {j} and {i} are both named '{}'", e.name));
            }
        }
        let mut ranges: Vec<(u64, u64, &str)> = self
            .entries
            .iter()
            .map(|e| {
                let first = u64::from(e.first_pair);
                (first, first + u64::from(e.count), e.name.as_str())
            })
            .collect();
        ranges.sort_unstable();
        for w in ranges.windows(2) {
            if w[1].0 < w[0].1 {
                return Err(format!(
                    "entries '{}' and '{}' share pairs {}..{}",
                    w[0].2,
                    w[1].2,
                    w[1].0,
                    w[0].1.min(w[1].1)
                ));
            }
        }
        for e in &self.entries {
            match e.scheme {
                Layout::PerTensor if e.count != 1 => {
                    return Err(format!(
                        "entry '{}': per-tensor with {} pairs (one expected)",
                        e.name, e.count
                    ));
                }
                Layout::PerGroup if e.group_size == 0 => {
                    return Err(format!("entry '{}': per-group with group size 0", e.name));
                }
                _ => {}
            }
            let four_bit = matches!(e.code_type, 21 | 22);
            let (lo, hi) = match e.code_type {
                2 => (0, 255),
                3 => (-128, 127),
                21 => (0, 15),
                22 => (-8, 7),
                17..=20 => (0, 0),
                _ => (i16::MIN, i16::MAX),
            };
            for (i, (scale, zero)) in self.pairs(e).into_iter().enumerate() {
                if !scale.is_finite() || (scale == 0.0 && !four_bit) {
                    return Err(format!(
                        "entry '{}': pair {i} has scale {scale} (a scale is a finite, non-zero number)",
                        e.name
                    ));
                }
                if !(lo..=hi).contains(&zero) {
                    return Err(format!(
                        "entry '{}': pair {i} has zero point {zero}, outside its codes' range {lo}..={hi}",
                        e.name
                    ));
                }
            }
        }
        Ok(())
    }
}

fn rd_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn rd_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Validates the layout; returns (pairs offset, pair count, entries).
fn parse(b: &[u8]) -> Result<(usize, usize, Vec<Entry>), String> {
    let size = b.len() as u64;
    if size < HEADER_BYTES {
        return Err(format!(
            "{size} bytes: shorter than the {HEADER_BYTES}-byte header"
        ));
    }
    let magic = rd_u32(b, 0);
    if magic != MAGIC {
        return Err(format!(
            "offset 0: magic {magic:#010x}, expected {MAGIC:#010x} (not a QPQR table)"
        ));
    }
    let version = u16::from_le_bytes([b[8], b[9]]);
    if version != VERSION {
        return Err(format!(
            "offset 8: version {version}; this reader knows version {VERSION}"
        ));
    }
    let header = u16::from_le_bytes([b[10], b[11]]);
    if u64::from(header) != HEADER_BYTES {
        return Err(format!(
            "offset 10: header of {header} bytes, expected {HEADER_BYTES}"
        ));
    }
    let length = u64::from(rd_u32(b, 4));
    let count = u64::from(rd_u32(b, 12));
    let [pairs, index, strings, raw, file_bytes] = [16, 24, 32, 40, 48].map(|o| rd_u64(b, o));
    if file_bytes != size {
        return Err(format!(
            "offset 48: the header says {file_bytes} bytes, the file has {size} (truncated or extended)"
        ));
    }
    let sections = [
        ("pairs", pairs, 16),
        ("index", index, 24),
        ("names", strings, 32),
        ("scales", raw, 40),
    ];
    for (what, off, at) in sections {
        if off % ALIGN != 0 || off < HEADER_BYTES || off > size {
            return Err(format!(
                "offset {at}: the {what} section at {off} is not a 64-byte aligned offset inside the file"
            ));
        }
    }
    let pairs_end = pairs.checked_add(length * 4).filter(|&e| e <= index);
    if pairs_end.is_none() {
        return Err(format!(
            "offset 4: {length} pairs at {pairs} run past the index at {index}"
        ));
    }
    let index_end = index
        .checked_add(count * ENTRY_BYTES)
        .filter(|&e| e <= strings);
    if index_end.is_none() {
        return Err(format!(
            "offset 12: {count} index entries at {index} run past the names at {strings}"
        ));
    }
    if strings > raw {
        return Err(format!(
            "offset 32: the names at {strings} start after the scales at {raw}"
        ));
    }
    let mut entries = Vec::with_capacity(count as usize);
    for i in 0..count {
        let at = (index + i * ENTRY_BYTES) as usize;
        let r = &b[at..at + ENTRY_BYTES as usize];
        let field = |o: usize| at + o;
        let (name_off, name_len) = (u64::from(rd_u32(r, 0)), u64::from(rd_u32(r, 4)));
        let name_end = strings
            .checked_add(name_off)
            .and_then(|s| s.checked_add(name_len));
        let Some(name_end) = name_end.filter(|&e| e <= raw) else {
            return Err(format!(
                "offset {}: entry {i}'s name runs past the names section",
                field(0)
            ));
        };
        let name = std::str::from_utf8(&b[(name_end - name_len) as usize..name_end as usize])
            .map_err(|_| format!("offset {}: entry {i}'s name is not UTF-8", field(0)))?
            .to_owned();
        let scheme = Layout::from_code(r[8]).ok_or_else(|| {
            format!(
                "offset {}: entry '{name}': unknown scheme {}",
                field(8),
                r[8]
            )
        })?;
        let first = u64::from(rd_u32(r, 20));
        let n = u64::from(rd_u32(r, 24));
        if first + n > length {
            return Err(format!(
                "offset {}: entry '{name}': pairs {first}..{} past the {length} pairs",
                field(20),
                first + n
            ));
        }
        let (raw_off, raw_bytes) = (rd_u64(r, 32), rd_u64(r, 40));
        let raw_end = raw_off.checked_add(raw_bytes);
        if raw_off % ALIGN != 0 || raw_off < raw || raw_end.is_none_or(|e| e > size) {
            return Err(format!(
                "offset {}: entry '{name}': exact scales at {raw_off} (+{raw_bytes}) are outside the scales section",
                field(32)
            ));
        }
        let width = match r[10] {
            1 => 4,
            10 | 16 => 2,
            t => {
                return Err(format!(
                    "offset {}: entry '{name}': scale element type {t} is not FLOAT, FLOAT16 or BFLOAT16",
                    field(10)
                ));
            }
        };
        if raw_bytes != n * width {
            return Err(format!(
                "offset {}: entry '{name}': {raw_bytes} bytes of exact scales for {n} pairs",
                field(40)
            ));
        }
        entries.push(Entry {
            name,
            scheme,
            code_type: i32::from(r[9]),
            scale_type: i32::from(r[10]),
            axis: i32::from_le_bytes(r[12..16].try_into().expect("4 bytes")),
            group_size: rd_u32(r, 16),
            first_pair: first as u32,
            count: n as u32,
            raw_offset: raw_off,
            raw_bytes,
        });
    }
    Ok((pairs as usize, length as usize, entries))
}

/// The table as text: one line per entry.
pub fn summary(t: &QParamTable) -> String {
    let mut s = format!(
        "{}: QPQR v{VERSION}, {} pairs, {} tensors, {} bytes\n",
        t.path().display(),
        t.len(),
        t.entries().len(),
        t.bytes().len()
    );
    for e in t.entries() {
        let code = DType::from_onnx_code(e.code_type).map_or("?", DType::name);
        let mut line = format!("  {} {} {code} x{}", e.name, e.scheme, e.count);
        if e.scheme != Layout::PerTensor {
            line += &format!(" axis {}", e.axis);
        }
        if e.group_size > 0 {
            line += &format!(" group {}", e.group_size);
        }
        let p = t.pairs(e);
        if let Some((s0, z0)) = p.first() {
            line += &format!(" first ({s0:e}, {z0})");
        }
        s += &line;
        s.push('\n');
    }
    s
}

/// Writes the table of every scale of `m` to `path`, naming each scale value uniquely first (so
/// the exported model names it the same). Returns what was written and, when the table lies in
/// `model_dir`, the references that make the exported model read its scales from the table
/// ([`crate::export::write_referencing`]).
pub fn write_table(
    m: &mut Module,
    path: &Path,
    model_dir: Option<&Path>,
) -> Result<(Written, Vec<(String, mmq_backend_ort::ExternalLocation)>), QParamError> {
    let found = collect(m);
    if found.is_empty() {
        return Err(QParamError::Empty);
    }
    let mut used: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (_, vd) in m.values.iter() {
        if let Some(n) = vd.name.as_deref() {
            *used.entry(n.to_owned()).or_default() += 1;
        }
    }
    let mut names = Vec::with_capacity(found.len());
    for (i, f) in found.iter().enumerate() {
        let current = m.values[f.value].name.clone().unwrap_or_default();
        let name = if !current.is_empty() && used.get(&current) == Some(&1) {
            current
        } else {
            let mut k = i;
            loop {
                let base = if current.is_empty() {
                    "scale"
                } else {
                    &current
                };
                let candidate = format!("{base}_qp{k}");
                if !used.contains_key(&candidate) {
                    used.insert(candidate.clone(), 1);
                    break candidate;
                }
                k += 1;
            }
        };
        m.values[f.value].name = Some(name.clone());
        names.push(name);
    }
    let written = write(m, &found, &names, path)?;
    let same_dir = |d: &Path| {
        let table_dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        match (d.canonicalize(), table_dir.canonicalize()) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        }
    };
    let refs = match (model_dir, path.file_name()) {
        (Some(d), Some(file)) if same_dir(d) => written
            .entries
            .iter()
            .map(|e| {
                (
                    e.name.clone(),
                    mmq_backend_ort::ExternalLocation {
                        location: file.to_string_lossy().into_owned(),
                        offset: e.raw_offset,
                        length: e.raw_bytes,
                    },
                )
            })
            .collect(),
        _ => Vec::new(),
    };
    Ok((written, refs))
}
