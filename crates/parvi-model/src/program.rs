//! Models written the way a Stan program reads: the `parameters` block declared once as a
//! [`ParamLayout`] (constraints and their log-Jacobians come with it), and the `transformed
//! parameters` and `model` blocks as one function that adds its statements to a [`Target`].
//!
//! ```
//! use parvi_model::burn::tensor::Tensor;
//! use parvi_model::dist::{Cauchy, LogProb, Normal};
//! use parvi_model::program::{Program, Target, Vars};
//! use parvi_model::{ModelError, ParamLayout};
//!
//! /// Stan's eight schools, non-centred.
//! #[derive(Debug)]
//! struct EightSchools { y: Tensor<2>, sigma: Tensor<2>, schools: usize }
//!
//! impl Program for EightSchools {
//!     fn parameters(&self) -> Result<ParamLayout, ModelError> {
//!         ParamLayout::new().real("theta_trans", &[self.schools])?.real("mu", &[])?.positive("tau", &[])
//!     }
//!     fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
//!         let (theta_trans, mu, tau) = (p.get("theta_trans")?, p.get("mu")?, p.get("tau")?);
//!         let theta = p.transformed("theta", theta_trans.clone() * tau.clone() + mu.clone());
//!         *target += Normal::new(0.0, 1.0)?.log_prob(theta_trans);
//!         *target += Normal::new(theta, self.sigma.clone())?.log_prob(self.y.clone());
//!         *target += Normal::new(0.0, 5.0)?.log_prob(mu);
//!         *target += Cauchy::new(0.0, 5.0)?.log_prob(tau);
//!         Ok(())
//!     }
//! }
//! ```
//!
//! [`Compiled`] turns a program into a [`LogDensity`] on Stan's unconstrained coordinates, with
//! Stan's names for every reported quantity (`theta[1]`, `L[2,1]`) in Stan's output order: the
//! parameters, then the transformed parameters.

use std::cell::RefCell;
use std::ops::AddAssign;
use std::sync::Mutex;

use burn::tensor::Tensor;
use rand::{Rng, RngExt, SeedableRng};
use rand_distr::Distribution as _;

use crate::{LogDensity, Minibatch, ModelError, ParamLayout, Unpacked};

/// A model in the shape of a Stan program. `Send + Sync` as every [`LogDensity`]: samplers share
/// it across threads (its data are burn tensors, which are).
pub trait Program: std::fmt::Debug + Send + Sync {
    /// The `parameters` block: every parameter with its shape and constraint.
    fn parameters(&self) -> Result<ParamLayout, ModelError>;

    /// The `transformed parameters` and `model` blocks for all particles at once: each sampling
    /// statement or `target +=` adds its log density to `target`. Transformed parameters that a
    /// user reads back are declared with [`Vars::transformed`]. An error (a constant outside its
    /// distribution's support, an unknown block) is reported when the model is compiled, which
    /// runs this function once.
    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError>;

    /// Data rows a minibatch may select ([`Vars::batch`]); `None` for a full-batch model.
    fn data_len(&self) -> Option<usize> {
        None
    }

    /// The `transformed data` a user wants reported: constants computed once from the data
    /// (a standardised predictor's mean and sd, a design matrix's column scales), declared on
    /// [`Constants`]. Run once, by [`Compiled::new`]; the values are held once, on the host, and
    /// reported once (never a copy per draw or per particle). The data themselves, as the model
    /// uses them, live in the program's fields, computed in its constructor (`[1, k]` tensors,
    /// which broadcast against `[n, k]` parameters). The default declares none.
    fn transformed_data(&self, out: &mut Constants) -> Result<(), ModelError> {
        let _ = out;
        Ok(())
    }

    /// The `generated quantities` block, run after the fit on the draws (all at once, `[n, ...]`):
    /// posterior predictive replications from [`Generated`]'s seeded `_rng` functions, the
    /// pointwise `log_lik` that PSIS-LOO reads, any derived quantity; each declared with
    /// [`Generated::output`]. `p` holds the parameters (and its `transformed` calls record
    /// nothing here). The default declares none.
    fn generated(&self, p: &Vars, out: &mut Generated) -> Result<(), ModelError> {
        let _ = (p, out);
        Ok(())
    }
}

/// The transformed data a program reports ([`Program::transformed_data`]): each constant's
/// name, its Stan shape and its values, held once.
#[derive(Clone, Debug, Default)]
pub struct Constants {
    outputs: Vec<(String, Option<Vec<usize>>, Vec<f64>)>,
}

impl Constants {
    /// Declares constant `name`: one value is reported under its bare name (a Stan `real`),
    /// more as a vector `name[i]`.
    pub fn output(&mut self, name: &str, values: &[f64]) {
        self.outputs.push((name.to_string(), None, values.to_vec()));
    }

    /// Declares constant `name` of Stan shape `shape` (`&[]`: a scalar), its values row-major.
    pub fn output_shaped(&mut self, name: &str, shape: &[usize], values: &[f64]) {
        self.outputs.push((name.to_string(), Some(shape.to_vec()), values.to_vec()));
    }

