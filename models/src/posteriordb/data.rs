//! Reading a posterior's `data.json` as Stan reads it, with the checks Stan's data block makes:
//! every error names the posterior, the file, the field and the reason.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::PosteriorDbError;

/// The fields of one `data.json`, with what is needed to word an error.
pub(crate) struct Data {
    posterior: String,
    file: PathBuf,
    fields: Map<String, Value>,
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
    /// object.
    pub(crate) fn read(posterior: &str, file: &Path) -> Result<Self, PosteriorDbError> {
        let file = file.to_path_buf();
        match read_json(posterior, &file)? {
            Value::Object(fields) => Ok(Self { posterior: posterior.to_string(), file, fields }),
            other => Err(PosteriorDbError::InvalidField {
                posterior: posterior.to_string(),
                file,
                field: "(top level)".into(),
                reason: format!("expected a JSON object of named fields, found {}", kind(&other)),
            }),
        }
    }

    /// An [`PosteriorDbError::InvalidField`] for `field`.
    pub(crate) fn invalid(&self, field: &str, reason: impl Into<String>) -> PosteriorDbError {
        PosteriorDbError::InvalidField {
            posterior: self.posterior.to_string(),
            file: self.file.clone(),
            field: field.to_string(),
            reason: reason.into(),
        }
    }

    fn get(&self, field: &str) -> Result<&Value, PosteriorDbError> {
        self.fields.get(field).ok_or_else(|| PosteriorDbError::MissingField {
            posterior: self.posterior.to_string(),
            file: self.file.clone(),
            field: field.to_string(),
        })
    }

    /// An `int` field no smaller than `lower` (Stan's `int<lower=...>`), as a count.
    pub(crate) fn size(&self, field: &str, lower: usize) -> Result<usize, PosteriorDbError> {
        let value = self.get(field)?;
        let v = as_int(value).ok_or_else(|| self.invalid(field, format!("expected an integer, found {value}")))?;
        if v < lower as i64 {
            return Err(self.invalid(field, format!("value {v} is below the lower bound {lower}")));
        }
        usize::try_from(v).map_err(|_| self.invalid(field, format!("value {v} is too large")))
    }

    /// An `int` field, any value.
    pub(crate) fn int(&self, field: &str) -> Result<i64, PosteriorDbError> {
        let value = self.get(field)?;
        as_int(value).ok_or_else(|| self.invalid(field, format!("expected an integer, found {value}")))
    }

    /// A `real` field.
    pub(crate) fn real(&self, field: &str) -> Result<f64, PosteriorDbError> {
        let value = self.get(field)?;
        value.as_f64().ok_or_else(|| self.invalid(field, format!("expected a number, found {value}")))
    }

    /// A vector or array of `len` reals, whose length is given by the size field `len_field`.
    pub(crate) fn reals(&self, field: &str, len: usize, len_field: &str) -> Result<Vec<f64>, PosteriorDbError> {
        let items = self.array(field, len, len_field)?;
        items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_f64().ok_or_else(|| self.invalid(field, format!("element {} is not a number: {v}", i + 1)))
            })
            .collect()
    }

    /// An array of `len` integers, whose length is given by the size field `len_field`.
    pub(crate) fn ints(&self, field: &str, len: usize, len_field: &str) -> Result<Vec<i64>, PosteriorDbError> {
        let items = self.array(field, len, len_field)?;
        items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                as_int(v).ok_or_else(|| self.invalid(field, format!("element {} is not an integer: {v}", i + 1)))
            })
            .collect()
    }

    /// A `matrix[rows, cols]` given as `rows` arrays of `cols` numbers; row-major values.
    pub(crate) fn matrix(
        &self,
        field: &str,
        (rows, rows_field): (usize, &str),
        (cols, cols_field): (usize, &str),
    ) -> Result<Vec<f64>, PosteriorDbError> {
        let items = self.array(field, rows, rows_field)?;
        let mut out = Vec::with_capacity(rows * cols);
        for (r, row) in items.iter().enumerate() {
            let Value::Array(row) = row else {
                return Err(self.invalid(field, format!("row {} is not an array: {}", r + 1, kind(row))));
            };
            if row.len() != cols {
                return Err(
                    self.invalid(field, format!("row {} has {} values but {cols_field} = {cols}", r + 1, row.len()))
                );
            }
            for (c, v) in row.iter().enumerate() {
                out.push(v.as_f64().ok_or_else(|| {
                    self.invalid(field, format!("element [{}, {}] is not a number: {v}", r + 1, c + 1))
                })?);
            }
        }
        Ok(out)
    }

    fn array(&self, field: &str, len: usize, len_field: &str) -> Result<&[Value], PosteriorDbError> {
        let value = self.get(field)?;
        // Stan's JSON writes a one-element array as a bare number.
        let items: &[Value] = match value {
            Value::Array(items) => items,
            Value::Number(_) => std::slice::from_ref(value),
            other => return Err(self.invalid(field, format!("expected an array, found {}", kind(other)))),
        };
        if items.len() != len {
            return Err(self.invalid(field, format!("has {} values but {len_field} = {len}", items.len())));
        }
        Ok(items)
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

/// An integer, from an integer literal or a float with no fractional part.
fn as_int(value: &Value) -> Option<i64> {
    value.as_i64().or_else(|| value.as_f64().filter(|v| v.fract() == 0.0 && v.abs() < 9.0e15).map(|v| v as i64))
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
