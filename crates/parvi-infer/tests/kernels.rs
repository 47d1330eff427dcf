//! The Stein identity E_p[A_p k(x, y)] = 0 holds for the core's kernels and Stein operator, and
//! fails when the score is wrong (so the test can fail). SVGD's direction in tiles is the
//! whole-matrix direction; the median of the pairs is exact by selection, or sampled within its
//! rank bound; a kernel matrix that cannot fit is refused by name before it is allocated.

mod common;

use common::*;
use parvi_infer::kernels::{
    DENSE_MAX_POINTS, EXACT_MEDIAN_MAX_POINTS, GPU_TILE_SIDE, Imq, Kernel, MEDIAN_SAMPLE_MIN_PAIRS,
    MEDIAN_SAMPLE_PAIRS, MultiKernel, PairTiles, Rbf, median_is_exact, median_rule_h2, pair_median_sq,
    sampled_pair_median_sq, svgd_direction, svgd_direction_dense, svgd_direction_rows, svgd_direction_tiled,
};
use parvi_infer::{
    AdapterConfig, ControlFunctionalConfig, EngineRng, EngineSpec, MethodConfig, Particles, RandomSubset, Svgd,
};
use parvi_model::tensor_ops::{matrix_from_vec, pairwise_sq_dists};
use parvi_model::{LogDensity, score};
use parvi_models::Gaussian;
use parvi_models::builtin::{GAUSSIAN_COV, GAUSSIAN_MEAN};

/// Per-sample terms `k(x_j, y_i) s_j + grad_{x_j} k(x_j, y_i)` as `[m][d][n]` host values.
fn stein_terms(
    kernel: &dyn Kernel,
    x: &parvi_model::burn::tensor::Tensor<2>,
    s: &parvi_model::burn::tensor::Tensor<2>,
    y: &parvi_model::burn::tensor::Tensor<2>,
) -> Vec<Vec<Vec<f64>>> {
    let sq = pairwise_sq_dists(x.clone(), y.clone());
    let eval = kernel.eval(&sq, false);
    let (k, dk) = (host(&eval.k), host(&eval.dk));
    let (xs, ss, ys) = (host(x), host(s), host(y));
    let (n, m) = (x.dims()[0], y.dims()[0]);
    (0..m)
        .map(|i| {
            (0..2)
                .map(|c| {
                    (0..n)
                        .map(|j| {
                            let kj = k[j * m + i] as f64;
                            let dkj = dk[j * m + i] as f64;
                            kj * ss[j * 2 + c] as f64 + 2.0 * dkj * (xs[j * 2 + c] - ys[i * 2 + c]) as f64
                        })
                        .collect()
                })
                .collect()
        })
        .collect()
}

fn max_z(kernel: &dyn Kernel, target: &Gaussian, wrong_shift: f32) -> f64 {
    let device = flex();
    let x = gaussian_2d_samples(GAUSSIAN_MEAN, GAUSSIAN_COV, 4000, 11, &device);
    let s = score(target as &dyn LogDensity, x.clone(), None).unwrap().grad.add_scalar(wrong_shift);
    let y = matrix_from_vec(vec![-0.7, 0.8, 0.0, 0.0, -1.5, 2.0, 0.5, -0.5], 4, 2, &device);
    let mut worst: f64 = 0.0;
    for per_point in stein_terms(kernel, &x, &s, &y) {
        for coord in per_point {
            let (mean, se) = mean_se(&coord);
            worst = worst.max(mean.abs() / se);
        }
    }
    worst
}

#[test]
fn stein_identity_holds_within_four_standard_errors() {
    let device = flex();
    let target = Gaussian::new(&GAUSSIAN_MEAN, &GAUSSIAN_COV, &device).unwrap();
    let kernels: [Box<dyn Kernel>; 2] = [Box::new(Rbf::fixed(0.8).unwrap()), Box::new(Imq::new(1.0, -0.5).unwrap())];
    for kernel in &kernels {
        let z = max_z(kernel.as_ref(), &target, 0.0);
        assert!(z < 4.0, "{}: |mean| / se = {z}", kernel.describe());
        // A wrong score (shifted by 0.5) must break the identity.
        let z_wrong = max_z(kernel.as_ref(), &target, 0.5);
        assert!(z_wrong > 4.0, "{}: wrong score not detected, z = {z_wrong}", kernel.describe());
    }
}

