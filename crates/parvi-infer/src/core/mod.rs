//! The shared core every engine is built on: particles, the engine traits, the run loop with
//! its checkpoints, the seeded rng, minibatch streams and step-size rules.

mod adapter;
mod batches;
mod checkpoint;
mod engine;
mod particles;
mod precondition;
pub mod progress;
mod record;
mod rng;
mod rows;
mod run;
pub mod shard;

pub use adapter::{AdapterConfig, Schedule, StepAdapter};
pub use batches::{BatchOrder, BatchStream};
pub use checkpoint::{Checkpoint, FORMAT, RunIdentity, write_atomic};
pub use engine::{Direction, DirectionEngine, Engine, StepContext, relative_movement};
pub use particles::Particles;
pub use precondition::{Laplace, LaplaceConfig, RUNAWAY_NATS, SEPARATE_MODE, STATIONARY_GRADIENT, Whitened};
pub use record::{EngineState, TensorRecord};
pub use rng::{EngineRng, RngState};
pub use rows::{check_subset_size, random_rows, select_rows};
pub use run::{Callback, CheckpointPolicy, RunConfig, RunError, RunLabel, RunOutcome, Runner, ms_per_step};
pub use shard::{Collective, SingleProcess, is_lead};
