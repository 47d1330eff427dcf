//! A user's own CSV table: named columns, a target, numeric features, class names, and the
//! missing values and text columns a table in the wild has.
//!
//! The rules are those of the tools users come from (pandas, scikit-learn): a header row is
//! required; numeric columns are used as they are; a text feature column is refused (the model
//! needs numbers, and the encoding is the user's choice); a missing value (an empty field, `NA`,
//! `NaN`, `null` or `?`) is refused unless rows with one are dropped on request. A
//! classification target may be text or numbers: its distinct values, sorted, are the classes.

use std::path::{Path, PathBuf};

use crate::dataset::{Dataset, Task};
use crate::error::DataError;
use crate::load::shuffle_splits_seeded;
use crate::parse::{Delimiter, parse_numbers, read_file};

/// Tokens read as a missing value (compared after trimming, case-insensitively).
const MISSING: [&str; 6] = ["", "na", "nan", "null", "none", "?"];

/// What to read from a table.
#[derive(Clone, Debug, PartialEq)]
pub struct TableSpec {
    /// The target column; `None` reads features only (prediction inputs).
    pub target: Option<String>,
    /// The feature columns, in this order; `None` takes every column except the target.
    pub features: Option<Vec<String>>,
    /// Regression (numeric target) or classification (any target; its values are the classes).
    pub task: Task,
    /// Drop rows with a missing value in a used column instead of refusing the table.
    pub drop_missing: bool,
    /// For classification: the class names in label order (e.g. from a saved posterior), so that
    /// a test table's labels map to the training table's. `None` learns them from the table.
    pub classes: Option<Vec<String>>,
}

impl TableSpec {
    /// Every column but `target` is a feature; no missing values allowed.
    pub fn new(target: impl Into<String>, task: Task) -> Self {
        Self { target: Some(target.into()), features: None, task, drop_missing: false, classes: None }
    }

    /// The spec that reads a held-out test table for `train`: the same feature columns in the
    /// same order, the same target and class names (columns are matched by name; any other
    /// column is ignored, and a missing one is refused naming the file and the column).
    pub fn for_test_of(train: &UserTable, drop_missing: bool) -> Self {
        Self {
            target: train.target_name.clone(),
            features: Some(train.feature_names.clone()),
            task: if train.class_names.is_some() { Task::Classification } else { Task::Regression },
            drop_missing,
            classes: train.class_names.clone(),
        }
    }
}

/// A table read by [`read_table`].
#[derive(Clone, Debug)]
pub struct UserTable {
    /// The file it was read from.
    pub path: PathBuf,
    /// The feature columns' names, in the order of `x`'s columns.
    pub feature_names: Vec<String>,
    /// The target column's name, if one was read.
    pub target_name: Option<String>,
    /// Class names in label order (`y = 0, 1, ...`), for classification.
    pub class_names: Option<Vec<String>>,
    /// Row-major `[rows, features]`.
    pub x: Vec<f64>,
    /// `[rows]` targets (class indices for classification); empty without a target.
    pub y: Vec<f64>,
    /// 1-based source line of every kept row.
    pub lines: Vec<usize>,
    /// Source lines of the rows dropped for a missing value.
    pub dropped: Vec<usize>,
    /// The columns neither feature nor target, as text, kept to pass through to predictions.
    pub passthrough: Vec<(String, Vec<String>)>,
}

impl UserTable {
    /// Number of kept rows.
    pub fn rows(&self) -> usize {
        self.lines.len()
    }

