//! AWQ: activation-aware scales for INT4 weight-only quantization (Lin et al., 2024).
//!
//! Weight-only INT4 rounds every weight of a block to the same grid, so the rows that meet
//! large activations (outlier input channels) cost the most output error. Scaling input
//! channel `j` of the weight up by `s_j` (and the activation down by it, see
//! [`crate::quant::smooth::migrate`]) gives those rows relatively finer steps.
//!
//! For each [`Site`] the INT4 pass will quantize, [`search`] tries
//! `s = a^α / sqrt(max(a^α) · min(a^α))` for `α` in `0, 1/grid, ..., 1`, where `a_j` is the
//! mean |x| of channel `j` over every calibration row. Each candidate weight `diag(s) · W`
//! is quantized exactly as the INT4 pass will (same block size, symmetry and range search,
//! [`crate::quant::weight_only`]'s block quantizer) and scored by the squared output error
//! `||X · diag(1/s) · Q(diag(s) · W) - X · W||²` over a sample of activation rows `X`, summed
//! over the products sharing the activation (one `s` for all of them). `α = 0` is `s = 1`, no
//! change; a site keeps it unless another `α` does strictly better. [`AwqPass`] then applies
//! the chosen scales with [`crate::quant::smooth::migrate`] (folded into a preceding
//! normalization when possible, else one `Mul`), after which the INT4 pass runs as usual.
//!
//! Counters: `awq-matmuls` (products whose weight was scaled), `folded-into-norm`,
//! `mul-inserted`, `skipped-no-stats`; one note with the mean `α` and the reduction of the
//! summed error.

use std::collections::HashMap;

use mmq_ir::{Module, Node, Op, Value, ValueDef};
use rayon::prelude::*;

use crate::dce::Dce;
use crate::pass::{Pass, PassError, PassOptions, PassReport};
use crate::quant::calibrate::ChannelStats;
use crate::quant::smooth::{self, Placement, SCALE_MAX, SCALE_MIN, Site};
use crate::quant::weight_only::{WeightOnlyConfig, quantize_block};

/// Steps of the `α` grid over `[0, 1]` (21 candidates).
pub const GRID: usize = 20;

/// Activation rows to keep per site for the error estimate.
pub const MAX_ROWS: usize = 256;

/// The outcome of the search for one site.
#[derive(Clone, Debug, PartialEq)]
pub struct Choice {
    /// The chosen `α` (0: no scaling).
    pub alpha: f32,
    /// The scales for that `α` (all 1 for `α = 0`).
    pub scales: Vec<f32>,
    /// Squared output error without scaling.
    pub error_plain: f64,
    /// Squared output error with the chosen scales.
    pub error: f64,
}

