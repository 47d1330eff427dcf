//! KSD and MMD against values computed by hand on tiny sets.

mod common;

use common::flex;
use parvi_infer::evaluation::{Statistic, ksd_squared, mmd_squared, weighted_mmd_squared};
use parvi_infer::kernels::Rbf;
use parvi_model::burn::tensor::Tensor;
use parvi_model::tensor_ops::matrix_from_vec;

#[test]
fn mmd_matches_hand_computation() {
    let device = flex();
    // x = {0, 1}, y = {0}, 1-D, h = 1: k(a, b) = exp(-(a - b)^2 / 2).
    let x = matrix_from_vec(vec![0.0, 1.0], 2, 1, &device);
    let y = matrix_from_vec(vec![0.0, 2.0], 2, 1, &device);
    let k = Rbf::fixed(1.0).unwrap();
    let e = |d: f64| (-d * d / 2.0).exp();
    // V: mean Kxx = (2 + 2 e(1)) / 4, mean Kyy = (2 + 2 e(2)) / 4, mean Kxy = (1 + e(2) + e(1) + e(1)) / 4
    let v = (2.0 + 2.0 * e(1.0)) / 4.0 + (2.0 + 2.0 * e(2.0)) / 4.0 - 2.0 * (1.0 + e(2.0) + 2.0 * e(1.0)) / 4.0;
    let got = mmd_squared(&k, x.clone(), y.clone(), Statistic::V).unwrap();
    assert!((got - v).abs() < 1e-6, "{got} vs {v}");
    // U: off-diagonal means only
    let u = e(1.0) + e(2.0) - 2.0 * (1.0 + e(2.0) + 2.0 * e(1.0)) / 4.0;
    let got = mmd_squared(&k, x.clone(), y.clone(), Statistic::U).unwrap();
    assert!((got - u).abs() < 1e-6, "{got} vs {u}");
    // Weighted with uniform weights equals the V-statistic.
    let w = Tensor::<1>::from_floats([0.5, 0.5], &device);
    let got = weighted_mmd_squared(&k, x, w.clone(), y, w).unwrap();
    assert!((got - v).abs() < 1e-6);
}

#[test]
fn ksd_matches_hand_computation() {
    let device = flex();
    // 1-D, standard normal target: s(x) = -x. Points {0, 1}, RBF h = 1.
    // k_p(x, y) = s(x)s(y)k + s(x) dk/dy + s(y) dk/dx + d2k/dxdy with k = exp(-(x-y)^2/2):
    // dk/dx = -(x-y)k, dk/dy = (x-y)k, d2k/dxdy = (1 - (x-y)^2) k.
    let kp = |x: f64, y: f64| {
        let k = (-(x - y) * (x - y) / 2.0).exp();
        let (sx, sy) = (-x, -y);
        sx * sy * k + sx * (x - y) * k + sy * (-(x - y)) * k + (1.0 - (x - y) * (x - y)) * k
    };
    let pts = [0.0, 1.0];
    let all: f64 = pts.iter().flat_map(|&a| pts.iter().map(move |&b| kp(a, b))).sum();
    let v = all / 4.0;
    let u = (kp(0.0, 1.0) + kp(1.0, 0.0)) / 2.0;
    let x = matrix_from_vec(vec![0.0, 1.0], 2, 1, &device);
    let s = x.clone().neg();
    let k = Rbf::fixed(1.0).unwrap();
    let got_v = ksd_squared(&k, x.clone(), s.clone(), Statistic::V).unwrap();
    let got_u = ksd_squared(&k, x, s, Statistic::U).unwrap();
    assert!((got_v - v).abs() < 1e-6, "{got_v} vs {v}");
    assert!((got_u - u).abs() < 1e-6, "{got_u} vs {u}");
}

// ---- The stationarity check ----

use parvi_infer::evaluation::{StationarityConfig, mala_chains, stationarity_check};
use parvi_infer::{
    AdapterConfig, Diagnostics, EngineRng, EngineSpec, FitConfig, KernelConfig, MethodConfig, Particles, fit,
};
use parvi_model::tensor_ops::to_vec_f64;
use parvi_model::{LogDensity, Minibatch};

/// `N(mean, cov)` in 4-D with correlations up to 0.8 and sds from 0.5 to 3.
struct Correlated {
    mean: [f64; 4],
    cov: [[f64; 4]; 4],
}

