//! The engines, by family. Each is a small [`crate::Engine`] (or [`crate::Direction`]) on the
//! core and the kernels; no engine imports another.

use crate::{AdapterConfig, Engine, InferError, KernelConfig};

mod ensemble;
mod function_space;
mod gradient_free;
mod greedy;
mod mk_svgd;
pub mod pathfinder;
mod sgld;
mod speedup;
mod svgd;

pub use ensemble::{Ensemble, EnsembleConfig};
pub use function_space::{
    FunctionSpace, FunctionSpaceConfig, FunctionSpaceStep, PairMixing, PriorSpace, Repulsion, function_prior_score,
    function_space_direction, gaussian_repulsion, kde_repulsion, measurement_points, pair_points,
};
pub use gradient_free::*;
pub use greedy::*;
pub use mk_svgd::{
    DEFAULT_LOG2_MAX, DEFAULT_LOG2_MIN, MkSvgd, MkSvgdConfig, describe_papers_grid, kernel_weights,
    rbf_bandwidth_of_papers_h,
};
// NUTS is a sampler of `crate::samplers` and an engine here (`--method nuts`).
pub use crate::samplers::nuts::{self, ChainReport, MetricEstimate, Nuts, NutsConfig, NutsInit, NutsRun, nuts};
pub use pathfinder::{Pathfinder, PathfinderConfig, PathfinderFit};
pub use sgld::{NoiseCovariance, RepulsiveSgldConfig, Sgld, SgldConfig, batched_repulsion};
pub use speedup::*;
pub use svgd::{Svgd, SvgdConfig};

/// An engine's own configuration: it builds its engine from the settings every method shares
/// (the kernel and the step-size rule) and carries its own rules about them, e.g. a method with
/// its own kernels refuses a shared one.
pub trait EngineConfig {
    /// The engine, or an error naming the setting that does not apply.
    fn build(&self, kernel: &KernelConfig, adapter: &AdapterConfig) -> Result<Box<dyn Engine>, InferError>;

    /// Whether the engine steps with the shared step-size rule (`build`'s `adapter`): `false`
    /// for a method with steps of its own (SGLD's schedule, Pathfinder's line search, greedy
    /// points), for which a user's step size is refused by name rather than ignored.
    fn uses_step_rule(&self) -> bool {
        true
    }
}
