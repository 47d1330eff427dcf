//! What a particle posterior says about new inputs, and how well calibrated that is.
//!
//! A (weighted) particle set predicts with the mixture `sum_i w_i p(y | x, theta_i)`. For
//! regression with Gaussian noise the mixture's variance splits exactly into an epistemic part
//! (the spread of the particles' means) and an aleatoric part (the noise each particle
//! believes in); for classification the predictive entropy splits into the expected entropy
//! (aleatoric) and the mutual information between label and parameters (epistemic; Depeweg et
//! al. 2018). All summaries are computed for every row at once on the device.
//!
//! Calibration: a regression predictive is calibrated when its probability integral transform
//! `u = F(y)` is uniform on held-out rows; the calibration error is the mean absolute gap
//! between the fraction of rows with `u <= p` and `p` over `p = 0.05, ..., 0.95` (Kuleshov et al.
//! 2018). For classification it is the expected calibration error over ten equal-width
//! confidence bins (Guo et al. 2017).

use burn::tensor::{Int, Tensor};
use parvi_model::tensor_ops::to_vec_f64;

/// Probability levels of the regression reliability curve and calibration error.
pub const CALIBRATION_LEVELS: [f64; 19] =
    [0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95];

/// Bisection steps for a mixture quantile: the bracket shrinks by `2^-60`, below `f32`'s
/// resolution of any bracket the means and noise can span.
const QUANTILE_STEPS: usize = 60;

/// Bisection steps between two checks of whether every bracket is resolved.
const QUANTILE_CHECK_EVERY: usize = 4;

/// Whether every bracket `[lo, hi]` is within `2^-21` of `|lo| + |hi| + floor` (about four
/// `f32` ulps of the quantile): one scalar read.
fn brackets_resolved(lo: &Tensor<1>, hi: &Tensor<1>, floor: Tensor<1>) -> bool {
    let scale = lo.clone().abs() + hi.clone().abs() + floor;
    let widest = ((hi.clone() - lo.clone()) / scale).max().into_scalar::<f32>();
    widest < 2f32.powi(-21)
}

/// The regression predictive for a batch of rows, on the original scale of the target.
#[derive(Clone, Debug, PartialEq)]
pub struct RegressionPredictive {
    /// Predictive mean per row.
    pub mean: Vec<f64>,
    /// Standard deviation of the particles' means (what more data would remove).
    pub epistemic_sd: Vec<f64>,
    /// Root of the mean noise variance the particles assign (what no data removes).
    pub aleatoric_sd: Vec<f64>,
    /// `sqrt(epistemic^2 + aleatoric^2)`: the mixture's standard deviation.
    pub total_sd: Vec<f64>,
    /// The mixture's quantiles at [`RegressionPredictive::LEVELS`], one `Vec` per level.
    pub quantiles: [Vec<f64>; 3],
}

impl RegressionPredictive {
    /// The quantile levels reported: the median and the central 90% interval.
    pub const LEVELS: [f64; 3] = [0.05, 0.5, 0.95];

    /// The predictive of a Gaussian-noise mixture. `means` `[particles, rows]` are the
    /// particles' predictions on the original scale, `noise_sd` `[particles]` their noise
    /// standard deviations, `weights` `[particles]` the particle weights (summing to one).
    pub fn from_mixture(means: Tensor<2>, noise_sd: Tensor<1>, weights: Tensor<1>) -> Self {
        Self::of_mixture(&Mixture::new(means, noise_sd, weights))
    }

    /// The summaries of `mixture`.
    pub fn of_mixture(mixture: &Mixture) -> Self {
        let mean = mixture.mean();
        let epistemic = (mixture.means.clone() - mean.clone().unsqueeze_dim(0)).square();
        let epistemic = (epistemic * mixture.weights.clone()).sum_dim(0).squeeze_dim::<1>(0);
        let aleatoric = (mixture.noise_sd.clone().square() * mixture.weights.clone()).sum();
        let aleatoric = aleatoric.expand([mean.dims()[0]]);
        let total = (epistemic.clone() + aleatoric.clone()).sqrt();
        let quantiles = Self::LEVELS.map(|p| to_vec_f64(&mixture.quantile(p)));
        Self {
            mean: to_vec_f64(&mean),
            epistemic_sd: to_vec_f64(&epistemic.sqrt()),
            aleatoric_sd: to_vec_f64(&aleatoric.sqrt()),
            total_sd: to_vec_f64(&total),
            quantiles,
        }
    }
}

