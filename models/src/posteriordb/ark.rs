//! `arK-arK`: an autoregressive model of order `K`, `y[t] ~ normal(alpha + sum_k beta[k] y[t-k],
//! sigma)` for `t > K`, with `alpha, beta ~ normal(0, 10)` and `sigma ~ cauchy(0, 2.5)`.
//!
//! The lags are data, so the Stan program's inner loop over `k` is a product with the lagged
//! series `[y[t-1], ..., y[t-K]]`, built once on the host: the means of all particles at all time
//! points are one matmul, and the time points `t > K` are rows a minibatch can select.

use burn::tensor::{Device, Tensor};
use parvi_model::dist::{Cauchy, LogProb, Normal};
use parvi_model::program::{Generated, Program, Target, Vars};
use parvi_model::tensor_ops::matrix_from_vec;
use parvi_model::{Minibatch, ModelError, ParamLayout};

use super::PosteriorDbError;
use super::data::Data;

/// The model with the lagged series on the device.
#[derive(Debug)]
pub(super) struct Ark {
    /// Row `t - K` (0-based) is `[y[t-1], ..., y[t-K]]` for `t = K+1, ..., T`: `[T - K, K]`.
    lags: Tensor<2>,
    /// `y[t]` for `t = K+1, ..., T`: `[T - K, 1]`.
    y: Tensor<2>,
}

impl Ark {
    /// Reads `K` (at least 1), `T` (above `K`) and `y`.
    pub(super) fn new(data: &Data, device: &Device) -> Result<Self, PosteriorDbError> {
        let k = data.size("K", 0)?;
        if k == 0 {
            return Err(data.invalid("K", "must be at least 1: the model needs a lag"));
        }
        let t = data.size("T", 0)?;
        if t <= k {
            return Err(data.invalid("T", format!("must exceed K = {k}: the likelihood needs a time point t > K")));
        }
        let y = data.reals("y", t, "T")?;
        let lags = (k..t).flat_map(|s| (1..=k).map(move |lag| (s, lag))).map(|(s, lag)| y[s - lag] as f32).collect();
        Ok(Self {
            lags: matrix_from_vec(lags, t - k, k, device),
            y: matrix_from_vec(y[k..].iter().map(|&v| v as f32).collect(), t - k, 1, device),
        })
    }
}

impl Program for Ark {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        ParamLayout::new().real("alpha", &[])?.real("beta", &[self.lags.dims()[1]])?.positive("sigma", &[])
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let (alpha, beta, sigma) = (p.get("alpha")?, p.get("beta")?, p.get("sigma")?);
        *target += Normal::new(0.0, 10.0)?.log_prob(alpha.clone());
        *target += Normal::new(0.0, 10.0)?.log_prob(beta.clone());
        *target += Cauchy::new(0.0, 2.5)?.log_prob(sigma.clone());
        // The time points of this minibatch (all of them without one), likelihood scaled by N / B.
        let (lags, scale) = Minibatch::select(p.batch(), self.lags.clone());
        let (y, _) = Minibatch::select(p.batch(), self.y.clone());
        let mu = beta.matmul(lags.transpose()) + alpha; // [n, B]: mu[t] = alpha + sum_k beta[k] y[t-k]
        *target += Normal::new(mu, sigma)?.log_prob(y.transpose()).mul_scalar(scale);
        Ok(())
    }

    fn data_len(&self) -> Option<usize> {
        Some(self.y.dims()[0])
    }

    /// `vector[T - K] log_lik; log_lik[t] = normal_lpdf(y[t] | mu[t], sigma);` over every time
    /// point the likelihood covers (not in posteriordb's program: the pointwise log-likelihood
    /// that PSIS-LOO reads).
    fn generated(&self, p: &Vars, out: &mut Generated) -> Result<(), ModelError> {
        let (alpha, beta, sigma) = (p.get("alpha")?, p.get("beta")?, p.get("sigma")?);
        let mu = beta.matmul(self.lags.clone().transpose()) + alpha;
        let points = self.y.dims()[0];
        out.output_shaped("log_lik", &[points], Normal::new(mu, sigma)?.log_prob(self.y.clone().transpose()));
        Ok(())
    }
}