/// Standard normal draws `[n, dim]`, seeded.
fn normal_points(n: usize, dim: usize, seed: u64) -> parvi_model::burn::tensor::Tensor<2> {
    EngineRng::new(seed).normal_tensor(n, dim, &flex())
}

/// `max |a - b| / max |b|`.
fn relative_gap(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let gap = a.iter().zip(b).map(|(u, v)| (u - v).abs()).fold(0.0, f32::max);
    gap / b.iter().map(|v| v.abs()).fold(f32::MIN_POSITIVE, f32::max)
}

#[test]
fn tiled_direction_is_the_dense_direction() {
    // 300 points: tiles of 64 (a short last block), 97 and one tile of all; scores off the
    // target's so that drift and repulsion both count.
    let x = normal_points(300, 3, 1).mul_scalar(1.5).add_scalar(4.0);
    let s = x.clone().neg().add_scalar(3.0) + normal_points(300, 3, 2).mul_scalar(0.3);
    let kernels: [Box<dyn Kernel>; 4] = [
        Box::new(Rbf::median()),
        Box::new(Rbf::han_liu()),
        Box::new(Rbf::fixed(0.7).unwrap()),
        Box::new(Imq::new(1.0, -0.5).unwrap()),
    ];
    for kernel in &kernels {
        let dense = host(&svgd_direction_dense(kernel.as_ref(), x.clone(), s.clone()));
        for block in [64, 97, 300] {
            let tiled = svgd_direction_tiled(kernel.as_ref(), x.clone(), s.clone(), &PairTiles::new(300, block))
                .expect("rbf and imq work in tiles");
            let gap = relative_gap(&host(&tiled), &dense);
            assert!(gap < 2e-5, "{} in tiles of {block}: relative gap {gap}", kernel.describe());
        }
    }
    // A kernel that cannot be evaluated in blocks says so instead of computing something else.
    let multi = MultiKernel::with_host_weights(&[0.5, 1.0], &[0.5, 0.5], &flex()).unwrap();
    assert!(svgd_direction_tiled(&multi, x.clone(), s, &PairTiles::new(300, 64)).is_none());
}

/// The row blocks of a sharded step, for uneven splits, make up the whole direction: below and
/// above the dense limit, for each kernel that works in blocks, with the median taken over the
/// whole set (a median from a block alone gives another bandwidth and fails this).
#[test]
fn row_blocks_make_up_the_whole_direction() {
    for n in [37, DENSE_MAX_POINTS + 44] {
        let x = normal_points(n, 3, 5).mul_scalar(1.5).add_scalar(4.0);
        let s = x.clone().neg().add_scalar(3.0) + normal_points(n, 3, 6).mul_scalar(0.3);
        let kernels: [Box<dyn Kernel>; 3] =
            [Box::new(Rbf::median()), Box::new(Rbf::fixed(0.7).unwrap()), Box::new(Imq::new(1.0, -0.5).unwrap())];
        for kernel in &kernels {
            let whole = host(&svgd_direction(kernel.as_ref(), x.clone(), s.clone()));
            let cuts = [0, 1, n / 3, n / 3 + 7, n];
            let mut rows = Vec::new();
            for w in cuts.windows(2) {
                rows.extend(host(&svgd_direction_rows(kernel.as_ref(), x.clone(), s.clone(), w[0]..w[1]).unwrap()));
            }
            let gap = relative_gap(&rows, &whole);
            assert!(gap < 2e-5, "{} at n = {n}: row blocks differ from the whole by {gap}", kernel.describe());
        }
        let multi = MultiKernel::with_host_weights(&[0.5, 1.0], &[0.5, 0.5], &flex()).unwrap();
        assert!(svgd_direction_rows(&multi, x.clone(), s, 0..n).is_none());
    }
}

