//! `surgical_data-surgical_model`: BUGS's surgical, mortality after cardiac surgery in 12
//! hospitals as a random-effects logistic model, with an inverse-gamma prior on the variance.
//!
//! ```stan
//! parameters { real mu; real<lower=0> sigmasq; array[N] real b; }
//! transformed parameters {
//!   real<lower=0> sigma = sqrt(sigmasq);
//!   array[N] real<lower=0, upper=1> p;   // p[i] = inv_logit(b[i])
//! }
//! model {
//!   mu ~ normal(0.0, 1000.0);
//!   sigmasq ~ inv_gamma(0.001, 0.001);
//!   b ~ normal(mu, sigma);
//!   r ~ binomial_logit(n, b);
//! }
//! generated quantities { real pop_mean = inv_logit(mu); }
//! ```

use burn::tensor::Device;
use burn::tensor::activation::sigmoid;
use parvi_model::dist::{BinomialLogit, InvGamma, LogProb, Normal};
use parvi_model::program::{Generated, Program, Target, Vars};
use parvi_model::tensor_ops::matrix_from_vec;
use parvi_model::{ModelError, ParamLayout};

use super::PosteriorDbError;
use super::data::Data;
use super::seeds::check_successes;

/// The model with its data on the device.
#[derive(Debug)]
pub(super) struct Surgical {
    likelihood: BinomialLogit<2>,
    hospitals: usize,
}

impl Surgical {
    /// Reads `N` (at least one hospital), the deaths `r` and operations `n`. The program declares
    /// them plain `int`, but `binomial_logit` rejects a negative count or trials and a count
    /// above its trials: those are errors here, naming the field and element.
    pub(super) fn new(data: &Data, device: &Device) -> Result<Self, PosteriorDbError> {
        let hospitals = data.size("N", 0)?;
        if hospitals == 0 {
            return Err(data.invalid("N", "must be at least 1: the model needs a hospital"));
        }
        let as_reals = |v: Vec<i64>| v.into_iter().map(|k| k as f64).collect::<Vec<f64>>();
        let r = as_reals(data.ints("r", hospitals, "N")?);
        let n = as_reals(data.ints("n", hospitals, "N")?);
        data.check_bounds("r", &r, Some(0.0), None)?;
        data.check_bounds("n", &n, Some(0.0), None)?;
        check_successes(data, ("r", &r), ("n", &n))?;
        let row = |v: &[f64]| matrix_from_vec(v.iter().map(|&k| k as f32).collect(), 1, hospitals, device);
        let likelihood = BinomialLogit::new(row(&r), row(&n)).map_err(super::model_error("surgical_model"))?;
        Ok(Self { likelihood, hospitals })
    }
}

impl Program for Surgical {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        ParamLayout::new().real("mu", &[])?.positive("sigmasq", &[])?.real("b", &[self.hospitals])
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let (mu, sigmasq, b) = (p.get("mu")?, p.get("sigmasq")?, p.get("b")?);
        let sigma = p.transformed("sigma", sigmasq.clone().sqrt());
        p.transformed_shaped("p", &[self.hospitals], sigmoid(b.clone()));
        *target += Normal::new(0.0, 1000.0)?.log_prob(mu.clone());
        *target += InvGamma::new(0.001, 0.001)?.log_prob(sigmasq);
        *target += Normal::new(mu, sigma)?.log_prob(b.clone());
        *target += self.likelihood.log_prob(b);
        Ok(())
    }

    fn generated(&self, p: &Vars, out: &mut Generated) -> Result<(), ModelError> {
        out.output("pop_mean", sigmoid(p.get("mu")?));
        Ok(())
    }
}
