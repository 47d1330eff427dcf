//! The batched Cholesky, triangular solve, log-determinant, squared-exponential covariance and
//! multivariate normal against independent `f64` evaluations written here; their gradients
//! against central finite differences of those `f64` evaluations; non-positive-definite input
//! reported; the new factorisation equal to the old tensor-op one; the same values on flex
//! (native loops and primitive ops), ndarray and wgpu.

use parvi_model::burn::tensor::{DType, Device, Tensor, TensorData};
use parvi_model::linalg::{
    Triangle, batched_cholesky, cholesky, cholesky_checked, exp_quad_cov, log_det_from_cholesky, set_generic_on_flex,
    triangular_solve,
};
use parvi_model::mvn::MultiNormalCholesky;
use parvi_model::{BackendKind, ModelError, value_and_grad, value_and_grad2};
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};

// ---------------------------------------------------------------- f64 reference, plain Rust

/// Row-major `k x k` matrices.
type Mat = Vec<f64>;

fn chol(a: &[f64], k: usize) -> Mat {
    let mut l = vec![0.0; k * k];
    for j in 0..k {
        let s: f64 = (0..j).map(|p| l[j * k + p] * l[j * k + p]).sum();
        let d = (a[j * k + j] - s).sqrt();
        l[j * k + j] = d;
        for i in j + 1..k {
            let s: f64 = (0..j).map(|p| l[i * k + p] * l[j * k + p]).sum();
            l[i * k + j] = (a[i * k + j] - s) / d;
        }
    }
    l
}

/// `T X = B` (`T^T X = B` when `transpose`) for `T` the lower/upper triangle of `t`, `b` `k x c`.
fn tri_solve(t: &[f64], b: &[f64], k: usize, c: usize, lower: bool, transpose: bool) -> Mat {
    // The effective matrix, explicitly.
    let mut e = vec![0.0; k * k];
    for i in 0..k {
        for j in 0..k {
            let keep = if lower { i >= j } else { i <= j };
            if keep {
                if transpose {
                    e[j * k + i] = t[i * k + j];
                } else {
                    e[i * k + j] = t[i * k + j];
                }
            }
        }
    }
    let eff_lower = lower != transpose;
    let mut x = b.to_vec();
    let order: Vec<usize> = if eff_lower { (0..k).collect() } else { (0..k).rev().collect() };
    for i in order {
        for col in 0..c {
            let mut s = b[i * c + col];
            for r in 0..k {
                if r != i && e[i * k + r] != 0.0 {
                    s -= e[i * k + r] * x[r * c + col];
                }
            }
            x[i * c + col] = s / e[i * k + i];
        }
    }
    x
}

/// `B B^T + shift I`.
fn spd_from(b: &[f64], k: usize, shift: f64) -> Mat {
    let mut a = vec![0.0; k * k];
    for i in 0..k {
        for j in 0..k {
            a[i * k + j] = (0..k).map(|p| b[i * k + p] * b[j * k + p]).sum::<f64>() + if i == j { shift } else { 0.0 };
        }
    }
    a
}

fn mvn_lpdf(y: &[f64], mu: &[f64], a: &[f64], k: usize) -> f64 {
    let l = chol(a, k);
    let r: Vec<f64> = y.iter().zip(mu).map(|(y, m)| y - m).collect();
    let z = tri_solve(&l, &r, k, 1, true, false);
    let log_det: f64 = (0..k).map(|i| l[i * k + i].ln()).sum();
    -0.5 * k as f64 * (2.0 * std::f64::consts::PI).ln() - log_det - 0.5 * z.iter().map(|v| v * v).sum::<f64>()
}

// ---------------------------------------------------------------- helpers

fn flex() -> Device {
    BackendKind::Flex.device().unwrap()
}

fn values(len: usize, seed: u64) -> Vec<f64> {
    let mut rng = chacha20::ChaCha8Rng::seed_from_u64(seed);
    (0..len).map(|_| StandardNormal.sample(&mut rng)).collect()
}

fn tensor<const D: usize>(v: &[f64], shape: [usize; D], dtype: DType, device: &Device) -> Tensor<D> {
    Tensor::from_data(TensorData::new(v.to_vec(), shape).convert_dtype(dtype), (device, dtype))
}

fn host<const D: usize>(t: &Tensor<D>) -> Vec<f64> {
    t.to_data().convert::<f64>().try_into_vec::<f64>().unwrap()
}

