//! Calibration: activation ranges from sample inputs run through the reference interpreter.
//!
//! [`calibrate`] runs a top-level graph on each sample and folds every observed value into a
//! streamed statistic: running min/max, an exponential moving average of the per-sample
//! min/max, and a fixed-size histogram whose range doubles (merging bin pairs) when a sample
//! exceeds it. Memory is independent of the number of samples: one sample's activations are
//! alive at a time and each observed value keeps [`HIST_BINS`] counters. The [`Observer`] then
//! turns the statistics into a range: the extremes (`minmax`), the moving average (`ema`), a
//! tail percentile (`percentile`), the threshold of least KL divergence between the histogram
//! and its 8-bit quantization (`entropy`), or of least expected squared error (`mse`).
//!
//! Samples come from a folder of `.npz` files ([`dir_samples`]) or are drawn at random
//! ([`random_samples`]): dims within the symbols' ranges, floats from a standard normal, token
//! ids below the vocabulary size of the embedding table they index.
//!
//! [`channel_stats`] instead keeps per-channel statistics of the last axis (largest |x|, mean
//! |x|, a bounded uniform sample of rows) for SmoothQuant and AWQ ([`crate::quant::smooth`],
//! [`crate::quant::awq`]).

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use mmq_ir::{DType, Dim, GraphId, Module, Op, Sym, Value, ValueDef};
use mmq_kernels::{Interpreter, RtValue, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

/// One calibration sample: graph input name → value.
pub type Sample = HashMap<String, RtValue>;

/// Bins of each streamed histogram (even, and a multiple of 4 so that doubling the range maps
/// bin pairs onto the middle half).
pub const HIST_BINS: usize = 2048;

/// How observed statistics become a range.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Observer {
    /// The smallest and largest value seen.
    MinMax,
    /// Moving average of each sample's min and max: `r = momentum * r + (1 - momentum) * x`.
    Ema {
        /// Weight of the running value (0..1).
        momentum: f32,
    },
    /// The `percentile` (e.g. 99.99) of the values for the top, and `100 - percentile` for the
    /// bottom, from the histogram.
    Percentile {
        /// The percentile in (50, 100].
        percentile: f64,
    },
    /// The symmetric threshold whose 8-bit quantization of the |x| histogram has the least
    /// KL divergence from it (TensorRT's entropy calibration).
    Entropy,
    /// The symmetric threshold with the least expected squared error of 8-bit quantization
    /// (clipping plus rounding) over the histogram.
    Mse,
}

impl Observer {
    /// The names `--observer` accepts.
    pub const NAMES: &'static [&'static str] = &["minmax", "ema", "percentile", "entropy", "mse"];
}

impl fmt::Display for Observer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Observer::MinMax => f.write_str("minmax"),
            Observer::Ema { momentum } => write!(f, "ema:{momentum}"),
            Observer::Percentile { percentile } => write!(f, "percentile:{percentile}"),
            Observer::Entropy => f.write_str("entropy"),
            Observer::Mse => f.write_str("mse"),
        }
    }
}

impl FromStr for Observer {
    type Err = CalibError;

    /// Parses `minmax`, `ema[:MOMENTUM]` (default 0.9), `percentile[:P]` (default 99.99),
    /// `entropy`, `mse`.
    fn from_str(s: &str) -> Result<Self, CalibError> {
        let (name, arg) = match s.split_once(':') {
            Some((n, a)) => (n, Some(a)),
            None => (s, None),
        };
        let num = |default: f64| -> Result<f64, CalibError> {
            match arg {
                None => Ok(default),
                Some(a) => a.parse::<f64>().map_err(|_| {
                    CalibError::Usage(format!("observer '{s}': '{a}' is not a number"))
                }),
            }
        };
        let obs = match name {
            "minmax" => Observer::MinMax,
            "ema" => {
                let m = num(0.9)?;
                if !(0.0..1.0).contains(&m) {
                    return Err(CalibError::Usage(format!(
                        "observer '{s}': momentum must be in [0, 1)"
                    )));
                }
                Observer::Ema { momentum: m as f32 }
            }
            "percentile" => {
                let p = num(99.99)?;
                if !(p > 50.0 && p <= 100.0) {
                    return Err(CalibError::Usage(format!(
                        "observer '{s}': percentile must be in (50, 100]"
                    )));
                }
                Observer::Percentile { percentile: p }
            }
            "entropy" => Observer::Entropy,
            "mse" => Observer::Mse,
            _ => {
                return Err(CalibError::Usage(format!(
                    "unknown observer '{s}' (expected one of {})",
                    Observer::NAMES.join(", ")
                )));
            }
        };
        if arg.is_some() && matches!(obs, Observer::MinMax | Observer::Entropy | Observer::Mse) {
            return Err(CalibError::Usage(format!(
                "observer '{name}' takes no argument"
            )));
        }
        Ok(obs)
    }
}

