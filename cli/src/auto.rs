//! `mmq compile --auto TARGET [--auto-map MAP.toml]`: chooses a scheme per node for a target
//! end-to-end cosine ([`mmq_passes::quant::auto`]), writes the choice as a precision map, and
//! compiles with that map the way `--quant mixed --precision-map` does.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use mmq_ir::Module;
use mmq_ir::modality::Modality;
use mmq_passes::quant::auto::{self, AutoError, Candidate, Choice, Reference};
use mmq_passes::quant::calibrate::Observer;
use mmq_passes::quant::precision::{Granularity, PrecisionMap, Scheme, Settings};
use mmq_passes::{PassManager, PassOptions};

use crate::diagnostics::Failure;
use crate::int8::CalibArgs;
use crate::precision;

/// What `--auto` was asked to do.
pub struct AutoArgs<'a> {
    /// The target cosine, in `[0, 1]`.
    pub target: f64,
    /// Where the chosen map goes.
    pub map: PathBuf,
    /// `--modality` overrides.
    pub overrides: &'a [(String, Modality)],
    /// Calibration samples (the choice is measured on them too) and the observer.
    pub calib: &'a CalibArgs,
    /// `--block`: INT4 block size.
    pub block: usize,
    /// `--asym`: asymmetric INT4 blocks.
    pub asym: bool,
}

/// Parses `--auto TARGET`: a cosine in `[0, 1]`.
pub fn parse_target(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(t) if (0.0..=1.0).contains(&t) => Ok(t),
        Ok(t) => Err(format!("{t} is not a cosine in [0, 1] (for example 0.99)")),
        Err(_) => Err(format!("'{s}' is not a number (for example 0.99)")),
    }
}

/// The default `--auto-map`: the output with the extension `.precision.toml`.
pub fn default_map_path(output: &Path) -> PathBuf {
    output.with_extension("precision.toml")
}

/// A failed evaluation, as the search wants it.
struct EvalError(Failure);

impl From<AutoError> for EvalError {
    fn from(e: AutoError) -> Self {
        EvalError(Failure::user(format!("error: --auto: {e}\n")))
    }
}