fn max_rel_err(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(a, b)| (a - b).abs() / (1.0 + b.abs())).fold(0.0, f64::max)
}

/// `n` SPD matrices `B B^T + k I / 2` from seeded normal `B`, flattened `[n, k, k]`, with the `B`s.
fn spd_batch(n: usize, k: usize, seed: u64) -> (Vec<f64>, Vec<f64>) {
    let b = values(n * k * k, seed);
    let a = b.chunks(k * k).flat_map(|bi| spd_from(bi, k, 0.5 * k as f64)).collect();
    (a, b)
}

// ---------------------------------------------------------------- values

#[test]
fn cholesky_matches_an_f64_factorisation_and_the_old_tensor_op_one() {
    let device = flex();
    for (n, k) in [(3, 1), (4, 5), (2, 11), (2, 40)] {
        let (a, _) = spd_batch(n, k, 7 + k as u64);
        let expected: Vec<f64> = a.chunks(k * k).flat_map(|ai| chol(ai, k)).collect();
        for dtype in [DType::F32, DType::F64] {
            let tol = if dtype == DType::F32 { 2e-5 } else { 1e-12 };
            let at = tensor(&a, [n, k, k], dtype, &device);
            let (l, pivots) = cholesky(at.clone()).unwrap();
            let err = max_rel_err(&host(&l), &expected);
            assert!(err < tol, "K = {k} {dtype:?}: factor off by {err}");
            // Pivots are the squared diagonal.
            let diag_sq: Vec<f64> = expected
                .chunks(k * k)
                .map(|li| (0..k).map(|i| li[i * k + i] * li[i * k + i]).fold(f64::INFINITY, f64::min))
                .collect();
            assert!(max_rel_err(&host(&pivots), &diag_sq) < 1e3 * tol, "K = {k} pivots");
            // The old column-by-column factor (now routed here) and the primitive-op body.
            let (old, min_pivot) = batched_cholesky(at.clone());
            assert!(max_rel_err(&host(&old), &expected) < tol);
            assert!((host(&min_pivot)[0] - diag_sq.iter().cloned().fold(f64::INFINITY, f64::min)).abs() < 1e3 * tol);
            set_generic_on_flex(true);
            let (generic, _) = cholesky(at).unwrap();
            set_generic_on_flex(false);
            assert!(max_rel_err(&host(&generic), &expected) < tol, "K = {k} primitive-op body");
        }
    }
}

#[test]
fn triangular_solves_match_f64_substitution_in_every_orientation() {
    let device = flex();
    let (n, k, c) = (3, 7, 4);
    // Well-conditioned triangles: a dominant diagonal, junk in the ignored triangle.
    let mut t = values(n * k * k, 11);
    for m in 0..n {
        for i in 0..k {
            t[m * k * k + i * k + i] = 3.0 + t[m * k * k + i * k + i].abs();
        }
    }
    let b = values(n * k * c, 12);
    for generic in [false, true] {
        set_generic_on_flex(generic);
        for (triangle, lower) in [(Triangle::Lower, true), (Triangle::Upper, false)] {
            for transpose in [false, true] {
                let expected: Vec<f64> = t
                    .chunks(k * k)
                    .zip(b.chunks(k * c))
                    .flat_map(|(ti, bi)| tri_solve(ti, bi, k, c, lower, transpose))
                    .collect();
                for dtype in [DType::F32, DType::F64] {
                    let tol = if dtype == DType::F32 { 1e-5 } else { 1e-12 };
                    let x = triangular_solve(
                        tensor(&t, [n, k, k], dtype, &device),
                        tensor(&b, [n, k, c], dtype, &device),
                        triangle,
                        transpose,
                    )
                    .unwrap();
                    let err = max_rel_err(&host(&x), &expected);
                    assert!(err < tol, "{triangle:?} transpose {transpose} {dtype:?} generic {generic}: {err}");
                }
            }
        }
        set_generic_on_flex(false);
    }
    // A shared right-hand side (batch of one) is broadcast to the matrices.
    let x = triangular_solve(
        tensor(&t, [n, k, k], DType::F64, &device),
        tensor(&b[..k * c], [1, k, c], DType::F64, &device),
        Triangle::Lower,
        false,
    )
    .unwrap();
    let expected: Vec<f64> = t.chunks(k * k).flat_map(|ti| tri_solve(ti, &b[..k * c], k, c, true, false)).collect();
    assert!(max_rel_err(&host(&x), &expected) < 1e-12);
}

