//! Discrete likelihoods: counts and labels are data, checked once at construction.

use burn::tensor::{Int, Tensor, TensorData, activation};

use super::special::{
    digamma_host, host_elementwise, ln_gamma, ln_gamma_ratio_tensor, ln_gamma_tail, ln_gamma_tensor, ln_inc_beta_tail,
    log_normal_cdfs, log1m_exp_neg, softplus,
};
use super::{LogProb, Param, bad, bad_at, lift};
use crate::ModelError;
use crate::tensor_ops::log_softmax;

/// Host values of a data tensor, each checked to be a finite whole number `>= 0`.
fn counts_on_host<const D: usize>(
    dist: &'static str,
    name: &'static str,
    counts: &Tensor<D>,
) -> Result<Vec<f64>, ModelError> {
    let values = crate::tensor_ops::to_vec_f64(counts);
    if let Some((at, v)) = values.iter().enumerate().find(|(_, v)| !(v.is_finite() && **v >= 0.0 && v.fract() == 0.0)) {
        return Err(bad_at(dist, name, at, format!("must be whole numbers >= 0, got {v}")));
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
        check_trials("BinomialLogit", &n, &big_n)?;
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
    /// from [`ln_gamma_tensor`] at every call: where the counts are data, [`PoissonLog`]
    /// computes it once (some thirty elementwise operations fewer a call).
    fn log_prob(&self, k: Tensor<D>) -> Tensor<D> {
        let ln_factorial = ln_gamma_tensor(k.clone().add_scalar(1.0));
        crate::fused::poisson_log_terms(k, self.log_rate.clone(), ln_factorial)
    }
}

/// The shared data of the binomial family: counts `n`, failures `N - n`, and `ln C(N, n)`,
/// each checked (`0 <= n <= N`, whole numbers) once, on the host.
fn binomial_data<const D: usize>(
    dist: &'static str,
    counts: &Tensor<D>,
    trials: Param<D>,
) -> Result<(Vec<f64>, Vec<f64>), ModelError> {
    let n = counts_on_host(dist, "counts", counts)?;
    let big_n = match trials {
        Param::Scalar(v) => vec![v; n.len()],
        Param::Tensor(t) => {
            if t.dims() != counts.dims() {
                return Err(bad(
                    dist,
                    "trials",
                    format!("shape {:?} differs from the counts' {:?}", t.dims(), counts.dims()),
                ));
            }
            crate::tensor_ops::to_vec_f64(&t)
        }
    };
    check_trials(dist, &n, &big_n)?;
    Ok((n, big_n))
}

/// Trials `N` whole numbers `>= 0`, each at least its count `n`: otherwise an error naming the
/// element of `trials` or `counts`.
fn check_trials(dist: &'static str, n: &[f64], big_n: &[f64]) -> Result<(), ModelError> {
    if let Some((at, v)) = big_n.iter().enumerate().find(|(_, v)| !(v.is_finite() && **v >= 0.0 && v.fract() == 0.0)) {
        return Err(bad_at(dist, "trials", at, format!("must be whole numbers >= 0, got {v}")));
    }
    if let Some((at, (k, t))) = n.iter().zip(big_n).enumerate().find(|(_, (k, t))| k > t) {
        return Err(bad_at(dist, "counts", at, format!("count {k} exceeds its trials {t}")));
    }
    Ok(())
}

fn log_choose_host(n: &[f64], big_n: &[f64]) -> Vec<f64> {
    n.iter().zip(big_n).map(|(&k, &t)| ln_gamma(t + 1.0) - ln_gamma(k + 1.0) - ln_gamma(t - k + 1.0)).collect()
}

/// Stan's `binomial`: `counts ~ Binomial(trials, theta)` on the probability scale:
/// `ln C(N, n) + n ln theta + (N - n) ln(1 - theta)`, each term only where its count is
/// positive (so `theta = 0` with `n = 0` is `0`, not NaN). `theta` outside `[0, 1]`, or at an
/// end its counts cannot reach, gives `-inf`. On the log-odds scale use [`BinomialLogit`].
#[derive(Clone, Debug)]
pub struct Binomial<const D: usize> {
    counts: Tensor<D>,
    failures: Tensor<D>,
    log_choose: Tensor<D>,
}

impl<const D: usize> Binomial<D> {
    /// Counts `n` and trials `N` (a scalar, or a tensor shaped like the counts), whole numbers
    /// with `0 <= n <= N`: otherwise an error naming `counts` or `trials`.
    pub fn new(counts: Tensor<D>, trials: impl Into<Param<D>>) -> Result<Self, ModelError> {
        let (n, big_n) = binomial_data("Binomial", &counts, trials.into())?;
        let failures = n.iter().zip(&big_n).map(|(k, t)| t - k).collect();
        Ok(Self {
            log_choose: host_tensor(log_choose_host(&n, &big_n), &counts),
            failures: host_tensor(failures, &counts),
            counts,
        })
    }

    /// `log p(counts | theta)` elementwise, `theta` broadcast against the counts.
    pub fn log_prob(&self, theta: Tensor<D>) -> Tensor<D> {
        let outside = theta.clone().lower_elem(0.0).bool_or(theta.clone().greater_elem(1.0));
        let tc = theta.clamp(0.0, 1.0);
        // n ln theta with ln 0 = -inf only where n > 0: the clamped log is finite, and the
        // impossible ends are masked afterwards.
        let success = self.counts.clone() * tc.clone().clamp_min(f32::MIN_POSITIVE).log();
        let failure = self.failures.clone() * tc.clone().neg().log1p().clamp_min(f64::from(f32::MIN));
        let lp = self.log_choose.clone() + success + failure;
        let shape = lp.dims();
        let zero_but_counts =
            tc.clone().equal_elem(0.0).expand(shape).bool_and(self.counts.clone().greater_elem(0.0).expand(shape));
        let one_but_failures =
            tc.equal_elem(1.0).expand(shape).bool_and(self.failures.clone().greater_elem(0.0).expand(shape));
        lp.mask_fill(outside.expand(shape).bool_or(zero_but_counts).bool_or(one_but_failures), f32::NEG_INFINITY)
    }
    /// Stan's `binomial_lcdf(n | N, theta)`: `ln P(Y <= n) = ln(1 - I_theta(n + 1, N - n))`, the
    /// regularised incomplete beta function's complement computed directly (accurate near
    /// `theta = 1` as near 0), differentiable in `theta`; `0` where `n = N`. `theta` outside
    /// `[0, 1]` gives `-inf`.
    pub fn lcdf(&self, theta: Tensor<D>) -> Tensor<D> {
        self.cdf(theta, false)
    }

    /// Stan's `binomial_lccdf(n | N, theta)`: `ln P(Y > n) = ln I_theta(n + 1, N - n)`; `-inf`
    /// where `n = N`.
    pub fn lccdf(&self, theta: Tensor<D>) -> Tensor<D> {
        self.cdf(theta, true)
    }

    fn cdf(&self, theta: Tensor<D>, upper_tail: bool) -> Tensor<D> {
        let outside = theta.clone().lower_elem(0.0).bool_or(theta.clone().greater_elem(1.0));
        // n = N has no second shape (N - n = 0): a placeholder 1, replaced below.
        let all = self.failures.clone().equal_elem(0.0);
        let (a, b) = (self.counts.clone().add_scalar(1.0), self.failures.clone().clamp_min(1.0));
        let out = ln_inc_beta_tail(a, b, theta.clamp(0.0, 1.0), upper_tail);
        let shape = out.dims();
        let out = out.mask_fill(all.expand(shape), if upper_tail { f32::NEG_INFINITY } else { 0.0 });
        out.mask_fill(outside.expand(shape), f32::NEG_INFINITY)
    }
}

/// Stan's `beta_binomial`: `counts ~ BetaBinomial(trials, alpha, beta)`:
/// `ln C(N, n) + lbeta(n + alpha, N - n + beta) - lbeta(alpha, beta)`, the two beta functions'
/// difference as three log-gamma ratios ([`ln_gamma_ratio_tensor`]), none cancelling where
/// `alpha` or `beta` is large.
#[derive(Clone, Debug)]
pub struct BetaBinomial<const D: usize> {
    counts: Tensor<D>,
    failures: Tensor<D>,
    trials: Tensor<D>,
    log_choose: Tensor<D>,
}

impl<const D: usize> BetaBinomial<D> {
    /// Counts and trials as for [`Binomial::new`].
    pub fn new(counts: Tensor<D>, trials: impl Into<Param<D>>) -> Result<Self, ModelError> {
        let (n, big_n) = binomial_data("BetaBinomial", &counts, trials.into())?;
        let failures = n.iter().zip(&big_n).map(|(k, t)| t - k).collect();
        Ok(Self {
            log_choose: host_tensor(log_choose_host(&n, &big_n), &counts),
            failures: host_tensor(failures, &counts),
            trials: host_tensor(big_n, &counts),
            counts,
        })
    }

    /// `log p(counts | alpha, beta)` elementwise, broadcast; scalars must be finite and positive.
    pub fn log_prob(&self, alpha: impl Into<Param<D>>, beta: impl Into<Param<D>>) -> Result<Tensor<D>, ModelError> {
        let alpha = alpha.into().check_positive("BetaBinomial", "alpha")?.tensor_like(&self.counts);
        let beta = beta.into().check_positive("BetaBinomial", "beta")?.tensor_like(&self.counts);
        let sum = alpha.clone() + beta.clone();
        Ok(self.log_choose.clone()
            + ln_gamma_ratio_tensor(alpha, self.counts.clone())
            + ln_gamma_ratio_tensor(beta, self.failures.clone())
            - ln_gamma_ratio_tensor(sum, self.trials.clone()))
    }
}

impl<const D: usize> NegBinomial2Log<D> {
    /// Stan's `neg_binomial_2_lcdf(n | e^eta, phi)` on the log-mean scale: `ln P(Y <= n) =
    /// ln I_p(phi, n + 1)` with `p = phi / (e^eta + phi) = inv_logit(ln phi - eta)`, the
    /// regularised incomplete beta function in log form, differentiable in `eta` and `phi`.
    ///
    /// # Errors
    /// If a scalar `phi` is not finite and positive.
    pub fn lcdf(&self, eta: Tensor<D>, phi: impl Into<Param<D>>) -> Result<Tensor<D>, ModelError> {
        self.cdf(eta, phi.into(), true)
    }

    /// Stan's `neg_binomial_2_lccdf` on the log-mean scale: `ln P(Y > n) = ln(1 - I_p(phi, n + 1))`,
    /// computed directly (a far upper tail stays finite).
    ///
    /// # Errors
    /// As [`NegBinomial2Log::lcdf`].
    pub fn lccdf(&self, eta: Tensor<D>, phi: impl Into<Param<D>>) -> Result<Tensor<D>, ModelError> {
        self.cdf(eta, phi.into(), false)
    }

    fn cdf(&self, eta: Tensor<D>, phi: Param<D>, lower: bool) -> Result<Tensor<D>, ModelError> {
        let phi = phi.check_positive("NegBinomial2Log", "phi")?;
        // p = inv_logit(ln phi - eta) = exp(-log1p_exp(eta - ln phi)).
        let p = softplus(phi.sub_ln_from(eta)).neg().exp();
        let a = phi.tensor_like(&p);
        Ok(ln_inc_beta_tail(a, self.counts.clone().add_scalar(1.0), p, lower))
    }
}

impl<const D: usize> BetaBinomial<D> {
    /// Stan's `beta_binomial_lcdf(n | N, alpha, beta)`: `ln P(Y <= n)`, the mass function
    /// summed on the host in `f64` (by its term ratio `(N - j)(j + alpha) / ((j + 1)(N - j - 1 +
    /// beta))`, in log form), each tail summed directly so that a far tail keeps its precision;
    /// differentiable in `alpha` and `beta` (their derivatives summed alongside; digamma
    /// differences by the same recurrence). `O(N)` per count: Stan math's form needs the
    /// generalised hypergeometric function `3F2`.
    ///
    /// # Errors
    /// If a scalar `alpha` or `beta` is not finite and positive.
    pub fn lcdf(&self, alpha: impl Into<Param<D>>, beta: impl Into<Param<D>>) -> Result<Tensor<D>, ModelError> {
        self.cdf(alpha.into(), beta.into(), true)
    }

    /// Stan's `beta_binomial_lccdf(n | N, alpha, beta)`: `ln P(Y > n)` (see
    /// [`BetaBinomial::lcdf`]); `-inf` where `n = N`.
    ///
    /// # Errors
    /// If a scalar `alpha` or `beta` is not finite and positive.
    pub fn lccdf(&self, alpha: impl Into<Param<D>>, beta: impl Into<Param<D>>) -> Result<Tensor<D>, ModelError> {
        self.cdf(alpha.into(), beta.into(), false)
    }

    fn cdf(&self, alpha: Param<D>, beta: Param<D>, lower: bool) -> Result<Tensor<D>, ModelError> {
        let alpha = alpha.check_positive("BetaBinomial", "alpha")?.tensor_like(&self.counts);
        let beta = beta.check_positive("BetaBinomial", "beta")?.tensor_like(&self.counts);
        let inputs = [alpha, beta, self.counts.clone(), self.trials.clone()];
        let Ok(out) = host_elementwise::<D, 4, std::convert::Infallible>(inputs, |[a, b, k, n]| {
            let (v, [da, db]) = beta_binomial_log_cdf(k, n, a, b, lower);
            Ok((v, [da, db, 0.0, 0.0]))
        });
        Ok(out)
    }
}

/// `ln P(Y <= k)` (`lower`) or `ln P(Y > k)` for `Y ~ beta_binomial(n, a, b)`, with the
/// derivatives in `(a, b)`; NaN for a shape that is not finite and positive.
fn beta_binomial_log_cdf(k: f64, n: f64, a: f64, b: f64, lower: bool) -> (f64, [f64; 2]) {
    if !(a > 0.0 && a.is_finite() && b > 0.0 && b.is_finite()) {
        return (f64::NAN, [0.0; 2]);
    }
    let inside = |j: f64| (j <= k) == lower;
    // ln pmf(0) = lbeta(a, n + b) - lbeta(a, b), and its derivatives.
    let mut ln_p = ln_gamma(n + b) - ln_gamma(b) - ln_gamma(n + a + b) + ln_gamma(a + b);
    let tail = digamma_host(a + b) - digamma_host(n + a + b);
    let (mut d_a, mut d_b) = (tail, tail + digamma_host(n + b) - digamma_host(b));
    // The side's terms, summed around their largest in log form.
    let mut terms: Vec<(f64, f64, f64)> = Vec::new();
    let mut j = 0.0;
    while j <= n {
        if inside(j) {
            terms.push((ln_p, d_a, d_b));
        }
        // pmf(j + 1) / pmf(j) = (n - j)(j + a) / ((j + 1)(n - j - 1 + b)).
        ln_p += ((n - j) * (j + a) / ((j + 1.0) * (n - j - 1.0 + b))).ln();
        d_a += 1.0 / (j + a);
        d_b -= 1.0 / (n - j - 1.0 + b);
        j += 1.0;
    }
    if terms.is_empty() {
        return (f64::NEG_INFINITY, [0.0; 2]);
    }
    let max = terms.iter().map(|t| t.0).fold(f64::NEG_INFINITY, f64::max);
    let (mut sum, mut sa, mut sb) = (0.0, 0.0, 0.0);
    for (l, da, db) in terms {
        let w = (l - max).exp();
        sum += w;
        sa += w * da;
        sb += w * db;
    }
    (max + sum.ln(), [sa / sum, sb / sum])
}

/// Stan's `neg_binomial_2`: counts with mean `mu` and overdispersion `phi` (variance
/// `mu + mu^2 / phi`), [`NegBinomial2Log`] at `eta = ln mu`.
#[derive(Clone, Debug)]
pub struct NegBinomial2<const D: usize> {
    inner: NegBinomial2Log<D>,
}

impl<const D: usize> NegBinomial2<D> {
    /// Counts: whole numbers `>= 0`, otherwise an error naming `counts`.
    pub fn new(counts: Tensor<D>) -> Result<Self, ModelError> {
        Ok(Self { inner: NegBinomial2Log::new(counts)? })
    }

    /// `log p(counts | mu, phi)` elementwise, broadcast; `mu > 0` (a model's positive
    /// parameter), a scalar `phi` finite and positive.
    pub fn log_prob(&self, mu: Tensor<D>, phi: impl Into<Param<D>>) -> Result<Tensor<D>, ModelError> {
        let phi = phi.into().check_positive("NegBinomial2", "phi")?;
        self.inner.log_prob(mu.log(), phi)
    }
    /// Stan's `neg_binomial_2_lcdf(n | mu, phi)`: [`NegBinomial2Log::lcdf`] at `eta = ln mu`.
    ///
    /// # Errors
    /// If a scalar `phi` is not finite and positive.
    pub fn lcdf(&self, mu: Tensor<D>, phi: impl Into<Param<D>>) -> Result<Tensor<D>, ModelError> {
        self.inner.lcdf(mu.log(), phi.into().check_positive("NegBinomial2", "phi")?)
    }

    /// Stan's `neg_binomial_2_lccdf(n | mu, phi)`.
    ///
    /// # Errors
    /// If a scalar `phi` is not finite and positive.
    pub fn lccdf(&self, mu: Tensor<D>, phi: impl Into<Param<D>>) -> Result<Tensor<D>, ModelError> {
        self.inner.lccdf(mu.log(), phi.into().check_positive("NegBinomial2", "phi")?)
    }
}

/// Stan's `neg_binomial(alpha, beta)`: counts with shape `alpha` and inverse scale `beta`
/// (mean `alpha / beta`, variance `alpha / beta^2 (beta + 1)`):
/// `ln C(n + alpha - 1, n) + alpha ln(beta / (1 + beta)) - n ln(1 + beta)`. It is
/// [`NegBinomial2Log`] at `eta = ln alpha - ln beta`, `phi = alpha`, which keeps its log-gamma
/// ratio accurate for a large `alpha`.
#[derive(Clone, Debug)]
pub struct NegBinomial<const D: usize> {
    inner: NegBinomial2Log<D>,
    counts: Tensor<D>,
}

impl<const D: usize> NegBinomial<D> {
    /// Counts: whole numbers `>= 0`, otherwise an error naming `counts`.
    pub fn new(counts: Tensor<D>) -> Result<Self, ModelError> {
        Ok(Self { inner: NegBinomial2Log::new(counts.clone())?, counts })
    }

    /// `log p(counts | alpha, beta)` elementwise, broadcast; scalars must be finite and positive.
    pub fn log_prob(&self, alpha: impl Into<Param<D>>, beta: impl Into<Param<D>>) -> Result<Tensor<D>, ModelError> {
        let alpha = alpha.into().check_positive("NegBinomial", "alpha")?;
        let beta = beta.into().check_positive("NegBinomial", "beta")?;
        let eta = beta.sub_ln_from(alpha.ln().tensor_like(&self.counts));
        self.inner.log_prob(eta, alpha)
    }

    /// Stan's `neg_binomial_lcdf(n | alpha, beta)`: `ln I_{beta / (1 + beta)}(alpha, n + 1)`,
    /// [`NegBinomial2Log::lcdf`] at `eta = ln alpha - ln beta`, `phi = alpha`.
    ///
    /// # Errors
    /// If a scalar `alpha` or `beta` is not finite and positive.
    pub fn lcdf(&self, alpha: impl Into<Param<D>>, beta: impl Into<Param<D>>) -> Result<Tensor<D>, ModelError> {
        let (eta, alpha) = self.log_mean(alpha.into(), beta.into())?;
        self.inner.lcdf(eta, alpha)
    }

    /// Stan's `neg_binomial_lccdf(n | alpha, beta)`, computed directly (see [`NegBinomial::lcdf`]).
    ///
    /// # Errors
    /// If a scalar `alpha` or `beta` is not finite and positive.
    pub fn lccdf(&self, alpha: impl Into<Param<D>>, beta: impl Into<Param<D>>) -> Result<Tensor<D>, ModelError> {
        let (eta, alpha) = self.log_mean(alpha.into(), beta.into())?;
        self.inner.lccdf(eta, alpha)
    }

    /// `(ln alpha - ln beta, alpha)`, both checked.
    fn log_mean(&self, alpha: Param<D>, beta: Param<D>) -> Result<(Tensor<D>, Param<D>), ModelError> {
        let alpha = alpha.check_positive("NegBinomial", "alpha")?;
        let beta = beta.check_positive("NegBinomial", "beta")?;
        Ok((beta.sub_ln_from(alpha.ln().tensor_like(&self.counts)), alpha))
    }
}

/// Labels checked on the host to be whole numbers in `{0, 1}`.
fn binary_on_host<const D: usize>(dist: &'static str, y: &Tensor<D>) -> Result<Vec<f64>, ModelError> {
    let values = crate::tensor_ops::to_vec_f64(y);
    if let Some((at, v)) = values.iter().enumerate().find(|&(_, &v)| v != 0.0 && v != 1.0) {
        return Err(bad_at(dist, "y", at, format!("must be 0 or 1, got {v}")));
    }
    Ok(values)
}

/// Stan's `bernoulli_logit`: `y ~ Bernoulli(inv_logit(eta))`, labels `y` in `{0, 1}` as data:
/// `ln inv_logit(s eta)` with `s = 2y - 1`, i.e. `-log1p_exp(-s eta)`, exact for large `|eta|`.
#[derive(Clone, Debug)]
pub struct BernoulliLogit<const D: usize> {
    /// `2y - 1`: `+1` for a success, `-1` for a failure.
    sign: Tensor<D>,
}

impl<const D: usize> BernoulliLogit<D> {
    /// Labels `y`, each `0` or `1`: otherwise an error naming `y`.
    pub fn new(y: Tensor<D>) -> Result<Self, ModelError> {
        let sign = binary_on_host("BernoulliLogit", &y)?.into_iter().map(|v| 2.0 * v - 1.0).collect();
        Ok(Self { sign: host_tensor(sign, &y) })
    }

    /// `log p(y | eta)` elementwise, the log-odds `eta` broadcast against the labels.
    pub fn log_prob(&self, eta: Tensor<D>) -> Tensor<D> {
        softplus((self.sign.clone() * eta).neg()).neg()
    }
}

/// Stan's `poisson_log`: counts `k ~ Poisson(e^eta)`, `k eta - e^eta - ln k!`, with `ln k!`
/// computed once on the host. [`PoissonLog::log_prob_rate`] is Stan's `poisson` (rate scale).
#[derive(Clone, Debug)]
pub struct PoissonLog<const D: usize> {
    counts: Tensor<D>,
    ln_factorial: Tensor<D>,
}

impl<const D: usize> PoissonLog<D> {
    /// Counts: whole numbers `>= 0`, otherwise an error naming `counts`.
    pub fn new(counts: Tensor<D>) -> Result<Self, ModelError> {
        let n = counts_on_host("PoissonLog", "counts", &counts)?;
        let ln_factorial = n.iter().map(|&k| ln_gamma(k + 1.0)).collect();
        Ok(Self { ln_factorial: host_tensor(ln_factorial, &counts), counts })
    }

    /// `log p(k | e^eta)` elementwise, the log rate `eta` broadcast against the counts: one
    /// autodiff node ([`crate::fused::poisson_log_terms`]) on the precomputed `ln k!`.
    ///
    /// # Panics
    /// If `eta`'s shape does not broadcast against the counts'.
    pub fn log_prob(&self, eta: Tensor<D>) -> Tensor<D> {
        crate::fused::poisson_log_terms(self.counts.clone(), eta, self.ln_factorial.clone())
    }

    /// Stan's `poisson(lambda)`: `k ln lambda - lambda - ln k!`, the `k ln lambda` term only
    /// where `k > 0` (so `lambda = 0` with `k = 0` is `0`); `lambda < 0`, or `0` under a positive
    /// count, gives `-inf`.
    pub fn log_prob_rate(&self, lambda: Tensor<D>) -> Tensor<D> {
        let negative = lambda.clone().lower_elem(0.0);
        let zero = lambda.clone().equal_elem(0.0);
        let lp = self.counts.clone() * lambda.clone().clamp_min(f32::MIN_POSITIVE).log()
            - lambda.clamp_min(0.0)
            - self.ln_factorial.clone();
        let shape = lp.dims();
        let impossible = zero.expand(shape).bool_and(self.counts.clone().greater_elem(0.0).expand(shape));
        lp.mask_fill(negative.expand(shape).bool_or(impossible), f32::NEG_INFINITY)
    }
    /// Stan's `poisson_lcdf(k | lambda)`: `ln P(Y <= k) = ln Q(k + 1, lambda)`, the regularised
    /// upper incomplete gamma function in log form (accurate far in either tail), differentiable
    /// in `lambda`; a negative `lambda` gives `-inf`.
    pub fn lcdf_rate(&self, lambda: Tensor<D>) -> Tensor<D> {
        self.cdf_rate(lambda, false)
    }

    /// Stan's `poisson_lccdf(k | lambda)`: `ln P(Y > k) = ln P(k + 1, lambda)`.
    pub fn lccdf_rate(&self, lambda: Tensor<D>) -> Tensor<D> {
        self.cdf_rate(lambda, true)
    }

    fn cdf_rate(&self, lambda: Tensor<D>, lower: bool) -> Tensor<D> {
        let negative = lambda.clone().lower_elem(0.0);
        let out = ln_gamma_tail(self.counts.clone().add_scalar(1.0), lambda.clamp_min(0.0), lower);
        let shape = out.dims();
        out.mask_fill(negative.expand(shape), f32::NEG_INFINITY)
    }
}

/// Categories `0 .. k` checked on the host, as a one-hot `[1, N, K]` tensor.
fn one_hot(dist: &'static str, y: &[usize], k: usize, device: &burn::tensor::Device) -> Result<Tensor<3>, ModelError> {
    if y.is_empty() {
        return Err(bad(dist, "y", "has no observations"));
    }
    if let Some((at, &c)) = y.iter().enumerate().find(|&(_, &c)| c >= k) {
        return Err(bad_at(dist, "y", at, format!("category {c} is out of range for {k} categories (0-based)")));
    }
    let mut hot = vec![0f32; y.len() * k];
    for (row, &c) in y.iter().enumerate() {
        hot[row * k + c] = 1.0;
    }
    Ok(Tensor::from_data(TensorData::new(hot, [1, y.len(), k]), device))
}

/// Stan's `categorical_logit`: observations `y` (0-based categories) with unnormalised log
/// probabilities `beta` along the last axis: `log_softmax(beta)[y]`.
#[derive(Clone, Debug)]
pub struct CategoricalLogit {
    /// `[1, N, K]`
    hot: Tensor<3>,
}

impl CategoricalLogit {
    /// The `N` observations `y`, each `< k` (0-based; Stan's are 1-based): otherwise an error
    /// naming `y`.
    pub fn new(y: &[usize], k: usize, device: &burn::tensor::Device) -> Result<Self, ModelError> {
        Ok(Self { hot: one_hot("CategoricalLogit", y, k, device)? })
    }

    /// `log p(y_i | beta_i)`: `beta` `[n, N, K]` (one linear predictor per observation) or
    /// `[n, 1, K]` (shared by all): `[n, N]`.
    ///
    /// # Errors
    /// If `beta` does not have `K` entries on its last axis or its middle axis is neither 1 nor `N`.
    pub fn log_prob(&self, beta: Tensor<3>) -> Result<Tensor<2>, ModelError> {
        let [_, big_n, k] = self.hot.dims();
        let [n, nb, kb] = beta.dims();
        if kb != k || (nb != big_n && nb != 1) {
            return Err(bad(
                "CategoricalLogit",
                "beta",
                format!("is [{n}, {nb}, {kb}] against {big_n} observations of {k} categories"),
            ));
        }
        let hot = self.hot.clone().cast(beta.dtype());
        Ok((log_softmax(beta, 2) * hot).sum_dim(2).reshape([n, big_n]))
    }
}

/// The ordinal likelihoods' shared data: each observation's category, its lower and upper cut
/// point's index into the padded cut points `[c_0 - 1, c_0, .., c_{K-2}, c_{K-2} + 1]`, and masks
/// for the first and last category.
#[derive(Clone, Debug)]
struct Ordinal {
    k: usize,
    lower: Tensor<1, Int>,
    upper: Tensor<1, Int>,
    /// `[1, N]`
    first: Tensor<2, burn::tensor::Bool>,
    last: Tensor<2, burn::tensor::Bool>,
}

impl Ordinal {
    fn new(dist: &'static str, y: &[usize], k: usize, device: &burn::tensor::Device) -> Result<Self, ModelError> {
        if k < 2 {
            return Err(bad(dist, "k", format!("needs at least 2 categories, got {k}")));
        }
        if y.is_empty() {
            return Err(bad(dist, "y", "has no observations"));
        }
        if let Some((at, &c)) = y.iter().enumerate().find(|&(_, &c)| c >= k) {
            return Err(bad_at(dist, "y", at, format!("category {c} is out of range for {k} categories (0-based)")));
        }
        let ints = |f: &dyn Fn(usize) -> i64| {
            let v: Vec<i64> = y.iter().map(|&c| f(c)).collect();
            Tensor::<1, Int>::from_data(TensorData::new(v, [y.len()]), device)
        };
        let mask = |f: &dyn Fn(usize) -> bool| {
            let v: Vec<f32> = y.iter().map(|&c| if f(c) { 1.0 } else { 0.0 }).collect();
            Tensor::<2>::from_data(TensorData::new(v, [1, y.len()]), device).greater_elem(0.5)
        };
        Ok(Self {
            k,
            lower: ints(&|c| c as i64),
            upper: ints(&|c| c as i64 + 1),
            first: mask(&|c| c == 0),
            last: mask(&|c| c == k - 1),
        })
    }

    /// `(eta - c_lower, eta - c_upper, disordered)` for each observation, `[n, N]` each, and
    /// a mask `[n, 1]` of particles whose cut points are not strictly increasing.
    fn gaps(
        &self,
        dist: &'static str,
        eta: Tensor<2>,
        c: Tensor<2>,
    ) -> Result<(Tensor<2>, Tensor<2>, Tensor<2, burn::tensor::Bool>), ModelError> {
        let [nc, kc] = c.dims();
        let [ne, big_n] = eta.dims();
        if kc != self.k - 1 {
            return Err(bad(dist, "c", format!("has {kc} cut points: {} categories need {}", self.k, self.k - 1)));
        }
        if big_n != self.first.dims()[1] && big_n != 1 {
            return Err(bad(dist, "eta", format!("has {big_n} columns against {} observations", self.first.dims()[1])));
        }
        if ne != nc && ne != 1 && nc != 1 {
            return Err(bad(dist, "eta", format!("has {ne} rows against the cut points' {nc}")));
        }
        let padded = Tensor::cat(
            vec![c.clone().narrow(1, 0, 1).sub_scalar(1.0), c.clone(), c.clone().narrow(1, kc - 1, 1).add_scalar(1.0)],
            1,
        );
        let disordered = if kc > 1 {
            (c.clone().narrow(1, 1, kc - 1) - c.narrow(1, 0, kc - 1)).min_dim(1).lower_equal_elem(0.0)
        } else {
            c.lower_elem(f64::NEG_INFINITY)
        };
        let lo = padded.clone().select(1, self.lower.clone());
        let hi = padded.select(1, self.upper.clone());
        Ok((eta.clone() - lo, eta - hi, disordered))
    }

    /// Merges the three cases' log-probabilities `[n, N]` by category and masks the particles
    /// with disordered cut points to `-inf`.
    fn merge(
        &self,
        first: Tensor<2>,
        middle: Tensor<2>,
        last: Tensor<2>,
        disordered: Tensor<2, burn::tensor::Bool>,
    ) -> Tensor<2> {
        let shape = middle.dims();
        let lp = middle
            .mask_where(self.first.clone().expand(shape), first)
            .mask_where(self.last.clone().expand(shape), last);
        lp.mask_fill(disordered.expand(shape), f32::NEG_INFINITY)
    }
}

/// Stan's `ordered_logistic`: ordinal observations `y` (0-based categories `0 .. K-1`) with
/// linear predictor `eta` and increasing cut points `c` (`K - 1` of them):
/// `P(y = k) = inv_logit(eta - c_{k-1}) - inv_logit(eta - c_k)` with `c_{-1} = -inf`,
/// `c_{K-1} = +inf`. In log form, with `x = eta - c_{k-1} > z = eta - c_k`, Stan math's
/// `-log1p_exp(-x) - log1p_exp(z) + log1m_exp(z - x)`: nothing overflows or cancels. Cut points
/// that are not strictly increasing give that particle `-inf` (the `ordered` constraint keeps
/// them so).
#[derive(Clone, Debug)]
pub struct OrderedLogistic {
    data: Ordinal,
}

impl OrderedLogistic {
    /// The observations `y`, each `< k` (0-based), `k >= 2`: otherwise an error naming `y` or `k`.
    pub fn new(y: &[usize], k: usize, device: &burn::tensor::Device) -> Result<Self, ModelError> {
        Ok(Self { data: Ordinal::new("OrderedLogistic", y, k, device)? })
    }

    /// `log p(y_i | eta_i, c)`: `eta` `[n, N]` (or `[n, 1]`, shared), cut points `c` `[n, K - 1]`
    /// (either with one row for all particles): `[n, N]`.
    ///
    /// # Errors
    /// If the shapes do not fit the data.
    pub fn log_prob(&self, eta: Tensor<2>, c: Tensor<2>) -> Result<Tensor<2>, ModelError> {
        let (x, z, disordered) = self.data.gaps("OrderedLogistic", eta, c)?;
        let first = softplus(z.clone()).neg();
        let last = softplus(x.clone().neg()).neg();
        // z - x = c_{k-1} - c_k < 0; the clamp keeps the first and last rows' (unused) value and
        // a disordered particle's finite.
        let middle = last.clone() + first.clone() + log1m_exp_neg((x - z).clamp_min(f32::MIN_POSITIVE));
        Ok(self.data.merge(first, middle, last, disordered))
    }
}

/// Stan's `ordered_probit`: [`OrderedLogistic`] with the standard normal cdf `Phi` for
/// `inv_logit`: `P(y = k) = Phi(eta - c_{k-1}) - Phi(eta - c_k)`. The first category is
/// `std_normal_lccdf(z)`, the last `std_normal_lcdf(x)`, a middle one
/// `log_diff_exp(ln Phi(x), ln Phi(z))`, on the reflected side `log_diff_exp(ln Phi(-z),
/// ln Phi(-x))` where `x + z > 0` (so two upper-tail probabilities near 1 never cancel).
#[derive(Clone, Debug)]
pub struct OrderedProbit {
    data: Ordinal,
}

impl OrderedProbit {
    /// The observations `y`, each `< k` (0-based), `k >= 2`: otherwise an error naming `y` or `k`.
    pub fn new(y: &[usize], k: usize, device: &burn::tensor::Device) -> Result<Self, ModelError> {
        Ok(Self { data: Ordinal::new("OrderedProbit", y, k, device)? })
    }

    /// `log p(y_i | eta_i, c)`, shapes as [`OrderedLogistic::log_prob`]: `[n, N]`.
    ///
    /// # Errors
    /// If the shapes do not fit the data.
    pub fn log_prob(&self, eta: Tensor<2>, c: Tensor<2>) -> Result<Tensor<2>, ModelError> {
        let (x, z, disordered) = self.data.gaps("OrderedProbit", eta, c)?;
        let (lcdf_x, lccdf_x) = log_normal_cdfs(x.clone());
        let (lcdf_z, lccdf_z) = log_normal_cdfs(z.clone());
        // ln(e^a - e^b) for a > b, with the gap clamped positive (see OrderedLogistic).
        let diff = |a: Tensor<2>, b: Tensor<2>| {
            let gap = (a.clone() - b).clamp_min(f32::MIN_POSITIVE);
            a + log1m_exp_neg(gap)
        };
        let upper_side = (x + z).greater_elem(0.0);
        let middle = diff(lcdf_x.clone(), lcdf_z).mask_where(upper_side, diff(lccdf_z.clone(), lccdf_x));
        Ok(self.data.merge(lccdf_z, middle, lcdf_x, disordered))
    }
}

/// Stan's `multinomial` and `multinomial_logit` over rows of counts `[M, K]`: `ln N! - sum_k
/// ln y_k! + sum_k y_k ln theta_k` per row, each `y_k ln theta_k` only where `y_k > 0`.
#[derive(Clone, Debug)]
pub struct Multinomial {
    /// `[1, M, K]`
    counts: Tensor<3>,
    /// `[1, M]`: `ln N! - sum ln y_k!`.
    log_coef: Tensor<2>,
}

impl Multinomial {
    /// Rows of counts `[M, K]`, whole numbers `>= 0`: otherwise an error naming `counts`.
    pub fn new(counts: Tensor<2>) -> Result<Self, ModelError> {
        let [m, k] = counts.dims();
        let y = counts_on_host("Multinomial", "counts", &counts)?;
        let log_coef: Vec<f64> = (0..m)
            .map(|r| {
                let row = &y[r * k..(r + 1) * k];
                ln_gamma(row.iter().sum::<f64>() + 1.0) - row.iter().map(|&v| ln_gamma(v + 1.0)).sum::<f64>()
            })
            .collect();
        let device = counts.device();
        let log_coef = Tensor::from_data(TensorData::new(log_coef, [1, m]), (&device, counts.dtype()));
        Ok(Self { counts: counts.unsqueeze::<3>(), log_coef })
    }

    fn check(&self, name: &'static str, p: &Tensor<3>) -> Result<(usize, usize), ModelError> {
        self.check_for("Multinomial", name, p)
    }

    fn check_for(&self, dist: &'static str, name: &'static str, p: &Tensor<3>) -> Result<(usize, usize), ModelError> {
        let [_, m, k] = self.counts.dims();
        let [n, mp, kp] = p.dims();
        if kp != k || (mp != m && mp != 1) {
            return Err(bad(dist, name, format!("is [{n}, {mp}, {kp}] against {m} rows of {k} counts")));
        }
        Ok((n, m))
    }

    /// `log p(y_r | theta)`: simplexes `theta` `[n, M, K]` (one per row) or `[n, 1, K]`
    /// (shared): `[n, M]`. An entry `theta_k <= 0` under a positive count gives `-inf`.
    ///
    /// # Errors
    /// If `theta`'s shape does not fit the counts.
    pub fn log_prob(&self, theta: Tensor<3>) -> Result<Tensor<2>, ModelError> {
        let (n, m) = self.check("theta", &theta)?;
        let impossible_at = theta.clone().lower_equal_elem(0.0);
        let terms = self.counts.clone() * theta.clamp_min(f32::MIN_POSITIVE).log();
        let shape = terms.dims();
        let impossible = impossible_at.expand(shape).bool_and(self.counts.clone().greater_elem(0.0).expand(shape));
        let terms = terms.mask_fill(impossible, f32::NEG_INFINITY);
        Ok(terms.sum_dim(2).reshape([n, m]) + self.log_coef.clone())
    }

    /// Stan's `multinomial_logit`: `theta = softmax(gamma)` along the last axis, `gamma`
    /// `[n, M or 1, K]`, in log form (`log_softmax`): `[n, M]`.
    ///
    /// # Errors
    /// If `gamma`'s shape does not fit the counts.
    pub fn log_prob_logit(&self, gamma: Tensor<3>) -> Result<Tensor<2>, ModelError> {
        let (n, m) = self.check("gamma", &gamma)?;
        let terms = self.counts.clone() * log_softmax(gamma, 2);
        Ok(terms.sum_dim(2).reshape([n, m]) + self.log_coef.clone())
    }
}

/// Stan's `dirichlet_multinomial(alpha)` over rows of counts `[M, K]` (a multinomial whose
/// probabilities are Dirichlet-distributed, marginalised): with `N = sum_k y_k` and
/// `alpha_0 = sum_k alpha_k`, `ln N! - sum_k ln y_k! + ln Gamma(alpha_0) - ln Gamma(alpha_0 + N)
/// + sum_k [ln Gamma(alpha_k + y_k) - ln Gamma(alpha_k)]`, each log-gamma difference from
/// [`ln_gamma_ratio_tensor`] (no cancellation where an `alpha` is large; `0` where a count is).
#[derive(Clone, Debug)]
pub struct DirichletMultinomial {
    data: Multinomial,
    /// `[1, M]`: each row's total `N`.
    totals: Tensor<2>,
}

impl DirichletMultinomial {
    /// Rows of counts `[M, K]`, whole numbers `>= 0`: otherwise an error naming `counts`.
    pub fn new(counts: Tensor<2>) -> Result<Self, ModelError> {
        let [m, _] = counts.dims();
        counts_on_host("DirichletMultinomial", "counts", &counts)?;
        let totals = counts.clone().sum_dim(1).reshape([1, m]);
        Ok(Self { data: Multinomial::new(counts)?, totals })
    }

    /// `log p(y_r | alpha)`: concentrations `alpha` `[n, M, K]` (one per row) or `[n, 1, K]`
    /// (shared), positive (a model's positive parameter): `[n, M]`.
    ///
    /// # Errors
    /// If `alpha`'s shape does not fit the counts.
    pub fn log_prob(&self, alpha: Tensor<3>) -> Result<Tensor<2>, ModelError> {
        let (n, m) = self.data.check_for("DirichletMultinomial", "alpha", &alpha)?;
        let counts = self.data.counts.clone().cast(alpha.dtype());
        let [_, mp, _] = alpha.dims();
        let total_alpha = alpha.clone().sum_dim(2).reshape([n, mp]);
        let per_category = ln_gamma_ratio_tensor(alpha, counts).sum_dim(2).reshape([n, m]);
        let totals = self.totals.clone().cast(total_alpha.dtype());
        Ok(per_category - ln_gamma_ratio_tensor(total_alpha, totals) + self.data.log_coef.clone())
    }
}
