//! Stan's JSON data format, read as Stan's `data` block reads it: a size field, a real, an int,
//! vectors, matrices and arrays of any shape, each declared by the reader with the sizes it
//! must have, and the block's constraints checked on every element. Every error names the file,
//! the field, the element (1-based, as Stan prints it) and the rule it breaks.
//!
//! ```no_run
//! use parvi_models::stan_data::StanData;
//!
//! # fn main() -> Result<(), parvi_models::stan_data::StanDataError> {
//! // data { int<lower=1> N; int<lower=1> J; array[N] int<lower=1, upper=J> jj;
//! //        vector[N] y; vector<lower=0>[J] sigma; matrix[N, 3] X; }
//! let data = StanData::read("data.json")?;
//! let n = data.size("N")?;
//! let jj = data.ints("jj", "N")?.lower(1)?.upper_field("J")?;
//! let y = data.vector("y", "N")?;
//! let sigma = data.vector("sigma", "J")?.lower(0.0)?;
//! let x = data.matrix("X", n, 3)?;
//! # let _ = (jj, y, sigma, x); Ok(()) }
//! ```
//!
//! A size is given either as a number or as the name of the `int` field that declares it
//! (`"N"`); with a name the error says `the array has 3 values but N = 5`. Values come back as `f64`
//! (reals) or `i64` (ints) in row-major order; [`Reals::tensor`] and [`Ints::indices`] turn them
//! into what a `Program` holds (a `[1, ...]` data tensor, 0-based indices for
//! `parvi_model::tensor_ops` gathers).

use std::fmt::Display;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};

use burn::tensor::{Device, Int, Tensor, TensorData};
use parvi_model::ModelError;
use serde_json::{Map, Value};
use thiserror::Error;

/// What is wrong with a data file: each names the file and, where one is at fault, the field,
/// the element and the reason.
#[derive(Debug, Error)]
pub enum StanDataError {
    /// The file could not be read.
    #[error("data file {}: cannot read it: {error}", file.display())]
    Io {
        /// The file.
        file: PathBuf,
        /// The operating system's reason.
        error: std::io::Error,
    },
    /// The file is not UTF-8 text.
    #[error("data file {}: not UTF-8 text (invalid byte at offset {offset}); Stan's JSON data is UTF-8", file.display())]
    NotUtf8 {
        /// The file.
        file: PathBuf,
        /// Byte offset of the first invalid byte.
        offset: usize,
    },
    /// The file is not valid JSON (a truncated file ends here).
    #[error("data file {}: not valid JSON (line {line}, column {column}): {reason}", file.display())]
    Json {
        /// The file.
        file: PathBuf,
        /// Line of the syntax error (from 1).
        line: usize,
        /// Column of the syntax error (from 1).
        column: usize,
        /// serde_json's message.
        reason: String,
    },
    /// The top level is not a JSON object of named fields.
    #[error("data file {}: expected a JSON object of named fields, found {found}", file.display())]
    NotObject {
        /// The file.
        file: PathBuf,
        /// What the top level is.
        found: &'static str,
    },
    /// A field the model declares is absent.
    #[error("data file {}: field `{field}` is missing (the model's data block declares it)", file.display())]
    Missing {
        /// The file.
        file: PathBuf,
        /// The missing field.
        field: String,
    },
    /// A field has the wrong type, the wrong size, or a value outside its constraint.
    #[error("data file {}: field `{field}`{}: {reason}", file.display(), element.as_deref().map(|e| format!(", element {e}")).unwrap_or_default())]
    Invalid {
        /// The file.
        file: PathBuf,
        /// The field at fault.
        field: String,
        /// The element at fault, 1-based as Stan prints it (`[3]`, `[2,1]`), if one is.
        element: Option<String>,
        /// What is wrong with it.
        reason: String,
    },
    /// A value built from the data ([`StanData::check_args`]) failed on an argument the builder
    /// tied to no field.
    #[error("data file {}: {error}", file.display())]
    Built {
        /// The file.
        file: PathBuf,
        /// The DSL's error.
        error: ModelError,
    },
}

impl StanDataError {
    /// The field at fault, if the error is about one.
    pub fn field(&self) -> Option<&str> {
        match self {
            StanDataError::Missing { field, .. } | StanDataError::Invalid { field, .. } => Some(field),
            _ => None,
        }
    }
}

/// A size as a reader is told it: a number, or the name of the `int` field that declares it.
#[derive(Clone, Copy, Debug)]
pub enum Len<'a> {
    /// A size known to the model (a constant, or one already read).
    Fixed(usize),
    /// The size is this `int` field's value (`vector[N] y`).
    Field(&'a str),
}

impl From<usize> for Len<'_> {
    fn from(n: usize) -> Self {
        Len::Fixed(n)
    }
}

impl<'a> From<&'a str> for Len<'a> {
    fn from(name: &'a str) -> Self {
        Len::Field(name)
    }
}