/// The candidate scales for `α`: `a^α` normalised by `sqrt(max · min)` and clamped to
/// `[SCALE_MIN, SCALE_MAX]`; zero means are raised to a millionth of the largest first.
pub fn scales_for(a_mean: &[f32], alpha: f32) -> Vec<f32> {
    if alpha == 0.0 {
        return vec![1.0; a_mean.len()];
    }
    let top = a_mean
        .iter()
        .copied()
        .filter(|v| v.is_finite())
        .fold(0f32, f32::max);
    if top <= 0.0 {
        return vec![1.0; a_mean.len()];
    }
    let floor = f64::from(top) * 1e-6;
    let raw: Vec<f64> = a_mean
        .iter()
        .map(|&v| {
            let v = if v.is_finite() { f64::from(v) } else { 0.0 };
            v.max(floor).powf(f64::from(alpha))
        })
        .collect();
    let (lo, hi) = raw
        .iter()
        .fold((f64::INFINITY, 0f64), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let norm = (lo * hi).sqrt();
    raw.iter()
        .map(|&v| ((v / norm) as f32).clamp(SCALE_MIN, SCALE_MAX))
        .collect()
}

/// `w` (`[K, N]`, row-major) quantized and dequantized the way the INT4 pass does it:
/// blocks of `config.block_size` along K per column.
pub fn fake_quantize_int4(w: &[f32], k: usize, n: usize, config: &WeightOnlyConfig) -> Vec<f32> {
    let bs = config.block_size.max(1);
    let mut out = vec![0f32; w.len()];
    let mut col = Vec::with_capacity(bs);
    let mut codes = vec![0u8; bs];
    for c in 0..n {
        for b0 in (0..k).step_by(bs) {
            let len = bs.min(k - b0);
            col.clear();
            col.extend((b0..b0 + len).map(|j| w[j * n + c]));
            let (scale, zp) = quantize_block(&col, config.symmetric, config.search, &mut codes);
            for (i, &code) in codes[..len].iter().enumerate() {
                out[(b0 + i) * n + c] = (f32::from(code) - f32::from(zp)) * scale;
            }
        }
    }
    out
}

/// `x [R, K] · w [K, N]` accumulated in f64 and subtracted from `reference [R, N]`, squared and
/// summed.
fn output_error(x: &[f32], k: usize, w: &[f32], n: usize, reference: &[f64]) -> f64 {
    let mut err = 0.0;
    let mut y = vec![0f64; n];
    for (xr, rr) in x.chunks_exact(k).zip(reference.chunks_exact(n)) {
        y.iter_mut().for_each(|v| *v = 0.0);
        for (&xv, wr) in xr.iter().zip(w.chunks_exact(n)) {
            if xv == 0.0 {
                continue;
            }
            let xv = f64::from(xv);
            for (yv, &wv) in y.iter_mut().zip(wr) {
                *yv += xv * f64::from(wv);
            }
        }
        err += y
            .iter()
            .zip(rr)
            .map(|(a, b)| (a - b) * (a - b))
            .sum::<f64>();
    }
    err
}

/// Searches the scales of one site: `rows` is `[R, k]` (activation rows), `a_mean` the mean |x|
/// per channel, `weights` the `[k, n]` weights sharing the activation with their `n`.
pub fn search(
    rows: &[f32],
    k: usize,
    a_mean: &[f32],
    weights: &[(Vec<f32>, usize)],
    config: &WeightOnlyConfig,
    grid: usize,
) -> Choice {
    let grid = grid.max(1);
    let references: Vec<Vec<f64>> = weights
        .iter()
        .map(|(w, n)| {
            let mut r = vec![0f64; rows.len() / k.max(1) * n];
            for (xr, rr) in rows.chunks_exact(k).zip(r.chunks_exact_mut(*n)) {
                for (&xv, wr) in xr.iter().zip(w.chunks_exact(*n)) {
                    for (o, &wv) in rr.iter_mut().zip(wr) {
                        *o += f64::from(xv) * f64::from(wv);
                    }
                }
            }
            r
        })
        .collect();
    let evaluate = |alpha: f32| -> (Vec<f32>, f64) {
        let s = scales_for(a_mean, alpha);
        let xs: Vec<f32> = rows
            .chunks_exact(k)
            .flat_map(|r| r.iter().zip(&s).map(|(x, sj)| x / sj))
            .collect();
        let mut err = 0.0;
        for ((w, n), reference) in weights.iter().zip(&references) {
            let scaled: Vec<f32> = w
                .chunks_exact(*n)
                .zip(&s)
                .flat_map(|(row, &sj)| row.iter().map(move |v| v * sj))
                .collect();
            let q = fake_quantize_int4(&scaled, k, *n, config);
            err += output_error(&xs, k, &q, *n, reference);
        }
        (s, err)
    };
    let results: Vec<(f32, Vec<f32>, f64)> = (0..=grid)
        .into_par_iter()
        .map(|i| {
            let alpha = i as f32 / grid as f32;
            let (s, e) = evaluate(alpha);
            (alpha, s, e)
        })
        .collect();
    let error_plain = results[0].2;
    let mut best = 0;
    for (i, r) in results.iter().enumerate().skip(1) {
        if r.2 < results[best].2 {
            best = i;
        }
    }
    let (alpha, scales, error) = results[best].clone();
    Choice {
        alpha,
        scales,
        error_plain,
        error,
    }
}

/// Whether the INT4 pass quantizes `node` as far as the activation goes: a `MatMul` or `Gemm`
/// whose activation has rank 2 or more (or an unknown rank), and a `Gemm`'s `C` is absent
/// or constant.
fn int4_candidate(m: &Module, node: Node) -> bool {
    let nd = &m.nodes[node];
    let rank_ok = nd
        .inputs
        .first()
        .copied()
        .flatten()
        .is_some_and(|x| m.value_type(x).shape().is_none_or(|s| s.len() >= 2));
    match nd.op {
        Op::MatMul {} => rank_ok,
        Op::Gemm { .. } => {
            rank_ok
                && nd
                    .inputs
                    .get(2)
                    .copied()
                    .flatten()
                    .is_none_or(|c| matches!(m.values[c].def, ValueDef::Const(_)))
        }
        _ => false,
    }
}

/// The sites AWQ searches: those of [`smooth::sites`] restricted to products the INT4 pass
/// quantizes.
pub fn sites(m: &Module) -> Vec<Site> {
    smooth::sites_where(m, &int4_candidate)
}

/// AWQ (see the module documentation), run before the INT4 pass with the same configuration.
#[derive(Clone, Debug)]
pub struct AwqPass {
    config: WeightOnlyConfig,
    stats: HashMap<Value, ChannelStats>,
    grid: usize,
}

impl AwqPass {
    /// A pass searching with the INT4 settings `config` on per-channel statistics of the site
    /// activations ([`sites`]; the statistics need a row sample, see
    /// [`crate::quant::calibrate::channel_stats`]).
    pub fn new(config: WeightOnlyConfig, stats: HashMap<Value, ChannelStats>) -> Self {
        AwqPass {
            config,
            stats,
            grid: GRID,
        }
    }
}

impl Pass for AwqPass {
    fn name(&self) -> &str {
        "awq"
    }

    fn run(&self, m: &mut Module, opts: &PassOptions) -> Result<PassReport, PassError> {
        let fail = |message: String| PassError::Failed {
            pass: self.name().to_owned(),
            message,
        };
        let bs = self.config.block_size;
        if !(16..=256).contains(&bs) || !bs.is_power_of_two() {
            return Err(fail(format!(
                "block size {bs} must be a power of two from 16 to 256"
            )));
        }
        let mut report = PassReport::default();
        let (mut scaled, mut folded, mut muls) = (0, 0, 0);
        let (mut searched, mut alpha_sum) = (0usize, 0f64);
        let (mut plain_sum, mut best_sum) = (0f64, 0f64);
        for site in sites(m) {
            let Some(st) = self
                .stats
                .get(&site.x)
                .filter(|st| st.channels == site.k && st.sampled_rows() > 0)
            else {
                report.count("skipped-no-stats", site.consumers.len());
                continue;
            };
            let mut weights = Vec::with_capacity(site.consumers.len());
            for c in &site.consumers {
                weights.push((smooth::weight_kn(m, c).map_err(&fail)?, c.n));
            }
            let choice = search(
                &st.row_sample,
                site.k,
                &st.abs_mean(),
                &weights,
                &self.config,
                self.grid,
            );
            searched += 1;
            alpha_sum += f64::from(choice.alpha);
            plain_sum += choice.error_plain;
            best_sum += choice.error;
            if choice.alpha == 0.0 {
                continue;
            }
            match smooth::migrate(m, &site, &choice.scales).map_err(&fail)? {
                Placement::Folded(_) => folded += 1,
                Placement::Mul(_) => muls += 1,
            }
            scaled += site.consumers.len();
        }
        report.count("awq-matmuls", scaled);
        report.count("folded-into-norm", folded);
        report.count("mul-inserted", muls);
        let mean_alpha = if searched > 0 {
            alpha_sum / searched as f64
        } else {
            0.0
        };
        let reduced = if plain_sum > 0.0 {
            100.0 * (1.0 - best_sum / plain_sum)
        } else {
            0.0
        };
        report.notes.push(format!(
            "{scaled} matmuls scaled, mean alpha {mean_alpha:.2}, error reduced {reduced:.1}%"
        ));
        if report.changed {
            let dce = Dce.run(m, opts)?;
            for (k, v) in dce.counters {
                report.count(&k, v);
            }
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_are_normalised_and_alpha_zero_is_identity() {
        let a = [1.0, 4.0, 16.0, 0.0];
        assert_eq!(scales_for(&a, 0.0), vec![1.0; 4]);
        let s = scales_for(&a, 0.5);
        // a^0.5 = 1, 2, 4, 0.004 (floor 16e-6 ^ 0.5); max * min = 4 * 0.004.
        let hi = s.iter().copied().fold(0f32, f32::max);
        let lo = s.iter().copied().fold(f32::INFINITY, f32::min);
        assert!((hi * lo - 1.0).abs() < 1e-4, "{s:?}");
        assert!((s[1] / s[0] - 2.0).abs() < 1e-5 && (s[2] / s[1] - 2.0).abs() < 1e-5);
    }

    #[test]
    fn fake_quantization_matches_the_block_quantizer() {
        // One column of 32 values: symmetric scale = max / -8 with the value of largest
        // magnitude (here -3.2) mapping to code 0.
        let w: Vec<f32> = (0..32).map(|i| (i as f32 - 16.0) * 0.2).collect();
        let cfg = WeightOnlyConfig {
            search: false,
            ..WeightOnlyConfig::default()
        };
        let q = fake_quantize_int4(&w, 32, 1, &cfg);
        let step = 3.2 / 8.0;
        for (a, b) in w.iter().zip(&q) {
            assert!((a - b).abs() <= step / 2.0 + 1e-6, "{a} -> {b}");
            assert!(((b / step).round() * step - b).abs() < 1e-5);
        }
        assert_eq!(q[0], -3.2);
    }

    #[test]
    fn search_prefers_scaling_when_channels_have_outliers() {
        // 64 channels, 3 of them 50x larger; random-looking weights.
        let (k, n, r) = (64, 16, 64);
        let mut state = 7u64;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
        };
        let w: Vec<f32> = (0..k * n).map(|_| next()).collect();
        let rows: Vec<f32> = (0..r * k)
            .map(|i| {
                let v = next();
                if [3, 17, 40].contains(&(i % k)) {
                    v * 50.0
                } else {
                    v
                }
            })
            .collect();
        let mut a = vec![0f32; k];
        for row in rows.chunks_exact(k) {
            for (m, x) in a.iter_mut().zip(row) {
                *m += x.abs() / r as f32;
            }
        }
        let choice = search(&rows, k, &a, &[(w, n)], &WeightOnlyConfig::default(), GRID);
        assert!(choice.alpha > 0.0, "{choice:?}");
        assert!(
            choice.error < 0.8 * choice.error_plain,
            "{} vs {}",
            choice.error,
            choice.error_plain
        );
    }
}
