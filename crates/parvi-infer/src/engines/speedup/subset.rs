//! Random subset SVGD, plain and with control-functional weights (Kang, "Speedup Methods for
//! SVGD", Algorithms 2 and 3): each step `m` subparticles `y_j` drawn from the particles carry
//! the update
//!
//! `phi(x) = sum_j w_j [k(y_j, x) grad log p(y_j) + grad_{y_j} k(y_j, x)]`,
//!
//! `w_j = 1/m` (random subset) or the normalised control-functional weights of Oates, Girolami
//! & Chopin (see [`control_functional_weights`]). Only the `m` subparticles need scores, so a
//! step costs `m` score evaluations and `O(n m)` kernel work instead of `n` and `O(n^2)`.
//!
//! A median-rule kernel uses the whole particle set's rule, as SVGD (`n` in the log term, the
//! median over all pairs, estimated from a bounded random sample of pairs for large `n`); the
//! direction and the control-functional weights share that one bandwidth.

use burn::tensor::{Device, Tensor, TensorData};
use parvi_model::score;
use parvi_model::tensor_ops::{pairwise_sq_dists, to_vec_f32};
use serde::{Deserialize, Serialize};

use crate::core::{Direction, DirectionEngine};
use crate::core::{check_subset_size, random_rows};
use crate::engines::EngineConfig;
use crate::error::require_positive;
use crate::kernels::{linear_direction, require_matrices_fit, stein_direction, stein_kernel};
use crate::{AdapterConfig, Engine, KernelConfig};
use crate::{EngineRng, InferError, Kernel, Particles, StepAdapter, StepContext};

use super::full_set_kernel;
use parvi_model::linalg::host::{Cholesky, CholeskyError};

/// How many times the control-functional solve retries with 100x more jitter.
const JITTER_TRIES: usize = 3;

/// Options of `svgd-subset`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct SubsetConfig {
    /// Subparticles per step (`1 <= m <= n`).
    pub m: usize,
}

impl Default for SubsetConfig {
    fn default() -> Self {
        Self { m: 10 }
    }
}

/// Options of `svgd-cf`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct ControlFunctionalConfig {
    /// Subparticles per step (`1 <= m <= n`).
    pub m: usize,
    /// Ridge `lambda` in `K0 + lambda m I` (`>= 0`).
    pub lambda: f64,
    /// First diagonal jitter, relative to the mean diagonal of `K0 + lambda m I`, tried when the
    /// Cholesky factorisation fails; it grows 100-fold per retry (3 tries). `0` disables it.
    pub jitter: f64,
}

impl Default for ControlFunctionalConfig {
    fn default() -> Self {
        Self { m: 10, lambda: 1e-3, jitter: 1e-10 }
    }
}

/// The random subset direction at the particles `x` from subparticles `y` with scores `s`:
/// `phi(x_i) = (1/m) sum_j [k(y_j, x_i) s_j + grad_{y_j} k(y_j, x_i)]`. A median-rule kernel
/// takes the whole set's rule, SVGD's: `n` in the log term, the median over all pairs of `x`.
///
/// For an RBF kernel (`f' = c f`) drift and repulsion share one product,
/// `phi = (1/m) [K^T (S + 2c Y) - 2c X * colsum(K)]` with `K` `[m, n]`: the operations of
/// [`crate::kernels::svgd_direction`] with the subparticles as sources, so that `y = x` gives SVGD's
/// direction. Other kernels take the general [`stein_direction`]; a kernel with linear features
/// adds their part ([`linear_direction`]).
pub fn subset_direction(kernel: &dyn Kernel, y: Tensor<2>, s: Tensor<2>, x: Tensor<2>) -> Tensor<2> {
    let sq = pairwise_sq_dists(y.clone(), x.clone()); // [m, n]: subparticle j to particle i
    let (resolved, _) = full_set_kernel(kernel, &x, None);
    subset_direction_at(resolved.as_deref().unwrap_or(kernel), &sq, y, s, x)
}

