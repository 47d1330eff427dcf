//! Models of the kinds Stan users write for themselves, each a [`Program`] that reads line by
//! line like the Stan program in its doc comment, with a seeded simulator that draws a data set
//! from known parameters (issue 43's acceptance: NUTS through each density recovers them,
//! `crates/parvi-infer/tests/stan_users.rs`).
//!
//! | model | kind | DSL pieces |
//! |---|---|---|
//! | [`OrderedLogisticRegression`] | ordinal regression | `ordered[K-1]` cut points, `OrderedLogistic` |
//! | [`VaryingEffectsLogit`] | multilevel logistic, correlated varying effects | `cholesky_factor_corr`, `LkjCorrCholesky`, `diag_pre_multiply`, `IndexArray` |
//! | [`ItemResponse2pl`] | two-parameter item response, hierarchical items | `IndexArray`, `BernoulliLogit`, `LogNormal` |
//! | [`WeibullSurvival`] | censored survival regression | `Weibull::log_prob` and `lccdf` |
//! | [`ZeroInflatedPoisson`] | zero-inflated counts | `log_mix`, `PoissonLog`, `log1m` |
//! | [`ChangePoint`] | change point marginalised | `cumulative_sum`, `log_sum_exp` |
//! | [`StochasticVolatility`] | non-centred AR(1) log-volatility | `scan::linear_scan` |
//! | [`MultiLogit`] | multinomial logit | `CategoricalLogit` |
//! | [`OneCompartmentMm`] | pharmacokinetics, Michaelis-Menten elimination | `ode_stiff` (Stan's `ode_bdf`) |
//!
//! Data are held as Stan's data block holds them: integers as `i64`, categories and index
//! arrays 1-based; a constructor checks every field once and names the one at fault
//! (`ModelError::InvalidParameter` with the model as `dist` and the field as `name`). Each
//! `simulate` documents its true parameters and returns them under Stan's output names
//! ([`TrueValues`]), the names `Compiled::names` reports. [`ItemResponse2pl`] and
//! [`StochasticVolatility`] also read Stan's JSON data (`from_stan_data`), the fields named as in
//! their Stan programs.
//!
//! [`Program`]: parvi_model::program::Program

mod change_point;
mod irt;
mod multi_logit;
mod ordinal;
mod pharmacokinetic;
mod stochastic_volatility;
mod survival;
mod varying_effects;
mod zero_inflated;

pub use change_point::{ChangePoint, ChangePointData};
pub use irt::{ItemResponse2pl, ItemResponseData};
pub use multi_logit::{MultiLogit, MultiLogitData};
pub use ordinal::{OrderedLogisticRegression, OrdinalData};
pub use pharmacokinetic::{OneCompartmentMm, PharmacokineticData};
pub use stochastic_volatility::{StochasticVolatility, StochasticVolatilityData};
pub use survival::{WeibullSurvival, WeibullSurvivalData};
pub use varying_effects::{VaryingEffectsData, VaryingEffectsLogit};
pub use zero_inflated::{ZeroInflatedData, ZeroInflatedPoisson};

use burn::tensor::{Device, Tensor, TensorData};
use parvi_model::ModelError;
use thiserror::Error;

use crate::stan_data::StanDataError;
use rand::SeedableRng;
use rand_distr::Distribution;

/// The parameters a data set was simulated from, under Stan's output names (`beta[1]`,
/// `L[2,1]`, a transformed parameter's `h[3]`), in the order the simulator lists them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TrueValues {
    values: Vec<(String, f64)>,
}

impl TrueValues {
    fn push(&mut self, name: impl Into<String>, value: f64) {
        self.values.push((name.into(), value));
    }

    /// `name[1]`, ..., `name[len]` (a vector).
    fn push_vector(&mut self, name: &str, values: &[f64]) {
        for (i, &v) in values.iter().enumerate() {
            self.push(format!("{name}[{}]", i + 1), v);
        }
    }