#[test]
fn log_det_and_exp_quad_cov_match_f64() {
    let device = flex();
    let (n, k) = (3, 6);
    let (a, _) = spd_batch(n, k, 21);
    let l = cholesky(tensor(&a, [n, k, k], DType::F64, &device)).unwrap().0;
    let got = host(&log_det_from_cholesky(l));
    for (m, ai) in a.chunks(k * k).enumerate() {
        let lf = chol(ai, k);
        let expected: f64 = 2.0 * (0..k).map(|i| lf[i * k + i].ln()).sum::<f64>();
        assert!((got[m] - expected).abs() < 1e-12, "{} vs {expected}", got[m]);
    }

    // gp_exp_quad_cov on 1-D and 2-D points.
    let (alpha, rho) = ([0.7, 1.5], [0.4, 2.3]);
    let at = tensor(&alpha, [2, 1], DType::F64, &device);
    let rt = tensor(&rho, [2, 1], DType::F64, &device);
    for d in [1, 3] {
        let points = 5;
        let x = values(points * d, 30 + d as u64);
        let cov = if d == 1 {
            exp_quad_cov(tensor(&x, [points], DType::F64, &device), at.clone(), rt.clone()).unwrap()
        } else {
            exp_quad_cov(tensor(&x, [points, d], DType::F64, &device), at.clone(), rt.clone()).unwrap()
        };
        assert_eq!(cov.dims(), [2, points, points]);
        let got = host(&cov);
        for (p, (&al, &rh)) in alpha.iter().zip(&rho).enumerate() {
            for i in 0..points {
                for j in 0..points {
                    let sq: f64 = (0..d).map(|c| (x[i * d + c] - x[j * d + c]).powi(2)).sum();
                    let expected = al * al * (-sq / (2.0 * rh * rh)).exp();
                    let v = got[p * points * points + i * points + j];
                    assert!((v - expected).abs() < 1e-14, "particle {p} ({i}, {j}): {v} vs {expected}");
                }
            }
        }
    }
    let bad = exp_quad_cov(tensor(&[0.0; 8], [2, 2, 2], DType::F64, &device), at.clone(), rt);
    assert!(matches!(bad, Err(ModelError::InvalidParameter { name: "x", .. })), "{bad:?}");
    let bad =
        exp_quad_cov(tensor(&[0.0; 3], [3], DType::F64, &device), at, tensor(&[1.0; 3], [3, 1], DType::F64, &device));
    assert!(matches!(bad, Err(ModelError::InvalidParameter { name: "rho", .. })), "{bad:?}");
}

#[test]
fn multi_normal_cholesky_matches_the_f64_density() {
    let device = flex();
    let (n, k, m) = (4, 5, 3);
    let (a, _) = spd_batch(n, k, 41);
    let mu = values(n * k, 42);
    let y = values(n * k, 43);
    let data = values(m * k, 44);
    for dtype in [DType::F32, DType::F64] {
        let tol = if dtype == DType::F32 { 1e-5 } else { 1e-12 };
        let l = cholesky(tensor(&a, [n, k, k], dtype, &device)).unwrap().0;
        let mvn = MultiNormalCholesky::new(Some(tensor(&mu, [n, k], dtype, &device)), l.clone()).unwrap();
        // One vector per particle.
        let got = host(&mvn.log_prob(tensor(&y, [n, k], dtype, &device)).unwrap());
        let expected: Vec<f64> =
            (0..n).map(|p| mvn_lpdf(&y[p * k..][..k], &mu[p * k..][..k], &a[p * k * k..][..k * k], k)).collect();
        assert!(max_rel_err(&got, &expected) < tol, "{dtype:?}: {got:?} vs {expected:?}");
        // Rows of data shared by the particles, summed.
        let got = host(&mvn.log_prob_data(tensor(&data, [m, k], dtype, &device)).unwrap());
        let expected: Vec<f64> = (0..n)
            .map(|p| {
                (0..m).map(|r| mvn_lpdf(&data[r * k..][..k], &mu[p * k..][..k], &a[p * k * k..][..k * k], k)).sum()
            })
            .collect();
        assert!(max_rel_err(&got, &expected) < tol, "{dtype:?} data: {got:?} vs {expected:?}");
        // Zero mean.
        let zero = MultiNormalCholesky::new(None, l).unwrap();
        let got = host(&zero.log_prob_data(tensor(&data[..k], [1, k], dtype, &device)).unwrap());
        let expected: Vec<f64> = (0..n).map(|p| mvn_lpdf(&data[..k], &[0.0; 5], &a[p * k * k..][..k * k], k)).collect();
        assert!(max_rel_err(&got, &expected) < tol, "{dtype:?} zero mean");
    }
    // Shapes are checked.
    let l = tensor(&a, [n, k, k], DType::F64, &device);
    let bad = MultiNormalCholesky::new(Some(tensor(&mu[..n * 4], [n, 4], DType::F64, &device)), l.clone());
    assert!(matches!(bad, Err(ModelError::InvalidParameter { name: "mu", .. })));
    let mvn = MultiNormalCholesky::new(None, l).unwrap();
    assert!(matches!(
        mvn.log_prob(tensor(&y[..3 * k], [3, k], DType::F64, &device)),
        Err(ModelError::InvalidParameter { name: "y", .. })
    ));
}

