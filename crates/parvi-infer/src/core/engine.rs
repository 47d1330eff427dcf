//! The engine interface: each method is a small init/step unit on the shared core (BlackJAX's
//! shape), driven by the one run loop, [`crate::Runner`].

use burn::tensor::{Device, Tensor};
use parvi_model::{LogDensity, Minibatch, score};

use crate::core::shard::{Collective, ParticleShard, ShardBy, not_shardable, rows_sharded_ascent, sharded_ascent};
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

    /// [`Engine::save`] in a run sharded over `collective`: the whole run's state on every rank
    /// (an engine that keeps only its shard of the state gathers it; every rank calls this
    /// together, as any collective).
    fn save_sharded(&self, collective: &dyn Collective) -> Result<EngineState, InferError> {
        let _ = collective;
        Ok(self.save())
    }

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

    /// The rows of [`Direction::ascent`] at this rank's particles `shard.rows()`, `[rows, dim]`,
    /// from all particles `x` and `scores` `[rows, dim]`, their [`Direction::shard_scores`]. A
    /// method whose direction sums over all particles' scores gathers what it needs of the
    /// other ranks' through `shard` (and a kernel with the median bandwidth takes it from
    /// [`ParticleShard::median_sq`]). Draws from `ctx.rng` exactly what `ascent` draws.
    fn ascent_shard(
        &mut self,
        ctx: &mut StepContext<'_>,
        x: Tensor<2>,
        scores: Tensor<2>,
        shard: &ParticleShard<'_>,
    ) -> Result<Tensor<2>, InferError> {
        let _ = (ctx, x, scores, shard);
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
    /// The particles whose rows the adapter's state holds: all of them (`None`), or in a run
    /// with the particles sharded this rank's (of how many in all), which it alone steps.
    adapter_rows: Option<(std::ops::Range<usize>, usize)>,
    /// The last step's positions before and after, for the convergence diagnostic (read only
    /// when a report is asked for: no host read and no pass on the step).
    last_move: Option<(Tensor<2>, Tensor<2>)>,
}

impl<M: Direction> DirectionEngine<M> {
    /// `method`'s directions, stepped by `adapter`.
    pub fn new(method: M, adapter: Box<dyn StepAdapter>) -> Self {
        Self { method, adapter, adapter_rows: None, last_move: None }
    }

    /// The method, for its own inspection functions.
    pub fn method(&self) -> &M {
        &self.method
    }

    /// `x <- x + adapter(phi)` for the whole set, keeping the move for [`relative_movement`].
    fn advance(&mut self, particles: &mut Particles, phi: Tensor<2>) -> Result<(), InferError> {
        if let Some((rows, _)) = &self.adapter_rows {
            return Err(InferError::State(format!(
                "the step-size state holds particles {}..{} only (a sharded run's) and cannot step all of them",
                rows.start, rows.end
            )));
        }
        let x = particles.positions.clone();
        particles.positions = x.clone() + self.adapter.delta(phi);
        self.last_move = Some((x, particles.positions.clone()));
        Ok(())
    }

    /// Cuts the adapter's state to the shard's rows the first time this rank steps them (a
    /// fresh state has no rows yet; a loaded one holds every particle's).
    fn own_adapter_rows(&mut self, shard: &ParticleShard<'_>, device: &Device) -> Result<(), InferError> {
        match &self.adapter_rows {
            Some((rows, n)) if *rows == shard.rows() && *n == shard.particles() => Ok(()),
            Some((rows, _)) => Err(InferError::State(format!(
                "the step-size state holds particles {}..{}, this rank steps {}..{}",
                rows.start,
                rows.end,
                shard.rows().start,
                shard.rows().end
            ))),
            None => {
                let own = shard.own_state(&EngineState::of_adapter(self.adapter.as_ref()))?;
                own.load_adapter(self.adapter.as_mut(), device)?;
                self.adapter_rows = Some((shard.rows(), shard.particles()));
                Ok(())
            }
        }
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
        self.advance(particles, phi)
    }

    fn can_shard(&self, by: ShardBy) -> Result<(), InferError> {
        self.method.can_shard(by)
    }

    /// Particles sharded: each rank computes the direction at its particles, steps them with
    /// its rows of the adapter's state (every rule is element-wise, so a row steps as in one
    /// process) and the new positions are all-gathered: no rank repeats an `[n, d]` pass.
    /// Rows sharded: the direction from the summed scores and the adapter, replicated.
    fn step_sharded(
        &mut self,
        ctx: &mut StepContext<'_>,
        particles: &mut Particles,
        collective: &dyn Collective,
        by: ShardBy,
    ) -> Result<(), InferError> {
        let x = particles.positions.clone();
        match by {
            ShardBy::Particles => {
                let shard = ParticleShard::new(particles.len(), collective)?;
                self.own_adapter_rows(&shard, &x.device())?;
                let phi = sharded_ascent(&mut self.method, ctx, x.clone(), &shard)?;
                let moved = x.clone().slice([shard.rows()]) + self.adapter.delta(phi);
                particles.positions = shard.gather_rows(moved)?;
                self.last_move = Some((x, particles.positions.clone()));
                Ok(())
            }
            ShardBy::Rows => {
                let phi = rows_sharded_ascent(&mut self.method, ctx, x, collective)?;
                self.advance(particles, phi)
            }
        }
    }

    /// The adapter's state; in a run with the particles sharded, this rank's rows of it alone
    /// ([`Engine::save_sharded`] gathers the whole).
    fn save(&self) -> EngineState {
        EngineState::of_adapter(self.adapter.as_ref())
    }

    fn save_sharded(&self, collective: &dyn Collective) -> Result<EngineState, InferError> {
        let own = self.save();
        match &self.adapter_rows {
            None => Ok(own),
            Some((_, n)) => ParticleShard::new(*n, collective)?.gather_state(&own),
        }
    }

    /// The whole state of a run (every particle's rows): a sharded run cuts it to its rows at
    /// its next step.
    fn load(&mut self, state: &EngineState, device: &Device) -> Result<(), InferError> {
        self.adapter_rows = None;
        state.load_adapter(self.adapter.as_mut(), device)
    }

    fn report(&self) -> serde_json::Value {
        let mut report = self.method.report();
        let movement = self.last_move.as_ref().map(|(x, moved)| relative_movement(x, &(moved.clone() - x.clone())));
        if let Some(movement) = movement {
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
