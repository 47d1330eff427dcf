//! PSIS-LOO (Vehtari, Gelman & Gabry 2017): parvi's against an independent implementation of the
//! paper's algorithm written here in plain f64 code (random log-likelihood matrices, one chain
//! and several); against the exact leave-one-out predictive density of a conjugate normal model;
//! a far outlier's k-hat above 0.7, named in the warning; `loo_compare`'s order and differences;
//! bad input refused by name.

use std::fmt::Write as _;

use parvi_infer::EngineRng;
use parvi_infer::evaluation::{Truncation, loo, loo_compare, loo_with, psis_smooth};

// ---------------------------------------------------------------------------------------------
// The independent implementation: the paper's steps, written from VGG 2017 Sec. 2.1 and Zhang &
// Stephens (2009), with the weakly informative prior of Vehtari et al. 2024 (appendix C).
// ---------------------------------------------------------------------------------------------

fn lse(v: &[f64]) -> f64 {
    let m = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    m + v.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
}

/// Zhang & Stephens' estimate: grid `theta_j = 1 / x_(n) + (1 - sqrt(m / (j - 1/2))) / (3
/// x_(q))`, profile likelihood `l(theta) = n (log(theta / k) + k - 1)` with `k(theta) = -mean
/// log(1 - theta x)`, posterior mean of theta by softmax weights; `xi = -k(theta_hat)` is the
/// shape, `sigma = -xi / theta_hat`; the prior pulls `xi` to 0.5 with weight 10.
fn reference_gpd(x: &[f64]) -> (f64, f64) {
    let n = x.len() as f64;
    let m = 30 + n.sqrt().floor() as usize;
    let xq = x[(n / 4.0 + 0.5).floor() as usize - 1];
    let xn = x[x.len() - 1];
    let k_zs = |theta: f64| -x.iter().map(|v| (1.0 - theta * v).ln()).sum::<f64>() / n;
    let thetas: Vec<f64> =
        (1..=m).map(|j| 1.0 / xn + (1.0 - (m as f64 / (j as f64 - 0.5)).sqrt()) / (3.0 * xq)).collect();
    let l: Vec<f64> = thetas.iter().map(|&t| n * ((t / k_zs(t)).ln() + k_zs(t) - 1.0)).collect();
    let norm = lse(&l);
    let theta_hat: f64 = thetas.iter().zip(&l).map(|(t, li)| t * (li - norm).exp()).sum();
    let xi = -k_zs(theta_hat);
    // theta = -xi / sigma (Zhang & Stephens' parameterisation, their k = -xi).
    let sigma = -xi / theta_hat;
    ((n * xi + 10.0 * 0.5) / (n + 10.0), sigma)
}

/// PSIS of one column of log ratios: normalised smoothed log weights and k-hat.
fn reference_psis(log_ratios: &[f64], r_eff: f64, mean_truncation: bool) -> (Vec<f64>, f64) {
    let s = log_ratios.len();
    let m = (0.2 * s as f64).min(3.0 * (s as f64 / r_eff).sqrt()).ceil() as usize;
    let top = log_ratios.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let mut lw: Vec<f64> = log_ratios.iter().map(|v| v - top).collect();
    let mut idx: Vec<usize> = (0..s).collect();
    idx.sort_by(|&a, &b| lw[a].partial_cmp(&lw[b]).unwrap());
    let tail = &idx[s - m..];
    let cutoff = lw[idx[s - m - 1]];
    let x: Vec<f64> = tail.iter().map(|&i| lw[i].exp() - cutoff.exp()).collect();
    let (k, sigma) = reference_gpd(&x);
    for (r, &i) in tail.iter().enumerate() {
        let p = (r as f64 + 0.5) / m as f64;
        let q = sigma * ((1.0 - p).powf(-k) - 1.0) / k;
        lw[i] = (cutoff.exp() + q).ln();
    }
    let cap = if mean_truncation { 0.75 * (s as f64).ln() + lse(&lw) - (s as f64).ln() } else { 0.0 };
    for v in lw.iter_mut() {
        *v = v.min(cap);
    }
    let norm = lse(&lw);
    (lw.iter().map(|v| v - norm).collect(), k)
}

