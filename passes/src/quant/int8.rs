//! INT8 quantization: static W8A8 (Q/DQ) and dynamic, in ONNX Runtime's CPU provider's forms
//! and, by the target's rules, TensorRT's.
//!
//! Q/DQ go only where ONNX Runtime's CPU provider fuses them into an integer kernel, so the
//! output never pays for a Q/DQ pair that stays a float round trip:
//!
//! - **Static, `MatMul` with a constant 2-d weight** `[K, N]`: `Q(a) → DQ → MatMul ← DQ(Wq)`.
//!   With no Q on the result, ONNX Runtime's QDQ selectors turn the unit into
//!   `com.microsoft.MatMulIntegerToFloat` (u8/i8 activations × i8 weights, float out), which keeps
//!   the float consumers (`Add`, `Softmax`, norms) as they are: no `DQ → Q` churn between layers.
//! - **`Gemm` with a constant weight** (alpha 1, beta 1, A not transposed) is first rewritten to
//!   `MatMul` (the weight transposed ahead when `transB`) plus `Add` for the bias, then quantized
//!   as a `MatMul`: ONNX Runtime's integer Gemm path (`QGemm`) needs an int32 bias and per-tensor
//!   activation units around every Gemm, while `MatMulIntegerToFloat` takes the float bias.
//! - **Static, `Conv` with a constant weight**: `DQ(Q(x))`, `DQ(Wq)`, `DQ(int32 bias)` and `Q → DQ`
//!   on the result, the unit ONNX Runtime fuses into `QLinearConv`. The bias is quantized with
//!   scale `x_scale * w_scale[c]`, as the fused kernel requires.
//! - **Dynamic, `MatMul` with a constant 2-d weight**: `DynamicQuantizeLinear(a)`,
//!   `MatMulInteger(a_q, Wq, a_zp)`, `Cast`, `Mul(·, a_scale * w_scale)`, the pattern ONNX Runtime
//!   fuses into `com.microsoft.DynamicQuantizeMatMul`.
//!
//! The target's [`crate::targets::QdqRules`] shape the units: TensorRT takes symmetric
//! activations only, weights in full 8 bits, the `Conv` bias in float, every eligible node
//! (no placement cost model) and no run-time quantization (bodies stay float there).
//!
//! Weights are quantized per output channel, symmetric, to i8 in `[-63, 63]` by default
//! ([`Int8Pass::reduce_range`]; `[-127, 127]` without it) (the MatMul
//! column, axis 1 of `[K, N]`; the Conv output channel, axis 0). Activations are per tensor:
//! asymmetric u8 by default, symmetric i8 on request, from calibrated [`Ranges`]. One
//! activation feeding several quantized nodes (Q, K and V projections of one norm output) gets
//! one `QuantizeLinear` and one `DequantizeLinear` per consumer (ONNX Runtime wants a DQ per
//! node unit), so every consumer shares its scale. Data-movement ops (`Reshape`, `Transpose`,
//! ...) keep the range of their input, so a value seen through them is calibrated once at its
//! source. Rounding and saturation are the interpreter's ([`mmq_kernels::quant`]).
//!
//! A weight is an f32 constant: an initializer or the tensor of a `Constant` node (a `Constant`
//! node left without readers is removed). `MatMul` and `Gemm` nodes inside `If`/`Loop`/`Scan`
//! bodies are quantized dynamically under both schemes (calibration observes top-level values
//! only), counted as `quantized-subgraph`; `Conv` in bodies stays float. Nodes already fed by a
//! `DequantizeLinear` (QAT models) are left as they are.

use std::collections::HashMap;

use bytes::Bytes;
use mmq_ir::edit::NewNode;
use mmq_ir::{At, ConstData, DType, GraphId, Module, Node, Op, Storage, Type, Value, ValueDef};
use mmq_kernels::Tensor;
use mmq_kernels::quant::quantize_value;

use crate::pass::{Pass, PassError, PassOptions, PassReport};
use crate::quant::calibrate::{Range, Ranges};
use crate::quant::place::{self, Placement, Unit};

/// Chooses the nodes a pass may quantize (a precision map's plan).
pub type NodeFilter = Box<dyn Fn(&Module, Node) -> bool + Send + Sync>;

/// The INT8 scheme.
#[derive(Clone, Debug)]
pub enum Int8Scheme {
    /// Static W8A8 with calibrated activation ranges.
    Static {
        /// Ranges of the activations [`Int8Pass::activations`] lists.
        ranges: Ranges,
        /// Symmetric i8 activations (zero point 0) instead of asymmetric u8.
        symmetric: bool,
    },
    /// Dynamic: activation scales computed at run time, weights quantized ahead.
    Dynamic,
}

/// How many scales a run-time quantized activation gets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ActGranularity {
    /// One scale for the tensor (`DynamicQuantizeLinear`, asymmetric u8).
    #[default]
    PerTensor,
    /// One scale per token: per row, the last axis reduced (symmetric i8), for language.
    PerToken,
    /// One scale per patch: the same per-row form, named for vision activations.
    PerPatch,
}

impl ActGranularity {
    /// Every granularity, in the order help texts list them.
    pub const ALL: [ActGranularity; 3] = [
        ActGranularity::PerTensor,
        ActGranularity::PerToken,
        ActGranularity::PerPatch,
    ];

    /// The name `--granularity` and precision maps take.
    pub fn name(self) -> &'static str {
        match self {
            ActGranularity::PerTensor => "per-tensor",
            ActGranularity::PerToken => "per-token",
            ActGranularity::PerPatch => "per-patch",
        }
    }

    /// One scale per row.
    pub fn per_row(self) -> bool {
        self != ActGranularity::PerTensor
    }
}

impl std::fmt::Display for ActGranularity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ActGranularity {
    type Err = mmq_ir::UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ActGranularity::ALL
            .into_iter()
            .find(|g| g.name() == s)
            .ok_or_else(|| mmq_ir::UnknownName {
                what: "activation granularity",
                value: s.to_owned(),
                expected: "per-tensor, per-token or per-patch".to_owned(),
            })
    }
}

