//! Bayesian neural networks for regression and classification (Liu & Wang 2016;
//! Hernandez-Lobato & Adams 2015), of any depth, evaluated for all particles at once.
//!
//! The network is a chain of particle-batched dense layers ([`parvi_model::layers`]): each layer
//! is one fused product for all particles. Every weight and bias is `~ N(0, 1/lambda)` with
//! `lambda ~ Gamma(a0, b0)` sampled as `log lambda` (or a fixed `lambda`). The likelihood:
//! - regression: `y ~ N(f(x; W), 1/gamma)`, `gamma ~ Gamma(a0, b0)` sampled as `log gamma`;
//! - two classes: `y ~ Bernoulli(sigmoid(f(x; W)))`, one output unit;
//! - `k > 2` classes: `y ~ Categorical(softmax(f(x; W)))`, `k` output units.
//!
//! The defaults ([`BnnConfig::default`]) are the reference UCI model: one hidden layer of 50 ReLU
//! units, regression, the hierarchical prior.

use burn::module::Module;
use burn::tensor::{Device, Tensor, activation};
use parvi_model::density::FunctionMap;
use parvi_model::dist::{Bernoulli, Gamma, LogProb, Normal};
use parvi_model::layers::{Activation, DenseStack, LayerOps};
use parvi_model::tensor_ops::matrix_from_vec;
use parvi_model::{LogDensity, Minibatch, ModelError, ParamLayout, fused};
use rand::SeedableRng;
use rand_distr::Distribution;
use serde::{Deserialize, Serialize};

/// ln(2 pi).
const LN_2PI: f64 = 1.837_877_066_409_345_3;

/// Prior hyperparameters of the reference code: `Gamma(1, 0.1)` for both precisions.
pub const A0: f64 = 1.0;
/// Rate `b0` of the Gamma prior on both precisions (the reference initialisation draws
/// with it as a scale).
pub const B0: f64 = 0.1;

/// The prior precision `lambda` of the weights.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind", content = "lambda")]
pub enum WeightPrior {
    /// `lambda ~ Gamma(a0, b0)`, sampled (the reference). On very small data sets the joint
    /// density grows without bound as `lambda -> inf, w -> 0`, and particles collapse there.
    Hierarchical,
    /// A fixed `lambda`: `w ~ N(0, 1/lambda)`; the particle has no `lambda` coordinate.
    Fixed(f64),
}

/// What the network predicts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum BnnTask {
    /// A real target with Gaussian noise of sampled precision `gamma`; one output unit.
    Regression,
    /// Class indices `0..classes`: Bernoulli on one logit for two classes, categorical on
    /// `classes` softmax outputs otherwise.
    Classification {
        /// Number of classes (at least 2).
        classes: usize,
    },
}

/// A BNN's architecture, likelihood and prior.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct BnnConfig {
    /// Units of each hidden layer, input side first; empty for a linear model.
    pub hidden: Vec<usize>,
    /// The hidden layers' activation (the output layer has none).
    pub activation: Activation,
    /// Regression or classification.
    pub task: BnnTask,
    /// The weights' prior precision.
    pub prior: WeightPrior,
    /// Fused layers, sums of squares and precision terms (the default: one autodiff node each,
    /// [`parvi_model::layers`], [`parvi_model::fused`]) or ordinary tensor operations (the
    /// reference they are timed and tested against).
    pub layer_ops: LayerOps,
}

impl Default for BnnConfig {
    /// The reference UCI model: one hidden layer of 50 ReLU units, regression, hierarchical prior.
    fn default() -> Self {
        Self {
            hidden: vec![50],
            activation: Activation::Relu,
            task: BnnTask::Regression,
            prior: WeightPrior::Hierarchical,
            layer_ops: LayerOps::Fused,
        }
    }
}

impl BnnConfig {
    /// Output units: one for regression and for two classes, `classes` otherwise.
    pub fn outputs(&self) -> usize {
        match self.task {
            BnnTask::Classification { classes } if classes > 2 => classes,
            _ => 1,
        }
    }

