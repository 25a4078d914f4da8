//! `mmq`: compile multimodal ONNX models.
//!
//! The command line as a library: [`main_with`] runs it for the `mmq` binary and for the Python
//! package's `mmq` console command (one parser, one code path).
//!
//! The only crate that prints. Exit codes: 0 success, 1 user error (bad input, unsupported
//! construct) with a diagnostic on stderr, 2 usage error.

mod compile;
mod failure;
mod generate;
mod inspect;
mod modality;
mod opt;
mod plan_cache;
mod run;

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

use mmq_compiler::load;

use crate::failure::Failure;

#[derive(Parser)]
#[command(
    name = "mmq",
    version,
    about = "Quantize, fuse and compile multimodal ONNX models"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// The most memory one tensor may take (`16GiB`, `512MiB`, `2G`, bytes); default three
    /// quarters of physical memory. A tensor over it is an error naming the node or file.
    #[arg(long, global = true, value_name = "SIZE", value_parser = parse_size)]
    max_memory: Option<u64>,
    /// Print only warnings and errors on stderr (not the passes' notes, timings or summaries).
    #[arg(long, short, global = true)]
    quiet: bool,
}

/// `text` with every control character but newline and tab written as `\u{..}`: names in a
/// model or map (nodes, inputs, rules, files) may hold any character, and a terminal acts on
/// an ESC or BEL. Everything mmq prints as text passes through here.
fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    let control = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !text.chars().any(control) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if control(c) {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Writes `text` to stderr ([`printable`]).
fn to_stderr(text: &str) {
    let _ = std::io::stderr().write_all(printable(text).as_bytes());
}

/// What a command prints on stderr besides its errors: everything, or with `--quiet` only the
/// warnings (`warning:` lines).
fn notes(text: &str, quiet: bool) {
    if !quiet {
        to_stderr(text);
        return;
    }
    for line in text.lines().filter(|l| l.contains("warning:")) {
        to_stderr(&format!("{line}\n"));
    }
}

/// Parses a byte size: a number with an optional `K`, `M`, `G`, `T` (powers of 1024; `KiB`,
/// `KB` and `K` alike).
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size (for example 16GiB)"))?;
    let shift = match unit
        .trim()
        .to_ascii_lowercase()
        .trim_end_matches("ib")
        .trim_end_matches('b')
    {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        _ => return Err(format!("'{s}': unknown unit (K, M, G or T)")),
    };
    n.checked_mul(1u64 << shift)
        .filter(|&v| v > 0)
        .ok_or_else(|| format!("'{s}' is not a positive size that fits 64 bits"))
}

