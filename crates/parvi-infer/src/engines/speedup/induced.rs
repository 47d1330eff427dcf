//! Induced-point SVGD (Kang, "Speedup Methods for SVGD", Algorithms 4 and 5).
//!
//! With `m` induced points `y_j`, the induced kernel `k_y(x, x') = (1/m) sum_j k(x, y_j)
//! k(x', y_j)` gives the SVGD direction (Kang's Lemma 3.1)
//!
//! `phi(x) = (1/m) sum_j g_j k(x, y_j)`, `g_j = (1/n) sum_i A_p k(x_i, y_j)`,
//!
//! with `A_p k(x_i, y_j) = k(x_i, y_j) grad log p(x_i) + grad_{x_i} k(x_i, y_j)`: two `[n, m]`
//! kernel products, `O(n m d)` per step. Its kernel Stein discrepancy is
//! `KSD = (1/m) sum_j ||g_j||^2` (V-statistic), also `O(n m d)`.
//!
//! - [`RandomInduced`] draws the induced points from the particles at every step; a median-rule
//!   kernel takes the whole particle set's rule, as SVGD (`n` in the log term, the median over
//!   all pairs of particles, estimated from a bounded random sample of pairs for large `n`).
//! - [`AdversarialInduced`] keeps them, and the RBF bandwidth `h`, across steps and moves them to
//!   *increase* the KSD ([`InducedPoints::ascent_step`], gradients from burn's autodiff with the
//!   scores held fixed): a larger KSD means a larger KL decrease for the particle step.

use burn::tensor::{Device, Tensor};
use parvi_model::tensor_ops::pairwise_sq_dists;
use parvi_model::{ModelError, score, value_and_grad2};
use serde::{Deserialize, Serialize};

use crate::KernelConfig;
use crate::core::{Direction, DirectionEngine};
use crate::core::{check_subset_size, random_rows, select_rows};
use crate::engines::EngineConfig;
use crate::error::require_positive;
use crate::evaluation::Statistic;
use crate::kernels::median_bandwidth;
use crate::kernels::stein_direction;

use super::full_set_kernel;
use crate::{
    AdapterConfig, Bandwidth, Engine, EngineRng, EngineState, InferError, Kernel, Particles, Rbf, StepAdapter,
    StepContext,
};

/// `g_j = (1/n) sum_i A_p k(x_i, y_j)`, `[m, d]`, and the kernel matrix `k(x_i, y_j)` `[n, m]`.
fn stein_means(kernel: &dyn Kernel, x: Tensor<2>, score: Tensor<2>, y: Tensor<2>) -> (Tensor<2>, Tensor<2>) {
    let sq = pairwise_sq_dists(x.clone(), y.clone()); // [n, m]
    let eval = kernel.eval(&sq, false);
    let k = eval.k.clone();
    (stein_direction(&eval, x, score, y, None), k)
}

/// The induced-kernel SVGD direction at the particles `x` `[n, d]` with scores `score`, for
/// induced points `y` `[m, d]`: `phi(x) = (1/m) sum_j g_j k(x, y_j)`.
pub fn induced_direction(kernel: &dyn Kernel, x: Tensor<2>, score: Tensor<2>, y: Tensor<2>) -> Tensor<2> {
    let m = y.dims()[0];
    let (g, k) = stein_means(kernel, x, score, y);
    k.matmul(g).div_scalar(m as f64)
}

