//! `soil_carbon-soil_incubation`: Bob Carpenter's two-pool soil-carbon model with feedback. The
//! pools `C = (C1, C2)` start at `(gamma, 1 - gamma) totalC_t0` and follow
//! `dC1/dt = -k1 C1 + alpha12 k2 C2`, `dC2/dt = -k2 C2 + alpha21 k1 C1`, solved by
//! Dormand-Prince 4(5) for all particles at once as Stan's `integrate_ode_rk45` with its default
//! tolerances (`1e-6`, `1e-6`, `1e6` steps); the evolved CO2 `eCO2_hat[t] = totalC_t0 - C1(t) -
//! C2(t)` (a transformed parameter) is observed with normal noise. Priors: `gamma ~ beta(10, 1)`,
//! the rates and transfer coefficients `normal(0, 1)` on `(0, inf)`, `sigma ~ cauchy(0, 1)`.
//!
//! Stan's own reference run of this posterior failed its checks (R-hat 1.04, 1,033 divergent
//! transitions): the transfer coefficients are weakly identified.

use burn::tensor::{Device, Tensor};
use parvi_model::dist::{Beta, Cauchy, LogProb, Normal};
use parvi_model::ode::{OdeOptions, ode_rk45};
use parvi_model::program::{Program, Target, Vars};
use parvi_model::tensor_ops::{cat_columns, matrix_from_vec};
use parvi_model::{ModelError, ParamLayout};

use super::PosteriorDbError;
use super::data::Data;

#[derive(Debug)]
pub(super) struct SoilIncubation {
    total_c: f64,
    t0: f64,
    ts: Vec<f64>,
    /// `eCO2mean` `[1, N_t]`.
    eco2: Tensor<2>,
}

impl SoilIncubation {
    pub(super) fn new(data: &Data, device: &Device) -> Result<Self, PosteriorDbError> {
        let total_c = data.real("totalC_t0")?;
        data.check_bounds("totalC_t0", &[total_c], Some(0.0), None)?;
        let t0 = data.real("t0")?;
        // `int<lower=0>`; with no time the ODE has no output (Stan's solver refuses an empty `ts`).
        let n = data.size("N_t", 0)?;
        if n == 0 {
            return Err(data.invalid("N_t", "must be at least 1: the ODE solver needs an output time"));
        }
        let ts = data.reals("ts", n, "N_t")?;
        data.check_bounds("ts", &ts, Some(t0), None)?;
        if let Some(i) = (0..n).find(|&i| ts[i] <= if i == 0 { t0 } else { ts[i - 1] }) {
            return Err(data.invalid(
                "ts",
                format!(
                    "the ODE solver needs times increasing strictly from t0 = {t0}: element {} is {}",
                    i + 1,
                    ts[i]
                ),
            ));
        }
        let eco2 = data.reals("eCO2mean", n, "N_t")?;
        data.check_bounds("eCO2mean", &eco2, Some(0.0), None)?;
        let eco2 = matrix_from_vec(eco2.iter().map(|&v| v as f32).collect(), 1, n, device);
        Ok(Self { total_c, t0, ts, eco2 })
    }
}

/// `dC/dt` for `C` `[n, 2]` and `theta = (k1, k2, alpha21, alpha12)` `[n, 4]`.
fn two_pool_feedback(_t: f64, c: Tensor<2>, theta: &Tensor<2>) -> Tensor<2> {
    let (c1, c2) = (c.clone().narrow(1, 0, 1), c.narrow(1, 1, 1));
    let col = |j| theta.clone().narrow(1, j, 1);
    let (k1, k2) = (col(0), col(1));
    let d1 = col(3) * k2.clone() * c2.clone() - k1.clone() * c1.clone();
    let d2 = col(2) * k1 * c1 - k2 * c2;
    cat_columns(vec![d1, d2])
}

impl Program for SoilIncubation {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        ParamLayout::new()
            .positive("k1", &[])?
            .positive("k2", &[])?
            .positive("alpha21", &[])?
            .positive("alpha12", &[])?
            .interval("gamma", &[], 0.0, 1.0)?
            .positive("sigma", &[])
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let (k1, k2, alpha21, alpha12) = (p.get("k1")?, p.get("k2")?, p.get("alpha21")?, p.get("alpha12")?);
        let (gamma, sigma) = (p.get("gamma")?, p.get("sigma")?);
        let c0 = cat_columns(vec![gamma.clone(), gamma.clone().neg().add_scalar(1.0)]).mul_scalar(self.total_c);
        let theta = cat_columns(vec![k1, k2, alpha21, alpha12]);
        let pools = ode_rk45(two_pool_feedback, c0, self.t0, &self.ts, &theta, &OdeOptions::default())?.states; // [n, N_t, 2]
        let [n, steps, _] = pools.dims();
        let eco2_hat = pools.sum_dim(2).reshape([n, steps]).neg().add_scalar(self.total_c);
        let eco2_hat = p.transformed_shaped("eCO2_hat", &[steps], eco2_hat);
        *target += Beta::new(10.0, 1.0)?.log_prob(gamma);
        *target += Normal::new(0.0, 1.0)?.log_prob(theta);
        *target += Cauchy::new(0.0, 1.0)?.log_prob(sigma.clone());
        *target += Normal::new(eco2_hat, sigma)?.log_prob(self.eco2.clone());
        Ok(())
    }
}
