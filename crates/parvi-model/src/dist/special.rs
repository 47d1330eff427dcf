//! Special functions on tensors and on the host: the log-gamma function and its ratios, the
//! error function's logarithms, and the incomplete beta function, for normalising constants and
//! cdfs.

use std::f64::consts::PI;

use burn::tensor::{Tensor, TensorData};

use super::LN_2PI;

/// `ln(1 + e^x)` without overflow: `x + ln(1 + e^-x)` above 0, `ln(1 + e^x)` at and below, each
/// on its input clamped to its side, so every derivative is finite and the one at 0 is `1/2`
/// (`max(x, 0) + ln(1 + e^-|x|)` gives 1 there: the kinks of `max` and `|x|` do not cancel).
pub(crate) fn softplus<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    let positive = x.clone().greater_elem(0.0);
    let above = x.clone().clamp_min(0.0);
    let above = above.clone() + above.neg().exp().log1p();
    let below = x.clamp_max(0.0).exp().log1p();
    below.mask_where(positive, above)
}

/// `ln Gamma(x)` elementwise on a tensor, for `x > 0`: Stirling's series at `x + 6` (truncation
/// error below 1e-9) shifted back by `ln(x (x+1) ... (x+5))`. For normalising constants that
/// depend on data (e.g. `ln k!` of Poisson counts); burn has no `lgamma` op.
pub fn ln_gamma_tensor<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    let z = x.clone().add_scalar(6.0);
    let inv = z.clone().recip();
    let inv2 = inv.clone().square();
    // 1/(12 z) - 1/(360 z^3) + 1/(1260 z^5), in Horner form.
    let series = inv * inv2.clone().mul_scalar(1.0 / 1260.0).sub_scalar(1.0 / 360.0).mul(inv2).add_scalar(1.0 / 12.0);
    let stirling = z.clone().log() * z.clone().sub_scalar(0.5) - z + series.add_scalar(0.5 * LN_2PI);
    let pair = |a: f64, b: f64| (x.clone().add_scalar(a) * x.clone().add_scalar(b)).log();
    stirling - pair(0.0, 1.0) - pair(2.0, 3.0) - pair(4.0, 5.0)
}

/// `ln Gamma(a + n) - ln Gamma(a)` elementwise (broadcast), for `a > 0` and `a + n > 0`,
/// without cancelling two large log-gammas: with `z = a + 6`, the Stirling terms of
/// [`ln_gamma_tensor`] difference to `(z - 1/2) ln(1 + n/z) + n (ln(z + n) - 1)` plus the
/// difference of the small series, and the shift terms to `sum_j ln(1 + n / (a + j))`.
/// Where `a` is large (a negative binomial's `phi`, Student-t's `df / 2`) the direct
/// difference loses `ln Gamma(a) * 1e-7` in f32; this keeps the result's own precision.
pub fn ln_gamma_ratio_tensor<const D: usize>(a: Tensor<D>, n: Tensor<D>) -> Tensor<D> {
    let z1 = a.clone().add_scalar(6.0);
    let z2 = z1.clone() + n.clone();
    let main =
        z1.clone().sub_scalar(0.5) * (n.clone() / z1.clone()).log1p() + n.clone() * z2.clone().log().sub_scalar(1.0);
    let mut out = main + stirling_series(z2) - stirling_series(z1);
    for j in 0..6 {
        out = out - (n.clone() / a.clone().add_scalar(f64::from(j))).log1p();
    }
    out
}

/// `1/(12 z) - 1/(360 z^3) + 1/(1260 z^5)`, in Horner form: Stirling's series for `z >= 6`.
fn stirling_series<const D: usize>(z: Tensor<D>) -> Tensor<D> {
    let inv = z.recip();
    let inv2 = inv.clone().square();
    inv * inv2.clone().mul_scalar(1.0 / 1260.0).sub_scalar(1.0 / 360.0).mul(inv2).add_scalar(1.0 / 12.0)
}

/// `ln erfc(u)` for `u >= 0`, in log form so that it never underflows (`u = 30` gives about
/// `-904`): the Chebyshev fit of Numerical Recipes (Press et al. 2007, section 6.2.2,
/// `erfccheb`'s predecessor `erfcc`), `erfc(u) = t exp(-u^2 + P(t))` with `t = 1 / (1 + u/2)`,
/// fractional error below 1.2e-7 for every `u >= 0`. burn's `erf` is accurate in absolute,
/// not relative, terms, so `1 - erf` would lose the tails.
pub(crate) fn log_erfc<const D: usize>(u: Tensor<D>) -> Tensor<D> {
    const C: [f64; 10] = [
        -1.265_512_23,
        1.000_023_68,
        0.374_091_96,
        0.096_784_18,
        -0.186_288_06,
        0.278_868_07,
        -1.135_203_98,
        1.488_515_87,
        -0.822_152_23,
        0.170_872_77,
    ];
    let t = u.clone().mul_scalar(0.5).add_scalar(1.0).recip();
    let mut poly = t.clone().mul_scalar(C[9]);
    for c in C[1..9].iter().rev() {
        poly = poly.add_scalar(*c).mul(t.clone());
    }
    t.log() + poly.add_scalar(C[0]) - u.square()
}

