//! What the gradient-free and annealed engines share (Han & Liu 2018): auxiliary densities
//! (GF-SVGD's surrogate `rho`, the annealing path's `p0`), self-normalised and truncated
//! importance weights, the importance-weighted Stein direction, the importance-sampling
//! baseline the paper compares against, and the choice of the paper's printed kernel.

use burn::tensor::Tensor;
use parvi_model::grad::log_prob_value;
use parvi_model::tensor_ops::{log_sum_exp, pairwise_sq_dists, to_vec_f32};
use parvi_model::{LogDensity, Minibatch, ModelError, Score, score};
use serde::{Deserialize, Serialize};

use crate::error::require_positive;
use crate::kernels::{linear_direction, repulsion_from, stein_direction};
use crate::{InferError, Kernel, KernelConfig, Particles, Rbf};

/// `N(mean 1, std^2 I)` in whatever dimension it is asked about: a surrogate or initial
/// distribution that needs no model code.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IsotropicGaussian {
    /// Mean of every coordinate.
    pub mean: f64,
    /// Standard deviation of every coordinate.
    pub std: f64,
    /// Dimension.
    pub dim: usize,
}

impl LogDensity for IsotropicGaussian {
    fn dim(&self) -> usize {
        self.dim
    }

    fn log_prob(&self, x: Tensor<2>, _batch: Option<&Minibatch>) -> Tensor<1> {
        let [n, d] = x.dims();
        let log_norm = -0.5 * d as f64 * (2.0 * std::f64::consts::PI * self.std * self.std).ln();
        x.sub_scalar(self.mean)
            .square()
            .sum_dim(1)
            .mul_scalar(-0.5 / (self.std * self.std))
            .add_scalar(log_norm)
            .reshape([n])
    }
}

/// A differentiable auxiliary density: GF-SVGD's surrogate `rho`, or the annealing path's
/// initial distribution `p0`.
pub enum AuxDensity {
    /// A user's density; its score comes from autodiff, so it must be built from burn tensor
    /// operations. It need not be normalised.
    Density(Box<dyn LogDensity + Send>),
    /// `N(mean 1, std^2 I)` in the particles' dimension.
    Gaussian {
        /// Mean of every coordinate.
        mean: f64,
        /// Standard deviation of every coordinate.
        std: f64,
    },
    /// The constant density 1: no drift, only (weighted) repulsion.
    Flat,
}

impl std::fmt::Debug for AuxDensity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl AuxDensity {
    /// A validated isotropic Gaussian; `name` is the setting reported on bad values.
    pub fn gaussian(name: &'static str, mean: f64, std: f64) -> Result<Self, InferError> {
        if !mean.is_finite() {
            return Err(InferError::setting(name, format!("mean must be finite, got {mean}")));
        }
        require_positive(name, std)?;
        Ok(AuxDensity::Gaussian { mean, std })
    }

    /// A one-line description for reports.
    pub fn describe(&self) -> String {
        match self {
            AuxDensity::Density(d) => format!("user density (dim {})", d.dim()),
            AuxDensity::Gaussian { mean, std } => format!("N({mean}, {std}^2 I)"),
            AuxDensity::Flat => "flat (rho = 1)".into(),
        }
    }

    /// Runs `f` on the density as a [`LogDensity`] in dimension `dim` (`None` for `Flat`).
    fn with<R>(
        &self,
        name: &'static str,
        dim: usize,
        f: impl FnOnce(&dyn LogDensity) -> R,
    ) -> Result<Option<R>, InferError> {
        match self {
            AuxDensity::Density(d) if d.dim() != dim => {
                Err(InferError::setting(name, format!("has dimension {} but the particles have {dim}", d.dim())))
            }
            AuxDensity::Density(d) => Ok(Some(f(d.as_ref()))),
            AuxDensity::Gaussian { mean, std } => Ok(Some(f(&IsotropicGaussian { mean: *mean, std: *std, dim }))),
            AuxDensity::Flat => Ok(None),
        }
    }

    /// `log` of the density at `x` `[n, d]`, `[n]` (zeros when flat).
    pub fn log_value(&self, name: &'static str, x: Tensor<2>) -> Result<Tensor<1>, InferError> {
        let [n, d] = x.dims();
        let device = x.device();
        Ok(self
            .with(name, d, |density| log_prob_value(density, x, None))?
            .transpose()?
            .unwrap_or_else(|| Tensor::zeros([n], &device)))
    }

