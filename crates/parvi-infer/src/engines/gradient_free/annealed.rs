//! Annealed SVGD and annealed gradient-free SVGD (Han & Liu 2018, Algorithms 2 and 3).
//!
//! Both follow the path `p_t ∝ p0^(1 - a_t) p^(a_t)` over temperatures `0 < a_1 <= ... <= a_T = 1`,
//! `m` steps per temperature (then on at `a = 1`):
//! - A-SVGD runs SVGD on `p_t`, whose score is `(1 - a_t) grad log p0 + a_t grad log p`;
//! - AGF-SVGD runs GF-SVGD on `p_t` using its values only, with the kernel curve fit
//!   `rho_t(x) ∝ sum_j p_t(x_j) k_rho(x_j, x)` over the current particles as the surrogate
//!   (its gradient by autodiff), `k_rho` the update's own RBF kernel at its bandwidth for the
//!   particles times [`CurveFit::bandwidth_ratio`].
//!
//! The paper's fit as written ([`CurveFit::paper`]: every anchor, `k_rho = k`, plain weights)
//! is always wider than the particles once `d > log(n + 1) / 2` (the median bandwidth grows with
//! their spread), its importance weights degenerate and the set diverges. The defaults
//! ([`CurveFit::default`]) fit each particle through the others (leave-one-out) at half the
//! bandwidth and truncate the weights at `sqrt(n)` times their mean, each an option; an empirical
//! choice, measured in `docs/experiments.md`.

use burn::tensor::Tensor;
use parvi_model::grad::log_prob_value;
use parvi_model::tensor_ops::{log_sum_exp, pairwise_sq_dists};
use parvi_model::{LogDensity, Minibatch, score};
use serde::{Deserialize, Serialize};

use super::surrogate::{AuxDensity, AuxKind, HanLiuKernel, gf_direction, self_normalized_weights, truncated_weights};
use crate::core::shard::{ParticleShard, ShardBy, not_shardable};
use crate::core::{Direction, DirectionEngine};
use crate::engines::EngineConfig;
use crate::error::require_positive;
use crate::kernels::{require_row_blocks, svgd_direction, svgd_shard_of};
use crate::{AdapterConfig, Engine, KernelConfig};
use crate::{InferError, Kernel, Particles, StepAdapter, StepContext};

/// Temperatures `a_1..a_T` ending at 1, each held for `steps_per_temperature` steps.
#[derive(Clone, Debug, PartialEq)]
pub struct TemperatureSchedule {
    temperatures: Vec<f64>,
    steps_per_temperature: usize,
}

impl TemperatureSchedule {
    /// `a_t = t / T`, `t = 1..T`.
    pub fn linear(levels: usize, steps_per_temperature: usize) -> Result<Self, InferError> {
        require_levels(levels)?;
        Self::from_list((1..=levels).map(|t| t as f64 / levels as f64).collect(), steps_per_temperature)
    }

    /// `a_t = start^((T - t) / (T - 1))`: from `start` to 1 by a constant ratio.
    pub fn geometric(start: f64, levels: usize, steps_per_temperature: usize) -> Result<Self, InferError> {
        require_levels(levels)?;
        if !(start > 0.0 && start <= 1.0) {
            return Err(InferError::setting("start", format!("the first temperature must be in (0, 1], got {start}")));
        }
        let temps = if levels == 1 {
            vec![1.0]
        } else {
            (1..=levels).map(|t| start.powf((levels - t) as f64 / (levels - 1) as f64)).collect()
        };
        Self::from_list(temps, steps_per_temperature)
    }

