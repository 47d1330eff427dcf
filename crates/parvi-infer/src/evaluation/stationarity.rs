//! The stationarity check: does a target-invariant Markov kernel leave the particle set where it
//! is?
//!
//! If the final particles `x_1..x_n` were draws from the target `p`, one chain of
//! Metropolis-adjusted Langevin (MALA, reversible with respect to `p`) started at each particle
//! would leave their distribution unchanged. A particle engine that ended at a biased fixed point
//! (variances shrunk, a tail misplaced) does not pass this: the chains move towards `p` and the
//! set's moments move with them. The check runs all chains at once (one batched forward and
//! backward of the model per step), then compares each coordinate's mean and log sd before and
//! after.
//!
//! ## The threshold
//!
//! Under the null hypothesis `x_i ~ p` independently, `y_i = P^K x_i` with `P` the MALA kernel at
//! a fixed step. For any function `f` (a coordinate, or its squared deviation)
//! `Var(f(y) - f(x)) = 2 Var_p(f) (1 - rho_K)`, and for a reversible `P` and even `K`,
//! `rho_K = <f, P^K f>_p / Var_p(f) = |P^{K/2} f|^2 / Var_p(f) >= 0`. Hence, with `n_eff`
//! independent starting points (Kish's `n^2 / sum_k c_k^2` for counts `c_k` after resampling a
//! weighted set; `n` otherwise),
//!
//! ```text
//! Var(mean(y)_j - mean(x)_j)       <= 2 sigma_j^2 / n_eff       z_mean = dmean_j / (sigma_j sqrt(2 / n_eff))
//! Var(log sd(y)_j - log sd(x)_j)  <~ (kappa_j - 1) / (2 n_eff)   z_sd = dlogsd_j / sqrt((kappa_j - 1) / (2 n_eff))
//! ```
//!
//! (the second by the delta method, `Var(s^2) ~ (kappa - 1) sigma^4 / n` with `kappa` the
//! kurtosis; we use the larger of the two sets' estimates).
//!
//! The same bound holds for `f = log p`, the one function that sees every direction at once:
//! `z_lp = (mean log p(y) - mean log p(x)) / (sigma_lp sqrt(2 / n_eff))`. A set whose spread is
//! wrong in many coordinates by a little each (SVGD's variance collapse: `E log p` is larger
//! by about `d (1 - r^2) / 2` nats for sd ratios `r`), or far too wide in one heavy tail (a
//! moment-matching kernel's pull on a hierarchical scale, which per-coordinate `z` measured in
//! the set's own sds and kurtosis do not see), moves `log p` under MALA by many of its sds.
//!
//! Every `z` has variance at most 1 under the null and is about normal, so over `m = 2 d + 1` of
//! them, Bonferroni gives an overall false alarm rate at most `alpha` with the threshold
//! `z* = Phi^{-1}(1 - alpha / (2 m))` (3.50 for `d = 10`, `alpha = 0.01`). Particle sets that are
//! better than independent draws (SVGD's) only make `Var(mean(x))` smaller, so the bound stays
//! conservative for them.
//!
//! The step size is adapted on a separate set of chains (started at the same points, then
//! discarded), so the chains that are compared run one fixed, reversible kernel.

use std::time::Instant;

use burn::tensor::{Int, Tensor, TensorData};
use parvi_model::tensor_ops::to_vec_f64;
use parvi_model::{LogDensity, ModelError};
use serde::{Deserialize, Serialize};

use crate::samplers::mala::{FailureTally, Mala, start_score};
use crate::{EngineRng, InferError, Particles};

/// MALA's acceptance rate that is optimal for smooth targets in many dimensions (Roberts &
/// Rosenthal 1998): the adaptation aims at it.
pub const TARGET_ACCEPTANCE: f64 = 0.574;
/// Below this mean acceptance the chains hardly move: the check reports itself inconclusive.
pub const MIN_ACCEPTANCE: f64 = 0.1;
/// The smallest step the adaptation may reach, relative to its start `d^{-1/3}` (in units of the
/// set's own coordinate variances): chains taking steps of a hundredth of the spread cannot
/// travel far enough in a few hundred steps to judge anything.
pub(crate) const MIN_STEP_RATIO: f64 = 1e-4;
/// Particles below which the moments are too noisy to compare.
pub const MIN_PARTICLES: usize = 8;

