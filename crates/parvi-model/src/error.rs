use thiserror::Error;

/// Errors raised by the model DSL. Each names the setting or block at fault.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum ModelError {
    #[error("unknown backend `{0}` (expected one of: ndarray, flex, wgpu)")]
    UnknownBackend(String),
    #[error("backend `{0}` is not compiled in: rebuild with `--features {0}`")]
    BackendNotCompiled(&'static str),
    #[error("backend `{backend}` has no usable device: {reason}")]
    NoDevice { backend: &'static str, reason: String },
    #[error("parameter `{name}` of {dist}: {reason}")]
    InvalidParameter { dist: &'static str, name: &'static str, reason: String },
    #[error("parameter block `{0}` is not in the layout")]
    UnknownBlock(String),
    #[error("parameter block `{0}` appears twice in the layout")]
    DuplicateBlock(String),
    #[error("parameter block `{name}`: {reason}")]
    InvalidBlock { name: String, reason: String },
    #[error("particle matrix has {got} columns but the model has dimension {expected}")]
    DimensionMismatch { expected: usize, got: usize },
    #[error("the density gives values only: no gradient is available (use a gradient-free engine)")]
    NoGradient,
    #[error("{0} cannot be sampled with tensor-valued parameters: give scalars")]
    NotSampleable(&'static str),
}
