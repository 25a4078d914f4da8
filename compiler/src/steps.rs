//! The quantization passes of a compilation: each calibrates on the current module when it runs,
//! then quantizes, so they sit in the same pass manager as the optimization passes (timed,
//! dumped and verified like them).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use mmq_ir::modality::{Labels, Modality};
use mmq_ir::{DType, GraphId, Module, Node, Op, Value};
use mmq_passes::quant::auto::{self, AutoError, Candidate, Choice, Reference};
use mmq_passes::quant::calibrate::{self, CalibError, ChannelStats, Observer, Ranges, Sample};
use mmq_passes::quant::fp16::Fp16Pass;
use mmq_passes::quant::int8::{ActGranularity, Int8Pass, Int8Scheme, NodeFilter};
use mmq_passes::quant::place::Placement;
use mmq_passes::quant::precision::{Granularity, NodePlan, Plan, PrecisionMap, Scheme, Settings};
use mmq_passes::quant::smooth::Site;
use mmq_passes::quant::weight_only::{WeightOnlyConfig, WeightOnlyPass, WeightScheme};
use mmq_passes::{Pass, PassError, PassManager, PassOptions, PassReport};

use crate::calibration::{CalibrationSource, Samples};
use crate::options::{Int4Options, ObserverChoice, Progress, ProgressFn};

/// What the quantization passes share: the samples, the observer, the progress callback, and
/// where `--auto` leaves its choice.
pub(crate) struct Context {
    pub calibration: CalibrationSource,
    /// `Measured` (`--observer auto`) applies to INT8 ([`Context::measure_observers`]).
    pub observer: ObserverChoice,
    pub placement: Placement,
    pub int4: Int4Options,
    pub granularity: ActGranularity,
    pub skip_non_finite: bool,
    pub modality: Vec<(String, Modality)>,
    pub progress: Option<ProgressFn>,
    pub main_output: Option<String>,
    pub interrupt: Option<mmq_passes::Interrupt>,
    pub auto: Mutex<Option<AutoOutcome>>,
}

/// What `--auto` chose.
#[derive(Clone, Debug, serde::Serialize)]
pub struct AutoOutcome {
    /// The chosen precision map as TOML (it parses back to the map the model was compiled with).
    pub map: String,
    /// The target cosine.
    pub target: f64,
    /// The cosine the search reached on the calibration samples.
    pub searched_cosine: f64,
    /// The compiled model's cosine measured the same way.
    pub compiled_cosine: f64,
    /// The compiled model's cosine on the samples kept from the search (a quarter of them,
    /// from 4 samples on); `None` with fewer.
    pub held_back_cosine: Option<f64>,
    /// How many samples were kept from the search.
    pub held_back_samples: usize,
}

type Shared = Arc<Context>;

fn failed(pass: &str, message: impl std::fmt::Display) -> PassError {
    PassError::Failed {
        pass: pass.to_owned(),
        message: message.to_string(),
    }
}

/// The single entry graph (calibration runs one model at a time).
fn one_graph(m: &Module, pass: &str, what: &str) -> Result<GraphId, PassError> {
    match m.entries.as_slice() {
        [e] => Ok(e.graph),
        [] => Err(failed(pass, "the module has no graph")),
        _ => Err(failed(
            pass,
            format!("{what} one model at a time; compile the files separately"),
        )),
    }
}

impl Context {
    /// Pass `pass` failed calibrating `graph`: `e` pointing at the data
    /// ([`CalibrationSource::explain`]).
    fn calib_failed(&self, pass: &str, m: &Module, graph: GraphId, e: &CalibError) -> PassError {
        let why = self.calibration.explain(m, graph, e);
        failed(pass, format!("calibration: {why}"))
    }

    /// The samples for `graph`, reporting progress as they are consumed.
    fn samples<'m>(&'m self, m: &'m Module, graph: GraphId) -> Result<Samples<'m>, CalibError> {
        let mut inner = self.calibration.samples(m, graph)?;
        if let Some(stop) = self.interrupt.clone() {
            // Each sample is taken only while no stop is asked for.
            let mut asked = false;
            inner = Box::new(std::iter::from_fn(move || {
                if asked {
                    None
                } else if stop.is_set() {
                    asked = true;
                    Some(Err(CalibError::Interrupted))
                } else {
                    inner.next()
                }
            }));
        }
        Ok(match &self.progress {
            None => inner,
            Some(p) => {
                p(Progress::Start {
                    what: "calibrating",
                    total: self.calibration.len_hint(),
                });
                let p = Arc::clone(p);
                Box::new(Tracked {
                    inner,
                    progress: p,
                    finished: false,
                })
            }
        })
    }

    /// Every sample, in memory (for passes that read them several times).
    fn all_samples(&self, m: &Module, graph: GraphId) -> Result<Vec<Sample>, CalibError> {
        self.samples(m, graph)?.collect()
    }

    /// The ranges of `values` under `observer`.
    fn ranges(
        &self,
        m: &Module,
        graph: GraphId,
        values: &[Value],
        observer: Observer,
    ) -> Result<Ranges, CalibError> {
        calibrate::calibrate(m, graph, values, self.samples(m, graph)?, observer)
    }

