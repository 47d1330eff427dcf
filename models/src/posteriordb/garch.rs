//! `garch-garch11`: a GARCH(1, 1) volatility model, `y[t] ~ normal(mu, sigma[t])` with
//! `sigma[1] = sigma1` (data) and `sigma[t]^2 = alpha0 + alpha1 (y[t-1] - mu)^2 + beta1
//! sigma[t-1]^2`; flat priors on `mu`, `alpha0 > 0`, `alpha1` in `(0, 1)` and `beta1` in
//! `(0, 1 - alpha1)`.
//!
//! `beta1`'s upper bound depends on `alpha1`, which a [`ParamLayout`] block (whose constraint is
//! fixed) cannot express, so the model applies Stan's transform itself: the block `beta1_frac`
//! is in `(0, 1)` (logistic, its log-Jacobian from the layout) and `beta1 = (1 - alpha1)
//! beta1_frac`, Stan's `lub_constrain(u, 0, 1 - alpha1)`, whose log-Jacobian has the extra
//! term `log(1 - alpha1)`. `beta1` is reported as a transformed parameter under Stan's name.
//!
//! The variance recursion is a linear recurrence with a constant coefficient, `s[t] = u[t] +
//! beta1 s[t-1]`, so it is computed for all time points at once by the DSL's parallel prefix scan
//! ([`linear_scan`]) in `ceil(log2 T)` rounds (8 for `T = 200`) of whole-row tensor operations,
//! not `T` sequential steps of one autodiff node each. The recursion couples all time points, so
//! the data are not minibatched.

use burn::tensor::{Device, Tensor};
use parvi_model::dist::{LogProb, Normal};
use parvi_model::program::{Program, Target, Vars};
use parvi_model::scan::linear_scan;
use parvi_model::tensor_ops::matrix_from_vec;
use parvi_model::{ModelError, ParamLayout};

use super::PosteriorDbError;
use super::data::Data;

/// The model with the series on the device.
#[derive(Debug)]
pub(super) struct Garch {
    /// `[1, T]`
    y: Tensor<2>,
    /// `y[t-1]` at time `t > 1`, and `y[1]` (masked out by `later`) at `t = 1`: `[1, T]`.
    y_prev: Tensor<2>,
    /// 0 at `t = 1`, 1 after: the recursion's terms start at `t = 2`. `[1, T]`
    later: Tensor<2>,
    /// `sigma1^2` at `t = 1`, 0 after. `[1, T]`
    first: Tensor<2>,
}

impl Garch {
    /// Reads `T` (at least 1), `y` and `sigma1` (`<lower=0>`, and non-zero: it is the first
    /// normal scale).
    pub(super) fn new(data: &Data, device: &Device) -> Result<Self, PosteriorDbError> {
        let steps = data.size("T", 0)?;
        if steps == 0 {
            return Err(data.invalid("T", "must be at least 1: the likelihood needs an observation"));
        }
        let y = data.reals("y", steps, "T")?;
        let sigma1 = data.real("sigma1")?;
        data.check_bounds("sigma1", &[sigma1], Some(0.0), None)?;
        data.check_positive("sigma1", &[sigma1], "it is the scale of the first observation")?;
        let row = |v: Vec<f64>| matrix_from_vec(v.into_iter().map(|x| x as f32).collect(), 1, steps, device);
        let at_first = |value: f64, rest: f64| (0..steps).map(|t| if t == 0 { value } else { rest }).collect();
        Ok(Self {
            y_prev: row((0..steps).map(|t| y[t.saturating_sub(1)]).collect()),
            y: row(y),
            later: row(at_first(0.0, 1.0)),
            first: row(at_first(sigma1 * sigma1, 0.0)),
        })
    }
}

impl Program for Garch {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        let layout = ParamLayout::new().real("mu", &[])?.positive("alpha0", &[])?;
        layout.bounded("alpha1", &[], 0.0, 1.0)?.bounded("beta1_frac", &[], 0.0, 1.0)
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let (mu, alpha0, alpha1) = (p.get("mu")?, p.get("alpha0")?, p.get("alpha1")?);
        // beta1 <lower=0, upper=1 - alpha1>: the bound's log-Jacobian log(1 - alpha1).
        let one_minus_alpha1 = alpha1.clone().neg().add_scalar(1.0);
        let beta1 = p.transformed("beta1", p.get("beta1_frac")? * one_minus_alpha1.clone());
        *target += one_minus_alpha1.log();
        // sigma[t]^2 = u[t] + beta1 sigma[t-1]^2, u[1] = sigma1^2, u[t] = alpha0 + alpha1 (y[t-1] - mu)^2.
        let u = (alpha1 * (self.y_prev.clone() - mu.clone()).square() + alpha0) * self.later.clone();
        let sigma = linear_scan(beta1, u + self.first.clone())?.sqrt();
        *target += Normal::new(mu, sigma)?.log_prob(self.y.clone());
        Ok(())
    }
}