    /// Declares constant `name` from a data tensor `[1, size]` (as [`Constants::output`]).
    pub fn output_tensor(&mut self, name: &str, value: &Tensor<2>) {
        self.output(name, &crate::tensor_ops::to_vec_f64(value));
    }
}

/// A compiled model as the workflow around a fit sees it (draws written under Stan's names,
/// generated quantities): implemented by [`Compiled`] for every [`Program`], and by any model a
/// user writes by hand.
pub trait StanModel: LogDensity {
    /// The blocks of the unconstrained particle, in the `parameters` block's order.
    fn layout(&self) -> &ParamLayout;

    /// Stan's names of the reported quantities: every element of every parameter, then of every
    /// transformed parameter (`theta[1]`, `L[2,1]`).
    fn names(&self) -> &[String];

    /// Unconstrained particles `[n, dim]` to the reported quantities `[n, names().len()]`.
    fn reported(&self, particles: Tensor<2>) -> Result<Tensor<2>, ModelError>;

    /// Stan's names of the generated quantities (empty without a generated-quantities block).
    fn generated_names(&self) -> &[String] {
        &[]
    }

    /// Stan's names of the reported transformed data ([`Program::transformed_data`]):
    /// constants, each one value for the whole run (empty by default).
    fn constant_names(&self) -> &[String] {
        &[]
    }

    /// The values of [`StanModel::constant_names`], in their order.
    fn constants(&self) -> &[f64] {
        &[]
    }

    /// The generated quantities `[n, generated_names().len()]` of unconstrained particles
    /// `[n, dim]`, their random draws from `rng`.
    fn generated(&self, particles: Tensor<2>, rng: &mut dyn Rng) -> Result<Tensor<2>, ModelError> {
        let _ = rng;
        Ok(Tensor::zeros([particles.dims()[0], 0], &particles.device()))
    }

    /// The transformed parameters `[n, names().len() - constrained_dim]` and the generated
    /// quantities `[n, generated_names().len()]` of constrained parameter values
    /// `[n, constrained_dim]` (the parameter columns of a draws file), draw `i`'s random numbers
    /// from `streams[i]` alone ([`draw_stream`]), so that a draw's generated quantities depend
    /// on its values and its stream only: a fit's and CmdStan's standalone generated quantities
    /// of the same draws agree exactly. This default goes through the unconstrained space and
    /// runs the block once a draw; [`Compiled`] reads the constrained values directly, batched.
    fn quantities_at(
        &self,
        constrained: Tensor<2>,
        streams: &mut [DrawRng],
    ) -> Result<(Tensor<2>, Tensor<2>), ModelError> {
        let [n, width] = constrained.dims();
        check_streams(n, streams.len())?;
        let device = constrained.device();
        let host = crate::tensor_ops::to_vec_f32(&constrained);
        let mut rows = Vec::with_capacity(n * self.dim());
        for row in host.chunks(width.max(1)).take(n) {
            let values: Vec<f64> = row.iter().map(|&v| f64::from(v)).collect();
            rows.extend(self.layout().unconstrain(&values)?.into_iter().map(|v| v as f32));
        }
        let particles = Tensor::<1>::from_floats(rows.as_slice(), &device).reshape([n, self.dim()]);
        let reported = self.reported(particles.clone())?;
        let total = reported.dims()[1];
        let transformed =
            if total > width { reported.narrow(1, width, total - width) } else { Tensor::zeros([n, 0], &device) };
        let generated = (0..n)
            .map(|i| self.generated(particles.clone().narrow(0, i, 1), &mut streams[i]))
            .collect::<Result<Vec<_>, _>>()?;
        let generated = if generated.is_empty() { Tensor::zeros([0, 0], &device) } else { Tensor::cat(generated, 0) };
        Ok((transformed, generated))
    }
}

/// The random stream of one draw's generated quantities.
pub type DrawRng = chacha20::ChaCha8Rng;

/// Draw `draw` (0-based, in its chain's order as written) of chain `chain` (1-based, CmdStan's
/// `id`) under run seed `seed`: ChaCha8 keyed by the three numbers, so a draw's generated
/// quantities are reproducible from the draws file alone (CmdStan's standalone method), whatever
/// other draws are computed with it or in what order.
pub fn draw_stream(seed: u64, chain: u64, draw: u64) -> DrawRng {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(&chain.to_le_bytes());
    key[16..24].copy_from_slice(&draw.to_le_bytes());
    // A tag keeps these streams apart from any other use of the seed.
    key[24..].copy_from_slice(b"parvi-gq");
    DrawRng::from_seed(key)
}

/// One stream a draw, or an error.
fn check_streams(rows: usize, streams: usize) -> Result<(), ModelError> {
    if rows == streams {
        Ok(())
    } else {
        Err(ModelError::Quantity {
            name: "generated quantities".into(),
            reason: format!("{streams} random streams for {rows} draws: give one a draw"),
        })
    }
}

/// The constrained parameters of all particles as the `model` block sees them.
pub struct Vars<'a> {
    unpacked: Unpacked<'a>,
    particles: usize,
    batch: Option<&'a Minibatch>,
    /// Transformed parameters recorded for reporting; `None` while only the density is wanted.
    recorded: Option<RefCell<Vec<Recorded>>>,
}