/// The fields of one Stan JSON data file.
#[derive(Clone, Debug)]
pub struct StanData {
    file: PathBuf,
    fields: Map<String, Value>,
}

impl StanData {
    /// Reads `file`: UTF-8 JSON whose top level is an object of named fields.
    pub fn read(file: impl AsRef<Path>) -> Result<Self, StanDataError> {
        let file = file.as_ref().to_path_buf();
        let bytes = std::fs::read(&file).map_err(|error| StanDataError::Io { file: file.clone(), error })?;
        let text = String::from_utf8(bytes)
            .map_err(|e| StanDataError::NotUtf8 { file: file.clone(), offset: e.utf8_error().valid_up_to() })?;
        Self::parse(&text, file)
    }

    /// Parses `text` as the contents of `file` (named in errors).
    pub fn parse(text: &str, file: impl Into<PathBuf>) -> Result<Self, StanDataError> {
        let file = file.into();
        let value: Value = serde_json::from_str(text).map_err(|e| StanDataError::Json {
            file: file.clone(),
            line: e.line(),
            column: e.column(),
            reason: e.to_string(),
        })?;
        match value {
            Value::Object(fields) => Ok(Self { file, fields }),
            other => Err(StanDataError::NotObject { file, found: kind(&other) }),
        }
    }

    /// Data with no fields (a model whose data block is empty), named `file` in errors.
    pub fn empty(file: impl Into<PathBuf>) -> Self {
        Self { file: file.into(), fields: Map::new() }
    }

    /// The file the data came from.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// Whether the file has field `field`.
    pub fn has(&self, field: &str) -> bool {
        self.fields.contains_key(field)
    }

    /// The fields' names (sorted).
    pub fn field_names(&self) -> impl Iterator<Item = &str> {
        self.fields.keys().map(String::as_str)
    }

    /// An [`StanDataError::Invalid`] for `field` (and `element`, 1-based), for a model's own
    /// checks beyond the declared constraints.
    pub fn invalid(&self, field: &str, element: Option<String>, reason: impl Into<String>) -> StanDataError {
        StanDataError::Invalid { file: self.file.clone(), field: field.to_string(), element, reason: reason.into() }
    }

    fn get(&self, field: &str) -> Result<&Value, StanDataError> {
        self.fields
            .get(field)
            .ok_or_else(|| StanDataError::Missing { file: self.file.clone(), field: field.to_string() })
    }

    /// `int field;`
    pub fn int(&self, field: &str) -> Result<i64, StanDataError> {
        let value = self.get(field)?;
        let v = as_int(value)
            .ok_or_else(|| self.invalid(field, None, format!("expected an integer, found {}", show(value))))?;
        if !INT_RANGE.contains(&v) {
            return Err(self.invalid(field, None, int_range_reason(v)));
        }
        Ok(v)
    }

    /// `int<lower=0> field;`, as a count (a size other fields are declared with).
    pub fn size(&self, field: &str) -> Result<usize, StanDataError> {
        let v = self.int(field)?;
        usize::try_from(v)
            .map_err(|_| self.invalid(field, None, format!("value {v} is below the lower bound 0 of a size")))
    }

    /// `real field;`
    pub fn real(&self, field: &str) -> Result<f64, StanDataError> {
        let value = self.get(field)?;
        as_real(value).ok_or_else(|| self.invalid(field, None, format!("expected a real, found {}", show(value))))
    }

    /// `int<lower=a, upper=b> field;`: the int, checked against Stan's inclusive bounds written
    /// as a Rust range: `data.int_in("K", 1..)?` is `int<lower=1> K`, `..=10` is `<upper=10>`,
    /// `0..=1` both; an upper bound from another field is `1..=data.int("J")?`.
    pub fn int_in(&self, field: &str, bounds: impl RangeBounds<i64>) -> Result<i64, StanDataError> {
        let v = self.int(field)?;
        within(v, &bounds).map_err(|why| self.invalid(field, None, format!("value {v} {why}")))?;
        Ok(v)
    }

    /// `int<lower=a, upper=b> field;` as a size (`int<lower=1> J`: `data.size_in("J", 1..)?`).
    pub fn size_in(&self, field: &str, bounds: impl RangeBounds<usize>) -> Result<usize, StanDataError> {
        let v = self.size(field)?;
        within(v, &bounds).map_err(|why| self.invalid(field, None, format!("value {v} {why}")))?;
        Ok(v)
    }

    /// `real<lower=a, upper=b> field;`: `data.real_in("r_e", 0.0..)?` is `real<lower=0> r_e`,
    /// `0.0..=1.0` a probability. NaN fails any bound, as in Stan.
    pub fn real_in(&self, field: &str, bounds: impl RangeBounds<f64>) -> Result<f64, StanDataError> {
        let v = self.real(field)?;
        within(v, &bounds).map_err(|why| self.invalid(field, None, format!("value {v} {why}")))?;
        Ok(v)
    }

