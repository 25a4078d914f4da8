//! `mmq opt`: runs named rule sets, then const-fold and DCE, and prints or writes the result.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use mmq_passes::{ConstFold, Dce, Pass, PassManager, PassOptions, PipelineReport, RewritePass};

use crate::failure::Failure;
use mmq_compiler::load;

/// What `mmq opt` was asked to do.
pub struct OptArgs {
    /// The input (ONNX or `.mmir`).
    pub input: PathBuf,
    /// The rule sets, run together.
    pub rules: Vec<mmq_passes::RuleSet>,
    /// Print rule firings and counters to stderr.
    pub explain: bool,
    /// The target.
    pub target: mmq_passes::TargetRef,
    /// Output file (`.mmir` or `.onnx`); stdout (`.mmir`) without it.
    pub output: Option<PathBuf>,
}

/// Runs `opt`; returns what to print on stdout and what to print on stderr.
pub fn run(args: &OptArgs) -> Result<(String, String), Failure> {
    let rewrite = RewritePass::new(&args.rules);
    if let Some(out) = &args.output {
        crate::check_files([args.input.as_path()], out)?;
    }
    let output_kind = match &args.output {
        None => None,
        Some(p) => Some(output_kind(p)?),
    };
    let loaded = load::load(std::slice::from_ref(&args.input))?;
    crate::warn(&loaded.verify()?);
    let mut module = loaded.module;
    if module.entries.is_empty() {
        return Err(Failure::user(format!(
            "error: {}: the module has no graph\n",
            args.input.display()
        )));
    }
    let passes: Vec<Box<dyn Pass>> =
        vec![Box::new(rewrite), Box::new(ConstFold::new()), Box::new(Dce)];
    let pm = PassManager::new(passes);
    let opts = PassOptions {
        target: args.target,
        explain: args.explain,
    };
    let report = pm
        .run(&mut module, &opts)
        .map_err(|e| Failure::user(format!("error: {e}\n")))?;
    let stderr = if args.explain {
        explain(&report)
    } else {
        String::new()
    };
    let text = mmq_ir::text::print(&module);
    match (&args.output, output_kind) {
        (Some(path), Some(OutputKind::Text)) => {
            crate::compile::write_atomic(path, text.as_bytes())
                .map_err(|e| Failure::user(format!("error: {e}\n")))?;
            Ok((String::new(), stderr))
        }
        (Some(path), Some(OutputKind::Onnx)) => {
            mmq_compiler::export::write(&module, &[], path)?;
            Ok((String::new(), stderr))
        }
        _ => Ok((text, stderr)),
    }
}

enum OutputKind {
    Text,
    Onnx,
}

fn output_kind(path: &Path) -> Result<OutputKind, Failure> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("mmir") => Ok(OutputKind::Text),
        Some("onnx") => Ok(OutputKind::Onnx),
        _ => Err(Failure {
            rendered: format!(
                "error: cannot tell the output format of {}: use a .mmir or .onnx file name\n",
                path.display()
            ),
            code: 2,
        }),
    }
}

/// Each firing (rule and the nodes it matched), then a table of counters per pass.
fn explain(report: &PipelineReport) -> String {
    let mut s = String::new();
    for pass in &report.passes {
        for f in &pass.report.firings {
            let nodes = if f.nodes.is_empty() {
                "(built by another rule)".to_owned()
            } else {
                f.nodes.join(", ")
            };
            let _ = writeln!(s, "{}: {} at {nodes}", pass.name, f.rule);
        }
    }
    s.push_str(&mmq_compiler::summary::counter_table(
        report.passes.iter().map(|p| {
            (
                p.name.as_str(),
                p.time.as_secs_f64() * 1e3,
                &p.report.counters,
                &p.report.notes,
            )
        }),
        None,
    ));
    s
}