/// ESS of `chains` series by Geyer's initial monotone sequence over the split chains (Vehtari et
/// al. 2021, eqs. 10-11), the basic estimator `loo::relative_eff` uses.
fn reference_ess(chains: &[Vec<f64>]) -> f64 {
    let half = chains[0].len() / 2;
    let split: Vec<Vec<f64>> = chains.iter().flat_map(|c| [c[..half].to_vec(), c[c.len() - half..].to_vec()]).collect();
    let (m, n) = (split.len() as f64, half as f64);
    let means: Vec<f64> = split.iter().map(|c| c.iter().sum::<f64>() / n).collect();
    let vars: Vec<f64> =
        split.iter().zip(&means).map(|(c, mu)| c.iter().map(|v| (v - mu).powi(2)).sum::<f64>() / (n - 1.0)).collect();
    let w = vars.iter().sum::<f64>() / m;
    let grand = means.iter().sum::<f64>() / m;
    let b_over_n = means.iter().map(|mu| (mu - grand).powi(2)).sum::<f64>() / (m - 1.0);
    let var_plus = (n - 1.0) / n * w + b_over_n;
    let acov = |t: usize| -> f64 {
        split
            .iter()
            .zip(&means)
            .map(|(c, mu)| (0..half - t).map(|i| (c[i] - mu) * (c[i + t] - mu)).sum::<f64>() / n)
            .sum::<f64>()
            / m
    };
    let rho = |t: usize| 1.0 - (w - acov(t)) / var_plus;
    let mut pairs = vec![];
    let mut t = 0;
    while t + 1 < half {
        // rho(0) = 1 exactly, as Stan's estimator takes it.
        let p = if t == 0 { 1.0 + rho(1) } else { rho(t) + rho(t + 1) };
        if p <= 0.0 {
            break;
        }
        pairs.push(p);
        t += 2;
    }
    for i in 1..pairs.len() {
        pairs[i] = pairs[i].min(pairs[i - 1]);
    }
    let tau = (-1.0 + 2.0 * pairs.iter().sum::<f64>()).max(1.0 / (m * n).log10());
    m * n / tau
}

struct Reference {
    elpd: f64,
    p_loo: f64,
    se: f64,
    k: Vec<f64>,
}

