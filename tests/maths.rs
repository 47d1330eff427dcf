//! The mathematics checked independently of the code under test:
//!
//! - every distribution's `log_prob` against host `f64` formulas at random parameters, with
//!   `ln Gamma` from Stirling's series (not the library's Lanczos sum), and the continuous
//!   densities' normalisation by quadrature (no `ln Gamma` at all);
//! - every constraint transform's log-Jacobian against finite differences of the transform;
//! - the score (autodiff gradient of the log density) of every shipped model against finite
//!   differences along random directions at random points.
//!
//! Tolerances: the library computes in `f32`, so a value is compared to `32 eps_f32 (1 + s)`,
//! `s` the sum of the magnitudes of the formula's terms (each term carries a rounding error of a
//! few `eps` relative to its size). A finite difference is extrapolated (Richardson) from steps
//! `h` and `h/2`; its error is bounded by the two estimates' gap plus the rounding of the
//! differenced values (`eps |f| / h`).

mod common;

use std::f64::consts::PI;

use common::flex;
use parvi::model::burn::tensor::{Device, Int, Tensor, TensorData};
use parvi::model::dist::{
    Bernoulli, Beta, Categorical, Cauchy, Exponential, Gamma, HalfCauchy, Laplace, LogNormal, LogProb, Normal, Poisson,
    StudentT, ln_gamma, ln_gamma_tensor, log_mix,
};
use parvi::model::tensor_ops::{matrix_from_vec, to_vec_f32};
use parvi::model::{Activation, LayerOps, LogDensity, ParamLayout, score};
use parvi::models::{Bnn, BnnConfig, BnnTask, WeightPrior};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};

const EPS32: f64 = f32::EPSILON as f64;

fn runner(cases: u32, seed: u64) -> TestRunner {
    TestRunner::new(Config { cases, rng_seed: RngSeed::Fixed(seed), failure_persistence: None, ..Config::default() })
}

fn run<S: Strategy>(cases: u32, seed: u64, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>) {
    if let Err(e) = runner(cases, seed).run(&strategy, test) {
        panic!("{e}");
    }
}

fn vector(values: &[f64], device: &Device) -> Tensor<1> {
    Tensor::from_data(TensorData::new(values.iter().map(|&v| v as f32).collect::<Vec<_>>(), [values.len()]), device)
}

/// The `f32` the library sees for `v`, back in `f64`: references are evaluated there, so that
/// input rounding is not counted as error.
fn f32_of(v: f64) -> f64 {
    v as f32 as f64
}

/// `ln Gamma(x)`, `x > 0`: the recurrence `ln Gamma(x) = ln Gamma(x + 1) - ln x` up to `x >= 10`,
/// then Stirling's series to the `z^-9` term (truncation below 1e-13 there).
fn ln_gamma_ref(x: f64) -> f64 {
    let (mut z, mut shift) = (x, 0.0);
    while z < 10.0 {
        shift += z.ln();
        z += 1.0;
    }
    let (inv, inv2) = (1.0 / z, 1.0 / (z * z));
    let series =
        inv * (1.0 / 12.0 - inv2 * (1.0 / 360.0 - inv2 * (1.0 / 1260.0 - inv2 * (1.0 / 1680.0 - inv2 / 1188.0))));
    (z - 0.5) * z.ln() - z + 0.5 * (2.0 * PI).ln() + series - shift
}

/// Asserts each library value equals its reference within `32 eps (1 + scale)`.
fn close(got: &[f32], want: &[(f64, f64)], what: &str) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), want.len());
    for (i, (&g, &(w, scale))) in got.iter().zip(want).enumerate() {
        let tol = 32.0 * EPS32 * (1.0 + scale);
        prop_assert!((g as f64 - w).abs() <= tol, "{what}, entry {i}: {g} vs {w} (tolerance {tol:.2e})");
    }
    Ok(())
}

/// Sixteen points `lo + (hi - lo) u` from unit draws `u`, as `f32` values.
fn points(u: &[f64], lo: f64, hi: f64) -> Vec<f64> {
    u.iter().map(|u| f32_of(lo + (hi - lo) * u)).collect()
}

fn units() -> impl Strategy<Value = Vec<f64>> {
    proptest::collection::vec(0.0..1.0f64, 16)
}

