//! Special functions on tensors and on the host: the log-gamma function and its ratios, the
//! error function's logarithms, and the incomplete beta function, for normalising constants and
//! cdfs.

use std::f64::consts::PI;

use burn::tensor::Tensor;

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
    // s(y) = sum_k (-y)^k / (k+1)!, nested: 1 - y/2 (1 - y/3 (1 - ...)), 10 terms.
    let mut s = ys.clone().mul_scalar(-1.0 / 11.0).add_scalar(1.0);
    for k in (2..=10).rev() {
        s = (ys.clone() * s).mul_scalar(-1.0 / f64::from(k)).add_scalar(1.0);
    }
    let series = ys.log() + s.log();
    let large = y.clamp_min(0.5).neg().exp().neg().log1p();
    large.mask_where(small, series)
}

/// The regularised incomplete beta function `I_x(a, b)` for `a, b > 0`, `x` in `[0, 1]`
/// (continued fraction, modified Lentz; relative error near 1e-14).
pub(crate) fn regularized_incomplete_beta(a: f64, b: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let ln_front = ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (-x).ln_1p();
    // The continued fraction converges fast for x < (a + 1) / (a + b + 2); use the symmetry
    // I_x(a, b) = 1 - I_{1-x}(b, a) on the other side.
    if x < (a + 1.0) / (a + b + 2.0) {
        ln_front.exp() * beta_continued_fraction(a, b, x) / a
    } else {
        1.0 - ln_front.exp() * beta_continued_fraction(b, a, 1.0 - x) / b
    }
}

fn beta_continued_fraction(a: f64, b: f64, x: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let (qab, qap, qam) = (a + b, a + 1.0, a - 1.0);
    let mut c = 1.0;
    let mut d = 1.0 - qab * x / qap;
    if d.abs() < TINY {
        d = TINY;
    }
    d = 1.0 / d;
    let mut h = d;
    for m in 1..=500 {
        let m = f64::from(m);
        let m2 = 2.0 * m;
        for aa in [m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))] {
            d = 1.0 + aa * d;
            if d.abs() < TINY {
                d = TINY;
            }
            c = 1.0 + aa / c;
            if c.abs() < TINY {
                c = TINY;
            }
            d = 1.0 / d;
            h *= d * c;
        }
        if (d * c - 1.0).abs() < 1e-15 {
            break;
        }
    }
    h
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
