//! The one run loop every engine shares: minibatches, callbacks every k steps, a progress bar,
//! the divergence guard, and checkpoint/resume.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use parvi_model::{LogDensity, Minibatch, score};
use thiserror::Error;

use crate::core::shard::{Collective, RowShard, RowShare, ShardBy, check_shardable_count, is_lead};
use crate::core::{Checkpoint, FORMAT, RunIdentity};
use crate::{BatchOrder, BatchStream, Engine, EngineRng, InferError, Particles, StepContext, TensorRecord};

/// Where and how often to checkpoint.
#[derive(Clone, Debug)]
pub struct CheckpointPolicy {
    /// File the checkpoint is written to (replaced atomically each time).
    pub path: PathBuf,
    /// Write after every `every` steps (and at the end).
    pub every: usize,
}

/// Settings of one run of the shared loop, independent of the engine.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Total steps of the run (a resumed run continues up to this count).
    pub steps: usize,
    /// Seed of the engine's random stream and of the minibatch shuffles.
    pub seed: u64,
    /// Minibatch size; `None` uses all data rows every step.
    pub batch_size: Option<usize>,
    /// Order in which minibatches visit the data rows.
    pub batch_order: BatchOrder,
    /// Show a progress bar (with the `progress` feature; hidden anyway when stderr is not a
    /// terminal).
    pub progress: bool,
    /// Where and how often to checkpoint; `None` writes none.
    pub checkpoint: Option<CheckpointPolicy>,
    /// Check the particles for non-finite values every this many steps (and at the end). Each
    /// check is a host read of one value (on a CPU one sum, a couple of microseconds for the
    /// Boston BNN), but on a GPU it waits for the queued work, so GPU runs check less often. A failed check returns the particles of the last
    /// passed check, up to this many steps back.
    pub guard_every: usize,
    /// A wall-clock budget in seconds for this invocation's steps: the run stops after the
    /// first step that ends past it (also at `steps` at the latest). For comparisons at equal
    /// time, as the MMD-FW and speed-up papers do. In a sharded run the ranks stop together, at
    /// the first step that ends past it on any of them (give every rank a budget).
    pub max_seconds: Option<f64>,
    /// What the run belongs to beyond what the loop sees itself; written into every checkpoint
    /// and compared on resume.
    pub label: RunLabel,
    /// The group of processes that share this run's particles ([`crate::core::shard`]);
    /// `None` runs in this process alone. Every rank runs the same loop with the same settings;
    /// only rank 0 writes checkpoints.
    pub collective: Option<Arc<dyn Collective>>,
    /// With a `collective`: `None` shares the particles among the ranks (every rank holds all
    /// data rows); `Some` shares the data rows, the model given to the run holding this rank's
    /// [`RowShare`] of them ([`crate::core::shard`]). The run's identity (its checkpoints) is
    /// that of the whole data set, so a checkpoint resumes at any rank count.
    pub rows: Option<RowShare>,
}

/// The part of a run's identity ([`RunIdentity`]) only the caller knows: the loop itself sees
/// the engine's name, the model's dimension and data rows, the backend, the seed, the particle
/// count and the batch size.
#[derive(Clone, Debug, Default)]
pub struct RunLabel {
    /// The model's name (and configuration); empty when not given.
    pub model: String,
    /// A fingerprint of the model's data (data set, split, rows, a hash of the values).
    pub data: Option<String>,
    /// The engine's options, kernel and step-size rule, e.g. a serialised
    /// [`crate::EngineSpec`]; `null` when not given.
    pub engine_options: serde_json::Value,
    /// The particle count the caller asks for. On resume, a checkpoint with another count is
    /// refused; `None` accepts the checkpoint's (a fresh run always records its own).
    pub particles: Option<usize>,
}

impl RunConfig {
    /// `steps` full-data steps from `seed`: no minibatches, progress bar or checkpoints.
    pub fn new(steps: usize, seed: u64) -> Self {
        Self {
            steps,
            seed,
            batch_size: None,
            batch_order: BatchOrder::Cycle,
            progress: false,
            checkpoint: None,
            guard_every: 1,
            max_seconds: None,
            label: RunLabel::default(),
            collective: None,
            rows: None,
        }
    }