/// A reported quantity: its name, its declared shape (`None`: a vector, or a bare name for one
/// value) and its values `[n, size]`.
type Recorded = (String, Option<Vec<usize>>, Tensor<2>);

impl Vars<'_> {
    /// Parameter `name`, flattened: `[n, size]` (`[n, 1]` for a scalar), on the constrained scale.
    pub fn get(&self, name: &str) -> Result<Tensor<2>, ModelError> {
        self.unpacked.flat(name)
    }

    /// Parameter `name` with its shape: `[n, shape...]`, `D = 1 + shape.len()` (a matrix block is
    /// `get_shaped::<3>`).
    pub fn get_shaped<const D: usize>(&self, name: &str) -> Result<Tensor<D>, ModelError> {
        self.unpacked.get(name)
    }

    /// One element of parameter `name`, `[n, 1]`, at Stan's 1-based `index`: Stan's `beta[1]`
    /// is `p.element("beta", [1])?`, `L[2,1]` is `p.element("L", [2, 1])?` (one index per axis
    /// of the block's shape). An index outside the block is an error naming it.
    pub fn element<const K: usize>(&self, name: &str, index: [usize; K]) -> Result<Tensor<2>, ModelError> {
        self.unpacked.element(name, &index)
    }

    /// Number of particles `n`.
    pub fn particles(&self) -> usize {
        self.particles
    }

    /// The minibatch of this evaluation, if any (see [`Minibatch::select`]).
    pub fn batch(&self) -> Option<&Minibatch> {
        self.batch
    }

    /// Whether this evaluation records transformed parameters (a report of the draws), not only
    /// the density: a transformed parameter the density does not need (an HMM's filtered
    /// `logalpha`, a recursion over every time step) is worth computing only then.
    pub fn recording(&self) -> bool {
        self.recorded.is_some()
    }

    /// Declares a transformed parameter (`[n, size]`) and returns it: reported after the
    /// parameters, under `name` (`name[i]` past one element), as Stan's output does.
    pub fn transformed(&self, name: &str, value: Tensor<2>) -> Tensor<2> {
        if let Some(recorded) = &self.recorded {
            recorded.borrow_mut().push((name.to_string(), None, value.clone()));
        }
        value
    }

    /// Declares a transformed parameter of Stan shape `shape` (`matrix[20, 1] C`: `&[20, 1]`,
    /// reported as `C[1,1]`, ..., row-major; `&[]`: a scalar) given flattened `[n, size]`.
    pub fn transformed_shaped(&self, name: &str, shape: &[usize], value: Tensor<2>) -> Tensor<2> {
        if let Some(recorded) = &self.recorded {
            recorded.borrow_mut().push((name.to_string(), Some(shape.to_vec()), value.clone()));
        }
        value
    }
}

/// The generated-quantities block's outputs and random numbers (Stan's `_rng` functions, drawn
/// on the host from the caller's seeded stream, broadcast as the densities are: a `[1, k]`
/// argument is shared by every draw).
pub struct Generated<'a> {
    streams: Streams<'a>,
    outputs: Vec<Recorded>,
}

/// Where the `_rng` functions draw from: one stream for every draw in turn, or each draw its own.
enum Streams<'a> {
    Shared(&'a mut dyn Rng),
    PerDraw(&'a mut [DrawRng]),
}

impl Streams<'_> {
    /// The stream of draw `row` (a `[1, k]` call, shared by every draw, takes the first).
    fn of(&mut self, row: usize) -> &mut dyn Rng {
        match self {
            Streams::Shared(rng) => &mut **rng,
            Streams::PerDraw(streams) => {
                let last = streams.len().saturating_sub(1);
                &mut streams[row.min(last)]
            }
        }
    }
}

impl std::fmt::Debug for Generated<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generated").field("outputs", &self.outputs.len()).finish()
    }
}

impl<'a> Generated<'a> {
    fn new(streams: Streams<'a>) -> Self {
        Self { streams, outputs: Vec::new() }
    }

    /// Declares generated quantity `name`, `[n, size]`: one value is reported under its bare name
    /// (a Stan `real`), more as a vector `name[i]`.
    pub fn output(&mut self, name: &str, value: Tensor<2>) {
        self.outputs.push((name.to_string(), None, value));
    }

    /// Declares generated quantity `name` of Stan shape `shape`, given flattened `[n, size]`
    /// (row-major, as [`Vars::transformed_shaped`]).
    pub fn output_shaped(&mut self, name: &str, shape: &[usize], value: Tensor<2>) {
        self.outputs.push((name.to_string(), Some(shape.to_vec()), value));
    }