/// Calibration failed.
/// Activations whose channels do not match what [`ChannelObserver::observe`] saw before.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ChannelMismatch(pub String);

#[derive(Debug, thiserror::Error)]
pub enum CalibError {
    /// A bad option value.
    #[error("{0}")]
    Usage(String),
    /// A sample file could not be read or does not fit the graph.
    #[error("{path}: {message}")]
    Sample {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The module cannot be calibrated (a value that is not in the graph, an input type that
    /// cannot be drawn).
    #[error("{0}")]
    Module(String),
    /// The work was asked to stop ([`crate::Interrupt`]) before the next sample.
    #[error("interrupted")]
    Interrupted,
    /// The interpreter failed on sample `index`.
    #[error("sample {index}: {message}")]
    Run {
        /// Position of the sample.
        index: usize,
        /// The interpreter's error.
        message: String,
    },
    /// There were no samples.
    #[error("no calibration samples")]
    Empty,
}

/// A calibrated range `[min, max]` of a value (finite, `min <= max`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Range {
    /// Lower end.
    pub min: f32,
    /// Upper end.
    pub max: f32,
}

impl Range {
    /// The largest magnitude.
    pub fn abs_max(self) -> f32 {
        self.min.abs().max(self.max.abs())
    }
}

/// Calibrated ranges per value.
#[derive(Clone, Debug, Default)]
pub struct Ranges {
    map: HashMap<Value, Range>,
    /// Largest element count seen per value (what the samples' dims made of symbolic ones).
    sizes: HashMap<Value, usize>,
    /// Samples the ranges were computed from.
    pub samples: usize,
}

impl Ranges {
    /// The range of `v`, if it was observed with at least one finite element.
    pub fn get(&self, v: Value) -> Option<Range> {
        self.map.get(&v).copied()
    }

    /// Sets the range of `v`.
    pub fn insert(&mut self, v: Value, r: Range) {
        self.map.insert(v, r);
    }

    /// Gives `v` the range and element count of `of` (a value standing in for another, as in
    /// [`crate::quant::auto::isolate`]).
    pub fn alias(&mut self, v: Value, of: Value) {
        if let Some(r) = self.map.get(&of).copied() {
            self.map.insert(v, r);
        }
        if let Some(n) = self.sizes.get(&of).copied() {
            self.sizes.insert(v, n);
        }
    }

    /// The largest number of elements `v` held on a calibration sample.
    pub fn elements(&self, v: Value) -> Option<usize> {
        self.sizes.get(&v).copied()
    }

    /// Number of values with a range.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no value has a range.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// Streamed statistics of one value.
#[derive(Clone, Debug)]
struct Stats {
    min: f32,
    max: f32,
    ema: Option<(f32, f32)>,
    /// Counts over `[-limit, limit]` in [`HIST_BINS`] equal bins; `limit == 0` until the first
    /// nonzero value.
    hist: Vec<u64>,
    limit: f32,
    zeros_before_hist: u64,
}

impl Stats {
    fn new() -> Stats {
        Stats {
            min: f32::INFINITY,
            max: f32::NEG_INFINITY,
            ema: None,
            hist: vec![0; HIST_BINS],
            limit: 0.0,
            zeros_before_hist: 0,
        }
    }

    fn observe(&mut self, xs: &[f32], momentum: f32) {
        let (mut lo, mut hi) = (f32::INFINITY, f32::NEG_INFINITY);
        for &x in xs {
            if x.is_finite() {
                lo = lo.min(x);
                hi = hi.max(x);
            }
        }
        if lo > hi {
            return;
        }
        self.min = self.min.min(lo);
        self.max = self.max.max(hi);
        self.ema = Some(match self.ema {
            None => (lo, hi),
            Some((a, b)) => (
                momentum * a + (1.0 - momentum) * lo,
                momentum * b + (1.0 - momentum) * hi,
            ),
        });
        let amax = lo.abs().max(hi.abs());
        if amax == 0.0 {
            self.zeros_before_hist += xs.len() as u64;
            return;
        }
        if self.limit == 0.0 {
            self.limit = amax;
            self.hist[HIST_BINS / 2] += self.zeros_before_hist;
        }
        while amax > self.limit {
            // Double the range: bin i of the old histogram covers half of new bin B/4 + i/2.
            let mut merged = vec![0u64; HIST_BINS];
            for (i, &c) in self.hist.iter().enumerate() {
                merged[HIST_BINS / 4 + i / 2] += c;
            }
            self.hist = merged;
            self.limit *= 2.0;
        }
        let width = 2.0 * self.limit / HIST_BINS as f32;
        for &x in xs {
            if x.is_finite() {
                let b = ((x + self.limit) / width) as usize;
                self.hist[b.min(HIST_BINS - 1)] += 1;
            }
        }
    }

