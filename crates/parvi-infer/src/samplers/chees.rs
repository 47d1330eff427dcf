//! ChEES-HMC (Hoffman, Radul & Sountsov 2021, "An Adaptive-MCMC Scheme for Setting Trajectory
//! Lengths in Hamiltonian Monte Carlo", AISTATS): many HMC chains in lockstep with one shared,
//! jittered trajectory, whose length is adapted across the chains. The polish step's kernel where
//! one MALA step per gradient mixes slowly (a time series, a hierarchical scale), see
//! [`super::polish`].
//!
//! Every chain runs the same number of leapfrog steps per iteration, so each leapfrog step is one
//! batched `[chains, dim]` score of the model. In the metric's coordinates `u = L^-1 x` (`L L^T`
//! the chains' covariance, or its diagonal) the momentum is `N(0, I)`, and the leapfrog reads, in
//! the chains' own coordinates `x` (row vectors), `p += eps/2 g L`, `x += eps p L^T`, `p += eps/2
//! g' L`: no inverse on the gradient path.
//!
//! Adaptation (the warm-up only; then every setting is fixed and each iteration is an exact,
//! reversible HMC transition):
//! - the trajectory length `T` maximises the ChEES criterion (eq. 4 of the paper: the change of
//!   the centred second moment, `E[(|u' - E u'|^2 - |u - E u|^2)^2] / 4`) per leapfrog step,
//!   `ChEES / T`, where the paper maximises ChEES itself: the polish step pays per gradient and
//!   its R-hat needs a number of iterations whatever their length (docs/posteriordb.md at 8a480ca, "ChEES
//!   per gradient"). ChEES's gradient in `log T` per chain is (eq. 7) `t (|u' - m'|^2 - |u -
//!   m|^2) (u' - m') . p'`, `t` the jittered length, `m, m'` the chains' means; that of
//!   `log(ChEES / T)` is `G / ChEES - 1`, `G` its acceptance-weighted average over the chains
//!   (eq. 8), so the step follows the sign of `G - ChEES`; `log T` follows Adam with `beta_1 =
//!   0` (their Alg. 1; rate 0.025, the squared-gradient average at 0.95 and the update clipped
//!   to 0.35 as TensorFlow Probability's reference implementation), and the kept `T` is its
//!   iterate average with weights `k^-1/2`;
//! - the jitter: iteration `i` runs `ceil(h_i T / eps)` leapfrog steps, `h_i` the base-2 Halton
//!   (van der Corput) sequence, which spreads the lengths more evenly than uniform draws (Sec.
//!   3.2) and keeps `T` from a resonance with the target's periods;
//! - the step size `eps` by dual averaging (Hoffman & Gelman 2014, eq. 6: `gamma` 0.05, `t0` 10,
//!   `kappa` 0.75) of the harmonic mean of the chains' acceptance probabilities towards 0.651
//!   (Sec. 3.3: the harmonic mean keeps the worst chains from being left behind; 0.651 is
//!   Beskos et al.'s optimal HMC acceptance);
//! - the metric from the chains' own draws (Stan's windowed adaptation: after the first and the
//!   second quarter of the warm-up, the pooled covariance of that window's draws, regularised
//!   towards `1e-3 I` by 5 pseudo-draws), dense up to [`DENSE_MAX_DIM`] dimensions, else its
//!   diagonal; the step size's averaging restarts after each.

use burn::tensor::{Bool, Tensor, TensorData};
use parvi_model::LogDensity;
use parvi_model::tensor_ops::to_vec_f32;

use crate::samplers::mala::{FailureTally, MalaState, proposal_score};
use crate::{EngineRng, InferError};