    /// `log` of the density and its score at `x`, or `None` when flat (score 0). A density
    /// without a gradient is an error naming `name`.
    pub fn log_and_score(&self, name: &'static str, x: Tensor<2>) -> Result<Option<Score>, InferError> {
        let d = x.dims()[1];
        self.with(name, d, |density| score(density, x, None))?.transpose().map_err(|e| match e {
            ModelError::NoGradient => InferError::setting(
                name,
                "is not differentiable: its log density carries no gradient, so grad log rho cannot be \
                     computed (write it with burn tensor operations, or use the flat or Gaussian choice)",
            ),
            other => other.into(),
        })
    }
}

/// Self-normalised importance weights `w_j = exp(log_w_j) / sum_k exp(log_w_k)` from
/// `log_w = log_rho - log_p`, computed in log space.
///
/// Reads one scalar back to the host (the log normaliser): all-zero or non-finite weights would
/// otherwise turn the particles into NaN silently. Then the error says which particle is at
/// fault, and `step` (when given) when it happened.
pub fn self_normalized_weights(
    log_rho: Tensor<1>,
    log_p: Tensor<1>,
    step: Option<usize>,
) -> Result<Tensor<1>, InferError> {
    let n = log_p.dims()[0];
    let log_w = (log_rho.clone() - log_p.clone()).reshape([1, n]);
    let log_norm = log_sum_exp(log_w.clone(), 1); // [1, 1]
    let norm = to_vec_f32(&log_norm)[0];
    if norm.is_finite() {
        return Ok((log_w - log_norm).exp().reshape([n]));
    }
    let when = step.map(|s| format!(" at step {s}")).unwrap_or_default();
    let (lr, lp) = (to_vec_f32(&log_rho), to_vec_f32(&log_p));
    let culprit = (0..n).find(|&i| !(lr[i] - lp[i]).is_finite() && (lr[i] - lp[i]) != f32::NEG_INFINITY);
    Err(InferError::Numerical(match culprit {
        Some(i) => format!(
            "importance weight{when} is non-finite at particle {i}: log rho = {}, log p = {} (is the target's \
             log density finite there?)",
            lr[i], lp[i]
        ),
        None => format!(
            "importance weights{when} are all zero (log rho - log p = -inf at every particle): the surrogate \
             puts no mass where the particles are"
        ),
    }))
}

/// Truncated importance weights (Ionides 2008): self-normalised weights `w` `[n]` capped at
/// `sqrt(n)` times their mean, `1 / sqrt(n)`, then normalised again. A handful of particles can
/// no longer carry the whole update when the weights degenerate, at the price of a bias that
/// vanishes as `n` grows (the cap rises with `sqrt(n)` above the mean weight).
pub fn truncated_weights(weights: Tensor<1>) -> Tensor<1> {
    let n = weights.dims()[0];
    let capped = weights.clamp_max((n as f32).sqrt().recip());
    let total = capped.clone().sum();
    capped / total
}

/// Importance sampling with proposal `rho`: `draws` from `rho` weighted by `p / rho`
/// (self-normalised), using the target's values only.
pub fn importance_sampling(
    target: &dyn LogDensity,
    proposal: &dyn LogDensity,
    draws: Tensor<2>,
) -> Result<Particles, InferError> {
    let log_p = log_prob_value(target, draws.clone(), None)?;
    let log_q = log_prob_value(proposal, draws.clone(), None)?;
    // w = p / q: the GF weights with the roles of the two densities swapped.
    let weights = self_normalized_weights(log_p, log_q, None)?;
    Ok(Particles { positions: draws, weights: Some(weights) })
}

/// The GF-SVGD direction at the particles `x` given their self-normalised weights: with a
/// surrogate score, the weighted Stein direction; without (flat `rho`), the weighted repulsion.
/// A kernel with linear features adds their weighted part ([`linear_direction`]; zero scores
/// for a flat `rho`).
pub fn gf_direction(kernel: &dyn Kernel, x: Tensor<2>, rho_score: Option<Tensor<2>>, weights: Tensor<1>) -> Tensor<2> {
    let n = x.dims()[0];
    let eval = kernel.eval(&pairwise_sq_dists(x.clone(), x.clone()), false);
    let linear = kernel.linear_features().then(|| {
        let s = rho_score.clone().unwrap_or_else(|| x.zeros_like());
        linear_direction(x.clone(), s, x.clone(), Some(weights.clone()))
    });
    let phi = match rho_score {
        Some(s) => stein_direction(&eval, x.clone(), s, x, Some(weights)),
        None => repulsion_from(eval.dk * weights.reshape([n, 1]), x.clone(), x),
    };
    match linear {
        Some(l) => phi + l,
        None => phi,
    }
}

