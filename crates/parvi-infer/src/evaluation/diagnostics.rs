//! MCMC diagnostics of a multi-chain trace: effective sample size (autocorrelations with Geyer's
//! initial positive and monotone sequence, pooled over chains as in Stan / Vehtari et al. 2021)
//! and split R-hat. Host-side: a trace is read once, after the run.

use serde::Serialize;

use crate::InferError;

/// A host copy of a trace: `snapshots` draws of `chains` chains in `dim` dimensions, stored
/// snapshot-major (`values[(s * chains + c) * dim + j]`), the layout of an MCMC engine's draws.
#[derive(Clone, Debug)]
pub struct TraceView<'a> {
    /// The draws, snapshot-major.
    pub values: &'a [f32],
    /// Draws per chain.
    pub snapshots: usize,
    /// Number of chains.
    pub chains: usize,
    /// Dimension of a draw.
    pub dim: usize,
}

impl<'a> TraceView<'a> {
    /// A view of `values`, which must fill the shape with at least 4 draws of at least 1 chain.
    pub fn new(values: &'a [f32], snapshots: usize, chains: usize, dim: usize) -> Result<Self, InferError> {
        if values.len() != snapshots * chains * dim {
            return Err(InferError::setting(
                "trace",
                format!("{} values do not fill {snapshots} x {chains} x {dim}", values.len()),
            ));
        }
        if snapshots < 4 || chains == 0 {
            return Err(InferError::setting(
                "trace",
                format!("diagnostics need >= 4 draws of >= 1 chain, got {snapshots} of {chains}"),
            ));
        }
        Ok(Self { values, snapshots, chains, dim })
    }

    /// Coordinate `j` of every chain: `chains` series of length `snapshots`.
    pub fn series(&self, j: usize) -> Vec<Vec<f64>> {
        (0..self.chains)
            .map(|c| {
                (0..self.snapshots).map(|s| f64::from(self.values[(s * self.chains + c) * self.dim + j])).collect()
            })
            .collect()
    }
}

/// Per-dimension diagnostics of a trace.
#[derive(Clone, Debug, Serialize)]
pub struct TraceDiagnostics {
    /// Effective sample size of each coordinate (all chains pooled).
    pub ess: Vec<f64>,
    /// Split R-hat of each coordinate.
    pub rhat: Vec<f64>,
}

impl TraceDiagnostics {
    /// ESS and split R-hat of every coordinate of `trace`.
    pub fn of(trace: &TraceView<'_>) -> Self {
        let (ess, rhat) = (0..trace.dim)
            .map(|j| {
                let chains = trace.series(j);
                (ess(&chains), split_rhat(&chains))
            })
            .unzip();
        Self { ess, rhat }
    }

    /// The smallest ESS over the coordinates.
    pub fn min_ess(&self) -> f64 {
        self.ess.iter().copied().fold(f64::INFINITY, f64::min)
    }

    /// The mean ESS over the coordinates.
    pub fn mean_ess(&self) -> f64 {
        self.ess.iter().sum::<f64>() / self.ess.len().max(1) as f64
    }

    /// The largest split R-hat over the coordinates.
    pub fn max_rhat(&self) -> f64 {
        self.rhat.iter().copied().fold(f64::NEG_INFINITY, f64::max)
    }

    /// ESS per second of sampling for each coordinate.
    pub fn ess_per_second(&self, seconds: f64) -> Vec<f64> {
        self.ess.iter().map(|e| e / seconds).collect()
    }
}

fn mean(x: &[f64]) -> f64 {
    x.iter().sum::<f64>() / x.len() as f64
}

/// Autocovariance of `x` at `lag` with the `1/n` normalisation (positive semi-definite).
fn autocovariance(x: &[f64], mu: f64, lag: usize) -> f64 {
    let n = x.len();
    x[..n - lag].iter().zip(&x[lag..]).map(|(a, b)| (a - mu) * (b - mu)).sum::<f64>() / n as f64
}

/// Within-chain variance `W` and the pooled variance estimate `var+ = (n-1)/n W + B/n`.
fn variance_parts(chains: &[Vec<f64>]) -> (f64, f64, Vec<f64>) {
    let n = chains[0].len() as f64;
    let means: Vec<f64> = chains.iter().map(|c| mean(c)).collect();
    let w =
        chains.iter().zip(&means).map(|(c, m)| c.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0)).sum::<f64>()
            / chains.len() as f64;
    let between_over_n = if chains.len() > 1 {
        let mm = mean(&means);
        means.iter().map(|m| (m - mm).powi(2)).sum::<f64>() / (chains.len() - 1) as f64
    } else {
        0.0
    };
    (w, (n - 1.0) / n * w + between_over_n, means)
}

