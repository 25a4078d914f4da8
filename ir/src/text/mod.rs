//! The `.mmir` text format: a printer, a parser with spanned errors, and [`canonicalize`].
//!
//! `docs/ir-text.md` is the reference (grammar, conventions, examples). In short:
//!
//! ```text
//! sym batch in [1, 64]
//! const $w : f32[4, 3] = hash("0123456789ab")
//! graph @main(%x: f32[batch, 3]) -> (f32[batch, 4]) {
//!   %t = Transpose($w) {perm = [1, 0]} : f32[3, 4]
//!   %y = MatMul(%x, %t) : f32[batch, 4] loc("/fc/MatMul")
//!   return %y
//! }
//! ```
//!
//! # Round trip
//! The printer writes every entity in one canonical order: symbols and constants in arena
//! order, then each entry graph, where a graph's inputs come first and every node is preceded by
//! the subgraphs in its attributes. The parser creates entities in the order it reads them, so
//! `parse(print(m))` equals [`canonicalize`]`(m)`, which renumbers the arenas of `m` into that order
//! (and drops nodes, values and graphs that no entry reaches). For a module that was itself parsed
//! or canonicalized, `parse(print(m)) == m` and `print(parse(print(m))) == print(m)`.
//!
//! What the text does not keep: the bytes of constants with more than
//! [`PrintOptions::inline_limit`] elements (they parse back as [`crate::Storage::Absent`] with the
//! same content hash, so modules still compare equal), node names when [`PrintOptions::loc`] is
//! off, and the mapped file of external constants unless [`parse_with`] is given the directory
//! to open them from.

mod canon;
mod lexer;
mod parser;
mod printer;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::ops::Range;
use std::path::PathBuf;

use codespan_reporting::diagnostic::{Diagnostic, Label};

use crate::Module;
use crate::diag::Entity;

pub use canon::{canonicalize, canonicalize_pruned};

/// Options for [`print_with`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrintOptions {
    /// Print node source names as a trailing `loc("...")`. On by default, since without it node
    /// names are lost on a round trip.
    pub loc: bool,
    /// Print numeric constants with at most this many elements inline (`dense<[...]>` or
    /// `bytes<"...">`); larger ones print only their content hash. String constants always
    /// print inline.
    pub inline_limit: usize,
    /// A note printed as a trailing `// ...` comment after a node (for example its modality
    /// label); comments are ignored when the text is parsed back.
    pub node_notes: std::collections::BTreeMap<crate::Node, String>,
}

impl Default for PrintOptions {
    fn default() -> Self {
        PrintOptions {
            loc: true,
            inline_limit: 16,
            node_notes: std::collections::BTreeMap::new(),
        }
    }
}

/// Prints `m` as `.mmir` text with [`PrintOptions::default`]. The output is deterministic.
pub fn print(m: &Module) -> String {
    print_with(m, &PrintOptions::default())
}

/// The `.mmir` spelling of a type, with the module's symbol names (`f32[batch, 3, 224, 224]`).
pub fn type_text(m: &Module, ty: &crate::Type) -> String {
    printer::type_text(m, ty)
}

/// Prints `m` as `.mmir` text.
pub fn print_with(m: &Module, opts: &PrintOptions) -> String {
    printer::print_module(m, opts)
}

/// Options for [`parse_with`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParseOptions {
    /// Directory against which `external("file", ...)` locations are resolved and opened
    /// (memory-mapped). Without it, external constants parse as
    /// [`crate::Storage::Absent`] with the printed content hash.
    pub data_dir: Option<PathBuf>,
}

/// Parses `.mmir` text into a module, with the byte span of every declared entity.
///
/// Every error found is returned (the parser resynchronizes at the next statement). Parsing
/// never panics, whatever the input.
pub fn parse(src: &str) -> Result<(Module, SpanMap), Vec<ParseError>> {
    parse_with(src, &ParseOptions::default())
}

/// [`parse`] with options.
pub fn parse_with(src: &str, opts: &ParseOptions) -> Result<(Module, SpanMap), Vec<ParseError>> {
    parser::parse_module(src, opts)
}

/// Byte ranges of the entities a parsed module declares, for locating diagnostics about them.
///
/// Graphs map to their `graph @name` header, nodes to their statement up to the closing
/// parenthesis of the operands, values to their defining `%name` (a constant's value to the
/// constant's name), constants and symbols to the name in their declaration.
#[derive(Clone, Debug, Default)]
pub struct SpanMap {
    spans: HashMap<Entity, Range<usize>>,
}

impl SpanMap {
    /// The span of `e`, if the text declared it.
    pub fn get(&self, e: Entity) -> Option<Range<usize>> {
        self.spans.get(&e).cloned()
    }

    /// Number of recorded spans.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// Whether no span is recorded.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    pub(crate) fn insert(&mut self, e: Entity, span: Range<usize>) {
        self.spans.insert(e, span);
    }
}

/// A syntax or name-resolution error in `.mmir` text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// Where the error is (byte range of the source).
    pub span: Range<usize>,
    /// What is wrong.
    pub message: String,
    /// Related places, such as a first definition ("first defined here") or a hint.
    pub labels: Vec<(Range<usize>, String)>,
}

impl ParseError {
    pub(crate) fn new(span: Range<usize>, message: impl Into<String>) -> Self {
        ParseError {
            span,
            message: message.into(),
            labels: Vec::new(),
        }
    }

    pub(crate) fn label(mut self, span: Range<usize>, text: impl Into<String>) -> Self {
        self.labels.push((span, text.into()));
        self
    }
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (at bytes {}..{})",
            self.message, self.span.start, self.span.end
        )
    }
}

impl std::error::Error for ParseError {}

/// The error as a codespan-reporting diagnostic: a primary label at the span and one secondary
/// label per related place.
pub fn to_diagnostic<FileId: Copy>(e: &ParseError, file_id: FileId) -> Diagnostic<FileId> {
    let mut labels = vec![Label::primary(file_id, e.span.clone())];
    labels.extend(
        e.labels
            .iter()
            .map(|(span, text)| Label::secondary(file_id, span.clone()).with_message(text)),
    );
    Diagnostic::error()
        .with_message(&e.message)
        .with_labels(labels)
}
