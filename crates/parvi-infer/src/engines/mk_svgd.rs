//! Multiple-kernel SVGD (Ai, Liu, He & Xu, "Stein Variational Gradient Descent with Multiple
//! Kernel", Algorithm 1): particles move along `phi_w = sum_i w_i phi_i` (Eq. 19), the SVGD
//! direction of the multi-kernel `k_w = sum_i w_i k_i` ([`MultiKernel`]); after each move the
//! weights become `w_i = sqrt(S_i / sum_j S_j)` (Eq. 21, the maximiser of the multiple-kernel
//! Stein discrepancy `sum_i w_i S_i` over `w >= 0`, `||w||_2 = 1` when `S_i = ||phi_i||`), with
//! `S_i` the squared KSD of kernel `i` on the moved particles. No extra hyperparameter: only the
//! bandwidth grid.
//!
//! Following Algorithm 1: the first move uses `w_i = 1/m`, and each later move uses the weights
//! of the particles it starts from (their `S_i` need those particles' scores, which the move
//! computes anyway, so the weight update costs no model evaluation).
//!
//! `S_i` is by default the V-statistic `||phi_i||^2`; `statistic = u` takes the U-statistic, the
//! unbiased estimate of Eq. 14's `E_{x, x' ~ q} u_i(x, x')` for i.i.d. draws. Neither reproduces
//! the paper's Fig. 1(b) (weight on `h = 1` and `2` on its 2-D Gaussian): the V-statistic's
//! diagonal adds `d / (n h_rbf^2)`, which grows as the bandwidth shrinks and puts the largest
//! weight on the smallest `h`; SVGD's particles are spread more evenly than i.i.d. draws, so the
//! U-statistic of every kernel turns negative once they converge and the weights freeze wherever
//! the last positive `S_i` left them (mostly on the largest `h`). The V-statistic reproduces the
//! paper's particle mean; the U-statistic misses it by about 0.01 (`docs/experiments.md`).
//!
//! Bandwidth options are the paper's `h` in `exp(-||x - x'||^2 / h)`; the kernels themselves use
//! the crate's RBF convention `exp(-||x - x'||^2 / (2 h_rbf^2))` with `h_rbf = sqrt(h / 2)`
//! (see [`MultiKernel`]).

use burn::tensor::Device;
use parvi_model::score;
use parvi_model::tensor_ops::{all_finite, pairwise_sq_dists, to_vec_f64};
use serde::{Deserialize, Serialize};

use super::EngineConfig;
use crate::evaluation::Statistic;
use crate::kernels::{MultiKernel, validate_scales};
use crate::kernels::{linear_direction, stein_direction};
use crate::{AdapterConfig, KernelConfig};
use crate::{Engine, EngineState, InferError, Particles, StepAdapter, StepContext};

/// The paper's default grid `h = 2^-4 ... 2^5`.
pub const DEFAULT_LOG2_MIN: i32 = -4;
/// Upper end of the paper's default grid: `h = 2^5`.
pub const DEFAULT_LOG2_MAX: i32 = 5;
/// `h = 2^±58` keeps `h_rbf = sqrt(h / 2)` inside the multi-kernel's `f32`-safe range.
const LOG2_LIMIT: i32 = 58;
/// The paper's `h` whose `h_rbf = sqrt(h / 2)` is inside [`MultiKernel`]'s range.
const MIN_PAPERS_H: f64 = 2e-18;
const MAX_PAPERS_H: f64 = 2e18;

/// MK-SVGD's options (`--opt log2-min=2 --opt log2-max=11`, or `--opt bandwidths=[0.5, 1, 2]`,
/// `--opt statistic=v`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct MkSvgdConfig {
    /// Smallest bandwidth `2^log2-min` of the grid `h = 2^log2-min, ..., 2^log2-max` [default: -4].
    pub log2_min: Option<i32>,
    /// Largest bandwidth `2^log2-max` [default: 5].
    pub log2_max: Option<i32>,
    /// An explicit bandwidth list (the paper's `h` in `exp(-r^2 / h)`), instead of the grid.
    pub bandwidths: Option<Vec<f64>>,
    /// The estimate of each kernel's `S_i`: `v` (`||phi_i||^2`, default) or `u` (unbiased for
    /// i.i.d. particles; negative for converged SVGD particles, which then freezes the weights).
    pub statistic: Statistic,
    /// Use each step's `S_i` for the next move instead of this one (weights one step late, for
    /// comparison with Algorithm 1's order).
    pub lagged_weights: bool,
}

