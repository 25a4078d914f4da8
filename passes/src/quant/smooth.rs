//! Scale migration between activations and weights, and SmoothQuant.
//!
//! A `MatMul` `X · W` (or `Gemm` with a constant `B`) computes the same function when input
//! channel `j` of the activation is divided by `s_j` and row `j` of the weight is multiplied
//! by it: `(X · diag(1/s)) · (diag(s) · W) = X · W`. [`migrate`] applies such a scale to one
//! [`Site`] (an activation and the constant-weight products it feeds) and puts `X / s` where it
//! costs nothing when it can:
//!
//! - **folded into the producing normalization** when `X` is the first result of
//!   `LayerNormalization`, `RMSNormalization`, `SimplifiedLayerNormalization` (default or
//!   `com.microsoft` domain), `com.microsoft.SkipLayerNormalization` or
//!   `com.microsoft.SkipSimplifiedLayerNormalization` over the last axis, with constant
//!   per-channel gamma (and beta), **and** every use of `X` anywhere in the module is one of
//!   the site's products (and `X` is no graph output): gamma and beta are divided by `s`;
//! - **otherwise** by one `Mul(X, 1/s)` in front of the site's products (shared by them).
//!
//! New weights, gammas and betas are new constants (the originals may be shared with other
//! nodes); the originals left unused are removed by dead code elimination.
//!
//! [`SmoothQuantPass`] chooses `s` as SmoothQuant does (Xiao et al., 2023): per channel,
//! `s_j = max|X_j|^α / max|W_j|^(1-α)`, with `max|X_j|` from calibration
//! ([`crate::quant::calibrate::channel_stats`]) and `max|W_j|` over the row `j` of every weight
//! of the site (the Q, K and V projections of one norm output share one `s`). Activation outlier
//! channels then move into the weights, which per-channel INT8 weights absorb, and per-tensor
//! INT8 activations lose less to a few large channels.
//!
//! Sites: the `MatMul` nodes with a constant 2-d f32 weight `[K, N]` and the `Gemm` nodes
//! (`transA` 0) with a constant 2-d f32 `B` (`[K, N]`, or `[N, K]` with `transB`) of the
//! top-level graphs, whose f32 activation is not a constant and not the result of a
//! `DequantizeLinear` (quantization-aware models keep their Q/DQ pairs). Products sharing one
//! activation form one site.
//!
//! Counters: `smoothed-matmuls`, `folded-into-norm`, `mul-inserted`, `skipped-no-stats`.

use std::collections::HashMap;

use bytes::Bytes;
use mmq_ir::edit::NewNode;
use mmq_ir::{At, Const, ConstData, DType, GraphId, Module, Node, Op, Storage, Value, ValueDef};
use mmq_kernels::Tensor;

use crate::dce::Dce;
use crate::pass::{Pass, PassError, PassOptions, PassReport};
use crate::quant::calibrate::ChannelStats;

/// Scales are clamped to `[SCALE_MIN, SCALE_MAX]`.
pub const SCALE_MIN: f32 = 1e-5;
/// Scales are clamped to `[SCALE_MIN, SCALE_MAX]`.
pub const SCALE_MAX: f32 = 1e5;

/// One constant-weight product fed by a site's activation.
#[derive(Clone, Debug, PartialEq)]
pub struct Consumer {
    /// The `MatMul` or `Gemm` node.
    pub node: Node,
    /// Its weight constant.
    pub weight: Const,
    /// The weight is `[N, K]` (`Gemm` with `transB`).
    pub trans: bool,
    /// Output channels.
    pub n: usize,
}

/// An activation and the constant-weight products it feeds, which share one scale.
#[derive(Clone, Debug, PartialEq)]
pub struct Site {
    /// The top-level graph holding the products.
    pub graph: GraphId,
    /// The activation `X`.
    pub x: Value,
    /// Input channels (the last axis of `X`, the `K` of every weight).
    pub k: usize,
    /// The products, in graph order.
    pub consumers: Vec<Consumer>,
}

/// Where [`migrate`] put `X / s`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Into the gamma (and beta) of this normalization node.
    Folded(Node),
    /// Into this new `Mul` node.
    Mul(Node),
}

