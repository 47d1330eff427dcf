//! The one error type of the crate. Every variant that comes from a file names the file, and
//! every variant that comes from a place inside a file names the line (1-based) and, where
//! there is one, the column (1-based byte offset) and field (1-based) of the offending token.

use std::path::PathBuf;

/// Why loading, checking or downloading data failed.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A file the data set needs is absent.
    #[error("{}: file not found{hint}", path.display())]
    MissingFile {
        /// The missing file.
        path: PathBuf,
        /// Extra context for the message (with its leading space), or empty.
        hint: String,
    },

    /// The data set's folder is absent.
    #[error("{}: data folder not found{hint}", path.display())]
    MissingFolder {
        /// The missing folder.
        path: PathBuf,
        /// Extra context for the message (with its leading space), or empty.
        hint: String,
    },

    /// Reading or writing a file failed for a reason other than its absence.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file being read or written.
        path: PathBuf,
        /// The underlying error.
        error: std::io::Error,
    },

    /// A table has no data rows.
    #[error("{}: {what}", path.display())]
    EmptyFile {
        /// The empty file.
        path: PathBuf,
        /// What exactly is missing, phrased to follow the path.
        what: &'static str,
    },

    /// A row has a different number of fields than the first row.
    #[error("{}:{line}: expected {expected} columns (as on line {first_line}), found {found}", path.display())]
    ColumnCount {
        /// The file holding the row.
        path: PathBuf,
        /// Line of the offending row.
        line: usize,
        /// Number of fields on the first row.
        expected: usize,
        /// Number of fields on the offending row.
        found: usize,
        /// Line of the first row, which set the expected count.
        first_line: usize,
    },

    /// A field is not a usable number.
    #[error("{}:{line}:{column}: field {field} `{token}` {reason}", path.display())]
    BadValue {
        /// The file holding the field.
        path: PathBuf,
        /// Line of the field.
        line: usize,
        /// Byte column where the field starts.
        column: usize,
        /// Position of the field on its line.
        field: usize,
        /// The field as written.
        token: String,
        /// What is wrong with it, phrased to follow the token.
        reason: &'static str,
    },

    /// An index file points past the end of the table it indexes.
    #[error("{}:{line}: {what} {index} is outside the data ({limit} {what}s in {of})", path.display())]
    IndexOutOfRange {
        /// The index file.
        path: PathBuf,
        /// Line of the offending index.
        line: usize,
        /// "row" or "column".
        what: &'static str,
        /// The offending index (0-based).
        index: usize,
        /// Number of rows or columns there are.
        limit: usize,
        /// The file or table the index points into.
        of: String,
    },

    /// A row appears twice in one split, which would leak test data into training or weight a
    /// row twice.
    #[error("{}:{line}: row {row} is listed again (first on line {first_line} of {})", path.display(), first_path.display())]
    DuplicateRow {
        /// The index file listing the row the second time.
        path: PathBuf,
        /// Line of the second listing.
        line: usize,
        /// The repeated row (0-based).
        row: usize,
        /// The index file listing the row the first time.
        first_path: PathBuf,
        /// Line of the first listing.
        first_line: usize,
    },

    /// The label column named by the registry is not in the CSV header.
    #[error("{}:{line}: no column named `{name}` in the header (columns: {available})", path.display())]
    MissingColumn {
        /// The CSV file.
        path: PathBuf,
        /// Line of the header.
        line: usize,
        /// The column that was looked for.
        name: String,
        /// The header's column names, comma-separated.
        available: String,
    },

    /// The loaded data's shape differs from what the registry entry declares.
    #[error("{}: {found} {what}, but the registry entry `{dataset}` expects {expected}", path.display())]
    ShapeMismatch {
        /// The data file.
        path: PathBuf,
        /// Name of the registry entry.
        dataset: String,
        /// The quantity that differs ("rows", "features", ...).
        what: &'static str,
        /// The count in the data.
        found: usize,
        /// The count the registry declares.
        expected: usize,
    },

    /// A split index beyond the data set's splits was asked for.
    #[error("data set `{dataset}` has no split {split} (it has {count}: 0..{count})")]
    NoSuchSplit {
        /// Name of the data set.
        dataset: String,
        /// The split asked for.
        split: usize,
        /// Number of splits the data set has.
        count: usize,
    },

    /// No registry entry has this name or alias.
    #[error("unknown data set `{name}`; known names and aliases: {known}")]
    UnknownDataset {
        /// The name asked for.
        name: String,
        /// Every known name and alias, comma-separated.
        known: String,
    },

    /// A registry file failed to parse or to pass its consistency checks.
    #[error("{source_name}: {message}")]
    Registry {
        /// Name of the registry (its file, or the built-in one).
        source_name: String,
        /// What is wrong with it.
        message: String,
    },

    /// A file's SHA-256 differs from the registry's.
    #[error("{}: sha256 mismatch{detail}: expected {expected}, found {actual}", path.display())]
    ChecksumMismatch {
        /// The file whose bytes were hashed.
        path: PathBuf,
        /// The registry's hash, hex.
        expected: String,
        /// The hash of the bytes found, hex.
        actual: String,
        /// Where the bytes came from, e.g. " in download from URL (1000 of 2000 bytes)".
        detail: String,
    },

    /// A download failed part way or at the start.
    #[error("{}: download from {url} failed after {received} bytes: {message}", path.display())]
    Download {
        /// Where the file was to be written.
        path: PathBuf,
        /// The address downloaded from.
        url: String,
        /// Bytes received before the failure.
        received: u64,
        /// What went wrong.
        message: String,
    },

    /// The file's source offers no direct download; it must be placed by hand.
    #[error("{}: cannot be downloaded automatically: {note} (source: {url})", path.display())]
    NotFetchable {
        /// Where the file is expected.
        path: PathBuf,
        /// Where it can be obtained.
        url: String,
        /// The registry's note on how to obtain it.
        note: String,
    },

    /// The CSV reader itself rejected the file.
    #[error("{}: the CSV reader failed: {message}", path.display())]
    Parser {
        /// The file being read.
        path: PathBuf,
        /// The reader's message.
        message: String,
    },

    /// A user table breaks a rule at one line (a text feature, a missing value, a bad header).
    #[error("{}:{line}: {message}", path.display())]
    Table {
        /// The table's file.
        path: PathBuf,
        /// 1-based line of the problem.
        line: usize,
        /// What is wrong and how to mend it.
        message: String,
    },

    /// The data set's contents are inconsistent in a way no other variant covers.
    #[error("data set `{dataset}`: {message}")]
    Invalid {
        /// Name of the data set.
        dataset: String,
        /// What is wrong.
        message: String,
    },
}

impl DataError {
    /// Wraps an I/O error on `path`, turning "not found" into [`DataError::MissingFile`].
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> DataError {
        let path = path.into();
        if source.kind() == std::io::ErrorKind::NotFound {
            DataError::MissingFile { path, hint: String::new() }
        } else {
            DataError::Io { path, error: source }
        }
    }
}