// ---------------------------------------------------------------- non-positive-definite input

#[test]
fn a_matrix_that_is_not_positive_definite_is_reported() {
    let device = flex();
    // Batch: SPD, indefinite [[1, 2], [2, 1]], singular (all ones), NaN.
    let a = [2.0, 0.5, 0.5, 1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, f64::NAN, f64::NAN, 1.0];
    for dtype in [DType::F32, DType::F64] {
        for generic in [false, true] {
            set_generic_on_flex(generic);
            let at = tensor(&a, [4, 2, 2], dtype, &device);
            let (l, pivots) = cholesky(at.clone()).unwrap();
            let p = host(&pivots);
            assert!((p[0] - 0.875).abs() < 1e-6, "SPD: pivots 2 and 1 - 1/8, got {}", p[0]);
            assert!((p[1] + 3.0).abs() < 1e-5, "indefinite: pivot 1 - 4 = -3, got {}", p[1]);
            assert!(p[2].abs() < 1e-6, "singular: pivot 0, got {}", p[2]);
            assert!(p[3].is_nan(), "NaN entries give a NaN pivot, got {}", p[3]);
            // The factor of the first three stays finite.
            assert!(host(&l)[..12].iter().all(|v| v.is_finite()), "{dtype:?} generic {generic}");
            let err = cholesky_checked(at, "K").unwrap_err();
            assert!(err.to_string().contains("matrix 1") && err.to_string().contains("`K`"), "{err}");
            set_generic_on_flex(false);
        }
    }
    let err = cholesky(tensor(&[1.0; 6], [1, 2, 3], DType::F32, &device)).unwrap_err();
    assert!(err.to_string().contains("square"), "{err}");
}

// ---------------------------------------------------------------- gradients

/// The scalar the gradient tests differentiate, in `f64` on the host, from `B` (`n` matrices
/// `k x k`) and `v` (`n` blocks `k x c`): per matrix with `A = B B^T + s I`, `L = chol(A)`,
/// `log det A + |L^-1 v|^2 + <W, L> + |L^-T v|^2 + log N(y | v[:, 0], L)`.
fn f64_objective(b: &[f64], v: &[f64], w: &[f64], y: &[f64], n: usize, k: usize, c: usize) -> f64 {
    let s = 0.5 * k as f64;
    let mut total = 0.0;
    for p in 0..n {
        let a = spd_from(&b[p * k * k..][..k * k], k, s);
        let l = chol(&a, k);
        let vp = &v[p * k * c..][..k * c];
        let log_det: f64 = 2.0 * (0..k).map(|i| l[i * k + i].ln()).sum::<f64>();
        let z = tri_solve(&l, vp, k, c, true, false);
        let zt = tri_solve(&l, vp, k, c, true, true);
        let lin: f64 = l.iter().zip(&w[p * k * k..][..k * k]).map(|(a, b)| a * b).sum();
        let mu: Vec<f64> = (0..k).map(|i| vp[i * c]).collect();
        total += log_det
            + z.iter().map(|x| x * x).sum::<f64>()
            + lin
            + zt.iter().map(|x| x * x).sum::<f64>()
            + mvn_lpdf(&y[p * k..][..k], &mu, &a, k);
    }
    total
}