/// The consumer form of `node`, when it is a product the migration applies to.
fn consumer(m: &Module, node: Node) -> Option<(Value, usize, Consumer)> {
    let nd = &m.nodes[node];
    let trans = match &nd.op {
        Op::MatMul {} => false,
        Op::Gemm {
            trans_a, trans_b, ..
        } if trans_a.unwrap_or(0) == 0 => trans_b.unwrap_or(0) != 0,
        _ => return None,
    };
    let x = nd.inputs.first().copied().flatten()?;
    let w = nd.inputs.get(1).copied().flatten()?;
    let ValueDef::Const(c) = m.values[w].def else {
        return None;
    };
    let cd = &m.consts[c];
    if cd.dtype != DType::F32 || cd.shape.len() != 2 || cd.shape.iter().any(|&d| d <= 0) {
        return None;
    }
    if !matches!(cd.storage, Storage::Inline(_) | Storage::External { .. }) {
        return None;
    }
    match m.values[x].def {
        ValueDef::Const(_) => return None,
        ValueDef::Output { node: p, .. }
            if matches!(m.nodes[p].op, Op::DequantizeLinear { .. }) =>
        {
            return None;
        }
        _ => {}
    }
    let ty = m.value_type(x);
    if ty.dtype() != Some(DType::F32) {
        return None;
    }
    let (r, c2) = (cd.shape[0] as usize, cd.shape[1] as usize);
    let (k, n) = if trans { (c2, r) } else { (r, c2) };
    if let Some(shape) = ty.shape()
        && let Some(last) = shape.last()
        && let Some(known) = last.as_known()
        && known != k as i64
    {
        return None;
    }
    Some((
        x,
        k,
        Consumer {
            node,
            weight: c,
            trans,
            n,
        },
    ))
}

/// The sites of the top-level graphs, in graph order, keeping the products `accept` takes.
pub fn sites_where(m: &Module, accept: &dyn Fn(&Module, Node) -> bool) -> Vec<Site> {
    let mut out: Vec<Site> = Vec::new();
    for e in &m.entries {
        let mut index: HashMap<Value, usize> = HashMap::new();
        let start = out.len();
        for &node in m.graphs[e.graph].nodes() {
            if !accept(m, node) {
                continue;
            }
            let Some((x, k, c)) = consumer(m, node) else {
                continue;
            };
            match index.get(&x) {
                Some(&i) if out[i].k == k => out[i].consumers.push(c),
                Some(_) => {}
                None => {
                    index.insert(x, out.len());
                    out.push(Site {
                        graph: e.graph,
                        x,
                        k,
                        consumers: vec![c],
                    });
                }
            }
        }
        debug_assert!(out[start..].iter().all(|s| s.graph == e.graph));
    }
    out
}

/// Every site of the top-level graphs (see the module documentation).
pub fn sites(m: &Module) -> Vec<Site> {
    sites_where(m, &|_, _| true)
}

/// The activations of `sites` grouped per top-level graph: what calibration must observe.
pub fn site_activations(m: &Module, sites: &[Site]) -> Vec<(GraphId, Vec<Value>)> {
    m.entries
        .iter()
        .map(|e| {
            let vals = sites
                .iter()
                .filter(|s| s.graph == e.graph)
                .map(|s| s.x)
                .collect();
            (e.graph, vals)
        })
        .collect()
}

/// A consumer's weight as row-major `[K, N]` (transposed from `[N, K]` when `trans`).
pub(crate) fn weight_kn(m: &Module, c: &Consumer) -> Result<Vec<f32>, String> {
    let cd = &m.consts[c.weight];
    let t = Tensor::from_const(cd).map_err(|e| {
        format!(
            "weight '{}': {e}",
            cd.name.as_deref().unwrap_or("(unnamed)")
        )
    })?;
    let w = t.to_f32().map_err(|e| e.to_string())?;
    if !c.trans {
        return Ok(w);
    }
    let k = w.len() / c.n.max(1);
    let mut out = vec![0f32; w.len()];
    for (r, row) in w.chunks_exact(k).enumerate() {
        for (j, &v) in row.iter().enumerate() {
            out[j * c.n + r] = v;
        }
    }
    Ok(out)
}

