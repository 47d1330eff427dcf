//! MALA, batched over chains: the Metropolis-adjusted Langevin transition with a diagonal
//! scale (Roberts & Tweedie 1996; the step adapted towards acceptance 0.574, Roberts & Rosenthal
//! 1998), and the scoring every sampler of this module shares, where a failed evaluation is a
//! rejected proposal (as Stan rejects one) counted with the model's own cause.

use std::cell::{Cell, RefCell};

use burn::tensor::{Bool, Tensor, TensorData};
use parvi_model::tensor_ops::{all_finite, to_vec_f32};
use parvi_model::{LogDensity, RowScore, Score};

use crate::evaluation::{MIN_STEP_RATIO, TARGET_ACCEPTANCE};
use crate::{EngineRng, InferError};

/// Proposals rejected because their evaluation failed, over every chain of a batched sampler:
/// how many, and the first one's cause. A failed evaluation is a NaN or `+inf` log density, a
/// gradient that is not finite where the density is, or a call the model could not evaluate at
/// all (an ODE solve that failed at every row); Stan rejects such a proposal and the chain
/// stays where it is. A log density of `-inf` (a point outside the support) is an ordinary
/// rejection, not a failure.
#[derive(Debug, Default)]
pub(crate) struct FailureTally {
    count: Cell<usize>,
    first: RefCell<Option<String>>,
}

impl FailureTally {
    fn add(&self, rows: usize, cause: impl FnOnce() -> String) {
        self.count.set(self.count.get() + rows);
        let mut first = self.first.borrow_mut();
        if first.is_none() {
            *first = Some(cause());
        }
    }

    /// Proposals rejected so far.
    pub(crate) fn count(&self) -> usize {
        self.count.get()
    }

    /// The first one's cause.
    pub(crate) fn first(&self) -> Option<String> {
        self.first.borrow().clone()
    }
}

/// The score at the chains' proposals `y` `[n, d]` for a batched Metropolis step: every row whose
/// evaluation failed ([`FailureTally`]) gets a NaN log density, which each sampler's test rejects
/// (NaN compares false; an energy that is not finite is a divergence), and is counted in
/// `failed`; a row the model could not evaluate is NaN, not an error, and never another chain's
/// ([`parvi_model::score_rows`]). When every value is finite this costs two host reads of a
/// scalar.
pub(crate) fn proposal_score(model: &dyn LogDensity, y: Tensor<2>, failed: &FailureTally) -> Result<Score, InferError> {
    let RowScore { score, failure, .. } = parvi_model::score_rows(model, y, None)?;
    let n = score.log_prob.dims()[0];
    if failure.is_none() && all_finite(&score.log_prob) && all_finite(&score.grad) {
        return Ok(score);
    }
    // Something is not finite: which rows failed, on the host (rare).
    let lp = to_vec_f32(&score.log_prob);
    let grad_finite = score.grad.clone().is_finite().all_dim(1).reshape([n]);
    let grad_finite = grad_finite.into_data().convert::<bool>().try_into_vec::<bool>().unwrap_or_default();
    let bad: Vec<bool> = (0..n)
        .map(|i| {
            lp[i].is_nan()
                || lp[i] == f32::INFINITY
                || (lp[i] > f32::NEG_INFINITY && !grad_finite.get(i).copied().unwrap_or(false))
        })
        .collect();
    let count = bad.iter().filter(|&&b| b).count();
    if count == 0 {
        return Ok(score);
    }
    failed.add(count, || {
        if let Some(cause) = failure {
            return cause;
        }
        let i = bad.iter().position(|&b| b).unwrap_or(0);
        if lp[i].is_finite() {
            format!("the gradient is not finite (log density {})", lp[i])
        } else {
            format!("the log density is {}", lp[i])
        }
    });
    let mask = Tensor::<1, Bool>::from_data(TensorData::new(bad, [n]), &score.log_prob.device());
    Ok(Score { log_prob: score.log_prob.mask_fill(mask, f32::NAN), grad: score.grad })
}

/// The score at the chains' starting points: a call the model could not evaluate is an error
/// that names the model's cause (no chain could start); rows whose density is not finite start
/// chains that reject every proposal, which their R-hat shows.
pub(crate) fn start_score(model: &dyn LogDensity, start: Tensor<2>) -> Result<Score, InferError> {
    let RowScore { score, failed, failure } = parvi_model::score_rows(model, start, None)?;
    match failure {
        Some(cause) if failed.iter().all(|&f| f) => Err(InferError::Numerical(format!(
            "the model could not be evaluated at any chain's starting point: {cause}"
        ))),
        _ => Ok(score),
    }
}

