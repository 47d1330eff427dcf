//! How well calibrated is a particle posterior? On the main job's toy regression (y = x^3 +
//! N(0, 9), 20 training points, 100 test points over [-4, 4]) the same BNN (one hidden layer of
//! 50 ReLU units, lambda fixed at 1) is fitted by SVGD with the main job's protocol and by NUTS
//! (1000 warm-up, 1000 draws), and both predictives are scored on the test points: 90%
//! interval coverage, PIT calibration error, test log-likelihood and the mean epistemic sd.
//!
//! `cargo run --release --example calibration_toy`

use parvi::cli::bnn_run::{BnnProtocol, ProtocolArgs, fit_split, tensor_1d, test_mixture};
use parvi::model::tensor_ops::{matrix_from_vec, to_vec_f32};
use parvi::models::predictive::{RegressionCalibration, RegressionPredictive};
use parvi::models::{Bnn, BnnConfig, BnnTask, WeightPrior};
use parvi_bench::reference::{NutsConfig, nuts_draws};
use parvi_data::{DevSplit, prepare};

fn main() -> anyhow::Result<()> {
    let device = parvi::model::BackendKind::Flex.device()?;
    let ds = parvi_data::synthetic::toy_regression(1);
    let data = prepare(&ds, 0, DevSplit::None)?;
    let test_y: Vec<f64> = data.y_test.iter().map(|&y| data.norm.y_to_original(y)).collect();
    let x_test = matrix_from_vec(data.x_test.iter().map(|&v| v as f32).collect(), data.n_test(), 1, &device);
    println!("| method | draws | 90% coverage | calibration error | test LL | mean epistemic sd | mean total sd |");
    println!("|---|---|---|---|---|---|---|");
    let report = |name: &str, n: usize, pred: &[f32], precisions: &[f64]| {
        let (m, s) = (data.norm.y_mean, data.norm.y_std);
        let mixture = test_mixture(pred, n, precisions, None, m, s, &device);
        let cal = RegressionCalibration::of_mixture(&mixture, tensor_1d(&test_y, &device));
        let p = RegressionPredictive::of_mixture(&mixture);
        let ll = {
            let pit_density = test_y.iter().enumerate().map(|(r, &y)| {
                let dens: f64 = (0..n)
                    .map(|i| {
                        let mean = f64::from(pred[r * n + i]) * s + m;
                        let prec = precisions[i];
                        (0.5 * (prec / (2.0 * std::f64::consts::PI)).ln() - 0.5 * prec * (y - mean).powi(2)).exp()
                    })
                    .sum::<f64>()
                    / n as f64;
                dens.ln()
            });
            pit_density.sum::<f64>() / test_y.len() as f64
        };
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        println!(
            "| {name} | {n} | {:.2} | {:.3} | {ll:.3} | {:.2} | {:.2} |",
            cal.coverage_90,
            cal.calibration_error,
            mean(&p.epistemic_sd),
            mean(&p.total_sd)
        );
    };

    // SVGD with the main job's protocol (`parvi bnn`).
    let protocol = BnnProtocol { fixed_lambda: Some(1.0), ..ProtocolArgs::default().protocol(&ds.name, true)? };
    let fit = fit_split(&data, &protocol, BnnTask::Regression, &device, false, &None)?;
    let pred = to_vec_f32(&fit.model.forward(fit.particles.positions.clone(), x_test.clone()));
    report("svgd (main job)", fit.particles.len(), &pred, &fit.precisions);

    // NUTS on the same model, the reference answer.
    let config = BnnConfig { prior: WeightPrior::Fixed(1.0), ..BnnConfig::default() };
    let model = Bnn::from_config(&data.x_train, &data.y_train, 1, &config, &device)?;
    let init: Vec<f64> = to_vec_f32(&model.init(1, 1, &device)?).into_iter().map(f64::from).collect();
    let draws = nuts_draws(&model, &init, NutsConfig { tune: 1000, draws: 1000, seed: 1 }, &device)?;
    let n = draws.len();
    let flat: Vec<f32> = draws.iter().flatten().map(|&v| v as f32).collect();
    let positions = matrix_from_vec(flat, n, init.len(), &device);
    let pred = to_vec_f32(&model.forward(positions, x_test));
    let g = model.log_gamma_column();
    let precisions: Vec<f64> = draws.iter().map(|d| d[g].exp() / (data.norm.y_std * data.norm.y_std)).collect();
    report("nuts", n, &pred, &precisions);
    Ok(())
}
