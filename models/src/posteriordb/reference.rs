//! The reference draws of a posterior: 10 chains of 1000 NUTS draws, on the constrained scale.

use std::path::Path;

use serde_json::Value;

use parvi_model::program::StanModel as _;

use super::data::read_json;
use super::{PosteriorDbError, PosteriorDbModel};

/// Reference draws as a `[chains * draws, params]` row-major matrix (chain after chain), in
/// `f64`, with columns in [`super::PosteriorDbModel::compared_names`] order (those of the
/// model's reported and generated quantities that the reference holds: posteriordb leaves some
/// out, e.g. eight schools' `theta_trans`).
#[derive(Clone, Debug, PartialEq)]
pub struct ReferenceDraws {
    posterior: String,
    names: Vec<String>,
    /// For each column, its index among the model's reported quantities.
    columns: Vec<usize>,
    chains: usize,
    draws_per_chain: usize,
    values: Vec<f64>,
}

impl ReferenceDraws {
    /// Reads the reference draws of posterior `name` (see [`super::load`]) in the suite folder
    /// `dir`; the model is built on the flex device to learn its reported names.
    pub fn load(name: &str, dir: &Path) -> Result<Self, PosteriorDbError> {
        let device = parvi_model::BackendKind::Flex.device().map_err(super::model_error(name))?;
        Self::for_model(&super::load(name, dir, &device)?)
    }

    /// Reads `reference_draws.json` in the model's folder, with the model's reported names and
    /// its generated quantities ([`PosteriorDbModel::compared_names`]: the wider suite's
    /// references hold Stan's generated quantities, surgical's `pop_mean`): a column past
    /// [`PosteriorDbModel::param_names`] indexes [`PosteriorDbModel::compared`]'s matrix.
    pub fn for_model(model: &PosteriorDbModel) -> Result<Self, PosteriorDbError> {
        Self::from_file(model.name(), &model.folder().join("reference_draws.json"), &model.compared_names())
    }

    /// Reads a reference-draws file (a JSON list of chains, each an object from parameter name to
    /// its draws) of posterior `name` whose model reports `names`. The columns are the names the
    /// first chain holds, in `names` order; every chain holds exactly those, with the same number
    /// of draws, and a parameter the model does not report is an error naming it.
    pub fn from_file(name: &str, file: &Path, names: &[String]) -> Result<Self, PosteriorDbError> {
        let posterior = name.to_string();
        let invalid = |field: &str, reason: String| PosteriorDbError::InvalidField {
            posterior: posterior.to_string(),
            file: file.to_path_buf(),
            field: field.to_string(),
            reason,
        };
        let Value::Array(chains) = read_json(&posterior, file)? else {
            return Err(invalid("(top level)", "expected a JSON list of chains".into()));
        };
        if chains.is_empty() {
            return Err(invalid("(top level)", "the list of chains is empty".into()));
        }
        let held =
            |chain: &Value| -> Vec<usize> { (0..names.len()).filter(|&j| chain.get(&names[j]).is_some()).collect() };
        let columns = held(&chains[0]);
        if columns.is_empty() {
            return Err(invalid("chain 1", format!("holds none of the model's parameters ({})", names.join(", "))));
        }
        let all_names = names;
        let names: Vec<String> = columns.iter().map(|&j| all_names[j].clone()).collect();
        let mut draws_per_chain = None;
        let mut values = Vec::new();
        for (c, chain) in chains.iter().enumerate() {
            let chain_field = format!("chain {}", c + 1);
            let Value::Object(chain) = chain else {
                return Err(invalid(&chain_field, "expected an object from parameter name to draws".into()));
            };
            if let Some(extra) = chain.keys().find(|k| !all_names.contains(k)) {
                return Err(invalid(
                    extra,
                    format!(
                        "{chain_field} has parameter `{extra}`, which the model does not report ({})",
                        names.join(", ")
                    ),
                ));
            }
            let mut columns = Vec::with_capacity(names.len());
            for name in &names {
                let Some(Value::Array(draws)) = chain.get(name) else {
                    return Err(invalid(name, format!("{chain_field} lacks a list of draws for `{name}`")));
                };
                let expected = *draws_per_chain.get_or_insert(draws.len());
                if draws.len() != expected || expected == 0 {
                    return Err(invalid(
                        name,
                        format!(
                            "{chain_field} has {} draws, but the first parameter of chain 1 has {expected}",
                            draws.len()
                        ),
                    ));
                }
                let column = draws
                    .iter()
                    .enumerate()
                    .map(|(i, v)| {
                        v.as_f64().filter(|v| v.is_finite()).ok_or_else(|| {
                            invalid(name, format!("{chain_field}, draw {}: expected a finite number, found {v}", i + 1))
                        })
                    })
                    .collect::<Result<Vec<f64>, _>>()?;
                columns.push(column);
            }
            let draws = draws_per_chain.unwrap_or(0);
            values.extend((0..draws).flat_map(|i| columns.iter().map(move |col| col[i])));
        }
        Ok(Self {
            posterior,
            names,
            columns,
            chains: chains.len(),
            draws_per_chain: draws_per_chain.unwrap_or(0),
            values,
        })
    }

    /// The posterior's name.
    pub fn posterior(&self) -> &str {
        &self.posterior
    }

