//! The default path from a model to a posterior, the same for every engine: precondition by the
//! Laplace approximation or by Pathfinder's (falling back, with a warning, from one whose search
//! ran away), start the particles from it, run the engine, and map what stands for the posterior
//! (the particles, or an MCMC engine's collected draws) back to the model's own coordinates,
//! with the counts a comparison needs.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use burn::tensor::{Device, Tensor};
use parvi_model::{LogDensity, Minibatch};
use serde::{Deserialize, Serialize};

use crate::core::{Checkpoint, Collective};
use crate::engines::pathfinder::{PathfinderConfig, PathfinderFit, pathfinder};
use crate::evaluation::{
    HOPELESS_RHAT, MalaChains, Polish, PolishConfig, PolishKernel, PolishWhen, Polished, Stationarity,
    StationarityConfig, Statistic, TakeOver, ksd_squared, polish_offering, stationarity_check_chains,
};
mod nuts_polish;
use nuts_polish::nuts_polish;

use crate::{
    Callback, CheckpointPolicy, EngineRng, EngineSpec, InferError, Laplace, LaplaceConfig, Particles, Rbf, RunConfig,
    RunError, RunLabel, Runner, Whitened,
};

/// In which coordinates the engine works and where its particles start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Precondition {
    /// The model's own coordinates, particles from `N(0, init_std^2 I)`.
    None,
    /// Whitened by the Laplace approximation at the mode (see [`Laplace`]), particles from it
    /// (`N(0, init_std^2 I)` in whitened coordinates). A search that ran away (down a funnel's
    /// neck: [`Laplace::runaway`]) falls back to Pathfinder, then to none, with a warning.
    #[default]
    Laplace,
    /// Whitened by Pathfinder's importance-weighted mean and covariance
    /// ([`crate::engines::pathfinder`]), particles from its resampled draws (distinct, scaled by
    /// `init_std` in whitened coordinates). An unreliable fit ([`PathfinderFit::problems`]:
    /// k-hat > 0.7, a path that ran away, paths that disagree) falls back to Laplace, then to
    /// none, with a warning.
    Pathfinder,
}

/// Paths whose approximations' means lie further apart than this many posterior sds found
/// different regions: their pooled moments whiten no single one of them.
pub const MAX_PATH_DISAGREEMENT: f64 = 4.0;

/// Engine steps of the default path: [`FitConfig::default`]'s and `parvi fit`'s, one number
/// (issue 44: they were 2000 and 1000). The posteriordb tables of docs/posteriordb.md were
/// measured at 2000.
pub const DEFAULT_STEPS: usize = 2000;

/// When the particle run stops before its step budget: once the particles have stopped moving
/// (issue 45: every posterior paid the full 2,000 steps, whatever it needed). Every `every` steps
/// the particles' moments are compared by [`drift`] (the largest change of a coordinate's mean,
/// in sds, or of its sd, relative) with those `window` looks before; once that is below `tol`,
/// past `min_steps`, the run ends. Comparing across a window rather than with the last look
/// tells a drift from the jitter of an adaptive step: SVGD's particles never stop moving by a
/// few hundredths of an sd a look, which does not add up, while a slow drift does
/// (docs/posteriordb.md).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct SettleConfig {
    /// Steps between two looks (each a host read of the particles' means and variances).
    pub every: usize,
    /// Looks between the two moments compared (`every * window` steps).
    pub window: usize,
    /// No stop before this many steps.
    pub min_steps: usize,
    /// Largest drift over the window that counts as settled: the Monte Carlo error of a mean
    /// from 100 draws (0.1 sd), below which a move changes no answer.
    pub tol: f64,
}

impl Default for SettleConfig {
    fn default() -> Self {
        Self { every: 50, window: 4, min_steps: 200, tol: 0.1 }
    }
}

impl SettleConfig {
    /// Checks every setting, naming the one that is wrong.
    pub fn validate(&self) -> Result<(), InferError> {
        if self.every == 0 || self.window == 0 {
            return Err(InferError::setting("settle", "`every` and `window` must be at least 1"));
        }
        if !(self.tol.is_finite() && self.tol > 0.0) {
            return Err(InferError::setting("settle.tol", format!("must be finite and > 0, got {}", self.tol)));
        }
        Ok(())
    }
}

/// Settings of [`fit`] beyond the engine's own.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct FitConfig {
    /// Number of particles (chains, for an MCMC engine).
    pub particles: usize,
    /// Engine steps.
    pub steps: usize,
    /// Seed of the initial particles, the run and the mode search.
    pub seed: u64,
    /// The coordinates the engine works in.
    pub precondition: Precondition,
    /// The mode search of [`Precondition::Laplace`].
    pub laplace: LaplaceConfig,
    /// Pathfinder's options for [`Precondition::Pathfinder`] (its draws per path are raised to
    /// twice the particles over the paths where that is more).
    pub pathfinder: PathfinderConfig,
    /// Spread of the initial particles (in whitened coordinates with [`Precondition::Laplace`]).
    pub init_std: f64,
    /// Minibatch rows per step (models with data); `None` uses all rows.
    pub batch_size: Option<usize>,
    /// Show a progress bar of the particle run (on by default; it hides itself where stderr is
    /// not a terminal).
    pub progress: bool,
    /// MALA steps per particle of the stationarity check
    /// ([`crate::evaluation::stationarity_check`]) on a non-MCMC engine's final particles (a
    /// quarter adapts the step size; 0 turns the check off). Costs this many model evaluations
    /// with gradient per particle, about a tenth of a default run.
    pub check_steps: usize,
    /// Overall false-alarm rate of the stationarity check for a set of exact draws (Bonferroni
    /// over the coordinates' means and sds), in `(0, 1)`.
    pub check_level: f64,
    /// The polish step ([`crate::evaluation::polish`]): continue the stationarity check's MALA
    /// chains from the final particles until split R-hat and bulk ESS meet its thresholds (or its
    /// budget), and return their draws as [`FitResult::draws`]. By default after every particle
    /// engine's run ([`crate::evaluation::PolishWhen`]: or only where the diagnostics flag the
    /// particles); `None` never.
    pub polish: Option<PolishConfig>,
    /// Stop the particle run once its particles have settled ([`SettleConfig`]); `None` runs
    /// every one of `steps`. It applies where the polish step follows every run (the default,
    /// [`PolishWhen::Always`]), whose chains start from the particles and whose draws are the
    /// answer; where the particles are the answer (`polish: None`, [`PolishWhen::Flagged`]), and
    /// where a run checkpoints, resumes or is sharded, the run takes every step.
    pub settle: Option<SettleConfig>,
    /// Checkpoint every this many steps to this file (the engine's coordinates).
    #[serde(skip)]
    pub checkpoint: Option<CheckpointPolicy>,
    /// What the run belongs to beyond what the loop sees (the model's name, its data, the
    /// engine's options): written into every checkpoint and compared on resume.
    #[serde(skip)]
    pub label: RunLabel,
    /// Continue from this checkpoint of an earlier run with the same settings (the mode search
    /// is repeated: it is deterministic, so the engine resumes in the same coordinates).
    #[serde(skip)]
    pub resume: Option<Checkpoint>,
    /// The processes that share the particles ([`crate::core::shard`]); `None`: this one alone.
    #[serde(skip)]
    pub collective: Option<Arc<dyn Collective>>,
}

