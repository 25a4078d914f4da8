//! The accuracy report: how far a quantized module's values are from the original's.
//!
//! Both modules run in the reference interpreter on the same samples. Two measurements:
//!
//! - **Per layer**, on the calibration samples: every value produced by a node of the original's
//!   entry graph that the quantized entry graph also produces under the same name (a layer the
//!   rewrite kept). Each layer gets the signal-to-quantization-noise ratio
//!   `SQNR = 10·log10(Σx² / Σ(x − x̂)²)` in dB and the cosine `Σx·x̂ / √(Σx²·Σx̂²)`, both summed
//!   over every element of every sample (one figure per layer, not a mean of per-sample
//!   figures). Values whose dtype is not floating point on either side, or whose shapes differ,
//!   are listed as skipped with the reason.
//! - **End to end**, on held-back samples: the main output (the first floating-point output of
//!   the original's entry graph with at least two elements on the first held-back sample, else
//!   the first floating-point one; found in the quantized graph by name, else by position) gets the
//!   cosine per sample (mean and minimum reported) and the top-1 agreement: the fraction of rows
//!   along the last axis (classes, vocabulary) whose arg-max is the same in both.
//!
//! Statistics are accumulated as sums, so memory does not grow with the number of samples; within
//! one sample the compared activations stay alive until the graph finishes.
//!
//! [`Report`] serializes to JSON (`serde`) and renders as a text table ([`Report::table`]).

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use mmq_ir::{GraphId, Module, Value, ValueDef};
use mmq_kernels::{Interpreter, KernelError, RtValue, Tensor};
use serde::Serialize;

pub use super::calibrate::Sample;

/// Why a report could not be made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReportError {
    /// One of the modules has no entry graph.
    #[error("the {0} module has no entry graph")]
    NoEntry(&'static str),
    /// No samples were given.
    #[error("the accuracy report needs at least one sample")]
    NoSamples,
    /// Running a module on a sample failed.
    #[error("running the {which} module on sample {sample}: {source}")]
    Run {
        /// `original` or `quantized`.
        which: &'static str,
        /// The sample's index in the list given.
        sample: usize,
        /// The interpreter's error.
        source: KernelError,
    },
}

/// SQNR and cosine of one layer, over all calibration samples.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LayerStat {
    /// The value's name (the same in both modules).
    pub name: String,
    /// The op type of the original node producing it.
    pub op: String,
    /// Elements compared (all samples together; non-finite pairs excluded).
    pub elements: u64,
    /// Signal-to-quantization-noise ratio in dB; `None` when the values are identical
    /// (infinite SQNR).
    pub sqnr_db: Option<f64>,
    /// Cosine similarity of the flattened values.
    pub cosine: f64,
    /// Largest absolute difference.
    pub max_abs_err: f64,
    /// Element pairs where either side is NaN or infinite (left out of the sums).
    pub nonfinite: u64,
}

/// A value present in both modules that could not be compared.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Skipped {
    /// The value's name.
    pub name: String,
    /// Why (dtype or shape differ, not a tensor...).
    pub reason: String,
}

/// Agreement of the main output on the held-back samples.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EndToEnd {
    /// The output's name in the original module.
    pub output: String,
    /// Samples compared.
    pub samples: usize,
    /// Mean over samples of the per-sample cosine.
    pub cosine_mean: f64,
    /// Smallest per-sample cosine.
    pub cosine_min: f64,
    /// SQNR in dB over all samples; `None` when identical.
    pub sqnr_db: Option<f64>,
    /// Fraction of rows (along the last axis) whose arg-max agrees; `None` when the last axis
    /// has fewer than two entries.
    pub top1_agreement: Option<f64>,
    /// Rows compared for top-1.
    pub top1_rows: u64,
}

