//! Ordinal regression with ordered logistic cut points (Stan User's Guide, "Ordered logistic
//! and probit regression"), priors added so that the posterior is proper:
//!
//! ```stan
//! data {
//!   int<lower=2> K;
//!   int<lower=0> N;
//!   int<lower=1> P;
//!   array[N] int<lower=1, upper=K> y;
//!   matrix[N, P] x;
//! }
//! parameters {
//!   vector[P] beta;
//!   ordered[K - 1] c;
//! }
//! model {
//!   beta ~ normal(0, 5);
//!   c ~ normal(0, 5);
//!   y ~ ordered_logistic(x * beta, c);
//! }
//! ```

use burn::tensor::{Device, Tensor};
use parvi_model::dist::{LogProb, Normal, OrderedLogistic};
use parvi_model::program::{Program, Target, Vars};
use parvi_model::{ModelError, ParamLayout};

use super::{TrueValues, check_finite, check_int_range, check_len, invalid, matrix, rng, std_normal, uniform};

const MODEL: &str = "OrderedLogisticRegression";

/// The data block: `K` categories, `y` in `1..=K`, covariates `x` `[N, P]` row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct OrdinalData {
    /// Categories `K >= 2`.
    pub k: usize,
    /// Covariates per observation `P >= 1`.
    pub p: usize,
    /// Outcomes in `1..=K` (Stan's 1-based categories).
    pub y: Vec<i64>,
    /// Covariates `[N, P]`, row-major.
    pub x: Vec<f64>,
}

/// The program with its data on the device.
#[derive(Debug)]
pub struct OrderedLogisticRegression {
    data: OrdinalData,
    likelihood: OrderedLogistic,
    /// `x'` `[P, N]`: `beta [n, P] x'` is every particle's linear predictor.
    x_t: Tensor<2>,
}

impl OrderedLogisticRegression {
    /// Checks the data (`K >= 2`, `P >= 1`, at least one outcome, each in `1..=K`, `x` of
    /// `N * P` finite values) and puts it on `device`.
    pub fn new(data: OrdinalData, device: &Device) -> Result<Self, ModelError> {
        if data.k < 2 {
            return Err(invalid(MODEL, "K", format!("is {}, an ordinal outcome needs at least 2 categories", data.k)));
        }
        if data.p == 0 {
            return Err(invalid(MODEL, "P", "is 0, the regression needs a covariate"));
        }
        let n = data.y.len();
        if n == 0 {
            return Err(invalid(MODEL, "y", "is empty: the model needs an observation"));
        }
        check_int_range(MODEL, "y", &data.y, 1, data.k as i64)?;
        check_len(MODEL, "x", &data.x, n * data.p, "N x P")?;
        check_finite(MODEL, "x", &data.x)?;
        let labels: Vec<usize> = data.y.iter().map(|&c| (c - 1) as usize).collect();
        let likelihood = OrderedLogistic::new(&labels, data.k, device)?;
        let x_t = matrix(&data.x, n, data.p, device).transpose();
        Ok(Self { data, likelihood, x_t })
    }

    /// `n` observations with `P = 2` standard normal covariates and `K = 4` categories, drawn
    /// from `beta = [1.0, -0.7]`, `c = [-1.0, 0.3, 1.5]` by the latent form: `y` counts the cut
    /// points below `x beta + e`, `e` standard logistic (so `P(y <= k) = inv_logit(c_k - eta)`).
    pub fn simulate(seed: u64, n: usize, device: &Device) -> Result<(Self, TrueValues), ModelError> {
        let (beta, c) = ([1.0, -0.7], [-1.0, 0.3, 1.5]);
        let mut rng = rng(seed);
        let mut x = Vec::with_capacity(2 * n);
        let mut y = Vec::with_capacity(n);
        for _ in 0..n {
            let row = [std_normal(&mut rng), std_normal(&mut rng)];
            let u = uniform(&mut rng);
            let latent = row[0] * beta[0] + row[1] * beta[1] + (u / (1.0 - u)).ln();
            y.push(1 + c.iter().filter(|&&ck| ck < latent).count() as i64);
            x.extend(row);
        }
        let mut truth = TrueValues::default();
        truth.push_vector("beta", &beta);
        truth.push_vector("c", &c);
        Ok((Self::new(OrdinalData { k: 4, p: 2, y, x }, device)?, truth))
    }

    /// The data block.
    pub fn data(&self) -> &OrdinalData {
        &self.data
    }
}

impl Program for OrderedLogisticRegression {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        ParamLayout::new().real("beta", &[self.data.p])?.ordered("c", self.data.k - 1)
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let (beta, c) = (p.get("beta")?, p.get("c")?);
        *target += Normal::new(0.0, 5.0)?.log_prob(beta.clone());
        *target += Normal::new(0.0, 5.0)?.log_prob(c.clone());
        *target += self.likelihood.log_prob(beta.matmul(self.x_t.clone()), c)?;
        Ok(())
    }
}