impl Default for FitConfig {
    fn default() -> Self {
        Self {
            particles: 100,
            steps: DEFAULT_STEPS,
            seed: 0,
            precondition: Precondition::Laplace,
            laplace: LaplaceConfig::default(),
            pathfinder: PathfinderConfig::default(),
            init_std: 1.0,
            batch_size: None,
            // On for the long fits a library user would otherwise sit through in silence (issue
            // 44); the bar hides itself where stderr is not a terminal.
            progress: true,
            check_steps: 200,
            check_level: 0.01,
            polish: Some(PolishConfig::default()),
            settle: Some(SettleConfig::default()),
            checkpoint: None,
            label: RunLabel::default(),
            resume: None,
            collective: None,
        }
    }
}

/// What [`fit`] returns, in the model's own (unconstrained) coordinates.
///
/// The draws by name on the constrained scale, and in CmdStan's CSV format, come from
/// `parvi_models::cmdstan::Draws` (the model knows its names and transforms):
///
/// ```no_run
/// use parvi_infer::{AdapterConfig, EngineSpec, FitConfig, KernelConfig, MethodConfig, fit};
/// use parvi_model::BackendKind;
/// use parvi_models::cmdstan::{Draws, RunInfo};
/// use parvi_models::posteriordb;
///
/// fn main() -> Result<(), Box<dyn std::error::Error>> {
///     let device = BackendKind::Flex.device()?;
///     let model = posteriordb::load_folder("posteriordb/kidiq-kidscore_momiq".as_ref(), &device)?;
///     let spec = EngineSpec::new(MethodConfig::default_for("svgd")?, KernelConfig::default(), AdapterConfig::adagrad(0.05));
///     let config = FitConfig { steps: 1000, ..FitConfig::default() };
///     let result = fit(&model, &spec, &config, &mut [], &device)?;
///     // Constrained draws under Stan's names, lp__ from the model, MCMC chains split.
///     let draws = Draws::of_posterior(&model, result.draws.positions.clone(), result.draws.weights.clone(), result.chains)?;
///     let sigma: Vec<f64> = draws.column("sigma").expect("kidscore_momiq has sigma");
///     println!("sigma's mean: {}", sigma.iter().sum::<f64>() / sigma.len() as f64);
///     let run = RunInfo { model: model.model_name().into(), method: "svgd".into(), seed: config.seed, ..RunInfo::default() };
///     draws.write_files(".".as_ref(), "draws", &run)?; // draws_1.csv, ...: a file per chain
///     Ok(())
/// }
/// ```
pub struct FitResult {
    /// The final particle set (with its weights).
    pub particles: Particles,
    /// What stands for the posterior: the polish step's draws when it ran, else the engine's
    /// collected draws (SGLD's trace after burn-in and thinning), else the final particles.
    pub draws: Particles,
    /// When `draws` are MCMC chains (an MCMC engine's trace or the polish step's): their number,
    /// the draws stored snapshot-major (draw `s` of chain `c` in row `s * chains + c`); `None`
    /// when they are the final particles.
    pub chains: Option<usize>,
    /// The Laplace approximation the engine ran in, when it ran in one.
    pub laplace: Option<Laplace>,
    /// The summary of the Pathfinder run (k-hat, its paths), when one was made, used or not.
    pub pathfinder: Option<serde_json::Value>,
    /// The coordinates the engine ran in, after any fallback.
    pub precondition: Precondition,
    /// Steps run by this call (fewer than `steps` after a resume).
    pub steps_run: usize,
    /// Steps of the run in all (the Laplace search excluded).
    pub steps: usize,
    /// Wall seconds of the engine's run.
    pub seconds: f64,
    /// Wall seconds of the preconditioner's searches (Laplace, Pathfinder, or both after a
    /// fallback).
    pub laplace_seconds: f64,
    /// Model evaluations, one per particle and call (with or without a gradient), Laplace
    /// search included.
    pub density_evals: usize,
    /// The engine's own report (learned weights, diagnostics).
    pub report: serde_json::Value,
    /// Convergence diagnostics and the warnings they raise.
    pub diagnostics: Diagnostics,
}

impl FitResult {
    /// Mean wall time per step of this call's run, in milliseconds (the Laplace search and the
    /// diagnostics excluded; 0 when no step ran).
    pub fn ms_per_step(&self) -> f64 {
        crate::core::ms_per_step(self.seconds, self.steps_run)
    }
}