    /// A [`Dataset`] with one seeded shuffle split holding out `test_fraction` of the rows.
    pub fn into_dataset(self, name: &str, test_fraction: f64, seed: u64) -> Result<Dataset, DataError> {
        if !(0.0..1.0).contains(&test_fraction) {
            return Err(DataError::Invalid {
                dataset: name.to_string(),
                message: format!("the test fraction must be in [0, 1), got {test_fraction}"),
            });
        }
        let target = self.target_name.clone().unwrap_or_default();
        if self.y.len() != self.rows() || self.rows() == 0 {
            return Err(DataError::Invalid {
                dataset: name.to_string(),
                message: format!("{}: no target column `{target}` read, or no rows", self.path.display()),
            });
        }
        let task = if self.class_names.is_some() { Task::Classification } else { Task::Regression };
        let rows = self.rows();
        let splits = vec![shuffle_splits_seeded(rows, seed, test_fraction)];
        if splits[0].train.is_empty() {
            return Err(DataError::Invalid {
                dataset: name.to_string(),
                message: format!("a test fraction of {test_fraction} leaves no training rows out of {rows}"),
            });
        }
        Ok(Dataset {
            name: name.to_string(),
            task,
            features: self.feature_names.len(),
            rows,
            x: self.x,
            y: self.y,
            splits,
        })
    }

    /// A [`Dataset`] trained on this table's rows and tested on `test`'s: the user's own
    /// held-out file instead of a random fraction. `test` must have been read with this table's
    /// feature columns, in this order, its target and (classification) its class names, as
    /// [`TableSpec::for_test_of`] asks. The training rows are shuffled with `seed`, so the
    /// development rows that `prepare` holds out of them are a seeded random tenth, as with a
    /// random test fraction; normalisation then comes from the training rows alone.
    pub fn into_dataset_with_test(self, test: UserTable, name: &str, seed: u64) -> Result<Dataset, DataError> {
        let invalid = |message: String| DataError::Invalid { dataset: name.to_string(), message };
        if self.y.len() != self.rows() || test.y.len() != test.rows() || test.rows() == 0 {
            return Err(invalid(format!(
                "{} and {} both need the target column `{}` and at least one row",
                self.path.display(),
                test.path.display(),
                self.target_name.as_deref().unwrap_or_default()
            )));
        }
        if test.feature_names != self.feature_names || test.target_name != self.target_name {
            return Err(invalid(format!(
                "{}: its columns ({}; target {:?}) are not the training table's ({}; target {:?})",
                test.path.display(),
                test.feature_names.join(", "),
                test.target_name,
                self.feature_names.join(", "),
                self.target_name
            )));
        }
        if test.class_names != self.class_names {
            return Err(invalid(format!(
                "{}: its classes {:?} are not the training table's {:?}",
                test.path.display(),
                test.class_names,
                self.class_names
            )));
        }
        let task = if self.class_names.is_some() { Task::Classification } else { Task::Regression };
        let (n_train, n_test) = (self.rows(), test.rows());
        let train = shuffle_splits_seeded(n_train, seed, 0.0).train;
        let split = crate::dataset::Split { train, test: (n_train..n_train + n_test).collect() };
        let (mut x, mut y) = (self.x, self.y);
        x.extend(test.x);
        y.extend(test.y);
        Ok(Dataset {
            name: name.to_string(),
            task,
            features: self.feature_names.len(),
            rows: n_train + n_test,
            x,
            y,
            splits: vec![split],
        })
    }
}

/// One line's fields with their byte offsets, splitting on commas outside double quotes and
/// unquoting (`""` inside quotes is a quote).
fn split_csv_line(line: &[u8]) -> Result<Vec<(usize, String)>, usize> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut fields = Vec::new();
    let mut start = 0;
    let mut field = Vec::new();
    let mut quoted = false;
    let mut i = 0;
    while i < line.len() {
        let b = line[i];
        match (quoted, b) {
            (true, b'"') if line.get(i + 1) == Some(&b'"') => {
                field.push(b'"');
                i += 1;
            }
            (true, b'"') => quoted = false,
            (false, b'"') if field.iter().all(u8::is_ascii_whitespace) => {
                field.clear();
                quoted = true;
            }
            (false, b',') => {
                fields.push((start, String::from_utf8_lossy(field.trim_ascii()).into_owned()));
                field.clear();
                start = i + 1;
            }
            _ => field.push(b),
        }
        i += 1;
    }
    if quoted {
        return Err(start);
    }
    fields.push((start, String::from_utf8_lossy(field.trim_ascii()).into_owned()));
    Ok(fields)
}

fn is_missing(token: &str) -> bool {
    MISSING.iter().any(|m| token.eq_ignore_ascii_case(m))
}

