//! The Gelman & Hill linear regressions of posteriordb written as one [`Program`]:
//! `y ~ normal(X * beta, sigma)` on `sigma > 0`, flat `beta`, and for the two kidiq models
//! `sigma ~ cauchy(0, 2.5)`. Each model's `transformed data` block (logs, indicators,
//! interactions) builds its design matrix on the host in `f64`, with the columns in the order of
//! the Stan program's linear predictor.

use burn::tensor::{Device, Tensor};
use parvi_model::dist::{Cauchy, LogProb, Normal};
use parvi_model::program::{Program, Target, Vars};
use parvi_model::tensor_ops::matrix_from_vec;
use parvi_model::{ModelError, ParamLayout};

use super::PosteriorDbError;
use super::data::Data;

/// `y ~ normal(X * beta, sigma)`, the design transposed on the device.
#[derive(Debug)]
pub(super) struct LinearRegression {
    /// `X^T` `[K, N]`: `beta [n, K] x X^T` is the linear predictor of every particle.
    xt: Tensor<2>,
    /// `[1, N]`
    y: Tensor<2>,
    /// `sigma ~ cauchy(0, 2.5)`, or no statement (Stan's implicit flat prior).
    sigma_prior: SigmaPrior,
}

impl Program for LinearRegression {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        ParamLayout::new().real("beta", &[self.xt.dims()[0]])?.positive("sigma", &[])
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        *target += Normal::new(p.get("beta")?.matmul(self.xt.clone()), p.get("sigma")?)?.log_prob(self.y.clone());
        *target += self.sigma_prior.log_prob(p.get("sigma")?);
        Ok(())
    }
}

/// The prior statement on `sigma`.
#[derive(Debug)]
enum SigmaPrior {
    /// No statement: flat on `(0, inf)`.
    Flat,
    /// `sigma ~ cauchy(0, scale)`.
    Cauchy(Cauchy<2>),
}

impl LogProb<2> for SigmaPrior {
    fn log_prob(&self, sigma: Tensor<2>) -> Tensor<2> {
        match self {
            SigmaPrior::Flat => sigma.zeros_like(),
            SigmaPrior::Cauchy(cauchy) => cauchy.log_prob(sigma),
        }
    }
}

/// Regression `model` (a posteriordb model name) on its data.
pub(super) fn new(model: &str, data: &Data, device: &Device) -> Result<LinearRegression, PosteriorDbError> {
    let n = data.size("N", 0)?;
    if n == 0 {
        return Err(data.invalid("N", "must be at least 1: the likelihood needs an observation"));
    }
    let reals = |field: &str| data.reals(field, n, "N");
    let positive = |field: &str, why: &str| -> Result<Vec<f64>, PosteriorDbError> {
        let v = reals(field)?;
        data.check_positive(field, &v, why)?;
        Ok(v)
    };
    let indicator = |codes: &[i64], level: i64| codes.iter().map(|&c| f64::from(u8::from(c == level))).collect();
    let ones = vec![1.0; n];
    let (y, columns, sigma_cauchy): (Vec<f64>, Vec<Vec<f64>>, Option<f64>) = match model {
        "earn_height" => (reals("earn")?, vec![ones, reals("height")?], None),
        "logearn_height_male" => {
            let earn = positive("earn", "the model takes log(earn)")?;
            (log(&earn), vec![ones, reals("height")?, reals("male")?], None)
        }
        "kidscore_momiq" => {
            let kid_score = reals("kid_score")?;
            data.check_bounds("kid_score", &kid_score, Some(0.0), Some(200.0))?;
            let mom_iq = reals("mom_iq")?;
            data.check_bounds("mom_iq", &mom_iq, Some(0.0), Some(200.0))?;
            (kid_score, vec![ones, mom_iq], Some(2.5))
        }
        "logearn_interaction" => {
            let earn = positive("earn", "the model takes its log")?;
            let (height, male) = (reals("height")?, reals("male")?);
            let inter = height.iter().zip(&male).map(|(h, m)| h * m).collect();
            (log(&earn), vec![ones, height, male, inter], None)
        }
        "kidscore_interaction" => {
            let kid_score = reals("kid_score")?;
            data.check_bounds("kid_score", &kid_score, Some(0.0), Some(200.0))?;
            let mom_iq = reals("mom_iq")?;
            data.check_bounds("mom_iq", &mom_iq, Some(0.0), Some(200.0))?;
            let mom_hs = reals("mom_hs")?;
            data.check_bounds("mom_hs", &mom_hs, Some(0.0), Some(1.0))?;
            let inter = mom_hs.iter().zip(&mom_iq).map(|(h, iq)| h * iq).collect();
            (kid_score, vec![ones, mom_hs, mom_iq, inter], Some(2.5))
        }
        "kidscore_mom_work" => {
            let work = data.ints("mom_work", n, "N")?;
            (reals("kid_score")?, vec![ones, indicator(&work, 2), indicator(&work, 3), indicator(&work, 4)], None)
        }
        "mesquite" => {
            let fields = ["diam1", "diam2", "canopy_height", "total_height", "density", "group"];
            let mut columns = vec![ones];
            for field in fields {
                columns.push(reals(field)?);
            }
            (reals("weight")?, columns, None)
        }
        "logmesquite_logvash" | "logmesquite_logvas" => {
            let why = "the model takes its log";
            let weight = positive("weight", why)?;
            let (d1, d2) = (positive("diam1", why)?, positive("diam2", why)?);
            let canopy_height = positive("canopy_height", why)?;
            let total_height = positive("total_height", why)?;
            let area: Vec<f64> = d1.iter().zip(&d2).map(|(a, b)| a * b).collect();
            let volume: Vec<f64> = area.iter().zip(&canopy_height).map(|(a, h)| a * h).collect();
            let shape: Vec<f64> = d1.iter().zip(&d2).map(|(a, b)| a / b).collect();
            let mut columns = vec![ones, log(&volume), log(&area), log(&shape), log(&total_height)];
            if model == "logmesquite_logvas" {
                columns.push(log(&positive("density", why)?));
            }
            columns.push(reals("group")?);
            (log(&weight), columns, None)
        }
        "nes" => {
            let age = data.ints("age_discrete", n, "N")?;
            let columns = vec![
                ones,
                reals("real_ideo")?,
                reals("race_adj")?,
                indicator(&age, 2),
                indicator(&age, 3),
                indicator(&age, 4),
                reals("educ1")?,
                reals("gender")?,
                reals("income")?,
            ];
            (reals("partyid7")?, columns, None)
        }
        other => {
            return Err(PosteriorDbError::UnknownModel {
                posterior: model.to_string(),
                model: other.to_string(),
                known: "the regressions of this module".into(),
            });
        }
    };
    let k = columns.len();
    let xt: Vec<f32> = columns.iter().flatten().map(|&v| v as f32).collect();
    Ok(LinearRegression {
        xt: matrix_from_vec(xt, k, n, device),
        y: matrix_from_vec(y.iter().map(|&v| v as f32).collect(), 1, n, device),
        sigma_prior: match sigma_cauchy {
            Some(scale) => SigmaPrior::Cauchy(Cauchy::new(0.0, scale).map_err(super::model_error(model))?),
            None => SigmaPrior::Flat,
        },
    })
}

fn log(values: &[f64]) -> Vec<f64> {
    values.iter().map(|v| v.ln()).collect()
}