/// Whether a run converged, by the diagnostic that fits its engine, and what to warn about.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Diagnostics {
    /// Squared kernel Stein discrepancy (V-statistic, median RBF) of the particles at the start
    /// and at the end, in the engine's coordinates (whitened with the Laplace preconditioner).
    pub ksd_start: Option<f64>,
    /// The same at the end.
    pub ksd_end: Option<f64>,
    /// A direction method's last-step displacement over the particles' spread (see
    /// [`crate::core::relative_movement`]); with a normalising step-size rule (AdaGrad, Adam) it
    /// stays near the step size at equilibrium, so it is reported, not judged.
    pub movement: Option<f64>,
    /// How far the particle set's moments moved over the last tenth of the run (at least its
    /// last 20 steps): the largest
    /// change of a coordinate's mean (in final sds) or of its sd (relative), in the engine's
    /// coordinates. Near zero at equilibrium; `None` for MCMC engines (R-hat judges those).
    pub drift: Option<f64>,
    /// An MCMC engine's largest split R-hat and smallest effective sample size over the trace.
    pub max_rhat: Option<f64>,
    /// The smallest effective sample size over the trace's coordinates.
    pub min_ess: Option<f64>,
    /// The Laplace search's Newton decrement at the mode.
    pub newton_decrement: Option<f64>,
    /// The Pareto k-hat of the Pathfinder run that preconditioned (or was tried), or of the
    /// `pathfinder` engine.
    #[serde(default)]
    pub pareto_k: Option<f64>,
    /// The stationarity check of a non-MCMC engine's final particles (MALA chains started at
    /// them, their moments compared before and after, in the model's unconstrained coordinates);
    /// `None` for MCMC engines, targets without a gradient, or with `check_steps = 0`.
    pub stationarity: Option<Stationarity>,
    /// The polish step, when it ran: its chains' R-hat, ESS and cost.
    pub polish: Option<Polish>,
    /// Human-readable warnings; empty when every diagnostic passed.
    pub warnings: Vec<String>,
}

/// R-hat above this says the chains have not mixed (posteriordb's threshold).
pub const MAX_RHAT: f64 = 1.01;
/// Fewer effective draws than this make the posterior moments unreliable.
pub const MIN_ESS: f64 = 100.0;
/// Moments that moved more than this over the last tenth of the run: still moving.
pub const MAX_DRIFT: f64 = 0.25;

impl Diagnostics {
    /// The diagnostics an engine's own report carries (movement; R-hat and ESS of a trace),
    /// judged: for runs made without [`fit`] (a resumed run, say).
    pub fn from_report(method: &str, report: &serde_json::Value) -> Self {
        let mut d = Self::read(report);
        d.judge(method, None);
        d
    }

    /// Runs the stationarity check on a non-MCMC engine's final `particles` under `model` (in the
    /// coordinates they live in, which name the flagged coordinate), records it and adds its
    /// warning: for runs made without [`fit`], after [`Diagnostics::from_report`]. A model without
    /// a gradient is skipped; a check that fails otherwise becomes a warning.
    pub fn add_stationarity(
        &mut self,
        method: &str,
        model: &dyn LogDensity,
        particles: &Particles,
        config: &StationarityConfig,
    ) -> Result<(), InferError> {
        config.validate()?;
        match checked(model, particles, config, None).map(|c| c.map(|(s, _)| s)) {
            Ok(Some(s)) => {
                self.warnings.extend(stationarity_warning(method, &s, ""));
                self.stationarity = Some(s);
            }
            Ok(None) => {}
            Err(warning) => self.warnings.push(warning),
        }
        Ok(())
    }

    /// Whether the particle set, as the diagnostics found it so far, is flagged: the stationarity
    /// check rejected it or could not judge it, its moments still drift, its kernel Stein
    /// discrepancy rose, or a warning (the engine's own, a check that failed) was raised. What
    /// [`PolishWhen::Flagged`] polishes.
    pub fn particles_flagged(&self) -> bool {
        let stationarity = self.stationarity.as_ref().is_some_and(|s| s.rejected() || s.inconclusive);
        let drifting = self.drift.is_some_and(|m| m.is_nan() || m > MAX_DRIFT);
        stationarity || drifting || self.ksd_rose() || !self.warnings.is_empty()
    }

    /// Whether the run moved the set away from the target: its kernel Stein discrepancy more
    /// than doubled (or became NaN).
    pub fn ksd_rose(&self) -> bool {
        matches!((self.ksd_start, self.ksd_end), (Some(a), Some(b)) if b.is_nan() || b > 2.0 * a)
    }

    /// The report's diagnostics, not yet judged.
    fn read(report: &serde_json::Value) -> Self {
        let number = |key: &str| report.get(key).and_then(serde_json::Value::as_f64);
        // An engine's own warnings (Pathfinder's k-hat) come with its report.
        let warnings = report
            .get("warnings")
            .and_then(serde_json::Value::as_array)
            .map(|w| w.iter().filter_map(|v| v.as_str().map(String::from)).collect())
            .unwrap_or_default();
        Diagnostics {
            movement: number("movement"),
            max_rhat: number("max_rhat"),
            min_ess: number("min_ess"),
            pareto_k: number("pareto_k"),
            warnings,
            ..Default::default()
        }
    }

