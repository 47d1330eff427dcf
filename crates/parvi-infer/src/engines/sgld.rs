//! Stochastic gradient Langevin dynamics (Welling & Teh 2011) on K parallel chains, and SGLD
//! with repulsion (SGLD+R, Gallego & Rios Insua's poster): the chains share a kernel diffusion
//! matrix, so they repel each other while the product target stays exact.
//!
//! SGLD: `z_i <- z_i + eps_t grad log p(z_i) + N(0, 2 eps_t I)`.
//!
//! SGLD+R: `z <- z + (eps_t / K)(K_t grad + Gamma_t) + eta_t`, `eta_t ~ N(0, 2 eps_t K_t / K)`,
//! the complete-recipe discretisation (Ma, Chen & Fox 2015) with diffusion `D = K_t / K`. `K_t` is
//! block diagonal after a fresh random permutation of the chains each step: blocks of `b` chains
//! with `(K_t)_ij = k(z_j, z_i)` (RBF), and `Gamma_i = sum_j grad_{z_j} k(z_j, z_i)` within the
//! block. When `b` does not divide `K`, the last `K mod b` chains of the permutation form one
//! smaller block (a block of one chain is plain SGLD at step `eps_t / K`).
//!
//! Everything is batched: the blocks are a `[K / b, b, d]` tensor (plus the remainder block), with
//! batched distances, kernel, drift, repulsion and Cholesky factors. One host read per step: the
//! smallest Cholesky pivot, to add jitter (`D + j I` in both drift and noise, still exact since a
//! constant has no divergence) or stop with a clear error instead of silent NaNs.

use burn::tensor::{Device, Int, Tensor, TensorData};
use parvi_model::score;
use parvi_model::tensor_ops::to_vec_f32;
use serde::{Deserialize, Serialize};

use super::EngineConfig;
use crate::error::require_positive;
use crate::evaluation::{Trace, TraceConfig};
use crate::kernels::{Bandwidth, Kernel, Rbf, median_h2};
use crate::{AdapterConfig, KernelConfig};
use crate::{Engine, EngineState, InferError, Particles, Schedule, StepContext};
use parvi_model::linalg::batched_cholesky;

/// Options of `sgld` and `sgld-r`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct SgldConfig {
    /// Step size `eps_t = a (b + t)^-gamma`; `gamma = 0` is a constant step `a`.
    pub a: f64,
    /// Offset `b > 0` of the step count in the step-size decay.
    pub b: f64,
    /// Decay exponent `gamma >= 0` of the step size.
    pub gamma: f64,
    /// Steps discarded before the trace starts; unset, the first half of the stored draws are
    /// the warm-up (as Stan's default), whatever the run's length.
    pub burn_in: Option<usize>,
    /// Steps between stored snapshots.
    pub thin: usize,
    /// Cap on stored draws (snapshots x chains); past it the trace is thinned by two.
    pub max_samples: usize,
    /// SGLD+R only: chains per kernel block [default: all chains].
    pub block_size: Option<usize>,
    /// SGLD+R only: largest jitter added to a kernel block before giving up [default: 1e-2].
    pub max_jitter: Option<f64>,
}

impl Default for SgldConfig {
    fn default() -> Self {
        let trace = TraceConfig::default();
        Self {
            a: 0.1,
            b: 1.0,
            gamma: 0.0,
            burn_in: None,
            thin: trace.thin,
            max_samples: trace.max_samples,
            block_size: None,
            max_jitter: None,
        }
    }
}

/// The injected noise of SGLD+R. Only [`NoiseCovariance::Kernel`] is correct; the other exists so
/// tests can show that the stationarity check detects a wrong noise.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NoiseCovariance {
    /// `N(0, 2 eps K_t / K)`: the diffusion matching the drift.
    #[default]
    Kernel,
    /// `N(0, 2 eps I)` while `K_t / K` stays in the drift: wrong (for tests).
    Identity,
}

/// The block kernel of SGLD+R.
struct Repulsion {
    /// Resolved against the chain count at `init`.
    block_size: Option<usize>,
    /// `None`: median heuristic per step; else a fixed RBF bandwidth `h`.
    bandwidth: Option<f64>,
    max_jitter: f64,
    noise: NoiseCovariance,
    jittered_steps: usize,
    max_jitter_used: f64,
}

