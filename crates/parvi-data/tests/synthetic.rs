//! The built-in toys are deterministic and shaped as documented; `prepare` on them follows the
//! reference rule without any files.

use parvi_data::synthetic::{self, toy_classification, toy_regression};
use parvi_data::{DevSplit, Task, prepare, reference_dev_size};

#[test]
fn toy_regression_is_the_cubic_with_twenty_training_points() {
    let ds = toy_regression(7);
    assert_eq!((ds.task, ds.features, ds.rows), (Task::Regression, 1, 120));
    let split = ds.split(0).unwrap();
    assert_eq!((split.train.len(), split.test.len()), (20, 100));
    assert!(ds.x.iter().all(|x| (-4.0..=4.0).contains(x)));
    // Noise std 3: residuals from x^3 are small relative to the signal and not all zero.
    let residuals: Vec<f64> = ds.x.iter().zip(&ds.y).map(|(x, y)| y - x.powi(3)).collect();
    let var = residuals.iter().map(|r| r * r).sum::<f64>() / residuals.len() as f64;
    assert!((4.0..16.0).contains(&var), "residual variance {var}");
    // Deterministic per seed, different across seeds.
    assert_eq!(toy_regression(7).y, ds.y);
    assert_ne!(toy_regression(8).y, ds.y);
    assert_eq!(ds.splits.len(), 1);
}

#[test]
fn toy_classification_is_two_balanced_blobs() {
    let ds = toy_classification(1);
    assert_eq!((ds.task, ds.features, ds.rows), (Task::Classification, 2, 200));
    assert_eq!(ds.y.iter().filter(|&&y| y == 1.0).count(), 100);
    assert!(ds.y.iter().all(|&y| y == 0.0 || y == 1.0));
    // Class means sit near (-1, -1) and (1, 1).
    for label in [0.0, 1.0] {
        let rows: Vec<usize> = (0..ds.rows).filter(|&r| ds.y[r] == label).collect();
        let mean = rows.iter().map(|&r| ds.row(r)[0] + ds.row(r)[1]).sum::<f64>() / (2.0 * rows.len() as f64);
        assert!((mean - (2.0 * label - 1.0)).abs() < 0.3, "label {label}: mean {mean}");
    }
    assert_eq!(toy_classification(1).x, ds.x);
    assert_eq!(synthetic::by_name("toy-classification", 1).unwrap().x, ds.x);
    assert!(synthetic::by_name("nope", 1).is_none());
}

#[test]
fn reference_dev_size_rounds_like_numpy_and_caps_at_500() {
    // 0.1 * 25 = 2.5 rounds to the even 2; 0.1 * 35 = 3.5000000000000004 rounds up.
    assert_eq!(reference_dev_size(25), 2);
    assert_eq!(reference_dev_size(35), 4);
    assert_eq!(reference_dev_size(455), 46);
    assert_eq!(reference_dev_size(4), 0);
    assert_eq!(reference_dev_size(41157), 500);
}

#[test]
fn prepare_reference_on_the_regression_toy() {
    let ds = toy_regression(3);
    let p = prepare(&ds, 0, DevSplit::Reference).unwrap();
    assert_eq!((p.n_train(), p.n_dev(), p.n_test(), p.features), (18, 2, 100, 1));
    // The training part is standardised by its own statistics.
    let mean = p.x_train.iter().sum::<f64>() / 18.0;
    let var = p.x_train.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 18.0;
    assert!(mean.abs() < 1e-12 && (var - 1.0).abs() < 1e-12);
    let y_mean = p.y_train.iter().sum::<f64>() / 18.0;
    assert!(y_mean.abs() < 1e-12);
    // The dev rows are the last two training rows, mapped back exactly.
    assert!((p.norm.y_to_original(p.y_dev[1]) - ds.y[19]).abs() < 1e-9);
    assert_eq!(
        prepare(&ds, 1, DevSplit::None).unwrap_err().to_string(),
        "data set `toy-regression` has no split 1 (it has 1: 0..1)"
    );
}

#[test]
fn a_constant_feature_gets_unit_std() {
    let mut ds = toy_classification(0);
    for r in 0..ds.rows {
        ds.x[r * 2] = 5.0;
    }
    let p = prepare(&ds, 0, DevSplit::None).unwrap();
    assert_eq!(p.norm.x_std[0], 1.0);
    assert_eq!(p.norm.x_mean[0], 5.0);
    assert!(p.x_train.iter().step_by(2).all(|&v| v == 0.0));
    assert_eq!((p.norm.y_mean, p.norm.y_std), (0.0, 1.0));
}