/// The squared KSD of particles `x` with scores `score` under the induced kernel of `y`, `[1]`:
///
/// - V: `(1/m) sum_j ||(1/n) sum_i a_ij||^2`,
/// - U: `(1/m) sum_j sum_{i != i'} a_ij . a_i'j / (n (n - 1))`
///   `= (1/m) sum_j (||sum_i a_ij||^2 - sum_i ||a_ij||^2) / (n (n - 1))`,
///
/// `a_ij = A_p k(x_i, y_j) = k_ij s_i + 2 f'_ij (x_i - y_j)` for a radial `k = f(r^2)`. Built
/// from tensor operations only, so autodiff gives its gradient with respect to `y` and to a
/// [`Bandwidth::Tensor`] bandwidth. `O(n m d)`.
pub fn induced_ksd(kernel: &dyn Kernel, x: Tensor<2>, score: Tensor<2>, y: Tensor<2>, stat: Statistic) -> Tensor<1> {
    let [n, _] = x.dims();
    let m = y.dims()[0];
    match stat {
        Statistic::V => {
            let (g, _) = stein_means(kernel, x, score, y);
            g.square().sum().div_scalar(m as f64)
        }
        Statistic::U => {
            let sq = pairwise_sq_dists(x.clone(), y.clone()); // [n, m]
            let eval = kernel.eval(&sq, false);
            let (k, dk) = (eval.k.clone(), eval.dk.clone());
            let g = stein_direction(&eval, x.clone(), score.clone(), y.clone(), None); // (1/n) sum_i a_ij
            let full = g.square().sum().mul_scalar((n * n) as f64);
            // sum_ij ||a_ij||^2 = sum_ij k^2 |s_i|^2 + 4 k f' s_i.(x_i - y_j) + 4 f'^2 r_ij^2
            let s_norm = score.clone().square().sum_dim(1); // [n, 1]
            let s_dot_x = (score.clone() * x).sum_dim(1); // [n, 1]
            let s_dot_y = score.matmul(y.transpose()); // [n, m]
            let diag = (k.clone().square() * s_norm
                + (k * dk.clone() * (s_dot_x - s_dot_y)).mul_scalar(4.0)
                + (dk.square() * sq).mul_scalar(4.0))
            .sum();
            (full - diag).div_scalar((m * n * (n - 1)) as f64)
        }
    }
}

/// The regulariser `(1/(2m)) sum_{j, j'} k(y_j, y_j')`: its negative gradient with respect to
/// `y_j` is Kang's repulsion `-(1/m) sum_j' grad_{y_j} k(y_j, y_j')` (eq. 16).
pub fn induced_point_crowding(kernel: &dyn Kernel, y: Tensor<2>) -> Tensor<1> {
    let m = y.dims()[0];
    let k = kernel.eval(&pairwise_sq_dists(y.clone(), y), false).k;
    k.sum().div_scalar(2.0 * m as f64)
}

/// Options of `svgd-induced`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct InducedConfig {
    /// Induced points per step, drawn from the particles (`1 <= m <= n`).
    pub m: usize,
}

impl Default for InducedConfig {
    fn default() -> Self {
        Self { m: 10 }
    }
}

/// Random induced points SVGD (Algorithm 4): `y` drawn from the particles at every step.
pub struct RandomInduced {
    kernel: Box<dyn Kernel>,
    m: usize,
    /// The median-rule bandwidth `h` of the last step, for the report.
    last_h: Option<f64>,
}

impl RandomInduced {
    /// Random induced points SVGD with `config.m` points, moving by `kernel` and `adapter`.
    pub fn new(
        config: &InducedConfig,
        kernel: Box<dyn Kernel>,
        adapter: Box<dyn StepAdapter>,
    ) -> Result<DirectionEngine<Self>, InferError> {
        if config.m == 0 {
            return Err(InferError::setting("m", "must be >= 1, got 0"));
        }
        Ok(DirectionEngine::new(Self { kernel, m: config.m, last_h: None }, adapter))
    }
}

impl Direction for RandomInduced {
    fn name(&self) -> &'static str {
        "svgd-induced"
    }

    fn init(&mut self, particles: &Particles) -> Result<(), InferError> {
        check_subset_size("m", self.m, particles.len())
    }

    fn ascent(&mut self, ctx: &mut StepContext<'_>, x: Tensor<2>) -> Result<Tensor<2>, InferError> {
        check_subset_size("m", self.m, x.dims()[0])?;
        let y = random_rows(&x, self.m, ctx.rng);
        let s = score(ctx.model, x.clone(), ctx.batch)?.grad;
        // The whole set's median rule, as SVGD (see `full_set_kernel`).
        let (resolved, h) = full_set_kernel(self.kernel.as_ref(), &x, Some(ctx.rng));
        self.last_h = h;
        Ok(induced_direction(resolved.as_deref().unwrap_or(self.kernel.as_ref()), x, s, y))
    }

    fn report(&self) -> serde_json::Value {
        serde_json::json!({ "kernel": self.kernel.describe(), "m": self.m, "h": self.last_h })
    }
}

