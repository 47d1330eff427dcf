//! The polish step: when a particle engine ends at a biased fixed point, continue the
//! stationarity check's batched chains (one per particle) until they have mixed, and let
//! their draws stand for the posterior instead of the particles.
//!
//! The chains start where the check's compared chains ended (or at the particles, resampled by
//! weight, when no check ran), with its proposal scale (the particles' coordinate sds) and its
//! adapted step. With MALA, a warm-up re-adapts the step toward MALA's optimal acceptance 0.574
//! (Roberts & Rosenthal 1998) while the chains leave the particles' bias behind; its draws are
//! dropped. Then the step is fixed (the chains are then exactly `p`-reversible) and the draws are
//! kept, every `check-every` gradients (later every quarter of those spent) the largest
//! rank-normalised split R-hat and the smallest bulk ESS (Vehtari et al. 2021, [`bulk_ess`]) are
//! computed, and the run stops once R-hat is at most `rhat` and the ESS at least `ess`, or at
//! the budget of `steps`. Memory
//! stays bounded: past [`MAX_KEPT`] draws per chain every other draw is dropped and the thinning
//! doubles (Geyer's rule of halving a full trace).
//!
//! One step size cannot serve a posterior whose scale changes with position (Neal's funnel: the
//! neck needs steps a hundredth of the mouth's): chains in the neck reject every proposal and the
//! draws never reach it. So the first [`PROBE_STEPS`] kept steps also count each chain's mean
//! acceptance probability, and when more than [`STUCK_SHARE`] of the chains accept less than
//! [`STUCK_ACCEPTANCE`] (a smooth target at one good step leaves hardly any chain there), the
//! polish step drops what it kept and continues with autoMALA ([`super::auto_mala`]), which picks
//! every chain's step afresh at every iteration, reversibly, for two or more scores an iteration
//! instead of one (`kernel` forces any one kernel).
//!
//! ChEES-HMC ([`super::chees`], `kernel = chees`) moves further per iteration: all chains in
//! lockstep with one shared, jittered trajectory whose length, step and metric are adapted
//! across the chains in its warm-up. The default (`auto`) hands MALA chains that have not met
//! the stopping rule after [`CHEES_AFTER`] steps to it (MALA's steps then count as warm-up and
//! its draws are dropped), or at the first look whose R-hat projects more than
//! [`CHEES_PROJECTED`] MALA steps to the rule ([`projected_steps`]: `R^2 - 1` falls as one over
//! the draws). It does not start with it: under the stopping rule below the
//! chains need 200 to 300 iterations whatever their kernel (R-hat, not ESS, binds: 100 chains'
//! split R-hat needs that many draws each), and a ChEES iteration costs 6 to 23 leapfrog steps
//! (79 on gp_pois_regr), so it spends 2 to 10 times MALA's gradients where MALA mixes (garch,
//! hmm_example, kidiq, logearn_interaction) and wins where it does not (eight_schools: 2.9 times
//! fewer; gp_pois_regr, where autoMALA ends at its budget 0.11 sd off: R-hat 1.016 and 0.02 sd);
//! docs/posteriordb.md at 8a480ca, "ChEES-HMC in the polish step" (measured before ChEES's length
//! maximised its criterion per leapfrog step: "ChEES per gradient").
//!
//! Where even those do not mix (the latent states of an item-response or a stochastic-volatility
//! model), Stan's NUTS does: [`PolishKernel::Auto`] offers chains whose R-hat is still above
//! [`HOPELESS_RHAT`] after [`NUTS_AFTER`] gradients of autoMALA or ChEES to a `TakeOver`
//! closure once ([`crate::fit`] fills it with NUTS, an engine this module does not import). NUTS
//! takes them where its draws mix better (met the rule, or a lower R-hat and a higher ESS); on a
//! funnel they do not (its divergences at the neck), and the kernel goes on to its budget
//! (docs/posteriordb.md at 8a480ca, "The latent-variable acceptance models through the default path").
//!
//! One convergence rule: the stop watches the same statistics the summary prints, on the same
//! draws ([`polish_reported`]): the rank-normalised split R-hat (the larger of the draws' and of
//! their folded values') and the bulk ESS of every reported quantity and of `lp__`.

use std::time::Instant;

use burn::tensor::{Int, Tensor, TensorData};
use parvi_model::LogDensity;
use parvi_model::tensor_ops::to_vec_f32;
use serde::{Deserialize, Serialize};

use crate::evaluation::stationarity::{MalaChains, chain_start};
use crate::evaluation::summary::{quantile7, rank_rhat_and_bulk_ess};
use crate::evaluation::{MIN_PARTICLES, TraceView};
use crate::samplers::auto_mala::AutoMala;
use crate::samplers::chees::{Chees, Metric, leapfrog_steps};
use crate::samplers::mala::{FailureTally, Mala, MalaState, start_score};
use crate::{EngineRng, InferError, Particles};