/// Quantizes the `MatMul` and `Conv` nodes with constant weights to INT8 (see the module doc).
pub struct Int8Pass {
    /// The scheme.
    pub scheme: Int8Scheme,
    /// When set, only nodes it accepts are quantized.
    pub filter: Option<NodeFilter>,
    /// Weights in 7 bits (`[-63, 63]`, on by default). ONNX Runtime's u8 × i8 kernels on x86
    /// CPUs without VNNI sum pairs of products in saturating 16-bit lanes (`vpmaddubsw`), so
    /// 8-bit weights give results that differ from the model's (on the 64-wide CLIP fixture,
    /// cosine 0.80 instead of 0.9997); 7-bit weights keep every pair sum in range.
    pub reduce_range: bool,
    /// Which units stay integer ([`Placement::Cost`] by default: the target's cost model
    /// decides, see [`crate::quant::place`]).
    pub placement: Placement,
    /// Run-time activation scales of the dynamic scheme: per tensor, or per row.
    pub granularity: ActGranularity,
}

impl Int8Pass {
    /// A pass quantizing every eligible node.
    pub fn new(scheme: Int8Scheme) -> Self {
        Int8Pass {
            scheme,
            filter: None,
            reduce_range: true,
            placement: Placement::default(),
            granularity: ActGranularity::PerTensor,
        }
    }

    /// The same pass with another activation granularity (dynamic scheme).
    pub fn with_granularity(mut self, granularity: ActGranularity) -> Self {
        self.granularity = granularity;
        self
    }

    /// The same pass with another placement.
    pub fn with_placement(mut self, placement: Placement) -> Self {
        self.placement = placement;
        self
    }

    /// Restricts the pass to the nodes `filter` accepts.
    pub fn with_filter(mut self, filter: NodeFilter) -> Self {
        self.filter = Some(filter);
        self
    }

