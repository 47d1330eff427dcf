//! `low_dim_gauss_mix-low_dim_gauss_mix`: a two-component normal mixture,
//! `y[n] ~ theta normal(mu[1], sigma[1]) + (1 - theta) normal(mu[2], sigma[2])` with `mu`
//! ordered (which makes the components identifiable), `sigma ~ normal(0, 2)` on `sigma > 0`,
//! `mu ~ normal(0, 2)`, `theta ~ beta(5, 5)`. The observations are minibatched.

use burn::tensor::{Device, Tensor};
use parvi_model::dist::{Beta, LogProb, Normal, log_mix};
use parvi_model::program::{Program, Target, Vars};
use parvi_model::tensor_ops::matrix_from_vec;
use parvi_model::{Minibatch, ModelError, ParamLayout};

use super::PosteriorDbError;
use super::data::Data;

/// The model with the observations on the device.
#[derive(Debug)]
pub(super) struct GaussMix {
    /// `[N, 1]`: one observation a row, the rows a minibatch selects.
    y: Tensor<2>,
}

impl GaussMix {
    /// Reads `N` (at least 1) and `y`.
    pub(super) fn new(data: &Data, device: &Device) -> Result<Self, PosteriorDbError> {
        let rows = data.size("N", 0)?;
        if rows == 0 {
            return Err(data.invalid("N", "must be at least 1: the likelihood needs an observation"));
        }
        let y = data.reals("y", rows, "N")?;
        Ok(Self { y: matrix_from_vec(y.iter().map(|&v| v as f32).collect(), rows, 1, device) })
    }
}

impl Program for GaussMix {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        ParamLayout::new().ordered("mu", 2)?.positive("sigma", &[2])?.bounded("theta", &[], 0.0, 1.0)
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let (mu, sigma, theta) = (p.get("mu")?, p.get("sigma")?, p.get("theta")?);
        *target += Normal::new(0.0, 2.0)?.log_prob(sigma.clone());
        *target += Normal::new(0.0, 2.0)?.log_prob(mu.clone());
        *target += Beta::new(5.0, 5.0)?.log_prob(theta.clone());
        // The observations of this minibatch as a row `[1, B]`, against `[n, 1]` parameters.
        let (y, scale) = Minibatch::select(p.batch(), self.y.clone());
        let lp1 =
            Normal::new(mu.clone().narrow(1, 0, 1), sigma.clone().narrow(1, 0, 1))?.log_prob(y.clone().transpose());
        let lp2 = Normal::new(mu.narrow(1, 1, 1), sigma.narrow(1, 1, 1))?.log_prob(y.transpose());
        *target += log_mix(theta, lp1, lp2).mul_scalar(scale);
        Ok(())
    }

    fn data_len(&self) -> Option<usize> {
        Some(self.y.dims()[0])
    }
}
