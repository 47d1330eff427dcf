//! The two faces of a target density: differentiable log-joints and value-only black boxes.

use burn::tensor::Tensor;

use crate::{Minibatch, ModelError};

/// A log-joint density evaluated for all particles at once.
///
/// `log_prob` takes the particle matrix `[n, dim]` (unconstrained coordinates) and returns
/// `log p` of shape `[n]`, including any log-Jacobian of the parameter transforms. It must be
/// built from burn tensor operations so that autodiff gives the score; that is all an engine
/// asks of a model.
///
/// A model is shared by the threads of a sampler (NUTS runs its chains on one thread per core),
/// hence `Send + Sync`: keep counters in atomics or a `Mutex`, not a `Cell`.
pub trait LogDensity: Send + Sync {
    /// Dimension of one particle.
    fn dim(&self) -> usize;

    /// Number of data rows the likelihood ranges over, if the model has data: engines draw
    /// minibatches of these rows.
    fn data_len(&self) -> Option<usize> {
        None
    }

    /// `log p(x)` for each particle, `[n, dim] -> [n]`. With a minibatch the likelihood is the
    /// batch's, scaled by `N / B` (see [`Minibatch::select`]).
    fn log_prob(&self, particles: Tensor<2>, batch: Option<&Minibatch>) -> Tensor<1>;

    /// The terms of [`LogDensity::log_prob`] that depend on no data row (the prior, the
    /// hyperpriors, the log-Jacobians), `[n]`: `log_prob(x, batch) = log_prior(x) + scale *
    /// (the batch rows' terms)`. A run whose data rows are split among processes counts this
    /// part once in all, not once per process. `None` (the default) when the model does not
    /// separate it: such a model cannot have its rows sharded.
    fn log_prior(&self, particles: Tensor<2>) -> Option<Tensor<1>> {
        let _ = particles;
        None
    }

    /// Why the last evaluation could not be completed, if it could not (an ODE solve that failed
    /// at some particle): such an evaluation returns NaN for every particle, and the run loop's
    /// divergence guard reports this error. Taking it clears it.
    fn take_error(&self) -> Option<ModelError> {
        None
    }

    /// The particles as functions of inputs (a network's weights as the network), for engines
    /// that compare particles by their outputs (function-space particles); `None` (the default)
    /// for a model that is not a function of inputs.
    fn function_map(&self) -> Option<&dyn FunctionMap> {
        None
    }
}

/// A model whose particles are functions of inputs: the weights of a network, seen through the
/// network's outputs at chosen inputs. Function-space particle methods (Wang, Ren, Zhu & Zhang
/// 2019) compare the particles' outputs at measurement points and push their update back to the
/// parameters through the outputs' Jacobian.
pub trait FunctionMap {
    /// Input features of one row.
    fn inputs(&self) -> usize;

    /// Per feature, the smallest and largest training input (on the scale the model reads):
    /// where measurement points beyond the data are drawn around.
    fn input_range(&self) -> Vec<(f64, f64)>;

    /// The inputs `[B, inputs]` of the minibatch's rows (every training row without a batch).
    fn batch_inputs(&self, batch: Option<&Minibatch>) -> Tensor<2>;

    /// Every particle's outputs at `points` `[m, inputs]`, as `[n, m * outputs]`; differentiable
    /// in `particles` (one forward of the batched network).
    fn function_values(&self, particles: Tensor<2>, points: Tensor<2>) -> Tensor<2>;

    /// `k` parameter vectors drawn from the model's prior, `[k, dim]`, in the coordinates
    /// [`LogDensity::log_prob`] reads, from the seeded generator `seed`: a function-space prior
    /// is the law of the outputs of networks drawn this way (Wang et al. 2019 fit a Gaussian to
    /// them at the measurement points). `None` (the default) when the model cannot draw from its
    /// prior; such a model's particles can only keep their weight-space prior.
    fn prior_draws(&self, k: usize, seed: u64) -> Option<Tensor<2>> {
        let _ = (k, seed);
        None
    }
}

impl<T: LogDensity + ?Sized> LogDensity for &T {
    fn dim(&self) -> usize {
        (**self).dim()
    }
    fn data_len(&self) -> Option<usize> {
        (**self).data_len()
    }
    fn log_prob(&self, particles: Tensor<2>, batch: Option<&Minibatch>) -> Tensor<1> {
        (**self).log_prob(particles, batch)
    }
    fn log_prior(&self, particles: Tensor<2>) -> Option<Tensor<1>> {
        (**self).log_prior(particles)
    }
    fn take_error(&self) -> Option<ModelError> {
        (**self).take_error()
    }

    fn function_map(&self) -> Option<&dyn FunctionMap> {
        (**self).function_map()
    }
}

impl<T: LogDensity + ?Sized> LogDensity for Box<T> {
    fn dim(&self) -> usize {
        (**self).dim()
    }
    fn data_len(&self) -> Option<usize> {
        (**self).data_len()
    }
    fn log_prob(&self, particles: Tensor<2>, batch: Option<&Minibatch>) -> Tensor<1> {
        (**self).log_prob(particles, batch)
    }
    fn log_prior(&self, particles: Tensor<2>) -> Option<Tensor<1>> {
        (**self).log_prior(particles)
    }
    fn take_error(&self) -> Option<ModelError> {
        (**self).take_error()
    }

    fn function_map(&self) -> Option<&dyn FunctionMap> {
        (**self).function_map()
    }
}

/// A density known only through its values (a simulator, external code, a non-differentiable
/// program): gradient-free engines need nothing more.
pub trait ValueDensity: Send + Sync {
    /// Dimension of one particle.
    fn dim(&self) -> usize;

    /// Unnormalised `log p(x)` for each particle, `[n, dim] -> [n]`.
    fn log_value(&self, particles: Tensor<2>) -> Tensor<1>;
}

/// A differentiable model seen through its values only (the full data, no minibatch): how a
/// gradient-free method is run on, and compared with gradient-based ones against, the same
/// target. Wrap it in [`ValueOnly`] to hide the gradient.
pub struct ValuesOf<'a>(pub &'a dyn LogDensity);

impl ValueDensity for ValuesOf<'_> {
    fn dim(&self) -> usize {
        self.0.dim()
    }

    fn log_value(&self, particles: Tensor<2>) -> Tensor<1> {
        self.0.log_prob(particles, None)
    }
}

/// Presents a [`ValueDensity`] as a [`LogDensity`] whose values carry no gradient: engines that
/// need a score get [`crate::ModelError::NoGradient`] instead of a wrong answer.
pub struct ValueOnly<V>(pub V);

impl<V: ValueDensity> LogDensity for ValueOnly<V> {
    fn dim(&self) -> usize {
        self.0.dim()
    }

    fn log_prob(&self, particles: Tensor<2>, _batch: Option<&Minibatch>) -> Tensor<1> {
        // Detached on purpose: the black box must not leak a (wrong) gradient.
        self.0.log_value(particles.detach()).detach()
    }
}
