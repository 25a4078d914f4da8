//! Text renderings of a module and of a TensorRT package for `mmq inspect`: statistics, modality
//! labels, a DOT graph, a package summary.

use std::fmt::Write as _;
use std::path::Path;

use mmq_ir::modality::{InputSource, Labels, Modality};
use mmq_ir::text::type_text;
use mmq_ir::{GraphId, Module, Value, ValueDef};

use crate::inspect::{op_counts, op_key, weight_bytes_by_dtype};

/// A byte count for people (`1.50 MiB`).
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// `// ---- statistics ----`: nodes per op of each entry graph, weight bytes per dtype.
pub fn stats_text(m: &Module) -> String {
    let mut out = String::from("\n// ---- statistics ----\n");
    for e in &m.entries {
        let ops = op_counts(m, e.graph);
        let total: usize = ops.values().sum();
        let _ = writeln!(out, "// graph @{}: {total} nodes", m.graphs[e.graph].name);
        let mut sorted: Vec<(&String, &usize)> = ops.iter().collect();
        sorted.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let width = sorted.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        for (op, n) in sorted {
            let _ = writeln!(out, "//   {op:<width$}  {n}");
        }
    }
    let by_dtype = weight_bytes_by_dtype(m);
    let _ = writeln!(
        out,
        "// weights: {} in {} constants",
        human_bytes(m.weight_bytes()),
        m.consts.len()
    );
    for (dtype, bytes) in by_dtype {
        let _ = writeln!(out, "//   {dtype:<10}  {}", human_bytes(bytes));
    }
    out
}

/// `s` inside a DOT double-quoted string: quotes and backslashes escaped, a newline as DOT's
/// `\n`, and every other control character (a name may hold any; a terminal would act on an
/// ESC or BEL) written as `\u{..}` text.
fn dot_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c if c.is_control() => out.push_str(&format!("\\\\u{{{:x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    out
}

/// The entry graphs as DOT digraphs.
pub fn dot(m: &Module) -> String {
    let mut out = String::new();
    for e in &m.entries {
        let g = &m.graphs[e.graph];
        let _ = writeln!(out, "digraph \"{}\" {{", dot_escape(&g.name));
        out.push_str("  rankdir=TB;\n  node [shape=box, fontname=\"monospace\"];\n");
        let mut source: std::collections::HashMap<Value, String> = Default::default();
        for (i, &v) in g.inputs.iter().enumerate() {
            let id = format!("in{i}");
            let name = m.values[v].name.clone().unwrap_or_default();
            let _ = writeln!(
                out,
                "  {id} [shape=ellipse, label=\"{}\\n{}\"];",
                dot_escape(&name),
                dot_escape(&type_text(m, m.value_type(v)))
            );
            source.insert(v, id);
        }
        for (i, &n) in g.nodes().iter().enumerate() {
            let node = &m.nodes[n];
            let id = format!("n{i}");
            let consts = node
                .inputs
                .iter()
                .flatten()
                .filter(|v| matches!(m.values[**v].def, ValueDef::Const(_)))
                .count();
            let extra = if consts > 0 {
                format!("\\n+{consts} const")
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "  {id} [label=\"{}{extra}\"];",
                dot_escape(&op_key(&node.op))
            );
            for &v in node.inputs.iter().flatten() {
                if let Some(src) = source.get(&v) {
                    let _ = writeln!(
                        out,
                        "  {src} -> {id} [label=\"{}\"];",
                        dot_escape(&type_text(m, m.value_type(v)))
                    );
                }
            }
            for &v in node.outputs.iter().flatten() {
                source.insert(v, id.clone());
            }
        }
        for (i, &v) in g.outputs.iter().enumerate() {
            let id = format!("out{i}");
            let name = m.values[v].name.clone().unwrap_or_default();
            let _ = writeln!(
                out,
                "  {id} [shape=ellipse, label=\"{}\"];",
                dot_escape(&name)
            );
            if let Some(src) = source.get(&v) {
                let _ = writeln!(
                    out,
                    "  {src} -> {id} [label=\"{}\"];",
                    dot_escape(&type_text(m, m.value_type(v)))
                );
            }
        }
        out.push_str("}\n");
    }
    out
}

/// Labels every entry graph of `m`.
pub fn labels(
    m: &Module,
    overrides: &[(String, Modality)],
) -> Result<Vec<(GraphId, Labels)>, mmq_ir::modality::ModalityError> {
    m.entries
        .iter()
        .map(|e| mmq_ir::modality::analyze(m, e.graph, overrides).map(|l| (e.graph, l)))
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
pub fn modality_text(m: &Module, labels: &[(GraphId, Labels)]) -> String {
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
                human_bytes(s.weight_bytes),
                s.weights
            );
        }
    }
    out
}

