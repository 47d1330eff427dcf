//! The batched multi-chain NUTS (`engines::nuts`): on a correlated 2-D Gaussian and on
//! eight_schools (posteriordb, through `fit` and the registry) the means agree within Monte
//! Carlo error from the draws' own ESS and the sds within tolerance; a fixed large step size
//! without adaptation, where only correct multinomial weights keep the target (a wrong
//! acceptance biases the sds); the tree depth and ESS of an isotropic Gaussian, which a wrong
//! U-turn criterion would wreck (trees to the maximum depth, or random-walk draws); bad options
//! refused by name; a density whose evaluation fails in a region (as an ODE solve fails), whose
//! failed proposals are rejected and counted, with one chain or a thread per chain.

mod common;

use common::{FailsBeyond, flex, posteriordb_dir, truncated_normal};
use parvi_infer::engines::{MetricEstimate, NutsConfig, NutsInit, NutsRun, nuts};
use parvi_infer::evaluation::ess;
use parvi_infer::{AdapterConfig, EngineRng, EngineSpec, FitConfig, KernelConfig, MethodConfig, Whitened, fit};
use parvi_model::LogDensity;
use parvi_model::program::Compiled;
use parvi_model::tensor_ops::{matrix_from_vec, to_vec_f64};
use parvi_models::Gaussian;
use parvi_models::posteriordb::compare::compare;
use parvi_models::posteriordb::{self, ReferenceDraws};

/// Coordinate `j`'s chains from snapshot-major draws.
fn series(draws: &[f64], chains: usize, dim: usize, j: usize) -> Vec<Vec<f64>> {
    let n = draws.len() / (chains * dim);
    (0..chains).map(|c| (0..n).map(|s| draws[(s * chains + c) * dim + j]).collect()).collect()
}

