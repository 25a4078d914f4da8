//! Reading a precision map file with its diagnostics rendered.

use std::path::Path;

use codespan_reporting::diagnostic::{Diagnostic, Label};
use codespan_reporting::files::SimpleFiles;
use mmq_passes::quant::precision::{Level, MapDiagnostic, PrecisionMap};

use crate::diagnostics::render;
use crate::load::LoadError;

fn to_codespan(d: &MapDiagnostic, file: usize) -> Diagnostic<usize> {
    let diag = match d.level {
        Level::Error => Diagnostic::error(),
        Level::Warning => Diagnostic::warning(),
    };
    let mut labels = vec![Label::primary(file, d.span.clone()).with_message(d.label.clone())];
    labels.extend(
        d.related
            .iter()
            .map(|(span, msg)| Label::secondary(file, span.clone()).with_message(msg.clone())),
    );
    diag.with_message(d.message.clone())
        .with_labels(labels)
        .with_notes(d.notes.clone())
}

/// Parses the precision map `src` (named `origin` in diagnostics); returns it with its rendered
/// warnings, or every diagnostic rendered.
pub fn parse(src: &str, origin: &str) -> Result<(PrecisionMap, String), LoadError> {
    let mut files = SimpleFiles::new();
    let file = files.add(origin.to_owned(), src.to_owned());
    let render_all = |diags: &[MapDiagnostic]| {
        diags
            .iter()
            .map(|d| render(&files, &to_codespan(d, file)))
            .collect::<String>()
    };
    match PrecisionMap::parse(src) {
        Ok((map, warnings)) => Ok((map, render_all(&warnings))),
        Err(diags) => Err(LoadError {
            rendered: render_all(&diags),
            usage: false,
        }),
    }
}

/// Reads and parses the precision map at `path` (see [`parse`]).
pub fn load(path: &Path) -> Result<(PrecisionMap, String), LoadError> {
    let src = mmq_ir::check_regular_file(path)
        .and_then(|()| std::fs::read_to_string(path))
        .map_err(|e| LoadError {
            rendered: format!("error: cannot read precision map {}: {e}\n", path.display()),
            usage: false,
        })?;
    parse(&src, &path.display().to_string())
}