    /// A user's temperatures: finite, in `(0, 1]`, non-decreasing, and ending at exactly 1 (the
    /// last distribution of the path must be the target).
    pub fn from_list(temperatures: Vec<f64>, steps_per_temperature: usize) -> Result<Self, InferError> {
        if steps_per_temperature == 0 {
            return Err(InferError::setting("steps-per-temperature", "must be >= 1"));
        }
        let Some(&last) = temperatures.last() else {
            return Err(InferError::setting("temperatures", "need at least one temperature (the last must be 1)"));
        };
        if let Some(a) = temperatures.iter().find(|a| !(**a > 0.0 && **a <= 1.0)) {
            return Err(InferError::setting("temperatures", format!("each must be in (0, 1], got {a}")));
        }
        if let Some(w) = temperatures.windows(2).find(|w| w[1] < w[0]) {
            return Err(InferError::setting("temperatures", format!("must not decrease, got {} then {}", w[0], w[1])));
        }
        if last != 1.0 {
            return Err(InferError::setting(
                "temperatures",
                format!("must end at 1 (the target itself), but the last is {last}"),
            ));
        }
        Ok(Self { temperatures, steps_per_temperature })
    }

    /// The temperature of (0-based) step `step`; 1 once the schedule is done.
    pub fn temperature(&self, step: usize) -> f64 {
        self.temperatures.get(step / self.steps_per_temperature).copied().unwrap_or(1.0)
    }

    /// The temperatures `a_1..a_T`.
    pub fn temperatures(&self) -> &[f64] {
        &self.temperatures
    }

    /// Steps until the target's temperature is reached.
    pub fn annealing_steps(&self) -> usize {
        self.temperatures.len() * self.steps_per_temperature
    }

    fn describe(&self) -> serde_json::Value {
        serde_json::json!({
            "levels": self.temperatures.len(),
            "first": self.temperatures[0],
            "steps-per-temperature": self.steps_per_temperature,
        })
    }
}

fn require_levels(levels: usize) -> Result<(), InferError> {
    if levels == 0 { Err(InferError::setting("levels", "need at least one temperature level")) } else { Ok(()) }
}

/// How the command line picks the temperatures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScheduleKind {
    /// [`TemperatureSchedule::linear`] over option `levels`.
    #[default]
    Linear,
    /// [`TemperatureSchedule::geometric`] from option `start` over option `levels`.
    Geometric,
    /// The values of `temperatures`.
    List,
}

/// The options of `a-svgd` and `agf-svgd`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct AnnealedConfig {
    /// How the temperatures are chosen.
    pub schedule: ScheduleKind,
    /// Number of temperatures `T` (linear and geometric).
    pub levels: usize,
    /// The first temperature of the geometric schedule.
    pub start: f64,
    /// The temperatures of the `list` schedule, ending at 1.
    pub temperatures: Vec<f64>,
    /// `m`, steps at each temperature.
    pub steps_per_temperature: usize,
    /// `p0`: an isotropic Gaussian (the particles should start from it: match their initial spread) or
    /// flat (`p_t ∝ p^(a_t)`).
    pub p0: AuxKind,
    /// Mean of every coordinate of the Gaussian `p0`.
    pub p0_mean: f64,
    /// Standard deviation of every coordinate of the Gaussian `p0`.
    pub p0_std: f64,
    /// `agf-svgd` only: the kernel curve fit through every particle (`full`, the paper) or,
    /// at each particle, through the others (`leave-one-out`).
    pub fit: CurveFitKind,
    /// `agf-svgd` only: the smoothing kernel's bandwidth as a multiple of the update kernel's
    /// (the paper: 1).
    pub fit_bandwidth: f64,
    /// `agf-svgd` only: cap the importance weights at `sqrt(n)` times their mean.
    pub truncate_weights: bool,
    /// The kernel's median rule: `median` (the run's kernel) or `printed` (Han & Liu's as
    /// printed, half the `h^2`), for the updates and AGF-SVGD's curve fit alike.
    pub kernel: HanLiuKernel,
}