    fn check(&self) -> Result<(), ModelError> {
        let bad = |name, reason: String| Err(ModelError::InvalidParameter { dist: "Bnn", name, reason });
        if let Some(l) = self.hidden.iter().position(|&h| h == 0) {
            return bad("hidden", format!("hidden layer {} has 0 units: need >= 1", l + 1));
        }
        if let WeightPrior::Fixed(l) = self.prior
            && !(l > 0.0 && l.is_finite())
        {
            return bad("lambda", format!("must be > 0, got {l}"));
        }
        if let BnnTask::Classification { classes } = self.task
            && classes < 2
        {
            return bad("classes", format!("need >= 2 classes, got {classes}"));
        }
        Ok(())
    }
}

/// What a BNN's particles say about a batch of rows, every particle separately (no loop over
/// particles: one network evaluation).
#[derive(Clone, Debug)]
// Tensor handles, made once per batch of rows: boxing the larger variant would buy nothing.
#[allow(clippy::large_enum_variant)]
pub enum BnnPrediction {
    /// Regression, on the normalised scale of the training target.
    Regression {
        /// `[n, rows]`: each particle's network output.
        mean: Tensor<2>,
        /// `[n]`: each particle's noise precision `gamma`.
        noise_precision: Tensor<1>,
    },
    /// Classification.
    Classification {
        /// `[n, rows, classes]`: each particle's class probabilities (two columns, `1 - p` and
        /// `p`, for a binary network).
        probabilities: Tensor<3>,
    },
}

/// A Bayesian neural network, evaluated for all particles at once.
#[derive(Module, Debug)]
pub struct Bnn {
    /// `[rows, d]` normalised inputs.
    x: Tensor<2>,
    /// Regression: `[rows, 1]` normalised targets. Two classes: `[rows, 1]` labels in {0, 1}.
    /// More classes: `[rows, classes]` one-hot labels.
    y: Tensor<2>,
    rows: usize,
    inputs: usize,
    #[module(skip)]
    net: DenseStack,
    #[module(skip)]
    layout: ParamLayout,
    #[module(skip)]
    config: BnnConfig,
    /// Per feature, the training inputs' smallest and largest value (normalised scale).
    #[module(skip)]
    input_range: Vec<(f64, f64)>,
}

impl Bnn {
    /// The reference regression BNN on `rows x inputs` row-major data with `hidden` ReLU units.
    pub fn new(x: &[f64], y: &[f64], inputs: usize, hidden: usize, device: &Device) -> Result<Self, ModelError> {
        Self::with_prior(x, y, inputs, hidden, WeightPrior::Hierarchical, device)
    }

    /// A one-hidden-layer regression BNN with the given weight prior.
    pub fn with_prior(
        x: &[f64],
        y: &[f64],
        inputs: usize,
        hidden: usize,
        prior: WeightPrior,
        device: &Device,
    ) -> Result<Self, ModelError> {
        Self::from_config(x, y, inputs, &BnnConfig { hidden: vec![hidden], prior, ..BnnConfig::default() }, device)
    }

