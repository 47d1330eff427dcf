//! Test metrics of a particle posterior over regression functions, on the original scale:
//! RMSE of the particle-averaged prediction and the log-likelihood of the mixture over
//! particles, with the reference code's development-set choice of the noise precision.

use std::f64::consts::PI;

/// Per-particle predictions on the normalised scale, `[rows][particles]` row-major, with the
/// targets on the original scale.
pub struct Predictions<'a> {
    /// Predictions on the normalised scale, `values[row * particles + i]` for particle `i`.
    pub values: &'a [f32],
    /// Number of particles.
    pub particles: usize,
    /// Targets on the original scale, one per row.
    pub targets: &'a [f64],
}

/// The test metrics of a particle posterior, on the original scale.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RegressionScore {
    /// RMSE of the (weighted) mean prediction.
    pub rmse: f64,
    /// Mean log-likelihood of the particle mixture per test row.
    pub ll: f64,
}

fn log_normal(y: f64, mean: f64, precision: f64) -> f64 {
    0.5 * (precision.ln() - (2.0 * PI).ln()) - 0.5 * precision * (y - mean).powi(2)
}

/// The noise precision of each particle on the original scale. `gamma` is on the normalised
/// scale (`gamma / y_std^2` on the original one). With a development set, each particle keeps
/// whichever of that and `1 / MSE_dev` gives the higher development log-likelihood (Liu &
/// Wang's heuristic, done on one scale).
pub fn choose_precisions(gamma: &[f64], y_mean: f64, y_std: f64, dev: Option<&Predictions<'_>>) -> Vec<f64> {
    let n = gamma.len();
    let model: Vec<f64> = gamma.iter().map(|g| g / (y_std * y_std)).collect();
    let Some(dev) = dev else { return model };
    let rows = dev.targets.len();
    if rows == 0 {
        return model;
    }
    (0..n)
        .map(|i| {
            let preds = (0..rows).map(|r| f64::from(dev.values[r * n + i]) * y_std + y_mean);
            let mse = preds.clone().zip(dev.targets).map(|(p, y)| (p - y).powi(2)).sum::<f64>() / rows as f64;
            let candidates = [model[i], 1.0 / mse.max(1e-300)];
            let dev_ll = |g: f64| preds.clone().zip(dev.targets).map(|(p, y)| log_normal(*y, p, g)).sum::<f64>();
            if dev_ll(candidates[1]) > dev_ll(candidates[0]) { candidates[1] } else { candidates[0] }
        })
        .collect()
}

/// Development-set statistics of a particle mixture on the original scale: the mean squared
/// error of the mixture's mean prediction `sum_i w_i f_i(x)` and the mean over rows of the
/// particles' weighted variance about it (the epistemic variance). `None` without rows.
pub fn mixture_dev_moments(
    dev: &Predictions<'_>,
    weights: Option<&[f64]>,
    y_mean: f64,
    y_std: f64,
) -> Option<(f64, f64)> {
    let n = dev.particles;
    let rows = dev.targets.len();
    if rows == 0 || n == 0 {
        return None;
    }
    let uniform = vec![1.0 / n as f64; n];
    let w = weights.unwrap_or(&uniform);
    let (mut mse, mut epistemic) = (0.0, 0.0);
    for (r, &y) in dev.targets.iter().enumerate() {
        let row = &dev.values[r * n..(r + 1) * n];
        let p = |i: usize| f64::from(row[i]) * y_std + y_mean;
        let mean: f64 = (0..n).map(|i| w[i] * p(i)).sum();
        mse += (y - mean).powi(2);
        epistemic += (0..n).map(|i| w[i] * (p(i) - mean).powi(2)).sum::<f64>();
    }
    Some((mse / rows as f64, epistemic / rows as f64))
}

/// The one noise precision (original scale) shared by every particle that maximises the
/// development log-likelihood of the particle mixture, `sum_r log sum_i w_i N(y_r | f_i(x_r),
/// 1/gamma)`: Liu & Wang's development-set rule applied to the predictive that is scored (the
/// mixture) rather than to each particle as if it were alone. Each particle alone picks
/// `1 / MSE_i`, and `MSE_i` already holds the particle's distance from the others, which the
/// mixture then adds again as its spread: the epistemic variance counted twice. With one
/// particle the two rules agree. `None` without development rows.
pub fn mixture_precision(dev: &Predictions<'_>, weights: Option<&[f64]>, y_mean: f64, y_std: f64) -> Option<f64> {
    mixture_precision_map(dev, weights, y_mean, y_std, None)
}