    /// Per-channel statistics of the activations `sites` read.
    fn site_stats(
        &self,
        m: &Module,
        pass: &str,
        sites: &[Site],
        max_rows: usize,
    ) -> Result<HashMap<Value, ChannelStats>, PassError> {
        let graph = one_graph(m, pass, &format!("--{pass} calibrates"))?;
        let values: Vec<Value> = sites.iter().map(|s| s.x).collect();
        if values.is_empty() {
            return Ok(HashMap::new());
        }
        let calib = |e: CalibError| self.calib_failed(pass, m, graph, &e);
        let samples = self.samples(m, graph).map_err(calib)?;
        calibrate::channel_stats(m, graph, &values, samples, max_rows).map_err(calib)
    }
}

/// Samples that report each one consumed, and the end (once: when the samples run out, or when
/// the consumer stops early).
struct Tracked<'m> {
    inner: Samples<'m>,
    progress: ProgressFn,
    finished: bool,
}

impl Tracked<'_> {
    fn finish(&mut self) {
        if !std::mem::replace(&mut self.finished, true) {
            (self.progress)(Progress::Finish);
        }
    }
}

impl Iterator for Tracked<'_> {
    type Item = Result<Sample, CalibError>;

    fn next(&mut self) -> Option<Self::Item> {
        let next = self.inner.next();
        match next {
            Some(_) => (self.progress)(Progress::Advance),
            None => self.finish(),
        }
        next
    }
}

impl Drop for Tracked<'_> {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Runs `pass` and puts `notes` before its own.
fn run_with_notes(
    pass: &dyn Pass,
    m: &mut Module,
    opts: &PassOptions,
    notes: Vec<String>,
) -> Result<PassReport, PassError> {
    let mut report = pass.run(m, opts)?;
    report.notes.splice(0..0, notes);
    Ok(report)
}

impl Context {
    /// `--observer auto`: the observer of [`ObserverChoice::MEASURED`] whose INT8 model (every
    /// eligible node, placed as asked) measures best on `samples`: ranges from their first three
    /// quarters (all of them below 4), the main output's cosine against FP32 on the last quarter
    /// (else on all). A note gives each figure.
    fn measure_observers(
        &self,
        m: &Module,
        graph: GraphId,
        pass: &str,
        samples: &[Sample],
        opts: &PassOptions,
        notes: &mut Vec<String>,
    ) -> Result<Observer, PassError> {
        let calib = |e: CalibError| self.calib_failed(pass, m, graph, &e);
        let held = if samples.len() >= 4 {
            samples.len() / 4
        } else {
            0
        };
        let (fit, judge) = samples.split_at(samples.len() - held);
        let judge = if judge.is_empty() { fit } else { judge };
        let values: Vec<Value> = Int8Pass::activations(m, None)
            .into_iter()
            .flat_map(|(_, v)| v)
            .collect();
        let observers = ObserverChoice::MEASURED;
        let each =
            calibrate::calibrate_each(m, graph, &values, fit.iter().cloned().map(Ok), &observers)
                .map_err(calib)?;
        let reference = Reference::new(m, graph, judge, self.main_output.as_deref())
            .map_err(|e| failed(pass, e))?;
        let mut best: Option<(Observer, f64)> = None;
        let mut figures = Vec::new();
        for (observer, ranges) in observers.into_iter().zip(each) {
            let mut q = m.clone();
            let mut int8 = Int8Pass::new(Int8Scheme::Static {
                ranges,
                symmetric: opts.target.qdq_rules().symmetric_activations,
            })
            .with_placement(self.placement)
            .with_granularity(self.granularity);
            if let Some(f) = self.finite_filter(m, &mut Vec::new()) {
                int8 = int8.with_filter(f);
            }
            int8.run(&mut q, opts)?;
            let cosine = reference.cosine(&q, judge).map_err(|e| failed(pass, e))?;
            figures.push(format!("{observer} {cosine:.6}"));
            if best.is_none_or(|(_, b)| cosine > b) {
                best = Some((observer, cosine));
            }
        }
        let chosen = best.map_or(Observer::MinMax, |(o, _)| o);
        notes.push(format!(
            "observer auto: cosine of '{}' on {} sample(s){}: {}; chose {chosen}",
            reference.output(),
            judge.len(),
            if held > 0 {
                " kept from the ranges"
            } else {
                " (too few to keep some from the ranges)"
            },
            figures.join(", ")
        ));
        Ok(chosen)
    }
}

/// `--quant int8` (calibrated) and `--quant int8-dynamic`.
pub(crate) struct Int8Step {
    pub ctx: Shared,
    pub dynamic: bool,
}

impl Pass for Int8Step {
    fn name(&self) -> &str {
        if self.dynamic { "int8-dynamic" } else { "int8" }
    }