impl Correlated {
    fn new() -> Self {
        let sd = [1.0, 0.5, 3.0, 2.0];
        let corr = [[1.0, 0.8, 0.3, 0.0], [0.8, 1.0, 0.5, 0.2], [0.3, 0.5, 1.0, -0.4], [0.0, 0.2, -0.4, 1.0]];
        let mut cov = [[0.0; 4]; 4];
        for i in 0..4 {
            for j in 0..4 {
                cov[i][j] = corr[i][j] * sd[i] * sd[j];
            }
        }
        Self { mean: [1.0, -2.0, 0.5, 3.0], cov }
    }

    /// The lower Cholesky factor of the covariance.
    fn cholesky(&self) -> [[f64; 4]; 4] {
        let mut l = [[0.0; 4]; 4];
        for i in 0..4 {
            for j in 0..=i {
                let s: f64 = (0..j).map(|k| l[i][k] * l[j][k]).sum();
                l[i][j] = if i == j { (self.cov[i][i] - s).sqrt() } else { (self.cov[i][j] - s) / l[j][j] };
            }
        }
        l
    }

    fn precision(&self) -> Vec<f32> {
        // Gauss-Jordan on the 4 x 4 covariance.
        let mut a: Vec<Vec<f64>> = (0..4)
            .map(|i| {
                (0..8)
                    .map(|j| {
                        if j < 4 {
                            self.cov[i][j]
                        } else if j - 4 == i {
                            1.0
                        } else {
                            0.0
                        }
                    })
                    .collect()
            })
            .collect();
        for c in 0..4 {
            let p = a[c][c];
            for v in a[c].iter_mut() {
                *v /= p;
            }
            for r in 0..4 {
                if r != c {
                    let (f, pivot) = (a[r][c], a[c].clone());
                    for (v, p) in a[r].iter_mut().zip(&pivot) {
                        *v -= f * p;
                    }
                }
            }
        }
        (0..4).flat_map(|i| (4..8).map(move |j| (i, j))).map(|(i, j)| a[i][j] as f32).collect()
    }

    /// `n` exact draws `[n, 4]`.
    fn draws(&self, n: usize, seed: u64) -> Vec<f64> {
        let l = self.cholesky();
        let mut rng = EngineRng::new(seed);
        let mut out = Vec::with_capacity(4 * n);
        for _ in 0..n {
            let z: Vec<f64> = (0..4).map(|_| rng.normal()).collect();
            // l is lower triangular: row i sums its first i + 1 terms.
            for (m, row) in self.mean.iter().zip(&l) {
                out.push(m + row.iter().zip(&z).map(|(a, b)| a * b).sum::<f64>());
            }
        }
        out
    }
}

impl LogDensity for Correlated {
    fn dim(&self) -> usize {
        4
    }
    fn log_prob(&self, x: Tensor<2>, _: Option<&Minibatch>) -> Tensor<1> {
        let [n, d] = x.dims();
        let device = x.device();
        let mean = Tensor::<1>::from_floats(self.mean.map(|m| m as f32), &device).reshape([1, d]);
        let precision = matrix_from_vec(self.precision(), d, d, &device);
        let c = x - mean;
        (c.clone().matmul(precision) * c).sum_dim(1).reshape([n]).mul_scalar(-0.5)
    }
}

fn particles(values: Vec<f64>, n: usize) -> Particles {
    let device = flex();
    Particles::new(matrix_from_vec(values.into_iter().map(|v| v as f32).collect(), n, 4, &device))
}

