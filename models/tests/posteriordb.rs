//! The posteriordb models against independent `f64` computations written from the Stan programs,
//! their scores against finite differences, their names against the reference draws, and their
//! errors on bad data.
//!
//! The suite folder is `PARVI_POSTERIORDB_DIR`, else `$PARVI_DATA_DIR/../posteriordb`, else
//! `../shared/posteriordb` beside the workspace. Without it the suite tests print a note and
//! pass, unless `PARVI_REQUIRE_POSTERIORDB=1`.

use std::f64::consts::PI;
use std::path::Path;

use parvi_model::burn::tensor::{Int, Tensor, TensorData};
use parvi_model::dist::{Cauchy, LogProb, Poisson, StudentT, ln_gamma, ln_gamma_tensor, log_mix};
use parvi_model::tensor_ops::to_vec_f32;
use parvi_model::{BackendKind, LogDensity, Minibatch, ParamLayout, score};
use parvi_models::posteriordb::{self, NAMES, PosteriorDbError, ReferenceDraws};
use serde_json::Value;

mod common;
use common::{flex, host_rows, matrix, suite};

// ---------------------------------------------------------------------------------------------
// The Stan programs in plain f64 loops. Every summed term goes through `Acc`, which also sums the
// terms' magnitudes: the scale of the f32 rounding error of the model's evaluation.

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
}

fn normal_lpdf(y: f64, mu: f64, sigma: f64) -> f64 {
    -0.5 * (2.0 * PI).ln() - sigma.ln() - 0.5 * ((y - mu) / sigma).powi(2)
}

fn cauchy_lpdf(y: f64, mu: f64, sigma: f64) -> f64 {
    -PI.ln() - sigma.ln() - ((y - mu) / sigma).powi(2).ln_1p()
}

/// Up to a constant in `y`.
fn student_t_lpdf(y: f64, nu: f64, mu: f64, sigma: f64) -> f64 {
    -sigma.ln() - 0.5 * (nu + 1.0) * (((y - mu) / sigma).powi(2) / nu).ln_1p()
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn logit(p: f64) -> f64 {
    (p / (1.0 - p)).ln()
}

/// `ln(u (1 - u))` for `u = sigmoid(x)`: the log-Jacobian of a `(0, 1)` constraint.
fn logistic_jacobian(x: f64) -> f64 {
    let u = sigmoid(x);
    (u * (1.0 - u)).ln()
}

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
    fn mat(&self, k: &str) -> Vec<Vec<f64>> {
        self.0[k]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect())
            .collect()
    }
}

/// The lower Cholesky factor of a symmetric positive definite matrix (plain loops).
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

/// gp_pois_regr's covariance with Stan's jitter.
fn gp_cov(x: &[f64], rho: f64, alpha: f64) -> Vec<Vec<f64>> {
    let n = x.len();
    (0..n)
        .map(|i| {
            (0..n)
                .map(|j| {
                    alpha * alpha * (-(x[i] - x[j]).powi(2) / (2.0 * rho * rho)).exp()
                        + if i == j { 1e-10 } else { 0.0 }
                })
                .collect()
        })
        .collect()
}

/// One posterior's Stan program, evaluated directly.
struct Direct {
    name: &'static str,
    d: StanData,
}

impl Direct {
    fn new(dir: &Path, name: &'static str) -> Self {
        Self { name, d: StanData::read(dir, name) }
    }

    /// A linear-regression log likelihood `sum_i normal(y_i | x_i . beta, sigma)`.
    fn regression(acc: &mut Acc, x: &[Vec<f64>], y: &[f64], beta: &[f64], sigma: f64) {
        for (row, &yi) in x.iter().zip(y) {
            let mu: f64 = row.iter().zip(beta).map(|(a, b)| a * b).sum();
            acc.add(normal_lpdf(yi, mu, sigma));
        }
    }

