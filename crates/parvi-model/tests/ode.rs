//! The batched ODE solvers against closed forms (values and gradients), an independent `f64`
//! RK4 with tiny steps (Lotka-Volterra), a stiff problem, and every error case.

use parvi_model::BackendKind;
use parvi_model::burn::tensor::{DType, Device, Tensor, TensorData};
use parvi_model::ode::{OdeError, OdeOptions, ode_rk45, ode_stiff};
use parvi_model::value_and_grad2;

fn flex() -> Device {
    BackendKind::Flex.device().unwrap()
}

fn tensor(values: Vec<f64>, shape: [usize; 2], dtype: DType, device: &Device) -> Tensor<2> {
    Tensor::from_data(TensorData::new(values, shape), (device, dtype))
}

fn host<const D: usize>(t: &Tensor<D>) -> Vec<f64> {
    t.to_data().convert::<f64>().try_into_vec::<f64>().unwrap()
}

/// `y' = -theta y`: `y0 exp(-theta t)`.
fn decay(_t: f64, y: Tensor<2>, theta: &Tensor<2>) -> Tensor<2> {
    -(y * theta.clone())
}

/// `y1' = y2, y2' = -omega^2 y1`.
fn oscillator(_t: f64, y: Tensor<2>, theta: &Tensor<2>) -> Tensor<2> {
    let y1 = y.clone().narrow(1, 0, 1);
    let y2 = y.narrow(1, 1, 1);
    Tensor::cat(vec![y2, -(y1 * theta.clone().square())], 1)
}

/// Lotka-Volterra as in posteriordb's `lotka_volterra` (theta = alpha, beta, gamma, delta).
fn lotka_volterra(_t: f64, z: Tensor<2>, theta: &Tensor<2>) -> Tensor<2> {
    let (u, v) = (z.clone().narrow(1, 0, 1), z.narrow(1, 1, 1));
    let p = |j| theta.clone().narrow(1, j, 1);
    let du = (p(0) - p(1) * v.clone()) * u.clone();
    let dv = (p(3) * u - p(2)) * v;
    Tensor::cat(vec![du, dv], 1)
}

fn lv_f64(z: [f64; 2], p: [f64; 4]) -> [f64; 2] {
    [(p[0] - p[1] * z[1]) * z[0], (-p[2] + p[3] * z[0]) * z[1]]
}

/// Classical RK4 in plain f64 with a fixed step, recording the state at each `ts`.
fn rk4_lv(y0: [f64; 2], p: [f64; 4], ts: &[f64], h: f64) -> Vec<[f64; 2]> {
    let mut y = y0;
    let mut t = 0.0;
    let mut out = vec![];
    for &t_out in ts {
        let steps = ((t_out - t) / h).round() as usize;
        let hh = (t_out - t) / steps as f64;
        for _ in 0..steps {
            let k1 = lv_f64(y, p);
            let k2 = lv_f64([y[0] + 0.5 * hh * k1[0], y[1] + 0.5 * hh * k1[1]], p);
            let k3 = lv_f64([y[0] + 0.5 * hh * k2[0], y[1] + 0.5 * hh * k2[1]], p);
            let k4 = lv_f64([y[0] + hh * k3[0], y[1] + hh * k3[1]], p);
            y = std::array::from_fn(|i| y[i] + hh / 6.0 * (k1[i] + 2.0 * k2[i] + 2.0 * k3[i] + k4[i]));
        }
        t = t_out;
        out.push(y);
    }
    out
}

const TS: [f64; 5] = [0.25, 0.5, 1.0, 2.5, 4.0];

#[test]
fn exponential_decay_matches_closed_form_in_f64_and_f32() {
    let device = flex();
    let thetas = [0.3, 0.8, 1.5, 2.0, 4.0];
    let y0s = [1.0, -2.0, 0.5, 3.0, 10.0];
    for (dtype, opts, tol) in [
        (DType::F64, OdeOptions::default(), 2e-6),
        (DType::F64, OdeOptions::new(1e-10, 1e-10, 100_000), 1e-9),
        (DType::F32, OdeOptions::default(), 1e-5),
    ] {
        let theta = tensor(thetas.to_vec(), [5, 1], dtype, &device);
        let y0 = tensor(y0s.to_vec(), [5, 1], dtype, &device);
        let sol = ode_rk45(decay, y0, 0.0, &TS, &theta, &opts).unwrap();
        assert_eq!(sol.states.dims(), [5, TS.len(), 1]);
        let got = host(&sol.states);
        for p in 0..5 {
            for (j, &t) in TS.iter().enumerate() {
                let exact = y0s[p] * (-thetas[p] * t).exp();
                let err = (got[p * TS.len() + j] - exact).abs();
                assert!(err <= tol * (1.0 + exact.abs()), "{dtype:?} particle {p} t {t}: {} vs {exact}", got[j]);
            }
        }
    }
}

