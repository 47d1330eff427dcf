//! Pareto-smoothed importance sampling (PSIS) and PSIS leave-one-out cross-validation
//! (PSIS-LOO; Vehtari, Gelman & Gabry 2017, "Practical Bayesian model evaluation using
//! leave-one-out cross-validation and WAIC", Statistics and Computing 27; Vehtari, Simpson,
//! Gelman, Yao & Gabry 2024, "Pareto smoothed importance sampling", JMLR 25(72)), as the R
//! `loo` package and ArviZ compute them, and `loo_compare` of two or more fits.
//!
//! From a pointwise log-likelihood matrix `log p(y_i | theta_s)` (`S` draws by `N` points):
//!
//! - the raw importance ratios of leaving point `i` out are `r_s = 1 / p(y_i | theta_s)`
//!   (VGG 2017, eq. 7);
//! - the largest `M = ceil(min(0.2 S, 3 sqrt(S / r_eff)))` of them are replaced by the expected
//!   order statistics of a generalized Pareto distribution fitted to them (VGG 2017, Sec. 2.1;
//!   the fit of Zhang & Stephens 2009 with the weakly informative prior on the shape of
//!   Vehtari et al. 2024, appendix C), and the shape `k-hat` is the point's diagnostic;
//! - the smoothed weights are truncated ([`Truncation`]) and normalised;
//! - `elpd_loo,i = log sum_s w_s p(y_i | theta_s)` (eq. 10), `elpd_loo = sum_i elpd_loo,i`, its
//!   standard error `sqrt(N) sd(elpd_loo,i)` (eq. 23), `p_loo = lppd - elpd_loo` with
//!   `lppd_i = log mean_s p(y_i | theta_s)` (eq. 15), and `looic = -2 elpd_loo`.
//!
//! `r_eff`, the relative efficiency of the draws, is the ESS of `p(y_i | theta_s)` over `S` (as
//! `loo::relative_eff(exp(log_lik), chain_id)`: split chains, Geyer's initial monotone sequence),
//! one value per point; it is 1 for a single chain or a particle set (draws that are not a
//! Markov chain).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::InferError;
use crate::evaluation::diagnostics::{ess, halves};

/// Where the smoothed weights are truncated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Truncation {
    /// At the largest raw weight, as the R `loo` package (since 2.0), ArviZ and the JMLR version
    /// of the PSIS paper (Vehtari et al. 2024, Sec. 3) do: the default, so parvi's numbers are
    /// the ones those tools print.
    #[default]
    MaxRaw,
    /// At `S^(3/4)` times the mean smoothed weight, the rule of Vehtari, Gelman & Gabry 2017
    /// (Sec. 2.1) and of `loo` 1.x (`psislw(wtrunc = 3/4)`).
    MeanWeight,
}

/// The shape `k-hat` above which the Pareto-smoothed estimate is unreliable: `min(1 - 1 /
/// log10(S), 0.7)` (Vehtari et al. 2024, Sec. 3.2.4; 0.7 from `S >= 2154` draws), as `loo` and
/// ArviZ use it.
pub fn k_threshold(draws: usize) -> f64 {
    let s = draws as f64;
    (1.0 - 1.0 / s.log10()).min(0.7)
}

