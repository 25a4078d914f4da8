//! Automatic per-layer precision (`mmq compile --auto TARGET`): the most compressed scheme per
//! quantizable node that keeps the end-to-end cosine of the main output at or above a target.
//!
//! - **Candidates** ([`candidates`]): the nodes of the entry graph that the scheme passes can
//!   quantize, each with its ladder of schemes from most to least compressed: a `MatMul` or
//!   `Gemm` with a constant weight climbs `int4 → int8 → float`, a `Conv` with a constant weight
//!   `int8 → float` (a scheme the passes cannot apply to the node is left out of its ladder). A
//!   precision map addresses a node by its name, so only nodes whose name is unique in the graph
//!   tree are candidates; the others stay float and are counted in [`Candidates::unnamed`].
//! - **Measure** ([`Reference`]): the main output (the first floating-point output of the graph
//!   with at least two elements on the first sample, else the first floating-point one, as the
//!   accuracy report's end-to-end figure picks it) is computed once in FP32; a quantized module's
//!   cosine is the mean over samples of the per-sample cosine of its main output against that
//!   (1 when identical, non-finite elements left out).
//! - **Search** ([`search`]), with a caller-supplied evaluation (quantize a copy of the module
//!   with the assignment, measure it):
//!   1. sensitivity: given by the caller, or else each candidate alone at its most compressed
//!      scheme, every other node float, measured end to end (`1 − cosine`). The compiler gives
//!      [`local_sensitivity`] (each node quantized alone on the FP32 activations it reads)
//!      scaled by [`depth_scaled`], which needs a handful of model runs instead of one per
//!      candidate;
//!   2. every candidate starts at its most compressed scheme. One *step* moves the most
//!      sensitive candidate still below float one rung up its ladder, so the steps form a fixed
//!      sequence (the most sensitive candidate climbs to float, then the next one...). The search
//!      takes the shortest prefix of that sequence whose cosine reaches the target: after trying
//!      no step and every step (all float), a binary search over the number of steps. This needs
//!      `2 + log2(steps)` evaluations instead of one per step and relies on the cosine growing
//!      with the steps, which holds in practice; whatever it returns was measured at or above
//!      the target.
//! - **Map** ([`Choice::map`]): one rule per candidate by exact name (glob metacharacters
//!   escaped), the most sensitive first, and `[default] scheme = "float"`; compiling with it as
//!   a precision map gives the chosen model.

use std::collections::HashMap;

use mmq_ir::{GraphId, Module, Node, Op, Value, ValueDef};
use mmq_kernels::{Interpreter, KernelError, RtValue, Tensor};
use rayon::prelude::*;

use crate::quant::calibrate::Sample;
use crate::quant::int8::{Int8Pass, NodeFilter};
use crate::quant::precision::{PrecisionMap, Rule, Scheme, Settings, escape_glob};
use crate::quant::weight_only::{WeightOnlyConfig, WeightOnlyPass};

/// Why the automatic choice failed.
#[derive(Debug, thiserror::Error)]
pub enum AutoError {
    /// The target is not a cosine in `[0, 1]`.
    #[error("target cosine {0} is not in [0, 1]")]
    Target(f64),
    /// No samples were given.
    #[error("choosing precisions needs at least one sample")]
    NoSamples,
    /// The graph has no floating-point output to measure.
    #[error("the model has no floating-point output to compare")]
    NoOutput,
    /// The quantized module's main output cannot be compared with the original's.
    #[error("output '{output}' of the quantized model: {reason}")]
    Output {
        /// The main output's name.
        output: String,
        /// What differs (dtype, element count).
        reason: String,
    },
    /// Running a module on a sample failed.
    #[error("running the {which} model on sample {sample}: {source}")]
    Run {
        /// `original` or `quantized`.
        which: &'static str,
        /// The sample's index.
        sample: usize,
        /// The interpreter's error.
        source: KernelError,
    },
    /// Even every node in float misses the target.
    #[error("no choice reaches cosine {target}: with every node float it is {best}")]
    Unreachable {
        /// The target.
        target: f64,
        /// The cosine with every candidate float.
        best: f64,
    },
    /// A rule of the chosen map could not be built.
    #[error("node '{node}': {message}")]
    Rule {
        /// The node's name.
        node: String,
        /// The glob error.
        message: String,
    },
}

/// A node the search may quantize.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// The node.
    pub node: Node,
    /// Its name (unique in the graph tree).
    pub name: String,
    /// Its op type (`MatMul`, `Gemm`, `Conv`).
    pub op: String,
    /// Its schemes from most to least compressed, ending with [`Scheme::Float`].
    pub ladder: Vec<Scheme>,
}

impl Candidate {
    /// The most compressed scheme of its ladder.
    pub fn bottom(&self) -> Scheme {
        self.ladder.first().copied().unwrap_or(Scheme::Float)
    }
}

/// The candidates of a graph.
#[derive(Clone, Debug, Default)]
pub struct Candidates {
    /// In node order.
    pub list: Vec<Candidate>,
    /// Quantizable nodes left float because they have no name, or one that other nodes share.
    pub unnamed: usize,
}