#[test]
fn harmonic_oscillator_matches_closed_form() {
    let device = flex();
    let omegas = [0.5, 1.0, 2.0, 3.7];
    let starts = [[1.0, 0.0], [0.0, 1.0], [2.0, -1.0], [-0.5, 3.0]];
    let ts: Vec<f64> = (1..=10).map(f64::from).collect();
    for (opts, tol) in [(OdeOptions::default(), 3e-5), (OdeOptions::new(1e-10, 1e-10, 100_000), 1e-8)] {
        let theta = tensor(omegas.to_vec(), [4, 1], DType::F64, &device);
        let y0 = tensor(starts.concat(), [4, 2], DType::F64, &device);
        let sol = ode_rk45(oscillator, y0, 0.0, &ts, &theta, &opts).unwrap();
        let got = host(&sol.states);
        for p in 0..4 {
            let (w, [a, b]) = (omegas[p], starts[p]);
            for (j, &t) in ts.iter().enumerate() {
                let x = a * (w * t).cos() + b / w * (w * t).sin();
                let v = -a * w * (w * t).sin() + b * (w * t).cos();
                let base = (p * ts.len() + j) * 2;
                let err = (got[base] - x).abs().max((got[base + 1] - v).abs());
                assert!(err < tol, "omega {w} t {t}: ({}, {}) vs ({x}, {v}), err {err}", got[base], got[base + 1]);
            }
        }
    }
}

#[test]
fn decay_gradients_match_closed_form() {
    let device = flex();
    let thetas = [0.3, 0.8, 1.5, 2.0];
    let y0s = [1.0, -2.0, 0.5, 3.0];
    let weights = [1.0, -0.5, 2.0, 0.25, 1.5];
    let w = Tensor::<3>::from_data(TensorData::new(weights.to_vec(), [1, TS.len(), 1]), (&device, DType::F64));
    let opts = OdeOptions::new(1e-8, 1e-8, 100_000);
    let (_, g_y0, g_theta) = value_and_grad2(
        tensor(y0s.to_vec(), [4, 1], DType::F64, &device),
        tensor(thetas.to_vec(), [4, 1], DType::F64, &device),
        |y0, theta| {
            let sol = ode_rk45(decay, y0, 0.0, &TS, &theta, &opts).unwrap();
            (sol.states * w.clone().autodiff()).sum_dim(1).reshape([4])
        },
    )
    .unwrap();
    let (g_y0, g_theta) = (host(&g_y0), host(&g_theta));
    for p in 0..4 {
        let (th, y0) = (thetas[p], y0s[p]);
        let dy0: f64 = TS.iter().zip(weights).map(|(t, w)| w * (-th * t).exp()).sum();
        let dth: f64 = TS.iter().zip(weights).map(|(t, w)| -w * t * y0 * (-th * t).exp()).sum();
        assert!((g_y0[p] - dy0).abs() < 1e-6, "particle {p}: d/dy0 {} vs {dy0}", g_y0[p]);
        assert!((g_theta[p] - dth).abs() < 1e-6, "particle {p}: d/dtheta {} vs {dth}", g_theta[p]);
    }
}

#[test]
fn oscillator_gradients_match_closed_form() {
    // d/d omega of x(t) = a cos(w t) + (b / w) sin(w t), summed over the output times.
    let device = flex();
    let omegas = [0.5, 1.0, 2.0];
    let starts = [[1.0, 0.0], [0.0, 1.0], [2.0, -1.0]];
    let ts = [0.5, 1.0, 2.0, 3.0];
    let opts = OdeOptions::new(1e-9, 1e-9, 100_000);
    let (_, g_y0, g_w) = value_and_grad2(
        tensor(starts.concat(), [3, 2], DType::F64, &device),
        tensor(omegas.to_vec(), [3, 1], DType::F64, &device),
        |y0, w| {
            let sol = ode_rk45(oscillator, y0, 0.0, &ts, &w, &opts).unwrap();
            sol.states.narrow(2, 0, 1).sum_dim(1).reshape([3])
        },
    )
    .unwrap();
    let (g_y0, g_w) = (host(&g_y0), host(&g_w));
    for p in 0..3 {
        let (w, [a, b]) = (omegas[p], starts[p]);
        let dw: f64 =
            ts.iter().map(|&t| -a * t * (w * t).sin() - b / (w * w) * (w * t).sin() + b / w * t * (w * t).cos()).sum();
        let da: f64 = ts.iter().map(|&t| (w * t).cos()).sum();
        let db: f64 = ts.iter().map(|&t| (w * t).sin() / w).sum();
        for (got, want, what) in [(g_w[p], dw, "omega"), (g_y0[2 * p], da, "x0"), (g_y0[2 * p + 1], db, "v0")] {
            assert!((got - want).abs() < 1e-6 * (1.0 + want.abs()), "particle {p}, d/d{what}: {got} vs {want}");
        }
    }
}

