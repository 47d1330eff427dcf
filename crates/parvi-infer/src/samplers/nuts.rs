//! The No-U-Turn sampler as Stan runs it, on many chains batched together: multinomial NUTS
//! (Betancourt 2017, "A Conceptual Introduction to Hamiltonian Monte Carlo", Sec. A.3-A.4; Stan's
//! `base_nuts`) with biased progressive sampling between subtrees, uniform progressive sampling
//! within them, and the generalized no-U-turn criterion checked across every merged pair of
//! subtrees and their neighbours (Stan 2.26's extra checks); a diagonal metric; Stan's warm-up
//! (dual averaging, the windowed schedule), whose windows estimate the metric as Stan does, by
//! the draws' variance; nutpie's `sqrt(var(draws) / var(gradients))` is one option away
//! ([`MetricEstimate::GradientScaled`]: fewer gradients on most of the suite, but wrong on a
//! stochastic-volatility model; docs/posteriordb.md at 8a480ca, "A gradient-scaled NUTS metric" and
//! "Stan's metric is NUTS's default again").
//!
//! Every chain builds its own tree, with its own random stream. The chains may be split over
//! threads (one by default: [`NutsConfig::threads`]); within a thread, every chain that waits on the model has
//! its row in one batched `log_prob` and score of `[rows, dim]`, the tree bookkeeping on the host
//! in `f64` per chain (small vectors). A chain whose tree is done starts its next transition at
//! once rather than waiting for the others' deeper trees; the recursion of Stan's `build_tree`
//! is unrolled into a stack of completed subtrees, merged as a binary counter carries, so each
//! chain advances one leaf per batched call.
//!
//! Warm-up (Stan's `adapt_diag_e_nuts`): the step size by dual averaging (Hoffman & Gelman 2014,
//! Sec. 3.2.1, eqs. 5-6, with `gamma = 0.05`, `t0 = 10`, `kappa = 0.75`, `mu = log(10 eps)`,
//! target acceptance 0.8), the inverse metric from the draws' variances in windows (75 draws of
//! initial buffer, windows of 25, 50, 100, ... doubling, 50 of terminal buffer; shrunk to 15% /
//! 75% / 10% for short warm-ups), each estimate regularised towards `1e-3` as Stan:
//! `(n / (n + 5)) var + 1e-3 (5 / (n + 5))`, after which the step size is searched again and dual
//! averaging restarts. Each chain adapts on its own, as Stan's chains do.
//!
//! Inits: the run's particles ([`NutsInit::Particles`]: a caller's own inits), else Stan's
//! default, uniform(-2, 2) in every coordinate of the space the engine samples (the model's
//! unconstrained space; under `fit`'s preconditioning, its whitened coordinates), up to 100 tries
//! per chain for a finite density and gradient.

use std::time::Instant;

use burn::tensor::Device;
use parvi_model::tensor_ops::{matrix_from_vec, to_vec_f32};
use parvi_model::{LogDensity, score_rows};
use serde::{Deserialize, Serialize};

use crate::engines::EngineConfig;
use crate::evaluation::{bulk_ess, split_rhat};
use crate::{AdapterConfig, Engine, EngineRng, EngineState, InferError, KernelConfig, Particles, StepContext};

/// Energy error above which a leapfrog step is a divergence (Stan's `max_deltaH`).
pub const MAX_ENERGY_ERROR: f64 = 1000.0;

/// E-BFMI below which Stan warns that the momentum resampling explores the energy poorly.
pub const MIN_E_BFMI: f64 = 0.3;

/// Where the chains start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NutsInit {
    /// Stan's default: uniform(-r, r) in every coordinate, `r = init-radius` (2), redrawn up to
    /// 100 times until the density and its gradient are finite.
    #[default]
    Uniform,
    /// The run's first `chains` particles: the caller's own inits (given to
    /// [`crate::Runner::new`]), or `fit`'s initial particles.
    Particles,
}

/// How a warm-up window's draws set the diagonal inverse metric.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MetricEstimate {
    /// Stan's `learn_variance`: each coordinate's sample variance over the window.
    #[default]
    DrawVariance,
    /// nutpie's (and nuts-rs's) estimate: `sqrt(var(draws) / var(gradients))` per coordinate
    /// over the window. On a Gaussian both are the variance; where coordinates are correlated or
    /// scales change along the posterior (a GP's weights against its length scale), the
    /// gradients' spread brings in the conditional scale, which the trajectory length depends on.
    /// Fewer gradients on most posteriordb posteriors, but on the stochastic-volatility model of
    /// `parvi_models::stan_users` its chains passed R-hat and ESS with the AR coefficient's sd
    /// off: not the default (docs/posteriordb.md at 8a480ca).
    GradientScaled,
}

/// Options of `nuts`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct NutsConfig {
    /// Chains.
    pub chains: usize,
    /// Threads the chains are split over (each thread's chains share its batched model calls);
    /// 0: one per core, at most one per chain. The draws do not depend on it. The default is
    /// one: burn's autodiff registers every operation of every thread in one graph behind a
    /// mutex, and the flex backend already spreads a large operation over the cores, so more
    /// threads made each call slower than one thread's call with all the rows (measured in
    /// docs/posteriordb.md at 8a480ca, "One thread").
    pub threads: usize,
    /// Warm-up iterations per chain (adaptation; not kept).
    pub warmup: usize,
    /// Kept draws per chain.
    pub draws: usize,
    /// Largest tree depth (at most `2^max-depth - 1` leapfrog steps per draw).
    pub max_depth: usize,
    /// Target mean acceptance statistic of the step-size adaptation, in (0, 1).
    pub target_accept: f64,
    /// Where the chains start.
    pub init: NutsInit,
    /// Half-width of the uniform inits.
    pub init_radius: f64,
    /// How the warm-up's windows estimate the diagonal metric.
    pub metric_estimate: MetricEstimate,
}

impl Default for NutsConfig {
    fn default() -> Self {
        Self {
            chains: 4,
            threads: 1,
            warmup: 1000,
            draws: 1000,
            max_depth: 10,
            target_accept: 0.8,
            init: NutsInit::Uniform,
            init_radius: 2.0,
            metric_estimate: MetricEstimate::DrawVariance,
        }
    }
}

