//! Soak benchmark: a long run with the process's resident memory sampled as it goes, to show
//! that memory stays flat after warm-up (no growth per step: no leak in the autodiff graph, the
//! step-size state, the checkpoints or the trace).
//!
//! ```sh
//! # 10^6 SVGD steps on the 2-D Gaussian (100 particles)
//! cargo run --release --example soak -- gaussian 1000000
//! # 10^5 SVGD steps of the Boston BNN (20 particles, minibatches of 100; real data)
//! PARVI_DATA_DIR=../shared/uci cargo run --release --example soak -- boston 100000
//! ```
//!
//! Prints the resident set (VmRSS) and its peak (VmHWM) every tenth of the run; the first
//! sample is taken after a warm-up of 1% of the steps (allocator pools and caches filled).

use anyhow::{Context, Result, bail};
use parvi::infer::{
    AdapterConfig, Callback, EngineRng, EngineSpec, InferError, KernelConfig, MethodConfig, Particles, RunConfig,
    Runner,
};
use parvi::model::LogDensity;
use parvi::models::{Bnn, BnnConfig, builtin_target};
use parvi_data::{DevSplit, prepare};

/// Samples `/proc/self/status` every `every` steps.
struct MemorySampler {
    every: usize,
    started: std::time::Instant,
    samples: Vec<(usize, f64, f64)>,
}

/// A `kB` line of `/proc/self/status` in MB.
fn status_mb(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

impl Callback for MemorySampler {
    fn every(&self) -> usize {
        self.every
    }

    fn on_step(&mut self, step: usize, _particles: &Particles) -> Result<(), InferError> {
        let (rss, peak) = (status_mb("VmRSS:"), status_mb("VmHWM:"));
        println!(
            "step {step:>9}: RSS {rss:8.1} MB, peak {peak:8.1} MB, {:7.1} s",
            self.started.elapsed().as_secs_f64()
        );
        self.samples.push((step, rss, peak));
        Ok(())
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let target = args.first().map(String::as_str).unwrap_or("gaussian");
    let steps: usize = match args.get(1) {
        Some(s) => s.parse().with_context(|| format!("steps: `{s}` is not a whole number"))?,
        None => 1_000_000,
    };
    if steps < 100 {
        bail!("steps: at least 100 (the first sample follows a warm-up of 1%), got {steps}");
    }
    let device = parvi::model::BackendKind::Flex.device()?;
    let (model, start, lr, batch): (Box<dyn LogDensity>, Particles, f64, Option<usize>) = match target {
        "gaussian" => {
            let t = builtin_target("gaussian", &device)?;
            let start = Particles::gaussian(100, 2, 0.0, 1.0, &mut EngineRng::new(0), &device)?;
            (t.density, start, 0.05, None)
        }
        "boston" => {
            let ds = parvi_data::load("boston", &parvi_data::data_dir(None))?;
            let data = prepare(&ds, 0, DevSplit::None)?;
            let model = Bnn::from_config(&data.x_train, &data.y_train, data.features, &BnnConfig::default(), &device)?;
            let start = Particles::new(model.init(20, 1, &device)?);
            (Box::new(model), start, 1e-3, Some(100))
        }
        other => bail!("target: `{other}` (expected gaussian or boston)"),
    };
    let spec = EngineSpec::new(MethodConfig::default_for("svgd")?, KernelConfig::default(), AdapterConfig::adagrad(lr));
    let mut engine = spec.build()?;
    let mut sampler = MemorySampler { every: steps / 100, started: std::time::Instant::now(), samples: Vec::new() };
    let config = RunConfig { batch_size: batch, ..RunConfig::new(steps, 0) };
    // Every hundredth of the run is sampled; every tenth is printed.
    let mut printed = TenthPrinter { inner: &mut sampler, calls: 0 };
    let outcome = Runner::new(engine.as_mut(), model.as_ref(), start, config)?.run(&mut [&mut printed])?;
    let after_warmup = sampler.samples.first().copied().context("no sample taken")?;
    let end = sampler.samples.last().copied().context("no sample taken")?;
    let highest = sampler.samples.iter().map(|s| s.1).fold(f64::NEG_INFINITY, f64::max);
    println!(
        "{target}: {} steps, {:.3} ms/step; RSS after warm-up (step {}) {:.1} MB, at the end {:.1} MB \
         (growth {:+.1} MB), highest sample {:.1} MB, peak {:.1} MB",
        outcome.steps,
        outcome.ms_per_step(),
        after_warmup.0,
        after_warmup.1,
        end.1,
        end.1 - after_warmup.1,
        highest,
        end.2
    );
    Ok(())
}

/// Samples every hundredth of the run through `inner`, printing every tenth.
struct TenthPrinter<'a> {
    inner: &'a mut MemorySampler,
    calls: usize,
}

impl Callback for TenthPrinter<'_> {
    fn every(&self) -> usize {
        self.inner.every
    }

    fn on_step(&mut self, step: usize, particles: &Particles) -> Result<(), InferError> {
        self.calls += 1;
        if self.calls == 1 || self.calls.is_multiple_of(10) {
            self.inner.on_step(step, particles)
        } else {
            let (rss, peak) = (status_mb("VmRSS:"), status_mb("VmHWM:"));
            self.inner.samples.push((step, rss, peak));
            Ok(())
        }
    }
}
