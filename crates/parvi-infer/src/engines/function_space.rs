//! Function-space particles (Wang, Ren, Zhu & Zhang 2019, "Function Space Particle Optimization
//! for Bayesian Neural Networks", ICLR): the particles are compared by what they compute, their
//! outputs `f_i = f(X; theta_i)` at a set of measurement points `X` (some of the minibatch's rows
//! plus points drawn around and beyond the data, and optionally points between two of the
//! minibatch's rows, in the data's gaps), not by their weights, whose permutation and
//! scaling symmetries make weight-space kernels see distinct networks where there is one
//! function and one function where there are many.
//!
//! The update is the Wasserstein gradient flow of the KL in function space with the particles'
//! density `q` estimated from the particles themselves (the w-SGLD/"blob" member of the
//! particle-optimisation family Wang et al. write every method in; Chen et al. 2018, D'Angelo &
//! Fortuin 2021):
//!
//! `phi(theta_i) = grad_theta log p(theta_i) - J_i^T grad_f log q(f_i)`,
//!
//! `grad_f log q(f_i) = -(S + delta I)^-1 (f_i - f_bar)` by default (`repulsion = "gaussian"`:
//! the Gaussian with the particles' mean and ridge-shrunk covariance, Li & Turner's 2018 Stein
//! gradient estimator with a linear kernel) or
//! `grad_f log q(f_i) = -sum_j k_ij (f_i - f_j) / (h^2 sum_j k_ij)` (`repulsion = "kde"`),
//!
//! with `k` the RBF on the outputs, `h^2` the median rule, and `J_i = d f_i / d theta_i`. The
//! kernel density's score in the 20 or more dimensions of the outputs is several times too weak
//! (its median bandwidth grows with the number of points): its particles end under-dispersed
//! (docs/experiments.md, issue 30). The Gaussian's is exact for a Gaussian `q`. The
//! driving term is the particle's own weight-space score (for the likelihood it equals
//! `J_i^T grad_f log p(y | f_i)` exactly; the prior stays the weights' Gaussian, which is
//! what the network's function prior is). The push-back `J_i^T rho_i` is a vector-Jacobian
//! product: the step differentiates `sum_i log p(theta_i) + sum_i <f_i, rho_i>` (with `rho`
//! held constant) in ONE backward pass, so the step costs one forward of the network on the
//! minibatch and the measurement points and one backward.
//!
//! With `prior = "function"` the prior too lives in function space, as in Wang et al. 2019
//! (Sec. 3.1-3.2 and their code, `thu-ml/fpovi`): the target at the measurement points is
//! `p(f(X) | data) ∝ p(f(X)) prod_b p(y_b | f(x_b))^(N/B)`, the weight-space score keeps only the
//! likelihood (`log p - log prior`, the model's [`LogDensity::log_prior`] taken out), and
//! `grad_f log p(f(X))` is the score of a Gaussian fitted, at this step's measurement points, to
//! the outputs of `prior-draws` networks drawn once from the model's own prior
//! ([`FunctionMap::prior_draws`]; the paper's GP approximation of the prior gradient):
//!
//! `phi(theta_i) = grad_theta log p(y | theta_i) + J_i^T [ -(S_p + delta_p I)^-1 (f_i - mu_p)
//!                 + (S + delta I)^-1 (f_i - f_bar) ]`.
//!
//! Prior and repulsion then act in the same directions: where the data say nothing the fixed
//! point is `S + delta I = S_p + delta_p I`, the prior's spread, whatever the number of
//! particles, where the weights' prior, which does not grow with `n`, let the Gaussian repulsion
//! spread 50 or 100 particles without bound (docs/experiments.md). The prior's outputs cost one
//! more forward of the `prior-draws` networks at the measurement points, without a backward.

use burn::tensor::{Int, Tensor, TensorData};
use parvi_model::density::FunctionMap;
use parvi_model::linalg::{Triangle, cholesky, triangular_solve};
use parvi_model::tensor_ops::{matrix_from_vec, median_on_host, pairwise_sq_dists};
use parvi_model::{LogDensity, Minibatch, ModelError};
use serde::{Deserialize, Serialize};

