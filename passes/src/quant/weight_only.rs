//! Weight-only quantization: INT4 blockwise for ONNX Runtime's `com.microsoft.MatMulNBits`, and
//! FP8 (E4M3) Q/DQ.
//!
//! # What is quantized
//! Every `MatMul` whose right operand is a 2-D f32 constant `[K, N]`, and every `Gemm` (`transA`
//! 0) whose `B` is one (`[K, N]`, or `[N, K]` with `transB = 1`), wherever the constant sits:
//! an initializer, a `Constant` node, or either of those read from inside an `If`/`Loop`/`Scan`
//! body (every graph of the module is visited). An optional node filter (a precision map's plan)
//! chooses the nodes. A weight shared by several nodes is quantized once.
//!
//! # INT4 (`WeightScheme::Int4`)
//! The node becomes `com.microsoft.MatMulNBits` (bits 4, `block_size` 16..=256, attributes `K`,
//! `N`) in ONNX Runtime's exact layout: `B` u8 `[N, k_blocks, block_size / 2]` with codes
//! packed low nibble first along K (the last block zero-padded), `scales` f32 `[N, k_blocks]`,
//! and for asymmetric quantization `zero_points` u8 `[N, ceil(k_blocks / 2)]` packed the same way.
//! Symmetric blocks use the signed value of largest magnitude `m`: `scale = m / -8`, implicit
//! zero point 8, so the whole code range 0..=15 is used (ONNX Runtime's blockwise quantizer
//! does the same). Asymmetric blocks widen `[min, max]` to include 0: `scale = (max - min) /
//! 15`, `zero_point = round(-min / scale)`. Codes are `QuantizeLinear`'s
//! ([`mmq_kernels::quant::quantize_value`]: round half to even, saturate). A `Gemm`'s `alpha`
//! is folded into the scales and `beta * C` (C of `N` elements) becomes the `bias` input.
//!
//! Targets without `MatMulNBits` (TensorRT; [`crate::targets::QdqRules::int4_matmul_nbits`])
//! get the standard form instead: symmetric blocks only, with the positive scale `absmax / 7` and
//! signed codes in [-7, 7], stored as an INT4 constant in the weight's own orientation with f32
//! scales `ceil(K / block)` along K, and an opset-21 `DequantizeLinear` (`axis` = K,
//! `block_size`) feeding the unchanged node (a `Gemm`'s `alpha` moves into the scales). The
//! model's opset is raised to 21 where needed (refused if the graph has `GroupNormalization`,
//! whose meaning changed at 21). Counters `int4-matmul-dq`, `int4-gemm-dq`.
//!
//! # FP8 (`WeightScheme::Fp8`)
//! The weight becomes an `f8e4m3fn` constant with one f32 scale per output channel
//! (`absmax / 448`) and a `DequantizeLinear` (axis = the N axis) feeds the node (opset 19 or
//! later). With activation ranges (from calibration), the node's float input also gets a
//! per-tensor E4M3 `QuantizeLinear` → `DequantizeLinear` pair.
//!
//! # Large models
//! Weights are read streaming, a few MiB at a time, with positional reads of the original
//! (memory-mapped) data file, so the source pages never become part of the process's resident
//! memory; tensors are quantized in parallel (rayon). Only the quantized output is held in
//! memory, and the ONNX writer stores it as external data.
//!
//! Counters: `int4-matmul`, `int4-gemm`, `fp8-weights`, `fp8-activations`,
//! `skipped-<reason>`.

use std::collections::HashMap;
use std::os::unix::fs::FileExt;

use bytes::Bytes;
use mmq_ir::edit::NewNode;
use mmq_ir::{
    At, Attr, Const, ConstData, DType, Dim, GraphId, Module, Node, Op, Storage, Type, Value,
    ValueDef,
};
use mmq_kernels::quant::{quantize_float, round_saturate};
use multiversion::multiversion;
use rayon::prelude::*;

use crate::dce::Dce;
use crate::pass::{Pass, PassError, PassOptions, PassReport};
use crate::quant::place::Placement;

/// The weight-only schemes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightScheme {
    /// 4-bit blockwise integers for `com.microsoft.MatMulNBits`.
    Int4,
    /// FP8 E4M3 (`f8e4m3fn`) per output channel, as `DequantizeLinear` of the weight.
    Fp8,
}

/// How to quantize.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightOnlyConfig {
    /// The scheme.
    pub scheme: WeightScheme,
    /// INT4 block size along K: a power of two from 16 to 256 (32, 64 and 128 are usual).
    pub block_size: usize,
    /// INT4: symmetric blocks (no zero points) when set, asymmetric otherwise.
    pub symmetric: bool,
    /// INT4: the `accuracy_level` attribute of `MatMulNBits` (ONNX Runtime's compute type of
    /// A: 0 unset, 1 f32, 2 f16, 3 bf16, 4 int8); `None` leaves it out.
    pub accuracy_level: Option<i64>,
    /// INT4: search each block's range for the least squared error (shrinking it by up to
    /// 30%) instead of taking its min/max as is (ONNX Runtime's quantizer).
    pub search: bool,
}

impl Default for WeightOnlyConfig {
    fn default() -> Self {
        WeightOnlyConfig {
            scheme: WeightScheme::Int4,
            block_size: 32,
            symmetric: true,
            accuracy_level: None,
            search: true,
        }
    }
}

/// Chooses the nodes to quantize (for example from a precision map's plan).
pub type NodeFilter = Box<dyn Fn(&Module, Node) -> bool + Send + Sync>;

/// The weight-only quantization pass (see the module documentation).
pub struct WeightOnlyPass {
    config: WeightOnlyConfig,
    filter: Option<NodeFilter>,
    activation_ranges: HashMap<Value, (f32, f32)>,
    placement: Placement,
}

/// The share of the INT4-eligible weight bytes that [`Placement::Cost`] may leave float where
/// the target's INT4 product is estimated slower.
pub const INT4_FLOAT_BUDGET: f64 = 0.01;

impl std::fmt::Debug for WeightOnlyPass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightOnlyPass")
            .field("config", &self.config)
            .field("filter", &self.filter.is_some())
            .field("activation_ranges", &self.activation_ranges.len())
            .finish()
    }
}

impl WeightOnlyPass {
    /// A pass quantizing every eligible node.
    pub fn new(config: WeightOnlyConfig) -> Self {
        WeightOnlyPass {
            config,
            filter: None,
            activation_ranges: HashMap::new(),
            placement: Placement::All,
        }
    }

    /// Quantizes only the nodes `filter` accepts.
    pub fn with_filter(mut self, filter: NodeFilter) -> Self {
        self.filter = Some(filter);
        self
    }

    /// INT4 with [`Placement::Cost`] on a target with [`crate::targets::Int4Rates`]: the
    /// products estimated slower as INT4 than as float stay float, smallest weight first, as
    /// long as together they hold at most [`INT4_FLOAT_BUDGET`] of the eligible weight bytes
    /// (the saving they give up is negligible). Rows of a symbolic size count as
    /// [`super::place::SYMBOLIC_DIM`]. The default is [`Placement::All`].
    pub fn with_placement(mut self, placement: Placement) -> Self {
        self.placement = placement;
        self
    }

    /// FP8: per-tensor ranges `(min, max)` of activations (calibration results); a quantized
    /// node whose float input has a range also gets its activation quantized.
    pub fn with_activation_ranges(mut self, ranges: HashMap<Value, (f32, f32)>) -> Self {
        self.activation_ranges = ranges;
        self
    }

    /// The float inputs of the nodes this pass would quantize in top-level graph `graph`
    /// (what FP8 activation quantization needs calibrated ranges for), without duplicates.
    pub fn activation_inputs(&self, m: &Module, graph: GraphId) -> Vec<Value> {
        let mut out = Vec::new();
        for &node in m.graphs[graph].nodes() {
            if self.filter.as_ref().is_some_and(|f| !f(m, node)) {
                continue;
            }
            if let Some(Ok(_)) = self.plan(m, graph, node)
                && let Some(Some(a)) = m.nodes[node].inputs.first()
                && !out.contains(a)
            {
                out.push(*a);
            }
        }
        out
    }

    fn fail(&self, message: impl Into<String>) -> PassError {
        PassError::Failed {
            pass: self.name().to_owned(),
            message: message.into(),
        }
    }
}

/// The jobs [`WeightOnlyPass::with_placement`]'s cost placement leaves float, and a note saying
/// why.
fn int4_placement(
    m: &Module,
    jobs: &[Job],
    rates: &crate::targets::Int4Rates,
) -> (Vec<Node>, String) {
    let total: f64 = jobs.iter().map(|j| (j.k * j.n * 4) as f64).sum();
    let mut slower: Vec<(f64, f64, &Job)> = jobs
        .iter()
        .filter_map(|j| {
            let a = (*m.nodes[j.node].inputs.first()?)?;
            let elements = super::place::type_elements(m.value_type(a))?;
            let (k, n) = (j.k as f64, j.n as f64);
            let rows = (elements / k).max(1.0);
            let (float, nbits) = (rates.float(rows, k, n), rates.nbits(rows, k, n));
            (nbits > float).then_some((k * n * 4.0, nbits / float, j))
        })
        .collect();
    slower.sort_by(|a, b| a.0.total_cmp(&b.0));
    let budget = total * INT4_FLOAT_BUDGET;
    let (mut spent, mut kept, mut worst) = (0.0, Vec::new(), 1.0f64);
    for (bytes, ratio, j) in slower {
        if spent + bytes > budget {
            break;
        }
        spent += bytes;
        kept.push(j.node);
        worst = worst.max(ratio);
    }
    let note = format!(
        "{} product(s) stay float: MatMulNBits is estimated slower at their shapes (up to \
         {worst:.2}x) and their weights are {:.2}% of the eligible bytes (--placement all \
         quantizes them)",
        kept.len(),
        if total > 0.0 {
            100.0 * spent / total
        } else {
            0.0
        }
    );
    (kept, note)
}

/// One node to rewrite.
struct Job {
    graph: GraphId,
    node: Node,
    weight: Const,
    /// The weight is `[N, K]` (Gemm `transB = 1`).
    trans: bool,
    alpha: f32,
    k: usize,
    n: usize,
    /// INT4 Gemm: the bias operand (`beta * C`) as an existing value or new data.
    bias: Option<Bias>,
}

enum Bias {
    Value(Value),
    Data(Vec<f32>),
}

