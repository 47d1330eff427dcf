//! Kernels and the Stein operator: radial kernels `k = f(r^2)` with their bandwidth rules,
//! the moment-matching kernel (a radial kernel plus linear features), multiple kernels, random
//! Fourier features, and the Stein direction and Stein kernel built
//! from a radial kernel's profile and its derivatives; the pairs of one point set in tiles (no
//! `n x n` matrix for large `n`), and the memory check for the methods that need the matrix.

mod memory;
mod moment;
mod multi;
mod pairs;
mod radial;
mod rff;
mod stein;

pub use memory::{METHODS_THAT_SCALE, available_memory_bytes, format_bytes, matrix_bytes, require_matrices_fit};
pub use moment::{MomentMatching, linear_direction, linear_stein_kernel};
pub(crate) use multi::validate_scales;
pub use multi::{BaseProfiles, MultiKernel, validate_bandwidths};
pub use pairs::{
    DENSE_MAX_POINTS, EXACT_MEDIAN_MAX_POINTS, FUSED_MAX_DIM, GPU_TILE_SIDE, MEDIAN_SAMPLE_MIN_PAIRS,
    MEDIAN_SAMPLE_PAIRS, PairTiles, TILE_BUDGET_BYTES, median_is_exact, median_sample_pairs, pair_median_sq,
    sampled_pair_median_sq, svgd_direction_tiled,
};
pub use radial::{Bandwidth, Imq, Kernel, KernelConfig, RadialEval, Rbf, median_bandwidth, median_h2, median_rule_h2};
pub use rff::{FourierStein, RandomFourierFeatures};
pub use stein::{
    repulsion_from, require_row_blocks, stein_direction, stein_kernel, stein_kernel_matrix, svgd_direction,
    svgd_direction_at_shard, svgd_direction_dense, svgd_direction_rows, svgd_shard_of,
};
