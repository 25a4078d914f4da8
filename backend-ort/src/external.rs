//! Where tensor bytes go: inline in the model, or into an external data file.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use mmq_ir::{ConstData, ExternalFile, Storage};

use crate::error::ExportError;

/// Where a tensor's bytes were stored outside the model (ONNX `external_data`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExternalLocation {
    /// File name relative to the model's directory.
    pub location: String,
    /// Byte offset in that file.
    pub offset: u64,
    /// Length in bytes.
    pub length: u64,
}

/// Decides, tensor by tensor, whether bytes are stored outside the model, and stores them.
pub trait ExternalSink {
    /// Offers the bytes of tensor `name`. Returns where the sink stored them, or `None` to keep
    /// them inline. Only called for tensors with raw bytes (never strings or absent data), after
    /// their length has been checked against dtype and shape.
    fn offer(
        &mut self,
        name: &str,
        data: &ConstData,
    ) -> Result<Option<ExternalLocation>, ExportError>;
}

/// Keeps every tensor inline.
#[derive(Clone, Copy, Debug, Default)]
pub struct InlineSink;

impl ExternalSink for InlineSink {
    fn offer(&mut self, _: &str, _: &ConstData) -> Result<Option<ExternalLocation>, ExportError> {
        Ok(None)
    }
}

/// Appends tensors of at least `threshold` bytes to one data file, each starting at a multiple
/// of the alignment (4096 by default, so ONNX Runtime can map them).
///
/// Tensors whose source is already external are copied file to file (`std::io::copy` from the
/// source file, which uses `copy_file_range` on Linux): the bytes never pass through the source's
/// memory map, and memory use does not grow with the size of the weights.
#[derive(Debug)]
pub struct DataFileSink {
    file: File,
    path: PathBuf,
    location: String,
    threshold: u64,
    align: u64,
    pos: u64,
    bytes: u64,
    tensors: usize,
}

impl DataFileSink {
    /// A sink writing to `file`, which must be empty and positioned at its start. `path` names the
    /// file in error messages; `location` is recorded in the model (relative to its directory).
    pub fn new(file: File, path: &Path, location: &str, threshold: u64) -> DataFileSink {
        DataFileSink {
            file,
            path: path.to_owned(),
            location: location.to_owned(),
            threshold,
            align: 4096,
            pos: 0,
            bytes: 0,
            tensors: 0,
        }
    }

    /// Sets the alignment of tensor offsets (at least 1).
    pub fn with_alignment(mut self, align: u64) -> DataFileSink {
        self.align = align.max(1);
        self
    }

    /// Tensor bytes written so far (padding excluded).
    pub fn bytes_written(&self) -> u64 {
        self.bytes
    }

    /// Number of tensors written so far.
    pub fn tensors_written(&self) -> usize {
        self.tensors
    }

    /// Returns the file, first flushing it to stable storage when `sync` is set.
    pub fn finish(self, sync: bool) -> Result<File, ExportError> {
        if sync {
            self.file
                .sync_all()
                .map_err(|e| ExportError::io("cannot sync", &self.path, e))?;
        }
        Ok(self.file)
    }

    fn write_err(&self, name: &str, e: io::Error) -> ExportError {
        ExportError::io(
            format!("cannot write external data of tensor `{name}` to"),
            &self.path,
            e,
        )
    }
}

impl ExternalSink for DataFileSink {
    fn offer(
        &mut self,
        name: &str,
        data: &ConstData,
    ) -> Result<Option<ExternalLocation>, ExportError> {
        let len = match &data.storage {
            Storage::Inline(b) => b.len() as u64,
            Storage::External { len, .. } => *len,
            Storage::Strings(_) | Storage::Absent => return Ok(None),
        };
        if len < self.threshold {
            return Ok(None);
        }
        let pad = (self.align - self.pos % self.align) % self.align;
        if pad > 0 {
            let zeros = vec![0u8; pad as usize];
            self.file
                .write_all(&zeros)
                .map_err(|e| self.write_err(name, e))?;
            self.pos += pad;
        }
        let offset = self.pos;
        match &data.storage {
            Storage::Inline(b) => self
                .file
                .write_all(b)
                .map_err(|e| self.write_err(name, e))?,
            Storage::External {
                file: src,
                offset: src_off,
                len,
            } => copy_range(name, src, *src_off, *len, &mut self.file, &self.path)?,
            Storage::Strings(_) | Storage::Absent => return Ok(None),
        }
        self.pos += len;
        self.bytes += len;
        self.tensors += 1;
        Ok(Some(ExternalLocation {
            location: self.location.clone(),
            offset,
            length: len,
        }))
    }
}

fn check_range(name: &str, src: &ExternalFile, offset: u64, len: u64) -> Result<(), ExportError> {
    match offset.checked_add(len) {
        Some(end) if end <= src.len() => Ok(()),
        _ => Err(ExportError::BadTensor {
            tensor: name.to_owned(),
            reason: format!(
                "external data range {offset}..{} lies outside {} ({} bytes)",
                offset.saturating_add(len),
                src.path.display(),
                src.len()
            ),
        }),
    }
}

/// Copies `len` bytes at `offset` of `src` to the current position of `out`.
fn copy_range(
    name: &str,
    src: &ExternalFile,
    offset: u64,
    len: u64,
    out: &mut File,
    out_path: &Path,
) -> Result<(), ExportError> {
    check_range(name, src, offset, len)?;
    let read_err = |e| {
        ExportError::io(
            format!("cannot read external data of tensor `{name}` from"),
            &src.path,
            e,
        )
    };
    let mut reader: &File = src.file();
    reader.seek(SeekFrom::Start(offset)).map_err(read_err)?;
    let copied = io::copy(&mut reader.take(len), out).map_err(|e| {
        ExportError::io(
            format!("cannot copy external data of tensor `{name}` to"),
            out_path,
            e,
        )
    })?;
    if copied != len {
        return Err(read_err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("expected {len} bytes at offset {offset}, got {copied}"),
        )));
    }
    Ok(())
}

/// The raw bytes of a tensor kept inline. External data is read with positional reads.
pub(crate) fn inline_bytes(name: &str, data: &ConstData) -> Result<Bytes, ExportError> {
    match &data.storage {
        Storage::Inline(b) => Ok(b.clone()),
        Storage::External { file, offset, len } => {
            check_range(name, file, *offset, *len)?;
            let n = usize::try_from(*len).map_err(|_| ExportError::TooLarge { bytes: *len })?;
            let mut buf = vec![0u8; n];
            file.file().read_exact_at(&mut buf, *offset).map_err(|e| {
                ExportError::io(
                    format!("cannot read external data of tensor `{name}` from"),
                    &file.path,
                    e,
                )
            })?;
            Ok(Bytes::from(buf))
        }
        Storage::Strings(_) | Storage::Absent => Err(ExportError::BadTensor {
            tensor: name.to_owned(),
            reason: "has no raw bytes".to_owned(),
        }),
    }
}