/// The same scalar from the tensor operations under test, per particle.
fn tensor_objective(b: Tensor<3>, v: Tensor<3>, w: Tensor<3>, y: Tensor<2>) -> Tensor<1> {
    let [n, k, _] = b.dims();
    let eye = Tensor::<2>::eye(k, &b.device()).cast(DType::F64).unsqueeze::<3>();
    let a = b.clone().matmul(b.swap_dims(1, 2)) + eye.mul_scalar(0.5 * k as f64);
    let (l, _) = cholesky(a).unwrap();
    let z = triangular_solve(l.clone(), v.clone(), Triangle::Lower, false).unwrap();
    let zt = triangular_solve(l.clone(), v.clone(), Triangle::Lower, true).unwrap();
    let sq = |t: Tensor<3>| t.square().sum_dim(2).sum_dim(1).reshape([n]);
    let lin = sq_free(l.clone() * w);
    let mu = v.narrow(2, 0, 1).reshape([n, k]);
    let lp = MultiNormalCholesky::new(Some(mu), l.clone()).unwrap().log_prob(y).unwrap();
    log_det_from_cholesky(l) + sq(z) + lin + sq(zt) + lp
}

fn sq_free(t: Tensor<3>) -> Tensor<1> {
    let [n, _, _] = t.dims();
    t.sum_dim(2).sum_dim(1).reshape([n])
}

#[test]
fn gradients_match_finite_differences_of_the_f64_evaluation() {
    let device = flex();
    let (n, k, c) = (2, 4, 3);
    let b = values(n * k * k, 51);
    let v = values(n * k * c, 52);
    let w = values(n * k * k, 53);
    let y = values(n * k, 54);
    for generic in [false, true] {
        set_generic_on_flex(generic);
        let wt = tensor(&w, [n, k, k], DType::F64, &device.clone().autodiff());
        // Data on the plain device (the MVN mixes it with tracked parameters).
        let yt = tensor(&y, [n, k], DType::F64, &device);
        let (value, gb, gv) = value_and_grad2(
            tensor(&b, [n, k, k], DType::F64, &device),
            tensor(&v, [n, k, c], DType::F64, &device),
            |b, v| tensor_objective(b, v, wt.clone(), yt.clone()),
        )
        .unwrap();
        set_generic_on_flex(false);
        let total: f64 = host(&value).iter().sum();
        let expected = f64_objective(&b, &v, &w, &y, n, k, c);
        assert!((total - expected).abs() < 1e-10 * (1.0 + expected.abs()), "{total} vs {expected}");
        // Central differences, step 1e-6: truncation and rounding errors near 1e-9.
        let h = 1e-6;
        let fd = |x: &[f64], which: usize| -> Vec<f64> {
            (0..x.len())
                .map(|i| {
                    let (mut up, mut down) = (x.to_vec(), x.to_vec());
                    up[i] += h;
                    down[i] -= h;
                    let f = |z: &[f64]| {
                        if which == 0 {
                            f64_objective(z, &v, &w, &y, n, k, c)
                        } else {
                            f64_objective(&b, z, &w, &y, n, k, c)
                        }
                    };
                    (f(&up) - f(&down)) / (2.0 * h)
                })
                .collect()
        };
        let (eb, ev) = (max_rel_err(&host(&gb), &fd(&b, 0)), max_rel_err(&host(&gv), &fd(&v, 1)));
        assert!(eb < 1e-6 && ev < 1e-6, "generic {generic}: gradient in B off by {eb}, in v by {ev}");
    }
}

