//! MMD minimisation by Frank-Wolfe (Futami, Cui, Sato & Sugiyama 2019, Algorithm 3): a greedy
//! method that GROWS a weighted particle set by one particle per step.
//!
//! Frank-Wolfe on `J(mu) = ||mu_p - mu||^2 / 2` over the marginal polytope of the RKHS: the
//! linear minimisation oracle (LMO) is `argmin_x sum_l w_l k(x_l, x) - mu_p(x)`, solved
//! approximately by `L` Adam steps (Approx-LMO, Algorithm 2) along eq. (5),
//!
//! `phi(x) = sum_l w_l [k(x_l, x) grad log p(x_l) + grad_{x_l} k(x_l, x)]`,
//!
//! which is the weighted Stein direction ([`stein_direction`]) at one target point: its first
//! term estimates `grad mu_p(x)` by integration by parts with the particles standing for `p`,
//! its second is `-grad sum_l w_l k(x_l, x)`. The paper's extra factor `1/n` is dropped: Adam
//! is invariant to the scale of the direction. Only the particles' scores enter, so an LMO
//! iteration costs `O(n dim)` kernel work and no model evaluation; the new particle's score is
//! computed once when it joins.
//!
//! Schedule of the run loop's steps: step 0 places the first particle (an approximate MAP by
//! Adam on `log p`, or the first initial particle when `map-steps = 0`); every later step adds
//! one particle until the set has as many particles as the run started with (`N`, the
//! `--particles` flag); later steps leave the set alone. The initial particles are the LMO's
//! starting draws (the `k`-th LMO starts from initial particle `k`: draws from the initial
//! particle distribution, the paper's "prior draw").
//!
//! Weights after each new particle (`step-rule`):
//! - `bq` (default, fully corrective): Bayesian-quadrature weights `w = K^-1 z`, `K` the Gram
//!   matrix of the particles, `z_m ~ mu_p(x_m)`, by a regularised Cholesky solve on the host
//!   (burn has no Cholesky; the `n x n` read is small next to the LMO), normalised to sum 1
//!   unless `normalise-weights = false`.
//! - `constant`: `w <- (1 - 1/(n+1)) w + 1/(n+1) e_new`.
//! - `line-search`: the exact minimiser of `J` on the segment towards the new atom, in `[0, 1]`.
//!
//! `z` (the kernel mean embedding at the particles) is estimated as in the paper from the
//! particles themselves (`embedding = particles`, `z_m = (1/n) sum_l k(x_l, x_m)`), or from the
//! SVGD cache (`embedding = cache`). NOTE: with `embedding = particles` all three step rules
//! give uniform weights (`K^-1 K 1/n = 1/n`, up to the jitter), as the paper's formula implies.
//!
//! Variants: Cache-MMD-FW (`cache = true`, Appendix J): SVGD particles form a cache; each LMO
//! starts from the cached particle with the smallest `|phi|` and removes it, with few Adam steps.
//! Lazy FW (`lazy = true`, Braun, Pokutta & Zink 2017; Appendix K): before calling the LMO,
//! reuse a stored particle whose Frank-Wolfe gap `<mu - mu_p, mu - k(., x)>` reaches `Phi / K`;
//! an LMO result that does not reach it halves `Phi` and is dropped. Random Fourier features
//! (`rff = D`) replace the RBF kernel by a rank-`D` approximation.
//!
//! `self-score = true` (our variant for BNNs, not in the paper): the LMO's estimate of
//! `grad mu_p` at the searched point is the point's own score instead of the set's stored
//! scores, so each LMO iteration evaluates the model once for one particle, and the MAP search
//! and the LMOs run one Adam iteration per run-loop step (fresh minibatches; a step costs one
//! single-particle score and `O(n dim)` kernel work).

use burn::tensor::{Device, Int, Tensor, TensorData};
use parvi_model::tensor_ops::{all_finite, pairwise_sq_dists, to_vec_f32};
use parvi_model::{LogDensity, Minibatch, score};
use serde::{Deserialize, Serialize};

use crate::error::{require_growth_target, require_positive};
use crate::linalg::host::{Cholesky, CholeskyError};
use crate::rff::{FourierStein, RandomFourierFeatures};
use crate::stein::stein_direction;
use crate::svgd::svgd_direction;
use crate::{
    AdapterConfig, Bandwidth, Engine, EngineRng, EngineState, InferError, Kernel, KernelConfig, Particles, Rbf,
    StepAdapter, StepContext,
};

/// How many times the BQ solve retries with 100x more jitter.
const JITTER_TRIES: usize = 4;

/// How the weights change when a particle joins.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StepRule {
    /// Fully corrective Bayesian-quadrature weights.
    #[default]
    Bq,
    /// `1 / (n + 1)`.
    Constant,
    /// Exact line search on the MMD.
    LineSearch,
}

/// Where the estimate of `mu_p` (for the weights and the lazy criterion) comes from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EmbeddingSource {
    /// The particles themselves, uniformly weighted (the paper's Algorithm 3).
    #[default]
    Particles,
    /// The SVGD cache (needs `cache = true`).
    Cache,
}

