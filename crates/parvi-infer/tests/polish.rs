//! The polish step: MALA chains continued from biased particles until split R-hat and bulk ESS
//! meet their thresholds; their draws have the target's moments, within the Monte Carlo error
//! their ESS allows. Bad settings are errors naming them.

mod common;

use common::*;
use parvi_infer::evaluation::{Summary, bulk_ess};
use parvi_infer::samplers::{CHEES_AFTER, PROJECT_FROM, Polish, PolishConfig, PolishKernel, polish};
use parvi_infer::{
    AdapterConfig, EngineRng, EngineSpec, FitConfig, KernelConfig, MethodConfig, Particles, fit, fit_reported,
};
use parvi_model::LogDensity;
use parvi_model::tensor_ops::{matrix_from_vec, to_vec_f64};
use parvi_models::Gaussian;
use parvi_models::posteriordb::{self, ReferenceDraws, compare::compare};

/// A 6-d Gaussian with variances from 0.25 to 4 and one correlated pair.
fn target() -> (Vec<f64>, Vec<f64>) {
    let d = 6;
    let mean: Vec<f64> = (0..d).map(|j| j as f64 - 2.0).collect();
    let mut cov = vec![0.0; d * d];
    for j in 0..d {
        cov[j * d + j] = 0.25 * 2f64.powi(j as i32 * 4 / 5);
    }
    cov[1] = 0.2;
    cov[d] = 0.2;
    (mean, cov)
}

/// The engine `parvi fit` runs by default.
fn default_svgd() -> EngineSpec {
    EngineSpec::new(MethodConfig::default_for("svgd").unwrap(), KernelConfig::default(), AdapterConfig::adagrad(0.05))
}

/// Per-coordinate means and population variances of row-major draws.
fn moments(x: &[f64], d: usize) -> (Vec<f64>, Vec<f64>) {
    let n = (x.len() / d) as f64;
    let mean: Vec<f64> = (0..d).map(|j| x.iter().skip(j).step_by(d).sum::<f64>() / n).collect();
    let var = (0..d).map(|j| x.iter().skip(j).step_by(d).map(|v| (v - mean[j]).powi(2)).sum::<f64>() / n).collect();
    (mean, var)
}

/// Row-major draws of [`target`] have its means and variances within four Monte Carlo errors of
/// `ess` effective draws (of a mean: `sd / sqrt(ess)`; of a Gaussian's variance:
/// `var sqrt(2 / ess)`).
fn assert_target_moments(draws: &[f64], ess: f64) {
    let (mean, cov) = target();
    let d = mean.len();
    let (m, v) = moments(draws, d);
    for j in 0..d {
        let var = cov[j * d + j];
        assert!((m[j] - mean[j]).abs() < 4.0 * (var / ess).sqrt(), "mean {j}: {} vs {}", m[j], mean[j]);
        assert!((v[j] / var - 1.0).abs() < 4.0 * (2.0 / ess).sqrt(), "variance {j}: {} vs {var}", v[j]);
    }
}

/// `n` particles collapsed to a third of each sd of [`target`] and shifted by half an sd: a
/// biased fixed point.
fn biased_particles(n: usize, device: &burn::tensor::Device) -> Particles {
    let (mean, cov) = target();
    let d = mean.len();
    let mut rng = EngineRng::new(3);
    let rows: Vec<f32> = (0..n * d)
        .map(|i| {
            let j = i % d;
            let sd = cov[j * d + j].sqrt();
            (mean[j] + 0.5 * sd + sd / 3.0 * rng.normal()) as f32
        })
        .collect();
    Particles::new(matrix_from_vec(rows, n, d, device))
}

/// More particles than `max_chains`: the step runs `max_chains` chains from a spread of them,
/// and its draws still have the target's means within four Monte Carlo errors.
#[test]
fn polish_runs_at_most_max_chains_chains() {
    let device = flex();
    let (mean, cov) = target();
    let d = mean.len();
    let model = Gaussian::new(&mean, &cov, &device).unwrap();
    let config = PolishConfig { max_chains: 16, ..Default::default() };
    let run = polish(&model, &biased_particles(64, &device), None, &config, 7).unwrap();
    let r = &run.report;
    assert_eq!(r.chains, 16);
    assert!(r.converged && r.min_ess >= 400.0, "{r:?}");
    assert_eq!(run.draws.dims(), [r.kept * 16, d]);
    let (m, _) = moments(&to_vec_f64(&run.draws), d);
    for j in 0..d {
        let var = cov[j * d + j];
        assert!((m[j] - mean[j]).abs() < 4.0 * (var / r.min_ess).sqrt(), "mean {j}: {} vs {}", m[j], mean[j]);
    }
}