    /// How a sharded run splits its work.
    fn shard_by(&self) -> ShardBy {
        if self.rows.is_some() { ShardBy::Rows } else { ShardBy::Particles }
    }
}

/// Called every `every()` steps with the current particles (evaluation, logging, traces).
pub trait Callback {
    /// Steps between two calls of [`Callback::on_step`].
    fn every(&self) -> usize;
    /// Called with `step` steps completed and the particles after them; an error stops the run.
    fn on_step(&mut self, step: usize, particles: &Particles) -> Result<(), InferError>;
    /// Whether the run should stop now, before its step budget (asked after each
    /// [`Callback::on_step`]; a stop ends the run as a finished one, without error).
    fn stop(&self) -> bool {
        false
    }
}

/// What a finished run returns.
#[derive(Debug)]
pub struct RunOutcome {
    /// The final particles.
    pub particles: Particles,
    /// Steps completed in all (including those before a resume).
    pub steps: usize,
    /// Wall time of this invocation's steps.
    pub seconds: f64,
    /// Steps this invocation ran.
    pub steps_run: usize,
}

impl RunOutcome {
    /// Mean wall time per step of this invocation, in milliseconds (0 when no step ran).
    pub fn ms_per_step(&self) -> f64 {
        ms_per_step(self.seconds, self.steps_run)
    }
}

/// `seconds` spread over `steps`, in milliseconds per step (0 when no step ran).
pub fn ms_per_step(seconds: f64, steps: usize) -> f64 {
    if steps == 0 { 0.0 } else { 1e3 * seconds / steps as f64 }
}

/// Why a run stopped early.
#[derive(Debug, Error)]
pub enum RunError {
    /// A non-finite particle, score or weight: the run stops and keeps the last finite set.
    #[error("diverged at step {step}: {cause}")]
    Diverged {
        /// Index (0-based) of the step that produced the non-finite value.
        step: usize,
        /// What went non-finite, as far as a diagnosis could tell.
        cause: String,
        /// The particles of the last passed check.
        last_finite: Box<Particles>,
    },
    /// The engine returned an error at a step.
    #[error("step {step}: {error}")]
    Failed {
        /// Index (0-based) of the failing step.
        step: usize,
        /// The engine's error.
        error: InferError,
    },
    /// The run could not start (bad settings, a checkpoint that does not fit).
    #[error(transparent)]
    Setup(#[from] InferError),
}

/// The loop that drives any [`Engine`] over a model: batches, callbacks, guard, checkpoints.
pub struct Runner<'a> {
    engine: &'a mut dyn Engine,
    /// The model, or this rank's share of it when the data rows are sharded.
    model: Box<dyn LogDensity + 'a>,
    config: RunConfig,
    rng: EngineRng,
    batches: Option<BatchStream>,
    particles: Particles,
    step: usize,
    identity: RunIdentity,
}

impl<'a> Runner<'a> {
    /// A fresh run from `particles`.
    pub fn new(
        engine: &'a mut dyn Engine,
        model: &'a dyn LogDensity,
        particles: Particles,
        config: RunConfig,
    ) -> Result<Self, InferError> {
        if particles.is_empty() {
            return Err(InferError::setting("particles", "need at least one particle, got 0"));
        }
        if particles.dim() != model.dim() {
            return Err(InferError::setting(
                "particles",
                format!("particles have dimension {} but the model has {}", particles.dim(), model.dim()),
            ));
        }
        if let Some(asked) = config.label.particles
            && asked != particles.len()
        {
            return Err(InferError::setting(
                "particles",
                format!("{} particles given, but the run's label asks for {asked}", particles.len()),
            ));
        }
        let model = Self::shared_model(&*engine, model, &config, &particles)?;
        engine.init(&particles)?;
        let batches = Self::batch_stream(model.as_ref(), &config)?;
        let identity = Self::identity_of(&*engine, model.as_ref(), &config, particles.len(), &particles.device());
        Ok(Self { engine, model, rng: EngineRng::new(config.seed), batches, particles, step: 0, config, identity })
    }

