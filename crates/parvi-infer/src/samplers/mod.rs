//! The samplers, together: MALA (`mala.rs`), autoMALA (Biron-Lattes et al. 2024,
//! `auto_mala.rs`), ChEES-HMC (Hoffman, Radul & Sountsov 2021, `chees.rs`), Stan's NUTS
//! (`nuts.rs`, also the engine `--method nuts`), and the polish step that runs the first three on
//! a particle set's chains until they mix, offering unmixed chains to NUTS (`polish.rs`). Every
//! one scores its proposals through [`mala::proposal_score`]: a failed evaluation is a rejected
//! proposal, counted with the model's own cause. The diagnostics they are judged by live in
//! [`crate::evaluation`].

pub(crate) mod auto_mala;
pub(crate) mod chees;
pub(crate) mod mala;
pub mod nuts;
mod polish;

pub(crate) use chees::regularised_covariance;
pub use chees::{CHEES_TARGET_ACCEPTANCE, DENSE_MAX_DIM, MAX_LEAPFROG, halton};
pub use nuts::{ChainReport, MetricEstimate, Nuts, NutsConfig, NutsInit, NutsRun, nuts};
pub use polish::{
    CHEES_AFTER, CHEES_PROJECTED, FrameChoice, HOPELESS_RHAT, MAX_KEPT, NUTS_AFTER, NUTS_CHAINS, PROBE_STEPS,
    PROJECT_FROM, Polish, PolishConfig, PolishKernel, PolishWhen, Polished, STUCK_ACCEPTANCE, STUCK_SHARE, polish,
    polish_reported,
};
pub(crate) use polish::{TakeOver, chains_statistic, polish_offering};
