//! The BNN-uncertainty engines: the deep ensemble's particles are independent MAP points that
//! do not repel, and the function-space engine's push-back through the network's Jacobian
//! equals finite differences of an independent `f64` network.

mod common;

use common::{flex, host};
use parvi_infer::engines::{
    FunctionSpaceConfig, PairMixing, PriorSpace, Repulsion, function_prior_score, function_space_direction,
    gaussian_repulsion, pair_points,
};
use parvi_infer::{AdapterConfig, EngineRng, EngineSpec, KernelConfig, MethodConfig, Particles, RunConfig, Runner};
use parvi_model::density::FunctionMap;
use parvi_model::layers::Activation;
use parvi_model::tensor_ops::matrix_from_vec;
use parvi_model::{LogDensity, Minibatch, score};
use parvi_models::builtin::{GAUSSIAN_COV, GAUSSIAN_MEAN};
use parvi_models::{Bnn, BnnConfig, Gaussian, WeightPrior};

fn engine(name: &str, lr: f64) -> Box<dyn parvi_infer::Engine> {
    let spec =
        EngineSpec::new(MethodConfig::default_for(name).unwrap(), KernelConfig::default(), AdapterConfig::sgd(lr));
    spec.build().unwrap()
}

/// Every member climbs to the mode of the correlated Gaussian (its MAP point) on its own, and
/// moving one member changes no other member's step: no kernel, no repulsion. SVGD from the
/// same starts spreads out instead.
#[test]
fn ensemble_members_are_map_points_that_do_not_repel() {
    let device = flex();
    let target = Gaussian::new(&GAUSSIAN_MEAN, &GAUSSIAN_COV, &device).unwrap();
    let starts = vec![3.0f32, -2.0, -1.5, 2.5, 0.5, 0.5, 4.0, 4.0];
    let run = |name: &str, starts: Vec<f32>, steps: usize| {
        let mut e = engine(name, 0.2);
        let start = Particles::from_rows(starts, 4, 2, &device).unwrap();
        host(
            &Runner::new(e.as_mut(), &target, start, RunConfig::new(steps, 0))
                .unwrap()
                .run(&mut [])
                .unwrap()
                .particles
                .positions,
        )
    };
    // Gradient ascent on a Gaussian with step 0.2 contracts by at least (1 - 0.2 / lambda_max)
    // a step; 400 steps leave far below 1e-3 of the distance.
    let end = run("ensemble", starts.clone(), 400);
    for p in end.chunks(2) {
        for (v, m) in p.iter().zip(GAUSSIAN_MEAN) {
            assert!((f64::from(*v) - m).abs() < 1e-3, "member {p:?} is not at the mode {GAUSSIAN_MEAN:?}");
        }
    }
    // One step from two sets that differ in member 0 only: members 1..4 move identically.
    let one = run("ensemble", starts.clone(), 1);
    let mut moved = starts.clone();
    moved[0] = -7.0;
    let other = run("ensemble", moved, 1);
    assert_eq!(&one[2..], &other[2..], "an ensemble member's step depends on another member");
    // SVGD's members do see each other.
    let mut moved = starts.clone();
    moved[0] = -7.0;
    assert_ne!(&run("svgd", starts, 1)[2..], &run("svgd", moved, 1)[2..]);
}

/// A tiny regression BNN (1 input, 3 tanh units, fixed lambda) on 4 rows, 3 particles.
fn tiny_bnn() -> (Bnn, Vec<f64>, Vec<f64>) {
    let device = flex();
    let x = vec![-1.0, -0.3, 0.4, 1.2];
    let y = vec![0.5, -0.2, 0.1, 0.9];
    let config = BnnConfig {
        hidden: vec![3],
        activation: Activation::Tanh,
        prior: WeightPrior::Fixed(1.0),
        ..BnnConfig::default()
    };
    let bnn = Bnn::from_config(&x, &y, 1, &config, &device).unwrap();
    // w1 [3, 1], b1 [3], w2 [3], b2, log gamma: 11 coordinates per particle.
    let particles = vec![
        0.8, -0.5, 1.1, 0.1, -0.2, 0.3, 0.7, -1.2, 0.4, 0.05, 0.2, //
        -0.4, 0.9, 0.6, -0.3, 0.2, 0.0, -0.8, 0.5, 1.0, -0.1, -0.3, //
        1.3, 0.2, -0.7, 0.0, 0.4, -0.5, 0.3, 0.9, -0.6, 0.2, 0.1,
    ];
    (bnn, x, particles)
}

