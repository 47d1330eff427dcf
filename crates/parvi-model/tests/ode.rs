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
            for i in 0..2 {
                y[i] += hh / 6.0 * (k1[i] + 2.0 * k2[i] + 2.0 * k3[i] + k4[i]);
            }
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