    fn range(&self, obs: Observer) -> Option<Range> {
        if self.min > self.max {
            return None;
        }
        let clip = |t: f32| Range {
            min: self.min.max(-t).min(0.0),
            max: self.max.min(t).max(0.0),
        };
        Some(match obs {
            Observer::MinMax => Range {
                min: self.min,
                max: self.max,
            },
            Observer::Ema { .. } => {
                let (a, b) = self.ema.unwrap_or((self.min, self.max));
                Range { min: a, max: b }
            }
            Observer::Percentile { percentile } => {
                if self.limit == 0.0 {
                    return Some(Range { min: 0.0, max: 0.0 });
                }
                let total: u64 = self.hist.iter().sum();
                let width = 2.0 * self.limit / HIST_BINS as f32;
                let edge = |b: usize| -self.limit + b as f32 * width;
                let tail = ((1.0 - percentile / 100.0) * total as f64).floor() as u64;
                let mut acc = 0;
                let mut lo_bin = 0;
                for (i, &c) in self.hist.iter().enumerate() {
                    acc += c;
                    if acc > tail {
                        lo_bin = i;
                        break;
                    }
                }
                acc = 0;
                let mut hi_bin = HIST_BINS - 1;
                for (i, &c) in self.hist.iter().enumerate().rev() {
                    acc += c;
                    if acc > tail {
                        hi_bin = i;
                        break;
                    }
                }
                Range {
                    min: edge(lo_bin).max(self.min),
                    max: edge(hi_bin + 1).min(self.max),
                }
            }
            Observer::Entropy => {
                if self.limit == 0.0 {
                    return Some(Range { min: 0.0, max: 0.0 });
                }
                clip(self.entropy_threshold())
            }
            Observer::Mse => {
                if self.limit == 0.0 {
                    return Some(Range { min: 0.0, max: 0.0 });
                }
                clip(self.mse_threshold())
            }
        })
    }

    /// The |x| histogram: `HIST_BINS / 2` bins over `[0, limit]`.
    fn abs_hist(&self) -> Vec<f64> {
        let half = HIST_BINS / 2;
        (0..half)
            .map(|i| (self.hist[half + i] + self.hist[half - 1 - i]) as f64)
            .collect()
    }

    fn entropy_threshold(&self) -> f32 {
        const LEVELS: usize = 128;
        let hist = self.abs_hist();
        let n = hist.len();
        let width = self.limit / n as f32;
        let mut best = (f64::INFINITY, n);
        for i in (LEVELS..=n).step_by(8) {
            // Reference: the first i bins with the outliers folded into the last.
            let mut p: Vec<f64> = hist[..i].to_vec();
            p[i - 1] += hist[i..].iter().sum::<f64>();
            // Candidate: the first i bins merged into LEVELS levels, spread back over the
            // nonzero bins of each level.
            let mut q = vec![0.0; i];
            for l in 0..LEVELS {
                let a = l * i / LEVELS;
                let b = ((l + 1) * i / LEVELS).max(a + 1);
                let sum: f64 = hist[a..b].iter().sum();
                let nz = hist[a..b].iter().filter(|&&c| c > 0.0).count();
                if nz > 0 {
                    for j in a..b {
                        if hist[j] > 0.0 {
                            q[j] = sum / nz as f64;
                        }
                    }
                }
            }
            let ps: f64 = p.iter().sum();
            let qs: f64 = q.iter().sum();
            if ps == 0.0 || qs == 0.0 {
                continue;
            }
            let mut kl = 0.0;
            for (&pj, &qj) in p.iter().zip(&q) {
                if pj > 0.0 {
                    let (pj, qj) = (pj / ps, (qj / qs).max(1e-12));
                    kl += pj * (pj / qj).ln();
                }
            }
            if kl < best.0 {
                best = (kl, i);
            }
        }
        best.1 as f32 * width
    }

