//! `mmq inspect`: the `.mmir` dump, a JSON summary, a DOT graph, statistics.

use std::path::PathBuf;

use mmq_compiler::inspect::{summary_json, weight_bytes_by_dtype};
use mmq_compiler::{load, render};
use mmq_ir::modality::Modality;
use serde_json::json;

use crate::Format;
use crate::failure::Failure;

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
                let (manifest, summary) = mmq_compiler::render::trt_package(dir)
                    .map_err(|e| Failure::user(format!("error: {e}\n")))?;
                return Ok(match format {
                    Format::Json => manifest,
                    _ => summary,
                });
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
        render::labels(m, &o.modality).map_err(|e| Failure::user(format!("error: {e}\n")))?
    } else {
        Vec::new()
    };
    Ok(match format {
        Format::Text => {
            let mut opts = mmq_ir::text::PrintOptions {
                loc: o.loc,
                node_notes: if o.labels {
                    render::node_notes(&labels)
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
                out.push_str(&render::stats_text(m));
                out.push_str(&render::modality_text(m, &labels));
            }
            out
        }
        Format::Json => {
            let mut j = summary_json(m);
            if o.stats {
                j["weight_bytes_by_dtype"] = json!(weight_bytes_by_dtype(m));
                j["modality"] = render::modality_json(m, &labels);
            }
            let mut s = serde_json::to_string_pretty(&j).unwrap_or_default();
            s.push('\n');
            s
        }
        Format::Dot => render::dot(m),
    })
}
