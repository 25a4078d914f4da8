//! The files of one run, checked together before any work: every output is a regular file or
//! a path still to be made (never a device, FIFO, socket or directory: see
//! [`mmq_ir::fsio`]), and no output is an input of the run, a file it reads from an input folder,
//! a file inside a directory the run writes, or another output of the run.
//!
//! ```no_run
//! use mmq_compiler::run_files::RunFiles;
//! use std::path::Path;
//!
//! RunFiles::new()
//!     .input("the input model", Path::new("model.onnx"))
//!     .input_dir("the calibration folder", Path::new("calib"), "npz")
//!     .output("-o", "the output", Path::new("model.int8.onnx"))
//!     .output("--report", "the report", Path::new("report.json"))
//!     .check()?;
//! # Ok::<(), mmq_compiler::run_files::OutputError>(())
//! ```

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// An output of the run cannot be written where it was asked for.
#[derive(Debug, thiserror::Error)]
#[error("{flag} {}: {reason}", path.display())]
pub struct OutputError {
    /// The option that named the output (`-o`, `--report`, ...).
    pub flag: String,
    /// The path as given.
    pub path: PathBuf,
    /// Why it cannot be written there.
    pub reason: String,
}

/// One path of the run.
#[derive(Debug)]
struct Entry {
    /// What it is (`the input model`, `the report`).
    what: String,
    /// For outputs, the option that names it (`--report`).
    flag: String,
    path: PathBuf,
    /// The path resolved as far as it exists ([`identity`]).
    id: PathBuf,
    /// Device and inode, when it exists (a hard link to an input is that input).
    file: Option<(u64, u64)>,
    /// An output that may lie inside the run's output directories (a table beside the models).
    beside_outputs: bool,
}

impl Entry {
    fn new(what: String, path: &Path) -> Entry {
        Entry {
            what,
            flag: String::new(),
            path: path.to_owned(),
            id: identity(path),
            file: std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino())),
            beside_outputs: false,
        }
    }

    fn same(&self, other: &Entry) -> bool {
        self.id == other.id || (self.file.is_some() && self.file == other.file)
    }
}

/// The inputs and outputs of one run; see the module documentation.
#[derive(Debug, Default)]
pub struct RunFiles {
    inputs: Vec<Entry>,
    /// Folders and the extension of the files the run reads from them.
    input_dirs: Vec<(Entry, String)>,
    outputs: Vec<Entry>,
    output_dirs: Vec<Entry>,
}

impl RunFiles {
    /// No files yet.
    pub fn new() -> RunFiles {
        RunFiles::default()
    }

    /// A file the run reads; `what` names it in messages (`the precision map`).
    pub fn input(mut self, what: impl Into<String>, path: &Path) -> RunFiles {
        self.inputs.push(Entry::new(what.into(), path));
        self
    }

    /// A folder whose files with extension `ext` the run reads (calibration samples, `npz`).
    pub fn input_dir(mut self, what: impl Into<String>, path: &Path, ext: &str) -> RunFiles {
        self.input_dirs
            .push((Entry::new(what.into(), path), ext.to_owned()));
        self
    }

    /// A file the run writes, named by the option `flag`; `what` names it in messages about
    /// another output (`the report`).
    pub fn output(mut self, flag: &str, what: impl Into<String>, path: &Path) -> RunFiles {
        let mut e = Entry::new(what.into(), path);
        e.flag = flag.to_owned();
        self.outputs.push(e);
        self
    }

    /// [`RunFiles::output`] for a file that may lie inside one of the run's output directories
    /// (a table the models there refer to), though never onto another output.
    pub fn output_beside(self, flag: &str, what: impl Into<String>, path: &Path) -> RunFiles {
        let mut files = self.output(flag, what, path);
        if let Some(e) = files.outputs.last_mut() {
            e.beside_outputs = true;
        }
        files
    }

    /// A directory the run fills (several models, a package), named by the option `flag`.
    pub fn output_dir(mut self, flag: &str, path: &Path) -> RunFiles {
        let mut e = Entry::new("the output directory".to_owned(), path);
        e.flag = flag.to_owned();
        self.output_dirs.push(e);
        self
    }