/// Effective sample size of one coordinate from equal-length chains.
///
/// `rho_t = 1 - (W - mean_c acov_c(t)) / var+` pools the chains' autocorrelations (and penalises
/// disagreeing chain means through `var+`); the sum is truncated where Geyer's pair sums
/// `rho_{2k} + rho_{2k+1}` stop being positive, and the pair sums are made monotone. Then
/// `ESS = M N / tau` with `tau = -1 + 2 sum_k P_k`. A constant series gives `M N`.
pub fn ess(chains: &[Vec<f64>]) -> f64 {
    let m = chains.len();
    let n = chains[0].len();
    let total = (m * n) as f64;
    let (w, var_plus, means) = variance_parts(chains);
    if var_plus.is_nan() || var_plus <= 0.0 || var_plus.is_infinite() {
        return total;
    }
    let rho = |t: usize| {
        let acov = chains.iter().zip(&means).map(|(c, mu)| autocovariance(c, *mu, t)).sum::<f64>() / m as f64;
        1.0 - (w - acov) / var_plus
    };
    let mut sum_pairs = 0.0;
    let mut previous = f64::INFINITY;
    let mut t = 0;
    while t + 1 < n {
        let pair = if t == 0 { 1.0 + rho(1) } else { rho(t) + rho(t + 1) };
        if pair <= 0.0 {
            break;
        }
        let pair = pair.min(previous); // initial monotone sequence
        sum_pairs += pair;
        previous = pair;
        t += 2;
    }
    let tau = (-1.0 + 2.0 * sum_pairs).max(1.0 / total.log10().max(1.0));
    total / tau
}

/// Bulk effective sample size of one coordinate (Vehtari, Gelman, Simpson, Carpenter & Bürkner
/// 2021, Sec. 4.3; Stan's `ess_bulk`): the draws of all chains rank-normalised together
/// (`z = Phi^{-1}((r - 3/8) / (S + 1/4))`, ties at their mean rank), each chain cut in halves, and
/// [`ess`] of the `2M` half-chains. Rank normalisation makes it defined for heavy tails and
/// comparable across coordinates; the split catches chains that drift.
pub fn bulk_ess(chains: &[Vec<f64>]) -> f64 {
    ess(&halves(&rank_normalise(chains)))
}

/// Each chain cut in two halves (the first half drops a middle draw of an odd length).
pub(crate) fn halves(chains: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let half = chains[0].len() / 2;
    chains.iter().flat_map(|c| [c[..half].to_vec(), c[c.len() - half..].to_vec()]).collect()
}

/// The draws of all chains rank-normalised together: `z = Phi^-1((r - 3/8) / (S + 1/4))`, ties
/// at their mean rank (1-based; Vehtari et al. 2021, eq. 14).
pub(crate) fn rank_normalise(chains: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let flat: Vec<f64> = chains.iter().flatten().copied().collect();
    split_like(chains, &normal_scores(&sorted_keys(&flat)))
}

/// [`rank_normalise`] of `chains` and of their folded values `|x - median|` (the scale R-hat's
/// draws), from one sort: below the median the sorted draws, read backwards, are the folded
/// values in ascending order, above it they are read forwards, so a merge of the two runs
/// orders the folded values (the same scores as sorting them, ties included). Non-finite draws
/// take two sorts.
pub(crate) fn rank_normalise_with_folded(chains: &[Vec<f64>], median: f64) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
    let flat: Vec<f64> = chains.iter().flatten().copied().collect();
    let keyed = sorted_keys(&flat);
    let ranked = split_like(chains, &normal_scores(&keyed));
    let fold = |v: f64| (v - median).abs();
    if !(median.is_finite() && flat.iter().all(|v| v.is_finite())) {
        let folded: Vec<f64> = flat.iter().map(|&v| fold(v)).collect();
        return (ranked, split_like(chains, &normal_scores(&sorted_keys(&folded))));
    }
    let split = keyed.partition_point(|&(_, k)| flat[k as usize] < median);
    let (mut below, mut above) = (split, split);
    let mut merged = Vec::with_capacity(keyed.len());
    while below > 0 || above < keyed.len() {
        let left = (below > 0).then(|| fold(flat[keyed[below - 1].1 as usize]));
        let right = (above < keyed.len()).then(|| fold(flat[keyed[above].1 as usize]));
        let take_left = match (left, right) {
            (Some(l), Some(r)) => l <= r,
            (l, _) => l.is_some(),
        };
        let (value, k) = if take_left {
            below -= 1;
            (left.unwrap_or_default(), keyed[below].1)
        } else {
            above += 1;
            (right.unwrap_or_default(), keyed[above - 1].1)
        };
        merged.push((total_order_key(value), k));
    }
    (ranked, split_like(chains, &normal_scores(&merged)))
}

