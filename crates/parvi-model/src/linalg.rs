//! Dense linear algebra below models and engines, batched over a leading particle axis:
//! the Cholesky factorisation and the triangular solve as single autodiff nodes with their own
//! backward pass (burn 0.22 has neither), the log-determinant from a factor, Stan's
//! squared-exponential covariance, and a host-side `f64` Cholesky for small systems.
//!
//! On flex the factorisation, the solve and the factorisation's reverse pass run as native loops
//! over each matrix of the batch; on other backends (and for dtypes other than `f32`/`f64`) they
//! are built from `K` rounds of burn's primitive operations. Either way autodiff records one node
//! per call (`docs/linalg.md` has the timings against the old column-by-column factor).

use burn::backend::Dispatch;
use burn::tensor::Tensor;

use crate::ModelError;
/// Re-exported from [`crate::tensor_ops`], where it lives so that the tensor helpers need nothing
/// from this module (linear algebra builds on the helpers, not the other way round).
pub use crate::tensor_ops::diagonal;

mod flex;
mod gp;
mod ops;

#[doc(hidden)]
pub use flex::set_generic_on_flex;
use ops::{LinalgOps, SolveSpec};

/// The pivot floor of [`cholesky`]: the smallest positive normal `f32`, as in
/// [`batched_cholesky`] before it, so a non-positive pivot leaves a finite factor.
pub const DEFAULT_PIVOT_FLOOR: f64 = f32::MIN_POSITIVE as f64;

fn invalid(dist: &'static str, name: &'static str, reason: String) -> ModelError {
    ModelError::InvalidParameter { dist, name, reason }
}

fn square_dims(op: &'static str, name: &'static str, a: &Tensor<3>) -> Result<(usize, usize), ModelError> {
    let [m, k, k2] = a.dims();
    if k != k2 || k == 0 {
        return Err(invalid(op, name, format!("needs a batch of non-empty square matrices, got [{m}, {k}, {k2}]")));
    }
    Ok((m, k))
}

/// Lower Cholesky factors `l` `[m, K, K]` of the symmetric positive-definite matrices `a`
/// `[m, K, K]` (their lower triangles are read), and each matrix's smallest pivot `[m]` (the
/// squared diagonal of `l` before the square root).
///
/// One autodiff node whose backward pass is Murray's (2016) reverse mode: the unblocked
/// algorithm natively on flex, a product and two triangular solves elsewhere. A pivot `<= 0` means the matrix is not positive definite: it is raised
/// to [`DEFAULT_PIVOT_FLOOR`] so the factor stays finite where the arithmetic allows, and the
/// pivot reports it (NaN entries give a NaN pivot); the factor and its gradient mean nothing for
/// that matrix, so the caller rejects it (a model gives that particle `-inf`, or see
/// [`cholesky_checked`]). No host read.
///
/// # Errors
/// If the matrices are not square or empty.
pub fn cholesky(a: Tensor<3>) -> Result<(Tensor<3>, Tensor<1>), ModelError> {
    cholesky_floored(a, DEFAULT_PIVOT_FLOOR)
}

/// [`cholesky`] with pivots below `floor` raised to `floor` (e.g. a small multiple of the
/// diagonal jitter, as `gp_pois_regr` does); the reported pivots are the unraised ones.
///
/// # Errors
/// If the matrices are not square or empty, or `floor` is not positive and finite.
pub fn cholesky_floored(a: Tensor<3>, floor: f64) -> Result<(Tensor<3>, Tensor<1>), ModelError> {
    let (m, k) = square_dims("cholesky", "a", &a)?;
    let l = cholesky_factor_floored(a.clone(), floor)?;
    // The pivots, A_jj - sum_{k<j} L_jk^2, recomputed off the autodiff backend (a diagnostic,
    // O(m K^2)): a detached tensor's operations still cost a graph node each.
    let (a, lc) = (a.without_autodiff(), l.clone().without_autodiff());
    let pivots = diagonal(a) - lc.tril(-1).square().sum_dim(2).reshape([m, k]);
    Ok((l, pivots.min_dim(1).reshape([m])))
}