    fn mse_threshold(&self) -> f32 {
        let hist = self.abs_hist();
        let n = hist.len();
        let width = self.limit / n as f32;
        let mut best = (f64::INFINITY, self.limit);
        for i in (8..=n).step_by(8) {
            let t = i as f64 * f64::from(width);
            let step = 2.0 * t / 255.0;
            let mut err = 0.0;
            for (j, &c) in hist.iter().enumerate() {
                if c == 0.0 {
                    continue;
                }
                let x = (j as f64 + 0.5) * f64::from(width);
                err += c * if x > t {
                    (x - t) * (x - t)
                } else {
                    step * step / 12.0
                };
            }
            if err < best.0 {
                best = (err, t as f32);
            }
        }
        best.1
    }
}

/// A copy of `m` whose `graph` also outputs each of `values` (constants skipped, each value
/// once; constants are shared with `m`, not copied), with the graph's own output count and the
/// values observed, in order. `values` must be inputs of `graph` or results of its nodes.
fn probe(
    m: &Module,
    graph: GraphId,
    values: &[Value],
) -> Result<(Module, usize, Vec<Value>), CalibError> {
    let g = m
        .graphs
        .get(graph)
        .ok_or_else(|| CalibError::Module(format!("no graph {graph:?}")))?;
    let mut observed = Vec::new();
    for &v in values {
        let Some(data) = m.values.get(v) else {
            return Err(CalibError::Module(format!("value {v:?} does not exist")));
        };
        let in_graph = match data.def {
            ValueDef::Const(_) => continue,
            ValueDef::Input { graph: gi, .. } => gi == graph,
            ValueDef::Output { node, .. } => m.nodes[node].graph == graph,
        };
        if !in_graph {
            return Err(CalibError::Module(format!(
                "value '{}' is not computed by graph '{}'",
                data.name.clone().unwrap_or_else(|| format!("{v:?}")),
                g.name
            )));
        }
        if !observed.contains(&v) {
            observed.push(v);
        }
    }
    let mut probe = m.clone();
    let n_out = g.outputs.len();
    probe.graphs[graph].outputs.extend(observed.iter().copied());
    Ok((probe, n_out, observed))
}

/// Runs `graph` on each sample and returns the range of each of `values` under `observer`.
///
/// `values` must be inputs of `graph` or results of its nodes (not of subgraphs); constants
/// are skipped. Values that are not float tensors or never hold a finite element get no
/// range. Stops at the first sample that fails.
pub fn calibrate<I>(
    m: &Module,
    graph: GraphId,
    values: &[Value],
    samples: I,
    observer: Observer,
) -> Result<Ranges, CalibError>
where
    I: IntoIterator<Item = Result<Sample, CalibError>>,
{
    let mut each = calibrate_each(m, graph, values, samples, &[observer])?;
    Ok(each.pop().unwrap_or_default())
}

/// [`calibrate`] under several observers from one run per sample: one [`Ranges`] per observer,
/// in order (an `ema` observer's momentum is the first one given).
pub fn calibrate_each<I>(
    m: &Module,
    graph: GraphId,
    values: &[Value],
    samples: I,
    observers: &[Observer],
) -> Result<Vec<Ranges>, CalibError>
where
    I: IntoIterator<Item = Result<Sample, CalibError>>,
{
    let (probe, n_out, observed) = probe(m, graph, values)?;
    let interp = Interpreter::new(&probe);
    let momentum = observers
        .iter()
        .find_map(|o| match o {
            Observer::Ema { momentum } => Some(*momentum),
            _ => None,
        })
        .unwrap_or(0.9);
    let mut stats: Vec<Stats> = observed.iter().map(|_| Stats::new()).collect();
    let mut sizes: Vec<usize> = vec![0; observed.len()];
    let mut count = 0;
    for (index, sample) in samples.into_iter().enumerate() {
        let sample = sample?;
        let outs = interp.run(graph, &sample).map_err(|e| CalibError::Run {
            index,
            message: e.to_string(),
        })?;
        for (((_, val), st), size) in outs
            .into_iter()
            .skip(n_out)
            .zip(stats.iter_mut())
            .zip(sizes.iter_mut())
        {
            if let Some(t) = val.as_tensor()
                && t.dtype.is_float()
                && let Ok(xs) = t.to_f32()
            {
                *size = (*size).max(xs.len());
                st.observe(&xs, momentum);
            }
        }
        count += 1;
    }
    if count == 0 {
        return Err(CalibError::Empty);
    }
    Ok(observers
        .iter()
        .map(|&observer| {
            let mut ranges = Ranges {
                map: HashMap::new(),
                sizes: HashMap::new(),
                samples: count,
            };
            for ((&v, st), &size) in observed.iter().zip(&stats).zip(&sizes) {
                if let Some(r) = st.range(observer) {
                    ranges.insert(v, r);
                    ranges.sizes.insert(v, size);
                }
            }
            ranges
        })
        .collect())
}

/// The `.npz` files of `dir` in name order, read one at a time as samples (keyed by array name,
/// which must be the graph input names). Each file's headers are checked against the inputs
/// of `graph` before its arrays are inflated.
pub fn dir_samples<'m>(
    m: &'m Module,
    graph: GraphId,
    dir: &Path,
) -> Result<impl Iterator<Item = Result<Sample, CalibError>> + use<'m>, CalibError> {
    let files = npz_paths(dir)?;
    if files.is_empty() {
        return Err(CalibError::Sample {
            path: dir.to_owned(),
            message: "no .npz files (one sample per file, arrays named after the inputs)".into(),
        });
    }
    let interp = mmq_kernels::Interpreter::new(m);
    Ok(files.into_iter().enumerate().map(move |(index, path)| {
        let sample_error = |message: String| CalibError::Sample {
            path: path.clone(),
            message,
        };
        let headers =
            mmq_kernels::io::npz_headers(&path).map_err(|e| sample_error(e.to_string()))?;
        // As a run of the sample would fail, before the arrays are inflated.
        interp
            .check_shapes(
                graph,
                headers
                    .iter()
                    .map(|h| (h.name.as_str(), h.dtype, &h.shape[..])),
            )
            .map_err(|e| CalibError::Run {
                index,
                message: e.to_string(),
            })?;
        let arrays = mmq_kernels::io::read_npz(&path).map_err(|e| sample_error(e.to_string()))?;
        Ok(arrays
            .into_iter()
            .map(|(k, t)| (k, RtValue::from(t)))
            .collect())
    }))
}