/// How the check runs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct StationarityConfig {
    /// MALA steps in all (per particle): the first quarter adapts the step size on chains that
    /// are then discarded, the rest (rounded down to an even count) are compared.
    pub steps: usize,
    /// Overall false-alarm rate of the test over all coordinates (Bonferroni).
    pub level: f64,
    /// Seed of the resampling, the proposals and the accept draws.
    pub seed: u64,
}

impl Default for StationarityConfig {
    fn default() -> Self {
        Self { steps: 200, level: 0.01, seed: 0 }
    }
}

impl StationarityConfig {
    /// Checks that at least 4 steps are asked for (2 adapting, 2 compared) and that the level is
    /// in `(0, 1)`.
    pub fn validate(&self) -> Result<(), InferError> {
        if self.steps < 4 {
            return Err(InferError::setting(
                "check-steps",
                format!("the stationarity check needs at least 4 MALA steps (0 turns it off), got {}", self.steps),
            ));
        }
        if !(self.level > 0.0 && self.level < 1.0) {
            return Err(InferError::setting("check-level", format!("must be in (0, 1), got {}", self.level)));
        }
        Ok(())
    }

    /// Steps that adapt the step size (a quarter, at least 1).
    pub fn adapt_steps(&self) -> usize {
        (self.steps / 4).max(1)
    }

    /// Steps of the compared chains: the rest, rounded down to an even count (`rho_K >= 0`).
    pub fn fixed_steps(&self) -> usize {
        (self.steps - self.adapt_steps()) / 2 * 2
    }
}

/// What the check found: the coordinate whose moments moved most, by how much, and how the
/// chains ran.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stationarity {
    /// MALA steps per particle, adaptation included.
    pub steps: usize,
    /// The fixed step size `h` of the compared chains, in units of the starting set's coordinate
    /// variances (proposal `y = x + h/2 S^2 grad + sqrt(h) S xi`, `S` the set's sds).
    pub step_size: f64,
    /// Mean acceptance probability of the compared chains.
    pub acceptance: f64,
    /// Kish's effective number of independent starting points (`n` for an unweighted set).
    pub effective_size: f64,
    /// The threshold on `|z|` (Bonferroni over `2 d` statistics at `level`).
    pub threshold: f64,
    /// The overall level the threshold was set for.
    pub level: f64,
    /// The coordinate with the largest `|z|` (of its mean or its log sd), as an index into the
    /// coordinates the comparison was made in.
    pub coordinate: usize,
    /// How far that coordinate's mean moved, in its sds (the pooled sd of both sets).
    pub mean_shift_sd: f64,
    /// That coordinate's sd after the chains over its sd before.
    pub sd_ratio: f64,
    /// Largest `|z|` of a mean over the coordinates.
    pub max_z_mean: f64,
    /// Largest `|z|` of a log sd over the coordinates.
    pub max_z_log_sd: f64,
    /// `|z|` of the change of the mean log density (see the module docs).
    #[serde(default)]
    pub z_log_density: f64,
    /// The change of the mean log density over the compared chains, in nats (positive: the
    /// chains climbed, the set was too wide or misplaced; negative: they spread out, it was too
    /// narrow).
    #[serde(default)]
    pub log_density_shift: f64,
    /// Model evaluations (one per chain and step, with gradient).
    pub score_evals: usize,
    /// Proposals rejected because their evaluation failed ([`FailureTally`]), over all chains.
    #[serde(default)]
    pub failed_evaluations: usize,
    /// The first one's cause.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_failure: Option<String>,
    /// Wall seconds of the check.
    pub seconds: f64,
    /// The chains barely moved (acceptance below [`MIN_ACCEPTANCE`]): no verdict.
    pub inconclusive: bool,
}

impl Stationarity {
    /// Whether the particles moved further than the threshold allows (and the check could judge).
    pub fn rejected(&self) -> bool {
        !self.inconclusive && (self.max_z().is_nan() || self.max_z() > self.threshold)
    }

    /// The largest `|z|`: of a coordinate's mean or log sd, or of the log density (NaN if any
    /// is).
    pub fn max_z(&self) -> f64 {
        if self.z_log_density.is_nan() {
            return f64::NAN;
        }
        self.max_z_mean.max(self.max_z_log_sd).max(self.z_log_density)
    }

    /// Whether the log density's `z` is the largest one.
    pub fn log_density_worst(&self) -> bool {
        self.z_log_density.is_nan() || self.z_log_density > self.max_z_mean.max(self.max_z_log_sd)
    }
}

