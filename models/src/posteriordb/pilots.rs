//! `pilots-pilots`: Gelman & Hill's flight-simulator pilots, a non-nested two-way varying
//! intercepts model (5 groups crossed with 8 scenarios, 40 observations) with uniform priors on
//! the three scales.
//!
//! ```stan
//! parameters {
//!   vector[n_groups] a; vector[n_scenarios] b;
//!   real mu_a; real mu_b;
//!   real<lower=0, upper=100> sigma_a; real<lower=0, upper=100> sigma_b;
//!   real<lower=0, upper=100> sigma_y;
//! }
//! transformed parameters { vector[N] y_hat; y_hat[i] = a[group_id[i]] + b[scenario_id[i]]; }
//! model {
//!   mu_a ~ normal(0, 1); a ~ normal(10 * mu_a, sigma_a);
//!   mu_b ~ normal(0, 1); b ~ normal(10 * mu_b, sigma_b);
//!   y ~ normal(y_hat, sigma_y);
//! }
//! ```

use burn::tensor::{Device, Tensor};
use parvi_model::dist::{LogProb, Normal};
use parvi_model::index::{IndexArray, gather};
use parvi_model::program::{Program, Target, Vars};
use parvi_model::tensor_ops::matrix_from_vec;
use parvi_model::{ModelError, ParamLayout};

use super::PosteriorDbError;
use super::data::Data;

/// The model with its data on the device.
#[derive(Debug)]
pub(super) struct Pilots {
    group: IndexArray,
    scenario: IndexArray,
    /// `[1, N]`
    y: Tensor<2>,
}

impl Pilots {
    /// Reads `N`, `n_groups`, `n_scenarios` (each at least 1: every block needs an element),
    /// the 1-based `group_id` and `scenario_id` (within `1..=n_groups`, `1..=n_scenarios`) and `y`.
    pub(super) fn new(data: &Data, device: &Device) -> Result<Self, PosteriorDbError> {
        let mut sizes = [0; 3];
        for (size, field) in sizes.iter_mut().zip(["N", "n_groups", "n_scenarios"]) {
            *size = data.size(field, 0)?;
            if *size == 0 {
                return Err(data.invalid(field, "must be at least 1: the model has no parameter or observation for 0"));
            }
        }
        let [n, groups, scenarios] = sizes;
        let index = |field: &'static str, size: usize, size_field: &str| -> Result<IndexArray, PosteriorDbError> {
            let ids = data.ints(field, n, "N")?;
            let values: Vec<f64> = ids.iter().map(|&i| i as f64).collect();
            if let Some(i) = ids.iter().position(|&i| i < 1 || i as u64 > size as u64) {
                return Err(data.invalid(
                    field,
                    format!(
                        "value {} at element {} is outside the constraint <lower=1, upper={size_field}> of the data block ({size_field} = {size})",
                        values[i],
                        i + 1
                    ),
                ));
            }
            IndexArray::from_stan(field, &ids, size, device).map_err(super::model_error("pilots"))
        };
        let group = index("group_id", groups, "n_groups")?;
        let scenario = index("scenario_id", scenarios, "n_scenarios")?;
        let y = data.reals("y", n, "N")?;
        Ok(Self { group, scenario, y: matrix_from_vec(y.into_iter().map(|v| v as f32).collect(), 1, n, device) })
    }
}

impl Program for Pilots {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        ParamLayout::new()
            .real("a", &[self.group.size()])?
            .real("b", &[self.scenario.size()])?
            .real("mu_a", &[])?
            .real("mu_b", &[])?
            .interval("sigma_a", &[], 0.0, 100.0)?
            .interval("sigma_b", &[], 0.0, 100.0)?
            .interval("sigma_y", &[], 0.0, 100.0)
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let (a, b, mu_a, mu_b) = (p.get("a")?, p.get("b")?, p.get("mu_a")?, p.get("mu_b")?);
        let (sigma_a, sigma_b, sigma_y) = (p.get("sigma_a")?, p.get("sigma_b")?, p.get("sigma_y")?);
        let y_hat = gather(a.clone(), &self.group)? + gather(b.clone(), &self.scenario)?;
        let y_hat = p.transformed_shaped("y_hat", &[self.group.len()], y_hat);
        let std_normal = Normal::new(0.0, 1.0)?;
        *target += std_normal.log_prob(mu_a.clone());
        *target += Normal::new(mu_a.mul_scalar(10.0), sigma_a)?.log_prob(a);
        *target += std_normal.log_prob(mu_b.clone());
        *target += Normal::new(mu_b.mul_scalar(10.0), sigma_b)?.log_prob(b);
        *target += Normal::new(y_hat, sigma_y)?.log_prob(self.y.clone());
        Ok(())
    }
}
