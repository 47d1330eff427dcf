//! Stan's function library in the DSL (issue 43): links and special functions, the new
//! distributions, index arrays and the linear scan, each against an independent `f64`
//! evaluation written here from the Stan Functions Reference's definitions (Numerical Recipes'
//! log-gamma and incomplete gamma, exact digamma values, quadrature of densities, sums of
//! probability mass functions), and autodiff gradients against central differences of those.
//!
//! The tensors are `f64` on flex, so a comparison measures the library's formulas and fits
//! (the erfc fit's 1.2e-7, the Bessel fits' 2e-7), not `f32` rounding; a few checks run in `f32`
//! too, where the stable forms matter most (the tails).

use std::f64::consts::{LN_2, PI};

use parvi_model::burn::tensor::{DType, Device, Tensor, TensorData};
use parvi_model::dist::{
    BernoulliLogit, BernoulliLogitGlm, Beta, BetaBinomial, Binomial, BinomialLogitGlm, CategoricalLogit,
    CategoricalLogitGlm, DirichletMultinomial, ExpModNormal, Frechet, Gamma, GaussianDlmObs, Gumbel, InvGamma,
    InvWishart, InvWishartCholesky, Laplace, LkjCorr, LkjCorrCholesky, LogLogistic, LogNormal, LogProb, Logistic,
    MultiGp, MultiNormal, MultiNormalPrec, MultiStudentT, Multinomial, NegBinomial, NegBinomial2, NegBinomial2LogGlm,
    NormalIdGlm, OrderedLogistic, OrderedLogisticGlm, OrderedProbit, Pareto, ParetoType2, PoissonLog, PoissonLogGlm,
    Rayleigh, SkewDoubleExponential, SkewNormal, StudentT, Uniform, VonMises, Weibull, Wishart, WishartCholesky,
};
use parvi_model::functions::{
    Phi, Phi_approx, binary_log_loss, cumulative_sum, diag_pre_multiply, digamma, expm1, gamma_p, gamma_q, inc_beta,
    inv_Phi, inv_cloglog, inv_logit, lbeta, lchoose, lgamma, lmgamma, log_diff_exp, log_falling_factorial,
    log_inv_logit, log_inv_logit_diff, log_rising_factorial, log_sum_exp_pair, log1m, log1m_exp, log1m_inv_logit,
    log1p_exp, logit, owens_t, quad_form_diag, softmax, std_normal_lccdf, std_normal_lcdf, trace_quad_form, trigamma,
};
use parvi_model::grad::value_and_grad;
use parvi_model::index::{IndexArray, gather};
use parvi_model::linalg::{Matern, matern_cov, periodic_cov};
use parvi_model::scan::{linear_scan, recurrence as scan_recurrence};
use parvi_model::{BackendKind, ModelError};

const EULER: f64 = 0.577_215_664_901_532_9;

// ---------------------------------------------------------------------------------------------
// Independent f64 references.

/// `ln Gamma(x)`, Numerical Recipes' `gammln` (Lanczos g = 5, six terms; error below 2e-10).
fn lgamma_ref(x: f64) -> f64 {
    const COF: [f64; 6] = [
        76.180_091_729_471_46,
        -86.505_320_329_416_77,
        24.014_098_240_830_91,
        -1.231_739_572_450_155,
        0.120_865_097_386_617_9e-2,
        -0.539_523_938_495_3e-5,
    ];
    let mut tmp = x + 5.5;
    tmp -= (x + 0.5) * tmp.ln();
    let mut ser = 1.000_000_000_190_015;
    for (j, c) in COF.iter().enumerate() {
        ser += c / (x + 1.0 + j as f64);
    }
    -tmp + (2.506_628_274_631_000_5 * ser / x).ln()
}

/// `(ln P(a, x), ln Q(a, x))`: the series below `a + 1`, the continued fraction above.
fn ln_incomplete_gamma(a: f64, x: f64) -> (f64, f64) {
    let ln_front = -x + a * x.ln() - lgamma_ref(a);
    if x < a + 1.0 {
        let (mut ap, mut del, mut sum) = (a, 1.0 / a, 1.0 / a);
        for _ in 0..10_000 {
            ap += 1.0;
            del *= x / ap;
            sum += del;
            if del.abs() < sum.abs() * 1e-17 {
                break;
            }
        }
        let lp = ln_front + sum.ln();
        (lp, (-lp.exp()).ln_1p())
    } else {
        let tiny = 1e-300;
        let mut b = x + 1.0 - a;
        let (mut c, mut d) = (1.0 / tiny, 1.0 / b);
        let mut h = d;
        for i in 1..10_000 {
            let an = -(i as f64) * (i as f64 - a);
            b += 2.0;
            d = an * d + b;
            if d.abs() < tiny {
                d = tiny;
            }
            c = b + an / c;
            if c.abs() < tiny {
                c = tiny;
            }
            d = 1.0 / d;
            let del = d * c;
            h *= del;
            if (del - 1.0).abs() < 1e-16 {
                break;
            }
        }
        let lq = ln_front + h.ln();
        ((-lq.exp()).ln_1p(), lq)
    }
}

/// `(ln Phi(z), ln(1 - Phi(z)))` from `erfc(u) = Q(1/2, u^2)`.
fn ln_phi_ref(z: f64) -> (f64, f64) {
    if z == 0.0 {
        return (-LN_2, -LN_2);
    }
    let tail = ln_incomplete_gamma(0.5, z * z / 2.0).1 - LN_2;
    let body = (-tail.exp()).ln_1p();
    if z < 0.0 { (tail, body) } else { (body, tail) }
}

fn phi_ref(z: f64) -> f64 {
    ln_phi_ref(z).0.exp()
}

fn normal_density(z: f64) -> f64 {
    (-0.5 * z * z).exp() / (2.0 * PI).sqrt()
}

/// `ln erfc(v)` for any real `v`.
fn ln_erfc_ref(v: f64) -> f64 {
    // erfc(v) = 2 (1 - Phi(v sqrt 2)).
    LN_2 + ln_phi_ref(v * 2f64.sqrt()).1
}

/// `ln I_0(k)` by the trapezoid rule on `(1/pi) int_0^pi e^(k (cos t - 1)) dt` (periodic and
/// smooth: the rule converges geometrically), plus `k`.
fn ln_bessel_i0_ref(k: f64) -> f64 {
    let m = 20_000;
    let h = PI / m as f64;
    let mut s = 0.0;
    for i in 0..=m {
        let w = if i == 0 || i == m { 0.5 } else { 1.0 };
        s += w * (k * ((i as f64 * h).cos() - 1.0)).exp();
    }
    (s * h / PI).ln() + k
}

fn log_inv_logit_ref(x: f64) -> f64 {
    if x < 0.0 { x - x.exp().ln_1p() } else { -(-x).exp().ln_1p() }
}

fn lchoose_ref(n: f64, k: f64) -> f64 {
    lgamma_ref(n + 1.0) - lgamma_ref(k + 1.0) - lgamma_ref(n - k + 1.0)
}

// ---------------------------------------------------------------------------------------------
// Plumbing.

fn dev() -> Device {
    BackendKind::Flex.device().unwrap()
}

fn t1(v: &[f64], d: &Device) -> Tensor<1> {
    Tensor::from_data(TensorData::new(v.to_vec(), [v.len()]), (d, DType::F64))
}

fn t2(v: &[f64], rows: usize, cols: usize, d: &Device) -> Tensor<2> {
    Tensor::from_data(TensorData::new(v.to_vec(), [rows, cols]), (d, DType::F64))
}

fn t3(v: &[f64], dims: [usize; 3], d: &Device) -> Tensor<3> {
    Tensor::from_data(TensorData::new(v.to_vec(), dims), (d, DType::F64))
}

fn host<const D: usize>(t: &Tensor<D>) -> Vec<f64> {
    t.to_data().convert::<f64>().try_into_vec::<f64>().unwrap()
}

/// `got` against `want`: equal infinities and NaNs, else within `rtol (atol_scale + |want|)`.
#[track_caller]
fn close(what: &str, got: &[f64], want: &[f64], rtol: f64, atol_scale: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if w.is_nan() {
            assert!(g.is_nan(), "{what}, entry {i}: {g}, expected NaN");
        } else if w.is_infinite() {
            assert_eq!(g, w, "{what}, entry {i}");
        } else {
            let tol = rtol * (atol_scale + w.abs());
            assert!((g - w).abs() <= tol, "{what}, entry {i}: {g} vs {w} (diff {:.3e}, tolerance {tol:.1e})", g - w);
        }
    }
}

/// An elementwise function at `xs` against its reference, and its autodiff derivative against
/// central differences of the reference (where `grad` and the reference is finite).
#[track_caller]
fn elementwise(
    what: &str,
    xs: &[f64],
    f: impl Fn(Tensor<1>) -> Tensor<1>,
    g: impl Fn(f64) -> f64,
    rtol: f64,
    grad: bool,
) {
    let d = dev();
    let want: Vec<f64> = xs.iter().map(|&x| g(x)).collect();
    close(what, &host(&f(t1(xs, &d))), &want, rtol, 1.0);
    if grad {
        let (_, gr) = value_and_grad(t1(xs, &d), &f).unwrap();
        let gr = host(&gr);
        for (i, &x) in xs.iter().enumerate() {
            if !want[i].is_finite() {
                continue;
            }
            let h = 1e-5 * x.abs().max(1e-2);
            let fd = (g(x + h) - g(x - h)) / (2.0 * h);
            let tol = 1e-5 * (1e-6 + fd.abs());
            assert!((gr[i] - fd).abs() <= tol, "{what}: d/dx at {x}: autodiff {} vs fd {fd}", gr[i]);
        }
    }
}

/// The autodiff gradient of `sum f(p)` against central differences of the reference sum `g`.
#[track_caller]
fn grad_check(what: &str, p: &[f64], f: impl FnOnce(Tensor<1>) -> Tensor<1>, g: impl Fn(&[f64]) -> f64, rtol: f64) {
    let (_, grad) = value_and_grad(t1(p, &dev()), |t| f(t).sum().reshape([1])).unwrap();
    let grad = host(&grad);
    for i in 0..p.len() {
        let h = 1e-6 * p[i].abs().max(1e-2);
        let (mut up, mut down) = (p.to_vec(), p.to_vec());
        up[i] += h;
        down[i] -= h;
        let fd = (g(&up) - g(&down)) / (2.0 * h);
        let tol = rtol * (1.0 + fd.abs());
        assert!((grad[i] - fd).abs() <= tol, "{what}: d/dp{i} autodiff {} vs fd {fd} (tolerance {tol:.1e})", grad[i]);
    }
}

#[track_caller]
fn invalid<T: std::fmt::Debug>(r: Result<T, ModelError>, dist: &str, name: &str) {
    match r {
        Err(
            ModelError::InvalidParameter { dist: d, name: n, .. } | ModelError::InvalidElement { dist: d, name: n, .. },
        ) => assert_eq!((d, n), (dist, name)),
        other => panic!("expected InvalidParameter {{ {dist}, {name} }}, got {other:?}"),
    }
}

/// The trapezoid rule on `e^lp` at the equally spaced points `xs`.
fn trapezoid(xs: &[f64], lp: &[f64]) -> f64 {
    xs.windows(2).zip(lp.windows(2)).map(|(x, l)| 0.5 * (x[1] - x[0]) * (l[0].exp() + l[1].exp())).sum()
}

/// Simpson's rule on `e^lp` at the equally spaced points `xs` (an odd count).
fn simpson(xs: &[f64], lp: &[f64]) -> f64 {
    let h = xs[1] - xs[0];
    let m = xs.len() - 1;
    assert!(m.is_multiple_of(2));
    let inner: f64 = (1..m).map(|i| if i % 2 == 1 { 4.0 } else { 2.0 } * lp[i].exp()).sum();
    h / 3.0 * (lp[0].exp() + inner + lp[m].exp())
}

/// `ln(1 + e^v)` in f64 without overflow.
fn softplus_ref(v: f64) -> f64 {
    if v > 0.0 { v + (-v).exp().ln_1p() } else { v.exp().ln_1p() }
}

fn grid(lo: f64, hi: f64, m: usize) -> Vec<f64> {
    (0..=m).map(|i| lo + (hi - lo) * i as f64 / m as f64).collect()
}

// ---------------------------------------------------------------------------------------------
// Links and special functions.

const WIDE: [f64; 13] = [-800.0, -50.0, -20.0, -1.0, -1e-8, 0.0, 1e-8, 0.3, 2.0, 20.0, 37.0, 50.0, 800.0];

#[test]
fn logistic_links_are_exact_in_both_tails() {
    elementwise("log_inv_logit", &WIDE, log_inv_logit, log_inv_logit_ref, 1e-14, true);
    elementwise("log1m_inv_logit", &WIDE, log1m_inv_logit, |x| log_inv_logit_ref(-x), 1e-14, true);
    elementwise("log1p_exp", &WIDE, log1p_exp, |x| -log_inv_logit_ref(-x), 1e-14, true);
    elementwise("inv_logit", &WIDE[1..12], inv_logit, |x| log_inv_logit_ref(x).exp(), 1e-14, true);
    let logit_ref = |p: f64| p.ln() - (-p).ln_1p();
    elementwise("logit", &[1e-300, 1e-10, 1.0 - 1e-12], logit, logit_ref, 1e-14, false);
    elementwise("logit", &[0.01, 0.25, 0.5, 0.9], logit, logit_ref, 1e-14, true);
    elementwise("log1m", &[1e-10, 0.999_999, 1.0], log1m, |x| (-x).ln_1p(), 1e-14, false);
    elementwise("log1m", &[-5.0, 0.0, 0.5, 0.9], log1m, |x| (-x).ln_1p(), 1e-14, true);
    // In f32 as models run: the tails stay exact where inv_logit itself rounds to 0 or 1.
    let d = dev();
    let x = Tensor::<1>::from_data(TensorData::new(vec![-30f32, 30.0], [2]), &d);
    let tiny = -(-30f64).exp().ln_1p();
    close("f32 log_inv_logit", &host(&log_inv_logit(x.clone())), &[-30.0, tiny], 1e-6, 0.0);
    close("f32 log1m_inv_logit", &host(&log1m_inv_logit(x)), &[tiny, -30.0], 1e-6, 0.0);
}

#[test]
fn log1m_exp_and_log_diff_exp_keep_small_gaps() {
    let xs = [-800.0, -30.0, -1.0, -0.69, -0.5, -1e-3];
    elementwise("log1m_exp", &xs, log1m_exp, |x| (-x.exp_m1()).ln(), 1e-12, true);
    elementwise("log1m_exp", &[-1e-9, -1e-30], log1m_exp, |x| (-x.exp_m1()).ln(), 1e-12, false);
    let d = dev();
    close("log1m_exp at 0 and above", &host(&log1m_exp(t1(&[0.0, 1.0], &d))), &[f64::NEG_INFINITY, f64::NAN], 0.0, 0.0);
    let (a, b) = ([0.0, 10.0, -700.0, 5.0, 3.0, 1.0], [-1e-9, -30.0, -700.5, 5.0, 4.0, f64::NEG_INFINITY]);
    let want: Vec<f64> = a
        .iter()
        .zip(&b)
        .map(|(&a, &b)| match () {
            _ if a == b => f64::NEG_INFINITY,
            _ if a < b => f64::NAN,
            _ => a + (-(b - a).exp_m1()).ln(),
        })
        .collect();
    close("log_diff_exp", &host(&log_diff_exp(t1(&a, &d), t1(&b, &d))), &want, 1e-12, 1.0);
    let b = [-1e-9, -30.0, -700.5, 5.0, 4.0, -1e300];
    let want: Vec<f64> = a.iter().zip(&b).map(|(&a, &b)| a.max(b) + (-(a - b).abs()).exp().ln_1p()).collect();
    close("log_sum_exp_pair", &host(&log_sum_exp_pair(t1(&a, &d), t1(&b, &d))), &want, 1e-14, 1.0);
}

#[test]
fn phi_and_its_logs_are_accurate_in_the_tails() {
    let xs = [-37.0, -20.0, -8.0, -3.0, -1.0, 0.0, 0.5, 2.0, 6.0, 9.0];
    elementwise("Phi", &xs, Phi, phi_ref, 3e-7, true);
    // Stan's definition of Phi_approx, and its distance from Phi (documented below 1.4e-4).
    let approx = |x: f64| 1.0 / (1.0 + (-(0.07056 * x * x * x + 1.5976 * x)).exp());
    elementwise("Phi_approx", &xs[2..], Phi_approx, approx, 1e-13, true);
    assert!(xs.iter().all(|&x| (approx(x) - phi_ref(x)).abs() < 1.4e-4));
    let zs = [-300.0, -40.0, -5.0, -0.1, 0.0, 0.1, 5.0, 12.0];
    elementwise("std_normal_lcdf", &zs, std_normal_lcdf, |z| ln_phi_ref(z).0, 3e-7, true);
    elementwise("std_normal_lccdf", &zs, std_normal_lccdf, |z| ln_phi_ref(z).1, 3e-7, true);
    // f32: the far tail has no cancellation left.
    let x32 = Tensor::<1>::from_data(TensorData::new(vec![-30f32, 10.0], [2]), &dev());
    close("f32 std_normal_lcdf", &host(&std_normal_lcdf(x32)), &[ln_phi_ref(-30.0).0, ln_phi_ref(10.0).0], 1e-6, 0.0);
}

#[test]
fn inv_phi_inverts_phi_with_the_exact_derivative() {
    let ps = [1e-30, 1e-10, 0.001, 0.024, 0.02425, 0.3, 0.5, 0.7, 0.98, 0.999_999];
    let d = dev();
    let x = host(&inv_Phi(t1(&ps, &d)));
    for (&p, &x) in ps.iter().zip(&x) {
        // The fit's relative error 1.2e-9 in x moves Phi by about |x| phi(x) 1.2e-9 / Phi(x).
        assert!((phi_ref(x) / p - 1.0).abs() < 2e-7, "Phi(inv_Phi({p})) = {} ", phi_ref(x));
    }
    let (_, g) = value_and_grad(t1(&ps, &d), inv_Phi).unwrap();
    for ((&p, &x), &g) in ps.iter().zip(&x).zip(&host(&g)) {
        assert!((g * normal_density(x) - 1.0).abs() < 1e-12, "d inv_Phi / dp at {p}: {g}");
    }
    let edges = host(&inv_Phi(t1(&[0.0, 1.0, -0.5, 1.5], &d)));
    close("inv_Phi edges", &edges, &[f64::NEG_INFINITY, f64::INFINITY, f64::NAN, f64::NAN], 0.0, 0.0);
}