use super::EngineConfig;
use crate::core::{Direction, DirectionEngine};
use crate::kernels::median_rule_h2;
use crate::{AdapterConfig, Engine, EngineRng, InferError, KernelConfig, StepAdapter, StepContext};

/// `fpovi`'s options.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct FunctionSpaceConfig {
    /// Measurement points taken from the minibatch's rows (its first rows; all of them when it
    /// has fewer).
    pub batch_points: usize,
    /// Measurement points drawn uniformly from the training inputs' box widened by `spread`.
    pub extra_points: usize,
    /// The box of the extra points: per feature, the training range's centre plus or minus
    /// `spread` times its half-width (1.5: half as far again beyond the data on each side).
    pub spread: f64,
    /// Measurement points on segments between two of the minibatch's rows,
    /// `lambda a + (1 - lambda) b` with `lambda ~ U(0, 1)`: they lie in the span of the data and
    /// fill its gaps (a pair on either side of a gap puts its point in it; Foong et al. 2019's
    /// in-between uncertainty), where the box's points can land off a discrete feature's grid.
    pub pair_points: usize,
    /// How a pair point mixes its two rows: one `lambda` for the whole row (on the segment) or
    /// one per feature (in the box the two rows span).
    pub pair_mixing: PairMixing,
    /// How `grad_f log q(f)`, the particles' own density in function space, is estimated.
    pub repulsion: Repulsion,
    /// `gaussian`: the ridge `delta` added to the particles' covariance, relative to its mean
    /// nonzero eigenvalue. With 20 particles in 20 or more output dimensions the smallest
    /// eigenvalues of the sample covariance are noise, and their inverses kick the particles
    /// apart (at 1e-3 the toy's epistemic sd is 2.4 times NUTS's); 0.3 shrinks them toward the
    /// mean eigenvalue (the choice is measured in docs/experiments.md).
    pub ridge: f64,
    /// Where the prior acts: `weights` (the model's weight-space prior, in the particles' own
    /// score) or `function` (a Gaussian fitted to the outputs of networks drawn from that prior,
    /// at the measurement points; Wang et al. 2019).
    pub prior: PriorSpace,
    /// `prior = "function"`: networks drawn from the prior (once, from `prior-seed`) whose
    /// outputs fit the prior's Gaussian at each step's measurement points.
    pub prior_draws: usize,
    /// `prior = "function"`: the ridge added to the prior's covariance, relative to its mean
    /// eigenvalue (`delta_p = prior-ridge * tr(S_p) / m`): nearby measurement points give
    /// outputs so correlated that the fitted covariance's smallest eigenvalues are noise.
    pub prior_ridge: f64,
    /// `prior = "function"`: the seed of the prior's networks.
    pub prior_seed: u64,
}

/// How a pair measurement point mixes its two training rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PairMixing {
    /// `lambda a + (1 - lambda) b`, one `lambda` for every feature: a point on the segment.
    Row,
    /// One `lambda` per feature: a point in the axis-aligned box with corners `a` and `b`.
    Feature,
}

/// Where `fpovi`'s prior acts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PriorSpace {
    /// The model's own prior on its parameters, in the particles' weight-space score.
    Weights,
    /// The law of the prior networks' outputs at the measurement points, as a fitted Gaussian.
    Function,
}

/// The estimate of the particles' function-space score `grad_f log q(f_i)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Repulsion {
    /// The score of the RBF kernel density of the particles' outputs, median bandwidth.
    Kde,
    /// The score of the Gaussian with the particles' mean and covariance,
    /// `-(S + delta I)^-1 (f_i - f_bar)`: Li & Turner's (2018) Stein gradient estimator with
    /// a linear kernel. Exact for a Gaussian, so the fixed point has the target's covariance in
    /// the directions the particles span, where the kernel density's score, in the 20 or more
    /// dimensions of the outputs, is several times too weak (its median bandwidth grows with
    /// the number of measurement points) and the particles end under-dispersed.
    Gaussian,
}