impl Default for AnnealedConfig {
    fn default() -> Self {
        Self {
            schedule: ScheduleKind::Linear,
            levels: 500,
            start: 0.01,
            temperatures: Vec::new(),
            steps_per_temperature: 1,
            p0: AuxKind::Gaussian,
            p0_mean: 0.0,
            p0_std: 1.0,
            fit: CurveFit::default().kind,
            fit_bandwidth: CurveFit::default().bandwidth_ratio,
            truncate_weights: CurveFit::default().truncate_weights,
            kernel: HanLiuKernel::Median,
        }
    }
}

impl AnnealedConfig {
    /// The temperature schedule these options describe, validated.
    pub fn schedule(&self) -> Result<TemperatureSchedule, InferError> {
        if self.schedule != ScheduleKind::List && !self.temperatures.is_empty() {
            return Err(InferError::setting("temperatures", "is only read with `schedule = list`"));
        }
        match self.schedule {
            ScheduleKind::Linear => TemperatureSchedule::linear(self.levels, self.steps_per_temperature),
            ScheduleKind::Geometric => {
                TemperatureSchedule::geometric(self.start, self.levels, self.steps_per_temperature)
            }
            ScheduleKind::List => TemperatureSchedule::from_list(self.temperatures.clone(), self.steps_per_temperature),
        }
    }

    /// AGF-SVGD's surrogate options.
    pub fn curve_fit(&self) -> Result<CurveFit, InferError> {
        CurveFit::new(self.fit, self.fit_bandwidth, self.truncate_weights)
    }

    /// Whether any `agf-svgd`-only option differs from its default (A-SVGD refuses them).
    pub fn sets_curve_fit(&self) -> bool {
        let d = Self::default();
        self.fit != d.fit || self.fit_bandwidth != d.fit_bandwidth || self.truncate_weights != d.truncate_weights
    }

    /// The initial density `p0` of the path, validated.
    pub fn p0(&self) -> Result<AuxDensity, InferError> {
        match self.p0 {
            AuxKind::Gaussian => {
                if !self.p0_mean.is_finite() {
                    return Err(InferError::setting("p0-mean", format!("must be finite, got {}", self.p0_mean)));
                }
                require_positive("p0-std", self.p0_std)?;
                Ok(AuxDensity::Gaussian { mean: self.p0_mean, std: self.p0_std })
            }
            AuxKind::Flat => Ok(AuxDensity::Flat),
        }
    }
}

/// `log p_t = (1 - a) log p0 + a log p`.
fn tempered(log_p0: Tensor<1>, log_p: Tensor<1>, a: f64) -> Tensor<1> {
    log_p0.mul_scalar(1.0 - a) + log_p.mul_scalar(a)
}

/// A-SVGD: SVGD along the annealing path (uses the target's gradient).
pub struct AnnealedSvgd {
    kernel: Box<dyn Kernel>,
    p0: AuxDensity,
    schedule: TemperatureSchedule,
}

impl AnnealedSvgd {
    /// A-SVGD (Algorithm 2) moving by `kernel` and `adapter` along the path from `p0`.
    pub fn new(
        kernel: Box<dyn Kernel>,
        adapter: Box<dyn StepAdapter>,
        p0: AuxDensity,
        schedule: TemperatureSchedule,
    ) -> DirectionEngine<Self> {
        DirectionEngine::new(Self { kernel, p0, schedule }, adapter)
    }
}

impl AnnealedSvgd {
    /// The score of the annealed density `p0^(1 - a) p^a` at `x` (Algorithm 2's path).
    fn annealed_score(&self, ctx: &StepContext<'_>, x: Tensor<2>) -> Result<Tensor<2>, InferError> {
        let a = self.schedule.temperature(ctx.step);
        let target = score(ctx.model, x.clone(), ctx.batch)?.grad.mul_scalar(a);
        Ok(match self.p0.log_and_score("p0", x)? {
            Some(s0) => s0.grad.mul_scalar(1.0 - a) + target,
            None => target,
        })
    }
}

