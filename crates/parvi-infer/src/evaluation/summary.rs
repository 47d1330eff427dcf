//! A posterior summary as CmdStan's `stansummary` prints it: per quantity the mean, the Monte
//! Carlo standard error of the mean, the sd, the 5%, 50% and 95% quantiles, and for MCMC chains
//! the bulk and tail effective sample sizes and R-hat (Vehtari, Gelman, Simpson, Carpenter &
//! Bürkner 2021, the estimators of Stan's `stansummary` and R's `posterior`).
//!
//! A particle set is not a Markov chain: its draws are neither independent nor autocorrelated in
//! any order, so MCSE, ESS and R-hat have no meaning there and are left out (`n/a`).

use std::fmt::Write as _;

use serde::Serialize;

use crate::InferError;
use crate::evaluation::diagnostics::{halves, rank_normalise_with_folded};
use crate::evaluation::{ess, split_rhat};

/// One quantity's line of a [`Summary`]; `None` where the statistic does not apply.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SummaryRow {
    /// The quantity's name (`lp__`, `theta[1]`).
    pub name: String,
    /// The (weighted) mean.
    pub mean: f64,
    /// Monte Carlo standard error of the mean, `sd / sqrt(ESS)` with the ESS of the split chains
    /// (MCMC only).
    pub mcse: Option<f64>,
    /// The (weighted) standard deviation.
    pub sd: f64,
    /// The 5% quantile.
    pub q5: f64,
    /// The median.
    pub q50: f64,
    /// The 95% quantile.
    pub q95: f64,
    /// Bulk ESS: of the rank-normalised split chains (MCMC only; NaN for a constant, as for
    /// MCSE, tail ESS and R-hat, as Stan prints them).
    pub ess_bulk: Option<f64>,
    /// Tail ESS: the smaller ESS of the indicators of the 5% and 95% quantiles (MCMC only).
    pub ess_tail: Option<f64>,
    /// Rank-normalised split R-hat: the larger of the rank-normalised draws' and of their folded
    /// (`|x - median|`) values' (MCMC only).
    pub rhat: Option<f64>,
}

/// A summary of draws, one [`SummaryRow`] per quantity.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    /// The rows, in the order of the quantities given.
    pub rows: Vec<SummaryRow>,
    /// Number of chains (`None` for a particle set).
    pub chains: Option<usize>,
    /// Number of draws in all.
    pub draws: usize,
    /// Whether the draws were weighted.
    pub weighted: bool,
}

impl SummaryRow {
    /// Whether the draws of the quantity were all equal (its R-hat and ESS are NaN, as Stan
    /// prints them: no warning is due).
    pub fn is_constant(&self) -> bool {
        self.rhat.is_some_and(f64::is_nan) && self.sd == 0.0
    }
}

impl Summary {
    /// The summary of `chains` MCMC chains: `columns[j]` holds every draw of quantity `names[j]`,
    /// chain after chain (equal lengths, at least 4 draws per chain).
    pub fn of_chains(names: &[String], columns: &[Vec<f64>], chains: usize) -> Result<Self, InferError> {
        let draws = check(names, columns)?;
        if chains == 0 || draws % chains != 0 || draws / chains < 4 {
            return Err(InferError::setting(
                "summary",
                format!("{draws} draws do not make {chains} chains of at least 4 draws"),
            ));
        }
        let per = draws / chains;
        let row = |name: &String, x: &Vec<f64>| {
            let split: Vec<Vec<f64>> = x.chunks(per).map(<[f64]>::to_vec).collect();
            let (mean, sd) = moments(x, None);
            let (q5, q50, q95) = (quantile7(x, 0.05), quantile7(x, 0.5), quantile7(x, 0.95));
            let finite = x.iter().all(|v| v.is_finite());
            let mcmc = |v: f64| finite.then_some(v);
            // A constant (transformed data reported as an output, say) has no Monte Carlo
            // error to estimate: NaN MCSE, ESS and R-hat, as Stan prints them.
            if x.iter().all(|v| v.to_bits() == x[0].to_bits()) {
                let nan = Some(f64::NAN);
                return SummaryRow {
                    name: name.clone(),
                    mean: x[0],
                    mcse: nan,
                    sd: 0.0,
                    q5,
                    q50,
                    q95,
                    ess_bulk: nan,
                    ess_tail: nan,
                    rhat: nan,
                };
            }
            let ess_mean = ess(&halves(&split));
            let (rhat, ess_bulk) = rank_rhat_and_bulk_ess(&split, q50);
            SummaryRow {
                name: name.clone(),
                mean,
                mcse: mcmc(sd / ess_mean.sqrt()),
                sd,
                q5,
                q50,
                q95,
                ess_bulk: mcmc(ess_bulk),
                ess_tail: mcmc(tail_ess(&split, q5, q95)),
                rhat: mcmc(rhat),
            }
        };
        // Each quantity's row on its own: the quantities shared among the cores (the ranking
        // behind R-hat and the ESS is most of a summary's time on thousands of quantities).
        let threads = std::thread::available_parallelism().map_or(1, usize::from).min(names.len()).max(1);
        let share = names.len().div_ceil(threads);
        let rows: Vec<SummaryRow> = std::thread::scope(|scope| {
            let workers: Vec<_> = names
                .chunks(share)
                .zip(columns.chunks(share))
                .map(|(names, columns)| {
                    let row = &row;
                    scope.spawn(move || names.iter().zip(columns).map(|(n, x)| row(n, x)).collect::<Vec<_>>())
                })
                .collect();
            workers.into_iter().flat_map(|w| w.join().unwrap_or_else(|e| std::panic::resume_unwind(e))).collect()
        });
        Ok(Self { rows, chains: Some(chains), draws, weighted: false })
    }

