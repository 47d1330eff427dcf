//! The engine interface: each method is a small init/step unit on the shared core (BlackJAX's
//! shape), driven by the one run loop, [`crate::Runner`].

use burn::tensor::{Device, Tensor};
use parvi_model::{LogDensity, Minibatch, score};

use crate::core::shard::{Collective, ShardBy, ShardPart, not_shardable, rows_sharded_ascent, sharded_ascent};
use crate::{EngineRng, EngineState, InferError, Particles, StepAdapter};

/// Why a method without a sharded step cannot run sharded.
const NOT_A_ROW_SUM: &str = "only a method whose direction at each particle is a sum over all \
particles' positions and scores (svgd, a-svgd) splits its rows across ranks";

/// Why a method cannot have the data rows sharded.
const NOT_A_SCORE_SUM: &str = "only a method whose direction depends on the data through the \
model's score alone (svgd, ensemble) can sum its scores over ranks that hold the rows";

/// Why a method without a sharded step split `by` cannot run so.
fn reason(by: ShardBy) -> &'static str {
    match by {
        ShardBy::Particles => NOT_A_ROW_SUM,
        ShardBy::Rows => NOT_A_SCORE_SUM,
    }
}

/// What a step may use besides the particles.
pub struct StepContext<'a> {
    /// The target, evaluated for all particles at once.
    pub model: &'a dyn LogDensity,
    /// This step's minibatch, when the model has data and a batch size is set.
    pub batch: Option<&'a Minibatch>,
    /// The run's seeded random stream (checkpointed with the run).
    pub rng: &'a mut EngineRng,
    /// 0-based step index.
    pub step: usize,
}

/// A particle method.
pub trait Engine: Send {
    /// The method's name as `--method` spells it.
    fn name(&self) -> &'static str;

    /// Called once before the first step (not on resume): validate against the particles and
    /// set up state that depends on them.
    fn init(&mut self, particles: &Particles) -> Result<(), InferError> {
        let _ = particles;
        Ok(())
    }

    /// One step: moves (or grows, or reweights) `particles` in place.
    fn step(&mut self, ctx: &mut StepContext<'_>, particles: &mut Particles) -> Result<(), InferError>;

    /// Everything beyond the particles that a resumed run needs.
    fn save(&self) -> EngineState;

    /// Restores what [`Engine::save`] wrote.
    fn load(&mut self, state: &EngineState, device: &Device) -> Result<(), InferError>;

    /// The draws that stand for the posterior when the run ends, if they are not the particles'
    /// final positions: an MCMC engine's collected trace (after burn-in and thinning). `None`
    /// means the final particles (with their weights) are the answer.
    fn draws(&self) -> Option<Particles> {
        None
    }

    /// Method-specific results for summaries (learned weights, ...).
    fn report(&self) -> serde_json::Value {
        serde_json::Value::Null
    }

    /// `Ok` when [`Engine::step_sharded`] is implemented for this engine as configured and
    /// split `by`; else the error naming the method and why.
    fn can_shard(&self, by: ShardBy) -> Result<(), InferError> {
        Err(not_shardable(self.name(), reason(by)))
    }

    /// One step with the work split `by` particles or data rows among the ranks of
    /// `collective` ([`crate::core::shard`]): every rank ends with the particles
    /// [`Engine::step`] gives, up to float rounding. With [`ShardBy::Rows`] the model in `ctx`
    /// is this rank's [`crate::core::shard::RowShard`].
    fn step_sharded(
        &mut self,
        ctx: &mut StepContext<'_>,
        particles: &mut Particles,
        collective: &dyn Collective,
        by: ShardBy,
    ) -> Result<(), InferError> {
        let _ = (ctx, particles, collective);
        Err(not_shardable(self.name(), reason(by)))
    }
}

/// A method that moves every particle along an ascent direction it computes each step (SVGD
/// and most of its family). It gives only the direction; [`DirectionEngine`] adds what they all
/// share: the step-size adapter, `x <- x + adapter(phi)`, and the adapter's checkpoint state.
pub trait Direction: Send {
    /// The method's name as `--method` spells it.
    fn name(&self) -> &'static str;

    /// Validates against the first particles (see [`Engine::init`]).
    fn init(&mut self, particles: &Particles) -> Result<(), InferError> {
        let _ = particles;
        Ok(())
    }