/// The `.npz` files of `dir`, sorted: the samples of [`dir_samples`], in its order.
pub fn npz_paths(dir: &Path) -> Result<Vec<PathBuf>, CalibError> {
    let entries = std::fs::read_dir(dir).map_err(|e| CalibError::Sample {
        path: dir.to_owned(),
        message: format!("cannot read the folder: {e}"),
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "npz"))
        .collect();
    files.sort();
    Ok(files)
}

/// How one graph input is drawn.
#[derive(Clone, Debug)]
enum Draw {
    Normal,
    Ones,
    Zeros,
    Positions,
    Tokens(i64),
    Bool,
}

/// `n` samples for the inputs of `graph`, drawn with a generator seeded by `seed`.
///
/// Symbolic dims take values within the symbols' ranges (a symbol named like `batch` is 1 where
/// allowed; others are drawn from `[min, min(max, min + 7)]`, `min` defaulting to 1; a symbol named like
/// `total_seq` is the sum of the `past` and `seq` symbols). Float
/// inputs are standard normal; integer inputs that index an embedding table (a `Gather` of a
/// constant, possibly through casts and reshapes) are token ids below its first dim; inputs
/// named like masks are ones, like position ids `0..len` along the last axis, like token type
/// ids zeros; other integers are 0 or 1. Inputs with defaults are left out.
pub fn random_samples(
    m: &Module,
    graph: GraphId,
    n: usize,
    seed: u64,
) -> Result<impl Iterator<Item = Result<Sample, CalibError>> + '_, CalibError> {
    random_samples_bound(m, graph, n, seed, HashMap::new())
}

