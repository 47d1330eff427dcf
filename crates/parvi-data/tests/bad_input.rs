//! Every kind of bad input is a `DataError` whose message names the file and the place.

use std::path::{Path, PathBuf};

use parvi_data::{
    DataError, FileState, Registry, Task, load, load_csv, load_entry, load_uci_folder, sha256_file, verify,
};

/// A small valid data set in the UCI layout; tests break one file at a time.
struct Folder {
    _tmp: tempfile::TempDir,
    path: PathBuf,
}

impl Folder {
    fn new() -> Folder {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("toy");
        std::fs::create_dir(&path).unwrap();
        let folder = Folder { _tmp: tmp, path };
        folder.write("data.txt", "1 2 3\n4\t5\t6\n7 8 9\n10 11 12\n\n");
        folder.write("index_features.txt", "0\n1\n");
        folder.write("index_target.txt", "2\n");
        folder.write("n_splits.txt", "1\n");
        folder.write("index_train_0.txt", "0\n1\n2\n");
        folder.write("index_test_0.txt", "3\n");
        folder
    }

    fn write(&self, name: &str, text: &str) {
        std::fs::write(self.path.join(name), text).unwrap();
    }

    fn file(&self, name: &str) -> String {
        self.path.join(name).display().to_string()
    }

    fn load(&self) -> Result<parvi_data::Dataset, DataError> {
        load_uci_folder("toy", &self.path)
    }

    fn error(&self) -> String {
        self.load().unwrap_err().to_string()
    }
}

#[test]
fn the_baseline_folder_loads() {
    let ds = Folder::new().load().unwrap();
    assert_eq!((ds.rows, ds.features, ds.splits.len()), (4, 2, 1));
    assert_eq!(ds.x, [1.0, 2.0, 4.0, 5.0, 7.0, 8.0, 10.0, 11.0]);
    assert_eq!(ds.y, [3.0, 6.0, 9.0, 12.0]);
}

#[test]
fn whole_number_floats_are_accepted_as_indices() {
    let f = Folder::new();
    f.write("index_train_0.txt", "0.0\n1.0\n2.0\n");
    assert_eq!(f.load().unwrap().splits[0].train, [0, 1, 2]);
}

#[test]
fn missing_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let err = load_uci_folder("x", &tmp.path().join("nowhere")).unwrap_err().to_string();
    assert!(err.contains("nowhere") && err.contains("data folder not found"), "{err}");
    let err = load("yacht", tmp.path()).unwrap_err().to_string();
    assert!(err.contains("yacht: data folder not found") && err.contains("parvi data fetch yacht"), "{err}");
}

#[test]
fn missing_file() {
    let f = Folder::new();
    std::fs::remove_file(f.path.join("index_target.txt")).unwrap();
    assert_eq!(f.error(), format!("{}: file not found", f.file("index_target.txt")));
}

#[test]
fn wrong_number_of_columns_names_the_line() {
    let f = Folder::new();
    f.write("data.txt", "1 2 3\n\n4 5 6\n7 8\n");
    assert_eq!(f.error(), format!("{}:4: expected 3 columns (as on line 1), found 2", f.file("data.txt")));
}

#[test]
fn a_token_that_is_not_a_number_names_line_column_and_field() {
    let f = Folder::new();
    f.write("data.txt", "1 2 3\n4  abc 6\n");
    assert_eq!(f.error(), format!("{}:2:4: field 2 `abc` is not a number", f.file("data.txt")));
    f.write("data.txt", "1 2 3\n4 5 6\n7 8 nan\n");
    assert_eq!(f.error(), format!("{}:3:5: field 3 `nan` is not a finite number", f.file("data.txt")));
    f.write("data.txt", "1 2 3\n4 5 \u{e9}6\n");
    assert!(f.error().starts_with(&format!("{}:2:5: field 3 `", f.file("data.txt"))));
}

#[test]
fn a_row_index_outside_the_data() {
    let f = Folder::new();
    f.write("index_test_0.txt", "3\n4\n");
    assert_eq!(f.error(), format!("{}:2: row 4 is outside the data (4 rows in data.txt)", f.file("index_test_0.txt")));
}

#[test]
fn a_column_index_outside_the_data() {
    let f = Folder::new();
    f.write("index_features.txt", "0\n7\n");
    assert_eq!(
        f.error(),
        format!("{}:2: column 7 is outside the data (3 columns in data.txt)", f.file("index_features.txt"))
    );
}

#[test]
fn negative_or_fractional_indices() {
    let f = Folder::new();
    f.write("index_train_0.txt", "0\n-1\n");
    assert_eq!(
        f.error(),
        format!("{}:2:1: field 1 `-1` is not a non-negative whole number", f.file("index_train_0.txt"))
    );
    f.write("index_train_0.txt", "0\n\n 1.5\n");
    assert_eq!(
        f.error(),
        format!("{}:3:2: field 1 `1.5` is not a non-negative whole number", f.file("index_train_0.txt"))
    );
    f.write("index_train_0.txt", "0 1\n");
    assert_eq!(
        f.error(),
        format!("{}:1:3: field 2 `1` is extra: expected one number per line", f.file("index_train_0.txt"))
    );
}

