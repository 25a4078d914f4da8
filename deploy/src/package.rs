//! Writing a package: the compiled models, `pipeline.json`, and `genai_config.json` where the
//! package fits onnxruntime-genai's decoder contract.

use std::path::{Path, PathBuf};

use mmq_ir::modality::Modality;
use mmq_ir::{GraphId, Module};
use mmq_kernels::cache::CacheFormat;

use crate::describe::{self, GenerationConfig};
use crate::spec::{Binding, Endpoint, Genai, PipelineSpec, Role, Stage};
use crate::{DeployError, GENAI_CONFIG, PIPELINE_JSON, genai, hash_file};

/// What a package is written with besides the module.
#[derive(Clone, Debug, Default)]
pub struct PackageOptions {
    /// The target the module was compiled for (`ort`).
    pub target: String,
    /// The KV cache's code format, when the compile quantized it.
    pub kv_cache: Option<CacheFormat>,
    /// The image features' code format, when the compile quantized them.
    pub image_cache: Option<CacheFormat>,
    /// Generation settings the models do not hold.
    pub generation: GenerationConfig,
    /// A `tokenizer.json` to copy into the package (with a `tokenizer_config.json` beside it,
    /// when there is one).
    pub tokenizer: Option<PathBuf>,
    /// The cache pool's plan, when one was made.
    pub cache_plan: Option<serde_json::Value>,
    /// Modality overrides (input name, label).
    pub modality: Vec<(String, Modality)>,
}

/// A written package.
#[derive(Clone, Debug)]
pub struct Written {
    /// Every file written, the models first.
    pub files: Vec<PathBuf>,
    /// What `pipeline.json` says.
    pub spec: PipelineSpec,
}