#[test]
fn ln_gamma_matches_stirling_and_exact_values() {
    // The reference itself, against exact values: (n-1)! and Gamma(1/2) = sqrt(pi).
    for (x, exact) in
        [(1.0, 0.0), (3.0, 2f64.ln()), (7.0, 720f64.ln()), (0.5, PI.sqrt().ln()), (1.5, (PI.sqrt() / 2.0).ln())]
    {
        assert!((ln_gamma_ref(x) - exact).abs() < 1e-12, "reference at {x}");
    }
    let device = flex();
    run(64, 1, (1e-3..60.0f64, units()), |(top, u)| {
        let x = points(&u, 1e-3, top);
        for &v in &x {
            // Lanczos on the host: relative 1e-13 claimed.
            prop_assert!(
                (ln_gamma(v) - ln_gamma_ref(v)).abs() <= 1e-11 * (1.0 + ln_gamma_ref(v).abs()),
                "ln_gamma({v})"
            );
        }
        let got = to_vec_f32(&ln_gamma_tensor(vector(&x, &device)));
        // In f32, Stirling at x + 6 subtracts logs of magnitude ln(x (x+1) ... (x+5)).
        let want: Vec<(f64, f64)> = x
            .iter()
            .map(|&v| {
                (
                    ln_gamma_ref(v),
                    ln_gamma_ref(v).abs()
                        + (0..6).map(|k| (v + k as f64).ln().abs()).sum::<f64>()
                        + (v + 6.0) * (v + 6.0).ln(),
                )
            })
            .collect();
        close(&got, &want, "ln_gamma_tensor")
    });
}

#[test]
fn location_scale_densities_match_their_formulas() {
    let device = flex();
    let half_ln_2pi = 0.5 * (2.0 * PI).ln();
    run(48, 2, (-5.0..5.0f64, 0.05..20.0f64, 0.3..30.0f64, units()), |(m, s, df, u)| {
        let x = points(&u, m - 6.0 * s, m + 6.0 * s);
        let t = vector(&x, &device);
        let z = |v: f64| (v - m) / s;
        let normal: Vec<(f64, f64)> = x
            .iter()
            .map(|&v| (-0.5 * z(v).powi(2) - s.ln() - half_ln_2pi, 0.5 * z(v).powi(2) + s.ln().abs() + 1.0))
            .collect();
        close(&to_vec_f32(&Normal::new(m, s).unwrap().log_prob(t.clone())), &normal, "Normal")?;
        let cauchy: Vec<(f64, f64)> = x
            .iter()
            .map(|&v| (-PI.ln() - s.ln() - z(v).powi(2).ln_1p(), 2.0 + s.ln().abs() + z(v).powi(2).ln_1p()))
            .collect();
        close(&to_vec_f32(&Cauchy::new(m, s).unwrap().log_prob(t.clone())), &cauchy, "Cauchy")?;
        let laplace: Vec<(f64, f64)> =
            x.iter().map(|&v| (-(2.0 * s).ln() - z(v).abs(), (2.0 * s).ln().abs() + z(v).abs())).collect();
        close(&to_vec_f32(&Laplace::new(m, s).unwrap().log_prob(t.clone())), &laplace, "Laplace")?;
        let c = ln_gamma_ref(0.5 * (df + 1.0)) - ln_gamma_ref(0.5 * df) - 0.5 * (df * PI).ln();
        let student: Vec<(f64, f64)> = x
            .iter()
            .map(|&v| {
                let tail = 0.5 * (df + 1.0) * (z(v).powi(2) / df).ln_1p();
                (c - s.ln() - tail, c.abs() + s.ln().abs() + tail + 1.0)
            })
            .collect();
        close(&to_vec_f32(&StudentT::new(df, m, s).unwrap().log_prob(t.clone())), &student, "StudentT")?;
        // A per-element scale tensor (the `[n, 1]` prior-precision form), broadcast.
        let scales: Vec<f64> = u.iter().map(|u| f32_of(s * (0.5 + u))).collect();
        let per: Vec<(f64, f64)> = x
            .iter()
            .zip(&scales)
            .map(|(&v, &sc)| {
                let z = (v - m) / sc;
                (-0.5 * z * z - sc.ln() - half_ln_2pi, 0.5 * z * z + sc.ln().abs() + 1.0)
            })
            .collect();
        close(
            &to_vec_f32(&Normal::new(m, vector(&scales, &device)).unwrap().log_prob(t.clone())),
            &per,
            "Normal, tensor scale",
        )?;
        // The iid sum by the sufficient statistic.
        let sum = to_vec_f32(&Normal::new(m, s).unwrap().log_prob_sum(t.reshape([1, 16]), 1));
        let want = normal.iter().map(|p| p.0).sum::<f64>();
        close(&sum, &[(want, normal.iter().map(|p| p.1).sum())], "Normal::log_prob_sum")
    });
}