/// `y' = -exp(theta) y^3`: nonlinear in both `y` and `theta` (every derivative of `f` nonzero),
/// so the sensitivities' difference quotients have a truncation error to stay under.
fn cubic_decay(_t: f64, y: Tensor<2>, theta: &Tensor<2>) -> Tensor<2> {
    -(theta.clone().exp() * y.clone().powi_scalar(3))
}

/// Both solvers' forward sensitivities (rk45's and the stiff solver's, each on host buffers with
/// difference quotients of `f`) against the closed form.
#[test]
fn nonlinear_gradients_match_closed_form_in_f64_and_f32() {
    // y(t) = y0 / sqrt(1 + a), a = 2 k y0^2 t, k = exp(theta): dy/dy0 = (1 + a)^(-3/2),
    // dy/dtheta = -k y0^3 t (1 + a)^(-3/2).
    let device = flex();
    let thetas = [-1.0, 0.0, 0.7];
    let y0s = [0.5, 1.5, -2.0];
    let ts = [0.2, 0.5, 1.0, 2.0];
    let weights = [1.0, -0.5, 2.0, 0.75];
    for (name, (dtype, opts, tol)) in ["ode_rk45", "ode_stiff"].into_iter().flat_map(|s| {
        [
            (s, (DType::F64, OdeOptions::new(1e-9, 1e-9, 100_000), 1e-6)),
            (s, (DType::F32, OdeOptions::new(1e-6, 1e-6, 100_000), 2e-4)),
        ]
    }) {
        let w = Tensor::<3>::from_data(TensorData::new(weights.to_vec(), [1, ts.len(), 1]), (&device, dtype));
        let (_, g_y0, g_theta) = value_and_grad2(
            tensor(y0s.to_vec(), [3, 1], dtype, &device),
            tensor(thetas.to_vec(), [3, 1], dtype, &device),
            |y0, theta| {
                let sol = if name == "ode_rk45" {
                    ode_rk45(cubic_decay, y0, 0.0, &ts, &theta, &opts)
                } else {
                    ode_stiff(cubic_decay, y0, 0.0, &ts, &theta, &opts)
                };
                let sol = sol.unwrap();
                (sol.states * w.clone().autodiff()).sum_dim(1).reshape([3])
            },
        )
        .unwrap();
        let (g_y0, g_theta) = (host(&g_y0), host(&g_theta));
        for p in 0..3 {
            let (k, y0) = (thetas[p].exp(), y0s[p]);
            let factor = |t: f64| (1.0 + 2.0 * k * y0 * y0 * t).powf(-1.5);
            let dy0: f64 = ts.iter().zip(weights).map(|(&t, w)| w * factor(t)).sum();
            let dth: f64 = ts.iter().zip(weights).map(|(&t, w)| -w * k * y0.powi(3) * t * factor(t)).sum();
            for (got, want, what) in [(g_y0[p], dy0, "y0"), (g_theta[p], dth, "theta")] {
                assert!(
                    (got - want).abs() < tol * (1.0 + want.abs()),
                    "{name} {dtype:?} particle {p}, d/d{what}: {got} vs {want}"
                );
            }
        }
    }
}

const LV_THETA: [f64; 4] = [0.55, 0.028, 0.8, 0.024];
const LV_Y0: [f64; 2] = [33.0, 6.0];

/// `n` Lotka-Volterra particles near posteriordb's posterior mean (fixed perturbations).
fn lv_particles(n: usize) -> (Vec<[f64; 4]>, Vec<[f64; 2]>) {
    let wiggle = |i: usize, j: usize| 1.0 + 0.1 * (((i * 7 + j * 13) % 17) as f64 / 8.0 - 1.0);
    let thetas = (0..n).map(|i| std::array::from_fn(|j| LV_THETA[j] * wiggle(i, j))).collect();
    let y0s = (0..n).map(|i| std::array::from_fn(|j| LV_Y0[j] * wiggle(i, j + 4))).collect();
    (thetas, y0s)
}

fn lv_tensors(thetas: &[[f64; 4]], y0s: &[[f64; 2]], dtype: DType, device: &Device) -> (Tensor<2>, Tensor<2>) {
    let n = thetas.len();
    (tensor(y0s.concat(), [n, 2], dtype, device), tensor(thetas.concat(), [n, 4], dtype, device))
}

