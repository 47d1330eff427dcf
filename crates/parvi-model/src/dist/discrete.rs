//! Discrete likelihoods: counts and labels are data, checked once at construction.

use burn::tensor::{Int, Tensor, TensorData, activation};

use super::special::{ln_gamma, ln_gamma_ratio_tensor, ln_gamma_tensor, softplus};
use super::{LogProb, Param, bad, lift};
use crate::ModelError;

/// Host values of a data tensor, each checked to be a finite whole number `>= 0`.
fn counts_on_host<const D: usize>(
    dist: &'static str,
    name: &'static str,
    counts: &Tensor<D>,
) -> Result<Vec<f64>, ModelError> {
    let values = crate::tensor_ops::to_vec_f64(counts);
    if let Some(v) = values.iter().find(|v| !(v.is_finite() && **v >= 0.0 && v.fract() == 0.0)) {
        return Err(bad(dist, name, format!("must be whole numbers >= 0, got {v}")));
    }
    Ok(values)
}

/// A host `f64` vector as a tensor shaped and placed like `like`.
fn host_tensor<const D: usize>(values: Vec<f64>, like: &Tensor<D>) -> Tensor<D> {
    Tensor::from_data(TensorData::new(values, like.shape()), (&like.device(), like.dtype()))
}

/// Stan's `binomial_logit`: `counts ~ Binomial(trials, inv_logit(alpha))` with the log-odds
/// `alpha` as the parameter: `ln C(N, n) + n ln inv_logit(alpha) + (N - n) ln(1 - inv_logit(alpha))`.
///
/// Counts and trials are data, checked once at construction; `ln C(N, n)` is computed then,
/// in `f64` on the host.
#[derive(Clone, Debug)]
pub struct BinomialLogit<const D: usize> {
    counts: Tensor<D>,
    failures: Tensor<D>,
    log_choose: Tensor<D>,
}

impl<const D: usize> BinomialLogit<D> {
    /// Counts `n` and trials `N` (a scalar for all, or a tensor shaped like the counts), whole
    /// numbers with `0 <= n <= N`: otherwise an error naming `counts` or `trials`.
    pub fn new(counts: Tensor<D>, trials: impl Into<Param<D>>) -> Result<Self, ModelError> {
        let n = counts_on_host("BinomialLogit", "counts", &counts)?;
        let trials = match trials.into() {
            Param::Scalar(v) => vec![v; n.len()],
            Param::Tensor(t) => {
                if t.dims() != counts.dims() {
                    return Err(bad(
                        "BinomialLogit",
                        "trials",
                        format!("shape {:?} differs from the counts' {:?}", t.dims(), counts.dims()),
                    ));
                }
                crate::tensor_ops::to_vec_f64(&t)
            }
        };
        let big_n = trials;
        if let Some(v) = big_n.iter().find(|v| !(v.is_finite() && **v >= 0.0 && v.fract() == 0.0)) {
            return Err(bad("BinomialLogit", "trials", format!("must be whole numbers >= 0, got {v}")));
        }
        if let Some((k, t)) = n.iter().zip(&big_n).find(|(k, t)| k > t) {
            return Err(bad("BinomialLogit", "counts", format!("count {k} exceeds its trials {t}")));
        }
        let log_choose = n
            .iter()
            .zip(&big_n)
            .map(|(&k, &t)| ln_gamma(t + 1.0) - ln_gamma(k + 1.0) - ln_gamma(t - k + 1.0))
            .collect();
        let failures = n.iter().zip(&big_n).map(|(k, t)| t - k).collect();
        Ok(Self { log_choose: host_tensor(log_choose, &counts), failures: host_tensor(failures, &counts), counts })
    }

    /// `log p(counts | alpha)` elementwise, `alpha` (log-odds) broadcast against the counts.
    /// `ln inv_logit(a) = -softplus(-a)` and `ln(1 - inv_logit(a)) = -softplus(a)`: no
    /// cancellation between `n a` and `N softplus(a)` for large `|a|`.
    pub fn log_prob(&self, alpha: Tensor<D>) -> Tensor<D> {
        self.log_choose.clone()
            - self.counts.clone() * softplus(alpha.clone().neg())
            - self.failures.clone() * softplus(alpha)
    }
}

/// Stan's `neg_binomial_2_log`: counts with log-mean `eta` and overdispersion `phi`
/// (variance `mu + mu^2 / phi`, `mu = e^eta`):
/// `ln C(n + phi - 1, n) + n (eta - ln(e^eta + phi)) + phi (ln phi - ln(e^eta + phi))`.
///
/// Counts are data, checked once at construction (`ln n!` computed then, in `f64`).
#[derive(Clone, Debug)]
pub struct NegBinomial2Log<const D: usize> {
    counts: Tensor<D>,
    ln_factorial: Tensor<D>,
}

