//! The graph interpreter: binds symbolic dims, runs nodes in order, frees activations after their
//! last use, runs nested graphs for control flow.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mmq_ir::{Const, Dim, GraphId, Module, Node, Sym, Type, Value, ValueDef};

use crate::error::KernelError;
use crate::ops::{self, OpCtx};
use crate::tensor::{Data, RtValue, Tensor};

/// Per-op timings and the peak of live activation bytes of the runs so far.
#[derive(Clone, Debug, Default)]
pub struct RunStats {
    /// Op type → (calls, total time).
    pub per_op: BTreeMap<String, (usize, Duration)>,
    /// Largest total size of live activations (not counting constants) seen at any point.
    pub peak_live_bytes: usize,
}

/// Values computed so far in one graph activation, with the enclosing activation for outer-scope
/// references from subgraphs.
pub struct Env<'p> {
    vals: HashMap<Value, RtValue>,
    parent: Option<&'p Env<'p>>,
    /// The symbols the top-level inputs bound (in the root scope).
    syms: HashMap<Sym, i64>,
}

impl Env<'_> {
    fn lookup(&self, v: Value) -> Option<&RtValue> {
        self.vals
            .get(&v)
            .or_else(|| self.parent.and_then(|p| p.lookup(v)))
    }

    /// The value the run's inputs bound symbol `s` to.
    fn sym(&self, s: Sym) -> Option<i64> {
        self.syms
            .get(&s)
            .copied()
            .or_else(|| self.parent.and_then(|p| p.sym(s)))
    }
}

/// The most bytes of external weights an interpreter keeps decoded between uses.
pub const EXTERNAL_CACHE_BYTES: u64 = 256 << 20;

/// The largest result of a constant subexpression an interpreter keeps between runs, and the
/// most it keeps in all ([`Interpreter::run`]): weights a model assembles from slices of one
/// blob at every call (silero-vad's LSTM) are assembled once, while a transposed or
/// dequantized copy of every weight of a large model is not held.
pub const FOLD_MAX_BYTES: usize = 1 << 20;
/// See [`FOLD_MAX_BYTES`].
pub const FOLD_CACHE_BYTES: usize = 64 << 20;

/// Runs graphs of one module.
pub struct Interpreter<'m> {
    module: &'m Module,
    /// Decoded constants: every inline one, and external ones while they fit the budget.
    consts: Mutex<HashMap<Const, Arc<Tensor>>>,
    /// Bytes of decoded external constants kept in `consts`.
    cached_external: Mutex<u64>,
    /// Per-graph facts computed once, not on every activation (a `Loop` body runs many times).
    plans: Mutex<HashMap<GraphId, Arc<Plan>>>,
    /// Results of constant subexpressions kept between runs, and their total bytes.
    folded: Mutex<(HashMap<Value, RtValue>, usize)>,
    stats: Option<Mutex<RunStats>>,
    live_bytes: Mutex<usize>,
}

/// What running a graph needs besides its inputs: when each value can be freed, and the opset.
struct Plan {
    /// Node position → the values whose last use it is.
    last_use: HashMap<usize, Vec<Value>>,
    /// Every value read at all (results outside this set are freed at once).
    used: HashSet<Value>,
    /// Graph outputs, never freed.
    keep: HashSet<Value>,
    /// The default-domain opset of the model holding the graph.
    opset: i64,
    /// Node position → whether the node computes a constant: a deterministic modeled op
    /// without subgraphs whose operands are all constants or results of such nodes.
    constant: Vec<bool>,
    /// `Sigmoid` node position → the `Mul` that multiplies its result by its operand (SiLU):
    /// both run as one pass at the `Sigmoid`.
    swish: HashMap<usize, Swish>,
}

/// `y = Mul(x, Sigmoid(x))`, run as one pass over `x` (`x · σ(x)`, the same product the two
/// nodes compute) at the `Sigmoid`'s position, the `Mul` skipped: one pass and one buffer
/// instead of two of each, and none at all when `x` is used nowhere else (it is overwritten).
#[derive(Clone, Copy, Debug)]
struct Swish {
    x: Value,
    /// The `Mul`'s position and result.
    mul: usize,
    y: Value,
    /// `x` is read by these two nodes only: its buffer may become `y`'s.
    consume: bool,
}

impl<'m> Interpreter<'m> {
    /// An interpreter for `module`.
    pub fn new(module: &'m Module) -> Self {
        Interpreter {
            module,
            consts: Mutex::default(),
            cached_external: Mutex::new(0),
            plans: Mutex::default(),
            folded: Mutex::default(),
            stats: None,
            live_bytes: Mutex::new(0),
        }
    }

    /// Also records per-op time and the peak of live activation bytes.
    pub fn with_stats(mut self) -> Self {
        self.stats = Some(Mutex::default());
        self
    }