/// SGLD on parallel chains, with the kernel-block repulsion of SGLD+R when it has one.
pub struct Sgld {
    a: f64,
    schedule: Schedule,
    repulsion: Option<Repulsion>,
    trace: Trace,
    /// No burn-in was set: the first half of the stored draws are discarded as warm-up.
    warmup_half: bool,
}

impl Sgld {
    /// Plain SGLD; the SGLD+R options are rejected.
    pub fn new(config: &SgldConfig) -> Result<Self, InferError> {
        if config.block_size.is_some() {
            return Err(InferError::setting("block-size", "only `sgld-r` has kernel blocks"));
        }
        if config.max_jitter.is_some() {
            return Err(InferError::setting("max-jitter", "only `sgld-r` has kernel blocks"));
        }
        Self::build(config, None)
    }

    /// SGLD+R with an RBF kernel: median bandwidth (`bandwidth = None`) or a fixed `h`.
    pub fn with_repulsion(config: &SgldConfig, bandwidth: Option<f64>) -> Result<Self, InferError> {
        if config.block_size == Some(0) {
            return Err(InferError::setting("block-size", "must be >= 1, got 0"));
        }
        if let Some(h) = bandwidth {
            require_positive("bandwidth", h)?;
        }
        let max_jitter = config.max_jitter.unwrap_or(1e-2);
        if !(max_jitter >= 0.0 && max_jitter.is_finite()) {
            return Err(InferError::setting("max-jitter", format!("must be finite and >= 0, got {max_jitter}")));
        }
        let repulsion = Repulsion {
            block_size: config.block_size,
            bandwidth,
            max_jitter,
            noise: NoiseCovariance::Kernel,
            jittered_steps: 0,
            max_jitter_used: 0.0,
        };
        Self::build(config, Some(repulsion))
    }

    fn build(config: &SgldConfig, repulsion: Option<Repulsion>) -> Result<Self, InferError> {
        let a = require_positive("a", config.a)?;
        let b = require_positive("b", config.b)?;
        if !(config.gamma >= 0.0 && config.gamma.is_finite()) {
            return Err(InferError::setting("gamma", format!("must be finite and >= 0, got {}", config.gamma)));
        }
        // Schedule::Polynomial is `lr ((b + t) / b)^-gamma`: `lr = a b^-gamma` gives `a (b + t)^-gamma`.
        let (a, schedule) = if config.gamma == 0.0 {
            (a, Schedule::Constant)
        } else {
            (a * b.powf(-config.gamma), Schedule::Polynomial { b, gamma: config.gamma })
        };
        let trace = Trace::new(TraceConfig {
            burn_in: config.burn_in.unwrap_or(0),
            thin: config.thin,
            max_samples: config.max_samples,
        })?;
        Ok(Self { a, schedule, repulsion, trace, warmup_half: config.burn_in.is_none() })
    }

    /// Test hook: the noise covariance of SGLD+R (only `Kernel` is correct).
    #[doc(hidden)]
    pub fn set_noise(&mut self, noise: NoiseCovariance) {
        if let Some(r) = self.repulsion.as_mut() {
            r.noise = noise;
        }
    }

    /// The step size at step `t` (0-based).
    pub fn step_size(&self, t: usize) -> f64 {
        self.schedule.rate(self.a, t)
    }

    /// The stored trace `[snapshots, chains, dim]`, or `None` before the first draw.
    pub fn trace(&self) -> Option<Tensor<3>> {
        self.trace.tensor()
    }

    /// The trace after warm-up: all of it with a set burn-in, else its second half.
    fn kept(&self) -> Option<Tensor<3>> {
        let t = self.trace.tensor()?;
        let [m, k, d] = t.dims();
        if !self.warmup_half || m < 2 {
            return Some(t);
        }
        Some(t.slice([m / 2..m, 0..k, 0..d]))
    }
}