impl Direction for AnnealedSvgd {
    fn name(&self) -> &'static str {
        "a-svgd"
    }

    fn init(&mut self, particles: &Particles) -> Result<(), InferError> {
        self.p0.log_and_score("p0", particles.positions.clone())?;
        Ok(())
    }

    fn ascent(&mut self, ctx: &mut StepContext<'_>, x: Tensor<2>) -> Result<Tensor<2>, InferError> {
        let s = self.annealed_score(ctx, x.clone())?;
        Ok(svgd_direction(self.kernel.as_ref(), x, s))
    }

    /// Particles sharded as SVGD's; rows not: the annealed score mixes the target's score with
    /// the initial distribution's, which each rank would add once.
    fn can_shard(&self, by: ShardBy) -> Result<(), InferError> {
        match by {
            ShardBy::Particles => require_row_blocks("a-svgd", self.kernel.as_ref()),
            ShardBy::Rows => Err(not_shardable(
                "a-svgd",
                "with its rows sharded: its annealed score mixes in the initial distribution's, which every rank would add",
            )),
        }
    }

    fn shard_scores(&mut self, ctx: &mut StepContext<'_>, x_rows: Tensor<2>) -> Result<Tensor<2>, InferError> {
        self.annealed_score(ctx, x_rows)
    }

    fn ascent_shard(
        &mut self,
        _ctx: &mut StepContext<'_>,
        x: Tensor<2>,
        scores: Tensor<2>,
        shard: &ParticleShard<'_>,
    ) -> Result<Tensor<2>, InferError> {
        svgd_shard_of("a-svgd", self.kernel.as_ref(), x, scores, shard)
    }

    fn report(&self) -> serde_json::Value {
        serde_json::json!({
            "kernel": self.kernel.describe(),
            "p0": self.p0.describe(),
            "schedule": self.schedule.describe(),
        })
    }
}

/// Which anchors AGF-SVGD's kernel curve fit uses at a particle.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CurveFitKind {
    /// Every particle, itself included (the paper's eq. 24).
    Full,
    /// Every other particle.
    #[default]
    LeaveOneOut,
}

/// How AGF-SVGD builds its surrogate and weights (see the module documentation for why the
/// defaults differ from the paper).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CurveFit {
    /// Which anchors the fit at a particle uses.
    pub kind: CurveFitKind,
    /// Smoothing bandwidth / the update kernel's bandwidth.
    pub bandwidth_ratio: f64,
    /// Cap the importance weights at `sqrt(n)` times their mean.
    pub truncate_weights: bool,
}

impl Default for CurveFit {
    /// Leave-one-out, half the update kernel's bandwidth, truncated weights.
    fn default() -> Self {
        Self { kind: CurveFitKind::LeaveOneOut, bandwidth_ratio: 0.5, truncate_weights: true }
    }
}

impl CurveFit {
    /// Surrogate options, checking that `bandwidth_ratio` is positive.
    pub fn new(kind: CurveFitKind, bandwidth_ratio: f64, truncate_weights: bool) -> Result<Self, InferError> {
        require_positive("fit-bandwidth", bandwidth_ratio)?;
        Ok(Self { kind, bandwidth_ratio, truncate_weights })
    }

    /// The paper as written: every anchor, the update's kernel, plain weights.
    pub fn paper() -> Self {
        Self { kind: CurveFitKind::Full, bandwidth_ratio: 1.0, truncate_weights: false }
    }

    fn describe(&self) -> serde_json::Value {
        serde_json::json!({
            "fit": self.kind,
            "fit-bandwidth": self.bandwidth_ratio,
            "truncate-weights": self.truncate_weights,
        })
    }
}

