//! The `mmq` binary: the command line of [`mmq_cli`].

use std::process::ExitCode;

fn main() -> ExitCode {
    ExitCode::from(mmq_cli::main_with(std::env::args_os()))
}