impl Default for MkSvgdConfig {
    fn default() -> Self {
        Self { log2_min: None, log2_max: None, bandwidths: None, statistic: Statistic::V, lagged_weights: false }
    }
}

impl MkSvgdConfig {
    /// The base kernels' bandwidths, the paper's `h_i` in `exp(-r^2 / h_i)`, validated.
    pub fn bandwidths(&self) -> Result<Vec<f64>, InferError> {
        if let Some(list) = &self.bandwidths {
            if self.log2_min.is_some() || self.log2_max.is_some() {
                return Err(InferError::setting(
                    "bandwidths",
                    "give either an explicit `bandwidths` list or the `log2-min`/`log2-max` grid, not both",
                ));
            }
            validate_scales("bandwidths", list, MIN_PAPERS_H, MAX_PAPERS_H)?;
            return Ok(list.clone());
        }
        let lo = self.log2_min.unwrap_or(DEFAULT_LOG2_MIN);
        let hi = self.log2_max.unwrap_or(DEFAULT_LOG2_MAX);
        for (name, e) in [("log2-min", lo), ("log2-max", hi)] {
            if e.abs() > LOG2_LIMIT {
                return Err(InferError::setting(name, format!("must be within -{LOG2_LIMIT}..={LOG2_LIMIT}, got {e}")));
            }
        }
        if lo > hi {
            return Err(InferError::setting("log2-min", format!("must be <= log2-max ({hi}), got {lo}")));
        }
        Ok((lo..=hi).map(|e| 2f64.powi(e)).collect())
    }
}

/// The paper's `h` in `exp(-r^2 / h)` as the crate's RBF bandwidth: `sqrt(h / 2)`.
pub fn rbf_bandwidth_of_papers_h(h: f64) -> f64 {
    (h / 2.0).sqrt()
}

/// `w_i = sqrt(S_i / sum_j S_j)` from the base kernels' discrepancies at 0-based `step`, or
/// `None` when no `S_i` is positive.
///
/// The V-statistic is `>= 0` in exact arithmetic; the U-statistic is unbiased for i.i.d. draws of
/// `q`, and SVGD's particles, spread more evenly than such draws, make it negative for kernels
/// that see no discrepancy (for every kernel once the particles have converged). A negative value
/// gets weight 0 (Eq. 21 needs `S_i >= 0`); when none is positive no kernel shows a discrepancy
/// to weight by, and the weights stay as they are. Non-finite discrepancies are an error naming
/// the step.
pub fn kernel_weights(ksd: &[f64], step: usize) -> Result<Option<Vec<f64>>, InferError> {
    if ksd.iter().any(|s| !s.is_finite()) {
        return Err(InferError::Numerical(format!(
            "mk-svgd weight update at step {step}: the kernel Stein discrepancies are not finite: {ksd:?}"
        )));
    }
    let clamped: Vec<f64> = ksd.iter().map(|s| s.max(0.0)).collect();
    let total: f64 = clamped.iter().sum();
    if total <= 0.0 {
        return Ok(None);
    }
    Ok(Some(clamped.iter().map(|s| (s / total).sqrt()).collect()))
}

/// MK-SVGD: SVGD along the weighted multi-kernel direction (the paper's Eq. 19), reweighting the
/// kernels at each step (Eq. 21).
pub struct MkSvgd {
    /// The paper's `h_i`.
    bandwidths: Vec<f64>,
    statistic: Statistic,
    lagged: bool,
    /// Built on the particles' device at `init` (or `load`).
    kernel: Option<MultiKernel>,
    adapter: Box<dyn StepAdapter>,
    /// Whether the particles have moved since `init`: the first move uses Algorithm 1's `1/m`.
    moved: bool,
    /// `S_i` of the last weight update, for the report.
    last_ksd: Option<Vec<f64>>,
    /// Whether the direction adds the linear features' part (the moment-matching kernel).
    linear: bool,
}

