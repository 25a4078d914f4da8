//! Writing a compiled module: one ONNX file per entry graph, each written atomically.

use std::path::{Path, PathBuf};

use mmq_backend_ort::ExportOptions;
use mmq_ir::Module;

/// Writing failed: what and where.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ExportError(pub String);

/// Checks, before any work, that the models of several `inputs` go to the directory `output`
/// under distinct names, none of them an input.
pub fn check_distinct_outputs(inputs: &[PathBuf], output: &Path) -> Result<(), ExportError> {
    mmq_backend_ort::check_distinct_stems(inputs).map_err(|e| ExportError(e.to_string()))?;
    let canonical: Vec<Option<PathBuf>> = inputs.iter().map(|p| p.canonicalize().ok()).collect();
    for p in inputs {
        let Some(stem) = p.file_stem() else { continue };
        let target = output.join(format!("{}.onnx", stem.to_string_lossy()));
        if let Ok(t) = target.canonicalize()
            && canonical.contains(&Some(t))
        {
            return Err(ExportError(format!(
                "writing the models into {} would overwrite the input {}; choose another \
                 output directory",
                output.display(),
                target.display()
            )));
        }
    }
    Ok(())
}

/// Checks, before any work, that a single output can be written at `output`: its directory
/// exists, and it is a regular file or a new path ([`mmq_ir::check_output_file`]).
pub fn check_output(output: &Path) -> Result<(), ExportError> {
    mmq_ir::check_output_file(output)
        .map_err(|e| ExportError(format!("cannot write {}: {e}", output.display())))?;
    let dir = match output.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(ExportError(format!(
            "cannot write {}: the directory {} does not exist",
            output.display(),
            dir.display()
        )));
    }
    Ok(())
}

/// Writes `m`: its one entry graph to the file `output`, or, with several entry graphs, one
/// file per graph into the directory `output`, named after `inputs` (the files they were
/// loaded from) or the graph. Returns the files written.
pub fn write(m: &Module, inputs: &[PathBuf], output: &Path) -> Result<Vec<PathBuf>, ExportError> {
    write_referencing(m, inputs, output, &[])
}

/// [`write`], with the tensors of `references` written as references into the files that
/// already hold them (a quantization-parameter table beside the models).
pub fn write_referencing(
    m: &Module,
    inputs: &[PathBuf],
    output: &Path,
    references: &[(String, mmq_backend_ort::ExternalLocation)],
) -> Result<Vec<PathBuf>, ExportError> {
    let options = ExportOptions {
        references: references.to_vec(),
        ..ExportOptions::default()
    };
    match m.entries.as_slice() {
        [] => Err(ExportError("the module has no graph".to_owned())),
        [entry] => {
            write_graph(m, entry.graph, output, &options)?;
            Ok(vec![output.to_owned()])
        }
        entries => {
            std::fs::create_dir_all(output).map_err(|e| {
                ExportError(format!("cannot create directory {}: {e}", output.display()))
            })?;
            let stems =
                mmq_backend_ort::entry_stems(m, inputs).map_err(|e| ExportError(e.to_string()))?;
            let mut written = Vec::new();
            for (entry, stem) in entries.iter().zip(stems) {
                let path = output.join(format!("{stem}.onnx"));
                write_graph(m, entry.graph, &path, &options)?;
                written.push(path);
            }
            Ok(written)
        }
    }
}

fn write_graph(
    m: &Module,
    graph: mmq_ir::GraphId,
    path: &Path,
    options: &ExportOptions,
) -> Result<(), ExportError> {
    mmq_backend_ort::write_model(m, graph, path, options)
        .map(|_| ())
        .map_err(|e| ExportError(format!("cannot write {}: {e}", path.display())))
}