    /// A BNN on `rows x inputs` row-major inputs `x` and targets `y` (class indices `0, 1, ...`
    /// for classification) as `config` describes.
    pub fn from_config(
        x: &[f64],
        y: &[f64],
        inputs: usize,
        config: &BnnConfig,
        device: &Device,
    ) -> Result<Self, ModelError> {
        config.check()?;
        let rows = y.len();
        let bad_data = |reason: String| ModelError::InvalidParameter { dist: "Bnn", name: "data", reason };
        if rows == 0 || inputs == 0 || x.len() != rows * inputs {
            return Err(bad_data(format!(
                "need rows x inputs values with rows >= 1, got {} values for {rows} targets",
                x.len()
            )));
        }
        if let Some(i) = x.iter().position(|v| !v.is_finite()) {
            return Err(bad_data(format!("input row {} column {} is {}", i / inputs, i % inputs, x[i])));
        }
        if let Some(r) = y.iter().position(|v| !v.is_finite()) {
            return Err(bad_data(format!("target of row {r} is {}", y[r])));
        }
        let outputs = config.outputs();
        let targets = match config.task {
            BnnTask::Regression => y.iter().map(|&v| v as f32).collect(),
            BnnTask::Classification { classes } => {
                if let Some(r) = y.iter().position(|&v| v.fract() != 0.0 || v < 0.0 || v >= classes as f64) {
                    return Err(ModelError::InvalidParameter {
                        dist: "Bnn",
                        name: "labels",
                        reason: format!(
                            "label of row {r} is {}: classification labels are class indices 0..{}",
                            y[r],
                            classes - 1
                        ),
                    });
                }
                if outputs == 1 {
                    y.iter().map(|&v| v as f32).collect()
                } else {
                    let mut onehot = vec![0f32; rows * outputs];
                    for (r, &v) in y.iter().enumerate() {
                        onehot[r * outputs + v as usize] = 1.0;
                    }
                    onehot
                }
            }
        };
        let mut sizes = vec![inputs];
        sizes.extend(&config.hidden);
        sizes.push(outputs);
        let net = DenseStack::new(0, &sizes, config.activation, Activation::Identity)?.with_ops(config.layer_ops);
        let mut layout = ParamLayout::new();
        let last = net.layers().len();
        for (l, layer) in net.layers().iter().enumerate() {
            // Output-major weights `[outputs, inputs]`: all particles' weights of a layer are
            // rows of the particle matrix the fused layer reads in place. A single-output last
            // layer keeps the reference's names and shapes (`w2` `[hidden]`, `b2` scalar).
            let (w, b) = (format!("w{}", l + 1), format!("b{}", l + 1));
            layout = if l + 1 == last && layer.outputs() == 1 {
                layout.real(&w, &[layer.inputs()])?.real(&b, &[])?
            } else {
                layout.real(&w, &[layer.outputs(), layer.inputs()])?.real(&b, &[layer.outputs()])?
            };
        }
        if config.task == BnnTask::Regression {
            layout = layout.positive("gamma", &[])?;
        }
        if config.prior == WeightPrior::Hierarchical {
            layout = layout.positive("lambda", &[])?;
        }
        Ok(Self {
            x: matrix_from_vec(x.iter().map(|&v| v as f32).collect(), rows, inputs, device),
            y: matrix_from_vec(targets, rows, if outputs == 1 { 1 } else { outputs }, device),
            rows,
            inputs,
            net,
            layout,
            config: config.clone(),
            input_range: (0..inputs)
                .map(|c| {
                    x.iter()
                        .skip(c)
                        .step_by(inputs)
                        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| (lo.min(v), hi.max(v)))
                })
                .collect(),
        })
    }

    /// A network of `config` on `inputs` features for prediction from saved particles
    /// ([`crate::bnn_posterior`]): [`Bnn::predict`] reads only the particles and the inputs.
    /// It holds a single all-zero row as data, so it is not a posterior to fit.
    pub fn without_data(inputs: usize, config: &BnnConfig, device: &Device) -> Result<Self, ModelError> {
        Self::from_config(&vec![0.0; inputs], &[0.0], inputs, config, device)
    }

    /// The architecture, likelihood and prior.
    pub fn config(&self) -> &BnnConfig {
        &self.config
    }

    /// The network's layers, as they read the particles.
    pub fn network(&self) -> &DenseStack {
        &self.net
    }

    /// Input features.
    pub fn inputs(&self) -> usize {
        self.inputs
    }

    /// Column of `log gamma` in a particle (regression: the column after the weights).
    pub fn log_gamma_column(&self) -> usize {
        self.weight_count()
    }

    /// The particle layout: `w1`, `b1`, ..., the last layer's `wL`, `bL`, then positive `gamma`
    /// (regression) and `lambda` (hierarchical prior).
    pub fn layout(&self) -> &ParamLayout {
        &self.layout
    }

    /// Number of network weights and biases (the particle minus the log-precisions).
    pub fn weight_count(&self) -> usize {
        self.net.param_count()
    }

    /// Network outputs `[B, n, outputs]` for inputs `[B, d]` and particles `[n, dim]`.
    pub fn outputs(&self, particles: Tensor<2>, x: Tensor<2>) -> Tensor<3> {
        self.net.forward(particles, x)
    }

    /// Network outputs `[B, n]` for inputs `[B, d]` and particles `[n, dim]` of a single-output
    /// network (regression, two classes); with `k` outputs, `[B, n k]` with particle `i`'s in
    /// columns `i k .. (i + 1) k`.
    pub fn forward(&self, particles: Tensor<2>, x: Tensor<2>) -> Tensor<2> {
        let out = self.outputs(particles, x);
        let [b, n, k] = out.dims();
        out.reshape([b, n * k])
    }

    /// Every particle's prediction for inputs `x` `[rows, d]` (normalised like the training
    /// inputs): one network evaluation for all particles and rows. Memory grows as
    /// `rows x particles x widest layer`: give large inputs in chunks of rows.
    pub fn predict(&self, particles: Tensor<2>, x: Tensor<2>) -> BnnPrediction {
        let particles = particles.detach();
        let out = self.outputs(particles.clone(), x).swap_dims(0, 1); // [n, rows, outputs]
        let [n, rows, k] = out.dims();
        match self.config.task {
            BnnTask::Regression => {
                let g = self.log_gamma_column();
                BnnPrediction::Regression {
                    mean: out.reshape([n, rows]),
                    noise_precision: particles.narrow(1, g, 1).exp().reshape([n]),
                }
            }
            BnnTask::Classification { .. } if k == 1 => {
                let p = activation::sigmoid(out);
                BnnPrediction::Classification {
                    probabilities: Tensor::cat(vec![p.clone().neg().add_scalar(1.0), p], 2),
                }
            }
            BnnTask::Classification { .. } => {
                BnnPrediction::Classification { probabilities: activation::softmax(out, 2) }
            }
        }
    }

    /// [`Bnn::predict`] on row-major host inputs `[rows, d]`, checked: a width that is not a
    /// multiple of the inputs, or a non-finite value, is an error naming the row.
    pub fn predict_rows(&self, particles: Tensor<2>, x: &[f64], device: &Device) -> Result<BnnPrediction, ModelError> {
        let bad = |reason: String| ModelError::InvalidParameter { dist: "Bnn", name: "inputs", reason };
        if !x.len().is_multiple_of(self.inputs) {
            return Err(bad(format!("{} values are not rows of {} inputs", x.len(), self.inputs)));
        }
        if let Some(i) = x.iter().position(|v| !v.is_finite()) {
            return Err(bad(format!("row {} column {} is {}", i / self.inputs, i % self.inputs, x[i])));
        }
        let rows = x.len() / self.inputs;
        Ok(self.predict(particles, matrix_from_vec(x.iter().map(|&v| v as f32).collect(), rows, self.inputs, device)))
    }

    /// Reference initialisation: `W ~ N(0, 1/(fan_in + 1))`, biases 0, `lambda ~ Gamma(a0, scale b0)`,
    /// and for regression `gamma = 1 / MSE` of the initial network on up to 1000 training rows.
    /// `[n, dim]`.
    pub fn init(&self, n: usize, seed: u64, device: &Device) -> Result<Tensor<2>, ModelError> {
        if n == 0 {
            return Err(ModelError::InvalidParameter {
                dist: "the BNN's initial particles",
                name: "particles",
                reason: "need at least one particle, got 0".into(),
            });
        }
        let dim = self.layout.dim();
        let mut rng = chacha20::ChaCha8Rng::seed_from_u64(seed);
        let draws: Vec<rand_distr::Normal<f64>> = self
            .net
            .layers()
            .iter()
            .map(|l| rand_distr::Normal::new(0.0, 1.0 / ((l.inputs() + 1) as f64).sqrt()).expect("valid std"))
            .collect();
        // As the reference code: NumPy's `gamma(a0, b0)` takes (shape, *scale*), so the initial
        // lambda has mean a0 b0 = 0.1 (a weak prior on the weights), not the prior's mean
        // a0 / b0 = 10. With the prior's mean the weights start strongly shrunk and SVGD's 20
        // particles stay near the shrunk mode: boston's RMSE over 5 splits is 3.5 instead of 2.75.
        let lambda = rand_distr::Gamma::new(A0, B0).expect("valid gamma");
        let mut values = vec![0f32; n * dim];
        for row in values.chunks_mut(dim) {
            for (layer, draw) in self.net.layers().iter().zip(&draws) {
                let start = layer.offset();
                for v in &mut row[start..start + layer.inputs() * layer.outputs()] {
                    *v = draw.sample(&mut rng) as f32;
                }
            }
            if self.config.prior == WeightPrior::Hierarchical {
                row[dim - 1] = (lambda.sample(&mut rng) as f32).ln();
            }
        }
        let particles = matrix_from_vec(values, n, dim, device);
        if self.config.task != BnnTask::Regression {
            return Ok(particles);
        }
        // log gamma = -log MSE of each initial network on (up to) the first 1000 rows.
        let m = self.rows.min(1000);
        let pred = self.forward(particles.clone(), self.x.clone().narrow(0, 0, m));
        let mse = (pred - self.y.clone().narrow(0, 0, m)).square().mean_dim(0).reshape([n, 1]);
        let log_gamma = mse.clamp_min(1e-8).log().neg();
        let g = self.log_gamma_column();
        Ok(particles.slice_assign([0..n, g..g + 1], log_gamma))
    }

    /// The log-likelihood of the (selected) rows for every particle, `[n]`, unscaled, and the
    /// sum of squared residuals `[n, 1]` for regression (its precision term is folded in with
    /// the prior's).
    fn likelihood(&self, particles: Tensor<2>, batch: Option<&Minibatch>) -> Likelihood {
        let n = particles.dims()[0];
        let (x, _) = Minibatch::select(batch, self.x.clone());
        let (y, _) = Minibatch::select(batch, self.y.clone());
        if self.config.task == BnnTask::Regression {
            // The network and its residual sum in one piece: one autodiff node when fused.
            return Likelihood::SumOfSquares(self.net.sum_squared_residuals(particles, x, y));
        }
        let out = self.outputs(particles, x); // [B, n, k]
        let [b, _, k] = out.dims();
        if k == 1 {
            let lik = Bernoulli::from_logits(out.reshape([b, n])).log_prob(y);
            Likelihood::LogLik(lik.sum_dim(0).reshape([n]))
        } else {
            let onehot = y.reshape([b, 1, k]);
            let lik = (activation::log_softmax(out, 2) * onehot).sum_dim(2).sum_dim(0);
            Likelihood::LogLik(lik.reshape([n]))
        }
    }
}

