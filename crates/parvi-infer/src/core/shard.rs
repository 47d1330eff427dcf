//! Runs shared among processes: the collective operations a sharded run needs, and the two
//! sharded steps built on them (docs/distributed.md gives the schemes and their costs).
//!
//! **Particles** ([`ShardBy::Particles`]): every rank holds the full positions and every data
//! row, and owns a contiguous shard of the particles ([`ParticleShard`]): it computes their
//! scores (the same minibatch on every rank: the batch stream and the engine's rng are seeded
//! identically), the direction's rows at them (for SVGD from its `[rows, n]` block of squared
//! distances, whose blocks are all-gathered for the median bandwidth, or with many coordinates
//! from the Gram matrix split by coordinates and summed, and the all-gathered `[n, d]` of the
//! kernel's sources), steps them with its own rows of the step-size state, and
//! the new positions are all-gathered. No `[n, d]` pass is repeated on every rank, and the
//! element-wise step-size rule on a rank's rows is the one process's on those rows, so the
//! particles do not depend on the rank count beyond float rounding.
//!
//! **Rows** ([`ShardBy::Rows`], Horovod's data parallelism): every rank keeps the full particles
//! and only its contiguous share of the data rows ([`RowShare`]). Rank `r` scores every particle
//! on its rows (its share of the minibatch the one process draws, [`RowShard`]), one all-reduce
//! sums the scores (`n d` floats), and the kernel part and the step run replicated.
//!
//! The transport (MPI, or none) is a [`Collective`]; this module knows no MPI.
use std::fmt::Debug;
use std::ops::Range;

use burn::tensor::{Int, Tensor, TensorData};
use parvi_model::density::FunctionMap;
use parvi_model::tensor_ops::{median_by_selection, to_vec_f32};
use parvi_model::{LogDensity, Minibatch, ModelError};
use serde::{Deserialize, Serialize};

use crate::{Direction, EngineState, InferError, StepContext, TensorRecord};

/// The collective operations of a group of processes that run one sharded run together.
pub trait Collective: Debug + Send + Sync {
    /// This process's index in the group, `0..size()`.
    fn rank(&self) -> usize;

    /// Number of processes in the group.
    fn size(&self) -> usize;

    /// Gathers rows of `cols` floats from every rank, in rank order, on every rank: `local` is
    /// this rank's `counts[rank()]` rows (row-major), `counts[r]` the rows rank `r` sends.
    fn all_gather_rows(&self, local: &[f32], counts: &[usize], cols: usize) -> Result<Vec<f32>, InferError>;

    /// The element-wise sum over all ranks of `local`, on every rank (every rank passes the same
    /// length). Out of place: `local` is the send buffer as it stands (a tensor's own host
    /// buffer), so the transport needs no copy of it.
    fn all_reduce_sum(&self, local: &[f32]) -> Result<Vec<f32>, InferError>;

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

    fn all_reduce_sum(&self, local: &[f32]) -> Result<Vec<f32>, InferError> {
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

/// What a sharded run splits among its ranks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ShardBy {
    /// The particles: each rank the direction's share of its particles (every rank holds all
    /// data rows).
    #[default]
    Particles,
    /// The data rows: each rank every particle's score on its rows ([`RowShare`]).
    Rows,
}

impl ShardBy {
    /// The name `--shard` takes.
    pub fn name(self) -> &'static str {
        match self {
            ShardBy::Particles => "particles",
            ShardBy::Rows => "rows",
        }
    }
}

impl std::str::FromStr for ShardBy {
    type Err = InferError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "particles" => Ok(ShardBy::Particles),
            "rows" => Ok(ShardBy::Rows),
            other => Err(InferError::setting("shard", format!("`{other}` is neither `particles` nor `rows`"))),
        }
    }
}

/// The data rows one rank of a run with sharded rows holds: `rows` of the data set's `total`
/// rows (the model given to the run holds exactly these, in order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowShare {
    /// Rows of the whole data set.
    pub total: usize,
    /// This rank's rows, a contiguous range of `0..total`.
    pub rows: Range<usize>,
}

impl RowShare {
    /// The share of rank `rank` of `size` when `total` rows are split contiguously
    /// ([`shard_rows`]); an error naming the counts when a rank would hold no row.
    pub fn of_rank(total: usize, size: usize, rank: usize) -> Result<Self, InferError> {
        if total < size {
            return Err(InferError::setting(
                "shard",
                format!("{total} data rows cannot be shared among {size} ranks: use at most {total} ranks"),
            ));
        }
        Ok(Self { total, rows: shard_rows(total, size, rank) })
    }
}