impl NutsConfig {
    /// An error names the option out of range.
    pub fn validate(&self) -> Result<(), InferError> {
        if self.chains == 0 {
            return Err(InferError::setting("chains", "need at least one chain, got 0"));
        }
        if self.draws < 4 {
            return Err(InferError::setting("draws", format!("need at least 4 draws per chain, got {}", self.draws)));
        }
        if !(1..=30).contains(&self.max_depth) {
            return Err(InferError::setting("max-depth", format!("must be between 1 and 30, got {}", self.max_depth)));
        }
        if !(self.target_accept > 0.0 && self.target_accept < 1.0) {
            return Err(InferError::setting("target-accept", format!("must be in (0, 1), got {}", self.target_accept)));
        }
        if !(self.init_radius >= 0.0 && self.init_radius.is_finite()) {
            return Err(InferError::setting(
                "init-radius",
                format!("must be finite and >= 0, got {}", self.init_radius),
            ));
        }
        Ok(())
    }
}

/// One chain's account of a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChainReport {
    /// The step size after warm-up.
    pub step_size: f64,
    /// The inverse metric (diagonal) after warm-up.
    pub inv_metric: Vec<f64>,
    /// Kept draws that ended with a divergence.
    pub divergences: usize,
    /// Kept draws whose tree reached `max-depth`.
    pub max_depth_hits: usize,
    /// Mean tree depth of the kept draws.
    pub mean_tree_depth: f64,
    /// Mean acceptance statistic of the kept draws.
    pub mean_accept_stat: f64,
    /// Energy Bayesian fraction of missing information of the kept draws (Betancourt 2016).
    pub e_bfmi: f64,
    /// Gradient evaluations of this chain (warm-up, step-size searches and kept draws).
    pub gradients: usize,
    /// Leapfrog steps (warm-up, step-size searches and kept draws) whose evaluation failed: a
    /// NaN or `+inf` log density, a gradient that is not finite, or a call the model could not
    /// evaluate (an ODE solve that failed). Each ended its trajectory as a divergence and its
    /// proposal was rejected, as Stan rejects a proposal whose log density throws.
    #[serde(default)]
    pub failed_evaluations: usize,
    /// The first of them: the iteration (1-based, warm-up included) and the cause.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_failure: Option<String>,
}

/// What [`nuts`] returns: the kept draws and each chain's account.
#[derive(Clone, Debug)]
pub struct NutsRun {
    /// Dimension of a draw.
    pub dim: usize,
    /// Chains.
    pub chains: usize,
    /// Kept draws per chain.
    pub draws_per_chain: usize,
    /// The draws, snapshot-major: draw `s` of chain `c` in row `s * chains + c` (`dim` values).
    pub draws: Vec<f64>,
    /// The log density at each draw, in the same order.
    pub log_prob: Vec<f64>,
    /// Per chain.
    pub chain_reports: Vec<ChainReport>,
    /// Batched model calls over all threads (each with gradient, on the rows of the chains
    /// waiting on the model).
    pub batched_calls: usize,
    /// Wall seconds of the whole run.
    pub seconds: f64,
    /// Seconds inside the batched model calls, summed over the threads.
    pub model_seconds: f64,
    /// Stan's warnings: divergences, tree depth, E-BFMI.
    pub warnings: Vec<String>,
    /// What the run did that is not a warning about its draws: per chain, the proposals
    /// rejected for a failed evaluation ([`ChainReport::failed_evaluations`]), as Stan's
    /// informational messages.
    pub notes: Vec<String>,
}

impl NutsRun {
    /// Chain-gradient evaluations over all chains.
    pub fn gradients(&self) -> usize {
        self.chain_reports.iter().map(|c| c.gradients).sum()
    }

    /// Split R-hat and bulk ESS of each coordinate.
    pub fn convergence(&self) -> (Vec<f64>, Vec<f64>) {
        let (m, n, d) = (self.chains, self.draws_per_chain, self.dim);
        (0..d)
            .map(|j| {
                let series: Vec<Vec<f64>> =
                    (0..m).map(|c| (0..n).map(|s| self.draws[(s * m + c) * d + j]).collect()).collect();
                (split_rhat(&series), bulk_ess(&series))
            })
            .unzip()
    }

    /// The report as JSON: per chain, totals, R-hat and ESS extremes, warnings.
    pub fn summary(&self) -> serde_json::Value {
        let (rhat, ess) = self.convergence();
        let max_rhat = rhat.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let min_ess = ess.iter().copied().fold(f64::INFINITY, f64::min);
        serde_json::json!({
            "chains": self.chains,
            "draws_per_chain": self.draws_per_chain,
            "chain_reports": self.chain_reports,
            "gradients": self.gradients(),
            "batched_calls": self.batched_calls,
            "seconds": self.seconds,
            "model_seconds": self.model_seconds,
            "ms_per_batched_call": 1e3 * self.model_seconds / self.batched_calls.max(1) as f64,
            "ms_per_gradient": 1e3 * self.seconds / self.gradients().max(1) as f64,
            "max_rhat": max_rhat,
            "min_ess": min_ess,
            "warnings": self.warnings,
            "notes": self.notes,
        })
    }
}

/// A point in phase space.
#[derive(Clone, Debug)]
struct Point {
    q: Vec<f64>,
    p: Vec<f64>,
    grad: Vec<f64>,
    log_prob: f64,
}

/// A completed subtree (or a leaf): what merging needs. `beg` is its end nearest the tree it
/// grows from, `end` the far end.
struct Sub {
    leaves: usize,
    log_w: f64,
    rho: Vec<f64>,
    p_beg: Vec<f64>,
    p_end: Vec<f64>,
    sharp_beg: Vec<f64>,
    sharp_end: Vec<f64>,
    proposal: Point,
}

/// One chain's trajectory in the making.
struct Tree {
    /// Ends: index 0 the backward (left) end, 1 the forward (right) end.
    ends: [Point; 2],
    sharp: [Vec<f64>; 2],
    rho: Vec<f64>,
    log_w: f64,
    sample: Point,
    h0: f64,
    depth: usize,
    /// The subtree being built: direction (+1 forward), leaves wanted, leaves built, the last
    /// leaf, completed subtrees (a binary counter).
    dir: f64,
    wanted: usize,
    built: usize,
    frontier: Point,
    stack: Vec<Sub>,
    done: bool,
    divergent: bool,
    leapfrogs: usize,
    sum_metro: f64,
}