/// The network in plain `f64`, independent of the layers: `sum_j w2_j tanh(w1_j x + b1_j) + b2`
/// with `theta = (w1[3], b1[3], w2[3], b2, log gamma)`.
fn net(theta: &[f64], x: f64) -> f64 {
    (0..3).map(|j| theta[6 + j] * (theta[j] * x + theta[3 + j]).tanh()).sum::<f64>() + theta[9]
}

#[test]
fn function_space_push_back_equals_finite_differences() {
    let device = flex();
    let (bnn, _, theta) = tiny_bnn();
    assert_eq!(bnn.dim(), 11);
    let (n, dim) = (3, 11);
    let points_host = [-2.0, -0.5, 0.3, 1.0, 2.5];
    let m = points_host.len();
    let points = matrix_from_vec(points_host.iter().map(|&v| v as f32).collect(), m, 1, &device);
    let x = matrix_from_vec(theta.iter().map(|&v| v as f32).collect(), n, dim, &device);
    let (x_plain, points_plain) = (x.clone(), points.clone());
    let map: &dyn FunctionMap = bnn.function_map().unwrap();
    let kde = FunctionSpaceConfig { repulsion: Repulsion::Kde, ..FunctionSpaceConfig::default() };
    let step = function_space_direction(&bnn, map, x.clone(), None, points, &kde, None).unwrap();
    let push_back: Vec<f64> =
        host(&(step.direction - score(&bnn, x, None).unwrap().grad)).into_iter().map(f64::from).collect();

    // The repulsion in f64: outputs, the median rule h^2 = med / (2 ln(n + 1)) over all n^2
    // squared distances (9, odd: the 5th smallest), rho_i = (f_i - sum_j w_ij f_j) / h^2.
    let f: Vec<Vec<f64>> =
        (0..n).map(|i| points_host.iter().map(|&p| net(&theta[i * dim..(i + 1) * dim], p)).collect()).collect();
    let sq = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(u, v)| (u - v).powi(2)).sum::<f64>();
    // The network's outputs are the f64 network's (the layout read right).
    let got_f = host(&map.function_values(x_plain.clone(), points_plain.clone()));
    for i in 0..n {
        for p in 0..m {
            let (g, w) = (f64::from(got_f[i * m + p]), f[i][p]);
            assert!((g - w).abs() < 1e-5 * (1.0 + w.abs()), "f[{i}][{p}] {g} vs {w}");
        }
    }
    let mut all: Vec<f64> = (0..n).flat_map(|i| (0..n).map(move |j| (i, j))).map(|(i, j)| sq(&f[i], &f[j])).collect();
    all.sort_by(f64::total_cmp);
    let h2 = all[4] / (2.0 * 4f64.ln());
    let got_h2 = step.h2.unwrap();
    assert!((got_h2 - h2).abs() < 1e-4 * h2, "h^2 {got_h2} vs {h2}");
    let rho: Vec<Vec<f64>> = (0..n)
        .map(|i| {
            let k: Vec<f64> = (0..n).map(|j| (-sq(&f[i], &f[j]) / (2.0 * h2)).exp()).collect();
            let total: f64 = k.iter().sum();
            (0..m).map(|p| (f[i][p] - (0..n).map(|j| k[j] * f[j][p]).sum::<f64>() / total) / h2).collect()
        })
        .collect();
    let got_rho = host(&step.repulsion);
    for i in 0..n {
        for p in 0..m {
            let (g, w) = (f64::from(got_rho[i * m + p]), rho[i][p]);
            assert!((g - w).abs() < 1e-3 * (1.0 + w.abs()), "rho[{i}][{p}] {g} vs {w}");
        }
    }
    // J_i^T rho_i by central differences of <f(theta_i), rho_i> (f64, step 1e-5: error ~1e-10).
    let eps = 1e-5;
    for i in 0..n {
        let base = &theta[i * dim..(i + 1) * dim];
        let g = |t: &[f64]| points_host.iter().zip(&rho[i]).map(|(&p, r)| net(t, p) * r).sum::<f64>();
        for c in 0..dim {
            let (mut up, mut down) = (base.to_vec(), base.to_vec());
            up[c] += eps;
            down[c] -= eps;
            let fd = (g(&up) - g(&down)) / (2.0 * eps);
            let got = push_back[i * dim + c];
            // f32 forward and backward: relative error ~1e-5 of the score's scale.
            assert!((got - fd).abs() < 2e-3 * (1.0 + fd.abs()), "particle {i} coordinate {c}: {got} vs {fd}");
        }
    }
}

