//! Univariate continuous densities: Stan's `_lpdf`s, with `lcdf`/`lccdf` where they have a
//! tensor form.

use std::f64::consts::PI;

use burn::tensor::Tensor;
use rand::Rng;
use rand_distr::Distribution as _;

use super::special::{
    host_elementwise, ln_gamma, ln_gamma_ratio_tensor, ln_gamma_tail, ln_gamma_tensor, ln_inc_beta, ln_inc_beta_tail,
    log_bessel_i0, log_bessel_i0_host, log_erf, log_erfc, log_erfc_any, log_normal_cdfs, log1m_exp_neg, on_columns,
    regularized_incomplete_beta, skew_normal_log_cdf_columns, softplus,
};
use super::{LN_2PI, LogProb, Param, Sample, bad, draw, lift, scalars};
use crate::ModelError;
use crate::fused::{ScalarDensity, scalar_log_density};

/// `Normal(loc, scale)`.
#[derive(Clone, Debug)]
pub struct Normal<const D: usize> {
    loc: Param<D>,
    scale: Param<D>,
}

impl<const D: usize> Normal<D> {
    /// `Normal(loc, scale)`; a scalar `scale` must be finite and positive.
    pub fn new(loc: impl Into<Param<D>>, scale: impl Into<Param<D>>) -> Result<Self, ModelError> {
        Ok(Self {
            loc: loc.into().check_finite("Normal", "loc")?,
            scale: scale.into().check_positive("Normal", "scale")?,
        })
    }

    /// `Normal(0, 1/sqrt(precision))` with a (per-particle) precision tensor: the BNN prior form.
    pub fn with_precision(loc: f64, precision: Tensor<D>) -> Self {
        Self { loc: Param::Scalar(loc), scale: Param::Tensor(Box::new(precision.sqrt().recip())) }
    }

    /// `log_prob(x).sum_dim(dim)`, the log-density of iid draws along `dim`, computed from the
    /// sufficient statistic when the parameters are constant along `dim` (scalars, or tensors of
    /// size 1 there): `-k ln scale - (k/2) ln 2 pi - sum (x - loc)^2 / (2 scale^2)`. One reduction
    /// of the squares instead of `k` elementwise log terms and their backward: the form of an iid
    /// likelihood or prior over many weights. Otherwise it falls back to the elementwise sum.
    pub fn log_prob_sum(&self, x: Tensor<D>, dim: usize) -> Tensor<D> {
        let varies = |p: &Param<D>| matches!(p, Param::Tensor(t) if t.dims()[dim] != 1);
        if varies(&self.loc) || varies(&self.scale) {
            return self.log_prob(x).sum_dim(dim);
        }
        let k = x.dims()[dim] as f64;
        let ssq = self.loc.sub_from(x).square().sum_dim(dim);
        let quad = self.scale.divide(self.scale.divide(ssq)).mul_scalar(-0.5);
        self.scale.add_scaled_ln_to(quad, -k).sub_scalar(0.5 * k * LN_2PI)
    }
}

impl<const D: usize> Normal<D> {
    /// `ln P(X <= x)` elementwise (Stan's `normal_lcdf`), accurate in both tails (to
    /// `z = -(x - loc) / scale` of several hundred): the normaliser of a truncated normal.
    pub fn lcdf(&self, x: Tensor<D>) -> Tensor<D> {
        log_normal_cdfs(self.scale.divide(self.loc.sub_from(x))).0
    }

    /// `ln P(X > x)` elementwise (Stan's `normal_lccdf`), accurate in both tails.
    pub fn lccdf(&self, x: Tensor<D>) -> Tensor<D> {
        log_normal_cdfs(self.scale.divide(self.loc.sub_from(x))).1
    }
}

/// Whether `1 / v` for a squared scale `v` is a safe `f32` multiplier (within `1e-30..1e30`):
/// outside it the fused scalar forms of [`Normal`] and [`StudentT`] (which multiply by it) would
/// overflow where the general forms, dividing by the scale first, do not.
fn folds(v: f64) -> bool {
    (1e-30..=1e30).contains(&v)
}

impl<const D: usize> LogProb<D> for Normal<D> {
    fn log_prob(&self, x: Tensor<D>) -> Tensor<D> {
        if let (Param::Scalar(loc), Param::Scalar(scale)) = (&self.loc, &self.scale)
            && folds(scale * scale)
        {
            // Scalar parameters: one fused node with them as constants.
            return scalar_log_density(x, ScalarDensity::Normal { loc: *loc, scale: *scale });
        }
        // A tensor location or scale (or a scale too extreme for the scalar form): the fused
        // broadcast term, one node.
        let (loc, scale) = (self.loc.tensor_like(&x), self.scale.tensor_like(&x));
        crate::fused::normal_log_density(x, loc, scale)
    }
}

impl<const D: usize> Sample for Normal<D> {
    fn sample<R: Rng + ?Sized>(&self, rng: &mut R, n: usize) -> Result<Vec<f64>, ModelError> {
        let [loc, scale] = scalars("Normal", [&self.loc, &self.scale])?;
        Ok(draw(rand_distr::Normal::new(loc, scale).map_err(|e| bad("Normal", "scale", e))?, rng, n))
    }
}

/// `LogNormal(mu, sigma)`: `ln x ~ Normal(mu, sigma)`.
#[derive(Clone, Debug)]
pub struct LogNormal<const D: usize> {
    mu: Param<D>,
    sigma: Param<D>,
}

impl<const D: usize> LogNormal<D> {
    /// `LogNormal(mu, sigma)`; a scalar `sigma` must be finite and positive.
    pub fn new(mu: impl Into<Param<D>>, sigma: impl Into<Param<D>>) -> Result<Self, ModelError> {
        Ok(Self {
            mu: mu.into().check_finite("LogNormal", "mu")?,
            sigma: sigma.into().check_positive("LogNormal", "sigma")?,
        })
    }
}

impl<const D: usize> LogProb<D> for LogNormal<D> {
    fn log_prob(&self, x: Tensor<D>) -> Tensor<D> {
        let outside = x.clone().lower_equal_elem(0.0);
        let lx = x.clamp_min(f32::MIN_POSITIVE).log();
        let z = self.sigma.divide(self.mu.sub_from(lx.clone()));
        let lp = self.sigma.sub_ln_from(z.square().mul_scalar(-0.5).sub_scalar(0.5 * LN_2PI)) - lx;
        lp.mask_fill(outside, f32::NEG_INFINITY)
    }
}

impl<const D: usize> Sample for LogNormal<D> {
    fn sample<R: Rng + ?Sized>(&self, rng: &mut R, n: usize) -> Result<Vec<f64>, ModelError> {
        let [mu, sigma] = scalars("LogNormal", [&self.mu, &self.sigma])?;
        Ok(draw(rand_distr::LogNormal::new(mu, sigma).map_err(|e| bad("LogNormal", "sigma", e))?, rng, n))
    }
}

/// `Gamma(shape, rate)`, density `rate^shape x^(shape-1) e^(-rate x) / Gamma(shape)` (Stan's
/// `gamma_lpdf`); `x <= 0` gives `-inf`.
#[derive(Clone, Debug)]
pub struct Gamma<const D: usize> {
    shape: Param<D>,
    rate: Param<D>,
}

impl<const D: usize> Gamma<D> {
    /// `Gamma(shape, rate)`; each is a scalar (finite and positive) or a tensor.
    pub fn new(shape: impl Into<Param<D>>, rate: impl Into<Param<D>>) -> Result<Self, ModelError> {
        Ok(Self {
            shape: shape.into().check_positive("Gamma", "shape")?,
            rate: rate.into().check_positive("Gamma", "rate")?,
        })
    }
}

impl<const D: usize> LogProb<D> for Gamma<D> {
    fn log_prob(&self, x: Tensor<D>) -> Tensor<D> {
        let outside = x.clone().lower_equal_elem(0.0);
        if let (Param::Scalar(a), Param::Scalar(b)) = (&self.shape, &self.rate) {
            // Scalar parameters: one fused node, and the mask.
            let density = ScalarDensity::Gamma { shape: *a, rate: *b, log_norm: a * b.ln() - ln_gamma(*a) };
            return scalar_log_density(x, density).mask_fill(outside, f32::NEG_INFINITY);
        }
        let lx = x.clone().clamp_min(f32::MIN_POSITIVE).log();
        // shape ln(rate) - ln Gamma(shape) (at least one of them a tensor here).
        let norm = self.shape.zip(
            &self.rate,
            |a, b| a * b.ln() - ln_gamma(a),
            |a, b| a.clone() * b.log() - ln_gamma_tensor(a),
        );
        let body = self.shape.multiply(lx.clone()) - lx - self.rate.multiply(x);
        norm.add_to(body).mask_fill(outside, f32::NEG_INFINITY)
    }
}

impl<const D: usize> Sample for Gamma<D> {
    fn sample<R: Rng + ?Sized>(&self, rng: &mut R, n: usize) -> Result<Vec<f64>, ModelError> {
        let [shape, rate] = scalars("Gamma", [&self.shape, &self.rate])?;
        Ok(draw(rand_distr::Gamma::new(shape, 1.0 / rate).map_err(|e| bad("Gamma", "rate", e))?, rng, n))
    }
}

/// `InvGamma(alpha, beta)` (Stan's `inv_gamma_lpdf`): density
/// `beta^alpha x^(-alpha-1) e^(-beta / x) / Gamma(alpha)` on `x > 0`; `x <= 0` gives `-inf`.
#[derive(Clone, Debug)]
pub struct InvGamma<const D: usize> {
    alpha: Param<D>,
    beta: Param<D>,
}

impl<const D: usize> InvGamma<D> {
    /// `InvGamma(alpha, beta)`; each is a scalar (finite and positive) or a tensor.
    pub fn new(alpha: impl Into<Param<D>>, beta: impl Into<Param<D>>) -> Result<Self, ModelError> {
        Ok(Self {
            alpha: alpha.into().check_positive("InvGamma", "alpha")?,
            beta: beta.into().check_positive("InvGamma", "beta")?,
        })
    }
}