#[test]
fn positive_densities_match_their_formulas() {
    let device = flex();
    run(48, 3, (0.2..25.0f64, 0.05..10.0f64, -2.0..2.0f64, 0.1..3.0f64, units()), |(shape, rate, mu, sigma, u)| {
        let x = points(&u, 1e-3, 8.0 * (shape / rate).max(1.0));
        let t = vector(&x, &device);
        let lg = ln_gamma_ref(shape);
        let gamma: Vec<(f64, f64)> = x
            .iter()
            .map(|&v| {
                let terms = [shape * rate.ln(), (shape - 1.0) * v.ln(), -rate * v, -lg];
                (terms.iter().sum(), terms.iter().map(|t| t.abs()).sum())
            })
            .collect();
        close(&to_vec_f32(&Gamma::new(shape, rate).unwrap().log_prob(t.clone())), &gamma, "Gamma")?;
        let expo: Vec<(f64, f64)> = x.iter().map(|&v| (rate.ln() - rate * v, rate.ln().abs() + rate * v)).collect();
        close(&to_vec_f32(&Exponential::new(rate).unwrap().log_prob(t.clone())), &expo, "Exponential")?;
        let half: Vec<(f64, f64)> = x
            .iter()
            .map(|&v| {
                let terms = [(2.0 / PI).ln(), -sigma.ln(), -(v / sigma).powi(2).ln_1p()];
                (terms.iter().sum(), terms.iter().map(|t| t.abs()).sum())
            })
            .collect();
        close(&to_vec_f32(&HalfCauchy::new(sigma).unwrap().log_prob(t.clone())), &half, "HalfCauchy")?;
        let lognormal: Vec<(f64, f64)> = x
            .iter()
            .map(|&v| {
                let z = (v.ln() - mu) / sigma;
                let terms = [-v.ln(), -sigma.ln(), -0.5 * (2.0 * PI).ln(), -0.5 * z * z];
                (terms.iter().sum(), terms.iter().map(|t| t.abs()).sum())
            })
            .collect();
        close(&to_vec_f32(&LogNormal::new(mu, sigma).unwrap().log_prob(t.clone())), &lognormal, "LogNormal")?;
        // Outside the support: -inf, not NaN.
        let outside = to_vec_f32(&Gamma::new(shape, rate).unwrap().log_prob(vector(&[-1.0, 0.0], &device)));
        prop_assert!(outside.iter().all(|v| *v == f32::NEG_INFINITY), "Gamma outside its support: {outside:?}");
        Ok(())
    });
}

