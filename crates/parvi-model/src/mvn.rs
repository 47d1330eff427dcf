//! The multivariate normal parameterised by a Cholesky factor of its covariance, batched over
//! particles: Stan's `multi_normal_cholesky_lpdf`, with its constants.

use burn::tensor::Tensor;

use crate::ModelError;
use crate::linalg::{Triangle, diagonal, triangular_solve};

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