/// `ln erf(u)` for `u >= 0` (`-inf` at 0): the Maclaurin series
/// `erf(u) = (2/sqrt(pi)) sum_k (-1)^k u^(2k+1) / (k! (2k+1))` below `u = 1/2` (8 terms,
/// truncation below 1e-9 relative), `ln(1 - erfc(u))` above (`erfc(1/2) < 1/2`, so the
/// subtraction keeps `erfc`'s relative precision). Each branch sees its input clamped to its
/// own range, so the branch not taken never produces a non-finite gradient.
pub(crate) fn log_erf<const D: usize>(u: Tensor<D>) -> Tensor<D> {
    let small = u.clone().lower_elem(0.5);
    let us = u.clone().clamp(f32::MIN_POSITIVE, 0.5);
    let w = us.clone().square();
    // sum_k (-w)^k / (k! (2k+1)), Horner from k = 7 down.
    let coef = |k: i32| {
        let fact: f64 = (1..=k).map(f64::from).product();
        (-1f64).powi(k) / (fact * f64::from(2 * k + 1))
    };
    let mut s = w.clone().mul_scalar(coef(7));
    for k in (1..7).rev() {
        s = s.add_scalar(coef(k)).mul(w.clone());
    }
    let series = us.log() + s.add_scalar(1.0).log() + (2.0 / PI.sqrt()).ln();
    let large = log_erfc(u.clamp_min(0.5)).exp().neg().log1p();
    large.mask_where(small, series)
}

/// `(ln P(Z <= z), ln P(Z > z))` for a standard normal `Z`, each accurate in its own tail: the
/// smaller probability is `erfc(|z| / sqrt 2) / 2` in log form ([`log_erfc`]), the larger is
/// `ln(1 - small)`. Stan's `normal_lcdf` guards its tails the same way, with other fits.
pub(crate) fn log_normal_cdfs<const D: usize>(z: Tensor<D>) -> (Tensor<D>, Tensor<D>) {
    // Each side's tail on its own clamped input (not on |z|, whose kink would give a zero
    // derivative at z = 0).
    let negative = z.clone().lower_elem(0.0);
    let tail =
        |u: Tensor<D>| log_erfc(u.clamp_min(0.0).mul_scalar(std::f64::consts::FRAC_1_SQRT_2)).sub_scalar(2f64.ln());
    let lower = tail(z.clone().neg()); // ln Phi(z) for z <= 0
    let upper = tail(z); // ln(1 - Phi(z)) for z >= 0
    let body = |t: Tensor<D>| t.exp().neg().log1p();
    let lcdf = body(upper.clone()).mask_where(negative.clone(), lower.clone());
    let lccdf = upper.mask_where(negative, body(lower));
    (lcdf, lccdf)
}

/// `ln erfc(v)` for any real `v`: [`log_erfc`] for `v >= 0`, `ln(2 - erfc(-v))` below (there
/// `erfc(-v) < 1`, so the difference keeps its precision). Each branch on its own clamped input.
pub(crate) fn log_erfc_any<const D: usize>(v: Tensor<D>) -> Tensor<D> {
    let negative = v.clone().lower_elem(0.0);
    let upper = log_erfc(v.clone().clamp_min(0.0));
    let lower = log_erfc(v.neg().clamp_min(0.0)).exp().mul_scalar(-0.5).log1p().add_scalar(2f64.ln());
    upper.mask_where(negative, lower)
}

/// `ln I_0(x)` for `x >= 0`, the modified Bessel function of the first kind of order 0:
/// Abramowitz & Stegun 9.8.1 below `x = 3.75` and 9.8.2 (in `3.75 / x`, times `e^x / sqrt x`,
/// taken in log form so it never overflows) above, relative error below 2e-7. Each branch on
/// its own clamped input.
pub(crate) fn log_bessel_i0<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    const SMALL: [f64; 7] = [1.0, 3.515_622_9, 3.089_942_4, 1.206_749_2, 0.265_973_2, 0.036_076_8, 0.004_581_3];
    const LARGE: [f64; 9] = [
        0.398_942_28,
        0.013_285_92,
        0.002_253_19,
        -0.001_575_65,
        0.009_162_81,
        -0.020_577_06,
        0.026_355_37,
        -0.016_476_33,
        0.003_923_77,
    ];
    let small = x.clone().lower_elem(3.75);
    let t2 = x.clone().clamp_max(3.75).div_scalar(3.75).square();
    let mut poly = t2.clone().mul_scalar(SMALL[6]);
    for c in SMALL[1..6].iter().rev() {
        poly = poly.add_scalar(*c).mul(t2.clone());
    }
    let inner = poly.add_scalar(SMALL[0]).log();
    let xl = x.clamp_min(3.75);
    let u = xl.clone().recip().mul_scalar(3.75);
    let mut poly = u.clone().mul_scalar(LARGE[8]);
    for c in LARGE[1..8].iter().rev() {
        poly = poly.add_scalar(*c).mul(u.clone());
    }
    let outer = poly.add_scalar(LARGE[0]).log() + xl.clone() - xl.log().mul_scalar(0.5);
    outer.mask_where(small, inner)
}

/// `ln I_0(x)` on the host in `f64` for `x >= 0`: the power series `sum_k (x^2/4)^k / (k!)^2`
/// scaled by `e^-x` term by term (no overflow), the asymptotic expansion beyond `x = 500`.
pub(crate) fn log_bessel_i0_host(x: f64) -> f64 {
    if x > 500.0 {
        let inv = 1.0 / (8.0 * x);
        return x - 0.5 * (2.0 * PI * x).ln() + (inv + 4.5 * inv * inv + 37.5 * inv * inv * inv).ln_1p();
    }
    let (mut sum, mut k) = (0.0, 0.0f64);
    loop {
        let ln_term = 2.0 * k * (0.5 * x).ln() - 2.0 * ln_gamma(k + 1.0) - x;
        let term = if x == 0.0 && k == 0.0 { (-x).exp() } else { ln_term.exp() };
        sum += term;
        if k > 0.5 * x && term < 1e-17 * sum {
            break;
        }
        k += 1.0;
    }
    sum.ln() + x
}

