//! `mmq compile`: import, run the pipeline of a level, export for the target.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use mmq_ir::Module;
use mmq_passes::{DumpAfter, OptLevel, PassOptions, PipelineReport, Target};

use crate::diagnostics::Failure;
use crate::load;

/// The code generation targets of `mmq compile`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CompileTarget {
    /// ONNX Runtime (CPU).
    Ort,
    /// TensorRT.
    Trt,
}

/// What `mmq compile` was asked to do.
pub struct CompileArgs {
    /// The models (several ONNX files load as one module).
    pub inputs: Vec<PathBuf>,
    /// The target.
    pub target: CompileTarget,
    /// The optimization level.
    pub level: OptLevel,
    /// The output file (one model) or directory (several).
    pub output: PathBuf,
    /// Print the module after these passes to stderr.
    pub dump_after: Option<String>,
    /// Print a table of pass times and counters to stderr.
    pub time_passes: bool,
    /// Write the accuracy report (compiled vs imported module) here as JSON and print its table.
    pub report: Option<PathBuf>,
    /// Skip the end-to-end accuracy line a quantizing run prints by default.
    pub no_accuracy: bool,
    /// `--quant SCHEME`, run after the pipeline.
    pub quant: Option<String>,
    /// Calibration samples and observer for static schemes.
    pub calib: crate::int8::CalibArgs,
    /// `--precision-map MAP.toml` for `--quant mixed` (implies it).
    pub precision_map: Option<PathBuf>,
    /// `--modality INPUT=KIND` overrides.
    pub modality: Vec<(String, mmq_ir::modality::Modality)>,
    /// `--block`: INT4 block size.
    pub block: usize,
    /// `--asym`: asymmetric INT4 blocks.
    pub asym: bool,
    /// `--smoothquant ALPHA`: SmoothQuant before INT8.
    pub smoothquant: Option<f32>,
    /// `--awq`: AWQ scales before INT4.
    pub awq: bool,
    /// `--auto TARGET`: choose a scheme per node for this end-to-end cosine.
    pub auto: Option<f64>,
    /// `--auto-map MAP.toml`: where `--auto` writes its choice.
    pub auto_map: Option<PathBuf>,
}