/// The Gaussian repulsion, computed through the `n x n` Gram matrix, equals
/// `(S + delta I)^-1 (f_i - f_bar)` formed in `f64` in the `m`-dimensional output space, with
/// fewer particles than outputs (`S` singular without the ridge) and more.
#[test]
fn gaussian_repulsion_is_the_inverse_covariance_times_the_deviation() {
    let device = flex();
    for (n, m) in [(4usize, 6usize), (7, 3)] {
        let f: Vec<f64> = (0..n * m).map(|k| ((k * 37 % 11) as f64 - 5.0) * 0.3 + (k % m) as f64).collect();
        let ridge = 0.3;
        let got = host(
            &gaussian_repulsion(matrix_from_vec(f.iter().map(|&v| v as f32).collect(), n, m, &device), ridge).unwrap(),
        );
        let mean: Vec<f64> = (0..m).map(|p| (0..n).map(|i| f[i * m + p]).sum::<f64>() / n as f64).collect();
        let c: Vec<f64> = (0..n * m).map(|k| f[k] - mean[k % m]).collect();
        let mut s = vec![0.0; m * m];
        for p in 0..m {
            for q in 0..m {
                s[p * m + q] = (0..n).map(|i| c[i * m + p] * c[i * m + q]).sum::<f64>() / (n - 1) as f64;
            }
        }
        let delta = ridge * (0..m).map(|p| s[p * m + p]).sum::<f64>() / (n - 1).min(m) as f64;
        let chol = parvi_model::linalg::host::Cholesky::factor(&s, m, delta).unwrap();
        for i in 0..n {
            let want = chol.solve(&c[i * m..(i + 1) * m]);
            for p in 0..m {
                let g = f64::from(got[i * m + p]);
                assert!(
                    (g - want[p]).abs() < 1e-3 * (1.0 + want[p].abs()),
                    "n {n} m {m} [{i}][{p}]: {g} vs {}",
                    want[p]
                );
            }
        }
    }
}

/// `fpovi` refuses a model that is not a function of inputs, naming itself; bad options are
/// named.
#[test]
fn function_space_needs_a_network_and_checks_its_options() {
    let device = flex();
    let target = Gaussian::new(&GAUSSIAN_MEAN, &GAUSSIAN_COV, &device).unwrap();
    let mut e = engine("fpovi", 0.1);
    let start = Particles::from_rows(vec![0.0, 1.0, 1.0, 0.0], 2, 2, &device).unwrap();
    let err = Runner::new(e.as_mut(), &target, start, RunConfig::new(2, 0)).unwrap().run(&mut []).err().unwrap();
    assert!(err.to_string().contains("fpovi"), "{err}");
    let bad = FunctionSpaceConfig { spread: -1.0, ..FunctionSpaceConfig::default() };
    let spec = EngineSpec::new(MethodConfig::Fpovi(bad), KernelConfig::default(), AdapterConfig::default());
    assert!(spec.build().err().unwrap().to_string().contains("spread"));
    let bad = FunctionSpaceConfig { ridge: 0.0, ..FunctionSpaceConfig::default() };
    let spec = EngineSpec::new(MethodConfig::Fpovi(bad), KernelConfig::default(), AdapterConfig::default());
    assert!(spec.build().err().unwrap().to_string().contains("ridge"));
    let bad = FunctionSpaceConfig { prior_ridge: -1.0, ..FunctionSpaceConfig::default() };
    let spec = EngineSpec::new(MethodConfig::Fpovi(bad), KernelConfig::default(), AdapterConfig::default());
    assert!(spec.build().err().unwrap().to_string().contains("prior-ridge"));
    let bad = FunctionSpaceConfig { prior: PriorSpace::Function, prior_draws: 1, ..FunctionSpaceConfig::default() };
    let spec = EngineSpec::new(MethodConfig::Fpovi(bad), KernelConfig::default(), AdapterConfig::default());
    assert!(spec.build().err().unwrap().to_string().contains("prior-draws"));
    let imq = KernelConfig::Imq { c: 1.0, beta: -0.5 };
    for name in ["fpovi", "ensemble"] {
        let spec = EngineSpec::new(MethodConfig::default_for(name).unwrap(), imq.clone(), AdapterConfig::default());
        assert!(spec.build().err().unwrap().to_string().contains("`kernel`"), "{name}");
    }
}

