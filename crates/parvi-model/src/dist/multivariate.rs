//! Multivariate densities: the Dirichlet over simplexes, the LKJ over Cholesky factors of
//! correlation matrices, and the multivariate normal from a Cholesky factor of its covariance.

use std::f64::consts::PI;

use burn::tensor::{Bool, Tensor, TensorData};

use super::special::{ln_gamma, ln_gamma_ratio_tensor, ln_gamma_tensor};
use super::{LogProb, Param, bad, lift, positive_scalar};
use crate::ModelError;
use crate::linalg::{Triangle, diagonal, triangular_solve};

/// `Dirichlet(alpha)` over the last axis (Stan's `dirichlet_lpdf`):
/// `ln Gamma(sum alpha) - sum ln Gamma(alpha) + sum (alpha - 1) ln theta`.
///
/// Values are simplexes along the last axis (`[n, K]`: one per particle); the result keeps
/// that axis with size 1 (`[n, 1]`). A row with an entry `<= 0` gives `-inf`. The rows are not
/// checked to sum to 1: they come from a simplex transform, and a tolerance test per
/// evaluation would be a host read on the hot path.
#[derive(Clone, Debug)]
pub struct Dirichlet<const D: usize> {
    alpha: Concentration<D>,
}

#[derive(Clone, Debug)]
enum Concentration<const D: usize> {
    /// Constants and their normalising constant, computed in f64 once.
    Host { alpha: Vec<f64>, log_norm: f64 },
    /// Broadcastable against the values (`[1, K]` or `[n, K]`).
    Tensor(Box<Tensor<D>>),
}

impl<const D: usize> Dirichlet<D> {
    /// A Dirichlet with constant concentrations `alpha` (`[K]`), each finite and positive.
    pub fn new(alpha: &[f64]) -> Result<Self, ModelError> {
        if alpha.is_empty() {
            return Err(bad("Dirichlet", "alpha", "needs at least one concentration"));
        }
        for &a in alpha {
            positive_scalar("Dirichlet", "alpha", a)?;
        }
        let log_norm = ln_gamma(alpha.iter().sum()) - alpha.iter().map(|&a| ln_gamma(a)).sum::<f64>();
        Ok(Self { alpha: Concentration::Host { alpha: alpha.to_vec(), log_norm } })
    }

    /// A Dirichlet with concentrations from a tensor broadcastable against the values along
    /// every axis but the last (`[1, K]` shared, `[n, K]` per particle); they must be
    /// positive (typically through a positive constraint).
    pub fn from_tensor(alpha: Tensor<D>) -> Self {
        Self { alpha: Concentration::Tensor(Box::new(alpha)) }
    }
}

impl<const D: usize> LogProb<D> for Dirichlet<D> {
    fn log_prob(&self, theta: Tensor<D>) -> Tensor<D> {
        let outside = theta.clone().lower_equal_elem(0.0);
        let lx = theta.clamp_min(f32::MIN_POSITIVE).log();
        let (terms, log_norm) = match &self.alpha {
            Concentration::Host { alpha, log_norm } => {
                let mut shape = [1; D];
                shape[D - 1] = alpha.len();
                let am1: Vec<f64> = alpha.iter().map(|a| a - 1.0).collect();
                let am1 = Tensor::<D>::from_data(TensorData::new(am1, shape), (&lx.device(), lx.dtype()));
                (lx * am1, Param::Scalar(*log_norm))
            }
            Concentration::Tensor(alpha) => {
                let alpha = (**alpha).clone();
                let log_norm =
                    ln_gamma_tensor(alpha.clone().sum_dim(D - 1)) - ln_gamma_tensor(alpha.clone()).sum_dim(D - 1);
                (lx * alpha.sub_scalar(1.0), Param::from(log_norm))
            }
        };
        // -inf terms sum to -inf: a row with any entry outside is outside.
        log_norm.add_to(terms.mask_fill(outside, f32::NEG_INFINITY).sum_dim(D - 1))
    }
}

/// Stan's `lkj_corr_cholesky_lpdf(L | eta)` on Cholesky factors of correlation matrices
/// `[n, K, K]`: `c_K(eta) + sum_{i=1}^{K-1} (K - 1 - i + 2 eta - 2) ln L_ii`, with Stan's
/// normalising constant (`do_lkj_constant`, Lewandowski, Kurowicka & Joe 2009, theorem 5)
/// `c_K = (K-1) ln Gamma(eta + (K-1)/2) - sum_{k=1}^{K-1} [k ln(pi)/2 + ln Gamma(eta + (K-1-k)/2)]`.
///
/// `eta` is a scalar or a per-particle tensor `[n]`. A factor with a diagonal entry `<= 0`
/// gives `-inf`; that the rows have unit norm is the constraint transform's business, not
/// checked here.
#[derive(Clone, Debug)]
pub struct LkjCorrCholesky {
    eta: Param<1>,
}

