//! `gp_pois_regr-gp_pois_regr`: Poisson regression on a latent Gaussian process,
//! `k ~ poisson_log(f)`, `f = L f_tilde` with `L` the Cholesky factor of the squared-exponential
//! covariance `alpha^2 exp(-(x_i - x_j)^2 / (2 rho^2)) + 1e-10 I`, `f_tilde ~ normal(0, 1)`,
//! `rho ~ gamma(25, 4)`, `alpha ~ normal(0, 2)` on `rho, alpha > 0`.
//!
//! The covariance of all particles is one `[n, N, N]` tensor, factored by
//! [`parvi_model::linalg::cholesky_factor_floored`] (one autodiff node). That factor needs `f64`: at the
//! posterior's length scales (`rho` about 4 to 7 against a grid spacing of 2) the covariance's
//! smallest eigenvalue is below `1e-8 alpha^2`, so rounding its entries to `f32` (relative error
//! `6e-8`) makes it indefinite, and with Stan's jitter of `1e-10` an `f32` factor is garbage. The
//! covariance and its factor are therefore computed in `f64` wherever the device supports it
//! (CPU backends, and GPUs with `f64` arithmetic: `tensor_ops::f64_arithmetic`); the rest of the
//! density stays in `f32`. On a device without `f64` the model falls back to `f32` with a jitter
//! of `1e-5 alpha^2`, a slightly different model, which [`GpPoisson::deviation`] (and so
//! [`super::PosteriorDbModel::deviation`]) reports.

use burn::tensor::{DType, Device, FloatDType, Tensor, TensorData};
use parvi_model::dist::{Gamma, LogProb, Normal, PoissonLog};
use parvi_model::linalg::{DEFAULT_PIVOT_FLOOR, cholesky_factor_floored, exp_quad_cov};
use parvi_model::program::{Generated, Program, Target, Vars};
use parvi_model::tensor_ops::matrix_from_vec;
use parvi_model::{ModelError, ParamLayout};

use super::PosteriorDbError;
use super::data::Data;

/// Stan's diagonal jitter.
const JITTER: f64 = 1e-10;
/// The relative jitter of the `f32` fallback: above the `f32` rounding of a `N x N` covariance.
const JITTER_F32: f64 = 1e-5;
/// The smallest pivot the `f64` factorisation accepts (a tenth of the jitter): reached only where
/// rounding has made the covariance indefinite, where Stan would reject the point; the floor
/// keeps the density finite there. (The `f32` fallback's relative jitter keeps every pivot far
/// above rounding, so it keeps the default floor.)
const PIVOT_FLOOR: f64 = 1e-11;

const DEVIATION: &str = "gp_pois_regr: this device has no accurate f64 arithmetic (see `tensor_ops::f64_arithmetic`), so the covariance's Cholesky factor is \
                         computed in f32 with a jitter of 1e-5 alpha^2 instead of Stan's 1e-10 (which f32 cannot \
                         resolve): the log density in f_tilde differs from Stan's, and f's prior has a little \
                         extra white noise";

/// The model with the grid and counts on the device.
#[derive(Debug)]
pub(super) struct GpPoisson {
    /// The grid `x` `[N]`, in the factorisation's dtype.
    x: Tensor<1>,
    /// The identity `[1, N, N]`, in the factorisation's dtype.
    eye: Tensor<3>,
    /// The counts `[1, N]` with their `ln k!` (Stan's transformed data).
    counts: PoissonLog<2>,
    /// Whether the covariance and its factor are computed in `f64`.
    wide: bool,
}

impl GpPoisson {
    /// Reads `N`, `x` and the counts `k` (whole numbers `>= 0`, as a Poisson needs).
    pub(super) fn new(data: &Data, device: &Device) -> Result<Self, PosteriorDbError> {
        Self::with_precision(data, device, parvi_model::tensor_ops::f64_arithmetic(device))
    }

    /// As [`GpPoisson::new`], choosing `f64` (`wide`) or the `f32` fallback.
    pub(super) fn with_precision(data: &Data, device: &Device, wide: bool) -> Result<Self, PosteriorDbError> {
        let n = data.size("N", 1)?;
        let x = data.reals("x", n, "N")?;
        let k = data.ints("k", n, "N")?;
        if let Some(i) = k.iter().position(|&c| c < 0) {
            return Err(
                data.invalid("k", format!("value {} at element {} must be >= 0: it is a Poisson count", k[i], i + 1))
            );
        }
        let eye: Vec<f64> = (0..n * n).map(|i| if i / n == i % n { 1.0 } else { 0.0 }).collect();
        let host = |values: Vec<f64>, shape: Vec<usize>| {
            if wide {
                TensorData::new(values, shape)
            } else {
                TensorData::new(values.iter().map(|&v| v as f32).collect(), shape)
            }
        };
        let dtype = if wide { DType::F64 } else { DType::F32 };
        Ok(Self {
            x: Tensor::from_data(host(x, vec![n]), (device, dtype)),
            eye: Tensor::from_data(host(eye, vec![1, n, n]), (device, dtype)),
            counts: PoissonLog::new(matrix_from_vec(k.iter().map(|&c| c as f32).collect(), 1, n, device))
                .map_err(|e| data.invalid("k", e.to_string()))?,
            wide,
        })
    }

