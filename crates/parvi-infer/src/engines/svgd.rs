//! Stein variational gradient descent (Liu & Wang 2016):
//! `phi(x_i) = (1/n) sum_j [k(x_j, x_i) grad log p(x_j) + grad_{x_j} k(x_j, x_i)]`.

use burn::tensor::Tensor;
use parvi_model::score;

use crate::core::shard::{ParticleShard, ShardBy};
use crate::core::{Direction, DirectionEngine};
use crate::kernels::{DENSE_MAX_POINTS, require_matrices_fit, require_row_blocks, svgd_direction, svgd_shard_of};
use crate::{InferError, Kernel, Particles, StepAdapter, StepContext};
use serde::{Deserialize, Serialize};

use super::EngineConfig;
use crate::{AdapterConfig, Engine, KernelConfig};

/// SVGD's direction: kernel-weighted scores plus the kernel's repulsion.
pub struct Svgd {
    kernel: Box<dyn Kernel>,
}

impl Svgd {
    /// SVGD moving by `kernel` and `adapter`.
    pub fn new(kernel: Box<dyn Kernel>, adapter: Box<dyn StepAdapter>) -> DirectionEngine<Self> {
        DirectionEngine::new(Self { kernel }, adapter)
    }
}

impl Direction for Svgd {
    fn name(&self) -> &'static str {
        "svgd"
    }

    /// The RBF and IMQ kernels work in tiles at any particle count; a kernel that cannot
    /// ([`Kernel::resolved`]) needs the `n x n` matrices, refused here if they cannot fit.
    fn init(&mut self, particles: &Particles) -> Result<(), InferError> {
        let n = particles.len();
        if n > DENSE_MAX_POINTS && self.kernel.resolved(n, &mut || 0.0).is_none() {
            let what = format!("svgd's n x n kernel matrices under {}", self.kernel.describe());
            require_matrices_fit("particles", n, &what, n, n, 3)?;
        }
        Ok(())
    }

    fn ascent(&mut self, ctx: &mut StepContext<'_>, x: Tensor<2>) -> Result<Tensor<2>, InferError> {
        let s = score(ctx.model, x.clone(), ctx.batch)?;
        Ok(svgd_direction(self.kernel.as_ref(), x, s.grad))
    }

    /// Particles sharded with any kernel evaluated in blocks (the RBF with any bandwidth rule,
    /// the IMQ); rows sharded with any kernel (the kernel part is replicated).
    fn can_shard(&self, by: ShardBy) -> Result<(), InferError> {
        match by {
            ShardBy::Particles => require_row_blocks("svgd", self.kernel.as_ref()),
            ShardBy::Rows => Ok(()),
        }
    }

    fn ascent_shard(
        &mut self,
        _ctx: &mut StepContext<'_>,
        x: Tensor<2>,
        scores: Tensor<2>,
        shard: &ParticleShard<'_>,
    ) -> Result<Tensor<2>, InferError> {
        svgd_shard_of("svgd", self.kernel.as_ref(), x, scores, shard)
    }

    fn ascent_from_scores(
        &mut self,
        _ctx: &mut StepContext<'_>,
        x: Tensor<2>,
        scores: Tensor<2>,
    ) -> Result<Tensor<2>, InferError> {
        Ok(svgd_direction(self.kernel.as_ref(), x, scores))
    }

    fn report(&self) -> serde_json::Value {
        serde_json::json!({ "kernel": self.kernel.describe() })
    }
}

/// `svgd`'s options: none beyond the shared kernel and step-size rule.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SvgdConfig {}

impl EngineConfig for SvgdConfig {
    fn build(&self, kernel: &KernelConfig, adapter: &AdapterConfig) -> Result<Box<dyn Engine>, InferError> {
        Ok(Box::new(Svgd::new(kernel.build()?, adapter.build()?)))
    }
}