#[derive(Subcommand)]
#[allow(
    clippy::large_enum_variant,
    reason = "parsed once per run; `compile` has many flags"
)]
enum Command {
    /// Print a model's IR (`.mmir` text), a JSON summary, a DOT graph or statistics.
    Inspect {
        /// ONNX files (several load as one module with shared symbols) or one `.mmir` file.
        #[arg(required = true)]
        inputs: Vec<PathBuf>,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// Print node counts per op and weight bytes per dtype.
        #[arg(long)]
        stats: bool,
        /// Print source node names as `loc("...")` in the text format.
        #[arg(long)]
        loc: bool,
        /// Print each node's modality label (vision, text, audio, fusion, shared) as a trailing
        /// comment in the text format.
        #[arg(long)]
        labels: bool,
        /// Set an input's modality instead of guessing it from its name, dtype and shape
        /// (repeatable).
        #[arg(long, value_name = "INPUT=KIND", value_parser = modality::parse_modality_arg)]
        modality: Vec<(String, mmq_ir::modality::Modality)>,
        /// Print every constant's values in the text format (weights included), so that the
        /// dump runs by itself (`mmq run DUMP.mmir`); without it large constants print only
        /// their content hash.
        #[arg(long)]
        weights: bool,
    },
    /// Import an ONNX model, verify it, and export it again without optimization.
    Convert {
        /// The ONNX model.
        input: PathBuf,
        /// Output ONNX file (large weights go to `OUT.data` beside it).
        #[arg(short, long)]
        output: PathBuf,
        /// Where weights go: `auto` keeps external weights external and inline weights inline
        /// unless the model exceeds 2 GiB.
        #[arg(long, value_enum, default_value_t = ExternalArg::Auto)]
        external_data: ExternalArg,
        /// Flush the output to stable storage before renaming it into place.
        #[arg(long)]
        fsync: bool,
    },
    /// Run a model's first entry graph, or a deployment package's whole pipeline, in the
    /// reference interpreter.
    Run {
        /// The model: an ONNX file, a `.mmir` file (external weights next to it), or a package
        /// directory (`mmq compile ... --package`).
        model: PathBuf,
        /// An `.npz` with one array per graph input, keyed by input name.
        #[arg(long)]
        inputs: Option<PathBuf>,
        /// One input as `NAME=FILE.npy` (repeatable; replaces the same name from --inputs).
        #[arg(long, value_name = "NAME=FILE.npy")]
        input: Vec<String>,
        /// Write the outputs to this `.npz` instead of printing a summary.
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Print the time spent per op and the peak of live tensor bytes.
        #[arg(long)]
        stats: bool,
        /// Run N more times after the first and report the mean time per op of those warm
        /// runs (with --stats); the outputs are the last run's.
        #[arg(long, value_name = "N", default_value_t = 0)]
        repeat: usize,
    },
    /// Generate tokens greedily with a deployment package (`mmq compile ... --package`) in the
    /// reference interpreter: the vision encoder once on the images, then the decoder on the
    /// prompt and each new token (its KV cache fed back). Prints the new token ids.
    Generate {
        /// The package directory.
        package: PathBuf,
        /// The prompt's token ids, comma-separated.
        #[arg(long, value_delimiter = ',', required = true, value_name = "ID,ID,...")]
        input_ids: Vec<i64>,
        /// The image inputs (an `.npz` keyed by input name) of a package with a vision encoder.
        #[arg(long, value_name = "IMAGE.npz")]
        inputs: Option<PathBuf>,
        /// The most tokens to generate (fewer at an end-of-sequence token or the context length).
        #[arg(long, default_value_t = 16, value_name = "N")]
        max_new_tokens: usize,
    },
    /// Parse and verify a `.mmir` file (or an ONNX model).
    Verify {
        /// The file.
        input: PathBuf,
    },
    /// Run rule sets, then const-fold and DCE, on one model; print the result as `.mmir`.
    Opt {
        /// The model: an ONNX file or a `.mmir` file.
        input: PathBuf,
        /// Rule sets to run together (comma-separated).
        #[arg(
            long,
            value_name = "SET[,SET...]",
            value_delimiter = ',',
            required = true,
            value_parser = |s: &str| s.parse::<mmq_passes::RuleSet>().map_err(|e| e.to_string())
        )]
        rules: Vec<mmq_passes::RuleSet>,
        /// Print each rule firing and a table of counters to stderr.
        #[arg(long)]
        explain: bool,
        /// The target whose cost model and ops the rewrites use.
        #[arg(long, value_enum, default_value_t = OptTarget::Generic)]
        target: OptTarget,
        /// Write the result here (`.mmir` or `.onnx`) instead of printing it.
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Plan one 128-byte-aligned pool for the quantized KV cache of the decoders and the INT4
    /// image features of the vision encoders among MODELS: offsets, strides, scale tables, bytes
    /// per token and per image, and how many tokens fit in the budget.
    PlanCache {
        /// The ONNX models (a decoder with past…/present… inputs and outputs, a vision encoder).
        #[arg(required = true)]
        inputs: Vec<PathBuf>,
        /// The pool's size limit (16GiB, 512MiB, 2GB, or bytes).
        #[arg(long, value_name = "SIZE", value_parser = parse_size)]
        budget: u64,
        /// The KV code format.
        #[arg(long, value_name = "int8|fp8|int4", default_value = "int8", value_parser = parse_cache_format)]
        kv: mmq_kernels::cache::CacheFormat,
        /// Image slots to reserve (when a model has vision feature outputs).
        #[arg(long, default_value_t = 1)]
        images: u64,
        /// Set an input's modality instead of guessing it (repeatable).
        #[arg(long, value_name = "INPUT=KIND", value_parser = modality::parse_modality_arg)]
        modality: Vec<(String, mmq_ir::modality::Modality)>,
        /// Write the plan here as JSON.
        #[arg(short, long, value_name = "PLAN.json")]
        output: Option<PathBuf>,
    },
    /// Optimize models for a target and export them.
    Compile(compile::CompileArgs),
    /// Turn a compile report (`mmq compile --report OUT.json`) into one self-contained HTML page:
    /// per-layer SQNR bars by modality, the precision of each layer, the activation granularity
    /// and symmetry comparisons, the alignment outputs' similarity error.
    Report {
        /// The report JSON.
        report: PathBuf,
        /// The page to write.
        #[arg(short, long, value_name = "report.html")]
        output: PathBuf,
    },
    /// Read a quantization-parameter table (QPQR).
    Qparams {
        #[command(subcommand)]
        command: QparamsCommand,
    },
}

