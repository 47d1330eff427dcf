//! Multilevel logistic regression with a correlated varying intercept and slope per group,
//! non-centred (Stan User's Guide, "Multivariate priors for hierarchical models", with the
//! Cholesky-factored LKJ prior):
//!
//! ```stan
//! data {
//!   int<lower=1> N;
//!   int<lower=1> J;
//!   array[N] int<lower=1, upper=J> g;
//!   vector[N] x;
//!   array[N] int<lower=0, upper=1> y;
//! }
//! parameters {
//!   vector[2] mu;
//!   vector<lower=0>[2] tau;
//!   cholesky_factor_corr[2] L;
//!   matrix[2, J] z;
//! }
//! transformed parameters {
//!   matrix[2, J] b = diag_pre_multiply(tau, L) * z;
//! }
//! model {
//!   mu ~ normal(0, 2.5);
//!   tau ~ normal(0, 1);
//!   L ~ lkj_corr_cholesky(2);
//!   to_vector(z) ~ std_normal();
//!   y ~ bernoulli_logit(mu[1] + b[1, g]' + (mu[2] + b[2, g]') .* x);
//! }
//! ```

use burn::tensor::{Device, Tensor};
use parvi_model::dist::{BernoulliLogit, LkjCorrCholesky, LogProb, Normal};
use parvi_model::functions::diag_pre_multiply;
use parvi_model::index::IndexArray;
use parvi_model::program::{Program, Target, Vars};
use parvi_model::{ModelError, ParamLayout};

use super::{TrueValues, check_finite, check_int_range, check_len, int_row, invalid, matrix, rng, std_normal, uniform};

const MODEL: &str = "VaryingEffectsLogit";

/// The data block: `J` groups, each observation's group `g` (1-based), covariate `x` and
/// outcome `y` in `{0, 1}`.
#[derive(Clone, Debug, PartialEq)]
pub struct VaryingEffectsData {
    /// Groups `J >= 1`.
    pub j: usize,
    /// Group of each observation, `1..=J`.
    pub g: Vec<i64>,
    /// Covariate of each observation.
    pub x: Vec<f64>,
    /// Outcome of each observation, 0 or 1.
    pub y: Vec<i64>,
}

/// The program with its data on the device.
#[derive(Debug)]
pub struct VaryingEffectsLogit {
    data: VaryingEffectsData,
    group: IndexArray,
    /// `[1, N]`
    x: Tensor<2>,
    likelihood: BernoulliLogit<2>,
}

impl VaryingEffectsLogit {
    /// Checks the data (`J >= 1`, at least one observation, `g` in `1..=J`, `x` finite, `y` 0
    /// or 1, all of length `N`) and puts it on `device`.
    pub fn new(data: VaryingEffectsData, device: &Device) -> Result<Self, ModelError> {
        if data.j == 0 {
            return Err(invalid(MODEL, "J", "is 0, the model needs a group"));
        }
        let n = data.y.len();
        if n == 0 {
            return Err(invalid(MODEL, "y", "is empty: the model needs an observation"));
        }
        check_int_range(MODEL, "y", &data.y, 0, 1)?;
        check_len(MODEL, "g", &data.g, n, "one group per observation, N")?;
        check_int_range(MODEL, "g", &data.g, 1, data.j as i64)?;
        check_len(MODEL, "x", &data.x, n, "one covariate per observation, N")?;
        check_finite(MODEL, "x", &data.x)?;
        let group = IndexArray::from_stan("g", &data.g, data.j, device)?;
        let likelihood = BernoulliLogit::new(int_row(&data.y, device))?;
        let x = matrix(&data.x, 1, n, device);
        Ok(Self { data, group, x, likelihood })
    }

    /// `j` groups of `per_group` observations, `x` standard normal, drawn from
    /// `mu = [-1.0, 1.0]`, `tau = [1.0, 0.5]` and correlation `0.5` between a group's intercept
    /// and slope (`L[2,1] = 0.5`), the group effects `b = diag(tau) L z` from standard normal
    /// `z`. The true values are these and the realised effects `b[k,j]`.
    pub fn simulate(seed: u64, j: usize, per_group: usize, device: &Device) -> Result<(Self, TrueValues), ModelError> {
        let (mu, tau, rho) = ([-1.0, 1.0], [1.0, 0.5], 0.5f64);
        let mut rng = rng(seed);
        let mut b = vec![[0.0; 2]; j];
        for bj in &mut b {
            let (z1, z2) = (std_normal(&mut rng), std_normal(&mut rng));
            *bj = [tau[0] * z1, tau[1] * (rho * z1 + (1.0 - rho * rho).sqrt() * z2)];
        }
        let (mut g, mut x, mut y) = (Vec::new(), Vec::new(), Vec::new());
        for (group, bj) in b.iter().enumerate() {
            for _ in 0..per_group {
                let xi = std_normal(&mut rng);
                let eta = mu[0] + bj[0] + (mu[1] + bj[1]) * xi;
                g.push(group as i64 + 1);
                x.push(xi);
                y.push(i64::from(uniform(&mut rng) < super::inv_logit(eta)));
            }
        }
        let mut truth = TrueValues::default();
        truth.push_vector("mu", &mu);
        truth.push_vector("tau", &tau);
        truth.push("L[2,1]", rho);
        for k in 0..2 {
            for (group, bj) in b.iter().enumerate() {
                truth.push(format!("b[{},{}]", k + 1, group + 1), bj[k]);
            }
        }
        Ok((Self::new(VaryingEffectsData { j, g, x, y }, device)?, truth))
    }

    /// The data block.
    pub fn data(&self) -> &VaryingEffectsData {
        &self.data
    }
}

impl Program for VaryingEffectsLogit {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        ParamLayout::new()
            .real("mu", &[2])?
            .positive("tau", &[2])?
            .cholesky_factor_corr("L", 2)?
            .real("z", &[2, self.data.j])
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let (mu, tau) = (p.get("mu")?, p.get("tau")?);
        let (l, z) = (p.get_shaped::<3>("L")?, p.get_shaped::<3>("z")?);
        let [n, _, j] = z.dims();
        let b = diag_pre_multiply(tau.clone(), l.clone()).matmul(z.clone());
        p.transformed_shaped("b", &[2, j], b.clone().reshape([n, 2 * j]));
        *target += Normal::new(0.0, 2.5)?.log_prob(mu.clone());
        *target += Normal::new(0.0, 1.0)?.log_prob(tau);
        *target += LkjCorrCholesky::new(2.0)?.log_prob(l);
        *target += Normal::new(0.0, 1.0)?.log_prob(z);
        // b[, g]: every observation's group column, [n, 2, N].
        let b_obs = self.group.take(b, 2)?;
        let rows = b_obs.dims()[2];
        let intercept = b_obs.clone().narrow(1, 0, 1).reshape([n, rows]) + mu.clone().narrow(1, 0, 1);
        let slope = b_obs.narrow(1, 1, 1).reshape([n, rows]) + mu.narrow(1, 1, 1);
        *target += self.likelihood.log_prob(intercept + slope * self.x.clone());
        Ok(())
    }
}