impl Engine for Sgld {
    fn name(&self) -> &'static str {
        if self.repulsion.is_some() { "sgld-r" } else { "sgld" }
    }

    fn init(&mut self, particles: &Particles) -> Result<(), InferError> {
        let k = particles.len();
        if let Some(r) = self.repulsion.as_mut() {
            let b = r.block_size.unwrap_or(k);
            if b == 0 || b > k {
                return Err(InferError::setting(
                    "block-size",
                    format!("must be between 1 and the number of chains ({k}), got {b}"),
                ));
            }
            r.block_size = Some(b);
            // The blocks' kernel matrices, k x b values in all (a few at once).
            crate::kernels::require_matrices_fit(
                "block-size",
                b,
                "sgld-r's b x b kernel blocks over k chains",
                k,
                b,
                4,
            )?;
        }
        self.trace.init(k)
    }

    fn step(&mut self, ctx: &mut StepContext<'_>, particles: &mut Particles) -> Result<(), InferError> {
        let x = particles.positions.clone();
        let [k, d] = x.dims();
        let device = x.device();
        let eps = self.schedule.rate(self.a, ctx.step);
        let grad = score(ctx.model, x.clone(), ctx.batch)?.grad;
        let noise = ctx.rng.normal_tensor(k, d, &device);
        let delta = match self.repulsion.as_mut() {
            None => grad.mul_scalar(eps) + noise.mul_scalar((2.0 * eps).sqrt()),
            Some(r) => {
                let perm = ctx.rng.permutation(k);
                r.delta(x, grad, noise, &perm, eps)?
            }
        };
        particles.positions = particles.positions.clone() + delta;
        self.trace.record(ctx.step + 1, &particles.positions);
        Ok(())
    }

    fn save(&self) -> EngineState {
        let mut state = EngineState::default();
        self.trace.save(&mut state, "trace.");
        if let Some(r) = &self.repulsion {
            state.put_scalar("jittered_steps", r.jittered_steps as f64);
            state.put_scalar("max_jitter_used", r.max_jitter_used);
            if let Some(b) = r.block_size {
                state.put_scalar("block_size", b as f64);
            }
        }
        state
    }

    fn load(&mut self, state: &EngineState, device: &Device) -> Result<(), InferError> {
        self.trace.load(state, "trace.", device)?;
        if let Some(r) = self.repulsion.as_mut() {
            r.jittered_steps = state.scalar("jittered_steps")? as usize;
            r.max_jitter_used = state.scalar("max_jitter_used")?;
            // The block size is resolved against the chain count at init, which a resume skips.
            r.block_size = Some(state.scalar("block_size")? as usize);
        }
        Ok(())
    }

    fn draws(&self) -> Option<Particles> {
        self.kept().map(|t| {
            let [m, k, d] = t.dims();
            Particles::new(t.reshape([m * k, d]))
        })
    }

    fn report(&self) -> serde_json::Value {
        let mut report = serde_json::json!({
            "step_size_first": self.step_size(0),
            "snapshots": self.trace.len(),
            "thin": self.trace.thin(),
        });
        if let Some(r) = &self.repulsion {
            report["block_size"] = serde_json::json!(r.block_size);
            report["kernel"] =
                serde_json::json!(r.bandwidth.map_or("rbf(median)".to_string(), |h| format!("rbf(h={h})")));
            report["jittered_steps"] = serde_json::json!(r.jittered_steps);
            report["max_jitter_used"] = serde_json::json!(r.max_jitter_used);
        }
        if let Some(t) = self.kept() {
            let [m, c, d] = t.dims();
            let values = to_vec_f32(&t);
            if let Ok(view) = crate::evaluation::TraceView::new(&values, m, c, d) {
                let diag = crate::evaluation::TraceDiagnostics::of(&view);
                report["min_ess"] = serde_json::json!(diag.min_ess());
                report["mean_ess"] = serde_json::json!(diag.mean_ess());
                report["max_rhat"] = serde_json::json!(diag.max_rhat());
            }
        }
        report
    }
}

impl Repulsion {
    /// Smallest Cholesky pivot accepted as positive definite, for blocks with unit diagonal in
    /// f32: ten times the rounding error a `b x b` factorisation can accumulate.
    fn pivot_floor(b: usize) -> f64 {
        10.0 * b as f64 * f64::from(f32::EPSILON)
    }

