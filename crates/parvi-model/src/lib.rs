//! parvi's model DSL.
//!
//! A model is a log-joint density written as a burn module and evaluated for **all particles in
//! one batched call**: a particle matrix `[n, dim]` goes in, `log p` of shape `[n]` comes out.
//! Everything an engine needs beyond that (scores, gradients with respect to kernel parameters)
//! comes from burn's autodiff through [`grad`].
//!
//! The DSL knows nothing of engines or file formats: it speaks tensors.

#![warn(missing_docs)]

pub mod backend;
pub mod density;
pub mod dist;
pub mod error;
pub mod fastmath;
pub mod functions;
pub mod fused;
pub mod grad;
pub mod hmm;
pub mod index;
pub mod layers;
pub mod layout;
pub mod linalg;
pub mod minibatch;
pub mod mvn;
pub mod ode;
pub mod program;
pub mod scan;
pub mod strided_gemm;
pub mod tensor_ops;

pub use backend::BackendKind;
pub use density::{LogDensity, ValueDensity, ValueOnly, ValuesOf};
pub use error::ModelError;
pub use grad::{RowScore, Score, score, score_rows, value_and_grad, value_and_grad2};
pub use layers::{Activation, DenseLayer, DenseStack, LayerOps};
pub use layout::{Block, CONSTRAINT_TOLERANCE, Constraint, ParamLayout, Unpacked};
pub use minibatch::Minibatch;

/// Re-exported so users write models against the same burn the engines use.
pub use burn;
