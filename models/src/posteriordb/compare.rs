//! Agreement between approximate draws (possibly weighted) and reference draws, on the
//! constrained scale: per-parameter error of the mean in reference standard deviations, the
//! ratio of standard deviations, and the energy distance between the two sets.
//!
//! Self-contained (host `f64`, `std` only) so that it can serve any evaluation code. Draw sets
//! are row-major `[rows, params]` slices; approximate draws may carry normalised non-negative
//! weights (a weighted particle set), reference draws are equally weighted.

use std::fmt;

/// The number of reference draws the energy distance uses at most: a deterministic, evenly
/// spaced subsample keeps its cost at `O((n + m)^2 p)` for `n` approximate draws.
pub const REFERENCE_SUBSAMPLE: usize = 1000;

/// Why two draw sets could not be compared.
#[derive(Clone, Debug, PartialEq)]
pub enum CompareError {
    /// Slice lengths that do not match the parameter count, an empty set, or a non-finite draw.
    Shape(String),
    /// Weights of the wrong length, negative, non-finite, or summing to zero.
    Weights(String),
    /// A reference parameter with zero spread: nothing to standardise by.
    ConstantReference {
        /// Index of the parameter (from 0).
        param: usize,
    },
}

impl fmt::Display for CompareError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CompareError::Shape(reason) => write!(f, "draws: {reason}"),
            CompareError::Weights(reason) => write!(f, "weights: {reason}"),
            CompareError::ConstantReference { param } => {
                write!(f, "reference parameter {param} has zero standard deviation: errors cannot be standardised")
            }
        }
    }
}

impl std::error::Error for CompareError {}

/// Per-parameter agreement and the energy distance between an approximation and the reference.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// `(mean - reference mean) / reference sd` per parameter, signed.
    pub mean_error_sd: Vec<f64>,
    /// `sd / reference sd` per parameter (weighted sd for a weighted set).
    pub sd_ratio: Vec<f64>,
    /// The energy distance `2 E|X - Y| - E|X - X'| - E|Y - Y'|` between the (weighted)
    /// approximation `X` and the reference `Y`, on coordinates divided by the reference sd, with
    /// the reference subsampled to [`REFERENCE_SUBSAMPLE`] draws. Zero only for equal
    /// distributions; an approximation that is off by `d` reference sds in one coordinate scores
    /// about `2 d` for large `d`.
    pub energy_distance: f64,
}

/// The headline numbers of a [`Comparison`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    /// Largest `|mean error|` over parameters, in reference sds.
    pub max_mean_error_sd: f64,
    /// Mean `|mean error|` over parameters, in reference sds.
    pub mean_mean_error_sd: f64,
    /// Largest `|sd ratio - 1|` over parameters.
    pub max_sd_ratio_error: f64,
    /// The energy distance (see [`Comparison::energy_distance`]).
    pub energy_distance: f64,
}

impl Comparison {
    /// The largest and mean absolute mean error, the largest sd-ratio error, and the distance.
    pub fn summary(&self) -> Summary {
        let abs: Vec<f64> = self.mean_error_sd.iter().map(|e| e.abs()).collect();
        Summary {
            max_mean_error_sd: abs.iter().copied().fold(0.0, f64::max),
            mean_mean_error_sd: abs.iter().sum::<f64>() / abs.len().max(1) as f64,
            max_sd_ratio_error: self.sd_ratio.iter().map(|r| (r - 1.0).abs()).fold(0.0, f64::max),
            energy_distance: self.energy_distance,
        }
    }
}

