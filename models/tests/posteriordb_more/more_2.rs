//! election88_full, hier_2pl, Mh_model, bones_model and accel_splines against independent `f64`
//! evaluations of their Stan programs, written here in plain loops from `model.stan`: the data
//! read from `data.json` by this file, each constraint transform with its log-Jacobian as Stan
//! math adds it (`lub_constrain`, `lb_constrain`, `cholesky_corr_constrain`), the bivariate
//! normal through its covariance matrix (not the model's chain rule), the LKJ density by Stan's
//! formula, Mh's marginalised latent state and bones' category probabilities as the programs'
//! loops. Checked: log density differences between points, autodiff scores against central
//! differences of the f64 program, reported and generated quantities by Stan's names, the data
//! checks, and for bones (the one of the five with a reference) NUTS against Stan's draws.
//!
//! The suite folder is `PARVI_POSTERIORDB_MORE_DIR`, else `$PARVI_DATA_DIR/../posteriordb-more`,
//! else `../shared/posteriordb-more` beside the workspace. Without it the tests print a note and
//! pass, unless `PARVI_REQUIRE_POSTERIORDB=1`.

use std::f64::consts::PI;
use std::path::{Path, PathBuf};

use parvi_infer::EngineRng;
use parvi_infer::engines::{NutsConfig, nuts};
use parvi_infer::evaluation::{ess, split_rhat};
use parvi_model::program::StanModel;
use parvi_model::tensor_ops::to_vec_f32;
use parvi_model::{LogDensity, score};
use parvi_models::posteriordb::compare::compare;
use parvi_models::posteriordb::{self, PosteriorDbModel, ReferenceDraws};
use serde_json::Value;

use super::common::{flex, host_rows, matrix};
use super::{Acc, Lcg, as_f32, logit, normal_lpdf, sigmoid};

const ELECTION88: &str = "election88-election88_full";
const HIER_2PL: &str = "sat-hier_2pl";
const MH: &str = "Mh_data-Mh_model";
const BONES: &str = "bones_data-bones_model";
const SPLINES: &str = "mcycle_splines-accel_splines";

/// The folders this file checks.
const FOLDERS: [&str; 5] = [ELECTION88, HIER_2PL, MH, BONES, SPLINES];

/// The suite folder (the harness's finder, [`super::more_suite`]).
fn more_suite(test: &str) -> Option<PathBuf> {
    super::more_suite(test)
}

fn load(folder: &str, dir: &Path) -> PosteriorDbModel {
    posteriordb::load(folder, dir, &flex()).unwrap_or_else(|e| panic!("{folder}: {e}"))
}

// ---------------------------------------------------------------------------------------------
// Densities and transforms in f64.

/// Up to a constant in `y`, `mu`, `sigma` (`nu` fixed).
fn student_t_lpdf(y: f64, nu: f64, mu: f64, sigma: f64) -> f64 {
    -sigma.ln() - 0.5 * (nu + 1.0) * (((y - mu) / sigma).powi(2) / nu).ln_1p()
}

/// `ln(1 + e^x)` without overflow.
fn softplus(x: f64) -> f64 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

/// `bernoulli_logit_lpmf(y | eta)`.
fn bernoulli_logit_lpmf(y: f64, eta: f64) -> f64 {
    if y == 1.0 { -softplus(-eta) } else { -softplus(eta) }
}

/// `ln C(n, k)` for small whole numbers.
fn ln_choose(n: u64, k: u64) -> f64 {
    (1..=k).map(|i| ((n - k + i) as f64 / i as f64).ln()).sum()
}

fn log_sum_exp(a: f64, b: f64) -> f64 {
    let m = a.max(b);
    m + ((a - m).exp() + (b - m).exp()).ln()
}

/// Stan's `lub_constrain`: `lower + (upper - lower) sigmoid(x)`, log-Jacobian
/// `ln(upper - lower) + ln sigmoid(x) + ln(1 - sigmoid(x))`.
fn interval(x: f64, lower: f64, upper: f64, jac: &mut f64) -> f64 {
    *jac += (upper - lower).ln() - softplus(-x) - softplus(x);
    lower + (upper - lower) * sigmoid(x)
}

/// The inverse of [`interval`].
fn interval_free(y: f64, lower: f64, upper: f64) -> f64 {
    logit((y - lower) / (upper - lower))
}

/// Stan's `lb_constrain` at 0: `exp(x)`, log-Jacobian `x`.
fn positive(x: f64, jac: &mut f64) -> f64 {
    *jac += x;
    x.exp()
}

/// Stan math's `cholesky_corr_constrain` for `K = 2`: `z = tanh(x)` (`corr_constrain`, adding
/// `ln(1 - z^2)`), `L = [[1, 0], [z, sqrt(1 - z^2)]]`; no further term for `K = 2`.
fn cholesky_corr_2(x: f64, jac: &mut f64) -> [[f64; 2]; 2] {
    let z = x.tanh();
    *jac += (1.0 - z * z).ln();
    [[1.0, 0.0], [z, (1.0 - z * z).sqrt()]]
}

/// Stan's `lkj_corr_cholesky_lpdf(L | eta)` up to its constant:
/// `sum_{k=2}^{K} (K - k + 2 eta - 2) ln L_kk`.
fn lkj_corr_cholesky_lpdf(l: &[[f64; 2]; 2], eta: f64) -> f64 {
    let k = l.len();
    (1..k).map(|i| ((k - i - 1) as f64 + 2.0 * eta - 2.0) * l[i][i].ln()).sum()
}

