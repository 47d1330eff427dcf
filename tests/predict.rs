//! From your own table to a saved posterior and predictions: `parvi bnn --csv --save-posterior`,
//! `parvi predict`, and the library's `Posterior` and `BnnPredictor` underneath.

use std::path::Path;
use std::process::{Command, Output};

use parvi::models::bnn_posterior::{BnnPredictor, Predictive, Provenance, posterior};
use parvi::models::posterior::{Posterior, SampleKind, Scaling};
use parvi::models::{Bnn, BnnConfig, BnnTask};

fn parvi(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_parvi")).args(args).output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `y = sin(2 a) + b / 2 + noise`, with an id column and a text column to pass through.
fn write_table(path: &Path, rows: usize, seed: u64) {
    let mut text = String::from("id,a,b,site,y\n");
    let mut state = seed;
    let mut uniform = || {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    for r in 0..rows {
        let (a, b) = (4.0 * uniform() - 2.0, 4.0 * uniform() - 2.0);
        let y = (2.0 * a).sin() + b / 2.0 + 0.1 * (uniform() - 0.5);
        text.push_str(&format!("r{r},{a:.5},{b:.5},\"north, {}\",{y:.5}\n", r % 3));
    }
    std::fs::write(path, text).unwrap();
}

/// Saving and loading changes no number: the loaded posterior predicts bit for bit what the
/// in-memory one does.
#[test]
fn save_load_predict_is_bit_identical() {
    let device = parvi::model::BackendKind::Flex.device().unwrap();
    for task in [BnnTask::Regression, BnnTask::Classification { classes: 3 }] {
        let config = BnnConfig { hidden: vec![6, 4], task, ..BnnConfig::default() };
        let x: Vec<f64> = (0..40).map(|i| (i as f64 * 0.37).sin()).collect();
        let y: Vec<f64> = (0..20).map(|i| (i % 3) as f64).collect();
        let model = Bnn::from_config(&x, &y, 2, &config, &device).unwrap();
        let positions = model.init(7, 5, &device).unwrap();
        let regression = task == BnnTask::Regression;
        let noise: Vec<f64> = (0..7).map(|i| 0.5 + 0.1 * i as f64).collect();
        let provenance = Provenance {
            features: vec!["a".into(), "b".into()],
            target: Some("y".into()),
            classes: (!regression).then(|| vec!["x".into(), "y".into(), "z".into()]),
            scaling: Scaling { x_mean: vec![0.5, -1.0], x_std: vec![2.0, 0.5], y_mean: 1.0, y_std: 3.0 },
            method: "svgd".into(),
            settings: serde_json::json!({"steps": 0}),
            kind: SampleKind::Particles,
        };
        let in_memory = posterior(&model, &positions, None, regression.then_some(&noise[..]), provenance).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.safetensors");
        in_memory.save(&path).unwrap();
        let loaded = Posterior::load(&path).unwrap();
        let rows: Vec<f64> = (0..30).map(|i| (i as f64 * 0.91).cos() * 3.0).collect();
        let a = BnnPredictor::new(&in_memory, &path, &device).unwrap().predict(&rows, 15).unwrap();
        let b = BnnPredictor::new(&loaded, &path, &device).unwrap().predict(&rows, 15).unwrap();
        assert_eq!(a, b, "{task:?}");
        match a {
            Predictive::Regression(p) => assert!(p.total_sd.iter().all(|s| *s >= 0.5), "noise sd >= 0.5 per particle"),
            Predictive::Classification(p) => assert_eq!(p.classes, 3),
        }
        // A posterior for another architecture is refused, naming the mismatch.
        let mut other = loaded.clone();
        other.meta.model = serde_json::to_value(BnnConfig { hidden: vec![5], task, ..BnnConfig::default() }).unwrap();
        let err = BnnPredictor::new(&other, &path, &device).err().unwrap().to_string();
        assert!(err.contains("coordinates"), "{err}");
    }
}

#[test]
fn your_table_to_a_saved_posterior_to_predictions() {
    let dir = tempfile::tempdir().unwrap();
    let (train, new, post, pred) = (
        dir.path().join("train.csv"),
        dir.path().join("new.csv"),
        dir.path().join("posterior.safetensors"),
        dir.path().join("pred.csv"),
    );
    write_table(&train, 300, 1);
    write_table(&new, 50, 2);
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let out_dir = s(&dir.path().join("out"));
    let fit = parvi(&[
        "bnn",
        "--csv",
        &s(&train),
        "--target",
        "y",
        "--features",
        "a,b",
        "--iters",
        "1500",
        "--lr",
        "0.01",
        "--save-posterior",
        &s(&post),
        "--out",
        &out_dir,
    ]);
    assert!(fit.status.success(), "{}", stderr(&fit));
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("out/bnn_summary.json")).unwrap()).unwrap();
    assert_eq!(summary["rows"]["test"], 30, "10% of 300 rows held out");
    assert_eq!(summary["features"], serde_json::json!(["a", "b"]));
    // The noise sd is 0.1 / sqrt(12) = 0.03 and the function is smooth: a fit that learned
    // nothing has RMSE about 1.
    assert!(summary["test_rmse"].as_f64().unwrap() < 0.3, "{summary}");

    let run = parvi(&["predict", "--posterior", &s(&post), "--csv", &s(&new), "--out", &s(&pred), "--batch", "7"]);
    assert!(run.status.success(), "{}", stderr(&run));
    let text = std::fs::read_to_string(&pred).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next().unwrap(), "id,site,y,mean,sd,epistemic_sd,aleatoric_sd,q05,q50,q95");
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), 50, "every row predicted across batches of 7");
    assert!(rows[0].starts_with("r0,\"north, 0\","), "text with a comma passes through quoted: {}", rows[0]);
    // Predictions track the truth (the table's own y column, passed through).
    let mut se = 0.0;
    for row in &rows {
        let fields: Vec<&str> = row.rsplitn(8, ',').collect(); // q95 .. mean, then the rest
        let (mean, truth) =
            (fields[6].parse::<f64>().unwrap(), fields[7].rsplit(',').next().unwrap().parse::<f64>().unwrap());
        let (q05, q95) = (fields[2].parse::<f64>().unwrap(), fields[0].parse::<f64>().unwrap());
        assert!(q05 < mean && mean < q95);
        se += (mean - truth).powi(2);
    }
    assert!((se / 50.0).sqrt() < 0.3, "prediction RMSE {}", (se / 50.0).sqrt());
}

