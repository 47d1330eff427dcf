//! The posteriordb suite as ready-made models: ten posteriors from the Stan developers' database,
//! each written in the DSL as its Stan program's log density (up to a constant) on Stan's
//! unconstrained coordinates, with the log-Jacobian of every constraint as Stan adds it.
//!
//! The suite folder holds one subfolder per posterior (`model.stan`, `data.json`,
//! `reference_draws.json`, ...). [`load`] reads a posterior's data, checks it as Stan's data
//! block would, and puts it on a device; [`ReferenceDraws::load`] reads the reference NUTS draws
//! in the order of [`PosteriorDbModel::param_names`]; [`compare`] scores an approximation
//! against them.

pub mod compare;
mod data;
mod linear;
mod reference;

mod ark;
mod diamonds;
mod earnings;
mod eight_schools;
mod garch;
mod gp_pois_regr;
mod kidiq;
mod low_dim_gauss_mix;
mod mesquite;
mod sblrc;

use std::path::{Path, PathBuf};

use burn::tensor::{Device, Tensor};
use parvi_model::{LogDensity, Minibatch, ModelError, ParamLayout};
use thiserror::Error;

use data::Data;
pub use reference::ReferenceDraws;

/// The full names of the ten posteriors (their folder names in the suite).
pub const NAMES: &[&str] = &[
    "eight_schools-eight_schools_noncentered",
    "kidiq-kidscore_momiq",
    "earnings-logearn_interaction",
    "mesquite-logmesquite_logvas",
    "sblrc-blr",
    "arK-arK",
    "garch-garch11",
    "low_dim_gauss_mix-low_dim_gauss_mix",
    "gp_pois_regr-gp_pois_regr",
    "diamonds-diamonds",
];

/// Short names accepted by [`load`], in the order of [`NAMES`].
pub const ALIASES: &[&str] = &[
    "eight_schools",
    "kidiq",
    "earnings",
    "mesquite",
    "sblrc",
    "arK",
    "garch",
    "low_dim_gauss_mix",
    "gp_pois_regr",
    "diamonds",
];

/// What went wrong reading a posterior: each error names the posterior, and where a file is at
/// fault, the file, the field and the reason.
#[derive(Debug, Error)]
pub enum PosteriorDbError {
    /// The name is neither a full name nor an alias.
    #[error("unknown posterior `{name}`: known are {known}")]
    UnknownPosterior {
        /// The name asked for.
        name: String,
        /// The known full names with their aliases, comma-separated.
        known: String,
    },
    /// A file could not be read.
    #[error("posterior `{posterior}`: cannot read {}: {error}", file.display())]
    Io {
        /// The posterior's full name.
        posterior: String,
        /// The file.
        file: PathBuf,
        /// The operating system's reason.
        error: std::io::Error,
    },
    /// A file is not valid JSON.
    #[error("posterior `{posterior}`: {} is not valid JSON (line {line}, column {column}): {reason}", file.display())]
    Json {
        /// The posterior's full name.
        posterior: String,
        /// The file.
        file: PathBuf,
        /// Line of the syntax error (from 1).
        line: usize,
        /// Column of the syntax error (from 1).
        column: usize,
        /// serde_json's message.
        reason: String,
    },
    /// A field the model needs is absent.
    #[error("posterior `{posterior}`: {}: field `{field}` is missing", file.display())]
    MissingField {
        /// The posterior's full name.
        posterior: String,
        /// The file.
        file: PathBuf,
        /// The missing field.
        field: String,
    },
    /// A field has the wrong type, the wrong length, or a value outside its constraint.
    #[error("posterior `{posterior}`: {}: field `{field}`: {reason}", file.display())]
    InvalidField {
        /// The posterior's full name.
        posterior: String,
        /// The file.
        file: PathBuf,
        /// The field at fault (a data field, or a parameter of the reference draws).
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The parameter layout could not be built (a size of zero, for example).
    #[error("posterior `{posterior}`: {error}")]
    Model {
        /// The posterior's full name.
        posterior: String,
        /// The layout's error.
        error: ModelError,
    },
}

/// The full name of a posterior from its full name or alias (ASCII case ignored).
pub fn full_name(name: &str) -> Result<&'static str, PosteriorDbError> {
    NAMES
        .iter()
        .zip(ALIASES)
        .find(|(full, alias)| full.eq_ignore_ascii_case(name) || alias.eq_ignore_ascii_case(name))
        .map(|(full, _)| *full)
        .ok_or_else(|| PosteriorDbError::UnknownPosterior {
            name: name.to_string(),
            known: NAMES.iter().zip(ALIASES).map(|(f, a)| format!("{f} ({a})")).collect::<Vec<_>>().join(", "),
        })
}

/// Loads posterior `name` (full name or alias) from the suite folder `dir` (the folder holding
/// the ten subfolders), with its data tensors on `device`.
pub fn load(name: &str, dir: &Path, device: &Device) -> Result<PosteriorDbModel, PosteriorDbError> {
    let name = full_name(name)?;
    let data = Data::read(name, dir)?;
    let names = param_names(name, &data)?;
    let target = build(name, &data, device)?;
    debug_assert_eq!(names.len(), target.reported_dim());
    Ok(PosteriorDbModel { name, target, names })
}