/// [`subset_direction`] with the `[m, n]` squared distances `sq` given and the kernel as it is.
fn subset_direction_at(kernel: &dyn Kernel, sq: &Tensor<2>, y: Tensor<2>, s: Tensor<2>, x: Tensor<2>) -> Tensor<2> {
    let linear = kernel.linear_features().then(|| linear_direction(y.clone(), s.clone(), x.clone(), None));
    let phi = match kernel.eval_proportional(sq) {
        Some((k, c)) => {
            let m = y.dims()[0] as f64;
            let two_c = c.mul_scalar(2.0 / m); // [1, 1]
            let colsum = k.clone().sum_dim(0).transpose(); // [n, 1]
            k.transpose().div_scalar(m).matmul(s + y * two_c.clone().mul_scalar(m)) - x * (colsum * two_c)
        }
        None => stein_direction(&kernel.eval(sq, false), y, s, x, None),
    };
    match linear {
        Some(l) => phi + l,
        None => phi,
    }
}

/// Control-functional weights of points `y` `[m, d]` with scores `score` (the simplified
/// estimator of Oates, Girolami & Chopin, normalised as in Kang's Algorithm 3):
///
/// `v = 1^T (K0 + lambda m I)^{-1} / (1 + 1^T (K0 + lambda m I)^{-1} 1)`, `w = v / sum v`,
///
/// `K0` the Stein kernel matrix of `y` under `kernel`. Since `w` is normalised, `w = a / sum a`
/// with `a` the solution of `(K0 + lambda m I) a = 1`, found by Cholesky (with `jitter`
/// relative to the mean diagonal, grown 100-fold on failure, 3 tries), never an inverse.
///
/// One host read of `K0` (`m x m`): burn has no Cholesky, and `m` is small.
pub fn control_functional_weights(
    kernel: &dyn Kernel,
    y: Tensor<2>,
    score: Tensor<2>,
    lambda: f64,
    jitter: f64,
) -> Result<Vec<f64>, InferError> {
    let m = y.dims()[0];
    let k0 = to_vec_f32(&stein_kernel(kernel, y, score));
    let mut a: Vec<f64> = k0.into_iter().map(f64::from).collect();
    for i in 0..m {
        a[i * m + i] += lambda * m as f64;
    }
    let chol = Cholesky::factor_with_jitter(&a, m, jitter, JITTER_TRIES).map_err(|e| match e {
        CholeskyError::Singular { .. } => InferError::Numerical(format!(
            "control-functional system K0 + lambda m I (m = {m}, lambda = {lambda}) is singular: {e}; \
             raise `lambda` or `jitter`"
        )),
        CholeskyError::Malformed(_) => InferError::Numerical(format!("control-functional system: {e}")),
    })?;
    let sol = chol.solve(&vec![1.0; m]);
    let total: f64 = sol.iter().sum();
    let v: Vec<f64> = sol.iter().map(|a| a / (1.0 + total)).collect();
    let v_sum: f64 = v.iter().sum();
    if !(v_sum.is_finite() && v_sum != 0.0) {
        return Err(InferError::Numerical(format!(
            "control-functional weights sum to {v_sum} (m = {m}, lambda = {lambda}, jitter = {:e})",
            chol.jitter
        )));
    }
    Ok(v.into_iter().map(|v| v / v_sum).collect())
}

/// Random subset SVGD, optionally with control-functional weights.
pub struct RandomSubset {
    kernel: Box<dyn Kernel>,
    m: usize,
    /// `(lambda, jitter)` when the subparticles carry control-functional weights.
    control_functional: Option<(f64, f64)>,
    /// The median-rule bandwidth `h` of the last step, for the report.
    last_h: Option<f64>,
}

impl RandomSubset {
    /// Plain random subset SVGD (`svgd-subset`).
    pub fn new(
        config: &SubsetConfig,
        kernel: Box<dyn Kernel>,
        adapter: Box<dyn StepAdapter>,
    ) -> Result<DirectionEngine<Self>, InferError> {
        if config.m == 0 {
            return Err(InferError::setting("m", "must be >= 1, got 0"));
        }
        Ok(DirectionEngine::new(Self { kernel, m: config.m, control_functional: None, last_h: None }, adapter))
    }

