//! MMD-FW: BQ weights, the exact-LMO limit (kernel herding with optimal weights), the
//! Approx-LMO on a Gaussian, its variants (cache, lazy, random Fourier features), Stein Points,
//! checkpoint/resume, and bad input.

mod common;

use common::*;
use parvi_infer::CheckpointPolicy;
use parvi_infer::engines::stein_kernel_cross;
use parvi_infer::engines::{bq_weights, line_search};
use parvi_infer::kernels::Kernel;
use parvi_infer::kernels::RandomFourierFeatures;
use parvi_infer::kernels::stein_direction;
use parvi_infer::{
    AdapterConfig, Callback, EmbeddingSource, Engine, EngineRng, Imq, InferError, KernelConfig, MeanEmbedding, MmdFw,
    MmdFwConfig, Particles, Rbf, RunConfig, RunError, Runner, SteinPoints, SteinPointsConfig, StepRule,
    core::Checkpoint, evaluation::weighted_mmd_squared,
};
use parvi_model::burn::tensor::{Device, Tensor, TensorData};
use parvi_model::tensor_ops::{matrix_from_vec, pairwise_sq_dists, to_vec_f32};
use parvi_models::Gaussian;
use parvi_models::builtin::{GAUSSIAN_COV, GAUSSIAN_MEAN};

fn rbf(h: f64, a: &[f64], b: &[f64]) -> f64 {
    let r2: f64 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum();
    (-r2 / (2.0 * h * h)).exp()
}

/// Gaussian elimination with partial pivoting: the direct solve the Cholesky path must match.
fn direct_solve(mut a: Vec<f64>, mut b: Vec<f64>, n: usize) -> Vec<f64> {
    for c in 0..n {
        let p = (c..n).max_by(|&i, &j| a[i * n + c].abs().total_cmp(&a[j * n + c].abs())).unwrap();
        for k in 0..n {
            a.swap(c * n + k, p * n + k);
        }
        b.swap(c, p);
        for r in c + 1..n {
            let f = a[r * n + c] / a[c * n + c];
            for k in c..n {
                a[r * n + k] -= f * a[c * n + k];
            }
            b[r] -= f * b[c];
        }
    }
    let mut x = vec![0.0; n];
    for r in (0..n).rev() {
        let s: f64 = (r + 1..n).map(|k| a[r * n + k] * x[k]).sum();
        x[r] = (b[r] - s) / a[r * n + r];
    }
    x
}

fn rows_of(values: &[f32], dim: usize) -> Vec<Vec<f64>> {
    values.chunks(dim).map(|r| r.iter().map(|&v| f64::from(v)).collect()).collect()
}

fn gaussian_target(device: &Device) -> Gaussian {
    Gaussian::new(&GAUSSIAN_MEAN, &GAUSSIAN_COV, device).unwrap()
}

fn config() -> MmdFwConfig {
    MmdFwConfig { map_steps: 300, map_lr: 0.05, l_steps: 200, lmo_lr: 0.05, ..Default::default() }
}

fn build(config: MmdFwConfig, kernel: KernelConfig) -> MmdFw {
    MmdFw::new(config, kernel, AdapterConfig::adagrad(0.05)).unwrap()
}

#[test]
fn bq_weights_equal_a_direct_solve() {
    let pts = [[0.0, 0.0], [1.0, 0.3], [-0.7, 1.1], [0.4, -1.2], [2.0, 1.0]];
    let n = pts.len();
    let k: Vec<f64> = (0..n * n).map(|i| rbf(0.8, &pts[i / n], &pts[i % n])).collect();
    let z = vec![0.3, 0.5, 0.1, 0.25, 0.05];
    let (w, jitter) = bq_weights(&k, &z, n, 1e-12).unwrap();
    let direct = direct_solve(k.clone(), z.clone(), n);
    for (a, b) in w.iter().zip(&direct) {
        assert!((a - b).abs() < 1e-8 * (1.0 + b.abs()), "{w:?} vs {direct:?}");
    }
    assert!(jitter > 0.0 && jitter < 1e-11, "jitter {jitter}");
    // The paper's empirical z = K 1/n gives uniform weights (why `embedding = particles` is flat).
    let zu: Vec<f64> = (0..n).map(|i| (0..n).map(|j| k[i * n + j]).sum::<f64>() / n as f64).collect();
    let (wu, _) = bq_weights(&k, &zu, n, 1e-12).unwrap();
    assert!(wu.iter().all(|v| (v - 0.2).abs() < 1e-8), "{wu:?}");
    // Line search: at the unconstrained optimum of the segment, J is stationary.
    let wl = [0.5, 0.2, 0.2, 0.1];
    let lambda = line_search(&k, &z, &wl, 4);
    let j = |l: f64| {
        let mut v: Vec<f64> = wl.iter().map(|w| w * (1.0 - l)).collect();
        v.push(l);
        let quad: f64 = (0..n).map(|a| (0..n).map(|b| v[a] * k[a * n + b] * v[b]).sum::<f64>()).sum();
        quad / 2.0 - v.iter().zip(&z).map(|(a, b)| a * b).sum::<f64>()
    };
    assert!(lambda > 0.0 && lambda < 1.0, "lambda {lambda}");
    assert!(j(lambda) <= j(lambda + 1e-3) && j(lambda) <= j(lambda - 1e-3));
}