#[test]
fn lotka_volterra_matches_an_independent_rk4() {
    let device = flex();
    let ts: Vec<f64> = (1..=20).map(f64::from).collect();
    let (thetas, y0s) = lv_particles(6);
    let reference: Vec<Vec<[f64; 2]>> = thetas.iter().zip(&y0s).map(|(p, y)| rk4_lv(*y, *p, &ts, 1e-3)).collect();
    // Tight tolerances in f64; Stan's posteriordb settings (1e-5, 1e-3, 500) in f64 and f32.
    for (dtype, opts, tol) in [
        (DType::F64, OdeOptions::new(1e-10, 1e-10, 100_000), 1e-7),
        (DType::F64, OdeOptions::new(1e-5, 1e-3, 500), 1e-3),
        (DType::F32, OdeOptions::new(1e-5, 1e-3, 500), 1e-3),
    ] {
        let (y0, theta) = lv_tensors(&thetas, &y0s, dtype, &device);
        let sol = ode_rk45(lotka_volterra, y0, 0.0, &ts, &theta, &opts).unwrap();
        let got = host(&sol.states);
        let mut worst = 0.0f64;
        for (p, reference) in reference.iter().enumerate() {
            for (j, want) in reference.iter().enumerate() {
                for s in 0..2 {
                    let g = got[(p * ts.len() + j) * 2 + s];
                    worst = worst.max((g - want[s]).abs() / want[s].abs().max(1.0));
                }
            }
        }
        println!("LV {dtype:?} rel_tol {:e}: max rel error {worst:.2e}, {:?}", opts.rel_tol, sol.stats);
        assert!(worst < tol, "{dtype:?} {opts:?}: max relative error {worst}");
    }
}

#[test]
fn lotka_volterra_gradient_matches_finite_differences() {
    // Central differences of the f64 solve at tight tolerance: the discrete map is smooth there.
    let device = flex();
    let ts: Vec<f64> = (1..=20).map(f64::from).collect();
    let (thetas, y0s) = lv_particles(3);
    let opts = OdeOptions::new(1e-10, 1e-10, 100_000);
    let weights: Vec<f64> = (0..ts.len() * 2).map(|i| ((i % 5) as f64 - 2.0) / 3.0).collect();
    let w = Tensor::<3>::from_data(TensorData::new(weights.clone(), [1, ts.len(), 2]), (&device, DType::F64));
    let objective = |y0: Tensor<2>, theta: Tensor<2>| {
        let n = y0.dims()[0];
        let sol = ode_rk45(lotka_volterra, y0, 0.0, &ts, &theta, &opts).unwrap();
        (sol.states * w.clone().to_device(&theta.device())).sum_dim(1).sum_dim(2).reshape([n])
    };
    let (y0, theta) = lv_tensors(&thetas, &y0s, DType::F64, &device);
    let (_, g_y0, g_theta) = value_and_grad2(y0, theta, objective).unwrap();
    let (g_y0, g_theta) = (host(&g_y0), host(&g_theta));
    for p in 0..3 {
        for j in 0..6 {
            let value = |sign: f64| {
                let (mut th, mut y) = (thetas[p], y0s[p]);
                let step = if j < 4 { 1e-6 * th[j] } else { 1e-6 * y[j - 4] };
                if j < 4 {
                    th[j] += sign * step
                } else {
                    y[j - 4] += sign * step
                }
                let (y0, theta) = lv_tensors(&[th], &[y], DType::F64, &device);
                (host(&objective(y0, theta))[0], step)
            };
            let ((plus, step), (minus, _)) = (value(1.0), value(-1.0));
            let fd = (plus - minus) / (2.0 * step);
            let ad = if j < 4 { g_theta[p * 4 + j] } else { g_y0[p * 2 + j - 4] };
            assert!(
                (ad - fd).abs() < 1e-5 * (1.0 + fd.abs()),
                "particle {p}, coordinate {j}: autodiff {ad} vs fd {fd}"
            );
        }
    }
}

/// `y' = -lambda (y - cos t)`: y_p(t) + (y0 - y_p(0)) exp(-lambda t), y_p = lambda (lambda cos t + sin t) / (lambda^2 + 1).
fn stiff_exact(lambda: f64, y0: f64, t: f64) -> (f64, f64) {
    let q = lambda * lambda + 1.0;
    let yp = |t: f64| lambda * (lambda * t.cos() + t.sin()) / q;
    let dyp = |t: f64| (2.0 * lambda * t.cos() + (1.0 - lambda * lambda) * t.sin()) / (q * q);
    let e = (-lambda * t).exp();
    let y = yp(t) + (y0 - yp(0.0)) * e;
    let dy = dyp(t) - dyp(0.0) * e - (y0 - yp(0.0)) * t * e;
    (y, dy)
}