/// On the tiny network with its 4 rows, function-space particles run with minibatches and stay
/// finite with either estimate of their density; their measurement points include draws beyond
/// the data.
#[test]
fn function_space_particles_run_on_a_bnn() {
    let device = flex();
    let (bnn, _, theta) = tiny_bnn();
    for repulsion in [Repulsion::Gaussian, Repulsion::Kde] {
        let config = FunctionSpaceConfig { repulsion, ..FunctionSpaceConfig::default() };
        let spec = EngineSpec::new(MethodConfig::Fpovi(config), KernelConfig::default(), AdapterConfig::sgd(0.01));
        let mut e = spec.build().unwrap();
        let start = Particles::from_rows(theta.iter().map(|&v| v as f32).collect(), 3, 11, &device).unwrap();
        let config = RunConfig { batch_size: Some(2), ..RunConfig::new(50, 3) };
        let out = Runner::new(e.as_mut(), &bnn, start, config).unwrap().run(&mut []).unwrap();
        assert!(host(&out.particles.positions).iter().all(|v| v.is_finite()), "{repulsion:?}");
        // The kernel density reports its bandwidth; the Gaussian has none.
        assert_eq!(e.report()["last_h2"].as_f64().is_some_and(|h2| h2 > 0.0), repulsion == Repulsion::Kde);
    }
}

/// Six training rows in 2-D, feature 0 near 0 (three rows) or near 1 (three rows): no row in the
/// middle third of feature 0, and every coordinate distinct so that each pair's segment is its own.
const GAP_ROWS: [[f64; 2]; 6] = [[0.0, 0.3], [0.1, -1.7], [0.05, 2.9], [1.0, 0.8], [0.9, -2.6], [0.95, 1.9]];

/// The pairs `(i, j, r_i, r_j)`, `i > j`, of `GAP_ROWS`.
fn gap_pairs() -> impl Iterator<Item = (usize, usize, [f64; 2], [f64; 2])> {
    GAP_ROWS.iter().enumerate().flat_map(|(i, &a)| GAP_ROWS[..i].iter().enumerate().map(move |(j, &b)| (i, j, a, b)))
}

/// For each pair `(i, j)` of `GAP_ROWS`: the position of `p` along `j -> i` by each feature
/// (`p_k = r_jk + t_k (r_ik - r_jk)`).
fn positions(p: [f64; 2]) -> Vec<(usize, usize, [f64; 2])> {
    gap_pairs().map(|(i, j, a, b)| (i, j, [0, 1].map(|k| (p[k] - b[k]) / (a[k] - b[k])))).collect()
}

