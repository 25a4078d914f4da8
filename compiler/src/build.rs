//! One compilation from files to files: [`build`] checks the options and every path of the run,
//! loads, compiles and writes. The `mmq compile` command and Python's `mmq.compile` both run
//! through it; they only turn their arguments into a [`Job`] and say what the [`Built`] holds.

use std::path::{Path, PathBuf};

use mmq_ir::Module;

use crate::export::{ExportError, PackageSettings};
use crate::load::LoadError;
use crate::run_files::{OutputError, RunFiles};
use crate::{CalibrationSource, CompileError, CompileOptions, CompileReport, Opt, OptionError};

/// What a compilation reads and writes.
#[derive(Clone, Debug, Default)]
pub struct Job {
    /// The ONNX models (several load as one module and are written into the directory
    /// `output`).
    pub inputs: Vec<PathBuf>,
    /// The output file, or directory (several models, a TensorRT package, a deployment
    /// package).
    pub output: PathBuf,
    /// What the compilation does.
    pub options: CompileOptions,
    /// The precision map the options were read from (checked as an input: never overwritten).
    pub precision_map: Option<PathBuf>,
    /// Write the compile report here as JSON.
    pub report: Option<PathBuf>,
    /// Write the precision map `--auto` chooses here.
    pub auto_map: Option<PathBuf>,
    /// Write every scale and zero point into this table (QPQR).
    pub qparams: Option<PathBuf>,
    /// Write a deployment package (`--package`).
    pub package: Option<PackageRequest>,
    /// The TensorRT package's settings (`--target trt`).
    pub trt: mmq_backend_trt::PackageOptions,
}

/// A deployment package's own inputs (`--package`).
#[derive(Clone, Debug, Default)]
pub struct PackageRequest {
    /// A Hugging Face `generation_config.json` or `config.json`.
    pub generation_config: Option<PathBuf>,
    /// A `tokenizer.json` to copy in.
    pub tokenizer: Option<PathBuf>,
}

impl PackageRequest {
    /// The request the settings name (`package`: `--package`), or `None`; the generation
    /// config and the tokenizer go into a package only.
    pub fn from_settings(
        package: bool,
        generation_config: Option<PathBuf>,
        tokenizer: Option<PathBuf>,
    ) -> Result<Option<PackageRequest>, OptionError> {
        if !package {
            for (option, given) in [
                (Opt::GenerationConfig, generation_config.is_some()),
                (Opt::Tokenizer, tokenizer.is_some()),
            ] {
                if given {
                    return Err(OptionError::Needs {
                        option,
                        does: "goes into a deployment package",
                        needs: Opt::Package,
                        value: None,
                    });
                }
            }
            return Ok(None);
        }
        Ok(Some(PackageRequest {
            generation_config,
            tokenizer,
        }))
    }
}

/// What a compilation wrote.
#[derive(Debug)]
pub struct Built {
    /// The compile report.
    pub report: CompileReport,
    /// The models, or the package.
    pub written: Written,
    /// Where the precision map `--auto` chose was written.
    pub auto_map: Option<PathBuf>,
    /// The quantization-parameter table.
    pub qparams: Option<QparamsWritten>,
    /// The decoder layers written as `GroupQueryAttention` whose past and present share one
    /// buffer (a package for ONNX Runtime).
    pub shared_kv: Option<SharedKv>,
    /// A package decoder that reads a KV cache but did not take that form: its attention
    /// layers left as they were (0 where none was fused into an attention op).
    pub unshared_kv: Option<usize>,
}

/// A decoder package's attention in the `GroupQueryAttention` form with one buffer for each
/// past and present.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedKv {
    /// Its layers.
    pub layers: usize,
    /// With `--kv-cache int8`: the samples its static per-channel INT8 scales were calibrated on.
    pub int8_samples: Option<usize>,
}

/// Tokens of a random calibration sample of the INT8 cache scales (after an empty past).
pub const KV_SCALE_TOKENS: i64 = 32;

