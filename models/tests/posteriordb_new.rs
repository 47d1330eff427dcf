//! The twelve posteriordb models added with the Program DSL (the regressions, gp_regr, the two
//! HMMs, Lotka-Volterra, accel_gp) against independent `f64` evaluations of their Stan programs
//! written here in plain loops: the data read from `data.json` by this file, every constraint
//! transform and log-Jacobian as Stan math adds it (`lb_constrain`, `simplex_constrain`,
//! `positive_ordered_constrain`), the HMM forward algorithm as the Stan programs' loops, the GP's
//! Cholesky factor and `multi_normal_cholesky`, the Lotka-Volterra ODE by a fine fixed-step RK4,
//! accel_gp's basis-function GP. Checked: log density differences between points, the reported
//! quantities by Stan's names, and autodiff scores against central differences of the f64 program.
//!
//! The suite folder is `PARVI_POSTERIORDB_DIR`, else `$PARVI_DATA_DIR/../posteriordb`, else
//! `../shared/posteriordb` beside the workspace. Without it the tests print a note and pass,
//! unless `PARVI_REQUIRE_POSTERIORDB=1`.

use std::f64::consts::PI;
use std::path::Path;

use parvi_model::burn::tensor::Device;
use parvi_model::tensor_ops::to_vec_f32;
use parvi_model::{LogDensity, score};
use parvi_models::posteriordb::{self, PosteriorDbModel};
use serde_json::Value;

/// The posteriors this file checks: the suite's twelve after the first ten.
fn new_posteriors() -> &'static [&'static str] {
    &posteriordb::NAMES[10..]
}

mod common;
use common::{flex, host_rows, matrix, suite};

/// A point as the f32 model sees it, back in f64.
fn as_f32(p: &[f64]) -> Vec<f64> {
    p.iter().map(|&v| f64::from(v as f32)).collect()
}

// ---------------------------------------------------------------------------------------------
// Densities in f64, up to constants that do not depend on the parameters. Every summed term
// goes through `Acc`, which also sums the terms' magnitudes: the scale of the f32 rounding error
// of the model's evaluation.

#[derive(Default, Clone, Copy, Debug)]
struct Acc {
    sum: f64,
    magnitude: f64,
}

impl Acc {
    fn add(&mut self, term: f64) {
        self.sum += term;
        self.magnitude += term.abs();
    }
    /// A term computed from parts whose magnitudes sum to `magnitude` (a log-sum-exp over a
    /// sequence, whose f32 error scales with the summed parts, not with the result).
    fn add_with_magnitude(&mut self, term: f64, magnitude: f64) {
        self.sum += term;
        self.magnitude += magnitude;
    }
}

fn normal_lpdf(y: f64, mu: f64, sigma: f64) -> f64 {
    -0.5 * (2.0 * PI).ln() - sigma.ln() - 0.5 * ((y - mu) / sigma).powi(2)
}

fn cauchy_lpdf(y: f64, mu: f64, sigma: f64) -> f64 {
    -PI.ln() - sigma.ln() - ((y - mu) / sigma).powi(2).ln_1p()
}

/// Up to a constant in `y`, `mu`, `sigma` (`nu` fixed).
fn student_t_lpdf(y: f64, nu: f64, mu: f64, sigma: f64) -> f64 {
    -sigma.ln() - 0.5 * (nu + 1.0) * (((y - mu) / sigma).powi(2) / nu).ln_1p()
}

/// Up to a constant in `y` (shape and scale fixed).
fn inv_gamma_lpdf(y: f64, alpha: f64, beta: f64) -> f64 {
    -(alpha + 1.0) * y.ln() - beta / y
}

/// Up to a constant in `y` (shape and rate fixed).
fn gamma_lpdf(y: f64, alpha: f64, beta: f64) -> f64 {
    (alpha - 1.0) * y.ln() - beta * y
}

fn lognormal_lpdf(y: f64, mu: f64, sigma: f64) -> f64 {
    -0.5 * (2.0 * PI).ln() - sigma.ln() - y.ln() - 0.5 * ((y.ln() - mu) / sigma).powi(2)
}

fn exponential_lpdf(y: f64, beta: f64) -> f64 {
    beta.ln() - beta * y
}