    /// Draws element by element from `sample(args, rng)`, the arguments broadcast to one shape
    /// `[n, k]`; `name` and the parameter names word the error for a bad argument.
    fn draw<const A: usize>(
        &mut self,
        name: &str,
        args: [(&str, Tensor<2>); A],
        sample: impl Fn([f64; A], &mut dyn Rng) -> Result<f64, String>,
    ) -> Result<Tensor<2>, ModelError> {
        let dims: Vec<[usize; 2]> = args.iter().map(|(_, t)| t.dims()).collect();
        let rows = dims.iter().map(|d| d[0]).max().unwrap_or(1);
        let cols = dims.iter().map(|d| d[1]).max().unwrap_or(1);
        for ((param, _), d) in args.iter().zip(&dims) {
            if (d[0] != rows && d[0] != 1) || (d[1] != cols && d[1] != 1) {
                return Err(ModelError::Quantity {
                    name: format!("{name} argument `{param}`"),
                    reason: format!("shape {d:?} does not broadcast to [{rows}, {cols}]"),
                });
            }
        }
        let device = args[0].1.device();
        let host: Vec<Vec<f32>> = args.iter().map(|(_, t)| crate::tensor_ops::to_vec_f32(t)).collect();
        let mut out = Vec::with_capacity(rows * cols);
        for r in 0..rows {
            for c in 0..cols {
                let values: [f64; A] = std::array::from_fn(|a| {
                    let [ar, ac] = dims[a];
                    f64::from(host[a][(if ar == 1 { 0 } else { r }) * ac + if ac == 1 { 0 } else { c }])
                });
                let v = sample(values, self.streams.of(r)).map_err(|reason| ModelError::Quantity {
                    name: format!("{name}({})", args.iter().map(|(p, _)| *p).collect::<Vec<_>>().join(", ")),
                    reason: format!("at draw {}, element {}: {reason}", r + 1, c + 1),
                })?;
                out.push(v as f32);
            }
        }
        Ok(Tensor::<1>::from_floats(out.as_slice(), &device).reshape([rows, cols]))
    }

    /// `normal_rng(mu, sigma)`.
    pub fn normal_rng(&mut self, mu: Tensor<2>, sigma: Tensor<2>) -> Result<Tensor<2>, ModelError> {
        self.draw("normal_rng", [("mu", mu), ("sigma", sigma)], |[m, s], rng| {
            location_scale(m, s)?;
            rand_distr::Normal::new(m, s).map(|d| d.sample(rng)).map_err(|e| format!("{e} (mu {m}, sigma {s})"))
        })
    }

    /// `lognormal_rng(mu, sigma)`.
    pub fn lognormal_rng(&mut self, mu: Tensor<2>, sigma: Tensor<2>) -> Result<Tensor<2>, ModelError> {
        self.draw("lognormal_rng", [("mu", mu), ("sigma", sigma)], |[m, s], rng| {
            location_scale(m, s)?;
            rand_distr::LogNormal::new(m, s).map(|d| d.sample(rng)).map_err(|e| format!("{e} (mu {m}, sigma {s})"))
        })
    }

    /// `student_t_rng(nu, mu, sigma)`.
    pub fn student_t_rng(&mut self, nu: Tensor<2>, mu: Tensor<2>, sigma: Tensor<2>) -> Result<Tensor<2>, ModelError> {
        self.draw("student_t_rng", [("nu", nu), ("mu", mu), ("sigma", sigma)], |[nu, m, s], rng| {
            if s.is_nan() || s <= 0.0 {
                return Err(format!("sigma {s} must be > 0"));
            }
            rand_distr::StudentT::new(nu).map(|d| m + s * d.sample(rng)).map_err(|e| format!("{e} (nu {nu})"))
        })
    }

    /// `bernoulli_rng(theta)`: 0 or 1.
    pub fn bernoulli_rng(&mut self, theta: Tensor<2>) -> Result<Tensor<2>, ModelError> {
        self.draw("bernoulli_rng", [("theta", theta)], |[p], rng| {
            rand_distr::Bernoulli::new(p).map(|d| f64::from(u8::from(d.sample(rng)))).map_err(|e| format!("{e} ({p})"))
        })
    }

    /// `bernoulli_logit_rng(alpha)`: 0 or 1 with probability `inv_logit(alpha)` of 1.
    pub fn bernoulli_logit_rng(&mut self, alpha: Tensor<2>) -> Result<Tensor<2>, ModelError> {
        self.draw("bernoulli_logit_rng", [("alpha", alpha)], |[a], rng| {
            if a.is_nan() {
                return Err("alpha is NaN".into());
            }
            let p = 1.0 / (1.0 + (-a).exp());
            Ok(f64::from(u8::from(rng.random::<f64>() < p)))
        })
    }

    /// `binomial_rng(N, theta)`.
    pub fn binomial_rng(&mut self, trials: Tensor<2>, theta: Tensor<2>) -> Result<Tensor<2>, ModelError> {
        self.draw("binomial_rng", [("N", trials), ("theta", theta)], |[n, p], rng| {
            if !(n >= 0.0 && n.fract() == 0.0) {
                return Err(format!("N {n} must be a count"));
            }
            rand_distr::Binomial::new(n as u64, p).map(|d| d.sample(rng) as f64).map_err(|e| format!("{e} ({p})"))
        })
    }

    /// `poisson_rng(lambda)`.
    pub fn poisson_rng(&mut self, lambda: Tensor<2>) -> Result<Tensor<2>, ModelError> {
        self.draw("poisson_rng", [("lambda", lambda)], |[l], rng| poisson(l, rng))
    }