/// Draws kept per chain before the trace is thinned by half. With the default 100 chains that is
/// 12,500 to 25,000 draws: ESS >= 400 needs far fewer, and every look at the stopping rule ranks
/// all kept draws of every watched quantity, so the looks' cost grows with this
/// (docs/posteriordb.md at 8a480ca, "The default path against Stan's NUTS").
pub const MAX_KEPT: usize = 250;
/// Steps after the warm-up over which each chain's MALA acceptance is averaged to see stuck chains.
pub const PROBE_STEPS: usize = 50;
/// A chain whose mean acceptance probability over the probe is below this is stuck (MALA tuned
/// to 0.574 on average).
pub const STUCK_ACCEPTANCE: f64 = 0.1;
/// More than this share of stuck chains switches [`PolishKernel::Auto`] to autoMALA.
pub const STUCK_SHARE: f64 = 0.05;
/// MALA steps after which [`PolishKernel::Auto`] hands chains that have not yet met the
/// stopping rule to ChEES-HMC: where MALA mixes it stops well before, and past that it is
/// MALA's random walk on a hierarchical or latent scale, which ChEES's trajectories cross in
/// fewer gradients (measured per posterior in docs/posteriordb.md at 8a480ca).
pub const CHEES_AFTER: usize = 1000;
/// MALA steps from which the looks project the steps the stopping rule needs
/// ([`projected_steps`]): the first look's (`check_every`'s default), the chains having run the
/// stationarity check's steps before.
pub const PROJECT_FROM: usize = 50;
/// Projected MALA steps beyond which [`PolishKernel::Auto`] hands the chains to ChEES-HMC at
/// once rather than at [`CHEES_AFTER`]: twice that, since ChEES spends 2 to 3 times MALA's
/// gradients where MALA mixes within it; on the suite it separates the posteriors MALA mixes
/// from eight_schools with room on both sides (docs/posteriordb.md at 8a480ca, "MALA to ChEES on R-hat's
/// projection").
pub const CHEES_PROJECTED: usize = 2 * CHEES_AFTER;
/// Gradients per chain of autoMALA's or ChEES's kept steps after which [`PolishKernel::Auto`]
/// offers chains whose R-hat is still above [`HOPELESS_RHAT`] to NUTS: under [`crate::fit`] its
/// 4 x 2,000 iterations cost what this kernel would spend in its remaining budget and more, but
/// mix where these do not.
pub const NUTS_AFTER: usize = 1000;
/// R-hat above which chains are far from mixed after [`NUTS_AFTER`] gradients.
pub const HOPELESS_RHAT: f64 = 1.1;
/// NUTS's chains when it polishes (Stan's default number of chains).
pub const NUTS_CHAINS: usize = 4;

/// The polish step's Markov kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolishKernel {
    /// MALA with one adapted step, switching to autoMALA when chains are stuck, and to
    /// ChEES-HMC when they have not mixed after [`CHEES_AFTER`] steps or R-hat projects more than
    /// [`CHEES_PROJECTED`] (module docs).
    #[default]
    Auto,
    /// MALA with one adapted step.
    Mala,
    /// autoMALA from the start of the kept steps.
    AutoMala,
    /// ChEES-HMC ([`super::chees`]) throughout.
    Chees,
    /// Stan's NUTS (`parvi_infer::engines::nuts`): [`NUTS_CHAINS`] chains x (1,000 warm-up +
    /// 1,000 draws) from the polish step's start. [`crate::fit`] runs it (an engine of its own,
    /// which this module does not import); [`polish`] refuses it.
    Nuts,
}

/// When [`crate::fit`] runs the polish step.
///
/// The default is every run: on the posteriordb suite the stationarity check cannot see sds 12%
/// small in 4-dimensional posteriors at 100 particles (garch, hmm_example), so polishing only
/// flagged runs leaves those quietly outside 10% (docs/posteriordb.md at 8a480ca, "SVGD with every
/// default").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolishWhen {
    /// Only when the diagnostics flag the particle set: the stationarity check rejects it or
    /// cannot judge it, its moments still drift, or its kernel Stein discrepancy rose.
    Flagged,
    /// After every run of a particle engine.
    #[default]
    Always,
}

/// How the polish step runs (`--polish`, `--no-polish`, `--polish-steps` on the command line).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct PolishConfig {
    /// When it runs.
    pub when: PolishWhen,
    /// The budget: gradients per chain after the warm-up, at most (MALA steps; autoMALA
    /// iterations; ChEES leapfrog steps).
    pub steps: usize,
    /// Warm-up steps per chain that adapt the step size (their draws are dropped). Under
    /// [`crate::fit`], MALA chains that the stationarity check passed skip it: the check's run
    /// was their warm-up (autoMALA's and ChEES's adaptation still take theirs).
    pub warmup: usize,
    /// Stop once the largest split R-hat over the coordinates is at most this (posteriordb's 1.01).
    pub rhat: f64,
    /// ... and the smallest bulk ESS at least this (Stan's guidance for reliable moments: 400).
    pub ess: f64,
    /// Steps between the first two looks at R-hat and ESS; later looks come every quarter of
    /// the steps run so far when that is more (so their cost, which grows with the kept trace,
    /// stays a small share of the chains').
    pub check_every: usize,
    /// At most this many chains, started from evenly spaced particles. R-hat and bulk ESS are
    /// reliable long before a thousand chains, and one chain per particle would make 100,000
    /// particles 10^7 draws (and a polish step that costs far more than the run).
    pub max_chains: usize,
    /// The Markov kernel (`--polish-kernel`).
    pub kernel: PolishKernel,
}

impl PolishKernel {
    /// The kernel's name as the command line spells it (`--polish-kernel`) and messages print it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Mala => "MALA",
            Self::AutoMala => "autoMALA",
            Self::Chees => "ChEES-HMC",
            Self::Nuts => "NUTS",
        }
    }
}

impl Default for PolishConfig {
    fn default() -> Self {
        Self {
            when: PolishWhen::default(),
            steps: 5000,
            warmup: 200,
            rhat: 1.01,
            ess: 400.0,
            check_every: 50,
            max_chains: 1000,
            kernel: PolishKernel::default(),
        }
    }
}

impl PolishConfig {
    /// Checks every setting, naming the one that is wrong.
    pub fn validate(&self) -> Result<(), InferError> {
        if self.steps < 8 {
            return Err(InferError::setting(
                "polish-steps",
                format!("the polish step needs at least 8 MALA steps per chain, got {}", self.steps),
            ));
        }
        if self.max_chains < MIN_PARTICLES {
            return Err(InferError::setting(
                "polish-max-chains",
                format!("the polish step needs at least {MIN_PARTICLES} chains, got {}", self.max_chains),
            ));
        }
        if self.check_every == 0 {
            return Err(InferError::setting("polish-check-every", "must be at least 1, got 0"));
        }
        if !(self.rhat > 1.0 && self.rhat.is_finite()) {
            return Err(InferError::setting("polish-rhat", format!("must be finite and > 1, got {}", self.rhat)));
        }
        if !(self.ess > 0.0 && self.ess.is_finite()) {
            return Err(InferError::setting("polish-ess", format!("must be finite and > 0, got {}", self.ess)));
        }
        Ok(())
    }
}

