//! `sblrc-blr`: Bayesian linear regression `y ~ normal(X beta, sigma)` with `beta ~ normal(0,
//! 10)` and `sigma ~ normal(0, 10)` on `sigma > 0`.
//!
//! Full-batch, as the other regressions (`regressions.rs`): `N = 100` rows make a minibatch
//! pointless, and the product `beta X^T` of all particles is one small matmul.

use burn::tensor::{Device, Tensor};
use parvi_model::dist::{LogProb, Normal};
use parvi_model::program::{Program, Target, Vars};
use parvi_model::tensor_ops::matrix_from_vec;
use parvi_model::{ModelError, ParamLayout};

use super::PosteriorDbError;
use super::data::Data;

/// The model with its data on the device.
#[derive(Debug)]
pub(super) struct Blr {
    /// `X^T` `[D, N]`: `beta [n, D] x X^T` is every particle's linear predictor.
    xt: Tensor<2>,
    /// `[1, N]`
    y: Tensor<2>,
}

impl Blr {
    /// Reads `N`, `D` (both at least 1), `X` (`N` rows of `D`) and `y`.
    pub(super) fn new(data: &Data, device: &Device) -> Result<Self, PosteriorDbError> {
        let n = data.size("N", 0)?;
        if n == 0 {
            return Err(data.invalid("N", "must be at least 1: the likelihood needs an observation"));
        }
        let d = data.size("D", 0)?;
        if d == 0 {
            return Err(data.invalid("D", "must be at least 1: the model needs a coefficient"));
        }
        let x = data.matrix("X", (n, "N"), (d, "D"))?;
        let y = data.reals("y", n, "N")?;
        let xt = (0..d).flat_map(|c| (0..n).map(move |r| (r, c))).map(|(r, c)| x[r * d + c] as f32).collect();
        Ok(Self {
            xt: matrix_from_vec(xt, d, n, device),
            y: matrix_from_vec(y.iter().map(|&v| v as f32).collect(), 1, n, device),
        })
    }
}

impl Program for Blr {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        ParamLayout::new().real("beta", &[self.xt.dims()[0]])?.positive("sigma", &[])
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let (beta, sigma) = (p.get("beta")?, p.get("sigma")?);
        *target += Normal::new(0.0, 10.0)?.log_prob(beta.clone());
        *target += Normal::new(0.0, 10.0)?.log_prob(sigma.clone());
        *target += Normal::new(beta.matmul(self.xt.clone()), sigma)?.log_prob(self.y.clone());
        Ok(())
    }
}