    fn judge(&mut self, method: &str, laplace: Option<&Laplace>) {
        if let Some(l) = laplace {
            self.newton_decrement = Some(l.newton_decrement);
            if !l.full_rank {
                self.warnings.push(
                    "the Hessian at the mode is not negative definite: the preconditioner uses its diagonal only"
                        .into(),
                );
            }
            if !l.other_modes.is_empty() {
                self.warnings.push(format!(
                    "the posterior has at least {} separate modes (the mode search's starts ended at stationary points more than {} Laplace sds apart): the particles started spread over them, but {method} may not weight them right (compare runs with other seeds)",
                    l.other_modes.len() + 1,
                    crate::core::SEPARATE_MODE
                ));
            }
            if l.newton_decrement.is_nan() || l.newton_decrement >= 1e-3 {
                self.warnings.push(format!(
                    "the mode search did not converge (Newton decrement {:.2e}): the preconditioner may be poor",
                    l.newton_decrement
                ));
            }
        }
        if let Some(r) = self.max_rhat
            && (r.is_nan() || r > MAX_RHAT)
        {
            self.warnings.push(format!("{method} has not converged: split R-hat {r:.3} > {MAX_RHAT} (run longer)"));
        }
        if let Some(e) = self.min_ess
            && (e.is_nan() || e < MIN_ESS)
        {
            self.warnings.push(format!("{method}: effective sample size {e:.0} < {MIN_ESS} (run longer)"));
        }
        if let Some(m) = self.drift
            && (m.is_nan() || m > MAX_DRIFT)
        {
            self.warnings.push(format!(
                "{method} has not converged: the particles' moments moved {m:.3} over the last tenth of the run (> {MAX_DRIFT}; run longer)"
            ));
        }
        // Polished draws that mixed stand for the posterior instead of the particles: the
        // particles' bias is then no warning about the answer.
        let polished = self.polish.as_ref().is_some_and(|p| p.converged);
        if let Some(w) = self
            .stationarity
            .as_ref()
            .filter(|_| !polished)
            .and_then(|s| stationarity_warning(method, s, " (of the model's unconstrained parameters)"))
        {
            self.warnings.push(w);
        }
        if let Some(p) = self.polish.as_ref().filter(|p| !p.converged && p.kernel == PolishKernel::Nuts) {
            self.warnings.push(format!(
                "the polish step's NUTS ({} chains x {} draws after {} warm-up iterations) did not mix: split R-hat {:.3}, bulk ESS {:.0} (run `--method nuts` with more draws, or reparameterise the model)",
                p.chains, p.kept, p.warmup, p.max_rhat, p.min_ess
            ));
        } else if let Some(p) = self.polish.as_ref().filter(|p| !p.converged) {
            self.warnings.push(format!(
                "the polish step's {} chains did not mix within its budget of {} steps: split R-hat {:.3}, bulk ESS {:.0} (raise PolishConfig::steps, `--polish-steps` on the command line)",
                p.kernel.name(),
                p.steps,
                p.max_rhat,
                p.min_ess
            ));
        }
        if let (Some(a), Some(b)) = (self.ksd_start, self.ksd_end)
            && self.ksd_rose()
        {
            let polish = if self.polish.as_ref().is_some_and(|p| p.from_start) {
                " (the polish step's chains started from the initial particles instead)"
            } else {
                ""
            };
            self.warnings.push(format!(
                "{method} moved away from the target: the kernel Stein discrepancy rose from {a:.3e} to {b:.3e}{polish}"
            ));
        }
    }
}

/// The stationarity check of `particles` ([`crate::evaluation::stationarity_check`]) with its
/// chains; `None` where it cannot apply (too few particles, a target without a gradient), and a
/// warning where it failed otherwise.
fn checked(
    model: &dyn LogDensity,
    particles: &Particles,
    config: &StationarityConfig,
    view: Option<&dyn Fn(Tensor<2>) -> Tensor<2>>,
) -> Result<Option<(Stationarity, MalaChains)>, String> {
    if particles.len() < crate::evaluation::MIN_PARTICLES {
        return Ok(None);
    }
    match stationarity_check_chains(model, particles, config, view) {
        Ok(s) => Ok(Some(s)),
        Err(InferError::Model(parvi_model::ModelError::NoGradient)) => Ok(None),
        Err(e) => Err(format!("the stationarity check failed: {e}")),
    }
}

/// The warning a stationarity check raises, if any: the particles moved past the threshold, or
/// the check could not judge. `coordinates` says what the coordinate index counts.
fn stationarity_warning(method: &str, s: &Stationarity, coordinates: &str) -> Option<String> {
    if s.inconclusive {
        Some(format!(
            "the stationarity check could not judge {method}'s particles: MALA accepted {:.1}% of its proposals at the smallest step it may take (< {:.0}%)",
            100.0 * s.acceptance,
            100.0 * crate::evaluation::MIN_ACCEPTANCE
        ))
    } else if s.rejected() && s.log_density_worst() {
        Some(format!(
            "{method} did not end at the target: {} MALA steps from its particles moved their mean log density by {:+.2} nats (|z| {:.1} > {:.2}, the {}% level; positive: the set was too wide or misplaced, negative: too narrow; of single coordinates, coordinate {}{coordinates} moved most: {:+.2} sd in mean, x{:.2} in sd): the particles sit at a biased fixed point (the polish step continues MALA chains (autoMALA where chains stick) from them until rank-normalised split R-hat <= 1.01 and bulk ESS >= 400 and returns their draws; it runs by default; `FitConfig::polish = None`, `--no-polish` on the command line, skips it)",
            s.steps,
            s.log_density_shift,
            s.z_log_density,
            s.threshold,
            100.0 * s.level,
            s.coordinate,
            s.mean_shift_sd,
            s.sd_ratio
        ))
    } else if s.rejected() {
        Some(format!(
            "{method} did not end at the target: {} MALA steps from its particles moved coordinate {}{coordinates} by {:+.2} sd in mean and x{:.2} in sd (|z| {:.1} > {:.2}, the {}% level): the particles sit at a biased fixed point (the polish step continues MALA chains (autoMALA where chains stick) from them until rank-normalised split R-hat <= 1.01 and bulk ESS >= 400 and returns their draws; it runs by default; `FitConfig::polish = None`, `--no-polish` on the command line, skips it)",
            s.steps,
            s.coordinate,
            s.mean_shift_sd,
            s.sd_ratio,
            s.max_z(),
            s.threshold,
            100.0 * s.level
        ))
    } else {
        None
    }
}

/// Fits `model` with the engine of `spec`: precondition, initialise, run, map back. The polish
/// step's stop watches the model's unconstrained coordinates and `lp__`; [`fit_reported`] makes it
/// watch the quantities a summary reports.
pub fn fit(
    model: &dyn LogDensity,
    spec: &EngineSpec,
    config: &FitConfig,
    callbacks: &mut [&mut dyn Callback],
    device: &Device,
) -> Result<FitResult, RunError> {
    fit_reported(model, None, spec, config, callbacks, device)
}