/// `multi_normal_lpdf(y | mu, Sigma)` for a `2 x 2` covariance, by its inverse and determinant.
fn bivariate_normal_lpdf(y: [f64; 2], mu: [f64; 2], sigma: [[f64; 2]; 2]) -> f64 {
    let det = sigma[0][0] * sigma[1][1] - sigma[0][1] * sigma[1][0];
    let d = [y[0] - mu[0], y[1] - mu[1]];
    let quad = (sigma[1][1] * d[0] * d[0] - 2.0 * sigma[0][1] * d[0] * d[1] + sigma[0][0] * d[1] * d[1]) / det;
    -(2.0 * PI).ln() - 0.5 * det.ln() - 0.5 * quad
}

// ---------------------------------------------------------------------------------------------
// Stan's data, read here.

struct StanData(serde_json::Map<String, Value>);

impl StanData {
    fn read(dir: &Path, folder: &str) -> Self {
        let text = std::fs::read_to_string(dir.join(folder).join("data.json")).unwrap();
        match serde_json::from_str(&text).unwrap() {
            Value::Object(m) => Self(m),
            _ => panic!("data.json of {folder} is not an object"),
        }
    }
    fn int(&self, k: &str) -> usize {
        self.0[k].as_u64().unwrap() as usize
    }
    fn vec(&self, k: &str) -> Vec<f64> {
        self.0[k].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect()
    }
    /// A Stan index array, 0-based.
    fn index(&self, k: &str) -> Vec<usize> {
        self.vec(k).iter().map(|&v| v as usize - 1).collect()
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
// The Stan programs.

/// One Stan program, evaluated directly on the unconstrained coordinates.
trait Direct {
    fn folder(&self) -> &'static str;
    fn dim(&self) -> usize;
    /// `log p(x)` up to a constant, with the log-Jacobian.
    fn log_density(&self, x: &[f64]) -> Acc;
    /// A point where the posterior has mass (or near it), unconstrained.
    fn point(&self, rng: &mut Lcg) -> Vec<f64>;
    /// Some reported quantities (parameters and transformed parameters), by Stan's name.
    fn reported(&self, x: &[f64]) -> Vec<(String, f64)>;
}

/// `election88_full`.
struct Election88 {
    y: Vec<f64>,
    black: Vec<f64>,
    female: Vec<f64>,
    v_prev: Vec<f64>,
    /// `age`, `edu`, `age_edu`, `state`, `region_full`, 0-based.
    index: [Vec<usize>; 5],
    sizes: [usize; 5],
}

impl Election88 {
    fn new(d: &StanData) -> Self {
        Self {
            y: d.vec("y"),
            black: d.vec("black"),
            female: d.vec("female"),
            v_prev: d.vec("v_prev_full"),
            index: ["age", "edu", "age_edu", "state", "region_full"].map(|k| d.index(k)),
            sizes: ["n_age", "n_edu", "n_age_edu", "n_state", "n_region_full"].map(|k| d.int(k)),
        }
    }

    /// The effects (`a` .. `e`), `beta`, the five scales and the log-Jacobian.
    fn unpack<'a>(&self, x: &'a [f64]) -> (Vec<&'a [f64]>, &'a [f64], Vec<f64>, f64) {
        let mut at = 0;
        let mut effects = Vec::new();
        for s in self.sizes {
            effects.push(&x[at..at + s]);
            at += s;
        }
        let beta = &x[at..at + 5];
        let mut jac = 0.0;
        let scales = x[at + 5..at + 10].iter().map(|&v| interval(v, 0.0, 100.0, &mut jac)).collect();
        (effects, beta, scales, jac)
    }

    fn y_hat(&self, effects: &[&[f64]], beta: &[f64], i: usize) -> f64 {
        let (b, f) = (self.black[i], self.female[i]);
        beta[0]
            + beta[1] * b
            + beta[2] * f
            + beta[4] * f * b
            + beta[3] * self.v_prev[i]
            + (0..5).map(|g| effects[g][self.index[g][i]]).sum::<f64>()
    }
}

impl Direct for Election88 {
    fn folder(&self) -> &'static str {
        ELECTION88
    }
    fn dim(&self) -> usize {
        self.sizes.iter().sum::<usize>() + 10
    }
    fn log_density(&self, x: &[f64]) -> Acc {
        let (effects, beta, scales, jac) = self.unpack(x);
        let mut acc = Acc::default();
        acc.add(jac);
        for (effect, &scale) in effects.iter().zip(&scales) {
            for &v in *effect {
                acc.add(normal_lpdf(v, 0.0, scale));
            }
        }
        for &b in beta {
            acc.add(normal_lpdf(b, 0.0, 100.0));
        }
        for (i, &y) in self.y.iter().enumerate() {
            acc.add(bernoulli_logit_lpmf(y, self.y_hat(&effects, beta, i)));
        }
        acc
    }
    fn point(&self, rng: &mut Lcg) -> Vec<f64> {
        let scales: Vec<f64> = (0..5).map(|_| (-1.0 + 0.5 * rng.normal()).exp()).collect();
        let mut x = Vec::new();
        for (s, scale) in self.sizes.iter().zip(&scales) {
            x.extend((0..*s).map(|_| scale * rng.normal()));
        }
        x.extend((0..5).map(|_| 0.5 * rng.normal()));
        x.extend(scales.iter().map(|&s| interval_free(s, 0.0, 100.0)));
        x
    }
    fn reported(&self, x: &[f64]) -> Vec<(String, f64)> {
        let (effects, beta, scales, _) = self.unpack(x);
        let n = self.y.len();
        vec![
            ("a[2]".into(), effects[0][1]),
            ("d[51]".into(), effects[3][50]),
            ("beta[5]".into(), beta[4]),
            ("sigma_a".into(), scales[0]),
            ("sigma_e".into(), scales[4]),
            ("y_hat[1]".into(), self.y_hat(&effects, beta, 0)),
            (format!("y_hat[{n}]"), self.y_hat(&effects, beta, n - 1)),
        ]
    }
}

