//! A particle set: positions `[n, dim]` and optional weights `[n]` (summing to 1).

use burn::tensor::{Device, Tensor};

use crate::{EngineRng, InferError};

/// The particle set every engine moves: positions, and weights for engines that weight them.
#[derive(Clone, Debug)]
pub struct Particles {
    /// `[n, dim]`, on the plain (non-autodiff) device.
    pub positions: Tensor<2>,
    /// `[n]`; `None` means uniform weights `1/n`.
    pub weights: Option<Tensor<1>>,
}

impl Particles {
    /// Equally weighted particles at `positions`, `[n, dim]`.
    pub fn new(positions: Tensor<2>) -> Self {
        Self { positions, weights: None }
    }

    /// `n` particles with independent `N(mean, std^2)` coordinates.
    pub fn gaussian(
        n: usize,
        dim: usize,
        mean: f64,
        std: f64,
        rng: &mut EngineRng,
        device: &Device,
    ) -> Result<Self, InferError> {
        if n == 0 {
            return Err(InferError::setting("particles", "need at least one particle, got 0"));
        }
        if dim == 0 {
            return Err(InferError::setting("dim", "particles need at least one dimension"));
        }
        let z = rng.normal_tensor(n, dim, device);
        Ok(Self::new(z.mul_scalar(std).add_scalar(mean)))
    }

    /// From row-major host values.
    pub fn from_rows(values: Vec<f32>, n: usize, dim: usize, device: &Device) -> Result<Self, InferError> {
        if n == 0 {
            return Err(InferError::setting("particles", "need at least one particle, got 0"));
        }
        if values.len() != n * dim {
            return Err(InferError::setting(
                "particles",
                format!("{} values do not fill {n} particles of dimension {dim}", values.len()),
            ));
        }
        Ok(Self::new(parvi_model::tensor_ops::matrix_from_vec(values, n, dim, device)))
    }

    /// Number of particles `n`.
    pub fn len(&self) -> usize {
        self.positions.dims()[0]
    }

    /// Whether there are no particles.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Dimension of each particle.
    pub fn dim(&self) -> usize {
        self.positions.dims()[1]
    }

    /// The device the positions live on.
    pub fn device(&self) -> Device {
        self.positions.device()
    }

    /// Weights as a tensor, uniform when none are set.
    pub fn weights_or_uniform(&self) -> Tensor<1> {
        let n = self.len();
        self.weights.clone().unwrap_or_else(|| Tensor::ones([n], &self.device()).div_scalar(n as f64))
    }

    /// Weighted mean `[dim]` (a host read).
    pub fn mean(&self) -> Vec<f64> {
        let w = self.weights_or_uniform().reshape([1, self.len()]);
        let m = w.matmul(self.positions.clone());
        parvi_model::tensor_ops::to_vec_f64(&m)
    }

    /// Weighted covariance `[dim, dim]` row-major, with the `1/n` (population) convention
    /// (a host read).
    pub fn covariance(&self) -> Vec<f64> {
        let n = self.len();
        let w = self.weights_or_uniform().reshape([n, 1]);
        let mean = w.clone().transpose().matmul(self.positions.clone());
        let centred = self.positions.clone() - mean;
        let cov = (centred.clone() * w).transpose().matmul(centred);
        parvi_model::tensor_ops::to_vec_f64(&cov)
    }

    /// Weighted variance of every coordinate `[dim]`, with the `1/n` convention (the diagonal
    /// of [`Particles::covariance`] without its `dim x dim` product; a host read).
    pub fn variances(&self) -> Vec<f64> {
        let n = self.len();
        let w = self.weights_or_uniform().reshape([n, 1]);
        let mean = w.clone().transpose().matmul(self.positions.clone());
        let centred = self.positions.clone() - mean;
        let var = (centred.clone() * centred * w).sum_dim(0);
        parvi_model::tensor_ops::to_vec_f64(&var)
    }

    /// Positions as host rows.
    pub fn to_rows(&self) -> Vec<Vec<f32>> {
        let dim = self.dim();
        parvi_model::tensor_ops::to_vec_f32(&self.positions).chunks(dim).map(<[f32]>::to_vec).collect()
    }

    /// Whether every position and weight is finite (one host read each).
    pub fn is_finite(&self) -> bool {
        parvi_model::tensor_ops::all_finite(&self.positions)
            && self.weights.as_ref().is_none_or(parvi_model::tensor_ops::all_finite)
    }
}