/// The accuracy report of a quantized module against its original.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    /// Samples used for the per-layer statistics.
    pub layer_samples: usize,
    /// Samples used for the end-to-end figures.
    pub held_back_samples: usize,
    /// Whether the held-back samples are disjoint from the layer samples (false when only one
    /// sample was given).
    pub held_back_disjoint: bool,
    /// Per layer, in the original's node order.
    pub layers: Vec<LayerStat>,
    /// Values present in both that could not be compared.
    pub skipped: Vec<Skipped>,
    /// Named node results of the original with no same-named result in the quantized module.
    pub unmatched: usize,
    /// The main output's agreement, when the original has a floating-point output.
    pub end_to_end: Option<EndToEnd>,
}

/// Running sums for one compared value.
#[derive(Clone, Debug, Default)]
struct Acc {
    xx: f64,
    yy: f64,
    xy: f64,
    ee: f64,
    max_abs: f64,
    n: u64,
    nonfinite: u64,
}

impl Acc {
    fn add(&mut self, x: &[f64], y: &[f64]) {
        for (&a, &b) in x.iter().zip(y) {
            if !a.is_finite() || !b.is_finite() {
                self.nonfinite += 1;
                continue;
            }
            let e = a - b;
            self.xx += a * a;
            self.yy += b * b;
            self.xy += a * b;
            self.ee += e * e;
            self.max_abs = self.max_abs.max(e.abs());
            self.n += 1;
        }
    }

    fn cosine(&self) -> f64 {
        cosine(self.xx, self.yy, self.xy, self.ee)
    }

    fn sqnr_db(&self) -> Option<f64> {
        sqnr_db(self.xx, self.ee)
    }
}

/// Cosine from the sums; two all-zero vectors (or identical ones) have cosine 1.
fn cosine(xx: f64, yy: f64, xy: f64, ee: f64) -> f64 {
    if ee == 0.0 {
        return 1.0;
    }
    let d = (xx * yy).sqrt();
    if d == 0.0 {
        0.0
    } else {
        (xy / d).clamp(-1.0, 1.0)
    }
}

/// SQNR in dB; `None` for no noise, negative infinity never (a zero signal with noise gives the
/// noise power as a negative figure against a floor of 1e-300).
fn sqnr_db(xx: f64, ee: f64) -> Option<f64> {
    if ee == 0.0 {
        return None;
    }
    Some(10.0 * (xx.max(1e-300) / ee).log10())
}

/// [`accuracy_split`] with the samples split: the last quarter (at least one) is held back for
/// the end-to-end figures, the rest give the per-layer statistics. A single sample serves both.
pub fn accuracy(
    original: &Module,
    quantized: &Module,
    samples: &[Sample],
    main: Option<&str>,
) -> Result<Report, ReportError> {
    if samples.is_empty() {
        return Err(ReportError::NoSamples);
    }
    if samples.len() == 1 {
        return accuracy_split(original, quantized, samples, samples, main);
    }
    let held = (samples.len() / 4).max(1);
    let (layer, back) = samples.split_at(samples.len() - held);
    accuracy_split(original, quantized, layer, back, main)
}

