//! The JAX yardstick of the Boston BNN step: `scripts/jax_bnn_step.py` (compiled into the
//! binary, so it runs from any directory) run by `python3` on the same rows, particles and
//! minibatches, and its particles checked against the hand-written step's.

use std::process::Command;

use anyhow::{Context, Result, bail};
use parvi_bench::handwritten::{BnnShape, HandwrittenSvgd};
use parvi_infer::{BatchOrder, BatchStream, Particles};
use parvi_model::tensor_ops::to_vec_f32;

use super::TrainingData;

const SCRIPT: &str = include_str!("../../../scripts/jax_bnn_step.py");

/// What the JAX step measured.
pub struct JaxStep {
    pub ms_per_step: f64,
    pub version: String,
    pub device: String,
    /// The largest difference between JAX's particles and the hand-written step's after the
    /// same steps from the same start.
    pub max_difference: f64,
}

/// Times the jitted JAX step (median over `repeats` runs of `steps` steps, after a compiling
/// run); an error says why it could not run (no python3, no jax).
pub fn time_step(
    data: &TrainingData,
    start: &Particles,
    steps: usize,
    repeats: usize,
    batch: usize,
) -> Result<JaxStep> {
    let (lr, alpha, fudge) = (1e-3f32, 0.9f32, 1e-6f32);
    let mut stream = BatchStream::new(data.y.len(), batch, BatchOrder::Cycle, 0).context("batch stream")?;
    let batches: Vec<Vec<usize>> = (0..steps).map(|_| stream.next_indices()).collect();
    let x: Vec<f32> = data.x.iter().map(|&v| v as f32).collect();
    let y: Vec<f32> = data.y.iter().map(|&v| v as f32).collect();
    let positions = to_vec_f32(&start.positions);
    let (n, dim) = (start.len(), start.dim());
    let hidden = 50;
    let job = serde_json::json!({
        "x": x.chunks(data.features).collect::<Vec<_>>(),
        "y": y,
        "particles": positions.chunks(dim).collect::<Vec<_>>(),
        "batches": batches,
        "steps": steps,
        "repeats": repeats,
        "hidden": hidden,
        "lr": lr,
        "alpha": alpha,
        "fudge": fudge,
    });
    let dir = tempfile::tempdir().context("a temporary directory for the JAX job")?;
    let (script, job_path) = (dir.path().join("jax_bnn_step.py"), dir.path().join("job.json"));
    std::fs::write(&script, SCRIPT)?;
    std::fs::write(&job_path, serde_json::to_vec(&job)?)?;
    let out = Command::new("python3")
        .arg(&script)
        .arg(&job_path)
        .env("JAX_PLATFORMS", "cpu")
        .output()
        .context("python3 is not available")?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        if err.contains("No module named 'jax'") {
            bail!("python3 has no jax (`pip install jax` to compare with it)");
        }
        bail!("the JAX step failed: {}", err.lines().last().unwrap_or("(no message)"));
    }
    let reply: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("the JAX step's output is not the JSON line expected")?;
    let ms_per_step = reply["ms_per_step"].as_f64().context("no ms_per_step in the JAX step's output")?;
    let theirs: Vec<f64> = reply["particles"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|row| row.as_array().into_iter().flatten().filter_map(serde_json::Value::as_f64))
        .collect();
    if theirs.len() != n * dim {
        bail!("the JAX step returned {} particle values, expected {}", theirs.len(), n * dim);
    }
    // The hand-written step on the same batches from the same start.
    let mut step = HandwrittenSvgd::new(BnnShape { inputs: data.features, hidden }, n, &x, &y, lr, alpha, fudge);
    let mut ours = positions;
    for rows in &batches {
        step.step(&mut ours, rows);
    }
    let max_difference = ours.iter().zip(&theirs).map(|(a, b)| (f64::from(*a) - b).abs()).fold(0.0, f64::max);
    Ok(JaxStep {
        ms_per_step,
        version: reply["jax_version"].as_str().unwrap_or("?").to_string(),
        device: reply["device"].as_str().unwrap_or("?").to_string(),
        max_difference,
    })
}