    /// The values static quantization needs ranges for, per top-level graph: the activation
    /// input of each eligible node and, for `Conv`, its result.
    pub fn activations(m: &Module, filter: Option<&NodeFilter>) -> Vec<(GraphId, Vec<Value>)> {
        let mut out = Vec::new();
        for e in &m.entries {
            let mut vals = Vec::new();
            for &n in m.graphs[e.graph].nodes() {
                if filter.is_some_and(|f| !f(m, n)) {
                    continue;
                }
                if let Some(site) = site(m, n) {
                    vals.push(range_source(m, site.act));
                    if site.kind == Kind::Conv
                        && let Some(Some(y)) = m.nodes[n].outputs.first()
                    {
                        vals.push(*y);
                    }
                }
            }
            vals.dedup();
            out.push((e.graph, vals));
        }
        out
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    MatMul,
    /// A `Gemm` that is a matrix product plus bias (alpha 1, beta 1, A not transposed); it is
    /// rewritten to `MatMul` (+ `Add`) before quantization.
    Gemm,
    Conv,
}

/// An eligible node: its activation operand and constant weight.
struct Site {
    kind: Kind,
    act: Value,
    weight: Value,
    /// The weight is already int8 codes dequantized in the graph ([`prequantized_weight`]):
    /// its codes and scales are kept as they are.
    prequantized: bool,
}

/// The value whose range `v` has: `v` seen back through data-movement ops (`Reshape`,
/// `Transpose`, `Squeeze`, `Unsqueeze`, `Flatten`, `Identity`), which neither add nor change
/// elements, so they share one calibrated range and one scale.
pub fn range_source(m: &Module, v: Value) -> Value {
    let mut v = v;
    while let ValueDef::Output { node, index: 0 } = m.values[v].def {
        let n = &m.nodes[node];
        let moves = n.op.is_layout();
        match n.inputs.first() {
            Some(Some(src)) if moves && !matches!(m.values[*src].def, ValueDef::Const(_)) => {
                v = *src
            }
            _ => break,
        }
    }
    v
}

fn site(m: &Module, n: Node) -> Option<Site> {
    let node = &m.nodes[n];
    let kind = match node.op {
        Op::MatMul {} => Kind::MatMul,
        Op::Conv { .. } => Kind::Conv,
        Op::Gemm {
            alpha,
            beta,
            trans_a,
            ..
        } if alpha.is_none_or(|a| a == 1.0)
            && beta.is_none_or(|b| b == 1.0)
            && trans_a.is_none_or(|t| t == 0) =>
        {
            Kind::Gemm
        }
        _ => return None,
    };
    let act = (*node.inputs.first()?)?;
    let weight = (*node.inputs.get(1)?)?;
    let prequantized = kind == Kind::MatMul && prequantized_weight(m, weight);
    if !prequantized {
        let c = m.const_source(weight)?;
        let wc = &m.consts[c];
        if wc.dtype != DType::F32 {
            return None;
        }
        match kind {
            Kind::MatMul | Kind::Gemm if wc.shape.len() != 2 => return None,
            Kind::Conv if wc.shape.len() < 3 => return None,
            _ => {}
        }
    }
    if m.value_type(act).dtype() != Some(DType::F32) {
        return None;
    }
    if let ValueDef::Output { node: p, .. } = m.values[act].def
        && matches!(m.nodes[p].op, Op::DequantizeLinear { .. })
    {
        return None;
    }
    Some(Site {
        kind,
        act,
        weight,
        prequantized,
    })
}

/// Whether `w` is a 2-d int8 weight the model already stores quantized:
/// `DequantizeLinear(W, s[, 0])` of an i8 constant with one f32 scale, or one per output column
/// (axis 1), and no zero point other than 0 — the form INT8 quantization writes itself.
fn prequantized_weight(m: &Module, w: Value) -> bool {
    let Some(nd) = m.producer(w) else {
        return false;
    };
    let Op::DequantizeLinear {
        axis, block_size, ..
    } = nd.op
    else {
        return false;
    };
    if block_size.is_some_and(|b| b != 0) {
        return false;
    }
    let operand = |i: usize| {
        nd.inputs
            .get(i)
            .copied()
            .flatten()
            .and_then(|v| m.const_source(v))
            .map(|c| &m.consts[c])
    };
    let (Some(codes), Some(scale)) = (operand(0), operand(1)) else {
        return false;
    };
    if codes.dtype != DType::I8 || codes.shape.len() != 2 || scale.dtype != DType::F32 {
        return false;
    }
    let per_tensor = scale.num_elements() == 1;
    let per_column = scale.shape.len() == 1
        && scale.shape[0] == codes.shape[1]
        && axis.is_none_or(|a| a == 1 || a == -1);
    if !(per_tensor || per_column) {
        return false;
    }
    match nd.inputs.get(2).copied().flatten() {
        None => true,
        Some(z) => m.const_source(z).is_some_and(|c| {
            let zc = &m.consts[c];
            zc.dtype == DType::I8
                && zc
                    .read_bytes()
                    .and_then(Result::ok)
                    .is_some_and(|b| b.iter().all(|&x| x == 0))
        }),
    }
}

/// Symmetric per-channel i8 quantization of `w` (row-major, `shape`) along `axis` to codes in
/// `[-qmax, qmax]`: codes and one scale per channel (1 where a channel is all zeros).
pub fn quantize_weight_per_channel(
    w: &[f32],
    shape: &[usize],
    axis: usize,
    qmax: i32,
) -> (Vec<i8>, Vec<f32>) {
    use rayon::prelude::*;
    let len = shape[axis].max(1);
    let inner: usize = shape[axis + 1..].iter().product::<usize>().max(1);
    let finite_abs = |x: f32| if x.is_finite() { x.abs() } else { 0.0 };
    let mut amax = vec![0f32; len];
    if inner == 1 {
        // The channel is the last axis (a MatMul weight's columns): whole rows at a time.
        for row in w.chunks(len) {
            for (a, &x) in amax.iter_mut().zip(row) {
                *a = a.max(finite_abs(x));
            }
        }
    } else {
        // Row-major: runs of `inner` elements share a channel, which cycles with period `len`.
        for (run, xs) in w.chunks(inner).enumerate() {
            let a = &mut amax[run % len];
            *a = xs.iter().fold(*a, |m, &x| m.max(finite_abs(x)));
        }
    }
    let scales: Vec<f32> = amax
        .iter()
        .map(|&a| if a > 0.0 { a / qmax as f32 } else { 1.0 })
        .collect();
    let mut codes = vec![0i8; w.len()];
    if inner == 1 {
        codes
            .par_chunks_mut(len)
            .zip(w.par_chunks(len))
            .for_each(|(out, row)| {
                for ((o, &x), &s) in out.iter_mut().zip(row).zip(&scales) {
                    *o = quantize_value(x, s, 0, (-qmax, qmax)) as i8;
                }
            });
    } else {
        codes
            .par_chunks_mut(inner)
            .zip(w.par_chunks(inner))
            .enumerate()
            .for_each(|(run, (out, xs))| {
                let s = scales[run % len];
                for (o, &x) in out.iter_mut().zip(xs) {
                    *o = quantize_value(x, s, 0, (-qmax, qmax)) as i8;
                }
            });
    }
    (codes, scales)
}

/// Per-tensor activation parameters for `r`: `(scale, zero point, dtype)`; u8 asymmetric with the
/// range widened to include 0, or i8 symmetric.
pub fn activation_qparams(r: Range, symmetric: bool) -> (f32, i32, DType) {
    if symmetric {
        let a = r.abs_max();
        let s = if a > 0.0 { a / 127.0 } else { 1.0 };
        (s, 0, DType::I8)
    } else {
        let lo = r.min.min(0.0);
        let hi = r.max.max(0.0);
        let s = if hi > lo { (hi - lo) / 255.0 } else { 1.0 };
        let zp = quantize_value(-lo, s, 0, (0, 255));
        (s, zp, DType::U8)
    }
}

fn const_value(
    m: &mut Module,
    name: String,
    dtype: DType,
    shape: Vec<i64>,
    bytes: Vec<u8>,
) -> Value {
    m.add_const(ConstData::new(
        Some(name),
        dtype,
        shape,
        Storage::Inline(Bytes::from(bytes)),
    ))
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn q() -> Op {
    Op::QuantizeLinear {
        axis: None,
        block_size: None,
        output_dtype: None,
        precision: None,
        saturate: None,
    }
}

fn dq(axis: Option<i64>) -> Op {
    Op::DequantizeLinear {
        axis,
        block_size: None,
        output_dtype: None,
    }
}

fn retyped(m: &Module, v: Value, dtype: DType) -> Type {
    match m.value_type(v).shape() {
        Some(s) => Type::tensor(dtype, s.to_vec()),
        None => Type::Unknown,
    }
}

fn fail(message: String) -> PassError {
    PassError::Failed {
        pass: "int8".into(),
        message,
    }
}

/// Builds per graph: the nodes to insert before each original node, and a counter of names.
struct Builder {
    graph: GraphId,
    before: HashMap<Node, Vec<Node>>,
    after: HashMap<Node, Vec<Node>>,
    /// Activation → (quantized value, scale, zero point) of its shared `QuantizeLinear`.
    shared: HashMap<Value, (Value, Value, Value)>,
    next: usize,
    /// Largest weight code.
    qmax: i32,
    /// Weights per tensor: `DequantizeLinear` takes a per-channel scale (`axis`) from opset 13 on.
    per_tensor: bool,
    /// A `Conv` bias becomes an int32 `DequantizeLinear` (the target's rule); else it stays float.
    int32_conv_bias: bool,
}

impl Builder {
    /// Appends `n` with the nodes placed before and after it (recursively) to `order`.
    fn emit(&mut self, n: Node, order: &mut Vec<Node>) {
        for x in self.before.remove(&n).unwrap_or_default() {
            self.emit(x, order);
        }
        order.push(n);
        for x in self.after.remove(&n).unwrap_or_default() {
            self.emit(x, order);
        }
    }

    fn name(&mut self, m: &Module, v: Value, what: &str) -> String {
        self.next += 1;
        let base = m.values[v].name.clone().unwrap_or_else(|| "v".into());
        format!("{base}_{what}_{}", self.next)
    }

    fn node(
        &mut self,
        m: &mut Module,
        at: Node,
        after: bool,
        op: Op,
        inputs: Vec<Value>,
        outs: Vec<(String, Type)>,
    ) -> Vec<Value> {
        // Listed when the pass rebuilds the graph's list from `before` and `after`.
        let n = m.cursor(self.graph, At::Unlisted).insert(NewNode {
            op,
            inputs: inputs.into_iter().map(Some).collect(),
            outputs: outs
                .into_iter()
                .map(|(name, ty)| Some((Some(name), ty)))
                .collect(),
            name: None,
        });
        if after {
            self.after.entry(at).or_default().push(n);
        } else {
            self.before.entry(at).or_default().push(n);
        }
        m.nodes[n].outputs.iter().flatten().copied().collect()
    }

    /// `DQ(Q(act))` with the activation's shared `QuantizeLinear`, placed before `at`.
    fn fake_quant_act(
        &mut self,
        m: &mut Module,
        at: Node,
        act: Value,
        r: Range,
        symmetric: bool,
    ) -> (Value, f32) {
        let (scale, zp, dtype) = activation_qparams(r, symmetric);
        let (qv, sv, zv) = match self.shared.get(&act) {
            Some(&t) => t,
            None => {
                let sname = self.name(m, act, "scale");
                let sv = const_value(m, sname, DType::F32, vec![], f32_bytes(&[scale]));
                let zname = self.name(m, act, "zero_point");
                let zv = const_value(m, zname, dtype, vec![], vec![zp as i8 as u8]);
                let qname = self.name(m, act, "quantized");
                let ty = retyped(m, act, dtype);
                let qv = self.node(m, at, false, q(), vec![act, sv, zv], vec![(qname, ty)])[0];
                self.shared.insert(act, (qv, sv, zv));
                (qv, sv, zv)
            }
        };
        let dname = self.name(m, act, "dequantized");
        let ty = retyped(m, act, DType::F32);
        let d = self.node(m, at, false, dq(None), vec![qv, sv, zv], vec![(dname, ty)])[0];
        (d, scale)
    }
}

impl Pass for Int8Pass {
    fn name(&self) -> &str {
        match self.scheme {
            Int8Scheme::Static { .. } => "int8",
            Int8Scheme::Dynamic => "int8-dynamic",
        }
    }

    fn run(&self, m: &mut Module, opts: &PassOptions) -> Result<PassReport, PassError> {
        let mut report = PassReport::default();
        let rules = opts.target.qdq_rules();
        if let Int8Scheme::Static {
            symmetric: false, ..
        } = self.scheme
            && rules.symmetric_activations
        {
            return Err(fail(format!(
                "target {} takes symmetric activations only (zero point 0)",
                opts.target
            )));
        }
        // A target without run-time quantization ops may still take per-row scales through
        // its plugin.
        let plugin_rows = !rules.dynamic_activations && rules.plugins && self.granularity.per_row();
        if matches!(self.scheme, Int8Scheme::Dynamic) && !rules.dynamic_activations && !plugin_rows
        {
            return Err(fail(format!(
                "target {} has no run-time activation quantization (DynamicQuantizeLinear); \
                 use --quant int8 with calibration",
                opts.target
            )));
        }
        let graphs = graphs_with_bodies(m);
        // Weights read from `Constant` nodes; those nodes go once nothing reads them.
        let mut sources: Vec<Value> = Vec::new();
        // Name counter across graphs: a body sees the names of its enclosing graphs.
        let mut next = 0;
        for (graph, body) in graphs {
            // Calibration observes top-level values only: bodies are quantized dynamically
            // (where the target can; else they stay float).
            if body && !rules.dynamic_activations {
                continue;
            }
            let scheme = if body {
                &Int8Scheme::Dynamic
            } else {
                &self.scheme
            };
            // Q/DQ exist from opset 10 (per tensor), DynamicQuantizeLinear from 11, per-channel
            // DQ from 13: below 13 static weights are quantized per tensor.
            let opset = m.onnx_opset(graph).unwrap_or(0);
            let least = match scheme {
                Int8Scheme::Static { .. } => 10,
                Int8Scheme::Dynamic => 11,
            };
            if opset < least {
                if !body {
                    report.notes.push(format!(
                        "graph '{}': opset {opset} below {least}, not quantized",
                        m.graphs[graph].name
                    ));
                }
                continue;
            }
            let per_tensor = opset < 13 && matches!(scheme, Int8Scheme::Static { .. });
            if per_tensor && !body {
                report.notes.push(format!(
                    "graph '{}': opset {opset}: weights quantized per tensor (per-channel DequantizeLinear needs opset 13)",
                    m.graphs[graph].name
                ));
            }
            let mut b = Builder {
                graph,
                before: HashMap::new(),
                after: HashMap::new(),
                shared: HashMap::new(),
                next,
                qmax: if self.reduce_range && rules.reduce_range {
                    63
                } else {
                    127
                },
                int32_conv_bias: rules.int32_conv_bias,
                per_tensor,
            };
            let nodes = m.graphs[graph].nodes().to_vec();
            // Each unit with its float form, for placement.
            let mut units: Vec<Unit> = Vec::new();
            // Element counts seen in calibration, for the placement cost.
            let mut sizes: HashMap<Value, usize> = HashMap::new();
            for &n in &nodes {
                if self.filter.as_ref().is_some_and(|f| !f(m, n)) {
                    continue;
                }
                let Some(mut s) = site(m, n) else { continue };
                sources.push(s.weight);
                let mut n = n;
                if s.kind == Kind::Gemm {
                    n = gemm_to_matmul(m, &mut b, n, &s)?;
                    let Some(again) = site(m, n) else { continue };
                    s = again;
                    report.count("gemm-as-matmul", 1);
                }
                match (scheme, s.kind) {
                    (Int8Scheme::Static { ranges, symmetric }, Kind::MatMul) => {
                        let Some(r) = ranges.get(range_source(m, s.act)) else {
                            report.count("skipped-no-range", 1);
                            continue;
                        };
                        units.extend(unit(m, n));
                        sizes.extend(ranges.elements(range_source(m, s.act)).map(|e| (s.act, e)));
                        let (a, _) = b.fake_quant_act(m, n, s.act, r, *symmetric);
                        m.set_operand(n, 0, Some(a));
                        if s.prequantized {
                            // The model's own codes and scales, as they are.
                            report.count("prequantized-weights-kept", 1);
                        } else {
                            let w = dq_weight(m, &mut b, n, s.weight, 1)?;
                            m.set_operand(n, 1, Some(w.0));
                        }
                        report.count("quantized-matmul", 1);
                    }
                    (Int8Scheme::Static { ranges, symmetric }, Kind::Conv) => {
                        let y = m.nodes[n].outputs.first().copied().flatten();
                        let (Some(r), Some(y), Some(ry)) = (
                            ranges.get(range_source(m, s.act)),
                            y,
                            y.and_then(|y| ranges.get(y)),
                        ) else {
                            report.count("skipped-no-range", 1);
                            continue;
                        };
                        let float = unit(m, n);
                        sizes.extend(ranges.elements(range_source(m, s.act)).map(|e| (s.act, e)));
                        sizes.extend(ranges.elements(y).map(|e| (y, e)));
                        conv_static(m, &mut b, n, &s, y, r, ry, *symmetric)?;
                        // The unit's result is the DQ placed after the Conv.
                        let out = b
                            .after
                            .get(&n)
                            .and_then(|a| a.last())
                            .and_then(|&d| m.nodes[d].outputs.first().copied().flatten());
                        units.extend(float.zip(out).map(|(u, out)| Unit { out, ..u }));
                        report.count("quantized-conv", 1);
                    }
                    (Int8Scheme::Dynamic, Kind::MatMul) if s.prequantized => {
                        // Dynamic quantization builds its own weight codes: the model's stay,
                        // with the product in float.
                        report.count("prequantized-weights-kept", 1);
                    }
                    (Int8Scheme::Dynamic, Kind::MatMul) => {
                        units.extend(unit(m, n));
                        matmul_dynamic(m, &mut b, n, &s, self.granularity, plugin_rows)?;
                        report.count("quantized-matmul", 1);
                        if body {
                            report.count("quantized-subgraph", 1);
                        }
                    }
                    (Int8Scheme::Dynamic, Kind::Conv) => report.count("skipped-conv-dynamic", 1),
                    (_, Kind::Gemm) => {}
                }
            }
            let mut order = Vec::with_capacity(nodes.len());
            for n in nodes {
                b.emit(n, &mut order);
            }
            m.set_node_order(graph, order);
            next = b.next;
            if self.placement == Placement::Cost
                && !rules.quantize_all
                && !body
                && !units.is_empty()
            {
                let d = place::place(m, graph, &units, opts.target, &sizes);
                report.count("placed-integer", d.integer);
                report.count("placed-float", d.float);
                let (name, total, target) =
                    (&m.graphs[graph].name, d.integer + d.float, opts.target);
                report.notes.push(if d.integer == 0 {
                    format!(
                        "graph '{name}': {total} of {total} quantized units kept float: estimated \
                         faster in float at these sizes on {target}; --placement all quantizes them"
                    )
                } else if d.float == 0 {
                    format!(
                        "graph '{name}': all {total} quantized units integer (the {target} cost \
                         model estimates {:.1} us)",
                        d.cost
                    )
                } else {
                    format!(
                        "graph '{name}': {} of {total} quantized units integer, {} kept float where \
                         estimated faster in float on {target} (estimated {:.1} us; --placement all \
                         quantizes every one)",
                        d.integer, d.float, d.cost
                    )
                });
            }
        }
        remove_unread_constant_nodes(m, &sources);
        if let Some(&n) = report.counters.get("skipped-conv-dynamic") {
            report.notes.push(format!(
                "{n} Conv nodes left in float: dynamic INT8 covers MatMul and Gemm only; --quant int8 quantizes Conv statically (QLinearConv)"
            ));
        }
        if let (Int8Scheme::Static { .. }, Some(&n)) =
            (&self.scheme, report.counters.get("quantized-subgraph"))
        {
            report.notes.push(format!(
                "{n} MatMul/Gemm nodes in If/Loop/Scan bodies quantized dynamically (calibration observes top-level values only)"
            ));
        }
        Ok(report)
    }
}

/// Every graph to quantize: each top-level graph (`false`) followed by the `If`/`Loop`/`Scan`
/// bodies nested in it (`true`).
fn graphs_with_bodies(m: &Module) -> Vec<(GraphId, bool)> {
    m.entries
        .iter()
        .flat_map(|e| {
            m.graph_tree(e.graph)
                .into_iter()
                .map(move |g| (g, g != e.graph))
        })
        .collect()
}

/// Removes the `Constant` nodes producing `values` that no node or graph output reads any more
/// (their weights were replaced by quantized ones).
fn remove_unread_constant_nodes(m: &mut Module, values: &[Value]) {
    let dead: Vec<Node> = values
        .iter()
        .filter_map(|&v| match m.values[v].def {
            ValueDef::Output { node, .. } if matches!(m.nodes[node].op, Op::Constant { .. }) => {
                Some(node)
            }
            _ => None,
        })
        .collect();
    if dead.is_empty() {
        return;
    }
    let mut read = std::collections::HashSet::new();
    for e in &m.entries {
        for g in m.graph_tree(e.graph) {
            read.extend(m.graphs[g].outputs.iter().copied());
            for &n in m.graphs[g].nodes() {
                read.extend(m.nodes[n].inputs.iter().flatten().copied());
            }
        }
    }
    for node in dead {
        if m.nodes[node]
            .outputs
            .iter()
            .flatten()
            .all(|v| !read.contains(v))
        {
            m.remove_node(node);
        }
    }
}

/// Rewrites a `Gemm` site as `MatMul(a, B)` (B transposed ahead when `transB`), followed by
/// `Add(·, C)` when it has a bias; returns the `MatMul` node.
fn gemm_to_matmul(m: &mut Module, b: &mut Builder, n: Node, s: &Site) -> Result<Node, PassError> {
    let Some(c) = m.const_source(s.weight) else {
        return Err(fail("weight is not a constant".into()));
    };
    let trans_b = matches!(m.nodes[n].op, Op::Gemm { trans_b: Some(t), .. } if t != 0);
    let weight = if trans_b {
        let data = &m.consts[c];
        let (rows, cols) = (data.shape[0] as usize, data.shape[1] as usize);
        let t = Tensor::from_const(data).map_err(|e| fail(format!("weight: {e}")))?;
        let xs = t.into_f32().map_err(|e| fail(format!("weight: {e}")))?;
        let mut tr = vec![0f32; xs.len()];
        for r in 0..rows {
            for k in 0..cols {
                tr[k * rows + r] = xs[r * cols + k];
            }
        }
        let name = b.name(m, s.weight, "transposed");
        const_value(
            m,
            name,
            DType::F32,
            vec![cols as i64, rows as i64],
            f32_bytes(&tr),
        )
    } else {
        s.weight
    };
    let bias = m.nodes[n].inputs.get(2).copied().flatten();
    let Some(bias) = bias else {
        let node = &mut m.nodes[n];
        node.op = Op::MatMul {};
        node.inputs = vec![Some(s.act), Some(weight)];
        return Ok(n);
    };
    let Some(y) = m.nodes[n].outputs.first().copied().flatten() else {
        return Err(fail("Gemm without a result".into()));
    };
    let name = b.name(m, y, "matmul");
    let ty = retyped(m, y, DType::F32);
    let out = b.node(
        m,
        n,
        false,
        Op::MatMul {},
        vec![s.act, weight],
        vec![(name, ty)],
    )[0];
    let ValueDef::Output { node: mm, .. } = m.values[out].def else {
        return Err(fail("MatMul result has no node".into()));
    };
    let node = &mut m.nodes[n];
    node.op = Op::Add {};
    node.inputs = vec![Some(out), Some(bias)];
    Ok(mm)
}

/// Quantizes constant weight `w` per channel along `axis` and returns `(DQ output, scales)`.
fn dq_weight(
    m: &mut Module,
    b: &mut Builder,
    at: Node,
    w: Value,
    axis: usize,
) -> Result<(Value, Vec<f32>), PassError> {
    let Some(c) = m.const_source(w) else {
        return Err(fail("weight is not a constant".into()));
    };
    let data = &m.consts[c];
    let shape: Vec<usize> = data.shape.iter().map(|&d| d as usize).collect();
    let ishape = data.shape.clone();
    let xs = finite_weight(data)?;
    let (codes, scales) = if b.per_tensor {
        quantize_weight_per_channel(&xs, &[1, xs.len()], 0, b.qmax)
    } else {
        quantize_weight_per_channel(&xs, &shape, axis, b.qmax)
    };
    let wname = b.name(m, w, "quantized");
    let wq = const_value(
        m,
        wname,
        DType::I8,
        ishape,
        codes.iter().map(|&x| x as u8).collect(),
    );
    // One scale (a scalar, no axis) per tensor, else one per channel.
    let (sshape, daxis) = if b.per_tensor {
        (vec![], None)
    } else {
        (vec![scales.len() as i64], Some(axis as i64))
    };
    let sname = b.name(m, w, "scale");
    let sv = const_value(m, sname, DType::F32, sshape.clone(), f32_bytes(&scales));
    let zname = b.name(m, w, "zero_point");
    let zv = const_value(m, zname, DType::I8, sshape, vec![0; scales.len()]);
    let dname = b.name(m, w, "dequantized");
    let ty = retyped(m, w, DType::F32);
    let out = b.node(m, at, false, dq(daxis), vec![wq, sv, zv], vec![(dname, ty)]);
    // Per channel for the caller (the Conv bias scales), the one scale repeated per tensor.
    let channels = shape.get(axis).copied().unwrap_or(1);
    let scales = if b.per_tensor {
        vec![scales[0]; channels]
    } else {
        scales
    };
    Ok((out[0], scales))
}

#[allow(
    clippy::too_many_arguments,
    reason = "one call site; the pieces of one Conv unit"
)]
fn conv_static(
    m: &mut Module,
    b: &mut Builder,
    n: Node,
    s: &Site,
    y: Value,
    rx: Range,
    ry: Range,
    symmetric: bool,
) -> Result<(), PassError> {
    let (a, x_scale) = b.fake_quant_act(m, n, s.act, rx, symmetric);
    let (w, w_scales) = dq_weight(m, b, n, s.weight, 0)?;
    m.set_operand(n, 0, Some(a));
    m.set_operand(n, 1, Some(w));
    if let Some(Some(bias)) = m.nodes[n].inputs.get(2).copied()
        && b.int32_conv_bias
        && let Some(c) = m.const_source(bias)
        && m.consts[c].num_elements() == w_scales.len()
    {
        let t = Tensor::from_const(&m.consts[c]).map_err(|e| fail(format!("bias: {e}")))?;
        let xs = t.into_f32().map_err(|e| fail(format!("bias: {e}")))?;
        let scales: Vec<f32> = w_scales.iter().map(|&ws| ws * x_scale).collect();
        let codes: Vec<i32> = xs
            .iter()
            .zip(&scales)
            .map(|(&x, &sc)| quantize_value(x, sc, 0, (i32::MIN + 1, i32::MAX)))
            .collect();
        let len = codes.len() as i64;
        let bname = b.name(m, bias, "quantized");
        let bq = const_value(
            m,
            bname,
            DType::I32,
            vec![len],
            codes.iter().flat_map(|x| x.to_le_bytes()).collect(),
        );
        // Per tensor, every channel's scale is the same: one scalar.
        let (sshape, scales, daxis) = if b.per_tensor {
            (vec![], scales[..1].to_vec(), None)
        } else {
            (vec![len], scales, Some(0))
        };
        let sname = b.name(m, bias, "scale");
        let sv = const_value(m, sname, DType::F32, sshape.clone(), f32_bytes(&scales));
        let zname = b.name(m, bias, "zero_point");
        let zv = const_value(m, zname, DType::I32, sshape, vec![0; scales.len() * 4]);
        let dname = b.name(m, bias, "dequantized");
        let ty = retyped(m, bias, DType::F32);
        let d = b.node(m, n, false, dq(daxis), vec![bq, sv, zv], vec![(dname, ty)])[0];
        m.set_operand(n, 2, Some(d));
    }
    // Q → DQ on the result: the new float value takes over the consumers of `y`.
    let (scale, zp, dtype) = activation_qparams(ry, symmetric);
    let sname = b.name(m, y, "scale");
    let sv = const_value(m, sname, DType::F32, vec![], f32_bytes(&[scale]));
    let zname = b.name(m, y, "zero_point");
    let zv = const_value(m, zname, dtype, vec![], vec![zp as i8 as u8]);
    let qname = b.name(m, y, "quantized");
    let ty = retyped(m, y, dtype);
    let qv = b.node(m, n, true, q(), vec![y, sv, zv], vec![(qname, ty)])[0];
    let dname = b.name(m, y, "dequantized");
    let ty = retyped(m, y, DType::F32);
    let d = b.node(m, n, true, dq(None), vec![qv, sv, zv], vec![(dname, ty)])[0];
    let quantize: Vec<Node> = match m.values[qv].def {
        ValueDef::Output { node, .. } => vec![node],
        _ => Vec::new(),
    };
    m.replace_uses(y, d, b.graph, &quantize);
    // The dequantized value takes the source name, so graph outputs and later references keep it.
    let yname = m.values[y].name.take();
    m.values[y].name = m.values[d].name.take();
    m.values[d].name = yname;
    Ok(())
}