    /// The value of `name`, if the simulator set it.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.values.iter().find(|(n, _)| n == name).map(|&(_, v)| v)
    }

    /// Every `(name, value)`.
    pub fn iter(&self) -> impl Iterator<Item = (&str, f64)> {
        self.values.iter().map(|(n, v)| (n.as_str(), *v))
    }
}

/// Why a model could not be built from a Stan JSON data file: the file's own error (a missing
/// field, a value outside its declared bounds), or the model's check of the values.
#[derive(Debug, Error)]
pub enum StanUsersDataError {
    /// The data file, as `stan_data` reads it.
    #[error(transparent)]
    Data(#[from] StanDataError),
    /// The model's own checks.
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// A data error naming the model and the field.
fn invalid(model: &'static str, field: &'static str, reason: impl Into<String>) -> ModelError {
    ModelError::InvalidParameter { dist: model, name: field, reason: reason.into() }
}

/// Every value finite.
fn check_finite(model: &'static str, field: &'static str, values: &[f64]) -> Result<(), ModelError> {
    match values.iter().position(|v| !v.is_finite()) {
        Some(at) => Err(invalid(model, field, format!("entry {} is {}, must be finite", at + 1, values[at]))),
        None => Ok(()),
    }
}

/// `values.len() == expected`, where `what` says what the length should be.
fn check_len<T>(
    model: &'static str,
    field: &'static str,
    values: &[T],
    expected: usize,
    what: &str,
) -> Result<(), ModelError> {
    if values.len() != expected {
        return Err(invalid(model, field, format!("has {} values, expected {expected} ({what})", values.len())));
    }
    Ok(())
}

/// Every entry in `lo..=hi` (Stan's `int<lower=lo, upper=hi>`).
fn check_int_range(
    model: &'static str,
    field: &'static str,
    values: &[i64],
    lo: i64,
    hi: i64,
) -> Result<(), ModelError> {
    match values.iter().position(|v| !(lo..=hi).contains(v)) {
        Some(at) => Err(invalid(model, field, format!("entry {} is {}, must be in {lo}..={hi}", at + 1, values[at]))),
        None => Ok(()),
    }
}

/// Every entry `>= 0` (a count).
fn check_counts(model: &'static str, field: &'static str, values: &[i64]) -> Result<(), ModelError> {
    match values.iter().position(|&v| v < 0) {
        Some(at) => Err(invalid(model, field, format!("entry {} is {}, a count must be >= 0", at + 1, values[at]))),
        None => Ok(()),
    }
}

/// Data as a `[rows, cols]` tensor (`[1, N]` for a row shared by all particles).
fn matrix(values: &[f64], rows: usize, cols: usize, device: &Device) -> Tensor<2> {
    let v: Vec<f32> = values.iter().map(|&x| x as f32).collect();
    Tensor::from_data(TensorData::new(v, [rows, cols]), device)
}

/// Integers as a `[1, N]` data row.
fn int_row(values: &[i64], device: &Device) -> Tensor<2> {
    let v: Vec<f64> = values.iter().map(|&x| x as f64).collect();
    matrix(&v, 1, v.len(), device)
}

/// The simulators' seeded stream.
fn rng(seed: u64) -> chacha20::ChaCha8Rng {
    chacha20::ChaCha8Rng::seed_from_u64(seed)
}

/// One standard normal draw.
fn std_normal(rng: &mut chacha20::ChaCha8Rng) -> f64 {
    rand_distr::StandardNormal.sample(rng)
}

/// One uniform draw in `(0, 1)`.
fn uniform(rng: &mut chacha20::ChaCha8Rng) -> f64 {
    rand_distr::Open01.sample(rng)
}

/// One Poisson draw of rate `rate > 0`.
fn poisson(rng: &mut chacha20::ChaCha8Rng, rate: f64) -> i64 {
    let draw: f64 = rand_distr::Poisson::new(rate).expect("a finite positive rate").sample(rng);
    draw as i64
}

/// `1 / (1 + e^-x)`.
fn inv_logit(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}
