//! MPI's transport for sharded runs: [`MpiWorld`] owns the MPI environment of the process, and
//! [`MpiCollective`] is the [`Collective`] of `MPI_COMM_WORLD`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::ffi;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives};

use crate::InferError;
use crate::core::shard::{Collective, check_gather};

/// The process's MPI environment: initialised once, finalised when dropped. It must outlive
/// every [`MpiCollective`] taken from it (a collective after the finalisation is an MPI error).
pub struct MpiWorld {
    _universe: Universe,
    collective: Arc<MpiCollective>,
}

impl MpiWorld {
    /// Initialises MPI (a process started by `mpirun`/`srun`, or alone as a group of one).
    pub fn init() -> Result<Self, InferError> {
        let universe = mpi::initialize().ok_or_else(|| {
            InferError::setting("distributed", "MPI could not be initialised (already initialised in this process?)")
        })?;
        let world = universe.world();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        let collective = Arc::new(MpiCollective { rank, size, nanos: AtomicU64::new(0) });
        Ok(Self { _universe: universe, collective })
    }

    /// The collective of all processes of the job.
    pub fn collective(&self) -> Arc<MpiCollective> {
        self.collective.clone()
    }
}

/// [`Collective`] over `MPI_COMM_WORLD`. The communicator handle is taken per call (a constant
/// handle), so this type holds no MPI object and may cross threads.
#[derive(Debug)]
pub struct MpiCollective {
    rank: usize,
    size: usize,
    /// Nanoseconds spent in collectives.
    nanos: AtomicU64,
}

impl Collective for MpiCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn all_gather_rows(&self, local: &[f32], counts: &[usize], cols: usize) -> Result<Vec<f32>, InferError> {
        check_gather(local, counts, cols, self.rank, self.size)?;
        let too_many = || InferError::setting("distributed", "a shard exceeds MPI's 2^31 - 1 values per rank");
        let values: Vec<i32> =
            counts.iter().map(|&c| i32::try_from(c * cols).map_err(|_| too_many())).collect::<Result<_, _>>()?;
        let mut displs = Vec::with_capacity(values.len());
        let mut at = 0i32;
        for &v in &values {
            displs.push(at);
            at = at.checked_add(v).ok_or_else(too_many)?;
        }
        // Uninitialised: MPI writes every one of the `at` values (the counts tile `0..at`), and
        // zeroing 17 MB first (the protein BNN's `[100, 42,403]`) cost a rank about a
        // millisecond a gather, twice a step.
        let mut all: Vec<f32> = Vec::with_capacity(at as usize);
        let started = Instant::now();
        // SAFETY: `local` holds `values[rank]` floats (`check_gather`); `all` has room for `at`
        // floats at the displacements `displs`, which tile `0..at` without overlap, so after
        // the call every value up to `at` is written and the length may be set.
        let code = unsafe {
            ffi::MPI_Allgatherv(
                local.as_ptr().cast(),
                values[self.rank],
                ffi::RSMPI_FLOAT,
                all.as_mut_ptr().cast(),
                values.as_ptr(),
                displs.as_ptr(),
                ffi::RSMPI_FLOAT,
                ffi::RSMPI_COMM_WORLD,
            )
        };
        if code != ffi::MPI_SUCCESS as i32 {
            return Err(InferError::setting("distributed", format!("MPI_Allgatherv failed with MPI error {code}")));
        }
        // SAFETY: see above; MPI returned success, so the `at` values are written.
        unsafe { all.set_len(at as usize) };
        self.nanos.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(all)
    }

    fn all_reduce_sum(&self, local: &[f32]) -> Result<Vec<f32>, InferError> {
        if i32::try_from(local.len()).is_err() {
            return Err(InferError::setting("distributed", "an all-reduce exceeds MPI's 2^31 - 1 values"));
        }
        // Zeroed by the allocator (fresh pages need no pass of ours); MPI writes the sum.
        let mut sum = vec![0f32; local.len()];
        let started = Instant::now();
        SimpleCommunicator::world().all_reduce_into(local, &mut sum[..], SystemOperation::sum());
        self.nanos.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(sum)
    }

    fn abort(&self, message: &str) -> ! {
        eprintln!("error (rank {} of {}): {message}", self.rank, self.size);
        SimpleCommunicator::world().abort(1)
    }

    fn seconds_communicating(&self) -> f64 {
        self.nanos.load(Ordering::Relaxed) as f64 * 1e-9
    }
}