#[test]
fn lgamma_digamma_and_beta_functions() {
    let xs = [1e-3, 0.1, 0.5, 1.0, 2.0, 3.7, 10.0, 100.0, 1e4];
    elementwise("lgamma", &xs, lgamma, lgamma_ref, 3e-9, false);
    // Exact digamma and trigamma values: psi(n) = -gamma + H_(n-1), psi(n + 1/2) = -gamma -
    // 2 ln 2 + sum_k 2 / (2k - 1), psi'(n) = pi^2/6 - sum_k<n 1/k^2, psi'(1/2) = pi^2/2.
    let harmonic = |n: u32| (1..n).map(|k| 1.0 / f64::from(k)).sum::<f64>();
    let mut points = vec![];
    for n in [1u32, 2, 5, 30, 1000] {
        let tri = PI * PI / 6.0 - (1..n).map(|k| 1.0 / f64::from(k * k)).sum::<f64>();
        points.push((f64::from(n), -EULER + harmonic(n), tri));
    }
    for n in [0u32, 3, 20] {
        let psi = -EULER - 2.0 * LN_2 + (1..=n).map(|k| 2.0 / f64::from(2 * k - 1)).sum::<f64>();
        let tri = PI * PI / 2.0 - (1..=n).map(|k| 4.0 / f64::from((2 * k - 1) * (2 * k - 1))).sum::<f64>();
        points.push((f64::from(n) + 0.5, psi, tri));
    }
    let x: Vec<f64> = points.iter().map(|p| p.0).collect();
    let psi: Vec<f64> = points.iter().map(|p| p.1).collect();
    let tri: Vec<f64> = points.iter().map(|p| p.2).collect();
    let d = dev();
    close("digamma", &host(&digamma(t1(&x, &d))), &psi, 2e-10, 1.0);
    let (_, g) = value_and_grad(t1(&x, &d), lgamma).unwrap();
    close("d lgamma / dx", &host(&g), &psi, 3e-9, 1.0);
    let (_, g) = value_and_grad(t1(&x, &d), digamma).unwrap();
    close("d digamma / dx", &host(&g), &tri, 1e-9, 1.0);
    // lbeta at large and unbalanced arguments, lchoose at exact binomial coefficients.
    let (a, b) = ([0.5, 3.0, 1e5, 1e-3, 40.0], [0.5, 7.5, 0.5, 2.0, 1e6]);
    let want: Vec<f64> = a.iter().zip(&b).map(|(&a, &b)| lgamma_ref(a) + lgamma_ref(b) - lgamma_ref(a + b)).collect();
    close("lbeta", &host(&lbeta(t1(&a, &d), t1(&b, &d))), &want, 1e-9, 1.0);
    let (n, k) = ([10.0, 1000.0, 7.0, 50.0], [3.0, 500.0, 0.0, 50.0]);
    let exact = [120f64.ln(), lchoose_ref(1000.0, 500.0), 0.0, 0.0];
    close("lchoose", &host(&lchoose(t1(&n, &d), t1(&k, &d))), &exact, 1e-9, 1.0);
    let p = [3.0, 7.5];
    grad_check(
        "lbeta",
        &p,
        |t| lbeta(t.clone().narrow(0, 0, 1), t.narrow(0, 1, 1)),
        |p| lgamma_ref(p[0]) + lgamma_ref(p[1]) - lgamma_ref(p[0] + p[1]),
        1e-6,
    );
}

#[test]
fn binary_log_loss_softmax_cumulative_sum_and_matrix_helpers() {
    let d = dev();
    let (y, yh) = ([0.0, 0.0, 1.0, 1.0, 1.0, 0.0], [0.0, 1e-10, 0.3, 1.0, 0.0, 1.0]);
    let want = [0.0, -(-1e-10f64).ln_1p(), -(0.3f64).ln(), 0.0, f64::INFINITY, f64::INFINITY];
    close("binary_log_loss", &host(&binary_log_loss(t1(&y, &d), t1(&yh, &d))), &want, 1e-14, 1e-300);
    let x = [1000.0, 999.0, -5.0, 0.0, 0.0, 0.0];
    let s = host(&softmax(t2(&x, 2, 3, &d), 1));
    let z = 1.0 + (-1.0f64).exp() + (-1005.0f64).exp();
    close("softmax", &s, &[1.0 / z, (-1.0f64).exp() / z, 0.0, 1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0], 1e-13, 1e-300);
    close(
        "cumulative_sum",
        &host(&cumulative_sum(t2(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 2, 3, &d), 1)),
        &[1.0, 3.0, 6.0, 4.0, 9.0, 15.0],
        1e-15,
        1.0,
    );
    // quad_form_diag(Omega, tau) = diag(tau) Omega diag(tau), entry by entry.
    let omega = [1.0, 0.3, 0.3, 1.0];
    let tau = [2.0, 0.5];
    let got = host(&quad_form_diag(t3(&omega, [1, 2, 2], &d), t2(&tau, 1, 2, &d)));
    let want: Vec<f64> = (0..4).map(|e| tau[e / 2] * omega[e] * tau[e % 2]).collect();
    close("quad_form_diag", &got, &want, 1e-15, 1.0);
    let got = host(&diag_pre_multiply(t2(&tau, 1, 2, &d), t3(&omega, [1, 2, 2], &d)));
    let want: Vec<f64> = (0..4).map(|e| tau[e / 2] * omega[e]).collect();
    close("diag_pre_multiply", &got, &want, 1e-15, 1.0);
}

// ---------------------------------------------------------------------------------------------
// Continuous distributions: densities against the Functions Reference's formulas, their
// normalisation by quadrature, cdfs against quadrature in the bulk and closed forms in the tails.

/// Library log-densities at `xs` (one distribution, scalar-free: parameters are `[1]` tensors).
fn lpdf(dist: &impl LogProb<1>, xs: &[f64]) -> Vec<f64> {
    host(&dist.log_prob(t1(xs, &dev())))
}

#[test]
fn logistic_gumbel_and_their_cdfs() {
    let d = dev();
    let (mu, s) = (0.7, 1.9);
    let logistic = Logistic::<1>::new(t1(&[mu], &d), t1(&[s], &d)).unwrap();
    let xs = [-300.0, -20.0, -1.0, 0.7, 4.0, 60.0];
    let want: Vec<f64> = xs
        .iter()
        .map(|&x| {
            let z = (x - mu) / s;
            -z - s.ln() - 2.0 * softplus_ref(-z)
        })
        .collect();
    close("logistic_lpdf", &lpdf(&logistic, &xs), &want, 1e-13, 1.0);
    let g = grid(-60.0, 60.0, 24_000);
    assert!((trapezoid(&g, &lpdf(&logistic, &g)) - 1.0).abs() < 1e-8);
    let lcdf = host(&logistic.lcdf(t1(&xs, &d)));
    let lccdf = host(&logistic.lccdf(t1(&xs, &d)));
    let cdf_ref = |x: f64| log_inv_logit_ref((x - mu) / s);
    close("logistic_lcdf", &lcdf, &xs.map(cdf_ref), 1e-13, 1.0);
    close("logistic_lccdf", &lccdf, &xs.map(|x| log_inv_logit_ref(-(x - mu) / s)), 1e-13, 1.0);
    // The cdf as the integral of the library's density, in the bulk.
    let to = grid(-60.0, 2.5, 12_500);
    assert!((simpson(&to, &lpdf(&logistic, &to)).ln() - cdf_ref(2.5)).abs() < 1e-8);

    let (mu, beta) = (-1.0, 2.5);
    let gumbel = Gumbel::<1>::new(mu, beta).unwrap();
    let xs = [-8.0, -3.0, 0.0, 5.0, 40.0, 200.0];
    let want: Vec<f64> = xs
        .iter()
        .map(|&x| {
            let z = (x - mu) / beta;
            -beta.ln() - z - (-z).exp()
        })
        .collect();
    close("gumbel_lpdf", &lpdf(&gumbel, &xs), &want, 1e-13, 1.0);
    let g = grid(-12.0, 80.0, 40_000);
    assert!((trapezoid(&g, &lpdf(&gumbel, &g)) - 1.0).abs() < 1e-8);
    let lccdf_ref = |x: f64| (-(-(-(x - mu) / beta).exp()).exp_m1()).ln();
    close("gumbel_lccdf", &host(&gumbel.lccdf(t1(&xs, &d))), &xs.map(lccdf_ref), 1e-12, 1.0);
    close("gumbel_lcdf", &host(&gumbel.lcdf(t1(&xs, &d))), &xs.map(|x| -(-(x - mu) / beta).exp()), 1e-13, 1.0);
    grad_check(
        "gumbel_lccdf in mu, beta",
        &[mu, beta],
        |p| Gumbel::<1>::new(p.clone().narrow(0, 0, 1), p.narrow(0, 1, 1)).unwrap().lccdf(t1(&[40.0, 2.0], &dev())),
        |p| [40.0, 2.0].iter().map(|&x| (-(-(-(x - p[0]) / p[1]).exp()).exp_m1()).ln()).sum(),
        1e-6,
    );
}

#[test]
fn lognormal_and_weibull_cdfs_in_both_tails() {
    let d = dev();
    let (mu, sigma) = (0.3, 0.8);
    let ln = LogNormal::<1>::new(mu, sigma).unwrap();
    let xs = [1e-12, 0.01, 1.0, 3.0, 1e4, -1.0];
    let z = |x: f64| (x.ln() - mu) / sigma;
    let want_lcdf: Vec<f64> =
        xs.iter().map(|&x| if x <= 0.0 { f64::NEG_INFINITY } else { ln_phi_ref(z(x)).0 }).collect();
    let want_lccdf: Vec<f64> = xs.iter().map(|&x| if x <= 0.0 { 0.0 } else { ln_phi_ref(z(x)).1 }).collect();
    close("lognormal_lcdf", &host(&ln.lcdf(t1(&xs, &d))), &want_lcdf, 3e-7, 1.0);
    close("lognormal_lccdf", &host(&ln.lccdf(t1(&xs, &d))), &want_lccdf, 3e-7, 1.0);
    let (alpha, s) = (1.7, 2.0);
    let w = Weibull::<1>::new(alpha, s).unwrap();
    let xs = [1e-9, 0.1, 2.0, 30.0, -1.0];
    let p = |x: f64| (x / s).powf(alpha);
    let want_lcdf: Vec<f64> =
        xs.iter().map(|&x| if x <= 0.0 { f64::NEG_INFINITY } else { (-(-p(x)).exp_m1()).ln() }).collect();
    let want_lccdf: Vec<f64> = xs.iter().map(|&x| if x <= 0.0 { 0.0 } else { -p(x) }).collect();
    close("weibull_lcdf", &host(&w.lcdf(t1(&xs, &d))), &want_lcdf, 1e-12, 1.0);
    close("weibull_lccdf", &host(&w.lccdf(t1(&xs, &d))), &want_lccdf, 1e-12, 1.0);
    // The bulk against the library's own density by quadrature.
    let to = grid(1e-12, 1.5, 30_000);
    let lp = lpdf(&w, &to);
    assert!((simpson(&to, &lp).ln() - host(&w.lcdf(t1(&[1.5], &d)))[0]).abs() < 1e-6);
}

#[test]
fn frechet_pareto_skew_normal_exp_mod_normal_von_mises() {
    let d = dev();
    // Frechet(alpha, sigma): ln alpha - ln sigma - (1 + alpha) ln(x / sigma) - (x / sigma)^-alpha.
    let (a, s) = (2.5, 1.5);
    let fr = Frechet::<1>::new(t1(&[a], &d), t1(&[s], &d)).unwrap();
    let xs = [0.2, 1.0, 4.0, 100.0, -1.0];
    let want: Vec<f64> =
        xs.iter()
            .map(|&x| {
                if x <= 0.0 { f64::NEG_INFINITY } else { a.ln() - s.ln() - (1.0 + a) * (x / s).ln() - (x / s).powf(-a) }
            })
            .collect();
    close("frechet_lpdf", &lpdf(&fr, &xs), &want, 1e-13, 1.0);
    let g = grid(1e-3, 400.0, 400_000);
    assert!((trapezoid(&g, &lpdf(&fr, &g)) - 1.0).abs() < 1e-5);
    close(
        "frechet_lcdf",
        &host(&fr.lcdf(t1(&xs[..4], &d))),
        &xs[..4].iter().map(|&x| -(x / s).powf(-a)).collect::<Vec<_>>(),
        1e-13,
        1.0,
    );
    close(
        "frechet_lccdf",
        &host(&fr.lccdf(t1(&xs[..4], &d))),
        &xs[..4].iter().map(|&x| (-(-(x / s).powf(-a)).exp_m1()).ln()).collect::<Vec<_>>(),
        1e-12,
        1.0,
    );

    // Pareto(y_min, alpha): ln alpha + alpha ln y_min - (alpha + 1) ln x on x >= y_min.
    let (ym, al) = (2.0, 3.0);
    let pa = Pareto::<1>::new(ym, al).unwrap();
    let xs = [1.0, 2.0, 2.000_001, 10.0, 1e6];
    let want: Vec<f64> = xs
        .iter()
        .map(|&x| if x < ym { f64::NEG_INFINITY } else { al.ln() + al * ym.ln() - (al + 1.0) * x.ln() })
        .collect();
    close("pareto_lpdf", &lpdf(&pa, &xs), &want, 1e-13, 1.0);
    let lcdf: Vec<f64> =
        xs.iter().map(|&x| if x <= ym { f64::NEG_INFINITY } else { (-(al * (ym / x).ln()).exp_m1()).ln() }).collect();
    close("pareto_lcdf", &host(&pa.lcdf(t1(&xs, &d))), &lcdf, 1e-9, 1.0);
    let lccdf: Vec<f64> = xs.iter().map(|&x| if x < ym { 0.0 } else { al * (ym / x).ln() }).collect();
    close("pareto_lccdf", &host(&pa.lccdf(t1(&xs, &d))), &lccdf, 1e-13, 1.0);

    // SkewNormal: 2 phi(z) Phi(alpha z) / omega, here through Phi's reference in log form.
    let (xi, om, sk) = (0.5, 2.0, -4.0);
    let sn = SkewNormal::<1>::new(xi, om, t1(&[sk], &d)).unwrap();
    let xs = [-30.0, -2.0, 0.5, 3.0, 12.0];
    let sn_ref = |x: f64, sk: f64| {
        let z = (x - xi) / om;
        LN_2 + normal_density(z).ln() - om.ln() + ln_phi_ref(sk * z).0
    };
    close("skew_normal_lpdf", &lpdf(&sn, &xs), &xs.map(|x| sn_ref(x, sk)), 3e-7, 1.0);
    let g = grid(-20.0, 20.0, 40_000);
    assert!((trapezoid(&g, &lpdf(&sn, &g)) - 1.0).abs() < 1e-6);
    grad_check(
        "skew_normal in alpha",
        &[sk],
        |p| SkewNormal::<1>::new(xi, om, p).unwrap().log_prob(t1(&xs, &dev())),
        |p| xs.iter().map(|&x| sn_ref(x, p[0])).sum(),
        1e-5,
    );

    // ExpModNormal: the Functions Reference's density, with erfc in log form.
    let (mu, sg, la) = (1.0, 0.7, 2.0);
    let emn = ExpModNormal::<1>::new(mu, sg, la).unwrap();
    let xs = [-6.0, 0.0, 1.0, 3.0, 40.0];
    let emn_ref = |x: f64| {
        la.ln() - LN_2 + la * (mu + 0.5 * la * sg * sg - x) + ln_erfc_ref((mu + la * sg * sg - x) / (sg * 2f64.sqrt()))
    };
    close("exp_mod_normal_lpdf", &lpdf(&emn, &xs), &xs.map(emn_ref), 3e-7, 1.0);
    let g = grid(-6.0, 30.0, 36_000);
    assert!((trapezoid(&g, &lpdf(&emn, &g)) - 1.0).abs() < 1e-6);

    // VonMises: ln I_0 by quadrature, scalar (host series) and tensor (fits) kappa.
    let xs = [-PI, -1.0, 0.0, 2.0, 7.0];
    for kappa in [0.0, 0.5, 3.0, 3.75, 20.0, 800.0] {
        let want: Vec<f64> =
            xs.iter().map(|&x| kappa * (x - 0.3f64).cos() - (2.0 * PI).ln() - ln_bessel_i0_ref(kappa)).collect();
        close(
            &format!("von_mises host kappa {kappa}"),
            &lpdf(&VonMises::<1>::new(0.3, kappa).unwrap(), &xs),
            &want,
            1e-10,
            1.0,
        );
        let tensor = VonMises::<1>::new(0.3, t1(&[kappa], &d)).unwrap();
        close(&format!("von_mises tensor kappa {kappa}"), &lpdf(&tensor, &xs), &want, 3e-7, 1.0);
    }
    let g = grid(-PI, PI, 20_000);
    assert!((trapezoid(&g, &lpdf(&VonMises::<1>::new(1.0, t1(&[7.0], &d)).unwrap(), &g)) - 1.0).abs() < 1e-6);

    invalid(Logistic::<1>::new(0.0, -1.0), "Logistic", "sigma");
    invalid(VonMises::<1>::new(0.0, -1.0), "VonMises", "kappa");
    invalid(Pareto::<1>::new(0.0, 1.0), "Pareto", "y_min");
    invalid(Frechet::<1>::new(f64::NAN, 1.0), "Frechet", "alpha");
}

// ---------------------------------------------------------------------------------------------
// Discrete distributions: mass functions summed over their support, against formulas.

#[test]
fn binomial_beta_binomial_and_neg_binomial_sum_to_one() {
    let d = dev();
    let n_trials = 12.0;
    let ks: Vec<f64> = (0..=12).map(f64::from).collect();
    for theta in [0.0, 1e-9, 0.3, 1.0 - 1e-9, 1.0] {
        let lp = host(&Binomial::<1>::new(t1(&ks, &d), n_trials).unwrap().log_prob(t1(&[theta], &d)));
        let total: f64 = lp.iter().map(|l| l.exp()).sum();
        assert!((total - 1.0).abs() < 1e-12, "binomial at {theta}: sums to {total}");
        let want: Vec<f64> = ks
            .iter()
            .map(|&k| {
                let (a, b) = (
                    if k > 0.0 { k * theta.ln() } else { 0.0 },
                    if k < n_trials { (n_trials - k) * (1.0 - theta).ln() } else { 0.0 },
                );
                lchoose_ref(n_trials, k) + a + b
            })
            .collect();
        close(&format!("binomial at {theta}"), &lp, &want, 1e-9, 1.0);
    }
    let outside = host(&Binomial::<1>::new(t1(&[1.0], &d), 3.0).unwrap().log_prob(t1(&[-0.1, 1.1, 0.0], &d)));
    assert_eq!(outside, [f64::NEG_INFINITY; 3]);
    grad_check(
        "binomial in theta",
        &[0.3],
        |p| Binomial::<1>::new(t1(&[4.0, 0.0, 12.0], &dev()), 12.0).unwrap().log_prob(p),
        |p| [4.0, 0.0, 12.0].iter().map(|&k| k * p[0].ln() + (12.0 - k) * (1.0 - p[0]).ln()).sum(),
        1e-6,
    );

    for (a, b) in [(0.5, 0.5), (2.0, 30.0), (1e4, 3e4)] {
        let bb = BetaBinomial::<1>::new(t1(&ks, &d), n_trials).unwrap();
        let lp = host(&bb.log_prob(t1(&[a], &d), b).unwrap());
        let total: f64 = lp.iter().map(|l| l.exp()).sum();
        assert!((total - 1.0).abs() < 5e-9, "beta_binomial({a}, {b}) sums to {total}");
        let lbeta_ref = |x: f64, y: f64| lgamma_ref(x) + lgamma_ref(y) - lgamma_ref(x + y);
        let want: Vec<f64> = ks
            .iter()
            .map(|&k| lchoose_ref(n_trials, k) + lbeta_ref(k + a, n_trials - k + b) - lbeta_ref(a, b))
            .collect();
        close(&format!("beta_binomial({a}, {b})"), &lp, &want, 1e-8, 1.0);
    }
    grad_check(
        "beta_binomial in alpha",
        &[2.5],
        |p| BetaBinomial::<1>::new(t1(&[3.0, 7.0], &dev()), 10.0).unwrap().log_prob(p, 4.0).unwrap(),
        |p| {
            [3.0, 7.0]
                .iter()
                .map(|&k| {
                    lgamma_ref(k + p[0]) + lgamma_ref(10.0 - k + 4.0)
                        - lgamma_ref(p[0] + 14.0)
                        - lgamma_ref(p[0])
                        - lgamma_ref(4.0)
                        + lgamma_ref(p[0] + 4.0)
                })
                .sum()
        },
        1e-6,
    );

    // neg_binomial_2(mu, phi) summed over 0..2000.
    let ks: Vec<f64> = (0..2000).map(f64::from).collect();
    for (mu, phi) in [(3.0, 0.5), (40.0, 1e5)] {
        let lp = host(&NegBinomial2::<1>::new(t1(&ks, &d)).unwrap().log_prob(t1(&[mu], &d), phi).unwrap());
        let total: f64 = lp.iter().map(|l| l.exp()).sum();
        assert!((total - 1.0).abs() < 1e-9, "neg_binomial_2({mu}, {phi}) sums to {total}");
        let k = 5.0;
        let want = lgamma_ref(k + phi) - lgamma_ref(k + 1.0) - lgamma_ref(phi)
            + k * (mu / (mu + phi)).ln()
            + phi * (phi / (mu + phi)).ln();
        assert!((lp[5] - want).abs() < 1e-8 * (1.0 + want.abs()), "neg_binomial_2 at 5: {} vs {want}", lp[5]);
    }
    invalid(Binomial::<1>::new(t1(&[4.0], &d), 3.0), "Binomial", "counts");
    invalid(BetaBinomial::<1>::new(t1(&[1.5], &d), 3.0), "BetaBinomial", "counts");
}

