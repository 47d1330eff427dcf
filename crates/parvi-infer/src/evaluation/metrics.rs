//! Quality metrics for particle sets: kernel Stein discrepancy and maximum mean discrepancy.

use burn::tensor::Tensor;
use parvi_model::tensor_ops::{pairwise_sq_dists, to_vec_f32};
use serde::{Deserialize, Serialize};

use crate::kernels::stein_kernel_matrix;
use crate::{InferError, Kernel};

/// Which estimator of a squared discrepancy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Statistic {
    /// Mean over all pairs, the diagonal included (biased, non-negative).
    V,
    /// Mean over pairs `i != j` (unbiased).
    U,
}

fn mean_pairs(m: Tensor<2>, stat: Statistic) -> f64 {
    let n = m.dims()[0];
    let total = m.clone().sum();
    let value = match stat {
        Statistic::V => total.div_scalar((n * n) as f64),
        Statistic::U => {
            let diag = (m * Tensor::eye(n, &total.device())).sum();
            (total - diag).div_scalar((n * n.saturating_sub(1)).max(1) as f64)
        }
    };
    f64::from(value.into_scalar::<f32>())
}

/// Squared kernel Stein discrepancy of particles `x` with scores `score` (from
/// [`parvi_model::score`]): the mean of the Stein kernel over pairs (with a kernel's linear
/// features, their part too).
pub fn ksd_squared(kernel: &dyn Kernel, x: Tensor<2>, score: Tensor<2>, stat: Statistic) -> Result<f64, InferError> {
    let n = x.dims()[0];
    if n == 0 || (stat == Statistic::U && n < 2) {
        return Err(InferError::setting("particles", format!("KSD ({stat:?}) needs more particles, got {n}")));
    }
    // The Stein kernel matrix and the matrices it is built from (about eight at once).
    crate::kernels::require_matrices_fit("particles", n, "the KSD's n x n Stein kernel matrix", n, n, 8)?;
    let sq = pairwise_sq_dists(x.clone(), x.clone());
    let eval = kernel.eval(&sq, true);
    let mut k0 = stein_kernel_matrix(&eval, &sq, x.clone(), score.clone());
    if kernel.linear_features() {
        k0 = k0 + crate::kernels::linear_stein_kernel(x, score);
    }
    Ok(mean_pairs(k0, stat))
}

/// Squared MMD between sample sets `x` `[n, d]` and `y` `[m, d]` under `kernel` (give it a
/// fixed bandwidth so different methods are scored alike). With [`Statistic::U`] the within-set
/// terms drop their diagonals.
pub fn mmd_squared(kernel: &dyn Kernel, x: Tensor<2>, y: Tensor<2>, stat: Statistic) -> Result<f64, InferError> {
    let (n, m) = (x.dims()[0], y.dims()[0]);
    if n == 0 || m == 0 || (stat == Statistic::U && (n < 2 || m < 2)) {
        return Err(InferError::setting("samples", format!("MMD ({stat:?}) needs more samples, got {n} and {m}")));
    }
    let largest = n.max(m);
    crate::kernels::require_matrices_fit("samples", largest, "the MMD's kernel matrices", largest, largest, 4)?;
    let kxx = kernel.eval(&pairwise_sq_dists(x.clone(), x.clone()), false).k;
    let kyy = kernel.eval(&pairwise_sq_dists(y.clone(), y.clone()), false).k;
    let kxy = kernel.eval(&pairwise_sq_dists(x, y), false).k;
    let cross = f64::from(kxy.mean().into_scalar::<f32>());
    Ok(mean_pairs(kxx, stat) + mean_pairs(kyy, stat) - 2.0 * cross)
}

/// Squared MMD between weighted sets: `wx^T Kxx wx + wy^T Kyy wy - 2 wx^T Kxy wy`.
pub fn weighted_mmd_squared(
    kernel: &dyn Kernel,
    x: Tensor<2>,
    wx: Tensor<1>,
    y: Tensor<2>,
    wy: Tensor<1>,
) -> Result<f64, InferError> {
    let (n, m) = (x.dims()[0], y.dims()[0]);
    if wx.dims()[0] != n || wy.dims()[0] != m {
        return Err(InferError::setting("weights", "one weight per sample is needed"));
    }
    let quad = |a: Tensor<2>, b: Tensor<2>, wa: Tensor<1>, wb: Tensor<1>| {
        let (na, nb) = (a.dims()[0], b.dims()[0]);
        let k = kernel.eval(&pairwise_sq_dists(a, b), false).k;
        let v = wa.reshape([1, na]).matmul(k).matmul(wb.reshape([nb, 1]));
        f64::from(to_vec_f32(&v)[0])
    };
    Ok(quad(x.clone(), x.clone(), wx.clone(), wx.clone()) + quad(y.clone(), y.clone(), wy.clone(), wy.clone())
        - 2.0 * quad(x, y, wx, wy))
}