#[derive(Subcommand)]
enum QparamsCommand {
    /// List the table's tensors: scheme, code type, count, axis, group, first pair.
    Inspect {
        /// The table.
        file: PathBuf,
    },
    /// Check the table's layout, checksum and pairs (exit 1 when anything is wrong).
    Verify {
        /// The table.
        file: PathBuf,
    },
}

fn qparams(command: &QparamsCommand) -> Result<String, Failure> {
    use mmq_compiler::qparams::{QParamTable, summary};
    let fail = |e: mmq_compiler::qparams::QParamError| Failure::user(format!("error: {e}\n"));
    match command {
        QparamsCommand::Inspect { file } => {
            QParamTable::open(file).map(|t| summary(&t)).map_err(fail)
        }
        QparamsCommand::Verify { file } => {
            let t = QParamTable::open(file).map_err(fail)?;
            t.verify().map_err(fail)?;
            Ok(format!(
                "{}: ok ({} pairs, {} tensors, checksum matches)\n",
                file.display(),
                t.len(),
                t.entries().len()
            ))
        }
    }
}

/// Checks, before any work, that the output `-o` of a command that reads `inputs` can be
/// written: a regular file or a new path, and none of the inputs (a usage error otherwise).
fn check_files<'a>(
    inputs: impl IntoIterator<Item = &'a std::path::Path>,
    output: &std::path::Path,
) -> Result<(), Failure> {
    let mut files = mmq_compiler::run_files::RunFiles::new();
    for p in inputs {
        files = files.input("an input", p);
    }
    files
        .output("-o", "the output", output)
        .check()
        .map_err(|e| Failure::usage(e.to_string()))
}

fn html_report(report: &std::path::Path, output: &std::path::Path) -> Result<(), Failure> {
    let fail = |m: String| Failure::user(format!("error: {m}\n"));
    check_files([report], output)?;
    mmq_ir::check_regular_file(report).map_err(|e| fail(format!("{}: {e}", report.display())))?;
    let text =
        std::fs::read_to_string(report).map_err(|e| fail(format!("{}: {e}", report.display())))?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        fail(format!(
            "{}: not JSON: {e} (line {}, column {})",
            report.display(),
            e.line(),
            e.column()
        ))
    })?;
    let html = mmq_compiler::html::render(&json)
        .map_err(|e| fail(format!("{}: {e}", report.display())))?;
    compile::write_atomic(output, html.as_bytes()).map_err(fail)
}

fn parse_granularity(s: &str) -> Result<mmq_passes::quant::int8::ActGranularity, String> {
    s.parse().map_err(|e: mmq_ir::UnknownName| e.to_string())
}

fn parse_cache_format(s: &str) -> Result<mmq_kernels::cache::CacheFormat, String> {
    s.parse().map_err(|e: mmq_ir::UnknownName| e.to_string())
}

fn parse_level(s: &str) -> Result<mmq_passes::OptLevel, String> {
    s.parse()
        .map_err(|e: mmq_passes::ParseOptLevelError| e.to_string())
}

#[derive(Clone, Copy, ValueEnum)]
enum OptTarget {
    Ort,
    Generic,
}

/// Parses `--auto TARGET`: a cosine in `[0, 1]`.
fn parse_cosine(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(t) if (0.0..=1.0).contains(&t) => Ok(t),
        Ok(t) => Err(format!("{t} is not a cosine in [0, 1] (for example 0.99)")),
        Err(_) => Err(format!("'{s}' is not a number (for example 0.99)")),
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Json,
    Dot,
}

#[derive(Clone, Copy, ValueEnum)]
enum ExternalArg {
    Auto,
    Always,
    Never,
}