/// Largest |w| of each row `j` (input channel) over the `[K, N]` weights of `site`.
pub(crate) fn weight_row_abs_max(m: &Module, site: &Site) -> Result<Vec<f32>, String> {
    let mut mx = vec![0f32; site.k];
    for c in &site.consumers {
        let w = weight_kn(m, c)?;
        for (j, row) in w.chunks_exact(c.n).enumerate().take(site.k) {
            for &v in row {
                if v.is_finite() {
                    mx[j] = mx[j].max(v.abs());
                }
            }
        }
    }
    Ok(mx)
}

/// SmoothQuant's scales: `s_j = x_j^α / w_j^(1-α)` clamped to `[SCALE_MIN, SCALE_MAX]`, and 1
/// where `x_j` or `w_j` is 0 (or not finite).
pub fn smooth_scales(x_abs_max: &[f32], w_abs_max: &[f32], alpha: f32) -> Vec<f32> {
    x_abs_max
        .iter()
        .zip(w_abs_max)
        .map(|(&x, &w)| {
            if !(x.is_finite() && w.is_finite()) || x <= 0.0 || w <= 0.0 {
                return 1.0;
            }
            let s = (f64::from(x).powf(f64::from(alpha))
                / f64::from(w).powf(f64::from(1.0 - alpha))) as f32;
            if s.is_finite() {
                s.clamp(SCALE_MIN, SCALE_MAX)
            } else {
                1.0
            }
        })
        .collect()
}

/// Whether `axis` (default -1) is the last of `rank` axes (true when the rank is unknown and
/// the axis is -1).
fn is_last_axis(axis: i64, rank: Option<usize>) -> bool {
    match rank {
        Some(r) => axis == -1 || axis == r as i64 - 1,
        None => axis == -1,
    }
}

/// The positions of the per-channel parameters (gamma, then beta) of normalization `node`
/// over the last axis, when it is one whose first result scales with them.
fn norm_params(m: &Module, node: Node) -> Option<Vec<usize>> {
    let nd = &m.nodes[node];
    let rank = nd
        .inputs
        .first()
        .copied()
        .flatten()
        .and_then(|x| m.value_type(x).shape().map(<[_]>::len));
    match &nd.op {
        Op::LayerNormalization { axis, .. } => {
            is_last_axis(axis.unwrap_or(-1), rank).then(|| vec![1, 2])
        }
        Op::RMSNormalization { axis, .. } => {
            is_last_axis(axis.unwrap_or(-1), rank).then(|| vec![1])
        }
        Op::SimplifiedLayerNormalization { axis, .. } => {
            is_last_axis(axis.unwrap_or(-1), rank).then(|| vec![1])
        }
        Op::SkipLayerNormalization { .. } => Some(vec![2, 3]),
        Op::SkipSimplifiedLayerNormalization { .. } => Some(vec![2]),
        _ => None,
    }
}

/// The normalization `X / s` folds into for `site`, with the constants to divide and their
/// input positions (see the module documentation).
fn fold_target(m: &Module, site: &Site) -> Option<(Node, Vec<(usize, Const)>)> {
    let ValueDef::Output {
        node: norm,
        index: 0,
    } = m.values[site.x].def
    else {
        return None;
    };
    if m.nodes[norm].graph != site.graph {
        return None;
    }
    let positions = norm_params(m, norm)?;
    let mut params = Vec::new();
    for (i, &pos) in positions.iter().enumerate() {
        let Some(v) = m.nodes[norm].inputs.get(pos).copied().flatten() else {
            if i == 0 {
                return None; // gamma is required
            }
            continue;
        };
        let ValueDef::Const(c) = m.values[v].def else {
            return None;
        };
        let cd = &m.consts[c];
        if cd.dtype != DType::F32
            || cd.num_elements() != site.k
            || cd.shape.last().copied() != Some(site.k as i64)
        {
            return None;
        }
        params.push((pos, c));
    }
    // Every use of X, in every graph (subgraphs read outer values), must be one of the
    // site's products, and X no graph's output.
    let mine: Vec<Node> = site.consumers.iter().map(|c| c.node).collect();
    for (_, g) in m.graphs.iter() {
        if g.outputs.contains(&site.x) {
            return None;
        }
        for &n in g.nodes() {
            if m.nodes[n].inputs.contains(&Some(site.x)) && !mine.contains(&n) {
                return None;
            }
        }
    }
    Some((norm, params))
}

