//! Distributions with batched, elementwise `log_prob` over tensors, and seeded sampling for
//! initialisation.
//!
//! Every parameter is a [`Param`]: a scalar, or a tensor broadcastable against the value (e.g. a
//! per-particle prior precision of shape `[n, 1]`). Shape parameters that enter through the
//! log-gamma function (Gamma's shape, Beta's two, StudentT's degrees of freedom, InvGamma's
//! alpha, the Dirichlet's concentrations, the LKJ's eta) may be tensors too: their normalising
//! constants then come from [`ln_gamma_tensor`] (relative error below 1e-5 in f32 over
//! `0.05 .. 1e4`) or [`ln_gamma_ratio_tensor`]; scalars keep a host `f64` constant.
//!
//! Densities match Stan's `_lpdf` / `_lpmf` with all normalising constants (Stan's `target +=`
//! form). Outside the support a log-density is `-inf` (never NaN) and its gradient there is 0.
//! Count likelihoods ([`BinomialLogit`], [`NegBinomial2Log`]) take their data at construction
//! and check it once: a negative, non-integer or too large count is an
//! [`ModelError::InvalidParameter`] naming the distribution and the data. Tensor
//! `lcdf`/`lccdf` exist for most univariate distributions (`docs/dsl.md` lists them); those of
//! [`Gamma`], [`InvGamma`], [`Beta`], [`Binomial`] and Poisson ([`PoissonLog::lcdf_rate`]) go
//! through the regularised incomplete gamma and beta functions, evaluated on the host in `f64`
//! ([`crate::functions::gamma_p`]). [`StudentT`]'s are host-side, for scalar parameters.
//!
//! The families live in their own modules and are re-exported here, so every distribution is
//! `parvi_model::dist::Name`: [`continuous`] (univariate densities), [`discrete`] (count and
//! label likelihoods), [`multivariate`] (vectors and matrices), and [`special`] (the log-gamma
//! and error-function forms the normalising constants and cdfs use).

use burn::tensor::Tensor;
use rand::Rng;

use crate::ModelError;

pub mod continuous;
pub mod discrete;
pub mod dlm;
pub mod glm;
pub mod multivariate;
pub mod special;

pub use continuous::*;
pub use discrete::*;
pub use dlm::*;
pub use glm::*;
pub use multivariate::*;
pub use special::{ln_gamma, ln_gamma_ratio_tensor, ln_gamma_tensor};

pub(crate) const LN_2PI: f64 = 1.837_877_066_409_345_3;

/// A distribution parameter: a scalar, or a tensor broadcastable against the value.
#[derive(Clone, Debug)]
pub enum Param<const D: usize> {
    /// A constant shared by every element.
    Scalar(f64),
    /// Boxed: a burn tensor handle is several hundred bytes.
    Tensor(Box<Tensor<D>>),
}

impl<const D: usize> From<f64> for Param<D> {
    fn from(v: f64) -> Self {
        Param::Scalar(v)
    }
}

impl<const D: usize> From<Tensor<D>> for Param<D> {
    fn from(t: Tensor<D>) -> Self {
        Param::Tensor(Box::new(t))
    }
}

impl<const D: usize> Param<D> {
    fn scalar(&self) -> Option<f64> {
        match self {
            Param::Scalar(v) => Some(*v),
            Param::Tensor(_) => None,
        }
    }

    /// Scalars are checked at construction; tensors are the model's responsibility (typically
    /// they come through a positive constraint).
    fn check_positive(self, dist: &'static str, name: &'static str) -> Result<Self, ModelError> {
        if let Param::Scalar(v) = self
            && !(v > 0.0 && v.is_finite())
        {
            return Err(ModelError::InvalidParameter {
                dist,
                name,
                reason: format!("must be finite and > 0, got {v}"),
            });
        }
        Ok(self)
    }

    fn check_finite(self, dist: &'static str, name: &'static str) -> Result<Self, ModelError> {
        if let Param::Scalar(v) = self
            && !v.is_finite()
        {
            return Err(ModelError::InvalidParameter { dist, name, reason: format!("must be finite, got {v}") });
        }
        Ok(self)
    }

    fn sub_from(&self, x: Tensor<D>) -> Tensor<D> {
        match self {
            // A zero location is the common case (priors, residuals): skip a full-size op.
            Param::Scalar(v) if *v == 0.0 => x,
            Param::Scalar(v) => x.sub_scalar(*v),
            Param::Tensor(t) => x - (**t).clone(),
        }
    }

    fn divide(&self, x: Tensor<D>) -> Tensor<D> {
        match self {
            Param::Scalar(v) => x.div_scalar(*v),
            Param::Tensor(t) => x / (**t).clone(),
        }
    }

    fn multiply(&self, x: Tensor<D>) -> Tensor<D> {
        match self {
            Param::Scalar(v) => x.mul_scalar(*v),
            Param::Tensor(t) => x * (**t).clone(),
        }
    }

    /// `x - ln(self)`.
    fn sub_ln_from(&self, x: Tensor<D>) -> Tensor<D> {
        match self {
            Param::Scalar(v) => x.sub_scalar(v.ln()),
            Param::Tensor(t) => x - (**t).clone().log(),
        }
    }

