//! CmdStan's other methods as library calls on posteriordb models (`PARVI_POSTERIORDB_DIR`):
//! `optimize` finds the modes least squares gives in closed form, with and without the
//! Jacobian; `log_prob` is the model's own density and its gradient.

use std::path::PathBuf;

use parvi::model::program::StanModel;
use parvi::model::tensor_ops::{matrix_from_vec, to_vec_f64};
use parvi::model::{BackendKind, LogDensity};
use parvi::models::posteriordb;
use parvi::stan_methods::{OptimizeConfig, log_prob, optimize};

fn suite() -> Option<PathBuf> {
    let dir = std::env::var_os("PARVI_POSTERIORDB_DIR").map(PathBuf::from);
    if dir.is_none() {
        eprintln!("skipped: set PARVI_POSTERIORDB_DIR to run it");
    }
    dir
}

/// The data file's numeric vector `field`.
fn vector(data: &serde_json::Value, field: &str) -> Vec<f64> {
    data[field].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect()
}

/// Least squares of `y` on `[1, x]`: the coefficients, the residual sum of squares and the
/// coefficients' unscaled variances `diag((X^T X)^-1)`.
fn least_squares(x: &[f64], y: &[f64]) -> ([f64; 2], f64, [f64; 2]) {
    let n = x.len() as f64;
    let (sx, sy) = (x.iter().sum::<f64>(), y.iter().sum::<f64>());
    let sxx: f64 = x.iter().map(|v| v * v).sum();
    let sxy: f64 = x.iter().zip(y).map(|(a, b)| a * b).sum();
    let det = n * sxx - sx * sx;
    let b1 = (n * sxy - sx * sy) / det;
    let b0 = (sy - b1 * sx) / n;
    let rss: f64 = x.iter().zip(y).map(|(a, b)| (b - b0 - b1 * a).powi(2)).sum();
    ([b0, b1], rss, [sxx / det, n / det])
}

/// The mode of `model` (a regression `y ~ normal(b0 + b1 x, sigma)`) against `beta` and `sigma`,
/// within `tolerance` of each one's posterior sd. The Jacobian moves earn_height's sigma by
/// 0.02 sd, so 0.005 tells the two modes apart (measured: within 0.001 sd of each).
fn assert_mode(
    model: &dyn StanModel,
    jacobian: bool,
    beta: [f64; 2],
    sigma: f64,
    var: [f64; 2],
    n: usize,
    tolerance: f64,
) {
    let device = BackendKind::Flex.device().unwrap();
    let mode = optimize(model, &OptimizeConfig { jacobian, seed: 1, ..OptimizeConfig::default() }, &device).unwrap();
    let got = |name: &str| mode.table.column(name).unwrap()[0];
    let sds = [sigma * var[0].sqrt(), sigma * var[1].sqrt(), sigma / (2.0 * n as f64).sqrt()];
    for ((name, expected), sd) in [("beta[1]", beta[0]), ("beta[2]", beta[1]), ("sigma", sigma)].into_iter().zip(sds) {
        let error = (got(name) - expected).abs() / sd;
        eprintln!("jacobian {jacobian}: {name} = {} against {expected}: {error:.4} sd", got(name));
        assert!(
            error < tolerance,
            "jacobian {jacobian}: {name} = {}, least squares {expected} ({error:.3} sd)",
            got(name)
        );
    }
    assert!(mode.warnings.is_empty(), "{:?}", mode.warnings);
}

