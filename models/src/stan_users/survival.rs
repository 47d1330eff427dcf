//! Weibull survival regression with right censoring (the proportional-hazards form of Stan's
//! survival examples): an event time contributes its density, a time known only to exceed the
//! censoring time its `weibull_lccdf`:
//!
//! ```stan
//! data {
//!   int<lower=1> P;
//!   int<lower=0> N_obs;
//!   int<lower=0> N_cens;
//!   matrix[N_obs, P] x_obs;
//!   matrix[N_cens, P] x_cens;
//!   vector<lower=0>[N_obs] t_obs;     // event times
//!   vector<lower=0>[N_cens] t_cens;   // censoring times (no event by then)
//! }
//! parameters {
//!   real<lower=0> alpha;   // shape
//!   real mu;
//!   vector[P] beta;
//! }
//! model {
//!   alpha ~ lognormal(0, 1);
//!   mu ~ normal(0, 5);
//!   beta ~ normal(0, 2);
//!   t_obs ~ weibull(alpha, exp(-(mu + x_obs * beta) / alpha));
//!   target += weibull_lccdf(t_cens | alpha, exp(-(mu + x_cens * beta) / alpha));
//! }
//! ```
//!
//! With scale `exp(-eta / alpha)` the hazard is `alpha t^(alpha - 1) exp(eta)`: `beta` are log
//! hazard ratios.

use burn::tensor::{Device, Tensor};
use parvi_model::dist::{LogNormal, LogProb, Normal, Weibull};
use parvi_model::program::{Program, Target, Vars};
use parvi_model::{ModelError, ParamLayout};

use super::{TrueValues, check_finite, check_len, invalid, matrix, rng, std_normal, uniform};

const MODEL: &str = "WeibullSurvival";

/// The data block: `P` covariates; event times `t_obs` with covariates `x_obs` `[N_obs, P]`,
/// censoring times `t_cens` with `x_cens` `[N_cens, P]` (row-major).
#[derive(Clone, Debug, PartialEq)]
pub struct WeibullSurvivalData {
    /// Covariates `P >= 1`.
    pub p: usize,
    /// Event times, each `> 0`.
    pub t_obs: Vec<f64>,
    /// Covariates of the events `[N_obs, P]`.
    pub x_obs: Vec<f64>,
    /// Censoring times, each `> 0`.
    pub t_cens: Vec<f64>,
    /// Covariates of the censored `[N_cens, P]`.
    pub x_cens: Vec<f64>,
}

/// Times `[1, N]` and transposed covariates `[P, N]` of one kind of observation.
#[derive(Debug)]
struct Rows {
    t: Tensor<2>,
    x_t: Tensor<2>,
}

/// The program with its data on the device.
#[derive(Debug)]
pub struct WeibullSurvival {
    data: WeibullSurvivalData,
    /// `None` where there are no such rows.
    events: Option<Rows>,
    censored: Option<Rows>,
}

fn rows(
    t: &[f64],
    x: &[f64],
    p: usize,
    (t_name, x_name): (&'static str, &'static str),
    device: &Device,
) -> Result<Option<Rows>, ModelError> {
    check_len(MODEL, x_name, x, t.len() * p, "one row of P covariates per time")?;
    check_finite(MODEL, x_name, x)?;
    check_finite(MODEL, t_name, t)?;
    if let Some(at) = t.iter().position(|&v| v <= 0.0) {
        return Err(invalid(MODEL, t_name, format!("entry {} is {}, a time must be > 0", at + 1, t[at])));
    }
    if t.is_empty() {
        return Ok(None);
    }
    Ok(Some(Rows { t: matrix(t, 1, t.len(), device), x_t: matrix(x, t.len(), p, device).transpose() }))
}

impl WeibullSurvival {
    /// Checks the data (`P >= 1`, at least one time, every time finite and `> 0`, covariates
    /// finite, `N x P` of them) and puts it on `device`.
    pub fn new(data: WeibullSurvivalData, device: &Device) -> Result<Self, ModelError> {
        if data.p == 0 {
            return Err(invalid(MODEL, "P", "is 0, the regression needs a covariate"));
        }
        if data.t_obs.is_empty() && data.t_cens.is_empty() {
            return Err(invalid(MODEL, "t_obs", "and t_cens are both empty: the model needs an observation"));
        }
        let events = rows(&data.t_obs, &data.x_obs, data.p, ("t_obs", "x_obs"), device)?;
        let censored = rows(&data.t_cens, &data.x_cens, data.p, ("t_cens", "x_cens"), device)?;
        Ok(Self { data, events, censored })
    }

    /// `n` subjects with `P = 2` standard normal covariates, event times drawn from
    /// `alpha = 1.3`, `mu = -0.5`, `beta = [0.8, -0.5]` (by inversion: `t = sigma (-ln u)^(1 /
    /// alpha)`), each censored at a time uniform on `(0, 3)` if the event comes later (about a
    /// third are).
    pub fn simulate(seed: u64, n: usize, device: &Device) -> Result<(Self, TrueValues), ModelError> {
        let (alpha, mu, beta) = (1.3, -0.5, [0.8, -0.5]);
        let mut rng = rng(seed);
        let mut data = WeibullSurvivalData { p: 2, t_obs: vec![], x_obs: vec![], t_cens: vec![], x_cens: vec![] };
        for _ in 0..n {
            let x = [std_normal(&mut rng), std_normal(&mut rng)];
            let sigma = f64::exp(-(mu + x[0] * beta[0] + x[1] * beta[1]) / alpha);
            let t = sigma * (-uniform(&mut rng).ln()).powf(1.0 / alpha);
            let censor = 3.0 * uniform(&mut rng);
            if t <= censor {
                data.t_obs.push(t);
                data.x_obs.extend(x);
            } else {
                data.t_cens.push(censor);
                data.x_cens.extend(x);
            }
        }
        let mut truth = TrueValues::default();
        truth.push("alpha", alpha);
        truth.push("mu", mu);
        truth.push_vector("beta", &beta);
        Ok((Self::new(data, device)?, truth))
    }

    /// The data block.
    pub fn data(&self) -> &WeibullSurvivalData {
        &self.data
    }
}

impl Program for WeibullSurvival {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        ParamLayout::new().positive("alpha", &[])?.real("mu", &[])?.real("beta", &[self.data.p])
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let (alpha, mu, beta) = (p.get("alpha")?, p.get("mu")?, p.get("beta")?);
        *target += LogNormal::new(0.0, 1.0)?.log_prob(alpha.clone());
        *target += Normal::new(0.0, 5.0)?.log_prob(mu.clone());
        *target += Normal::new(0.0, 2.0)?.log_prob(beta.clone());
        // exp(-(mu + x beta) / alpha), [n, N].
        let scale = |x_t: &Tensor<2>| ((beta.clone().matmul(x_t.clone()) + mu.clone()) / alpha.clone()).neg().exp();
        if let Some(rows) = &self.events {
            *target += Weibull::new(alpha.clone(), scale(&rows.x_t))?.log_prob(rows.t.clone());
        }
        if let Some(rows) = &self.censored {
            *target += Weibull::new(alpha.clone(), scale(&rows.x_t))?.lccdf(rows.t.clone());
        }
        Ok(())
    }
}