    /// `log p(x)` up to a constant, with the log-Jacobian, at unconstrained `x`.
    fn log_density(&self, x: &[f64]) -> Acc {
        let d = &self.d;
        let mut acc = Acc::default();
        match self.name {
            "eight_schools-eight_schools_noncentered" => {
                let j = d.int("J");
                let (y, s) = (d.vec("y"), d.vec("sigma"));
                let (mu, tau) = (x[j], x[j + 1].exp());
                for i in 0..j {
                    acc.add(normal_lpdf(x[i], 0.0, 1.0));
                    acc.add(normal_lpdf(y[i], x[i] * tau + mu, s[i]));
                }
                acc.add(normal_lpdf(mu, 0.0, 5.0));
                acc.add(cauchy_lpdf(tau, 0.0, 5.0));
                acc.add(x[j + 1]);
            }
            "kidiq-kidscore_momiq" => {
                let sigma = x[2].exp();
                let rows: Vec<Vec<f64>> = d.vec("mom_iq").iter().map(|&iq| vec![1.0, iq]).collect();
                Self::regression(&mut acc, &rows, &d.vec("kid_score"), &x[..2], sigma);
                acc.add(cauchy_lpdf(sigma, 0.0, 2.5));
                acc.add(x[2]);
            }
            "earnings-logearn_interaction" => {
                let (h, m) = (d.vec("height"), d.vec("male"));
                let rows: Vec<Vec<f64>> = (0..h.len()).map(|i| vec![1.0, h[i], m[i], h[i] * m[i]]).collect();
                let y: Vec<f64> = d.vec("earn").iter().map(|e| e.ln()).collect();
                Self::regression(&mut acc, &rows, &y, &x[..4], x[4].exp());
                acc.add(x[4]);
            }
            "mesquite-logmesquite_logvas" => {
                let (d1, d2, ch) = (d.vec("diam1"), d.vec("diam2"), d.vec("canopy_height"));
                let (th, den, g) = (d.vec("total_height"), d.vec("density"), d.vec("group"));
                let rows: Vec<Vec<f64>> = (0..d1.len())
                    .map(|i| {
                        vec![
                            1.0,
                            (d1[i] * d2[i] * ch[i]).ln(),
                            (d1[i] * d2[i]).ln(),
                            (d1[i] / d2[i]).ln(),
                            th[i].ln(),
                            den[i].ln(),
                            g[i],
                        ]
                    })
                    .collect();
                let y: Vec<f64> = d.vec("weight").iter().map(|w| w.ln()).collect();
                Self::regression(&mut acc, &rows, &y, &x[..7], x[7].exp());
                acc.add(x[7]);
            }
            "sblrc-blr" => {
                let dim = d.int("D");
                let sigma = x[dim].exp();
                for &b in &x[..dim] {
                    acc.add(normal_lpdf(b, 0.0, 10.0));
                }
                acc.add(normal_lpdf(sigma, 0.0, 10.0));
                Self::regression(&mut acc, &d.mat("X"), &d.vec("y"), &x[..dim], sigma);
                acc.add(x[dim]);
            }
            "arK-arK" => {
                let (k, t) = (d.int("K"), d.int("T"));
                let y = d.vec("y");
                let (alpha, beta, sigma) = (x[0], &x[1..=k], x[k + 1].exp());
                acc.add(normal_lpdf(alpha, 0.0, 10.0));
                for &b in beta {
                    acc.add(normal_lpdf(b, 0.0, 10.0));
                }
                acc.add(cauchy_lpdf(sigma, 0.0, 2.5));
                for s in k..t {
                    let mut mu = alpha;
                    for lag in 1..=k {
                        mu += beta[lag - 1] * y[s - lag];
                    }
                    acc.add(normal_lpdf(y[s], mu, sigma));
                }
                acc.add(x[k + 1]);
            }
            "garch-garch11" => {
                let y = d.vec("y");
                let (mu, alpha0, alpha1) = (x[0], x[1].exp(), sigmoid(x[2]));
                let beta1 = (1.0 - alpha1) * sigmoid(x[3]);
                let mut sigma = d.real("sigma1");
                for t in 0..y.len() {
                    if t > 0 {
                        sigma = (alpha0 + alpha1 * (y[t - 1] - mu).powi(2) + beta1 * sigma * sigma).sqrt();
                    }
                    acc.add(normal_lpdf(y[t], mu, sigma));
                }
                acc.add(x[1]);
                acc.add(logistic_jacobian(x[2]));
                acc.add(logistic_jacobian(x[3]) + (1.0 - alpha1).ln());
            }
            "low_dim_gauss_mix-low_dim_gauss_mix" => {
                let mu = [x[0], x[0] + x[1].exp()];
                let sigma = [x[2].exp(), x[3].exp()];
                let theta = sigmoid(x[4]);
                for k in 0..2 {
                    acc.add(normal_lpdf(sigma[k], 0.0, 2.0));
                    acc.add(normal_lpdf(mu[k], 0.0, 2.0));
                }
                acc.add(4.0 * theta.ln() + 4.0 * (1.0 - theta).ln());
                for y in d.vec("y") {
                    let a = theta.ln() + normal_lpdf(y, mu[0], sigma[0]);
                    let b = (1.0 - theta).ln() + normal_lpdf(y, mu[1], sigma[1]);
                    let m = a.max(b);
                    acc.add(m + ((a - m).exp() + (b - m).exp()).ln());
                }
                acc.add(x[1] + x[2] + x[3] + logistic_jacobian(x[4]));
            }
            "gp_pois_regr-gp_pois_regr" => {
                let xs = d.vec("x");
                let k = d.vec("k");
                let n = xs.len();
                let (rho, alpha) = (x[0].exp(), x[1].exp());
                let l = cholesky(&gp_cov(&xs, rho, alpha));
                acc.add(24.0 * rho.ln() - 4.0 * rho);
                acc.add(normal_lpdf(alpha, 0.0, 2.0));
                for i in 0..n {
                    acc.add(normal_lpdf(x[2 + i], 0.0, 1.0));
                    let f: f64 = (0..=i).map(|j| l[i][j] * x[2 + j]).sum();
                    acc.add(k[i] * f - f.exp() - ln_gamma(k[i] + 1.0));
                }
                acc.add(x[0] + x[1]);
            }
            "diamonds-diamonds" => {
                let kk = d.int("K");
                let xm = d.mat("X");
                let y = d.vec("Y");
                let rows = xm.len();
                let means: Vec<f64> = (1..kk).map(|c| xm.iter().map(|r| r[c]).sum::<f64>() / rows as f64).collect();
                let (b, intercept, sigma) = (&x[..kk - 1], x[kk - 1], x[kk].exp());
                for &bj in b {
                    acc.add(normal_lpdf(bj, 0.0, 1.0));
                }
                acc.add(student_t_lpdf(intercept, 3.0, 8.0, 10.0));
                acc.add(student_t_lpdf(sigma, 3.0, 0.0, 10.0));
                for (r, yi) in xm.iter().zip(&y) {
                    let mu = intercept + (1..kk).map(|c| (r[c] - means[c - 1]) * b[c - 1]).sum::<f64>();
                    acc.add(normal_lpdf(*yi, mu, sigma));
                }
                acc.add(x[kk]);
            }
            other => panic!("no direct computation for {other}"),
        }
        acc
    }