/// A mixture of Gaussians per row: component `i` of row `r` is `N(means[i, r], noise_sd[i]^2)`.
pub struct Mixture {
    /// `[particles, rows]`
    means: Tensor<2>,
    /// `[particles, 1]`
    noise_sd: Tensor<2>,
    /// `[particles, 1]`
    weights: Tensor<2>,
}

impl Mixture {
    /// The mixture of the particles' predictive Gaussians (see
    /// [`RegressionPredictive::from_mixture`] for the shapes).
    pub fn new(means: Tensor<2>, noise_sd: Tensor<1>, weights: Tensor<1>) -> Self {
        Self { means, noise_sd: noise_sd.unsqueeze_dim(1), weights: weights.unsqueeze_dim(1) }
    }

    /// `[rows]`
    fn mean(&self) -> Tensor<1> {
        (self.means.clone() * self.weights.clone()).sum_dim(0).squeeze_dim::<1>(0)
    }

    /// The mixture's CDF at `y` `[rows]`: `sum_i w_i Phi((y - m_i) / s_i)`.
    pub fn cdf(&self, y: Tensor<1>) -> Tensor<1> {
        let z = (y.unsqueeze_dim(0) - self.means.clone()) / self.noise_sd.clone().mul_scalar(std::f64::consts::SQRT_2);
        let phi = z.erf().add_scalar(1.0).mul_scalar(0.5);
        (phi * self.weights.clone()).sum_dim(0).squeeze_dim::<1>(0)
    }

    /// The `p`-quantile per row of the particles' means alone (the network's mean, noise left
    /// out): the smallest mean whose cumulative weight reaches `p`. Unlike `mean +- z sd` it is
    /// never outside the range of the means, so the epistemic band lies inside the mixture's own
    /// quantiles whatever the skew of a few particles. A summary, computed on the host.
    pub fn mean_quantile(&self, p: f64) -> Vec<f64> {
        let [particles, rows] = self.means.dims();
        let means = to_vec_f64(&self.means);
        let weights = to_vec_f64(&self.weights);
        (0..rows)
            .map(|r| {
                let mut column: Vec<(f64, f64)> = (0..particles).map(|i| (means[i * rows + r], weights[i])).collect();
                column.sort_by(|a, b| a.0.total_cmp(&b.0));
                let mut cumulative = 0.0;
                for &(value, weight) in &column {
                    cumulative += weight;
                    if cumulative >= p - 1e-12 {
                        return value;
                    }
                }
                column.last().map_or(f64::NAN, |c| c.0)
            })
            .collect()
    }

    /// The mixture's `p`-quantile per row, by bisection between the components' extreme
    /// `8 sd` points (where every component's CDF is within `1e-15` of 0 or 1). The bisection
    /// stops once every row's bracket spans a few `f32` ulps of its quantile (or of the smallest
    /// noise sd, for a quantile near zero), checked every [`QUANTILE_CHECK_EVERY`] steps with
    /// one scalar read: the later of the 60 steps would not move it, and each evaluates the
    /// mixture's CDF over `[particles, rows]` (the protein test set's 4,573 rows and 100
    /// particles took a second's `erf`s for three levels).
    ///
    /// The bracket comes from the components whose extreme points are finite: one with an
    /// infinite noise sd (a zero precision, which a diverged draw can have) has CDF 1/2 at every
    /// finite `y`, one with an infinite mean 0 or 1, so neither bounds a finite quantile, and
    /// with their points in the bracket every midpoint would be NaN. A row with no such
    /// component has no finite quantile: NaN.
    pub fn quantile(&self, p: f64) -> Tensor<1> {
        let spread = self.noise_sd.clone().mul_scalar(8.0);
        let (low, high) = (self.means.clone() - spread.clone(), self.means.clone() + spread);
        let unbounded = low.clone().is_finite().bool_and(high.clone().is_finite()).bool_not();
        let mut lo = low.mask_fill(unbounded.clone(), f32::MAX).min_dim(0).squeeze_dim::<1>(0);
        let mut hi = high.mask_fill(unbounded, f32::MIN).max_dim(0).squeeze_dim::<1>(0);
        let no_bracket = lo.clone().greater(hi.clone());
        let floor = self.noise_sd.clone().min().reshape([1]);
        for step in 1..=QUANTILE_STEPS {
            let mid = (lo.clone() + hi.clone()).mul_scalar(0.5);
            let below = self.cdf(mid.clone()).lower_elem(p);
            lo = lo.mask_where(below.clone(), mid.clone());
            hi = mid.mask_where(below, hi);
            if step % QUANTILE_CHECK_EVERY == 0 && brackets_resolved(&lo, &hi, floor.clone()) {
                break;
            }
        }
        (lo + hi).mul_scalar(0.5).mask_fill(no_bracket, f32::NAN)
    }
}

