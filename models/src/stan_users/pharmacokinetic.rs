//! A one-compartment pharmacokinetic model with first-order absorption from an oral dose and
//! Michaelis-Menten (saturable) elimination, as Stan users write it with the stiff solver (issue
//! 45, item 5): the nonlinear elimination has no closed form, so the amounts are an ODE's.
//!
//! ```stan
//! functions {
//!   vector one_cpt_mm(real t, vector y, real ka, real V, real Vm, real Km) {
//!     vector[2] dydt;
//!     real c = y[2] / V;
//!     dydt[1] = -ka * y[1];                       // gut
//!     dydt[2] = ka * y[1] - Vm * c / (Km + c);    // central compartment
//!     return dydt;
//!   }
//! }
//! data {
//!   int<lower=1> N;
//!   array[N] real<lower=0> ts;
//!   real<lower=0> dose;
//!   vector<lower=0>[N] conc;
//! }
//! parameters {
//!   real<lower=0> ka;
//!   real<lower=0> V;
//!   real<lower=0> Vm;
//!   real<lower=0> Km;
//!   real<lower=0> sigma;
//! }
//! transformed parameters {
//!   array[N] vector[2] y = ode_bdf(one_cpt_mm, [dose, 0]', 0, ts, ka, V, Vm, Km);
//! }
//! model {
//!   ka ~ lognormal(0, 0.5);
//!   V ~ lognormal(log(10), 0.3);
//!   Vm ~ lognormal(log(3), 0.5);
//!   Km ~ lognormal(0, 0.5);
//!   sigma ~ normal(0, 0.5);
//!   for (n in 1:N)
//!     conc[n] ~ lognormal(log(y[n, 2] / V), sigma);
//! }
//! ```
//!
//! The amounts are not reported (Stan would print them as transformed parameters); the five
//! parameters are. `ode_stiff` stands for `ode_bdf` with Stan's default tolerances (1e-6
//! relative, 1e-6 absolute).

use burn::tensor::{Device, Tensor};
use parvi_model::dist::{LogNormal, LogProb, Normal};
use parvi_model::ode::{OdeOptions, ode_stiff};
use parvi_model::program::{Program, Target, Vars};
use parvi_model::tensor_ops::cat_columns;
use parvi_model::{ModelError, ParamLayout};

use super::{StanUsersDataError, TrueValues, check_finite, invalid, matrix, rng, std_normal};
use crate::stan_data::StanData;

const MODEL: &str = "OneCompartmentMm";

/// `ode_bdf`'s defaults in Stan: relative and absolute tolerance 1e-6; its step budget.
const ODE_OPTIONS: OdeOptions = OdeOptions { rel_tol: 1e-6, abs_tol: 1e-6, max_num_steps: 100_000 };

/// The data block.
#[derive(Clone, Debug, PartialEq)]
pub struct PharmacokineticData {
    /// Observation times, `> 0`, strictly increasing.
    pub ts: Vec<f64>,
    /// The oral dose at `t = 0`, `> 0`.
    pub dose: f64,
    /// Observed concentrations, `> 0`, one per time.
    pub conc: Vec<f64>,
}

/// The program with its data on the device.
#[derive(Debug)]
pub struct OneCompartmentMm {
    data: PharmacokineticData,
    /// `[1, N]`
    conc: Tensor<2>,
}

/// `one_cpt_mm`: the gut's and the central compartment's amounts' derivatives for `[rows, 2]`
/// amounts and `[rows, 4]` parameters `(ka, V, Vm, Km)`, row-wise.
fn one_cpt_mm(_t: f64, y: Tensor<2>, theta: &Tensor<2>) -> Tensor<2> {
    let column = |x: &Tensor<2>, j: usize| x.clone().narrow(1, j, 1);
    let (gut, central) = (column(&y, 0), column(&y, 1));
    let (ka, v, vm, km) = (column(theta, 0), column(theta, 1), column(theta, 2), column(theta, 3));
    let absorption = ka * gut;
    let c = central / v;
    let elimination = vm * c.clone() / (km + c);
    cat_columns(vec![-absorption.clone(), absorption - elimination])
}

impl OneCompartmentMm {
    /// Checks the data (at least one time, times finite, `> 0` and strictly increasing, the dose
    /// finite and `> 0`, one finite concentration `> 0` per time) and puts it on `device`.
    pub fn new(data: PharmacokineticData, device: &Device) -> Result<Self, ModelError> {
        if data.ts.is_empty() {
            return Err(invalid(MODEL, "ts", "is empty: the model needs an observation (N >= 1)"));
        }
        check_finite(MODEL, "ts", &data.ts)?;
        if data.ts[0] <= 0.0 {
            return Err(invalid(MODEL, "ts", format!("entry 1 is {}, must be > 0 (the dose is at t = 0)", data.ts[0])));
        }
        if let Some(i) = data.ts.windows(2).position(|w| w[1] <= w[0]) {
            return Err(invalid(
                MODEL,
                "ts",
                format!("entry {} is {}, not after entry {} ({})", i + 2, data.ts[i + 1], i + 1, data.ts[i]),
            ));
        }
        if !(data.dose > 0.0 && data.dose.is_finite()) {
            return Err(invalid(MODEL, "dose", format!("is {}, must be finite and > 0", data.dose)));
        }
        if data.conc.len() != data.ts.len() {
            return Err(invalid(
                MODEL,
                "conc",
                format!("has {} values, expected {} (one per time in ts)", data.conc.len(), data.ts.len()),
            ));
        }
        if let Some(i) = data.conc.iter().position(|c| !(*c > 0.0 && c.is_finite())) {
            return Err(invalid(
                MODEL,
                "conc",
                format!("entry {} is {}, a lognormal observation must be finite and > 0", i + 1, data.conc[i]),
            ));
        }
        let conc = matrix(&data.conc, 1, data.conc.len(), device);
        Ok(Self { data, conc })
    }

