//! parvi's particle engines on one shared core.
//!
//! - [`core`]: [`Particles`] (positions and optional weights), the [`Engine`] and [`Direction`]
//!   traits, the one [`Runner`] loop (progress bar, callbacks, divergence guard, checkpoint and
//!   resume), the seeded [`EngineRng`], minibatch streams and step-size rules.
//! - [`kernels`]: radial kernels and their bandwidth rules, multiple kernels, random features,
//!   and the Stein operator every Stein method is built from.
//! - [`engines`]: the methods, by family, each a small module on the core and the kernels.
//! - [`registry`]: every engine's config by method name ([`MethodConfig`]), as a user writes it
//!   in Rust or TOML, built into a boxed [`Engine`].
//! - [`evaluation`]: KSD, MMD, ESS, R-hat, traces, the stationarity check and PSIS-LOO.
//! - [`mod@fit`]: the default path from a model to a posterior for any engine (Laplace
//!   preconditioning, initialisation, the run, the draws back in the model's coordinates).

#![warn(missing_docs)]

pub mod core;
pub mod engines;
mod error;
pub mod evaluation;
pub mod fit;
pub mod kernels;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod registry;
pub mod samplers;

pub use crate::core::{
    AdapterConfig, BatchOrder, BatchStream, Callback, CheckpointPolicy, Direction, DirectionEngine, Engine, EngineRng,
    EngineState, Laplace, LaplaceConfig, Particles, RunConfig, RunError, RunLabel, RunOutcome, Runner, Schedule,
    StepAdapter, StepContext, TensorRecord, Whitened,
};
pub use engines::EngineConfig;
pub use engines::{
    AdversarialConfig, AdversarialInduced, AnnealedConfig, AnnealedGfSvgd, AnnealedSvgd, AuxDensity,
    ControlFunctionalConfig, CurveFit, CurveFitKind, EmbeddingSource, GfSvgd, GfSvgdConfig, InducedConfig,
    MeanEmbedding, MetricEstimate, MkSvgd, MkSvgdConfig, MmdFw, MmdFwConfig, NoiseCovariance, Nuts, NutsConfig,
    Pathfinder, PathfinderConfig, PathfinderFit, RandomInduced, RandomSubset, Sgld, SgldConfig, SteinPoints,
    SteinPointsConfig, StepRule, SubsetConfig, Svgd, TemperatureSchedule,
};
pub use error::InferError;
pub use evaluation::{Trace, TraceConfig};
pub use fit::{
    DEFAULT_STEPS, Diagnostics, FitConfig, FitResult, NutsFrame, Phase, Precondition, SettleConfig, fit, fit_reported,
};
pub use kernels::{Bandwidth, Imq, Kernel, KernelConfig, MultiKernel, RadialEval, Rbf};
pub use registry::{EngineSpec, MethodConfig};
