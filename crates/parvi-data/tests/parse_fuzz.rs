//! Property tests: random and mutated files never make the loaders panic; they give a data
//! set or an error, and a data set they give is internally consistent.

use std::path::Path;

use parvi_data::{Dataset, DevSplit, Task, load_csv, load_uci_folder, prepare};
use proptest::prelude::*;

/// Bytes that make parsing interesting: digits, signs, exponents, separators of both kinds,
/// line ends, letters, and bytes that are not UTF-8.
fn text_byte() -> impl Strategy<Value = u8> {
    prop_oneof![
        6 => prop::sample::select(b"0123456789".to_vec()),
        2 => prop::sample::select(b" \t\n".to_vec()),
        1 => prop::sample::select(b".-+eE,\r\"xn".to_vec()),
        1 => any::<u8>(),
    ]
}

fn random_text(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(text_byte(), 0..max)
}

/// A well-formed UCI folder's files: rows x (features + 1) numbers, one split.
fn valid_files(rows: usize, cols: usize) -> Vec<(&'static str, Vec<u8>)> {
    let data: String = (0..rows)
        .map(|r| {
            let line: Vec<String> = (0..cols).map(|c| format!("{}.5", r * cols + c)).collect();
            line.join(if r % 2 == 0 { " " } else { "\t" }) + "\n"
        })
        .collect();
    let features: String = (0..cols - 1).map(|c| format!("{c}\n")).collect();
    let train: String = (0..rows - 1).map(|r| format!("{r}\n")).collect();
    vec![
        ("data.txt", data.into_bytes()),
        ("index_features.txt", features.into_bytes()),
        ("index_target.txt", format!("{}\n", cols - 1).into_bytes()),
        ("n_splits.txt", b"1\n".to_vec()),
        ("index_train_0.txt", train.into_bytes()),
        ("index_test_0.txt", format!("{}\n", rows - 1).into_bytes()),
    ]
}

/// One edit to a file: replace, insert or delete a byte, or cut the file short.
#[derive(Clone, Debug)]
enum Mutation {
    Replace(usize, u8),
    Insert(usize, u8),
    Delete(usize),
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), text_byte()).prop_map(|(i, b)| Mutation::Replace(i, b)),
        (any::<usize>(), text_byte()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        any::<usize>().prop_map(Mutation::Delete),
        any::<usize>().prop_map(Mutation::Truncate),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    let at = |i: usize, len: usize| if len == 0 { 0 } else { i % len };
    match *m {
        Mutation::Replace(i, b) if !bytes.is_empty() => {
            let i = at(i, bytes.len());
            bytes[i] = b;
        }
        Mutation::Insert(i, b) => bytes.insert(at(i, bytes.len() + 1), b),
        Mutation::Delete(i) if !bytes.is_empty() => {
            bytes.remove(at(i, bytes.len()));
        }
        Mutation::Truncate(i) => bytes.truncate(at(i, bytes.len() + 1)),
        _ => {}
    }
}

fn write_folder(dir: &Path, files: &[(&str, Vec<u8>)]) {
    for (name, bytes) in files {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}

/// What any data set the loaders return must satisfy; and `prepare` must not panic on it.
fn check_consistent(ds: &Dataset) {
    assert_eq!(ds.x.len(), ds.rows * ds.features);
    assert_eq!(ds.y.len(), ds.rows);
    assert!(ds.x.iter().chain(&ds.y).all(|v| v.is_finite()));
    for (i, split) in ds.splits.iter().enumerate() {
        assert!(split.train.iter().chain(&split.test).all(|&r| r < ds.rows));
        for dev in [DevSplit::None, DevSplit::Reference] {
            if let Ok(p) = prepare(ds, i, dev) {
                assert_eq!(p.x_train.len(), p.n_train() * ds.features);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_files_never_panic(
        data in random_text(300),
        features in random_text(12),
        target in random_text(6),
        n_splits in random_text(4),
        train in random_text(40),
        test in random_text(20),
    ) {
        let tmp = tempfile::tempdir().unwrap();
        write_folder(tmp.path(), &[
            ("data.txt", data),
            ("index_features.txt", features),
            ("index_target.txt", target),
            ("n_splits.txt", n_splits),
            ("index_train_0.txt", train),
            ("index_test_0.txt", test),
        ]);
        if let Ok(ds) = load_uci_folder("fuzz", tmp.path()) {
            check_consistent(&ds);
        }
    }

    #[test]
    fn mutated_valid_files_never_panic(
        rows in 2usize..8,
        cols in 2usize..5,
        file in 0usize..6,
        mutations in prop::collection::vec(mutation(), 1..6),
    ) {
        let mut files = valid_files(rows, cols);
        for m in &mutations {
            apply(&mut files[file].1, m);
        }
        let tmp = tempfile::tempdir().unwrap();
        write_folder(tmp.path(), &files);
        match load_uci_folder("fuzz", tmp.path()) {
            Ok(ds) => check_consistent(&ds),
            Err(e) => {
                // The message names the file it is about (or the data set, for whole-set
                // problems such as a zero split count).
                let message = e.to_string();
                prop_assert!(
                    message.contains(&tmp.path().display().to_string()) || message.contains("fuzz"),
                    "{}", message
                );
            }
        }
    }

    #[test]
    fn random_csv_never_panics(body in random_text(300), header in "[a-z,]{0,12}") {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("data.csv");
        let mut bytes = format!("{header},malignant\n").into_bytes();
        bytes.extend(body);
        std::fs::write(&path, bytes).unwrap();
        for task in [Task::Classification, Task::Regression] {
            if let Ok(ds) = load_csv("fuzz", &path, "malignant", task, 2) {
                check_consistent(&ds);
            }
        }
    }
}

#[test]
fn the_unmutated_files_load() {
    let tmp = tempfile::tempdir().unwrap();
    write_folder(tmp.path(), &valid_files(5, 3));
    let ds = load_uci_folder("fuzz", tmp.path()).unwrap();
    assert_eq!((ds.rows, ds.features), (5, 2));
}
