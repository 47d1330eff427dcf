//! Ready-made parvi models. Each is a burn module whose log-joint is evaluated for all particles
//! in one batched call.

#![warn(missing_docs)]

pub mod banana;
pub mod blr;
pub mod bnn;
pub mod bnn_posterior;
pub mod builtin;
pub mod cmdstan;
pub mod exp_mixture;
pub mod gaussian;
pub mod mixture;
pub mod posterior;
pub mod posteriordb;
pub mod predictive;
pub mod rbm;
pub mod regression;
pub mod stan_data;
pub mod stan_users;
pub mod unit_mixture;

pub use banana::Banana;
pub use blr::LogisticRegression;
pub use bnn::{Bnn, BnnConfig, BnnPrediction, BnnTask, WeightPrior};
pub use builtin::{BUILTIN_TARGETS, BuiltinTarget, builtin_target};
pub use exp_mixture::ExponentialMixture;
pub use gaussian::Gaussian;
pub use mixture::GaussianMixture;
pub use rbm::GaussBernoulliRbm;
pub use unit_mixture::UnitMixture;