/// Options of `svgd-adversarial`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct AdversarialConfig {
    /// Induced points (`1 <= m <= n`); also the particle subset size of `ascent-subset`.
    pub m: usize,
    /// `L`: ascent steps on the KSD per particle step (`>= 1`).
    #[serde(alias = "L", alias = "l")]
    pub ascent_steps: usize,
    /// Repulsion regulariser `alpha >= 0` that keeps the induced points apart (Kang's eq. 16).
    pub alpha: f64,
    /// AdaGrad step size of the ascent on the induced points.
    pub lr_y: f64,
    /// AdaGrad step size of the ascent on `log h` (a relative change of the bandwidth).
    pub lr_h: f64,
    /// Ascend the U-statistic KSD (pairs `x != x'`) instead of the V-statistic.
    pub u_statistic: bool,
    /// Each ascent step uses a fresh random subset of `m` particles: `O(m^2 d)` per ascent
    /// step instead of `O(n m d)`.
    pub ascent_subset: bool,
    /// Move the induced points.
    pub learn_y: bool,
    /// Move the bandwidth.
    pub learn_h: bool,
    /// Initial bandwidth `h`; default: the median heuristic on the initial particles.
    pub h0: Option<f64>,
}

impl Default for AdversarialConfig {
    fn default() -> Self {
        Self {
            m: 10,
            ascent_steps: 1,
            alpha: 0.0,
            // Small: AdaGrad moves every coordinate by about `lr` per ascent step whatever the
            // gradient's size, and faster induced points run away from the particles (on the
            // 2-D Gaussian, 3 x 1e-2 per particle step collapsed h and biased the mean).
            lr_y: 1e-3,
            lr_h: 1e-3,
            u_statistic: false,
            ascent_subset: false,
            learn_y: true,
            learn_h: true,
            h0: None,
        }
    }
}

impl AdversarialConfig {
    /// Checks the options and their combinations (`m <= n` waits for the particles).
    pub fn validate(&self) -> Result<(), InferError> {
        if self.m == 0 {
            return Err(InferError::setting("m", "must be >= 1, got 0"));
        }
        if self.ascent_steps == 0 {
            return Err(InferError::setting(
                "ascent-steps",
                "adversarial induced points need L >= 1 ascent steps, got 0 (svgd-induced has no ascent)",
            ));
        }
        if !(self.alpha >= 0.0 && self.alpha.is_finite()) {
            return Err(InferError::setting("alpha", format!("must be finite and >= 0, got {}", self.alpha)));
        }
        require_positive("lr-y", self.lr_y)?;
        require_positive("lr-h", self.lr_h)?;
        if let Some(h) = self.h0 {
            require_positive("h0", h)?;
        }
        if !self.learn_y && !self.learn_h {
            return Err(InferError::setting("learn-y", "learn-y and learn-h are both false: nothing to ascend"));
        }
        if self.u_statistic && self.ascent_subset && self.m < 2 {
            return Err(InferError::setting("m", "the U-statistic on an ascent subset needs m >= 2"));
        }
        Ok(())
    }

    fn statistic(&self) -> Statistic {
        if self.u_statistic { Statistic::U } else { Statistic::V }
    }
}

/// The induced points and RBF bandwidth that the adversarial engine learns, with their AdaGrad
/// states.
pub struct InducedPoints {
    /// `[m, d]`
    pub y: Tensor<2>,
    /// `log h`, `[1]`: the ascent works on `log h` so that `h` stays positive.
    pub log_h: Tensor<1>,
    y_adapter: Box<dyn StepAdapter>,
    h_adapter: Box<dyn StepAdapter>,
    config: AdversarialConfig,
}

impl InducedPoints {
    /// Induced points `y` with bandwidth `h` (`[1]`), under a validated `config`.
    pub fn new(y: Tensor<2>, h: Tensor<1>, config: &AdversarialConfig) -> Result<Self, InferError> {
        config.validate()?;
        Ok(Self {
            y,
            log_h: h.log(),
            y_adapter: AdapterConfig::adagrad(config.lr_y).build()?,
            h_adapter: AdapterConfig::adagrad(config.lr_h).build()?,
            config: config.clone(),
        })
    }