fn stiff_rhs(t: f64, y: Tensor<2>, lambda: &Tensor<2>) -> Tensor<2> {
    -(y.sub_scalar(t.cos()) * lambda.clone())
}

#[test]
fn stiff_problem_matches_closed_form_values_and_gradients() {
    let device = flex();
    let lambdas = [1.0, 50.0, 1e3, 1e5];
    let y0s = [0.0, 2.0, -1.0, 0.5];
    let ts = [0.01, 0.1, 1.0, 5.0, 10.0];
    let opts = OdeOptions::new(1e-6, 1e-8, 100_000);
    let mut stats = None;
    let (values, g_y0, g_lambda) = value_and_grad2(
        tensor(y0s.to_vec(), [4, 1], DType::F64, &device),
        tensor(lambdas.to_vec(), [4, 1], DType::F64, &device),
        |y0, lambda| {
            let sol = ode_stiff(stiff_rhs, y0, 0.0, &ts, &lambda, &opts).unwrap();
            stats = Some(sol.stats);
            sol.states.sum_dim(1).reshape([4])
        },
    )
    .unwrap();
    println!("stiff solve: {stats:?}");
    let (values, g_y0, g_lambda) = (host(&values), host(&g_y0), host(&g_lambda));
    for p in 0..4 {
        let (l, y0) = (lambdas[p], y0s[p]);
        let value: f64 = ts.iter().map(|&t| stiff_exact(l, y0, t).0).sum();
        let dl: f64 = ts.iter().map(|&t| stiff_exact(l, y0, t).1).sum();
        let dy0: f64 = ts.iter().map(|&t| (-l * t).exp()).sum();
        assert!((values[p] - value).abs() < 1e-5, "lambda {l}: sum of y {} vs {value}", values[p]);
        assert!((g_lambda[p] - dl).abs() < 1e-4 * (1.0 + dl.abs()), "lambda {l}: d/dlambda {} vs {dl}", g_lambda[p]);
        assert!((g_y0[p] - dy0).abs() < 1e-4, "lambda {l}: d/dy0 {} vs {dy0}", g_y0[p]);
    }
    // rk45 on the same batch needs a step below 3.3 / lambda for stability: the stiffest
    // particles hit its limit and are dropped (NaN), the stiffest first; the mild ones are solved.
    let (y0, lambda) =
        (tensor(y0s.to_vec(), [4, 1], DType::F64, &device), tensor(lambdas.to_vec(), [4, 1], DType::F64, &device));
    let sol = ode_rk45(stiff_rhs, y0, 0.0, &ts, &lambda, &OdeOptions::new(1e-7, 1e-9, 2000)).unwrap();
    let failed: Vec<usize> = sol.failed.iter().map(|(p, _)| *p).collect();
    assert!(failed.contains(&3), "{:?}", sol.failed);
    assert!(sol.failed.iter().all(|(_, e)| matches!(e, OdeError::MaxNumSteps { .. })), "{:?}", sol.failed);
    let t_len = ts.len();
    let v = host(&sol.states);
    for p in 0..4 {
        let row = &v[p * t_len..(p + 1) * t_len];
        if failed.contains(&p) {
            assert!(row.iter().all(|x| x.is_nan()), "particle {p}: {row:?}");
        } else {
            let value: f64 = row.iter().sum();
            let exact: f64 = ts.iter().map(|&t| stiff_exact(lambdas[p], y0s[p], t).0).sum();
            assert!((value - exact).abs() < 1e-5, "particle {p}: {value} vs {exact}");
        }
    }
}

/// Robertson's chemical kinetics (Hairer & Wanner, Solving ODEs II, section IV.1), rates in theta.
fn robertson(_t: f64, y: Tensor<2>, k: &Tensor<2>) -> Tensor<2> {
    let (y1, y2, y3) = (y.clone().narrow(1, 0, 1), y.clone().narrow(1, 1, 1), y.narrow(1, 2, 1));
    let k = |j| k.clone().narrow(1, j, 1);
    let r1 = k(0) * y1;
    let r2 = k(1) * y2.clone() * y3;
    let r3 = k(2) * y2.clone().square();
    Tensor::cat(vec![r2.clone() - r1.clone(), r1 - r2 - r3.clone(), r3], 1)
}

