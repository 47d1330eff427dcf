//! The distributions against independent `f64` evaluations written here (a Numerical Recipes
//! Lanczos log-gamma, `erfc` from the incomplete gamma function), their autodiff gradients in
//! tensor parameters against central finite differences of those `f64` versions, and their
//! errors on bad data and parameters.
//!
//! Tolerances: an `f32` evaluation of a sum of terms is exact to about `eps32 * sum |terms|`,
//! so each reference returns its value and that magnitude (`scale`), and values must agree to
//! `16 eps32 (1 + scale)`. References are evaluated at the `f32`-rounded inputs, so input
//! rounding is not counted as error.

use std::f64::consts::PI;

use parvi_model::burn::tensor::{Device, Tensor, TensorData};
use parvi_model::dist::{
    Beta, BinomialLogit, Cauchy, Dirichlet, Exponential, Gamma, HalfNormal, InvGamma, LkjCorrCholesky, LogProb,
    NegBinomial2Log, Normal, StudentT, Uniform, Weibull, ln_gamma_ratio_tensor, ln_gamma_tensor,
};
use parvi_model::grad::value_and_grad;
use parvi_model::tensor_ops::{log_softmax, to_vec_f64};
use parvi_model::{BackendKind, ModelError};

const EPS32: f64 = f32::EPSILON as f64;

// ---------------------------------------------------------------------------------------------
// Independent f64 special functions.

/// `ln Gamma(x)`, `x > 0`: Numerical Recipes' `gammln` (Lanczos, g = 5, six terms; error below
/// 2e-10), a different fit from the library's.
fn lgamma(x: f64) -> f64 {
    const COF: [f64; 6] = [
        76.180_091_729_471_46,
        -86.505_320_329_416_77,
        24.014_098_240_830_91,
        -1.231_739_572_450_155,
        0.120_865_097_386_617_9e-2,
        -0.539_523_938_495_3e-5,
    ];
    assert!(x > 0.0);
    let mut tmp = x + 5.5;
    tmp -= (x + 0.5) * tmp.ln();
    let mut ser = 1.000_000_000_190_015;
    for (j, c) in COF.iter().enumerate() {
        ser += c / (x + 1.0 + j as f64);
    }
    -tmp + (2.506_628_274_631_000_5 * ser / x).ln()
}

