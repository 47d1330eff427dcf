//! parvi's particle engines on one shared core.
//!
//! The core: [`Particles`] (positions and optional weights), [`kernel`]s evaluated in batched
//! tensor operations, the [`stein`] operator every Stein method is built from, step-size
//! [`adapter`]s, a seeded checkpointable [`rng`], minibatch [`batches`], and one [`run`] loop
//! (progress bar, callbacks, divergence guard, checkpoint and resume) for all engines.
//! Each method is a small [`Engine`] on that core: [`svgd::Svgd`] first.

pub mod adapter;
pub mod batches;
pub mod checkpoint;
pub mod engine;
pub mod error;
pub mod kernel;
pub mod metrics;
pub mod particles;
pub mod record;
pub mod rng;
pub mod run;
pub mod stein;
pub mod svgd;

pub use adapter::{AdapterConfig, Schedule, StepAdapter};
pub use batches::{BatchOrder, BatchStream};
pub use engine::{Engine, StepContext};
pub use error::InferError;
pub use kernel::{Bandwidth, Imq, Kernel, KernelConfig, RadialEval, Rbf};
pub use particles::Particles;
pub use record::{EngineState, TensorRecord};
pub use rng::EngineRng;
pub use run::{Callback, RunConfig, RunError, RunOutcome, Runner};
pub use svgd::Svgd;
