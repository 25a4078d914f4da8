//! What a compilation did, as data and as JSON.

use std::collections::BTreeMap;

use mmq_passes::quant::report::{EndToEnd, Report};
use mmq_passes::{EGraphStats, PipelineReport};
use serde::Serialize;

use crate::options::CompileOptions;
use crate::steps::AutoOutcome;

/// Which part of a compilation a pass belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// The modality split of a merged multimodal graph, before everything else.
    Split,
    /// The optimization passes of the level.
    Optimize,
    /// The quantization passes of the precision plan.
    Quantize,
    /// The passes that finish a quantized module.
    Finish,
    /// The passes that change the graph interface (quantized caches), after the accuracy
    /// figures, which compare like interfaces.
    Interface,
}

/// What one pass did.
#[derive(Clone, Debug, Serialize)]
pub struct PassSummary {
    /// The pass name.
    pub name: String,
    /// Its stage.
    pub stage: Stage,
    /// Wall time in milliseconds.
    pub ms: f64,
    /// Whether it changed the module.
    pub changed: bool,
    /// Its counters (rule firings, quantized nodes, ...).
    pub counters: BTreeMap<String, usize>,
    /// Its notes (calibration, plans, e-graph runs).
    pub notes: Vec<String>,
    /// The e-graphs it ran.
    pub egraphs: Vec<EGraphStats>,
    /// The module as `.mmir` text after the pass, when `dump_after` selected it.
    #[serde(skip)]
    pub dump: Option<String>,
}

/// The accuracy of the compiled module against the imported one.
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum AccuracyReport {
    /// The end-to-end figures of the main output on the held-back samples only (`None` when
    /// the model has no float output).
    EndToEnd {
        /// The figures.
        end_to_end: Option<EndToEnd>,
    },
    /// Per-layer and end-to-end figures.
    Full(Report),
}

impl AccuracyReport {
    /// The end-to-end figures.
    pub fn end_to_end(&self) -> Option<&EndToEnd> {
        match self {
            AccuracyReport::EndToEnd { end_to_end } => end_to_end.as_ref(),
            AccuracyReport::Full(r) => r.end_to_end.as_ref(),
        }
    }
}

/// What a compilation did.
#[derive(Clone, Debug, Serialize)]
pub struct CompileReport {
    /// The target's name.
    pub target: String,
    /// The optimization level (`O2`).
    pub level: String,
    /// Every pass in order.
    pub passes: Vec<PassSummary>,
    /// Total pass time in milliseconds.
    pub total_ms: f64,
    /// The accuracy figures, when measured.
    pub accuracy: Option<AccuracyReport>,
    /// What `Precision::Auto` chose.
    pub auto: Option<AutoOutcome>,
    /// With full accuracy: per graph, the activation granularity and symmetry per layer and per
    /// modality ([`mmq_passes::quant::granularity`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub activations: Vec<mmq_passes::quant::granularity::Analysis>,
    /// With full accuracy: the compared layers with modality and precision.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<crate::analysis::LayerView>,
    /// With full accuracy: the similarity error of the alignment outputs.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub alignment: Vec<crate::analysis::Alignment>,
}

impl CompileReport {
    pub(crate) fn new(options: &CompileOptions, run: &PipelineReport, stages: &[Stage]) -> Self {
        CompileReport {
            target: options.target.name().to_owned(),
            level: options.level.to_string(),
            passes: Vec::new(),
            total_ms: 0.0,
            accuracy: None,
            auto: None,
            activations: Vec::new(),
            layers: Vec::new(),
            alignment: Vec::new(),
        }
        .with_run(run, stages)
    }

    /// Adds the passes of `run`, of `stages` in order.
    pub(crate) fn with_run(mut self, run: &PipelineReport, stages: &[Stage]) -> Self {
        let passes = run
            .passes
            .iter()
            .zip(stages)
            .map(|(p, &stage)| PassSummary {
                name: p.name.clone(),
                stage,
                ms: p.time.as_secs_f64() * 1e3,
                changed: p.report.changed,
                counters: p.report.counters.clone(),
                notes: p.report.notes.clone(),
                egraphs: p.report.egraphs.clone(),
                dump: p.dump.clone(),
            })
            .collect::<Vec<_>>();
        self.passes.extend(passes);
        self.total_ms += run.total_time().as_secs_f64() * 1e3;
        self
    }

    /// The report as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }

    /// The passes of `stage`.
    pub fn stage(&self, stage: Stage) -> impl Iterator<Item = &PassSummary> {
        self.passes.iter().filter(move |p| p.stage == stage)
    }
}
