//! Constants (weights): dtype, shape, content hash, and storage that is either inline bytes or a
//! slice of a memory-mapped external data file. Bytes are never copied needlessly: inline data
//! is a [`bytes::Bytes`] that may itself point into the memory-mapped model file.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use memmap2::Mmap;

use crate::arena::entity;
use crate::dtype::DType;

entity!(
    /// A constant tensor in [`crate::Module::consts`].
    Const,
    "$"
);

/// A file of external tensor data, memory-mapped once and shared by every constant in it.
#[derive(Debug)]
pub struct ExternalFile {
    /// Absolute or working-directory-relative path of the file.
    pub path: PathBuf,
    /// The location string as the model wrote it (relative to the model's directory).
    pub location: String,
    file: File,
    map: Mmap,
}

impl ExternalFile {
    /// Opens external data `location` (as a model records it) relative to the model's directory
    /// `dir`: the location must be a relative path of plain components, and the file must resolve,
    /// after symbolic links, inside `dir` — a model cannot read `/etc/passwd` through a link.
    pub fn open_contained(dir: &Path, location: &str) -> std::io::Result<ExternalFile> {
        use std::path::Component;
        let invalid = |msg: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, msg);
        let rel = Path::new(location);
        if location.is_empty()
            || rel
                .components()
                .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(invalid(format!(
                "'{location}' must be a relative path inside the model's directory"
            )));
        }
        let path = dir.join(rel);
        let real = std::fs::canonicalize(&path)?;
        let root = std::fs::canonicalize(if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        })?;
        if !real.starts_with(&root) {
            return Err(invalid(format!(
                "'{location}' resolves to {}, outside the model's directory {} (through a \
                 symbolic link)",
                real.display(),
                root.display()
            )));
        }
        ExternalFile::open(&path, location)
    }

    /// Opens and maps `path`. `location` is the name recorded in the model.
    pub fn open(path: &Path, location: &str) -> std::io::Result<ExternalFile> {
        crate::fsio::check_regular_file(path)?;
        let file = File::open(path)?;
        // SAFETY: the map is read-only; we document that external data files must not be modified
        // while a module that maps them is alive (the same contract as ONNX Runtime's mmap loader).
        #[allow(
            unsafe_code,
            reason = "a mapped weight file is read only; changes under it are detected by its hash"
        )]
        let map = unsafe { Mmap::map(&file)? };
        Ok(ExternalFile {
            path: path.to_owned(),
            location: location.to_owned(),
            file,
            map,
        })
    }

    /// File size in bytes.
    pub fn len(&self) -> u64 {
        self.map.len() as u64
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The open file, for positional reads that do not fault pages into the map.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The mapped bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }
}

/// Where a constant's bytes live.
#[derive(Clone, Debug)]
pub enum Storage {
    /// Little-endian packed elements (sub-byte types packed low nibble first).
    Inline(Bytes),
    /// String tensor elements.
    Strings(Vec<Bytes>),
    /// The bytes are not available: the constant was parsed from `.mmir` text that elides
    /// weights. Only its dtype, shape and content hash are known.
    Absent,
    /// A byte range of an external data file.
    External {
        /// The mapped file.
        file: Arc<ExternalFile>,
        /// Byte offset of the first element.
        offset: u64,
        /// Length in bytes.
        len: u64,
    },
}

/// A constant tensor.
#[derive(Debug)]
pub struct ConstData {
    /// Source name (initializer name), if any. Not necessarily unique across graphs.
    pub name: Option<String>,
    /// Element type.
    pub dtype: DType,
    /// Static shape (constants never have symbolic dims).
    pub shape: Vec<i64>,
    /// The bytes.
    pub storage: Storage,
    hash: OnceLock<u64>,
}

impl Clone for ConstData {
    fn clone(&self) -> Self {
        let hash = OnceLock::new();
        if let Some(h) = self.hash.get() {
            let _ = hash.set(*h);
        }
        ConstData {
            name: self.name.clone(),
            dtype: self.dtype,
            shape: self.shape.clone(),
            storage: self.storage.clone(),
            hash,
        }
    }
}

impl PartialEq for ConstData {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
            && self.dtype == other.dtype
            && self.shape == other.shape
            && self.content_hash() == other.content_hash()
    }
}

impl ConstData {
    /// A constant with the given storage; the content hash is computed on first use.
    pub fn new(name: Option<String>, dtype: DType, shape: Vec<i64>, storage: Storage) -> Self {
        ConstData {
            name,
            dtype,
            shape,
            storage,
            hash: OnceLock::new(),
        }
    }

    /// A constant whose content hash is already known (for example parsed from `.mmir` text).
    pub fn with_hash(mut self, hash: u64) -> Self {
        self.hash = OnceLock::from(hash);
        self
    }

    /// Number of elements.
    pub fn num_elements(&self) -> usize {
        self.shape.iter().map(|&d| d.max(0) as usize).product()
    }