/// `hier_2pl`.
struct Hier2pl {
    items: usize,
    persons: usize,
    ii: Vec<usize>,
    jj: Vec<usize>,
    y: Vec<f64>,
}

/// hier_2pl's parameters on the constrained scale.
struct Hier2plParams<'a> {
    theta: &'a [f64],
    xi1: &'a [f64],
    xi2: &'a [f64],
    mu: [f64; 2],
    tau: [f64; 2],
    l: [[f64; 2]; 2],
    jac: f64,
}

impl Hier2pl {
    fn unpack<'a>(&self, x: &'a [f64]) -> Hier2plParams<'a> {
        let (j, i) = (self.persons, self.items);
        let mut jac = 0.0;
        let tau = [positive(x[j + 2 * i + 2], &mut jac), positive(x[j + 2 * i + 3], &mut jac)];
        Hier2plParams {
            theta: &x[..j],
            xi1: &x[j..j + i],
            xi2: &x[j + i..j + 2 * i],
            mu: [x[j + 2 * i], x[j + 2 * i + 1]],
            tau,
            l: cholesky_corr_2(x[j + 2 * i + 4], &mut jac),
            jac,
        }
    }
}

impl Direct for Hier2pl {
    fn folder(&self) -> &'static str {
        HIER_2PL
    }
    fn dim(&self) -> usize {
        self.persons + 2 * self.items + 5
    }
    fn log_density(&self, x: &[f64]) -> Acc {
        let p = self.unpack(x);
        let mut acc = Acc::default();
        acc.add(p.jac);
        // Sigma = diag(tau) Omega diag(tau), Omega = L L^T.
        let r = p.l[1][0] * p.l[0][0];
        let sigma = [[p.tau[0] * p.tau[0], p.tau[0] * p.tau[1] * r], [p.tau[0] * p.tau[1] * r, p.tau[1] * p.tau[1]]];
        for (a, b) in p.xi1.iter().zip(p.xi2) {
            acc.add(bivariate_normal_lpdf([*a, *b], p.mu, sigma));
        }
        for &t in p.theta {
            acc.add(normal_lpdf(t, 0.0, 1.0));
        }
        acc.add(lkj_corr_cholesky_lpdf(&p.l, 4.0));
        acc.add(normal_lpdf(p.mu[0], 0.0, 1.0));
        acc.add(0.1f64.ln() - 0.1 * p.tau[0]);
        acc.add(normal_lpdf(p.mu[1], 0.0, 5.0));
        acc.add(0.1f64.ln() - 0.1 * p.tau[1]);
        for ((&i, &j), &y) in self.ii.iter().zip(&self.jj).zip(&self.y) {
            acc.add(bernoulli_logit_lpmf(y, p.xi1[i].exp() * (p.theta[j] - p.xi2[i])));
        }
        acc
    }
    fn point(&self, rng: &mut Lcg) -> Vec<f64> {
        let mut x: Vec<f64> = (0..self.persons).map(|_| rng.normal()).collect();
        x.extend((0..self.items).map(|_| 0.3 * rng.normal()));
        x.extend((0..self.items).map(|_| rng.normal()));
        x.extend([0.3 * rng.normal(), 0.5 * rng.normal(), -1.0 + 0.3 * rng.normal(), 0.3 * rng.normal()]);
        x.push(0.5 * rng.normal());
        x
    }
    fn reported(&self, x: &[f64]) -> Vec<(String, f64)> {
        let p = self.unpack(x);
        let i = self.items;
        vec![
            ("theta[600]".into(), p.theta[self.persons - 1]),
            ("tau[2]".into(), p.tau[1]),
            ("L_Omega[2,1]".into(), p.l[1][0]),
            ("L_Omega[2,2]".into(), p.l[1][1]),
            ("alpha[1]".into(), p.xi1[0].exp()),
            (format!("beta[{i}]"), p.xi2[i - 1]),
            ("xi[3,1]".into(), p.xi1[2]),
            ("xi[3,2]".into(), p.xi2[2]),
        ]
    }
}

/// `Mh_model`.
struct Mh {
    occasions: u64,
    y: Vec<u64>,
}

impl Mh {
    /// `omega`, `mean_p`, `sigma`, `eps` and the log-Jacobian.
    fn unpack(&self, x: &[f64]) -> (f64, f64, f64, Vec<f64>, f64) {
        let mut jac = 0.0;
        let omega = interval(x[0], 0.0, 1.0, &mut jac);
        let mean_p = interval(x[1], 0.0, 1.0, &mut jac);
        let sigma = interval(x[2], 0.0, 5.0, &mut jac);
        let eps = x[3..].iter().map(|r| logit(mean_p) + sigma * r).collect();
        (omega, mean_p, sigma, eps, jac)
    }

