//! The diagnostics of a particle set or a trace: kernel Stein discrepancy and MMD, effective
//! sample size and split R-hat, the traces they are computed from, the stationarity check (do
//! MALA chains started at the particles leave their moments where they are?), the
//! `stansummary`-style summary of draws, and Pareto-smoothed importance sampling with PSIS-LOO
//! cross-validation (`loo.rs`). The samplers themselves (MALA, autoMALA, ChEES-HMC, NUTS and the
//! polish step that runs them) live in [`crate::samplers`].

mod diagnostics;
mod loo;
mod metrics;
pub(crate) mod stationarity;
pub(crate) mod summary;
mod trace;

pub use diagnostics::{TraceDiagnostics, TraceView, bulk_ess, ess, split_rhat};
pub use loo::{
    Loo, LooCompare, LooCompareRow, LooPoint, Truncation, gpd_fit, k_threshold, log_sum_exp, loo, loo_compare,
    loo_with, psis, psis_smooth,
};
pub use metrics::{Statistic, ksd_squared, mmd_squared, weighted_mmd_squared};
pub(crate) use stationarity::MIN_STEP_RATIO;
pub use stationarity::{
    MIN_ACCEPTANCE, MIN_PARTICLES, MalaChains, MomentShift, Stationarity, StationarityConfig, TARGET_ACCEPTANCE,
    bonferroni_threshold, mala_chains, normal_quantile, stationarity_check, stationarity_check_chains,
};
pub use summary::{Summary, SummaryRow};
pub use trace::{Trace, TraceConfig};