/// The report on explicit sample sets: per-layer statistics on `layer_samples`, end-to-end
/// figures of the main output ([`main_output`]; `main` names it) on `held_back`. Samples
/// address the entry graphs' inputs by name.
pub fn accuracy_split(
    original: &Module,
    quantized: &Module,
    layer_samples: &[Sample],
    held_back: &[Sample],
    main: Option<&str>,
) -> Result<Report, ReportError> {
    if layer_samples.is_empty() || held_back.is_empty() {
        return Err(ReportError::NoSamples);
    }
    let og = entry(original).ok_or(ReportError::NoEntry("original"))?;
    let qg = entry(quantized).ok_or(ReportError::NoEntry("quantized"))?;

    let pairs = matched_layers(original, og, quantized, qg);
    let unmatched = named_results(original, og, true).len() - pairs.len();
    let (o_probe, o_base) = with_outputs(original, og, pairs.iter().map(|p| p.0));
    let (q_probe, q_base) = with_outputs(quantized, qg, pairs.iter().map(|p| p.1));

    let mut accs = vec![Acc::default(); pairs.len()];
    // `Some(None)`: not a floating-point value in the original, so not a layer to compare;
    // `Some(Some(reason))`: a float layer that cannot be compared.
    let mut skip: Vec<Option<Option<String>>> = vec![None; pairs.len()];
    {
        let oi = Interpreter::new(&o_probe);
        let qi = Interpreter::new(&q_probe);
        for (s, sample) in layer_samples.iter().enumerate() {
            let o = run(&oi, og, sample, "original", s)?;
            let q = run(&qi, qg, sample, "quantized", s)?;
            for (k, acc) in accs.iter_mut().enumerate() {
                if skip[k].is_some() {
                    continue;
                }
                let (Some(a), Some(b)) = (o.get(o_base + k), q.get(q_base + k)) else {
                    continue;
                };
                match comparable(&a.1, &b.1) {
                    Ok(Some((x, y))) => acc.add(&x, &y),
                    Ok(None) => skip[k] = Some(None),
                    Err(reason) => skip[k] = Some(Some(reason)),
                }
            }
        }
    }

    let mut layers = Vec::new();
    let mut skipped = Vec::new();
    for ((pair, acc), why) in pairs.iter().zip(&accs).zip(skip) {
        let name = pair.2.clone();
        match why {
            Some(None) => {}
            Some(Some(reason)) => skipped.push(Skipped { name, reason }),
            None => layers.push(LayerStat {
                name,
                op: pair.3.clone(),
                elements: acc.n,
                sqnr_db: acc.sqnr_db(),
                cosine: acc.cosine(),
                max_abs_err: acc.max_abs,
                nonfinite: acc.nonfinite,
            }),
        }
    }

    let end_to_end = end_to_end(original, og, quantized, qg, held_back, main)?;
    Ok(Report {
        layer_samples: layer_samples.len(),
        held_back_samples: held_back.len(),
        held_back_disjoint: !std::ptr::eq(layer_samples, held_back),
        layers,
        skipped,
        unmatched,
        end_to_end,
    })
}

/// Only the end-to-end figures of [`accuracy_split`] (no per-layer statistics): the main output
/// of both modules compared on `held_back`.
pub fn end_to_end_only(
    original: &Module,
    quantized: &Module,
    held_back: &[Sample],
    main: Option<&str>,
) -> Result<Option<EndToEnd>, ReportError> {
    if held_back.is_empty() {
        return Err(ReportError::NoSamples);
    }
    let og = entry(original).ok_or(ReportError::NoEntry("original"))?;
    let qg = entry(quantized).ok_or(ReportError::NoEntry("quantized"))?;
    end_to_end(original, og, quantized, qg, held_back, main)
}

/// Which of a run's outputs is the main one: the output named `chosen` when given (`None` when
/// there is none of that name or it is not floating point); otherwise the first floating-point
/// output named like logits, then like an embedding, then like a pooled output (what a user
/// of a classifier or an encoder reads), then the first of at least two elements, then any.
pub fn main_output(outs: &[(String, RtValue)], chosen: Option<&str>) -> Option<usize> {
    let float = |v: &RtValue, min_len: usize| {
        v.as_tensor()
            .is_some_and(|t| t.dtype.is_float() && t.len() >= min_len)
    };
    if let Some(name) = chosen {
        return outs.iter().position(|(n, v)| n == name && float(v, 0));
    }
    let named = |words: &[&str]| {
        outs.iter().position(|(n, v)| {
            let n = n.to_ascii_lowercase();
            float(v, 2) && words.iter().any(|w| n.contains(w))
        })
    };
    named(&["logits"])
        .or_else(|| named(&["embedding", "embeds"]))
        .or_else(|| named(&["pooled", "pooler"]))
        .or_else(|| outs.iter().position(|(_, v)| float(v, 2)))
        .or_else(|| outs.iter().position(|(_, v)| float(v, 0)))
}

