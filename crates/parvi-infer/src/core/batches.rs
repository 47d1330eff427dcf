//! Minibatch streams over data rows: cycling in order (Liu & Wang's protocol) or shuffled per
//! epoch with a seed. The stream's state is one counter, so checkpoints resume it exactly.

use burn::tensor::{Device, Int, Tensor, TensorData};
use parvi_model::Minibatch;
use serde::{Deserialize, Serialize};

use crate::{EngineRng, InferError};

/// The order in which a [`BatchStream`] visits the data rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BatchOrder {
    /// Rows `t B .. (t + 1) B` modulo `N` at step `t`.
    #[default]
    Cycle,
    /// A fresh seeded permutation of the rows each epoch.
    Shuffle,
}

/// A seeded, resumable stream of minibatches of `batch` rows out of `total`.
#[derive(Clone, Debug)]
pub struct BatchStream {
    total: usize,
    batch: usize,
    order: BatchOrder,
    seed: u64,
    /// Rows served so far.
    position: u64,
    cached_epoch: Option<(u64, Vec<usize>)>,
}

impl BatchStream {
    /// A stream of `batch` rows per step (at most `total`) in `order`, shuffled from `seed`.
    pub fn new(total: usize, batch: usize, order: BatchOrder, seed: u64) -> Result<Self, InferError> {
        if total == 0 {
            return Err(InferError::setting("data", "the model's data has zero rows"));
        }
        if batch == 0 {
            return Err(InferError::setting("batch", "minibatch size must be >= 1"));
        }
        Ok(Self { total, batch: batch.min(total), order, seed, position: 0, cached_epoch: None })
    }

    /// Rows served so far: the state a checkpoint saves.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// Resumes the stream after `position` rows, as saved by [`BatchStream::position`].
    pub fn set_position(&mut self, position: u64) {
        self.position = position;
    }

    /// The next batch's row indices.
    pub fn next_indices(&mut self) -> Vec<usize> {
        let mut rows = Vec::with_capacity(self.batch);
        self.fill_indices(|r| rows.push(r));
        rows
    }

    /// Hands the next batch's row indices to `push`, in order, and advances the stream.
    fn fill_indices(&mut self, mut push: impl FnMut(usize)) {
        let total = self.total as u64;
        for i in 0..self.batch as u64 {
            let p = self.position + i;
            let (epoch, offset) = (p / total, (p % total) as usize);
            push(match self.order {
                BatchOrder::Cycle => offset,
                BatchOrder::Shuffle => self.permutation(epoch)[offset],
            });
        }
        self.position += self.batch as u64;
    }

    /// The next batch as a [`Minibatch`] on `device`.
    pub fn next_batch(&mut self, device: &Device) -> Minibatch {
        let len = self.batch;
        // The indices straight into the tensor's `i64` buffer: no `usize` vector between.
        let mut rows = Vec::with_capacity(len);
        self.fill_indices(|r| rows.push(r as i64));
        Minibatch { indices: Tensor::<1, Int>::from_data(TensorData::new(rows, [len]), device), len, total: self.total }
    }

    fn permutation(&mut self, epoch: u64) -> &[usize] {
        if self.cached_epoch.as_ref().is_none_or(|(e, _)| *e != epoch) {
            let mut rng = EngineRng::new(self.seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            self.cached_epoch = Some((epoch, rng.permutation(self.total)));
        }
        &self.cached_epoch.as_ref().expect("cached above").1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cycle_wraps_like_the_reference_protocol() {
        let mut s = BatchStream::new(5, 3, BatchOrder::Cycle, 0).unwrap();
        assert_eq!(s.next_indices(), vec![0, 1, 2]);
        assert_eq!(s.next_indices(), vec![3, 4, 0]);
    }

    #[test]
    fn shuffle_covers_each_epoch_once() {
        let mut s = BatchStream::new(10, 5, BatchOrder::Shuffle, 3).unwrap();
        let mut rows = s.next_indices();
        rows.extend(s.next_indices());
        rows.sort();
        assert_eq!(rows, (0..10).collect::<Vec<_>>());
    }

    #[test]
    fn zero_batch_is_rejected() {
        assert!(BatchStream::new(10, 0, BatchOrder::Cycle, 0).unwrap_err().to_string().contains("`batch`"));
    }
}