/// `ln(1 - e^-y)` for `y > 0`: `ln(y s(y))` with the series `s(y) = (1 - e^-y) / y` below
/// `y = 1/2` (where `1 - e^-y` would cancel), `ln(1 - e^-y)` above; each branch on its own
/// clamped input (see [`log_erf`]).
pub(crate) fn log1m_exp_neg<const D: usize>(y: Tensor<D>) -> Tensor<D> {
    let small = y.clone().lower_elem(0.5);
    let ys = y.clone().clamp(f32::MIN_POSITIVE, 0.5);
    let series = ys.clone().log() + exprel_series(ys.neg()).log();
    let large = y.clamp_min(0.5).neg().exp().neg().log1p();
    large.mask_where(small, series)
}

/// `(e^x - 1) / x = sum_k x^k / (k+1)!` for `|x| <= 1/2`, nested as
/// `1 + x/2 (1 + x/3 (1 + ... (1 + x/11)))`: truncation below 3e-12 relative there. The small
/// branch of [`log1m_exp_neg`] and [`crate::functions::expm1`].
pub(crate) fn exprel_series<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    let mut s = x.clone().mul_scalar(1.0 / 11.0).add_scalar(1.0);
    for k in (2..=10).rev() {
        s = (x.clone() * s).mul_scalar(1.0 / f64::from(k)).add_scalar(1.0);
    }
    s
}

/// `ln P(a, x)` (`lower`) or `ln Q(a, x)` elementwise, broadcast, with gradients in both (see
/// [`ln_gamma_pq`]); NaN where `a <= 0` or `x < 0`.
pub(crate) fn ln_gamma_tail<const D: usize>(a: Tensor<D>, x: Tensor<D>, lower: bool) -> Tensor<D> {
    let Ok(out) = host_elementwise::<D, 2, std::convert::Infallible>([x, a], |[x, a]| {
        let t = ln_gamma_pq(a, x);
        let (v, [da, dx]) = if lower { (t.ln_lower, t.d_lower) } else { (t.ln_upper, t.d_upper) };
        Ok((v, [dx, da]))
    });
    out
}

/// `ln I_x(a, b)` (`lower`) or `ln(1 - I_x(a, b))` elementwise, broadcast, with gradients in all
/// three (see [`ln_inc_beta`]); NaN where `a <= 0`, `b <= 0` or `x` is outside `[0, 1]`.
pub(crate) fn ln_inc_beta_tail<const D: usize>(a: Tensor<D>, b: Tensor<D>, x: Tensor<D>, lower: bool) -> Tensor<D> {
    let Ok(out) = host_elementwise::<D, 3, std::convert::Infallible>([x, a, b], |[x, a, b]| {
        let t = ln_inc_beta(a, b, x);
        let (v, [da, db, dx]) = if lower { (t.ln_lower, t.d_lower) } else { (t.ln_upper, t.d_upper) };
        Ok((v, [dx, da, db]))
    });
    out
}

/// The regularised incomplete beta function `I_x(a, b)` for `a, b > 0`, `x` in `[0, 1]`
/// (the continued fraction of [`ln_inc_beta`]; relative error near 1e-14).
pub(crate) fn regularized_incomplete_beta(a: f64, b: f64, x: f64) -> f64 {
    ln_inc_beta(a, b, x).ln_lower.exp()
}

/// A number and its derivatives along `N` directions (forward-mode differentiation): a series
/// or a continued fraction evaluated on these carries its derivative with respect to a shape
/// parameter term by term, the way Stan math's `grad_reg_lower_inc_gamma` and `inc_beta_dda`
/// differentiate theirs, without finite differences.
#[derive(Clone, Copy, Debug)]
struct Dual<const N: usize> {
    v: f64,
    d: [f64; N],
}

impl<const N: usize> Dual<N> {
    fn constant(v: f64) -> Self {
        Self { v, d: [0.0; N] }
    }

    /// The variable of direction `i`.
    fn var(v: f64, i: usize) -> Self {
        let mut d = [0.0; N];
        d[i] = 1.0;
        Self { v, d }
    }

    fn add(self, o: Self) -> Self {
        Self { v: self.v + o.v, d: std::array::from_fn(|i| self.d[i] + o.d[i]) }
    }

    fn add_c(self, c: f64) -> Self {
        Self { v: self.v + c, ..self }
    }

    fn mul(self, o: Self) -> Self {
        Self { v: self.v * o.v, d: std::array::from_fn(|i| self.d[i] * o.v + self.v * o.d[i]) }
    }

    fn scale(self, c: f64) -> Self {
        Self { v: self.v * c, d: self.d.map(|d| d * c) }
    }

    fn recip(self) -> Self {
        let r = 1.0 / self.v;
        Self { v: r, d: self.d.map(|d| -d * r * r) }
    }

    fn div(self, o: Self) -> Self {
        self.mul(o.recip())
    }

