//! autoMALA (Biron-Lattes, Surjanovic, Syed, Campbell & Bouchard-Côté 2024, AISTATS, Alg. 1):
//! MALA whose step size is chosen afresh at every iteration, per chain, from where the chain is,
//! and still exactly reversible. The polish step switches to it when one global step cannot serve
//! every chain (a funnel's neck and mouth, a hierarchical scale), see [`super::polish`].
//!
//! One iteration of a chain at `x`, with momentum `p ~ N(0, I)` and a random bracket
//! `log a < log b` (two sorted uniforms, so that every acceptance level can be selected):
//! 1. the step-size selector `mu(x, p, a, b)` tries one leapfrog step (MALA written as HMC with one
//!    step: `h = eps^2`) at the base step `eps0`; while the log joint-density change `l` is below
//!    `log a` (or not finite) it halves the step, and while it is above `log b` it doubles the
//!    step, stopping one doubling early (the paper's guard against a cliff in acceptance);
//! 2. the proposal `(x', p')` is the leapfrog step at the selected `eps0 * 2^j`;
//! 3. the reverse selection `mu(x', -p', a, b)` must give the same `j` (its "reversibility
//!    check"), and then `(x', p')` is accepted with probability `min(1, e^l)`.
//!
//! Since the selector depends on `(x, p, a, b)` only through quantities the reverse move
//! reproduces, the kernel is `p`-reversible for a fixed `eps0` (the paper's Theorem 1). All
//! chains run at once: every round of halving or doubling scores the chains still searching in
//! one batched call, so an iteration costs two full scores (the forward and the reverse
//! selection's first try) plus the rows of the chains still searching in each later round.

use burn::tensor::{Bool, Int, Tensor, TensorData};
use parvi_model::LogDensity;
use parvi_model::tensor_ops::to_vec_f32;

use crate::samplers::mala::{FailureTally, MalaState, proposal_score};
use crate::{EngineRng, InferError};

/// Halvings of the base step a selection may try (a step `2^-12` of the base is far below any
/// scale a whitened posterior's chain meets; the cap keeps a chain at a singularity from
/// looping).
pub(crate) const MAX_HALVINGS: i32 = 12;
/// Doublings a selection may try.
pub(crate) const MAX_DOUBLINGS: i32 = 6;

/// The batched autoMALA transition with a diagonal scale (the proposal's coordinate sds).
pub(crate) struct AutoMala<'a, 'r> {
    pub(crate) model: &'a dyn LogDensity,
    /// `[1, d]` coordinate sds.
    pub(crate) scale: Tensor<2>,
    pub(crate) rng: &'r mut EngineRng,
    pub(crate) n: usize,
    pub(crate) d: usize,
    /// Where the proposals rejected for a failed evaluation are counted.
    pub(crate) failed: &'a FailureTally,
}

/// What one iteration did, over the chains.
pub(crate) struct AutoMalaStep {
    /// Mean acceptance probability (0 where the reversibility check failed).
    pub(crate) acceptance: f64,
    /// Mean selected exponent `j` of the forward selections (the step was `eps0 * 2^j`).
    pub(crate) mean_exponent: f64,
    /// Model scores, in rows (chains scored).
    pub(crate) evals: usize,
}

/// Chains at a point of the leapfrog map: position, log density, score, momentum.
#[derive(Clone)]
struct Phase {
    x: Tensor<2>,
    lp: Tensor<1>,
    g: Tensor<2>,
    p: Tensor<2>,
}

impl Phase {
    fn select(&self, idx: &Tensor<1, Int>) -> Self {
        Self {
            x: self.x.clone().select(0, idx.clone()),
            lp: self.lp.clone().select(0, idx.clone()),
            g: self.g.clone().select(0, idx.clone()),
            p: self.p.clone().select(0, idx.clone()),
        }
    }

    /// `self` with the rows `rows` (a row mask over all chains) taken from `part`, whose rows are
    /// those of the chains `idx` (ascending): scattered into place, then chosen by the mask.
    fn with_rows(self, part: &Self, idx: &Tensor<1, Int>, rows: &[bool]) -> Self {
        let n = rows.len();
        let device = self.x.device();
        let d = self.x.dims()[1];
        let mask1 = Tensor::<1, Bool>::from_data(TensorData::new(rows.to_vec(), [n]), &device);
        let mask2 = mask1.clone().reshape([n, 1]).repeat_dim(1, d);
        let k = idx.dims()[0];
        let idx2 = idx.clone().reshape([k, 1]).repeat_dim(1, d);
        let place2 = |full: Tensor<2>, values: Tensor<2>| {
            let placed = full.zeros_like().scatter(0, idx2.clone(), values, burn::tensor::IndexingUpdateOp::Add);
            full.mask_where(mask2.clone(), placed)
        };
        let placed_lp =
            self.lp.zeros_like().scatter(0, idx.clone(), part.lp.clone(), burn::tensor::IndexingUpdateOp::Add);
        Self {
            x: place2(self.x, part.x.clone()),
            g: place2(self.g, part.g.clone()),
            p: place2(self.p, part.p.clone()),
            lp: self.lp.mask_where(mask1, placed_lp),
        }
    }
}

