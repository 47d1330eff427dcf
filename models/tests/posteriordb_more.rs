//! The wider posteriordb suite (`../shared/posteriordb-more`, issue 59): each model against an
//! independent `f64` evaluation of its Stan program, and NUTS through the model against the
//! reference Stan made. One module per group of models (`more_1`, ...); the harness they share
//! (finding the suite, reading the references) is this file.
//!
//! The suite folder is `PARVI_POSTERIORDB_MORE_DIR`, else `../shared/posteriordb-more` beside
//! the workspace. Without it the tests print a note and pass, unless
//! `PARVI_REQUIRE_POSTERIORDB=1`.

use std::f64::consts::PI;
use std::path::{Path, PathBuf};

use parvi_models::posteriordb::MORE_NAMES;
use serde_json::Value;

// `suite` (the first suite's folder) is for the other test files.
#[allow(dead_code)]
mod common;

#[path = "posteriordb_more/more_1.rs"]
mod more_1;
#[path = "posteriordb_more/more_2.rs"]
mod more_2;
#[path = "posteriordb_more/more_3.rs"]
mod more_3;

/// The wider suite's folder, or `None` after a skip note (a failure when the suites are required).
pub fn more_suite(test: &str) -> Option<PathBuf> {
    let candidates = match std::env::var_os("PARVI_POSTERIORDB_MORE_DIR") {
        Some(dir) => vec![PathBuf::from(dir)],
        None => vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/posteriordb-more")],
    };
    let dir = candidates.into_iter().find(|d| MORE_NAMES.iter().any(|n| d.join(n).join("data.json").is_file()));
    if dir.is_none() {
        assert!(
            std::env::var("PARVI_REQUIRE_POSTERIORDB").as_deref() != Ok("1"),
            "{test}: PARVI_REQUIRE_POSTERIORDB=1 but the wider suite was not found (set PARVI_POSTERIORDB_MORE_DIR)"
        );
        eprintln!("{test}: skipped, no posteriordb-more suite (set PARVI_POSTERIORDB_MORE_DIR to run it)");
    }
    dir
}

/// A JSON file of a posterior folder.
pub fn read_json(folder: &Path, file: &str) -> Value {
    let path = folder.join(file);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The reference's moments by Stan name (`reference_moments.json`).
pub fn reference_moments(folder: &Path) -> Vec<(String, f64, f64)> {
    let json = read_json(folder, "reference_moments.json");
    json["parameters"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, m)| (name.clone(), m["mean"].as_f64().unwrap(), m["sd"].as_f64().unwrap()))
        .collect()
}

/// The bulk ESS of each reported scalar of Stan's reference run, by name
/// (`reference_info.json`'s diagnostics); `None` where the folder does not record it
/// (eight_schools_centered's reference is posteriordb's).
pub fn reference_ess(folder: &Path) -> Option<Vec<(String, f64)>> {
    let info = read_json(folder, "reference_info.json");
    let diagnostics = info.get("diagnostics")?;
    let names = diagnostics["names"].as_array()?;
    let ess = diagnostics["ess_bulk"].as_array()?;
    Some(
        names.iter().zip(ess).map(|(n, e)| (n.as_str().unwrap().to_string(), e.as_f64().unwrap_or(f64::NAN))).collect(),
    )
}

/// The reference draws: one row of values (in `names` order) per draw, chain after chain.
pub fn reference_rows(folder: &Path, names: &[String]) -> Vec<Vec<f64>> {
    let json = read_json(folder, "reference_draws.json");
    let mut rows = Vec::new();
    for chain in json.as_array().unwrap() {
        let columns: Vec<&Vec<Value>> =
            names.iter().map(|n| chain[n].as_array().unwrap_or_else(|| panic!("reference lacks `{n}`"))).collect();
        for i in 0..columns[0].len() {
            rows.push(columns.iter().map(|c| c[i].as_f64().unwrap()).collect());
        }
    }
    rows
}

/// A small deterministic generator for test points.
pub struct Lcg(pub u64);

impl Lcg {
    pub fn uniform(&mut self) -> f64 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    pub fn normal(&mut self) -> f64 {
        (-2.0 * self.uniform().ln()).sqrt() * (2.0 * std::f64::consts::PI * self.uniform()).cos()
    }
}

// Densities in f64, shared by the modules. Every summed term goes through `Acc`, which also
// sums the magnitudes: the scale of the f32 rounding error of the model's evaluation.

#[derive(Default, Clone, Copy, Debug)]
struct Acc {
    sum: f64,
    magnitude: f64,
}

impl Acc {
    fn add(&mut self, term: f64) {
        self.sum += term;
        self.magnitude += term.abs();
    }
}

fn normal_lpdf(y: f64, mu: f64, sigma: f64) -> f64 {
    -0.5 * (2.0 * PI).ln() - sigma.ln() - 0.5 * ((y - mu) / sigma).powi(2)
}

fn cauchy_lpdf(y: f64, mu: f64, sigma: f64) -> f64 {
    -PI.ln() - sigma.ln() - ((y - mu) / sigma).powi(2).ln_1p()
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn logit(p: f64) -> f64 {
    (p / (1.0 - p)).ln()
}

/// A point as the f32 model sees it, back in f64.
fn as_f32(p: &[f64]) -> Vec<f64> {
    p.iter().map(|&v| f64::from(v as f32)).collect()
}