/// Compares approximate draws `approx` `[n, params]` (with optional `weights`, `n` of them,
/// non-negative; normalised here) with `reference` `[m, params]`, both row-major.
pub fn compare(
    reference: &[f64],
    approx: &[f64],
    params: usize,
    weights: Option<&[f64]>,
) -> Result<Comparison, CompareError> {
    let m = rows(reference, params, "reference")?;
    let n = rows(approx, params, "approximation")?;
    let w = normalised_weights(weights, n)?;
    let (ref_mean, ref_sd) = moments(reference, params, &vec![1.0 / m as f64; m]);
    if let Some(param) = ref_sd.iter().position(|&s| s.is_nan() || s <= 0.0) {
        return Err(CompareError::ConstantReference { param });
    }
    let (mean, sd) = moments(approx, params, &w);
    let mean_error_sd = (0..params).map(|j| (mean[j] - ref_mean[j]) / ref_sd[j]).collect();
    let sd_ratio = (0..params).map(|j| sd[j] / ref_sd[j]).collect();
    let energy_distance = energy_distance(reference, approx, params, &w, &ref_sd, REFERENCE_SUBSAMPLE);
    Ok(Comparison { mean_error_sd, sd_ratio, energy_distance })
}

/// Compares approximate draws `approx` `[n, params]` (optional weights as in [`compare`]) with a
/// reference given only by its moments (posteriordb's `accel_gp`): the errors of the means in
/// reference sds and the sd ratios; the energy distance is NaN (no draws to measure it against).
pub fn compare_moments(
    ref_mean: &[f64],
    ref_sd: &[f64],
    approx: &[f64],
    weights: Option<&[f64]>,
) -> Result<Comparison, CompareError> {
    let params = ref_mean.len();
    if ref_sd.len() != params {
        return Err(CompareError::Shape(format!("{params} reference means but {} sds", ref_sd.len())));
    }
    if let Some(param) = ref_sd.iter().position(|&s| s.is_nan() || s <= 0.0) {
        return Err(CompareError::ConstantReference { param });
    }
    let n = rows(approx, params, "approximation")?;
    let w = normalised_weights(weights, n)?;
    let (mean, sd) = moments(approx, params, &w);
    let mean_error_sd = (0..params).map(|j| (mean[j] - ref_mean[j]) / ref_sd[j]).collect();
    let sd_ratio = (0..params).map(|j| sd[j] / ref_sd[j]).collect();
    Ok(Comparison { mean_error_sd, sd_ratio, energy_distance: f64::NAN })
}

/// Validates a draw matrix and returns its row count.
fn rows(draws: &[f64], params: usize, what: &str) -> Result<usize, CompareError> {
    if params == 0 || draws.is_empty() || !draws.len().is_multiple_of(params) {
        return Err(CompareError::Shape(format!(
            "the {what} has {} values, not a positive multiple of {params} parameters",
            draws.len()
        )));
    }
    if let Some(i) = draws.iter().position(|v| !v.is_finite()) {
        return Err(CompareError::Shape(format!(
            "the {what} has a non-finite value {} in row {}, parameter {}",
            draws[i],
            i / params,
            i % params
        )));
    }
    Ok(draws.len() / params)
}

/// The weights normalised to sum 1 (uniform when absent).
fn normalised_weights(weights: Option<&[f64]>, n: usize) -> Result<Vec<f64>, CompareError> {
    let Some(w) = weights else { return Ok(vec![1.0 / n as f64; n]) };
    if w.len() != n {
        return Err(CompareError::Weights(format!("{} weights for {n} draws", w.len())));
    }
    if let Some(bad) = w.iter().find(|v| !(v.is_finite() && **v >= 0.0)) {
        return Err(CompareError::Weights(format!("weights must be finite and >= 0, found {bad}")));
    }
    let total: f64 = w.iter().sum();
    if total <= 0.0 {
        return Err(CompareError::Weights("weights sum to zero".into()));
    }
    Ok(w.iter().map(|v| v / total).collect())
}

