//! Minibatches: which data rows a log-joint sees this step, and how to scale its likelihood.

use burn::tensor::{Int, Tensor};

/// A minibatch of data rows, as indices into the model's full data tensors.
///
/// The likelihood of a minibatch is scaled by `total / len` so that it estimates the full-data
/// likelihood without bias (the standard stochastic-gradient convention).
#[derive(Clone, Debug)]
pub struct Minibatch {
    /// Row indices into the full data, shape `[len]`, on the model's device.
    pub indices: Tensor<1, Int>,
    /// Number of rows in this batch.
    pub len: usize,
    /// Number of rows in the full data set.
    pub total: usize,
}

impl Minibatch {
    /// The factor `N / B` applied to the minibatch log-likelihood.
    pub fn scale(&self) -> f64 {
        self.total as f64 / self.len as f64
    }

    /// The batch rows of a data tensor whose first axis indexes data rows.
    pub fn rows<const D: usize>(&self, data: Tensor<D>) -> Tensor<D> {
        data.select(0, self.indices.clone())
    }

    /// The rows a log-joint should use and the likelihood scale: the batch rows and `N / B` when a
    /// batch is given, else all rows and 1.
    pub fn select<const D: usize>(batch: Option<&Minibatch>, data: Tensor<D>) -> (Tensor<D>, f64) {
        match batch {
            Some(b) => (b.rows(data), b.scale()),
            None => (data, 1.0),
        }
    }
}