    /// `poisson_log_rng(alpha)`: Poisson with rate `exp(alpha)`.
    pub fn poisson_log_rng(&mut self, alpha: Tensor<2>) -> Result<Tensor<2>, ModelError> {
        self.draw("poisson_log_rng", [("alpha", alpha)], |[a], rng| poisson(a.exp(), rng))
    }

    /// `neg_binomial_2_rng(mu, phi)`: a Poisson whose rate is Gamma(phi, phi / mu), as Stan draws it.
    pub fn neg_binomial_2_rng(&mut self, mu: Tensor<2>, phi: Tensor<2>) -> Result<Tensor<2>, ModelError> {
        self.draw("neg_binomial_2_rng", [("mu", mu), ("phi", phi)], |[m, phi], rng| {
            if !(m > 0.0 && phi > 0.0) {
                return Err(format!("mu {m} and phi {phi} must be > 0"));
            }
            let rate = rand_distr::Gamma::new(phi, m / phi).map_err(|e| e.to_string())?.sample(rng);
            poisson(rate, rng)
        })
    }

    /// `exponential_rng(beta)` (rate `beta`).
    pub fn exponential_rng(&mut self, beta: Tensor<2>) -> Result<Tensor<2>, ModelError> {
        self.draw("exponential_rng", [("beta", beta)], |[b], rng| {
            rand_distr::Exp::new(b).map(|d| d.sample(rng)).map_err(|e| format!("{e} ({b})"))
        })
    }

    /// `gamma_rng(alpha, beta)` (shape `alpha`, rate `beta`).
    pub fn gamma_rng(&mut self, alpha: Tensor<2>, beta: Tensor<2>) -> Result<Tensor<2>, ModelError> {
        self.draw("gamma_rng", [("alpha", alpha), ("beta", beta)], |[a, b], rng| {
            if b.is_nan() || b <= 0.0 {
                return Err(format!("beta {b} must be > 0"));
            }
            rand_distr::Gamma::new(a, 1.0 / b).map(|d| d.sample(rng)).map_err(|e| format!("{e} ({a})"))
        })
    }

    /// `uniform_rng(alpha, beta)`.
    pub fn uniform_rng(&mut self, alpha: Tensor<2>, beta: Tensor<2>) -> Result<Tensor<2>, ModelError> {
        self.draw("uniform_rng", [("alpha", alpha), ("beta", beta)], |[a, b], rng| {
            if a.is_nan() || b.is_nan() || a >= b {
                return Err(format!("alpha {a} must be below beta {b}"));
            }
            Ok(a + (b - a) * rng.random::<f64>())
        })
    }

    /// `categorical_logit_rng(beta)` for each row of `beta` `[n, K]`: a category in `1..=K`, `[n, 1]`.
    pub fn categorical_logit_rng(&mut self, beta: Tensor<2>) -> Result<Tensor<2>, ModelError> {
        let [n, k] = beta.dims();
        let device = beta.device();
        let host = crate::tensor_ops::to_vec_f32(&beta);
        let mut out = Vec::with_capacity(n);
        for (r, row) in host.chunks(k.max(1)).enumerate().take(n) {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let weights: Vec<f64> = row.iter().map(|&b| f64::from(b - max).exp()).collect();
            let d = rand_distr::weighted::WeightedIndex::new(&weights).map_err(|e| ModelError::Quantity {
                name: "categorical_logit_rng(beta)".into(),
                reason: format!("at draw {}: {e}", r + 1),
            })?;
            out.push((d.sample(self.streams.of(r)) + 1) as f32);
        }
        Ok(Tensor::<1>::from_floats(out.as_slice(), &device).reshape([n, 1]))
    }
}

/// Stan's checks of a location and scale: `mu` finite, `sigma` finite and positive.
fn location_scale(mu: f64, sigma: f64) -> Result<(), String> {
    if !mu.is_finite() {
        return Err(format!("mu {mu} must be finite"));
    }
    if !(sigma > 0.0 && sigma.is_finite()) {
        return Err(format!("sigma {sigma} must be finite and > 0"));
    }
    Ok(())
}

/// One Poisson draw of rate `rate` (0 for a rate of 0, as Stan).
fn poisson(rate: f64, rng: &mut dyn Rng) -> Result<f64, String> {
    if rate == 0.0 {
        return Ok(0.0);
    }
    // Stan refuses rates past 2^30, where a draw no longer fits an int.
    if !(rate > 0.0 && rate < 1.0737e9) {
        return Err(format!("rate {rate} must be in (0, 2^30)"));
    }
    rand_distr::Poisson::new(rate).map(|d| d.sample(rng)).map_err(|e| format!("{e} ({rate})"))
}

/// The log density being accumulated, `[n]` (Stan's `target`). `target += term` sums a term over
/// every axis but the first: a `[n, k]` term is one value per particle and element, a `[1, k]` one
/// (data only) is shared by every particle.
///
/// The terms are kept as they come, `[n, k]` each, and summed once, in [`Target::value`]: one
/// `cat` and one row sum for the whole program. Summing each term into a running total cost
/// three autodiff nodes a `+=` (a row sum, a reshape, an add), and on a small model each node's
/// graph bookkeeping, not its arithmetic, is the cost (docs/posteriordb.md at 8a480ca, "Fewer autodiff
/// nodes a score").
#[derive(Debug)]
pub struct Target {
    particles: usize,
    device: burn::tensor::Device,
    /// `[n, k]` terms, in the dtype of the first.
    terms: Vec<Tensor<2>>,
}

