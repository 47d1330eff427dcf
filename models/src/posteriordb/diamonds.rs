//! `diamonds-diamonds` (brms): log price on 24 centred predictors,
//! `Y ~ normal(Intercept + Xc b, sigma)` with `b ~ normal(0, 1)`, `Intercept ~ student_t(3, 8,
//! 10)` and a half-t prior `sigma ~ student_t(3, 0, 10)` on `sigma > 0` (brms includes the
//! truncation constant `-student_t_lccdf(0 | 3, 0, 10)`, kept here). `Xc` is `X` without its
//! intercept column, centred, computed on the host in `f64` as Stan's transformed data. The
//! posterior is strongly correlated (polynomial contrasts) and the observations are minibatched.
//!
//! `Y` is also centred on the host (`Y - mean(Y)`, with the mean moved into the intercept term):
//! the same density, but the residuals (about 0.1 against `Y` of about 8) are no longer the
//! difference of two nearly equal `f32` numbers.

use burn::tensor::{Device, Tensor};
use parvi_model::dist::{LogProb, Normal, StudentT};
use parvi_model::program::{Generated, Program, Target, Vars};
use parvi_model::tensor_ops::matrix_from_vec;
use parvi_model::{Minibatch, ModelError, ParamLayout};

use super::PosteriorDbError;
use super::data::Data;

/// The model with the centred design on the device.
#[derive(Debug)]
pub(super) struct Diamonds {
    /// `Xc` `[N, K - 1]`: one observation a row, the rows a minibatch selects.
    xc: Tensor<2>,
    /// `Y - mean(Y)` `[N, 1]`.
    yc: Tensor<2>,
    /// `mean(Y)`, moved out of the response and into the intercept term.
    y_mean: f64,
    /// `-student_t_lccdf(0 | 3, 0, 10)`: the half-t normalising constant.
    half_t_norm: f64,
    /// `prior_only`: the likelihood is left out.
    prior_only: bool,
    /// `means_X` `[1, K - 1]`: the centred columns' means, for the generated `b_Intercept`.
    means: Tensor<2>,
}

impl Diamonds {
    /// Reads `N`, `Y`, `K` (at least 2), `X` (`N` rows of `K`, the first the intercept's) and
    /// `prior_only`.
    pub(super) fn new(data: &Data, device: &Device) -> Result<Self, PosteriorDbError> {
        let rows = data.size("N", 1)?;
        let k = data.size("K", 1)?;
        if k < 2 {
            return Err(data.invalid("K", "must be at least 2: the model needs a predictor besides the intercept"));
        }
        let y = data.reals("Y", rows, "N")?;
        let x = data.matrix("X", (rows, "N"), (k, "K"))?;
        let prior_only = data.int("prior_only")? != 0;
        let means: Vec<f64> = (1..k).map(|c| (0..rows).map(|r| x[r * k + c]).sum::<f64>() / rows as f64).collect();
        let xc = (0..rows).flat_map(|r| (1..k).map(move |c| (r, c))).map(|(r, c)| (x[r * k + c] - means[c - 1]) as f32);
        let y_mean = y.iter().sum::<f64>() / rows as f64;
        let half_t = StudentT::<1>::new(3.0, 0.0, 10.0).and_then(|t| t.lccdf(0.0));
        Ok(Self {
            xc: matrix_from_vec(xc.collect(), rows, k - 1, device),
            yc: matrix_from_vec(y.iter().map(|v| (v - y_mean) as f32).collect(), rows, 1, device),
            y_mean,
            half_t_norm: -half_t.map_err(super::model_error("diamonds"))?,
            prior_only,
            means: matrix_from_vec(means.iter().map(|&m| m as f32).collect(), 1, k - 1, device),
        })
    }
}

impl Program for Diamonds {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        ParamLayout::new().real("b", &[self.xc.dims()[1]])?.real("Intercept", &[])?.positive("sigma", &[])
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let (b, intercept, sigma) = (p.get("b")?, p.get("Intercept")?, p.get("sigma")?);
        *target += Normal::new(0.0, 1.0)?.log_prob(b.clone());
        *target += StudentT::new(3.0, 8.0, 10.0)?.log_prob(intercept.clone());
        *target += StudentT::new(3.0, 0.0, 10.0)?.log_prob(sigma.clone()).add_scalar(self.half_t_norm);
        if !self.prior_only {
            // normal_id_glm_lpdf(Y | Xc, Intercept, b, sigma) on this minibatch's rows, Y centred,
            // as normal_lpdf(residual | 0, sigma): one sum of squares per particle (`log_prob_sum`).
            let (xc, scale) = Minibatch::select(p.batch(), self.xc.clone());
            let (yc, _) = Minibatch::select(p.batch(), self.yc.clone());
            let residual = yc.transpose() - b.matmul(xc.transpose()) - intercept.sub_scalar(self.y_mean); // [n, B]
            *target += Normal::new(0.0, sigma)?.log_prob_sum(residual, 1).mul_scalar(scale);
        }
        Ok(())
    }

    /// `real b_Intercept = Intercept - dot_product(means_X, b);`
    fn generated(&self, p: &Vars, out: &mut Generated) -> Result<(), ModelError> {
        let (b, intercept) = (p.get("b")?, p.get("Intercept")?);
        out.output("b_Intercept", intercept - (b * self.means.clone()).sum_dim(1));
        Ok(())
    }

    fn data_len(&self) -> Option<usize> {
        (!self.prior_only).then(|| self.xc.dims()[0])
    }
}