    /// Checks every output against the file system, every input and every other output.
    pub fn check(&self) -> Result<(), OutputError> {
        for (i, out) in self.outputs.iter().enumerate() {
            let fail = |reason: String| OutputError {
                flag: out.flag.clone(),
                path: out.path.clone(),
                reason,
            };
            mmq_ir::fsio::check_output_file(&out.path).map_err(|e| fail(e.to_string()))?;
            if let Some(input) = self.inputs.iter().find(|x| x.same(out)) {
                return Err(fail(format!(
                    "that is {} ({}), which this run reads; choose another path",
                    input.what,
                    input.path.display()
                )));
            }
            if let Some((dir, _)) = self.input_dirs.iter().find(|(d, ext)| {
                out.id.parent() == Some(d.id.as_path())
                    && out.id.extension().is_some_and(|e| e == ext.as_str())
            }) {
                return Err(fail(format!(
                    "that is in {} ({}), which this run reads; choose another path",
                    dir.what,
                    dir.path.display()
                )));
            }
            if let Some(earlier) = self.outputs[..i].iter().find(|x| x.same(out)) {
                return Err(fail(format!(
                    "that is {}, which this run also writes; give each output its own path",
                    earlier.what
                )));
            }
            if !out.beside_outputs
                && let Some(dir) = self.output_dirs.iter().find(|d| out.id.starts_with(&d.id))
            {
                return Err(fail(format!(
                    "that is inside the output directory {}, which this run writes; choose a \
                     path outside it",
                    dir.path.display(),
                )));
            }
        }
        for dir in &self.output_dirs {
            if let Some(input) = self.inputs.iter().find(|x| x.same(dir)) {
                return Err(OutputError {
                    flag: dir.flag.clone(),
                    path: dir.path.clone(),
                    reason: format!(
                        "that is {} ({}), which this run reads; choose another path",
                        input.what,
                        input.path.display()
                    ),
                });
            }
        }
        Ok(())
    }
}

/// What a path names, for comparing paths that may not exist yet: the canonical path, else the
/// identity of its directory joined with the file name (`out/a.onnx` under a directory `out`
/// still to be made), else the path as given.
pub fn identity(p: &Path) -> PathBuf {
    if let Ok(c) = std::fs::canonicalize(p) {
        return c;
    }
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    match p.file_name() {
        Some(name) if dir != p => identity(dir).join(name),
        _ => p.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("mmq-run-files-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("dir");
        d
    }

    fn reason(files: RunFiles) -> String {
        files.check().expect_err("refused").to_string()
    }

    #[test]
    fn outputs_onto_inputs_folders_and_each_other_are_refused() {
        let d = scratch("overlap");
        let model = d.join("m.onnx");
        let map = d.join("map.toml");
        std::fs::write(&model, b"m").expect("write");
        std::fs::write(&map, b"m").expect("write");
        std::fs::create_dir_all(d.join("calib")).expect("calib");
        std::fs::write(d.join("calib/s.npz"), b"s").expect("write");
        let link = d.join("link.toml");
        std::fs::hard_link(&map, &link).expect("link");
        let base = || {
            RunFiles::new()
                .input("the input model", &model)
                .input("the precision map", &map)
                .input_dir("the calibration folder", &d.join("calib"), "npz")
                .output("-o", "the output", &d.join("out.onnx"))
        };
        assert!(base().check().is_ok());
        let r = reason(base().output("--qparams", "the table", &map));
        assert!(
            r.starts_with("--qparams ") && r.contains("the precision map"),
            "{r}"
        );
        // A hard link is the same file under another name.
        assert!(
            reason(base().output("--qparams", "the table", &link)).contains("the precision map")
        );
        let r = reason(base().output("--qparams", "the table", &d.join("calib/s.npz")));
        assert!(r.contains("the calibration folder"), "{r}");
        let r = reason(base().output("--qparams", "the table", &d.join("calib/new.npz")));
        assert!(r.contains("the calibration folder"), "{r}");
        // A file the calibration does not read may go there (`--calib .`, `-o out.onnx`).
        assert!(
            base()
                .output("--report", "the report", &d.join("calib/r.json"))
                .check()
                .is_ok()
        );
        let r = reason(
            base()
                .output("--qparams", "the table", &d.join("t.qpqr"))
                .output("--report", "the report", &d.join("./t.qpqr")),
        );
        assert!(
            r.starts_with("--report") && r.contains("that is the table"),
            "{r}"
        );
        let r = reason(RunFiles::new().output_dir("-o", &d.join("pkg")).output(
            "--report",
            "the report",
            &d.join("pkg/sub/r.json"),
        ));
        assert!(r.contains("inside the output directory"), "{r}");
        assert!(
            RunFiles::new()
                .output_dir("-o", &d.join("pkg"))
                .output_beside("--qparams", "the table", &d.join("pkg/t.qpqr"))
                .check()
                .is_ok()
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_directory_is_refused_as_an_output_file() {
        let d = scratch("special");
        let r = reason(RunFiles::new().output("-o", "the output", &d));
        assert!(
            r.starts_with("-o ") && r.contains("a directory, not a regular file"),
            "{r}"
        );
        let _ = std::fs::remove_dir_all(&d);
    }
}
