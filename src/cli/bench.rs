//! `parvi bench speed`: milliseconds per engine step on fixed workloads, per backend, beside a
//! hand-written reference of the BNN step.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use parvi_data::DevSplit;
use parvi_infer::{AdapterConfig, BatchOrder, BatchStream, EngineRng, Particles, RunConfig, Runner};
use parvi_model::layers::LayerOps;
use parvi_model::tensor_ops::to_vec_f32;
use parvi_model::{BackendKind, LogDensity};
use parvi_models::{Bnn, BnnConfig, Gaussian, LogisticRegression};
use serde::Serialize;

use super::write_atomic;
use parvi_bench::handwritten::{BnnShape, HandwrittenSvgd};
use parvi_infer::{EngineSpec, MethodConfig};

mod jax;
mod scaling;

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// ms per step (median of repeats after warm-up) on fixed workloads.
    Speed(Box<SpeedArgs>),
    /// BNN posteriors on the standard UCI splits: test RMSE and log-likelihood, mean +- s.e.
    Uci(Box<super::uci::UciArgs>),
    /// The posteriordb suite: every engine's defaults and NUTS against the reference draws.
    Posteriordb(Box<super::posteriordb::PosteriorDbArgs>),
}

#[derive(Args, Debug)]
pub struct SpeedArgs {
    /// The shared kernel of the engines timed: rbf, imq or rbf-linear (the moment-matching kernel).
    #[arg(long, default_value = "rbf")]
    pub kernel: String,
    /// Backends to measure (repeatable) [default: ndarray and flex, plus wgpu when compiled in].
    #[arg(long)]
    pub backend: Vec<String>,
    /// Particle counts for the 753-dimensional Gaussian.
    #[arg(long, value_delimiter = ',', default_values_t = [20usize, 100, 1000])]
    pub particles: Vec<usize>,
    /// Workloads to run, by name prefix (repeatable): bnn, blr, gaussian, engines
    /// [default: all].
    #[arg(long)]
    pub only: Vec<String>,
    /// Timed repeats per workload; the median is reported.
    #[arg(long, default_value_t = 7)]
    pub repeats: usize,
    /// Steps per repeat.
    #[arg(long, default_value_t = 50)]
    pub steps: usize,
    /// Data directory for Boston and breast cancer [default: $PARVI_DATA_DIR, else ./datasets].
    /// Without the files, seeded synthetic data of the same shapes is used (the step cost
    /// depends only on the shapes).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Also write the rows as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Also time SVGD at growing particle counts (`--scaling-particles`) on the 2-D Gaussian and,
    /// up to 10,000, the 753-d one, with peak memory; each size in a child process. `--only
    /// scaling` skips the other workloads.
    #[arg(long)]
    pub scaling: bool,
    /// Particle counts of the scaling table.
    #[arg(long, value_delimiter = ',', default_values_t = [100usize, 1000, 10000, 100000])]
    pub scaling_particles: Vec<usize>,
    /// Internal: time one size of the scaling table, `DIM:N`, in this process and print it as
    /// JSON (what `--scaling` runs in each child).
    #[arg(long, hide = true, value_name = "DIM:N")]
    pub scaling_point: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct SpeedRow {
    pub workload: String,
    pub backend: String,
    pub particles: usize,
    pub dim: usize,
    pub ms_per_step: f64,
    /// The hand-written (no autodiff, no burn) step of the same mathematics, same process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reference_ms_per_step: Option<f64>,
    /// Peak resident memory of a process that ran this workload alone (the scaling table).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_rss_mb: Option<f64>,
}

/// Dimension of the Boston BNN's particle (13 inputs, 50 hidden units, 2 log-precisions).
pub const BOSTON_BNN_DIM: usize = 753;
const BNN_PARTICLES: usize = 20;
const BLR_PARTICLES: usize = 100;
const BATCH: usize = 100;

pub fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Speed(args) => speed(*args),
        BenchCommand::Uci(args) => super::uci::run(*args),
        BenchCommand::Posteriordb(args) => super::posteriordb::run(*args),
    }
}

/// Training rows of a timing workload.
struct TrainingData {
    x: Vec<f64>,
    y: Vec<f64>,
    features: usize,
}