    /// A value built from field `field`'s data (a distribution's constructor given a datum or a
    /// data tensor, an ODE's output times through `ode::check_times`), its error named by the
    /// field: the DSL names its own argument ("parameter `rate` of Exponential"), this names the
    /// data field and, where the DSL gives one, the element, 1-based as Stan prints it
    /// (`field y, element [3]: `counts` of PoissonLog: must be whole numbers >= 0, got -1`).
    ///
    /// ```no_run
    /// # use parvi_model::dist::{Exponential, PoissonLog};
    /// # fn f(data: &parvi_models::stan_data::StanData, device: &parvi_model::burn::tensor::Device)
    /// # -> Result<(), parvi_models::stan_data::StanDataError> {
    /// let r_e = data.real_in("r_e", 0.0..)?;
    /// let prior = data.check("r_e", Exponential::<2>::new(r_e))?; // r_e = 0 is refused here
    /// let y = data.ints("y", "N")?.tensor(device);
    /// let likelihood = data.check("y", PoissonLog::new(y))?; // a negative count, by element
    /// # let _ = (prior, likelihood); Ok(()) }
    /// ```
    pub fn check<T, E: Into<ModelError>>(&self, field: &str, built: Result<T, E>) -> Result<T, StanDataError> {
        built.map_err(|error| self.named(field, &error.into()))
    }

    /// As [`StanData::check`] for a value built from several fields: `fields` pairs each of the
    /// DSL's argument names with the data field it was given (`&[("counts", "y"), ("trials",
    /// "K")]` for `BinomialLogit::new(y, K)`). An error on an argument not listed keeps the
    /// DSL's words ([`StanDataError::Built`]).
    pub fn check_args<T, E: Into<ModelError>>(
        &self,
        fields: &[(&str, &str)],
        built: Result<T, E>,
    ) -> Result<T, StanDataError> {
        built.map_err(|error| {
            let error = error.into();
            let field = error.argument().and_then(|a| fields.iter().find(|(arg, _)| *arg == a.name)).map(|f| f.1);
            match field {
                Some(field) => self.named(field, &error),
                None => StanDataError::Built { file: self.file.clone(), error },
            }
        })
    }

    /// `error` as an error of `field`, its element (0-based row-major in the DSL's argument)
    /// printed 1-based against the field's shape in the file.
    fn named(&self, field: &str, error: &ModelError) -> StanDataError {
        let Some(argument) = error.argument() else {
            return self.invalid(field, None, error.to_string());
        };
        let shape = self.fields.get(field).map(json_shape).unwrap_or_default();
        let element = argument.element.map(|flat| {
            let size: usize = shape.iter().product();
            if shape.is_empty() || flat >= size { element(&[flat]) } else { element(&unflatten(flat, &shape)) }
        });
        self.invalid(field, element, format!("`{}` of {}: {}", argument.name, argument.owner, argument.reason))
    }