impl Default for FunctionSpaceConfig {
    fn default() -> Self {
        Self {
            batch_points: 10,
            extra_points: 10,
            spread: 1.5,
            pair_points: 0,
            pair_mixing: PairMixing::Row,
            repulsion: Repulsion::Gaussian,
            ridge: 0.3,
            prior: PriorSpace::Weights,
            prior_draws: 100,
            prior_ridge: 0.01,
            prior_seed: 0,
        }
    }
}

impl FunctionSpaceConfig {
    fn check(&self) -> Result<(), InferError> {
        if !(self.spread > 0.0 && self.spread.is_finite()) {
            return Err(InferError::setting("spread", format!("must be finite and > 0, got {}", self.spread)));
        }
        if !(self.ridge > 0.0 && self.ridge.is_finite()) {
            return Err(InferError::setting("ridge", format!("must be finite and > 0, got {}", self.ridge)));
        }
        if !(self.prior_ridge > 0.0 && self.prior_ridge.is_finite()) {
            return Err(InferError::setting(
                "prior-ridge",
                format!("must be finite and > 0, got {}", self.prior_ridge),
            ));
        }
        if self.prior == PriorSpace::Function && self.prior_draws < 2 {
            return Err(InferError::setting(
                "prior-draws",
                format!("a covariance needs at least 2 prior networks, got {}", self.prior_draws),
            ));
        }
        if self.batch_points + self.extra_points + self.pair_points == 0 {
            return Err(InferError::setting("extra-points", "batch-points + extra-points + pair-points must be >= 1"));
        }
        Ok(())
    }
}

/// The function-space particle direction.
pub struct FunctionSpace {
    config: FunctionSpaceConfig,
    /// The last step's bandwidth `h^2` in function space (for the report).
    last_h2: Option<f64>,
    /// `prior = "function"`: the prior's networks `[prior-draws, dim]`, drawn at the first step.
    prior_draws: Option<Tensor<2>>,
}

impl FunctionSpace {
    /// Function-space particles with `config`, moving by `adapter`.
    pub fn new(
        config: FunctionSpaceConfig,
        adapter: Box<dyn StepAdapter>,
    ) -> Result<DirectionEngine<Self>, InferError> {
        config.check()?;
        Ok(DirectionEngine::new(Self { config, last_h2: None, prior_draws: None }, adapter))
    }
}

/// What one function-space step computed.
#[derive(Clone, Debug)]
pub struct FunctionSpaceStep {
    /// `[n, dim]`: `grad log p(theta_i) + J_i^T rho_i`.
    pub direction: Tensor<2>,
    /// `[n, m * outputs]`: `rho_i = -grad_f log q(f_i)`, the function-space repulsion.
    pub repulsion: Tensor<2>,
    /// `kde`: the RBF bandwidth `h^2` (median rule on the outputs' squared distances);
    /// `gaussian`: none (the ridge stays on the device).
    pub h2: Option<f64>,
    /// `[n, m * outputs]`, with a function-space prior: its score at the particles' outputs,
    /// `-(S_p + delta_p I)^-1 (f_i - mu_p)`.
    pub prior_score: Option<Tensor<2>>,
}

/// `-grad_f log q(f_i)` for the kernel density `q(f) = (1/n) sum_j k(f, f_j)` of the rows of
/// `f` `[n, m]`, RBF `k = exp(-|f - f'|^2 / (2 h^2))`, `h^2` by the median rule:
/// `(f_i - sum_j w_ij f_j) / h^2` with `w_ij = k_ij / sum_l k_il`. Returns it and `h^2`.
pub fn kde_repulsion(f: Tensor<2>) -> (Tensor<2>, f64) {
    let n = f.dims()[0];
    let sq = pairwise_sq_dists(f.clone(), f.clone());
    let h2 = median_rule_h2(median_on_host(&sq).unwrap_or(0.0), n);
    let k = sq.div_scalar(-2.0 * h2).exp();
    let w = k.clone() / k.sum_dim(1);
    ((f.clone() - w.matmul(f)).div_scalar(h2), h2)
}