impl<const D: usize> LogProb<D> for InvGamma<D> {
    fn log_prob(&self, x: Tensor<D>) -> Tensor<D> {
        let outside = x.clone().lower_equal_elem(0.0);
        if let (Param::Scalar(a), Param::Scalar(b)) = (&self.alpha, &self.beta) {
            // Scalar parameters: one fused node, and the mask.
            let density = ScalarDensity::InvGamma { shape: *a, scale: *b, log_norm: a * b.ln() - ln_gamma(*a) };
            return scalar_log_density(x, density).mask_fill(outside, f32::NEG_INFINITY);
        }
        let x = x.clamp_min(f32::MIN_POSITIVE);
        let lx = x.clone().log();
        let norm = self.alpha.zip(
            &self.beta,
            |a, b| a * b.ln() - ln_gamma(a),
            |a, b| a.clone() * b.log() - ln_gamma_tensor(a),
        );
        let body = (self.alpha.multiply(lx.clone()) + lx).neg() - self.beta.multiply(x.recip());
        norm.add_to(body).mask_fill(outside, f32::NEG_INFINITY)
    }
}

impl<const D: usize> Sample for InvGamma<D> {
    fn sample<R: Rng + ?Sized>(&self, rng: &mut R, n: usize) -> Result<Vec<f64>, ModelError> {
        let [alpha, beta] = scalars("InvGamma", [&self.alpha, &self.beta])?;
        let d = rand_distr::Gamma::new(alpha, 1.0 / beta).map_err(|e| bad("InvGamma", "beta", e))?;
        Ok((0..n).map(|_| 1.0 / d.sample(rng)).collect())
    }
}

/// `Weibull(alpha, sigma)` with shape `alpha` and scale `sigma` (Stan's `weibull_lpdf`):
/// `ln alpha - ln sigma + (alpha - 1) ln(x / sigma) - (x / sigma)^alpha` on `x > 0`; `x <= 0`
/// gives `-inf` (the point 0 has probability zero).
#[derive(Clone, Debug)]
pub struct Weibull<const D: usize> {
    alpha: Param<D>,
    sigma: Param<D>,
}

impl<const D: usize> Weibull<D> {
    /// `Weibull(alpha, sigma)`; each is a scalar (finite and positive) or a tensor.
    pub fn new(alpha: impl Into<Param<D>>, sigma: impl Into<Param<D>>) -> Result<Self, ModelError> {
        Ok(Self {
            alpha: alpha.into().check_positive("Weibull", "alpha")?,
            sigma: sigma.into().check_positive("Weibull", "sigma")?,
        })
    }
}

impl<const D: usize> LogProb<D> for Weibull<D> {
    fn log_prob(&self, x: Tensor<D>) -> Tensor<D> {
        let outside = x.clone().lower_equal_elem(0.0);
        let lx = x.clamp_min(f32::MIN_POSITIVE).log();
        // With t = alpha ln(x / sigma): ln alpha - ln x + t - e^t; (x / sigma)^alpha as e^t
        // keeps the gradient in alpha a plain product.
        let t = self.alpha.multiply(self.sigma.sub_ln_from(lx.clone()));
        self.alpha.ln().add_to(t.clone() - t.exp() - lx).mask_fill(outside, f32::NEG_INFINITY)
    }
}

impl<const D: usize> Sample for Weibull<D> {
    fn sample<R: Rng + ?Sized>(&self, rng: &mut R, n: usize) -> Result<Vec<f64>, ModelError> {
        let [alpha, sigma] = scalars("Weibull", [&self.alpha, &self.sigma])?;
        Ok(draw(rand_distr::Weibull::new(sigma, alpha).map_err(|e| bad("Weibull", "alpha", e))?, rng, n))
    }
}

/// `HalfNormal(sigma)` on `[0, inf)`: `Normal(0, sigma)` renormalised to the half line, i.e.
/// Stan's `normal_lpdf(x | 0, sigma) - normal_lccdf(0 | 0, sigma)` (the `ln 2` that
/// `sigma ~ normal(0, s)` on a positive `sigma` leaves out, as for [`HalfCauchy`]); `x < 0` gives
/// `-inf`.
#[derive(Clone, Debug)]
pub struct HalfNormal<const D: usize> {
    sigma: Param<D>,
}

impl<const D: usize> HalfNormal<D> {
    /// `HalfNormal(sigma)`; a scalar `sigma` must be finite and positive.
    pub fn new(sigma: impl Into<Param<D>>) -> Result<Self, ModelError> {
        Ok(Self { sigma: sigma.into().check_positive("HalfNormal", "sigma")? })
    }

    /// `ln P(X <= x) = ln erf(x / (sigma sqrt 2))`; `-inf` for `x <= 0`.
    pub fn lcdf(&self, x: Tensor<D>) -> Tensor<D> {
        let outside = x.clone().lower_equal_elem(0.0);
        let u = self.sigma.divide(x).mul_scalar(std::f64::consts::FRAC_1_SQRT_2).clamp_min(0.0);
        log_erf(u).mask_fill(outside, f32::NEG_INFINITY)
    }

    /// `ln P(X > x) = ln erfc(x / (sigma sqrt 2))`; `0` for `x <= 0`.
    pub fn lccdf(&self, x: Tensor<D>) -> Tensor<D> {
        let u = self.sigma.divide(x).mul_scalar(std::f64::consts::FRAC_1_SQRT_2).clamp_min(0.0);
        log_erfc(u)
    }
}

impl<const D: usize> LogProb<D> for HalfNormal<D> {
    fn log_prob(&self, x: Tensor<D>) -> Tensor<D> {
        let outside = x.clone().lower_elem(0.0);
        let z = self.sigma.divide(x);
        let lp = z.square().mul_scalar(-0.5).add_scalar(0.5 * (2.0 / PI).ln());
        self.sigma.sub_ln_from(lp).mask_fill(outside, f32::NEG_INFINITY)
    }
}

impl<const D: usize> Sample for HalfNormal<D> {
    fn sample<R: Rng + ?Sized>(&self, rng: &mut R, n: usize) -> Result<Vec<f64>, ModelError> {
        let [sigma] = scalars("HalfNormal", [&self.sigma])?;
        let d = rand_distr::Normal::new(0.0, sigma).map_err(|e| bad("HalfNormal", "sigma", e))?;
        Ok((0..n).map(|_| d.sample(rng).abs()).collect())
    }
}

/// `Uniform(lower, upper)` (Stan's `uniform_lpdf`): `-ln(upper - lower)` on `[lower, upper]`.
///
/// Outside the interval the log-density is `-inf`, never NaN: a particle there has zero
/// density (a sampler or an optimiser rejects it, as Stan's `target` does), and its gradient
/// entry is `0` (the mask cuts the graph). With tensor bounds, a slot where `upper <= lower`
/// has no inside and is `-inf` too.
#[derive(Clone, Debug)]
pub struct Uniform<const D: usize> {
    lower: Param<D>,
    upper: Param<D>,
}

impl<const D: usize> Uniform<D> {
    /// `Uniform(lower, upper)`; scalar bounds must be finite, and `lower < upper` when both are.
    pub fn new(lower: impl Into<Param<D>>, upper: impl Into<Param<D>>) -> Result<Self, ModelError> {
        let lower = lower.into().check_finite("Uniform", "lower")?;
        let upper = upper.into().check_finite("Uniform", "upper")?;
        if let (Some(l), Some(u)) = (lower.scalar(), upper.scalar())
            && l >= u
        {
            return Err(ModelError::InvalidParameter {
                dist: "Uniform",
                name: "upper",
                reason: format!("must be > lower = {l}, got {u}"),
            });
        }
        Ok(Self { lower, upper })
    }
}

impl<const D: usize> LogProb<D> for Uniform<D> {
    fn log_prob(&self, x: Tensor<D>) -> Tensor<D> {
        let below = self.lower.sub_from(x.clone()).lower_elem(0.0);
        let above = self.upper.sub_from(x.clone()).greater_elem(0.0);
        let width = self.upper.zip(&self.lower, |u, l| u - l, |u, l| u - l);
        // `x * 0` gives the value's broadcast shape and keeps `x` in the graph (its gradient is
        // 0 inside), so a model whose only term is a uniform still has a score.
        let lp = width.map(|w| -w.ln(), |w| w.clamp_min(f32::MIN_POSITIVE).log().neg()).add_to(x.mul_scalar(0.0));
        let shape = lp.shape();
        let mut outside = below.expand(shape.clone()).bool_or(above.expand(shape.clone()));
        if let Param::Tensor(w) = &width {
            outside = outside.bool_or(w.clone().lower_equal_elem(0.0).expand(shape));
        }
        lp.mask_fill(outside, f32::NEG_INFINITY)
    }
}

impl<const D: usize> Sample for Uniform<D> {
    fn sample<R: Rng + ?Sized>(&self, rng: &mut R, n: usize) -> Result<Vec<f64>, ModelError> {
        let [lower, upper] = scalars("Uniform", [&self.lower, &self.upper])?;
        Ok(draw(rand_distr::Uniform::new(lower, upper).map_err(|e| bad("Uniform", "upper", e))?, rng, n))
    }
}
/// `Exponential(rate)`.
#[derive(Clone, Debug)]
pub struct Exponential<const D: usize> {
    rate: Param<D>,
}

impl<const D: usize> Exponential<D> {
    /// `Exponential(rate)`; a scalar `rate` must be finite and positive.
    pub fn new(rate: impl Into<Param<D>>) -> Result<Self, ModelError> {
        Ok(Self { rate: rate.into().check_positive("Exponential", "rate")? })
    }
}

impl<const D: usize> Exponential<D> {
    /// `ln P(X <= x) = ln(1 - e^(-rate x))` (Stan's `exponential_lcdf`), without cancellation
    /// for small `rate x`; `-inf` for `x <= 0`.
    pub fn lcdf(&self, x: Tensor<D>) -> Tensor<D> {
        let outside = x.clone().lower_equal_elem(0.0);
        let y = self.rate.multiply(x).clamp_min(f32::MIN_POSITIVE);
        log1m_exp_neg(y.clone()).mask_fill(outside.expand(y.shape()), f32::NEG_INFINITY)
    }