/// The quantized form of one weight.
enum Quantized {
    Int4 {
        packed: Vec<u8>,
        scales: Vec<f32>,
        zero_points: Option<Vec<u8>>,
    },
    Fp8 {
        codes: Vec<u8>,
        scales: Vec<f32>,
    },
}

fn f32_values(c: &ConstData) -> Option<Vec<f32>> {
    if c.dtype != DType::F32 {
        return None;
    }
    let bytes = match &c.storage {
        Storage::Inline(b) => b.to_vec(),
        Storage::External { file, offset, len } => {
            let mut buf = vec![0u8; usize::try_from(*len).ok()?];
            file.file().read_exact_at(&mut buf, *offset).ok()?;
            buf
        }
        _ => return None,
    };
    Some(
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
    )
}

/// Static dims of a value, when all known.
fn static_shape(m: &Module, v: Value) -> Option<Vec<usize>> {
    m.value_type(v)
        .shape()?
        .iter()
        .map(|d| d.as_known().and_then(|k| usize::try_from(k).ok()))
        .collect()
}

impl WeightOnlyPass {
    /// The job for `node`, or the reason it is skipped (`None`: not a candidate at all).
    fn plan(&self, m: &Module, graph: GraphId, node: Node) -> Option<Result<Job, &'static str>> {
        let nd = &m.nodes[node];
        let (b_index, trans, alpha) = match &nd.op {
            Op::MatMul {} => (1, false, 1.0),
            Op::Gemm {
                alpha,
                trans_a,
                trans_b,
                ..
            } => {
                if trans_a.unwrap_or(0) != 0 {
                    return Some(Err("gemm-trans-a"));
                }
                (1, trans_b.unwrap_or(0) != 0, alpha.unwrap_or(1.0))
            }
            // A MatMul whose scale or transposed weight the rewrites absorbed.
            Op::FusedMatMul {
                alpha,
                trans_a,
                trans_b,
                trans_batch_a,
                trans_batch_b,
            } => {
                if [trans_a, trans_batch_a, trans_batch_b]
                    .iter()
                    .any(|t| t.unwrap_or(0) != 0)
                {
                    return Some(Err("fused-matmul-trans-a"));
                }
                (1, trans_b.unwrap_or(0) != 0, alpha.unwrap_or(1.0))
            }
            _ => return None,
        };
        let a = nd.inputs.first().copied().flatten()?;
        let b = nd.inputs.get(b_index).copied().flatten()?;
        let c = m.const_source(b)?;
        let cd = &m.consts[c];
        if cd.dtype != DType::F32 || m.value_type(a).dtype() != Some(DType::F32) {
            return Some(Err("dtype"));
        }
        if cd.shape.len() != 2 || cd.shape.iter().any(|&d| d <= 0) {
            return Some(Err("weight-shape"));
        }
        if m.value_type(a).shape().is_some_and(|s| s.len() < 2) {
            return Some(Err("input-rank"));
        }
        let (r, cols) = (cd.shape[0] as usize, cd.shape[1] as usize);
        let (k, n) = if trans { (cols, r) } else { (r, cols) };
        let mut bias = None;
        if self.config.scheme == WeightScheme::Int4
            && let Op::Gemm { beta, .. } = &nd.op
            && let Some(cv) = nd.inputs.get(2).copied().flatten()
        {
            let beta = beta.unwrap_or(1.0);
            if let Some(cc) = m.const_source(cv) {
                let cdata = &m.consts[cc];
                if cdata.num_elements() != n || cdata.shape.iter().filter(|&&d| d != 1).count() > 1
                {
                    return Some(Err("gemm-bias-shape"));
                }
                let Some(vals) = f32_values(cdata) else {
                    return Some(Err("gemm-bias-dtype"));
                };
                bias = Some(Bias::Data(vals.iter().map(|x| x * beta).collect()));
            } else if beta == 1.0
                && static_shape(m, cv).is_some_and(|s| s == [n])
                && m.value_type(cv).dtype() == Some(DType::F32)
            {
                bias = Some(Bias::Value(cv));
            } else {
                return Some(Err("gemm-bias-shape"));
            }
        }
        // FP8 keeps the node, and with it Gemm's alpha.
        let alpha = match self.config.scheme {
            WeightScheme::Int4 => alpha,
            WeightScheme::Fp8 => 1.0,
        };
        Some(Ok(Job {
            graph,
            node,
            weight: c,
            trans,
            alpha,
            k,
            n,
            bias,
        }))
    }
}

impl Pass for WeightOnlyPass {
    fn name(&self) -> &str {
        match self.config.scheme {
            WeightScheme::Int4 => "quant-int4",
            WeightScheme::Fp8 => "quant-fp8",
        }
    }

    fn run(&self, m: &mut Module, opts: &PassOptions) -> Result<PassReport, PassError> {
        let bs = self.config.block_size;
        if self.config.scheme == WeightScheme::Int4 && !(16..=256).contains(&bs)
            || !bs.is_power_of_two()
        {
            return Err(self.fail(format!(
                "block size {bs} must be a power of two from 16 to 256"
            )));
        }
        // INT4 where the target has no MatMulNBits: a blockwise DequantizeLinear (opset 21) of
        // signed INT4 weights feeding the unchanged node.
        // Asymmetric INT4 there takes the MatMulNBits form, which the target lowers into its
        // plugin.
        let rules = opts.target.qdq_rules();
        let int4_native = self.config.scheme == WeightScheme::Int4 && !rules.int4_matmul_nbits;
        if int4_native && !self.config.symmetric && !rules.plugins {
            return Err(self.fail(format!(
                "asymmetric INT4 (--asym, or `symmetric = false` in a precision map) needs \
                 zero points, which target {} does not take",
                opts.target
            )));
        }
        let block_dq = int4_native && self.config.symmetric;
        let mut report = PassReport::default();
        if block_dq {
            let notes = super::raise_opset(m, 21, "INT4 as a blockwise DequantizeLinear")
                .map_err(|e| self.fail(e))?;
            report.notes.extend(notes);
        }
        let mut jobs = Vec::new();
        let roots: Vec<GraphId> = m.entries.iter().map(|e| e.graph).collect();
        for root in roots {
            for g in m.graph_tree(root) {
                if self.config.scheme == WeightScheme::Fp8 {
                    let opset = m.onnx_opset(g).unwrap_or(0);
                    if opset < 19 {
                        return Err(self.fail(format!(
                            "fp8 needs DequantizeLinear of opset 19 or later; graph '{}' imports opset {opset}",
                            m.graphs[g].name
                        )));
                    }
                }
                for &node in m.graphs[g].nodes() {
                    if self.filter.as_ref().is_some_and(|f| !f(m, node)) {
                        continue;
                    }
                    match self.plan(m, g, node) {
                        Some(Ok(job)) => jobs.push(job),
                        Some(Err(reason)) => report.count(&format!("skipped-{reason}"), 1),
                        None => {}
                    }
                }
            }
        }
        if self.config.scheme == WeightScheme::Int4
            && self.placement == Placement::Cost
            && let Some(rates) = opts.target.int4_rates()
        {
            let (kept, note) = int4_placement(m, &jobs, rates);
            if !kept.is_empty() {
                jobs.retain(|j| !kept.contains(&j.node));
                report.count("int4-kept-float", kept.len());
                report.notes.push(note);
            }
        }
        // One quantization per distinct (weight, layout, alpha).
        let mut keys: Vec<(Const, bool, u32, usize, usize)> = Vec::new();
        let mut key_of: HashMap<(Const, bool, u32), usize> = HashMap::new();
        for j in &jobs {
            key_of
                .entry((j.weight, j.trans, j.alpha.to_bits()))
                .or_insert_with(|| {
                    keys.push((j.weight, j.trans, j.alpha.to_bits(), j.k, j.n));
                    keys.len() - 1
                });
        }
        // Largest weights first, one task each, so that no large weight (an LM head) is left
        // to one thread at the end while the others idle.
        let mut order: Vec<usize> = (0..keys.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(keys[i].3.saturating_mul(keys[i].4)));
        let quantize = |(c, trans, alpha, k, n): (Const, bool, u32, usize, usize)| {
            let cd = &m.consts[c];
            let src = Source::of(cd)?;
            let alpha = f32::from_bits(alpha);
            match self.config.scheme {
                WeightScheme::Int4 => {
                    quantize_int4(&src, k, n, trans, alpha, &self.config, block_dq)
                }
                WeightScheme::Fp8 => quantize_fp8(&src, k, n, trans),
            }
            .map_err(|e| format!("weight '{}': {e}", cd.name.as_deref().unwrap_or("?")))
        };
        let mut results: Vec<(usize, Result<Quantized, String>)> = order
            .par_iter()
            .with_max_len(1)
            .map(|&i| (i, quantize(keys[i])))
            .collect();
        results.sort_by_key(|r| r.0);
        let mut quantized = Vec::with_capacity(results.len());
        for (_, r) in results {
            quantized.push(Some(r.map_err(|e| self.fail(e))?));
        }
        // Constants of each distinct quantized weight, created on first use.
        let mut made: HashMap<usize, Vec<Value>> = HashMap::new();
        for job in jobs {
            let idx = key_of[&(job.weight, job.trans, job.alpha.to_bits())];
            let base = m.consts[job.weight]
                .name
                .clone()
                .unwrap_or_else(|| format!("w{idx}"));
            let consts = match (made.get(&idx), quantized[idx].take()) {
                (Some(v), _) => v.clone(),
                (None, Some(q)) => {
                    let v = if block_dq {
                        add_block_dq_consts(m, q, &job, &base, bs)
                    } else {
                        add_consts(m, q, &job, &base, bs)
                    };
                    made.insert(idx, v.clone());
                    v
                }
                (None, None) => continue,
            };
            match self.config.scheme {
                WeightScheme::Int4 if block_dq => {
                    self.rewrite_int4_block_dq(m, &job, &consts, &mut report);
                }
                WeightScheme::Int4 => self.rewrite_int4(m, &job, &consts, &mut report),
                WeightScheme::Fp8 => self.rewrite_fp8(m, &job, &consts, &mut report),
            }
        }
        if self.config.scheme == WeightScheme::Int4 && !block_dq {
            pack_siblings(m, &mut report);
        }
        if report.changed {
            let dce = Dce.run(m, opts)?;
            for (k, v) in dce.counters {
                report.count(&k, v);
            }
        }
        Ok(report)
    }
}