    /// The probability that an individual never detected is in the population.
    fn present(&self, omega: f64, eps: f64) -> f64 {
        let q_t = sigmoid(-eps).powi(self.occasions as i32);
        omega * q_t / (omega * q_t + (1.0 - omega))
    }
}

impl Direct for Mh {
    fn folder(&self) -> &'static str {
        MH
    }
    fn dim(&self) -> usize {
        3 + self.y.len()
    }
    fn log_density(&self, x: &[f64]) -> Acc {
        let (omega, _, _, eps, jac) = self.unpack(x);
        let mut acc = Acc::default();
        acc.add(jac);
        for r in &x[3..] {
            acc.add(normal_lpdf(*r, 0.0, 1.0));
        }
        let t = self.occasions;
        for (&y, &e) in self.y.iter().zip(&eps) {
            let (log_p, log_q) = (-softplus(-e), -softplus(e));
            if y > 0 {
                acc.add(omega.ln() + ln_choose(t, y) + y as f64 * log_p + (t - y) as f64 * log_q);
            } else {
                acc.add(log_sum_exp(omega.ln() + t as f64 * log_q, (1.0 - omega).ln()));
            }
        }
        acc
    }
    fn point(&self, rng: &mut Lcg) -> Vec<f64> {
        let mut x = vec![
            logit(0.55 + 0.1 * rng.uniform()),
            logit(0.2 + 0.1 * rng.uniform()),
            interval_free(0.5 + rng.uniform(), 0.0, 5.0),
        ];
        x.extend((0..self.y.len()).map(|_| rng.normal()));
        x
    }
    fn reported(&self, x: &[f64]) -> Vec<(String, f64)> {
        let (omega, mean_p, sigma, eps, _) = self.unpack(x);
        let m = eps.len();
        vec![
            ("omega".into(), omega),
            ("mean_p".into(), mean_p),
            ("sigma".into(), sigma),
            ("eps_raw[7]".into(), x[3 + 6]),
            ("eps[1]".into(), eps[0]),
            (format!("eps[{m}]"), eps[m - 1]),
        ]
    }
}

/// `bones_model`.
struct Bones {
    gamma: Vec<Vec<f64>>,
    delta: Vec<f64>,
    ncat: Vec<usize>,
    grade: Vec<Vec<i64>>,
    /// Stan's posterior mean and sd of each `theta[i]`, for test points.
    moments: Vec<(f64, f64)>,
}

impl Direct for Bones {
    fn folder(&self) -> &'static str {
        BONES
    }
    fn dim(&self) -> usize {
        self.grade.len()
    }
    /// The program's loops: `Q[k] = inv_logit(delta[j] (theta[i] - gamma[j, k]))`, `p[1] = 1 -
    /// Q[1]`, `p[k] = Q[k - 1] - Q[k]`, `p[ncat] = Q[ncat - 1]`, `log p[grade]` where observed.
    #[allow(clippy::needless_range_loop)] // the program's loop, as it reads
    fn log_density(&self, theta: &[f64]) -> Acc {
        let mut acc = Acc::default();
        for &t in theta {
            acc.add(normal_lpdf(t, 0.0, 36.0));
        }
        for (i, row) in self.grade.iter().enumerate() {
            for (j, &g) in row.iter().enumerate() {
                let k = self.ncat[j];
                let q: Vec<f64> = (0..k - 1).map(|c| sigmoid(self.delta[j] * (theta[i] - self.gamma[j][c]))).collect();
                let mut p = vec![0.0; k];
                p[0] = 1.0 - q[0];
                for c in 1..k - 1 {
                    p[c] = q[c - 1] - q[c];
                }
                p[k - 1] = q[k - 2];
                if g != -1 {
                    acc.add(p[g as usize - 1].ln());
                }
            }
        }
        acc
    }
    fn point(&self, rng: &mut Lcg) -> Vec<f64> {
        self.moments.iter().map(|(m, s)| m + s * rng.normal()).collect()
    }
    fn reported(&self, x: &[f64]) -> Vec<(String, f64)> {
        x.iter().enumerate().map(|(i, &v)| (format!("theta[{}]", i + 1), v)).collect()
    }
}

/// `accel_splines`.
struct Splines {
    y: Vec<f64>,
    xs: Vec<Vec<f64>>,
    zs: Vec<Vec<f64>>,
    xs_sigma: Vec<Vec<f64>>,
    zs_sigma: Vec<Vec<f64>>,
}

/// accel_splines' parameters on the constrained scale, as the parameters block orders them.
struct SplineParams<'a> {
    intercept: f64,
    bs: &'a [f64],
    zs: &'a [f64],
    sds: f64,
    intercept_s: f64,
    bs_s: &'a [f64],
    zs_s: &'a [f64],
    sds_s: f64,
    jac: f64,
}