#[test]
fn exp_quad_cov_gradients_match_finite_differences() {
    let device = flex();
    let (points, d) = (6, 2);
    let x = values(points * d, 61);
    // Data on the plain device, parameters on its autodiff twin, as in a model.
    let xt = tensor(&x, [points, d], DType::F64, &device);
    let params = [0.8, 1.3, 1.7, 0.6]; // alpha, rho for two particles
    let f64_value = |alpha: f64, rho: f64| -> f64 {
        // log det of (K + I) via the f64 Cholesky: a GP marginal-likelihood-like scalar.
        let mut a = vec![0.0; points * points];
        for i in 0..points {
            for j in 0..points {
                let sq: f64 = (0..d).map(|c| (x[i * d + c] - x[j * d + c]).powi(2)).sum();
                a[i * points + j] = alpha * alpha * (-sq / (2.0 * rho * rho)).exp() + if i == j { 1.0 } else { 0.0 };
            }
        }
        let l = chol(&a, points);
        2.0 * (0..points).map(|i| l[i * points + i].ln()).sum::<f64>()
    };
    let (_, g) = value_and_grad(tensor(&params, [2, 2], DType::F64, &device), |p| {
        let (alpha, rho) = (p.clone().narrow(1, 0, 1), p.narrow(1, 1, 1));
        let cov = exp_quad_cov(xt.clone(), alpha, rho).unwrap();
        let eye = Tensor::<2>::eye(points, &cov.device()).cast(DType::F64).unsqueeze::<3>();
        log_det_from_cholesky(cholesky(cov + eye).unwrap().0)
    })
    .unwrap();
    let g = host(&g);
    let h = 1e-6;
    for p in 0..2 {
        let (al, rh) = (params[2 * p], params[2 * p + 1]);
        let da = (f64_value(al + h, rh) - f64_value(al - h, rh)) / (2.0 * h);
        let dr = (f64_value(al, rh + h) - f64_value(al, rh - h)) / (2.0 * h);
        assert!((g[2 * p] - da).abs() < 1e-7 && (g[2 * p + 1] - dr).abs() < 1e-7, "{g:?} vs {da} {dr}");
    }
}

// ---------------------------------------------------------------- backends

/// flex and ndarray always; wgpu when it has an adapter.
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

#[test]
fn every_backend_gives_the_same_factor_solve_and_gradient() {
    let (n, k, c) = (3, 6, 2);
    let (a, b) = spd_batch(n, k, 71);
    let v = values(n * k * c, 72);
    let expected_l: Vec<f64> = a.chunks(k * k).flat_map(|ai| chol(ai, k)).collect();
    let mut reference_grad: Option<Vec<f64>> = None;
    for (backend, device) in backends() {
        let tol = if backend == BackendKind::Wgpu { 1e-4 } else { 2e-5 };
        let l = cholesky(tensor(&a, [n, k, k], DType::F32, &device)).unwrap().0;
        assert!(max_rel_err(&host(&l), &expected_l) < tol, "{backend} factor");
        let x = triangular_solve(l, tensor(&v, [n, k, c], DType::F32, &device), Triangle::Lower, true).unwrap();
        let expected: Vec<f64> = expected_l
            .chunks(k * k)
            .zip(v.chunks(k * c))
            .flat_map(|(li, vi)| tri_solve(li, vi, k, c, true, true))
            .collect();
        assert!(max_rel_err(&host(&x), &expected) < tol, "{backend} solve");
        // Gradient of log det + |L^-1 v|^2 with respect to B, in f32.
        let vt = tensor(&v, [n, k, c], DType::F32, &device.clone().autodiff());
        let (_, g) = value_and_grad(tensor(&b, [n, k, k], DType::F32, &device), |b| {
            let eye = Tensor::<2>::eye(k, &b.device()).unsqueeze::<3>();
            let a = b.clone().matmul(b.swap_dims(1, 2)) + eye.mul_scalar(0.5 * k as f64);
            let l = cholesky(a).unwrap().0;
            let z = triangular_solve(l.clone(), vt.clone(), Triangle::Lower, false).unwrap();
            log_det_from_cholesky(l) + z.square().sum_dim(2).sum_dim(1).reshape([n])
        })
        .unwrap();
        let g = host(&g);
        match &reference_grad {
            None => reference_grad = Some(g),
            Some(r) => assert!(max_rel_err(&g, r) < 10.0 * tol, "{backend} gradient off by {}", max_rel_err(&g, r)),
        }
    }
}

// ---------------------------------------------------------------- timing (run by hand)

