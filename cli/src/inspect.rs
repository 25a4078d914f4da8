//! `mmq inspect`: the `.mmir` dump, a JSON summary, a DOT graph, statistics.

use std::fmt::Write;
use std::path::PathBuf;

use mmq_compiler::inspect::{op_counts, op_key, summary_json, weight_bytes_by_dtype};
use mmq_compiler::load;
use mmq_ir::modality::Modality;
use mmq_ir::text::type_text;
use mmq_ir::{Module, Value, ValueDef};
use serde_json::json;

use crate::Format;
use crate::failure::Failure;
use crate::modality;

/// What `inspect` prints besides the module.
pub struct InspectOptions {
    /// Node counts per op, weight bytes per dtype and per modality.
    pub stats: bool,
    /// Source node names as `loc("...")`.
    pub loc: bool,
    /// Each node's modality label as a trailing comment.
    pub labels: bool,
    /// `--modality INPUT=KIND` overrides.
    pub modality: Vec<(String, Modality)>,
    /// Every constant printed with its values.
    pub weights: bool,
}

/// Runs `inspect` and returns what to print.
pub fn run(inputs: &[PathBuf], format: Format, o: &InspectOptions) -> Result<String, Failure> {
    let module = match inputs {
        [dir] if dir.is_dir() => {
            if dir.join("manifest.json").is_file() {
                return package(dir, format);
            }
            if !dir.join(mmq_deploy::PIPELINE_JSON).is_file() {
                return Err(Failure::user(format!(
                    "error: {}: it is a directory, not a regular file or a package: `mmq \
                     inspect` reads model files (.onnx, .mmir), a TensorRT package (a directory \
                     with manifest.json, from `mmq compile --target trt`) or a deployment package \
                     (a directory with {}, from `mmq compile --package`), and it holds neither\n",
                    dir.display(),
                    mmq_deploy::PIPELINE_JSON
                )));
            }
            // A deployment package: its stages' graphs, linked as its bindings say.
            mmq_deploy::Package::open(dir)
                .map_err(|e| Failure::user(format!("error: {e}\n")))?
                .module
        }
        _ => load::load(inputs)?.module,
    };
    let m = &module;
    let labels = if o.stats || o.labels || !o.modality.is_empty() {
        modality::analyze_all(m, &o.modality)?
    } else {
        Vec::new()
    };
    Ok(match format {
        Format::Text => {
            let mut opts = mmq_ir::text::PrintOptions {
                loc: o.loc,
                node_notes: if o.labels {
                    modality::node_notes(&labels)
                } else {
                    Default::default()
                },
                ..Default::default()
            };
            if o.weights {
                opts.inline_limit = usize::MAX;
            }
            let mut out = mmq_ir::text::print_with(m, &opts);
            if o.stats {
                out.push_str(&stats_text(m));
                out.push_str(&modality::stats_text(m, &labels, human_bytes));
            }
            out
        }
        Format::Json => {
            let mut j = summary_json(m);
            if o.stats {
                j["weight_bytes_by_dtype"] = json!(weight_bytes_by_dtype(m));
                j["modality"] = modality::stats_json(m, &labels);
            }
            let mut s = serde_json::to_string_pretty(&j).unwrap_or_default();
            s.push('\n');
            s
        }
        Format::Dot => dot(m),
    })
}

fn human_bytes(n: u64) -> String {
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

fn stats_text(m: &Module) -> String {
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

fn dot(m: &Module) -> String {
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
        for (i, &n) in g.nodes.iter().enumerate() {
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

/// A TensorRT package (`mmq compile --target trt`): its manifest (`--format json`), or a summary
/// of its models, profiles, quantization, plugins and what TensorRT would refuse.
fn package(dir: &std::path::Path, format: Format) -> Result<String, Failure> {
    let path = dir.join("manifest.json");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| Failure::user(format!("error: {}: {e}\n", path.display())))?;
    let j: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Failure::user(format!("error: {}: not JSON: {e}\n", path.display())))?;
    if j["format"] != "mmq-tensorrt-package" {
        return Err(Failure::user(format!(
            "error: {}: not an mmq TensorRT package manifest\n",
            path.display()
        )));
    }
    if matches!(format, Format::Json) {
        return Ok(text);
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
    Ok(out)
}
