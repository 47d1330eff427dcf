//! Stan's generalised linear model likelihoods: the linear predictor `alpha + x beta` for every
//! particle from one matrix product `beta [n, K] x x^T [K, N]`, and the likelihood of the `N`
//! outcomes on it, `[n, N]` per-observation terms (sum them along axis 1 for `target +=`).
//!
//! Stan's argument order: `y ~ bernoulli_logit_glm(x, alpha, beta)` is
//! `BernoulliLogitGlm::new(y, x)?.log_prob(alpha, beta)`. The data (`y`, `x`) are checked once
//! at construction; `x^T` is kept so no transpose is formed per evaluation.

use burn::tensor::Tensor;

use super::discrete::{BernoulliLogit, BinomialLogit, CategoricalLogit, NegBinomial2Log, OrderedLogistic, PoissonLog};
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

/// Stan's `binomial_logit_glm(n | N, x, alpha, beta)`: `n_i ~ binomial_logit(N_i, alpha + x_i beta)`.
#[derive(Clone, Debug)]
pub struct BinomialLogitGlm {
    design: Design,
    y: BinomialLogit<2>,
}

impl BinomialLogitGlm {
    /// Counts `n` `[N]`, trials (a scalar, or `[N]`), whole numbers with `0 <= n <= trials`, and
    /// the design matrix `x` `[N, K]` (finite): otherwise an error naming `counts`, `trials` or `x`.
    pub fn new(counts: Tensor<1>, trials: impl Into<Param<1>>, x: Tensor<2>) -> Result<Self, ModelError> {
        let trials = match trials.into() {
            Param::Scalar(v) => Param::Scalar(v),
            Param::Tensor(t) => {
                let len = t.dims()[0];
                Param::from((*t).reshape([1, len]))
            }
        };
        let (counts, n) = row(counts);
        Ok(Self { design: Design::new("BinomialLogitGlm", x, n)?, y: BinomialLogit::new(counts, trials)? })
    }

    /// The `N` log-likelihood terms, `[n, N]`; parameters as [`BernoulliLogitGlm::log_prob`].
    ///
    /// # Errors
    /// If the shapes do not fit the data, or a scalar `alpha` is not finite.
    pub fn log_prob(&self, alpha: impl Into<Param<2>>, beta: Tensor<2>) -> Result<Tensor<2>, ModelError> {
        Ok(self.y.log_prob(self.design.predictor(alpha.into(), beta)?))
    }
}

/// Stan's `neg_binomial_2_log_glm(y | x, alpha, beta, phi)`:
/// `y_i ~ neg_binomial_2_log(alpha + x_i beta, phi)`.
#[derive(Clone, Debug)]
pub struct NegBinomial2LogGlm {
    design: Design,
    y: NegBinomial2Log<2>,
}

impl NegBinomial2LogGlm {
    /// Counts `y` `[N]` (whole numbers `>= 0`) and the design matrix `x` `[N, K]` (finite):
    /// otherwise an error naming `counts` or `x`.
    pub fn new(y: Tensor<1>, x: Tensor<2>) -> Result<Self, ModelError> {
        let (y, n) = row(y);
        Ok(Self { design: Design::new("NegBinomial2LogGlm", x, n)?, y: NegBinomial2Log::new(y)? })
    }

    /// The `N` log-likelihood terms, `[n, N]`; `alpha` and `beta` as
    /// [`BernoulliLogitGlm::log_prob`], the overdispersion `phi` a scalar (finite and positive)
    /// or `[n, 1]`.
    ///
    /// # Errors
    /// If the shapes do not fit the data, or a scalar parameter is outside its support.
    pub fn log_prob(
        &self,
        alpha: impl Into<Param<2>>,
        beta: Tensor<2>,
        phi: impl Into<Param<2>>,
    ) -> Result<Tensor<2>, ModelError> {
        let phi = phi.into().check_positive("NegBinomial2LogGlm", "phi")?;
        self.y.log_prob(self.design.predictor(alpha.into(), beta)?, phi)
    }
}

/// Stan's `ordered_logistic_glm(y | x, beta, c)`: `y_i ~ ordered_logistic(x_i beta, c)` (no
/// intercept: the cut points carry it), 0-based categories as [`OrderedLogistic`].
#[derive(Clone, Debug)]
pub struct OrderedLogisticGlm {
    design: Design,
    y: OrderedLogistic,
}

impl OrderedLogisticGlm {
    /// The `N` observations `y` (each `< k`, 0-based, `k >= 2`) and the design matrix `x`
    /// `[N, K]` (finite): otherwise an error naming `y`, `k` or `x`.
    pub fn new(y: &[usize], k: usize, x: Tensor<2>) -> Result<Self, ModelError> {
        let device = x.device();
        Ok(Self { design: Design::new("OrderedLogisticGlm", x, y.len())?, y: OrderedLogistic::new(y, k, &device)? })
    }

    /// The `N` log-likelihood terms, `[n, N]`: coefficients `beta` `[n, K]`, cut points `c`
    /// `[n, k - 1]` (or one row for all particles), increasing (a particle whose are not gets
    /// `-inf`).
    ///
    /// # Errors
    /// If the shapes do not fit the data.
    pub fn log_prob(&self, beta: Tensor<2>, c: Tensor<2>) -> Result<Tensor<2>, ModelError> {
        self.y.log_prob(self.design.predictor(Param::Scalar(0.0), beta)?, c)
    }
}

/// Stan's `categorical_logit_glm(y | x, alpha, beta)`: `y_i ~ categorical_logit(alpha + x_i beta)`
/// with intercepts `alpha` (one per category) and coefficients `beta` (`K` covariates by `C`
/// categories), all `N` observations' predictors from one batched product
/// `x [1, N, K] x beta [n, K, C]`. Categories are 0-based.
#[derive(Clone, Debug)]
pub struct CategoricalLogitGlm {
    /// `[1, N, K]`
    x: Tensor<3>,
    y: CategoricalLogit,
}

impl CategoricalLogitGlm {
    /// The `N` observations `y` (each `< c`, 0-based) and the design matrix `x` `[N, K]`
    /// (finite): otherwise an error naming `y` or `x`.
    pub fn new(y: &[usize], c: usize, x: Tensor<2>) -> Result<Self, ModelError> {
        let design = Design::new("CategoricalLogitGlm", x, y.len())?;
        let device = design.xt.device();
        Ok(Self { x: design.xt.transpose().unsqueeze::<3>(), y: CategoricalLogit::new(y, c, &device)? })
    }

    /// The `N` log-likelihood terms, `[n, N]`: intercepts `alpha` `[n, C]` and coefficients
    /// `beta` `[n, K, C]` (either with one row for all particles).
    ///
    /// # Errors
    /// If the shapes do not fit the data.
    pub fn log_prob(&self, alpha: Tensor<2>, beta: Tensor<3>) -> Result<Tensor<2>, ModelError> {
        let [_, _, k] = self.x.dims();
        let [nb, kb, c] = beta.dims();
        let [na, ca] = alpha.dims();
        if kb != k {
            return Err(bad("CategoricalLogitGlm", "beta", format!("is [{nb}, {kb}, {c}] against {k} columns of x")));
        }
        if ca != c || (na != nb && na != 1 && nb != 1) {
            return Err(bad("CategoricalLogitGlm", "alpha", format!("is [{na}, {ca}] against beta [{nb}, {kb}, {c}]")));
        }
        let x = self.x.clone().cast(beta.dtype());
        let eta = x.matmul(beta) + alpha.reshape([na, 1, ca]); // [n, N, C]
        self.y.log_prob(eta)
    }
}