#[test]
fn robertson_matches_a_tight_reference_and_conserves_mass() {
    let device = flex();
    let rates = [[0.04, 1e4, 3e7], [0.05, 2e4, 1e7]];
    let ts = [0.1, 1.0, 10.0, 40.0];
    let y0 = || tensor(vec![1.0, 0.0, 0.0, 1.0, 0.0, 0.0], [2, 3], DType::F64, &device);
    let k = tensor(rates.concat(), [2, 3], DType::F64, &device);
    let tight = ode_stiff(robertson, y0(), 0.0, &ts, &k, &OdeOptions::new(1e-9, 1e-13, 1_000_000)).unwrap();
    let loose = ode_stiff(robertson, y0(), 0.0, &ts, &k, &OdeOptions::new(1e-6, 1e-10, 100_000)).unwrap();
    println!("Robertson: tight {:?}, loose {:?}", tight.stats, loose.stats);
    let (a, b) = (host(&tight.states), host(&loose.states));
    for (i, (a, b)) in a.iter().zip(&b).enumerate() {
        assert!((a - b).abs() < 1e-5 * a.abs() + 1e-9, "entry {i}: {b} vs tight {a}");
    }
    // Hairer & Wanner's values at t = 40 for the standard rates.
    let at40 = &a[9..12];
    for (got, want) in at40.iter().zip([0.7158270687, 9.185534764e-6, 0.2841637457]) {
        assert!((got - want).abs() < 1e-7 * want.max(1e-3), "{got} vs {want}");
    }
    for chunk in a.chunks(3) {
        assert!((chunk.iter().sum::<f64>() - 1.0).abs() < 1e-9);
    }
}

fn expect_invalid(result: Result<parvi_model::ode::OdeSolution, OdeError>, argument: &str) {
    match result {
        Err(OdeError::InvalidArgument { name, element, reason }) => {
            assert_eq!(name, argument, "{reason}");
            let message = OdeError::InvalidArgument { name, element, reason }.to_string();
            assert!(message.contains(&format!("`{argument}`")), "{message}");
        }
        other => panic!("expected an error naming `{argument}`, got {other:?}"),
    }
}

#[test]
fn bad_arguments_are_errors_naming_the_argument() {
    let device = flex();
    let y0 = || tensor(vec![1.0, 2.0], [2, 1], DType::F64, &device);
    let theta = tensor(vec![0.5, 1.0], [2, 1], DType::F64, &device);
    let ok = OdeOptions::default();
    for solve in [ode_rk45::<fn(f64, Tensor<2>, &Tensor<2>) -> Tensor<2>>, ode_stiff] {
        expect_invalid(solve(decay, y0(), 0.0, &[], &theta, &ok), "ts");
        expect_invalid(solve(decay, y0(), 0.0, &[1.0, 3.0, 2.0], &theta, &ok), "ts");
        expect_invalid(solve(decay, y0(), 0.0, &[1.0, 1.0], &theta, &ok), "ts");
        expect_invalid(solve(decay, y0(), 1.0, &[1.0, 2.0], &theta, &ok), "ts");
        expect_invalid(solve(decay, y0(), 0.0, &[1.0, f64::NAN], &theta, &ok), "ts");
        expect_invalid(solve(decay, y0(), f64::NAN, &[1.0], &theta, &ok), "t0");
        expect_invalid(solve(decay, y0(), 0.0, &[1.0], &theta, &OdeOptions::new(0.0, 1e-6, 10)), "rel_tol");
        expect_invalid(solve(decay, y0(), 0.0, &[1.0], &theta, &OdeOptions::new(1e-6, -1.0, 10)), "abs_tol");
        expect_invalid(solve(decay, y0(), 0.0, &[1.0], &theta, &OdeOptions::new(1e-6, f64::NAN, 10)), "abs_tol");
        expect_invalid(solve(decay, y0(), 0.0, &[1.0], &theta, &OdeOptions::new(1e-6, 1e-6, 0)), "max_num_steps");
        let three = tensor(vec![0.5, 1.0, 2.0], [3, 1], DType::F64, &device);
        expect_invalid(solve(decay, y0(), 0.0, &[1.0], &three, &ok), "theta");
        let nan_y0 = tensor(vec![1.0, f64::NAN], [2, 1], DType::F64, &device);
        expect_invalid(solve(decay, nan_y0, 0.0, &[1.0], &theta, &ok), "y0");
        let wide = |_t: f64, y: Tensor<2>, _th: &Tensor<2>| Tensor::cat(vec![y.clone(), y], 1);
        expect_invalid(solve(wide, y0(), 0.0, &[1.0], &theta, &ok), "f");
    }
}

/// The one failure of a solve's `failed` list, for `particle`.
fn only_failure(sol: &parvi_model::ode::OdeSolution, particle: usize) -> OdeError {
    assert_eq!(sol.failed.len(), 1, "{:?}", sol.failed);
    assert_eq!(sol.failed[0].0, particle, "{:?}", sol.failed);
    sol.failed[0].1.clone()
}