/// Options of `mmd-fw`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct MmdFwConfig {
    /// Adam steps per Approx-LMO (`L >= 1`).
    pub l_steps: usize,
    /// Adam step size of the LMO.
    pub lmo_lr: f64,
    pub step_rule: StepRule,
    /// Adam steps of the MAP search for the first particle (`0`: the first initial particle).
    pub map_steps: usize,
    /// Adam step size of the MAP search.
    pub map_lr: f64,
    /// Cache-MMD-FW: start each LMO from an SVGD particle.
    pub cache: bool,
    /// SVGD iterations (with the run's step-size adapter) that turn the initial particles into
    /// the cache at step 0; `0` takes the initial particles as the cache as they are (pass SVGD
    /// particles as the initial particles).
    pub cache_svgd_steps: usize,
    pub embedding: EmbeddingSource,
    /// Lazy Frank-Wolfe.
    pub lazy: bool,
    /// The lazy accuracy parameter `K >= 1` of Braun, Pokutta & Zink.
    pub lazy_accuracy: f64,
    /// Random Fourier features of the RBF kernel (`0`: the exact kernel).
    pub rff: usize,
    /// First diagonal jitter of the BQ solve, relative to the mean diagonal of the Gram matrix;
    /// it grows 100-fold per retry (4 tries). `0` solves without jitter.
    pub jitter: f64,
    /// Rescale the BQ weights to sum 1 (a probability for predictions); `false` keeps the raw
    /// optimal weights `K^-1 z`.
    pub normalise_weights: bool,
    /// Estimate eq. (5)'s `grad mu_p(y) = E_p[k(x, y) grad log p(x)]` at the searched point by
    /// its own score (the one-sample estimate `k(y, y) grad log p(y)`) instead of the set's
    /// stored scores: the LMO direction becomes `grad log p(y) + sum_l w_l grad_{x_l} k(x_l, y)`,
    /// an ascent on `log p` repelled by the set. For models where a start far from the set sees
    /// no kernel mass, and where stored scores go stale (BNNs, the paper's non-MAP setting):
    /// with the set's frozen scores in the direction, Adam integrated their fixed drift over
    /// thousands of iterations and the searched networks left the data (test RMSE 93 on a
    /// naval split, 3358 on protein). Each iteration needs the model, so the search is spread
    /// over the run loop's steps, one Adam iteration per step on that step's minibatch (the
    /// first particle's MAP search too: `map-steps` iterations). The price: the set is
    /// under-dispersed as a posterior sample (a repelled multi-start ascent; on the 2-D test
    /// Gaussian 12 particles have MMD^2 0.30 against 0.07 for 12 exact draws); weighting the
    /// repulsion as eq. (5)'s set (x n) instead pushes the set off to the side it started from.
    pub self_score: bool,
}

impl Default for MmdFwConfig {
    fn default() -> Self {
        Self {
            l_steps: 100,
            lmo_lr: 0.005,
            step_rule: StepRule::Bq,
            map_steps: 500,
            map_lr: 0.01,
            cache: false,
            cache_svgd_steps: 500,
            embedding: EmbeddingSource::Particles,
            lazy: false,
            lazy_accuracy: 2.0,
            rff: 0,
            jitter: 1e-8,
            normalise_weights: true,
            self_score: false,
        }
    }
}

impl MmdFwConfig {
    pub fn validate(&self, kernel: &KernelConfig) -> Result<(), InferError> {
        if self.l_steps == 0 {
            return Err(InferError::setting("l-steps", "the Approx-LMO needs at least one Adam step (L >= 1), got 0"));
        }
        require_positive("lmo-lr", self.lmo_lr)?;
        require_positive("map-lr", self.map_lr)?;
        if !(self.jitter >= 0.0 && self.jitter.is_finite()) {
            return Err(InferError::setting("jitter", format!("must be finite and >= 0, got {}", self.jitter)));
        }
        if self.embedding == EmbeddingSource::Cache && !self.cache {
            return Err(InferError::setting("embedding", "`embedding = cache` needs `cache = true`"));
        }
        if self.lazy {
            if self.embedding != EmbeddingSource::Cache {
                return Err(InferError::setting(
                    "lazy",
                    "the lazy criterion needs an estimate of mu_p that is not the particles themselves: \
                     set `cache = true` and `embedding = cache`",
                ));
            }
            if self.step_rule == StepRule::Bq {
                return Err(InferError::setting(
                    "lazy",
                    "reusing a stored particle does not change fully corrective (bq) weights: \
                     use `step-rule = line-search` or `constant`",
                ));
            }
            if !(self.lazy_accuracy >= 1.0 && self.lazy_accuracy.is_finite()) {
                return Err(InferError::setting("lazy-accuracy", format!("must be >= 1, got {}", self.lazy_accuracy)));
            }
        }
        if self.self_score && (self.cache || self.lazy) {
            return Err(InferError::setting(
                "self-score",
                "the spread search (self-score = true) starts from the initial particles: \
                 it cannot be combined with `cache` or `lazy`",
            ));
        }
        if self.rff > 0 && !matches!(kernel, KernelConfig::Rbf { .. }) {
            return Err(InferError::setting("rff", "random Fourier features approximate the RBF kernel only"));
        }
        Ok(())
    }
}

/// A weighted sample standing for `p` in `mu_p(x) = sum_j v_j k(y_j, x)`.
#[derive(Clone, Debug)]
pub struct MeanEmbedding {
    pub points: Tensor<2>,
    /// `[m]`, summing to 1.
    pub weights: Tensor<1>,
}

/// The kernel of one step: its bandwidth is frozen for the step (median heuristic on the
/// particles at the step's start, unless fixed), so the LMO and the weights see one kernel.
// Built once per step and short-lived: variant sizes do not matter.
#[allow(clippy::large_enum_variant)]
enum StepKernel {
    /// The kernel and its description.
    Radial(Box<dyn Kernel>, String),
    Fourier {
        features: RandomFourierFeatures,
        h2: Tensor<2>,
    },
}

impl StepKernel {
    /// `[n, m]` Gram matrix of `a` against `b`.
    fn gram(&self, a: Tensor<2>, b: Tensor<2>) -> Tensor<2> {
        match self {
            StepKernel::Radial(k, _) => k.eval(&pairwise_sq_dists(a, b), false).k,
            StepKernel::Fourier { features, h2 } => features.gram(a, b, h2),
        }
    }

    /// Eq. (5) of the weighted sources `x` with scores `score`, ready to evaluate at targets:
    /// the ascent direction of the LMO objective's negative.
    fn lmo_field(&self, x: Tensor<2>, score: Tensor<2>, w: Tensor<1>) -> LmoField<'_> {
        match self {
            StepKernel::Radial(k, _) => LmoField::Radial { kernel: k.as_ref(), x, score, w },
            StepKernel::Fourier { features, h2 } => LmoField::Fourier(features.stein_field(x, score, w, h2)),
        }
    }

    fn describe(&self) -> String {
        match self {
            StepKernel::Radial(_, name) => name.clone(),
            StepKernel::Fourier { features, .. } => format!("rbf-rff(D={})", features.features()),
        }
    }
}

