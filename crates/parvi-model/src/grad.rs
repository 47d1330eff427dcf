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

/// A batched score for a sampler, whose proposals' failures are theirs and not the run's.
#[derive(Clone, Debug)]
pub struct RowScore {
    /// `log p` and its gradient; NaN at the rows the model could not evaluate.
    pub score: Score,
    /// Per row, whether the model could not evaluate it (its call failed, and so did the row on
    /// its own); empty where every call went through. Rows that went through may still be
    /// non-finite: those are the caller's to judge.
    pub failed: Vec<bool>,
    /// Why: the model's own error (an ODE solve that failed) where it recorded one.
    pub failure: Option<String>,
}

/// The score at every row where a failed evaluation is a rejected proposal, as Stan rejects a
/// proposal whose log density throws. A call the model could not evaluate (it returned an
/// untracked NaN and its error, [`LogDensity::take_error`]) is no error here: where the error
/// says every row failed (an ODE solve's numerical failure), every row is NaN; otherwise the
/// rows are evaluated again in halves, so that a row fails only by its own position and one
/// chain's failure never rejects another's proposal (an ODE refuses a whole call for one
/// particle's non-finite initial state). Rows that are not finite do not reach the model again.
/// All of this costs nothing while the calls go through. What is not the particles' fault stays
/// an error: a dimension mismatch, a density with no gradient at all.
pub fn score_rows(
    model: &dyn LogDensity,
    particles: Tensor<2>,
    batch: Option<&Minibatch>,
) -> Result<RowScore, ModelError> {
    let [n, dim] = particles.dims();
    if dim != model.dim() {
        return Err(ModelError::DimensionMismatch { expected: model.dim(), got: dim });
    }
    let leaf = particles.clone().detach().autodiff().require_grad();
    let value = model.log_prob(leaf.clone(), batch);
    if value.is_tracked() {
        let grads = value.clone().sum().backward();
        let grad = leaf.grad(&grads).ok_or(ModelError::NoGradient)?;
        return Ok(RowScore { score: Score { log_prob: value.detach(), grad }, failed: Vec::new(), failure: None });
    }
    release_graph(&leaf);
    let error = model.take_error();
    // A value-only density returns values; a failed call returns NaN at every row. (Threads
    // sharing a model share its error slot, so another thread's failed call may have taken this
    // one's error: the NaN still says it failed.)
    if error.is_none() && !crate::tensor_ops::to_vec_f32(&value).iter().all(|v| v.is_nan()) {
        return Err(ModelError::NoGradient);
    }
    let every_row = error.as_ref().is_some_and(fails_every_row);
    let cause = error.map_or_else(
        || "the model's evaluation failed (its error went to another thread's call)".to_string(),
        |e| e.to_string(),
    );
    let rows_finite = host_rows_finite(&particles);
    let finite: Vec<usize> = (0..n).filter(|&i| rows_finite[i]).collect();
    let retry: Vec<Vec<usize>> = if finite.len() < n {
        if finite.is_empty() { Vec::new() } else { vec![finite] }
    } else if n > 1 && !every_row {
        vec![(0..n / 2).collect(), (n / 2..n).collect()]
    } else {
        Vec::new()
    };
    if retry.is_empty() {
        // On the devices a tracked call's results are on: the value's, and the particles' for
        // the gradient (which carries no autodiff).
        let score = Score { log_prob: value.full_like(f32::NAN), grad: particles.full_like(f32::NAN) };
        return Ok(RowScore { score, failed: vec![true; n], failure: Some(cause) });
    }
    let device = particles.device();
    let (mut lp, mut grad, mut failed) = (vec![f32::NAN; n], vec![f32::NAN; n * dim], vec![true; n]);
    let mut failure = None;
    for rows in retry {
        let idx = Tensor::<1, burn::tensor::Int>::from_data(
            burn::tensor::TensorData::new(rows.iter().map(|&i| i as i64).collect::<Vec<_>>(), [rows.len()]),
            &device,
        );
        let part = score_rows(model, particles.clone().select(0, idx), batch)?;
        let (lp_part, grad_part) =
            (crate::tensor_ops::to_vec_f32(&part.score.log_prob), crate::tensor_ops::to_vec_f32(&part.score.grad));
        for (k, &i) in rows.iter().enumerate() {
            lp[i] = lp_part[k];
            grad[i * dim..(i + 1) * dim].copy_from_slice(&grad_part[k * dim..(k + 1) * dim]);
            failed[i] = part.failed.get(k).copied().unwrap_or(false);
        }
        failure = failure.or(part.failure);
    }
    // Rows that were not finite failed with the whole call's cause.
    if failed.iter().any(|&f| f) {
        failure = failure.or(Some(cause));
    } else {
        failed.clear();
    }
    let log_prob = Tensor::from_data(burn::tensor::TensorData::new(lp, [n]), &value.device());
    let grad = crate::tensor_ops::matrix_from_vec(grad, n, dim, &device);
    Ok(RowScore { score: Score { log_prob, grad }, failed, failure })
}

/// Whether `error` says that every row of its call failed: an ODE solve fails numerically only
/// when no particle is left ([`crate::ode`]).
fn fails_every_row(error: &ModelError) -> bool {
    use crate::ode::OdeError;
    matches!(
        error,
        ModelError::Ode(OdeError::StepSizeUnderflow { .. } | OdeError::MaxNumSteps { .. } | OdeError::NonFinite { .. })
    )
}

/// Per row of `[n, dim]`, whether every entry is finite (a host read).
fn host_rows_finite(x: &Tensor<2>) -> Vec<bool> {
    let [n, dim] = x.dims();
    let values = crate::tensor_ops::to_vec_f32(x);
    (0..n).map(|i| values[i * dim..(i + 1) * dim].iter().all(|v| v.is_finite())).collect()
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
