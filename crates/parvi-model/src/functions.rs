//! Stan's real-valued basic functions, links and special functions, and a few of its matrix
//! helpers, as elementwise (or batched) tensor operations under Stan's names.
//!
//! Every function takes and returns tensors of any rank and broadcasts as burn does, so a
//! parameter `[n, ...]` (one row per particle) meets data `[1, ...]` in one call. Gradients come
//! from burn's autodiff through the operations each is built from; [`inv_Phi`] alone sets its
//! own derivative (`1 / phi(x)`), since the derivative of its rational fit is not the derivative
//! of the function. The numerically stable forms follow Stan math (`stan/math/prim/fun/`): no
//! `exp` overflows, and `1 - x` is never formed where `x` is near 1 and the result is small.
//!
//! Where a branch is needed (`log1m_exp`, `Phi`), each branch is evaluated on its input clamped
//! to its own range and the two are merged by a mask, so the branch not taken can never put a
//! NaN into a gradient. `Phi`, `Phi_approx` and `inv_Phi` keep Stan's capitals so that a Stan
//! line reads the same here.
#![allow(non_snake_case)]

use std::f64::consts::{PI, SQRT_2};

use burn::tensor::Tensor;

use crate::ModelError;
use crate::dist::special::{
    exprel_series, host_elementwise, ln_gamma_pq, ln_inc_beta, log_erfc, log_normal_cdfs, log1m_exp_neg, on_columns,
    owens_t_columns, softplus,
};
use crate::dist::{ln_gamma_ratio_tensor, ln_gamma_tensor};
use crate::tensor_ops::log_softmax;

/// `inv_logit(x) = 1 / (1 + e^-x)`, as `exp(-log1p_exp(-x))`: no overflow for any `x`.
pub fn inv_logit<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    log_inv_logit(x).exp()
}

/// `logit(p) = ln(p / (1 - p))`, as `ln p - log1p(-p)`.
pub fn logit<const D: usize>(p: Tensor<D>) -> Tensor<D> {
    p.clone().log() - log1m(p)
}

/// `ln inv_logit(x) = -log1p_exp(-x)`: exact for large negative `x` (where `inv_logit`
/// underflows) and for large positive `x` (where it rounds to 1).
pub fn log_inv_logit<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    softplus(x.neg()).neg()
}

/// `ln(1 - inv_logit(x)) = -log1p_exp(x)`.
pub fn log1m_inv_logit<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    softplus(x).neg()
}

/// `ln(1 - x)`, as `log1p(-x)`; NaN for `x > 1`, `-inf` at 1 (Stan's `log1m`).
pub fn log1m<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    x.neg().log1p()
}

/// `ln(1 + e^x)`, as `max(x, 0) + log1p(e^-|x|)`: never overflows.
pub fn log1p_exp<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    softplus(x)
}

/// `ln(1 - e^x)` for `x < 0`: a series in `-x` near 0 (where `1 - e^x` cancels), `log1p(-e^x)`
/// beyond. `-inf` at 0 and NaN above, as in Stan.
pub fn log1m_exp<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    let zero = x.clone().equal_elem(0.0);
    let positive = x.clone().greater_elem(0.0);
    log1m_exp_neg(x.neg()).mask_fill(zero, f32::NEG_INFINITY).mask_fill(positive, f32::NAN)
}

/// `ln(e^a - e^b)` for `a > b`: `a + log1m_exp(b - a)`; `-inf` where `a == b`, NaN where
/// `a < b` (Stan's `log_diff_exp`).
pub fn log_diff_exp<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> Tensor<D> {
    let d = b - a.clone();
    a + log1m_exp(d)
}

/// `ln(e^a + e^b)` elementwise (Stan's two-argument `log_sum_exp`): `max + log1p(e^-|a - b|)`.
/// [`crate::tensor_ops::log_sum_exp`] is the reduction along an axis.
pub fn log_sum_exp_pair<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> Tensor<D> {
    let max = a.clone().max_pair(b.clone());
    max + (a - b).abs().neg().exp().log1p()
}