/// Eq. (5) with its sources fixed for one LMO (the Fourier form precomputes their part).
#[allow(clippy::large_enum_variant)]
enum LmoField<'a> {
    Radial { kernel: &'a dyn Kernel, x: Tensor<2>, score: Tensor<2>, w: Tensor<1> },
    Fourier(FourierStein),
}

impl LmoField<'_> {
    /// The direction at the targets `y` `[m, d]`: `O(n m dim)` (radial) or `O(m D dim)`.
    fn at(&self, y: Tensor<2>) -> Tensor<2> {
        match self {
            LmoField::Radial { kernel, x, score, w } => {
                let eval = kernel.eval(&pairwise_sq_dists(x.clone(), y.clone()), false);
                stein_direction(&eval, x.clone(), score.clone(), y, Some(w.clone()))
            }
            LmoField::Fourier(field) => field.at(y),
        }
    }
}

/// Counters for the report.
#[derive(Clone, Debug, Default, Serialize)]
struct FwStats {
    lmo_calls: usize,
    lazy_reuses: usize,
    lazy_negative_calls: usize,
    last_jitter: f64,
    max_jitter: f64,
    /// Sum of the BQ weights before normalisation (last step).
    bq_raw_sum: f64,
    negative_weights: usize,
    map_log_prob: Option<f64>,
    map_grad_norm: Option<f64>,
    idle_steps: usize,
    last_lambda: Option<f64>,
}

/// A search spread over the run loop's steps (`self-score = true`): the point, its Adam state
/// and how many iterations it has had.
struct SpreadSearch {
    y: Tensor<2>,
    adam: Box<dyn StepAdapter>,
    done: usize,
    /// The kernel frozen at the search's start (`None` while there is no set yet, and after a
    /// resume until the next step rebuilds it from the same particles).
    kernel: Option<StepKernel>,
}

/// The MMD-FW engine.
pub struct MmdFw {
    config: MmdFwConfig,
    kernel: KernelConfig,
    cache_adapter: Option<Box<dyn StepAdapter>>,
    /// Initial particles `[N, d]`: LMO starting draws; `N` is the target size.
    pool: Option<Tensor<2>>,
    /// Scores of the particles `[n, d]` (computed when each joined).
    scores: Option<Tensor<2>>,
    weights: Vec<f64>,
    /// Remaining cached SVGD particles.
    cache: Option<Tensor<2>>,
    /// The full SVGD cache, for `embedding = cache`.
    reference: Option<MeanEmbedding>,
    /// Exact LMO over a finite candidate set (kernel herding); needs a reference embedding.
    candidates: Option<Tensor<2>>,
    rff: Option<RandomFourierFeatures>,
    /// Lazy accuracy threshold `Phi`.
    phi: Option<f64>,
    stats: FwStats,
    kernel_used: String,
    /// The search in progress (`self-score = true`).
    search: Option<SpreadSearch>,
}

impl MmdFw {
    /// `cache_adapter` drives the SVGD iterations that build the cache (`cache = true`).
    pub fn new(config: MmdFwConfig, kernel: KernelConfig, cache_adapter: AdapterConfig) -> Result<Self, InferError> {
        config.validate(&kernel)?;
        let cache_adapter = if config.cache { Some(cache_adapter.build()?) } else { None };
        Ok(Self {
            config,
            kernel,
            cache_adapter,
            pool: None,
            scores: None,
            weights: Vec::new(),
            cache: None,
            reference: None,
            candidates: None,
            rff: None,
            phi: None,
            stats: FwStats::default(),
            kernel_used: String::new(),
            search: None,
        })
    }

    /// Uses `mu_p(x) = sum_j v_j k(y_j, x)` for the weights (and the lazy criterion) instead of
    /// the particles or the cache: e.g. the exact embedding of a discrete target.
    pub fn with_reference(mut self, reference: MeanEmbedding) -> Self {
        self.reference = Some(reference);
        self
    }

    /// Replaces the Approx-LMO by the exact LMO over the rows of `candidates` (kernel herding
    /// with the chosen step rule); needs [`MmdFw::with_reference`]. A candidate already in the set
    /// is not chosen again (it would make the Gram matrix singular and, under fully corrective
    /// weights, adds nothing).
    pub fn with_exact_lmo(mut self, candidates: Tensor<2>) -> Self {
        self.candidates = Some(candidates);
        self
    }

    /// The number of particles the set grows to.
    fn target(&self) -> usize {
        self.pool.as_ref().map_or(0, |p| p.dims()[0])
    }

    fn count(&self) -> usize {
        self.weights.len()
    }

    /// The kernel of this step, with the bandwidth frozen on `positions`.
    fn step_kernel(&self, positions: &Tensor<2>) -> Result<StepKernel, InferError> {
        let median_h2 = || {
            let sq = pairwise_sq_dists(positions.clone(), positions.clone());
            Rbf::median().h2(&sq)
        };
        Ok(match (&self.rff, &self.kernel) {
            (Some(features), KernelConfig::Rbf { bandwidth }) => {
                let h2 = match bandwidth {
                    Some(h) => Tensor::full([1, 1], h * h, &positions.device()),
                    None => median_h2(),
                };
                StepKernel::Fourier { features: features.clone(), h2 }
            }
            (None, KernelConfig::Rbf { bandwidth: None }) => {
                let h = median_h2().reshape([1]).sqrt();
                StepKernel::Radial(
                    Box::new(Rbf { bandwidth: Bandwidth::Tensor(Box::new(h)) }),
                    "rbf(median, per step)".into(),
                )
            }
            (_, other) => {
                let k = other.build()?;
                let name = k.describe();
                StepKernel::Radial(k, name)
            }
        })
    }

