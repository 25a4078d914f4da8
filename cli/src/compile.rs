//! `mmq compile`: arguments into a [`Job`], [`mmq_compiler::build::build`], and what to print.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use clap::builder::TypedValueParser as _;
use indicatif::{ProgressBar, ProgressStyle};
use mmq_compiler::build::{BuildError, Job, PackageRequest};
use mmq_compiler::{
    Accuracy, CalibrationSource, CompileError, CompileOptions, Opt, OptionError, Progress, Quant,
    QuantFlags,
};
use mmq_passes::quant::place::Placement;
use mmq_passes::{DumpAfter, TargetRef};

use crate::failure::Failure;

/// The code generation targets of `mmq compile`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CompileTarget {
    /// ONNX Runtime (CPU).
    Ort,
    /// TensorRT.
    Trt,
}

/// `--placement`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PlacementArg {
    /// The target's cost model keeps a unit integer only where it is estimated faster.
    Cost,
    /// Every eligible node.
    All,
}

/// Parses `--observer`.
pub fn parse_observer(s: &str) -> Result<mmq_compiler::ObserverChoice, String> {
    s.parse()
        .map_err(|e: mmq_passes::quant::calibrate::CalibError| e.to_string())
}

/// `--quant`'s parser: its values listed in the help.
fn quant_parser() -> impl clap::builder::TypedValueParser<Value = Quant> {
    clap::builder::PossibleValuesParser::new(Quant::ALL.map(Quant::name))
        .try_map(|s| s.parse::<Quant>())
}