/// Columns above which a term is summed as it is added ([`Target::push`]).
const WIDE_TERM: usize = 16;

impl Target {
    fn new(particles: usize, device: &burn::tensor::Device) -> Self {
        Self { particles, device: device.clone(), terms: Vec::new() }
    }

    /// Adds the columns of `term` `[rows, k]`: one row per particle, or one row (data only)
    /// shared by every particle. A wide term (a likelihood over data rows) is summed at once,
    /// into one column: copying it into the `cat` (and its gradient out) cost more than the
    /// nodes saved at 100 particles.
    fn push(&mut self, term: Tensor<2>) {
        let [rows, k] = term.dims();
        let term = if k > WIDE_TERM { term.sum_dim(1) } else { term };
        let k = term.dims()[1];
        let term = if rows == 1 && self.particles != 1 { term.expand([self.particles, k]) } else { term };
        let term = match self.terms.first().map(Tensor::dtype) {
            Some(dtype) if dtype != term.dtype() => term.cast(dtype),
            _ => term,
        };
        self.terms.push(term);
    }

    /// The accumulated log density `[n]`.
    pub fn value(self) -> Tensor<1> {
        let n = self.particles;
        let mut terms = self.terms;
        let all = match terms.len() {
            0 => return Tensor::zeros([n], &self.device),
            1 => terms.remove(0),
            _ => Tensor::cat(terms, 1),
        };
        all.sum_dim(1).reshape([n])
    }
}

impl AddAssign<Tensor<1>> for Target {
    fn add_assign(&mut self, term: Tensor<1>) {
        let rows = term.dims()[0];
        self.push(term.reshape([rows, 1]));
    }
}

impl AddAssign<Tensor<2>> for Target {
    fn add_assign(&mut self, term: Tensor<2>) {
        self.push(term);
    }
}

impl AddAssign<Tensor<3>> for Target {
    fn add_assign(&mut self, term: Tensor<3>) {
        let [rows, a, b] = term.dims();
        *self += term.reshape([rows, a * b]);
    }
}

/// A [`Program`] with its layout: a [`LogDensity`] on the unconstrained coordinates (Jacobians
/// added) and the map to the reported quantities.
#[derive(Debug)]
pub struct Compiled<P> {
    program: P,
    layout: ParamLayout,
    names: Vec<String>,
    /// Stan's names of the generated quantities.
    generated_names: Vec<String>,
    /// Stan's names of the reported transformed data, and their values.
    constant_names: Vec<String>,
    constants: Vec<f64>,
    /// The error of the last evaluation that failed (see [`LogDensity::take_error`]).
    error: Mutex<Option<ModelError>>,
}

impl<P: Program> Compiled<P> {
    /// Builds the layout and runs the model once on one particle at the origin of the
    /// unconstrained space, so that an error in the program (a constant outside its support, a
    /// block it does not declare) is reported here, and the reported names are known.
    pub fn new(program: P, device: &burn::tensor::Device) -> Result<Self, ModelError> {
        let layout = program.parameters()?;
        let origin = Tensor::<2>::zeros([1, layout.dim()], device);
        let transformed = Self::transformed_of(&program, &layout, origin.clone())?;
        let names: Vec<String> = layout
            .blocks()
            .iter()
            .flat_map(|b| stan_names(&b.name, &b.shape))
            .chain(recorded_names(&transformed)?)
            .collect();
        // The generated block run once too, with a throwaway stream: its names, and its errors
        // (a name declared twice, a shape that does not match) before any fit.
        let mut rng = rand::rngs::SmallRng::seed_from_u64(0);
        let generated = Self::generated_of(&program, layout.unpack(origin), 1, Streams::Shared(&mut rng))?;
        let generated_names = recorded_names(&generated)?;
        let mut transformed_data = Constants::default();
        program.transformed_data(&mut transformed_data)?;
        let (constant_names, constants) = declared_constants(transformed_data, taken_names(&names, &generated_names))?;
        Ok(Self { program, layout, names, generated_names, constant_names, constants, error: Mutex::new(None) })
    }

    /// The parameters' layout (the `parameters` block).
    pub fn layout(&self) -> &ParamLayout {
        &self.layout
    }

    /// The program.
    pub fn program(&self) -> &P {
        &self.program
    }

    /// Stan's names of the reported quantities: every element of every parameter (constrained),
    /// then of every transformed parameter.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The reported quantities `[n, names().len()]` of unconstrained particles `[n, dim]`.
    pub fn reported(&self, particles: Tensor<2>) -> Result<Tensor<2>, ModelError> {
        let mut columns = vec![self.layout.constrain(particles.clone())];
        let transformed = Self::transformed_of(&self.program, &self.layout, particles)?;
        columns.extend(transformed.into_iter().map(|(_, _, v)| v));
        Ok(Tensor::cat(columns, 1))
    }

    /// Stan's names of the generated quantities, in the block's order.
    pub fn generated_names(&self) -> &[String] {
        &self.generated_names
    }

