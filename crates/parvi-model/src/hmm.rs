//! Hidden Markov models: the forward algorithm's marginal likelihood (Stan's `hmm_marginal`, and
//! the hand-written `log_sum_exp` recursions of posteriordb's `hmm_example` and `hmm_drive`) for
//! all particles at once.
//!
//! On the CPU (flex, ndarray) it is one custom operation: the scaled forward pass of Stan math's
//! `hmm_marginal` (each step's probabilities renormalised, `log p = sum_t log c_t`) in `f64` on
//! the host, and a backward pass from the same pass's backward recursion (the posterior
//! marginals are the emissions' gradient, the expected transition counts the transitions'). One
//! autodiff node and `O(T K)` exponentials a particle, where the tensor recursion records a few
//! dozen nodes over `[n, T, K, K, K]` temporaries: on `hmm_example` (T = 100, K = 2) the whole
//! score of 100 particles went from 3.9 to about 0.4 ms (docs/posteriordb.md at 8a480ca).
//!
//! On a GPU the tensor form stays, [`hmm_marginal_log_depth`]: the forward recursion
//! `alpha_t[k] = log_sum_exp_j(alpha_{t-1}[j] + log Gamma[j, k]) + log omega_t[k]` is a product
//! of `T` matrices in the log semiring, `M_t[j, k] = log Gamma[j, k] + log omega_t[k]`, and
//! matrix products associate, so the `T - 1` matrices are multiplied pairwise in `ceil(log2 T)`
//! rounds of whole-tensor operations: `O(log T)` kernel launches instead of `O(T)`.

// burn 0.22 deprecates ndarray; parvi still offers it as a backend, so the operation must serve it.
#![allow(deprecated)]

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Dispatch, Flex, TensorMetadata, backend_extension};
use burn::tensor::Tensor;
use burn::tensor::{Shape, Slice, TensorData};

use crate::ModelError;
use crate::fused::{f32_tensor, f32_values};
use crate::tensor_ops::{is_cpu, log_sum_exp};

/// Log of zero for the log-semiring identity: finite, so that no `inf - inf` reaches autodiff,
/// and far below any log density a model produces.
const LOG_ZERO: f64 = -1.0e30;

/// `log p(y_1..T)` of a hidden Markov model for every particle, `[n]`.
///
/// - `log_omega` `[n, T, K]`: `log p(y_t | z_t = k)`, the emission log densities;
/// - `log_gamma` `[n, K, K]`: `log P(z_t = k | z_{t-1} = j)` at `[j, k]` (each row of `Gamma` a
///   simplex, as Stan's `hmm_marginal` takes it);
/// - `log_rho` `[n, K]`: `log P(z_1 = k)`; pass zeros for the posteriordb HMMs, whose recursion
///   starts from the emissions alone.
///
/// Errors name the argument whose shape does not fit.
pub fn hmm_marginal(log_omega: Tensor<3>, log_gamma: Tensor<3>, log_rho: Tensor<2>) -> Result<Tensor<1>, ModelError> {
    check_shapes(&log_omega, &log_gamma, &log_rho)?;
    if is_cpu(&log_omega.device()) {
        let out = <Dispatch as HmmOps>::hmm_forward(
            log_omega.into_dispatch(),
            log_gamma.into_dispatch(),
            log_rho.into_dispatch(),
        );
        return Ok(Tensor::from_dispatch(out));
    }
    Ok(log_depth(log_omega, log_gamma, log_rho))
}

/// [`hmm_marginal`] by the log-semiring matrix product in `ceil(log2 T)` rounds of tensor
/// operations (the GPU form; see the module's documentation), on any device.
///
/// Errors name the argument whose shape does not fit.
pub fn hmm_marginal_log_depth(
    log_omega: Tensor<3>,
    log_gamma: Tensor<3>,
    log_rho: Tensor<2>,
) -> Result<Tensor<1>, ModelError> {
    check_shapes(&log_omega, &log_gamma, &log_rho)?;
    Ok(log_depth(log_omega, log_gamma, log_rho))
}

