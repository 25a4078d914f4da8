//! Activation granularity and symmetry, layer by layer: what one scale per tensor (symmetric i8,
//! or asymmetric u8 as `DynamicQuantizeLinear` computes it) costs against one scale per row (per
//! token for language, per patch for vision), for every `MatMul` with a constant weight, with the
//! weight quantized per channel to INT8 in every variant so that only the activation differs.
//! Errors are measured on the layer's own output (SQNR and cosine of `Â·Ŵ` against `A·W`) over
//! the given samples, and summarized per modality.

use mmq_ir::modality::{self, Modality};
use mmq_ir::{GraphId, Module, Op, Value, ValueDef};
use mmq_kernels::{Interpreter, Tensor};
use serde::Serialize;

use crate::quant::calibrate::Sample;
use crate::quant::int8::quantize_weight_per_channel;

/// Rows of one activation used per sample (the first ones), to bound the work on long inputs.
const MAX_ROWS: usize = 256;

/// Error of one variant on one layer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Error {
    /// Signal-to-quantization-noise ratio of the layer output, dB.
    pub sqnr_db: f64,
    /// Cosine of the layer output against float.
    pub cosine: f64,
}

#[derive(Clone, Copy, Debug, Default)]
struct Acc {
    ss: f64,
    ee: f64,
    dot: f64,
    qq: f64,
}

impl Acc {
    fn add(&mut self, y: f64, q: f64) {
        self.ss += y * y;
        self.ee += (y - q) * (y - q);
        self.dot += y * q;
        self.qq += q * q;
    }

    fn error(&self) -> Error {
        Error {
            sqnr_db: if self.ee == 0.0 {
                f64::INFINITY
            } else {
                10.0 * (self.ss / self.ee).log10()
            },
            cosine: if self.ss == 0.0 || self.qq == 0.0 {
                1.0
            } else {
                self.dot / (self.ss.sqrt() * self.qq.sqrt())
            },
        }
    }
}

/// One layer's errors.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Layer {
    /// The node.
    pub node: String,
    /// Its modality.
    pub modality: &'static str,
    /// What one scale per row is called for this layer (`per-token`, `per-patch`).
    pub per_row_name: &'static str,
    /// One symmetric scale per tensor.
    pub per_tensor_symmetric: Error,
    /// One asymmetric scale and zero point per tensor.
    pub per_tensor_asymmetric: Error,
    /// One symmetric scale per row.
    pub per_row: Error,
}

/// Means over the layers of one modality.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModalitySummary {
    /// The modality.
    pub modality: &'static str,
    /// Layers.
    pub layers: usize,
    /// Mean SQNR, dB: per tensor symmetric, per tensor asymmetric, per row.
    pub mean_sqnr_db: [f64; 3],
    /// Lowest cosine, in the same order.
    pub min_cosine: [f64; 3],
}

/// The analysis of one graph.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Analysis {
    /// The graph.
    pub graph: String,
    /// Samples used.
    pub samples: usize,
    /// Per layer, in node order.
    pub layers: Vec<Layer>,
    /// Per modality.
    pub modalities: Vec<ModalitySummary>,
}

struct Site {
    node: String,
    modality: Modality,
    act: Value,
    k: usize,
    n: usize,
    /// Dequantized per-channel INT8 weight `[k, n]`.
    w: Vec<f64>,
}

fn sites(
    m: &Module,
    graph: GraphId,
    overrides: &[(String, Modality)],
) -> Result<Vec<Site>, String> {
    let labels = modality::analyze(m, graph, overrides).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for &n in m.graphs[graph].nodes() {
        let nd = &m.nodes[n];
        if !matches!(nd.op, Op::MatMul {}) {
            continue;
        }
        let (Some(Some(act)), Some(Some(wv))) = (nd.inputs.first(), nd.inputs.get(1)) else {
            continue;
        };
        if matches!(m.values[*act].def, ValueDef::Const(_)) {
            continue;
        }
        let Some(c) = m.const_source(*wv) else {
            continue;
        };
        let data = &m.consts[c];
        if data.shape.len() != 2 || !data.dtype.is_float() {
            continue;
        }
        let (k, cols) = (data.shape[0] as usize, data.shape[1] as usize);
        let w = Tensor::from_const(data)
            .and_then(|t| t.to_f32())
            .map_err(|e| e.to_string())?;
        // Per output column, symmetric, [-127, 127]: the INT8 pass's own weight quantization.
        let (codes, scales) = quantize_weight_per_channel(&w, &[k, cols], 1, 127);
        let deq: Vec<f64> = codes
            .iter()
            .enumerate()
            .map(|(i, &q)| f64::from(q) * f64::from(scales[i % cols]))
            .collect();
        out.push(Site {
            node: nd.name.clone().unwrap_or_else(|| format!("{n:?}")),
            modality: labels.node(n),
            act: *act,
            k,
            n: cols,
            w: deq,
        });
    }
    Ok(out)
}

fn quant_sym(xs: &[f64], amax: f64) -> impl Iterator<Item = f64> + '_ {
    let s = if amax > 0.0 { amax / 127.0 } else { 1.0 };
    xs.iter()
        .map(move |x| (x / s).round_ties_even().clamp(-127.0, 127.0) * s)
}

