//! The native module of the `mmq` Python package (`mmq._mmq`). The Python layer (`mmq/`)
//! turns models, NumPy arrays and iterables into paths and `.npy` bytes; this module loads,
//! compiles, runs and inspects through `mmq-compiler`, with the GIL released while it works.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use mmq_compiler::build::{BuildError, Job, PackageRequest};
use mmq_compiler::{
    Accuracy, CalibrationSource, CompileOptions, Opt, OptionError, Progress, QuantFlags, Spelling,
};
use mmq_ir::Module;
use mmq_ir::modality::Modality;
use mmq_kernels::{Interpreter, RtValue};
use mmq_passes::quant::calibrate::Sample;
use mmq_passes::quant::place::Placement;
use mmq_passes::{OptLevel, TargetRef};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use serde::Deserialize;

create_exception!(
    _mmq,
    MmqError,
    PyException,
    "An mmq error; its message is the rendered diagnostic (what went wrong and where)."
);

/// Named arrays as `.npy` bytes (one sample, or a model's inputs).
type Arrays = Vec<(String, Vec<u8>)>;

/// An output: its name, its arrays as `.npy` bytes, whether it is a sequence.
type Output<B> = (String, Vec<B>, bool);

fn err(message: impl std::fmt::Display) -> PyErr {
    MmqError::new_err(message.to_string().trim_end().to_owned())
}

/// The keyword arguments of `mmq.compile`, as the Python layer passes them (JSON).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Options {
    target: String,
    level: u8,
    quant: Option<String>,
    precision_map: Option<String>,
    precision_map_text: Option<String>,
    calibration_dir: Option<PathBuf>,
    calibration_random: Option<usize>,
    observer: Option<String>,
    placement: String,
    smoothquant: Option<f32>,
    awq: bool,
    block: Option<usize>,
    asym: bool,
    #[serde(default)]
    int4_accuracy_level: Option<i64>,
    modality: HashMap<String, String>,
    auto: Option<f64>,
    accuracy: String,
    /// TensorRT profiles: symbol name to `MIN:OPT:MAX`.
    #[serde(default)]
    symbols: HashMap<String, String>,
    /// `--kv-cache`.
    #[serde(default)]
    kv_cache: Option<String>,
    /// `--image-cache`.
    #[serde(default)]
    image_cache: Option<String>,
    /// `--split`.
    #[serde(default)]
    split: bool,
    /// `--granularity`.
    #[serde(default)]
    granularity: Option<String>,
    /// `--skip-non-finite`.
    #[serde(default)]
    skip_non_finite: bool,
    /// `--main-output`.
    #[serde(default)]
    main_output: Option<String>,
    /// `--package`.
    #[serde(default)]
    package: bool,
    /// `--generation-config`.
    #[serde(default)]
    generation_config: Option<PathBuf>,
    /// `--tokenizer`.
    #[serde(default)]
    tokenizer: Option<PathBuf>,
}

/// How the Python keywords are written in messages: `quant="int8"`.
struct Keywords;

impl Spelling for Keywords {
    fn option(&self, o: Opt) -> String {
        match o {
            Opt::Calib | Opt::CalibRandom => "calibration",
            Opt::Symbol => "symbols",
            o => return o.flag().trim_start_matches('-').replace('-', "_"),
        }
        .to_owned()
    }

    fn setting(&self, o: Opt, value: &str) -> String {
        format!("{}={}", self.option(o), self.value(value))
    }

    fn value(&self, value: &str) -> String {
        if value.parse::<f64>().is_ok() {
            value.to_owned()
        } else {
            format!("{value:?}")
        }
    }
}

/// An option error in the keywords' words.
fn option_err(e: OptionError) -> PyErr {
    err(e.message(&Keywords))
}

