//! The particle run: the engine from the frame's start particles until its step budget, or
//! until the particles have settled ([`SettleConfig`]) where the polish step's chains start from
//! them; with the diagnostics of the particle set (kernel Stein discrepancy, drift).

use burn::tensor::{Device, Tensor};
use parvi_model::LogDensity;

use super::diagnostics::{Diagnostics, Finding};
use super::path::{Counted, Phase};
use super::precondition::Frame;
use super::{FitConfig, SettleConfig};
use crate::core::RunOutcome;
use crate::evaluation::{Statistic, ksd_squared};
use crate::samplers::PolishWhen;
use crate::{Callback, EngineRng, EngineSpec, InferError, Particles, Rbf, RunConfig, RunError, Runner};

/// What the particle run left.
pub(super) struct ParticleRun {
    /// The engine's name.
    pub method: &'static str,
    pub outcome: RunOutcome,
    /// The engine's own report.
    pub report: serde_json::Value,
    /// An MCMC engine's collected draws (in the frame); `None` for a particle engine.
    pub engine_draws: Option<Particles>,
    /// The start particles, kept where their kernel Stein discrepancy was measured (the polish
    /// step's chains start there instead where the run raised it).
    pub initial: Option<Particles>,
    /// The particle set's diagnostics (the engine's report's, KSD, drift).
    pub diagnostics: Diagnostics,
    /// What went wrong on the way (start draws redrawn).
    pub findings: Vec<Finding>,
}

impl ParticleRun {
    pub fn is_mcmc(&self) -> bool {
        self.engine_draws.is_some()
    }
}