/// Packs the `MatMulNBits` nodes of one graph that read the same activation with the same
/// attributes (but `N`) — a transformer block's query, key and value projections, or its gate
/// and up projections — into one `MatMulNBits` over their weights stacked along N, followed by
/// a `Split` of its last axis: one product over the activation instead of several, as ONNX
/// Runtime's own model builder writes them. Exact: each output column reads only its own row
/// of codes, scales and zero points. Left alone: nodes with a bias, weights another node also
/// reads (stacking would copy them), and results that are graph outputs (their names stay).
/// Counter `int4-packed` (nodes packed away).
fn pack_siblings(m: &mut Module, report: &mut PassReport) {
    let roots: Vec<GraphId> = m.entries.iter().map(|e| e.graph).collect();
    let mut uses: HashMap<Value, usize> = HashMap::new();
    for &root in &roots {
        for g in m.graph_tree(root) {
            for &n in m.graphs[g].nodes() {
                for v in m.nodes[n].inputs.iter().flatten() {
                    *uses.entry(*v).or_default() += 1;
                }
            }
            for &o in &m.graphs[g].outputs {
                *uses.entry(o).or_default() += 1;
            }
        }
    }
    let inline = |m: &Module, v: Value| match m.values[v].def {
        ValueDef::Const(c) if uses.get(&v) == Some(&1) => match &m.consts[c].storage {
            Storage::Inline(b) => Some(b.clone()),
            _ => None,
        },
        _ => None,
    };
    for root in roots {
        for g in m.graph_tree(root) {
            // Group by (activation, attributes but N, operand count), in node order.
            let mut groups: Vec<(Value, Vec<Node>)> = Vec::new();
            let mut group_of: HashMap<(Value, String), usize> = HashMap::new();
            for &n in m.graphs[g].nodes() {
                let nd = &m.nodes[n];
                if nd.op.domain() != "com.microsoft" || nd.op.op_type() != "MatMulNBits" {
                    continue;
                }
                let Some(Some(x)) = nd.inputs.first().copied() else {
                    continue;
                };
                let plain = matches!(nd.inputs.len(), 3 | 4)
                    && nd.inputs[1..]
                        .iter()
                        .all(|i| i.is_some_and(|v| inline(m, v).is_some()))
                    && nd.outputs.len() == 1
                    && nd.outputs[0].is_some_and(|o| !m.graphs[g].outputs.contains(&o));
                if !plain {
                    continue;
                }
                let mut attrs: Vec<String> = nd
                    .op
                    .attrs()
                    .iter()
                    .filter(|(k, _)| *k != "N")
                    .map(|(k, a)| format!("{k}={a:?}"))
                    .collect();
                attrs.sort();
                let key = format!("{}|{}", attrs.join(","), nd.inputs.len());
                let i = *group_of.entry((x, key)).or_insert_with(|| {
                    groups.push((x, Vec::new()));
                    groups.len() - 1
                });
                groups[i].1.push(n);
            }
            for (x, nodes) in groups {
                if nodes.len() > 1 {
                    pack_group(m, g, x, &nodes, &inline);
                    report.count("int4-packed", nodes.len() - 1);
                }
            }
        }
    }
}

/// Replaces the sibling `MatMulNBits` `nodes` of graph `g` (reading `x`) by one over their
/// stacked constants and a `Split` (see [`pack_siblings`]).
fn pack_group(
    m: &mut Module,
    g: GraphId,
    x: Value,
    nodes: &[Node],
    inline: &dyn Fn(&Module, Value) -> Option<Bytes>,
) {
    let ns: Vec<i64> = nodes
        .iter()
        .map(|&n| match m.nodes[n].op.attr("N") {
            Some(Attr::Int(v)) => v,
            _ => 0,
        })
        .collect();
    let total: i64 = ns.iter().sum();
    let first = nodes[0];
    // Stacked along N: every constant's rows are N-major.
    let mut stacked = Vec::new();
    for i in 1..m.nodes[first].inputs.len() {
        let mut bytes = Vec::new();
        for &n in nodes {
            let v = m.nodes[n].inputs[i].unwrap_or_else(|| unreachable!("checked present"));
            bytes.extend_from_slice(&inline(m, v).unwrap_or_default());
        }
        let v = m.nodes[first].inputs[i].unwrap_or_else(|| unreachable!("checked present"));
        let ValueDef::Const(c) = m.values[v].def else {
            unreachable!("checked constant")
        };
        let cd = &m.consts[c];
        let mut shape = cd.shape.clone();
        if let Some(rows) = shape.first_mut() {
            *rows = total;
        }
        let name = cd.name.as_deref().map(|s| format!("{s}_packed"));
        let dtype = cd.dtype;
        stacked.push(m.add_const(ConstData::new(
            name,
            dtype,
            shape,
            Storage::Inline(Bytes::from(bytes)),
        )));
    }
    let out_of = |m: &Module, n: Node| m.nodes[n].outputs[0].unwrap_or_else(|| unreachable!());
    let y0 = out_of(m, first);
    let ty = m.value_type(y0).clone();
    let packed_ty = match (ty.dtype(), ty.shape()) {
        (Some(dt), Some(d)) if !d.is_empty() => {
            let mut d = d.to_vec();
            *d.last_mut().unwrap_or_else(|| unreachable!()) = Dim::known(total);
            Type::tensor(dt, d)
        }
        _ => Type::Unknown,
    };
    let mut attrs: Vec<(String, Attr)> = m.nodes[first]
        .op
        .attrs()
        .iter()
        .map(|(k, a)| ((*k).to_owned(), a.clone()))
        .collect();
    for (k, a) in &mut attrs {
        if k == "N" {
            *a = Attr::Int(total);
        }
    }
    let base = m.nodes[first]
        .name
        .clone()
        .unwrap_or_else(|| "matmul".into());
    let mut inputs = vec![Some(x)];
    inputs.extend(stacked.into_iter().map(Some));
    let product = insert_before(
        m,
        g,
        first,
        Op::from_parts("com.microsoft", "MatMulNBits", attrs),
        inputs,
        (Some(format!("{base}_packed")), packed_ty),
    );
    let sizes = m.add_const(ConstData::new(
        Some(format!("{base}_packed_sizes")),
        DType::I64,
        vec![ns.len() as i64],
        Storage::Inline(Bytes::from(
            ns.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(),
        )),
    ));
    let outs: Vec<Option<(Option<String>, Type)>> = nodes
        .iter()
        .map(|&n| {
            let y = out_of(m, n);
            Some((m.values[y].name.take(), m.value_type(y).clone()))
        })
        .collect();
    // The sizes are an operand from opset 13, an attribute before.
    let operand = m.onnx_opset(g).unwrap_or(mmq_ir::infer::DEFAULT_OPSET) >= 13;
    let split = m.cursor(g, At::Before(first)).insert(NewNode {
        op: Op::Split {
            axis: Some(-1),
            num_outputs: None,
            split: (!operand).then(|| ns.clone()),
        },
        inputs: vec![Some(product), operand.then_some(sizes)],
        outputs: outs,
        name: Some(format!("{base}_packed_split")),
    });
    for (i, &n) in nodes.iter().enumerate() {
        let old = out_of(m, n);
        let new = m.nodes[split].outputs[i].unwrap_or_else(|| unreachable!("declared"));
        m.replace_uses(old, new, g, &[]);
    }
}

/// New constants for one quantized weight: INT4 `[B, scales, zero_points?]`, FP8 `[codes,
/// scales]`.
fn add_consts(m: &mut Module, q: Quantized, job: &Job, base: &str, bs: usize) -> Vec<Value> {
    let (k, n) = (job.k as i64, job.n as i64);
    let k_blocks = job.k.div_ceil(bs) as i64;
    let f32_bytes =
        |v: &[f32]| Bytes::from(v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>());
    let mut add = |name: String, dtype, shape, bytes| {
        m.add_const(ConstData::new(
            Some(name),
            dtype,
            shape,
            Storage::Inline(bytes),
        ))
    };
    match q {
        Quantized::Int4 {
            packed,
            scales,
            zero_points,
        } => {
            let mut out = vec![
                add(
                    format!("{base}_q4"),
                    DType::U8,
                    vec![n, k_blocks, (bs / 2) as i64],
                    Bytes::from(packed),
                ),
                add(
                    format!("{base}_scales"),
                    DType::F32,
                    vec![n, k_blocks],
                    f32_bytes(&scales),
                ),
            ];
            if let Some(zp) = zero_points {
                out.push(add(
                    format!("{base}_zero_points"),
                    DType::U8,
                    vec![n, (k_blocks + 1) / 2],
                    Bytes::from(zp),
                ));
            }
            out
        }
        Quantized::Fp8 { codes, scales } => {
            let shape = if job.trans { vec![n, k] } else { vec![k, n] };
            vec![
                add(
                    format!("{base}_f8"),
                    DType::F8E4M3FN,
                    shape,
                    Bytes::from(codes),
                ),
                add(
                    format!("{base}_scale"),
                    DType::F32,
                    vec![n],
                    f32_bytes(&scales),
                ),
            ]
        }
    }
}

/// Adds a one-result node to `graph` right before `before`; its result.
fn insert_before(
    m: &mut Module,
    graph: GraphId,
    before: Node,
    op: Op,
    inputs: Vec<Option<Value>>,
    out: (Option<String>, Type),
) -> Value {
    let node = m.cursor(graph, At::Before(before)).insert(NewNode {
        op,
        inputs,
        outputs: vec![Some(out)],
        name: None,
    });
    m.nodes[node].outputs[0].unwrap_or_else(|| unreachable!("one declared output"))
}