/// Records the particles (host rows) and weights after every step.
#[derive(Default)]
struct Record {
    sets: Vec<(Vec<Vec<f64>>, Vec<f64>)>,
}

impl Callback for Record {
    fn every(&self) -> usize {
        1
    }
    fn on_step(&mut self, _step: usize, p: &Particles) -> Result<(), InferError> {
        let w = to_vec_f32(&p.weights_or_uniform()).into_iter().map(f64::from).collect();
        self.sets.push((rows_of(&to_vec_f32(&p.positions), p.dim()), w));
        Ok(())
    }
}

#[test]
fn exact_lmo_on_a_discrete_target_is_kernel_herding_with_optimal_weights() {
    let device = flex();
    let h = 1.0;
    // A discrete target: 40 atoms with unequal probabilities.
    let mut rng = EngineRng::new(11);
    let support: Vec<Vec<f64>> = (0..40).map(|_| vec![2.0 * rng.normal(), 1.5 * rng.normal()]).collect();
    let raw: Vec<f64> = (0..40).map(|_| 0.2 + rng.uniform()).collect();
    let total: f64 = raw.iter().sum();
    let probs: Vec<f64> = raw.iter().map(|v| v / total).collect();
    let flat: Vec<f32> = support.iter().flatten().map(|&v| v as f32).collect();
    let y = matrix_from_vec(flat, 40, 2, &device);
    let p = Tensor::<1>::from_data(TensorData::new(probs.iter().map(|&v| v as f32).collect::<Vec<_>>(), [40]), &device);
    let steps = 12;
    let cfg = MmdFwConfig { map_steps: 0, jitter: 1e-10, normalise_weights: false, ..Default::default() };
    let mut engine = build(cfg, KernelConfig::Rbf { bandwidth: Some(h) })
        .with_reference(MeanEmbedding { points: y.clone(), weights: p })
        .with_exact_lmo(y);
    // The initial particles only set N; the model is not evaluated with an exact LMO.
    let start = Particles::gaussian(steps, 2, 0.0, 1.0, &mut rng, &device).unwrap();
    let model = gaussian_target(&device);
    let mut record = Record::default();
    Runner::new(&mut engine, &model, start, RunConfig::new(steps, 0)).unwrap().run(&mut [&mut record]).unwrap();

    // Kernel herding with BQ weights, in f64 on the host.
    let mu_p = |x: &[f64]| -> f64 { support.iter().zip(&probs).map(|(s, q)| q * rbf(h, s, x)).sum() };
    let p_norm: f64 =
        (0..40).map(|i| (0..40).map(|j| probs[i] * probs[j] * rbf(h, &support[i], &support[j])).sum::<f64>()).sum();
    let mut chosen: Vec<usize> = Vec::new();
    let mut weights: Vec<f64> = Vec::new();
    let mut last_mmd = f64::INFINITY;
    for (t, (got_x, got_w)) in record.sets.iter().enumerate() {
        let next = (0..40)
            .filter(|j| !chosen.contains(j))
            .map(|j| {
                let kw: f64 = chosen.iter().zip(&weights).map(|(&i, w)| w * rbf(h, &support[i], &support[j])).sum();
                (j, kw - mu_p(&support[j]))
            })
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap()
            .0;
        chosen.push(next);
        let n = chosen.len();
        let k: Vec<f64> = (0..n * n).map(|i| rbf(h, &support[chosen[i / n]], &support[chosen[i % n]])).collect();
        let z: Vec<f64> = chosen.iter().map(|&i| mu_p(&support[i])).collect();
        weights = direct_solve(k.clone(), z.clone(), n);
        // Same atoms, same order, same weights.
        assert_eq!(got_x.len(), n, "step {t}");
        for (i, &c) in chosen.iter().enumerate() {
            let d: f64 = got_x[i].iter().zip(&support[c]).map(|(a, b)| (a - b).abs()).sum();
            assert!(d < 1e-5, "step {t}: particle {i} is not support atom {c}");
            assert!(
                (got_w[i] - weights[i]).abs() < 2e-3 * (1.0 + weights[i].abs()),
                "step {t}: {got_w:?} vs {weights:?}"
            );
        }
        // MMD^2 of the engine's weighted set (f64), strictly decreasing.
        let kww: f64 = (0..n).map(|a| (0..n).map(|b| got_w[a] * k[a * n + b] * got_w[b]).sum::<f64>()).sum();
        let mmd = kww - 2.0 * got_w.iter().zip(&z).map(|(a, b)| a * b).sum::<f64>() + p_norm;
        assert!(mmd < last_mmd, "step {t}: MMD^2 {mmd} did not decrease from {last_mmd}");
        last_mmd = mmd;
    }
    assert!(last_mmd < 0.05 * p_norm, "12 herding points leave MMD^2 {last_mmd} of {p_norm}");
}

