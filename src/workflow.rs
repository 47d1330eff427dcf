//! A user's own model from data to draws, as cmdstanpy's `CmdStanModel.sample` gives a fitted
//! object: [`fit_model`] runs the library's default path ([`parvi_infer::fit`]) on any
//! [`StanModel`] (a compiled `Program`, a posteriordb model) and returns a [`ModelFit`]: the
//! draws on the constrained scale under Stan's names with the generated quantities, the
//! `stansummary` table, the run's record for CmdStan's CSV comments, and the files a Stan user's
//! other tools read.
//!
//! ```no_run
//! use parvi::infer::{EngineSpec, FitConfig, MethodConfig, KernelConfig, AdapterConfig};
//! use parvi::model::BackendKind;
//! use parvi::model::program::Compiled;
//! use parvi::models::posteriordb;
//! use parvi::workflow::fit_model;
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let device = BackendKind::Flex.device()?;
//!     let model = posteriordb::load_folder("posteriordb/kidiq-kidscore_momiq".as_ref(), &device)?;
//!     let spec = EngineSpec::new(MethodConfig::default_for("svgd")?, KernelConfig::default(), AdapterConfig::adagrad(0.05));
//!     let fit = fit_model(&model, &spec, &FitConfig::default(), &device)?;
//!     println!("{}", fit.summary()?.table());
//!     fit.write("out".as_ref())?; // draws_1.csv, ... (CmdStan's format, a file per chain), summary.csv
//!     Ok(())
//! }
//! ```

use std::path::Path;