/// A particle-sharded step's rows (each rank's direction at its particles, from its block of
/// distances and the gathered sources) make up the whole direction for even and uneven splits,
/// below and above the dense limit, for each kernel that works in blocks (the RBF's one-product
/// form and the IMQ's general one). The ranks are threads exchanging through shared slots; the
/// median comes from the gathered blocks (a median from one block alone gives another
/// bandwidth and fails this). With 200 coordinates for 37 particles (at most 5 ranks: `K n <=
/// d`) the distances come from the Gram matrix split by coordinates (a rank's columns alone
/// give other distances and fail this).
#[test]
fn sharded_rows_make_up_the_whole_direction() {
    use parvi_infer::core::shard::ParticleShard;
    use parvi_infer::kernels::svgd_direction_at_shard;
    for (n, dim) in [(37, 3), (DENSE_MAX_POINTS + 44, 3), (37, 200)] {
        let points = || {
            let x = normal_points(n, dim, 5).mul_scalar(1.5).add_scalar(4.0);
            let s = x.clone().neg().add_scalar(3.0) + normal_points(n, dim, 6).mul_scalar(0.3);
            (x, s)
        };
        let kernels = || -> [Box<dyn Kernel>; 3] {
            [Box::new(Rbf::median()), Box::new(Rbf::fixed(0.7).unwrap()), Box::new(Imq::new(1.0, -0.5).unwrap())]
        };
        for (which, kernel) in kernels().iter().enumerate() {
            let (x, s) = points();
            let whole = host(&svgd_direction(kernel.as_ref(), x, s));
            for ranks in [1, 2, 3, 5] {
                let rows = ThreadGroup::run(ranks, |group| {
                    let (x, s) = points();
                    let kernel = &kernels()[which];
                    let shard = ParticleShard::new(n, &group).unwrap();
                    let s_rows = s.slice([shard.rows()]);
                    let phi = svgd_direction_at_shard(kernel.as_ref(), x, s_rows, &shard).unwrap();
                    host(&phi.expect("rbf and imq work in blocks"))
                });
                let gap = relative_gap(&rows.concat(), &whole);
                assert!(
                    gap < 2e-5,
                    "{} at n = {n}, d = {dim}, {ranks} ranks: the rows differ from the whole by {gap}",
                    kernel.describe()
                );
            }
        }
    }
}

/// SVGD's RBF direction at rows `rows` in `f64` on the host, one pair at a time: the reference
/// both paths round away from.
fn reference_rbf_direction(x: &[f32], s: &[f32], dim: usize, h: f64, rows: &[usize]) -> Vec<f64> {
    let n = x.len() / dim;
    let c = -1.0 / (2.0 * h * h);
    let mut out = Vec::with_capacity(rows.len() * dim);
    for &i in rows {
        let mut acc = vec![0.0; dim];
        for j in 0..n {
            let r2: f64 = (0..dim).map(|q| f64::from(x[i * dim + q] - x[j * dim + q]).powi(2)).sum();
            let k = (c * r2).exp();
            for (q, a) in acc.iter_mut().enumerate() {
                *a += k * f64::from(s[j * dim + q]) + 2.0 * c * k * f64::from(x[j * dim + q] - x[i * dim + q]);
            }
        }
        out.extend(acc.into_iter().map(|a| a / n as f64));
    }
    out
}

#[test]
fn large_sets_go_through_tiles_with_the_dense_numbers() {
    // Above EXACT_MEDIAN_MAX_POINTS: distance tiles formed on the fly and a sampled median.
    let n = EXACT_MEDIAN_MAX_POINTS + 300;
    assert!(n > DENSE_MAX_POINTS && !median_is_exact(n, 2));
    let x = normal_points(n, 2, 3);
    let s = x.clone().neg().mul_scalar(0.8);
    let (xs, ss) = (host(&x), host(&s));
    let rows: Vec<usize> = (0..n).step_by(37).collect();
    let median_h = median_rule_h2(pair_median_sq(&x), n).sqrt();
    for (kernel, h) in [(Rbf::fixed(0.6).unwrap(), 0.6), (Rbf::median(), median_h)] {
        let tiled = host(&svgd_direction(&kernel, x.clone(), s.clone()));
        // The median rule in tiles is the dense direction at the sampled median's bandwidth.
        let dense = host(&svgd_direction_dense(&Rbf::fixed(h).unwrap(), x.clone(), s.clone()));
        let reference = reference_rbf_direction(&xs, &ss, 2, h, &rows);
        let at_rows = |v: &[f32]| -> Vec<f32> { rows.iter().flat_map(|&i| [v[2 * i], v[2 * i + 1]]).collect() };
        let reference_f32: Vec<f32> = reference.iter().map(|&v| v as f32).collect();
        // The tiles (centred points, sums per tile) keep to f32 precision of the f64 reference; the
        // dense path's single n-term products lose more (about 5e-5 of the scale at this n).
        let tiled_error = relative_gap(&at_rows(&tiled), &reference_f32);
        assert!(tiled_error < 2e-5, "{}: tiles vs f64 reference {tiled_error}", kernel.describe());
        let gap = relative_gap(&tiled, &dense);
        assert!(gap < 2e-4, "{}: tiles vs dense {gap}", kernel.describe());
    }
}

