//! What a compilation says, as text: the lines `mmq compile` prints on stderr.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::build::{Built, Job, Written};
use crate::{Precision, Stage};

/// The end-to-end cosine a quantized model should keep; below it the accuracy line says how to
/// get further.
const ACCURACY_GOAL: f64 = 0.99;

impl Built {
    /// What the compilation says, as `mmq compile` prints it: pass dumps, each pass's counters and
    /// notes (all passes with `time_passes`, with their times; else those of the split,
    /// quantization and finishing stages), the accuracy figures, and what was written.
    pub fn summary(&self, job: &Job, time_passes: bool) -> String {
        let built = self;
        let report = &built.report;
        let mut stderr = String::new();
        for pass in &report.passes {
            if let Some(dump) = &pass.dump {
                let _ = writeln!(stderr, "// ----- after {} -----", pass.name);
                stderr.push_str(dump);
            }
        }
        if time_passes {
            stderr.push_str(&counter_table(
                report
                    .passes
                    .iter()
                    .map(|p| (p.name.as_str(), p.ms, &p.counters, &p.notes)),
                Some(report.total_ms),
            ));
        } else {
            // The quantization passes always say what they did.
            for p in report
                .stage(Stage::Split)
                .chain(report.stage(Stage::Quantize))
                .chain(report.stage(Stage::Finish))
            {
                let counters = counter_list(&p.counters);
                if !counters.is_empty() {
                    let _ = writeln!(stderr, "{}: {}", p.name, counters.join(" "));
                }
                for note in &p.notes {
                    let _ = writeln!(stderr, "{}: {note}", p.name);
                }
            }
        }
        if let Some(map) = &built.auto_map {
            let _ = writeln!(stderr, "auto: wrote precision map {}", map.display());
        }
        let minmax_int8 = matches!(
            job.options.precision,
            Precision::Int8 { observer, .. } | Precision::Auto { observer, .. }
                if observer == crate::ObserverChoice::default()
        );
        let auto = match job.options.precision {
            Precision::Auto { cosine, .. } => Some(cosine),
            _ => None,
        };
        stderr.push_str(&accuracy_text(
            report,
            job.options.accuracy == crate::Accuracy::Full,
            auto,
            matches!(job.options.calibration, crate::CalibrationSource::Dir(_)),
            minmax_int8,
        ));
        if let Some(q) = &built.qparams {
            let pairs: u64 = q.table.entries.iter().map(|e| u64::from(e.count)).sum();
            let _ = writeln!(
                stderr,
                "qparams: wrote {}: {pairs} scale/zero-point pairs of {} tensors, {} bytes",
                q.path.display(),
                q.table.entries.len(),
                q.table.bytes
            );
            let _ = writeln!(
                stderr,
                "qparams: {}",
                if q.referenced {
                    "the model reads its scales from the table (external data)"
                } else if job.options.target == mmq_passes::TargetRef::ORT {
                    "the table is not in the model's directory: the model keeps its own scales"
                } else {
                    "the TensorRT model keeps its own scales"
                }
            );
        }
        match &built.written {
            Written::Models(_) => {}
            Written::Trt(package) => stderr.push_str(&trt_text(&job.output, package)),
            Written::Package(written) => {
                stderr.push_str(&package_text(&job.output, written));
                if let Some(kept) = built.unshared_kv {
                    let why = match kept {
                        0 => "the decoder's attention was not fused into one op".to_owned(),
                        n => format!(
                            "{n} attention layer(s) lack the form it reads (a standard \
                             Attention, or GPT-2's MultiHeadAttention, over Concat(past, new), \
                             its mask a causal band computed from attention_mask alone)"
                        ),
                    };
                    let _ = writeln!(
                        stderr,
                        "package: GroupQueryAttention: not applied: {why} (docs/deploy.md); \
                         each past and present is its own buffer"
                    );
                }
                if let Some(kv) = built.shared_kv {
                    let _ = writeln!(
                        stderr,
                        "package: GroupQueryAttention in {} layer(s): the past and the present \
                     share one buffer",
                        kv.layers
                    );
                    if let Some(n) = kv.int8_samples {
                        let _ = writeln!(
                            stderr,
                            "package: KV cache: int8 codes read by GroupQueryAttention, static \
                             per-channel scales calibrated on {n} sample(s)"
                        );
                    }
                }
            }
        }
        stderr
    }
}