/// Runs the engine of `spec` on `target` (the model in `frame`) from the frame's start
/// particles (or `config.resume`), and appends its [`Phase`] to `path`.
#[allow(clippy::too_many_arguments)]
pub(super) fn run(
    counted: &Counted<'_>,
    target: &dyn LogDensity,
    frame: &Frame<'_>,
    spec: &EngineSpec,
    config: &FitConfig,
    callbacks: &mut [&mut dyn Callback],
    rng: &mut EngineRng,
    device: &Device,
    path: &mut Vec<Phase>,
) -> Result<ParticleRun, RunError> {
    let watch = counted.stopwatch();
    let mut start = frame.start(config, rng, device)?;
    let redrawn =
        if config.resume.is_none() { redraw_non_finite_starts(target, &mut start, config.init_std, rng) } else { 0 };
    let ksd_start = if config.resume.is_none() { stein_discrepancy(target, &start.positions) } else { None };
    let initial = ksd_start.is_some().then(|| start.clone());
    let mut engine = spec.build()?;
    let run = RunConfig {
        batch_size: config.batch_size,
        progress: config.progress,
        checkpoint: config.checkpoint.clone(),
        label: config.label.clone(),
        collective: config.collective.clone(),
        ..RunConfig::new(config.steps, config.seed)
    };
    // The last tenth of the run, and at least its last 20 steps.
    let mut snapshot =
        Snapshot { every: (config.steps * 9 / 10).min(config.steps.saturating_sub(20)).max(1), taken: None };
    // The particles only start the polish step's chains when it follows every run; where they
    // are the answer (no polish, or only when flagged) the run takes every step: settled to 0.1
    // sd a window is a warm start, not an answer.
    let polish_follows = config.polish.is_some_and(|p| p.when == PolishWhen::Always);
    let fixed_length =
        !polish_follows || config.checkpoint.is_some() || config.resume.is_some() || config.collective.is_some();
    let mut settle = match config.settle {
        Some(rule) if !fixed_length => {
            rule.validate()?;
            Some(Settle { rule, looks: Default::default(), stopped: false, last_drift: None })
        }
        _ => None,
    };
    let mut diverged = None;
    let ran = {
        let mut all: Vec<&mut dyn Callback> = Vec::with_capacity(callbacks.len() + 1);
        for c in callbacks.iter_mut() {
            all.push(&mut **c);
        }
        all.push(&mut snapshot);
        if let Some(settle) = settle.as_mut() {
            all.push(settle);
        }
        crate::core::progress::phase(&format!(
            "{}: {} particles, up to {} steps",
            spec.method.name(),
            config.particles,
            config.steps
        ));
        let runner = match &config.resume {
            Some(checkpoint) => Runner::resume(engine.as_mut(), target, run, checkpoint, device)?,
            None => Runner::new(engine.as_mut(), target, start, run)?,
        };
        runner.run(&mut all)
    };
    let outcome = match ran {
        Ok(outcome) => outcome,
        // Where the polish step's chains follow (the default path), a particle engine that
        // diverged is a phase that failed, not a fit that failed (issue 59: samplers that never
        // die): its last finite particles start the check and the chains, whose draws are the
        // answer and are judged on their own. An MCMC engine's draws, or particles that are the
        // answer, have nothing to hand on.
        Err(RunError::Diverged { step, cause, last_finite }) if polish_follows && engine.draws().is_none() => {
            // A finite position may still have a non-finite density (the step past it is what
            // diverged): such rows are redrawn as start draws are.
            let mut particles = *last_finite;
            let redrawn = redraw_non_finite_starts(target, &mut particles, config.init_std, rng);
            diverged = Some((step, cause, redrawn));
            RunOutcome { particles, steps: step, seconds: watch.seconds(), steps_run: step }
        }
        // The last finite particles of a divergence, too, in the model's coordinates.
        Err(RunError::Diverged { step, cause, last_finite }) => {
            return Err(RunError::Diverged { step, cause, last_finite: Box::new(frame.back(&last_finite)) });
        }
        Err(other) => return Err(other),
    };
    let report = engine.report();
    let engine_draws = engine.draws();
    let is_mcmc = engine_draws.is_some();
    let settled = settle.as_ref().map(|s| (s.stopped, s.last_drift));
    let diagnostics = Diagnostics {
        ksd_start: (!is_mcmc).then_some(ksd_start).flatten(),
        ksd_end: if is_mcmc { None } else { stein_discrepancy(target, &outcome.particles.positions) },
        // A settled run's drift is its last look's (it never reached the last tenth).
        drift: match (settled, is_mcmc) {
            (_, true) => None,
            (Some((true, last_drift)), false) => last_drift,
            _ => snapshot.taken.as_ref().and_then(|s| drift(s, &outcome.particles)),
        },
        ..Diagnostics::read(&report)
    };
    let method = engine.name();
    let mut findings = Vec::new();
    if redrawn > 0 {
        findings.push(Finding::of(method, format!(
            "{redrawn} start draws had a non-finite log density (the model fails or is -inf there) and were redrawn from the approximation around the mode"
        )));
    }
    let mut did = format!("{} of {} steps {}", outcome.steps_run, config.steps, frame.describe());
    if let Some(n) = engine_draws.as_ref().map(|_| outcome.particles.len()) {
        did = format!("{n} chains, {did}");
    }
    if let Some((step, cause, redrawn)) = &diverged {
        let redrawn = match redrawn {
            0 => String::new(),
            n => format!(" ({n} of them, at a non-finite density, redrawn from the start distribution)"),
        };
        findings.push(Finding::of(method, format!(
            "diverged at step {step} ({cause}): the check and the polish step's chains start from its last finite particles{redrawn}"
        )));
    }
    let verdict = match (settled, is_mcmc) {
        _ if diverged.is_some() => format!("diverged at step {}: its last finite particles go on", outcome.steps_run),
        (_, true) => match (diagnostics.max_rhat, diagnostics.min_ess) {
            (Some(r), Some(e)) => format!("split R-hat {r:.3}, ESS {e:.0}"),
            _ => String::new(),
        },
        (Some((true, d)), false) => format!("settled (drift {:.3} over the window)", d.unwrap_or(f64::NAN)),
        (Some((false, _)), false) => {
            format!("not settled (drift {:.3} over the last tenth)", diagnostics.drift.unwrap_or(f64::NAN))
        }
        (None, false) => match diagnostics.drift {
            Some(d) => format!("drift {d:.3} over the last tenth"),
            None => String::new(),
        },
    };
    path.push(watch.phase(counted, method, did, verdict));
    Ok(ParticleRun { method, outcome, report, engine_draws, initial, diagnostics, findings })
}

/// The squared KSD of `x` under `model` (full data), or `None` where the model has no gradient
/// (a gradient-free target) or the value is not finite.
pub(super) fn stein_discrepancy(model: &dyn LogDensity, x: &Tensor<2>) -> Option<f64> {
    let s = parvi_model::score(model, x.clone(), None).ok()?;
    ksd_squared(&Rbf::median(), x.clone(), s.grad, Statistic::V).ok().filter(|v| v.is_finite())
}

/// Keeps the particles at one step (the first multiple of `every`).
struct Snapshot {
    every: usize,
    taken: Option<Particles>,
}

