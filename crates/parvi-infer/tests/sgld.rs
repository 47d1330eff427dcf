//! SGLD and SGLD+R: stationarity on a correlated Gaussian (and its failure with the wrong noise),
//! the injected noise covariance `2 eps K_t / K`, checkpoint resume of the trace, bad input.

mod common;

use common::*;
use parvi_infer::CheckpointPolicy;
use parvi_infer::core::Checkpoint;
use parvi_infer::evaluation::{TraceDiagnostics, TraceView};
use parvi_infer::{
    Engine, EngineRng, NoiseCovariance, Particles, RunConfig, RunError, Runner, Sgld, SgldConfig, StepContext,
};
use parvi_model::burn::tensor::Tensor;
use parvi_model::tensor_ops::to_vec_f32;
use parvi_model::{LogDensity, Minibatch};
use parvi_models::Gaussian;
use parvi_models::builtin::{GAUSSIAN_COV, GAUSSIAN_MEAN};

/// z-scores of the pooled trace's mean and covariance against the target: the Monte Carlo
/// standard errors come from the trace's effective sample size per coordinate (the ESS of `x`
/// is a lower bound for that of `x_i x_j` under Langevin dynamics on a Gaussian).
fn stationarity_z(engine: &Sgld) -> Vec<(String, f64)> {
    let trace = engine.trace().expect("a trace");
    let [m, k, d] = trace.dims();
    let values = to_vec_f32(&trace);
    let diag = TraceDiagnostics::of(&TraceView::new(&values, m, k, d).unwrap());
    let rows: Vec<[f64; 2]> = values.chunks(2).map(|r| [f64::from(r[0]), f64::from(r[1])]).collect();
    let n = rows.len() as f64;
    let mean = [0, 1].map(|i| rows.iter().map(|r| r[i]).sum::<f64>() / n);
    let cov = |i: usize, j: usize| rows.iter().map(|r| (r[i] - mean[i]) * (r[j] - mean[j])).sum::<f64>() / n;
    let sigma = |i: usize, j: usize| GAUSSIAN_COV[2 * i + j];
    let ess_min = diag.min_ess();
    let mut z = Vec::new();
    for i in 0..2 {
        z.push((format!("mean[{i}]"), (mean[i] - GAUSSIAN_MEAN[i]) / (sigma(i, i) / diag.ess[i]).sqrt()));
    }
    for (i, j) in [(0, 0), (0, 1), (1, 1)] {
        let se = ((sigma(i, i) * sigma(j, j) + sigma(i, j).powi(2)) / ess_min).sqrt();
        z.push((format!("cov[{i}{j}]"), (cov(i, j) - sigma(i, j)) / se));
    }
    z
}

/// Runs `engine` from exact target draws (so no burn-in is needed) and returns the z-scores.
fn run_from_target(engine: &mut Sgld, chains: usize, steps: usize) -> Vec<(String, f64)> {
    let device = flex();
    let target = Gaussian::new(&GAUSSIAN_MEAN, &GAUSSIAN_COV, &device).unwrap();
    let start = Particles::new(gaussian_2d_samples(GAUSSIAN_MEAN, GAUSSIAN_COV, chains, 11, &device));
    Runner::new(engine, &target, start, RunConfig::new(steps, 3)).unwrap().run(&mut []).unwrap();
    stationarity_z(engine)
}

fn max_abs(z: &[(String, f64)]) -> f64 {
    z.iter().map(|(_, v)| v.abs()).fold(0.0, f64::max)
}

// Started from the target, so no burn-in: the whole trace is stationary.
// 12 chains in blocks of 5 (two full blocks and a remainder block of 2, re-drawn every step).
// eps = 0.06 gives a per-chain step of about eps / K times a kernel row sum of ~2, i.e. ~0.01:
// the Euler bias on the variances is then ~h / (2 lambda_min) ~ 3% against a Monte Carlo
// standard error of ~5% (ESS ~ 800).
const CHAINS: usize = 12;
const STEPS: usize = 16_000;