/// A small set's direction on a CPU (one host pass under the RBF, `pairs::rbf_direction_small`)
/// is the dense tensor path's, and both are the `f64` reference's to `f32` precision: in few and
/// in many dimensions (the Boston BNN's 753), from one point to past the host path's limit.
#[test]
fn small_sets_take_the_dense_numbers_on_the_host() {
    for (n, dim) in [(1, 3), (2, 3), (20, 3), (20, 753), (64, 40), (65, 40)] {
        let x = normal_points(n, dim, 7).mul_scalar(1.5).add_scalar(4.0);
        let s = x.clone().neg().add_scalar(3.0) + normal_points(n, dim, 8).mul_scalar(0.3);
        let (xs, ss) = (host(&x), host(&s));
        let median_h = median_rule_h2(pair_median_sq(&x), n).sqrt();
        let kernels: [(Box<dyn Kernel>, Option<f64>); 4] = [
            (Box::new(Rbf::median()), Some(median_h)),
            (Box::new(Rbf::han_liu()), Some(median_h / 2f64.sqrt())),
            (Box::new(Rbf::fixed(0.7 * dim as f64).unwrap()), Some(0.7 * dim as f64)),
            (Box::new(Imq::new(1.0, -0.5).unwrap()), None),
        ];
        for (kernel, h) in &kernels {
            let direction = host(&svgd_direction(kernel.as_ref(), x.clone(), s.clone()));
            let dense = host(&svgd_direction_dense(kernel.as_ref(), x.clone(), s.clone()));
            if let Some(h) = h {
                let rows: Vec<usize> = (0..n).collect();
                let reference: Vec<f32> =
                    reference_rbf_direction(&xs, &ss, dim, *h, &rows).iter().map(|&v| v as f32).collect();
                let error = relative_gap(&direction, &reference);
                assert!(error < 2e-5, "{} at n = {n}, dim = {dim}: vs f64 reference {error}", kernel.describe());
            }
            // The two round differently in many dimensions: the host pass centres the points
            // before its Gram product, the dense path does not.
            let gap = relative_gap(&direction, &dense);
            assert!(gap < 1e-4, "{} at n = {n}, dim = {dim}: vs the dense path {gap}", kernel.describe());
        }
    }
}

/// All `n^2` squared distances of `x`'s rows (the diagonal included), sorted, in `f64`.
fn sorted_pair_distances(x: &parvi_model::burn::tensor::Tensor<2>) -> Vec<f64> {
    let [n, d] = x.dims();
    let v = host(x);
    let mut all = Vec::with_capacity(n * n);
    for i in 0..n {
        for j in 0..n {
            all.push((0..d).map(|c| f64::from(v[i * d + c] - v[j * d + c]).powi(2)).sum::<f64>());
        }
    }
    all.sort_by(f64::total_cmp);
    all
}

