//! The fused sums of squares, log-precision terms and normal log-densities equal the same
//! expressions built from ordinary tensor operations, values and gradients, on flex, ndarray and
//! wgpu, and their gradients agree with central finite differences in `f64` on the CPU backends.

use parvi_model::burn::tensor::{DType, Device, Tensor, TensorData};
use parvi_model::fused::{
    ScalarDensity, log_precision_terms, normal_log_density, poisson_log_terms, scalar_log_density,
    sum_squared_residuals, sum_squares_of_columns,
};
use parvi_model::{BackendKind, value_and_grad, value_and_grad2};
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};

/// flex and ndarray always; wgpu when it has an adapter (required when `PARVI_REQUIRE_WGPU` is
/// set, as in CI).
fn backends() -> Vec<(BackendKind, Device)> {
    let mut out = vec![
        (BackendKind::Flex, BackendKind::Flex.device().unwrap()),
        (BackendKind::Ndarray, BackendKind::Ndarray.device().unwrap()),
    ];
    match BackendKind::Wgpu.device() {
        Ok(device) => out.push((BackendKind::Wgpu, device)),
        Err(reason) => {
            if std::env::var_os("PARVI_REQUIRE_WGPU").is_some() {
                panic!("PARVI_REQUIRE_WGPU is set but wgpu is unavailable: {reason}");
            }
            eprintln!("SKIPPED wgpu: {reason}");
        }
    }
    out
}

fn to_vec_f64<const D: usize>(t: &Tensor<D>) -> Vec<f64> {
    t.to_data().convert::<f64>().try_to_vec::<f64>().unwrap()
}

fn normal<const D: usize>(shape: [usize; D], seed: u64, dtype: DType, device: &Device) -> Tensor<D> {
    let mut rng = chacha20::ChaCha8Rng::seed_from_u64(seed);
    let values: Vec<f64> = (0..shape.iter().product()).map(|_| StandardNormal.sample(&mut rng)).collect();
    Tensor::from_data(TensorData::new(values, shape).convert_dtype(dtype), (device, dtype))
}

fn max_rel_err(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(a, b)| (a - b).abs() / (1.0 + b.abs())).fold(0.0, f64::max)
}

/// `sum(out * w)` over rows: every output enters the gradient with its own weight.
fn weighted(out: Tensor<2>, w: Tensor<2>) -> Tensor<1> {
    let [n, _] = out.dims();
    (out * w).reshape([n])
}

#[test]
fn fused_sums_equal_plain_ops_on_every_backend() {
    for (backend, device) in backends() {
        let tol = if backend == BackendKind::Wgpu { 1e-4 } else { 1e-5 };
        let ad = device.autodiff();
        let (n, d, rows) = (6, 11, 9);
        let x = normal([n, d], 1, DType::F32, &ad);
        let w = normal([n, 1], 2, DType::F32, &ad);
        for (start, len) in [(0, d), (2, 5), (3, 1)] {
            let (vf, gf) =
                value_and_grad(x.clone(), |x| weighted(sum_squares_of_columns(x, start, len), w.clone())).unwrap();
            let (vp, gp) =
                value_and_grad(x.clone(), |x| weighted(x.narrow(1, start, len).square().sum_dim(1), w.clone()))
                    .unwrap();
            let (ev, eg) =
                (max_rel_err(&to_vec_f64(&vf), &to_vec_f64(&vp)), max_rel_err(&to_vec_f64(&gf), &to_vec_f64(&gp)));
            assert!(ev < tol && eg < tol, "{backend} columns {start}+{len}: value {ev}, gradient {eg}");
        }
        let y = normal([rows, 1], 3, DType::F32, &ad);
        let f = normal([rows, n], 4, DType::F32, &ad);
        let fused =
            value_and_grad2(y.clone(), f.clone(), |y, f| weighted(sum_squared_residuals(y, f), w.clone())).unwrap();
        let plain =
            value_and_grad2(y, f, |y, f| weighted((y - f).square().sum_dim(0).reshape([n, 1]), w.clone())).unwrap();
        for (what, a, b) in [
            ("value", to_vec_f64(&fused.0), to_vec_f64(&plain.0)),
            ("target gradient", to_vec_f64(&fused.1), to_vec_f64(&plain.1)),
            ("prediction gradient", to_vec_f64(&fused.2), to_vec_f64(&plain.2)),
        ] {
            let err = max_rel_err(&a, &b);
            assert!(err < tol, "{backend} residuals: {what} differs by {err}");
        }
    }
}

