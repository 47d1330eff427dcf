//! Reading a posterior's `data.json` as Stan reads it, with the checks Stan's data block makes:
//! every error names the posterior, the file, the field and the reason.

use std::path::Path;

use serde_json::Value;

use crate::stan_data::{Ints, Reals, StanData, StanDataError};

use super::PosteriorDbError;

/// The fields of one `data.json`, with what is needed to word an error.
pub(crate) struct Data {
    posterior: String,
    data: StanData,
}

/// Reads and parses a JSON file of the suite; both failures name the posterior and the file.
pub(crate) fn read_json(posterior: &str, file: &Path) -> Result<Value, PosteriorDbError> {
    let text = std::fs::read_to_string(file).map_err(|error| PosteriorDbError::Io {
        posterior: posterior.to_string(),
        file: file.to_path_buf(),
        error,
    })?;
    serde_json::from_str(&text).map_err(|e| PosteriorDbError::Json {
        posterior: posterior.to_string(),
        file: file.to_path_buf(),
        line: e.line(),
        column: e.column(),
        reason: e.to_string(),
    })
}

impl Data {
    /// Posterior `posterior`'s data file `file` (Stan's JSON data format), which must be a JSON
    /// object: read by the one public reader, [`StanData`], its errors worded for the suite.
    pub(crate) fn read(posterior: &str, file: &Path) -> Result<Self, PosteriorDbError> {
        let data = StanData::read(file).map_err(|e| suite_error(posterior, e))?;
        Ok(Self { posterior: posterior.to_string(), data })
    }

    fn lift<T>(&self, result: Result<T, StanDataError>) -> Result<T, PosteriorDbError> {
        result.map_err(|e| suite_error(&self.posterior, e))
    }

    /// An [`PosteriorDbError::InvalidField`] for `field`.
    pub(crate) fn invalid(&self, field: &str, reason: impl Into<String>) -> PosteriorDbError {
        suite_error(&self.posterior, self.data.invalid(field, None, reason))
    }

    /// An `int` field no smaller than `lower` (Stan's `int<lower=...>`), as a count.
    pub(crate) fn size(&self, field: &str, lower: usize) -> Result<usize, PosteriorDbError> {
        let v = self.int(field)?;
        if v < lower as i64 {
            return Err(self.invalid(field, format!("value {v} is below the lower bound {lower}")));
        }
        usize::try_from(v).map_err(|_| self.invalid(field, format!("value {v} is too large")))
    }

    /// An `int` field, any value.
    pub(crate) fn int(&self, field: &str) -> Result<i64, PosteriorDbError> {
        self.lift(self.data.int(field))
    }

    /// A `real` field.
    pub(crate) fn real(&self, field: &str) -> Result<f64, PosteriorDbError> {
        self.lift(self.data.real(field))
    }

    /// A vector or array of `len` reals, whose length is given by the size field `len_field`.
    pub(crate) fn reals(&self, field: &str, len: usize, len_field: &str) -> Result<Vec<f64>, PosteriorDbError> {
        self.lift(self.data.vector(field, len).map(Reals::into_vec)).map_err(|e| name_size(e, len_field, len))
    }

    /// An array of `len` integers, whose length is given by the size field `len_field`.
    pub(crate) fn ints(&self, field: &str, len: usize, len_field: &str) -> Result<Vec<i64>, PosteriorDbError> {
        self.lift(self.data.ints(field, len).map(Ints::into_vec)).map_err(|e| name_size(e, len_field, len))
    }

    /// A `matrix[rows, cols]` given as `rows` arrays of `cols` numbers; row-major values.
    pub(crate) fn matrix(
        &self,
        field: &str,
        (rows, rows_field): (usize, &str),
        (cols, cols_field): (usize, &str),
    ) -> Result<Vec<f64>, PosteriorDbError> {
        self.lift(self.data.matrix(field, rows, cols).map(Reals::into_vec))
            .map_err(|e| name_size(name_size(e, rows_field, rows), cols_field, cols))
    }