/// ms per forward + backward of `sum(log det L) + sum(L^-1 v)^2` for 100 particles: the old
/// tensor-op factor (autodiff through every column), the new op on primitive-op bodies, and the
/// new op on flex's native loops (the factorisation's reverse pass included), the fastest of
/// several runs. `cargo test ... --test linalg -- --ignored --nocapture --test-threads=1 timing`.
#[test]
#[ignore]
fn timing_forward_and_backward() {
    let device = flex();
    let n = 100;
    for k in [11, 30, 100] {
        let (a, _) = spd_batch(n, k, 81);
        let v = values(n * k, 82);
        let at = tensor(&a, [n, k, k], DType::F32, &device);
        let vt = tensor(&v, [n, k, 1], DType::F32, &device.clone().autodiff());
        let run = |old: bool| {
            let (_, g) = value_and_grad(at.clone(), |a| {
                let l = if old { old_cholesky(a) } else { cholesky(a).unwrap().0 };
                let z = triangular_solve(l.clone(), vt.clone(), Triangle::Lower, false).unwrap();
                log_det_from_cholesky(l) + z.square().sum_dim(2).sum_dim(1).reshape([n])
            })
            .unwrap();
            host(&g.slice([0..1, 0..1, 0..1]));
        };
        let time = |label: &str, old: bool, generic: bool| {
            set_generic_on_flex(generic);
            run(old);
            // The fastest of several runs: the machine is shared, and the minimum is the least
            // disturbed by other processes.
            let reps = if k >= 100 { 5 } else { 20 };
            let ms = (0..reps)
                .map(|_| {
                    let start = std::time::Instant::now();
                    run(old);
                    start.elapsed().as_secs_f64() * 1e3
                })
                .fold(f64::INFINITY, f64::min);
            set_generic_on_flex(false);
            println!("K = {k:3}, n = {n}: {label:<46} {ms:8.2} ms");
        };
        time("old tensor-op factor, autodiff through columns", true, false);
        time("new op, primitive-op bodies, custom backward", false, true);
        time("new op, native flex loops, custom backward", false, false);
    }
}

/// The column-by-column factor as `batched_cholesky` computed it before this op existed.
fn old_cholesky(a: Tensor<3>) -> Tensor<3> {
    let [m, n, _] = a.dims();
    let mut l = Tensor::<3>::zeros([m, n, n], &a.device());
    for j in 0..n {
        let mut column = a.clone().slice([0..m, j..n, j..j + 1]);
        if j > 0 {
            let below = l.clone().slice([0..m, j..n, 0..j]);
            let row = l.clone().slice([0..m, j..j + 1, 0..j]);
            column = column - below.matmul(row.swap_dims(1, 2));
        }
        let pivot = column.clone().slice([0..m, 0..1, 0..1]);
        let root = pivot.clamp_min(f32::MIN_POSITIVE as f64).sqrt();
        l = l.slice_assign([0..m, j..n, j..j + 1], column / root);
    }
    l
}

/// ms per call of the pieces at `K = 100`, 100 particles, no autodiff (native flex bodies, and
/// flex's own batched product for scale).
#[test]
#[ignore]
fn timing_pieces() {
    let device = flex();
    let (n, k) = (100, 100);
    let (a, _) = spd_batch(n, k, 81);
    let at = tensor(&a, [n, k, k], DType::F32, &device);
    let l = cholesky(at.clone()).unwrap().0;
    let v1 = tensor(&values(n * k, 82), [n, k, 1], DType::F32, &device);
    let vk = tensor(&values(n * k * k, 83), [n, k, k], DType::F32, &device);
    let time = |label: &str, f: &dyn Fn() -> Tensor<3>| {
        host(&f().slice([0..1, 0..1, 0..1]));
        let ms = (0..5)
            .map(|_| {
                let start = std::time::Instant::now();
                host(&f().slice([0..1, 0..1, 0..1]));
                start.elapsed().as_secs_f64() * 1e3
            })
            .fold(f64::INFINITY, f64::min);
        println!("{label:<40} {ms:8.2} ms (fastest of 5)");
    };
    time("cholesky", &|| cholesky(at.clone()).unwrap().0);
    time("solve M = 1", &|| triangular_solve(l.clone(), v1.clone(), Triangle::Lower, false).unwrap());
    time("solve M = K", &|| triangular_solve(l.clone(), vk.clone(), Triangle::Lower, false).unwrap());
    time("solve M = K transposed", &|| triangular_solve(l.clone(), vk.clone(), Triangle::Lower, true).unwrap());
    time("matmul", &|| l.clone().matmul(vk.clone()));
}