/// Runs `compile`; returns what to print on stderr.
pub fn run(args: &CompileArgs) -> Result<String, Failure> {
    let target = match args.target {
        CompileTarget::Ort => Target::Ort,
        CompileTarget::Trt => {
            return Err(Failure::user(
                "error: target 'trt' is not supported yet (use --target ort)\n".to_owned(),
            ));
        }
    };
    crate::int8::check_scale_flags(
        args.quant.as_deref(),
        args.precision_map.is_some(),
        args.smoothquant,
        args.awq,
    )?;
    let quantizing = args.quant.is_some() || args.precision_map.is_some() || args.auto.is_some();
    let mut pm = if quantizing {
        mmq_passes::pipeline_before_quant(target, args.level)
    } else {
        mmq_passes::pipeline(target, args.level)
    };
    pm.time = args.time_passes;
    if let Some(d) = &args.dump_after {
        let d = DumpAfter::parse(d);
        if let DumpAfter::Pass(name) = &d
            && !pm.names().iter().any(|p| d.matches(p))
        {
            let names = pm.names();
            let known = if names.is_empty() {
                format!("-O{} runs no passes", args.level.digit())
            } else {
                format!("passes at -O{}: {}", args.level.digit(), names.join(", "))
            };
            return Err(Failure {
                rendered: format!("error: --dump-after {name}: no such pass ({known}, or all)\n"),
                code: 2,
            });
        }
        pm.dump_after = Some(d);
    }

    // Fail before the work, not after it, when a single output cannot be written there.
    if args.inputs.len() == 1 {
        let dir = match args.output.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        if !dir.is_dir() {
            return Err(Failure::user(format!(
                "error: cannot write {}: the directory {} does not exist\n",
                args.output.display(),
                dir.display()
            )));
        }
    }
    let loaded = load::load(&args.inputs)?;
    loaded.verify()?;
    let mut module = loaded.module;
    if module.entries.is_empty() {
        return Err(Failure::user("error: the module has no graph\n".to_owned()));
    }
    let measure = quantizing && !args.no_accuracy && args.report.is_none();
    let original = (args.report.is_some() || measure).then(|| module.clone());
    let opts = PassOptions {
        target,
        explain: false,
    };
    let result = pm.run(&mut module, &opts);
    let report = match result {
        Ok(r) => r,
        Err(e) => return Err(Failure::user(format!("error: {e}\n"))),
    };

    let mut stderr = String::new();
    for pass in &report.passes {
        if let Some(dump) = &pass.dump {
            let _ = writeln!(stderr, "// ----- after {} -----", pass.name);
            stderr.push_str(dump);
        }
    }
    if args.time_passes {
        stderr.push_str(&counter_table(&report, true));
    }
    let quant = match (args.quant.as_deref(), &args.precision_map) {
        (None, Some(_)) => Some("mixed"),
        (Some(q), Some(_)) if q != "mixed" => {
            return Err(Failure {
                rendered: format!("error: --precision-map needs --quant mixed, not --quant {q}\n"),
                code: 2,
            });
        }
        (q, _) => q,
    };
    if let Some(target) = args.auto {
        let map = args
            .auto_map
            .clone()
            .unwrap_or_else(|| crate::auto::default_map_path(&args.output));
        stderr.push_str(&crate::auto::run(
            &mut module,
            &crate::auto::AutoArgs {
                target,
                map,
                overrides: &args.modality,
                calib: &args.calib,
                block: args.block,
                asym: args.asym,
            },
            &opts,
        )?);
    }
    match quant {
        None => {}
        Some("mixed") => {
            stderr.push_str(&crate::precision::run_mixed(
                &mut module,
                args.precision_map.as_deref(),
                &args.modality,
                &args.calib,
                &opts,
            )?);
        }
        Some(scheme @ ("int8" | "int8-dynamic")) => {
            if let Some(alpha) = args.smoothquant {
                stderr.push_str(&crate::int8::smooth(
                    &mut module,
                    alpha,
                    &args.calib,
                    &opts,
                )?);
            }
            stderr.push_str(&crate::int8::run(&mut module, scheme, &args.calib, &opts)?);
        }
        Some("fp16") => {
            stderr.push_str(&crate::compile::run_passes(
                &mut module,
                vec![Box::new(mmq_passes::quant::fp16::Fp16Pass::new())],
                &opts,
            )?);
        }
        Some(scheme @ ("int4" | "fp8")) => {
            if args.awq {
                stderr.push_str(&crate::weight_only::awq(
                    &mut module,
                    args.block,
                    args.asym,
                    &args.calib,
                    &opts,
                )?);
            }
            stderr.push_str(&crate::weight_only::run(
                &mut module,
                scheme,
                args.block,
                args.asym,
                &args.calib,
                &opts,
            )?);
        }
        Some(other) => {
            return Err(Failure {
                rendered: format!(
                    "error: --quant {other}: unknown scheme (expected int8, int8-dynamic, int4, fp8, fp16, mixed)\n"
                ),
                code: 2,
            });
        }
    }
    if quantizing {
        stderr.push_str(&run_passes(
            &mut module,
            mmq_passes::after_quant(args.level),
            &opts,
        )?);
    }
    if let (Some(path), Some(original)) = (&args.report, &original) {
        stderr.push_str(&accuracy_report(original, &module, &args.calib, path)?);
    }
    if let (true, Some(original)) = (measure, &original) {
        stderr.push_str(&accuracy_line(original, &module, &args.calib)?);
    }

    if module.entries.len() == 1 {
        write_onnx(&module, &args.output)?;
    } else {
        std::fs::create_dir_all(&args.output).map_err(|e| {
            Failure::user(format!(
                "error: cannot create directory {}: {e}\n",
                args.output.display()
            ))
        })?;
        for (i, entry) in module.entries.iter().enumerate() {
            let stem = args
                .inputs
                .get(i)
                .and_then(|p| p.file_stem())
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| module.graphs[entry.graph].name.clone());
            let path = args.output.join(format!("{stem}.onnx"));
            write_graph(&module, entry.graph, &path)?;
        }
    }
    Ok(stderr)
}

/// Random samples for the accuracy report when no calibration samples are given.
const REPORT_SAMPLES: usize = 8;

/// The end-to-end cosine a quantized model should keep; below it the accuracy line says how to
/// get further.
const ACCURACY_GOAL: f64 = 0.99;

/// The samples of the accuracy figures: `--calib DIR`, else `--calib-random N`, else
/// [`REPORT_SAMPLES`] random ones (the random ones with the seed calibration uses).
fn accuracy_samples(
    original: &Module,
    calib: &crate::int8::CalibArgs,
) -> Result<Vec<mmq_passes::quant::report::Sample>, String> {
    use mmq_passes::quant::calibrate;
    let graph = original.entries[0].graph;
    match &calib.dir {
        Some(dir) => calibrate::dir_samples(dir)
            .map_err(|e| e.to_string())?
            .collect::<Result<_, _>>(),
        None => {
            let n = calib.random.unwrap_or(REPORT_SAMPLES);
            calibrate::random_samples(original, graph, n, 0)
                .map_err(|e| e.to_string())?
                .collect::<Result<_, _>>()
        }
    }
    .map_err(|e| e.to_string())
}