    fn weights_tensor(&self, device: &Device) -> Tensor<1> {
        let w: Vec<f32> = self.weights.iter().map(|&v| v as f32).collect();
        Tensor::from_data(TensorData::new(w, [self.weights.len()]), device)
    }

    fn particles(&self, positions: Tensor<2>) -> Particles {
        let device = positions.device();
        Particles { positions, weights: Some(self.weights_tensor(&device)) }
    }

    /// `mu_p` estimated at `points` `[m]` (host), from the reference sample or, by default, the
    /// particles `x` with uniform weights.
    fn embedding_at(&self, kernel: &StepKernel, x: &Tensor<2>, points: Tensor<2>) -> Vec<f64> {
        let (src, v) = match &self.reference {
            Some(r) => (r.points.clone(), r.weights.clone()),
            None => {
                let n = x.dims()[0];
                (x.clone(), Tensor::ones([n], &x.device()).div_scalar(n as f64))
            }
        };
        let m = src.dims()[0];
        let z = v.reshape([1, m]).matmul(kernel.gram(src, points));
        to_vec_f32(&z).into_iter().map(f64::from).collect()
    }

    /// Step 0: build the cache (if any) and place the first particle.
    fn start(&mut self, ctx: &mut StepContext<'_>, particles: &mut Particles) -> Result<(), InferError> {
        let device = particles.device();
        let pool = particles.positions.clone();
        if self.config.rff > 0 && self.rff.is_none() {
            self.rff = Some(RandomFourierFeatures::draw(particles.dim(), self.config.rff, ctx.rng, &device)?);
        }
        if self.config.cache {
            let cache = self.build_cache(ctx, pool.clone())?;
            if self.config.embedding == EmbeddingSource::Cache {
                let c = cache.dims()[0];
                self.reference = Some(MeanEmbedding {
                    points: cache.clone(),
                    weights: Tensor::ones([c], &device).div_scalar(c as f64),
                });
            }
            self.cache = Some(cache);
        }
        self.pool = Some(pool.clone());
        let first = if let Some(candidates) = self.candidates.clone() {
            // Herding's first point: argmax mu_p over the candidates (the LMO at mu = 0).
            let kernel = self.step_kernel(&candidates)?;
            let z = self.embedding_at(&kernel, &candidates, candidates.clone());
            let best = argmin(&z.iter().map(|v| -v).collect::<Vec<_>>(), &[]);
            self.kernel_used = kernel.describe();
            rows(&candidates, &[best])
        } else {
            let start = match self.cache.clone() {
                // Algorithm 10, line 3: the cached particle with the smallest |grad log p|.
                Some(cache) => {
                    let s = score(ctx.model, cache.clone(), ctx.batch)?;
                    let norms: Vec<f64> = to_vec_f32(&s.grad.square().sum_dim(1)).into_iter().map(f64::from).collect();
                    let i = argmin(&norms, &[]);
                    self.remove_cached(i);
                    rows(&cache, &[i])
                }
                None => pool.clone().narrow(0, 0, 1),
            };
            self.map_search(ctx.model, ctx.batch, start)?
        };
        self.place_first(ctx, first, particles)
    }

    /// Whether the particles' scores are kept for eq. (5): not for the exact LMO (no model)
    /// nor with `self-score` (the searched point's own score stands in for them).
    fn keeps_scores(&self) -> bool {
        self.candidates.is_none() && !self.config.self_score
    }

    /// The set becomes `first` alone, weight 1.
    fn place_first(
        &mut self,
        ctx: &mut StepContext<'_>,
        first: Tensor<2>,
        particles: &mut Particles,
    ) -> Result<(), InferError> {
        if self.keeps_scores() {
            let s = score(ctx.model, first.clone(), ctx.batch)?;
            check_score(&s.log_prob, &s.grad, "the first particle")?;
            self.scores = Some(s.grad);
        }
        self.weights = vec![1.0];
        if self.config.step_rule == StepRule::Bq && !self.config.normalise_weights {
            // The raw BQ weight of one particle, z_1 / k(x_1, x_1).
            let kernel = self.step_kernel(&first)?;
            self.weights = self.new_weights(&kernel, &first, ctx.step)?;
        }
        *particles = self.particles(first);
        if self.config.lazy {
            self.phi = Some(self.initial_phi(particles)?);
        }
        Ok(())
    }

    /// `self-score = true`: one Adam iteration of the search in progress (the first particle's
    /// MAP search, then each Approx-LMO) on this step's minibatch; the point joins the set when
    /// its iterations are done.
    fn step_spread(&mut self, ctx: &mut StepContext<'_>, particles: &mut Particles) -> Result<(), InferError> {
        let step = ctx.step;
        if self.pool.is_none() {
            self.pool = Some(particles.positions.clone());
            if self.config.rff > 0 {
                self.rff =
                    Some(RandomFourierFeatures::draw(particles.dim(), self.config.rff, ctx.rng, &particles.device())?);
            }
        }
        let n = self.count();
        let x = (n > 0).then(|| particles.positions.clone());
        let (total, lr, lr_name) = match n {
            0 => (self.config.map_steps, self.config.map_lr, "map-lr"),
            _ => (self.config.l_steps, self.config.lmo_lr, "lmo-lr"),
        };
        let mut search = match self.search.take() {
            Some(search) => search,
            None => {
                let y = match n {
                    0 => rows(self.pool.as_ref().expect("set above"), &[0]),
                    _ => {
                        let y = self.pool_start(ctx.rng);
                        self.stats.lmo_calls += 1;
                        y
                    }
                };
                SpreadSearch { y, adam: AdapterConfig::adam(lr).build()?, done: 0, kernel: None }
            }
        };
        if let (Some(x), None) = (&x, &search.kernel) {
            search.kernel = Some(self.step_kernel(x)?);
        }
        if search.done < total {
            let s = score(ctx.model, search.y.clone(), ctx.batch)?;
            check_score(&s.log_prob, &s.grad, "").map_err(|e| {
                InferError::Numerical(format!(
                    "step {step}: the search for particle {} diverged at Adam iteration {} of {total} \
                     ({lr_name} = {lr}): {e}",
                    n + 1,
                    search.done
                ))
            })?;
            let phi = match (&x, &search.kernel) {
                (Some(x), Some(kernel)) => {
                    // Eq. (5) with zero scores at the set is its repulsion `sum_l w_l grad_{x_l} k`.
                    let w = self.weights_tensor(&x.device());
                    let repulsion = kernel.lmo_field(x.clone(), x.zeros_like(), w).at(search.y.clone());
                    s.grad + repulsion
                }
                _ => s.grad,
            };
            search.y = search.y.clone() + search.adam.delta(phi);
            search.done += 1;
        }
        if search.done < total {
            if n == 0 {
                // No set yet: the run loop (guard, progress, evaluation) sees the search.
                *particles = Particles::new(search.y.clone());
            }
            self.search = Some(search);
            return Ok(());
        }
        if !all_finite(&search.y) {
            return Err(InferError::Numerical(format!(
                "step {step}: the search for particle {} ended at a non-finite point (lower `{lr_name}`)",
                n + 1
            )));
        }
        match (x, search.kernel) {
            (Some(x), Some(kernel)) => {
                self.kernel_used = kernel.describe();
                self.join(ctx, &kernel, x, search.y, particles)
            }
            _ => self.place_first(ctx, search.y, particles),
        }
    }