    fn run(&self, m: &mut Module, opts: &PassOptions) -> Result<PassReport, PassError> {
        let mut notes = Vec::new();
        let scheme = if self.dynamic {
            Int8Scheme::Dynamic
        } else {
            let acts = Int8Pass::activations(m, None);
            let graph = one_graph(m, self.name(), "--quant int8 calibrates")?;
            let calib = |e: CalibError| self.ctx.calib_failed(self.name(), m, graph, &e);
            let values: Vec<Value> = acts.into_iter().flat_map(|(_, v)| v).collect();
            let (observer, ranges) = match self.ctx.observer {
                ObserverChoice::Fixed(observer) => (
                    observer,
                    self.ctx
                        .ranges(m, graph, &values, observer)
                        .map_err(calib)?,
                ),
                // The samples are read once: the comparison and the calibration share them.
                ObserverChoice::Measured => {
                    let samples = self.ctx.all_samples(m, graph).map_err(calib)?;
                    let observer = self.ctx.measure_observers(
                        m,
                        graph,
                        self.name(),
                        &samples,
                        opts,
                        &mut notes,
                    )?;
                    let samples = samples.into_iter().map(Ok);
                    let ranges = calibrate::calibrate(m, graph, &values, samples, observer)
                        .map_err(calib)?;
                    (observer, ranges)
                }
            };
            notes.push(format!(
                "calibrated {} activations on {} samples ({observer})",
                ranges.len(),
                ranges.samples,
            ));
            Int8Scheme::Static {
                ranges,
                symmetric: opts.target.qdq_rules().symmetric_activations,
            }
        };
        let mut pass = Int8Pass::new(scheme)
            .with_placement(self.ctx.placement)
            .with_granularity(self.ctx.granularity);
        if let Some(f) = self.ctx.finite_filter(m, &mut notes) {
            pass = pass.with_filter(f);
        }
        run_with_notes(&pass, m, opts, notes)
    }
}

impl Context {
    /// With `--skip-non-finite`: a filter leaving out the nodes whose constant float operands
    /// hold NaN or an infinity, with a warning per node in `notes`; `None` otherwise (the passes
    /// then refuse such weights).
    fn finite_filter(&self, m: &Module, notes: &mut Vec<String>) -> Option<NodeFilter> {
        if !self.skip_non_finite {
            return None;
        }
        let mut skipped = std::collections::HashSet::new();
        for e in &m.entries {
            for g in m.graph_tree(e.graph) {
                for &n in m.graphs[g].nodes() {
                    let nd = &m.nodes[n];
                    if !matches!(
                        nd.op,
                        Op::MatMul {}
                            | Op::Gemm { .. }
                            | Op::Conv { .. }
                            | Op::ConvTranspose { .. }
                    ) {
                        continue;
                    }
                    for &v in nd.inputs.iter().flatten() {
                        let Some(c) = m.const_source(v) else {
                            continue;
                        };
                        let data = &m.consts[c];
                        if data.dtype != DType::F32 {
                            continue;
                        }
                        let bad = mmq_kernels::Tensor::from_const(data)
                            .and_then(|t| t.to_f32())
                            .map(|xs| xs.iter().position(|x| !x.is_finite()).map(|i| (i, xs[i])));
                        if let Ok(Some((i, x))) = bad {
                            notes.push(format!(
                                "warning: node '{}': weight '{}' holds {x} at element {i}; the \
                                 node stays in float (--skip-non-finite)",
                                nd.name.as_deref().unwrap_or("<unnamed>"),
                                data.name.as_deref().unwrap_or("<unnamed>"),
                            ));
                            skipped.insert(n);
                            break;
                        }
                    }
                }
            }
        }
        Some(Box::new(move |_: &Module, n| !skipped.contains(&n)))
    }
}

/// `--smoothquant ALPHA`: per-channel activation maxima, then SmoothQuant.
pub(crate) struct SmoothStep {
    pub ctx: Shared,
    pub alpha: f32,
}

impl Pass for SmoothStep {
    fn name(&self) -> &str {
        "smoothquant"
    }

    fn run(&self, m: &mut Module, opts: &PassOptions) -> Result<PassReport, PassError> {
        use mmq_passes::quant::smooth::{self, SmoothQuantPass};
        let sites = smooth::sites(m);
        let stats = self.ctx.site_stats(m, self.name(), &sites, 0)?;
        SmoothQuantPass::new(self.alpha, stats).run(m, opts)
    }
}

/// The INT4 settings for `target`: the options' `accuracy_level`, else the target's (0: none).
fn int4_config(int4: Int4Options, target: &dyn mmq_passes::targets::Target) -> WeightOnlyConfig {
    WeightOnlyConfig {
        scheme: WeightScheme::Int4,
        block_size: int4.block,
        symmetric: int4.symmetric,
        accuracy_level: int4
            .accuracy_level
            .or_else(|| target.int4_accuracy_level())
            .filter(|&l| l != 0),
        ..WeightOnlyConfig::default()
    }
}

/// `--awq`: activation statistics and row samples, then the AWQ scales.
pub(crate) struct AwqStep {
    pub ctx: Shared,
}

impl Pass for AwqStep {
    fn name(&self) -> &str {
        "awq"
    }

    fn run(&self, m: &mut Module, opts: &PassOptions) -> Result<PassReport, PassError> {
        use mmq_passes::quant::awq::{self, AwqPass, MAX_ROWS};
        let sites = awq::sites(m);
        let stats = self.ctx.site_stats(m, self.name(), &sites, MAX_ROWS)?;
        AwqPass::new(int4_config(self.ctx.int4, &*opts.target), stats).run(m, opts)
    }
}

