//! Named run-time values as `mmq run` gives them: saved as `.npz`, or summarized one line each;
//! and the interpreter's per-op times.

use std::fmt::Write as _;
use std::path::Path;

use mmq_kernels::{Data, RtValue, Tensor};

/// Values could not be saved.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SaveError(String);

fn user(e: impl std::fmt::Display) -> SaveError {
    SaveError(e.to_string())
}

/// INT4 and UINT4 codes widened to INT8 and UINT8 (NumPy has no 4-bit type); `None` for
/// every other tensor.
fn widened(t: &Tensor) -> Result<Option<Tensor>, SaveError> {
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
/// returns a summary line for each; with a path, returns a line for each output not saved.
pub fn save_or_summarize(
    path: Option<&Path>,
    outputs: &[(String, RtValue)],
) -> Result<String, SaveError> {
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

/// One line per output: name, dtype, shape, statistics and the first values.
pub fn summarize(text: &mut String, name: &str, value: &RtValue) {
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

/// The interpreter's time per op, most expensive first, and its peak of live tensor bytes;
/// `repeat` runs after the first were timed (their mean is given).
pub fn op_times(stats: &mmq_kernels::RunStats, repeat: usize) -> String {
    let mut text = String::new();
    let mut ops: Vec<_> = stats.per_op.iter().collect();
    ops.sort_by(|a, b| b.1.1.cmp(&a.1.1).then(a.0.cmp(b.0)));
    let runs = repeat.max(1);
    let total: f64 = ops.iter().map(|(_, (_, d))| d.as_secs_f64()).sum::<f64>() / runs as f64;
    if repeat > 0 {
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
    text
}