    /// The SGLD+R displacement of all chains `x` `[K, d]` with scores `grad` and standard normal
    /// draws `noise`, blocks taken along the permutation `perm`.
    fn delta(
        &mut self,
        x: Tensor<2>,
        grad: Tensor<2>,
        noise: Tensor<2>,
        perm: &[usize],
        eps: f64,
    ) -> Result<Tensor<2>, InferError> {
        let [k, d] = x.dims();
        let b = self.block_size.unwrap_or(k).min(k);
        let device = x.device();
        let index = |ids: Vec<i64>| Tensor::<1, Int>::from_data(TensorData::new(ids, [k]), &device);
        let forward = index(perm.iter().map(|&i| i as i64).collect());
        let mut inverse = vec![0i64; k];
        for (slot, &chain) in perm.iter().enumerate() {
            inverse[chain] = slot as i64;
        }
        let inverse = index(inverse);
        let (xp, sp, np) = (x.select(0, forward.clone()), grad.select(0, forward.clone()), noise.select(0, forward));

        // Full blocks [K / b, b, d], then the remainder block [1, K mod b, d].
        let full = k / b;
        let mut groups = vec![(0, full, b)];
        if k % b > 0 {
            groups.push((full * b, 1, k % b));
        }
        let split = |t: &Tensor<2>, (start, m, size): (usize, usize, usize)| {
            t.clone().narrow(0, start, m * size).reshape([m, size, d])
        };
        let blocks: Vec<BlockKernel> = groups.iter().map(|&g| BlockKernel::new(split(&xp, g))).collect();
        let kernel = self.kernel_for(&blocks[0].sq, b);
        let evals: Vec<(Tensor<3>, Tensor<3>)> = blocks.iter().map(|blk| blk.eval(kernel.as_ref())).collect();

        // Cholesky with escalating jitter; the drift uses the same jittered matrix.
        let floor = Self::pivot_floor(b);
        let mut jitter = 0.0;
        let factors = loop {
            let mut factors = Vec::with_capacity(evals.len());
            let mut mins = Vec::with_capacity(evals.len());
            for (kmat, _) in &evals {
                let dmat = add_diagonal(kmat.clone(), jitter);
                let (l, min_pivot) = batched_cholesky(dmat.clone());
                factors.push((dmat, l));
                mins.push(min_pivot);
            }
            // The one host read of the step: is every block positive definite?
            let min_pivot = f64::from(to_vec_f32(&Tensor::cat(mins, 0).min())[0]);
            if min_pivot >= floor {
                break factors;
            }
            jitter = if jitter == 0.0 { 10.0 * floor } else { jitter * 10.0 };
            if jitter > self.max_jitter {
                return Err(InferError::Numerical(format!(
                    "sgld-r: a kernel block is not positive definite even with jitter {} (`max-jitter`): \
                     smallest Cholesky pivot {min_pivot:.3e} (chains coincide or are non-finite?)",
                    self.max_jitter
                )));
            }
        };
        if jitter > 0.0 {
            self.jittered_steps += 1;
            self.max_jitter_used = self.max_jitter_used.max(jitter);
        }

        let scale = eps / k as f64;
        let moves: Vec<Tensor<2>> = groups
            .iter()
            .zip(&evals)
            .zip(&factors)
            .map(|((&g, (_, dk)), (dmat, l))| {
                let (xb, sb, nb) = (split(&xp, g), split(&sp, g), split(&np, g));
                let drift = dmat.clone().matmul(sb) + batched_repulsion(dk.clone(), xb);
                let injected = match self.noise {
                    NoiseCovariance::Kernel => l.clone().matmul(nb).mul_scalar((2.0 * scale).sqrt()),
                    NoiseCovariance::Identity => nb.mul_scalar((2.0 * eps).sqrt()),
                };
                let (_, m, size) = g;
                (drift.mul_scalar(scale) + injected).reshape([m * size, d])
            })
            .collect();
        Ok(Tensor::cat(moves, 0).select(0, inverse))
    }

    /// The step's RBF kernel: the fixed bandwidth, or the median heuristic over the full blocks'
    /// squared distances `h^2 = med / (2 log(b + 1))` (for `b = K`, SVGD's kernel exactly).
    fn kernel_for(&self, sq: &Tensor<3>, b: usize) -> Box<dyn Kernel> {
        match self.bandwidth {
            Some(h) => Box::new(Rbf { bandwidth: Bandwidth::Fixed(h) }),
            None => {
                let h = median_h2(sq, b).reshape([1]).sqrt();
                Box::new(Rbf { bandwidth: Bandwidth::Tensor(Box::new(h)) })
            }
        }
    }
}

/// Squared distances within each block.
struct BlockKernel {
    /// `[m, b, b]`
    sq: Tensor<3>,
}

impl BlockKernel {
    fn new(x: Tensor<3>) -> Self {
        let norms = x.clone().square().sum_dim(2); // [m, b, 1]
        let gram = x.clone().matmul(x.swap_dims(1, 2));
        let sq = (norms.clone() + norms.swap_dims(1, 2) - gram.mul_scalar(2.0)).clamp_min(0.0);
        Self { sq }
    }