    /// `cache-svgd-steps` SVGD iterations on `x` with the run's adapter.
    fn build_cache(&mut self, ctx: &mut StepContext<'_>, mut x: Tensor<2>) -> Result<Tensor<2>, InferError> {
        let kernel = Rbf::median();
        let adapter = self.cache_adapter.as_mut().expect("built with cache = true");
        for it in 0..self.config.cache_svgd_steps {
            let s = score(ctx.model, x.clone(), ctx.batch)?;
            let phi = svgd_direction(&kernel, x.clone(), s.grad);
            x = x + adapter.delta(phi);
            if (it + 1) % 100 == 0 && !all_finite(&x) {
                return Err(InferError::Numerical(format!(
                    "cache: the SVGD iterations building the cache diverged by iteration {} of {} \
                     (lower the step size `--lr`)",
                    it + 1,
                    self.config.cache_svgd_steps
                )));
            }
        }
        if !all_finite(&x) {
            return Err(InferError::Numerical(format!(
                "cache: the {} SVGD iterations building the cache diverged (lower the step size `--lr`)",
                self.config.cache_svgd_steps
            )));
        }
        Ok(x)
    }

    fn remove_cached(&mut self, i: usize) {
        if let Some(cache) = self.cache.take() {
            let c = cache.dims()[0];
            let keep: Vec<usize> = (0..c).filter(|&j| j != i).collect();
            self.cache = (!keep.is_empty()).then(|| rows(&cache, &keep));
        }
    }

    /// Adam on `log p` from `start` `[1, d]` (Algorithm 3, line 3).
    fn map_search(
        &mut self,
        model: &dyn LogDensity,
        batch: Option<&Minibatch>,
        start: Tensor<2>,
    ) -> Result<Tensor<2>, InferError> {
        let steps = self.config.map_steps;
        if steps == 0 {
            return Ok(start);
        }
        let mut adam = AdapterConfig::adam(self.config.map_lr).build()?;
        let mut x = start;
        let mut last = None;
        for it in 0..steps {
            let s = score(model, x.clone(), batch)?;
            // One host read per MAP iteration of a single particle: it names the diverging
            // iteration instead of failing later on a non-finite first particle.
            check_score(&s.log_prob, &s.grad, "").map_err(|e| {
                InferError::Numerical(format!(
                    "MAP search (first particle) diverged at Adam step {it} of {steps} (map-lr = {}): {e}",
                    self.config.map_lr
                ))
            })?;
            x = x + adam.delta(s.grad.clone());
            last = Some(s);
        }
        if !all_finite(&x) {
            return Err(InferError::Numerical(format!(
                "MAP search (first particle) diverged at Adam step {steps} of {steps} (map-lr = {}): \
                 non-finite position",
                self.config.map_lr
            )));
        }
        if let Some(s) = last {
            self.stats.map_log_prob = Some(f64::from(to_vec_f32(&s.log_prob)[0]));
            self.stats.map_grad_norm =
                Some(to_vec_f32(&s.grad).iter().map(|g| f64::from(*g).powi(2)).sum::<f64>().sqrt());
        }
        Ok(x)
    }

    /// Lazy FW's first `Phi`: half the largest gap over the cache (Algorithm 10, line 5).
    fn initial_phi(&self, particles: &Particles) -> Result<f64, InferError> {
        let x = particles.positions.clone();
        let kernel = self.step_kernel(&x)?;
        let probe = self.reference.as_ref().map(|r| r.points.clone()).unwrap_or_else(|| x.clone());
        let gaps = self.gaps(&kernel, &x, probe);
        Ok(gaps.iter().cloned().fold(f64::NEG_INFINITY, f64::max).max(0.0) / 2.0)
    }

    /// Frank-Wolfe gaps `<mu - mu_p, mu - k(., y)>` at the rows of `probe`.
    fn gaps(&self, kernel: &StepKernel, x: &Tensor<2>, probe: Tensor<2>) -> Vec<f64> {
        let n = x.dims()[0];
        let k = host_matrix(&kernel.gram(x.clone(), x.clone()));
        let z = self.embedding_at(kernel, x, x.clone());
        let w = &self.weights;
        let kw: Vec<f64> = (0..n).map(|i| (0..n).map(|j| k[i * n + j] * w[j]).sum()).collect();
        let wkw: f64 = w.iter().zip(&kw).map(|(a, b)| a * b).sum();
        let wz: f64 = w.iter().zip(&z).map(|(a, b)| a * b).sum();
        let w_t = self.weights_tensor(&x.device());
        let kw_probe = to_vec_f32(&w_t.reshape([1, n]).matmul(kernel.gram(x.clone(), probe.clone())));
        let z_probe = self.embedding_at(kernel, x, probe);
        kw_probe.iter().zip(&z_probe).map(|(&kwp, zp)| wkw - wz - f64::from(kwp) + zp).collect()
    }