/// What the polish step did and how its chains ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Polish {
    /// Chains (one per particle, at most `max_chains`).
    pub chains: usize,
    /// Warm-up steps per chain (MALA's, plus autoMALA's when it took over; ChEES's leapfrog
    /// steps).
    pub warmup: usize,
    /// Steps per chain after the warm-up (ChEES: leapfrog steps, one gradient each).
    pub steps: usize,
    /// Transitions per chain after the warm-up (MALA, autoMALA: `steps`).
    #[serde(default)]
    pub iterations: usize,
    /// Keep every this many steps' draw.
    pub thin: usize,
    /// Draws kept per chain.
    pub kept: usize,
    /// The kernel the kept draws came from: [`PolishKernel::Mala`], [`PolishKernel::AutoMala`]
    /// or [`PolishKernel::Chees`].
    pub kernel: PolishKernel,
    /// Share of the chains stuck (mean acceptance below [`STUCK_ACCEPTANCE`]) over the MALA
    /// probe; NaN where no probe ran.
    pub stuck_share: f64,
    /// The fixed step size after the warm-up (in units of the particles' coordinate variances;
    /// autoMALA's base step, squared; ChEES's leapfrog step in its metric's units).
    pub step_size: f64,
    /// ChEES's adapted trajectory length (in its metric's units); `None` for the other kernels.
    #[serde(default)]
    pub trajectory_length: Option<f64>,
    /// Whether ChEES's metric was the chains' dense covariance (else its diagonal); for NUTS,
    /// whether it ran in the frame of the chains' covariance before it.
    #[serde(default)]
    pub dense_metric: bool,
    /// ChEES's divergent transitions after the warm-up (summed over chains).
    #[serde(default)]
    pub divergences: usize,
    /// Proposals rejected because their evaluation failed (a NaN, a gradient that is not
    /// finite, a call the model could not evaluate: an ODE solve that failed), over every chain,
    /// warm-up included; for NUTS, its leapfrog steps that failed. The chains stayed where they
    /// were, as Stan's do.
    #[serde(default)]
    pub failed_evaluations: usize,
    /// The first one's cause.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_failure: Option<String>,
    /// Mean acceptance probability after the warm-up.
    pub acceptance: f64,
    /// The largest rank-normalised split R-hat of the kept draws over the watched quantities
    /// (the reported ones, or the chains' coordinates) and `lp__`.
    pub max_rhat: f64,
    /// The smallest bulk ESS of the kept draws over the same.
    pub min_ess: f64,
    /// Whether both thresholds were met within the budget.
    pub converged: bool,
    /// Model evaluations with gradient (rows).
    pub score_evals: usize,
    /// Whether the chains started from the engine's initial particles rather than its final ones
    /// ([`crate::fit`] does so when the run raised the kernel Stein discrepancy).
    #[serde(default)]
    pub from_start: bool,
    /// Wall seconds.
    pub seconds: f64,
    /// Where NUTS polished after another kernel's chains did not mix: that kernel's report (its
    /// draws were dropped; its seconds and gradients are counted in this one's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_nuts: Option<Box<Polish>>,
    /// MALA's steps (after its own warm-up) before [`PolishKernel::Auto`] handed the chains to
    /// ChEES-HMC, counted in `warmup`; `None` where no hand-off happened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mala_before_chees: Option<usize>,
    /// NUTS's coordinates, where [`crate::fit`] chose them from the draws before it: the frame
    /// the engine ran in or the model's own; `None` where no choice was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frame_choice: Option<FrameChoice>,
}

/// Where NUTS ran and the evidence (issue 59, the frame verified): the condition number of the
/// correlation matrix of the draws before it, in the frame and in the model's own coordinates
/// (what NUTS's diagonal metric leaves in each).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FrameChoice {
    /// Whether NUTS ran in the model's own coordinates (else in the frame).
    pub own: bool,
    /// The draws' correlation condition number in the frame.
    pub condition_frame: f64,
    /// The same in the model's own coordinates.
    pub condition_own: f64,
    /// The condition number sampling noise alone gives the correlation of as many independent
    /// draws in as many dimensions (the Marchenko-Pastur edges, shrunk alike): the factor by
    /// which the frame's must exceed the model's before the model's coordinates are picked.
    #[serde(default)]
    pub noise: f64,
    /// Draws the numbers came from.
    pub draws: usize,
}

impl FrameChoice {
    /// Whether the evidence picks the model's own coordinates: the frame's correlation is worse
    /// conditioned by more than sampling noise explains (the frame, the Laplace approximation's
    /// own guess, is kept otherwise).
    pub fn evidence_picks_own(&self) -> bool {
        self.condition_own * self.noise < self.condition_frame
    }
}

impl Polish {
    /// One line on what the step did, as the command line prints it.
    pub fn describe(&self) -> String {
        let failed = match (self.failed_evaluations, &self.first_failure) {
            (0, _) => String::new(),
            (k, first) => format!(
                ", {k} proposals rejected for a failed evaluation (first: {})",
                first.as_deref().unwrap_or("unknown")
            ),
        };
        let end =
            format!("split R-hat {:.3}, bulk ESS {:.0}{failed}, {:.1} s", self.max_rhat, self.min_ess, self.seconds);
        if self.kernel != PolishKernel::Nuts {
            let mala = self.mala_before_chees.map_or(String::new(), |m| format!(" ({m} of them MALA's)"));
            return format!(
                "{} {} steps after {} of warm-up{mala}, {} chains, {end}",
                self.steps,
                self.kernel.name(),
                self.warmup,
                self.chains
            );
        }
        let frame = if self.dense_metric { ", in the frame of the chains' covariance" } else { "" };
        let before = self.before_nuts.as_ref().map_or(String::new(), |b| {
            format!(
                " after {} ({} warm-up + {} steps a chain, R-hat {:.2})",
                b.kernel.name(),
                b.warmup,
                b.steps,
                b.max_rhat
            )
        });
        format!(
            "NUTS{before}, {} chains x {} draws after {} warm-up iterations ({} gradients a chain{frame}), {} divergences, {end}",
            self.chains, self.kept, self.warmup, self.steps, self.divergences
        )
    }
}