fn sgld_r(noise: NoiseCovariance) -> Sgld {
    let config = SgldConfig {
        a: 0.06,
        block_size: Some(5),
        burn_in: Some(0),
        thin: 4,
        max_samples: 100_000,
        ..Default::default()
    };
    let mut engine = Sgld::with_repulsion(&config, None).unwrap();
    engine.set_noise(noise);
    engine
}

#[test]
fn sgld_r_keeps_the_target_stationary() {
    let mut engine = sgld_r(NoiseCovariance::Kernel);
    let z = run_from_target(&mut engine, CHAINS, STEPS);
    assert!(max_abs(&z) < 4.0, "pooled trace off the target: {z:?}");
    let report = engine.report();
    assert!(report["max_rhat"].as_f64().unwrap() < 1.05, "{report}");
}

#[test]
fn sgld_r_with_identity_noise_is_not_stationary() {
    // The same drift (eps / K)(K_t grad + Gamma) with noise N(0, 2 eps I): the fluctuation-
    // dissipation balance is broken, the chains run hot, and the same check must fail.
    let mut engine = sgld_r(NoiseCovariance::Identity);
    let z = run_from_target(&mut engine, CHAINS, STEPS);
    assert!(max_abs(&z) > 8.0, "a wrong noise passed the stationarity check: {z:?}");
}

#[test]
fn sgld_keeps_the_target_stationary() {
    // Plain SGLD at step 0.01: Euler bias ~3% of the smallest variance, ESS ~ 1000.
    let config = SgldConfig { a: 0.01, burn_in: Some(0), thin: 4, max_samples: 100_000, ..Default::default() };
    let mut engine = Sgld::new(&config).unwrap();
    let z = run_from_target(&mut engine, CHAINS, 12_000);
    assert!(max_abs(&z) < 4.0, "pooled trace off the target: {z:?}");
}

/// `log p = 0`: the drift is the repulsion alone, which is what the noise test wants.
struct Flat;

impl LogDensity for Flat {
    fn dim(&self) -> usize {
        2
    }
    fn log_prob(&self, x: Tensor<2>, _batch: Option<&Minibatch>) -> Tensor<1> {
        let n = x.dims()[0];
        x.sum_dim(1).reshape([n]).mul_scalar(0.0)
    }
}

/// The empirical covariance over chains (pooled over both coordinates) of the displacements of
/// `draws` single steps from the same positions `x0`, scaled by `K / (2 eps)`.
fn empirical_noise(engine: &mut Sgld, x0: &[f32], chains: usize, eps: f64, draws: usize) -> Vec<f64> {
    let device = flex();
    let start = Particles::from_rows(x0.to_vec(), chains, 2, &device).unwrap();
    engine.init(&start).unwrap();
    let mut rng = EngineRng::new(17);
    let mut deltas: Vec<Vec<f64>> = Vec::with_capacity(draws);
    for _ in 0..draws {
        let mut p = start.clone();
        let mut ctx = StepContext { model: &Flat, batch: None, rng: &mut rng, step: 0 };
        engine.step(&mut ctx, &mut p).unwrap();
        let moved = to_vec_f32(&p.positions);
        deltas.push(moved.iter().zip(x0).map(|(a, b)| f64::from(a - b)).collect());
    }
    // Per (chain, coordinate) means, then covariance over chains pooled over coordinates.
    let n = draws as f64;
    let mean: Vec<f64> = (0..chains * 2).map(|c| deltas.iter().map(|d| d[c]).sum::<f64>() / n).collect();
    let mut cov = vec![0.0; chains * chains];
    for d in &deltas {
        for i in 0..chains {
            for j in 0..chains {
                for a in 0..2 {
                    cov[i * chains + j] += (d[2 * i + a] - mean[2 * i + a]) * (d[2 * j + a] - mean[2 * j + a]);
                }
            }
        }
    }
    cov.iter().map(|c| c / (2.0 * n) * chains as f64 / (2.0 * eps)).collect()
}