/// [`cholesky`]'s factor alone (Stan's `cholesky_decompose` without its check): for a density
/// whose matrices are positive definite by construction, without the pivots' ten-odd
/// operations a call.
///
/// # Errors
/// If the matrices are not square or empty.
pub fn cholesky_factor(a: Tensor<3>) -> Result<Tensor<3>, ModelError> {
    cholesky_factor_floored(a, DEFAULT_PIVOT_FLOOR)
}

/// [`cholesky_floored`]'s factor alone: for a density that needs no pivot (its jitter keeps
/// the matrices positive definite, and the floor keeps the factor finite where rounding does
/// not), without the pivots' ten-odd operations a call.
///
/// # Errors
/// As [`cholesky_floored`].
pub fn cholesky_factor_floored(a: Tensor<3>, floor: f64) -> Result<Tensor<3>, ModelError> {
    square_dims("cholesky", "a", &a)?;
    if !(floor.is_finite() && floor > 0.0) {
        return Err(invalid("cholesky", "floor", format!("must be positive and finite, got {floor}")));
    }
    Ok(Tensor::from_dispatch(<Dispatch as LinalgOps>::cholesky(a.into_dispatch(), floor)))
}

/// [`cholesky`] that reads the pivots back to the host and refuses a matrix that is not
/// positive definite, naming `name`, the matrix's index in the batch and its pivot.
///
/// # Errors
/// As [`cholesky`], and if a pivot is not positive (or is NaN).
pub fn cholesky_checked(a: Tensor<3>, name: &'static str) -> Result<Tensor<3>, ModelError> {
    let (l, pivots) = cholesky(a)?;
    let pivots = crate::tensor_ops::to_vec_f64(&pivots);
    // "Not greater than zero", written so that a NaN pivot fails too.
    let bad = |p: &f64| p.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater);
    if let Some((i, p)) = pivots.iter().enumerate().find(|(_, p)| bad(p)) {
        return Err(invalid(
            "cholesky",
            name,
            format!("matrix {i} of the batch is not positive definite (smallest pivot {p:e})"),
        ));
    }
    Ok(l)
}

/// Cholesky factors of a batch of symmetric matrices `a` `[m, n, n]`: lower-triangular `l` with
/// `l l^T = a`, and the smallest pivot over the whole batch as a `[1]` tensor; [`cholesky`] with
/// the batch's minimum pivot, kept for its callers (SGLD+R's block factorisations).
///
/// # Panics
/// If the matrices are not square or empty.
pub fn batched_cholesky(a: Tensor<3>) -> (Tensor<3>, Tensor<1>) {
    match cholesky(a) {
        Ok((l, pivots)) => (l, pivots.min()),
        Err(e) => panic!("batched_cholesky: {e}"),
    }
}

/// Which triangle of a matrix a [`triangular_solve`] reads (diagonal included; the other
/// triangle is ignored).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Triangle {
    /// The lower triangle, as a Cholesky factor `L`.
    Lower,
    /// The upper triangle.
    Upper,
}

/// `X` `[n, K, M]` with `T X = B`, or `T^T X = B` when `transpose`, for `T` the `triangle` of
/// `t` `[n, K, K]` and `b` `[n, K, M]`; a batch of one on either side is shared by the other's.
///
/// One autodiff node (Giles 2008: `B_bar = T^-T X_bar`, `T_bar = -B_bar X^T` on `T`'s triangle).
///
/// # Errors
/// If `t` is not a batch of square matrices, `b` has another number of rows, or the batches
/// differ (and neither is one).
pub fn triangular_solve(
    t: Tensor<3>,
    b: Tensor<3>,
    triangle: Triangle,
    transpose: bool,
) -> Result<Tensor<3>, ModelError> {
    let (nt, k) = square_dims("triangular_solve", "t", &t)?;
    let [nb, rows, cols] = b.dims();
    if rows != k {
        return Err(invalid("triangular_solve", "b", format!("has {rows} rows for {k} x {k} matrices")));
    }
    let n = match (nt, nb) {
        _ if nt == nb => nt,
        (1, _) => nb,
        (_, 1) => nt,
        _ => {
            return Err(invalid("triangular_solve", "b", format!("batch of {nb} against {nt} matrices")));
        }
    };
    let t = if nt == n { t } else { t.expand([n, k, k]) };
    let b = if nb == n { b } else { b.expand([n, k, cols]) };
    let spec = SolveSpec { lower: triangle == Triangle::Lower, transpose };
    Ok(Tensor::from_dispatch(<Dispatch as LinalgOps>::triangular_solve(t.into_dispatch(), b.into_dispatch(), spec)))
}

