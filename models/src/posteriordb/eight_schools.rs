//! `eight_schools-eight_schools_noncentered`: the eight schools, non-centred; and
//! `eight_schools-eight_schools_centered`, the same posterior in the centred parameterisation
//! (Neal's funnel between `theta` and `tau`).

use burn::tensor::{Device, Tensor};
use parvi_model::dist::{Cauchy, LogProb, Normal};
use parvi_model::program::{Generated, Program, Target, Vars};
use parvi_model::tensor_ops::matrix_from_vec;
use parvi_model::{ModelError, ParamLayout};

use super::PosteriorDbError;
use super::data::Data;

/// The model with its data on the device. Schools carry their own parameter, so the data are not
/// minibatched.
#[derive(Debug)]
pub(super) struct EightSchools {
    /// `[1, J]`
    y: Tensor<2>,
    /// `[1, J]`
    sigma: Tensor<2>,
}

impl EightSchools {
    /// Reads `J`, `y` and `sigma` (`<lower=0>`, and non-zero: it is a normal scale).
    pub(super) fn new(data: &Data, device: &Device) -> Result<Self, PosteriorDbError> {
        let j = data.size("J", 0)?;
        if j == 0 {
            return Err(data.invalid("J", "must be at least 1: the model needs a school"));
        }
        let y = data.reals("y", j, "J")?;
        let sigma = data.reals("sigma", j, "J")?;
        data.check_bounds("sigma", &sigma, Some(0.0), None)?;
        data.check_positive("sigma", &sigma, "it is the scale of a normal likelihood")?;
        let row = |v: &[f64]| matrix_from_vec(v.iter().map(|&x| x as f32).collect(), 1, j, device);
        Ok(Self { y: row(&y), sigma: row(&sigma) })
    }
}

impl Program for EightSchools {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        ParamLayout::new().real("theta_trans", &[self.y.dims()[1]])?.real("mu", &[])?.positive("tau", &[])
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let (theta_trans, mu, tau) = (p.get("theta_trans")?, p.get("mu")?, p.get("tau")?);
        let theta = p.transformed("theta", theta_trans.clone() * tau.clone() + mu.clone());
        *target += Normal::new(0.0, 1.0)?.log_prob(theta_trans);
        *target += Normal::new(theta, self.sigma.clone())?.log_prob(self.y.clone());
        *target += Normal::new(0.0, 5.0)?.log_prob(mu);
        *target += Cauchy::new(0.0, 5.0)?.log_prob(tau);
        Ok(())
    }

    /// `vector[J] log_lik; log_lik[j] = normal_lpdf(y[j] | theta[j], sigma[j]);` (not in
    /// posteriordb's program: the pointwise log-likelihood that PSIS-LOO reads, as the Stan
    /// documentation's LOO examples add it).
    fn generated(&self, p: &Vars, out: &mut Generated) -> Result<(), ModelError> {
        let theta = p.get("theta_trans")? * p.get("tau")? + p.get("mu")?;
        out.output_shaped(
            "log_lik",
            &[self.y.dims()[1]],
            Normal::new(theta, self.sigma.clone())?.log_prob(self.y.clone()),
        );
        Ok(())
    }
}

/// `eight_schools_centered`: `theta ~ normal(mu, tau)` sampled directly, the same data block.
///
/// ```stan
/// parameters { array[J] real theta; real mu; real<lower=0> tau; }
/// model {
///   tau ~ cauchy(0, 5);
///   theta ~ normal(mu, tau);
///   y ~ normal(theta, sigma);
///   mu ~ normal(0, 5);
/// }
/// ```
#[derive(Debug)]
pub(super) struct EightSchoolsCentered(EightSchools);

impl EightSchoolsCentered {
    /// The data block of the non-centred program, checked the same way.
    pub(super) fn new(data: &Data, device: &Device) -> Result<Self, PosteriorDbError> {
        EightSchools::new(data, device).map(Self)
    }
}

impl Program for EightSchoolsCentered {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        ParamLayout::new().real("theta", &[self.0.y.dims()[1]])?.real("mu", &[])?.positive("tau", &[])
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let (theta, mu, tau) = (p.get("theta")?, p.get("mu")?, p.get("tau")?);
        *target += Cauchy::new(0.0, 5.0)?.log_prob(tau.clone());
        *target += Normal::new(mu.clone(), tau)?.log_prob(theta.clone());
        *target += Normal::new(theta, self.0.sigma.clone())?.log_prob(self.0.y.clone());
        *target += Normal::new(0.0, 5.0)?.log_prob(mu);
        Ok(())
    }
}