    /// Random subset SVGD with control-functional weights (`svgd-cf`).
    pub fn with_control_functional(
        config: &ControlFunctionalConfig,
        kernel: Box<dyn Kernel>,
        adapter: Box<dyn StepAdapter>,
    ) -> Result<DirectionEngine<Self>, InferError> {
        if config.m == 0 {
            return Err(InferError::setting("m", "must be >= 1, got 0"));
        }
        if !(config.lambda >= 0.0 && config.lambda.is_finite()) {
            return Err(InferError::setting("lambda", format!("must be finite and >= 0, got {}", config.lambda)));
        }
        if config.jitter != 0.0 {
            require_positive("jitter", config.jitter)?;
        }
        let control_functional = Some((config.lambda, config.jitter));
        Ok(DirectionEngine::new(Self { kernel, m: config.m, control_functional, last_h: None }, adapter))
    }

    /// This step's direction at all particles `x` from the subparticles `y` with scores `s`.
    fn direction(
        &mut self,
        x: Tensor<2>,
        y: Tensor<2>,
        s: Tensor<2>,
        rng: &mut EngineRng,
        device: &Device,
    ) -> Result<Tensor<2>, InferError> {
        let sq = pairwise_sq_dists(y.clone(), x.clone()); // [m, n]: subparticle j to particle i
        let (resolved, h) = full_set_kernel(self.kernel.as_ref(), &x, Some(rng));
        self.last_h = h;
        let kernel = resolved.as_deref().unwrap_or(self.kernel.as_ref());
        Ok(match self.control_functional {
            None => subset_direction_at(kernel, &sq, y, s, x),
            Some((lambda, jitter)) => {
                let w = control_functional_weights(kernel, y.clone(), s.clone(), lambda, jitter)?;
                let w: Vec<f32> = w.into_iter().map(|v| v as f32).collect();
                let w = Tensor::<1>::from_data(TensorData::new(w, [self.m]), device);
                let linear = kernel
                    .linear_features()
                    .then(|| linear_direction(y.clone(), s.clone(), x.clone(), Some(w.clone())));
                let phi = stein_direction(&kernel.eval(&sq, false), y, s, x, Some(w));
                match linear {
                    Some(l) => phi + l,
                    None => phi,
                }
            }
        })
    }
}

impl Direction for RandomSubset {
    fn name(&self) -> &'static str {
        if self.control_functional.is_some() { "svgd-cf" } else { "svgd-subset" }
    }

    fn init(&mut self, particles: &Particles) -> Result<(), InferError> {
        check_subset_size("m", self.m, particles.len())?;
        // Refused here rather than aborting at the first step: the m x n kernel matrices of the
        // direction, and svgd-cf's m x m Stein kernel matrix (about ten f32 matrices on the
        // device while it is formed, then an f64 copy and its Cholesky factor on the host).
        let (m, n) = (self.m, particles.len());
        if self.control_functional.is_some() {
            require_matrices_fit("m", m, "svgd-cf's m x m Stein kernel matrix", m, m, 14)?;
        }
        require_matrices_fit("m", m, &format!("{}'s m x n kernel matrices (n = {n} particles)", self.name()), m, n, 3)
    }

    fn ascent(&mut self, ctx: &mut StepContext<'_>, x: Tensor<2>) -> Result<Tensor<2>, InferError> {
        check_subset_size("m", self.m, x.dims()[0])?;
        let y = random_rows(&x, self.m, ctx.rng);
        let s = score(ctx.model, y.clone(), ctx.batch)?.grad;
        let device = x.device();
        self.direction(x, y, s, ctx.rng, &device)
    }

    fn report(&self) -> serde_json::Value {
        let mut r = serde_json::json!({ "kernel": self.kernel.describe(), "m": self.m, "h": self.last_h });
        if let Some((lambda, jitter)) = self.control_functional {
            r["lambda"] = lambda.into();
            r["jitter"] = jitter.into();
        }
        r
    }
}

impl EngineConfig for SubsetConfig {
    fn build(&self, kernel: &KernelConfig, adapter: &AdapterConfig) -> Result<Box<dyn Engine>, InferError> {
        Ok(Box::new(RandomSubset::new(self, kernel.build()?, adapter.build()?)?))
    }
}

impl EngineConfig for ControlFunctionalConfig {
    fn build(&self, kernel: &KernelConfig, adapter: &AdapterConfig) -> Result<Box<dyn Engine>, InferError> {
        Ok(Box::new(RandomSubset::with_control_functional(self, kernel.build()?, adapter.build()?)?))
    }
}
