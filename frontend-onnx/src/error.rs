//! Import errors: what went wrong and where (file, node, byte offset).

use std::fmt;
use std::path::PathBuf;

/// What kind of problem an [`LoadError`] reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LoadErrorKind {
    /// The file could not be read.
    Io,
    /// The bytes are not an ONNX model.
    NotOnnx,
    /// The protobuf message ends early.
    Truncated,
    /// External tensor data is missing, too short, or has a rejected location.
    ExternalData,
    /// A tensor or type uses an element type code we do not know.
    UnknownDType,
    /// The IR version or an opset version is outside the supported range.
    UnsupportedOpset,
    /// The node list has a dependency cycle.
    Cycle,
    /// A node input or graph output names a value that is never defined.
    DanglingInput,
    /// A value name is defined twice.
    DuplicateName,
    /// Any other violation of the ONNX specification.
    Invalid,
}

/// An error from loading an ONNX model, located as precisely as the source allows.
///
/// `Display` prints one line: `FILE: node 'X': message (at byte N)`, leaving out the parts that
/// are not known.
#[derive(Debug, thiserror::Error)]
pub struct LoadError {
    /// The model file (or the name given to [`crate::load_bytes`]).
    pub file: Option<PathBuf>,
    /// Byte offset in the file, when known.
    pub offset: Option<u64>,
    /// The node the error is about: its name, or `op_type#index` when it has none.
    pub node: Option<String>,
    /// The kind of problem.
    pub kind: LoadErrorKind,
    /// What went wrong, in one line.
    pub message: String,
}

impl LoadError {
    /// An error of `kind` with `message` and no location yet.
    pub fn new(kind: LoadErrorKind, message: impl Into<String>) -> Self {
        LoadError {
            file: None,
            offset: None,
            node: None,
            kind,
            message: message.into(),
        }
    }

    /// Sets the byte offset.
    pub fn at(mut self, offset: u64) -> Self {
        self.offset = Some(offset);
        self
    }

    /// Sets the node, unless an inner node (of a subgraph) is already set.
    pub fn in_node(mut self, node: impl Into<String>) -> Self {
        if self.node.is_none() {
            self.node = Some(node.into());
        }
        self
    }

    /// Sets the file, unless already set.
    pub fn in_file(mut self, file: impl Into<PathBuf>) -> Self {
        if self.file.is_none() {
            self.file = Some(file.into());
        }
        self
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{}: ", file.display())?;
        }
        if let Some(node) = &self.node {
            write!(f, "node '{node}': ")?;
        }
        f.write_str(&self.message)?;
        if let Some(offset) = self.offset {
            write!(f, " (at byte {offset})")?;
        }
        Ok(())
    }
}

/// Shorthand for results of this crate.
pub type Result<T, E = LoadError> = std::result::Result<T, E>;

/// Builds a [`LoadError`] of the given kind from a format string.
macro_rules! err {
    ($kind:ident, $($fmt:tt)*) => {
        $crate::error::LoadError::new($crate::error::LoadErrorKind::$kind, format!($($fmt)*))
    };
}
pub(crate) use err;
