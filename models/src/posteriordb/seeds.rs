//! `seeds_data-seeds_model`: BUGS's seeds, a random-effects logistic regression (Crowder 1978):
//! germinated seeds `n` of `N` on 21 plates, two factors and their interaction, a normal plate
//! effect whose precision has BUGS's vague gamma prior.
//!
//! ```stan
//! parameters {
//!   real alpha0; real alpha1; real alpha12; real alpha2;
//!   real<lower=0> tau;
//!   vector[I] b;
//! }
//! transformed parameters { real<lower=0> sigma = 1.0 / sqrt(tau); }
//! model {
//!   alpha0 ~ normal(0.0, 1.0E3); alpha1 ~ normal(0.0, 1.0E3);
//!   alpha2 ~ normal(0.0, 1.0E3); alpha12 ~ normal(0.0, 1.0E3);
//!   tau ~ gamma(1.0E-3, 1.0E-3);
//!   b ~ normal(0.0, sigma);
//!   n ~ binomial_logit(N, alpha0 + alpha1 * x1 + alpha2 * x2 + alpha12 * x1x2 + b);
//! }
//! ```

use burn::tensor::{Device, Tensor};
use parvi_model::dist::{BinomialLogit, Gamma, LogProb, Normal};
use parvi_model::program::{Program, Target, Vars};
use parvi_model::tensor_ops::matrix_from_vec;
use parvi_model::{ModelError, ParamLayout};

use super::PosteriorDbError;
use super::data::Data;

/// The model with its data on the device.
#[derive(Debug)]
pub(super) struct Seeds {
    /// The covariates as rows `[x1; x2; x1 .* x2]`, `[3, I]`.
    x: Tensor<2>,
    likelihood: BinomialLogit<2>,
    plates: usize,
}

impl Seeds {
    /// Reads `I` (at least one plate), the counts `n` and trials `N` (`int<lower=0>`, and
    /// `n <= N` as `binomial_logit` requires) and the covariates `x1`, `x2`.
    pub(super) fn new(data: &Data, device: &Device) -> Result<Self, PosteriorDbError> {
        let plates = data.size("I", 0)?;
        if plates == 0 {
            return Err(data.invalid("I", "must be at least 1: the model needs a plate"));
        }
        let n = data.ints("n", plates, "I")?;
        let trials = data.ints("N", plates, "I")?;
        let as_reals = |v: &[i64]| v.iter().map(|&k| k as f64).collect::<Vec<f64>>();
        let (n, trials) = (as_reals(&n), as_reals(&trials));
        data.check_bounds("n", &n, Some(0.0), None)?;
        data.check_bounds("N", &trials, Some(0.0), None)?;
        check_successes(data, ("n", &n), ("N", &trials))?;
        let x1 = data.reals("x1", plates, "I")?;
        let x2 = data.reals("x2", plates, "I")?;
        let x1x2: Vec<f64> = x1.iter().zip(&x2).map(|(a, b)| a * b).collect();
        let x: Vec<f32> = [x1, x2, x1x2].iter().flatten().map(|&v| v as f32).collect();
        let row = |v: &[f64]| matrix_from_vec(v.iter().map(|&k| k as f32).collect(), 1, plates, device);
        let likelihood = BinomialLogit::new(row(&n), row(&trials)).map_err(super::model_error("seeds_model"))?;
        Ok(Self { x: matrix_from_vec(x, 3, plates, device), likelihood, plates })
    }
}

/// Stan's `binomial_logit(N, ...)` rejects a count above its trials: an error naming the count's
/// field and element (1-based), before the model is built.
pub(super) fn check_successes(
    data: &Data,
    (count_field, counts): (&str, &[f64]),
    (trials_field, trials): (&str, &[f64]),
) -> Result<(), PosteriorDbError> {
    match counts.iter().zip(trials).position(|(k, t)| k > t) {
        Some(i) => Err(data.invalid(
            count_field,
            format!(
                "value {} at element {} exceeds {trials_field}[{}] = {}: a binomial count cannot exceed its trials",
                counts[i],
                i + 1,
                i + 1,
                trials[i]
            ),
        )),
        None => Ok(()),
    }
}

impl Program for Seeds {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        ParamLayout::new()
            .real("alpha0", &[])?
            .real("alpha1", &[])?
            .real("alpha12", &[])?
            .real("alpha2", &[])?
            .positive("tau", &[])?
            .real("b", &[self.plates])
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let (alpha0, alpha1, alpha12, alpha2) =
            (p.get("alpha0")?, p.get("alpha1")?, p.get("alpha12")?, p.get("alpha2")?);
        let (tau, b) = (p.get("tau")?, p.get("b")?);
        let sigma = p.transformed("sigma", tau.clone().sqrt().recip());
        let vague = Normal::new(0.0, 1.0e3)?;
        // [n, 3] x [3, I]: alpha1 * x1 + alpha2 * x2 + alpha12 * x1x2 for every particle.
        let slopes = Tensor::cat(vec![alpha1.clone(), alpha2.clone(), alpha12.clone()], 1);
        let eta = slopes.matmul(self.x.clone()) + alpha0.clone() + b.clone();
        for alpha in [alpha0, alpha1, alpha2, alpha12] {
            *target += vague.log_prob(alpha);
        }
        *target += Gamma::new(1.0e-3, 1.0e-3)?.log_prob(tau);
        *target += Normal::new(0.0, sigma)?.log_prob(b);
        *target += self.likelihood.log_prob(eta);
        Ok(())
    }
}