/// Reads a CSV table with a header row as `spec` asks. Every refusal names the file, and the
/// line and column where there is one.
pub fn read_table(path: &Path, spec: &TableSpec) -> Result<UserTable, DataError> {
    let bytes = read_file(path)?;
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(&bytes);
    let invalid = |line: usize, message: String| DataError::Table { path: path.to_path_buf(), line, message };

    // Header and rows as text, with their source lines; blank lines are skipped.
    let mut header: Option<(usize, Vec<String>)> = None;
    let mut cells: Vec<Vec<String>> = Vec::new();
    let mut lines = Vec::new();
    for (i, line) in bytes.split(|&b| b == b'\n').enumerate() {
        let line_no = i + 1;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let fields = split_csv_line(line)
            .map_err(|col| invalid(line_no, format!("a quote opened at column {} is never closed", col + 1)))?;
        let fields: Vec<String> = fields.into_iter().map(|(_, f)| f).collect();
        match &header {
            None => {
                if let Some(c) = fields.iter().position(|f| f.is_empty()) {
                    return Err(invalid(
                        line_no,
                        format!("the header's column {} has no name (a header row is required)", c + 1),
                    ));
                }
                if fields.iter().all(|f| f.parse::<f64>().is_ok()) {
                    return Err(invalid(
                        line_no,
                        "the first line is all numbers: a header row naming the columns is required".into(),
                    ));
                }
                for (a, name) in fields.iter().enumerate() {
                    if let Some(b) = fields[..a].iter().position(|f| f == name) {
                        return Err(invalid(
                            line_no,
                            format!("columns {} and {} are both named `{name}`", b + 1, a + 1),
                        ));
                    }
                }
                header = Some((line_no, fields));
            }
            Some((first, names)) => {
                if fields.len() != names.len() {
                    return Err(DataError::ColumnCount {
                        path: path.to_path_buf(),
                        line: line_no,
                        expected: names.len(),
                        found: fields.len(),
                        first_line: *first,
                    });
                }
                cells.push(fields);
                lines.push(line_no);
            }
        }
    }
    let Some((header_line, names)) = header else {
        return Err(DataError::EmptyFile { path: path.to_path_buf(), what: "is empty (a header row is required)" });
    };
    if cells.is_empty() {
        return Err(DataError::EmptyFile { path: path.to_path_buf(), what: "has a header but no data rows" });
    }

    let column = |name: &str| -> Result<usize, DataError> {
        names.iter().position(|n| n == name).ok_or_else(|| DataError::MissingColumn {
            path: path.to_path_buf(),
            line: header_line,
            name: name.to_string(),
            available: names.join(", "),
        })
    };
    let target = spec.target.as_deref().map(column).transpose()?;
    let features: Vec<usize> = match &spec.features {
        Some(wanted) => {
            let missing: Vec<&str> = wanted.iter().filter(|w| !names.contains(w)).map(String::as_str).collect();
            if !missing.is_empty() {
                return Err(DataError::MissingColumn {
                    path: path.to_path_buf(),
                    line: header_line,
                    name: missing.join("`, `"),
                    available: names.join(", "),
                });
            }
            wanted.iter().map(|w| column(w)).collect::<Result<_, _>>()?
        }
        None => (0..names.len()).filter(|&c| Some(c) != target).collect(),
    };
    if features.is_empty() {
        return Err(invalid(header_line, "no feature columns: the table holds only the target".into()));
    }
    if let Some(t) = target
        && features.contains(&t)
    {
        return Err(invalid(header_line, format!("column `{}` is both the target and a feature", names[t])));
    }

    // Missing values in a used column: refused, or the row dropped.
    let used: Vec<usize> = features.iter().copied().chain(target).collect();
    let mut keep = Vec::with_capacity(cells.len());
    let mut dropped = Vec::new();
    for (r, row) in cells.iter().enumerate() {
        match used.iter().find(|&&c| is_missing(&row[c])) {
            None => keep.push(r),
            Some(_) if spec.drop_missing => dropped.push(lines[r]),
            Some(&c) => {
                return Err(invalid(
                    lines[r],
                    format!(
                        "column `{}` is missing (`{}`); fill it in, or pass --drop-missing to drop such rows",
                        names[c], row[c]
                    ),
                ));
            }
        }
    }
    if keep.is_empty() {
        return Err(DataError::EmptyFile {
            path: path.to_path_buf(),
            what: "has no rows left after dropping missing values",
        });
    }

    // Features: numbers, parsed by polars column by column from the kept rows.
    let rows = keep.len();
    let mut text = Vec::with_capacity(rows * features.len() * 8);
    for &r in &keep {
        for (i, &c) in features.iter().enumerate() {
            if i > 0 {
                text.push(b',');
            }
            // A comma or quote cannot be in a number; keep the buffer parseable.
            let token = &cells[r][c];
            if token.contains([',', '"']) {
                text.extend_from_slice(b"x");
            } else {
                text.extend_from_slice(token.as_bytes());
            }
        }
        text.push(b'\n');
    }
    let parsed = parse_numbers(path, text, rows, features.len(), Delimiter::Comma)?;
    let mut x = vec![0.0; rows * features.len()];
    for (j, (values, &c)) in parsed.iter().zip(&features).enumerate() {
        for (k, v) in values.iter().enumerate() {
            match v {
                Some(v) if v.is_finite() => x[k * features.len() + j] = *v,
                _ => {
                    let token = &cells[keep[k]][c];
                    let why = if v.is_some() {
                        format!("column `{}` holds `{token}`, which is not a finite number", names[c])
                    } else {
                        format!(
                            "column `{}` holds the text `{token}`: features must be numbers; encode a category as \
                             numbers (one 0/1 column per category) or leave the column out with --features",
                            names[c]
                        )
                    };
                    return Err(invalid(lines[keep[k]], why));
                }
            }
        }
    }

    // The target: numbers for regression, class labels for classification.
    let (y, class_names) = match target {
        None => (Vec::new(), None),
        Some(t) => {
            let tokens: Vec<&str> = keep.iter().map(|&r| cells[r][t].as_str()).collect();
            match spec.task {
                Task::Regression => {
                    let mut y = Vec::with_capacity(rows);
                    for (k, token) in tokens.iter().enumerate() {
                        match token.parse::<f64>() {
                            Ok(v) if v.is_finite() => y.push(v),
                            _ => {
                                return Err(invalid(
                                    lines[keep[k]],
                                    format!(
                                        "the target `{}` holds `{token}`, not a finite number (use \
                                         --task classification for class labels)",
                                        names[t]
                                    ),
                                ));
                            }
                        }
                    }
                    (y, None)
                }
                Task::Classification => {
                    let classes = match &spec.classes {
                        Some(c) => c.clone(),
                        None => class_order(&tokens),
                    };
                    let mut y = Vec::with_capacity(rows);
                    for (k, token) in tokens.iter().enumerate() {
                        match classes.iter().position(|c| c == token) {
                            Some(i) => y.push(i as f64),
                            None => {
                                return Err(invalid(
                                    lines[keep[k]],
                                    format!(
                                        "the target `{}` holds `{token}`, which is not one of the classes {}",
                                        names[t],
                                        classes.join(", ")
                                    ),
                                ));
                            }
                        }
                    }
                    if classes.len() < 2 {
                        return Err(invalid(
                            header_line,
                            format!(
                                "the target `{}` has a single class `{}`: classification needs two or more",
                                names[t],
                                classes.join("")
                            ),
                        ));
                    }
                    (y, Some(classes))
                }
            }
        }
    };

    let passthrough = (0..names.len())
        .filter(|c| !used.contains(c))
        .map(|c| (names[c].clone(), keep.iter().map(|&r| cells[r][c].clone()).collect()))
        .collect();
    Ok(UserTable {
        path: path.to_path_buf(),
        feature_names: features.iter().map(|&c| names[c].clone()).collect(),
        target_name: target.map(|t| names[t].clone()),
        class_names,
        x,
        y,
        lines: keep.iter().map(|&r| lines[r]).collect(),
        dropped,
        passthrough,
    })
}

