//! The default path from a model to a posterior, the same for every engine, as phases, one
//! module a phase:
//!
//! 1. [`precondition`]: the frame. The Laplace approximation at the mode, or Pathfinder's,
//!    whitens the model (falling back from a search that failed or ran away); the particles start
//!    from it.
//! 2. [`particles`]: the engine's run, until its budget or until the particles settle.
//! 3. [`check`]: the stationarity check of a particle engine's final particles (MALA chains).
//! 4. [`polish`]: MCMC chains from the check's (MALA, autoMALA, ChEES-HMC, NUTS taking over
//!    chains far from mixed) until the reported quantities' R-hat and ESS pass; their draws are
//!    the answer.
//! 5. [`diagnostics`]: what was found wrong. A phase's failure that a later phase's passing draws
//!    made moot is a line of the path ([`FitResult::path`]), not a warning: warnings are about
//!    the answer returned.
//!
//! What stands for the posterior is mapped back to the model's own coordinates, with the counts
//! a comparison needs.

use std::sync::Arc;

use burn::tensor::{Device, Tensor};
use parvi_model::LogDensity;
use serde::{Deserialize, Serialize};

use crate::core::{Checkpoint, Collective};
use crate::engines::pathfinder::{PathfinderConfig, PathfinderFit};
use crate::evaluation::StationarityConfig;
use crate::samplers::{PolishConfig, PolishKernel, PolishWhen};
use crate::{
    Callback, CheckpointPolicy, EngineRng, EngineSpec, InferError, Laplace, LaplaceConfig, Particles, RunError,
    RunLabel,
};

mod check;
mod diagnostics;
mod nuts_polish;
mod particles;
mod path;
mod polish;
mod precondition;

use diagnostics::Finding;
pub use diagnostics::{Diagnostics, MAX_DRIFT, MAX_RHAT, MIN_ESS};
use path::Counted;
pub use path::Phase;

/// In which coordinates the engine works and where its particles start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Precondition {
    /// The model's own coordinates, particles from `N(0, init_std^2 I)`.
    None,
    /// Whitened by the Laplace approximation at the mode (see [`Laplace`]), particles from it
    /// (`N(0, init_std^2 I)` in whitened coordinates). A search that ran away (down a funnel's
    /// neck, or ended at no mode: [`Laplace::not_a_frame`]) falls back to Pathfinder, then to none,
    /// each a line of the path.
    #[default]
    Laplace,
    /// Whitened by Pathfinder's importance-weighted mean and covariance
    /// ([`crate::engines::pathfinder`]), particles from its resampled draws (distinct, scaled by
    /// `init_std` in whitened coordinates). An unreliable fit ([`PathfinderFit::problems`]:
    /// k-hat > 0.7, a path that ran away, paths that disagree) falls back to Laplace, then to
    /// none, with a warning.
    Pathfinder,
}

/// Where the polish step's NUTS runs when the frame whitens (issue 59: the frame is a choice to
/// verify per run, not a default to trust). NUTS adapts a diagonal metric: what it cannot adapt
/// away is the correlation of the coordinates it runs in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NutsFrame {
    /// In the model's own coordinates where the draws before NUTS (the chains it takes over,
    /// else the check's) have a correlation condition number smaller than in the frame by more
    /// than sampling noise explains ([`crate::samplers::FrameChoice::evidence_picks_own`]);
    /// else in the frame.
    #[default]
    Evidence,
    /// Always in the frame (the path before issue 59).
    Frame,
    /// Always in the model's own coordinates (both numbers are still recorded).
    Own,
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
/// (docs/posteriordb.md at 8a480ca, "The default path against Stan's NUTS").
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
    /// The polish step ([`crate::samplers::polish`]): continue the stationarity check's MALA
    /// chains from the final particles until split R-hat and bulk ESS meet its thresholds (or its
    /// budget), and return their draws as [`FitResult::draws`]. By default after every particle
    /// engine's run ([`crate::samplers::PolishWhen`]: or only where the diagnostics flag the
    /// particles); `None` never.
    pub polish: Option<PolishConfig>,
    /// Where the polish step's NUTS runs: by default in the frame or in the model's own
    /// coordinates, whichever the draws before it pick ([`NutsFrame::Evidence`]).
    pub nuts_frame: NutsFrame,
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
            nuts_frame: NutsFrame::Evidence,
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
    /// The phases the run took, in order: the searches for the frame, the particle run, the
    /// stationarity check, the polish step's kernels; each with what it did, what came of it and
    /// what it cost (printed by `parvi fit`, kept in summary.json).
    pub path: Vec<Phase>,
}

