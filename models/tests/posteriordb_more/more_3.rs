//! `hmm_gaussian`, `iohmm_reg`, `losscurve_sislob`, `soil_incubation` and `bym2_offset_only`
//! against independent `f64` evaluations of their Stan programs written here in plain loops: the
//! data read from `data.json` by this file, every constraint transform and log-Jacobian as Stan
//! math adds it (`simplex_constrain` row by row for `array[K] simplex[K]`, `ordered_constrain`,
//! `lb_constrain`, `lub_constrain`), both HMMs' forward recursions exactly as the programs write
//! them, the soil-carbon ODE by its closed form (a linear system: the matrix exponential), the
//! BYM2 ICAR term edge by edge. Checked: log density differences between points, the reported
//! transformed parameters and generated quantities by Stan's names, autodiff scores against
//! central differences of the `f64` program, errors on bad data, and NUTS through
//! `losscurve_sislob` against Stan's reference moments (the only one of the five whose reference
//! passed Stan's checks; soil_incubation's failed them, R-hat 1.04 and 1,033 divergences, and is
//! not compared here; the other three have no reference yet).

use std::path::{Path, PathBuf};

use super::{Acc, Lcg, as_f32, cauchy_lpdf, logit, normal_lpdf, sigmoid};
use parvi_infer::evaluation::ess;
use parvi_infer::{AdapterConfig, EngineSpec, FitConfig, KernelConfig, MethodConfig, fit};
use parvi_model::burn::tensor::{Device, Tensor, TensorData};
use parvi_model::program::StanModel;
use parvi_model::tensor_ops::{to_vec_f32, to_vec_f64};
use parvi_model::{BackendKind, LogDensity, score};
use parvi_models::posteriordb::{self, PosteriorDbModel, ReferenceMoments};
use rand::SeedableRng;
use serde_json::Value;

/// An edit of a posterior's `data.json`, for the bad-data cases.
type DataEdit = Box<dyn FnOnce(&mut serde_json::Map<String, Value>)>;

const HMM: &str = "hmm_gaussian_simulated-hmm_gaussian";
const IOHMM: &str = "iohmm_reg_simulated-iohmm_reg";
const LOSS: &str = "loss_curves-losscurve_sislob";
const SOIL: &str = "soil_carbon-soil_incubation";
const BYM2: &str = "traffic_accident_nyc-bym2_offset_only";
const ALL: [&str; 5] = [HMM, IOHMM, LOSS, SOIL, BYM2];

// ---------------------------------------------------------------------------------------------
// The suite, the device, tensors.

/// The suite folder (the harness's finder, [`super::more_suite`]).
fn suite(test: &str) -> Option<PathBuf> {
    super::more_suite(test)
}

fn flex() -> Device {
    BackendKind::Flex.device().unwrap()
}

fn matrix(rows: &[Vec<f64>], device: &Device) -> Tensor<2> {
    let cols = rows[0].len();
    let flat: Vec<f32> = rows.iter().flatten().map(|&v| v as f32).collect();
    Tensor::from_data(TensorData::new(flat, [rows.len(), cols]), device)
}

fn host_rows(t: &Tensor<2>) -> Vec<Vec<f64>> {
    let [rows, cols] = t.dims();
    if cols == 0 {
        return vec![Vec::new(); rows];
    }
    to_vec_f32(t).chunks(cols).map(|r| r.iter().map(|&v| f64::from(v)).collect()).collect()
}

fn load(name: &str, dir: &Path, device: &Device) -> PosteriorDbModel {
    posteriordb::load(name, dir, device).unwrap_or_else(|e| panic!("{name}: {e}"))
}

// ---------------------------------------------------------------------------------------------
// f64 helpers. Every summed term goes through `Acc`, which also sums the terms' magnitudes: the
// scale of the f32 rounding error of the model's evaluation.

fn lognormal_lpdf(y: f64, mu: f64, sigma: f64) -> f64 {
    normal_lpdf(y.ln(), mu, sigma) - y.ln()
}

/// Up to a constant in `y`.
fn beta_lpdf(y: f64, a: f64, b: f64) -> f64 {
    (a - 1.0) * y.ln() + (b - 1.0) * (1.0 - y).ln()
}

/// Up to the `ln y!` constant.
fn poisson_log_lpmf(y: f64, eta: f64) -> f64 {
    y * eta - eta.exp()
}

fn log_sum_exp(v: &[f64]) -> f64 {
    let m = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    m + v.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
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
    fn real(&self, k: &str) -> f64 {
        self.0[k].as_f64().unwrap()
    }
    fn vec(&self, k: &str) -> Vec<f64> {
        self.0[k].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect()
    }
    /// 1-based indices, as 0-based.
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
// Stan's constraint transforms in f64 (Stan math `prim/constraint/`), block by block.

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Real,
    /// `<lower=0>`: `exp(x)`, log-Jacobian `x`.
    Positive,
    /// `<lower=0, upper=1>`: `logit^-1(x)`, log-Jacobian `log u (1 - u)`.
    Unit,
    /// `ordered[K]`: `y_1 = x_1`, `y_k = y_{k-1} + exp(x_k)`, log-Jacobian `sum_{k>=2} x_k`.
    Ordered,
    /// `array[M] simplex[K]` (`M = 1`: a `simplex[K]`), each row by stick-breaking:
    /// `z_k = logit^-1(x_k - log(K - k))`, `y_k = stick z_k`, log-Jacobian `log stick + log z_k +
    /// log(1 - z_k)` per break.
    Simplex {
        rows: usize,
    },
}

/// A parameter block: Stan name, transform, constrained shape (`[]`: a scalar).
struct Block {
    name: &'static str,
    kind: Kind,
    shape: Vec<usize>,
}

