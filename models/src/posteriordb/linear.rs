//! The Gaussian linear-regression likelihood that sblrc, arK and diamonds share: `y ~ normal(X coef + intercept, sigma)`, for all particles in one product.

use burn::tensor::{Device, Tensor};
use parvi_model::dist::{Cauchy, LogProb, Normal};
use parvi_model::tensor_ops::matrix_from_vec;
use parvi_model::{LogDensity, Minibatch, ModelError, ParamLayout};

use super::Target;

/// A design matrix and response on the device; its rows are the minibatch rows.
#[derive(Debug)]
pub(crate) struct LinearGaussian {
    /// `[rows, cols]`
    x: Tensor<2>,
    /// `[rows, 1]`
    y: Tensor<2>,
    rows: usize,
}

impl LinearGaussian {
    /// From a row-major `rows x cols` design (computed in `f64` on the host, then stored in
    /// `f32`) and the response.
    pub(crate) fn new(x: &[f64], y: &[f64], cols: usize, device: &Device) -> Self {
        let rows = y.len();
        debug_assert_eq!(x.len(), rows * cols);
        Self {
            x: matrix_from_vec(x.iter().map(|&v| v as f32).collect(), rows, cols, device),
            y: matrix_from_vec(y.iter().map(|&v| v as f32).collect(), rows, 1, device),
            rows,
        }
    }

    /// Number of data rows.
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// `sum_rows log N(y | x coef^T + intercept, sigma)` for every particle, `[n]`: `coef`
    /// `[n, cols]`, `intercept` and `sigma` `[n, 1]`. With a minibatch, the batch rows scaled by
    /// `N / B`.
    pub(crate) fn log_lik(
        &self,
        coef: Tensor<2>,
        intercept: Option<Tensor<2>>,
        sigma: Tensor<2>,
        batch: Option<&Minibatch>,
    ) -> Tensor<1> {
        let n = coef.dims()[0];
        let (x, scale) = Minibatch::select(batch, self.x.clone());
        let (y, _) = Minibatch::select(batch, self.y.clone());
        let mut mean = x.matmul(coef.transpose()); // [B, n]
        if let Some(b) = intercept {
            mean = mean + b.transpose();
        }
        let residual = y - mean;
        let normal = Normal::new(0.0, sigma.transpose()).expect("a tensor scale is checked by its constraint");
        normal.log_prob_sum(residual, 0).reshape([n]).mul_scalar(scale)
    }
}

/// The prior on a regression's residual scale `sigma` (sampled as `log sigma`).
#[derive(Clone, Copy, Debug)]
pub(crate) enum SigmaPrior {
    /// `sigma ~ cauchy(0, scale)`.
    Cauchy(f64),
    /// `sigma ~ normal(0, sd)`.
    Normal(f64),
}

/// A Gaussian linear regression posterior: coefficient blocks (unconstrained, concatenated in
/// layout order to match the design's columns) and a positive `sigma`.
#[derive(Debug)]
pub(crate) struct Regression {
    lin: LinearGaussian,
    layout: ParamLayout,
    /// The layout blocks that make up the coefficient vector, in design-column order.
    coef_blocks: Vec<&'static str>,
    /// `coef ~ normal(0, sd)` elementwise, or flat.
    coef_sd: Option<f64>,
    sigma_prior: SigmaPrior,
}

impl Regression {
    /// A regression on `lin` whose layout is the real `coef_blocks` (name and shape, `[]` for a
    /// scalar) then a positive `sigma`.
    pub(crate) fn new(
        lin: LinearGaussian,
        coef_blocks: &[(&'static str, &[usize])],
        coef_sd: Option<f64>,
        sigma_prior: SigmaPrior,
    ) -> Result<Self, ModelError> {
        let mut layout = ParamLayout::new();
        for (name, shape) in coef_blocks {
            layout = layout.real(name, shape)?;
        }
        let layout = layout.positive("sigma", &[])?;
        let coef_blocks = coef_blocks.iter().map(|(name, _)| *name).collect();
        Ok(Self { lin, layout, coef_blocks, coef_sd, sigma_prior })
    }
}

impl LogDensity for Regression {
    fn dim(&self) -> usize {
        self.layout.dim()
    }

    fn data_len(&self) -> Option<usize> {
        Some(self.lin.rows())
    }

    fn log_prob(&self, particles: Tensor<2>, batch: Option<&Minibatch>) -> Tensor<1> {
        let n = particles.dims()[0];
        let p = self.layout.unpack(particles);
        let coef = Tensor::cat(self.coef_blocks.iter().map(|b| p.flat(b).expect("layout block")).collect(), 1);
        let sigma = p.flat("sigma").expect("layout block"); // [n, 1]
        let mut lp = self.lin.log_lik(coef.clone(), None, sigma.clone(), batch) + p.log_jacobian.clone();
        if let Some(sd) = self.coef_sd {
            let prior = Normal::new(0.0, sd).expect("a positive constant sd");
            lp = lp + prior.log_prob_sum(coef, 1).reshape([n]);
        }
        let sigma = sigma.reshape([n]);
        match self.sigma_prior {
            SigmaPrior::Cauchy(scale) => {
                lp + Cauchy::new(0.0, scale).expect("a positive constant scale").log_prob(sigma)
            }
            SigmaPrior::Normal(sd) => lp + Normal::new(0.0, sd).expect("a positive constant sd").log_prob(sigma),
        }
    }
}

impl Target for Regression {
    fn layout(&self) -> &ParamLayout {
        &self.layout
    }
}
