//! `parvi bench speed`: milliseconds per engine step on fixed workloads, per backend.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Subcommand};
use parvi_infer::{AdapterConfig, EngineRng, Particles, Rbf, RunConfig, Runner, Svgd};
use parvi_model::{BackendKind, LogDensity};
use parvi_models::Gaussian;
use serde::Serialize;

use super::write_atomic;

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// ms per step (median of repeats after warm-up) on fixed workloads.
    Speed(SpeedArgs),
    /// BNN posteriors on the standard UCI splits: test RMSE and log-likelihood, mean +- s.e.
    Uci(super::uci::UciArgs),
}

#[derive(Args, Debug)]
pub struct SpeedArgs {
    /// Backends to measure (repeatable) [default: ndarray and flex, plus wgpu when compiled in].
    #[arg(long)]
    pub backend: Vec<String>,
    /// Particle counts for the 753-dimensional Gaussian.
    #[arg(long, value_delimiter = ',', default_values_t = [20usize, 100, 1000])]
    pub particles: Vec<usize>,
    /// Timed repeats per workload; the median is reported.
    #[arg(long, default_value_t = 5)]
    pub repeats: usize,
    /// Steps per repeat.
    #[arg(long, default_value_t = 20)]
    pub steps: usize,
    /// Also write the rows as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
pub struct SpeedRow {
    pub workload: String,
    pub backend: String,
    pub particles: usize,
    pub dim: usize,
    pub ms_per_step: f64,
}

/// Dimension of the Boston BNN's particle (13 inputs, 50 hidden units, 2 log-precisions).
pub const BOSTON_BNN_DIM: usize = 753;

pub fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Speed(args) => speed(args),
        BenchCommand::Uci(args) => super::uci::run(args),
    }
}

fn speed(args: SpeedArgs) -> Result<()> {
    let backends: Vec<BackendKind> = if args.backend.is_empty() {
        [BackendKind::Ndarray, BackendKind::Flex, BackendKind::Wgpu].into_iter().filter(|b| b.is_compiled()).collect()
    } else {
        args.backend.iter().map(|b| b.parse()).collect::<Result<_, _>>()?
    };
    if args.repeats == 0 || args.steps == 0 {
        anyhow::bail!("invalid setting `--repeats`/`--steps`: both must be >= 1");
    }
    let mut rows = Vec::new();
    println!("{:<28} {:<8} {:>9} {:>12}", "workload", "backend", "particles", "ms/step");
    for backend in backends {
        let device = match backend.device() {
            Ok(d) => d,
            Err(e) => {
                println!("{:<28} {:<8} skipped: {e}", "", backend.name());
                continue;
            }
        };
        let dim = BOSTON_BNN_DIM;
        let target = Gaussian::diagonal(&vec![0.5; dim], &vec![1.0; dim], &device)?;
        for &n in &args.particles {
            let ms = time_svgd(&target, n, args.steps, args.repeats, &device)?;
            let row = SpeedRow {
                workload: format!("svgd-gaussian-{dim}d"),
                backend: backend.name().into(),
                particles: n,
                dim,
                ms_per_step: ms,
            };
            println!("{:<28} {:<8} {:>9} {:>12.3}", row.workload, row.backend, n, ms);
            rows.push(row);
        }
    }
    if let Some(path) = &args.json {
        write_atomic(path, &serde_json::to_vec_pretty(&rows)?)?;
    }
    Ok(())
}

/// Median ms per SVGD step over `repeats` runs of `steps` steps, after one warm-up run.
fn time_svgd(
    target: &dyn LogDensity,
    n: usize,
    steps: usize,
    repeats: usize,
    device: &burn::tensor::Device,
) -> Result<f64> {
    let mut rng = EngineRng::new(1);
    let start = Particles::gaussian(n, target.dim(), 0.0, 1.0, &mut rng, device)?;
    let mut times = Vec::with_capacity(repeats);
    for rep in 0..=repeats {
        let mut engine = Svgd::new(Box::new(Rbf::median()), AdapterConfig::adagrad(1e-2).build()?);
        let outcome = Runner::new(&mut engine, target, start.clone(), RunConfig::new(steps, 0))?.run(&mut [])?;
        if rep > 0 {
            times.push(outcome.ms_per_step());
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}