    /// Whether the value and every derivative moved by less than `eps` relative to `of`.
    fn small_against(self, of: Self, eps: f64) -> bool {
        self.v.abs() <= eps * of.v.abs() && self.d.iter().zip(&of.d).all(|(d, o)| d.abs() <= eps * o.abs() + 1e-300)
    }
}

/// Iterations allowed to a series or continued fraction: each needs about `sqrt` of its
/// shape parameter (Numerical Recipes, section 6.2), so this covers shapes up to about 1e8.
const MAX_TERMS: usize = 100_000;

/// `ln(1 - e^l)` for `l <= 0` in `f64` (Maechler's switch at `-ln 2`).
fn log1m_exp_host(l: f64) -> f64 {
    if l > -std::f64::consts::LN_2 { (-l.exp_m1()).ln() } else { (-l.exp()).ln_1p() }
}

/// Both tails of a cdf in log form and the derivatives of each with respect to the cdf's
/// arguments (the shape parameters, then the variable), as the host kernels of
/// [`crate::functions::gamma_p`] and [`crate::functions::inc_beta`] return them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LogTails<const K: usize> {
    pub ln_lower: f64,
    pub ln_upper: f64,
    pub d_lower: [f64; K],
    pub d_upper: [f64; K],
}

impl<const K: usize> LogTails<K> {
    /// The tails from the one computed directly (`ln_small`, with its derivatives), the other
    /// as its complement: `d ln(1 - p) = -p / (1 - p) d ln p`.
    fn from_one(ln_small: f64, d_small: [f64; K], small_is_lower: bool) -> Self {
        let ln_other = log1m_exp_host(ln_small);
        let ratio = (ln_small - ln_other).exp();
        let d_other = d_small.map(|d| -ratio * d);
        if small_is_lower {
            Self { ln_lower: ln_small, ln_upper: ln_other, d_lower: d_small, d_upper: d_other }
        } else {
            Self { ln_lower: ln_other, ln_upper: ln_small, d_lower: d_other, d_upper: d_small }
        }
    }

    fn constant(ln_lower: f64, ln_upper: f64) -> Self {
        Self { ln_lower, ln_upper, d_lower: [0.0; K], d_upper: [0.0; K] }
    }

    fn nan() -> Self {
        Self::constant(f64::NAN, f64::NAN)
    }
}

/// `(ln P(a, x), ln Q(a, x))`, the regularised lower and upper incomplete gamma functions, with
/// their derivatives with respect to `(a, x)`, for `a > 0` and `x >= 0` (NaN otherwise).
///
/// Numerical Recipes' split (section 6.2): below `x = a + 1` the series
/// `P = x^a e^-x / Gamma(a + 1) sum_n x^n / ((a + 1) ... (a + n))` (DLMF 8.7.1), above it the
/// continued fraction for `Q` (DLMF 8.9.2, modified Lentz); the other tail is the complement,
/// which is never small on its side of the split. Both are summed in log form, so a far tail
/// (`ln Q(2, 800)`) is finite. The derivative in `a` is the series' (the fraction's) own,
/// carried term by term as a dual number (Stan math's `grad_reg_lower_inc_gamma` differentiates
/// the same series); the one in `x` is the density `x^(a-1) e^-x / Gamma(a)` over the tail.
pub(crate) fn ln_gamma_pq(a: f64, x: f64) -> LogTails<2> {
    if !(a > 0.0 && a.is_finite()) || x.is_nan() || x < 0.0 {
        return LogTails::nan();
    }
    if x == 0.0 {
        return LogTails::constant(f64::NEG_INFINITY, 0.0);
    }
    if x.is_infinite() {
        return LogTails::constant(0.0, f64::NEG_INFINITY);
    }
    let lx = x.ln();
    let ln_density = (a - 1.0) * lx - x - ln_gamma(a);
    let ad = Dual::<1>::var(a, 0);
    if x < a + 1.0 {
        // sum_n t_n with t_0 = 1, t_n = t_{n-1} x / (a + n).
        let (mut term, mut sum) = (Dual::constant(1.0), Dual::constant(1.0));
        for n in 1..MAX_TERMS {
            term = term.mul(ad.add_c(n as f64).recip()).scale(x);
            sum = sum.add(term);
            if term.small_against(sum, 1e-17) {
                break;
            }
        }
        // ln P = a ln x - x - ln Gamma(a + 1) + ln S.
        let ln_p = a * lx - x - ln_gamma(a + 1.0) + sum.v.ln();
        let d_a = lx - digamma_host(a + 1.0) + sum.d[0] / sum.v;
        let d_x = (ln_density - ln_p).exp();
        LogTails::from_one(ln_p, [d_a, d_x], true)
    } else {
        // Q = x^a e^-x / Gamma(a) h, h = 1 / (x + 1 - a - 1 (1 - a) / (x + 3 - a - ...)).
        let h = lentz(|i| {
            if i == 0 {
                return (Dual::constant(1.0), ad.scale(-1.0).add_c(x + 1.0));
            }
            let fi = i as f64;
            // a_i = -i (i - a), b_i = x + 2i + 1 - a.
            (ad.add_c(-fi).scale(fi), ad.scale(-1.0).add_c(x + 2.0 * fi + 1.0))
        });
        let ln_q = a * lx - x - ln_gamma(a) + h.v.ln();
        let d_a = lx - digamma_host(a) + h.d[0] / h.v;
        let d_x = -(ln_density - ln_q).exp();
        LogTails::from_one(ln_q, [d_a, d_x], false)
    }
}

