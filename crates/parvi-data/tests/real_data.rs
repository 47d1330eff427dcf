//! The real UCI data loads with the published shapes, splits and values, and `prepare`
//! matches a plain recomputation of the reference code's rule.

mod common;

use common::{REGRESSION, plain_indices, plain_table, real_data_dir};
use parvi_data::{DevSplit, Task, load, prepare};

#[test]
fn regression_sets_have_readme_shapes_and_index_file_splits() {
    let Some(dir) = real_data_dir("regression_sets_have_readme_shapes_and_index_file_splits") else {
        return;
    };
    for &(name, rows, features, n_splits) in REGRESSION {
        let ds = load(name, &dir).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ds.name, name);
        assert_eq!(ds.task, Task::Regression);
        assert_eq!((ds.rows, ds.features), (rows, features), "{name}");
        assert_eq!((ds.x.len(), ds.y.len()), (rows * features, rows), "{name}");
        assert_eq!(ds.splits.len(), n_splits, "{name}");
        let folder = dir.join(name);
        for (i, split) in ds.splits.iter().enumerate() {
            let train = plain_indices(&folder.join(format!("index_train_{i}.txt")));
            let test = plain_indices(&folder.join(format!("index_test_{i}.txt")));
            assert_eq!(split.train, train, "{name} split {i} train");
            assert_eq!(split.test, test, "{name} split {i} test");
            assert_eq!(train.len() + test.len(), rows, "{name} split {i} covers the rows");
        }
    }
}

#[test]
fn values_equal_a_plain_parse_of_data_txt() {
    let Some(dir) = real_data_dir("values_equal_a_plain_parse_of_data_txt") else {
        return;
    };
    for &(name, ..) in REGRESSION {
        let ds = load(name, &dir).unwrap();
        let folder = dir.join(name);
        let table = plain_table(&folder.join("data.txt"));
        let features = plain_indices(&folder.join("index_features.txt"));
        let target = plain_indices(&folder.join("index_target.txt"))[0];
        assert_eq!(table.len(), ds.rows);
        for (r, row) in table.iter().enumerate() {
            let expected: Vec<f64> = features.iter().map(|&c| row[c]).collect();
            assert_eq!(ds.row(r), &expected[..], "{name} row {r}");
            assert_eq!(ds.y[r], row[target], "{name} row {r} target");
        }
    }
}

#[test]
fn aliases_resolve_to_the_same_sets() {
    let Some(dir) = real_data_dir("aliases_resolve_to_the_same_sets") else {
        return;
    };
    for (alias, name) in [
        ("boston", "bostonHousing"),
        ("power", "power-plant"),
        ("combined", "power-plant"),
        ("protein", "protein-tertiary-structure"),
        ("wine", "wine-quality-red"),
        ("naval", "naval-propulsion-plant"),
        ("concrete", "concrete"),
        ("energy", "energy"),
        ("kin8nm", "kin8nm"),
        ("yacht", "yacht"),
        ("BOSTON", "bostonHousing"),
    ] {
        assert_eq!(load(alias, &dir).unwrap().name, name, "{alias}");
    }
}

#[test]
fn breast_cancer_loads_with_seeded_splits() {
    let Some(dir) = real_data_dir("breast_cancer_loads_with_seeded_splits") else {
        return;
    };
    let ds = load("breast-cancer", &dir).unwrap();
    assert_eq!(ds.task, Task::Classification);
    assert_eq!((ds.rows, ds.features), (569, 30));
    assert_eq!(ds.y.iter().filter(|&&y| y == 1.0).count(), 212);
    assert!(ds.y.iter().all(|&y| y == 0.0 || y == 1.0));
    // The first data row of the CSV, read plainly.
    let text = std::fs::read_to_string(dir.join("breast-cancer/data.csv")).unwrap();
    let first: Vec<f64> = text.lines().nth(1).unwrap().split(',').map(|t| t.trim().parse().unwrap()).collect();
    assert_eq!(ds.row(0), &first[..30]);
    assert_eq!(ds.y[0], first[30]);

    assert_eq!(ds.splits.len(), 20);
    for split in &ds.splits {
        assert_eq!((split.train.len(), split.test.len()), (455, 114));
        let mut all: Vec<usize> = split.train.iter().chain(&split.test).copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..569).collect::<Vec<_>>());
    }
    assert_ne!(ds.splits[0], ds.splits[1]);
    // Seeded: a second load gives the same splits.
    assert_eq!(load("wdbc", &dir).unwrap().splits, ds.splits);
}