/// Pareto-smoothed importance sampling of one vector of log importance ratios, in place: the
/// largest `M = ceil(min(0.2 S, 3 sqrt(S / r_eff)))` replaced by the expected order statistics
/// of the generalized Pareto distribution fitted to their exceedances over the next one
/// (ArviZ's cutoff: at least the smallest positive double), truncated by `truncation`, and
/// normalised (`logsumexp = 0`). Returns the fitted shape `k-hat`: `inf` when the tail holds
/// fewer than 5 distinct values above the cutoff (too short to fit) or a ratio is `+inf`,
/// `-inf` when every tail weight equals the cutoff (equal weights, nothing to smooth), `NaN`
/// for an empty vector.
pub fn psis_smooth(log_ratios: &mut [f64], r_eff: f64, truncation: Truncation) -> f64 {
    let s = log_ratios.len();
    if s == 0 {
        return f64::NAN;
    }
    let max = log_ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if !max.is_finite() {
        // +inf: one draw carries all the weight; -inf everywhere: no weight anywhere.
        return f64::INFINITY;
    }
    log_ratios.iter_mut().for_each(|v| *v -= max);
    let r_eff = if r_eff.is_finite() && r_eff > 0.0 { r_eff } else { 1.0 };
    let tail_len = (0.2 * s as f64).min(3.0 * (s as f64 / r_eff).sqrt()).ceil() as usize;
    let mut order: Vec<usize> = (0..s).collect();
    order.sort_by(|&a, &b| log_ratios[a].total_cmp(&log_ratios[b]));
    let k = if tail_len >= s {
        f64::INFINITY
    } else {
        let cutoff = log_ratios[order[s - tail_len - 1]].max(f64::MIN_POSITIVE.ln());
        let tail: Vec<usize> = order.iter().copied().filter(|&i| log_ratios[i] > cutoff).collect();
        if tail.is_empty() {
            f64::NEG_INFINITY
        } else if tail.len() <= 4 {
            f64::INFINITY
        } else {
            let exp_cut = cutoff.exp();
            let x: Vec<f64> = tail.iter().map(|&i| log_ratios[i].exp() - exp_cut).collect();
            let (k, sigma) = gpd_fit(&x);
            if k.is_finite() && sigma > 0.0 {
                // The expected order statistics: the GPD's quantiles at (r - 1/2) / M (VGG 2017,
                // Sec. 2.1, step 3).
                let n = tail.len();
                for (r, &i) in tail.iter().enumerate() {
                    let p = (r as f64 + 0.5) / n as f64;
                    log_ratios[i] = (sigma * gpd_quantile(p, k) + exp_cut).ln();
                }
            }
            k
        }
    };
    match truncation {
        Truncation::MaxRaw => log_ratios.iter_mut().for_each(|v| *v = v.min(0.0)),
        Truncation::MeanWeight => {
            // log(S^(3/4) mean_s w_s) = 3/4 log S - log S + logsumexp(w).
            let level = -0.25 * (s as f64).ln() + log_sum_exp(log_ratios);
            log_ratios.iter_mut().for_each(|v| *v = v.min(level));
        }
    }
    let lse = log_sum_exp(log_ratios);
    log_ratios.iter_mut().for_each(|v| *v -= lse);
    k
}

/// [`psis_smooth`] with `r_eff = 1` and truncation at the largest raw weight (ArviZ's `psislw`):
/// Pathfinder's importance weights.
pub fn psis(log_weights: &mut [f64]) -> f64 {
    psis_smooth(log_weights, 1.0, Truncation::MaxRaw)
}

/// The standard generalized Pareto quantile at `p` with unit scale and shape `k`:
/// `((1 - p)^-k - 1) / k`, or `-log(1 - p)` at `k = 0`.
fn gpd_quantile(p: f64, k: f64) -> f64 {
    if k.abs() < f64::EPSILON { -(-p).ln_1p() } else { ((-k) * (-p).ln_1p()).exp_m1() / k }
}

/// `log sum exp(v)`; `-inf` for no finite maximum below `+inf`.
pub fn log_sum_exp(v: &[f64]) -> f64 {
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if !max.is_finite() {
        return max;
    }
    max + v.iter().map(|x| (x - max).exp()).sum::<f64>().ln()
}