    /// The ascent direction `[n, dim]` at the particles `x`.
    fn ascent(&mut self, ctx: &mut StepContext<'_>, x: Tensor<2>) -> Result<Tensor<2>, InferError>;

    /// `Ok` when this method as configured can be split `by` particles
    /// ([`Direction::ascent_shard`]) or data rows ([`Direction::ascent_from_scores`]).
    fn can_shard(&self, by: ShardBy) -> Result<(), InferError> {
        Err(not_shardable(self.name(), reason(by)))
    }

    /// The scores a sharded step gathers, at this rank's rows `x_rows` of the particles: the
    /// model's score, or what the method uses in its place (A-SVGD's annealed score).
    fn shard_scores(&mut self, ctx: &mut StepContext<'_>, x_rows: Tensor<2>) -> Result<Tensor<2>, InferError> {
        Ok(score(ctx.model, x_rows, ctx.batch)?.grad)
    }

    /// This rank's part of [`Direction::ascent`] at all particles `x` when the particles `rows`
    /// are this rank's and `scores` `[rows, dim]` their [`Direction::shard_scores`]: either the
    /// direction's rows at them, or their share of every particle's direction (a sum over the
    /// particles' terms restricted to `rows`; the shares are added across ranks). A kernel with
    /// the median bandwidth takes it from `median_sq`, given this rank's `[rows, n]` block of
    /// squared distances (it gathers the ranks' blocks). Draws from `ctx.rng` exactly what
    /// `ascent` draws.
    fn ascent_shard(
        &mut self,
        ctx: &mut StepContext<'_>,
        x: Tensor<2>,
        scores: Tensor<2>,
        rows: std::ops::Range<usize>,
        median_sq: &mut dyn FnMut(&Tensor<2>) -> f32,
    ) -> Result<ShardPart, InferError> {
        let _ = (ctx, x, scores, rows, median_sq);
        Err(not_shardable(self.name(), NOT_A_ROW_SUM))
    }

    /// [`Direction::ascent`] at `x` given every particle's score `scores` `[n, dim]` (summed
    /// over the ranks that hold the data rows).
    fn ascent_from_scores(
        &mut self,
        ctx: &mut StepContext<'_>,
        x: Tensor<2>,
        scores: Tensor<2>,
    ) -> Result<Tensor<2>, InferError> {
        let _ = (ctx, x, scores);
        Err(not_shardable(self.name(), NOT_A_SCORE_SUM))
    }

    /// Method-specific results for summaries.
    fn report(&self) -> serde_json::Value {
        serde_json::Value::Null
    }
}

/// The engine of a [`Direction`] method: its direction through a step-size adapter.
pub struct DirectionEngine<M> {
    method: M,
    adapter: Box<dyn StepAdapter>,
    /// The last step's positions and displacement, for the convergence diagnostic (read only
    /// when a report is asked for: no host read on the step).
    last_move: Option<(Tensor<2>, Tensor<2>)>,
}

impl<M: Direction> DirectionEngine<M> {
    /// `method`'s directions, stepped by `adapter`.
    pub fn new(method: M, adapter: Box<dyn StepAdapter>) -> Self {
        Self { method, adapter, last_move: None }
    }

    /// The method, for its own inspection functions.
    pub fn method(&self) -> &M {
        &self.method
    }

    /// `x <- x + adapter(phi)`, keeping the move for [`relative_movement`].
    fn advance(&mut self, particles: &mut Particles, phi: Tensor<2>) {
        let x = particles.positions.clone();
        let delta = self.adapter.delta(phi);
        particles.positions = x.clone() + delta.clone();
        self.last_move = Some((x, delta));
    }
}

impl<M: Direction> Engine for DirectionEngine<M> {
    fn name(&self) -> &'static str {
        self.method.name()
    }

    fn init(&mut self, particles: &Particles) -> Result<(), InferError> {
        self.method.init(particles)
    }

    fn step(&mut self, ctx: &mut StepContext<'_>, particles: &mut Particles) -> Result<(), InferError> {
        let phi = self.method.ascent(ctx, particles.positions.clone())?;
        self.advance(particles, phi);
        Ok(())
    }

    fn can_shard(&self, by: ShardBy) -> Result<(), InferError> {
        self.method.can_shard(by)
    }

    /// The direction in shards; the adapter, replicated, steps the full direction on every rank.
    fn step_sharded(
        &mut self,
        ctx: &mut StepContext<'_>,
        particles: &mut Particles,
        collective: &dyn Collective,
        by: ShardBy,
    ) -> Result<(), InferError> {
        let x = particles.positions.clone();
        let phi = match by {
            ShardBy::Particles => sharded_ascent(&mut self.method, ctx, x, collective)?,
            ShardBy::Rows => rows_sharded_ascent(&mut self.method, ctx, x, collective)?,
        };
        self.advance(particles, phi);
        Ok(())
    }

    fn save(&self) -> EngineState {
        EngineState::of_adapter(self.adapter.as_ref())
    }

    fn load(&mut self, state: &EngineState, device: &Device) -> Result<(), InferError> {
        state.load_adapter(self.adapter.as_mut(), device)
    }

    /// The method's report, with `movement`: the last step's root-mean-square displacement over
    /// the particles' root-mean-square spread about their mean. It falls towards zero as a
    /// deterministic method converges; a run that ends with it large was still moving.
    fn report(&self) -> serde_json::Value {
        let mut report = self.method.report();
        if let Some(movement) = self.last_move.as_ref().map(|(x, delta)| relative_movement(x, delta)) {
            match &mut report {
                serde_json::Value::Object(map) => {
                    map.insert("movement".into(), serde_json::json!(movement));
                }
                serde_json::Value::Null => report = serde_json::json!({ "movement": movement }),
                _ => {}
            }
        }
        report
    }
}

/// `rms(delta) / rms(x - mean(x))`, on the host (two scalars read).
pub fn relative_movement(x: &Tensor<2>, delta: &Tensor<2>) -> f64 {
    let spread = (x.clone() - x.clone().mean_dim(0)).square().mean().into_scalar::<f32>() as f64;
    let step = delta.clone().square().mean().into_scalar::<f32>() as f64;
    if spread > 0.0 { (step / spread).sqrt() } else { f64::INFINITY }
}