    /// How this build departs from the Stan program: `None` with `f64`.
    pub(super) fn deviation(&self) -> Option<&'static str> {
        if self.wide { None } else { Some(DEVIATION) }
    }

    /// `t` in the factorisation's dtype.
    fn wide(&self, t: Tensor<2>) -> Tensor<2> {
        if self.wide { t.cast(FloatDType::F64) } else { t }
    }

    /// The diagonal jitter for magnitudes `alpha` `[n, 1]` (in the factorisation's dtype):
    /// Stan's `1e-10`, or `1e-5 alpha^2` in `f32`.
    fn jitter(&self, alpha: Tensor<2>) -> (Tensor<3>, f64) {
        let n = alpha.dims()[0];
        if self.wide {
            (self.eye.clone().mul_scalar(JITTER), PIVOT_FLOOR)
        } else {
            (self.eye.clone() * alpha.square().mul_scalar(JITTER_F32).reshape([n, 1, 1]), DEFAULT_PIVOT_FLOOR)
        }
    }
}

impl Program for GpPoisson {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        ParamLayout::new().positive("rho", &[])?.positive("alpha", &[])?.real("f_tilde", &[self.x.dims()[0]])
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let (rho, alpha, f_tilde) = (p.get("rho")?, p.get("alpha")?, p.get("f_tilde")?);
        let f = p.transformed("f", self.latent(p)?);
        *target += Gamma::new(25.0, 4.0)?.log_prob(rho);
        *target += Normal::new(0.0, 2.0)?.log_prob(alpha);
        *target += Normal::new(0.0, 1.0)?.log_prob(f_tilde);
        *target += self.counts.log_prob(f);
        Ok(())
    }

    /// `vector[N] log_lik; log_lik[i] = poisson_log_lpmf(k[i] | f[i]);` (not in posteriordb's
    /// program: the pointwise log-likelihood that PSIS-LOO reads).
    fn generated(&self, p: &Vars, out: &mut Generated) -> Result<(), ModelError> {
        let f = self.latent(p)?;
        let points = f.dims()[1];
        out.output_shaped("log_lik", &[points], self.counts.log_prob(f));
        Ok(())
    }
}

impl GpPoisson {
    /// The latent `f = L_cov f_tilde` `[n, N]`, `L_cov = cholesky_decompose(gp_exp_quad_cov(x,
    /// alpha, rho) + jitter)` in `f64` where the device has it.
    fn latent(&self, p: &Vars) -> Result<Tensor<2>, ModelError> {
        let (rho, alpha, f_tilde) = (p.get("rho")?, p.get("alpha")?, p.get("f_tilde")?);
        let [n, points] = f_tilde.dims();
        let alpha = self.wide(alpha);
        let (jitter, pivot_floor) = self.jitter(alpha.clone());
        let cov = exp_quad_cov(self.x.clone(), alpha, self.wide(rho))? + jitter;
        let l_cov = cholesky_factor_floored(cov, pivot_floor)?;
        let f = l_cov.matmul(self.wide(f_tilde.clone()).reshape([n, points, 1])).reshape([n, points]);
        Ok(f.cast(f_tilde.dtype()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parvi_model::program::Compiled;
    use parvi_model::tensor_ops::to_vec_f32;

    /// On a short, well-conditioned grid both precisions give the host Cholesky's `f = L f_tilde`
    /// (the `f32` path up to its larger jitter), reported after `rho`, `alpha` and `f_tilde`,
    /// and only the fallback reports a deviation.
    #[test]
    fn both_precisions_factor_a_well_conditioned_covariance() {
        const NAME: &str = "gp_pois_regr-gp_pois_regr";
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join(NAME)).unwrap();
        std::fs::write(tmp.path().join(NAME).join("data.json"), r#"{"N": 3, "x": [-2, 0, 3], "k": [1, 0, 4]}"#)
            .unwrap();
        let data = Data::read(NAME, &tmp.path().join(NAME).join("data.json")).unwrap();
        let device = parvi_model::BackendKind::Flex.device().unwrap();
        let (rho, alpha, f_tilde) = (1.5f64, 0.8f64, [0.3f64, -1.2, 0.7]);
        // Host Cholesky of alpha^2 exp(-d^2 / (2 rho^2)) + 1e-10 I.
        let x = [-2.0f64, 0.0, 3.0];
        let c = |i: usize, j: usize| {
            alpha * alpha * (-(x[i] - x[j]).powi(2) / (2.0 * rho * rho)).exp() + if i == j { JITTER } else { 0.0 }
        };
        let mut l = [[0.0f64; 3]; 3];
        for j in 0..3 {
            l[j][j] = (c(j, j) - (0..j).map(|k| l[j][k] * l[j][k]).sum::<f64>()).sqrt();
            for i in j + 1..3 {
                l[i][j] = (c(i, j) - (0..j).map(|k| l[i][k] * l[j][k]).sum::<f64>()) / l[j][j];
            }
        }
        let expect: Vec<f64> = (0..3).map(|i| (0..=i).map(|j| l[i][j] * f_tilde[j]).sum()).collect();
        let particle: Vec<f32> = [rho.ln(), alpha.ln()].into_iter().chain(f_tilde).map(|v| v as f32).collect();
        for wide in [true, false] {
            let gp = GpPoisson::with_precision(&data, &device, wide).unwrap();
            assert_eq!(gp.deviation().is_some(), !wide);
            let compiled = Compiled::new(gp, &device).unwrap();
            let names: Vec<&str> = compiled.names().iter().map(String::as_str).collect();
            assert_eq!(names[5..], ["f[1]", "f[2]", "f[3]"]);
            let particles = Tensor::from_data(TensorData::new(particle.clone(), [1, 5]), &device);
            let reported = to_vec_f32(&compiled.reported(particles).unwrap());
            for (got, want) in reported[5..].iter().zip(&expect) {
                assert!((f64::from(*got) - want).abs() < 1e-4, "wide {wide}: f {got} vs {want}");
            }
        }
    }
}
