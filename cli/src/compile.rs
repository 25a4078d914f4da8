//! `mmq compile`: import, run the pipeline of a level, export for the target.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use mmq_ir::Module;
use mmq_passes::{DumpAfter, OptLevel, PassOptions, PipelineReport, Target};

use crate::diagnostics::Failure;
use crate::load;

/// The code generation targets of `mmq compile`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CompileTarget {
    /// ONNX Runtime (CPU).
    Ort,
    /// TensorRT.
    Trt,
}

/// What `mmq compile` was asked to do.
pub struct CompileArgs {
    /// The models (several ONNX files load as one module).
    pub inputs: Vec<PathBuf>,
    /// The target.
    pub target: CompileTarget,
    /// The optimization level.
    pub level: OptLevel,
    /// The output file (one model) or directory (several).
    pub output: PathBuf,
    /// Print the module after these passes to stderr.
    pub dump_after: Option<String>,
    /// Print a table of pass times and counters to stderr.
    pub time_passes: bool,
}

/// Runs `compile`; returns what to print on stderr.
pub fn run(args: &CompileArgs) -> Result<String, Failure> {
    let target = match args.target {
        CompileTarget::Ort => Target::Ort,
        CompileTarget::Trt => {
            return Err(Failure::user(
                "error: target 'trt' is not supported yet (use --target ort)\n".to_owned(),
            ));
        }
    };
    let mut pm = mmq_passes::pipeline(target, args.level);
    pm.time = args.time_passes;
    if let Some(d) = &args.dump_after {
        let d = DumpAfter::parse(d);
        if let DumpAfter::Pass(name) = &d
            && !pm.names().iter().any(|p| d.matches(p))
        {
            let names = pm.names();
            let known = if names.is_empty() {
                format!("-O{} runs no passes", args.level.digit())
            } else {
                format!("passes at -O{}: {}", args.level.digit(), names.join(", "))
            };
            return Err(Failure {
                rendered: format!("error: --dump-after {name}: no such pass ({known}, or all)\n"),
                code: 2,
            });
        }
        pm.dump_after = Some(d);
    }

    let loaded = load::load(&args.inputs)?;
    loaded.verify()?;
    let mut module = loaded.module;
    if module.entries.is_empty() {
        return Err(Failure::user("error: the module has no graph\n".to_owned()));
    }
    let opts = PassOptions {
        target,
        explain: false,
    };
    let result = pm.run(&mut module, &opts);
    let report = match result {
        Ok(r) => r,
        Err(e) => return Err(Failure::user(format!("error: {e}\n"))),
    };

    let mut stderr = String::new();
    for pass in &report.passes {
        if let Some(dump) = &pass.dump {
            let _ = writeln!(stderr, "// ----- after {} -----", pass.name);
            stderr.push_str(dump);
        }
    }
    if args.time_passes {
        stderr.push_str(&counter_table(&report, true));
    }

    if module.entries.len() == 1 {
        write_onnx(&module, &args.output)?;
    } else {
        std::fs::create_dir_all(&args.output).map_err(|e| {
            Failure::user(format!(
                "error: cannot create directory {}: {e}\n",
                args.output.display()
            ))
        })?;
        for (i, entry) in module.entries.iter().enumerate() {
            let stem = args
                .inputs
                .get(i)
                .and_then(|p| p.file_stem())
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| module.graphs[entry.graph].name.clone());
            let path = args.output.join(format!("{stem}.onnx"));
            write_graph(&module, entry.graph, &path)?;
        }
    }
    Ok(stderr)
}

/// Writes the first entry graph of `m` as ONNX (atomically; large weights external).
pub fn write_onnx(m: &Module, path: &Path) -> Result<(), Failure> {
    let Some(entry) = m.entries.first() else {
        return Err(Failure::user("error: the module has no graph\n".to_owned()));
    };
    write_graph(m, entry.graph, path)
}

fn write_graph(m: &Module, graph: mmq_ir::GraphId, path: &Path) -> Result<(), Failure> {
    mmq_backend_ort::write_model(m, graph, path, &mmq_backend_ort::ExportOptions::default())
        .map(|_| ())
        .map_err(|e| Failure::user(format!("error: cannot write {}: {e}\n", path.display())))
}

/// One row per pass: name, milliseconds (when `times`), and its counters.
pub fn counter_table(report: &PipelineReport, times: bool) -> String {
    let width = report
        .passes
        .iter()
        .map(|p| p.name.len())
        .max()
        .unwrap_or(0)
        .max("pass".len());
    let mut s = String::new();
    if times {
        let _ = writeln!(s, "{:<width$} {:>10}  counters", "pass", "ms");
    } else {
        let _ = writeln!(s, "{:<width$}  counters", "pass");
    }
    for p in &report.passes {
        let counters: Vec<String> = p
            .report
            .counters
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let counters = if counters.is_empty() {
            "-".to_owned()
        } else {
            counters.join(" ")
        };
        if times {
            let ms = p.time.as_secs_f64() * 1e3;
            let _ = writeln!(s, "{:<width$} {ms:>10.3}  {counters}", p.name);
        } else {
            let _ = writeln!(s, "{:<width$}  {counters}", p.name);
        }
    }
    if times {
        let total = report.total_time().as_secs_f64() * 1e3;
        let _ = writeln!(s, "{:<width$} {total:>10.3}", "total");
    }
    for p in &report.passes {
        for note in &p.report.notes {
            let _ = writeln!(s, "{}: {note}", p.name);
        }
    }
    s
}