    /// The identity of a run of `engine` on `model` with `config` and `particles` particles.
    fn identity_of(
        engine: &dyn Engine,
        model: &dyn LogDensity,
        config: &RunConfig,
        particles: usize,
        device: &burn::tensor::Device,
    ) -> RunIdentity {
        RunIdentity {
            engine: engine.name().to_string(),
            engine_options: config.label.engine_options.clone(),
            model: config.label.model.clone(),
            dim: model.dim(),
            data_rows: model.data_len(),
            data: config.label.data.clone(),
            backend: backend_name(device),
            seed: config.seed,
            particles,
            batch_size: config.batch_size.filter(|_| model.data_len().is_some()),
        }
    }

    /// Continues a run from a checkpoint written by a run of the same engine on the same model
    /// and data with the same settings ([`RunIdentity`]); any difference is refused, each named.
    pub fn resume(
        engine: &'a mut dyn Engine,
        model: &'a dyn LogDensity,
        config: RunConfig,
        checkpoint: &Checkpoint,
        device: &burn::tensor::Device,
    ) -> Result<Self, InferError> {
        let path = checkpoint.loaded_from.as_ref().map_or("(in memory)".into(), |p| p.display().to_string());
        let bad = |reason: String| InferError::Checkpoint { path: path.clone(), reason };
        if checkpoint.format != FORMAT {
            return Err(bad(format!("format {} is not supported", checkpoint.format)));
        }
        let particles = config.label.particles.unwrap_or(checkpoint.run.particles);
        // The identity is the whole model's: with rows sharded, the data set's row count.
        let rows = config.rows.as_ref().map(|share| share.total).or_else(|| model.data_len());
        let identity =
            RunIdentity { data_rows: rows, ..Self::identity_of(&*engine, model, &config, particles, device) };
        let differences = checkpoint.run.differences(&identity);
        if !differences.is_empty() {
            return Err(bad(format!("it belongs to another run: {}", differences.join("; "))));
        }
        let positions = checkpoint.particles.to_tensor::<2>(device)?;
        let weights = checkpoint.weights.as_ref().map(|w| w.to_tensor::<1>(device)).transpose()?;
        let particles = Particles { positions, weights };
        if particles.dim() != model.dim() {
            return Err(bad(format!("particles have dimension {} but the model has {}", particles.dim(), model.dim())));
        }
        let model = Self::shared_model(&*engine, model, &config, &particles)?;
        engine.load(&checkpoint.engine_state, device)?;
        let rng = EngineRng::from_state(&checkpoint.rng).ok_or_else(|| bad("malformed rng state".into()))?;
        let mut batches = Self::batch_stream(model.as_ref(), &config)?;
        if let (Some(b), Some(pos)) = (batches.as_mut(), checkpoint.batch_position) {
            b.set_position(pos);
        }
        Ok(Self { engine, model, config, rng, batches, particles, step: checkpoint.step, identity })
    }