/// `-grad_f log q(f_i)` for the Gaussian `q = N(f_bar, S)` with the mean and covariance of the
/// rows of `f` `[n, m]`, its ridge `delta = ridge * tr(S) / min(n - 1, m)` (`ridge` times the
/// mean of its at most `min(n - 1, m)` nonzero eigenvalues): `(S + delta I)^-1 (f_i - f_bar)`. With `C` the centred rows,
/// `S = C^T C / (n - 1)` and `C (S + delta I)^-1 = (C C^T / (n - 1) + delta I)^-1 C`: one
/// `n x n` Cholesky factor, whatever the number of measurement points. Zero for `n < 2`.
pub fn gaussian_repulsion(f: Tensor<2>, ridge: f64) -> Result<Tensor<2>, InferError> {
    let [n, m] = f.dims();
    if n < 2 {
        return Ok(f.zeros_like());
    }
    let device = f.device();
    let c = f.clone() - f.mean_dim(0);
    let gram = c.clone().matmul(c.clone().transpose()).div_scalar((n - 1) as f64);
    let eye = Tensor::<2>::eye(n, &device).cast(gram.dtype());
    // tr(S) = tr(C C^T) / (n - 1), kept on the device (no host read on the hot path).
    let trace = (gram.clone() * eye.clone()).sum().reshape([1, 1]);
    // At most min(n - 1, m) eigenvalues of S are nonzero: delta is `ridge` times their mean.
    let delta = trace.mul_scalar(ridge / (n - 1).min(m) as f64);
    let a = gram + eye * delta;
    let (l, _) = cholesky(a.reshape([1, n, n]))?;
    let y = triangular_solve(l.clone(), c.reshape([1, n, m]), Triangle::Lower, false)?;
    Ok(triangular_solve(l, y, Triangle::Lower, true)?.reshape([n, m]))
}

/// The score of the function-space prior at the particles' outputs `f` `[n, m]`:
/// `-(S_p + delta_p I)^-1 (f_i - mu_p)`, with `mu_p` and `S_p` the mean and covariance of the
/// prior networks' outputs `prior` `[k, m]` at the same points and `delta_p = ridge * tr(S_p) / m`
/// (Wang et al. 2019's Gaussian approximation of the prior gradient; their code clips the
/// covariance's eigenvalues from below instead). One `m x m` Cholesky factor, no host read.
pub fn function_prior_score(f: Tensor<2>, prior: Tensor<2>, ridge: f64) -> Result<Tensor<2>, InferError> {
    let [n, m] = f.dims();
    let k = prior.dims()[0];
    if k < 2 || prior.dims()[1] != m {
        return Err(InferError::setting(
            "prior-draws",
            format!("need >= 2 prior networks with {m} outputs, got [{k}, {}]", prior.dims()[1]),
        ));
    }
    let device = f.device();
    let mu = prior.clone().mean_dim(0);
    let c = prior - mu.clone();
    let cov = c.clone().transpose().matmul(c).div_scalar((k - 1) as f64);
    let eye = Tensor::<2>::eye(m, &device).cast(cov.dtype());
    let trace = (cov.clone() * eye.clone()).sum().reshape([1, 1]);
    let a = cov + eye * trace.mul_scalar(ridge / m as f64);
    let (l, _) = cholesky(a.reshape([1, m, m]))?;
    let dev = (f - mu).transpose().reshape([1, m, n]);
    let y = triangular_solve(l.clone(), dev, Triangle::Lower, false)?;
    Ok(triangular_solve(l, y, Triangle::Lower, true)?.reshape([m, n]).transpose().neg())
}