/// The kernel curve fit `rho(y) ∝ sum_j exp(log_values_j) k(x_j, y)` through the values of a
/// density at `anchors` (AGF-SVGD's surrogate, the paper's eq. 24): a differentiable density in
/// `y`, unnormalised. `k` is the update's own Gaussian kernel, `k = exp(c r^2)`, at the bandwidth
/// it takes at the anchors times a ratio.
pub struct KernelCurveFit {
    /// `[n, d]`
    anchors: Tensor<2>,
    /// `[n, 1]`
    log_values: Tensor<2>,
    /// `c = f' / f < 0` of the kernel profile `f(r^2) = exp(c r^2)`, `[1, 1]`.
    rate: Tensor<2>,
    leave_one_out: bool,
}

impl KernelCurveFit {
    /// Through the values `log_values` `[n]` at `anchors` `[n, d]`, smoothed by `kernel` at
    /// `bandwidth_ratio` times its bandwidth for the anchors; `None` when the kernel's profile is
    /// not Gaussian (`f' = c f`).
    ///
    /// Leave-one-out: evaluated at `n` points, the value at row `i` omits anchor `i` (the fit
    /// at each particle through the others); at any other number of points it is the full fit.
    pub fn new(
        kernel: &dyn Kernel,
        anchors: Tensor<2>,
        log_values: Tensor<1>,
        bandwidth_ratio: f64,
        leave_one_out: bool,
    ) -> Option<Self> {
        let anchors = anchors.detach();
        let n = anchors.dims()[0];
        let (_, rate) = kernel.eval_proportional(&pairwise_sq_dists(anchors.clone(), anchors.clone()))?;
        let rate = rate.detach().div_scalar(bandwidth_ratio * bandwidth_ratio);
        Some(Self { anchors, log_values: log_values.detach().reshape([n, 1]), rate, leave_one_out })
    }
}

impl LogDensity for KernelCurveFit {
    fn dim(&self) -> usize {
        self.anchors.dims()[1]
    }

    fn log_prob(&self, y: Tensor<2>, _batch: Option<&Minibatch>) -> Tensor<1> {
        let (n, m) = (self.anchors.dims()[0], y.dims()[0]);
        let sq = pairwise_sq_dists(self.anchors.clone(), y); // [n, m]
        let mut terms = self.log_values.clone() + sq * self.rate.clone();
        if self.leave_one_out && m == n {
            // A finite floor rather than -inf: exp underflows to an exact 0 either way, and a
            // lone particle (n = 1) gives a finite value instead of NaN.
            let own = Tensor::<2>::eye(n, &terms.device()).equal_elem(1.0);
            terms = terms.mask_fill(own, -1.0e30);
        }
        log_sum_exp(terms, 0).reshape([m])
    }
}

fn gaussian_kernel_needed() -> InferError {
    InferError::setting("kernel", "agf-svgd smooths its surrogate with the update's kernel, which must be an RBF")
}

/// AGF-SVGD: GF-SVGD along the annealing path with kernel-curve surrogates (target values only).
pub struct AnnealedGfSvgd {
    kernel: Box<dyn Kernel>,
    p0: AuxDensity,
    schedule: TemperatureSchedule,
    fit: CurveFit,
}

impl AnnealedGfSvgd {
    /// AGF-SVGD moving by `kernel` and `adapter` along the path from `p0` under `schedule`, with
    /// surrogates built by `fit` (Algorithm 3).
    pub fn new(
        kernel: Box<dyn Kernel>,
        adapter: Box<dyn StepAdapter>,
        p0: AuxDensity,
        schedule: TemperatureSchedule,
        fit: CurveFit,
    ) -> DirectionEngine<Self> {
        DirectionEngine::new(Self { kernel, p0, schedule, fit }, adapter)
    }

