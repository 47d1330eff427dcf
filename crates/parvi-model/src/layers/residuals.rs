//! A whole network's residual sum of squares as one burn custom operation: the layers' forward
//! passes, the residuals against the targets and their sum, and a backward pass that walks the
//! layers down once and writes every layer's parameter gradient into one `[n, dim]` buffer.
//!
//! Chaining the fused layers and `fused::sum_squared_residuals` costs one autodiff node per layer
//! plus one for the sum, a zero-filled `[n, dim]` gradient per layer that autodiff then adds up,
//! and, between two layers, the input gradient `[B, n, k]` as its own buffer before the layer
//! below applies its activation's derivative to it in a second pass. Here a one-output layer's
//! input gradient, the layer below's activation derivative and its bias sums are one pass, in
//! place over the saved activations (which nothing else reads).
//!
//! The same node can carry the rest of a Gaussian regression's log-joint with sampled
//! precisions (`stack_log_joint`): the noise precision's term with the residual sum as its
//! statistic and the weights' precision's term with their sum of squares, so that the network,
//! the prior and both precisions write one gradient buffer, where separate nodes wrote four
//! (the network, the sum of squares, the precision terms, and a `cat` of the statistics).
//!
//! Only the particles are differentiated: the rows and targets must be untracked (data), which
//! [`super::DenseStack::sum_squared_residuals`] checks before it takes this path.

// burn 0.22 deprecates ndarray; parvi still offers it as a backend, so the op must serve it.
#![allow(deprecated)]

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, TensorMetadata, backend_extension};
use burn::tensor::{Shape, Slice};

use super::ops::{DenseSpec, generic};
use crate::fused::{PrecisionTerms, generic as fused_generic};

/// The layers of a network, input side first; the last has one output unit and no activation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StackSpec {
    pub layers: Vec<DenseSpec>,
}

/// What [`StackResidualOps::stack_log_joint`] adds around the residual sum: the log-precision
/// terms (`crate::fused::log_precision_terms`) whose statistics are the residual sum and, for a
/// second precision, the sum of squares of the columns `squares` (`(start, len)`).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct JointSpec {
    pub terms: PrecisionTerms,
    pub squares: Option<(usize, usize)>,
}

impl JointSpec {
    /// How many precisions: 1 (the residuals' alone) or 2 (and the squares').
    pub fn k(&self) -> usize {
        self.terms.shape.len()
    }
}

/// The network's residual sum of squares, per backend: one operation for the whole network.
#[backend_extension(Autodiff, Flex, NdArray, Cube: cfg(feature = "wgpu"))]
pub(crate) trait StackResidualOps: Backend {
    /// `sum_r (y[r] - f_i(x_r))^2` for every particle `i`, `[n, 1]`, for rows `x` `[B, k]` and
    /// targets `y` `[B, 1]`.
    fn stack_residuals(
        x: FloatTensor<Self>,
        y: FloatTensor<Self>,
        particles: FloatTensor<Self>,
        stack: StackSpec,
    ) -> FloatTensor<Self> {
        generic_stack::forward::<Self>(x, y, particles, &stack).0
    }

    /// The log-precision terms of `joint` `[n, 1]` with the residual sum (and a sum of squares
    /// of columns) as their statistics: the whole Gaussian log-joint of a regression network
    /// with sampled precisions, up to a constant, as one operation.
    fn stack_log_joint(
        x: FloatTensor<Self>,
        y: FloatTensor<Self>,
        particles: FloatTensor<Self>,
        stack: StackSpec,
        joint: JointSpec,
    ) -> FloatTensor<Self> {
        let (sums, _) = generic_stack::forward::<Self>(x, y, particles.clone(), &stack);
        let stats = generic_stack::joint_stats::<Self>(sums, particles.clone(), &joint);
        fused_generic::precision_terms::<Self>(particles, stats, &joint.terms)
    }
}

/// The forward pass that keeps what the backward pass reads, and the backward pass, on the
/// inner backend of autodiff (not dispatched: only [`StackResidualOps`]' autodiff body calls them).
pub(crate) trait StackResidualKernels: Backend {
    /// The sums `[n, 1]` and every layer's output `[B, n, o_l]`.
    fn stack_residuals_forward(
        x: FloatTensor<Self>,
        y: FloatTensor<Self>,
        particles: FloatTensor<Self>,
        stack: &StackSpec,
    ) -> (FloatTensor<Self>, Vec<FloatTensor<Self>>) {
        generic_stack::forward::<Self>(x, y, particles, stack)
    }

    /// The gradient `[n, dim]` of the sums weighted by `grad` `[n, 1]` with respect to the
    /// particles (zero outside the network's columns), from the forward pass's layer outputs.
    fn stack_residuals_grad(
        x: FloatTensor<Self>,
        y: FloatTensor<Self>,
        particles: FloatTensor<Self>,
        outputs: Vec<FloatTensor<Self>>,
        grad: FloatTensor<Self>,
        stack: &StackSpec,
    ) -> FloatTensor<Self> {
        generic_stack::grad::<Self>(x, y, particles, outputs, grad, stack)
    }