    /// The RBF kernel with the current bandwidth.
    pub fn kernel(&self) -> Rbf {
        Rbf { bandwidth: Bandwidth::Tensor(Box::new(self.log_h.clone().exp())) }
    }

    /// The squared induced-kernel KSD of `x` with scores `score` (the configured statistic).
    pub fn ksd(&self, x: Tensor<2>, score: Tensor<2>) -> Tensor<1> {
        induced_ksd(&self.kernel(), x, score, self.y.clone(), self.config.statistic())
    }

    /// The ascent objective `KSD - alpha (1/(2m)) sum_{j,j'} k(y_j, y_j')`, with its gradients
    /// with respect to `y` and `log h` (the bandwidth is held fixed in the regulariser: it
    /// steers the points only).
    #[allow(clippy::type_complexity)]
    pub fn objective_and_grads(
        &self,
        x: Tensor<2>,
        score: Tensor<2>,
    ) -> Result<(Tensor<1>, Tensor<2>, Tensor<1>), ModelError> {
        let (stat, alpha) = (self.config.statistic(), self.config.alpha);
        value_and_grad2(self.y.clone(), self.log_h.clone(), |y, log_h| {
            let h = log_h.exp();
            let kernel = Rbf { bandwidth: Bandwidth::Tensor(Box::new(h.clone())) };
            let ksd = induced_ksd(&kernel, x.autodiff(), score.autodiff(), y.clone(), stat);
            if alpha > 0.0 {
                let fixed = Rbf { bandwidth: Bandwidth::Tensor(Box::new(h.detach())) };
                ksd - induced_point_crowding(&fixed, y).mul_scalar(alpha)
            } else {
                ksd
            }
        })
    }

    /// One ascent step on the objective at particles `x` with scores `score` (held fixed); with
    /// `ascent-subset`, on `m` random particles of them.
    pub fn ascent_step(&mut self, x: &Tensor<2>, score: &Tensor<2>, rng: &mut EngineRng) -> Result<(), InferError> {
        let (xa, sa) = if self.config.ascent_subset {
            let mut rows = rng.choose(x.dims()[0], self.config.m);
            rows.sort_unstable();
            (select_rows(x, &rows), select_rows(score, &rows))
        } else {
            (x.clone(), score.clone())
        };
        let (_, grad_y, grad_log_h) = self.objective_and_grads(xa, sa)?;
        let device = self.y.device();
        if self.config.learn_y {
            self.y = self.y.clone() + self.y_adapter.delta(grad_y.to_device(&device));
        }
        if self.config.learn_h {
            let step = self.h_adapter.delta(grad_log_h.to_device(&device).reshape([1, 1]));
            self.log_h = self.log_h.clone() + step.reshape([1]);
        }
        Ok(())
    }

    fn save(&self, state: &mut EngineState) {
        state.put_tensor("induced.y", &self.y);
        state.put_tensor("induced.log-h", &self.log_h);
        self.y_adapter.save(state, "ascent-y.");
        self.h_adapter.save(state, "ascent-h.");
    }

    fn load(&mut self, state: &EngineState, device: &Device) -> Result<(), InferError> {
        self.y = state.tensor("induced.y", device)?;
        self.log_h = state.tensor("induced.log-h", device)?;
        self.y_adapter.load(state, "ascent-y.", device)?;
        self.h_adapter.load(state, "ascent-h.", device)
    }
}

/// Adversarial induced points SVGD (Algorithm 5). Each step computes the scores once, takes `L`
/// ascent steps of `y` and `h` on the KSD at the current particles, then moves the particles
/// along the induced direction of the updated `y` and `h`. (Kang takes the ascent steps right
/// after the particle update; taking them at the start of the next step is the same sequence of
/// updates, plus one ascent before the first particle step, and reuses that step's scores.)
pub struct AdversarialInduced {
    config: AdversarialConfig,
    adapter: Box<dyn StepAdapter>,
    /// Set on the first step (it needs the run's random stream) or by [`Engine::load`].
    points: Option<InducedPoints>,
}

impl AdversarialInduced {
    /// Adversarial induced points SVGD with `config`, moving the particles by `adapter`.
    pub fn new(config: &AdversarialConfig, adapter: Box<dyn StepAdapter>) -> Result<Self, InferError> {
        config.validate()?;
        Ok(Self { config: config.clone(), adapter, points: None })
    }