/// `e^x - 1` (Stan's `expm1`), without the cancellation of `exp(x) - 1` near 0: the series of
/// `(e^x - 1) / x` times `x` for `|x| < 1/2` (relative error below 3e-12), `exp(x) - 1` beyond.
/// Each branch on its own clamped input.
pub fn expm1<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    let small = x.clone().abs().lower_elem(0.5);
    let xs = x.clone().clamp(-0.5, 0.5);
    let series = exprel_series(xs.clone()) * xs;
    x.exp().sub_scalar(1.0).mask_where(small, series)
}

/// Stan's `inv_cloglog(x) = 1 - exp(-exp(x))`, as `-expm1(-exp(x))`: keeps its relative
/// precision far left, where it is `e^x` to first order.
pub fn inv_cloglog<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    expm1(x.exp().neg()).neg()
}

/// The standard normal cdf `Phi(x)`, accurate in relative terms in both tails: the smaller
/// side is `erfc(|x| / sqrt 2) / 2` from a log-form fit (relative error below 1.2e-7), the
/// larger side `1 -` that. burn's `erf` is accurate only in absolute terms.
pub fn Phi<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    let negative = x.clone().lower_elem(0.0);
    // Each side on its own clamped input (|x| would give a zero derivative at 0).
    let tail = |u: Tensor<D>| log_erfc(u.clamp_min(0.0).div_scalar(SQRT_2)).sub_scalar(2f64.ln()).exp();
    let lower = tail(x.clone().neg());
    tail(x).neg().add_scalar(1.0).mask_where(negative, lower)
}

/// Owen's T function `T(h, a) = 1/(2 pi) int_0^a e^(-h^2 (1 + x^2) / 2) / (1 + x^2) dx` (Stan's
/// `owens_t`), elementwise with broadcasting: 24-point Gauss-Legendre on `|a| <= 1` and Owen's
/// reduction `T(h, a) = (Phi(h) Phi(-a h) + Phi(a h) Phi(-h)) / 2 - T(a h, 1/a)` above; relative
/// error about 1e-7 (the normal cdfs' fit), gradients by autodiff through the quadrature.
pub fn owens_t<const D: usize>(h: Tensor<D>, a: Tensor<D>) -> Tensor<D> {
    on_columns(h, a, owens_t_columns)
}

/// Stan's `Phi_approx(x) = inv_logit(0.07056 x^3 + 1.5976 x)` (Bowling et al. 2009), a fast
/// approximation to [`Phi`] with absolute error below 1.4e-4.
pub fn Phi_approx<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    let cubic = x.clone().square().mul_scalar(0.07056).add_scalar(1.5976) * x;
    inv_logit(cubic)
}

/// `ln Phi(x)` (Stan's `std_normal_lcdf`), accurate in both tails.
pub fn std_normal_lcdf<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    log_normal_cdfs(x).0
}

/// `ln(1 - Phi(x))` (Stan's `std_normal_lccdf`), accurate in both tails.
pub fn std_normal_lccdf<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    log_normal_cdfs(x).1
}

