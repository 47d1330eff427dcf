//! The batched Cholesky factorisation and triangular solve as a burn backend extension: one
//! operation each, with a hand-written backward pass, so that autodiff records one node for a
//! factorisation (where the column-by-column tensor-op Cholesky records `O(K)` slices, products
//! and assignments, each with its own gradient buffers).
//!
//! The bodies here are built from burn's primitive operations, so every backend runs them; flex
//! overrides the forward passes with native loops on its buffers (`flex.rs`).

// burn 0.22 deprecates ndarray; parvi still offers it as a backend, so the ops must serve it.
#![allow(deprecated)]

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, TensorMetadata, backend_extension};
use burn::tensor::{Shape, Slice, TensorData};

/// Which triangle of the stored matrix a solve reads, and whether it solves with its transpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SolveSpec {
    /// The lower triangle (diagonal included) holds the matrix; else the upper one.
    pub lower: bool,
    /// Solve `T^T X = B` instead of `T X = B`.
    pub transpose: bool,
}

impl SolveSpec {
    /// Whether the matrix solved with (`T` or `T^T`) is lower triangular: forward substitution.
    pub fn effective_lower(self) -> bool {
        self.lower != self.transpose
    }
}

/// The factorisation, the solve and the Cholesky's backward, per backend.
#[backend_extension(Autodiff, Flex, NdArray, Cube: cfg(feature = "wgpu"))]
pub(crate) trait LinalgOps: Backend {
    /// Lower Cholesky factors `[m, K, K]` of the symmetric `a` `[m, K, K]` (its lower triangle is
    /// read), every pivot below `floor` raised to `floor` (NaN stays NaN).
    fn cholesky(a: FloatTensor<Self>, floor: f64) -> FloatTensor<Self> {
        generic::cholesky::<Self>(a, floor)
    }

    /// `X` `[m, K, M]` with `T X = B` (or `T^T X = B`), `T` the triangle `spec` names of `t`
    /// `[m, K, K]` and `b` `[m, K, M]`.
    fn triangular_solve(t: FloatTensor<Self>, b: FloatTensor<Self>, spec: SolveSpec) -> FloatTensor<Self> {
        generic::triangular_solve::<Self>(t, b, spec)
    }

    /// The gradient with respect to `a` (symmetric) from the factor `l` and the gradient with
    /// respect to it.
    fn cholesky_grad(l: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        generic::cholesky_grad::<Self>(l, grad)
    }
}

impl LinalgOps for burn::backend::NdArray {}

#[cfg(feature = "wgpu")]
impl LinalgOps for burn::backend::Cube {}

impl<B: LinalgOps, C: CheckpointStrategy> LinalgOps for Autodiff<B, C> {
    fn cholesky(a: FloatTensor<Self>, floor: f64) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct CholeskyBackward;

        impl<B: LinalgOps> Backward<B, 1> for CholeskyBackward {
            /// The factor: the backward needs nothing else.
            type State = FloatTensor<B>;

            fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
                let [node] = ops.parents;
                let grad = grads.consume::<B>(&ops.node);
                if let Some(node) = node {
                    grads.register::<B>(node.id, B::cholesky_grad(ops.state, grad));
                }
            }
        }

        let (a, node) = a.into_parts();
        match CholeskyBackward.prepare::<C>([node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let l = B::cholesky(a, floor);
                prep.finish(l.clone(), l)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::cholesky(a, floor)),
        }
    }

    fn triangular_solve(t: FloatTensor<Self>, b: FloatTensor<Self>, spec: SolveSpec) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct SolveBackward;

        impl<B: LinalgOps> Backward<B, 2> for SolveBackward {
            /// The matrix, the solution and which triangle was used.
            type State = (FloatTensor<B>, FloatTensor<B>, SolveSpec);

            fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
                let [t_node, b_node] = ops.parents;
                let grad = grads.consume::<B>(&ops.node);
                let (t, x, spec) = ops.state;
                // X = T^-1 B: B_bar = T^-T X_bar, T_bar = -B_bar X^T on T's triangle (Giles 2008,
                // "Collected matrix derivative results", section 2.3.1); solving with T^T
                // transposes T_bar.
                let flipped = SolveSpec { transpose: !spec.transpose, ..spec };
                let b_bar = B::triangular_solve(t, grad, flipped);
                if let Some(node) = t_node {
                    let outer = if spec.transpose {
                        B::float_matmul(x, B::float_swap_dims(b_bar.clone(), 1, 2))
                    } else {
                        B::float_matmul(b_bar.clone(), B::float_swap_dims(x, 1, 2))
                    };
                    let t_bar = generic::triangle::<B>(B::float_neg(outer), spec.lower, 1.0);
                    grads.register::<B>(node.id, t_bar);
                }
                if let Some(node) = b_node {
                    grads.register::<B>(node.id, b_bar);
                }
            }
        }

        let (t, t_node) = t.into_parts();
        let (b, b_node) = b.into_parts();
        match SolveBackward.prepare::<C>([t_node, b_node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let x = B::triangular_solve(t.clone(), b, spec);
                prep.finish((t, x.clone(), spec), x)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::triangular_solve(t, b, spec)),
        }
    }
}

/// The operations from burn's primitive operations: every backend without native bodies runs
/// these, flex too for dtypes other than `f32`/`f64`.
pub(crate) mod generic {
    use super::*;

