//! A Poisson regression on a standardised predictor (model.stan beside this crate) as a model
//! executable, written to show the data block's checks: bounds on scalars
//! (`data.size_in("N", 1..)`, `data.real_in("prior_scale", 0.0..)`), a datum that a
//! distribution's constructor refuses named by its data field and element (`data.check`),
//! transformed data computed once and reported once (`Program::transformed_data`), and Stan's
//! `beta[1]` (`p.element("beta", [1])`).

use parvi::cli::model::BuildError;
use parvi::model::burn::tensor::{Device, Tensor};
use parvi::model::dist::{LogProb, Normal, PoissonLog};
use parvi::model::program::{Compiled, Constants, Generated, Program, Target, Vars};
use parvi::model::{ModelError, ParamLayout};
use parvi::models::stan_data::StanData;

#[derive(Debug)]
struct PoissonCounts {
    /// `y ~ poisson_log(...)`: the counts, checked (and `ln y!` computed) once.
    likelihood: PoissonLog<2>,
    /// `beta ~ normal(0, prior_scale)`.
    prior: Normal<2>,
    /// Transformed data: the standardised predictor `[1, N]`, shared by every draw.
    z: Tensor<2>,
    x_mean: f64,
    x_sd: f64,
}

impl PoissonCounts {
    /// The data and transformed data blocks.
    fn new(data: &StanData, device: &Device) -> Result<Self, BuildError> {
        let n = data.size_in("N", 1..)?;
        let y = data.ints("y", "N")?.tensor(device);
        let x = data.vector("x", "N")?.finite()?.into_vec();
        let prior_scale = data.real_in("prior_scale", 0.0..)?;
        // transformed data: computed here, once.
        let x_mean = x.iter().sum::<f64>() / n as f64;
        let x_sd = (x.iter().map(|v| (v - x_mean).powi(2)).sum::<f64>() / (n as f64 - 1.0)).sqrt();
        if x_sd.is_nan() || x_sd <= 0.0 {
            return Err(data
                .invalid("x", None, "has no spread (sd 0): the standardised predictor is undefined")
                .into());
        }
        let z: Vec<f32> = x.iter().map(|v| ((v - x_mean) / x_sd) as f32).collect();
        Ok(Self {
            // A negative count or a zero scale is refused here, named by its field and element.
            likelihood: data.check("y", PoissonLog::new(y))?,
            prior: data.check("prior_scale", Normal::new(0.0, prior_scale))?,
            z: Tensor::<1>::from_floats(z.as_slice(), device).reshape([1, n]),
            x_mean,
            x_sd,
        })
    }
}

impl Program for PoissonCounts {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        ParamLayout::new().real("beta", &[2])
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        *target += self.prior.log_prob(p.get("beta")?);
        let eta = p.element("beta", [1])? + p.element("beta", [2])? * self.z.clone(); // [n, N]
        *target += self.likelihood.log_prob(eta);
        Ok(())
    }

    /// Reported once (not a column of every draw): `info` prints them.
    fn transformed_data(&self, out: &mut Constants) -> Result<(), ModelError> {
        out.output("x_mean", &[self.x_mean]);
        out.output("x_sd", &[self.x_sd]);
        Ok(())
    }

    fn generated(&self, p: &Vars, out: &mut Generated) -> Result<(), ModelError> {
        out.output("slope", p.element("beta", [2])?.div_scalar(self.x_sd));
        Ok(())
    }
}

fn main() -> std::process::ExitCode {
    parvi::cli::model::run("poisson-counts", |data, device| {
        Ok(Compiled::new(PoissonCounts::new(data, device)?, device)?)
    })
}