fn check_shapes(log_omega: &Tensor<3>, log_gamma: &Tensor<3>, log_rho: &Tensor<2>) -> Result<(), ModelError> {
    let [n, t, k] = log_omega.dims();
    let shape_error = |name: &str, got: Vec<usize>, want: String| ModelError::InvalidBlock {
        name: name.to_string(),
        reason: format!("hmm_marginal: shape {got:?}, expected {want}"),
    };
    if t == 0 || k == 0 {
        return Err(shape_error("log_omega", vec![n, t, k], "[particles, T >= 1, K >= 1]".into()));
    }
    if log_gamma.dims() != [n, k, k] {
        return Err(shape_error("log_gamma", log_gamma.dims().to_vec(), format!("[{n}, {k}, {k}]")));
    }
    if log_rho.dims() != [n, k] {
        return Err(shape_error("log_rho", log_rho.dims().to_vec(), format!("[{n}, {k}]")));
    }
    Ok(())
}

fn log_depth(log_omega: Tensor<3>, log_gamma: Tensor<3>, log_rho: Tensor<2>) -> Tensor<1> {
    let [n, t, k] = log_omega.dims();
    // alpha_1 = log rho + log omega_1.
    let first = log_rho + log_omega.clone().narrow(1, 0, 1).reshape([n, k]);
    if t == 1 {
        return log_sum_exp(first, 1).reshape([n]);
    }
    // M_t[j, k] = log Gamma[j, k] + log omega_t[k], t = 2..T: [n, T - 1, K, K].
    let emissions = log_omega.narrow(1, 1, t - 1).unsqueeze_dim::<4>(2); // [n, T-1, 1, K]
    let steps = log_gamma.unsqueeze_dim::<4>(1) + emissions;
    let product = log_matrix_product(steps); // [n, K, K]
    // log_sum_exp_k log_sum_exp_j (alpha_1[j] + P[j, k]).
    let paths = first.reshape([n, k, 1]) + product;
    log_sum_exp(paths.reshape([n, k * k]), 1).reshape([n])
}

/// The log-semiring product `M_1 M_2 ... M_m` of `[n, m, K, K]` matrices, `[n, K, K]`, by pairwise
/// products in `ceil(log2 m)` rounds (an odd count is padded with the identity).
fn log_matrix_product(mut mats: Tensor<4>) -> Tensor<3> {
    loop {
        let [n, m, k, _] = mats.dims();
        if m == 1 {
            return mats.reshape([n, k, k]);
        }
        if m % 2 == 1 {
            let identity = log_identity(n, k, &mats.device());
            mats = Tensor::cat(vec![mats, identity], 1);
        }
        let half = mats.dims()[1] / 2;
        let pairs = mats.reshape([n, half, 2, k, k]);
        let left = pairs.clone().narrow(2, 0, 1).reshape([n, half, k, k, 1]);
        let right = pairs.narrow(2, 1, 1).reshape([n, half, 1, k, k]);
        // C[i, l] = log_sum_exp_j (A[i, j] + B[j, l]): j is axis 3 of the broadcast sum.
        mats = log_sum_exp(left + right, 3).reshape([n, half, k, k]);
    }
}

/// `[n, 1, K, K]` log-semiring identities: 0 on the diagonal, [`LOG_ZERO`] elsewhere.
fn log_identity(n: usize, k: usize, device: &burn::tensor::Device) -> Tensor<4> {
    let eye = Tensor::<2>::eye(k, device);
    // eye * 0 + (1 - eye) * LOG_ZERO
    let log_eye = eye.neg().add_scalar(1.0).mul_scalar(LOG_ZERO);
    log_eye.reshape([1, 1, k, k]).repeat_dim(0, n)
}

/// The per-pass buffers of [`forward_backward`], kept across the particles of a batch: the
/// filtered `a_t` `[T K]`, the shifted emissions `omega_t` `[T K]` and the scales `c_t` `[T]`.
#[derive(Default)]
struct Scratch {
    filtered: Vec<f64>,
    omegas: Vec<f64>,
    scales: Vec<f64>,
}

/// Where a particle's gradients go: the upstream gradient `g`, then `d log_omega` `[T K]`,
/// `d log_gamma` `[K K]` and `d log_rho` `[K]` of its packed row.
type GradsOut<'a> = (f64, &'a mut [f32], &'a mut [f32], &'a mut [f32]);