/// Weighted means and standard deviations of every column. The variance is unbiased for
/// reliability weights, `sum w (x - mean)^2 / (1 - sum w^2)`: the usual `n - 1` divisor for equal
/// weights, so that equal sets and equally weighted sets are measured alike.
fn moments(draws: &[f64], params: usize, w: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let mut mean = vec![0.0; params];
    for (row, wi) in draws.chunks_exact(params).zip(w) {
        for (m, x) in mean.iter_mut().zip(row) {
            *m += wi * x;
        }
    }
    let mut var = vec![0.0; params];
    for (row, wi) in draws.chunks_exact(params).zip(w) {
        for ((v, x), m) in var.iter_mut().zip(row).zip(&mean) {
            *v += wi * (x - m) * (x - m);
        }
    }
    let sum_sq: f64 = w.iter().map(|v| v * v).sum();
    let correction = if sum_sq < 1.0 { 1.0 / (1.0 - sum_sq) } else { 0.0 };
    (mean, var.into_iter().map(|v| (v * correction).sqrt()).collect())
}

/// The energy distance between the weighted set `approx` (normalised weights `w`) and the
/// equally weighted `reference`, on coordinates divided by `scale`, using at most
/// `max_reference` reference rows (evenly spaced, so every chain contributes). The V-statistic
/// form: identical sets score exactly 0.
pub fn energy_distance(
    reference: &[f64],
    approx: &[f64],
    params: usize,
    w: &[f64],
    scale: &[f64],
    max_reference: usize,
) -> f64 {
    let m_all = reference.len() / params;
    let m = m_all.min(max_reference.max(1));
    let standardise = |row: &[f64]| -> Vec<f64> { row.iter().zip(scale).map(|(x, s)| x / s).collect() };
    let y: Vec<Vec<f64>> =
        (0..m).map(|j| j * m_all / m).map(|r| standardise(&reference[r * params..(r + 1) * params])).collect();
    let x: Vec<Vec<f64>> = approx.chunks_exact(params).map(standardise).collect();
    let dist = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(p, q)| (p - q) * (p - q)).sum::<f64>().sqrt();
    let mut cross = 0.0;
    for (xi, wi) in x.iter().zip(w) {
        cross += wi * y.iter().map(|yj| dist(xi, yj)).sum::<f64>();
    }
    cross /= m as f64;
    let mut within_x = 0.0;
    for (i, (xi, wi)) in x.iter().zip(w).enumerate() {
        for (xk, wk) in x[i + 1..].iter().zip(&w[i + 1..]) {
            within_x += 2.0 * wi * wk * dist(xi, xk);
        }
    }
    let mut within_y = 0.0;
    for (j, yj) in y.iter().enumerate() {
        for yl in &y[j + 1..] {
            within_y += 2.0 * dist(yj, yl);
        }
    }
    within_y /= (m * m) as f64;
    (2.0 * cross - within_x - within_y).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic standard normal draws (Box-Muller on a fixed LCG).
    fn normals(count: usize, seed: u64) -> Vec<f64> {
        let mut state = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let mut uniform = move || {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        (0..count)
            .map(|_| {
                let (u, v) = (uniform(), uniform());
                (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
            })
            .collect()
    }

    #[test]
    fn identical_sets_agree_exactly() {
        // Two parameters on very different scales.
        let draws: Vec<f64> =
            normals(1600, 1).chunks(2).flat_map(|p| [3.0 + 0.01 * p[0], -50.0 + 20.0 * p[1]]).collect();
        let c = compare(&draws, &draws, 2, None).unwrap();
        assert!(c.energy_distance.abs() < 1e-12, "{}", c.energy_distance);
        for j in 0..2 {
            assert!(c.mean_error_sd[j].abs() < 1e-12);
            assert!((c.sd_ratio[j] - 1.0).abs() < 1e-12);
        }
        let s = c.summary();
        assert!(s.max_mean_error_sd < 1e-12 && s.max_sd_ratio_error < 1e-12);
    }

    #[test]
    fn a_shifted_set_shows_the_shift_in_reference_sds() {
        let reference: Vec<f64> = normals(4000, 2).chunks(2).flat_map(|p| [p[0], 10.0 + 5.0 * p[1]]).collect();
        let sd = {
            let (_, sd) = moments(&reference, 2, &vec![1.0 / 2000.0; 2000]);
            sd
        };
        // Shift parameter 0 by 0.5 sd and parameter 1 by -2 sd.
        let shifted: Vec<f64> = reference.chunks(2).flat_map(|p| [p[0] + 0.5 * sd[0], p[1] - 2.0 * sd[1]]).collect();
        let c = compare(&reference, &shifted, 2, None).unwrap();
        assert!((c.mean_error_sd[0] - 0.5).abs() < 1e-9, "{:?}", c.mean_error_sd);
        assert!((c.mean_error_sd[1] + 2.0).abs() < 1e-9, "{:?}", c.mean_error_sd);
        assert!((c.sd_ratio[0] - 1.0).abs() < 1e-9 && (c.sd_ratio[1] - 1.0).abs() < 1e-9);
        let s = c.summary();
        assert!((s.max_mean_error_sd - 2.0).abs() < 1e-9);
        assert!((s.mean_mean_error_sd - 1.25).abs() < 1e-9);
        // A 2-sd shift in one coordinate: the energy distance is well away from 0.
        assert!(s.energy_distance > 1.0, "{}", s.energy_distance);
    }

    #[test]
    fn weights_matter() {
        // Reference: three quarters zeros, a quarter ones. The two atoms weighted 3:1 are the
        // same distribution (distance exactly 0); unweighted they are not.
        let reference: Vec<f64> = (0..1000).map(|i| if i % 4 == 3 { 1.0 } else { 0.0 }).collect();
        let atoms = [0.0, 1.0];
        let weighted = compare(&reference, &atoms, 1, Some(&[3.0, 1.0])).unwrap();
        let unweighted = compare(&reference, &atoms, 1, None).unwrap();
        assert!(weighted.energy_distance < 1e-12, "{}", weighted.energy_distance);
        assert!(weighted.mean_error_sd[0].abs() < 1e-12);
        assert!(unweighted.energy_distance > 0.1, "{}", unweighted.energy_distance);
        assert!(unweighted.mean_error_sd[0] > 0.5);

        // Continuous: a grid weighted by the normal density against normal reference draws.
        let reference = normals(5000, 3);
        let grid: Vec<f64> = (0..81).map(|i| -4.0 + 0.1 * i as f64).collect();
        let density: Vec<f64> = grid.iter().map(|x| (-0.5 * x * x).exp()).collect();
        let weighted = compare(&reference, &grid, 1, Some(&density)).unwrap();
        let unweighted = compare(&reference, &grid, 1, None).unwrap();
        assert!(weighted.energy_distance < 0.01, "{}", weighted.energy_distance);
        assert!(unweighted.energy_distance > 10.0 * weighted.energy_distance, "{unweighted:?} vs {weighted:?}");
        assert!((weighted.sd_ratio[0] - 1.0).abs() < 0.05, "{:?}", weighted.sd_ratio);
        assert!(unweighted.sd_ratio[0] > 2.0, "{:?}", unweighted.sd_ratio);
    }

    #[test]
    fn bad_input_is_an_error() {
        let reference = [0.0, 1.0, 2.0, 3.0];
        assert!(matches!(compare(&reference, &[1.0, 2.0, 3.0], 2, None), Err(CompareError::Shape(_))));
        assert!(matches!(compare(&reference, &[1.0, 2.0], 2, Some(&[1.0, 2.0])), Err(CompareError::Weights(_))));
        assert!(matches!(compare(&reference, &[1.0, 2.0], 2, Some(&[-1.0])), Err(CompareError::Weights(_))));
        assert!(matches!(compare(&reference, &[1.0, 2.0], 2, Some(&[0.0])), Err(CompareError::Weights(_))));
        assert!(matches!(compare(&[1.0, 1.0], &[1.0], 1, None), Err(CompareError::ConstantReference { param: 0 })));
        assert!(matches!(compare(&reference, &[f64::NAN, 2.0], 2, None), Err(CompareError::Shape(_))));
    }
}