impl<const D: usize> NegBinomial2Log<D> {
    /// Counts: whole numbers `>= 0`, otherwise an error naming `counts`.
    pub fn new(counts: Tensor<D>) -> Result<Self, ModelError> {
        let n = counts_on_host("NegBinomial2Log", "counts", &counts)?;
        let ln_factorial = n.iter().map(|&k| ln_gamma(k + 1.0)).collect();
        Ok(Self { ln_factorial: host_tensor(ln_factorial, &counts), counts })
    }

    /// `log p(counts | eta, phi)` elementwise, broadcast; a scalar `phi` must be finite and
    /// positive. With `d = eta - ln phi`: `ln Gamma(n + phi) - ln Gamma(phi) - ln n! -
    /// n softplus(-d) - phi softplus(d)`, the log-gamma difference from
    /// [`ln_gamma_ratio_tensor`] (accurate where `phi` is large, the near-Poisson case).
    pub fn log_prob(&self, eta: Tensor<D>, phi: impl Into<Param<D>>) -> Result<Tensor<D>, ModelError> {
        let phi = phi.into().check_positive("NegBinomial2Log", "phi")?;
        let d = phi.sub_ln_from(eta);
        let phi_t = match &phi {
            Param::Scalar(v) => lift(*v, &d),
            Param::Tensor(t) => (**t).clone(),
        };
        let ratio = ln_gamma_ratio_tensor(phi_t, self.counts.clone());
        let lp = ratio
            - self.ln_factorial.clone()
            - self.counts.clone() * softplus(d.clone().neg())
            - phi.multiply(softplus(d));
        Ok(lp)
    }
}

/// `Bernoulli` parameterised by logits; `log_prob` takes labels in `{0, 1}` as floats.
#[derive(Clone, Debug)]
pub struct Bernoulli<const D: usize> {
    logits: Tensor<D>,
}

impl<const D: usize> Bernoulli<D> {
    /// A Bernoulli whose success log-odds are `logits`.
    pub fn from_logits(logits: Tensor<D>) -> Self {
        Self { logits }
    }
}

impl<const D: usize> LogProb<D> for Bernoulli<D> {
    /// `y * l - softplus(l)`, stable for large `|l|`.
    fn log_prob(&self, y: Tensor<D>) -> Tensor<D> {
        y * self.logits.clone() - activation::softplus(self.logits.clone(), 1.0)
    }
}

/// `Categorical` over the last axis of `logits`.
#[derive(Clone, Debug)]
pub struct Categorical<const D: usize> {
    log_probs: Tensor<D>,
}

impl<const D: usize> Categorical<D> {
    /// A categorical whose unnormalised log-probabilities lie along the last axis of `logits`.
    pub fn from_logits(logits: Tensor<D>) -> Self {
        Self { log_probs: activation::log_softmax(logits, D - 1) }
    }

    /// Log-probabilities of `labels`, an integer tensor shaped like the logits with a last axis
    /// of size 1; the result has that shape too.
    pub fn log_prob(&self, labels: Tensor<D, Int>) -> Tensor<D> {
        self.log_probs.clone().gather(D - 1, labels)
    }
}

/// `Poisson(exp(log_rate))` on counts given as floats (Stan's `poisson_log`): `log p(k) =
/// k eta - exp(eta) - ln k!`, with `eta` the log rate. The log rate is the natural output of a
/// linear or latent Gaussian predictor, and this form never takes the log of a rate.
#[derive(Clone, Debug)]
pub struct Poisson<const D: usize> {
    log_rate: Tensor<D>,
}

impl<const D: usize> Poisson<D> {
    /// A Poisson whose rate is `exp(log_rate)`.
    pub fn from_log_rate(log_rate: Tensor<D>) -> Self {
        Self { log_rate }
    }
}

impl<const D: usize> LogProb<D> for Poisson<D> {
    /// Counts `k >= 0` (whole numbers as floats), broadcast against the log rate; `ln k!` comes
    /// from [`ln_gamma_tensor`].
    fn log_prob(&self, k: Tensor<D>) -> Tensor<D> {
        let ln_factorial = ln_gamma_tensor(k.clone().add_scalar(1.0));
        k * self.log_rate.clone() - self.log_rate.clone().exp() - ln_factorial
    }
}
