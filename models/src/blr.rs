//! Bayesian logistic regression (Liu & Wang 2016): `y ~ Bernoulli(sigmoid(w . x + b))`,
//! `w, b ~ N(0, 1/alpha)`, `alpha ~ Gamma(1, 0.01)` sampled as `log alpha`.
//! Logits for all particles are one fused particle-batched dense layer (`d -> 1`, no
//! activation): one product `[B, d] x [d, n]` and one autodiff node.

use burn::module::Module;
use burn::tensor::{Device, Tensor, activation};
use parvi_model::dist::{Bernoulli, Gamma, LogProb, Normal};
use parvi_model::layers::{Activation, DenseLayer};
use parvi_model::tensor_ops::{matrix_from_vec, to_vec_f64};
use parvi_model::{LogDensity, Minibatch, ModelError, ParamLayout};
use rand::SeedableRng;
use rand_distr::Distribution;

/// Shape `a0` of the Gamma prior on the weight precision `alpha`.
pub const ALPHA_A0: f64 = 1.0;
/// Rate `b0` of the Gamma prior on `alpha` (the reference initialisation draws with it as a scale).
pub const ALPHA_B0: f64 = 0.01;

/// Bayesian logistic regression, hierarchical Gaussian prior; a particle is `[w, b, log alpha]`.
#[derive(Module, Debug)]
pub struct LogisticRegression {
    /// `[rows, d]`
    x: Tensor<2>,
    /// `[rows, 1]` labels in {0, 1}
    y: Tensor<2>,
    rows: usize,
    features: usize,
    #[module(skip)]
    layout: ParamLayout,
    /// `w` and `b` as one `features -> 1` layer.
    #[module(skip)]
    logit_layer: DenseLayer,
}

impl LogisticRegression {
    /// The model on `rows x features` row-major inputs `x` and 0/1 labels `y`.
    pub fn new(x: &[f64], y: &[f64], features: usize, device: &Device) -> Result<Self, ModelError> {
        let rows = y.len();
        if rows == 0 || features == 0 || x.len() != rows * features {
            return Err(ModelError::InvalidParameter {
                dist: "LogisticRegression",
                name: "data",
                reason: format!("need rows x features values with rows >= 1, got {} for {rows} labels", x.len()),
            });
        }
        if let Some(bad) = y.iter().find(|&&v| v != 0.0 && v != 1.0) {
            return Err(ModelError::InvalidParameter {
                dist: "LogisticRegression",
                name: "labels",
                reason: format!("labels must be 0 or 1, found {bad}"),
            });
        }
        if x.iter().any(|v| !v.is_finite()) {
            return Err(ModelError::InvalidParameter {
                dist: "LogisticRegression",
                name: "data",
                reason: "features contain NaN or infinity".into(),
            });
        }
        let layout = ParamLayout::new().real("w", &[features])?.real("b", &[])?.positive("alpha", &[])?;
        let logit_layer = DenseLayer::new(0, features, 1, Activation::Identity)?;
        Ok(Self {
            x: matrix_from_vec(x.iter().map(|&v| v as f32).collect(), rows, features, device),
            y: matrix_from_vec(y.iter().map(|&v| v as f32).collect(), rows, 1, device),
            rows,
            features,
            layout,
            logit_layer,
        })
    }

    /// The particle layout: `w` `[features]`, `b` and positive `alpha`.
    pub fn layout(&self) -> &ParamLayout {
        &self.layout
    }

    /// Reference initialisation (Liu & Wang's code): `alpha ~ Gamma(a0, scale b0)` as NumPy's
    /// `gamma(a0, b0)` draws it (mean 0.01), then `w, b ~ N(0, 1/alpha)`: wide particles that
    /// SVGD contracts. `[n, dim]`.
    pub fn init(&self, n: usize, seed: u64, device: &Device) -> Tensor<2> {
        let dim = self.layout.dim();
        let mut rng = chacha20::ChaCha8Rng::seed_from_u64(seed);
        let alpha = rand_distr::Gamma::new(ALPHA_A0, ALPHA_B0).expect("valid gamma");
        let mut values = vec![0f32; n * dim];
        for row in values.chunks_mut(dim) {
            let a: f64 = alpha.sample(&mut rng).max(1e-30);
            let std = rand_distr::Normal::new(0.0, 1.0 / a.sqrt()).expect("finite std");
            for v in &mut row[..dim - 1] {
                *v = std.sample(&mut rng) as f32;
            }
            row[dim - 1] = a.ln() as f32;
        }
        matrix_from_vec(values, n, dim, device)
    }

    /// Logits `[B, n]` of inputs `[B, d]` under every particle.
    pub fn logits(&self, particles: Tensor<2>, x: Tensor<2>) -> Tensor<2> {
        let (n, b) = (particles.dims()[0], x.dims()[0]);
        self.logit_layer.forward_shared(particles, x).reshape([b, n])
    }