    /// The reported quantities at unconstrained `x`.
    fn reported(&self, x: &[f64]) -> Vec<f64> {
        let d = &self.d;
        match self.name {
            "eight_schools-eight_schools_noncentered" => {
                let j = d.int("J");
                let (mu, tau) = (x[j], x[j + 1].exp());
                (0..j).map(|i| x[i] * tau + mu).chain([mu, tau]).collect()
            }
            "garch-garch11" => {
                let alpha1 = sigmoid(x[2]);
                vec![x[0], x[1].exp(), alpha1, (1.0 - alpha1) * sigmoid(x[3])]
            }
            "low_dim_gauss_mix-low_dim_gauss_mix" => {
                vec![x[0], x[0] + x[1].exp(), x[2].exp(), x[3].exp(), sigmoid(x[4])]
            }
            "gp_pois_regr-gp_pois_regr" => {
                let xs = d.vec("x");
                let (rho, alpha) = (x[0].exp(), x[1].exp());
                let l = cholesky(&gp_cov(&xs, rho, alpha));
                let f = (0..xs.len()).map(|i| (0..=i).map(|j| l[i][j] * x[2 + j]).sum::<f64>());
                [rho, alpha].into_iter().chain(f).collect()
            }
            // The regressions: coefficients as they are, then sigma.
            _ => {
                let last = x.len() - 1;
                x[..last].iter().copied().chain([x[last].exp()]).collect()
            }
        }
    }

    /// The unconstrained point of a reported (constrained) draw.
    fn unconstrain(&self, q: &[f64]) -> Vec<f64> {
        let d = &self.d;
        match self.name {
            "eight_schools-eight_schools_noncentered" => {
                let j = d.int("J");
                let (mu, tau) = (q[j], q[j + 1]);
                (0..j).map(|i| (q[i] - mu) / tau).chain([mu, tau.ln()]).collect()
            }
            "garch-garch11" => vec![q[0], q[1].ln(), logit(q[2]), logit(q[3] / (1.0 - q[2]))],
            "low_dim_gauss_mix-low_dim_gauss_mix" => {
                vec![q[0], (q[1] - q[0]).ln(), q[2].ln(), q[3].ln(), logit(q[4])]
            }
            "gp_pois_regr-gp_pois_regr" => {
                let xs = d.vec("x");
                let l = cholesky(&gp_cov(&xs, q[0], q[1]));
                let f = &q[2..];
                let mut ft = vec![0.0; xs.len()];
                for i in 0..xs.len() {
                    ft[i] = (f[i] - (0..i).map(|j| l[i][j] * ft[j]).sum::<f64>()) / l[i][i];
                }
                [q[0].ln(), q[1].ln()].into_iter().chain(ft).collect()
            }
            _ => {
                let last = q.len() - 1;
                q[..last].iter().copied().chain([q[last].ln()]).collect()
            }
        }
    }
}

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

/// Unconstrained points from reference draws (posterior-typical), and the per-coordinate spread of
/// the unconstrained posterior estimated from 200 of them.
fn reference_points(direct: &Direct, reference: &ReferenceDraws) -> (Vec<Vec<f64>>, Vec<f64>) {
    let p = reference.params();
    let order = direct_order(direct.name, reference);
    let rows: Vec<Vec<f64>> = (0..200)
        .map(|i| i * reference.rows() / 200)
        .map(|r| direct.unconstrain(&permute(&reference.values()[r * p..(r + 1) * p], &order)))
        .collect();
    let dim = rows[0].len();
    let spread = (0..dim)
        .map(|j| {
            let m = rows.iter().map(|r| r[j]).sum::<f64>() / rows.len() as f64;
            (rows.iter().map(|r| (r[j] - m).powi(2)).sum::<f64>() / (rows.len() - 1) as f64).sqrt()
        })
        .collect();
    (rows, spread)
}

/// For each quantity [`Direct::reported`] returns, its column in the reference (which follows the
/// model's reported order: Stan's, parameters before transformed parameters). The direct
/// programs report in the reference files' own order, which differs for eight_schools, whose
/// transformed `theta` the file lists first.
fn direct_order(name: &str, reference: &ReferenceDraws) -> Vec<usize> {
    let names = reference.names();
    let position = |n: &str| names.iter().position(|m| m == n).unwrap();
    if name == "eight_schools-eight_schools_noncentered" {
        let thetas = names.iter().filter(|n| n.starts_with("theta[")).count();
        (1..=thetas).map(|i| position(&format!("theta[{i}]"))).chain([position("mu"), position("tau")]).collect()
    } else {
        (0..names.len()).collect()
    }
}

fn permute(values: &[f64], order: &[usize]) -> Vec<f64> {
    order.iter().map(|&j| values[j]).collect()
}

// ---------------------------------------------------------------------------------------------
// The suite.