/// `--quant int4` and `--quant fp8` (FP8 activations too when samples were named).
pub(crate) struct WeightOnlyStep {
    pub ctx: Shared,
    pub fp8: bool,
    name: &'static str,
}

impl WeightOnlyStep {
    pub fn new(ctx: Shared, fp8: bool) -> Self {
        WeightOnlyStep {
            ctx,
            fp8,
            name: if fp8 { "quant-fp8" } else { "quant-int4" },
        }
    }
}

impl Pass for WeightOnlyStep {
    fn name(&self) -> &str {
        self.name
    }

    fn run(&self, m: &mut Module, opts: &PassOptions) -> Result<PassReport, PassError> {
        let mut notes = Vec::new();
        let mut pass = if self.fp8 {
            WeightOnlyPass::new(WeightOnlyConfig {
                scheme: WeightScheme::Fp8,
                ..WeightOnlyConfig::default()
            })
        } else {
            WeightOnlyPass::new(int4_config(self.ctx.int4, &*opts.target))
                .with_placement(self.ctx.placement)
        };
        if self.fp8 && self.ctx.calibration.is_given() {
            let graph = one_graph(m, self.name, "--quant fp8 calibrates")?;
            let values = pass.activation_inputs(m, graph);
            let r = self
                .ctx
                .ranges(m, graph, &values, self.ctx.observer.fixed())
                .map_err(|e| self.ctx.calib_failed(self.name, m, graph, &e))?;
            let ranges: HashMap<Value, (f32, f32)> = values
                .iter()
                .filter_map(|&v| r.get(v).map(|r| (v, (r.min, r.max))))
                .collect();
            notes.push(format!(
                "calibrated {} activations ({})",
                ranges.len(),
                self.ctx.observer
            ));
            pass = pass.with_activation_ranges(ranges);
        }
        if let Some(f) = self.ctx.finite_filter(m, &mut notes) {
            pass = pass.with_filter(f);
        }
        run_with_notes(&pass, m, opts, notes)
    }
}

/// `--quant fp16`.
pub(crate) fn fp16() -> Box<dyn Pass> {
    Box::new(Fp16Pass::new())
}

/// Runs `passes` as one step and folds their reports into one: counters of the same name
/// summed, notes prefixed with the pass name.
fn run_nested(
    m: &mut Module,
    passes: Vec<Box<dyn Pass>>,
    opts: &PassOptions,
    report: &mut PassReport,
) -> Result<(), PassError> {
    let mut pm = PassManager::new(passes);
    pm.verify = false;
    let inner = pm.run(m, opts)?;
    for p in inner.passes {
        for (k, v) in p.report.counters {
            report.count(&k, v);
        }
        report.changed |= p.report.changed;
        report.notes.extend(
            p.report
                .notes
                .into_iter()
                .map(|n| format!("{}: {n}", p.name)),
        );
        report.egraphs.extend(p.report.egraphs);
    }
    Ok(())
}

/// Labels the module's one entry graph and plans `map` on it.
fn plan(
    ctx: &Context,
    m: &Module,
    map: &PrecisionMap,
    pass: &str,
    notes: &mut Vec<String>,
) -> Result<(GraphId, Labels, Plan), PassError> {
    let graph = one_graph(m, pass, "--quant mixed quantizes")?;
    let labels = mmq_ir::modality::analyze(m, graph, &ctx.modality).map_err(|e| failed(pass, e))?;
    let plan = map.plan(m, graph, &labels);
    notes.push(format!("precision map on graph @{}:", m.graphs[graph].name));
    for line in plan.describe(map).lines() {
        notes.push(format!("  {line}"));
    }
    for i in plan.unused_rules() {
        notes.push(format!(
            "warning: {} matches no node of graph @{}",
            map.rules[i].label(),
            m.graphs[graph].name
        ));
    }
    Ok((graph, labels, plan))
}

/// Activation ranges for the calibrated nodes of `plan`, one calibration run on `samples` per
/// observer the plan uses; a note per run.
fn plan_ranges(
    m: &Module,
    graph: GraphId,
    plan: &Plan,
    samples: &[Sample],
    notes: &mut Vec<String>,
) -> Result<Ranges, CalibError> {
    let calibrated: Vec<(Node, &NodePlan)> =
        plan.iter().filter(|(_, p)| p.scheme.calibrated()).collect();
    let mut observers: Vec<Observer> = Vec::new();
    for (_, p) in &calibrated {
        if let Some(o) = p.calibration
            && !observers.contains(&o)
        {
            observers.push(o);
        }
    }
    let mut ranges = Ranges::default();
    for &o in &observers {
        let same = plan.filter_where(|p| p.scheme.calibrated() && p.calibration == Some(o));
        let mut values: Vec<Value> = Int8Pass::activations(m, Some(&same))
            .into_iter()
            .flat_map(|(_, v)| v)
            .collect();
        // FP8 nodes: their first (float) operand.
        for (n, p) in &calibrated {
            if p.scheme == Scheme::Fp8
                && p.calibration == Some(o)
                && let Some(Some(v)) = m.nodes[*n].inputs.first()
                && !values.contains(v)
            {
                values.push(*v);
            }
        }
        if values.is_empty() {
            continue;
        }
        let r = calibrate::calibrate(m, graph, &values, samples.iter().cloned().map(Ok), o)?;
        for &v in &values {
            if let Some(x) = r.get(v) {
                ranges.insert(v, x);
            }
        }
        ranges.samples = r.samples;
        notes.push(format!(
            "calibrated {} activations on {} samples ({o})",
            r.len(),
            r.samples
        ));
    }
    Ok(ranges)
}