#[test]
fn fused_sums_gradients_match_finite_differences() {
    let h = 1e-6;
    for backend in [BackendKind::Flex, BackendKind::Ndarray] {
        let ad = backend.device().unwrap().autodiff();
        let x = normal([4, 7], 5, DType::F64, &ad);
        let w = normal([4, 1], 6, DType::F64, &ad);
        let loss = |x: Tensor<2>| weighted(sum_squares_of_columns(x, 1, 4), w.clone()).sum().reshape([1]);
        let (_, g) = value_and_grad(x.clone(), loss).unwrap();
        let (xv, g) = (to_vec_f64(&x), to_vec_f64(&g));
        let at = |j: usize, step: f64| {
            let mut v = xv.clone();
            v[j] += step;
            Tensor::<2>::from_data(TensorData::new(v, [4, 7]), (&ad, DType::F64))
        };
        for (j, gj) in g.iter().enumerate() {
            let fd = (to_vec_f64(&loss(at(j, h)))[0] - to_vec_f64(&loss(at(j, -h)))[0]) / (2.0 * h);
            assert!((fd - gj).abs() < 1e-6 * (1.0 + fd.abs()), "{backend} d/dx[{j}]: {gj} vs {fd}");
        }
        let y = normal([5, 1], 7, DType::F64, &ad);
        let f = normal([5, 4], 8, DType::F64, &ad);
        let loss = |f: Tensor<2>| weighted(sum_squared_residuals(y.clone(), f), w.clone()).sum().reshape([1]);
        let (_, g) = value_and_grad(f.clone(), loss).unwrap();
        let (fv, g) = (to_vec_f64(&f), to_vec_f64(&g));
        let at = |j: usize, step: f64| {
            let mut v = fv.clone();
            v[j] += step;
            Tensor::<2>::from_data(TensorData::new(v, [5, 4]), (&ad, DType::F64))
        };
        for (j, gj) in g.iter().enumerate() {
            let fd = (to_vec_f64(&loss(at(j, h)))[0] - to_vec_f64(&loss(at(j, -h)))[0]) / (2.0 * h);
            assert!((fd - gj).abs() < 1e-6 * (1.0 + fd.abs()), "{backend} d/df[{j}]: {gj} vs {fd}");
        }
    }
}

/// `c1 u - e^u (c2 s + rate)` summed over the precision columns, from ordinary operations.
fn plain_precision_terms(x: Tensor<2>, start: usize, stats: Tensor<2>, c1: &[f64], c2: &[f64], rate: f64) -> Tensor<2> {
    let device = x.device();
    let row =
        |c: &[f64]| Tensor::<2>::from_data(TensorData::new(c.to_vec(), [1, c.len()]).convert_dtype(x.dtype()), &device);
    let u = x.clone().narrow(1, start, c1.len());
    (u.clone() * row(c1) - u.exp() * (stats * row(c2)).add_scalar(rate)).sum_dim(1)
}