/// The generalized no-U-turn criterion (Betancourt 2017, eq. in Sec. A.4.2; Stan's
/// `compute_criterion`): the trajectory keeps going while both ends' velocities `p#` point
/// along the summed momentum `rho`.
fn no_u_turn(sharp_minus: &[f64], sharp_plus: &[f64], rho: &[f64]) -> bool {
    dot(sharp_plus, rho) > 0.0 && dot(sharp_minus, rho) > 0.0
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn add(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

fn log_add(a: f64, b: f64) -> f64 {
    let m = a.max(b);
    if m == f64::NEG_INFINITY { m } else { m + ((a - m).exp() + (b - m).exp()).ln() }
}

/// Dual averaging of the step size (Hoffman & Gelman 2014, eqs. 5-6; Stan's
/// `stepsize_adaptation`).
#[derive(Clone, Debug)]
struct DualAveraging {
    mu: f64,
    s_bar: f64,
    x_bar: f64,
    counter: f64,
    delta: f64,
}

impl DualAveraging {
    const GAMMA: f64 = 0.05;
    const T0: f64 = 10.0;
    const KAPPA: f64 = 0.75;

    fn restart(&mut self) {
        self.counter = 0.0;
        self.s_bar = 0.0;
        self.x_bar = 0.0;
    }

    /// The new step size after a transition with acceptance statistic `accept`.
    fn learn(&mut self, accept: f64) -> f64 {
        self.counter += 1.0;
        let accept = accept.min(1.0);
        let eta = 1.0 / (self.counter + Self::T0);
        self.s_bar = (1.0 - eta) * self.s_bar + eta * (self.delta - accept);
        let x = self.mu - self.s_bar * self.counter.sqrt() / Self::GAMMA;
        let x_eta = self.counter.powf(-Self::KAPPA);
        self.x_bar = (1.0 - x_eta) * self.x_bar + x_eta * x;
        x.exp()
    }
}

/// Stan's windowed adaptation schedule (`windowed_adaptation`).
#[derive(Clone, Debug)]
struct Windows {
    warmup: usize,
    init_buffer: usize,
    term_buffer: usize,
    window_size: usize,
    next_window: usize,
    counter: usize,
}

impl Windows {
    fn new(warmup: usize) -> Self {
        let (mut init_buffer, mut term_buffer, mut base) = (75, 50, 25);
        if warmup >= 20 && init_buffer + base + term_buffer > warmup {
            // Stan: 15% initial buffer, 10% terminal buffer, the rest one window.
            init_buffer = (0.15 * warmup as f64) as usize;
            term_buffer = (0.1 * warmup as f64) as usize;
            base = warmup - (init_buffer + term_buffer);
        }
        Self { warmup, init_buffer, term_buffer, window_size: base, next_window: init_buffer + base - 1, counter: 0 }
    }

    fn in_window(&self) -> bool {
        self.counter >= self.init_buffer && self.counter + self.term_buffer < self.warmup && self.counter != self.warmup
    }

    fn end_of_window(&self) -> bool {
        self.counter == self.next_window && self.counter != self.warmup
    }

    fn compute_next_window(&mut self) {
        let last = self.warmup.saturating_sub(self.term_buffer + 1);
        if self.next_window == last {
            return;
        }
        self.window_size *= 2;
        self.next_window = self.counter + self.window_size;
        if self.next_window != last
            && self.next_window + 2 * self.window_size >= self.warmup.saturating_sub(self.term_buffer)
        {
            self.next_window = last;
        }
    }
}

/// Welford's running mean and variance.
#[derive(Clone, Debug)]
struct Welford {
    n: f64,
    mean: Vec<f64>,
    m2: Vec<f64>,
}

impl Welford {
    fn new(dim: usize) -> Self {
        Self { n: 0.0, mean: vec![0.0; dim], m2: vec![0.0; dim] }
    }

    fn add(&mut self, x: &[f64]) {
        self.n += 1.0;
        for ((m, s), v) in self.mean.iter_mut().zip(self.m2.iter_mut()).zip(x) {
            let delta = v - *m;
            *m += delta / self.n;
            *s += delta * (v - *m);
        }
    }
}

/// The model on one group of chains: one `log_prob` and score of every row a chain of the group
/// is waiting on, per call.
struct Batched<'a> {
    model: &'a dyn LogDensity,
    device: &'a Device,
    dim: usize,
    calls: usize,
    seconds: f64,
}

/// The model's answer at the rows of one batched call.
struct Evaluated {
    log_prob: Vec<f64>,
    grad: Vec<f64>,
    /// Per row, whether the model could not evaluate it (empty: every row went through), and
    /// why ([`parvi_model::RowScore`]).
    failed: Vec<bool>,
    failure: Option<String>,
}

impl Evaluated {
    /// Why row `k`'s evaluation failed, if it did (see [`ChainReport::failed_evaluations`]); a
    /// log density of `-inf` with any gradient is a point outside the support, not a failure.
    fn failure_of(&self, k: usize, dim: usize) -> Option<String> {
        let lp = self.log_prob[k];
        if self.failed.get(k).copied().unwrap_or(false) {
            return Some(self.failure.clone().unwrap_or_else(|| "the model's evaluation failed".into()));
        }
        if lp.is_nan() || lp == f64::INFINITY {
            return Some(format!("the log density is {lp}"));
        }
        let grad = &self.grad[k * dim..(k + 1) * dim];
        if lp > f64::NEG_INFINITY
            && let Some(j) = grad.iter().position(|g| !g.is_finite())
        {
            return Some(format!("the gradient's coordinate {} is {} (log density {lp})", j + 1, grad[j]));
        }
        None
    }
}

impl Batched<'_> {
    /// The log densities and gradients at the rows `q` (`rows * dim`, row-major). A row the
    /// model could not evaluate is NaN with its cause, not an error: its chain rejects the
    /// proposal there ([`score_rows`]).
    fn eval(&mut self, q: &[f64]) -> Result<Evaluated, InferError> {
        let started = Instant::now();
        let rows = q.len() / self.dim;
        let x = matrix_from_vec(q.iter().map(|&v| v as f32).collect(), rows, self.dim, self.device);
        let scored = score_rows(self.model, x, None)?;
        let log_prob = to_vec_f32(&scored.score.log_prob).into_iter().map(f64::from).collect();
        let grad = to_vec_f32(&scored.score.grad).into_iter().map(f64::from).collect();
        self.calls += 1;
        self.seconds += started.elapsed().as_secs_f64();
        Ok(Evaluated { log_prob, grad, failed: scored.failed, failure: scored.failure })
    }
}

