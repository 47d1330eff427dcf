//! The sixteen posteriors of `../shared/posteriordb-more` (docs/posteriordb.md), one module per
//! batch of models: each checks its models against independent `f64` evaluations of the Stan
//! programs, their reported and generated quantities, their data checks, and NUTS against
//! Stan's reference where one exists.

#[allow(dead_code)] // the original suite's finder is not used here
mod common;

#[path = "posteriordb_more/more_2.rs"]
mod more_2;
