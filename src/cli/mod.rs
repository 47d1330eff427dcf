//! The `parvi` command line: argument types, config-file merging and the subcommands.

pub mod bench;
pub mod bnn;
pub mod bnn_run;
pub mod data;
pub mod distributed;
pub mod fit;
pub mod method;
pub mod model;
pub mod plot;
pub mod posteriordb;
pub mod predict;
pub mod reference;
pub mod uci;

use std::path::Path;

use anyhow::{Context, Result};
use serde::de::DeserializeOwned;

/// Reads a TOML config file into `T`, naming the file and the offending key on error.
pub fn read_config<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read config file {}", path.display()))?;
    toml::from_str(&text).map_err(|e| anyhow::anyhow!("config file {}: {e}", path.display()))
}

/// Writes an output file atomically (the core's checkpoint writer), naming it on error.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    parvi_infer::core::write_atomic(path, bytes).with_context(|| format!("cannot write {}", path.display()))
}
