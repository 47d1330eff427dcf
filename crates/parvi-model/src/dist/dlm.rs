//! Gaussian processes over matrices and Gaussian dynamic linear models: Stan's `multi_gp`,
//! `multi_gp_cholesky` and `gaussian_dlm_obs`, batched over particles.

use burn::tensor::{Bool, Tensor};

use super::{LN_2PI, bad};
use crate::ModelError;
use crate::linalg::{Triangle, cholesky, log_det_from_cholesky, triangular_solve};

/// The batch that the arguments' batches (each 1 or `n`) broadcast to, `n` being the first that
/// is not 1; else the first argument whose batch is neither, with its batch and `n`.
fn common_batch(parts: &[(&'static str, usize)]) -> Result<usize, (&'static str, usize, usize)> {
    let n = parts.iter().map(|p| p.1).find(|&b| b != 1).unwrap_or(1);
    match parts.iter().find(|p| p.1 != 1 && p.1 != n) {
        Some(&(name, b)) => Err((name, b, n)),
        None => Ok(n),
    }
}

fn expand3(t: Tensor<3>, n: usize) -> Tensor<3> {
    let [b, r, c] = t.dims();
    if b == n { t } else { t.expand([n, r, c]) }
}

/// A batch of diagonal matrices `[n, K, K]` from their diagonals `[n, K]`.
fn diag_matrix(v: Tensor<2>) -> Tensor<3> {
    let [n, k] = v.dims();
    let eye = Tensor::<2>::eye(k, &v.device()).cast(v.dtype()).unsqueeze::<3>();
    v.reshape([n, k, 1]) * eye
}

/// `sum_i log L_ii = log det(L L^T) / 2` of a batch of Cholesky factors `[n, K, K]`: `[n]`.
fn half_log_det(l: Tensor<3>) -> Tensor<1> {
    log_det_from_cholesky(l).mul_scalar(0.5)
}

/// Stan's `multi_gp(y | Sigma, w)` and `multi_gp_cholesky(y | L, w)`: the `K` rows of `y`
/// (`K x N`) independent, row `i` `N(0, Sigma / w_i)`. With `Sigma = L L^T` and `z_i = L^-1 y_i`,
/// `log p = -K N/2 log(2 pi) - K sum_j log L_jj + N/2 sum_i log w_i - 1/2 sum_i w_i |z_i|^2`
/// (Stan Functions Reference, "Multivariate Gaussian process distribution"): one batched
/// Cholesky (for `multi_gp`) and one triangular solve for all rows. A `Sigma` that is not
/// positive definite, or a `w_i <= 0`, gives that particle `-inf`.
#[derive(Clone, Debug)]
pub struct MultiGp {
    /// `[n or 1, N, N]`, the Cholesky factor of the kernel matrix.
    l: Tensor<3>,
    /// `[n or 1, K]`, the inverse scales.
    w: Tensor<2>,
    /// `[n or 1]`: the particles whose `Sigma` is not positive definite.
    singular: Option<Tensor<1, Bool>>,
    name: &'static str,
}

impl MultiGp {
    /// `multi_gp(Sigma, w)`: kernel matrices `sigma` `[n, N, N]` (lower triangle read) and inverse
    /// scales `w` `[n, K]`; a batch of one on either side is shared.
    ///
    /// # Errors
    /// If `sigma` is not a batch of non-empty square matrices, `w` has no columns, or the
    /// batches differ (and neither is one).
    pub fn new(sigma: Tensor<3>, w: Tensor<2>) -> Result<Self, ModelError> {
        const NAME: &str = "multi_gp";
        let [_, k, k2] = sigma.dims();
        if k != k2 || k == 0 {
            return Err(bad(NAME, "Sigma", format!("must be [n, N, N] with N > 0, got {:?}", sigma.dims())));
        }
        let (l, pivots) = cholesky(sigma)?;
        let singular = pivots.greater_elem(0.0).bool_not();
        Self::build(NAME, l, w, Some(singular))
    }

    /// `multi_gp_cholesky(L, w)`: the kernel's Cholesky factors `l` `[n, N, N]` (lower triangle
    /// read, positive diagonal) and inverse scales `w` `[n, K]`.
    ///
    /// # Errors
    /// As [`MultiGp::new`].
    pub fn from_cholesky(l: Tensor<3>, w: Tensor<2>) -> Result<Self, ModelError> {
        const NAME: &str = "multi_gp_cholesky";
        let [_, k, k2] = l.dims();
        if k != k2 || k == 0 {
            return Err(bad(NAME, "L", format!("must be [n, N, N] with N > 0, got {:?}", l.dims())));
        }
        Self::build(NAME, l, w, None)
    }

    fn build(
        name: &'static str,
        l: Tensor<3>,
        w: Tensor<2>,
        singular: Option<Tensor<1, Bool>>,
    ) -> Result<Self, ModelError> {
        let [nw, kw] = w.dims();
        if kw == 0 {
            return Err(bad(name, "w", "has no entries: needs one inverse scale per row of y"));
        }
        common_batch(&[("L", l.dims()[0]), ("w", nw)])
            .map_err(|(arg, b, n)| bad(name, arg, format!("has a batch of {b} against {n}")))?;
        Ok(Self { l, w, singular, name })
    }

    /// `log p(y)` for `y` `[n or 1, K, N]` (data: `y.unsqueeze()` of a `[K, N]` matrix): `[n]`.
    ///
    /// # Errors
    /// If `y` is not `K x N` for this kernel and these scales, or its batch does not broadcast.
    pub fn log_prob(&self, y: Tensor<3>) -> Result<Tensor<1>, ModelError> {
        let [ny, k, big_n] = y.dims();
        let [nl, nk, _] = self.l.dims();
        let [nw, kw] = self.w.dims();
        if k != kw || big_n != nk {
            return Err(bad(self.name, "y", format!("is [{ny}, {k}, {big_n}], needs [n, {kw}, {nk}]")));
        }
        let n = common_batch(&[("y", ny), ("L", nl), ("w", nw)])
            .map_err(|(arg, b, n)| bad(self.name, arg, format!("has a batch of {b} against {n}")))?;
        // The rows of y as columns: [n, N, K], one solve for all.
        let z = triangular_solve(self.l.clone(), expand3(y.swap_dims(1, 2), n), Triangle::Lower, false)?;
        let quad = z.square().sum_dim(1).reshape([n, k]); // |z_i|^2, [n, K]
        let w = if nw == n { self.w.clone() } else { self.w.clone().expand([n, k]) };
        let weighted = (w.clone() * quad).sum_dim(1).reshape([n]).mul_scalar(-0.5);
        let log_w = w.clone().log().sum_dim(1).reshape([n]).mul_scalar(0.5 * big_n as f64);
        let log_det = half_log_det(self.l.clone());
        let log_det = if nl == n { log_det } else { log_det.expand([n]) };
        let lp = weighted + log_w - log_det.mul_scalar(k as f64) - (0.5 * (k * big_n) as f64 * LN_2PI);
        // A non-positive inverse scale is outside the support: -inf, not the NaN of its log.
        let bad_w = w.lower_equal_elem(0.0).any_dim(1).reshape([n]);
        let lp = lp.mask_fill(bad_w, f32::NEG_INFINITY);
        Ok(match &self.singular {
            Some(s) => lp.mask_fill(s.clone().expand([n]), f32::NEG_INFINITY),
            None => lp,
        })
    }
}

/// Stan's `gaussian_dlm_obs(y | F, G, V, W, m0, C0)`: the log-likelihood of the observations
/// `y` (`r x T`) of the Gaussian dynamic linear model
/// `y_t ~ N(F^T theta_t, V)`, `theta_t ~ N(G theta_{t-1}, W)`, `theta_0 ~ N(m0, C0)`
/// (state dimension `k`: `F` is `k x r`, `G`, `W` and `C0` `k x k`, `V` `r x r`), with the
/// latent states integrated out by the Kalman filter, as Stan math's
/// `prim/prob/gaussian_dlm_obs_lpdf.hpp` (West & Harrison 1997, ch. 4): per time point
///
/// ```text
/// a = G m,  R = G C G^T + W,  Q = F^T R F + V,  e = y_t - F^T a,
/// m = a + R F Q^-1 e,  C = R - R F Q^-1 F^T R,  lp -= (log|Q| + e^T Q^-1 e) / 2,
/// ```
///
/// each formed from one batched Cholesky `Q = L L^T` and one triangular solve of `[e, F^T R]`
/// (so `R F Q^-1 e = B^T z` and `R F Q^-1 F^T R = B^T B` with `[z, B] = L^-1 [e, F^T R]`).
///
/// Every argument is batched over particles (`[n, ...]`, or `[1, ...]` shared): a model's
/// variances, its transition or observation matrix. The cost is a loop over time, about a dozen
/// small autodiff nodes per step (the covariance recursion is not linear, so it has no
/// [`crate::scan::linear_scan`]; a local-level model whose `C` reaches its steady state early can
/// be written with that scan instead). A particle whose `Q` stops being positive definite (an
/// indefinite `V`, `W` or `C0`) gets `-inf`.
#[derive(Clone, Debug)]
pub struct GaussianDlmObs {
    /// `[n or 1, k, r]`
    f: Tensor<3>,
    /// `[n or 1, k, k]`
    g: Tensor<3>,
    /// `[n or 1, r, r]`
    v: Tensor<3>,
    /// `[n or 1, k, k]`
    w: Tensor<3>,
    /// `[n or 1, k]`
    m0: Tensor<2>,
    /// `[n or 1, k, k]`
    c0: Tensor<3>,
    /// The particles the arguments broadcast to.
    n: usize,
}

const DLM: &str = "gaussian_dlm_obs";

fn dlm_square(name: &'static str, t: &Tensor<3>, size: usize, what: &str) -> Result<(), ModelError> {
    let [_, a, b] = t.dims();
    if a != size || b != size {
        return Err(bad(DLM, name, format!("is {a} x {b}, must be {size} x {size} ({what})")));
    }
    Ok(())
}

impl GaussianDlmObs {
    /// The model with observation matrix `f` `[n, k, r]`, transition `g` `[n, k, k]`, observation
    /// covariance `v` `[n, r, r]`, state covariance `w` `[n, k, k]`, initial mean `m0` `[n, k]`
    /// and covariance `c0` `[n, k, k]` (Stan's argument order; covariances' lower triangles are
    /// read).
    ///
    /// # Errors
    /// If a shape does not fit `F`'s `k x r` (naming the argument) or the batches do not
    /// broadcast.
    pub fn new(
        f: Tensor<3>,
        g: Tensor<3>,
        v: Tensor<3>,
        w: Tensor<3>,
        m0: Tensor<2>,
        c0: Tensor<3>,
    ) -> Result<Self, ModelError> {
        let [_, k, r] = f.dims();
        if k == 0 || r == 0 {
            return Err(bad(DLM, "F", format!("is {k} x {r}: needs a state and an observation")));
        }
        dlm_square("G", &g, k, "k x k for F's k rows")?;
        dlm_square("V", &v, r, "r x r for F's r columns")?;
        dlm_square("W", &w, k, "k x k for F's k rows")?;
        dlm_square("C0", &c0, k, "k x k for F's k rows")?;
        let [nm, km] = m0.dims();
        if km != k {
            return Err(bad(DLM, "m0", format!("has {km} entries, must have k = {k}")));
        }
        let n = common_batch(&[
            ("F", f.dims()[0]),
            ("G", g.dims()[0]),
            ("V", v.dims()[0]),
            ("W", w.dims()[0]),
            ("m0", nm),
            ("C0", c0.dims()[0]),
        ])
        .map_err(|(arg, b, n)| bad(DLM, arg, format!("has a batch of {b} against {n}")))?;
        Ok(Self { f, g, v, w, m0, c0, n })
    }

    /// Stan's form with a vector `V`: independent observation errors with variances `v` `[n, r]`.
    ///
    /// # Errors
    /// As [`GaussianDlmObs::new`].
    pub fn with_diagonal_v(
        f: Tensor<3>,
        g: Tensor<3>,
        v: Tensor<2>,
        w: Tensor<3>,
        m0: Tensor<2>,
        c0: Tensor<3>,
    ) -> Result<Self, ModelError> {
        Self::new(f, g, diag_matrix(v), w, m0, c0)
    }

    /// `log p(y)` for the observations `y` `[n or 1, r, T]` (data: `y.unsqueeze()` of Stan's
    /// `r x T` matrix): `[n]`.
    ///
    /// # Errors
    /// If `y` does not have `r` rows and at least one time point, or its batch does not
    /// broadcast.
    pub fn log_prob(&self, y: Tensor<3>) -> Result<Tensor<1>, ModelError> {
        let [ny, ry, t_len] = y.dims();
        let [_, k, r] = self.f.dims();
        if ry != r || t_len == 0 {
            return Err(bad(DLM, "y", format!("is {ry} x {t_len}, needs r = {r} rows and a time point")));
        }
        let n = common_batch(&[("y", ny), ("F", self.n)])
            .map_err(|(arg, b, n)| bad(DLM, arg, format!("has a batch of {b} against {n}")))?;
        let f = expand3(self.f.clone(), n);
        let ft = f.clone().swap_dims(1, 2); // [n, r, k]
        let g = expand3(self.g.clone(), n);
        let gt = g.clone().swap_dims(1, 2);
        let (v, w) = (expand3(self.v.clone(), n), expand3(self.w.clone(), n));
        let y = expand3(y, n);
        let nm = self.m0.dims()[0];
        let m0 = if nm == n { self.m0.clone() } else { self.m0.clone().expand([n, k]) };
        let mut m = m0.reshape([n, k, 1]);
        let mut c = expand3(self.c0.clone(), n);
        let mut lp: Option<Tensor<1>> = None;
        let mut singular: Option<Tensor<1, Bool>> = None;
        for step in 0..t_len {
            let a = g.clone().matmul(m); // [n, k, 1]
            let big_r = g.clone().matmul(c).matmul(gt.clone()) + w.clone(); // [n, k, k]
            let ft_r = ft.clone().matmul(big_r.clone()); // [n, r, k]
            let q = ft_r.clone().matmul(f.clone()) + v.clone(); // [n, r, r]
            let (l, pivots) = cholesky(q)?;
            let e = y.clone().narrow(2, step, 1) - ft.clone().matmul(a.clone()); // [n, r, 1]
            let solved = triangular_solve(l.clone(), Tensor::cat(vec![e, ft_r], 2), Triangle::Lower, false)?;
            let z = solved.clone().narrow(2, 0, 1); // L^-1 e, [n, r, 1]
            let b = solved.narrow(2, 1, k); // L^-1 F^T R, [n, r, k]
            let bt = b.clone().swap_dims(1, 2);
            m = a + bt.clone().matmul(z.clone());
            c = big_r - bt.matmul(b);
            let term = half_log_det(l) + z.square().sum_dim(1).reshape([n]).mul_scalar(0.5);
            lp = Some(match lp {
                Some(lp) => lp - term,
                None => term.neg(),
            });
            let not_pd = pivots.greater_elem(0.0).bool_not();
            singular = Some(match singular {
                Some(s) => s.bool_or(not_pd),
                None => not_pd,
            });
        }
        let lp = lp.expect("t_len > 0").sub_scalar(0.5 * (r * t_len) as f64 * LN_2PI);
        Ok(lp.mask_fill(singular.expect("t_len > 0"), f32::NEG_INFINITY))
    }
}