    /// For each column, its index among the model's reported quantities.
    pub fn columns(&self) -> &[usize] {
        &self.columns
    }

    /// The reference's columns of a row-major `[rows, width]` matrix of the model's reported
    /// quantities.
    pub fn select(&self, reported: &[f64], width: usize) -> Vec<f64> {
        select_columns(reported, width, &self.columns)
    }

    /// Column names, in the model's reported order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Number of chains.
    pub fn chains(&self) -> usize {
        self.chains
    }

    /// Draws in each chain.
    pub fn draws_per_chain(&self) -> usize {
        self.draws_per_chain
    }

    /// Number of rows (all draws of all chains).
    pub fn rows(&self) -> usize {
        self.chains * self.draws_per_chain
    }

    /// Number of columns (parameters).
    pub fn params(&self) -> usize {
        self.names.len()
    }

    /// All draws, row-major `[rows, params]`, chain after chain.
    pub fn values(&self) -> &[f64] {
        &self.values
    }

    /// The draws of chain `c` (from 0), row-major `[draws_per_chain, params]`.
    pub fn chain(&self, c: usize) -> &[f64] {
        let width = self.draws_per_chain * self.params();
        &self.values[c * width..(c + 1) * width]
    }

    /// Column `j`: every draw of one parameter.
    pub fn column(&self, j: usize) -> Vec<f64> {
        self.values.iter().skip(j).step_by(self.params()).copied().collect()
    }

    /// The mean of every parameter.
    pub fn mean(&self) -> Vec<f64> {
        (0..self.params()).map(|j| self.column(j).iter().sum::<f64>() / self.rows() as f64).collect()
    }

    /// The standard deviation of every parameter (divisor `rows - 1`).
    pub fn sd(&self) -> Vec<f64> {
        let mean = self.mean();
        (0..self.params())
            .map(|j| {
                let ss: f64 = self.column(j).iter().map(|v| (v - mean[j]).powi(2)).sum();
                (ss / (self.rows().max(2) - 1) as f64).sqrt()
            })
            .collect()
    }
}

/// Reference moments where a release holds no draws (posteriordb's `accel_gp`): the mean and sd of
/// every parameter from `reference_moments.json`, in the model's reported order.
#[derive(Clone, Debug, PartialEq)]
pub struct ReferenceMoments {
    names: Vec<String>,
    columns: Vec<usize>,
    mean: Vec<f64>,
    sd: Vec<f64>,
}

impl ReferenceMoments {
    /// Reads `reference_moments.json` (`{"parameters": {name: {"mean": m, "sd": s}}}`) in the
    /// model's folder; its names are those of [`PosteriorDbModel::compared_names`] (reported,
    /// then generated quantities).
    pub fn for_model(model: &PosteriorDbModel) -> Result<Self, PosteriorDbError> {
        let file = model.folder().join("reference_moments.json");
        let names = model.compared_names();
        let invalid = |field: &str, reason: String| PosteriorDbError::InvalidField {
            posterior: model.name().to_string(),
            file: file.clone(),
            field: field.to_string(),
            reason,
        };
        let json = read_json(model.name(), &file)?;
        let Some(Value::Object(params)) = json.get("parameters") else {
            return Err(invalid("parameters", "expected an object from parameter name to its mean and sd".into()));
        };
        let generated = model.generated_names();
        if let Some(extra) = params.keys().find(|k| !names.contains(k) && !generated.contains(k)) {
            return Err(invalid(extra, format!("the model does not report `{extra}` ({})", names.join(", "))));
        }
        let (mut out_names, mut columns, mut mean, mut sd) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (j, name) in names.iter().enumerate() {
            let Some(entry) = params.get(name) else { continue };
            let number = |key: &str| {
                entry.get(key).and_then(Value::as_f64).filter(|v| v.is_finite()).ok_or_else(|| {
                    invalid(name, format!("`{key}` must be a finite number, found {:?}", entry.get(key)))
                })
            };
            let s = number("sd")?;
            if s <= 0.0 {
                return Err(invalid(name, format!("`sd` must be > 0, found {s}")));
            }
            mean.push(number("mean")?);
            sd.push(s);
            out_names.push(name.clone());
            columns.push(j);
        }
        if columns.is_empty() {
            return Err(invalid("parameters", "holds none of the model's parameters".into()));
        }
        Ok(Self { names: out_names, columns, mean, sd })
    }

    /// Column names, in the model's reported order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// For each column, its index among the model's reported quantities.
    pub fn columns(&self) -> &[usize] {
        &self.columns
    }

    /// The reference's columns of a row-major `[rows, width]` matrix of the model's reported
    /// quantities.
    pub fn select(&self, reported: &[f64], width: usize) -> Vec<f64> {
        select_columns(reported, width, &self.columns)
    }

    /// The reference mean of every column.
    pub fn mean(&self) -> &[f64] {
        &self.mean
    }

    /// The reference standard deviation of every column.
    pub fn sd(&self) -> &[f64] {
        &self.sd
    }
}

/// `columns` of every row of a row-major `[rows, width]` matrix, row-major.
fn select_columns(values: &[f64], width: usize, columns: &[usize]) -> Vec<f64> {
    values.chunks_exact(width.max(1)).flat_map(|row| columns.iter().map(|&j| row[j])).collect()
}