/// [`fit`] with `reported`, the map from the model's unconstrained coordinates `[n, dim]` to the
/// quantities its summary reports `[n, p]` (a `Compiled` program's or a posteriordb model's
/// `reported`: the constrained parameters by Stan's names): the polish step then stops on the
/// rank-normalised split R-hat and bulk ESS of those and of `lp__`, the statistics the summary
/// prints for the same draws (issue 44: one convergence rule), so a converged polish step never
/// leaves a summary R-hat above its threshold.
pub fn fit_reported(
    model: &dyn LogDensity,
    reported: Option<&dyn Fn(Tensor<2>) -> Tensor<2>>,
    spec: &EngineSpec,
    config: &FitConfig,
    callbacks: &mut [&mut dyn Callback],
    device: &Device,
) -> Result<FitResult, RunError> {
    if config.particles == 0 {
        return Err(InferError::setting("particles", "need at least one particle, got 0").into());
    }
    let check = StationarityConfig { steps: config.check_steps, level: config.check_level, seed: config.seed };
    if config.check_steps > 0 {
        check.validate()?;
    }
    if let Some(p) = &config.polish {
        p.validate()?;
    }
    let counted = Counted { model, evals: AtomicUsize::new(0) };
    let mut rng = EngineRng::new(config.seed ^ 0x1A9_1ACE);
    let started = Instant::now();
    let pre = precondition(&counted, config, &mut rng, device);
    let laplace_seconds = started.elapsed().as_secs_f64();
    let laplace = pre.laplace;
    let whitened = match (&laplace, &pre.whitening) {
        (Some(l), _) => Some(Whitened::new(&counted, l, device)?),
        (None, Some(w)) => Some(Whitened::affine(&counted, &w.shift, &w.scale, device)?),
        (None, None) => None,
    };
    let target: &dyn LogDensity = match &whitened {
        Some(w) => w,
        None => &counted,
    };
    let mut start = Particles::gaussian(config.particles, model.dim(), 0.0, config.init_std, &mut rng, device)?;
    // Pathfinder's draws, whitened, are the start where it preconditions.
    if let Some(w) = &pre.whitening {
        start =
            Particles::from_rows(w.start.iter().map(|&v| v as f32).collect(), config.particles, model.dim(), device)?;
    }
    // Several modes: the particles start spread over all of them in turn (the best mode, then
    // each other one), each share around its mode as they would be around the one.
    if let Some(l) = laplace.as_ref().filter(|l| !l.other_modes.is_empty()) {
        let centres: Vec<Vec<f64>> = std::iter::once(vec![0.0; model.dim()]).chain(l.other_modes.clone()).collect();
        let offsets: Vec<f32> =
            (0..config.particles).flat_map(|i| centres[i % centres.len()].iter().map(|&v| v as f32)).collect();
        start.positions =
            start.positions + parvi_model::tensor_ops::matrix_from_vec(offsets, config.particles, model.dim(), device);
    }
    let redrawn = if config.resume.is_none() {
        redraw_non_finite_starts(target, &mut start, config.init_std, &mut rng)
    } else {
        0
    };
    let ksd_start = if config.resume.is_none() { stein_discrepancy(target, &start.positions) } else { None };
    let initial = ksd_start.is_some().then(|| start.clone());
    let mut engine = spec.build()?;
    let run = RunConfig {
        batch_size: config.batch_size,
        progress: config.progress,
        checkpoint: config.checkpoint.clone(),
        label: config.label.clone(),
        collective: config.collective.clone(),
        ..RunConfig::new(config.steps, config.seed)
    };
    let back = |p: &Particles| match &whitened {
        Some(w) => w.particles_to_original(p),
        None => p.clone(),
    };
    // The last tenth of the run, and at least its last 20 steps.
    let mut snapshot =
        Snapshot { every: (config.steps * 9 / 10).min(config.steps.saturating_sub(20)).max(1), taken: None };
    // The particles only start the polish step's chains when it follows every run; where they
    // are the answer (no polish, or only when flagged) the run takes every step: settled to 0.1
    // sd a window is a warm start, not an answer.
    let polish_follows = config.polish.is_some_and(|p| p.when == PolishWhen::Always);
    let fixed_length =
        !polish_follows || config.checkpoint.is_some() || config.resume.is_some() || config.collective.is_some();
    let mut settle = match config.settle {
        Some(rule) if !fixed_length => {
            rule.validate()?;
            Some(Settle { rule, looks: Default::default(), stopped: false, last_drift: None })
        }
        _ => None,
    };
    let outcome = {
        let mut all: Vec<&mut dyn Callback> = Vec::with_capacity(callbacks.len() + 1);
        for c in callbacks.iter_mut() {
            all.push(&mut **c);
        }
        all.push(&mut snapshot);
        if let Some(settle) = settle.as_mut() {
            all.push(settle);
        }
        let runner = match &config.resume {
            Some(checkpoint) => Runner::resume(engine.as_mut(), target, run, checkpoint, device)?,
            None => Runner::new(engine.as_mut(), target, start, run)?,
        };
        // The last finite particles of a divergence, too, in the model's coordinates.
        runner.run(&mut all).map_err(|e| match e {
            RunError::Diverged { step, cause, last_finite } => {
                RunError::Diverged { step, cause, last_finite: Box::new(back(&last_finite)) }
            }
            other => other,
        })?
    };
    let report = engine.report();
    let engine_draws = engine.draws();
    let is_mcmc = engine_draws.is_some();
    let mut diagnostics = Diagnostics {
        ksd_start: (!is_mcmc).then_some(ksd_start).flatten(),
        ksd_end: if is_mcmc { None } else { stein_discrepancy(target, &outcome.particles.positions) },
        // A settled run's drift is its last look's (it never reached the last tenth).
        drift: match (&settle, is_mcmc) {
            (_, true) => None,
            (Some(Settle { stopped: true, last_drift, .. }), false) => *last_drift,
            _ => snapshot.taken.as_ref().and_then(|s| drift(s, &outcome.particles)),
        },
        ..Diagnostics::read(&report)
    };
    if redrawn > 0 {
        diagnostics.warnings.push(format!(
            "{redrawn} start draws had a non-finite log density (the model fails or is -inf there) and were redrawn from the approximation around the mode"
        ));
    }
    let mut chains = None;
    if !is_mcmc && config.check_steps > 0 {
        // Compared in the model's unconstrained coordinates, so a flagged coordinate is one of
        // the model's own parameters (MALA itself runs where the engine ran); judged below.
        let to_model = |t: Tensor<2>| match &whitened {
            Some(w) => w.to_original(t),
            None => t,
        };
        match checked(target, &outcome.particles, &check, Some(&to_model)) {
            Ok(s) => {
                diagnostics.stationarity = s.as_ref().map(|(s, _)| s.clone());
                chains = s.map(|(_, c)| c);
            }
            Err(warning) => diagnostics.warnings.push(warning),
        }
    }
    // The polish step runs where the engine ran (whitened), from the check's chains: after every
    // run (the default), or only where the diagnostics say the particles are not the posterior.
    let mut polished = None;
    let polish_this = |p: &&PolishConfig| match p.when {
        // Too few chains for R-hat: skipped, as the check is.
        PolishWhen::Always => !is_mcmc && outcome.particles.len() >= crate::evaluation::MIN_PARTICLES,
        PolishWhen::Flagged => diagnostics.particles_flagged(),
    };
    if let Some(p) = config.polish.as_ref().filter(polish_this) {
        // A run that moved the set away from the target (SVGD drawn down a funnel's neck, where
        // MALA chains need thousands of steps to climb out) is a worse start for the chains than
        // the set it started from: they start there instead.
        let from_start = initial.as_ref().filter(|_| diagnostics.ksd_rose());
        let (from, from_chains) = match from_start {
            Some(initial) => (initial, None),
            None => (&outcome.particles, chains.as_ref()),
        };
        // The chains run where the engine ran; the stop watches what the summary reports.
        let watched = |z: Tensor<2>| {
            let x = match &whitened {
                Some(w) => w.to_original(z),
                None => z,
            };
            match reported {
                Some(f) => f(x),
                None => x,
            }
        };
        let run = if p.kernel == PolishKernel::Nuts {
            let starts = from_chains.map_or_else(|| from.positions.clone(), |c| c.end.clone());
            nuts_polish(target, starts, &[], p, config.seed, Some(&watched), device).map(|(mut run, warnings)| {
                run.report.from_start = from_start.is_some();
                diagnostics.warnings.extend(warnings);
                run
            })
        } else {
            // `auto` offers chains far from mixed (R-hat above HOPELESS_RHAT) to NUTS once; it
            // takes them where it mixes better (on a funnel it does not, and autoMALA goes on);
            // chains that end their budget that far from mixed without the offer get NUTS after.
            // Chains nearly mixed at the budget are not worth NUTS's 4 x 2,000 iterations
            // (docs/posteriordb.md, the latent-variable models: gp_pois_regr).
            let offered = p.kernel == PolishKernel::Auto;
            let (mut taken, mut tried, mut declined) = (None, false, None);
            let result = {
                let mut take = |positions: Tensor<2>, kept: &[f32], rhat: f64, ess: f64| {
                    tried = true;
                    match nuts_polish(target, positions, kept, p, config.seed, Some(&watched), device) {
                        Ok(nuts) if mixes_better(&nuts.0.report, rhat, ess) => {
                            taken = Some(nuts);
                            true
                        }
                        outcome => {
                            declined = Some(nuts_declined(outcome, rhat, ess));
                            false
                        }
                    }
                };
                let take: Option<TakeOver<'_>> = if offered { Some(&mut take) } else { None };
                // Chains the check passed are MALA's warm-up already (200 steps of it, 50 of
                // them adapting the step size): the polish keeps from its first step.
                let warm = !diagnostics.particles_flagged();
                polish_offering(target, from, from_chains, p, config.seed, Some(&watched), take, warm)
            };
            result.map(|mut run| {
                run.report.from_start = from_start.is_some();
                diagnostics.warnings.extend(declined);
                match taken {
                    Some((nuts, warnings)) => {
                        diagnostics.warnings.extend(warnings);
                        // NUTS ran inside the kernel's run, whose seconds count it already: the
                        // kernel's own are the rest, and the two add up to the run's.
                        let seconds = run.report.seconds;
                        let mut before = run.report;
                        before.seconds = (seconds - nuts.report.seconds).max(0.0);
                        let mut nuts = after(nuts, before);
                        nuts.report.seconds = seconds;
                        nuts
                    }
                    None if offered && !tried && run.report.max_rhat > HOPELESS_RHAT => {
                        nuts_after(target, run, p, config.seed, &watched, device, &mut diagnostics.warnings)
                    }
                    None => run,
                }
            })
        };
        match run {
            Ok(run) => {
                diagnostics.polish = Some(run.report);
                polished = Some(Particles::new(run.draws));
            }
            Err(InferError::Model(parvi_model::ModelError::NoGradient)) => {
                diagnostics.warnings.push("no polish step: the target has no gradient for MALA".into())
            }
            Err(e) => diagnostics.warnings.push(format!("the polish step failed: {e}")),
        }
    }
    diagnostics.warnings.splice(0..0, pre.warnings);
    // Pathfinder's paths at separate modes: the particles start over them in proportion to the
    // importance weights, which few paths per mode estimate poorly.
    if let Some(f) = pre.pathfinder.as_ref().filter(|_| pre.used == Precondition::Pathfinder) {
        let modes = f.modes(crate::core::SEPARATE_MODE);
        if modes > 1 {
            diagnostics.warnings.push(format!(
                "the posterior has at least {modes} separate modes (Pathfinder's paths ended at approximations more than {} of their sds apart): the particles started over them by importance weight, but {} may not weight them right (compare runs with other seeds, or --precondition laplace)",
                crate::core::SEPARATE_MODE,
                engine.name()
            ));
        }
    }
    diagnostics.pareto_k = diagnostics.pareto_k.or(pre.pathfinder.as_ref().map(|p| p.pareto_k));
    diagnostics.judge(engine.name(), laplace.as_ref());
    let particles = back(&outcome.particles);
    // An MCMC engine's trace holds one chain per particle; the polish step's, its own chains.
    let chains = match (&polished, &diagnostics.polish) {
        (Some(_), Some(report)) => Some(report.chains),
        _ => is_mcmc.then_some(outcome.particles.len()),
    };
    let draws = match polished {
        Some(p) => back(&p),
        None => engine_draws.map(|d| back(&d)).unwrap_or_else(|| particles.clone()),
    };
    Ok(FitResult {
        particles,
        draws,
        chains,
        laplace,
        pathfinder: pre.pathfinder.as_ref().map(PathfinderFit::summary),
        precondition: pre.used,
        steps_run: outcome.steps_run,
        steps: outcome.steps,
        seconds: outcome.seconds,
        laplace_seconds,
        density_evals: counted.evals.load(Ordering::Relaxed),
        report,
        diagnostics,
    })
}

