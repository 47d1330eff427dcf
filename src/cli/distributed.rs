//! `--distributed`: one run shared among the processes of an MPI job. Every rank runs the same
//! command; rank 0 alone prints and writes ([`is_lead`]); an error in any rank ends the whole
//! job with its message (`MPI_Abort`), so no rank is left waiting in a collective.

use std::sync::Arc;

use anyhow::Result;
use parvi_infer::core::Collective;
use parvi_infer::core::shard::{RowShare, ShardBy};

/// The group a run shares its particles with; `None` runs in this process alone.
pub type Group = Option<Arc<dyn Collective>>;

/// Whether this process prints and writes the run's outputs: rank 0, or a run of its own.
pub fn is_lead(group: &Group) -> bool {
    parvi_infer::core::is_lead(group.as_deref())
}

/// Runs `body` alone, or with `distributed` as one rank of the MPI job this process belongs to.
pub fn launch(distributed: bool, body: impl FnOnce(Group) -> Result<()>) -> Result<()> {
    if !distributed {
        return body(None);
    }
    in_mpi_job(body)
}

#[cfg(feature = "mpi")]
fn in_mpi_job(body: impl FnOnce(Group) -> Result<()>) -> Result<()> {
    // The world finalises MPI when dropped: it outlives the run and every collective taken from it.
    let world = parvi_infer::mpi::MpiWorld::init()?;
    let collective = world.collective();
    match body(Some(collective.clone())) {
        Ok(()) => Ok(()),
        Err(e) if collective.size() > 1 => collective.abort(&format!("{e:#}")),
        Err(e) => Err(e),
    }
}

#[cfg(not(feature = "mpi"))]
fn in_mpi_job(_body: impl FnOnce(Group) -> Result<()>) -> Result<()> {
    anyhow::bail!("invalid setting `--distributed`: built without the `mpi` feature: rebuild with `--features mpi`")
}

/// The run's share of wall time spent in the collectives (all-gathers, all-reduces), per step (`None` alone).
pub fn communication_ms_per_step(group: &Group, steps: usize) -> Option<f64> {
    group.as_ref().map(|c| parvi_infer::core::ms_per_step(c.seconds_communicating(), steps))
}

/// `--shard`'s parser: `particles` or `rows`.
pub fn parse_shard(s: &str) -> std::result::Result<ShardBy, String> {
    s.parse::<ShardBy>().map_err(|e| e.to_string())
}

/// This rank's share of `rows` data rows when `shard` is [`ShardBy::Rows`] (`None` when the
/// particles are shared); refused by name without a group, or with more ranks than rows.
pub fn row_share(shard: ShardBy, rows: usize, group: &Group) -> Result<Option<RowShare>> {
    match (shard, group) {
        (ShardBy::Particles, _) => Ok(None),
        (ShardBy::Rows, None) => anyhow::bail!(
            "invalid setting `--shard rows`: the rows are shared among the processes of an MPI job: \
             add `--distributed` and start it with `mpirun -np K`"
        ),
        (ShardBy::Rows, Some(c)) => Ok(Some(RowShare::of_rank(rows, c.size(), c.rank())?)),
    }
}