#[test]
fn fused_precision_terms_equal_plain_ops_and_finite_differences() {
    let (c1, c2, rate) = ([26.5, 4.0], [2.25, 0.5], 0.1);
    for (backend, device) in backends() {
        let tol = if backend == BackendKind::Wgpu { 1e-4 } else { 1e-5 };
        let ad = device.autodiff();
        // Log-precisions of order one, positive statistics: the regime of a BNN's terms.
        let x = normal([5, 9], 9, DType::F32, &ad).mul_scalar(0.5);
        let stats = normal([5, 2], 10, DType::F32, &ad).abs();
        let w = normal([5, 1], 11, DType::F32, &ad);
        let fused = value_and_grad2(x.clone(), stats.clone(), |x, s| {
            weighted(log_precision_terms(x, 6, s, &c1, &c2, rate), w.clone())
        })
        .unwrap();
        let plain =
            value_and_grad2(x, stats, |x, s| weighted(plain_precision_terms(x, 6, s, &c1, &c2, rate), w.clone()))
                .unwrap();
        for (what, a, b) in [
            ("value", to_vec_f64(&fused.0), to_vec_f64(&plain.0)),
            ("particle gradient", to_vec_f64(&fused.1), to_vec_f64(&plain.1)),
            ("statistics gradient", to_vec_f64(&fused.2), to_vec_f64(&plain.2)),
        ] {
            let err = max_rel_err(&a, &b);
            assert!(err < tol, "{backend} precision terms: {what} differs by {err}");
        }
    }
    let h = 1e-6;
    for backend in [BackendKind::Flex, BackendKind::Ndarray] {
        let ad = backend.device().unwrap().autodiff();
        let x = normal([3, 5], 12, DType::F64, &ad).mul_scalar(0.5);
        let stats = normal([3, 2], 13, DType::F64, &ad).abs();
        let loss = |x: Tensor<2>, s: Tensor<2>| log_precision_terms(x, 3, s, &c1, &c2, rate).sum().reshape([1]);
        let (_, gx, gs) = value_and_grad2(x.clone(), stats.clone(), loss).unwrap();
        for (values, grads, which) in [(to_vec_f64(&x), to_vec_f64(&gx), 0), (to_vec_f64(&stats), to_vec_f64(&gs), 1)] {
            let shape = if which == 0 { [3, 5] } else { [3, 2] };
            let at = |j: usize, step: f64| {
                let mut v = values.clone();
                v[j] += step;
                Tensor::<2>::from_data(TensorData::new(v, shape), (&ad, DType::F64))
            };
            for (j, gj) in grads.iter().enumerate() {
                let (plus, minus) = if which == 0 {
                    (loss(at(j, h), stats.clone()), loss(at(j, -h), stats.clone()))
                } else {
                    (loss(x.clone(), at(j, h)), loss(x.clone(), at(j, -h)))
                };
                let fd = (to_vec_f64(&plus)[0] - to_vec_f64(&minus)[0]) / (2.0 * h);
                assert!((fd - gj).abs() < 1e-6 * (1.0 + fd.abs()), "{backend} input {which} [{j}]: {gj} vs {fd}");
            }
        }
    }
}

/// The normal log-density's terms, `-((x - loc) / scale)^2 / 2 - ln scale - ln(2 pi) / 2`, from
/// ordinary operations.
fn plain_normal(x: Tensor<2>, loc: Tensor<2>, scale: Tensor<2>) -> Tensor<2> {
    let z = (x - loc) / scale.clone();
    z.square().mul_scalar(-0.5) - scale.log() - 0.5 * (2.0 * std::f64::consts::PI).ln()
}