#[test]
fn a_row_listed_twice_in_a_split() {
    let f = Folder::new();
    f.write("index_test_0.txt", "2\n");
    assert_eq!(
        f.error(),
        format!(
            "{}:1: row 2 is listed again (first on line 3 of {})",
            f.file("index_test_0.txt"),
            f.file("index_train_0.txt")
        )
    );
}

#[test]
fn a_missing_split() {
    let f = Folder::new();
    f.write("n_splits.txt", "2\n");
    assert_eq!(
        f.error(),
        format!("{}: file not found (split 1 of the 2 that n_splits.txt announces)", f.file("index_train_1.txt"))
    );
    let ds = Folder::new().load().unwrap();
    assert_eq!(ds.split(3).unwrap_err().to_string(), "data set `toy` has no split 3 (it has 1: 0..1)");
}

#[test]
fn empty_files() {
    let f = Folder::new();
    f.write("data.txt", "");
    assert_eq!(f.error(), format!("{}: is empty (no data rows)", f.file("data.txt")));
    let f = Folder::new();
    f.write("index_test_0.txt", "\n \n\t\n");
    assert_eq!(f.error(), format!("{}: is empty (no data rows)", f.file("index_test_0.txt")));
    let f = Folder::new();
    f.write("n_splits.txt", "0\n");
    assert!(f.error().contains("n_splits.txt: 0 splits"));
}

#[test]
fn a_shape_that_disagrees_with_the_registry() {
    let f = Folder::new();
    let dir = f.path.parent().unwrap();
    std::fs::rename(&f.path, dir.join("yacht")).unwrap();
    let err = load("yacht", dir).unwrap_err().to_string();
    assert_eq!(
        err,
        format!("{}: 4 rows, but the registry entry `yacht` expects 308", dir.join("yacht/data.txt").display())
    );
}

#[test]
fn a_checksum_mismatch_names_the_file_and_both_checksums() {
    let tmp = tempfile::tempdir().unwrap();
    let entry = Registry::builtin().resolve("yacht").unwrap().clone();
    std::fs::create_dir(tmp.path().join("yacht")).unwrap();
    std::fs::write(tmp.path().join("yacht/data.txt"), "1 2 3 4 5 6 7\n").unwrap();
    let report = verify(&entry, tmp.path()).unwrap();
    assert!(!report.is_ok());
    assert!(matches!(report.files[0].state, FileState::Mismatch { .. }));
    assert!(report.files[1..].iter().all(|f| f.state == FileState::Missing));
    let err = report.into_result().unwrap_err().to_string();
    let path = tmp.path().join("yacht/data.txt");
    let actual = sha256_file(&path).unwrap();
    assert_eq!(err, format!("{}: sha256 mismatch: expected {}, found {actual}", path.display(), entry.files[0].sha256));
}

fn write_csv(text: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("data.csv");
    std::fs::write(&path, text).unwrap();
    (tmp, path)
}

fn csv_error(path: &Path) -> String {
    load_csv("c", path, "malignant", Task::Classification, 2).unwrap_err().to_string()
}

#[test]
fn csv_problems() {
    let (_tmp, path) = write_csv("a,b,malignant\r\n1,2,1\r\n3,4,0\r\n");
    let ds = load_csv("c", &path, "malignant", Task::Classification, 2).unwrap();
    assert_eq!((ds.rows, ds.features, ds.y.clone()), (2, 2, vec![1.0, 0.0]));

    let (_tmp, path) = write_csv("a,b,label\n1,2,1\n");
    assert_eq!(
        csv_error(&path),
        format!("{}:1: no column named `malignant` in the header (columns: a, b, label)", path.display())
    );
    let (_tmp, path) = write_csv("a,b,malignant\n1,2,1\n3,4,2\n");
    assert_eq!(csv_error(&path), format!("{}:3:5: field 3 `2` is not a 0/1 label", path.display()));
    let (_tmp, path) = write_csv("a,b,malignant\n1,2,1\n3,4\n");
    assert_eq!(csv_error(&path), format!("{}:3: expected 3 columns (as on line 1), found 2", path.display()));
    let (_tmp, path) = write_csv("a,b,malignant\n1,,1\n");
    assert_eq!(csv_error(&path), format!("{}:2:3: field 2 `` is empty (a missing value)", path.display()));
    let (_tmp, path) = write_csv("a,b,malignant\n");
    assert_eq!(csv_error(&path), format!("{}: has a header but no data rows", path.display()));
}

#[test]
fn unknown_names_and_not_fetched_sets() {
    let tmp = tempfile::tempdir().unwrap();
    let err = load("cifar", tmp.path()).unwrap_err().to_string();
    assert!(err.starts_with("unknown data set `cifar`"), "{err}");
    let entry = Registry::builtin().resolve("breast-cancer").unwrap().clone();
    std::fs::create_dir(tmp.path().join("breast-cancer")).unwrap();
    let err = load_entry(&entry, tmp.path()).unwrap_err().to_string();
    assert!(err.contains("breast-cancer/data.csv: file not found"), "{err}");
}