impl Splines {
    fn unpack<'a>(&self, x: &'a [f64]) -> SplineParams<'a> {
        let (ks, k, kss, ksig) = (self.xs[0].len(), self.zs[0].len(), self.xs_sigma[0].len(), self.zs_sigma[0].len());
        let mut jac = 0.0;
        let mut at = 0;
        let mut take = |len: usize| {
            let s = &x[at..at + len];
            at += len;
            s
        };
        let intercept = take(1)[0];
        let bs = take(ks);
        let zs = take(k);
        let sds = positive(take(1)[0], &mut jac);
        let intercept_s = take(1)[0];
        let bs_s = take(kss);
        let zs_s = take(ksig);
        let sds_s = positive(take(1)[0], &mut jac);
        SplineParams { intercept, bs, zs, sds, intercept_s, bs_s, zs_s, sds_s, jac }
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

impl Direct for Splines {
    fn folder(&self) -> &'static str {
        SPLINES
    }
    fn dim(&self) -> usize {
        self.xs[0].len() + self.zs[0].len() + self.xs_sigma[0].len() + self.zs_sigma[0].len() + 4
    }
    fn log_density(&self, x: &[f64]) -> Acc {
        let p = self.unpack(x);
        let mut acc = Acc::default();
        acc.add(p.jac);
        acc.add(student_t_lpdf(p.intercept, 3.0, -13.0, 36.0));
        for &z in p.zs.iter().chain(p.zs_s) {
            acc.add(normal_lpdf(z, 0.0, 1.0));
        }
        // The half-t priors' `- student_t_lccdf(0 | 3, 0, 36)` is a constant.
        acc.add(student_t_lpdf(p.sds, 3.0, 0.0, 36.0));
        acc.add(student_t_lpdf(p.intercept_s, 3.0, 0.0, 10.0));
        acc.add(student_t_lpdf(p.sds_s, 3.0, 0.0, 36.0));
        let s: Vec<f64> = p.zs.iter().map(|z| p.sds * z).collect();
        let s_s: Vec<f64> = p.zs_s.iter().map(|z| p.sds_s * z).collect();
        for (n, &y) in self.y.iter().enumerate() {
            let mu = p.intercept + dot(&self.xs[n], p.bs) + dot(&self.zs[n], &s);
            let sigma = (p.intercept_s + dot(&self.xs_sigma[n], p.bs_s) + dot(&self.zs_sigma[n], &s_s)).exp();
            acc.add(normal_lpdf(y, mu, sigma));
        }
        acc
    }
    fn point(&self, rng: &mut Lcg) -> Vec<f64> {
        // Scales where the fitted curves are of the data's size: the mean's spline within
        // tens of the data's units, the log-sd's within about one.
        let mut x = vec![-25.0 + 5.0 * rng.normal()];
        x.extend((0..self.xs[0].len()).map(|_| 10.0 * rng.normal()));
        x.extend((0..self.zs[0].len()).map(|_| 0.3 * rng.normal()));
        x.push(3.0 + 0.3 * rng.normal());
        x.push(3.5 + 0.2 * rng.normal());
        x.extend((0..self.xs_sigma[0].len()).map(|_| 0.3 * rng.normal()));
        x.extend((0..self.zs_sigma[0].len()).map(|_| 0.3 * rng.normal()));
        x.push(-1.0 + 0.3 * rng.normal());
        x
    }
    fn reported(&self, x: &[f64]) -> Vec<(String, f64)> {
        let p = self.unpack(x);
        let k = p.zs_s.len();
        vec![
            ("Intercept".into(), p.intercept),
            ("bs[1]".into(), p.bs[0]),
            ("sds_1_1".into(), p.sds),
            ("sds_sigma_1_1".into(), p.sds_s),
            ("s_1_1[1]".into(), p.sds * p.zs[0]),
            (format!("s_sigma_1_1[{k}]"), p.sds_s * p.zs_s[k - 1]),
        ]
    }
}

/// The f64 program of folder `folder`.
fn direct(dir: &Path, folder: &str) -> Box<dyn Direct> {
    let d = StanData::read(dir, folder);
    match folder {
        ELECTION88 => Box::new(Election88::new(&d)),
        HIER_2PL => Box::new(Hier2pl {
            items: d.int("I"),
            persons: d.int("J"),
            ii: d.index("ii"),
            jj: d.index("jj"),
            y: d.vec("y"),
        }),
        MH => Box::new(Mh { occasions: d.int("T") as u64, y: d.vec("y").iter().map(|&v| v as u64).collect() }),
        BONES => {
            let text = std::fs::read_to_string(dir.join(folder).join("reference_moments.json")).unwrap();
            let raw: Value = serde_json::from_str(&text).unwrap();
            let children = d.int("nChild");
            let moments = (1..=children)
                .map(|i| {
                    let m = &raw["parameters"][format!("theta[{i}]")];
                    (m["mean"].as_f64().unwrap(), m["sd"].as_f64().unwrap())
                })
                .collect();
            Box::new(Bones {
                gamma: d.mat("gamma"),
                delta: d.vec("delta"),
                ncat: d.vec("ncat").iter().map(|&v| v as usize).collect(),
                grade: d.mat("grade").iter().map(|r| r.iter().map(|&v| v as i64).collect()).collect(),
                moments,
            })
        }
        SPLINES => Box::new(Splines {
            y: d.vec("Y"),
            xs: d.mat("Xs"),
            zs: d.mat("Zs_1_1"),
            xs_sigma: d.mat("Xs_sigma"),
            zs_sigma: d.mat("Zs_sigma_1_1"),
        }),
        other => panic!("no f64 program for {other}"),
    }
}