/// The scaled forward-backward pass of one particle, in `f64` (Stan math's `hmm_marginal`):
/// `omega_t = exp(log omega_t - max_k log omega_t[k])`, `Gamma = exp(log Gamma - max)`, `rho`
/// likewise, `a_t = (a_{t-1}^T Gamma) o omega_t / c_t` with `c_t` its sum, so that
/// `log p = sum_t log c_t` plus the shifts. `scratch` is reused from particle to particle.
///
/// With `grads = Some((g, d_omega, d_gamma, d_rho))` it also runs the backward recursion
/// `b_t[j] = sum_k Gamma[j, k] omega_{t+1}[k] b_{t+1}[k] / c_{t+1}` and writes `g` times
/// `d log p / d log omega_t[k] = a_t[k] b_t[k]` (the posterior marginal), `d / d log Gamma[j, k]
/// = sum_t a_{t-1}[j] Gamma[j, k] omega_t[k] b_t[k] / c_t` (the expected transition count) and
/// `d / d log rho = a_1 o b_1`. A particle whose `log p` is `-inf` gets zero gradients; a NaN
/// anywhere gives NaN.
fn forward_backward(
    (log_omega, log_gamma, log_rho): (&[f32], &[f32], &[f32]),
    k: usize,
    scratch: &mut Scratch,
    grads: Option<GradsOut<'_>>,
) -> f64 {
    let t = log_omega.len() / k;
    let shift = |v: &[f32]| v.iter().map(|&x| f64::from(x)).fold(f64::NEG_INFINITY, f64::max);
    let exp_shifted = |v: &[f32], m: f64| -> Vec<f64> { v.iter().map(|&x| (f64::from(x) - m).exp()).collect() };
    let (gamma_max, rho_max) = (shift(log_gamma), shift(log_rho));
    if !gamma_max.is_finite() || !rho_max.is_finite() {
        return nonfinite(gamma_max.min(rho_max), grads);
    }
    let gamma = exp_shifted(log_gamma, gamma_max);
    let mut log_p = rho_max + (t - 1) as f64 * gamma_max;
    let Scratch { filtered, omegas, scales } = scratch;
    filtered.clear();
    filtered.resize(t * k, 0.0);
    omegas.clear();
    scales.clear();
    for step in 0..t {
        let row = &log_omega[step * k..(step + 1) * k];
        let m = shift(row);
        if !m.is_finite() {
            return nonfinite(m, grads);
        }
        log_p += m;
        omegas.extend(row.iter().map(|&x| (f64::from(x) - m).exp()));
        let omega = &omegas[step * k..];
        let (before, now) = filtered.split_at_mut(step * k);
        let now = &mut now[..k];
        if step == 0 {
            let rho = exp_shifted(log_rho, rho_max);
            now.iter_mut().zip(rho.iter().zip(omega)).for_each(|(a, (r, o))| *a = r * o);
        } else {
            let prev = &before[(step - 1) * k..];
            for (to, a) in now.iter_mut().enumerate() {
                *a = (0..k).map(|from| prev[from] * gamma[from * k + to]).sum::<f64>() * omega[to];
            }
        }
        let c: f64 = now.iter().sum();
        if !(c > 0.0 && c.is_finite()) {
            // Every path has probability zero (or the sum overflowed: NaN input).
            return nonfinite(if c == 0.0 { f64::NEG_INFINITY } else { f64::NAN }, grads);
        }
        now.iter_mut().for_each(|a| *a /= c);
        scales.push(c);
        log_p += c.ln();
    }
    let Some((g, d_omega, d_gamma, d_rho)) = grads else {
        return log_p;
    };
    d_gamma.iter_mut().for_each(|v| *v = 0.0);
    let mut acc_gamma = vec![0.0f64; k * k];
    let mut b = vec![1.0f64; k];
    let mut b_prev = vec![0.0f64; k];
    let mut w = vec![0.0f64; k];
    for step in (0..t).rev() {
        let a = &filtered[step * k..(step + 1) * k];
        for s in 0..k {
            d_omega[step * k + s] = (g * a[s] * b[s]) as f32;
        }
        if step == 0 {
            for s in 0..k {
                d_rho[s] = (g * a[s] * b[s]) as f32;
            }
            break;
        }
        // w_k = omega_t[k] b_t[k] / c_t, shared by the transition counts and b_{t-1}.
        let omega = &omegas[step * k..(step + 1) * k];
        w.iter_mut().zip(omega.iter().zip(&b)).for_each(|(w, (o, b))| *w = o * b / scales[step]);
        let a_prev = &filtered[(step - 1) * k..step * k];
        for from in 0..k {
            let mut sum = 0.0;
            for to in 0..k {
                let term = gamma[from * k + to] * w[to];
                acc_gamma[from * k + to] += a_prev[from] * term;
                sum += term;
            }
            b_prev[from] = sum;
        }
        std::mem::swap(&mut b, &mut b_prev);
    }
    d_gamma.iter_mut().zip(&acc_gamma).for_each(|(d, v)| *d = (g * v) as f32);
    log_p
}