/// The job the Python keywords name, writing to `output`, and the precision map's warnings;
/// `samples` streams the calibration samples given as arrays (each a list of name and `.npy`
/// bytes).
fn job(
    o: Options,
    inputs: Vec<PathBuf>,
    output: PathBuf,
    samples: Option<SampleIter>,
) -> PyResult<(Job, String)> {
    let target = match o.target.as_str() {
        "ort" | "trt" => TargetRef::by_name(&o.target).ok_or_else(|| err("no such target"))?,
        t => {
            return Err(err(format!(
                "unknown target '{t}' (expected \"ort\" or \"trt\")"
            )));
        }
    };
    let level: OptLevel = o.level.to_string().parse().map_err(err)?;
    let loaded = match (&o.precision_map, &o.precision_map_text) {
        (Some(path), _) => Some(mmq_compiler::precision_map::load(path.as_ref())),
        (None, Some(text)) => Some(mmq_compiler::precision_map::parse(text, "precision_map")),
        (None, None) => None,
    };
    let (map, warnings) = match loaded.transpose().map_err(|e| err(e.rendered))? {
        Some((map, warnings)) => (Some(map), warnings),
        None => (None, String::new()),
    };
    let precision = QuantFlags {
        quant: o
            .quant
            .as_deref()
            .map(str::parse)
            .transpose()
            .map_err(err)?,
        map,
        auto: o.auto,
        observer: o
            .observer
            .as_deref()
            .map(str::parse)
            .transpose()
            .map_err(err)?,
        smoothquant: o.smoothquant,
        awq: o.awq,
        block: o.block,
        asym: o.asym,
        int4_accuracy_level: o.int4_accuracy_level,
        granularity: o
            .granularity
            .as_deref()
            .map(str::parse)
            .transpose()
            .map_err(err)?,
    }
    .precision()
    .map_err(option_err)?;
    let calibration = match (o.calibration_dir, o.calibration_random, samples) {
        (Some(dir), None, None) => CalibrationSource::Dir(dir),
        (None, Some(count), None) => CalibrationSource::Random { count, seed: 0 },
        (None, None, Some(samples)) => CalibrationSource::stream(samples),
        (None, None, None) => CalibrationSource::Default,
        _ => {
            return Err(err(
                "give calibration as one of: samples, a directory, or a count",
            ));
        }
    };
    let modality = o
        .modality
        .into_iter()
        .map(|(name, kind)| match kind.parse::<Modality>() {
            Ok(m) => Ok((name, m)),
            Err(e) => Err(err(format!("modality of input '{name}': {e}"))),
        })
        .collect::<PyResult<Vec<_>>>()?;
    let profiles = o
        .symbols
        .iter()
        .map(|(name, range)| {
            range
                .parse::<mmq_backend_trt::Profile>()
                .map(|p| (name.clone(), p))
                .map_err(|e| err(format!("symbols[{name:?}]: {e}")))
        })
        .collect::<PyResult<_>>()?;
    let options = CompileOptions {
        target,
        level,
        precision,
        calibration,
        placement: match o.placement.as_str() {
            "cost" => Placement::Cost,
            "all" => Placement::All,
            p => {
                return Err(err(format!(
                    "unknown placement '{p}' (expected cost or all)"
                )));
            }
        },
        skip_non_finite: o.skip_non_finite,
        modality,
        kv_cache: o
            .kv_cache
            .as_deref()
            .map(str::parse)
            .transpose()
            .map_err(err)?,
        image_cache: o
            .image_cache
            .as_deref()
            .map(str::parse)
            .transpose()
            .map_err(err)?,
        split: o.split,
        accuracy: match o.accuracy.as_str() {
            "off" => Accuracy::Off,
            "end_to_end" => Accuracy::EndToEnd,
            "full" => Accuracy::Full,
            a => return Err(err(format!("unknown accuracy '{a}'"))),
        },
        dump_after: None,
        verify: cfg!(debug_assertions),
        progress: None,
        main_output: o.main_output,
        interrupt: None,
    };
    let package = PackageRequest::from_settings(o.package, o.generation_config, o.tokenizer)
        .map_err(option_err)?;
    let job = Job {
        inputs,
        output,
        options,
        package,
        precision_map: o.precision_map.map(PathBuf::from),
        trt: mmq_backend_trt::PackageOptions {
            profiles,
            ..Default::default()
        },
        ..Job::default()
    };
    Ok((job, warnings))
}

fn decode_sample(arrays: Arrays) -> Result<Sample, String> {
    arrays
        .into_iter()
        .map(|(name, bytes)| {
            mmq_kernels::io::npy_from_bytes(&bytes)
                .map(|t| (name.clone(), RtValue::from(t)))
                .map_err(|e| format!("array '{name}': {e}"))
        })
        .collect()
}

/// Calibration samples pulled from a Python iterator one at a time (with the GIL held for each
/// pull), so an endless iterator is read only as far as calibration goes. An exception the
/// iterator raises ends the stream and is kept in `raised`, to be raised as it was.
struct SampleIter {
    iter: Py<PyAny>,
    raised: Arc<std::sync::Mutex<Option<PyErr>>>,
}

impl Iterator for SampleIter {
    type Item = Result<Sample, String>;

    /// A failing sample's message; the stream adds which sample it was.
    fn next(&mut self) -> Option<Self::Item> {
        let arrays = Python::with_gil(|py| -> Result<Option<Arrays>, PyErr> {
            let next = self.iter.bind(py).call_method0("__next__");
            match next {
                Ok(item) => item.extract::<Arrays>().map(Some),
                Err(e) if e.is_instance_of::<pyo3::exceptions::PyStopIteration>(py) => Ok(None),
                Err(e) => Err(e),
            }
        });
        match arrays {
            Ok(None) => None,
            Ok(Some(arrays)) => Some(decode_sample(arrays)),
            Err(e) => {
                let message = e.to_string();
                *self.raised.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                Some(Err(message))
            }
        }
    }
}

