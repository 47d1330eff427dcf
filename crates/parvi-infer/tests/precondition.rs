//! The Laplace preconditioner: on a Gaussian target (where the Laplace approximation is exact)
//! it recovers the mean and covariance across scales of 1e-3 to 1e2 with a correlation of 0.9,
//! and the whitened target is `N(0, I)`: its score at `z` is `-z`.

mod common;

use common::{flex, host};
use parvi_infer::{EngineRng, Laplace, LaplaceConfig, Whitened};
use parvi_model::LogDensity;
use parvi_model::tensor_ops::matrix_from_vec;
use parvi_models::Gaussian;

#[test]
fn laplace_recovers_a_badly_scaled_correlated_gaussian() {
    let device = flex();
    // sd 1e-3, 90 and 1; the first two correlated 0.9; the mean far from the starts.
    let (s1, s2, rho) = (1e-3, 90.0, 0.9);
    let mean = [0.5, -150.0, 3.0];
    let cov = [s1 * s1, rho * s1 * s2, 0.0, rho * s1 * s2, s2 * s2, 0.0, 0.0, 0.0, 1.0];
    let target = Gaussian::new(&mean, &cov, &device).unwrap();
    let laplace = Laplace::fit(&target, &LaplaceConfig::default(), &mut EngineRng::new(3), &device).unwrap();
    assert!(laplace.full_rank);
    let sd = [s1, s2, 1.0];
    for i in 0..3 {
        // f32 evaluation: the mode to a small fraction of an sd.
        assert!((laplace.mode[i] - mean[i]).abs() < 0.02 * sd[i], "mode {:?}", laplace.mode);
    }
    let got_sd = laplace.sd();
    for i in 0..3 {
        assert!((got_sd[i] / sd[i] - 1.0).abs() < 0.02, "sd {got_sd:?}");
    }
    // The whitened target is N(0, I): score(z) = -z.
    let whitened = Whitened::new(&target, &laplace, &device).unwrap();
    let z = matrix_from_vec(vec![0.3, -1.2, 0.7, 1.5, 0.2, -0.4], 2, 3, &device);
    let s = parvi_model::score(&whitened, z.clone(), None).unwrap();
    let (g, z) = (host(&s.grad), host(&z));
    for (gi, zi) in g.iter().zip(&z) {
        assert!((gi + zi).abs() < 0.05, "score {g:?} at {z:?}");
    }
    assert_eq!(whitened.dim(), 3);
}

/// A posterior with two separate modes: the search's starts find the second one, and the
/// default path starts its particles over both (without it every particle starts at one mode
/// and SVGD never crosses: the mean sits on that mode, 2 sd from the truth), with a warning. A
/// Gaussian has no other mode.
#[test]
fn separate_modes_are_found_and_the_particles_start_over_all_of_them() {
    use parvi_infer::{EngineSpec, FitConfig, KernelConfig, MethodConfig, Precondition, fit};
    let device = flex();
    let mixture = parvi_models::builtin_target("mixture", &device).unwrap();
    let laplace =
        Laplace::fit(mixture.density.as_ref(), &LaplaceConfig::default(), &mut EngineRng::new(0), &device).unwrap();
    assert_eq!(laplace.other_modes.len(), 1, "{:?}", laplace.other_modes);
    let gaussian = parvi_models::builtin_target("gaussian", &device).unwrap();
    let one =
        Laplace::fit(gaussian.density.as_ref(), &LaplaceConfig::default(), &mut EngineRng::new(0), &device).unwrap();
    assert!(one.other_modes.is_empty(), "{:?}", one.other_modes);

    let spec = EngineSpec::new(
        MethodConfig::default_for("svgd").unwrap(),
        KernelConfig::default(),
        parvi_infer::AdapterConfig::adagrad(0.05),
    );
    let run = |precondition| {
        let config = FitConfig { steps: 500, precondition, check_steps: 0, polish: None, ..FitConfig::default() };
        fit(mixture.density.as_ref(), &spec, &config, &mut [], &device).unwrap()
    };
    let result = run(Precondition::Laplace);
    let mean = result.particles.mean();
    // The modes are at +-(2, 2) with equal weight; 100 particles split evenly start half in
    // each, so the mean is near 0 (one mode alone puts it at 2 in both coordinates).
    assert!(mean.iter().all(|m| m.abs() < 0.5), "mean {mean:?}");
    assert!(result.diagnostics.warnings.iter().any(|w| w.contains("separate modes")), "{:?}", result.diagnostics);
}
