//! `--modality INPUT=KIND` and `--precision-map MAP.toml`: modality labels of every entry graph,
//! precision maps read and rendered with their diagnostics, and the plan they give.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;

use codespan_reporting::diagnostic::{Diagnostic, Label};
use codespan_reporting::files::SimpleFiles;
use mmq_ir::modality::{InputSource, Labels, Modality};
use mmq_ir::{GraphId, Module, Node, Value};
use mmq_passes::quant::calibrate::{self, CalibError, Observer, Ranges, Sample};
use mmq_passes::quant::fp16::Fp16Pass;
use mmq_passes::quant::int8::{Int8Pass, Int8Scheme};
use mmq_passes::quant::precision::{
    Granularity, Level, MapDiagnostic, NodePlan, Plan, PrecisionMap, Scheme,
};
use mmq_passes::quant::weight_only::{WeightOnlyConfig, WeightOnlyPass, WeightScheme};
use mmq_passes::{Pass, PassOptions};

use crate::diagnostics::{Failure, render};

/// Parses one `--modality` value, `NAME=KIND`.
pub fn parse_modality_arg(s: &str) -> Result<(String, Modality), String> {
    let Some((name, kind)) = s.rsplit_once('=') else {
        return Err(format!(
            "'{s}' is not INPUT=KIND (for example pixel_values=vision)"
        ));
    };
    if name.is_empty() {
        return Err(format!("'{s}': the input name is empty"));
    }
    let kind: Modality = kind.parse().map_err(|e| format!("{e}"))?;
    Ok((name.to_owned(), kind))
}

/// Labels every entry graph of `m`.
pub fn analyze_all(
    m: &Module,
    overrides: &[(String, Modality)],
) -> Result<Vec<(GraphId, Labels)>, Failure> {
    m.entries
        .iter()
        .map(|e| {
            mmq_ir::modality::analyze(m, e.graph, overrides)
                .map(|l| (e.graph, l))
                .map_err(|err| Failure::user(format!("error: {err}\n")))
        })
        .collect()
}

fn source_text(s: InputSource) -> &'static str {
    match s {
        InputSource::Override => "--modality",
        InputSource::Name => "name",
        InputSource::Shape => "dtype and shape",
        InputSource::Link => "linked output",
        InputSource::Unknown => "unknown",
    }
}

/// `// modality ...` lines of `inspect --stats`: input labels, then nodes and weight bytes per
/// label.
pub fn stats_text(m: &Module, labels: &[(GraphId, Labels)], human: fn(u64) -> String) -> String {
    let mut out = String::new();
    for (g, l) in labels {
        let _ = writeln!(out, "// modality of graph @{}:", m.graphs[*g].name);
        for i in l.inputs() {
            let _ = writeln!(
                out,
                "//   input {:<24} {:<7} ({})",
                i.name,
                i.modality.name(),
                source_text(i.source)
            );
        }
        for (label, s) in l.summary(m) {
            let _ = writeln!(
                out,
                "//   {:<7} {:>6} nodes  {:>12} in {} weights",
                label.name(),
                s.nodes,
                human(s.weight_bytes),
                s.weights
            );
        }
    }
    out
}

/// The JSON form of the same statistics.
pub fn stats_json(m: &Module, labels: &[(GraphId, Labels)]) -> serde_json::Value {
    let graphs: Vec<serde_json::Value> = labels
        .iter()
        .map(|(g, l)| {
            let inputs: serde_json::Map<String, serde_json::Value> = l
                .inputs()
                .iter()
                .map(|i| {
                    (
                        i.name.clone(),
                        serde_json::json!({"modality": i.modality.name(), "from": source_text(i.source)}),
                    )
                })
                .collect();
            let by: serde_json::Map<String, serde_json::Value> = l
                .summary(m)
                .into_iter()
                .map(|(label, s)| {
                    (
                        label.name().to_owned(),
                        serde_json::json!({"nodes": s.nodes, "weights": s.weights, "weight_bytes": s.weight_bytes}),
                    )
                })
                .collect();
            serde_json::json!({"graph": m.graphs[*g].name, "inputs": inputs, "labels": by})
        })
        .collect();
    serde_json::Value::Array(graphs)
}

