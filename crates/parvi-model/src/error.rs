//! The model DSL's error type.

use thiserror::Error;

/// Errors raised by the model DSL. Each names the setting or block at fault.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum ModelError {
    #[error("unknown backend `{0}` (expected one of: ndarray, flex, wgpu)")]
    /// The backend name is not one parvi knows.
    UnknownBackend(String),
    #[error("backend `{0}` is not compiled in: rebuild with `--features {0}`")]
    /// The backend is known but this build left out its cargo feature.
    BackendNotCompiled(&'static str),
    #[error("backend `{backend}` has no usable device: {reason}")]
    /// The backend is compiled in but found no device to run on.
    NoDevice {
        /// Name of the backend.
        backend: &'static str,
        /// Why no device could be opened.
        reason: String,
    },
    #[error("parameter `{name}` of {dist}: {reason}")]
    /// A distribution was built with a parameter outside its support.
    InvalidParameter {
        /// Name of the distribution.
        dist: &'static str,
        /// Name of the offending parameter.
        name: &'static str,
        /// What is wrong with its value.
        reason: String,
    },
    #[error("parameter block `{0}` is not in the layout")]
    /// A parameter block was looked up by a name the layout does not hold.
    UnknownBlock(String),
    #[error("parameter block `{0}` appears twice in the layout")]
    /// Two parameter blocks share a name.
    DuplicateBlock(String),
    #[error("parameter block `{name}`: {reason}")]
    /// A parameter block's shape or constraint is unusable.
    InvalidBlock {
        /// Name of the block.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    #[error("particle matrix has {got} columns but the model has dimension {expected}")]
    /// The particle matrix's width differs from the model's dimension.
    DimensionMismatch {
        /// The model's dimension.
        expected: usize,
        /// Columns of the particle matrix.
        got: usize,
    },
    #[error("the density gives values only: no gradient is available (use a gradient-free engine)")]
    /// A score was asked of a density that gives values only.
    NoGradient,
    #[error("{0} cannot be sampled with tensor-valued parameters: give scalars")]
    /// Sampling was asked of a distribution whose parameters are tensors, not scalars.
    NotSampleable(&'static str),
    #[error("{name}: {reason}")]
    /// A reported or generated quantity is declared wrongly, or a generated quantity's `_rng`
    /// function was given an argument outside its support.
    Quantity {
        /// The quantity or `_rng` function (with its argument) at fault.
        name: String,
        /// What is wrong.
        reason: String,
    },
    #[error(transparent)]
    /// An ODE solve failed or was given bad arguments ([`crate::ode`]).
    Ode(#[from] crate::ode::OdeError),
}