/// What a written TensorRT package holds, for stderr.
fn trt_text(dir: &Path, package: &mmq_backend_trt::Package) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "trt: wrote {}: {}",
        dir.display(),
        relative(dir, &package.files)
    );
    for (name, p) in &package.profiles {
        let _ = writeln!(s, "trt: profile {name} = {}:{}:{}", p.min, p.opt, p.max);
    }
    for note in &package.notes {
        let _ = writeln!(s, "warning: trt: {note}");
    }
    if !package.findings.is_empty() {
        let _ = writeln!(
            s,
            "warning: {} node(s) TensorRT's parser or quantization rules will refuse (also in \
             manifest.json):",
            package.findings.len()
        );
        for f in &package.findings {
            let _ = writeln!(s, "  {f}");
        }
    }
    s
}

/// `files` relative to `dir`, comma-separated.
fn relative(dir: &Path, files: &[PathBuf]) -> String {
    files
        .iter()
        .map(|f| {
            f.strip_prefix(dir)
                .unwrap_or(f)
                .to_string_lossy()
                .into_owned()
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// What a written package holds, for stderr.
fn package_text(dir: &Path, written: &mmq_deploy::Written) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "package: wrote {}: {}",
        dir.display(),
        relative(dir, &written.files)
    );
    let spec = &written.spec;
    for stage in &spec.stages {
        let ports = |p: &[mmq_deploy::spec::Port]| {
            p.iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(
            s,
            "package: stage {} ({}): {} -> {}",
            stage.name,
            match stage.role {
                mmq_deploy::spec::Role::VisionEncoder => "vision encoder",
                mmq_deploy::spec::Role::Decoder => "decoder",
                mmq_deploy::spec::Role::Model => "model",
            },
            ports(&stage.inputs),
            ports(&stage.outputs)
        );
    }
    if let Some(kv) = &spec.kv_cache {
        let _ = writeln!(
            s,
            "package: KV cache: {} pairs, {}",
            kv.pairs.len(),
            kv.format
        );
    }
    if let Some(g) = &spec.generation {
        let _ = writeln!(
            s,
            "package: generation: vocab {}, context {}, bos {:?}, eos {:?}",
            g.vocab_size, g.context_length, g.bos_token_id, g.eos_token_id
        );
    }
    match (
        &spec.onnxruntime_genai.config,
        &spec.onnxruntime_genai.reason,
    ) {
        (Some(c), _) => {
            let _ = writeln!(
                s,
                "package: onnxruntime-genai: {c} written (onnxruntime_genai.Model(DIR) runs it)"
            );
        }
        (None, Some(why)) => {
            let _ = writeln!(s, "package: onnxruntime-genai: no config: {why}");
        }
        (None, None) => {}
    }
    s
}

/// The accuracy table (`--report`) or line (a quantizing run) of `report`; `auto` is the
/// `--auto` target the run was given, so the hint below the goal never names the same run;
/// `calibrated_on` says the samples were a `--calib` folder, which also calibrated the model
/// (random samples are drawn afresh for the figures).
fn accuracy_text(
    report: &crate::CompileReport,
    full: bool,
    auto: Option<f64>,
    calibrated_on: bool,
    minmax_int8: bool,
) -> String {
    match &report.accuracy {
        None => String::new(),
        Some(crate::AccuracyReport::Full(r)) if full => {
            let mut text = r.table();
            for a in &report.activations {
                text.push_str(&a.table());
            }
            for a in &report.alignment {
                text.push_str(&format!(
                    "alignment: {} Δs = s_quant - s_fp: mean {:+.5}, mean |Δs| {:.5}, max |Δs| \
                     {:.5} (mean |s_fp| {:.5}) over {} held-back sample(s)\n",
                    a.what,
                    a.mean_delta,
                    a.mean_abs_delta,
                    a.max_abs_delta,
                    a.mean_abs_fp,
                    a.samples
                ));
            }
            text
        }
        Some(a) => {
            let Some(e) = a.end_to_end() else {
                return "accuracy: no float output to compare\n".to_owned();
            };
            let on = if calibrated_on {
                "sample(s) of the --calib folder (they calibrated it too)"
            } else {
                "held-back sample(s)"
            };
            let mut line = format!(
                "accuracy: '{}' cosine {:.4} (min {:.4}) against the unquantized model on {} {on}",
                e.output, e.cosine_mean, e.cosine_min, e.samples
            );
            if e.cosine_min < ACCURACY_GOAL {
                line.push_str(&format!(
                    "; below {ACCURACY_GOAL}: {}",
                    next_step(auto, minmax_int8)
                ));
            }
            line.push('\n');
            line
        }
    }
}

/// What to try when the held-back cosine falls below [`ACCURACY_GOAL`], never the run that was
/// just made: without `--auto`, `--auto` at the goal; with it, a higher target, real calibration
/// samples (the search judged on its own) or a map keeping the weakest layers float.
/// What to try when the accuracy line is below the goal: never the run that was made.
/// `minmax_int8`: the run was INT8 with minmax ranges, so clipped ranges are worth a try.
fn next_step(auto: Option<f64>, minmax_int8: bool) -> String {
    let report = "--report OUT.json shows each layer";
    let observer = if minmax_int8 {
        ", or --observer auto tries clipped activation ranges (percentile, entropy, mse)"
    } else {
        ""
    };
    match auto {
        None => format!(
            "--auto {ACCURACY_GOAL} keeps the most sensitive layers in higher precision until it \
             holds{observer} ({report})"
        ),
        Some(target) => {
            let higher = (target + (1.0 - target) / 2.0).max(ACCURACY_GOAL);
            let higher = if higher >= 0.9999 {
                "a precision map keeping the weakest layers float".to_owned()
            } else {
                format!("--auto {higher:.4} (the search met {target} on its own samples)")
            };
            format!(
                "try {higher}, or --calib DIR with real samples so the search judges on data \
                 like the held-back samples{observer} ({report})"
            )
        }
    }
}

/// One row per pass: name, milliseconds (when `total` is given), and its counters; then each
/// pass's notes.
pub fn counter_table<'a>(
    passes: impl Iterator<
        Item = (
            &'a str,
            f64,
            &'a std::collections::BTreeMap<String, usize>,
            &'a Vec<String>,
        ),
    > + Clone,
    total: Option<f64>,
) -> String {
    let width = passes
        .clone()
        .map(|p| p.0.len())
        .max()
        .unwrap_or(0)
        .max("pass".len());
    let mut s = String::new();
    if total.is_some() {
        let _ = writeln!(s, "{:<width$} {:>10}  counters", "pass", "ms");
    } else {
        let _ = writeln!(s, "{:<width$}  counters", "pass");
    }
    for (name, ms, counters, _) in passes.clone() {
        let counters = counter_list(counters);
        let counters = if counters.is_empty() {
            "-".to_owned()
        } else {
            counters.join(" ")
        };
        if total.is_some() {
            let _ = writeln!(s, "{name:<width$} {ms:>10.3}  {counters}");
        } else {
            let _ = writeln!(s, "{name:<width$}  {counters}");
        }
    }
    if let Some(total) = total {
        let _ = writeln!(s, "{:<width$} {total:>10.3}", "total");
    }
    for (name, _, _, notes) in passes {
        for note in notes {
            let _ = writeln!(s, "{name}: {note}");
        }
    }
    s
}

/// Counters as `name=count` items.
fn counter_list(counters: &std::collections::BTreeMap<String, usize>) -> Vec<String> {
    counters.iter().map(|(k, v)| format!("{k}={v}")).collect()
}

#[cfg(test)]
mod tests {
    use super::next_step;

    #[test]
    fn the_hint_below_the_goal_never_names_the_run_that_was_made() {
        assert!(next_step(None, false).starts_with("--auto 0.99 keeps"));
        for target in [0.9, 0.98, 0.99, 0.995] {
            let hint = next_step(Some(target), false);
            assert!(
                !hint.contains(&format!("--auto {target} ")),
                "{target}: {hint}"
            );
            assert!(hint.contains("--calib DIR"), "{hint}");
        }
        assert!(next_step(Some(0.99), false).starts_with("try --auto 0.9950"));
        assert!(next_step(Some(0.9), false).starts_with("try --auto 0.9900"));
        assert!(
            next_step(None, true).contains("--observer auto tries clipped activation ranges"),
            "{}",
            next_step(None, true)
        );
        assert!(!next_step(None, false).contains("--observer"));
        let top = next_step(Some(0.9999), false);
        assert!(
            top.starts_with("try a precision map") && !top.contains("--auto 0."),
            "{top}"
        );
    }
}