/// The scheme passes that quantize the nodes of `plan` (made for `m`; run them on `m` or on a
/// copy of it), static INT8 with `ranges`.
/// When `target` takes symmetric activations only, every INT8 node is quantized symmetric
/// whatever the map says; INT4 nodes get the `accuracy_level` of `int4` or `target`.
fn plan_passes(
    m: &Module,
    plan: &Plan,
    ranges: &Ranges,
    placement: Placement,
    int4: Int4Options,
    target: &dyn mmq_passes::targets::Target,
) -> Vec<Box<dyn Pass>> {
    let symmetric_only = target.qdq_rules().symmetric_activations;
    let mut passes: Vec<Box<dyn Pass>> = Vec::new();
    let choices: &[bool] = if symmetric_only {
        &[true]
    } else {
        &[false, true]
    };
    for &symmetric in choices {
        let f = plan.filter_where(move |p| {
            p.scheme == Scheme::Int8 && (symmetric_only || p.symmetric == symmetric)
        });
        passes.push(Box::new(
            Int8Pass::new(Int8Scheme::Static {
                ranges: ranges.clone(),
                symmetric,
            })
            .with_filter(f)
            .with_placement(placement),
        ));
    }
    // Only when the plan has such nodes: a target without run-time quantization refuses the pass.
    // One pass per activation granularity the plan uses.
    for granularity in ActGranularity::ALL {
        let f = plan
            .filter_where(move |p| p.scheme == Scheme::Int8Dynamic && p.activations == granularity);
        let any = plan
            .iter()
            .any(|(_, p)| p.scheme == Scheme::Int8Dynamic && p.activations == granularity);
        if any {
            passes.push(Box::new(
                Int8Pass::new(Int8Scheme::Dynamic)
                    .with_filter(f)
                    .with_placement(placement)
                    .with_granularity(granularity),
            ));
        }
    }
    let mut groups: Vec<(usize, bool)> = Vec::new();
    for (_, p) in plan.iter().filter(|(_, p)| p.scheme == Scheme::Int4) {
        if let Some(Granularity::PerGroup { block }) = p.granularity
            && !groups.contains(&(block as usize, p.symmetric))
        {
            groups.push((block as usize, p.symmetric));
        }
    }
    for (block_size, symmetric) in groups {
        let f = plan.filter_where(move |p| {
            p.scheme == Scheme::Int4
                && p.symmetric == symmetric
                && p.granularity
                    == Some(Granularity::PerGroup {
                        block: block_size as u32,
                    })
        });
        passes.push(Box::new(
            WeightOnlyPass::new(int4_config(
                Int4Options {
                    block: block_size,
                    symmetric,
                    ..int4
                },
                target,
            ))
            .with_filter(f),
        ));
    }
    let fp8_ranges: HashMap<Value, (f32, f32)> = plan
        .iter()
        .filter(|(_, p)| p.scheme == Scheme::Fp8)
        .filter_map(|(n, _)| {
            let v = (*m.nodes[n].inputs.first()?)?;
            ranges.get(v).map(|r| (v, (r.min, r.max)))
        })
        .collect();
    // Only when the plan has FP8 nodes: the pass refuses models below opset 19 outright.
    if !plan.nodes_with(Scheme::Fp8).is_empty() {
        passes.push(Box::new(
            WeightOnlyPass::new(WeightOnlyConfig {
                scheme: WeightScheme::Fp8,
                ..Default::default()
            })
            .with_filter(plan.filter(Scheme::Fp8))
            .with_activation_ranges(fp8_ranges),
        ));
    }
    // Last: a weight shared with a node of another scheme is that scheme's by now.
    passes.push(Box::new(
        Fp16Pass::new().with_filter(plan.filter(Scheme::Fp16)),
    ));
    passes
}