    /// Particle-averaged probability of label 1 for each row of `x` (row-major `[rows, d]`).
    pub fn predict_proba(&self, particles: Tensor<2>, x: &[f64], device: &Device) -> Vec<f64> {
        let rows = x.len() / self.features;
        if rows == 0 {
            return Vec::new();
        }
        let x = matrix_from_vec(x.iter().map(|&v| v as f32).collect(), rows, self.features, device);
        let p = activation::sigmoid(self.logits(particles, x)).mean_dim(1);
        to_vec_f64(&p)
    }
}

impl LogDensity for LogisticRegression {
    fn dim(&self) -> usize {
        self.layout.dim()
    }

    fn data_len(&self) -> Option<usize> {
        Some(self.rows)
    }

    fn log_prob(&self, particles: Tensor<2>, batch: Option<&Minibatch>) -> Tensor<1> {
        let n = particles.dims()[0];
        let p = self.layout.unpack(particles.clone());
        let alpha: Tensor<1> = p.get("alpha").expect("layout block");
        let (x, scale) = Minibatch::select(batch, self.x.clone());
        let (y, _) = Minibatch::select(batch, self.y.clone());
        let lik = Bernoulli::from_logits(self.logits(particles.clone(), x)).log_prob(y).sum_dim(0).reshape([n]);
        lik.mul_scalar(scale) + self.prior_terms(particles, alpha, p.log_jacobian())
    }

    fn log_prior(&self, particles: Tensor<2>) -> Option<Tensor<1>> {
        let p = self.layout.unpack(particles.clone());
        let alpha: Tensor<1> = p.get("alpha").expect("layout block");
        Some(self.prior_terms(particles, alpha, p.log_jacobian()))
    }
}

impl LogisticRegression {
    /// `w, b ~ N(0, 1/alpha)`, `alpha ~ Gamma(a0, b0)` and the log-Jacobian of `alpha = e^u`:
    /// the terms of the log-joint that depend on no row.
    fn prior_terms(&self, particles: Tensor<2>, alpha: Tensor<1>, log_jacobian: Tensor<1>) -> Tensor<1> {
        let n = particles.dims()[0];
        let weights = particles.narrow(1, 0, self.features + 1);
        let prior = Normal::with_precision(0.0, alpha.clone().reshape([n, 1])).log_prob_sum(weights, 1).reshape([n]);
        let hyper = Gamma::new(ALPHA_A0, ALPHA_B0).expect("valid prior").log_prob(alpha);
        prior + hyper + log_jacobian
    }
}

/// Rows per block of [`synthetic_rows`]: each block is drawn from its own seeded stream, so any
/// range of rows is drawn without the rows before it.
const SYNTHETIC_BLOCK: usize = 4096;

/// Rows `rows` of a synthetic logistic-regression data set of `features` standard normal
/// features with labels `y ~ Bernoulli(sigmoid(w . x + b))` for a fixed `w` (entries
/// `+-1 / sqrt(features)` alternating, so that the logits have unit scale) and `b = 0.5`: the
/// row-major inputs and the 0/1 labels. Row `i` depends on `seed` and `i` alone (blocks of
/// 4096 rows, each from a stream seeded by its index), so every process of a run with sharded
/// rows draws its own share and all shares make up the one data set.
pub fn synthetic_rows(rows: std::ops::Range<usize>, features: usize, seed: u64) -> (Vec<f64>, Vec<f64>) {
    let mut x = Vec::with_capacity(rows.len() * features);
    let mut y = Vec::with_capacity(rows.len());
    let w: Vec<f64> = (0..features).map(|j| if j % 2 == 0 { 1.0 } else { -1.0 } / (features as f64).sqrt()).collect();
    let normal = rand_distr::StandardNormal;
    let first_block = rows.start / SYNTHETIC_BLOCK;
    let last_block = rows.end.div_ceil(SYNTHETIC_BLOCK);
    for block in first_block..last_block {
        let mut rng = chacha20::ChaCha8Rng::seed_from_u64(seed ^ (block as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let start = block * SYNTHETIC_BLOCK;
        for i in start..start + SYNTHETIC_BLOCK {
            let row: Vec<f64> = (0..features).map(|_| normal.sample(&mut rng)).collect();
            let u: f64 = rand::RngExt::random(&mut rng);
            if !rows.contains(&i) {
                continue;
            }
            let logit: f64 = row.iter().zip(&w).map(|(a, b)| a * b).sum::<f64>() + 0.5;
            y.push(f64::from(u < 1.0 / (1.0 + (-logit).exp())));
            x.extend(row);
        }
    }
    (x, y)
}

/// Test accuracy (threshold 1/2) and mean test log-likelihood of particle-averaged probabilities.
pub fn classification_score(proba: &[f64], labels: &[f64]) -> (f64, f64) {
    let rows = labels.len().max(1) as f64;
    let correct = proba.iter().zip(labels).filter(|(p, y)| (**p >= 0.5) == (**y == 1.0)).count();
    let ll: f64 = proba
        .iter()
        .zip(labels)
        .map(|(p, y)| {
            let p = p.clamp(1e-12, 1.0 - 1e-12);
            if *y == 1.0 { p.ln() } else { (1.0 - p).ln() }
        })
        .sum();
    (correct as f64 / rows, ll / rows)
}