    /// `vector[len] field;` or `array[len] real field;`
    pub fn vector<'a>(&'a self, field: &'a str, len: impl Into<Len<'a>>) -> Result<Reals<'a>, StanDataError> {
        self.reals(field, &[len.into()])
    }

    /// `matrix[rows, cols] field;` (or a two-dimensional real array), row-major.
    pub fn matrix<'a>(
        &'a self,
        field: &'a str,
        rows: impl Into<Len<'a>>,
        cols: impl Into<Len<'a>>,
    ) -> Result<Reals<'a>, StanDataError> {
        self.reals(field, &[rows.into(), cols.into()])
    }

    /// A real array, vector, matrix or array of them of any `shape` (outermost first), row-major.
    /// An empty `shape` is a scalar.
    pub fn reals<'a>(&'a self, field: &'a str, shape: &[Len<'a>]) -> Result<Reals<'a>, StanDataError> {
        let (shape, values) = self.elements(field, shape, "a real", as_real)?;
        Ok(Reals { data: self, field, shape, values })
    }

    /// `array[len] int field;`
    pub fn ints<'a>(&'a self, field: &'a str, len: impl Into<Len<'a>>) -> Result<Ints<'a>, StanDataError> {
        self.int_array(field, &[len.into()])
    }

    /// An int array of any `shape` (outermost first), row-major.
    pub fn int_array<'a>(&'a self, field: &'a str, shape: &[Len<'a>]) -> Result<Ints<'a>, StanDataError> {
        let (shape, values) = self.elements(field, shape, "an integer", as_int)?;
        if let Some(i) = values.iter().position(|v| !INT_RANGE.contains(v)) {
            let at = (!shape.is_empty()).then(|| element(&unflatten(i, &shape)));
            return Err(self.invalid(field, at, int_range_reason(values[i])));
        }
        Ok(Ints { data: self, field, shape, values })
    }

    /// Every element of `field` against `shape`, each read by `parse` (`what` names the type in
    /// an error), with the sizes the shape resolved to.
    fn elements<T>(
        &self,
        field: &str,
        shape: &[Len<'_>],
        what: &str,
        parse: fn(&Value) -> Option<T>,
    ) -> Result<(Vec<usize>, Vec<T>), StanDataError> {
        let labels = labels(shape);
        let shape = self.shape(field, shape)?;
        // A size field may claim more values than the file holds (the walk then refuses it):
        // reserve no more than a modest block up front.
        let size = shape.iter().try_fold(1usize, |a, &b| a.checked_mul(b)).unwrap_or(usize::MAX);
        let mut values = Vec::with_capacity(size.min(1 << 16));
        self.walk(field, self.get(field)?, (&shape, &labels), &mut Vec::new(), &mut |index, v| match parse(v) {
            Some(x) => {
                values.push(x);
                Ok(())
            }
            None => Err(self.invalid(field, Some(element(index)), format!("expected {what}, found {}", show(v)))),
        })?;
        Ok((shape, values))
    }

    /// The sizes of `shape`, reading the size fields it names.
    fn shape(&self, field: &str, shape: &[Len<'_>]) -> Result<Vec<usize>, StanDataError> {
        shape
            .iter()
            .map(|len| match *len {
                Len::Fixed(n) => Ok(n),
                Len::Field(name) => self.size(name).map_err(|e| match e {
                    StanDataError::Missing { .. } => {
                        self.invalid(field, None, format!("its size field `{name}` is missing from the file"))
                    }
                    other => other,
                }),
            })
            .collect()
    }

    /// Visits every element of `value` against `shape`, checking each axis' length. Stan's JSON
    /// writes a one-element array as a bare value, and an empty axis as `[]` at any depth.
    fn walk(
        &self,
        field: &str,
        value: &Value,
        (shape, labels): (&[usize], &[Option<&str>]),
        index: &mut Vec<usize>,
        visit: &mut Visit<'_>,
    ) -> Result<(), StanDataError> {
        let Some((&len, inner)) = shape.split_first() else {
            if let Value::Array(items) = value {
                return Err(self.invalid(
                    field,
                    (!index.is_empty()).then(|| element(index)),
                    format!("expected a single value, found an array of {} values", items.len()),
                ));
            }
            return visit(index, value);
        };
        let items: &[Value] = match value {
            Value::Array(items) => items,
            _ if len == 1 && !matches!(value, Value::Object(_)) => std::slice::from_ref(value),
            other => {
                let at = if index.is_empty() { String::new() } else { format!(" at {}", element(index)) };
                return Err(self.invalid(field, None, format!("expected an array{at}, found {}", kind(other))));
            }
        };
        if items.is_empty() && shape.contains(&0) {
            return Ok(());
        }
        if items.len() != len {
            let axis = index.len();
            let rank = shape.len() + axis;
            let (what, at) = match (rank, axis) {
                (1, _) => ("the array".to_string(), String::new()),
                (_, 0) => ("dimension 1".to_string(), String::new()),
                (2, _) => (format!("row {}", index[0] + 1), String::new()),
                _ => (format!("dimension {}", axis + 1), format!(" at {}", element(index))),
            };
            let declared = match labels[0] {
                Some(size_field) => format!("but {size_field} = {len}"),
                None => format!(", declared {len}"),
            };
            let sep = if declared.starts_with(',') { "" } else { " " };
            return Err(self.invalid(field, None, format!("{what}{at} has {} values{sep}{declared}", items.len())));
        }
        for (i, item) in items.iter().enumerate() {
            index.push(i);
            self.walk(field, item, (inner, &labels[1..]), index, visit)?;
            index.pop();
        }
        Ok(())
    }
}

/// What [`StanData::walk`] calls on each element: its 1-based-to-be index and its value.
type Visit<'v> = dyn FnMut(&[usize], &Value) -> Result<(), StanDataError> + 'v;

/// The size fields that name each axis of `shape`, where it names them.
fn labels<'a>(shape: &[Len<'a>]) -> Vec<Option<&'a str>> {
    shape.iter().map(|len| if let Len::Field(name) = *len { Some(name) } else { None }).collect()
}

/// The shape of a JSON value as nested arrays (the first element's, at each depth): `[]` for a
/// scalar.
fn json_shape(value: &Value) -> Vec<usize> {
    let mut shape = Vec::new();
    let mut at = value;
    while let Value::Array(items) = at {
        shape.push(items.len());
        match items.first() {
            Some(first) => at = first,
            None => break,
        }
    }
    shape
}