/// A batch's likelihood term: the Gaussian one as its sufficient statistic, the others as values.
enum Likelihood {
    SumOfSquares(Tensor<2>),
    LogLik(Tensor<1>),
}

impl LogDensity for Bnn {
    fn dim(&self) -> usize {
        self.layout.dim()
    }

    fn data_len(&self) -> Option<usize> {
        Some(self.rows)
    }

    fn function_map(&self) -> Option<&dyn FunctionMap> {
        Some(self)
    }

    /// The log-joint written on the raw coordinates (log gamma and log lambda, Jacobians folded
    /// in) from sums of squares per particle: with the scores by autodiff, every node of the
    /// graph costs a backward op, and this form has about a third of the nodes of the same
    /// density built from the layout and the distributions (`log_prob_dsl`, checked equal in
    /// the tests).
    fn log_prob(&self, particles: Tensor<2>, batch: Option<&Minibatch>) -> Tensor<1> {
        self.log_joint(particles, Some(batch))
    }

    /// The log-joint without the rows' terms: the weights' prior and the precisions' Gamma
    /// priors with their Jacobians (the noise precision's term with no rows, `c1 = a0, c2 = 0`).
    fn log_prior(&self, particles: Tensor<2>) -> Option<Tensor<1>> {
        Some(self.log_joint(particles, None))
    }
}