/// The fused normal log-density, over shapes broadcast every way a model meets them (data `y`
/// `[1, k]` against per-particle `mu` `[n, k]` and `sigma` `[n, 1]`; per-particle `x` against a
/// shared location and per-column scales), equals the plain expression in value and in the
/// gradients of all three inputs (each summed back over its broadcast dimensions), on every
/// backend; an input on the plain device (data) is a constant. A gradient of the wrong sign or
/// scale, or one not summed back to its input's shape, fails it.
#[test]
fn fused_normal_log_density_equals_plain_ops_on_every_backend() {
    let shapes = [([1, 7], [5, 7], [5, 1]), ([5, 7], [1, 1], [1, 7]), ([5, 7], [5, 7], [5, 7])];
    for (backend, device) in backends() {
        let tol = if backend == BackendKind::Wgpu { 1e-4 } else { 1e-5 };
        let ad = device.clone().autodiff();
        for (k, (xs, ls, ss)) in shapes.into_iter().enumerate() {
            let seed = 10 * k as u64;
            let x = normal(xs, seed, DType::F32, &ad);
            let loc = normal(ls, seed + 1, DType::F32, &ad);
            let scale = normal(ss, seed + 2, DType::F32, &ad).mul_scalar(0.5).exp();
            let w = normal([5, 7], seed + 3, DType::F32, &ad);
            let total = |out: Tensor<2>| (out * w.clone()).sum_dim(1).reshape([5]);
            // Gradients of x and loc, then of loc and scale.
            let fused = value_and_grad2(x.clone(), loc.clone(), |x, l| total(normal_log_density(x, l, scale.clone())));
            let plain = value_and_grad2(x.clone(), loc.clone(), |x, l| total(plain_normal(x, l, scale.clone())));
            let (fused, plain) = (fused.unwrap(), plain.unwrap());
            let fused_s = value_and_grad(scale.clone(), |s| total(normal_log_density(x.clone(), loc.clone(), s)));
            let plain_s = value_and_grad(scale.clone(), |s| total(plain_normal(x.clone(), loc.clone(), s)));
            let (fused_s, plain_s) = (fused_s.unwrap(), plain_s.unwrap());
            for (what, a, b) in [
                ("value", to_vec_f64(&fused.0), to_vec_f64(&plain.0)),
                ("x gradient", to_vec_f64(&fused.1), to_vec_f64(&plain.1)),
                ("loc gradient", to_vec_f64(&fused.2), to_vec_f64(&plain.2)),
                ("scale gradient", to_vec_f64(&fused_s.1), to_vec_f64(&plain_s.1)),
            ] {
                let err = max_rel_err(&a, &b);
                assert!(err < tol, "{backend} shapes {xs:?} {ls:?} {ss:?}: {what} differs by {err}");
            }
            assert_eq!(fused_s.1.dims(), ss, "{backend}: the scale's gradient has its shape");
        }
        // Data on the plain device beside parameters under autodiff: a constant.
        let y = normal([1, 7], 90, DType::F32, &device);
        let mu = normal([5, 7], 91, DType::F32, &ad);
        let sigma = normal([5, 1], 92, DType::F32, &ad).exp();
        let fused = value_and_grad2(mu.clone(), sigma.clone(), |m, s| {
            normal_log_density(y.clone(), m, s).sum_dim(1).reshape([5])
        });
        let plain = value_and_grad2(mu, sigma, |m, s| plain_normal(y.clone(), m, s).sum_dim(1).reshape([5]));
        let (fused, plain) = (fused.unwrap(), plain.unwrap());
        for (what, a, b) in [
            ("value", to_vec_f64(&fused.0), to_vec_f64(&plain.0)),
            ("mu gradient", to_vec_f64(&fused.1), to_vec_f64(&plain.1)),
            ("sigma gradient", to_vec_f64(&fused.2), to_vec_f64(&plain.2)),
        ] {
            let err = max_rel_err(&a, &b);
            assert!(err < tol, "{backend} data beside parameters: {what} differs by {err}");
        }
    }
}

/// The fused normal log-density's gradients against central finite differences in `f64`.
#[test]
fn fused_normal_log_density_gradients_match_finite_differences() {
    let h = 1e-6;
    for backend in [BackendKind::Flex, BackendKind::Ndarray] {
        let ad = backend.device().unwrap().autodiff();
        let x = normal([1, 4], 1, DType::F64, &ad);
        let loc = normal([3, 4], 2, DType::F64, &ad);
        let scale = normal([3, 1], 3, DType::F64, &ad).exp();
        let f = |l: Tensor<2>, s: Tensor<2>| normal_log_density(x.clone(), l, s).sum_dim(1).reshape([3]);
        let (_, gl, gs) = value_and_grad2(loc.clone(), scale.clone(), f).unwrap();
        let sum = |l: Tensor<2>, s: Tensor<2>| to_vec_f64(&f(l, s)).iter().sum::<f64>();
        let (gl, gs) = (to_vec_f64(&gl), to_vec_f64(&gs));
        let lv = to_vec_f64(&loc);
        for (i, g) in gl.iter().enumerate() {
            let bump = |d: f64| {
                let mut v = lv.clone();
                v[i] += d;
                Tensor::from_data(TensorData::new(v, [3, 4]), (&ad, DType::F64))
            };
            let fd = (sum(bump(h), scale.clone()) - sum(bump(-h), scale.clone())) / (2.0 * h);
            assert!((fd - g).abs() < 1e-6 * (1.0 + fd.abs()), "{backend} loc {i}: {g} vs {fd}");
        }
        let sv = to_vec_f64(&scale);
        for (i, g) in gs.iter().enumerate() {
            let bump = |d: f64| {
                let mut v = sv.clone();
                v[i] += d;
                Tensor::from_data(TensorData::new(v, [3, 1]), (&ad, DType::F64))
            };
            let fd = (sum(loc.clone(), bump(h)) - sum(loc.clone(), bump(-h))) / (2.0 * h);
            assert!((fd - g).abs() < 1e-6 * (1.0 + fd.abs()), "{backend} scale {i}: {g} vs {fd}");
        }
    }
}

