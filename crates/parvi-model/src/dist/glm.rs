//! Stan's generalised linear model likelihoods: the linear predictor `alpha + x beta` for every
//! particle from one matrix product `beta [n, K] x x^T [K, N]`, and the likelihood of the `N`
//! outcomes on it, `[n, N]` per-observation terms (sum them along axis 1 for `target +=`).
//!
//! Stan's argument order: `y ~ bernoulli_logit_glm(x, alpha, beta)` is
//! `BernoulliLogitGlm::new(y, x)?.log_prob(alpha, beta)`. The data (`y`, `x`) are checked once
//! at construction; `x^T` is kept so no transpose is formed per evaluation.

use burn::tensor::Tensor;

use super::discrete::{BernoulliLogit, PoissonLog};
use super::{LogProb, Normal, Param, bad};
use crate::ModelError;

/// The design matrix `x` `[N, K]` as `x^T` `[K, N]`, and the predictor from it.
#[derive(Clone, Debug)]
struct Design {
    dist: &'static str,
    xt: Tensor<2>,
}

impl Design {
    fn new(dist: &'static str, x: Tensor<2>, rows: usize) -> Result<Self, ModelError> {
        let [big_n, k] = x.dims();
        if big_n != rows || k == 0 {
            return Err(bad(dist, "x", format!("is [{big_n}, {k}] against {rows} outcomes: needs [N, K] with K > 0")));
        }
        if !crate::tensor_ops::all_finite(&x) {
            return Err(bad(dist, "x", "holds a non-finite entry"));
        }
        Ok(Self { dist, xt: x.transpose() })
    }

    /// `alpha + beta x^T`: `beta` `[n, K]`, `alpha` a scalar or `[n, 1]`: `[n, N]`.
    fn predictor(&self, alpha: Param<2>, beta: Tensor<2>) -> Result<Tensor<2>, ModelError> {
        let [k, _] = self.xt.dims();
        let [n, kb] = beta.dims();
        if kb != k {
            return Err(bad(self.dist, "beta", format!("is [{n}, {kb}] against {k} columns of x")));
        }
        if let Param::Tensor(a) = &alpha
            && (a.dims()[1] != 1 || (a.dims()[0] != n && a.dims()[0] != 1))
        {
            return Err(bad(self.dist, "alpha", format!("is {:?}: needs [n, 1] for beta's {n} rows", a.dims())));
        }
        let alpha = alpha.check_finite(self.dist, "alpha")?;
        let xt = self.xt.clone().cast(beta.dtype());
        Ok(alpha.add_to(beta.matmul(xt)))
    }
}

/// The outcomes `y` (`[N]`) as a row `[1, N]`, with their count.
fn row(y: Tensor<1>) -> (Tensor<2>, usize) {
    let n = y.dims()[0];
    (y.reshape([1, n]), n)
}

/// Stan's `bernoulli_logit_glm(y | x, alpha, beta)`: `y_i ~ bernoulli_logit(alpha + x_i beta)`.
#[derive(Clone, Debug)]
pub struct BernoulliLogitGlm {
    design: Design,
    y: BernoulliLogit<2>,
}

impl BernoulliLogitGlm {
    /// Labels `y` `[N]` in `{0, 1}` and the design matrix `x` `[N, K]` (finite): otherwise an
    /// error naming `y` or `x`.
    pub fn new(y: Tensor<1>, x: Tensor<2>) -> Result<Self, ModelError> {
        let (y, n) = row(y);
        Ok(Self { design: Design::new("BernoulliLogitGlm", x, n)?, y: BernoulliLogit::new(y)? })
    }

    /// The `N` log-likelihood terms for every particle: intercept `alpha` (a scalar or `[n, 1]`)
    /// and coefficients `beta` `[n, K]`: `[n, N]`.
    ///
    /// # Errors
    /// If the shapes do not fit the data, or a scalar `alpha` is not finite.
    pub fn log_prob(&self, alpha: impl Into<Param<2>>, beta: Tensor<2>) -> Result<Tensor<2>, ModelError> {
        Ok(self.y.log_prob(self.design.predictor(alpha.into(), beta)?))
    }
}

/// Stan's `poisson_log_glm(y | x, alpha, beta)`: `y_i ~ poisson_log(alpha + x_i beta)`.
#[derive(Clone, Debug)]
pub struct PoissonLogGlm {
    design: Design,
    y: PoissonLog<2>,
}

impl PoissonLogGlm {
    /// Counts `y` `[N]` (whole numbers `>= 0`) and the design matrix `x` `[N, K]` (finite):
    /// otherwise an error naming `counts` or `x`.
    pub fn new(y: Tensor<1>, x: Tensor<2>) -> Result<Self, ModelError> {
        let (y, n) = row(y);
        Ok(Self { design: Design::new("PoissonLogGlm", x, n)?, y: PoissonLog::new(y)? })
    }

    /// The `N` log-likelihood terms, `[n, N]`; parameters as [`BernoulliLogitGlm::log_prob`].
    ///
    /// # Errors
    /// If the shapes do not fit the data, or a scalar `alpha` is not finite.
    pub fn log_prob(&self, alpha: impl Into<Param<2>>, beta: Tensor<2>) -> Result<Tensor<2>, ModelError> {
        Ok(self.y.log_prob(self.design.predictor(alpha.into(), beta)?))
    }
}

/// Stan's `normal_id_glm(y | x, alpha, beta, sigma)`: `y_i ~ normal(alpha + x_i beta, sigma)`.
#[derive(Clone, Debug)]
pub struct NormalIdGlm {
    design: Design,
    /// `[1, N]`
    y: Tensor<2>,
}

impl NormalIdGlm {
    /// Outcomes `y` `[N]` and the design matrix `x` `[N, K]`, both finite: otherwise an error
    /// naming `y` or `x`.
    pub fn new(y: Tensor<1>, x: Tensor<2>) -> Result<Self, ModelError> {
        let (y, n) = row(y);
        if !crate::tensor_ops::all_finite(&y) {
            return Err(bad("NormalIdGlm", "y", "holds a non-finite entry"));
        }
        Ok(Self { design: Design::new("NormalIdGlm", x, n)?, y })
    }

    /// The `N` log-likelihood terms, `[n, N]`; `alpha` and `beta` as
    /// [`BernoulliLogitGlm::log_prob`], `sigma` a scalar (finite and positive) or `[n, 1]`.
    ///
    /// # Errors
    /// If the shapes do not fit the data, or a scalar parameter is outside its support.
    pub fn log_prob(
        &self,
        alpha: impl Into<Param<2>>,
        beta: Tensor<2>,
        sigma: impl Into<Param<2>>,
    ) -> Result<Tensor<2>, ModelError> {
        let mu = self.design.predictor(alpha.into(), beta)?;
        let sigma = sigma.into().check_positive("NormalIdGlm", "sigma")?;
        Ok(Normal::new(mu, sigma)?.log_prob(self.y.clone()))
    }
}