/// One sampled precision's term `c1 u - e^u (c2 s + b0) + constant` of the log-joint
/// (`fused::log_precision_terms`' coefficients).
struct PrecisionTerm {
    c1: f64,
    c2: f64,
    constant: f64,
}

/// The noise precision's term over `b` rows scaled by `scale`: the Gaussian likelihood of the
/// residual sum of squares with the Gamma(a0, b0) prior and the Jacobian folded in.
fn noise_term(b: f64, scale: f64, hyper_const: f64) -> PrecisionTerm {
    PrecisionTerm { c1: 0.5 * b * scale + A0, c2: 0.5 * scale, constant: hyper_const - 0.5 * b * LN_2PI * scale }
}

/// The weights' precision's term over `nw` weights (the hierarchical prior).
fn weight_term(nw: f64, hyper_const: f64) -> PrecisionTerm {
    PrecisionTerm { c1: 0.5 * nw + A0, c2: 0.5, constant: hyper_const - 0.5 * nw * LN_2PI }
}

impl Bnn {
    /// [`LogDensity::log_prob`] with the rows of `rows` (`Some(batch)`), or only the terms that
    /// depend on no row (`None`, [`LogDensity::log_prior`]).
    fn log_joint(&self, particles: Tensor<2>, rows: Option<Option<&Minibatch>>) -> Tensor<1> {
        let n = particles.dims()[0];
        let nw = self.weight_count();
        let batch = rows.flatten();
        let scale = batch.map_or(1.0, Minibatch::scale);
        let b = batch.map_or(self.rows, |mb| mb.len) as f64;
        let hyper_const = A0 * B0.ln() - parvi_model::dist::ln_gamma(A0);
        let nwf = nw as f64;
        if let (Some(batch), LayerOps::Fused, BnnTask::Regression, WeightPrior::Hierarchical) =
            (rows, self.config.layer_ops, self.config.task, self.config.prior)
        {
            // The default model: the network, its residual sum, the weights' sum of squares and
            // both precision terms (the coefficients of the general path below) as one autodiff node that
            // writes one gradient buffer.
            let (x, _) = Minibatch::select(batch, self.x.clone());
            let (y, _) = Minibatch::select(batch, self.y.clone());
            let (noise, weights) = (noise_term(b, scale, hyper_const), weight_term(nwf, hyper_const));
            let (c1, c2) = ([noise.c1, weights.c1], [noise.c2, weights.c2]);
            let constant = noise.constant + weights.constant;
            let terms = self.net.residual_precision_terms(particles, x, y, nw, Some(0..nw), &c1, &c2, B0);
            return terms.reshape([n]).add_scalar(constant);
        }
        let likelihood = rows.map(|batch| self.likelihood(particles.clone(), batch));
        let ssw = match self.config.layer_ops {
            LayerOps::Fused => fused::sum_squares_of_columns(particles.clone(), 0, nw),
            LayerOps::Plain => particles.clone().narrow(1, 0, nw).square().sum_dim(1),
        }; // [n, 1]
        // Each precision u = log gamma (noise) or log lambda (weights) enters as
        // c1 u - e^u (c2 s + b0) with s its sum of squares, the Gamma(a0, b0) prior and the
        // Jacobian folded in: one fused node for the k sampled precisions
        // (`fused::log_precision_terms`) instead of a dozen, each of which costs a backward op.
        let mut stats = Vec::with_capacity(2);
        let (mut c1, mut c2) = (Vec::with_capacity(2), Vec::with_capacity(2));
        let mut constant = 0.0;
        let mut lp_extra: Option<Tensor<1>> = None;
        match likelihood {
            Some(Likelihood::SumOfSquares(ssr)) => {
                let term = noise_term(b, scale, hyper_const);
                stats.push(ssr);
                c1.push(term.c1);
                c2.push(term.c2);
                constant += term.constant;
            }
            Some(Likelihood::LogLik(lik)) => lp_extra = Some(lik.mul_scalar(scale)),
            // The noise precision's Gamma prior and Jacobian alone: no rows, no residuals.
            None if self.config.task == BnnTask::Regression => {
                stats.push(Tensor::zeros([n, 1], &particles.device()));
                c1.push(A0);
                c2.push(0.0);
                constant += hyper_const;
            }
            None => {}
        }
        match self.config.prior {
            WeightPrior::Hierarchical => {
                let term = weight_term(nwf, hyper_const);
                stats.push(ssw);
                c1.push(term.c1);
                c2.push(term.c2);
                constant += term.constant;
            }
            WeightPrior::Fixed(l) => {
                // The weights' fixed-precision prior is not a precision term: added directly.
                constant += 0.5 * nwf * (l.ln() - LN_2PI);
                let prior = ssw.mul_scalar(-0.5 * l).reshape([n]);
                lp_extra = Some(match lp_extra {
                    Some(lik) => lik + prior,
                    None => prior,
                });
            }
        }
        let k = stats.len();
        let mut lp = if k == 0 {
            Tensor::zeros([n], &particles.device())
        } else {
            let stats = if k == 1 { stats.pop().expect("one statistic") } else { Tensor::cat(stats, 1) };
            match self.config.layer_ops {
                LayerOps::Fused => fused::log_precision_terms(particles, nw, stats, &c1, &c2, B0).reshape([n]),
                LayerOps::Plain => {
                    let device = particles.device();
                    let row = |c: &[f64]| matrix_from_vec(c.iter().map(|&v| v as f32).collect(), 1, k, &device);
                    let log_precisions = particles.narrow(1, nw, k); // [n, k]
                    let terms =
                        log_precisions.clone() * row(&c1) - log_precisions.exp() * (stats * row(&c2)).add_scalar(B0);
                    terms.sum_dim(1).reshape([n])
                }
            }
        };
        if let Some(extra) = lp_extra {
            lp = lp + extra;
        }
        lp.add_scalar(constant)
    }
}