/// Pair measurement points mix two distinct training rows: with one `lambda` per point each
/// lies on a pair's segment (both features give the same position along it, within f32
/// rounding), at a position uniform on `[0, 1]`, every pair drawn equally often; with one
/// `lambda` per feature inside a pair's box. Either way a pair across the gap with feature 0 at
/// `a` and `b` puts its point in the middle third `(1/3, 2/3)` with probability
/// `(1/3) / |b - a|`, and the fraction of points there is that averaged over the 15 pairs
/// (0.2 if the sides were exactly 0 and 1), where no training row is. 4000 points from seed 7;
/// tolerances 4.5 standard errors of the binomial and uniform means.
#[test]
fn pair_points_lie_between_two_training_rows_and_fill_the_gap() {
    let device = flex();
    let rows: Vec<f32> = GAP_ROWS.iter().flatten().map(|&v| v as f32).collect();
    let rows = matrix_from_vec(rows, 6, 2, &device);
    let count = 4000;
    let expect_gap: f64 = gap_pairs()
        .filter(|(_, _, a, b)| (a[0] < 0.5) != (b[0] < 0.5))
        .map(|(_, _, a, b)| (1.0 / 3.0) / (a[0] - b[0]).abs() / 15.0)
        .sum();
    for mixing in [PairMixing::Row, PairMixing::Feature] {
        let mut rng = EngineRng::new(7);
        let points = host(&pair_points(rows.clone(), count, mixing, &mut rng).unwrap());
        assert_eq!(points.len(), count * 2);
        let (mut in_gap, mut t_sum, mut pair_hits) = (0usize, 0.0, vec![0usize; 36]);
        for p in points.chunks(2) {
            let p = [p[0] as f64, p[1] as f64];
            in_gap += usize::from(p[0] > 1.0 / 3.0 && p[0] < 2.0 / 3.0);
            let within = |t: f64| (-1e-4..=1.0 + 1e-4).contains(&t);
            let found = positions(p).into_iter().filter(|(_, _, t)| within(t[0]) && within(t[1]));
            if mixing == PairMixing::Row {
                // On the segment: the one pair whose two positions agree (the nearest if two
                // segments cross near the point).
                let best = found.min_by(|x, y| (x.2[0] - x.2[1]).abs().total_cmp(&(y.2[0] - y.2[1]).abs()));
                let (i, j, t) = best.unwrap_or_else(|| panic!("{p:?} lies between no two rows"));
                assert!((t[0] - t[1]).abs() < 1e-4, "{p:?} is off every segment (nearest {i}, {j}: {t:?})");
                t_sum += t[1];
                pair_hits[i * 6 + j] += 1;
            } else {
                assert!(found.count() > 0, "{p:?} lies in no pair's box");
            }
        }
        let frac = in_gap as f64 / count as f64;
        let se = (expect_gap * (1.0 - expect_gap) / count as f64).sqrt();
        assert!((frac - expect_gap).abs() < 4.5 * se, "{mixing:?}: {frac} of the points in the gap, want {expect_gap}");
        if mixing == PairMixing::Row {
            let t_mean = t_sum / count as f64;
            let se = (1.0 / 12.0 / count as f64).sqrt();
            assert!((t_mean - 0.5).abs() < 4.5 * se, "mean position {t_mean} along the segments");
            let expect = count as f64 / 15.0;
            let se = (expect * 14.0 / 15.0).sqrt();
            for (k, &h) in pair_hits.iter().enumerate().filter(|(k, _)| k / 6 > k % 6) {
                assert!((h as f64 - expect).abs() < 4.5 * se, "pair {k}: {h} points, want {expect}");
            }
        }
    }
    // One row has no pair: the error names the option.
    let mut rng = EngineRng::new(7);
    let err = pair_points(rows.narrow(0, 0, 1), 3, PairMixing::Row, &mut rng).err().unwrap();
    assert!(err.to_string().contains("pair-points"), "{err}");
}

/// Through the engine: pair points with minibatches of 2 rows run and stay finite; with
/// minibatches of 1 row the run stops with an error naming `pair-points`; with no points of
/// any kind the config is refused.
#[test]
fn function_space_pair_points_run_and_check_the_minibatch() {
    let device = flex();
    let (bnn, _, theta) = tiny_bnn();
    let run = |batch: usize| {
        let config = FunctionSpaceConfig { extra_points: 0, pair_points: 5, ..FunctionSpaceConfig::default() };
        let spec = EngineSpec::new(MethodConfig::Fpovi(config), KernelConfig::default(), AdapterConfig::sgd(0.01));
        let mut e = spec.build().unwrap();
        let start = Particles::from_rows(theta.iter().map(|&v| v as f32).collect(), 3, 11, &device).unwrap();
        let config = RunConfig { batch_size: Some(batch), ..RunConfig::new(50, 3) };
        Runner::new(e.as_mut(), &bnn, start, config).unwrap().run(&mut []).map(|out| host(&out.particles.positions))
    };
    assert!(run(2).unwrap().iter().all(|v| v.is_finite()));
    let err = run(1).err().unwrap();
    assert!(err.to_string().contains("pair-points"), "{err}");
    let none = FunctionSpaceConfig { batch_points: 0, extra_points: 0, ..FunctionSpaceConfig::default() };
    let spec = EngineSpec::new(MethodConfig::Fpovi(none), KernelConfig::default(), AdapterConfig::default());
    assert!(spec.build().err().unwrap().to_string().contains("pair-points"));
}