/// The harmonic-mean acceptance probability the step size adapts to (Hoffman et al. 2021, Sec.
/// 3.3, after Beskos, Pillai, Roberts, Sanz-Serna & Stuart 2013).
pub const CHEES_TARGET_ACCEPTANCE: f64 = 0.651;
/// At most this many leapfrog steps per iteration (BlackJAX's and TFP's cap).
pub const MAX_LEAPFROG: usize = 1000;
/// Up to this dimension the metric is the chains' dense covariance (an `[n, d] x [d, d]` product
/// per leapfrog step, small beside a score there); above it, its diagonal.
pub const DENSE_MAX_DIM: usize = 100;
/// An energy error above this many nats is a divergence: the chain stops where it was and its
/// proposal is rejected (Stan's and BlackJAX's threshold).
const DIVERGENCE: f32 = 1000.0;
/// Adam's learning rate on `log T`.
const LEARNING_RATE: f64 = 0.025;
/// Weight of the newest squared gradient in Adam's second-moment average (`1 - beta_2`).
const SQ_GRAD_RATE: f64 = 0.05;
/// Largest change of `log T` per iteration (about `ln 2 / 2`).
const LOG_UPDATE_CLIP: f64 = 0.35;
/// Chains whose acceptance probability is below this add nothing to the criterion's gradient
/// (their proposal says nothing about where the trajectory went).
const MIN_WEIGHT: f64 = 1e-4;

/// The `(i + 1)`-th element of the base-2 Halton (van der Corput) sequence, in `(0, 1)`: the bits
/// of `i + 1` mirrored behind the binary point (0.5, 0.25, 0.75, 0.125, ...).
pub fn halton(i: u64) -> f64 {
    let (mut k, mut weight, mut h) = (i + 1, 0.5, 0.0);
    while k > 0 {
        if k & 1 == 1 {
            h += weight;
        }
        k >>= 1;
        weight *= 0.5;
    }
    h
}

/// Nesterov's dual averaging of `log eps` as NUTS adapts its step (Hoffman & Gelman 2014, Alg. 5,
/// eq. 6).
#[derive(Clone, Debug)]
struct DualAveraging {
    mu: f64,
    h_bar: f64,
    log_x: f64,
    log_x_bar: f64,
    t: f64,
}

impl DualAveraging {
    /// Starts at `x0`, shrinking towards `mu = log(10 x0)` (a bias to larger steps, which the
    /// acceptance corrects within a few iterations).
    fn new(x0: f64) -> Self {
        Self { mu: (10.0 * x0).ln(), h_bar: 0.0, log_x: x0.ln(), log_x_bar: x0.ln(), t: 0.0 }
    }

    /// One update with `error = target - statistic` (positive: the step is too large).
    fn update(&mut self, error: f64) {
        const GAMMA: f64 = 0.05;
        const T0: f64 = 10.0;
        const KAPPA: f64 = 0.75;
        self.t += 1.0;
        let eta = 1.0 / (self.t + T0);
        self.h_bar = (1.0 - eta) * self.h_bar + eta * error;
        self.log_x = self.mu - self.t.sqrt() / GAMMA * self.h_bar;
        let w = self.t.powf(-KAPPA);
        self.log_x_bar = w * self.log_x + (1.0 - w) * self.log_x_bar;
    }
}

/// Adam with `beta_1 = 0` on `log T` (Hoffman et al. 2021, Alg. 1), with the iterate average.
#[derive(Clone, Debug)]
struct TrajectoryAdam {
    log_t: f64,
    sq_grad: f64,
    updates: i32,
    log_t_bar: f64,
    averaged: f64,
}

impl TrajectoryAdam {
    fn new(t0: f64) -> Self {
        Self { log_t: t0.ln(), sq_grad: 0.0, updates: 0, log_t_bar: t0.ln(), averaged: 0.0 }
    }

    /// One ascent step along `gradient` (of the criterion in `log T`), `T` kept in `[lo, hi]`.
    fn update(&mut self, gradient: f64, lo: f64, hi: f64) {
        if !gradient.is_finite() {
            return;
        }
        self.updates += 1;
        self.sq_grad = (1.0 - SQ_GRAD_RATE) * self.sq_grad + SQ_GRAD_RATE * gradient * gradient;
        let corrected = self.sq_grad / (1.0 - (1.0 - SQ_GRAD_RATE).powi(self.updates));
        let step = (LEARNING_RATE * gradient / (corrected + 1e-20).sqrt()).clamp(-LOG_UPDATE_CLIP, LOG_UPDATE_CLIP);
        self.log_t = (self.log_t + step).clamp(lo.ln(), hi.ln());
        self.averaged += 1.0;
        let w = self.averaged.powf(-0.5);
        self.log_t_bar = w * self.log_t + (1.0 - w) * self.log_t_bar;
    }