/// Quantizes `m` by `map`: labels, plans, calibrates what the plan needs, runs the scheme
/// passes on the nodes the plan gives them (one nested pass manager, so node handles stay those
/// of the plan).
fn run_map(
    ctx: &Context,
    m: &mut Module,
    map: &PrecisionMap,
    pass: &str,
    opts: &PassOptions,
    report: &mut PassReport,
) -> Result<(), PassError> {
    let (graph, _, plan) = plan(ctx, m, map, pass, &mut report.notes)?;
    let calibrated = plan
        .iter()
        .any(|(_, p)| p.scheme.calibrated() && p.calibration.is_some());
    let calib = |e: CalibError| ctx.calib_failed(pass, m, graph, &e);
    let samples = if calibrated {
        ctx.all_samples(m, graph).map_err(calib)?
    } else {
        Vec::new()
    };
    let ranges = plan_ranges(m, graph, &plan, &samples, &mut report.notes).map_err(calib)?;
    // Each quantized node as it was, by name (the passes reuse node handles): a node the
    // scheme passes left exactly so (same op, same operands) was not quantized.
    let state = |m: &Module, n: Node| {
        let nd = &m.nodes[n];
        // Each operand by name and by what defines it (a weight's name stays when a pass puts
        // a `Cast` or `DequantizeLinear` in front of it).
        let operands: Vec<Option<(Option<String>, &str)>> = nd
            .inputs
            .iter()
            .map(|i| {
                i.map(|v| {
                    let def = match m.values[v].def {
                        mmq_ir::ValueDef::Output { node, .. } => m.nodes[node].op.op_type(),
                        mmq_ir::ValueDef::Const(_) => "constant",
                        _ => "input",
                    };
                    (m.values[v].name.clone(), def)
                })
            })
            .collect();
        format!("{:?} {operands:?}", nd.op)
    };
    let before: Vec<(String, String, Option<usize>, Scheme)> = plan
        .iter()
        .filter(|(_, p)| p.scheme != Scheme::Float)
        .filter_map(|(n, p)| Some((m.nodes[n].name.clone()?, state(m, n), p.rule, p.scheme)))
        .collect();
    let passes = plan_passes(m, &plan, &ranges, ctx.placement, ctx.int4, &*opts.target);
    run_nested(m, passes, opts, report)?;
    let after: HashMap<String, Node> = m.graphs[graph]
        .nodes()
        .iter()
        .filter_map(|&n| Some((m.nodes[n].name.clone()?, n)))
        .collect();
    let mut kept: BTreeMap<(Option<usize>, String), Vec<Node>> = BTreeMap::new();
    for (name, was, rule, scheme) in before {
        if let Some(&n) = after.get(&name)
            && state(m, n) == was
        {
            kept.entry((rule, scheme.to_string())).or_default().push(n);
        }
    }
    for ((rule, scheme), nodes) in kept {
        let label = rule.map_or_else(|| "the default".to_owned(), |i| map.rules[i].label());
        let mut shown: Vec<String> = nodes
            .iter()
            .take(3)
            .map(|&n| {
                let nd = &m.nodes[n];
                format!(
                    "{} '{}'",
                    nd.op.op_type(),
                    nd.name.as_deref().unwrap_or("?")
                )
            })
            .collect();
        if nodes.len() > 3 {
            shown.push(format!("{} more", nodes.len() - 3));
        }
        let placed = ctx.placement == Placement::Cost && scheme.starts_with("int8");
        let why = if placed {
            "the scheme does not apply to them there, or the cost model estimated them faster in \
             float (--placement all quantizes every node it applies to)"
        } else {
            "the scheme does not apply to them there: choose one that does (docs/quantization.md \
             lists what each quantizes) or narrow the rule"
        };
        report.notes.push(format!(
            "warning: {label}: {scheme} left {} of the nodes it matched float on target {} ({}); \
             {why}",
            nodes.len(),
            opts.target,
            shown.join(", ")
        ));
    }
    Ok(())
}

/// `--quant mixed --precision-map MAP.toml`.
pub(crate) struct MixedStep {
    pub ctx: Shared,
    pub map: PrecisionMap,
}

impl Pass for MixedStep {
    fn name(&self) -> &str {
        "mixed"
    }

    fn run(&self, m: &mut Module, opts: &PassOptions) -> Result<PassReport, PassError> {
        let mut report = PassReport::default();
        run_map(&self.ctx, m, &self.map, self.name(), opts, &mut report)?;
        Ok(report)
    }
}

/// Runs of candidates `--auto` measures end to end to scale the local losses by depth
/// ([`auto::depth_scaled`]), and the samples it measures them on.
const DEPTH_GROUPS: usize = 16;
const DEPTH_SAMPLES: usize = 4;

/// `--auto COSINE`: chooses a scheme per node, then quantizes with the chosen map as
/// `--precision-map` would read it.
pub(crate) struct AutoStep {
    pub ctx: Shared,
    pub target: f64,
}

/// An `--auto` failure, as the search wants it.
struct EvalError(PassError);

impl From<AutoError> for EvalError {
    fn from(e: AutoError) -> Self {
        EvalError(failed("auto", e))
    }
}

impl Pass for AutoStep {
    fn name(&self) -> &str {
        "auto"
    }