/// Weighted MMD^2 of the particles against exact draws of the correlated Gaussian.
fn mmd_to_gaussian(p: &Particles, device: &Device) -> f64 {
    let y = gaussian_2d_samples(GAUSSIAN_MEAN, GAUSSIAN_COV, 1000, 99, device);
    let wy = Tensor::<1>::ones([1000], device).div_scalar(1000.0);
    weighted_mmd_squared(&Rbf::fixed(0.5).unwrap(), p.positions.clone(), p.weights_or_uniform(), y, wy).unwrap()
}

fn run_to(engine: &mut dyn Engine, n: usize, seed: u64) -> (Particles, Vec<f64>) {
    let device = flex();
    let model = gaussian_target(&device);
    let mut rng = EngineRng::new(seed);
    let start = Particles::gaussian(n, 2, 0.0, 1.0, &mut rng, &device).unwrap();
    struct Mmd(Vec<f64>, Device);
    impl Callback for Mmd {
        fn every(&self) -> usize {
            1
        }
        fn on_step(&mut self, _s: usize, p: &Particles) -> Result<(), InferError> {
            self.0.push(mmd_to_gaussian(p, &self.1));
            Ok(())
        }
    }
    let mut mmd = Mmd(Vec::new(), device);
    let out = Runner::new(engine, &model, start, RunConfig::new(n, seed)).unwrap().run(&mut [&mut mmd]).unwrap();
    (out.particles, mmd.0)
}

#[test]
fn approx_lmo_mmd_fw_approximates_a_gaussian() {
    let device = flex();
    let n = 40;
    let mut engine = build(config(), KernelConfig::Rbf { bandwidth: None });
    let (p, mmd) = run_to(&mut engine, n, 3);
    assert_eq!(p.len(), n);
    let w = to_vec_f32(p.weights.as_ref().unwrap());
    assert!((w.iter().sum::<f32>() - 1.0).abs() < 1e-4);
    // The first particle is the MAP (= the mean of a Gaussian).
    let first = &host(&p.positions)[..2];
    for i in 0..2 {
        assert!((f64::from(first[i]) - GAUSSIAN_MEAN[i]).abs() < 0.02, "MAP {first:?}");
    }
    let mean = p.mean();
    for i in 0..2 {
        assert!((mean[i] - GAUSSIAN_MEAN[i]).abs() < 0.15, "mean {mean:?}");
    }
    // MMD^2 at 40 particles is well below its value at 5 (greedy growth helps) and small
    // against the Monte Carlo floor of 1000 reference draws.
    assert!(mmd[n - 1] < 0.3 * mmd[4], "MMD^2 {:?}", (mmd[4], mmd[n - 1]));
    assert!(mmd[n - 1] < 0.02, "MMD^2 {}", mmd[n - 1]);
    let _ = device;
}

#[test]
fn cache_lazy_and_fourier_variants_run_and_approximate() {
    let n = 30;
    // Cache-MMD-FW with a line search on the cache embedding, lazily.
    let cfg = MmdFwConfig {
        cache: true,
        cache_svgd_steps: 300,
        embedding: EmbeddingSource::Cache,
        lazy: true,
        step_rule: StepRule::LineSearch,
        l_steps: 10,
        ..config()
    };
    let mut lazy = build(cfg, KernelConfig::Rbf { bandwidth: None });
    let (p, mmd) = run_to(&mut lazy, n, 4);
    let report = lazy.report();
    let stats = &report["stats"];
    assert!(p.len() <= n && p.len() >= 2, "{report}");
    assert_eq!(
        stats["lazy_reuses"].as_u64().unwrap() + stats["lazy_negative_calls"].as_u64().unwrap() + p.len() as u64,
        n as u64,
        "every step adds, reuses or rejects: {report}"
    );
    let last = *mmd.last().unwrap();
    assert!(last < 0.5 * mmd[4] && last < 0.1, "lazy cache MMD^2 {mmd:?}");
    // Random Fourier features (D = 200) with the constant step.
    let cfg = MmdFwConfig { rff: 200, step_rule: StepRule::Constant, ..config() };
    let mut fourier = build(cfg, KernelConfig::Rbf { bandwidth: None });
    let (p, mmd) = run_to(&mut fourier, n, 5);
    assert_eq!(p.len(), n);
    assert!(mmd[n - 1] < 0.3 * mmd[4], "rff MMD^2 {mmd:?}");
}

