//! The mmq compile API: every front end (the `mmq` command, the Python package, tests) compiles
//! through [`compile`].
//!
//! ```no_run
//! use mmq_compiler::{CompileOptions, Precision, Scheme, compile, load};
//!
//! let (mut module, warnings) = load::load(&["model.onnx".into()])?.verified()?;
//! eprint!("{warnings}");
//! let options = CompileOptions {
//!     precision: Precision::of(Scheme::Int8),
//!     ..CompileOptions::default()
//! };
//! let report = compile(&mut module, &options)?;
//! println!("{}", report.to_json());
//! mmq_compiler::export::write(&module, &[], "model.int8.onnx".as_ref())?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod analysis;
pub mod build;
pub mod cache_plan;
pub mod calibration;
pub mod diagnostics;
pub mod export;
pub mod html;
pub mod inspect;
pub mod load;
mod options;
pub mod precision_map;
pub mod qparams;
pub mod render;
mod report;
pub mod run_files;
mod steps;
pub mod summary;
pub mod values;

use std::sync::{Arc, Mutex};

use mmq_ir::Module;
use mmq_passes::quant::cache::{ImageCachePass, KvCachePass};
use mmq_passes::quant::calibrate::Sample;
use mmq_passes::{Pass, PassError, PassOptions};

pub use calibration::{CalibrationSource, DEFAULT_RANDOM_SAMPLES};
pub use mmq_deploy::GenerationConfig;
pub use options::{
    Accuracy, CompileOptions, Flags, Int4Options, ObserverChoice, Opt, OptionError, Precision,
    Progress, ProgressFn, Quant, QuantFlags, Scheme, Spelling, Takes, TargetLacks,
};
pub use report::{AccuracyReport, CompileReport, PassSummary, Stage};
pub use steps::AutoOutcome;