/// The chains' start and end, as the check compares them.
pub struct MalaChains {
    /// The starting points `[n, dim]` (the particles, resampled by weight if they had weights).
    pub start: Tensor<2>,
    /// The chains after the fixed-step run `[n, dim]`.
    pub end: Tensor<2>,
    /// Kish's effective number of distinct starting points.
    pub effective_size: f64,
    /// Mean acceptance probability of the fixed-step run.
    pub acceptance: f64,
    /// The adapted step size.
    pub step_size: f64,
    /// Model evaluations with gradient (rows).
    pub score_evals: usize,
    /// The proposal's coordinate scales `S` `[1, dim]` (the starting set's sds).
    pub scale: Tensor<2>,
    /// The log density at the starting points `[n]`.
    pub start_log_prob: Tensor<1>,
    /// The log density at the chains' ends `[n]`.
    pub end_log_prob: Tensor<1>,
    /// Proposals rejected because their evaluation failed, over all chains and steps
    /// (adaptation included).
    pub failed_evaluations: usize,
    /// The first one's cause.
    pub first_failure: Option<String>,
}

/// Runs the stationarity check of `particles` under `model`, in the coordinates the particles
/// live in; `view` maps both sets (linearly, e.g. back from whitened coordinates) to the
/// coordinates the moments are compared in, `None` for the same ones. A model without a
/// gradient gives [`ModelError::NoGradient`] (the caller skips the check).
pub fn stationarity_check(
    model: &dyn LogDensity,
    particles: &Particles,
    config: &StationarityConfig,
    view: Option<&dyn Fn(Tensor<2>) -> Tensor<2>>,
) -> Result<Stationarity, InferError> {
    stationarity_check_chains(model, particles, config, view).map(|(s, _)| s)
}

/// [`stationarity_check`] with the chains it ran, for a caller that continues them (the polish
/// step, [`crate::samplers::polish`]).
pub fn stationarity_check_chains(
    model: &dyn LogDensity,
    particles: &Particles,
    config: &StationarityConfig,
    view: Option<&dyn Fn(Tensor<2>) -> Tensor<2>>,
) -> Result<(Stationarity, MalaChains), InferError> {
    let started = Instant::now();
    let chains = mala_chains(model, particles, config)?;
    let (start, end) = match view {
        Some(f) => (f(chains.start.clone()), f(chains.end.clone())),
        None => (chains.start.clone(), chains.end.clone()),
    };
    let [n, d] = start.dims();
    let shift = MomentShift::between(&to_vec_f64(&start), &to_vec_f64(&end), n, d, chains.effective_size);
    let (z_log_density, log_density_shift) =
        log_density_z(&to_vec_f64(&chains.start_log_prob), &to_vec_f64(&chains.end_log_prob), chains.effective_size);
    let threshold = bonferroni_threshold(config.level, 2 * d + 1);
    let (coordinate, _) = shift.worst();
    let stationarity = Stationarity {
        steps: config.steps,
        step_size: chains.step_size,
        acceptance: chains.acceptance,
        effective_size: chains.effective_size,
        threshold,
        level: config.level,
        coordinate,
        mean_shift_sd: shift.mean_shift_sd[coordinate],
        sd_ratio: shift.sd_ratio[coordinate],
        max_z_mean: max_abs(&shift.z_mean),
        max_z_log_sd: max_abs(&shift.z_log_sd),
        z_log_density,
        log_density_shift,
        score_evals: chains.score_evals,
        failed_evaluations: chains.failed_evaluations,
        first_failure: chains.first_failure.clone(),
        seconds: started.elapsed().as_secs_f64(),
        inconclusive: chains.acceptance.is_nan() || chains.acceptance < MIN_ACCEPTANCE,
    };
    Ok((stationarity, chains))
}

