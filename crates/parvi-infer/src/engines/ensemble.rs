//! A deep ensemble (Lakshminarayanan, Pritzel & Blundell 2017): independent MAP estimates from
//! the prior's random starts. Each particle climbs its own log-joint, `phi(x_i) = grad log p(x_i)`:
//! SVGD's driving term with the kernel and its repulsion taken away (the kernel matrix the
//! identity). The particles never see each other; their spread is only that of the modes their
//! starts lead to.

use burn::tensor::Tensor;
use parvi_model::score;
use serde::{Deserialize, Serialize};

use super::EngineConfig;
use crate::core::shard::{ParticleShard, ShardBy};
use crate::core::{Direction, DirectionEngine};
use crate::{AdapterConfig, Engine, InferError, KernelConfig, StepAdapter, StepContext};

/// The ensemble's direction: each particle's own score.
pub struct Ensemble;

impl Ensemble {
    /// An ensemble moving by `adapter` (per coordinate, as every direction engine).
    pub fn new(adapter: Box<dyn StepAdapter>) -> DirectionEngine<Self> {
        DirectionEngine::new(Self, adapter)
    }
}

impl Direction for Ensemble {
    fn name(&self) -> &'static str {
        "ensemble"
    }

    fn ascent(&mut self, ctx: &mut StepContext<'_>, x: Tensor<2>) -> Result<Tensor<2>, InferError> {
        Ok(score(ctx.model, x, ctx.batch)?.grad)
    }

    /// Each row is its own particle's score: any split of the particles or of the data rows
    /// works.
    fn can_shard(&self, _by: ShardBy) -> Result<(), InferError> {
        Ok(())
    }

    fn ascent_shard(
        &mut self,
        _ctx: &mut StepContext<'_>,
        _x: Tensor<2>,
        scores: Tensor<2>,
        _shard: &ParticleShard<'_>,
    ) -> Result<Tensor<2>, InferError> {
        Ok(scores)
    }

    fn ascent_from_scores(
        &mut self,
        _ctx: &mut StepContext<'_>,
        _x: Tensor<2>,
        scores: Tensor<2>,
    ) -> Result<Tensor<2>, InferError> {
        Ok(scores)
    }

    fn report(&self) -> serde_json::Value {
        serde_json::json!({ "members": "independent MAP estimates" })
    }
}

/// `ensemble`'s options: none; it takes no kernel.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnsembleConfig {}

impl EngineConfig for EnsembleConfig {
    fn build(&self, kernel: &KernelConfig, adapter: &AdapterConfig) -> Result<Box<dyn Engine>, InferError> {
        if *kernel != KernelConfig::default() {
            return Err(InferError::setting("kernel", "ensemble uses no kernel: its members never interact"));
        }
        Ok(Box::new(Ensemble::new(adapter.build()?)))
    }
}
