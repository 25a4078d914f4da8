//! `mmq compile --quant int8|int8-dynamic`: calibration samples, the observer, the INT8 pass.

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressStyle};
use mmq_ir::Module;
use mmq_passes::PassOptions;
use mmq_passes::quant::calibrate::{self, CalibError, Observer, Ranges, Sample};
use mmq_passes::quant::int8::{Int8Pass, Int8Scheme};
use mmq_passes::quant::place::Placement;

use crate::diagnostics::Failure;

/// Samples drawn by `--calib-random` when neither `--calib` nor `--calib-random` is given.
pub const DEFAULT_RANDOM_SAMPLES: usize = 16;

/// Where calibration samples come from and how ranges are observed.
pub struct CalibArgs {
    /// `--calib DIR`.
    pub dir: Option<PathBuf>,
    /// `--calib-random N`.
    pub random: Option<usize>,
    /// `--observer`.
    pub observer: String,
    /// `--placement`: which INT8 units stay integer.
    pub placement: Placement,
}

impl CalibArgs {
    /// The observer, after checking that the sample options fit together.
    pub fn observer(&self) -> Result<Observer, Failure> {
        let observer = self
            .observer
            .parse()
            .map_err(|e: CalibError| Failure::usage(format!("--observer: {e}")))?;
        if self.dir.is_some() && self.random.is_some() {
            return Err(Failure::usage(
                "--calib and --calib-random cannot be used together".into(),
            ));
        }
        if self.random == Some(0) {
            return Err(Failure::usage(
                "--calib-random: need at least one sample".into(),
            ));
        }
        Ok(observer)
    }
}

/// Quantizes `module` with `scheme` (`int8` or `int8-dynamic`); returns what to print.
pub fn run(
    module: &mut Module,
    scheme: &str,
    calib: &CalibArgs,
    opts: &PassOptions,
) -> Result<String, Failure> {
    let observer = calib.observer()?;
    let mut out = String::new();
    let scheme = match scheme {
        "int8-dynamic" => Int8Scheme::Dynamic,
        _ => {
            let ranges = calibrate_module(module, calib, observer)?;
            let _ = writeln!(
                out,
                "int8: calibrated {} activations on {} samples ({observer})",
                ranges.len(),
                ranges.samples
            );
            Int8Scheme::Static {
                ranges,
                symmetric: false,
            }
        }
    };
    out.push_str(&crate::compile::run_passes(
        module,
        vec![Box::new(
            Int8Pass::new(scheme).with_placement(calib.placement),
        )],
        opts,
    )?);
    Ok(out)
}

fn calibrate_module(
    module: &Module,
    calib: &CalibArgs,
    observer: Observer,
) -> Result<Ranges, Failure> {
    let acts = Int8Pass::activations(module, None);
    let Some((graph, values)) = acts.first() else {
        return Err(Failure::user("error: the module has no graph\n".into()));
    };
    if acts.len() > 1 {
        return Err(Failure::user(
            "error: --quant int8 calibrates one model at a time; compile the files separately\n"
                .into(),
        ));
    }
    let fail = |e: CalibError| Failure::user(format!("error: calibration: {e}\n"));
    let (samples, total): (Box<dyn Iterator<Item = Result<Sample, CalibError>>>, usize) =
        match &calib.dir {
            Some(dir) => {
                let files = calibrate::dir_samples(dir).map_err(fail)?;
                let n = std::fs::read_dir(dir)
                    .map(|d| {
                        d.filter(|e| {
                            e.as_ref()
                                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "npz"))
                        })
                        .count()
                    })
                    .unwrap_or(0);
                (Box::new(files), n)
            }
            None => {
                let n = calib.random.unwrap_or(DEFAULT_RANDOM_SAMPLES);
                let s = calibrate::random_samples(module, *graph, n, 0).map_err(fail)?;
                (Box::new(s), n)
            }
        };
    let bar = if std::io::stderr().is_terminal() {
        let bar = ProgressBar::new(total as u64);
        if let Ok(style) =
            ProgressStyle::with_template("calibrating {bar:30} {pos}/{len} samples {elapsed}")
        {
            bar.set_style(style);
        }
        bar
    } else {
        ProgressBar::hidden()
    };
    let samples = samples.inspect(|_| bar.inc(1));
    let ranges = calibrate::calibrate(module, *graph, values, samples, observer).map_err(fail);
    bar.finish_and_clear();
    ranges
}

