//! Shared test helpers: where the real UCI data is, and plain (non-polars) readers of it.
#![allow(dead_code)] // each test file uses a different part

use std::path::{Path, PathBuf};

/// The real data: `$PARVI_DATA_DIR`, else `<manifest>/../../../shared/uci`. `None` (after
/// printing a SKIPPED line) when neither exists.
pub fn real_data_dir(test: &str) -> Option<PathBuf> {
    let from_env = std::env::var_os("PARVI_DATA_DIR").filter(|d| !d.is_empty()).map(PathBuf::from);
    let beside = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/uci");
    let found = from_env.into_iter().chain([beside]).find(|d| d.is_dir());
    if found.is_none() {
        println!("SKIPPED {test}: no UCI data (set PARVI_DATA_DIR or provide ../shared/uci)");
    }
    found
}

/// Every non-blank line of a text file split on whitespace and parsed with `str::parse`.
pub fn plain_table(path: &Path) -> Vec<Vec<f64>> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect()
}

/// An index file read plainly: one whole number per non-blank line.
pub fn plain_indices(path: &Path) -> Vec<usize> {
    plain_table(path).iter().map(|r| r[0] as usize).collect()
}

/// The regression sets with their README shapes: (folder, rows, features, splits).
pub const REGRESSION: &[(&str, usize, usize, usize)] = &[
    ("bostonHousing", 506, 13, 20),
    ("concrete", 1030, 8, 20),
    ("energy", 768, 8, 20),
    ("kin8nm", 8192, 8, 20),
    ("naval-propulsion-plant", 11934, 16, 20),
    ("power-plant", 9568, 4, 20),
    ("protein-tertiary-structure", 45730, 9, 5),
    ("wine-quality-red", 1599, 11, 20),
    ("yacht", 308, 6, 20),
];