/// `(ln I_x(a, b), ln(1 - I_x(a, b)))`, the regularised incomplete beta function and its
/// complement, with their derivatives with respect to `(a, b, x)`, for `a, b > 0` and `x` in
/// `[0, 1]` (NaN otherwise).
///
/// The continued fraction of DLMF 8.17.22 (Numerical Recipes' `betacf`, modified Lentz) below
/// `x = (a + 1) / (a + b + 2)`, and on the reflected side `I_x(a, b) = 1 - I_{1-x}(b, a)`, where
/// it converges fast; its derivatives in `a` and `b` are carried through the fraction as dual
/// numbers (Stan math's `inc_beta_dda` / `inc_beta_ddb` differentiate a series instead), the one
/// in `x` is the density `x^(a-1) (1-x)^(b-1) / B(a, b)` over the tail.
pub(crate) fn ln_inc_beta(a: f64, b: f64, x: f64) -> LogTails<3> {
    if !(a > 0.0 && a.is_finite() && b > 0.0 && b.is_finite()) || x.is_nan() || !(0.0..=1.0).contains(&x) {
        return LogTails::nan();
    }
    if x == 0.0 {
        return LogTails::constant(f64::NEG_INFINITY, 0.0);
    }
    if x == 1.0 {
        return LogTails::constant(0.0, f64::NEG_INFINITY);
    }
    let (lx, l1x) = (x.ln(), (-x).ln_1p());
    let ln_b = ln_gamma(a) + ln_gamma(b) - ln_gamma(a + b);
    let ln_density = (a - 1.0) * lx + (b - 1.0) * l1x - ln_b;
    let dig_ab = digamma_host(a + b);
    // ln(x^p (1-x)^q / (p B(p, q)) cf(p, q, x)) with its derivatives in (p, q).
    let side = |p: f64, q: f64, y: f64, ly: f64, l1y: f64| {
        let h = beta_continued_fraction(Dual::<2>::var(p, 0), Dual::var(q, 1), y);
        let ln = p * ly + q * l1y - ln_b - p.ln() + h.v.ln();
        let d_p = ly - digamma_host(p) + dig_ab - 1.0 / p + h.d[0] / h.v;
        let d_q = l1y - digamma_host(q) + dig_ab + h.d[1] / h.v;
        (ln, d_p, d_q)
    };
    if x < (a + 1.0) / (a + b + 2.0) {
        let (ln, d_a, d_b) = side(a, b, x, lx, l1x);
        LogTails::from_one(ln, [d_a, d_b, (ln_density - ln).exp()], true)
    } else {
        let (ln, d_b, d_a) = side(b, a, 1.0 - x, l1x, lx);
        LogTails::from_one(ln, [d_a, d_b, -(ln_density - ln).exp()], false)
    }
}

/// The continued fraction `1 / (1 + d_1 / (1 + d_2 / (1 + ...)))` of DLMF 8.17.22 with
/// `d_{2m+1} = -(p + m)(p + q + m) y / ((p + 2m)(p + 2m + 1))` and
/// `d_{2m} = m (q - m) y / ((p + 2m - 1)(p + 2m))`, on dual numbers.
fn beta_continued_fraction<const N: usize>(p: Dual<N>, q: Dual<N>, y: f64) -> Dual<N> {
    let one = Dual::constant(1.0);
    lentz(|i| {
        if i == 0 {
            return (one, one);
        }
        let m = (i / 2) as f64;
        let d = if i % 2 == 1 {
            // -(p + m)(p + q + m) y / ((p + 2m)(p + 2m + 1))
            p.add_c(m).mul(p.add(q).add_c(m)).scale(-y).div(p.add_c(2.0 * m).mul(p.add_c(2.0 * m + 1.0)))
        } else {
            // m (q - m) y / ((p + 2m - 1)(p + 2m))
            q.add_c(-m).scale(m * y).div(p.add_c(2.0 * m - 1.0).mul(p.add_c(2.0 * m)))
        };
        (d, one)
    })
}

/// The continued fraction `a_0 / (b_0 + a_1 / (b_1 + a_2 / (b_2 + ...)))` on dual numbers,
/// `terms(i) = (a_i, b_i)`: the denominator by the modified Lentz method (Numerical Recipes,
/// section 5.2), stopped when both its value and its derivatives have settled to 1e-15.
fn lentz<const N: usize>(terms: impl Fn(usize) -> (Dual<N>, Dual<N>)) -> Dual<N> {
    const TINY: f64 = 1e-300;
    let guard = |v: Dual<N>| if v.v.abs() < TINY { Dual { v: TINY, ..v } } else { v };
    let (a0, b0) = terms(0);
    let mut g = guard(b0);
    let (mut c, mut d) = (g, Dual::constant(0.0));
    for i in 1..MAX_TERMS {
        let (ai, bi) = terms(i);
        d = guard(bi.add(ai.mul(d))).recip();
        c = guard(bi.add(ai.div(c)));
        let delta = c.mul(d);
        g = g.mul(delta);
        // g' changes by g' (delta - 1) + g delta': both parts below 1e-15 of g'.
        let settled = (delta.v - 1.0).abs() <= 1e-15
            && delta.d.iter().zip(&g.d).all(|(dd, gd)| (dd * g.v).abs() <= 1e-15 * gd.abs() + 1e-300);
        if settled {
            break;
        }
    }
    a0.div(g)
}