#[test]
fn beta_bernoulli_categorical_poisson_and_log_mix_match_their_formulas() {
    let device = flex();
    let strategy = (0.3..20.0f64, 0.3..20.0f64, proptest::collection::vec(-30.0..30.0f64, 16), units(), 0.01..0.99f64);
    run(48, 4, strategy, |(a, b, logits, u, theta)| {
        let x = points(&u, 1e-3, 1.0 - 1e-3);
        let lb = ln_gamma_ref(a) + ln_gamma_ref(b) - ln_gamma_ref(a + b);
        let beta: Vec<(f64, f64)> = x
            .iter()
            .map(|&v| {
                let terms = [(a - 1.0) * v.ln(), (b - 1.0) * (-v).ln_1p(), -lb];
                (terms.iter().sum(), terms.iter().map(|t| t.abs()).sum::<f64>() + ln_gamma_ref(a + b).abs())
            })
            .collect();
        close(&to_vec_f32(&Beta::new(a, b).unwrap().log_prob(vector(&x, &device))), &beta, "Beta")?;

        let logits: Vec<f64> = logits.into_iter().map(f32_of).collect();
        let labels: Vec<f64> = u.iter().map(|u| if *u < 0.5 { 0.0 } else { 1.0 }).collect();
        // log sigma(l) = -softplus(-l), log(1 - sigma(l)) = -softplus(l), in stable form.
        let softplus = |l: f64| l.max(0.0) + (-l.abs()).exp().ln_1p();
        let bern: Vec<(f64, f64)> =
            logits.iter().zip(&labels).map(|(&l, &y)| (y * l - softplus(l), l.abs() + softplus(l))).collect();
        let got = Bernoulli::from_logits(vector(&logits, &device)).log_prob(vector(&labels, &device));
        close(&to_vec_f32(&got), &bern, "Bernoulli")?;

        // Four rows of four classes.
        let rows: Vec<&[f64]> = logits.chunks(4).collect();
        let picks: Vec<i64> = u.iter().take(4).map(|u| (u * 4.0).floor() as i64).collect();
        let cat: Vec<(f64, f64)> = rows
            .iter()
            .zip(&picks)
            .map(|(r, &k)| {
                let max = r.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let lse = max + r.iter().map(|l| (l - max).exp()).sum::<f64>().ln();
                (r[k as usize] - lse, r[k as usize].abs() + lse.abs())
            })
            .collect();
        let logit_matrix = matrix_from_vec(logits.iter().map(|&v| v as f32).collect(), 4, 4, &device);
        let label_tensor = Tensor::<2, Int>::from_data(TensorData::new(picks.clone(), [4, 1]), &device);
        let got = Categorical::from_logits(logit_matrix).log_prob(label_tensor);
        close(&to_vec_f32(&got), &cat, "Categorical")?;

        // Counts 0..15 at log rates in [-3, 3].
        let eta: Vec<f64> = u.iter().map(|u| f32_of(6.0 * u - 3.0)).collect();
        let counts: Vec<f64> = (0..16).map(f64::from).collect();
        let pois: Vec<(f64, f64)> = counts
            .iter()
            .zip(&eta)
            .map(|(&k, &e)| {
                let terms = [k * e, -e.exp(), -ln_gamma_ref(k + 1.0)];
                // `ln k!` comes from Stirling at k + 7 in f32: its rounding scales with (k + 7) ln(k + 7).
                (terms.iter().sum(), terms.iter().map(|t| t.abs()).sum::<f64>() + (k + 7.0) * (k + 7.0).ln())
            })
            .collect();
        let got = Poisson::from_log_rate(vector(&eta, &device)).log_prob(vector(&counts, &device));
        close(&to_vec_f32(&got), &pois, "Poisson")?;

        // log_mix of two component log-densities far apart and close together.
        let (lp1, lp2): (Vec<f64>, Vec<f64>) =
            logits.iter().zip(u.iter()).map(|(&l, &u)| (f32_of(l - 10.0), f32_of(-10.0 + 40.0 * u))).unzip();
        let want: Vec<(f64, f64)> = lp1
            .iter()
            .zip(&lp2)
            .map(|(&x, &y)| {
                let (p, q) = (theta.ln() + x, (-theta).ln_1p() + y);
                let max = p.max(q);
                (max + ((p - max).exp() + (q - max).exp()).ln(), x.abs() + y.abs() + theta.ln().abs())
            })
            .collect();
        let theta_t = vector(&[theta; 16], &device);
        let got = log_mix(theta_t, vector(&lp1, &device), vector(&lp2, &device));
        close(&to_vec_f32(&got), &want, "log_mix")
    });
}

/// Simpson's rule over `[a, b]` with `n` (even) intervals.
fn simpson(f: impl Fn(f64) -> f64, a: f64, b: f64, n: usize) -> f64 {
    let h = (b - a) / n as f64;
    let inner: f64 = (1..n).map(|i| f(a + i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 }).sum();
    h / 3.0 * (f(a) + f(b) + inner)
}

/// `exp(log_prob)` of a distribution at host points, computed by the library.
fn density(lp: &dyn Fn(Tensor<1>) -> Tensor<1>, xs: &[f64], device: &Device) -> Vec<f64> {
    to_vec_f32(&lp(vector(xs, device))).iter().map(|&v| (v as f64).exp()).collect()
}