#[test]
fn bq_weights_are_uniform_with_the_papers_embedding_and_help_with_a_good_one() {
    // Algorithm 3 estimates mu_p at the particles by the particles themselves, z = K 1 / n, so
    // the BQ weights K^-1 z are uniform up to the solve's rounding (f32 Gram matrix, a nearly
    // singular K for close particles: 2% here): the default's weights. With
    // an embedding from an independent sample of p (here exact draws, disjoint from the ones the
    // MMD is measured against) the same rule gives weights that lower the MMD; both in the
    // kernel the MMD is measured with (h = 0.5), since BQ weights are optimal in their own.
    let device = flex();
    let n = 15;
    let mut paper = build(config(), KernelConfig::Rbf { bandwidth: None });
    let (p, _) = run_to(&mut paper, n, 7);
    let w = to_vec_f32(p.weights.as_ref().unwrap());
    assert!(w.iter().all(|v| (v * n as f32 - 1.0).abs() < 0.03), "{w:?}");

    let draws = gaussian_2d_samples(GAUSSIAN_MEAN, GAUSSIAN_COV, 1000, 77, &device);
    let reference = MeanEmbedding { points: draws, weights: Tensor::<1>::ones([1000], &device).div_scalar(1000.0) };
    let mut informed = build(config(), KernelConfig::Rbf { bandwidth: Some(0.5) }).with_reference(reference);
    let (p, _) = run_to(&mut informed, n, 7);
    let w = to_vec_f32(p.weights.as_ref().unwrap());
    let spread = w.iter().fold(0f32, |a, v| a.max((v * n as f32 - 1.0).abs()));
    assert!(spread > 0.3, "{w:?}");
    let (bq, uniform) = (mmd_to_gaussian(&p, &device), mmd_to_gaussian(&Particles::new(p.positions.clone()), &device));
    assert!(bq < uniform, "BQ weights MMD^2 {bq}, uniform {uniform}");
}

/// Cache-MMD-FW with a line search on the cache's embedding (the setting of Algorithm 10),
/// lazy or not.
fn cached_config(lazy: bool) -> MmdFwConfig {
    MmdFwConfig {
        cache: true,
        cache_svgd_steps: 300,
        embedding: EmbeddingSource::Cache,
        lazy,
        step_rule: StepRule::LineSearch,
        l_steps: 10,
        ..config()
    }
}

#[test]
fn lazy_mmd_fw_grows_from_the_cache_without_an_lmo() {
    // Algorithm 10: every SVGD particle is in the cache; while a cached particle's gap reaches
    // Phi / K it joins the set with no LMO. At the first step after x_0 the criterion holds for
    // the cached particle of largest gap (Phi_0 / K is a quarter of that gap), so two steps give
    // two particles, both cached SVGD particles, and no LMO call.
    let device = flex();
    let model = gaussian_target(&device);
    let start = Particles::gaussian(30, 2, 0.0, 1.0, &mut EngineRng::new(4), &device).unwrap();
    let mut lazy = build(cached_config(true), KernelConfig::Rbf { bandwidth: None });
    let out = Runner::new(&mut lazy, &model, start, RunConfig::new(2, 4)).unwrap().run(&mut []).unwrap();
    let report = lazy.report();
    assert_eq!(out.particles.len(), 2, "{report}");
    assert_eq!(report["stats"]["lmo_calls"], 0, "{report}");
    assert_eq!(report["stats"]["lazy_cache_joins"], 1, "{report}");
    let cache = lazy.save().tensors["cache"].clone();
    let cache = rows_of(&cache.values, 2);
    assert_eq!(cache.len(), 30, "Algorithm 10 keeps every SVGD particle in the cache");
    for row in rows_of(&host(&out.particles.positions), 2) {
        assert!(cache.iter().any(|c| c == &row), "particle {row:?} is not a cached SVGD particle");
    }
    // The line search moved weight to the joining particle.
    let w = to_vec_f32(out.particles.weights.as_ref().unwrap());
    assert!(w[1] > 0.0 && w[1] <= 1.0 && (w[0] + w[1] - 1.0).abs() < 1e-5, "{w:?}");
}