    /// Algorithm 2 (or 7 with a cache): `L` Adam steps from a start point along eq. (5).
    fn approx_lmo(&mut self, kernel: &StepKernel, x: &Tensor<2>, rng: &mut EngineRng) -> Tensor<2> {
        let scores = self.scores.clone().expect("scores set at step 0");
        let w = self.weights_tensor(&x.device());
        let field = kernel.lmo_field(x.clone(), scores, w);
        let start = match self.cache.clone() {
            Some(cache) => {
                // Algorithm 7, line 3: the cached particle with the smallest |grad MMD^2|.
                let phi = field.at(cache.clone());
                let norms: Vec<f64> = to_vec_f32(&phi.square().sum_dim(1)).into_iter().map(f64::from).collect();
                let i = argmin(&norms, &[]);
                self.remove_cached(i);
                rows(&cache, &[i])
            }
            None => self.pool_start(rng),
        };
        self.stats.lmo_calls += 1;
        let mut adam = AdapterConfig::adam(self.config.lmo_lr).build().expect("lmo-lr validated");
        let mut y = start;
        for _ in 0..self.config.l_steps {
            let phi = field.at(y.clone());
            y = y.clone() + adam.delta(phi);
        }
        y
    }

    /// The start of the next LMO without a cache: initial particle `k` starts the `k`-th LMO;
    /// lazy negative calls can ask for more starts than there are initial particles: then a
    /// random one.
    fn pool_start(&self, rng: &mut EngineRng) -> Tensor<2> {
        let pool = self.pool.as_ref().expect("pool set at step 0");
        let n_pool = pool.dims()[0];
        let calls = self.stats.lmo_calls + 1;
        let row = if calls < n_pool { calls } else { rng.choose(n_pool, 1)[0] };
        rows(pool, &[row])
    }

    /// The exact LMO over the candidates: `argmin_y sum_l w_l k(x_l, y) - mu_p(y)`.
    fn exact_lmo(
        &mut self,
        kernel: &StepKernel,
        x: &Tensor<2>,
        candidates: &Tensor<2>,
    ) -> Result<Tensor<2>, InferError> {
        let n = x.dims()[0];
        let w = self.weights_tensor(&x.device()).reshape([1, n]);
        let kw = to_vec_f32(&w.matmul(kernel.gram(x.clone(), candidates.clone())));
        let z = self.embedding_at(kernel, x, candidates.clone());
        let objective: Vec<f64> = kw.iter().zip(&z).map(|(&a, b)| f64::from(a) - b).collect();
        // Exclude candidates already in the set (equal rows).
        let chosen = self.chosen_candidates(x, candidates);
        if chosen.len() == objective.len() {
            return Err(InferError::Numerical("exact LMO: every candidate is already a particle".into()));
        }
        self.stats.lmo_calls += 1;
        Ok(rows(candidates, &[argmin(&objective, &chosen)]))
    }

    fn chosen_candidates(&self, x: &Tensor<2>, candidates: &Tensor<2>) -> Vec<usize> {
        let d2 = to_vec_f32(&pairwise_sq_dists(candidates.clone(), x.clone()));
        let n = x.dims()[0];
        d2.chunks(n).enumerate().filter(|(_, row)| row.iter().any(|&v| v <= 0.0)).map(|(i, _)| i).collect()
    }

    /// New weights of the `n + 1` particles `all` (the new one last).
    fn new_weights(&mut self, kernel: &StepKernel, all: &Tensor<2>, step: usize) -> Result<Vec<f64>, InferError> {
        let n1 = all.dims()[0];
        let n = n1 - 1;
        let lambda_const = 1.0 / n1 as f64;
        match self.config.step_rule {
            StepRule::Constant => Ok(self.moved_towards(None, lambda_const)),
            StepRule::LineSearch => {
                let k = host_matrix(&kernel.gram(all.clone(), all.clone()));
                let z = self.embedding_at(kernel, all, all.clone());
                let lambda = line_search(&k, &z, &self.weights, n);
                self.stats.last_lambda = Some(lambda);
                Ok(self.moved_towards(None, lambda))
            }
            StepRule::Bq => {
                let k = host_matrix(&kernel.gram(all.clone(), all.clone()));
                let z = self.embedding_at(kernel, all, all.clone());
                let (w, jitter) = bq_weights(&k, &z, n1, self.config.jitter)
                    .map_err(|e| InferError::Numerical(format!("step {step}: BQ weights of {n1} particles: {e}")))?;
                self.stats.last_jitter = jitter;
                self.stats.max_jitter = self.stats.max_jitter.max(jitter);
                let sum: f64 = w.iter().sum();
                self.stats.bq_raw_sum = sum;
                if self.config.normalise_weights && !(sum.is_finite() && sum.abs() > 1e-12) {
                    return Err(InferError::Numerical(format!(
                        "step {step}: BQ weights of {n1} particles sum to {sum}: cannot normalise"
                    )));
                }
                let scale = if self.config.normalise_weights { sum } else { 1.0 };
                let w: Vec<f64> = w.into_iter().map(|v| v / scale).collect();
                self.stats.negative_weights = w.iter().filter(|&&v| v < 0.0).count();
                Ok(w)
            }
        }
    }

    /// `(1 - lambda) w + lambda e_j`, `j = None` for a new atom appended at the end.
    fn moved_towards(&self, j: Option<usize>, lambda: f64) -> Vec<f64> {
        let mut w: Vec<f64> = self.weights.iter().map(|v| v * (1.0 - lambda)).collect();
        match j {
            Some(j) => w[j] += lambda,
            None => w.push(lambda),
        }
        w
    }