/// One MALA chain from each particle (resampled by weight first), batched: the step size is
/// adapted towards [`TARGET_ACCEPTANCE`] on chains that are then discarded, and the compared
/// chains run [`StationarityConfig::fixed_steps`] steps at that fixed step from the same points.
///
/// The proposal is preconditioned by the starting set's coordinate sds `S` (a fixed diagonal
/// mass matrix, so the check also works in unwhitened coordinates whose scales differ):
/// `y = x + h/2 S^2 grad log p(x) + sqrt(h) S xi`, accepted with the Metropolis-Hastings ratio.
pub fn mala_chains(
    model: &dyn LogDensity,
    particles: &Particles,
    config: &StationarityConfig,
) -> Result<MalaChains, InferError> {
    config.validate()?;
    let (n, d) = (particles.len(), particles.dim());
    if n < MIN_PARTICLES {
        return Err(InferError::setting(
            "particles",
            format!("the stationarity check needs at least {MIN_PARTICLES} particles, got {n}"),
        ));
    }
    if d != model.dim() {
        return Err(ModelError::DimensionMismatch { expected: model.dim(), got: d }.into());
    }
    let mut rng = EngineRng::new(config.seed ^ 0x57A7_10AA);
    let (start, effective_size, scale) = chain_start(particles, &mut rng)?;

    let first = start_score(model, start.clone())?;
    let mut evals = n;
    let failed = FailureTally::default();
    let mut mala = Mala { model, scale: scale.clone(), rng: &mut rng, n, d, failed: &failed };

    // Adaptation on chains that are then discarded.
    let state = (start.clone(), first.log_prob.clone(), first.grad.clone());
    let (_, h) = mala.adapt(state, (d as f64).powf(-1.0 / 3.0), config.adapt_steps())?;
    evals += n * config.adapt_steps();
    let start_log_prob = first.log_prob.clone();
    let mut state = (start.clone(), first.log_prob, first.grad);
    let mut accepted = 0.0;
    let fixed = config.fixed_steps();
    let mut ticker = crate::core::progress::Ticker::new("stationarity check (MALA)");
    for step in 0..fixed {
        ticker.tick(|| format!("step {step} of {fixed} after {} adapting", config.adapt_steps()));
        let (next, acceptance) = mala.step(state, h)?;
        evals += n;
        state = next;
        accepted += acceptance;
    }
    Ok(MalaChains {
        start,
        end: state.0,
        effective_size,
        acceptance: accepted / fixed.max(1) as f64,
        step_size: h,
        score_evals: evals,
        scale,
        start_log_prob,
        end_log_prob: state.1,
        failed_evaluations: failed.count(),
        first_failure: failed.first(),
    })
}

/// `|z|` of the change of the mean log density from `before` to `after` (one value per chain),
/// with `n_eff` independent starting points, and the change in nats: `|dmean| / (sigma sqrt(2 /
/// n_eff))`, `sigma` pooled over both sets (see the module docs). NaN where a value is not finite.
fn log_density_z(before: &[f64], after: &[f64], effective_size: f64) -> (f64, f64) {
    let n = before.len() as f64;
    if n == 0.0 || !before.iter().chain(after).all(|v| v.is_finite()) {
        return (f64::NAN, f64::NAN);
    }
    let (m0, v0) = moments(before, before.len(), 1);
    let (m1, v1) = moments(after, after.len(), 1);
    let shift = m1[0] - m0[0];
    let sigma = ((v0[0] + v1[0]) / 2.0).sqrt();
    let z = if sigma > 0.0 { shift.abs() / (sigma * (2.0 / effective_size).sqrt()) } else { 0.0 };
    (z, shift)
}

/// The chains' starting points (the particles, resampled by weight if they have weights), Kish's
/// effective number of distinct ones, and the proposal's coordinate scales `[1, dim]`: the set's
/// coordinate sds, where a coordinate without spread (a collapsed set) takes the others' mean
/// variance, else 1.
pub(crate) fn chain_start(
    particles: &Particles,
    rng: &mut EngineRng,
) -> Result<(Tensor<2>, f64, Tensor<2>), InferError> {
    let (n, d) = (particles.len(), particles.dim());
    let (start, effective_size) = match &particles.weights {
        None => (particles.positions.clone(), n as f64),
        Some(w) => resample(&particles.positions, &to_vec_f64(w), rng)?,
    };
    let host = to_vec_f64(&start);
    let (_, var) = moments(&host, n, d);
    let positive: Vec<f64> = var.iter().copied().filter(|v| *v > 0.0 && v.is_finite()).collect();
    let fallback = if positive.is_empty() { 1.0 } else { positive.iter().sum::<f64>() / positive.len() as f64 };
    let scale: Vec<f32> =
        var.iter().map(|v| (if *v > 0.0 && v.is_finite() { *v } else { fallback }).sqrt() as f32).collect();
    let scale = Tensor::<2>::from_data(TensorData::new(scale, [1, d]), &particles.device());
    Ok((start, effective_size, scale))
}