    /// `ln P(X > x) = -rate x` (Stan's `exponential_lccdf`); `0` for `x <= 0`.
    pub fn lccdf(&self, x: Tensor<D>) -> Tensor<D> {
        self.rate.multiply(x.clamp_min(0.0)).neg()
    }
}

impl<const D: usize> LogProb<D> for Exponential<D> {
    fn log_prob(&self, x: Tensor<D>) -> Tensor<D> {
        let outside = x.clone().lower_elem(0.0);
        self.rate.add_scaled_ln_to(self.rate.multiply(x).neg(), 1.0).mask_fill(outside, f32::NEG_INFINITY)
    }
}

impl<const D: usize> Sample for Exponential<D> {
    fn sample<R: Rng + ?Sized>(&self, rng: &mut R, n: usize) -> Result<Vec<f64>, ModelError> {
        let [rate] = scalars("Exponential", [&self.rate])?;
        Ok(draw(rand_distr::Exp::new(rate).map_err(|e| bad("Exponential", "rate", e))?, rng, n))
    }
}

/// `HalfCauchy(scale)` on `[0, inf)`.
#[derive(Clone, Debug)]
pub struct HalfCauchy<const D: usize> {
    scale: Param<D>,
}

impl<const D: usize> HalfCauchy<D> {
    /// `HalfCauchy(scale)`; a scalar `scale` must be finite and positive.
    pub fn new(scale: impl Into<Param<D>>) -> Result<Self, ModelError> {
        Ok(Self { scale: scale.into().check_positive("HalfCauchy", "scale")? })
    }
}

impl<const D: usize> LogProb<D> for HalfCauchy<D> {
    fn log_prob(&self, x: Tensor<D>) -> Tensor<D> {
        let outside = x.clone().lower_elem(0.0);
        let z = self.scale.divide(x);
        let lp = z.square().log1p().neg().add_scalar((2.0 / PI).ln());
        self.scale.sub_ln_from(lp).mask_fill(outside, f32::NEG_INFINITY)
    }
}

impl<const D: usize> Sample for HalfCauchy<D> {
    fn sample<R: Rng + ?Sized>(&self, rng: &mut R, n: usize) -> Result<Vec<f64>, ModelError> {
        let [scale] = scalars("HalfCauchy", [&self.scale])?;
        let d = rand_distr::Cauchy::new(0.0, scale).map_err(|e| bad("HalfCauchy", "scale", e))?;
        Ok((0..n).map(|_| d.sample(rng).abs()).collect())
    }
}

/// `Cauchy(loc, scale)`. Stan's `sigma ~ cauchy(0, s)` on a positive `sigma` is this density
/// on `(0, inf)` without renormalising, so it differs from [`HalfCauchy`] by the constant `ln 2`.
#[derive(Clone, Debug)]
pub struct Cauchy<const D: usize> {
    loc: Param<D>,
    scale: Param<D>,
}

impl<const D: usize> Cauchy<D> {
    /// `Cauchy(loc, scale)`; a scalar `scale` must be finite and positive.
    pub fn new(loc: impl Into<Param<D>>, scale: impl Into<Param<D>>) -> Result<Self, ModelError> {
        Ok(Self {
            loc: loc.into().check_finite("Cauchy", "loc")?,
            scale: scale.into().check_positive("Cauchy", "scale")?,
        })
    }
}

impl<const D: usize> Cauchy<D> {
    /// `ln P(X <= x)` (Stan's `cauchy_lcdf`), accurate in both tails (see [`Cauchy::lccdf`]).
    pub fn lcdf(&self, x: Tensor<D>) -> Tensor<D> {
        let z = self.scale.divide(self.loc.sub_from(x));
        cauchy_log_cdfs(z).0
    }

    /// `ln P(X > x)` (Stan's `cauchy_lccdf`). The smaller tail is `atan(1/|z|) / pi` beyond
    /// `|z| = 1` and `1/2 - atan(|z|) / pi` within (the textbook `1/2 + atan(z)/pi` cancels
    /// for `z` far below 0); the larger side is `ln(1 - tail)`.
    pub fn lccdf(&self, x: Tensor<D>) -> Tensor<D> {
        let z = self.scale.divide(self.loc.sub_from(x));
        cauchy_log_cdfs(z).1
    }
}

/// `(ln P(Z <= z), ln P(Z > z))` for a standard Cauchy; each branch on its own clamped input
/// (see [`log_erf`]).
fn cauchy_log_cdfs<const D: usize>(z: Tensor<D>) -> (Tensor<D>, Tensor<D>) {
    let negative = z.clone().lower_elem(0.0);
    let a = z.abs();
    let far = a.clone().greater_elem(1.0);
    let outer = a.clone().clamp_min(1.0).recip().atan().div_scalar(PI);
    let inner = a.clamp_max(1.0).atan().div_scalar(-PI).add_scalar(0.5);
    let tail = inner.mask_where(far, outer);
    let body = tail.clone().neg().log1p();
    let tail = tail.log();
    let lcdf = body.clone().mask_where(negative.clone(), tail.clone());
    (lcdf, tail.mask_where(negative, body))
}

impl<const D: usize> LogProb<D> for Cauchy<D> {
    fn log_prob(&self, x: Tensor<D>) -> Tensor<D> {
        let z = self.scale.divide(self.loc.sub_from(x));
        self.scale.sub_ln_from(z.square().log1p().neg().sub_scalar(PI.ln()))
    }
}

impl<const D: usize> Sample for Cauchy<D> {
    fn sample<R: Rng + ?Sized>(&self, rng: &mut R, n: usize) -> Result<Vec<f64>, ModelError> {
        let [loc, scale] = scalars("Cauchy", [&self.loc, &self.scale])?;
        Ok(draw(rand_distr::Cauchy::new(loc, scale).map_err(|e| bad("Cauchy", "scale", e))?, rng, n))
    }
}

/// Student's t with `df` degrees of freedom, location and scale (Stan's `student_t_lpdf`).
#[derive(Clone, Debug)]
pub struct StudentT<const D: usize> {
    df: Param<D>,
    loc: Param<D>,
    scale: Param<D>,
    /// `ln Gamma((df+1)/2) - ln Gamma(df/2) - ln(df pi) / 2`.
    log_norm: Param<D>,
}

impl<const D: usize> StudentT<D> {
    /// Student's t with `df` degrees of freedom, location and scale; a scalar `df` or `scale`
    /// must be finite and positive.
    pub fn new(
        df: impl Into<Param<D>>,
        loc: impl Into<Param<D>>,
        scale: impl Into<Param<D>>,
    ) -> Result<Self, ModelError> {
        let df = df.into().check_positive("StudentT", "df")?;
        // For a tensor df, the log-gamma difference comes from `ln_gamma_ratio_tensor`, which
        // does not cancel two large log-gammas when df is large.
        let log_norm = df.map(
            |v| ln_gamma(0.5 * (v + 1.0)) - ln_gamma(0.5 * v) - 0.5 * (v * PI).ln(),
            |t| {
                let half = t.clone().mul_scalar(0.5);
                let ratio = ln_gamma_ratio_tensor(half.clone(), lift(0.5, &half));
                ratio - t.mul_scalar(PI).log().mul_scalar(0.5)
            },
        );
        Ok(Self {
            df,
            loc: loc.into().check_finite("StudentT", "loc")?,
            scale: scale.into().check_positive("StudentT", "scale")?,
            log_norm,
        })
    }
}

impl<const D: usize> LogProb<D> for StudentT<D> {
    fn log_prob(&self, x: Tensor<D>) -> Tensor<D> {
        if let (Param::Scalar(df), Param::Scalar(scale), Param::Scalar(log_norm)) =
            (&self.df, &self.scale, &self.log_norm)
            && let Param::Scalar(loc) = &self.loc
            && folds(df * scale * scale)
        {
            // Scalar parameters: one fused node with them as constants.
            let density = ScalarDensity::StudentT { df: *df, loc: *loc, scale: *scale, log_norm: *log_norm };
            return scalar_log_density(x, density);
        }
        let z = self.scale.divide(self.loc.sub_from(x));
        let log_kernel = self.df.divide(z.square()).log1p();
        let half_df_plus_one = self.df.map(|v| -0.5 * (v + 1.0), |t| t.add_scalar(1.0).mul_scalar(-0.5));
        self.scale.sub_ln_from(self.log_norm.add_to(half_df_plus_one.multiply(log_kernel)))
    }
}

impl<const D: usize> StudentT<D> {
    /// `ln P(X <= x)` for scalar df, location and scale, on the host: the normalising constant
    /// of a truncated Student-t (brms writes a half-t prior as `student_t_lpdf(s | ...) -
    /// student_t_lccdf(0 | ...)`).
    ///
    /// There is no tensor version: the cdf is a regularised incomplete beta function, whose
    /// continued fraction needs a number of terms that grows with `df` and `t` (hundreds in
    /// the far tails). A fixed-length batched fraction would be either inaccurate in the tails
    /// or hundreds of full-size tensor ops; a truncated-t prior has constant parameters.
    pub fn lcdf(&self, x: f64) -> Result<f64, ModelError> {
        let (lower, upper) = self.tails(x)?;
        Ok(if lower <= 0.5 { lower.ln() } else { (-upper).ln_1p() })
    }

    /// `ln P(X > x)` for scalar df, location and scale, on the host (see [`StudentT::lcdf`]).
    pub fn lccdf(&self, x: f64) -> Result<f64, ModelError> {
        let (lower, upper) = self.tails(x)?;
        Ok(if upper <= 0.5 { upper.ln() } else { (-lower).ln_1p() })
    }