/// Per-chain sampler state.
struct Chain {
    point: Point,
    step: f64,
    inv_metric: Vec<f64>,
    adapt: DualAveraging,
    windows: Windows,
    estimator: Welford,
    /// The window's gradients, for [`MetricEstimate::GradientScaled`].
    grad_estimator: Welford,
    gradients: usize,
}

/// What a chain is doing between two model calls.
enum Stage {
    /// Stan's `init_stepsize`: one leapfrog step from the current point with a fresh momentum
    /// per trial; the step size doubles while the acceptance `exp(H0 - H)` stays above 0.8 (or
    /// halves while it stays below) and the search stops at the first crossing. `direction` is
    /// set by the first trial; `trial` holds the pending step's `H0` and half-step momentum;
    /// `restart` says whether dual averaging restarts from the found size (at a window's end).
    Search { direction: Option<f64>, trial: Option<(f64, Vec<f64>)>, restart: bool },
    /// A transition's tree, and the pending leaf's half-step momentum.
    Tree { tree: Box<Tree>, p_half: Vec<f64> },
    /// Every iteration done.
    Finished,
}

/// One chain's whole run: its sampler state, its own random stream, where it is, and what it
/// has kept.
struct ChainRun {
    /// The chain's number (0-based), for messages.
    index: usize,
    chain: Chain,
    rng: EngineRng,
    stage: Stage,
    /// Transitions completed (warm-up and kept).
    iteration: usize,
    draws: Vec<f64>,
    log_prob: Vec<f64>,
    divergences: usize,
    max_depth_hits: usize,
    depth_sum: f64,
    accept_sum: f64,
    energy: Vec<f64>,
    /// Leapfrog steps whose evaluation failed, and the first one's iteration and cause.
    failed_evaluations: usize,
    first_failure: Option<String>,
}

impl ChainRun {
    /// Counts a leapfrog step whose evaluation failed (`cause`); the caller then hands the
    /// chain a NaN log density there, which ends the trajectory as a divergence.
    fn reject_failed(&mut self, cause: String) {
        self.failed_evaluations += 1;
        if self.first_failure.is_none() {
            self.first_failure = Some(format!("at iteration {}: {cause}", self.iteration + 1));
        }
    }

    /// Appends the position this chain needs the model's log density and gradient at next to
    /// `rows`; `false` when it needs none (finished).
    fn request(&mut self, rows: &mut Vec<f64>) -> bool {
        let (step, inv_metric) = (self.chain.step, &self.chain.inv_metric);
        match &mut self.stage {
            Stage::Finished => return false,
            Stage::Search { trial, .. } => {
                let mut start = self.chain.point.clone();
                start.p = draw_momentum(inv_metric, &mut self.rng);
                let h0 = hamiltonian(&start, inv_metric);
                let (p_half, q) = half_step(&start, step, inv_metric);
                *trial = Some((h0, p_half));
                rows.extend_from_slice(&q);
            }
            Stage::Tree { tree, p_half } => {
                let (half, q) = half_step(&tree.frontier, tree.dir * step, inv_metric);
                *p_half = half;
                rows.extend_from_slice(&q);
            }
        }
        true
    }

    /// Takes the model's answer at the requested position `q` and moves the chain on: the
    /// step-size search's next trial, the tree's next leaf, or (a tree done) the transition's
    /// adaptation and record and the next transition.
    fn receive(&mut self, q: &[f64], log_prob: f64, grad: &[f64], config: &NutsConfig) -> Result<(), InferError> {
        self.chain.gradients += 1;
        match std::mem::replace(&mut self.stage, Stage::Finished) {
            Stage::Finished => {}
            Stage::Search { direction, trial, restart } => {
                let (h0, p_half) = trial.expect("a search trial was requested");
                let chain = &mut self.chain;
                let p: Vec<f64> = p_half.iter().zip(grad).map(|(p, g)| p + 0.5 * chain.step * g).collect();
                let end = Point { q: q.to_vec(), p, grad: grad.to_vec(), log_prob };
                let delta = h0 - hamiltonian(&end, &chain.inv_metric);
                let threshold = 0.8f64.ln();
                // The first trial sets the direction; the search stops at the first crossing of
                // 0.8 (a NaN energy counts as one), as Stan's loop does.
                let dir = direction.unwrap_or(if delta > threshold { 1.0 } else { -1.0 });
                let (above, below) = (delta > threshold, delta < threshold);
                let crossed = (dir > 0.0 && !above) || (dir < 0.0 && !below);
                if !crossed {
                    chain.step = if dir > 0.0 { 2.0 * chain.step } else { 0.5 * chain.step };
                }
                if chain.step > 1e7 {
                    return Err(InferError::Numerical(format!(
                        "nuts: chain {}'s step size grew past 1e7 in the step-size search: the posterior is improper (check the model)",
                        self.index + 1
                    )));
                }
                if chain.step == 0.0 {
                    return Err(InferError::Numerical(format!(
                        "nuts: chain {}'s step size fell to 0 in the step-size search: no finite leapfrog step from its position",
                        self.index + 1
                    )));
                }
                if !crossed {
                    self.stage = Stage::Search { direction: Some(dir), trial: None, restart };
                } else {
                    if restart {
                        chain.adapt.mu = (10.0 * chain.step).ln();
                        chain.adapt.restart();
                    }
                    self.begin_transition(config);
                }
            }
            Stage::Tree { mut tree, p_half } => {
                let eps = tree.dir * self.chain.step;
                let p: Vec<f64> = p_half.iter().zip(grad).map(|(p, g)| p + 0.5 * eps * g).collect();
                let leaf = Point { q: q.to_vec(), p, grad: grad.to_vec(), log_prob };
                grow(&mut tree, leaf, &self.chain.inv_metric, config.max_depth, &mut self.rng);
                if tree.done {
                    self.finish_transition(*tree, config);
                } else {
                    self.stage = Stage::Tree { tree, p_half: vec![] };
                }
            }
        }
        Ok(())
    }