/// `log det(L L^T) = 2 sum_i log L_ii` for a batch of Cholesky factors `l` `[n, K, K]`: `[n]`.
/// A non-positive diagonal entry gives NaN (`l` is not a Cholesky factor).
pub fn log_det_from_cholesky(l: Tensor<3>) -> Tensor<1> {
    let [n, _, _] = l.dims();
    diagonal(l).log().sum_dim(1).reshape([n]).mul_scalar(2.0)
}

/// Stan's `gp_exp_quad_cov`: `alpha^2 exp(-|x_i - x_j|^2 / (2 rho^2))` for the data points `x`
/// (`[N]`, or `[N, D]` with one point a row) and per-particle magnitudes `alpha` and length
/// scales `rho` `[n, 1]`: `[n, N, N]`.
///
/// The squared distances are summed from coordinate differences (exact zero on the diagonal,
/// never negative), once for all particles; the covariance is one autodiff node whose backward
/// reuses it (no second `exp` over `[n, N, N]`).
///
/// # Errors
/// If `x` has more than two axes or no points, or `alpha` and `rho` are not `[n, 1]` with one `n`.
pub fn exp_quad_cov<const D: usize>(x: Tensor<D>, alpha: Tensor<2>, rho: Tensor<2>) -> Result<Tensor<3>, ModelError> {
    let (sq, _) = kernel_inputs("gp_exp_quad_cov", x, &alpha, &rho)?;
    // One node with its own backward (`linalg/gp.rs`): the sum of squares in `alpha`'s dtype.
    let sq = sq.cast(alpha.dtype());
    let out = <Dispatch as gp::GpKernelOps>::exp_quad(sq.into_dispatch(), alpha.into_dispatch(), rho.into_dispatch());
    Ok(Tensor::from_dispatch(out))
}

/// The squared distances `[1, N, N]` between the data points `x` (`[N]` or `[N, D]`), and the
/// particle count of `alpha` and `rho` (both `[n, 1]`), for the covariance function `name`.
fn kernel_inputs<const D: usize>(
    name: &'static str,
    x: Tensor<D>,
    alpha: &Tensor<2>,
    rho: &Tensor<2>,
) -> Result<(Tensor<3>, usize), ModelError> {
    let dims = x.dims();
    let (points, coords) = match dims.as_slice() {
        [p] => (*p, 1),
        [p, d] => (*p, *d),
        _ => return Err(invalid(name, "x", format!("must be [N] or [N, D], got {dims:?}"))),
    };
    if points == 0 || coords == 0 {
        return Err(invalid(name, "x", format!("has no points: {dims:?}")));
    }
    let ([n, one], [nr, one_r]) = (alpha.dims(), rho.dims());
    if one != 1 || one_r != 1 || n != nr {
        return Err(invalid(
            name,
            "rho",
            format!("alpha {:?} and rho {:?} must both be [n, 1]", alpha.dims(), rho.dims()),
        ));
    }
    let x: Tensor<2> = x.reshape([points, coords]);
    let diff = x.clone().unsqueeze_dim::<3>(1) - x.unsqueeze_dim::<3>(0); // [N, N, D]
    Ok((diff.square().sum_dim(2).reshape([1, points, points]), n))
}

/// The Matern family on data points `x` (`[N]` or `[N, D]`: distances are data, so the square
/// root's infinite slope at 0 never enters a gradient), with `r = |x_i - x_j| / rho`:
/// Stan's `gp_exponential_cov` (`nu = 1/2`): `alpha^2 e^-r`; `gp_matern32_cov`:
/// `alpha^2 (1 + sqrt(3) r) e^(-sqrt(3) r)`; `gp_matern52_cov`:
/// `alpha^2 (1 + sqrt(5) r + 5 r^2 / 3) e^(-sqrt(5) r)`. `alpha`, `rho` `[n, 1]`: `[n, N, N]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Matern {
    /// `nu = 1/2`: Stan's `gp_exponential_cov`.
    Half,
    /// `nu = 3/2`: `gp_matern32_cov`.
    ThreeHalves,
    /// `nu = 5/2`: `gp_matern52_cov`.
    FiveHalves,
}