/// Whether `v` lies within Stan's `bounds`; otherwise why not, worded for an error.
fn within<T: PartialOrd + Display>(v: T, bounds: &impl RangeBounds<T>) -> Result<(), String> {
    use std::cmp::Ordering::{Equal, Greater, Less};
    // A NaN compares as `None`: outside every bound, as Stan's checks find it.
    let declared = "declared in the data block";
    match bounds.start_bound() {
        Bound::Included(lo) if !matches!(v.partial_cmp(lo), Some(Greater | Equal)) => {
            return Err(format!("is below the lower bound {lo} {declared}"));
        }
        Bound::Excluded(lo) if v.partial_cmp(lo) != Some(Greater) => {
            return Err(format!("must be above {lo}, as the data block declares"));
        }
        _ => {}
    }
    match bounds.end_bound() {
        Bound::Included(hi) if !matches!(v.partial_cmp(hi), Some(Less | Equal)) => {
            Err(format!("is above the upper bound {hi} {declared}"))
        }
        Bound::Excluded(hi) if v.partial_cmp(hi) != Some(Less) => {
            Err(format!("must be below {hi}, as the data block declares"))
        }
        _ => Ok(()),
    }
}

/// Stan's 1-based element index: `[3]`, `[2,1]`.
fn element(index: &[usize]) -> String {
    let parts: Vec<String> = index.iter().map(|i| (i + 1).to_string()).collect();
    format!("[{}]", parts.join(","))
}

/// The multi-index of flat row-major position `flat` in `shape`.
fn unflatten(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut index = vec![0; shape.len()];
    for (axis, &len) in shape.iter().enumerate().rev() {
        index[axis] = flat % len.max(1);
        flat /= len.max(1);
    }
    index
}

/// Real values read from a field, with its shape: constraints are checked on them by name.
#[derive(Clone, Debug)]
pub struct Reals<'a> {
    data: &'a StanData,
    field: &'a str,
    shape: Vec<usize>,
    values: Vec<f64>,
}

impl<'a> Reals<'a> {
    /// The declared shape (outermost first).
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The values, row-major.
    pub fn values(&self) -> &[f64] {
        &self.values
    }

    /// The values, row-major.
    pub fn into_vec(self) -> Vec<f64> {
        self.values
    }

    /// `<lower=bound>`: every value `>= bound`.
    pub fn lower(self, bound: f64) -> Result<Self, StanDataError> {
        self.check(|v| v >= bound, || format!("is below the lower bound {bound} declared in the data block"))
    }

    /// `<upper=bound>`: every value `<= bound`.
    pub fn upper(self, bound: f64) -> Result<Self, StanDataError> {
        self.check(|v| v <= bound, || format!("is above the upper bound {bound} declared in the data block"))
    }

    /// Every value within Stan's inclusive `bounds`, written as a Rust range (`0.0..=1.0` is
    /// `<lower=0, upper=1>`), as [`StanData::real_in`] for a scalar.
    pub fn within(self, bounds: impl RangeBounds<f64>) -> Result<Self, StanDataError> {
        self.check(
            |v| within(v, &bounds).is_ok(),
            || format!("is outside the bounds {} declared in the data block", range_text(&bounds)),
        )
    }

    /// Every value `> 0`, for the reason given (a log the model takes, a scale it divides by):
    /// stricter than `<lower=0>`, which allows 0.
    pub fn positive(self, why: &str) -> Result<Self, StanDataError> {
        self.check(|v| v > 0.0, || format!("must be > 0: {why}"))
    }

    /// Every value finite (`inf` and `NaN`, which Stan's JSON allows as strings, are refused).
    pub fn finite(self) -> Result<Self, StanDataError> {
        self.check(f64::is_finite, || "must be finite".to_string())
    }

    fn check(self, ok: impl Fn(f64) -> bool, why: impl Fn() -> String) -> Result<Self, StanDataError> {
        match self.values.iter().position(|&v| !ok(v)) {
            None => Ok(self),
            Some(i) => Err(self.data.invalid(
                self.field,
                (!self.shape.is_empty()).then(|| element(&unflatten(i, &self.shape))),
                format!("value {} {}", self.values[i], why()),
            )),
        }
    }

    /// The values as an `f32` data tensor `[1, size]` (every particle shares it), flattened
    /// row-major.
    pub fn tensor(&self, device: &Device) -> Tensor<2> {
        let values: Vec<f32> = self.values.iter().map(|&v| v as f32).collect();
        let n = values.len();
        Tensor::<1>::from_floats(values.as_slice(), device).reshape([1, n])
    }

    /// A matrix field's values as an `f32` tensor `[rows, cols]` (for a product `X beta`).
    pub fn matrix_tensor(&self, device: &Device) -> Result<Tensor<2>, StanDataError> {
        let [rows, cols] = self.shape[..] else {
            return Err(self.data.invalid(self.field, None, format!("is not a matrix: shape {:?}", self.shape)));
        };
        let values: Vec<f32> = self.values.iter().map(|&v| v as f32).collect();
        Ok(Tensor::<1>::from_floats(values.as_slice(), device).reshape([rows, cols]))
    }
}

/// Int values read from a field, with its shape: constraints are checked on them by name.
#[derive(Clone, Debug)]
pub struct Ints<'a> {
    data: &'a StanData,
    field: &'a str,
    shape: Vec<usize>,
    values: Vec<i64>,
}