#[test]
fn mala_chains_keep_exact_draws_exact() {
    // 4000 exact draws through the check's chains: the end set's means and variances stay those
    // of the target within Monte Carlo error (4 se: sd/sqrt(n) for a mean, var sqrt(2/n) for a
    // variance). A wrong Metropolis-Hastings ratio (or none: the unadjusted Langevin step at the
    // adapted h ~ 1 inflates variances by about h / 4) would fail this.
    let target = Correlated::new();
    let n = 4000;
    let start = particles(target.draws(n, 11), n);
    let chains = mala_chains(&target, &start, &StationarityConfig::default()).unwrap();
    assert!(chains.acceptance > 0.3 && chains.acceptance < 0.9, "acceptance {}", chains.acceptance);
    let end = to_vec_f64(&chains.end);
    let begin = to_vec_f64(&chains.start);
    for j in 0..4 {
        let col: Vec<f64> = end.iter().skip(j).step_by(4).copied().collect();
        let mean = col.iter().sum::<f64>() / n as f64;
        let var = col.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n as f64;
        let truth = target.cov[j][j];
        assert!((mean - target.mean[j]).abs() < 4.0 * (truth / n as f64).sqrt(), "coordinate {j}: mean {mean}");
        assert!((var / truth - 1.0).abs() < 4.0 * (2.0 / n as f64).sqrt(), "coordinate {j}: var {var} vs {truth}");
        // The chains moved: start and end are nearly uncorrelated after 150 steps.
        let start_col: Vec<f64> = begin.iter().skip(j).step_by(4).copied().collect();
        let m0 = start_col.iter().sum::<f64>() / n as f64;
        let cov = start_col.iter().zip(&col).map(|(a, b)| (a - m0) * (b - mean)).sum::<f64>() / n as f64;
        let corr = cov / (var * target.cov[j][j]).sqrt();
        assert!(corr.abs() < 0.2, "coordinate {j}: start-end correlation {corr}");
    }
}

#[test]
fn stationarity_check_passes_exact_draws() {
    // 100 exact draws (the default particle count): every |z| below the Bonferroni threshold.
    // Under the null this fails with probability at most 1% per seed; the seeds are fixed.
    let target = Correlated::new();
    for seed in [1, 2, 3] {
        let s =
            stationarity_check(&target, &particles(target.draws(100, seed), 100), &Default::default(), None).unwrap();
        assert!(!s.inconclusive && !s.rejected(), "seed {seed}: {s:?}");
        assert!(s.acceptance > 0.3, "{s:?}");
        assert_eq!(s.score_evals, 100 * 201);
    }
}

#[test]
fn stationarity_check_names_a_shifted_or_shrunk_coordinate() {
    // The same draws with one coordinate moved by 1 sd, or shrunk to half its sd: the chains
    // move it back, z ~ 1 / sqrt(2 / 100) = 7 for the mean and ln 2 / sqrt(2 / 200) = 7 for the
    // log sd, against a threshold of 3.2 (d = 4, 1%).
    let target = Correlated::new();
    let draws = target.draws(100, 1);
    for j in 0..4 {
        let sd = target.cov[j][j].sqrt();
        let shifted: Vec<f64> = draws.iter().enumerate().map(|(i, v)| if i % 4 == j { v + sd } else { *v }).collect();
        let s = stationarity_check(&target, &particles(shifted, 100), &Default::default(), None).unwrap();
        assert!(s.rejected() && s.coordinate == j, "shift of {j}: {s:?}");
        assert!(s.mean_shift_sd < -0.6 && s.max_z_mean > 4.5, "shift of {j}: {s:?}");
        // The same through the diagnostics of a run made without `fit`: a warning naming it.
        let mut d = Diagnostics::default();
        let shifted =
            particles(draws.iter().enumerate().map(|(i, v)| if i % 4 == j { v + sd } else { *v }).collect(), 100);
        d.add_stationarity("svgd", &target, &shifted, &Default::default()).unwrap();
        let w = d.warnings.join("; ");
        assert!(w.contains("svgd did not end at the target") && w.contains(&format!("coordinate {j} ")), "{w}");

        let mean = target.mean[j];
        let shrunk: Vec<f64> =
            draws.iter().enumerate().map(|(i, v)| if i % 4 == j { mean + 0.5 * (v - mean) } else { *v }).collect();
        let s = stationarity_check(&target, &particles(shrunk, 100), &Default::default(), None).unwrap();
        assert!(s.rejected() && s.coordinate == j, "shrink of {j}: {s:?}");
        assert!(s.sd_ratio > 1.5 && s.max_z_log_sd > 4.5, "shrink of {j}: {s:?}");
    }
}