/// The distinct labels, sorted numerically when all are numbers (so `2` comes before `10`),
/// else as text.
fn class_order(tokens: &[&str]) -> Vec<String> {
    let mut distinct: Vec<String> = tokens.iter().map(|t| t.to_string()).collect();
    distinct.sort();
    distinct.dedup();
    if distinct.iter().all(|t| t.parse::<f64>().is_ok()) {
        distinct.sort_by(|a, b| a.parse::<f64>().unwrap_or(0.0).total_cmp(&b.parse::<f64>().unwrap_or(0.0)));
    }
    distinct
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.csv");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn reads_features_target_classes_and_passthrough() {
        let (_d, path) = write("id,a,b,label\nx1,1,2.5,yes\n\nx2,3,-4,no\nx3,\"5\",6,yes\n");
        let spec = TableSpec::new("label", Task::Classification);
        let mut spec = spec;
        spec.features = Some(vec!["b".into(), "a".into()]);
        let t = read_table(&path, &spec).unwrap();
        assert_eq!(t.feature_names, ["b", "a"]);
        assert_eq!(t.x, [2.5, 1.0, -4.0, 3.0, 6.0, 5.0]);
        assert_eq!(t.class_names.as_deref().unwrap(), ["no", "yes"]);
        assert_eq!(t.y, [1.0, 0.0, 1.0]);
        assert_eq!(t.lines, [2, 4, 5]);
        assert_eq!(t.passthrough, [("id".to_string(), vec!["x1".to_string(), "x2".into(), "x3".into()])]);
    }

    #[test]
    fn numeric_classes_sort_as_numbers() {
        assert_eq!(class_order(&["10", "2", "2", "1"]), ["1", "2", "10"]);
    }

    #[test]
    fn refusals_name_the_place() {
        let spec = TableSpec::new("y", Task::Regression);
        let err = |text: &str, spec: &TableSpec| read_table(&write(text).1, spec).unwrap_err().to_string();
        assert!(err("a,y\n1,2\nred,3\n", &spec).contains(":3: column `a` holds the text `red`"));
        assert!(err("a,y\n1,2\n,3\n", &spec).contains(":3: column `a` is missing"));
        assert!(err("a,y\n1,2\n1,NA\n", &spec).contains("--drop-missing"));
        assert!(err("1,2\n3,4\n", &spec).contains("header row"));
        assert!(err("a,b\n1,2\n", &spec).contains("no column named `y`"));
        assert!(err("", &spec).contains("is empty"));
        assert!(err("a,y\n", &spec).contains("no data rows"));
        assert!(err("a,y\n1,2,3\n", &spec).contains("expected 2 columns"));
        assert!(err("a,y\n1,\"2\n", &spec).contains("never closed"));
        assert!(err("a,y\n1,inf\n", &spec).contains("not a finite number"));
        let mut dropping = spec.clone();
        dropping.drop_missing = true;
        let t = read_table(&write("a,y\n1,2\n?,3\n4,5\n").1, &dropping).unwrap();
        assert_eq!((t.x, t.y, t.dropped), (vec![1.0, 4.0], vec![2.0, 5.0], vec![3]));
        let mut classes = TableSpec::new("y", Task::Classification);
        classes.classes = Some(vec!["a".into(), "b".into()]);
        assert!(err("x,y\n1,a\n2,c\n", &classes).contains("not one of the classes a, b"));
        assert!(err("x,y\n1,a\n2,a\n", &TableSpec::new("y", Task::Classification)).contains("a single class"));
    }

    #[test]
    fn a_dataset_holds_out_the_test_fraction() {
        let text: String =
            std::iter::once("a,y\n".to_string()).chain((0..50).map(|i| format!("{i},{}\n", 2 * i))).collect();
        let t = read_table(&write(&text).1, &TableSpec::new("y", Task::Regression)).unwrap();
        let ds = t.into_dataset("mine", 0.2, 7).unwrap();
        assert_eq!((ds.splits[0].train.len(), ds.splits[0].test.len()), (40, 10));
        let again = read_table(&write(&text).1, &TableSpec::new("y", Task::Regression)).unwrap();
        assert_eq!(again.into_dataset("mine", 0.2, 7).unwrap().splits, ds.splits);
    }
}
