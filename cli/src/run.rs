//! `mmq run`: runs a model's first entry graph in the reference interpreter on NumPy inputs.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use mmq_kernels::{Data, Interpreter, RtValue, Tensor};

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

    let mut text = write_outputs(args.output.as_deref(), &outputs)?;
    if let Some(stats) = interp.stats() {
        let mut ops: Vec<_> = stats.per_op.iter().collect();
        ops.sort_by(|a, b| b.1.1.cmp(&a.1.1).then(a.0.cmp(b.0)));
        let runs = args.repeat.max(1);
        let total: f64 = ops.iter().map(|(_, (_, d))| d.as_secs_f64()).sum::<f64>() / runs as f64;
        if args.repeat > 0 {
            let _ = writeln!(text, "time per op (mean of {runs} runs after the first):");
        } else {
            let _ = writeln!(text, "time per op:");
        }
        for (op, (calls, d)) in ops {
            let calls = calls / runs;
            let ms = d.as_secs_f64() * 1e3 / runs as f64;
            let share = if total > 0.0 {
                100.0 * ms / (total * 1e3)
            } else {
                0.0
            };
            let _ = writeln!(
                text,
                "  {op:<24} {calls:>6} calls {ms:>10.3} ms {share:>5.1}%"
            );
        }
        let _ = writeln!(
            text,
            "  {:<24} {:>12} {:>10.3} ms",
            "total",
            "",
            total * 1e3
        );
        let _ = writeln!(text, "peak live tensor bytes: {}", stats.peak_live_bytes);
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

/// INT4 and UINT4 codes widened to INT8 and UINT8 (NumPy has no 4-bit type); `None` for
/// every other tensor.
fn widened(t: &Tensor) -> Result<Option<Tensor>, Failure> {
    let data = match t.dtype {
        mmq_ir::DType::I4 => Data::I8(t.to_i64().map_err(user)?.iter().map(|&v| v as i8).collect()),
        mmq_ir::DType::U4 => Data::U8(t.to_i64().map_err(user)?.iter().map(|&v| v as u8).collect()),
        _ => return Ok(None),
    };
    let dtype = match data {
        Data::I8(_) => mmq_ir::DType::I8,
        _ => mmq_ir::DType::U8,
    };
    Tensor::new(dtype, t.shape.clone(), data)
        .map(Some)
        .map_err(user)
}

/// Writes `outputs` to the `.npz` `path` (4-bit codes widened to 8 bits), or, without one,
/// returns a summary line for each.
fn write_outputs(path: Option<&Path>, outputs: &[(String, RtValue)]) -> Result<String, Failure> {
    let mut text = String::new();
    match path {
        Some(path) => {
            let wide: Vec<Option<Tensor>> = outputs
                .iter()
                .map(|(_, v)| match v {
                    RtValue::Tensor(t) => widened(t),
                    _ => Ok(None),
                })
                .collect::<Result<_, _>>()?;
            let mut arrays: Vec<(String, &Tensor)> = Vec::new();
            for ((name, value), wide) in outputs.iter().zip(&wide) {
                match value {
                    RtValue::Tensor(t) => arrays.push((name.clone(), wide.as_ref().unwrap_or(t))),
                    RtValue::Sequence(ts) => arrays.extend(
                        ts.iter()
                            .enumerate()
                            .map(|(i, t)| (format!("{name}[{i}]"), &**t)),
                    ),
                    RtValue::Optional(Some(v)) => match &**v {
                        RtValue::Tensor(t) => arrays.push((name.clone(), t)),
                        _ => {
                            return Err(user(format!(
                                "output {name}: an optional sequence cannot be saved as .npz"
                            )));
                        }
                    },
                    RtValue::Optional(None) => {
                        let _ = writeln!(text, "{name}: empty optional, not saved");
                    }
                }
            }
            let refs: Vec<(&str, &Tensor)> = arrays.iter().map(|(n, t)| (n.as_str(), *t)).collect();
            mmq_kernels::io::write_npz(path, &refs).map_err(user)?;
        }
        None => {
            for (name, value) in outputs {
                summarize(&mut text, name, value);
            }
        }
    }
    Ok(text)
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
    write_outputs(args.output.as_deref(), &named)
}

/// One line per output: name, dtype, shape, statistics and the first values.
fn summarize(text: &mut String, name: &str, value: &RtValue) {
    match value {
        RtValue::Tensor(t) => {
            let _ = writeln!(text, "{name}: {}", describe(t));
        }
        RtValue::Sequence(ts) => {
            let _ = writeln!(text, "{name}: sequence of {}", ts.len());
            for (i, t) in ts.iter().enumerate() {
                let _ = writeln!(text, "  [{i}]: {}", describe(t));
            }
        }
        RtValue::Optional(None) => {
            let _ = writeln!(text, "{name}: empty optional");
        }
        RtValue::Optional(Some(v)) => summarize(text, &format!("{name} (optional)"), v),
    }
}

const SHOWN: usize = 6;

fn describe(t: &Tensor) -> String {
    let dims: Vec<String> = t.shape.iter().map(usize::to_string).collect();
    let mut s = format!("{}[{}]", t.dtype, dims.join(", "));
    if let Data::Str(v) = &t.data {
        let first: Vec<String> = v.iter().take(SHOWN).map(|x| format!("{x:?}")).collect();
        let more = if v.len() > SHOWN { ", ..." } else { "" };
        let _ = write!(s, " [{}{more}]", first.join(", "));
        return s;
    }
    let Ok(vals) = t.to_f64() else {
        return s;
    };
    if !vals.is_empty() {
        let finite: Vec<f64> = vals.iter().copied().filter(|x| !x.is_nan()).collect();
        if !finite.is_empty() {
            let min = finite.iter().copied().fold(f64::INFINITY, f64::min);
            let max = finite.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let mean = finite.iter().sum::<f64>() / finite.len() as f64;
            let _ = write!(s, " min {} max {} mean {}", num(min), num(max), num(mean));
        }
        let nans = vals.len() - finite.len();
        if nans > 0 {
            let _ = write!(s, " ({nans} NaN)");
        }
    }
    let first: Vec<String> = match &t.data {
        Data::Bool(v) => v.iter().take(SHOWN).map(bool::to_string).collect(),
        _ => vals.iter().take(SHOWN).map(|&x| num(x)).collect(),
    };
    let more = if t.len() > SHOWN { ", ..." } else { "" };
    let _ = write!(s, " [{}{more}]", first.join(", "));
    s
}

/// A number in at most 6 significant digits.
fn num(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{x:.0}")
    } else if x != 0.0 && (x.abs() >= 1e6 || x.abs() < 1e-4) {
        format!("{x:.5e}")
    } else {
        let s = format!("{x:.6}");
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    }
}