    /// Forgets the statistics recorded so far (per-op times and the peak), so that the next
    /// runs are measured alone: after a first run that decoded the constants, the warm runs.
    pub fn reset_stats(&self) {
        if let Some(stats) = &self.stats
            && let Ok(mut s) = stats.lock()
        {
            *s = RunStats::default();
        }
    }

    /// The module.
    pub fn module(&self) -> &'m Module {
        self.module
    }

    /// The statistics recorded so far, when enabled.
    pub fn stats(&self) -> Option<RunStats> {
        self.stats
            .as_ref()
            .map(|s| s.lock().map(|s| s.clone()).unwrap_or_default())
    }

    /// A constant as a tensor. Inline constants are decoded once; external weights (read with
    /// positional reads, so the file's pages do not stay resident) are kept decoded while they
    /// total at most [`EXTERNAL_CACHE_BYTES`], the rest decoded at each use and dropped after
    /// it: calibrating a multi-gigabyte model holds one layer's weights at a time, not a copy
    /// of the model.
    pub fn constant(&self, c: Const) -> Result<Arc<Tensor>, KernelError> {
        if let Some(t) = self.consts.lock().ok().and_then(|m| m.get(&c).cloned()) {
            return Ok(t);
        }
        let data = self
            .module
            .consts
            .get(c)
            .ok_or_else(|| KernelError::Module(format!("constant {c:?} does not exist")))?;
        let t = Arc::new(Tensor::from_const(data)?);
        let keep = match data.storage {
            mmq_ir::Storage::External { len, .. } => match self.cached_external.lock() {
                Ok(mut total) if *total + len <= EXTERNAL_CACHE_BYTES => {
                    *total += len;
                    true
                }
                _ => false,
            },
            _ => true,
        };
        if keep && let Ok(mut m) = self.consts.lock() {
            m.insert(c, t.clone());
        }
        Ok(t)
    }

    /// Runs the top-level graph `graph` on named inputs; returns its outputs by name (or
    /// `output_<i>` when unnamed), in order. Inputs are checked against the declared types, and
    /// symbolic dims are bound (consistently across inputs) and checked against their ranges.
    pub fn run(
        &self,
        graph: GraphId,
        inputs: &HashMap<String, RtValue>,
    ) -> Result<Vec<(String, RtValue)>, KernelError> {
        let m = self.module;
        let g = m
            .graphs
            .get(graph)
            .ok_or_else(|| KernelError::Module(format!("no graph {graph:?}")))?;
        let mut args = Vec::with_capacity(g.inputs.len());
        let mut bound: HashMap<Sym, i64> = HashMap::new();
        let mut known = HashSet::new();
        for &v in &g.inputs {
            let name = m.values[v].name.clone().unwrap_or_default();
            known.insert(name.clone());
            match inputs.get(&name) {
                Some(val) => {
                    self.check_input(&name, m.value_type(v), val, &mut bound)?;
                    args.push(Some(val.clone()));
                }
                None => match m.values[v].def {
                    ValueDef::Input {
                        default: Some(_), ..
                    } => args.push(None),
                    _ => {
                        return Err(KernelError::Input {
                            name: name.clone(),
                            message: format!(
                                "missing; expected {}",
                                self.describe(m.value_type(v))
                            ),
                        });
                    }
                },
            }
        }
        let mut extra: Vec<&String> = inputs.keys().filter(|k| !known.contains(*k)).collect();
        extra.sort();
        if let Some(name) = extra.first() {
            return Err(self.not_an_input(graph, name));
        }
        self.check_ranges(&bound)?;
        // The whole run on one of rayon's threads: the kernels' parallel loops then start from a
        // worker, which takes part in them, instead of handing each one over to the pool from
        // outside and sleeping until it is done (a wake-up per convolution).
        let run = || {
            let root = Env {
                vals: HashMap::new(),
                parent: None,
                syms: bound,
            };
            self.run_graph(graph, args, &root)
        };
        let outs = if rayon::current_num_threads() > 1 {
            rayon::scope(|_| run())?
        } else {
            run()?
        };
        Ok(g.outputs
            .iter()
            .zip(outs)
            .enumerate()
            .map(|(i, (&v, val))| {
                (
                    m.values[v]
                        .name
                        .clone()
                        .unwrap_or_else(|| format!("output_{i}")),
                    val,
                )
            })
            .collect())
    }

    fn describe(&self, ty: &Type) -> String {
        mmq_ir::text::type_text(self.module, ty)
    }

    fn check_input(
        &self,
        name: &str,
        ty: &Type,
        val: &RtValue,
        bound: &mut HashMap<Sym, i64>,
    ) -> Result<(), KernelError> {
        if ty.as_tensor().is_none() {
            return Ok(());
        }
        let Some(t) = val.as_tensor() else {
            return Err(KernelError::Input {
                name: name.into(),
                message: format!("expected a tensor {}", self.describe(ty)),
            });
        };
        self.check_tensor_type(name, ty, t.dtype, &t.shape, bound)
    }

    /// Checks inputs given as (name, element type, shape) — an array file's headers before its
    /// data is read, or a sample's tensors as they arrive — as [`Interpreter::run`] checks
    /// them: a file that claims a gigabyte for a small input is refused before it is inflated.
    /// Inputs not given are not checked; a name that is no input of `graph` is an error.
    pub fn check_shapes<'s>(
        &self,
        graph: GraphId,
        given: impl IntoIterator<Item = (&'s str, mmq_ir::DType, &'s [usize])>,
    ) -> Result<(), KernelError> {
        let m = self.module;
        let g = m
            .graphs
            .get(graph)
            .ok_or_else(|| KernelError::Module(format!("no graph {graph:?}")))?;
        let mut bound: HashMap<Sym, i64> = HashMap::new();
        for (name, dtype, shape) in given {
            let Some(&v) = g
                .inputs
                .iter()
                .find(|&&v| m.values[v].name.as_deref() == Some(name))
            else {
                return Err(self.not_an_input(graph, name));
            };
            let ty = m.value_type(v);
            if ty.as_tensor().is_some() {
                self.check_tensor_type(name, ty, dtype, shape, &mut bound)?;
            }
        }
        self.check_ranges(&bound)
    }

    /// `name` given for `graph`, which has no input of that name.
    fn not_an_input(&self, graph: GraphId, name: &str) -> KernelError {
        let (m, g) = (self.module, &self.module.graphs[graph]);
        let expected: Vec<String> = g
            .inputs
            .iter()
            .filter_map(|&v| m.values[v].name.clone())
            .collect();
        KernelError::Input {
            name: name.to_owned(),
            message: format!(
                "not an input of graph '{}' (inputs: {})",
                g.name,
                expected.join(", ")
            ),
        }
    }

    /// Checks a tensor's element type and shape against the tensor type `ty`, binding its
    /// symbols in `bound`.
    fn check_tensor_type(
        &self,
        name: &str,
        ty: &Type,
        dtype: mmq_ir::DType,
        shape: &[usize],
        bound: &mut HashMap<Sym, i64>,
    ) -> Result<(), KernelError> {
        let Some(tt) = ty.as_tensor() else {
            return Ok(());
        };
        let expected = || self.describe(ty);
        let mismatch = |what: String| KernelError::Input {
            name: name.into(),
            message: format!("{what}; expected {}, got {dtype}{shape:?}", expected()),
        };
        if let Some(d) = tt.dtype
            && d != dtype
        {
            return Err(mismatch(format!("dtype {dtype} instead of {d}")));
        }
        let Some(dims) = &tt.shape else { return Ok(()) };
        if dims.len() != shape.len() {
            return Err(mismatch(format!(
                "rank {} instead of {}",
                shape.len(),
                dims.len()
            )));
        }
        // Bind plain symbols first, then check every expression.
        for (i, d) in dims.iter().enumerate() {
            if let Some(s) = d.expr().and_then(|e| e.as_sym()) {
                let actual = shape[i] as i64;
                match bound.insert(s, actual) {
                    Some(prev) if prev != actual => {
                        return Err(mismatch(format!(
                            "dim {i} ('{}') is {actual} but another input bound it to {prev}",
                            self.module.symbols[s].name
                        )));
                    }
                    _ => {}
                }
            }
        }
        for (i, d) in dims.iter().enumerate() {
            if let Dim::Expr(e) = d
                && let Some(v) = e.eval(&|s| bound.get(&s).copied())
                && v != shape[i] as i64
            {
                return Err(mismatch(format!("dim {i} is {} but must be {v}", shape[i])));
            }
        }
        Ok(())
    }

    fn check_ranges(&self, bound: &HashMap<Sym, i64>) -> Result<(), KernelError> {
        let mut syms: Vec<_> = bound.iter().collect();
        syms.sort();
        for (&s, &v) in syms {
            let data = &self.module.symbols[s];
            if let Some(e) = &data.equals
                && let Some(want) = e.eval(&|x| bound.get(&x).copied())
                && want != v
            {
                let name = |x: Sym| self.module.symbols[x].name.clone();
                return Err(KernelError::Input {
                    name: data.name.clone(),
                    message: format!(
                        "symbol '{}' = {v}, but the model declares it equal to {} = {want}",
                        data.name,
                        e.render(&name)
                    ),
                });
            }
            if data.min.is_some_and(|lo| v < lo) || data.max.is_some_and(|hi| v > hi) {
                return Err(KernelError::Input {
                    name: data.name.clone(),
                    message: format!(
                        "symbol '{}' = {v} is outside its range [{}, {}]",
                        data.name,
                        data.min.map_or("-".into(), |x| x.to_string()),
                        data.max.map_or("-".into(), |x| x.to_string())
                    ),
                });
            }
        }
        Ok(())
    }

    /// Runs `graph` with positional inputs (`None`: use the input's default initializer) in the
    /// scope `outer`, returning its outputs in order.
    pub fn run_graph(
        &self,
        graph: GraphId,
        inputs: Vec<Option<RtValue>>,
        outer: &Env<'_>,
    ) -> Result<Vec<RtValue>, KernelError> {
        let m = self.module;
        let g = &m.graphs[graph];
        if inputs.len() > g.inputs.len() {
            return Err(KernelError::Module(format!(
                "graph '{}' takes {} inputs, got {}",
                g.name,
                g.inputs.len(),
                inputs.len()
            )));
        }
        let mut env = Env {
            vals: HashMap::new(),
            parent: Some(outer),
            syms: HashMap::new(),
        };
        let mut inputs = inputs;
        inputs.resize(g.inputs.len(), None);
        for (&v, val) in g.inputs.iter().zip(inputs) {
            let val = match (val, m.values[v].def) {
                (Some(val), _) => val,
                (
                    None,
                    ValueDef::Input {
                        default: Some(c), ..
                    },
                ) => RtValue::Tensor(self.constant(c)?),
                (None, _) => RtValue::Optional(None),
            };
            self.track(val.byte_size() as isize);
            env.vals.insert(v, val);
        }
        let plan = self.plan(graph);
        // `Mul`s whose result a fused node already computed.
        let mut done: HashSet<usize> = HashSet::new();
        for (i, &n) in g.nodes().iter().enumerate() {
            let node = &m.nodes[n];
            if done.remove(&i) {
                self.free_after(&plan, i, node, &mut env);
                continue;
            }
            if let Some(f) = plan.swish.get(&i)
                && !plan.constant[i]
            {
                let start = self.stats.as_ref().map(|_| Instant::now());
                if let Some(y) = self.swish(f, &mut env) {
                    self.record(start, "Sigmoid·Mul (fused)");
                    self.track(y.byte_size() as isize);
                    env.vals.insert(f.y, y);
                    done.insert(f.mul);
                    self.free_after(&plan, i, node, &mut env);
                    continue;
                }
            }
            let args = node
                .inputs
                .iter()
                .map(|o| o.map(|v| self.value(v, &env)).transpose())
                .collect::<Result<Vec<_>, _>>()?;
            let cx = OpCtx {
                interp: self,
                node,
                opset: plan.opset,
                env: &env,
            };
            let folded = if plan.constant[i] {
                self.folded_results(node)
            } else {
                None
            };
            let outs = match folded {
                Some(outs) => outs,
                None => {
                    check_results(&cx, &args)?;
                    let start = self.stats.as_ref().map(|_| Instant::now());
                    let outs = ops::eval(&cx, &args)?;
                    self.record(start, node.op.op_type());
                    if plan.constant[i] {
                        self.keep_folded(node, &outs);
                    }
                    outs
                }
            };
            drop(args);
            for (slot, out) in node.outputs.iter().zip(outs) {
                if let (Some(v), Some(val)) = (slot, out) {
                    self.track(val.byte_size() as isize);
                    env.vals.insert(*v, val);
                }
            }
            self.free_after(&plan, i, node, &mut env);
        }
        let outs = g
            .outputs
            .iter()
            .map(|&v| self.value(v, &env))
            .collect::<Result<Vec<_>, _>>()?;
        for val in env.vals.values() {
            self.track(-(val.byte_size() as isize));
        }
        Ok(outs)
    }

    /// Evaluates one node of the module on the given operands (`None`: omitted optional
    /// operand), outside any graph activation: the node's subgraphs, if any, see no outer-scope
    /// values. Returns one entry per declared result (`None` where the kernel produced none).
    /// Constant folding uses this.
    pub fn eval_node(
        &self,
        node: Node,
        inputs: Vec<Option<RtValue>>,
    ) -> Result<Vec<Option<RtValue>>, KernelError> {
        let m = self.module;
        let data = m
            .nodes
            .get(node)
            .ok_or_else(|| KernelError::Module(format!("node {node:?} does not exist")))?;
        if m.graphs.get(data.graph).is_none() {
            return Err(KernelError::Module(format!(
                "node {node:?} belongs to no graph"
            )));
        }
        let env = Env {
            vals: HashMap::new(),
            parent: None,
            syms: HashMap::new(),
        };
        let cx = OpCtx {
            interp: self,
            node: data,
            opset: m.onnx_opset(data.graph).unwrap_or(23),
            env: &env,
        };
        check_results(&cx, &inputs)?;
        let mut outs = ops::eval(&cx, &inputs)?;
        outs.resize(data.outputs.len(), None);
        Ok(outs)
    }

    /// Frees what the node at position `i` was the last user of, and its results nobody uses.
    fn free_after(&self, plan: &Plan, i: usize, node: &mmq_ir::NodeData, env: &mut Env<'_>) {
        let dead = node
            .outputs
            .iter()
            .flatten()
            .filter(|v| !plan.used.contains(v));
        for v in plan.last_use.get(&i).into_iter().flatten().chain(dead) {
            if !plan.keep.contains(v)
                && let Some(val) = env.vals.remove(v)
            {
                self.track(-(val.byte_size() as isize));
            }
        }
    }

    /// Adds the time since `start` to `op`'s entry of the statistics.
    fn record(&self, start: Option<Instant>, op: &str) {
        if let (Some(stats), Some(start)) = (&self.stats, start)
            && let Ok(mut s) = stats.lock()
        {
            let e = s.per_op.entry(op.to_owned()).or_default();
            e.0 += 1;
            e.1 += start.elapsed();
        }
    }

    /// `x · σ(x)` for a local `f32` tensor `x` (in `x`'s buffer when nothing else holds it);
    /// `None` for anything else, which the two nodes then compute one after the other.
    fn swish(&self, f: &Swish, env: &mut Env<'_>) -> Option<RtValue> {
        let t = env.vals.get(&f.x)?.as_tensor()?;
        if !matches!(t.data, Data::F32(_)) {
            return None;
        }
        let silu = |v: f32| v * crate::vmath::sigmoid(v);
        if f.consume
            && let Some(RtValue::Tensor(t)) = env.vals.remove(&f.x)
        {
            match Arc::try_unwrap(t) {
                Ok(mut t) => {
                    self.track(-(t.byte_size() as isize));
                    if let Data::F32(v) = &mut t.data {
                        crate::vmath::map_in_place(v, silu);
                    }
                    return Some(RtValue::Tensor(Arc::new(t)));
                }
                Err(t) => {
                    env.vals.insert(f.x, RtValue::Tensor(t));
                }
            }
        }
        let t = env.vals.get(&f.x)?.as_tensor()?;
        let Data::F32(v) = &t.data else { return None };
        let y = Tensor::new(
            t.dtype,
            t.shape.clone(),
            Data::F32(crate::vmath::map_vec(v, silu)),
        )
        .ok()?;
        Some(RtValue::Tensor(Arc::new(y)))
    }

    fn plan(&self, graph: GraphId) -> Arc<Plan> {
        if let Some(p) = self.plans.lock().ok().and_then(|p| p.get(&graph).cloned()) {
            return p;
        }
        let m = self.module;
        let (last_use, used) = last_uses(m, graph);
        let plan = Arc::new(Plan {
            last_use,
            used,
            keep: m.graphs[graph].outputs.iter().copied().collect(),
            opset: m.onnx_opset(graph).unwrap_or(23),
            constant: constant_nodes(m, graph),
            swish: swish_pairs(m, graph),
        });
        if let Ok(mut p) = self.plans.lock() {
            p.insert(graph, plan.clone());
        }
        plan
    }

    fn track(&self, delta: isize) {
        if let Some(stats) = &self.stats
            && let Ok(mut live) = self.live_bytes.lock()
        {
            *live = live.saturating_add_signed(delta);
            if let Ok(mut s) = stats.lock() {
                s.peak_live_bytes = s.peak_live_bytes.max(*live);
            }
        }
    }

    /// The kept results of constant node `node`, when every one was kept.
    fn folded_results(&self, node: &mmq_ir::NodeData) -> Option<Vec<Option<RtValue>>> {
        let folded = self.folded.lock().ok()?;
        node.outputs
            .iter()
            .map(|o| match o {
                Some(v) => folded.0.get(v).cloned().map(Some),
                None => Some(None),
            })
            .collect()
    }

    /// Keeps the results of constant node `node` for later runs, within [`FOLD_MAX_BYTES`]
    /// each and [`FOLD_CACHE_BYTES`] in all.
    fn keep_folded(&self, node: &mmq_ir::NodeData, outs: &[Option<RtValue>]) {
        let bytes: Vec<usize> = outs
            .iter()
            .map(|o| o.as_ref().map_or(0, RtValue::byte_size))
            .collect();
        let total: usize = bytes.iter().sum();
        if bytes.iter().any(|&b| b > FOLD_MAX_BYTES) {
            return;
        }
        let Ok(mut folded) = self.folded.lock() else {
            return;
        };
        if folded.1 + total > FOLD_CACHE_BYTES {
            return;
        }
        folded.1 += total;
        for (slot, out) in node.outputs.iter().zip(outs) {
            if let (Some(v), Some(val)) = (slot, out) {
                folded.0.insert(*v, val.clone());
            }
        }
    }

    fn value(&self, v: Value, env: &Env<'_>) -> Result<RtValue, KernelError> {
        if let ValueDef::Const(c) = self.module.values[v].def {
            return Ok(RtValue::Tensor(self.constant(c)?));
        }
        env.lookup(v).cloned().ok_or_else(|| {
            let name = self.module.values[v]
                .name
                .clone()
                .unwrap_or_else(|| format!("{v:?}"));
            KernelError::Module(format!("value '{name}' is used before it is computed"))
        })
    }
}