/// `(order-preserving integer key, index)` of every value, sorted: compared without
/// indirection (the polish step's stopping rule ranks every watched quantity at every look).
fn sorted_keys(values: &[f64]) -> Vec<(u64, u32)> {
    let mut keyed: Vec<(u64, u32)> = values.iter().enumerate().map(|(k, &v)| (total_order_key(v), k as u32)).collect();
    keyed.sort_unstable();
    keyed
}

/// The normal score of each value's rank from its sorted keys, in the values' order: the
/// quantile of each rank from a table shared by every quantity of the same draw count (a
/// look's quantities all have it); ties (equal keys) take their mean rank.
fn normal_scores(keyed: &[(u64, u32)]) -> Vec<f64> {
    let total = keyed.len();
    let mut z_flat = vec![0.0; total];
    RANK_QUANTILES.with(|table| {
        let mut table = table.borrow_mut();
        if table.len() != total {
            *table = (0..total).map(|i| rank_quantile(i as f64 + 1.0, total)).collect();
        }
        let mut i = 0;
        while i < total {
            let mut j = i;
            while j + 1 < total && keyed[j + 1].0 == keyed[i].0 {
                j += 1;
            }
            let value = if i == j { table[i] } else { rank_quantile((i + j) as f64 / 2.0 + 1.0, total) };
            for &(_, k) in &keyed[i..=j] {
                z_flat[k as usize] = value;
            }
            i = j + 1;
        }
    });
    z_flat
}

/// `flat` cut into chains as long as `chains`'.
fn split_like(chains: &[Vec<f64>], flat: &[f64]) -> Vec<Vec<f64>> {
    let mut rest = flat;
    chains
        .iter()
        .map(|c| {
            let (head, tail) = rest.split_at(c.len());
            rest = tail;
            head.to_vec()
        })
        .collect()
}

