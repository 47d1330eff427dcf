//! Evaluation of a particle set or a trace: kernel Stein discrepancy and MMD, effective sample
//! size and split R-hat, the traces they are computed from, and the stationarity check (do MALA
//! chains started at the particles leave their moments where they are?), and the polish step
//! that continues those chains (MALA, autoMALA or ChEES-HMC) until they have mixed; the
//! `stansummary`-style summary of draws; and Pareto-smoothed importance sampling with PSIS-LOO
//! cross-validation (`loo.rs`).

mod auto_mala;
mod chees;
mod diagnostics;
mod loo;
mod metrics;
mod polish;
mod stationarity;
mod summary;
mod trace;

pub(crate) use chees::regularised_covariance;
pub use chees::{CHEES_TARGET_ACCEPTANCE, DENSE_MAX_DIM, MAX_LEAPFROG, halton};
pub use diagnostics::{TraceDiagnostics, TraceView, bulk_ess, ess, split_rhat};
pub use loo::{
    Loo, LooCompare, LooCompareRow, LooPoint, Truncation, gpd_fit, k_threshold, log_sum_exp, loo, loo_compare,
    loo_with, psis, psis_smooth,
};
pub use metrics::{Statistic, ksd_squared, mmd_squared, weighted_mmd_squared};
pub use polish::{
    CHEES_AFTER, CHEES_PROJECTED, FrameChoice, HOPELESS_RHAT, MAX_KEPT, NUTS_AFTER, NUTS_CHAINS, PROBE_STEPS,
    PROJECT_FROM, Polish, PolishConfig, PolishKernel, PolishWhen, Polished, STUCK_ACCEPTANCE, STUCK_SHARE, polish,
    polish_reported,
};
pub(crate) use polish::{TakeOver, chains_statistic, polish_offering};
pub use stationarity::{
    MIN_ACCEPTANCE, MIN_PARTICLES, MalaChains, MomentShift, Stationarity, StationarityConfig, TARGET_ACCEPTANCE,
    bonferroni_threshold, mala_chains, normal_quantile, stationarity_check, stationarity_check_chains,
};
pub use summary::{Summary, SummaryRow};
pub use trace::{Trace, TraceConfig};