    /// Lazy FW: a stored particle whose gap reaches `Phi / K`, if any, with its line-search step.
    fn lazy_reuse(&mut self, kernel: &StepKernel, x: &Tensor<2>) -> Option<(usize, f64)> {
        let phi = self.phi?;
        let gaps = self.gaps(kernel, x, x.clone());
        let (j, gap) =
            gaps.iter().cloned().enumerate().fold((0, f64::NEG_INFINITY), |a, b| if b.1 > a.1 { b } else { a });
        (gap >= phi / self.config.lazy_accuracy && gap > 0.0).then_some((j, gap))
    }

    /// Grows the set by one (or, lazily, reweights it).
    fn grow(&mut self, ctx: &mut StepContext<'_>, particles: &mut Particles) -> Result<(), InferError> {
        let step = ctx.step;
        let x = particles.positions.clone();
        let n = x.dims()[0];
        let kernel = self.step_kernel(&x)?;
        self.kernel_used = kernel.describe();

        if self.config.lazy
            && let Some((j, gap)) = self.lazy_reuse(&kernel, &x)
        {
            // Line search towards stored atom j (or the constant step).
            let k = host_matrix(&kernel.gram(x.clone(), x.clone()));
            let kw_j: f64 = (0..n).map(|i| k[j * n + i] * self.weights[i]).sum();
            let wkw: f64 =
                (0..n).map(|i| (0..n).map(|l| self.weights[i] * k[i * n + l] * self.weights[l]).sum::<f64>()).sum();
            let lambda = match self.config.step_rule {
                StepRule::Constant => 1.0 / (n + 1) as f64,
                _ => (gap / (wkw - 2.0 * kw_j + k[j * n + j]).max(1e-300)).clamp(0.0, 1.0),
            };
            self.weights = self.moved_towards(Some(j), lambda);
            self.stats.lazy_reuses += 1;
            *particles = self.particles(x);
            return Ok(());
        }

        let new = match self.candidates.clone() {
            Some(c) => self.exact_lmo(&kernel, &x, &c)?,
            None => self.approx_lmo(&kernel, &x, ctx.rng),
        };
        if !all_finite(&new) {
            return Err(InferError::Numerical(format!(
                "step {step}: the Approx-LMO for particle {} produced a non-finite point (lower `lmo-lr`)",
                n + 1
            )));
        }
        if self.config.lazy {
            let gap = self.gaps(&kernel, &x, new.clone())[0];
            let phi = self.phi.unwrap_or(0.0);
            if gap < phi / self.config.lazy_accuracy {
                // A negative call: tighten the criterion, keep the set.
                self.phi = Some(phi / 2.0);
                self.stats.lazy_negative_calls += 1;
                *particles = self.particles(x);
                return Ok(());
            }
        }
        self.join(ctx, &kernel, x, new, particles)
    }

    /// `new` `[1, d]` joins the set `x`: its score, and the new weights.
    fn join(
        &mut self,
        ctx: &mut StepContext<'_>,
        kernel: &StepKernel,
        x: Tensor<2>,
        new: Tensor<2>,
        particles: &mut Particles,
    ) -> Result<(), InferError> {
        let step = ctx.step;
        let n = x.dims()[0];
        let all = Tensor::cat(vec![x, new.clone()], 0);
        if self.keeps_scores() {
            let s = score(ctx.model, new, ctx.batch)?;
            check_score(&s.log_prob, &s.grad, "").map_err(|e| {
                InferError::Numerical(format!("step {step}: the new particle {} from the Approx-LMO: {e}", n + 1))
            })?;
            let scores = self.scores.take().expect("scores set at step 0");
            self.scores = Some(Tensor::cat(vec![scores, s.grad], 0));
        }
        self.weights = self.new_weights(kernel, &all, step)?;
        *particles = self.particles(all);
        Ok(())
    }
}

/// Bayesian-quadrature weights `w = (K + jitter I)^-1 z` of a Gram matrix `k` (row-major
/// `n x n`) and embedding `z`, with the jitter actually used (`rel` times the mean diagonal,
/// grown 100-fold per retry, 4 tries).
pub fn bq_weights(k: &[f64], z: &[f64], n: usize, rel: f64) -> Result<(Vec<f64>, f64), CholeskyError> {
    if z.len() != n {
        return Err(CholeskyError::Malformed(format!("embedding of length {} for {n} particles", z.len())));
    }
    let chol = Cholesky::factor_with_jitter(k, n, rel, JITTER_TRIES)?;
    Ok((chol.solve(z), chol.jitter))
}

/// The line-search step towards the last of `n + 1` atoms: `lambda = <mu - mu_p, mu - g> /
/// ||mu - g||^2` clipped to `[0, 1]`, from the Gram matrix `k` and embedding `z` of all `n + 1`
/// and the weights `w` of the first `n`.
pub fn line_search(k: &[f64], z: &[f64], w: &[f64], n: usize) -> f64 {
    let n1 = n + 1;
    let kw_new: f64 = (0..n).map(|i| k[n * n1 + i] * w[i]).sum();
    let wkw: f64 = (0..n).map(|i| (0..n).map(|j| w[i] * k[i * n1 + j] * w[j]).sum::<f64>()).sum();
    let wz: f64 = (0..n).map(|i| w[i] * z[i]).sum();
    let numerator = wkw - kw_new - wz + z[n];
    let denominator = wkw - 2.0 * kw_new + k[n * n1 + n];
    if denominator <= 0.0 { 0.0 } else { (numerator / denominator).clamp(0.0, 1.0) }
}

fn host_matrix(t: &Tensor<2>) -> Vec<f64> {
    to_vec_f32(t).into_iter().map(f64::from).collect()
}

/// The index of the smallest value outside `skip` (NaN never wins; 0 when nothing qualifies).
fn argmin(values: &[f64], skip: &[usize]) -> usize {
    let mut best: Option<(usize, f64)> = None;
    for (i, &v) in values.iter().enumerate() {
        if skip.contains(&i) || v.is_nan() {
            continue;
        }
        if best.is_none_or(|(_, b)| v < b) {
            best = Some((i, v));
        }
    }
    best.map_or(0, |(i, _)| i)
}

