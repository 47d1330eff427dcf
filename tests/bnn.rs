//! The BNN learns: on the toy regression its test RMSE is well under the prior-mean predictor's,
//! and the main job writes its summary and plot. Its fast log-joint equals the DSL form for every
//! architecture and likelihood; fused and plain layers give the same SVGD run; a classification
//! BNN learns; predictions and bad input behave.

mod common;

use std::process::Command;

#[test]
fn main_job_fits_the_toy_regression_far_better_than_the_mean() {
    let dir = tempfile::tempdir().unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_parvi"))
        .args(["bnn", "--out", dir.path().to_str().unwrap()])
        .status()
        .unwrap();
    assert!(status.success());
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("bnn_summary.json")).unwrap()).unwrap();
    let rmse = summary["test_rmse"].as_f64().unwrap();
    // The prior-mean predictor's test RMSE: the spread of y = x^3 + noise over the test grid.
    let toy = parvi_data::synthetic::toy_regression(1);
    let split = &toy.splits[0];
    let train_mean = split.train.iter().map(|&r| toy.y[r]).sum::<f64>() / split.train.len() as f64;
    let mean_rmse =
        (split.test.iter().map(|&r| (toy.y[r] - train_mean).powi(2)).sum::<f64>() / split.test.len() as f64).sqrt();
    assert!(rmse < 0.35 * mean_rmse, "BNN test RMSE {rmse} vs prior-mean predictor {mean_rmse}");
    let svg = std::fs::read_to_string(dir.path().join("bnn_predictive.svg")).unwrap();
    assert!(svg.contains("<polygon") || svg.contains("<path"));
    // A posterior that fits its data raises no flat-predictor warning.
    assert_eq!(summary["warnings"], serde_json::json!([]), "unexpected warnings: {}", summary["warnings"]);
}

/// A weight precision of 1e6 (prior sd 0.001) holds every weight at zero: the network is the
/// flat predictor, which no convergence diagnostic sees (the particles are at rest). The run
/// must say so, in the summary and on stderr.
#[test]
fn a_collapsed_posterior_warns_that_it_predicts_no_better_than_a_constant() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_parvi"))
        .args(["bnn", "--lambda", "1e6", "--out", dir.path().to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("warning: the posterior predicts its training targets no better than their mean"),
        "{stderr}"
    );
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("bnn_summary.json")).unwrap()).unwrap();
    let warnings = summary["warnings"].as_array().unwrap();
    assert!(warnings.iter().any(|w| w.as_str().unwrap().contains("flat predictor")), "{warnings:?}");
}