/// The classification predictive for a batch of rows.
#[derive(Clone, Debug, PartialEq)]
pub struct ClassPredictive {
    /// Row-major `[rows, classes]` predictive probabilities.
    pub probabilities: Vec<f64>,
    /// Number of classes.
    pub classes: usize,
    /// The most probable class per row.
    pub predicted: Vec<usize>,
    /// Entropy of the predictive distribution per row (nats).
    pub entropy: Vec<f64>,
    /// Mutual information between the label and the parameters per row (nats): the
    /// epistemic part of the entropy.
    pub mutual_information: Vec<f64>,
}

impl ClassPredictive {
    /// From the particles' class probabilities `[particles, rows, classes]` and weights
    /// `[particles]` (summing to one).
    pub fn from_particles(probabilities: Tensor<3>, weights: Tensor<1>) -> Self {
        let [_, rows, classes] = probabilities.dims();
        let w = weights.reshape([-1, 1, 1]);
        let entropy = |p: Tensor<3>| -> Tensor<3> { (p.clone() * p.clamp_min(1e-30).log()).sum_dim(2).neg() };
        let mean = (probabilities.clone() * w.clone()).sum_dim(0); // [1, rows, classes]
        let total = entropy(mean.clone()).reshape([rows]);
        let expected = (entropy(probabilities) * w).sum_dim(0).reshape([rows]);
        let predicted: Tensor<1, Int> = mean.clone().reshape([rows, classes]).argmax(1).reshape([rows]);
        let predicted = predicted.into_data().convert::<i64>().try_to_vec::<i64>().unwrap_or_default();
        Self {
            probabilities: to_vec_f64(&mean.reshape([rows, classes])),
            classes,
            predicted: predicted.into_iter().map(|c| c.max(0) as usize).collect(),
            entropy: to_vec_f64(&total.clone()),
            mutual_information: to_vec_f64(&(total - expected).clamp_min(0.0)),
        }
    }

    /// Probability of class `k` for row `r`.
    pub fn probability(&self, r: usize, k: usize) -> f64 {
        self.probabilities[r * self.classes + k]
    }
}

/// Held-out metrics of a regression predictive.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RegressionCalibration {
    /// Fraction of rows inside the central 90% predictive interval.
    pub coverage_90: f64,
    /// Mean `|observed - expected|` over [`CALIBRATION_LEVELS`] of the PIT's CDF.
    pub calibration_error: f64,
    /// The reliability curve: `(expected level, observed fraction)` per level.
    pub curve: Vec<(f64, f64)>,
}

impl RegressionCalibration {
    /// From the PIT values `u = F(y)` of the held-out rows and the 90% interval hits.
    pub fn from_pit(pit: &[f64], inside_90: usize) -> Self {
        let n = pit.len().max(1) as f64;
        let curve: Vec<(f64, f64)> =
            CALIBRATION_LEVELS.iter().map(|&p| (p, pit.iter().filter(|&&u| u <= p).count() as f64 / n)).collect();
        let calibration_error = curve.iter().map(|(p, o)| (p - o).abs()).sum::<f64>() / curve.len() as f64;
        Self { coverage_90: inside_90 as f64 / n, calibration_error, curve }
    }

    /// Scores the mixture against `targets` `[rows]` (original scale).
    pub fn of_mixture(mixture: &Mixture, targets: Tensor<1>) -> Self {
        let pit = to_vec_f64(&mixture.cdf(targets.clone()));
        let lo = mixture.quantile(0.05);
        let hi = mixture.quantile(0.95);
        let inside = targets.clone().greater_equal(lo).int() * targets.lower_equal(hi).int();
        let inside: i64 = inside.sum().into_scalar::<i64>();
        Self::from_pit(&pit, inside.max(0) as usize)
    }
}