// ---------------------------------------------------------------------------------------------
// The tests.

/// Every model's log density against the f64 program, as differences from a first point
/// (constants cancel), at three plausible points and two perturbed ones; its reported
/// quantities, by Stan's name, against this file's transforms.
#[test]
fn log_densities_match_the_stan_programs() {
    let Some(dir) = more_suite("log_densities_match_the_stan_programs") else { return };
    let device = flex();
    let mut failures = Vec::new();
    for folder in FOLDERS {
        let model = load(folder, &dir);
        let program = direct(&dir, folder);
        assert_eq!(program.folder(), folder);
        assert_eq!(model.dim(), program.dim(), "{folder}: dimension");
        let mut rng = Lcg(7);
        let mut points: Vec<Vec<f64>> = (0..3).map(|_| program.point(&mut rng)).collect();
        for base in 0..2 {
            let moved = points[base].iter().map(|x| x + 0.3 * rng.normal()).collect();
            points.push(moved);
        }
        let points: Vec<Vec<f64>> = points.iter().map(|p| as_f32(p)).collect();
        let lp = to_vec_f32(&model.log_prob(matrix(&points, &device), None));
        assert!(model.take_error().is_none(), "{folder}: {:?}", model.take_error());
        let exact: Vec<Acc> = points.iter().map(|p| program.log_density(p)).collect();
        let mut worst = 0.0f64;
        for i in 1..points.len() {
            let ours = f64::from(lp[i]) - f64::from(lp[0]);
            let theirs = exact[i].sum - exact[0].sum;
            let tol = 1e-5 * (exact[i].magnitude + exact[0].magnitude) + 1e-3;
            worst = worst.max((ours - theirs).abs() / tol);
            if (ours - theirs).abs() > tol || !ours.is_finite() {
                failures.push(format!(
                    "{folder}, point {i}: log p difference {ours} vs f64 program {theirs} (tolerance {tol:.3e})"
                ));
            }
        }
        eprintln!(
            "{folder}: log p differences within {worst:.2} of their tolerance (log p {:.4e}, magnitude {:.2e})",
            exact[0].sum, exact[0].magnitude
        );

        let names = model.param_names();
        let reported = host_rows(&model.reported(matrix(&points, &device)));
        for (p, row) in points.iter().zip(&reported) {
            assert_eq!(row.len(), names.len(), "{folder}: reported width");
            for (name, b) in program.reported(p) {
                let Some(j) = names.iter().position(|m| *m == name) else {
                    failures.push(format!("{folder}: the model does not report `{name}`"));
                    continue;
                };
                if (row[j] - b).abs() > 1e-4 * (1.0 + b.abs()) {
                    failures.push(format!("{folder}: reported {name} = {}, f64 program {b}", row[j]));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

/// Autodiff scores against central differences of the f64 program (a small step in f64: its
/// error is far below the f32 model's) at a plausible point of each model.
#[test]
fn scores_match_the_f64_programs() {
    let Some(dir) = more_suite("scores_match_the_f64_programs") else { return };
    let device = flex();
    let mut failures = Vec::new();
    for folder in FOLDERS {
        let model = load(folder, &dir);
        let program = direct(&dir, folder);
        let x0 = as_f32(&program.point(&mut Lcg(11)));
        let g = to_vec_f32(&score(&model, matrix(std::slice::from_ref(&x0), &device), None).unwrap().grad);
        let mut worst = 0.0f64;
        for (j, &ad) in g.iter().enumerate() {
            let h = 1e-5 * (1.0 + x0[j].abs());
            let at = |by: f64| {
                let mut p = x0.clone();
                p[j] += by;
                program.log_density(&p).sum
            };
            let fd = (at(h) - at(-h)) / (2.0 * h);
            let ad = f64::from(ad);
            let tol = 2e-3 * (fd.abs() + 1.0);
            worst = worst.max((ad - fd).abs() / tol);
            if (ad - fd).abs() > tol || !ad.is_finite() {
                failures.push(format!("{folder}, coordinate {j}: autodiff {ad} vs f64 finite differences {fd}"));
            }
        }
        eprintln!("{folder}: scores within {worst:.1e} of their tolerance");
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

/// The generated quantities: hier_2pl's `Omega = L_Omega L_Omega^T`, Mh's latent `z` (1 where
/// detected; elsewhere a Bernoulli draw whose frequency over 4,000 draws of one point matches
/// the program's probability within 4 binomial sds) and `N = sum(z)`, accel_splines' intercepts.
#[test]
fn generated_quantities_follow_the_programs() {
    let Some(dir) = more_suite("generated_quantities_follow_the_programs") else { return };
    let device = flex();

    let model = load(HIER_2PL, &dir);
    let program = direct(&dir, HIER_2PL);
    let x = as_f32(&program.point(&mut Lcg(5)));
    let names = model.generated_names().to_vec();
    let generated = host_rows(&model.generated(matrix(std::slice::from_ref(&x), &device), &mut seeded(1)).unwrap());
    let z = x[x.len() - 1].tanh();
    for (name, want) in [("Omega[1,1]", 1.0), ("Omega[1,2]", z), ("Omega[2,1]", z), ("Omega[2,2]", 1.0)] {
        let j = names.iter().position(|n| n == name).unwrap_or_else(|| panic!("hier_2pl: no `{name}` in {names:?}"));
        assert!((generated[0][j] - want).abs() < 1e-5, "hier_2pl: {name} = {}, want {want}", generated[0][j]);
    }

    let model = load(MH, &dir);
    let d = StanData::read(&dir, MH);
    let mh = Mh { occasions: d.int("T") as u64, y: d.vec("y").iter().map(|&v| v as u64).collect() };
    let x = as_f32(&mh.point(&mut Lcg(9)));
    let (omega, _, _, eps, _) = mh.unpack(&x);
    let draws = 4000;
    let rows = vec![x.clone(); draws];
    let names = model.generated_names().to_vec();
    let m = mh.y.len();
    assert_eq!(names.len(), m + 1, "Mh: z[1..M] and N");
    assert_eq!(names[m], "N");
    let generated = host_rows(&model.generated(matrix(&rows, &device), &mut seeded(2)).unwrap());
    let detected = mh.y.iter().filter(|&&y| y > 0).count();
    for row in &generated {
        let zs = &row[..m];
        assert!(zs.iter().all(|&v| v == 0.0 || v == 1.0), "Mh: z not 0 or 1");
        assert!(mh.y.iter().zip(zs).all(|(&y, &v)| y == 0 || v == 1.0), "Mh: a detected individual with z = 0");
        assert_eq!(row[m], zs.iter().sum::<f64>(), "Mh: N is not sum(z)");
        assert!(row[m] >= detected as f64, "Mh: N below the C detected");
    }
    let mut worst = 0.0f64;
    for i in (0..m).filter(|&i| mh.y[i] == 0).step_by(20) {
        let p = mh.present(omega, eps[i]);
        let freq = generated.iter().map(|r| r[i]).sum::<f64>() / draws as f64;
        let sd = (p * (1.0 - p) / draws as f64).sqrt().max(1e-3);
        worst = worst.max((freq - p).abs() / sd);
        assert!((freq - p).abs() < 4.0 * sd, "Mh: z[{}] frequency {freq} vs probability {p}", i + 1);
    }
    eprintln!("Mh: z frequencies within {worst:.2} binomial sds of the program's probabilities");

    let model = load(SPLINES, &dir);
    let program = direct(&dir, SPLINES);
    let x = as_f32(&program.point(&mut Lcg(3)));
    let names = model.generated_names().to_vec();
    assert_eq!(names, ["b_Intercept", "b_sigma_Intercept"]);
    let generated = host_rows(&model.generated(matrix(std::slice::from_ref(&x), &device), &mut seeded(3)).unwrap());
    let p = program.reported(&x);
    assert!((generated[0][0] - p[0].1).abs() < 1e-5, "accel_splines: b_Intercept");
    let k = x.len() - 1 - (d_len(&dir, SPLINES, "Zs_sigma_1_1") + d_len(&dir, SPLINES, "Xs_sigma") + 1);
    assert!((generated[0][1] - x[k]).abs() < 1e-5, "accel_splines: b_sigma_Intercept");
}

/// Columns of a data matrix.
fn d_len(dir: &Path, folder: &str, field: &str) -> usize {
    StanData::read(dir, folder).mat(field)[0].len()
}

fn seeded(seed: u64) -> chacha20::ChaCha8Rng {
    use rand::SeedableRng;
    chacha20::ChaCha8Rng::seed_from_u64(seed)
}

/// A suite folder in a temporary directory holding `folder`'s data.json, edited by `edit`.
fn edited_suite(dir: &Path, folder: &str, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let mut data = StanData::read(dir, folder).0;
    edit(&mut data);
    std::fs::create_dir(tmp.path().join(folder)).unwrap();
    std::fs::copy(dir.join(folder).join("posterior.json"), tmp.path().join(folder).join("posterior.json")).unwrap();
    std::fs::write(tmp.path().join(folder).join("data.json"), serde_json::to_string(&data).unwrap()).unwrap();
    tmp
}

fn load_error(dir: &Path, folder: &str) -> String {
    match posteriordb::load(folder, dir, &flex()) {
        Ok(_) => panic!("{folder}: bad data was accepted"),
        Err(e) => e.to_string(),
    }
}

/// Data that break the data block or the program's indexing are errors naming the posterior, the
/// field and the element (1-based).
#[test]
fn bad_data_is_named() {
    let Some(dir) = more_suite("bad_data_is_named") else { return };
    let set = |field: &'static str, at: usize, value: i64| {
        move |d: &mut serde_json::Map<String, Value>| d[field].as_array_mut().unwrap()[at] = Value::from(value)
    };
    let cases: Vec<(&str, tempfile::TempDir, &[&str])> = vec![
        (ELECTION88, edited_suite(&dir, ELECTION88, set("age", 2, 0)), &["`age`", "[3]", "1..=4"]),
        (ELECTION88, edited_suite(&dir, ELECTION88, set("state", 0, 52)), &["`state`", "[1]", "1..=51"]),
        (
            ELECTION88,
            edited_suite(&dir, ELECTION88, |d| d["black"].as_array_mut().unwrap()[4] = Value::from(1.5)),
            &["`black`", "element 5", "upper=1"],
        ),
        (HIER_2PL, edited_suite(&dir, HIER_2PL, set("jj", 0, 601)), &["`jj`", "[1]", "1..=600"]),
        (HIER_2PL, edited_suite(&dir, HIER_2PL, set("y", 9, 2)), &["`y`", "element 10"]),
        (MH, edited_suite(&dir, MH, set("y", 1, 6)), &["`y`", "element 2", "upper=5"]),
        (
            MH,
            edited_suite(&dir, MH, |d| {
                d["y"].as_array_mut().unwrap().pop();
            }),
            &["`y`", "M = 385"],
        ),
        (
            BONES,
            edited_suite(&dir, BONES, |d| {
                d["grade"].as_array_mut().unwrap()[3].as_array_mut().unwrap()[2] = Value::from(3)
            }),
            &["`grade`", "[4,3]", "ncat[3] = 2"],
        ),
        (BONES, edited_suite(&dir, BONES, set("ncat", 0, 6)), &["`ncat`", "[1]", "2..=5"]),
        (
            SPLINES,
            edited_suite(&dir, SPLINES, |d| {
                d["Zs_1_1"].as_array_mut().unwrap()[7].as_array_mut().unwrap().pop();
            }),
            &["`Zs_1_1`"],
        ),
        (
            SPLINES,
            edited_suite(&dir, SPLINES, |d| {
                d.insert("knots_1".into(), Value::from(0));
            }),
            &["`knots_1`", "lower bound 1"],
        ),
    ];
    for (folder, tmp, wanted) in &cases {
        let msg = load_error(tmp.path(), folder);
        for w in *wanted {
            assert!(msg.contains(folder) && msg.contains(w), "{folder}: `{w}` not in: {msg}");
        }
    }
}

/// NUTS through bones_model (13 abilities, the one of the five with a reference; Stan's checks
/// passed there) matches Stan's draws: every mean within 4 Monte Carlo sds (from the draws' own
/// ESS) plus the reference's own error, every sd within `4 / sqrt(2 ESS_2) + 2%` (`ESS_2` the ESS of the
/// squared deviations), R-hat below 1.01.
#[test]
fn bones_nuts_matches_the_reference() {
    let Some(dir) = more_suite("bones_nuts_matches_the_reference") else { return };
    let device = flex();
    let started = std::time::Instant::now();
    let model = load(BONES, &dir);
    let reference = ReferenceDraws::load(BONES, &dir).unwrap();
    eprintln!("bones: model and reference read in {:.1} s", started.elapsed().as_secs_f64());
    let config = NutsConfig { warmup: 300, draws: 600, ..NutsConfig::default() };
    let run = nuts(&model, &config, None, &mut EngineRng::new(17), &device).unwrap();
    let dim = model.dim();
    let series = |j: usize| -> Vec<Vec<f64>> {
        (0..run.chains)
            .map(|c| (0..run.draws_per_chain).map(|s| run.draws[(s * run.chains + c) * dim + j]).collect())
            .collect()
    };
    // Per coordinate: the ESS of the draws (for the mean) and of their squared deviations (for
    // the sd: a long tail makes it converge more slowly than the mean).
    let (mut min_ess, mut max_rhat) = (f64::INFINITY, 0.0f64);
    let mut ess_squares = Vec::with_capacity(dim);
    for j in 0..dim {
        let x = series(j);
        min_ess = min_ess.min(ess(&x));
        max_rhat = max_rhat.max(split_rhat(&x));
        let all: Vec<f64> = x.iter().flatten().copied().collect();
        let mean = all.iter().sum::<f64>() / all.len() as f64;
        let squares: Vec<Vec<f64>> = x.iter().map(|c| c.iter().map(|v| (v - mean).powi(2)).collect()).collect();
        ess_squares.push(ess(&squares));
    }
    assert!(max_rhat < 1.01, "bones: R-hat {max_rhat}");
    let rows = parvi_model::tensor_ops::matrix_from_vec(
        run.draws.iter().map(|&v| v as f32).collect(),
        run.draws.len() / dim,
        dim,
        &device,
    );
    let reported = parvi_model::tensor_ops::to_vec_f64(&model.reported(rows));
    let selected = reference.select(&reported, model.param_names().len());
    let c = compare(reference.values(), &selected, reference.params(), None).unwrap();
    // The reference's own Monte Carlo error: its bulk ESS is at least 21,000.
    let mean_tol = 4.0 / min_ess.sqrt() + 4.0 / 21_000f64.sqrt();
    // theta is the whole parameter vector, so reference column k is coordinate k.
    assert_eq!(reference.names().len(), dim);
    for (k, ((name, e), r)) in reference.names().iter().zip(&c.mean_error_sd).zip(&c.sd_ratio).enumerate() {
        let sd_tol = 4.0 / (2.0 * ess_squares[k]).sqrt() + 0.02;
        assert!(e.abs() < mean_tol, "bones: {name} mean off by {e:.3} reference sd (tolerance {mean_tol:.3})");
        assert!(
            (r - 1.0).abs() < sd_tol,
            "bones: {name} sd ratio {r:.3} (tolerance {sd_tol:.3}, ESS of the squares {:.0})",
            ess_squares[k]
        );
    }
    eprintln!(
        "bones: NUTS 4 x (300 + 600) in {:.1} s, min ESS {min_ess:.0}, max R-hat {max_rhat:.4}, worst mean error {:.3} sd",
        run.seconds,
        c.mean_error_sd.iter().fold(0.0f64, |a, e| a.max(e.abs()))
    );
}