/// The polish step's draws `[kept * chains, dim]` (snapshot-major: draw `s` of chain `c` is row
/// `s * chains + c`, the layout of an MCMC engine's draws) and what it did.
pub struct Polished {
    /// The kept draws, in the coordinates the chains ran in.
    pub draws: Tensor<2>,
    /// What the step did.
    pub report: Polish,
}

/// Runs the polish step under `model` from the check's `chains` (or from `particles` when no check
/// ran), seeded by `seed` (see the module docs); the stopping rule watches the chains'
/// coordinates and their log density.
pub fn polish(
    model: &dyn LogDensity,
    particles: &Particles,
    chains: Option<&MalaChains>,
    config: &PolishConfig,
    seed: u64,
) -> Result<Polished, InferError> {
    polish_reported(model, particles, chains, config, seed, None)
}

/// [`polish`] whose stopping rule watches `reported(x)` `[n, p]` (the quantities a summary
/// reports: [`crate::fit_reported`] maps the chains' whitened coordinates to the model's
/// constrained parameters) and the chains' log density (`lp__`, up to a constant): the
/// rank-normalised split R-hat and bulk ESS of every one of them, as the summary computes them
/// ([`crate::evaluation::Summary::of_chains`]) on the same draws. `None` watches the chains'
/// own coordinates.
pub fn polish_reported(
    model: &dyn LogDensity,
    particles: &Particles,
    chains: Option<&MalaChains>,
    config: &PolishConfig,
    seed: u64,
    reported: Option<&dyn Fn(Tensor<2>) -> Tensor<2>>,
) -> Result<Polished, InferError> {
    polish_offering(model, particles, chains, config, seed, reported, None, false)
}

/// Offered the chains' positions `[n, d]`, their kept draws (snapshot-major, row-major `d`
/// values each) and their R-hat and ESS so far, another kernel takes over (and returns true) or
/// declines (false).
pub(crate) type TakeOver<'a> = &'a mut dyn FnMut(Tensor<2>, &[f32], f64, f64) -> bool;

/// [`polish_reported`] where [`PolishKernel::Auto`] offers autoMALA or ChEES chains still above
/// [`HOPELESS_RHAT`] after [`NUTS_AFTER`] gradients to `take_over` once (NUTS, run by
/// [`crate::fit`]): if it takes them the run ends there (not converged), else it goes on.
///
/// `warm`: the stationarity check passed `chains`, so their run (adapted to MALA's target
/// acceptance, then compared with the particles and found stationary) is MALA's warm-up and the
/// kept steps start at once; the looks' R-hat and ESS still judge every kept draw. Otherwise
/// MALA first adapts for `config.warmup` steps.
#[allow(clippy::too_many_arguments)]
pub(crate) fn polish_offering(
    model: &dyn LogDensity,
    particles: &Particles,
    chains: Option<&MalaChains>,
    config: &PolishConfig,
    seed: u64,
    reported: Option<&dyn Fn(Tensor<2>) -> Tensor<2>>,
    take_over: Option<TakeOver<'_>>,
    warm: bool,
) -> Result<Polished, InferError> {
    config.validate()?;
    if config.kernel == PolishKernel::Nuts {
        return Err(InferError::setting(
            "polish-kernel",
            "NUTS polishes under `fit` (it is an engine: `parvi_infer::engines::nuts` runs it on its own)",
        ));
    }
    let mut take_over = take_over.filter(|_| config.kernel == PolishKernel::Auto);
    let started = Instant::now();
    let (n, d) = (particles.len(), particles.dim());
    if n < MIN_PARTICLES {
        return Err(InferError::setting(
            "particles",
            format!("the polish step needs at least {MIN_PARTICLES} particles (its chains), got {n}"),
        ));
    }
    let mut rng = EngineRng::new(seed ^ 0x9011_5400);
    let (start, scale, h0) = match chains {
        Some(c) => (c.end.clone(), c.scale.clone(), c.step_size),
        None => {
            let (start, _, scale) = chain_start(particles, &mut rng)?;
            (start, scale, (d as f64).powf(-1.0 / 3.0))
        }
    };
    // Beyond `max_chains`, every (n / max_chains)-th chain: the kept ones still start spread over
    // the whole set (the particles are in no order that a stride could bias).
    let (start, n) = if n > config.max_chains {
        let m = config.max_chains;
        let picks: Vec<i64> = (0..m).map(|i| (i * n / m) as i64).collect();
        let idx = Tensor::<1, Int>::from_data(TensorData::new(picks, [m]), &start.device());
        (start.select(0, idx), m)
    } else {
        (start, n)
    };
    let first = start_score(model, start.clone())?;
    let state = (start, first.log_prob, first.grad);
    let mut monitor = Monitor::new(n, d, reported);
    let mut mala_before_chees = None;
    let failed = FailureTally::default();
    let run = match config.kernel {
        PolishKernel::Chees => chees_run(
            model,
            MalaStart::fresh(state, scale, h0, n),
            config,
            (&mut rng, &failed),
            &mut monitor,
            &mut None,
        )?,
        _ => {
            let mut mala = Mala { model, scale: scale.clone(), rng: &mut rng, n, d, failed: &failed };
            let warmup = if warm && chains.is_some() { 0 } else { config.warmup };
            let (state, h) = mala.adapt(state, h0, warmup)?;
            let start = MalaStart {
                state,
                scale: scale.clone(),
                h,
                evals: n * (1 + warmup),
                warmup,
                auto_first: config.kernel == PolishKernel::AutoMala,
                probe: config.kernel == PolishKernel::Auto,
            };
            let (run, handoff) = mala_run(model, start, config, (&mut rng, &failed), &mut monitor, &mut take_over)?;
            mala_before_chees = handoff.is_some().then_some(run.steps);
            match handoff {
                // MALA's steps were ChEES's warm-up start: its draws are dropped, its spent
                // gradients counted, ChEES adapts afresh from where the chains are.
                Some(state) => {
                    monitor.clear();
                    let start = MalaStart {
                        evals: run.evals,
                        warmup: run.warmup + run.steps,
                        ..MalaStart::fresh(state, scale, run.step_size, n)
                    };
                    chees_run(model, start, config, (&mut rng, &failed), &mut monitor, &mut take_over)?
                }
                None => run,
            }
        }
    };
    let draws = Tensor::from_data(TensorData::new(monitor.kept, [monitor.snapshots * n, d]), &particles.device());
    Ok(Polished {
        draws,
        report: Polish {
            chains: n,
            warmup: run.warmup,
            steps: run.steps,
            iterations: run.iterations,
            thin: monitor.thin,
            kept: monitor.snapshots,
            kernel: run.kernel,
            stuck_share: run.stuck_share,
            step_size: run.step_size,
            trajectory_length: run.trajectory_length,
            dense_metric: run.dense_metric,
            divergences: run.divergences,
            failed_evaluations: failed.count(),
            first_failure: failed.first(),
            acceptance: run.acceptance,
            max_rhat: run.max_rhat,
            min_ess: run.min_ess,
            converged: run.converged,
            score_evals: run.evals,
            from_start: false,
            seconds: started.elapsed().as_secs_f64(),
            before_nuts: None,
            mala_before_chees,
            frame_choice: None,
        },
    })
}