    /// The update direction (before step sizes) at `x` for temperature `a`.
    pub fn direction(
        &self,
        target: &dyn LogDensity,
        x: Tensor<2>,
        batch: Option<&Minibatch>,
        a: f64,
        step: Option<usize>,
    ) -> Result<Tensor<2>, InferError> {
        let log_p = log_prob_value(target, x.clone(), batch)?;
        let log_p0 = self.p0.log_value("p0", x.clone())?;
        let log_pt = tempered(log_p0, log_p, a);
        let leave_one_out = self.fit.kind == CurveFitKind::LeaveOneOut;
        let fit = KernelCurveFit::new(
            self.kernel.as_ref(),
            x.clone(),
            log_pt.clone(),
            self.fit.bandwidth_ratio,
            leave_one_out,
        )
        .ok_or_else(gaussian_kernel_needed)?;
        let rho = score(&fit, x.clone(), None)?;
        let mut weights = self_normalized_weights(rho.log_prob, log_pt, step)?;
        if self.fit.truncate_weights {
            weights = truncated_weights(weights);
        }
        Ok(gf_direction(self.kernel.as_ref(), x, Some(rho.grad), weights))
    }
}

impl Direction for AnnealedGfSvgd {
    fn name(&self) -> &'static str {
        "agf-svgd"
    }

    fn init(&mut self, particles: &Particles) -> Result<(), InferError> {
        self.p0.log_value("p0", particles.positions.clone())?;
        if self.fit.kind == CurveFitKind::LeaveOneOut && particles.len() < 2 {
            return Err(InferError::setting("fit", "leave-one-out needs at least 2 particles"));
        }
        let n = particles.len();
        crate::kernels::require_matrices_fit("particles", n, "agf-svgd's n x n kernel matrices", n, n, 4)?;
        let sq = pairwise_sq_dists(particles.positions.clone(), particles.positions.clone());
        self.kernel.eval_proportional(&sq).map(|_| ()).ok_or_else(gaussian_kernel_needed)
    }

    fn ascent(&mut self, ctx: &mut StepContext<'_>, x: Tensor<2>) -> Result<Tensor<2>, InferError> {
        let a = self.schedule.temperature(ctx.step);
        self.direction(ctx.model, x, ctx.batch, a, Some(ctx.step))
    }

    fn report(&self) -> serde_json::Value {
        serde_json::json!({
            "kernel": self.kernel.describe(),
            "p0": self.p0.describe(),
            "schedule": self.schedule.describe(),
            "surrogate": self.fit.describe(),
        })
    }
}

/// `a-svgd`'s options: the annealing path only (the curve-fit options are AGF-SVGD's).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct AnnealedSvgdConfig(pub AnnealedConfig);

impl EngineConfig for AnnealedSvgdConfig {
    fn build(&self, kernel: &KernelConfig, adapter: &AdapterConfig) -> Result<Box<dyn Engine>, InferError> {
        if self.0.sets_curve_fit() {
            return Err(InferError::setting(
                "fit",
                "`fit`, `fit-bandwidth` and `truncate-weights` are options of agf-svgd, not a-svgd",
            ));
        }
        Ok(Box::new(AnnealedSvgd::new(
            self.0.kernel.build(kernel)?,
            adapter.build()?,
            self.0.p0()?,
            self.0.schedule()?,
        )))
    }
}