#[test]
fn lazy_mmd_fw_lowers_the_mmd_at_least_as_fast_per_lmo_call() {
    // Same cache, same embedding, same line search: MMD^2 (to exact draws) against the number of
    // LMO calls. Plain Cache-MMD-FW calls the LMO at every step after the first; the lazy variant
    // only when no cached atom qualifies. After the lazy run's LMO calls, plain FW with as many
    // calls has a larger MMD^2.
    let n = 30;
    let mut plain = build(cached_config(false), KernelConfig::Rbf { bandwidth: None });
    let (_, plain_mmd) = run_to(&mut plain, n, 4);
    let mut lazy = build(cached_config(true), KernelConfig::Rbf { bandwidth: None });
    let (p, lazy_mmd) = run_to(&mut lazy, n, 4);
    let report = lazy.report();
    let stats = &report["stats"];
    let calls = stats["lmo_calls"].as_u64().unwrap() as usize;
    let joins = stats["lazy_cache_joins"].as_u64().unwrap() as usize;
    assert!(joins >= 5, "{report}");
    assert!(calls < n - 1, "{report}");
    let last = *lazy_mmd.last().unwrap();
    assert!(last <= plain_mmd[calls], "lazy MMD^2 {last} after {calls} LMO calls, plain {}", plain_mmd[calls]);
    // Measured: 0.0020 after 4 LMO calls (19 cache joins), plain 0.123 after 4 calls and 0.0126
    // after all 29.
    assert!(last <= plain_mmd[n - 1], "lazy MMD^2 {last}, plain after {} calls {}", n - 1, plain_mmd[n - 1]);
    // Every step adds a particle (from the cache or an LMO), reweights a member, or is a
    // negative call.
    assert_eq!(
        stats["lazy_reuses"].as_u64().unwrap() + stats["lazy_negative_calls"].as_u64().unwrap() + p.len() as u64,
        n as u64,
        "{report}"
    );
}

#[test]
fn fourier_features_approximate_the_rbf_gram_and_stein_direction() {
    let device = flex();
    let mut rng = EngineRng::new(8);
    let x = rng.normal_tensor(6, 3, &device);
    let s = rng.normal_tensor(6, 3, &device);
    let y = rng.normal_tensor(4, 3, &device);
    let h = 1.3;
    let features = RandomFourierFeatures::draw(3, 20_000, &mut rng, &device).unwrap();
    let h2 = Tensor::<2>::full([1, 1], h * h, &device);
    let exact = Rbf::fixed(h).unwrap().eval(&pairwise_sq_dists(x.clone(), y.clone()), false);
    let approx = features.gram(x.clone(), y.clone(), &h2);
    // Each entry is a mean of D bounded terms: sd <= 1/sqrt(D) ~ 0.007.
    for (a, b) in to_vec_f32(&approx).iter().zip(to_vec_f32(&exact.k)) {
        assert!((a - b).abs() < 0.04, "{a} vs {b}");
    }
    let w = Tensor::<1>::ones([6], &device).div_scalar(6.0);
    let d_exact = stein_direction(&exact, x.clone(), s.clone(), y.clone(), Some(w.clone()));
    let d_approx = features.stein_direction(x, s, w, y, &h2);
    for (a, b) in to_vec_f32(&d_approx).iter().zip(to_vec_f32(&d_exact)) {
        assert!((a - b).abs() < 0.06, "{a} vs {b}");
    }
}

fn stein_points() -> SteinPoints {
    SteinPoints::new(SteinPointsConfig::default(), Box::new(Rbf::median())).unwrap()
}

#[test]
fn stein_points_approximate_a_gaussian() {
    // Futami et al.'s set-up: MAP first, 20 candidates a step at scale 1 around current points.
    let mut sp = stein_points();
    let (p, mmd) = run_to(&mut sp, 40, 6);
    assert_eq!(p.len(), 40);
    // The first point is the MAP (the mean of a Gaussian).
    let first = &host(&p.positions)[..2];
    for i in 0..2 {
        assert!((f64::from(first[i]) - GAUSSIAN_MEAN[i]).abs() < 0.02, "MAP {first:?}");
    }
    let mean = p.mean();
    for i in 0..2 {
        assert!((mean[i] - GAUSSIAN_MEAN[i]).abs() < 0.2, "mean {mean:?}");
    }
    assert!(mmd[39] < 0.3 * mmd[4], "Stein Points MMD^2 {mmd:?}");
}

