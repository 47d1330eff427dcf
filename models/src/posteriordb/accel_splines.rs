//! `mcycle_splines-accel_splines`: brms' thin-plate spline regression (`s(times, k = 40)`) for
//! both the mean and the log-sd of the motorcycle acceleration data, as brms generated it: each
//! predictor is `Intercept + Xs * bs + Zs * (sds * zs)`, the standardised spline coefficients
//! `zs` standard normal, the spline scale `sds` half-t.

use burn::tensor::{Device, Tensor};
use parvi_model::dist::{LogProb, Normal, StudentT};
use parvi_model::program::{Generated, Program, Target, Vars};
use parvi_model::tensor_ops::matrix_from_vec;
use parvi_model::{ModelError, ParamLayout};

use super::PosteriorDbError;
use super::data::Data;

/// One predictor's design: the spline's linear part and its basis, both transposed.
#[derive(Debug)]
struct Spline {
    /// `Xs^T` `[Ks, N]`.
    linear_t: Tensor<2>,
    /// `Zs^T` `[knots, N]`.
    basis_t: Tensor<2>,
}

impl Spline {
    /// Reads `Ks{suffix}`, `Xs{suffix}`, `knots{suffix}_1` and `Zs{suffix}_1_1` (`suffix` is
    /// `""` for the mean, `"_sigma"` for the log-sd); the sizes must be at least 1 (an empty
    /// parameter block has no layout).
    fn read(data: &Data, n: usize, suffix: &str, device: &Device) -> Result<Self, PosteriorDbError> {
        let (ks_name, knots_name) = (format!("Ks{suffix}"), format!("knots{suffix}_1"));
        let ks = data.size(&ks_name, 1)?;
        let knots = data.size(&knots_name, 1)?;
        let xs = data.matrix(&format!("Xs{suffix}"), (n, "N"), (ks, &ks_name))?;
        let zs = data.matrix(&format!("Zs{suffix}_1_1"), (n, "N"), (knots, &knots_name))?;
        let transposed = |values: &[f64], cols: usize| {
            let t: Vec<f32> =
                (0..cols).flat_map(move |c| values.iter().skip(c).step_by(cols).map(|&v| v as f32)).collect();
            matrix_from_vec(t, cols, n, device)
        };
        Ok(Self { linear_t: transposed(&xs, ks), basis_t: transposed(&zs, knots) })
    }

    fn coefficients(&self) -> usize {
        self.linear_t.dims()[0]
    }

    fn knots(&self) -> usize {
        self.basis_t.dims()[0]
    }

    /// `Intercept + Xs * bs + Zs * s` for every particle, `[n, N]`.
    fn predictor(&self, intercept: Tensor<2>, bs: Tensor<2>, s: Tensor<2>) -> Tensor<2> {
        bs.matmul(self.linear_t.clone()) + s.matmul(self.basis_t.clone()) + intercept
    }
}

/// The model with its data on the device.
#[derive(Debug)]
pub(super) struct AccelSplines {
    /// `[1, N]`
    y: Tensor<2>,
    mean: Spline,
    log_sd: Spline,
    prior_only: bool,
    /// `-2 student_t_lccdf(0 | 3, 0, 36)`: the two half-t priors' normalisation.
    half_t_norm: f64,
}

impl AccelSplines {
    pub(super) fn new(data: &Data, device: &Device) -> Result<Self, PosteriorDbError> {
        let n = data.size("N", 1)?;
        let y = data.reals("Y", n, "N")?;
        let half_t = StudentT::<2>::new(3.0, 0.0, 36.0)
            .and_then(|t| t.lccdf(0.0))
            .map_err(super::model_error("accel_splines"))?;
        Ok(Self {
            y: matrix_from_vec(y.iter().map(|&v| v as f32).collect(), 1, n, device),
            mean: Spline::read(data, n, "", device)?,
            log_sd: Spline::read(data, n, "_sigma", device)?,
            prior_only: data.int("prior_only")? != 0,
            half_t_norm: -2.0 * half_t,
        })
    }
}

impl Program for AccelSplines {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        ParamLayout::new()
            .real("Intercept", &[])?
            .real("bs", &[self.mean.coefficients()])?
            .real("zs_1_1", &[self.mean.knots()])?
            .positive("sds_1_1", &[])?
            .real("Intercept_sigma", &[])?
            .real("bs_sigma", &[self.log_sd.coefficients()])?
            .real("zs_sigma_1_1", &[self.log_sd.knots()])?
            .positive("sds_sigma_1_1", &[])
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let (intercept, bs, zs, sds) = (p.get("Intercept")?, p.get("bs")?, p.get("zs_1_1")?, p.get("sds_1_1")?);
        let (intercept_s, bs_s) = (p.get("Intercept_sigma")?, p.get("bs_sigma")?);
        let (zs_s, sds_s) = (p.get("zs_sigma_1_1")?, p.get("sds_sigma_1_1")?);
        let s = p.transformed("s_1_1", zs.clone() * sds.clone());
        let s_sigma = p.transformed("s_sigma_1_1", zs_s.clone() * sds_s.clone());
        *target += StudentT::new(3.0, -13.0, 36.0)?.log_prob(intercept.clone());
        *target += Normal::new(0.0, 1.0)?.log_prob(Tensor::cat(vec![zs, zs_s], 1));
        *target += StudentT::new(3.0, 0.0, 36.0)?.log_prob(Tensor::cat(vec![sds, sds_s], 1));
        *target += Tensor::<1>::from_floats([self.half_t_norm as f32], &intercept.device());
        *target += StudentT::new(3.0, 0.0, 10.0)?.log_prob(intercept_s.clone());
        if !self.prior_only {
            let mu = self.mean.predictor(intercept, bs, s);
            let sigma = self.log_sd.predictor(intercept_s, bs_s, s_sigma).exp();
            *target += Normal::new(mu, sigma)?.log_prob(self.y.clone());
        }
        Ok(())
    }

    /// `real b_Intercept = Intercept; real b_sigma_Intercept = Intercept_sigma;`
    fn generated(&self, p: &Vars, out: &mut Generated) -> Result<(), ModelError> {
        out.output("b_Intercept", p.get("Intercept")?);
        out.output("b_sigma_Intercept", p.get("Intercept_sigma")?);
        Ok(())
    }
}