/// The blockwise-DequantizeLinear form of a symmetric INT4 weight: signed INT4 codes in the
/// weight's own orientation (`[K, N]`, or `[N, K]` for `transB`), packed row-major low nibble
/// first, and f32 scales with `ceil(K / block)` blocks along the K axis.
fn add_block_dq_consts(
    m: &mut Module,
    q: Quantized,
    job: &Job,
    base: &str,
    bs: usize,
) -> Vec<Value> {
    let Quantized::Int4 { packed, scales, .. } = q else {
        return Vec::new();
    };
    let (k, n) = (job.k, job.n);
    let kb = k.div_ceil(bs);
    let blob = bs / 2;
    // MatMulNBits layout: row n, block b, byte i holds K positions b*bs + 2i (low), + 2i + 1.
    let code = |row: usize, kk: usize| {
        let byte = packed[(row * kb + kk / bs) * blob + (kk % bs) / 2];
        let c = if kk.is_multiple_of(2) {
            byte & 0xf
        } else {
            byte >> 4
        };
        // Signed symmetric blocks (positive scale, zero point 8): the INT4 value is c - 8.
        (c.wrapping_sub(8)) & 0xf
    };
    let total = k * n;
    let mut codes = vec![0u8; total.div_ceil(2)];
    let mut block_scales = vec![0f32; kb * n];
    for row in 0..n {
        for kk in 0..k {
            let flat = if job.trans {
                row * k + kk
            } else {
                kk * n + row
            };
            codes[flat / 2] |= code(row, kk) << (4 * (flat % 2));
        }
        for b in 0..kb {
            let at = if job.trans { row * kb + b } else { b * n + row };
            block_scales[at] = scales[row * kb + b];
        }
    }
    let (wshape, sshape) = if job.trans {
        (vec![n as i64, k as i64], vec![n as i64, kb as i64])
    } else {
        (vec![k as i64, n as i64], vec![kb as i64, n as i64])
    };
    vec![
        m.add_const(ConstData::new(
            Some(format!("{base}_i4")),
            DType::I4,
            wshape,
            Storage::Inline(Bytes::from(codes)),
        )),
        m.add_const(ConstData::new(
            Some(format!("{base}_scales")),
            DType::F32,
            sshape,
            Storage::Inline(Bytes::from(
                block_scales
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect::<Vec<u8>>(),
            )),
        )),
    ]
}

/// `DequantizeLinear(codes, scales, axis[, block_size])` of a weight in its own orientation
/// (`[K, N]`, or `[N, K]` for `transB`), placed before the job's node; the f32 weight.
fn insert_weight_dq(
    m: &mut Module,
    job: &Job,
    consts: &[Value],
    axis: i64,
    block_size: Option<i64>,
) -> Value {
    let (k, n) = (job.k as i64, job.n as i64);
    let shape = if job.trans { [n, k] } else { [k, n] };
    let dq = Op::DequantizeLinear {
        axis: Some(axis),
        block_size,
        output_dtype: None,
    };
    let w_ty = Type::tensor(DType::F32, shape.iter().map(|&d| Dim::known(d)).collect());
    insert_before(
        m,
        job.graph,
        job.node,
        dq,
        vec![Some(consts[0]), Some(consts[1])],
        (None, w_ty),
    )
}

impl WeightOnlyPass {
    /// The weight operand becomes `DequantizeLinear(codes, scales, axis = K axis, block_size)`;
    /// a `Gemm` keeps its bias and transposes, its `alpha` (and a `FusedMatMul`'s) is in the
    /// scales.
    fn rewrite_int4_block_dq(
        &self,
        m: &mut Module,
        job: &Job,
        consts: &[Value],
        report: &mut PassReport,
    ) {
        let axis = if job.trans { 1 } else { 0 };
        let w = insert_weight_dq(m, job, consts, axis, Some(self.config.block_size as i64));
        let is_gemm = match &mut m.nodes[job.node].op {
            Op::Gemm { alpha, .. } => {
                *alpha = None;
                true
            }
            Op::FusedMatMul { alpha, .. } => {
                *alpha = None;
                false
            }
            _ => false,
        };
        m.set_operand(job.node, 1, Some(w));
        report.count(
            if is_gemm {
                "int4-gemm-dq"
            } else {
                "int4-matmul-dq"
            },
            1,
        );
    }

    fn rewrite_int4(&self, m: &mut Module, job: &Job, consts: &[Value], report: &mut PassReport) {
        let is_gemm = matches!(m.nodes[job.node].op, Op::Gemm { .. });
        let a = m.nodes[job.node].inputs[0];
        let mut inputs = vec![a, Some(consts[0]), Some(consts[1]), consts.get(2).copied()];
        if let Some(bias) = &job.bias {
            let bv = match bias {
                Bias::Value(v) => *v,
                Bias::Data(d) => m.add_const(ConstData::new(
                    Some(format!(
                        "{}_bias",
                        m.nodes[job.node].name.as_deref().unwrap_or("gemm")
                    )),
                    DType::F32,
                    vec![job.n as i64],
                    Storage::Inline(Bytes::from(
                        d.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>(),
                    )),
                )),
            };
            inputs.push(None);
            inputs.push(Some(bv));
        }
        while inputs.last().is_some_and(Option::is_none) {
            inputs.pop();
        }
        let mut attrs = vec![
            ("K".to_owned(), Attr::Int(job.k as i64)),
            ("N".to_owned(), Attr::Int(job.n as i64)),
            ("bits".to_owned(), Attr::Int(4)),
            (
                "block_size".to_owned(),
                Attr::Int(self.config.block_size as i64),
            ),
        ];
        if let Some(level) = self.config.accuracy_level {
            attrs.push(("accuracy_level".to_owned(), Attr::Int(level)));
        }
        let nd = &mut m.nodes[job.node];
        nd.op = Op::from_parts("com.microsoft", "MatMulNBits", attrs);
        nd.inputs = inputs;
        report.count(if is_gemm { "int4-gemm" } else { "int4-matmul" }, 1);
    }

    fn rewrite_fp8(&self, m: &mut Module, job: &Job, consts: &[Value], report: &mut PassReport) {
        let axis = if job.trans { 0 } else { 1 };
        let w = insert_weight_dq(m, job, consts, axis, None);
        m.set_operand(job.node, 1, Some(w));
        report.count("fp8-weights", 1);
        let Some(a) = m.nodes[job.node].inputs[0] else {
            return;
        };
        let Some(&(lo, hi)) = self.activation_ranges.get(&a) else {
            return;
        };
        let amax = lo.abs().max(hi.abs());
        if !amax.is_finite() || amax == 0.0 {
            return;
        }
        let scale = m.add_const(ConstData::new(
            None,
            DType::F32,
            vec![],
            Storage::Inline(Bytes::from((amax / E4M3_MAX).to_le_bytes().to_vec())),
        ));
        let zp = m.add_const(ConstData::new(
            None,
            DType::F8E4M3FN,
            vec![],
            Storage::Inline(Bytes::from(vec![0u8])),
        ));
        let a_ty = m.value_type(a).clone();
        let q_ty = match &a_ty {
            Type::Tensor(t) => Type::Tensor(mmq_ir::TensorType {
                dtype: Some(DType::F8E4M3FN),
                shape: t.shape.clone(),
            }),
            other => other.clone(),
        };
        let q = insert_before(
            m,
            job.graph,
            job.node,
            Op::QuantizeLinear {
                axis: None,
                block_size: None,
                output_dtype: None,
                precision: None,
                saturate: None,
            },
            vec![Some(a), Some(scale), Some(zp)],
            (None, q_ty),
        );
        let d = insert_before(
            m,
            job.graph,
            job.node,
            Op::DequantizeLinear {
                axis: None,
                block_size: None,
                output_dtype: None,
            },
            vec![Some(q), Some(scale), Some(zp)],
            (None, a_ty),
        );
        m.set_operand(job.node, 0, Some(d));
        report.count("fp8-activations", 1);
    }
}

/// The largest finite E4M3FN value.
const E4M3_MAX: f32 = 448.0;

/// Bytes read per chunk when streaming a weight.
const CHUNK_BYTES: usize = 4 << 20;

/// A weight whose f32 elements are read in chunks (external data with positional reads, so the
/// source pages never become resident memory).
struct Source<'a>(&'a ConstData);

impl<'a> Source<'a> {
    fn of(cd: &'a ConstData) -> Result<Source<'a>, String> {
        if matches!(cd.storage, Storage::Strings(_) | Storage::Absent) {
            return Err("the weight has no data".to_owned());
        }
        let (have, want) = (cd.byte_len(), cd.num_elements() as u64 * 4);
        if have != want {
            return Err(format!("holds {have} bytes, expected {want}"));
        }
        Ok(Source(cd))
    }

    /// Reads elements `start..start + out.len()` into `out`; non-finite values are an error.
    fn read(&self, start: usize, out: &mut [f32], bytes: &mut Vec<u8>) -> Result<(), String> {
        self.0
            .read_f32(start, out, bytes)
            .map_err(|e| e.to_string())?;
        if let Some(i) = out.iter().position(|v| !v.is_finite()) {
            return Err(format!(
                "non-finite value {} near element {}",
                out[i],
                start + i
            ));
        }
        Ok(())
    }

    /// Calls `f(first_row, rows)` over the `rows x cols` matrix in chunks of whole rows (at
    /// least `align` rows, a multiple of it, except the last).
    fn for_rows(
        &self,
        rows: usize,
        cols: usize,
        align: usize,
        mut f: impl FnMut(usize, &[f32]) -> Result<(), String>,
    ) -> Result<(), String> {
        let per = (CHUNK_BYTES / (4 * cols * align).max(1)).max(1) * align;
        let mut buf = Vec::new();
        let mut bytes = Vec::new();
        let mut r = 0;
        while r < rows {
            let take = per.min(rows - r);
            buf.resize(take * cols, 0.0);
            self.read(r * cols, &mut buf, &mut bytes)?;
            f(r, &buf)?;
            r += take;
        }
        Ok(())
    }
}

/// Shrink factors of the block range tried by the scale search (1 first: the plain min/max
/// choice, so the search never does worse than it).
const SHRINK: [f32; 7] = [1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7];

/// What a block's scale is chosen from: the signed value of largest magnitude (symmetric) or
/// the range widened to include 0 (asymmetric).
#[derive(Clone, Copy)]
enum BlockStats {
    Symmetric(f32),
    Asymmetric(f32, f32),
}

impl BlockStats {
    #[inline(always)]
    fn of(vals: &[f32], symmetric: bool) -> BlockStats {
        // `[min(lo, 0), max(hi, 0)]` in 16 lanes: comparisons, not `f32::min` (whose NaN rule
        // keeps the fold scalar); the values are finite, so both give the same range.
        let (mut lo, mut hi) = ([0f32; 16], [0f32; 16]);
        let chunks = vals.chunks_exact(16);
        let rest = chunks.remainder();
        for c in chunks {
            for j in 0..16 {
                lo[j] = if c[j] < lo[j] { c[j] } else { lo[j] };
                hi[j] = if c[j] > hi[j] { c[j] } else { hi[j] };
            }
        }
        for (j, &v) in rest.iter().enumerate() {
            lo[j] = if v < lo[j] { v } else { lo[j] };
            hi[j] = if v > hi[j] { v } else { hi[j] };
        }
        let lo = lo.iter().fold(0f32, |a, &b| if b < a { b } else { a });
        let hi = hi.iter().fold(0f32, |a, &b| if b > a { b } else { a });
        BlockStats::of_range(lo, hi, symmetric)
    }

