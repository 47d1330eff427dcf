//! The BNN learns: on the toy regression its test RMSE is well under the prior-mean predictor's,
//! and the main job writes its summary and plot.

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