/// Stan's `gp_exponential_cov`, `gp_matern32_cov` and `gp_matern52_cov` (see [`Matern`]).
///
/// # Errors
/// As [`exp_quad_cov`].
pub fn matern_cov<const D: usize>(
    kind: Matern,
    x: Tensor<D>,
    alpha: Tensor<2>,
    rho: Tensor<2>,
) -> Result<Tensor<3>, ModelError> {
    let name = match kind {
        Matern::Half => "gp_exponential_cov",
        Matern::ThreeHalves => "gp_matern32_cov",
        Matern::FiveHalves => "gp_matern52_cov",
    };
    let (sq, n) = kernel_inputs(name, x, &alpha, &rho)?;
    let r = sq.sqrt() / rho.reshape([n, 1, 1]); // [n, N, N]
    let alpha_sq = alpha.square().reshape([n, 1, 1]);
    let shape = match kind {
        Matern::Half => r.neg().exp(),
        Matern::ThreeHalves => {
            let s = r.mul_scalar(3f64.sqrt());
            s.clone().add_scalar(1.0) * s.neg().exp()
        }
        Matern::FiveHalves => {
            let s = r.mul_scalar(5f64.sqrt());
            (s.clone().add_scalar(1.0) + s.clone().square().div_scalar(3.0)) * s.neg().exp()
        }
    };
    Ok(shape * alpha_sq)
}

/// Stan's `gp_periodic_cov(x, alpha, rho, p)`: `alpha^2 exp(-2 sin^2(pi |x_i - x_j| / p) / rho^2)`
/// on data points `x` (`[N]` or `[N, D]`), `alpha`, `rho` `[n, 1]`, period `p > 0`: `[n, N, N]`.
///
/// # Errors
/// As [`exp_quad_cov`], and if `p` is not finite and positive.
pub fn periodic_cov<const D: usize>(
    x: Tensor<D>,
    alpha: Tensor<2>,
    rho: Tensor<2>,
    period: f64,
) -> Result<Tensor<3>, ModelError> {
    if !(period.is_finite() && period > 0.0) {
        return Err(invalid("gp_periodic_cov", "p", format!("must be finite and > 0, got {period}")));
    }
    let (sq, n) = kernel_inputs("gp_periodic_cov", x, &alpha, &rho)?;
    let s = sq.sqrt().mul_scalar(std::f64::consts::PI / period).sin().square().mul_scalar(-2.0);
    let inv_rho_sq = rho.square().recip().reshape([n, 1, 1]);
    Ok((s * inv_rho_sq).exp() * alpha.square().reshape([n, 1, 1]))
}

/// Host-side dense Cholesky in `f64` with diagonal jitter, for small systems whose matrix is read
/// back anyway (the `m x m` control-functional system of `svgd-cf`, `m` in the tens): one host
/// read and an `O(m^3)` factorisation in `f64` beat `O(m)` device rounds in `f32` there, and `f64`
/// keeps a weakly regularised system accurate.
pub mod host {
    /// A pivot below `PIVOT_RTOL * max |a_kk|` is treated as zero: the matrix is numerically
    /// singular (in `f64` the factor has no correct digits left there).
    pub const PIVOT_RTOL: f64 = 1e-12;

    /// Why a factorisation failed.
    #[derive(Clone, Debug, PartialEq)]
    pub enum CholeskyError {
        /// `a` does not hold `n * n` values, or holds non-finite ones.
        Malformed(String),
        /// Pivot `index` was `pivot` (not above the tolerance) even with `jitter` on the diagonal.
        Singular {
            /// Row of the failing pivot.
            index: usize,
            /// Value of the pivot after elimination.
            pivot: f64,
            /// Jitter that was on the diagonal.
            jitter: f64,
        },
    }

