//! Particles sharded across processes: the collective operations a sharded run needs, and the
//! sharded direction step built on them.
//!
//! Every rank keeps the full, replicated positions and step-size state. Rank `r` computes the
//! scores of its contiguous shard of rows (the same minibatch on every rank: the batch stream
//! and the engine's rng are seeded identically), the scores are all-gathered, rank `r` computes
//! its rows of the direction from all positions and scores, and the direction rows are
//! all-gathered. Every rank then applies the same adapter to the same full direction, so the
//! particles do not depend on the rank count beyond float rounding. Communication: `2 n d`
//! floats per step. The transport (MPI, or none) is a [`Collective`]; this module knows no MPI.

use std::fmt::Debug;
use std::ops::Range;

use burn::tensor::{Tensor, TensorData};
use parvi_model::tensor_ops::to_vec_f32;

use crate::{Direction, InferError, StepContext};

/// The collective operations of a group of processes that run one sharded run together.
pub trait Collective: Debug + Send + Sync {
    /// This process's index in the group, `0..size()`.
    fn rank(&self) -> usize;

    /// Number of processes in the group.
    fn size(&self) -> usize;

    /// Gathers rows of `cols` floats from every rank, in rank order, on every rank: `local` is
    /// this rank's `counts[rank()]` rows (row-major), `counts[r]` the rows rank `r` sends.
    fn all_gather_rows(&self, local: &[f32], counts: &[usize], cols: usize) -> Result<Vec<f32>, InferError>;

    /// Ends every process of the group with `message` (printed by this one): a failing rank
    /// must not leave the others waiting in a collective.
    fn abort(&self, message: &str) -> !;

    /// Seconds this process has spent in collective operations so far (waiting for the slowest
    /// rank included).
    fn seconds_communicating(&self) -> f64 {
        0.0
    }
}

/// Whether this process writes a run's outputs: rank 0 of `collective`, or a run of its own
/// (the state is replicated, so one writer suffices).
pub fn is_lead(collective: Option<&dyn Collective>) -> bool {
    collective.is_none_or(|c| c.rank() == 0)
}

/// A group of one process: the gather returns the local rows.
#[derive(Clone, Copy, Debug, Default)]
pub struct SingleProcess;

impl Collective for SingleProcess {
    fn rank(&self) -> usize {
        0
    }

    fn size(&self) -> usize {
        1
    }

    fn all_gather_rows(&self, local: &[f32], counts: &[usize], cols: usize) -> Result<Vec<f32>, InferError> {
        check_gather(local, counts, cols, 0, 1)?;
        Ok(local.to_vec())
    }

    fn abort(&self, message: &str) -> ! {
        eprintln!("error: {message}");
        std::process::exit(1)
    }
}

/// Checks that `local` holds this rank's rows and `counts` has one entry per rank, so that a
/// mismatch is an error rather than a collective that reads past a buffer.
pub fn check_gather(local: &[f32], counts: &[usize], cols: usize, rank: usize, size: usize) -> Result<(), InferError> {
    if counts.len() != size {
        return Err(InferError::setting("distributed", format!("{} row counts for {size} ranks", counts.len())));
    }
    if local.len() != counts[rank] * cols {
        return Err(InferError::setting(
            "distributed",
            format!("rank {rank} holds {} values, expected {} rows of {cols}", local.len(), counts[rank]),
        ));
    }
    Ok(())
}

/// Rows per rank when `n` rows are split among `size` ranks: contiguous, the first `n % size`
/// ranks one row more.
pub fn shard_counts(n: usize, size: usize) -> Vec<usize> {
    let size = size.max(1);
    (0..size).map(|r| n / size + usize::from(r < n % size)).collect()
}

/// The rows of rank `rank` when `n` rows are split among `size` ranks ([`shard_counts`]).
pub fn shard_rows(n: usize, size: usize, rank: usize) -> Range<usize> {
    let counts = shard_counts(n, size);
    let start: usize = counts[..rank].iter().sum();
    start..start + counts[rank]
}

/// Refuses a group larger than the particle set (a rank with no rows has nothing to compute).
pub fn check_shardable_count(n: usize, collective: &dyn Collective) -> Result<(), InferError> {
    if n < collective.size() {
        return Err(InferError::setting(
            "distributed",
            format!("{n} particles cannot be shared among {} ranks: use at most {n} ranks", collective.size()),
        ));
    }
    Ok(())
}

/// The error of a method that cannot split its direction's rows across ranks.
pub fn not_shardable(name: &str, why: &str) -> InferError {
    InferError::setting("distributed", format!("{name} cannot run sharded yet: {why}"))
}

/// All-gathers each rank's rows of `local` (`[rows, cols]`) into the full `[n, cols]` tensor.
fn gather_rows(local: Tensor<2>, counts: &[usize], collective: &dyn Collective) -> Result<Tensor<2>, InferError> {
    let cols = local.dims()[1];
    let device = local.device();
    let all = collective.all_gather_rows(&to_vec_f32(&local), counts, cols)?;
    let n: usize = counts.iter().sum();
    Ok(Tensor::from_data(TensorData::new(all, [n, cols]), &device))
}

/// The full direction `[n, d]` of `method` at `x`, computed in shards: this rank's scores and
/// direction rows, each all-gathered (the module docs give the scheme).
pub fn sharded_ascent(
    method: &mut dyn Direction,
    ctx: &mut StepContext<'_>,
    x: Tensor<2>,
    collective: &dyn Collective,
) -> Result<Tensor<2>, InferError> {
    let n = x.dims()[0];
    check_shardable_count(n, collective)?;
    let counts = shard_counts(n, collective.size());
    let rows = shard_rows(n, collective.size(), collective.rank());
    let local = method.shard_scores(ctx, x.clone().slice([rows.clone()]))?;
    let scores = gather_rows(local, &counts, collective)?;
    let phi_rows = method.ascent_rows(ctx, x, scores, rows)?;
    gather_rows(phi_rows, &counts, collective)
}