/// The value and gradients of a particle whose forward pass met a non-finite value: `-inf` has
/// zero gradients (no path moves it), NaN (or `+inf`) NaN ones.
fn nonfinite(value: f64, grads: Option<GradsOut<'_>>) -> f64 {
    let value = if value == f64::NEG_INFINITY { value } else { f64::NAN };
    if let Some((_, d_omega, d_gamma, d_rho)) = grads {
        let fill = if value.is_nan() { f32::NAN } else { 0.0 };
        for d in [d_omega, d_gamma, d_rho] {
            d.iter_mut().for_each(|v| *v = fill);
        }
    }
    value
}

/// `[n]` log marginals of `[n, T, K]`, `[n, K, K]` and `[n, K]` host values.
fn host_forward(omega: &[f32], gamma: &[f32], rho: &[f32], [n, t, k]: [usize; 3]) -> Vec<f32> {
    let mut scratch = Scratch::default();
    (0..n)
        .map(|p| {
            let parts =
                (&omega[p * t * k..(p + 1) * t * k], &gamma[p * k * k..(p + 1) * k * k], &rho[p * k..(p + 1) * k]);
            forward_backward(parts, k, &mut scratch, None) as f32
        })
        .collect()
}

/// The gradients of `sum_i g_i log p_i`, packed a particle to a row: `[n, T K + K K + K]`
/// (`log_omega`'s, then `log_gamma`'s, then `log_rho`'s, each row-major).
fn host_grads(omega: &[f32], gamma: &[f32], rho: &[f32], upstream: &[f32], [n, t, k]: [usize; 3]) -> Vec<f32> {
    let width = packed_width(t, k);
    let mut out = vec![0f32; n * width];
    let mut scratch = Scratch::default();
    for (p, row) in out.chunks_exact_mut(width).enumerate() {
        let parts = (&omega[p * t * k..(p + 1) * t * k], &gamma[p * k * k..(p + 1) * k * k], &rho[p * k..(p + 1) * k]);
        let (d_omega, rest) = row.split_at_mut(t * k);
        let (d_gamma, d_rho) = rest.split_at_mut(k * k);
        forward_backward(parts, k, &mut scratch, Some((f64::from(upstream[p]), d_omega, d_gamma, d_rho)));
    }
    out
}

fn packed_width(t: usize, k: usize) -> usize {
    t * k + k * k + k
}

/// The forward algorithm as one operation with its own backward pass, per backend: native on
/// flex, a host read elsewhere (ndarray; GPUs take [`hmm_marginal_log_depth`] instead).
#[backend_extension(Autodiff, Flex, NdArray, Cube: cfg(feature = "wgpu"))]
pub(crate) trait HmmOps: Backend {
    /// `[n]` log marginal likelihoods.
    fn hmm_forward(
        log_omega: FloatTensor<Self>,
        log_gamma: FloatTensor<Self>,
        log_rho: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let dims = log_omega.shape().dims::<3>();
        let device = log_omega.device();
        let (omega, gamma, rho) = (read::<Self>(log_omega), read::<Self>(log_gamma), read::<Self>(log_rho));
        write::<Self, 1>(host_forward(&omega, &gamma, &rho, dims), [dims[0]], &device)
    }

    /// The gradients with respect to `log_omega`, `log_gamma` and `log_rho` for `grad` `[n]`,
    /// packed a particle to a row (see [`host_grads`]).
    fn hmm_grads(
        log_omega: FloatTensor<Self>,
        log_gamma: FloatTensor<Self>,
        log_rho: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let [n, t, k] = log_omega.shape().dims::<3>();
        let device = log_omega.device();
        let (omega, gamma, rho) = (read::<Self>(log_omega), read::<Self>(log_gamma), read::<Self>(log_rho));
        let packed = host_grads(&omega, &gamma, &rho, &read::<Self>(grad), [n, t, k]);
        write::<Self, 2>(packed, [n, packed_width(t, k)], &device)
    }
}

