//! The one error type of the crate. Every variant that comes from a file names the file, and
//! every variant that comes from a place inside a file names the line (1-based) and, where
//! there is one, the column (1-based byte offset) and field (1-based) of the offending token.

use std::path::PathBuf;

/// Why loading, checking or downloading data failed.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{}: file not found{hint}", path.display())]
    MissingFile { path: PathBuf, hint: String },

    #[error("{}: data folder not found{hint}", path.display())]
    MissingFolder { path: PathBuf, hint: String },

    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{}: {what}", path.display())]
    EmptyFile { path: PathBuf, what: &'static str },

    #[error("{}:{line}: expected {expected} columns (as on line {first_line}), found {found}", path.display())]
    ColumnCount { path: PathBuf, line: usize, expected: usize, found: usize, first_line: usize },

    #[error("{}:{line}:{column}: field {field} `{token}` {reason}", path.display())]
    BadValue { path: PathBuf, line: usize, column: usize, field: usize, token: String, reason: &'static str },

    #[error("{}:{line}: {what} {index} is outside the data ({limit} {what}s in {of})", path.display())]
    IndexOutOfRange {
        path: PathBuf,
        line: usize,
        /// "row" or "column".
        what: &'static str,
        index: usize,
        limit: usize,
        /// The file or table the index points into.
        of: String,
    },

    #[error("{}:{line}: row {row} is listed again (first on line {first_line} of {})", path.display(), first_path.display())]
    DuplicateRow { path: PathBuf, line: usize, row: usize, first_path: PathBuf, first_line: usize },

    #[error("{}:{line}: no column named `{name}` in the header (columns: {available})", path.display())]
    MissingColumn { path: PathBuf, line: usize, name: String, available: String },

    #[error("{}: {found} {what}, but the registry entry `{dataset}` expects {expected}", path.display())]
    ShapeMismatch { path: PathBuf, dataset: String, what: &'static str, found: usize, expected: usize },

    #[error("data set `{dataset}` has no split {split} (it has {count}: 0..{count})")]
    NoSuchSplit { dataset: String, split: usize, count: usize },

    #[error("unknown data set `{name}`; known names and aliases: {known}")]
    UnknownDataset { name: String, known: String },

    #[error("{source_name}: {message}")]
    Registry { source_name: String, message: String },

    #[error("{}: sha256 mismatch{detail}: expected {expected}, found {actual}", path.display())]
    ChecksumMismatch {
        path: PathBuf,
        expected: String,
        actual: String,
        /// Where the bytes came from, e.g. " in download from URL (1000 of 2000 bytes)".
        detail: String,
    },

    #[error("{}: download from {url} failed after {received} bytes: {message}", path.display())]
    Download { path: PathBuf, url: String, received: u64, message: String },

    #[error("{}: cannot be downloaded automatically: {note} (source: {url})", path.display())]
    NotFetchable { path: PathBuf, url: String, note: String },

    #[error("{}: the CSV reader failed: {message}", path.display())]
    Parser { path: PathBuf, message: String },

    #[error("data set `{dataset}`: {message}")]
    Invalid { dataset: String, message: String },
}

impl DataError {
    /// Wraps an I/O error on `path`, turning "not found" into [`DataError::MissingFile`].
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> DataError {
        let path = path.into();
        if source.kind() == std::io::ErrorKind::NotFound {
            DataError::MissingFile { path, hint: String::new() }
        } else {
            DataError::Io { path, source }
        }
    }
}
