//! `GLMM_Poisson_data-GLMM_Poisson_model`: Kéry & Schaub's Poisson GLMM (BPA chapter 6): yearly
//! counts with a cubic trend in standardised year and a normal random year effect; uniform priors
//! on bounded coefficients.
//!
//! ```stan
//! parameters {
//!   real<lower=-20, upper=20> alpha;
//!   real<lower=-10, upper=10> beta1;
//!   real<lower=-10, upper=20> beta2;
//!   real<lower=-10, upper=10> beta3;
//!   vector[n] eps;
//!   real<lower=0, upper=5> sigma;
//! }
//! transformed parameters {
//!   vector[n] log_lambda = alpha + beta1 * year + beta2 * year_squared + beta3 * year_cubed + eps;
//! }
//! model {
//!   alpha ~ uniform(-20, 20); beta1 ~ uniform(-10, 10);
//!   beta2 ~ uniform(-10, 10);   // beta2 is declared up to 20: above 10 the density is 0
//!   beta3 ~ uniform(-10, 10); sigma ~ uniform(0, 5);
//!   C ~ poisson_log(log_lambda);
//!   eps ~ normal(0, sigma);
//! }
//! generated quantities { vector<lower=0>[n] lambda = exp(log_lambda); }
//! ```

use burn::tensor::{Device, Tensor};
use parvi_model::dist::{LogProb, Normal, PoissonLog, Uniform};
use parvi_model::program::{Generated, Program, Target, Vars};
use parvi_model::tensor_ops::matrix_from_vec;
use parvi_model::{ModelError, ParamLayout};

use super::PosteriorDbError;
use super::data::Data;

/// The model with its data on the device.
#[derive(Debug)]
pub(super) struct GlmmPoisson {
    /// `[year; year^2; year^3]`, `[3, n]`.
    powers: Tensor<2>,
    likelihood: PoissonLog<2>,
    years: usize,
}

impl GlmmPoisson {
    /// Reads `n` (at least one year), the counts `C` (`int<lower=0>`) and `year`.
    pub(super) fn new(data: &Data, device: &Device) -> Result<Self, PosteriorDbError> {
        let years = data.size("n", 0)?;
        if years == 0 {
            return Err(data.invalid("n", "must be at least 1: the model needs a year"));
        }
        let counts: Vec<f64> = data.ints("C", years, "n")?.into_iter().map(|k| k as f64).collect();
        data.check_bounds("C", &counts, Some(0.0), None)?;
        let year = data.reals("year", years, "n")?;
        let powers: Vec<f32> = (1..=3).flat_map(|k| year.iter().map(move |y| y.powi(k) as f32)).collect();
        let counts = matrix_from_vec(counts.into_iter().map(|k| k as f32).collect(), 1, years, device);
        let likelihood = PoissonLog::new(counts).map_err(super::model_error("GLMM_Poisson_model"))?;
        Ok(Self { powers: matrix_from_vec(powers, 3, years, device), likelihood, years })
    }

    /// `alpha + beta1 * year + beta2 * year^2 + beta3 * year^3 + eps`, `[n, years]`.
    fn log_lambda(&self, p: &Vars) -> Result<Tensor<2>, ModelError> {
        let betas = Tensor::cat(vec![p.get("beta1")?, p.get("beta2")?, p.get("beta3")?], 1);
        Ok(betas.matmul(self.powers.clone()) + p.get("alpha")? + p.get("eps")?)
    }
}

impl Program for GlmmPoisson {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        ParamLayout::new()
            .interval("alpha", &[], -20.0, 20.0)?
            .interval("beta1", &[], -10.0, 10.0)?
            .interval("beta2", &[], -10.0, 20.0)?
            .interval("beta3", &[], -10.0, 10.0)?
            .real("eps", &[self.years])?
            .interval("sigma", &[], 0.0, 5.0)
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let log_lambda = p.transformed_shaped("log_lambda", &[self.years], self.log_lambda(p)?);
        let sigma = p.get("sigma")?;
        *target += Uniform::new(-20.0, 20.0)?.log_prob(p.get("alpha")?);
        let ten = Uniform::new(-10.0, 10.0)?;
        for beta in ["beta1", "beta2", "beta3"] {
            *target += ten.log_prob(p.get(beta)?);
        }
        *target += Uniform::new(0.0, 5.0)?.log_prob(sigma.clone());
        *target += self.likelihood.log_prob(log_lambda);
        *target += Normal::new(0.0, sigma)?.log_prob(p.get("eps")?);
        Ok(())
    }

    fn generated(&self, p: &Vars, out: &mut Generated) -> Result<(), ModelError> {
        out.output_shaped("lambda", &[self.years], self.log_lambda(p)?.exp());
        Ok(())
    }
}
