//! The reference runner: a package's models as one pipeline in the interpreter (the CPU
//! implementation that defines every op's results). `mmq run DIR` is [`Package::run`],
//! `mmq generate DIR` is [`Package::generate`]; `mmq.Pipeline` runs the same packages on ONNX
//! Runtime and must agree with it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use mmq_ir::{GraphId, Link, Module};
use mmq_kernels::{Interpreter, RtValue, Tensor};

use crate::spec::PipelineSpec;
use crate::{DeployError, PIPELINE_JSON};

/// An opened package: its spec and its models as one module.
#[derive(Debug)]
pub struct Package {
    /// The package directory.
    pub dir: PathBuf,
    /// `pipeline.json`.
    pub spec: PipelineSpec,
    /// The stages' graphs, in stage order, linked as the bindings say.
    pub module: Module,
    graphs: Vec<GraphId>,
}

/// One output of a pipeline run.
#[derive(Clone, Debug)]
pub struct StageOutput {
    /// The stage that computed it.
    pub stage: String,
    /// The output's name.
    pub name: String,
    /// Its value.
    pub value: RtValue,
}

/// Whether `dir` is a package (holds `pipeline.json`).
pub fn is_package(dir: &Path) -> bool {
    dir.is_dir() && dir.join(PIPELINE_JSON).is_file()
}

fn tensor(v: &RtValue, what: &str) -> Result<std::sync::Arc<Tensor>, DeployError> {
    v.as_tensor()
        .cloned()
        .ok_or_else(|| DeployError::Invalid(format!("{what} is not a tensor")))
}

impl Package {
    /// Opens the package in `dir`: reads `pipeline.json`, checks every file against its hash,
    /// and loads the stages.
    pub fn open(dir: &Path) -> Result<Package, DeployError> {
        let path = dir.join(PIPELINE_JSON);
        if !dir.is_dir() {
            return Err(DeployError::Invalid(format!(
                "{}: not a directory; a package is a directory holding {PIPELINE_JSON}",
                dir.display()
            )));
        }
        mmq_ir::check_regular_file(&path).map_err(|e| {
            DeployError::Invalid(format!(
                "{}: not a package: {PIPELINE_JSON}: {e} (`mmq compile MODEL... --package -o \
                 DIR` writes one)",
                dir.display()
            ))
        })?;
        let text = std::fs::read_to_string(&path).map_err(|e| DeployError::io(&path, e))?;
        let spec: PipelineSpec = serde_json::from_str(&text).map_err(|e| {
            DeployError::Invalid(format!(
                "{}: line {}, column {}: {e}",
                path.display(),
                e.line(),
                e.column()
            ))
        })?;
        if spec.format != crate::spec::FORMAT || spec.version != crate::spec::VERSION {
            return Err(DeployError::Invalid(format!(
                "{}: format '{}' version {}; this mmq reads '{}' version {}",
                path.display(),
                spec.format,
                spec.version,
                crate::spec::FORMAT,
                crate::spec::VERSION
            )));
        }
        if spec.stages.is_empty() {
            return Err(DeployError::Invalid(format!(
                "{}: the package has no stage",
                path.display()
            )));
        }
        let mut paths = Vec::new();
        for stage in &spec.stages {
            for f in &stage.files {
                plain_name(dir, &f.file)?;
            }
            // The model loaded is one of the files checked.
            if !stage.files.iter().any(|f| f.file == stage.file) {
                return Err(DeployError::Invalid(format!(
                    "{}: stage '{}' loads '{}', which is not among its hashed files",
                    path.display(),
                    stage.name,
                    stage.file
                )));
            }
            for f in &stage.files {
                check_file(dir, f)?;
            }
            paths.push(dir.join(&stage.file));
        }
        if let Some(f) = &spec.tokenizer {
            check_file(dir, f)?;
        }
        let refs: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
        let mut module = mmq_onnx::load_files(&refs, &mmq_onnx::LoadOptions::default())
            .map_err(|e| DeployError::Invalid(e.to_string()))?;
        let graphs: Vec<GraphId> = module.entries.iter().map(|e| e.graph).collect();
        let index = |stage: &str| spec.stages.iter().position(|s| s.name == stage);
        for b in &spec.bindings {
            let (Some(from), Some(to)) = (index(&b.from.stage), index(&b.to.stage)) else {
                return Err(DeployError::Invalid(format!(
                    "{}: a binding names stage '{}' or '{}', which the package does not have",
                    path.display(),
                    b.from.stage,
                    b.to.stage
                )));
            };
            if from >= to {
                return Err(DeployError::Invalid(format!(
                    "{}: stage '{}' feeds '{}', which runs before it",
                    path.display(),
                    b.from.stage,
                    b.to.stage
                )));
            }
            let port = |g: GraphId, name: &str, outputs: bool| {
                let gd = &module.graphs[g];
                let list = if outputs { &gd.outputs } else { &gd.inputs };
                list.iter()
                    .position(|&v| module.values[v].name.as_deref() == Some(name))
                    .map(|i| i as u32)
            };
            let (Some(out), Some(inp)) = (
                port(graphs[from], &b.from.port, true),
                port(graphs[to], &b.to.port, false),
            ) else {
                return Err(DeployError::Invalid(format!(
                    "{}: binding {}.{} -> {}.{}: no such output or input",
                    path.display(),
                    b.from.stage,
                    b.from.port,
                    b.to.stage,
                    b.to.port
                )));
            };
            module.links.push(Link {
                from: (graphs[from], out),
                to: (graphs[to], inp),
            });
        }
        Ok(Package {
            dir: dir.to_owned(),
            spec,
            module,
            graphs,
        })
    }

