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

use std::time::Instant;

use burn::tensor::{Int, Tensor, TensorData};
use parvi_model::LogDensity;
use parvi_model::tensor_ops::to_vec_f32;
use serde::{Deserialize, Serialize};

use crate::evaluation::stationarity::{Mala, MalaChains, chain_start};
use crate::evaluation::{MIN_PARTICLES, TraceView, bulk_ess, split_rhat};
use crate::{EngineRng, InferError, Particles};

/// Draws kept per chain before the trace is thinned by half.
pub const MAX_KEPT: usize = 1000;

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
    /// Warm-up steps per chain.
    pub warmup: usize,
    /// Steps per chain after the warm-up.
    pub steps: usize,
    /// Keep every this many steps' draw.
    pub thin: usize,
    /// Draws kept per chain.
    pub kept: usize,
    /// The fixed step size after the warm-up (in units of the particles' coordinate variances).
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
    let mut mala = Mala { model, scale, rng: &mut rng, n, d };
    let (mut state, h) = mala.adapt((start, first.log_prob, first.grad), h0, config.warmup)?;
    let mut evals = n * (1 + config.warmup);

    let (mut kept, mut thin, mut steps, mut accepted) = (Vec::<f32>::new(), 1usize, 0usize, 0.0);
    let (mut max_rhat, mut min_ess, mut converged) = (f64::INFINITY, 0.0, false);
    let mut next_look = config.check_every;
    while steps < config.steps {
        let (next, acceptance) = mala.step(state, h)?;
        state = next;
        steps += 1;
        evals += n;
        accepted += acceptance;
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
            warmup: config.warmup,
            steps,
            thin,
            kept: snapshots,
            step_size: h,
            acceptance: accepted / steps.max(1) as f64,
            max_rhat,
            min_ess,
            converged,
            score_evals: evals,
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
