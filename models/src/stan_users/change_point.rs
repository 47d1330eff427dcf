//! A change point in a Poisson rate, the discrete change point summed out (Stan User's Guide,
//! "Change point models", the coal-mining disasters):
//!
//! ```stan
//! data {
//!   real<lower=0> r_e;
//!   real<lower=0> r_l;
//!   int<lower=1> T;
//!   array[T] int<lower=0> D;
//! }
//! transformed data {
//!   real log_unif = -log(T);
//! }
//! parameters {
//!   real<lower=0> e;   // early rate
//!   real<lower=0> l;   // late rate
//! }
//! transformed parameters {
//!   vector[T] lp = rep_vector(log_unif, T);
//!   for (s in 1:T)
//!     for (t in 1:T)
//!       lp[s] += poisson_lpmf(D[t] | t < s ? e : l);
//! }
//! model {
//!   e ~ exponential(r_e);
//!   l ~ exponential(r_l);
//!   target += log_sum_exp(lp);
//! }
//! ```
//!
//! The guide's `O(T^2)` double loop is its own dynamic-programming variant here: with each
//! year's log-likelihood under either rate, `lp[s]` is a prefix sum of the early terms plus a
//! suffix sum of the late ones, two `cumulative_sum`s over `[n, T]`. `lp` is reported as in
//! Stan: `softmax(lp)` is the posterior of the change point `s` given the rates.

use burn::tensor::Device;
use parvi_model::dist::{Exponential, LogProb, PoissonLog};
use parvi_model::functions::cumulative_sum;
use parvi_model::program::{Program, Target, Vars};
use parvi_model::tensor_ops::log_sum_exp;
use parvi_model::{ModelError, ParamLayout};

use super::{TrueValues, check_counts, int_row, invalid, poisson, rng};

const MODEL: &str = "ChangePoint";

/// The data block: the counts `D` of `T` periods and the exponential priors' rates.
#[derive(Clone, Debug, PartialEq)]
pub struct ChangePointData {
    /// Rate of the exponential prior on the early rate `e`, `> 0`.
    pub r_e: f64,
    /// Rate of the exponential prior on the late rate `l`, `> 0`.
    pub r_l: f64,
    /// Counts per period, `>= 0`.
    pub d: Vec<i64>,
}

/// The program with its data on the device.
#[derive(Debug)]
pub struct ChangePoint {
    data: ChangePointData,
    counts: PoissonLog<2>,
}

impl ChangePoint {
    /// Checks the data (`r_e`, `r_l` finite and `> 0`, at least one period, counts `>= 0`) and
    /// puts it on `device`.
    pub fn new(data: ChangePointData, device: &Device) -> Result<Self, ModelError> {
        for (name, r) in [("r_e", data.r_e), ("r_l", data.r_l)] {
            if !(r > 0.0 && r.is_finite()) {
                return Err(invalid(MODEL, name, format!("is {r}, an exponential rate must be finite and > 0")));
            }
        }
        if data.d.is_empty() {
            return Err(invalid(MODEL, "D", "is empty: the model needs a period (T >= 1)"));
        }
        check_counts(MODEL, "D", &data.d)?;
        let counts = PoissonLog::new(int_row(&data.d, device))?;
        Ok(Self { data, counts })
    }

    /// `periods` counts drawn with rate `e = 3` before period `s` (1-based, Stan's `t < s`) and
    /// `l = 1` from it on, `r_e = r_l = 0.5`. The true values are `e` and `l`; the change point
    /// is returned apart, as it is not a parameter.
    pub fn simulate(
        seed: u64,
        periods: usize,
        s: usize,
        device: &Device,
    ) -> Result<(Self, TrueValues, usize), ModelError> {
        let (e, l) = (3.0, 1.0);
        let mut rng = rng(seed);
        let d = (1..=periods).map(|t| poisson(&mut rng, if t < s { e } else { l })).collect();
        let mut truth = TrueValues::default();
        truth.push("e", e);
        truth.push("l", l);
        Ok((Self::new(ChangePointData { r_e: 0.5, r_l: 0.5, d }, device)?, truth, s))
    }

    /// The data block.
    pub fn data(&self) -> &ChangePointData {
        &self.data
    }
}

impl Program for ChangePoint {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        ParamLayout::new().positive("e", &[])?.positive("l", &[])
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let (e, l) = (p.get("e")?, p.get("l")?);
        let periods = self.data.d.len();
        // Each period's log-likelihood under either rate, [n, T].
        let early = self.counts.log_prob(e.clone().log());
        let late = self.counts.log_prob(l.clone().log());
        // lp[s] = sum_{t < s} early[t] + sum_{t >= s} late[t] + log_unif.
        let before = cumulative_sum(early.clone(), 1) - early;
        let from = late.clone().sum_dim(1) - cumulative_sum(late.clone(), 1) + late;
        let lp = p.transformed("lp", (before + from).sub_scalar((periods as f64).ln()));
        *target += Exponential::new(self.data.r_e)?.log_prob(e);
        *target += Exponential::new(self.data.r_l)?.log_prob(l);
        *target += log_sum_exp(lp, 1);
        Ok(())
    }
}
