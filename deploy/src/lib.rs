//! Deployment packages: a directory a runtime runs as a whole.
//!
//! A package holds the compiled models, `pipeline.json` ([`spec`]: the stages and which
//! outputs feed which inputs, the KV-cache and image-cache layouts, the cache plan, generation
//! settings and every file's hash) and, where the package fits onnxruntime-genai's decoder
//! contract, its `genai_config.json` ([`genai`]). [`package::write_package`] writes one (the
//! compiler calls it for `mmq compile --package`); [`runner::Package`] opens one and runs it in
//! the reference interpreter (`mmq run DIR`, `mmq generate DIR`).

use std::path::{Path, PathBuf};

pub mod describe;
pub mod genai;
pub mod package;
pub mod runner;
pub mod spec;

pub use describe::{ConfigError, DEFAULT_CONTEXT_LENGTH, GenerationConfig};
pub use package::{PackageOptions, Written, write_package};
pub use runner::{Package, StageOutput, is_package};

/// The name of a package's description.
pub const PIPELINE_JSON: &str = "pipeline.json";
/// The name of onnxruntime-genai's config in a package.
pub const GENAI_CONFIG: &str = "genai_config.json";

/// Writing, reading or running a package failed.
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
    /// The package, its inputs or its models do not fit together (the message says where).
    #[error("{0}")]
    Invalid(String),
}

impl DeployError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> DeployError {
        DeployError::Io {
            path: path.to_owned(),
            source,
        }
    }
}

/// The size and SHA-256 of `dir/rel`.
pub(crate) fn hash_file(dir: &Path, rel: &str) -> Result<spec::FileEntry, DeployError> {
    use sha2::{Digest, Sha256};
    let path = dir.join(rel);
    mmq_ir::check_regular_file(&path).map_err(|e| DeployError::io(&path, e))?;
    let mut file = std::fs::File::open(&path).map_err(|e| DeployError::io(&path, e))?;
    let mut hasher = Sha256::new();
    let bytes = std::io::copy(&mut file, &mut hasher).map_err(|e| DeployError::io(&path, e))?;
    Ok(spec::FileEntry {
        file: rel.to_owned(),
        bytes,
        sha256: format!("{:x}", hasher.finalize()),
    })
}