use burn::tensor::{Device, Tensor};
use parvi_infer::engines::ChainReport;
use parvi_infer::evaluation::{Loo, Summary};
use parvi_infer::samplers::{Polish, PolishWhen};
use parvi_infer::{EngineSpec, FitConfig, FitResult, InferError, MethodConfig, RunError};
use parvi_model::program::StanModel;
use parvi_models::cmdstan::{ChainRecord, CmdStanError, Draws, RunInfo, chain_files, thinning, write_atomic};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// What can go wrong between a model and its written draws.
#[derive(Debug, Error)]
pub enum WorkflowError {
    /// The run failed (diverged, bad settings, a model error).
    #[error(transparent)]
    Run(#[from] RunError),
    /// The draws could not be reported, summarised or written.
    #[error(transparent)]
    Draws(#[from] CmdStanError),
    /// The summary could not be computed.
    #[error(transparent)]
    Summary(#[from] InferError),
}

/// A fitted model: the run, its draws under Stan's names (generated quantities included), and
/// the record written into CmdStan's CSV comments.
pub struct ModelFit {
    /// The default path's result, in the model's unconstrained coordinates.
    pub result: FitResult,
    /// The draws on the constrained scale: parameters, transformed parameters, generated
    /// quantities, `lp__`.
    pub draws: Draws,
    /// What the draws files' comments say about the run.
    pub run: RunInfo,
}

/// Draws kept by default: Stan's 4 chains x 1,000 (`--draws`).
pub const DEFAULT_DRAWS: usize = 4000;

/// The draws a fit keeps and how: MCMC chains thinned evenly within each chain to about
/// `--draws` ([`thinning`]), every chain kept; a particle set whole.
pub struct Kept {
    /// The kept draws, unconstrained, snapshot-major as [`FitResult::draws`].
    pub positions: Tensor<2>,
    /// A weighted particle set's weights.
    pub weights: Option<Tensor<1>>,
    /// Their chains (`None`: a particle set).
    pub chains: Option<usize>,
    /// The stride within each chain (1: every draw).
    pub thin: usize,
    /// The draws the fit returned (the convergence rule's, for the polish step).
    pub counted: usize,
}

/// The draws of `result` kept for the files and the summary: at most about `max_draws` of an
/// MCMC run (thinned within chains), a particle set whole.
pub fn kept_draws(result: &FitResult, max_draws: usize) -> Kept {
    let positions = result.draws.positions.clone();
    let counted = positions.dims()[0];
    let weights = result.draws.weights.clone();
    let Some(chains) = result.chains.filter(|&c| c > 0 && counted.is_multiple_of(c)) else {
        return Kept { positions, weights, chains: result.chains, thin: 1, counted };
    };
    let (thin, keep) = thinning(chains, counted / chains, max_draws);
    if thin == 1 {
        return Kept { positions, weights, chains: Some(chains), thin, counted };
    }
    // Snapshot-major: draw `s` of chain `c` is row `s * chains + c`.
    let rows: Vec<i64> = keep.iter().flat_map(|&s| (0..chains).map(move |c| (s * chains + c) as i64)).collect();
    let device = positions.device();
    let len = rows.len();
    let index = Tensor::<1, burn::tensor::Int>::from_data(burn::tensor::TensorData::new(rows, [len]), &device);
    Kept { positions: positions.select(0, index), weights: None, chains: Some(chains), thin, counted }
}

/// The draws of `model` from what a fit kept, the chains grouped into files ([`chain_files`]).
pub fn kept_model_draws(model: &dyn StanModel, kept: &Kept, seed: u64) -> Result<Draws, CmdStanError> {
    let draws = Draws::of_model(model, kept.positions.clone(), kept.weights.clone(), kept.chains, seed)?;
    let files = chain_files(draws.chains());
    draws.grouped(files)
}

/// A NUTS run's record, as `summary.json` holds it: what ran, chain by chain.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SamplerRecord {
    /// The sampler (`nuts`).
    pub algorithm: String,
    /// Chains.
    pub chains: usize,
    /// Warm-up iterations per chain.
    pub warmup: usize,
    /// Draws sampled per chain after the warm-up.
    pub draws_per_chain: usize,
    /// The metric: `diag_e`, estimated from the windows' draws (`draw-variance`) or draws and
    /// gradients (`gradient-scaled`).
    pub metric: String,
    /// Largest tree depth.
    pub max_depth: usize,
    /// Target acceptance statistic of the step-size adaptation.
    pub target_accept: f64,
    /// The coordinates the chains ran in: `laplace` (whitened by the Laplace approximation at
    /// the mode: step sizes and metric are in its units), `pathfinder`, or `none` (the model's
    /// unconstrained coordinates).
    pub coordinates: String,
    /// Per chain: the adapted step size.
    pub step_sizes: Vec<f64>,
    /// Per chain: divergent transitions after the warm-up.
    pub divergences: Vec<usize>,
    /// Per chain: draws whose tree reached `max_depth`.
    pub max_depth_hits: Vec<usize>,
    /// Per chain: the diagonal inverse metric.
    pub inv_metrics: Vec<Vec<f64>>,
    /// Wall seconds of the sampler (warm-up and draws).
    pub seconds: f64,
}

/// One phase of a fit and what it cost.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Phase {
    /// `precondition`, the engine's name, `check` (the stationarity check), `polish`, or the
    /// kernel that polished before NUTS took over (`polish_before_nuts`).
    pub name: String,
    /// Steps (per chain for chains; 0 for a search).
    pub steps: usize,
    /// Wall seconds.
    pub seconds: f64,
}

/// The polish step's transitions per chain after its warm-up (NUTS's and ChEES's `steps` count
/// gradients).
fn iterations(polish: &Polish) -> usize {
    if polish.iterations > 0 { polish.iterations } else { polish.steps }
}

/// A NUTS engine's record (`None` for other methods, or where its report lacks the chains).
pub fn sampler_record(result: &FitResult, spec: &EngineSpec) -> Option<SamplerRecord> {
    let MethodConfig::Nuts(config) = &spec.method else { return None };
    let reports: Vec<ChainReport> = serde_json::from_value(result.report.get("chain_reports")?.clone()).ok()?;
    Some(SamplerRecord {
        algorithm: "nuts".into(),
        chains: reports.len(),
        warmup: config.warmup,
        draws_per_chain: config.draws,
        metric: format!("diag_e ({})", metric_name(config)),
        max_depth: config.max_depth,
        target_accept: config.target_accept,
        coordinates: coordinates(result),
        step_sizes: reports.iter().map(|r| r.step_size).collect(),
        divergences: reports.iter().map(|r| r.divergences).collect(),
        max_depth_hits: reports.iter().map(|r| r.max_depth_hits).collect(),
        inv_metrics: reports.iter().map(|r| r.inv_metric.clone()).collect(),
        seconds: result.report.get("seconds").and_then(serde_json::Value::as_f64).unwrap_or(result.seconds),
    })
}

fn metric_name(config: &parvi_infer::NutsConfig) -> &'static str {
    match config.metric_estimate {
        parvi_infer::MetricEstimate::GradientScaled => "gradient-scaled",
        _ => "draw-variance",
    }
}