/// Runs the command line `args` (the program name first) as the `mmq` binary does, printing to
/// this process's standard output and error; returns the exit code.
pub fn main_with<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version go to stdout with exit 0; usage errors to stderr with exit 2.
            let _ = e.print();
            return u8::try_from(e.exit_code()).unwrap_or(2);
        }
    };
    let quiet = cli.quiet;
    if let Some(bytes) = cli.max_memory {
        mmq_kernels::set_memory_limit(bytes);
    }
    let result = match cli.command {
        Command::Inspect {
            inputs,
            format,
            stats,
            loc,
            labels,
            modality,
            weights,
        } => inspect::run(
            &inputs,
            format,
            &inspect::InspectOptions {
                stats,
                loc,
                labels,
                modality,
                weights,
            },
        )
        .and_then(|text| emit(&text)),
        Command::Convert {
            input,
            output,
            external_data,
            fsync,
        } => convert(&input, &output, external_data, fsync),
        Command::Verify { input } => verify(&input),
        Command::Generate {
            package,
            input_ids,
            inputs,
            max_new_tokens,
        } => generate::run(&generate::GenerateArgs {
            package,
            input_ids,
            inputs,
            max_new_tokens,
        })
        .map(|err| {
            notes(&err, quiet);
        }),
        Command::Report { report, output } => html_report(&report, &output),
        Command::Qparams { command } => qparams(&command).and_then(|text| emit(&text)),
        Command::PlanCache {
            inputs,
            budget,
            kv,
            images,
            modality,
            output,
        } => plan_cache::run(
            &inputs,
            &mmq_compiler::cache_plan::PlanOptions {
                kv_format: kv,
                images,
                budget,
                modality,
            },
            output.as_deref(),
        )
        .and_then(|text| emit(&text)),
        Command::Run {
            model,
            inputs,
            input,
            output,
            stats,
            repeat,
        } => run::run(&run::RunArgs {
            model,
            inputs,
            input,
            output,
            stats,
            repeat,
        })
        .and_then(|text| emit(&text)),
        Command::Opt {
            input,
            rules,
            explain,
            target,
            output,
        } => opt::run(&opt::OptArgs {
            input,
            rules,
            explain,
            target: match target {
                OptTarget::Ort => mmq_passes::TargetRef::ORT,
                OptTarget::Generic => mmq_passes::TargetRef::GENERIC,
            },
            output,
        })
        .and_then(|(out, err)| {
            notes(&err, quiet);
            emit(&out)
        }),
        Command::Compile(args) => {
            compile::run(&compile::CompileArgs { quiet, ..args }).map(|err| {
                notes(&err, quiet);
            })
        }
    };
    match result {
        Ok(()) => 0,
        Err(failure) => {
            to_stderr(&failure.rendered);
            failure.code
        }
    }
}

/// Prints warnings (rendered diagnostics) to stderr.
fn warn(text: &str) {
    if !text.is_empty() {
        to_stderr(text);
    }
}

fn emit(text: &str) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    // A closed pipe (`mmq inspect m.onnx | head`) is not an error worth reporting.
    match out
        .write_all(printable(text).as_bytes())
        .and_then(|()| out.flush())
    {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(Failure::user(format!(
            "error: cannot write to stdout: {e}\n"
        ))),
        _ => Ok(()),
    }
}

fn convert(
    input: &std::path::Path,
    output: &std::path::Path,
    ext: ExternalArg,
    sync: bool,
) -> Result<(), Failure> {
    check_files([input], output)?;
    let loaded = load::load(std::slice::from_ref(&input.to_path_buf()))?;
    warn(&loaded.verify()?);
    let graph = loaded.module.entries[0].graph;
    let opts = mmq_backend_ort::ExportOptions {
        external_data: match ext {
            ExternalArg::Auto => mmq_backend_ort::ExternalData::Auto,
            ExternalArg::Always => mmq_backend_ort::ExternalData::Always,
            ExternalArg::Never => mmq_backend_ort::ExternalData::Never,
        },
        sync,
        ..Default::default()
    };
    let report = mmq_backend_ort::write_model(&loaded.module, graph, output, &opts)
        .map_err(|e| Failure::user(format!("error: cannot write {}: {e}\n", output.display())))?;
    let g = &loaded.module.graphs[graph];
    let msg = format!(
        "wrote {} ({} nodes, {} inputs, {} outputs; {})\n",
        output.display(),
        g.nodes().len(),
        g.inputs.len(),
        g.outputs.len(),
        report,
    );
    to_stderr(&msg);
    Ok(())
}

fn verify(input: &std::path::Path) -> Result<(), Failure> {
    let loaded = load::load(std::slice::from_ref(&input.to_path_buf()))?;
    warn(&loaded.verify()?);
    let m = &loaded.module;
    let count = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    let nodes = m.graphs.iter().map(|(_, g)| g.nodes().len()).sum::<usize>();
    let msg = format!(
        "{}: ok ({}, {}, {})\n",
        input.display(),
        count(m.graphs.len(), "graph"),
        count(nodes, "node"),
        count(m.consts.len(), "constant"),
    );
    emit(&msg)
}