/// The nodes of top-level graph `graph` that the INT4 weight-only and INT8 passes can quantize
/// (see the module documentation).
pub fn candidates(m: &Module, graph: GraphId) -> Candidates {
    let mut names: HashMap<&str, usize> = HashMap::new();
    for g in m.graph_tree(graph) {
        for &n in m.graphs[g].nodes() {
            if let Some(name) = m.nodes[n].name.as_deref() {
                *names.entry(name).or_default() += 1;
            }
        }
    }
    let mut out = Candidates::default();
    for &n in m.graphs[graph].nodes() {
        let node = &m.nodes[n];
        if !matches!(node.op, Op::MatMul {} | Op::Gemm { .. } | Op::Conv { .. }) {
            continue;
        }
        let only = move || -> NodeFilter { Box::new(move |_, x| x == n) };
        let int4 = !WeightOnlyPass::new(WeightOnlyConfig::default())
            .with_filter(only())
            .activation_inputs(m, graph)
            .is_empty();
        let int8 = Int8Pass::activations(m, Some(&only()))
            .iter()
            .any(|(g, v)| *g == graph && !v.is_empty());
        if !int4 && !int8 {
            continue;
        }
        let name = match node.name.as_deref() {
            Some(name) if !name.is_empty() && names.get(name) == Some(&1) => name.to_owned(),
            _ => {
                out.unnamed += 1;
                continue;
            }
        };
        let mut ladder = Vec::new();
        if int4 {
            ladder.push(Scheme::Int4);
        }
        if int8 {
            ladder.push(Scheme::Int8);
        }
        ladder.push(Scheme::Float);
        out.list.push(Candidate {
            node: n,
            name,
            op: node.op.op_type().to_owned(),
            ladder,
        });
    }
    out
}

/// The FP32 main output on the samples, to measure quantized modules against.
#[derive(Clone, Debug)]
pub struct Reference {
    output: String,
    index: usize,
    values: Vec<Vec<f64>>,
}

impl Reference {
    /// Runs top-level graph `graph` of `m` on `samples` and keeps its main output
    /// ([`super::report::main_output`]; `main` names it).
    pub fn new(
        m: &Module,
        graph: GraphId,
        samples: &[Sample],
        main: Option<&str>,
    ) -> Result<Reference, AutoError> {
        if samples.is_empty() {
            return Err(AutoError::NoSamples);
        }
        let interp = Interpreter::new(m);
        let run = |s: usize| {
            interp
                .run(graph, &samples[s])
                .map_err(|source| AutoError::Run {
                    which: "original",
                    sample: s,
                    source,
                })
        };
        // The first sample picks the main output; the others run in parallel.
        let first = run(0)?;
        let chosen = super::report::main_output(&first, main).map(|i| (i, first[i].0.clone()));
        let Some((i, _)) = &chosen else {
            return Err(AutoError::NoOutput);
        };
        let main_of = |outs: &[(String, RtValue)]| {
            let t = outs
                .get(*i)
                .and_then(|(_, v)| v.as_tensor())
                .filter(|t| t.dtype.is_float())
                .ok_or(AutoError::NoOutput)?;
            to_f64(t).map_err(|_| AutoError::NoOutput)
        };
        let mut values = vec![main_of(&first)?];
        let rest: Vec<Result<Vec<f64>, AutoError>> = (1..samples.len())
            .into_par_iter()
            .map(|s| main_of(&run(s)?))
            .collect();
        for v in rest {
            values.push(v?);
        }
        let Some((index, output)) = chosen else {
            return Err(AutoError::NoOutput);
        };
        Ok(Reference {
            output,
            index,
            values,
        })
    }

    /// The same reference over the first `k` samples only.
    pub fn first(&self, k: usize) -> Reference {
        Reference {
            output: self.output.clone(),
            index: self.index,
            values: self.values.iter().take(k).cloned().collect(),
        }
    }

    /// The main output's name.
    pub fn output(&self) -> &str {
        &self.output
    }

    /// The mean over `samples` (those given to [`Reference::new`], in the same order) of the
    /// cosine of `quantized`'s main output (found by name, else by position) against the FP32
    /// one.
    pub fn cosine(&self, quantized: &Module, samples: &[Sample]) -> Result<f64, AutoError> {
        let graph = quantized
            .entries
            .first()
            .map(|e| e.graph)
            .ok_or(AutoError::NoOutput)?;
        let interp = Interpreter::new(quantized);
        let one = |s: usize, sample: &Sample, want: &Vec<f64>| -> Result<f64, AutoError> {
            let outs = interp.run(graph, sample).map_err(|source| AutoError::Run {
                which: "quantized",
                sample: s,
                source,
            })?;
            let j = outs
                .iter()
                .position(|(n, _)| *n == self.output)
                .unwrap_or(self.index);
            let mismatch = |reason: String| AutoError::Output {
                output: self.output.clone(),
                reason,
            };
            let t = outs
                .get(j)
                .and_then(|(_, v)| v.as_tensor())
                .ok_or_else(|| mismatch("missing or not a tensor".to_owned()))?;
            if !t.dtype.is_float() {
                return Err(mismatch(format!("dtype {} is not floating point", t.dtype)));
            }
            let got = to_f64(t).map_err(mismatch)?;
            if got.len() != want.len() {
                return Err(mismatch(format!(
                    "{} elements instead of {}",
                    got.len(),
                    want.len()
                )));
            }
            Ok(cosine(want, &got))
        };
        // Samples in parallel, summed in order (the same figure on any number of threads).
        let each: Vec<Result<f64, AutoError>> = samples
            .par_iter()
            .zip(self.values.par_iter())
            .enumerate()
            .map(|(s, (sample, want))| one(s, sample, want))
            .collect();
        let mut sum = 0.0;
        for c in each {
            sum += c?;
        }
        Ok(sum / samples.len().min(self.values.len()).max(1) as f64)
    }
}