/// How a kernel's run ended.
struct Run {
    kernel: PolishKernel,
    warmup: usize,
    steps: usize,
    iterations: usize,
    stuck_share: f64,
    step_size: f64,
    trajectory_length: Option<f64>,
    dense_metric: bool,
    divergences: usize,
    acceptance: f64,
    max_rhat: f64,
    min_ess: f64,
    converged: bool,
    evals: usize,
}

/// Where a run starts: the chains and what the warm-up so far cost.
struct MalaStart {
    state: MalaState,
    /// `[1, d]` proposal sds.
    scale: Tensor<2>,
    /// MALA's step (autoMALA's base step squared).
    h: f64,
    evals: usize,
    warmup: usize,
    /// Adapt autoMALA (its base step and scale) before its kept iterations.
    auto_first: bool,
    /// Probe MALA's first [`PROBE_STEPS`] for stuck chains (and switch to autoMALA).
    probe: bool,
}

impl MalaStart {
    /// The chains as the polish step got them: one score each, no warm-up yet.
    fn fresh(state: MalaState, scale: Tensor<2>, h: f64, n: usize) -> Self {
        Self { state, scale, h, evals: n, warmup: 0, auto_first: false, probe: false }
    }
}

/// ChEES-HMC ([`super::chees`]): its warm-up, then fixed settings and kept draws until the
/// stopping rule or the budget (`steps` leapfrog steps per chain, the gradients MALA would spend
/// in as many steps).
///
/// Stuck chains are not looked for here but in MALA's probe before ([`PolishKernel::Auto`]): the
/// harmonic mean that sets ChEES's step is dominated by the worst chains, so in a funnel it
/// shrinks the step until the neck's chains accept (the 4-d funnel of `tests/polish.rs`: step
/// 0.0069, no chain stuck) and the mouth's chains need hundreds of leapfrog steps to move; a share
/// of stuck chains under one shared step is then no signal.
///
/// Chains still above [`HOPELESS_RHAT`] after [`NUTS_AFTER`] leapfrog steps are offered to
/// `take_over` once.
fn chees_run(
    model: &dyn LogDensity,
    start: MalaStart,
    config: &PolishConfig,
    (rng, failed): (&mut EngineRng, &FailureTally),
    monitor: &mut Monitor<'_>,
    take_over: &mut Option<TakeOver<'_>>,
) -> Result<Run, InferError> {
    let MalaStart { state, scale, h: h0, evals: spent, warmup: warmed, .. } = start;
    let [n, d] = state.0.dims();
    // MALA's step `h` is one leapfrog step of size `sqrt(h)` in the same units (the scale's).
    let eps0 = h0.sqrt();
    let mut hmc = Chees { model, metric: Metric::Diagonal { sd: scale }, rng, n, d, failed };
    let mut halton_index = 0u64;
    // One posterior sd in the metric's units: about the half period (pi/2) of a unit Gaussian
    // over pi, a length ChEES moves from in a few dozen iterations either way.
    let (state, tuned) = hmc.warmup(state, eps0, 1.0, chees_warmup(config), &mut halton_index, STUCK_ACCEPTANCE)?;
    let mut evals = spent + n * tuned.leapfrogs;
    let warmup = warmed + tuned.leapfrogs;
    let (eps, trajectory) = (tuned.step_size, tuned.trajectory);
    let (mut state, mut leapfrogs, mut iterations, mut accepted, mut divergences) = (state, 0usize, 0usize, 0.0, 0);
    let (mut max_rhat, mut min_ess, mut converged) = (f64::INFINITY, 0.0, false);
    let mut next_look = config.check_every;
    let mut ticker = crate::core::progress::Ticker::new("polish step (ChEES-HMC)");
    while leapfrogs < config.steps {
        ticker.tick(|| format!("{leapfrogs} of at most {} leapfrog steps", config.steps));
        let steps = leapfrog_steps(halton_index, trajectory, eps).min(config.steps - leapfrogs).max(1);
        halton_index += 1;
        let (next, tr) = hmc.transition(state, eps, steps, 0.0, false)?;
        state = next;
        leapfrogs += steps;
        iterations += 1;
        evals += n * steps;
        accepted += tr.accept.iter().sum::<f64>() / n as f64;
        divergences += tr.divergent.iter().filter(|&&b| b).count();
        monitor.offer(iterations, &state)?;
        // Looks at the same gradient counts as MALA's (every `check_every` gradients at first,
        // then every quarter of those spent), so both kernels' costs compare at one resolution.
        if leapfrogs >= next_look || leapfrogs >= config.steps {
            let need = if leapfrogs >= config.steps || (leapfrogs >= NUTS_AFTER && take_over.is_some()) {
                LookNeeds::Full
            } else {
                LookNeeds::Pass
            };
            if monitor.look(leapfrogs, &mut next_look, config, need, (&mut max_rhat, &mut min_ess))? {
                converged = true;
                break;
            }
            if leapfrogs >= NUTS_AFTER
                && max_rhat > HOPELESS_RHAT
                && offer(take_over, &state, monitor, max_rhat, min_ess)
            {
                break;
            }
        }
    }
    Ok(Run {
        kernel: PolishKernel::Chees,
        warmup,
        steps: leapfrogs,
        iterations,
        stuck_share: tuned.stuck_share,
        step_size: eps,
        trajectory_length: Some(trajectory),
        dense_metric: hmc.metric.is_dense(),
        divergences,
        acceptance: accepted / iterations.max(1) as f64,
        max_rhat,
        min_ess,
        converged,
        evals,
    })
}

