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
    #[error("parameter `{name}` of {dist}, element [{}] (1-based, row-major): {reason}", element + 1)]
    /// One element of a tensor argument (data a distribution or function checks on the host: a
    /// negative count, a label outside `{0, 1}`, an index out of range) is outside its support.
    /// `element` is its 0-based position in the argument flattened row-major, which is its
    /// position in the data field a `[1, size]` data tensor was read from (the data layer
    /// prints it 1-based, as Stan does).
    InvalidElement {
        /// Name of the distribution or function.
        dist: &'static str,
        /// Name of the offending argument.
        name: &'static str,
        /// 0-based row-major position of the offending element in the argument.
        element: usize,
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

/// A constructor's argument that an error blames: what a data layer needs to name the data
/// field the argument was read from (the DSL knows no field, only its own argument names).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ArgumentError<'a> {
    /// The distribution or function (`Exponential`, `PoissonLog`, `ode_rk45`).
    pub owner: &'a str,
    /// Its argument at fault (`rate`, `counts`, `ts`).
    pub name: &'a str,
    /// The element at fault, 0-based row-major in the argument, where one is.
    pub element: Option<usize>,
    /// What is wrong, without the argument's name.
    pub reason: &'a str,
}

impl ModelError {
    /// The argument this error blames, where it blames one: a parameter outside its support
    /// ([`ModelError::InvalidParameter`]), an element of a data argument
    /// ([`ModelError::InvalidElement`]), or an ODE argument ([`crate::ode::OdeError::InvalidArgument`]).
    pub fn argument(&self) -> Option<ArgumentError<'_>> {
        match self {
            ModelError::InvalidParameter { dist, name, reason } => {
                Some(ArgumentError { owner: dist, name, element: None, reason })
            }
            ModelError::InvalidElement { dist, name, element, reason } => {
                Some(ArgumentError { owner: dist, name, element: Some(*element), reason })
            }
            ModelError::Ode(crate::ode::OdeError::InvalidArgument { name, element, reason }) => {
                Some(ArgumentError { owner: "ODE solver", name, element: *element, reason })
            }
            _ => None,
        }
    }
}