    /// Restarts the iterate average (after the metric changed, the old lengths measured another
    /// geometry).
    fn restart_average(&mut self) {
        self.averaged = 0.0;
        self.log_t_bar = self.log_t;
    }
}

/// The mean and covariance (row-major `d x d`) of row-major draws `[m, d]`, `m >= 2`, the
/// covariance regularised as Stan's metric: `m/(m+5) S + 5/(m+5) 1e-3 I`.
pub(crate) fn regularised_covariance(draws: &[f32], d: usize) -> (Vec<f64>, Vec<f64>) {
    let m = draws.len() / d;
    let mut mean = vec![0.0f64; d];
    for row in draws.chunks(d) {
        for (a, v) in mean.iter_mut().zip(row) {
            *a += f64::from(*v);
        }
    }
    mean.iter_mut().for_each(|a| *a /= m as f64);
    let (shrink, floor) = (m as f64 / (m as f64 + 5.0), 1e-3 * 5.0 / (m as f64 + 5.0));
    let mut cov = vec![0.0f64; d * d];
    let mut centred = vec![0.0f64; d];
    for row in draws.chunks(d) {
        for ((c, v), mu) in centred.iter_mut().zip(row).zip(&mean) {
            *c = f64::from(*v) - mu;
        }
        for i in 0..d {
            for j in 0..=i {
                cov[i * d + j] += centred[i] * centred[j];
            }
        }
    }
    for i in 0..d {
        for j in 0..=i {
            let v = shrink * cov[i * d + j] / (m as f64 - 1.0) + if i == j { floor } else { 0.0 };
            cov[i * d + j] = v;
            cov[j * d + i] = v;
        }
    }
    (mean, cov)
}

/// The metric `L L^T` (the momentum is `N(0, I)` in `u = L^-1 x`).
// One metric a polish run, held by value: the dense variant's size costs nothing there.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub(crate) enum Metric {
    /// `L = diag(sd)`, `sd` `[1, d]`.
    Diagonal { sd: Tensor<2> },
    /// `L` lower triangular: `L^T` and `L^-T` `[d, d]`, and the marginal sds `[1, d]`.
    Dense { factor: Tensor<2>, factor_t: Tensor<2>, inverse_t: Tensor<2>, sd: Tensor<2> },
}

/// A linear map of rows: elementwise by a `[1, d]` row, or a product with a `[d, d]` matrix.
enum RowMap {
    Scale(Tensor<2>),
    Product(Tensor<2>),
}

impl RowMap {
    fn apply(&self, v: Tensor<2>) -> Tensor<2> {
        match self {
            Self::Scale(s) => v.mul(s.clone()),
            Self::Product(m) => v.matmul(m.clone()),
        }
    }
}

/// A trajectory's two leapfrog maps with its step `eps` folded in, once a transition (one
/// operation a map a leapfrog step instead of two): the half kick `g -> (eps / 2) g L` and the
/// drift `p -> eps p L^T`.
struct LeapfrogMaps {
    half_kick: RowMap,
    drift: RowMap,
}

impl Metric {
    fn leapfrog_maps(&self, eps: f64) -> LeapfrogMaps {
        match self {
            Self::Diagonal { sd } => LeapfrogMaps {
                half_kick: RowMap::Scale(sd.clone().mul_scalar(eps / 2.0)),
                drift: RowMap::Scale(sd.clone().mul_scalar(eps)),
            },
            Self::Dense { factor, factor_t, .. } => LeapfrogMaps {
                half_kick: RowMap::Product(factor.clone().mul_scalar(eps / 2.0)),
                drift: RowMap::Product(factor_t.clone().mul_scalar(eps)),
            },
        }
    }