#[test]
fn bernoulli_logit_poisson_log_and_categorical_logit() {
    let d = dev();
    let y = [1.0, 0.0, 1.0, 0.0];
    let eta = [40.0, 40.0, -3.0, -800.0];
    let got = host(&BernoulliLogit::<1>::new(t1(&y, &d)).unwrap().log_prob(t1(&eta, &d)));
    let want: Vec<f64> = y
        .iter()
        .zip(&eta)
        .map(|(&y, &e)| if y == 1.0 { log_inv_logit_ref(e) } else { log_inv_logit_ref(-e) })
        .collect();
    close("bernoulli_logit", &got, &want, 1e-14, 1e-300);
    invalid(BernoulliLogit::<1>::new(t1(&[0.5], &d)), "BernoulliLogit", "y");

    let ks = [0.0, 1.0, 7.0, 30.0];
    let pl = PoissonLog::<1>::new(t1(&ks, &d)).unwrap();
    let want: Vec<f64> = ks.iter().map(|&k| k * 1.5 - 1.5f64.exp() - lgamma_ref(k + 1.0)).collect();
    close("poisson_log", &host(&pl.log_prob(t1(&[1.5], &d))), &want, 1e-12, 1.0);
    let rate = host(&pl.log_prob_rate(t1(&[0.0], &d)));
    assert!(rate[0].abs() < 1e-14, "{}", rate[0]);
    assert!(rate[1..].iter().all(|v| *v == f64::NEG_INFINITY));
    let k: Vec<f64> = (0..200).map(f64::from).collect();
    let total: f64 =
        host(&PoissonLog::<1>::new(t1(&k, &d)).unwrap().log_prob_rate(t1(&[17.0], &d))).iter().map(|l| l.exp()).sum();
    assert!((total - 1.0).abs() < 1e-12);

    // Two particles, three observations, K = 4: each row's probabilities sum to 1.
    let beta: Vec<f64> = (0..24).map(|i| ((i * 37 % 11) as f64 - 5.0) * 0.7).collect();
    let mut total = [0.0f64; 6];
    for c in 0..4 {
        let cl = CategoricalLogit::new(&[c, c, c], 4, &d).unwrap();
        let lp = host(&cl.log_prob(t3(&beta, [2, 3, 4], &d)).unwrap());
        for (t, l) in total.iter_mut().zip(&lp) {
            *t += l.exp();
        }
        // Against log_softmax on the host for particle 1, observation 2.
        let row = &beta[(3 + 2) * 4..(3 + 2) * 4 + 4];
        let lse = row.iter().map(|v| v.exp()).sum::<f64>().ln();
        assert!((lp[5] - (row[c] - lse)).abs() < 1e-13);
    }
    assert!(total.iter().all(|t| (t - 1.0).abs() < 1e-13), "{total:?}");
    invalid(CategoricalLogit::new(&[4], 4, &d), "CategoricalLogit", "y");
}

#[test]
fn ordered_logistic_and_probit_sum_to_one_in_the_tails() {
    let d = dev();
    let cuts = [-2.0, 0.5, 0.500_001, 3.0];
    let k = 5;
    let etas = [-40.0, -2.0, 0.5, 1.0, 40.0];
    let cdf_logistic = |x: f64| log_inv_logit_ref(x).exp();
    for (name, probit) in [("ordered_logistic", false), ("ordered_probit", true)] {
        let cdf = |x: f64| if probit { phi_ref(x) } else { cdf_logistic(x) };
        let mut total = vec![0.0; etas.len()];
        for c in 0..k {
            let y = vec![c; etas.len()];
            let lp = if probit {
                OrderedProbit::new(&y, k, &d).unwrap().log_prob(t2(&etas, 1, 5, &d), t2(&cuts, 1, 4, &d)).unwrap()
            } else {
                OrderedLogistic::new(&y, k, &d).unwrap().log_prob(t2(&etas, 1, 5, &d), t2(&cuts, 1, 4, &d)).unwrap()
            };
            let lp = host(&lp);
            for (i, &eta) in etas.iter().enumerate() {
                total[i] += lp[i].exp();
                // P(y = c) = F(eta - c_{c-1}) - F(eta - c_c), by F's symmetry on the side where
                // both terms are small; `cond` is the cancellation's amplification of F's error.
                let (p, cond) = if c == 0 {
                    (cdf(cuts[0] - eta), 1.0)
                } else if c == k - 1 {
                    (cdf(eta - cuts[k - 2]), 1.0)
                } else {
                    let (x, z) = (eta - cuts[c - 1], eta - cuts[c]);
                    let (hi, lo) = if x + z > 0.0 { (cdf(-z), cdf(-x)) } else { (cdf(x), cdf(z)) };
                    (hi - lo, (hi + lo) / (hi - lo))
                };
                if p > 1e-280 {
                    let tol = if probit { 1e-6 } else { 1e-9 } * cond * (1.0 + p.ln().abs());
                    assert!((lp[i] - p.ln()).abs() < tol, "{name} y={c} eta={eta}: {} vs {}", lp[i], p.ln());
                }
            }
        }
        assert!(total.iter().all(|t| (t - 1.0).abs() < 1e-6), "{name}: {total:?}");
    }
    // Disordered cut points: -inf, never NaN; a category out of range: an error naming y.
    let lp = host(
        &OrderedLogistic::new(&[1, 0], 3, &d)
            .unwrap()
            .log_prob(t2(&[0.0, 0.0], 1, 2, &d), t2(&[1.0, -1.0], 1, 2, &d))
            .unwrap(),
    );
    assert_eq!(lp, [f64::NEG_INFINITY; 2]);
    invalid(OrderedLogistic::new(&[3], 3, &d), "OrderedLogistic", "y");
    invalid(OrderedProbit::new(&[0], 1, &d), "OrderedProbit", "k");
    // Gradients in eta and the cut points.
    let y = [0usize, 1, 2];
    let p = [0.3, -1.0, 0.8];
    let f_ref = |p: &[f64]| -> f64 {
        let (eta, c) = (p[0], [p[1], p[2]]);
        let f = |x: f64| 1.0 / (1.0 + (-x).exp());
        [1.0 - f(eta - c[0]), f(eta - c[0]) - f(eta - c[1]), f(eta - c[1])].iter().map(|q| q.ln()).sum()
    };
    grad_check(
        "ordered_logistic in eta and c",
        &p,
        |t| {
            let eta = t.clone().narrow(0, 0, 1).reshape([1, 1]).expand([1, 3]);
            let c = t.narrow(0, 1, 2).reshape([1, 2]);
            OrderedLogistic::new(&y, 3, &dev()).unwrap().log_prob(eta, c).unwrap().reshape([3])
        },
        f_ref,
        1e-6,
    );
}

#[test]
fn multinomial_and_multinomial_logit() {
    let d = dev();
    // All compositions of 4 into 3 parts: the probabilities sum to 1.
    let mut rows = vec![];
    for a in 0..=4 {
        for b in 0..=4 - a {
            rows.extend([f64::from(a), f64::from(b), f64::from(4 - a - b)]);
        }
    }
    let m = rows.len() / 3;
    let mult = Multinomial::new(t2(&rows, m, 3, &d)).unwrap();
    let theta = [0.2, 0.5, 0.3];
    let lp = host(&mult.log_prob(t3(&theta, [1, 1, 3], &d)).unwrap());
    assert!((lp.iter().map(|l| l.exp()).sum::<f64>() - 1.0).abs() < 1e-13);
    let want: Vec<f64> = rows
        .chunks(3)
        .map(|y| {
            lgamma_ref(5.0) - y.iter().map(|&v| lgamma_ref(v + 1.0)).sum::<f64>()
                + y.iter().zip(&theta).map(|(v, t)| v * t.ln()).sum::<f64>()
        })
        .collect();
    close("multinomial", &lp, &want, 1e-9, 1.0);
    let gamma: Vec<f64> = theta.iter().map(|t: &f64| t.ln() + 3.0).collect();
    close("multinomial_logit", &host(&mult.log_prob_logit(t3(&gamma, [1, 1, 3], &d)).unwrap()), &want, 1e-9, 1.0);
    // A zero probability: 0 under a zero count, -inf under a positive one.
    let lp = host(
        &Multinomial::new(t2(&[2.0, 0.0, 1.0, 1.0], 2, 2, &d))
            .unwrap()
            .log_prob(t3(&[1.0, 0.0], [1, 1, 2], &d))
            .unwrap(),
    );
    assert!(lp[0].abs() < 1e-14 && lp[1] == f64::NEG_INFINITY, "{lp:?}");
    invalid(Multinomial::new(t2(&[-1.0, 2.0], 1, 2, &d)), "Multinomial", "counts");
}

// ---------------------------------------------------------------------------------------------
// GLMs, multivariate distributions.

#[test]
fn glms_match_their_elementwise_likelihoods() {
    let d = dev();
    let (n_obs, k) = (5, 3);
    let x: Vec<f64> = (0..n_obs * k).map(|i| ((i * 7 % 5) as f64 - 2.0) * 0.6).collect();
    let beta = [0.5, -1.0, 2.0, 0.1, 0.0, -0.3]; // two particles
    let alpha = [0.25, -1.5];
    let eta = |p: usize, i: usize| alpha[p] + (0..k).map(|j| x[i * k + j] * beta[p * k + j]).sum::<f64>();
    let y01 = [1.0, 0.0, 0.0, 1.0, 1.0];
    let got = host(
        &BernoulliLogitGlm::new(t1(&y01, &d), t2(&x, n_obs, k, &d))
            .unwrap()
            .log_prob(t2(&alpha, 2, 1, &d), t2(&beta, 2, k, &d))
            .unwrap(),
    );
    let want: Vec<f64> = (0..2 * n_obs)
        .map(|e| {
            let (p, i) = (e / n_obs, e % n_obs);
            log_inv_logit_ref(if y01[i] == 1.0 { eta(p, i) } else { -eta(p, i) })
        })
        .collect();
    close("bernoulli_logit_glm", &got, &want, 1e-13, 1.0);
    let counts = [0.0, 3.0, 1.0, 8.0, 2.0];
    let got = host(
        &PoissonLogGlm::new(t1(&counts, &d), t2(&x, n_obs, k, &d))
            .unwrap()
            .log_prob(t2(&alpha, 2, 1, &d), t2(&beta, 2, k, &d))
            .unwrap(),
    );
    let want: Vec<f64> = (0..2 * n_obs)
        .map(|e| {
            let (p, i) = (e / n_obs, e % n_obs);
            counts[i] * eta(p, i) - eta(p, i).exp() - lgamma_ref(counts[i] + 1.0)
        })
        .collect();
    close("poisson_log_glm", &got, &want, 1e-9, 1.0);
    let yr = [0.3, -1.0, 2.0, 0.0, 5.0];
    let sigma = [0.5, 2.0];
    let got = host(
        &NormalIdGlm::new(t1(&yr, &d), t2(&x, n_obs, k, &d))
            .unwrap()
            .log_prob(t2(&alpha, 2, 1, &d), t2(&beta, 2, k, &d), t2(&sigma, 2, 1, &d))
            .unwrap(),
    );
    let want: Vec<f64> = (0..2 * n_obs)
        .map(|e| {
            let (p, i) = (e / n_obs, e % n_obs);
            normal_density((yr[i] - eta(p, i)) / sigma[p]).ln() - sigma[p].ln()
        })
        .collect();
    close("normal_id_glm", &got, &want, 1e-13, 1.0);
    invalid(BernoulliLogitGlm::new(t1(&y01, &d), t2(&x[..12], 4, 3, &d)), "BernoulliLogitGlm", "x");
    invalid(
        NormalIdGlm::new(t1(&yr, &d), t2(&x, n_obs, k, &d)).unwrap().log_prob(0.0, t2(&beta, 2, k, &d), -1.0),
        "NormalIdGlm",
        "sigma",
    );
}

#[test]
fn multi_normal_and_multi_student_t_against_two_by_two_forms() {
    let d = dev();
    // Two particles' covariances; the second is not positive definite.
    let sig = [2.0, 0.6, 0.6, 1.0, 1.0, 2.0, 2.0, 1.0];
    let mu = [0.5, -1.0, 0.0, 0.0];
    let y = [1.0, 0.5];
    let (a, b, c) = (sig[0], sig[1], sig[3]);
    let det = a * c - b * b;
    let (r0, r1) = (y[0] - mu[0], y[1] - mu[1]);
    let q = (c * r0 * r0 - 2.0 * b * r0 * r1 + a * r1 * r1) / det;
    let mn = MultiNormal::new(Some(t2(&mu, 2, 2, &d)), t3(&sig, [2, 2, 2], &d)).unwrap();
    let got = host(&mn.log_prob(t2(&y, 1, 2, &d)).unwrap());
    close("multi_normal", &got, &[-(2.0 * PI).ln() - 0.5 * det.ln() - 0.5 * q, f64::NEG_INFINITY], 1e-13, 1.0);
    for nu in [3.0, 1e6] {
        let want = lgamma_ref((nu + 2.0) / 2.0)
            - lgamma_ref(nu / 2.0)
            - (nu * PI).ln()
            - 0.5 * det.ln()
            - (nu + 2.0) / 2.0 * (q / nu).ln_1p();
        let st = MultiStudentT::new(nu, Some(t2(&mu, 2, 2, &d)), t3(&sig, [2, 2, 2], &d)).unwrap();
        close(
            &format!("multi_student_t nu {nu} (scalar)"),
            &host(&st.log_prob(t2(&y, 1, 2, &d)).unwrap()),
            &[want, f64::NEG_INFINITY],
            1e-9,
            1.0,
        );
        let st = MultiStudentT::new(t1(&[nu, nu], &d), Some(t2(&mu, 2, 2, &d)), t3(&sig, [2, 2, 2], &d)).unwrap();
        close(
            &format!("multi_student_t nu {nu} (tensor)"),
            &host(&st.log_prob(t2(&y, 1, 2, &d)).unwrap()),
            &[want, f64::NEG_INFINITY],
            1e-8,
            1.0,
        );
    }
    invalid(MultiStudentT::new(-1.0, None, t3(&sig[..4], [1, 2, 2], &d)), "multi_student_t", "nu");
}

// ---------------------------------------------------------------------------------------------
// Index arrays and the linear scan.

#[test]
fn gather_by_index_array_and_its_scatter_add_gradient() {
    let d = dev();
    let (n, j) = (2, 4);
    let theta: Vec<f64> = (0..n * j).map(|i| i as f64 * 1.5 - 2.0).collect();
    let jj = [3usize, 0, 3, 1, 3];
    let idx = IndexArray::new("jj", &jj, j, &d).unwrap();
    let got = host(&gather(t2(&theta, n, j, &d), &idx).unwrap());
    let want: Vec<f64> = (0..n * jj.len()).map(|e| theta[(e / jj.len()) * j + jj[e % jj.len()]]).collect();
    close("gather", &got, &want, 0.0, 1.0);
    // d/dtheta of sum_i w_i theta[jj_i]: each group collects the weights of its rows.
    let w: Vec<f64> = (0..n * jj.len()).map(|i| 1.0 + i as f64).collect();
    let wt = t2(&w, n, jj.len(), &d);
    let (_, g) = parvi_model::grad::value_and_grad(t2(&theta, n, j, &d), |t| {
        (gather(t, &idx).unwrap() * wt.clone()).sum_dim(1).reshape([n])
    })
    .unwrap();
    let mut want = vec![0.0; n * j];
    for (e, &wv) in w.iter().enumerate() {
        want[(e / jj.len()) * j + jj[e % jj.len()]] += wv;
    }
    close("gather's gradient", &host(&g), &want, 0.0, 1.0);
    let stan = IndexArray::from_stan("jj", &[4, 1, 4, 2, 4], j, &d).unwrap();
    close(
        "1-based",
        &host(&gather(t2(&theta, n, j, &d), &stan).unwrap()),
        &host(&gather(t2(&theta, n, j, &d), &idx).unwrap()),
        0.0,
        1.0,
    );
    invalid(IndexArray::new("jj", &[0, 4], j, &d), "index", "jj");
    invalid(IndexArray::from_stan("jj", &[0], j, &d), "index", "jj");
    invalid(gather(t2(&theta[..6], 2, 3, &d), &idx), "index", "jj");
}

/// `x_t = a_t x_{t-1} + b_t` on the host.
fn recurrence(a: &[f64], b: &[f64]) -> Vec<f64> {
    let mut x = 0.0;
    b.iter()
        .enumerate()
        .map(|(t, &bt)| {
            x = a[t.min(a.len() - 1)] * x + bt;
            x
        })
        .collect()
}

#[test]
fn linear_scan_matches_the_loop_with_constant_and_varying_coefficients() {
    let d = dev();
    for t in [1usize, 2, 3, 7, 8, 200] {
        let b: Vec<f64> = (0..2 * t).map(|i| ((i * 13 % 7) as f64 - 3.0) * 0.4).collect();
        // Constant coefficient per particle, [n, 1].
        let a = [0.9, -0.5];
        let got = host(&linear_scan(t2(&a, 2, 1, &d), t2(&b, 2, t, &d)).unwrap());
        let want: Vec<f64> = (0..2).flat_map(|p| recurrence(&[a[p]], &b[p * t..(p + 1) * t])).collect();
        close(&format!("scan constant T={t}"), &got, &want, 1e-12, 1.0);
        // One coefficient per time point, [n, T].
        let av: Vec<f64> = (0..2 * t).map(|i| 0.95 * ((i as f64) * 0.37).sin()).collect();
        let got = host(&linear_scan(t2(&av, 2, t, &d), t2(&b, 2, t, &d)).unwrap());
        let want: Vec<f64> = (0..2).flat_map(|p| recurrence(&av[p * t..(p + 1) * t], &b[p * t..(p + 1) * t])).collect();
        close(&format!("scan varying T={t}"), &got, &want, 1e-12, 1.0);
    }
    // Gradients in the coefficients and the inputs, T = 9.
    let t = 9;
    let p: Vec<f64> =
        (0..2 * t).map(|i| if i < t { 0.8 - 0.05 * i as f64 } else { ((i * 5 % 3) as f64) - 1.0 }).collect();
    grad_check(
        "linear_scan",
        &p,
        |v| {
            let a = v.clone().narrow(0, 0, t).reshape([1, t]);
            let b = v.narrow(0, t, t).reshape([1, t]);
            let x = linear_scan(a, b).unwrap();
            (x.clone() * x).reshape([t])
        },
        |p| recurrence(&p[..t], &p[t..]).iter().map(|x| x * x).sum(),
        1e-6,
    );
    invalid(linear_scan(t2(&[0.5, 0.5], 1, 2, &d), t2(&[1.0, 2.0, 3.0], 1, 3, &d)), "linear_scan", "a");
}

// ---------------------------------------------------------------------------------------------
// Incomplete gamma and beta functions and the cdfs built on them.