    /// The summary of a particle set (optionally weighted: non-negative, not all zero):
    /// weighted moments and quantiles, no MCSE, ESS or R-hat.
    pub fn of_particles(names: &[String], columns: &[Vec<f64>], weights: Option<&[f64]>) -> Result<Self, InferError> {
        let draws = check(names, columns)?;
        if let Some(w) = weights
            && (w.len() != draws || w.iter().any(|v| !(v.is_finite() && *v >= 0.0)) || w.iter().sum::<f64>() <= 0.0)
        {
            return Err(InferError::setting(
                "summary",
                format!("{} weights for {draws} particles, or not finite, non-negative and summing above 0", w.len()),
            ));
        }
        let rows = names
            .iter()
            .zip(columns)
            .map(|(name, x)| {
                let (mean, sd) = moments(x, weights);
                let q = |p| match weights {
                    Some(w) => weighted_quantile(x, w, p),
                    None => quantile7(x, p),
                };
                SummaryRow {
                    name: name.clone(),
                    mean,
                    mcse: None,
                    sd,
                    q5: q(0.05),
                    q50: q(0.5),
                    q95: q(0.95),
                    ess_bulk: None,
                    ess_tail: None,
                    rhat: None,
                }
            })
            .collect();
        Ok(Self { rows, chains: None, draws, weighted: weights.is_some() })
    }

    /// The table as `stansummary` prints it: a name column, then `Mean MCSE StdDev 5% 50% 95%
    /// ESS_bulk ESS_tail R_hat`, three significant digits, `n/a` where a statistic does not
    /// apply.
    pub fn table(&self) -> String {
        let width = self.rows.iter().map(|r| r.name.len()).max().unwrap_or(4).max(4) + 2;
        let mut out = String::new();
        let heads = ["Mean", "MCSE", "StdDev", "5%", "50%", "95%", "ESS_bulk", "ESS_tail", "R_hat"];
        let _ = write!(out, "{:width$}", "");
        for h in heads {
            let _ = write!(out, "{h:>10}");
        }
        out.push_str("\n\n");
        for r in &self.rows {
            let _ = write!(out, "{:width$}", r.name);
            for v in [Some(r.mean), r.mcse, Some(r.sd), Some(r.q5), Some(r.q50), Some(r.q95)] {
                let _ = write!(out, "{:>10}", v.map_or("n/a".into(), |v| significant(v, 3)));
            }
            for v in [r.ess_bulk, r.ess_tail] {
                let _ = write!(out, "{:>10}", v.map_or("n/a".into(), |v| format!("{v:.0}")));
            }
            let _ = writeln!(out, "{:>10}", r.rhat.map_or("n/a".into(), |v| format!("{v:.3}")));
        }
        out
    }

    /// The summary as CSV, `stansummary --csv_filename`'s columns: `name,Mean,MCSE,StdDev,5%,
    /// 50%,95%,ESS_bulk,ESS_tail,R_hat`, full precision, an empty field where a statistic does
    /// not apply.
    pub fn to_csv(&self) -> String {
        let mut out = String::from("name,Mean,MCSE,StdDev,5%,50%,95%,ESS_bulk,ESS_tail,R_hat\n");
        let field = |v: Option<f64>| v.map_or(String::new(), |v| if v.is_nan() { "NaN".into() } else { v.to_string() });
        for r in &self.rows {
            let fields = [
                Some(r.mean),
                r.mcse,
                Some(r.sd),
                Some(r.q5),
                Some(r.q50),
                Some(r.q95),
                r.ess_bulk,
                r.ess_tail,
                r.rhat,
            ];
            let _ = writeln!(out, "\"{}\",{}", r.name.replace('"', "\"\""), fields.map(field).join(","));
        }
        out
    }
}

