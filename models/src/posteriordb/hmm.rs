//! posteriordb's two-state hidden Markov models (from the basketball-drive HMM case study):
//! `hmm_example` (normal emissions with ordered means) and `hmm_drive_0` (exponential emissions of
//! speed and distance, Dirichlet rows). Both Stan programs write the forward algorithm by hand
//! from the emissions alone (no initial distribution); [`hmm_marginal`] computes the same sum.

use burn::tensor::{Device, Tensor};
use parvi_model::dist::{Dirichlet, Exponential, LogProb, Normal};
use parvi_model::hmm::hmm_marginal;
use parvi_model::program::{Program, Target, Vars};
use parvi_model::tensor_ops::matrix_from_vec;
use parvi_model::{ModelError, ParamLayout};

use super::PosteriorDbError;
use super::data::Data;

/// `[n, K, K]` log transition matrix whose rows are the simplexes `theta1`, `theta2`.
fn log_transitions(p: &Vars) -> Result<Tensor<3>, ModelError> {
    let rows = [p.get("theta1")?, p.get("theta2")?].map(|row| row.log().unsqueeze_dim::<3>(1));
    Ok(Tensor::cat(rows.to_vec(), 1))
}

/// Data as a `[1, N, 1]` column of time points, broadcast against `[n, 1, K]` state parameters.
fn series(values: &[f64], device: &Device) -> Tensor<3> {
    matrix_from_vec(values.iter().map(|&v| v as f32).collect(), values.len(), 1, device).unsqueeze_dim(0)
}

/// The posteriordb HMMs take `K = 2` (their transformed parameters fill `theta[1]` and
/// `theta[2]` only).
fn two_states(data: &Data) -> Result<usize, PosteriorDbError> {
    match data.size("K", 1)? {
        2 => Ok(2),
        k => Err(data.invalid("K", format!("the model fills theta[1] and theta[2] only, so K must be 2, got {k}"))),
    }
}

fn length(data: &Data) -> Result<usize, PosteriorDbError> {
    match data.size("N", 1)? {
        0 => Err(data.invalid("N", "must be at least 1")),
        n => Ok(n),
    }
}

/// `hmm_example`: `y[t] ~ normal(mu[z_t], 1)`, `mu[1] ~ normal(3, 1)`, `mu[2] ~ normal(10, 1)`.
#[derive(Debug)]
pub(super) struct HmmExample {
    /// `[1, N, 1]`
    y: Tensor<3>,
}

impl HmmExample {
    pub(super) fn new(data: &Data, device: &Device) -> Result<Self, PosteriorDbError> {
        let (n, _) = (length(data)?, two_states(data)?);
        Ok(Self { y: series(&data.reals("y", n, "N")?, device) })
    }
}

impl Program for HmmExample {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        ParamLayout::new().simplex("theta1", 2)?.simplex("theta2", 2)?.positive_ordered("mu", 2)
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let mu = p.get("mu")?;
        let prior_means = matrix_from_vec(vec![3.0, 10.0], 1, 2, &mu.device());
        *target += Normal::new(prior_means, 1.0)?.log_prob(mu.clone());
        let log_omega = Normal::new(mu.unsqueeze_dim::<3>(1), 1.0)?.log_prob(self.y.clone());
        *target += hmm_marginal(log_omega, log_transitions(p)?, Tensor::zeros([p.particles(), 2], &self.y.device()))?;
        Ok(())
    }
}

/// `hmm_drive_0`: `u[t] ~ exponential(phi[z_t])`, `v[t] ~ exponential(lambda[z_t])`, Dirichlet
/// rows with prior `alpha[k, ]`, `phi` and `lambda` positive-ordered with normal priors.
#[derive(Debug)]
pub(super) struct HmmDrive {
    /// `[1, N, 1]` each.
    u: Tensor<3>,
    v: Tensor<3>,
    /// `theta[k] ~ dirichlet(alpha[k, ]')`.
    rows_prior: [Dirichlet<2>; 2],
}

impl HmmDrive {
    pub(super) fn new(data: &Data, device: &Device) -> Result<Self, PosteriorDbError> {
        let (n, k) = (length(data)?, two_states(data)?);
        let (u, v) = (data.reals("u", n, "N")?, data.reals("v", n, "N")?);
        data.check_bounds("u", &u, Some(0.0), None)?;
        data.check_bounds("v", &v, Some(0.0), None)?;
        let alpha = data.matrix("alpha", (k, "K"), (k, "K"))?;
        data.check_positive("alpha", &alpha, "it is a Dirichlet concentration")?;
        let row = |r: usize| Dirichlet::new(&alpha[r * k..(r + 1) * k]).map_err(super::model_error("hmm_drive_0"));
        Ok(Self { u: series(&u, device), v: series(&v, device), rows_prior: [row(0)?, row(1)?] })
    }
}

impl Program for HmmDrive {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        ParamLayout::new()
            .simplex("theta1", 2)?
            .simplex("theta2", 2)?
            .positive_ordered("phi", 2)?
            .positive_ordered("lambda", 2)
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let (phi, lambda) = (p.get("phi")?, p.get("lambda")?);
        *target += self.rows_prior[0].log_prob(p.get("theta1")?);
        *target += self.rows_prior[1].log_prob(p.get("theta2")?);
        let prior_means = matrix_from_vec(vec![0.0, 3.0], 1, 2, &phi.device());
        *target += Normal::new(prior_means.clone(), 1.0)?.log_prob(phi.clone());
        *target += Normal::new(prior_means, 1.0)?.log_prob(lambda.clone());
        let log_omega = Exponential::new(phi.unsqueeze_dim::<3>(1))?.log_prob(self.u.clone())
            + Exponential::new(lambda.unsqueeze_dim::<3>(1))?.log_prob(self.v.clone());
        *target += hmm_marginal(log_omega, log_transitions(p)?, Tensor::zeros([p.particles(), 2], &self.u.device()))?;
        Ok(())
    }
}
