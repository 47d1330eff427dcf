//! Stochastic volatility, non-centred (Stan User's Guide, "Stochastic volatility models"):
//! the log-volatility `h` is a stationary AR(1) about `mu`, and returns are normal with sd
//! `exp(h / 2)`.
//!
//! ```stan
//! data {
//!   int<lower=1> T;
//!   vector[T] y;
//! }
//! parameters {
//!   real mu;
//!   real<lower=-1, upper=1> phi;
//!   real<lower=0> sigma;
//!   vector[T] h_std;
//! }
//! transformed parameters {
//!   vector[T] h = h_std * sigma;
//!   h[1] /= sqrt(1 - phi * phi);
//!   h += mu;
//!   for (t in 2:T)
//!     h[t] += phi * (h[t - 1] - mu);
//! }
//! model {
//!   phi ~ uniform(-1, 1);
//!   sigma ~ cauchy(0, 5);
//!   mu ~ cauchy(0, 10);
//!   h_std ~ std_normal();
//!   y ~ normal(0, exp(h / 2));
//! }
//! ```
//!
//! The time loop is the linear recurrence `x[t] = phi x[t-1] + sigma h_std[t]` of
//! `x = h - mu` (`x[1] = sigma h_std[1] / sqrt(1 - phi^2)`): one [`linear_scan`], `ceil(log2 T)`
//! rounds of whole-row operations over all particles.

use burn::tensor::{Device, Tensor};
use parvi_model::dist::{Cauchy, LogProb, Normal, Uniform};
use parvi_model::program::{Program, Target, Vars};
use parvi_model::scan::linear_scan;
use parvi_model::{ModelError, ParamLayout};

use crate::stan_data::StanData;

use super::{StanUsersDataError, TrueValues, check_finite, invalid, matrix, rng, std_normal};

const MODEL: &str = "StochasticVolatility";

/// The data block: `T` returns `y`.
#[derive(Clone, Debug, PartialEq)]
pub struct StochasticVolatilityData {
    /// Returns, finite.
    pub y: Vec<f64>,
}

/// The program with its data on the device.
#[derive(Debug)]
pub struct StochasticVolatility {
    data: StochasticVolatilityData,
    /// `[1, T]`
    y: Tensor<2>,
}

impl StochasticVolatility {
    /// Checks the data (at least two returns, all finite) and puts it on `device`.
    pub fn new(data: StochasticVolatilityData, device: &Device) -> Result<Self, ModelError> {
        if data.y.len() < 2 {
            return Err(invalid(MODEL, "y", format!("has {} returns, an AR(1) needs at least 2", data.y.len())));
        }
        check_finite(MODEL, "y", &data.y)?;
        let y = matrix(&data.y, 1, data.y.len(), device);
        Ok(Self { data, y })
    }

    /// Reads the data block from a Stan JSON data file (`T`, `y`).
    pub fn from_stan_data(data: &StanData, device: &Device) -> Result<Self, StanUsersDataError> {
        let y = data.vector("y", "T")?.finite()?.into_vec();
        Ok(Self::new(StochasticVolatilityData { y }, device)?)
    }

    /// `periods` returns drawn from `mu = -1`, `phi = 0.95`, `sigma = 0.25` (`h[1]` from the
    /// stationary distribution). The true values are these three and the realised `h[t]`.
    pub fn simulate(seed: u64, periods: usize, device: &Device) -> Result<(Self, TrueValues), ModelError> {
        let (mu, phi, sigma): (f64, f64, f64) = (-1.0, 0.95, 0.25);
        let mut rng = rng(seed);
        let mut h = Vec::with_capacity(periods);
        let mut y = Vec::with_capacity(periods);
        for t in 0..periods {
            let ht = if t == 0 {
                mu + sigma / (1.0 - phi * phi).sqrt() * std_normal(&mut rng)
            } else {
                mu + phi * (h[t - 1] - mu) + sigma * std_normal(&mut rng)
            };
            h.push(ht);
            y.push((ht / 2.0).exp() * std_normal(&mut rng));
        }
        let mut truth = TrueValues::default();
        truth.push("mu", mu);
        truth.push("phi", phi);
        truth.push("sigma", sigma);
        truth.push_vector("h", &h);
        Ok((Self::new(StochasticVolatilityData { y }, device)?, truth))
    }

    /// The data block.
    pub fn data(&self) -> &StochasticVolatilityData {
        &self.data
    }
}

impl Program for StochasticVolatility {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        ParamLayout::new()
            .real("mu", &[])?
            .interval("phi", &[], -1.0, 1.0)?
            .positive("sigma", &[])?
            .real("h_std", &[self.data.y.len()])
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let (mu, phi, sigma, h_std) = (p.get("mu")?, p.get("phi")?, p.get("sigma")?, p.get("h_std")?);
        let periods = self.data.y.len();
        // The scan's inputs: sigma h_std[t], the first scaled to the stationary sd.
        let stationary = phi.clone().square().neg().add_scalar(1.0).sqrt();
        let first = h_std.clone().narrow(1, 0, 1) * sigma.clone() / stationary;
        let rest = h_std.clone().narrow(1, 1, periods - 1) * sigma.clone();
        let h = p.transformed("h", linear_scan(phi.clone(), Tensor::cat(vec![first, rest], 1))? + mu.clone());
        *target += Uniform::new(-1.0, 1.0)?.log_prob(phi);
        *target += Cauchy::new(0.0, 5.0)?.log_prob(sigma);
        *target += Cauchy::new(0.0, 10.0)?.log_prob(mu);
        *target += Normal::new(0.0, 1.0)?.log_prob(h_std);
        *target += Normal::new(0.0, h.mul_scalar(0.5).exp())?.log_prob(self.y.clone());
        Ok(())
    }
}