    /// A fresh momentum and a one-point tree at the current draw, or `Finished` when every
    /// iteration is done.
    fn begin_transition(&mut self, config: &NutsConfig) {
        if self.iteration == config.warmup + config.draws {
            self.stage = Stage::Finished;
            return;
        }
        let chain = &self.chain;
        let mut z = chain.point.clone();
        z.p = draw_momentum(&chain.inv_metric, &mut self.rng);
        let sharp: Vec<f64> = z.p.iter().zip(&chain.inv_metric).map(|(p, v)| p * v).collect();
        let h0 = hamiltonian(&z, &chain.inv_metric);
        let dir = if self.rng.uniform() > 0.5 { 1.0 } else { -1.0 };
        let tree = Tree {
            ends: [z.clone(), z.clone()],
            sharp: [sharp.clone(), sharp],
            rho: z.p.clone(),
            log_w: 0.0,
            sample: z.clone(),
            h0,
            depth: 0,
            dir,
            wanted: 1,
            built: 0,
            frontier: z,
            stack: vec![],
            done: false,
            divergent: false,
            leapfrogs: 0,
            sum_metro: 0.0,
        };
        self.stage = Stage::Tree { tree: Box::new(tree), p_half: vec![] };
    }

    /// The tree's draw becomes the chain's point; in warm-up the step size and (at a window's
    /// end, Stan's `learn_variance`) the metric adapt, else the draw and its statistics are
    /// kept; then the next transition, or the step-size search a new metric asks for.
    fn finish_transition(&mut self, tree: Tree, config: &NutsConfig) {
        let chain = &mut self.chain;
        let energy = hamiltonian(&tree.sample, &chain.inv_metric);
        let accept = tree.sum_metro / tree.leapfrogs.max(1) as f64;
        chain.point = tree.sample;
        let warming = self.iteration < config.warmup;
        let mut search = false;
        if warming {
            chain.step = chain.adapt.learn(accept);
            let w = &mut chain.windows;
            if w.in_window() {
                chain.estimator.add(&chain.point.q);
                chain.grad_estimator.add(&chain.point.grad);
            }
            if w.end_of_window() {
                w.compute_next_window();
                let (e, g) = (&chain.estimator, &chain.grad_estimator);
                let n = e.n;
                for ((v, s), sg) in chain.inv_metric.iter_mut().zip(&e.m2).zip(&g.m2) {
                    let var = if n > 1.0 { s / (n - 1.0) } else { 1.0 };
                    // A coordinate whose gradient did not vary keeps its draw variance.
                    let var = match config.metric_estimate {
                        MetricEstimate::GradientScaled if *sg > 0.0 && n > 1.0 => (var / (sg / (n - 1.0))).sqrt(),
                        _ => var,
                    };
                    *v = (n / (n + 5.0)) * var + 1e-3 * (5.0 / (n + 5.0));
                }
                chain.estimator = Welford::new(chain.inv_metric.len());
                chain.grad_estimator = Welford::new(chain.inv_metric.len());
                search = true;
            }
            chain.windows.counter += 1;
            if self.iteration + 1 == config.warmup {
                chain.step = chain.adapt.x_bar.exp();
            }
        } else {
            self.draws.extend_from_slice(&chain.point.q);
            self.log_prob.push(chain.point.log_prob);
            self.divergences += usize::from(tree.divergent);
            self.max_depth_hits += usize::from(tree.depth >= config.max_depth);
            self.depth_sum += tree.depth as f64;
            self.accept_sum += accept;
            self.energy.push(energy);
        }
        self.iteration += 1;
        if search {
            self.stage = Stage::Search { direction: None, trial: None, restart: true };
        } else {
            self.begin_transition(config);
        }
    }
}

/// Threads the chains run on: `threads` if set, else one per core; never more than the chains.
fn thread_count(config: &NutsConfig) -> usize {
    let wanted = if config.threads > 0 {
        config.threads
    } else {
        std::thread::available_parallelism().map(std::num::NonZeroUsize::get).unwrap_or(1)
    };
    wanted.clamp(1, config.chains)
}