/// The training rows of split 0 of a UCI set, or seeded synthetic data of its shape when the
/// files are missing (`false`).
fn split_or_synthetic(
    name: &str,
    data_dir: &Path,
    rows: usize,
    features: usize,
    classes: bool,
) -> (TrainingData, bool) {
    if let Ok(ds) = parvi_data::load(name, data_dir)
        && let Ok(p) = parvi_data::prepare(&ds, 0, DevSplit::None)
    {
        return (TrainingData { x: p.x_train, y: p.y_train, features: p.features }, true);
    }
    let mut rng = EngineRng::new(11);
    let x: Vec<f64> = (0..rows * features).map(|_| rng.normal()).collect();
    let y = x
        .chunks(features)
        .map(|r| {
            let v = r[0] - 0.5 * r[1] + 0.3 * rng.normal();
            if classes { f64::from(v > 0.0) } else { v }
        })
        .collect();
    (TrainingData { x, y, features }, false)
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
    if let Some(point) = &args.scaling_point {
        return scaling::run_point(point, &backends);
    }
    let wanted = |name: &str| args.only.is_empty() || args.only.iter().any(|o| name.starts_with(o.as_str()));
    let data_dir = parvi_data::data_dir(args.data_dir.as_deref());
    let (boston, real_boston) = split_or_synthetic("boston", &data_dir, 455, 13, false);
    let (cancer, real_cancer) = split_or_synthetic("breast-cancer", &data_dir, 455, 30, true);
    for (name, real) in [("boston", real_boston), ("breast-cancer", real_cancer)] {
        if !real {
            eprintln!("note: no {name} files under {}; timing synthetic data of its shape", data_dir.display());
        }
    }
    let kernel = super::method::kernel_from_name(&args.kernel, None)?;
    let mut timing = Timing { steps: args.steps, repeats: args.repeats, guard_every: 1, kernel };
    let mut rows = Vec::new();
    let (mut jax_done, mut jax_rows) = (false, Vec::new());
    println!("{:<28} {:<8} {:>9} {:>10} {:>14}", "workload", "backend", "particles", "ms/step", "reference ms");
    let mut emit = |row: SpeedRow| {
        let reference = row.reference_ms_per_step.map_or(String::new(), |r| format!("{r:.3}"));
        println!(
            "{:<28} {:<8} {:>9} {:>10.3} {:>14}",
            row.workload, row.backend, row.particles, row.ms_per_step, reference
        );
        rows.push(row);
    };
    for &backend in &backends {
        let device = match backend.device() {
            Ok(d) => d,
            Err(e) => {
                println!("{:<28} {:<8} skipped: {e}", "", backend.name());
                continue;
            }
        };
        timing.guard_every = if backend == BackendKind::Wgpu { 25 } else { 1 };
        let row = |workload: String, particles: usize, dim: usize, ms: f64, reference: Option<f64>| SpeedRow {
            workload,
            backend: backend.name().into(),
            particles,
            dim,
            ms_per_step: ms,
            reference_ms_per_step: reference,
            peak_rss_mb: None,
        };
        let bnn = Bnn::new(&boston.x, &boston.y, boston.features, 50, &device)?;
        let bnn_start = Particles::new(bnn.init(BNN_PARTICLES, 1, &device)?);
        if wanted("bnn") {
            let ms = timing.engine("svgd", &bnn, &bnn_start, Some(BATCH))?;
            let reference = timing.handwritten(&boston, &bnn_start)?;
            emit(row("svgd-bnn-boston".into(), BNN_PARTICLES, bnn.dim(), ms, Some(reference)));
            // The same step hand-fused and jit-compiled in JAX (CPU), when python3 has jax.
            if !jax_done {
                jax_done = true;
                match jax::time_step(&boston, &bnn_start, timing.steps, timing.repeats, BATCH) {
                    Ok(jax) => {
                        println!(
                            "{:<28} {:<8} {:>9} {:>10.3} {:>14}",
                            "jax-jit-bnn-boston",
                            "jax-cpu",
                            BNN_PARTICLES,
                            jax.ms_per_step,
                            format!("{reference:.3}")
                        );
                        println!(
                            "  parvi / JAX: {:.2} (jax {}, {}; its particles after {} steps within {:.1e} of the \
                             hand-written step's)",
                            ms / jax.ms_per_step,
                            jax.version,
                            jax.device,
                            timing.steps,
                            jax.max_difference
                        );
                        jax_rows.push(SpeedRow {
                            workload: "jax-jit-bnn-boston".into(),
                            backend: "jax-cpu".into(),
                            particles: BNN_PARTICLES,
                            dim: bnn.dim(),
                            ms_per_step: jax.ms_per_step,
                            reference_ms_per_step: Some(reference),
                            peak_rss_mb: None,
                        });
                    }
                    Err(e) => println!("{:<28} {:<8} skipped: {e:#}", "jax-jit-bnn-boston", "jax-cpu"),
                }
            }
            // The same network with its layers built from plain tensor ops (a dozen autodiff
            // nodes per layer instead of one fused node): what the fused layers save.
            let config = BnnConfig { layer_ops: LayerOps::Plain, ..BnnConfig::default() };
            let plain = Bnn::from_config(&boston.x, &boston.y, boston.features, &config, &device)?;
            let ms = timing.engine("svgd", &plain, &bnn_start, Some(BATCH))?;
            emit(row("svgd-bnn-boston-plain-layers".into(), BNN_PARTICLES, plain.dim(), ms, Some(reference)));
        }
        if wanted("blr") {
            let blr = LogisticRegression::new(&cancer.x, &cancer.y, cancer.features, &device)?;
            let start = Particles::gaussian(BLR_PARTICLES, blr.dim(), 0.0, 0.1, &mut EngineRng::new(2), &device)?;
            let ms = timing.engine("svgd", &blr, &start, Some(BATCH))?;
            emit(row("svgd-blr-breast-cancer".into(), BLR_PARTICLES, blr.dim(), ms, None));
        }
        if wanted("gaussian") {
            let dim = BOSTON_BNN_DIM;
            let target = Gaussian::diagonal(&vec![0.5; dim], &vec![1.0; dim], &device)?;
            for &n in &args.particles {
                let start = Particles::gaussian(n, dim, 0.0, 1.0, &mut EngineRng::new(1), &device)?;
                let ms = timing.engine("svgd", &target, &start, None)?;
                emit(row(format!("svgd-gaussian-{dim}d"), n, dim, ms, None));
            }
        }
        if wanted("engines") {
            for &method in MethodConfig::NAMES.iter().filter(|m| **m != "svgd") {
                // Pathfinder does all its work (every path's L-BFGS, the draws, the resampling) in
                // its first step: a time per step means nothing for it.
                if method == "pathfinder" {
                    println!("{:<28} {:<8} skipped: not a per-step method", "pathfinder-bnn-boston", backend.name());
                    continue;
                }
                match timing.engine(method, &bnn, &bnn_start, Some(BATCH)) {
                    Ok(ms) => emit(row(format!("{method}-bnn-boston"), BNN_PARTICLES, bnn.dim(), ms, None)),
                    Err(e) => println!("{:<28} {:<8} skipped: {e:#}", format!("{method}-bnn-boston"), backend.name()),
                }
            }
        }
    }
    rows.extend(jax_rows);
    if args.scaling {
        scaling::table(&args, &backends, &mut rows)?;
    }
    if let Some(path) = &args.json {
        write_atomic(path, &serde_json::to_vec_pretty(&rows)?)?;
    }
    Ok(())
}