/// The shared suite's first ten posteriors, which [`Direct`] evaluates.
fn original() -> &'static [&'static str] {
    &NAMES[..10]
}

#[test]
fn names_and_aliases_resolve() {
    let Some(dir) = suite("names_and_aliases_resolve") else { return };
    assert_eq!(NAMES.len(), 22);
    for (full, alias) in original().iter().zip(posteriordb::ALIASES) {
        assert_eq!(posteriordb::resolve(full, &dir).unwrap(), dir.join(full));
        assert_eq!(posteriordb::resolve(alias, &dir).unwrap(), dir.join(full));
    }
    // By model name where the suite holds one posterior of it.
    assert_eq!(posteriordb::resolve("nes", &dir).unwrap(), dir.join("nes1972-nes"));
    let listed = posteriordb::list(&dir).unwrap();
    assert_eq!(listed.len(), 22, "{listed:?}");
    for entry in &listed {
        assert!(NAMES.contains(&entry.name.as_str()), "{}", entry.name);
        assert!(posteriordb::MODELS.contains(&entry.model.as_str()), "{}", entry.model);
    }
    let err = posteriordb::resolve("eight_school", &dir).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, PosteriorDbError::UnknownPosterior { .. }));
    assert!(msg.contains("eight_school") && msg.contains("diamonds-diamonds") && msg.contains("kidiq"), "{msg}");
}

/// Every model's log density against the direct computation, as differences from a first point
/// (constants cancel), at posterior-typical points from the reference draws and at perturbed
/// ones; the reported quantities against the f64 transform; the names against the reference
/// draws' keys; a full-data minibatch against no minibatch.
#[test]
fn log_densities_match_the_stan_programs() {
    let Some(dir) = suite("log_densities_match_the_stan_programs") else { return };
    let device = flex();
    for &name in original() {
        let model = posteriordb::load(name, &dir, &device).unwrap();
        assert_eq!(model.name(), name);
        assert!(model.deviation().is_none(), "{name}: {:?}", model.deviation());
        let reference = ReferenceDraws::load(name, &dir).unwrap();
        assert_eq!((reference.chains(), reference.draws_per_chain()), (10, 1000), "{name}");
        // The reference's columns are reported quantities of the model, under the same names.
        let all_names = model.param_names();
        for (column, name_in_reference) in reference.columns().iter().zip(reference.names()) {
            assert_eq!(&all_names[*column], name_in_reference, "{name}");
        }
        // The keys of the file, independently of the crate's reader.
        let raw: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join(name).join("reference_draws.json")).unwrap())
                .unwrap();
        let names = reference.names().to_vec();
        for chain in raw.as_array().unwrap() {
            let mut keys: Vec<&String> = chain.as_object().unwrap().keys().collect();
            let mut sorted: Vec<&String> = names.iter().collect();
            keys.sort();
            sorted.sort();
            assert_eq!(keys, sorted, "{name}: reported names vs the reference draws' keys");
        }

        let direct = Direct::new(&dir, name);
        let (typical, spread) = reference_points(&direct, &reference);
        let mut rng = Lcg(7);
        let mut points: Vec<Vec<f64>> = vec![typical[3].clone(), typical[101].clone(), typical[177].clone()];
        for base in [&typical[50], &typical[150]] {
            points.push(base.iter().zip(&spread).map(|(x, s)| x + 2.0 * s * rng.normal()).collect());
        }
        points.push(typical[20].iter().map(|x| x + 0.3 * rng.normal()).collect());
        // Evaluate the f64 program at the f32-rounded points the model sees.
        let points: Vec<Vec<f64>> = points.iter().map(|p| p.iter().map(|&v| f64::from(v as f32)).collect()).collect();
        assert_eq!(points[0].len(), model.dim(), "{name}");

        let lp = to_vec_f32(&model.log_prob(matrix(&points, &device), None));
        let exact: Vec<Acc> = points.iter().map(|p| direct.log_density(p)).collect();
        let mut worst = 0.0f64;
        for i in 1..points.len() {
            let ours = f64::from(lp[i]) - f64::from(lp[0]);
            let theirs = exact[i].sum - exact[0].sum;
            // f32 evaluation: rounding error scales with the magnitude of the summed terms.
            let scale = exact[i].magnitude + exact[0].magnitude;
            let tol = 1e-5 * scale + 1e-3;
            worst = worst.max((ours - theirs).abs() / scale);
            assert!(
                (ours - theirs).abs() <= tol,
                "{name}, point {i}: log p difference {ours} vs direct {theirs} (tolerance {tol}, log p {} vs {})",
                lp[i],
                exact[i].sum
            );
        }
        eprintln!(
            "{name}: log p differences agree to {worst:.1e} of the summed terms' magnitude (log p {:.4e}, magnitude {:.2e})",
            exact[0].sum, exact[0].magnitude
        );

        let width = model.param_names().len();
        let reported = host_rows(&model.reported(matrix(&points, &device)));
        let order = direct_order(name, &reference);
        let reported: Vec<Vec<f64>> =
            reported.iter().map(|row| permute(&reference.select(row, width), &order)).collect();
        for (p, row) in points.iter().zip(&reported) {
            let expect = direct.reported(p);
            assert_eq!(row.len(), expect.len(), "{name}: reported width");
            for (j, (a, b)) in row.iter().zip(&expect).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                    "{name}: reported {} = {a}, f64 transform {b}",
                    names[order[j]]
                );
            }
        }

        if let Some(rows) = model.data_len() {
            let all = Minibatch {
                indices: Tensor::<1, Int>::from_data(
                    TensorData::new((0..rows as i64).collect::<Vec<_>>(), [rows]),
                    &device,
                ),
                len: rows,
                total: rows,
            };
            let batched = to_vec_f32(&model.log_prob(matrix(&points, &device), Some(&all)));
            for (a, b) in batched.iter().zip(&lp) {
                assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{name}: full minibatch {a} vs no minibatch {b}");
            }
        }
    }
}