    /// Reads Stan's JSON data (`N`, `ts`, `dose`, `conc`, as the program's data block names them).
    pub fn from_stan_data(data: &StanData, device: &Device) -> Result<Self, StanUsersDataError> {
        data.size("N")?;
        let ts = data.vector("ts", "N")?.finite()?.into_vec();
        let dose = data.real("dose")?;
        let conc = data.vector("conc", "N")?.finite()?.into_vec();
        Ok(Self::new(PharmacokineticData { ts, dose, conc }, device)?)
    }

    /// Twenty concentrations over 24 hours after a 100 mg dose, from `ka = 1.2 / h`, `V = 10 L`,
    /// `Vm = 4 mg / h`, `Km = 0.8 mg / L`, `sigma = 0.1`, the amounts from a fine classical
    /// Runge-Kutta solve in `f64` (independent of the library's solvers).
    pub fn simulate(seed: u64, device: &Device) -> Result<(Self, TrueValues), ModelError> {
        let (ka, v, vm, km, sigma, dose) = (1.2, 10.0, 4.0, 0.8, 0.1, 100.0);
        let ts: Vec<f64> = vec![
            0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 10.0, 12.0, 14.0, 16.0, 18.0, 20.0, 24.0,
        ];
        let rhs = |y: [f64; 2]| {
            let c = y[1] / v;
            [-ka * y[0], ka * y[0] - vm * c / (km + c)]
        };
        let mut rng = rng(seed);
        let (mut y, mut t) = ([dose, 0.0], 0.0);
        let mut conc = Vec::with_capacity(ts.len());
        for &t_out in &ts {
            let steps = ((t_out - t) / 1e-3).ceil() as usize;
            let h = (t_out - t) / steps as f64;
            for _ in 0..steps {
                let k1 = rhs(y);
                let k2 = rhs([y[0] + 0.5 * h * k1[0], y[1] + 0.5 * h * k1[1]]);
                let k3 = rhs([y[0] + 0.5 * h * k2[0], y[1] + 0.5 * h * k2[1]]);
                let k4 = rhs([y[0] + h * k3[0], y[1] + h * k3[1]]);
                for k in 0..2 {
                    y[k] += h / 6.0 * (k1[k] + 2.0 * k2[k] + 2.0 * k3[k] + k4[k]);
                }
            }
            t = t_out;
            conc.push(y[1] / v * (sigma * std_normal(&mut rng)).exp());
        }
        let mut truth = TrueValues::default();
        for (name, value) in [("ka", ka), ("V", v), ("Vm", vm), ("Km", km), ("sigma", sigma)] {
            truth.push(name, value);
        }
        Ok((Self::new(PharmacokineticData { ts, dose, conc }, device)?, truth))
    }

    /// The data block.
    pub fn data(&self) -> &PharmacokineticData {
        &self.data
    }
}

impl Program for OneCompartmentMm {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        ParamLayout::new()
            .positive("ka", &[])?
            .positive("V", &[])?
            .positive("Vm", &[])?
            .positive("Km", &[])?
            .positive("sigma", &[])
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let (ka, v, vm, km, sigma) = (p.get("ka")?, p.get("V")?, p.get("Vm")?, p.get("Km")?, p.get("sigma")?);
        let [n, _] = ka.dims();
        let device = ka.device();
        let theta = cat_columns(vec![ka.clone(), v.clone(), vm.clone(), km.clone()]);
        let y0 = matrix(&[self.data.dose, 0.0], 1, 2, &device).repeat_dim(0, n);
        let y = ode_stiff(one_cpt_mm, y0, 0.0, &self.data.ts, &theta, &ODE_OPTIONS)?.states; // [n, N, 2]
        let [_, times, _] = y.dims();
        let central = y.narrow(2, 1, 1).reshape([n, times]);
        *target += LogNormal::new(0.0, 0.5)?.log_prob(ka);
        *target += LogNormal::new(10f64.ln(), 0.3)?.log_prob(v.clone());
        *target += LogNormal::new(3f64.ln(), 0.5)?.log_prob(vm);
        *target += LogNormal::new(0.0, 0.5)?.log_prob(km);
        *target += Normal::new(0.0, 0.5)?.log_prob(sigma.clone());
        *target += LogNormal::new((central / v).log(), sigma)?.log_prob(self.conc.clone());
        Ok(())
    }
}
