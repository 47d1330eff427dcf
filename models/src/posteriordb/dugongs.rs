//! `dugongs_data-dugongs_model`: BUGS's dugongs, a nonlinear growth curve (length against age
//! of 27 dugongs) approaching an asymptote `alpha` at rate `lambda`.
//!
//! ```stan
//! parameters {
//!   real alpha; real beta;
//!   real<lower=.5, upper=1> lambda;
//!   real<lower=0> tau;
//! }
//! transformed parameters { real sigma = 1 / sqrt(tau); real U3 = logit(lambda); }
//! model {
//!   m[i] = alpha - beta * pow(lambda, x[i]);
//!   Y ~ normal(m, sigma);
//!   alpha ~ normal(0.0, 1000); beta ~ normal(0.0, 1000);
//!   lambda ~ uniform(.5, 1);
//!   tau ~ gamma(.0001, .0001);
//! }
//! ```

use burn::tensor::{Device, Tensor};
use parvi_model::dist::{Gamma, LogProb, Normal, Uniform};
use parvi_model::program::{Program, Target, Vars};
use parvi_model::tensor_ops::matrix_from_vec;
use parvi_model::{ModelError, ParamLayout};

use super::PosteriorDbError;
use super::data::Data;

/// The model with its data on the device.
#[derive(Debug)]
pub(super) struct Dugongs {
    /// Ages `[1, N]`.
    x: Tensor<2>,
    /// Lengths `[1, N]`.
    y: Tensor<2>,
}

impl Dugongs {
    /// Reads `N` (at least one dugong), the ages `x` and lengths `Y`.
    pub(super) fn new(data: &Data, device: &Device) -> Result<Self, PosteriorDbError> {
        let n = data.size("N", 0)?;
        if n == 0 {
            return Err(data.invalid("N", "must be at least 1: the likelihood needs an observation"));
        }
        let row = |v: Vec<f64>| matrix_from_vec(v.into_iter().map(|k| k as f32).collect(), 1, n, device);
        Ok(Self { x: row(data.reals("x", n, "N")?), y: row(data.reals("Y", n, "N")?) })
    }
}

impl Program for Dugongs {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        ParamLayout::new()
            .real("alpha", &[])?
            .real("beta", &[])?
            .interval("lambda", &[], 0.5, 1.0)?
            .positive("tau", &[])
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let (alpha, beta, lambda, tau) = (p.get("alpha")?, p.get("beta")?, p.get("lambda")?, p.get("tau")?);
        let sigma = p.transformed("sigma", tau.clone().sqrt().recip());
        p.transformed("U3", (lambda.clone() / lambda.clone().neg().add_scalar(1.0)).log());
        // pow(lambda, x) = exp(x log lambda), lambda in (0.5, 1).
        let m = alpha.clone() - beta.clone() * (lambda.clone().log() * self.x.clone()).exp();
        *target += Normal::new(m, sigma)?.log_prob(self.y.clone());
        *target += Normal::new(0.0, 1000.0)?.log_prob(alpha);
        *target += Normal::new(0.0, 1000.0)?.log_prob(beta);
        *target += Uniform::new(0.5, 1.0)?.log_prob(lambda);
        *target += Gamma::new(1.0e-4, 1.0e-4)?.log_prob(tau);
        Ok(())
    }
}