thread_local! {
    /// `Phi^-1((r - 3/8) / (S + 1/4))` for `r = 1..=S`, for the last draw count `S` ranked.
    static RANK_QUANTILES: std::cell::RefCell<Vec<f64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The normal score of (1-based, possibly mean) rank `r` of `total` (Vehtari et al. 2021, eq. 14).
fn rank_quantile(r: f64, total: usize) -> f64 {
    crate::evaluation::normal_quantile((r - 0.375) / (total as f64 + 0.25))
}

/// An integer key in `f64::total_cmp`'s order (sign-magnitude to two's-complement order).
fn total_order_key(v: f64) -> u64 {
    let bits = v.to_bits();
    if bits >> 63 == 1 { !bits } else { bits | (1 << 63) }
}

/// Split R-hat of one coordinate: each chain is cut in halves, and
/// `R = sqrt(var+ / W)` over the `2M` half-chains. Values near 1 mean the chains agree.
pub fn split_rhat(chains: &[Vec<f64>]) -> f64 {
    let (w, var_plus, _) = variance_parts(&halves(chains));
    if w > 0.0 {
        (var_plus / w).sqrt()
    } else if var_plus > 0.0 {
        f64::INFINITY
    } else {
        1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EngineRng;

    /// The folded ranks from the one sort are the ranks of the folded values sorted afresh, to
    /// the bit: with ties (draws rounded to a grid, some at the median itself, some mirrored
    /// across it), and with a non-finite draw (the two-sort path).
    #[test]
    fn folded_ranks_from_one_sort_equal_a_second_sort() {
        let mut rng = EngineRng::new(4);
        let mut chains: Vec<Vec<f64>> =
            (0..5).map(|_| (0..40).map(|_| (rng.normal() * 8.0).round() / 4.0).collect()).collect();
        chains[0][0] = 0.25;
        chains[1][3] = -0.25;
        for median in [0.0, 0.125, -1.0, 3.0] {
            let folded: Vec<Vec<f64>> = chains.iter().map(|c| c.iter().map(|x| (x - median).abs()).collect()).collect();
            let (ranked, ranked_folded) = rank_normalise_with_folded(&chains, median);
            assert_eq!(ranked, rank_normalise(&chains));
            assert_eq!(ranked_folded, rank_normalise(&folded), "median {median}");
        }
        chains[2][5] = f64::NAN;
        let folded: Vec<Vec<f64>> = chains.iter().map(|c| c.iter().map(|x| (x - 0.5).abs()).collect()).collect();
        let (a, b) = rank_normalise_with_folded(&chains, 0.5);
        let same = |x: &Vec<Vec<f64>>, y: &Vec<Vec<f64>>| {
            x.iter().flatten().zip(y.iter().flatten()).all(|(p, q)| p.to_bits() == q.to_bits())
        };
        assert!(same(&a, &rank_normalise(&chains)) && same(&b, &rank_normalise(&folded)));
    }

    /// `chains` stationary AR(1) series `x_t = phi x_{t-1} + sqrt(1 - phi^2) e_t` plus `offsets`.
    fn ar1(phi: f64, chains: usize, n: usize, offsets: &[f64], seed: u64) -> Vec<Vec<f64>> {
        let mut rng = EngineRng::new(seed);
        (0..chains)
            .map(|c| {
                let mut x = rng.normal();
                (0..n)
                    .map(|_| {
                        x = phi * x + (1.0 - phi * phi).sqrt() * rng.normal();
                        x + offsets.get(c).copied().unwrap_or(0.0)
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn ess_of_ar1_matches_its_integrated_autocorrelation_time() {
        // tau = (1 + phi) / (1 - phi) exactly. The estimator's relative standard deviation is
        // about sqrt(2 (2L + 1) / (M N)) with L ~ 4 tau the truncation lag: ~2.3% at phi = 0.8,
        // M N = 200k; we allow 4 of those.
        for (phi, seed) in [(0.8, 1), (0.5, 2), (0.95, 3)] {
            let (m, n) = (4, 50_000);
            let chains = ar1(phi, m, n, &[], seed);
            let expected = (m * n) as f64 * (1.0 - phi) / (1.0 + phi);
            let tau = (1.0 + phi) / (1.0 - phi);
            let rel_sd = (2.0 * (8.0 * tau + 1.0) / (m * n) as f64).sqrt();
            let got = ess(&chains);
            assert!((got / expected - 1.0).abs() < 4.0 * rel_sd, "phi {phi}: ess {got} vs {expected}");
        }
    }

    #[test]
    fn independent_draws_have_ess_near_the_sample_size() {
        let chains = ar1(0.0, 4, 20_000, &[], 4);
        let got = ess(&chains);
        assert!((got / 80_000.0 - 1.0).abs() < 0.06, "{got}");
    }

    #[test]
    fn rhat_is_one_for_agreeing_chains_and_large_for_stuck_ones() {
        let agree = ar1(0.5, 4, 4000, &[], 5);
        let r = split_rhat(&agree);
        assert!((r - 1.0).abs() < 0.01, "{r}");
        // Two chains shifted by 1 sd: between-chain variance dominates.
        let stuck = ar1(0.5, 4, 4000, &[0.0, 0.0, 1.0, 1.0], 6);
        let r = split_rhat(&stuck);
        assert!(r > 1.1, "{r}");
        // Disagreeing chains also lose effective samples.
        assert!(ess(&stuck) < 0.5 * ess(&agree));
    }

    #[test]
    fn trace_view_reads_snapshot_major_layout() {
        // 5 snapshots, 2 chains, 1 dim: chain 0 = 0..5, chain 1 = 10..15.
        let values: Vec<f32> = (0..5).flat_map(|s| [s as f32, 10.0 + s as f32]).collect();
        let view = TraceView::new(&values, 5, 2, 1).unwrap();
        assert_eq!(view.series(0)[1], vec![10.0, 11.0, 12.0, 13.0, 14.0]);
        assert!(TraceView::new(&values, 4, 2, 1).is_err());
    }
}