/// Per node of `graph`, whether it computes a constant ([`Plan::constant`]).
fn constant_nodes(m: &Module, graph: GraphId) -> Vec<bool> {
    let mut constant: HashSet<Value> = HashSet::new();
    m.graphs[graph]
        .nodes()
        .iter()
        .map(|&n| {
            let node = &m.nodes[n];
            // The random ops are not modeled: opaque (custom) nodes never fold.
            let yes = !node.op.is_custom()
                && node.op.subgraphs().is_empty()
                && node.inputs.iter().flatten().all(|v| {
                    constant.contains(v) || matches!(m.values[*v].def, ValueDef::Const(_))
                });
            if yes {
                constant.extend(node.outputs.iter().flatten().copied());
            }
            yes
        })
        .collect()
}

/// The `Sigmoid`s of `graph` whose result only a `Mul` by the `Sigmoid`'s own operand reads
/// ([`Plan::swish`]).
fn swish_pairs(m: &Module, graph: GraphId) -> HashMap<usize, Swish> {
    let nodes = &m.graphs[graph].nodes();
    let outputs: HashSet<Value> = m.graphs[graph].outputs.iter().copied().collect();
    let mut uses: HashMap<Value, Vec<usize>> = HashMap::new();
    for (i, &n) in nodes.iter().enumerate() {
        for v in uses_of(m, n) {
            uses.entry(v).or_default().push(i);
        }
    }
    let mut pairs = HashMap::new();
    for (i, &n) in nodes.iter().enumerate() {
        let node = &m.nodes[n];
        let (mmq_ir::Op::Sigmoid {}, [Some(x)], [Some(s)]) =
            (&node.op, node.inputs.as_slice(), node.outputs.as_slice())
        else {
            continue;
        };
        let (x, s) = (*x, *s);
        let Some(&[j]) = uses.get(&s).map(Vec::as_slice) else {
            continue;
        };
        let mul = &m.nodes[nodes[j]];
        let operands: Vec<Value> = mul.inputs.iter().flatten().copied().collect();
        let (mmq_ir::Op::Mul {}, [Some(y)]) = (&mul.op, mul.outputs.as_slice()) else {
            continue;
        };
        if outputs.contains(&s) || !(operands == [x, s] || operands == [s, x]) {
            continue;
        }
        let consume = !outputs.contains(&x)
            && uses
                .get(&x)
                .is_some_and(|u| u.iter().all(|&k| k == i || k == j));
        pairs.insert(
            i,
            Swish {
                x,
                mul: j,
                y: *y,
                consume,
            },
        );
    }
    pairs
}