#[test]
fn continuous_densities_integrate_to_one() {
    // Quadrature needs no ln Gamma: it checks the normalising constants by themselves. Heavy
    // tails are integrated in u with x = m + s tan(u); positive supports in t with x = e^t.
    let device = flex();
    let n = 20_000;
    let real_line = |lp: &dyn Fn(Tensor<1>) -> Tensor<1>, m: f64, s: f64| {
        let us: Vec<f64> = (0..=n).map(|i| -PI / 2.0 + 1e-9 + (PI - 2e-9) * i as f64 / n as f64).collect();
        let xs: Vec<f64> = us.iter().map(|u| m + s * u.tan()).collect();
        let p = density(lp, &xs, &device);
        let f = |i: usize| p[i] * s / us[i].cos().powi(2);
        let h = (PI - 2e-9) / n as f64;
        h / 3.0 * (f(0) + f(n) + (1..n).map(|i| f(i) * if i % 2 == 1 { 4.0 } else { 2.0 }).sum::<f64>())
    };
    let half_line = |lp: &dyn Fn(Tensor<1>) -> Tensor<1>, lo: f64, hi: f64| {
        let ts: Vec<f64> = (0..=n).map(|i| lo + (hi - lo) * i as f64 / n as f64).collect();
        let xs: Vec<f64> = ts.iter().map(|t| t.exp()).collect();
        let p = density(lp, &xs, &device);
        let h = (hi - lo) / n as f64;
        let f = |i: usize| p[i] * xs[i];
        h / 3.0 * (f(0) + f(n) + (1..n).map(|i| f(i) * if i % 2 == 1 { 4.0 } else { 2.0 }).sum::<f64>())
    };
    let check = |what: &str, integral: f64| assert!((integral - 1.0).abs() < 2e-4, "{what} integrates to {integral}");
    check("Normal(1, 2)", real_line(&|t| Normal::new(1.0, 2.0).unwrap().log_prob(t), 1.0, 2.0));
    check("Cauchy(-1, 0.5)", real_line(&|t| Cauchy::new(-1.0, 0.5).unwrap().log_prob(t), -1.0, 0.5));
    check("Laplace(0, 3)", real_line(&|t| Laplace::new(0.0, 3.0).unwrap().log_prob(t), 0.0, 3.0));
    // (df < 1 would leave an integrable singularity at the ends of the u range.)
    for df in [1.0, 2.5, 30.0] {
        check(&format!("StudentT({df})"), real_line(&|t| StudentT::new(df, 0.5, 1.5).unwrap().log_prob(t), 0.5, 1.5));
    }
    for (shape, rate) in [(0.8, 2.0), (3.5, 0.5), (20.0, 4.0)] {
        check(
            &format!("Gamma({shape}, {rate})"),
            half_line(&|t| Gamma::new(shape, rate).unwrap().log_prob(t), -30.0, 6.0),
        );
    }
    check("Exponential(0.7)", half_line(&|t| Exponential::new(0.7).unwrap().log_prob(t), -30.0, 5.0));
    check("LogNormal(0.3, 0.8)", half_line(&|t| LogNormal::new(0.3, 0.8).unwrap().log_prob(t), -8.0, 8.0));
    // HalfCauchy's tail decays as 1/x^2 in x, so as e^-t in t: a long range.
    check("HalfCauchy(2)", half_line(&|t| HalfCauchy::new(2.0).unwrap().log_prob(t), -40.0, 40.0));
    for (a, b) in [(0.9, 0.9), (2.0, 5.0), (12.0, 3.0)] {
        // In logit space: x = sigmoid(t), dx = x (1 - x) dt.
        let ts: Vec<f64> = (0..=n).map(|i| -40.0 + 80.0 * i as f64 / n as f64).collect();
        let xs: Vec<f64> = ts.iter().map(|t| 1.0 / (1.0 + (-t).exp())).collect();
        let inside: Vec<f64> = xs.iter().map(|x| x.clamp(1e-7, 1.0 - 1e-7)).collect();
        let p = density(&|t| Beta::new(a, b).unwrap().log_prob(t), &inside, &device);
        let integral = simpson(
            |t| {
                let i = (((t + 40.0) / 80.0) * n as f64).round() as usize;
                p[i] * xs[i] * (1.0 - xs[i])
            },
            -40.0,
            40.0,
            n,
        );
        check(&format!("Beta({a}, {b})"), integral);
    }
}

#[test]
fn student_t_cdf_matches_quadrature() {
    for (df, loc, scale, x) in
        [(1.0, 0.0, 1.0, 2.0), (3.0, 1.0, 2.0, -4.0), (7.5, -2.0, 0.5, -1.0), (50.0, 0.0, 1.0, 0.3)]
    {
        let t = StudentT::<1>::new(df, loc, scale).unwrap();
        let c = ln_gamma_ref(0.5 * (df + 1.0)) - ln_gamma_ref(0.5 * df) - 0.5 * (df * PI).ln() - f64::ln(scale);
        let pdf = |v: f64| (c - 0.5 * (df + 1.0) * (((v - loc) / scale).powi(2) / df).ln_1p()).exp();
        // P(X <= x) = integral over u in (-pi/2, atan((x - loc)/scale)) with v = loc + scale tan u.
        let top = ((x - loc) / scale).atan();
        let cdf = simpson(|u| pdf(loc + scale * u.tan()) * scale / u.cos().powi(2), -PI / 2.0 + 1e-12, top, 200_000);
        assert!((t.lcdf(x).unwrap() - cdf.ln()).abs() < 1e-7, "lcdf df {df}: {} vs {}", t.lcdf(x).unwrap(), cdf.ln());
        assert!((t.lccdf(x).unwrap() - (1.0 - cdf).ln()).abs() < 1e-7, "lccdf df {df}");
    }
}

// ---------------------------------------------------------------------------------------------
// Constraint transforms.

/// A matrix of host `f64` values, row by row.
type Matrix = Vec<Vec<f64>>;