/// A tensor's values as `f32` on the host (a synchronising read).
fn read<B: Backend>(x: FloatTensor<B>) -> Vec<f32> {
    let data = burn::tensor::try_read_sync(B::float_into_data(x))
        .expect("a CPU backend reads synchronously")
        .expect("reading a CPU tensor");
    data.convert::<f32>().into_vec::<f32>().expect("f32 values after conversion")
}

fn write<B: Backend, const D: usize>(values: Vec<f32>, shape: [usize; D], device: &B::Device) -> FloatTensor<B> {
    B::float_from_data(TensorData::new(values, shape), device)
}

impl HmmOps for burn::backend::NdArray {}

#[cfg(feature = "wgpu")]
impl HmmOps for burn::backend::Cube {}

/// Native flex bodies for contiguous `f32` tensors (no copy in or out); other dtypes take the
/// host read.
impl HmmOps for Flex {
    fn hmm_forward(log_omega: FlexTensor, log_gamma: FlexTensor, log_rho: FlexTensor) -> FlexTensor {
        let dims = log_omega.shape().dims::<3>();
        let (o, g, r) = (log_omega.to_contiguous(), log_gamma.to_contiguous(), log_rho.to_contiguous());
        match (f32_values(&o), f32_values(&g), f32_values(&r)) {
            (Some(ov), Some(gv), Some(rv)) => f32_tensor(host_forward(ov, gv, rv, dims), [dims[0]]),
            _ => {
                let (omega, gamma, rho) = (read::<Flex>(o), read::<Flex>(g), read::<Flex>(r));
                f32_tensor(host_forward(&omega, &gamma, &rho, dims), [dims[0]])
            }
        }
    }

    fn hmm_grads(log_omega: FlexTensor, log_gamma: FlexTensor, log_rho: FlexTensor, grad: FlexTensor) -> FlexTensor {
        let [n, t, k] = log_omega.shape().dims::<3>();
        let (o, g, r, u) =
            (log_omega.to_contiguous(), log_gamma.to_contiguous(), log_rho.to_contiguous(), grad.to_contiguous());
        let packed = match (f32_values(&o), f32_values(&g), f32_values(&r), f32_values(&u)) {
            (Some(ov), Some(gv), Some(rv), Some(uv)) => host_grads(ov, gv, rv, uv, [n, t, k]),
            _ => host_grads(&read::<Flex>(o), &read::<Flex>(g), &read::<Flex>(r), &read::<Flex>(u), [n, t, k]),
        };
        f32_tensor(packed, [n, packed_width(t, k)])
    }
}

impl<B: HmmOps, C: CheckpointStrategy> HmmOps for Autodiff<B, C> {
    fn hmm_forward(
        log_omega: FloatTensor<Self>,
        log_gamma: FloatTensor<Self>,
        log_rho: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct HmmBackward;

        impl<B: HmmOps> Backward<B, 3> for HmmBackward {
            type State = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>);

            fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
                let grad = grads.consume::<B>(&ops.node);
                let (omega, gamma, rho) = ops.state;
                let [n, t, k] = omega.shape().dims::<3>();
                let packed = B::hmm_grads(omega, gamma, rho, grad);
                // The packed row's three blocks, each reshaped to its argument's shape.
                let blocks = [(0, t * k, vec![n, t, k]), (t * k, k * k, vec![n, k, k]), (t * k + k * k, k, vec![n, k])];
                for (node, (start, len, shape)) in ops.parents.into_iter().zip(blocks) {
                    if let Some(node) = node {
                        let block =
                            B::float_slice(packed.clone(), &[Slice::from(0..n), Slice::from(start..start + len)]);
                        grads.register::<B>(node.id, B::float_reshape(block, Shape::from(shape)));
                    }
                }
            }
        }

        let (omega, omega_node) = log_omega.into_parts();
        let (gamma, gamma_node) = log_gamma.into_parts();
        let (rho, rho_node) = log_rho.into_parts();
        match HmmBackward.prepare::<C>([omega_node, gamma_node, rho_node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let out = B::hmm_forward(omega.clone(), gamma.clone(), rho.clone());
                prep.finish((omega, gamma, rho), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::hmm_forward(omega, gamma, rho)),
        }
    }
}