/// For each node position in `graph`, the values whose last use it is (a use inside a node's
/// subgraphs counts as a use by that node), and the set of every value used at all.
fn last_uses(m: &Module, graph: GraphId) -> (HashMap<usize, Vec<Value>>, HashSet<Value>) {
    let mut last: HashMap<Value, usize> = HashMap::new();
    for (i, &n) in m.graphs[graph].nodes().iter().enumerate() {
        for v in uses_of(m, n) {
            last.insert(v, i);
        }
    }
    let used = last.keys().copied().collect();
    let mut by_node: HashMap<usize, Vec<Value>> = HashMap::new();
    for (v, i) in last {
        by_node.entry(i).or_default().push(v);
    }
    (by_node, used)
}

/// Every value a node reads: its operands and, through its subgraphs, outer-scope values.
fn uses_of(m: &Module, n: Node) -> Vec<Value> {
    let node = &m.nodes[n];
    let mut out: Vec<Value> = node.inputs.iter().flatten().copied().collect();
    for sub in node.op.subgraphs() {
        for g in m.graph_tree(sub) {
            for &inner in m.graphs[g].nodes() {
                out.extend(m.nodes[inner].inputs.iter().flatten().copied());
            }
            out.extend(m.graphs[g].outputs.iter().copied());
        }
    }
    out
}

