//! parvi's particle engines on one shared core.
//!
//! The core: [`Particles`] (positions and optional weights), [`kernel`]s evaluated in batched
//! tensor operations, the [`stein`] operator every Stein method is built from, step-size
//! [`adapter`]s, a seeded checkpointable [`rng`], minibatch [`batches`], and one [`run`] loop
//! (progress bar, callbacks, divergence guard, checkpoint and resume) for all engines.
//! Each method is a small [`Engine`] on that core: [`svgd::Svgd`] first.

pub mod adapter;
pub mod annealed;
pub mod batches;
pub mod checkpoint;
pub mod diagnostics;
pub mod engine;
pub mod error;
pub mod gf_svgd;
pub mod induced;
pub mod kernel;
pub mod linalg;
pub mod metrics;
pub mod mk_svgd;
pub mod mmd_fw;
pub mod multi_kernel;
pub mod particles;
pub mod record;
pub mod rff;
pub mod rng;
pub mod run;
pub mod sgld;
pub mod stein;
pub mod stein_points;
pub mod subset;
pub mod svgd;
pub mod trace;

pub use adapter::{AdapterConfig, Schedule, StepAdapter};
pub use annealed::{AnnealedConfig, AnnealedGfSvgd, AnnealedSvgd, CurveFit, CurveFitKind, TemperatureSchedule};
pub use batches::{BatchOrder, BatchStream};
pub use engine::{Direction, DirectionEngine, Engine, StepContext};
pub use error::InferError;
pub use gf_svgd::{AuxDensity, GfSvgd, GfSvgdConfig};
pub use induced::{AdversarialConfig, AdversarialInduced, InducedConfig, RandomInduced};
pub use kernel::{Bandwidth, Imq, Kernel, KernelConfig, RadialEval, Rbf};
pub use mk_svgd::{MkSvgd, MkSvgdConfig};
pub use mmd_fw::{EmbeddingSource, MeanEmbedding, MmdFw, MmdFwConfig, StepRule};
pub use multi_kernel::MultiKernel;
pub use particles::Particles;
pub use record::{EngineState, TensorRecord};
pub use rng::EngineRng;
pub use run::{Callback, RunConfig, RunError, RunOutcome, Runner};
pub use sgld::{NoiseCovariance, Sgld, SgldConfig};
pub use stein_points::{SteinPoints, SteinPointsConfig};
pub use subset::{ControlFunctionalConfig, RandomSubset, SubsetConfig};
pub use svgd::Svgd;
pub use trace::{Trace, TraceConfig};