/// A selection's outcome per chain: the exponent, and the phase and log joint change at it.
struct Selection {
    exponent: Vec<i32>,
    end: Phase,
    change: Vec<f32>,
}

impl AutoMala<'_, '_> {
    /// One leapfrog step of the chains `start` with steps `eps` (`[k, 1]`): the phase reached and
    /// the change of the log joint density `log p(x) - |p|^2 / 2` (NaN where the score is not
    /// finite or the evaluation failed: the selector halves there, and a selected step that
    /// fails is rejected).
    fn leapfrog(&self, start: &Phase, eps: Tensor<2>) -> Result<(Phase, Vec<f32>), InferError> {
        let k = start.x.dims()[0];
        let half = eps.clone().mul_scalar(0.5);
        let p_half = start.p.clone() + start.g.clone().mul(self.scale.clone()).mul(half.clone());
        let x = start.x.clone() + p_half.clone().mul(self.scale.clone()).mul(eps);
        let scored = proposal_score(self.model, x.clone(), self.failed)?;
        let p = p_half + scored.grad.clone().mul(self.scale.clone()).mul(half);
        let kinetic = |m: &Tensor<2>| m.clone().powi_scalar(2).sum_dim(1).reshape([k]).mul_scalar(0.5);
        let change = (scored.log_prob.clone() - kinetic(&p)) - (start.lp.clone() - kinetic(&start.p));
        let change = to_vec_f32(&change);
        Ok((Phase { x, lp: scored.log_prob, g: scored.grad, p }, change))
    }

    /// The step-size selector `mu` (module docs, step 1) for every chain of `start`, with base
    /// step `eps0` and brackets `(lower, upper)` in log scale.
    fn select(&self, start: &Phase, eps0: f64, lower: &[f32], upper: &[f32]) -> Result<(Selection, usize), InferError> {
        let n = self.n;
        let device = start.x.device();
        let eps = Tensor::<2>::full([n, 1], eps0, &device);
        let (mut end, change) = self.leapfrog(start, eps)?;
        let mut evals = n;
        let mut exponent = vec![0i32; n];
        let mut at = change.clone();
        // +1 doubling, -1 halving, 0 settled.
        let mut direction: Vec<i32> = (0..n)
            .map(|c| {
                let l = change[c];
                if !l.is_finite() || l < lower[c] {
                    -1
                } else if l > upper[c] {
                    1
                } else {
                    0
                }
            })
            .collect();
        for round in 1..=MAX_HALVINGS {
            let active: Vec<usize> = (0..n).filter(|&c| direction[c] != 0).collect();
            if active.is_empty() {
                break;
            }
            let idx = Tensor::<1, Int>::from_data(
                TensorData::new(active.iter().map(|&c| c as i64).collect::<Vec<_>>(), [active.len()]),
                &device,
            );
            let steps: Vec<f32> = active.iter().map(|&c| (eps0 * 2f64.powi(direction[c] * round)) as f32).collect();
            let eps = Tensor::<2>::from_data(TensorData::new(steps, [active.len(), 1]), &device);
            let (tried, change) = self.leapfrog(&start.select(&idx), eps)?;
            evals += active.len();
            let mut take = vec![false; n];
            for (i, &c) in active.iter().enumerate() {
                let l = change[i];
                if direction[c] < 0 {
                    // The first halving whose change is above the lower bracket; the cap
                    // settles too (its proposal will almost surely be rejected).
                    take[c] = true;
                    exponent[c] = -round;
                    at[c] = l;
                    if l > lower[c] || round == MAX_HALVINGS {
                        direction[c] = 0;
                    }
                } else if !l.is_finite() || l < upper[c] {
                    // Doubling stopped paying: keep the previous, still "too easy" step.
                    direction[c] = 0;
                } else {
                    take[c] = true;
                    exponent[c] = round;
                    at[c] = l;
                    if round == MAX_DOUBLINGS {
                        direction[c] = 0;
                    }
                }
            }
            if take.iter().any(|&t| t) {
                end = end.with_rows(&tried, &idx, &take);
            }
        }
        Ok((Selection { exponent, end, change: at }, evals))
    }