    fn run(&self, m: &mut Module, opts: &PassOptions) -> Result<PassReport, PassError> {
        let start = Instant::now();
        let name = self.name();
        let ctx = &self.ctx;
        let graph = one_graph(m, name, "--auto chooses precisions for")?;
        let (block, asym) = (ctx.int4.block as u32, !ctx.int4.symmetric);
        let user = |e: AutoError| failed(name, e);
        let calib = |e: CalibError| ctx.calib_failed(name, m, graph, &e);
        let all = ctx.all_samples(m, graph).map_err(calib)?;
        // A quarter of the samples (from 4 on) is kept from the search, to judge its choice on
        // data it did not fit.
        let held = if all.len() >= 4 { all.len() / 4 } else { 0 };
        let (samples, judge) = all.split_at(all.len() - held);
        // The observer is chosen on the search's samples only, the kept ones staying unseen.
        let mut observer_notes = Vec::new();
        let observer = match ctx.observer {
            ObserverChoice::Fixed(observer) => observer,
            ObserverChoice::Measured => {
                ctx.measure_observers(m, graph, name, samples, opts, &mut observer_notes)?
            }
        };
        let settings = move |s: Scheme| match s {
            Scheme::Int4 => Settings {
                scheme: s,
                granularity: (block != 32).then_some(Granularity::PerGroup { block }),
                symmetric: asym.then_some(false),
                calibration: None,
                activations: None,
            },
            Scheme::Int8 => Settings {
                scheme: s,
                granularity: None,
                symmetric: None,
                calibration: (observer != Observer::MinMax).then_some(observer),
                activations: None,
            },
            _ => Settings {
                scheme: s,
                ..Settings::float()
            },
        };
        let orig: &Module = m;
        let cands = auto::candidates(orig, graph);
        let main = self.ctx.main_output.as_deref();
        let reference = Reference::new(orig, graph, samples, main).map_err(user)?;
        let judge_reference = if judge.is_empty() {
            None
        } else {
            Some(Reference::new(orig, graph, judge, main).map_err(user)?)
        };
        let labels =
            mmq_ir::modality::analyze(orig, graph, &ctx.modality).map_err(|e| failed(name, e))?;
        let in_order: Vec<usize> = (0..cands.list.len()).collect();

        // Activation ranges once, for every candidate that can be INT8: a value's range does
        // not depend on which other nodes are quantized.
        let all_int8: Vec<Scheme> = cands
            .list
            .iter()
            .map(|c| {
                if c.ladder.contains(&Scheme::Int8) {
                    Scheme::Int8
                } else {
                    Scheme::Float
                }
            })
            .collect();
        let map =
            auto::assignment_map(&cands.list, &all_int8, &in_order, &settings).map_err(user)?;
        let mut calib_notes = Vec::new();
        let ranges = plan_ranges(
            orig,
            graph,
            &map.plan(orig, graph, &labels),
            samples,
            &mut calib_notes,
        )
        .map_err(calib)?;

        // Quantizes `q` (the module or a copy of part of it) with one scheme per candidate.
        let quantize =
            |q: &mut Module, schemes: &[Scheme], ranges: &Ranges| -> Result<(), EvalError> {
                let map = auto::assignment_map(&cands.list, schemes, &in_order, &settings)?;
                let plan = map.plan(q, graph, &labels);
                let mut pm = PassManager::new(plan_passes(
                    q,
                    &plan,
                    ranges,
                    ctx.placement,
                    ctx.int4,
                    &*opts.target,
                ));
                pm.verify = false;
                pm.run(q, opts).map_err(EvalError)?;
                Ok(())
            };
        let evaluate_on = |schemes: &[Scheme],
                           reference: &Reference,
                           samples: &[Sample]|
         -> Result<f64, EvalError> {
            let mut q = orig.clone();
            quantize(&mut q, schemes, &ranges)?;
            Ok(reference.cosine(&q, samples)?)
        };
        let evaluate = |schemes: &[Scheme]| evaluate_on(schemes, &reference, samples);
        // Each candidate's sensitivity from the FP32 activations it reads, quantized alone.
        let quantize_alone = |i: usize, iso: &mut auto::Isolated| -> Result<(), EvalError> {
            let mut schemes = vec![Scheme::Float; cands.list.len()];
            schemes[i] = cands.list[i].bottom();
            let mut ranges = ranges.clone();
            for &(old, new) in &iso.inputs {
                ranges.alias(new, old);
            }
            quantize(&mut iso.module, &schemes, &ranges)
        };
        let mut local = auto::local_sensitivity(orig, graph, &cands.list, samples, quantize_alone)
            .map_err(|e: EvalError| e.0)?;
        let reaches = auto::reaches(orig, graph, &cands.list, reference.output());
        for (loss, reaches) in local.iter_mut().zip(reaches) {
            if !reaches {
                *loss = 0.0;
            }
        }
        // Scaled by depth on a few samples: a ratio of losses needs fewer than the target does.
        let few = samples.len().min(DEPTH_SAMPLES);
        let (few_reference, few_samples) = (reference.first(few), &samples[..few]);
        let mut depth_evaluations = 0usize;
        let sensitivity = auto::depth_scaled(&cands.list, &local, DEPTH_GROUPS, |s| {
            depth_evaluations += 1;
            evaluate_on(s, &few_reference, few_samples)
        })
        .map_err(|e| e.0)?;
        let choice =
            auto::search(&cands.list, self.target, Some(sensitivity), evaluate).map_err(|e| e.0)?;
        let searched = start.elapsed();
        let text = choice
            .toml(&cands.list, &settings, self.target, reference.output())
            .map_err(user)?;
        // Compile with the map as written, exactly as `--precision-map` would read it.
        let map = match PrecisionMap::parse(&text) {
            Ok((map, _)) => map,
            Err(diags) => {
                let first = diags.first().map(ToString::to_string).unwrap_or_default();
                return Err(failed(
                    name,
                    format!("the chosen map does not parse back: {first}"),
                ));
            }
        };

        let mut report = PassReport::default();
        report.notes.extend(observer_notes);
        report
            .notes
            .extend(table(&cands.list, &choice).lines().map(str::to_owned));
        if cands.unnamed > 0 {
            report.notes.push(format!(
                "{} quantizable nodes stay float: a precision map cannot name them (no name, or a shared one)",
                cands.unnamed
            ));
        }
        let counts: Vec<String> = Scheme::ALL
            .iter()
            .filter_map(|s| {
                let n = choice.schemes.iter().filter(|x| *x == s).count();
                (n > 0).then(|| format!("{s} {n}"))
            })
            .collect();
        report.notes.push(format!(
            "target cosine {}, achieved {:.8} on output '{}' over {} samples ({}); {} evaluations \
             (sensitivity: each node alone on the FP32 activations, scaled by depth with {} more on \
             {} samples) in {:.2} s",
            self.target,
            choice.cosine,
            reference.output(),
            samples.len(),
            if counts.is_empty() {
                "no quantizable nodes".to_owned()
            } else {
                counts.join(", ")
            },
            choice.evaluations,
            depth_evaluations,
            few,
            searched.as_secs_f64()
        ));
        let stream = CalibrationSource::Stream(Arc::new(crate::calibration::SampleStream::of(
            samples.to_vec(),
        )));
        let replay = Context {
            calibration: stream,
            observer: ObserverChoice::Fixed(observer),
            placement: ctx.placement,
            int4: ctx.int4,
            granularity: ctx.granularity,
            skip_non_finite: ctx.skip_non_finite,
            modality: ctx.modality.clone(),
            progress: None,
            main_output: ctx.main_output.clone(),
            interrupt: ctx.interrupt.clone(),
            auto: Mutex::new(None),
        };
        run_map(&replay, m, &map, name, opts, &mut report)?;
        // What was written: the cost placement may run INT8 units the search chose in float.
        let placed_float = report.counters.get("placed-float").copied().unwrap_or(0);
        if placed_float > 0 {
            let integer = report.counters.get("placed-integer").copied().unwrap_or(0);
            report.notes.push(format!(
                "written: of the units the INT8 choice makes, {integer} stay integer and \
                 {placed_float} run in float, which the {} cost model estimates faster at \
                 their sizes (--placement all keeps them integer)",
                opts.target
            ));
        }
        // The compiled model measured the same way: equal to the search's figure unless the
        // calibration differs.
        let compiled = reference.cosine(m, samples).map_err(user)?;
        if compiled < self.target {
            report.notes.push(format!(
                "warning: the compiled model's cosine {compiled:.6} is below the target {} (the search measured {:.6})",
                self.target, choice.cosine
            ));
        }
        // The choice judged on the samples the search did not see.
        let held_back = match &judge_reference {
            Some(r) => Some(r.cosine(m, judge).map_err(user)?),
            None => None,
        };
        match held_back {
            Some(c) if c < self.target => report.notes.push(format!(
                "warning: on {} sample(s) the search did not use, the compiled model's cosine is \
                 {c:.6}, below the target {} it met on its own {} ({:.6}): give more or more \
                 varied calibration samples (--calib DIR), or a higher target",
                judge.len(),
                self.target,
                samples.len(),
                compiled
            )),
            Some(c) => report.notes.push(format!(
                "on {} sample(s) the search did not use: cosine {c:.6} (target {})",
                judge.len(),
                self.target
            )),
            None => report.notes.push(format!(
                "all {} sample(s) went into the search (from 4, a quarter is kept to judge it)",
                samples.len()
            )),
        }
        *ctx.auto.lock().unwrap_or_else(|e| e.into_inner()) = Some(AutoOutcome {
            map: text,
            target: self.target,
            searched_cosine: choice.cosine,
            compiled_cosine: compiled,
            held_back_cosine: held_back,
            held_back_samples: judge.len(),
        });
        Ok(report)
    }
}

/// One row per candidate, most sensitive first: node, op, sensitivity, chosen scheme.
fn table(cands: &[Candidate], choice: &Choice) -> String {
    use std::fmt::Write as _;
    let width = cands
        .iter()
        .map(|c| c.name.chars().count())
        .max()
        .unwrap_or(0)
        .clamp("node".len(), 60);
    let opw = cands
        .iter()
        .map(|c| c.op.len())
        .max()
        .unwrap_or(0)
        .max("op".len());
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<width$}  {:<opw$}  {:>11}  scheme",
        "node", "op", "sensitivity"
    );
    for &i in &choice.order {
        let (Some(c), Some(sens), Some(scheme)) = (
            cands.get(i),
            choice.sensitivity.get(i),
            choice.schemes.get(i),
        ) else {
            continue;
        };
        let _ = writeln!(
            s,
            "{:<width$}  {:<opw$}  {sens:>11.3e}  {scheme}",
            mmq_passes::quant::report::shorten(&c.name, width),
            c.op
        );
    }
    s
}