/// The measurement points `[m, inputs]`: the first `batch_points` rows of the minibatch's
/// inputs, then `extra_points` drawn uniformly (from `rng`) in the training inputs' box widened
/// `spread` times about its centre, then `pair_points` mixing two of the minibatch's rows
/// ([`pair_points`]).
pub fn measurement_points(
    map: &dyn FunctionMap,
    batch: Option<&Minibatch>,
    config: &FunctionSpaceConfig,
    rng: &mut EngineRng,
) -> Result<Tensor<2>, InferError> {
    let rows = map.batch_inputs(batch);
    let device = rows.device();
    let taken = config.batch_points.min(rows.dims()[0]);
    let d = map.inputs();
    let range = map.input_range();
    let mut parts = Vec::with_capacity(3);
    if taken > 0 {
        parts.push(rows.clone().narrow(0, 0, taken));
    }
    if config.extra_points > 0 {
        let mut extra = Vec::with_capacity(config.extra_points * d);
        for _ in 0..config.extra_points {
            for &(lo, hi) in &range {
                let (centre, half) = (0.5 * (lo + hi), 0.5 * (hi - lo) * config.spread);
                extra.push((centre + half * (2.0 * rng.uniform() - 1.0)) as f32);
            }
        }
        parts.push(matrix_from_vec(extra, config.extra_points, d, &device));
    }
    // Drawn after the box's points, so that `pair-points = 0` leaves the stream as it was.
    if config.pair_points > 0 {
        parts.push(pair_points(rows, config.pair_points, config.pair_mixing, rng)?);
    }
    Ok(Tensor::cat(parts, 0))
}

/// `count` points mixing two distinct rows `a`, `b` of `rows` `[B, inputs]` (drawn uniformly
/// from `rng`): `lambda a + (1 - lambda) b` with `lambda ~ U(0, 1)`, one per point (`Row`) or
/// one per point and feature (`Feature`). Errors when `rows` has fewer than two rows.
pub fn pair_points(
    rows: Tensor<2>,
    count: usize,
    mixing: PairMixing,
    rng: &mut EngineRng,
) -> Result<Tensor<2>, InferError> {
    let [b, d] = rows.dims();
    if b < 2 {
        return Err(InferError::setting(
            "pair-points",
            format!("a pair point mixes two of the minibatch's rows, and the minibatch has {b}"),
        ));
    }
    let device = rows.device();
    let (mut first, mut second) = (Vec::with_capacity(count), Vec::with_capacity(count));
    for _ in 0..count {
        let pick = rng.choose(b, 2);
        first.push(pick[0] as i64);
        second.push(pick[1] as i64);
    }
    let cols = match mixing {
        PairMixing::Row => 1,
        PairMixing::Feature => d,
    };
    let lambda: Vec<f32> = (0..count * cols).map(|_| rng.uniform() as f32).collect();
    let lambda = matrix_from_vec(lambda, count, cols, &device).cast(rows.dtype());
    let index = |v: Vec<i64>| Tensor::<1, Int>::from_data(TensorData::new(v, [count]), &device);
    let a = rows.clone().select(0, index(first));
    let bb = rows.select(0, index(second));
    // b + lambda (a - b): the broadcast over features when one lambda serves the row.
    Ok(bb.clone() + (a - bb) * lambda)
}

/// The function-space direction at particles `x` `[n, dim]` with measurement points `points`:
/// one forward (the log-joint on `batch` and the outputs at `points`) and one backward.
/// `prior_draws` `[k, dim]`: networks drawn from the prior, for `prior = "function"` (where
/// their outputs at `points` cost one more forward, without a backward); ignored otherwise.
pub fn function_space_direction(
    model: &dyn LogDensity,
    map: &dyn FunctionMap,
    x: Tensor<2>,
    batch: Option<&Minibatch>,
    points: Tensor<2>,
    config: &FunctionSpaceConfig,
    prior_draws: Option<&Tensor<2>>,
) -> Result<FunctionSpaceStep, InferError> {
    let [_, dim] = x.dims();
    if dim != model.dim() {
        return Err(ModelError::DimensionMismatch { expected: model.dim(), got: dim }.into());
    }
    let leaf = x.detach().autodiff().require_grad();
    let mut lp = model.log_prob(leaf.clone(), batch);
    let prior_f = match (config.prior, prior_draws) {
        (PriorSpace::Weights, _) => None,
        (PriorSpace::Function, None) => {
            return Err(InferError::setting("prior", "prior = function needs networks drawn from the prior"));
        }
        (PriorSpace::Function, Some(draws)) => {
            // The weight-space prior is replaced, not added to: the likelihood is what is left.
            let log_prior = model.log_prior(leaf.clone()).ok_or_else(|| {
                InferError::setting(
                    "prior",
                    "prior = function needs a model that gives its prior apart from its likelihood (log_prior)",
                )
            })?;
            lp = lp - log_prior;
            Some(map.function_values(draws.clone().autodiff(), points.clone()).detach())
        }
    };
    let f = map.function_values(leaf.clone(), points);
    // The repulsion is a constant of the backward pass: only `J^T rho` is wanted from it.
    let (rho, h2) = match config.repulsion {
        Repulsion::Kde => {
            let (rho, h2) = kde_repulsion(f.clone().detach());
            (rho, Some(h2))
        }
        Repulsion::Gaussian => (gaussian_repulsion(f.clone().detach(), config.ridge)?, None),
    };
    let prior_score =
        prior_f.map(|prior_f| function_prior_score(f.clone().detach(), prior_f, config.prior_ridge)).transpose()?;
    // `J^T (grad_f log p(f) - grad_f log q(f))` in the same backward pass as the likelihood's score.
    let pull = match &prior_score {
        Some(score) => rho.clone() + score.clone(),
        None => rho.clone(),
    };
    let objective = lp.sum() + (f * pull).sum();
    let grads = objective.backward();
    let direction = leaf.grad(&grads).ok_or(ModelError::NoGradient)?;
    Ok(FunctionSpaceStep { direction, repulsion: rho, h2, prior_score })
}