fn log_sum_exp(v: &[f64]) -> f64 {
    let m = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    m + v.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn logit(p: f64) -> f64 {
    (p / (1.0 - p)).ln()
}

/// The lower Cholesky factor of a symmetric positive definite matrix (plain loops).
#[allow(clippy::needless_range_loop)] // index loops as the textbook formulas write them
fn cholesky(a: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let n = a.len();
    let mut l = vec![vec![0.0; n]; n];
    for j in 0..n {
        let pivot = a[j][j] - (0..j).map(|k| l[j][k] * l[j][k]).sum::<f64>();
        l[j][j] = pivot.sqrt();
        for i in j + 1..n {
            l[i][j] = (a[i][j] - (0..j).map(|k| l[i][k] * l[j][k]).sum::<f64>()) / l[j][j];
        }
    }
    l
}

/// Stan's `multi_normal_cholesky_lpdf(y | 0, L)`: `-N/2 log 2 pi - sum log L_ii - |L^-1 y|^2 / 2`,
/// with `L^-1 y` by forward substitution.
fn multi_normal_cholesky_lpdf(y: &[f64], l: &[Vec<f64>]) -> Acc {
    let mut z: Vec<f64> = Vec::with_capacity(y.len());
    let mut acc = Acc::default();
    for (i, (yi, row)) in y.iter().zip(l).enumerate() {
        let zi = (yi - row.iter().zip(&z).map(|(a, b)| a * b).sum::<f64>()) / row[i];
        acc.add(-0.5 * (2.0 * PI).ln() - row[i].ln() - 0.5 * zi * zi);
        z.push(zi);
    }
    acc
}

// ---------------------------------------------------------------------------------------------
// Stan's data, read here.

struct StanData(serde_json::Map<String, Value>);

impl StanData {
    fn read(dir: &Path, name: &str) -> Self {
        let text = std::fs::read_to_string(dir.join(name).join("data.json")).unwrap();
        match serde_json::from_str(&text).unwrap() {
            Value::Object(m) => Self(m),
            _ => panic!("data.json of {name} is not an object"),
        }
    }
    fn int(&self, k: &str) -> usize {
        self.0[k].as_u64().unwrap() as usize
    }
    fn vec(&self, k: &str) -> Vec<f64> {
        self.0[k].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect()
    }
    fn mat(&self, k: &str) -> Vec<Vec<f64>> {
        self.0[k]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect())
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// Stan's constraint transforms in f64 (Stan math `prim/constraint/`), block by block.

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Real,
    /// `<lower=0>`: `exp(x)`, log-Jacobian `x`.
    Positive,
    /// `simplex[K]` by stick-breaking: `z_k = logit^-1(x_k - log(K - k))`, `y_k = stick * z_k`,
    /// log-Jacobian `log stick + log z_k + log(1 - z_k)` per break.
    Simplex,
    /// `positive_ordered[K]`: `y_1 = exp(x_1)`, `y_k = y_{k-1} + exp(x_k)`, log-Jacobian `sum x`.
    PositiveOrdered,
}

/// A parameter block: Stan name, transform, constrained length (`None`: a scalar).
struct Block {
    name: &'static str,
    kind: Kind,
    len: Option<usize>,
}

fn block(name: &'static str, kind: Kind, len: Option<usize>) -> Block {
    Block { name, kind, len }
}

impl Block {
    fn constrained(&self) -> usize {
        self.len.unwrap_or(1)
    }
    fn free(&self) -> usize {
        if self.kind == Kind::Simplex { self.constrained() - 1 } else { self.constrained() }
    }
    fn names(&self) -> Vec<String> {
        match self.len {
            None => vec![self.name.to_string()],
            Some(k) => (1..=k).map(|i| format!("{}[{i}]", self.name)).collect(),
        }
    }
    /// Free values to constrained values, adding the log-Jacobian.
    fn constrain(&self, x: &[f64], jac: &mut f64) -> Vec<f64> {
        match self.kind {
            Kind::Real => x.to_vec(),
            Kind::Positive => {
                *jac += x.iter().sum::<f64>();
                x.iter().map(|v| v.exp()).collect()
            }
            Kind::PositiveOrdered => {
                *jac += x.iter().sum::<f64>();
                let mut y = Vec::with_capacity(x.len());
                let mut last = 0.0;
                for v in x {
                    last += v.exp();
                    y.push(last);
                }
                y
            }
            Kind::Simplex => {
                let k = self.constrained();
                let mut stick = 1.0;
                let mut y = Vec::with_capacity(k);
                for (i, v) in x.iter().enumerate() {
                    let adj = v - ((k - 1 - i) as f64).ln();
                    let z = sigmoid(adj);
                    y.push(stick * z);
                    *jac += stick.ln() + z.ln() + (1.0 - z).ln();
                    stick -= stick * z;
                }
                y.push(stick);
                y
            }
        }
    }
    /// Constrained values to free values (Stan math's `*_free`).
    fn unconstrain(&self, y: &[f64]) -> Vec<f64> {
        match self.kind {
            Kind::Real => y.to_vec(),
            Kind::Positive => y.iter().map(|v| v.ln()).collect(),
            Kind::PositiveOrdered => {
                (0..y.len()).map(|i| if i == 0 { y[0].ln() } else { (y[i] - y[i - 1]).ln() }).collect()
            }
            Kind::Simplex => {
                let k = y.len();
                let mut stick = 1.0;
                (0..k - 1)
                    .map(|i| {
                        let z = y[i] / stick;
                        stick -= y[i];
                        logit(z) + ((k - 1 - i) as f64).ln()
                    })
                    .collect()
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The Stan programs.

/// The design of a Gelman & Hill regression `y ~ normal(X beta, sigma)`: rows of `X` as the Stan
/// program's linear predictor orders them, `y`, and whether `sigma ~ cauchy(0, 2.5)`.
struct Regression {
    x: Vec<Vec<f64>>,
    y: Vec<f64>,
    cauchy_sigma: bool,
}

fn regression(name: &str, d: &StanData) -> Option<Regression> {
    let n = d.int("N");
    let ind = |codes: &[f64], level: f64| codes.iter().map(|&c| if c == level { 1.0 } else { 0.0 }).collect::<Vec<_>>();
    let (y, cols, cauchy_sigma): (Vec<f64>, Vec<Vec<f64>>, bool) = match name {
        "earnings-earn_height" => (d.vec("earn"), vec![d.vec("height")], false),
        "earnings-logearn_height_male" => {
            (d.vec("earn").iter().map(|e| e.ln()).collect(), vec![d.vec("height"), d.vec("male")], false)
        }
        "kidiq-kidscore_interaction" => {
            let (hs, iq) = (d.vec("mom_hs"), d.vec("mom_iq"));
            let inter = hs.iter().zip(&iq).map(|(a, b)| a * b).collect();
            (d.vec("kid_score"), vec![hs, iq, inter], true)
        }
        "kidiq_with_mom_work-kidscore_mom_work" => {
            let w = d.vec("mom_work");
            (d.vec("kid_score"), vec![ind(&w, 2.0), ind(&w, 3.0), ind(&w, 4.0)], false)
        }
        "mesquite-logmesquite_logvash" => {
            let (d1, d2, ch, th) = (d.vec("diam1"), d.vec("diam2"), d.vec("canopy_height"), d.vec("total_height"));
            let f = |g: &dyn Fn(usize) -> f64| (0..n).map(g).collect::<Vec<f64>>();
            (
                d.vec("weight").iter().map(|w| w.ln()).collect(),
                vec![
                    f(&|i| (d1[i] * d2[i] * ch[i]).ln()),
                    f(&|i| (d1[i] * d2[i]).ln()),
                    f(&|i| (d1[i] / d2[i]).ln()),
                    f(&|i| th[i].ln()),
                    d.vec("group"),
                ],
                false,
            )
        }
        "mesquite-mesquite" => (
            d.vec("weight"),
            ["diam1", "diam2", "canopy_height", "total_height", "density", "group"].iter().map(|k| d.vec(k)).collect(),
            false,
        ),
        "nes1972-nes" => {
            let age = d.vec("age_discrete");
            (
                d.vec("partyid7"),
                vec![
                    d.vec("real_ideo"),
                    d.vec("race_adj"),
                    ind(&age, 2.0),
                    ind(&age, 3.0),
                    ind(&age, 4.0),
                    d.vec("educ1"),
                    d.vec("gender"),
                    d.vec("income"),
                ],
                false,
            )
        }
        _ => return None,
    };
    assert_eq!(y.len(), n);
    let x = (0..n).map(|i| std::iter::once(1.0).chain(cols.iter().map(|c| c[i])).collect()).collect();
    Some(Regression { x, y, cauchy_sigma })
}

/// One posterior's Stan program, evaluated directly.
struct Direct {
    name: &'static str,
    d: StanData,
    blocks: Vec<Block>,
    reg: Option<Regression>,
}

/// Steps per unit time of the reference RK4 for Lotka-Volterra (its error is checked against
/// half the step in `lotka_volterra_reference_converges`).
const RK4_STEPS_PER_UNIT: usize = 100;

impl Direct {
    fn new(dir: &Path, name: &'static str) -> Self {
        use Kind::*;
        let d = StanData::read(dir, name);
        let reg = regression(name, &d);
        let blocks = match name {
            "gp_pois_regr-gp_regr" => {
                vec![block("rho", Positive, None), block("alpha", Positive, None), block("sigma", Positive, None)]
            }
            "hmm_example-hmm_example" => vec![
                block("theta1", Simplex, Some(2)),
                block("theta2", Simplex, Some(2)),
                block("mu", PositiveOrdered, Some(2)),
            ],
            "bball_drive_event_0-hmm_drive_0" => vec![
                block("theta1", Simplex, Some(2)),
                block("theta2", Simplex, Some(2)),
                block("phi", PositiveOrdered, Some(2)),
                block("lambda", PositiveOrdered, Some(2)),
            ],
            "hudson_lynx_hare-lotka_volterra" => vec![
                block("theta", Positive, Some(4)),
                block("z_init", Positive, Some(2)),
                block("sigma", Positive, Some(2)),
            ],
            "mcycle_gp-accel_gp" => vec![
                block("Intercept", Real, None),
                block("sdgp_1", Positive, None),
                block("lscale_1", Positive, None),
                block("zgp_1", Real, Some(d.int("NBgp_1"))),
                block("Intercept_sigma", Real, None),
                block("sdgp_sigma_1", Positive, None),
                block("lscale_sigma_1", Positive, None),
                block("zgp_sigma_1", Real, Some(d.int("NBgp_sigma_1"))),
            ],
            _ => {
                let k = reg.as_ref().unwrap_or_else(|| panic!("no Stan program for {name}")).x[0].len();
                vec![block("beta", Real, Some(k)), block("sigma", Positive, None)]
            }
        };
        Self { name, d, blocks, reg }
    }

    /// Stan's names of the parameters, in the parameters block's order.
    fn names(&self) -> Vec<String> {
        self.blocks.iter().flat_map(Block::names).collect()
    }

    fn dim(&self) -> usize {
        self.blocks.iter().map(Block::free).sum()
    }

    /// Unconstrained `x` to the constrained parameters (in [`Direct::names`] order) and the
    /// log-Jacobian.
    fn constrain(&self, x: &[f64]) -> (Vec<f64>, f64) {
        let (mut at, mut jac, mut q) = (0, 0.0, Vec::new());
        for b in &self.blocks {
            q.extend(b.constrain(&x[at..at + b.free()], &mut jac));
            at += b.free();
        }
        assert_eq!(at, x.len());
        (q, jac)
    }

    fn unconstrain(&self, q: &[f64]) -> Vec<f64> {
        let (mut at, mut x) = (0, Vec::new());
        for b in &self.blocks {
            x.extend(b.unconstrain(&q[at..at + b.constrained()]));
            at += b.constrained();
        }
        x
    }

    /// `log p(x)` up to a constant, with the log-Jacobian, at unconstrained `x`.
    fn log_density(&self, x: &[f64]) -> Acc {
        let (q, jac) = self.constrain(x);
        let mut acc = Acc::default();
        acc.add(jac);
        let d = &self.d;
        if let Some(r) = &self.reg {
            let k = r.x[0].len();
            let (beta, sigma) = (&q[..k], q[k]);
            for (row, &y) in r.x.iter().zip(&r.y) {
                let mu: f64 = row.iter().zip(beta).map(|(a, b)| a * b).sum();
                acc.add(normal_lpdf(y, mu, sigma));
            }
            if r.cauchy_sigma {
                acc.add(cauchy_lpdf(sigma, 0.0, 2.5));
            }
            return acc;
        }
        match self.name {
            "gp_pois_regr-gp_regr" => {
                let (rho, alpha, sigma) = (q[0], q[1], q[2]);
                let xs = d.vec("x");
                let n = xs.len();
                // gp_exp_quad_cov(x, alpha, rho) + diag(sigma): the program adds sigma itself,
                // not sigma^2, to the diagonal.
                let cov: Vec<Vec<f64>> = (0..n)
                    .map(|i| {
                        (0..n)
                            .map(|j| {
                                alpha * alpha * (-(xs[i] - xs[j]).powi(2) / (2.0 * rho * rho)).exp()
                                    + if i == j { sigma } else { 0.0 }
                            })
                            .collect()
                    })
                    .collect();
                acc.add(gamma_lpdf(rho, 25.0, 4.0));
                acc.add(normal_lpdf(alpha, 0.0, 2.0));
                acc.add(normal_lpdf(sigma, 0.0, 1.0));
                let mvn = multi_normal_cholesky_lpdf(&d.vec("y"), &cholesky(&cov));
                acc.add_with_magnitude(mvn.sum, mvn.magnitude);
            }
            "hmm_example-hmm_example" => {
                let theta = [[q[0], q[1]], [q[2], q[3]]];
                let mu = [q[4], q[5]];
                acc.add(normal_lpdf(mu[0], 3.0, 1.0));
                acc.add(normal_lpdf(mu[1], 10.0, 1.0));
                let y = d.vec("y");
                let emission = |t: usize, k: usize| normal_lpdf(y[t], mu[k], 1.0);
                Self::forward(&mut acc, y.len(), theta, emission);
            }
            "bball_drive_event_0-hmm_drive_0" => {
                let theta = [[q[0], q[1]], [q[2], q[3]]];
                let (phi, lambda) = ([q[4], q[5]], [q[6], q[7]]);
                let alpha = d.mat("alpha");
                // dirichlet_lpdf(theta[k] | alpha[k, ]') up to its normalising constant.
                for (alpha_k, theta_k) in alpha.iter().zip(&theta) {
                    for (a, t) in alpha_k.iter().zip(theta_k) {
                        acc.add((a - 1.0) * t.ln());
                    }
                }
                acc.add(normal_lpdf(phi[0], 0.0, 1.0));
                acc.add(normal_lpdf(phi[1], 3.0, 1.0));
                acc.add(normal_lpdf(lambda[0], 0.0, 1.0));
                acc.add(normal_lpdf(lambda[1], 3.0, 1.0));
                let (u, v) = (d.vec("u"), d.vec("v"));
                let emission = |t: usize, k: usize| exponential_lpdf(u[t], phi[k]) + exponential_lpdf(v[t], lambda[k]);
                Self::forward(&mut acc, u.len(), theta, emission);
            }
            "hudson_lynx_hare-lotka_volterra" => {
                let (theta, z_init, sigma) = (&q[..4], &q[4..6], &q[6..8]);
                let z = lotka_volterra(theta, [z_init[0], z_init[1]], &d.vec("ts"), RK4_STEPS_PER_UNIT);
                for (k, (&loc, &scale)) in [1.0, 0.05, 1.0, 0.05].iter().zip(&[0.5, 0.05, 0.5, 0.05]).enumerate() {
                    acc.add(normal_lpdf(theta[k], loc, scale));
                }
                let (y_init, y) = (d.vec("y_init"), d.mat("y"));
                for (k, (&s, &z0)) in sigma.iter().zip(z_init).enumerate() {
                    acc.add(lognormal_lpdf(s, -1.0, 1.0));
                    acc.add(lognormal_lpdf(z0, 10f64.ln(), 1.0));
                    acc.add(lognormal_lpdf(y_init[k], z0.ln(), s));
                    for (row, zn) in y.iter().zip(&z) {
                        acc.add(lognormal_lpdf(row[k], zn[k].ln(), s));
                    }
                }
            }
            "mcycle_gp-accel_gp" => {
                let nb = d.int("NBgp_1");
                let nbs = d.int("NBgp_sigma_1");
                let (intercept, sdgp, lscale, zgp) = (q[0], q[1], q[2], &q[3..3 + nb]);
                let s = 3 + nb;
                let (intercept_s, sdgp_s, lscale_s, zgp_s) = (q[s], q[s + 1], q[s + 2], &q[s + 3..s + 3 + nbs]);
                let mu = gpa(&d.mat("Xgp_1"), sdgp, lscale, zgp, &d.mat("slambda_1"));
                let eta = gpa(&d.mat("Xgp_sigma_1"), sdgp_s, lscale_s, zgp_s, &d.mat("slambda_sigma_1"));
                acc.add(student_t_lpdf(intercept, 3.0, -13.0, 36.0));
                // The half-t priors' `- student_t_lccdf(0 | 3, 0, 36)` is a constant (log 2).
                acc.add(student_t_lpdf(sdgp, 3.0, 0.0, 36.0));
                for &z in zgp {
                    acc.add(normal_lpdf(z, 0.0, 1.0));
                }
                acc.add(inv_gamma_lpdf(lscale, 1.124909, 0.0177));
                acc.add(student_t_lpdf(intercept_s, 3.0, 0.0, 10.0));
                acc.add(student_t_lpdf(sdgp_s, 3.0, 0.0, 36.0));
                for &z in zgp_s {
                    acc.add(normal_lpdf(z, 0.0, 1.0));
                }
                acc.add(inv_gamma_lpdf(lscale_s, 1.124909, 0.0177));
                assert_eq!(d.int("prior_only"), 0);
                for (i, y) in d.vec("Y").iter().enumerate() {
                    acc.add(normal_lpdf(*y, intercept + mu[i], (intercept_s + eta[i]).exp()));
                }
            }
            other => panic!("no direct computation for {other}"),
        }
        acc
    }

    /// The Stan programs' forward algorithm, as their loops: `gamma[1, k] = omega(1, k)`,
    /// `gamma[t, k] = log_sum_exp_j(gamma[t-1, j] + log theta[j, k] + omega(t, k))`,
    /// `target += log_sum_exp(gamma[N])` (no initial distribution).
    fn forward(acc: &mut Acc, n: usize, theta: [[f64; 2]; 2], omega: impl Fn(usize, usize) -> f64) {
        let mut gamma = [omega(0, 0), omega(0, 1)];
        let mut magnitude = gamma[0].abs().max(gamma[1].abs());
        for t in 1..n {
            let mut next = [0.0; 2];
            for (k, slot) in next.iter_mut().enumerate() {
                let terms: Vec<f64> = (0..2).map(|j| gamma[j] + theta[j][k].ln() + omega(t, k)).collect();
                *slot = log_sum_exp(&terms);
                magnitude += omega(t, k).abs() + theta[0][k].ln().abs().max(theta[1][k].ln().abs());
            }
            gamma = next;
        }
        acc.add_with_magnitude(log_sum_exp(&gamma), magnitude);
    }
}

/// brms' `gpa(X, sdgp, lscale, zgp, slambda) = X * (sqrt(spd(slambda)) .* zgp)` with the
/// exponentiated quadratic's spectral density `sdgp^2 (sqrt(2 pi) lscale)^D exp(-lscale^2 |w|^2 / 2)`.
fn gpa(x: &[Vec<f64>], sdgp: f64, lscale: f64, zgp: &[f64], slambda: &[Vec<f64>]) -> Vec<f64> {
    let dims = slambda[0].len() as i32;
    let constant = sdgp * sdgp * ((2.0 * PI).sqrt() * lscale).powi(dims);
    let w: Vec<f64> = slambda
        .iter()
        .zip(zgp)
        .map(|(s, z)| (constant * (-0.5 * lscale * lscale * s.iter().map(|v| v * v).sum::<f64>()).exp()).sqrt() * z)
        .collect();
    x.iter().map(|row| row.iter().zip(&w).map(|(a, b)| a * b).sum()).collect()
}

/// The Lotka-Volterra states `z(ts)` from `z(0) = z0` by classical RK4 with `per_unit` steps per
/// unit time (each output time is hit exactly).
fn lotka_volterra(theta: &[f64], z0: [f64; 2], ts: &[f64], per_unit: usize) -> Vec<[f64; 2]> {
    let (a, b, c, d) = (theta[0], theta[1], theta[2], theta[3]);
    let f = |z: [f64; 2]| [(a - b * z[1]) * z[0], (-c + d * z[0]) * z[1]];
    let axpy = |z: [f64; 2], h: f64, k: [f64; 2]| [z[0] + h * k[0], z[1] + h * k[1]];
    let (mut z, mut t) = (z0, 0.0);
    ts.iter()
        .map(|&to| {
            let steps = ((to - t) * per_unit as f64).ceil().max(1.0) as usize;
            let h = (to - t) / steps as f64;
            for _ in 0..steps {
                let k1 = f(z);
                let k2 = f(axpy(z, h / 2.0, k1));
                let k3 = f(axpy(z, h / 2.0, k2));
                let k4 = f(axpy(z, h, k3));
                z = [0, 1].map(|i| z[i] + h / 6.0 * (k1[i] + 2.0 * k2[i] + 2.0 * k3[i] + k4[i]));
            }
            t = to;
            z
        })
        .collect()
}

/// Stan's `integrate_ode_rk45` in f64, to measure the effect of its tolerances: Boost odeint's
/// controlled `runge_kutta_dopri5` stepping to each output time, with Boost's default error
/// checker (`max_i |err_i| / (atol + rtol (|z_i| + h |dz_i|))`) and step adjuster (shrink by
/// `max(0.9 e^(-1/3), 0.2)` on rejection, grow by `0.9 e^(-1/5)`, at most 5x, when `e < 0.5`),
/// first step 0.1 as Stan takes it.
#[allow(clippy::needless_range_loop)] // index loops as the textbook formulas write them
fn lotka_volterra_dopri5(theta: &[f64], z0: [f64; 2], ts: &[f64], rtol: f64, atol: f64) -> Vec<[f64; 2]> {
    const A: [[f64; 6]; 6] = [
        [1.0 / 5.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        [3.0 / 40.0, 9.0 / 40.0, 0.0, 0.0, 0.0, 0.0],
        [44.0 / 45.0, -56.0 / 15.0, 32.0 / 9.0, 0.0, 0.0, 0.0],
        [19372.0 / 6561.0, -25360.0 / 2187.0, 64448.0 / 6561.0, -212.0 / 729.0, 0.0, 0.0],
        [9017.0 / 3168.0, -355.0 / 33.0, 46732.0 / 5247.0, 49.0 / 176.0, -5103.0 / 18656.0, 0.0],
        [35.0 / 384.0, 0.0, 500.0 / 1113.0, 125.0 / 192.0, -2187.0 / 6784.0, 11.0 / 84.0],
    ];
    // 5th minus 4th order weights: the embedded error estimate.
    const E: [f64; 7] = [
        35.0 / 384.0 - 5179.0 / 57600.0,
        0.0,
        500.0 / 1113.0 - 7571.0 / 16695.0,
        125.0 / 192.0 - 393.0 / 640.0,
        -2187.0 / 6784.0 + 92097.0 / 339200.0,
        11.0 / 84.0 - 187.0 / 2100.0,
        -1.0 / 40.0,
    ];
    let (a, b, c, d) = (theta[0], theta[1], theta[2], theta[3]);
    let f = |z: [f64; 2]| [(a - b * z[1]) * z[0], (-c + d * z[0]) * z[1]];
    let (mut z, mut t, mut h) = (z0, 0.0f64, 0.1f64);
    let mut out = Vec::with_capacity(ts.len());
    for &to in ts {
        while t < to {
            let step = h.min(to - t);
            let mut k = [[0.0; 2]; 7];
            k[0] = f(z);
            for s in 0..6 {
                let stage = [0, 1].map(|i| z[i] + step * (0..=s).map(|r| A[s][r] * k[r][i]).sum::<f64>());
                k[s + 1] = f(stage);
            }
            let next = [0, 1].map(|i| z[i] + step * (0..6).map(|r| A[5][r] * k[r][i]).sum::<f64>());
            let err = (0..2)
                .map(|i| {
                    let e = step * (0..7).map(|r| E[r] * k[r][i]).sum::<f64>();
                    e.abs() / (atol + rtol * (z[i].abs() + step * k[0][i].abs()))
                })
                .fold(0.0, f64::max);
            if err > 1.0 {
                h = step * (0.9 * err.powf(-1.0 / 3.0)).max(0.2);
                continue;
            }
            (z, t) = (next, t + step);
            h = if err < 0.5 { step * 0.9 * err.max(5f64.powi(-5)).powf(-1.0 / 5.0) } else { step };
        }
        out.push(z);
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Test points.

/// A small deterministic generator for test points.
struct Lcg(u64);

impl Lcg {
    fn uniform(&mut self) -> f64 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f64 {
        (-2.0 * self.uniform().ln()).sqrt() * (2.0 * PI * self.uniform()).cos()
    }
}

/// Posterior-typical unconstrained points (200 of them) and the per-coordinate spread of the
/// unconstrained posterior. From the reference draws, read here by Stan name, mapped through
/// this file's inverse transforms; for accel_gp (moments only) drawn around the reference
/// moments, positive parameters lognormal with the reference mean and sd.
fn typical_points(dir: &Path, direct: &Direct) -> (Vec<Vec<f64>>, Vec<f64>) {
    let names = direct.names();
    let folder = dir.join(direct.name);
    let rows: Vec<Vec<f64>> = if folder.join("reference_draws.json").is_file() {
        let raw: Value =
            serde_json::from_str(&std::fs::read_to_string(folder.join("reference_draws.json")).unwrap()).unwrap();
        let chains = raw.as_array().unwrap();
        for chain in chains {
            let mut keys: Vec<&String> = chain.as_object().unwrap().keys().collect();
            let mut ours: Vec<&String> = names.iter().collect();
            keys.sort();
            ours.sort();
            assert_eq!(keys, ours, "{}: Stan's parameter names vs the reference draws' keys", direct.name);
        }
        let draws = chains[0][&names[0]].as_array().unwrap().len();
        let total = chains.len() * draws;
        (0..200)
            .map(|i| i * total / 200)
            .map(|r| {
                let chain = &chains[r / draws];
                let q: Vec<f64> = names.iter().map(|n| chain[n][r % draws].as_f64().unwrap()).collect();
                direct.unconstrain(&q)
            })
            .collect()
    } else {
        let raw: Value =
            serde_json::from_str(&std::fs::read_to_string(folder.join("reference_moments.json")).unwrap()).unwrap();
        let params = &raw["parameters"];
        let mut keys: Vec<&String> = params.as_object().unwrap().keys().collect();
        let mut ours: Vec<&String> = names.iter().collect();
        keys.sort();
        ours.sort();
        assert_eq!(keys, ours, "{}: Stan's parameter names vs the reference moments' keys", direct.name);
        // Unconstrained mean and sd of every coordinate (all blocks here are real or positive).
        let mut centre = Vec::new();
        for b in &direct.blocks {
            for n in b.names() {
                let (m, s) = (params[&n]["mean"].as_f64().unwrap(), params[&n]["sd"].as_f64().unwrap());
                centre.push(match b.kind {
                    Kind::Real => (m, s),
                    Kind::Positive => {
                        let v = (1.0 + (s / m).powi(2)).ln();
                        (m.ln() - 0.5 * v, v.sqrt())
                    }
                    _ => unreachable!("accel_gp has real and positive blocks"),
                });
            }
        }
        let mut rng = Lcg(3);
        (0..200).map(|_| centre.iter().map(|(m, s)| m + 0.5 * s * rng.normal()).collect()).collect()
    };
    assert_eq!(rows[0].len(), direct.dim(), "{}", direct.name);
    let dim = rows[0].len();
    let spread = (0..dim)
        .map(|j| {
            let m = rows.iter().map(|r| r[j]).sum::<f64>() / rows.len() as f64;
            (rows.iter().map(|r| (r[j] - m).powi(2)).sum::<f64>() / (rows.len() - 1) as f64).sqrt()
        })
        .collect();
    (rows, spread)
}

/// `G` of [`ode_effect`]: the states' global error as a multiple of the per-step tolerance.
const SOLVER_GROWTH: f64 = 2.0;

/// How much the model's adaptive Dormand-Prince (Stan's `integrate_ode_rk45(..., 1e-5, 1e-3,
/// 500)`) may move Lotka-Volterra's log density at `x`: each state may be off by `G (atol + rtol
/// |z|)`, and `|d log p / d z_nk| = |log y_nk - log z_nk| / (sigma_k^2 z_nk)` turns that into log
/// density. The controller holds each step's local error below `atol + rtol |z|` (the error
/// norm is a max over components, and steps grow once it is under half); over the ~35 accepted
/// steps of the 20 time units these add up, but partly cancel on this periodic orbit. An f64
/// replica of Stan's solver stays within a quarter of the allowance with `G = 2`
/// ([`lotka_volterra_solver_allowance_holds_stans_solver`]), which leaves a factor 4 for the
/// model's own step sequence (its error norm is the max over the batch) and f32.
fn ode_effect(direct: &Direct, x: &[f64]) -> f64 {
    let (q, _) = direct.constrain(x);
    let (theta, z_init, sigma) = (&q[..4], &q[4..6], &q[6..8]);
    let z = lotka_volterra(theta, [z_init[0], z_init[1]], &direct.d.vec("ts"), RK4_STEPS_PER_UNIT);
    let y = direct.d.mat("y");
    let mut effect = 0.0;
    for (row, zn) in y.iter().zip(&z) {
        for ((yk, zk), s) in row.iter().zip(zn).zip(sigma) {
            let slope = (yk.ln() - zk.ln()).abs() / (s * s * zk);
            effect += slope * SOLVER_GROWTH * (1e-3 + 1e-5 * zk.abs());
        }
    }
    effect
}

fn is_ode(name: &str) -> bool {
    name == "hudson_lynx_hare-lotka_volterra"
}

fn load(name: &str, dir: &Path, device: &Device) -> PosteriorDbModel {
    posteriordb::load(name, dir, device).unwrap_or_else(|e| panic!("{name}: {e}"))
}

// ---------------------------------------------------------------------------------------------
// The tests.

/// The reference RK4 is converged far below the model's solver tolerance: halving its step
/// moves the states by less than 1e-8 relative at a posterior-typical point.
#[test]
fn lotka_volterra_reference_converges() {
    let Some(dir) = suite("lotka_volterra_reference_converges") else { return };
    let direct = Direct::new(&dir, "hudson_lynx_hare-lotka_volterra");
    let (typical, _) = typical_points(&dir, &direct);
    for x in [&typical[0], &typical[100]] {
        let (q, _) = direct.constrain(x);
        let ts = direct.d.vec("ts");
        let coarse = lotka_volterra(&q[..4], [q[4], q[5]], &ts, RK4_STEPS_PER_UNIT);
        let fine = lotka_volterra(&q[..4], [q[4], q[5]], &ts, 2 * RK4_STEPS_PER_UNIT);
        for (a, b) in coarse.iter().zip(&fine) {
            for (ak, bk) in a.iter().zip(b) {
                assert!((ak - bk).abs() <= 1e-8 * bk.abs(), "RK4 not converged: {a:?} vs {b:?}");
            }
        }
    }
}

/// The solver allowance of [`ode_effect`] holds Stan's own algorithm: an f64 replica of the
/// controlled dopri5 at the model's tolerances (1e-5, 1e-3) moves Lotka-Volterra's log density
/// from the converged RK4's by well under the allowance at posterior-typical points.
#[test]
fn lotka_volterra_solver_allowance_holds_stans_solver() {
    let Some(dir) = suite("lotka_volterra_solver_allowance_holds_stans_solver") else { return };
    let direct = Direct::new(&dir, "hudson_lynx_hare-lotka_volterra");
    let (typical, _) = typical_points(&dir, &direct);
    let (ts, y) = (direct.d.vec("ts"), direct.d.mat("y"));
    let likelihood = |z: &[[f64; 2]], sigma: &[f64]| -> f64 {
        y.iter().zip(z).map(|(row, zn)| (0..2).map(|k| lognormal_lpdf(row[k], zn[k].ln(), sigma[k])).sum::<f64>()).sum()
    };
    let mut worst = 0.0f64;
    for x in typical.iter().step_by(10) {
        let (q, _) = direct.constrain(x);
        let exact = lotka_volterra(&q[..4], [q[4], q[5]], &ts, RK4_STEPS_PER_UNIT);
        let stan = lotka_volterra_dopri5(&q[..4], [q[4], q[5]], &ts, 1e-5, 1e-3);
        let moved = (likelihood(&stan, &q[6..8]) - likelihood(&exact, &q[6..8])).abs();
        let allowance = ode_effect(&direct, x);
        worst = worst.max(moved / allowance);
        assert!(moved <= 0.5 * allowance, "dopri5 at Stan's tolerances moves log p by {moved}, allowance {allowance}");
    }
    eprintln!("lotka_volterra: Stan's dopri5 moves log p by at most {worst:.3} of the solver allowance");
}

/// Every model's log density against the f64 program, as differences from a first point
/// (constants cancel), at reference points and perturbed ones; its reported quantities, by
/// Stan's name, against this file's transforms.
#[test]
fn log_densities_match_the_stan_programs() {
    let Some(dir) = suite("log_densities_match_the_stan_programs") else { return };
    let device = flex();
    let mut failures = Vec::new();
    for &name in new_posteriors() {
        let model = load(name, &dir, &device);
        assert!(model.deviation().is_none(), "{name}: {:?}", model.deviation());
        let direct = Direct::new(&dir, name);
        assert_eq!(model.dim(), direct.dim(), "{name}: dimension");
        let (typical, spread) = typical_points(&dir, &direct);
        let mut rng = Lcg(7);
        let mut points: Vec<Vec<f64>> = vec![typical[3].clone(), typical[101].clone(), typical[177].clone()];
        // Perturbed: by the posterior spread, and a fixed 0.3 in every coordinate. For the ODE,
        // within the posterior (its tails leave the solver's 500-step budget).
        let far = if is_ode(name) { 1.0 } else { 2.0 };
        for base in [&typical[50], &typical[150]] {
            points.push(base.iter().zip(&spread).map(|(x, s)| x + far * s * rng.normal()).collect());
        }
        if !is_ode(name) {
            points.push(typical[20].iter().map(|x| x + 0.3 * rng.normal()).collect());
        }
        let points: Vec<Vec<f64>> = points.iter().map(|p| as_f32(p)).collect();

        let lp = to_vec_f32(&model.log_prob(matrix(&points, &device), None));
        assert!(model.take_error().is_none(), "{name}: {:?}", model.take_error());
        let exact: Vec<Acc> = points.iter().map(|p| direct.log_density(p)).collect();
        let (mut worst, mut largest, mut allowance) = (0.0f64, 0.0f64, 0.0f64);
        for i in 1..points.len() {
            let ours = f64::from(lp[i]) - f64::from(lp[0]);
            let theirs = exact[i].sum - exact[0].sum;
            // f32 evaluation: rounding error scales with the magnitude of the summed terms; the
            // ODE's solver error adds its own effect at both points.
            let scale = exact[i].magnitude + exact[0].magnitude;
            let solver =
                if is_ode(name) { ode_effect(&direct, &points[i]) + ode_effect(&direct, &points[0]) } else { 0.0 };
            let tol = 1e-5 * scale + 1e-3 + solver;
            worst = worst.max((ours - theirs).abs() / tol);
            largest = largest.max((ours - theirs).abs());
            allowance = allowance.max(solver);
            if (ours - theirs).abs() > tol || !ours.is_finite() {
                failures.push(format!(
                    "{name}, point {i}: log p difference {ours} vs f64 program {theirs} (tolerance {tol:.3e}, log p {} vs {})",
                    lp[i], exact[i].sum
                ));
            }
        }
        eprintln!(
            "{name}: log p differences within {worst:.2} of their tolerance, largest {largest:.1e} (solver allowance {allowance:.1e}; log p {:.4e}, magnitude {:.2e})",
            exact[0].sum, exact[0].magnitude
        );

        // Reported quantities, by Stan's name.
        let model_names = model.param_names();
        let reported = host_rows(&model.reported(matrix(&points, &device)));
        for (p, row) in points.iter().zip(&reported) {
            assert_eq!(row.len(), model_names.len(), "{name}: reported width");
            let (q, _) = direct.constrain(p);
            for (stan_name, b) in direct.names().iter().zip(&q) {
                let Some(j) = model_names.iter().position(|m| m == stan_name) else {
                    failures.push(format!("{name}: the model does not report `{stan_name}` ({model_names:?})"));
                    continue;
                };
                let a = row[j];
                if (a - b).abs() > 1e-5 * (1.0 + b.abs()) {
                    failures.push(format!("{name}: reported {stan_name} = {a}, f64 transform {b}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

/// Autodiff scores against central differences of the model's own log density (f32: a step of
/// the local scale's order, a tolerance for rounding), and against central differences of the
/// f64 program with a small step (tight).
#[test]
#[allow(clippy::needless_range_loop)] // one coordinate's quantities across several vectors
fn scores_match_finite_differences() {
    let Some(dir) = suite("scores_match_finite_differences") else { return };
    let device = flex();
    let mut failures = Vec::new();
    for &name in new_posteriors() {
        let model = load(name, &dir, &device);
        let direct = Direct::new(&dir, name);
        let (typical, spread) = typical_points(&dir, &direct);
        let mut rng = Lcg(11);
        let x0 = as_f32(&typical[42].iter().zip(&spread).map(|(x, s)| x + 0.5 * s * rng.normal()).collect::<Vec<_>>());
        let dim = x0.len();
        let g = to_vec_f32(&score(&model, matrix(std::slice::from_ref(&x0), &device), None).unwrap().grad);
        let exact = |p: &[f64]| direct.log_density(p).sum;
        let moved = |j: usize, by: f64| -> Vec<f64> {
            let mut p = x0.clone();
            p[j] += by;
            p
        };
        // The local scale of each coordinate: the posterior spread, or the conditional scale
        // 1 / sqrt(|d2 log p / dx_j^2|) where that is smaller.
        let local: Vec<f64> = (0..dim)
            .map(|j| {
                let e = 1e-3 * spread[j];
                let curvature = (exact(&moved(j, e)) - 2.0 * exact(&x0) + exact(&moved(j, -e))) / (e * e);
                if curvature.abs() > 0.0 { spread[j].min(1.0 / curvature.abs().sqrt()) } else { spread[j] }
            })
            .collect();
        let quotient = |j: usize, h: f64| (exact(&moved(j, h)) - exact(&moved(j, -h))) / (2.0 * h);
        // The exact derivative (f64, tiny step), and for the f32 model the largest step, from the
        // local scale down, whose truncation error (measured on the f64 program) is below 0.5%.
        let fd_exact: Vec<f64> = (0..dim).map(|j| quotient(j, 1e-4 * local[j])).collect();
        let steps: Vec<f64> = (0..dim)
            .map(|j| {
                let mut h = local[j];
                while h > 1e-3 * local[j]
                    && (quotient(j, h) - fd_exact[j]).abs() > 5e-3 * (fd_exact[j].abs() + 1.0 / local[j])
                {
                    h /= 2.0;
                }
                h
            })
            .collect();
        let mut shifted = Vec::with_capacity(2 * dim);
        for (j, h) in steps.iter().enumerate() {
            for sign in [1.0, -1.0] {
                shifted.push(as_f32(&moved(j, sign * h)));
            }
        }
        let lp = to_vec_f32(&model.log_prob(matrix(&shifted, &device), None));
        assert!(model.take_error().is_none(), "{name}: {:?}", model.take_error());
        let magnitude = direct.log_density(&x0).magnitude;
        // The solver's error in log p, varying over a coordinate's local scale, moves its
        // derivative by about that error / the local scale.
        let solver = if is_ode(name) { ode_effect(&direct, &x0) } else { 0.0 };
        let mut worst = 0.0f64;
        for j in 0..dim {
            let step = shifted[2 * j][j] - shifted[2 * j + 1][j];
            let fd_model = (f64::from(lp[2 * j]) - f64::from(lp[2 * j + 1])) / step;
            let ad = f64::from(g[j]);
            let scale = 1.0 / local[j];
            let tol_model = 0.02 * (ad.abs() + scale) + 2e-6 * magnitude / step + 2.0 * solver / step;
            let tol_exact = 2e-3 * (ad.abs() + scale) + solver / local[j];
            worst = worst.max((ad - fd_exact[j]).abs() / tol_exact);
            if (ad - fd_model).abs() > tol_model || ad.is_nan() {
                failures.push(format!(
                    "{name}, coordinate {j}: autodiff {ad} vs finite differences of log_prob {fd_model} (tolerance {tol_model:.3e})"
                ));
            }
            if (ad - fd_exact[j]).abs() > tol_exact || ad.is_nan() {
                failures.push(format!(
                    "{name}, coordinate {j}: autodiff {ad} vs finite differences of the f64 program {} (tolerance {tol_exact:.3e})",
                    fd_exact[j]
                ));
            }
        }
        eprintln!("{name}: scores within {worst:.2} of their tolerance against the f64 program");
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}