/// Checks `--smoothquant` and `--awq` against the scheme (`quant`, `mixed` when a precision map
/// is given): SmoothQuant goes with int8 and int8-dynamic, AWQ with int4.
pub fn check_scale_flags(
    quant: Option<&str>,
    precision_map: bool,
    smoothquant: Option<f32>,
    awq: bool,
) -> Result<(), Failure> {
    let scheme = if precision_map { Some("mixed") } else { quant };
    if let Some(alpha) = smoothquant {
        if !(0.0..=1.0).contains(&alpha) {
            return Err(Failure::usage(format!(
                "--smoothquant {alpha}: alpha must be in [0, 1] (0.5 is usual)"
            )));
        }
        if !matches!(scheme, Some("int8" | "int8-dynamic")) {
            return Err(Failure::usage(format!(
                "--smoothquant needs --quant int8 or int8-dynamic, not {}",
                scheme.map_or("no --quant".to_owned(), |s| format!("--quant {s}"))
            )));
        }
    }
    if awq && scheme != Some("int4") {
        return Err(Failure::usage(format!(
            "--awq needs --quant int4, not {}",
            scheme.map_or("no --quant".to_owned(), |s| format!("--quant {s}"))
        )));
    }
    Ok(())
}

/// The calibration samples of `calib` for `graph` (`--calib DIR`, else `--calib-random N` or
/// [`DEFAULT_RANDOM_SAMPLES`] random ones, seed 0).
pub fn samples<'m>(
    module: &'m Module,
    graph: mmq_ir::GraphId,
    calib: &CalibArgs,
) -> Result<Box<dyn Iterator<Item = Result<Sample, CalibError>> + 'm>, Failure> {
    calib.observer()?;
    let fail = |e: CalibError| Failure::user(format!("error: calibration: {e}\n"));
    Ok(match &calib.dir {
        Some(dir) => Box::new(calibrate::dir_samples(dir).map_err(fail)?),
        None => {
            let n = calib.random.unwrap_or(DEFAULT_RANDOM_SAMPLES);
            Box::new(calibrate::random_samples(module, graph, n, 0).map_err(fail)?)
        }
    })
}

/// Per-channel statistics of the activations `sites` read, with up to `max_rows` sampled rows
/// each, on the calibration samples of `calib`.
pub fn site_stats(
    module: &Module,
    sites: &[mmq_passes::quant::smooth::Site],
    calib: &CalibArgs,
    max_rows: usize,
    what: &str,
) -> Result<std::collections::HashMap<mmq_ir::Value, calibrate::ChannelStats>, Failure> {
    if module.entries.len() != 1 {
        return Err(Failure::user(format!(
            "error: {what} calibrates one model at a time; compile the files separately\n"
        )));
    }
    let graph = module.entries[0].graph;
    let values: Vec<mmq_ir::Value> = sites.iter().map(|s| s.x).collect();
    if values.is_empty() {
        return Ok(Default::default());
    }
    let samples = samples(module, graph, calib)?;
    calibrate::channel_stats(module, graph, &values, samples, max_rows)
        .map_err(|e| Failure::user(format!("error: {what}: calibration: {e}\n")))
}

/// `--smoothquant ALPHA`: per-channel activation maxima on the calibration samples, then the
/// SmoothQuant pass; returns what to print.
pub fn smooth(
    module: &mut Module,
    alpha: f32,
    calib: &CalibArgs,
    opts: &PassOptions,
) -> Result<String, Failure> {
    use mmq_passes::quant::smooth::{self, SmoothQuantPass};
    let sites = smooth::sites(module);
    let stats = site_stats(module, &sites, calib, 0, "--smoothquant")?;
    crate::compile::run_passes(
        module,
        vec![Box::new(SmoothQuantPass::new(alpha, stats))],
        opts,
    )
}