fn mean_sd(x: &[Vec<f64>]) -> (f64, f64) {
    let all: Vec<f64> = x.iter().flatten().copied().collect();
    let n = all.len() as f64;
    let mean = all.iter().sum::<f64>() / n;
    (mean, (all.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt())
}

/// Each coordinate's mean within 4 Monte Carlo sds (`sd / sqrt(ESS)`) of the truth, and its sd
/// within `4 / sqrt(2 ESS_2)` relative plus `slack`, where `ESS_2` is the ESS of the squared
/// deviations (a Gaussian's sd estimate from `n` independent draws has relative sd
/// `1 / sqrt(2 n)`; NUTS's draws are often antithetic for the mean, ESS above the draw count,
/// but not for the square).
fn assert_moments(run: &NutsRun, mean: &[f64], sd: &[f64], slack: f64, what: &str) {
    for j in 0..run.dim {
        let x = series(&run.draws, run.chains, run.dim, j);
        let e = ess(&x);
        let (m, s) = mean_sd(&x);
        let mc = sd[j] / e.sqrt();
        assert!(
            (m - mean[j]).abs() < 4.0 * mc,
            "{what}: coordinate {j} mean {m} vs {} (4 MC sd = {})",
            mean[j],
            4.0 * mc
        );
        let squares: Vec<Vec<f64>> = x.iter().map(|c| c.iter().map(|v| (v - m).powi(2)).collect()).collect();
        let e2 = ess(&squares);
        let tol = 4.0 / (2.0 * e2).sqrt() + slack;
        assert!(
            (s / sd[j] - 1.0).abs() < tol,
            "{what}: coordinate {j} sd {s} vs {} (tolerance {tol}, ESS of the squares {e2:.0})",
            sd[j]
        );
    }
}

#[test]
fn correlated_gaussian_means_and_sds_within_monte_carlo_error() {
    let device = flex();
    // sd 1 and 2, correlation 0.9: the diagonal metric cannot whiten it, the trees must be deep.
    let cov = [1.0, 1.8, 1.8, 4.0];
    let model = Gaussian::new(&[1.0, -2.0], &cov, &device).unwrap();
    let config = NutsConfig { warmup: 500, draws: 1000, ..NutsConfig::default() };
    let run = nuts(&model, &config, None, &mut EngineRng::new(1), &device).unwrap();
    assert_eq!((run.chains, run.draws.len()), (4, 4 * 1000 * 2));
    assert_moments(&run, &[1.0, -2.0], &[1.0, 2.0], 0.0, "correlated 2-D Gaussian");
    // The correlation of the draws.
    let (x, y) = (series(&run.draws, 4, 2, 0), series(&run.draws, 4, 2, 1));
    let (mx, sx) = mean_sd(&x);
    let (my, sy) = mean_sd(&y);
    let n = 4000.0;
    let r = x.iter().flatten().zip(y.iter().flatten()).map(|(a, b)| (a - mx) * (b - my)).sum::<f64>()
        / ((n - 1.0) * sx * sy);
    assert!((r - 0.9).abs() < 0.03, "correlation {r}");
    // Dual averaging reaches its target acceptance (0.8), without divergences. The kept draws'
    // statistic sits above the target (0.91 to 0.95 here over seeds and chains): the step size
    // after warm-up is the iterates' average `exp(x_bar)`, smaller than the last iterate, as in Stan.
    for (c, chain) in run.chain_reports.iter().enumerate() {
        assert!((0.7..0.97).contains(&chain.mean_accept_stat), "chain {c}: accept {}", chain.mean_accept_stat);
        assert_eq!(chain.divergences, 0, "chain {c}");
        assert!(chain.step_size > 0.05 && chain.step_size < 2.0, "chain {c}: step {}", chain.step_size);
        // The metric learned the variances (1 and 4) within the window's noise.
        assert!((chain.inv_metric[1] / chain.inv_metric[0] - 4.0).abs() < 1.5, "{:?}", chain.inv_metric);
    }
    assert!(run.warnings.is_empty(), "{:?}", run.warnings);
    // One batched call per leapfrog step of the slowest chain: fewer calls than chain-gradients.
    assert!(run.batched_calls < run.gradients(), "{} calls, {} gradients", run.batched_calls, run.gradients());
}

#[test]
fn the_metric_is_the_windows_variance_or_its_gradient_scaled_form() {
    // The correlated Gaussian above: Sigma = [[1, 1.8], [1.8, 4]], Sigma^-1's diagonal
    // (4, 1) / 0.76. Stan's estimate is Var(x) = (1, 4); nutpie's sqrt(Var(x) / Var(grad)),
    // with grad = -Sigma^-1 x, is sqrt(diag(Sigma) / diag(Sigma^-1)) = (0.436, 1.744). The last
    // window holds about 200 autocorrelated draws: each estimate within 30% of its own value,
    // and the two intervals do not overlap, so the test tells the estimators apart.
    let device = flex();
    let model = Gaussian::new(&[1.0, -2.0], &[1.0, 1.8, 1.8, 4.0], &device).unwrap();
    for (estimate, expected) in
        [(MetricEstimate::DrawVariance, [1.0, 4.0]), (MetricEstimate::GradientScaled, [0.436, 1.744])]
    {
        let config = NutsConfig { warmup: 500, draws: 50, metric_estimate: estimate, ..NutsConfig::default() };
        let run = nuts(&model, &config, None, &mut EngineRng::new(3), &device).unwrap();
        for (c, chain) in run.chain_reports.iter().enumerate() {
            for (v, e) in chain.inv_metric.iter().zip(expected) {
                assert!((v / e - 1.0).abs() < 0.3, "{estimate:?}, chain {c}: inverse metric {:?}", chain.inv_metric);
            }
        }
    }
}

#[test]
fn a_fixed_large_step_keeps_the_target_only_through_the_multinomial_weights() {
    // No warm-up: step size 1 and the unit metric on sds (0.7, 1, 3). At eps / sd = 1.4 the
    // leapfrog's energy errors are large (acceptance well below 1), and the trajectory's points
    // are distributed by a shadow Hamiltonian with a visibly different sd; only the weights
    // exp(H0 - H) of the multinomial and progressive sampling restore the target's sds.
    let device = flex();
    let sd = [0.7, 1.0, 3.0];
    let cov = [0.49, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 9.0];
    let model = Gaussian::new(&[0.0, 0.0, 0.0], &cov, &device).unwrap();
    let config = NutsConfig { warmup: 0, draws: 3000, init_radius: 1.0, ..NutsConfig::default() };
    let run = nuts(&model, &config, None, &mut EngineRng::new(2), &device).unwrap();
    let accept = run.chain_reports.iter().map(|c| c.mean_accept_stat).sum::<f64>() / 4.0;
    assert!(accept < 0.85, "the step is not large enough to test the weights: accept {accept}");
    assert_moments(&run, &[0.0; 3], &sd, 0.0, "fixed step 1");
}

#[test]
fn the_u_turn_criterion_sets_the_tree_depth_and_the_draws_are_nearly_independent() {
    // An isotropic 20-D Gaussian: after adaptation a U-turn comes after about pi / eps steps
    // (half a period), so trees are 2 to 5 deep and the draws nearly independent (NUTS's
    // draws are often anti-correlated: ESS above the draw count). A criterion that never fires
    // runs every tree to max-depth; one that fires at once makes a random walk with a small ESS.
    let device = flex();
    let d = 20;
    let cov: Vec<f64> = (0..d * d).map(|k| if k % (d + 1) == 0 { 1.0 } else { 0.0 }).collect();
    let model = Gaussian::new(&vec![0.0; d], &cov, &device).unwrap();
    let config = NutsConfig { warmup: 300, draws: 500, max_depth: 8, ..NutsConfig::default() };
    let run = nuts(&model, &config, None, &mut EngineRng::new(3), &device).unwrap();
    for chain in &run.chain_reports {
        assert!((1.5..5.5).contains(&chain.mean_tree_depth), "tree depth {}", chain.mean_tree_depth);
        assert_eq!(chain.max_depth_hits, 0);
    }
    let total = (run.chains * run.draws_per_chain) as f64;
    for j in 0..d {
        let e = ess(&series(&run.draws, run.chains, d, j));
        assert!(e > 0.5 * total, "coordinate {j}: ESS {e:.0} of {total} draws");
    }
    assert_moments(&run, &vec![0.0; d], &vec![1.0; d], 0.0, "isotropic 20-D Gaussian");
}

#[test]
fn eight_schools_through_fit_matches_the_reference() {
    let Some(dir) = posteriordb_dir("nuts eight_schools") else { return };
    let device = flex();
    let model = posteriordb::load("eight_schools", &dir, &device).unwrap();
    let reference = ReferenceDraws::load("eight_schools", &dir).unwrap();
    let spec =
        EngineSpec::new(MethodConfig::default_for("nuts").unwrap(), KernelConfig::default(), AdapterConfig::default());
    let config = FitConfig { steps: 1, ..FitConfig::default() };
    let result = fit(&model, &spec, &config, &mut [], &device).unwrap();
    assert_eq!(result.chains, Some(4));
    assert_eq!(result.draws.len(), 4000);
    assert!(result.diagnostics.polish.is_none(), "an MCMC engine's draws are not polished");
    let reported = to_vec_f64(&model.reported(result.draws.positions.clone()));
    let width = model.param_names().len();
    let selected = reference.select(&reported, width);
    let c = compare(reference.values(), &selected, reference.params(), None).unwrap();
    // The Monte Carlo error of a mean in reference sds is 1 / sqrt(ESS) (ESS of the unconstrained
    // coordinates, the smallest), the reference's own about 0.01-0.02.
    let raw = to_vec_f64(&result.draws.positions);
    let min_ess = (0..model.dim()).map(|j| ess(&series(&raw, 4, model.dim(), j))).fold(f64::INFINITY, f64::min);
    assert!(min_ess > 300.0, "min ESS {min_ess}");
    let tol = 4.0 / min_ess.sqrt() + 0.03;
    for (name, e) in reference.names().iter().zip(&c.mean_error_sd) {
        assert!(e.abs() < tol, "{name}: mean off by {e:.3} reference sd (tolerance {tol:.3})");
    }
    // tau's sd (a heavy right tail) converges slowly: 15%; the others 4 / sqrt(2 ESS) + 3%.
    for (name, r) in reference.names().iter().zip(&c.sd_ratio) {
        let tol = if name == "tau" { 0.15 } else { 4.0 / (2.0 * min_ess).sqrt() + 0.03 };
        assert!((r - 1.0).abs() < tol, "{name}: sd ratio {r:.3} (tolerance {tol:.3})");
    }
    let report = &result.report;
    assert_eq!(report["chain_reports"].as_array().map(Vec::len), Some(4));
    assert!(report["gradients"].as_u64().unwrap() > 4 * 2000);
}

#[test]
fn bad_options_are_errors_naming_the_option() {
    let parse = |v: serde_json::Value| serde_json::from_value::<MethodConfig>(v).map_err(|e| e.to_string());
    let err = parse(serde_json::json!({"method": "nuts", "chain": 3})).unwrap_err();
    assert!(err.contains("chain"), "{err}");
    let ok = parse(serde_json::json!({"method": "nuts", "chains": 2, "max-depth": 6, "target-accept": 0.9})).unwrap();
    assert_eq!(ok.name(), "nuts");
    for (config, option) in [
        (NutsConfig { chains: 0, ..NutsConfig::default() }, "chains"),
        (NutsConfig { draws: 1, ..NutsConfig::default() }, "draws"),
        (NutsConfig { max_depth: 0, ..NutsConfig::default() }, "max-depth"),
        (NutsConfig { target_accept: 1.0, ..NutsConfig::default() }, "target-accept"),
        (NutsConfig { init_radius: f64::NAN, ..NutsConfig::default() }, "init-radius"),
    ] {
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains(option), "{option}: {err}");
    }
    // Inits that do not fill the chains, or at which the density is not finite.
    let device = flex();
    let model = Gaussian::new(&[0.0], &[1.0], &device).unwrap();
    let config = NutsConfig { chains: 2, warmup: 10, draws: 10, ..NutsConfig::default() };
    let err = nuts(&model, &config, Some(&[0.0]), &mut EngineRng::new(4), &device).unwrap_err().to_string();
    assert!(err.contains("init"), "{err}");
    assert_eq!(model.dim(), 1);
    let err = nuts(&model, &config, Some(&[0.0, f64::NAN]), &mut EngineRng::new(4), &device).unwrap_err().to_string();
    assert!(err.contains("chain 2"), "{err}");
}