#[test]
fn unknown_dataset_and_classification_data_are_refused_by_name() {
    let out = Command::new(env!("CARGO_BIN_EXE_parvi"))
        .args(["bnn", "--dataset", "nope", "--out", "/tmp/x"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("nope"), "{err}");
    assert!(!err.contains("panicked"));
}

/// A seeded minibatch of `len` rows out of `rows` (every third row).
fn every_third_row(len: usize, rows: usize, device: &parvi::model::burn::tensor::Device) -> parvi::model::Minibatch {
    let idx: Vec<i64> = (0..len).map(|i| (i * 3) as i64).collect();
    parvi::model::Minibatch {
        indices: parvi::model::burn::tensor::Tensor::from_data(
            parvi::model::burn::tensor::TensorData::new(idx, [len]),
            device,
        ),
        len,
        total: rows,
    }
}

/// The architectures and likelihoods the tests run through: the reference model under both
/// weight priors, a deeper tanh regression, and binary and three-class classification.
fn configs() -> Vec<parvi::models::BnnConfig> {
    use parvi::model::layers::Activation;
    use parvi::models::{BnnConfig, BnnTask, WeightPrior};
    let base = BnnConfig { hidden: vec![7], ..BnnConfig::default() };
    vec![
        base.clone(),
        BnnConfig { prior: WeightPrior::Fixed(2.5), ..base.clone() },
        BnnConfig { hidden: vec![6, 4], activation: Activation::Tanh, ..base.clone() },
        BnnConfig { task: BnnTask::Classification { classes: 2 }, ..base.clone() },
        BnnConfig {
            hidden: vec![5, 5],
            task: BnnTask::Classification { classes: 3 },
            prior: WeightPrior::Fixed(1.0),
            ..base.clone()
        },
        BnnConfig { hidden: vec![], task: BnnTask::Classification { classes: 3 }, ..base },
    ]
}

/// Inputs and targets fitting `config`'s task: regression targets, or class indices.
fn toy_data(config: &parvi::models::BnnConfig, rows: usize, d: usize, seed: u64) -> (Vec<f64>, Vec<f64>) {
    let mut rng = parvi::infer::EngineRng::new(seed);
    let x: Vec<f64> = (0..rows * d).map(|_| rng.normal()).collect();
    let y = x
        .chunks(d)
        .map(|r| {
            let v = r[0] - 0.5 * r[1] + 0.3 * rng.normal();
            match config.task {
                parvi::models::BnnTask::Regression => v,
                parvi::models::BnnTask::Classification { classes } => {
                    // Thresholds at the standard normal's quantiles of 1/3 and 2/3 (or 1/2).
                    let cuts: &[f64] = if classes == 2 { &[0.0] } else { &[-0.48, 0.48] };
                    cuts.iter().filter(|&&c| v > c).count() as f64
                }
            }
        })
        .collect();
    (x, y)
}

/// The BNN's hand-arranged log-joint equals the same density written with the layout and the
/// distributions on plain-op layers, values and scores, for every architecture, likelihood and
/// weight prior, with a minibatch.
#[test]
fn fast_log_joint_equals_the_dsl_form() {
    use parvi::model::tensor_ops::to_vec_f32;
    use parvi::model::{LogDensity, Minibatch, score};
    use parvi::models::Bnn;
    let device = common::flex();
    let mut rng = parvi::infer::EngineRng::new(3);
    let (rows, d) = (40, 3);
    for config in configs() {
        let (x, y) = toy_data(&config, rows, d, 5);
        let model = Bnn::from_config(&x, &y, d, &config, &device).unwrap();
        let theta = parvi::infer::Particles::gaussian(5, model.dim(), 0.0, 0.7, &mut rng, &device).unwrap().positions;
        let batch = every_third_row(10, rows, &device);
        let fast = to_vec_f32(&model.log_prob(theta.clone(), Some(&batch)));
        let dsl = to_vec_f32(&model.log_prob_dsl(theta.clone(), Some(&batch)));
        for (a, b) in fast.iter().zip(&dsl) {
            assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{config:?}: {a} vs {b}");
        }
        let g_fast = to_vec_f32(&score(&model, theta.clone(), Some(&batch)).unwrap().grad);
        let dsl_model = DslBnn(&model);
        let g_dsl = to_vec_f32(&score(&dsl_model, theta, Some(&batch)).unwrap().grad);
        for (a, b) in g_fast.iter().zip(&g_dsl) {
            assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{config:?} score: {a} vs {b}");
        }
    }

    /// The DSL form as a density of its own, for its score.
    struct DslBnn<'a>(&'a Bnn);
    impl LogDensity for DslBnn<'_> {
        fn dim(&self) -> usize {
            self.0.dim()
        }
        fn log_prob(
            &self,
            x: parvi::model::burn::tensor::Tensor<2>,
            batch: Option<&Minibatch>,
        ) -> parvi::model::burn::tensor::Tensor<1> {
            self.0.log_prob_dsl(x, batch)
        }
    }
}

/// The reference model with fused layers runs the same SVGD trajectory as with plain-op layers
/// (the form the UCI numbers were measured with): 50 minibatch steps of the Boston-sized network
/// agree to float rounding (measured 2e-7; over hundreds of steps rounding differences grow
/// until trajectories part, as any reordering of the sums would make them).
#[test]
fn fused_and_plain_layers_give_the_same_svgd_run() {
    use parvi::infer::{AdapterConfig, BatchOrder, Particles, Rbf, RunConfig, Runner, Svgd};
    use parvi::model::layers::LayerOps;
    use parvi::model::tensor_ops::to_vec_f32;
    use parvi::models::{Bnn, BnnConfig};
    let device = common::flex();
    let (rows, d) = (300, 13);
    let (x, y) = toy_data(&BnnConfig::default(), rows, d, 7);
    let run = |layer_ops: LayerOps| {
        let model = Bnn::from_config(&x, &y, d, &BnnConfig { layer_ops, ..BnnConfig::default() }, &device).unwrap();
        let start = Particles::new(model.init(20, 1, &device).unwrap());
        let mut svgd = Svgd::new(Box::new(Rbf::median()), AdapterConfig::adagrad(1e-2).build().unwrap());
        let config = RunConfig { batch_size: Some(100), batch_order: BatchOrder::Shuffle, ..RunConfig::new(50, 3) };
        let out = Runner::new(&mut svgd, &model, start.clone(), config).unwrap().run(&mut []).unwrap();
        (to_vec_f32(&start.positions), to_vec_f32(&out.particles.positions))
    };
    let ((start_f, fused), (start_p, plain)) = (run(LayerOps::Fused), run(LayerOps::Plain));
    let rel = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(a, b)| (a - b).abs() / (1.0 + b.abs())).fold(0.0, f32::max);
    // The initial log gamma comes from each network's initial fit: equal up to rounding.
    let err = rel(&start_f, &start_p);
    assert!(err < 1e-5, "initial particles differ by {err}");
    let err = rel(&fused, &plain);
    assert!(err < 1e-5, "fused vs plain layers after 50 steps: max relative difference {err}");
    assert!(rel(&fused, &start_f) > 1e-1, "the particles barely moved: the comparison proves nothing");
}