/// A weight's values, refused when one is NaN or infinite (it would become a finite code
/// without a word), as every quantizing pass refuses them.
fn finite_weight(data: &mmq_ir::ConstData) -> Result<Vec<f32>, PassError> {
    let t = Tensor::from_const(data).map_err(|e| fail(format!("weight: {e}")))?;
    let xs = t.into_f32().map_err(|e| fail(format!("weight: {e}")))?;
    if let Some(i) = xs.iter().position(|v| !v.is_finite()) {
        return Err(fail(format!(
            "weight '{}': non-finite value {} at element {i}: it would become a finite code \
             without a word; fix the weight or keep this node in float (--skip-non-finite)",
            data.name.as_deref().unwrap_or("<unnamed>"),
            xs[i]
        )));
    }
    Ok(xs)
}

fn matmul_dynamic(
    m: &mut Module,
    b: &mut Builder,
    n: Node,
    s: &Site,
    granularity: ActGranularity,
    plugin_rows: bool,
) -> Result<(), PassError> {
    let Some(c) = m.const_source(s.weight) else {
        return Err(fail("weight is not a constant".into()));
    };
    let data = &m.consts[c];
    let shape: Vec<usize> = data.shape.iter().map(|&d| d as usize).collect();
    let ishape = data.shape.clone();
    let xs = finite_weight(data)?;
    let (codes, scales) = quantize_weight_per_channel(&xs, &shape, 1, b.qmax);
    let act = s.act;
    let wname = b.name(m, s.weight, "quantized");
    let wq = const_value(
        m,
        wname,
        DType::I8,
        ishape,
        codes.iter().map(|&x| x as u8).collect(),
    );
    let sname = b.name(m, s.weight, "scale");
    let wsv = const_value(
        m,
        sname,
        DType::F32,
        vec![scales.len() as i64],
        f32_bytes(&scales),
    );
    if granularity.per_row() && plugin_rows {
        return matmul_dynamic_plugin(m, b, n, act, wq, wsv);
    }
    if granularity.per_row() {
        return matmul_dynamic_per_row(m, b, n, act, wq, wsv);
    }
    let (qn, sn, zn) = (
        b.name(m, act, "quantized"),
        b.name(m, act, "scale"),
        b.name(m, act, "zero_point"),
    );
    let scalar = |d| Type::tensor(d, vec![]);
    let qa = retyped(m, act, DType::U8);
    let dql = b.node(
        m,
        n,
        false,
        Op::DynamicQuantizeLinear {},
        vec![act],
        vec![(qn, qa), (sn, scalar(DType::F32)), (zn, scalar(DType::U8))],
    );
    let Some(y) = m.nodes[n].outputs.first().copied().flatten() else {
        return Err(fail("MatMul without a result".into()));
    };
    let (iname, cname, pname) = (
        b.name(m, y, "int32"),
        b.name(m, y, "float"),
        b.name(m, y, "scale"),
    );
    let i32_ty = retyped(m, y, DType::I32);
    let f_ty = retyped(m, y, DType::F32);
    let mmi = b.node(
        m,
        n,
        false,
        Op::MatMulInteger {},
        vec![dql[0], wq, dql[2]],
        vec![(iname, i32_ty)],
    )[0];
    let cast = b.node(
        m,
        n,
        false,
        Op::Cast {
            round_mode: None,
            saturate: None,
            to: Some(i64::from(DType::F32.onnx_code())),
        },
        vec![mmi],
        vec![(cname, f_ty)],
    )[0];
    let prod = b.node(
        m,
        n,
        false,
        Op::Mul {},
        vec![dql[1], wsv],
        vec![(
            pname,
            Type::tensor(DType::F32, vec![mmq_ir::Dim::known(scales.len() as i64)]),
        )],
    )[0];
    // The original MatMul becomes the final Mul, keeping its result value and name.
    let node = &mut m.nodes[n];
    node.op = Op::Mul {};
    node.inputs = vec![Some(cast), Some(prod)];
    Ok(())
}

