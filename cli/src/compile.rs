//! `mmq compile`: arguments into [`CompileOptions`], [`mmq_compiler::compile`], and what to
//! print.

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use indicatif::{ProgressBar, ProgressStyle};
use mmq_compiler::{
    Accuracy, CalibrationSource, CompileOptions, CompileReport, Int4Options, Precision, Progress,
    QuantScheme, Stage, load,
};
use mmq_passes::quant::place::Placement;
use mmq_passes::{DumpAfter, TargetRef};

use mmq_compiler::run_files::RunFiles;

use crate::failure::Failure;

/// The code generation targets of `mmq compile`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CompileTarget {
    /// ONNX Runtime (CPU).
    Ort,
    /// TensorRT.
    Trt,
}

/// `--quant`: one scheme, or `mixed` with a precision map.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum QuantArg {
    /// Static W8A8 (calibrated).
    Int8,
    /// INT8 weights, activations quantized at run time.
    Int8Dynamic,
    /// Weight-only INT4 blocks (MatMulNBits).
    Int4,
    /// FP8 E4M3 weights (activations too with --calib).
    Fp8,
    /// Float16 weights widened by a Cast that ONNX Runtime folds at load.
    Fp16,
    /// Per-node schemes from --precision-map.
    Mixed,
}

impl QuantArg {
    /// The library's scheme (`None` for `mixed`).
    fn scheme(self) -> Option<QuantScheme> {
        match self {
            QuantArg::Int8 => Some(QuantScheme::Int8),
            QuantArg::Int8Dynamic => Some(QuantScheme::Int8Dynamic),
            QuantArg::Int4 => Some(QuantScheme::Int4),
            QuantArg::Fp8 => Some(QuantScheme::Fp8),
            QuantArg::Fp16 => Some(QuantScheme::Fp16),
            QuantArg::Mixed => None,
        }
    }
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
    /// Quantize after the optimization passes.
    #[arg(long, value_enum, value_name = "SCHEME")]
    pub quant: Option<QuantArg>,
    /// Calibration samples: a folder of .npz files, one sample each, keyed by input name.
    #[arg(long, value_name = "DIR")]
    pub calib: Option<PathBuf>,
    /// Calibrate on N random samples (the default, with 16, when --calib is not given).
    #[arg(long, value_name = "N")]
    pub calib_random: Option<usize>,
    /// INT4 block size along K (--quant int4): 32, 64 or 128.
    #[arg(long, value_name = "32|64|128", default_value_t = 32)]
    pub block: usize,
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
    #[arg(long, value_name = "per-tensor|per-token|per-patch", default_value = "per-tensor",
          value_parser = crate::parse_granularity)]
    pub granularity: mmq_passes::quant::int8::ActGranularity,
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
    /// cosine on samples kept from the ranges chosen; --quant int8 or --auto).
    #[arg(long, value_name = "OBSERVER", default_value = "minmax",
          value_parser = parse_observer)]
    pub observer: mmq_compiler::ObserverChoice,
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

/// The end-to-end cosine a quantized model should keep; below it the accuracy line says how to
/// get further.
const ACCURACY_GOAL: f64 = 0.99;

/// The precision plan the flags name, and the precision map's rendered warnings.
fn precision(args: &CompileArgs) -> Result<(Precision, String), Failure> {
    if let Some(cosine) = args.auto {
        return Ok((Precision::Auto { cosine }, String::new()));
    }
    match (args.quant, &args.precision_map) {
        (None, None) => Ok((Precision::Float, String::new())),
        (Some(QuantArg::Mixed), None) => Err(Failure::usage(
            "--quant mixed needs --precision-map MAP.toml".to_owned(),
        )),
        (Some(q), Some(_)) if q != QuantArg::Mixed => Err(Failure::usage(format!(
            "--precision-map needs --quant mixed, not --quant {}",
            q.scheme().map_or("mixed", QuantScheme::name)
        ))),
        (_, Some(path)) => {
            let (map, warnings) = mmq_compiler::precision_map::load(path)?;
            Ok((Precision::Map(Box::new(map)), warnings))
        }
        (Some(q), None) => Ok((
            q.scheme().map_or(Precision::Float, Precision::Scheme),
            String::new(),
        )),
    }
}