/// Runs NUTS on `model` (full data, no minibatches): `config.chains` chains from `inits` (`chains
/// x dim` row-major) or from uniform inits, `warmup` adaptation iterations, then `draws` kept.
///
/// The chains are split into groups, one per thread ([`NutsConfig::threads`]); within a group
/// every chain that waits on the model has its row in one batched call, and a chain whose tree
/// is done starts its next transition at once, so no chain waits for another's deeper tree.
/// Each chain has its own random stream (split from `rng` in chain order), so the draws do not
/// depend on the number of threads.
pub fn nuts(
    model: &dyn LogDensity,
    config: &NutsConfig,
    inits: Option<&[f64]>,
    rng: &mut EngineRng,
    device: &Device,
) -> Result<NutsRun, InferError> {
    config.validate()?;
    let started = Instant::now();
    let (m, d) = (config.chains, model.dim());
    if let Some(rows) = inits
        && rows.len() != m * d
    {
        return Err(InferError::setting(
            "init",
            format!("{} init values do not fill {m} chains of {d} coordinates", rows.len()),
        ));
    }
    let mut runs: Vec<ChainRun> = (0..m)
        .map(|index| ChainRun {
            index,
            chain: Chain {
                point: Point { q: vec![], p: vec![], grad: vec![], log_prob: f64::NAN },
                step: 1.0,
                inv_metric: vec![1.0; d],
                // Stan sets mu = log(10 eps) from the user's initial step size (1) before the search.
                adapt: DualAveraging {
                    mu: 10f64.ln(),
                    s_bar: 0.0,
                    x_bar: 0.0,
                    counter: 0.0,
                    delta: config.target_accept,
                },
                windows: Windows::new(config.warmup),
                estimator: Welford::new(d),
                grad_estimator: Welford::new(d),
                gradients: 0,
            },
            rng: rng.split(),
            stage: Stage::Finished,
            iteration: 0,
            draws: Vec::with_capacity(config.draws * d),
            log_prob: Vec::with_capacity(config.draws),
            divergences: 0,
            max_depth_hits: 0,
            depth_sum: 0.0,
            accept_sum: 0.0,
            energy: Vec::with_capacity(config.draws),
            failed_evaluations: 0,
            first_failure: None,
        })
        .collect();
    let threads = thread_count(config);
    let per_group = m.div_ceil(threads);
    let run_group = |group: &mut [ChainRun]| -> Result<(usize, f64), InferError> {
        let first = group[0].index;
        let group_inits = inits.map(|rows| &rows[first * d..(first + group.len()) * d]);
        let mut batched = Batched { model, device, dim: d, calls: 0, seconds: 0.0 };
        run_chains(&mut batched, group, config, group_inits)?;
        Ok((batched.calls, batched.seconds))
    };
    let accounts: Vec<Result<(usize, f64), InferError>> = if threads == 1 {
        vec![run_group(&mut runs)]
    } else {
        std::thread::scope(|scope| {
            let handles: Vec<_> = runs.chunks_mut(per_group).map(|group| scope.spawn(|| run_group(group))).collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| Err(InferError::Numerical("nuts: a chain's thread panicked".into())))
                })
                .collect()
        })
    };
    let (mut calls, mut model_seconds) = (0, 0.0);
    for account in accounts {
        let (c, s) = account?;
        calls += c;
        model_seconds += s;
    }
    let n = config.draws;
    // Snapshot-major: draw s of chain c in row s * chains + c.
    let mut draws = Vec::with_capacity(n * m * d);
    let mut log_prob = Vec::with_capacity(n * m);
    for s in 0..n {
        for run in &runs {
            draws.extend_from_slice(&run.draws[s * d..(s + 1) * d]);
            log_prob.push(run.log_prob[s]);
        }
    }
    let chain_reports: Vec<ChainReport> = runs
        .iter()
        .map(|run| ChainReport {
            step_size: run.chain.step,
            inv_metric: run.chain.inv_metric.clone(),
            divergences: run.divergences,
            max_depth_hits: run.max_depth_hits,
            mean_tree_depth: run.depth_sum / n as f64,
            mean_accept_stat: run.accept_sum / n as f64,
            e_bfmi: e_bfmi(&run.energy),
            gradients: run.chain.gradients,
            failed_evaluations: run.failed_evaluations,
            first_failure: run.first_failure.clone(),
        })
        .collect();
    let warnings = stan_warnings(&chain_reports, config);
    let notes = failure_notes(&chain_reports);
    Ok(NutsRun {
        dim: d,
        chains: m,
        draws_per_chain: n,
        draws,
        log_prob,
        chain_reports,
        batched_calls: calls,
        seconds: started.elapsed().as_secs_f64(),
        model_seconds,
        warnings,
        notes,
    })
}

/// Per chain with any, a line on its proposals rejected for a failed evaluation.
fn failure_notes(reports: &[ChainReport]) -> Vec<String> {
    reports
        .iter()
        .enumerate()
        .filter(|(_, r)| r.failed_evaluations > 0)
        .map(|(c, r)| {
            let first = r.first_failure.as_deref().unwrap_or("unknown");
            format!(
                "nuts: chain {}: {} proposals rejected for a failed evaluation (first {first})",
                c + 1,
                r.failed_evaluations
            )
        })
        .collect()
}

/// One group's chains from their starts to their last draw: each call evaluates the model at
/// the rows the chains wait on, then each chain takes its answer and moves on.
fn run_chains(
    batched: &mut Batched<'_>,
    runs: &mut [ChainRun],
    config: &NutsConfig,
    inits: Option<&[f64]>,
) -> Result<(), InferError> {
    let d = batched.dim;
    let starts = initial_points(batched, runs, config, inits)?;
    for (run, point) in runs.iter_mut().zip(starts) {
        run.chain.point = point;
        run.chain.gradients = 1;
        if config.warmup > 0 {
            run.stage = Stage::Search { direction: None, trial: None, restart: false };
        } else {
            run.begin_transition(config);
        }
    }
    let mut q = Vec::with_capacity(runs.len() * d);
    let mut waiting = Vec::with_capacity(runs.len());
    let total = runs.len() * (config.warmup + config.draws);
    let mut ticker = crate::core::progress::Ticker::new(format!(
        "nuts, chains {}-{}",
        runs.first().map_or(0, |r| r.index + 1),
        runs.last().map_or(0, |r| r.index + 1)
    ));
    loop {
        ticker.tick(|| {
            let done: usize = runs.iter().map(|r| r.iteration).sum();
            format!("{done} of {total} iterations ({} warm-up each)", config.warmup)
        });
        q.clear();
        waiting.clear();
        for (i, run) in runs.iter_mut().enumerate() {
            if run.request(&mut q) {
                waiting.push(i);
            }
        }
        if waiting.is_empty() {
            return Ok(());
        }
        let answer = batched.eval(&q)?;
        for (k, &i) in waiting.iter().enumerate() {
            // A failed evaluation is a NaN log density for the chain: infinite energy, a
            // divergence that rejects the rest of the trajectory (Stan's leapfrog on an
            // exception), or a crossing in the step-size search.
            let log_prob = match answer.failure_of(k, d) {
                Some(cause) => {
                    runs[i].reject_failed(cause);
                    f64::NAN
                }
                None => answer.log_prob[k],
            };
            runs[i].receive(&q[k * d..(k + 1) * d], log_prob, &answer.grad[k * d..(k + 1) * d], config)?;
        }
    }
}

/// `sum (E_n - E_{n-1})^2 / sum (E_n - mean E)^2` (Betancourt 2016, eq. 3.6 as Stan computes it).
fn e_bfmi(energy: &[f64]) -> f64 {
    if energy.len() < 2 {
        return f64::NAN;
    }
    let mean = energy.iter().sum::<f64>() / energy.len() as f64;
    let num: f64 = energy.windows(2).map(|w| (w[1] - w[0]).powi(2)).sum();
    let den: f64 = energy.iter().map(|e| (e - mean).powi(2)).sum();
    num / den
}

