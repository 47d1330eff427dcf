//! Stein Points (Chen, Mackey, Gorham, Briol & Oates 2018) as Futami et al. run it for their
//! comparison (their Appendix H, "greedy Monte Carlo"): the first point is an approximate MAP
//! (`map-steps` Adam iterations on `log p` from the first initial particle; the paper loops 100
//! times), and each later point minimises the KSD of the set it joins,
//!
//! `x_n = argmin_y  k_p(y, y) / 2 + sum_{i<n} k_p(x_i, y)`,
//!
//! over `candidates` points (the paper: 20), each drawn from `N(x_b, proposal-scale^2 I)` around
//! a base point `x_b` chosen uniformly among the current points (scale 1 in the paper). `k_p` is
//! the Stein kernel of the run's kernel, the Gaussian by default as in the paper (median rule
//! over the current points, fixed for the step; `--kernel imq` for Chen et al.'s IMQ). The
//! paper's last step, resampling until every candidate lies in `[-1, 1]^d`, is left out: it
//! bounds the search to a box fitted to their logistic regression, and in `d` dimensions all
//! `d` coordinates of 20 unit-scale draws almost never fall in it. One step: one batched score
//! of the candidates and an `[n, M]` cross Stein kernel. Uniform weights.
//!
//! Like MMD-FW the set grows by one per step, up to the number of initial particles `N`.

use burn::tensor::{Device, Tensor};
use parvi_model::score;
use parvi_model::tensor_ops::{all_finite, pairwise_sq_dists, to_vec_f32};
use serde::{Deserialize, Serialize};

use crate::core::select_rows;
use crate::engines::EngineConfig;
use crate::error::{require_growth_target, require_positive};
use crate::kernels::pair_median_sq;
use crate::{AdapterConfig, KernelConfig};
use crate::{Engine, EngineState, InferError, Kernel, Particles, RadialEval, StepContext};

/// Options of `stein-points`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct SteinPointsConfig {
    /// Candidates sampled per step (`M >= 1`; Futami et al.: 20).
    pub candidates: usize,
    /// Standard deviation of the Gaussian proposal around a current point (Futami et al.: 1).
    pub proposal_scale: f64,
    /// Adam iterations of the MAP search that places the first point (`0`: the first initial
    /// particle as it is; Futami et al.: 100).
    pub map_steps: usize,
    /// Adam step size of the MAP search.
    pub map_lr: f64,
}

impl Default for SteinPointsConfig {
    fn default() -> Self {
        Self { candidates: 20, proposal_scale: 1.0, map_steps: 100, map_lr: 0.05 }
    }
}

/// The cross Stein kernel `k_p(x_i, y_j)` `[n, m]` of a radial kernel `f(r^2)`:
/// `s_i.t_j f + 2 f' (s_i - t_j).(y_j - x_i) - 4 f'' r^2 - 2 d f'` (`eval` with `d2k`, of the
/// pairs of `x` against `y`, `sq` their squared distances; `s`, `t` the scores).
pub fn stein_kernel_cross(
    eval: &RadialEval,
    sq: &Tensor<2>,
    x: Tensor<2>,
    s: Tensor<2>,
    y: Tensor<2>,
    t: Tensor<2>,
) -> Tensor<2> {
    let d = x.dims()[1] as f64;
    let d2k = eval.d2k.clone().expect("stein_kernel_cross needs the second derivative");
    let st = s.clone().matmul(t.clone().transpose());
    // (s_i - t_j).(y_j - x_i) = s_i.y_j - s_i.x_i - t_j.y_j + t_j.x_i
    let sy = s.clone().matmul(y.clone().transpose());
    let sx = (s * x.clone()).sum_dim(1); // [n, 1]
    let ty = (t.clone() * y).sum_dim(1).transpose(); // [1, m]
    let tx = x.matmul(t.transpose()); // [n, m]
    let cross = sy - sx - ty + tx;
    st * eval.k.clone() + (cross * eval.dk.clone()).mul_scalar(2.0)
        - (d2k * sq.clone()).mul_scalar(4.0)
        - eval.dk.clone().mul_scalar(2.0 * d)
}