fn to_f64(t: &Tensor) -> Result<Vec<f64>, String> {
    t.to_f64().map_err(|e| e.to_string())
}

/// Cosine of two vectors, non-finite pairs left out; identical vectors (two zero vectors too)
/// give 1, a zero vector against a non-zero one 0.
fn cosine(x: &[f64], y: &[f64]) -> f64 {
    let (mut xx, mut yy, mut xy, mut ee) = (0.0, 0.0, 0.0, 0.0);
    for (&a, &b) in x.iter().zip(y) {
        if !a.is_finite() || !b.is_finite() {
            continue;
        }
        xx += a * a;
        yy += b * b;
        xy += a * b;
        ee += (a - b) * (a - b);
    }
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

/// One candidate alone in a copy of the module: its graph holds the candidate and the nodes that
/// compute its constant operands from constants alone (`Constant`, a stored-quantized weight's
/// `DequantizeLinear`); every other operand is a graph input.
pub struct Isolated {
    /// The copy (constants shared with the original).
    pub module: Module,
    /// The graph that holds the candidate.
    pub graph: GraphId,
    /// Per operand that became a graph input: (the original value, the input that replaces it,
    /// named [`Isolated::input_name`] of its position).
    pub inputs: Vec<(Value, Value)>,
    /// The candidate's first result in the original module.
    pub output: Value,
}

impl Isolated {
    /// The name of graph input `k`.
    pub fn input_name(k: usize) -> String {
        format!("isolated.{k}")
    }
}

/// Copies `m` with `node` (of top-level graph `graph`) alone in `graph` (see [`Isolated`]);
/// `None` when the node has no result.
pub fn isolate(m: &Module, graph: GraphId, node: Node) -> Option<Isolated> {
    let data = &m.nodes[node];
    let output = (*data.outputs.first()?)?;
    let mut module = m.clone();
    let mut nodes = Vec::new();
    let mut inputs: Vec<(Value, Value)> = Vec::new();
    module.graphs[graph].inputs.clear();
    let mut operands = data.inputs.clone();
    let mut known: HashMap<Value, bool> = HashMap::new();
    for v in operands.iter_mut().flatten() {
        if let Some((_, new)) = inputs.iter().find(|(old, _)| old == v) {
            *v = *new;
            continue;
        }
        match m.values[*v].def {
            ValueDef::Const(_) => {}
            ValueDef::Output { .. } if constant_chain(m, *v, &mut known, &mut nodes) => {}
            _ => {
                let ty = m.value_type(*v).clone();
                let name = Isolated::input_name(inputs.len());
                let new = module.add_input(graph, Some(name), ty);
                inputs.push((*v, new));
                *v = new;
            }
        }
    }
    module.set_operands(node, operands);
    nodes.push(node);
    module.set_node_order(graph, nodes);
    module.graphs[graph].outputs = vec![output];
    Some(Isolated {
        module,
        graph,
        inputs,
        output,
    })
}

/// Whether `v` is computed from constants alone (a weight stored quantized:
/// `DequantizeLinear(codes, scale)`, `Cast(codes) * scale`); if so, the nodes that compute it
/// are appended to `nodes`, inputs before the nodes that read them.
fn constant_chain(
    m: &Module,
    v: Value,
    known: &mut HashMap<Value, bool>,
    nodes: &mut Vec<Node>,
) -> bool {
    if let Some(&k) = known.get(&v) {
        return k;
    }
    let answer = match m.values[v].def {
        ValueDef::Const(_) => true,
        ValueDef::Input { .. } => false,
        ValueDef::Output { node, .. } => {
            let data = &m.nodes[node];
            // Marked false first: a cycle (there is none in a valid graph) cannot recurse.
            known.insert(v, false);
            let all = data.op.subgraphs().is_empty()
                && data
                    .inputs
                    .iter()
                    .flatten()
                    .all(|&i| constant_chain(m, i, known, nodes));
            if all && !nodes.contains(&node) {
                nodes.push(node);
            }
            all
        }
    };
    known.insert(v, answer);
    answer
}

/// Per candidate, `1 − cosine` of its own first result quantized at the bottom of its ladder
/// against the FP32 result, both computed from the FP32 activations it reads: one run of the
/// original module per sample gives every candidate's operands and result, then each candidate
/// runs alone ([`isolate`], quantized by `quantize(i, &mut isolated)`), so the cost is one model
/// run per sample plus one node per candidate instead of one model run per candidate. A
/// candidate whose ladder starts at float gets 0.
pub fn local_sensitivity<E: From<AutoError>>(
    m: &Module,
    graph: GraphId,
    candidates: &[Candidate],
    samples: &[Sample],
    mut quantize: impl FnMut(usize, &mut Isolated) -> Result<(), E>,
) -> Result<Vec<f64>, E> {
    if samples.is_empty() {
        return Err(AutoError::NoSamples.into());
    }
    let mut alone: Vec<Option<Isolated>> = Vec::with_capacity(candidates.len());
    for (i, c) in candidates.iter().enumerate() {
        let iso = match isolate(m, graph, c.node) {
            Some(mut iso) if c.bottom() != Scheme::Float => {
                quantize(i, &mut iso)?;
                Some(iso)
            }
            _ => None,
        };
        alone.push(iso);
    }
    // The original module with every operand and result of a candidate as an extra output.
    let mut probe = m.clone();
    let n_out = probe.graphs[graph].outputs.len();
    let mut watched: Vec<Value> = Vec::new();
    for iso in alone.iter().flatten() {
        for v in iso.inputs.iter().map(|(old, _)| *old).chain([iso.output]) {
            if !watched.contains(&v) {
                watched.push(v);
            }
        }
    }
    probe.graphs[graph].outputs.extend(watched.iter().copied());
    let interp = Interpreter::new(&probe);
    let alone_interps: Vec<Option<(&Isolated, Interpreter<'_>)>> = alone
        .iter()
        .map(|iso| iso.as_ref().map(|iso| (iso, Interpreter::new(&iso.module))))
        .collect();
    // Per sample (in parallel), each candidate's cosine; NaN where its result cannot be compared.
    let one = |s: usize, sample: &Sample| -> Result<Vec<f64>, AutoError> {
        let outs = interp.run(graph, sample).map_err(|source| AutoError::Run {
            which: "original",
            sample: s,
            source,
        })?;
        let seen: HashMap<Value, &RtValue> = watched
            .iter()
            .copied()
            .zip(outs[n_out..].iter().map(|(_, v)| v))
            .collect();
        let mut cosines = vec![0.0f64; alone_interps.len()];
        for (c, entry) in cosines.iter_mut().zip(&alone_interps) {
            let Some((iso, run)) = entry else { continue };
            let mut feeds: Sample = HashMap::with_capacity(iso.inputs.len());
            // By name: the passes may renumber the copy's values.
            for (k, (old, _)) in iso.inputs.iter().enumerate() {
                if let Some(v) = seen.get(old) {
                    feeds.insert(Isolated::input_name(k), (*v).clone());
                }
            }
            let got = run
                .run(iso.graph, &feeds)
                .map_err(|source| AutoError::Run {
                    which: "quantized",
                    sample: s,
                    source,
                })?;
            let want = seen.get(&iso.output).and_then(|v| v.as_tensor());
            let got = got.first().and_then(|(_, v)| v.as_tensor());
            *c = match (want.map(|t| to_f64(t)), got.map(|t| to_f64(t))) {
                (Some(Ok(want)), Some(Ok(got))) if want.len() == got.len() => cosine(&want, &got),
                _ => f64::NAN,
            };
        }
        Ok(cosines)
    };
    let per_sample: Vec<Result<Vec<f64>, AutoError>> = samples
        .par_iter()
        .enumerate()
        .map(|(s, sample)| one(s, sample))
        .collect();
    let mut sums = vec![0.0f64; candidates.len()];
    for cosines in per_sample {
        for (sum, c) in sums.iter_mut().zip(cosines?) {
            *sum += c;
        }
    }
    Ok(alone
        .iter()
        .zip(sums)
        .map(|(iso, sum)| match iso {
            Some(_) => 1.0 - sum / samples.len() as f64,
            None => 0.0,
        })
        .collect())
}

/// Per candidate, whether the graph output named `output` depends on it (a candidate it does not
/// depend on costs that output nothing, whatever its local loss).
pub fn reaches(m: &Module, graph: GraphId, candidates: &[Candidate], output: &str) -> Vec<bool> {
    let roots: Vec<Value> = m.graphs[graph]
        .outputs
        .iter()
        .copied()
        .filter(|&v| m.values[v].name.as_deref() == Some(output))
        .collect();
    if roots.is_empty() {
        return vec![true; candidates.len()];
    }
    let needed = crate::dce::needed_by(m, graph, &roots);
    candidates
        .iter()
        .map(|c| needed.contains(&c.node))
        .collect()
}

/// Scales local losses ([`local_sensitivity`]) by how much the model amplifies or damps them
/// where they occur: the candidates (in node order) fall into up to `groups` runs of equal size;
/// each run is measured end to end once with all its members at the bottom of their ladders (the
/// rest float), and its members' local losses are scaled so that they sum to that loss. A node's
/// local loss says how much its own result changes; the run's measurement says what such a
/// change at that depth costs the main output (early layers of a deep network weigh more than
/// late ones, a classifier's head more than a feature layer). `evaluate` is the search's.
pub fn depth_scaled<E: From<AutoError>>(
    candidates: &[Candidate],
    local: &[f64],
    groups: usize,
    mut evaluate: impl FnMut(&[Scheme]) -> Result<f64, E>,
) -> Result<Vec<f64>, E> {
    let n = candidates.len();
    let members: Vec<usize> = (0..n)
        .filter(|&i| candidates[i].bottom() != Scheme::Float)
        .collect();
    let mut scaled: Vec<f64> = local.to_vec();
    if members.is_empty() || groups == 0 {
        return Ok(scaled);
    }
    let size = members.len().div_ceil(groups.min(members.len()));
    for run in members.chunks(size) {
        let sum: f64 = run.iter().map(|&i| local[i]).sum();
        if sum.is_nan() || sum <= 0.0 {
            continue;
        }
        let mut schemes = vec![Scheme::Float; n];
        for &i in run {
            schemes[i] = candidates[i].bottom();
        }
        let loss = 1.0 - evaluate(&schemes)?;
        let gain = if loss.is_nan() {
            f64::NAN
        } else {
            loss.max(0.0) / sum
        };
        for &i in run {
            scaled[i] = local[i] * gain;
        }
    }
    Ok(scaled)
}

/// The outcome of [`search`].
#[derive(Clone, Debug, PartialEq)]
pub struct Choice {
    /// The chosen scheme per candidate (in the order of the candidates given).
    pub schemes: Vec<Scheme>,
    /// Per candidate, `1 − cosine` with only it at its most compressed scheme.
    pub sensitivity: Vec<f64>,
    /// Candidate indices, most sensitive first (ties in candidate order).
    pub order: Vec<usize>,
    /// The cosine of the choice.
    pub cosine: f64,
    /// Steps taken (candidates moved one rung up).
    pub steps: usize,
    /// Evaluations made.
    pub evaluations: usize,
}

/// Chooses a scheme per candidate (see the module documentation). `evaluate` gets one scheme per
/// candidate and returns the cosine of the module quantized that way.
///
/// `sensitivity`, when given (one loss per candidate, e.g. from [`local_sensitivity`]), replaces
/// the first phase's evaluations; the steps are measured end to end all the same.
pub fn search<E: From<AutoError>>(
    candidates: &[Candidate],
    target: f64,
    sensitivity: Option<Vec<f64>>,
    mut evaluate: impl FnMut(&[Scheme]) -> Result<f64, E>,
) -> Result<Choice, E> {
    if !(0.0..=1.0).contains(&target) {
        return Err(AutoError::Target(target).into());
    }
    let n = candidates.len();
    let mut evaluations = 0usize;
    let mut eval = |schemes: &[Scheme]| {
        evaluations += 1;
        evaluate(schemes)
    };

    let sensitivity = match sensitivity {
        Some(given) if given.len() == n => given,
        _ => {
            let mut measured = vec![0.0; n];
            for (i, c) in candidates.iter().enumerate() {
                let mut s = vec![Scheme::Float; n];
                s[i] = c.bottom();
                if s[i] != Scheme::Float {
                    measured[i] = 1.0 - eval(&s)?;
                }
            }
            measured
        }
    };
    // A NaN loss (a broken output) counts as the most sensitive.
    let key = |i: usize| {
        if sensitivity[i].is_nan() {
            f64::INFINITY
        } else {
            sensitivity[i]
        }
    };
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| key(b).total_cmp(&key(a)));

    // Step k moves candidate moves[k] one rung up.
    let moves: Vec<usize> = order
        .iter()
        .flat_map(|&i| std::iter::repeat_n(i, candidates[i].ladder.len().saturating_sub(1)))
        .collect();
    let state = |k: usize| {
        let mut level = vec![0usize; n];
        for &i in &moves[..k] {
            level[i] += 1;
        }
        candidates
            .iter()
            .zip(level)
            .map(|(c, l)| c.ladder.get(l).copied().unwrap_or(Scheme::Float))
            .collect::<Vec<_>>()
    };
    let reached = |c: f64| c >= target;

    let first = eval(&state(0))?;
    let (steps, cosine) = if reached(first) {
        (0, first)
    } else {
        let last = moves.len();
        let all = eval(&state(last))?;
        if !reached(all) {
            return Err(AutoError::Unreachable { target, best: all }.into());
        }
        // Invariant: `lo` steps miss the target, `hi` steps reach it with cosine `best`.
        let (mut lo, mut hi, mut best) = (0, last, all);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            let c = eval(&state(mid))?;
            if reached(c) {
                hi = mid;
                best = c;
            } else {
                lo = mid;
            }
        }
        (hi, best)
    };
    Ok(Choice {
        schemes: state(steps),
        sensitivity,
        order,
        cosine,
        steps,
        evaluations,
    })
}