    fn stage_index(&self, name: &str) -> Option<usize> {
        self.spec.stages.iter().position(|s| s.name == name)
    }

    /// Runs one stage: its inputs from `bound` (earlier stages' outputs, by binding) or from
    /// `feeds` by name.
    fn run_stage(
        &self,
        interp: &Interpreter<'_>,
        i: usize,
        feeds: &HashMap<String, RtValue>,
        bound: &HashMap<(usize, String), RtValue>,
    ) -> Result<Vec<(String, RtValue)>, DeployError> {
        let stage = &self.spec.stages[i];
        let mut inputs = HashMap::new();
        for port in &stage.inputs {
            let from_binding = self
                .spec
                .bindings
                .iter()
                .find(|b| b.to.stage == stage.name && b.to.port == port.name)
                .and_then(|b| {
                    let from = self.stage_index(&b.from.stage)?;
                    bound.get(&(from, b.from.port.clone()))
                });
            let value = from_binding
                .or_else(|| feeds.get(&port.name))
                .ok_or_else(|| {
                    let mut have: Vec<&str> = feeds.keys().map(String::as_str).collect();
                    have.sort_unstable();
                    DeployError::Invalid(format!(
                        "stage '{}': input {} is not given (given: {})",
                        stage.name,
                        port.describe(),
                        if have.is_empty() {
                            "nothing".to_owned()
                        } else {
                            have.join(", ")
                        }
                    ))
                })?;
            inputs.insert(port.name.clone(), value.clone());
        }
        interp
            .run(self.graphs[i], &inputs)
            .map_err(|e| DeployError::Invalid(format!("stage '{}': {e}", stage.name)))
    }

    /// One forward pass of the whole pipeline: every stage in order, each input taken from the
    /// output bound to it or from `feeds` by name. Returns every stage's outputs.
    pub fn run(&self, feeds: &HashMap<String, RtValue>) -> Result<Vec<StageOutput>, DeployError> {
        let interp = Interpreter::new(&self.module);
        let mut bound = HashMap::new();
        let mut out = Vec::new();
        for i in 0..self.spec.stages.len() {
            for (name, value) in self.run_stage(&interp, i, feeds, &bound)? {
                bound.insert((i, name.clone()), value.clone());
                out.push(StageOutput {
                    stage: self.spec.stages[i].name.clone(),
                    name,
                    value,
                });
            }
        }
        Ok(out)
    }