/// Stein Points: grows the set by the candidate of least KSD objective each step.
pub struct SteinPoints {
    config: SteinPointsConfig,
    kernel: Box<dyn Kernel>,
    /// The initial points `[N, d]`: `N` is the target size, the first is the MAP search's start.
    pool: Option<Tensor<2>>,
    scores: Option<Tensor<2>>,
    count: usize,
    last_objective: Option<f64>,
    /// The kernel of the last step (its bandwidth resolved on the current points).
    kernel_used: String,
    map_log_prob: Option<f64>,
}

impl SteinPoints {
    /// Stein Points with `config` and the base kernel `kernel` (a median rule is resolved on the
    /// current points at each step), checking the candidate count, spread and MAP settings.
    pub fn new(config: SteinPointsConfig, kernel: Box<dyn Kernel>) -> Result<Self, InferError> {
        if config.candidates == 0 {
            return Err(InferError::setting("candidates", "need at least one candidate per step, got 0"));
        }
        require_positive("proposal-scale", config.proposal_scale)?;
        require_positive("map-lr", config.map_lr)?;
        let kernel_used = kernel.describe();
        Ok(Self {
            config,
            kernel,
            pool: None,
            scores: None,
            count: 0,
            last_objective: None,
            kernel_used,
            map_log_prob: None,
        })
    }

    /// The kernel of a step whose current points are `x`: a median rule takes their median.
    fn step_kernel(&self, x: &Tensor<2>) -> Option<Box<dyn Kernel>> {
        self.kernel.resolved(x.dims()[0], &mut || pair_median_sq(x))
    }

    /// `k_p(y, y) / 2 + sum_i k_p(x_i, y)` for the candidates `y` with scores `t` (host).
    fn objective(kernel: &dyn Kernel, x: &Tensor<2>, s: &Tensor<2>, y: Tensor<2>, t: Tensor<2>) -> Vec<f32> {
        let device = y.device();
        // k_p(y, y) = |t|^2 f(0) - 2 d f'(0).
        let zero = Tensor::<2>::zeros([1, 1], &device);
        let at_zero = kernel.eval(&zero, false);
        let dim = y.dims()[1] as f64;
        let self_term = t.clone().square().sum_dim(1).transpose() * at_zero.k - at_zero.dk.mul_scalar(2.0 * dim); // [1, m]
        let sq = pairwise_sq_dists(x.clone(), y.clone());
        let eval = kernel.eval(&sq, true);
        let cross = stein_kernel_cross(&eval, &sq, x.clone(), s.clone(), y, t).sum_dim(0);
        // One host read of M values: the argmin decides which row joins.
        to_vec_f32(&(self_term.mul_scalar(0.5) + cross))
    }

    /// `M` candidates around base points drawn uniformly from `centres`, with
    /// `N(0, (shrink * proposal-scale)^2 I)` noise.
    fn candidates(&self, centres: &Tensor<2>, shrink: f64, ctx: &mut StepContext<'_>, device: &Device) -> Tensor<2> {
        let m = self.config.candidates;
        let c = centres.dims()[0];
        let idx: Vec<usize> = (0..m).map(|_| ((ctx.rng.uniform() * c as f64) as usize).min(c - 1)).collect();
        let noise = ctx.rng.normal_tensor(m, centres.dims()[1], device).mul_scalar(self.config.proposal_scale * shrink);
        select_rows(centres, &idx) + noise
    }

    /// Adam on `log p` from `start` `[1, d]` for `map-steps` iterations.
    fn map_search(&mut self, ctx: &mut StepContext<'_>, start: Tensor<2>) -> Result<Tensor<2>, InferError> {
        let steps = self.config.map_steps;
        let mut adam = AdapterConfig::adam(self.config.map_lr).build()?;
        let mut x = start;
        for it in 0..steps {
            let s = score(ctx.model, x.clone(), ctx.batch)?;
            // One host read per iteration of one point: it names the diverging iteration.
            let lp = f64::from(to_vec_f32(&s.log_prob)[0]);
            if !lp.is_finite() || !all_finite(&s.grad) {
                return Err(InferError::Numerical(format!(
                    "Stein Points' MAP search (first point) diverged at Adam step {it} of {steps} (map-lr = {}): \
                     non-finite log density or score",
                    self.config.map_lr
                )));
            }
            self.map_log_prob = Some(lp);
            x = x + adam.delta(s.grad);
        }
        if !all_finite(&x) {
            return Err(InferError::Numerical(format!(
                "Stein Points' MAP search (first point) ended at a non-finite point (map-lr = {})",
                self.config.map_lr
            )));
        }
        Ok(x)
    }
}