fn entry(m: &Module) -> Option<GraphId> {
    m.entries.first().map(|e| e.graph)
}

fn run(
    interp: &Interpreter<'_>,
    graph: GraphId,
    sample: &Sample,
    which: &'static str,
    index: usize,
) -> Result<Vec<(String, RtValue)>, ReportError> {
    interp
        .run(graph, sample)
        .map_err(|source| ReportError::Run {
            which,
            sample: index,
            source,
        })
}

/// Named node results of `graph` (not inputs or constants), in node order; with `floats_only`,
/// only those that may be floating point (the declared dtype is float or unknown).
fn named_results(m: &Module, graph: GraphId, floats_only: bool) -> Vec<(Value, String, String)> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for &n in m.graphs[graph].nodes() {
        let node = &m.nodes[n];
        for v in node.outputs.iter().flatten() {
            let maybe_float = !floats_only
                || m.value_type(*v)
                    .as_tensor()
                    .is_none_or(|t| t.dtype.is_none_or(|d| d.is_float()));
            if let Some(name) = &m.values[*v].name
                && maybe_float
                && matches!(m.values[*v].def, ValueDef::Output { .. })
                && seen.insert(name.clone())
            {
                out.push((*v, name.clone(), node.op.op_type().to_owned()));
            }
        }
    }
    out
}

/// (original value, quantized value, name, original op type) for each named node result of
/// the original that the quantized graph also produces.
fn matched_layers(
    o: &Module,
    og: GraphId,
    q: &Module,
    qg: GraphId,
) -> Vec<(Value, Value, String, String)> {
    let by_name: HashMap<String, Value> = named_results(q, qg, false)
        .into_iter()
        .map(|(v, name, _)| (name, v))
        .collect();
    named_results(o, og, true)
        .into_iter()
        .filter_map(|(v, name, op)| by_name.get(&name).map(|&qv| (v, qv, name, op)))
        .collect()
}

/// A copy of `m` whose graph also returns `extra`, appended after its own outputs; returns it
/// and the index of the first appended output.
fn with_outputs(m: &Module, graph: GraphId, extra: impl Iterator<Item = Value>) -> (Module, usize) {
    let mut probe = m.clone();
    let g = &mut probe.graphs[graph];
    let base = g.outputs.len();
    g.outputs.extend(extra);
    (probe, base)
}

/// The original's and the quantized module's elements of one value.
type Pair = (Vec<f64>, Vec<f64>);

/// Both values as `f64` when they are floating-point tensors of one shape; `None` when the
/// original is not a floating-point tensor (indices, masks, shapes: not a layer).
fn comparable(a: &RtValue, b: &RtValue) -> Result<Option<Pair>, String> {
    let Some(x) = a.as_tensor().filter(|x| x.dtype.is_float()) else {
        return Ok(None);
    };
    let Some(y) = b.as_tensor() else {
        return Err("not a tensor in the quantized module".to_owned());
    };
    float_pair(x, y).map(Some)
}

fn float_pair(x: &Tensor, y: &Tensor) -> Result<Pair, String> {
    if !x.dtype.is_float() || !y.dtype.is_float() {
        return Err(format!("dtype {} vs {}", x.dtype, y.dtype));
    }
    if x.shape != y.shape {
        return Err(format!("shape {:?} vs {:?}", x.shape, y.shape));
    }
    let fx = x.to_f64().map_err(|e| e.to_string())?;
    let fy = y.to_f64().map_err(|e| e.to_string())?;
    Ok((fx, fy))
}