    /// The terms `[n, 1]` of [`StackResidualOps::stack_log_joint`], their statistics `[n, k]`
    /// and every layer's output.
    fn stack_joint_forward(
        x: FloatTensor<Self>,
        y: FloatTensor<Self>,
        particles: FloatTensor<Self>,
        stack: &StackSpec,
        joint: &JointSpec,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, Vec<FloatTensor<Self>>) {
        generic_stack::joint_forward::<Self>(x, y, particles, stack, joint)
    }

    /// The gradient `[n, dim]` of the terms weighted by `grad` `[n, 1]` with respect to the
    /// particles: the network's (through the residual sum), the squared columns' and the
    /// precisions' parts (flex writes them into one buffer; the primitive-op body adds three).
    #[allow(clippy::too_many_arguments)]
    fn stack_joint_grad(
        x: FloatTensor<Self>,
        y: FloatTensor<Self>,
        particles: FloatTensor<Self>,
        outputs: Vec<FloatTensor<Self>>,
        stats: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        stack: &StackSpec,
        joint: &JointSpec,
    ) -> FloatTensor<Self> {
        generic_stack::joint_grad::<Self>(x, y, particles, outputs, stats, grad, stack, joint)
    }
}

impl StackResidualOps for burn::backend::NdArray {}
impl StackResidualKernels for burn::backend::NdArray {}

#[cfg(feature = "wgpu")]
impl StackResidualOps for burn::backend::Cube {}
#[cfg(feature = "wgpu")]
impl StackResidualKernels for burn::backend::Cube {}

/// One node for the whole network and its residual sum: the forward keeps the layer outputs,
/// the backward is one inner-backend call.
impl<B: StackResidualOps + StackResidualKernels, C: CheckpointStrategy> StackResidualOps for Autodiff<B, C> {
    fn stack_residuals(
        x: FloatTensor<Self>,
        y: FloatTensor<Self>,
        particles: FloatTensor<Self>,
        stack: StackSpec,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct StackResidualsBackward;

        impl<B: StackResidualKernels> Backward<B, 1> for StackResidualsBackward {
            /// The rows, the targets, the particles, every layer's output, and the layers.
            type State = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, Vec<FloatTensor<B>>, StackSpec);

            fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
                let [particles_node] = ops.parents;
                let grad = grads.consume::<B>(&ops.node);
                let (x, y, particles, outputs, stack) = ops.state;
                if let Some(node) = particles_node {
                    grads.register::<B>(node.id, B::stack_residuals_grad(x, y, particles, outputs, grad, &stack));
                }
            }
        }

        // The rows and targets are data (the public function checks that they are untracked):
        // only the particles have a node.
        let (x, _) = x.into_parts();
        let (y, _) = y.into_parts();
        let (particles, particles_node) = particles.into_parts();
        match StackResidualsBackward.prepare::<C>([particles_node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (sums, outputs) = B::stack_residuals_forward(x.clone(), y.clone(), particles.clone(), &stack);
                prep.finish((x, y, particles, outputs, stack), sums)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::stack_residuals(x, y, particles, stack)),
        }
    }

    fn stack_log_joint(
        x: FloatTensor<Self>,
        y: FloatTensor<Self>,
        particles: FloatTensor<Self>,
        stack: StackSpec,
        joint: JointSpec,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct StackJointBackward;

        impl<B: StackResidualKernels> Backward<B, 1> for StackJointBackward {
            /// The rows, the targets, the particles, every layer's output, the statistics, and
            /// the layers and terms.
            #[allow(clippy::type_complexity)]
            type State = (
                FloatTensor<B>,
                FloatTensor<B>,
                FloatTensor<B>,
                Vec<FloatTensor<B>>,
                FloatTensor<B>,
                StackSpec,
                JointSpec,
            );

            fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
                let [particles_node] = ops.parents;
                let grad = grads.consume::<B>(&ops.node);
                let (x, y, particles, outputs, stats, stack, joint) = ops.state;
                if let Some(node) = particles_node {
                    let g = B::stack_joint_grad(x, y, particles, outputs, stats, grad, &stack, &joint);
                    grads.register::<B>(node.id, g);
                }
            }
        }

        // As `stack_residuals`: only the particles have a node.
        let (x, _) = x.into_parts();
        let (y, _) = y.into_parts();
        let (particles, particles_node) = particles.into_parts();
        match StackJointBackward.prepare::<C>([particles_node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (terms, stats, outputs) =
                    B::stack_joint_forward(x.clone(), y.clone(), particles.clone(), &stack, &joint);
                prep.finish((x, y, particles, outputs, stats, stack, joint), terms)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::stack_log_joint(x, y, particles, stack, joint)),
        }
    }
}

/// The network and its gradient from the layer's primitive-op bodies: every backend without
/// native kernels runs these.
pub(crate) mod generic_stack {
    use super::*;