/// Per-row dynamic INT8 (per token, per patch): one symmetric scale per row of the activation
/// (`ReduceMax(|a|)` over the last axis / 127), i8 codes, `MatMulInteger` (i8 × i8), then the
/// int32 result times the weight's column scales, then times the row scales.
fn matmul_dynamic_per_row(
    m: &mut Module,
    b: &mut Builder,
    n: Node,
    act: Value,
    wq: Value,
    wsv: Value,
) -> Result<(), PassError> {
    let opset = m.onnx_opset(b.graph).unwrap_or(0);
    let unknown = |b: &mut Builder, m: &Module, what: &str| (b.name(m, act, what), Type::Unknown);
    let op = |b: &mut Builder, m: &mut Module, op: Op, inputs: Vec<Value>, what: &str| {
        let out = unknown(b, m, what);
        b.node(m, n, false, op, inputs, vec![out])[0]
    };
    let f32c = |b: &mut Builder, m: &mut Module, v: f32, what: &str| {
        let name = b.name(m, act, what);
        const_value(m, name, DType::F32, vec![], f32_bytes(&[v]))
    };
    let abs = op(b, m, Op::Abs {}, vec![act], "abs");
    let amax = if opset >= 18 {
        let name = b.name(m, act, "axes");
        let axes = const_value(m, name, DType::I64, vec![1], (-1i64).to_le_bytes().to_vec());
        let reduce = Op::ReduceMax {
            axes: None,
            keepdims: Some(1),
            noop_with_empty_axes: None,
        };
        op(b, m, reduce, vec![abs, axes], "row_max")
    } else {
        let reduce = Op::ReduceMax {
            axes: Some(vec![-1]),
            keepdims: Some(1),
            noop_with_empty_axes: None,
        };
        op(b, m, reduce, vec![abs], "row_max")
    };
    let qmax = f32c(b, m, 127.0, "qmax");
    let raw = op(b, m, Op::Div {}, vec![amax, qmax], "row_scale_raw");
    let zero = f32c(b, m, 0.0, "zero");
    let one = f32c(b, m, 1.0, "one");
    let pos = op(b, m, Op::Greater {}, vec![raw, zero], "row_scale_pos");
    let scale = op(b, m, Op::Where {}, vec![pos, raw, one], "row_scale");
    let scaled = op(b, m, Op::Div {}, vec![act, scale], "scaled");
    let rounded = op(b, m, Op::Round {}, vec![scaled], "rounded");
    let (lo, hi) = (f32c(b, m, -127.0, "lo"), f32c(b, m, 127.0, "hi"));
    let clip = Op::Clip {
        min: None,
        max: None,
    };
    let clipped = op(b, m, clip, vec![rounded, lo, hi], "clipped");
    let cast_to = |d: DType| Op::Cast {
        round_mode: None,
        saturate: None,
        to: Some(i64::from(d.onnx_code())),
    };
    let qa = op(b, m, cast_to(DType::I8), vec![clipped], "quantized");
    let mmi = op(b, m, Op::MatMulInteger {}, vec![qa, wq], "int32");
    let float = op(b, m, cast_to(DType::F32), vec![mmi], "float");
    // Column scales first, then row scales, in two `Mul`s: ONNX Runtime fuses
    // `Mul(Cast(MatMulInteger), Mul(a_scale, b_scale))` into `MatMulIntegerToFloat`, which
    // reads `a_scale` as one scale for the whole tensor.
    let columns = op(b, m, Op::Mul {}, vec![float, wsv], "column_scaled");
    // The original MatMul becomes the final Mul, keeping its result value and name.
    let node = &mut m.nodes[n];
    node.op = Op::Mul {};
    node.inputs = vec![Some(columns), Some(scale)];
    Ok(())
}

