//! Multinomial logistic regression (Stan User's Guide, "Multi-logit regression"), identified
//! by pinning the last category's coefficients to zero:
//!
//! ```stan
//! data {
//!   int<lower=2> K;
//!   int<lower=0> N;
//!   int<lower=1> D;
//!   array[N] int<lower=1, upper=K> y;
//!   matrix[N, D] x;
//! }
//! parameters {
//!   matrix[D, K - 1] beta_raw;
//! }
//! transformed parameters {
//!   matrix[D, K] beta = append_col(beta_raw, rep_vector(0, D));
//! }
//! model {
//!   to_vector(beta_raw) ~ normal(0, 5);
//!   y ~ categorical_logit(x * beta);   // row n of x * beta for y[n]
//! }
//! ```

use burn::tensor::{Device, Tensor};
use parvi_model::dist::{CategoricalLogit, LogProb, Normal};
use parvi_model::program::{Program, Target, Vars};
use parvi_model::{ModelError, ParamLayout};

use super::{TrueValues, check_finite, check_int_range, check_len, invalid, matrix, rng, std_normal, uniform};

const MODEL: &str = "MultiLogit";

/// The data block: `K` categories, `y` in `1..=K`, covariates `x` `[N, D]` row-major (an
/// intercept is a column of ones).
#[derive(Clone, Debug, PartialEq)]
pub struct MultiLogitData {
    /// Categories `K >= 2`.
    pub k: usize,
    /// Covariates per observation `D >= 1`.
    pub d: usize,
    /// Outcomes in `1..=K`.
    pub y: Vec<i64>,
    /// Covariates `[N, D]`, row-major.
    pub x: Vec<f64>,
}

/// The program with its data on the device.
#[derive(Debug)]
pub struct MultiLogit {
    data: MultiLogitData,
    likelihood: CategoricalLogit,
    /// `[1, N, D]`
    x: Tensor<3>,
}

impl MultiLogit {
    /// Checks the data (`K >= 2`, `D >= 1`, at least one outcome, each in `1..=K`, `x` of
    /// `N * D` finite values) and puts it on `device`.
    pub fn new(data: MultiLogitData, device: &Device) -> Result<Self, ModelError> {
        if data.k < 2 {
            return Err(invalid(
                MODEL,
                "K",
                format!("is {}, a categorical outcome needs at least 2 categories", data.k),
            ));
        }
        if data.d == 0 {
            return Err(invalid(MODEL, "D", "is 0, the regression needs a covariate"));
        }
        let n = data.y.len();
        if n == 0 {
            return Err(invalid(MODEL, "y", "is empty: the model needs an observation"));
        }
        check_int_range(MODEL, "y", &data.y, 1, data.k as i64)?;
        check_len(MODEL, "x", &data.x, n * data.d, "N x D")?;
        check_finite(MODEL, "x", &data.x)?;
        let labels: Vec<usize> = data.y.iter().map(|&c| (c - 1) as usize).collect();
        let likelihood = CategoricalLogit::new(&labels, data.k, device)?;
        let x = matrix(&data.x, n, data.d, device).reshape([1, n, data.d]);
        Ok(Self { data, likelihood, x })
    }

    /// `n` observations of `K = 3` categories with `x = [1, x_2]` (an intercept and a standard
    /// normal covariate), drawn from `beta_raw = [[0.5, -0.5], [1.0, -1.0]]` (rows: covariates,
    /// columns: the first two categories; the third's coefficients are 0).
    pub fn simulate(seed: u64, n: usize, device: &Device) -> Result<(Self, TrueValues), ModelError> {
        let beta_raw = [[0.5, -0.5], [1.0, -1.0]];
        let mut rng = rng(seed);
        let (mut x, mut y) = (Vec::with_capacity(2 * n), Vec::with_capacity(n));
        for _ in 0..n {
            let row = [1.0, std_normal(&mut rng)];
            let eta: Vec<f64> =
                (0..2).map(|k| row[0] * beta_raw[0][k] + row[1] * beta_raw[1][k]).chain([0.0]).collect();
            let total: f64 = eta.iter().map(|v| v.exp()).sum();
            // Inversion of the cdf of softmax(eta).
            let u = uniform(&mut rng) * total;
            let mut cumulative = 0.0;
            let category = eta.iter().position(|v| {
                cumulative += v.exp();
                u < cumulative
            });
            y.push(category.unwrap_or(2) as i64 + 1);
            x.extend(row);
        }
        let mut truth = TrueValues::default();
        for (d, row) in beta_raw.iter().enumerate() {
            for (k, &v) in row.iter().enumerate() {
                truth.push(format!("beta_raw[{},{}]", d + 1, k + 1), v);
            }
        }
        Ok((Self::new(MultiLogitData { k: 3, d: 2, y, x }, device)?, truth))
    }

    /// The data block.
    pub fn data(&self) -> &MultiLogitData {
        &self.data
    }
}

impl Program for MultiLogit {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        ParamLayout::new().real("beta_raw", &[self.data.d, self.data.k - 1])
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let beta_raw = p.get_shaped::<3>("beta_raw")?;
        let [n, d, _] = beta_raw.dims();
        let beta =
            Tensor::cat(vec![beta_raw.clone(), Tensor::zeros([n, d, 1], (&beta_raw.device(), beta_raw.dtype()))], 2);
        let [_, rows, _] = self.x.dims();
        *target += Normal::new(0.0, 5.0)?.log_prob(beta_raw);
        *target += self.likelihood.log_prob(self.x.clone().expand([n, rows, d]).matmul(beta))?;
        Ok(())
    }
}
