//! Zero-inflated Poisson regression (Stan User's Guide, "Zero-inflated models"): a zero is
//! either a structural zero (probability `theta`) or a Poisson zero, a positive count only a
//! Poisson draw. The two branches of the guide's loop are two batched terms here, over the
//! zero and the positive rows, split once when the data are read:
//!
//! ```stan
//! data {
//!   int<lower=0> N;
//!   vector[N] x;
//!   array[N] int<lower=0> y;
//! }
//! parameters {
//!   real<lower=0, upper=1> theta;
//!   real a;
//!   real b;
//! }
//! model {
//!   a ~ normal(0, 5);
//!   b ~ normal(0, 5);
//!   for (n in 1:N) {
//!     if (y[n] == 0) {
//!       target += log_mix(theta, 0, poisson_log_lpmf(0 | a + b * x[n]));
//!     } else {
//!       target += log1m(theta) + poisson_log_lpmf(y[n] | a + b * x[n]);
//!     }
//!   }
//! }
//! ```
//!
//! (`log_mix(theta, 0, lp)` is the guide's `log_sum_exp(log(theta), log1m(theta) + lp)`.)

use burn::tensor::{Device, Tensor};
use parvi_model::dist::{LogProb, Normal, PoissonLog, log_mix};
use parvi_model::functions::log1m;
use parvi_model::program::{Program, Target, Vars};
use parvi_model::{ModelError, ParamLayout};

use super::{
    TrueValues, check_counts, check_finite, check_len, int_row, invalid, matrix, poisson, rng, std_normal, uniform,
};

const MODEL: &str = "ZeroInflatedPoisson";

/// The data block: a covariate `x` and a count `y` per observation.
#[derive(Clone, Debug, PartialEq)]
pub struct ZeroInflatedData {
    /// Covariate of each observation.
    pub x: Vec<f64>,
    /// Count of each observation, `>= 0`.
    pub y: Vec<i64>,
}

/// Covariates `[1, N]` of some rows and the Poisson likelihood of their counts.
#[derive(Debug)]
struct Rows {
    x: Tensor<2>,
    poisson: PoissonLog<2>,
}

/// The program with its data on the device.
#[derive(Debug)]
pub struct ZeroInflatedPoisson {
    data: ZeroInflatedData,
    /// The rows with `y = 0`, and those with `y > 0` (`None` where there are none).
    zeros: Option<Rows>,
    positive: Option<Rows>,
}

impl ZeroInflatedPoisson {
    /// Checks the data (at least one observation, counts `>= 0`, `x` finite, both of length `N`)
    /// and puts it on `device`.
    pub fn new(data: ZeroInflatedData, device: &Device) -> Result<Self, ModelError> {
        if data.y.is_empty() {
            return Err(invalid(MODEL, "y", "is empty: the model needs an observation"));
        }
        check_counts(MODEL, "y", &data.y)?;
        check_len(MODEL, "x", &data.x, data.y.len(), "one covariate per count, N")?;
        check_finite(MODEL, "x", &data.x)?;
        let split = |keep: fn(i64) -> bool| -> Result<Option<Rows>, ModelError> {
            let (x, y): (Vec<f64>, Vec<i64>) =
                data.x.iter().zip(&data.y).filter(|&(_, &y)| keep(y)).map(|(&x, &y)| (x, y)).unzip();
            if y.is_empty() {
                return Ok(None);
            }
            Ok(Some(Rows { x: matrix(&x, 1, x.len(), device), poisson: PoissonLog::new(int_row(&y, device))? }))
        };
        let (zeros, positive) = (split(|y| y == 0)?, split(|y| y > 0)?);
        Ok(Self { data, zeros, positive })
    }

    /// `n` observations with standard normal `x`, drawn from `theta = 0.3`, `a = 1.0`,
    /// `b = 0.5`: a structural zero with probability `theta`, else `poisson(exp(a + b x))`.
    pub fn simulate(seed: u64, n: usize, device: &Device) -> Result<(Self, TrueValues), ModelError> {
        let (theta, a, b) = (0.3, 1.0, 0.5);
        let mut rng = rng(seed);
        let (mut x, mut y) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for _ in 0..n {
            let xi = std_normal(&mut rng);
            let structural = uniform(&mut rng) < theta;
            x.push(xi);
            y.push(if structural { 0 } else { poisson(&mut rng, f64::exp(a + b * xi)) });
        }
        let mut truth = TrueValues::default();
        truth.push("theta", theta);
        truth.push("a", a);
        truth.push("b", b);
        Ok((Self::new(ZeroInflatedData { x, y }, device)?, truth))
    }

    /// The data block.
    pub fn data(&self) -> &ZeroInflatedData {
        &self.data
    }
}

impl Program for ZeroInflatedPoisson {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        ParamLayout::new().interval("theta", &[], 0.0, 1.0)?.real("a", &[])?.real("b", &[])
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let (theta, a, b) = (p.get("theta")?, p.get("a")?, p.get("b")?);
        *target += Normal::new(0.0, 5.0)?.log_prob(a.clone());
        *target += Normal::new(0.0, 5.0)?.log_prob(b.clone());
        let eta = |x: &Tensor<2>| b.clone() * x.clone() + a.clone();
        if let Some(rows) = &self.zeros {
            let poisson_zero = rows.poisson.log_prob(eta(&rows.x));
            *target += log_mix(theta.clone(), poisson_zero.zeros_like(), poisson_zero);
        }
        if let Some(rows) = &self.positive {
            *target += rows.poisson.log_prob(eta(&rows.x)) + log1m(theta);
        }
        Ok(())
    }
}