impl<'a> Ints<'a> {
    /// The declared shape (outermost first).
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The values, row-major.
    pub fn values(&self) -> &[i64] {
        &self.values
    }

    /// The values, row-major.
    pub fn into_vec(self) -> Vec<i64> {
        self.values
    }

    /// `<lower=bound>`.
    pub fn lower(self, bound: i64) -> Result<Self, StanDataError> {
        self.check(|v| v >= bound, &format!("is below the lower bound {bound} declared in the data block"))
    }

    /// `<upper=bound>`.
    pub fn upper(self, bound: i64) -> Result<Self, StanDataError> {
        self.check(|v| v <= bound, &format!("is above the upper bound {bound} declared in the data block"))
    }

    /// Every value within Stan's inclusive `bounds`, written as a Rust range (`0..=1` is
    /// `<lower=0, upper=1>`), as [`StanData::int_in`] for a scalar.
    pub fn within(self, bounds: impl RangeBounds<i64>) -> Result<Self, StanDataError> {
        let why = format!("is outside the bounds {} declared in the data block", range_text(&bounds));
        self.check(|v| within(v, &bounds).is_ok(), &why)
    }

    /// `<upper=K>` where `K` is the `int` field `field` (an index into a group of size `K`).
    pub fn upper_field(self, field: &str) -> Result<Self, StanDataError> {
        let bound = self.data.int(field)?;
        self.check(|v| v <= bound, &format!("is above the upper bound {field} = {bound} declared in the data block"))
    }

    fn check(self, ok: impl Fn(i64) -> bool, why: &str) -> Result<Self, StanDataError> {
        match self.values.iter().position(|&v| !ok(v)) {
            None => Ok(self),
            Some(i) => Err(self.data.invalid(
                self.field,
                (!self.shape.is_empty()).then(|| element(&unflatten(i, &self.shape))),
                format!("value {} {why}", self.values[i]),
            )),
        }
    }

    /// Stan's 1-based indices as 0-based `usize`s, each checked to lie in `1..=groups` (an
    /// index array such as `jj` in `theta[jj]`).
    pub fn indices(&self, groups: usize) -> Result<Vec<usize>, StanDataError> {
        self.values
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                if v >= 1 && (v as u64) <= groups as u64 {
                    Ok((v - 1) as usize)
                } else {
                    Err(self.data.invalid(
                        self.field,
                        Some(element(&unflatten(i, &self.shape))),
                        format!("index {v} is outside 1..={groups}"),
                    ))
                }
            })
            .collect()
    }

    /// Stan's 1-based indices into a group of size `groups` as a 0-based index tensor `[size]`,
    /// for a one-call gather over every particle (`alpha.select(1, jj)` is Stan's `alpha[jj]`).
    pub fn index_tensor(&self, groups: usize, device: &Device) -> Result<Tensor<1, Int>, StanDataError> {
        let indices: Vec<i64> = self.indices(groups)?.into_iter().map(|i| i as i64).collect();
        let len = indices.len();
        Ok(Tensor::from_data(TensorData::new(indices, [len]), device))
    }

    /// The values as an `f32` data tensor `[1, size]` (counts in a likelihood).
    pub fn tensor(&self, device: &Device) -> Tensor<2> {
        let values: Vec<f32> = self.values.iter().map(|&v| v as f32).collect();
        let n = values.len();
        Tensor::<1>::from_floats(values.as_slice(), device).reshape([1, n])
    }
}

/// Bounds as Stan declares them: `<lower=0, upper=1>`.
fn range_text<T: Display>(bounds: &impl RangeBounds<T>) -> String {
    let lower = match bounds.start_bound() {
        Bound::Included(lo) => Some(format!("lower={lo}")),
        Bound::Excluded(lo) => Some(format!("lower={lo} (excluded)")),
        Bound::Unbounded => None,
    };
    let upper = match bounds.end_bound() {
        Bound::Included(hi) => Some(format!("upper={hi}")),
        Bound::Excluded(hi) => Some(format!("upper={hi} (excluded)")),
        Bound::Unbounded => None,
    };
    format!("<{}>", lower.into_iter().chain(upper).collect::<Vec<_>>().join(", "))
}

/// An integer, from an integer literal or a float with no fractional part (some writers emit
/// `3.0` for an int). The readers then hold it to Stan's 32-bit `int` ([`INT_RANGE`]).
fn as_int(value: &Value) -> Option<i64> {
    value.as_i64().or_else(|| value.as_f64().filter(|v| v.fract() == 0.0 && v.abs() < 9.0e15).map(|v| v as i64))
}

/// Stan's `int` is 32-bit (CmdStan refuses a larger value in a data file; burn's int tensors,
/// which index arrays become, are 32-bit on some backends).
const INT_RANGE: std::ops::RangeInclusive<i64> = (i32::MIN as i64)..=(i32::MAX as i64);

/// Why an int is out of [`INT_RANGE`].
fn int_range_reason(v: i64) -> String {
    format!("value {v} is outside Stan's 32-bit int range {}..={}", i32::MIN, i32::MAX)
}