    /// Stan's names of the reported transformed data, in the order declared.
    pub fn constant_names(&self) -> &[String] {
        &self.constant_names
    }

    /// The reported transformed data's values, one each, in [`Compiled::constant_names`]' order.
    pub fn constants(&self) -> &[f64] {
        &self.constants
    }

    /// The generated quantities `[n, generated_names().len()]` of unconstrained particles
    /// `[n, dim]`, their random draws from `rng` (seed it for a reproducible block).
    pub fn generated(&self, particles: Tensor<2>, rng: &mut dyn Rng) -> Result<Tensor<2>, ModelError> {
        let n = particles.dims()[0];
        let device = particles.device();
        let unpacked = self.layout.unpack(particles);
        let outputs = Self::generated_of(&self.program, unpacked, n, Streams::Shared(rng))?;
        let columns: Vec<Tensor<2>> = outputs.into_iter().map(|(_, _, v)| v).collect();
        let width: usize = columns.iter().map(|c| c.dims()[1]).sum();
        if width != self.generated_names.len() {
            return Err(ModelError::Quantity {
                name: "generated quantities block".into(),
                reason: format!(
                    "gave {width} values a draw, but {} when the model was compiled: the block must declare the same outputs every time",
                    self.generated_names.len()
                ),
            });
        }
        if columns.is_empty() {
            return Ok(Tensor::zeros([n, 0], &device));
        }
        Ok(Tensor::cat(columns, 1))
    }

    /// The transformed parameters and generated quantities of constrained values, each draw's
    /// random numbers from its own stream (see [`StanModel::quantities_at`]); batched.
    pub fn quantities_at(
        &self,
        constrained: Tensor<2>,
        streams: &mut [DrawRng],
    ) -> Result<(Tensor<2>, Tensor<2>), ModelError> {
        let n = constrained.dims()[0];
        check_streams(n, streams.len())?;
        let device = constrained.device();
        let transformed = Self::transformed_of_unpacked(
            &self.program,
            self.layout.unpack_constrained(constrained.clone())?,
            n,
            &device,
        )?;
        let transformed = match transformed.is_empty() {
            true => Tensor::zeros([n, 0], &device),
            false => Tensor::cat(transformed.into_iter().map(|(_, _, v)| v).collect(), 1),
        };
        let outputs = Self::generated_of(
            &self.program,
            self.layout.unpack_constrained(constrained)?,
            n,
            Streams::PerDraw(streams),
        )?;
        let columns: Vec<Tensor<2>> = outputs.into_iter().map(|(_, _, v)| v).collect();
        let width: usize = columns.iter().map(|c| c.dims()[1]).sum();
        if width != self.generated_names.len() {
            return Err(ModelError::Quantity {
                name: "generated quantities block".into(),
                reason: format!(
                    "gave {width} values a draw, but {} when the model was compiled: the block must declare the same outputs every time",
                    self.generated_names.len()
                ),
            });
        }
        let generated = if columns.is_empty() { Tensor::zeros([n, 0], &device) } else { Tensor::cat(columns, 1) };
        Ok((transformed, generated))
    }

    /// Runs the generated block, checking each output has one row per particle.
    fn generated_of(
        program: &P,
        unpacked: Unpacked<'_>,
        n: usize,
        streams: Streams<'_>,
    ) -> Result<Vec<Recorded>, ModelError> {
        let vars = Vars { unpacked, particles: n, batch: None, recorded: None };
        let mut out = Generated::new(streams);
        program.generated(&vars, &mut out)?;
        for (name, _, value) in &out.outputs {
            let [rows, _] = value.dims();
            if rows != n {
                return Err(ModelError::Quantity {
                    name: format!("generated quantity `{name}`"),
                    reason: format!("has {rows} rows for {n} draws: give one row per draw, [n, size]"),
                });
            }
        }
        Ok(out.outputs)
    }

    /// Runs the model, recording the transformed parameters it declares.
    fn transformed_of(program: &P, layout: &ParamLayout, particles: Tensor<2>) -> Result<Vec<Recorded>, ModelError> {
        let n = particles.dims()[0];
        let device = particles.device();
        Self::transformed_of_unpacked(program, layout.unpack(particles), n, &device)
    }

    /// [`Compiled::transformed_of`] from the blocks' constrained values.
    fn transformed_of_unpacked(
        program: &P,
        unpacked: Unpacked<'_>,
        n: usize,
        device: &burn::tensor::Device,
    ) -> Result<Vec<Recorded>, ModelError> {
        let vars = Vars { unpacked, particles: n, batch: None, recorded: Some(RefCell::new(Vec::new())) };
        program.model(&vars, &mut Target::new(n, device))?;
        Ok(vars.recorded.map(RefCell::into_inner).unwrap_or_default())
    }
}

impl<P: Program> StanModel for Compiled<P> {
    fn layout(&self) -> &ParamLayout {
        &self.layout
    }

    fn names(&self) -> &[String] {
        &self.names
    }

    fn reported(&self, particles: Tensor<2>) -> Result<Tensor<2>, ModelError> {
        Compiled::reported(self, particles)
    }

    fn generated_names(&self) -> &[String] {
        &self.generated_names
    }