/// The digamma function `psi(x)` on the host in `f64` for `x > 0`: the recurrence
/// `psi(x) = psi(x + 1) - 1 / x` up to `x >= 10`, then the asymptotic series
/// `ln x - 1/(2x) - sum_k B_2k / (2k x^2k)` (DLMF 5.11.2, six terms; error below 1e-15).
pub(crate) fn digamma_host(x: f64) -> f64 {
    let (mut x, mut shift) = (x, 0.0);
    while x < 10.0 {
        shift -= 1.0 / x;
        x += 1.0;
    }
    let w = 1.0 / (x * x);
    // B_2k / 2k for k = 1..6: 1/12, -1/120, 1/252, -1/240, 1/132, -691/32760.
    let series = w
        * (1.0 / 12.0
            - w * (1.0 / 120.0 - w * (1.0 / 252.0 - w * (1.0 / 240.0 - w * (1.0 / 132.0 - w * 691.0 / 32_760.0)))));
    shift + x.ln() - 0.5 / x - series
}

/// `f` evaluated elementwise on the host in `f64` over the broadcast of `inputs`, as a tensor
/// (in the first input's dtype, on its device) whose gradient with respect to each tracked input
/// is the partial derivative `f` returns beside the value: `v + sum_k (t_k - detach(t_k)) g_k`,
/// which is `v` in value (the way [`crate::functions::inv_Phi`] sets its derivative).
///
/// For special functions whose series or continued fractions need a number of terms that
/// depends on the arguments (the incomplete gamma and beta functions): one read and one write
/// of the broadcast shape, a memory copy on the CPU backends and a synchronisation on a GPU. A
/// non-finite partial derivative (at an end of the support, where the value is `0` or `-inf`)
/// is set to 0, so the product with an untracked zero never puts a NaN into the value. The
/// first error `f` returns (an argument outside the function's domain) is returned instead.
pub(crate) fn host_elementwise<const D: usize, const K: usize, E>(
    inputs: [Tensor<D>; K],
    f: impl Fn([f64; K]) -> Result<(f64, [f64; K]), E>,
) -> Result<Tensor<D>, E> {
    let shape: [usize; D] = std::array::from_fn(|axis| inputs.iter().map(|t| t.dims()[axis]).max().unwrap_or(1));
    let (device, dtype) = (inputs[0].device(), inputs[0].dtype());
    let read = |t: &Tensor<D>| -> Vec<f64> {
        t.clone()
            .without_autodiff()
            .expand(shape)
            .into_data()
            .convert::<f64>()
            .try_into_vec::<f64>()
            .unwrap_or_default()
    };
    let columns: Vec<Vec<f64>> = inputs.iter().map(read).collect();
    let len: usize = shape.iter().product();
    let mut value = Vec::with_capacity(len);
    let mut grads = vec![Vec::with_capacity(len); K];
    let point = |i: usize| -> [f64; K] { std::array::from_fn(|k| columns[k][i]) };
    for i in 0..len {
        let (v, g) = f(point(i))?;
        value.push(v);
        for (col, gk) in grads.iter_mut().zip(g) {
            col.push(if gk.is_finite() { gk } else { 0.0 });
        }
    }
    let tensor = |values: Vec<f64>| Tensor::<D>::from_data(TensorData::new(values, shape), (&device, dtype));
    let mut out = tensor(value);
    for (t, g) in inputs.into_iter().zip(grads) {
        if t.is_tracked() {
            out = out + (t.clone() - t.detach()) * tensor(g);
        }
    }
    Ok(out)
}