impl Direction for FunctionSpace {
    fn name(&self) -> &'static str {
        "fpovi"
    }

    fn ascent(&mut self, ctx: &mut StepContext<'_>, x: Tensor<2>) -> Result<Tensor<2>, InferError> {
        let map = ctx.model.function_map().ok_or_else(|| {
            InferError::setting(
                "method",
                "fpovi compares particles by their network outputs: it needs a model whose particles are \
                 functions of inputs (a BNN)",
            )
        })?;
        if self.config.prior == PriorSpace::Function && self.prior_draws.is_none() {
            // Drawn once from their own seed (not the run's generator): a resumed run draws the
            // same networks.
            let draws = map.prior_draws(self.config.prior_draws, self.config.prior_seed).ok_or_else(|| {
                InferError::setting("prior", "prior = function needs a model that can draw networks from its prior")
            })?;
            self.prior_draws = Some(draws.to_device(&x.device()));
        }
        let points = measurement_points(map, ctx.batch, &self.config, ctx.rng)?;
        let step =
            function_space_direction(ctx.model, map, x, ctx.batch, points, &self.config, self.prior_draws.as_ref())?;
        self.last_h2 = step.h2;
        Ok(step.direction)
    }

    fn report(&self) -> serde_json::Value {
        serde_json::json!({
            "repulsion": match self.config.repulsion {
                Repulsion::Kde => "the score of the rbf kernel density of the outputs, median bandwidth",
                Repulsion::Gaussian => "the score of the outputs' Gaussian (mean and covariance)",
            },
            "ridge": self.config.ridge,
            "prior": match self.config.prior {
                PriorSpace::Weights => "the model's weight-space prior".to_string(),
                PriorSpace::Function => format!(
                    "function space: a Gaussian fitted to {} prior networks' outputs, ridge {}",
                    self.config.prior_draws, self.config.prior_ridge
                ),
            },
            "batch_points": self.config.batch_points,
            "extra_points": self.config.extra_points,
            "spread": self.config.spread,
            "pair_points": self.config.pair_points,
            "pair_mixing": match self.config.pair_mixing {
                PairMixing::Row => "one lambda per pair (on the segment)",
                PairMixing::Feature => "one lambda per feature",
            },
            "last_h2": self.last_h2,
        })
    }
}

impl EngineConfig for FunctionSpaceConfig {
    fn build(&self, kernel: &KernelConfig, adapter: &AdapterConfig) -> Result<Box<dyn Engine>, InferError> {
        if *kernel != KernelConfig::default() {
            return Err(InferError::setting(
                "kernel",
                "fpovi uses its own kernel: the RBF with the median bandwidth on the network outputs",
            ));
        }
        Ok(Box::new(FunctionSpace::new(self.clone(), adapter.build()?)?))
    }
}