/// PSIS-LOO by the paper's formulas; rows `s * chains + c`.
fn reference_loo(ll: &[f64], points: usize, chains: usize, mean_truncation: bool) -> Reference {
    let s = ll.len() / points;
    let mut elpd_i = vec![];
    let mut p_i = vec![];
    let mut k = vec![];
    for i in 0..points {
        let col: Vec<f64> = (0..s).map(|r| ll[r * points + i]).collect();
        let r_eff = if chains == 1 {
            1.0
        } else {
            let top = col.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let series: Vec<Vec<f64>> =
                (0..chains).map(|c| (0..s / chains).map(|t| (col[t * chains + c] - top).exp()).collect()).collect();
            reference_ess(&series) / s as f64
        };
        let neg: Vec<f64> = col.iter().map(|v| -v).collect();
        let (lw, ki) = reference_psis(&neg, r_eff, mean_truncation);
        let e = lse(&lw.iter().zip(&col).map(|(a, b)| a + b).collect::<Vec<_>>());
        elpd_i.push(e);
        p_i.push(lse(&col) - (s as f64).ln() - e);
        k.push(ki);
    }
    let n = points as f64;
    let mean = elpd_i.iter().sum::<f64>() / n;
    let sd = (elpd_i.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
    Reference { elpd: elpd_i.iter().sum(), p_loo: p_i.iter().sum(), se: n.sqrt() * sd, k }
}

// ---------------------------------------------------------------------------------------------

fn log_normal_pdf(y: f64, mean: f64, var: f64) -> f64 {
    -0.5 * (2.0 * std::f64::consts::PI * var).ln() - 0.5 * (y - mean).powi(2) / var
}

/// A log-likelihood matrix of a normal model with uncertain location and scale: `chains` AR(1)
/// chains of `(mu, log sigma)` with autocorrelation `phi`, `points` data points spread over
/// `[-4, 4]` so the k-hats range from small to large.
fn random_log_lik(draws: usize, points: usize, chains: usize, phi: f64, seed: u64) -> Vec<f64> {
    let mut rng = EngineRng::new(seed);
    let ys: Vec<f64> = (0..points).map(|i| -4.0 + 8.0 * i as f64 / (points - 1) as f64 + 0.3 * rng.normal()).collect();
    let mut state: Vec<(f64, f64)> = (0..chains).map(|_| (rng.normal(), rng.normal())).collect();
    let mut out = Vec::with_capacity(draws * points);
    for _ in 0..draws / chains {
        for st in state.iter_mut() {
            let c = (1.0 - phi * phi).sqrt();
            *st = (phi * st.0 + c * rng.normal(), phi * st.1 + c * rng.normal());
            let (mu, log_sigma) = (0.15 * st.0, 0.1 * st.1);
            for &y in &ys {
                out.push(log_normal_pdf(y, mu, (2.0 * log_sigma).exp()));
            }
        }
    }
    out
}

#[test]
fn agrees_with_an_independent_implementation_of_the_paper() {
    // One chain (r_eff = 1), several autocorrelated chains (r_eff from the ESS of exp(log_lik)),
    // and the 2017 paper's truncation at S^(3/4) times the mean weight.
    for (chains, phi, seed, truncation) in [
        (1, 0.0, 1, Truncation::MaxRaw),
        (4, 0.7, 2, Truncation::MaxRaw),
        (1, 0.0, 3, Truncation::MeanWeight),
        (4, 0.5, 4, Truncation::MeanWeight),
    ] {
        let (draws, points) = (2000, 25);
        let ll = random_log_lik(draws, points, chains, phi, seed);
        let got = loo_with(&ll, points, chains, truncation).unwrap();
        let want = reference_loo(&ll, points, chains, truncation == Truncation::MeanWeight);
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-8 * (1.0 + b.abs());
        assert!(close(got.elpd_loo, want.elpd), "{chains} chains: elpd_loo {} vs {}", got.elpd_loo, want.elpd);
        assert!(close(got.p_loo, want.p_loo), "{chains} chains: p_loo {} vs {}", got.p_loo, want.p_loo);
        assert!(close(got.se_elpd_loo, want.se), "{chains} chains: se {} vs {}", got.se_elpd_loo, want.se);
        for (i, (p, k)) in got.pointwise.iter().zip(&want.k).enumerate() {
            assert!(close(p.pareto_k, *k), "{chains} chains, point {i}: k-hat {} vs {k}", p.pareto_k);
        }
        // The matrix exercises the smoothing: some points with a heavy tail, some without.
        let ks: Vec<f64> = got.pointwise.iter().map(|p| p.pareto_k).collect();
        assert!(ks.iter().any(|&k| k > 0.5) && ks.iter().any(|&k| k < 0.3), "{ks:?}");
        if chains > 1 {
            assert!(got.pointwise.iter().all(|p| p.r_eff < 0.9), "autocorrelated chains must have r_eff < 1");
        }
    }
}

#[test]
fn psis_smooth_replaces_only_the_tail_and_normalises() {
    let mut rng = EngineRng::new(7);
    let raw: Vec<f64> = (0..1000).map(|_| 1.5 * rng.normal()).collect();
    let mut lw = raw.clone();
    let k = psis_smooth(&mut lw, 1.0, Truncation::MaxRaw);
    assert!(k.is_finite());
    let total: f64 = lw.iter().map(|v| v.exp()).sum();
    assert!((total - 1.0).abs() < 1e-12, "{total}");
    // M = ceil(min(200, 3 sqrt(1000))) = 95 values change; the body keeps its ratios.
    let mut order: Vec<usize> = (0..1000).collect();
    order.sort_by(|&a, &b| raw[a].total_cmp(&raw[b]));
    // The normalisation's shift, read off the smallest ratio (in the body).
    let shift = lw[order[0]] - raw[order[0]];
    let changed = (0..1000).filter(|&i| (lw[i] - raw[i] - shift).abs() > 1e-9).count();
    assert!(changed <= 95 && changed > 50, "{changed} changed");
    for &i in &order[..1000 - 95] {
        assert!((lw[i] - raw[i] - shift).abs() < 1e-9);
    }
}

/// `y_i ~ N(mu, 1)`, `mu ~ N(0, 10^2)`: the posterior of mu without point `i` is normal, and the
/// exact LOO predictive density of `y_i` is `N(y_i | m_-i, 1 + v_-i)`.
struct Conjugate {
    y: Vec<f64>,
}

impl Conjugate {
    const PRIOR_VAR: f64 = 100.0;

    fn posterior(&self, leave_out: Option<usize>) -> (f64, f64) {
        let (sum, n) = self
            .y
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != leave_out)
            .fold((0.0, 0.0), |(s, n), (_, y)| (s + y, n + 1.0));
        let precision = 1.0 / Self::PRIOR_VAR + n;
        (sum / precision, 1.0 / precision)
    }

    /// `S` exact posterior draws of mu in `chains` chains (independent) and their log-lik matrix.
    fn draws(&self, s: usize, seed: u64) -> (Vec<f64>, Vec<f64>) {
        let (m, v) = self.posterior(None);
        let mut rng = EngineRng::new(seed);
        let mu: Vec<f64> = (0..s).map(|_| m + v.sqrt() * rng.normal()).collect();
        let ll = mu.iter().flat_map(|&mu| self.y.iter().map(move |&y| log_normal_pdf(y, mu, 1.0))).collect();
        (mu, ll)
    }

    fn exact_elpd(&self) -> Vec<f64> {
        (0..self.y.len())
            .map(|i| {
                let (m, v) = self.posterior(Some(i));
                log_normal_pdf(self.y[i], m, 1.0 + v)
            })
            .collect()
    }

    /// The Monte Carlo sd of plain importance-sampling LOO at point `i` with `S` draws: the
    /// estimate is `-log mean_s 1/p(y_i | mu_s)`, and by the delta method its variance is
    /// `(E[r^2] / E[r]^2 - 1) / S` with `r = 1 / p(y_i | mu) = sqrt(2 pi) exp((y_i - mu)^2 / 2)`.
    /// With `mu ~ N(m, v)`, `E[exp(a (y - mu)^2)] = (1 - 2 a v)^-1/2 exp(a d^2 / (1 - 2 a v))`,
    /// `d = y - m` (needs `2 v < 1`).
    fn mc_sd(&self, i: usize, s: usize) -> f64 {
        let (m, v) = self.posterior(None);
        let d = self.y[i] - m;
        let moment = |a: f64| (1.0 - 2.0 * a * v).powf(-0.5) * (a * d * d / (1.0 - 2.0 * a * v)).exp();
        // E[r^2] / E[r]^2 with the sqrt(2 pi) factors cancelling: moment(1) / moment(1/2)^2.
        ((moment(1.0) / moment(0.5).powi(2) - 1.0) / s as f64).sqrt()
    }
}