impl LkjCorrCholesky {
    /// `LkjCorrCholesky(eta)`; a scalar `eta` must be finite and positive.
    pub fn new(eta: impl Into<Param<1>>) -> Result<Self, ModelError> {
        Ok(Self { eta: eta.into().check_positive("LkjCorrCholesky", "eta")? })
    }

    /// The log-density of each factor in `l` (`[n, K, K]`, lower triangular): `[n]`.
    pub fn log_prob(&self, l: Tensor<3>) -> Tensor<1> {
        let [n, k, _] = l.dims();
        let constant = lkj_constant(&self.eta, k);
        if k < 2 {
            return constant.add_to(l.reshape([n, k * k]).sum_dim(1).mul_scalar(0.0).reshape([n]));
        }
        // The diagonal L_11 .. L_{K-1,K-1} (0-based) of the flattened rows: indices i (K + 1).
        let step = k + 1;
        let idx = Tensor::<1, burn::tensor::Int>::arange_step(step as i64..(k * k) as i64, step, &l.device());
        let diag = l.reshape([n, k * k]).select(1, idx); // [n, K-1]
        let outside = diag.clone().lower_equal_elem(0.0);
        let ld = diag.clamp_min(f32::MIN_POSITIVE).log();
        let coef: Vec<f64> = (1..k).map(|i| (k - 1 - i) as f64).collect();
        let coef = Tensor::<2>::from_data(TensorData::new(coef, [1, k - 1]), (&ld.device(), ld.dtype()));
        let two_eta_m2 = match &self.eta {
            Param::Scalar(eta) => lift(2.0 * eta - 2.0, &ld),
            Param::Tensor(eta) => (**eta).clone().mul_scalar(2.0).sub_scalar(2.0).reshape([n, 1]),
        };
        let terms = (ld * (coef + two_eta_m2)).mask_fill(outside, f32::NEG_INFINITY);
        constant.add_to(terms.sum_dim(1).reshape([n]))
    }
}

/// The LKJ normalising constant `c_K(eta)` (see [`LkjCorrCholesky`]), shared by the density on
/// correlation matrices and the one on their Cholesky factors.
fn lkj_constant(eta: &Param<1>, k: usize) -> Param<1> {
    let km1 = k.saturating_sub(1) as f64;
    eta.map(
        |eta| {
            km1 * ln_gamma(eta + 0.5 * km1)
                - (1..k).map(|j| 0.5 * j as f64 * PI.ln() + ln_gamma(eta + 0.5 * (km1 - j as f64))).sum::<f64>()
        },
        |eta| {
            let mut c = ln_gamma_tensor(eta.clone().add_scalar(0.5 * km1)).mul_scalar(km1);
            for j in 1..k {
                let jf = j as f64;
                c = c - ln_gamma_tensor(eta.clone().add_scalar(0.5 * (km1 - jf))).add_scalar(0.5 * jf * PI.ln());
            }
            c
        },
    )
}

/// Stan's `lkj_corr(Omega | eta)` on correlation matrices `[n, K, K]`: `c_K(eta) + (eta - 1)
/// ln det Omega` with [`LkjCorrCholesky`]'s constant, `ln det Omega` from one batched Cholesky
/// factorisation. A matrix that is not positive definite gives `-inf`; that the diagonal is 1
/// is the `corr_matrix` constraint's business, not checked here (as Stan's `target +=` form).
#[derive(Clone, Debug)]
pub struct LkjCorr {
    eta: Param<1>,
}

impl LkjCorr {
    /// `LkjCorr(eta)`; a scalar `eta` must be finite and positive, a tensor one is `[n]`.
    pub fn new(eta: impl Into<Param<1>>) -> Result<Self, ModelError> {
        Ok(Self { eta: eta.into().check_positive("lkj_corr", "eta")? })
    }

    /// The log-density of each correlation matrix in `omega` `[n, K, K]` (its lower triangle
    /// is read): `[n]`.
    ///
    /// # Errors
    /// If `omega` is not a batch of non-empty square matrices.
    pub fn log_prob(&self, omega: Tensor<3>) -> Result<Tensor<1>, ModelError> {
        let [n, k, _] = omega.dims();
        let (l, singular) = factor_named("lkj_corr", "Omega", omega)?;
        let log_det = diagonal(l).clamp_min(f32::MIN_POSITIVE).log().sum_dim(1).reshape([n]).mul_scalar(2.0);
        let scaled = match &self.eta {
            Param::Scalar(eta) => log_det.mul_scalar(eta - 1.0),
            Param::Tensor(eta) => log_det * (**eta).clone().sub_scalar(1.0),
        };
        let lp = lkj_constant(&self.eta, k).add_to(scaled);
        let n = lp.dims()[0];
        Ok(lp.mask_fill(singular.expand([n]), f32::NEG_INFINITY))
    }
}

const NAME: &str = "multi_normal_cholesky";

