//! The HMM forward algorithm against an independent `f64` forward recursion (the sequential
//! `log_sum_exp` loop of posteriordb's `hmm_example`), and its gradient against finite differences.

use parvi_model::BackendKind;
use parvi_model::burn::tensor::{Tensor, TensorData};
use parvi_model::hmm::hmm_marginal;
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