/// A compilation failed.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// The options do not fit together (a usage error).
    #[error("{0}")]
    Options(#[from] OptionError),
    /// The module has no entry graph.
    #[error("the module has no graph")]
    NoGraph,
    /// A pass failed (its name and what went wrong).
    #[error("{0}")]
    Pass(#[from] PassError),
    /// Measuring accuracy failed.
    #[error("{0}")]
    Accuracy(String),
    /// [`CompileOptions::interrupt`] was set: the compilation stopped with nothing written.
    #[error("interrupted")]
    Interrupted,
}

impl CompileError {
    /// Whether the caller asked for something impossible (exit code 2 on the command line).
    pub fn is_usage(&self) -> bool {
        matches!(self, CompileError::Options(_))
    }
}

/// Samples for the accuracy figures when the calibration source is the default: fewer than
/// calibration draws, with the same seed.
const ACCURACY_SAMPLES: usize = 8;

/// The passes of a compilation, in order, with the stage of each.
fn passes(options: &CompileOptions, ctx: &Arc<steps::Context>) -> Vec<(Stage, Box<dyn Pass>)> {
    use mmq_passes::{Phase, pipeline};
    let quantizing = options.precision.quantizes();
    let phase = |stage: Stage, phase: Phase| {
        pipeline(options.target, options.level, phase)
            .into_passes()
            .into_iter()
            .map(move |p| (stage, p))
    };
    let mut out: Vec<(Stage, Box<dyn Pass>)> = Vec::new();
    if !quantizing {
        out.extend(phase(Stage::Optimize, Phase::Float));
        out.extend(phase(Stage::Finish, Phase::Lower));
        return out;
    }
    out.extend(phase(Stage::Optimize, Phase::BeforeQuant));
    let ctx = Arc::clone(ctx);
    let mut quant: Vec<Box<dyn Pass>> = Vec::new();
    match &options.precision {
        Precision::Float => {}
        p @ (Precision::Int8 { smoothquant, .. } | Precision::Int8Dynamic { smoothquant, .. }) => {
            if let Some(alpha) = *smoothquant {
                quant.push(Box::new(steps::SmoothStep {
                    ctx: Arc::clone(&ctx),
                    alpha,
                }));
            }
            quant.push(Box::new(steps::Int8Step {
                ctx,
                dynamic: matches!(p, Precision::Int8Dynamic { .. }),
            }));
        }
        Precision::Int4 { awq, .. } => {
            if *awq {
                quant.push(Box::new(steps::AwqStep {
                    ctx: Arc::clone(&ctx),
                }));
            }
            quant.push(Box::new(steps::WeightOnlyStep::new(ctx, false)));
        }
        Precision::Fp8 { .. } => quant.push(Box::new(steps::WeightOnlyStep::new(ctx, true))),
        Precision::Fp16 => quant.push(steps::fp16()),
        Precision::Map { map, .. } => quant.push(Box::new(steps::MixedStep {
            ctx,
            map: (**map).clone(),
        })),
        Precision::Auto { cosine, .. } => quant.push(Box::new(steps::AutoStep {
            ctx,
            target: *cosine,
        })),
    }
    out.extend(quant.into_iter().map(|p| (Stage::Quantize, p)));
    out.extend(phase(Stage::Finish, Phase::AfterQuant));
    out.extend(phase(Stage::Finish, Phase::Lower));
    out
}

/// The modality split, when asked for (`split`) or implied (`image_cache`: a merged graph has
/// no vision-only output until it is split; a pipeline already split is left as it is).
fn split_passes(options: &CompileOptions) -> Vec<(Stage, Box<dyn Pass>)> {
    if options.split || options.image_cache.is_some() {
        vec![(
            Stage::Split,
            Box::new(mmq_passes::split::ModalitySplit {
                modality: options.modality.clone(),
            }),
        )]
    } else {
        Vec::new()
    }
}

/// Whether compiling `module` with `options` gives several models (several entry graphs, or
/// the two graphs of a split), written into a directory rather than one file.
pub fn writes_several_models(module: &Module, options: &CompileOptions) -> bool {
    module.entries.len() > 1
        || ((options.split || options.image_cache.is_some())
            && mmq_passes::split::splits(module, &options.modality))
}

/// The passes that change the graph interface, run after the accuracy figures.
fn interface_passes(options: &CompileOptions) -> Vec<(Stage, Box<dyn Pass>)> {
    let mut out: Vec<(Stage, Box<dyn Pass>)> = Vec::new();
    if let Some(format) = options.image_cache {
        out.push((
            Stage::Interface,
            Box::new(ImageCachePass {
                format,
                modality: options.modality.clone(),
            }),
        ));
    }
    if let Some(format) = options.kv_cache {
        out.push((Stage::Interface, Box::new(KvCachePass { format })));
    }
    out
}

/// The names of the passes a compilation with `options` runs, in order (what `dump_after`
/// can select).
pub fn pass_names(options: &CompileOptions) -> Vec<String> {
    let ctx = Arc::new(context(options));
    split_passes(options)
        .iter()
        .chain(&passes(options, &ctx))
        .chain(&interface_passes(options))
        .map(|(_, p)| p.name().to_owned())
        .collect()
}

fn context(options: &CompileOptions) -> steps::Context {
    steps::Context {
        calibration: options.calibration.clone(),
        observer: options.precision.observer(),
        placement: options.placement,
        int4: options.precision.int4(),
        granularity: options.precision.granularity(),
        skip_non_finite: options.skip_non_finite,
        modality: options.modality.clone(),
        progress: options.progress.clone(),
        main_output: options.main_output.clone(),
        interrupt: options.interrupt.clone(),
        auto: Mutex::new(None),
    }
}

/// Compiles `module` in place: the optimization passes of the level, the quantization passes
/// of the precision plan (calibrating on the current module as they run), the passes that
/// finish a quantized module, all in one pass manager; then the accuracy figures asked for.
pub fn compile(
    module: &mut Module,
    options: &CompileOptions,
) -> Result<CompileReport, CompileError> {
    options.check()?;
    if module.entries.is_empty() {
        return Err(CompileError::NoGraph);
    }
    if let Some(name) = &options.main_output {
        let outputs: Vec<&str> = module
            .entries
            .iter()
            .flat_map(|e| &module.graphs[e.graph].outputs)
            .filter_map(|&v| module.values[v].name.as_deref())
            .collect();
        if !outputs.contains(&name.as_str()) {
            return Err(OptionError::NoSuchOutput {
                name: name.clone(),
                outputs: outputs.into_iter().map(str::to_owned).collect(),
            }
            .into());
        }
    }
    if let Some(mmq_passes::DumpAfter::Pass(name)) = &options.dump_after {
        let names = pass_names(options);
        let d = mmq_passes::DumpAfter::Pass(name.clone());
        if !names.iter().any(|p| d.matches(p)) {
            return Err(OptionError::NoSuchPass {
                name: name.clone(),
                level: options.level.digit(),
                passes: names,
            }
            .into());
        }
    }
    // The split first: the accuracy figures compare the split float pipeline with the compiled
    // one.
    let (split_run, split_stages) = run_stage(module, options, split_passes(options))?;
    let quantizing = options.precision.quantizes();
    let measure = match options.accuracy {
        Accuracy::Off => None,
        Accuracy::EndToEnd if !quantizing => None,
        a => Some(a),
    };
    let original = measure.map(|_| module.clone());

    let ctx = Arc::new(context(options));
    let (run, stages) = run_stage(module, options, passes(options, &ctx))?;
    let mut report = CompileReport::new(options, &split_run, &split_stages).with_run(&run, &stages);
    report.auto = ctx.auto.lock().unwrap_or_else(|e| e.into_inner()).take();
    if options
        .interrupt
        .as_ref()
        .is_some_and(mmq_passes::Interrupt::is_set)
    {
        return Err(CompileError::Interrupted);
    }
    if let (Some(mode), Some(original)) = (measure, &original) {
        let samples = accuracy_samples(original, options).map_err(CompileError::Accuracy)?;
        report.accuracy = Some(accuracy(
            original,
            module,
            &samples,
            mode,
            options.main_output.as_deref(),
        )?);
        if mode == Accuracy::Full {
            report.activations = activation_analysis(original, options)?;
            if let Some(AccuracyReport::Full(r)) = &report.accuracy {
                report.layers = analysis::layer_views(original, module, r, &options.modality);
            }
            let held = (samples.len() / 4).max(1).min(samples.len());
            report.alignment = analysis::alignment(
                original,
                module,
                &samples[samples.len() - held..],
                &options.modality,
            )
            .map_err(|e| CompileError::Accuracy(format!("alignment: {e}")))?;
        }
    }
    let (run, stages) = run_stage(module, options, interface_passes(options))?;
    Ok(report.with_run(&run, &stages))
}

/// Runs `--kv-cache`'s pass (when asked for) on a module [`compile`] left with a float cache,
/// adding it to `report`.
pub fn quantize_kv_cache(
    module: &mut Module,
    options: &CompileOptions,
    report: CompileReport,
) -> Result<CompileReport, CompileError> {
    let Some(format) = options.kv_cache else {
        return Ok(report);
    };
    let pass: Box<dyn Pass> = Box::new(KvCachePass { format });
    let (run, stages) = run_stage(module, options, vec![(Stage::Interface, pass)])?;
    Ok(report.with_run(&run, &stages))
}

/// Runs `passes` in one pass manager; returns its report and the passes' stages.
fn run_stage(
    module: &mut Module,
    options: &CompileOptions,
    passes: Vec<(Stage, Box<dyn Pass>)>,
) -> Result<(mmq_passes::PipelineReport, Vec<Stage>), CompileError> {
    let stages: Vec<Stage> = passes.iter().map(|(s, _)| *s).collect();
    let mut pm = mmq_passes::PassManager::new(passes.into_iter().map(|(_, p)| p).collect());
    pm.verify = options.verify;
    pm.dump_after = options.dump_after.clone();
    pm.interrupt = options.interrupt.clone();
    let run = pm.run(
        module,
        &PassOptions {
            target: options.target,
            explain: false,
        },
    );
    match run {
        Ok(run) => Ok((run, stages)),
        // A pass stopped by the interrupt reports it as its own failure (calibration).
        Err(_)
            if options
                .interrupt
                .as_ref()
                .is_some_and(mmq_passes::Interrupt::is_set) =>
        {
            Err(CompileError::Interrupted)
        }
        Err(e) => Err(e.into()),
    }
}

/// Samples of the activation analysis per graph (its cost grows with each).
const ANALYSIS_SAMPLES: usize = 4;

/// The activation granularity and symmetry of every entry graph of the unquantized module.
fn activation_analysis(
    original: &Module,
    options: &CompileOptions,
) -> Result<Vec<mmq_passes::quant::granularity::Analysis>, CompileError> {
    let fail =
        |e: &dyn std::fmt::Display| CompileError::Accuracy(format!("activation analysis: {e}"));
    let source = match &options.calibration {
        CalibrationSource::Default => CalibrationSource::Random {
            count: ANALYSIS_SAMPLES,
            seed: 0,
        },
        s => s.clone(),
    };
    let mut out = Vec::new();
    for e in &original.entries {
        let mut samples = source.collect(original, e.graph).map_err(|e| fail(&e))?;
        samples.truncate(ANALYSIS_SAMPLES);
        out.push(
            mmq_passes::quant::granularity::analyze(original, e.graph, &samples, &options.modality)
                .map_err(|e| fail(&e))?,
        );
    }
    Ok(out)
}

/// The accuracy samples: the calibration source, or [`ACCURACY_SAMPLES`] random ones.
fn accuracy_samples(original: &Module, options: &CompileOptions) -> Result<Vec<Sample>, String> {
    let graph = original.entries[0].graph;
    // Random samples are drawn afresh (the next seed), so none of them calibrated the model;
    // given samples (a folder, an iterator) are the calibration's own.
    let source = match &options.calibration {
        CalibrationSource::Default => CalibrationSource::Random {
            count: ACCURACY_SAMPLES,
            seed: 1,
        },
        CalibrationSource::Random { count, seed } => CalibrationSource::Random {
            count: *count,
            seed: seed.wrapping_add(1),
        },
        s => s.clone(),
    };
    source.collect(original, graph).map_err(|e| e.to_string())
}

fn accuracy(
    original: &Module,
    compiled: &Module,
    samples: &[Sample],
    mode: Accuracy,
    main: Option<&str>,
) -> Result<AccuracyReport, CompileError> {
    use mmq_passes::quant::report;
    let fail = |e: &dyn std::fmt::Display| CompileError::Accuracy(e.to_string());
    if mode == Accuracy::Full {
        let r = report::accuracy(original, compiled, samples, main).map_err(|e| fail(&e))?;
        return Ok(AccuracyReport::Full(r));
    }
    if samples.is_empty() {
        return Err(fail(&"no samples"));
    }
    let held = (samples.len() / 4).max(1);
    let back = &samples[samples.len() - held..];
    let e = report::end_to_end_only(original, compiled, back, main).map_err(|e| fail(&e))?;
    Ok(AccuracyReport::EndToEnd { end_to_end: e })
}