    fn batch(m: usize) -> Slice {
        Slice::from(0..m)
    }

    /// Column by column (Cholesky-Crout): `K` rounds of a `[m, K - j, j] x [m, j, 1]` product.
    pub fn cholesky<B: Backend>(a: FloatTensor<B>, floor: f64) -> FloatTensor<B> {
        let [m, k, _] = a.shape().dims::<3>();
        let mut l = B::float_zeros(Shape::new([m, k, k]), &a.device(), a.dtype().into());
        for j in 0..k {
            let mut column = B::float_slice(a.clone(), &[batch(m), Slice::from(j..k), Slice::from(j..j + 1)]);
            if j > 0 {
                let below = B::float_slice(l.clone(), &[batch(m), Slice::from(j..k), Slice::from(0..j)]);
                let row = B::float_slice(l.clone(), &[batch(m), Slice::from(j..j + 1), Slice::from(0..j)]);
                column = B::float_sub(column, B::float_matmul(below, B::float_swap_dims(row, 1, 2)));
            }
            let pivot = B::float_slice(column.clone(), &[batch(m), Slice::from(0..1), Slice::from(0..1)]);
            let root = B::float_sqrt(B::float_clamp_min(pivot, floor.into()));
            l = B::float_slice_assign(
                l,
                &[batch(m), Slice::from(j..k), Slice::from(j..j + 1)],
                B::float_div(column, root),
            );
        }
        l
    }

    /// Row by row: `K` rounds of a `[m, 1, i] x [m, i, M]` product, forward or backward.
    pub fn triangular_solve<B: Backend>(t: FloatTensor<B>, b: FloatTensor<B>, spec: SolveSpec) -> FloatTensor<B> {
        let [m, k, cols] = b.shape().dims::<3>();
        let mut x = B::float_zeros(Shape::new([m, k, cols]), &b.device(), b.dtype().into());
        let order: Vec<usize> = if spec.effective_lower() { (0..k).collect() } else { (0..k).rev().collect() };
        for i in order {
            // The solved rows that row i depends on.
            let known = if spec.effective_lower() { 0..i } else { i + 1..k };
            let mut rhs = B::float_slice(b.clone(), &[batch(m), Slice::from(i..i + 1), Slice::from(0..cols)]);
            if !known.is_empty() {
                // Row i of T over the known columns, [m, 1, |known|].
                let coeffs = if spec.transpose {
                    let c = B::float_slice(t.clone(), &[batch(m), Slice::from(known.clone()), Slice::from(i..i + 1)]);
                    B::float_swap_dims(c, 1, 2)
                } else {
                    B::float_slice(t.clone(), &[batch(m), Slice::from(i..i + 1), Slice::from(known.clone())])
                };
                let solved = B::float_slice(x.clone(), &[batch(m), Slice::from(known), Slice::from(0..cols)]);
                rhs = B::float_sub(rhs, B::float_matmul(coeffs, solved));
            }
            let diag = B::float_slice(t.clone(), &[batch(m), Slice::from(i..i + 1), Slice::from(i..i + 1)]);
            x = B::float_slice_assign(
                x,
                &[batch(m), Slice::from(i..i + 1), Slice::from(0..cols)],
                B::float_div(rhs, diag),
            );
        }
        x
    }

    /// `x`'s lower (or upper) triangle with its diagonal scaled by `diag`, zero elsewhere.
    pub fn triangle<B: Backend>(x: FloatTensor<B>, lower: bool, diag: f64) -> FloatTensor<B> {
        let [_, k, _] = x.shape().dims::<3>();
        let weights: Vec<f64> = (0..k * k)
            .map(|idx| {
                let (i, j) = (idx / k, idx % k);
                if i == j {
                    diag
                } else if (i > j) == lower {
                    1.0
                } else {
                    0.0
                }
            })
            .collect();
        let data = TensorData::new(weights, [1, k, k]).convert_dtype(x.dtype());
        let mask = B::float_from_data(data, &x.device());
        B::float_mul(x, mask)
    }

    /// Reverse mode of `L = chol(A)` (Murray 2016, "Differentiation of the Cholesky
    /// decomposition", the reverse-mode formula, in the symmetric convention of PyTorch's
    /// `cholesky_backward`):
    /// `P = Phi(L^T L_bar)`, `M = L^-T P L^-1`, `A_bar = (M + M^T) / 2`, with `Phi` the lower
    /// triangle and half the diagonal. Only `L_bar`'s lower triangle reaches `Phi(L^T L_bar)`'s
    /// lower triangle, so gradients on `L`'s structural zeros drop out.
    pub fn cholesky_grad<B: LinalgOps>(l: FloatTensor<B>, grad: FloatTensor<B>) -> FloatTensor<B> {
        let p = triangle::<B>(B::float_matmul(B::float_swap_dims(l.clone(), 1, 2), grad), true, 0.5);
        let upper_solve = SolveSpec { lower: true, transpose: true };
        // L^-T P, then (L^-T P) L^-1 = (L^-T (L^-T P)^T)^T.
        let left = B::triangular_solve(l.clone(), p, upper_solve);
        let m = B::float_swap_dims(B::triangular_solve(l, B::float_swap_dims(left, 1, 2), upper_solve), 1, 2);
        let sym = B::float_add(m.clone(), B::float_swap_dims(m, 1, 2));
        B::float_mul_scalar(sym, 0.5f64.into())
    }
}