impl FitResult {
    /// Mean wall time per step of this call's run, in milliseconds (the Laplace search and the
    /// diagnostics excluded; 0 when no step ran).
    pub fn ms_per_step(&self) -> f64 {
        crate::core::ms_per_step(self.seconds, self.steps_run)
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
    let check = validated(config)?;
    // Phase lines, and timed progress lines where stderr is not a terminal, for this fit.
    let _lines = crate::core::progress::Lines::enable(config.progress);
    let counted = Counted::new(model);
    let mut rng = EngineRng::new(config.seed ^ 0x1A9_1ACE);
    let mut path = Vec::new();
    let mut findings = Vec::new();

    // 1. The frame.
    let searched = counted.stopwatch();
    let frame = precondition::frame(&counted, config, &mut rng, device, &mut path)?;
    let laplace_seconds = searched.seconds();
    let target = frame.target(&counted);

    // 2. The particles.
    let mut run = particles::run(&counted, target, &frame, spec, config, callbacks, &mut rng, device, &mut path)?;
    let mut diagnostics = std::mem::take(&mut run.diagnostics);
    findings.append(&mut run.findings);

    // 3. The stationarity check (particle engines).
    let chains = match !run.is_mcmc() && config.check_steps > 0 {
        true => {
            let particles = &run.outcome.particles;
            check::check(&counted, target, &frame, particles, &check, &mut diagnostics, &mut findings, &mut path)
        }
        false => None,
    };

    // 4. The polish step, where the frame is, from the check's chains: after every run (the
    // default), or only where the diagnostics say the particles are not the posterior.
    let flagged = diagnostics.particles_flagged() || !findings.is_empty();
    let polish_this = |p: &&PolishConfig| match p.when {
        // Too few chains for R-hat: skipped, as the check is.
        PolishWhen::Always => !run.is_mcmc() && run.outcome.particles.len() >= crate::evaluation::MIN_PARTICLES,
        PolishWhen::Flagged => flagged,
    };
    let polished = match config.polish.as_ref().filter(polish_this) {
        Some(p) => {
            let p = &sampler_from_the_frame(p, config, &frame, &mut path);
            // The chains run in the frame; the stop watches what the summary reports.
            let watched = |z: Tensor<2>| {
                let x = frame.to_model(z);
                match reported {
                    Some(f) => f(x),
                    None => x,
                }
            };
            let own = frame.affine().filter(|_| config.nuts_frame != NutsFrame::Frame).map(|(shift, lower)| {
                nuts_polish::OwnCoordinates {
                    model: &counted,
                    shift,
                    lower,
                    forced: config.nuts_frame == NutsFrame::Own,
                }
            });
            let on = polish::Polishing {
                target,
                own,
                frame: frame.describe(),
                watched: &watched,
                flagged,
                seed: config.seed,
                device,
            };
            polish::polish(&on, &run, chains.as_ref(), p, &mut diagnostics, &mut findings, &mut path)
        }
        None => None,
    };

    // 5. The verdict: warnings about the answer returned; the rest is the path's.
    let pre = &frame.pre;
    findings.extend(pre.fallbacks.iter().map(|(search, why)| Finding::of(search, why.clone())));
    // Pathfinder's paths at separate modes: the particles start over them in proportion to the
    // importance weights, which few paths per mode estimate poorly.
    if let Some(f) = pre.pathfinder.as_ref().filter(|_| pre.used == Precondition::Pathfinder) {
        let modes = f.modes(crate::core::SEPARATE_MODE);
        if modes > 1 {
            findings.push(Finding::answer(format!(
                "the posterior has at least {modes} separate modes (Pathfinder's paths ended at approximations more than {} of their sds apart): the particles started over them by importance weight, but {} may not weight them right (compare runs with other seeds, or --precondition laplace)",
                crate::core::SEPARATE_MODE,
                run.method
            )));
        }
    }
    diagnostics.pareto_k = diagnostics.pareto_k.or(pre.pathfinder.as_ref().map(|p| p.pareto_k));
    findings.extend(diagnostics.findings(run.method, pre.laplace.as_ref()));
    let passed = answer_passed(&diagnostics, polished.is_some(), run.is_mcmc());
    // The phases' findings are about the answer only where no polish step's draws replaced
    // theirs and the answer did not pass.
    let about_answer = !passed && polished.is_none();
    diagnostics::sort_findings(findings, about_answer, &mut diagnostics.warnings, &mut path);

    // The answer, in the model's own coordinates: the polish step's draws, an MCMC engine's
    // trace (one chain per particle), or the final particles.
    let particles = frame.back(&run.outcome.particles);
    let chains = match (&polished, &diagnostics.polish) {
        (Some(_), Some(report)) => Some(report.chains),
        _ => run.is_mcmc().then_some(run.outcome.particles.len()),
    };
    let draws = match (polished, &run.engine_draws) {
        (Some(p), _) => frame.back(&Particles::new(p)),
        (None, Some(d)) => frame.back(d),
        (None, None) => particles.clone(),
    };
    Ok(FitResult {
        particles,
        draws,
        chains,
        laplace: frame.pre.laplace.clone(),
        pathfinder: frame.pre.pathfinder.as_ref().map(PathfinderFit::summary),
        precondition: frame.pre.used,
        steps_run: run.outcome.steps_run,
        steps: run.outcome.steps,
        seconds: run.outcome.seconds,
        laplace_seconds,
        density_evals: counted.evals(),
        report: run.report,
        diagnostics,
        path,
    })
}

/// The polish step's kernel chosen from what the searches found (issue 59: the sampler chosen
/// early, from cheap evidence). Where neither the Laplace search nor Pathfinder gave a frame
/// and the Laplace search did not run away, it ended where `-H` is not positive definite, or
/// failed, and Pathfinder's approximation was unreliable: the posterior is far from Gaussian
/// about any mode (a centred hierarchy whose scale has no interior mode, a flat direction).
/// There MALA's and autoMALA's chains from the particles stall (GLMM_Poisson: autoMALA 5,450
/// steps a chain, R-hat 1,954, 584 s, the answer wrong) and Stan's NUTS with its adaptation, in
/// the model's own coordinates, is what holds (GLMM_Poisson: 48 s, within 0.09 sd;
/// eight_schools_centered: 3 s, within 0.09 sd). Its chains start as the polish step's NUTS
/// always does (the better of the chains and Stan's inits by log density). Where the search ran
/// away (the density rising without bound down a funnel's neck), NUTS's one step size cannot
/// follow into the neck (the 10-d funnel: `v`'s mean 1.19 against 0) and autoMALA's per-step
/// size can: the `auto` kernel stays. A kernel the user named is kept.
fn sampler_from_the_frame(
    polish: &PolishConfig,
    config: &FitConfig,
    frame: &precondition::Frame<'_>,
    path: &mut Vec<Phase>,
) -> PolishConfig {
    let pre = &frame.pre;
    let searched = config.precondition != Precondition::None;
    if !(searched && pre.used == Precondition::None && !pre.ran_away && polish.kernel == PolishKernel::Auto) {
        return *polish;
    }
    path.push(Phase::new(
        "sampler",
        "NUTS for the polish step: no search gave a frame and none ran away, so the posterior is far from Gaussian about any mode".into(),
        "chosen".into(),
        0,
        0.0,
    ));
    PolishConfig { kernel: PolishKernel::Nuts, ..*polish }
}

/// Whether the draws returned passed: the polish step's converged, or an MCMC engine's trace
/// has R-hat and ESS within bounds. Then what an earlier phase left is moot.
fn answer_passed(diagnostics: &Diagnostics, polished: bool, mcmc: bool) -> bool {
    match (&diagnostics.polish, mcmc) {
        (Some(p), _) => polished && p.converged,
        (None, true) => {
            diagnostics.max_rhat.is_some_and(|r| r <= MAX_RHAT) && diagnostics.min_ess.is_some_and(|e| e >= MIN_ESS)
        }
        (None, false) => false,
    }
}

/// Checks the settings the path uses beyond the engine's; returns the stationarity check's.
fn validated(config: &FitConfig) -> Result<StationarityConfig, InferError> {
    if config.particles == 0 {
        return Err(InferError::setting("particles", "need at least one particle, got 0"));
    }
    let check = StationarityConfig { steps: config.check_steps, level: config.check_level, seed: config.seed };
    if config.check_steps > 0 {
        check.validate()?;
    }
    if let Some(p) = &config.polish {
        p.validate()?;
    }
    Ok(check)
}
