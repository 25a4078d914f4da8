//! `mmq compile --quant int4|fp8`: weight-only quantization (`--block`, `--asym`); FP8 also
//! quantizes activations per tensor when calibration samples are given.

use std::collections::HashMap;
use std::fmt::Write as _;

use mmq_ir::Module;
use mmq_passes::PassOptions;
use mmq_passes::quant::calibrate::{self, CalibError, Sample};
use mmq_passes::quant::weight_only::{WeightOnlyConfig, WeightOnlyPass, WeightScheme};

use crate::diagnostics::Failure;
use crate::int8::CalibArgs;

/// Quantizes `module` with `scheme` (`int4` or `fp8`); returns what to print.
pub fn run(
    module: &mut Module,
    scheme: &str,
    block: usize,
    asym: bool,
    calib: &CalibArgs,
    opts: &PassOptions,
) -> Result<String, Failure> {
    let scheme = match scheme {
        "int4" => WeightScheme::Int4,
        _ => WeightScheme::Fp8,
    };
    if !matches!(block, 16 | 32 | 64 | 128 | 256) {
        return Err(Failure::usage(format!(
            "--block {block}: expected 32, 64 or 128 (16 and 256 also work)"
        )));
    }
    if scheme == WeightScheme::Fp8 && asym {
        return Err(Failure::usage("--asym applies to --quant int4 only".into()));
    }
    let mut out = String::new();
    let mut pass = WeightOnlyPass::new(WeightOnlyConfig {
        scheme,
        block_size: block,
        symmetric: !asym,
        ..WeightOnlyConfig::default()
    });
    let calibrated = calib.dir.is_some() || calib.random.is_some();
    if scheme == WeightScheme::Fp8 && calibrated {
        let ranges = fp8_ranges(module, &pass, calib)?;
        let _ = writeln!(
            out,
            "fp8: calibrated {} activations ({})",
            ranges.len(),
            calib.observer
        );
        pass = pass.with_activation_ranges(ranges);
    }
    out.push_str(&crate::compile::run_passes(
        module,
        vec![Box::new(pass)],
        opts,
    )?);
    Ok(out)
}

/// Calibrated `(min, max)` of the float inputs of the nodes FP8 quantizes.
fn fp8_ranges(
    module: &Module,
    pass: &WeightOnlyPass,
    calib: &CalibArgs,
) -> Result<HashMap<mmq_ir::Value, (f32, f32)>, Failure> {
    let observer = calib.observer()?;
    if module.entries.len() != 1 {
        return Err(Failure::user(
            "error: --quant fp8 calibrates one model at a time; compile the files separately\n"
                .into(),
        ));
    }
    let graph = module.entries[0].graph;
    let values = pass.activation_inputs(module, graph);
    let fail = |e: CalibError| Failure::user(format!("error: calibration: {e}\n"));
    let samples: Box<dyn Iterator<Item = Result<Sample, CalibError>>> = match &calib.dir {
        Some(dir) => Box::new(calibrate::dir_samples(dir).map_err(fail)?),
        None => Box::new(
            calibrate::random_samples(module, graph, calib.random.unwrap_or(16), 0)
                .map_err(fail)?,
        ),
    };
    let ranges = calibrate::calibrate(module, graph, &values, samples, observer).map_err(fail)?;
    Ok(values
        .iter()
        .filter_map(|&v| ranges.get(v).map(|r| (v, (r.min, r.max))))
        .collect())
}

/// `--awq`: activation statistics and row samples on the calibration samples, then the AWQ
/// pass with the INT4 settings `block` and `asym`; returns what to print.
pub fn awq(
    module: &mut Module,
    block: usize,
    asym: bool,
    calib: &CalibArgs,
    opts: &PassOptions,
) -> Result<String, Failure> {
    use mmq_passes::quant::awq::{self, AwqPass, MAX_ROWS};
    if !matches!(block, 16 | 32 | 64 | 128 | 256) {
        return Err(Failure::usage(format!(
            "--block {block}: expected 32, 64 or 128 (16 and 256 also work)"
        )));
    }
    let sites = awq::sites(module);
    let stats = crate::int8::site_stats(module, &sites, calib, MAX_ROWS, "--awq")?;
    let config = WeightOnlyConfig {
        scheme: WeightScheme::Int4,
        block_size: block,
        symmetric: !asym,
        ..WeightOnlyConfig::default()
    };
    crate::compile::run_passes(module, vec![Box::new(AwqPass::new(config, stats))], opts)
}