/// A precision map giving candidate `i` the scheme `schemes[i]` with `settings(scheme)`: one rule
/// per candidate by exact name, in the order of `order`, and `[default] scheme = "float"`.
pub fn assignment_map(
    candidates: &[Candidate],
    schemes: &[Scheme],
    order: &[usize],
    settings: &dyn Fn(Scheme) -> Settings,
) -> Result<PrecisionMap, AutoError> {
    let mut rules = Vec::with_capacity(order.len());
    for &i in order {
        let (Some(c), Some(&s)) = (candidates.get(i), schemes.get(i)) else {
            continue;
        };
        let rule = Rule::new(
            None,
            vec![escape_glob(&c.name)],
            Vec::new(),
            Vec::new(),
            settings(s),
        )
        .map_err(|e| AutoError::Rule {
            node: c.name.clone(),
            message: e.to_string(),
        })?;
        rules.push(rule);
    }
    Ok(PrecisionMap::new(Settings::float(), rules))
}

impl Choice {
    /// The chosen map (rules most sensitive first; see [`assignment_map`]).
    pub fn map(
        &self,
        candidates: &[Candidate],
        settings: &dyn Fn(Scheme) -> Settings,
    ) -> Result<PrecisionMap, AutoError> {
        assignment_map(candidates, &self.schemes, &self.order, settings)
    }