fn end_to_end(
    o: &Module,
    og: GraphId,
    q: &Module,
    qg: GraphId,
    samples: &[Sample],
    chosen: Option<&str>,
) -> Result<Option<EndToEnd>, ReportError> {
    let oi = Interpreter::new(o);
    let qi = Interpreter::new(q);
    let mut main: Option<(usize, String, usize)> = None;
    let mut total = Acc::default();
    let mut cos_sum = 0.0;
    let mut cos_min = f64::INFINITY;
    let mut agree = 0u64;
    let mut rows = 0u64;
    let mut top1_ok = true;
    let mut count = 0usize;
    for (s, sample) in samples.iter().enumerate() {
        let ro = run(&oi, og, sample, "original", s)?;
        let rq = run(&qi, qg, sample, "quantized", s)?;
        if main.is_none() {
            let Some(i) = main_output(&ro, chosen) else {
                return Ok(None);
            };
            let name = ro[i].0.clone();
            let j = rq.iter().position(|(n, _)| *n == name).unwrap_or(i);
            main = Some((i, name, j));
        }
        let Some((i, _, j)) = &main else {
            return Ok(None);
        };
        let (Some(a), Some(b)) = (
            ro.get(*i).and_then(|p| p.1.as_tensor()),
            rq.get(*j).and_then(|p| p.1.as_tensor()),
        ) else {
            return Ok(None);
        };
        let Ok((x, y)) = float_pair(a, b) else {
            return Ok(None);
        };
        let mut one = Acc::default();
        one.add(&x, &y);
        total.add(&x, &y);
        let c = one.cosine();
        cos_sum += c;
        cos_min = cos_min.min(c);
        count += 1;
        let width = a.shape.last().copied().unwrap_or(1);
        if width < 2 {
            top1_ok = false;
        } else {
            for (rx, ry) in x.chunks(width).zip(y.chunks(width)) {
                rows += 1;
                if argmax(rx) == argmax(ry) {
                    agree += 1;
                }
            }
        }
    }
    let Some((_, output, _)) = main else {
        return Ok(None);
    };
    Ok(Some(EndToEnd {
        output,
        samples: count,
        cosine_mean: cos_sum / count.max(1) as f64,
        cosine_min: cos_min,
        sqnr_db: total.sqnr_db(),
        top1_agreement: (top1_ok && rows > 0).then(|| agree as f64 / rows as f64),
        top1_rows: if top1_ok { rows } else { 0 },
    }))
}

/// Index of the largest value (the first on ties; NaN never wins).
fn argmax(v: &[f64]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] || v[best].is_nan() {
            best = i;
        }
    }
    best
}

fn db(x: Option<f64>) -> String {
    x.map_or_else(|| "inf".to_owned(), |d| format!("{d:.2}"))
}

impl Report {
    /// The report as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        // Serializing plain structs of numbers and strings cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// A text table: one row per layer (name, op, SQNR dB, cosine, max |error|), then the
    /// skipped values and the end-to-end figures.
    pub fn table(&self) -> String {
        let width = self
            .layers
            .iter()
            .map(|l| l.name.chars().count())
            .max()
            .unwrap_or(0)
            .clamp("layer".len(), 60);
        let opw = self
            .layers
            .iter()
            .map(|l| l.op.len())
            .max()
            .unwrap_or(0)
            .max("op".len());
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<width$}  {:<opw$}  {:>9}  {:>9}  {:>11}",
            "layer", "op", "SQNR dB", "cosine", "max |err|"
        );
        for l in &self.layers {
            let name = shorten(&l.name, width);
            let _ = write!(
                s,
                "{name:<width$}  {:<opw$}  {:>9}  {:>9.6}  {:>11.4e}",
                l.op,
                db(l.sqnr_db),
                l.cosine,
                l.max_abs_err
            );
            if l.nonfinite > 0 {
                let _ = write!(s, "  ({} non-finite)", l.nonfinite);
            }
            s.push('\n');
        }
        for k in &self.skipped {
            let _ = writeln!(s, "skipped {}: {}", k.name, k.reason);
        }
        let _ = writeln!(
            s,
            "{} layers compared on {} sample(s); {} original results have no same-named result in the quantized model",
            self.layers.len(),
            self.layer_samples,
            self.unmatched
        );
        match &self.end_to_end {
            Some(e) => {
                let top1 = e
                    .top1_agreement
                    .map_or_else(|| "n/a".to_owned(), |t| format!("{:.2}%", 100.0 * t));
                let held = if self.held_back_disjoint {
                    "held-back"
                } else {
                    "calibration (no held-back)"
                };
                let _ = writeln!(
                    s,
                    "end to end ({}, {} {held} sample(s)): cosine mean {:.6} min {:.6}, SQNR {} dB, top-1 agreement {top1} of {} rows",
                    e.output,
                    e.samples,
                    e.cosine_mean,
                    e.cosine_min,
                    db(e.sqnr_db),
                    e.top1_rows
                );
            }
            None => {
                let _ = writeln!(s, "end to end: no floating-point output to compare");
            }
        }
        s
    }
}