#[test]
fn polish_from_biased_particles_returns_draws_with_the_targets_moments() {
    let device = flex();
    let (mean, cov) = target();
    let d = mean.len();
    let model = Gaussian::new(&mean, &cov, &device).unwrap();
    let particles = biased_particles(64, &device);
    // MALA, whose acceptance adapts to 0.574 (ChEES-HMC's test is below).
    let config = PolishConfig { kernel: PolishKernel::Mala, ..Default::default() };
    let run = polish(&model, &particles, None, &config, 7).unwrap();
    let r = &run.report;
    assert!(r.converged && r.max_rhat <= 1.01 && r.min_ess >= 400.0, "{r:?}");
    assert!((0.3..0.9).contains(&r.acceptance), "acceptance {}", r.acceptance);
    assert_eq!(run.draws.dims(), [r.kept * 64, d]);
    assert_target_moments(&to_vec_f64(&run.draws), r.min_ess);
    // The ESS the step reports is the bulk ESS of its own draws (read back here).
    let host = to_vec_f64(&run.draws);
    let chains: Vec<Vec<f64>> = (0..64).map(|c| (0..r.kept).map(|s| host[(s * 64 + c) * d]).collect()).collect();
    assert!(bulk_ess(&chains) >= r.min_ess - 1e-6);
}

/// autoMALA is `p`-reversible: forced from the start on the Gaussian, from biased particles, its
/// draws have the target's means and variances within four Monte Carlo errors of their ESS. On
/// this smooth target the automatic kernel keeps MALA: no chain is stuck.
#[test]
fn auto_mala_draws_have_the_targets_moments_and_auto_keeps_mala_on_a_smooth_target() {
    let device = flex();
    let (mean, cov) = target();
    let model = Gaussian::new(&mean, &cov, &device).unwrap();
    let particles = biased_particles(64, &device);
    let config = PolishConfig { kernel: PolishKernel::AutoMala, ..Default::default() };
    let run = polish(&model, &particles, None, &config, 11).unwrap();
    let r = &run.report;
    assert_eq!(r.kernel, PolishKernel::AutoMala);
    assert!(r.converged, "{r:?}");
    // Two full scores an iteration at least (the forward and the reverse selection).
    assert!(r.score_evals >= 2 * 64 * r.steps, "{r:?}");
    assert_target_moments(&to_vec_f64(&run.draws), r.min_ess);
    let auto = polish(&model, &particles, None, &PolishConfig::default(), 11).unwrap().report;
    assert_eq!(auto.kernel, PolishKernel::Mala, "{auto:?}");
    assert!(auto.stuck_share <= 0.05, "{auto:?}");
}

/// Neal's funnel in 4 dimensions, `v ~ N(0, 3^2)`, `z_i ~ N(0, e^v)`, from particles spread like
/// the truth: one MALA step leaves the chains in the neck stuck (it is tuned to the average
/// chain), the automatic kernel's probe sees it and switches to autoMALA, and `v`'s
/// draws have mean 0 and sd 3 within 4 Monte Carlo errors of their ESS.
#[test]
fn auto_kernel_switches_to_auto_mala_in_a_funnel_and_gets_its_scale() {
    let device = flex();
    let (k, n) = (3, 200);
    let model = Funnel { k };
    let mut rng = EngineRng::new(5);
    let rows: Vec<f32> = (0..n)
        .flat_map(|_| {
            let v = 3.0 * rng.normal();
            let z: Vec<f64> = (0..k).map(|_| (v / 2.0).exp() * rng.normal()).collect();
            std::iter::once(v).chain(z).map(|x| x as f32).collect::<Vec<_>>()
        })
        .collect();
    let particles = Particles::new(matrix_from_vec(rows, n, 1 + k, &device));
    let run = polish(&model, &particles, None, &PolishConfig::default(), 3).unwrap();
    let r = run.report;
    assert_eq!(r.kernel, PolishKernel::AutoMala, "{r:?}");
    assert!(r.stuck_share > 0.05, "{r:?}");
    let v: Vec<f64> = to_vec_f64(&run.draws).iter().step_by(1 + k).copied().collect();
    let (m, var) = moments(&v, 1);
    let (m, sd, ess) = (m[0], var[0].sqrt(), r.min_ess.max(1.0));
    assert!(m.abs() < 4.0 * 3.0 / ess.sqrt(), "v mean {m:.3} (ESS {ess:.0}) {r:?}");
    assert!((sd / 3.0 - 1.0).abs() < 4.0 * (2.0 / ess).sqrt(), "v sd {sd:.3} (ESS {ess:.0}) {r:?}");
}

