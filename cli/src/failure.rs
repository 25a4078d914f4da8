//! A failed command: the text for stderr and the exit code.

use mmq_compiler::CompileError;
use mmq_compiler::export::ExportError;
use mmq_compiler::load::LoadError;

/// A failed command: the rendered text and the exit code.
pub struct Failure {
    pub rendered: String,
    pub code: u8,
}

impl Failure {
    /// A user error (exit 1) with already rendered text.
    pub fn user(rendered: String) -> Failure {
        Failure { rendered, code: 1 }
    }

    /// A usage error (exit 2): `error: MESSAGE`.
    pub fn usage(message: String) -> Failure {
        Failure {
            rendered: format!("error: {message}\n"),
            code: 2,
        }
    }
}

impl From<LoadError> for Failure {
    fn from(e: LoadError) -> Failure {
        Failure {
            rendered: e.rendered,
            code: if e.usage { 2 } else { 1 },
        }
    }
}

impl From<ExportError> for Failure {
    fn from(e: ExportError) -> Failure {
        Failure::user(format!("error: {e}\n"))
    }
}

impl From<CompileError> for Failure {
    fn from(e: CompileError) -> Failure {
        if e.is_usage() {
            Failure::usage(e.to_string())
        } else {
            Failure::user(format!("error: {e}\n"))
        }
    }
}

impl From<mmq_compiler::build::BuildError> for Failure {
    fn from(e: mmq_compiler::build::BuildError) -> Failure {
        match e {
            mmq_compiler::build::BuildError::Load(e) => e.into(),
            e if e.is_usage() => Failure::usage(e.to_string()),
            e => Failure::user(format!("error: {e}\n")),
        }
    }
}