#[test]
fn predict_refuses_bad_tables_and_posteriors_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let (train, post) = (dir.path().join("train.csv"), dir.path().join("p.safetensors"));
    write_table(&train, 60, 3);
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let fit = parvi(&[
        "bnn",
        "--csv",
        &s(&train),
        "--target",
        "y",
        "--features",
        "a,b",
        "--iters",
        "20",
        "--save-posterior",
        &s(&post),
        "--out",
        &s(&dir.path().join("out")),
    ]);
    assert!(fit.status.success(), "{}", stderr(&fit));
    let out = s(&dir.path().join("pred.csv"));
    let cases: [(&str, &str, &str); 4] = [
        ("missing.csv", "id,a\n1,2\n", "no column named `b`"),
        ("text.csv", "a,b\n1,2\n3,four\n", "text.csv:3: column `b` holds the text `four`"),
        ("empty.csv", "", "empty.csv: is empty"),
        ("nan.csv", "a,b\n1,\n", "nan.csv:2: column `b` is missing"),
    ];
    for (name, text, expect) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let run = parvi(&["predict", "--posterior", &s(&post), "--csv", &s(&path), "--out", &out]);
        assert_eq!(run.status.code(), Some(2), "{name}");
        assert!(stderr(&run).contains(expect), "{name}: {}", stderr(&run));
        assert!(!Path::new(&out).exists(), "{name}: no partial output");
    }
    let mut bytes = std::fs::read(&post).unwrap();
    bytes.truncate(bytes.len() - 3);
    let damaged = dir.path().join("damaged.safetensors");
    std::fs::write(&damaged, &bytes).unwrap();
    let run = parvi(&["predict", "--posterior", &s(&damaged), "--csv", &s(&train), "--out", &out]);
    assert_eq!(run.status.code(), Some(2));
    assert!(stderr(&run).contains("damaged.safetensors: not a readable parvi posterior"), "{}", stderr(&run));
}