#[test]
fn stein_points_do_not_diverge_on_a_20_d_gaussian() {
    // N(1, I) in 20-d from N(0, I) starts, 50 points. The mean of 50 exact draws has sd
    // 1/sqrt(50) = 0.14 per coordinate; a greedy set is no sample, so the check is loose: every
    // coordinate of the mean within 0.5 and every point within 4 sd + sqrt(20) of the mean.
    let device = flex();
    let (d, n) = (20, 50);
    let model = Gaussian::diagonal(&[1.0; 20], &[1.0; 20], &device).unwrap();
    let start = Particles::gaussian(n, d, 0.0, 1.0, &mut EngineRng::new(12), &device).unwrap();
    let mut sp = stein_points();
    let out = Runner::new(&mut sp, &model, start, RunConfig::new(n, 12)).unwrap().run(&mut []).unwrap();
    assert_eq!(out.particles.len(), n);
    let mean = out.particles.mean();
    assert!(mean.iter().all(|m| (m - 1.0).abs() < 0.5), "mean {mean:?}");
    let worst = rows_of(&host(&out.particles.positions), d)
        .iter()
        .map(|r| r.iter().map(|v| (v - 1.0).powi(2)).sum::<f64>().sqrt())
        .fold(0.0, f64::max);
    assert!(worst < 4.0 + (d as f64).sqrt(), "a point {worst} from the mean");
}

/// The Stein kernel `k_p(a, b)` on the host in f64 from its definition
/// `div_a div_b k + grad_a k . s(b) + grad_b k . s(a) + k s(a) . s(b)`, with the gradients of
/// `k` written out for the RBF (`h`) or the IMQ (`c`, `beta`).
fn stein_kernel_host(a: &[f64], sa: &[f64], b: &[f64], sb: &[f64], rbf_h: Option<f64>, imq: (f64, f64)) -> f64 {
    let d = a.len();
    let diff: Vec<f64> = (0..d).map(|c| a[c] - b[c]).collect();
    let r2: f64 = diff.iter().map(|v| v * v).sum();
    // k, g (grad_a k = g (a - b), grad_b k = -g (a - b)), and the trace term div_a div_b k.
    let (k, g, trace) = match rbf_h {
        Some(h) => {
            let k = (-r2 / (2.0 * h * h)).exp();
            (k, -k / (h * h), k * (d as f64 / (h * h) - r2 / h.powi(4)))
        }
        None => {
            let (c, beta) = imq;
            let base = c + r2;
            let k = base.powf(beta);
            let g = 2.0 * beta * base.powf(beta - 1.0);
            let trace =
                -2.0 * beta * d as f64 * base.powf(beta - 1.0) - 4.0 * beta * (beta - 1.0) * base.powf(beta - 2.0) * r2;
            (k, g, trace)
        }
    };
    let dot = |u: &[f64], v: &[f64]| u.iter().zip(v).map(|(p, q)| p * q).sum::<f64>();
    trace + g * dot(&diff, sb) - g * dot(&diff, sa) + k * dot(sa, sb)
}

#[test]
fn stein_kernel_cross_matches_its_definition() {
    let device = flex();
    let (n, m, d) = (5, 4, 3);
    let mut rng = EngineRng::new(41);
    let mut draw = |rows: usize| (0..rows * d).map(|_| rng.normal()).collect::<Vec<f64>>();
    let (x, s, y, t) = (draw(n), draw(n), draw(m), draw(m));
    let tensor = |v: &[f64], rows: usize| matrix_from_vec(v.iter().map(|&u| u as f32).collect(), rows, d, &device);
    let sq = pairwise_sq_dists(tensor(&x, n), tensor(&y, m));
    let kernels: [(Box<dyn Kernel>, Option<f64>); 2] =
        [(Box::new(Rbf::fixed(1.3).unwrap()), Some(1.3)), (Box::new(Imq::new(1.0, -0.5).unwrap()), None)];
    for (kernel, rbf_h) in kernels {
        let eval = kernel.eval(&sq, true);
        let got =
            to_vec_f32(&stein_kernel_cross(&eval, &sq, tensor(&x, n), tensor(&s, n), tensor(&y, m), tensor(&t, m)));
        for i in 0..n {
            for j in 0..m {
                let row = |v: &[f64], r: usize| v[r * d..(r + 1) * d].to_vec();
                let want = stein_kernel_host(&row(&x, i), &row(&s, i), &row(&y, j), &row(&t, j), rbf_h, (1.0, -0.5));
                let g = f64::from(got[i * m + j]);
                assert!(
                    (g - want).abs() < 1e-5 * want.abs().max(1.0),
                    "{}: k_p({i}, {j}) = {g}, by hand {want}",
                    kernel.describe()
                );
            }
        }
    }
}

