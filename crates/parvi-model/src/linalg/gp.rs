//! Stan's `gp_exp_quad_cov` as one autodiff node: `K = alpha^2 exp(-D / (2 rho^2))` for squared
//! distances `D` `[1, N, N]` and per-particle `alpha`, `rho` `[n, 1]`. As a chain of burn
//! operations it records six nodes and recomputes `exp` over `[n, N, N]` in its backward pass
//! (11% of a gp_pois_regr fit in `f64`); here the backward reuses `K`:
//! `d/d alpha = sum G K * 2 / alpha`, `d/d rho = sum G K D / rho^3`, `d/d D = -sum_n G K / (2 rho^2)`.
//! The bodies are burn's primitive operations, so every backend runs them.

// burn 0.22 deprecates ndarray; parvi still offers it as a backend, so the op must serve it.
#![allow(deprecated)]

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, TensorMetadata, backend_extension};
use burn::tensor::Shape;

/// The covariance and its backward, per backend (primitive operations on all of them).
#[backend_extension(Autodiff, Flex, NdArray, Cube: cfg(feature = "wgpu"))]
pub(crate) trait GpKernelOps: Backend {
    /// `[n, N, N]`: `alpha^2 exp(-sq / (2 rho^2))` for `sq` `[1, N, N]`, `alpha`, `rho` `[n, 1]`.
    fn exp_quad(sq: FloatTensor<Self>, alpha: FloatTensor<Self>, rho: FloatTensor<Self>) -> FloatTensor<Self> {
        let [n, _] = alpha.shape().dims::<2>();
        let alpha_sq = Self::float_reshape(Self::float_mul(alpha.clone(), alpha), Shape::new([n, 1, 1]));
        let scaled = Self::float_mul(sq, inv_two_rho_sq::<Self>(rho));
        Self::float_mul(Self::float_exp(Self::float_neg(scaled)), alpha_sq)
    }
}

/// `1 / (2 rho^2)` as `[n, 1, 1]`.
fn inv_two_rho_sq<B: Backend>(rho: FloatTensor<B>) -> FloatTensor<B> {
    let [n, _] = rho.shape().dims::<2>();
    let two_rho_sq = B::float_mul_scalar(B::float_mul(rho.clone(), rho), 2f32.into());
    B::float_reshape(B::float_recip(two_rho_sq), Shape::new([n, 1, 1]))
}

/// `[n, 1]` sums of a `[n, N, N]` tensor over its last two axes.
fn sum_matrices<B: Backend>(x: FloatTensor<B>) -> FloatTensor<B> {
    let [n, _, _] = x.shape().dims::<3>();
    B::float_reshape(B::float_sum_dim(B::float_sum_dim(x, 2), 1), Shape::new([n, 1]))
}

impl GpKernelOps for burn::backend::Flex {}

impl GpKernelOps for burn::backend::NdArray {}

#[cfg(feature = "wgpu")]
impl GpKernelOps for burn::backend::Cube {}

impl<B: GpKernelOps, C: CheckpointStrategy> GpKernelOps for Autodiff<B, C> {
    fn exp_quad(sq: FloatTensor<Self>, alpha: FloatTensor<Self>, rho: FloatTensor<Self>) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct ExpQuadBackward;

        impl<B: GpKernelOps> Backward<B, 3> for ExpQuadBackward {
            /// `D`, `alpha`, `rho` and the output `K`.
            type State = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, FloatTensor<B>);

            fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
                let [sq_node, alpha_node, rho_node] = ops.parents;
                let grad = grads.consume::<B>(&ops.node);
                let (sq, alpha, rho, k) = ops.state;
                let gk = B::float_mul(grad, k);
                if let Some(node) = alpha_node {
                    let d = B::float_div(B::float_mul_scalar(sum_matrices::<B>(gk.clone()), 2f32.into()), alpha);
                    grads.register::<B>(node.id, d);
                }
                if let Some(node) = sq_node {
                    let [_, points, _] = sq.shape().dims::<3>();
                    let per_particle = B::float_mul(gk.clone(), inv_two_rho_sq::<B>(rho.clone()));
                    let summed = B::float_sum_dim(B::float_neg(per_particle), 0);
                    grads.register::<B>(node.id, B::float_reshape(summed, Shape::new([1, points, points])));
                }
                if let Some(node) = rho_node {
                    let rho_cubed = B::float_mul(B::float_mul(rho.clone(), rho.clone()), rho);
                    let d = B::float_div(sum_matrices::<B>(B::float_mul(gk, sq)), rho_cubed);
                    grads.register::<B>(node.id, d);
                }
            }
        }

        let (sq, sq_node) = sq.into_parts();
        let (alpha, alpha_node) = alpha.into_parts();
        let (rho, rho_node) = rho.into_parts();
        match ExpQuadBackward.prepare::<C>([sq_node, alpha_node, rho_node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let k = B::exp_quad(sq.clone(), alpha.clone(), rho.clone());
                prep.finish((sq, alpha, rho, k.clone()), k)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::exp_quad(sq, alpha, rho)),
        }
    }
}