/// `base` followed by `_smoothed`, with a number appended if a value of the module already
/// has that name (value names are unique within a graph tree).
fn fresh_name(m: &Module, base: &str) -> String {
    let taken: std::collections::HashSet<&str> = m
        .values
        .iter()
        .filter_map(|(_, v)| v.name.as_deref())
        .collect();
    let first = format!("{base}_smoothed");
    if !taken.contains(first.as_str()) {
        return first;
    }
    (1..)
        .map(|i| format!("{base}_smoothed_{i}"))
        .find(|n| !taken.contains(n.as_str()))
        .unwrap_or(first)
}

fn f32_const(m: &mut Module, name: Option<String>, shape: Vec<i64>, vals: &[f32]) -> Value {
    let name = name.map(|n| fresh_name(m, &n));
    let bytes: Vec<u8> = vals.iter().flat_map(|x| x.to_le_bytes()).collect();
    m.add_const(ConstData::new(
        name,
        DType::F32,
        shape,
        Storage::Inline(Bytes::from(bytes)),
    ))
}

/// Scales input channel `j` of `site`'s activation by `1 / s_j` and row `j` of each of its
/// weights by `s_j` (see the module documentation): the function the graph computes does not
/// change (up to rounding). `s` has `site.k` finite, positive entries.
pub(crate) fn migrate(m: &mut Module, site: &Site, s: &[f32]) -> Result<Placement, String> {
    if s.len() != site.k {
        return Err(format!(
            "{} scales for an activation of {} channels",
            s.len(),
            site.k
        ));
    }
    if let Some(bad) = s.iter().find(|v| !(v.is_finite() && **v > 0.0)) {
        return Err(format!("scale {bad} is not finite and positive"));
    }
    // Weights first (reading every one before changing anything).
    let mut new_weights = Vec::with_capacity(site.consumers.len());
    for c in &site.consumers {
        let cd = &m.consts[c.weight];
        let t = Tensor::from_const(cd).map_err(|e| e.to_string())?;
        let mut w = t.to_f32().map_err(|e| e.to_string())?;
        if c.trans {
            // [N, K]: column j.
            for row in w.chunks_exact_mut(site.k) {
                for (v, &sj) in row.iter_mut().zip(s) {
                    *v *= sj;
                }
            }
        } else {
            for (row, &sj) in w.chunks_exact_mut(c.n).zip(s) {
                for v in row {
                    *v *= sj;
                }
            }
        }
        let name = cd.name.clone();
        new_weights.push((name, cd.shape.clone(), w));
    }
    let fold = fold_target(m, site);
    let mut params = Vec::new();
    if let Some((_, ps)) = &fold {
        for &(pos, c) in ps {
            let cd = &m.consts[c];
            let t = Tensor::from_const(cd).map_err(|e| e.to_string())?;
            let vals: Vec<f32> = t
                .to_f32()
                .map_err(|e| e.to_string())?
                .iter()
                .zip(s)
                .map(|(v, sj)| v / sj)
                .collect();
            let name = cd.name.clone();
            params.push((pos, name, cd.shape.clone(), vals));
        }
    }
    for (c, (name, shape, w)) in site.consumers.iter().zip(new_weights) {
        let v = f32_const(m, name, shape, &w);
        m.set_operand(c.node, 1, Some(v));
    }
    if let Some((norm, _)) = fold {
        for (pos, name, shape, vals) in params {
            let v = f32_const(m, name, shape, &vals);
            m.set_operand(norm, pos, Some(v));
        }
        // The result now holds X / s: a new name, so nothing matches it with the old X.
        if let Some(name) = m.values[site.x].name.clone() {
            m.values[site.x].name = Some(fresh_name(m, &name));
        }
        return Ok(Placement::Folded(norm));
    }
    let inv: Vec<f32> = s.iter().map(|v| 1.0 / v).collect();
    let base = m.values[site.x]
        .name
        .clone()
        .unwrap_or_else(|| "act".to_owned());
    let inv_v = f32_const(
        m,
        Some(format!("{base}_inv_scale")),
        vec![site.k as i64],
        &inv,
    );
    let ty = m.value_type(site.x).clone();
    // The Mul goes right before the first product (in list order).
    let list = m.graphs[site.graph].nodes();
    let first = site
        .consumers
        .iter()
        .filter_map(|c| list.iter().position(|&n| n == c.node))
        .min()
        .map_or(At::End, |p| At::Before(list[p]));
    let out_name = fresh_name(m, &base);
    let mul = m.cursor(site.graph, first).insert(NewNode {
        op: Op::Mul {},
        inputs: vec![Some(site.x), Some(inv_v)],
        outputs: vec![Some((Some(out_name), ty))],
        name: Some(format!("{base}_smooth_mul")),
    });
    let out = m.nodes[mul].outputs[0].ok_or_else(|| "the new Mul has no result".to_owned())?;
    for c in &site.consumers {
        m.set_operand(c.node, 0, Some(out));
    }
    Ok(Placement::Mul(mul))
}