/// Classification from a table with text labels: class names are kept and come back in the
/// predictions.
#[test]
fn a_classifier_keeps_its_class_names() {
    let dir = tempfile::tempdir().unwrap();
    let (train, post, pred) =
        (dir.path().join("train.csv"), dir.path().join("p.safetensors"), dir.path().join("pred.csv"));
    let mut text = String::from("u,v,kind\n");
    for i in 0..200 {
        let (u, v) = ((i as f64 * 0.618).fract() * 4.0 - 2.0, (i as f64 * 0.414).fract() * 4.0 - 2.0);
        let kind = if u + v > 0.5 {
            "spam"
        } else if u - v > 0.5 {
            "ham"
        } else {
            "eggs"
        };
        text.push_str(&format!("{u},{v},{kind}\n"));
    }
    std::fs::write(&train, text).unwrap();
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let fit = parvi(&[
        "bnn",
        "--csv",
        &s(&train),
        "--target",
        "kind",
        "--task",
        "classification",
        "--iters",
        "1500",
        "--save-posterior",
        &s(&post),
        "--out",
        &s(&dir.path().join("out")),
    ]);
    assert!(fit.status.success(), "{}", stderr(&fit));
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("out/bnn_summary.json")).unwrap()).unwrap();
    assert_eq!(summary["classes"], serde_json::json!(["eggs", "ham", "spam"]));
    // Three linearly separated regions: a classifier that learned nothing scores about 0.4.
    assert!(summary["classification"]["accuracy"].as_f64().unwrap() > 0.8, "{summary}");
    let run = parvi(&["predict", "--posterior", &s(&post), "--csv", &s(&train), "--out", &s(&pred)]);
    assert!(run.status.success(), "{}", stderr(&run));
    let text = std::fs::read_to_string(&pred).unwrap();
    assert!(text.starts_with("kind,p_eggs,p_ham,p_spam,predicted,entropy,mutual_information\n"), "{text}");
    let agree = text.lines().skip(1).filter(|l| l.split(',').next() == l.split(',').nth(4)).count();
    assert!(agree > 160, "{agree} of 200 training rows predicted as labelled");
}

/// Whether `message` says some cause twice in a row (`A: B: B`), as an error that both prints its
/// source and returns it from `source()` does under `{:#}`.
fn repeats_a_cause(message: &str) -> bool {
    let segments: Vec<&str> = message.trim().split(": ").collect();
    (0..segments.len()).any(|start| {
        (1..=(segments.len() - start) / 2).any(|len| {
            segments[start..start + len] == segments[start + len..start + 2 * len]
                && segments[start..start + len].join(": ").len() >= 8
        })
    })
}

/// Every error names each cause once: a file that cannot be read, a posteriordb folder without
/// its data, a checkpoint that is not one.
#[test]
fn errors_say_each_cause_once() {
    assert!(repeats_a_cause("error: a.txt: No such file (os error 2): No such file (os error 2)"));
    assert!(!repeats_a_cause("error: a.txt: No such file (os error 2)"));
    let dir = tempfile::tempdir().unwrap();
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let (csv, out) = (dir.path().join("rows.csv"), dir.path().join("pred.csv"));
    std::fs::write(&csv, "a,b\n1,2\n").unwrap();
    let unreadable = dir.path().join("a-folder.safetensors");
    std::fs::create_dir(&unreadable).unwrap();
    let suite = dir.path().join("suite");
    std::fs::create_dir_all(suite.join("kidiq-kidscore_momiq")).unwrap();
    let bad_checkpoint = dir.path().join("checkpoint.json");
    std::fs::write(&bad_checkpoint, "{").unwrap();
    let runs = [
        parvi(&[
            "predict",
            "--posterior",
            &s(&dir.path().join("none.safetensors")),
            "--csv",
            &s(&csv),
            "--out",
            &s(&out),
        ]),
        parvi(&["predict", "--posterior", &s(&unreadable), "--csv", &s(&csv), "--out", &s(&out)]),
        parvi(&["bench", "posteriordb", "--data-dir", &s(&suite), "--posterior", "kidiq", "--method", "svgd"]),
        parvi(&["fit", "--model", "gaussian", "--resume", &s(&bad_checkpoint), "--out", &s(&dir.path().join("o"))]),
    ];
    for run in &runs {
        let message = stderr(run);
        assert_eq!(run.status.code(), Some(2), "{message}");
        assert!(!repeats_a_cause(&message), "a cause is repeated: {message}");
    }
}