/// Stan's post-run warnings, each naming the option that addresses it.
fn stan_warnings(reports: &[ChainReport], config: &NutsConfig) -> Vec<String> {
    let mut out = vec![];
    let total = (config.draws * reports.len()) as f64;
    let divergent: usize = reports.iter().map(|r| r.divergences).sum();
    if divergent > 0 {
        out.push(format!(
            "nuts: {divergent} of {} ({:.1}%) transitions ended with a divergence: the draws may be biased (raise `target-accept` towards 1, or reparameterise the model)",
            total,
            100.0 * divergent as f64 / total
        ));
    }
    let deep: usize = reports.iter().map(|r| r.max_depth_hits).sum();
    if deep > 0 {
        out.push(format!(
            "nuts: {deep} of {total} transitions hit the maximum tree depth of {}: raise `max-depth` (an efficiency concern, not a validity one)",
            config.max_depth
        ));
    }
    let low: Vec<String> = reports
        .iter()
        .enumerate()
        .filter(|(_, r)| r.e_bfmi < MIN_E_BFMI)
        .map(|(c, r)| format!("chain {} ({:.2})", c + 1, r.e_bfmi))
        .collect();
    if !low.is_empty() {
        out.push(format!(
            "nuts: E-BFMI below {MIN_E_BFMI} in {}: the posterior may have heavy tails the chains did not explore (reparameterise the model)",
            low.join(", ")
        ));
    }
    out
}

/// Chains' starting points: the given rows, or uniform(-r, r) redrawn up to 100 times per chain
/// (from the chain's own stream) until the log density and its gradient are finite (Stan's
/// `initialize`).
fn initial_points(
    batched: &mut Batched<'_>,
    runs: &mut [ChainRun],
    config: &NutsConfig,
    inits: Option<&[f64]>,
) -> Result<Vec<Point>, InferError> {
    let (m, d) = (runs.len(), batched.dim);
    const TRIES: usize = 100;
    let r = config.init_radius;
    let mut q: Vec<f64> = match inits {
        Some(rows) => rows.to_vec(),
        None => runs
            .iter_mut()
            .flat_map(|run| (0..d).map(|_| r * (2.0 * run.rng.uniform() - 1.0)).collect::<Vec<_>>())
            .collect(),
    };
    let mut attempt = 1;
    loop {
        let answer = batched.eval(&q)?;
        let (lp, grad) = (&answer.log_prob, &answer.grad);
        let bad: Vec<usize> = (0..m)
            .filter(|&c| !(lp[c].is_finite() && grad[c * d..(c + 1) * d].iter().all(|g| g.is_finite())))
            .collect();
        if bad.is_empty() {
            return Ok((0..m)
                .map(|c| Point {
                    q: q[c * d..(c + 1) * d].to_vec(),
                    p: vec![0.0; d],
                    grad: grad[c * d..(c + 1) * d].to_vec(),
                    log_prob: lp[c],
                })
                .collect());
        }
        if inits.is_some() || attempt == TRIES {
            let how = if inits.is_some() {
                "at the given inits".to_string()
            } else {
                format!("after {TRIES} uniform(-{r}, {r}) inits")
            };
            let c = bad[0];
            let cause = answer.failure_of(c, d).unwrap_or_else(|| format!("the log density is {}", lp[c]));
            return Err(InferError::Numerical(format!(
                "nuts: chain {} has no finite log density and gradient {how}: {cause}",
                runs[c].index + 1
            )));
        }
        for &c in &bad {
            for v in &mut q[c * d..(c + 1) * d] {
                *v = r * (2.0 * runs[c].rng.uniform() - 1.0);
            }
        }
        attempt += 1;
    }
}

/// A fresh momentum `p ~ N(0, M)` with `M = diag(1 / inv_metric)`.
fn draw_momentum(inv_metric: &[f64], rng: &mut EngineRng) -> Vec<f64> {
    inv_metric.iter().map(|v| rng.normal() / v.sqrt()).collect()
}

fn kinetic(p: &[f64], inv_metric: &[f64]) -> f64 {
    0.5 * p.iter().zip(inv_metric).map(|(p, v)| p * p * v).sum::<f64>()
}

/// `H = -log p(q) + K(p)`, infinite where the density is not finite.
fn hamiltonian(point: &Point, inv_metric: &[f64]) -> f64 {
    let h = -point.log_prob + kinetic(&point.p, inv_metric);
    if h.is_nan() { f64::INFINITY } else { h }
}

/// The first half of a leapfrog step (Neal 2011, eq. 5.18-5.19): `p + sign eps/2 grad`, then
/// the position `q + sign eps M^-1 p_half`.
fn half_step(from: &Point, eps: f64, inv_metric: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let p_half: Vec<f64> = from.p.iter().zip(&from.grad).map(|(p, g)| p + 0.5 * eps * g).collect();
    let q: Vec<f64> = from.q.iter().zip(&p_half).zip(inv_metric).map(|((q, p), v)| q + eps * v * p).collect();
    (p_half, q)
}