/// Autodiff scores against central differences of the model's own log density (f32, so the step
/// is a fraction of the local scale and the tolerance allows for rounding), and against central
/// differences of the direct f64 program with a small step (tight).
#[test]
fn scores_match_finite_differences() {
    let Some(dir) = suite("scores_match_finite_differences") else { return };
    let device = flex();
    for &name in original() {
        let model = posteriordb::load(name, &dir, &device).unwrap();
        let reference = ReferenceDraws::load(name, &dir).unwrap();
        let direct = Direct::new(&dir, name);
        let (typical, spread) = reference_points(&direct, &reference);
        let mut rng = Lcg(11);
        let x0: Vec<f64> =
            typical[42].iter().zip(&spread).map(|(x, s)| f64::from((x + 0.5 * s * rng.normal()) as f32)).collect();
        let dim = x0.len();
        let g = to_vec_f32(&score(&model, matrix(std::slice::from_ref(&x0), &device), None).unwrap().grad);
        let exact = |p: &[f64]| direct.log_density(p).sum;
        let moved = |j: usize, by: f64| -> Vec<f64> {
            let mut p = x0.clone();
            p[j] += by;
            p
        };
        // The local scale of each coordinate: the posterior spread, or the conditional scale
        // 1 / sqrt(|d2 log p / dx_j^2|) where that is smaller (gp_pois_regr's log alpha moves
        // every f at once, so its conditional scale is far below its marginal spread).
        let local: Vec<f64> = (0..dim)
            .map(|j| {
                let e = 1e-3 * spread[j];
                let curvature = (exact(&moved(j, e)) - 2.0 * exact(&x0) + exact(&moved(j, -e))) / (e * e);
                if curvature.abs() > 0.0 { spread[j].min(1.0 / curvature.abs().sqrt()) } else { spread[j] }
            })
            .collect();

        let quotient = |j: usize, h: f64| (exact(&moved(j, h)) - exact(&moved(j, -h))) / (2.0 * h);
        // The exact derivative (f64, tiny step), and for the f32 model the largest step, from the
        // local scale down, whose truncation error (measured on the f64 program) is below 0.5%:
        // f32 rounding of log p calls for steps as large as the curvature allows.
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
        // All 2 dim shifted points in one batch, as f32 points.
        let mut shifted = Vec::with_capacity(2 * dim);
        for (j, h) in steps.iter().enumerate() {
            for sign in [1.0, -1.0] {
                shifted.push(moved(j, sign * h).iter().map(|&v| f64::from(v as f32)).collect::<Vec<f64>>());
            }
        }
        let lp = to_vec_f32(&model.log_prob(matrix(&shifted, &device), None));
        let magnitude = direct.log_density(&x0).magnitude;
        let mut worst = 0.0f64;
        for j in 0..dim {
            let step = shifted[2 * j][j] - shifted[2 * j + 1][j];
            let fd_model = (f64::from(lp[2 * j]) - f64::from(lp[2 * j + 1])) / step;
            let fd_exact = fd_exact[j];
            let ad = f64::from(g[j]);
            // The gradient's natural scale is 1 / local scale; f32 rounding of log p adds about
            // 1e-6 * magnitude / step to a difference quotient of the model.
            let scale = 1.0 / local[j];
            let tol_model = 0.02 * (ad.abs() + scale) + 2e-6 * magnitude / step;
            let tol_exact = 2e-3 * (ad.abs() + scale);
            worst = worst.max((ad - fd_exact).abs() / (ad.abs() + scale));
            assert!(
                (ad - fd_model).abs() <= tol_model,
                "{name}, coordinate {j}: autodiff {ad} vs finite differences of log_prob {fd_model} (tolerance {tol_model})"
            );
            assert!(
                (ad - fd_exact).abs() <= tol_exact,
                "{name}, coordinate {j}: autodiff {ad} vs finite differences of the f64 program {fd_exact} (tolerance {tol_exact})"
            );
        }
        eprintln!("{name}: scores agree with the f64 program's difference quotients to {worst:.1e} (relative)");
    }
}