/// Multinomial resampling of a weighted set by its weights, with Kish's effective size of the
/// resampled counts.
fn resample(positions: &Tensor<2>, weights: &[f64], rng: &mut EngineRng) -> Result<(Tensor<2>, f64), InferError> {
    let n = weights.len();
    let total: f64 = weights.iter().map(|w| w.max(0.0)).sum();
    if !(total > 0.0 && total.is_finite()) {
        return Err(InferError::Numerical(format!("the particle weights sum to {total}: cannot resample")));
    }
    let mut cumulative = Vec::with_capacity(n);
    let mut acc = 0.0;
    for w in weights {
        acc += w.max(0.0) / total;
        cumulative.push(acc);
    }
    let mut counts = vec![0usize; n];
    let picks: Vec<i64> = (0..n)
        .map(|_| {
            let u = rng.uniform();
            let k = cumulative.partition_point(|c| *c <= u).min(n - 1);
            counts[k] += 1;
            k as i64
        })
        .collect();
    let squares: f64 = counts.iter().map(|c| (*c * *c) as f64).sum();
    let idx = Tensor::<1, Int>::from_data(TensorData::new(picks, [n]), &positions.device());
    Ok((positions.clone().select(0, idx), (n * n) as f64 / squares))
}

/// Per-coordinate moment changes between two sets of the same size, as `z` statistics (see the
/// module docs).
#[derive(Clone, Debug)]
pub struct MomentShift {
    /// `dmean_j / (sigma_j sqrt(2 / n_eff))`, `sigma_j` pooled over both sets.
    pub z_mean: Vec<f64>,
    /// `dlogsd_j / sqrt((kappa_j - 1) / (2 n_eff))`.
    pub z_log_sd: Vec<f64>,
    /// `dmean_j / sigma_j`.
    pub mean_shift_sd: Vec<f64>,
    /// `sd_after_j / sd_before_j`.
    pub sd_ratio: Vec<f64>,
}

impl MomentShift {
    /// The changes from `before` to `after` (row-major `[n, d]` each), with `n_eff` independent
    /// starting points.
    pub fn between(before: &[f64], after: &[f64], n: usize, d: usize, effective_size: f64) -> Self {
        let (m0, v0) = moments(before, n, d);
        let (m1, v1) = moments(after, n, d);
        let (k0, k1) = (kurtosis(before, &m0, &v0, n, d), kurtosis(after, &m1, &v1, n, d));
        let mut shift = Self { z_mean: vec![], z_log_sd: vec![], mean_shift_sd: vec![], sd_ratio: vec![] };
        for j in 0..d {
            let sigma = ((v0[j] + v1[j]) / 2.0).sqrt();
            let dm = m1[j] - m0[j];
            let (z_mean, mean_shift) =
                if sigma > 0.0 { (dm / (sigma * (2.0 / effective_size).sqrt()), dm / sigma) } else { (0.0, 0.0) };
            let (s0, s1) = (v0[j].sqrt(), v1[j].sqrt());
            let kappa = k0[j].max(k1[j]).max(1.0 + 1e-12);
            let z_sd = if s0 > 0.0 && s1 > 0.0 {
                (s1 / s0).ln() / ((kappa - 1.0) / (2.0 * effective_size)).sqrt()
            } else if s0 == s1 {
                0.0
            } else {
                // One set has no spread at all and the other has: as far apart as can be.
                f64::INFINITY
            };
            shift.z_mean.push(z_mean);
            shift.z_log_sd.push(z_sd);
            shift.mean_shift_sd.push(mean_shift);
            shift.sd_ratio.push(if s0 > 0.0 { s1 / s0 } else { f64::INFINITY });
        }
        shift
    }

    /// The coordinate with the largest `|z|` (mean or log sd) and that `|z|`; NaN counts as
    /// largest.
    pub fn worst(&self) -> (usize, f64) {
        let z = |j: usize| {
            let v = self.z_mean[j].abs().max(self.z_log_sd[j].abs());
            if self.z_mean[j].is_nan() || self.z_log_sd[j].is_nan() { f64::INFINITY } else { v }
        };
        (0..self.z_mean.len()).map(|j| (j, z(j))).fold((0, f64::NEG_INFINITY), |a, b| if b.1 > a.1 { b } else { a })
    }
}