/// Refuses, before running it, a node whose results have shapes too large for the memory limit
/// ([`crate::memory_limit`]): static shapes; symbolic ones evaluated with the symbols the run's
/// inputs bound (a `MatMul` of `[n, 1]` by `[1, m]` with n = m = 10^6); and where the module
/// does not know a result's shape (operands of unknown shape, a shape computed from data), the
/// node's inference rule applied to the run's concrete operands. An `Expand`, `Pad` or `OneHot`
/// to 10^12 elements is an error naming the node, not an aborted process; results that only
/// the kernel can size (a `NonZero`, a `Loop`'s scan outputs) check themselves
/// ([`OpCtx::check_result`]).
fn check_results(cx: &OpCtx<'_>, args: &[Option<RtValue>]) -> Result<(), KernelError> {
    let m = cx.interp.module();
    let what = || format!("{} result", cx.label());
    let mut unknown = false;
    for v in cx.node.outputs.iter().flatten() {
        let dims = m.value_type(*v).as_tensor().and_then(|tt| {
            let dims = tt
                .shape
                .as_ref()?
                .iter()
                .map(|d| {
                    d.as_known()
                        .or_else(|| d.expr()?.eval(&|s| cx.env.sym(s)))
                        .and_then(|k| usize::try_from(k).ok())
                })
                .collect::<Option<Vec<usize>>>()?;
            Some((tt.dtype?, dims))
        });
        match dims {
            Some((dtype, dims)) => {
                crate::tensor::check_size_with(what, dtype, &dims)?;
            }
            None => unknown = true,
        }
    }
    if !unknown || never_grows(&cx.node.op) {
        return Ok(());
    }
    let (types, vals) = run_operands(args);
    let operands = mmq_ir::infer::Operands {
        types: &types,
        vals: &vals,
    };
    for ty in mmq_ir::infer::infer_node_types(m, cx.node, cx.opset, &operands) {
        if let Some(tt) = ty.as_tensor()
            && let (Some(dtype), Some(shape)) = (tt.dtype, &tt.shape)
            && let Some(dims) = shape
                .iter()
                .map(|d| d.as_known().and_then(|k| usize::try_from(k).ok()))
                .collect::<Option<Vec<usize>>>()
        {
            crate::tensor::check_size_with(what, dtype, &dims)?;
        }
    }
    Ok(())
}