    /// `x` in the metric's coordinates: `x L^-T`.
    fn whiten(&self, x: Tensor<2>) -> Tensor<2> {
        match self {
            Self::Diagonal { sd } => x.div(sd.clone()),
            Self::Dense { inverse_t, .. } => x.matmul(inverse_t.clone()),
        }
    }

    /// The marginal sds `[1, d]` (autoMALA's diagonal scale when it takes over).
    pub(crate) fn sd(&self) -> Tensor<2> {
        match self {
            Self::Diagonal { sd } | Self::Dense { sd, .. } => sd.clone(),
        }
    }

    /// Whether the metric is dense.
    pub(crate) fn is_dense(&self) -> bool {
        matches!(self, Self::Dense { .. })
    }

    /// The metric of `draws` (row-major `[m, d]`, pooled over chains): their covariance (dense
    /// where `dense`, else its diagonal) regularised as Stan's, `m/(m+5) S + 5/(m+5) 1e-3 I`.
    /// `None` when it is not finite or not positive definite (the old metric is kept).
    fn estimate(draws: &[f32], d: usize, dense: bool, device: &burn::tensor::Device) -> Option<Self> {
        let m = draws.len() / d;
        if m < 2 {
            return None;
        }
        let mut mean = vec![0.0f64; d];
        for row in draws.chunks(d) {
            for (a, v) in mean.iter_mut().zip(row) {
                *a += f64::from(*v);
            }
        }
        mean.iter_mut().for_each(|a| *a /= m as f64);
        let (shrink, floor) = (m as f64 / (m as f64 + 5.0), 1e-3 * 5.0 / (m as f64 + 5.0));
        let host = |v: Vec<f64>, rows: usize, cols: usize| {
            Tensor::<2>::from_data(
                TensorData::new(v.iter().map(|&x| x as f32).collect::<Vec<_>>(), [rows, cols]),
                device,
            )
        };
        if !dense {
            let mut var = vec![0.0f64; d];
            for row in draws.chunks(d) {
                for ((s, v), mu) in var.iter_mut().zip(row).zip(&mean) {
                    *s += (f64::from(*v) - mu).powi(2);
                }
            }
            let sd: Vec<f64> = var.iter().map(|s| (shrink * s / (m as f64 - 1.0) + floor).sqrt()).collect();
            return sd.iter().all(|s| s.is_finite() && *s > 0.0).then(|| Self::Diagonal { sd: host(sd, 1, d) });
        }
        let (_, cov) = regularised_covariance(draws, d);
        let l = parvi_model::linalg::host::Cholesky::factor(&cov, d, 0.0).ok()?;
        let l = l.lower().to_vec();
        // L^-1 by forward substitution, column by column of the identity.
        let mut inv = vec![0.0f64; d * d];
        for c in 0..d {
            for i in c..d {
                let e = if i == c { 1.0 } else { 0.0 };
                let dot: f64 = (c..i).map(|k| l[i * d + k] * inv[k * d + c]).sum();
                inv[i * d + c] = (e - dot) / l[i * d + i];
            }
        }
        if !inv.iter().chain(&l).all(|v| v.is_finite()) {
            return None;
        }
        let transpose = |a: &[f64]| (0..d * d).map(|k| a[(k % d) * d + k / d]).collect::<Vec<f64>>();
        let sd: Vec<f64> = (0..d).map(|i| cov[i * d + i].sqrt()).collect();
        Some(Self::Dense {
            factor: host(l.clone(), d, d),
            factor_t: host(transpose(&l), d, d),
            inverse_t: host(transpose(&inv), d, d),
            sd: host(sd, 1, d),
        })
    }
}

/// What one iteration did, per chain.
pub(crate) struct Transition {
    /// Metropolis acceptance probability of each chain's proposal (0 for a divergent one).
    pub(crate) accept: Vec<f64>,
    /// Whether each chain's trajectory diverged.
    pub(crate) divergent: Vec<bool>,
    /// The gradient in `log T` of this iteration's ChEES per leapfrog step (eq. 8's average of
    /// eq. 7, less ChEES itself; module docs), from the chains' starts,
    /// proposals and final momenta; NaN where no chain carries weight.
    pub(crate) criterion_gradient: f64,
}