/// The models evaluate the same on wgpu as on flex (when a wgpu adapter exists).
#[test]
fn wgpu_matches_flex() {
    let Some(dir) = suite("wgpu_matches_flex") else { return };
    if !BackendKind::Wgpu.is_compiled() {
        eprintln!("wgpu_matches_flex: skipped, built without wgpu");
        return;
    }
    let wgpu = match BackendKind::Wgpu.device() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("wgpu_matches_flex: skipped, no wgpu device ({e})");
            return;
        }
    };
    let device = flex();
    for name in ["eight_schools", "garch", "low_dim_gauss_mix", "gp_pois_regr", "kidiq"] {
        let on_flex = posteriordb::load(name, &dir, &device).unwrap();
        let on_wgpu = posteriordb::load(name, &dir, &wgpu).unwrap();
        let reference = ReferenceDraws::load(name, &dir).unwrap();
        let direct = Direct::new(&dir, NAMES[posteriordb::ALIASES.iter().position(|a| *a == name).unwrap()]);
        let (typical, _) = reference_points(&direct, &reference);
        let points = &typical[..4];
        let a = to_vec_f32(&on_flex.log_prob(matrix(points, &device), None));
        let b = to_vec_f32(&on_wgpu.log_prob(matrix(points, &wgpu), None));
        let magnitude = direct.log_density(&points[0]).magnitude;
        let worst = a.iter().zip(&b).map(|(x, y)| f64::from((x - y).abs())).fold(0.0, f64::max);
        if let Some(deviation) = on_wgpu.deviation() {
            // A documented fallback (no f64 on this adapter): a nearby model, not the same one.
            assert!(b.iter().all(|v| v.is_finite()), "{name}: wgpu fallback log p {b:?}");
            eprintln!("{name}: wgpu uses a fallback, log p differs from flex by up to {worst:.3}: {deviation}");
            continue;
        }
        assert!(worst <= 1e-5 * magnitude + 1e-3, "{name}: flex {a:?} vs wgpu {b:?}");
        let g = score(&on_wgpu, matrix(points, &wgpu), None).unwrap().grad;
        assert!(parvi_model::tensor_ops::all_finite(&g), "{name}: wgpu score");
        eprintln!("{name}: wgpu agrees with flex to {worst:.1e}");
    }
}

// ---------------------------------------------------------------------------------------------
// Bad data.

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