/// `y ~ multi_normal_cholesky(mu, L)` for every particle: mean `mu` `[n, K]` (or zero) and lower
/// Cholesky factor `l` `[n, K, K]` of the covariance `L L^T` (a batch of one is shared).
///
/// `log p(y) = -K/2 log(2 pi) - sum_i log L_ii - |L^-1 (y - mu)|^2 / 2` per vector, from one
/// triangular solve (Stan math, `prim/prob/multi_normal_cholesky_lpdf.hpp`). `L` is taken as a
/// Cholesky factor (positive diagonal, e.g. from [`crate::linalg::cholesky`]): the upper
/// triangle is not read, and a non-positive diagonal entry gives NaN.
#[derive(Clone, Debug)]
pub struct MultiNormalCholesky {
    /// `[n, K]`, or `None` for a zero mean.
    mu: Option<Tensor<2>>,
    /// `[n, K, K]`
    l: Tensor<3>,
}

impl MultiNormalCholesky {
    /// The distribution with mean `mu` `[n, K]` (`None`: zero) and factor `l` `[n, K, K]`.
    ///
    /// # Errors
    /// If `l` is not a batch of non-empty square matrices, or `mu` is not `[n, K]` for them
    /// (`n` may be one on either side).
    pub fn new(mu: Option<Tensor<2>>, l: Tensor<3>) -> Result<Self, ModelError> {
        let [nl, k, k2] = l.dims();
        if k != k2 || k == 0 {
            return Err(invalid("L", format!("must be [n, K, K] with K > 0, got [{nl}, {k}, {k2}]")));
        }
        if let Some(mu) = &mu {
            let [nm, km] = mu.dims();
            if km != k || (nm != nl && nm != 1 && nl != 1) {
                return Err(invalid("mu", format!("is [{nm}, {km}] against L [{nl}, {k}, {k}]")));
            }
        }
        Ok(Self { mu, l })
    }

    /// The dimension `K`.
    pub fn dim(&self) -> usize {
        self.l.dims()[1]
    }

    /// The particles in the parameters (the larger batch of `mu` and `L`).
    fn batch(&self) -> usize {
        let nl = self.l.dims()[0];
        self.mu.as_ref().map_or(nl, |mu| mu.dims()[0].max(nl))
    }

    /// `log p(y_i)` for one vector per particle, `y` `[n, K]` (or `[1, K]` shared): `[n]`.
    ///
    /// # Errors
    /// If `y` does not have `K` columns, or its rows are neither one nor the particles'.
    pub fn log_prob(&self, y: Tensor<2>) -> Result<Tensor<1>, ModelError> {
        let [ny, ky] = y.dims();
        let (n, k) = (self.batch(), self.dim());
        if ky != k || (ny != n && ny != 1 && n != 1) {
            return Err(invalid("y", format!("is [{ny}, {ky}] against {n} particles of dimension {k}")));
        }
        let n = n.max(ny);
        let r = match &self.mu {
            Some(mu) => y - mu.clone(),
            None => y,
        };
        let rows = r.dims()[0];
        let r = r.reshape([rows, k, 1]);
        self.log_prob_residuals(r, n, 1)
    }

    /// `sum_r log p(y_r)` over the `m` rows of data `y` `[m, K]` shared by all particles: `[n]`.
    /// A single vector `[K]` is `y.unsqueeze()`.
    ///
    /// # Errors
    /// If `y` does not have `K` columns or has no rows.
    pub fn log_prob_data(&self, y: Tensor<2>) -> Result<Tensor<1>, ModelError> {
        let [m, ky] = y.dims();
        let (n, k) = (self.batch(), self.dim());
        if ky != k || m == 0 {
            return Err(invalid("y", format!("is [{m}, {ky}]: needs rows of dimension {k}")));
        }
        // Residuals as columns, [n, K, m]: one solve for every row of every particle.
        let yt = y.transpose().unsqueeze::<3>(); // [1, K, m]
        let r = match &self.mu {
            Some(mu) => {
                let nm = mu.dims()[0];
                yt - mu.clone().reshape([nm, k, 1])
            }
            None => yt,
        };
        self.log_prob_residuals(r, n, m)
    }

    /// The log-density summed over the `m` residual columns of `r` `[n or 1, K, m]`.
    fn log_prob_residuals(&self, r: Tensor<3>, n: usize, m: usize) -> Result<Tensor<1>, ModelError> {
        let k = self.dim();
        let z = triangular_solve(self.l.clone(), r, Triangle::Lower, false)?; // [n, K, m]
        let quad = z.square().sum_dim(2).sum_dim(1).reshape([n]);
        let nl = self.l.dims()[0];
        let log_det_half = diagonal(self.l.clone()).log().sum_dim(1).reshape([nl]);
        let log_det_half = if nl == n { log_det_half } else { log_det_half.expand([n]) };
        // m K / 2 log(2 pi) + m sum_i log L_ii + |z|^2 / 2
        let constant = 0.5 * (m * k) as f64 * (2.0 * std::f64::consts::PI).ln();
        Ok((log_det_half.mul_scalar(m as f64) + quad.mul_scalar(0.5)).neg().sub_scalar(constant))
    }
}