    /// Greedy generation: the stages before the decoder run once on `images` (the image
    /// inputs, by name), then the decoder runs on `prompt` and on each new token (feeding its
    /// KV cache back, or the whole sequence again when it has none) until `max_new_tokens`, an
    /// end-of-sequence token or the context length. A decoder with a KV cache reads the image
    /// features with the prompt and none (token dim 0) at later steps; the prompt holds the
    /// placeholder tokens the model expects for them. `on_token` sees each new token as it
    /// comes.
    pub fn generate(
        &self,
        prompt: &[i64],
        images: &HashMap<String, RtValue>,
        max_new_tokens: usize,
        mut on_token: impl FnMut(i64),
    ) -> Result<Vec<i64>, DeployError> {
        let generation = self.spec.generation.as_ref().ok_or_else(|| {
            DeployError::Invalid(
                "the package has no decoder stage (an input_ids input and a logits output)"
                    .to_owned(),
            )
        })?;
        if prompt.is_empty() {
            return Err(DeployError::Invalid("the prompt holds no token".to_owned()));
        }
        if prompt.len() as u64 >= generation.context_length {
            return Err(DeployError::Invalid(format!(
                "the prompt of {} tokens leaves no room in the context length of {}",
                prompt.len(),
                generation.context_length
            )));
        }
        let dec = self
            .stage_index(&generation.stage)
            .ok_or_else(|| DeployError::Invalid(format!("no stage '{}'", generation.stage)))?;
        let interp = Interpreter::new(&self.module);
        let mut bound = HashMap::new();
        for i in 0..dec {
            for (name, value) in self.run_stage(&interp, i, images, &bound)? {
                bound.insert((i, name), value);
            }
        }
        let kv = self
            .spec
            .kv_cache
            .as_ref()
            .filter(|k| k.stage == generation.stage);
        // With a KV cache the features enter with the prompt; later steps read none (the token
        // dim 0), as LLaVA-style decoders take them.
        let no_features: HashMap<(usize, String), RtValue> = if kv.is_some() {
            bound
                .iter()
                .map(|(k, v)| Ok((k.clone(), no_tokens(v)?)))
                .collect::<Result<_, DeployError>>()?
        } else {
            HashMap::new()
        };
        let mut cache: HashMap<String, RtValue> = HashMap::new();
        if let Some(kv) = kv {
            let g = self.graphs[dec];
            for p in &kv.pairs {
                for name in std::iter::once(&p.past).chain(&p.past_scale) {
                    cache.insert(name.clone(), empty_input(&self.module, g, name)?);
                }
            }
        }
        let context = generation.context_length as usize;
        let mut tokens = prompt.to_vec();
        let mut new = Vec::new();
        let mut done = 0usize; // tokens already in the KV cache
        let int = |shape: Vec<usize>, v: Vec<i64>| {
            Tensor::from_i64(shape, v)
                .map(RtValue::from)
                .map_err(|e| DeployError::Invalid(e.to_string()))
        };
        while new.len() < max_new_tokens && tokens.len() < context {
            let step: Vec<i64> = if kv.is_some() {
                tokens[done..].to_vec()
            } else {
                tokens.clone()
            };
            let past = if kv.is_some() { done } else { 0 };
            let mut feeds = images.clone();
            feeds.extend(cache.iter().map(|(k, v)| (k.clone(), v.clone())));
            feeds.insert(
                generation.input_ids.clone(),
                int(vec![1, step.len()], step.clone())?,
            );
            if let Some(mask) = &generation.attention_mask {
                let n = past + step.len();
                feeds.insert(mask.clone(), int(vec![1, n], vec![1; n])?);
            }
            if let Some(pos) = &generation.position_ids {
                let p = (past as i64..(past + step.len()) as i64).collect();
                feeds.insert(pos.clone(), int(vec![1, step.len()], p)?);
            }
            let features = if kv.is_some() && done > 0 {
                &no_features
            } else {
                &bound
            };
            let outputs = self.run_stage(&interp, dec, &feeds, features)?;
            let mut next = None;
            for (name, value) in outputs {
                if name == generation.logits {
                    next = Some(last_argmax(&value, generation.vocab_size as usize)?);
                } else if let Some(kv) = kv {
                    for p in &kv.pairs {
                        if p.present == name {
                            cache.insert(p.past.clone(), value.clone());
                        } else if p.present_scale.as_deref() == Some(name.as_str())
                            && let Some(s) = &p.past_scale
                        {
                            cache.insert(s.clone(), value.clone());
                        }
                    }
                }
            }
            let next = next.ok_or_else(|| {
                DeployError::Invalid(format!("the decoder computed no '{}'", generation.logits))
            })?;
            done = tokens.len();
            tokens.push(next);
            new.push(next);
            on_token(next);
            if generation.eos_token_id.contains(&next) {
                break;
            }
        }
        Ok(new)
    }
}