/// Per-row dynamic INT8 where the target runs it through its plugins (TensorRT): the
/// `MmqDynamicQuantize` plugin gives the i8 codes and one symmetric scale per row (absmax / 127),
/// the `MmqDequantize` plugin takes them back (blocks of the whole row), and the `MatMul` reads
/// the weight through a per-column `DequantizeLinear` that the target runs natively.
fn matmul_dynamic_plugin(
    m: &mut Module,
    b: &mut Builder,
    n: Node,
    act: Value,
    wq: Value,
    wsv: Value,
) -> Result<(), PassError> {
    // The row length is the weight's K (`[K, N]`).
    let Some(k) = m
        .value_type(wq)
        .shape()
        .and_then(|s| s.first())
        .and_then(|d| d.as_known())
        .filter(|&k| k > 0)
    else {
        return Err(fail("a quantized weight without a static K".into()));
    };
    let (qn, sn, dn, wn) = (
        b.name(m, act, "quantized"),
        b.name(m, act, "row_scale"),
        b.name(m, act, "dequantized"),
        b.name(m, wq, "dequantized"),
    );
    let scale_ty = match m.value_type(act).shape() {
        Some(s) => {
            let mut s = s.to_vec();
            if let Some(l) = s.last_mut() {
                *l = mmq_ir::Dim::known(1);
            }
            Type::tensor(DType::F32, s)
        }
        None => Type::Unknown,
    };
    let q_ty = retyped(m, act, DType::I8);
    let f_ty = retyped(m, act, DType::F32);
    let plugin =
        |name: &str, fields: &[(&str, i64)]| crate::targets::trt::lower::plugin_op(name, fields);
    let dyn_q = b.node(
        m,
        n,
        false,
        plugin("MmqDynamicQuantize", &[]),
        vec![act],
        vec![(qn, q_ty), (sn, scale_ty)],
    );
    let deq = b.node(
        m,
        n,
        false,
        plugin("MmqDequantize", &[("axis", -1), ("block_size", k)]),
        vec![dyn_q[0], dyn_q[1]],
        vec![(dn, f_ty)],
    )[0];
    let w_ty = retyped(m, wq, DType::F32);
    let w = b.node(
        m,
        n,
        false,
        Op::DequantizeLinear {
            axis: Some(1),
            block_size: None,
            output_dtype: None,
        },
        vec![wq, wsv],
        vec![(wn, w_ty)],
    )[0];
    // The plugin nodes are named after the MatMul (TensorRT names the layers after them).
    let base = m.nodes[n]
        .name
        .clone()
        .or_else(|| m.values[act].name.clone())
        .unwrap_or_else(|| "matmul".to_owned());
    for (v, what) in [(dyn_q[0], "MmqDynamicQuantize"), (deq, "MmqDequantize")] {
        if let ValueDef::Output { node, .. } = m.values[v].def {
            m.nodes[node].name = Some(format!("{base}/{what}"));
        }
    }
    let node = &mut m.nodes[n];
    node.inputs = vec![Some(deq), Some(w)];
    Ok(())
}