fn invalid(name: &'static str, reason: String) -> ModelError {
    ModelError::InvalidParameter { dist: NAME, name, reason }
}

/// A batch of covariance matrices factored once: the factors, and which are not positive
/// definite (their densities are `-inf`).
fn factor(dist: &'static str, sigma: Tensor<3>) -> Result<(Tensor<3>, Tensor<1, Bool>), ModelError> {
    factor_named(dist, "Sigma", sigma)
}

/// [`factor`] of a matrix argument called `name`.
fn factor_named(
    dist: &'static str,
    name: &'static str,
    sigma: Tensor<3>,
) -> Result<(Tensor<3>, Tensor<1, Bool>), ModelError> {
    let [n, k, k2] = sigma.dims();
    if k != k2 || k == 0 {
        return Err(bad(dist, name, format!("must be [n, K, K] with K > 0, got [{n}, {k}, {k2}]")));
    }
    let (l, pivots) = crate::linalg::cholesky(sigma)?;
    // `> 0` is false for a NaN pivot too.
    Ok((l, pivots.greater_elem(0.0).bool_not()))
}

/// Stan's `multi_normal(mu, Sigma)` with a full covariance `Sigma` `[n, K, K]` per particle:
/// one batched Cholesky factorisation ([`crate::linalg::cholesky`], one autodiff node), then
/// [`MultiNormalCholesky`]. A `Sigma` that is not positive definite gives that particle `-inf`.
#[derive(Clone, Debug)]
pub struct MultiNormal {
    inner: MultiNormalCholesky,
    /// `[n]`: the particles whose `Sigma` is not positive definite.
    singular: Tensor<1, Bool>,
}

impl MultiNormal {
    /// Mean `mu` `[n, K]` (`None`: zero) and covariance `sigma` `[n, K, K]` (its lower triangle
    /// is read; a batch of one is shared).
    ///
    /// # Errors
    /// If the shapes do not fit.
    pub fn new(mu: Option<Tensor<2>>, sigma: Tensor<3>) -> Result<Self, ModelError> {
        let (l, singular) = factor("multi_normal", sigma)?;
        Ok(Self { inner: MultiNormalCholesky::new(mu, l)?, singular })
    }

    fn mask(&self, lp: Tensor<1>) -> Tensor<1> {
        let n = lp.dims()[0];
        lp.mask_fill(self.singular.clone().expand([n]), f32::NEG_INFINITY)
    }

    /// `log p(y_i)` for one vector per particle, `y` `[n, K]` (or `[1, K]` shared): `[n]`.
    ///
    /// # Errors
    /// As [`MultiNormalCholesky::log_prob`].
    pub fn log_prob(&self, y: Tensor<2>) -> Result<Tensor<1>, ModelError> {
        Ok(self.mask(self.inner.log_prob(y)?))
    }

    /// `sum_r log p(y_r)` over the rows of data `y` `[m, K]`: `[n]`.
    ///
    /// # Errors
    /// As [`MultiNormalCholesky::log_prob_data`].
    pub fn log_prob_data(&self, y: Tensor<2>) -> Result<Tensor<1>, ModelError> {
        Ok(self.mask(self.inner.log_prob_data(y)?))
    }
}

/// Stan's `multi_student_t(nu, mu, Sigma)`: with `q = (y - mu)^T Sigma^-1 (y - mu)`,
/// `ln Gamma((nu + K) / 2) - ln Gamma(nu / 2) - K/2 ln(nu pi) - 1/2 ln|Sigma| - (nu + K)/2
/// ln(1 + q / nu)`, from one batched Cholesky factorisation and one triangular solve; the
/// log-gamma difference from [`ln_gamma_ratio_tensor`] for a tensor `nu`. A `Sigma` that is not
/// positive definite gives that particle `-inf`.
#[derive(Clone, Debug)]
pub struct MultiStudentT {
    nu: Param<1>,
    mu: Option<Tensor<2>>,
    l: Tensor<3>,
    singular: Tensor<1, Bool>,
}

impl MultiStudentT {
    /// Degrees of freedom `nu` (a finite positive scalar, or `[n]`), mean `mu` `[n, K]`
    /// (`None`: zero), scale matrix `sigma` `[n, K, K]`.
    ///
    /// # Errors
    /// If a scalar `nu` is not finite and positive, or the shapes do not fit.
    pub fn new(nu: impl Into<Param<1>>, mu: Option<Tensor<2>>, sigma: Tensor<3>) -> Result<Self, ModelError> {
        let nu = nu.into().check_positive("multi_student_t", "nu")?;
        let (l, singular) = factor("multi_student_t", sigma)?;
        // Shapes checked as the normal's are.
        let checked = MultiNormalCholesky::new(mu, l)?;
        Ok(Self { nu, mu: checked.mu, l: checked.l, singular })
    }