    /// The statistics of a block whose range widened to include 0 is `[lo, hi]`.
    #[inline(always)]
    fn of_range(lo: f32, hi: f32, symmetric: bool) -> BlockStats {
        if symmetric {
            // The signed value of largest magnitude (the negative one on a tie, like
            // ONNX Runtime's blockwise quantizer).
            BlockStats::Symmetric(if hi > -lo { hi } else { lo })
        } else {
            BlockStats::Asymmetric(lo, hi)
        }
    }

    /// The scale and zero point with the range scaled by `shrink` (values outside the shrunk
    /// range saturate). `signed`: symmetric blocks take the positive scale `|m| / 7`, so
    /// `code - 8` is a signed INT4 value in [-7, 7] with zero point 0 (the form of a
    /// `DequantizeLinear` of INT4); else `m / -8`, which uses all 16 codes.
    #[inline(always)]
    fn params(self, shrink: f32, signed: bool) -> (f32, u8) {
        match self {
            BlockStats::Symmetric(m) if signed => (m.abs() * shrink / 7.0, 8),
            BlockStats::Symmetric(m) => (m * shrink / -8.0, 8),
            BlockStats::Asymmetric(lo, hi) => {
                let (lo, hi) = (lo * shrink, hi * shrink);
                let scale = (hi - lo) / 15.0;
                if scale == 0.0 {
                    return (0.0, 0);
                }
                let zp = round_saturate(f64::from(-lo / scale), 0, (0, 15));
                (scale, zp as u8)
            }
        }
    }
}

/// The code of `v` (`QuantizeLinear` to u4); a zero scale gives the zero point.
#[inline(always)]
fn code(v: f32, scale: f32, zp: u8) -> u8 {
    // The interpreter's `quantize_value` (f32 quotient, half to even, saturation), without
    // its libm rounding call: 40 % of INT4 time on a 32-layer model went to it. The code, a
    // whole number in 0..=15, is read from the low bits of `code + 2^23` (whose last mantissa
    // bit weighs 1): `as u8`, which saturates and maps NaN to 0, compiles to scalar
    // conversions, a third of the tile's time.
    let c = ((search_code(v, scale, f32::from(zp)) + 8_388_608.0).to_bits() & 0xf) as u8;
    if scale == 0.0 { zp } else { c }
}

/// The code of `v` as an f32, the way the scale search computes it: the f32 quotient clamped
/// to ±16 (beyond which codes saturate anyway), rounded half to even by adding and removing
/// 1.5 · 2^23, shifted and saturated. For finite values and a nonzero scale this is exactly
/// [`quantize_value`] (see the test); unlike `round_ties_even` it needs no SSE4.1 and
/// vectorizes.
#[inline(always)]
fn search_code(v: f32, scale: f32, z: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    let q = (v / scale).clamp(-16.0, 16.0);
    ((q + MAGIC) - MAGIC + z).clamp(0.0, 15.0)
}

/// The squared error of `v` coded with `scale` (`inv` its reciprocal) and zero point `z`, as
/// the scale search ranks candidates: a multiplication by the reciprocal instead of a division
/// (the codes written are computed exactly, by division, in `code`). The rounded quotient is
/// clamped to `[lo, hi] = [-z, 15 - z]` in one step, which gives what clamping it to ±16,
/// adding `z`, clamping to 0..=15 and subtracting `z` gives: the same integer where
/// `|v * inv| <= 16`, and beyond it both saturate (an integer past ±16 lies outside
/// `[-z, 15 - z]` for every zero point).
#[inline(always)]
fn code_error(v: f32, inv: f32, scale: f32, (lo, hi): (f32, f32)) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    // `clamp` as comparisons: `f32::clamp` checks `lo <= hi` at every call.
    let q = (v * inv + MAGIC) - MAGIC;
    let q = if q < lo { lo } else { q };
    let q = if q > hi { hi } else { q };
    let d = q * scale - v;
    d * d
}

/// The `[lo, hi]` of [`code_error`] for zero point `zp`.
#[inline(always)]
fn code_range(zp: u8) -> (f32, f32) {
    let z = f32::from(zp);
    (-z, 15.0 - z)
}

/// Squared error of a block quantized with `scale` and `zp` (eight partial sums, so the loop
/// vectorizes).
#[inline(always)]
fn block_error(vals: &[f32], scale: f32, zp: u8) -> f32 {
    if scale == 0.0 {
        return vals.iter().map(|v| v * v).sum();
    }
    let (inv, range) = (1.0 / scale, code_range(zp));
    let err = |v: f32| code_error(v, inv, scale, range);
    let mut acc = [0f32; 8];
    let chunks = vals.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += err(v);
        }
    }
    for (a, &v) in acc.iter_mut().zip(rest) {
        *a += err(v);
    }
    acc.iter().sum()
}

/// One block's scale, zero point and codes (`codes.len()` = block size; values beyond
/// `vals.len()` are padding zeros).
///
/// Symmetric blocks map the value of largest magnitude `m` to code 0 (`scale = m / -8`, zero
/// point 8); asymmetric ones spread `[min(lo, 0), max(hi, 0)]` over 0..=15. With `search`, the
/// range is also tried shrunk by each factor of [`SHRINK`] and the choice with the least
/// squared error of the block is kept.
pub(crate) fn quantize_block(
    vals: &[f32],
    symmetric: bool,
    search: bool,
    codes: &mut [u8],
) -> (f32, u8) {
    quantize_block_as(vals, symmetric, false, search, codes)
}

/// [`quantize_block`]; `signed` as in `BlockStats::params`. Compiled for each SIMD level the
/// machine may have and chosen at run time (the search is most of INT4's time); every level
/// computes the same floats in the same order, so the codes do not depend on the machine.
#[multiversion(targets = "simd")]
fn quantize_block_as(
    vals: &[f32],
    symmetric: bool,
    signed: bool,
    search: bool,
    codes: &mut [u8],
) -> (f32, u8) {
    let stats = BlockStats::of(vals, symmetric);
    let (mut scale, mut zp) = stats.params(1.0, signed);
    if search && scale != 0.0 {
        let mut best = block_error(vals, scale, zp);
        for &f in &SHRINK[1..] {
            let (s, z) = stats.params(f, signed);
            let e = block_error(vals, s, z);
            if e < best {
                (best, scale, zp) = (e, s, z);
            }
        }
    }
    for (i, c) in codes.iter_mut().enumerate() {
        *c = code(vals.get(i).copied().unwrap_or(0.0), scale, zp);
    }
    (scale, zp)
}

/// Columns quantized together when quantizing a `[K, N]` weight.
const TILE: usize = 64;

/// The blocks of up to [`TILE`] columns, quantized as [`quantize_block_as`] quantizes each one
/// (the same floats in the same order, so the same scales, zero points and codes), with the
/// columns as SIMD lanes: `tile[i * w + c]` is element `i` of column `c`'s block (`len` rows,
/// the rest of the block size `bs` is padding zeros). Writes `scales[c]`, `zps[c]` and the
/// codes of rows `2i` and `2i + 1` packed in `packed[i * w + c]`.
#[multiversion(targets = "simd")]
#[allow(
    clippy::too_many_arguments,
    reason = "one block row of a tile and its outputs"
)]
fn quantize_tile(
    tile: &[f32],
    (w, len, bs): (usize, usize, usize),
    (symmetric, signed, search): (bool, bool, bool),
    scales: &mut [f32],
    zps: &mut [u8],
    packed: &mut [u8],
) {
    let (mut lo, mut hi) = ([0f32; TILE], [0f32; TILE]);
    for row in tile.chunks_exact(w).take(len) {
        for c in 0..w {
            lo[c] = if row[c] < lo[c] { row[c] } else { lo[c] };
            hi[c] = if row[c] > hi[c] { row[c] } else { hi[c] };
        }
    }
    let mut stats = [BlockStats::Symmetric(0.0); TILE];
    for c in 0..w {
        stats[c] = BlockStats::of_range(lo[c], hi[c], symmetric);
    }
    for c in 0..w {
        (scales[c], zps[c]) = stats[c].params(1.0, signed);
    }
    if search {
        let mut scale = [0f32; TILE];
        let mut zp = [0u8; TILE];
        scale[..w].copy_from_slice(&scales[..w]);
        zp[..w].copy_from_slice(&zps[..w]);
        let (mut best, mut e) = ([0f32; TILE], [0f32; TILE]);
        tile_errors(tile, len, &scale[..w], &zp[..w], &mut best[..w]);
        for &f in &SHRINK[1..] {
            for c in 0..w {
                (scale[c], zp[c]) = stats[c].params(f, signed);
            }
            tile_errors(tile, len, &scale[..w], &zp[..w], &mut e[..w]);
            for c in 0..w {
                // A zero-scale block is not searched.
                if scales[c] != 0.0 && e[c] < best[c] {
                    best[c] = e[c];
                    (scales[c], zps[c]) = (scale[c], zp[c]);
                }
            }
        }
    }
    // Codes two rows at a time, packed low nibble first: `packed[i * w + c]` holds rows
    // `2i` and `2i + 1` of column `c`.
    let zeros = [0f32; TILE];
    let (scales, zps) = (&scales[..w], &zps[..w]);
    for (i, out) in packed.chunks_exact_mut(w).take(bs / 2).enumerate() {
        let row = |r: usize| {
            tile.get(r * w..(r + 1) * w)
                .filter(|_| r < len)
                .unwrap_or(&zeros[..w])
        };
        let (even, odd) = (row(2 * i), row(2 * i + 1));
        for ((((o, &a), &b), &s), &z) in out.iter_mut().zip(even).zip(odd).zip(scales).zip(zps) {
            *o = code(a, s, z) | (code(b, s, z) << 4);
        }
    }
}