/// Chooses, writes the map, compiles `module` with it; returns what to print on stderr.
pub fn run(
    module: &mut Module,
    args: &AutoArgs<'_>,
    opts: &PassOptions,
) -> Result<String, Failure> {
    let start = Instant::now();
    let observer = args.calib.observer()?;
    if !matches!(args.block, 16 | 32 | 64 | 128 | 256) {
        return Err(Failure::usage(format!(
            "--block {}: expected 32, 64 or 128 (16 and 256 also work)",
            args.block
        )));
    }
    if module.entries.len() != 1 {
        return Err(Failure::user(
            "error: --auto chooses precisions for one model at a time; compile the files separately\n"
                .to_owned(),
        ));
    }
    let graph = module.entries[0].graph;
    let (block, asym) = (args.block as u32, args.asym);
    let settings = move |s: Scheme| match s {
        Scheme::Int4 => Settings {
            scheme: s,
            granularity: (block != 32).then_some(Granularity::PerGroup { block }),
            symmetric: asym.then_some(false),
            calibration: None,
        },
        Scheme::Int8 => Settings {
            scheme: s,
            granularity: None,
            symmetric: None,
            calibration: (observer != Observer::MinMax).then_some(observer),
        },
        _ => Settings {
            scheme: s,
            ..Settings::float()
        },
    };

    let m: &Module = module;
    let cands = auto::candidates(m, graph);
    let samples = precision::samples(m, graph, args.calib)?;
    let user = |e: AutoError| Failure::user(format!("error: --auto: {e}\n"));
    let reference = Reference::new(m, graph, &samples).map_err(user)?;
    let labels = precision::analyze_all(m, args.overrides)?;
    let Some((_, labels)) = labels.into_iter().find(|(g, _)| *g == graph) else {
        return Err(Failure::user("error: the module has no graph\n".to_owned()));
    };
    let in_order: Vec<usize> = (0..cands.list.len()).collect();

    // Activation ranges once, for every candidate that can be INT8: a value's range does not
    // depend on which other nodes are quantized.
    let all_int8: Vec<Scheme> = cands
        .list
        .iter()
        .map(|c| {
            if c.ladder.contains(&Scheme::Int8) {
                Scheme::Int8
            } else {
                Scheme::Float
            }
        })
        .collect();
    let map = auto::assignment_map(&cands.list, &all_int8, &in_order, &settings).map_err(user)?;
    let mut calib_text = String::new();
    let ranges = precision::plan_ranges(
        m,
        graph,
        &map.plan(m, graph, &labels),
        &samples,
        &mut calib_text,
    )?;

    let evaluate = |schemes: &[Scheme]| -> Result<f64, EvalError> {
        let map = auto::assignment_map(&cands.list, schemes, &in_order, &settings)?;
        let plan = map.plan(m, graph, &labels);
        let mut q = m.clone();
        PassManager::new(precision::plan_passes(m, &plan, &ranges, args.calib))
            .run(&mut q, opts)
            .map_err(|e| EvalError(Failure::user(format!("error: --auto: {e}\n"))))?;
        Ok(reference.cosine(&q, &samples)?)
    };
    let choice = auto::search(&cands.list, args.target, evaluate).map_err(|e| e.0)?;
    let searched = start.elapsed();

    let text = choice
        .toml(&cands.list, &settings, args.target, reference.output())
        .map_err(user)?;
    std::fs::write(&args.map, &text).map_err(|e| {
        Failure::user(format!(
            "error: --auto-map: cannot write {}: {e}\n",
            args.map.display()
        ))
    })?;
    // Compile with the map as written, exactly as `--precision-map` would read it.
    let map = match PrecisionMap::parse(&text) {
        Ok((map, _)) => map,
        Err(diags) => {
            let first = diags.first().map(ToString::to_string).unwrap_or_default();
            return Err(Failure::user(format!(
                "error: --auto: the chosen map {} does not parse back: {first}\n",
                args.map.display()
            )));
        }
    };

    let mut out = table(&cands.list, &choice);
    if cands.unnamed > 0 {
        let _ = writeln!(
            out,
            "auto: {} quantizable nodes stay float: a precision map cannot name them (no name, or a shared one)",
            cands.unnamed
        );
    }
    let counts: Vec<String> = Scheme::ALL
        .iter()
        .filter_map(|s| {
            let n = choice.schemes.iter().filter(|x| *x == s).count();
            (n > 0).then(|| format!("{s} {n}"))
        })
        .collect();
    let _ = writeln!(
        out,
        "auto: target cosine {}, achieved {:.8} on output '{}' over {} samples ({}); {} evaluations in {:.2} s",
        args.target,
        choice.cosine,
        reference.output(),
        samples.len(),
        if counts.is_empty() {
            "no quantizable nodes".to_owned()
        } else {
            counts.join(", ")
        },
        choice.evaluations,
        searched.as_secs_f64()
    );
    let _ = writeln!(out, "auto: wrote precision map {}", args.map.display());
    out.push_str(&precision::run_map(
        module,
        &map,
        args.overrides,
        args.calib,
        opts,
    )?);
    // The compiled model measured the same way: equal to the search's figure unless the
    // calibration differs.
    let compiled = reference.cosine(module, &samples).map_err(user)?;
    if compiled < args.target {
        let _ = writeln!(
            out,
            "warning: --auto: the compiled model's cosine {compiled:.6} is below the target {} (the search measured {:.6})",
            args.target, choice.cosine
        );
    }
    Ok(out)
}

/// One row per candidate, most sensitive first: node, op, sensitivity, chosen scheme.
fn table(cands: &[Candidate], choice: &Choice) -> String {
    let width = cands
        .iter()
        .map(|c| c.name.chars().count())
        .max()
        .unwrap_or(0)
        .clamp("node".len(), 60);
    let opw = cands
        .iter()
        .map(|c| c.op.len())
        .max()
        .unwrap_or(0)
        .max("op".len());
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<width$}  {:<opw$}  {:>11}  scheme",
        "node", "op", "sensitivity"
    );
    for &i in &choice.order {
        let (Some(c), Some(sens), Some(scheme)) = (
            cands.get(i),
            choice.sensitivity.get(i),
            choice.schemes.get(i),
        ) else {
            continue;
        };
        let _ = writeln!(
            s,
            "{:<width$}  {:<opw$}  {sens:>11.3e}  {scheme}",
            shorten(&c.name, width),
            c.op
        );
    }
    s
}

/// `name` cut to `width` characters, keeping its end.
fn shorten(name: &str, width: usize) -> String {
    let n = name.chars().count();
    if n <= width {
        return name.to_owned();
    }
    let tail: String = name.chars().skip(n - (width - 1)).collect();
    format!("…{tail}")
}