/// A real: a number, or one of the strings Stan's JSON uses for non-finite values.
fn as_real(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => match s.as_str() {
            "NaN" => Some(f64::NAN),
            "Inf" | "Infinity" | "inf" => Some(f64::INFINITY),
            "-Inf" | "-Infinity" | "-inf" => Some(f64::NEG_INFINITY),
            _ => None,
        },
        _ => None,
    }
}

/// A value for an error message, cut short.
fn show(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > 40 { format!("{}...", text.chars().take(40).collect::<String>()) } else { text }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn data(text: &str) -> StanData {
        StanData::parse(text, "d.json").unwrap()
    }

    #[test]
    fn reads_every_shape_with_sizes_by_field() {
        let d = data(
            r#"{"N": 3, "K": 2, "y": [1, 2.5, -3], "X": [[1,2],[3,4],[5,6]], "n": [4, 0, 7],
                       "z": [[[1],[2]],[[3],[4]],[[5],[6]]], "one": 4.5, "e": []}"#,
        );
        assert_eq!(d.size("N").unwrap(), 3);
        assert_eq!(d.vector("y", "N").unwrap().values(), &[1.0, 2.5, -3.0]);
        assert_eq!(d.matrix("X", "N", "K").unwrap().values(), &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(d.ints("n", 3).unwrap().values(), &[4, 0, 7]);
        let z = d.reals("z", &["N".into(), "K".into(), 1.into()]).unwrap();
        assert_eq!(z.shape(), &[3, 2, 1]);
        assert_eq!(z.values(), &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        // A one-element array may be a bare value; an empty one is [] whatever its rank.
        assert_eq!(d.vector("one", 1).unwrap().values(), &[4.5]);
        assert!(d.matrix("e", 0, 5).unwrap().values().is_empty());
    }

    #[test]
    fn errors_name_field_element_and_rule() {
        let d = data(
            r#"{"N": 3, "y": [1, 2], "s": [1, -1, 2], "k": [1, 2.5, 3], "jj": [1, 4, 2], "J": 3,
                       "X": [[1,2],[3]], "neg": -1}"#,
        );
        let e = d.vector("y", "N").unwrap_err().to_string();
        assert!(e.contains("d.json") && e.contains("`y`") && e.contains("has 2 values but N = 3"), "{e}");
        assert!(d.vector("y", 3).unwrap_err().to_string().contains("the array has 2 values, declared 3"));
        let e = d.vector("s", "N").unwrap().lower(0.0).unwrap_err().to_string();
        assert!(e.contains("`s`, element [2]") && e.contains("value -1 is below the lower bound 0"), "{e}");
        let e = d.ints("k", "N").unwrap_err().to_string();
        assert!(e.contains("`k`, element [2]") && e.contains("expected an integer, found 2.5"), "{e}");
        let e = d.ints("jj", "N").unwrap().upper_field("J").unwrap_err().to_string();
        assert!(e.contains("element [2]") && e.contains("upper bound J = 3"), "{e}");
        let e = d.matrix("X", 2, 2).unwrap_err().to_string();
        assert!(e.contains("row 2 has 1 values, declared 2"), "{e}");
        let e = d.vector("missing", 2).unwrap_err();
        assert_eq!(e.field(), Some("missing"));
        let e = d.vector("y", "M").unwrap_err().to_string();
        assert!(e.contains("size field `M` is missing"), "{e}");
        let e = d.size("neg").unwrap_err().to_string();
        assert!(e.contains("`neg`") && e.contains("below the lower bound 0"), "{e}");
        assert!(d.ints("jj", 3).unwrap().indices(3).unwrap_err().to_string().contains("index 4 is outside 1..=3"));
        assert_eq!(d.ints("jj", 3).unwrap().indices(4).unwrap(), vec![0, 3, 1]);
    }

    #[test]
    fn scalar_bounds_name_the_field_and_the_rule() {
        let big = data(r#"{"M": 3000000000, "m": [1, -2147483649]}"#);
        let e = big.int("M").unwrap_err().to_string();
        assert!(e.contains("`M`: value 3000000000 is outside Stan's 32-bit int range"), "{e}");
        let e = big.ints("m", 2).unwrap_err().to_string();
        assert!(e.contains("`m`, element [2]: value -2147483649 is outside"), "{e}");
        let d = data(r#"{"K": 0, "J": 3, "r_e": 0, "p": 1.5, "nan": "NaN", "k": [0, 1, 2]}"#);
        let e = d.int_in("K", 1..).unwrap_err().to_string();
        assert!(e.contains("field `K`: value 0 is below the lower bound 1 declared in the data block"), "{e}");
        assert_eq!(d.int_in("J", 1..=3).unwrap(), 3);
        let e = d.int_in("J", ..=2).unwrap_err().to_string();
        assert!(e.contains("`J`: value 3 is above the upper bound 2"), "{e}");
        assert_eq!(d.size_in("J", 1..).unwrap(), 3);
        assert!(d.size_in("K", 1..).unwrap_err().to_string().contains("`K`: value 0 is below the lower bound 1"));
        assert_eq!(d.real_in("r_e", 0.0..).unwrap(), 0.0);
        let e = d.real_in("p", 0.0..=1.0).unwrap_err().to_string();
        assert!(e.contains("`p`: value 1.5 is above the upper bound 1"), "{e}");
        // NaN passes no bound, as in Stan.
        assert!(d.real_in("nan", 0.0..).unwrap_err().to_string().contains("`nan`"));
        assert!(d.real_in("nan", ..).unwrap().is_nan());
        let e = d.ints("k", 3).unwrap().within(0..=1).unwrap_err().to_string();
        assert!(e.contains("`k`, element [3]: value 2 is outside the bounds <lower=0, upper=1>"), "{e}");
        let e = d.vector("k", 3).unwrap().within(1.0..).unwrap_err().to_string();
        assert!(e.contains("`k`, element [1]: value 0 is outside the bounds <lower=1>"), "{e}");
    }

    #[test]
    fn a_constructor_error_names_the_data_field_and_its_element() {
        use parvi_model::dist::{BinomialLogit, Exponential, Normal, PoissonLog};
        let device = parvi_model::BackendKind::Flex.device().unwrap();
        let d = data(
            r#"{"N": 4, "r_e": 0, "y": [3, 0, -1, 2], "K": [5, -1, 1, 5], "ts": [1, 2, 3, 4, 5, 5, 7],
                "Y": [[1, 2], [3, -4]], "s": 0}"#,
        );
        // A zero rate, and a zero scale: the data field, not the distribution's argument alone.
        let r_e = d.real_in("r_e", 0.0..).unwrap();
        let e = d.check("r_e", Exponential::<2>::new(r_e)).unwrap_err().to_string();
        assert!(e.contains("d.json: field `r_e`: `rate` of Exponential: must be finite and > 0, got 0"), "{e}");
        let e = d.check("s", Normal::<2>::new(0.0, d.real("s").unwrap())).unwrap_err();
        assert_eq!(e.field(), Some("s"));
        assert!(e.to_string().contains("`scale` of Normal"), "{e}");
        // A negative count, by its 1-based element.
        let y = d.ints("y", "N").unwrap().tensor(&device);
        let e = d.check("y", PoissonLog::new(y.clone())).unwrap_err().to_string();
        assert!(
            e.contains("field `y`, element [3]: `counts` of PoissonLog: must be whole numbers >= 0, got -1"),
            "{e}"
        );
        // Two fields into one constructor: each argument to its own field.
        let k = d.ints("K", "N").unwrap().tensor(&device);
        let y_ok = Tensor::<1>::from_floats([3.0f32, 0.0, 2.0, 2.0], &device).reshape([1, 4]);
        let e = d.check_args(&[("counts", "y"), ("trials", "K")], BinomialLogit::new(y_ok, k)).unwrap_err();
        assert!(e.to_string().contains("field `K`, element [2]: `trials` of BinomialLogit"), "{e}");
        let e = d.check_args(&[("trials", "K")], PoissonLog::new(y)).unwrap_err();
        assert!(matches!(e, StanDataError::Built { .. }) && e.to_string().contains("`counts` of PoissonLog"), "{e}");
        // A matrix field: the element by row and column.
        let m = d.matrix("Y", 2, 2).unwrap().matrix_tensor(&device).unwrap();
        let e = d.check("Y", PoissonLog::new(m)).unwrap_err().to_string();
        assert!(e.contains("field `Y`, element [2,2]"), "{e}");
        // A repeated output time: Stan's 1-based element, where the DSL's slice index is 5.
        let ts = d.vector("ts", 7).unwrap();
        let e = d.check("ts", parvi_model::ode::check_times(0.0, ts.values())).unwrap_err();
        let e = e.to_string();
        assert!(e.contains("field `ts`, element [6]") && e.contains("strictly increasing"), "{e}");
        assert!(!e.contains("ts[5]"), "{e}");
    }

    #[test]
    fn bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, [b'{', 0xff, b'}']).unwrap();
        assert!(matches!(StanData::read(&bad), Err(StanDataError::NotUtf8 { offset: 1, .. })));
        std::fs::write(&bad, r#"{"N": 3, "y": [1, 2"#).unwrap();
        let e = StanData::read(&bad).unwrap_err().to_string();
        assert!(e.contains("bad.json") && e.contains("not valid JSON (line 1"), "{e}");
        std::fs::write(&bad, "[1, 2]").unwrap();
        assert!(StanData::read(&bad).unwrap_err().to_string().contains("expected a JSON object"));
        let e = StanData::read(dir.path().join("absent.json")).unwrap_err().to_string();
        assert!(e.contains("absent.json") && e.contains("cannot read"), "{e}");
    }
}