/// The polish step's last resort ([`PolishKernel::Auto`]) for chains that ended their budget
/// far from mixed: NUTS from where they ended. Its draws replace `run`'s where it mixes better.
fn nuts_after(
    target: &dyn LogDensity,
    run: Polished,
    config: &PolishConfig,
    seed: u64,
    watched: &dyn Fn(Tensor<2>) -> Tensor<2>,
    device: &Device,
    warnings: &mut Vec<String>,
) -> Polished {
    let (chains, kept, rhat, ess) = (run.report.chains, run.report.kept, run.report.max_rhat, run.report.min_ess);
    if kept == 0 {
        return run;
    }
    let last = run.draws.clone().narrow(0, (kept - 1) * chains, chains);
    let draws = parvi_model::tensor_ops::to_vec_f32(&run.draws);
    match nuts_polish(target, last, &draws, config, seed, Some(watched), device) {
        Ok((nuts, nuts_warnings)) if mixes_better(&nuts.report, rhat, ess) => {
            warnings.extend(nuts_warnings);
            after(nuts, run.report)
        }
        outcome => {
            warnings.push(nuts_declined(outcome, rhat, ess));
            run
        }
    }
}

/// Whether NUTS's chains stand for the posterior rather than chains at `rhat` and `ess`: they
/// met the stopping rule, or mixed better on both counts.
fn mixes_better(nuts: &Polish, rhat: f64, ess: f64) -> bool {
    nuts.converged || (nuts.max_rhat < rhat && nuts.min_ess > ess)
}