/// [`random_samples`] with the symbols named in `fixed` bound to the given values.
pub fn random_samples_bound(
    m: &Module,
    graph: GraphId,
    n: usize,
    seed: u64,
    fixed: HashMap<String, i64>,
) -> Result<impl Iterator<Item = Result<Sample, CalibError>> + '_, CalibError> {
    let g = m
        .graphs
        .get(graph)
        .ok_or_else(|| CalibError::Module(format!("no graph {graph:?}")))?;
    let mut specs = Vec::new();
    for &v in &g.inputs {
        let data = &m.values[v];
        if matches!(
            data.def,
            ValueDef::Input {
                default: Some(_),
                ..
            }
        ) {
            continue;
        }
        let name = data.name.clone().unwrap_or_default();
        let ty = m.value_type(v);
        let (Some(dtype), Some(shape)) = (ty.dtype(), ty.shape()) else {
            return Err(CalibError::Module(format!(
                "input '{name}' has no static dtype and rank; give samples with --calib"
            )));
        };
        if shape.iter().any(|d| matches!(d, Dim::Unknown)) {
            return Err(CalibError::Module(format!(
                "input '{name}' has an unnamed dynamic dim; give samples with --calib"
            )));
        }
        let lower = name.to_ascii_lowercase();
        let draw = if dtype == DType::Bool {
            Draw::Bool
        } else if dtype.is_float() {
            if lower.contains("mask") {
                Draw::Ones
            } else {
                Draw::Normal
            }
        } else if dtype.is_int() {
            if let Some(vocab) = vocab_of(m, v) {
                Draw::Tokens(vocab)
            } else if lower.contains("mask") {
                Draw::Ones
            } else if lower.contains("position") {
                Draw::Positions
            } else if lower.contains("type") {
                Draw::Zeros
            } else {
                Draw::Tokens(2)
            }
        } else {
            return Err(CalibError::Module(format!(
                "input '{name}' of type {dtype} cannot be drawn at random; give samples with --calib"
            )));
        };
        specs.push((name, dtype, shape.to_vec(), draw));
    }
    let mut syms: Vec<Sym> = Vec::new();
    for (_, _, shape, _) in &specs {
        for d in shape {
            if let Some(e) = d.expr() {
                e.symbols(&mut syms);
            }
        }
    }
    syms.sort();
    syms.dedup();
    let mut rng = StdRng::seed_from_u64(seed);
    Ok((0..n).map(move |_| {
        let mut bind: HashMap<Sym, i64> = HashMap::new();
        for &s in &syms {
            let d = &m.symbols[s];
            let lo = d.min.unwrap_or(1).max(0);
            let hi = d.max.map_or(lo + 7, |hi| hi.min(lo + 7)).max(lo);
            let v = if let Some(&v) = fixed.get(&d.name) {
                v
            } else if d.name.to_ascii_lowercase().contains("batch") && lo <= 1 && 1 <= hi {
                1
            } else {
                rng.random_range(lo..=hi)
            };
            bind.insert(s, v);
        }
        // Exporters name the key/value length `total_seq` without saying it is `past + seq`.
        let named = |f: &dyn Fn(&str) -> bool| {
            syms.iter()
                .copied()
                .find(|&s| f(&m.symbols[s].name.to_ascii_lowercase()))
        };
        if let (Some(t), Some(p), Some(q)) = (
            named(&|n| n.contains("total")),
            named(&|n| n.contains("past")),
            named(&|n| n.contains("seq") && !n.contains("past") && !n.contains("total")),
        ) {
            let sum = bind[&p] + bind[&q];
            let d = &m.symbols[t];
            if d.min.is_none_or(|lo| sum >= lo) && d.max.is_none_or(|hi| sum <= hi) {
                bind.insert(t, sum);
            }
        }
        let mut sample = Sample::new();
        for (name, dtype, shape, draw) in &specs {
            let dims: Vec<usize> = shape
                .iter()
                .map(|d| {
                    d.expr()
                        .and_then(|e| e.eval(&|s| bind.get(&s).copied()))
                        .and_then(|x| usize::try_from(x).ok())
                        .ok_or_else(|| {
                            CalibError::Module(format!("input '{name}': cannot evaluate a dim"))
                        })
                })
                .collect::<Result<_, _>>()?;
            let len: usize = dims.iter().product();
            let last = dims.last().copied().unwrap_or(1).max(1);
            let vals: Vec<f64> = (0..len)
                .map(|i| match draw {
                    Draw::Normal => rng.sample::<f64, _>(StandardNormal),
                    Draw::Ones | Draw::Bool => 1.0,
                    Draw::Zeros => 0.0,
                    Draw::Positions => (i % last) as f64,
                    Draw::Tokens(v) => rng.random_range(0..*v) as f64,
                })
                .collect();
            let t = Tensor::from_f64_as(*dtype, dims, &vals)
                .map_err(|e| CalibError::Module(format!("input '{name}': {e}")))?;
            sample.insert(name.clone(), RtValue::from(t));
        }
        Ok(sample)
    }))
}

/// The first dim of the constant embedding table that integer input `v` indexes (the smallest,
/// when it indexes several), following casts and reshapes.
fn vocab_of(m: &Module, v: Value) -> Option<i64> {
    let mut frontier = vec![v];
    let mut seen = vec![v];
    let mut best: Option<i64> = None;
    while let Some(x) = frontier.pop() {
        for (_, node) in m.nodes.iter() {
            if !node.inputs.contains(&Some(x)) {
                continue;
            }
            match &node.op {
                Op::Gather { .. } if node.inputs.get(1) == Some(&Some(x)) => {
                    if let Some(Some(table)) = node.inputs.first()
                        && let ValueDef::Const(c) = m.values[*table].def
                        && let Some(&rows) = m.consts[c].shape.first()
                    {
                        best = Some(best.map_or(rows, |b| b.min(rows)));
                    }
                }
                Op::Cast { .. }
                | Op::Reshape { .. }
                | Op::Unsqueeze { .. }
                | Op::Squeeze { .. }
                | Op::Flatten { .. }
                | Op::Identity { .. }
                    if node.inputs.first() == Some(&Some(x)) =>
                {
                    for out in node.outputs.iter().flatten() {
                        if !seen.contains(out) {
                            seen.push(*out);
                            frontier.push(*out);
                        }
                    }
                }
                _ => {}
            }
        }
    }
    best.filter(|&b| b > 0)
}