    /// `(P(X <= x), P(X > x))`, each computed directly from the regularised incomplete beta
    /// function so that a small tail keeps its relative precision.
    fn tails(&self, x: f64) -> Result<(f64, f64), ModelError> {
        let host = |p: &Param<D>, name| {
            p.scalar().ok_or_else(|| ModelError::InvalidParameter {
                dist: "StudentT",
                name,
                reason: "the cdf is computed on the host: give scalar df, loc and scale".into(),
            })
        };
        let (df, loc, scale) = (host(&self.df, "df")?, host(&self.loc, "loc")?, host(&self.scale, "scale")?);
        if x.is_nan() {
            return Err(ModelError::InvalidParameter { dist: "StudentT", name: "x", reason: "x is NaN".into() });
        }
        let t = (x - loc) / scale;
        if t.is_infinite() {
            return Ok(if t > 0.0 { (1.0, 0.0) } else { (0.0, 1.0) });
        }
        // P(|T| > |t|) = I_{df / (df + t^2)}(df / 2, 1 / 2).
        let two_sided = regularized_incomplete_beta(0.5 * df, 0.5, df / (df + t * t));
        let far = 0.5 * two_sided;
        Ok(if t > 0.0 { (1.0 - far, far) } else { (far, 1.0 - far) })
    }
}

impl<const D: usize> StudentT<D> {
    /// `ln P(X <= x)` batched over tensors (Stan's `student_t_lcdf`): any of `df`, `loc` and
    /// `scale` may be a tensor, and the gradient reaches all of them and `x`. With
    /// `t = (x - loc) / scale`, the far tail `P(T > |t|) = I_w(df / 2, 1 / 2) / 2` with
    /// `w = df / (df + t^2)`, computed as the complement of `I_{1-w}(1/2, df/2)` so that a small
    /// `|t|` keeps `1 - w = t^2 / (df + t^2)` exact; both tails in log form (the incomplete beta
    /// function's host kernel, see [`crate::functions::inc_beta`]); the derivative in `t` is the
    /// density over the cdf, exact at `t = 0` too. A tensor `df <= 0` gives NaN.
    pub fn lcdf_batched(&self, x: Tensor<D>) -> Tensor<D> {
        self.cdf_batched(x, true)
    }

    /// `ln P(X > x)` batched over tensors (Stan's `student_t_lccdf`); see
    /// [`StudentT::lcdf_batched`].
    pub fn lccdf_batched(&self, x: Tensor<D>) -> Tensor<D> {
        self.cdf_batched(x, false)
    }

    fn cdf_batched(&self, x: Tensor<D>, lower: bool) -> Tensor<D> {
        let t = self.scale.divide(self.loc.sub_from(x));
        let df = self.df.tensor_like(&t);
        let Ok(out) =
            host_elementwise::<D, 2, std::convert::Infallible>([t, df], |[t, nu]| Ok(student_t_log_cdf(t, nu, lower)));
        out
    }
}

/// `ln P(T <= t)` (`lower`) or `ln P(T > t)` for Student's t with `nu` degrees of freedom, and
/// its derivatives in `(t, nu)`, on the host in `f64` (see [`StudentT::lcdf_batched`]).
fn student_t_log_cdf(t: f64, nu: f64, lower: bool) -> (f64, [f64; 2]) {
    if nu.is_nan() || nu <= 0.0 || t.is_nan() {
        return (f64::NAN, [0.0; 2]);
    }
    if t.is_infinite() {
        let below = (t < 0.0) == lower;
        return (if below { f64::NEG_INFINITY } else { 0.0 }, [0.0; 2]);
    }
    let q = t * t + nu;
    let u = t * t / q;
    // I_w(nu/2, 1/2) = 1 - I_u(1/2, nu/2): the upper tail of the latter.
    let beta = ln_inc_beta(0.5, 0.5 * nu, u);
    let ln_far = beta.ln_upper - std::f64::consts::LN_2;
    // d ln far / d nu = d/db (1/2) + d/du du/dnu, du/dnu = -t^2 / q^2.
    let d_far_nu = 0.5 * beta.d_upper[1] - beta.d_upper[2] * t * t / (q * q);
    let ln_near = if ln_far > -std::f64::consts::LN_2 { (-ln_far.exp_m1()).ln() } else { (-ln_far.exp()).ln_1p() };
    let d_near_nu = -(ln_far - ln_near).exp() * d_far_nu;
    // The far tail is the lower one below 0.
    let (value, d_nu) = if (t < 0.0) == lower { (ln_far, d_far_nu) } else { (ln_near, d_near_nu) };
    let ln_density = ln_gamma(0.5 * (nu + 1.0))
        - ln_gamma(0.5 * nu)
        - 0.5 * (nu * PI).ln()
        - 0.5 * (nu + 1.0) * (t * t / nu).ln_1p();
    let d_t = if lower { (ln_density - value).exp() } else { -(ln_density - value).exp() };
    (value, [d_t, d_nu])
}

impl<const D: usize> Sample for StudentT<D> {
    fn sample<R: Rng + ?Sized>(&self, rng: &mut R, n: usize) -> Result<Vec<f64>, ModelError> {
        let [df, loc, scale] = scalars("StudentT", [&self.df, &self.loc, &self.scale])?;
        let d = rand_distr::StudentT::new(df).map_err(|e| bad("StudentT", "df", e))?;
        Ok((0..n).map(|_| loc + scale * d.sample(rng)).collect())
    }
}

/// `Laplace(loc, scale)`.
#[derive(Clone, Debug)]
pub struct Laplace<const D: usize> {
    loc: Param<D>,
    scale: Param<D>,
}

impl<const D: usize> Laplace<D> {
    /// `Laplace(loc, scale)`; a scalar `scale` must be finite and positive.
    pub fn new(loc: impl Into<Param<D>>, scale: impl Into<Param<D>>) -> Result<Self, ModelError> {
        Ok(Self {
            loc: loc.into().check_finite("Laplace", "loc")?,
            scale: scale.into().check_positive("Laplace", "scale")?,
        })
    }
}

impl<const D: usize> LogProb<D> for Laplace<D> {
    fn log_prob(&self, x: Tensor<D>) -> Tensor<D> {
        let z = self.scale.divide(self.loc.sub_from(x)).abs();
        self.scale.sub_ln_from(z.neg().sub_scalar(2f64.ln()))
    }
}

impl<const D: usize> Sample for Laplace<D> {
    fn sample<R: Rng + ?Sized>(&self, rng: &mut R, n: usize) -> Result<Vec<f64>, ModelError> {
        let [loc, scale] = scalars("Laplace", [&self.loc, &self.scale])?;
        // Inverse CDF of a uniform on (-1/2, 1/2).
        Ok((0..n)
            .map(|_| {
                let u: f64 = rand::RngExt::random::<f64>(rng) - 0.5;
                loc - scale * u.signum() * (1.0 - 2.0 * u.abs()).max(f64::MIN_POSITIVE).ln()
            })
            .collect())
    }
}

/// `Beta(alpha, beta)` on `(0, 1)` (Stan's `beta_lpdf`); `x` outside `(0, 1)` gives `-inf`.
#[derive(Clone, Debug)]
pub struct Beta<const D: usize> {
    alpha: Param<D>,
    beta: Param<D>,
    /// `ln B(alpha, beta)`.
    ln_beta_fn: Param<D>,
}

impl<const D: usize> Beta<D> {
    /// `Beta(alpha, beta)`; each is a scalar (finite and positive) or a tensor.
    pub fn new(alpha: impl Into<Param<D>>, beta: impl Into<Param<D>>) -> Result<Self, ModelError> {
        let alpha = alpha.into().check_positive("Beta", "alpha")?;
        let beta = beta.into().check_positive("Beta", "beta")?;
        let ln_beta_fn = alpha.zip(
            &beta,
            |a, b| ln_gamma(a) + ln_gamma(b) - ln_gamma(a + b),
            |a, b| ln_gamma_tensor(a.clone()) + ln_gamma_tensor(b.clone()) - ln_gamma_tensor(a + b),
        );
        Ok(Self { alpha, beta, ln_beta_fn })
    }
}

impl<const D: usize> LogProb<D> for Beta<D> {
    fn log_prob(&self, x: Tensor<D>) -> Tensor<D> {
        let outside = x.clone().lower_equal_elem(0.0).bool_or(x.clone().greater_equal_elem(1.0));
        let x = x.clamp(f32::MIN_POSITIVE, 1.0 - f32::EPSILON);
        let lx = x.clone().log();
        let l1mx = x.neg().log1p();
        let lp = self.alpha.multiply(lx.clone()) - lx + self.beta.multiply(l1mx.clone()) - l1mx;
        self.ln_beta_fn.map(|v| -v, Tensor::neg).add_to(lp).mask_fill(outside, f32::NEG_INFINITY)
    }
}