/// `int_0^1 f(u, 1 - u) du` by the tanh-sinh rule (Takahasi & Mori 1974): step 1/128 over
/// `t` in `[-6, 6]`, `u = (1 + tanh(pi/2 sinh t)) / 2`; about 1e-14 for integrands with
/// integrable endpoint singularities (`u^(a-1)`, `a < 1`: the ends cut off lie below 1e-270,
/// so even `u^-0.9` loses under 1e-27 there). `1 - u` is passed computed directly.
fn tanh_sinh(f: impl Fn(f64, f64) -> f64) -> f64 {
    let h = 1.0 / 128.0;
    let m = (6.0 / h) as i64;
    let mut sum = 0.0;
    for i in -m..=m {
        let t = i as f64 * h;
        let s = 0.5 * PI * t.sinh();
        let (u, v) = (1.0 / (1.0 + (-2.0 * s).exp()), 1.0 / (1.0 + (2.0 * s).exp()));
        let w = 0.25 * PI * t.cosh() / s.cosh().powi(2);
        if u > 0.0 && v > 0.0 && w > 0.0 {
            sum += w * f(u, v);
        }
    }
    sum * h
}

/// `ln P(a, x)` by quadrature: `x^a / Gamma(a) int_0^1 u^(a-1) e^(-x u) du`.
fn ln_gamma_p_quad(a: f64, x: f64) -> f64 {
    a * x.ln() - lgamma_ref(a) + tanh_sinh(|u, _| u.powf(a - 1.0) * (-x * u).exp()).ln()
}

/// `(ln I_x(a, b), ln(1 - I_x(a, b)))` by quadrature from the definition:
/// `int_0^x t^(a-1) (1-t)^(b-1) dt = x^a int_0^1 u^(a-1) (1 - x u)^(b-1) du`, or the upper
/// tail as `I_{1-x}(b, a)` the same way.
fn ln_inc_beta_quad(a: f64, b: f64, x: f64) -> (f64, f64) {
    let lbeta_ref = lgamma_ref(a) + lgamma_ref(b) - lgamma_ref(a + b);
    let side = |p: f64, q: f64, y: f64| {
        // 1 - y u = (1 - y) + y (1 - u), accurate where u is near 1.
        let integral = tanh_sinh(|u, v| u.powf(p - 1.0) * ((1.0 - y) + y * v).powf(q - 1.0));
        p * y.ln() + integral.ln() - lbeta_ref
    };
    // The smaller tail directly, the larger as its complement (which then keeps its precision).
    let log1m_exp_ref = |l: f64| if l > -LN_2 { (-l.exp_m1()).ln() } else { (-l.exp()).ln_1p() };
    let (lower, upper) = (side(a, b, x), side(b, a, 1.0 - x));
    if lower < upper { (lower, log1m_exp_ref(lower)) } else { (log1m_exp_ref(upper), upper) }
}

/// Checks `f` (a tensor function of `K` argument columns) at `points` against `reference`, and
/// its autodiff derivative in each argument marked in `diff` against central differences of the
/// reference (step `1e-6` of the argument's size, or of its distance to 0 or 1 inside (0, 1)).
#[track_caller]
fn check_points<const K: usize>(
    what: &str,
    points: &[[f64; K]],
    f: impl Fn([Tensor<1>; K]) -> Tensor<1>,
    reference: impl Fn([f64; K]) -> f64,
    rtol: f64,
    diff: [bool; K],
    grad_rtol: f64,
) {
    let d = dev();
    let cols: [Vec<f64>; K] = std::array::from_fn(|k| points.iter().map(|p| p[k]).collect());
    let tensors = || -> [Tensor<1>; K] { std::array::from_fn(|k| t1(&cols[k], &d)) };
    let want: Vec<f64> = points.iter().map(|&p| reference(p)).collect();
    close(what, &host(&f(tensors())), &want, rtol, 1.0);
    for k in (0..K).filter(|&k| diff[k]) {
        let (_, g) = value_and_grad(t1(&cols[k], &d), |t| {
            let mut args = tensors();
            args[k] = t;
            f(args)
        })
        .unwrap();
        let g = host(&g);
        for (i, p) in points.iter().enumerate() {
            if !want[i].is_finite() {
                continue;
            }
            // Inside (0, 1) the step also keeps well away from the nearer end.
            let size = if p[k] > 0.0 && p[k] < 1.0 { p[k].min(1.0 - p[k]) } else { p[k].abs().max(1e-3) };
            let h = 1e-6 * size;
            let (mut up, mut down) = (*p, *p);
            up[k] += h;
            down[k] -= h;
            let fd = (reference(up) - reference(down)) / (2.0 * h);
            // The difference's own noise: the reference's rounding (1e-13 of its size) over 2h.
            let tol = grad_rtol * fd.abs() + 1e-13 * (1.0 + want[i].abs()) / h;
            assert!(
                (g[i] - fd).abs() <= tol,
                "{what} at {p:?}: d/d(argument {k}) autodiff {} vs fd {fd} (tolerance {tol:.1e})",
                g[i]
            );
        }
    }
}

/// `(a, x)` pairs across both sides of the series / continued fraction split, in the bulk and
/// far in each tail (`ln P(30, 5) ~ -40`, `ln Q(3, 40) ~ -33`, `ln Q(0.1, 200) ~ -207`).
const GAMMA_POINTS: [[f64; 2]; 10] = [
    [0.5, 1e-3],
    [0.5, 2.0],
    [2.0, 0.5],
    [2.0, 3.5],
    [3.0, 40.0],
    [30.0, 5.0],
    [100.0, 100.0],
    [5.0, 0.01],
    [0.1, 200.0],
    [1e4, 1.005e4],
];

#[test]
fn incomplete_gamma_in_both_tails_with_gradients_in_shape_and_variable() {
    // The NR reference against quadrature of the definition, where quadrature is easy.
    for [a, x] in GAMMA_POINTS.iter().copied().filter(|p| p[0] <= 100.0 && p[1] <= 100.0) {
        let (lp, _) = ln_incomplete_gamma(a, x);
        assert!((lp - ln_gamma_p_quad(a, x)).abs() < 1e-9 * (1.0 + lp.abs()), "reference at ({a}, {x})");
    }
    // Gamma(shape, 1)'s cdfs are ln P(shape, x), ln Q(shape, x): gradients in shape and x.
    let lcdf = |[a, x]: [Tensor<1>; 2]| Gamma::<1>::new(a, 1.0).unwrap().lcdf(x);
    let lccdf = |[a, x]: [Tensor<1>; 2]| Gamma::<1>::new(a, 1.0).unwrap().lccdf(x);
    check_points("gamma_lcdf", &GAMMA_POINTS, lcdf, |[a, x]| ln_incomplete_gamma(a, x).0, 1e-10, [true; 2], 1e-5);
    check_points("gamma_lccdf", &GAMMA_POINTS, lccdf, |[a, x]| ln_incomplete_gamma(a, x).1, 1e-10, [true; 2], 1e-5);
    // gamma_p / gamma_q themselves, relative to their own size (P(30, 5) ~ 4e-18).
    let points = &GAMMA_POINTS[..8];
    let p = |[a, x]: [Tensor<1>; 2]| gamma_p(a, x).unwrap();
    let q = |[a, x]: [Tensor<1>; 2]| gamma_q(a, x).unwrap();
    let d = dev();
    for (name, f, tail) in [("gamma_p", &p as &dyn Fn([Tensor<1>; 2]) -> Tensor<1>, 0), ("gamma_q", &q, 1)] {
        let want: Vec<f64> = points
            .iter()
            .map(|&[a, x]| {
                let (lp, lq) = ln_incomplete_gamma(a, x);
                if tail == 0 { lp.exp() } else { lq.exp() }
            })
            .collect();
        let cols: [Vec<f64>; 2] = std::array::from_fn(|k| points.iter().map(|p| p[k]).collect());
        close(name, &host(&f([t1(&cols[0], &d), t1(&cols[1], &d)])), &want, 1e-9, 0.0);
    }
    check_points("gamma_p", points, p, |[a, x]| ln_incomplete_gamma(a, x).0.exp(), 1e-9, [true; 2], 1e-5);
    // (The references' log-gammas, NR's gammln, are good to about 2e-10: the tolerances above.)
    // The rate enters through rate x: a censoring point 60 scales out.
    check_points(
        "gamma_lccdf in rate",
        &[[0.5, 2.5], [3.0, 20.0]],
        |[rate, x]| Gamma::<1>::new(2.5, rate).unwrap().lccdf(x),
        |[rate, x]| ln_incomplete_gamma(2.5, rate * x).1,
        1e-10,
        [true; 2],
        1e-5,
    );
    // Ends of the support, and f32 far out.
    let g = Gamma::<1>::new(2.0, 1.0).unwrap();
    close("gamma_lcdf at ends", &host(&g.lcdf(t1(&[-1.0, 0.0], &d))), &[f64::NEG_INFINITY; 2], 0.0, 0.0);
    close("gamma_lccdf at ends", &host(&g.lccdf(t1(&[-1.0, 0.0], &d))), &[0.0; 2], 0.0, 0.0);
    let x32 = Tensor::<1>::from_data(TensorData::new(vec![200f32, 1e-6], [2]), &d);
    let want = [ln_incomplete_gamma(2.0, 200.0).1, ln_incomplete_gamma(2.0, 1e-6).0];
    let got = [host(&g.lccdf(x32.clone()))[0], host(&g.lcdf(x32))[1]];
    close("f32 gamma tails", &got, &want, 1e-6, 0.0);
    // Bad arguments are errors naming them.
    invalid(gamma_p(t1(&[-1.0], &d), t1(&[1.0], &d)), "gamma_p", "a");
    invalid(gamma_q(t1(&[1.0], &d), t1(&[-1.0], &d)), "gamma_q", "x");
}

#[test]
fn inv_gamma_and_chi_square_cdfs_through_the_incomplete_gamma() {
    // InvGamma(alpha, beta): P(X <= x) = Q(alpha, beta / x).
    let points = [[2.0, 1.0, 0.05], [2.0, 1.0, 3.0], [0.7, 3.0, 1e3], [6.0, 0.5, 0.01]];
    check_points(
        "inv_gamma_lcdf",
        &points,
        |[a, b, x]| InvGamma::<1>::new(a, b).unwrap().lcdf(x),
        |[a, b, x]| ln_incomplete_gamma(a, b / x).1,
        1e-10,
        [true; 3],
        1e-5,
    );
    check_points(
        "inv_gamma_lccdf",
        &points,
        |[a, b, x]| InvGamma::<1>::new(a, b).unwrap().lccdf(x),
        |[a, b, x]| ln_incomplete_gamma(a, b / x).0,
        1e-10,
        [true; 3],
        1e-5,
    );
    let d = dev();
    let ig = InvGamma::<1>::new(2.0, 1.0).unwrap();
    close("inv_gamma at 0", &host(&ig.lcdf(t1(&[0.0], &d))), &[f64::NEG_INFINITY], 0.0, 0.0);
    close("inv_gamma at 0", &host(&ig.lccdf(t1(&[0.0], &d))), &[0.0], 0.0, 0.0);
    // chi_square(3): P(X <= 3) = erf(sqrt(3/2)) - sqrt(6/pi) e^(-3/2) (closed form for nu = 3).
    let u = 1.5f64.sqrt();
    let cdf = (1.0 - 2.0 * ln_phi_ref(-u * 2f64.sqrt()).0.exp()) - (6.0 / PI).sqrt() * (-1.5f64).exp();
    let got = host(&Gamma::<1>::new(1.5, 0.5).unwrap().lcdf(t1(&[3.0], &d)))[0];
    assert!((got - cdf.ln()).abs() < 1e-9, "chi_square(3) lcdf at 3: {got} vs {}", cdf.ln());
}

/// `(a, b, x)` across both sides of the reflection, in the bulk and far in each tail.
const BETA_POINTS: [[f64; 3]; 9] = [
    [0.5, 0.5, 0.01],
    [0.5, 0.5, 0.999],
    [2.0, 3.0, 0.4],
    [2.0, 3.0, 0.95],
    [30.0, 2.0, 0.3],
    [2.0, 30.0, 0.7],
    [200.0, 300.0, 0.4],
    [0.1, 5.0, 1e-6],
    [3.0, 0.2, 0.9999],
];

#[test]
fn incomplete_beta_in_both_tails_with_gradients_in_both_shapes_and_variable() {
    let lcdf = |[a, b, x]: [Tensor<1>; 3]| Beta::<1>::new(a, b).unwrap().lcdf(x);
    let lccdf = |[a, b, x]: [Tensor<1>; 3]| Beta::<1>::new(a, b).unwrap().lccdf(x);
    check_points("beta_lcdf", &BETA_POINTS, lcdf, |[a, b, x]| ln_inc_beta_quad(a, b, x).0, 1e-9, [true; 3], 1e-5);
    check_points("beta_lccdf", &BETA_POINTS, lccdf, |[a, b, x]| ln_inc_beta_quad(a, b, x).1, 1e-9, [true; 3], 1e-5);
    check_points(
        "inc_beta",
        &BETA_POINTS[..6],
        |[a, b, x]| inc_beta(a, b, x).unwrap(),
        |[a, b, x]| ln_inc_beta_quad(a, b, x).0.exp(),
        1e-9,
        [true; 3],
        1e-5,
    );
    let d = dev();
    let beta = Beta::<1>::new(2.0, 3.0).unwrap();
    let ends = t1(&[-0.5, 0.0, 1.0, 1.5], &d);
    let (ninf, zero) = (f64::NEG_INFINITY, 0.0);
    close("beta_lcdf at ends", &host(&beta.lcdf(ends.clone())), &[ninf, ninf, zero, zero], 0.0, 0.0);
    close("beta_lccdf at ends", &host(&beta.lccdf(ends)), &[zero, zero, ninf, ninf], 0.0, 0.0);
    invalid(inc_beta(t1(&[1.0], &d), t1(&[0.0], &d), t1(&[0.5], &d)), "inc_beta", "b");
    invalid(inc_beta(t1(&[1.0], &d), t1(&[1.0], &d), t1(&[1.5], &d)), "inc_beta", "x");
}

#[test]
fn binomial_and_poisson_cdfs_against_sums_of_their_mass_functions() {
    let d = dev();
    let n_trials = 12.0;
    let ln_pmf = |k: f64, theta: f64| lchoose_ref(n_trials, k) + k * theta.ln() + (n_trials - k) * (-theta).ln_1p();
    let log_sum = |terms: Vec<f64>| {
        let m = terms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        m + terms.iter().map(|t| (t - m).exp()).sum::<f64>().ln()
    };
    let ks = [0.0, 3.0, 11.0, 12.0];
    for theta in [0.001, 0.3, 0.9, 0.999] {
        let lcdf_ref = |k: f64, th: f64| log_sum((0..=k as usize).map(|j| ln_pmf(j as f64, th)).collect());
        let lccdf_ref = |k: f64, th: f64| {
            if k >= n_trials {
                f64::NEG_INFINITY
            } else {
                log_sum((k as usize + 1..=12).map(|j| ln_pmf(j as f64, th)).collect())
            }
        };
        let b = Binomial::<1>::new(t1(&ks, &d), n_trials).unwrap();
        let want: Vec<f64> = ks.iter().map(|&k| lcdf_ref(k, theta)).collect();
        close(&format!("binomial_lcdf at {theta}"), &host(&b.lcdf(t1(&[theta], &d))), &want, 1e-10, 1.0);
        let want: Vec<f64> = ks.iter().map(|&k| lccdf_ref(k, theta)).collect();
        close(&format!("binomial_lccdf at {theta}"), &host(&b.lccdf(t1(&[theta], &d))), &want, 1e-10, 1.0);
        for k in [3.0, 11.0] {
            grad_check(
                "binomial_lcdf in theta",
                &[theta],
                |p| Binomial::<1>::new(t1(&[k], &dev()), n_trials).unwrap().lcdf(p),
                |p| lcdf_ref(k, p[0]),
                1e-5,
            );
            grad_check(
                "binomial_lccdf in theta",
                &[theta],
                |p| Binomial::<1>::new(t1(&[k], &dev()), n_trials).unwrap().lccdf(p),
                |p| lccdf_ref(k, p[0]),
                1e-5,
            );
        }
    }
    let ln_pois = |k: f64, l: f64| k * l.ln() - l - lgamma_ref(k + 1.0);
    let counts = [0.0, 3.0, 40.0];
    for lambda in [0.01, 2.5, 30.0] {
        let lcdf_ref = |k: f64, l: f64| log_sum((0..=k as usize).map(|j| ln_pois(j as f64, l)).collect());
        let lccdf_ref =
            |k: f64, l: f64| log_sum((k as usize + 1..k as usize + 400).map(|j| ln_pois(j as f64, l)).collect());
        let p = PoissonLog::<1>::new(t1(&counts, &d)).unwrap();
        let want: Vec<f64> = counts.iter().map(|&k| lcdf_ref(k, lambda)).collect();
        close(&format!("poisson_lcdf at {lambda}"), &host(&p.lcdf_rate(t1(&[lambda], &d))), &want, 1e-10, 1.0);
        let want: Vec<f64> = counts.iter().map(|&k| lccdf_ref(k, lambda)).collect();
        close(&format!("poisson_lccdf at {lambda}"), &host(&p.lccdf_rate(t1(&[lambda], &d))), &want, 1e-10, 1.0);
        grad_check(
            "poisson_lccdf in lambda",
            &[lambda],
            |l| PoissonLog::<1>::new(t1(&counts, &dev())).unwrap().lccdf_rate(l),
            |l| counts.iter().map(|&k| lccdf_ref(k, l[0])).sum(),
            1e-5,
        );
    }
}