#[test]
fn optimize_finds_the_least_squares_modes_of_two_posteriordb_regressions() {
    let Some(suite) = suite() else { return };
    let device = BackendKind::Flex.device().unwrap();
    // earn_height: flat priors. Without the Jacobian the mode is least squares with
    // sigma^2 = RSS / N; with it (log sigma's Jacobian adds log sigma) sigma^2 = RSS / (N - 1).
    let folder = suite.join("earnings-earn_height");
    let data: serde_json::Value = serde_json::from_slice(&std::fs::read(folder.join("data.json")).unwrap()).unwrap();
    let (x, y) = (vector(&data, "height"), vector(&data, "earn"));
    let (beta, rss, var) = least_squares(&x, &y);
    let n = x.len();
    let model = posteriordb::load_folder(&folder, &device).unwrap();
    assert_mode(&model, false, beta, (rss / n as f64).sqrt(), var, n, 0.005);
    assert_mode(&model, true, beta, (rss / (n - 1) as f64).sqrt(), var, n, 0.005);
    // kidscore_momiq: sigma ~ cauchy(0, 2.5). Beta is least squares whatever sigma; sigma solves
    // -N / s + RSS / s^3 - 2 s / (2.5^2 + s^2) = 0 (bisection).
    let folder = suite.join("kidiq-kidscore_momiq");
    let data: serde_json::Value = serde_json::from_slice(&std::fs::read(folder.join("data.json")).unwrap()).unwrap();
    let (x, y) = (vector(&data, "mom_iq"), vector(&data, "kid_score"));
    let (beta, rss, var) = least_squares(&x, &y);
    let n = x.len();
    let slope = |s: f64| -(n as f64) / s + rss / s.powi(3) - 2.0 * s / (6.25 + s * s);
    let (mut lo, mut hi) = (1.0, 100.0);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if slope(mid) > 0.0 { lo = mid } else { hi = mid }
    }
    let model = posteriordb::load_folder(&folder, &device).unwrap();
    assert_mode(&model, false, beta, 0.5 * (lo + hi), var, n, 0.005);
}

#[test]
fn log_prob_is_the_models_density_and_its_gradient() {
    let Some(suite) = suite() else { return };
    let device = BackendKind::Flex.device().unwrap();
    let model = posteriordb::load_folder(&suite.join("eight_schools-eight_schools_noncentered"), &device).unwrap();
    let names: Vec<String> = model.layout().blocks().iter().map(|b| b.name.clone()).collect();
    assert_eq!(names, ["theta_trans", "mu", "tau"]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("params.json");
    let theta = [0.3, -0.2, 1.1, 0.0, -0.7, 0.5, 0.9, -1.3];
    let (mu, tau) = (4.2, 3.1);
    std::fs::write(&file, serde_json::json!({"theta_trans": theta, "mu": mu, "tau": tau}).to_string()).unwrap();
    let result = log_prob(&model, &file, true, &device).unwrap();
    // The unconstrained point: theta_trans and mu as given, log tau.
    let mut x: Vec<f64> = theta.to_vec();
    x.extend([mu, f64::ln(tau)]);
    for (a, b) in result.unconstrained.iter().zip(&x) {
        assert!((a - b).abs() < 1e-6, "{:?} against {x:?}", result.unconstrained);
    }
    let d = x.len();
    let density = |points: &[f64]| {
        let rows = points.len() / d;
        to_vec_f64(&model.log_prob(matrix_from_vec(points.iter().map(|&v| v as f32).collect(), rows, d, &device), None))
    };
    let lp = density(&x)[0];
    assert!((result.log_prob[0] - lp).abs() < 1e-9, "{} against the model's {lp}", result.log_prob[0]);
    // Central differences of the density along every unconstrained coordinate, in one batch.
    let h = 1e-2;
    let points: Vec<f64> = (0..d)
        .flat_map(|k| {
            [h, -h].into_iter().flat_map({
                let x = x.clone();
                move |step| {
                    let mut p = x.clone();
                    p[k] += step;
                    p
                }
            })
        })
        .collect();
    let lps = density(&points);
    for k in 0..d {
        let fd = (lps[2 * k] - lps[2 * k + 1]) / (2.0 * h);
        let g = result.gradient[k];
        assert!((fd - g).abs() < 0.01 * g.abs().max(1.0), "coordinate {}: gradient {g}, differences {fd}", k + 1);
    }
    // Without the Jacobian: less log tau.
    let without = log_prob(&model, &file, false, &device).unwrap();
    assert!((result.log_prob[0] - without.log_prob[0] - f64::ln(tau)).abs() < 1e-4);
    assert!((result.gradient[d - 1] - without.gradient[d - 1] - 1.0).abs() < 1e-4);
}