/// Streamed per-channel statistics of one value along its last axis (the input channels of the
/// `MatMul` it feeds): what SmoothQuant and AWQ choose their scales from.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ChannelStats {
    /// Channels (the size of the last axis).
    pub channels: usize,
    /// Largest finite |x| of each channel.
    pub abs_max: Vec<f32>,
    /// Sum of the finite |x| of each channel.
    pub abs_sum: Vec<f64>,
    /// Rows seen (elements / channels, over all samples).
    pub rows: u64,
    /// Up to the requested number of rows, drawn uniformly from every row seen (reservoir
    /// sampling), row-major `[sampled_rows, channels]`.
    pub row_sample: Vec<f32>,
}

impl ChannelStats {
    /// Mean |x| of each channel (0 before any row).
    pub fn abs_mean(&self) -> Vec<f32> {
        let rows = self.rows.max(1) as f64;
        self.abs_sum.iter().map(|&s| (s / rows) as f32).collect()
    }

    /// Rows held in [`ChannelStats::row_sample`].
    pub fn sampled_rows(&self) -> usize {
        self.row_sample
            .len()
            .checked_div(self.channels)
            .unwrap_or(0)
    }
}

/// Folds rows into [`ChannelStats`]: memory is `O(channels * max_rows)` whatever the number of
/// samples.
#[derive(Debug)]
pub struct ChannelObserver {
    stats: ChannelStats,
    max_rows: usize,
    rng: StdRng,
}