    /// Stan's `multi_student_t_cholesky(nu, mu, L)`: the scale matrix given by its lower
    /// Cholesky factor `l` `[n, K, K]` (the upper triangle is not read), no factorisation. A
    /// factor with a diagonal entry `<= 0` gives that particle `-inf`.
    ///
    /// # Errors
    /// If a scalar `nu` is not finite and positive, or the shapes do not fit.
    pub fn from_cholesky(nu: impl Into<Param<1>>, mu: Option<Tensor<2>>, l: Tensor<3>) -> Result<Self, ModelError> {
        let nu = nu.into().check_positive("multi_student_t_cholesky", "nu")?;
        let checked = MultiNormalCholesky::new(mu, l)?;
        let nl = checked.l.dims()[0];
        let singular = diagonal(checked.l.clone()).min_dim(1).reshape([nl]).lower_equal_elem(0.0);
        Ok(Self { nu, mu: checked.mu, l: checked.l.tril(0), singular })
    }

    /// `log p(y_i)` for one vector per particle, `y` `[n, K]` (or `[1, K]` shared): `[n]`.
    ///
    /// # Errors
    /// If `y` does not have `K` columns, or its rows are neither one nor the particles'.
    pub fn log_prob(&self, y: Tensor<2>) -> Result<Tensor<1>, ModelError> {
        let [nl, k, _] = self.l.dims();
        let [ny, ky] = y.dims();
        let nm = self.mu.as_ref().map_or(nl, |m| m.dims()[0]);
        let n = nl.max(ny).max(nm);
        if ky != k || [nl, ny, nm].iter().any(|&r| r != n && r != 1) {
            return Err(bad("multi_student_t", "y", format!("is [{ny}, {ky}] against {n} particles of dimension {k}")));
        }
        let r = match &self.mu {
            Some(mu) => y - mu.clone(),
            None => y,
        };
        let rows = r.dims()[0];
        let z = triangular_solve(self.l.clone(), r.reshape([rows, k, 1]), Triangle::Lower, false)?;
        let rows = z.dims()[0];
        let quad = z.square().sum_dim(1).reshape([rows]);
        let log_det_half = diagonal(self.l.clone()).log().sum_dim(1).reshape([nl]);
        let kf = k as f64;
        let quad = if rows == n { quad } else { quad.expand([n]) };
        let log_det_half = if nl == n { log_det_half } else { log_det_half.expand([n]) };
        // (nu + K)/2 ln(1 + q / nu) and the normalising constant, scalar or per particle.
        let lp = match &self.nu {
            Param::Scalar(nu) => {
                let c = ln_gamma(0.5 * (nu + kf)) - ln_gamma(0.5 * nu) - 0.5 * kf * (nu * PI).ln();
                quad.div_scalar(*nu).log1p().mul_scalar(-0.5 * (nu + kf)).add_scalar(c)
            }
            Param::Tensor(nu) => {
                let nu = (**nu).clone();
                let half = nu.clone().mul_scalar(0.5);
                let c = ln_gamma_ratio_tensor(half.clone(), lift(0.5 * kf, &half))
                    - nu.clone().mul_scalar(PI).log().mul_scalar(0.5 * kf);
                c - (quad / nu.clone()).log1p() * nu.add_scalar(kf).mul_scalar(0.5)
            }
        };
        let lp = lp - log_det_half;
        let n = lp.dims()[0];
        Ok(lp.mask_fill(self.singular.clone().expand([n]), f32::NEG_INFINITY))
    }
}

/// Stan's `multi_normal_prec(mu, Omega)` with a precision matrix `Omega` `[n, K, K]` per
/// particle: `-K/2 ln(2 pi) + 1/2 ln|Omega| - 1/2 (y - mu)^T Omega (y - mu)`, from one batched
/// Cholesky factorisation `Omega = L L^T` (`ln|Omega| = 2 sum ln L_ii`, the quadratic form
/// `|L^T (y - mu)|^2`: a product, no solve). An `Omega` that is not positive definite gives
/// that particle `-inf`.
#[derive(Clone, Debug)]
pub struct MultiNormalPrec {
    mu: Option<Tensor<2>>,
    /// `[n, K, K]`: the factor of `Omega`.
    l: Tensor<3>,
    singular: Tensor<1, Bool>,
}

impl MultiNormalPrec {
    /// Mean `mu` `[n, K]` (`None`: zero) and precision `omega` `[n, K, K]` (its lower triangle
    /// is read; a batch of one is shared).
    ///
    /// # Errors
    /// If the shapes do not fit.
    pub fn new(mu: Option<Tensor<2>>, omega: Tensor<3>) -> Result<Self, ModelError> {
        let (l, singular) = factor_named("multi_normal_prec", "Omega", omega)?;
        let checked = MultiNormalCholesky::new(mu, l)?;
        Ok(Self { mu: checked.mu, l: checked.l, singular })
    }

