//! The `parvi` command line: argument types, config-file merging and the subcommands.

pub mod bench;
pub mod bnn;
pub mod bnn_run;
pub mod data;
pub mod fit;
pub mod method;
pub mod plot;
pub mod uci;

use std::path::Path;

use anyhow::{Context, Result};
use serde::de::DeserializeOwned;

/// Reads a TOML config file into `T`, naming the file and the offending key on error.
pub fn read_config<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read config file {}", path.display()))?;
    toml::from_str(&text).map_err(|e| anyhow::anyhow!("config file {}: {e}", path.display()))
}

/// Writes `bytes` to `path` through a temporary file and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    std::fs::write(&tmp, bytes).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}