/// `np.round` rounds half to even; written out plainly here.
fn numpy_round(v: f64) -> f64 {
    let floor = v.floor();
    if v - floor == 0.5 { if floor % 2.0 == 0.0 { floor } else { floor + 1.0 } } else { v.round() }
}

fn mean_and_population_std(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    let std = var.sqrt();
    (mean, if std == 0.0 { 1.0 } else { std })
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()))
}

#[test]
fn prepare_reference_matches_a_direct_computation() {
    let Some(dir) = real_data_dir("prepare_reference_matches_a_direct_computation") else {
        return;
    };
    for (name, split) in [
        ("bostonHousing", 0),
        ("bostonHousing", 19),
        ("yacht", 3),
        ("naval-propulsion-plant", 1),
        ("protein-tertiary-structure", 4),
    ] {
        let ds = load(name, &dir).unwrap();
        let p = prepare(&ds, split, DevSplit::Reference).unwrap();
        let folder = dir.join(name);
        let table = plain_table(&folder.join("data.txt"));
        let features = plain_indices(&folder.join("index_features.txt"));
        let target = plain_indices(&folder.join("index_target.txt"))[0];
        let train = plain_indices(&folder.join(format!("index_train_{split}.txt")));
        let test = plain_indices(&folder.join(format!("index_test_{split}.txt")));

        // The reference code: the last min(round(0.1 n), 500) training rows are the dev set.
        let n_dev = (numpy_round(0.1 * train.len() as f64) as usize).min(500);
        let (fit, dev) = train.split_at(train.len() - n_dev);
        assert_eq!((p.n_train(), p.n_dev(), p.n_test()), (fit.len(), dev.len(), test.len()));

        let mut x_mean = Vec::new();
        let mut x_std = Vec::new();
        for &c in &features {
            let column: Vec<f64> = fit.iter().map(|&r| table[r][c]).collect();
            let (m, s) = mean_and_population_std(&column);
            x_mean.push(m);
            x_std.push(s);
        }
        let y: Vec<f64> = fit.iter().map(|&r| table[r][target]).collect();
        let (y_mean, y_std) = mean_and_population_std(&y);
        for j in 0..features.len() {
            assert!(close(p.norm.x_mean[j], x_mean[j]), "{name} x_mean[{j}]");
            assert!(close(p.norm.x_std[j], x_std[j]), "{name} x_std[{j}]");
        }
        assert!(close(p.norm.y_mean, y_mean) && close(p.norm.y_std, y_std), "{name} y");

        // Every part normalised with the training statistics, rows in index-file order.
        let f = features.len();
        for (part, rows, xs, ys) in [
            ("train", fit, &p.x_train, &p.y_train),
            ("dev", dev, &p.x_dev, &p.y_dev),
            ("test", &test[..], &p.x_test, &p.y_test),
        ] {
            for (k, &r) in rows.iter().enumerate() {
                for (j, &c) in features.iter().enumerate() {
                    let expected = (table[r][c] - x_mean[j]) / x_std[j];
                    assert!(close(xs[k * f + j], expected), "{name} {part} row {k} col {j}");
                }
                let expected = (table[r][target] - y_mean) / y_std;
                assert!(close(ys[k], expected), "{name} {part} y row {k}");
                assert!(close(p.norm.y_to_original(ys[k]), table[r][target]));
            }
        }
    }
}

#[test]
fn prepare_without_dev_keeps_all_training_rows_and_leaves_labels_alone() {
    let Some(dir) = real_data_dir("prepare_without_dev_keeps_all_training_rows") else {
        return;
    };
    let ds = load("yacht", &dir).unwrap();
    let p = prepare(&ds, 0, DevSplit::None).unwrap();
    assert_eq!((p.n_train(), p.n_dev(), p.n_test()), (277, 0, 31));

    let ds = load("breast-cancer", &dir).unwrap();
    let p = prepare(&ds, 2, DevSplit::Reference).unwrap();
    assert_eq!((p.n_train(), p.n_dev(), p.n_test()), (455 - 46, 46, 114));
    assert_eq!((p.norm.y_mean, p.norm.y_std), (0.0, 1.0));
    let split = ds.split(2).unwrap();
    let labels: Vec<f64> = split.test.iter().map(|&r| ds.y[r]).collect();
    assert_eq!(p.y_test, labels);
}