    /// The model the run steps: `model` itself, or with [`RunConfig::rows`] this rank's
    /// [`RowShard`] of it. A sharded run needs an engine with a sharded step of its kind, and at
    /// least one particle (or data row) per rank; each is refused by name.
    fn shared_model(
        engine: &dyn Engine,
        model: &'a dyn LogDensity,
        config: &RunConfig,
        particles: &Particles,
    ) -> Result<Box<dyn LogDensity + 'a>, InferError> {
        match (&config.collective, &config.rows) {
            (None, None) => Ok(Box::new(model)),
            (None, Some(_)) => Err(InferError::setting(
                "shard",
                "the data rows can be shared only among the ranks of a group (`--distributed`)",
            )),
            (Some(collective), None) => {
                engine.can_shard(ShardBy::Particles)?;
                check_shardable_count(particles.len(), collective.as_ref())?;
                Ok(Box::new(model))
            }
            (Some(collective), Some(share)) => {
                engine.can_shard(ShardBy::Rows)?;
                let probe = particles.positions.clone().narrow(0, 0, 1);
                Ok(Box::new(RowShard::new(model, share.clone(), collective.size(), probe)?))
            }
        }
    }

    fn batch_stream(model: &dyn LogDensity, config: &RunConfig) -> Result<Option<BatchStream>, InferError> {
        match (config.batch_size, model.data_len()) {
            (Some(b), Some(n)) => Ok(Some(BatchStream::new(n, b, config.batch_order, config.seed ^ 0x5EED_BA7C)?)),
            (Some(0), None) => Err(InferError::setting("batch", "minibatch size must be >= 1")),
            _ => Ok(None),
        }
    }

    /// The run's state now, as a checkpoint. In a sharded run every rank calls it together
    /// (an engine that keeps its shard of the state gathers the whole, [`Engine::save_sharded`]).
    pub fn checkpoint(&self) -> Result<Checkpoint, InferError> {
        let engine_state = match &self.config.collective {
            Some(collective) => self.engine.save_sharded(collective.as_ref())?,
            None => self.engine.save(),
        };
        Ok(Checkpoint {
            format: FORMAT,
            run: self.identity.clone(),
            step: self.step,
            particles: TensorRecord::from_tensor(&self.particles.positions),
            weights: self.particles.weights.as_ref().map(TensorRecord::from_tensor),
            engine_state,
            rng: self.rng.state(),
            batch_position: self.batches.as_ref().map(BatchStream::position),
            sha256: String::new(),
            loaded_from: None,
        })
    }

    /// The particles as they stand.
    pub fn particles(&self) -> &Particles {
        &self.particles
    }

    /// Runs to `config.steps`.
    pub fn run(mut self, callbacks: &mut [&mut dyn Callback]) -> Result<RunOutcome, RunError> {
        let device = self.particles.device();
        let start_step = self.step;
        let bar = self.progress_bar();
        // Where stderr is not a terminal the bar hides itself: a line every few seconds instead.
        let mut ticker = super::progress::Ticker::new(self.engine.name());
        let steps = self.config.steps;
        let started = Instant::now();
        let guard_every = self.config.guard_every.max(1);
        let mut verified = (self.step, self.particles.clone());
        while self.step < self.config.steps {
            let step = self.step;
            let batch = self.batches.as_mut().map(|b| b.next_batch(&device));
            if step == start_step || (step - start_step).is_multiple_of(guard_every) {
                // The particles passed the last check (or are where the run starts): keep them
                // as the state to return if a later check fails. A clone is a handle copy.
                verified = (step, self.particles.clone());
            }
            let mut ctx = StepContext { model: self.model.as_ref(), batch: batch.as_ref(), rng: &mut self.rng, step };
            match &self.config.collective {
                Some(collective) => {
                    let by = self.config.shard_by();
                    self.engine.step_sharded(&mut ctx, &mut self.particles, collective.as_ref(), by)
                }
                None => self.engine.step(&mut ctx, &mut self.particles),
            }
            .map_err(|error| RunError::Failed { step, error })?;
            let out_of_time = self.out_of_time(started).map_err(|error| RunError::Failed { step, error })?;
            let last = step + 1 == self.config.steps || out_of_time;
            let checkpoint_due =
                self.config.checkpoint.as_ref().is_some_and(|p| (step + 1).is_multiple_of(p.every.max(1)) || last);
            // A checkpoint is checked too: one holding non-finite particles could not resume.
            let check_due = (step + 1 - start_step).is_multiple_of(guard_every) || last || checkpoint_due;
            if check_due && !self.particles.is_finite() {
                bar.abandon();
                let (from, previous) = verified;
                let cause = diagnose(self.model.as_ref(), &previous, batch.as_ref());
                let cause = if from == step {
                    cause
                } else {
                    format!("{cause} (checked every {guard_every} steps, from step {from})")
                };
                return Err(RunError::Diverged { step, cause, last_finite: Box::new(previous) });
            }
            self.step += 1;
            let mut settled = false;
            for cb in callbacks.iter_mut() {
                let every = cb.every().max(1);
                if self.step.is_multiple_of(every) {
                    cb.on_step(self.step, &self.particles).map_err(|error| RunError::Failed { step, error })?;
                    settled |= cb.stop();
                }
            }
            if let Some(policy) = &self.config.checkpoint
                && checkpoint_due
            {
                // Every rank takes part in gathering the state; one writes it.
                let checkpoint = self.checkpoint().map_err(|error| RunError::Failed { step, error })?;
                if is_lead(self.config.collective.as_deref()) {
                    checkpoint.save(&policy.path).map_err(|error| RunError::Failed { step, error })?;
                }
            }
            bar.inc(1);
            let at = self.step;
            ticker.tick(|| format!("step {at} of at most {steps}"));
            if out_of_time || settled {
                break;
            }
        }
        let _ = device.sync();
        let seconds = started.elapsed().as_secs_f64();
        bar.finish_and_clear();
        Ok(RunOutcome { particles: self.particles, steps: self.step, seconds, steps_run: self.step - start_step })
    }

    /// Whether the time budget is spent: in a sharded run, on any rank (each rank reads its own
    /// clock, and a rank that stopped alone would leave the others waiting in a collective), at
    /// the cost of one all-reduce of one float a step when a budget is set.
    fn out_of_time(&self, started: Instant) -> Result<bool, InferError> {
        let Some(budget) = self.config.max_seconds else { return Ok(false) };
        let mine = started.elapsed().as_secs_f64() >= budget;
        match &self.config.collective {
            None => Ok(mine),
            Some(group) => Ok(group.all_reduce_sum(&[f32::from(u8::from(mine))])?.first().is_some_and(|&v| v > 0.0)),
        }
    }

    fn progress_bar(&self) -> Progress {
        Progress::new(self.config.progress, self.config.steps, self.step, self.engine.name())
    }
}