impl Engine for SteinPoints {
    fn name(&self) -> &'static str {
        "stein-points"
    }

    fn init(&mut self, particles: &Particles) -> Result<(), InferError> {
        require_growth_target("Stein Points", particles)
    }

    fn step(&mut self, ctx: &mut StepContext<'_>, particles: &mut Particles) -> Result<(), InferError> {
        let device = particles.device();
        if self.count == 0 {
            let pool = particles.positions.clone();
            self.pool = Some(pool.clone());
            let first = self.map_search(ctx, pool.narrow(0, 0, 1))?;
            self.scores = Some(score(ctx.model, first.clone(), ctx.batch)?.grad);
            self.count = 1;
            *particles = Particles::new(first);
            return Ok(());
        }
        let target = self.pool.as_ref().map_or(0, |p| p.dims()[0]);
        if self.count >= target {
            return Ok(());
        }
        let x = particles.positions.clone();
        let s = self.scores.clone().expect("set with the first point");
        let resolved = self.step_kernel(&x);
        let kernel = resolved.as_deref().unwrap_or(self.kernel.as_ref());
        self.kernel_used = kernel.describe();
        // Candidates where the density overflows have non-finite objectives and never win; if
        // all of them do, the proposal shrinks 10-fold (3 tries).
        let mut found = None;
        for attempt in 0..3 {
            let y = self.candidates(&x, 0.1f64.powi(attempt), ctx, &device);
            let t = score(ctx.model, y.clone(), ctx.batch)?.grad;
            let values = Self::objective(kernel, &x, &s, y.clone(), t.clone());
            if let Some(best) = values
                .iter()
                .enumerate()
                .filter(|(_, v)| v.is_finite())
                .min_by(|a, b| a.1.total_cmp(b.1))
                .map(|(i, v)| (i, f64::from(*v)))
            {
                found = Some((y, t, best));
                break;
            }
        }
        let (y, t, best) = found.ok_or_else(|| {
            InferError::Numerical(format!(
                "step {}: every Stein Points candidate has a non-finite objective (non-finite scores?), \
                 even with the proposal shrunk 100-fold",
                ctx.step
            ))
        })?;
        self.last_objective = Some(best.1);
        let new = select_rows(&y, &[best.0]);
        let new_score = select_rows(&t, &[best.0]);
        self.scores = Some(Tensor::cat(vec![s, new_score], 0));
        self.count += 1;
        *particles = Particles::new(Tensor::cat(vec![x, new], 0));
        Ok(())
    }

    fn save(&self) -> EngineState {
        let mut state = EngineState::default();
        if let Some(p) = &self.pool {
            state.put_tensor("pool", p);
        }
        if let Some(s) = &self.scores {
            state.put_tensor("scores", s);
        }
        state.put_scalar("count", self.count as f64);
        state
    }

    fn load(&mut self, state: &EngineState, device: &Device) -> Result<(), InferError> {
        self.pool = state.tensor_opt("pool", device)?;
        self.scores = state.tensor_opt("scores", device)?;
        self.count = state.scalar("count")? as usize;
        Ok(())
    }

    fn report(&self) -> serde_json::Value {
        serde_json::json!({
            "kernel": self.kernel_used,
            "particles": self.count,
            "candidates": self.config.candidates,
            "proposal_scale": self.config.proposal_scale,
            "map_steps": self.config.map_steps,
            "map_log_prob": self.map_log_prob,
            "last_objective": self.last_objective,
        })
    }
}

/// The run's kernel is the base of the Stein kernel (the Gaussian with the median rule by
/// default, as Futami et al.; `--kernel imq` for Chen et al.'s choice).
impl EngineConfig for SteinPointsConfig {
    fn build(&self, kernel: &KernelConfig, _adapter: &AdapterConfig) -> Result<Box<dyn Engine>, InferError> {
        kernel.require_radial("stein-points", "its Stein kernel is built from a radial kernel's profile")?;
        Ok(Box::new(SteinPoints::new(self.clone(), kernel.build()?)?))
    }

    fn uses_step_rule(&self) -> bool {
        false
    }
}