/// The network's weights seen as the network: function-space particle methods read its outputs.
impl FunctionMap for Bnn {
    fn inputs(&self) -> usize {
        self.inputs
    }

    fn input_range(&self) -> Vec<(f64, f64)> {
        self.input_range.clone()
    }

    fn batch_inputs(&self, batch: Option<&Minibatch>) -> Tensor<2> {
        Minibatch::select(batch, self.x.clone()).0
    }

    /// `[n, m * outputs]`: particle `i`'s outputs at the `m` points, point-major.
    fn function_values(&self, particles: Tensor<2>, points: Tensor<2>) -> Tensor<2> {
        let out = self.outputs(particles, points).swap_dims(0, 1); // [n, m, k]
        let [n, m, k] = out.dims();
        out.reshape([n, m * k])
    }

    /// Networks from the prior; with the hierarchical prior, given `lambda` at its prior mean
    /// `a0 / b0`: the weights' marginal prior (a Student t with `2 a0 = 2` degrees of freedom)
    /// has no variance, and a Gaussian fitted to its draws would be set by the smallest `lambda`
    /// drawn (one of 100 draws near 0.1 makes the outputs' variance thousands).
    fn prior_draws(&self, k: usize, seed: u64) -> Option<Tensor<2>> {
        Some(self.prior_networks(k, seed, true))
    }
}

