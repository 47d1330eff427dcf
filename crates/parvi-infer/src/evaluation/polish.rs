//! The polish step: when a particle engine ends at a biased fixed point, continue the
//! stationarity check's batched MALA chains (one per particle) until they have mixed, and let
//! their draws stand for the posterior instead of the particles.
//!
//! The chains start where the check's compared chains ended (or at the particles, resampled by
//! weight, when no check ran), with its proposal scale (the particles' coordinate sds) and its
//! adapted step. A warm-up re-adapts the step toward MALA's optimal acceptance 0.574 (Roberts &
//! Rosenthal 1998) while the chains leave the particles' bias behind; its draws are dropped.
//! Then the step is fixed (the chains are then exactly `p`-reversible) and the draws are kept,
//! every `check-every` steps the largest split R-hat and the smallest bulk ESS over the
//! coordinates (Vehtari et al. 2021, [`split_rhat`], [`bulk_ess`]) are computed, and the run stops
//! once R-hat is at most `rhat` and the ESS at least `ess`, or at the budget of `steps`. Memory
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
//! instead of one (`kernel` forces either).

use std::time::Instant;

use burn::tensor::{Int, Tensor, TensorData};
use parvi_model::LogDensity;
use parvi_model::tensor_ops::to_vec_f32;
use serde::{Deserialize, Serialize};

use crate::evaluation::auto_mala::AutoMala;
use crate::evaluation::stationarity::{Mala, MalaChains, chain_start};
use crate::evaluation::{MIN_PARTICLES, TraceView, bulk_ess, split_rhat};
use crate::{EngineRng, InferError, Particles};

/// Draws kept per chain before the trace is thinned by half.
pub const MAX_KEPT: usize = 1000;
/// Steps after the warm-up over which each chain's MALA acceptance is averaged to see stuck chains.
pub const PROBE_STEPS: usize = 50;
/// A chain whose mean acceptance probability over the probe is below this is stuck (MALA tuned
/// to 0.574 on average).
pub const STUCK_ACCEPTANCE: f64 = 0.1;
/// More than this share of stuck chains switches [`PolishKernel::Auto`] to autoMALA.
pub const STUCK_SHARE: f64 = 0.05;

/// The polish step's Markov kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolishKernel {
    /// MALA with one adapted step, switching to autoMALA when chains are stuck (module docs).
    #[default]
    Auto,
    /// MALA with one adapted step.
    Mala,
    /// autoMALA from the start of the kept steps.
    AutoMala,
}