impl ChannelObserver {
    /// An observer keeping a sample of up to `max_rows` rows (0: statistics only), drawn with a
    /// generator seeded by `seed`.
    pub fn new(max_rows: usize, seed: u64) -> ChannelObserver {
        ChannelObserver {
            stats: ChannelStats::default(),
            max_rows,
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// Folds `xs` (row-major, `channels` per row) in; an error when the channel count differs
    /// from the one seen first or does not divide the length.
    pub fn observe(&mut self, xs: &[f32], channels: usize) -> Result<(), ChannelMismatch> {
        let st = &mut self.stats;
        if channels == 0 || !xs.len().is_multiple_of(channels) {
            return Err(ChannelMismatch(format!(
                "{} elements do not form rows of {channels} channels",
                xs.len()
            )));
        }
        if st.channels == 0 && st.rows == 0 {
            st.channels = channels;
            st.abs_max = vec![0.0; channels];
            st.abs_sum = vec![0.0; channels];
        } else if st.channels != channels {
            return Err(ChannelMismatch(format!(
                "the last axis has {channels} channels here and {} in an earlier sample",
                st.channels
            )));
        }
        for row in xs.chunks_exact(channels) {
            for ((mx, sum), &x) in st.abs_max.iter_mut().zip(&mut st.abs_sum).zip(row) {
                if x.is_finite() {
                    *mx = mx.max(x.abs());
                    *sum += f64::from(x.abs());
                }
            }
            let seen = st.rows;
            st.rows += 1;
            if self.max_rows == 0 {
                continue;
            }
            let clean = row.iter().map(|&x| if x.is_finite() { x } else { 0.0 });
            if st.sampled_rows() < self.max_rows {
                st.row_sample.extend(clean);
            } else {
                let j = self.rng.random_range(0..=seen) as usize;
                if j < self.max_rows {
                    for (d, x) in st.row_sample[j * channels..(j + 1) * channels]
                        .iter_mut()
                        .zip(clean)
                    {
                        *d = x;
                    }
                }
            }
        }
        Ok(())
    }

    /// The statistics.
    pub fn finish(self) -> ChannelStats {
        self.stats
    }
}

/// Runs `graph` on each sample and returns the per-channel statistics of each of `values` along
/// its last axis, with a sample of up to `max_rows` rows each (see [`ChannelObserver`]).
///
/// `values` must be float results or inputs of `graph` (not of subgraphs; constants are skipped). One sample's
/// activations are alive at a time. Values that never hold a float tensor get no entry.
pub fn channel_stats<I>(
    m: &Module,
    graph: GraphId,
    values: &[Value],
    samples: I,
    max_rows: usize,
) -> Result<HashMap<Value, ChannelStats>, CalibError>
where
    I: IntoIterator<Item = Result<Sample, CalibError>>,
{
    let (probe, n_out, observed) = probe(m, graph, values)?;
    let name = |v: Value| m.values[v].name.clone().unwrap_or_else(|| format!("{v:?}"));
    let interp = Interpreter::new(&probe);
    let mut observers: Vec<ChannelObserver> = (0..observed.len())
        .map(|i| ChannelObserver::new(max_rows, i as u64))
        .collect();
    let mut count = 0;
    for (index, sample) in samples.into_iter().enumerate() {
        let sample = sample?;
        let outs = interp.run(graph, &sample).map_err(|e| CalibError::Run {
            index,
            message: e.to_string(),
        })?;
        for (((_, val), obs), &v) in outs
            .into_iter()
            .skip(n_out)
            .zip(observers.iter_mut())
            .zip(&observed)
        {
            if let Some(t) = val.as_tensor()
                && t.dtype.is_float()
                && let Ok(xs) = t.to_f32()
            {
                let channels = t.shape.last().copied().unwrap_or(1);
                obs.observe(&xs, channels).map_err(|e| CalibError::Run {
                    index,
                    message: format!("value '{}': {e}", name(v)),
                })?;
            }
        }
        count += 1;
    }
    if count == 0 {
        return Err(CalibError::Empty);
    }
    Ok(observed
        .into_iter()
        .zip(observers)
        .map(|(v, o)| (v, o.finish()))
        .filter(|(_, s)| s.rows > 0)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats_of(chunks: &[&[f32]]) -> Stats {
        let mut s = Stats::new();
        for c in chunks {
            s.observe(c, 0.5);
        }
        s
    }

    #[test]
    fn parses_observers_and_rejects_bad_ones() {
        assert_eq!("minmax".parse::<Observer>().unwrap(), Observer::MinMax);
        assert_eq!(
            "ema:0.5".parse::<Observer>().unwrap(),
            Observer::Ema { momentum: 0.5 }
        );
        assert_eq!(
            "percentile".parse::<Observer>().unwrap(),
            Observer::Percentile { percentile: 99.99 }
        );
        for bad in ["max", "ema:2", "percentile:x", "percentile:40", "mse:3"] {
            assert!(bad.parse::<Observer>().is_err(), "{bad}");
        }
    }

    #[test]
    fn minmax_and_ema_follow_the_samples() {
        let s = stats_of(&[&[-1.0, 2.0], &[-3.0, 4.0]]);
        assert_eq!(
            s.range(Observer::MinMax),
            Some(Range {
                min: -3.0,
                max: 4.0
            })
        );
        // 0.5 * (-1) + 0.5 * (-3), 0.5 * 2 + 0.5 * 4
        assert_eq!(
            s.range(Observer::Ema { momentum: 0.5 }),
            Some(Range {
                min: -2.0,
                max: 3.0
            })
        );
    }

    #[test]
    fn histogram_growth_keeps_every_count() {
        let s = stats_of(&[&[0.0, 0.1, -0.1], &[5.0, -7.0], &[100.0]]);
        assert_eq!(s.hist.iter().sum::<u64>(), 6);
        assert!(s.limit >= 100.0);
        // Zeros seen before the histogram existed land in the middle.
        let s = stats_of(&[&[0.0, 0.0], &[1.0]]);
        assert_eq!(s.hist.iter().sum::<u64>(), 3);
    }

    #[test]
    fn clipping_observers_ignore_rare_outliers() {
        let mut xs: Vec<f32> = (0..10000)
            .map(|i| ((i % 200) as f32 - 100.0) / 100.0)
            .collect();
        xs.push(50.0);
        // Expected squared error counts the outlier's clipping error against the rounding error
        // of every other element, so MSE clips only once the bulk outweighs it (here 1e6
        // elements: rounding at t = 50 costs ~1.3e4, clipping at t = 1 ~2.4e3).
        let bulk: Vec<f32> = xs[..10000].to_vec();
        let mut chunks: Vec<&[f32]> = vec![&bulk; 100];
        chunks.push(&xs);
        let s = stats_of(&chunks);
        for obs in [
            Observer::Percentile { percentile: 99.9 },
            Observer::Entropy,
            Observer::Mse,
        ] {
            let r = s.range(obs).unwrap();
            assert!(r.max < 10.0 && r.max >= 0.9, "{obs}: {r:?}");
            assert!(r.min <= -0.9, "{obs}: {r:?}");
        }
        assert_eq!(s.range(Observer::MinMax).unwrap().max, 50.0);
    }

    #[test]
    fn memory_does_not_grow_with_samples() {
        let mut s = Stats::new();
        for i in 0..1000 {
            s.observe(&[i as f32, -(i as f32) / 2.0], 0.9);
        }
        assert_eq!(s.hist.len(), HIST_BINS);
        assert_eq!(s.hist.iter().sum::<u64>(), 2000);
    }
}
