//! `gp_pois_regr-gp_pois_regr`: Poisson regression on a latent Gaussian process,
//! `k ~ poisson_log(f)`, `f = L f_tilde` with `L` the Cholesky factor of the squared-exponential
//! covariance `alpha^2 exp(-(x_i - x_j)^2 / (2 rho^2)) + 1e-10 I`, `f_tilde ~ normal(0, 1)`,
//! `rho ~ gamma(25, 4)`, `alpha ~ normal(0, 2)` on `rho, alpha > 0`.
//!
//! The covariance of all particles is one `[n, N, N]` tensor and its Cholesky factor is computed
//! column by column (`N` rounds of a batched product), as burn has no Cholesky. That factor needs
//! `f64`: at the posterior's length scales (`rho` about 4 to 7 against a grid spacing of 2) the
//! covariance's smallest eigenvalue is below `1e-8 alpha^2`, so rounding its entries to `f32`
//! (relative error `6e-8`) makes it indefinite, and with Stan's jitter of `1e-10` an `f32`
//! factor is garbage. The factor is therefore computed in `f64` wherever the device supports it
//! (CPU backends, and GPUs with `f64` arithmetic); the rest of the density stays in `f32`. On a
//! device without `f64` the model falls back to `f32` with a jitter of `1e-5 alpha^2`, a
//! slightly different model, which [`super::PosteriorDbModel::deviation`] reports.

use burn::tensor::{DType, Device, FloatDType, Tensor, TensorData};
use parvi_model::dist::{Gamma, LogProb, Normal, Poisson};
use parvi_model::tensor_ops::matrix_from_vec;
use parvi_model::{LogDensity, Minibatch, ParamLayout};

use super::data::Data;
use super::{PosteriorDbError, Target};

const NAME: &str = "gp_pois_regr-gp_pois_regr";

/// Stan's diagonal jitter.
const JITTER: f64 = 1e-10;
/// The relative jitter of the `f32` fallback: above the `f32` rounding of a `N x N` covariance.
const JITTER_F32: f64 = 1e-5;
/// The smallest pivot the `f64` factorisation accepts (a tenth of the jitter): reached only where
/// rounding has made the covariance indefinite, where Stan would reject the point; the floor
/// keeps the density finite there.
const PIVOT_FLOOR: f64 = 1e-11;

const DEVIATION: &str = "gp_pois_regr: this device has no accurate f64 arithmetic (see `tensor_ops::f64_arithmetic`), so the covariance's Cholesky factor is \
                         computed in f32 with a jitter of 1e-5 alpha^2 instead of Stan's 1e-10 (which f32 cannot \
                         resolve): the log density in f_tilde differs from Stan's, and f's prior has a little \
                         extra white noise";

/// `rho`, `alpha`, `f[1..N]`.
pub(super) fn param_names(data: &Data) -> Result<Vec<String>, PosteriorDbError> {
    let n = points(data)?;
    Ok(["rho".to_string(), "alpha".to_string()].into_iter().chain(super::indexed("f", n)).collect())
}

fn points(data: &Data) -> Result<usize, PosteriorDbError> {
    data.size("N", 1)
}

/// The model with the grid and counts on the device.
#[derive(Debug)]
pub(super) struct GpPoisson {
    /// `-(x_i - x_j)^2 / 2`, `[1, N, N]`, in the factorisation's dtype.
    half_sq_dist: Tensor<3>,
    /// The identity, `[1, N, N]`, in the factorisation's dtype.
    eye: Tensor<3>,
    /// `[1, N]`
    counts: Tensor<2>,
    points: usize,
    /// Whether the factor is computed in `f64`.
    wide: bool,
    layout: ParamLayout,
}

impl GpPoisson {
    /// Reads `N`, `x` and the counts `k` (whole numbers `>= 0`, as a Poisson needs).
    pub(super) fn new(data: &Data, device: &Device) -> Result<Self, PosteriorDbError> {
        Self::with_precision(data, device, parvi_model::tensor_ops::f64_arithmetic(device))
    }

    /// As [`GpPoisson::new`], choosing `f64` (`wide`) or the `f32` fallback.
    pub(super) fn with_precision(data: &Data, device: &Device, wide: bool) -> Result<Self, PosteriorDbError> {
        let n = points(data)?;
        let x = data.reals("x", n, "N")?;
        let k = data.ints("k", n, "N")?;
        if let Some(i) = k.iter().position(|&c| c < 0) {
            return Err(
                data.invalid("k", format!("value {} at element {} must be >= 0: it is a Poisson count", k[i], i + 1))
            );
        }
        let layout = ParamLayout::new()
            .positive("rho", &[])
            .and_then(|l| l.positive("alpha", &[]))
            .and_then(|l| l.real("f_tilde", &[n]))
            .map_err(super::model_error(NAME))?;
        let half_sq: Vec<f64> = x.iter().flat_map(|xi| x.iter().map(move |xj| -0.5 * (xi - xj) * (xi - xj))).collect();
        let eye: Vec<f64> = (0..n * n).map(|i| if i / n == i % n { 1.0 } else { 0.0 }).collect();
        let matrix = |values: Vec<f64>| -> Tensor<3> {
            if wide {
                Tensor::from_data(TensorData::new(values, [1, n, n]), (device, DType::F64))
            } else {
                Tensor::from_data(TensorData::new(values.iter().map(|&v| v as f32).collect(), [1, n, n]), device)
            }
        };
        let (half_sq_dist, eye) = (matrix(half_sq), matrix(eye));
        let counts = matrix_from_vec(k.iter().map(|&c| c as f32).collect(), 1, n, device);
        Ok(Self { half_sq_dist, eye, counts, points: n, wide, layout })
    }

