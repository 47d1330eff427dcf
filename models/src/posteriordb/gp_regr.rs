//! `gp_pois_regr-gp_regr`: a GP's marginal likelihood, `y ~ multi_normal_cholesky(0, L)` with
//! `L = cholesky(gp_exp_quad_cov(x, alpha, rho) + diag(sigma))` (the Stan program adds `sigma`,
//! not `sigma^2`, to the diagonal), `rho ~ gamma(25, 4)`, `alpha ~ normal(0, 2)`,
//! `sigma ~ normal(0, 1)`, all three positive.

use burn::tensor::{Device, Tensor};
use parvi_model::dist::{Gamma, LogProb, Normal};
use parvi_model::linalg::{cholesky_factor, exp_quad_cov};
use parvi_model::mvn::MultiNormalCholesky;
use parvi_model::program::{Program, Target, Vars};
use parvi_model::tensor_ops::matrix_from_vec;
use parvi_model::{ModelError, ParamLayout};

use super::PosteriorDbError;
use super::data::Data;

#[derive(Debug)]
pub(super) struct GpRegr {
    /// `[N]`
    x: Tensor<1>,
    /// `[1, N]`
    y: Tensor<2>,
    /// The identity `[1, N, N]` (transformed data).
    eye: Tensor<3>,
}

impl GpRegr {
    pub(super) fn new(data: &Data, device: &Device) -> Result<Self, PosteriorDbError> {
        let n = data.size("N", 1)?;
        let x: Vec<f32> = data.reals("x", n, "N")?.iter().map(|&v| v as f32).collect();
        let y = data.reals("y", n, "N")?;
        Ok(Self {
            x: Tensor::from_floats(x.as_slice(), device),
            y: matrix_from_vec(y.iter().map(|&v| v as f32).collect(), 1, n, device),
            eye: Tensor::<2>::eye(n, device).unsqueeze(),
        })
    }
}

impl Program for GpRegr {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        ParamLayout::new().positive("rho", &[])?.positive("alpha", &[])?.positive("sigma", &[])
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let (rho, alpha, sigma) = (p.get("rho")?, p.get("alpha")?, p.get("sigma")?);
        let cov = exp_quad_cov(self.x.clone(), alpha.clone(), rho.clone())?
            + self.eye.clone() * sigma.clone().unsqueeze_dim(2);
        let l_cov = cholesky_factor(cov)?;
        *target += Gamma::new(25.0, 4.0)?.log_prob(rho);
        *target += Normal::new(0.0, 2.0)?.log_prob(alpha);
        *target += Normal::new(0.0, 1.0)?.log_prob(sigma);
        *target += MultiNormalCholesky::new(None, l_cov)?.log_prob(self.y.clone())?;
        Ok(())
    }
}