/// One line with the end-to-end cosine of the main output on the held-back quarter of the
/// accuracy samples (the per-layer figures of `--report` are not computed), and, below
/// [`ACCURACY_GOAL`], the flag that gets further.
fn accuracy_line(
    original: &Module,
    compiled: &Module,
    calib: &crate::int8::CalibArgs,
) -> Result<String, Failure> {
    use mmq_passes::quant::report;
    let fail = |e: &dyn std::fmt::Display| {
        Failure::user(format!(
            "error: measuring accuracy: {e} (--no-accuracy skips it)\n"
        ))
    };
    let samples = accuracy_samples(original, calib).map_err(|e| fail(&e))?;
    if samples.is_empty() {
        return Err(fail(&"no samples"));
    }
    let held = (samples.len() / 4).max(1);
    let back = &samples[samples.len() - held..];
    let Some(e) = report::end_to_end_only(original, compiled, back).map_err(|e| fail(&e))? else {
        return Ok("accuracy: no float output to compare\n".to_owned());
    };
    let mut line = format!(
        "accuracy: '{}' cosine {:.4} (min {:.4}) against the unquantized model on {} held-back \
         sample(s)",
        e.output, e.cosine_mean, e.cosine_min, e.samples
    );
    if e.cosine_min < ACCURACY_GOAL {
        line.push_str(&format!(
            "; below {ACCURACY_GOAL}: --auto {ACCURACY_GOAL} keeps the most sensitive layers in \
             higher precision until it holds (--report OUT.json shows each layer)"
        ));
    }
    line.push('\n');
    Ok(line)
}

/// Runs both modules on the calibration samples (`--calib DIR`, else `--calib-random N`, else
/// [`REPORT_SAMPLES`] random ones; the random ones with the seed calibration uses), the last
/// quarter held back for the end-to-end figures; writes the JSON report to `path`, returns the
/// table.
fn accuracy_report(
    original: &Module,
    compiled: &Module,
    calib: &crate::int8::CalibArgs,
    path: &Path,
) -> Result<String, Failure> {
    use mmq_passes::quant::report;
    let fail = |e: &dyn std::fmt::Display| Failure::user(format!("error: --report: {e}\n"));
    let samples = accuracy_samples(original, calib).map_err(|e| fail(&e))?;
    let r = report::accuracy(original, compiled, &samples).map_err(|e| fail(&e))?;
    std::fs::write(path, r.to_json() + "\n")
        .map_err(|e| fail(&format!("cannot write {}: {e}", path.display())))?;
    Ok(r.table())
}

/// Writes the first entry graph of `m` as ONNX (atomically; large weights external).
pub fn write_onnx(m: &Module, path: &Path) -> Result<(), Failure> {
    let Some(entry) = m.entries.first() else {
        return Err(Failure::user("error: the module has no graph\n".to_owned()));
    };
    write_graph(m, entry.graph, path)
}

fn write_graph(m: &Module, graph: mmq_ir::GraphId, path: &Path) -> Result<(), Failure> {
    mmq_backend_ort::write_model(m, graph, path, &mmq_backend_ort::ExportOptions::default())
        .map(|_| ())
        .map_err(|e| Failure::user(format!("error: cannot write {}: {e}\n", path.display())))
}

/// One row per pass: name, milliseconds (when `times`), and its counters.
pub fn counter_table(report: &PipelineReport, times: bool) -> String {
    let width = report
        .passes
        .iter()
        .map(|p| p.name.len())
        .max()
        .unwrap_or(0)
        .max("pass".len());
    let mut s = String::new();
    if times {
        let _ = writeln!(s, "{:<width$} {:>10}  counters", "pass", "ms");
    } else {
        let _ = writeln!(s, "{:<width$}  counters", "pass");
    }
    for p in &report.passes {
        let counters = counter_list(&p.report);
        let counters = if counters.is_empty() {
            "-".to_owned()
        } else {
            counters.join(" ")
        };
        if times {
            let ms = p.time.as_secs_f64() * 1e3;
            let _ = writeln!(s, "{:<width$} {ms:>10.3}  {counters}", p.name);
        } else {
            let _ = writeln!(s, "{:<width$}  {counters}", p.name);
        }
    }
    if times {
        let total = report.total_time().as_secs_f64() * 1e3;
        let _ = writeln!(s, "{:<width$} {total:>10.3}", "total");
    }
    for p in &report.passes {
        for note in &p.report.notes {
            let _ = writeln!(s, "{}: {note}", p.name);
        }
    }
    s
}

/// Runs `passes` on `module` and lists each pass's counters (`name: k=v ...`, passes that
/// counted nothing left out) and notes.
pub fn run_passes(
    module: &mut mmq_ir::Module,
    passes: Vec<Box<dyn mmq_passes::Pass>>,
    opts: &mmq_passes::PassOptions,
) -> Result<String, Failure> {
    let report = mmq_passes::PassManager::new(passes)
        .run(module, opts)
        .map_err(|e| Failure::user(format!("error: {e}\n")))?;
    let mut out = String::new();
    for p in &report.passes {
        let counters = counter_list(&p.report);
        if !counters.is_empty() {
            let _ = writeln!(out, "{}: {}", p.name, counters.join(" "));
        }
        for note in &p.report.notes {
            let _ = writeln!(out, "{}: {note}", p.name);
        }
    }
    Ok(out)
}

/// A pass's counters as `name=count` items.
fn counter_list(report: &mmq_passes::PassReport) -> Vec<String> {
    report
        .counters
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect()
}