/// ChEES's warm-up iterations: half of `warmup` (each costs several gradients where MALA's
/// costs one, and the chains start from the check's, already near the posterior), at least 8
/// (two metric windows of 2).
fn chees_warmup(config: &PolishConfig) -> usize {
    (config.warmup / 2).max(8)
}

/// MALA from `start` (switching to autoMALA where the probe finds stuck chains) or autoMALA,
/// until the stopping rule or the budget of `steps` iterations; with the probe
/// ([`PolishKernel::Auto`]), MALA chains that have not met the rule after [`CHEES_AFTER`] steps
/// are returned for ChEES-HMC instead (the second value). autoMALA chains still above
/// [`HOPELESS_RHAT`] after [`NUTS_AFTER`] gradients a chain are offered to `take_over` once.
fn mala_run(
    model: &dyn LogDensity,
    start: MalaStart,
    config: &PolishConfig,
    (rng, failed): (&mut EngineRng, &FailureTally),
    monitor: &mut Monitor<'_>,
    take_over: &mut Option<TakeOver<'_>>,
) -> Result<(Run, Option<MalaState>), InferError> {
    let MalaStart { mut state, scale, mut h, mut evals, mut warmup, auto_first, probe } = start;
    let [n, d] = state.0.dims();
    let (mut steps, mut accepted) = (0usize, 0.0);
    let (mut max_rhat, mut min_ess, mut converged) = (f64::INFINITY, 0.0, false);
    let mut next_look = config.check_every;
    let mut kernel = if auto_first { PolishKernel::AutoMala } else { PolishKernel::Mala };
    let mut probe = probe.then(|| Tensor::<1>::zeros([n], &state.0.device()));
    let mut stuck_share = f64::NAN;
    let may_hand_off = probe.is_some();
    let mut handoff = None;
    let mut auto = AutoMala { model, scale, rng, n, d, failed };
    if auto_first {
        let (next, eps0, spent) = auto.adapt(state, h.sqrt(), config.warmup)?;
        (state, h, evals, warmup) = (next, eps0 * eps0, evals + spent, warmup + config.warmup);
    }
    // Scores when autoMALA's kept iterations began (its offer counts gradients, not iterations:
    // an iteration costs two or more).
    let mut auto_from = evals;
    let mut ticker = crate::core::progress::Ticker::new("polish step (MALA)");
    while steps < config.steps {
        ticker.tick(|| format!("{steps} of at most {} steps", config.steps));
        let acceptance;
        (state, acceptance) = match kernel {
            PolishKernel::AutoMala => {
                let (next, step) = auto.step(state, h.sqrt())?;
                evals += step.evals;
                (next, step.acceptance)
            }
            _ => {
                let mut mala = Mala { model, scale: auto.scale.clone(), rng: &mut *auto.rng, n, d, failed };
                let (next, each) = mala.step_each(state, h)?;
                evals += n;
                let mean = f64::from(each.clone().mean().into_scalar::<f32>());
                probe = probe.map(|sum| sum + each);
                (next, mean)
            }
        };
        steps += 1;
        accepted += acceptance;
        if steps == PROBE_STEPS
            && let Some(sum) = probe.take()
        {
            let means = to_vec_f32(&sum.div_scalar(PROBE_STEPS as f64));
            stuck_share = means.iter().filter(|&&a| f64::from(a) < STUCK_ACCEPTANCE).count() as f64 / n as f64;
            if stuck_share > STUCK_SHARE {
                // One step does not fit every chain: start over with autoMALA from here (the
                // MALA draws kept so far are dropped, their steps count as warm-up).
                kernel = PolishKernel::AutoMala;
                let (next, eps0, spent) = auto.adapt(state, h.sqrt(), config.warmup)?;
                (state, h, evals) = (next, eps0 * eps0, evals + spent);
                auto_from = evals;
                warmup += PROBE_STEPS + config.warmup;
                monitor.clear();
                (steps, accepted, next_look) = (0, 0.0, config.check_every);
                continue;
            }
        }
        monitor.offer(steps, &state)?;
        if steps >= next_look || steps == config.steps {
            let offer_due = kernel == PolishKernel::AutoMala && (evals - auto_from) / n >= NUTS_AFTER;
            let need = if steps == config.steps || (offer_due && take_over.is_some()) {
                LookNeeds::Full
            } else {
                LookNeeds::Pass
            };
            if monitor.look(steps, &mut next_look, config, need, (&mut max_rhat, &mut min_ess))? {
                converged = true;
                break;
            }
            let hand_off_due = steps >= CHEES_AFTER
                || (steps >= PROJECT_FROM && projected_steps(steps, max_rhat, config.rhat) > CHEES_PROJECTED);
            if may_hand_off && kernel == PolishKernel::Mala && hand_off_due && steps < config.steps {
                handoff = Some(state);
                break;
            }
            if offer_due && max_rhat > HOPELESS_RHAT && offer(take_over, &state, monitor, max_rhat, min_ess) {
                break;
            }
        }
    }
    let run = Run {
        kernel,
        warmup,
        steps,
        iterations: steps,
        stuck_share,
        step_size: h,
        trajectory_length: None,
        dense_metric: false,
        divergences: 0,
        acceptance: accepted / steps.max(1) as f64,
        max_rhat,
        min_ess,
        converged,
        evals,
    };
    Ok((run, handoff))
}