/// When [`crate::fit`] runs the polish step.
///
/// The default is every run: on the posteriordb suite the stationarity check cannot see sds 12%
/// small in 4-dimensional posteriors at 100 particles (garch, hmm_example), so polishing only
/// flagged runs leaves those quietly outside 10% (docs/posteriordb.md, "SVGD with every
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
    /// The budget: MALA steps per chain after the warm-up, at most.
    pub steps: usize,
    /// Warm-up steps per chain that adapt the step size (their draws are dropped).
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
    /// Warm-up steps per chain (MALA's, plus autoMALA's when it took over).
    pub warmup: usize,
    /// Steps per chain after the warm-up.
    pub steps: usize,
    /// Keep every this many steps' draw.
    pub thin: usize,
    /// Draws kept per chain.
    pub kept: usize,
    /// The kernel the kept draws came from: [`PolishKernel::Mala`] or [`PolishKernel::AutoMala`].
    pub kernel: PolishKernel,
    /// Share of the chains stuck (mean acceptance below [`STUCK_ACCEPTANCE`]) over the MALA
    /// probe; NaN where no probe ran.
    pub stuck_share: f64,
    /// The fixed step size after the warm-up (in units of the particles' coordinate variances;
    /// autoMALA's base step, squared).
    pub step_size: f64,
    /// Mean acceptance probability after the warm-up.
    pub acceptance: f64,
    /// The largest split R-hat over the coordinates of the kept draws.
    pub max_rhat: f64,
    /// The smallest bulk ESS over the coordinates of the kept draws.
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
/// ran), seeded by `seed` (see the module docs).
pub fn polish(
    model: &dyn LogDensity,
    particles: &Particles,
    chains: Option<&MalaChains>,
    config: &PolishConfig,
    seed: u64,
) -> Result<Polished, InferError> {
    config.validate()?;
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
    let first = parvi_model::score(model, start.clone(), None)?;
    let mut mala = Mala { model, scale: scale.clone(), rng: &mut rng, n, d };
    let (mut state, mut h) = mala.adapt((start, first.log_prob, first.grad), h0, config.warmup)?;
    let mut evals = n * (1 + config.warmup);
    let mut warmup = config.warmup;

    let (mut kept, mut thin, mut steps, mut accepted) = (Vec::<f32>::new(), 1usize, 0usize, 0.0);
    let (mut max_rhat, mut min_ess, mut converged) = (f64::INFINITY, 0.0, false);
    let mut next_look = config.check_every;
    let mut kernel = if config.kernel == PolishKernel::AutoMala { PolishKernel::AutoMala } else { PolishKernel::Mala };
    let mut probe = (config.kernel == PolishKernel::Auto).then(|| Tensor::<1>::zeros([n], &state.0.device()));
    let mut stuck_share = f64::NAN;
    let mut auto = AutoMala { model, scale, rng: mala.rng, n, d };
    if kernel == PolishKernel::AutoMala {
        let (next, eps0, spent) = auto.adapt(state, h.sqrt(), config.warmup)?;
        (state, h, evals, warmup) = (next, eps0 * eps0, evals + spent, warmup + config.warmup);
    }
    while steps < config.steps {
        let acceptance;
        (state, acceptance) = match kernel {
            PolishKernel::AutoMala => {
                let (next, step) = auto.step(state, h.sqrt())?;
                evals += step.evals;
                (next, step.acceptance)
            }
            _ => {
                let mut mala = Mala { model, scale: auto.scale.clone(), rng: &mut *auto.rng, n, d };
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
                warmup += PROBE_STEPS + config.warmup;
                (kept, thin, steps, accepted, next_look) = (Vec::new(), 1, 0, 0.0, config.check_every);
                continue;
            }
        }
        if steps % thin == 0 {
            kept.extend(to_vec_f32(&state.0));
            if kept.len() / (n * d) > MAX_KEPT {
                kept = halve(&kept, n * d);
                thin *= 2;
            }
        }
        if steps >= next_look || steps == config.steps {
            next_look = steps + config.check_every.max(steps / 4);
            let snapshots = kept.len() / (n * d);
            if snapshots >= 4 {
                (max_rhat, min_ess) = rhat_and_ess(&kept, snapshots, n, d)?;
                if max_rhat <= config.rhat && min_ess >= config.ess {
                    converged = true;
                    break;
                }
            }
        }
    }
    let snapshots = kept.len() / (n * d);
    let draws = Tensor::from_data(TensorData::new(kept, [snapshots * n, d]), &particles.device());
    Ok(Polished {
        draws,
        report: Polish {
            chains: n,
            warmup,
            steps,
            thin,
            kept: snapshots,
            kernel,
            stuck_share,
            step_size: h,
            acceptance: accepted / steps.max(1) as f64,
            max_rhat,
            min_ess,
            converged,
            score_evals: evals,
            from_start: false,
            seconds: started.elapsed().as_secs_f64(),
        },
    })
}

/// Every other snapshot (the 2nd, 4th, ...) of a snapshot-major trace of `row` values per snapshot:
/// with the thinning doubled, the kept draws stay those of steps `thin, 2 thin, ...`.
fn halve(kept: &[f32], row: usize) -> Vec<f32> {
    kept.chunks(row).skip(1).step_by(2).flatten().copied().collect()
}

/// The largest split R-hat and the smallest bulk ESS over the coordinates (NaN counts as failing).
fn rhat_and_ess(kept: &[f32], snapshots: usize, n: usize, d: usize) -> Result<(f64, f64), InferError> {
    let view = TraceView::new(kept, snapshots, n, d)?;
    let (mut max_rhat, mut min_ess) = (f64::NEG_INFINITY, f64::INFINITY);
    for j in 0..d {
        let series = view.series(j);
        let (r, e) = (split_rhat(&series), bulk_ess(&series));
        max_rhat = if r.is_nan() { f64::INFINITY } else { max_rhat.max(r) };
        min_ess = if e.is_nan() { 0.0 } else { min_ess.min(e) };
    }
    Ok((max_rhat, min_ess))
}