/// The coordinates the engine and the chains ran in, by the preconditioner used.
fn coordinates(result: &FitResult) -> String {
    format!("{:?}", result.precondition).to_lowercase()
}

/// Each phase of a fit that ran, with its steps and seconds: the preconditioner's search, the
/// engine, the stationarity check, the polish step (and the kernel before NUTS where NUTS took
/// over).
pub fn phases(result: &FitResult, spec: &EngineSpec) -> Vec<Phase> {
    let mut phases = vec![Phase { name: "precondition".into(), steps: 0, seconds: result.laplace_seconds }];
    // A sampler's iterations per chain (warm-up and draws), not the run loop's steps (NUTS runs
    // whole in its first).
    let steps = match &spec.method {
        MethodConfig::Nuts(config) => config.warmup + config.draws,
        _ => result.steps,
    };
    phases.push(Phase { name: spec.method.name().into(), steps, seconds: result.seconds });
    let d = &result.diagnostics;
    if let Some(s) = &d.stationarity {
        phases.push(Phase { name: "check".into(), steps: s.steps, seconds: s.seconds });
    }
    if let Some(p) = &d.polish {
        if let Some(before) = &p.before_nuts {
            phases.push(Phase {
                name: "polish_before_nuts".into(),
                steps: before.warmup + iterations(before),
                seconds: before.seconds,
            });
        }
        let own = p.seconds - p.before_nuts.as_ref().map_or(0.0, |b| b.seconds);
        phases.push(Phase { name: "polish".into(), steps: p.warmup + iterations(p), seconds: own });
    }
    phases
}

impl std::fmt::Debug for ModelFit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelFit").field("draws", &self.draws.rows()).field("run", &self.run).finish()
    }
}

/// Runs the default path on `model` and reports its draws ([`DEFAULT_DRAWS`] of them at most,
/// thinned within chains); the generated quantities are drawn with the run's seed.
pub fn fit_model(
    model: &dyn StanModel,
    spec: &EngineSpec,
    config: &FitConfig,
    device: &Device,
) -> Result<ModelFit, WorkflowError> {
    fit_model_keeping(model, spec, config, DEFAULT_DRAWS, device)
}

/// [`fit_model`] keeping about `max_draws` draws of MCMC chains (`--draws`).
pub fn fit_model_keeping(
    model: &dyn StanModel,
    spec: &EngineSpec,
    config: &FitConfig,
    max_draws: usize,
    device: &Device,
) -> Result<ModelFit, WorkflowError> {
    // The polish step stops on the statistics the summary prints, of the reported quantities.
    let reported = |x: Tensor<2>| reported_or_nan(model, x);
    let result = parvi_infer::fit_reported(model, Some(&reported), spec, config, &mut [], device)?;
    let kept = kept_draws(&result, max_draws);
    let draws = kept_model_draws(model, &kept, config.seed)?;
    let mut run = run_info(&result, config, spec, &draws, &kept);
    if result.chains.is_some() {
        let extra = summary_warnings(&summarize(&draws, true)?, &run.warnings);
        run.warnings.extend(extra);
    }
    Ok(ModelFit { result, draws, run })
}

/// The model's reported quantities `[n, p]` of unconstrained draws, NaN rows where the model
/// cannot report them (as its log density gives NaN), for the polish step's statistics.
pub fn reported_or_nan(model: &dyn StanModel, x: Tensor<2>) -> Tensor<2> {
    let [n, _] = x.dims();
    let device = x.device();
    model.reported(x).unwrap_or_else(|_| Tensor::full([n, model.names().len()], f32::NAN, &device))
}

