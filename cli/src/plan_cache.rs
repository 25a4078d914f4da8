//! `mmq plan-cache`: the cache pool layout of a set of models.

use std::path::PathBuf;

use mmq_compiler::cache_plan::{PlanOptions, plan_module};
use mmq_compiler::load;

use crate::failure::Failure;

/// Plans the pool; returns the summary for stdout and writes the JSON plan to `output`.
pub fn run(
    inputs: &[PathBuf],
    options: &PlanOptions,
    output: Option<&std::path::Path>,
) -> Result<String, Failure> {
    if let Some(out) = output {
        crate::check_files(inputs.iter().map(PathBuf::as_path), out)?;
    }
    let loaded = load::load(inputs)?;
    let (module, warnings) = loaded.verified()?;
    crate::warn(&warnings);
    let plan = plan_module(&module, options).map_err(|e| Failure::user(format!("error: {e}\n")))?;
    if let Some(path) = output {
        let json = serde_json::to_string_pretty(&plan)
            .map_err(|e| Failure::user(format!("error: {e}\n")))?;
        crate::compile::write_atomic(path, (json + "\n").as_bytes())
            .map_err(|e| Failure::user(format!("error: {e}\n")))?;
    }
    Ok(plan.summary())
}