fn data(n: usize, seed: u64) -> Vec<f64> {
    let mut rng = EngineRng::new(seed);
    (0..n).map(|_| 1.0 + rng.normal()).collect()
}

#[test]
fn conjugate_normal_matches_the_exact_leave_one_out_density() {
    let model = Conjugate { y: data(20, 11) };
    let (s, chains) = (4000, 4);
    let (mu, ll) = model.draws(s, 12);
    let got = loo(&ll, model.y.len(), chains).unwrap();
    let exact = model.exact_elpd();
    let exact_total: f64 = exact.iter().sum();
    // Monte Carlo error: the points' errors share the draws, so they may be correlated; their sd
    // is at most the sum of the points' sds. Four of those; the smoothing's bias is far smaller.
    let sd: f64 = (0..model.y.len()).map(|i| model.mc_sd(i, s)).sum();
    // (p_loo, the gap between the exact LOO and the full posterior's fit, is about 1: a
    // tolerance well below it catches an estimator that ignores the leaving out.)
    assert!(sd < 0.1, "the test's tolerance is too loose to catch anything: {sd}");
    assert!(
        (got.elpd_loo - exact_total).abs() < 4.0 * sd,
        "elpd_loo {} vs exact {exact_total} (tolerance {})",
        got.elpd_loo,
        4.0 * sd
    );
    for (i, (p, e)) in got.pointwise.iter().zip(&exact).enumerate() {
        assert!((p.elpd_loo - e).abs() < 4.0 * model.mc_sd(i, s) + 1e-3, "point {i}: {} vs {e}", p.elpd_loo);
    }
    // One parameter: p_loo near 1 (exactly: lppd - elpd with the full posterior's predictive).
    let (m, v) = model.posterior(None);
    let lppd: f64 = model.y.iter().map(|&y| log_normal_pdf(y, m, 1.0 + v)).sum();
    assert!(
        (got.p_loo - (lppd - exact_total)).abs() < 4.0 * sd + 0.02,
        "p_loo {} vs {}",
        got.p_loo,
        lppd - exact_total
    );
    assert!(got.warnings.is_empty(), "{:?}", got.warnings);
    assert!(got.pointwise.iter().all(|p| p.pareto_k < 0.5));
    println!("{got}");
    // For scripts/loo_check.py: the draws in CmdStan's CSV format (4 chains of 1000, one after
    // the other), when asked for.
    if let Ok(path) = std::env::var("PARVI_LOO_CSV") {
        write_cmdstan_csv(&path, &mu, &ll, &model.y, chains);
        println!(
            "parvi: elpd_loo {:.4} se {:.4} p_loo {:.4}  (exact elpd_loo {exact_total:.4})",
            got.elpd_loo, got.se_elpd_loo, got.p_loo
        );
    }
}

