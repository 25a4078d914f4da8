//! Export errors.

use std::path::PathBuf;

/// Why a module could not be exported. Messages name the graph, node, value or tensor involved.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The graph handle is not in the module.
    #[error("graph {graph} is not in the module")]
    NoSuchGraph {
        /// The handle, as printed.
        graph: String,
    },
    /// Only top-level graphs can be exported as models.
    #[error("graph `{graph}` is the body of a node, not a top-level graph")]
    NotTopLevel {
        /// Graph name.
        graph: String,
    },
    /// A handle in the module points at nothing, or the module is otherwise malformed.
    #[error("malformed module: {what}")]
    Malformed {
        /// What is wrong, and where.
        what: String,
    },
    /// A constant has no bytes (it was parsed from `.mmir` text that elides weights).
    #[error(
        "tensor `{tensor}` has no data: the module was read from text without weights; \
         load the original model to export it"
    )]
    AbsentData {
        /// Tensor name.
        tensor: String,
    },
    /// A constant's bytes do not match its dtype and shape.
    #[error("tensor `{tensor}`: {reason}")]
    BadTensor {
        /// Tensor name.
        tensor: String,
        /// What is wrong.
        reason: String,
    },
    /// Reading or writing a file failed.
    #[error("{what} {}: {source}", path.display())]
    Io {
        /// What was being done (`cannot read external data of tensor `w` from`).
        what: String,
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The output would replace a file the module was read from.
    #[error(
        "refusing to overwrite {}, which the module was read from; choose another output path",
        input.display()
    )]
    OverwritesInput {
        /// The file that would be written.
        output: PathBuf,
        /// The input file it is.
        input: PathBuf,
    },
    /// Subgraphs nested deeper than ONNX readers can parse.
    #[error(
        "graph `{graph}` nests subgraphs {depth} deep; ONNX readers (protobuf's default \
         recursion limit of 100 messages) load at most {limit}"
    )]
    TooDeep {
        /// The innermost graph of the deepest chain.
        graph: String,
        /// Its nesting depth (0: the top-level graph).
        depth: usize,
        /// The deepest nesting readers load.
        limit: usize,
    },
    /// The model does not fit in one protobuf message.
    #[error(
        "the model needs {bytes} bytes of protobuf, above the 2 GiB protobuf limit; \
         store weights as external data"
    )]
    TooLarge {
        /// Encoded (or estimated) size.
        bytes: u64,
    },
    /// The output path cannot be used.
    #[error("invalid output path {}: {reason}", path.display())]
    OutputPath {
        /// The path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

impl ExportError {
    pub(crate) fn io(
        what: impl Into<String>,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        ExportError::Io {
            what: what.into(),
            path: path.into(),
            source,
        }
    }

    pub(crate) fn malformed(what: impl Into<String>) -> Self {
        ExportError::Malformed { what: what.into() }
    }
}