/// The warning where NUTS did not take over.
fn nuts_declined(outcome: Result<(Polished, Vec<String>), InferError>, rhat: f64, ess: f64) -> String {
    match outcome {
        Ok((nuts, _)) => format!(
            "the polish step tried NUTS on chains at split R-hat {rhat:.3} and bulk ESS {ess:.0}; it mixed no better (R-hat {:.3}, ESS {:.0}, {} divergences) and was dropped",
            nuts.report.max_rhat, nuts.report.min_ess, nuts.report.divergences
        ),
        Err(e) => {
            format!("the polish step tried NUTS on chains at split R-hat {rhat:.3}; it failed ({e}) and was dropped")
        }
    }
}

/// NUTS's draws after the kernel of `before`, whose cost they carry.
fn after(mut nuts: Polished, before: Polish) -> Polished {
    nuts.report.score_evals += before.score_evals;
    nuts.report.seconds += before.seconds;
    nuts.report.from_start = before.from_start;
    nuts.report.before_nuts = Some(Box::new(before));
    nuts
}

/// What the preconditioning chose: the approximation the engine runs in, with the warnings of
/// any fallback on the way.
struct Prepared {
    /// The Laplace approximation, when it whitens.
    laplace: Option<Laplace>,
    /// Pathfinder's run, when one was made (used or not).
    pathfinder: Option<PathfinderFit>,
    /// Pathfinder's whitening, when it whitens.
    whitening: Option<Whitening>,
    /// The preconditioner used in the end.
    used: Precondition,
    /// Why a preconditioner was not used.
    warnings: Vec<String>,
}

/// An affine whitening `x = shift + scale z` and the initial particles in its coordinates.
struct Whitening {
    shift: Vec<f64>,
    /// Lower triangular, row-major `dim x dim`.
    scale: Vec<f64>,
    /// Row-major `[particles, dim]`.
    start: Vec<f64>,
}

/// Runs the preconditioner `config` asks for and falls back from one that failed or ran away:
/// Laplace to Pathfinder, Pathfinder to Laplace, either to none. The whitening must never come
/// from a point where the density runs away (a funnel's neck, a flat direction): it would put
/// the engine's whole unit scale where the posterior has no mass.
fn precondition(model: &dyn LogDensity, config: &FitConfig, rng: &mut EngineRng, device: &Device) -> Prepared {
    let mut out =
        Prepared { laplace: None, pathfinder: None, whitening: None, used: Precondition::None, warnings: vec![] };
    let order = match config.precondition {
        Precondition::None => return out,
        Precondition::Laplace => [Precondition::Laplace, Precondition::Pathfinder],
        Precondition::Pathfinder => [Precondition::Pathfinder, Precondition::Laplace],
    };
    for (attempt, kind) in order.into_iter().enumerate() {
        let problem = match kind {
            Precondition::Laplace => match Laplace::fit(model, &config.laplace, rng, device) {
                Ok(l) => match l.runaway() {
                    Some(why) => Some(why),
                    None => {
                        out.laplace = Some(l);
                        None
                    }
                },
                Err(e) => Some(format!("the Laplace search failed ({e})")),
            },
            _ => {
                let mut options = config.pathfinder.clone();
                options.draws_per_path =
                    options.draws_per_path.max((2 * config.particles).div_ceil(options.paths.max(1)));
                match pathfinder(model, &options, rng, device) {
                    Ok(fit) => {
                        let problems = fit.problems(options.max_iters, MAX_PATH_DISAGREEMENT);
                        let verdict = if problems.is_empty() {
                            match pathfinder_whitening(&fit, config, rng) {
                                Ok(w) => {
                                    out.whitening = Some(w);
                                    None
                                }
                                Err(e) => Some(e),
                            }
                        } else {
                            Some(problems.join("; "))
                        };
                        out.pathfinder = Some(fit);
                        verdict
                    }
                    Err(e) => Some(format!("Pathfinder failed ({e})")),
                }
            }
        };
        match problem {
            None => {
                out.used = kind;
                return out;
            }
            Some(why) => {
                let next = if attempt == 0 {
                    match order[1] {
                        Precondition::Laplace => "trying the Laplace preconditioner",
                        _ => "trying Pathfinder's",
                    }
                } else {
                    "no preconditioning: the particles start from N(0, init_std^2 I) in the model's own coordinates"
                };
                out.warnings.push(format!("{why}; {next}"));
            }
        }
    }
    out
}

