//! Gradients by burn's autodiff: scores of a log-joint, and gradients of any scalar built from
//! tensors (kernel bandwidths, induced points) for engines that learn those.

use burn::tensor::Tensor;

use crate::{LogDensity, Minibatch, ModelError};

/// `log p` and its gradient for every particle, from one forward and one backward pass.
#[derive(Clone, Debug)]
pub struct Score {
    /// `[n]`
    pub log_prob: Tensor<1>,
    /// `[n, dim]`
    pub grad: Tensor<2>,
}

/// The value of `f` (a batch of scalars `[k]`) and the gradient of its sum with respect to `x`.
///
/// `x` is moved onto its device's autodiff twin and marked as a leaf, so it may come from a plain
/// or an autodiff device. Both results are returned without autodiff graphs attached.
pub fn value_and_grad<const D: usize>(
    x: Tensor<D>,
    f: impl FnOnce(Tensor<D>) -> Tensor<1>,
) -> Result<(Tensor<1>, Tensor<D>), ModelError> {
    let leaf = x.detach().autodiff().require_grad();
    let value = f(leaf.clone());
    if !value.is_tracked() {
        release_graph(&leaf);
        return Err(ModelError::NoGradient);
    }
    let grads = value.clone().sum().backward();
    let grad = leaf.grad(&grads).ok_or(ModelError::NoGradient)?;
    Ok((value.detach(), grad))
}

/// Like [`value_and_grad`] for a function of two tensors: gradients with respect to both.
#[allow(clippy::type_complexity)]
pub fn value_and_grad2<const D1: usize, const D2: usize>(
    x: Tensor<D1>,
    y: Tensor<D2>,
    f: impl FnOnce(Tensor<D1>, Tensor<D2>) -> Tensor<1>,
) -> Result<(Tensor<1>, Tensor<D1>, Tensor<D2>), ModelError> {
    let lx = x.detach().autodiff().require_grad();
    let ly = y.detach().autodiff().require_grad();
    let value = f(lx.clone(), ly.clone());
    if !value.is_tracked() {
        release_graph(&lx);
        release_graph(&ly);
        return Err(ModelError::NoGradient);
    }
    let grads = value.clone().sum().backward();
    let gx = lx.grad(&grads).ok_or(ModelError::NoGradient)?;
    let gy = ly.grad(&grads).ok_or(ModelError::NoGradient)?;
    Ok((value.detach(), gx, gy))
}

/// Frees the graph a forward pass built from `leaf` when no backward will: a model that failed
/// part-way (an ODE solve past its step budget) returns an untracked NaN and drops its tensors,
/// but burn 0.22 keeps their nodes, and sweeps such orphans one layer per later backward over
/// every node it holds. A Lotka-Volterra fit's failed solves (thousands of nodes deep) piled up
/// so that the sweep took 88% of the fit's time. A backward through the leaf's graph frees every
/// node no live tensor holds, in one pass.
fn release_graph<const D: usize>(leaf: &Tensor<D>) {
    let _ = leaf.clone().sum().backward();
}

/// The score of `model` at every particle: one batched forward and one backward pass.
pub fn score(model: &dyn LogDensity, particles: Tensor<2>, batch: Option<&Minibatch>) -> Result<Score, ModelError> {
    let [_, dim] = particles.dims();
    if dim != model.dim() {
        return Err(ModelError::DimensionMismatch { expected: model.dim(), got: dim });
    }
    // A model that failed part-way returns an untracked NaN: its own error is the cause, not a
    // density without a gradient.
    let (log_prob, grad) = value_and_grad(particles, |x| model.log_prob(x, batch)).map_err(|e| match e {
        ModelError::NoGradient => model.take_error().unwrap_or(ModelError::NoGradient),
        other => other,
    })?;
    Ok(Score { log_prob, grad })
}

/// `log p` without building a graph (gradient-free engines, evaluation).
pub fn log_prob_value(
    model: &dyn LogDensity,
    particles: Tensor<2>,
    batch: Option<&Minibatch>,
) -> Result<Tensor<1>, ModelError> {
    let [_, dim] = particles.dims();
    if dim != model.dim() {
        return Err(ModelError::DimensionMismatch { expected: model.dim(), got: dim });
    }
    Ok(model.log_prob(particles.detach(), batch).detach())
}