impl MkSvgd {
    /// MK-SVGD over the bandwidths of `config`, moving by `adapter`.
    pub fn new(config: &MkSvgdConfig, adapter: Box<dyn StepAdapter>) -> Result<Self, InferError> {
        Ok(Self {
            bandwidths: config.bandwidths()?,
            statistic: config.statistic,
            lagged: config.lagged_weights,
            kernel: None,
            adapter,
            moved: false,
            last_ksd: None,
            linear: false,
        })
    }

    /// This engine with linear features `x^T y / d + 1` added to its multi-kernel with weight 1
    /// (Liu & Wang 2018's moment matching, [`crate::kernels::MomentMatching`]); the kernel
    /// weights are still learned over the radial kernels only.
    pub fn with_linear_features(mut self) -> Self {
        self.linear = true;
        self
    }

    /// The bandwidths, the paper's `h_i` in `exp(-r^2 / h_i)`.
    pub fn bandwidths(&self) -> &[f64] {
        &self.bandwidths
    }

    /// The bandwidths in the crate's RBF convention, `h_rbf = sqrt(h / 2)`.
    pub fn rbf_bandwidths(&self) -> Vec<f64> {
        self.bandwidths.iter().map(|&h| rbf_bandwidth_of_papers_h(h)).collect()
    }

    /// Algorithm 1's first weights, `1/m` for `m` kernels.
    fn initial_weights(&self) -> Vec<f64> {
        vec![1.0 / self.bandwidths.len() as f64; self.bandwidths.len()]
    }

    /// The current kernel weights (Algorithm 1's `1/m` before the first update). A host read.
    pub fn weights(&self) -> Vec<f64> {
        match &self.kernel {
            Some(k) => to_vec_f64(k.weights()),
            None => self.initial_weights(),
        }
    }

    /// `S_i` (the squared KSD of each base kernel, U- or V-statistic) of the last weight update.
    pub fn discrepancies(&self) -> Option<&[f64]> {
        self.last_ksd.as_deref()
    }

    fn fresh_kernel(&self, device: &Device) -> Result<MultiKernel, InferError> {
        MultiKernel::with_host_weights(&self.rbf_bandwidths(), &self.initial_weights(), device)
    }

    /// Eq. 21 from the discrepancies `ksd` `[K]` (one host read of `K` values: a zero sum must
    /// leave the weights alone and a non-finite one stop the run with a named error, rather than
    /// turn the weights, and then every particle, into NaN; the run loop reads back every step
    /// anyway for its divergence guard). Non-finite discrepancies from non-finite scores keep the weights: the
    /// move is then non-finite too, and the run loop's guard stops with its diagnosis and the
    /// last finite particles.
    fn update_weights(
        &mut self,
        ksd: burn::tensor::Tensor<1>,
        scores: &burn::tensor::Tensor<2>,
        step: usize,
    ) -> Result<(), InferError> {
        let ksd: Vec<f64> = to_vec_f64(&ksd);
        match kernel_weights(&ksd, step) {
            Ok(Some(weights)) => self.kernel.as_mut().expect("built before the update").set_weights(&weights)?,
            Ok(None) => {}
            Err(_) if !all_finite(scores) => return Ok(()),
            Err(e) => return Err(e),
        }
        self.last_ksd = Some(ksd);
        Ok(())
    }
}

