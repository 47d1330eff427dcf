//! A varying-intercept regression (model.stan beside this crate) as a model executable:
//! `varying-intercepts fit --data data.json --out out` fits it by parvi's default path and writes
//! draws_1.csv, ... (CmdStan's format, a file per chain, with the generated `y_rep` and `log_lik`), summary.csv and
//! summary.json; PSIS-LOO is printed from `log_lik`.

use parvi::cli::model::BuildError;
use parvi::model::burn::tensor::{Device, Int, Tensor};
use parvi::model::dist::{Exponential, HalfNormal, LogProb, Normal};
use parvi::model::program::{Compiled, Generated, Program, Target, Vars};
use parvi::model::{ModelError, ParamLayout};
use parvi::models::stan_data::StanData;

#[derive(Debug)]
struct VaryingIntercepts {
    /// Each observation's group, 0-based `[N]` (Stan's 1-based `group`).
    group: Tensor<1, Int>,
    /// `[1, N]` data rows, shared by every draw.
    x: Tensor<2>,
    y: Tensor<2>,
    groups: usize,
}

impl VaryingIntercepts {
    /// The data block: sizes, the index array with its bounds, the vectors with theirs.
    fn new(data: &StanData, device: &Device) -> Result<Self, BuildError> {
        let groups = data.size_in("J", 1..)?;
        data.size_in("N", 1..)?;
        let group = data.ints("group", "N")?.lower(1)?.upper_field("J")?.index_tensor(groups, device)?;
        let x = data.vector("x", "N")?.finite()?.tensor(device);
        let y = data.vector("y", "N")?.finite()?.tensor(device);
        Ok(Self { group, x, y, groups })
    }

    /// `alpha[group] + beta * x`, `[n, N]`.
    fn mean(&self, alpha: Tensor<2>, beta: Tensor<2>) -> Tensor<2> {
        alpha.select(1, self.group.clone()) + beta * self.x.clone()
    }

    fn alpha(&self, p: &Vars) -> Result<Tensor<2>, ModelError> {
        Ok(p.get("eta")? * p.get("tau")? + p.get("mu")?)
    }
}

impl Program for VaryingIntercepts {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        ParamLayout::new()
            .real("mu", &[])?
            .positive("tau", &[])?
            .real("eta", &[self.groups])?
            .real("beta", &[])?
            .positive("sigma", &[])
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let alpha = p.transformed("alpha", self.alpha(p)?);
        let (beta, sigma) = (p.get("beta")?, p.get("sigma")?);
        *target += Normal::new(0.0, 5.0)?.log_prob(p.get("mu")?);
        *target += HalfNormal::new(2.0)?.log_prob(p.get("tau")?);
        *target += Normal::new(0.0, 1.0)?.log_prob(p.get("eta")?);
        *target += Normal::new(0.0, 2.0)?.log_prob(beta.clone());
        *target += Exponential::new(1.0)?.log_prob(sigma.clone());
        *target += Normal::new(self.mean(alpha, beta), sigma)?.log_prob(self.y.clone());
        Ok(())
    }

    fn generated(&self, p: &Vars, out: &mut Generated) -> Result<(), ModelError> {
        let mean = self.mean(self.alpha(p)?, p.get("beta")?);
        let sigma = p.get("sigma")?;
        let y_rep = out.normal_rng(mean.clone(), sigma.clone())?;
        out.output("y_rep", y_rep);
        out.output("log_lik", Normal::new(mean, sigma)?.log_prob(self.y.clone()));
        Ok(())
    }
}

fn main() -> std::process::ExitCode {
    parvi::cli::model::run("varying-intercepts", |data, device| {
        Ok(Compiled::new(VaryingIntercepts::new(data, device)?, device)?)
    })
}