/// Each chain has its own random stream and its own pace (a chain whose tree is done starts its
/// next transition without waiting), so the draws are the same on one thread or on one per
/// chain: the threads change the grouping of the batched calls, not a chain's arithmetic.
#[test]
fn draws_do_not_depend_on_the_threads() {
    let device = flex();
    let model = Gaussian::new(&[1.0, -2.0], &[1.0, 1.8, 1.8, 4.0], &device).unwrap();
    let run = |threads| {
        let config = NutsConfig { threads, warmup: 100, draws: 50, ..NutsConfig::default() };
        nuts(&model, &config, None, &mut EngineRng::new(11), &device).unwrap()
    };
    let (one, four) = (run(1), run(4));
    assert_eq!(one.draws, four.draws);
    assert_eq!(one.chain_reports, four.chain_reports);
    // One batched call serves every waiting chain: fewer calls than chain-gradients on one thread.
    assert!(one.batched_calls < one.gradients(), "{} calls for {} gradients", one.batched_calls, one.gradients());
}

/// Stan rejects a proposal whose log density throws (an ODE solve that fails) and the chain goes
/// on. `FailsBeyond` fails past `x[1] = 0.5` as an ODE does: a failed row is NaN, and a call
/// whose every row fails is the model's error with an untracked NaN. With one chain every call
/// is one row, so every failure (at a far step-size trial, in a tree, at an init) is a whole
/// call's error: the run goes to its end, the failed proposals are counted with their real cause,
/// and the draws are the normal truncated at the cut (mean and sd in closed form) within their
/// Monte Carlo error. Four chains on four threads (every failure a whole call's) and on one
/// (rows batched, mostly a row's NaN) reject the same proposals and give the same draws.
#[test]
fn a_failed_evaluation_is_a_rejected_proposal_with_one_chain_or_a_thread_per_chain() {
    let device = flex();
    let cut = 0.5;
    let model = Compiled::new(FailsBeyond { cut, one_row_fails_call: false }, &device).unwrap();
    let (mean, sd) = truncated_normal(cut);
    let config = NutsConfig { chains: 1, warmup: 500, draws: 4000, ..NutsConfig::default() };
    let run = nuts(&model, &config, None, &mut EngineRng::new(5), &device).unwrap();
    let chain = &run.chain_reports[0];
    assert!(chain.failed_evaluations > 20, "{chain:?}");
    let first = chain.first_failure.as_deref().unwrap();
    assert!(first.contains("max_num_steps = 100 exceeded"), "{first}");
    let note = format!(
        "nuts: chain 1: {} proposals rejected for a failed evaluation (first at iteration",
        chain.failed_evaluations
    );
    assert!(run.notes.len() == 1 && run.notes[0].starts_with(&note), "{:?}", run.notes);
    assert_eq!(run.summary()["notes"][0].as_str(), Some(run.notes[0].as_str()));
    assert_moments(&run, &[mean, 0.0], &[sd, 1.0], 0.0, "one chain, truncated at the failures");

    let config = NutsConfig { chains: 4, threads: 4, warmup: 300, draws: 1000, ..NutsConfig::default() };
    let threaded = nuts(&model, &config, None, &mut EngineRng::new(6), &device).unwrap();
    let batched = nuts(&model, &NutsConfig { threads: 1, ..config }, None, &mut EngineRng::new(6), &device).unwrap();
    assert_eq!(threaded.draws, batched.draws);
    for (c, (a, b)) in threaded.chain_reports.iter().zip(&batched.chain_reports).enumerate() {
        assert!(a.failed_evaluations > 0, "chain {c}: {a:?}");
        assert_eq!(a.failed_evaluations, b.failed_evaluations, "chain {c}");
    }
    assert_eq!(threaded.notes.len(), 4, "{:?}", threaded.notes);
    assert_moments(&threaded, &[mean, 0.0], &[sd, 1.0], 0.0, "a thread a chain, truncated at the failures");
}

/// Where a run must stop, its message is the model's own: a call that fails in the Laplace
/// frame (the whitened density `fit` samples in) is the model's ODE error, not "no gradient is
/// available"; NUTS from an init where the model fails says why.
#[test]
fn a_run_that_must_stop_names_the_models_failure() {
    let device = flex();
    let model = Compiled::new(FailsBeyond { cut: 0.5, one_row_fails_call: false }, &device).unwrap();
    let frame = Whitened::affine(&model, &[0.0, 0.0], &[2.0, 0.0, 0.0, 1.0], &device).unwrap();
    let beyond = matrix_from_vec(vec![1.0, 0.0], 1, 2, &device);
    let err = parvi_model::score(&frame, beyond, None).unwrap_err().to_string();
    assert!(err.contains("max_num_steps = 100 exceeded"), "{err}");
    let config = NutsConfig { chains: 1, warmup: 10, draws: 10, init: NutsInit::Particles, ..NutsConfig::default() };
    let err = nuts(&frame, &config, Some(&[1.0, 0.0]), &mut EngineRng::new(4), &device).unwrap_err().to_string();
    assert!(err.contains("chain 1") && err.contains("max_num_steps = 100 exceeded"), "{err}");
}
