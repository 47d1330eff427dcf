//! The HMM forward algorithm against an independent `f64` forward recursion (the sequential
//! `log_sum_exp` loop of posteriordb's `hmm_example`), and its gradient against finite differences;
//! the CPU's fused operation (flex natively, ndarray by a host read) against the GPU's log-depth
//! tensor form.

use parvi_model::BackendKind;
use parvi_model::burn::tensor::{Tensor, TensorData};
use parvi_model::hmm::{hmm_marginal, hmm_marginal_log_depth};
use parvi_model::tensor_ops::to_vec_f64;

fn lse(v: &[f64]) -> f64 {
    let m = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    m + v.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
}

/// The textbook forward recursion, one time step at a time, in `f64`.
fn forward(log_omega: &[f64], log_gamma: &[f64], log_rho: &[f64], t: usize, k: usize) -> f64 {
    let mut alpha: Vec<f64> = (0..k).map(|s| log_rho[s] + log_omega[s]).collect();
    for step in 1..t {
        alpha = (0..k)
            .map(|to| {
                let acc: Vec<f64> = (0..k).map(|from| alpha[from] + log_gamma[from * k + to]).collect();
                lse(&acc) + log_omega[step * k + to]
            })
            .collect();
    }
    lse(&alpha)
}

/// A deterministic pseudo-random sequence in (-1, 1).
fn values(len: usize, seed: u64) -> Vec<f64> {
    let mut s = seed;
    (0..len)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        })
        .collect()
}

/// Rows of a `k x k` matrix of log transition probabilities from raw values (log-softmax rows).
fn log_rows(raw: &[f64], k: usize) -> Vec<f64> {
    raw.chunks(k).flat_map(|row| row.iter().map(|v| v - lse(row)).collect::<Vec<_>>()).collect()
}

fn tensor<const D: usize>(v: &[f64], shape: [usize; D], device: &parvi_model::burn::tensor::Device) -> Tensor<D> {
    Tensor::from_data(TensorData::new(v.iter().map(|&x| x as f32).collect::<Vec<_>>(), shape), device)
}

#[test]
fn matches_the_sequential_forward_recursion() {
    let device = BackendKind::Flex.device().unwrap();
    // Several lengths (odd, even, 1, 2, a power of two and one past it) and state counts.
    for &(t, k) in &[(1, 2), (2, 2), (7, 2), (16, 3), (17, 3), (100, 2), (33, 4)] {
        let n = 3;
        let omega: Vec<f64> = values(n * t * k, t as u64).iter().map(|v| 3.0 * v - 2.0).collect();
        let gamma: Vec<f64> = (0..n).flat_map(|p| log_rows(&values(k * k, 100 + p as u64 + t as u64), k)).collect();
        let rho: Vec<f64> = (0..n).flat_map(|p| log_rows(&values(k, 200 + p as u64), k)).collect();
        let got = to_vec_f64(
            &hmm_marginal(
                tensor(&omega, [n, t, k], &device),
                tensor(&gamma, [n, k, k], &device),
                tensor(&rho, [n, k], &device),
            )
            .unwrap(),
        );
        for p in 0..n {
            let want = forward(
                &omega[p * t * k..(p + 1) * t * k],
                &gamma[p * k * k..(p + 1) * k * k],
                &rho[p * k..(p + 1) * k],
                t,
                k,
            );
            // f32 sums of O(T) terms of size O(1): relative error of a few ulp per step.
            let tol = 1e-5 * (1.0 + want.abs()) * (t as f64).sqrt();
            assert!((got[p] - want).abs() < tol, "T={t} K={k} particle {p}: {} vs {want}", got[p]);
        }
    }
}