/// The run's progress bar: indicatif's with the `progress` feature (hidden anyway when stderr is
/// not a terminal), nothing without it, so a library user compiles no terminal code.
#[cfg(feature = "progress")]
struct Progress(indicatif::ProgressBar);

#[cfg(feature = "progress")]
impl Progress {
    fn new(show: bool, steps: usize, at: usize, name: &str) -> Self {
        use indicatif::{ProgressBar, ProgressStyle};
        if !show {
            return Self(ProgressBar::hidden());
        }
        let bar = ProgressBar::new(steps as u64).with_position(at as u64);
        if let Ok(style) =
            ProgressStyle::with_template("{msg} [{elapsed_precise}] {wide_bar} {pos}/{len} ({per_sec}, eta {eta})")
        {
            bar.set_style(style);
        }
        bar.set_message(name.to_string());
        Self(bar)
    }
    fn inc(&self, by: u64) {
        self.0.inc(by);
    }
    fn abandon(&self) {
        self.0.abandon();
    }
    fn finish_and_clear(&self) {
        self.0.finish_and_clear();
    }
}

#[cfg(not(feature = "progress"))]
struct Progress;

#[cfg(not(feature = "progress"))]
impl Progress {
    fn new(_show: bool, _steps: usize, _at: usize, _name: &str) -> Self {
        Self
    }
    fn inc(&self, _by: u64) {}
    fn abandon(&self) {}
    fn finish_and_clear(&self) {}
}

/// The backend and device of `device` as burn prints it, without the `Device<...>` wrapper
/// (e.g. `Flex(FlexDevice)`).
fn backend_name(device: &burn::tensor::Device) -> String {
    let full = format!("{device:?}");
    full.strip_prefix("Device<").and_then(|s| s.strip_suffix('>')).map_or(full.clone(), str::to_string)
}

/// Names what went non-finite, from the last finite particles.
fn diagnose(model: &dyn LogDensity, last: &Particles, batch: Option<&Minibatch>) -> String {
    use parvi_model::tensor_ops::to_vec_f32;
    if let Some(w) = &last.weights
        && !parvi_model::tensor_ops::all_finite(w)
    {
        return "a particle weight is non-finite".into();
    }
    let scored = score(model, last.positions.clone(), batch);
    if let Some(e) = model.take_error() {
        return format!("the model could not be evaluated: {e}");
    }
    match scored {
        Err(e) => format!("the score could not be computed: {e}"),
        Ok(s) => {
            let lp = to_vec_f32(&s.log_prob);
            if let Some(i) = lp.iter().position(|v| !v.is_finite()) {
                return format!("the log density is non-finite ({}) at particle {i}", lp[i]);
            }
            let g = to_vec_f32(&s.grad);
            let dim = last.dim();
            if let Some(k) = g.iter().position(|v| !v.is_finite()) {
                return format!("the score is non-finite at particle {}, coordinate {}", k / dim, k % dim);
            }
            "the update produced non-finite positions from finite scores (step size too large?)".into()
        }
    }
}