/// The number of draws, after checking that every column has that many and there are names for
/// them.
fn check(names: &[String], columns: &[Vec<f64>]) -> Result<usize, InferError> {
    let draws = columns.first().map_or(0, Vec::len);
    if names.len() != columns.len() || draws == 0 || columns.iter().any(|c| c.len() != draws) {
        return Err(InferError::setting(
            "summary",
            format!(
                "{} names for {} columns of draws, which must be non-empty and equally long",
                names.len(),
                columns.len()
            ),
        ));
    }
    Ok(draws)
}

/// Mean and sd (weighted: `sum w (x - m)^2 / sum w`; unweighted: the `n - 1` estimator, as
/// `stansummary`).
fn moments(x: &[f64], weights: Option<&[f64]>) -> (f64, f64) {
    let n = x.len() as f64;
    match weights {
        Some(w) => {
            let total: f64 = w.iter().sum();
            let mean = x.iter().zip(w).map(|(x, w)| w * x).sum::<f64>() / total;
            let var = x.iter().zip(w).map(|(x, w)| w * (x - mean).powi(2)).sum::<f64>() / total;
            (mean, var.sqrt())
        }
        None => {
            let mean = x.iter().sum::<f64>() / n;
            let var = if x.len() > 1 { x.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0) } else { 0.0 };
            (mean, var.sqrt())
        }
    }
}

/// Quantile `p` by linear interpolation between order statistics (Hyndman & Fan's type 7, R's
/// and numpy's default, which `posterior` and `stansummary` use).
pub(crate) fn quantile7(x: &[f64], p: f64) -> f64 {
    // Two selections in O(n) rather than a sort: the summary asks for three quantiles of every
    // column and the polish step's stopping rule for a median at every look.
    let mut values = x.to_vec();
    let h = (values.len() - 1) as f64 * p;
    let (lo, hi) = (h.floor() as usize, h.ceil() as usize);
    let (_, &mut low, above) = values.select_nth_unstable_by(lo, f64::total_cmp);
    let high = if hi > lo { above.iter().copied().min_by(f64::total_cmp).unwrap_or(low) } else { low };
    low + (h - h.floor()) * (high - low)
}

/// Quantile `p` of a weighted set: the smallest value whose cumulative normalised weight
/// reaches `p` (the inverse of the weighted empirical CDF).
fn weighted_quantile(x: &[f64], w: &[f64], p: f64) -> f64 {
    let mut order: Vec<usize> = (0..x.len()).collect();
    order.sort_by(|&a, &b| x[a].total_cmp(&x[b]));
    let total: f64 = w.iter().sum();
    let mut cumulative = 0.0;
    for &i in &order {
        cumulative += w[i] / total;
        if cumulative >= p {
            return x[i];
        }
    }
    x[order[order.len() - 1]]
}

/// Rank-normalised split R-hat: the larger of the rank-normalised draws' split R-hat (location)
/// and that of the rank-normalised `|x - median|` (scale) (Vehtari et al. 2021, Sec. 4.2).
/// With it, the bulk ESS ([`crate::evaluation::bulk_ess`]) from the same ranking of the draws
/// (the ranking is most of the cost of both).
pub(crate) fn rank_rhat_and_bulk_ess(chains: &[Vec<f64>], median: f64) -> (f64, f64) {
    let (ranked, folded) = rank_normalise_with_folded(chains, median);
    let rhat = split_rhat(&ranked).max(split_rhat(&folded));
    (rhat, ess(&halves(&ranked)))
}

/// Tail ESS: the smaller ESS of the split chains' indicators `I(x <= q5)` and `I(x <= q95)`
/// (Vehtari et al. 2021, Sec. 4.3).
fn tail_ess(chains: &[Vec<f64>], q5: f64, q95: f64) -> f64 {
    let indicator = |q: f64| -> Vec<Vec<f64>> {
        halves(chains).iter().map(|c| c.iter().map(|&x| if x <= q { 1.0 } else { 0.0 }).collect()).collect()
    };
    ess(&indicator(q5)).min(ess(&indicator(q95)))
}

/// `v` with `digits` significant digits, in fixed notation between 1e-3 and 1e6 and in
/// scientific notation outside (as `stansummary` switches).
fn significant(v: f64, digits: usize) -> String {
    if !v.is_finite() {
        return format!("{v}");
    }
    if v == 0.0 {
        return "0".into();
    }
    let magnitude = v.abs().log10().floor();
    if !(-3.0..6.0).contains(&magnitude) {
        return format!("{v:.*e}", digits - 1);
    }
    let decimals = (digits as f64 - 1.0 - magnitude).max(0.0) as usize;
    format!("{v:.decimals$}")
}