    /// `log p(y_i)` for one vector per particle, `y` `[n, K]` (or `[1, K]` shared): `[n]`.
    ///
    /// # Errors
    /// If `y` does not have `K` columns, or its rows are neither one nor the particles'.
    pub fn log_prob(&self, y: Tensor<2>) -> Result<Tensor<1>, ModelError> {
        let [nl, k, _] = self.l.dims();
        let [ny, ky] = y.dims();
        let nm = self.mu.as_ref().map_or(nl, |m| m.dims()[0]);
        let n = nl.max(ny).max(nm);
        if ky != k || [nl, ny, nm].iter().any(|&r| r != n && r != 1) {
            return Err(bad(
                "multi_normal_prec",
                "y",
                format!("is [{ny}, {ky}] against {n} particles of dimension {k}"),
            ));
        }
        let r = match &self.mu {
            Some(mu) => y - mu.clone(),
            None => y,
        };
        let rows = r.dims()[0];
        let r = r.reshape([rows, k, 1]);
        let r = if rows == n { r } else { r.expand([n, k, 1]) };
        let lt = self.l.clone().swap_dims(1, 2);
        let lt = if nl == n { lt } else { lt.expand([n, k, k]) };
        let quad = lt.matmul(r).square().sum_dim(1).reshape([n]);
        let log_det_half = diagonal(self.l.clone()).log().sum_dim(1).reshape([nl]);
        let log_det_half = if nl == n { log_det_half } else { log_det_half.expand([n]) };
        let lp = log_det_half - quad.mul_scalar(0.5);
        let lp = lp.sub_scalar(0.5 * k as f64 * (2.0 * PI).ln());
        Ok(lp.mask_fill(self.singular.clone().expand([n]), f32::NEG_INFINITY))
    }
}

/// The multivariate log-gamma function `ln Gamma_K(x) = K (K - 1) / 4 ln pi + sum_{j=0}^{K-1}
/// ln Gamma(x - j / 2)` (Stan's `lmgamma`), for a scalar (on the host) or a tensor
/// ([`crate::functions::lmgamma`]).
fn lmgamma_param(k: usize, x: &Param<1>) -> Param<1> {
    let c = 0.25 * (k * k.saturating_sub(1)) as f64 * PI.ln();
    x.map(|v| c + (0..k).map(|j| ln_gamma(v - 0.5 * j as f64)).sum::<f64>(), |t| crate::functions::lmgamma(k, t))
}

/// `K ln 2 (1 - nu / 2) - ln Gamma_K(nu / 2)`, the Wishart family's normalising constant with
/// the Jacobian's `2^K`.
fn wishart_constant(nu: &Param<1>, k: usize) -> Param<1> {
    let ln2k = k as f64 * std::f64::consts::LN_2;
    let half = nu.map(|v| 0.5 * v, |t| t.mul_scalar(0.5));
    let lmg = lmgamma_param(k, &half);
    half.zip(&lmg, |h, g| ln2k * (1.0 - h) - g, |h, g| h.neg().add_scalar(1.0).mul_scalar(ln2k) - g)
}

/// `ln 2^K prod_i L_ii^(K - i)` (0-based `i`): the log-Jacobian of `L -> W = L L^T` on lower
/// Cholesky factors `[n, K, K]`, `[n]`.
fn cholesky_jacobian(l: Tensor<3>) -> Tensor<1> {
    let [n, k, _] = l.dims();
    let d = diagonal(l).clamp_min(f32::MIN_POSITIVE).log();
    let powers: Vec<f64> = (0..k).map(|i| (k - i) as f64).collect();
    let powers = Tensor::<2>::from_data(TensorData::new(powers, [1, k]), (&d.device(), d.dtype()));
    (d * powers).sum_dim(1).reshape([n]).add_scalar(k as f64 * std::f64::consts::LN_2)
}

/// Which of the Wishart family a [`WishartFamily`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WishartKind {
    Wishart,
    Inverse,
}

/// The shared part of Stan's `wishart_cholesky` and `inv_wishart_cholesky` (Stan math,
/// `prim/prob/wishart_cholesky_lpdf.hpp`, `inv_wishart_cholesky_lpdf.hpp`): the density of a
/// lower Cholesky factor `L_W` of `W` for a scale matrix `S = L_S L_S^T`, degrees of freedom
/// `nu > K - 1`:
///
/// - Wishart: `K ln 2 (1 - nu/2) - ln Gamma_K(nu/2) - |L_S^-1 L_W|_F^2 / 2 - nu sum ln (L_S)_ii
///   + sum_i (nu - 1 - i) ln (L_W)_ii` (0-based `i`);
/// - inverse Wishart: `K ln 2 (1 - nu/2) - ln Gamma_K(nu/2) - |L_W^-1 L_S|_F^2 / 2 + nu sum ln
///   (L_S)_ii - sum_i (nu + 1 + i) ln (L_W)_ii`,
///
/// that is, the density of `W = L_W L_W^T` times the Jacobian `2^K prod_i (L_W)_ii^(K - i)` of
/// `L_W -> W`. One triangular solve for all particles.
#[derive(Clone, Debug)]
struct WishartFamily {
    dist: &'static str,
    kind: WishartKind,
    nu: Param<1>,
    /// `[n or 1, K, K]`, lower triangular.
    l_s: Tensor<3>,
    /// `[n or 1]`: particles whose scale matrix is not positive definite.
    singular: Option<Tensor<1, Bool>>,
}

