//! Regenerates `frontend-onnx/src/proto/onnx.rs` from `onnx-ml.proto`.
//!
//! Usage (from the repository root):
//!
//! ```text
//! cargo run --manifest-path tools/protogen/Cargo.toml -- [PATH/onnx-ml.proto]
//! ```
//!
//! Without an argument the proto file shipped with the `onnx` Python package
//! in `.venv` is used (run `tools/setup-venv.sh` first). The proto is
//! compiled with `protox`, so no system `protoc` is needed.

use std::error::Error;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// Output path, relative to the repository root.
const OUTPUT: &str = "frontend-onnx/src/proto/onnx.rs";

/// Command line shown in the generated file's header.
const REGEN_COMMAND: &str =
    "cargo run --manifest-path tools/protogen/Cargo.toml -- [PATH/onnx-ml.proto]";

type Result<T> = std::result::Result<T, Box<dyn Error>>;

fn repo_root() -> Result<PathBuf> {
    // tools/protogen -> repository root
    Ok(Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()?)
}

/// Locates `onnx-ml.proto` inside the `onnx` package of `.venv`.
fn default_proto(root: &Path) -> Result<PathBuf> {
    let python = root.join(".venv/bin/python");
    if !python.exists() {
        return Err(format!(
            "{} not found; run tools/setup-venv.sh or pass the path to onnx-ml.proto",
            python.display()
        )
        .into());
    }
    let out = Command::new(&python)
        .args([
            "-c",
            "import onnx, os; print(os.path.dirname(onnx.__file__))",
        ])
        .output()?;
    if !out.status.success() {
        return Err(format!(
            "could not locate the onnx package: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into());
    }
    let dir = String::from_utf8(out.stdout)?;
    Ok(PathBuf::from(dir.trim()).join("onnx-ml.proto"))
}

fn run() -> Result<()> {
    let root = repo_root()?;
    let mut args = std::env::args_os().skip(1);
    let proto = match args.next() {
        Some(p) => PathBuf::from(p),
        None => default_proto(&root)?,
    };
    if args.next().is_some() {
        return Err(format!("usage: {REGEN_COMMAND}").into());
    }
    let proto = proto
        .canonicalize()
        .map_err(|e| format!("{}: {e}", proto.display()))?;
    let include = proto.parent().ok_or("proto path has no parent directory")?;
    let file_name = proto.file_name().ok_or("proto path has no file name")?;

    let fds = protox::compile([Path::new(file_name)], [include])?;

    let tmp = root.join("tools/protogen/target/generated");
    fs::create_dir_all(&tmp)?;
    let mut config = prost_build::Config::new();
    config
        .out_dir(&tmp)
        // Decoding from a `Bytes` buffer then shares the buffer instead of copying.
        .bytes([".onnx.TensorProto.raw_data"]);
    config.compile_fds(fds)?;

    let body = fs::read_to_string(tmp.join("onnx.rs"))?;
    let header = format!(
        "// @generated from onnx-ml.proto by tools/protogen. Do not edit by hand.\n\
         // Regenerate with:\n\
         //     {REGEN_COMMAND}\n\n"
    );
    let out = root.join(OUTPUT);
    fs::write(&out, header + &body)?;
    eprintln!("wrote {} from {}", out.display(), proto.display());
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("protogen: error: {e}");
            ExitCode::FAILURE
        }
    }
}
