//! `mmq generate DIR`: greedy generation with a package in the reference interpreter.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;

use mmq_kernels::RtValue;

use crate::failure::Failure;

/// The arguments of `mmq generate`.
pub struct GenerateArgs {
    /// The package directory.
    pub package: PathBuf,
    /// The prompt's token ids.
    pub input_ids: Vec<i64>,
    /// The image inputs (`.npz`, by input name), for a package with a vision encoder.
    pub inputs: Option<PathBuf>,
    /// The most tokens to generate.
    pub max_new_tokens: usize,
}

fn user(msg: impl std::fmt::Display) -> Failure {
    Failure::user(format!("error: {msg}\n"))
}

/// Generates; streams the new token ids to stdout as they come (one line, space-separated)
/// and returns the summary for stderr.
pub fn run(args: &GenerateArgs) -> Result<String, Failure> {
    if args.input_ids.is_empty() {
        return Err(Failure::usage(
            "--input-ids needs at least one token id (for example --input-ids 1,17,33)".to_owned(),
        ));
    }
    let package = mmq_deploy::Package::open(&args.package).map_err(user)?;
    let mut images: HashMap<String, RtValue> = HashMap::new();
    if let Some(path) = &args.inputs {
        for (name, t) in mmq_kernels::io::read_npz(path).map_err(user)? {
            images.insert(name, RtValue::from(t));
        }
    }
    let start = std::time::Instant::now();
    let mut first: Option<std::time::Duration> = None;
    let mut out = std::io::stdout().lock();
    let mut broken = false;
    let mut count = 0usize;
    let tokens = package
        .generate(&args.input_ids, &images, args.max_new_tokens, |t| {
            first.get_or_insert_with(|| start.elapsed());
            if !broken {
                let sep = if count == 0 { "" } else { " " };
                // A closed pipe stops the printing, not the generation.
                broken = write!(out, "{sep}{t}").and_then(|()| out.flush()).is_err();
            }
            count += 1;
        })
        .map_err(user)?;
    let _ = writeln!(out);
    let total = start.elapsed().as_secs_f64();
    let first = first.map_or(0.0, |d| d.as_secs_f64());
    let rest = tokens.len().saturating_sub(1);
    let rate = if rest > 0 && total > first {
        format!(", then {:.1} tokens/s", rest as f64 / (total - first))
    } else {
        String::new()
    };
    Ok(format!(
        "generate: {} new tokens after a prompt of {} (first token {:.3} s{rate}; reference \
         interpreter)\n",
        tokens.len(),
        args.input_ids.len(),
        first,
    ))
}