/// Held-out metrics of a classification predictive.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ClassCalibration {
    /// Fraction of rows whose most probable class is the label.
    pub accuracy: f64,
    /// Mean log predictive probability of the label.
    pub log_likelihood: f64,
    /// Mean `sum_k (p_k - [y = k])^2`.
    pub brier: f64,
    /// Expected calibration error over ten equal-width confidence bins.
    pub ece: f64,
    /// The reliability diagram: `(mean confidence, accuracy, rows)` per non-empty bin.
    pub bins: Vec<(f64, f64, usize)>,
}

impl ClassCalibration {
    /// Bins of the reliability diagram.
    pub const BINS: usize = 10;

    /// Scores `predictive` against `labels` (class indices).
    pub fn score(predictive: &ClassPredictive, labels: &[usize]) -> Self {
        let n = labels.len().max(1) as f64;
        let mut bins = vec![(0.0, 0.0, 0usize); Self::BINS];
        let (mut correct, mut ll, mut brier) = (0usize, 0.0, 0.0);
        for (r, &y) in labels.iter().enumerate() {
            let k = predictive.predicted[r];
            let confidence = predictive.probability(r, k);
            correct += usize::from(k == y);
            ll += predictive.probability(r, y).max(1e-300).ln();
            brier += (0..predictive.classes)
                .map(|c| (predictive.probability(r, c) - f64::from(u8::from(c == y))).powi(2))
                .sum::<f64>();
            let b = ((confidence * Self::BINS as f64) as usize).min(Self::BINS - 1);
            bins[b].0 += confidence;
            bins[b].1 += f64::from(u8::from(k == y));
            bins[b].2 += 1;
        }
        // sum_b (m_b / n) |mean confidence_b - accuracy_b| = sum_b |sum confidence - sum correct| / n.
        let ece = bins.iter().map(|(c, a, _)| (c - a).abs()).sum::<f64>() / n;
        let bins = bins.into_iter().filter(|b| b.2 > 0).map(|(c, a, m)| (c / m as f64, a / m as f64, m)).collect();
        Self { accuracy: correct as f64 / n, log_likelihood: ll / n, brier: brier / n, ece, bins }
    }
}

/// Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7): an erf independent of the tensors', for the
/// host references of this crate's tests.
#[cfg(test)]
pub(crate) fn erf_reference(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let poly =
        t * (0.254_829_592 + t * (-0.284_496_736 + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    (1.0 - poly * (-x * x).exp()).copysign(x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, TensorData};
    use rand::{RngExt, SeedableRng};
    use rand_distr::{Distribution, Normal};

    fn device() -> Device {
        parvi_model::BackendKind::Flex.device().unwrap()
    }

    fn t1(v: &[f64], d: &Device) -> Tensor<1> {
        Tensor::from_data(TensorData::new(v.iter().map(|&x| x as f32).collect(), [v.len()]), d)
    }

    fn t2(v: &[f64], rows: usize, cols: usize, d: &Device) -> Tensor<2> {
        Tensor::from_data(TensorData::new(v.iter().map(|&x| x as f32).collect(), [rows, cols]), d)
    }

    /// Moments and quantiles of a two-particle mixture against the closed forms.
    #[test]
    fn a_mixture_splits_its_variance_and_has_the_right_quantiles() {
        let d = device();
        // Row 0: components N(-1, 0.5^2) and N(3, 1^2) with weights 0.25, 0.75.
        // Row 1: both components at 2: a mixture of two Gaussians centred at 2.
        let means = t2(&[-1.0, 2.0, 3.0, 2.0], 2, 2, &d);
        let p = RegressionPredictive::from_mixture(means, t1(&[0.5, 1.0], &d), t1(&[0.25, 0.75], &d));
        let mean0 = -0.25 + 0.75 * 3.0;
        let epi0: f64 = 0.25 * (-1.0f64 - mean0).powi(2) + 0.75 * (3.0f64 - mean0).powi(2);
        let alea: f64 = 0.25 * 0.25 + 0.75 * 1.0;
        assert!((p.mean[0] - mean0).abs() < 1e-5 && (p.mean[1] - 2.0).abs() < 1e-5);
        assert!((p.epistemic_sd[0] - epi0.sqrt()).abs() < 1e-4 && p.epistemic_sd[1].abs() < 1e-3);
        assert!((p.aleatoric_sd[0] - alea.sqrt()).abs() < 1e-5);
        assert!((p.total_sd[0] - (epi0 + alea).sqrt()).abs() < 1e-4);
        // Row 1 is symmetric about 2: median 2; the 5% and 95% quantiles are symmetric.
        assert!((p.quantiles[1][1] - 2.0).abs() < 1e-4);
        assert!((p.quantiles[0][1] + p.quantiles[2][1] - 4.0).abs() < 1e-4);
        // Row 0's quantiles solve the mixture CDF (host formula with an independent erf).
        let cdf = |y: f64| {
            let phi = |z: f64| 0.5 * (1.0 + erf_reference(z / std::f64::consts::SQRT_2));
            0.25 * phi((y + 1.0) / 0.5) + 0.75 * phi(y - 3.0)
        };
        for (level, q) in RegressionPredictive::LEVELS.iter().zip(&p.quantiles) {
            assert!((cdf(q[0]) - level).abs() < 1e-4, "level {level}: F({}) = {}", q[0], cdf(q[0]));
        }
    }

    /// A diverged draw (an infinite noise sd, or an infinite mean) among finite ones leaves the
    /// quantiles finite where the others bound them: the mixture's CDF at each is the level
    /// (the infinite-sd component adds its constant 1/2 times its weight); a row whose every
    /// component is unbounded has no finite quantile, and says NaN.
    #[test]
    fn a_diverged_component_leaves_the_quantiles_finite() {
        let d = device();
        // Three components, rows as columns: N(0, 1), N(1, inf), N(inf or 2, 1) with weights
        // 0.49, 0.02, 0.49; row 1 has its third component at +inf.
        let means = t2(&[0.0, 0.0, 1.0, 1.0, 2.0, f64::INFINITY], 3, 2, &d);
        let sd = t1(&[1.0, f64::INFINITY, 1.0], &d);
        let p = RegressionPredictive::from_mixture(means, sd, t1(&[0.49, 0.02, 0.49], &d));
        let phi = |z: f64| 0.5 * (1.0 + erf_reference(z / std::f64::consts::SQRT_2));
        // The infinite-sd component adds 0.02 * 1/2; row 1's infinite mean adds nothing.
        let cdf = |row: usize, y: f64| 0.49 * phi(y) + 0.01 + if row == 0 { 0.49 * phi(y - 2.0) } else { 0.0 };
        for (level, q) in RegressionPredictive::LEVELS.iter().zip(&p.quantiles) {
            for (row, &q) in q.iter().enumerate() {
                // Row 1's CDF stays below 0.5 at every finite y (it reaches 0.5 in f32 past 5
                // sd): its 95% quantile is +inf, which the bisection's bracket (the finite
                // component's 8 sd) reports as its top.
                if *level > 0.9 && row == 1 {
                    assert!(q.is_finite() && q >= 7.9, "level {level} row {row}: {}", q);
                    continue;
                }
                assert!(q.is_finite(), "level {level} row {row}: {}", q);
                let f = cdf(row, q);
                assert!((f - level).abs() < 1e-4, "level {level} row {row}: F({}) = {f}", q);
            }
        }
        // No bounded component at all: NaN, not a number made up.
        let lost = RegressionPredictive::from_mixture(t2(&[0.0], 1, 1, &d), t1(&[f64::INFINITY], &d), t1(&[1.0], &d));
        assert!(lost.quantiles.iter().all(|q| q[0].is_nan()), "{:?}", lost.quantiles);
    }

    /// The quantiles of the means alone: weighted order statistics, inside the means' range.
    #[test]
    fn mean_quantiles_are_weighted_order_statistics_of_the_means() {
        let d = device();
        // Row 0: means 5, -1, 2, 9 with weights 0.1, 0.2, 0.3, 0.4 (sorted: -1 (0.2), 2 (0.5),
        // 5 (0.6), 9 (1.0) cumulative). Row 1: every mean 7.
        let means = t2(&[5.0, 7.0, -1.0, 7.0, 2.0, 7.0, 9.0, 7.0], 4, 2, &d);
        let m = Mixture::new(means, t1(&[1.0; 4], &d), t1(&[0.1, 0.2, 0.3, 0.4], &d));
        assert_eq!(m.mean_quantile(0.05), vec![-1.0, 7.0]);
        assert_eq!(m.mean_quantile(0.5), vec![2.0, 7.0]);
        assert_eq!(m.mean_quantile(0.55), vec![5.0, 7.0]);
        assert_eq!(m.mean_quantile(0.95), vec![9.0, 7.0]);
    }

    /// Targets drawn from the predictive itself are covered 90% of the time and have a small
    /// calibration error; a predictive half as wide covers far less. With 4000 rows the
    /// coverage's Monte Carlo sd is sqrt(0.09 / 4000) = 0.0047: 4 sd is 0.019.
    #[test]
    fn a_calibrated_predictive_covers_ninety_percent() {
        let d = device();
        let rows = 4000;
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let centres: Vec<f64> = (0..rows).map(|r| (r as f64 * 0.01).sin()).collect();
        // Two particles at centre -+ 0.5 with noise sd 1, equal weights.
        let means: Vec<f64> = centres.iter().map(|c| c - 0.5).chain(centres.iter().map(|c| c + 0.5)).collect();
        let noise = Normal::new(0.0, 1.0).unwrap();
        let y: Vec<f64> = centres
            .iter()
            .map(|c| c + if rng.random::<bool>() { 0.5 } else { -0.5 } + noise.sample(&mut rng))
            .collect();
        let mixture = Mixture::new(t2(&means, 2, rows, &d), t1(&[1.0, 1.0], &d), t1(&[0.5, 0.5], &d));
        let cal = RegressionCalibration::of_mixture(&mixture, t1(&y, &d));
        assert!((cal.coverage_90 - 0.9).abs() < 0.019, "coverage {}", cal.coverage_90);
        assert!(cal.calibration_error < 0.02, "calibration error {}", cal.calibration_error);
        let narrow = Mixture::new(t2(&means, 2, rows, &d), t1(&[0.3, 0.3], &d), t1(&[0.5, 0.5], &d));
        let bad = RegressionCalibration::of_mixture(&narrow, t1(&y, &d));
        assert!(bad.coverage_90 < 0.75 && bad.calibration_error > 0.05, "{bad:?}");
    }

    #[test]
    fn class_predictive_entropy_and_calibration() {
        let d = device();
        // Two particles that disagree on row 0 (epistemic) and agree on a coin flip on row 1.
        let probs =
            Tensor::<3>::from_data(TensorData::new(vec![0.9f32, 0.1, 0.5, 0.5, 0.1, 0.9, 0.5, 0.5], [2, 2, 2]), &d);
        let p = ClassPredictive::from_particles(probs, t1(&[0.5, 0.5], &d));
        let ln2 = std::f64::consts::LN_2;
        assert!((p.probability(0, 0) - 0.5).abs() < 1e-6);
        assert!((p.entropy[0] - ln2).abs() < 1e-5 && (p.entropy[1] - ln2).abs() < 1e-5);
        let h09 = -(0.9f64 * 0.9f64.ln() + 0.1 * 0.1f64.ln());
        assert!((p.mutual_information[0] - (ln2 - h09)).abs() < 1e-5);
        assert!(p.mutual_information[1].abs() < 1e-6);
        // Confidence 0.5 on both rows, one right: accuracy 0.5, ECE 0, Brier 0.5.
        let cal = ClassCalibration::score(&p, &[p.predicted[0], 1 - p.predicted[1]]);
        assert!((cal.accuracy - 0.5).abs() < 1e-12 && cal.ece.abs() < 1e-6 && (cal.brier - 0.5).abs() < 1e-6);
        // Overconfident: 0.9 confidence, always wrong: ECE 0.9.
        let sure = Tensor::<3>::from_data(TensorData::new(vec![0.9f32, 0.1, 0.9, 0.1], [1, 2, 2]), &d);
        let q = ClassPredictive::from_particles(sure, t1(&[1.0], &d));
        let cal = ClassCalibration::score(&q, &[1, 1]);
        assert!((cal.ece - 0.9).abs() < 1e-6 && cal.accuracy == 0.0);
        assert!((cal.log_likelihood - 0.1f64.ln()).abs() < 1e-6);
    }
}