#[test]
fn gradient_matches_finite_differences() {
    let device = BackendKind::Flex.device().unwrap().autodiff();
    let (t, k) = (9, 2);
    let omega: Vec<f64> = values(t * k, 5).iter().map(|v| 2.0 * v).collect();
    let gamma = log_rows(&values(k * k, 6), k);
    let rho = vec![0.0; k];
    let om = tensor(&omega, [1, t, k], &device).require_grad();
    let ga = tensor(&gamma, [1, k, k], &device).require_grad();
    let lp = hmm_marginal(om.clone(), ga.clone(), tensor(&rho, [1, k], &device)).unwrap();
    let grads = lp.sum().backward();
    let g_omega = to_vec_f64(&om.grad(&grads).unwrap());
    let g_gamma = to_vec_f64(&ga.grad(&grads).unwrap());
    let h = 1e-6;
    for i in 0..omega.len() {
        let (mut up, mut down) = (omega.clone(), omega.clone());
        up[i] += h;
        down[i] -= h;
        let fd = (forward(&up, &gamma, &rho, t, k) - forward(&down, &gamma, &rho, t, k)) / (2.0 * h);
        assert!((g_omega[i] - fd).abs() < 1e-4, "d/d omega[{i}]: {} vs {fd}", g_omega[i]);
    }
    for i in 0..gamma.len() {
        let (mut up, mut down) = (gamma.clone(), gamma.clone());
        up[i] += h;
        down[i] -= h;
        let fd = (forward(&omega, &up, &rho, t, k) - forward(&omega, &down, &rho, t, k)) / (2.0 * h);
        assert!((g_gamma[i] - fd).abs() < 1e-4, "d/d gamma[{i}]: {} vs {fd}", g_gamma[i]);
    }
}

#[test]
fn shapes_that_do_not_fit_are_named() {
    let device = BackendKind::Flex.device().unwrap();
    let err = hmm_marginal(
        Tensor::zeros([2, 5, 2], &device),
        Tensor::zeros([2, 3, 3], &device),
        Tensor::zeros([2, 2], &device),
    )
    .unwrap_err();
    assert!(err.to_string().contains("log_gamma"), "{err}");
    let err = hmm_marginal(
        Tensor::zeros([2, 5, 2], &device),
        Tensor::zeros([2, 2, 2], &device),
        Tensor::zeros([1, 2], &device),
    )
    .unwrap_err();
    assert!(err.to_string().contains("log_rho"), "{err}");
}

/// The three gradients of `sum_i w_i log p_i` with respect to `log_omega`, `log_gamma` and
/// `log_rho`, and the values, through `f`.
fn value_and_grads(
    f: fn(Tensor<3>, Tensor<3>, Tensor<2>) -> Result<Tensor<1>, parvi_model::ModelError>,
    device: &parvi_model::burn::tensor::Device,
    (omega, gamma, rho): (&[f64], &[f64], &[f64]),
    [n, t, k]: [usize; 3],
) -> [Vec<f64>; 4] {
    let om = tensor(omega, [n, t, k], device).require_grad();
    let ga = tensor(gamma, [n, k, k], device).require_grad();
    let rh = tensor(rho, [n, k], device).require_grad();
    let lp = f(om.clone(), ga.clone(), rh.clone()).unwrap();
    let weights = tensor(&(0..n).map(|p| 1.0 + p as f64).collect::<Vec<_>>(), [n], device);
    let grads = (lp.clone() * weights).sum().backward();
    [
        to_vec_f64(&lp),
        to_vec_f64(&om.grad(&grads).unwrap()),
        to_vec_f64(&ga.grad(&grads).unwrap()),
        to_vec_f64(&rh.grad(&grads).unwrap()),
    ]
}