/// The float form of node `n` as it is now (op and operands) with its first result, before its
/// quantized unit replaces it.
fn unit(m: &Module, n: Node) -> Option<Unit> {
    let node = &m.nodes[n];
    Some(Unit {
        out: node.outputs.first().copied().flatten()?,
        op: node.op.clone(),
        inputs: node.inputs.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_round_half_even_per_channel() {
        // Column 0 max 1.27 → scale 0.01; 0.005 / 0.01 = 0.5 rounds to 0, 0.015 → 2.
        // Column 1 all zero → scale 1.
        let w = [1.27, 0.0, 0.005, 0.0, 0.015, 0.0, -1.27, 0.0];
        let (codes, scales) = quantize_weight_per_channel(&w, &[4, 2], 1, 127);
        assert_eq!(scales, vec![1.27 / 127.0, 1.0]);
        assert_eq!(codes, vec![127, 0, 0, 0, 2, 0, -127, 0]);
    }

    #[test]
    fn activation_params_include_zero() {
        let (s, zp, d) = activation_qparams(
            Range {
                min: 1.0,
                max: 2.55,
            },
            false,
        );
        assert_eq!((d, zp), (DType::U8, 0));
        assert!((s - 0.01).abs() < 1e-7);
        let (s, zp, d) = activation_qparams(
            Range {
                min: -1.0,
                max: 0.5,
            },
            true,
        );
        assert_eq!((d, zp), (DType::I8, 0));
        assert!((s - 1.0 / 127.0).abs() < 1e-9);
        let (s, zp, _) = activation_qparams(
            Range {
                min: -64.0,
                max: 191.0,
            },
            false,
        );
        assert_eq!((s, zp), (1.0, 64));
    }
}