/// The rows `idx` of `x`, in that order.
pub(crate) fn rows(x: &Tensor<2>, idx: &[usize]) -> Tensor<2> {
    let i: Vec<i64> = idx.iter().map(|&r| r as i64).collect();
    x.clone().select(0, Tensor::<1, Int>::from_data(TensorData::new(i, [idx.len()]), &x.device()))
}

/// Errors on a non-finite log density or score (one host read).
fn check_score(log_prob: &Tensor<1>, grad: &Tensor<2>, what: &str) -> Result<(), InferError> {
    let lp = to_vec_f32(log_prob);
    let sep = if what.is_empty() { "" } else { ": " };
    if let Some(v) = lp.iter().find(|v| !v.is_finite()) {
        return Err(InferError::Numerical(format!("{what}{sep}the log density is non-finite ({v})")));
    }
    if !all_finite(grad) {
        return Err(InferError::Numerical(format!("{what}{sep}the score is non-finite")));
    }
    Ok(())
}

impl Engine for MmdFw {
    fn name(&self) -> &'static str {
        "mmd-fw"
    }

    fn init(&mut self, particles: &Particles) -> Result<(), InferError> {
        require_growth_target("MMD-FW", particles)?;
        if let Some(c) = &self.candidates
            && c.dims()[1] != particles.dim()
        {
            return Err(InferError::setting("candidates", "candidates and particles differ in dimension"));
        }
        if self.candidates.is_some() && self.config.self_score {
            return Err(InferError::setting("self-score", "the exact LMO over candidates has no search to spread"));
        }
        if self.candidates.is_some() && self.reference.is_none() {
            return Err(InferError::setting(
                "candidates",
                "the exact LMO needs the target's embedding (with_reference)",
            ));
        }
        Ok(())
    }

    fn step(&mut self, ctx: &mut StepContext<'_>, particles: &mut Particles) -> Result<(), InferError> {
        if self.config.self_score && (self.count() == 0 || self.count() < self.target()) {
            return self.step_spread(ctx, particles);
        }
        if self.count() == 0 {
            return self.start(ctx, particles);
        }
        if self.count() >= self.target() {
            // The set is complete (N particles): later steps leave it alone.
            self.stats.idle_steps += 1;
            return Ok(());
        }
        self.grow(ctx, particles)
    }

    fn save(&self) -> EngineState {
        let mut state = EngineState::default();
        if let Some(p) = &self.pool {
            state.put_tensor("pool", p);
        }
        if let Some(s) = &self.scores {
            state.put_tensor("scores", s);
        }
        if let Some(c) = &self.cache {
            state.put_tensor("cache", c);
        }
        if let Some(r) = &self.reference {
            state.put_tensor("reference.points", &r.points);
            state.put_tensor("reference.weights", &r.weights);
        }
        if let Some(f) = &self.rff {
            f.save(&mut state, "rff.");
        }
        if !self.weights.is_empty() {
            let device = self.pool.as_ref().map(Tensor::device).unwrap_or_default();
            state.put_tensor("weights", &self.weights_tensor(&device));
        }
        if let Some(phi) = self.phi {
            state.put_scalar("phi", phi);
        }
        state.put_scalar("lmo_calls", self.stats.lmo_calls as f64);
        if let Some(a) = &self.cache_adapter {
            a.save(&mut state, "cache_adapter.");
        }
        if let Some(search) = &self.search {
            state.put_tensor("search.y", &search.y);
            state.put_scalar("search.done", search.done as f64);
            search.adam.save(&mut state, "search.adam.");
        }
        state
    }

    fn load(&mut self, state: &EngineState, device: &Device) -> Result<(), InferError> {
        self.pool = state.tensor_opt("pool", device)?;
        self.scores = state.tensor_opt("scores", device)?;
        self.cache = state.tensor_opt("cache", device)?;
        let points = state.tensor_opt::<2>("reference.points", device)?;
        let weights = state.tensor_opt::<1>("reference.weights", device)?;
        if let (Some(points), Some(weights)) = (points, weights) {
            self.reference = Some(MeanEmbedding { points, weights });
        }
        if state.tensors.contains_key("rff.freq") {
            self.rff = Some(RandomFourierFeatures::load(state, "rff.", device)?);
        }
        self.weights = state
            .tensor_opt::<1>("weights", device)?
            .map(|w| to_vec_f32(&w).into_iter().map(f64::from).collect())
            .unwrap_or_default();
        self.phi = state.scalars.get("phi").copied();
        self.stats.lmo_calls = state.scalars.get("lmo_calls").copied().unwrap_or(0.0) as usize;
        if let Some(a) = self.cache_adapter.as_mut() {
            a.load(state, "cache_adapter.", device)?;
        }
        self.search = match state.tensor_opt::<2>("search.y", device)? {
            Some(y) => {
                let lr = if self.weights.is_empty() { self.config.map_lr } else { self.config.lmo_lr };
                let mut adam = AdapterConfig::adam(lr).build()?;
                adam.load(state, "search.adam.", device)?;
                let done = state.scalars.get("search.done").copied().unwrap_or(0.0) as usize;
                Some(SpreadSearch { y, adam, done, kernel: None })
            }
            None => None,
        };
        Ok(())
    }

    fn report(&self) -> serde_json::Value {
        serde_json::json!({
            "kernel": self.kernel_used,
            "step_rule": self.config.step_rule,
            "embedding": if self.reference.is_some() && self.config.embedding == EmbeddingSource::Particles {
                "reference".to_string()
            } else {
                format!("{:?}", self.config.embedding).to_lowercase()
            },
            "particles": self.count(),
            "target_particles": self.target(),
            "weights": self.weights,
            "self_score": self.config.self_score,
            "search_iterations_done": self.search.as_ref().map(|s| s.done),
            "l_steps": self.config.l_steps,
            "cache": self.config.cache,
            "cache_left": self.cache.as_ref().map_or(0, |c| c.dims()[0]),
            "lazy": self.config.lazy,
            "rff": self.config.rff,
            "stats": self.stats,
        })
    }
}