/// The models, or the package, a compilation wrote.
#[derive(Debug)]
pub enum Written {
    /// ONNX models (one file, or one per graph in the output directory).
    Models(Vec<PathBuf>),
    /// A TensorRT package.
    Trt(mmq_backend_trt::Package),
    /// A deployment package.
    Package(Box<mmq_deploy::Written>),
}

/// A written quantization-parameter table.
#[derive(Debug)]
pub struct QparamsWritten {
    /// Its path.
    pub path: PathBuf,
    /// What it holds.
    pub table: crate::qparams::Written,
    /// Whether the written ONNX Runtime models read their scales from it.
    pub referenced: bool,
}

/// A compilation failed.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The options do not fit together.
    #[error(transparent)]
    Options(#[from] OptionError),
    /// An output cannot be written where it was asked for.
    #[error(transparent)]
    Output(#[from] OutputError),
    /// The models could not be loaded (rendered diagnostics).
    #[error("{}", .0.rendered)]
    Load(LoadError),
    /// A file the run reads is wrong (`--generation-config`).
    #[error("{option} {}: {message}", path.display(), option = .option.flag())]
    Input {
        /// The option naming it.
        option: Opt,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The compilation failed.
    #[error(transparent)]
    Compile(#[from] CompileError),
    /// A model or package could not be written.
    #[error(transparent)]
    Export(#[from] ExportError),
    /// A side output could not be written.
    #[error("{option}: {message}", option = .option.flag())]
    Write {
        /// The option naming it.
        option: Opt,
        /// What went wrong.
        message: String,
    },
}

impl BuildError {
    /// Whether the caller asked for something impossible (exit code 2 on the command line).
    pub fn is_usage(&self) -> bool {
        match self {
            BuildError::Options(_) | BuildError::Output(_) => true,
            BuildError::Load(e) => e.usage,
            BuildError::Compile(e) => e.is_usage(),
            _ => false,
        }
    }
}

impl Job {
    /// Checks what can be checked before reading anything: the options together, and the side
    /// outputs against them.
    pub fn check(&self) -> Result<(), OptionError> {
        let o = &self.options;
        o.check()?;
        if self.qparams.is_some() && !o.precision.quantizes() {
            return Err(OptionError::NothingQuantized(Opt::Qparams));
        }
        let trt = o.target == mmq_passes::TargetRef::TRT;
        if !trt && !self.trt.profiles.is_empty() {
            return Err(OptionError::Needs {
                option: Opt::Symbol,
                does: "sets TensorRT profiles",
                needs: Opt::Target,
                value: Some("trt"),
            });
        }
        if self.package.is_some() {
            if trt {
                return Err(OptionError::Unsupported {
                    option: Opt::Package,
                    why: "writes an ONNX Runtime package; --target trt writes its own package \
                          directory (docs/trt.md)",
                });
            }
            if self.qparams.is_some() {
                return Err(OptionError::Unsupported {
                    option: Opt::Qparams,
                    why: "cannot be combined with --package yet: a package's models keep their \
                          own scales",
                });
            }
        }
        Ok(())
    }

    /// Checks every path of the run before any work: each output a regular file or a new path,
    /// never an input model, the precision map, a calibration sample, a file inside the output
    /// directory or another output. `output_dir`: the output is a directory.
    fn check_paths(&self, output_dir: bool) -> Result<(), OutputError> {
        let mut files = RunFiles::new();
        for p in &self.inputs {
            files = files.input("the input model", p);
        }
        if let Some(map) = &self.precision_map {
            files = files.input("the precision map", map);
        }
        if let Some(p) = self.package.as_ref() {
            if let Some(c) = &p.generation_config {
                files = files.input("the --generation-config file", c);
            }
            if let Some(t) = &p.tokenizer {
                files = files.input("the --tokenizer file", t);
            }
        }
        if let CalibrationSource::Dir(calib) = &self.options.calibration {
            files = files.input_dir("the calibration folder", calib, "npz");
        }
        if output_dir {
            files = files.output_dir("-o", &self.output);
        } else {
            let mut data = self.output.clone().into_os_string();
            data.push(".data");
            files = files.output("-o", "the output", &self.output).output(
                "-o",
                "the output's external data",
                Path::new(&data),
            );
        }
        let auto = matches!(self.options.precision, crate::Precision::Auto { .. });
        for (flag, what, path) in [
            ("--report", "the --report file", self.report.as_ref()),
            (
                "--auto-map",
                "the --auto-map file",
                self.auto_map.as_ref().filter(|_| auto),
            ),
        ] {
            if let Some(path) = path {
                files = files.output(flag, what, path);
            }
        }
        if let Some(table) = &self.qparams {
            // The table may lie beside the models it serves (they then read their scales from it).
            files = files.output_beside("--qparams", "the --qparams file", table);
        }
        files.check()
    }

    /// The package's settings, its generation config read.
    fn package_settings(&self) -> Result<Option<PackageSettings>, BuildError> {
        let Some(request) = &self.package else {
            return Ok(None);
        };
        let generation = match &request.generation_config {
            None => mmq_deploy::GenerationConfig::default(),
            Some(path) => {
                let failed = |message: String| BuildError::Input {
                    option: Opt::GenerationConfig,
                    path: path.clone(),
                    message,
                };
                let text = mmq_ir::check_regular_file(path)
                    .and_then(|()| std::fs::read_to_string(path))
                    .map_err(|e| failed(e.to_string()))?;
                mmq_deploy::GenerationConfig::from_json(&text).map_err(|e| failed(e.to_string()))?
            }
        };
        Ok(Some(PackageSettings {
            generation,
            tokenizer: request.tokenizer.clone(),
        }))
    }
}

/// Checks `job`, loads its models (their verifier warnings go to `warn`), compiles them and
/// writes every output (each atomically).
pub fn build(job: &Job, warn: &dyn Fn(&str)) -> Result<Built, BuildError> {
    job.check()?;
    let package = job.package_settings()?;
    // Loading only reads (weights are mapped lazily); every output is checked before the work.
    let (mut module, warnings) = crate::load::load(&job.inputs)
        .and_then(|l| l.verified())
        .map_err(BuildError::Load)?;
    warn(&warnings);
    if module.entries.is_empty() {
        return Err(CompileError::NoGraph.into());
    }
    let o = &job.options;
    let trt = o.target == mmq_passes::TargetRef::TRT;
    let several = crate::writes_several_models(&module, o);
    let output_dir = several || trt || package.is_some();
    job.check_paths(output_dir)?;
    if !output_dir || trt {
        crate::export::check_output(&job.output)?;
    }
    if job.inputs.len() > 1 {
        crate::export::check_distinct_outputs(&job.inputs, &job.output)?;
    }
    // A decoder package for ONNX Runtime at -O2, with a float or INT8 KV cache: its attention
    // in the `GroupQueryAttention` form whose past and present share one buffer. An INT8 cache
    // is then that op's own (int8 codes, static per-channel scales calibrated here); a decoder
    // without the form gets `--kv-cache int8`'s blocks as any model does.
    let gqa_form = package.is_some()
        && o.target == mmq_passes::TargetRef::ORT
        && o.level == mmq_passes::OptLevel::O2
        && matches!(
            o.kv_cache,
            None | Some(mmq_kernels::cache::CacheFormat::Int8)
        );
    let float_kv;
    let options = if gqa_form && o.kv_cache.is_some() {
        float_kv = CompileOptions {
            kv_cache: None,
            ..o.clone()
        };
        &float_kv
    } else {
        o
    };
    let mut report = crate::compile(&mut module, options)?;
    let mut shared_kv = None;
    let mut unshared_kv = None;
    if gqa_form {
        let form = mmq_passes::targets::ort::gqa::Form {
            positions: package.as_ref().map_or(0, |p| {
                p.generation
                    .context_length
                    .unwrap_or(mmq_deploy::DEFAULT_CONTEXT_LENGTH) as usize
            }),
        };
        let done = mmq_passes::targets::ort::gqa::rewrite(&mut module, form)
            .map_err(CompileError::from)?;
        if done.shared {
            let int8_samples = match o.kv_cache {
                Some(_) => Some(int8_gqa_caches(&mut module, o)?),
                None => None,
            };
            shared_kv = Some(SharedKv {
                layers: done.layers,
                int8_samples,
            });
        } else {
            let roots: Vec<_> = module.entries.iter().map(|e| e.graph).collect();
            if roots
                .into_iter()
                .any(|g| mmq_passes::quant::cache::reads_kv_cache(&module, g))
            {
                unshared_kv = Some(done.kept);
            }
            report = crate::quantize_kv_cache(&mut module, o, report)?;
        }
    }
    if o.interrupt
        .as_ref()
        .is_some_and(mmq_passes::Interrupt::is_set)
    {
        return Err(CompileError::Interrupted.into());
    }
    let write = |option: Opt, path: &Path, bytes: &[u8]| {
        mmq_ir::fsio::write_atomic(path, bytes).map_err(|e| BuildError::Write {
            option,
            message: format!("cannot write {}: {e}", path.display()),
        })
    };
    let mut auto_map = None;
    if let (Some(auto), Some(path)) = (&report.auto, &job.auto_map) {
        write(Opt::AutoMap, path, auto.map.as_bytes())?;
        auto_map = Some(path.clone());
    }
    if let Some(path) = &job.report {
        write(Opt::Report, path, (report.to_json() + "\n").as_bytes())?;
    }
    let qparams = match &job.qparams {
        Some(table) => Some(write_qparams(&mut module, job, table)?),
        None => None,
    };
    let written = if trt {
        Written::Trt(crate::export::write_trt(
            &module,
            &job.inputs,
            &job.output,
            &job.trt,
        )?)
    } else if let Some(settings) = &package {
        Written::Package(Box::new(crate::export::write_package(
            &module,
            &job.inputs,
            &job.output,
            o,
            settings,
        )?))
    } else {
        let references: Vec<_> = qparams
            .as_ref()
            .map(|q| q.references.clone())
            .unwrap_or_default();
        Written::Models(crate::export::write_referencing(
            &module,
            &job.inputs,
            &job.output,
            &references,
        )?)
    };
    Ok(Built {
        report,
        shared_kv,
        unshared_kv,
        written,
        auto_map,
        qparams: qparams.map(|q| q.written),
    })
}

/// Makes the caches of the entry graphs' `GroupQueryAttention` layers INT8 with static
/// per-channel scales, calibrated on `o`'s samples (random ones: prompts of [`KV_SCALE_TOKENS`]
/// tokens after an empty past); returns how many samples.
fn int8_gqa_caches(module: &mut Module, o: &CompileOptions) -> Result<usize, CompileError> {
    use mmq_passes::targets::ort::gqa;
    let mut count = 0;
    let graphs: Vec<mmq_ir::GraphId> = module.entries.iter().map(|e| e.graph).collect();
    for g in graphs {
        let probes = gqa::cache_probes(module, g);
        if !probes.is_empty() {
            count = count.max(int8_graph_caches(module, g, &probes, o)?);
        }
    }
    Ok(count)
}

/// [`int8_gqa_caches`] of graph `g`, whose layers `probes` are.
fn int8_graph_caches(
    module: &mut Module,
    g: mmq_ir::GraphId,
    probes: &[mmq_passes::targets::ort::gqa::CacheProbe],
    o: &CompileOptions,
) -> Result<usize, CompileError> {
    use mmq_passes::quant::calibrate;
    use mmq_passes::targets::ort::gqa;
    let fail = |e: &dyn std::fmt::Display| {
        CompileError::Pass(mmq_passes::PassError::Failed {
            pass: "kv-cache".to_owned(),
            message: format!("calibrating the INT8 cache scales: {e}"),
        })
    };
    let mut values: Vec<mmq_ir::Value> = probes.iter().flat_map(|p| [p.key.0, p.value.0]).collect();
    values.sort();
    values.dedup();
    let samples: Vec<calibrate::Sample> = match &o.calibration {
        CalibrationSource::Default | CalibrationSource::Random { .. } => {
            let (count, seed) = match o.calibration {
                CalibrationSource::Random { count, seed } => (count, seed),
                _ => (crate::DEFAULT_RANDOM_SAMPLES, 0),
            };
            calibrate::random_samples_bound(module, g, count, seed, prompt_symbols(module, g))
                .map_err(|e| fail(&e))?
                .collect::<Result<_, _>>()
                .map_err(|e| fail(&e))?
        }
        source => source.collect(module, g).map_err(|e| fail(&e))?,
    };
    let count = samples.len();
    let stats = calibrate::channel_stats(module, g, &values, samples.into_iter().map(Ok), 0)
        .map_err(|e| fail(&e))?;
    let mut layers = Vec::new();
    for p in probes {
        let channels = |(v, start): (mmq_ir::Value, usize)| {
            stats
                .get(&v)
                .and_then(|s| s.abs_max.get(start..start + p.width))
        };
        let (Some(k), Some(v)) = (channels(p.key), channels(p.value)) else {
            return Err(fail(&format!(
                "no sample gave a value to layer {}",
                module.nodes[p.node].name.as_deref().unwrap_or("?")
            )));
        };
        layers.push((
            p.node,
            gqa::channel_scales(k, p.head_dim, p.rotary),
            gqa::channel_scales(v, p.head_dim, None),
        ));
    }
    gqa::quantize_caches(module, &layers);
    Ok(count)
}

/// The symbols a random calibration prompt binds: the past's length 0, the new tokens'
/// [`KV_SCALE_TOKENS`], and the mask's length (when its own symbol) their sum.
fn prompt_symbols(m: &Module, g: mmq_ir::GraphId) -> std::collections::HashMap<String, i64> {
    let mut out = std::collections::HashMap::new();
    let mut bind = |name: &str, dim: usize, value: i64| {
        let input = m.graphs[g].inputs.iter().find(|&&v| {
            m.values[v]
                .name
                .as_deref()
                .is_some_and(|n| n.contains(name))
        });
        if let Some(&v) = input
            && let Some(s) = m
                .value_type(v)
                .shape()
                .and_then(|s| s.get(dim)?.expr()?.as_sym())
        {
            out.entry(m.symbols[s].name.clone()).or_insert(value);
        }
    };
    bind("past", 2, 0);
    bind("input_ids", 1, KV_SCALE_TOKENS);
    bind("attention_mask", 1, KV_SCALE_TOKENS);
    out
}

/// A table and the references the models read it through.
struct Table {
    written: QparamsWritten,
    references: Vec<(String, mmq_backend_ort::ExternalLocation)>,
}

/// Writes the quantization-parameter table; the ONNX Runtime models read their scales from it
/// when it lies in their directory.
fn write_qparams(module: &mut Module, job: &Job, table: &Path) -> Result<Table, BuildError> {
    let failed = |message: String| BuildError::Write {
        option: Opt::Qparams,
        message,
    };
    let model_dir = if module.entries.len() > 1 {
        std::fs::create_dir_all(&job.output)
            .map_err(|e| failed(format!("cannot create {}: {e}", job.output.display())))?;
        job.output.clone()
    } else {
        match job.output.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        }
    };
    let ort = job.options.target == mmq_passes::TargetRef::ORT;
    let (written, references) =
        crate::qparams::write_table(module, table, ort.then_some(model_dir.as_path()))
            .map_err(|e| failed(e.to_string()))?;
    Ok(Table {
        written: QparamsWritten {
            path: table.to_owned(),
            table: written,
            referenced: !references.is_empty(),
        },
        references,
    })
}