/// The options the flags name.
fn options(args: &CompileArgs, precision: Precision) -> Result<CompileOptions, Failure> {
    let target = match args.target {
        CompileTarget::Ort => TargetRef::ORT,
        CompileTarget::Trt => TargetRef::TRT,
    };
    let calibration = match (&args.calib, args.calib_random) {
        (Some(_), Some(_)) => {
            return Err(Failure::usage(
                "--calib and --calib-random cannot be used together".into(),
            ));
        }
        (Some(dir), None) => CalibrationSource::Dir(dir.clone()),
        (None, Some(count)) => CalibrationSource::Random { count, seed: 0 },
        (None, None) => CalibrationSource::Default,
    };
    Ok(CompileOptions {
        target,
        level: args.level,
        precision,
        calibration,
        observer: args.observer,
        placement: match args.placement {
            PlacementArg::Cost => Placement::Cost,
            PlacementArg::All => Placement::All,
        },
        smoothquant: args.smoothquant,
        awq: args.awq,
        int4: Int4Options {
            block: args.block,
            symmetric: !args.asym,
            accuracy_level: args.int4_accuracy_level,
        },
        granularity: args.granularity,
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
    })
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

/// `--package`'s settings (read before any work), or `None` without `--package`.
fn package_settings(
    args: &CompileArgs,
) -> Result<Option<mmq_compiler::export::PackageSettings>, Failure> {
    if !args.package {
        for (flag, given) in [
            ("--generation-config", args.generation_config.is_some()),
            ("--tokenizer", args.tokenizer.is_some()),
        ] {
            if given {
                return Err(Failure::usage(format!(
                    "{flag} goes into a deployment package; it needs --package"
                )));
            }
        }
        return Ok(None);
    }
    if args.target == CompileTarget::Trt {
        return Err(Failure::usage(
            "--package writes an ONNX Runtime package; --target trt writes its own package \
             directory (docs/trt.md)"
                .to_owned(),
        ));
    }
    if args.qparams.is_some() {
        return Err(Failure::usage(
            "--qparams cannot be combined with --package yet: a package's models keep their \
             own scales"
                .to_owned(),
        ));
    }
    let generation = match &args.generation_config {
        None => mmq_compiler::GenerationConfig::default(),
        Some(path) => {
            let read = mmq_ir::check_regular_file(path)
                .and_then(|()| std::fs::read_to_string(path))
                .map_err(|e| Failure::user(format!("error: {}: {e}\n", path.display())))?;
            mmq_compiler::GenerationConfig::from_json(&read).map_err(|e| {
                Failure::user(format!(
                    "error: --generation-config {}: {e}\n",
                    path.display()
                ))
            })?
        }
    };
    Ok(Some(mmq_compiler::export::PackageSettings {
        generation,
        tokenizer: args.tokenizer.clone(),
    }))
}

/// Runs `compile`; returns what to print on stderr.
pub fn run(args: &CompileArgs) -> Result<String, Failure> {
    let (precision, warnings) = precision(args)?;
    let options = options(args, precision)?;
    options.check().map_err(Failure::usage)?;
    if args.qparams.is_some() && !options.precision.quantizes() {
        return Err(Failure::usage(
            "--qparams: nothing is quantized (no --quant, --precision-map or --auto), so the \
             table would be empty; add --quant int8 (or another scheme), or leave it out"
                .to_owned(),
        ));
    }
    if args.target != CompileTarget::Trt && !args.symbols.is_empty() {
        return Err(Failure::usage(
            "--symbol sets TensorRT profiles; it needs --target trt".to_owned(),
        ));
    }
    let package = package_settings(args)?;
    // Loading only reads (weights are mapped lazily); every output is checked before the work.
    let (mut module, load_warnings) = load::load(&args.inputs)?.verified()?;
    crate::warn(&load_warnings);
    if module.entries.is_empty() {
        return Err(Failure::user("error: the module has no graph\n".to_owned()));
    }
    let several = mmq_compiler::writes_several_models(&module, &options);
    let output_dir = several || args.target == CompileTarget::Trt || args.package;
    check_side_outputs(args, output_dir)?;
    if !output_dir || args.target == CompileTarget::Trt {
        mmq_compiler::export::check_output(&args.output)?;
    }
    if args.inputs.len() > 1 {
        mmq_compiler::export::check_distinct_outputs(&args.inputs, &args.output)?;
    }
    let mut stderr = warnings;
    let report = mmq_compiler::compile(&mut module, &options).map_err(|e| match e {
        mmq_compiler::CompileError::Accuracy(msg) if args.report.is_some() => {
            Failure::user(format!("error: --report: {msg}\n"))
        }
        mmq_compiler::CompileError::Accuracy(msg) => Failure::user(format!(
            "error: measuring accuracy: {msg} (--no-accuracy skips it)\n"
        )),
        e => Failure::from(e),
    })?;

    for pass in &report.passes {
        if let Some(dump) = &pass.dump {
            let _ = writeln!(stderr, "// ----- after {} -----", pass.name);
            stderr.push_str(dump);
        }
    }
    if args.time_passes {
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
    if let Some(auto) = &report.auto {
        let map = args
            .auto_map
            .clone()
            .unwrap_or_else(|| args.output.with_extension("precision.toml"));
        write_atomic(&map, auto.map.as_bytes())
            .map_err(|e| Failure::user(format!("error: --auto-map: {e}\n")))?;
        let _ = writeln!(stderr, "auto: wrote precision map {}", map.display());
    }
    let minmax = args.observer
        == mmq_compiler::ObserverChoice::Fixed(mmq_passes::quant::calibrate::Observer::MinMax);
    let int8 = args.quant == Some(QuantArg::Int8) || args.auto.is_some();
    stderr.push_str(&accuracy_text(
        &report,
        args.report.is_some(),
        args.auto,
        args.calib.is_some(),
        minmax && int8,
    ));
    if let Some(path) = &args.report {
        write_atomic(path, (report.to_json() + "\n").as_bytes())
            .map_err(|e| Failure::user(format!("error: --report: {e}\n")))?;
    }
    let references = match &args.qparams {
        Some(table) => write_qparams(&mut module, args, table, &mut stderr)?,
        None => Vec::new(),
    };
    if args.target == CompileTarget::Trt {
        let options = mmq_backend_trt::PackageOptions {
            profiles: args.symbols.iter().cloned().collect(),
            ..Default::default()
        };
        let package =
            mmq_compiler::export::write_trt(&module, &args.inputs, &args.output, &options)?;
        let names: Vec<String> = package
            .files
            .iter()
            .map(|f| {
                f.strip_prefix(&args.output)
                    .unwrap_or(f)
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        let _ = writeln!(
            stderr,
            "trt: wrote {}: {}",
            args.output.display(),
            names.join(", ")
        );
        for (name, p) in &package.profiles {
            let _ = writeln!(
                stderr,
                "trt: profile {name} = {}:{}:{}",
                p.min, p.opt, p.max
            );
        }
        for note in &package.notes {
            let _ = writeln!(stderr, "warning: trt: {note}");
        }
        if !package.findings.is_empty() {
            let _ = writeln!(
                stderr,
                "warning: {} node(s) TensorRT's parser or quantization rules will refuse (also in \
                 manifest.json):",
                package.findings.len()
            );
            for f in &package.findings {
                let _ = writeln!(stderr, "  {f}");
            }
        }
    } else if let Some(settings) = &package {
        let written = mmq_compiler::export::write_package(
            &module,
            &args.inputs,
            &args.output,
            &options,
            settings,
        )?;
        stderr.push_str(&package_text(&args.output, &written));
    } else {
        mmq_compiler::export::write_referencing(&module, &args.inputs, &args.output, &references)?;
    }
    Ok(stderr)
}

/// What a written package holds, for stderr.
fn package_text(dir: &Path, written: &mmq_deploy::Written) -> String {
    let mut s = String::new();
    let names: Vec<String> = written
        .files
        .iter()
        .map(|f| {
            f.strip_prefix(dir)
                .unwrap_or(f)
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    let _ = writeln!(s, "package: wrote {}: {}", dir.display(), names.join(", "));
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

/// `--qparams TABLE`: writes the table; returns the references that make the exported ONNX
/// Runtime model read its scales from it (when it lies in the model's directory).
fn write_qparams(
    module: &mut mmq_ir::Module,
    args: &CompileArgs,
    table: &Path,
    stderr: &mut String,
) -> Result<Vec<(String, mmq_backend_ort::ExternalLocation)>, Failure> {
    let model_dir = if module.entries.len() > 1 {
        std::fs::create_dir_all(&args.output).map_err(|e| {
            Failure::user(format!(
                "error: cannot create {}: {e}
",
                args.output.display()
            ))
        })?;
        args.output.clone()
    } else {
        match args.output.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        }
    };
    let ort = args.target == CompileTarget::Ort;
    let (written, references) =
        mmq_compiler::qparams::write_table(module, table, ort.then_some(model_dir.as_path()))
            .map_err(|e| Failure::user(format!("error: --qparams: {e}\n")))?;
    let pairs: u64 = written.entries.iter().map(|e| u64::from(e.count)).sum();
    let _ = writeln!(
        stderr,
        "qparams: wrote {}: {pairs} scale/zero-point pairs of {} tensors, {} bytes",
        table.display(),
        written.entries.len(),
        written.bytes
    );
    let _ = writeln!(
        stderr,
        "qparams: {}",
        if !references.is_empty() {
            "the model reads its scales from the table (external data)"
        } else if ort {
            "the table is not in the model's directory: the model keeps its own scales"
        } else {
            "the TensorRT model keeps its own scales"
        }
    );
    Ok(references)
}

/// Parses `--symbol NAME=MIN:OPT:MAX`.
pub fn parse_symbol(s: &str) -> Result<(String, mmq_backend_trt::Profile), String> {
    let (name, range) = s
        .split_once('=')
        .ok_or_else(|| format!("'{s}' is not NAME=MIN:OPT:MAX"))?;
    if name.is_empty() {
        return Err(format!("'{s}': the symbol name is empty"));
    }
    Ok((name.to_owned(), range.parse()?))
}

/// Checks every output of the run (the model, or the output directory when `output_dir`,
/// `--report`, `--auto-map`, `--qparams`) before any work: a regular file or a new path, never an input model, the
/// precision map, a calibration sample, a file inside the output directory (several models, a
/// TensorRT package) or another output.
fn check_side_outputs(args: &CompileArgs, output_dir: bool) -> Result<(), Failure> {
    let mut files = RunFiles::new();
    for p in &args.inputs {
        files = files.input("the input model", p);
    }
    if let Some(map) = &args.precision_map {
        files = files.input("the precision map", map);
    }
    if let Some(p) = &args.generation_config {
        files = files.input("the --generation-config file", p);
    }
    if let Some(p) = &args.tokenizer {
        files = files.input("the --tokenizer file", p);
    }
    if let Some(calib) = &args.calib {
        files = files.input_dir("the calibration folder", calib, "npz");
    }
    if output_dir {
        files = files.output_dir("-o", &args.output);
    } else {
        let mut data = args.output.clone().into_os_string();
        data.push(".data");
        files = files.output("-o", "the output", &args.output).output(
            "-o",
            "the output's external data",
            Path::new(&data),
        );
    }
    let auto_map = args.auto.map(|_| {
        args.auto_map
            .clone()
            .unwrap_or_else(|| args.output.with_extension("precision.toml"))
    });
    for (flag, what, path) in [
        ("--report", "the --report file", args.report.as_ref()),
        ("--auto-map", "the --auto-map file", auto_map.as_ref()),
    ] {
        if let Some(path) = path {
            files = files.output(flag, what, path);
        }
    }
    if let Some(table) = &args.qparams {
        // The table may lie beside the models it serves (they then read their scales from it).
        files = files.output_beside("--qparams", "the --qparams file", table);
    }
    files.check().map_err(|e| Failure::usage(e.to_string()))
}

/// The accuracy table (`--report`) or line (a quantizing run) of `report`; `auto` is the
/// `--auto` target the run was given, so the hint below the goal never names the same run;
/// `calibrated_on` says the samples were a `--calib` folder, which also calibrated the model
/// (random samples are drawn afresh for the figures).
fn accuracy_text(
    report: &CompileReport,
    full: bool,
    auto: Option<f64>,
    calibrated_on: bool,
    minmax_int8: bool,
) -> String {
    match &report.accuracy {
        None => String::new(),
        Some(mmq_compiler::AccuracyReport::Full(r)) if full => {
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

/// Writes `bytes` to `path` atomically ([`mmq_ir::fsio::write_atomic`]).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), String> {
    mmq_ir::fsio::write_atomic(path, bytes)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
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