#[test]
fn laplace_uniform_and_new_continuous_cdfs_in_both_tails() {
    let d = dev();
    // double_exponential(mu, sigma): closed forms, far on both sides.
    let (mu, s) = (1.0, 2.0);
    let xs = [-80.0, -1.0, 1.0, 2.5, 60.0];
    let lap_lcdf = |x: f64| if x < mu { (0.5f64).ln() + (x - mu) / s } else { (-0.5 * (-(x - mu) / s).exp()).ln_1p() };
    let lap_lccdf = |x: f64| if x > mu { (0.5f64).ln() - (x - mu) / s } else { (-0.5 * ((x - mu) / s).exp()).ln_1p() };
    elementwise("double_exponential_lcdf", &xs, |x| Laplace::<1>::new(mu, s).unwrap().lcdf(x), lap_lcdf, 1e-13, true);
    elementwise(
        "double_exponential_lccdf",
        &xs,
        |x| Laplace::<1>::new(mu, s).unwrap().lccdf(x),
        lap_lccdf,
        1e-13,
        true,
    );
    // uniform(-1, 3)
    let u = Uniform::<1>::new(-1.0, 3.0).unwrap();
    let xs: [f64; 6] = [-2.0, -1.0, -0.999, 1.0, 3.0, 4.0];
    let want: Vec<f64> = xs.iter().map(|&x| ((x + 1.0) / 4.0).clamp(0.0, 1.0).ln()).collect();
    close("uniform_lcdf", &host(&u.lcdf(t1(&xs, &d))), &want, 1e-13, 1.0);
    let want: Vec<f64> = xs.iter().map(|&x| ((3.0 - x) / 4.0).clamp(0.0, 1.0).ln()).collect();
    close("uniform_lccdf", &host(&u.lccdf(t1(&xs, &d))), &want, 1e-13, 1.0);
    grad_check(
        "uniform_lcdf in the bounds",
        &[-1.0, 3.0],
        |p| Uniform::<1>::new(p.clone().narrow(0, 0, 1), p.narrow(0, 1, 1)).unwrap().lcdf(t1(&[0.5], &dev())),
        |p| ((0.5 - p[0]) / (p[1] - p[0])).ln(),
        1e-6,
    );

    // rayleigh(sigma): F = 1 - e^(-x^2 / (2 sigma^2)).
    let sig = 1.5;
    let r = Rayleigh::<1>::new(sig).unwrap();
    let xs = [1e-4, 0.5, 2.0, 30.0];
    let hs = |x: f64| x * x / (2.0 * sig * sig);
    elementwise(
        "rayleigh_lcdf",
        &xs,
        |x| Rayleigh::<1>::new(sig).unwrap().lcdf(x),
        |x| (-(-hs(x)).exp_m1()).ln(),
        1e-12,
        true,
    );
    elementwise("rayleigh_lccdf", &xs, |x| Rayleigh::<1>::new(sig).unwrap().lccdf(x), |x| -hs(x), 1e-13, true);
    let ray_lpdf = |x: f64| x.ln() - 2.0 * sig.ln() - hs(x);
    close("rayleigh_lpdf", &lpdf(&r, &xs), &xs.map(ray_lpdf), 1e-13, 1.0);
    close("rayleigh_lpdf outside", &lpdf(&r, &[-1.0, 0.0]), &[f64::NEG_INFINITY; 2], 0.0, 0.0);
    let to = grid(1e-12, 2.0, 20_000);
    assert!((simpson(&to, &lpdf(&r, &to)).ln() - host(&r.lcdf(t1(&[2.0], &d)))[0]).abs() < 1e-8);

    // loglogistic(alpha, beta): F = 1 / (1 + (x / alpha)^-beta).
    let (al, be) = (2.0, 3.0);
    let ll = LogLogistic::<1>::new(al, be).unwrap();
    let xs = [1e-5, 0.5, 2.0, 7.0, 1e4];
    let t = |x: f64| be * (x / al).ln();
    // (Gradients from 0.5 on: the central difference's step is too coarse at 1e-5.)
    let ll_lpdf = |x: f64| be.ln() - al.ln() + (be - 1.0) * (x / al).ln() - 2.0 * softplus_ref(t(x));
    close("loglogistic_lpdf", &lpdf(&ll, &xs), &xs.map(ll_lpdf), 1e-13, 1.0);
    let lcdf = |x| LogLogistic::<1>::new(al, be).unwrap().lcdf(x);
    let lccdf = |x| LogLogistic::<1>::new(al, be).unwrap().lccdf(x);
    elementwise("loglogistic_lcdf", &xs[..1], lcdf, |x| -softplus_ref(-t(x)), 1e-13, false);
    elementwise("loglogistic_lcdf", &xs[1..], lcdf, |x| -softplus_ref(-t(x)), 1e-13, true);
    elementwise("loglogistic_lccdf", &xs, lccdf, |x| -softplus_ref(t(x)), 1e-13, true);
    let to = grid(1e-12, 3.0, 30_000);
    assert!((simpson(&to, &lpdf(&ll, &to)).ln() - host(&ll.lcdf(t1(&[3.0], &d)))[0]).abs() < 1e-8);

    // pareto_type_2(mu, lambda, alpha): F = 1 - (1 + (x - mu) / lambda)^-alpha.
    let (m2, lam, a2) = (0.5, 2.0, 3.0);
    let p2 = ParetoType2::<1>::new(m2, lam, a2).unwrap();
    let xs = [0.5 + 1e-9, 1.0, 5.0, 1e6];
    let lg = |x: f64| ((x - m2) / lam).ln_1p();
    close("pareto_type_2_lpdf", &lpdf(&p2, &xs), &xs.map(|x| a2.ln() - lam.ln() - (a2 + 1.0) * lg(x)), 1e-13, 1.0);
    close("pareto_type_2 below mu", &lpdf(&p2, &[0.0]), &[f64::NEG_INFINITY], 0.0, 0.0);
    let pt2 = || ParetoType2::<1>::new(m2, lam, a2).unwrap();
    let lcdf_ref = |x: f64| (-(-a2 * lg(x)).exp_m1()).ln();
    // (Gradients away from mu, where the central difference would step across it.)
    elementwise("pareto_type_2_lcdf", &xs[..1], |x| pt2().lcdf(x), lcdf_ref, 1e-8, false);
    elementwise("pareto_type_2_lcdf", &xs[1..], |x| pt2().lcdf(x), lcdf_ref, 1e-12, true);
    elementwise("pareto_type_2_lccdf", &xs[1..], |x| pt2().lccdf(x), |x| -a2 * lg(x), 1e-13, true);
    grad_check(
        "pareto_type_2 in mu, lambda, alpha",
        &[m2, lam, a2],
        |p| {
            ParetoType2::<1>::new(p.clone().narrow(0, 0, 1), p.clone().narrow(0, 1, 1), p.narrow(0, 2, 1))
                .unwrap()
                .log_prob(t1(&[1.0, 5.0], &dev()))
        },
        |p| [1.0, 5.0].iter().map(|&x| p[2].ln() - p[1].ln() - (p[2] + 1.0) * ((x - p[0]) / p[1]).ln_1p()).sum(),
        1e-6,
    );

    // skew_double_exponential(mu, sigma, tau): the Functions Reference's density and its cdf.
    let (m3, s3, tau): (f64, f64, f64) = (1.0, 2.0, 0.3);
    let sde = |x: f64| {
        let side = if x < m3 { (1.0 - tau) * (m3 - x) } else { tau * (x - m3) };
        2f64.ln() + tau.ln() + (1.0 - tau).ln() - s3.ln() - 2.0 / s3 * side
    };
    let sde_lcdf = |x: f64| {
        if x < m3 {
            tau.ln() - 2.0 / s3 * (1.0 - tau) * (m3 - x)
        } else {
            (-(1.0 - tau) * (-2.0 / s3 * tau * (x - m3)).exp()).ln_1p()
        }
    };
    let sde_lccdf = |x: f64| {
        if x < m3 {
            (-tau * (-2.0 / s3 * (1.0 - tau) * (m3 - x)).exp()).ln_1p()
        } else {
            (1.0 - tau).ln() - 2.0 / s3 * tau * (x - m3)
        }
    };
    let xs = [-200.0, -1.0, 0.99, 1.5, 300.0];
    let dist = || SkewDoubleExponential::<1>::new(m3, s3, tau).unwrap();
    close("skew_double_exponential_lpdf", &lpdf(&dist(), &xs), &xs.map(sde), 1e-13, 1.0);
    elementwise("skew_double_exponential_lcdf", &xs, |x| dist().lcdf(x), sde_lcdf, 1e-13, true);
    elementwise("skew_double_exponential_lccdf", &xs, |x| dist().lccdf(x), sde_lccdf, 1e-13, true);
    let to = grid(-40.0, 0.0, 40_000);
    assert!((simpson(&to, &lpdf(&dist(), &to)).ln() - sde_lcdf(0.0)).abs() < 1e-8);
    grad_check(
        "skew_double_exponential in tau",
        &[tau],
        |p| SkewDoubleExponential::<1>::new(m3, s3, p).unwrap().lcdf(t1(&[-1.0, 4.0], &dev())),
        |p| {
            let t = p[0];
            (t.ln() - 2.0 / s3 * (1.0 - t) * 2.0) + (-(1.0 - t) * (-2.0 / s3 * t * 3.0).exp()).ln_1p()
        },
        1e-6,
    );

    // Bad parameters are errors naming them.
    invalid(Rayleigh::<1>::new(-1.0), "Rayleigh", "sigma");
    invalid(LogLogistic::<1>::new(1.0, 0.0), "LogLogistic", "beta");
    invalid(ParetoType2::<1>::new(0.0, -2.0, 1.0), "ParetoType2", "lambda");
    invalid(SkewDoubleExponential::<1>::new(0.0, 1.0, 1.5), "SkewDoubleExponential", "tau");
}

#[test]
fn expm1_and_inv_cloglog_keep_their_relative_precision() {
    let xs = [-50.0, -1.0, -0.5, -1e-3, -1e-12, 0.0, 1e-12, 1e-5, 0.3, 0.5, 2.0, 30.0];
    elementwise("expm1", &xs, expm1, f64::exp_m1, 1e-11, true);
    let inv_cloglog_ref = |x: f64| -(-x.exp()).exp_m1();
    elementwise("inv_cloglog", &[-700.0, -30.0, -1.0, 0.0, 1.0, 3.0], inv_cloglog, inv_cloglog_ref, 1e-11, true);
    // f32 near 0 and far left, where 1 - exp(-exp(x)) would cancel to 0.
    let d = dev();
    let x = Tensor::<1>::from_data(TensorData::new(vec![1e-6f32, -40.0], [2]), &d);
    close("f32 expm1", &host(&expm1(x.clone()))[..1], &[(1e-6f32 as f64).exp_m1()], 1e-6, 0.0);
    close("f32 inv_cloglog", &host(&inv_cloglog(x))[1..], &[inv_cloglog_ref(-40.0)], 1e-6, 0.0);
}

// ---------------------------------------------------------------------------------------------
// The remaining GLMs, neg_binomial and dirichlet_multinomial.

#[test]
fn remaining_glms_match_their_elementwise_likelihoods() {
    let d = dev();
    let (n_obs, k) = (5, 3);
    let x: Vec<f64> = (0..n_obs * k).map(|i| ((i * 7 % 5) as f64 - 2.0) * 0.6).collect();
    let beta = [0.5, -1.0, 2.0, 0.1, 0.0, -0.3]; // two particles
    let alpha = [0.25, -1.5];
    let xb = |p: usize, i: usize| (0..k).map(|j| x[i * k + j] * beta[p * k + j]).sum::<f64>();
    let eta = |p: usize, i: usize| alpha[p] + xb(p, i);
    let each =
        |f: &dyn Fn(usize, usize) -> f64| -> Vec<f64> { (0..2 * n_obs).map(|e| f(e / n_obs, e % n_obs)).collect() };

    // binomial_logit_glm
    let (counts, trials) = ([0.0, 3.0, 1.0, 8.0, 2.0], [2.0, 3.0, 10.0, 9.0, 4.0]);
    let glm = BinomialLogitGlm::new(t1(&counts, &d), t1(&trials, &d), t2(&x, n_obs, k, &d)).unwrap();
    let got = host(&glm.log_prob(t2(&alpha, 2, 1, &d), t2(&beta, 2, k, &d)).unwrap());
    let want = each(&|p, i| {
        let e = eta(p, i);
        lchoose_ref(trials[i], counts[i]) - counts[i] * softplus_ref(-e) - (trials[i] - counts[i]) * softplus_ref(e)
    });
    close("binomial_logit_glm", &got, &want, 1e-12, 1.0);
    invalid(BinomialLogitGlm::new(t1(&counts, &d), 2.0, t2(&x, n_obs, k, &d)), "BinomialLogit", "counts");

    // neg_binomial_2_log_glm, phi per particle
    let phi = [2.0, 40.0];
    let glm = NegBinomial2LogGlm::new(t1(&counts, &d), t2(&x, n_obs, k, &d)).unwrap();
    let got = host(&glm.log_prob(t2(&alpha, 2, 1, &d), t2(&beta, 2, k, &d), t2(&phi, 2, 1, &d)).unwrap());
    let nb2_ref = |n: f64, e: f64, ph: f64| {
        let mu = e.exp();
        lgamma_ref(n + ph) - lgamma_ref(ph) - lgamma_ref(n + 1.0)
            + n * (mu / (mu + ph)).ln()
            + ph * (ph / (mu + ph)).ln()
    };
    let want = each(&|p, i| nb2_ref(counts[i], eta(p, i), phi[p]));
    close("neg_binomial_2_log_glm", &got, &want, 1e-9, 1.0);
    invalid(glm.log_prob(0.0, t2(&beta, 2, k, &d), -1.0), "NegBinomial2LogGlm", "phi");
    grad_check(
        "neg_binomial_2_log_glm in beta",
        &beta[..3],
        |b| {
            let glm = NegBinomial2LogGlm::new(t1(&counts, &dev()), t2(&x, n_obs, k, &dev())).unwrap();
            glm.log_prob(0.25, b.reshape([1, 3]), 2.0).unwrap().reshape([n_obs])
        },
        |b| (0..n_obs).map(|i| nb2_ref(counts[i], 0.25 + (0..k).map(|j| x[i * k + j] * b[j]).sum::<f64>(), 2.0)).sum(),
        1e-6,
    );

    // ordered_logistic_glm: x beta against cut points, 4 categories.
    let y = [0usize, 3, 1, 2, 3];
    let cuts = [-1.0, 0.0, 1.5, -0.5, 0.5, 2.5];
    let glm = OrderedLogisticGlm::new(&y, 4, t2(&x, n_obs, k, &d)).unwrap();
    let got = host(&glm.log_prob(t2(&beta, 2, k, &d), t2(&cuts, 2, 3, &d)).unwrap());
    let inv_logit_ref = |v: f64| log_inv_logit_ref(v).exp();
    let want = each(&|p, i| {
        let e = xb(p, i);
        let c = &cuts[p * 3..p * 3 + 3];
        let upper = if y[i] == 0 { 1.0 } else { inv_logit_ref(e - c[y[i] - 1]) };
        let lower = if y[i] == 3 { 0.0 } else { inv_logit_ref(e - c[y[i]]) };
        (upper - lower).ln()
    });
    close("ordered_logistic_glm", &got, &want, 1e-11, 1.0);
    invalid(OrderedLogisticGlm::new(&[0, 4], 4, t2(&x[..6], 2, 3, &d)), "OrderedLogistic", "y");

    // categorical_logit_glm: 3 categories, alpha [n, C], beta [n, K, C].
    let yc = [2usize, 0, 1, 1, 2];
    let c = 3;
    let alpha_c = [0.1, -0.2, 0.3, 0.0, 0.5, -1.0];
    let beta_c: Vec<f64> = (0..2 * k * c).map(|i| ((i * 5 % 7) as f64 - 3.0) * 0.4).collect();
    let glm = CategoricalLogitGlm::new(&yc, c, t2(&x, n_obs, k, &d)).unwrap();
    let got = host(&glm.log_prob(t2(&alpha_c, 2, c, &d), t3(&beta_c, [2, k, c], &d)).unwrap());
    let want = each(&|p, i| {
        let lin: Vec<f64> = (0..c)
            .map(|cat| {
                alpha_c[p * c + cat] + (0..k).map(|j| x[i * k + j] * beta_c[p * k * c + j * c + cat]).sum::<f64>()
            })
            .collect();
        let m = lin.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        lin[yc[i]] - m - lin.iter().map(|l| (l - m).exp()).sum::<f64>().ln()
    });
    close("categorical_logit_glm", &got, &want, 1e-12, 1.0);
    invalid(
        glm.log_prob(t2(&alpha_c, 2, c, &d), t3(&beta_c[..2 * c * 2], [2, 2, c], &d)),
        "CategoricalLogitGlm",
        "beta",
    );
}

#[test]
fn neg_binomial_and_dirichlet_multinomial_sum_to_one() {
    let d = dev();
    // neg_binomial(alpha, beta): the Functions Reference's mass function, and its sum.
    let ks: Vec<f64> = (0..400).map(f64::from).collect();
    for (a, b) in [(0.5, 0.2), (3.0, 1.5), (1e4, 2e3)] {
        let lp = host(&NegBinomial::<1>::new(t1(&ks, &d)).unwrap().log_prob(a, b).unwrap());
        let total: f64 = lp.iter().map(|l| l.exp()).sum();
        assert!((total - 1.0).abs() < 1e-8, "neg_binomial({a}, {b}) sums to {total}");
        let want: Vec<f64> = ks
            .iter()
            .take(30)
            .map(|&n| {
                lgamma_ref(n + a) - lgamma_ref(a) - lgamma_ref(n + 1.0) + a * (b / (1.0 + b)).ln() - n * b.ln_1p()
            })
            .collect();
        close(&format!("neg_binomial({a}, {b})"), &lp[..30], &want, 1e-8, 1.0);
    }
    grad_check(
        "neg_binomial in alpha",
        &[3.0],
        |p| NegBinomial::<1>::new(t1(&[0.0, 4.0], &dev())).unwrap().log_prob(p, 1.5).unwrap(),
        |p| {
            [0.0, 4.0]
                .iter()
                .map(|&n| lgamma_ref(n + p[0]) - lgamma_ref(p[0]) + p[0] * (1.5f64 / 2.5).ln() - n * 1.5f64.ln_1p())
                .sum()
        },
        1e-6,
    );
    invalid(NegBinomial::<1>::new(t1(&[1.0], &d)).unwrap().log_prob(-1.0, 1.0), "NegBinomial", "alpha");

    // dirichlet_multinomial: every composition of N = 5 into 3 parts, for two particles.
    let mut rows = Vec::new();
    for i in 0..=5 {
        for j in 0..=5 - i {
            rows.extend([i as f64, j as f64, (5 - i - j) as f64]);
        }
    }
    let m = rows.len() / 3;
    let alpha = [0.5, 2.0, 7.0, 100.0, 0.1, 1.0];
    let dm = DirichletMultinomial::new(t2(&rows, m, 3, &d)).unwrap();
    let lp = host(&dm.log_prob(t3(&alpha, [2, 1, 3], &d)).unwrap());
    for p in 0..2 {
        let a = &alpha[p * 3..p * 3 + 3];
        let a0: f64 = a.iter().sum();
        let total: f64 = lp[p * m..(p + 1) * m].iter().map(|l| l.exp()).sum();
        assert!((total - 1.0).abs() < 1e-9, "dirichlet_multinomial({a:?}) sums to {total}");
        let want: Vec<f64> = (0..m)
            .map(|r| {
                let y = &rows[r * 3..r * 3 + 3];
                lgamma_ref(6.0) + lgamma_ref(a0) - lgamma_ref(5.0 + a0)
                    + (0..3).map(|c| lgamma_ref(y[c] + a[c]) - lgamma_ref(a[c]) - lgamma_ref(y[c] + 1.0)).sum::<f64>()
            })
            .collect();
        close("dirichlet_multinomial", &lp[p * m..(p + 1) * m], &want, 1e-8, 1.0);
    }
    invalid(DirichletMultinomial::new(t2(&[1.0, -1.0], 1, 2, &d)), "DirichletMultinomial", "counts");
    invalid(dm.log_prob(t3(&alpha[..4], [2, 1, 2], &d)), "DirichletMultinomial", "alpha");
}

// ---------------------------------------------------------------------------------------------
// multi_normal_prec, multi_student_t_cholesky and the Wishart family.

/// `ln Gamma_K(x)`, the multivariate log-gamma function.
fn lmgamma_ref(k: usize, x: f64) -> f64 {
    (k * (k - 1)) as f64 / 4.0 * PI.ln() + (0..k).map(|j| lgamma_ref(x - j as f64 / 2.0)).sum::<f64>()
}

/// A 2 x 2 symmetric matrix `[a, b; b, c]` as `(det, inverse entries (a', b', c'))`.
fn inv2(m: &[f64]) -> (f64, [f64; 3]) {
    let (a, b, c) = (m[0], m[1], m[3]);
    let det = a * c - b * b;
    (det, [c / det, -b / det, a / det])
}

/// `tr(A B)` for symmetric 2 x 2 `A = [a0, a1; a1, a2]` and `B` as a full row-major matrix.
fn trace2(a: [f64; 3], b: &[f64]) -> f64 {
    a[0] * b[0] + a[1] * b[2] + a[1] * b[1] + a[2] * b[3]
}

/// The lower Cholesky factor of a 2 x 2 SPD matrix, row-major.
fn chol2(m: &[f64]) -> [f64; 4] {
    let l00 = m[0].sqrt();
    let l10 = m[2] / l00;
    [l00, 0.0, l10, (m[3] - l10 * l10).sqrt()]
}