#[test]
fn pair_median_is_exact_by_selection_and_sampled_within_its_bound() {
    let n = 700;
    assert!(median_is_exact(n, 2) && !median_is_exact(1300, 2));
    let x = normal_points(n, 2, 4).mul_scalar(2.0);
    let all = sorted_pair_distances(&x);
    // Exact: NumPy's median of the n^2 values (n^2 even: the mean of the two middle values),
    // for an even and an odd count, and for one and two points.
    let exact = (all[n * n / 2 - 1] + all[n * n / 2]) / 2.0;
    let got = f64::from(pair_median_sq(&x));
    assert!((got - exact).abs() <= 1e-5 * exact, "exact median {got} vs {exact}");
    let odd = x.clone().narrow(0, 0, n - 1);
    let all_odd = sorted_pair_distances(&odd);
    let (got, exact) = (f64::from(pair_median_sq(&odd)), all_odd[(n - 1) * (n - 1) / 2]);
    assert!((got - exact).abs() <= 1e-5 * exact, "odd count: exact median {got} vs {exact}");
    assert_eq!(pair_median_sq(&x.clone().narrow(0, 0, 1)), 0.0);
    let two = x.clone().narrow(0, 0, 2);
    let half = sorted_pair_distances(&two)[3] / 2.0; // [0, 0, d, d]: (0 + d) / 2
    assert!((f64::from(pair_median_sq(&two)) - half).abs() <= 1e-5 * half);
    // Sampled: the fraction of all pairs below the sample median is 1/2 within Hoeffding's
    // e = sqrt(ln(2 / delta) / (2 m)), delta = 1e-6, for every seed tried.
    let bound_for = |m: usize| ((2.0f64 / 1e-6).ln() / (2.0 * m as f64)).sqrt();
    for (m, seed) in [(MEDIAN_SAMPLE_PAIRS, 1), (MEDIAN_SAMPLE_PAIRS, 2), (MEDIAN_SAMPLE_MIN_PAIRS, 3)] {
        let bound = bound_for(m);
        let sampled = sampled_pair_median_sq(&x, m, seed);
        let med = f64::from(sampled);
        let rank = all.partition_point(|&v| v <= med) as f64 / (n * n) as f64;
        assert!((rank - 0.5).abs() <= bound, "{m} pairs, seed {seed}: sample median at rank {rank} (bound {bound})");
        assert_eq!(sampled_pair_median_sq(&x, m, seed).to_bits(), sampled.to_bits(), "seeded, so repeatable");
    }
    let bound = bound_for(MEDIAN_SAMPLE_PAIRS);
    // A small sample is visibly worse: the bound is not vacuous at this n.
    let coarse: Vec<f64> = (0..20)
        .map(|seed| {
            let med = f64::from(sampled_pair_median_sq(&x, 64, seed));
            (all.partition_point(|&v| v <= med) as f64 / (n * n) as f64 - 0.5).abs()
        })
        .collect();
    assert!(coarse.iter().any(|&e| e > bound), "64 pairs should miss the 2^18-pair bound: {coarse:?}");
}

#[test]
fn matrices_that_cannot_fit_are_refused_by_name_before_allocating() {
    let device = flex();
    // Three million 1-D particles: 12 MB of positions, 36 TB for one n x n f32 matrix.
    let n = 3_000_000;
    let particles = Particles::gaussian(n, 1, 0.0, 1.0, &mut EngineRng::new(0), &device).unwrap();
    let adapter = || AdapterConfig::sgd(0.1).build().unwrap();
    // SVGD with a kernel that cannot work in tiles needs the whole matrix.
    let multi = MultiKernel::with_host_weights(&[0.5, 1.0], &[0.5, 0.5], &device).unwrap();
    let mut svgd = Svgd::new(Box::new(multi), adapter());
    let err = parvi_infer::Engine::init(&mut svgd, &particles).unwrap_err().to_string();
    assert!(err.contains("`particles`") && err.contains(" GB"), "{err}");
    assert!(err.contains("svgd, "), "the error lists the methods that scale: {err}");
    // ... while the RBF works in tiles at any size.
    let mut svgd = Svgd::new(Box::new(Rbf::median()), adapter());
    assert!(parvi_infer::Engine::init(&mut svgd, &particles).is_ok());
    // svgd-cf's m x m Stein kernel matrix.
    let config = ControlFunctionalConfig { m: n, ..Default::default() };
    let mut cf = RandomSubset::with_control_functional(&config, Box::new(Rbf::median()), adapter()).unwrap();
    let err = parvi_infer::Engine::init(&mut cf, &particles).unwrap_err().to_string();
    assert!(err.contains("`m`") && err.contains("svgd-cf's m x m"), "{err}");
    // MMD-FW's N x N Gram matrix.
    let spec = EngineSpec::new(MethodConfig::default_for("mmd-fw").unwrap(), Default::default(), Default::default());
    let err = spec.build().unwrap().init(&particles).unwrap_err().to_string();
    assert!(err.contains("`particles`") && err.contains("mmd-fw's N x N"), "{err}");
}