impl WishartFamily {
    fn new(
        dist: &'static str,
        kind: WishartKind,
        nu: Param<1>,
        l_s: Tensor<3>,
        singular: Option<Tensor<1, Bool>>,
    ) -> Result<Self, ModelError> {
        let [ns, k, k2] = l_s.dims();
        if k != k2 || k == 0 {
            return Err(bad(dist, "L_S", format!("must be [n, K, K] with K > 0, got [{ns}, {k}, {k2}]")));
        }
        if let Param::Scalar(v) = nu
            && !(v.is_finite() && v > (k - 1) as f64)
        {
            return Err(bad(dist, "nu", format!("must be finite and > K - 1 = {}, got {v}", k - 1)));
        }
        Ok(Self { dist, kind, nu, l_s: l_s.tril(0), singular })
    }

    /// The log-density of each factor `l_w` `[n, K, K]` (its lower triangle): `[n]`. A factor
    /// with a diagonal entry `<= 0` gives `-inf`.
    fn log_prob(&self, l_w: Tensor<3>) -> Result<Tensor<1>, ModelError> {
        let [ns, k, _] = self.l_s.dims();
        let [nw, kw, kw2] = l_w.dims();
        if kw != k || kw2 != k || (nw != ns && nw != 1 && ns != 1) {
            return Err(bad(self.dist, "L_W", format!("is [{nw}, {kw}, {kw2}] against L_S [{ns}, {k}, {k}]")));
        }
        let l_w = l_w.tril(0);
        let n = nw.max(ns);
        if let Param::Tensor(nu) = &self.nu
            && nu.dims()[0] != n
            && nu.dims()[0] != 1
        {
            return Err(bad(self.dist, "nu", format!("is [{}] against {n} particles", nu.dims()[0])));
        }
        let z = match self.kind {
            WishartKind::Wishart => triangular_solve(self.l_s.clone(), l_w.clone(), Triangle::Lower, false)?,
            WishartKind::Inverse => triangular_solve(l_w.clone(), self.l_s.clone(), Triangle::Lower, false)?,
        };
        let frobenius = z.tril(0).square().sum_dim(2).sum_dim(1).reshape([n]);
        let diag_w = diagonal(l_w);
        let outside = diag_w.clone().min_dim(1).reshape([nw]).lower_equal_elem(0.0);
        let ln_w = diag_w.clamp_min(f32::MIN_POSITIVE).log(); // [nw, K]
        let steps: Vec<f64> = (0..k).map(|i| 1.0 + i as f64).collect();
        let steps = Tensor::<2>::from_data(TensorData::new(steps, [1, k]), (&ln_w.device(), ln_w.dtype()));
        // sum_i (1 + i) ln (L_W)_ii, and the two sums of logs that nu multiplies.
        let stepped = (ln_w.clone() * steps).sum_dim(1).reshape([nw]);
        let sum_w = ln_w.sum_dim(1).reshape([nw]);
        let sum_s = diagonal(self.l_s.clone()).log().sum_dim(1).reshape([ns]);
        let sign = if self.kind == WishartKind::Wishart { 1.0 } else { -1.0 };
        // sign nu (sum ln L_W - sum ln L_S) - sum (1 + i) ln L_W - |Z|^2 / 2
        let logs = (sum_w - sum_s).mul_scalar(sign);
        let nu_logs = match &self.nu {
            Param::Scalar(v) => logs.mul_scalar(*v),
            Param::Tensor(t) => logs * (**t).clone(),
        };
        let lp = wishart_constant(&self.nu, k).add_to(nu_logs - stepped - frobenius.mul_scalar(0.5));
        let mut lp = lp.mask_fill(outside.expand([n]), f32::NEG_INFINITY);
        if let Some(singular) = &self.singular {
            lp = lp.mask_fill(singular.clone().expand([n]), f32::NEG_INFINITY);
        }
        Ok(lp)
    }
}