#[test]
fn checkpoint_resume_continues_the_same_run() {
    let device = flex();
    let model = gaussian_target(&device);
    let cfg = MmdFwConfig { l_steps: 20, ..config() };
    let start = || Particles::gaussian(12, 2, 0.0, 2.0, &mut EngineRng::new(2), &device).unwrap();
    let mut straight = build(cfg.clone(), KernelConfig::Rbf { bandwidth: None });
    let full = Runner::new(&mut straight, &model, start(), RunConfig::new(12, 1)).unwrap().run(&mut []).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ck.json");
    let mut first = build(cfg.clone(), KernelConfig::Rbf { bandwidth: None });
    let config =
        RunConfig { checkpoint: Some(CheckpointPolicy { path: path.clone(), every: 6 }), ..RunConfig::new(6, 1) };
    Runner::new(&mut first, &model, start(), config).unwrap().run(&mut []).unwrap();
    let mut second = build(cfg, KernelConfig::Rbf { bandwidth: None });
    let resumed =
        Runner::resume(&mut second, &model, RunConfig::new(12, 1), &Checkpoint::load(&path).unwrap(), &device)
            .unwrap()
            .run(&mut [])
            .unwrap();
    let (a, b) = (host(&full.particles.positions), host(&resumed.particles.positions));
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() < 1e-5, "{a:?} vs {b:?}");
    }
}

/// `self-score = true`: the first particle's MAP search and each LMO run one Adam iteration per
/// run-loop step, the searched point's own score pulls it to `p` from a start far away, and the
/// set's repulsion keeps the new points apart (a spread set, though narrower than `p`).
#[test]
fn self_score_search_is_spread_over_steps_and_climbs_log_p() {
    let device = flex();
    let model = gaussian_target(&device);
    let cfg = MmdFwConfig { self_score: true, map_steps: 300, map_lr: 0.05, l_steps: 100, lmo_lr: 0.05, ..config() };
    let n = 12;
    // Initial particles (the LMO starts) about 3.5 away from the target's mean.
    let start = || Particles::gaussian(n, 2, 2.5, 0.5, &mut EngineRng::new(7), &device).unwrap();
    let steps = 300 + (n - 1) * 100;
    let run = |steps: usize, checkpoint: Option<CheckpointPolicy>| {
        let mut engine = build(cfg.clone(), KernelConfig::Rbf { bandwidth: None });
        let config = RunConfig { checkpoint, ..RunConfig::new(steps, 7) };
        Runner::new(&mut engine, &model, start(), config).unwrap().run(&mut []).unwrap().particles
    };
    assert_eq!(run(299, None).len(), 1, "the MAP search still running shows its point");
    assert_eq!(run(steps - 1, None).len(), n - 1, "one iteration short of the last particle");
    let full = run(steps, None);
    assert_eq!(full.len(), n);
    let first = &host(&full.positions)[..2];
    for i in 0..2 {
        assert!((f64::from(first[i]) - GAUSSIAN_MEAN[i]).abs() < 0.1, "MAP {first:?}");
    }
    let mean = full.mean();
    for i in 0..2 {
        assert!((mean[i] - GAUSSIAN_MEAN[i]).abs() < 0.3, "mean {mean:?} from starts at (2.5, 2.5)");
    }
    // The repulsion spreads the set: closer to p than n copies of the MAP, but (by design of
    // the one-sample estimate, see `MmdFwConfig::self_score`) not as close as n exact draws.
    let collapsed = Particles::new(Tensor::cat(vec![full.positions.clone().narrow(0, 0, 1); n], 0));
    let (mmd, at_map) = (mmd_to_gaussian(&full, &device), mmd_to_gaussian(&collapsed, &device));
    assert!(mmd < 0.8 * at_map, "MMD^2 {mmd} against {at_map} for the set collapsed at the MAP");
    let cov = full.covariance();
    for i in 0..2 {
        let truth = GAUSSIAN_COV[3 * i];
        // Adam's own jitter at lr 0.05 is ~lr^2 = 0.0025: a spread well above it, below p's.
        assert!(cov[3 * i] > 0.02 * truth && cov[3 * i] < truth, "variance {} against {truth}", cov[3 * i]);
    }
    // A checkpoint inside the third search resumes to the same particles.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ck.json");
    run(450, Some(CheckpointPolicy { path: path.clone(), every: 450 }));
    let mut second = build(cfg.clone(), KernelConfig::Rbf { bandwidth: None });
    let resumed =
        Runner::resume(&mut second, &model, RunConfig::new(steps, 7), &Checkpoint::load(&path).unwrap(), &device)
            .unwrap()
            .run(&mut [])
            .unwrap();
    let (a, b) = (host(&full.positions), host(&resumed.particles.positions));
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() < 1e-5, "{a:?} vs {b:?}");
    }
}