    /// The chosen map as TOML: a comment header with the target and the cosine reached, a
    /// comment with the op and sensitivity before each rule.
    pub fn toml(
        &self,
        candidates: &[Candidate],
        settings: &dyn Fn(Scheme) -> Settings,
        target: f64,
        output: &str,
    ) -> Result<String, AutoError> {
        let map = self.map(candidates, settings)?;
        let mut text = format!(
            "# Precision map chosen by `mmq compile --auto {target}`: the most compressed scheme\n\
             # per node that keeps the mean cosine of output '{}' at or above {target}.\n\
             # Achieved cosine: {:.8} on the calibration samples ({} evaluations).\n\
             # Rules: most sensitive node first; sensitivity = the loss (1 - cosine) the node\n\
             # alone at its most compressed scheme is estimated to cost.\n",
            output.replace(|c: char| c.is_control(), " "),
            self.cosine,
            self.evaluations,
        );
        text.push_str(&map.to_toml_with(|k| {
            let i = *self.order.get(k)?;
            let c = candidates.get(i)?;
            Some(format!(
                "{} {}: sensitivity {:.3e}",
                c.op, c.name, self.sensitivity[i]
            ))
        }));
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(src: &str) -> Module {
        match mmq_ir::text::parse(src) {
            Ok((m, _)) => m,
            Err(e) => panic!("test module does not parse: {e:?}"),
        }
    }

    fn cand(name: &str, ladder: &[Scheme]) -> Candidate {
        Candidate {
            node: Node::from_index(0),
            name: name.to_owned(),
            op: "MatMul".to_owned(),
            ladder: ladder.to_vec(),
        }
    }

    const I4: [Scheme; 3] = [Scheme::Int4, Scheme::Int8, Scheme::Float];

    /// A made-up cost model: each candidate loses `loss[i][rung]`, losses add up.
    fn additive(
        cands: &[Candidate],
        loss: &[[f64; 3]],
    ) -> impl FnMut(&[Scheme]) -> Result<f64, AutoError> {
        let cands = cands.to_vec();
        let loss = loss.to_vec();
        move |s: &[Scheme]| {
            let mut total = 0.0;
            for (i, &sc) in s.iter().enumerate() {
                let rung = cands[i].ladder.iter().position(|&x| x == sc).unwrap_or(0);
                let rung = if sc == Scheme::Float { 2 } else { rung };
                total += loss[i][rung];
            }
            Ok(1.0 - total)
        }
    }

    #[test]
    fn the_search_walks_the_sensitive_nodes_up_first() {
        let cands = vec![cand("a", &I4), cand("b", &I4), cand("c", &I4)];
        // b is the most sensitive, then c, then a.
        let loss = [[0.001, 0.0001, 0.0], [0.05, 0.002, 0.0], [0.01, 0.001, 0.0]];
        let all_int4 = 1.0 - (0.001 + 0.05 + 0.01);
        let c = search(&cands, 0.5, None, additive(&cands, &loss)).expect("choice");
        assert_eq!(c.schemes, vec![Scheme::Int4; 3]);
        assert_eq!((c.steps, c.cosine), (0, all_int4));
        assert_eq!(c.order, vec![1, 2, 0]);
        assert!((c.sensitivity[1] - 0.05).abs() < 1e-12);
        // 0.98: b to int8 (loss 0.013) is enough.
        let c = search(&cands, 0.98, None, additive(&cands, &loss)).expect("choice");
        assert_eq!(c.schemes, [Scheme::Int4, Scheme::Int8, Scheme::Int4]);
        assert!(c.cosine >= 0.98);
        // 0.99: b to float (0.011 left) is not enough, c to int8 too (0.002).
        let c = search(&cands, 0.99, None, additive(&cands, &loss)).expect("choice");
        assert_eq!(c.schemes, [Scheme::Int4, Scheme::Float, Scheme::Int8]);
        assert_eq!(c.steps, 3);
        // 1.0: everything float.
        let c = search(&cands, 1.0, None, additive(&cands, &loss)).expect("choice");
        assert_eq!(c.schemes, vec![Scheme::Float; 3]);
        assert_eq!(c.cosine, 1.0);
        // Evaluations: 3 sensitivities, no step, all steps, then log2(6) bisections.
        assert!(c.evaluations <= 3 + 2 + 3, "{}", c.evaluations);
    }

    #[test]
    fn the_search_takes_the_shortest_prefix_of_steps() {
        // Compare with walking the steps one by one.
        let cands: Vec<Candidate> = (0..7)
            .map(|i| {
                if i % 3 == 0 {
                    cand(&format!("conv{i}"), &[Scheme::Int8, Scheme::Float])
                } else {
                    cand(&format!("mm{i}"), &I4)
                }
            })
            .collect();
        let loss: Vec<[f64; 3]> = (0..7)
            .map(|i| {
                let s = 0.001 * ((i * 7919) % 13 + 1) as f64;
                [s, s / 10.0, 0.0]
            })
            .collect();
        for target in [0.9, 0.95, 0.97, 0.99, 0.995, 0.999, 0.9999] {
            let c = search(&cands, target, None, additive(&cands, &loss)).expect("choice");
            assert!(c.cosine >= target, "{target}: {}", c.cosine);
            // One step fewer misses the target.
            if c.steps > 0 {
                let mut level = [0usize; 7];
                let moves: Vec<usize> = c
                    .order
                    .iter()
                    .flat_map(|&i| std::iter::repeat_n(i, cands[i].ladder.len() - 1))
                    .collect();
                for &i in &moves[..c.steps - 1] {
                    level[i] += 1;
                }
                let before: Vec<Scheme> = (0..7).map(|i| cands[i].ladder[level[i]]).collect();
                let cos = additive(&cands, &loss)(&before).expect("cosine");
                assert!(
                    cos < target,
                    "{target}: {} steps already reach it",
                    c.steps - 1
                );
            }
        }
    }

    #[test]
    fn bad_targets_and_unreachable_targets_are_errors() {
        let cands = vec![cand("a", &I4)];
        let never = |_: &[Scheme]| Ok::<f64, AutoError>(0.5);
        for t in [-0.1, 1.5, f64::NAN] {
            assert!(matches!(
                search(&cands, t, None, never),
                Err(AutoError::Target(_))
            ));
        }
        match search(&cands, 0.9, None, never) {
            Err(AutoError::Unreachable { best, .. }) => assert_eq!(best, 0.5),
            other => panic!("{other:?}"),
        }
        // No candidates: the unquantized model is the choice.
        let c = search(&[], 0.99, None, |_| Ok::<f64, AutoError>(1.0)).expect("choice");
        assert!(c.schemes.is_empty() && c.cosine == 1.0);
    }

    #[test]
    fn candidates_need_a_constant_weight_and_a_unique_name() {
        let m = parse(
            r#"
const $w : f32[4, 4] = dense<[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6]>
const $k : f32[2, 3, 1, 1] = dense<[0.1, 0.2, 0.3, 0.4, 0.5, 0.6]>
graph @g(%x: f32[2, 4], %img: f32[1, 3, 2, 2]) -> (f32[2, 4], f32[2, 4], f32[1, 2, 2, 2]) {
  %a = MatMul(%x, $w) : f32[2, 4] loc("mm*one")
  %b = MatMul(%a, %a) : f32[2, 4] loc("mm_two")
  %c = MatMul(%a, $w) : f32[2, 4] loc("dup")
  %d = Relu(%c) : f32[2, 4] loc("dup")
  %e = Conv(%img, $k) : f32[1, 2, 2, 2] loc("conv")
  return %b, %d, %e
}
"#,
        );
        let g = m.entries[0].graph;
        let c = candidates(&m, g);
        let got: Vec<(&str, &str, &[Scheme])> = c
            .list
            .iter()
            .map(|c| (c.name.as_str(), c.op.as_str(), c.ladder.as_slice()))
            .collect();
        assert_eq!(
            got,
            [
                ("mm*one", "MatMul", &I4[..]),
                ("conv", "Conv", &[Scheme::Int8, Scheme::Float][..]),
            ]
        );
        assert_eq!(c.unnamed, 1, "the MatMul named like the Relu");

        // The map addresses them by exact name and parses back.
        let choice = Choice {
            schemes: vec![Scheme::Int4, Scheme::Float],
            sensitivity: vec![0.01, 0.02],
            order: vec![1, 0],
            cosine: 0.995,
            steps: 2,
            evaluations: 5,
        };
        let settings = |s: Scheme| Settings {
            scheme: s,
            ..Settings::float()
        };
        let text = choice.toml(&c.list, &settings, 0.99, "out").expect("toml");
        assert!(text.starts_with("# Precision map chosen by `mmq compile --auto 0.99`"));
        assert!(text.contains("# Achieved cosine: 0.99500000"), "{text}");
        let (map, warnings) = PrecisionMap::parse(&text).unwrap_or_else(|e| panic!("{e:?}"));
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(map.rules[0].nodes(), ["conv"]);
        assert_eq!(map.rules[1].nodes(), ["mm[*]one"]);
        let labels = mmq_ir::modality::analyze(&m, g, &[]).expect("labels");
        let plan = map.plan(&m, g, &labels);
        assert_eq!(
            plan.get(c.list[0].node).map(|p| p.scheme),
            Some(Scheme::Int4)
        );
        assert_eq!(
            plan.get(c.list[1].node).map(|p| p.scheme),
            Some(Scheme::Float)
        );
        assert_eq!(plan.nodes_with(Scheme::Int4).len(), 1);
    }

    #[test]
    fn the_reference_measures_the_main_output() {
        let m = parse(
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
        let x = vec![3.0f32, 1.0, 0.0, 0.0, 1.0, 0.8];
        let t = Tensor::from_f32(vec![2, 3], x.clone()).expect("tensor");
        let samples = vec![HashMap::from([("x".to_owned(), t.into())])];
        let g = m.entries[0].graph;
        let r = Reference::new(&m, g, &samples, None).expect("reference");
        assert_eq!(r.output(), "y");
        assert_eq!(r.cosine(&m, &samples).expect("cosine"), 1.0);
        let want: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
        let got: Vec<f64> = want
            .iter()
            .enumerate()
            .map(|(i, v)| if i % 3 == 2 { v + 0.5 } else { *v })
            .collect();
        let dot: f64 = want.iter().zip(&got).map(|(a, b)| a * b).sum();
        let norm = |v: &[f64]| v.iter().map(|a| a * a).sum::<f64>().sqrt();
        let expect = dot / (norm(&want) * norm(&got));
        let c = r.cosine(&q, &samples).expect("cosine");
        assert!((c - expect).abs() < 1e-7, "{c} vs {expect}");
        assert!(matches!(
            Reference::new(&m, g, &[], None),
            Err(AutoError::NoSamples)
        ));
    }

    /// Two MatMuls in a chain and one beside it that the main output does not read.
    const CHAIN: &str = r#"
const $w1 : f32[4, 4] = dense<[0.9, -0.2, 0.33, 0.4, 0.5, 0.61, -0.7, 0.8, 0.05, 1.0, 1.1, -1.2, 1.3, 0.14, 1.5, 1.6]>
const $w2 : f32[4, 4] = dense<[0.3, 0.1, -0.4, 0.7, 0.2, 0.9, 0.6, -0.5, 0.8, 0.35, 0.25, 0.45, -0.15, 0.55, 0.65, 0.75]>
graph @g(%x: f32[3, 4]) -> (f32[3, 4], f32[3, 4]) {
  %a = MatMul(%x, $w1) : f32[3, 4] loc("first")
  %r = Relu(%a) : f32[3, 4]
  %b = MatMul(%r, $w2) : f32[3, 4] loc("second")
  %c = MatMul(%x, $w2) : f32[3, 4] loc("beside")
  return %b, %c
}
"#;

    fn chain_samples() -> Vec<Sample> {
        (0..3)
            .map(|s| {
                let x: Vec<f32> = (0..12)
                    .map(|i| ((i * 7 + s * 5) % 11) as f32 * 0.3 - 1.4)
                    .collect();
                let t = Tensor::from_f32(vec![3, 4], x).expect("tensor");
                HashMap::from([("x".to_owned(), t.into())])
            })
            .collect()
    }

    /// INT4 weight-only on the nodes named in `only`, as the search's evaluation does.
    fn int4(m: &mut Module, only: &[&str]) {
        use crate::pass::{Pass, PassOptions};
        let names: Vec<String> = only.iter().map(|s| (*s).to_owned()).collect();
        let filter: NodeFilter = Box::new(move |m, n| {
            m.nodes[n]
                .name
                .as_deref()
                .is_some_and(|x| names.iter().any(|y| y == x))
        });
        let config = WeightOnlyConfig {
            block_size: 16,
            ..WeightOnlyConfig::default()
        };
        WeightOnlyPass::new(config)
            .with_filter(filter)
            .run(m, &PassOptions::default())
            .expect("int4");
    }

    #[test]
    fn a_node_alone_on_the_fp32_activations_loses_what_it_loses_in_the_model() {
        let m = parse(CHAIN);
        let g = m.entries[0].graph;
        let cands = candidates(&m, g).list;
        let names: Vec<&str> = cands.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["first", "second", "beside"]);
        let samples = chain_samples();
        let local = local_sensitivity(&m, g, &cands, &samples, |i, iso: &mut Isolated| {
            assert_eq!(iso.module.graphs[iso.graph].nodes(), [cands[i].node]);
            int4(&mut iso.module, &[cands[i].name.as_str()]);
            Ok::<(), AutoError>(())
        })
        .expect("local");
        // The last node of the chain reads FP32 activations in the model too, so its local
        // loss is its end-to-end loss on the output it computes.
        let mut q = m.clone();
        int4(&mut q, &["second"]);
        let r = Reference::new(&m, g, &samples, Some("b")).expect("reference");
        let end_to_end = 1.0 - r.cosine(&q, &samples).expect("cosine");
        assert!(end_to_end > 1e-6, "INT4 leaves some noise: {end_to_end}");
        assert!(
            (local[1] - end_to_end).abs() < 1e-12,
            "{} vs {end_to_end}",
            local[1]
        );
        assert!(local.iter().all(|&l| l > 0.0 && l < 0.1), "{local:?}");
        // Only the chain reaches `b`.
        assert_eq!(reaches(&m, g, &cands, "b"), [true, true, false]);
        assert_eq!(reaches(&m, g, &cands, "c"), [false, false, true]);
    }

    #[test]
    fn depth_scaling_makes_each_run_sum_to_its_measured_loss() {
        let cands = vec![
            cand("a", &I4),
            cand("b", &[Scheme::Float]),
            cand("c", &I4),
            cand("d", &I4),
        ];
        let local = [0.01, 0.0, 0.02, 0.03];
        // Runs of 2 movable candidates: {a, c} then {d}; the first run measures 0.006, the
        // second 0.06.
        let mut seen = Vec::new();
        let scaled = depth_scaled(&cands, &local, 2, |s: &[Scheme]| {
            seen.push(s.to_vec());
            Ok::<f64, AutoError>(if s[0] == Scheme::Int4 {
                1.0 - 0.006
            } else {
                1.0 - 0.06
            })
        })
        .expect("scaled");
        assert_eq!(seen.len(), 2);
        assert_eq!(
            seen[0],
            [Scheme::Int4, Scheme::Float, Scheme::Int4, Scheme::Float]
        );
        let want = [0.002, 0.0, 0.004, 0.06];
        for (x, y) in scaled.iter().zip(want) {
            assert!((x - y).abs() < 1e-12, "{scaled:?}");
        }
        // The search then walks c before a, whatever their local order.
        let c = search(&cands, 0.999, Some(scaled), |_: &[Scheme]| {
            Ok::<f64, AutoError>(1.0)
        })
        .expect("choice");
        assert_eq!(c.order[..2], [3, 2]);
    }

    #[test]
    fn a_weight_stored_quantized_stays_constant_in_the_isolated_copy() {
        let m = parse(
            r#"
const $q : i8[2, 2] = dense<[1, -2, 3, -4]>
const $s : f32[] = dense<[0.5]>
graph @g(%x: f32[3, 2]) -> (f32[3, 2]) {
  %w = DequantizeLinear($q, $s) : f32[2, 2]
  %y = MatMul(%x, %w) : f32[3, 2] loc("mm")
  return %y
}
"#,
        );
        let g = m.entries[0].graph;
        let node = m.graphs[g].nodes()[1];
        let iso = isolate(&m, g, node).expect("isolated");
        // The DequantizeLinear comes along; only the activation becomes an input.
        assert_eq!(iso.module.graphs[g].nodes(), m.graphs[g].nodes());
        assert_eq!(iso.inputs.len(), 1);
        assert_eq!(
            iso.module.values[iso.inputs[0].1].name.as_deref(),
            Some("isolated.0")
        );
    }
}