    /// Size of the stored data in bytes (string tensors: sum of element lengths).
    pub fn byte_len(&self) -> u64 {
        match &self.storage {
            Storage::Inline(b) => b.len() as u64,
            Storage::Strings(v) => v.iter().map(|s| s.len() as u64).sum(),
            Storage::Absent => 0,
            Storage::External { len, .. } => *len,
        }
    }

    /// The raw bytes as an owned or borrowed buffer: external data is read with positional reads
    /// (the file's pages stay out of the process's resident memory, unlike [`Self::raw_bytes`]),
    /// inline bytes are borrowed. `None` for string tensors and absent data.
    pub fn read_bytes(&self) -> Option<std::io::Result<std::borrow::Cow<'_, [u8]>>> {
        match &self.storage {
            Storage::Inline(b) => Some(Ok(std::borrow::Cow::Borrowed(b))),
            Storage::Strings(_) | Storage::Absent => None,
            Storage::External { file, offset, len } => {
                let within = offset
                    .checked_add(*len)
                    .is_some_and(|end| end <= file.len());
                if !within {
                    return Some(Err(std::io::Error::other(format!(
                        "external range {offset}+{len} lies outside {}",
                        file.path.display()
                    ))));
                }
                let mut buf = vec![0u8; *len as usize];
                Some(
                    self.read_at(0, &mut buf)
                        .map(|()| std::borrow::Cow::Owned(buf)),
                )
            }
        }
    }

    /// Reads the little-endian f32 elements `start..start + out.len()` into `out` (the caller
    /// knows the constant holds f32); external data by positional reads, like
    /// [`Self::read_bytes`]. On a big-endian machine `scratch` holds the bytes in between.
    pub fn read_f32(
        &self,
        start: usize,
        out: &mut [f32],
        scratch: &mut Vec<u8>,
    ) -> std::io::Result<()> {
        let (from, len) = (start as u64 * 4, out.len() as u64 * 4);
        if from
            .checked_add(len)
            .is_none_or(|end| end > self.byte_len())
        {
            return Err(std::io::Error::other(format!(
                "elements {start}..{} lie outside the constant's {} bytes",
                start + out.len(),
                self.byte_len()
            )));
        }
        if cfg!(target_endian = "little") {
            // The file's bytes are the values' bytes: read them in place.
            return self.read_at(from, bytemuck::cast_slice_mut(out));
        }
        scratch.resize(len as usize, 0);
        self.read_at(from, scratch)?;
        for (o, b) in out.iter_mut().zip(scratch.chunks_exact(4)) {
            *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        Ok(())
    }

    /// Fills `dst` with the stored bytes from byte `from` on (checked by the caller).
    fn read_at(&self, from: u64, dst: &mut [u8]) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let len = dst.len() as u64;
        match &self.storage {
            Storage::Inline(b) => dst.copy_from_slice(&b[from as usize..(from + len) as usize]),
            Storage::External { file, offset, .. } => {
                file.file().read_exact_at(dst, offset + from).map_err(|e| {
                    std::io::Error::new(
                        e.kind(),
                        format!("cannot read {}: {e}", file.path.display()),
                    )
                })?
            }
            Storage::Strings(_) | Storage::Absent => {
                return Err(std::io::Error::other("the constant has no stored bytes"));
            }
        }
        Ok(())
    }

    /// The raw bytes, when the constant is not a string tensor. External data is read through
    /// the memory map, lazily, page by page.
    pub fn raw_bytes(&self) -> Option<&[u8]> {
        match &self.storage {
            Storage::Inline(b) => Some(b),
            Storage::Strings(_) | Storage::Absent => None,
            Storage::External { file, offset, len } => file
                .bytes()
                .get(*offset as usize..(*offset + *len) as usize),
        }
    }

    /// A 48-bit content hash (xxh3 of dtype, shape and bytes), computed once. External data is
    /// hashed with positional reads so hashing does not keep the file resident.
    pub fn content_hash(&self) -> u64 {
        *self.hash.get_or_init(|| {
            let mut h = xxhash_rust::xxh3::Xxh3::new();
            h.update(&self.dtype.onnx_code().to_le_bytes());
            for d in &self.shape {
                h.update(&d.to_le_bytes());
            }
            match &self.storage {
                Storage::Inline(b) => h.update(b),
                Storage::Absent => h.update(b"<absent>"),
                Storage::Strings(v) => {
                    for s in v {
                        h.update(&(s.len() as u64).to_le_bytes());
                        h.update(s);
                    }
                }
                Storage::External { file, offset, len } => {
                    let mut buf = vec![0u8; 1 << 20];
                    let mut pos = *offset;
                    let end = offset + len;
                    while pos < end {
                        let n = ((end - pos) as usize).min(buf.len());
                        if file.file().read_exact_at(&mut buf[..n], pos).is_err() {
                            h.update(b"<unreadable>");
                            break;
                        }
                        h.update(&buf[..n]);
                        pos += n as u64;
                    }
                }
            }
            h.digest() >> 16
        })
    }

    /// The hash as printed in `.mmir` (12 hex digits).
    pub fn short_hash(&self) -> String {
        format!("{:012x}", self.content_hash())
    }
}
