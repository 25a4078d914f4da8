//! Rendering diagnostics as text (the command line prints it; the Python package raises it).

use codespan_reporting::diagnostic::{Diagnostic, Label};
use codespan_reporting::files::SimpleFiles;
use codespan_reporting::term::{self, Config};
use mmq_ir::{Entity, IrError, Module, Severity, ValueDef};

/// Renders one codespan diagnostic.
pub fn render(files: &SimpleFiles<String, String>, diag: &Diagnostic<usize>) -> String {
    term::emit_into_string(&Config::default(), files, diag).unwrap_or_else(|e| {
        format!(
            "error: {}\n(diagnostic could not be rendered: {e})\n",
            diag.message
        )
    })
}

/// How an entity is called in messages about a module loaded from ONNX.
pub fn describe(m: &Module, e: Entity) -> String {
    match e {
        Entity::Module => "module".to_owned(),
        Entity::Graph(g) => match m.graphs.get(g) {
            Some(g) => format!("graph '{}'", g.name),
            None => format!("graph {g:?}"),
        },
        Entity::Node(n) => match m.nodes.get(n) {
            Some(node) => match &node.name {
                Some(name) if !name.is_empty() => format!("node '{name}' ({})", node.op.op_type()),
                _ => format!("unnamed {} node", node.op.op_type()),
            },
            None => format!("node {n:?}"),
        },
        Entity::Value(v) => match m.values.get(v) {
            Some(val) => match (&val.name, val.def) {
                (Some(name), _) => format!("value '{name}'"),
                (None, ValueDef::Output { node, index }) => {
                    format!("output {index} of {}", describe(m, Entity::Node(node)))
                }
                (None, _) => format!("value {v:?}"),
            },
            None => format!("value {v:?}"),
        },
        Entity::Const(c) => match m.consts.get(c).and_then(|c| c.name.clone()) {
            Some(name) => format!("constant '{name}'"),
            None => format!("constant {c:?}"),
        },
        Entity::Sym(s) => match m.symbols.get(s) {
            Some(s) => format!("symbol '{}'", s.name),
            None => format!("symbol {s:?}"),
        },
    }
}

/// Renders IR errors for a module without source text (loaded from ONNX).
pub fn render_ir_errors(m: &Module, origin: &str, errors: &[IrError]) -> String {
    let mut out = String::new();
    for e in errors {
        let level = match e.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        out.push_str(&format!(
            "{level}: {}\n  --> {origin}: {}\n",
            e.message,
            describe(m, e.entity)
        ));
    }
    out
}

/// Builds a diagnostic for an IR error located through a span map (module parsed from text).
pub fn ir_error_diagnostic(
    e: &IrError,
    file: usize,
    span: Option<std::ops::Range<usize>>,
) -> Diagnostic<usize> {
    let diag = match e.severity {
        Severity::Error => Diagnostic::error(),
        Severity::Warning => Diagnostic::warning(),
    }
    .with_message(e.message.clone());
    match span {
        Some(span) => diag.with_labels(vec![Label::primary(file, span)]),
        None => diag,
    }
}