impl Bnn {
    /// `k` particles drawn from the prior `[k, dim]`: `lambda ~ Gamma(a0, rate b0)` (or the
    /// fixed one), every weight and bias `~ N(0, 1/lambda)`, and for regression
    /// `gamma ~ Gamma(a0, rate b0)`; the precisions as their logs, as the particles hold them.
    /// (Unlike [`Bnn::init`], which follows the reference code's start, this is the model's
    /// prior itself: the function-space prior of `fpovi` is the law of these networks' outputs.)
    pub fn draw_prior(&self, k: usize, seed: u64) -> Tensor<2> {
        self.prior_networks(k, seed, false)
    }

    /// [`Bnn::draw_prior`], or with `plug_in` the hierarchical prior's `lambda` fixed at its
    /// prior mean `a0 / b0` ([`FunctionMap::prior_draws`]).
    fn prior_networks(&self, k: usize, seed: u64, plug_in: bool) -> Tensor<2> {
        let dim = self.layout.dim();
        let nw = self.weight_count();
        let mut rng = chacha20::ChaCha8Rng::seed_from_u64(seed);
        // rand_distr's Gamma takes (shape, scale): the prior's rate b0 is the scale 1 / b0.
        let precision = rand_distr::Gamma::new(A0, 1.0 / B0).expect("valid gamma");
        let mut values = vec![0f32; k * dim];
        for row in values.chunks_mut(dim) {
            let lambda = match self.config.prior {
                WeightPrior::Fixed(l) => l,
                WeightPrior::Hierarchical => {
                    let l = if plug_in { A0 / B0 } else { precision.sample(&mut rng).max(f64::MIN_POSITIVE) };
                    row[dim - 1] = l.ln() as f32;
                    l
                }
            };
            let sd = 1.0 / lambda.sqrt();
            for v in &mut row[..nw] {
                let z: f64 = rand_distr::StandardNormal.sample(&mut rng);
                *v = (sd * z) as f32;
            }
            if self.config.task == BnnTask::Regression {
                row[nw] = precision.sample(&mut rng).max(f64::MIN_POSITIVE).ln() as f32;
            }
        }
        matrix_from_vec(values, k, dim, &self.x.device())
    }
}