#[test]
fn multi_normal_prec_and_multi_student_t_cholesky_against_two_by_two_forms() {
    let d = dev();
    let omega = [2.0, 0.6, 0.6, 1.0, 1.0, 2.0, 2.0, 1.0]; // the second is not positive definite
    let mu = [0.5, -1.0, 0.0, 0.0];
    let y = [1.0, 0.5];
    let (r0, r1) = (y[0] - mu[0], y[1] - mu[1]);
    let (a, b, c) = (omega[0], omega[1], omega[3]);
    let det = a * c - b * b;
    let q = a * r0 * r0 + 2.0 * b * r0 * r1 + c * r1 * r1;
    let mnp = MultiNormalPrec::new(Some(t2(&mu, 2, 2, &d)), t3(&omega, [2, 2, 2], &d)).unwrap();
    let got = host(&mnp.log_prob(t2(&y, 1, 2, &d)).unwrap());
    close("multi_normal_prec", &got, &[-(2.0 * PI).ln() + 0.5 * det.ln() - 0.5 * q, f64::NEG_INFINITY], 1e-13, 1.0);
    grad_check(
        "multi_normal_prec in y",
        &y,
        |t| {
            MultiNormalPrec::new(Some(t2(&mu[..2], 1, 2, &dev())), t3(&omega[..4], [1, 2, 2], &dev()))
                .unwrap()
                .log_prob(t.reshape([1, 2]))
                .unwrap()
        },
        |y| {
            let (r0, r1) = (y[0] - mu[0], y[1] - mu[1]);
            0.5 * det.ln() - 0.5 * (a * r0 * r0 + 2.0 * b * r0 * r1 + c * r1 * r1)
        },
        1e-6,
    );

    // multi_student_t_cholesky with L = chol(Sigma) against the Sigma form's closed density.
    let sigma = [2.0, 0.6, 0.6, 1.0];
    let l = chol2(&sigma);
    let (sdet, sinv) = inv2(&sigma);
    let qs = sinv[0] * r0 * r0 + 2.0 * sinv[1] * r0 * r1 + sinv[2] * r1 * r1;
    let nu = 4.5;
    let want = lgamma_ref((nu + 2.0) / 2.0)
        - lgamma_ref(nu / 2.0)
        - (nu * PI).ln()
        - 0.5 * sdet.ln()
        - (nu + 2.0) / 2.0 * (qs / nu).ln_1p();
    let bad_l = [1.0, 0.0, 0.3, -1.0];
    let ls: Vec<f64> = l.iter().chain(&bad_l).copied().collect();
    let st = MultiStudentT::from_cholesky(nu, Some(t2(&mu[..2], 1, 2, &d)), t3(&ls, [2, 2, 2], &d)).unwrap();
    close(
        "multi_student_t_cholesky",
        &host(&st.log_prob(t2(&y, 1, 2, &d)).unwrap()),
        &[want, f64::NEG_INFINITY],
        1e-12,
        1.0,
    );
    invalid(MultiStudentT::from_cholesky(0.0, None, t3(&l, [1, 2, 2], &d)), "multi_student_t_cholesky", "nu");
}

#[test]
fn wishart_family_against_two_by_two_densities() {
    let d = dev();
    let k = 2usize;
    let s = [1.5, 0.4, 0.4, 0.8];
    let w = [2.0, -0.3, -0.3, 0.7];
    let (sdet, sinv) = inv2(&s);
    let (wdet, winv) = inv2(&w);
    let kf = k as f64;
    let wishart_ref = |nu: f64| {
        0.5 * (nu - kf - 1.0) * wdet.ln()
            - 0.5 * trace2(sinv, &w)
            - 0.5 * nu * kf * 2f64.ln()
            - 0.5 * nu * sdet.ln()
            - lmgamma_ref(k, 0.5 * nu)
    };
    let inv_wishart_ref = |nu: f64| {
        0.5 * nu * sdet.ln()
            - 0.5 * (nu + kf + 1.0) * wdet.ln()
            - 0.5 * trace2(winv, &s)
            - 0.5 * nu * kf * 2f64.ln()
            - lmgamma_ref(k, 0.5 * nu)
    };
    // ln |d W / d L_W| = K ln 2 + sum_i (K - i) ln L_ii (0-based i).
    let lw = chol2(&w);
    let jac = kf * 2f64.ln() + 2.0 * lw[0].ln() + lw[3].ln();
    let t_s = || t3(&s, [1, 2, 2], &dev());
    let t_w = || t3(&w, [1, 2, 2], &dev());
    let t_ls = || t3(&chol2(&s), [1, 2, 2], &dev());
    let t_lw = || t3(&lw, [1, 2, 2], &dev());
    for nu in [1.5, 4.0, 30.0] {
        let got = host(&Wishart::new(nu, t_s()).unwrap().log_prob(t_w()).unwrap())[0];
        close("wishart", &[got], &[wishart_ref(nu)], 1e-12, 1.0);
        let got = host(&InvWishart::new(nu, t_s()).unwrap().log_prob(t_w()).unwrap())[0];
        close("inv_wishart", &[got], &[inv_wishart_ref(nu)], 1e-12, 1.0);
        let got = host(&WishartCholesky::new(nu, t_ls()).unwrap().log_prob(t_lw()).unwrap())[0];
        close("wishart_cholesky", &[got], &[wishart_ref(nu) + jac], 1e-12, 1.0);
        let got = host(&InvWishartCholesky::new(nu, t_ls()).unwrap().log_prob(t_lw()).unwrap())[0];
        close("inv_wishart_cholesky", &[got], &[inv_wishart_ref(nu) + jac], 1e-12, 1.0);
    }
    // A tensor nu per particle, its gradient; and W's gradient.
    grad_check(
        "wishart_cholesky in nu",
        &[2.5, 7.0],
        |nu| WishartCholesky::new(nu, t_ls()).unwrap().log_prob(t_lw().expand([2, 2, 2])).unwrap(),
        |nu| nu.iter().map(|&v| wishart_ref(v) + jac).sum(),
        1e-6,
    );
    grad_check(
        "inv_wishart in W",
        &w,
        |t| InvWishart::new(3.0, t_s()).unwrap().log_prob(t.reshape([1, 2, 2])).unwrap(),
        |m| {
            // linalg::cholesky's backward pass gives a symmetric gradient: each off-diagonal
            // entry carries half of the derivative along the symmetric direction.
            let off = 0.5 * (m[1] + m[2]);
            let m = [m[0], off, off, m[3]];
            let (det, inv) = inv2(&m);
            0.5 * 3.0 * sdet.ln()
                - 0.5 * (3.0 + kf + 1.0) * det.ln()
                - 0.5 * trace2(inv, &s)
                - 1.5 * kf * 2f64.ln()
                - lmgamma_ref(k, 1.5)
        },
        1e-6,
    );
    // Not positive definite, and nu outside (K - 1, inf).
    let not_pd = t3(&[1.0, 2.0, 2.0, 1.0], [1, 2, 2], &d);
    assert_eq!(host(&Wishart::new(3.0, t_s()).unwrap().log_prob(not_pd).unwrap()), [f64::NEG_INFINITY]);
    invalid(WishartCholesky::new(0.5, t_ls()), "wishart_cholesky", "nu");
    invalid(InvWishart::new(1.0, t_s()), "inv_wishart", "nu");
}

#[test]
fn student_t_batched_cdfs_in_both_tails_with_gradients_in_df() {
    // P(T > |t|): closed forms for nu = 1 and 2 (written to keep the far tail), else
    // I_{nu / (nu + t^2)}(nu / 2, 1 / 2) / 2 by quadrature.
    let ln_far = |t: f64, nu: f64| {
        let a = t.abs();
        if nu == 1.0 {
            ((1.0 / a).atan() / PI).ln()
        } else if nu == 2.0 {
            let s = (a * a + 2.0).sqrt();
            -(s * (s + a)).ln()
        } else {
            ln_inc_beta_quad(nu / 2.0, 0.5, nu / (nu + t * t)).0 - LN_2
        }
    };
    let log1m_exp_ref = |l: f64| if l > -LN_2 { (-l.exp_m1()).ln() } else { (-l.exp()).ln_1p() };
    let lcdf_ref = |[t, nu]: [f64; 2]| if t < 0.0 { ln_far(t, nu) } else { log1m_exp_ref(ln_far(t, nu)) };
    let lccdf_ref = |[t, nu]: [f64; 2]| if t > 0.0 { ln_far(t, nu) } else { log1m_exp_ref(ln_far(t, nu)) };
    let mut points = Vec::new();
    for nu in [1.0, 2.0, 4.5, 30.0] {
        for t in [-30.0, -2.0, -0.3, 0.7, 5.0, 200.0] {
            points.push([t, nu]);
        }
    }
    let lcdf = |[t, nu]: [Tensor<1>; 2]| StudentT::<1>::new(nu, 0.0, 1.0).unwrap().lcdf_batched(t);
    let lccdf = |[t, nu]: [Tensor<1>; 2]| StudentT::<1>::new(nu, 0.0, 1.0).unwrap().lccdf_batched(t);
    // Gradients in df where the quadrature reference is smooth in it (not the closed forms).
    let (closed, quad) = points.split_at(12);
    check_points("student_t_lcdf", closed, lcdf, lcdf_ref, 1e-11, [true, false], 1e-5);
    check_points("student_t_lccdf", closed, lccdf, lccdf_ref, 1e-11, [true, false], 1e-5);
    check_points("student_t_lcdf", quad, lcdf, lcdf_ref, 1e-9, [true; 2], 1e-5);
    check_points("student_t_lccdf", quad, lccdf, lccdf_ref, 1e-9, [true; 2], 1e-5);
    // At the location: ln 1/2 on both sides for every df, derivative f(0) / (1/2).
    let d = dev();
    for nu in [1.0, 4.5] {
        let f0 = (lgamma_ref((nu + 1.0) / 2.0) - lgamma_ref(nu / 2.0) - 0.5 * (nu * PI).ln()).exp();
        let st = StudentT::<1>::new(t1(&[nu], &d), 0.0, 1.0).unwrap();
        close("student_t_lcdf at 0", &host(&st.lcdf_batched(t1(&[0.0], &d))), &[-LN_2], 1e-14, 1.0);
        let (_, g) = value_and_grad(t1(&[0.0], &d), |t| {
            StudentT::<1>::new(t1(&[nu], &dev()), 0.0, 1.0).unwrap().lccdf_batched(t)
        })
        .unwrap();
        close("student_t_lccdf slope at 0", &host(&g), &[-2.0 * f0], 1e-12, 0.0);
        let (_, g) = value_and_grad(t1(&[nu], &d), |nu| {
            StudentT::<1>::new(nu, 0.0, 1.0).unwrap().lcdf_batched(t1(&[0.0], &dev()))
        })
        .unwrap();
        close("student_t_lcdf df-slope at 0", &host(&g), &[0.0], 0.0, 1e-12);
    }
    // Location and scale through t = (x - loc) / scale; the host version agrees.
    grad_check(
        "student_t_lccdf in loc, scale",
        &[0.5, 2.0],
        |p| {
            StudentT::<1>::new(3.0, p.clone().narrow(0, 0, 1), p.narrow(0, 1, 1))
                .unwrap()
                .lccdf_batched(t1(&[-1.0, 9.0], &dev()))
        },
        |p| [-1.0, 9.0].iter().map(|&x| lccdf_ref([(x - p[0]) / p[1], 3.0])).sum(),
        1e-6,
    );
    let host_side = StudentT::<1>::new(3.0, 0.5, 2.0).unwrap().lccdf(9.0).unwrap();
    let batched = host(&StudentT::<1>::new(3.0, 0.5, 2.0).unwrap().lccdf_batched(t1(&[9.0], &d)))[0];
    assert!((host_side - batched).abs() < 1e-12, "host {host_side} vs batched {batched}");
}

#[test]
fn neg_binomial_2_cdfs_against_sums_of_the_mass_function() {
    let d = dev();
    let ln_pmf = |n: f64, mu: f64, phi: f64| {
        lgamma_ref(n + phi) - lgamma_ref(phi) - lgamma_ref(n + 1.0)
            + n * (mu / (mu + phi)).ln()
            + phi * (phi / (mu + phi)).ln()
    };
    let log_sum = |terms: Vec<f64>| {
        let m = terms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        m + terms.iter().map(|t| (t - m).exp()).sum::<f64>().ln()
    };
    let lcdf_ref = |k: f64, mu: f64, phi: f64| log_sum((0..=k as usize).map(|j| ln_pmf(j as f64, mu, phi)).collect());
    let lccdf_ref = |k: f64, mu: f64, phi: f64| {
        log_sum((k as usize + 1..k as usize + 3000).map(|j| ln_pmf(j as f64, mu, phi)).collect())
    };
    let counts = [0.0, 3.0, 40.0];
    for (mu, phi) in [(0.05, 2.0), (4.0, 0.7), (30.0, 50.0)] {
        let nb = NegBinomial2::<1>::new(t1(&counts, &d)).unwrap();
        let want: Vec<f64> = counts.iter().map(|&k| lcdf_ref(k, mu, phi)).collect();
        let got = host(&nb.lcdf(t1(&[mu], &d), phi).unwrap());
        close(&format!("neg_binomial_2_lcdf({mu}, {phi})"), &got, &want, 1e-9, 1.0);
        let want: Vec<f64> = counts.iter().map(|&k| lccdf_ref(k, mu, phi)).collect();
        let got = host(&nb.lccdf(t1(&[mu], &d), phi).unwrap());
        close(&format!("neg_binomial_2_lccdf({mu}, {phi})"), &got, &want, 1e-9, 1.0);
        grad_check(
            "neg_binomial_2_lccdf in mu, phi",
            &[mu, phi],
            |p| {
                NegBinomial2::<1>::new(t1(&counts, &dev()))
                    .unwrap()
                    .lccdf(p.clone().narrow(0, 0, 1), p.narrow(0, 1, 1))
                    .unwrap()
            },
            |p| counts.iter().map(|&k| lccdf_ref(k, p[0], p[1])).sum(),
            1e-5,
        );
    }
    invalid(NegBinomial2::<1>::new(t1(&[1.0], &d)).unwrap().lcdf(t1(&[1.0], &d), 0.0), "NegBinomial2", "phi");
    // neg_binomial(alpha, beta) is neg_binomial_2(alpha / beta, alpha).
    let (alpha, beta) = (2.5, 0.4);
    let nb = NegBinomial::<1>::new(t1(&counts, &d)).unwrap();
    let want: Vec<f64> = counts.iter().map(|&k| lcdf_ref(k, alpha / beta, alpha)).collect();
    close("neg_binomial_lcdf", &host(&nb.lcdf(alpha, beta).unwrap()), &want, 1e-9, 1.0);
    let want: Vec<f64> = counts.iter().map(|&k| lccdf_ref(k, alpha / beta, alpha)).collect();
    close("neg_binomial_lccdf", &host(&nb.lccdf(alpha, beta).unwrap()), &want, 1e-9, 1.0);
    invalid(nb.lcdf(alpha, -1.0), "NegBinomial", "beta");
}

#[test]
fn trigamma_lmgamma_factorials_and_log_inv_logit_diff() {
    // trigamma(n) = pi^2 / 6 - sum_{k<n} 1/k^2; trigamma(1/2) = pi^2 / 2; elsewhere the series
    // sum_{k<1000} 1/(x + k)^2 plus the asymptotic tail at x + 1000.
    let trigamma_ref = |x: f64| {
        let z = x + 1000.0;
        (0..1000).map(|k| 1.0 / (x + k as f64).powi(2)).sum::<f64>() + 1.0 / z + 0.5 / (z * z) + 1.0 / (6.0 * z * z * z)
    };
    let d = dev();
    let exact = [PI * PI / 6.0, PI * PI / 6.0 - 1.0 - 0.25, PI * PI / 2.0];
    close("trigamma exact", &host(&trigamma(t1(&[1.0, 3.0, 0.5], &d))), &exact, 1e-10, 0.0);
    elementwise("trigamma", &[0.01, 0.3, 2.5, 40.0, 1e4], trigamma, trigamma_ref, 1e-9, true);
    let lmgamma_ref = |k: usize, x: f64| {
        (k * (k - 1)) as f64 / 4.0 * PI.ln() + (0..k).map(|j| lgamma_ref(x - j as f64 / 2.0)).sum::<f64>()
    };
    elementwise("lmgamma(3, x)", &[1.2, 4.0, 50.0], |x| lmgamma(3, x), |x| lmgamma_ref(3, x), 1e-8, true);
    let (x, n) = ([3.5, 100.0, 0.2], [2.0, 7.0, 0.0]);
    let rising: Vec<f64> = x.iter().zip(&n).map(|(&x, &n)| lgamma_ref(x + n) - lgamma_ref(x)).collect();
    close("log_rising_factorial", &host(&log_rising_factorial(t1(&x, &d), t1(&n, &d))), &rising, 1e-8, 1.0);
    let falling: Vec<f64> = x.iter().zip(&n).map(|(&x, &n)| lgamma_ref(x + 1.0) - lgamma_ref(x - n + 1.0)).collect();
    close("log_falling_factorial", &host(&log_falling_factorial(t1(&x, &d), t1(&n, &d))), &falling, 1e-8, 1.0);
    // ln(inv_logit(x) - inv_logit(y)), in the tails where the difference of probabilities
    // would round away: both near 1 (x = 40, y = 39), both near 0, and a wide gap.
    let (xs, ys) = ([40.0, -40.0, 2.0, 0.5, 1.0], [39.0, -41.0, -3.0, 0.5 - 1e-9, 1.0]);
    let want: Vec<f64> =
        xs.iter()
            .zip(&ys)
            .map(|(&x, &y)| {
                if x == y {
                    f64::NEG_INFINITY
                } else {
                    x - softplus_ref(x) - softplus_ref(y) + (-(y - x).exp_m1()).ln()
                }
            })
            .collect();
    close("log_inv_logit_diff", &host(&log_inv_logit_diff(t1(&xs, &d), t1(&ys, &d))), &want, 1e-12, 1.0);
    // Against the probabilities themselves where they are representable.
    let direct = (log_inv_logit_ref(2.0).exp() - log_inv_logit_ref(-3.0).exp()).ln();
    assert!((want[2] - direct).abs() < 1e-14);
    grad_check(
        "log_inv_logit_diff",
        &[2.0, -3.0],
        |p| log_inv_logit_diff(p.clone().narrow(0, 0, 1), p.narrow(0, 1, 1)),
        |p| (log_inv_logit_ref(p[0]).exp() - log_inv_logit_ref(p[1]).exp()).ln(),
        1e-6,
    );
}

/// The host kernels behind the incomplete gamma and beta functions read and write tensors of
/// every backend: flex, ndarray and wgpu (when it has an adapter) give the f64 values and
/// gradients to f32 precision, particle parameters `[n, 1]` broadcast against data `[1, N]`.
#[test]
fn incomplete_function_cdfs_agree_on_every_backend() {
    let mut backends = vec![BackendKind::Flex, BackendKind::Ndarray];
    match BackendKind::Wgpu.device() {
        Ok(_) => backends.push(BackendKind::Wgpu),
        Err(reason) => {
            if std::env::var_os("PARVI_REQUIRE_WGPU").is_some() {
                panic!("PARVI_REQUIRE_WGPU is set but wgpu is unavailable: {reason}");
            }
            eprintln!("SKIPPED wgpu: {reason}");
        }
    }
    let (shapes, xs) = ([0.5, 3.0, 30.0], [0.2, 40.0, 5.0, 2.0]);
    // Reference: f64 on flex; sum over the [3, 4] grid, gradient in the shapes [3, 1].
    let run = |device: &Device, dtype: DType| {
        let x = Tensor::<2>::from_data(TensorData::new(xs.to_vec(), [1, 4]).convert_dtype(dtype), (device, dtype));
        let a = Tensor::<2>::from_data(TensorData::new(shapes.to_vec(), [3, 1]).convert_dtype(dtype), (device, dtype));
        let (v, g) = value_and_grad(a, |a| {
            let gamma = Gamma::<2>::new(a.clone(), 1.0).unwrap().lccdf(x.clone());
            let beta = Beta::<2>::new(a, 2.0).unwrap().lcdf(x.clone().div_scalar(50.0));
            (gamma + beta).sum_dim(1).reshape([3])
        })
        .unwrap();
        (host(&v), host(&g))
    };
    let (want_v, want_g) = run(&dev(), DType::F64);
    for kind in backends {
        let device = kind.device().unwrap();
        let (v, g) = run(&device, DType::F32);
        close(&format!("{kind:?} values"), &v, &want_v, 1e-5, 1.0);
        close(&format!("{kind:?} gradients"), &g, &want_g, 1e-4, 1.0);
    }
}