/// [`mixture_precision`] with a prior on the shared precision: the maximum of the mixture's
/// development log-likelihood (summed over rows) plus `log Gamma(gamma_n | a0, b0)`, with
/// `gamma_n = gamma * y_std^2` the precision on the normalised scale the model's own prior is
/// written on (`prior = Some((a0, b0))`). The likelihood alone, like a kernel density's
/// bandwidth chosen by likelihood, can reward a noise smaller than the particles' spread on a
/// few development rows; the prior's rate `b0` adds `2 b0 y_std^2 / rows` to the optimum's
/// variance (for one particle), which matters only when the rows are few or the noise is small
/// against the target's scale.
pub fn mixture_precision_map(
    dev: &Predictions<'_>,
    weights: Option<&[f64]>,
    y_mean: f64,
    y_std: f64,
    prior: Option<(f64, f64)>,
) -> Option<f64> {
    let (mse, _) = mixture_dev_moments(dev, weights, y_mean, y_std)?;
    let n = dev.particles;
    let rows = dev.targets.len() as f64;
    let objective = |log_sd: f64| {
        let precision = (-2.0 * log_sd).exp();
        let ll = score_weighted(dev, &vec![precision; n], weights, y_mean, y_std).ll * rows;
        match prior {
            None => ll,
            Some((a0, b0)) => {
                let g = precision * y_std * y_std;
                ll + (a0 - 1.0) * g.ln() - b0 * g
            }
        }
    };
    // The optimum lies below the mean's RMSE (the single-Gaussian answer, where the particles'
    // spread is zero), widened by what the prior adds: a coarse grid over four decades down
    // from 10 times that, then golden section in the grid cell around the best point.
    let floor = prior.map_or(0.0, |(_, b0)| 2.0 * b0 * y_std * y_std / rows);
    let top = ((mse + floor).max(1e-300).sqrt() * 10.0).ln();
    let step = 10f64.ln() / 8.0;
    let grid: Vec<f64> = (0..=32).map(|k| top - step * f64::from(k)).collect();
    let best = (0..grid.len()).max_by(|&a, &b| objective(grid[a]).total_cmp(&objective(grid[b])))?;
    let (mut a, mut b) = (grid[(best + 1).min(grid.len() - 1)], grid[best.saturating_sub(1)]);
    let g = 0.5 * (5f64.sqrt() - 1.0);
    for _ in 0..40 {
        let (c, d) = (b - g * (b - a), a + g * (b - a));
        if objective(c) > objective(d) { b = d } else { a = c }
    }
    Some((-(a + b)).exp())
}

/// Test RMSE of the mean prediction and mean test log-likelihood of the particle mixture
/// (`log mean_i N(y | f_i(x), 1/gamma_i)`, log-mean-exp), both on the original scale.
pub fn score(test: &Predictions<'_>, precisions: &[f64], y_mean: f64, y_std: f64) -> RegressionScore {
    score_weighted(test, precisions, None, y_mean, y_std)
}