/// The reported parameter names of a posterior, from the sizes in its data.
fn param_names(name: &'static str, data: &Data) -> Result<Vec<String>, PosteriorDbError> {
    match name {
        "eight_schools-eight_schools_noncentered" => eight_schools::param_names(data),
        "kidiq-kidscore_momiq" => Ok(kidiq::param_names()),
        "earnings-logearn_interaction" => Ok(earnings::param_names()),
        "mesquite-logmesquite_logvas" => Ok(mesquite::param_names()),
        "sblrc-blr" => sblrc::param_names(data),
        "arK-arK" => ark::param_names(data),
        "garch-garch11" => Ok(garch::param_names()),
        "low_dim_gauss_mix-low_dim_gauss_mix" => Ok(low_dim_gauss_mix::param_names()),
        "gp_pois_regr-gp_pois_regr" => gp_pois_regr::param_names(data),
        "diamonds-diamonds" => diamonds::param_names(data),
        _ => Err(unknown(name)),
    }
}

fn build(name: &'static str, data: &Data, device: &Device) -> Result<Box<dyn Target>, PosteriorDbError> {
    let target: Box<dyn Target> = match name {
        "eight_schools-eight_schools_noncentered" => Box::new(eight_schools::EightSchools::new(data, device)?),
        "kidiq-kidscore_momiq" => Box::new(kidiq::new(data, device)?),
        "earnings-logearn_interaction" => Box::new(earnings::new(data, device)?),
        "mesquite-logmesquite_logvas" => Box::new(mesquite::new(data, device)?),
        "sblrc-blr" => Box::new(sblrc::new(data, device)?),
        "arK-arK" => Box::new(ark::new(data, device)?),
        "garch-garch11" => Box::new(garch::Garch::new(data, device)?),
        "low_dim_gauss_mix-low_dim_gauss_mix" => Box::new(low_dim_gauss_mix::GaussMix::new(data, device)?),
        "gp_pois_regr-gp_pois_regr" => Box::new(gp_pois_regr::GpPoisson::new(data, device)?),
        "diamonds-diamonds" => Box::new(diamonds::Diamonds::new(data, device)?),
        _ => return Err(unknown(name)),
    };
    target.check().map_err(model_error(name))?;
    Ok(target)
}

fn unknown(name: &str) -> PosteriorDbError {
    PosteriorDbError::UnknownPosterior { name: name.to_string(), known: NAMES.join(", ") }
}

/// What each posterior's module provides beyond its log density.
trait Target: LogDensity {
    /// The blocks of the unconstrained particle, in Stan's parameter order.
    fn layout(&self) -> &ParamLayout;

    /// Unconstrained particles `[n, dim]` to the reported quantities `[n, p]`.
    fn reported(&self, particles: Tensor<2>) -> Tensor<2> {
        self.layout().constrain(particles)
    }

    /// Number of reported quantities.
    fn reported_dim(&self) -> usize {
        self.layout().dim()
    }

    /// How this build of the model departs from the Stan program, if it does.
    fn deviation(&self) -> Option<&'static str> {
        None
    }

    /// A consistency check run once after construction.
    fn check(&self) -> Result<(), ModelError> {
        if self.dim() == self.layout().dim() {
            Ok(())
        } else {
            Err(ModelError::DimensionMismatch { expected: self.layout().dim(), got: self.dim() })
        }
    }
}

/// A loaded posterior: its model as a [`LogDensity`] on unconstrained particles, its layout, and
/// the map to the quantities the reference draws report.
pub struct PosteriorDbModel {
    name: &'static str,
    target: Box<dyn Target>,
    names: Vec<String>,
}

impl std::fmt::Debug for PosteriorDbModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PosteriorDbModel").field("name", &self.name).field("layout", self.target.layout()).finish()
    }
}

impl PosteriorDbModel {
    /// The full name (`eight_schools-eight_schools_noncentered`).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The short alias (`eight_schools`).
    pub fn alias(&self) -> &'static str {
        NAMES.iter().position(|n| *n == self.name).map_or(self.name, |i| ALIASES[i])
    }

    /// The blocks of the unconstrained particle, in the Stan program's parameter order. Where
    /// Stan reports a transformed quantity (eight_schools' `theta`, gp_pois_regr's `f`, garch's
    /// `beta1`) the block is the one sampled (`theta_trans`, `f_tilde`, `beta1_frac`).
    pub fn layout(&self) -> &ParamLayout {
        self.target.layout()
    }

    /// The reported quantities' names in the reference draws' naming and order (`theta[1]`,
    /// ..., `mu`, `tau`).
    pub fn param_names(&self) -> Vec<String> {
        self.names.clone()
    }

    /// Unconstrained particles `[n, dim]` to the reported quantities `[n, p]`, in
    /// [`PosteriorDbModel::param_names`] order, on the constrained scale.
    pub fn reported(&self, particles: Tensor<2>) -> Tensor<2> {
        self.target.reported(particles)
    }

    /// How this build departs from the Stan program, if it does (gp_pois_regr on a device
    /// without `f64`); `None` when the log density is the Stan program's.
    pub fn deviation(&self) -> Option<&'static str> {
        self.target.deviation()
    }

    /// The model as a trait object.
    pub fn model(&self) -> &dyn LogDensity {
        &*self.target
    }
}

impl LogDensity for PosteriorDbModel {
    fn dim(&self) -> usize {
        self.target.dim()
    }

    fn data_len(&self) -> Option<usize> {
        self.target.data_len()
    }

    fn log_prob(&self, particles: Tensor<2>, batch: Option<&Minibatch>) -> Tensor<1> {
        self.target.log_prob(particles, batch)
    }
}

/// `name[1]`, ..., `name[len]`: Stan's names for the elements of a vector.
fn indexed(name: &str, len: usize) -> impl Iterator<Item = String> + '_ {
    (1..=len).map(move |i| format!("{name}[{i}]"))
}

/// A layout error as a [`PosteriorDbError`] of posterior `name`.
fn model_error(name: &str) -> impl Fn(ModelError) -> PosteriorDbError + '_ {
    move |error| PosteriorDbError::Model { posterior: name.to_string(), error }
}