/// Adds one leaf to a chain's tree: Stan's `build_tree` base case, then the merges its recursion
/// would make now, then, when the subtree is complete, the merge into the whole trajectory.
fn grow(tree: &mut Tree, leaf: Point, inv_metric: &[f64], max_depth: usize, rng: &mut EngineRng) {
    tree.leapfrogs += 1;
    tree.built += 1;
    let h = hamiltonian(&leaf, inv_metric);
    let log_w = tree.h0 - h;
    // Stan's acceptance statistic: the mean over the leaves of min(1, exp(H0 - H)).
    tree.sum_metro += if log_w > 0.0 { 1.0 } else { log_w.exp() };
    if h - tree.h0 > MAX_ENERGY_ERROR || !h.is_finite() {
        tree.divergent = true;
        tree.done = true;
        return;
    }
    let sharp: Vec<f64> = leaf.p.iter().zip(inv_metric).map(|(p, v)| p * v).collect();
    tree.frontier = leaf.clone();
    tree.stack.push(Sub {
        leaves: 1,
        log_w,
        rho: leaf.p.clone(),
        p_beg: leaf.p.clone(),
        p_end: leaf.p.clone(),
        sharp_beg: sharp.clone(),
        sharp_end: sharp,
        proposal: leaf,
    });
    // Merge equal-sized neighbours: the "init" subtree (built first, nearer the trajectory)
    // and the "final" one.
    while tree.stack.len() >= 2 && tree.stack[tree.stack.len() - 1].leaves == tree.stack[tree.stack.len() - 2].leaves {
        let last = tree.stack.pop().expect("two entries");
        let init = tree.stack.pop().expect("two entries");
        let log_w = log_add(init.log_w, last.log_w);
        // Uniform progressive sampling within a subtree (Betancourt 2017, A.3.2).
        let take_last = last.log_w > log_w || rng.uniform() < (last.log_w - log_w).exp();
        let rho = add(&init.rho, &last.rho);
        // The criterion across the merged subtree, and across each half extended by the
        // neighbouring point of the other (Stan's extra checks).
        let ok = no_u_turn(&init.sharp_beg, &last.sharp_end, &rho)
            && no_u_turn(&init.sharp_beg, &last.sharp_beg, &add(&init.rho, &last.p_beg))
            && no_u_turn(&init.sharp_end, &last.sharp_end, &add(&last.rho, &init.p_end));
        if !ok {
            tree.done = true;
            return;
        }
        tree.stack.push(Sub {
            leaves: init.leaves * 2,
            log_w,
            rho,
            p_beg: init.p_beg,
            p_end: last.p_end,
            sharp_beg: init.sharp_beg,
            sharp_end: last.sharp_end,
            proposal: if take_last { last.proposal } else { init.proposal },
        });
    }
    if tree.built < tree.wanted {
        return;
    }
    let sub = tree.stack.pop().expect("a complete subtree");
    // Biased progressive sampling between the old trajectory and the new subtree (A.3.2).
    if sub.log_w > tree.log_w || rng.uniform() < (sub.log_w - tree.log_w).exp() {
        tree.sample = sub.proposal.clone();
    }
    tree.log_w = log_add(tree.log_w, sub.log_w);
    tree.depth += 1;
    // Side 1 is the forward end: the subtree grew at `near`, `far` is the other end.
    let (near, far) = if tree.dir > 0.0 { (1, 0) } else { (0, 1) };
    let rho = add(&tree.rho, &sub.rho);
    let ok = no_u_turn(&tree.sharp[far], &sub.sharp_end, &rho)
        && no_u_turn(&tree.sharp[far], &sub.sharp_beg, &add(&tree.rho, &sub.p_beg))
        && no_u_turn(&tree.sharp[near], &sub.sharp_end, &add(&sub.rho, &tree.ends[near].p));
    tree.rho = rho;
    tree.ends[near] = tree.frontier.clone();
    tree.sharp[near] = sub.sharp_end;
    if !ok || tree.depth >= max_depth {
        tree.done = true;
        return;
    }
    tree.dir = if rng.uniform() > 0.5 { 1.0 } else { -1.0 };
    let side = if tree.dir > 0.0 { 1 } else { 0 };
    tree.frontier = tree.ends[side].clone();
    tree.wanted = 1 << tree.depth;
    tree.built = 0;
}

/// NUTS as an engine: its first step runs the whole sampler (warm-up and draws, every chain)
/// from the run's particles or uniform inits and leaves each chain's last draw as the
/// particles (`chains` of them); later steps leave them. [`Engine::draws`] gives the kept draws,
/// snapshot-major, so `fit` treats them as MCMC chains.
pub struct Nuts {
    config: NutsConfig,
    draws: Option<Particles>,
    report: serde_json::Value,
}

impl Nuts {
    /// The engine with `config`; an error names an option out of range.
    pub fn new(config: &NutsConfig) -> Result<Self, InferError> {
        config.validate()?;
        Ok(Self { config: config.clone(), draws: None, report: serde_json::Value::Null })
    }
}

impl Engine for Nuts {
    fn name(&self) -> &'static str {
        "nuts"
    }

    fn init(&mut self, particles: &Particles) -> Result<(), InferError> {
        if self.config.init == NutsInit::Particles && particles.len() < self.config.chains {
            return Err(InferError::setting(
                "init",
                format!(
                    "`init = particles` starts {} chains from the run's particles, but there are {}",
                    self.config.chains,
                    particles.len()
                ),
            ));
        }
        Ok(())
    }

    fn step(&mut self, ctx: &mut StepContext<'_>, particles: &mut Particles) -> Result<(), InferError> {
        if self.draws.is_some() {
            return Ok(());
        }
        if ctx.batch.is_some() {
            return Err(InferError::setting(
                "batch-size",
                "nuts needs the full data at every step (a minibatch's noisy gradient breaks the Hamiltonian's energy): leave the batch size unset",
            ));
        }
        let device = particles.device();
        let (m, d) = (self.config.chains, particles.dim());
        let inits: Option<Vec<f64>> = (self.config.init == NutsInit::Particles)
            .then(|| particles.to_rows().into_iter().take(m).flatten().map(f64::from).collect());
        let run = nuts(ctx.model, &self.config, inits.as_deref(), ctx.rng, &device)?;
        let n = run.draws_per_chain;
        let last: Vec<f32> = run.draws[(n - 1) * m * d..].iter().map(|&v| v as f32).collect();
        *particles = Particles::new(matrix_from_vec(last, m, d, &device));
        let all: Vec<f32> = run.draws.iter().map(|&v| v as f32).collect();
        self.draws = Some(Particles::new(matrix_from_vec(all, n * m, d, &device)));
        self.report = run.summary();
        Ok(())
    }

    fn draws(&self) -> Option<Particles> {
        self.draws.clone()
    }

    fn save(&self) -> EngineState {
        let mut state = EngineState::default();
        if let Some(draws) = &self.draws {
            state.put_tensor("draws", &draws.positions);
        }
        state
    }

    fn load(&mut self, state: &EngineState, device: &Device) -> Result<(), InferError> {
        self.draws = state.tensor_opt::<2>("draws", device)?.map(Particles::new);
        Ok(())
    }

    fn report(&self) -> serde_json::Value {
        self.report.clone()
    }
}

impl EngineConfig for NutsConfig {
    /// NUTS takes no kernel and no step-size rule (it adapts its own step size): the shared ones
    /// are ignored, as Pathfinder's and SGLD's.
    fn build(&self, _kernel: &KernelConfig, _adapter: &AdapterConfig) -> Result<Box<dyn Engine>, InferError> {
        Ok(Box::new(Nuts::new(self)?))
    }

    fn uses_step_rule(&self) -> bool {
        false
    }
}