    /// `x + c * ln(self)`.
    fn add_scaled_ln_to(&self, x: Tensor<D>, c: f64) -> Tensor<D> {
        match self {
            Param::Scalar(v) => x.add_scalar(c * v.ln()),
            Param::Tensor(t) => x + (**t).clone().log().mul_scalar(c),
        }
    }

    /// `f` on a scalar (on the host), `g` on a tensor.
    fn map(&self, f: impl Fn(f64) -> f64, g: impl Fn(Tensor<D>) -> Tensor<D>) -> Param<D> {
        match self {
            Param::Scalar(v) => Param::Scalar(f(*v)),
            Param::Tensor(t) => Param::from(g((**t).clone())),
        }
    }

    /// `f` on two scalars (on the host), `g` on tensors otherwise: a scalar beside a tensor is
    /// lifted to a broadcastable `[1, ..., 1]` tensor of the other's device and dtype.
    fn zip(
        &self,
        other: &Param<D>,
        f: impl Fn(f64, f64) -> f64,
        g: impl Fn(Tensor<D>, Tensor<D>) -> Tensor<D>,
    ) -> Param<D> {
        match (self, other) {
            (Param::Scalar(a), Param::Scalar(b)) => Param::Scalar(f(*a, *b)),
            (Param::Tensor(a), Param::Tensor(b)) => Param::from(g((**a).clone(), (**b).clone())),
            (Param::Scalar(a), Param::Tensor(b)) => Param::from(g(lift(*a, b), (**b).clone())),
            (Param::Tensor(a), Param::Scalar(b)) => Param::from(g((**a).clone(), lift(*b, a))),
        }
    }

    /// `x + self`.
    fn add_to(&self, x: Tensor<D>) -> Tensor<D> {
        match self {
            Param::Scalar(v) if *v == 0.0 => x,
            Param::Scalar(v) => x.add_scalar(*v),
            Param::Tensor(t) => x + (**t).clone(),
        }
    }

    /// `ln self`.
    fn ln(&self) -> Param<D> {
        self.map(f64::ln, Tensor::log)
    }

    /// The parameter as a tensor: itself, or a scalar lifted to `[1, ..., 1]` on `like`'s
    /// device and dtype.
    fn tensor_like(&self, like: &Tensor<D>) -> Tensor<D> {
        match self {
            Param::Scalar(v) => lift(*v, like),
            Param::Tensor(t) => (**t).clone(),
        }
    }
}

/// A scalar as a `[1, ..., 1]` tensor on `like`'s device and dtype, which broadcasts against it.
fn lift<const D: usize>(v: f64, like: &Tensor<D>) -> Tensor<D> {
    Tensor::full([1; D], v, (&like.device(), like.dtype()))
}

/// Elementwise log-density of a distribution over tensors.
pub trait LogProb<const D: usize> {
    /// `log p(x)` elementwise, broadcast against the parameters.
    fn log_prob(&self, x: Tensor<D>) -> Tensor<D>;
}

/// Seeded draws for initialisation (scalar parameters only).
pub trait Sample {
    /// `n` independent draws.
    fn sample<R: Rng + ?Sized>(&self, rng: &mut R, n: usize) -> Result<Vec<f64>, ModelError>;
}

fn scalars<const D: usize, const K: usize>(dist: &'static str, params: [&Param<D>; K]) -> Result<[f64; K], ModelError> {
    let mut out = [0.0; K];
    for (o, p) in out.iter_mut().zip(params) {
        *o = p.scalar().ok_or(ModelError::NotSampleable(dist))?;
    }
    Ok(out)
}

fn draw<R: Rng + ?Sized, T: rand_distr::Distribution<f64>>(d: T, rng: &mut R, n: usize) -> Vec<f64> {
    (0..n).map(|_| d.sample(rng)).collect()
}

fn bad(dist: &'static str, name: &'static str, e: impl std::fmt::Display) -> ModelError {
    ModelError::InvalidParameter { dist, name, reason: e.to_string() }
}

/// An error naming element `element` (0-based, row-major) of argument `name`.
fn bad_at(dist: &'static str, name: &'static str, element: usize, e: impl std::fmt::Display) -> ModelError {
    ModelError::InvalidElement { dist, name, element, reason: e.to_string() }
}

fn positive_scalar(dist: &'static str, name: &'static str, v: f64) -> Result<f64, ModelError> {
    if v > 0.0 && v.is_finite() {
        Ok(v)
    } else {
        Err(ModelError::InvalidParameter { dist, name, reason: format!("must be finite and > 0, got {v}") })
    }
}

/// Stan's `log_mix(theta, lp1, lp2) = ln(theta e^lp1 + (1 - theta) e^lp2)`, elementwise and
/// broadcast: the log-density of a two-component mixture from its components' log-densities,
/// for a mixing weight `theta` in `(0, 1)`. Computed as a log-sum-exp around the (detached)
/// larger term, so it neither overflows nor underflows and its gradient is exact.
pub fn log_mix<const D: usize>(theta: Tensor<D>, lp1: Tensor<D>, lp2: Tensor<D>) -> Tensor<D> {
    let a = theta.clone().log() + lp1;
    let b = theta.neg().log1p() + lp2;
    let max = a.clone().max_pair(b.clone()).detach();
    ((a - max.clone()).exp() + (b - max.clone()).exp()).log() + max
}
