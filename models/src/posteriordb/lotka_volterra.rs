//! `hudson_lynx_hare-lotka_volterra`: the predator-prey ODE `du/dt = (alpha - beta v) u`,
//! `dv/dt = (-gamma + delta u) v` solved by Dormand-Prince 4(5) for all particles at once, as
//! Stan's `integrate_ode_rk45(..., 1e-5, 1e-3, 5e2)`, with lognormal observations of both
//! populations.

use std::f64::consts::LN_10;

use burn::tensor::{Device, Tensor};
use parvi_model::dist::{LogNormal, LogProb, Normal};
use parvi_model::ode::{OdeOptions, ode_rk45};
use parvi_model::program::{Generated, Program, Target, Vars};
use parvi_model::tensor_ops::{cat_columns, matrix_from_vec};
use parvi_model::{ModelError, ParamLayout};

use super::PosteriorDbError;
use super::data::Data;

#[derive(Debug)]
pub(super) struct LotkaVolterra {
    ts: Vec<f64>,
    /// `[1, 2]`
    y_init: Tensor<2>,
    /// `[1, N, 2]`
    y: Tensor<3>,
}

impl LotkaVolterra {
    pub(super) fn new(data: &Data, device: &Device) -> Result<Self, PosteriorDbError> {
        let n = data.size("N", 1)?;
        let ts = data.reals("ts", n, "N")?;
        if let Some(i) = (0..n).find(|&i| ts[i] <= if i == 0 { 0.0 } else { ts[i - 1] }) {
            return Err(data.invalid(
                "ts",
                format!("measurement times must increase from t0 = 0: element {} is {}", i + 1, ts[i]),
            ));
        }
        let y_init = data.reals("y_init", 2, "2")?;
        data.check_positive("y_init", &y_init, "it is lognormal")?;
        let y = data.matrix("y", (n, "N"), (2, "2"))?;
        data.check_positive("y", &y, "it is lognormal")?;
        let f32s = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<_>>();
        Ok(Self {
            ts,
            y_init: matrix_from_vec(f32s(&y_init), 1, 2, device),
            y: matrix_from_vec(f32s(&y), n, 2, device).unsqueeze(),
        })
    }
}

/// `dz/dt` for `z = (u, v)` `[n, 2]` and `theta = (alpha, beta, gamma, delta)` `[n, 4]`.
fn dz_dt(_t: f64, z: Tensor<2>, theta: &Tensor<2>) -> Tensor<2> {
    let (u, v) = (z.clone().narrow(1, 0, 1), z.narrow(1, 1, 1));
    let col = |j| theta.clone().narrow(1, j, 1);
    let du = (col(0) - col(1) * v.clone()) * u.clone();
    let dv = (col(3) * u - col(2)) * v;
    cat_columns(vec![du, dv])
}

impl Program for LotkaVolterra {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        ParamLayout::new().positive("theta", &[4])?.positive("z_init", &[2])?.positive("sigma", &[2])
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let (theta, z_init, sigma) = (p.get("theta")?, p.get("z_init")?, p.get("sigma")?);
        let options = OdeOptions::new(1e-5, 1e-3, 500);
        let z = ode_rk45(dz_dt, z_init.clone(), 0.0, &self.ts, &theta, &options)?.states; // [n, N, 2]
        let prior_loc = matrix_from_vec(vec![1.0, 0.05, 1.0, 0.05], 1, 4, &theta.device());
        let prior_scale = matrix_from_vec(vec![0.5, 0.05, 0.5, 0.05], 1, 4, &theta.device());
        *target += Normal::new(prior_loc, prior_scale)?.log_prob(theta);
        *target += LogNormal::new(-1.0, 1.0)?.log_prob(sigma.clone());
        *target += LogNormal::new(LN_10, 1.0)?.log_prob(z_init.clone());
        *target += LogNormal::new(z_init.log(), sigma.clone())?.log_prob(self.y_init.clone());
        *target += LogNormal::new(z.log(), sigma.unsqueeze_dim::<3>(1))?.log_prob(self.y.clone());
        Ok(())
    }

    /// `y_init_rep[k] = lognormal_rng(log(z_init[k]), sigma[k])`, `y_rep[n, k] =
    /// lognormal_rng(log(z[n, k]), sigma[k])`: the same solve as the model block's.
    fn generated(&self, p: &Vars, out: &mut Generated) -> Result<(), ModelError> {
        let (theta, z_init, sigma) = (p.get("theta")?, p.get("z_init")?, p.get("sigma")?);
        let options = OdeOptions::new(1e-5, 1e-3, 500);
        let z = ode_rk45(dz_dt, z_init.clone(), 0.0, &self.ts, &theta, &options)?.states; // [n, N, 2]
        let [n, steps, _] = z.dims();
        let y_init_rep = out.lognormal_rng(z_init.log(), sigma.clone())?;
        out.output_shaped("y_init_rep", &[2], y_init_rep);
        // [n, N * 2], row-major: y_rep[1,1], y_rep[1,2], y_rep[2,1], ... as Stan names them.
        let scale = sigma.unsqueeze_dim::<3>(1).repeat_dim(1, steps).reshape([n, steps * 2]);
        let y_rep = out.lognormal_rng(z.log().reshape([n, steps * 2]), scale)?;
        out.output_shaped("y_rep", &[steps, 2], y_rep);
        Ok(())
    }
}