/// The Jacobian `dy/dx` of `f` at `x` by central differences extrapolated from `h` and `h/2`,
/// with an error bound per entry (the two estimates' gap plus the rounding of `f`).
fn jacobian(f: &dyn Fn(&[Vec<f64>]) -> Matrix, x: &[f64], h: f64) -> (Matrix, Matrix) {
    let d = x.len();
    let mut rows = Vec::new();
    for j in 0..d {
        for step in [h, -h, h / 2.0, -h / 2.0] {
            let mut p = x.to_vec();
            p[j] += step;
            rows.push(p);
        }
    }
    let ys = f(&rows);
    let m = ys[0].len();
    let scale = ys.iter().flatten().fold(0.0f64, |a, v| a.max(v.abs()));
    let (mut jac, mut err) = (vec![vec![0.0; d]; m], vec![vec![0.0; d]; m]);
    for j in 0..d {
        let [p1, m1, p2, m2] = [&ys[4 * j], &ys[4 * j + 1], &ys[4 * j + 2], &ys[4 * j + 3]];
        for i in 0..m {
            let d1 = (p1[i] - m1[i]) / (2.0 * h);
            let d2 = (p2[i] - m2[i]) / h;
            jac[i][j] = (4.0 * d2 - d1) / 3.0;
            err[i][j] = (d2 - d1).abs() + 8.0 * EPS32 * (1.0 + scale) / h;
        }
    }
    (jac, err)
}

/// `ln |det a|` by Gaussian elimination with partial pivoting.
fn ln_abs_det(mut a: Vec<Vec<f64>>) -> f64 {
    let n = a.len();
    let mut out = 0.0;
    for c in 0..n {
        let p = (c..n).max_by(|&i, &j| a[i][c].abs().total_cmp(&a[j][c].abs())).unwrap();
        a.swap(c, p);
        out += a[c][c].abs().ln();
        for r in c + 1..n {
            let f = a[r][c] / a[c][c];
            let pivot_row = a[c].clone();
            for (entry, pivot) in a[r][c..n].iter_mut().zip(&pivot_row[c..n]) {
                *entry -= f * pivot;
            }
        }
    }
    out
}