impl<const D: usize> Sample for Beta<D> {
    fn sample<R: Rng + ?Sized>(&self, rng: &mut R, n: usize) -> Result<Vec<f64>, ModelError> {
        let [alpha, beta] = scalars("Beta", [&self.alpha, &self.beta])?;
        Ok(draw(rand_distr::Beta::new(alpha, beta).map_err(|e| bad("Beta", "alpha", e))?, rng, n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn student_t_tails_match_closed_forms() {
        // df = 1 is the Cauchy: P(X > 1) = 1/4; df = 3 at its location: 1/2 each side.
        let cauchy = StudentT::<1>::new(1.0, 0.0, 1.0).unwrap();
        assert!((cauchy.lccdf(1.0).unwrap() - 0.25f64.ln()).abs() < 1e-12);
        assert!((cauchy.lcdf(1.0).unwrap() - 0.75f64.ln()).abs() < 1e-12);
        let t3 = StudentT::<1>::new(3.0, 0.0, 10.0).unwrap();
        assert!((t3.lccdf(0.0).unwrap() - 0.5f64.ln()).abs() < 1e-12);
        // df = 2: P(T <= t) = 1/2 + t / (2 sqrt(t^2 + 2)).
        let t2 = StudentT::<1>::new(2.0, 1.0, 2.0).unwrap();
        let t = (5.0 - 1.0) / 2.0;
        let cdf = 0.5 + t / (2.0 * (t * t + 2.0f64).sqrt());
        assert!((t2.lcdf(5.0).unwrap() - cdf.ln()).abs() < 1e-12);
        assert!((t2.lccdf(5.0).unwrap() - (1.0 - cdf).ln()).abs() < 1e-10);
    }
}

impl<const D: usize> LogNormal<D> {
    /// `ln P(X <= x) = ln Phi((ln x - mu) / sigma)` (Stan's `lognormal_lcdf`), accurate in both
    /// tails; `-inf` for `x <= 0`.
    pub fn lcdf(&self, x: Tensor<D>) -> Tensor<D> {
        let outside = x.clone().lower_equal_elem(0.0);
        let z = self.sigma.divide(self.mu.sub_from(x.clamp_min(f32::MIN_POSITIVE).log()));
        let lcdf = log_normal_cdfs(z).0;
        let shape = lcdf.dims();
        lcdf.mask_fill(outside.expand(shape), f32::NEG_INFINITY)
    }

    /// `ln P(X > x)` (Stan's `lognormal_lccdf`), accurate in both tails; `0` for `x <= 0`.
    pub fn lccdf(&self, x: Tensor<D>) -> Tensor<D> {
        let outside = x.clone().lower_equal_elem(0.0);
        let z = self.sigma.divide(self.mu.sub_from(x.clamp_min(f32::MIN_POSITIVE).log()));
        let lccdf = log_normal_cdfs(z).1;
        let shape = lccdf.dims();
        lccdf.mask_fill(outside.expand(shape), 0.0)
    }
}

impl<const D: usize> Weibull<D> {
    /// `(x / sigma)^alpha` as `e^(alpha ln(x / sigma))`, on `x` clamped into the support.
    fn power(&self, x: Tensor<D>) -> Tensor<D> {
        let lx = x.clamp_min(f32::MIN_POSITIVE).log();
        self.alpha.multiply(self.sigma.sub_ln_from(lx)).exp()
    }

    /// `ln P(X <= x) = ln(1 - e^(-(x / sigma)^alpha))` (Stan's `weibull_lcdf`), without
    /// cancellation where `(x / sigma)^alpha` is small; `-inf` for `x <= 0`.
    pub fn lcdf(&self, x: Tensor<D>) -> Tensor<D> {
        let outside = x.clone().lower_equal_elem(0.0);
        let lcdf = log1m_exp_neg(self.power(x));
        let shape = lcdf.dims();
        lcdf.mask_fill(outside.expand(shape), f32::NEG_INFINITY)
    }

    /// `ln P(X > x) = -(x / sigma)^alpha` (Stan's `weibull_lccdf`); `0` for `x <= 0`.
    pub fn lccdf(&self, x: Tensor<D>) -> Tensor<D> {
        let outside = x.clone().lower_equal_elem(0.0);
        let lccdf = self.power(x).neg();
        let shape = lccdf.dims();
        lccdf.mask_fill(outside.expand(shape), 0.0)
    }
}

impl<const D: usize> Gamma<D> {
    /// `(shape, rate x)` with `x` clamped to the support (`x <= 0` is the cdf's `0`).
    fn incomplete_args(&self, x: Tensor<D>) -> (Tensor<D>, Tensor<D>) {
        let z = self.rate.multiply(x.clamp_min(0.0));
        (self.shape.tensor_like(&z), z)
    }

    /// `ln P(X <= x) = ln P(shape, rate x)` (Stan's `gamma_lcdf`), the regularised lower
    /// incomplete gamma function in log form ([`crate::functions::gamma_p`]'s host kernel), so a
    /// far lower tail stays finite; `-inf` for `x <= 0`. Differentiable in `x`, `shape` and
    /// `rate`; a tensor `shape` or `rate` that is not positive gives NaN, as in
    /// [`LogProb::log_prob`]. Chi-square's is `Gamma::new(nu / 2, 0.5)?.lcdf(x)`.
    pub fn lcdf(&self, x: Tensor<D>) -> Tensor<D> {
        let (a, z) = self.incomplete_args(x);
        ln_gamma_tail(a, z, true)
    }

    /// `ln P(X > x) = ln Q(shape, rate x)` (Stan's `gamma_lccdf`), accurate far in the upper tail
    /// (a censoring point many scales out); `0` for `x <= 0`.
    pub fn lccdf(&self, x: Tensor<D>) -> Tensor<D> {
        let (a, z) = self.incomplete_args(x);
        ln_gamma_tail(a, z, false)
    }
}

impl<const D: usize> InvGamma<D> {
    /// `(alpha, beta / x)` with `x` clamped into the support, and the mask of `x <= 0`.
    fn incomplete_args(&self, x: Tensor<D>) -> (Tensor<D>, Tensor<D>, Tensor<D, burn::tensor::Bool>) {
        let outside = x.clone().lower_equal_elem(0.0);
        let z = self.beta.multiply(x.clamp_min(f32::MIN_POSITIVE).recip());
        let shape = z.dims();
        (self.alpha.tensor_like(&z), z, outside.expand(shape))
    }

    /// `ln P(X <= x) = ln Q(alpha, beta / x)` (Stan's `inv_gamma_lcdf`), in log form in both
    /// tails; `-inf` for `x <= 0`. Inverse chi-square's is `InvGamma::new(nu / 2, 0.5)?.lcdf(x)`.
    pub fn lcdf(&self, x: Tensor<D>) -> Tensor<D> {
        let (a, z, outside) = self.incomplete_args(x);
        ln_gamma_tail(a, z, false).mask_fill(outside, f32::NEG_INFINITY)
    }

    /// `ln P(X > x) = ln P(alpha, beta / x)` (Stan's `inv_gamma_lccdf`); `0` for `x <= 0`.
    pub fn lccdf(&self, x: Tensor<D>) -> Tensor<D> {
        let (a, z, outside) = self.incomplete_args(x);
        ln_gamma_tail(a, z, true).mask_fill(outside, 0.0)
    }
}

impl<const D: usize> Beta<D> {
    fn incomplete_args(&self, x: Tensor<D>) -> [Tensor<D>; 3] {
        let x = x.clamp(0.0, 1.0);
        let a = self.alpha.tensor_like(&x);
        let b = self.beta.tensor_like(&x);
        [a, b, x]
    }

    /// `ln P(X <= x) = ln I_x(alpha, beta)` (Stan's `beta_lcdf`), the regularised incomplete
    /// beta function in log form ([`crate::functions::inc_beta`]'s host kernel); `-inf` for
    /// `x <= 0`, `0` for `x >= 1`. Differentiable in `x`, `alpha` and `beta`.
    pub fn lcdf(&self, x: Tensor<D>) -> Tensor<D> {
        let [a, b, x] = self.incomplete_args(x);
        ln_inc_beta_tail(a, b, x, true)
    }

    /// `ln P(X > x) = ln I_{1-x}(beta, alpha)` (Stan's `beta_lccdf`), computed directly, so the
    /// upper tail near 1 keeps its precision; `0` for `x <= 0`, `-inf` for `x >= 1`.
    pub fn lccdf(&self, x: Tensor<D>) -> Tensor<D> {
        let [a, b, x] = self.incomplete_args(x);
        ln_inc_beta_tail(a, b, x, false)
    }
}

impl<const D: usize> Laplace<D> {
    /// `(z, z < 0)` for `z = (x - loc) / scale`.
    fn z(&self, x: Tensor<D>) -> (Tensor<D>, Tensor<D, burn::tensor::Bool>) {
        let z = self.scale.divide(self.loc.sub_from(x));
        let negative = z.clone().lower_elem(0.0);
        (z, negative)
    }

    /// `ln P(X <= x)` (Stan's `double_exponential_lcdf`): `ln(1/2) + z` below `loc`,
    /// `ln(1 - e^-z / 2)` above, with `z = (x - loc) / scale`; each side on its own clamped `z`.
    pub fn lcdf(&self, x: Tensor<D>) -> Tensor<D> {
        let (z, negative) = self.z(x);
        let near = z.clone().clamp_max(0.0).sub_scalar(std::f64::consts::LN_2);
        let far = z.clamp_min(0.0).neg().exp().mul_scalar(-0.5).log1p();
        far.mask_where(negative, near)
    }

    /// `ln P(X > x)` (Stan's `double_exponential_lccdf`): `ln(1/2) - z` above `loc`,
    /// `ln(1 - e^z / 2)` below.
    pub fn lccdf(&self, x: Tensor<D>) -> Tensor<D> {
        let (z, negative) = self.z(x);
        let far = z.clone().clamp_max(0.0).exp().mul_scalar(-0.5).log1p();
        let near = z.clamp_min(0.0).neg().sub_scalar(std::f64::consts::LN_2);
        near.mask_where(negative, far)
    }
}

impl<const D: usize> Uniform<D> {
    /// `ln(d / (upper - lower))` for a distance `d` from one end: `-inf` at or beyond that end,
    /// `0` at or beyond the other.
    fn log_fraction(&self, d: Tensor<D>) -> Tensor<D> {
        let width = self.upper.zip(&self.lower, |u, l| u - l, |u, l| u - l);
        let r = width.divide(d);
        let none = r.clone().lower_equal_elem(0.0);
        r.clamp(f64::from(f32::MIN_POSITIVE), 1.0).log().mask_fill(none, f32::NEG_INFINITY)
    }

    /// `ln P(X <= x) = ln((x - lower) / (upper - lower))` (Stan's `uniform_lcdf`): `-inf` at and
    /// below `lower`, `0` at and above `upper`.
    pub fn lcdf(&self, x: Tensor<D>) -> Tensor<D> {
        self.log_fraction(self.lower.sub_from(x))
    }

    /// `ln P(X > x) = ln((upper - x) / (upper - lower))` (Stan's `uniform_lccdf`): `0` at and
    /// below `lower`, `-inf` at and above `upper`.
    pub fn lccdf(&self, x: Tensor<D>) -> Tensor<D> {
        self.log_fraction(self.upper.sub_from(x).neg())
    }
}

/// `Logistic(mu, sigma)` (Stan's `logistic_lpdf`): with `z = (x - mu) / sigma`,
/// `-z - 2 ln(1 + e^-z) - ln sigma`, as `-z - 2 log1p_exp(-z) - ln sigma`.
#[derive(Clone, Debug)]
pub struct Logistic<const D: usize> {
    mu: Param<D>,
    sigma: Param<D>,
}

impl<const D: usize> Logistic<D> {
    /// `Logistic(mu, sigma)`; a scalar `mu` must be finite, a scalar `sigma` finite and positive.
    pub fn new(mu: impl Into<Param<D>>, sigma: impl Into<Param<D>>) -> Result<Self, ModelError> {
        Ok(Self {
            mu: mu.into().check_finite("Logistic", "mu")?,
            sigma: sigma.into().check_positive("Logistic", "sigma")?,
        })
    }

    fn z(&self, x: Tensor<D>) -> Tensor<D> {
        self.sigma.divide(self.mu.sub_from(x))
    }

    /// `ln P(X <= x) = -log1p_exp(-z)` (Stan's `logistic_lcdf`): exact in both tails.
    pub fn lcdf(&self, x: Tensor<D>) -> Tensor<D> {
        softplus(self.z(x).neg()).neg()
    }

    /// `ln P(X > x) = -log1p_exp(z)` (Stan's `logistic_lccdf`).
    pub fn lccdf(&self, x: Tensor<D>) -> Tensor<D> {
        softplus(self.z(x)).neg()
    }
}

impl<const D: usize> LogProb<D> for Logistic<D> {
    fn log_prob(&self, x: Tensor<D>) -> Tensor<D> {
        let z = self.z(x);
        self.sigma.sub_ln_from(z.clone().neg() - softplus(z.neg()).mul_scalar(2.0))
    }
}

impl<const D: usize> Sample for Logistic<D> {
    fn sample<R: Rng + ?Sized>(&self, rng: &mut R, n: usize) -> Result<Vec<f64>, ModelError> {
        let [mu, sigma] = scalars("Logistic", [&self.mu, &self.sigma])?;
        // The quantile mu + sigma logit(u) of a uniform on (0, 1).
        Ok((0..n)
            .map(|_| {
                let u: f64 = rand::RngExt::random::<f64>(rng).max(f64::MIN_POSITIVE);
                mu + sigma * (u.ln() - (-u).ln_1p())
            })
            .collect())
    }
}

/// `Gumbel(mu, beta)` (Stan's `gumbel_lpdf`): with `z = (x - mu) / beta`,
/// `-ln beta - z - e^-z`.
#[derive(Clone, Debug)]
pub struct Gumbel<const D: usize> {
    mu: Param<D>,
    beta: Param<D>,
}

impl<const D: usize> Gumbel<D> {
    /// `Gumbel(mu, beta)`; a scalar `mu` must be finite, a scalar `beta` finite and positive.
    pub fn new(mu: impl Into<Param<D>>, beta: impl Into<Param<D>>) -> Result<Self, ModelError> {
        Ok(Self { mu: mu.into().check_finite("Gumbel", "mu")?, beta: beta.into().check_positive("Gumbel", "beta")? })
    }

    fn z(&self, x: Tensor<D>) -> Tensor<D> {
        self.beta.divide(self.mu.sub_from(x))
    }

    /// `ln P(X <= x) = -e^-z` (Stan's `gumbel_lcdf`).
    pub fn lcdf(&self, x: Tensor<D>) -> Tensor<D> {
        self.z(x).neg().exp().neg()
    }

    /// `ln P(X > x) = ln(1 - e^(-e^-z))` (Stan's `gumbel_lccdf`), without cancellation far
    /// right (where `e^-z` is small).
    pub fn lccdf(&self, x: Tensor<D>) -> Tensor<D> {
        log1m_exp_neg(self.z(x).neg().exp())
    }
}

impl<const D: usize> LogProb<D> for Gumbel<D> {
    fn log_prob(&self, x: Tensor<D>) -> Tensor<D> {
        let z = self.z(x);
        self.beta.sub_ln_from(z.clone().neg() - z.neg().exp())
    }
}

/// `SkewNormal(xi, omega, alpha)` (Stan's `skew_normal_lpdf`): with `z = (x - xi) / omega`,
/// `-ln(2 pi) / 2 - ln omega - z^2 / 2 + ln erfc(-alpha z / sqrt 2)`; the last term in log form
/// ([`crate::functions`]' erfc fit), so a far tail stays finite.
#[derive(Clone, Debug)]
pub struct SkewNormal<const D: usize> {
    xi: Param<D>,
    omega: Param<D>,
    alpha: Param<D>,
}

impl<const D: usize> SkewNormal<D> {
    /// Location `xi`, scale `omega` (finite and positive when a scalar), shape `alpha`.
    pub fn new(
        xi: impl Into<Param<D>>,
        omega: impl Into<Param<D>>,
        alpha: impl Into<Param<D>>,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            xi: xi.into().check_finite("SkewNormal", "xi")?,
            omega: omega.into().check_positive("SkewNormal", "omega")?,
            alpha: alpha.into().check_finite("SkewNormal", "alpha")?,
        })
    }
}

impl<const D: usize> SkewNormal<D> {
    /// `ln F(z)` at `z = +-(x - xi) / omega` with shape `+-alpha` (the upper tail of `X` is the
    /// lower tail of `-X ~ SkewNormal(-xi, omega, -alpha)`).
    fn log_tail(&self, x: Tensor<D>, upper: bool) -> Tensor<D> {
        let z = self.omega.divide(self.xi.sub_from(x));
        let alpha = self.alpha.tensor_like(&z);
        let (z, alpha) = if upper { (z.neg(), alpha.neg()) } else { (z, alpha) };
        on_columns(z, alpha, skew_normal_log_cdf_columns)
    }