    /// An `array[rows, cols] int` field, row-major.
    pub(crate) fn int_matrix(
        &self,
        field: &str,
        (rows, rows_field): (usize, &str),
        (cols, cols_field): (usize, &str),
    ) -> Result<Vec<i64>, PosteriorDbError> {
        self.lift(self.data.int_array(field, &[rows.into(), cols.into()]).map(Ints::into_vec))
            .map_err(|e| name_size(name_size(e, rows_field, rows), cols_field, cols))
    }

    /// An index array `array[len] int` (length given by `len_field`) into a group of `groups`
    /// entries, as 0-based indices: each must lie in `1..=groups`, which both the data block's
    /// bounds and the program's indexing require (an error names the element).
    pub(crate) fn indices(
        &self,
        field: &str,
        len: usize,
        len_field: &str,
        groups: usize,
    ) -> Result<Vec<usize>, PosteriorDbError> {
        let ints = self.lift(self.data.ints(field, len)).map_err(|e| name_size(e, len_field, len))?;
        self.lift(ints.indices(groups))
    }

    /// Checks Stan's data-block bounds `<lower=..., upper=...>` (inclusive) on every value.
    pub(crate) fn check_bounds(
        &self,
        field: &str,
        values: &[f64],
        lower: Option<f64>,
        upper: Option<f64>,
    ) -> Result<(), PosteriorDbError> {
        let declared = match (lower, upper) {
            (Some(l), Some(u)) => format!("<lower={l}, upper={u}>"),
            (Some(l), None) => format!("<lower={l}>"),
            (None, Some(u)) => format!("<upper={u}>"),
            (None, None) => return Ok(()),
        };
        for (i, &v) in values.iter().enumerate() {
            if lower.is_some_and(|l| v < l) || upper.is_some_and(|u| v > u) {
                return Err(self.invalid(
                    field,
                    format!("value {v} at element {} is outside the constraint {declared} of the data block", i + 1),
                ));
            }
        }
        Ok(())
    }

    /// Requires every value to be strictly positive, for the reason given (a log the model
    /// takes, a scale it divides by).
    pub(crate) fn check_positive(&self, field: &str, values: &[f64], why: &str) -> Result<(), PosteriorDbError> {
        match values.iter().position(|&v| v <= 0.0) {
            Some(i) => Err(self.invalid(field, format!("value {} at element {} must be > 0: {why}", values[i], i + 1))),
            None => Ok(()),
        }
    }
}

/// A reader's error in the suite's words: the posterior named, the field's error kept.
fn suite_error(posterior: &str, error: StanDataError) -> PosteriorDbError {
    let posterior = posterior.to_string();
    match error {
        StanDataError::Io { file, error } => PosteriorDbError::Io { posterior, file, error },
        StanDataError::Json { file, line, column, reason } => {
            PosteriorDbError::Json { posterior, file, line, column, reason }
        }
        StanDataError::Missing { file, field } => PosteriorDbError::MissingField { posterior, file, field },
        StanDataError::Invalid { file, field, element, reason } => PosteriorDbError::InvalidField {
            posterior,
            file,
            field,
            reason: match element {
                Some(e) => format!("element {e}: {reason}"),
                None => reason,
            },
        },
        StanDataError::NotUtf8 { file, offset } => PosteriorDbError::InvalidField {
            posterior,
            file,
            field: "(file)".into(),
            reason: format!("not UTF-8 text (invalid byte at offset {offset})"),
        },
        StanDataError::NotObject { file, found } => PosteriorDbError::InvalidField {
            posterior,
            file,
            field: "(top level)".into(),
            reason: format!("expected a JSON object of named fields, found {found}"),
        },
        StanDataError::Built { error, .. } => PosteriorDbError::Model { posterior, error },
    }
}

/// The suite's models name the size field of a length: `has 3 values but N = 5`.
fn name_size(error: PosteriorDbError, size_field: &str, len: usize) -> PosteriorDbError {
    match error {
        PosteriorDbError::InvalidField { posterior, file, field, reason } => {
            let reason =
                reason.replace(&format!(" values, declared {len}"), &format!(" values but {size_field} = {len}"));
            PosteriorDbError::InvalidField { posterior, file, field, reason }
        }
        other => other,
    }
}