impl Bnn {
    /// The same log-joint built from the layout and the distributions on a network of ordinary
    /// tensor operations, as a user would write it: the reference the fast form is tested
    /// against.
    pub fn log_prob_dsl(&self, particles: Tensor<2>, batch: Option<&Minibatch>) -> Tensor<1> {
        let n = particles.dims()[0];
        let p = self.layout.unpack(particles.clone());
        let (x, scale) = Minibatch::select(batch, self.x.clone());
        let (y, _) = Minibatch::select(batch, self.y.clone());
        let out = self.net.clone().with_ops(LayerOps::Plain).forward(particles.clone(), x); // [B, n, k]
        let [b, _, k] = out.dims();
        let hyper = Gamma::new(A0, B0).expect("valid prior");
        let (lik, noise_prior) = match self.config.task {
            BnnTask::Regression => {
                let gamma: Tensor<1> = p.get("gamma").expect("layout block");
                let resid = y - out.reshape([b, n]);
                let lik =
                    Normal::with_precision(0.0, gamma.clone().reshape([1, n])).log_prob_sum(resid, 0).reshape([n]);
                (lik, hyper.log_prob(gamma))
            }
            BnnTask::Classification { .. } if k == 1 => {
                let lik = Bernoulli::from_logits(out.reshape([b, n])).log_prob(y).sum_dim(0).reshape([n]);
                (lik, Tensor::zeros([n], &particles.device()))
            }
            BnnTask::Classification { .. } => {
                let probs = activation::softmax(out, 2);
                let lik = (probs.log() * y.reshape([b, 1, k])).sum_dim(2).sum_dim(0).reshape([n]);
                (lik, Tensor::zeros([n], &particles.device()))
            }
        };
        let weights = particles.narrow(1, 0, self.weight_count());
        let prior = match self.config.prior {
            WeightPrior::Hierarchical => {
                let lambda: Tensor<1> = p.get("lambda").expect("layout block");
                let prior_w = Normal::with_precision(0.0, lambda.clone().reshape([n, 1])).log_prob_sum(weights, 1);
                prior_w.reshape([n]) + hyper.log_prob(lambda)
            }
            WeightPrior::Fixed(l) => {
                Normal::new(0.0, 1.0 / l.sqrt()).expect("checked in new").log_prob_sum(weights, 1).reshape([n])
            }
        };
        lik.mul_scalar(scale) + noise_prior + prior + p.log_jacobian()
    }
}