    /// `(k, f')` of the radial kernel on every block, `[m, b, b]` each.
    fn eval(&self, kernel: &dyn Kernel) -> (Tensor<3>, Tensor<3>) {
        let [m, b, _] = self.sq.dims();
        let eval = kernel.eval(&self.sq.clone().reshape([m * b, b]), false);
        (eval.k.reshape([m, b, b]), eval.dk.reshape([m, b, b]))
    }
}

/// `a + j I` on every matrix of a batch.
fn add_diagonal(a: Tensor<3>, j: f64) -> Tensor<3> {
    if j == 0.0 {
        return a;
    }
    let n = a.dims()[1];
    let eye = Tensor::<2>::eye(n, &a.device()).mul_scalar(j).unsqueeze::<3>();
    a + eye
}

/// The batched form of [`crate::kernels::repulsion_from`] within blocks (`dk` `[m, b, b]` indexed
/// `[source j, target i]`): `Gamma_i = sum_j grad_{x_j} k(x_j, x_i) = 2 (sum_j f'_ji x_j - x_i
/// sum_j f'_ji)`, `[m, b, d]`.
pub fn batched_repulsion(dk: Tensor<3>, x: Tensor<3>) -> Tensor<3> {
    let col = dk.clone().sum_dim(1).swap_dims(1, 2); // [m, b, 1]
    (dk.swap_dims(1, 2).matmul(x.clone()) - x * col).mul_scalar(2.0)
}

/// Langevin engines take their step size from their own `a`, `b`, `gamma`: the shared step-size
/// rule does not apply, nor does the kernel to `sgld`.
impl EngineConfig for SgldConfig {
    fn build(&self, _kernel: &KernelConfig, _adapter: &AdapterConfig) -> Result<Box<dyn Engine>, InferError> {
        Ok(Box::new(Sgld::new(self)?))
    }

    fn uses_step_rule(&self) -> bool {
        false
    }
}

/// `sgld-r`'s options: SGLD's, with kernel repulsion between the chains (an RBF kernel, median
/// or fixed bandwidth).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RepulsiveSgldConfig(pub SgldConfig);

impl EngineConfig for RepulsiveSgldConfig {
    fn uses_step_rule(&self) -> bool {
        false
    }

    fn build(&self, kernel: &KernelConfig, _adapter: &AdapterConfig) -> Result<Box<dyn Engine>, InferError> {
        match kernel {
            KernelConfig::Rbf { bandwidth } => Ok(Box::new(Sgld::with_repulsion(&self.0, *bandwidth)?)),
            KernelConfig::Imq { .. } => {
                Err(InferError::setting("kernel", "sgld-r uses the RBF kernel (median or a fixed bandwidth)"))
            }
            KernelConfig::RbfLinear { .. } => Err(InferError::setting(
                "kernel",
                "sgld-r cannot use the moment-matching kernel `rbf-linear`: its repulsion is the plain RBF's",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::repulsion_from;
    use parvi_model::tensor_ops::{matrix_from_vec, pairwise_sq_dists};

    #[test]
    fn batched_repulsion_matches_the_stein_core() {
        let device = parvi_model::BackendKind::Flex.device().unwrap();
        let values: Vec<f32> = (0..12).map(|i| ((i * 5 % 7) as f32 - 3.0) / 2.0).collect();
        let x = matrix_from_vec(values, 4, 3, &device);
        let eval = Rbf::median().eval(&pairwise_sq_dists(x.clone(), x.clone()), false);
        let reference = repulsion_from(eval.dk.clone(), x.clone(), x.clone());
        let batched = batched_repulsion(eval.dk.unsqueeze::<3>(), x.unsqueeze::<3>()).reshape([4, 3]);
        for (a, b) in to_vec_f32(&reference).iter().zip(to_vec_f32(&batched)) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
    }

    #[test]
    fn step_sizes_follow_a_b_plus_t_to_the_minus_gamma() {
        let config = SgldConfig { a: 0.5, b: 10.0, gamma: 0.55, ..Default::default() };
        let sgld = Sgld::new(&config).unwrap();
        for t in [0, 1, 99] {
            let expected = 0.5 * (10.0 + t as f64).powf(-0.55);
            assert!((sgld.step_size(t) - expected).abs() < 1e-12 * expected.max(1.0));
        }
        let constant = Sgld::new(&SgldConfig { a: 0.02, ..Default::default() }).unwrap();
        assert_eq!(constant.step_size(1000), 0.02);
    }
}
