//! The multivariate normal parameterised by a Cholesky factor of its covariance: now in
//! [`crate::dist::multivariate`], re-exported here so `parvi_model::mvn::MultiNormalCholesky`
//! still names it.

pub use crate::dist::multivariate::MultiNormalCholesky;
