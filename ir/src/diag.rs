//! Errors about IR entities, shared by the verifier, type inference and the text parser.
//!
//! Libraries never print: they return these, and the command line renders them (with
//! codespan-reporting, using the spans the `.mmir` parser recorded when the module came from text).

use std::fmt;

use crate::constant::Const;
use crate::dim::Sym;
use crate::module::{GraphId, Node, Value};

/// The IR entity an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Entity {
    /// The module as a whole.
    Module,
    /// A graph.
    Graph(GraphId),
    /// A node.
    Node(Node),
    /// A value.
    Value(Value),
    /// A constant.
    Const(Const),
    /// A symbol.
    Sym(Sym),
}

/// Severity of an [`IrError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Severity {
    /// Something suspicious that does not make the module invalid.
    Warning,
    /// The module is invalid.
    Error,
}

/// An error (or warning) located at an IR entity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IrError {
    /// Severity.
    pub severity: Severity,
    /// What it is about.
    pub entity: Entity,
    /// One-line message, naming the entity by its source name where it has one.
    pub message: String,
}

impl IrError {
    /// An error at `entity`.
    pub fn error(entity: Entity, message: impl Into<String>) -> Self {
        IrError {
            severity: Severity::Error,
            entity,
            message: message.into(),
        }
    }

    /// A warning at `entity`.
    pub fn warning(entity: Entity, message: impl Into<String>) -> Self {
        IrError {
            severity: Severity::Warning,
            entity,
            message: message.into(),
        }
    }
}

impl fmt::Display for IrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for IrError {}

/// A name that is not one of an enumeration's values (the `FromStr` of option-like enums).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} '{value}' (expected {expected})")]
pub struct UnknownName {
    /// What was named (`cache format`).
    pub what: &'static str,
    /// The name given.
    pub value: String,
    /// The names it takes.
    pub expected: String,
}