/// Zhang & Stephens' (2009) empirical-Bayes fit of a generalized Pareto distribution to the
/// exceedances `x` (sorted ascending, positive), with the weakly informative prior on the shape
/// (Vehtari et al. 2024, appendix C: `k <- (n k + 10 * 0.5) / (n + 10)`), as ArviZ's `_gpdfit`
/// and the `posterior` package's `gpdfit`: returns `(k, sigma)`.
pub fn gpd_fit(x: &[f64]) -> (f64, f64) {
    let n = x.len();
    let prior_bs = 3.0;
    let prior_k = 10.0;
    let m = 30 + (n as f64).sqrt() as usize;
    let quartile = x[((n as f64 / 4.0 + 0.5) as usize).max(1) - 1];
    let last = x[n - 1];
    // The grid of theta = -k / sigma values (Zhang & Stephens 2009, eq. 4 with the prior's
    // location at the first quartile).
    let b: Vec<f64> =
        (1..=m).map(|j| (1.0 - (m as f64 / (j as f64 - 0.5)).sqrt()) / (prior_bs * quartile) + 1.0 / last).collect();
    let k_of = |bj: f64| x.iter().map(|xi| (-bj * xi).ln_1p()).sum::<f64>() / n as f64;
    let ks: Vec<f64> = b.iter().map(|&bj| k_of(bj)).collect();
    // The profile log likelihood of each grid point, and its posterior weights.
    let len_scale: Vec<f64> = b.iter().zip(&ks).map(|(bj, kj)| n as f64 * ((-bj / kj).ln() - kj - 1.0)).collect();
    let mut weights: Vec<f64> =
        (0..m).map(|i| 1.0 / len_scale.iter().map(|l| (l - len_scale[i]).exp()).sum::<f64>()).collect();
    for w in weights.iter_mut() {
        // Negligible (or NaN) weights are dropped, as ArviZ's.
        if w.is_nan() || *w < 10.0 * f64::EPSILON {
            *w = 0.0;
        }
    }
    let total: f64 = weights.iter().sum();
    let b_post: f64 = b.iter().zip(&weights).map(|(bj, w)| bj * w / total).sum();
    let k_post = k_of(b_post);
    let sigma = -k_post / b_post;
    let k_post = (n as f64 * k_post + prior_k * 0.5) / (n as f64 + prior_k);
    (k_post, sigma)
}

/// One data point's PSIS-LOO terms.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LooPoint {
    /// `elpd_loo,i = log sum_s w_s p(y_i | theta_s)`.
    pub elpd_loo: f64,
    /// `p_loo,i = lppd_i - elpd_loo,i`.
    pub p_loo: f64,
    /// `looic_i = -2 elpd_loo,i`.
    pub looic: f64,
    /// `lppd_i = log mean_s p(y_i | theta_s)`, the within-sample fit.
    pub lppd: f64,
    /// The Pareto shape of the point's importance ratios.
    pub pareto_k: f64,
    /// The draws' relative efficiency for this point.
    pub r_eff: f64,
    /// The effective sample size of the smoothed weights, `r_eff / sum_s w_s^2`.
    pub n_eff: f64,
}

/// PSIS-LOO of one fit: the estimates with their standard errors, every point's terms, and the
/// warnings. `Display` prints it as R's `print(loo)`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Loo {
    /// `elpd_loo`, the estimated expected log pointwise predictive density for new data.
    pub elpd_loo: f64,
    /// Its standard error, `sqrt(N) sd(elpd_loo,i)` (the sample sd, as `loo`; ArviZ's `se` uses
    /// the population sd, `sqrt((N - 1) / N)` times this).
    pub se_elpd_loo: f64,
    /// The effective number of parameters, `lppd - elpd_loo`.
    pub p_loo: f64,
    /// Its standard error.
    pub se_p_loo: f64,
    /// `-2 elpd_loo`.
    pub looic: f64,
    /// `2 se_elpd_loo`.
    pub se_looic: f64,
    /// Draws `S` (all chains).
    pub draws: usize,
    /// Data points `N`.
    pub points: usize,
    /// Chains the draws came from (1 for a particle set).
    pub chains: usize,
    /// The truncation used.
    pub truncation: Truncation,
    /// The k-hat threshold for these `S` ([`k_threshold`]).
    pub k_threshold: f64,
    /// Every point's terms, in the log-likelihood's column order.
    pub pointwise: Vec<LooPoint>,
    /// What a reader must know: the points whose k-hat is above the threshold, by name.
    pub warnings: Vec<String>,
}