    /// The learned induced points and bandwidth, once the first step has run.
    pub fn points(&self) -> Option<&InducedPoints> {
        self.points.as_ref()
    }

    fn check_sizes(&self, n: usize) -> Result<(), InferError> {
        check_subset_size("m", self.config.m, n)?;
        if self.config.u_statistic && n < 2 {
            return Err(InferError::setting("u-statistic", "the U-statistic needs at least 2 particles"));
        }
        Ok(())
    }
}

impl Engine for AdversarialInduced {
    fn name(&self) -> &'static str {
        "svgd-adversarial"
    }

    fn init(&mut self, particles: &Particles) -> Result<(), InferError> {
        self.check_sizes(particles.len())
    }

    fn step(&mut self, ctx: &mut StepContext<'_>, particles: &mut Particles) -> Result<(), InferError> {
        self.check_sizes(particles.len())?;
        let x = particles.positions.clone();
        if self.points.is_none() {
            let y = random_rows(&x, self.config.m, ctx.rng);
            let h = match self.config.h0 {
                Some(h) => Tensor::<1>::full([1], h, &x.device()),
                None => median_bandwidth(&x),
            };
            self.points = Some(InducedPoints::new(y, h, &self.config)?);
        }
        let points = self.points.as_mut().expect("set above");
        let s = score(ctx.model, x.clone(), ctx.batch)?.grad;
        for _ in 0..self.config.ascent_steps {
            points.ascent_step(&x, &s, ctx.rng)?;
        }
        let phi = induced_direction(&points.kernel(), x.clone(), s, points.y.clone());
        particles.positions = x + self.adapter.delta(phi);
        Ok(())
    }

    fn save(&self) -> EngineState {
        let mut state = EngineState::default();
        self.adapter.save(&mut state, "adapter.");
        if let Some(points) = &self.points {
            points.save(&mut state);
        }
        state
    }

    fn load(&mut self, state: &EngineState, device: &Device) -> Result<(), InferError> {
        self.adapter.load(state, "adapter.", device)?;
        if state.tensors.contains_key("induced.y") {
            let y: Tensor<2> = state.tensor("induced.y", device)?;
            let h = Tensor::<1>::ones([1], device);
            let mut points = InducedPoints::new(y, h, &self.config)?;
            points.load(state, device)?;
            if points.y.dims()[0] != self.config.m {
                return Err(InferError::State(format!(
                    "induced.y has {} points but m = {}",
                    points.y.dims()[0],
                    self.config.m
                )));
            }
            self.points = Some(points);
        }
        Ok(())
    }

    fn report(&self) -> serde_json::Value {
        let h = self.points.as_ref().map(|p| f64::from(p.log_h.clone().exp().into_scalar::<f32>()));
        serde_json::json!({ "kernel": "rbf(learned)", "config": self.config, "h": h })
    }
}

impl EngineConfig for InducedConfig {
    fn build(&self, kernel: &KernelConfig, adapter: &AdapterConfig) -> Result<Box<dyn Engine>, InferError> {
        kernel.require_radial("svgd-induced", "its induced kernel is built from a radial kernel's profile")?;
        Ok(Box::new(RandomInduced::new(self, kernel.build()?, adapter.build()?)?))
    }
}

/// It learns an RBF bandwidth: a fixed kernel bandwidth, when given, is its starting value.
impl EngineConfig for AdversarialConfig {
    fn build(&self, kernel: &KernelConfig, adapter: &AdapterConfig) -> Result<Box<dyn Engine>, InferError> {
        let mut config = self.clone();
        match kernel {
            KernelConfig::Rbf { bandwidth } => config.h0 = config.h0.or(*bandwidth),
            KernelConfig::Imq { .. } => {
                return Err(InferError::setting(
                    "kernel",
                    "svgd-adversarial learns an RBF bandwidth: an IMQ kernel does not apply",
                ));
            }
            KernelConfig::RbfLinear { .. } => {
                return Err(InferError::setting(
                    "kernel",
                    "svgd-adversarial cannot use the moment-matching kernel `rbf-linear`: it learns a plain RBF's bandwidth",
                ));
            }
        }
        Ok(Box::new(AdversarialInduced::new(&config, adapter.build()?)?))
    }
}