/// This rank's part of a model whose data rows are shared among `ranks` processes: the local
/// model `inner` holds the rows [`RowShare::rows`]; this density presents the whole data set's
/// rows (`data_len` = [`RowShare::total`], so every rank draws the one process's minibatches)
/// and evaluates the rank's share of the log-joint,
///
/// `log p_r(x) = log_prior(x) / K + (N / B) * (this rank's rows of the batch: their terms)`,
///
/// so that the shares of the `K` ranks add up to `log_prior + (N / B) * (the batch's terms)`,
/// the one process's log-joint (minibatch scaling as [`Minibatch::scale`]). The rows' terms are
/// `inner`'s log-joint on its rows at scale 1 less its prior. A rank with no row in the batch
/// contributes its share of the prior alone.
pub struct RowShard<'a> {
    inner: &'a dyn LogDensity,
    share: RowShare,
    ranks: usize,
}

impl<'a> RowShard<'a> {
    /// Rank `rank`'s part of the model; `inner` must hold the rows `share.rows` and separate its
    /// prior ([`LogDensity::log_prior`], probed at `probe`), each refused by name otherwise.
    pub fn new(inner: &'a dyn LogDensity, share: RowShare, ranks: usize, probe: Tensor<2>) -> Result<Self, InferError> {
        let bad = |reason: String| InferError::setting("shard", reason);
        if share.rows.is_empty() || share.rows.end > share.total {
            return Err(bad(format!(
                "rows {}..{} are not a share of the {} data rows (every rank needs at least one row)",
                share.rows.start, share.rows.end, share.total
            )));
        }
        match inner.data_len() {
            None => return Err(bad("`--shard rows`: the model has no data rows to share; shard the particles".into())),
            Some(len) if len != share.rows.len() => {
                return Err(bad(format!(
                    "the model holds {len} data rows but this rank's share is {} (rows {}..{} of {})",
                    share.rows.len(),
                    share.rows.start,
                    share.rows.end,
                    share.total
                )));
            }
            Some(_) => {}
        }
        if inner.log_prior(probe).is_none() {
            return Err(bad("`--shard rows`: the model does not separate its prior from its rows' terms \
                 (`LogDensity::log_prior`), so the ranks could not count it once"
                .into()));
        }
        Ok(Self { inner, share, ranks: ranks.max(1) })
    }

    /// `a * log_joint_rows - (a - 1/K) * log_prior`: the rank's share when its rows' terms,
    /// evaluated at scale 1 in `log_joint_rows`, count `a` times.
    fn share_of(&self, particles: Tensor<2>, log_joint_rows: Tensor<1>, a: f64) -> Tensor<1> {
        let k = self.ranks as f64;
        log_joint_rows.mul_scalar(a) - self.prior(particles).mul_scalar(a - 1.0 / k)
    }

    /// The local model's prior; NaN (caught by the run's divergence guard) if it stopped
    /// separating it after [`RowShard::new`] checked that it does.
    fn prior(&self, particles: Tensor<2>) -> Tensor<1> {
        let n = particles.dims()[0];
        let device = particles.device();
        self.inner.log_prior(particles).unwrap_or_else(|| Tensor::full([n], f32::NAN, &device))
    }
}

impl LogDensity for RowShard<'_> {
    fn dim(&self) -> usize {
        self.inner.dim()
    }

    fn data_len(&self) -> Option<usize> {
        Some(self.share.total)
    }

    fn log_prob(&self, particles: Tensor<2>, batch: Option<&Minibatch>) -> Tensor<1> {
        let all_rows = || self.inner.log_prob(particles.clone(), None);
        let Some(batch) = batch.filter(|b| b.len < b.total) else {
            // Every row (no minibatch, or one as large as the data): the local rows at scale 1.
            return self.share_of(particles.clone(), all_rows(), 1.0);
        };
        // The one process's batch, read back (`len` integers), and this rank's rows of it.
        let start = self.share.rows.start as i64;
        let end = self.share.rows.end as i64;
        let local: Vec<i64> = batch
            .indices
            .to_data()
            .convert::<i64>()
            .try_into_vec::<i64>()
            .unwrap_or_default()
            .into_iter()
            .filter(|&i| (start..end).contains(&i))
            .map(|i| i - start)
            .collect();
        if local.is_empty() {
            return self.prior(particles).div_scalar(self.ranks as f64);
        }
        let len = local.len();
        let device = particles.device();
        // Scale 1 (`total = len`): the factor N / B of the one process's batch is applied here.
        let mine =
            Minibatch { indices: Tensor::<1, Int>::from_data(TensorData::new(local, [len]), &device), len, total: len };
        let joint = self.inner.log_prob(particles.clone(), Some(&mine));
        self.share_of(particles, joint, batch.scale())
    }

    fn log_prior(&self, particles: Tensor<2>) -> Option<Tensor<1>> {
        self.inner.log_prior(particles).map(|p| p.div_scalar(self.ranks as f64))
    }

    fn take_error(&self) -> Option<ModelError> {
        self.inner.take_error()
    }

    /// None: a function-space method reads the batch's inputs, which are spread over the ranks.
    fn function_map(&self) -> Option<&dyn FunctionMap> {
        None
    }
}