impl Loo {
    /// The 0-based indices of the points whose k-hat is above [`Loo::k_threshold`] (or not
    /// finite).
    pub fn bad_points(&self) -> Vec<usize> {
        self.pointwise
            .iter()
            .enumerate()
            .filter(|(_, p)| p.pareto_k > self.k_threshold || p.pareto_k.is_nan())
            .map(|(i, _)| i)
            .collect()
    }
}

/// PSIS-LOO from `log_lik`, the pointwise log-likelihood of `draws x points` values stored
/// draw-major in the layout of an MCMC engine's draws (`FitResult::draws`): draw `s` of chain
/// `c` at row `s * chains + c`, column `i` the point `i`. `chains = 1` for a particle set or a
/// single chain (`r_eff = 1`). Truncation at the largest raw weight ([`Truncation::MaxRaw`]).
pub fn loo(log_lik: &[f64], points: usize, chains: usize) -> Result<Loo, InferError> {
    loo_with(log_lik, points, chains, Truncation::MaxRaw)
}

/// [`loo`] with the truncation rule of one's choice.
pub fn loo_with(log_lik: &[f64], points: usize, chains: usize, truncation: Truncation) -> Result<Loo, InferError> {
    if points == 0 {
        return Err(InferError::setting("log_lik", "no data points (0 columns)"));
    }
    if chains == 0 {
        return Err(InferError::setting("chains", "need at least one chain, got 0"));
    }
    if !log_lik.len().is_multiple_of(points * chains) {
        return Err(InferError::setting(
            "log_lik",
            format!("{} values do not fill rows of {points} points in {chains} chains", log_lik.len()),
        ));
    }
    let s = log_lik.len() / points;
    if s < 2 {
        return Err(InferError::setting("log_lik", format!("need at least 2 draws, got {s}")));
    }
    if let Some(at) = log_lik.iter().position(|v| v.is_nan() || *v == f64::INFINITY) {
        return Err(InferError::setting(
            "log_lik",
            format!(
                "log_lik[{}] of draw {} is {} (a log-likelihood must be finite or -inf)",
                at % points + 1,
                at / points + 1,
                log_lik[at]
            ),
        ));
    }
    let per_chain = s / chains;
    let mut pointwise = Vec::with_capacity(points);
    for i in 0..points {
        let ll: Vec<f64> = (0..s).map(|r| log_lik[r * points + i]).collect();
        let r_eff = relative_eff(&ll, chains, per_chain);
        let mut lw: Vec<f64> = ll.iter().map(|v| -v).collect();
        let pareto_k = psis_smooth(&mut lw, r_eff, truncation);
        let weighted: Vec<f64> = lw.iter().zip(&ll).map(|(w, l)| w + l).collect();
        let elpd = log_sum_exp(&weighted);
        let lppd = log_sum_exp(&ll) - (s as f64).ln();
        let n_eff = r_eff / lw.iter().map(|w| (2.0 * w).exp()).sum::<f64>();
        pointwise.push(LooPoint {
            elpd_loo: elpd,
            p_loo: lppd - elpd,
            looic: -2.0 * elpd,
            lppd,
            pareto_k,
            r_eff,
            n_eff,
        });
    }
    let column = |f: fn(&LooPoint) -> f64| pointwise.iter().map(f).collect::<Vec<f64>>();
    let (elpd_loo, se_elpd_loo) = total_and_se(&column(|p| p.elpd_loo));
    let (p_loo, se_p_loo) = total_and_se(&column(|p| p.p_loo));
    let mut out = Loo {
        elpd_loo,
        se_elpd_loo,
        p_loo,
        se_p_loo,
        looic: -2.0 * elpd_loo,
        se_looic: 2.0 * se_elpd_loo,
        draws: s,
        points,
        chains,
        truncation,
        k_threshold: k_threshold(s),
        pointwise,
        warnings: vec![],
    };
    let bad = out.bad_points();
    if !bad.is_empty() {
        let shown: Vec<String> = bad
            .iter()
            .take(20)
            .map(|&i| format!("log_lik[{}] (k-hat {:.2})", i + 1, out.pointwise[i].pareto_k))
            .collect();
        let more = if bad.len() > 20 { format!(" and {} more", bad.len() - 20) } else { String::new() };
        out.warnings.push(format!(
            "{} of {} points have Pareto k-hat above {:.2}: {}{more}; their importance-sampling estimates are unreliable (the posterior without each of them differs much from the full posterior: refit without them, i.e. exact LOO, or use K-fold cross-validation)",
            bad.len(),
            points,
            out.k_threshold,
            shown.join(", ")
        ));
    }
    Ok(out)
}