#[test]
fn stationarity_check_resamples_a_weighted_set() {
    // Exact draws with equal weights pass (resampled multinomially: Kish's effective size of the
    // counts is about n / 2 = 100); a weighted set that puts 90% of its mass on the draws above the median of one
    // coordinate fails and names it.
    let target = Correlated::new();
    let device = flex();
    let draws = target.draws(200, 4);
    let mut equal = particles(draws.clone(), 200);
    equal.weights = Some(Tensor::<1>::ones([200], &device).div_scalar(200.0));
    let s = stationarity_check(&target, &equal, &Default::default(), None).unwrap();
    assert!(!s.rejected() && s.effective_size < 150.0 && s.effective_size > 80.0, "{s:?}");

    let mut column: Vec<f64> = draws.iter().skip(2).step_by(4).copied().collect();
    column.sort_by(f64::total_cmp);
    let median = column[100];
    let w: Vec<f32> = draws.iter().skip(2).step_by(4).map(|v| if *v >= median { 0.9 } else { 0.1 }).collect();
    let total: f32 = w.iter().sum();
    let mut tilted = particles(draws, 200);
    tilted.weights =
        Some(Tensor::<1>::from_floats(w.iter().map(|v| v / total).collect::<Vec<_>>().as_slice(), &device));
    let s = stationarity_check(&target, &tilted, &Default::default(), None).unwrap();
    assert!(s.rejected() && s.coordinate == 2, "{s:?}");
}

/// `sum_j -x_j^2 / 2 + 3 sin(3000 x_j)`: ripples far narrower than the spread, which MALA can
/// cross only with steps below the check's smallest.
struct Rippled;

impl LogDensity for Rippled {
    fn dim(&self) -> usize {
        2
    }
    fn log_prob(&self, x: Tensor<2>, _: Option<&Minibatch>) -> Tensor<1> {
        let n = x.dims()[0];
        (x.clone().powi_scalar(2).mul_scalar(-0.5) + x.mul_scalar(3000.0).sin().mul_scalar(3.0)).sum_dim(1).reshape([n])
    }
}

#[test]
fn stationarity_check_says_when_it_cannot_judge() {
    let device = flex();
    let mut rng = EngineRng::new(5);
    let start = Particles::gaussian(100, 2, 0.0, 1.0, &mut rng, &device).unwrap();
    let s = stationarity_check(&Rippled, &start, &Default::default(), None).unwrap();
    assert!(s.inconclusive && !s.rejected(), "{s:?}");
}

#[test]
fn stationarity_settings_are_checked_by_name() {
    let device = flex();
    let target = Correlated::new();
    let spec = EngineSpec::new(
        MethodConfig::default_for("svgd").unwrap(),
        KernelConfig::default(),
        AdapterConfig::adagrad(0.05),
    );
    for (config, name) in [
        (FitConfig { check_level: 1.5, steps: 5, ..Default::default() }, "check-level"),
        (FitConfig { check_steps: 3, steps: 5, ..Default::default() }, "check-steps"),
    ] {
        let err = fit(&target, &spec, &config, &mut [], &device).err().expect("refused").to_string();
        assert!(err.contains(name), "{err}");
    }
    // Too few particles for the check is an error of the check alone, by name.
    let few = particles(target.draws(3, 1), 3);
    let err = stationarity_check(&target, &few, &Default::default(), None).err().unwrap().to_string();
    assert!(err.contains("particles"), "{err}");
}

#[test]
fn fit_runs_the_check_on_particle_engines_only() {
    // SVGD on the correlated Gaussian through the default path: the check ran (its evaluations
    // are counted) and found nothing; SGLD (an MCMC engine, judged by R-hat) has no check.
    let device = flex();
    let target = Correlated::new();
    let spec = |m: &str| {
        EngineSpec::new(MethodConfig::default_for(m).unwrap(), KernelConfig::default(), AdapterConfig::adagrad(0.05))
    };
    let config = FitConfig { steps: 500, ..Default::default() };
    let r = fit(&target, &spec("svgd"), &config, &mut [], &device).unwrap();
    let s = r.diagnostics.stationarity.as_ref().expect("checked");
    assert!(!s.rejected() && !s.inconclusive, "{s:?}");
    assert!(r.density_evals >= 100 * (500 + 201), "{}", r.density_evals);
    let r = fit(&target, &spec("sgld"), &config, &mut [], &device).unwrap();
    assert!(r.diagnostics.stationarity.is_none());
    let off = FitConfig { check_steps: 0, ..config };
    assert!(fit(&target, &spec("svgd"), &off, &mut [], &device).unwrap().diagnostics.stationarity.is_none());
}