/// The summary's own verdict on MCMC draws, in Stan's words: every quantity (`lp__` included)
/// whose rank-normalised split R-hat is above 1.01 is named, so no summary shows one without a
/// warning (none is added where the run's `warnings` already speak of R-hat: the polish step
/// stops on the same statistic, and says so when its budget ran out).
pub fn summary_warnings(summary: &Summary, warnings_so_far: &[String]) -> Vec<String> {
    let mut warnings = Vec::new();
    if warnings_so_far.iter().any(|w| w.contains("R-hat")) {
        return warnings;
    }
    let over: Vec<String> = summary
        .rows
        .iter()
        .filter(|r| !r.is_constant())
        .filter_map(|r| {
            r.rhat.filter(|&rhat| rhat > RHAT_LIMIT || rhat.is_nan()).map(|rhat| format!("{} ({rhat:.3})", r.name))
        })
        .collect();
    if !over.is_empty() {
        warnings.push(format!(
            "R-hat above {RHAT_LIMIT} for {} of {} quantities: {}{}; the chains have not mixed, their means are not to be trusted (run the polish step longer: PolishConfig::steps, --polish-steps)",
            over.len(),
            summary.rows.len(),
            over.iter().take(5).cloned().collect::<Vec<_>>().join(", "),
            if over.len() > 5 { ", ..." } else { "" }
        ));
    }
    warnings
}

/// Stan's convergence threshold for rank-normalised split R-hat (Vehtari et al. 2021), the
/// polish step's.
pub const RHAT_LIMIT: f64 = parvi_infer::fit::MAX_RHAT;

/// The CSV comments' record of a run, true to what ran: what the draws are, the seed, the
/// sampler's block as CmdStan writes it, and the settings that applied: a NUTS run's chains,
/// warm-up, draws, metric, coordinates and each chain's step size, metric, divergences and
/// tree-depth hits (no particle settings); a polished fit's phases with their steps and seconds;
/// a particle set's particles, steps and engine settings. Seconds: the preconditioner's search as
/// CmdStan's warm-up line, the rest as sampling.
pub fn run_info(result: &FitResult, config: &FitConfig, spec: &EngineSpec, draws: &Draws, kept: &Kept) -> RunInfo {
    let method = spec.method.name();
    let mut run = RunInfo {
        method: method.to_string(),
        draws_are: draws_are(result, config, method, draws),
        seed: config.seed,
        thin: kept.thin,
        warmup_seconds: result.laplace_seconds,
        sampling_seconds: sampling_seconds(result),
        warnings: result.diagnostics.warnings.clone(),
        ..RunInfo::default()
    };
    let setting = |run: &mut RunInfo, key: &str, value: String| run.settings.push((key.to_string(), value));
    let kept_line = |run: &mut RunInfo| {
        let line = format!("{} of {} (every {} a chain)", draws.rows(), kept.counted, kept.thin);
        run.settings.push(("kept_draws".to_string(), line.replace(' ', "_")));
    };
    if let Some(sampler) = sampler_record(result, spec) {
        run.warmup = sampler.warmup;
        run.algorithm = vec![
            (0, "adapt".into()),
            (1, "engaged = true".into()),
            (1, format!("delta = {}", sampler.target_accept)),
            (0, "algorithm = hmc".into()),
            (1, "hmc".into()),
            (2, "engine = nuts".into()),
            (3, "nuts".into()),
            (4, format!("max_depth = {}", sampler.max_depth)),
            (2, "metric = diag_e".into()),
        ];
        setting(&mut run, "chains", sampler.chains.to_string());
        setting(&mut run, "warmup", sampler.warmup.to_string());
        setting(&mut run, "draws_per_chain_sampled", sampler.draws_per_chain.to_string());
        kept_line(&mut run);
        setting(&mut run, "metric", sampler.metric.replace(' ', "_"));
        setting(&mut run, "coordinates", sampler.coordinates.clone());
        setting(&mut run, "precondition_seconds", format!("{:.3}", result.laplace_seconds));
        setting(&mut run, "sampler_seconds", format!("{:.3}", sampler.seconds));
        run.chain_records = chain_records(&sampler, draws.chains_per_file());
        return run;
    }
    if let Some(polish) = &result.diagnostics.polish {
        run.warmup = polish.warmup;
        run.thin = polish.thin.max(1) * kept.thin;
        run.algorithm = vec![(0, format!("algorithm = {}", polish.kernel.name()))];
        setting(&mut run, "coordinates", coordinates(result));
        for phase in phases(result, spec) {
            setting(&mut run, &format!("{}_steps", phase.name), phase.steps.to_string());
            setting(&mut run, &format!("{}_seconds", phase.name), format!("{:.3}", phase.seconds));
        }
        setting(&mut run, "particles", result.particles.len().to_string());
        polish_settings(&mut run, polish);
        kept_line(&mut run);
        if let Some(step_size) = Some(polish.step_size).filter(|s| s.is_finite()) {
            run.chain_records =
                vec![ChainRecord { step_size: Some(step_size), ..ChainRecord::default() }; draws.chains()];
        }
        return run;
    }
    run.warmup = result.steps;
    setting(&mut run, "particles", result.particles.len().to_string());
    setting(&mut run, "steps", result.steps.to_string());
    setting(&mut run, "coordinates", coordinates(result));
    setting(&mut run, "precondition_seconds", format!("{:.3}", result.laplace_seconds));
    setting(&mut run, "engine_seconds", format!("{:.3}", result.seconds));
    if result.chains.is_some() {
        kept_line(&mut run);
    }
    run
}