/// CmdStan's CSV: `lp__, mu, log_lik.1..N`, chain after chain (draw `s` of chain `c` is row
/// `s * chains + c` of `mu` and `ll`).
fn write_cmdstan_csv(path: &str, mu: &[f64], ll: &[f64], y: &[f64], chains: usize) {
    let n = y.len();
    let per = mu.len() / chains;
    let mut out = String::from("# model = conjugate_normal (parvi-infer tests/loo.rs)\n");
    let header: Vec<String> =
        ["lp__".to_string(), "mu".to_string()].into_iter().chain((1..=n).map(|i| format!("log_lik.{i}"))).collect();
    out.push_str(&header.join(","));
    out.push('\n');
    for c in 0..chains {
        for t in 0..per {
            let r = t * chains + c;
            let row = &ll[r * n..(r + 1) * n];
            let lp = row.iter().sum::<f64>() + log_normal_pdf(mu[r], 0.0, Conjugate::PRIOR_VAR);
            let _ = write!(out, "{lp},{}", mu[r]);
            for v in row {
                let _ = write!(out, ",{v}");
            }
            out.push('\n');
        }
    }
    std::fs::write(path, out).unwrap();
}

#[test]
fn a_far_outlier_has_a_large_k_hat_and_is_named() {
    let mut y = data(20, 21);
    y[6] = 25.0;
    let model = Conjugate { y };
    let (_, ll) = model.draws(4000, 22);
    let got = loo(&ll, 20, 1).unwrap();
    let k = got.pointwise[6].pareto_k;
    assert!(k > 0.7, "the outlier's k-hat {k}");
    assert_eq!(got.bad_points(), vec![6]);
    assert_eq!(got.warnings.len(), 1);
    assert!(got.warnings[0].contains("log_lik[7]"), "{}", got.warnings[0]);
    let printed = got.to_string();
    assert!(printed.contains("Pareto k diagnostic values"), "{printed}");
    // Every other point is fine.
    assert!(got.pointwise.iter().enumerate().all(|(i, p)| i == 6 || p.pareto_k < 0.7));
}

#[test]
fn loo_compare_orders_by_elpd_and_uses_pointwise_differences() {
    // The same draws scored by the right model and by one whose noise sd is 2: the right one is
    // better, and the difference's se is sqrt(N) sd of the pointwise differences.
    let model = Conjugate { y: data(30, 31) };
    let (mu, good) = model.draws(2000, 32);
    let bad: Vec<f64> = mu.iter().flat_map(|&m| model.y.iter().map(move |&y| log_normal_pdf(y, m, 4.0))).collect();
    let a = loo(&good, 30, 1).unwrap();
    let b = loo(&bad, 30, 1).unwrap();
    let cmp = loo_compare(&[("wide", &b), ("right", &a)]).unwrap();
    assert_eq!(cmp.rows[0].model, "right");
    assert_eq!((cmp.rows[0].elpd_diff, cmp.rows[0].se_diff), (0.0, 0.0));
    let diffs: Vec<f64> = b.pointwise.iter().zip(&a.pointwise).map(|(x, y)| x.elpd_loo - y.elpd_loo).collect();
    let mean = diffs.iter().sum::<f64>() / 30.0;
    let se = (30.0 * diffs.iter().map(|d| (d - mean).powi(2)).sum::<f64>() / 29.0).sqrt();
    assert!((cmp.rows[1].elpd_diff - (b.elpd_loo - a.elpd_loo)).abs() < 1e-9);
    assert!(cmp.rows[1].elpd_diff < 0.0);
    assert!((cmp.rows[1].se_diff - se).abs() < 1e-9);
    assert!(cmp.to_string().contains("right"));
    // Fewer than two fits, or fits on different points: errors that say so.
    assert!(loo_compare(&[("right", &a)]).unwrap_err().to_string().contains("at least two"));
    let other = loo(&good[..2000 * 30], 15, 1).unwrap();
    let err = loo_compare(&[("right", &a), ("half", &other)]).unwrap_err().to_string();
    assert!(err.contains("half") && err.contains("15"), "{err}");
}

#[test]
fn bad_log_lik_is_refused_by_name() {
    assert!(loo(&[0.0; 10], 0, 1).unwrap_err().to_string().contains("log_lik"));
    assert!(loo(&[0.0; 10], 3, 1).unwrap_err().to_string().contains("log_lik"));
    let mut ll = vec![-1.0; 40];
    ll[13] = f64::NAN;
    let err = loo(&ll, 4, 1).unwrap_err().to_string();
    assert!(err.contains("log_lik[2]") && err.contains("draw 4"), "{err}");
    assert!(loo(&[-1.0; 40], 4, 0).unwrap_err().to_string().contains("chains"));
}