/// The steps at which chains with split R-hat `rhat` after `steps` steps reach `target`, were the
/// chains stationary: `R^2 - 1` falls as one over the draws per chain (`R^2 ~ 1 + 1 / ESS` of a
/// split chain, Vehtari et al. 2021, Sec. 3), so `steps (R^2 - 1) / (target^2 - 1)`. A start
/// not yet forgotten makes it an overestimate, hence [`PROJECT_FROM`].
fn projected_steps(steps: usize, rhat: f64, target: f64) -> usize {
    if !rhat.is_finite() {
        return usize::MAX;
    }
    let ratio = (rhat * rhat - 1.0).max(0.0) / (target * target - 1.0);
    (steps as f64 * ratio).min(usize::MAX as f64 / 2.0) as usize
}

/// Offers the chains to `take_over` (once: it is spent either way); whether it took them.
fn offer(
    take_over: &mut Option<TakeOver<'_>>,
    state: &MalaState,
    monitor: &Monitor<'_>,
    max_rhat: f64,
    min_ess: f64,
) -> bool {
    take_over.take().is_some_and(|take| take(state.0.clone(), &monitor.kept, max_rhat, min_ess))
}

/// The kept draws and the quantities the stopping rule watches, thinned together.
struct Monitor<'v> {
    n: usize,
    d: usize,
    reported: Option<&'v dyn Fn(Tensor<2>) -> Tensor<2>>,
    /// The chains' positions, snapshot-major `[snapshots, n, d]`.
    kept: Vec<f32>,
    /// The watched quantities and `lp__`, snapshot-major `[snapshots, n, q]`.
    watched: Vec<f32>,
    /// Watched columns per draw (set at the first draw).
    q: usize,
    snapshots: usize,
    thin: usize,
    /// Each watched quantity's R-hat at the look that last ranked it (infinite before): a look
    /// ranks the worst first, so a failing look usually stops after one or two.
    last_rhat: Vec<f64>,
}

impl<'v> Monitor<'v> {
    fn new(n: usize, d: usize, reported: Option<&'v dyn Fn(Tensor<2>) -> Tensor<2>>) -> Self {
        Self {
            n,
            d,
            reported,
            kept: Vec::new(),
            watched: Vec::new(),
            q: 0,
            snapshots: 0,
            thin: 1,
            last_rhat: Vec::new(),
        }
    }

    /// Keeps the draw of iteration `step` when the thinning takes it; past [`MAX_KEPT`] draws per
    /// chain every other one is dropped and the thinning doubles (Geyer's rule of halving a full
    /// trace), so the kept draws stay those of iterations `thin, 2 thin, ...`.
    fn offer(&mut self, step: usize, state: &MalaState) -> Result<(), InferError> {
        if !step.is_multiple_of(self.thin) {
            return Ok(());
        }
        let n = self.n;
        let (x, lp) = (state.0.clone(), state.1.clone());
        let shown = match self.reported {
            Some(f) => f(x.clone()),
            None => x.clone(),
        };
        let [rows, p] = shown.dims();
        if rows != n || (self.q != 0 && self.q != p + 1) {
            return Err(InferError::setting(
                "reported",
                format!(
                    "the reported quantities of {n} draws came back as [{rows}, {p}] (expected {n} rows, the same columns every time)"
                ),
            ));
        }
        self.q = p + 1;
        let both = Tensor::cat(vec![shown, lp.reshape([n, 1])], 1);
        self.kept.extend(to_vec_f32(&x));
        self.watched.extend(to_vec_f32(&both));
        self.snapshots += 1;
        if self.snapshots > MAX_KEPT {
            self.kept = halve(&self.kept, n * self.d);
            self.watched = halve(&self.watched, n * self.q);
            self.snapshots = self.kept.len() / (n * self.d);
            self.thin *= 2;
        }
        Ok(())
    }