/// Whether every result of `op` is at most as large as its first operand, so that sizing it
/// from the operands can be skipped: layout ops, slices, shapes and unary elementwise math that
/// keeps the element type.
fn never_grows(op: &mmq_ir::Op) -> bool {
    use mmq_ir::Op;
    match op {
        Op::Cast { .. } | Op::CastLike { .. } => false,
        Op::Slice { .. } | Op::Shape { .. } | Op::Size { .. } => true,
        op => {
            op.is_layout() || (op.is_elementwise() && op.arity().is_some_and(|a| a.max_inputs == 1))
        }
    }
}

/// The types of a run's operands (concrete shapes) and the contents of its small integer
/// operands, for [`mmq_ir::infer::infer_node_types`].
fn run_operands(args: &[Option<RtValue>]) -> (Vec<Type>, Vec<Option<Vec<Dim>>>) {
    args.iter()
        .map(|a| match a {
            Some(RtValue::Tensor(t)) => {
                let shape = t
                    .shape
                    .iter()
                    .map(|&d| i64::try_from(d).map_or(Dim::Unknown, Dim::known))
                    .collect();
                let small = t.rank() <= 1 && t.len() <= mmq_ir::infer::MAX_SHAPE_VALUE_LEN;
                let vals = match &t.data {
                    Data::I64(v) if small => Some(v.iter().map(|&x| Dim::known(x)).collect()),
                    Data::I32(v) if small => {
                        Some(v.iter().map(|&x| Dim::known(i64::from(x))).collect())
                    }
                    _ => None,
                };
                (Type::tensor(t.dtype, shape), vals)
            }
            _ => (Type::Unknown, None),
        })
        .unzip()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::Interpreter;
    use crate::tensor::{Data, RtValue, Tensor};
    use mmq_ir::DType;

    /// A subexpression of constants runs once per interpreter; what depends on the inputs runs
    /// every time, and the results are those of a fresh interpreter.
    #[test]
    fn constant_subexpressions_run_once() {
        let src = "const $a : f32[2] = dense<[1.0, 2.0]>\nconst $b : f32[2] = dense<[0.5, 0.25]>\n\ngraph @g(%x: f32[2]) -> (f32[2]) {\n  %c = Add($a, $b) : f32[2]\n  %d = Neg(%c) : f32[2]\n  %y = Mul(%x, %d) : f32[2]\n  return %y\n}\n";
        let (m, _) = mmq_ir::text::parse(src).expect("parses");
        let g = m.entries[0].graph;
        let inputs = |x: [f32; 2]| -> HashMap<String, RtValue> {
            let t = Tensor::new(DType::F32, vec![2], Data::F32(x.to_vec())).expect("tensor");
            [("x".to_owned(), t.into())].into_iter().collect()
        };
        let y = |outs: Vec<(String, RtValue)>| match &outs[0].1.as_tensor().expect("tensor").data {
            Data::F32(v) => v.clone(),
            d => panic!("{d:?}"),
        };
        let it = Interpreter::new(&m).with_stats();
        assert_eq!(
            y(it.run(g, &inputs([1.0, 1.0])).expect("runs")),
            [-1.5, -2.25]
        );
        assert_eq!(
            y(it.run(g, &inputs([2.0, -1.0])).expect("runs")),
            [-3.0, 2.25]
        );
        let fresh = Interpreter::new(&m)
            .run(g, &inputs([2.0, -1.0]))
            .expect("runs");
        assert_eq!(y(fresh), [-3.0, 2.25]);
        let stats = it.stats().expect("stats");
        let calls = |op: &str| stats.per_op.get(op).map_or(0, |e| e.0);
        assert_eq!((calls("Add"), calls("Neg"), calls("Mul")), (1, 1, 2));
    }

    /// `Mul(x, Sigmoid(x))` runs as one pass with the two nodes' results, bit for bit: in `x`'s
    /// buffer when nothing else reads `x`, into a new one when something does (and `x` is left
    /// as it was), and not at all when the `Sigmoid`'s result is itself an output or the
    /// operands are not `f32`.
    #[test]
    fn sigmoid_times_operand_runs_fused() {
        let src = "graph @g(%x: f32[7], %h: f16[2]) -> (f32[7], f32[7], f32[7], f32[7], f16[2]) {\n  %a = Neg(%x) : f32[7]\n  %sa = Sigmoid(%a) : f32[7]\n  %ya = Mul(%sa, %a) : f32[7]\n  %b = Abs(%x) : f32[7]\n  %sb = Sigmoid(%b) : f32[7]\n  %yb = Mul(%b, %sb) : f32[7]\n  %zb = Add(%b, %yb) : f32[7]\n  %sx = Sigmoid(%x) : f32[7]\n  %yx = Mul(%x, %sx) : f32[7]\n  %sh = Sigmoid(%h) : f16[2]\n  %yh = Mul(%h, %sh) : f16[2]\n  return %ya, %zb, %yx, %sx, %yh\n}\n";
        let (m, _) = mmq_ir::text::parse(src).expect("parses");
        let g = m.entries[0].graph;
        let x = [-30.0f32, -2.5, -0.0, 0.1, 1.0, 7.25, 90.0];
        let h = [half::f16::from_f32(-1.5), half::f16::from_f32(2.0)];
        let inputs: HashMap<String, RtValue> = [
            (
                "x".to_owned(),
                Tensor::new(DType::F32, vec![7], Data::F32(x.to_vec()))
                    .expect("tensor")
                    .into(),
            ),
            (
                "h".to_owned(),
                Tensor::new(DType::F16, vec![2], Data::F16(h.to_vec()))
                    .expect("tensor")
                    .into(),
            ),
        ]
        .into_iter()
        .collect();
        let it = Interpreter::new(&m).with_stats();
        let outs = it.run(g, &inputs).expect("runs");
        let f32s = |i: usize| match &outs[i].1.as_tensor().expect("tensor").data {
            Data::F32(v) => v.clone(),
            d => panic!("{d:?}"),
        };
        let silu = |v: f32| v * crate::vmath::sigmoid(v);
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        let want_a: Vec<f32> = x.iter().map(|&v| silu(-v)).collect();
        let want_zb: Vec<f32> = x.iter().map(|&v| v.abs() + silu(v.abs())).collect();
        let want_x: Vec<f32> = x.iter().map(|&v| silu(v)).collect();
        assert_eq!(bits(f32s(0)), bits(want_a));
        assert_eq!(bits(f32s(1)), bits(want_zb));
        assert_eq!(bits(f32s(2)), bits(want_x));
        let sx: Vec<f32> = x.iter().map(|&v| crate::vmath::sigmoid(v)).collect();
        assert_eq!(bits(f32s(3)), bits(sx));
        let Data::F16(yh) = &outs[4].1.as_tensor().expect("tensor").data else {
            panic!("f16 result");
        };
        let want_h: Vec<f32> = h
            .iter()
            .map(|&v| {
                let s = half::f16::from_f32(crate::vmath::sigmoid(v.to_f32()));
                (v * s).to_f32()
            })
            .collect();
        assert_eq!(yh.iter().map(|v| v.to_f32()).collect::<Vec<_>>(), want_h);
        let stats = it.stats().expect("stats");
        let calls = |op: &str| stats.per_op.get(op).map_or(0, |e| e.0);
        assert_eq!(
            (calls("Sigmoid·Mul (fused)"), calls("Sigmoid"), calls("Mul")),
            (2, 2, 2)
        );
    }

    /// A symbol the model declares equal to an expression is checked once its inputs bind both.
    #[test]
    fn symbol_equalities_are_checked_on_the_inputs() {
        let src = "sym past\nsym seq\nsym total\nassume total = past + seq\n\ngraph @g(%m: f32[total], %p: f32[past], %s: f32[seq]) -> (f32[past + seq]) {\n  %c = Concat(%p, %s) {axis = 0} : f32[past + seq]\n  %y = Add(%m, %c) : f32[past + seq]\n  return %y\n}\n";
        let (m, _) = mmq_ir::text::parse(src).expect("parses");
        let g = m.entries[0].graph;
        let t = |n: usize| -> RtValue {
            Tensor::new(DType::F32, vec![n], Data::F32(vec![1.0; n]))
                .expect("tensor")
                .into()
        };
        let inputs = |total| -> HashMap<String, RtValue> {
            [("m", t(total)), ("p", t(2)), ("s", t(3))]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect()
        };
        let ok = Interpreter::new(&m).run(g, &inputs(5)).expect("runs");
        assert_eq!(ok[0].1.as_tensor().expect("tensor").shape, vec![5]);
        let err = Interpreter::new(&m)
            .run(g, &inputs(6))
            .expect_err("total = 6 but past + seq = 5")
            .to_string();
        assert!(
            err.contains("'total' = 6, but the model declares it equal to past + seq = 5"),
            "{err}"
        );
    }
}