/// `block_error` of each column of a tile (as [`quantize_tile`] lays it out, `scale.len()`
/// columns): eight partial sums by position, added in order, the columns as SIMD lanes.
/// Sixteen columns at a time, so that their parameters and the eight partial sums stay in
/// registers while the rows stream past.
#[inline(always)]
fn tile_errors(tile: &[f32], len: usize, scale: &[f32], zp: &[u8], e: &mut [f32]) {
    const L: usize = 16;
    let w = scale.len();
    for c0 in (0..w).step_by(L) {
        let n = L.min(w - c0);
        // Lanes past `n` see zeros with a zero scale: finite, and never read back.
        let (mut inv, mut s, mut lo, mut hi) = ([0f32; L], [0f32; L], [0f32; L], [0f32; L]);
        for j in 0..n {
            s[j] = scale[c0 + j];
            inv[j] = 1.0 / s[j];
            (lo[j], hi[j]) = code_range(zp[c0 + j]);
        }
        let row = |i: usize| -> [f32; L] {
            let at = i * w + c0;
            let mut v = [0f32; L];
            v[..n].copy_from_slice(&tile[at..at + n]);
            v
        };
        let add = |a: &mut [f32; L], v: [f32; L]| {
            for j in 0..L {
                a[j] += code_error(v[j], inv[j], s[j], (lo[j], hi[j]));
            }
        };
        let mut acc = [[0f32; L]; 8];
        for q in 0..len / 8 {
            for (r, a) in acc.iter_mut().enumerate() {
                add(a, row(8 * q + r));
            }
        }
        for (r, a) in acc.iter_mut().enumerate().take(len % 8) {
            add(a, row(len / 8 * 8 + r));
        }
        for j in 0..n {
            e[c0 + j] = acc.iter().fold(0.0, |t, a| t + a[j]);
        }
    }
}

/// Blockwise INT4 of a `[K, N]` (or, `trans`, `[N, K]`) weight times `alpha`, in
/// `MatMulNBits` layout.
fn quantize_int4(
    src: &Source<'_>,
    k: usize,
    n: usize,
    trans: bool,
    alpha: f32,
    config: &WeightOnlyConfig,
    signed: bool,
) -> Result<Quantized, String> {
    let (bs, symmetric, search) = (config.block_size, config.symmetric, config.search);
    let kb = k.div_ceil(bs);
    let blob = bs / 2;
    let zp_row = kb.div_ceil(2);
    let mut packed = vec![0u8; n * kb * blob];
    let mut scales = vec![0f32; n * kb];
    let mut zps = vec![0u8; n * zp_row];
    if trans {
        // Rows of N, each K contiguous values.
        let mut col = Vec::with_capacity(bs);
        let mut codes = vec![0u8; bs];
        src.for_rows(n, k, 1, |r0, chunk| {
            for (i, row) in chunk.chunks_exact(k).enumerate() {
                for (b, block) in row.chunks(bs).enumerate() {
                    col.clear();
                    col.extend(block.iter().map(|v| v * alpha));
                    let (scale, zp) =
                        quantize_block_as(&col, symmetric, signed, search, &mut codes);
                    let (row, q) = (r0 + i, (r0 + i) * kb + b);
                    scales[q] = scale;
                    for (i, pair) in codes.chunks_exact(2).enumerate() {
                        packed[q * blob + i] = pair[0] | (pair[1] << 4);
                    }
                    zps[row * zp_row + b / 2] |= zp << (4 * (b % 2));
                }
            }
            Ok(())
        })?;
    } else {
        let mut tile = Vec::with_capacity(TILE * bs);
        let mut tile_codes = vec![0u8; TILE * bs / 2];
        // Rows of K: a chunk holds whole blocks of K for every column.
        src.for_rows(k, n, bs, |r0, chunk| {
            let rows = chunk.len() / n;
            for local in (0..rows).step_by(bs) {
                let b = (r0 + local) / bs;
                let len = (local + bs).min(rows) - local;
                // A tile of columns at a time, the columns as SIMD lanes.
                for c0 in (0..n).step_by(TILE) {
                    let w = TILE.min(n - c0);
                    tile.clear();
                    for i in 0..len {
                        let at = (local + i) * n + c0;
                        tile.extend(chunk[at..at + w].iter().map(|v| v * alpha));
                    }
                    let (mut ts, mut tz) = ([0f32; TILE], [0u8; TILE]);
                    quantize_tile(
                        &tile,
                        (w, len, bs),
                        (symmetric, signed, search),
                        &mut ts,
                        &mut tz,
                        &mut tile_codes,
                    );
                    for c in 0..w {
                        let q = (c0 + c) * kb + b;
                        scales[q] = ts[c];
                        for (i, p) in packed[q * blob..(q + 1) * blob].iter_mut().enumerate() {
                            *p = tile_codes[i * w + c];
                        }
                        zps[(c0 + c) * zp_row + b / 2] |= tz[c] << (4 * (b % 2));
                    }
                }
            }
            Ok(())
        })?;
    }
    Ok(Quantized::Int4 {
        packed,
        scales,
        zero_points: (!symmetric).then_some(zps),
    })
}