/// The batched ChEES-HMC transition (module docs).
pub(crate) struct Chees<'a, 'r> {
    pub(crate) model: &'a dyn LogDensity,
    pub(crate) metric: Metric,
    pub(crate) rng: &'r mut EngineRng,
    pub(crate) n: usize,
    pub(crate) d: usize,
    /// Where the proposals rejected for a failed evaluation are counted.
    pub(crate) failed: &'a FailureTally,
}

/// The adapted settings and what the warm-up cost.
pub(crate) struct Tuned {
    /// The step size (in the metric's units).
    pub(crate) step_size: f64,
    /// The trajectory length (in the metric's units).
    pub(crate) trajectory: f64,
    /// Leapfrog steps per chain spent.
    pub(crate) leapfrogs: usize,
    /// Share of the chains whose mean acceptance over the warm-up's second half was below
    /// `stuck` (NaN where that half is empty).
    pub(crate) stuck_share: f64,
}

impl Chees<'_, '_> {
    /// One iteration of every chain from `state`: `steps` leapfrog steps of size `eps`, the
    /// Metropolis correction, and the criterion's gradient at trajectory length `jittered`
    /// (`h_i T`) when `gradient` is asked for.
    pub(crate) fn transition(
        &mut self,
        state: MalaState,
        eps: f64,
        steps: usize,
        jittered: f64,
        gradient: bool,
    ) -> Result<(MalaState, Transition), InferError> {
        let (n, d) = (self.n, self.d);
        let (x0, lp0, g0) = state;
        let device = x0.device();
        let p0 = self.rng.normal_tensor(n, d, &device);
        // The energy `log p - |p|^2 / 2` on the host, in f32 as the tensors hold it: two reads
        // instead of four more operations a leapfrog step.
        let energy = |lp: &Tensor<1>, p: &Tensor<2>| -> Vec<f32> {
            let squares = to_vec_f32(&(p.clone() * p.clone()).sum_dim(1));
            to_vec_f32(lp).iter().zip(&squares).map(|(l, s)| l - 0.5 * s).collect()
        };
        let maps = self.metric.leapfrog_maps(eps);
        let h0 = energy(&lp0, &p0);
        let (mut x, mut lp, mut g, mut p) = (x0.clone(), lp0.clone(), g0.clone(), p0);
        let mut h = h0.clone();
        let mut dead = vec![false; n];
        for _ in 0..steps {
            let p_half = p.clone() + maps.half_kick.apply(g.clone());
            let mut x_new = x.clone() + maps.drift.apply(p_half.clone());
            if dead.iter().any(|&b| b) {
                // A diverged chain's row is its last good point (its result is dropped below): the
                // proposal that failed is not evaluated, nor counted, again.
                let mask2 = Tensor::<1, Bool>::from_data(TensorData::new(dead.clone(), [n]), &device)
                    .reshape([n, 1])
                    .repeat_dim(1, d);
                x_new = x_new.mask_where(mask2, x.clone());
            }
            let scored = proposal_score(self.model, x_new.clone(), self.failed)?;
            let p_new = p_half + maps.half_kick.apply(scored.grad.clone());
            let h_new = energy(&scored.log_prob, &p_new);
            // A chain whose energy error passes the threshold (or is not finite: its evaluation
            // failed, `proposal_score` made its log density NaN) has diverged:
            // it stays where it was for the rest of the trajectory (so no non-finite position
            // reaches the model again) and its proposal is rejected.
            let newly: Vec<bool> =
                (0..n).map(|c| !dead[c] && (!h_new[c].is_finite() || h0[c] - h_new[c] > DIVERGENCE)).collect();
            if newly.iter().any(|&b| b) {
                for (dc, nc) in dead.iter_mut().zip(&newly) {
                    *dc |= *nc;
                }
            }
            if dead.iter().any(|&b| b) {
                let mask1 = Tensor::<1, Bool>::from_data(TensorData::new(dead.clone(), [n]), &device);
                let mask2 = mask1.clone().reshape([n, 1]).repeat_dim(1, d);
                x = x_new.mask_where(mask2.clone(), x);
                g = scored.grad.mask_where(mask2.clone(), g);
                p = p_new.mask_where(mask2, p);
                lp = scored.log_prob.mask_where(mask1, lp);
                for ((hc, new), gone) in h.iter_mut().zip(&h_new).zip(&dead) {
                    if !gone {
                        *hc = *new;
                    }
                }
            } else {
                (x, g, p, lp, h) = (x_new, scored.grad, p_new, scored.log_prob, h_new);
            }
        }
        let accept: Vec<f64> = (0..n)
            .map(|c| if dead[c] { 0.0 } else { f64::from(h[c] - h0[c]).min(0.0).exp() })
            .map(|a| if a.is_finite() { a } else { 0.0 })
            .collect();
        let take: Vec<bool> = accept.iter().map(|&a| self.rng.uniform() < a).collect();
        let criterion_gradient =
            if gradient { self.criterion_gradient(&x0, &x, &p, &accept, &dead, jittered) } else { f64::NAN };
        let mask1 = Tensor::<1, Bool>::from_data(TensorData::new(take, [n]), &device);
        let mask2 = mask1.clone().reshape([n, 1]).repeat_dim(1, d);
        let next = (x0.mask_where(mask2.clone(), x), lp0.mask_where(mask1, lp), g0.mask_where(mask2, g));
        Ok((next, Transition { accept, divergent: dead, criterion_gradient }))
    }