#[test]
fn fit_with_polish_returns_mixed_draws_where_svgd_collapsed() {
    let device = flex();
    let d = 10;
    let mean = vec![0.5; d];
    let var: Vec<f64> = (0..d).map(|j| 0.5 + 0.2 * j as f64).collect();
    let model = Gaussian::diagonal(&mean, &var, &device).unwrap();
    let spec = default_svgd();
    // 40 particles in 10-d: plain RBF SVGD's variances collapse, and the check flags it.
    let base = FitConfig { particles: 40, steps: 1000, polish: None, ..Default::default() };
    let plain = fit(&model, &spec, &base, &mut [], &device).unwrap();
    let flagged = plain.diagnostics.warnings.iter().find(|w| w.contains("biased fixed point")).expect("flagged");
    assert!(flagged.contains("polish step") && flagged.contains("--no-polish"), "{flagged}");
    let polished =
        fit(&model, &spec, &FitConfig { polish: Some(PolishConfig::default()), ..base }, &mut [], &device).unwrap();
    let p = polished.diagnostics.polish.as_ref().expect("polish ran");
    assert!(p.converged && p.max_rhat <= 1.01 && p.min_ess >= 400.0, "{p:?}");
    assert!(
        polished.diagnostics.warnings.iter().all(|w| !w.contains("biased fixed point")),
        "{:?}",
        polished.diagnostics.warnings
    );
    let (m, v) = moments(&to_vec_f64(&polished.draws.positions), d);
    let (_, v_plain) = moments(&to_vec_f64(&plain.draws.positions), d);
    let tol = 4.0 * (2.0 / p.min_ess).sqrt();
    let ratio = |v: &[f64]| (0..d).map(|j| v[j] / var[j]).sum::<f64>() / d as f64;
    assert!(ratio(&v_plain) < 1.0 - tol, "svgd's variance ratio {} (expected the collapse)", ratio(&v_plain));
    for j in 0..d {
        assert!((m[j] - mean[j]).abs() < 4.0 * (var[j] / p.min_ess).sqrt(), "mean {j}: {}", m[j]);
        assert!((v[j] / var[j] - 1.0).abs() < tol, "variance {j}: {} vs {}", v[j], var[j]);
    }
    // The particles are still the engine's; the draws are the chains'.
    assert_eq!(polished.particles.len(), 40);
    assert_eq!(polished.draws.len(), 40 * p.kept);
}

#[test]
fn bad_polish_settings_are_named() {
    let device = flex();
    let model = Gaussian::diagonal(&[0.0, 0.0], &[1.0, 1.0], &device).unwrap();
    let spec = default_svgd();
    let cases = [
        (PolishConfig { steps: 3, ..Default::default() }, "polish-steps"),
        (PolishConfig { rhat: 1.0, ..Default::default() }, "polish-rhat"),
        (PolishConfig { rhat: f64::NAN, ..Default::default() }, "polish-rhat"),
        (PolishConfig { ess: 0.0, ..Default::default() }, "polish-ess"),
        (PolishConfig { check_every: 0, ..Default::default() }, "polish-check-every"),
        (PolishConfig { max_chains: 7, ..Default::default() }, "polish-max-chains"),
    ];
    for (bad, name) in cases {
        let config = FitConfig { steps: 5, polish: Some(bad), ..Default::default() };
        let err = fit(&model, &spec, &config, &mut [], &device).err().expect("refused").to_string();
        assert!(err.contains(name), "{name}: {err}");
    }
    // Too few chains to judge R-hat: an error naming the particles.
    let few = Particles::new(matrix_from_vec(vec![0.0; 8], 4, 2, &device));
    let err = polish(&model, &few, None, &PolishConfig::default(), 0).err().unwrap().to_string();
    assert!(err.contains("particles"), "{err}");
}