/// The standard normal quantile `inv_Phi(p)` for `p` in `(0, 1)`; `-inf` at 0, `+inf` at 1,
/// NaN outside `[0, 1]`.
///
/// The value is Acklam's rational fit (relative error below 1.2e-9: central part for
/// `0.02425 <= p <= 0.97575`, tail parts in `sqrt(-2 ln p)` outside), computed off the graph;
/// the derivative is set to the exact `1 / phi(x) = sqrt(2 pi) e^(x^2 / 2)` by adding
/// `(p - detach(p)) / phi(x)`, which is zero in value.
pub fn inv_Phi<const D: usize>(p: Tensor<D>) -> Tensor<D> {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const E: [f64; 4] =
        [7.784_695_709_041_462e-3, 3.224_671_290_700_398e-1, 2.445_134_137_142_996, 3.754_408_661_907_416];
    const P_LOW: f64 = 0.02425;
    // Horner with a leading coefficient list; `lead_one` appends the constant 1 of the
    // denominators.
    let horner = |t: &Tensor<D>, coef: &[f64], lead_one: bool| {
        let mut acc = t.clone().mul_scalar(coef[0]).add_scalar(coef[1]);
        for c in &coef[2..] {
            acc = acc.mul(t.clone()).add_scalar(*c);
        }
        if lead_one { acc.mul(t.clone()).add_scalar(1.0) } else { acc }
    };
    let below = p.clone().lower_elem(0.0).bool_or(p.clone().greater_elem(1.0));
    let (at_zero, at_one) = (p.clone().equal_elem(0.0), p.clone().equal_elem(1.0));
    // Inside (0, 1) and off the graph: the clamp to the dtype's smallest normal number and
    // largest number below 1 keeps every branch finite.
    let (tiny, below_one) = if p.dtype() == burn::tensor::DType::F64 {
        (f64::MIN_POSITIVE, 1.0 - f64::EPSILON / 2.0)
    } else {
        (f64::from(f32::MIN_POSITIVE), 1.0 - f64::from(f32::EPSILON) / 2.0)
    };
    let pd = p.clone().detach().clamp(tiny, below_one);
    let q = pd.clone().sub_scalar(0.5);
    let r = q.clone().square();
    let central = horner(&r, &A, false) * q / horner(&r, &B, true);
    let low_side = pd.clone().lower_elem(0.5);
    // The smaller tail probability, min(p, 1 - p), and the tail fit in it (negative).
    let tail_p = pd.clone().neg().add_scalar(1.0).mask_where(low_side.clone(), pd.clone());
    let t = tail_p.clone().log().mul_scalar(-2.0).sqrt();
    let tail = horner(&t, &C, false) / horner(&t, &E, true);
    let tail = tail.clone().neg().mask_where(low_side, tail);
    let is_central = tail_p.greater_equal_elem(P_LOW);
    let x = tail.mask_where(is_central, central).detach();
    let slope = x.clone().square().mul_scalar(0.5).exp().mul_scalar((2.0 * PI).sqrt()).detach();
    let out = x + (p.clone() - p.detach()) * slope;
    out.mask_fill(at_zero, f32::NEG_INFINITY).mask_fill(at_one, f32::INFINITY).mask_fill(below, f32::NAN)
}

/// `ln Gamma(x)` for `x > 0` (Stan's `lgamma`): [`crate::dist::ln_gamma_tensor`], Stirling's
/// series at `x + 6` shifted back; its autodiff gradient is the digamma function of that series.
pub fn lgamma<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    ln_gamma_tensor(x)
}

/// The digamma function `psi(x) = d ln Gamma(x) / dx` for `x > 0`: the asymptotic series at
/// `z = x + 6` (`ln z - 1/(2z) - 1/(12 z^2) + 1/(120 z^4) - 1/(252 z^6) + 1/(240 z^8)`,
/// truncation below 1.3e-10) shifted back by `psi(x) = psi(x + 6) - sum_{j<6} 1/(x + j)`.
/// Differentiable (its gradient is the same series' trigamma).
pub fn digamma<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    let z = x.clone().add_scalar(6.0);
    let w = z.clone().square().recip();
    // -1/12 w + 1/120 w^2 - 1/252 w^3 + 1/240 w^4, in Horner form.
    let series = w
        .clone()
        .mul_scalar(1.0 / 240.0)
        .sub_scalar(1.0 / 252.0)
        .mul(w.clone())
        .add_scalar(1.0 / 120.0)
        .mul(w.clone())
        .sub_scalar(1.0 / 12.0)
        .mul(w);
    let mut out = z.clone().log() - z.recip().mul_scalar(0.5) + series;
    for j in 0..6 {
        out = out - x.clone().add_scalar(f64::from(j)).recip();
    }
    out
}