/// What `mmq compile` was asked to do: its command-line arguments.
#[derive(clap::Args, Debug)]
pub struct CompileArgs {
    /// The ONNX models (several load as one module and export into the directory OUT).
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
    /// The target (ONNX Runtime unless given).
    #[arg(long, value_enum, default_value_t = CompileTarget::Ort)]
    pub target: CompileTarget,
    /// Optimization level: -O0 (none), -O1 (canonicalize, const-fold, dce), -O2 (also the
    /// rule sets).
    #[arg(short = 'O', value_name = "LEVEL", default_value = "2", value_parser = crate::parse_level)]
    pub level: mmq_passes::OptLevel,
    /// Output ONNX file (a directory when there are several inputs, and for --target trt:
    /// the TensorRT package).
    #[arg(short, long)]
    pub output: PathBuf,
    /// --target trt: the optimization profile of a symbolic dim (repeatable; defaults from
    /// the symbol's name and bounds).
    #[arg(long = "symbol", value_name = "NAME=MIN:OPT:MAX", value_parser = parse_symbol)]
    pub symbols: Vec<(String, mmq_backend_trt::Profile)>,
    /// Print the module to stderr after this pass (or `all`).
    #[arg(long, value_name = "PASS|all")]
    pub dump_after: Option<String>,
    /// Print the time and counters of each pass to stderr.
    #[arg(long)]
    pub time_passes: bool,
    /// Write the compile report here as JSON (each pass with its time, counters, notes and
    /// e-graph sizes; the accuracy of the compiled model against the original in the
    /// interpreter: per-layer SQNR and cosine, end-to-end cosine and top-1 agreement) and
    /// print the accuracy table.
    #[arg(long, value_name = "OUT.json")]
    pub report: Option<PathBuf>,
    /// Do not measure accuracy after quantizing (by default a quantizing run prints the
    /// end-to-end cosine of the main output on held-back samples).
    #[arg(long)]
    pub no_accuracy: bool,
    /// Quantize after the optimization passes: int8 (static W8A8, calibrated), int8-dynamic
    /// (INT8 weights, activations quantized at run time), int4 (weight-only blocks,
    /// MatMulNBits), fp8 (E4M3 weights; activations too with --calib), fp16 (weights widened
    /// by a Cast that ONNX Runtime folds at load), mixed (per-node schemes from
    /// --precision-map).
    #[arg(long, value_name = "SCHEME", value_parser = quant_parser())]
    pub quant: Option<Quant>,
    /// Calibration samples: a folder of .npz files, one sample each, keyed by input name.
    #[arg(long, value_name = "DIR")]
    pub calib: Option<PathBuf>,
    /// Calibrate on N random samples (the default, with 16, when --calib is not given).
    #[arg(long, value_name = "N")]
    pub calib_random: Option<usize>,
    /// INT4 block size along K (--quant int4, mixed or --auto): 32 (the default), 64 or 128.
    #[arg(long, value_name = "32|64|128")]
    pub block: Option<usize>,
    /// Asymmetric INT4 blocks (with zero points) instead of symmetric ones.
    #[arg(long)]
    pub asym: bool,
    /// MatMulNBits' accuracy_level (--quant int4): the compute type ONNX Runtime uses for
    /// the activations, 4 = int8 (the ort target's default), 1 = f32; 0 leaves it out.
    /// Default: the target's choice
    #[arg(long, value_name = "0..4")]
    pub int4_accuracy_level: Option<i64>,
    /// Run-time activation scales of --quant int8-dynamic: per-tensor (one per tensor,
    /// DynamicQuantizeLinear), per-token or per-patch (one per row, symmetric i8).
    /// Default: per-tensor.
    #[arg(long, value_name = "per-tensor|per-token|per-patch",
          value_parser = crate::parse_granularity)]
    pub granularity: Option<mmq_passes::quant::int8::ActGranularity>,
    /// Keep a node in float, with a warning, when its weight holds NaN or an infinity
    /// (--quant int8|int8-dynamic|int4|fp8), instead of failing.
    #[arg(long)]
    pub skip_non_finite: bool,
    /// SmoothQuant before --quant int8|int8-dynamic: migrate activation outlier channels
    /// into the weights with strength ALPHA in [0, 1] (0.5 is usual).
    #[arg(long, value_name = "ALPHA")]
    pub smoothquant: Option<f32>,
    /// AWQ before --quant int4: per-input-channel weight scales searched on the
    /// calibration samples (--calib DIR or --calib-random N, default 16 random).
    #[arg(long)]
    pub awq: bool,
    /// How activation ranges are chosen: minmax, ema[:MOMENTUM], percentile[:P], entropy, mse,
    /// or auto (each of minmax, percentile, entropy and mse tried on the INT8 model, the best
    /// cosine on samples kept from the ranges chosen; --quant int8 or --auto). Default: minmax.
    #[arg(long, value_name = "OBSERVER", value_parser = parse_observer)]
    pub observer: Option<mmq_compiler::ObserverChoice>,
    /// Which INT8 units stay integer: `cost` (the target's cost model keeps a unit only
    /// where it is estimated faster than float) or `all` (every eligible node).
    #[arg(long, value_enum, default_value_t = PlacementArg::Cost)]
    pub placement: PlacementArg,
    /// Per-node schemes for --quant mixed: ordered rules on node-name globs, op kinds and
    /// modality (see docs/quantization.md). Implies --quant mixed.
    #[arg(long, value_name = "MAP.toml")]
    pub precision_map: Option<PathBuf>,
    /// Set an input's modality instead of guessing it from its name, dtype and shape
    /// (repeatable; precision-map rules match on modality).
    #[arg(long, value_name = "INPUT=KIND", value_parser = crate::modality::parse_modality_arg)]
    pub modality: Vec<(String, mmq_ir::modality::Modality)>,
    /// Choose a scheme per node (int4, int8 or float for MatMul/Gemm, int8 or float for
    /// Conv): the most compressed that keeps the end-to-end cosine of the main output at or
    /// above COSINE on the calibration samples. Writes the choice as a precision map.
    #[arg(long, value_name = "COSINE", value_parser = crate::parse_cosine,
          allow_negative_numbers = true, conflicts_with_all = ["quant", "precision_map"])]
    pub auto: Option<f64>,
    /// Where --auto writes its precision map (default: the output with extension
    /// .precision.toml).
    #[arg(long, value_name = "MAP.toml", requires = "auto")]
    pub auto_map: Option<PathBuf>,
    /// Quantize the KV cache at the graph interface: every `past…` input whose `present…`
    /// output continues it becomes codes plus `<name>_scale` (int8/fp8: 512-byte blocks,
    /// one f32 scale per head and block; int4: groups of 64, binary16 scales).
    #[arg(long, value_name = "int8|fp8|int4", value_parser = crate::parse_cache_format)]
    pub kv_cache: Option<mmq_kernels::cache::CacheFormat>,
    /// Store vision feature outputs as INT4 groups of 64 with binary16 scales
    /// (`<name>` + `<name>_scale`); a graph compiled with them that reads the same name
    /// dequantizes it.
    #[arg(long, value_name = "int4", value_parser = crate::parse_cache_format)]
    pub image_cache: Option<mmq_kernels::cache::CacheFormat>,
    /// Split a merged multimodal graph (one graph from the image and token inputs to the
    /// logits) at its modality boundary into `vision_encoder` (image inputs -> image
    /// features) and `language_model` (features + token inputs -> logits); -o is then a
    /// directory. Implied by --image-cache.
    #[arg(long)]
    pub split: bool,
    /// Write a deployment package into the directory -o: the compiled models,
    /// pipeline.json (stages, bindings, cache layouts, generation settings, hashes) and,
    /// where the decoder fits onnxruntime-genai's contract, genai_config.json.
    #[arg(long)]
    pub package: bool,
    /// Generation settings for --package: a Hugging Face generation_config.json or
    /// config.json (bos/eos/pad token ids, max_position_embeddings as the context length).
    #[arg(long, value_name = "FILE")]
    pub generation_config: Option<PathBuf>,
    /// A tokenizer.json to copy into the --package (tokenizer_config.json beside it too).
    #[arg(long, value_name = "tokenizer.json")]
    pub tokenizer: Option<PathBuf>,
    /// Write every scale and zero point into one memory-mapped table (QPQR, see
    /// docs/qparams.md); in the model's directory, the ONNX Runtime model reads its scales
    /// from it, so processes serving the model share one copy.
    #[arg(long, value_name = "TABLE.qpqr")]
    pub qparams: Option<PathBuf>,
    /// The output the accuracy line, the report's end-to-end figures and --auto measure
    /// (default: the first floating-point output named like logits, an embedding or a pooled
    /// output, else the first floating-point output).
    #[arg(long, value_name = "NAME")]
    pub main_output: Option<String>,
    /// `--quiet` (a global flag): no progress bar.
    #[arg(skip)]
    pub quiet: bool,
}

