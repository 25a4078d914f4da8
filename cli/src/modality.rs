//! `--modality INPUT=KIND` and the modality labels `inspect` prints.

use std::fmt::Write as _;

use mmq_ir::modality::{InputSource, Labels, Modality};
use mmq_ir::{GraphId, Module};

use crate::failure::Failure;

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