impl Engine for MkSvgd {
    fn name(&self) -> &'static str {
        "mk-svgd"
    }

    fn init(&mut self, particles: &Particles) -> Result<(), InferError> {
        // Every base kernel's n x n profiles and the Stein kernel bases (refused here, not at an
        // allocation abort in the first step).
        let n = particles.len();
        let copies = 3 * self.bandwidths.len() + 6;
        crate::kernels::require_matrices_fit("particles", n, "mk-svgd's n x n kernel matrices", n, n, copies)?;
        self.kernel = Some(self.fresh_kernel(&particles.device())?);
        self.moved = false;
        self.last_ksd = None;
        Ok(())
    }

    fn step(&mut self, ctx: &mut StepContext<'_>, particles: &mut Particles) -> Result<(), InferError> {
        let x = particles.positions.clone();
        let s = score(ctx.model, x.clone(), ctx.batch)?.grad;
        if self.kernel.is_none() {
            self.kernel = Some(self.fresh_kernel(&particles.device())?);
        }
        let unbiased = self.statistic == Statistic::U;
        // One distance matrix and one batched [K, n^2] profile evaluation serve both the move and
        // the weight update.
        let sq = pairwise_sq_dists(x.clone(), x.clone());
        let base = self.kernel.as_ref().expect("built above").base_profiles(&sq);
        let ksd = |kernel: &MultiKernel| kernel.base_ksd_squared(&base, &sq, x.clone(), s.clone(), unbiased);
        // Algorithm 1 updates the weights after each move, from the moved particles: that is
        // this step's particles, before this step's move (none before the first move).
        if self.moved && !self.lagged {
            let current = ksd(self.kernel.as_ref().expect("built above"));
            self.update_weights(current, &s, ctx.step)?;
        }
        let kernel = self.kernel.as_ref().expect("built above");
        let lagged = self.lagged.then(|| ksd(kernel));
        let mut phi = stein_direction(&kernel.combine(&base, false), x.clone(), s.clone(), x.clone(), None);
        if self.linear {
            phi = phi + linear_direction(x.clone(), s.clone(), x.clone(), None);
        }
        particles.positions = x.clone() + self.adapter.delta(phi);
        self.moved = true;
        if let Some(lagged) = lagged {
            self.update_weights(lagged, &s, ctx.step)?;
        }
        Ok(())
    }

    fn save(&self) -> EngineState {
        let mut state = EngineState::default();
        self.adapter.save(&mut state, "adapter.");
        if let Some(kernel) = &self.kernel {
            state.put_tensor("kernel.weights", kernel.weights());
        }
        state.put_scalar("kernel.moved", if self.moved { 1.0 } else { 0.0 });
        if let (Some(ksd), Some(kernel)) = (&self.last_ksd, &self.kernel) {
            // For the report only: the next weight update recomputes S_i from the particles.
            let values: Vec<f32> = ksd.iter().map(|&v| v as f32).collect();
            let len = values.len();
            let ksd = burn::tensor::Tensor::<1>::from_data(
                burn::tensor::TensorData::new(values, [len]),
                &kernel.weights().device(),
            );
            state.put_tensor("kernel.ksd", &ksd);
        }
        state
    }

    fn load(&mut self, state: &EngineState, device: &Device) -> Result<(), InferError> {
        self.adapter.load(state, "adapter.", device)?;
        let weights = state.tensor::<1>("kernel.weights", device)?;
        let [k] = weights.dims();
        if k != self.bandwidths.len() {
            return Err(InferError::State(format!(
                "kernel.weights: the checkpoint has {k} kernel weights but {} bandwidths are configured",
                self.bandwidths.len()
            )));
        }
        self.kernel = Some(
            MultiKernel::with_weights(&self.rbf_bandwidths(), weights)
                .map_err(|e| InferError::State(format!("kernel.weights: {e}")))?,
        );
        self.moved = state.scalar("kernel.moved")? != 0.0;
        let ksd = state.tensor_opt::<1>("kernel.ksd", device)?.map(|t| to_vec_f64(&t));
        self.last_ksd = ksd.filter(|v| v.len() == k);
        Ok(())
    }

    fn report(&self) -> serde_json::Value {
        serde_json::json!({
            "kernel": describe_papers_grid(&self.bandwidths),
            "bandwidth_form": "exp(-|x - x'|^2 / h), h = 2 h_rbf^2",
            "bandwidths": self.bandwidths,
            "rbf_bandwidths": self.rbf_bandwidths(),
            "statistic": self.statistic,
            "lagged_weights": self.lagged,
            "weights": self.weights(),
            "ksd": self.last_ksd,
            "linear_features": self.linear,
        })
    }
}