/// `m x m` sample covariance (divisor `rows - 1`) and mean of the rows of `f` `[rows, m]`, in f64.
fn moments(f: &[f64], rows: usize, m: usize) -> (Vec<f64>, Vec<f64>) {
    let mean: Vec<f64> = (0..m).map(|p| (0..rows).map(|i| f[i * m + p]).sum::<f64>() / rows as f64).collect();
    let mut s = vec![0.0; m * m];
    for p in 0..m {
        for q in 0..m {
            s[p * m + q] =
                (0..rows).map(|i| (f[i * m + p] - mean[p]) * (f[i * m + q] - mean[q])).sum::<f64>() / (rows - 1) as f64;
        }
    }
    (mean, s)
}

/// The function-space prior's score is `-(S_p + delta_p I)^-1 (f_i - mu_p)` with the prior
/// networks' mean and covariance, `delta_p = ridge tr(S_p) / m`, formed in f64.
#[test]
fn function_prior_score_is_the_fitted_gaussians_score() {
    let device = flex();
    let (n, k, m) = (3usize, 9usize, 4usize);
    let prior: Vec<f64> = (0..k * m).map(|v| ((v * 29 % 13) as f64 - 6.0) * 0.4 + (v % m) as f64 * 0.5).collect();
    let f: Vec<f64> = (0..n * m).map(|v| ((v * 7 % 5) as f64 - 2.0) * 0.9).collect();
    let ridge = 0.05;
    let to = |v: &[f64], r| matrix_from_vec(v.iter().map(|&x| x as f32).collect(), r, m, &device);
    let got = host(&function_prior_score(to(&f, n), to(&prior, k), ridge).unwrap());
    let (mu, s) = moments(&prior, k, m);
    let delta = ridge * (0..m).map(|p| s[p * m + p]).sum::<f64>() / m as f64;
    let chol = parvi_model::linalg::host::Cholesky::factor(&s, m, delta).unwrap();
    for i in 0..n {
        let dev: Vec<f64> = (0..m).map(|p| f[i * m + p] - mu[p]).collect();
        let want = chol.solve(&dev);
        for p in 0..m {
            let g = f64::from(got[i * m + p]);
            assert!((g + want[p]).abs() < 1e-3 * (1.0 + want[p].abs()), "[{i}][{p}]: {g} vs {}", -want[p]);
        }
    }
    assert!(function_prior_score(to(&f, n), to(&prior[..m], 1), ridge).is_err(), "one prior network");
}

/// With `prior = "function"` the direction is the likelihood's score (the weights' `N(0, 1)`
/// prior and the noise precision's `Gamma(1, 0.1)` taken out) plus `J_i^T` (the function
/// prior's score minus the repulsion): against the weight-space direction at the same points,
/// the difference is `J_i^T s_i - grad log prior(theta_i)`, with `J_i^T s_i` by central
/// differences of the f64 network.
#[test]
fn function_prior_direction_swaps_the_weight_prior_for_the_function_prior() {
    let device = flex();
    let (bnn, _, theta) = tiny_bnn();
    let (n, dim) = (3, 11);
    let points_host = [-2.0, -0.5, 0.3, 1.0, 2.5];
    let m = points_host.len();
    let points = matrix_from_vec(points_host.iter().map(|&v| v as f32).collect(), m, 1, &device);
    let x = matrix_from_vec(theta.iter().map(|&v| v as f32).collect(), n, dim, &device);
    let map: &dyn FunctionMap = bnn.function_map().unwrap();
    let draws = map.prior_draws(50, 7).unwrap();
    let weights = FunctionSpaceConfig::default();
    let function = FunctionSpaceConfig { prior: PriorSpace::Function, ..FunctionSpaceConfig::default() };
    let w = function_space_direction(&bnn, map, x.clone(), None, points.clone(), &weights, Some(&draws)).unwrap();
    assert!(w.prior_score.is_none());
    let f = function_space_direction(&bnn, map, x, None, points, &function, Some(&draws)).unwrap();
    let s = host(&f.prior_score.unwrap());
    let diff: Vec<f64> = host(&(f.direction - w.direction)).into_iter().map(f64::from).collect();
    let eps = 1e-5;
    for i in 0..n {
        let base = &theta[i * dim..(i + 1) * dim];
        let g =
            |t: &[f64]| points_host.iter().enumerate().map(|(p, &x)| net(t, x) * f64::from(s[i * m + p])).sum::<f64>();
        for c in 0..dim {
            let (mut up, mut down) = (base.to_vec(), base.to_vec());
            up[c] += eps;
            down[c] -= eps;
            let jts = (g(&up) - g(&down)) / (2.0 * eps);
            // grad log prior: -w for the 10 weights (lambda = 1); 1 - 0.1 e^u for u = log gamma.
            let grad_prior = if c < 10 { -base[c] } else { 1.0 - 0.1 * base[c].exp() };
            let want = jts - grad_prior;
            let got = diff[i * dim + c];
            assert!((got - want).abs() < 2e-3 * (1.0 + want.abs()), "particle {i} coordinate {c}: {got} vs {want}");
        }
    }
}

