//! `mcycle_gp-accel_gp`: brms' Hilbert-space approximate GP (Solin & Särkkä's basis functions,
//! Riutort-Mayol et al. 2023) for both the mean and the log-sd of the motorcycle acceleration
//! data, as brms generated it. With one length scale, `gpa(X, sdgp, lscale, zgp, slambda) =
//! X * (sqrt(spd(slambda)) .* zgp)` and the spectral density of the exponentiated quadratic is
//! `spd(w) = sdgp^2 (sqrt(2 pi) lscale)^D exp(-lscale^2 |w|^2 / 2)`.

use std::f64::consts::PI;

use burn::tensor::{Device, Tensor};
use parvi_model::dist::{InvGamma, LogProb, Normal, StudentT};
use parvi_model::program::{Generated, Program, Target, Vars};
use parvi_model::tensor_ops::matrix_from_vec;
use parvi_model::{ModelError, ParamLayout};

use super::PosteriorDbError;
use super::data::Data;

/// One approximate GP's data: basis functions at the observations and the eigenvalues.
#[derive(Debug)]
struct Basis {
    /// `X^T` `[NB, N]`.
    xt: Tensor<2>,
    /// `|slambda_m|^2` `[1, NB]`.
    slambda_sq: Tensor<2>,
    /// Input dimension `D`.
    dims: usize,
    functions: usize,
}

impl Basis {
    fn read(data: &Data, n: usize, suffix: &str, device: &Device) -> Result<Self, PosteriorDbError> {
        let field = |f: &str| format!("{f}{suffix}");
        data.size(&field("Kgp"), 1)?;
        let (d, nb) = (data.size(&field("Dgp"), 1)?, data.size(&field("NBgp"), 1)?);
        let (nb_name, d_name) = (field("NBgp"), field("Dgp"));
        let x = data.matrix(&field("Xgp"), (n, "N"), (nb, &nb_name))?;
        let slambda = data.matrix(&field("slambda"), (nb, &nb_name), (d, &d_name))?;
        let xt = (0..nb).flat_map(|m| x.iter().skip(m).step_by(nb).map(|&v| v as f32).collect::<Vec<_>>()).collect();
        let sq = slambda.chunks(d).map(|w| w.iter().map(|v| v * v).sum::<f64>() as f32).collect();
        Ok(Self {
            xt: matrix_from_vec(xt, nb, n, device),
            slambda_sq: matrix_from_vec(sq, 1, nb, device),
            dims: d,
            functions: nb,
        })
    }

    /// `gpa(X, sdgp, lscale, zgp, slambda)` `[n, N]` for `[n, 1]` scales and `[n, NB]` weights.
    fn gpa(&self, sdgp: Tensor<2>, lscale: Tensor<2>, zgp: Tensor<2>) -> Tensor<2> {
        let half_d = self.dims as f64 / 2.0;
        let amplitude = sdgp * lscale.clone().mul_scalar((2.0 * PI).sqrt()).powf_scalar(half_d);
        let sqrt_spd = amplitude * (lscale.square() * self.slambda_sq.clone()).mul_scalar(-0.25).exp();
        (sqrt_spd * zgp).matmul(self.xt.clone())
    }
}

#[derive(Debug)]
pub(super) struct AccelGp {
    /// `[1, N]`
    y: Tensor<2>,
    mean: Basis,
    log_sd: Basis,
    prior_only: bool,
    /// `-2 student_t_lccdf(0 | 3, 0, 36)`: the half-t priors' normalisation.
    half_t_norm: f64,
}

impl AccelGp {
    pub(super) fn new(data: &Data, device: &Device) -> Result<Self, PosteriorDbError> {
        let n = data.size("N", 1)?;
        let y = data.reals("Y", n, "N")?;
        let half_t =
            StudentT::<2>::new(3.0, 0.0, 36.0).and_then(|t| t.lccdf(0.0)).map_err(super::model_error("accel_gp"))?;
        Ok(Self {
            y: matrix_from_vec(y.iter().map(|&v| v as f32).collect(), 1, n, device),
            mean: Basis::read(data, n, "_1", device)?,
            log_sd: Basis::read(data, n, "_sigma_1", device)?,
            prior_only: data.int("prior_only")? != 0,
            half_t_norm: -2.0 * half_t,
        })
    }
}

impl Program for AccelGp {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        ParamLayout::new()
            .real("Intercept", &[])?
            .positive("sdgp_1", &[])?
            .positive("lscale_1", &[])?
            .real("zgp_1", &[self.mean.functions])?
            .real("Intercept_sigma", &[])?
            .positive("sdgp_sigma_1", &[])?
            .positive("lscale_sigma_1", &[])?
            .real("zgp_sigma_1", &[self.log_sd.functions])
    }

    /// `real b_Intercept = Intercept; real b_sigma_Intercept = Intercept_sigma;`
    fn generated(&self, p: &Vars, out: &mut Generated) -> Result<(), ModelError> {
        out.output("b_Intercept", p.get("Intercept")?);
        out.output("b_sigma_Intercept", p.get("Intercept_sigma")?);
        Ok(())
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let (intercept, sdgp, lscale, zgp) =
            (p.get("Intercept")?, p.get("sdgp_1")?, p.get("lscale_1")?, p.get("zgp_1")?);
        let (intercept_s, sdgp_s) = (p.get("Intercept_sigma")?, p.get("sdgp_sigma_1")?);
        let (lscale_s, zgp_s) = (p.get("lscale_sigma_1")?, p.get("zgp_sigma_1")?);
        let mu = self.mean.gpa(sdgp.clone(), lscale.clone(), zgp.clone()) + intercept.clone();
        let sigma = (self.log_sd.gpa(sdgp_s.clone(), lscale_s.clone(), zgp_s.clone()) + intercept_s.clone()).exp();
        *target += StudentT::new(3.0, -13.0, 36.0)?.log_prob(intercept);
        *target += StudentT::new(3.0, 0.0, 36.0)?.log_prob(Tensor::cat(vec![sdgp, sdgp_s], 1));
        *target += Tensor::<1>::from_floats([self.half_t_norm as f32], &mu.device());
        *target += Normal::new(0.0, 1.0)?.log_prob(Tensor::cat(vec![zgp, zgp_s], 1));
        *target += InvGamma::new(1.124909, 0.0177)?.log_prob(Tensor::cat(vec![lscale, lscale_s], 1));
        *target += StudentT::new(3.0, 0.0, 10.0)?.log_prob(intercept_s);
        if !self.prior_only {
            *target += Normal::new(mu, sigma)?.log_prob(self.y.clone());
        }
        Ok(())
    }
}