/// `(ln P(a, x), ln Q(a, x))`, the regularised incomplete gamma functions: series for
/// `x < a + 1`, continued fraction (modified Lentz) otherwise, the small one in log form.
fn ln_incomplete_gamma(a: f64, x: f64) -> (f64, f64) {
    let ln_front = -x + a * x.ln() - lgamma(a);
    if x < a + 1.0 {
        let (mut ap, mut del, mut sum) = (a, 1.0 / a, 1.0 / a);
        for _ in 0..1000 {
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
        let mut c = 1.0 / tiny;
        let mut d = 1.0 / b;
        let mut h = d;
        for i in 1..1000 {
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

/// `(ln erf(u), ln erfc(u))` for `u > 0`: `erf(u) = P(1/2, u^2)`.
fn ln_erf_erfc(u: f64) -> (f64, f64) {
    ln_incomplete_gamma(0.5, u * u)
}

/// `(ln Phi(z), ln (1 - Phi(z)))`.
fn ln_normal_cdfs(z: f64) -> (f64, f64) {
    if z == 0.0 {
        return (0.5f64.ln(), 0.5f64.ln());
    }
    let tail = ln_erf_erfc(z.abs() / 2f64.sqrt()).1 - 2f64.ln();
    let body = (-tail.exp()).ln_1p();
    if z < 0.0 { (tail, body) } else { (body, tail) }
}

// ---------------------------------------------------------------------------------------------
// Plumbing.

fn device() -> Device {
    BackendKind::Flex.device().unwrap()
}

fn f32_of(v: f64) -> f64 {
    v as f32 as f64
}

fn vector(values: &[f64], device: &Device) -> Tensor<1> {
    let v: Vec<f32> = values.iter().map(|&v| v as f32).collect();
    Tensor::from_data(TensorData::new(v, [values.len()]), device)
}

fn matrix(values: &[f64], rows: usize, cols: usize, device: &Device) -> Tensor<2> {
    let v: Vec<f32> = values.iter().map(|&v| v as f32).collect();
    Tensor::from_data(TensorData::new(v, [rows, cols]), device)
}

/// `got` against `(value, scale)` references: equal infinities, else within
/// `rtol (1 + scale)`.
#[track_caller]
fn close_tol(got: &Tensor<1>, want: &[(f64, f64)], rtol: f64, what: &str) {
    let got = to_vec_f64(got);
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &(w, scale))) in got.iter().zip(want).enumerate() {
        if w.is_infinite() {
            assert_eq!(g, w, "{what}, entry {i}");
            continue;
        }
        let tol = rtol * (1.0 + scale.abs());
        assert!((g - w).abs() <= tol, "{what}, entry {i}: {g} vs {w} (diff {:.2e}, tolerance {tol:.2e})", g - w);
    }
}

#[track_caller]
fn close(got: &Tensor<1>, want: &[(f64, f64)], what: &str) {
    close_tol(got, want, 16.0 * EPS32, what);
}

/// The autodiff gradient of `sum f(p)` at `p` against central differences of the `f64`
/// reference `g`: within `rtol (1 + |fd|)`.
#[track_caller]
fn grad_check(p: &[f64], f: impl FnOnce(Tensor<1>) -> Tensor<1>, g: impl Fn(&[f64]) -> f64, rtol: f64, what: &str) {
    let ad = device().autodiff();
    let (_, grad) = value_and_grad(vector(p, &ad), |t| f(t).sum()).unwrap();
    let grad = to_vec_f64(&grad);
    let p: Vec<f64> = p.iter().map(|&v| f32_of(v)).collect();
    for (i, &pi) in p.iter().enumerate() {
        let h = 1e-6 * pi.abs().max(1e-2);
        let (mut up, mut down) = (p.clone(), p.clone());
        up[i] += h;
        down[i] -= h;
        let fd = (g(&up) - g(&down)) / (2.0 * h);
        let tol = rtol * (1.0 + fd.abs());
        assert!(grad[i].is_finite(), "{what}: gradient {i} is {}", grad[i]);
        assert!((grad[i] - fd).abs() <= tol, "{what}: d/dp{i} autodiff {} vs fd {fd} (tolerance {tol:.2e})", grad[i]);
    }
}

#[track_caller]
fn invalid<T: std::fmt::Debug>(r: Result<T, ModelError>, dist: &str, name: &str) {
    match r {
        Err(
            ModelError::InvalidParameter { dist: d, name: n, .. } | ModelError::InvalidElement { dist: d, name: n, .. },
        ) => {
            assert_eq!((d, n), (dist, name));
        }
        other => panic!("expected InvalidParameter {{ {dist}, {name} }}, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Log-gamma on tensors.

/// `ln_gamma_tensor` over `0.05 .. 1e4`: relative 1e-5 in f32 where `|ln Gamma| >= 1`,
/// absolute 1e-5 near its zeros at 1 and 2 (where a relative error means nothing).
#[test]
fn ln_gamma_tensor_is_accurate_over_model_ranges() {
    let dev = device();
    let xs: Vec<f64> = (0..=240).map(|i| f32_of(0.05 * 10f64.powf(i as f64 * (5.302 / 240.0)))).collect();
    assert!(xs.last().unwrap() >= &1e4);
    let got = to_vec_f64(&ln_gamma_tensor(vector(&xs, &dev)));
    let mut worst = 0.0f64;
    for (&x, &g) in xs.iter().zip(&got) {
        let w = lgamma(x);
        let err = (g - w).abs() / w.abs().max(1.0);
        worst = worst.max(err);
        assert!(err <= 1e-5, "ln_gamma_tensor({x}) = {g}, want {w}: relative error {err:.2e}");
    }
    println!("ln_gamma_tensor worst relative error over 0.05..1e4: {worst:.2e}");
}

/// `ln Gamma(a + n) - ln Gamma(a)` keeps its own relative precision for large `a`.
#[test]
fn ln_gamma_ratio_is_accurate_for_large_arguments() {
    let dev = device();
    let cases = [(0.05, 3.0), (0.7, 0.5), (3.0, 0.0), (5.0, 0.5), (50.0, 17.0), (1e3, 0.5), (1e4, 12.0), (2e4, 1e3)];
    let a: Vec<f64> = cases.iter().map(|c| f32_of(c.0)).collect();
    let n: Vec<f64> = cases.iter().map(|c| f32_of(c.1)).collect();
    let got = ln_gamma_ratio_tensor(vector(&a, &dev), vector(&n, &dev));
    let want: Vec<(f64, f64)> = a
        .iter()
        .zip(&n)
        .map(|(&a, &n)| {
            let w = lgamma(a + n) - lgamma(a);
            (w, w.abs())
        })
        .collect();
    close(&got, &want, "ln_gamma_ratio_tensor");
}

// ---------------------------------------------------------------------------------------------
// Continuous densities.

fn gamma_ref(x: f64, a: f64, b: f64) -> (f64, f64) {
    if x <= 0.0 {
        return (f64::NEG_INFINITY, 0.0);
    }
    let t = [a * b.ln(), -lgamma(a), (a - 1.0) * x.ln(), -b * x];
    (t.iter().sum(), t.iter().map(|v| v.abs()).sum())
}

#[test]
fn gamma_with_tensor_shape() {
    let dev = device();
    let x = [0.3, 2.0, 45.0, 1e-3, -1.0, 7.5];
    let shape = [0.5, 2.0, 30.0, 0.07, 3.0, 4000.0];
    let rate = 1.7;
    let got = Gamma::new(vector(&shape, &dev), rate).unwrap().log_prob(vector(&x, &dev));
    let want: Vec<_> = x.iter().zip(&shape).map(|(&x, &a)| gamma_ref(f32_of(x), f32_of(a), rate)).collect::<Vec<_>>();
    close(&got, &want, "Gamma(tensor shape)");
    // The scalar form is unchanged.
    let got = Gamma::new(2.5, vector(&[0.5, 3.0], &dev)).unwrap().log_prob(vector(&[1.0, 0.2], &dev));
    close(&got, &[gamma_ref(1.0, 2.5, 0.5), gamma_ref(f32_of(0.2), 2.5, 3.0)], "Gamma(scalar shape)");

    let x = [0.3, 2.0, 45.0];
    grad_check(
        &[0.5, 2.0, 30.0],
        |a| Gamma::new(a, 1.7).unwrap().log_prob(vector(&x, &a_dev())),
        |a| a.iter().zip(&x).map(|(&a, &x)| gamma_ref(f32_of(x), a, 1.7).0).sum(),
        1e-4,
        "Gamma d/dshape",
    );
    grad_check(
        &[0.5, 2.0, 3.0],
        |b| Gamma::new(vector(&[2.0, 3.0, 0.5], &a_dev()), b).unwrap().log_prob(vector(&x, &a_dev())),
        |b| b.iter().zip(&x).zip([2.0, 3.0, 0.5]).map(|((&b, &x), a)| gamma_ref(f32_of(x), a, b).0).sum(),
        1e-4,
        "Gamma d/drate",
    );
}

fn a_dev() -> Device {
    device().autodiff()
}

fn inv_gamma_ref(x: f64, a: f64, b: f64) -> (f64, f64) {
    if x <= 0.0 {
        return (f64::NEG_INFINITY, 0.0);
    }
    let t = [a * b.ln(), -lgamma(a), -(a + 1.0) * x.ln(), -b / x];
    (t.iter().sum(), t.iter().map(|v| v.abs()).sum())
}

#[test]
fn inv_gamma() {
    let dev = device();
    let x = [0.3, 2.0, 45.0, 1e-2, 0.0, -3.0];
    let alpha = [0.5, 2.0, 30.0, 3.0, 1.0, 1.0];
    let beta = [1.0, 0.2, 900.0, 0.01, 1.0, 1.0];
    let got = InvGamma::new(vector(&alpha, &dev), vector(&beta, &dev)).unwrap().log_prob(vector(&x, &dev));
    let want: Vec<_> = (0..x.len()).map(|i| inv_gamma_ref(f32_of(x[i]), f32_of(alpha[i]), f32_of(beta[i]))).collect();
    close(&got, &want, "InvGamma");
    let got = InvGamma::new(3.0, 2.0).unwrap().log_prob(vector(&[0.5, 8.0], &dev));
    close(&got, &[inv_gamma_ref(0.5, 3.0, 2.0), inv_gamma_ref(8.0, 3.0, 2.0)], "InvGamma(scalars)");
    let x = [0.3, 2.0, 45.0];
    grad_check(
        &[0.5, 2.0, 30.0],
        |a| InvGamma::new(a, 2.0).unwrap().log_prob(vector(&x, &a_dev())),
        |a| a.iter().zip(&x).map(|(&a, &x)| inv_gamma_ref(f32_of(x), a, 2.0).0).sum(),
        1e-4,
        "InvGamma d/dalpha",
    );
    grad_check(
        &[0.5, 2.0, 30.0],
        |b| InvGamma::new(2.5, b).unwrap().log_prob(vector(&x, &a_dev())),
        |b| b.iter().zip(&x).map(|(&b, &x)| inv_gamma_ref(f32_of(x), 2.5, b).0).sum(),
        1e-4,
        "InvGamma d/dbeta",
    );
}

fn weibull_ref(x: f64, a: f64, s: f64) -> (f64, f64) {
    if x <= 0.0 {
        return (f64::NEG_INFINITY, 0.0);
    }
    let t = [a.ln(), -s.ln(), (a - 1.0) * (x / s).ln(), -(x / s).powf(a)];
    (t.iter().sum(), t.iter().map(|v| v.abs()).sum::<f64>() + (a * x.ln()).abs() + (a * s.ln()).abs())
}

#[test]
fn weibull() {
    let dev = device();
    let x = [0.3, 2.0, 45.0, 1e-3, 0.0, -1.0];
    let alpha = [0.5, 2.0, 1.3, 3.0, 2.0, 2.0];
    let sigma = [1.0, 0.7, 40.0, 0.01, 1.0, 1.0];
    let got = Weibull::new(vector(&alpha, &dev), vector(&sigma, &dev)).unwrap().log_prob(vector(&x, &dev));
    let want: Vec<_> = (0..x.len()).map(|i| weibull_ref(f32_of(x[i]), f32_of(alpha[i]), f32_of(sigma[i]))).collect();
    close(&got, &want, "Weibull");
    let x = [0.3, 2.0, 45.0];
    grad_check(
        &[0.5, 2.0, 1.3],
        |a| Weibull::new(a, 3.0).unwrap().log_prob(vector(&x, &a_dev())),
        |a| a.iter().zip(&x).map(|(&a, &x)| weibull_ref(f32_of(x), a, 3.0).0).sum(),
        1e-4,
        "Weibull d/dalpha",
    );
    grad_check(
        &[0.5, 2.0, 30.0],
        |s| Weibull::new(1.5, s).unwrap().log_prob(vector(&x, &a_dev())),
        |s| s.iter().zip(&x).map(|(&s, &x)| weibull_ref(f32_of(x), 1.5, s).0).sum(),
        1e-4,
        "Weibull d/dsigma",
    );
}

fn beta_ref(x: f64, a: f64, b: f64) -> (f64, f64) {
    if x <= 0.0 || x >= 1.0 {
        return (f64::NEG_INFINITY, 0.0);
    }
    let t = [lgamma(a + b), -lgamma(a), -lgamma(b), (a - 1.0) * x.ln(), (b - 1.0) * (-x).ln_1p()];
    (t.iter().sum(), t.iter().map(|v| v.abs()).sum())
}

#[test]
fn beta_with_tensor_shapes() {
    let dev = device();
    let x = [0.3, 0.999, 1e-4, 0.5, 0.0, 1.0, 0.7];
    let a = [0.5, 2.0, 0.1, 300.0, 1.0, 1.0, 5.0];
    let b = [0.5, 0.2, 3.0, 300.0, 1.0, 1.0, 5.0];
    let got = Beta::new(vector(&a, &dev), vector(&b, &dev)).unwrap().log_prob(vector(&x, &dev));
    let want: Vec<_> = (0..x.len()).map(|i| beta_ref(f32_of(x[i]), f32_of(a[i]), f32_of(b[i]))).collect();
    close(&got, &want, "Beta(tensor shapes)");
    let got = Beta::new(5.0, 5.0).unwrap().log_prob(vector(&[0.3, 0.9], &dev));
    close(&got, &[beta_ref(f32_of(0.3), 5.0, 5.0), beta_ref(f32_of(0.9), 5.0, 5.0)], "Beta(scalars)");
    let x = [0.3, 0.9, 0.05];
    grad_check(
        &[0.5, 2.0, 30.0],
        |a| Beta::new(a, 2.0).unwrap().log_prob(vector(&x, &a_dev())),
        |a| a.iter().zip(&x).map(|(&a, &x)| beta_ref(f32_of(x), a, 2.0).0).sum(),
        1e-4,
        "Beta d/dalpha",
    );
    grad_check(
        &[0.5, 2.0, 30.0],
        |b| Beta::new(vector(&[1.5, 0.3, 4.0], &a_dev()), b).unwrap().log_prob(vector(&x, &a_dev())),
        |b| b.iter().zip(&x).zip([1.5, 0.3, 4.0]).map(|((&b, &x), a)| beta_ref(f32_of(x), f32_of(a), b).0).sum(),
        1e-4,
        "Beta d/dbeta",
    );
}

fn student_ref(x: f64, df: f64, loc: f64, scale: f64) -> (f64, f64) {
    let z = (x - loc) / scale;
    let t = [
        lgamma(0.5 * (df + 1.0)) - lgamma(0.5 * df),
        -0.5 * (df * PI).ln(),
        -scale.ln(),
        -0.5 * (df + 1.0) * (z * z / df).ln_1p(),
    ];
    (t.iter().sum(), t.iter().map(|v| v.abs()).sum())
}

#[test]
fn student_t_with_tensor_df() {
    let dev = device();
    let x = [0.3, -20.0, 3.0, 1e3, 0.5];
    let df = [1.0, 3.0, 30.0, 0.5, 1e4];
    let got = StudentT::new(vector(&df, &dev), 0.5, 1.5).unwrap().log_prob(vector(&x, &dev));
    let want: Vec<_> = (0..x.len()).map(|i| student_ref(f32_of(x[i]), f32_of(df[i]), 0.5, 1.5)).collect();
    close(&got, &want, "StudentT(tensor df)");
    let got = StudentT::new(3.0, 0.0, 10.0).unwrap().log_prob(vector(&[2.0, -50.0], &dev));
    close(&got, &[student_ref(2.0, 3.0, 0.0, 10.0), student_ref(-50.0, 3.0, 0.0, 10.0)], "StudentT(scalars)");
    let x = [0.3, -20.0, 3.0];
    grad_check(
        &[1.0, 3.0, 30.0],
        |df| StudentT::new(df, 0.5, 1.5).unwrap().log_prob(vector(&x, &a_dev())),
        |df| df.iter().zip(&x).map(|(&d, &x)| student_ref(f32_of(x), d, 0.5, 1.5).0).sum(),
        1e-4,
        "StudentT d/ddf",
    );
    // The host cdf needs scalar parameters: a tensor df is refused by name.
    invalid(StudentT::new(vector(&[3.0], &dev), 0.0, 1.0).unwrap().lcdf(0.0), "StudentT", "df");
}

fn half_normal_ref(x: f64, s: f64) -> (f64, f64) {
    if x < 0.0 {
        return (f64::NEG_INFINITY, 0.0);
    }
    let t = [0.5 * (2.0 / PI).ln(), -s.ln(), -0.5 * (x / s).powi(2)];
    (t.iter().sum(), t.iter().map(|v| v.abs()).sum())
}

#[test]
fn half_normal_and_its_cdfs() {
    let dev = device();
    let x = [0.0, 0.3, 2.0, 40.0, -1e-3];
    let s = [1.0, 0.1, 2.0, 3.0, 1.0];
    let got = HalfNormal::new(vector(&s, &dev)).unwrap().log_prob(vector(&x, &dev));
    let want: Vec<_> = (0..x.len()).map(|i| half_normal_ref(f32_of(x[i]), f32_of(s[i]))).collect();
    close(&got, &want, "HalfNormal");
    grad_check(
        &[0.1, 2.0, 3.0],
        |s| HalfNormal::new(s).unwrap().log_prob(vector(&[0.3, 2.0, 40.0], &a_dev())),
        |s| s.iter().zip([0.3, 2.0, 40.0]).map(|(&s, x)| half_normal_ref(f32_of(x), s).0).sum(),
        1e-4,
        "HalfNormal d/dsigma",
    );

    // ln erf / ln erfc of x / (sigma sqrt 2), from tiny to far tail.
    let sigma = 2.0;
    let x = [1e-5, 0.01, 0.5, 1.4, 1.5, 3.0, 10.0, 60.0, 0.0];
    let d = HalfNormal::new(sigma).unwrap();
    let cdfs = |x: f64| {
        if x == 0.0 {
            return (f64::NEG_INFINITY, 0.0);
        }
        ln_erf_erfc(f32_of(x) / (sigma * 2f64.sqrt()))
    };
    let lcdf: Vec<_> = x.iter().map(|&x| (cdfs(x).0, cdfs(x).0.abs())).collect();
    let lccdf: Vec<_> = x.iter().map(|&x| (cdfs(x).1, cdfs(x).1.abs())).collect();
    close(&d.lcdf(vector(&x, &dev)), &lcdf, "HalfNormal lcdf");
    close(&d.lccdf(vector(&x, &dev)), &lccdf, "HalfNormal lccdf");
    let pts = [1e-3, 0.7, 1.0, 5.0, 30.0];
    grad_check(
        &pts,
        |x| HalfNormal::new(sigma).unwrap().lcdf(x),
        |x| x.iter().map(|&x| ln_erf_erfc(x / (sigma * 2f64.sqrt())).0).sum(),
        1e-4,
        "HalfNormal d lcdf/dx",
    );
    grad_check(
        &pts,
        |x| HalfNormal::new(sigma).unwrap().lccdf(x),
        |x| x.iter().map(|&x| ln_erf_erfc(x / (sigma * 2f64.sqrt())).1).sum(),
        1e-4,
        "HalfNormal d lccdf/dx",
    );
}

#[test]
fn uniform_inside_outside_and_tensor_bounds() {
    let dev = device();
    let x = [0.5, -1.0, 3.0, 2.0, -0.999, 2.5];
    let got = Uniform::new(-1.0, 2.0).unwrap().log_prob(vector(&x, &dev));
    let inside = -(3f64.ln());
    let ninf = f64::NEG_INFINITY;
    close(&got, &[(inside, 1.0), (inside, 1.0), (ninf, 0.0), (inside, 1.0), (inside, 1.0), (ninf, 0.0)], "Uniform");
    // Per-entry bounds; the last slot's upper is below its lower: no inside, -inf, not NaN.
    let lower = [0.0, -5.0, 1.0];
    let upper = [0.25, 5.0, 0.5];
    let got =
        Uniform::new(vector(&lower, &dev), vector(&upper, &dev)).unwrap().log_prob(vector(&[0.1, 7.0, 0.7], &dev));
    close(&got, &[(-(0.25f64.ln()), 2.0), (ninf, 0.0), (ninf, 0.0)], "Uniform(tensor bounds)");
    // Gradients in the bounds: d/dlower = 1/(u - l), d/dupper = -1/(u - l); 0 outside.
    let ad = a_dev();
    let (_, g) = value_and_grad(vector(&[0.0, -5.0, -1.0], &ad), |l| {
        Uniform::new(l, vector(&[0.25, 5.0, 1.0], &ad)).unwrap().log_prob(vector(&[0.1, 7.0, 0.0], &ad)).sum()
    })
    .unwrap();
    close_tol(&g, &[(4.0, 4.0), (0.0, 0.0), (0.5, 0.5)], 1e-6, "Uniform d/dlower");
    let (_, g) =
        value_and_grad(vector(&[0.1, 7.0, 0.0], &ad), |x| Uniform::new(-1.0, 1.0).unwrap().log_prob(x).sum()).unwrap();
    close_tol(&g, &[(0.0, 0.0); 3], 0.0, "Uniform d/dx");
}

fn dirichlet_ref(theta: &[f64], alpha: &[f64]) -> (f64, f64) {
    if theta.iter().any(|&t| t <= 0.0) {
        return (f64::NEG_INFINITY, 0.0);
    }
    let mut t = vec![lgamma(alpha.iter().sum())];
    t.extend(alpha.iter().map(|&a| -lgamma(a)));
    t.extend(theta.iter().zip(alpha).map(|(&x, &a)| (a - 1.0) * x.ln()));
    (t.iter().sum(), t.iter().map(|v| v.abs()).sum())
}

#[test]
fn dirichlet_host_and_tensor_concentrations() {
    let dev = device();
    let theta = [0.2, 0.3, 0.5, 0.001, 0.009, 0.99, 0.0, 0.4, 0.6];
    let alpha = [0.5, 2.0, 7.0];
    let got = Dirichlet::new(&alpha).unwrap().log_prob(matrix(&theta, 3, 3, &dev)).reshape([3]);
    let rows = |a: &dyn Fn(usize) -> [f64; 3]| -> Vec<(f64, f64)> {
        (0..3)
            .map(|r| dirichlet_ref(&theta[3 * r..3 * r + 3].iter().map(|&v| f32_of(v)).collect::<Vec<_>>(), &a(r)))
            .collect()
    };
    close(&got, &rows(&|_| alpha), "Dirichlet(host alpha)");
    // Per-particle concentrations [n, K] and shared ones [1, K].
    let per = [0.5, 2.0, 7.0, 1.0, 1.0, 1.0, 30.0, 0.1, 4.0];
    let got = Dirichlet::from_tensor(matrix(&per, 3, 3, &dev)).log_prob(matrix(&theta, 3, 3, &dev)).reshape([3]);
    close(&got, &rows(&|r| [per[3 * r], per[3 * r + 1], per[3 * r + 2]].map(f32_of)), "Dirichlet([n, K] alpha)");
    let got = Dirichlet::from_tensor(matrix(&alpha, 1, 3, &dev)).log_prob(matrix(&theta, 3, 3, &dev)).reshape([3]);
    close(&got, &rows(&|_| alpha), "Dirichlet([1, K] alpha)");

    let th = [0.2, 0.3, 0.5, 0.001, 0.009, 0.99];
    grad_check(
        &per[..6],
        |a| Dirichlet::from_tensor(a.reshape([2, 3])).log_prob(matrix(&th, 2, 3, &a_dev())).reshape([2]),
        |a| {
            (0..2)
                .map(|r| {
                    dirichlet_ref(
                        &th[3 * r..3 * r + 3].iter().map(|&v| f32_of(v)).collect::<Vec<_>>(),
                        &a[3 * r..3 * r + 3],
                    )
                    .0
                })
                .sum()
        },
        1e-4,
        "Dirichlet d/dalpha",
    );
    grad_check(
        &th,
        |t| Dirichlet::new(&alpha).unwrap().log_prob(t.reshape([2, 3])).reshape([2]),
        |t| (0..2).map(|r| dirichlet_ref(&t[3 * r..3 * r + 3], &alpha).0).sum(),
        1e-4,
        "Dirichlet d/dtheta",
    );
}

fn lkj_ref(l: &[f64], k: usize, eta: f64) -> (f64, f64) {
    // Lewandowski, Kurowicka & Joe (2009), the vine normaliser:
    // c_K = sum_{i=1}^{K-1} [(2 eta - 2 + K - i)(K - i) ln 2 + (K - i) ln B(b_i, b_i)],
    // b_i = eta + (K - i - 1)/2; the density of the correlation matrix is det^(eta-1) / c_K,
    // and the Cholesky factor adds the Jacobian prod_i L_ii^(K - i - 1) (0-based i).
    let mut c = 0.0;
    for i in 1..k {
        let ki = (k - i) as f64;
        let b = eta + (ki - 1.0) / 2.0;
        c += (2.0 * eta - 2.0 + ki) * ki * 2f64.ln() + ki * (2.0 * lgamma(b) - lgamma(2.0 * b));
    }
    let mut t = vec![-c];
    for i in 1..k {
        let lii = l[i * k + i];
        if lii <= 0.0 {
            return (f64::NEG_INFINITY, 0.0);
        }
        t.push(((k - i - 1) as f64 + 2.0 * eta - 2.0) * lii.ln());
    }
    (t.iter().sum(), t.iter().map(|v| v.abs()).sum())
}

/// A Cholesky factor of a correlation matrix from unconstrained numbers (rows of unit norm).
fn corr_cholesky(k: usize, seed: u64) -> Vec<f64> {
    let mut state = seed;
    let mut next = || {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        ((state >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
    };
    let mut l = vec![0.0; k * k];
    for i in 0..k {
        let row: Vec<f64> = (0..=i).map(|j| if j == i { 1.0 + next().abs() } else { next() }).collect();
        let norm = row.iter().map(|v| v * v).sum::<f64>().sqrt();
        for (j, v) in row.iter().enumerate() {
            l[i * k + j] = v / norm;
        }
    }
    l
}

#[test]
fn lkj_corr_cholesky() {
    let dev = device();
    for k in [1usize, 2, 3, 4, 6] {
        let n = 3;
        let ls: Vec<f64> = (0..n).flat_map(|s| corr_cholesky(k, 17 + s as u64)).map(f32_of).collect();
        let lt = || {
            Tensor::<1>::from_data(TensorData::new(ls.iter().map(|&v| v as f32).collect::<Vec<_>>(), [n * k * k]), &dev)
                .reshape([n, k, k])
        };
        for eta in [1.0, 0.3, 2.5, 40.0] {
            let got = LkjCorrCholesky::new(eta).unwrap().log_prob(lt());
            let want: Vec<_> = (0..n).map(|s| lkj_ref(&ls[s * k * k..(s + 1) * k * k], k, eta)).collect();
            close(&got, &want, &format!("LkjCorrCholesky(K = {k}, eta = {eta})"));
        }
        let etas = [0.5, 1.0, 7.0];
        let got = LkjCorrCholesky::new(vector(&etas, &dev)).unwrap().log_prob(lt());
        let want: Vec<_> = (0..n).map(|s| lkj_ref(&ls[s * k * k..(s + 1) * k * k], k, f32_of(etas[s]))).collect();
        close(&got, &want, &format!("LkjCorrCholesky(K = {k}, tensor eta)"));
    }
    // A non-positive diagonal is outside: -inf, not NaN.
    let mut bad_l = corr_cholesky(3, 5);
    bad_l[4] = -bad_l[4];
    let got = LkjCorrCholesky::new(2.0).unwrap().log_prob(vector(&bad_l, &dev).reshape([1, 3, 3]));
    assert_eq!(to_vec_f64(&got), vec![f64::NEG_INFINITY]);

    let k = 4;
    let ls: Vec<f64> = (0..2).flat_map(|s| corr_cholesky(k, 3 + s as u64)).map(f32_of).collect();
    grad_check(
        &[0.5, 3.0],
        |eta| {
            let l = vector(&ls, &a_dev()).reshape([2, k, k]);
            LkjCorrCholesky::new(eta).unwrap().log_prob(l)
        },
        |eta| (0..2).map(|s| lkj_ref(&ls[s * k * k..(s + 1) * k * k], k, eta[s]).0).sum(),
        1e-4,
        "LkjCorrCholesky d/deta",
    );
    grad_check(
        &ls,
        |l| LkjCorrCholesky::new(2.5).unwrap().log_prob(l.reshape([2, k, k])),
        |l| (0..2).map(|s| lkj_ref(&l[s * k * k..(s + 1) * k * k], k, 2.5).0).sum(),
        1e-4,
        "LkjCorrCholesky d/dL",
    );
}

// ---------------------------------------------------------------------------------------------
// Counts.

fn lchoose(n: f64, k: f64) -> f64 {
    lgamma(n + 1.0) - lgamma(k + 1.0) - lgamma(n - k + 1.0)
}

fn binomial_logit_ref(k: f64, n: f64, a: f64) -> (f64, f64) {
    let p = 1.0 / (1.0 + (-a).exp());
    // ln p and ln(1 - p) directly from the probability where it is not extreme, by the
    // asymptotic forms otherwise.
    let (lp, l1p) = if a.abs() < 20.0 {
        (p.ln(), (-p).ln_1p())
    } else if a > 0.0 {
        (-(-a).exp(), -a)
    } else {
        (a, -a.exp())
    };
    let t = [lchoose(n, k), k * lp, (n - k) * l1p];
    (t.iter().sum(), t.iter().map(|v| v.abs()).sum())
}

#[test]
fn binomial_logit() {
    let dev = device();
    let k = [0.0, 3.0, 10.0, 7.0, 500.0, 0.0];
    let n = [5.0, 10.0, 10.0, 7.0, 1000.0, 0.0];
    let a = [-2.0, 0.3, 40.0, -30.0, 0.1, 1.0];
    let got = BinomialLogit::new(vector(&k, &dev), vector(&n, &dev)).unwrap().log_prob(vector(&a, &dev));
    let want: Vec<_> = (0..k.len()).map(|i| binomial_logit_ref(k[i], n[i], f32_of(a[i]))).collect();
    close(&got, &want, "BinomialLogit");
    let got = BinomialLogit::new(vector(&[2.0, 9.0], &dev), 9.0).unwrap().log_prob(vector(&[0.0, 3.0], &dev));
    close(
        &got,
        &[binomial_logit_ref(2.0, 9.0, 0.0), binomial_logit_ref(9.0, 9.0, 3.0)],
        "BinomialLogit(scalar trials)",
    );
    grad_check(
        &a[..5],
        |a| BinomialLogit::new(vector(&k[..5], &a_dev()), vector(&n[..5], &a_dev())).unwrap().log_prob(a),
        |a| (0..5).map(|i| binomial_logit_ref(k[i], n[i], a[i]).0).sum(),
        1e-4,
        "BinomialLogit d/dalpha",
    );
}

fn neg_binomial_2_log_ref(k: f64, eta: f64, phi: f64) -> (f64, f64) {
    // The mean-overdispersion form written directly: C(k + phi - 1, k) (mu/(mu+phi))^k (phi/(mu+phi))^phi.
    let mu = eta.exp();
    let t = [lgamma(k + phi) - lgamma(k + 1.0) - lgamma(phi), k * (mu / (mu + phi)).ln(), -phi * (mu / phi).ln_1p()];
    // The library's log-gamma ratio is exact to its own size, not to ln Gamma(phi)'s.
    let scale = (lgamma(k + phi) - lgamma(phi)).abs() + lgamma(k + 1.0) + t[1].abs() + t[2].abs();
    (t.iter().sum(), scale)
}

#[test]
fn neg_binomial_2_log() {
    let dev = device();
    let k = [0.0, 3.0, 50.0, 7.0, 0.0, 120.0];
    let eta = [-2.0, 0.3, 4.0, 2.0, 5.0, 4.7];
    let phi = [0.5, 3.0, 1e4, 0.05, 2.0, 3e3];
    let d = NegBinomial2Log::new(vector(&k, &dev)).unwrap();
    let got = d.log_prob(vector(&eta, &dev), vector(&phi, &dev)).unwrap();
    let want: Vec<_> = (0..k.len()).map(|i| neg_binomial_2_log_ref(k[i], f32_of(eta[i]), f32_of(phi[i]))).collect();
    close(&got, &want, "NegBinomial2Log");
    let got = d.log_prob(vector(&eta, &dev), 2.5).unwrap();
    let want: Vec<_> = (0..k.len()).map(|i| neg_binomial_2_log_ref(k[i], f32_of(eta[i]), 2.5)).collect();
    close(&got, &want, "NegBinomial2Log(scalar phi)");
    grad_check(
        &eta,
        |e| NegBinomial2Log::new(vector(&k, &a_dev())).unwrap().log_prob(e, vector(&phi, &a_dev())).unwrap(),
        |e| (0..k.len()).map(|i| neg_binomial_2_log_ref(k[i], e[i], f32_of(phi[i])).0).sum(),
        1e-4,
        "NegBinomial2Log d/deta",
    );
    grad_check(
        &phi,
        |p| NegBinomial2Log::new(vector(&k, &a_dev())).unwrap().log_prob(vector(&eta, &a_dev()), p).unwrap(),
        |p| (0..k.len()).map(|i| neg_binomial_2_log_ref(k[i], f32_of(eta[i]), p[i]).0).sum(),
        1e-3,
        "NegBinomial2Log d/dphi",
    );
}

// ---------------------------------------------------------------------------------------------
// Cumulative distribution functions.

#[test]
fn normal_cdfs_in_both_tails() {
    let dev = device();
    let (loc, scale) = (1.0, 2.0);
    let z = [-38.0, -10.0, -3.0, -0.5, -1e-4, 0.0, 0.5, 3.0, 10.0, 38.0];
    let x: Vec<f64> = z.iter().map(|z| f32_of(loc + scale * z)).collect();
    let want = |i: usize| ln_normal_cdfs((x[i] - loc) / scale);
    let d = Normal::new(loc, scale).unwrap();
    close(
        &d.lcdf(vector(&x, &dev)),
        &(0..x.len()).map(|i| (want(i).0, want(i).0.abs())).collect::<Vec<_>>(),
        "Normal lcdf",
    );
    close(
        &d.lccdf(vector(&x, &dev)),
        &(0..x.len()).map(|i| (want(i).1, want(i).1.abs())).collect::<Vec<_>>(),
        "Normal lccdf",
    );
    // Tensor parameters, gradients in loc and scale (the truncated-normal normaliser's).
    let xs = [-30.0, -2.0, 0.5, 1.0, 4.0, 25.0];
    grad_check(
        &[0.0, 0.3, -1.0, 2.0, 0.5, 1.0],
        |m| Normal::new(m, 1.0).unwrap().lcdf(vector(&xs, &a_dev())),
        |m| (0..6).map(|i| ln_normal_cdfs(f32_of(xs[i]) - m[i]).0).sum(),
        1e-4,
        "Normal d lcdf/dloc",
    );
    grad_check(
        &[0.5, 1.0, 2.0, 0.3, 1.0, 0.9],
        |s| Normal::new(0.0, s).unwrap().lccdf(vector(&xs, &a_dev())),
        |s| (0..6).map(|i| ln_normal_cdfs(f32_of(xs[i]) / s[i]).1).sum(),
        1e-4,
        "Normal d lccdf/dscale",
    );
}

#[test]
fn exponential_cdfs() {
    let dev = device();
    let rate = 0.7;
    let x = [1e-7, 1e-3, 0.3, 0.7143, 0.8, 5.0, 80.0, 0.0, -1.0];
    let d = Exponential::new(rate).unwrap();
    let lcdf: Vec<_> = x
        .iter()
        .map(|&x| {
            let y = rate * f32_of(x);
            let v = if x <= 0.0 { f64::NEG_INFINITY } else { (-(-y).exp_m1()).ln() };
            (v, v.abs())
        })
        .collect();
    let lccdf: Vec<_> = x.iter().map(|&x| (-rate * f32_of(x).max(0.0), rate * f32_of(x).abs())).collect();
    close(&d.lcdf(vector(&x, &dev)), &lcdf, "Exponential lcdf");
    close(&d.lccdf(vector(&x, &dev)), &lccdf, "Exponential lccdf");
    let xs = [1e-3, 0.3, 0.7143, 5.0];
    grad_check(
        &[0.5, 1.0, 0.7, 2.0],
        |r| Exponential::new(r).unwrap().lcdf(vector(&xs, &a_dev())),
        |r| (0..4).map(|i| (-(-r[i] * f32_of(xs[i])).exp_m1()).ln()).sum(),
        1e-4,
        "Exponential d lcdf/drate",
    );
}

fn cauchy_cdfs(z: f64) -> (f64, f64) {
    // P(Z > z) = atan2(1, z) / pi, exact in both tails.
    let upper = 1f64.atan2(z) / PI;
    let lower = 1f64.atan2(-z) / PI;
    (lower.ln(), upper.ln())
}

#[test]
fn cauchy_cdfs_in_both_tails() {
    let dev = device();
    let (loc, scale) = (-1.0, 0.5);
    let z = [-1e4, -10.0, -1.0, -0.3, 0.0, 0.3, 1.0, 1.0001, 10.0, 1e4];
    let x: Vec<f64> = z.iter().map(|z| f32_of(loc + scale * z)).collect();
    let d = Cauchy::new(loc, scale).unwrap();
    let want: Vec<_> = x.iter().map(|&x| cauchy_cdfs((x - loc) / scale)).collect();
    close(&d.lcdf(vector(&x, &dev)), &want.iter().map(|w| (w.0, w.0.abs())).collect::<Vec<_>>(), "Cauchy lcdf");
    close(&d.lccdf(vector(&x, &dev)), &want.iter().map(|w| (w.1, w.1.abs())).collect::<Vec<_>>(), "Cauchy lccdf");
    let xs = [-100.0, -1.5, -0.8, 0.0, 3.0];
    grad_check(
        &xs,
        |x| Cauchy::new(loc, scale).unwrap().lcdf(x),
        |x| x.iter().map(|&x| cauchy_cdfs((x - loc) / scale).0).sum(),
        1e-4,
        "Cauchy d lcdf/dx",
    );
    grad_check(
        &[0.3, 1.0, 2.0, 0.5, 4.0],
        |s| Cauchy::new(loc, s).unwrap().lccdf(vector(&xs, &a_dev())),
        |s| (0..5).map(|i| cauchy_cdfs((f32_of(xs[i]) - loc) / s[i]).1).sum(),
        1e-4,
        "Cauchy d lccdf/dscale",
    );
}

#[test]
fn log_softmax_is_stable() {
    let dev = device();
    let x = [1000.0, 999.0, -1000.0, 0.5, 0.0, -0.5];
    let got = log_softmax(matrix(&x, 2, 3, &dev), 1).reshape([6]);
    let mut want = Vec::new();
    for r in 0..2 {
        let row: Vec<f64> = x[3 * r..3 * r + 3].iter().map(|&v| f32_of(v)).collect();
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + row.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
        want.extend(row.iter().map(|v| (v - lse, v.abs())));
    }
    close(&got, &want, "log_softmax");
}

// ---------------------------------------------------------------------------------------------
// Bad input.

#[test]
fn bad_data_and_parameters_are_named_errors() {
    let dev = device();
    let v = |x: &[f64]| vector(x, &dev);
    invalid(BinomialLogit::new(v(&[1.0, -1.0]), 5.0), "BinomialLogit", "counts");
    invalid(BinomialLogit::new(v(&[1.0, 6.0]), 5.0), "BinomialLogit", "counts");
    invalid(BinomialLogit::new(v(&[1.5, 2.0]), 5.0), "BinomialLogit", "counts");
    invalid(BinomialLogit::new(v(&[1.0, 2.0]), v(&[3.0, 2.5])), "BinomialLogit", "trials");
    invalid(BinomialLogit::new(v(&[1.0, 2.0]), v(&[3.0])), "BinomialLogit", "trials");
    invalid(BinomialLogit::new(v(&[1.0, f64::NAN]), 5.0), "BinomialLogit", "counts");
    invalid(NegBinomial2Log::new(v(&[0.0, -2.0])), "NegBinomial2Log", "counts");
    invalid(NegBinomial2Log::new(v(&[0.0, 0.25])), "NegBinomial2Log", "counts");
    let nb = NegBinomial2Log::new(v(&[0.0, 2.0])).unwrap();
    invalid(nb.log_prob(v(&[0.0, 0.0]), 0.0), "NegBinomial2Log", "phi");
    invalid(Gamma::<1>::new(-1.0, 1.0), "Gamma", "shape");
    invalid(Gamma::<1>::new(1.0, 0.0), "Gamma", "rate");
    invalid(Beta::<1>::new(0.0, 1.0), "Beta", "alpha");
    invalid(Beta::<1>::new(1.0, f64::INFINITY), "Beta", "beta");
    invalid(StudentT::<1>::new(f64::NAN, 0.0, 1.0), "StudentT", "df");
    invalid(InvGamma::<1>::new(0.0, 1.0), "InvGamma", "alpha");
    invalid(InvGamma::<1>::new(1.0, -1.0), "InvGamma", "beta");
    invalid(Weibull::<1>::new(0.0, 1.0), "Weibull", "alpha");
    invalid(Weibull::<1>::new(1.0, -1.0), "Weibull", "sigma");
    invalid(HalfNormal::<1>::new(0.0), "HalfNormal", "sigma");
    invalid(Uniform::<1>::new(1.0, 1.0), "Uniform", "upper");
    invalid(Uniform::<1>::new(f64::NEG_INFINITY, 1.0), "Uniform", "lower");
    invalid(Dirichlet::<2>::new(&[1.0, 0.0]), "Dirichlet", "alpha");
    invalid(Dirichlet::<2>::new(&[]), "Dirichlet", "alpha");
    invalid(LkjCorrCholesky::new(0.0), "LkjCorrCholesky", "eta");
}

/// Outside the support the densities are -inf and their gradients 0: never NaN.
#[test]
fn outside_the_support_is_minus_infinity_with_finite_gradients() {
    let ad = a_dev();
    let x = [-1.0, 0.0];
    type F = Box<dyn Fn(Tensor<1>) -> Tensor<1>>;
    let cases: Vec<(&str, F)> = vec![
        ("Gamma", Box::new(|x| Gamma::new(2.0, 1.0).unwrap().log_prob(x))),
        ("InvGamma", Box::new(|x| InvGamma::new(2.0, 1.0).unwrap().log_prob(x))),
        ("Weibull", Box::new(|x| Weibull::new(2.0, 1.0).unwrap().log_prob(x))),
        ("Beta", Box::new(|x| Beta::new(2.0, 1.0).unwrap().log_prob(x))),
        ("HalfNormal", Box::new(|x| HalfNormal::new(2.0).unwrap().log_prob(x.sub_scalar(1e-3)))),
        ("Uniform", Box::new(|x| Uniform::new(0.5, 1.0).unwrap().log_prob(x))),
        ("Exponential lcdf", Box::new(|x| Exponential::new(2.0).unwrap().lcdf(x))),
        ("HalfNormal lcdf", Box::new(|x| HalfNormal::new(2.0).unwrap().lcdf(x))),
    ];
    for (what, f) in cases {
        let (value, grad) = value_and_grad(vector(&x, &ad), f).unwrap();
        assert_eq!(to_vec_f64(&value), vec![f64::NEG_INFINITY; 2], "{what}");
        assert!(to_vec_f64(&grad).iter().all(|g| *g == 0.0), "{what}: gradient {:?}", to_vec_f64(&grad));
    }
}
