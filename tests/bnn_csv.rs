//! `parvi bnn --csv TRAIN --test-csv TEST` (issue 28, item 4): the user's own held-out file,
//! matched by column name, scored exactly as the library scores it from the saved posterior.

use std::path::Path;
use std::process::{Command, Output};

use parvi::models::bnn_posterior::{BnnPredictor, Predictive};
use parvi::models::posterior::Posterior;

fn parvi(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_parvi")).args(args).output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn s(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

/// A fixed-seed LCG on [0, 1).
fn uniforms(seed: u64) -> impl FnMut() -> f64 {
    let mut state = seed;
    move || {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (state >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Rows `(a, b, y)` with `y = sin(2 a) + b / 2 + noise`; `shift` moves `a` (a test file far
/// from the training rows shows whether its rows leaked into the normalisation).
fn rows(n: usize, seed: u64, shift: f64) -> Vec<(f64, f64, f64)> {
    let mut u = uniforms(seed);
    (0..n)
        .map(|_| {
            let (a, b) = (4.0 * u() - 2.0 + shift, 4.0 * u() - 2.0);
            (a, b, (2.0 * a).sin() + b / 2.0 + 0.1 * (u() - 0.5))
        })
        .collect()
}

fn summary(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("bnn_summary.json")).unwrap()).unwrap()
}

/// The test metrics `parvi bnn` reports for a test file equal those computed here from the
/// saved posterior's predictions on that file (the library's `BnnPredictor`, raw inputs), with
/// the metrics themselves written out in plain f64.
#[test]
fn test_csv_metrics_equal_the_librarys_on_the_test_file() {
    let dir = tempfile::tempdir().unwrap();
    let (train, test, post, out) = (
        dir.path().join("train.csv"),
        dir.path().join("held.csv"),
        dir.path().join("p.safetensors"),
        dir.path().join("out"),
    );
    let train_rows = rows(120, 1, 0.0);
    let test_rows = rows(40, 2, 10.0);
    let mut text = String::from("id,a,b,y\n");
    for (r, (a, b, y)) in train_rows.iter().enumerate() {
        text.push_str(&format!("r{r},{a},{b},{y}\n"));
    }
    std::fs::write(&train, text).unwrap();
    // Other column order and an extra column: matched by name, the extra ignored.
    let mut text = String::from("y,note,b,a\n");
    for (a, b, y) in &test_rows {
        text.push_str(&format!("{y},hello,{b},{a}\n"));
    }
    std::fs::write(&test, text).unwrap();
    let fit = parvi(&[
        "bnn",
        "--csv",
        &s(&train),
        "--test-csv",
        &s(&test),
        "--target",
        "y",
        "--features",
        "a,b",
        "--iters",
        "200",
        "--particles",
        "8",
        "--hidden",
        "10",
        "--save-posterior",
        &s(&post),
        "--out",
        &s(&out),
    ]);
    assert!(fit.status.success(), "{}", stderr(&fit));
    let stdout = String::from_utf8_lossy(&fit.stdout);
    assert!(stdout.contains(&format!("test file {}", s(&test))), "{stdout}");
    assert!(!stdout.contains("split 0"), "{stdout}");
    let summary = summary(&out);
    assert_eq!(summary["rows"]["test"], 40);
    // 120 training rows, of which round(0.1 * 120) = 12 are the development set.
    assert_eq!((summary["rows"]["train"].as_u64(), summary["rows"]["development"].as_u64()), (Some(108), Some(12)));
    assert_eq!(summary["test_csv"], s(&test));
    assert_eq!(summary["held_out"], format!("test file {}", s(&test)));
    assert!(summary.get("split").is_none(), "{summary}");
    // Normalisation from training rows alone: the test file's `a` is shifted by 10, the
    // training rows' mean is within 0.5 of 0 (uniform on [-2, 2]).
    let a_mean = summary["normalisation"]["x_mean"][0].as_f64().unwrap();
    assert!(a_mean.abs() < 0.5, "a's mean {a_mean} includes test rows");

    let device = parvi::model::BackendKind::Flex.device().unwrap();
    let posterior = Posterior::load(&post).unwrap();
    let predictor = BnnPredictor::new(&posterior, &post, &device).unwrap();
    let x: Vec<f64> = test_rows.iter().flat_map(|&(a, b, _)| [a, b]).collect();
    let Predictive::Regression(p) = predictor.predict(&x, test_rows.len()).unwrap() else {
        panic!("a regression posterior predicted classes");
    };
    let se: f64 = p.mean.iter().zip(&test_rows).map(|(m, (_, _, y))| (m - y).powi(2)).sum();
    let rmse = (se / test_rows.len() as f64).sqrt();
    let cli = summary["test_rmse"].as_f64().unwrap();
    // Both are f32 network evaluations of the same inputs, normalised in f64 (CLI) or f32
    // (predictor): a few f32 ulps of each prediction.
    assert!((cli - rmse).abs() <= 1e-4 * rmse.max(1.0), "CLI RMSE {cli}, library {rmse}");
}

/// Classification: accuracy, log-likelihood and Brier score of the CLI equal those computed from
/// the predictor's class probabilities on the test file, whose labels map to the training
/// file's classes by name.
#[test]
fn test_csv_classification_metrics_equal_the_librarys() {
    let dir = tempfile::tempdir().unwrap();
    let (train, test, post, out) = (
        dir.path().join("train.csv"),
        dir.path().join("test.csv"),
        dir.path().join("p.safetensors"),
        dir.path().join("out"),
    );
    let label = |u: f64, v: f64| if u + v > 0.3 { "spam" } else { "ham" };
    let mut u = uniforms(5);
    let mut text = String::from("u,v,kind\n");
    for _ in 0..100 {
        let (a, b) = (4.0 * u() - 2.0, 4.0 * u() - 2.0);
        text.push_str(&format!("{a},{b},{}\n", label(a, b)));
    }
    std::fs::write(&train, text).unwrap();
    let test_rows: Vec<(f64, f64)> = (0..30).map(|_| (4.0 * u() - 2.0, 4.0 * u() - 2.0)).collect();
    let mut text = String::from("kind,v,u\n");
    for &(a, b) in &test_rows {
        text.push_str(&format!("{},{b},{a}\n", label(a, b)));
    }
    std::fs::write(&test, text).unwrap();
    let fit = parvi(&[
        "bnn",
        "--csv",
        &s(&train),
        "--test-csv",
        &s(&test),
        "--target",
        "kind",
        "--task",
        "classification",
        "--iters",
        "200",
        "--particles",
        "8",
        "--hidden",
        "10",
        "--save-posterior",
        &s(&post),
        "--out",
        &s(&out),
    ]);
    assert!(fit.status.success(), "{}", stderr(&fit));
    let summary = summary(&out);
    assert_eq!(summary["classes"], serde_json::json!(["ham", "spam"]));
    assert_eq!(summary["rows"]["test"], 30);

    let device = parvi::model::BackendKind::Flex.device().unwrap();
    let posterior = Posterior::load(&post).unwrap();
    let predictor = BnnPredictor::new(&posterior, &post, &device).unwrap();
    let x: Vec<f64> = test_rows.iter().flat_map(|&(a, b)| [a, b]).collect();
    let Predictive::Classification(p) = predictor.predict(&x, test_rows.len()).unwrap() else {
        panic!("a classification posterior predicted a regression");
    };
    let n = test_rows.len() as f64;
    let (mut correct, mut ll, mut brier) = (0.0, 0.0, 0.0);
    for (r, &(a, b)) in test_rows.iter().enumerate() {
        let y = usize::from(label(a, b) == "spam");
        let probs = [p.probability(r, 0), p.probability(r, 1)];
        correct += f64::from(u8::from(usize::from(probs[1] > probs[0]) == y));
        ll += probs[y].ln();
        brier += (0..2).map(|k| (probs[k] - f64::from(u8::from(k == y))).powi(2)).sum::<f64>();
    }
    let c = &summary["classification"];
    let close = |key: &str, v: f64| {
        let cli = c[key].as_f64().unwrap();
        assert!((cli - v).abs() <= 1e-4, "{key}: CLI {cli}, library {v}");
    };
    close("accuracy", correct / n);
    close("log_likelihood", ll / n);
    close("brier", brier / n);
}

/// A test file without one of the training file's columns is refused, naming the file and the
/// column, before any fitting and without writing a summary.
#[test]
fn a_test_csv_missing_a_column_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let (train, test, out) = (dir.path().join("train.csv"), dir.path().join("held.csv"), dir.path().join("out"));
    std::fs::write(&train, "a,b,y\n1,2,3\n2,3,4\n3,4,5\n4,5,6\n").unwrap();
    std::fs::write(&test, "a,y,other\n1,3,x\n").unwrap();
    let run = parvi(&["bnn", "--csv", &s(&train), "--test-csv", &s(&test), "--target", "y", "--out", &s(&out)]);
    assert_eq!(run.status.code(), Some(2), "{}", stderr(&run));
    let message = stderr(&run);
    assert!(message.contains("held.csv") && message.contains("no column named `b`"), "{message}");
    assert!(!out.join("bnn_summary.json").exists(), "no summary for a refused run");
    // `--test-csv` needs `--csv` and replaces `--test-fraction`.
    let run = parvi(&["bnn", "--test-csv", &s(&test), "--out", &s(&out)]);
    assert_eq!(run.status.code(), Some(2), "{}", stderr(&run));
    let run = parvi(&[
        "bnn",
        "--csv",
        &s(&train),
        "--target",
        "y",
        "--test-csv",
        &s(&test),
        "--test-fraction",
        "0.2",
        "--out",
        &s(&out),
    ]);
    assert_eq!(run.status.code(), Some(2), "{}", stderr(&run));
}

/// A random test fraction is described by its seed and percentage, and a wide table's feature
/// list is abbreviated on the terminal but complete in the summary.
#[test]
fn messages_name_the_seed_and_fraction_and_abbreviate_wide_tables() {
    let dir = tempfile::tempdir().unwrap();
    let (train, out) = (dir.path().join("wide.csv"), dir.path().join("out"));
    let mut u = uniforms(9);
    let names: Vec<String> = (0..16).map(|i| format!("px{i}")).collect();
    let mut text = format!("{},y\n", names.join(","));
    for _ in 0..60 {
        let x: Vec<f64> = (0..16).map(|_| u()).collect();
        let y = x.iter().sum::<f64>();
        text.push_str(&format!("{},{y}\n", x.iter().map(f64::to_string).collect::<Vec<_>>().join(",")));
    }
    std::fs::write(&train, text).unwrap();
    let run = parvi(&[
        "bnn",
        "--csv",
        &s(&train),
        "--target",
        "y",
        "--iters",
        "20",
        "--seed",
        "3",
        "--test-fraction",
        "0.2",
        "--out",
        &s(&out),
    ]);
    assert!(run.status.success(), "{}", stderr(&run));
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(stdout.contains("seed 3, 20% held out"), "{stdout}");
    assert!(!stdout.contains("split 0"), "{stdout}");
    assert!(stdout.contains("... and 11 more"), "{stdout}");
    assert!(!stdout.contains("px15"), "{stdout}");
    let summary = summary(&out);
    assert_eq!(summary["held_out"], "seed 3, 20% held out");
    assert_eq!(summary["features"].as_array().unwrap().len(), 16);
}