/// The tiny network's prior alone (no likelihood), seen through its function map: what
/// `prior = "function"` targets where the data say nothing.
struct PriorOnly<'a>(&'a Bnn);

impl LogDensity for PriorOnly<'_> {
    fn dim(&self) -> usize {
        self.0.dim()
    }
    fn log_prob(
        &self,
        particles: parvi_model::burn::tensor::Tensor<2>,
        _: Option<&Minibatch>,
    ) -> parvi_model::burn::tensor::Tensor<1> {
        self.0.log_prior(particles).unwrap()
    }
    fn log_prior(
        &self,
        particles: parvi_model::burn::tensor::Tensor<2>,
    ) -> Option<parvi_model::burn::tensor::Tensor<1>> {
        self.0.log_prior(particles)
    }
    fn function_map(&self) -> Option<&dyn FunctionMap> {
        self.0.function_map()
    }
}

/// Where only the prior speaks, the function-space prior holds the particles at its own spread
/// whatever their number: at 4 fixed measurement points (the training inputs, no extra points),
/// the fixed point of `-(S_p + delta_p I)^-1 (f_i - mu_p) + (S + delta I)^-1 (f_i - f_bar) = 0`
/// has `f_bar = mu_p` and `S + delta I = S_p + delta_p I` (n - 1 >= 4: the particles span the
/// outputs; `J_i` has full row rank, so a weight-space fixed point is one in function space), for
/// 6 particles as for 24.
#[test]
fn function_prior_holds_the_spread_whatever_the_particle_count() {
    let device = flex();
    let (bnn, x_rows, _) = tiny_bnn();
    let m = x_rows.len();
    let model = PriorOnly(&bnn);
    let map: &dyn FunctionMap = bnn.function_map().unwrap();
    let points = matrix_from_vec(x_rows.iter().map(|&v| v as f32).collect(), m, 1, &device);
    let (ridge, prior_ridge, k) = (1e-3, 1e-3, 400);
    let prior_f: Vec<f64> =
        host(&map.function_values(map.prior_draws(k, 3).unwrap(), points.clone())).into_iter().map(f64::from).collect();
    let (mu_p, s_p) = moments(&prior_f, k, m);
    let tr_p: f64 = (0..m).map(|p| s_p[p * m + p]).sum();
    let spread = |n: usize| {
        let config = FunctionSpaceConfig {
            batch_points: m,
            extra_points: 0,
            ridge,
            prior: PriorSpace::Function,
            prior_draws: k,
            prior_ridge,
            prior_seed: 3,
            ..FunctionSpaceConfig::default()
        };
        let spec = EngineSpec::new(MethodConfig::Fpovi(config), KernelConfig::default(), AdapterConfig::adam(0.01));
        let mut e = spec.build().unwrap();
        let start = bnn.draw_prior(n, 11);
        let out = Runner::new(e.as_mut(), &model, Particles::new(start), RunConfig::new(4000, 5))
            .unwrap()
            .run(&mut [])
            .unwrap();
        let f: Vec<f64> =
            host(&map.function_values(out.particles.positions, points.clone())).into_iter().map(f64::from).collect();
        moments(&f, n, m)
    };
    for n in [6, 24] {
        let (mean, s) = spread(n);
        let tr: f64 = (0..m).map(|p| s[p * m + p]).sum();
        // S + delta I = S_p + delta_p I, delta = ridge tr(S) / 4: the traces agree to the ridges.
        let want = tr_p * (1.0 + prior_ridge) / (1.0 + ridge);
        assert!((tr - want).abs() < 0.05 * want, "{n} particles: tr S {tr} vs the prior's {want}");
        for p in 0..m {
            assert!((mean[p] - mu_p[p]).abs() < 0.05 * tr_p.sqrt(), "{n} particles: mean {mean:?} vs {mu_p:?}");
        }
    }
}
