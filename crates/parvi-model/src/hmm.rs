//! Hidden Markov models: the forward algorithm's marginal likelihood (Stan's `hmm_marginal`, and
//! the hand-written `log_sum_exp` recursions of posteriordb's `hmm_example` and `hmm_drive`) for
//! all particles at once.
//!
//! The forward recursion `alpha_t[k] = log_sum_exp_j(alpha_{t-1}[j] + log Gamma[j, k]) +
//! log omega_t[k]` is a product of `T` matrices in the log semiring, `M_t[j, k] = log Gamma[j, k]
//! + log omega_t[k]`. Matrix products associate, so the `T - 1` matrices are multiplied pairwise
//! in `ceil(log2 T)` rounds of whole-tensor operations: the autodiff graph holds `O(log T)` nodes
//! over `[n, T, K, K]` tensors instead of `O(T)` sequential steps (or one node per scalar).

use burn::tensor::Tensor;

use crate::ModelError;
use crate::tensor_ops::log_sum_exp;

/// Log of zero for the log-semiring identity: finite, so that no `inf - inf` reaches autodiff,
/// and far below any log density a model produces.
const LOG_ZERO: f64 = -1.0e30;

/// `log p(y_1..T)` of a hidden Markov model for every particle, `[n]`.
///
/// - `log_omega` `[n, T, K]`: `log p(y_t | z_t = k)`, the emission log densities;
/// - `log_gamma` `[n, K, K]`: `log P(z_t = k | z_{t-1} = j)` at `[j, k]` (each row of `Gamma` a
///   simplex, as Stan's `hmm_marginal` takes it);
/// - `log_rho` `[n, K]`: `log P(z_1 = k)`; pass zeros for the posteriordb HMMs, whose recursion
///   starts from the emissions alone.
///
/// Errors name the argument whose shape does not fit.
pub fn hmm_marginal(log_omega: Tensor<3>, log_gamma: Tensor<3>, log_rho: Tensor<2>) -> Result<Tensor<1>, ModelError> {
    let [n, t, k] = log_omega.dims();
    let shape_error = |name: &str, got: Vec<usize>, want: String| ModelError::InvalidBlock {
        name: name.to_string(),
        reason: format!("hmm_marginal: shape {got:?}, expected {want}"),
    };
    if t == 0 || k == 0 {
        return Err(shape_error("log_omega", vec![n, t, k], "[particles, T >= 1, K >= 1]".into()));
    }
    if log_gamma.dims() != [n, k, k] {
        return Err(shape_error("log_gamma", log_gamma.dims().to_vec(), format!("[{n}, {k}, {k}]")));
    }
    if log_rho.dims() != [n, k] {
        return Err(shape_error("log_rho", log_rho.dims().to_vec(), format!("[{n}, {k}]")));
    }
    // alpha_1 = log rho + log omega_1.
    let first = log_rho + log_omega.clone().narrow(1, 0, 1).reshape([n, k]);
    if t == 1 {
        return Ok(log_sum_exp(first, 1).reshape([n]));
    }
    // M_t[j, k] = log Gamma[j, k] + log omega_t[k], t = 2..T: [n, T - 1, K, K].
    let emissions = log_omega.narrow(1, 1, t - 1).unsqueeze_dim::<4>(2); // [n, T-1, 1, K]
    let steps = log_gamma.unsqueeze_dim::<4>(1) + emissions;
    let product = log_matrix_product(steps); // [n, K, K]
    // log_sum_exp_k log_sum_exp_j (alpha_1[j] + P[j, k]).
    let paths = first.reshape([n, k, 1]) + product;
    Ok(log_sum_exp(paths.reshape([n, k * k]), 1).reshape([n]))
}

/// The log-semiring product `M_1 M_2 ... M_m` of `[n, m, K, K]` matrices, `[n, K, K]`, by pairwise
/// products in `ceil(log2 m)` rounds (an odd count is padded with the identity).
fn log_matrix_product(mut mats: Tensor<4>) -> Tensor<3> {
    loop {
        let [n, m, k, _] = mats.dims();
        if m == 1 {
            return mats.reshape([n, k, k]);
        }
        if m % 2 == 1 {
            let identity = log_identity(n, k, &mats.device());
            mats = Tensor::cat(vec![mats, identity], 1);
        }
        let half = mats.dims()[1] / 2;
        let pairs = mats.reshape([n, half, 2, k, k]);
        let left = pairs.clone().narrow(2, 0, 1).reshape([n, half, k, k, 1]);
        let right = pairs.narrow(2, 1, 1).reshape([n, half, 1, k, k]);
        // C[i, l] = log_sum_exp_j (A[i, j] + B[j, l]): j is axis 3 of the broadcast sum.
        mats = log_sum_exp(left + right, 3).reshape([n, half, k, k]);
    }
}

/// `[n, 1, K, K]` log-semiring identities: 0 on the diagonal, [`LOG_ZERO`] elsewhere.
fn log_identity(n: usize, k: usize, device: &burn::tensor::Device) -> Tensor<4> {
    let eye = Tensor::<2>::eye(k, device);
    // eye * 0 + (1 - eye) * LOG_ZERO
    let log_eye = eye.neg().add_scalar(1.0).mul_scalar(LOG_ZERO);
    log_eye.reshape([1, 1, k, k]).repeat_dim(0, n)
}