impl Callback for Snapshot {
    fn every(&self) -> usize {
        self.every
    }

    fn on_step(&mut self, _step: usize, particles: &Particles) -> Result<(), InferError> {
        if self.taken.is_none() {
            self.taken = Some(particles.clone());
        }
        Ok(())
    }
}

/// The settle rule's callback ([`SettleConfig`]): the particles' moments at the last `window + 1`
/// looks, oldest first.
struct Settle {
    rule: SettleConfig,
    looks: std::collections::VecDeque<(Vec<f64>, Vec<f64>)>,
    stopped: bool,
    last_drift: Option<f64>,
}

impl Callback for Settle {
    fn every(&self) -> usize {
        self.rule.every
    }

    fn on_step(&mut self, step: usize, particles: &Particles) -> Result<(), InferError> {
        self.looks.push_back((particles.mean(), particles.variances()));
        if self.looks.len() > self.rule.window + 1 {
            self.looks.pop_front();
        }
        if self.looks.len() == self.rule.window + 1
            && let (Some(oldest), Some(now)) = (self.looks.front(), self.looks.back())
        {
            let moved = moment_drift(oldest, now);
            self.last_drift = Some(moved);
            self.stopped = step >= self.rule.min_steps && moved < self.rule.tol;
        }
        Ok(())
    }

    fn stop(&self) -> bool {
        self.stopped
    }
}

/// [`drift`] from two sets of (means, variances): the largest change of a coordinate's mean in
/// the later sds, or of its sd, relative; NaN moments count as moving.
fn moment_drift((m0, v0): &(Vec<f64>, Vec<f64>), (m1, v1): &(Vec<f64>, Vec<f64>)) -> f64 {
    let mut worst = 0.0f64;
    for j in 0..m1.len() {
        let (s0, s1) = (v0[j].max(0.0).sqrt(), v1[j].max(0.0).sqrt());
        let moved = if s1 > 0.0 { ((m1[j] - m0[j]).abs() / s1).max((s1 / s0.max(1e-300) - 1.0).abs()) } else { 0.0 };
        worst = if moved.is_nan() { f64::INFINITY } else { worst.max(moved) };
    }
    worst
}

/// The largest change of a coordinate's (weighted) mean, in final sds, or of its sd, relative,
/// between two particle sets of the same size; `None` when the sizes differ.
fn drift(before: &Particles, after: &Particles) -> Option<f64> {
    if before.len() != after.len() {
        return None;
    }
    Some(moment_drift(&(before.mean(), before.variances()), &(after.mean(), after.variances())))
}

/// Rounds of redrawing a start particle whose log density is not finite (Stan retries an
/// initial value 100 times).
const START_REDRAWS: usize = 100;

/// Redraws the start particles at which the target's log density is `-inf` or NaN (an ODE that
/// fails there, a state that underflows to 0, a start put around a spurious stationary point) from
/// the main approximation, `N(0, init_std^2 I)` in the engine's coordinates, as Stan retries a
/// bad initial value; returns how many draws were replaced. What is still not finite after
/// [`START_REDRAWS`] rounds is left for the run loop to report with the model's error.
fn redraw_non_finite_starts(
    target: &dyn LogDensity,
    start: &mut Particles,
    init_std: f64,
    rng: &mut EngineRng,
) -> usize {
    let (n, dim) = (start.len(), start.dim());
    let device = start.device();
    let mut rows: Option<Vec<f32>> = None;
    let mut replaced = 0;
    for _ in 0..START_REDRAWS {
        let Ok(values) = parvi_model::grad::log_prob_value(target, start.positions.clone(), None) else { break };
        // A failure the model recorded is the cause of the NaN it returned: redrawing is the answer.
        let _ = target.take_error();
        let bad: Vec<usize> = parvi_model::tensor_ops::to_vec_f64(&values)
            .iter()
            .enumerate()
            .filter(|(_, v)| !v.is_finite())
            .map(|(i, _)| i)
            .collect();
        if bad.is_empty() {
            break;
        }
        let host = rows.get_or_insert_with(|| start.to_rows().concat());
        for &i in &bad {
            for v in &mut host[i * dim..(i + 1) * dim] {
                *v = (init_std * rng.normal()) as f32;
            }
        }
        replaced += bad.len();
        start.positions = parvi_model::tensor_ops::matrix_from_vec(host.clone(), n, dim, &device);
    }
    replaced
}