#[test]
fn the_fused_operation_matches_the_log_depth_form_on_both_cpu_backends() {
    let (n, t, k) = (4, 37, 3);
    // Emissions spread over 20 nats (so that the scaled pass must shift them), rows of Gamma
    // from raw values, an initial distribution that is not uniform.
    let omega: Vec<f64> = values(n * t * k, 11).iter().map(|v| 10.0 * v - 5.0).collect();
    let gamma: Vec<f64> = (0..n).flat_map(|p| log_rows(&values(k * k, 30 + p as u64), k)).collect();
    let rho: Vec<f64> = (0..n).flat_map(|p| log_rows(&values(k, 40 + p as u64), k)).collect();
    let flex = BackendKind::Flex.device().unwrap().autodiff();
    let want = value_and_grads(hmm_marginal_log_depth, &flex, (&omega, &gamma, &rho), [n, t, k]);
    for device in [flex, BackendKind::Ndarray.device().unwrap().autodiff()] {
        let got = value_and_grads(hmm_marginal, &device, (&omega, &gamma, &rho), [n, t, k]);
        for (what, (g, w)) in ["log p", "d log_omega", "d log_gamma", "d log_rho"].iter().zip(got.iter().zip(&want)) {
            assert_eq!(g.len(), w.len(), "{what}");
            for (i, (a, b)) in g.iter().zip(w).enumerate() {
                // The log-depth form sums in f32 over T steps; the fused pass in f64.
                assert!((a - b).abs() < 2e-4 * (1.0 + b.abs()), "{what}[{i}] on {device:?}: {a} vs {b}");
            }
        }
    }
    // The gradient in log_rho is the posterior of the first state, times the particle's weight:
    // each particle's sums to its weight.
    let got = value_and_grads(
        hmm_marginal,
        &BackendKind::Flex.device().unwrap().autodiff(),
        (&omega, &gamma, &rho),
        [n, t, k],
    );
    for p in 0..n {
        let total: f64 = got[3][p * k..(p + 1) * k].iter().sum();
        assert!((total - (1.0 + p as f64)).abs() < 1e-5, "particle {p}: {total}");
    }
}

#[test]
fn the_initial_distributions_gradient_matches_finite_differences() {
    let device = BackendKind::Flex.device().unwrap().autodiff();
    let (t, k) = (6, 3);
    let omega: Vec<f64> = values(t * k, 7).iter().map(|v| 2.0 * v).collect();
    let gamma = log_rows(&values(k * k, 8), k);
    let rho = log_rows(&values(k, 9), k);
    let [_, _, _, g_rho] = value_and_grads(hmm_marginal, &device, (&omega, &gamma, &rho), [1, t, k]);
    let h = 1e-6;
    for i in 0..k {
        let (mut up, mut down) = (rho.clone(), rho.clone());
        up[i] += h;
        down[i] -= h;
        let fd = (forward(&omega, &gamma, &up, t, k) - forward(&omega, &gamma, &down, t, k)) / (2.0 * h);
        assert!((g_rho[i] - fd).abs() < 1e-4, "d/d rho[{i}]: {} vs {fd}", g_rho[i]);
    }
}

#[test]
fn an_impossible_observation_gives_minus_infinity_and_no_nan() {
    let device = BackendKind::Flex.device().unwrap().autodiff();
    let (n, t, k) = (2, 5, 2);
    let mut omega: Vec<f64> = values(n * t * k, 3).to_vec();
    // Particle 1's third observation is impossible in every state; particle 0 only in one.
    omega[t * k + 2 * k] = f64::NEG_INFINITY;
    omega[t * k + 2 * k + 1] = f64::NEG_INFINITY;
    omega[2 * k] = f64::NEG_INFINITY;
    let gamma: Vec<f64> = (0..n).flat_map(|p| log_rows(&values(k * k, 20 + p as u64), k)).collect();
    let rho = vec![0.0; n * k];
    let [lp, d_omega, d_gamma, d_rho] = value_and_grads(hmm_marginal, &device, (&omega, &gamma, &rho), [n, t, k]);
    let want = forward(&omega[..t * k], &gamma[..k * k], &rho[..k], t, k);
    assert!((lp[0] - want).abs() < 1e-4 * (1.0 + want.abs()), "{} vs {want}", lp[0]);
    assert_eq!(lp[1], f64::NEG_INFINITY);
    // The impossible state of particle 0 has posterior probability zero at that time.
    assert_eq!(d_omega[2 * k], 0.0);
    for d in d_omega.iter().chain(&d_gamma).chain(&d_rho) {
        assert!(d.is_finite(), "a non-finite gradient entry");
    }
    assert!(d_omega[t * k..].iter().all(|&d| d == 0.0), "the impossible particle's gradient is zero");
}