    pub fn forward<B: Backend>(
        x: FloatTensor<B>,
        y: FloatTensor<B>,
        particles: FloatTensor<B>,
        stack: &StackSpec,
    ) -> (FloatTensor<B>, Vec<FloatTensor<B>>) {
        let [b, k] = x.shape().dims::<2>();
        let mut input = B::float_reshape(x, Shape::new([b, 1, k]));
        let mut outputs = Vec::with_capacity(stack.layers.len());
        for &spec in &stack.layers {
            input = generic::forward::<B>(input, particles.clone(), spec);
            outputs.push(input.clone());
        }
        let n = particles.shape()[0];
        let f = B::float_reshape(input, Shape::new([b, n]));
        let r = B::float_sub(y, f);
        let sums = B::float_reshape(B::float_sum_dim(B::float_mul(r.clone(), r), 0), Shape::new([n, 1]));
        (sums, outputs)
    }

    /// The statistics `[n, k]` of `joint`: the residual sums `[n, 1]`, beside them the sums of
    /// squares of the columns `joint.squares` when there are two precisions.
    pub fn joint_stats<B: Backend>(
        sums: FloatTensor<B>,
        particles: FloatTensor<B>,
        joint: &JointSpec,
    ) -> FloatTensor<B> {
        match joint.squares {
            Some((start, len)) => {
                B::float_cat(vec![sums, crate::fused::generic::sum_squares::<B>(particles, start, len)], 1)
            }
            None => sums,
        }
    }

    pub fn grad<B: Backend>(
        x: FloatTensor<B>,
        y: FloatTensor<B>,
        particles: FloatTensor<B>,
        outputs: Vec<FloatTensor<B>>,
        grad: FloatTensor<B>,
        stack: &StackSpec,
    ) -> FloatTensor<B> {
        let [b, k] = x.shape().dims::<2>();
        let n = particles.shape()[0];
        let last = outputs.len() - 1;
        // d/df of sum_r (y_r - f_ri)^2 g_i: -2 (y_r - f_ri) g_i, as [B, n, 1].
        let f = B::float_reshape(outputs[last].clone(), Shape::new([b, n]));
        let g = B::float_reshape(grad, Shape::new([1, n]));
        let df = B::float_mul(B::float_mul_scalar(B::float_sub(y, f), (-2f32).into()), g);
        let mut upstream = B::float_reshape(df, Shape::new([b, n, 1]));
        let mut total: Option<FloatTensor<B>> = None;
        for l in (0..=last).rev() {
            let spec = stack.layers[l];
            let input =
                if l == 0 { B::float_reshape(x.clone(), Shape::new([b, 1, k])) } else { outputs[l - 1].clone() };
            let pre = generic::pre_grad::<B>(outputs[l].clone(), upstream, spec.activation);
            let params = generic::params_grad::<B>(input, pre.clone(), particles.clone(), spec);
            total = Some(match total {
                Some(t) => B::float_add(t, params),
                None => params,
            });
            if l == 0 {
                break;
            }
            upstream = generic::input_grad::<B>(pre, particles.clone(), spec, false);
        }
        total.expect("a stack has at least one layer")
    }

    /// The terms `[n, 1]`, statistics `[n, k]` and layer outputs of a joint, from the network's
    /// forward pass on `B` and the precision terms' primitive-op bodies.
    #[allow(clippy::type_complexity)]
    pub fn joint_forward<B: StackResidualKernels>(
        x: FloatTensor<B>,
        y: FloatTensor<B>,
        particles: FloatTensor<B>,
        stack: &StackSpec,
        joint: &JointSpec,
    ) -> (FloatTensor<B>, FloatTensor<B>, Vec<FloatTensor<B>>) {
        let (sums, outputs) = B::stack_residuals_forward(x, y, particles.clone(), stack);
        let stats = joint_stats::<B>(sums, particles.clone(), joint);
        let terms = fused_generic::precision_terms::<B>(particles, stats.clone(), &joint.terms);
        (terms, stats, outputs)
    }

    /// The particles' gradient of a joint: the network's part (the residual sum's weight
    /// `-e^u c2 g` through `B`'s network gradient), the squared columns' and the precisions',
    /// added up from three buffers.
    #[allow(clippy::too_many_arguments)]
    pub fn joint_grad<B: StackResidualKernels>(
        x: FloatTensor<B>,
        y: FloatTensor<B>,
        particles: FloatTensor<B>,
        outputs: Vec<FloatTensor<B>>,
        stats: FloatTensor<B>,
        grad: FloatTensor<B>,
        stack: &StackSpec,
        joint: &JointSpec,
    ) -> FloatTensor<B> {
        let n = particles.shape()[0];
        let dstats = fused_generic::precision_terms_stats_grad::<B>(particles.clone(), grad.clone(), &joint.terms);
        let column = |j: usize| B::float_slice(dstats.clone(), &[Slice::from(0..n), Slice::from(j..j + 1)]);
        let network = B::stack_residuals_grad(x, y, particles.clone(), outputs, column(0), stack);
        let precisions = fused_generic::precision_terms_x_grad::<B>(particles.clone(), stats, grad, &joint.terms);
        let total = B::float_add(network, precisions);
        match joint.squares {
            Some((start, len)) => {
                B::float_add(total, fused_generic::sum_squares_grad::<B>(particles, column(1), start, len))
            }
            None => total,
        }
    }
}