/// The job the flags name, and the precision map's rendered warnings.
fn job(args: &CompileArgs) -> Result<(Job, String), Failure> {
    let usage = |e: OptionError| Failure::usage(e.to_string());
    let (map, warnings) = match &args.precision_map {
        Some(path) => {
            let (map, warnings) = mmq_compiler::precision_map::load(path)?;
            (Some(map), warnings)
        }
        None => (None, String::new()),
    };
    let precision = QuantFlags {
        quant: args.quant,
        map,
        auto: args.auto,
        observer: args.observer,
        smoothquant: args.smoothquant,
        awq: args.awq,
        block: args.block,
        asym: args.asym,
        int4_accuracy_level: args.int4_accuracy_level,
        granularity: args.granularity,
    }
    .precision()
    .map_err(usage)?;
    let calibration = match (&args.calib, args.calib_random) {
        (Some(_), Some(_)) => {
            return Err(usage(OptionError::Conflict {
                option: Opt::Calib,
                with: Opt::CalibRandom,
            }));
        }
        (Some(dir), None) => CalibrationSource::Dir(dir.clone()),
        (None, Some(count)) => CalibrationSource::Random { count, seed: 0 },
        (None, None) => CalibrationSource::Default,
    };
    let options = CompileOptions {
        target: match args.target {
            CompileTarget::Ort => TargetRef::ORT,
            CompileTarget::Trt => TargetRef::TRT,
        },
        level: args.level,
        precision,
        calibration,
        placement: match args.placement {
            PlacementArg::Cost => Placement::Cost,
            PlacementArg::All => Placement::All,
        },
        skip_non_finite: args.skip_non_finite,
        modality: args.modality.clone(),
        kv_cache: args.kv_cache,
        image_cache: args.image_cache,
        split: args.split,
        accuracy: if args.report.is_some() {
            Accuracy::Full
        } else if args.no_accuracy {
            Accuracy::Off
        } else {
            Accuracy::EndToEnd
        },
        dump_after: args.dump_after.as_deref().map(DumpAfter::parse),
        verify: cfg!(debug_assertions),
        progress: if args.quiet { None } else { progress_bar() },
        main_output: args.main_output.clone(),
        interrupt: None,
    };
    let package = PackageRequest::from_settings(
        args.package,
        args.generation_config.clone(),
        args.tokenizer.clone(),
    )
    .map_err(usage)?;
    let job = Job {
        inputs: args.inputs.clone(),
        output: args.output.clone(),
        auto_map: args.auto.map(|_| {
            args.auto_map
                .clone()
                .unwrap_or_else(|| args.output.with_extension("precision.toml"))
        }),
        options,
        precision_map: args.precision_map.clone(),
        report: args.report.clone(),
        qparams: args.qparams.clone(),
        package,
        trt: mmq_backend_trt::PackageOptions {
            profiles: args.symbols.iter().cloned().collect(),
            ..Default::default()
        },
    };
    Ok((job, warnings))
}