#[test]
fn constraint_log_jacobians_match_finite_differences() {
    let device = flex();
    let strategy = (-3.0..3.0f64, 0.1..20.0f64, proptest::collection::vec(-3.0..3.0f64, 9));
    run(32, 5, strategy, |(lower, width, x)| {
        let layout = ParamLayout::new()
            .real("r", &[2])
            .unwrap()
            .positive("p", &[2])
            .unwrap()
            .interval("i", &[1], lower, lower + width)
            .unwrap()
            .ordered("o", 4)
            .unwrap();
        let x: Vec<f64> = x.into_iter().map(f32_of).collect();
        let forward = |rows: &[Vec<f64>]| -> Vec<Vec<f64>> {
            let flat: Vec<f32> = rows.iter().flatten().map(|&v| v as f32).collect();
            let y = to_vec_f32(&layout.constrain(matrix_from_vec(flat, rows.len(), 9, &device)));
            y.chunks(9).map(|r| r.iter().map(|&v| v as f64).collect()).collect()
        };
        let (jac, err) = jacobian(&forward, &x, 1e-2);
        // The library's log-Jacobian, for the point itself.
        let unpacked = layout.unpack(matrix_from_vec(x.iter().map(|&v| v as f32).collect(), 1, 9, &device));
        let got = to_vec_f32(&unpacked.log_jacobian())[0] as f64;
        // Block-diagonal (each block depends on its own coordinates only) and, within the
        // ordered block, lower-triangular: every other entry is zero.
        let blocks = [0..2, 2..4, 4..5, 5..9];
        for (i, row) in jac.iter().enumerate() {
            for (j, &v) in row.iter().enumerate() {
                let same_block = blocks.iter().any(|b| b.contains(&i) && b.contains(&j));
                let structural_zero = !same_block || (i < 5 && i != j) || (i >= 5 && j > i);
                if structural_zero {
                    prop_assert!(v.abs() <= 2.0 * err[i][j], "d y{i} / d x{j} = {v}, expected 0");
                }
            }
        }
        let want = ln_abs_det(jac.clone());
        // ln|det| moves by the relative error of each diagonal entry (the matrix is triangular).
        let tol: f64 =
            (0..9).map(|k| 2.0 * err[k][k] / jac[k][k].abs()).sum::<f64>() + 32.0 * EPS32 * (1.0 + want.abs());
        prop_assert!(
            (got - want).abs() <= tol,
            "log-Jacobian {got} vs finite differences {want} (tolerance {tol:.2e}) at {x:?}"
        );
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------------
// Scores of the shipped models.

/// Checks `score(model)` at `points` (row-major `[n, dim]`) against finite differences of
/// `log_prob` along `directions` random unit directions per point.
fn score_matches_finite_differences(name: &str, model: &dyn LogDensity, points: &[f64], seed: u64, device: &Device) {
    let dim = model.dim();
    let n = points.len() / dim;
    let x = matrix_from_vec(points.iter().map(|&v| v as f32).collect(), n, dim, device);
    let s = score(model, x, None).unwrap();
    let (lp, grad) = (to_vec_f32(&s.log_prob), to_vec_f32(&s.grad));
    assert!(lp.iter().chain(&grad).all(|v| v.is_finite()), "{name}: non-finite log density or score");
    let mut rng = parvi::infer::EngineRng::new(seed);
    let directions = 3;
    // Rows: for each point and direction, x + t v for t in (h, -h, h/2, -h/2).
    let h = 2e-2;
    let mut rows = Vec::new();
    let mut dirs = Vec::new();
    for p in 0..n {
        for _ in 0..directions {
            let v: Vec<f64> = (0..dim).map(|_| rng.normal()).collect();
            let norm = v.iter().map(|a| a * a).sum::<f64>().sqrt();
            let v: Vec<f64> = v.iter().map(|a| a / norm).collect();
            for t in [h, -h, h / 2.0, -h / 2.0] {
                rows.extend((0..dim).map(|k| (points[p * dim + k] + t * v[k]) as f32));
            }
            dirs.push((p, v));
        }
    }
    let f = to_vec_f32(&model.log_prob(matrix_from_vec(rows, 4 * dirs.len(), dim, device), None));
    let mut worst = 0.0f64;
    for (k, (p, v)) in dirs.iter().enumerate() {
        let [a, b, c, d] = [0, 1, 2, 3].map(|i| f[4 * k + i] as f64);
        let (d1, d2) = ((a - b) / (2.0 * h), (c - d) / h);
        let fd = (4.0 * d2 - d1) / 3.0;
        let g: Vec<f64> = grad[p * dim..(p + 1) * dim].iter().map(|&v| v as f64).collect();
        let gv: f64 = g.iter().zip(v).map(|(g, v)| g * v).sum();
        let g_norm = g.iter().map(|a| a * a).sum::<f64>().sqrt();
        let scale = [a, b, c, d].iter().fold(0.0f64, |m, v| m.max(v.abs()));
        // Extrapolation error, the rounding of the differenced f32 values, and the f32 rounding
        // of the autodiff score itself.
        let tol = 2.0 * (d2 - d1).abs() + 16.0 * EPS32 * (1.0 + scale) / h + 1e-4 * (1.0 + g_norm);
        assert!(
            (fd - gv).abs() <= tol,
            "{name}, point {p}, direction {k}: score . v = {gv}, finite differences {fd} (tolerance {tol:.2e})"
        );
        worst = worst.max((fd - gv).abs() / (1.0 + g_norm));
    }
    eprintln!("{name}: directional derivatives agree to {worst:.1e} relative to |score|");
}

/// Seeded standard-normal values.
fn normals(n: usize, seed: u64, sd: f64) -> Vec<f64> {
    let mut rng = parvi::infer::EngineRng::new(seed);
    (0..n).map(|_| sd * rng.normal()).collect()
}

/// A Gaussian whose log density has a detached linear term: its autodiff score misses the
/// term's gradient (0.01 per coordinate), which the finite differences see.
struct WrongScore;

impl LogDensity for WrongScore {
    fn dim(&self) -> usize {
        4
    }
    fn log_prob(&self, x: Tensor<2>, _: Option<&parvi::model::Minibatch>) -> Tensor<1> {
        let [n, _] = x.dims();
        let quad = x.clone().square().sum_dim(1).mul_scalar(-0.5);
        (quad + x.detach().sum_dim(1).mul_scalar(0.01)).reshape([n])
    }
}

#[test]
#[should_panic(expected = "finite differences")]
fn the_score_check_catches_a_score_off_by_one_percent_of_a_unit() {
    let device = flex();
    score_matches_finite_differences("WrongScore", &WrongScore, &normals(8, 40, 1.0), 41, &device);
}

#[test]
fn scores_of_the_built_in_and_analytic_models_match_finite_differences() {
    let device = flex();
    for name in parvi::models::BUILTIN_TARGETS {
        let target = parvi::models::builtin_target(name, &device).unwrap();
        score_matches_finite_differences(name, target.density.as_ref(), &normals(8, 1, 1.5), 10, &device);
    }
    // A 5-D Gaussian with a random SPD covariance A A^T + I.
    let a = normals(25, 2, 1.0);
    let cov: Vec<f64> = (0..25)
        .map(|ij| {
            let (i, j) = (ij / 5, ij % 5);
            (0..5).map(|k| a[i * 5 + k] * a[j * 5 + k]).sum::<f64>() + if i == j { 1.0 } else { 0.0 }
        })
        .collect();
    let gaussian = parvi::models::Gaussian::new(&normals(5, 3, 1.0), &cov, &device).unwrap();
    score_matches_finite_differences("Gaussian (5-D)", &gaussian, &normals(20, 4, 2.0), 11, &device);
    let mixture =
        parvi::models::GaussianMixture::new(&normals(9, 5, 2.0), 3, &[0.5, 1.0, 2.0], &[0.2, 0.3, 0.5], &device)
            .unwrap();
    score_matches_finite_differences("GaussianMixture (3-D)", &mixture, &normals(12, 6, 2.0), 12, &device);
    let unit = parvi::models::UnitMixture::new(normals(12, 7, 1.0), 4, &device).unwrap();
    score_matches_finite_differences("UnitMixture (3-D)", &unit, &normals(9, 8, 1.5), 13, &device);
    let exp_mix = parvi::models::ExponentialMixture::new(&[0.5, 3.0], &[0.3, 0.7], &device).unwrap();
    score_matches_finite_differences("ExponentialMixture", &exp_mix, &normals(4, 9, 1.0), 14, &device);
    let rbm = parvi::models::GaussBernoulliRbm::new(
        &normals(8, 10, 0.5),
        &normals(4, 11, 0.5),
        &normals(2, 12, 0.5),
        &device,
    )
    .unwrap();
    score_matches_finite_differences("GaussBernoulliRbm (4-D, 2 hidden)", &rbm, &normals(12, 13, 1.5), 15, &device);
    let banana = parvi::models::Banana::default();
    score_matches_finite_differences("Banana", &banana, &normals(8, 14, 1.0), 16, &device);
}

#[test]
fn scores_of_the_data_models_match_finite_differences() {
    let device = flex();
    let (rows, features) = (40, 3);
    let x = normals(rows * features, 20, 1.0);
    let y_reg: Vec<f64> = x.chunks(features).map(|r| r[0] - 0.5 * r[1] * r[2]).collect();
    let y_bin: Vec<f64> = y_reg.iter().map(|&v| if v > 0.0 { 1.0 } else { 0.0 }).collect();
    let y_cls: Vec<f64> = y_reg
        .iter()
        .map(|&v| {
            if v < -0.5 {
                0.0
            } else if v < 0.5 {
                1.0
            } else {
                2.0
            }
        })
        .collect();
    let blr = parvi::models::LogisticRegression::new(&x, &y_bin, features, &device).unwrap();
    score_matches_finite_differences("LogisticRegression", &blr, &normals(3 * blr.dim(), 21, 0.5), 22, &device);
    // BNNs with a smooth activation (a ReLU kink inside the difference step would break the
    // comparison, not the score), both layer implementations, both priors and both tasks.
    for ops in [LayerOps::Fused, LayerOps::Plain] {
        for (task, y, prior) in [
            (BnnTask::Regression, &y_reg, WeightPrior::Hierarchical),
            (BnnTask::Regression, &y_reg, WeightPrior::Fixed(2.0)),
            (BnnTask::Classification { classes: 3 }, &y_cls, WeightPrior::Hierarchical),
            (BnnTask::Classification { classes: 2 }, &y_bin, WeightPrior::Fixed(1.0)),
        ] {
            let config = BnnConfig { hidden: vec![6, 4], activation: Activation::Tanh, task, prior, layer_ops: ops };
            let bnn = Bnn::from_config(&x, y, features, &config, &device).unwrap();
            let start = to_vec_f32(&bnn.init(3, 23, &device).unwrap()).iter().map(|&v| v as f64).collect::<Vec<_>>();
            let name = format!("Bnn ({ops:?}, {task:?}, {prior:?})");
            score_matches_finite_differences(&name, &bnn, &start, 24, &device);
        }
    }
}

#[test]
fn scores_of_the_posteriordb_models_match_finite_differences() {
    let Some(dir) = common::posteriordb_dir("scores_of_the_posteriordb_models_match_finite_differences") else {
        return;
    };
    let device = flex();
    for (i, name) in parvi::models::posteriordb::NAMES.iter().enumerate() {
        let model = parvi::models::posteriordb::load(name, &dir, &device).unwrap();
        let density = model.model();
        // Stan's initialisation range, (-2, 2) in the unconstrained space.
        let mut rng = parvi::infer::EngineRng::new(30 + i as u64);
        let points: Vec<f64> = (0..2 * density.dim()).map(|_| 4.0 * rng.uniform() - 2.0).collect();
        score_matches_finite_differences(name, density, &points, 31 + i as u64, &device);
    }
}
