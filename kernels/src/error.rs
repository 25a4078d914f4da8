//! Interpreter errors.

/// Why a run failed. Messages name the node (source name and op) and the input involved.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KernelError {
    /// A graph input is missing, unexpected, or of the wrong dtype or shape.
    #[error("input {name}: {message}")]
    Input {
        /// The graph input's name.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// An op is not implemented for these operands.
    #[error("{node}: {message}")]
    Unsupported {
        /// The node, as `name (Op)`.
        node: String,
        /// What is missing.
        message: String,
    },
    /// The operands violate the op's contract (shapes that do not broadcast, bad indices...).
    #[error("{node}: {message}")]
    Invalid {
        /// The node, as `name (Op)`.
        node: String,
        /// What is wrong.
        message: String,
    },
    /// The module itself is malformed (a value used before it is computed, missing weights).
    #[error("{0}")]
    Module(String),
}