macro_rules! wishart_cholesky_type {
    ($name:ident, $stan:literal, $kind:expr, $doc:literal) => {
        #[doc = $doc]
        #[derive(Clone, Debug)]
        pub struct $name {
            family: WishartFamily,
        }

        impl $name {
            /// Degrees of freedom `nu` (a scalar, finite and `> K - 1`, or `[n]`) and the lower
            /// Cholesky factor `l_s` `[n, K, K]` of the scale matrix (a batch of one is shared;
            /// the upper triangle is not read).
            ///
            /// # Errors
            /// If a scalar `nu` is outside its support, or `l_s` is not a batch of square matrices.
            pub fn new(nu: impl Into<Param<1>>, l_s: Tensor<3>) -> Result<Self, ModelError> {
                Ok(Self { family: WishartFamily::new($stan, $kind, nu.into(), l_s, None)? })
            }

            /// The log-density of each lower Cholesky factor `l_w` `[n, K, K]`: `[n]`. A factor
            /// with a diagonal entry `<= 0` gives `-inf`.
            ///
            /// # Errors
            /// If the shapes do not fit.
            pub fn log_prob(&self, l_w: Tensor<3>) -> Result<Tensor<1>, ModelError> {
                self.family.log_prob(l_w)
            }
        }
    };
}

wishart_cholesky_type!(
    WishartCholesky,
    "wishart_cholesky",
    WishartKind::Wishart,
    "Stan's `wishart_cholesky(L_W | nu, L_S)`: the density of the lower Cholesky factor `L_W` of \
     a Wishart matrix `W = L_W L_W^T ~ wishart(nu, L_S L_S^T)`, `K ln 2 (1 - nu/2) - \
     ln Gamma_K(nu/2) - |L_S^-1 L_W|_F^2 / 2 - nu sum_i ln (L_S)_ii + sum_i (nu - 1 - i) \
     ln (L_W)_ii` (0-based `i`; Stan math's `wishart_cholesky_lpdf`), from one batched \
     triangular solve."
);

wishart_cholesky_type!(
    InvWishartCholesky,
    "inv_wishart_cholesky",
    WishartKind::Inverse,
    "Stan's `inv_wishart_cholesky(L_W | nu, L_S)`: the density of the lower Cholesky factor \
     `L_W` of an inverse-Wishart matrix `W = L_W L_W^T ~ inv_wishart(nu, L_S L_S^T)`, \
     `K ln 2 (1 - nu/2) - ln Gamma_K(nu/2) - |L_W^-1 L_S|_F^2 / 2 + nu sum_i ln (L_S)_ii - \
     sum_i (nu + 1 + i) ln (L_W)_ii` (Stan math's `inv_wishart_cholesky_lpdf`)."
);

macro_rules! wishart_type {
    ($name:ident, $stan:literal, $kind:expr, $doc:literal) => {
        #[doc = $doc]
        #[derive(Clone, Debug)]
        pub struct $name {
            family: WishartFamily,
        }

        impl $name {
            /// Degrees of freedom `nu` (a scalar, finite and `> K - 1`, or `[n]`) and the scale
            /// matrix `sigma` `[n, K, K]` (its lower triangle is read; a batch of one is shared),
            /// factored once here. A scale matrix that is not positive definite gives its
            /// particles `-inf`.
            ///
            /// # Errors
            /// If a scalar `nu` is outside its support, or `sigma` is not a batch of square matrices.
            pub fn new(nu: impl Into<Param<1>>, sigma: Tensor<3>) -> Result<Self, ModelError> {
                let (l_s, singular) = factor_named($stan, "Sigma", sigma)?;
                Ok(Self { family: WishartFamily::new($stan, $kind, nu.into(), l_s, Some(singular))? })
            }

            /// The log-density of each matrix `w` `[n, K, K]` (its lower triangle is read), from
            /// one batched Cholesky factorisation: the factor's density less the log-Jacobian of
            /// `L -> L L^T`. A `w` that is not positive definite gives `-inf`.
            ///
            /// # Errors
            /// If the shapes do not fit.
            pub fn log_prob(&self, w: Tensor<3>) -> Result<Tensor<1>, ModelError> {
                let (l_w, singular) = factor_named($stan, "W", w)?;
                let lp = self.family.log_prob(l_w.clone())? - cholesky_jacobian(l_w);
                let n = lp.dims()[0];
                Ok(lp.mask_fill(singular.expand([n]), f32::NEG_INFINITY))
            }
        }
    };
}

wishart_type!(
    Wishart,
    "wishart",
    WishartKind::Wishart,
    "Stan's `wishart(W | nu, Sigma)`: `(nu - K - 1)/2 ln|W| - tr(Sigma^-1 W)/2 - nu K/2 ln 2 - \
     nu/2 ln|Sigma| - ln Gamma_K(nu/2)` on symmetric positive-definite `W`, through \
     [`WishartCholesky`] on `W`'s factor."
);

wishart_type!(
    InvWishart,
    "inv_wishart",
    WishartKind::Inverse,
    "Stan's `inv_wishart(W | nu, Sigma)`: `nu/2 ln|Sigma| - (nu + K + 1)/2 ln|W| - \
     tr(Sigma W^-1)/2 - nu K/2 ln 2 - ln Gamma_K(nu/2)`, through [`InvWishartCholesky`] on `W`'s \
     factor."
);