/// Each scalar-parameter density, fused, equals its elementwise expression in value and
/// gradient on every backend (positive draws for the positive densities); the Poisson terms
/// too, with data counts beside a tracked log rate. A wrong derivative for any one fails it.
#[test]
fn fused_scalar_densities_and_poisson_terms_equal_plain_ops_on_every_backend() {
    let ln_2pi = (2.0 * std::f64::consts::PI).ln();
    for (backend, device) in backends() {
        let tol = if backend == BackendKind::Wgpu { 1e-4 } else { 1e-5 };
        let ad = device.clone().autodiff();
        let x = normal([4, 6], 7, DType::F32, &ad);
        let positive = x.clone().mul_scalar(0.7).exp();
        let w = normal([4, 6], 8, DType::F32, &ad);
        let total = |out: Tensor<2>| (out * w.clone()).sum_dim(1).reshape([4]);
        type Plain = Box<dyn Fn(Tensor<2>) -> Tensor<2>>;
        let cases: Vec<(ScalarDensity, bool, Plain)> = vec![
            (
                ScalarDensity::Normal { loc: 0.3, scale: 1.7 },
                false,
                Box::new(move |x| {
                    ((x.sub_scalar(0.3)) / 1.7).square().mul_scalar(-0.5).sub_scalar(1.7f64.ln() + 0.5 * ln_2pi)
                }),
            ),
            (
                ScalarDensity::Gamma { shape: 2.5, rate: 1.5, log_norm: -0.4 },
                true,
                Box::new(|x| x.clone().log().mul_scalar(1.5) - x.mul_scalar(1.5) + (-0.4)),
            ),
            (
                ScalarDensity::InvGamma { shape: 1.2, scale: 0.8, log_norm: 0.1 },
                true,
                Box::new(|x| x.clone().log().mul_scalar(-2.2) - x.recip().mul_scalar(0.8) + 0.1),
            ),
            (
                ScalarDensity::StudentT { df: 3.0, loc: -0.5, scale: 2.0, log_norm: -1.1 },
                false,
                Box::new(|x| {
                    (x.add_scalar(0.5).div_scalar(2.0).square().div_scalar(3.0)).log1p().mul_scalar(-2.0)
                        + (-1.1 - 2f64.ln())
                }),
            ),
        ];
        for (density, pos, plain) in cases {
            let at = if pos { positive.clone() } else { x.clone() };
            let (vf, gf) = value_and_grad(at.clone(), |x| total(scalar_log_density(x, density.clone()))).unwrap();
            let (vp, gp) = value_and_grad(at, |x| total(plain(x))).unwrap();
            let (ev, eg) =
                (max_rel_err(&to_vec_f64(&vf), &to_vec_f64(&vp)), max_rel_err(&to_vec_f64(&gf), &to_vec_f64(&gp)));
            assert!(ev < tol && eg < tol, "{backend} {density:?}: value {ev}, gradient {eg}");
        }
        let k = normal([1, 6], 9, DType::F32, &device).abs().mul_scalar(3.0).round();
        let ln_factorial = (k.clone() + 1.0).to_data().convert::<f64>().try_to_vec::<f64>().unwrap();
        let ln_factorial: Vec<f64> =
            ln_factorial.iter().map(|&v| (1..v as u64).map(|i| (i as f64).ln()).sum()).collect();
        let ln_factorial = Tensor::<2>::from_data(
            TensorData::new(ln_factorial, [1, 6]).convert_dtype(DType::F32),
            (&device, DType::F32),
        );
        let f = normal([4, 6], 10, DType::F32, &ad);
        let (vf, gf) =
            value_and_grad(f.clone(), |f| total(poisson_log_terms(k.clone(), f, ln_factorial.clone()))).unwrap();
        let (vp, gp) = value_and_grad(f, |f| total(k.clone() * f.clone() - f.exp() - ln_factorial.clone())).unwrap();
        let (ev, eg) =
            (max_rel_err(&to_vec_f64(&vf), &to_vec_f64(&vp)), max_rel_err(&to_vec_f64(&gf), &to_vec_f64(&gp)));
        assert!(ev < tol && eg < tol, "{backend} poisson_log: value {ev}, gradient {eg}");
    }
}