impl EngineConfig for AnnealedConfig {
    fn build(&self, kernel: &KernelConfig, adapter: &AdapterConfig) -> Result<Box<dyn Engine>, InferError> {
        let (p0, schedule, fit) = (self.p0()?, self.schedule()?, self.curve_fit()?);
        Ok(Box::new(AnnealedGfSvgd::new(self.kernel.build(kernel)?, adapter.build()?, p0, schedule, fit)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fit is `log sum_j v_j exp(-|x_j - y|^2 / (2 (r h)^2))` with the kernel's own `h` and
    /// the ratio `r`, at points away from the anchors too; leave-one-out drops anchor `i` from
    /// row `i` when evaluated at as many points as there are anchors.
    #[test]
    fn curve_fit_smooths_with_the_update_kernel() {
        use parvi_model::tensor_ops::to_vec_f32;
        let device = burn::tensor::Device::flex();
        let points = [[0.0f64, 0.0], [1.0, 2.0], [-1.5, 0.5]];
        let anchors = || Tensor::<2>::from_floats([[0.0, 0.0], [1.0, 2.0], [-1.5, 0.5]], &device);
        let log_values = [0.3f64, -1.2, 0.7];
        let values = || Tensor::<1>::from_floats([0.3, -1.2, 0.7], &device);
        let h = 0.8;
        let kernel = crate::Rbf::fixed(h).unwrap();
        let ys = [[0.5f64, -0.5], [1.0, 2.0], [-3.0, 1.0]];
        let y = || Tensor::<2>::from_floats([[0.5, -0.5], [1.0, 2.0], [-3.0, 1.0]], &device);
        for (ratio, leave_one_out) in [(1.0, false), (0.5, false), (0.5, true)] {
            let fit = KernelCurveFit::new(&kernel, anchors(), values(), ratio, leave_one_out).unwrap();
            let got = to_vec_f32(&fit.log_prob(y(), None));
            let bw = ratio * h;
            for (m, y) in ys.iter().enumerate() {
                let want = (0..3)
                    .filter(|&j| !(leave_one_out && j == m))
                    .map(|j| {
                        let r2 = (points[j][0] - y[0]).powi(2) + (points[j][1] - y[1]).powi(2);
                        (log_values[j] - r2 / (2.0 * bw * bw)).exp()
                    })
                    .sum::<f64>()
                    .ln();
                assert!(
                    (got[m] as f64 - want).abs() < 1e-5,
                    "r {ratio} loo {leave_one_out} at {y:?}: {} vs {want}",
                    got[m]
                );
            }
        }
        // At another number of points the leave-one-out fit is the full fit.
        let full = KernelCurveFit::new(&kernel, anchors(), values(), 1.0, false).unwrap();
        let loo = KernelCurveFit::new(&kernel, anchors(), values(), 1.0, true).unwrap();
        let two = || Tensor::<2>::from_floats([[0.0, 0.0], [2.0, 1.0]], &device);
        assert_eq!(to_vec_f32(&full.log_prob(two(), None)), to_vec_f32(&loo.log_prob(two(), None)));
        assert!(
            KernelCurveFit::new(
                &crate::Imq::new(1.0, -0.5).unwrap(),
                anchors(),
                Tensor::zeros([3], &device),
                1.0,
                false
            )
            .is_none()
        );
    }

    #[test]
    fn curve_fit_options_are_checked() {
        assert!(CurveFit::new(CurveFitKind::Full, 0.0, false).unwrap_err().to_string().contains("fit-bandwidth"));
        assert!(CurveFit::new(CurveFitKind::Full, f64::NAN, false).unwrap_err().to_string().contains("fit-bandwidth"));
        let config = AnnealedConfig { fit_bandwidth: -1.0, ..Default::default() };
        assert!(config.curve_fit().unwrap_err().to_string().contains("fit-bandwidth"));
        assert_eq!(AnnealedConfig::default().curve_fit().unwrap(), CurveFit::default());
        assert!(!AnnealedConfig::default().sets_curve_fit());
        assert!(AnnealedConfig { fit: CurveFitKind::Full, ..Default::default() }.sets_curve_fit());
    }

    #[test]
    fn schedules_end_at_one_and_hold_each_temperature() {
        let lin = TemperatureSchedule::linear(4, 2).unwrap();
        assert_eq!(lin.temperatures(), &[0.25, 0.5, 0.75, 1.0]);
        assert_eq!((lin.temperature(0), lin.temperature(1), lin.temperature(2)), (0.25, 0.25, 0.5));
        assert_eq!((lin.temperature(7), lin.temperature(100)), (1.0, 1.0));
        let geo = TemperatureSchedule::geometric(0.01, 3, 1).unwrap();
        let t = geo.temperatures();
        assert!((t[0] - 0.01).abs() < 1e-12 && (t[1] - 0.1).abs() < 1e-12 && t[2] == 1.0, "{t:?}");
    }
}