/// `DynamicQuantizeLinear`'s u8 scale and zero point over the tensor.
fn quant_asym(xs: &[f64]) -> Vec<f64> {
    let lo = xs.iter().fold(0f64, |a, &x| a.min(x));
    let hi = xs.iter().fold(0f64, |a, &x| a.max(x));
    let s = if hi > lo { (hi - lo) / 255.0 } else { 1.0 };
    let zp = (-lo / s).round_ties_even().clamp(0.0, 255.0);
    xs.iter()
        .map(|x| ((x / s).round_ties_even() + zp).clamp(0.0, 255.0) - zp)
        .map(|q| q * s)
        .collect()
}

/// Analyzes top-level graph `graph` of `m` (unquantized) on `samples`.
pub fn analyze(
    m: &Module,
    graph: GraphId,
    samples: &[Sample],
    overrides: &[(String, Modality)],
) -> Result<Analysis, String> {
    let sites = sites(m, graph, overrides)?;
    let mut probe = m.clone();
    let n_out = probe.graphs[graph].outputs.len();
    probe.graphs[graph]
        .outputs
        .extend(sites.iter().map(|s| s.act));
    let interp = Interpreter::new(&probe);
    let mut accs = vec![[Acc::default(); 3]; sites.len()];
    for (i, sample) in samples.iter().enumerate() {
        let outs = interp
            .run(graph, sample)
            .map_err(|e| format!("sample {i}: {e}"))?;
        for ((_, v), (site, acc)) in outs
            .into_iter()
            .skip(n_out)
            .zip(sites.iter().zip(&mut accs))
        {
            let Some(xs) = v.as_tensor().and_then(|t| t.to_f64().ok()) else {
                continue;
            };
            let rows = (xs.len() / site.k.max(1)).min(MAX_ROWS);
            let a = &xs[..rows * site.k];
            let amax = a.iter().fold(0f64, |m, x| m.max(x.abs()));
            let sym: Vec<f64> = quant_sym(a, amax).collect();
            let asym = quant_asym(a);
            let row: Vec<f64> = a
                .chunks(site.k)
                .flat_map(|r| {
                    let amax = r.iter().fold(0f64, |m, x| m.max(x.abs()));
                    quant_sym(r, amax).collect::<Vec<_>>()
                })
                .collect();
            for r in 0..rows {
                for j in 0..site.n {
                    let dot = |v: &[f64], w: &[f64]| {
                        (0..site.k)
                            .map(|i| v[r * site.k + i] * w[i * site.n + j])
                            .sum::<f64>()
                    };
                    // The float reference uses the quantized weight too: only the activation's
                    // quantization differs between the variants.
                    let y = dot(a, &site.w);
                    acc[0].add(y, dot(&sym, &site.w));
                    acc[1].add(y, dot(&asym, &site.w));
                    acc[2].add(y, dot(&row, &site.w));
                }
            }
        }
    }
    let layers: Vec<Layer> = sites
        .iter()
        .zip(&accs)
        .map(|(s, a)| Layer {
            node: s.node.clone(),
            modality: s.modality.name(),
            per_row_name: if s.modality == Modality::Vision {
                "per-patch"
            } else {
                "per-token"
            },
            per_tensor_symmetric: a[0].error(),
            per_tensor_asymmetric: a[1].error(),
            per_row: a[2].error(),
        })
        .collect();
    let mut modalities = Vec::new();
    for md in Modality::ALL {
        let of: Vec<&Layer> = layers.iter().filter(|l| l.modality == md.name()).collect();
        if of.is_empty() {
            continue;
        }
        let pick = |l: &Layer, i: usize| match i {
            0 => l.per_tensor_symmetric,
            1 => l.per_tensor_asymmetric,
            _ => l.per_row,
        };
        let finite = |x: f64| if x.is_finite() { x } else { 200.0 };
        let mean =
            |i: usize| of.iter().map(|l| finite(pick(l, i).sqnr_db)).sum::<f64>() / of.len() as f64;
        let min = |i: usize| of.iter().map(|l| pick(l, i).cosine).fold(1.0, f64::min);
        modalities.push(ModalitySummary {
            modality: md.name(),
            layers: of.len(),
            mean_sqnr_db: [mean(0), mean(1), mean(2)],
            min_cosine: [min(0), min(1), min(2)],
        });
    }
    Ok(Analysis {
        graph: m.graphs[graph].name.clone(),
        samples: samples.len(),
        layers,
        modalities,
    })
}

impl Analysis {
    /// The per-modality table and the per-layer table, as text.
    pub fn table(&self) -> String {
        let mut s = format!(
            "activation granularity and symmetry, graph '{}' ({} samples; INT8, weights per channel; SQNR dB / cosine of each MatMul's output):\n",
            self.graph, self.samples
        );
        s += &format!(
            "  {:<10} {:>6} {:>22} {:>22} {:>22}\n",
            "modality",
            "layers",
            "per-tensor symmetric",
            "per-tensor asymmetric",
            "per-token/per-patch"
        );
        for md in &self.modalities {
            let cell = |i: usize| format!("{:.2} / {:.5}", md.mean_sqnr_db[i], md.min_cosine[i]);
            s += &format!(
                "  {:<10} {:>6} {:>22} {:>22} {:>22}\n",
                md.modality,
                md.layers,
                cell(0),
                cell(1),
                cell(2)
            );
        }
        for l in &self.layers {
            let cell = |e: Error| format!("{:.2} / {:.5}", e.sqnr_db, e.cosine);
            s += &format!(
                "  {:<40} {:<7} {:>20} {:>20} {:>20} ({})\n",
                crate::quant::report::shorten(&l.node, 40),
                l.modality,
                cell(l.per_tensor_symmetric),
                cell(l.per_tensor_asymmetric),
                cell(l.per_row),
                l.per_row_name
            );
        }
        s
    }
}