/// `name` cut to `width` characters, keeping its end (where layer names differ).
pub fn shorten(name: &str, width: usize) -> String {
    let n = name.chars().count();
    if n <= width {
        return name.to_owned();
    }
    let tail: String = name.chars().skip(n - (width - 1)).collect();
    format!("…{tail}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_main_output_is_the_logits_an_embedding_or_a_pooled_output() {
        let f = |n: usize| RtValue::from(Tensor::from_f32(vec![n], vec![0.0; n]).expect("t"));
        let i = RtValue::from(Tensor::from_i64(vec![2], vec![0, 1]).expect("t"));
        let outs = |names: &[(&str, RtValue)]| -> Vec<(String, RtValue)> {
            names
                .iter()
                .map(|(n, v)| ((*n).to_owned(), v.clone()))
                .collect()
        };
        let encoder = outs(&[
            ("last_hidden_state", f(8)),
            ("pooler_output", f(4)),
            ("sentence_embedding", f(4)),
        ]);
        assert_eq!(main_output(&encoder, None), Some(2));
        assert_eq!(main_output(&encoder, Some("last_hidden_state")), Some(0));
        assert_eq!(main_output(&encoder, Some("nope")), None);
        let vit = outs(&[("last_hidden_state", f(8)), ("pooler_output", f(4))]);
        assert_eq!(main_output(&vit, None), Some(1));
        let decoder = outs(&[
            ("present.0.key", f(8)),
            ("logits", f(8)),
            ("ids", i.clone()),
        ]);
        assert_eq!(main_output(&decoder, None), Some(1));
        assert_eq!(
            main_output(&decoder, Some("ids")),
            None,
            "not floating point"
        );
        let plain = outs(&[("ids", i), ("score", f(1)), ("y", f(3))]);
        assert_eq!(main_output(&plain, None), Some(2));
    }

    use super::*;

    fn parse(src: &str) -> Module {
        match mmq_ir::text::parse(src) {
            Ok((m, _)) => m,
            Err(e) => panic!("test module does not parse: {e:?}"),
        }
    }

    /// `y = Relu(x · W)`, `p = Softmax(y)`; W is 2×3.
    const ORIGINAL: &str = r#"
const $w : f32[2, 3] = dense<[0.11, -0.52, 0.93, 0.47, 0.29, -0.36]>
graph @g(%x: f32[2, 2]) -> (f32[2, 3], f32[2, 3]) {
  %h = MatMul(%x, $w) : f32[2, 3]
  %y = Relu(%h) : f32[2, 3]
  %p = Softmax(%y) {axis = -1} : f32[2, 3]
  return %y, %p
}
"#;

    /// The same with W quantized per tensor to int8 (scale 0.1) through Q/DQ, and `h` also
    /// through an activation Q/DQ; `p` is computed in int8 (a result named like the
    /// original's float one).
    const QUANTIZED: &str = r#"
const $w : f32[2, 3] = dense<[0.11, -0.52, 0.93, 0.47, 0.29, -0.36]>
const $s : f32[] = dense<[0.1]>
const $z : i8[] = dense<[0]>
graph @g(%x: f32[2, 2]) -> (f32[2, 3], i8[2, 3]) {
  %wq = QuantizeLinear($w, $s, $z) : i8[2, 3]
  %wd = DequantizeLinear(%wq, $s, $z) : f32[2, 3]
  %h = MatMul(%x, %wd) : f32[2, 3]
  %y = Relu(%h) : f32[2, 3]
  %soft = Softmax(%y) {axis = -1} : f32[2, 3]
  %p = QuantizeLinear(%soft, $s, $z) : i8[2, 3]
  return %y, %p
}
"#;

    fn sample(x: [f32; 4]) -> Sample {
        let t = Tensor::from_f32(vec![2, 2], x.to_vec()).expect("tensor");
        HashMap::from([("x".to_owned(), RtValue::from(t))])
    }

    fn samples() -> Vec<Sample> {
        vec![
            sample([1.0, 2.0, -0.5, 0.25]),
            sample([0.3, -1.5, 2.0, 1.0]),
            sample([-1.0, 0.5, 0.75, -2.0]),
            sample([0.9, 0.1, -0.2, 1.7]),
        ]
    }

    /// x·W for a 2×2 `x` and 2×3 `w`.
    fn matmul(x: &[f32; 4], w: &[f32; 6]) -> Vec<f64> {
        let mut out = Vec::new();
        for r in 0..2 {
            for c in 0..3 {
                let v = x[2 * r] * w[c] + x[2 * r + 1] * w[3 + c];
                out.push(f64::from(v));
            }
        }
        out
    }

    #[test]
    fn a_module_against_itself_is_exact() {
        let m = parse(ORIGINAL);
        let r = accuracy(&m, &m, &samples(), None).expect("report");
        assert_eq!((r.layer_samples, r.held_back_samples), (3, 1));
        assert!(r.held_back_disjoint);
        let names: Vec<&str> = r.layers.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["h", "y", "p"]);
        assert_eq!(r.layers[0].op, "MatMul");
        for l in &r.layers {
            assert_eq!((l.sqnr_db, l.cosine, l.max_abs_err), (None, 1.0, 0.0));
            assert_eq!(l.elements, 18);
        }
        let e = r.end_to_end.clone().expect("main output");
        assert_eq!(e.output, "y");
        assert_eq!((e.cosine_mean, e.cosine_min, e.sqnr_db), (1.0, 1.0, None));
        assert_eq!((e.top1_agreement, e.top1_rows), (Some(1.0), 2));
        assert_eq!(r.unmatched, 0);
        assert!(r.table().contains("inf"), "{}", r.table());
    }

    #[test]
    fn per_layer_sqnr_and_cosine_match_a_direct_computation() {
        let o = parse(ORIGINAL);
        let q = parse(QUANTIZED);
        let all = samples();
        let r = accuracy_split(&o, &q, &all, &all[..1], None).expect("report");
        // The int8 `p` is listed as skipped, not compared.
        assert_eq!(
            r.skipped,
            [Skipped {
                name: "p".into(),
                reason: "dtype f32 vs i8".into()
            }]
        );
        // The quantized weight: round(w / 0.1) * 0.1, half to even.
        let w = [0.11f32, -0.52, 0.93, 0.47, 0.29, -0.36];
        let wq = w.map(|v| (v / 0.1).round_ties_even() * 0.1);
        let (mut xx, mut ee, mut yy, mut xy) = (0.0, 0.0, 0.0, 0.0);
        for s in [
            [1.0, 2.0, -0.5, 0.25],
            [0.3, -1.5, 2.0, 1.0],
            [-1.0, 0.5, 0.75, -2.0],
            [0.9, 0.1, -0.2, 1.7],
        ] {
            for (a, b) in matmul(&s, &w).into_iter().zip(matmul(&s, &wq)) {
                xx += a * a;
                yy += b * b;
                xy += a * b;
                ee += (a - b) * (a - b);
            }
        }
        let h = &r.layers[0];
        assert_eq!((h.name.as_str(), h.elements), ("h", 24));
        let sqnr = h.sqnr_db.expect("quantization noise");
        let want = 10.0 * (xx / ee).log10();
        assert!((sqnr - want).abs() < 1e-3, "{sqnr} vs {want}");
        assert!(sqnr > 10.0 && sqnr < 60.0, "{sqnr}");
        let cos = xy / (xx * yy).sqrt();
        assert!((h.cosine - cos).abs() < 1e-6, "{} vs {cos}", h.cosine);
        assert!(h.cosine < 1.0);
        // wq differs from w by at most 0.05 per entry.
        assert!(h.max_abs_err > 0.0 && h.max_abs_err < 0.05 * 4.0);
        assert_eq!(r.layers.len(), 2);
    }

    #[test]
    fn top1_agreement_counts_rows_whose_argmax_moves() {
        let o = parse(
            r#"
graph @g(%x: f32[2, 3]) -> (f32[2, 3]) {
  %y = Identity(%x) : f32[2, 3]
  return %y
}
"#,
        );
        let q = parse(
            r#"
const $b : f32[3] = dense<[0.0, 0.0, 0.5]>
graph @g(%x: f32[2, 3]) -> (f32[2, 3]) {
  %y = Add(%x, $b) : f32[2, 3]
  return %y
}
"#,
        );
        // Row 0 keeps its arg-max (index 0); row 1 moves from 1 to 2.
        let t = Tensor::from_f32(vec![2, 3], vec![3.0, 1.0, 0.0, 0.0, 1.0, 0.8]).expect("tensor");
        let s = HashMap::from([("x".to_owned(), RtValue::from(t))]);
        let r = accuracy(&o, &q, std::slice::from_ref(&s), None).expect("report");
        assert!(!r.held_back_disjoint);
        let e = r.end_to_end.clone().expect("main output");
        assert_eq!((e.top1_agreement, e.top1_rows), (Some(0.5), 2));
        assert!(e.cosine_mean < 1.0 && e.cosine_mean > 0.9);
        assert!(
            r.table().contains("top-1 agreement 50.00% of 2 rows"),
            "{}",
            r.table()
        );
    }

    #[test]
    fn json_has_every_figure() {
        let o = parse(ORIGINAL);
        let q = parse(QUANTIZED);
        let r = accuracy(&o, &q, &samples(), None).expect("report");
        let v: serde_json::Value = serde_json::from_str(&r.to_json()).expect("valid JSON");
        assert_eq!(v["layers"][0]["name"], "h");
        assert!(v["layers"][0]["sqnr_db"].as_f64().is_some());
        assert!(v["layers"][1]["cosine"].as_f64().is_some());
        assert_eq!(v["skipped"][0]["name"], "p");
        assert_eq!(v["end_to_end"]["output"], "y");
        assert_eq!(v["end_to_end"]["top1_rows"], 2);
        assert_eq!(v["layer_samples"], 3);
    }

    #[test]
    fn errors_name_the_module_and_the_sample() {
        let m = parse(ORIGINAL);
        assert_eq!(accuracy(&m, &m, &[], None), Err(ReportError::NoSamples));
        let bad = HashMap::from([(
            "x".to_owned(),
            RtValue::from(Tensor::from_f32(vec![3], vec![0.0; 3]).expect("tensor")),
        )]);
        let err = accuracy(&m, &m, &[samples()[0].clone(), bad], None).expect_err("bad shape");
        let text = err.to_string();
        assert!(
            text.starts_with("running the original module on sample 0: input x:"),
            "{text}"
        );
        let empty = Module::default();
        assert_eq!(
            accuracy(&empty, &m, &samples(), None),
            Err(ReportError::NoEntry("original"))
        );
    }

    #[test]
    fn argmax_takes_the_first_maximum_and_ignores_nan() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0]), 1);
        assert_eq!(argmax(&[f64::NAN, 0.5, 0.2]), 1);
        assert_eq!(argmax(&[0.1, f64::NAN, 0.2]), 2);
    }
}