/// [`score`] of a weighted particle set: the prediction is `sum_i w_i f_i(x)` and the
/// likelihood `log sum_i w_i N(y | f_i(x), 1/gamma_i)`; `None` is uniform weights `1/n`. The
/// weights are used as given (normalise them first). A mixture with negative weights whose
/// density is not positive at a test point scores `-inf` there, never NaN.
pub fn score_weighted(
    test: &Predictions<'_>,
    precisions: &[f64],
    weights: Option<&[f64]>,
    y_mean: f64,
    y_std: f64,
) -> RegressionScore {
    let n = test.particles;
    let rows = test.targets.len();
    let uniform = vec![1.0 / n as f64; n];
    let w = weights.unwrap_or(&uniform);
    let (mut sq, mut ll) = (0.0, 0.0);
    let mut logs = vec![0.0; n];
    for (r, &y) in test.targets.iter().enumerate() {
        let row = &test.values[r * n..(r + 1) * n];
        let mut mean = 0.0;
        for (i, &p) in row.iter().enumerate() {
            let p = f64::from(p) * y_std + y_mean;
            mean += w[i] * p;
            logs[i] = log_normal(y, p, precisions[i]);
        }
        sq += (mean - y).powi(2);
        let max = logs.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let mixture: f64 = logs.iter().zip(w).map(|(l, wi)| wi * (l - max).exp()).sum();
        ll += if mixture > 0.0 { max + mixture.ln() } else { f64::NEG_INFINITY };
    }
    RegressionScore { rmse: (sq / rows as f64).sqrt(), ll: ll / rows as f64 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixture_log_likelihood_equals_direct_computation() {
        // Two particles, two test rows, identity normalisation.
        let values = [0.0f32, 1.0, 2.0, 2.5];
        let targets = [0.5, 2.0];
        let test = Predictions { values: &values, particles: 2, targets: &targets };
        let s = score(&test, &[1.0, 4.0], 0.0, 1.0);
        let pdf = |y: f64, m: f64, g: f64| (g / (2.0 * PI)).sqrt() * (-0.5 * g * (y - m) * (y - m)).exp();
        let ll0 = (0.5 * (pdf(0.5, 0.0, 1.0) + pdf(0.5, 1.0, 4.0))).ln();
        let ll1 = (0.5 * (pdf(2.0, 2.0, 1.0) + pdf(2.0, 2.5, 4.0))).ln();
        assert!((s.ll - 0.5 * (ll0 + ll1)).abs() < 1e-12);
        let rmse = ((0.5f64 - 0.5).powi(2) / 2.0 + (2.25f64 - 2.0).powi(2) / 2.0).sqrt();
        assert!((s.rmse - rmse).abs() < 1e-12);
    }

    #[test]
    fn dev_heuristic_prefers_the_better_precision() {
        // A particle claiming precision 100 but missing by 1 on dev: 1/MSE = 1 is better.
        let values = [1.0f32, 1.0];
        let targets = [0.0, 0.0];
        let dev = Predictions { values: &values, particles: 1, targets: &targets };
        assert_eq!(choose_precisions(&[100.0], 0.0, 1.0, Some(&dev)), vec![1.0]);
        assert_eq!(choose_precisions(&[100.0], 0.0, 2.0, None), vec![25.0]);
    }

    /// Particles that spread as the truth's own uncertainty does: on each row the truth and
    /// the 20 particles are independent draws `g + tau z` (`tau = 1`), and `y` adds noise of sd
    /// `sigma = 0.5`. With many particles the calibrated mixture has noise sd `sigma` (their
    /// spread supplies `tau`). Each particle alone sees `MSE_i = 2 tau^2 + sigma^2` and picks
    /// sd 1.5 (Liu & Wang's rule); the mixture's development likelihood picks 0.74, and its 90%
    /// interval covers fresh rows 0.92 of the time where Liu & Wang's covers 0.99.
    #[test]
    fn mixture_rule_does_not_count_the_spread_twice() {
        use rand::SeedableRng;
        use rand_distr::{Distribution, StandardNormal};
        let (n, rows, tau, sigma) = (20usize, 4000usize, 1.0, 0.5);
        let mut rng = chacha20::ChaCha8Rng::seed_from_u64(7);
        let mut draw = |rows: usize| {
            let mut values = Vec::with_capacity(rows * n);
            let mut targets = Vec::with_capacity(rows);
            for r in 0..rows {
                let g = (r as f64 * 0.01).sin();
                let z: f64 = StandardNormal.sample(&mut rng);
                let e: f64 = StandardNormal.sample(&mut rng);
                targets.push(g + tau * z + sigma * e);
                for _ in 0..n {
                    let zi: f64 = StandardNormal.sample(&mut rng);
                    values.push((g + tau * zi) as f32);
                }
            }
            (values, targets)
        };
        let (dev_v, dev_y) = draw(rows);
        let (test_v, test_y) = draw(rows);
        let dev = Predictions { values: &dev_v, particles: n, targets: &dev_y };
        let alone = choose_precisions(&vec![1.0; n], 0.0, 1.0, Some(&dev));
        let alone_sd = alone.iter().map(|g| 1.0 / g.sqrt()).sum::<f64>() / n as f64;
        assert!((alone_sd - 1.5).abs() < 0.1, "Liu & Wang's sd {alone_sd}");
        let mixture = mixture_precision(&dev, None, 0.0, 1.0).unwrap();
        let sd = 1.0 / mixture.sqrt();
        // Above sigma: 20 particles are a lumpy stand-in for their Gaussian and the likelihood
        // smooths them (a kernel density's bandwidth, about 0.5 tau at n = 20: sd near 0.74),
        // but far below the 1.5 that counts their spread twice.
        assert!(sd > sigma && sd < 1.0, "mixture rule's sd {sd}");
        let (mse, epistemic) = mixture_dev_moments(&dev, None, 0.0, 1.0).unwrap();
        assert!((mse - (tau * tau * (1.0 + 1.0 / n as f64) + sigma * sigma)).abs() < 0.1, "{mse}");
        assert!((epistemic - tau * tau * (1.0 - 1.0 / n as f64)).abs() < 0.05, "{epistemic}");
        // On fresh rows the mixture rule predicts better and covers near 0.9.
        let test = Predictions { values: &test_v, particles: n, targets: &test_y };
        let (ll_mixture, ll_alone) = (score(&test, &vec![mixture; n], 0.0, 1.0).ll, score(&test, &alone, 0.0, 1.0).ll);
        assert!(ll_mixture > ll_alone + 0.05, "test LL {ll_mixture} against Liu & Wang's {ll_alone}");
        // The 90% interval of each rule's mixture (bisection on its CDF).
        let coverage = |precision: &[f64]| {
            let cdf = |r: usize, y: f64| {
                (0..n)
                    .map(|i| {
                        let z = (y - f64::from(test_v[r * n + i])) * precision[i].sqrt();
                        0.5 * (1.0 + crate::predictive::erf_reference(z / std::f64::consts::SQRT_2))
                    })
                    .sum::<f64>()
                    / n as f64
            };
            let quantile = |r: usize, p: f64| {
                let (mut lo, mut hi) = (-20.0, 20.0);
                for _ in 0..60 {
                    let mid = 0.5 * (lo + hi);
                    if cdf(r, mid) < p { lo = mid } else { hi = mid }
                }
                0.5 * (lo + hi)
            };
            (0..rows).filter(|&r| (quantile(r, 0.05)..=quantile(r, 0.95)).contains(&test_y[r])).count() as f64
                / rows as f64
        };
        // Measured 0.917 (the smoothing above) and 0.990; the Monte Carlo sd at 4000 rows is
        // sqrt(0.09 / 4000) = 0.0047.
        let mixed = coverage(&vec![mixture; n]);
        assert!((0.88..0.94).contains(&mixed), "mixture rule's coverage {mixed}");
        let lw = coverage(&alone);
        assert!(lw > 0.97, "Liu & Wang's coverage {lw}");
    }

    #[test]
    fn mixture_rule_with_one_particle_is_liu_and_wang() {
        let values = [1.0f32, 2.5, -0.5];
        let targets = [0.0, 2.0, 0.5];
        let dev = Predictions { values: &values, particles: 1, targets: &targets };
        let lw = choose_precisions(&[100.0], 0.0, 1.0, Some(&dev))[0];
        let mixture = mixture_precision(&dev, None, 0.0, 1.0).unwrap();
        assert!((mixture / lw - 1.0).abs() < 1e-6, "{mixture} against {lw}");
    }

    /// One particle: the log-posterior `R/2 ln g - g SSE/2 + (a0 - 1) ln(g s^2) - b0 g s^2` peaks at
    /// `1/g = (SSE + 2 b0 s^2) / (R + 2 (a0 - 1))`, exactly; without a prior it is the mixture rule.
    #[test]
    fn mixture_map_with_one_particle_is_the_gamma_posteriors_mode() {
        let values = [1.0f32, 2.5, -0.5, 0.3];
        let targets = [0.0, 2.0, 0.5, 0.9];
        let dev = Predictions { values: &values, particles: 1, targets: &targets };
        let (y_mean, y_std) = (3.0, 2.5);
        let sse: f64 = values.iter().zip(&targets).map(|(&v, &y)| (f64::from(v) * y_std + y_mean - y).powi(2)).sum();
        let rows = targets.len() as f64;
        for (a0, b0) in [(1.0, 0.1), (2.0, 0.5), (1.0, 3.0)] {
            let got = mixture_precision_map(&dev, None, y_mean, y_std, Some((a0, b0))).unwrap();
            let want = (rows + 2.0 * (a0 - 1.0)) / (sse + 2.0 * b0 * y_std * y_std);
            assert!((got / want - 1.0).abs() < 1e-6, "a0 {a0} b0 {b0}: {got} against {want}");
        }
        let none = mixture_precision_map(&dev, None, y_mean, y_std, None).unwrap();
        assert_eq!(none, mixture_precision(&dev, None, y_mean, y_std).unwrap());
        assert!((none * sse / rows - 1.0).abs() < 1e-6, "{none} against {}", rows / sse);
    }

    #[test]
    fn weighted_score_matches_direct_computation_and_uniform_default() {
        let values = [0.0f32, 1.0, 2.0, 2.5];
        let targets = [0.5, 2.0];
        let test = Predictions { values: &values, particles: 2, targets: &targets };
        let w = [0.25, 0.75];
        let s = score_weighted(&test, &[1.0, 4.0], Some(&w), 0.0, 1.0);
        let pdf = |y: f64, m: f64, g: f64| (g / (2.0 * PI)).sqrt() * (-0.5 * g * (y - m) * (y - m)).exp();
        let ll0 = (0.25 * pdf(0.5, 0.0, 1.0) + 0.75 * pdf(0.5, 1.0, 4.0)).ln();
        let ll1 = (0.25 * pdf(2.0, 2.0, 1.0) + 0.75 * pdf(2.0, 2.5, 4.0)).ln();
        assert!((s.ll - 0.5 * (ll0 + ll1)).abs() < 1e-12);
        let rmse = ((0.75f64 - 0.5).powi(2) / 2.0 + (2.375f64 - 2.0).powi(2) / 2.0).sqrt();
        assert!((s.rmse - rmse).abs() < 1e-12);
        let u = score_weighted(&test, &[1.0, 4.0], None, 0.0, 1.0);
        assert_eq!(u, score(&test, &[1.0, 4.0], 0.0, 1.0));
    }
}