    /// `ln P(X <= x)` (Stan's `skew_normal_lcdf`, `ln(Phi(z) - 2 T(z, alpha))`), accurate in
    /// the lower tail too, where Stan's difference cancels: there the integral of the density
    /// by Gauss-Laguerre in the tail's own scale (`special::skew_normal_log_cdf_columns`).
    pub fn lcdf(&self, x: Tensor<D>) -> Tensor<D> {
        self.log_tail(x, false)
    }

    /// `ln P(X > x)` (Stan's `skew_normal_lccdf`), as [`SkewNormal::lcdf`] of the mirrored
    /// distribution.
    pub fn lccdf(&self, x: Tensor<D>) -> Tensor<D> {
        self.log_tail(x, true)
    }
}

impl<const D: usize> LogProb<D> for SkewNormal<D> {
    fn log_prob(&self, x: Tensor<D>) -> Tensor<D> {
        let z = self.omega.divide(self.xi.sub_from(x));
        let skew = log_erfc_any(self.alpha.multiply(z.clone()).mul_scalar(-std::f64::consts::FRAC_1_SQRT_2));
        self.omega.sub_ln_from(z.square().mul_scalar(-0.5).sub_scalar(0.5 * LN_2PI) + skew)
    }
}

/// `Frechet(alpha, sigma)` with shape `alpha` and scale `sigma` (Stan's `frechet_lpdf`):
/// `ln alpha - ln sigma - (1 + alpha) ln(x / sigma) - (x / sigma)^-alpha` on `x > 0`; `x <= 0`
/// gives `-inf`.
#[derive(Clone, Debug)]
pub struct Frechet<const D: usize> {
    alpha: Param<D>,
    sigma: Param<D>,
}

impl<const D: usize> Frechet<D> {
    /// `Frechet(alpha, sigma)`; each is a scalar (finite and positive) or a tensor.
    pub fn new(alpha: impl Into<Param<D>>, sigma: impl Into<Param<D>>) -> Result<Self, ModelError> {
        Ok(Self {
            alpha: alpha.into().check_positive("Frechet", "alpha")?,
            sigma: sigma.into().check_positive("Frechet", "sigma")?,
        })
    }

    /// `(t, ln(x / sigma))` with `t = -alpha ln(x / sigma)`, so `(x / sigma)^-alpha = e^t`.
    fn exponent(&self, x: Tensor<D>) -> (Tensor<D>, Tensor<D>) {
        let l = self.sigma.sub_ln_from(x.clamp_min(f32::MIN_POSITIVE).log());
        (self.alpha.multiply(l.clone()).neg(), l)
    }

    /// `ln P(X <= x) = -(x / sigma)^-alpha` (Stan's `frechet_lcdf`); `-inf` for `x <= 0`.
    pub fn lcdf(&self, x: Tensor<D>) -> Tensor<D> {
        let outside = x.clone().lower_equal_elem(0.0);
        let lcdf = self.exponent(x).0.exp().neg();
        let shape = lcdf.dims();
        lcdf.mask_fill(outside.expand(shape), f32::NEG_INFINITY)
    }

    /// `ln P(X > x) = ln(1 - e^(-(x / sigma)^-alpha))` (Stan's `frechet_lccdf`); `0` for `x <= 0`.
    pub fn lccdf(&self, x: Tensor<D>) -> Tensor<D> {
        let outside = x.clone().lower_equal_elem(0.0);
        let lccdf = log1m_exp_neg(self.exponent(x).0.exp());
        let shape = lccdf.dims();
        lccdf.mask_fill(outside.expand(shape), 0.0)
    }
}

impl<const D: usize> LogProb<D> for Frechet<D> {
    fn log_prob(&self, x: Tensor<D>) -> Tensor<D> {
        let outside = x.clone().lower_equal_elem(0.0);
        let (t, l) = self.exponent(x);
        // ln alpha - ln sigma - ln(x / sigma) + t - e^t, as -(1 + alpha) l = t - l.
        let lp = self.sigma.sub_ln_from(self.alpha.ln().add_to(t.clone() - l - t.exp()));
        let shape = lp.dims();
        lp.mask_fill(outside.expand(shape), f32::NEG_INFINITY)
    }
}

/// `Pareto(y_min, alpha)` (Stan's `pareto_lpdf`): `ln alpha + alpha ln y_min - (alpha + 1) ln x`
/// on `x >= y_min`; below it `-inf`.
#[derive(Clone, Debug)]
pub struct Pareto<const D: usize> {
    y_min: Param<D>,
    alpha: Param<D>,
}

impl<const D: usize> Pareto<D> {
    /// `Pareto(y_min, alpha)`; each is a scalar (finite and positive) or a tensor.
    pub fn new(y_min: impl Into<Param<D>>, alpha: impl Into<Param<D>>) -> Result<Self, ModelError> {
        Ok(Self {
            y_min: y_min.into().check_positive("Pareto", "y_min")?,
            alpha: alpha.into().check_positive("Pareto", "alpha")?,
        })
    }

