//! `mmq run`: runs a model's first entry graph in the reference interpreter on NumPy inputs.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use mmq_compiler::values;
use mmq_kernels::{Interpreter, RtValue};

use crate::failure::Failure;
use mmq_compiler::load;

/// What `mmq run` was asked to do.
pub struct RunArgs {
    /// The model (ONNX or `.mmir`).
    pub model: PathBuf,
    /// An `.npz` with one array per graph input.
    pub inputs: Option<PathBuf>,
    /// `NAME=FILE.npy` inputs, added to (or replacing) those of `inputs`.
    pub input: Vec<String>,
    /// Where to write the outputs (`.npz`); without it, a summary is printed.
    pub output: Option<PathBuf>,
    /// Print per-op times and the peak of live tensor bytes.
    pub stats: bool,
    /// Runs after the first; with `stats`, the times reported are their mean.
    pub repeat: usize,
}

fn user(msg: impl std::fmt::Display) -> Failure {
    Failure::user(format!("error: {msg}\n"))
}

/// Runs the model; returns what to print on stdout.
pub fn run(args: &RunArgs) -> Result<String, Failure> {
    if let Some(out) = &args.output {
        let mut inputs: Vec<PathBuf> = args.inputs.iter().cloned().collect();
        inputs.extend(
            args.input
                .iter()
                .filter_map(|s| s.split_once('=').map(|(_, f)| PathBuf::from(f))),
        );
        inputs.push(args.model.clone());
        crate::check_files(inputs.iter().map(PathBuf::as_path), out)?;
    }
    if mmq_deploy::is_package(&args.model) {
        return run_package(args);
    }
    let loaded = load::load_with_weights(std::slice::from_ref(&args.model))?;
    crate::warn(&loaded.verify()?);
    let m = &loaded.module;
    let Some(entry) = m.entries.first() else {
        return Err(user(format!(
            "{}: the module has no entry graph",
            args.model.display()
        )));
    };

    let interp = if args.stats {
        Interpreter::new(m).with_stats()
    } else {
        Interpreter::new(m)
    };
    // An archive's shapes are checked against the inputs before its arrays are inflated.
    let feeds = feeds(args, |headers| {
        interp.check_shapes(
            entry.graph,
            headers
                .iter()
                .map(|h| (h.name.as_str(), h.dtype, &h.shape[..])),
        )
    })?;
    let mut outputs = interp.run(entry.graph, &feeds).map_err(user)?;
    if args.repeat > 0 {
        // The first run decoded the constants and kept the constant subexpressions; what the
        // warm runs take is what a calibration pass over many samples pays per sample.
        interp.reset_stats();
        for _ in 0..args.repeat {
            outputs = interp.run(entry.graph, &feeds).map_err(user)?;
        }
    }

    let mut text = values::save_or_summarize(args.output.as_deref(), &outputs).map_err(user)?;
    if let Some(stats) = interp.stats() {
        text.push_str(&values::op_times(&stats, args.repeat));
    }
    Ok(text)
}

/// The input arrays: `--inputs IN.npz`, then each `--input NAME=FILE.npy`; `check` sees the
/// archive's headers before its data is read.
fn feeds(
    args: &RunArgs,
    check: impl Fn(&[mmq_kernels::io::NpyHeader]) -> Result<(), mmq_kernels::KernelError>,
) -> Result<HashMap<String, RtValue>, Failure> {
    let mut feeds: HashMap<String, RtValue> = HashMap::new();
    if let Some(path) = &args.inputs {
        let headers = mmq_kernels::io::npz_headers(path).map_err(user)?;
        check(&headers).map_err(|e| user(format!("{}: {e}", path.display())))?;
        let arrays = mmq_kernels::io::read_npz(path).map_err(user)?;
        for (name, t) in arrays {
            feeds.insert(name, RtValue::from(t));
        }
    }
    for spec in &args.input {
        let Some((name, file)) = spec
            .split_once('=')
            .filter(|(n, f)| !n.is_empty() && !f.is_empty())
        else {
            return Err(Failure {
                rendered: format!("error: --input takes NAME=FILE.npy, got '{spec}'\n"),
                code: 2,
            });
        };
        let t = mmq_kernels::io::read_npy(Path::new(file)).map_err(user)?;
        feeds.insert(name.to_owned(), RtValue::from(t));
    }
    Ok(feeds)
}

/// `mmq run DIR`: one forward pass of a package's whole pipeline; every stage's outputs
/// (named `STAGE.NAME` where two stages have an output of one name).
fn run_package(args: &RunArgs) -> Result<String, Failure> {
    if args.stats || args.repeat > 0 {
        return Err(Failure::usage(
            "--stats and --repeat time one model; run a stage's file of the package".to_owned(),
        ));
    }
    let package = mmq_deploy::Package::open(&args.model).map_err(user)?;
    let feeds = feeds(args, |_| Ok(()))?;
    let outputs = package.run(&feeds).map_err(user)?;
    let count = |n: &str| outputs.iter().filter(|o| o.name == n).count();
    let named: Vec<(String, RtValue)> = outputs
        .iter()
        .map(|o| {
            let name = if count(&o.name) > 1 {
                format!("{}.{}", o.stage, o.name)
            } else {
                o.name.clone()
            };
            (name, o.value.clone())
        })
        .collect();
    values::save_or_summarize(args.output.as_deref(), &named).map_err(user)
}