/// Writes `m` (compiled) as a package into directory `dir`: one ONNX file per entry graph
/// (named after `inputs` when there is one file per graph, else after the graphs), then
/// `genai_config.json` where it fits, the tokenizer, and `pipeline.json` last (a directory
/// without it is no package).
pub fn write_package(
    m: &Module,
    inputs: &[PathBuf],
    dir: &Path,
    options: &PackageOptions,
) -> Result<Written, DeployError> {
    if dir.exists() && !dir.is_dir() {
        return Err(DeployError::Invalid(format!(
            "cannot write the package to {}: it is a file, not a directory",
            dir.display()
        )));
    }
    std::fs::create_dir_all(dir).map_err(|e| DeployError::io(dir, e))?;
    let stems =
        mmq_backend_ort::entry_stems(m, inputs).map_err(|e| DeployError::Invalid(e.to_string()))?;
    let graphs: Vec<GraphId> = m.entries.iter().map(|e| e.graph).collect();
    let mut files = Vec::new();
    let mut stages = Vec::new();
    for (&g, stem) in graphs.iter().zip(&stems) {
        let file = format!("{stem}.onnx");
        let path = dir.join(&file);
        let report = mmq_backend_ort::write_model(
            m,
            g,
            &path,
            &mmq_backend_ort::ExportOptions::default(),
        )
        .map_err(|e| DeployError::Invalid(format!("cannot write {}: {e}", path.display())))?;
        let mut entries = vec![hash_file(dir, &file)?];
        files.push(path);
        if let Some(data) = &report.data_path {
            let rel = data
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            entries.push(hash_file(dir, &rel)?);
            files.push(data.clone());
        }
        let gd = &m.graphs[g];
        stages.push(Stage {
            name: stem.clone(),
            file,
            role: describe::role(m, g, &options.modality),
            inputs: gd.inputs.iter().map(|&v| describe::port(m, v)).collect(),
            outputs: gd.outputs.iter().map(|&v| describe::port(m, v)).collect(),
            files: entries,
        });
    }
    let mut bindings: Vec<Binding> = m
        .links
        .iter()
        .filter_map(|l| {
            let from = graphs.iter().position(|&g| g == l.from.0)?;
            let to = graphs.iter().position(|&g| g == l.to.0)?;
            Some(Binding {
                from: Endpoint {
                    stage: stages[from].name.clone(),
                    port: describe::name(m, *m.graphs[l.from.0].outputs.get(l.from.1 as usize)?),
                },
                to: Endpoint {
                    stage: stages[to].name.clone(),
                    port: describe::name(m, *m.graphs[l.to.0].inputs.get(l.to.1 as usize)?),
                },
            })
        })
        .collect();
    // An input of a later stage named like an output of an earlier one reads it (the scales
    // `--image-cache` adds beside the features, a pipeline exported as several files).
    for (to, stage) in stages.iter().enumerate() {
        for input in &stage.inputs {
            if bindings
                .iter()
                .any(|b| b.to.stage == stage.name && b.to.port == input.name)
            {
                continue;
            }
            let from = stages[..to]
                .iter()
                .rev()
                .find(|s| s.outputs.iter().any(|o| o.name == input.name));
            if let Some(from) = from {
                bindings.push(Binding {
                    from: Endpoint {
                        stage: from.name.clone(),
                        port: input.name.clone(),
                    },
                    to: Endpoint {
                        stage: stage.name.clone(),
                        port: input.name.clone(),
                    },
                });
            }
        }
    }
    let mut kv = None;
    let mut generation = None;
    let mut image = None;
    for (i, &g) in graphs.iter().enumerate() {
        let stage = &stages[i];
        match stage.role {
            Role::Decoder if generation.is_none() => {
                generation = describe::generation(m, g, &stage.name, &options.generation);
                kv = describe::kv_cache(m, g, &stage.name, options.kv_cache)
                    .map_err(|e| DeployError::Invalid(format!("stage '{}': {e}", stage.name)))?;
            }
            Role::VisionEncoder if image.is_none() => {
                image = describe::image_cache(m, g, &stage.name, options.image_cache);
            }
            _ => {}
        }
    }
    let genai = match genai::config(m, &graphs, &stages, kv.as_ref(), generation.as_ref()) {
        Ok(config) => {
            let text = serde_json::to_string_pretty(&config)
                .map_err(|e| DeployError::Invalid(e.to_string()))?;
            let path = dir.join(GENAI_CONFIG);
            mmq_ir::fsio::write_atomic(&path, (text + "\n").as_bytes())
                .map_err(|e| DeployError::io(&path, e))?;
            files.push(path);
            Genai {
                config: Some(GENAI_CONFIG.to_owned()),
                reason: None,
            }
        }
        Err(reason) => Genai {
            config: None,
            reason: Some(reason),
        },
    };
    let mut tokenizer = None;
    if let Some(src) = &options.tokenizer {
        mmq_ir::check_regular_file(src).map_err(|e| DeployError::io(src, e))?;
        let bytes = std::fs::read(src).map_err(|e| DeployError::io(src, e))?;
        let target = dir.join("tokenizer.json");
        mmq_ir::fsio::write_atomic(&target, &bytes).map_err(|e| DeployError::io(&target, e))?;
        files.push(target);
        tokenizer = Some(hash_file(dir, "tokenizer.json")?);
        let beside = src.with_file_name("tokenizer_config.json");
        if beside.is_file() {
            let bytes = std::fs::read(&beside).map_err(|e| DeployError::io(&beside, e))?;
            let target = dir.join("tokenizer_config.json");
            mmq_ir::fsio::write_atomic(&target, &bytes).map_err(|e| DeployError::io(&target, e))?;
            files.push(target);
        }
    }
    let spec = PipelineSpec {
        format: crate::spec::FORMAT.to_owned(),
        version: crate::spec::VERSION,
        target: options.target.clone(),
        stages,
        bindings,
        kv_cache: kv,
        image_cache: image,
        cache_plan: options.cache_plan.clone(),
        generation,
        onnxruntime_genai: genai,
        tokenizer,
    };
    let text =
        serde_json::to_string_pretty(&spec).map_err(|e| DeployError::Invalid(e.to_string()))?;
    let path = dir.join(PIPELINE_JSON);
    mmq_ir::fsio::write_atomic(&path, (text + "\n").as_bytes())
        .map_err(|e| DeployError::io(&path, e))?;
    files.push(path);
    Ok(Written { files, spec })
}