/// ChEES-HMC forced, from biased particles of the correlated 6-d Gaussian: its chains converge and
/// their draws have the target's means and variances within four Monte Carlo errors of their ESS;
/// its adapted acceptance sits near its harmonic-mean target (0.651: the arithmetic mean is higher).
#[test]
fn chees_polish_draws_have_the_targets_moments() {
    let device = flex();
    let (mean, cov) = target();
    let d = mean.len();
    let model = Gaussian::new(&mean, &cov, &device).unwrap();
    let config = PolishConfig { kernel: PolishKernel::Chees, ..Default::default() };
    let run = polish(&model, &biased_particles(64, &device), None, &config, 5).unwrap();
    let r = &run.report;
    assert_eq!(r.kernel, PolishKernel::Chees);
    assert!(r.converged && r.max_rhat <= 1.01 && r.min_ess >= 400.0, "{r:?}");
    assert!(r.trajectory_length.is_some_and(|t| t >= r.step_size), "{r:?}");
    assert!((0.5..0.98).contains(&r.acceptance), "{r:?}");
    assert!(r.dense_metric, "6 dimensions take the dense metric: {r:?}");
    assert_eq!(run.draws.dims(), [r.kept * 64, d]);
    assert_target_moments(&to_vec_f64(&run.draws), r.min_ess);
}

/// A 10-d Gaussian with neighbours correlated 0.9 and sds from 0.1 to 10, from particles with
/// the right marginals but no correlation (what a diagonal approximation gives): MALA's diagonal
/// scale leaves the correlation to its step, ChEES's dense metric from the chains removes it. ChEES
/// converges with fewer gradients than MALA spends (MALA given 20,000 steps), and its draws have
/// the target's means and variances within four Monte Carlo errors.
#[test]
fn chees_needs_fewer_gradients_than_mala_on_a_correlated_gaussian() {
    let device = flex();
    let d = 10;
    let sd: Vec<f64> = (0..d).map(|j| 0.1 * 100f64.powf(j as f64 / (d - 1) as f64)).collect();
    let mut cov = vec![0.0; d * d];
    for i in 0..d {
        for j in 0..d {
            cov[i * d + j] = sd[i] * sd[j] * 0.9f64.powi((i as i32 - j as i32).abs());
        }
    }
    let mean = vec![1.0; d];
    let model = Gaussian::new(&mean, &cov, &device).unwrap();
    let n = 64;
    let mut rng = EngineRng::new(9);
    let rows: Vec<f32> = (0..n * d).map(|i| (mean[i % d] + sd[i % d] * rng.normal()) as f32).collect();
    let particles = Particles::new(matrix_from_vec(rows, n, d, &device));
    let chees = PolishConfig { kernel: PolishKernel::Chees, ..Default::default() };
    let mala = PolishConfig { kernel: PolishKernel::Mala, steps: 20_000, ..Default::default() };
    let c = polish(&model, &particles, None, &chees, 1).unwrap();
    let m = polish(&model, &particles, None, &mala, 1).unwrap().report;
    let r = &c.report;
    assert!(r.converged && r.dense_metric, "{r:?}");
    assert!(r.score_evals < m.score_evals, "ChEES {} gradients, MALA {}: {r:?} {m:?}", r.score_evals, m.score_evals);
    let draws = to_vec_f64(&c.draws);
    let (got_mean, got_var) = moments(&draws, d);
    for j in 0..d {
        let var = cov[j * d + j];
        assert!((got_mean[j] - mean[j]).abs() < 4.0 * (var / r.min_ess).sqrt(), "mean {j}: {}", got_mean[j]);
        assert!((got_var[j] / var - 1.0).abs() < 4.0 * (2.0 / r.min_ess).sqrt(), "variance {j}: {}", got_var[j]);
    }
}