#[test]
fn exp_mod_normal_cdfs_in_both_tails() {
    let d = dev();
    let (mu, sg, la) = (1.0, 0.7, 2.0);
    // The cdf Phi(z) - e^(s^2/2 - s z) Phi(z - s), s = lambda sigma, with the f64 normal cdf.
    let parts = |x: f64, mu: f64, sg: f64, la: f64| {
        let (z, s) = ((x - mu) / sg, la * sg);
        let (lp, lq) = ln_phi_ref(z);
        (lp, lq, 0.5 * s * s - s * z + ln_phi_ref(z - s).0)
    };
    let lcdf_ref = |x: f64, mu: f64, sg: f64, la: f64| {
        let (lp, _, e) = parts(x, mu, sg, la);
        lp + (-(e - lp).exp_m1()).ln()
    };
    let lccdf_ref = |x: f64, mu: f64, sg: f64, la: f64| {
        let (_, lq, e) = parts(x, mu, sg, la);
        let m = lq.max(e);
        m + ((lq - m).exp() + (e - m).exp()).ln()
    };
    let emn = ExpModNormal::<1>::new(mu, sg, la).unwrap();
    let xs = [-6.0, -1.0, 1.0, 3.0, 40.0];
    let want: Vec<f64> = xs.iter().map(|&x| lcdf_ref(x, mu, sg, la)).collect();
    close("exp_mod_normal_lcdf", &host(&emn.lcdf(t1(&xs, &d))), &want, 3e-6, 1.0);
    let want: Vec<f64> = xs.iter().map(|&x| lccdf_ref(x, mu, sg, la)).collect();
    close("exp_mod_normal_lccdf", &host(&emn.lccdf(t1(&xs, &d))), &want, 3e-7, 1.0);
    // Both against the density (tested above) by quadrature.
    let g = grid(-8.0, 1.0, 18_000);
    let lp = lpdf(&emn, &g);
    assert!((simpson(&g, &lp).ln() - host(&emn.lcdf(t1(&[1.0], &d)))[0]).abs() < 1e-6);
    let g = grid(3.0, 40.0, 37_000);
    assert!((simpson(&g, &lpdf(&emn, &g)).ln() - host(&emn.lccdf(t1(&[3.0], &d)))[0]).abs() < 1e-6);
    grad_check(
        "exp_mod_normal_lcdf in mu, sigma, lambda",
        &[mu, sg, la],
        |p| {
            ExpModNormal::<1>::new(p.clone().narrow(0, 0, 1), p.clone().narrow(0, 1, 1), p.narrow(0, 2, 1))
                .unwrap()
                .lcdf(t1(&[0.0, 3.0], &dev()))
        },
        |p| [0.0, 3.0].iter().map(|&x| lcdf_ref(x, p[0], p[1], p[2])).sum(),
        1e-5,
    );
    grad_check(
        "exp_mod_normal_lccdf in mu, sigma, lambda",
        &[mu, sg, la],
        |p| {
            ExpModNormal::<1>::new(p.clone().narrow(0, 0, 1), p.clone().narrow(0, 1, 1), p.narrow(0, 2, 1))
                .unwrap()
                .lccdf(t1(&[0.0, 3.0, 30.0], &dev()))
        },
        |p| [0.0, 3.0, 30.0].iter().map(|&x| lccdf_ref(x, p[0], p[1], p[2])).sum(),
        1e-5,
    );
}

#[test]
fn beta_binomial_cdfs_against_sums_of_the_mass_function() {
    let d = dev();
    let n_trials = 12.0;
    let lbeta_ref = |x: f64, y: f64| lgamma_ref(x) + lgamma_ref(y) - lgamma_ref(x + y);
    let ln_pmf =
        |k: f64, a: f64, b: f64| lchoose_ref(n_trials, k) + lbeta_ref(k + a, n_trials - k + b) - lbeta_ref(a, b);
    let log_sum = |terms: Vec<f64>| {
        if terms.is_empty() {
            return f64::NEG_INFINITY;
        }
        let m = terms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        m + terms.iter().map(|t| (t - m).exp()).sum::<f64>().ln()
    };
    let lcdf_ref = |k: f64, a: f64, b: f64| log_sum((0..=k as usize).map(|j| ln_pmf(j as f64, a, b)).collect());
    let lccdf_ref = |k: f64, a: f64, b: f64| log_sum((k as usize + 1..=12).map(|j| ln_pmf(j as f64, a, b)).collect());
    let ks = [0.0, 3.0, 11.0, 12.0];
    for (a, b) in [(0.5, 0.5), (2.0, 30.0), (50.0, 1.5)] {
        let bb = BetaBinomial::<1>::new(t1(&ks, &d), n_trials).unwrap();
        let want: Vec<f64> = ks.iter().map(|&k| lcdf_ref(k, a, b)).collect();
        close(&format!("beta_binomial_lcdf({a}, {b})"), &host(&bb.lcdf(a, b).unwrap()), &want, 1e-9, 1.0);
        let want: Vec<f64> = ks.iter().map(|&k| lccdf_ref(k, a, b)).collect();
        close(&format!("beta_binomial_lccdf({a}, {b})"), &host(&bb.lccdf(a, b).unwrap()), &want, 1e-9, 1.0);
        for (name, lower) in [("lcdf", true), ("lccdf", false)] {
            grad_check(
                &format!("beta_binomial_{name} in alpha, beta"),
                &[a, b],
                |p| {
                    let bb = BetaBinomial::<1>::new(t1(&ks[..3], &dev()), n_trials).unwrap();
                    let (alpha, beta) = (p.clone().narrow(0, 0, 1), p.narrow(0, 1, 1));
                    if lower { bb.lcdf(alpha, beta).unwrap() } else { bb.lccdf(alpha, beta).unwrap() }
                },
                |p| {
                    ks[..3]
                        .iter()
                        .map(|&k| if lower { lcdf_ref(k, p[0], p[1]) } else { lccdf_ref(k, p[0], p[1]) })
                        .sum()
                },
                1e-6,
            );
        }
    }
    invalid(BetaBinomial::<1>::new(t1(&ks, &d), n_trials).unwrap().lcdf(0.0, 1.0), "BetaBinomial", "alpha");
}

#[test]
fn lkj_corr_against_the_beta_form_and_the_cholesky_density() {
    let d = dev();
    // K = 2: (r + 1) / 2 ~ beta(eta, eta), so p(r) = (1 - r^2)^(eta - 1) / (2^(2 eta - 1) B(eta, eta)).
    let lbeta_ref = |x: f64, y: f64| lgamma_ref(x) + lgamma_ref(y) - lgamma_ref(x + y);
    let lkj2_ref = |r: f64, eta: f64| (eta - 1.0) * (1.0 - r * r).ln() - (2.0 * eta - 1.0) * LN_2 - lbeta_ref(eta, eta);
    let rs = [-0.9, 0.0, 0.5, 1.2];
    let omegas: Vec<f64> = rs.iter().flat_map(|&r| [1.0, r, r, 1.0]).collect();
    for eta in [0.5, 1.0, 3.0] {
        let got = host(&LkjCorr::new(eta).unwrap().log_prob(t3(&omegas, [4, 2, 2], &d)).unwrap());
        let want: Vec<f64> =
            rs.iter().map(|&r| if r.abs() < 1.0 { lkj2_ref(r, eta) } else { f64::NEG_INFINITY }).collect();
        close(&format!("lkj_corr K = 2, eta {eta}"), &got, &want, 1e-9, 1.0);
    }
    grad_check(
        "lkj_corr in eta",
        &[0.7, 4.0],
        |eta| LkjCorr::new(eta).unwrap().log_prob(t3(&omegas[4..12], [2, 2, 2], &dev())).unwrap(),
        |eta| lkj2_ref(0.0, eta[0]) + lkj2_ref(0.5, eta[1]),
        1e-6,
    );
    // K = 3: lkj_corr_cholesky(L) = lkj_corr(L L^T) + sum_{i >= 1} (K - 1 - i) ln L_ii (0-based).
    let l = [1.0, 0.0, 0.0, 0.6, 0.8, 0.0, -0.3, 0.4, (1.0f64 - 0.09 - 0.16).sqrt()];
    let mut omega = [0.0; 9];
    for i in 0..3 {
        for j in 0..3 {
            omega[i * 3 + j] = (0..3).map(|m| l[i * 3 + m] * l[j * 3 + m]).sum();
        }
    }
    let eta = 2.5;
    let corr = host(&LkjCorr::new(eta).unwrap().log_prob(t3(&omega, [1, 3, 3], &d)).unwrap())[0];
    let chol = host(&LkjCorrCholesky::new(eta).unwrap().log_prob(t3(&l, [1, 3, 3], &d)))[0];
    let jacobian = l[4].ln(); // (K - 1 - i) ln L_ii: 1 ln L_11 + 0 ln L_22
    assert!((chol - corr - jacobian).abs() < 1e-12, "lkj_corr {corr} against lkj_corr_cholesky {chol}");
    invalid(LkjCorr::new(0.0), "lkj_corr", "eta");

    // trace_quad_form(a, b) = tr(b^T a b).
    let a = [2.0, 0.5, 0.5, 1.0];
    let b = [1.0, -2.0, 0.5, 3.0, 0.0, 1.0]; // [2, 3]
    let mut want = 0.0;
    for c in 0..3 {
        let col = [b[c], b[3 + c]];
        want += col[0] * (a[0] * col[0] + a[1] * col[1]) + col[1] * (a[2] * col[0] + a[3] * col[1]);
    }
    let got = host(&trace_quad_form(t3(&a, [1, 2, 2], &d), t3(&b, [1, 2, 3], &d)));
    close("trace_quad_form", &got, &[want], 1e-14, 1.0);
}