/// Runs `work` on a thread of its own while this thread, holding the GIL between short sleeps,
/// lets Python handle signals: Ctrl-C sets `stop` (the work stops at its next check and writes
/// nothing) and is raised as `KeyboardInterrupt` once the work has returned.
fn interruptible<T: Send>(
    py: Python<'_>,
    stop: &mmq_passes::Interrupt,
    work: impl FnOnce() -> PyResult<T> + Send,
) -> PyResult<T> {
    std::thread::scope(|scope| {
        let handle = scope.spawn(work);
        let mut signal: Option<PyErr> = None;
        while !handle.is_finished() {
            py.allow_threads(|| std::thread::sleep(std::time::Duration::from_millis(20)));
            if signal.is_none()
                && let Err(e) = py.check_signals()
            {
                stop.set();
                signal = Some(e);
            }
        }
        let out = py.allow_threads(|| handle.join());
        let out = out.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        match signal {
            Some(e) => Err(e),
            None => out,
        }
    })
}

/// Calls the Python progress callback `(event, total)`.
fn progress_fn(callback: Py<PyAny>) -> mmq_compiler::ProgressFn {
    Arc::new(move |p: Progress<'_>| {
        Python::with_gil(|py| {
            let result = match p {
                Progress::Start { what, total } => callback.call1(py, (what, total)),
                Progress::Advance => callback.call1(py, ("advance", None::<usize>)),
                Progress::Finish => callback.call1(py, ("finish", None::<usize>)),
            };
            // A failing progress display must not fail the compilation.
            if let Err(e) = result {
                e.write_unraisable(py, None);
            }
        });
    })
}

/// Issues `text` (rendered diagnostics) as one Python `UserWarning`.
fn warn(text: &str) {
    if text.is_empty() {
        return;
    }
    Python::with_gil(|py| {
        let category = py.get_type::<pyo3::exceptions::PyUserWarning>();
        if let Ok(msg) = std::ffi::CString::new(text.trim_end()) {
            let _ = PyErr::warn(py, &category, &msg, 1);
        }
    });
}

/// Compiles the models at `inputs` with `options` (JSON) and writes the result to `output`;
/// returns the compile report (JSON) and the precision map's warnings. `samples` is an
/// iterator of calibration samples (each a list of name and `.npy` bytes), read as calibration
/// goes. Ctrl-C stops the compilation, writes nothing and raises `KeyboardInterrupt`.
#[pyfunction]
#[pyo3(signature = (inputs, output, options_json, samples=None, progress=None))]
fn compile(
    py: Python<'_>,
    inputs: Vec<PathBuf>,
    output: PathBuf,
    options_json: &str,
    samples: Option<Py<PyAny>>,
    progress: Option<Py<PyAny>>,
) -> PyResult<(String, String)> {
    let o: Options = serde_json::from_str(options_json).map_err(err)?;
    let raised = Arc::new(std::sync::Mutex::new(None));
    let samples = samples.map(|iter| SampleIter {
        iter,
        raised: Arc::clone(&raised),
    });
    let (mut job, warnings) = job(o, inputs, output, samples)?;
    job.options.progress = progress.map(progress_fn);
    job.check().map_err(option_err)?;
    let stop = mmq_passes::Interrupt::new();
    job.options.interrupt = Some(stop.clone());
    let result = interruptible(py, &stop, || {
        let built = mmq_compiler::build::build(&job, &warn).map_err(|e| match e {
            BuildError::Options(e)
            | BuildError::Compile(mmq_compiler::CompileError::Options(e)) => option_err(e),
            BuildError::Load(e) => err(e.rendered),
            e => err(e),
        })?;
        let mut warnings = warnings;
        if let mmq_compiler::build::Written::Trt(package) = &built.written {
            for note in &package.notes {
                warnings.push_str(&format!("warning: trt: {note}\n"));
            }
            for f in &package.findings {
                warnings.push_str(&format!("warning: TensorRT will refuse {f}\n"));
            }
        }
        Ok((built.report.to_json(), warnings))
    });
    // An exception of the samples' iterator is raised as it was (a TypeError of a sample stays
    // a TypeError).
    if result.is_err()
        && let Some(e) = raised.lock().unwrap_or_else(|e| e.into_inner()).take()
    {
        return Err(e);
    }
    result
}