/// The polish step's settings: its kernel, chains, warm-up, steps, thinning and the rule's
/// verdict on the draws it counted.
fn polish_settings(run: &mut RunInfo, polish: &Polish) {
    let mut setting = |key: &str, value: String| run.settings.push((format!("polish_{key}"), value));
    setting("kernel", polish.kernel.name().to_string());
    setting("chains", polish.chains.to_string());
    setting("warmup", polish.warmup.to_string());
    setting("iterations", iterations(polish).to_string());
    setting("gradients_per_chain", polish.steps.to_string());
    setting("thin", polish.thin.to_string());
    setting("counted_per_chain", polish.kept.to_string());
    setting("max_rhat", format!("{:.4}", polish.max_rhat));
    setting("min_ess", format!("{:.0}", polish.min_ess));
    setting("converged", polish.converged.to_string());
    if polish.divergences > 0 {
        setting("divergences", polish.divergences.to_string());
    }
    if let Some(before) = &polish.before_nuts {
        setting("before_nuts_kernel", before.kernel.name().to_string());
        setting("before_nuts_warmup", before.warmup.to_string());
        setting("before_nuts_iterations", iterations(before).to_string());
    }
}

/// Each file's record of a NUTS run: a chain's own (step size, metric, divergences, tree-depth
/// hits), or a group's lists where several chains share a file.
fn chain_records(sampler: &SamplerRecord, per_file: usize) -> Vec<ChainRecord> {
    let join = |v: &[usize]| v.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
    (0..sampler.chains.div_ceil(per_file.max(1)))
        .map(|f| {
            let chains = f * per_file..((f + 1) * per_file).min(sampler.chains);
            let one = chains.len() == 1;
            ChainRecord {
                settings: vec![
                    ("divergences".into(), join(&sampler.divergences[chains.clone()])),
                    ("max_depth_hits".into(), join(&sampler.max_depth_hits[chains.clone()])),
                    (
                        "step_size".into(),
                        sampler.step_sizes[chains.clone()]
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join(","),
                    ),
                ],
                step_size: one.then(|| sampler.step_sizes[chains.start]),
                inv_metric: one.then(|| sampler.inv_metrics[chains.start].clone()),
            }
        })
        .collect()
}

/// Seconds from the engine's start to the last draw: the run, the stationarity check and the
/// polish step.
pub fn sampling_seconds(result: &FitResult) -> f64 {
    let diagnostics = &result.diagnostics;
    result.seconds
        + diagnostics.stationarity.as_ref().map_or(0.0, |s| s.seconds)
        + diagnostics.polish.as_ref().map_or(0.0, |p| p.seconds)
}

/// What the draws are, in words for the CSV comments and the summary's header.
fn draws_are(result: &FitResult, config: &FitConfig, method: &str, draws: &Draws) -> String {
    if let Some(polish) = &result.diagnostics.polish {
        let kernel = polish.kernel.name();
        if config.polish.is_some_and(|p| p.when == PolishWhen::Always) {
            format!(
                "{kernel} draws of the polish step, its chains started from the {method} particles (FitConfig::polish = None, or --no-polish, keeps the particles)"
            )
        } else {
            format!(
                "{kernel} draws of the polish step, its chains started from the {method} particles: the diagnostics flagged the particles"
            )
        }
    } else if method == "nuts" {
        "NUTS draws after each chain's warm-up".to_string()
    } else if result.chains.is_some() {
        format!("{method}'s MCMC draws, one chain per particle")
    } else if draws.weights().is_some() {
        format!("{method}'s final weighted particles, resampled")
    } else {
        format!("{method}'s final particles")
    }
}