    fn generated(&self, particles: Tensor<2>, rng: &mut dyn Rng) -> Result<Tensor<2>, ModelError> {
        Compiled::generated(self, particles, rng)
    }

    fn quantities_at(
        &self,
        constrained: Tensor<2>,
        streams: &mut [DrawRng],
    ) -> Result<(Tensor<2>, Tensor<2>), ModelError> {
        Compiled::quantities_at(self, constrained, streams)
    }

    fn constant_names(&self) -> &[String] {
        &self.constant_names
    }

    fn constants(&self) -> &[f64] {
        &self.constants
    }
}

impl<P: Program> LogDensity for Compiled<P> {
    fn dim(&self) -> usize {
        self.layout.dim()
    }

    fn data_len(&self) -> Option<usize> {
        self.program.data_len()
    }

    fn log_prob(&self, particles: Tensor<2>, batch: Option<&Minibatch>) -> Tensor<1> {
        let n = particles.dims()[0];
        let device = particles.device();
        let unpacked = self.layout.unpack(particles);
        let mut target = Target::new(n, &device);
        // The log-Jacobian's columns join the program's terms: one sum for both.
        for columns in unpacked.log_jacobian_columns() {
            target.push(columns.clone());
        }
        let vars = Vars { unpacked, particles: n, batch, recorded: None };
        match self.program.model(&vars, &mut target) {
            Ok(()) => target.value(),
            // A failure that depends on the particles (an ODE solve that cannot meet its
            // tolerance): NaN for every particle, which the run loop's guard reports with this
            // error, rather than a panic.
            Err(error) => {
                *self.error.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(error);
                Tensor::full([n], f32::NAN, &device)
            }
        }
    }

    fn take_error(&self) -> Option<ModelError> {
        self.error.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take()
    }
}

/// Stan's output names of a block's elements: `x` for a scalar, `x[i]` for a vector, `x[i,j]`
/// (row-major, 1-based) for a matrix.
pub fn stan_names(name: &str, shape: &[usize]) -> Vec<String> {
    if shape.is_empty() {
        return vec![name.to_string()];
    }
    let total: usize = shape.iter().product();
    (0..total)
        .map(|flat| {
            let mut rest = flat;
            let mut index = vec![0; shape.len()];
            for (axis, &len) in shape.iter().enumerate().rev() {
                index[axis] = rest % len + 1;
                rest /= len;
            }
            let index: Vec<String> = index.iter().map(ToString::to_string).collect();
            format!("{name}[{}]", index.join(","))
        })
        .collect()
}

/// A transformed parameter's names: a single value is reported under its bare name (a Stan
/// `real`), more as a vector.
fn transformed_names(name: &str, size: usize) -> Vec<String> {
    if size == 1 { vec![name.to_string()] } else { stan_names(name, &[size]) }
}

/// Every reported and generated name, to refuse a constant that repeats one.
fn taken_names<'a>(names: &'a [String], generated: &'a [String]) -> std::collections::HashSet<&'a str> {
    names.iter().chain(generated).map(String::as_str).collect()
}

/// The constants' Stan names and values, checking shapes, repeats and clashes with the
/// reported quantities' names.
fn declared_constants(
    constants: Constants,
    taken: std::collections::HashSet<&str>,
) -> Result<(Vec<String>, Vec<f64>), ModelError> {
    let mut names = Vec::new();
    let mut values = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (name, shape, value) in constants.outputs {
        let quantity = || format!("transformed data `{name}`");
        if !seen.insert(name.clone()) {
            return Err(ModelError::Quantity { name: quantity(), reason: "declared twice".into() });
        }
        let declared = match &shape {
            None => transformed_names(&name, value.len()),
            Some(shape) => {
                let size: usize = shape.iter().product();
                if size != value.len() {
                    return Err(ModelError::Quantity {
                        name: quantity(),
                        reason: format!("shape {shape:?} holds {size} values but {} were given", value.len()),
                    });
                }
                stan_names(&name, shape)
            }
        };
        if let Some(clash) = declared.iter().find(|n| taken.contains(n.as_str())) {
            return Err(ModelError::Quantity {
                name: quantity(),
                reason: format!("`{clash}` is already a parameter or quantity of the model"),
            });
        }
        names.extend(declared);
        values.extend(value);
    }
    Ok((names, values))
}

/// The names of recorded quantities, each by its declared shape, checking that a shape matches
/// its values' width and that no name is declared twice.
fn recorded_names(recorded: &[Recorded]) -> Result<Vec<String>, ModelError> {
    let mut names = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (name, shape, value) in recorded {
        let width = value.dims()[1];
        if !seen.insert(name.as_str()) {
            return Err(ModelError::Quantity { name: format!("quantity `{name}`"), reason: "declared twice".into() });
        }
        match shape {
            None => names.extend(transformed_names(name, width)),
            Some(shape) => {
                let size: usize = shape.iter().product();
                if size != width {
                    return Err(ModelError::Quantity {
                        name: format!("quantity `{name}`"),
                        reason: format!("shape {shape:?} holds {size} values but {width} were given"),
                    });
                }
                names.extend(stan_names(name, shape));
            }
        }
    }
    Ok(names)
}