#[test]
fn a_zero_mean_mvn_on_plain_data_differentiates_through_its_factor() {
    // The solve's right-hand side is untracked data, its matrix a tracked factor.
    let device = flex();
    let (n, k, m) = (2, 3, 4);
    let (_, b) = spd_batch(n, k, 91);
    let data = values(m * k, 92);
    let yt = tensor(&data, [m, k], DType::F64, &device);
    let (value, g) = value_and_grad(tensor(&b, [n, k, k], DType::F64, &device), |b| {
        let eye = Tensor::<2>::eye(k, &b.device()).cast(DType::F64).unsqueeze::<3>();
        let a = b.clone().matmul(b.swap_dims(1, 2)) + eye.mul_scalar(0.5 * k as f64);
        let l = cholesky(a).unwrap().0;
        MultiNormalCholesky::new(None, l).unwrap().log_prob_data(yt.clone()).unwrap()
    })
    .unwrap();
    let f = |b: &[f64]| -> f64 {
        (0..n)
            .map(|p| {
                let a = spd_from(&b[p * k * k..][..k * k], k, 0.5 * k as f64);
                (0..m).map(|r| mvn_lpdf(&data[r * k..][..k], &[0.0; 3], &a, k)).sum::<f64>()
            })
            .sum()
    };
    assert!((host(&value).iter().sum::<f64>() - f(&b)).abs() < 1e-10);
    let h = 1e-6;
    let fd: Vec<f64> = (0..b.len())
        .map(|i| {
            let (mut up, mut down) = (b.clone(), b.clone());
            up[i] += h;
            down[i] -= h;
            (f(&up) - f(&down)) / (2.0 * h)
        })
        .collect();
    let err = max_rel_err(&host(&g), &fd);
    assert!(err < 1e-6, "gradient off by {err}");
}

/// `sum_{p,i,j} w_pij K_pij` for `gp_exp_quad_cov(x, alpha, rho)` in `f64` on the host.
fn weighted_exp_quad(x: &[f64], alpha: &[f64], rho: &[f64], w: &[f64], d: usize) -> f64 {
    let points = x.len() / d;
    let mut total = 0.0;
    for p in 0..alpha.len() {
        for i in 0..points {
            for j in 0..points {
                let sq: f64 = (0..d).map(|c| (x[i * d + c] - x[j * d + c]).powi(2)).sum();
                let k = alpha[p] * alpha[p] * (-sq / (2.0 * rho[p] * rho[p])).exp();
                total += w[(p * points + i) * points + j] * k;
            }
        }
    }
    total
}

#[test]
fn exp_quad_cov_gradients_in_the_points_too_match_finite_differences() {
    // The covariance is one node with its own backward (`linalg/gp.rs`): its gradients in alpha,
    // rho and in the points themselves (inputs a model may sample) against central differences
    // of the f64 host sum, with weights that make every entry count.
    let device = flex().autodiff();
    let (n, points, d) = (2, 4, 2);
    let (alpha, rho) = (vec![0.7, 1.5], vec![0.6, 2.3]);
    let x = values(points * d, 41);
    let w = values(n * points * points, 42);
    let xt = tensor(&x, [points, d], DType::F64, &device).require_grad();
    let at = tensor(&alpha, [n, 1], DType::F64, &device).require_grad();
    let rt = tensor(&rho, [n, 1], DType::F64, &device).require_grad();
    let cov = exp_quad_cov(xt.clone(), at.clone(), rt.clone()).unwrap();
    let grads = (cov * tensor(&w, [n, points, points], DType::F64, &device)).sum().backward();
    let (gx, ga, gr) =
        (host(&xt.grad(&grads).unwrap()), host(&at.grad(&grads).unwrap()), host(&rt.grad(&grads).unwrap()));
    let h = 1e-6;
    let fd = |f: &dyn Fn(f64) -> f64| (f(h) - f(-h)) / (2.0 * h);
    for p in 0..n {
        let da = fd(&|e| {
            let mut a = alpha.clone();
            a[p] += e;
            weighted_exp_quad(&x, &a, &rho, &w, d)
        });
        let dr = fd(&|e| {
            let mut r = rho.clone();
            r[p] += e;
            weighted_exp_quad(&x, &alpha, &r, &w, d)
        });
        assert!((ga[p] - da).abs() < 1e-6 * (1.0 + da.abs()), "d/d alpha[{p}]: {} vs {da}", ga[p]);
        assert!((gr[p] - dr).abs() < 1e-6 * (1.0 + dr.abs()), "d/d rho[{p}]: {} vs {dr}", gr[p]);
    }
    for i in 0..x.len() {
        let dx = fd(&|e| {
            let mut y = x.clone();
            y[i] += e;
            weighted_exp_quad(&y, &alpha, &rho, &w, d)
        });
        assert!((gx[i] - dx).abs() < 1e-6 * (1.0 + dx.abs()), "d/d x[{i}]: {} vs {dx}", gx[i]);
    }
}