/// Squared distances `|x_i - x_j|^2` on the host, row-major `K x K`.
fn sq_host(x0: &[f32], chains: usize) -> Vec<f64> {
    (0..chains * chains)
        .map(|ij| (0..2).map(|a| f64::from(x0[2 * (ij / chains) + a] - x0[2 * (ij % chains) + a]).powi(2)).sum())
        .collect()
}

/// `k(x_i, x_j) = exp(-|x_i - x_j|^2 / (2 h^2))` on the host.
fn rbf_host(x0: &[f32], chains: usize, h2: f64) -> Vec<f64> {
    sq_host(x0, chains).iter().map(|sq| (-sq / (2.0 * h2)).exp()).collect()
}

#[test]
fn injected_noise_has_covariance_two_eps_k_over_k() {
    let chains = 4;
    let eps = 1e-4;
    let x0 = [0.0, 0.0, 0.6, 0.1, -0.3, 0.8, 1.5, -0.4];
    let draws = 3000;
    // Entry (i, j) of a sample covariance of N = 2 * draws Gaussian pairs with unit variances and
    // correlation k has standard error sqrt((1 + k^2) / N); `(1 + 2 k^2)` also covers the
    // permutation mixture below. 4.5 of them.
    let tolerance = |k: f64| 4.5 * ((1.0 + 2.0 * k * k) / (2 * draws) as f64).sqrt();

    // Full block, median bandwidth: h^2 = med / (2 log(K + 1)) over the K x K distances.
    let mut full = Sgld::with_repulsion(&SgldConfig { a: eps, ..Default::default() }, None).unwrap();
    let got = empirical_noise(&mut full, &x0, chains, eps, draws);
    let mut sq = sq_host(&x0, chains);
    sq.sort_by(f64::total_cmp);
    let med = 0.5 * (sq[7] + sq[8]);
    let expected = rbf_host(&x0, chains, med / (2.0 * (chains as f64 + 1.0).ln()));
    for (idx, (g, e)) in got.iter().zip(&expected).enumerate() {
        assert!((g - e).abs() < tolerance(*e), "entry {idx}: {g} vs {e}\n{got:?}\n{expected:?}");
    }

    // Blocks of 2 out of 4, fixed bandwidth: chains i != j share a block with probability
    // (b - 1) / (K - 1) = 1/3, so the covariance averaged over permutations is K_ij / 3.
    let h = 0.7;
    let config = SgldConfig { a: eps, block_size: Some(2), ..Default::default() };
    let mut blocks = Sgld::with_repulsion(&config, Some(h)).unwrap();
    let got = empirical_noise(&mut blocks, &x0, chains, eps, draws);
    let kmat = rbf_host(&x0, chains, h * h);
    for i in 0..chains {
        for j in 0..chains {
            let e = if i == j { 1.0 } else { kmat[i * chains + j] / 3.0 };
            let g = got[i * chains + j];
            assert!((g - e).abs() < tolerance(kmat[i * chains + j]), "({i}, {j}): {g} vs {e}");
        }
    }
    // And the full-block covariance really differs from the block-average one: the test can tell.
    assert!((expected[1] - expected[1] / 3.0).abs() > 3.0 * tolerance(expected[1]));
}

