//! The record of the path a fit took: one [`Phase`] a phase, with what it did, what it cost and
//! what came of it, and the counter of model evaluations the costs are read from.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use burn::tensor::Tensor;
use parvi_model::{LogDensity, Minibatch};
use serde::{Deserialize, Serialize};

/// One phase of the default path, as `parvi fit` prints it and summary.json keeps it:
/// `svgd: 800 of 2000 steps, settled (drift 0.06); its particles start the check (80000
/// evaluations, 3.1 s)`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Phase {
    /// The phase: `laplace`, `pathfinder`, the engine's name, `stationarity check`, a polish
    /// kernel's name (`mala`, `auto-mala`, `chees`, `nuts`).
    pub name: String,
    /// What it did (steps, chains, where it ran).
    pub did: String,
    /// What came of it: passed or rejected, handed on, returned, dropped.
    pub outcome: String,
    /// Model evaluations (rows of a call, with or without a gradient).
    pub evals: usize,
    /// Wall seconds.
    pub seconds: f64,
    /// What the diagnostics found wrong with this phase's output. Where a later phase's draws
    /// are returned and pass, these are no warnings: they are why the path went on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl Phase {
    /// A phase with no notes.
    pub fn new(name: &str, did: String, outcome: String, evals: usize, seconds: f64) -> Self {
        Self { name: name.to_string(), did, outcome, evals, seconds, notes: Vec::new() }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.name, self.did)?;
        if !self.outcome.is_empty() {
            write!(f, "; {}", self.outcome)?;
        }
        write!(f, " ({} evaluations, {:.1} s)", self.evals, self.seconds)?;
        for n in &self.notes {
            write!(f, "\n    {n}")?;
        }
        Ok(())
    }
}

/// A model that counts its evaluations (rows of every `log_prob` call).
pub(super) struct Counted<'a> {
    model: &'a dyn LogDensity,
    evals: AtomicUsize,
}

impl<'a> Counted<'a> {
    pub fn new(model: &'a dyn LogDensity) -> Self {
        Self { model, evals: AtomicUsize::new(0) }
    }

    /// Evaluations so far.
    pub fn evals(&self) -> usize {
        self.evals.load(Ordering::Relaxed)
    }

    /// A stopwatch of evaluations and seconds from now.
    pub fn stopwatch(&self) -> Stopwatch {
        Stopwatch { evals: self.evals(), started: Instant::now() }
    }
}

impl LogDensity for Counted<'_> {
    fn dim(&self) -> usize {
        self.model.dim()
    }

    fn data_len(&self) -> Option<usize> {
        self.model.data_len()
    }

    fn log_prob(&self, particles: Tensor<2>, batch: Option<&Minibatch>) -> Tensor<1> {
        self.evals.fetch_add(particles.dims()[0], Ordering::Relaxed);
        self.model.log_prob(particles, batch)
    }

    fn take_error(&self) -> Option<parvi_model::ModelError> {
        self.model.take_error()
    }
}

/// Evaluations and seconds since a phase started.
pub(super) struct Stopwatch {
    evals: usize,
    started: Instant,
}

impl Stopwatch {
    /// The phase that ran since the stopwatch started.
    pub fn phase(&self, counted: &Counted<'_>, name: &str, did: String, outcome: String) -> Phase {
        Phase::new(name, did, outcome, counted.evals() - self.evals, self.seconds())
    }

    pub fn seconds(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }
}
