//! Loading command inputs: ONNX files (one module, one graph per file) or a `.mmir` file.

use std::path::{Path, PathBuf};

use codespan_reporting::files::SimpleFiles;
use mmq_ir::Module;
use mmq_ir::text::SpanMap;

use crate::diagnostics;

/// Loading or verifying failed: the rendered diagnostics.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", rendered.trim_end())]
pub struct LoadError {
    /// Every diagnostic, rendered (ends with a newline).
    pub rendered: String,
    /// Whether the inputs were given wrongly (exit code 2 on the command line).
    pub usage: bool,
}

impl LoadError {
    fn user(rendered: String) -> LoadError {
        LoadError {
            rendered,
            usage: false,
        }
    }
}

/// Where the module came from, for locating diagnostics.
pub enum Origin {
    /// ONNX files.
    Onnx(Vec<PathBuf>),
    /// A `.mmir` file, its text and the spans of its entities.
    Text {
        /// The source.
        files: SimpleFiles<String, String>,
        /// Its id in `files`.
        file: usize,
        /// Where each entity is defined.
        spans: SpanMap,
    },
}

/// A loaded module.
pub struct Loaded {
    /// The module.
    pub module: Module,
    /// Where it came from.
    pub origin: Origin,
    /// What loading corrected: declared types of an ONNX file that contradict what its nodes
    /// compute, replaced by the computed ones (warnings, rendered by [`Loaded::verify`]).
    pub corrections: Vec<mmq_ir::IrError>,
}

fn is_text(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "mmir")
}

/// Loads the inputs: one `.mmir` file, or one or more ONNX files.
pub fn load(paths: &[PathBuf]) -> Result<Loaded, LoadError> {
    load_opts(paths, &mmq_ir::text::ParseOptions::default())
}

/// [`load`], opening a `.mmir` file's external weights (resolved next to the file) so that the
/// module can be run.
pub fn load_with_weights(paths: &[PathBuf]) -> Result<Loaded, LoadError> {
    let data_dir = paths.first().and_then(|p| p.parent()).map(|d| {
        if d.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            d.to_path_buf()
        }
    });
    load_opts(paths, &mmq_ir::text::ParseOptions { data_dir })
}

fn load_opts(paths: &[PathBuf], opts: &mmq_ir::text::ParseOptions) -> Result<Loaded, LoadError> {
    if paths.iter().any(|p| is_text(p)) {
        if paths.len() != 1 {
            return Err(LoadError {
                rendered: "error: a .mmir file must be the only input\n".to_owned(),
                usage: true,
            });
        }
        return load_text(&paths[0], opts);
    }
    let refs: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
    match mmq_onnx::load_files(&refs, &mmq_onnx::LoadOptions { infer: false }) {
        Ok(mut module) => {
            name_graphs_by_file(&mut module, paths);
            let corrections = mmq_ir::infer::infer_module_correcting(&mut module);
            Ok(Loaded {
                module,
                origin: Origin::Onnx(paths.to_vec()),
                corrections,
            })
        }
        Err(e) => Err(LoadError::user(format!("error: {e}\n"))),
    }
}

/// Entry graphs of several files that share a name (every `torch.onnx` export is
/// `main_graph`) take their file's stem instead, so that messages and dumps tell them apart.
fn name_graphs_by_file(m: &mut mmq_ir::Module, paths: &[PathBuf]) {
    let graphs: Vec<mmq_ir::GraphId> = m.entries.iter().map(|e| e.graph).collect();
    let mut count: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for &g in &graphs {
        *count.entry(m.graphs[g].name.clone()).or_default() += 1;
    }
    let mut taken: std::collections::HashSet<String> = count.keys().cloned().collect();
    for (&g, path) in graphs.iter().zip(paths) {
        let Some(stem) = path.file_stem().map(|s| s.to_string_lossy().into_owned()) else {
            continue;
        };
        if count[&m.graphs[g].name] < 2 {
            continue;
        }
        let mut name = stem.clone();
        let mut k = 1;
        while taken.contains(&name) {
            name = format!("{stem}_{k}");
            k += 1;
        }
        taken.insert(name.clone());
        m.graphs[g].name = name;
    }
}

fn load_text(path: &Path, opts: &mmq_ir::text::ParseOptions) -> Result<Loaded, LoadError> {
    let src = mmq_ir::check_regular_file(path)
        .and_then(|()| std::fs::read_to_string(path))
        .map_err(|e| LoadError::user(format!("error: cannot read {}: {e}\n", path.display())))?;
    let mut files = SimpleFiles::new();
    let file = files.add(path.display().to_string(), src);
    let parsed = mmq_ir::text::parse_with(
        files.get(file).map(|f| f.source().as_str()).unwrap_or(""),
        opts,
    );
    match parsed {
        Ok((module, spans)) => Ok(Loaded {
            module,
            origin: Origin::Text { files, file, spans },
            corrections: Vec::new(),
        }),
        Err(errors) => {
            let rendered = errors
                .iter()
                .map(|e| diagnostics::render(&files, &mmq_ir::text::to_diagnostic(e, file)))
                .collect();
            Err(LoadError::user(rendered))
        }
    }
}

impl Loaded {
    /// Runs the verifier: every error rendered as a failure (warnings with them); without
    /// errors, the warnings rendered (empty when there are none).
    pub fn verify(&self) -> Result<String, LoadError> {
        let mut all = self.corrections.clone();
        all.extend(mmq_ir::verify::verify_all(&self.module));
        let failed = all.iter().any(|e| e.severity == mmq_ir::Severity::Error);
        let rendered = self.render(&all);
        if failed {
            Err(LoadError::user(rendered))
        } else {
            Ok(rendered)
        }
    }

    fn render(&self, errors: &[mmq_ir::IrError]) -> String {
        match &self.origin {
            Origin::Onnx(paths) => {
                let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
                diagnostics::render_ir_errors(&self.module, &names.join(", "), errors)
            }
            Origin::Text { files, file, spans } => errors
                .iter()
                .map(|e| {
                    let d = diagnostics::ir_error_diagnostic(e, *file, spans.get(e.entity));
                    diagnostics::render(files, &d)
                })
                .collect(),
        }
    }

    /// The module and its rendered warnings, after [`Loaded::verify`].
    pub fn verified(self) -> Result<(Module, String), LoadError> {
        let warnings = self.verify()?;
        Ok((self.module, warnings))
    }
}