/// A progress bar on a terminal (calibration), nothing otherwise.
fn progress_bar() -> Option<mmq_compiler::ProgressFn> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar: Mutex<Option<ProgressBar>> = Mutex::new(None);
    Some(Arc::new(move |p: Progress<'_>| {
        let mut bar = bar.lock().unwrap_or_else(|e| e.into_inner());
        match p {
            Progress::Start { what, total } => {
                let b = match total {
                    Some(n) => ProgressBar::new(n as u64),
                    None => ProgressBar::no_length(),
                };
                if let Ok(style) = ProgressStyle::with_template(&format!(
                    "{what} {{bar:30}} {{pos}}/{{len}} samples {{elapsed}}"
                )) {
                    b.set_style(style);
                }
                if let Some(old) = bar.replace(b) {
                    old.finish_and_clear();
                }
            }
            Progress::Advance => {
                if let Some(b) = bar.as_ref() {
                    b.inc(1);
                }
            }
            Progress::Finish => {
                if let Some(b) = bar.take() {
                    b.finish_and_clear();
                }
            }
        }
    }))
}

/// Runs `compile`; returns what to print on stderr.
pub fn run(args: &CompileArgs) -> Result<String, Failure> {
    let (job, warnings) = job(args)?;
    let built = mmq_compiler::build::build(&job, &crate::warn).map_err(|e| match e {
        BuildError::Compile(CompileError::Accuracy(msg)) if args.report.is_some() => {
            Failure::user(format!("error: --report: {msg}\n"))
        }
        BuildError::Compile(CompileError::Accuracy(msg)) => Failure::user(format!(
            "error: measuring accuracy: {msg} (--no-accuracy skips it)\n"
        )),
        e => Failure::from(e),
    })?;
    Ok(warnings + &built.summary(&job, args.time_passes))
}

/// Parses `--symbol NAME=MIN:OPT:MAX`.
pub fn parse_symbol(s: &str) -> Result<(String, mmq_backend_trt::Profile), String> {
    let (name, range) = s
        .split_once('=')
        .ok_or_else(|| format!("'{s}' is not NAME=MIN:OPT:MAX"))?;
    if name.is_empty() {
        return Err(format!("'{s}': the symbol name is empty"));
    }
    Ok((
        name.to_owned(),
        range
            .parse()
            .map_err(|e: mmq_backend_trt::ProfileError| e.to_string())?,
    ))
}

/// Writes `bytes` to `path` atomically ([`mmq_ir::fsio::write_atomic`]).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), String> {
    mmq_ir::fsio::write_atomic(path, bytes)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}