#[test]
fn matern_and_periodic_covariances_against_their_definitions() {
    let d = dev();
    let xs = [0.0, 0.7, 2.0];
    let (alpha, rho) = ([1.5, 0.3], [0.8, 2.0]);
    let kernels: [(Matern, &dyn Fn(f64) -> f64); 3] = [
        (Matern::Half, &|r| (-r).exp()),
        (Matern::ThreeHalves, &|r| (1.0 + 3f64.sqrt() * r) * (-(3f64.sqrt()) * r).exp()),
        (Matern::FiveHalves, &|r| (1.0 + 5f64.sqrt() * r + 5.0 * r * r / 3.0) * (-(5f64.sqrt()) * r).exp()),
    ];
    for (kind, k) in kernels {
        let got = host(&matern_cov(kind, t1(&xs, &d), t2(&alpha, 2, 1, &d), t2(&rho, 2, 1, &d)).unwrap());
        let want: Vec<f64> = (0..18)
            .map(|e| {
                let (p, i, j) = (e / 9, e / 3 % 3, e % 3);
                alpha[p] * alpha[p] * k((xs[i] - xs[j]).abs() / rho[p])
            })
            .collect();
        close(&format!("{kind:?}"), &got, &want, 1e-13, 1.0);
        grad_check(
            &format!("{kind:?} in rho"),
            &[rho[0]],
            |r| {
                matern_cov(kind, t1(&xs, &dev()), t2(&alpha[..1], 1, 1, &dev()), r.reshape([1, 1]))
                    .unwrap()
                    .reshape([9])
            },
            |r| (0..9).map(|e| alpha[0] * alpha[0] * k((xs[e / 3] - xs[e % 3]).abs() / r[0])).sum(),
            1e-6,
        );
    }
    // 2-D points: Euclidean distances.
    let pts = [0.0, 0.0, 3.0, 4.0];
    let got = host(&matern_cov(Matern::Half, t2(&pts, 2, 2, &d), t2(&[1.0], 1, 1, &d), t2(&[2.0], 1, 1, &d)).unwrap());
    close("exponential 2-D", &got, &[1.0, (-2.5f64).exp(), (-2.5f64).exp(), 1.0], 1e-14, 1.0);
    let period = 1.3;
    let got = host(&periodic_cov(t1(&xs, &d), t2(&alpha, 2, 1, &d), t2(&rho, 2, 1, &d), period).unwrap());
    let want: Vec<f64> = (0..18)
        .map(|e| {
            let (p, i, j) = (e / 9, e / 3 % 3, e % 3);
            let s = (PI * (xs[i] - xs[j]).abs() / period).sin();
            alpha[p] * alpha[p] * (-2.0 * s * s / (rho[p] * rho[p])).exp()
        })
        .collect();
    close("gp_periodic_cov", &got, &want, 1e-13, 1.0);
    match periodic_cov(t1(&xs, &d), t2(&alpha, 2, 1, &d), t2(&rho, 2, 1, &d), 0.0) {
        Err(ModelError::InvalidParameter { dist: "gp_periodic_cov", name: "p", .. }) => {}
        other => panic!("expected an error naming p, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Matrix Gaussian processes and dynamic linear models, against the joint normal density of all
// observations written out in f64 (no filter): an independent route to the same number.

/// Row-major `a` (`n x m`) times `b` (`m x p`).
fn mat_mul(a: &[f64], b: &[f64], n: usize, m: usize, p: usize) -> Vec<f64> {
    let mut out = vec![0.0; n * p];
    for i in 0..n {
        for j in 0..p {
            out[i * p + j] = (0..m).map(|l| a[i * m + l] * b[l * p + j]).sum();
        }
    }
    out
}

fn mat_t(a: &[f64], n: usize, m: usize) -> Vec<f64> {
    (0..m * n).map(|idx| a[(idx % n) * m + idx / n]).collect()
}

/// `log N(y | mu, cov)` for a dense `cov` (`n x n`) by a textbook Cholesky, `-inf` if `cov` is
/// not positive definite.
fn mvn_logpdf_ref(y: &[f64], mu: &[f64], cov: &[f64]) -> f64 {
    let n = y.len();
    let mut l = vec![0.0; n * n];
    for j in 0..n {
        let mut s = cov[j * n + j] - (0..j).map(|k| l[j * n + k] * l[j * n + k]).sum::<f64>();
        if s <= 0.0 {
            return f64::NEG_INFINITY;
        }
        s = s.sqrt();
        l[j * n + j] = s;
        for i in j + 1..n {
            l[i * n + j] = (cov[i * n + j] - (0..j).map(|k| l[i * n + k] * l[j * n + k]).sum::<f64>()) / s;
        }
    }
    let mut z = vec![0.0; n];
    for i in 0..n {
        z[i] = (y[i] - mu[i] - (0..i).map(|k| l[i * n + k] * z[k]).sum::<f64>()) / l[i * n + i];
    }
    let log_det: f64 = (0..n).map(|i| l[i * n + i].ln()).sum();
    -0.5 * n as f64 * (2.0 * PI).ln() - log_det - 0.5 * z.iter().map(|v| v * v).sum::<f64>()
}

/// The DLM's log-likelihood as one normal density over the stacked `y_1 .. y_T` (`y` row-major
/// `r x T`): `E y_t = F^T G^t m0`, `Cov(y_s, y_t) = F^T G^(s-t) P_t F + [s = t] V` for `s >= t`,
/// with `P_t = G P_(t-1) G^T + W`, `P_0 = C0`.
#[allow(clippy::too_many_arguments)]
fn dlm_ref(y: &[f64], f: &[f64], g: &[f64], v: &[f64], w: &[f64], m0: &[f64], c0: &[f64], k: usize, r: usize) -> f64 {
    let t_len = y.len() / r;
    let ft = mat_t(f, k, r);
    let gt = mat_t(g, k, k);
    let (mut means, mut p, mut mean) = (Vec::new(), Vec::new(), m0.to_vec());
    let mut cov_prev = c0.to_vec();
    for _ in 0..t_len {
        mean = mat_mul(g, &mean, k, k, 1);
        let pt: Vec<f64> =
            mat_mul(&mat_mul(g, &cov_prev, k, k, k), &gt, k, k, k).iter().zip(w).map(|(a, b)| a + b).collect();
        means.push(mat_mul(&ft, &mean, r, k, 1));
        cov_prev = pt.clone();
        p.push(pt);
    }
    let big = r * t_len;
    let mut cov = vec![0.0; big * big];
    for s in 0..t_len {
        for t in 0..=s {
            // G^(s - t) P_t
            let mut cross = p[t].clone();
            for _ in t..s {
                cross = mat_mul(g, &cross, k, k, k);
            }
            let mut block = mat_mul(&mat_mul(&ft, &cross, r, k, k), f, r, k, r);
            if s == t {
                block.iter_mut().zip(v).for_each(|(b, vv)| *b += vv);
            }
            for i in 0..r {
                for j in 0..r {
                    cov[(s * r + i) * big + t * r + j] = block[i * r + j];
                    cov[(t * r + j) * big + s * r + i] = block[i * r + j];
                }
            }
        }
    }
    let stacked: Vec<f64> = (0..t_len).flat_map(|t| (0..r).map(move |i| y[i * t_len + t])).collect();
    let mu: Vec<f64> = means.concat();
    mvn_logpdf_ref(&stacked, &mu, &cov)
}

#[test]
fn gaussian_dlm_obs_against_the_joint_normal_of_all_observations() {
    let d = dev();
    let (k, r, t_len) = (2, 2, 5);
    let y = [0.3, -0.2, 1.1, 0.7, 0.0, -0.5, 0.4, 0.9, 1.3, 0.2];
    let f = [1.0, 0.5, 0.0, 1.0];
    // Two particles with their own transitions and state covariances; the rest shared.
    let g = [0.9, 0.1, -0.2, 0.8, 1.0, 0.0, 0.3, 0.5];
    let w = [0.5, 0.1, 0.1, 0.3, 1.5, -0.4, -0.4, 0.6];
    let v = [0.8, 0.2, 0.2, 0.4];
    let m0 = [0.5, -1.0];
    let c0 = [2.0, 0.3, 0.3, 1.0];
    let dlm = GaussianDlmObs::new(
        t3(&f, [1, k, r], &d),
        t3(&g, [2, k, k], &d),
        t3(&v, [1, r, r], &d),
        t3(&w, [2, k, k], &d),
        t2(&m0, 1, k, &d),
        t3(&c0, [1, k, k], &d),
    )
    .unwrap();
    let got = host(&dlm.log_prob(t3(&y, [1, r, t_len], &d)).unwrap());
    let want: Vec<f64> =
        (0..2).map(|i| dlm_ref(&y, &f, &g[i * 4..i * 4 + 4], &v, &w[i * 4..i * 4 + 4], &m0, &c0, k, r)).collect();
    close("gaussian_dlm_obs", &got, &want, 1e-11, 1.0);

    // A local-level model (k = r = 1, G = F = 1) with a vector V, through the gradient: with
    // respect to the state and observation variances, the transition and the initial mean.
    let y1 = [0.2, 0.9, 1.4, 0.8, 1.9, 2.2, 1.7];
    let n1 = y1.len();
    let reference = |p: &[f64]| dlm_ref(&y1, &[1.0], &[p[0]], &[p[1]], &[p[2]], &[p[3]], &[1.5], 1, 1);
    let model = |p: Tensor<1>| {
        let dev = p.device();
        let dt = p.dtype();
        let one = Tensor::<3>::ones([1, 1, 1], (&dev, dt));
        GaussianDlmObs::with_diagonal_v(
            one.clone(),
            p.clone().narrow(0, 0, 1).reshape([1, 1, 1]),
            p.clone().narrow(0, 1, 1).reshape([1, 1]),
            p.clone().narrow(0, 2, 1).reshape([1, 1, 1]),
            p.clone().narrow(0, 3, 1).reshape([1, 1]),
            one.mul_scalar(1.5),
        )
        .unwrap()
        .log_prob(Tensor::from_data(TensorData::new(y1.to_vec(), [1, 1, n1]), (&dev, dt)))
        .unwrap()
    };
    let p = [0.95, 0.4, 0.2, 0.1];
    close("local level", &host(&model(t1(&p, &d))), &[reference(&p)], 1e-12, 1.0);
    grad_check("gaussian_dlm_obs local level", &p, model, reference, 1e-6);

    // In f32 (the default dtype) over 200 steps the filter keeps its covariances positive and
    // the log-likelihood to f32's relative precision times the number of terms.
    let y200: Vec<f64> = (0..200).map(|t| (0.05 * t as f64).sin() * 2.0 + (1.7 * t as f64).cos() * 0.5).collect();
    let f32_dev =
        |v: &[f64], dims: [usize; 3]| Tensor::<3>::from_data(TensorData::new(v.to_vec(), dims), (&d, DType::F32));
    let local = GaussianDlmObs::with_diagonal_v(
        f32_dev(&[1.0], [1, 1, 1]),
        f32_dev(&[0.98], [1, 1, 1]),
        Tensor::from_data(TensorData::new(vec![0.3], [1, 1]), (&d, DType::F32)),
        f32_dev(&[0.05], [1, 1, 1]),
        Tensor::from_data(TensorData::new(vec![0.0], [1, 1]), (&d, DType::F32)),
        f32_dev(&[4.0], [1, 1, 1]),
    )
    .unwrap();
    let want200 = dlm_ref(&y200, &[1.0], &[0.98], &[0.3], &[0.05], &[0.0], &[4.0], 1, 1);
    close(
        "local level, f32, T = 200",
        &host(&local.log_prob(f32_dev(&y200, [1, 1, 200])).unwrap()),
        &[want200],
        2e-5,
        1.0,
    );

    // The 2 x 2 model's gradient in G, W's diagonal and m0 (V and C0 fixed).
    let reference2 = |p: &[f64]| dlm_ref(&y, &f, &p[..4], &v, &[p[4], 0.0, 0.0, p[5]], &p[6..8], &c0, k, r);
    let model2 = |p: Tensor<1>| {
        let dev = p.device();
        let eye = Tensor::<3>::from_data(TensorData::new(vec![1.0, 0.0, 0.0, 1.0], [1, 2, 2]), (&dev, DType::F64));
        GaussianDlmObs::new(
            Tensor::from_data(TensorData::new(f.to_vec(), [1, 2, 2]), (&dev, DType::F64)),
            p.clone().narrow(0, 0, 4).reshape([1, 2, 2]),
            Tensor::from_data(TensorData::new(v.to_vec(), [1, 2, 2]), (&dev, DType::F64)),
            p.clone().narrow(0, 4, 2).reshape([1, 2, 1]) * eye,
            p.clone().narrow(0, 6, 2).reshape([1, 2]),
            Tensor::from_data(TensorData::new(c0.to_vec(), [1, 2, 2]), (&dev, DType::F64)),
        )
        .unwrap()
        .log_prob(Tensor::from_data(TensorData::new(y.to_vec(), [1, 2, 5]), (&dev, DType::F64)))
        .unwrap()
    };
    grad_check("gaussian_dlm_obs 2 x 2", &[0.9, 0.1, -0.2, 0.8, 0.5, 0.3, 0.5, -1.0], model2, reference2, 1e-6);

    // An indefinite observation covariance is outside the support: -inf, not NaN.
    let bad_v = GaussianDlmObs::new(
        t3(&f, [1, k, r], &d),
        t3(&g[..4], [1, k, k], &d),
        t3(&[-3.0, 0.0, 0.0, -3.0], [1, r, r], &d),
        t3(&w[..4], [1, k, k], &d),
        t2(&m0, 1, k, &d),
        t3(&c0, [1, k, k], &d),
    )
    .unwrap();
    close("indefinite V", &host(&bad_v.log_prob(t3(&y, [1, r, t_len], &d)).unwrap()), &[f64::NEG_INFINITY], 0.0, 1.0);
    // Shapes that do not fit name their argument.
    let mk = |g: Tensor<3>, m0: Tensor<2>| {
        GaussianDlmObs::new(
            t3(&f, [1, k, r], &d),
            g,
            t3(&v, [1, r, r], &d),
            t3(&w[..4], [1, k, k], &d),
            m0,
            t3(&c0, [1, k, k], &d),
        )
    };
    invalid(mk(t3(&[1.0], [1, 1, 1], &d), t2(&m0, 1, k, &d)), "gaussian_dlm_obs", "G");
    invalid(mk(t3(&g[..4], [1, k, k], &d), t2(&[1.0, 2.0, 3.0], 1, 3, &d)), "gaussian_dlm_obs", "m0");
    invalid(mk(t3(&g, [2, k, k], &d), t2(&[0.0; 6], 3, 2, &d)), "gaussian_dlm_obs", "m0");
    invalid(dlm.log_prob(t3(&y[..5], [1, 1, 5], &d)), "gaussian_dlm_obs", "y");
}

#[test]
fn multi_gp_against_independent_scaled_normal_rows() {
    let d = dev();
    // Two particles' kernels (the second not positive definite) and inverse scales.
    let sig = [
        2.0, 0.5, 0.1, 0.5, 1.0, 0.3, 0.1, 0.3, 1.5, //
        1.0, 2.0, 0.0, 2.0, 1.0, 0.0, 0.0, 0.0, 1.0,
    ];
    let w = [0.5, 2.0, 1.5, 0.7];
    let y = [0.3, -1.2, 0.8, 1.1, 0.0, -0.4];
    let reference = |sig: &[f64], w: &[f64]| -> f64 {
        (0..2)
            .map(|i| mvn_logpdf_ref(&y[i * 3..i * 3 + 3], &[0.0; 3], &sig.iter().map(|s| s / w[i]).collect::<Vec<_>>()))
            .sum()
    };
    let gp = MultiGp::new(t3(&sig, [2, 3, 3], &d), t2(&w, 2, 2, &d)).unwrap();
    let got = host(&gp.log_prob(t3(&y, [1, 2, 3], &d)).unwrap());
    close("multi_gp", &got, &[reference(&sig[..9], &w[..2]), f64::NEG_INFINITY], 1e-12, 1.0);
    // multi_gp_cholesky with the first kernel's factor, shared by both particles.
    let l = {
        let a = &sig[..9];
        let l00 = a[0].sqrt();
        let (l10, l20) = (a[3] / l00, a[6] / l00);
        let l11 = (a[4] - l10 * l10).sqrt();
        let l21 = (a[7] - l20 * l10) / l11;
        [l00, 0.0, 0.0, l10, l11, 0.0, l20, l21, (a[8] - l20 * l20 - l21 * l21).sqrt()]
    };
    let gpc = MultiGp::from_cholesky(t3(&l, [1, 3, 3], &d), t2(&w, 2, 2, &d)).unwrap();
    let want = [reference(&sig[..9], &w[..2]), reference(&sig[..9], &w[2..])];
    close("multi_gp_cholesky", &host(&gpc.log_prob(t3(&y, [1, 2, 3], &d)).unwrap()), &want, 1e-12, 1.0);
    // A non-positive inverse scale is outside the support.
    let gpw = MultiGp::from_cholesky(t3(&l, [1, 3, 3], &d), t2(&[1.0, -1.0], 1, 2, &d)).unwrap();
    close("w <= 0", &host(&gpw.log_prob(t3(&y, [1, 2, 3], &d)).unwrap()), &[f64::NEG_INFINITY], 0.0, 1.0);
    // The gradient in the inverse scales, the kernel's entries and y itself.
    let reference_p = |p: &[f64]| {
        let s = [p[2], p[3], 0.1, p[3], p[4], 0.3, 0.1, 0.3, 1.5];
        let y = &p[5..11];
        (0..2)
            .map(|i| mvn_logpdf_ref(&y[i * 3..i * 3 + 3], &[0.0; 3], &s.iter().map(|v| v / p[i]).collect::<Vec<_>>()))
            .sum()
    };
    let model = |p: Tensor<1>| {
        let dev = p.device();
        let fixed = |v: f64| Tensor::<1>::from_data(TensorData::new(vec![v], [1]), (&dev, DType::F64));
        let s = Tensor::cat(
            vec![
                p.clone().narrow(0, 2, 2),
                fixed(0.1),
                p.clone().narrow(0, 3, 2),
                fixed(0.3),
                fixed(0.1),
                fixed(0.3),
                fixed(1.5),
            ],
            0,
        );
        MultiGp::new(s.reshape([1, 3, 3]), p.clone().narrow(0, 0, 2).reshape([1, 2]))
            .unwrap()
            .log_prob(p.narrow(0, 5, 6).reshape([1, 2, 3]))
            .unwrap()
    };
    let p = [0.5, 2.0, 2.0, 0.5, 1.0, 0.3, -1.2, 0.8, 1.1, 0.0, -0.4];
    close("multi_gp (p)", &host(&model(t1(&p, &d))), &[reference_p(&p)], 1e-12, 1.0);
    grad_check("multi_gp", &p, model, reference_p, 1e-6);
    invalid(MultiGp::new(t3(&sig[..6], [1, 2, 3], &d), t2(&w, 2, 2, &d)), "multi_gp", "Sigma");
    invalid(MultiGp::new(t3(&sig, [2, 3, 3], &d), t2(&[1.0; 6], 3, 2, &d)), "multi_gp", "w");
    invalid(gp.log_prob(t3(&y[..4], [1, 2, 2], &d)), "multi_gp", "y");
}

#[test]
fn recurrence_runs_a_nonlinear_loop_with_its_gradient() {
    let d = dev();
    // A Ricker-type growth x_t = x_{t-1} exp(r (1 - x_{t-1})) + b_t, from x_{-1} = x0.
    let b = [0.1, -0.05, 0.2, 0.0, 0.1, -0.1];
    let reference = |p: &[f64]| -> Vec<f64> {
        let (rate, mut x) = (p[0], p[1]);
        b.iter()
            .map(|bt| {
                x = x * (rate * (1.0 - x)).exp() + bt;
                x
            })
            .collect()
    };
    let model = |p: Tensor<1>| {
        let dev = p.device();
        let bt = Tensor::<2>::from_data(TensorData::new(b.to_vec(), [1, 6]), (&dev, DType::F64));
        let rate = p.clone().narrow(0, 0, 1).reshape([1, 1]);
        let xs = scan_recurrence(p.narrow(0, 1, 1).reshape([1, 1]), 6, |t, x| {
            Ok(x.clone() * (rate.clone() * (x.neg().add_scalar(1.0))).exp() + bt.clone().narrow(1, t, 1))
        })
        .unwrap();
        assert_eq!(xs.dims(), [1, 6, 1]);
        xs.reshape([6])
    };
    let p = [1.3, 0.4];
    close("recurrence", &host(&model(t1(&p, &d))), &reference(&p), 1e-13, 1.0);
    let weights = [1.0, -2.0, 0.5, 3.0, -1.0, 0.25];
    let weighted = |p: Tensor<1>| {
        let w = Tensor::<1>::from_data(TensorData::new(weights.to_vec(), [6]), (&p.device(), DType::F64));
        (model(p) * w).sum().reshape([1])
    };
    grad_check("recurrence", &p, weighted, |p| reference(p).iter().zip(weights).map(|(x, w)| x * w).sum(), 1e-7);
    // A step that changes the state's shape, or no steps, is refused with the time point.
    let x0 = t2(&[1.0, 2.0], 1, 2, &d);
    invalid(scan_recurrence(x0.clone(), 3, |_, x| Ok(x.narrow(1, 0, 1))), "recurrence", "step");
    invalid(scan_recurrence(x0, 0, |_, x| Ok(x)), "recurrence", "steps");
}

// ---------------------------------------------------------------------------------------------
// Owen's T and the skew normal's cdfs, against quadrature of their definitions.

/// `T(h, a) = a / (2 pi) int_0^1 e^(-h^2 (1 + a^2 u^2) / 2) / (1 + a^2 u^2) du` by tanh-sinh
/// (the integrand's peak, of width `1 / (h a)`, sits at the end `u = 0`, where tanh-sinh's
/// points cluster).
fn owens_t_ref(h: f64, a: f64) -> f64 {
    a / (2.0 * PI)
        * tanh_sinh(|u, _| {
            let q = 1.0 + a * a * u * u;
            (-0.5 * h * h * q).exp() / q
        })
}

/// The skew normal's log density slope at `z`: `-z + alpha phi(alpha z) / Phi(alpha z)`.
fn skew_normal_slope(z: f64, alpha: f64) -> f64 {
    -z + alpha * (-0.5 * (alpha * z).powi(2) - 0.5 * (2.0 * PI).ln() - ln_phi_ref(alpha * z).0).exp()
}

/// `ln F(z)` of the standard skew normal with shape `alpha`, `F(z) = 2 int_-inf^z phi(t)
/// Phi(alpha t) dt`, by tanh-sinh after `t = z - s / k`, `s = u / (1 - u)`, `k` the log
/// density's slope at `z` (at least 2 here), relative to the log density at `z` so nothing
/// underflows.
fn skew_normal_tail_ref(z: f64, alpha: f64) -> f64 {
    let ell = |t: f64| -0.5 * t * t - 0.5 * (2.0 * PI).ln() + ln_phi_ref(alpha * t).0;
    let k = skew_normal_slope(z, alpha);
    let ell_z = ell(z);
    let integral = tanh_sinh(|u, v| {
        // Beyond a thousand sds below z nothing is left (and ln Phi's reference has no range).
        let t = z - u / v / k;
        if t < z - 1e3 {
            return 0.0;
        }
        let e = ell(t) - ell_z - 2.0 * v.ln();
        if e < -700.0 { 0.0 } else { e.exp() }
    });
    LN_2 + ell_z - k.ln() + integral.ln()
}

/// `ln F(z)`: the tail integral where the log density falls steeply below `z` (slope >= 2),
/// else the closed form `Phi(z) - 2 T(z, alpha)` in f64, where `F` is not small.
fn skew_normal_lcdf_ref(z: f64, alpha: f64) -> f64 {
    if skew_normal_slope(z, alpha) >= 2.0 {
        skew_normal_tail_ref(z, alpha)
    } else {
        (phi_ref(z) - 2.0 * owens_t_ref(z, alpha)).ln()
    }
}

#[test]
fn owens_t_against_its_integral_and_closed_forms() {
    // Closed forms first: T(0, a) = atan(a) / (2 pi), T(h, 1) = Phi(h) Phi(-h) / 2.
    for a in [0.3, 1.0, 7.0] {
        assert!((owens_t_ref(0.0, a) - a.atan() / (2.0 * PI)).abs() < 1e-14, "reference T(0, {a})");
    }
    for h in [0.5, 2.0, 5.0] {
        let want = 0.5 * phi_ref(h) * phi_ref(-h);
        assert!((owens_t_ref(h, 1.0) - want).abs() < 1e-13 * want, "reference T({h}, 1)");
    }
    let points = [
        [0.0, 0.7],
        [0.5, 0.2],
        [0.5, -3.0],
        [1.0, 1.0],
        [1.7, 0.9],
        [2.5, 4.0],
        [-2.5, 4.0],
        [6.0, 0.5],
        [6.0, 30.0],
        [0.3, 100.0],
        [3.0, -0.05],
    ];
    let f = |[h, a]: [Tensor<1>; 2]| owens_t(h, a);
    check_points("owens_t", &points, f, |[h, a]| owens_t_ref(h, a), 3e-7, [true, true], 2e-5);
}

#[test]
fn skew_normal_cdfs_in_both_tails() {
    // Standardised (z, alpha): the bulk, and lower tails where Stan's Phi(z) - 2 T(z, alpha)
    // cancels (alpha > 0, where T > 0), ln F down to -800.
    let za = [
        [-40.0, -1.0],
        [-12.0, 0.5],
        [-6.0, 2.0],
        [-3.0, 10.0],
        [-1.5, 10.0],
        [-0.5, 50.0],
        [-0.02, 50.0],
        [-5.0, -10.0],
        [-1.0, 1.0],
        [0.0, 3.0],
        [0.3, -0.3],
        [1.0, -5.0],
        [2.0, 0.0],
        [4.0, 50.0],
        [8.0, -20.0],
    ];
    for [z, a] in za {
        // The two references agree where both hold: a steep tail that does not cancel
        // (alpha <= 0) and does not underflow.
        if skew_normal_slope(z, a) >= 2.0 && a <= 0.0 && z > -30.0 {
            let (direct, tail) = ((phi_ref(z) - 2.0 * owens_t_ref(z, a)).ln(), skew_normal_tail_ref(z, a));
            assert!((direct - tail).abs() < 1e-10 * (1.0 + tail.abs()), "references at ({z}, {a}): {direct} vs {tail}");
        }
    }
    let (xi, omega) = (0.7, 1.8);
    let points: Vec<[f64; 4]> = za.iter().map(|&[z, a]| [xi + omega * z, xi, omega, a]).collect();
    let lcdf = |[x, xi, omega, a]: [Tensor<1>; 4]| SkewNormal::<1>::new(xi, omega, a).unwrap().lcdf(x);
    let lccdf = |[x, xi, omega, a]: [Tensor<1>; 4]| SkewNormal::<1>::new(xi, omega, a).unwrap().lccdf(x);
    check_points(
        "skew_normal_lcdf",
        &points,
        lcdf,
        |[x, xi, omega, a]| skew_normal_lcdf_ref((x - xi) / omega, a),
        3e-7,
        [true; 4],
        2e-5,
    );
    check_points(
        "skew_normal_lccdf",
        &points,
        lccdf,
        |[x, xi, omega, a]| skew_normal_lcdf_ref(-(x - xi) / omega, -a),
        3e-7,
        [true; 4],
        2e-5,
    );
    // The two tails add up to one in the bulk, and the density is the cdf's derivative.
    let d = dev();
    let sn = SkewNormal::<1>::new(0.0, 1.0, 4.0).unwrap();
    let xs = [-0.3, 0.1, 0.8, 2.0];
    let (lo, hi) = (host(&sn.lcdf(t1(&xs, &d))), host(&sn.lccdf(t1(&xs, &d))));
    for i in 0..xs.len() {
        assert!((lo[i].exp() + hi[i].exp() - 1.0).abs() < 1e-6, "F + (1 - F) at {}", xs[i]);
    }
    let (_, grad) = value_and_grad(t1(&xs, &d), |x| sn.lcdf(x).exp()).unwrap();
    close("d F / dx = pdf", &host(&grad), &lpdf(&sn, &xs).iter().map(|l| l.exp()).collect::<Vec<_>>(), 1e-6, 1.0);
    // In f32 (the default dtype) the far tail stays finite and close.
    let x32 = Tensor::<1>::from_data(TensorData::new(vec![-3.0f64, -12.0], [2]), (&d, DType::F32));
    let sn32 = SkewNormal::<1>::new(0.0, 1.0, 2.0).unwrap();
    close(
        "f32 tail",
        &host(&sn32.lcdf(x32)),
        &[skew_normal_lcdf_ref(-3.0, 2.0), skew_normal_lcdf_ref(-12.0, 2.0)],
        1e-5,
        1.0,
    );
}