/// A short description of the paper's grid: `multi-rbf(h=2^-4..2^5)` for a run of powers of two,
/// else the list (`h` the paper's, in `exp(-r^2 / h)`).
pub fn describe_papers_grid(bandwidths: &[f64]) -> String {
    let exps: Vec<Option<i32>> = bandwidths
        .iter()
        .map(|h| {
            let e = h.log2().round();
            (2f64.powf(e) == *h).then_some(e as i32)
        })
        .collect();
    let consecutive =
        exps.iter().all(Option::is_some) && exps.windows(2).all(|p| p[0].zip(p[1]).is_some_and(|(a, b)| b == a + 1));
    match (consecutive, exps.first().copied().flatten(), exps.last().copied().flatten()) {
        (true, Some(a), Some(b)) if bandwidths.len() > 1 => format!("multi-rbf(h=2^{a}..2^{b})"),
        _ => format!("multi-rbf(h={bandwidths:?})"),
    }
}

/// Its kernels are its own grid of bandwidths: a single shared kernel has no place, except the
/// moment-matching kernel with the median rule (`rbf-linear`), which adds the linear features to
/// the grid's kernels.
impl EngineConfig for MkSvgdConfig {
    fn build(&self, kernel: &KernelConfig, adapter: &AdapterConfig) -> Result<Box<dyn Engine>, InferError> {
        let engine = MkSvgd::new(self, adapter.build()?)?;
        match kernel {
            KernelConfig::Rbf { bandwidth: None } => Ok(Box::new(engine)),
            KernelConfig::RbfLinear { bandwidth: None } => Ok(Box::new(engine.with_linear_features())),
            _ => Err(InferError::setting(
                "kernel",
                "mk-svgd sets its own kernels: give its `bandwidths` or `log2-min`/`log2-max` options instead \
                 (`rbf-linear` without a bandwidth adds the linear features to them)",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_grid_is_the_papers() {
        let h = MkSvgdConfig::default().bandwidths().unwrap();
        assert_eq!(h.len(), 10);
        assert_eq!((h[0], h[9]), (0.0625, 32.0));
        let blr = MkSvgdConfig { log2_min: Some(2), log2_max: Some(11), ..Default::default() };
        assert_eq!(blr.bandwidths().unwrap(), (2..=11).map(|e| 2f64.powi(e)).collect::<Vec<_>>());
    }

    #[test]
    fn bad_options_are_named() {
        let err = |c: MkSvgdConfig| c.bandwidths().unwrap_err().to_string();
        assert!(err(MkSvgdConfig { bandwidths: Some(vec![]), ..Default::default() }).contains("empty"));
        assert!(err(MkSvgdConfig { bandwidths: Some(vec![1.0, -1.0]), ..Default::default() }).contains("> 0"));
        assert!(
            err(MkSvgdConfig { log2_min: Some(3), log2_max: Some(2), ..Default::default() }).contains("`log2-min`")
        );
        assert!(err(MkSvgdConfig { log2_max: Some(500), ..Default::default() }).contains("`log2-max`"));
        let both = MkSvgdConfig { bandwidths: Some(vec![1.0]), log2_min: Some(0), ..Default::default() };
        assert!(err(both).contains("not both"));
    }

    #[test]
    fn weights_follow_eq_21_and_none_positive_keeps_them() {
        let w = kernel_weights(&[1.0, 3.0, 0.0, -1e-9], 4).unwrap().unwrap();
        let want = [0.5, 3f64.sqrt() / 2.0, 0.0, 0.0];
        assert!(w.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-12), "{w:?}");
        assert!((w.iter().map(|v| v * v).sum::<f64>() - 1.0).abs() < 1e-12);
        assert_eq!(kernel_weights(&[0.0, -1e-12, -0.3], 17).unwrap(), None);
        let err = kernel_weights(&[1.0, f64::NAN], 3).unwrap_err();
        assert!(matches!(err, InferError::Numerical(_)));
        let msg = err.to_string();
        assert!(msg.contains("step 3") && msg.contains("not finite"), "{msg}");
    }
}