struct Timing {
    steps: usize,
    repeats: usize,
    /// The run loop's divergence check interval: every step on a CPU, every 25 on wgpu, where
    /// each check waits for the queued GPU work.
    guard_every: usize,
    /// The shared kernel.
    kernel: parvi_infer::KernelConfig,
}

impl Timing {
    /// Median ms per step of `method` (default options, AdaGrad 1e-3) over the repeats, after one
    /// warm-up run, through the real run loop.
    fn engine(&self, method: &str, model: &dyn LogDensity, start: &Particles, batch: Option<usize>) -> Result<f64> {
        let spec =
            EngineSpec::new(MethodConfig::default_for(method)?, self.kernel.clone(), AdapterConfig::adagrad(1e-3));
        let mut times = Vec::with_capacity(self.repeats);
        for rep in 0..=self.repeats {
            let mut engine = spec.build()?;
            let config = RunConfig {
                batch_size: batch,
                batch_order: BatchOrder::Cycle,
                guard_every: self.guard_every,
                ..RunConfig::new(self.steps, 0)
            };
            let outcome = Runner::new(engine.as_mut(), model, start.clone(), config)?.run(&mut [])?;
            if rep > 0 {
                times.push(outcome.ms_per_step());
            }
        }
        Ok(median(times))
    }

    /// Median ms per step of the hand-written BNN SVGD step on the same data and particles.
    fn handwritten(&self, data: &TrainingData, start: &Particles) -> Result<f64> {
        let shape = BnnShape { inputs: data.features, hidden: 50 };
        let x: Vec<f32> = data.x.iter().map(|&v| v as f32).collect();
        let y: Vec<f32> = data.y.iter().map(|&v| v as f32).collect();
        let host = to_vec_f32(&start.positions);
        let mut times = Vec::with_capacity(self.repeats);
        for rep in 0..=self.repeats {
            let mut step = HandwrittenSvgd::new(shape, start.len(), &x, &y, 1e-3, 0.9, 1e-6);
            let mut particles = host.clone();
            let mut batches = BatchStream::new(data.y.len(), BATCH, BatchOrder::Cycle, 0)
                .context("batch stream for the hand-written step")?;
            let clock = Instant::now();
            for _ in 0..self.steps {
                let rows = batches.next_indices();
                step.step(&mut particles, &rows);
            }
            if rep > 0 {
                times.push(1e3 * clock.elapsed().as_secs_f64() / self.steps as f64);
            }
        }
        Ok(median(times))
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}