/// SmoothQuant (see the module documentation): migrates activation outliers into the weights
/// before INT8 quantization.
#[derive(Clone, Debug)]
pub struct SmoothQuantPass {
    alpha: f32,
    stats: HashMap<Value, ChannelStats>,
}

impl SmoothQuantPass {
    /// A pass with migration strength `alpha` (0..=1; 0.5 is usual) and per-channel statistics
    /// of the site activations ([`sites`], [`site_activations`]).
    pub fn new(alpha: f32, stats: HashMap<Value, ChannelStats>) -> Self {
        SmoothQuantPass { alpha, stats }
    }
}

impl Pass for SmoothQuantPass {
    fn name(&self) -> &str {
        "smoothquant"
    }

    fn run(&self, m: &mut Module, opts: &PassOptions) -> Result<PassReport, PassError> {
        let fail = |message: String| PassError::Failed {
            pass: self.name().to_owned(),
            message,
        };
        if !(0.0..=1.0).contains(&self.alpha) {
            return Err(fail(format!("alpha {} is not in [0, 1]", self.alpha)));
        }
        let mut report = PassReport::default();
        let (mut matmuls, mut folded, mut muls) = (0, 0, 0);
        for site in sites(m) {
            let Some(st) = self.stats.get(&site.x).filter(|st| st.channels == site.k) else {
                report.count("skipped-no-stats", site.consumers.len());
                continue;
            };
            let w = weight_row_abs_max(m, &site).map_err(&fail)?;
            let s = smooth_scales(&st.abs_max, &w, self.alpha);
            match migrate(m, &site, &s).map_err(&fail)? {
                Placement::Folded(_) => folded += 1,
                Placement::Mul(_) => muls += 1,
            }
            matmuls += site.consumers.len();
        }
        report.count("smoothed-matmuls", matmuls);
        report.count("folded-into-norm", folded);
        report.count("mul-inserted", muls);
        report.notes.push(format!(
            "{matmuls} matmuls, {folded} folded into norms, {muls} Mul inserted (alpha {})",
            self.alpha
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
    fn smooth_scales_follow_the_formula_and_guard_zeros() {
        let s = smooth_scales(&[16.0, 4.0, 0.0, 1e12], &[1.0, 4.0, 3.0, 1e-12], 0.5);
        assert_eq!(s[0], 4.0); // sqrt(16) / sqrt(1)
        assert_eq!(s[1], 1.0); // sqrt(4) / sqrt(4)
        assert_eq!(s[2], 1.0); // no activation: unchanged
        assert_eq!(s[3], SCALE_MAX); // clamped
        // alpha 1: all of the activation's range moves; alpha 0: only the weight's inverse.
        assert_eq!(smooth_scales(&[8.0], &[2.0], 1.0), vec![8.0]);
        assert_eq!(smooth_scales(&[8.0], &[2.0], 0.0), vec![0.5]);
    }
}