/// The per-node label comments of the text dump.
pub fn node_notes(
    labels: &[(GraphId, Labels)],
) -> std::collections::BTreeMap<mmq_ir::Node, String> {
    labels
        .iter()
        .flat_map(|(_, l)| l.nodes().map(|(n, lab)| (n, lab.name().to_owned())))
        .collect()
}

fn to_codespan(d: &MapDiagnostic, file: usize) -> Diagnostic<usize> {
    let diag = match d.level {
        Level::Error => Diagnostic::error(),
        Level::Warning => Diagnostic::warning(),
    };
    let mut labels = vec![Label::primary(file, d.span.clone()).with_message(d.label.clone())];
    labels.extend(
        d.related
            .iter()
            .map(|(span, msg)| Label::secondary(file, span.clone()).with_message(msg.clone())),
    );
    diag.with_message(d.message.clone())
        .with_labels(labels)
        .with_notes(d.notes.clone())
}

/// Reads and parses a precision map; returns it with its rendered warnings, or every diagnostic
/// rendered as a failure.
pub fn load_map(path: &Path) -> Result<(PrecisionMap, String), Failure> {
    let src = std::fs::read_to_string(path).map_err(|e| {
        Failure::user(format!(
            "error: cannot read precision map {}: {e}\n",
            path.display()
        ))
    })?;
    let mut files = SimpleFiles::new();
    let file = files.add(path.display().to_string(), src.clone());
    let render_all = |diags: &[MapDiagnostic]| {
        diags
            .iter()
            .map(|d| render(&files, &to_codespan(d, file)))
            .collect::<String>()
    };
    match PrecisionMap::parse(&src) {
        Ok((map, warnings)) => Ok((map, render_all(&warnings))),
        Err(diags) => Err(Failure::user(render_all(&diags))),
    }
}

/// Plans every entry graph; returns the plans and a description for stderr (rules that matched
/// nothing are warnings there).
pub fn plan_all(
    m: &Module,
    map: &PrecisionMap,
    labels: &[(GraphId, Labels)],
) -> (Vec<(GraphId, Plan)>, String) {
    let mut text = String::new();
    let mut plans = Vec::new();
    for (g, l) in labels {
        let plan = map.plan(m, *g, l);
        let _ = writeln!(text, "precision map on graph @{}:", m.graphs[*g].name);
        for line in plan.describe(map).lines() {
            let _ = writeln!(text, "  {line}");
        }
        for i in plan.unused_rules() {
            let _ = writeln!(
                text,
                "warning: {} matches no node of graph @{}",
                map.rules[i].label(),
                m.graphs[*g].name
            );
        }
        plans.push((*g, plan));
    }
    (plans, text)
}

/// Samples for calibrating a mixed plan: `--calib DIR`, else `--calib-random N` (default
/// [`crate::int8::DEFAULT_RANDOM_SAMPLES`]).
pub fn samples<'m>(
    m: &'m Module,
    graph: GraphId,
    calib: &crate::int8::CalibArgs,
) -> Result<Vec<Sample>, Failure> {
    let fail = |e: CalibError| Failure::user(format!("error: calibration: {e}\n"));
    if calib.dir.is_some() && calib.random.is_some() {
        return Err(Failure {
            rendered: "error: --calib and --calib-random cannot be used together\n".to_owned(),
            code: 2,
        });
    }
    let it: Box<dyn Iterator<Item = Result<Sample, CalibError>> + 'm> = match &calib.dir {
        Some(dir) => Box::new(calibrate::dir_samples(dir).map_err(fail)?),
        None => {
            let n = calib
                .random
                .unwrap_or(crate::int8::DEFAULT_RANDOM_SAMPLES)
                .max(1);
            Box::new(calibrate::random_samples(m, graph, n, 0).map_err(fail)?)
        }
    };
    it.collect::<Result<Vec<_>, _>>().map_err(fail)
}

