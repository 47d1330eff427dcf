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
//!     fit.write("out".as_ref())?; // draws.csv (CmdStan's format), summary.csv
//!     Ok(())
//! }
//! ```

use std::path::Path;

use burn::tensor::{Device, Tensor};
use parvi_infer::evaluation::{Loo, PolishWhen, Summary};
use parvi_infer::{EngineSpec, FitConfig, FitResult, InferError, RunError};
use parvi_model::program::StanModel;
use parvi_models::cmdstan::{CmdStanError, Draws, RunInfo, write_atomic};
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
    /// What `draws.csv`'s comments say about the run.
    pub run: RunInfo,
}

impl std::fmt::Debug for ModelFit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelFit").field("draws", &self.draws.rows()).field("run", &self.run).finish()
    }
}

/// Runs the default path on `model` and reports its draws; the generated quantities are drawn
/// with the run's seed. `model_name` names the model in the files.
pub fn fit_model(
    model: &dyn StanModel,
    spec: &EngineSpec,
    config: &FitConfig,
    device: &Device,
) -> Result<ModelFit, WorkflowError> {
    // The polish step stops on the statistics the summary prints, of the reported quantities.
    let reported = |x: Tensor<2>| reported_or_nan(model, x);
    let result = parvi_infer::fit_reported(model, Some(&reported), spec, config, &mut [], device)?;
    let method = spec.method.name().to_string();
    let draws = Draws::of_model(
        model,
        result.draws.positions.clone(),
        result.draws.weights.clone(),
        result.chains,
        config.seed,
    )?;
    let mut run = run_info(&result, config, &method, &draws);
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

/// The CSV comments' record of a run: what the draws are, the seed, and every phase's seconds
/// (the preconditioner's search as warm-up; the engine, its check and the polish step as
/// sampling, since the polish step's chains are the draws written).
pub fn run_info(result: &FitResult, config: &FitConfig, method: &str, draws: &Draws) -> RunInfo {
    RunInfo {
        method: method.to_string(),
        draws_are: draws_are(result, config, method, draws),
        steps: result.steps,
        seed: config.seed,
        warmup_seconds: result.laplace_seconds,
        sampling_seconds: sampling_seconds(result),
        warnings: result.diagnostics.warnings.clone(),
        ..RunInfo::default()
    }
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
    let columns: Vec<Vec<f64>> = names.iter().map(|n| draws.column(n).unwrap_or_default()).collect();
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

    /// Writes `dir/draws.csv` (CmdStan's format) and `dir/summary.csv`, each atomically; the
    /// summary is computed first, so a failure writes neither.
    pub fn write(&self, dir: &Path) -> Result<(), WorkflowError> {
        let summary = self.summary()?;
        std::fs::create_dir_all(dir).map_err(|error| CmdStanError::Io {
            action: "create",
            path: dir.to_path_buf(),
            error,
        })?;
        self.draws.write_csv(&dir.join("draws.csv"), &self.run)?;
        write_atomic(&dir.join("summary.csv"), summary.to_csv().as_bytes())?;
        Ok(())
    }
}