/// A loaded model.
#[pyclass(frozen, module = "mmq._mmq")]
struct Model {
    module: Module,
}

#[pymethods]
impl Model {
    /// The module as `.mmir` text (`format="text"`) or a JSON summary (`format="json"`).
    #[pyo3(signature = (format = "text"))]
    fn inspect(&self, format: &str) -> PyResult<String> {
        match format {
            "text" => Ok(mmq_ir::text::print(&self.module)),
            "json" => Ok(
                serde_json::to_string_pretty(&mmq_compiler::inspect::summary_json(&self.module))
                    .map_err(err)?,
            ),
            f => Err(err(format!(
                "unknown format '{f}' (expected \"text\" or \"json\")"
            ))),
        }
    }

    /// The input names of the first entry graph.
    #[getter]
    fn inputs(&self) -> Vec<String> {
        self.names(|g| &g.inputs)
    }

    /// The output names of the first entry graph.
    #[getter]
    fn outputs(&self) -> Vec<String> {
        self.names(|g| &g.outputs)
    }
}

impl Model {
    fn names(&self, of: impl Fn(&mmq_ir::GraphData) -> &Vec<mmq_ir::Value>) -> Vec<String> {
        let m = &self.module;
        m.entries
            .first()
            .map(|e| {
                of(&m.graphs[e.graph])
                    .iter()
                    .map(|&v| m.values[v].name.clone().unwrap_or_default())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Loads and verifies the models at `paths` (ONNX files, or one `.mmir` file).
#[pyfunction(name = "load")]
fn load_model(py: Python<'_>, paths: Vec<PathBuf>) -> PyResult<Model> {
    let (module, warnings) = py
        .allow_threads(|| mmq_compiler::load::load_with_weights(&paths).and_then(|l| l.verified()))
        .map_err(|e| err(e.rendered))?;
    warn(&warnings);
    Ok(Model { module })
}

/// Runs the model's first entry graph in the reference interpreter on `inputs` (name and
/// `.npy` bytes); returns each output as a name and a list of `.npy` arrays (one for a tensor,
/// one per element for a sequence, none for an empty optional).
#[pyfunction]
fn run<'py>(
    py: Python<'py>,
    model: &Model,
    inputs: Arrays,
) -> PyResult<Vec<Output<Bound<'py, PyBytes>>>> {
    let outputs = py.allow_threads(|| -> PyResult<Vec<Output<Vec<u8>>>> {
        let m = &model.module;
        let entry = m
            .entries
            .first()
            .ok_or_else(|| err("the module has no entry graph"))?;
        let feeds = decode_sample(inputs).map_err(err)?;
        let outs = Interpreter::new(m).run(entry.graph, &feeds).map_err(err)?;
        let npy = |t: &mmq_kernels::Tensor, name: &str| {
            mmq_kernels::io::npy_bytes(t).map_err(|e| err(format!("output '{name}': {e}")))
        };
        outs.into_iter()
            .map(|(name, value)| {
                Ok(match &value {
                    RtValue::Tensor(t) => (name.clone(), vec![npy(t, &name)?], false),
                    RtValue::Sequence(ts) => (
                        name.clone(),
                        ts.iter().map(|t| npy(t, &name)).collect::<PyResult<_>>()?,
                        true,
                    ),
                    RtValue::Optional(None) => (name.clone(), Vec::new(), false),
                    RtValue::Optional(Some(v)) => match &**v {
                        RtValue::Tensor(t) => (name.clone(), vec![npy(t, &name)?], false),
                        _ => {
                            return Err(err(format!(
                                "output '{name}': an optional sequence is not supported"
                            )));
                        }
                    },
                })
            })
            .collect()
    })?;
    Ok(outputs
        .into_iter()
        .map(|(n, arrays, seq)| {
            (
                n,
                arrays.into_iter().map(|b| PyBytes::new(py, &b)).collect(),
                seq,
            )
        })
        .collect())
}

/// Runs the `mmq` command line with `args` (the program name first), as the `mmq` binary
/// does (the same parser and code); returns its exit code. The GIL is released meanwhile.
#[pyfunction]
fn cli_main(py: Python<'_>, args: Vec<String>) -> u8 {
    py.allow_threads(|| mmq_cli::main_with(args))
}

/// The native module.
#[pymodule]
fn _mmq(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("MmqError", m.py().get_type::<MmqError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<Model>()?;
    m.add_function(wrap_pyfunction!(compile, m)?)?;
    m.add_function(wrap_pyfunction!(load_model, m)?)?;
    m.add_function(wrap_pyfunction!(run, m)?)?;
    m.add_function(wrap_pyfunction!(cli_main, m)?)?;
    Ok(())
}