/// A categorical BNN learns three classes separated by a linear score: test accuracy far above
/// the 1/3 of guessing and close to the 0.85 the label noise allows (seeded; a broken
/// likelihood or gradient stays near 1/3).
#[test]
fn classification_bnn_learns_three_classes() {
    use parvi::infer::{AdapterConfig, BatchOrder, Particles, Rbf, RunConfig, Runner, Svgd};
    use parvi::models::{Bnn, BnnConfig, BnnPrediction, BnnTask};
    let device = common::flex();
    let config = BnnConfig { hidden: vec![20], task: BnnTask::Classification { classes: 3 }, ..BnnConfig::default() };
    let d = 4;
    let (x, y) = toy_data(&config, 600, d, 11);
    let (train, test) = (400, 200);
    let model = Bnn::from_config(&x[..train * d], &y[..train], d, &config, &device).unwrap();
    let start = Particles::new(model.init(20, 2, &device).unwrap());
    let mut svgd = Svgd::new(Box::new(Rbf::median()), AdapterConfig::adagrad(5e-2).build().unwrap());
    let run = RunConfig { batch_size: Some(100), batch_order: BatchOrder::Shuffle, ..RunConfig::new(500, 1) };
    let out = Runner::new(&mut svgd, &model, start, run).unwrap().run(&mut []).unwrap();
    let BnnPrediction::Classification { probabilities } =
        model.predict_rows(out.particles.positions, &x[train * d..], &device).unwrap()
    else {
        panic!("a classification BNN predicts class probabilities");
    };
    assert_eq!(probabilities.dims(), [20, test, 3]);
    let mean = parvi::model::tensor_ops::to_vec_f64(&probabilities.mean_dim(0).reshape([test, 3]));
    let correct = mean
        .chunks(3)
        .zip(&y[train..])
        .filter(|&(p, label)| {
            let best = (0..3).max_by(|&a, &b| p[a].total_cmp(&p[b])).unwrap();
            best as f64 == *label
        })
        .count();
    let accuracy = correct as f64 / test as f64;
    assert!(accuracy > 0.75, "test accuracy {accuracy}");
}

/// Predictions: regression means are the network outputs and the noise precisions
/// `exp(log gamma)`; class probabilities are distributions; bad rows are errors naming them.
#[test]
fn predictions_have_the_documented_shapes_and_values() {
    use parvi::model::tensor_ops::{to_vec_f32, to_vec_f64};
    use parvi::models::{Bnn, BnnPrediction};
    let device = common::flex();
    for config in configs() {
        let (x, y) = toy_data(&config, 30, 3, 2);
        let model = Bnn::from_config(&x, &y, 3, &config, &device).unwrap();
        let particles = model.init(6, 0, &device).unwrap();
        match model.predict_rows(particles.clone(), &x[..15], &device).unwrap() {
            BnnPrediction::Regression { mean, noise_precision } => {
                assert_eq!(mean.dims(), [6, 5]);
                let rows = parvi::model::tensor_ops::matrix_from_vec(
                    x[..15].iter().map(|&v| v as f32).collect(),
                    5,
                    3,
                    &device,
                );
                let direct = to_vec_f32(&model.forward(particles.clone(), rows).transpose());
                assert_eq!(to_vec_f32(&mean), direct);
                let g = model.log_gamma_column();
                let log_gamma = to_vec_f64(&particles.clone().narrow(1, g, 1));
                for (p, l) in to_vec_f64(&noise_precision).iter().zip(log_gamma) {
                    assert!((p - l.exp()).abs() <= 1e-5 * p, "{p} vs exp({l})");
                }
            }
            BnnPrediction::Classification { probabilities } => {
                let parvi::models::BnnTask::Classification { classes } = config.task else { unreachable!() };
                assert_eq!(probabilities.dims(), [6, 5, classes]);
                for total in to_vec_f64(&probabilities.sum_dim(2)) {
                    assert!((total - 1.0).abs() < 1e-5, "probabilities sum to {total}");
                }
            }
        }
        let err = model.predict_rows(particles.clone(), &x[..14], &device).unwrap_err().to_string();
        assert!(err.contains("14 values") && err.contains("3 inputs"), "{err}");
        let mut bad = x[..6].to_vec();
        bad[4] = f64::NAN;
        let err = model.predict_rows(particles, &bad, &device).unwrap_err().to_string();
        assert!(err.contains("row 1 column 1"), "{err}");
    }
}