/// The `stansummary`-style summary of `draws` (`lp__` first): MCMC chains (`mcmc`, at least
/// four draws each) with MCSE, ESS and R-hat; a particle set (weighted or not) without them.
pub fn summarize(draws: &Draws, mcmc: bool) -> Result<Summary, InferError> {
    let names: Vec<String> = std::iter::once("lp__".to_string()).chain(draws.names().iter().cloned()).collect();
    // The columns in one pass over the row-major values (no lookup by name per column).
    let p = draws.names().len();
    let mut columns: Vec<Vec<f64>> = vec![Vec::with_capacity(draws.rows()); p + 1];
    columns[0].extend_from_slice(draws.lp());
    for row in draws.values().chunks_exact(p) {
        for (column, &v) in columns[1..].iter_mut().zip(row) {
            column.push(v);
        }
    }
    // Chains too short for the split-chain statistics are summarised as a set of draws.
    if mcmc && draws.draws_per_chain() >= 4 {
        Summary::of_chains(&names, &columns, draws.chains())
    } else {
        Summary::of_particles(&names, &columns, draws.weights())
    }
}

/// PSIS-LOO (Vehtari, Gelman & Gabry 2017) from the draws' pointwise log-likelihood, the
/// generated quantity `log_lik` (`log_lik[1]`, ... or a lone `log_lik`), as Stan users write it;
/// `None` when the draws have none. A weighted particle set is resampled first (with `seed`);
/// MCMC draws keep their chains for the relative efficiency.
pub fn loo_of(draws: &Draws, seed: u64) -> Option<Result<Loo, InferError>> {
    let draws = draws.resampled(seed);
    let columns: Vec<Vec<f64>> = draws
        .names()
        .iter()
        .filter(|n| *n == "log_lik" || n.starts_with("log_lik["))
        .filter_map(|n| draws.column(n))
        .collect();
    if columns.is_empty() {
        return None;
    }
    // Draws are chain after chain; `loo` reads draw `s` of chain `c` at row `s * chains + c`.
    let (chains, per) = (draws.chains(), draws.draws_per_chain());
    let points = columns.len();
    let mut log_lik = Vec::with_capacity(per * chains * points);
    for s in 0..per {
        for c in 0..chains {
            log_lik.extend(columns.iter().map(|col| col[c * per + s]));
        }
    }
    Some(parvi_infer::evaluation::loo(&log_lik, points, chains))
}

impl ModelFit {
    /// PSIS-LOO from the generated `log_lik`, if the model generates one ([`loo_of`]).
    pub fn loo(&self) -> Option<Result<Loo, InferError>> {
        loo_of(&self.draws, self.run.seed)
    }

    /// The `stansummary` table of the draws.
    pub fn summary(&self) -> Result<Summary, InferError> {
        summarize(&self.draws, self.result.chains.is_some())
    }

    /// Every draw of quantity `name` (Stan's `theta[1]` or CmdStan's `theta.1`; `lp__`).
    pub fn column(&self, name: &str) -> Option<Vec<f64>> {
        self.draws.column(name)
    }

    /// Writes `dir/draws_1.csv`, ... (CmdStan's format, a file per chain) and
    /// `dir/summary.csv`, each atomically; the summary is computed first, so a failure writes
    /// none.
    pub fn write(&self, dir: &Path) -> Result<(), WorkflowError> {
        let summary = self.summary()?;
        std::fs::create_dir_all(dir).map_err(|error| CmdStanError::Io {
            action: "create",
            path: dir.to_path_buf(),
            error,
        })?;
        self.draws.write_files(dir, "draws", &self.run)?;
        write_atomic(&dir.join("summary.csv"), summary.to_csv().as_bytes())?;
        Ok(())
    }
}