/// Every reference mean within four Monte Carlo errors of the polish's ESS (plus three of the
/// 10,000 reference draws' own, 0.01 sd), every sd within four errors of a variance
/// (`sqrt(2 / ESS)`): `draws` are the reported quantities, `width` a draw.
#[track_caller]
fn assert_reference_moments(reference: &ReferenceDraws, draws: &[f64], width: usize, p: &Polish) {
    let c = compare(reference.values(), &reference.select(draws, width), reference.params(), None).unwrap();
    let (mean_tol, sd_tol) = (4.0 / p.min_ess.sqrt() + 0.03, 4.0 * (2.0 / p.min_ess).sqrt());
    for ((name, e), r) in reference.names().iter().zip(&c.mean_error_sd).zip(&c.sd_ratio) {
        assert!(e.abs() < mean_tol, "{name}: mean off by {e:.3} sd (tolerance {mean_tol:.3}); {p:?}");
        assert!((r - 1.0).abs() < sd_tol, "{name}: sd ratio {r:.3} (tolerance {sd_tol:.3}); {p:?}");
    }
}

/// eight_schools (non-centred), the default path with the ChEES polish through `fit_reported`:
/// every reference mean within four Monte Carlo errors of the polish's ESS (plus three of the
/// 10,000 reference draws' own, 0.01 sd), every sd within four errors of a variance
/// (`sqrt(2 / ESS)`, which also covers tau's heavier tail); and one convergence rule: the
/// summary of the returned draws (the reported quantities and lp__, `Summary::of_chains`) shows
/// the polish step's own R-hat, so none above 1.01.
#[test]
fn chees_polish_gets_eight_schools_right_and_stops_on_the_summarys_rhat() {
    let Some(dir) = common::posteriordb_dir("polish/eight_schools") else { return };
    let device = flex();
    let name = "eight_schools-eight_schools_noncentered";
    let model = posteriordb::load(name, &dir, &device).unwrap();
    let reference = ReferenceDraws::load(name, &dir).unwrap();
    let spec = default_svgd();
    let config = FitConfig {
        polish: Some(PolishConfig { kernel: PolishKernel::Chees, ..Default::default() }),
        ..Default::default()
    };
    let reported = |x| model.reported(x);
    let result = fit_reported(&model, Some(&reported), &spec, &config, &mut [], &device).unwrap();
    let p = result.diagnostics.polish.clone().expect("polished");
    assert!(p.converged && p.kernel == PolishKernel::Chees, "{p:?}");
    let width = model.param_names().len();
    let draws = to_vec_f64(&model.reported(result.draws.positions.clone()));
    assert_reference_moments(&reference, &draws, width, &p);
    // The summary of the same draws: chain after chain, lp__ first, as `parvi fit` prints it.
    let chains = result.chains.expect("chains");
    let rows = result.draws.len();
    let lp = to_vec_f64(&model.log_prob(result.draws.positions.clone(), None));
    let per = rows / chains;
    let column = |value: &dyn Fn(usize) -> f64| -> Vec<f64> {
        (0..chains).flat_map(|ch| (0..per).map(move |s| s * chains + ch)).map(value).collect()
    };
    let mut names = vec!["lp__".to_string()];
    names.extend(model.param_names());
    let mut columns = vec![column(&|row| lp[row])];
    for j in 0..width {
        columns.push(column(&|row| draws[row * width + j]));
    }
    let summary = Summary::of_chains(&names, &columns, chains).unwrap();
    let max_rhat = summary.rows.iter().filter_map(|r| r.rhat).fold(f64::NEG_INFINITY, f64::max);
    // lp__ here is the model's log density, the polish step's the whitened one: the same up to a
    // constant, so the same ranks up to f32 rounding.
    assert!((max_rhat - p.max_rhat).abs() < 2e-3, "summary R-hat {max_rhat}, polish {}", p.max_rhat);
    assert!(max_rhat <= 1.01 + 2e-3, "{max_rhat}");
}