#[test]
fn bad_data_is_named() {
    let Some(dir) = suite("bad_data_is_named") else { return };
    let eight = "eight_schools-eight_schools_noncentered";

    let tmp = edited_suite(&dir, eight, |d| {
        d.remove("sigma");
    });
    let msg = load_error(tmp.path(), "eight_schools");
    assert!(
        msg.contains(eight) && msg.contains("data.json") && msg.contains("`sigma`") && msg.contains("missing"),
        "{msg}"
    );

    let tmp = edited_suite(&dir, eight, |d| {
        d["y"].as_array_mut().unwrap().pop();
    });
    let msg = load_error(tmp.path(), eight);
    assert!(msg.contains(eight) && msg.contains("`y`") && msg.contains("has 7 values but J = 8"), "{msg}");

    let tmp = edited_suite(&dir, eight, |d| {
        d["sigma"][3] = Value::from(-1.0);
    });
    let msg = load_error(tmp.path(), eight);
    assert!(
        msg.contains(eight)
            && msg.contains("`sigma`")
            && msg.contains("-1")
            && msg.contains("outside the constraint <lower=0>"),
        "{msg}"
    );

    let tmp = edited_suite(&dir, eight, |d| {
        d["J"] = Value::from("eight");
    });
    let msg = load_error(tmp.path(), eight);
    assert!(msg.contains("`J`") && msg.contains("expected an integer"), "{msg}");

    let kidiq = "kidiq-kidscore_momiq";
    let tmp = edited_suite(&dir, kidiq, |d| {
        d["kid_score"][10] = Value::from(250);
    });
    let msg = load_error(tmp.path(), kidiq);
    assert!(msg.contains(kidiq) && msg.contains("`kid_score`") && msg.contains("<lower=0, upper=200>"), "{msg}");

    let earnings = "earnings-logearn_interaction";
    let tmp = edited_suite(&dir, earnings, |d| {
        d["earn"][0] = Value::from(0);
    });
    let msg = load_error(tmp.path(), earnings);
    assert!(
        msg.contains(earnings) && msg.contains("`earn`") && msg.contains("must be > 0") && msg.contains("log"),
        "{msg}"
    );

    let sblrc = "sblrc-blr";
    let tmp = edited_suite(&dir, sblrc, |d| {
        d["X"][4].as_array_mut().unwrap().pop();
    });
    let msg = load_error(tmp.path(), sblrc);
    assert!(msg.contains("`X`") && msg.contains("row 5 has 4 values but D = 5"), "{msg}");

    let gp = "gp_pois_regr-gp_pois_regr";
    let tmp = edited_suite(&dir, gp, |d| {
        d["k"][2] = Value::from(-3);
    });
    let msg = load_error(tmp.path(), gp);
    assert!(msg.contains("`k`") && msg.contains("Poisson count"), "{msg}");

    // Bad JSON: the line and column.
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join(eight)).unwrap();
    std::fs::copy(dir.join(eight).join("posterior.json"), tmp.path().join(eight).join("posterior.json")).unwrap();
    std::fs::write(tmp.path().join(eight).join("data.json"), "{\n  \"J\": 8,\n  \"y\": [1, 2,, 3]\n}").unwrap();
    let err = posteriordb::load(eight, tmp.path(), &flex()).unwrap_err();
    assert!(matches!(err, PosteriorDbError::Json { line: 3, .. }), "{err:?}");
    assert!(err.to_string().contains("line 3, column"), "{err}");

    // A missing folder: the file and the OS's reason.
    let msg = load_error(&tmp.path().join("nowhere"), "garch");
    assert!(msg.contains("garch-garch11") && msg.contains("cannot read") && msg.contains("posterior.json"), "{msg}");
    // A posterior.json naming a model parvi does not know: the posterior and the model, by name.
    std::fs::write(tmp.path().join(eight).join("posterior.json"), r#"{"name": "x-y", "model_name": "no_such_model"}"#)
        .unwrap();
    let msg = load_error(tmp.path(), eight);
    assert!(msg.contains("x-y") && msg.contains("unknown model `no_such_model`"), "{msg}");
    // Another data set of a known model runs: the nes model on its data under another name.
    let other = tempfile::tempdir().unwrap();
    std::fs::create_dir(other.path().join("nes1976-nes")).unwrap();
    std::fs::write(
        other.path().join("nes1976-nes").join("posterior.json"),
        r#"{"name": "nes1976-nes", "model_name": "nes", "data_name": "nes1976"}"#,
    )
    .unwrap();
    let mut nes = StanData::read(&dir, "nes1972-nes").0;
    let n = 200;
    for (key, value) in nes.iter_mut() {
        if let Value::Array(items) = value {
            items.truncate(n);
        } else if key == "N" {
            *value = Value::from(n);
        }
    }
    std::fs::write(other.path().join("nes1976-nes").join("data.json"), serde_json::to_string(&nes).unwrap()).unwrap();
    let model = posteriordb::load("nes1976-nes", other.path(), &flex()).unwrap();
    assert_eq!((model.name(), model.model_name(), model.dim()), ("nes1976-nes", "nes", 10));
    assert_eq!(posteriordb::resolve("nes", other.path()).unwrap(), other.path().join("nes1976-nes"));

    // Reference draws whose second chain lacks a parameter of the first (a reference may leave
    // out a reported quantity, but every chain the same ones).
    let names: Vec<String> = ["mu", "alpha0", "alpha1", "beta1"].map(String::from).to_vec();
    let file = tmp.path().join("draws.json");
    std::fs::write(
        &file,
        r#"[{"mu": [1, 2], "alpha0": [1, 2], "alpha1": [0.5, 0.5], "beta1": [0.1, 0.2]},
            {"mu": [1, 2], "alpha0": [1, 2], "alpha1": [0.5, 0.5]}]"#,
    )
    .unwrap();
    let msg = ReferenceDraws::from_file("garch", &file, &names).unwrap_err().to_string();
    assert!(msg.contains("garch") && msg.contains("`beta1`") && msg.contains("chain 2 lacks"), "{msg}");
    // A parameter the model does not report.
    std::fs::write(&file, r#"[{"mu": [1, 2], "gamma": [1, 2]}]"#).unwrap();
    let msg = ReferenceDraws::from_file("garch", &file, &names).unwrap_err().to_string();
    assert!(msg.contains("`gamma`") && msg.contains("does not report"), "{msg}");
    std::fs::write(&file, r#"[{"mu": [1, 2], "alpha0": [1, 2], "alpha1": [0.5, 0.5], "beta1": [0.1]}]"#).unwrap();
    let msg = ReferenceDraws::from_file("garch", &file, &names).unwrap_err().to_string();
    assert!(msg.contains("`beta1`") && msg.contains("1 draws"), "{msg}");
}

// ---------------------------------------------------------------------------------------------
// DSL additions (no suite needed).

#[test]
fn ordered_blocks_increase_and_round_trip() {
    let device = flex();
    let layout = ParamLayout::new().ordered("mu", 3).unwrap().positive("s", &[]).unwrap();
    let x = vec![vec![-1.0, 0.5, -2.0, 0.3], vec![2.0, -1.0, 1.0, 0.0]];
    let unpacked = layout.unpack(matrix(&x, &device));
    let jac = to_vec_f32(&unpacked.log_jacobian());
    let mu = host_rows(&unpacked.flat("mu").unwrap());
    for (i, row) in x.iter().enumerate() {
        let expect = [row[0], row[0] + row[1].exp(), row[0] + row[1].exp() + row[2].exp()];
        for (a, b) in mu[i].iter().zip(expect) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
        assert!((f64::from(jac[i]) - (row[1] + row[2] + row[3])).abs() < 1e-5);
        let back = layout.unconstrain(&[expect[0], expect[1], expect[2], row[3].exp()]).unwrap();
        for (a, b) in back.iter().zip(row) {
            assert!((a - b).abs() < 1e-9, "{a} vs {b}");
        }
    }
    assert!(layout.unconstrain(&[1.0, 1.0, 2.0, 1.0]).is_err(), "ties are not ordered");
    assert!(ParamLayout::new().add("m", &[2, 2], parvi_model::Constraint::Ordered).is_err());
}

#[test]
fn new_distributions_match_their_formulas() {
    let device = flex();
    let row = |v: &[f64]| matrix(&[v.to_vec()], &device);
    // Cauchy(1, 2).
    let x = [-3.0, 0.0, 1.0, 7.5];
    let lp = to_vec_f32(&Cauchy::new(1.0, 2.0).unwrap().log_prob(row(&x)));
    for (a, &xi) in lp.iter().zip(&x) {
        assert!((f64::from(*a) - cauchy_lpdf(xi, 1.0, 2.0)).abs() < 1e-5);
    }
    // Poisson with log rate, including ln k!.
    let k = [0.0, 1.0, 4.0, 82.0];
    let eta = [0.3, -1.0, 1.5, 4.4];
    let lp = to_vec_f32(&Poisson::from_log_rate(row(&eta)).log_prob(row(&k)));
    for ((a, &ki), &ei) in lp.iter().zip(&k).zip(&eta) {
        let expect = ki * ei - ei.exp() - ln_gamma(ki + 1.0);
        assert!((f64::from(*a) - expect).abs() < 2e-5 * (1.0 + expect.abs()), "{a} vs {expect}");
    }
    // ln Gamma on a tensor against the host version.
    let xs = [0.1, 0.5, 1.0, 2.5, 10.0, 83.0, 1e4];
    let lg = to_vec_f32(&ln_gamma_tensor(row(&xs)));
    for (a, &xi) in lg.iter().zip(&xs) {
        assert!((f64::from(*a) - ln_gamma(xi)).abs() < 2e-6 * (1.0 + ln_gamma(xi).abs()), "ln_gamma({xi}): {a}");
    }
    // Student-t tails on the host: df = 1 is the Cauchy, P(X > 1) = 1/4; at the location, 1/2.
    let cauchy = StudentT::<1>::new(1.0, 0.0, 1.0).unwrap();
    assert!((cauchy.lccdf(1.0).unwrap() - 0.25f64.ln()).abs() < 1e-12);
    assert!((cauchy.lcdf(1.0).unwrap() - 0.75f64.ln()).abs() < 1e-12);
    assert!((StudentT::<1>::new(3.0, 0.0, 10.0).unwrap().lccdf(0.0).unwrap() - 0.5f64.ln()).abs() < 1e-12);
    // df = 2: P(T <= t) = 1/2 + t / (2 sqrt(t^2 + 2)), here far in the upper tail.
    let t2 = StudentT::<1>::new(2.0, 1.0, 2.0).unwrap();
    let t = (401.0 - 1.0) / 2.0;
    let upper = 0.5 - t / (2.0 * (t * t + 2.0f64).sqrt());
    assert!((t2.lccdf(401.0).unwrap() - upper.ln()).abs() < 1e-6, "{} vs {}", t2.lccdf(401.0).unwrap(), upper.ln());
    assert!((t2.lcdf(401.0).unwrap() - (-upper).ln_1p()).abs() < 1e-12);
    // log_mix, including terms far apart.
    let theta = [0.3, 0.9, 0.5];
    let (l1, l2) = ([-1.0, -800.0, 2.0], [-2.0, -1.0, 2.0]);
    let mixed = to_vec_f32(&log_mix(row(&theta), row(&l1), row(&l2)));
    for i in 0..3 {
        let (a, b) = (theta[i].ln() + l1[i], (1.0 - theta[i]).ln() + l2[i]);
        let m = a.max(b);
        let expect = m + ((a - m).exp() + (b - m).exp()).ln();
        assert!((f64::from(mixed[i]) - expect).abs() < 1e-5 * (1.0 + expect.abs()), "{} vs {expect}", mixed[i]);
    }
}

/// Every posterior of the suite: a missing data field and an array of the wrong length are errors
/// naming the file and the field (the first field the model reads that is missing or short;
/// posteriordb's data files carry a few the models do not read).
#[test]
fn bad_data_is_named_for_every_model() {
    let Some(dir) = suite("bad_data_is_named_for_every_model") else { return };
    for &name in NAMES {
        let data = StanData::read(&dir, name).0;
        let mut refused_missing = 0;
        let mut refused_short = 0;
        for (key, value) in &data {
            let missing = edited_suite(&dir, name, |d| {
                d.remove(key);
            });
            if let Err(e) = posteriordb::load(name, missing.path(), &flex()) {
                let msg = e.to_string();
                assert!(msg.contains(&format!("`{key}`")) && msg.contains("data.json"), "{name}: {msg}");
                refused_missing += 1;
            }
            if let Value::Array(items) = value
                && items.len() > 1
            {
                let short = edited_suite(&dir, name, |d| {
                    if let Value::Array(items) = &mut d[key] {
                        items.pop();
                    }
                });
                if let Err(e) = posteriordb::load(name, short.path(), &flex()) {
                    let msg = e.to_string();
                    assert!(msg.contains(&format!("`{key}`")) && msg.contains("data.json"), "{name}: {msg}");
                    refused_short += 1;
                }
            }
        }
        assert!(refused_missing > 0 && refused_short > 0, "{name}: {refused_missing} missing, {refused_short} short");
    }
    // Values outside the data block's declared bounds, for the new kinds of model.
    let cases: [(&str, &str, Value, &str); 5] = [
        ("hmm_example-hmm_example", "K", Value::from(3), "K must be 2"),
        ("bball_drive_event_0-hmm_drive_0", "u", Value::from(vec![-1.0; 416]), "<lower=0>"),
        (
            "hudson_lynx_hare-lotka_volterra",
            "ts",
            Value::from((0..20).map(|t| 20 - t).collect::<Vec<i32>>()),
            "increase",
        ),
        ("gp_pois_regr-gp_regr", "N", Value::from(0), "lower bound 1"),
        ("kidiq-kidscore_interaction", "mom_hs", Value::from(vec![2.0; 434]), "<lower=0, upper=1>"),
    ];
    for (name, field, value, expect) in cases {
        let tmp = edited_suite(&dir, name, |d| {
            d.insert(field.to_string(), value);
        });
        let msg = load_error(tmp.path(), name);
        assert!(msg.contains(&format!("`{field}`")) && msg.contains(expect), "{name}: {msg}");
    }
}