/// Pathfinder's whitening: the importance-weighted mean, the Cholesky factor of the weighted
/// covariance, and `particles` distinct resampled draws in those coordinates (times `init_std`).
fn pathfinder_whitening(fit: &PathfinderFit, config: &FitConfig, rng: &mut EngineRng) -> Result<Whitening, String> {
    let d = fit.dim;
    let factor = parvi_model::linalg::host::Cholesky::factor(&fit.covariance, d, 0.0)
        .map_err(|e| format!("Pathfinder's weighted covariance is not positive definite ({e})"))?;
    let l = factor.lower().to_vec();
    let draws = fit.resample(config.particles, false, rng);
    let mut z = vec![0.0; draws.len()];
    for (row, out) in draws.chunks(d).zip(z.chunks_mut(d)) {
        // z = L^-1 (x - m) by forward substitution.
        for i in 0..d {
            let dot: f64 = (0..i).map(|j| l[i * d + j] * out[j]).sum();
            out[i] = (row[i] - fit.mean[i] - dot) / l[i * d + i];
        }
    }
    z.iter_mut().for_each(|v| *v *= config.init_std);
    if !z.iter().all(|v| v.is_finite()) {
        return Err("Pathfinder's draws are non-finite in its whitened coordinates".into());
    }
    Ok(Whitening { shift: fit.mean.clone(), scale: l, start: z })
}

/// The squared KSD of `x` under `model` (full data), or `None` where the model has no gradient
/// (a gradient-free target) or the value is not finite.
fn stein_discrepancy(model: &dyn LogDensity, x: &Tensor<2>) -> Option<f64> {
    let s = parvi_model::score(model, x.clone(), None).ok()?;
    ksd_squared(&Rbf::median(), x.clone(), s.grad, Statistic::V).ok().filter(|v| v.is_finite())
}

/// Keeps the particles at one step (the first multiple of `every`).
struct Snapshot {
    every: usize,
    taken: Option<Particles>,
}

impl Callback for Snapshot {
    fn every(&self) -> usize {
        self.every
    }

    fn on_step(&mut self, _step: usize, particles: &Particles) -> Result<(), InferError> {
        if self.taken.is_none() {
            self.taken = Some(particles.clone());
        }
        Ok(())
    }
}

/// The settle rule's callback ([`SettleConfig`]): the particles' moments at the last `window + 1`
/// looks, oldest first.
struct Settle {
    rule: SettleConfig,
    looks: std::collections::VecDeque<(Vec<f64>, Vec<f64>)>,
    stopped: bool,
    last_drift: Option<f64>,
}

impl Callback for Settle {
    fn every(&self) -> usize {
        self.rule.every
    }

    fn on_step(&mut self, step: usize, particles: &Particles) -> Result<(), InferError> {
        self.looks.push_back((particles.mean(), particles.variances()));
        if self.looks.len() > self.rule.window + 1 {
            self.looks.pop_front();
        }
        if self.looks.len() == self.rule.window + 1
            && let (Some(oldest), Some(now)) = (self.looks.front(), self.looks.back())
        {
            let moved = moment_drift(oldest, now);
            self.last_drift = Some(moved);
            self.stopped = step >= self.rule.min_steps && moved < self.rule.tol;
        }
        Ok(())
    }

    fn stop(&self) -> bool {
        self.stopped
    }
}

/// [`drift`] from two sets of (means, variances): the largest change of a coordinate's mean in
/// the later sds, or of its sd, relative; NaN moments count as moving.
fn moment_drift((m0, v0): &(Vec<f64>, Vec<f64>), (m1, v1): &(Vec<f64>, Vec<f64>)) -> f64 {
    let mut worst = 0.0f64;
    for j in 0..m1.len() {
        let (s0, s1) = (v0[j].max(0.0).sqrt(), v1[j].max(0.0).sqrt());
        let moved = if s1 > 0.0 { ((m1[j] - m0[j]).abs() / s1).max((s1 / s0.max(1e-300) - 1.0).abs()) } else { 0.0 };
        worst = if moved.is_nan() { f64::INFINITY } else { worst.max(moved) };
    }
    worst
}

/// The largest change of a coordinate's (weighted) mean, in final sds, or of its sd, relative,
/// between two particle sets of the same size; `None` when the sizes differ.
fn drift(before: &Particles, after: &Particles) -> Option<f64> {
    if before.len() != after.len() {
        return None;
    }
    Some(moment_drift(&(before.mean(), before.variances()), &(after.mean(), after.variances())))
}

/// A model that counts its evaluations (rows of every `log_prob` call).
struct Counted<'a> {
    model: &'a dyn LogDensity,
    evals: AtomicUsize,
}

impl LogDensity for Counted<'_> {
    fn dim(&self) -> usize {
        self.model.dim()
    }

    fn data_len(&self) -> Option<usize> {
        self.model.data_len()
    }

    fn log_prob(&self, particles: Tensor<2>, batch: Option<&Minibatch>) -> Tensor<1> {
        self.evals.fetch_add(particles.dims()[0], Ordering::Relaxed);
        self.model.log_prob(particles, batch)
    }
}

/// Rounds of redrawing a start particle whose log density is not finite (Stan retries an
/// initial value 100 times).
const START_REDRAWS: usize = 100;

/// Redraws the start particles at which the target's log density is `-inf` or NaN (an ODE that
/// fails there, a state that underflows to 0, a start put around a spurious stationary point) from
/// the main approximation, `N(0, init_std^2 I)` in the engine's coordinates, as Stan retries a
/// bad initial value; returns how many draws were replaced. What is still not finite after
/// [`START_REDRAWS`] rounds is left for the run loop to report with the model's error.
fn redraw_non_finite_starts(
    target: &dyn LogDensity,
    start: &mut Particles,
    init_std: f64,
    rng: &mut EngineRng,
) -> usize {
    let (n, dim) = (start.len(), start.dim());
    let device = start.device();
    let mut rows: Option<Vec<f32>> = None;
    let mut replaced = 0;
    for _ in 0..START_REDRAWS {
        let Ok(values) = parvi_model::grad::log_prob_value(target, start.positions.clone(), None) else { break };
        // A failure the model recorded is the cause of the NaN it returned: redrawing is the answer.
        let _ = target.take_error();
        let bad: Vec<usize> = parvi_model::tensor_ops::to_vec_f64(&values)
            .iter()
            .enumerate()
            .filter(|(_, v)| !v.is_finite())
            .map(|(i, _)| i)
            .collect();
        if bad.is_empty() {
            break;
        }
        let host = rows.get_or_insert_with(|| start.to_rows().concat());
        for &i in &bad {
            for v in &mut host[i * dim..(i + 1) * dim] {
                *v = (init_std * rng.normal()) as f32;
            }
        }
        replaced += bad.len();
        start.positions = parvi_model::tensor_ops::matrix_from_vec(host.clone(), n, dim, &device);
    }
    replaced
}