/// Class labels outside `0..classes`, fractional labels, empty hidden layers and NaN targets are
/// refused with the row, value or layer named.
#[test]
fn bad_labels_and_architectures_are_refused_by_name() {
    use parvi::models::{Bnn, BnnConfig, BnnTask};
    let device = common::flex();
    let x = [0.0, 1.0, 2.0];
    let three = BnnConfig { task: BnnTask::Classification { classes: 3 }, ..BnnConfig::default() };
    let err = Bnn::from_config(&x, &[0.0, 3.0, 1.0], 1, &three, &device).unwrap_err().to_string();
    assert!(err.contains("row 1") && err.contains('3') && err.contains("0..2"), "{err}");
    let err = Bnn::from_config(&x, &[0.0, 0.5, 1.0], 1, &three, &device).unwrap_err().to_string();
    assert!(err.contains("row 1") && err.contains("0.5"), "{err}");
    let one = BnnConfig { task: BnnTask::Classification { classes: 1 }, ..BnnConfig::default() };
    let err = Bnn::from_config(&x, &[0.0, 0.0, 0.0], 1, &one, &device).unwrap_err().to_string();
    assert!(err.contains("classes"), "{err}");
    let hollow = BnnConfig { hidden: vec![50, 0], ..BnnConfig::default() };
    let err = Bnn::from_config(&x, &[0.0, 1.0, 2.0], 1, &hollow, &device).unwrap_err().to_string();
    assert!(err.contains("hidden layer 2"), "{err}");
    let err = Bnn::from_config(&x, &[0.0, f64::NAN, 2.0], 1, &BnnConfig::default(), &device).unwrap_err().to_string();
    assert!(err.contains("row 1") && err.contains("NaN"), "{err}");
}

/// The fused BNN computes the same log-joint and score on every backend: ndarray and wgpu
/// (llvmpipe in CI; skipped without an adapter unless `PARVI_REQUIRE_WGPU` is set) against flex,
/// for a deep tanh regression and a three-class network.
#[test]
fn bnn_scores_agree_across_backends() {
    use parvi::model::tensor_ops::to_vec_f32;
    use parvi::model::{BackendKind, LogDensity, score};
    use parvi::models::Bnn;
    let flex = common::flex();
    for config in [configs()[2].clone(), configs()[4].clone()] {
        let (x, y) = toy_data(&config, 40, 3, 9);
        let reference = Bnn::from_config(&x, &y, 3, &config, &flex).unwrap();
        let theta = reference.init(5, 4, &flex).unwrap();
        let host = to_vec_f32(&theta);
        let want = to_vec_f32(&score(&reference, theta, None).unwrap().grad);
        for backend in [BackendKind::Ndarray, BackendKind::Wgpu] {
            let device = match backend.autodiff_device() {
                Ok(d) => d,
                Err(reason) => {
                    if std::env::var_os("PARVI_REQUIRE_WGPU").is_some() {
                        panic!("PARVI_REQUIRE_WGPU is set but wgpu is unavailable: {reason}");
                    }
                    eprintln!("SKIPPED {backend}: {reason}");
                    continue;
                }
            };
            let model = Bnn::from_config(&x, &y, 3, &config, &device).unwrap();
            let theta = parvi::model::tensor_ops::matrix_from_vec(host.clone(), 5, model.dim(), &device);
            let got = to_vec_f32(&score(&model, theta, None).unwrap().grad);
            let tol = if backend == BackendKind::Wgpu { 1e-3 } else { 1e-4 };
            let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs() / (1.0 + b.abs())).fold(0.0, f32::max);
            assert!(err < tol, "{backend} {config:?}: score differs from flex by {err}");
        }
    }
}