#[test]
fn bad_input_gives_errors_naming_the_step() {
    let device = flex();
    let model = gaussian_target(&device);
    // L = 0.
    let err = MmdFw::new(MmdFwConfig { l_steps: 0, ..config() }, KernelConfig::default(), AdapterConfig::adam(0.1))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("l-steps") && err.contains("L >= 1"), "{err}");
    // N = 0.
    let mut engine = build(config(), KernelConfig::default());
    let empty = Particles::new(Tensor::<2>::zeros([0, 2], &device));
    let err = engine.init(&empty).err().unwrap().to_string();
    assert!(err.contains("N = 0"), "{err}");
    // Lazy without an estimate of mu_p other than the particles.
    let err = MmdFw::new(MmdFwConfig { lazy: true, ..config() }, KernelConfig::default(), AdapterConfig::adam(0.1))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("`lazy`"), "{err}");
    // The spread search starts from the initial particles, not from a cache.
    let cfg = MmdFwConfig { self_score: true, cache: true, ..config() };
    let err = MmdFw::new(cfg, KernelConfig::default(), AdapterConfig::adam(0.1)).err().unwrap().to_string();
    assert!(err.contains("self-score") && err.contains("cache"), "{err}");
    // A singular Gram matrix even with jitter: indefinite, so no jitter in range helps.
    let err = bq_weights(&[1.0, 2.0, 2.0, 1.0], &[0.5, 0.5], 2, 1e-8).err().unwrap().to_string();
    assert!(err.contains("not positive definite"), "{err}");
    // In a run, with jitter switched off: identical initial particles, no MAP search and an LMO
    // step too small to move make particle 2 a copy of particle 1, so the Gram matrix is
    // exactly singular at step 1; the error names the step and the BQ solve.
    let cfg = MmdFwConfig { map_steps: 0, l_steps: 1, lmo_lr: 1e-30, jitter: 0.0, ..config() };
    let mut engine = build(cfg, KernelConfig::default());
    let start = Particles::from_rows(vec![0.5; 10], 5, 2, &device).unwrap();
    match Runner::new(&mut engine, &model, start, RunConfig::new(5, 0)).unwrap().run(&mut []) {
        Err(RunError::Failed { step, error: source }) => {
            let msg = source.to_string();
            assert_eq!(step, 1);
            assert!(
                msg.contains("step 1") && msg.contains("BQ weights") && msg.contains("not positive definite"),
                "{msg}"
            );
        }
        other => panic!("expected a BQ failure, got {other:?}"),
    }
    // A MAP search that diverges.
    let mut engine = build(MmdFwConfig { map_lr: 1e30, ..config() }, KernelConfig::default());
    let start = Particles::gaussian(5, 2, 0.0, 1.0, &mut EngineRng::new(0), &device).unwrap();
    match Runner::new(&mut engine, &model, start, RunConfig::new(5, 0)).unwrap().run(&mut []) {
        Err(RunError::Failed { step, error: source }) => {
            let msg = source.to_string();
            assert_eq!(step, 0);
            assert!(msg.contains("MAP search") && msg.contains("Adam step"), "{msg}");
        }
        other => panic!("expected a MAP failure, got {other:?}"),
    }
    // The same spread over steps: the error names the step and the Adam iteration.
    let mut engine = build(MmdFwConfig { map_lr: 1e30, self_score: true, ..config() }, KernelConfig::default());
    let start = Particles::gaussian(5, 2, 0.0, 1.0, &mut EngineRng::new(0), &device).unwrap();
    match Runner::new(&mut engine, &model, start, RunConfig::new(5, 0)).unwrap().run(&mut []) {
        Err(RunError::Failed { step, error: source }) => {
            let msg = source.to_string();
            assert_eq!(step, 1);
            assert!(msg.contains("step 1") && msg.contains("Adam iteration 1") && msg.contains("map-lr"), "{msg}");
        }
        other => panic!("expected a MAP failure, got {other:?}"),
    }
    // Stein Points without candidates.
    let config = SteinPointsConfig { candidates: 0, ..Default::default() };
    let err = SteinPoints::new(config, Box::new(Rbf::median())).err().unwrap().to_string();
    assert!(err.contains("candidates"), "{err}");
}