/// The JSON form of the same statistics.
pub fn modality_json(m: &Module, labels: &[(GraphId, Labels)]) -> serde_json::Value {
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
/// A TensorRT package's manifest could not be read.
#[derive(Debug, thiserror::Error)]
#[error("{}: {message}", path.display())]
pub struct ManifestError {
    /// The manifest.
    pub path: std::path::PathBuf,
    /// What is wrong.
    pub message: String,
}

/// A TensorRT package (`mmq compile --target trt`): its manifest as written, and a summary of its
/// models, profiles, quantization, plugins and what TensorRT would refuse.
pub fn trt_package(dir: &Path) -> Result<(String, String), ManifestError> {
    let path = dir.join("manifest.json");
    let fail = |message: String| ManifestError {
        path: path.clone(),
        message,
    };
    let text = std::fs::read_to_string(&path).map_err(|e| fail(e.to_string()))?;
    let j: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| fail(format!("not JSON: {e}")))?;
    if j["format"] != "mmq-tensorrt-package" {
        return Err(fail("not an mmq TensorRT package manifest".to_owned()));
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "TensorRT package {} (format {}, {}; TensorRT {})",
        dir.display(),
        j["version"],
        j["producer"].as_str().unwrap_or("?"),
        j["tensorrt"]["versions"]
            .as_array()
            .map(|v| v
                .iter()
                .filter_map(|x| x.as_str())
                .collect::<Vec<_>>()
                .join(", "))
            .unwrap_or_default()
    );
    let tensors = |v: &serde_json::Value| -> String {
        v.as_array()
            .map(|a| {
                a.iter()
                    .map(|t| {
                        let shape: Vec<&str> = t["shape"]
                            .as_array()
                            .map(|s| s.iter().filter_map(|d| d.as_str()).collect())
                            .unwrap_or_default();
                        format!(
                            "{}: {}[{}]",
                            t["name"].as_str().unwrap_or("?"),
                            t["dtype"].as_str().unwrap_or("?"),
                            shape.join(", ")
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default()
    };
    for model in j["models"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "model {} (opset {})",
            model["file"].as_str().unwrap_or("?"),
            model["opset"]
        );
        let _ = writeln!(out, "  inputs:  {}", tensors(&model["inputs"]));
        let _ = writeln!(out, "  outputs: {}", tensors(&model["outputs"]));
        let q: Vec<String> = model["quantization"]
            .as_object()
            .map(|o| o.iter().map(|(k, v)| format!("{v} {k}")).collect())
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  quantization: {}",
            if q.is_empty() {
                "none".to_owned()
            } else {
                q.join(", ")
            }
        );
        let reference = &model["reference"];
        let _ = writeln!(
            out,
            "  reference: {}",
            match (
                reference["inputs"]["file"].as_str(),
                reference["missing"].as_str()
            ) {
                (Some(f), _) => format!(
                    "{f}, {}{}",
                    reference["outputs"]["file"].as_str().unwrap_or("?"),
                    reference["note"]
                        .as_str()
                        .map(|n| format!(" ({n})"))
                        .unwrap_or_default()
                ),
                (None, Some(why)) => format!("none: {why}"),
                _ => "none".to_owned(),
            }
        );
    }
    for (name, p) in j["profiles"].as_object().into_iter().flatten() {
        let _ = writeln!(
            out,
            "profile {name} = {}:{}:{}",
            p["min"], p["opt"], p["max"]
        );
    }
    let plugins = j["plugins"].as_array().cloned().unwrap_or_default();
    if plugins.is_empty() {
        let _ = writeln!(out, "plugins: none (every node is a TensorRT parser op)");
    } else {
        let _ = writeln!(
            out,
            "plugins: {} ({}, built by {})",
            plugins.len(),
            j["plugin_library"]["library"].as_str().unwrap_or("?"),
            j["plugin_library"]["build"].as_str().unwrap_or("?")
        );
        for p in &plugins {
            let nodes: Vec<&str> = p["nodes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|n| n.as_str())
                .collect();
            let _ = writeln!(
                out,
                "  {} v{} ({} node{}): {}\n    why: {}\n    nodes: {}",
                p["name"].as_str().unwrap_or("?"),
                p["version"].as_str().unwrap_or("?"),
                nodes.len(),
                if nodes.len() == 1 { "" } else { "s" },
                p["what"].as_str().unwrap_or("?"),
                p["why"].as_str().unwrap_or("?"),
                nodes.join(", ")
            );
        }
    }
    let findings = j["findings"].as_array().cloned().unwrap_or_default();
    if findings.is_empty() {
        let _ = writeln!(out, "TensorRT rules: no finding");
    } else {
        let _ = writeln!(out, "TensorRT will refuse {} node(s):", findings.len());
        for f in &findings {
            let _ = writeln!(
                out,
                "  {}: {}",
                f["node"].as_str().unwrap_or("?"),
                f["message"].as_str().unwrap_or("?")
            );
        }
    }
    Ok((text, out))
}