/// The default kernel on eight_schools: MALA's split R-hat falls so slowly (1.7 after 50 steps:
/// about 4,800 steps projected, where MALA had not met the rule after [`CHEES_AFTER`]) that the
/// chains go to ChEES-HMC at an early look, well before [`CHEES_AFTER`]; the report says after
/// how many MALA steps, and ChEES's draws are right. A hand-off on the step count alone fails it.
#[test]
fn auto_hands_eight_schools_to_chees_after_mala_stalls() {
    let Some(dir) = common::posteriordb_dir("polish/eight_schools_auto") else { return };
    let device = flex();
    let name = "eight_schools-eight_schools_noncentered";
    let model = posteriordb::load(name, &dir, &device).unwrap();
    let reference = ReferenceDraws::load(name, &dir).unwrap();
    let reported = |x| model.reported(x);
    let result =
        fit_reported(&model, Some(&reported), &default_svgd(), &FitConfig::default(), &mut [], &device).unwrap();
    let p = result.diagnostics.polish.clone().expect("polished");
    assert!(p.converged && p.kernel == PolishKernel::Chees, "{p:?}");
    let mala = p.mala_before_chees.expect("handed over");
    assert!((PROJECT_FROM..CHEES_AFTER / 2).contains(&mala), "handed over after {mala} MALA steps: {p:?}");
    let draws = to_vec_f64(&model.reported(result.draws.positions.clone()));
    assert_reference_moments(&reference, &draws, model.param_names().len(), &p);
}

/// NUTS as the polish kernel (`fit` runs it; it is an engine): 4 chains x 1,000 draws from the
/// particles, judged by the polish step's own rule, with the target's means and variances within
/// four Monte Carlo errors of their ESS; `polish` itself refuses it, naming the setting.
#[test]
fn nuts_polish_under_fit_has_the_targets_moments_and_polish_alone_refuses_it() {
    let device = flex();
    let (mean, cov) = target();
    let d = mean.len();
    let model = Gaussian::new(&mean, &cov, &device).unwrap();
    let spec = default_svgd();
    let polish_config = PolishConfig { kernel: PolishKernel::Nuts, ..Default::default() };
    let config = FitConfig { particles: 64, polish: Some(polish_config), ..Default::default() };
    let result = fit(&model, &spec, &config, &mut [], &device).unwrap();
    let p = result.diagnostics.polish.clone().expect("polished");
    assert!(p.kernel == PolishKernel::Nuts && p.chains == 4 && p.kept == 1000, "{p:?}");
    assert!(p.converged && p.max_rhat <= 1.01 && p.min_ess >= 400.0, "{p:?}");
    assert_eq!((result.chains, result.draws.len()), (Some(4), 4000));
    assert!(p.before_nuts.is_none() && p.score_evals >= 4 * 2000, "{p:?}");
    assert_target_moments(&result.draws.to_rows().iter().flatten().map(|&v| v as f64).collect::<Vec<_>>(), p.min_ess);
    assert_eq!(result.draws.dim(), d);
    let err = polish(&model, &biased_particles(64, &device), None, &polish_config, 7).err().expect("refused");
    assert!(err.to_string().contains("polish-kernel"), "{err}");
}