    /// The ChEES gradient in `log T` (Hoffman et al. 2021, eqs. 7-8): per chain
    /// `(|u' - m'|^2 - |u - m|^2) (u' - m') . p'`, the criterion's derivative along the
    /// trajectory at its end, times `jittered = h_i T`, the derivative of the jittered length in
    /// `log T`; `m'` the acceptance-weighted mean of the proposals and `m` the mean of the
    /// starts; averaged with the acceptance probabilities as weights, less the same average of
    /// each chain's ChEES `(|u' - m'|^2 - |u - m|^2)^2 / 4`: the sign of `ChEES / T`'s gradient
    /// (module docs). On the host in `f64`: `3 n d` values.
    fn criterion_gradient(
        &self,
        start: &Tensor<2>,
        proposal: &Tensor<2>,
        momentum: &Tensor<2>,
        accept: &[f64],
        divergent: &[bool],
        jittered: f64,
    ) -> f64 {
        let (n, d) = (self.n, self.d);
        let u0 = to_vec_f32(&self.metric.whiten(start.clone()));
        let u1 = to_vec_f32(&self.metric.whiten(proposal.clone()));
        let p1 = to_vec_f32(momentum);
        let weight: Vec<f64> = (0..n)
            .map(|c| {
                let finite = (0..d).all(|j| u1[c * d + j].is_finite() && p1[c * d + j].is_finite());
                if divergent[c] || !finite || accept[c] <= MIN_WEIGHT { 0.0 } else { accept[c] }
            })
            .collect();
        let total: f64 = weight.iter().sum();
        if total <= 0.0 {
            return f64::NAN;
        }
        let (mut m0, mut m1) = (vec![0.0f64; d], vec![0.0f64; d]);
        for c in 0..n {
            for j in 0..d {
                m0[j] += f64::from(u0[c * d + j]) / n as f64;
                m1[j] += weight[c] * f64::from(u1[c * d + j]) / total;
            }
        }
        let (mut gradient, mut chees) = (0.0, 0.0);
        for c in (0..n).filter(|&c| weight[c] > 0.0) {
            let (mut r0, mut r1, mut dot) = (0.0, 0.0, 0.0);
            for j in 0..d {
                let a = f64::from(u0[c * d + j]) - m0[j];
                let b = f64::from(u1[c * d + j]) - m1[j];
                r0 += a * a;
                r1 += b * b;
                dot += b * f64::from(p1[c * d + j]);
            }
            gradient += weight[c] * jittered * (r1 - r0) * dot;
            chees += weight[c] * (r1 - r0) * (r1 - r0) / 4.0;
        }
        // Per leapfrog step: d(ChEES / T)/d log T is (G - ChEES) / T, whose sign (all Adam's
        // normalised step reads) is that of G - ChEES.
        (gradient - chees) / total
    }