/// The trigamma function `psi_1(x) = d^2 ln Gamma(x) / dx^2` for `x > 0` (Stan's `trigamma`):
/// the asymptotic series at `z = x + 6` (`1/z + 1/(2z^2) + 1/(6z^3) - 1/(30z^5) + 1/(42z^7) -
/// 1/(30z^9)`, DLMF 5.15.8, truncation below 1e-10 relative) shifted back by
/// `psi_1(x) = psi_1(x + 6) + sum_{j<6} 1/(x + j)^2`. Differentiable.
pub fn trigamma<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    let z = x.clone().add_scalar(6.0);
    let inv = z.recip();
    let w = inv.clone().square();
    // 1/z + w/2 + inv w (1/6 - w/30 + w^2/42 - w^3/30), Horner in w.
    let tail = w
        .clone()
        .mul_scalar(-1.0 / 30.0)
        .add_scalar(1.0 / 42.0)
        .mul(w.clone())
        .sub_scalar(1.0 / 30.0)
        .mul(w.clone())
        .add_scalar(1.0 / 6.0)
        .mul(w.clone())
        .mul(inv.clone());
    let mut out = inv + w.mul_scalar(0.5) + tail;
    for j in 0..6 {
        out = out + x.clone().add_scalar(f64::from(j)).square().recip();
    }
    out
}

/// Stan's `lmgamma(k, x)`, the log of the multivariate gamma function,
/// `k (k - 1) / 4 ln pi + sum_{j=0}^{k-1} ln Gamma(x - j / 2)`, for `x > (k - 1) / 2`.
pub fn lmgamma<const D: usize>(k: usize, x: Tensor<D>) -> Tensor<D> {
    let c = 0.25 * (k * k.saturating_sub(1)) as f64 * PI.ln();
    let mut out = ln_gamma_tensor(x.clone()).add_scalar(c);
    for j in 1..k {
        out = out + ln_gamma_tensor(x.clone().sub_scalar(0.5 * j as f64));
    }
    out
}

/// `ln(x^(n)) = ln Gamma(x + n) - ln Gamma(x)`, the log of the rising factorial (Stan's
/// `log_rising_factorial`) for `x > 0`, `n >= 0`, without cancelling two large log-gammas
/// ([`crate::dist::ln_gamma_ratio_tensor`]).
pub fn log_rising_factorial<const D: usize>(x: Tensor<D>, n: Tensor<D>) -> Tensor<D> {
    ln_gamma_ratio_tensor(x, n)
}

/// `ln((x)_n) = ln Gamma(x + 1) - ln Gamma(x - n + 1)`, the log of the falling factorial
/// (Stan's `log_falling_factorial`) for `x - n + 1 > 0`.
pub fn log_falling_factorial<const D: usize>(x: Tensor<D>, n: Tensor<D>) -> Tensor<D> {
    let base = (x - n.clone()).add_scalar(1.0);
    ln_gamma_ratio_tensor(base, n)
}

/// Stan's `log_inv_logit_diff(x, y) = ln(inv_logit(x) - inv_logit(y))` for `x > y`, as
/// `x - log1p_exp(x) - log1p_exp(y) + log1m_exp(y - x)` (Stan math's form): nothing cancels
/// where both are near 0 or 1. `-inf` where `x == y`, NaN where `x < y`.
pub fn log_inv_logit_diff<const D: usize>(x: Tensor<D>, y: Tensor<D>) -> Tensor<D> {
    let gap = y.clone() - x.clone();
    x.clone() - softplus(x) - softplus(y) + log1m_exp(gap)
}

/// `ln B(a, b) = ln Gamma(a) + ln Gamma(b) - ln Gamma(a + b)` for `a, b > 0` (Stan's `lbeta`),
/// as `ln Gamma(x) - [ln Gamma(x + y) - ln Gamma(y)]` with `x = min(a, b)`, `y = max(a, b)`:
/// the bracket from [`crate::dist::ln_gamma_ratio_tensor`], so a large argument does not
/// cancel two large log-gammas.
pub fn lbeta<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> Tensor<D> {
    let x = a.clone().min_pair(b.clone());
    let y = a.max_pair(b);
    ln_gamma_tensor(x.clone()) - ln_gamma_ratio_tensor(y, x)
}

/// `ln C(n, k) = -ln(n + 1) - lbeta(n - k + 1, k + 1)` for `0 <= k <= n` (Stan's `lchoose`,
/// real-valued as there).
pub fn lchoose<const D: usize>(n: Tensor<D>, k: Tensor<D>) -> Tensor<D> {
    let first = n.clone() - k.clone();
    lbeta(first.add_scalar(1.0), k.add_scalar(1.0)).neg() - n.add_scalar(1.0).log()
}