/// A rank's shard of the particles in a run that shares them ([`ShardBy::Particles`]): its
/// contiguous rows of the `n` particles ([`shard_rows`]) and the collectives a sharded
/// direction needs (gathering row blocks; the median of the gathered squared distances).
pub struct ParticleShard<'a> {
    collective: &'a dyn Collective,
    counts: Vec<usize>,
    rows: Range<usize>,
}

impl<'a> ParticleShard<'a> {
    /// This rank's shard of `n` particles; refused by name when a rank would hold none.
    pub fn new(n: usize, collective: &'a dyn Collective) -> Result<Self, InferError> {
        check_shardable_count(n, collective)?;
        let counts = shard_counts(n, collective.size());
        let rows = shard_rows(n, collective.size(), collective.rank());
        Ok(Self { collective, counts, rows })
    }

    /// This rank's particles.
    pub fn rows(&self) -> Range<usize> {
        self.rows.clone()
    }

    /// Particles in the whole set.
    pub fn particles(&self) -> usize {
        self.counts.iter().sum()
    }

    /// Ranks sharing the particles.
    pub fn ranks(&self) -> usize {
        self.counts.len()
    }

    /// This rank's share of `dim` coordinates, split as the particles are ([`shard_rows`]): the
    /// columns of a product that the ranks split by coordinates instead of by particles.
    pub fn coordinates(&self, dim: usize) -> Range<usize> {
        shard_rows(dim, self.ranks(), self.collective.rank())
    }

    /// The sum over the ranks of each rank's `local` (`[rows, cols]`, the same shape on every
    /// rank), added in rank order on every rank from the all-gathered parts (`ranks * rows *
    /// cols` floats). Every rank holds the same bits, which an all-reduce does not promise (it
    /// may associate the sum differently on different ranks), so that a median taken from the
    /// sum is the same on all.
    pub fn sum_in_rank_order(&self, local: Tensor<2>) -> Result<Tensor<2>, InferError> {
        let [rows, cols] = local.dims();
        if self.ranks() == 1 || rows * cols == 0 {
            return Ok(local);
        }
        let device = local.device();
        let parts = self.collective.all_gather_rows(
            host_f32(local)?.as_slice::<f32>().map_err(host_error)?,
            &vec![rows; self.ranks()],
            cols,
        )?;
        let mut chunks = parts.chunks_exact(rows * cols);
        let mut sum = chunks.next().map(<[f32]>::to_vec).unwrap_or_default();
        for part in chunks {
            sum.iter_mut().zip(part).for_each(|(a, b)| *a += b);
        }
        Ok(Tensor::from_data(TensorData::new(sum, [rows, cols]), &device))
    }

    /// The whole `[n, cols]` row-major values from every rank's rows `local` (`[rows, cols]`)
    /// on the host (`local` itself in a group of one).
    pub fn gather_host_rows(&self, local: Vec<f32>, cols: usize) -> Result<Vec<f32>, InferError> {
        if self.ranks() == 1 {
            check_gather(&local, &self.counts, cols, 0, 1)?;
            return Ok(local);
        }
        self.collective.all_gather_rows(&local, &self.counts, cols)
    }

    /// The whole `[n, cols]` tensor from every rank's rows `local` (`[rows, cols]`).
    pub fn gather_rows(&self, local: Tensor<2>) -> Result<Tensor<2>, InferError> {
        gather_rows(local, &self.counts, self.collective)
    }

    /// The median of the squared distances of all `n^2` pairs of particles from each rank's
    /// `[rows, n]` block of them (`block`, this rank's rows): the blocks are all-gathered (`n^2`
    /// floats) and every rank selects the same median on the host (`O(n^2)`, no `n^2 d` work).
    pub fn median_sq(&self, block: &Tensor<2>) -> Result<f32, InferError> {
        let n = block.dims()[1];
        let mut all = self.collective.all_gather_rows(&to_vec_f32(block), &self.counts, n)?;
        Ok(median_by_selection(&mut all).unwrap_or(0.0))
    }