#[test]
fn a_resumed_run_continues_the_trace_exactly() {
    let device = flex();
    let target = Gaussian::new(&GAUSSIAN_MEAN, &GAUSSIAN_COV, &device).unwrap();
    let mut rng = EngineRng::new(2);
    let start = Particles::gaussian(6, 2, 0.0, 1.0, &mut rng, &device).unwrap();
    let config =
        SgldConfig { a: 0.05, block_size: Some(4), burn_in: Some(10), thin: 3, max_samples: 60, ..Default::default() };
    let straight = {
        let mut engine = Sgld::with_repulsion(&config, None).unwrap();
        Runner::new(&mut engine, &target, start.clone(), RunConfig::new(120, 9)).unwrap().run(&mut []).unwrap();
        host(&engine.draws().unwrap().positions)
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ckpt.json");
    let mut first = Sgld::with_repulsion(&config, None).unwrap();
    let policy = CheckpointPolicy { path: path.clone(), every: 1000 };
    let half = RunConfig { checkpoint: Some(policy), ..RunConfig::new(55, 9) };
    Runner::new(&mut first, &target, start, half).unwrap().run(&mut []).unwrap();
    let mut second = Sgld::with_repulsion(&config, None).unwrap();
    let ckpt = Checkpoint::load(&path).unwrap();
    Runner::resume(&mut second, &target, RunConfig::new(120, 9), &ckpt, &device).unwrap().run(&mut []).unwrap();
    let resumed = host(&second.draws().unwrap().positions);
    // The cap (60 draws = 10 snapshots of 6) was hit, so the trace was thinned on the way.
    assert!(straight.len() <= 60 * 2 && !straight.is_empty());
    assert_eq!(straight, resumed);
}

#[test]
fn bad_settings_are_rejected_by_name() {
    let device = flex();
    let target = Gaussian::new(&GAUSSIAN_MEAN, &GAUSSIAN_COV, &device).unwrap();
    let start = || Particles::new(gaussian_2d_samples(GAUSSIAN_MEAN, GAUSSIAN_COV, 4, 1, &device));
    let err = |r: Result<Sgld, parvi_infer::InferError>| r.err().expect("an error").to_string();

    let e = err(Sgld::with_repulsion(&SgldConfig { block_size: Some(0), ..Default::default() }, None));
    assert!(e.contains("block-size"), "{e}");
    for a in [0.0, -1e-3, f64::NAN] {
        let e = err(Sgld::new(&SgldConfig { a, ..Default::default() }));
        assert!(e.contains("`a`"), "{e}");
    }
    let e = err(Sgld::new(&SgldConfig { gamma: -0.5, ..Default::default() }));
    assert!(e.contains("gamma"), "{e}");
    let e = err(Sgld::new(&SgldConfig { block_size: Some(2), ..Default::default() }));
    assert!(e.contains("block-size") && e.contains("sgld-r"), "{e}");

    // A block larger than the number of chains is caught when the chains are known.
    let mut engine = Sgld::with_repulsion(&SgldConfig { block_size: Some(5), ..Default::default() }, None).unwrap();
    let e = Runner::new(&mut engine, &target, start(), RunConfig::new(1, 0)).err().unwrap().to_string();
    assert!(e.contains("block-size") && e.contains("4"), "{e}");

    // Coinciding chains make the kernel block all ones (singular): with jitter allowed the step
    // succeeds and says so; with `max-jitter = 0` it is a clear error, not NaNs.
    let same = || Particles::from_rows(vec![0.3, -0.2, 0.3, -0.2, 0.3, -0.2], 3, 2, &device).unwrap();
    let mut jittered = Sgld::with_repulsion(&SgldConfig { a: 1e-3, ..Default::default() }, None).unwrap();
    Runner::new(&mut jittered, &target, same(), RunConfig::new(1, 0)).unwrap().run(&mut []).unwrap();
    let report = jittered.report();
    assert_eq!(report["jittered_steps"].as_u64(), Some(1), "{report}");
    assert!(report["max_jitter_used"].as_f64().unwrap() > 0.0);
    let config = SgldConfig { a: 1e-3, max_jitter: Some(0.0), ..Default::default() };
    let mut strict = Sgld::with_repulsion(&config, None).unwrap();
    match Runner::new(&mut strict, &target, same(), RunConfig::new(1, 0)).unwrap().run(&mut []) {
        Err(RunError::Failed { error: source, .. }) => {
            let e = source.to_string();
            assert!(e.contains("positive definite") && e.contains("max-jitter"), "{e}");
        }
        other => panic!("expected a clear error, got {other:?}"),
    }
    let e = err(Sgld::with_repulsion(&SgldConfig { max_jitter: Some(-1.0), ..Default::default() }, None));
    assert!(e.contains("max-jitter"), "{e}");
}