/// Stan's `binary_log_loss(y, y_hat) = -y ln(y_hat) - (1 - y) ln(1 - y_hat)` for labels `y` in
/// `{0, 1}` and `y_hat` in `[0, 1]`, with only the label's own term evaluated (so `y_hat = 0`
/// with `y = 0` is `0`, not NaN).
pub fn binary_log_loss<const D: usize>(y: Tensor<D>, y_hat: Tensor<D>) -> Tensor<D> {
    let (dy, dh) = (y.dims(), y_hat.dims());
    let shape: [usize; D] = std::array::from_fn(|i| dy[i].max(dh[i]));
    let one = y.greater_elem(0.5).expand(shape);
    let loss_zero = log1m(y_hat.clone()).neg().expand(shape);
    loss_zero.mask_where(one, y_hat.log().neg().expand(shape))
}

/// `softmax(x)` along `dim`: `exp(x - log_sum_exp(x))`, stable for any scale.
pub fn softmax<const D: usize>(x: Tensor<D>, dim: usize) -> Tensor<D> {
    log_softmax(x, dim).exp()
}

/// Stan's `cumulative_sum` along `dim` (each particle's row its own sum for `[n, T]`, `dim` 1).
pub fn cumulative_sum<const D: usize>(x: Tensor<D>, dim: usize) -> Tensor<D> {
    x.cumsum(dim)
}

/// Stan's `diag_pre_multiply(v, m) = diag(v) m` for a batch: `v` `[n, K]`, `m` `[n, K, M]`
/// (either may have a batch of one): row `i` of `m` scaled by `v_i`.
pub fn diag_pre_multiply(v: Tensor<2>, m: Tensor<3>) -> Tensor<3> {
    let [nv, k] = v.dims();
    m * v.reshape([nv, k, 1])
}

/// Stan's `diag_post_multiply(m, v) = m diag(v)` for a batch: `m` `[n, M, K]`, `v` `[n, K]`:
/// column `j` of `m` scaled by `v_j`.
pub fn diag_post_multiply(m: Tensor<3>, v: Tensor<2>) -> Tensor<3> {
    let [nv, k] = v.dims();
    m * v.reshape([nv, 1, k])
}

/// Stan's `quad_form_diag(m, v) = diag(v) m diag(v)` for a batch: `m` `[n, K, K]`, `v`
/// `[n, K]` (a covariance from a correlation matrix and scales).
pub fn quad_form_diag(m: Tensor<3>, v: Tensor<2>) -> Tensor<3> {
    diag_post_multiply(diag_pre_multiply(v.clone(), m), v)
}

/// Stan's `quad_form(a, b) = b^T a b` for a batch: `a` `[n, K, K]`, `b` `[n, K, M]`: `[n, M, M]`.
pub fn quad_form(a: Tensor<3>, b: Tensor<3>) -> Tensor<3> {
    b.clone().swap_dims(1, 2).matmul(a.matmul(b))
}

/// Stan's `trace_quad_form(a, b) = tr(b^T a b)` for a batch: `a` `[n, K, K]`, `b` `[n, K, M]`:
/// `[n]`, as `sum_ij b_ij (a b)_ij` (no `M x M` product formed).
pub fn trace_quad_form(a: Tensor<3>, b: Tensor<3>) -> Tensor<1> {
    let ab = a.matmul(b.clone());
    let n = ab.dims()[0];
    (ab * b).sum_dim(2).sum_dim(1).reshape([n])
}

/// Stan's `rows_dot_product(a, b)`: the dot product of each row pair along the last axis,
/// keeping it with size 1 (`[n, N, K]` -> `[n, N, 1]`).
pub fn rows_dot_product<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> Tensor<D> {
    (a * b).sum_dim(D - 1)
}