    /// `(ln(x / y_min), x < y_min)`, the log on `x` clamped into the support.
    fn log_ratio(&self, x: Tensor<D>) -> (Tensor<D>, Tensor<D, burn::tensor::Bool>) {
        let below = self.y_min.sub_from(x.clone()).lower_elem(0.0);
        let l = self.y_min.sub_ln_from(x.clamp_min(f32::MIN_POSITIVE).log());
        let shape = l.dims();
        (l, below.expand(shape))
    }

    /// `ln P(X <= x) = ln(1 - (y_min / x)^alpha)` (Stan's `pareto_lcdf`), without cancellation
    /// near `y_min`; `-inf` at and below `y_min`.
    pub fn lcdf(&self, x: Tensor<D>) -> Tensor<D> {
        let (l, _) = self.log_ratio(x);
        let none = l.clone().lower_equal_elem(0.0);
        log1m_exp_neg(self.alpha.multiply(l.clamp_min(0.0))).mask_fill(none, f32::NEG_INFINITY)
    }

    /// `ln P(X > x) = alpha ln(y_min / x)` (Stan's `pareto_lccdf`); `0` below `y_min`.
    pub fn lccdf(&self, x: Tensor<D>) -> Tensor<D> {
        let (l, below) = self.log_ratio(x);
        self.alpha.multiply(l.clamp_min(0.0)).neg().mask_fill(below, 0.0)
    }
}

impl<const D: usize> LogProb<D> for Pareto<D> {
    fn log_prob(&self, x: Tensor<D>) -> Tensor<D> {
        let (l, below) = self.log_ratio(x);
        // ln alpha - ln y_min - (alpha + 1) ln(x / y_min), the same as Stan's form.
        let lp = self.y_min.sub_ln_from(self.alpha.ln().add_to(self.alpha.multiply(l.clone()).neg() - l));
        let shape = lp.dims();
        lp.mask_fill(below.expand(shape), f32::NEG_INFINITY)
    }
}

/// `ExpModNormal(mu, sigma, lambda)` (Stan's `exp_mod_normal_lpdf`), a normal plus an
/// exponential of rate `lambda`: `ln lambda - ln 2 + lambda (mu + lambda sigma^2 / 2 - x) +
/// ln erfc((mu + lambda sigma^2 - x) / (sigma sqrt 2))`, the last term in log form.
#[derive(Clone, Debug)]
pub struct ExpModNormal<const D: usize> {
    mu: Param<D>,
    sigma: Param<D>,
    lambda: Param<D>,
}

impl<const D: usize> ExpModNormal<D> {
    /// Location `mu`, scale `sigma` and rate `lambda` (finite and positive when scalars).
    pub fn new(
        mu: impl Into<Param<D>>,
        sigma: impl Into<Param<D>>,
        lambda: impl Into<Param<D>>,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            mu: mu.into().check_finite("ExpModNormal", "mu")?,
            sigma: sigma.into().check_positive("ExpModNormal", "sigma")?,
            lambda: lambda.into().check_positive("ExpModNormal", "lambda")?,
        })
    }
}

impl<const D: usize> LogProb<D> for ExpModNormal<D> {
    fn log_prob(&self, x: Tensor<D>) -> Tensor<D> {
        let r = self.mu.sub_from(x).neg(); // mu - x
        let lambda_sigma_sq = self.lambda.zip(&self.sigma, |l, s| l * s * s, |l, s| l * s.square());
        let v = self.sigma.divide(lambda_sigma_sq.add_to(r.clone())).mul_scalar(std::f64::consts::FRAC_1_SQRT_2);
        let half = lambda_sigma_sq.map(|v| 0.5 * v, |t| t.mul_scalar(0.5));
        let lin = self.lambda.multiply(half.add_to(r));
        self.lambda.ln().add_to(lin + log_erfc_any(v)).sub_scalar(2f64.ln())
    }
}

impl<const D: usize> ExpModNormal<D> {
    /// `(ln Phi(z), ln(1 - Phi(z)), s^2 / 2 - s z + ln Phi(z - s))` with `z = (x - mu) / sigma`
    /// and `s = lambda sigma`: the two parts of the cdf
    /// `F(x) = Phi(z) - e^(s^2/2 - s z) Phi(z - s)` (Stan math's `exp_mod_normal_cdf`), in logs.
    fn cdf_parts(&self, x: Tensor<D>) -> (Tensor<D>, Tensor<D>, Tensor<D>) {
        let z = self.sigma.divide(self.mu.sub_from(x));
        let s = self.lambda.zip(&self.sigma, |l, s| l * s, |l, s| l * s);
        let (ln_phi, ln_phi_c) = log_normal_cdfs(z.clone());
        let shifted = log_normal_cdfs(s.map(|v| -v, Tensor::neg).add_to(z.clone())).0;
        let half_s2 = s.map(|v| 0.5 * v * v, |t| t.square().mul_scalar(0.5));
        let exponent = half_s2.add_to(s.multiply(z).neg()) + shifted;
        (ln_phi, ln_phi_c, exponent)
    }

    /// `ln P(X <= x) = ln Phi(z) + ln(1 - e^(E - ln Phi(z)))`, `E = s^2/2 - s z + ln Phi(z - s)`
    /// (Stan's `exp_mod_normal_lcdf`), both normal cdfs in log form, so neither tail
    /// underflows. Accurate to the normal-cdf fit's `1.2e-7` relative over the gap
    /// `ln Phi(z) - E` (about `ln(1 + s / |z|)` far left).
    pub fn lcdf(&self, x: Tensor<D>) -> Tensor<D> {
        let (ln_phi, _, exponent) = self.cdf_parts(x);
        let gap = (ln_phi.clone() - exponent).clamp_min(f32::MIN_POSITIVE);
        ln_phi + log1m_exp_neg(gap)
    }

    /// `ln P(X > x) = ln(Phi(-z) + e^E)` (Stan's `exp_mod_normal_lccdf`): a sum of two positive
    /// terms in log form, exact in both tails.
    pub fn lccdf(&self, x: Tensor<D>) -> Tensor<D> {
        let (_, ln_phi_c, exponent) = self.cdf_parts(x);
        let max = ln_phi_c.clone().max_pair(exponent.clone());
        max.clone() + (ln_phi_c - max.clone()).exp().add((exponent - max).exp()).log()
    }
}

/// `VonMises(mu, kappa)` (Stan's `von_mises_lpdf`): `kappa cos(x - mu) - ln(2 pi) - ln I_0(kappa)`
/// for any real `x` (the density of an angle, periodic in `x`). `ln I_0` is a host `f64` series
/// for a scalar `kappa` and Abramowitz & Stegun's fits (relative error below 2e-7) for a tensor.
#[derive(Clone, Debug)]
pub struct VonMises<const D: usize> {
    mu: Param<D>,
    kappa: Param<D>,
    /// `-ln(2 pi) - ln I_0(kappa)`.
    log_norm: Param<D>,
}

impl<const D: usize> VonMises<D> {
    /// `VonMises(mu, kappa)`; a scalar `mu` must be finite, a scalar `kappa` finite and `>= 0`
    /// (0 is the uniform on the circle).
    pub fn new(mu: impl Into<Param<D>>, kappa: impl Into<Param<D>>) -> Result<Self, ModelError> {
        let kappa = kappa.into();
        if let Param::Scalar(k) = kappa
            && !(k >= 0.0 && k.is_finite())
        {
            return Err(bad("VonMises", "kappa", format!("must be finite and >= 0, got {k}")));
        }
        let log_norm = kappa
            .map(|k| -(2.0 * PI).ln() - log_bessel_i0_host(k), |t| log_bessel_i0(t).neg().sub_scalar((2.0 * PI).ln()));
        Ok(Self { mu: mu.into().check_finite("VonMises", "mu")?, kappa, log_norm })
    }
}

impl<const D: usize> LogProb<D> for VonMises<D> {
    fn log_prob(&self, x: Tensor<D>) -> Tensor<D> {
        self.log_norm.add_to(self.kappa.multiply(self.mu.sub_from(x).cos()))
    }
}

/// `Rayleigh(sigma)` (Stan's `rayleigh_lpdf`): `ln x - 2 ln sigma - x^2 / (2 sigma^2)` on
/// `x > 0`; `x <= 0` gives `-inf`.
#[derive(Clone, Debug)]
pub struct Rayleigh<const D: usize> {
    sigma: Param<D>,
}

impl<const D: usize> Rayleigh<D> {
    /// `Rayleigh(sigma)`; a scalar `sigma` must be finite and positive.
    pub fn new(sigma: impl Into<Param<D>>) -> Result<Self, ModelError> {
        Ok(Self { sigma: sigma.into().check_positive("Rayleigh", "sigma")? })
    }

    /// `x^2 / (2 sigma^2)` on `x` clamped to the support.
    fn half_square(&self, x: Tensor<D>) -> Tensor<D> {
        self.sigma.divide(x.clamp_min(0.0)).square().mul_scalar(0.5)
    }

    /// `ln P(X <= x) = ln(1 - e^(-x^2 / (2 sigma^2)))` (Stan's `rayleigh_lcdf`), without
    /// cancellation near 0; `-inf` for `x <= 0`.
    pub fn lcdf(&self, x: Tensor<D>) -> Tensor<D> {
        let outside = x.clone().lower_equal_elem(0.0);
        let lcdf = log1m_exp_neg(self.half_square(x));
        let shape = lcdf.dims();
        lcdf.mask_fill(outside.expand(shape), f32::NEG_INFINITY)
    }

    /// `ln P(X > x) = -x^2 / (2 sigma^2)` (Stan's `rayleigh_lccdf`); `0` for `x <= 0`.
    pub fn lccdf(&self, x: Tensor<D>) -> Tensor<D> {
        self.half_square(x).neg()
    }
}

impl<const D: usize> LogProb<D> for Rayleigh<D> {
    fn log_prob(&self, x: Tensor<D>) -> Tensor<D> {
        // The density is 0 at 0 (the ln x term).
        let outside = x.clone().lower_equal_elem(0.0);
        let lx = x.clone().clamp_min(f32::MIN_POSITIVE).log();
        let lp = self.sigma.add_scaled_ln_to(lx - self.half_square(x), -2.0);
        let shape = lp.dims();
        lp.mask_fill(outside.expand(shape), f32::NEG_INFINITY)
    }
}