    /// `state` (every tensor `[n, ...]`, one row per particle, as a step-size rule's) cut to
    /// this rank's rows; an error names a tensor that is not one row per particle.
    pub fn own_state(&self, state: &EngineState) -> Result<EngineState, InferError> {
        let n = self.particles();
        let mut own = state.clone();
        for (key, record) in own.tensors.iter_mut() {
            let cols = record_cols(key, record, n)?;
            record.values = record.values[self.rows.start * cols..self.rows.end * cols].to_vec();
            record.shape[0] = self.rows.len();
        }
        Ok(own)
    }

    /// The whole state from every rank's [`ParticleShard::own_state`] (every rank calls it, as
    /// every collective).
    pub fn gather_state(&self, own: &EngineState) -> Result<EngineState, InferError> {
        let mut whole = own.clone();
        // The keys are the same on every rank (they step in lockstep), in the map's order.
        for (key, record) in whole.tensors.iter_mut() {
            let cols = record_cols(key, record, self.rows.len())?;
            record.values = self.collective.all_gather_rows(&record.values, &self.counts, cols)?;
            record.shape[0] = self.particles();
        }
        Ok(whole)
    }
}

/// The values per row of `record`, whose first dimension must be `rows`.
fn record_cols(key: &str, record: &TensorRecord, rows: usize) -> Result<usize, InferError> {
    match record.shape.first() {
        Some(&r) if r == rows && record.values.len() == rows * record.shape[1..].iter().product::<usize>() => {
            Ok(record.values.len() / rows.max(1))
        }
        _ => Err(InferError::State(format!(
            "`{key}` (shape {:?}) is not one row per particle of {rows}: the step-size state cannot be sharded",
            record.shape
        ))),
    }
}

/// All-gathers each rank's rows of `local` (`[rows, cols]`) into the full `[n, cols]` tensor.
fn gather_rows(local: Tensor<2>, counts: &[usize], collective: &dyn Collective) -> Result<Tensor<2>, InferError> {
    if collective.size() == 1 {
        return Ok(local);
    }
    let cols = local.dims()[1];
    let device = local.device();
    let all = collective.all_gather_rows(host_f32(local)?.as_slice::<f32>().map_err(host_error)?, counts, cols)?;
    let n: usize = counts.iter().sum();
    Ok(Tensor::from_data(TensorData::new(all, [n, cols]), &device))
}

/// The element-wise sum over ranks of `local`, on every rank. The tensor's own host buffer is
/// MPI's send buffer and the sum's buffer becomes the new tensor (flex hands both over without
/// a copy): with shares of `n d` floats (17 MB for the protein BNN), each extra pass over them
/// cost a few milliseconds that no rank count shrinks.
fn sum_over_ranks(local: Tensor<2>, collective: &dyn Collective) -> Result<Tensor<2>, InferError> {
    if collective.size() == 1 {
        return Ok(local);
    }
    let dims = local.dims();
    let device = local.device();
    let sum = collective.all_reduce_sum(host_f32(local)?.as_slice::<f32>().map_err(host_error)?)?;
    Ok(Tensor::from_data(TensorData::new(sum, dims), &device))
}

/// `t`'s values as host `f32` data, taking the tensor's buffer where the backend can (flex,
/// when nothing else holds it) instead of copying it.
fn host_f32<const D: usize>(t: Tensor<D>) -> Result<TensorData, InferError> {
    Ok(t.into_data().convert::<f32>())
}

fn host_error(e: burn::tensor::DataError) -> InferError {
    InferError::setting("distributed", format!("a tensor could not be read as f32 values: {e:?}"))
}

/// This rank's rows `[rows, d]` of the direction of `method` at `x` with the particles sharded
/// (`shard`): its particles' scores, then the direction at them ([`Direction::ascent_shard`]).
pub fn sharded_ascent(
    method: &mut dyn Direction,
    ctx: &mut StepContext<'_>,
    x: Tensor<2>,
    shard: &ParticleShard<'_>,
) -> Result<Tensor<2>, InferError> {
    let scores = method.shard_scores(ctx, x.clone().slice([shard.rows()]))?;
    method.ascent_shard(ctx, x, scores, shard)
}

/// The full direction `[n, d]` of `method` at `x` with the data rows sharded: this rank's
/// share of every particle's score (the model in `ctx` is this rank's [`RowShard`]), summed
/// across ranks, then the direction from the summed scores, replicated.
pub fn rows_sharded_ascent(
    method: &mut dyn Direction,
    ctx: &mut StepContext<'_>,
    x: Tensor<2>,
    collective: &dyn Collective,
) -> Result<Tensor<2>, InferError> {
    let share = method.shard_scores(ctx, x.clone())?;
    let scores = sum_over_ranks(share, collective)?;
    method.ascent_from_scores(ctx, x, scores)
}