/// `--quant mixed --precision-map MAP`: labels the (optimized) module, resolves the map, then runs
/// the scheme passes on the nodes the plan gives them, all in one pass manager so that node
/// handles stay those of the plan. Returns what to print on stderr.
pub fn run_mixed(
    module: &mut Module,
    map_path: Option<&Path>,
    overrides: &[(String, Modality)],
    calib: &crate::int8::CalibArgs,
    opts: &PassOptions,
) -> Result<String, Failure> {
    let Some(map_path) = map_path else {
        return Err(Failure {
            rendered: "error: --quant mixed needs --precision-map MAP.toml\n".to_owned(),
            code: 2,
        });
    };
    let (map, mut out) = load_map(map_path)?;
    out.push_str(&run_map(module, &map, overrides, calib, opts)?);
    Ok(out)
}

/// Runs a precision map (read from a file, or built in code as `--auto` does) on the
/// (optimized) module: labels it, resolves the map, calibrates what the plan needs, then runs
/// the scheme passes on the nodes the plan gives them, all in one pass manager so that node
/// handles stay those of the plan. Returns what to print on stderr.
pub fn run_map(
    module: &mut Module,
    map: &PrecisionMap,
    overrides: &[(String, Modality)],
    calib: &crate::int8::CalibArgs,
    opts: &PassOptions,
) -> Result<String, Failure> {
    let mut out = String::new();
    if module.entries.len() != 1 {
        return Err(Failure::user(
            "error: --quant mixed quantizes one model at a time; compile the files separately\n"
                .to_owned(),
        ));
    }
    let labels = analyze_all(module, overrides)?;
    let (mut plans, text) = plan_all(module, map, &labels);
    out.push_str(&text);
    let Some((graph, plan)) = plans.pop() else {
        return Err(Failure::user("error: the module has no graph\n".to_owned()));
    };
    let m: &Module = module;
    let calibrated = plan
        .iter()
        .any(|(_, p)| p.scheme.calibrated() && p.calibration.is_some());
    let samples = if calibrated {
        samples(m, graph, calib)?
    } else {
        Vec::new()
    };
    let ranges = plan_ranges(m, graph, &plan, &samples, &mut out)?;
    let passes = plan_passes(m, &plan, &ranges, calib);
    out.push_str(&crate::compile::run_passes(module, passes, opts)?);
    Ok(out)
}

/// Activation ranges for the calibrated nodes of `plan` (top-level graph `graph` of `m`), one
/// calibration run on `samples` per observer the plan uses; a line per run goes to `out`.
pub fn plan_ranges(
    m: &Module,
    graph: GraphId,
    plan: &Plan,
    samples: &[Sample],
    out: &mut String,
) -> Result<Ranges, Failure> {
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
    if !observers.is_empty() {
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
            let r = calibrate::calibrate(m, graph, &values, samples.iter().cloned().map(Ok), o)
                .map_err(|e| Failure::user(format!("error: calibration: {e}\n")))?;
            for &v in &values {
                if let Some(x) = r.get(v) {
                    ranges.insert(v, x);
                }
            }
            ranges.samples = r.samples;
            let _ = writeln!(
                out,
                "mixed: calibrated {} activations on {} samples ({o})",
                r.len(),
                r.samples
            );
        }
    }
    Ok(ranges)
}

/// The scheme passes that quantize the nodes of `plan` (made for `m`; run them on `m` or on a
/// copy of it), static INT8 with `ranges`.
pub fn plan_passes(
    m: &Module,
    plan: &Plan,
    ranges: &Ranges,
    calib: &crate::int8::CalibArgs,
) -> Vec<Box<dyn Pass>> {
    let mut passes: Vec<Box<dyn Pass>> = Vec::new();
    for symmetric in [false, true] {
        let f = plan.filter_where(move |p| p.scheme == Scheme::Int8 && p.symmetric == symmetric);
        passes.push(Box::new(
            Int8Pass::new(Int8Scheme::Static {
                ranges: ranges.clone(),
                symmetric,
            })
            .with_filter(f)
            .with_placement(calib.placement),
        ));
    }
    passes.push(Box::new(
        Int8Pass::new(Int8Scheme::Dynamic)
            .with_filter(plan.filter(Scheme::Int8Dynamic))
            .with_placement(calib.placement),
    ));
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
            WeightOnlyPass::new(WeightOnlyConfig {
                scheme: WeightScheme::Int4,
                block_size,
                symmetric,
                ..Default::default()
            })
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