/// A failed evaluation is a rejected proposal for MALA, autoMALA and ChEES-HMC, as for Stan's
/// sampler: `FailsBeyond` fails past `x[1] = 1` and, as an ODE refuses a whole call for one
/// particle's non-finite initial state, any failing row fails the whole call (the model's error,
/// an untracked NaN at every row). Each kernel's run goes to its end with the failures counted
/// under the model's own cause (every chain's proposal rejected where a call failed: that
/// rejection does not depend on the chain's own proposal, so each chain still keeps the target),
/// and its draws are the normal truncated at the cut (mean and sd in closed form) within four
/// Monte Carlo errors of their ESS.
#[test]
fn failed_evaluations_are_rejected_proposals_in_mala_auto_mala_and_chees() {
    let device = flex();
    let cut = 1.0;
    let model = parvi_model::program::Compiled::new(FailsBeyond { cut, one_row_fails_call: true }, &device).unwrap();
    let (mean, sd) = truncated_normal(cut);
    let n = 8;
    let mut rng = EngineRng::new(9);
    let mut rows = Vec::with_capacity(2 * n);
    while rows.len() < 2 * n {
        let (a, b) = (rng.normal(), rng.normal());
        if a < cut {
            rows.extend([a as f32, b as f32]);
        }
    }
    let particles = Particles::new(matrix_from_vec(rows, n, 2, &device));
    for kernel in [PolishKernel::Mala, PolishKernel::AutoMala, PolishKernel::Chees] {
        let config = PolishConfig { kernel, steps: 4000, ..Default::default() };
        let run = polish(&model, &particles, None, &config, 13).unwrap();
        let r = &run.report;
        assert!(r.failed_evaluations > 0, "{kernel:?}: {r:?}");
        let first = r.first_failure.as_deref().unwrap_or_default();
        assert!(first.contains("non-finite initial state"), "{kernel:?}: {first}");
        assert!(r.describe().contains("proposals rejected for a failed evaluation"), "{}", r.describe());
        let draws = to_vec_f64(&run.draws);
        let (m, var) = moments(&draws, 2);
        let ess = r.min_ess;
        assert!(ess >= 100.0, "{kernel:?}: {r:?}");
        for (j, (mu, s)) in [(mean, sd), (0.0, 1.0)].into_iter().enumerate() {
            assert!((m[j] - mu).abs() < 4.0 * s / ess.sqrt(), "{kernel:?}: mean {j} {} vs {mu} (ESS {ess:.0})", m[j]);
            let ratio = var[j].sqrt() / s;
            assert!((ratio - 1.0).abs() < 4.0 / (2.0 * ess).sqrt(), "{kernel:?}: sd {j} ratio {ratio} (ESS {ess:.0})");
        }
        eprintln!("{kernel:?}: {} failed, {}", r.failed_evaluations, r.describe());
    }
}

/// A particle run that diverges is a failed phase, not a failed fit (issue 59: samplers that
/// never die): SVGD at a step size far too large on `FailsBeyond` (NaN past `x[1] = 1`) steps
/// particles past the cut, their NaN scores spread to every particle and the run diverges. On the
/// default path the check and the polish step go on from its last finite particles, the path
/// says so, and the draws are still the truncated normal within four Monte Carlo errors of their
/// ESS. Where the particles are the answer (no polish step) the divergence stays an error.
#[test]
fn a_diverged_particle_run_hands_its_last_finite_particles_to_the_polish_step() {
    let device = flex();
    let cut = 1.0;
    let model = parvi_model::program::Compiled::new(FailsBeyond { cut, one_row_fails_call: false }, &device).unwrap();
    let spec = EngineSpec::new(
        MethodConfig::default_for("svgd").unwrap(),
        KernelConfig::default(),
        AdapterConfig::adagrad(5.0),
    );
    let config = FitConfig { precondition: parvi_infer::Precondition::None, progress: false, ..FitConfig::default() };
    let result = fit(&model, &spec, &config, &mut [], &device).unwrap();
    let svgd = result.path.iter().find(|p| p.name == "svgd").expect("an svgd phase");
    assert!(svgd.outcome.contains("diverged at step"), "{svgd:?}");
    let p = result.diagnostics.polish.clone().expect("polished");
    assert!(p.converged, "{p:?}");
    let (mean, sd) = truncated_normal(cut);
    let (m, var) = moments(&result.draws.to_rows().concat().iter().map(|&v| v as f64).collect::<Vec<_>>(), 2);
    for (j, (mu, s)) in [(mean, sd), (0.0, 1.0)].into_iter().enumerate() {
        assert!((m[j] - mu).abs() < 4.0 * s / p.min_ess.sqrt(), "mean {j} {} vs {mu} ({p:?})", m[j]);
        let ratio = var[j].sqrt() / s;
        assert!((ratio - 1.0).abs() < 4.0 / (2.0 * p.min_ess).sqrt(), "sd {j} ratio {ratio} ({p:?})");
    }
    // A diverged phase whose draws were replaced is a line of the path, not a warning.
    let w = &result.diagnostics.warnings;
    assert!(!w.iter().any(|m| m.contains("diverged")), "{w:#?}");
    let alone = FitConfig { polish: None, ..config };
    let err = fit(&model, &spec, &alone, &mut [], &device).err().expect("the particles are the answer");
    assert!(matches!(err, parvi_infer::RunError::Diverged { .. }), "{err}");
}