    /// The warm-up: `iterations` iterations from `state` at step `eps0` and trajectory length
    /// `t0` adapting both (module docs), the metric re-estimated after the first and the second
    /// quarter (when there are at least 8 iterations). `halton` is the jitter's index, advanced
    /// by one per iteration. Returns the state, the tuned settings and, over the second half,
    /// the share of chains whose mean acceptance is below `stuck`.
    pub(crate) fn warmup(
        &mut self,
        state: MalaState,
        eps0: f64,
        t0: f64,
        iterations: usize,
        halton_index: &mut u64,
        stuck: f64,
    ) -> Result<(MalaState, Tuned), InferError> {
        let (n, d) = (self.n, self.d);
        let device = state.0.device();
        let mut da = DualAveraging::new(eps0);
        let mut eps = eps0;
        let mut adam = TrajectoryAdam::new(t0.max(eps0));
        let window = if iterations >= 8 { iterations / 4 } else { 0 };
        let mut window_draws: Vec<f32> = Vec::new();
        let (mut state, mut leapfrogs) = (state, 0usize);
        let mut accept_sum = vec![0.0f64; n];
        let mut second_half = 0usize;
        let mut ticker = crate::core::progress::Ticker::new("ChEES-HMC warm-up");
        for it in 0..iterations {
            ticker.tick(|| format!("iteration {it} of {iterations}"));
            let trajectory = adam.log_t.exp();
            let jitter = halton(*halton_index);
            *halton_index += 1;
            let steps = leapfrog_steps(*halton_index - 1, trajectory, eps);
            let (next, tr) = self.transition(state, eps, steps, jitter * trajectory, true)?;
            state = next;
            leapfrogs += steps;
            // Harmonic mean over the chains that did not diverge (Sec. 3.3); none: 0.
            let live: Vec<f64> = tr.accept.iter().zip(&tr.divergent).filter(|(_, dv)| !**dv).map(|(a, _)| *a).collect();
            let harmonic = if live.is_empty() {
                0.0
            } else {
                let inv = live.iter().map(|a| 1.0 / a).sum::<f64>() / live.len() as f64;
                if inv.is_finite() { 1.0 / inv } else { 0.0 }
            };
            da.update(CHEES_TARGET_ACCEPTANCE - harmonic);
            if da.log_x.is_finite() {
                eps = da.log_x.exp();
            }
            adam.update(tr.criterion_gradient, eps, MAX_LEAPFROG as f64 * eps);
            if it >= iterations / 2 {
                second_half += 1;
                for (s, a) in accept_sum.iter_mut().zip(&tr.accept) {
                    *s += a;
                }
            }
            if window > 0 && it < 2 * window {
                window_draws.extend(to_vec_f32(&state.0));
                if (it + 1) % window == 0 {
                    let dense = d <= DENSE_MAX_DIM && n * window >= 10 * d;
                    if let Some(metric) = Metric::estimate(&window_draws, d, dense, &device) {
                        // The step and length were tuned in the old metric's units: carry their
                        // size across by the mean log ratio of the marginal sds, then restart the
                        // averages in the new geometry (Stan restarts its dual averaging there).
                        let (old, new) = (to_vec_f32(&self.metric.sd()), to_vec_f32(&metric.sd()));
                        let ratio = old.iter().zip(&new).map(|(o, n)| f64::from(*o / *n).ln()).sum::<f64>() / d as f64;
                        if ratio.is_finite() {
                            eps *= ratio.exp();
                            adam.log_t += ratio;
                            self.metric = metric;
                            da = DualAveraging::new(eps);
                            adam.restart_average();
                        }
                    }
                    window_draws.clear();
                }
            }
        }
        let step_size = if da.t > 0.0 && da.log_x_bar.is_finite() { da.log_x_bar.exp() } else { eps };
        let trajectory = adam.log_t_bar.exp().clamp(step_size, MAX_LEAPFROG as f64 * step_size);
        let stuck_share = if second_half == 0 {
            f64::NAN
        } else {
            accept_sum.iter().filter(|s| **s / (second_half as f64) < stuck).count() as f64 / n as f64
        };
        Ok((state, Tuned { step_size, trajectory, leapfrogs, stuck_share }))
    }
}