/// A MALA state of every chain: positions `[n, d]`, log densities `[n]`, scores `[n, d]`.
pub(crate) type MalaState = (Tensor<2>, Tensor<1>, Tensor<2>);

/// The batched MALA transition with a diagonal scale.
pub(crate) struct Mala<'a, 'r> {
    pub(crate) model: &'a dyn LogDensity,
    /// `[1, d]` coordinate sds.
    pub(crate) scale: Tensor<2>,
    pub(crate) rng: &'r mut EngineRng,
    pub(crate) n: usize,
    pub(crate) d: usize,
    /// Where the proposals rejected for a failed evaluation are counted.
    pub(crate) failed: &'a FailureTally,
}

impl Mala<'_, '_> {
    /// `steps` steps of every chain from `state` while a Robbins-Monro walk of `log h` (from
    /// `h0`, by the chains' mean acceptance minus [`TARGET_ACCEPTANCE`]) adapts the step size,
    /// kept between `h0` times [`MIN_STEP_RATIO`] and 100: the chains' state and the step reached.
    pub(crate) fn adapt(&mut self, state: MalaState, h0: f64, steps: usize) -> Result<(MalaState, f64), InferError> {
        let (mut log_h, floor, ceiling) = (h0.ln(), (h0 * MIN_STEP_RATIO).ln(), (h0 * 100.0).ln());
        let mut state = state;
        let mut ticker = crate::core::progress::Ticker::new("MALA step-size adaptation");
        for step in 0..steps {
            ticker.tick(|| format!("step {step} of {steps}"));
            let (next, acceptance) = self.step(state, log_h.exp())?;
            state = next;
            log_h = (log_h + (acceptance - TARGET_ACCEPTANCE)).clamp(floor, ceiling);
        }
        Ok((state, log_h.exp()))
    }

    /// One step of every chain at step size `h`: the new state and the mean acceptance
    /// probability (a non-finite proposal counts as rejected).
    pub(crate) fn step(&mut self, state: MalaState, h: f64) -> Result<(MalaState, f64), InferError> {
        let (next, probability) = self.step_each(state, h)?;
        Ok((next, f64::from(probability.mean().into_scalar::<f32>())))
    }

    /// [`Self::step`] with each chain's acceptance probability `[n]`.
    pub(crate) fn step_each(
        &mut self,
        (x, lp_x, g_x): MalaState,
        h: f64,
    ) -> Result<(MalaState, Tensor<1>), InferError> {
        let (n, d) = (self.n, self.d);
        let device = x.device();
        let s2 = self.scale.clone().powi_scalar(2);
        let xi = self.rng.normal_tensor(n, d, &device);
        let mean_x = x.clone() + g_x.clone().mul(s2.clone()).mul_scalar(h / 2.0);
        let y = mean_x.clone() + xi.clone().mul(self.scale.clone()).mul_scalar(h.sqrt());
        let proposal = proposal_score(self.model, y.clone(), self.failed)?;
        let (lp_y, g_y) = (proposal.log_prob, proposal.grad);
        // log q(a | b) = -|(a - b - h/2 S^2 g(b)) / S|^2 / (2h), up to a constant.
        let forward = xi.powi_scalar(2).sum_dim(1).reshape([n]).mul_scalar(-0.5);
        let back_mean = y.clone() + g_y.clone().mul(s2).mul_scalar(h / 2.0);
        let backward =
            (x.clone() - back_mean).div(self.scale.clone()).powi_scalar(2).sum_dim(1).reshape([n]).mul_scalar(-0.5 / h);
        let log_alpha = lp_y.clone() - lp_x.clone() + backward - forward;
        let uniforms: Vec<f32> = (0..n).map(|_| self.rng.uniform().max(f64::MIN_POSITIVE).ln() as f32).collect();
        let log_u = Tensor::<1>::from_data(TensorData::new(uniforms, [n]), &device);
        // NaN compares false: a non-finite proposal, or one whose evaluation failed, is rejected.
        let accept = log_u.lower(log_alpha.clone());
        let probability = log_alpha.clamp_max(0.0).exp();
        let probability = probability.clone().mask_fill(probability.is_nan(), 0.0);
        let rows = accept.clone().reshape([n, 1]).repeat_dim(1, d);
        let x = x.mask_where(rows.clone(), y);
        let g = g_x.mask_where(rows, g_y);
        let lp = lp_x.mask_where(accept, lp_y);
        Ok(((x, lp, g), probability))
    }
}