fn block(name: &'static str, kind: Kind, shape: &[usize]) -> Block {
    Block { name, kind, shape: shape.to_vec() }
}

fn simplex_row(x: &[f64], jac: &mut f64) -> Vec<f64> {
    let k = x.len() + 1;
    let mut stick = 1.0;
    let mut y = Vec::with_capacity(k);
    for (i, v) in x.iter().enumerate() {
        let z = sigmoid(v - ((k - 1 - i) as f64).ln());
        y.push(stick * z);
        *jac += stick.ln() + z.ln() + (1.0 - z).ln();
        stick -= stick * z;
    }
    y.push(stick);
    y
}

fn simplex_row_free(y: &[f64]) -> Vec<f64> {
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

impl Block {
    fn constrained(&self) -> usize {
        self.shape.iter().product()
    }
    fn free(&self) -> usize {
        match self.kind {
            Kind::Simplex { rows } => self.constrained() - rows,
            _ => self.constrained(),
        }
    }
    /// Stan's names, row-major (`A[1,1]`, `A[1,2]`, ...).
    fn names(&self) -> Vec<String> {
        match self.shape.as_slice() {
            [] => vec![self.name.to_string()],
            [k] => (1..=*k).map(|i| format!("{}[{i}]", self.name)).collect(),
            [m, k] => (1..=*m).flat_map(|i| (1..=*k).map(move |j| format!("{}[{i},{j}]", self.name))).collect(),
            _ => unreachable!(),
        }
    }
    fn constrain(&self, x: &[f64], jac: &mut f64) -> Vec<f64> {
        match self.kind {
            Kind::Real => x.to_vec(),
            Kind::Positive => {
                *jac += x.iter().sum::<f64>();
                x.iter().map(|v| v.exp()).collect()
            }
            Kind::Unit => x
                .iter()
                .map(|&v| {
                    let u = sigmoid(v);
                    *jac += u.ln() + (1.0 - u).ln();
                    u
                })
                .collect(),
            Kind::Ordered => {
                *jac += x[1..].iter().sum::<f64>();
                let mut y = vec![x[0]];
                for v in &x[1..] {
                    y.push(y[y.len() - 1] + v.exp());
                }
                y
            }
            Kind::Simplex { rows } => {
                let k = self.constrained() / rows;
                x.chunks(k - 1).flat_map(|row| simplex_row(row, jac)).collect()
            }
        }
    }
    fn unconstrain(&self, y: &[f64]) -> Vec<f64> {
        match self.kind {
            Kind::Real => y.to_vec(),
            Kind::Positive => y.iter().map(|v| v.ln()).collect(),
            Kind::Unit => y.iter().map(|&v| logit(v)).collect(),
            Kind::Ordered => (0..y.len()).map(|i| if i == 0 { y[0] } else { (y[i] - y[i - 1]).ln() }).collect(),
            Kind::Simplex { rows } => {
                let k = self.constrained() / rows;
                y.chunks(k).flat_map(simplex_row_free).collect()
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The Stan programs.

/// One posterior's Stan program, evaluated directly.
struct Direct {
    name: &'static str,
    d: StanData,
    blocks: Vec<Block>,
}

/// What an evaluation gives: the log density with its magnitude, the transformed parameters and
/// the generated quantities by Stan's name.
struct Evaluation {
    lp: Acc,
    transformed: Vec<(String, f64)>,
    generated: Vec<(String, f64)>,
}

/// `name[i,j]` (1-based) of a `[rows][cols]` array.
fn named2(name: &str, values: &[Vec<f64>]) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    for (i, row) in values.iter().enumerate() {
        for (j, &v) in row.iter().enumerate() {
            out.push((format!("{name}[{},{}]", i + 1, j + 1), v));
        }
    }
    out
}

fn named1(name: &str, values: &[f64]) -> Vec<(String, f64)> {
    values.iter().enumerate().map(|(i, &v)| (format!("{name}[{}]", i + 1), v)).collect()
}

/// `exp(M t) c0` for the soil model's `M = [[-k1, a12 k2], [a21 k1, -k2]]`, in closed form:
/// `exp(M t) = e^{m t} (cosh(s t) I + sinh(s t) / s (M - m I))`, `m = tr M / 2`, `s^2 = m^2 - det M
/// = (k1 - k2)^2 / 4 + a12 a21 k1 k2 >= 0`.
fn two_pool(k1: f64, k2: f64, a21: f64, a12: f64, c0: [f64; 2], t: f64) -> [f64; 2] {
    let m = [[-k1, a12 * k2], [a21 * k1, -k2]];
    let half_trace = -(k1 + k2) / 2.0;
    let s = ((k1 - k2).powi(2) / 4.0 + a12 * a21 * k1 * k2).sqrt();
    let (cosh, sinh_over_s) = ((s * t).cosh(), if s * t > 1e-8 { (s * t).sinh() / s } else { t });
    let e = (half_trace * t).exp();
    let mut out = [0.0; 2];
    for (i, o) in out.iter_mut().enumerate() {
        for (j, c) in c0.iter().enumerate() {
            let identity = if i == j { 1.0 } else { 0.0 };
            let shifted = m[i][j] - half_trace * identity;
            *o += e * (cosh * identity + sinh_over_s * shifted) * c;
        }
    }
    out
}

impl Direct {
    fn new(dir: &Path, name: &'static str) -> Self {
        use Kind::*;
        let d = StanData::read(dir, name);
        let blocks = match name {
            HMM => {
                let k = d.int("K");
                vec![
                    block("pi1", Simplex { rows: 1 }, &[k]),
                    block("A", Simplex { rows: k }, &[k, k]),
                    block("mu", Ordered, &[k]),
                    block("sigma", Positive, &[k]),
                ]
            }
            IOHMM => {
                let (k, m) = (d.int("K"), d.int("M"));
                vec![
                    block("pi1", Simplex { rows: 1 }, &[k]),
                    block("w", Real, &[k, m]),
                    block("b", Real, &[k, m]),
                    block("sigma", Positive, &[k]),
                ]
            }
            LOSS => vec![
                block("omega", Positive, &[]),
                block("theta", Positive, &[]),
                block("LR", Positive, &[d.int("n_cohort")]),
                block("mu_LR", Real, &[]),
                block("sd_LR", Positive, &[]),
                block("loss_sd", Positive, &[]),
            ],
            SOIL => vec![
                block("k1", Positive, &[]),
                block("k2", Positive, &[]),
                block("alpha21", Positive, &[]),
                block("alpha12", Positive, &[]),
                block("gamma", Unit, &[]),
                block("sigma", Positive, &[]),
            ],
            BYM2 => {
                let n = d.int("N");
                vec![
                    block("beta0", Real, &[]),
                    block("sigma", Positive, &[]),
                    block("rho", Unit, &[]),
                    block("theta", Real, &[n]),
                    block("phi", Real, &[n]),
                ]
            }
            _ => panic!("no Stan program for {name}"),
        };
        Self { name, d, blocks }
    }

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

    /// The constrained blocks of `x`, by name.
    fn parts(&self, x: &[f64]) -> (std::collections::HashMap<&'static str, Vec<f64>>, f64) {
        let (q, jac) = self.constrain(x);
        let mut at = 0;
        let mut parts = std::collections::HashMap::new();
        for b in &self.blocks {
            parts.insert(b.name, q[at..at + b.constrained()].to_vec());
            at += b.constrained();
        }
        (parts, jac)
    }

    /// The Stan program at unconstrained `x`: `log p(x)` up to a constant (with the
    /// log-Jacobian), its transformed parameters and generated quantities.
    #[allow(clippy::needless_range_loop)] // index loops as the Stan programs write them
    fn evaluate(&self, x: &[f64]) -> Evaluation {
        let (p, jac) = self.parts(x);
        let d = &self.d;
        let mut lp = Acc::default();
        lp.add(jac);
        let mut transformed = Vec::new();
        let mut generated = Vec::new();
        match self.name {
            HMM => {
                let (t_len, k) = (d.int("T"), d.int("K"));
                let y = d.vec("y");
                let (pi1, a, mu, sigma) = (&p["pi1"], &p["A"], &p["mu"], &p["sigma"]);
                let mut logalpha = vec![vec![0.0; k]; t_len];
                for j in 0..k {
                    logalpha[0][j] = pi1[j].ln() + normal_lpdf(y[0], mu[j], sigma[j]);
                }
                let mut magnitude = 0.0;
                for t in 1..t_len {
                    for j in 0..k {
                        let emission = normal_lpdf(y[t], mu[j], sigma[j]);
                        magnitude += emission.abs();
                        let acc: Vec<f64> = (0..k).map(|i| logalpha[t - 1][i] + a[i * k + j].ln() + emission).collect();
                        logalpha[t][j] = log_sum_exp(&acc);
                    }
                }
                let target = log_sum_exp(&logalpha[t_len - 1]);
                lp.sum += target;
                lp.magnitude += magnitude;
                transformed.extend(named2("logalpha", &logalpha));
                // The generated block, as written (logbeta[T] = 1; Viterbi from delta[1, K] only).
                let softmax = |v: &[f64]| -> Vec<f64> {
                    let l = log_sum_exp(v);
                    v.iter().map(|x| (x - l).exp()).collect()
                };
                let alpha: Vec<Vec<f64>> = logalpha.iter().map(|r| softmax(r)).collect();
                let mut logbeta = vec![vec![1.0; k]; t_len];
                for t in (1..t_len).rev() {
                    for j in 0..k {
                        let acc: Vec<f64> = (0..k)
                            .map(|i| logbeta[t][i] + a[j * k + i].ln() + normal_lpdf(y[t], mu[i], sigma[i]))
                            .collect();
                        logbeta[t - 1][j] = log_sum_exp(&acc);
                    }
                }
                let beta: Vec<Vec<f64>> = logbeta.iter().map(|r| softmax(r)).collect();
                let loggamma: Vec<Vec<f64>> =
                    alpha.iter().zip(&beta).map(|(a, b)| a.iter().zip(b).map(|(x, y)| x * y).collect()).collect();
                let gamma: Vec<Vec<f64>> = loggamma
                    .iter()
                    .map(|r| {
                        let s: f64 = r.iter().sum();
                        r.iter().map(|v| v / s).collect()
                    })
                    .collect();
                let mut delta = vec![vec![f64::NAN; k]; t_len];
                let mut bpointer = vec![vec![0usize; k]; t_len];
                for j in 0..k {
                    delta[0][k - 1] = normal_lpdf(y[0], mu[j], sigma[j]);
                }
                for t in 1..t_len {
                    for j in 0..k {
                        delta[t][j] = f64::NEG_INFINITY;
                        for i in 0..k {
                            let logp = delta[t - 1][i] + a[i * k + j].ln() + normal_lpdf(y[t], mu[j], sigma[j]);
                            if logp > delta[t][j] {
                                bpointer[t][j] = i;
                                delta[t][j] = logp;
                            }
                        }
                    }
                }
                let logp_zstar = delta[t_len - 1].iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let mut zstar = vec![0usize; t_len];
                for j in 0..k {
                    if delta[t_len - 1][j] == logp_zstar {
                        zstar[t_len - 1] = j;
                    }
                }
                for t in (0..t_len - 1).rev() {
                    zstar[t] = bpointer[t + 1][zstar[t + 1]];
                }
                generated.extend(named2("logbeta", &logbeta));
                generated.extend(named2("loggamma", &loggamma));
                generated.extend(named2("alpha", &alpha));
                generated.extend(named2("beta", &beta));
                generated.extend(named2("gamma", &gamma));
                generated.extend(named1("zstar", &zstar.iter().map(|&z| (z + 1) as f64).collect::<Vec<_>>()));
                generated.push(("logp_zstar".into(), logp_zstar));
            }
            IOHMM => {
                let (t_len, k, m) = (d.int("T"), d.int("K"), d.int("M"));
                let (y, u) = (d.vec("y"), d.mat("u"));
                let (pi1, w, b, sigma) = (&p["pi1"], &p["w"], &p["b"], &p["sigma"]);
                let dot = |t: usize, v: &[f64], j: usize| (0..m).map(|l| u[t][l] * v[j * m + l]).sum::<f64>();
                let mut un_a = vec![vec![0.0; k]; t_len];
                let mut big_a = vec![vec![0.0; k]; t_len];
                let mut log_a = vec![vec![0.0; k]; t_len];
                let mut log_oblik = vec![vec![0.0; k]; t_len];
                un_a[0] = pi1.clone();
                big_a[0] = pi1.clone();
                log_a[0] = pi1.iter().map(|v| v.ln()).collect();
                for t in 1..t_len {
                    for j in 0..k {
                        un_a[t][j] = dot(t, w, j);
                    }
                    let lse = log_sum_exp(&un_a[t]);
                    for j in 0..k {
                        big_a[t][j] = (un_a[t][j] - lse).exp();
                        log_a[t][j] = big_a[t][j].ln();
                    }
                }
                let mut magnitude = 0.0;
                for t in 0..t_len {
                    for j in 0..k {
                        log_oblik[t][j] = normal_lpdf(y[t], dot(t, b, j), sigma[j]);
                        magnitude += log_oblik[t][j].abs();
                    }
                }
                let mut logalpha = vec![vec![0.0; k]; t_len];
                for j in 0..k {
                    logalpha[0][j] = pi1[j].ln() + log_oblik[0][j];
                }
                for t in 1..t_len {
                    for j in 0..k {
                        let acc: Vec<f64> =
                            (0..k).map(|i| logalpha[t - 1][i] + log_a[t][i] + log_oblik[t][j]).collect();
                        logalpha[t][j] = log_sum_exp(&acc);
                    }
                }
                for v in w.iter().chain(b.iter()) {
                    lp.add(normal_lpdf(*v, 0.0, 5.0));
                }
                for &s in sigma {
                    lp.add(normal_lpdf(s, 0.0, 3.0));
                }
                lp.sum += log_sum_exp(&logalpha[t_len - 1]);
                lp.magnitude += magnitude;
                // The generated block, as written; hatz and haty are random draws (NaN here:
                // checked for their support).
                let softmax = |v: &[f64]| -> Vec<f64> {
                    let l = log_sum_exp(v);
                    v.iter().map(|x| (x - l).exp()).collect()
                };
                let alpha: Vec<Vec<f64>> = logalpha.iter().map(|r| softmax(r)).collect();
                let mut logbeta = vec![vec![1.0; k]; t_len];
                for tb in (1..t_len).rev() {
                    for j in 0..k {
                        let acc: Vec<f64> = (0..k).map(|i| logbeta[tb][i] + log_a[tb][i] + log_oblik[tb][i]).collect();
                        logbeta[tb - 1][j] = log_sum_exp(&acc);
                    }
                }
                let beta: Vec<Vec<f64>> = logbeta.iter().map(|r| softmax(r)).collect();
                let loggamma: Vec<Vec<f64>> =
                    alpha.iter().zip(&beta).map(|(a, b)| a.iter().zip(b).map(|(x, y)| x * y).collect()).collect();
                let gamma: Vec<Vec<f64>> = loggamma
                    .iter()
                    .map(|r| {
                        let s: f64 = r.iter().sum();
                        r.iter().map(|v| v / s).collect()
                    })
                    .collect();
                let hatpi: Vec<Vec<f64>> =
                    (0..t_len).map(|t| softmax(&(0..k).map(|j| dot(t, w, j)).collect::<Vec<_>>())).collect();
                let mut delta = vec![vec![f64::NAN; k]; t_len];
                let mut bpointer = vec![vec![0usize; k]; t_len];
                for j in 0..k {
                    delta[0][k - 1] = log_oblik[0][j];
                }
                for t in 1..t_len {
                    for j in 0..k {
                        delta[t][j] = f64::NEG_INFINITY;
                        for i in 0..k {
                            let logp = delta[t - 1][i] + log_a[t][i] + log_oblik[t][j];
                            if logp > delta[t][j] {
                                bpointer[t][j] = i;
                                delta[t][j] = logp;
                            }
                        }
                    }
                }
                let logp_zstar = delta[t_len - 1].iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let mut zstar = vec![0usize; t_len];
                for j in 0..k {
                    if delta[t_len - 1][j] == logp_zstar {
                        zstar[t_len - 1] = j;
                    }
                }
                for t in (0..t_len - 1).rev() {
                    zstar[t] = bpointer[t + 1][zstar[t + 1]];
                }
                generated.extend(named2("logbeta", &logbeta));
                generated.extend(named2("loggamma", &loggamma));
                generated.extend(named2("alpha", &alpha));
                generated.extend(named2("beta", &beta));
                generated.extend(named2("gamma", &gamma));
                generated.extend(named2("hatpi", &hatpi));
                generated.extend(named1("hatz", &vec![f64::NAN; t_len]));
                generated.extend(named1("haty", &vec![f64::NAN; t_len]));
                generated.extend(named1("zstar", &zstar.iter().map(|&z| (z + 1) as f64).collect::<Vec<_>>()));
                generated.push(("logp_zstar".into(), logp_zstar));
                transformed.extend(named2("logalpha", &logalpha));
                transformed.extend(named2("unA", &un_a));
                transformed.extend(named2("A", &big_a));
                transformed.extend(named2("logA", &log_a));
                transformed.extend(named2("logoblik", &log_oblik));
            }
            LOSS => {
                let (n_data, n_time, n_cohort) = (d.int("n_data"), d.int("n_time"), d.int("n_cohort"));
                let (cohort_id, t_idx, maxtime) = (d.index("cohort_id"), d.index("t_idx"), d.vec("cohort_maxtime"));
                let (t_value, premium, loss) = (d.vec("t_value"), d.vec("premium"), d.vec("loss"));
                let weibull = d.int("growthmodel_id") == 1;
                let (omega, theta) = (p["omega"][0], p["theta"][0]);
                let (lr, mu_lr, sd_lr, loss_sd) = (&p["LR"], p["mu_LR"][0], p["sd_LR"][0], p["loss_sd"][0]);
                let gf: Vec<f64> = t_value
                    .iter()
                    .map(|&t| {
                        if weibull {
                            1.0 - (-(t / theta).powf(omega)).exp()
                        } else {
                            t.powf(omega) / (t.powf(omega) + theta.powf(omega))
                        }
                    })
                    .collect();
                let lm: Vec<f64> =
                    (0..n_data).map(|i| lr[cohort_id[i]] * premium[cohort_id[i]] * gf[t_idx[i]]).collect();
                lp.add(normal_lpdf(mu_lr, 0.0, 0.5));
                lp.add(lognormal_lpdf(sd_lr, 0.0, 0.5));
                for &l in lr {
                    lp.add(lognormal_lpdf(l, mu_lr, sd_lr));
                }
                lp.add(lognormal_lpdf(loss_sd, 0.0, 0.7));
                lp.add(lognormal_lpdf(omega, 0.0, 0.5));
                lp.add(lognormal_lpdf(theta, 0.0, 0.5));
                for i in 0..n_data {
                    lp.add(normal_lpdf(loss[i], lm[i], loss_sd * premium[cohort_id[i]]));
                }
                transformed.extend(named1("gf", &gf));
                transformed.extend(named1("lm", &lm));
                // The generated block, as written.
                let mut loss_sample = vec![vec![0.0; n_time]; n_cohort];
                let mut prediction = vec![vec![f64::NAN; n_time]; n_cohort];
                let mut step_ratio = vec![vec![1.0; n_time]; n_cohort];
                for i in 0..n_cohort {
                    for j in 0..n_time {
                        loss_sample[i][j] = lr[i] * premium[i] * gf[j];
                    }
                }
                for i in 0..n_data {
                    prediction[cohort_id[i]][t_idx[i]] = loss[i];
                }
                for row in step_ratio.iter_mut() {
                    for j in 1..n_time {
                        row[j] = gf[t_idx[j]] / gf[t_idx[j - 1]];
                    }
                }
                for i in 0..n_cohort {
                    for j in maxtime[i] as usize..n_time {
                        prediction[i][j] = prediction[i][j - 1] * step_ratio[i][j];
                    }
                }
                let efc: f64 =
                    (0..n_cohort).map(|i| prediction[i][n_time - 1] - prediction[i][maxtime[i] as usize - 1]).sum();
                generated.extend(named2("loss_sample", &loss_sample));
                generated.extend(named2("loss_prediction", &prediction));
                generated.extend(named2("step_ratio", &step_ratio));
                generated.push(("mu_LR_exp".into(), mu_lr.exp()));
                generated.push(("ppc_minLR".into(), lr.iter().copied().fold(f64::INFINITY, f64::min)));
                generated.push(("ppc_maxLR".into(), lr.iter().copied().fold(f64::NEG_INFINITY, f64::max)));
                generated.push(("ppc_EFC".into(), efc));
            }
            SOIL => {
                let (total, ts, eco2) = (d.real("totalC_t0"), d.vec("ts"), d.vec("eCO2mean"));
                let t0 = d.real("t0");
                let [k1, k2, a21, a12, gamma, sigma] =
                    ["k1", "k2", "alpha21", "alpha12", "gamma", "sigma"].map(|n| p[n][0]);
                let c0 = [gamma * total, (1.0 - gamma) * total];
                let hat: Vec<f64> = ts
                    .iter()
                    .map(|&t| {
                        let c = two_pool(k1, k2, a21, a12, c0, t - t0);
                        total - c[0] - c[1]
                    })
                    .collect();
                lp.add(beta_lpdf(gamma, 10.0, 1.0));
                for v in [k1, k2, a21, a12] {
                    lp.add(normal_lpdf(v, 0.0, 1.0));
                }
                lp.add(cauchy_lpdf(sigma, 0.0, 1.0));
                for (e, h) in eco2.iter().zip(&hat) {
                    lp.add(normal_lpdf(*e, *h, sigma));
                }
                transformed.extend(named1("eCO2_hat", &hat));
            }
            BYM2 => {
                let n = d.int("N");
                let (node1, node2) = (d.index("node1"), d.index("node2"));
                let (y, e, sf) = (d.vec("y"), d.vec("E"), d.real("scaling_factor"));
                let (beta0, sigma, rho) = (p["beta0"][0], p["sigma"][0], p["rho"][0]);
                let (theta, phi) = (&p["theta"], &p["phi"]);
                let convolved: Vec<f64> =
                    (0..n).map(|i| (1.0 - rho).sqrt() * theta[i] + (rho / sf).sqrt() * phi[i]).collect();
                let eta: Vec<f64> = (0..n).map(|i| e[i].ln() + beta0 + convolved[i] * sigma).collect();
                for i in 0..n {
                    lp.add(poisson_log_lpmf(y[i], eta[i]));
                }
                let icar: f64 = node1.iter().zip(&node2).map(|(&a, &b)| (phi[a] - phi[b]).powi(2)).sum();
                lp.add(-0.5 * icar);
                lp.add(normal_lpdf(beta0, 0.0, 1.0));
                for &t in theta.iter() {
                    lp.add(normal_lpdf(t, 0.0, 1.0));
                }
                lp.add(normal_lpdf(sigma, 0.0, 1.0));
                lp.add(beta_lpdf(rho, 0.5, 0.5));
                lp.add(normal_lpdf(phi.iter().sum::<f64>(), 0.0, 0.001 * n as f64));
                transformed.extend(named1("convolved_re", &convolved));
                generated.push(("log_precision".into(), -2.0 * sigma.ln()));
                generated.push(("logit_rho".into(), (rho / (1.0 - rho)).ln()));
                generated.extend(named1("eta", &eta));
                generated.extend(named1("mu", &eta.iter().map(|v| v.exp()).collect::<Vec<_>>()));
            }
            _ => unreachable!(),
        }
        Evaluation { lp, transformed, generated }
    }

    /// A central point on the constrained scale (reference means where there is a reference,
    /// else one read off the data), unconstrained.
    fn centre(&self, dir: &Path) -> Vec<f64> {
        let d = &self.d;
        let q: Vec<f64> = match self.name {
            HMM => {
                let k = d.int("K");
                let mut y = d.vec("y");
                y.sort_by(f64::total_cmp);
                let sd = spread(&y);
                let pi1 = vec![1.0 / k as f64; k];
                let off = if k > 1 { 0.2 / (k - 1) as f64 } else { 0.0 };
                let a: Vec<f64> =
                    (0..k * k).map(|c| if c / k == c % k { 1.0 - off * (k - 1) as f64 } else { off }).collect();
                let mu: Vec<f64> = (0..k).map(|j| y[((2 * j + 1) * y.len()) / (2 * k)]).collect();
                [pi1, a, mu, vec![sd / k as f64; k]].concat()
            }
            IOHMM => {
                let (k, m) = (d.int("K"), d.int("M"));
                let sd = spread(&d.vec("y"));
                [vec![1.0 / k as f64; k], vec![0.0; 2 * k * m], vec![sd; k]].concat()
            }
            LOSS | SOIL => {
                let raw: Value = serde_json::from_str(
                    &std::fs::read_to_string(dir.join(self.name).join("reference_moments.json")).unwrap(),
                )
                .unwrap();
                self.names().iter().map(|n| raw["parameters"][n]["mean"].as_f64().unwrap()).collect()
            }
            BYM2 => {
                let n = d.int("N");
                let rate = d.vec("y").iter().sum::<f64>() / d.vec("E").iter().sum::<f64>();
                [vec![rate.ln(), 0.5, 0.5], vec![0.0; 2 * n]].concat()
            }
            _ => unreachable!(),
        };
        self.unconstrain(&q)
    }
}

fn spread(v: &[f64]) -> f64 {
    let m = v.iter().sum::<f64>() / v.len() as f64;
    (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() - 1) as f64).sqrt()
}

/// Six points: the centre and five moved from it by `scale` in every unconstrained coordinate.
fn points(dir: &Path, direct: &Direct, scale: f64, seed: u64) -> Vec<Vec<f64>> {
    let centre = direct.centre(dir);
    let mut rng = Lcg(seed);
    let mut out = vec![as_f32(&centre)];
    for _ in 0..5 {
        out.push(as_f32(&centre.iter().map(|c| c + scale * rng.normal()).collect::<Vec<_>>()));
    }
    out
}

/// How far each model's points move from the centre: within the posterior's scale for the ODE
/// (its transfer coefficients are weakly identified, and a far point is a stiff system), a
/// little beyond it elsewhere.
fn scale(name: &str) -> f64 {
    if name == SOIL { 0.1 } else { 0.3 }
}

/// How much the model's Dormand-Prince at `rtol = atol = 1e-6` may move soil_incubation's log
/// density: each state off by `G (atol + rtol |C|)` with `G = 2` (the steps' local errors adding
/// up), turned into log density by `|d log p / d eCO2_hat| = |eCO2mean - eCO2_hat| / sigma^2`.
fn ode_effect(direct: &Direct, x: &[f64]) -> f64 {
    if direct.name != SOIL {
        return 0.0;
    }
    let (p, _) = direct.parts(x);
    let eco2 = direct.d.vec("eCO2mean");
    let hat = direct.evaluate(x).transformed;
    let sigma = p["sigma"][0];
    eco2.iter()
        .zip(&hat)
        .map(|(e, (_, h))| (e - h).abs() / (sigma * sigma) * 2.0 * 2.0 * (1e-6 + 1e-6 * h.abs().max(1.0)))
        .sum()
}

// ---------------------------------------------------------------------------------------------
// The tests.

/// Every model's log density against the f64 program, as differences from the first point
/// (constants cancel); its reported quantities (parameters and transformed parameters) and
/// generated quantities, by Stan's name, against the program's; the layout's inverse transform
/// (`array[K] simplex[K]` included) against this file's.
#[test]
fn log_densities_and_reports_match_the_stan_programs() {
    let Some(dir) = suite("log_densities_and_reports_match_the_stan_programs") else { return };
    let device = flex();
    let mut failures = Vec::new();
    for name in ALL {
        let model = load(name, &dir, &device);
        let direct = Direct::new(&dir, name);
        assert_eq!(model.dim(), direct.dim(), "{name}: dimension");
        let points = points(&dir, &direct, scale(name), 7);
        let lp = to_vec_f32(&model.log_prob(matrix(&points, &device), None));
        assert!(model.take_error().is_none(), "{name}: {:?}", model.take_error());
        let exact: Vec<Evaluation> = points.iter().map(|p| direct.evaluate(p)).collect();
        let mut worst = 0.0f64;
        for i in 1..points.len() {
            let ours = f64::from(lp[i]) - f64::from(lp[0]);
            let theirs = exact[i].lp.sum - exact[0].lp.sum;
            let tol = 1e-5 * (exact[i].lp.magnitude + exact[0].lp.magnitude)
                + 1e-3
                + ode_effect(&direct, &points[i])
                + ode_effect(&direct, &points[0]);
            worst = worst.max((ours - theirs).abs() / tol);
            if (ours - theirs).abs() > tol || !ours.is_finite() {
                failures.push(format!(
                    "{name}, point {i}: log p difference {ours} vs f64 program {theirs} (tolerance {tol:.3e}, log p {} vs {})",
                    lp[i], exact[i].lp.sum
                ));
            }
        }
        eprintln!("{name}: log p differences within {worst:.2} of their tolerance (log p {:.4e})", exact[0].lp.sum);

        // Reported quantities: the parameters, then the transformed parameters, by Stan's names.
        let names = model.param_names();
        let reported = host_rows(&model.reported(matrix(&points, &device)));
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        let generated = host_rows(&model.generated(matrix(&points, &device), &mut rng).unwrap());
        let generated_names = model.generated_names();
        for ((p, row), (e, gen_row)) in points.iter().zip(&reported).zip(exact.iter().zip(&generated)) {
            let (q, _) = direct.constrain(p);
            let expected: Vec<(String, f64)> =
                direct.names().into_iter().zip(q).chain(e.transformed.iter().cloned()).collect();
            assert_eq!(names.len(), expected.len(), "{name}: reported names {names:?}");
            for ((stan_name, b), (ours_name, a)) in expected.iter().zip(names.iter().zip(row)) {
                if stan_name != ours_name {
                    failures.push(format!("{name}: reports `{ours_name}` where Stan reports `{stan_name}`"));
                } else if (a - b).abs() > 1e-4 * (1.0 + b.abs()) {
                    failures.push(format!("{name}: reported {stan_name} = {a}, f64 program {b}"));
                }
            }
            assert_eq!(generated_names.len(), e.generated.len(), "{name}: generated names {generated_names:?}");
            for ((stan_name, b), (ours_name, a)) in e.generated.iter().zip(generated_names.iter().zip(gen_row)) {
                let agree = if stan_name.starts_with("hatz") {
                    // A categorical draw: a state.
                    a.fract() == 0.0 && (1.0..=direct.d.int("K") as f64).contains(a)
                } else if stan_name.starts_with("haty") {
                    a.is_finite()
                } else {
                    (a.is_nan() && b.is_nan()) || (a - b).abs() <= 1e-4 * (1.0 + b.abs())
                };
                if stan_name != ours_name {
                    failures.push(format!("{name}: generates `{ours_name}` where Stan generates `{stan_name}`"));
                } else if !agree {
                    failures.push(format!("{name}: generated {stan_name} = {a}, f64 program {b}"));
                }
            }
            // The layout's inverse transform recovers the point from this file's transforms.
            let back = model.layout().unconstrain(&direct.constrain(p).0).unwrap();
            for (j, (a, b)) in back.iter().zip(p).enumerate() {
                if (a - b).abs() > 1e-9 * (1.0 + b.abs()) {
                    failures.push(format!("{name}: coordinate {j} unconstrains to {a}, was {b}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

/// Autodiff scores against central differences of the f64 program (step `1e-5`), in twelve
/// coordinates of each model (the first six, the last three, three in the middle).
#[test]
fn scores_match_the_stan_programs() {
    let Some(dir) = suite("scores_match_the_stan_programs") else { return };
    let device = flex();
    let mut failures = Vec::new();
    for name in ALL {
        let model = load(name, &dir, &device);
        let direct = Direct::new(&dir, name);
        let x0 = points(&dir, &direct, scale(name), 11).remove(3);
        let dim = x0.len();
        let g = to_vec_f32(&score(&model, matrix(std::slice::from_ref(&x0), &device), None).unwrap().grad);
        let magnitude = direct.evaluate(&x0).lp.magnitude;
        let mut coordinates: Vec<usize> = (0..6.min(dim)).chain(dim.saturating_sub(3)..dim).collect();
        coordinates.extend([dim / 3, dim / 2, 2 * dim / 3]);
        coordinates.sort_unstable();
        coordinates.dedup();
        let mut worst = 0.0f64;
        for j in coordinates {
            let moved = |by: f64| {
                let mut p = x0.clone();
                p[j] += by;
                direct.evaluate(&p).lp.sum
            };
            let h = 1e-5;
            let fd = (moved(h) - moved(-h)) / (2.0 * h);
            let ad = f64::from(g[j]);
            let tol = 5e-3 * (fd.abs() + 1.0) + 2e-7 * magnitude;
            worst = worst.max((ad - fd).abs() / tol);
            if (ad - fd).abs() > tol || !ad.is_finite() {
                failures
                    .push(format!("{name}, coordinate {j}: autodiff {ad} vs f64 program {fd} (tolerance {tol:.3e})"));
            }
        }
        eprintln!("{name}: scores within {worst:.2} of their tolerance");
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

/// A suite folder in a temporary directory holding `name`'s data.json, edited by `edit`.
fn edited_suite(dir: &Path, name: &str, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let mut data = StanData::read(dir, name).0;
    edit(&mut data);
    std::fs::create_dir(tmp.path().join(name)).unwrap();
    std::fs::copy(dir.join(name).join("posterior.json"), tmp.path().join(name).join("posterior.json")).unwrap();
    std::fs::write(tmp.path().join(name).join("data.json"), serde_json::to_string(&data).unwrap()).unwrap();
    tmp
}

fn load_error(dir: &Path, name: &str) -> String {
    match posteriordb::load(name, dir, &flex()) {
        Ok(_) => panic!("{name}: bad data was accepted"),
        Err(e) => e.to_string(),
    }
}

/// Data that do not fit each program are refused, naming the posterior, the field and the element.
#[test]
fn bad_data_is_named() {
    let Some(dir) = suite("bad_data_is_named") else { return };
    let set = |field: &'static str, at: usize, v: Value| {
        move |d: &mut serde_json::Map<String, Value>| d[field].as_array_mut().unwrap()[at] = v
    };
    let cases: Vec<(&str, DataEdit, Vec<&str>)> = vec![
        (HMM, Box::new(|d| drop(d["y"].as_array_mut().unwrap().pop())), vec!["`y`", "but T = 500"]),
        (HMM, Box::new(|d| drop(d.insert("K".into(), Value::from(0)))), vec!["`K`", "lower bound 1"]),
        (IOHMM, Box::new(|d| drop(d["u"].as_array_mut().unwrap()[2].as_array_mut().unwrap().pop())), vec!["`u`"]),
        (LOSS, Box::new(set("cohort_id", 4, Value::from(11))), vec!["`cohort_id`", "element 5", "n_cohort = 10"]),
        (LOSS, Box::new(set("t_idx", 0, Value::from(0))), vec!["`t_idx`", "element 1"]),
        (LOSS, Box::new(|d| drop(d.insert("growthmodel_id".into(), Value::from(2)))), vec!["`growthmodel_id`"]),
        (LOSS, Box::new(set("premium", 2, Value::from(-1.0))), vec!["`premium`", "element 3"]),
        (SOIL, Box::new(|d| d["ts"][1] = d["ts"][0].clone()), vec!["`ts`", "element 2", "increasing"]),
        (SOIL, Box::new(set("eCO2mean", 3, Value::from(-0.5))), vec!["`eCO2mean`", "element 4"]),
        (BYM2, Box::new(set("node1", 2, Value::from(0))), vec!["`node1`", "element 3"]),
        (BYM2, Box::new(set("node2", 6, Value::from(1922))), vec!["`node2`", "element 7"]),
        (BYM2, Box::new(set("E", 1, Value::from(0.0))), vec!["`E`", "element 2", "log(E)"]),
        (BYM2, Box::new(set("y", 9, Value::from(-1))), vec!["`y`", "element 10"]),
    ];
    for (name, edit, wants) in cases {
        let tmp = edited_suite(&dir, name, edit);
        let msg = load_error(tmp.path(), name);
        for want in wants.iter().chain([&name, &"data.json"]) {
            assert!(msg.contains(want), "{name}: `{msg}` lacks `{want}`");
        }
    }
}

/// NUTS (4 chains x (1000 + 1000), the engine's defaults) through `losscurve_sislob` agrees
/// with Stan's reference moments (R-hat 1.001, bulk ESS >= 3,600, no divergences) on every
/// parameter and transformed parameter: each mean within 4 Monte Carlo sds of both runs, each
/// sd within 4 of the sd estimate's relative error plus 3%.
#[test]
fn losscurve_nuts_matches_the_reference() {
    let Some(dir) = suite("losscurve_nuts_matches_the_reference") else { return };
    let device = flex();
    let model = load(LOSS, &dir, &device);
    let reference = ReferenceMoments::for_model(&model).unwrap();
    let spec =
        EngineSpec::new(MethodConfig::default_for("nuts").unwrap(), KernelConfig::default(), AdapterConfig::default());
    let config = FitConfig { steps: 1, seed: 5, ..FitConfig::default() };
    let result = fit(&model, &spec, &config, &mut [], &device).unwrap();
    let chains = result.chains.unwrap();
    let rows = result.draws.len();
    // The reference's columns are the model's compared quantities (reported, then generated);
    // the generated ones (posterior predictive draws) are left out below.
    let compared = to_vec_f64(&model.compared(result.draws.positions.clone(), 5).unwrap());
    let width = model.compared_names().len();
    let selected = reference.select(&compared, width);
    let reported_names = model.param_names();
    let params = reference.names().len();
    let per_chain = rows / chains;
    // Draws are snapshot-major: row `s * chains + c`.
    let column = |j: usize| -> Vec<Vec<f64>> {
        (0..chains).map(|c| (0..per_chain).map(|s| selected[(s * chains + c) * params + j]).collect()).collect()
    };
    let reference_ess = 3600.0;
    for (j, name) in reference.names().iter().enumerate() {
        if !reported_names.contains(name) {
            continue;
        }
        let chains_j = column(j);
        let all: Vec<f64> = chains_j.iter().flatten().copied().collect();
        let mean = all.iter().sum::<f64>() / all.len() as f64;
        let sd = spread(&all);
        let e = ess(&chains_j).min(all.len() as f64);
        let (ref_mean, ref_sd) = (reference.mean()[j], reference.sd()[j]);
        let mean_tol = 4.0 * (1.0 / e + 1.0 / reference_ess).sqrt();
        let sd_tol = 4.0 * (1.0 / (2.0 * e) + 1.0 / (2.0 * reference_ess)).sqrt() + 0.03;
        let z = (mean - ref_mean) / ref_sd;
        assert!(
            z.abs() < mean_tol,
            "{name}: mean {mean} vs reference {ref_mean}: {z:.3} sd (tolerance {mean_tol:.3}, ESS {e:.0})"
        );
        let ratio = sd / ref_sd;
        assert!((ratio - 1.0).abs() < sd_tol, "{name}: sd ratio {ratio:.3} (tolerance {sd_tol:.3}, ESS {e:.0})");
    }
}