/// Leapfrog steps of iteration `i` for trajectory length `trajectory` and step `eps`.
pub(crate) fn leapfrog_steps(i: u64, trajectory: f64, eps: f64) -> usize {
    ((halton(i) * trajectory / eps).ceil() as usize).clamp(1, MAX_LEAPFROG)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halton_is_the_van_der_corput_sequence() {
        let expected = [0.5, 0.25, 0.75, 0.125, 0.625, 0.375, 0.875, 0.0625];
        for (i, e) in expected.iter().enumerate() {
            assert_eq!(halton(i as u64), *e);
        }
    }

    #[test]
    fn dual_averaging_settles_where_the_statistic_meets_its_target() {
        // A statistic that falls with the step, `a(eps) = exp(-eps)`: the target 0.651 is met at
        // eps = -ln 0.651 = 0.429.
        let mut da = DualAveraging::new(1.0);
        for _ in 0..2000 {
            let eps = da.log_x.exp();
            da.update(CHEES_TARGET_ACCEPTANCE - (-eps).exp());
        }
        let eps = da.log_x_bar.exp();
        assert!((eps - 0.429).abs() < 0.01, "{eps}");
    }

    /// The criterion's gradient points to ChEES per leapfrog step's maximum. On a standard
    /// Gaussian the exact flow gives `ChEES(t) = d sin^2(t)`, so with the jitter `t = h T`,
    /// `E ChEES = d (1/2 - sin(2T) / (4T))` and the gradient `E[t dChEES/dt] = d (sin(2T) /
    /// (4T) - cos(2T) / 2)`: `G - ChEES` is `+0.16 d` at `T = 1` and `-0.36 d` at `T = 2`
    /// (ChEES per step peaks near 1.5), where ChEES's own gradient is still `+0.23 d` (ChEES
    /// peaks near 2.25). 64 chains, 400 iterations at a small step (0.1) each.
    #[test]
    fn criterion_gradient_points_to_the_maximum_of_chees_per_step() {
        let device = parvi_model::BackendKind::Flex.device().unwrap();
        let d = 10;
        let mut identity = vec![0.0; d * d];
        for j in 0..d {
            identity[j * d + j] = 1.0;
        }
        let model = parvi_models::Gaussian::new(&vec![0.0; d], &identity, &device).unwrap();
        let (n, eps) = (64, 0.1);
        let mut rng = EngineRng::new(3);
        let mut mean_gradient = |t: f64| {
            let x = rng.normal_tensor(n, d, &device);
            let s = parvi_model::score(&model, x.clone(), None).unwrap();
            let mut state = (x, s.log_prob, s.grad);
            let sd = Tensor::<2>::ones([1, d], &device);
            let failed = FailureTally::default();
            let mut hmc =
                Chees { model: &model, metric: Metric::Diagonal { sd }, rng: &mut rng, n, d, failed: &failed };
            let mut sum = 0.0;
            for i in 0..400u64 {
                let steps = leapfrog_steps(i, t, eps);
                let (next, tr) = hmc.transition(state, eps, steps, halton(i) * t, true).unwrap();
                state = next;
                sum += tr.criterion_gradient;
            }
            sum / 400.0
        };
        let (short, long) = (mean_gradient(1.0), mean_gradient(2.0));
        assert!((0.5..3.0).contains(&short), "T = 1: {short} (expected about +1.6)");
        assert!((-6.0..-1.5).contains(&long), "T = 2: {long} (expected about -3.6)");
    }
}