#[test]
fn svgd_in_tiles_recovers_the_correlated_gaussian() {
    use parvi_infer::{RunConfig, Runner};
    let device = flex();
    let target = Gaussian::new(&GAUSSIAN_MEAN, &GAUSSIAN_COV, &device).unwrap();
    // More particles than the dense path takes, so every step goes through the tiles.
    let n = 2 * DENSE_MAX_POINTS;
    let start = Particles::gaussian(n, 2, 0.0, 1.0, &mut EngineRng::new(5), &device).unwrap();
    let mut svgd = Svgd::new(Box::new(Rbf::median()), AdapterConfig::adagrad(0.05).build().unwrap());
    let out = Runner::new(&mut svgd, &target, start, RunConfig::new(300, 0)).unwrap().run(&mut []).unwrap();
    let (mean, cov) = (out.particles.mean(), out.particles.covariance());
    // Tolerances: about 2 and 3 Monte Carlo standard errors of n exact draws (variances below
    // 0.68: se 0.026 for a mean, 0.03 for a variance, sqrt(2 var^2 / n)); SVGD's particles do
    // at least as well as exact draws on the moments.
    for i in 0..2 {
        assert!((mean[i] - GAUSSIAN_MEAN[i]).abs() < 0.05, "mean {mean:?}");
    }
    for i in 0..4 {
        assert!((cov[i] - GAUSSIAN_COV[i]).abs() < 0.1, "cov {cov:?}");
    }
}

/// A CPU keeps its cache-sized tiles shared among the cores; a GPU takes tiles of
/// `GPU_TILE_SIDE` points (its cost is the tiles' launches); `PARVI_TILE_SIDE` overrides both.
#[test]
fn tiles_follow_the_device() {
    use parvi_model::BackendKind;
    let forced = std::env::var("PARVI_TILE_SIDE").ok().and_then(|v| v.trim().parse::<usize>().ok()).filter(|&s| s > 0);
    for n in [300, 20_000, 100_000] {
        let flex = BackendKind::Flex.device().unwrap();
        let expected = forced.map_or_else(|| PairTiles::for_budget(n), |side| PairTiles::new(n, side));
        assert_eq!(PairTiles::for_device(n, &flex), expected, "flex, n = {n}");
        assert!(forced.is_some() || PairTiles::for_device(n, &flex).block() <= 512, "flex tiles stay cache-sized");
        match BackendKind::Wgpu.device() {
            Ok(gpu) => {
                let side = forced.unwrap_or(GPU_TILE_SIDE).min(n);
                assert_eq!(PairTiles::for_device(n, &gpu).block(), side, "wgpu, n = {n}");
            }
            Err(reason) => {
                if std::env::var_os("PARVI_REQUIRE_WGPU").is_some() {
                    panic!("PARVI_REQUIRE_WGPU is set but wgpu is unavailable: {reason}");
                }
                eprintln!("SKIPPED the wgpu part of tiles_follow_the_device: {reason}");
            }
        }
    }
}

/// The tiled direction of the same points on `backend`, or why the backend is unavailable.
fn tiled_on(backend: parvi_model::BackendKind, n: usize, block: usize) -> Result<Vec<f32>, String> {
    use parvi_model::tensor_ops::matrix_from_vec;
    let device = backend.device().map_err(|e| e.to_string())?;
    let x = matrix_from_vec(host(&normal_points(n, 3, 6)), n, 3, &device);
    let s = x.clone().neg().add_scalar(0.5);
    let phi = svgd_direction_tiled(&Rbf::median(), x, s, &PairTiles::new(n, block)).expect("the rbf works in tiles");
    Ok(host(&phi))
}

#[test]
fn tiled_direction_agrees_across_backends() {
    use parvi_model::BackendKind;
    // 300 points (exact median, kept tiles) and EXACT_MEDIAN_MAX_POINTS + 100 (sampled median,
    // tiles formed on the fly); ndarray runs the tiles on threads like flex, wgpu on one queue.
    assert!(median_is_exact(300, 3) && !median_is_exact(EXACT_MEDIAN_MAX_POINTS + 100, 3));
    for (n, block) in [(300, 64), (EXACT_MEDIAN_MAX_POINTS + 100, 1500)] {
        let flex = tiled_on(BackendKind::Flex, n, block).unwrap();
        let ndarray = tiled_on(BackendKind::Ndarray, n, block).unwrap();
        let gap = relative_gap(&ndarray, &flex);
        assert!(gap < 1e-5, "n = {n}: ndarray vs flex {gap}");
        match tiled_on(BackendKind::Wgpu, n, block) {
            Ok(wgpu) => {
                let gap = relative_gap(&wgpu, &flex);
                assert!(gap < 1e-4, "n = {n}: wgpu vs flex {gap}");
            }
            Err(reason) => {
                if std::env::var_os("PARVI_REQUIRE_WGPU").is_some() {
                    panic!("PARVI_REQUIRE_WGPU is set but wgpu is unavailable: {reason}");
                }
                eprintln!("SKIPPED the wgpu part of tiled_direction_agrees_across_backends: {reason}");
            }
        }
    }
}