/// `LogLogistic(alpha, beta)` with scale `alpha` and shape `beta` (Stan's `loglogistic_lpdf`):
/// with `t = beta ln(x / alpha)`, `ln beta - ln alpha + (beta - 1) ln(x / alpha) -
/// 2 log1p_exp(t)` on `x > 0`; the cdf is `inv_logit(t)`. `x <= 0` gives `-inf`.
#[derive(Clone, Debug)]
pub struct LogLogistic<const D: usize> {
    alpha: Param<D>,
    beta: Param<D>,
}

impl<const D: usize> LogLogistic<D> {
    /// `LogLogistic(alpha, beta)`; each is a scalar (finite and positive) or a tensor.
    pub fn new(alpha: impl Into<Param<D>>, beta: impl Into<Param<D>>) -> Result<Self, ModelError> {
        Ok(Self {
            alpha: alpha.into().check_positive("LogLogistic", "alpha")?,
            beta: beta.into().check_positive("LogLogistic", "beta")?,
        })
    }

    /// `(ln(x / alpha), beta ln(x / alpha))` on `x` clamped into the support.
    fn t(&self, x: Tensor<D>) -> (Tensor<D>, Tensor<D>) {
        let l = self.alpha.sub_ln_from(x.clamp_min(f32::MIN_POSITIVE).log());
        (l.clone(), self.beta.multiply(l))
    }

    /// `ln P(X <= x) = -log1p_exp(-t)` (Stan's `loglogistic_cdf`, in log form); `-inf` for `x <= 0`.
    pub fn lcdf(&self, x: Tensor<D>) -> Tensor<D> {
        let outside = x.clone().lower_equal_elem(0.0);
        let lcdf = softplus(self.t(x).1.neg()).neg();
        let shape = lcdf.dims();
        lcdf.mask_fill(outside.expand(shape), f32::NEG_INFINITY)
    }

    /// `ln P(X > x) = -log1p_exp(t)`; `0` for `x <= 0`.
    pub fn lccdf(&self, x: Tensor<D>) -> Tensor<D> {
        let outside = x.clone().lower_equal_elem(0.0);
        let lccdf = softplus(self.t(x).1).neg();
        let shape = lccdf.dims();
        lccdf.mask_fill(outside.expand(shape), 0.0)
    }
}

impl<const D: usize> LogProb<D> for LogLogistic<D> {
    fn log_prob(&self, x: Tensor<D>) -> Tensor<D> {
        let outside = x.clone().lower_equal_elem(0.0);
        let (l, t) = self.t(x);
        // ln beta - ln alpha + t - l - 2 log1p_exp(t)
        let lp = self.alpha.sub_ln_from(self.beta.ln().add_to(t.clone() - l - softplus(t).mul_scalar(2.0)));
        let shape = lp.dims();
        lp.mask_fill(outside.expand(shape), f32::NEG_INFINITY)
    }
}

/// `ParetoType2(mu, lambda, alpha)` (Stan's `pareto_type_2_lpdf`, the Lomax shifted by `mu`):
/// `ln alpha - ln lambda - (alpha + 1) log1p((x - mu) / lambda)` on `x >= mu`; below `-inf`.
#[derive(Clone, Debug)]
pub struct ParetoType2<const D: usize> {
    mu: Param<D>,
    lambda: Param<D>,
    alpha: Param<D>,
}

impl<const D: usize> ParetoType2<D> {
    /// Location `mu` (finite), scale `lambda` and shape `alpha` (finite and positive when scalars).
    pub fn new(
        mu: impl Into<Param<D>>,
        lambda: impl Into<Param<D>>,
        alpha: impl Into<Param<D>>,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            mu: mu.into().check_finite("ParetoType2", "mu")?,
            lambda: lambda.into().check_positive("ParetoType2", "lambda")?,
            alpha: alpha.into().check_positive("ParetoType2", "alpha")?,
        })
    }

    /// `(log1p((x - mu) / lambda), x < mu)`, the log on `x` clamped into the support.
    fn log_ratio(&self, x: Tensor<D>) -> (Tensor<D>, Tensor<D, burn::tensor::Bool>) {
        let u = self.lambda.divide(self.mu.sub_from(x));
        let below = u.clone().lower_elem(0.0);
        (u.clamp_min(0.0).log1p(), below)
    }

    /// `ln P(X <= x) = ln(1 - (1 + (x - mu) / lambda)^-alpha)` (Stan's `pareto_type_2_lcdf`),
    /// without cancellation near `mu`; `-inf` at and below `mu`.
    pub fn lcdf(&self, x: Tensor<D>) -> Tensor<D> {
        let (l, _) = self.log_ratio(x);
        let none = l.clone().lower_equal_elem(0.0);
        log1m_exp_neg(self.alpha.multiply(l)).mask_fill(none, f32::NEG_INFINITY)
    }

    /// `ln P(X > x) = -alpha log1p((x - mu) / lambda)` (Stan's `pareto_type_2_lccdf`); `0`
    /// below `mu`.
    pub fn lccdf(&self, x: Tensor<D>) -> Tensor<D> {
        self.alpha.multiply(self.log_ratio(x).0).neg()
    }
}

impl<const D: usize> LogProb<D> for ParetoType2<D> {
    fn log_prob(&self, x: Tensor<D>) -> Tensor<D> {
        let (l, below) = self.log_ratio(x);
        let scaled = self.alpha.multiply(l.clone()) + l; // (alpha + 1) log1p(..)
        let lp = self.lambda.sub_ln_from(self.alpha.ln().add_to(scaled.neg()));
        let shape = lp.dims();
        lp.mask_fill(below.expand(shape), f32::NEG_INFINITY)
    }
}

/// `SkewDoubleExponential(mu, sigma, tau)` (Stan's `skew_double_exponential_lpdf`, an asymmetric
/// Laplace with skewness `tau` in `(0, 1)`): `ln 2 + ln tau + ln(1 - tau) - ln sigma -
/// 2 / sigma ((1 - tau)(mu - x) if x < mu, tau (x - mu) otherwise)`.
#[derive(Clone, Debug)]
pub struct SkewDoubleExponential<const D: usize> {
    mu: Param<D>,
    sigma: Param<D>,
    tau: Param<D>,
}

impl<const D: usize> SkewDoubleExponential<D> {
    /// Location `mu` (finite), scale `sigma` (finite and positive) and skewness `tau` (in
    /// `(0, 1)`) when scalars; otherwise an error naming the parameter.
    pub fn new(
        mu: impl Into<Param<D>>,
        sigma: impl Into<Param<D>>,
        tau: impl Into<Param<D>>,
    ) -> Result<Self, ModelError> {
        let tau = tau.into();
        if let Param::Scalar(t) = tau
            && !(t > 0.0 && t < 1.0)
        {
            return Err(bad("SkewDoubleExponential", "tau", format!("must be in (0, 1), got {t}")));
        }
        Ok(Self {
            mu: mu.into().check_finite("SkewDoubleExponential", "mu")?,
            sigma: sigma.into().check_positive("SkewDoubleExponential", "sigma")?,
            tau,
        })
    }

    /// `(2 tau r, 2 (1 - tau) (-r), r < 0)` for `r = (x - mu) / sigma`, each side clamped to
    /// its own half line.
    fn sides(&self, x: Tensor<D>) -> (Tensor<D>, Tensor<D>, Tensor<D, burn::tensor::Bool>) {
        let r = self.sigma.divide(self.mu.sub_from(x));
        let below = r.clone().lower_elem(0.0);
        let upper = self.tau.multiply(r.clone().clamp_min(0.0)).mul_scalar(2.0);
        let one_minus = self.tau.map(|t| 1.0 - t, |t| t.neg().add_scalar(1.0));
        let lower = one_minus.multiply(r.clamp_max(0.0).neg()).mul_scalar(2.0);
        (upper, lower, below)
    }

    fn ln_tau(&self) -> (Param<D>, Param<D>) {
        (self.tau.ln(), self.tau.map(|t| (-t).ln_1p(), |t| t.neg().log1p()))
    }

    /// `ln P(X <= x)` (Stan's `skew_double_exponential_lcdf`): `ln tau - 2 (1 - tau)(mu - x) /
    /// sigma` below `mu`, `ln(1 - (1 - tau) e^(-2 tau (x - mu) / sigma))` above.
    pub fn lcdf(&self, x: Tensor<D>) -> Tensor<D> {
        let (upper, lower, below) = self.sides(x);
        let (ln_tau, ln_1m_tau) = self.ln_tau();
        let near = ln_tau.add_to(lower.neg());
        // ln(1 - e^(ln(1 - tau) - s)) = log1m_exp_neg(s - ln(1 - tau)), the argument > 0.
        let far = log1m_exp_neg(ln_1m_tau.map(|v| -v, Tensor::neg).add_to(upper));
        far.mask_where(below, near)
    }

    /// `ln P(X > x)` (Stan's `skew_double_exponential_lccdf`): `ln(1 - tau) - 2 tau (x - mu) /
    /// sigma` above `mu`, `ln(1 - tau e^(-2 (1 - tau)(mu - x) / sigma))` below.
    pub fn lccdf(&self, x: Tensor<D>) -> Tensor<D> {
        let (upper, lower, below) = self.sides(x);
        let (ln_tau, ln_1m_tau) = self.ln_tau();
        let far = ln_1m_tau.add_to(upper.neg());
        let near = log1m_exp_neg(ln_tau.map(|v| -v, Tensor::neg).add_to(lower));
        far.mask_where(below, near)
    }
}

impl<const D: usize> LogProb<D> for SkewDoubleExponential<D> {
    fn log_prob(&self, x: Tensor<D>) -> Tensor<D> {
        let (upper, lower, _) = self.sides(x);
        let (ln_tau, ln_1m_tau) = self.ln_tau();
        // Only one side is non-zero for each x.
        let body = (upper + lower).neg().add_scalar(std::f64::consts::LN_2);
        self.sigma.sub_ln_from(ln_1m_tau.add_to(ln_tau.add_to(body)))
    }
}
