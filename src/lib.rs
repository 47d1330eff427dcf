//! parvi: particle-based variational inference on burn.
//!
//! This facade re-exports the model DSL ([`model`]), the engines ([`infer`]) and the ready-made
//! models ([`models`]); the `parvi` binary is built on the same items. The command line
//! ([`cli`], with the UCI loaders of `parvi-data`) is the default `cli` feature: a library user
//! who turns default features off compiles none of it.
//!
//! ```no_run
//! use parvi::model::{LogDensity, Minibatch, BackendKind};
//! use parvi::model::burn::tensor::Tensor;
//! use parvi::infer::{AdapterConfig, EngineRng, Particles, Rbf, RunConfig, Runner, Svgd};
//!
//! /// A standard normal in 2-D, written for all particles at once.
//! struct StdNormal;
//! impl LogDensity for StdNormal {
//!     fn dim(&self) -> usize { 2 }
//!     fn log_prob(&self, x: Tensor<2>, _: Option<&Minibatch>) -> Tensor<1> {
//!         let n = x.dims()[0];
//!         x.square().sum_dim(1).mul_scalar(-0.5).reshape([n])
//!     }
//! }
//!
//! let device = BackendKind::Flex.device().unwrap();
//! let mut rng = EngineRng::new(0);
//! let particles = Particles::gaussian(100, 2, 0.0, 1.0, &mut rng, &device).unwrap();
//! let mut svgd = Svgd::new(Box::new(Rbf::median()), AdapterConfig::adagrad(0.05).build().unwrap());
//! let out = Runner::new(&mut svgd, &StdNormal, particles, RunConfig::new(500, 0)).unwrap().run(&mut []).unwrap();
//! println!("{:?}", out.particles.mean());
//! ```

pub use parvi_infer as infer;
pub use parvi_model as model;
pub use parvi_models as models;

/// mimalloc serves every allocation of a program linked with parvi's `mimalloc` feature (on by
/// default): the parvi binary, a model executable (`cli::run`), the examples. Burn's autodiff
/// makes a few hundred small allocations per score; on a small model that allocation is a
/// quarter of the call. Turn the feature off to bring your own `#[global_allocator]`.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[cfg(feature = "cli")]
pub mod cli;
pub mod memory;
pub mod stan_methods;
pub mod workflow;