/// An auxiliary density as the command line names it (surrogate or `p0`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AuxKind {
    /// An isotropic Gaussian with the given mean and standard deviation.
    #[default]
    Gaussian,
    /// The constant 1 (for a surrogate: the weighted repulsion alone).
    Flat,
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Device;

    fn device() -> Device {
        Device::flex()
    }

    fn vector(values: &[f32]) -> Tensor<1> {
        Tensor::from_data(burn::tensor::TensorData::new(values.to_vec(), [values.len()]), &device())
    }

    #[test]
    fn weights_are_self_normalised_in_log_space() {
        // Log-weights far below f32's exp range still give the right ratios (to f32's spacing
        // near 1000, about 6e-5).
        let w = self_normalized_weights(vector(&[-1000.0, -1001.0]), vector(&[0.0, 0.0]), None).unwrap();
        let w = to_vec_f32(&w);
        let e = (-1.0f64).exp();
        assert!((w[0] as f64 - 1.0 / (1.0 + e)).abs() < 2e-4 && (w[1] as f64 - e / (1.0 + e)).abs() < 2e-4, "{w:?}");
    }

    #[test]
    fn truncation_caps_weights_at_root_n_times_the_mean() {
        // n = 4: cap 1/2. (0.7, 0.1, 0.1, 0.1) -> (0.5, 0.1, 0.1, 0.1) / 0.8.
        let w = to_vec_f32(&truncated_weights(vector(&[0.7, 0.1, 0.1, 0.1])));
        let want = [0.625, 0.125, 0.125, 0.125];
        assert!(w.iter().zip(want).all(|(a, b)| (*a as f64 - b).abs() < 1e-6), "{w:?}");
        // Below the cap nothing changes.
        let w = to_vec_f32(&truncated_weights(vector(&[0.4, 0.3, 0.2, 0.1])));
        assert!(w.iter().zip([0.4, 0.3, 0.2, 0.1]).all(|(a, b)| (*a as f64 - b).abs() < 1e-6), "{w:?}");
    }

    #[test]
    fn zero_and_non_finite_weights_name_the_problem() {
        let inf = f32::INFINITY;
        let err = self_normalized_weights(vector(&[-inf, -inf]), vector(&[0.0, 0.0]), Some(4)).unwrap_err().to_string();
        assert!(err.contains("all zero") && err.contains("step 4"), "{err}");
        let err =
            self_normalized_weights(vector(&[0.0, 0.0]), vector(&[0.0, f32::NAN]), Some(2)).unwrap_err().to_string();
        assert!(err.contains("particle 1") && err.contains("step 2"), "{err}");
        let err = self_normalized_weights(vector(&[0.0, 0.0]), vector(&[-inf, 0.0]), None).unwrap_err().to_string();
        assert!(err.contains("particle 0"), "{err}");
    }

    #[test]
    fn isotropic_gaussian_is_normalised() {
        let g = IsotropicGaussian { mean: 1.0, std: 2.0, dim: 3 };
        let x = Tensor::<2>::from_floats([[1.0, 1.0, 1.0], [3.0, 1.0, 1.0]], &device());
        let lp = to_vec_f32(&g.log_prob(x, None));
        let want0 = -1.5 * (2.0 * std::f64::consts::PI * 4.0).ln();
        assert!((lp[0] as f64 - want0).abs() < 1e-5 && (lp[1] as f64 - (want0 - 0.5)).abs() < 1e-5, "{lp:?}");
    }
}

/// Which median rule the family's RBF kernel follows (`--opt kernel=printed`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HanLiuKernel {
    /// The run's kernel (`--kernel`, `--bandwidth`): by default the crate's median rule,
    /// Liu & Wang's reference code, `exp(-r^2 / (2 h^2))` with `h^2 = med / (2 log(n + 1))`.
    #[default]
    Median,
    /// Han & Liu's rule as printed: `exp(-r^2 / h)` with `h = med / (2 log(n + 1))`, half the
    /// median rule's `h^2` ([`crate::Bandwidth::HanLiuMedian`]); for re-running the paper's
    /// experiments both ways.
    Printed,
}

impl HanLiuKernel {
    /// The kernel of a gradient-free or annealed engine: the run's `kernel`, or with `Printed`
    /// Han & Liu's printed rule, which replaces the default median RBF only.
    pub fn build(self, kernel: &KernelConfig) -> Result<Box<dyn Kernel>, InferError> {
        match self {
            HanLiuKernel::Median => kernel.build(),
            HanLiuKernel::Printed if *kernel == KernelConfig::default() => Ok(Box::new(Rbf::han_liu())),
            HanLiuKernel::Printed => Err(InferError::setting(
                "kernel",
                "`kernel = printed` is Han & Liu's median rule as printed; it replaces the default median RBF, \
                 so it cannot be combined with `--kernel` or `--bandwidth`",
            )),
        }
    }
}