/// `v` with no token: dim 1 (`[batch, tokens, ...]`) of size 0.
fn no_tokens(v: &RtValue) -> Result<RtValue, DeployError> {
    let t = tensor(v, "an image feature")?;
    let mut shape = t.shape.clone();
    if shape.len() >= 2 {
        shape[1] = 0;
    }
    Tensor::zeros(t.dtype, shape)
        .map(RtValue::from)
        .map_err(|e| DeployError::Invalid(e.to_string()))
}

/// A zero-token value for cache input `name` of graph `g`: batch 1, every symbolic dim 0.
fn empty_input(m: &Module, g: GraphId, name: &str) -> Result<RtValue, DeployError> {
    let v = m.graphs[g]
        .inputs
        .iter()
        .copied()
        .find(|&v| m.values[v].name.as_deref() == Some(name))
        .ok_or_else(|| DeployError::Invalid(format!("no cache input '{name}'")))?;
    let ty = m.value_type(v);
    let (Some(dtype), Some(shape)) = (ty.dtype(), ty.shape()) else {
        return Err(DeployError::Invalid(format!(
            "cache input '{name}' has no tensor type"
        )));
    };
    let dims = shape
        .iter()
        .enumerate()
        .map(|(i, d)| {
            if i == 0 {
                1
            } else {
                d.as_known().map_or(0, |n| n.max(0) as usize)
            }
        })
        .collect();
    Tensor::zeros(dtype, dims)
        .map(RtValue::from)
        .map_err(|e| DeployError::Invalid(format!("cache input '{name}': {e}")))
}

/// The arg-max of the last position's row of `logits` (`[1, tokens, vocab]`); ties go to the
/// lowest token, as numpy's `argmax`.
fn last_argmax(logits: &RtValue, vocab: usize) -> Result<i64, DeployError> {
    let t = tensor(logits, "the logits")?;
    let values = t
        .to_f64()
        .map_err(|e| DeployError::Invalid(format!("the logits: {e}")))?;
    if vocab == 0 || values.len() < vocab {
        return Err(DeployError::Invalid(format!(
            "the logits hold {} values, less than one row of {vocab}",
            values.len()
        )));
    }
    let row = &values[values.len() - vocab..];
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] || (row[best].is_nan() && !x.is_nan()) {
            best = i;
        }
    }
    Ok(best as i64)
}

/// Fails unless `file` is a relative path of plain components (inside the package).
fn plain_name<'a>(dir: &Path, file: &'a str) -> Result<&'a Path, DeployError> {
    let rel = Path::new(file);
    if rel.is_absolute()
        || rel
            .components()
            .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return Err(DeployError::Invalid(format!(
            "{}: file '{file}' is not a plain name inside the package",
            dir.display()
        )));
    }
    Ok(rel)
}

fn check_file(dir: &Path, f: &crate::spec::FileEntry) -> Result<(), DeployError> {
    let rel = plain_name(dir, &f.file)?;
    let got = crate::hash_file(dir, &f.file)?;
    let (bytes, sha) = (got.bytes, got.sha256);
    if bytes != f.bytes || sha != f.sha256 {
        return Err(DeployError::Invalid(format!(
            "{}: {bytes} bytes with SHA-256 {sha}; {PIPELINE_JSON} says {} bytes with {}: the \
             file changed after the package was written",
            dir.join(rel).display(),
            f.bytes,
            f.sha256
        )));
    }
    Ok(())
}