/// `ln Gamma(x)` for `x > 0` (Lanczos, g = 7, n = 9; relative error below 1e-13).
pub fn ln_gamma(x: f64) -> f64 {
    const COEF: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Gamma(x) Gamma(1 - x) = pi / sin(pi x).
        return (PI / (PI * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let t = x + 7.5;
    let series = COEF[1..].iter().enumerate().fold(COEF[0], |acc, (i, c)| acc + c / (x + i as f64 + 1.0));
    0.5 * LN_2PI + (x + 0.5) * t.ln() - t + series.ln()
}

/// Gauss-Legendre's 24 points on `[-1, 1]`, the positive half (the rule is symmetric).
const GL24_X: [f64; 12] = [
    0.064_056_892_862_605_63,
    0.191_118_867_473_616_3,
    0.315_042_679_696_163_4,
    0.433_793_507_626_045_1,
    0.545_421_471_388_839_6,
    0.648_093_651_936_975_5,
    0.740_124_191_578_554_4,
    0.820_001_985_973_903,
    0.886_415_527_004_401_1,
    0.938_274_552_002_732_8,
    0.974_728_555_971_309_5,
    0.995_187_219_997_021_3,
];
const GL24_W: [f64; 12] = [
    0.127_938_195_346_752_02,
    0.125_837_456_346_828_25,
    0.121_670_472_927_803_3,
    0.115_505_668_053_725_52,
    0.107_444_270_115_965_56,
    0.097_618_652_104_113_93,
    0.086_190_161_531_953_2,
    0.073_346_481_411_080_16,
    0.059_298_584_915_436_36,
    0.044_277_438_817_419_41,
    0.028_531_388_628_933_56,
    0.012_341_229_799_988_69,
];
/// Gauss-Laguerre's 32 points and weights, for `int_0^inf e^-s g(s) ds`.
const LAG32_X: [f64; 32] = [
    0.04448936583326739,
    0.23452610951961825,
    0.5768846293018863,
    1.072448753817818,
    1.7224087764446456,
    2.5283367064257942,
    3.492213273021994,
    4.616456769749767,
    5.903958504174244,
    7.358126733186241,
    8.982940924212597,
    10.78301863253997,
    12.763697986742725,
    14.931139755522558,
    17.292454336715316,
    19.855860940336054,
    22.630889013196775,
    25.628636022459247,
    28.862101816323474,
    32.346629153964734,
    36.10049480575197,
    40.14571977153944,
    44.50920799575494,
    49.22439498730864,
    54.33372133339691,
    59.89250916213402,
    65.97537728793505,
    72.68762809066271,
    80.18744697791352,
    88.7353404178924,
    98.82954286828398,
    111.7513980979377,
];
const LAG32_W: [f64; 32] = [
    0.10921834195242515,
    0.2104431079387924,
    0.23521322966984298,
    0.19590333597287354,
    0.1299837862860684,
    0.07057862386571556,
    0.03176091250917397,
    0.011918214834838204,
    0.003738816294611417,
    0.0009808033066149246,
    0.0002148649188013578,
    3.920341967987801e-05,
    5.934541612868448e-06,
    7.41640457866734e-07,
    7.604567879120552e-08,
    6.350602226625618e-09,
    4.281382971040738e-10,
    2.305899491891237e-11,
    9.799379288726772e-13,
    3.2378016577291567e-14,
    8.171823443420549e-16,
    1.542133833393811e-17,
    2.119792290163547e-19,
    2.0544296737880036e-21,
    1.3469825866373617e-23,
    5.661294130397462e-26,
    1.4185605454629684e-28,
    1.9133754944539943e-31,
    1.1922487600982012e-34,
    2.6715112192396625e-38,
    1.3386169421064243e-42,
    4.5105361938987784e-48,
];

/// A row `[1, K]` of host constants in `like`'s device and dtype.
fn constant_row(values: Vec<f64>, like: &Tensor<2>) -> Tensor<2> {
    let k = values.len();
    Tensor::<2>::from_data(TensorData::new(values, [1, k]), (&like.device(), like.dtype()))
}

/// The 24 Gauss-Legendre points mapped to `[0, 1]` (`(x + 1) / 2`) and their weights halved:
/// `int_0^c f = c sum_i w_i f(c x_i)`.
fn legendre_unit(like: &Tensor<2>) -> (Tensor<2>, Tensor<2>) {
    let xs: Vec<f64> = GL24_X.iter().map(|x| 0.5 * (1.0 - x)).chain(GL24_X.iter().map(|x| 0.5 * (1.0 + x))).collect();
    let ws: Vec<f64> = GL24_W.iter().chain(GL24_W.iter()).map(|w| 0.5 * w).collect();
    (constant_row(xs, like), constant_row(ws, like))
}

/// Owen's `T(h, a) = 1/(2 pi) int_0^a e^(-h^2 (1 + x^2) / 2) / (1 + x^2) dx` for `h >= 0` and
/// `-1 <= a <= 1`, columns `[m, 1]`: 24-point Gauss-Legendre in `x` for `h <= 1`, and for
/// `h > 1` in `u = h x` on `[0, h a]` (cut at `+-10`), `e^(-h^2/2) / (2 pi h) int e^(-u^2/2) / (1 +
/// u^2/h^2) du`, whose integrand is smooth on the scale of the interval (the `x` form's peak
/// has width `1/h`). Both forms stay finite for every input, so the mask never carries a NaN.
/// Odd in `a` as written (`-1 <= a <= 1`).
fn owens_t_reduced(h: Tensor<2>, a: Tensor<2>) -> Tensor<2> {
    let (xs, ws) = legendre_unit(&h);
    let x = a.clone() * xs.clone();
    let one_x2 = x.square().add_scalar(1.0);
    let fx = (h.clone().square() * one_x2.clone()).mul_scalar(-0.5).exp() / one_x2;
    let small_h = (fx * ws.clone()).sum_dim(1) * a.clone() / (2.0 * PI);
    let hu = h.clone().clamp_min(1.0);
    let top = (hu.clone() * a).clamp(-10.0, 10.0);
    let u2 = (top.clone() * xs).square();
    let fu = u2.clone().mul_scalar(-0.5).exp() / (u2 / hu.clone().square()).add_scalar(1.0);
    let scale = hu.clone().square().mul_scalar(-0.5).exp() / hu.mul_scalar(2.0 * PI);
    let large_h = (fu * ws).sum_dim(1) * top * scale;
    large_h.mask_where(h.lower_equal_elem(1.0), small_h)
}

/// Owen's `T(h, a)` for columns `[m, 1]` of any reals: even in `h`, odd in `a`; for `|a| > 1`
/// the reduction (Owen 1956) `T(h, a) = (Phi(h) Phi(-a h) + Phi(a h) Phi(-h)) / 2 - T(a h, 1/a)`
/// (`h, a >= 0`), its first term a sum of positive products, so nothing cancels there.
/// Relative error about 1e-13 against scipy's `owens_t` where the normal cdfs are exact; here
/// they come from [`log_normal_cdfs`] (1.2e-7).
pub(crate) fn owens_t_columns(h: Tensor<2>, a: Tensor<2>) -> Tensor<2> {
    // The small-|a| form is odd in `a` by itself (so its derivative at a = 0 is right); the
    // reduction runs on |a| > 1, where the sign is locally constant.
    let h = h.abs();
    let small_a = owens_t_reduced(h.clone(), a.clone().clamp(-1.0, 1.0));
    let sign = a.clone().sign();
    let a = a.abs();
    let a_big = a.clone().clamp_min(1.0);
    let ah = a_big.clone() * h.clone();
    let (ln_h, ln_not_h) = log_normal_cdfs(h);
    let (ln_ah, ln_not_ah) = log_normal_cdfs(ah.clone());
    let bracket = ((ln_h + ln_not_ah).exp() + (ln_ah + ln_not_h).exp()).mul_scalar(0.5);
    let large_a = bracket - owens_t_reduced(ah, a_big.recip());
    (large_a * sign).mask_where(a.lower_equal_elem(1.0), small_a)
}

/// `ln F(z)` of the standard skew normal with shape `alpha`, `F(z) = 2 int_-inf^z phi(t)
/// Phi(alpha t) dt`, columns `[m, 1]`. In the bulk Stan's form `Phi(z) - 2 T(z, alpha)`
/// ([`owens_t_columns`]). In the lower tail, where that difference cancels (for `alpha > 0`
/// `T > 0` and `F` is the small difference of two larger terms), the integral itself: with `l(t) = ln phi(t) + ln Phi(alpha t)`
/// (concave) and `k = l'(z) = -z + alpha phi(alpha z) / Phi(alpha z)`, `t = z - s / k` gives
/// `F = 2 e^l(z) / k int_0^inf e^-s g(s) ds`, `g(s) = e^(l(z - s/k) - l(z) + s) <= 1`, which
/// 32-point Gauss-Laguerre integrates to about 1e-7 in `ln F` where `k^2 >= (1 + alpha^2) / 2`
/// (then `ln g ~ -(1 + alpha^2) s^2 / (2 k^2)` is at most `-s^2`, smooth on the nodes' scale),
/// 1e-9 where `k^2 >= 4 (1 + alpha^2)`. Outside that region `F` is not small, so the bulk form
/// keeps about 1.5e-6 of it (the normal cdf fit's 1.2e-7 over `F`). Checked against adaptive
/// quadrature of the density (mpmath, 40 digits) for `alpha` from -20 to 200, `z` to -40.
pub(crate) fn skew_normal_log_cdf_columns(z: Tensor<2>, alpha: Tensor<2>) -> Tensor<2> {
    let ln_phi = |t: Tensor<2>| t.square().mul_scalar(-0.5).sub_scalar(0.5 * LN_2PI);
    let ell = |t: Tensor<2>, alpha: Tensor<2>| ln_phi(t.clone()) + log_normal_cdfs(alpha * t).0;
    let az = alpha.clone() * z.clone();
    let mills = (ln_phi(az.clone()) - log_normal_cdfs(az).0).exp();
    let kappa = z.clone().neg() + alpha.clone() * mills;
    let tail = kappa
        .clone()
        .greater_elem(0.0)
        .bool_and(kappa.clone().square().greater_equal(alpha.clone().square().add_scalar(1.0).mul_scalar(0.5)));
    // Off the tail the Laguerre form runs with k = 1, finite and unused.
    let k = kappa.ones_like().mask_where(tail.clone(), kappa);
    let s = constant_row(LAG32_X.to_vec(), &z);
    let ln_w = constant_row(LAG32_W.iter().map(|w| w.ln()).collect(), &z);
    let ell_z = ell(z.clone(), alpha.clone());
    let nodes = z.clone() - s.clone() / k.clone();
    let terms = ell(nodes, alpha.clone()) - ell_z.clone() + s + ln_w;
    let ln_tail = (crate::tensor_ops::log_sum_exp(terms, 1) + ell_z - k.log()).add_scalar(std::f64::consts::LN_2);
    let direct = log_normal_cdfs(z.clone()).0.exp() - owens_t_columns(z, alpha).mul_scalar(2.0);
    let ln_direct = direct.clamp_min(f32::MIN_POSITIVE).log();
    ln_direct.mask_where(tail, ln_tail)
}

/// `a` and `b` expanded to their common (broadcast) shape.
pub(crate) fn broadcast_pair<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> (Tensor<D>, Tensor<D>) {
    let (da, db) = (a.dims(), b.dims());
    let mut dims = da;
    for (d, e) in dims.iter_mut().zip(db) {
        *d = (*d).max(e);
    }
    let a = if da == dims { a } else { a.expand(dims) };
    let b = if db == dims { b } else { b.expand(dims) };
    (a, b)
}

/// A function of columns `[m, 1]` applied to two tensors of any (broadcastable) shapes.
pub(crate) fn on_columns<const D: usize>(
    a: Tensor<D>,
    b: Tensor<D>,
    f: impl FnOnce(Tensor<2>, Tensor<2>) -> Tensor<2>,
) -> Tensor<D> {
    let (a, b) = broadcast_pair(a, b);
    let dims = a.dims();
    let m = dims.iter().product();
    f(a.reshape([m, 1]), b.reshape([m, 1])).reshape(dims)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ln_gamma_matches_factorials_and_half_integers() {
        for (x, expected) in [(1.0, 0.0), (2.0, 0.0), (5.0, 24f64.ln()), (0.5, PI.sqrt().ln()), (10.0, 362_880f64.ln())]
        {
            assert!((ln_gamma(x) - expected).abs() < 1e-10, "ln_gamma({x})");
        }
    }
}