/// Row `particle` of the states is NaN, every other row finite.
fn assert_nan_row_only(sol: &parvi_model::ode::OdeSolution, particle: usize) {
    let [n, t, s] = sol.states.dims();
    let v = host(&sol.states);
    for p in 0..n {
        let row = &v[p * t * s..(p + 1) * t * s];
        if p == particle {
            assert!(row.iter().all(|x| x.is_nan()), "particle {p}: {row:?}");
        } else {
            assert!(row.iter().all(|x| x.is_finite()), "particle {p}: {row:?}");
        }
    }
}

#[test]
fn numerical_failures_are_per_particle_and_name_the_particle_time_and_tolerances() {
    let device = flex();
    let opts = OdeOptions::default();
    // A right-hand side that is NaN at the start for particle 2: the others are solved.
    let theta = tensor(vec![1.0, 1.0, -1.0], [3, 1], DType::F64, &device);
    let y0 = || tensor(vec![1.0, 1.0, 1.0], [3, 1], DType::F64, &device);
    let sqrt_rhs = |_t: f64, y: Tensor<2>, th: &Tensor<2>| -(y * th.clone().sqrt());
    for solve in [ode_rk45::<fn(f64, Tensor<2>, &Tensor<2>) -> Tensor<2>>, ode_stiff] {
        let sol = solve(sqrt_rhs, y0(), 0.0, &[1.0], &theta, &opts).unwrap();
        let err = only_failure(&sol, 2);
        assert!(matches!(err, OdeError::NonFinite { particle: 2, t: 0.0, .. }), "{err}");
        assert_nan_row_only(&sol, 2);
        // exp(-1) for the others, to the tolerance (ode_stiff is second order).
        let v = host(&sol.states);
        assert!((v[0] - (-1f64).exp()).abs() < 1e-4 && (v[1] - (-1f64).exp()).abs() < 1e-4, "{v:?}");
        // A right-hand side that turns NaN for particle 1 once t passes 0.5: it stops there.
        let cutoff = tensor(vec![5.0, 0.5, 5.0], [3, 1], DType::F64, &device);
        let edge = |t: f64, y: Tensor<2>, th: &Tensor<2>| -(y * th.clone().sub_scalar(t).sqrt());
        let sol = solve(edge, y0(), 0.0, &[1.0], &cutoff, &opts).unwrap();
        let err = only_failure(&sol, 1);
        let message = err.to_string();
        match err {
            OdeError::NonFinite { particle, t, .. } | OdeError::StepSizeUnderflow { particle, t, .. } => {
                assert_eq!(particle, 1, "{message}");
                assert!((0.4..=0.5).contains(&t), "{message}");
            }
            other => panic!("expected a non-finite or underflow failure, got {other}"),
        }
        assert!(message.contains("particle 1") && message.contains("rel_tol 1e-6"), "{message}");
        assert_nan_row_only(&sol, 1);
        // Every particle failing is the solve's error.
        let all_bad = tensor(vec![-1.0, -2.0, -3.0], [3, 1], DType::F64, &device);
        let err = solve(sqrt_rhs, y0(), 0.0, &[1.0], &all_bad, &opts).unwrap_err();
        assert!(matches!(err, OdeError::NonFinite { t: 0.0, .. }), "{err}");
    }
    // y' = y^2 blows up at t = 1 / y0: particle 1 (y0 = 1) fails before t = 1, the others
    // (blowing up at t = 10 and 5) reach t = 2 as 1 / (1 / y0 - t).
    let blow = |_t: f64, y: Tensor<2>, _th: &Tensor<2>| y.square();
    let y0 = tensor(vec![0.1, 1.0, 0.2], [3, 1], DType::F64, &device);
    let sol = ode_rk45(blow, y0, 0.0, &[2.0], &theta, &opts).unwrap();
    let err = only_failure(&sol, 1);
    let message = err.to_string();
    match err {
        OdeError::NonFinite { particle, t, .. }
        | OdeError::StepSizeUnderflow { particle, t, .. }
        | OdeError::MaxNumSteps { particle, t, .. } => {
            assert_eq!(particle, 1, "{message}");
            assert!((0.9..=1.01).contains(&t), "{message}");
        }
        other => panic!("unexpected {other}"),
    }
    let v = host(&sol.states);
    assert!((v[0] - 1.0 / 8.0).abs() < 1e-5 && (v[2] - 1.0 / 3.0).abs() < 1e-5, "{v:?}");
    // max_num_steps between two output times: the faster oscillator (particle 1) is dropped
    // first, then the other, and a solve where all fail is the error.
    let omega = tensor(vec![1.0, 2.0], [2, 1], DType::F64, &device);
    let start = tensor(vec![1.0, 0.0, 0.0, 1.0], [2, 2], DType::F64, &device);
    let err = ode_rk45(oscillator, start, 0.0, &[1.0, 10.0], &omega, &OdeOptions::new(1e-8, 1e-8, 20)).unwrap_err();
    let message = err.to_string();
    match err {
        OdeError::MaxNumSteps { t, t_out, max_num_steps, .. } => {
            assert!(t < t_out && max_num_steps == 20, "{message}");
            assert!(message.contains("max_num_steps = 20") && message.contains("rel_tol 1e-8"), "{message}");
        }
        other => panic!("expected max_num_steps, got {other}"),
    }
    // With a budget the slow one meets, only the fast one fails.
    let start = tensor(vec![1.0, 0.0, 0.0, 1.0], [2, 2], DType::F64, &device);
    let sol = ode_rk45(oscillator, start, 0.0, &[1.0, 10.0], &omega, &OdeOptions::new(1e-8, 1e-8, 300)).unwrap();
    if !sol.failed.is_empty() {
        assert!(matches!(only_failure(&sol, 1), OdeError::MaxNumSteps { particle: 1, .. }));
    }
    // The error converts into the DSL's ModelError.
    let model: parvi_model::ModelError =
        OdeError::InvalidArgument { name: "ts", element: None, reason: "x".into() }.into();
    assert!(model.to_string().contains("`ts`"));
}