fn max_abs(v: &[f64]) -> f64 {
    v.iter().fold(0.0f64, |a, b| if b.is_nan() { f64::NAN } else { a.max(b.abs()) })
}

/// Per-coordinate means and population variances of row-major `[n, d]` values.
fn moments(x: &[f64], n: usize, d: usize) -> (Vec<f64>, Vec<f64>) {
    let mut mean = vec![0.0; d];
    for row in x.chunks(d) {
        for (m, v) in mean.iter_mut().zip(row) {
            *m += v / n as f64;
        }
    }
    let mut var = vec![0.0; d];
    for row in x.chunks(d) {
        for ((s, v), m) in var.iter_mut().zip(row).zip(&mean) {
            *s += (v - m).powi(2) / n as f64;
        }
    }
    (mean, var)
}

/// Per-coordinate kurtosis `E (x - m)^4 / var^2` (3 for a normal; NaN without spread).
fn kurtosis(x: &[f64], mean: &[f64], var: &[f64], n: usize, d: usize) -> Vec<f64> {
    let mut fourth = vec![0.0; d];
    for row in x.chunks(d) {
        for ((f, v), m) in fourth.iter_mut().zip(row).zip(mean) {
            *f += (v - m).powi(4) / n as f64;
        }
    }
    fourth.iter().zip(var).map(|(f, v)| f / (v * v)).collect()
}

/// `Phi^{-1}(1 - alpha / (2 m))`: the two-sided Bonferroni threshold for `m` standard normal
/// statistics at overall level `alpha`.
pub fn bonferroni_threshold(alpha: f64, m: usize) -> f64 {
    -normal_quantile(alpha / (2.0 * m.max(1) as f64))
}

/// The standard normal quantile `Phi^{-1}(p)`, by Acklam's rational approximation (relative
/// error below 1.2e-9 on `(0, 1)`).
pub fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969683028665376e+01,
        2.209460984245205e+02,
        -2.759285104469687e+02,
        1.383_577_518_672_69e2,
        -3.066479806614716e+01,
        2.506628277459239e+00,
    ];
    const B: [f64; 5] = [
        -5.447609879822406e+01,
        1.615858368580409e+02,
        -1.556989798598866e+02,
        6.680131188771972e+01,
        -1.328068155288572e+01,
    ];
    const C: [f64; 6] = [
        -7.784894002430293e-03,
        -3.223964580411365e-01,
        -2.400758277161838e+00,
        -2.549732539343734e+00,
        4.374664141464968e+00,
        2.938163982698783e+00,
    ];
    const D: [f64; 4] = [7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00, 3.754408661907416e+00];
    if p <= 0.0 {
        return f64::NEG_INFINITY;
    }
    if p >= 1.0 {
        return f64::INFINITY;
    }
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    let low = 0.02425;
    if p < low {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - low {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_quantiles_match_tables() {
        for (p, z) in
            [(0.025, -1.959_963_985), (0.005, -2.575_829_304), (1e-4, -3.719_016_485), (0.5, 0.0), (0.9, 1.281_551_566)]
        {
            assert!((normal_quantile(p) - z).abs() < 1e-7, "{p}: {} vs {z}", normal_quantile(p));
        }
        // d = 10, alpha = 0.01: 20 statistics, 2.5e-4 in each tail.
        assert!((bonferroni_threshold(0.01, 20) - 3.480_6).abs() < 1e-3, "{}", bonferroni_threshold(0.01, 20));
    }

    #[test]
    fn moment_shift_reads_a_known_change() {
        // Two coordinates; the second set shifts coordinate 0 by 1 and doubles coordinate 1.
        let n = 4;
        let before = [-1.0, -1.0, 1.0, 1.0, -1.0, 1.0, 1.0, -1.0];
        let after = [0.0, -2.0, 2.0, 2.0, 0.0, 2.0, 2.0, -2.0];
        let s = MomentShift::between(&before, &after, n, 2, n as f64);
        assert!((s.mean_shift_sd[0] - 1.0).abs() < 1e-12);
        assert!((s.z_mean[0] - 1.0 / (0.5f64).sqrt()).abs() < 1e-12);
        assert!((s.sd_ratio[1] - 2.0).abs() < 1e-12);
        // Kurtosis of +-1 is 1: clamped just above, so z of the log sd is huge but finite.
        assert!(s.z_log_sd[1] > 1e3 && s.z_log_sd[1].is_finite());
        assert_eq!(s.worst().0, 1);
    }
}