/// Stan's `columns_dot_product(a, b)`: the dot product of each column pair, along the second
/// to last axis, keeping it with size 1 (`[n, N, K]` -> `[n, 1, K]`).
pub fn columns_dot_product<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> Tensor<D> {
    (a * b).sum_dim(D - 2)
}

/// Checks a special function's argument on the host: `Ok` when `ok(v)`, otherwise an error
/// naming the function and the argument.
fn domain(function: &'static str, name: &'static str, v: f64, ok: bool, what: &str) -> Result<(), ModelError> {
    if ok {
        Ok(())
    } else {
        Err(ModelError::InvalidParameter { dist: function, name, reason: format!("must be {what}, got {v}") })
    }
}

/// Stan's `gamma_p(a, x)`, the regularised lower incomplete gamma function
/// `P(a, x) = (1 / Gamma(a)) int_0^x t^(a-1) e^-t dt`, elementwise and broadcast, differentiable
/// in both `a` and `x`.
///
/// Evaluated on the host in `f64` (Numerical Recipes' series below `x = a + 1`, continued
/// fraction above; the derivative in `a` carried through them, see `dist::special`), one read and
/// one write of the tensors: the number of terms depends on the arguments (about `sqrt a`), so a
/// fixed-length tensor form would be either inaccurate in the tails or hundreds of full-size
/// operations. [`crate::dist::Gamma::lcdf`] and its kin use the log forms, which keep the tails.
///
/// # Errors
/// If an `a` is not finite and `> 0`, or an `x` is negative or NaN (Stan throws there too).
pub fn gamma_p<const D: usize>(a: Tensor<D>, x: Tensor<D>) -> Result<Tensor<D>, ModelError> {
    incomplete_gamma("gamma_p", a, x, true)
}

/// Stan's `gamma_q(a, x) = 1 - gamma_p(a, x)`, the regularised upper incomplete gamma function,
/// computed directly (not as a difference), so a far upper tail keeps its relative precision.
///
/// # Errors
/// As [`gamma_p`].
pub fn gamma_q<const D: usize>(a: Tensor<D>, x: Tensor<D>) -> Result<Tensor<D>, ModelError> {
    incomplete_gamma("gamma_q", a, x, false)
}

fn incomplete_gamma<const D: usize>(
    function: &'static str,
    a: Tensor<D>,
    x: Tensor<D>,
    lower: bool,
) -> Result<Tensor<D>, ModelError> {
    host_elementwise([x, a], |[x, a]| {
        domain(function, "a", a, a > 0.0 && a.is_finite(), "finite and > 0")?;
        domain(function, "x", x, x >= 0.0, ">= 0")?;
        let t = ln_gamma_pq(a, x);
        let (ln, [da, dx]) = if lower { (t.ln_lower, t.d_lower) } else { (t.ln_upper, t.d_upper) };
        let v = ln.exp();
        Ok((v, [v * dx, v * da]))
    })
}

/// Stan's `inc_beta(a, b, x)`, the regularised incomplete beta function
/// `I_x(a, b) = (1 / B(a, b)) int_0^x t^(a-1) (1-t)^(b-1) dt`, elementwise and broadcast,
/// differentiable in `a`, `b` and `x`. On the host in `f64` (the continued fraction, on the
/// reflected side above `x = (a + 1) / (a + b + 2)`), as [`gamma_p`] is.
///
/// # Errors
/// If an `a` or `b` is not finite and `> 0`, or an `x` is outside `[0, 1]`.
pub fn inc_beta<const D: usize>(a: Tensor<D>, b: Tensor<D>, x: Tensor<D>) -> Result<Tensor<D>, ModelError> {
    host_elementwise([x, a, b], |[x, a, b]| {
        domain("inc_beta", "a", a, a > 0.0 && a.is_finite(), "finite and > 0")?;
        domain("inc_beta", "b", b, b > 0.0 && b.is_finite(), "finite and > 0")?;
        domain("inc_beta", "x", x, (0.0..=1.0).contains(&x), "in [0, 1]")?;
        let t = ln_inc_beta(a, b, x);
        let v = t.ln_lower.exp();
        let [da, db, dx] = t.d_lower;
        Ok((v, [v * dx, v * da, v * db]))
    })
}