fn median_ms(mut runs: Vec<f64>) -> f64 {
    runs.sort_by(f64::total_cmp);
    runs[runs.len() / 2]
}

/// Timing for the report: 100 Lotka-Volterra particles, ts = 1..20, with the gradient, on flex in
/// f32; and the shared step size against the steps each particle would take alone.
#[test]
fn lotka_volterra_100_particles_timing_and_shared_steps() {
    let device = flex();
    let ts: Vec<f64> = (1..=20).map(f64::from).collect();
    let (thetas, y0s) = lv_particles(100);
    for opts in [OdeOptions::new(1e-5, 1e-3, 500), OdeOptions::default()] {
        let (y0, theta) = lv_tensors(&thetas, &y0s, DType::F32, &device);
        let mut forward = vec![];
        let mut with_grad = vec![];
        let mut tracked_forward = vec![];
        let mut shared = None;
        for _ in 0..5 {
            let start = std::time::Instant::now();
            let sol = ode_rk45(lotka_volterra, y0.clone(), 0.0, &ts, &theta, &opts).unwrap();
            let _ = host(&sol.states);
            forward.push(start.elapsed().as_secs_f64() * 1e3);
            shared = Some(sol.stats);
            let start = std::time::Instant::now();
            let tracked = theta.clone().autodiff().require_grad();
            let sol = ode_rk45(lotka_volterra, y0.clone().autodiff(), 0.0, &ts, &tracked, &opts).unwrap();
            let _ = host(&sol.states);
            tracked_forward.push(start.elapsed().as_secs_f64() * 1e3);
            let start = std::time::Instant::now();
            let (_, g_y0, g_theta) = value_and_grad2(y0.clone(), theta.clone(), |y0, theta| {
                let sol = ode_rk45(lotka_volterra, y0, 0.0, &ts, &theta, &opts).unwrap();
                sol.states.sum_dim(1).sum_dim(2).reshape([100])
            })
            .unwrap();
            let (g_y0, g_theta) = (host(&g_y0), host(&g_theta));
            with_grad.push(start.elapsed().as_secs_f64() * 1e3);
            assert!(g_y0.iter().chain(&g_theta).all(|g| g.is_finite()));
        }
        let shared = shared.unwrap();
        let alone: usize = (0..100)
            .map(|p| {
                let (y0, theta) = lv_tensors(&thetas[p..=p], &y0s[p..=p], DType::F32, &device);
                let s = ode_rk45(lotka_volterra, y0, 0.0, &ts, &theta, &opts).unwrap().stats;
                s.accepted_steps + s.rejected_steps
            })
            .sum();
        println!(
            "LV n=100 T=20 f32 flex rel_tol {:e} abs_tol {:e}: solve {:.1} ms, tracked solve {:.1} ms, solve+gradient {:.1} ms; shared steps {} \
             ({} rejected); particles alone: mean {:.1} steps",
            opts.rel_tol,
            opts.abs_tol,
            median_ms(forward),
            median_ms(tracked_forward),
            median_ms(with_grad),
            shared.accepted_steps + shared.rejected_steps,
            shared.rejected_steps,
            alone as f64 / 100.0
        );
    }
}