    impl std::fmt::Display for CholeskyError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match self {
                CholeskyError::Malformed(why) => write!(f, "malformed matrix: {why}"),
                CholeskyError::Singular { index, pivot, jitter } => {
                    write!(
                        f,
                        "not positive definite: pivot {index} is {pivot:e} with jitter {jitter:e} on the diagonal"
                    )
                }
            }
        }
    }

    impl std::error::Error for CholeskyError {}

    /// The lower-triangular factor `L` of `A + jitter I = L L^T`, row-major `n x n`.
    #[derive(Clone, Debug)]
    pub struct Cholesky {
        n: usize,
        l: Vec<f64>,
        /// The jitter that was added to the diagonal.
        pub jitter: f64,
    }

    impl Cholesky {
        /// Factors the symmetric matrix `a` (row-major `n x n`; only the lower triangle is read)
        /// with `jitter` added to its diagonal.
        pub fn factor(a: &[f64], n: usize, jitter: f64) -> Result<Self, CholeskyError> {
            if a.len() != n * n {
                return Err(CholeskyError::Malformed(format!("{} values for a {n} x {n} matrix", a.len())));
            }
            if let Some(i) = a.iter().position(|v| !v.is_finite()) {
                return Err(CholeskyError::Malformed(format!("entry ({}, {}) is {}", i / n, i % n, a[i])));
            }
            let scale = (0..n).map(|k| a[k * n + k].abs()).fold(0.0, f64::max) + jitter.abs();
            let tol = PIVOT_RTOL * scale;
            let mut l = vec![0.0; n * n];
            for j in 0..n {
                let mut pivot = a[j * n + j] + jitter;
                for k in 0..j {
                    pivot -= l[j * n + k] * l[j * n + k];
                }
                // `pivot <= tol`, written so that a NaN pivot fails too.
                if pivot.partial_cmp(&tol) != Some(std::cmp::Ordering::Greater) {
                    return Err(CholeskyError::Singular { index: j, pivot, jitter });
                }
                let ljj = pivot.sqrt();
                l[j * n + j] = ljj;
                for i in j + 1..n {
                    let mut v = a[i * n + j];
                    for k in 0..j {
                        v -= l[i * n + k] * l[j * n + k];
                    }
                    l[i * n + j] = v / ljj;
                }
            }
            Ok(Self { n, l, jitter })
        }

        /// Factors `a`, retrying with more jitter when it fails: the jitters `rel * 100^k` times
        /// the mean absolute diagonal, `k = 0..tries`. With `rel = 0` there is one try (none).
        pub fn factor_with_jitter(a: &[f64], n: usize, rel: f64, tries: usize) -> Result<Self, CholeskyError> {
            if a.len() != n * n || n == 0 {
                return Self::factor(a, n, 0.0);
            }
            let mean_diag = (0..n).map(|k| a[k * n + k].abs()).sum::<f64>() / n as f64;
            let tries = if rel > 0.0 { tries.max(1) } else { 1 };
            let mut last = None;
            for k in 0..tries {
                let jitter = rel * 100f64.powi(k as i32) * mean_diag;
                match Self::factor(a, n, jitter) {
                    Ok(c) => return Ok(c),
                    Err(e @ CholeskyError::Malformed(_)) => return Err(e),
                    Err(e) => last = Some(e),
                }
            }
            Err(last.expect("at least one try"))
        }

        /// Order of the factored matrix.
        pub fn n(&self) -> usize {
            self.n
        }

        /// `L`, row-major `n x n` (zeros above the diagonal).
        pub fn lower(&self) -> &[f64] {
            &self.l
        }

        /// `log det (A + jitter I) = 2 sum_i log L_ii`.
        pub fn log_det(&self) -> f64 {
            2.0 * (0..self.n).map(|i| self.l[i * self.n + i].ln()).sum::<f64>()
        }

        /// `(A + jitter I)^-1`, row-major, one solve per column of the identity.
        pub fn inverse(&self) -> Vec<f64> {
            let n = self.n;
            let mut inv = vec![0.0; n * n];
            for c in 0..n {
                let mut e = vec![0.0; n];
                e[c] = 1.0;
                for (i, v) in self.solve(&e).into_iter().enumerate() {
                    inv[i * n + c] = v;
                }
            }
            inv
        }

        /// Solves `L y = b` by forward substitution (`y = L^-1 b`: `b` in the factor's
        /// whitened coordinates).
        pub fn forward(&self, b: &[f64]) -> Vec<f64> {
            let n = self.n;
            assert_eq!(b.len(), n, "right-hand side length");
            let l = &self.l;
            let mut z = b.to_vec();
            for i in 0..n {
                for k in 0..i {
                    z[i] -= l[i * n + k] * z[k];
                }
                z[i] /= l[i * n + i];
            }
            z
        }

        /// Solves `(A + jitter I) x = b` by forward and back substitution.
        pub fn solve(&self, b: &[f64]) -> Vec<f64> {
            let n = self.n;
            let l = &self.l;
            let mut z = self.forward(b);
            for i in (0..n).rev() {
                for k in i + 1..n {
                    z[i] -= l[k * n + i] * z[k];
                }
                z[i] /= l[i * n + i];
            }
            z
        }
    }

    /// `a` (`S x S`, row-major) factored in place as `P A = L U` (unit lower `L` below the diagonal,
    /// `U` on and above it) by Gaussian elimination with partial pivoting; the permutation (row `k`
    /// of `P A` is row `pivots[k]` of `A`), or `None` where a pivot is zero or not finite.
    pub fn lu_factor(a: &mut [f64], s: usize) -> Option<Vec<usize>> {
        let mut pivots: Vec<usize> = (0..s).collect();
        for k in 0..s {
            let p = (k..s).max_by(|&i, &j| a[i * s + k].abs().total_cmp(&a[j * s + k].abs()))?;
            let pivot = a[p * s + k];
            if pivot == 0.0 || !pivot.is_finite() {
                return None;
            }
            if p != k {
                for c in 0..s {
                    a.swap(k * s + c, p * s + c);
                }
                pivots.swap(k, p);
            }
            for i in k + 1..s {
                let l = a[i * s + k] / pivot;
                a[i * s + k] = l;
                for c in k + 1..s {
                    a[i * s + c] -= l * a[k * s + c];
                }
            }
        }
        Some(pivots)
    }

    /// `x = A^-1 b` from [`lu_factor`]'s factor and permutation (`b` is left as it was).
    pub fn lu_solve(lu: &[f64], pivots: &[usize], b: &[f64], x: &mut [f64]) {
        let s = pivots.len();
        for (k, &p) in pivots.iter().enumerate() {
            x[k] = b[p];
        }
        for i in 0..s {
            let mut v = x[i];
            for c in 0..i {
                v -= lu[i * s + c] * x[c];
            }
            x[i] = v;
        }
        for i in (0..s).rev() {
            let mut v = x[i];
            for c in i + 1..s {
                v -= lu[i * s + c] * x[c];
            }
            x[i] = v / lu[i * s + i];
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn solves_a_positive_definite_system() {
            // A = [[4, 2, 0.4], [2, 5, 1], [0.4, 1, 3]], x = [1, -2, 0.5]
            let a = [4.0, 2.0, 0.4, 2.0, 5.0, 1.0, 0.4, 1.0, 3.0];
            let x = [1.0, -2.0, 0.5];
            let b: Vec<f64> = (0..3).map(|i| (0..3).map(|j| a[i * 3 + j] * x[j]).sum()).collect();
            let got = Cholesky::factor(&a, 3, 0.0).unwrap().solve(&b);
            for i in 0..3 {
                assert!((got[i] - x[i]).abs() < 1e-12, "{got:?}");
            }
        }

        #[test]
        fn a_singular_matrix_is_reported_with_its_jitter() {
            // Rank one: every entry 2.
            let a = [2.0; 9];
            match Cholesky::factor(&a, 3, 0.0) {
                Err(CholeskyError::Singular { index: 1, jitter, .. }) => assert_eq!(jitter, 0.0),
                other => panic!("{other:?}"),
            }
            // Jitter makes it positive definite.
            let c = Cholesky::factor_with_jitter(&a, 3, 1e-6, 3).unwrap();
            assert!((c.jitter - 2e-6).abs() < 1e-18);
            // An indefinite matrix stays singular under small jitter; the error names the jitter.
            let b = [1.0, 2.0, 2.0, 1.0];
            let err = Cholesky::factor_with_jitter(&b, 2, 1e-8, 3).unwrap_err();
            assert!(matches!(err, CholeskyError::Singular { jitter, .. } if (jitter - 1e-4).abs() < 1e-12), "{err:?}");
            assert!(err.to_string().contains("jitter"));
        }

        #[test]
        fn non_finite_entries_are_malformed() {
            assert!(matches!(Cholesky::factor(&[f64::NAN], 1, 0.0), Err(CholeskyError::Malformed(_))));
            assert!(matches!(Cholesky::factor(&[1.0, 2.0], 2, 0.0), Err(CholeskyError::Malformed(_))));
        }
    }
}