/// `r_eff` of one point: the ESS of `p(y_i | theta_s)` over the draws (split chains, as
/// `posterior::ess_mean`), over `S`; 1 for a single chain or too short chains.
fn relative_eff(ll: &[f64], chains: usize, per_chain: usize) -> f64 {
    if chains < 2 || per_chain < 4 {
        return 1.0;
    }
    let max = ll.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if !max.is_finite() {
        return 1.0;
    }
    // exp(ll - max): the ESS is invariant to the scale, and this cannot overflow.
    let series: Vec<Vec<f64>> =
        (0..chains).map(|c| (0..per_chain).map(|t| (ll[t * chains + c] - max).exp()).collect()).collect();
    let e = ess(&halves(&series)) / ll.len() as f64;
    if e.is_finite() && e > 0.0 { e } else { 1.0 }
}

/// `(sum x, sqrt(n) sd(x))` with the sample sd.
fn total_and_se(x: &[f64]) -> (f64, f64) {
    let n = x.len() as f64;
    let total: f64 = x.iter().sum();
    if x.len() < 2 {
        return (total, f64::NAN);
    }
    let mean = total / n;
    let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (total, (n * var).sqrt())
}

impl fmt::Display for Loo {
    /// As R's `print(loo)`: the estimates table, then the Pareto k summary.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "Computed from {} by {} log-likelihood matrix.", self.draws, self.points)?;
        writeln!(f)?;
        writeln!(f, "         Estimate    SE")?;
        writeln!(f, "elpd_loo {:>8.1} {:>5.1}", self.elpd_loo, self.se_elpd_loo)?;
        writeln!(f, "p_loo    {:>8.1} {:>5.1}", self.p_loo, self.se_p_loo)?;
        writeln!(f, "looic    {:>8.1} {:>5.1}", self.looic, self.se_looic)?;
        writeln!(f, "------")?;
        let (lo, hi) = self
            .pointwise
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), p| (lo.min(p.r_eff), hi.max(p.r_eff)));
        if self.chains > 1 {
            writeln!(f, "MCSE and ESS estimates assume MCMC draws (r_eff in [{lo:.1}, {hi:.1}]).")?;
        } else {
            writeln!(f, "MCSE and ESS estimates assume independent draws (r_eff = 1).")?;
        }
        writeln!(f)?;
        let bad = self.bad_points();
        let t = self.k_threshold;
        if bad.is_empty() {
            writeln!(f, "All Pareto k estimates are good (k < {t:.2}).")?;
        } else {
            writeln!(f, "Pareto k diagnostic values:")?;
            writeln!(f, "                         Count Pct.    Min. ESS")?;
            let n = self.points as f64;
            // The bins of R's table: good (k <= t), bad (t < k <= 1), very bad (k > 1 or NaN).
            let bin_of = |k: f64| {
                if k <= t {
                    0
                } else if k <= 1.0 {
                    1
                } else {
                    2
                }
            };
            let labels = ["good", "bad", "very bad"];
            let ranges = [format!("(-Inf, {t:.2}]"), format!("   ({t:.2}, 1]"), "   (1, Inf)".to_string()];
            for (bin, (label, range)) in labels.iter().zip(&ranges).enumerate() {
                let inside: Vec<&LooPoint> = self.pointwise.iter().filter(|p| bin_of(p.pareto_k) == bin).collect();
                let min_ess = inside.iter().map(|p| p.n_eff).fold(f64::INFINITY, f64::min);
                let ess =
                    if inside.is_empty() || *label == "very bad" { "--".to_string() } else { format!("{min_ess:.0}") };
                writeln!(
                    f,
                    "{range:<14} ({label:<8}) {:>5} {:>5.1}%  {ess:>6}",
                    inside.len(),
                    100.0 * inside.len() as f64 / n
                )?;
            }
            for w in &self.warnings {
                writeln!(f, "warning: {w}")?;
            }
        }
        Ok(())
    }
}