    /// One autoMALA iteration of every chain from `state` with base step `eps0`.
    pub(crate) fn step(&mut self, state: MalaState, eps0: f64) -> Result<(MalaState, AutoMalaStep), InferError> {
        let (n, d) = (self.n, self.d);
        let (x, lp, g) = state;
        let device = x.device();
        let p = self.rng.normal_tensor(n, d, &device);
        let (mut lower, mut upper) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for _ in 0..n {
            let (a, b) = (self.rng.uniform().max(f64::MIN_POSITIVE), self.rng.uniform().max(f64::MIN_POSITIVE));
            lower.push(a.min(b).ln() as f32);
            upper.push(a.max(b).ln() as f32);
        }
        let start = Phase { x, lp, g, p };
        let (forward, evals_forward) = self.select(&start, eps0, &lower, &upper)?;
        let mut back = forward.end.clone();
        back.p = back.p.neg();
        let (reverse, evals_reverse) = self.select(&back, eps0, &lower, &upper)?;
        let mut probability_sum = 0.0;
        let accept: Vec<bool> = (0..n)
            .map(|c| {
                let l = forward.change[c];
                let reversible = forward.exponent[c] == reverse.exponent[c] && l.is_finite();
                if reversible {
                    probability_sum += f64::from(l.min(0.0)).exp();
                }
                reversible && self.rng.uniform().max(f64::MIN_POSITIVE).ln() < f64::from(l)
            })
            .collect();
        let mask1 = Tensor::<1, Bool>::from_data(TensorData::new(accept, [n]), &device);
        let mask2 = mask1.clone().reshape([n, 1]).repeat_dim(1, d);
        let end = forward.end;
        let next = (
            start.x.mask_where(mask2.clone(), end.x),
            start.lp.mask_where(mask1, end.lp),
            start.g.mask_where(mask2, end.g),
        );
        let mean_exponent = forward.exponent.iter().map(|&j| f64::from(j)).sum::<f64>() / n as f64;
        Ok((
            next,
            AutoMalaStep {
                acceptance: probability_sum / n as f64,
                mean_exponent,
                evals: evals_forward + evals_reverse,
            },
        ))
    }

    /// `steps` iterations from `state` while the base step follows the chains' selections (its
    /// log moves by half the mean selected exponent times `ln 2` each iteration, so the base
    /// settles where selections neither halve nor double on average, as Pigeons' round-wise
    /// update), and the diagonal scale is re-estimated twice from the chains' draws, as Stan's
    /// windowed adaptation of a diagonal metric: after the first and the second quarter, the
    /// pooled variance of that window's draws (regularised towards 1e-3 by 5 pseudo-draws, as
    /// Stan). The scale the chains started with comes from the particles, which a funnel's
    /// particles can give wrong by orders of magnitude (all in its neck), and a base step cannot
    /// mend a wrong ratio between coordinates. Returns the state, the base step reached and the
    /// scores spent.
    pub(crate) fn adapt(
        &mut self,
        state: MalaState,
        eps0: f64,
        steps: usize,
    ) -> Result<(MalaState, f64, usize), InferError> {
        let (mut log_eps, mut state, mut evals) = (eps0.ln(), state, 0);
        let window = steps / 4;
        let (mut sum, mut sum_sq, mut count) = (None::<Tensor<2>>, None::<Tensor<2>>, 0usize);
        let mut ticker = crate::core::progress::Ticker::new("autoMALA warm-up");
        for step in 0..steps {
            ticker.tick(|| format!("step {step} of {steps}"));
            let (next, report) = self.step(state, log_eps.exp())?;
            state = next;
            evals += report.evals;
            log_eps += 0.5 * report.mean_exponent * std::f64::consts::LN_2;
            if window >= 2 && step < 2 * window {
                let x = state.0.clone();
                sum = Some(sum.map_or(x.clone(), |s| s + x.clone()));
                sum_sq = Some(sum_sq.map_or(x.clone().powi_scalar(2), |s| s + x.powi_scalar(2)));
                count += 1;
                if count == window {
                    let draws = (count * self.n) as f64;
                    let mean = sum.take().unwrap().sum_dim(0).div_scalar(draws);
                    let second = sum_sq.take().unwrap().sum_dim(0).div_scalar(draws);
                    let var = (second - mean.powi_scalar(2)).clamp_min(0.0).mul_scalar(draws / (draws - 1.0));
                    let regularised = var.mul_scalar(draws / (draws + 5.0)).add_scalar(1e-3 * 5.0 / (draws + 5.0));
                    // The step was tuned to the old scale: carry its overall size across.
                    let old = to_vec_f32(&self.scale);
                    let new_scale = regularised.sqrt();
                    let new = to_vec_f32(&new_scale);
                    let ratio = old.iter().zip(&new).map(|(o, n)| f64::from(*o / *n).ln()).sum::<f64>() / self.d as f64;
                    if ratio.is_finite() {
                        log_eps += ratio;
                        self.scale = new_scale;
                    }
                    count = 0;
                }
            }
        }
        Ok((state, log_eps.exp(), evals))
    }
}