/// Writes `m` (compiled for the `trt` target) as a TensorRT package into the directory `output`
/// (see [`mmq_backend_trt::write_package`]).
pub fn write_trt(
    m: &Module,
    inputs: &[PathBuf],
    output: &Path,
    options: &mmq_backend_trt::PackageOptions,
) -> Result<mmq_backend_trt::Package, ExportError> {
    if output.exists() && !output.is_dir() {
        return Err(ExportError(format!(
            "cannot write the TensorRT package to {}: it is a file, not a directory",
            output.display()
        )));
    }
    let mut options = options.clone();
    if options.references.is_empty() {
        // Symbols at the profile's opt point: the shapes the engine is tuned for.
        let opt: std::collections::HashMap<String, i64> =
            m.symbols
                .iter()
                .map(|(_, sd)| {
                    let p = options.profiles.get(&sd.name).copied().unwrap_or_else(|| {
                        mmq_backend_trt::default_profile(&sd.name, sd.min, sd.max)
                    });
                    (sd.name.clone(), p.opt)
                })
                .collect();
        // Where the opt point does not run (a symbol past what the model supports, such as a
        // sequence longer than its position table), the small values calibration draws.
        options.references = m
            .entries
            .iter()
            .map(|e| {
                reference(m, e.graph, opt.clone()).or_else(|at_opt| {
                    let mut r = reference(m, e.graph, Default::default())?;
                    r.note = Some(format!(
                        "the reference interpreter cannot run at the profiles' opt point \
                         ({at_opt}): the profiles are probably too large for this model (set \
                         them with --symbol); reference inputs drawn at small sizes instead"
                    ));
                    Ok(r)
                })
            })
            .collect();
    }
    mmq_backend_trt::write_package(m, inputs, output, &options)
        .map_err(|e| ExportError(e.to_string()))
}

/// One random sample (seed 0, drawn as calibration draws them, symbols at `opt`) of `graph`'s
/// inputs and the reference interpreter's outputs on it.
fn reference(
    m: &Module,
    graph: mmq_ir::GraphId,
    opt: std::collections::HashMap<String, i64>,
) -> Result<mmq_backend_trt::Reference, String> {
    let sample = mmq_passes::quant::calibrate::random_samples_bound(m, graph, 1, 0, opt)
        .map_err(|e| e.to_string())?
        .next()
        .ok_or("no sample")?
        .map_err(|e| e.to_string())?;
    let outputs = mmq_kernels::Interpreter::new(m)
        .run(graph, &sample)
        .map_err(|e| e.to_string())?;
    let tensors = |v: Vec<(String, mmq_kernels::RtValue)>| -> Vec<(String, mmq_kernels::Tensor)> {
        v.into_iter()
            .filter_map(|(n, v)| v.as_tensor().map(|t| (n, (**t).clone())))
            .collect()
    };
    let mut inputs: Vec<(String, mmq_kernels::RtValue)> = sample.into_iter().collect();
    inputs.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(mmq_backend_trt::Reference {
        inputs: tensors(inputs),
        outputs: tensors(outputs),
        note: None,
    })
}

/// What a deployment package holds besides the compiled module (`--package`).
#[derive(Clone, Debug, Default)]
pub struct PackageSettings {
    /// Generation settings (`--generation-config`).
    pub generation: mmq_deploy::GenerationConfig,
    /// A `tokenizer.json` to copy in (`--tokenizer`).
    pub tokenizer: Option<PathBuf>,
}

/// Writes `m`, compiled with `options`, as a deployment package into the directory `output`
/// (see [`mmq_deploy::write_package`]): the models, `pipeline.json` and, where the package fits
/// onnxruntime-genai's decoder contract, `genai_config.json`.
pub fn write_package(
    m: &Module,
    inputs: &[PathBuf],
    output: &Path,
    options: &crate::CompileOptions,
    settings: &PackageSettings,
) -> Result<mmq_deploy::Written, ExportError> {
    let package = mmq_deploy::PackageOptions {
        target: options.target.name().to_owned(),
        kv_cache: options.kv_cache,
        image_cache: options.image_cache,
        generation: settings.generation.clone(),
        tokenizer: settings.tokenizer.clone(),
        cache_plan: crate::cache_plan::package_plan(
            m,
            options,
            settings
                .generation
                .context_length
                .unwrap_or(mmq_deploy::DEFAULT_CONTEXT_LENGTH),
        )
        .and_then(|p| serde_json::to_value(p).ok()),
        modality: options.modality.clone(),
    };
    mmq_deploy::write_package(m, inputs, output, &package).map_err(|e| ExportError(e.to_string()))
}