/// One row of [`LooCompare`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LooCompareRow {
    /// The model's name as given.
    pub model: String,
    /// `elpd_loo` of this model minus the best one's (0 for the best, negative for the others).
    pub elpd_diff: f64,
    /// `sqrt(N) sd(elpd_loo,i(this) - elpd_loo,i(best))` over the points (0 for the best).
    pub se_diff: f64,
    /// This model's `elpd_loo`.
    pub elpd_loo: f64,
    /// Its standard error.
    pub se_elpd_loo: f64,
    /// Its `p_loo`.
    pub p_loo: f64,
    /// Its `looic`.
    pub looic: f64,
}

/// `loo_compare` of two or more fits on the same data points: best first (highest `elpd_loo`),
/// as the R `loo` package orders them. `Display` prints R's table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LooCompare {
    /// The models, best first.
    pub rows: Vec<LooCompareRow>,
}

/// Compares fits by their PSIS-LOO: `elpd_diff` and `se_diff` of each against the best, from
/// the pointwise differences (VGG 2017, eq. 24). An error names the model whose point count
/// differs, or says that fewer than two were given.
pub fn loo_compare(models: &[(&str, &Loo)]) -> Result<LooCompare, InferError> {
    if models.len() < 2 {
        return Err(InferError::setting(
            "models",
            format!("loo_compare needs at least two fits, got {}", models.len()),
        ));
    }
    let n = models[0].1.points;
    if let Some((name, l)) = models.iter().find(|(_, l)| l.points != n) {
        return Err(InferError::setting(
            "models",
            format!(
                "fit `{name}` has {} data points, `{}` has {n}: LOO compares fits on the same points",
                l.points, models[0].0
            ),
        ));
    }
    let mut order: Vec<usize> = (0..models.len()).collect();
    order.sort_by(|&a, &b| models[b].1.elpd_loo.total_cmp(&models[a].1.elpd_loo));
    let best = models[order[0]].1;
    let rows = order
        .iter()
        .map(|&j| {
            let (name, l) = models[j];
            let diffs: Vec<f64> =
                l.pointwise.iter().zip(&best.pointwise).map(|(p, b)| p.elpd_loo - b.elpd_loo).collect();
            let (elpd_diff, se_diff) = if j == order[0] { (0.0, 0.0) } else { total_and_se(&diffs) };
            LooCompareRow {
                model: name.to_string(),
                elpd_diff,
                se_diff,
                elpd_loo: l.elpd_loo,
                se_elpd_loo: l.se_elpd_loo,
                p_loo: l.p_loo,
                looic: l.looic,
            }
        })
        .collect();
    Ok(LooCompare { rows })
}

impl fmt::Display for LooCompare {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = self.rows.iter().map(|r| r.model.len()).max().unwrap_or(5).max(5);
        writeln!(f, "{:<width$} elpd_diff se_diff elpd_loo se_elpd_loo p_loo  looic", "model")?;
        for r in &self.rows {
            writeln!(
                f,
                "{:<width$} {:>9.1} {:>7.1} {:>8.1} {:>11.1} {:>5.1} {:>6.1}",
                r.model, r.elpd_diff, r.se_diff, r.elpd_loo, r.se_elpd_loo, r.p_loo, r.looic
            )?;
        }
        Ok(())
    }
}