    /// `rho`, `alpha` `[n, 1]`, `f_tilde` `[n, N]` and the log-Jacobian.
    fn parts(&self, particles: Tensor<2>) -> (Tensor<2>, Tensor<2>, Tensor<2>, Tensor<1>) {
        let p = self.layout.unpack(particles);
        let get = |name: &str| p.flat(name).expect("layout block");
        (get("rho"), get("alpha"), get("f_tilde"), p.log_jacobian.clone())
    }

    /// `f = L f_tilde` for every particle, `[n, N]`, in the particles' dtype.
    fn latent(&self, rho: Tensor<2>, alpha: Tensor<2>, f_tilde: Tensor<2>) -> Tensor<2> {
        let (n, m) = (rho.dims()[0], self.points);
        let out_dtype = f_tilde.dtype();
        let (rho, alpha, f_tilde) = if self.wide {
            let wide = |t: Tensor<2>| t.cast(FloatDType::F64);
            (wide(rho), wide(alpha), wide(f_tilde))
        } else {
            (rho, alpha, f_tilde)
        };
        let alpha_sq = alpha.square().reshape([n, 1, 1]);
        let inv_rho_sq = rho.square().recip().reshape([n, 1, 1]);
        let mut cov = (self.half_sq_dist.clone() * inv_rho_sq).exp() * alpha_sq.clone(); // [n, N, N]
        let (jitter, floor) = if self.wide {
            (alpha_sq.zeros_like().add_scalar(JITTER), alpha_sq.zeros_like().add_scalar(PIVOT_FLOOR))
        } else {
            let j = alpha_sq.clone().mul_scalar(JITTER_F32);
            (j.clone(), j.mul_scalar(0.1))
        };
        cov = cov + self.eye.clone() * jitter;
        // Column j of L: (c_j - L[:, :j] L[j, :j]^T) / sqrt(pivot), zero above the diagonal.
        let mut columns: Vec<Tensor<3>> = Vec::with_capacity(m);
        for j in 0..m {
            let mut column = cov.clone().narrow(2, j, 1).narrow(1, j, m - j); // [n, N - j, 1]
            if j > 0 {
                let left = Tensor::cat(columns.clone(), 2); // [n, N, j]
                let below = left.clone().narrow(1, j, m - j); // [n, N - j, j]
                let row = left.narrow(1, j, 1); // [n, 1, j]
                column = column - below.matmul(row.swap_dims(1, 2));
            }
            let pivot = column.clone().narrow(1, 0, 1).max_pair(floor.clone()); // [n, 1, 1]
            column = column / pivot.sqrt();
            if j > 0 {
                column = Tensor::cat(vec![column.zeros_like().narrow(1, 0, 1).repeat_dim(1, j), column], 1);
            }
            columns.push(column);
        }
        let chol = Tensor::cat(columns, 2); // [n, N, N]
        let f = chol.matmul(f_tilde.reshape([n, m, 1])).reshape([n, m]);
        if self.wide { f.cast(out_dtype) } else { f }
    }
}

impl LogDensity for GpPoisson {
    fn dim(&self) -> usize {
        self.layout.dim()
    }

    fn log_prob(&self, particles: Tensor<2>, _batch: Option<&Minibatch>) -> Tensor<1> {
        let n = particles.dims()[0];
        let (rho, alpha, f_tilde, log_jacobian) = self.parts(particles);
        let f = self.latent(rho.clone(), alpha.clone(), f_tilde.clone());
        let prior_rho = Gamma::new(25.0, 4.0).expect("constant parameters").log_prob(rho);
        let prior_alpha = Normal::new(0.0, 2.0).expect("constant parameters").log_prob(alpha);
        let prior_f_tilde = Normal::new(0.0, 1.0).expect("constant parameters").log_prob_sum(f_tilde, 1);
        let lik = Poisson::from_log_rate(f).log_prob(self.counts.clone()).sum_dim(1);
        (prior_rho + prior_alpha + prior_f_tilde + lik).reshape([n]) + log_jacobian
    }
}

impl Target for GpPoisson {
    fn layout(&self) -> &ParamLayout {
        &self.layout
    }

    fn reported(&self, particles: Tensor<2>) -> Tensor<2> {
        let (rho, alpha, f_tilde, _) = self.parts(particles);
        let f = self.latent(rho.clone(), alpha.clone(), f_tilde);
        Tensor::cat(vec![rho, alpha, f], 1)
    }

    fn deviation(&self) -> Option<&'static str> {
        if self.wide { None } else { Some(DEVIATION) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parvi_model::tensor_ops::to_vec_f32;

    /// On a short, well-conditioned grid both precisions give the host Cholesky's `f = L f_tilde`
    /// (the `f32` path up to its larger jitter), and only the fallback reports a deviation.
    #[test]
    fn both_precisions_factor_a_well_conditioned_covariance() {
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
            let reported =
                to_vec_f32(&gp.reported(Tensor::from_data(TensorData::new(particle.clone(), [1, 5]), &device)));
            for (got, want) in reported[2..].iter().zip(&expect) {
                assert!((f64::from(*got) - want).abs() < 1e-4, "wide {wide}: f {got} vs {want}");
            }
        }
    }
}