/// FP8 E4M3 of a `[K, N]` (or, `trans`, `[N, K]`) weight with one scale per N.
fn quantize_fp8(src: &Source<'_>, k: usize, n: usize, trans: bool) -> Result<Quantized, String> {
    let (rows, cols) = if trans { (n, k) } else { (k, n) };
    let mut amax = vec![0f32; n];
    src.for_rows(rows, cols, 1, |r0, chunk| {
        for (i, row) in chunk.chunks_exact(cols).enumerate() {
            for (j, v) in row.iter().enumerate() {
                let ch = if trans { r0 + i } else { j };
                amax[ch] = amax[ch].max(v.abs());
            }
        }
        Ok(())
    })?;
    let scales: Vec<f32> = amax
        .iter()
        .map(|&a| if a == 0.0 { 1.0 } else { a / E4M3_MAX })
        .collect();
    let mut codes = vec![0u8; k * n];
    src.for_rows(rows, cols, 1, |r0, chunk| {
        for (i, row) in chunk.chunks_exact(cols).enumerate() {
            for (j, v) in row.iter().enumerate() {
                let ch = if trans { r0 + i } else { j };
                codes[(r0 + i) * cols + j] = quantize_float(*v, scales[ch], DType::F8E4M3FN, true);
            }
        }
        Ok(())
    })?;
    Ok(Quantized::Fp8 { codes, scales })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use mmq_ir::{Entry, ModelInfo};
    use mmq_kernels::{Interpreter, RtValue, Tensor};

    use super::*;
    use mmq_kernels::quant::quantize_value;

    fn f32_const(m: &mut Module, name: &str, shape: Vec<i64>, v: &[f32]) -> Value {
        m.add_const(ConstData::new(
            Some(name.to_owned()),
            DType::F32,
            shape,
            Storage::Inline(Bytes::from(
                v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>(),
            )),
        ))
    }

    fn f32_ty(shape: &[i64]) -> Type {
        Type::tensor(DType::F32, shape.iter().map(|&d| Dim::known(d)).collect())
    }

    /// Deterministic pseudo-random weights with a few outliers.
    fn weights(len: usize, seed: u32) -> Vec<f32> {
        (0..len)
            .map(|i| {
                let x = ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) as f32
                    / (1u32 << 24) as f32;
                let v = x - 0.5;
                if i % 37 == 0 { v * 6.0 } else { v }
            })
            .collect()
    }

    fn module(opset: i64) -> (Module, GraphId) {
        let mut m = Module::new();
        let g = m.add_graph("g", None);
        m.entries.push(Entry {
            graph: g,
            model: ModelInfo {
                opsets: vec![(String::new(), opset)],
                ..ModelInfo::default()
            },
        });
        (m, g)
    }

    fn run(m: &Module, g: GraphId, x: &[f32], shape: &[usize]) -> Vec<f32> {
        let mut feeds = HashMap::new();
        feeds.insert(
            "x".to_owned(),
            RtValue::from(Tensor::from_f32(shape.to_vec(), x.to_vec()).expect("tensor")),
        );
        let out = Interpreter::new(m).run(g, &feeds).expect("runs");
        out[0].1.as_tensor().expect("tensor").to_f32().expect("f32")
    }

    fn cosine(a: &[f32], b: &[f32]) -> f64 {
        let dot: f64 = a
            .iter()
            .zip(b)
            .map(|(x, y)| f64::from(*x) * f64::from(*y))
            .sum();
        let na: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
        let nb: f64 = b.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
        dot / (na * nb)
    }

    fn ops(m: &Module, g: GraphId) -> Vec<String> {
        m.graphs[g]
            .nodes()
            .iter()
            .map(|&n| m.nodes[n].op.op_type().to_owned())
            .collect()
    }

    /// `x [3, K] · W [K, N]` with K = 40 (the last block padded) and N = 5.
    fn matmul_model(k: i64, n: i64) -> (Module, GraphId, Vec<f32>) {
        let (mut m, g) = module(21);
        let x = m.add_input(g, Some("x".into()), f32_ty(&[3, k]));
        let wv = weights((k * n) as usize, 7);
        let w = f32_const(&mut m, "w", vec![k, n], &wv);
        let node = m.add_node(
            g,
            Op::MatMul {},
            vec![Some(x), Some(w)],
            vec![Some((Some("y".into()), f32_ty(&[3, n])))],
            Some("mm".into()),
        );
        m.graphs[g].outputs = vec![m.nodes[node].outputs[0].expect("output")];
        (m, g, wv)
    }

    fn int4(block_size: usize, symmetric: bool) -> WeightOnlyPass {
        WeightOnlyPass::new(WeightOnlyConfig {
            scheme: WeightScheme::Int4,
            block_size,
            symmetric,
            accuracy_level: None,
            search: false,
        })
    }

    /// The interpreter's `QuantizeLinear` to u4 of `vals` with `scale` and `zp`.
    fn interp_quantize_u4(vals: &[f32], scale: f32, zp: u8) -> Vec<u8> {
        let (mut m, g) = module(21);
        let x = m.add_input(g, Some("x".into()), f32_ty(&[vals.len() as i64]));
        let s = f32_const(&mut m, "s", vec![], &[scale]);
        let z = m.add_const(ConstData::new(
            None,
            DType::U4,
            vec![],
            Storage::Inline(Bytes::from(vec![zp])),
        ));
        let q_ty = Type::tensor(DType::U4, vec![Dim::known(vals.len() as i64)]);
        let node = m.add_node(
            g,
            Op::QuantizeLinear {
                axis: None,
                block_size: None,
                output_dtype: None,
                precision: None,
                saturate: None,
            },
            vec![Some(x), Some(s), Some(z)],
            vec![Some((Some("q".into()), q_ty))],
            None,
        );
        m.graphs[g].outputs = vec![m.nodes[node].outputs[0].expect("output")];
        run(&m, g, vals, &[vals.len()])
            .into_iter()
            .map(|c| c as u8)
            .collect()
    }

    #[test]
    fn block_codes_match_the_interpreters_quantize_linear() {
        // Values on exact half steps exercise round half to even; the last is padding.
        let vals = [0.25f32, -1.0, 0.125, 0.375, 0.0625, -0.9375, 0.5, 0.8125];
        for symmetric in [true, false] {
            let mut codes = [0u8; 10];
            let (scale, zp) = quantize_block(&vals, symmetric, false, &mut codes);
            let want = interp_quantize_u4(&vals, scale, zp);
            assert_eq!(&codes[..8], &want[..], "symmetric {symmetric}");
            // Padding quantizes 0 to the zero point.
            assert_eq!(codes[8..], [zp, zp]);
        }
        // Symmetric: the largest magnitude (-1.0) maps to code 0 exactly and scale = 1/8.
        let mut codes = [0u8; 8];
        let (scale, zp) = quantize_block(&vals, true, false, &mut codes);
        assert_eq!((scale, zp, codes[1]), (0.125, 8, 0));
        // 0.0625 / 0.125 = 0.5 rounds to even 0 → code 8; 0.375 / 0.125 = 3 → 11.
        assert_eq!((codes[4], codes[3]), (8, 11));
        // Asymmetric: [-1, 0.8125] over 15 steps, zero point round(1 / (1.8125 / 15)) = 8.
        let (scale, zp) = quantize_block(&vals, false, false, &mut codes);
        assert_eq!(zp, 8);
        assert!((scale - 1.8125 / 15.0).abs() < 1e-7);
        // An all-zero block quantizes without dividing by zero.
        assert_eq!(
            quantize_block(&[0.0; 4], true, true, &mut codes[..4]),
            (-0.0, 8)
        );
        assert_eq!(codes[..4], [8; 4]);
    }

    #[test]
    fn fast_codes_equal_quantize_value() {
        // Quotients on and near half steps, saturating ones, and both signs of scale.
        let vals: Vec<f32> = (-400..400)
            .map(|i| i as f32 * 0.0625 + 0.001 * (i % 3) as f32)
            .collect();
        for scale in [0.125f32, -0.125, 0.3, -1.7, 2.5] {
            for zp in [0u8, 8, 15] {
                for &v in &vals {
                    let want = quantize_value(v, scale, i32::from(zp), (0, 15)) as u8;
                    assert_eq!(code(v, scale, zp), want, "{v} / {scale} + {zp}");
                }
            }
        }
    }

    /// A tile of columns quantizes each column's block bit for bit as the one-block path does:
    /// both ranges and signednesses, with and without the search, full and short blocks,
    /// all-zero columns, narrow tiles.
    #[test]
    fn tiles_quantize_each_column_as_one_block() {
        let bs = 32;
        for (w, len) in [(TILE, bs), (7, bs), (TILE, 13), (3, 1)] {
            let mut tile = weights(w * len, 11);
            for i in 0..len {
                tile[i * w] = 0.0; // column 0 is all zeros: scale 0
            }
            for (symmetric, signed, search) in [
                (true, false, true),
                (true, true, true),
                (false, false, true),
                (true, false, false),
                (false, false, false),
            ] {
                let (mut ts, mut tz) = ([0f32; TILE], [0u8; TILE]);
                let mut packed = vec![0u8; w * bs / 2];
                quantize_tile(
                    &tile,
                    (w, len, bs),
                    (symmetric, signed, search),
                    &mut ts,
                    &mut tz,
                    &mut packed,
                );
                for c in 0..w {
                    let col: Vec<f32> = (0..len).map(|i| tile[i * w + c]).collect();
                    let mut codes = vec![0u8; bs];
                    let (scale, zp) =
                        quantize_block_as(&col, symmetric, signed, search, &mut codes);
                    let what = format!("w {w} len {len} col {c} {symmetric} {signed} {search}");
                    assert_eq!((ts[c].to_bits(), tz[c]), (scale.to_bits(), zp), "{what}");
                    for i in 0..bs / 2 {
                        assert_eq!(
                            packed[i * w + c],
                            codes[2 * i] | (codes[2 * i + 1] << 4),
                            "{what} pair {i}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn scale_search_never_increases_block_error() {
        let err = |vals: &[f32], symmetric, search| {
            let mut codes = vec![0u8; vals.len()];
            let (s, z) = quantize_block(vals, symmetric, search, &mut codes);
            vals.iter()
                .zip(&codes)
                .map(|(v, &c)| f64::from((f32::from(c) - f32::from(z)) * s - v).powi(2))
                .sum::<f64>()
        };
        let w = weights(32 * 64, 11);
        let mut better = 0;
        for block in w.chunks(32) {
            for symmetric in [true, false] {
                let (plain, searched) = (err(block, symmetric, false), err(block, symmetric, true));
                assert!(searched <= plain, "{searched} > {plain}");
                better += usize::from(searched < plain);
            }
        }
        // Blocks with an outlier gain from clipping it.
        assert!(better > 10, "{better}");
    }

    #[test]
    fn int4_matmul_becomes_matmul_nbits_in_ort_layout() {
        let (k, n) = (40i64, 5i64);
        for (bs, symmetric) in [(16, true), (32, false), (64, true)] {
            let (mut m, g, wv) = matmul_model(k, n);
            let x = weights(3 * k as usize, 99);
            let want = run(&m, g, &x, &[3, k as usize]);
            let report = int4(bs, symmetric)
                .run(&mut m, &PassOptions::default())
                .expect("pass");
            assert_eq!(report.counters.get("int4-matmul"), Some(&1));
            assert_eq!(ops(&m, g), ["MatMulNBits"]);
            let node = m.graphs[g].nodes()[0];
            let nd = &m.nodes[node];
            let kb = (k as usize).div_ceil(bs) as i64;
            let shapes: Vec<Vec<i64>> = nd
                .inputs
                .iter()
                .skip(1)
                .map(|v| {
                    m.consts[m.const_source(v.expect("operand")).expect("const")]
                        .shape
                        .clone()
                })
                .collect();
            let mut expect = vec![vec![n, kb, bs as i64 / 2], vec![n, kb]];
            if !symmetric {
                expect.push(vec![n, (kb + 1) / 2]);
            }
            assert_eq!(shapes, expect);
            // The kernel's dequantization of the packed weight equals the block math.
            let got = run(&m, g, &x, &[3, k as usize]);
            let mut deq = vec![0f32; (k * n) as usize];
            for c in 0..n as usize {
                for b in 0..kb as usize {
                    let r0 = b * bs;
                    let r1 = (r0 + bs).min(k as usize);
                    let vals: Vec<f32> = (r0..r1).map(|r| wv[r * n as usize + c]).collect();
                    let mut codes = vec![0u8; bs];
                    let (s, z) = quantize_block(&vals, symmetric, false, &mut codes);
                    for r in r0..r1 {
                        deq[r * n as usize + c] = (f32::from(codes[r - r0]) - f32::from(z)) * s;
                    }
                }
            }
            let mut reference = vec![0f32; 3 * n as usize];
            for i in 0..3 {
                for c in 0..n as usize {
                    reference[i * n as usize + c] = (0..k as usize)
                        .map(|r| x[i * k as usize + r] * deq[r * n as usize + c])
                        .sum();
                }
            }
            for (a, b) in got.iter().zip(&reference) {
                assert!((a - b).abs() < 1e-4, "{got:?} vs {reference:?}");
            }
            assert!(cosine(&got, &want) > 0.98, "bs {bs}: {got:?} vs {want:?}");
        }
    }

    #[test]
    fn int4_gemm_folds_alpha_and_bias_and_reads_constant_nodes_in_bodies() {
        // If(cond) { Gemm(x, W [N, K] from a Constant node, C) transB = 1 } else { x·1 }.
        let (k, n) = (64i64, 4i64);
        let (mut m, g) = module(21);
        let x = m.add_input(g, Some("x".into()), f32_ty(&[2, k]));
        let cond = m.add_const(ConstData::new(
            None,
            DType::Bool,
            vec![],
            Storage::Inline(Bytes::from(vec![1u8])),
        ));
        let then_g = m.add_graph("then", None);
        let else_g = m.add_graph("else", None);
        let wv = weights((k * n) as usize, 3);
        let wc = m.add_attr_const(ConstData::new(
            Some("w".into()),
            DType::F32,
            vec![n, k],
            Storage::Inline(Bytes::from(
                wv.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(),
            )),
        ));
        let cn = m.add_node(
            then_g,
            Op::Constant {
                value: Some(wc),
                value_float: None,
                value_floats: None,
                value_int: None,
                value_ints: None,
                value_string: None,
                value_strings: None,
            },
            vec![],
            vec![Some((Some("wconst".into()), f32_ty(&[n, k])))],
            None,
        );
        let w = m.nodes[cn].outputs[0];
        let bias = f32_const(&mut m, "c", vec![n], &[0.5, -1.0, 2.0, 0.0]);
        let gemm = m.add_node(
            then_g,
            Op::Gemm {
                alpha: Some(0.5),
                beta: Some(2.0),
                trans_a: None,
                trans_b: Some(1),
            },
            vec![Some(x), w, Some(bias)],
            vec![Some((Some("t".into()), f32_ty(&[2, n])))],
            Some("gemm".into()),
        );
        m.graphs[then_g].outputs = vec![m.nodes[gemm].outputs[0].expect("out")];
        let zero = f32_const(&mut m, "z", vec![2, n], &[0.0; 8]);
        let id = m.add_node(
            else_g,
            Op::Identity {},
            vec![Some(zero)],
            vec![Some((Some("e".into()), f32_ty(&[2, n])))],
            None,
        );
        m.graphs[else_g].outputs = vec![m.nodes[id].outputs[0].expect("out")];
        let if_node = m.add_node(
            g,
            Op::If {
                then_branch: Some(then_g),
                else_branch: Some(else_g),
            },
            vec![Some(cond)],
            vec![Some((Some("y".into()), f32_ty(&[2, n])))],
            None,
        );
        m.graphs[then_g].parent = Some(if_node);
        m.graphs[else_g].parent = Some(if_node);
        m.graphs[g].outputs = vec![m.nodes[if_node].outputs[0].expect("out")];
        let xv = weights(2 * k as usize, 5);
        let want = run(&m, g, &xv, &[2, k as usize]);
        let report = int4(32, true)
            .run(&mut m, &PassOptions::default())
            .expect("pass");
        assert_eq!(report.counters.get("int4-gemm"), Some(&1));
        // The Constant node is dead and removed.
        assert_eq!(ops(&m, then_g), ["MatMulNBits"]);
        let nd = &m.nodes[m.graphs[then_g].nodes()[0]];
        assert_eq!(nd.inputs.len(), 6, "bias is input 5");
        let got = run(&m, g, &xv, &[2, k as usize]);
        assert!(cosine(&got, &want) > 0.99, "{got:?} vs {want:?}");
        // beta * C lands in the bias exactly: with a zero input only the bias remains.
        let got0 = run(&m, g, &[0.0; 128], &[2, k as usize]);
        assert_eq!(got0[..4], [1.0, -2.0, 4.0, 0.0]);
    }

    #[test]
    fn int4_fused_matmul_folds_alpha_and_refuses_transposed_activations() {
        // FusedMatMul(x, W [N, K]) alpha 0.5, transB 1: the form -O2 leaves when it absorbs a
        // scale (GELU's 0.5) into the product after it.
        let (k, n) = (64i64, 6i64);
        for trans_a in [0, 1] {
            let (mut m, g) = module(21);
            let xs = if trans_a == 1 { [k, 3] } else { [3, k] };
            let x = m.add_input(g, Some("x".into()), f32_ty(&xs));
            let w = f32_const(&mut m, "w", vec![n, k], &weights((k * n) as usize, 11));
            let node = m.add_node(
                g,
                Op::FusedMatMul {
                    alpha: Some(0.5),
                    trans_a: Some(trans_a),
                    trans_b: Some(1),
                    trans_batch_a: None,
                    trans_batch_b: None,
                },
                vec![Some(x), Some(w)],
                vec![Some((Some("y".into()), f32_ty(&[3, n])))],
                Some("fmm".into()),
            );
            m.graphs[g].outputs = vec![m.nodes[node].outputs[0].expect("output")];
            let xv = weights(3 * k as usize, 13);
            let shape = xs.map(|d| d as usize);
            let want = run(&m, g, &xv, &shape);
            let report = int4(32, true)
                .run(&mut m, &PassOptions::default())
                .expect("pass");
            if trans_a == 1 {
                assert_eq!(
                    report.counters.get("skipped-fused-matmul-trans-a"),
                    Some(&1)
                );
                assert_eq!(ops(&m, g), ["FusedMatMul"]);
                continue;
            }
            assert_eq!(report.counters.get("int4-matmul"), Some(&1));
            assert_eq!(ops(&m, g), ["MatMulNBits"]);
            let got = run(&m, g, &xv, &shape);
            // alpha is in the scales: without it the result would be twice the reference.
            assert!(cosine(&got, &want) > 0.99, "{got:?} vs {want:?}");
            let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm(&got) / norm(&want) - 1.0).abs() < 0.05);
        }
    }

    #[test]
    fn fp8_weights_get_dequantize_linear_and_activations_with_ranges() {
        let (k, n) = (40i64, 5i64);
        let (mut m, g, _) = matmul_model(k, n);
        let x = weights(3 * k as usize, 99);
        let want = run(&m, g, &x, &[3, k as usize]);
        let xv = m.graphs[g].inputs[0];
        let mut ranges = HashMap::new();
        ranges.insert(xv, (-3.0f32, 3.0f32));
        let pass = WeightOnlyPass::new(WeightOnlyConfig {
            scheme: WeightScheme::Fp8,
            ..WeightOnlyConfig::default()
        })
        .with_activation_ranges(ranges);
        let report = pass.run(&mut m, &PassOptions::default()).expect("pass");
        assert_eq!(report.counters.get("fp8-weights"), Some(&1));
        assert_eq!(report.counters.get("fp8-activations"), Some(&1));
        assert_eq!(
            ops(&m, g),
            [
                "DequantizeLinear",
                "QuantizeLinear",
                "DequantizeLinear",
                "MatMul"
            ]
        );
        let got = run(&m, g, &x, &[3, k as usize]);
        assert!(cosine(&got, &want) > 0.999, "{got:?} vs {want:?}");
        mmq_ir::verify::verify(&m).expect("valid module");
    }

    #[test]
    fn bad_configurations_are_errors_and_filters_choose_nodes() {
        let (mut m, _, _) = matmul_model(40, 5);
        let err = int4(48, true)
            .run(&mut m, &PassOptions::default())
            .expect_err("block 48");
        assert!(err.to_string().contains("block size 48"), "{err}");
        let (mut m17, g17, _) = {
            let (mut mm, g, w) = matmul_model(40, 5);
            mm.entries[0].model.opsets = vec![(String::new(), 17)];
            (mm, g, w)
        };
        let err = WeightOnlyPass::new(WeightOnlyConfig {
            scheme: WeightScheme::Fp8,
            ..WeightOnlyConfig::default()
        })
        .run(&mut m17, &PassOptions::default())
        .expect_err("opset 17");
        assert!(err.to_string().contains("opset 17"), "{err}");
        assert_eq!(ops(&m17, g17), ["MatMul"]);
        // A filter that rejects every node leaves the model alone.
        let (mut m, g, _) = matmul_model(40, 5);
        let report = int4(32, true)
            .with_filter(Box::new(|_, _| false))
            .run(&mut m, &PassOptions::default())
            .expect("pass");
        assert!(!report.changed);
        assert_eq!(ops(&m, g), ["MatMul"]);
    }

    /// `x [3, 64]` read by three `MatMul`s (N = 8, 16, 24) whose results go through `Relu`
    /// (`all`), or by the first alone.
    fn siblings_model(all: bool) -> (Module, GraphId) {
        let (mut m, g) = module(21);
        let x = m.add_input(g, Some("x".into()), f32_ty(&[3, 64]));
        let mut outs = Vec::new();
        for (i, n) in [8i64, 16, 24]
            .into_iter()
            .enumerate()
            .take(if all { 3 } else { 1 })
        {
            let w = f32_const(
                &mut m,
                &format!("w{i}"),
                vec![64, n],
                &weights(64 * n as usize, i as u32 + 3),
            );
            let mm = m.add_node(
                g,
                Op::MatMul {},
                vec![Some(x), Some(w)],
                vec![Some((Some(format!("p{i}")), f32_ty(&[3, n])))],
                Some(format!("mm{i}")),
            );
            let p = m.nodes[mm].outputs[0];
            let r = m.add_node(
                g,
                Op::Relu {},
                vec![p],
                vec![Some((Some(format!("y{i}")), f32_ty(&[3, n])))],
                None,
            );
            outs.push(m.nodes[r].outputs[0].expect("output"));
        }
        m.graphs[g].outputs = outs;
        (m, g)
    }

    #[test]
    fn siblings_pack_into_one_product_with_identical_results() {
        let x = weights(3 * 64, 11);
        for symmetric in [true, false] {
            let (mut packed, g) = siblings_model(true);
            let report = int4(32, symmetric)
                .run(&mut packed, &PassOptions::default())
                .expect("quantizes");
            assert_eq!(report.counters.get("int4-packed"), Some(&2));
            let kinds = ops(&packed, g);
            assert_eq!(
                kinds.iter().filter(|k| *k == "MatMulNBits").count(),
                1,
                "{kinds:?}"
            );
            assert!(kinds.iter().any(|k| k == "Split"), "{kinds:?}");
            assert!(mmq_ir::verify::verify_all(&packed).is_empty());
            let (mut alone, g1) = siblings_model(false);
            int4(32, symmetric)
                .run(&mut alone, &PassOptions::default())
                .expect("quantizes");
            // The first result of the packed product equals the first product quantized alone,
            // bit for bit.
            assert_eq!(run(&packed, g, &x, &[3, 64]), run(&alone, g1, &x, &[3, 64]));
            let names: Vec<_> = packed.graphs[g]
                .outputs
                .iter()
                .map(|&o| packed.values[o].name.clone().unwrap_or_default())
                .collect();
            assert_eq!(names, ["y0", "y1", "y2"]);
        }
    }

    /// Two `MatMul`s of `x`: with one weight (`shared`) or two, their results graph outputs
    /// (`outputs`) or read by `Relu`s.
    fn two_products(shared: bool, outputs: bool) -> (Module, GraphId) {
        let (mut m, g) = module(21);
        let x = m.add_input(g, Some("x".into()), f32_ty(&[3, 64]));
        let w0 = f32_const(&mut m, "w0", vec![64, 8], &weights(64 * 8, 5));
        let w1 = f32_const(&mut m, "w1", vec![64, 8], &weights(64 * 8, 6));
        let mut outs = Vec::new();
        for (i, w) in [w0, if shared { w0 } else { w1 }].into_iter().enumerate() {
            let mm = m.add_node(
                g,
                Op::MatMul {},
                vec![Some(x), Some(w)],
                vec![Some((Some(format!("p{i}")), f32_ty(&[3, 8])))],
                None,
            );
            let mut y = m.nodes[mm].outputs[0].expect("output");
            if !outputs {
                let r = m.add_node(
                    g,
                    Op::Relu {},
                    vec![Some(y)],
                    vec![Some((Some(format!("y{i}")), f32_ty(&[3, 8])))],
                    None,
                );
                y = m.nodes[r].outputs[0].expect("output");
            }
            outs.push(y);
        }
        m.graphs[g].outputs = outs;
        (m, g)
    }

    #[test]
    fn siblings_that_are_graph_outputs_or_share_weights_stay_apart() {
        // Each condition alone keeps the products apart; without either they are packed.
        for (shared, outputs, packed) in [
            (false, true, false),
            (true, false, false),
            (false, false, true),
        ] {
            let (mut m, g) = two_products(shared, outputs);
            let report = int4(32, true)
                .run(&mut m, &PassOptions::default())
                .expect("quantizes");
            let nbits = ops(&m, g).iter().filter(|k| *k == "MatMulNBits").count();
            if packed {
                assert_eq!(report.counters.get("int4-packed"), Some(&1));
                assert_eq!(nbits, 1);
            } else {
                assert_eq!(
                    report.counters.get("int4-packed"),
                    None,
                    "{shared} {outputs}"
                );
                assert_eq!(nbits, 2, "{shared} {outputs}");
            }
        }
    }
}