    /// A look at the stopping rule after `spent` gradients: the next look is set (every
    /// `check_every` gradients at first, then every quarter of those spent), the statistics
    /// stored, and whether they pass returned. The statistics are the largest rank-normalised
    /// split R-hat (of the draws and of their distances from the median, Vehtari et al. 2021,
    /// Sec. 4.2) and the smallest bulk ESS over the watched quantities and `lp__`: the summary's
    /// ([`crate::evaluation::Summary`]) on the same draws; NaN counts as failing; no pass before 4 draws a
    /// chain.
    ///
    /// The rule fails as soon as one quantity fails, so the quantities are ranked worst first
    /// (by their R-hat at the look before) and, where only pass or fail matters
    /// ([`LookNeeds::Pass`]), the look stops at the first failure. The stored statistics are
    /// then those of the quantities ranked so far, but the decision is the full look's, at the
    /// cost of one or two quantities' ranks instead of all (eight_schools: 19). A look whose
    /// figures are used (the last, reported; one an offer to NUTS may follow, which compares
    /// them) ranks every quantity.
    fn look(
        &mut self,
        spent: usize,
        next_look: &mut usize,
        config: &PolishConfig,
        need: LookNeeds,
        (max_rhat, min_ess): (&mut f64, &mut f64),
    ) -> Result<bool, InferError> {
        *next_look = spent + config.check_every.max(spent / 4);
        if self.snapshots < 4 {
            return Ok(false);
        }
        let view = TraceView::new(&self.watched, self.snapshots, self.n, self.q)?;
        let last = &mut self.last_rhat;
        if last.len() != self.q {
            *last = vec![f64::INFINITY; self.q];
        }
        let mut order: Vec<usize> = (0..self.q).collect();
        order.sort_by(|&a, &b| last[b].total_cmp(&last[a]));
        let (mut r_max, mut e_min) = (f64::NEG_INFINITY, f64::INFINITY);
        for j in order {
            let (r, e) = quantity_statistic(&view, j);
            last[j] = if r.is_nan() { f64::INFINITY } else { r };
            r_max = if r.is_nan() { f64::INFINITY } else { r_max.max(r) };
            e_min = if e.is_nan() { 0.0 } else { e_min.min(e) };
            let failed = !(r_max <= config.rhat && e_min >= config.ess);
            if failed && need == LookNeeds::Pass {
                break;
            }
        }
        (*max_rhat, *min_ess) = (r_max, e_min);
        Ok(r_max <= config.rhat && e_min >= config.ess)
    }

    /// Drops every draw kept so far.
    fn clear(&mut self) {
        (self.kept, self.watched, self.snapshots, self.thin) = (Vec::new(), Vec::new(), 0, 1);
    }
}

/// The polish step's stopping statistic (the largest rank-normalised split R-hat and the smallest
/// bulk ESS over the watched quantities and `lp__`) of chains run elsewhere (NUTS under
/// [`crate::fit`]): `draws` `[snapshots * chains, d]` snapshot-major with their `log_prob`,
/// watched through `reported` as [`polish_reported`] watches its own.
pub(crate) fn chains_statistic(
    draws: Tensor<2>,
    log_prob: Tensor<1>,
    chains: usize,
    reported: Option<&dyn Fn(Tensor<2>) -> Tensor<2>>,
) -> Result<(f64, f64), InferError> {
    let [rows, _] = draws.dims();
    let shown = match reported {
        Some(f) => f(draws),
        None => draws,
    };
    let q = shown.dims()[1] + 1;
    let both = Tensor::cat(vec![shown, log_prob.reshape([rows, 1])], 1);
    watched_statistic(&to_vec_f32(&both), rows / chains, chains, q)
}

/// What a look must settle.
#[derive(Clone, Copy, PartialEq, Eq)]
enum LookNeeds {
    /// Every quantity's statistics: the last look (its figures are reported) and any look an
    /// offer to NUTS may follow (the offer compares them with NUTS's).
    Full,
    /// Only whether the rule passes.
    Pass,
}

/// Rank-normalised split R-hat (the larger of the draws' and their folded distances') and bulk
/// ESS of watched quantity `j`; NaN where a draw is not finite.
fn quantity_statistic(view: &TraceView<'_>, j: usize) -> (f64, f64) {
    let series = view.series(j);
    if !series.iter().flatten().all(|v| v.is_finite()) {
        return (f64::NAN, f64::NAN);
    }
    let all: Vec<f64> = series.iter().flatten().copied().collect();
    rank_rhat_and_bulk_ess(&series, quantile7(&all, 0.5))
}

/// The largest R-hat and smallest bulk ESS over the quantities of a snapshot-major trace
/// `[snapshots, chains, q]` ([`quantity_statistic`]; NaN counts as failing).
fn watched_statistic(watched: &[f32], snapshots: usize, chains: usize, q: usize) -> Result<(f64, f64), InferError> {
    let view = TraceView::new(watched, snapshots, chains, q)?;
    let (mut max_rhat, mut min_ess) = (f64::NEG_INFINITY, f64::INFINITY);
    for j in 0..q {
        let (r, e) = quantity_statistic(&view, j);
        max_rhat = if r.is_nan() { f64::INFINITY } else { max_rhat.max(r) };
        min_ess = if e.is_nan() { 0.0 } else { min_ess.min(e) };
    }
    Ok((max_rhat, min_ess))
}

/// Every other snapshot (the 2nd, 4th, ...) of a snapshot-major trace of `row` values per snapshot:
/// with the thinning doubled, the kept draws stay those of steps `thin, 2 thin, ...`.
fn halve(kept: &[f32], row: usize) -> Vec<f32> {
    kept.chunks(row).skip(1).step_by(2).flatten().copied().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// R-hat at the target projects the steps already run; twice the excess of `R^2 - 1` twice
    /// the steps; eight_schools' first look (R-hat 1.715 after 50 MALA steps) about 4,800, past
    /// [`CHEES_PROJECTED`], and garch's (1.086) about 450, short of it; a non-finite R-hat never
    /// reaches the target.
    #[test]
    fn projected_steps_scale_with_the_excess_of_rhat_squared() {
        assert_eq!(projected_steps(300, 1.01, 1.01), 300);
        let twice = (1.0 + 2.0 * (1.02f64.powi(2) - 1.0)).sqrt();
        assert!(projected_steps(100, twice, 1.02).abs_diff(200) <= 1);
        let eight_schools = projected_steps(50, 1.7153, 1.01);
        assert!((4700..4900).contains(&eight_schools) && eight_schools > CHEES_PROJECTED, "{eight_schools}");
        let garch = projected_steps(50, 1.0861, 1.01);
        assert!((400..500).contains(&garch), "{garch}");
        assert_eq!(projected_steps(50, f64::NAN, 1.01), usize::MAX);
        assert_eq!(projected_steps(50, f64::INFINITY, 1.01), usize::MAX);
        assert_eq!(projected_steps(50, 0.99, 1.01), 0);
    }
}
