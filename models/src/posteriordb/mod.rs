//! The posteriordb suite as ready-made models: the Stan programs of the Stan developers' database
//! of reference posteriors, keyed by posteriordb's `model_name` ([`MODELS`]), each written in the
//! DSL as its Stan program's log density (up to a constant) on Stan's unconstrained coordinates,
//! with the log-Jacobian of every constraint as Stan adds it.
//!
//! A suite folder holds one subfolder per posterior (`posterior.json` naming the model and the
//! data, `model.stan`, `data.json`, `reference_draws.json`, ...). [`list`] finds them, [`load`] and
//! [`load_folder`] read a posterior's data with the checks Stan's data block makes and build its
//! model on a device, whatever the data set of a known model; [`ReferenceDraws::load`] reads the
//! reference NUTS draws (or [`ReferenceMoments`], where only moments exist); [`compare`] scores
//! an approximation against them by parameter name.

pub mod compare;
mod data;
mod reference;

mod accel_gp;
mod accel_splines;
mod ark;
mod bones;
mod bym2;
mod diamonds;
mod dugongs;
mod eight_schools;
mod election88;
mod garch;
mod glmm_poisson;
mod gp_pois_regr;
mod gp_regr;
mod hier_2pl;
mod hmm;
mod hmm_stancon;
mod loss_curves;
mod lotka_volterra;
mod low_dim_gauss_mix;
mod mh;
mod pilots;
mod regressions;
mod sblrc;
mod seeds;
mod soil_carbon;
mod surgical;

use std::path::{Path, PathBuf};

use burn::tensor::{Device, Tensor};
use parvi_model::program::{Compiled, Program, StanModel};
use parvi_model::{LogDensity, Minibatch, ModelError, ParamLayout};
use thiserror::Error;

use data::Data;
pub use reference::{ReferenceDraws, ReferenceMoments};
/// The Stan models parvi knows, by posteriordb `model_name`: a posterior folder runs if its
/// `posterior.json` names one of these, whatever its data.
pub const MODELS: &[&str] = &[
    "eight_schools_noncentered",
    "kidscore_momiq",
    "kidscore_interaction",
    "kidscore_mom_work",
    "earn_height",
    "logearn_height_male",
    "logearn_interaction",
    "logmesquite_logvas",
    "logmesquite_logvash",
    "mesquite",
    "nes",
    "blr",
    "arK",
    "garch11",
    "low_dim_gauss_mix",
    "gp_pois_regr",
    "gp_regr",
    "diamonds",
    "hmm_example",
    "hmm_drive_0",
    "lotka_volterra",
    "accel_gp",
    "eight_schools_centered",
    "seeds_model",
    "surgical_model",
    "pilots",
    "GLMM_Poisson_model",
    "dugongs_model",
    "hmm_gaussian",
    "iohmm_reg",
    "losscurve_sislob",
    "soil_incubation",
    "bym2_offset_only",
    "election88_full",
    "hier_2pl",
    "Mh_model",
    "bones_model",
    "accel_splines",
];

/// The posteriors of the shared suite (`../shared/posteriordb`), by folder name.
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
    "earnings-earn_height",
    "earnings-logearn_height_male",
    "kidiq-kidscore_interaction",
    "kidiq_with_mom_work-kidscore_mom_work",
    "mesquite-logmesquite_logvash",
    "mesquite-mesquite",
    "nes1972-nes",
    "gp_pois_regr-gp_regr",
    "hmm_example-hmm_example",
    "bball_drive_event_0-hmm_drive_0",
    "hudson_lynx_hare-lotka_volterra",
    "mcycle_gp-accel_gp",
];

/// The posteriors of the wider suite (`../shared/posteriordb-more`, issue 59), by folder name:
/// sixteen posteriors of the kinds Stan users fit daily, with references made by Stan
/// (`reference_info.json` in each folder says which of Stan's checks passed). Kept apart from
/// [`NAMES`]: the two folders are read side by side ([`list_all`]).
pub const MORE_NAMES: &[&str] = &[
    "GLMM_Poisson_data-GLMM_Poisson_model",
    "Mh_data-Mh_model",
    "bones_data-bones_model",
    "dugongs_data-dugongs_model",
    "eight_schools-eight_schools_centered",
    "election88-election88_full",
    "hmm_gaussian_simulated-hmm_gaussian",
    "iohmm_reg_simulated-iohmm_reg",
    "loss_curves-losscurve_sislob",
    "mcycle_splines-accel_splines",
    "pilots-pilots",
    "sat-hier_2pl",
    "seeds_data-seeds_model",
    "soil_carbon-soil_incubation",
    "surgical_data-surgical_model",
    "traffic_accident_nyc-bym2_offset_only",
];

/// Short names accepted by [`load`] for the first ten posteriors of [`NAMES`], in that order.
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
    /// `posterior.json` names a model parvi does not know.
    #[error("posterior `{posterior}`: unknown model `{model}` (known models: {known})")]
    UnknownModel {
        /// The posterior's name.
        posterior: String,
        /// The `model_name` of its `posterior.json`.
        model: String,
        /// The known model names, comma-separated.
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

/// One posterior folder of a suite: its name and the Stan model it names.
#[derive(Clone, Debug, PartialEq)]
pub struct PosteriorEntry {
    /// The posterior's name (`nes1972-nes`), from `posterior.json`.
    pub name: String,
    /// The Stan model (`nes`), from `posterior.json`'s `model_name`.
    pub model: String,
    /// The folder.
    pub folder: PathBuf,
}

/// Every posterior folder of the suite folder `dir` (a subfolder holding a `posterior.json`),
/// sorted by name. Folders without `posterior.json` are not posteriors and are left out.
pub fn list(dir: &Path) -> Result<Vec<PosteriorEntry>, PosteriorDbError> {
    let suite = dir.display().to_string();
    let io = |error| PosteriorDbError::Io { posterior: suite.clone(), file: dir.to_path_buf(), error };
    let mut entries = Vec::new();
    for item in std::fs::read_dir(dir).map_err(io)? {
        let folder = item.map_err(io)?.path();
        if folder.join("posterior.json").is_file() {
            entries.push(entry(&folder)?);
        }
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(entries)
}

/// The posterior folders of the suite folder `dir` (subfolders holding a `posterior.json`),
/// sorted by folder name, without reading them: a caller that runs many posteriors reads each
/// with [`entry`] and keeps going past one whose `posterior.json` is bad ([`list`] stops there).
pub fn folders(dir: &Path) -> Result<Vec<PathBuf>, PosteriorDbError> {
    let suite = dir.display().to_string();
    let io = |error| PosteriorDbError::Io { posterior: suite.clone(), file: dir.to_path_buf(), error };
    let mut folders = Vec::new();
    for item in std::fs::read_dir(dir).map_err(io)? {
        let folder = item.map_err(io)?.path();
        if folder.join("posterior.json").is_file() {
            folders.push(folder);
        }
    }
    folders.sort();
    Ok(folders)
}

/// [`resolve`] over several suite folders (the suite and the wider suite, [`MORE_NAMES`]): the
/// first folder where `name` resolves. Unknown everywhere: an error listing every folder's
/// posteriors.
pub fn resolve_in(name: &str, dirs: &[PathBuf]) -> Result<PathBuf, PosteriorDbError> {
    let mut known = Vec::new();
    for dir in dirs {
        match resolve(name, dir) {
            Ok(folder) => return Ok(folder),
            Err(PosteriorDbError::UnknownPosterior { known: here, .. }) => known.push(here),
            Err(other) => return Err(other),
        }
    }
    Err(PosteriorDbError::UnknownPosterior { name: name.to_string(), known: known.join("; ") })
}

/// Reads `folder/posterior.json`: the posterior's name and `model_name`.
pub fn entry(folder: &Path) -> Result<PosteriorEntry, PosteriorDbError> {
    let fallback =
        folder.file_name().map_or_else(|| folder.display().to_string(), |f| f.to_string_lossy().into_owned());
    let file = folder.join("posterior.json");
    let json = data::read_json(&fallback, &file)?;
    let model = match json.get("model_name") {
        Some(serde_json::Value::String(s)) if !s.is_empty() => s.clone(),
        Some(other) => {
            return Err(PosteriorDbError::InvalidField {
                posterior: fallback,
                file,
                field: "model_name".into(),
                reason: format!("expected a non-empty string, found {other}"),
            });
        }
        None => return Err(PosteriorDbError::MissingField { posterior: fallback, file, field: "model_name".into() }),
    };
    let name = match json.get("name") {
        Some(serde_json::Value::String(s)) if !s.is_empty() => s.clone(),
        _ => fallback,
    };
    Ok(PosteriorEntry { name, model, folder: folder.to_path_buf() })
}

/// The folder of posterior `name` in the suite folder `dir`: a subfolder of that name, an alias
/// of the shared suite's first ten ([`ALIASES`]), a posterior's name, or the model of exactly one
/// posterior there (ASCII case ignored).
pub fn resolve(name: &str, dir: &Path) -> Result<PathBuf, PosteriorDbError> {
    if dir.join(name).join("posterior.json").is_file() {
        return Ok(dir.join(name));
    }
    if let Some(i) = ALIASES.iter().position(|a| a.eq_ignore_ascii_case(name)) {
        return Ok(dir.join(NAMES[i]));
    }
    let entries = list(dir)?;
    if let Some(e) = entries.iter().find(|e| e.name.eq_ignore_ascii_case(name)) {
        return Ok(e.folder.clone());
    }
    let by_model: Vec<_> = entries.iter().filter(|e| e.model.eq_ignore_ascii_case(name)).collect();
    if let [one] = by_model.as_slice() {
        return Ok(one.folder.clone());
    }
    let known: Vec<String> =
        entries.iter().map(|e| e.name.clone()).chain(ALIASES.iter().map(|a| a.to_string())).collect();
    let known = if by_model.len() > 1 {
        format!("model `{name}` has {} posteriors here, name one of them: {}", by_model.len(), known.join(", "))
    } else {
        known.join(", ")
    };
    Err(PosteriorDbError::UnknownPosterior { name: name.to_string(), known })
}

/// Loads posterior `name` (a folder of `dir`, an alias, a posterior's name, or a model with one
/// posterior there) from the suite folder `dir`, with its data tensors on `device`.
pub fn load(name: &str, dir: &Path, device: &Device) -> Result<PosteriorDbModel, PosteriorDbError> {
    load_folder(&resolve(name, dir)?, device)
}

/// Loads the posterior in `folder` (its `posterior.json` names the model, `data.json` holds the
/// data): any data set of a known model runs.
pub fn load_folder(folder: &Path, device: &Device) -> Result<PosteriorDbModel, PosteriorDbError> {
    let entry = entry(folder)?;
    known_model(&entry.name, &entry.model)?;
    let data = Data::read(&entry.name, &folder.join("data.json"))?;
    load_model(&entry.name, &entry.model, &data, folder, device)
}

/// Loads model `model` (a posteriordb `model_name`, one of [`MODELS`]) with the Stan-format data
/// file `data` (for example `nes` with another election year's data).
pub fn load_data_file(model: &str, data: &Path, device: &Device) -> Result<PosteriorDbModel, PosteriorDbError> {
    known_model(model, model)?;
    let parsed = Data::read(model, data)?;
    load_model(model, model, &parsed, data.parent().unwrap_or(Path::new(".")), device)
}

/// An [`PosteriorDbError::UnknownModel`] unless `model` is one of [`MODELS`].
fn known_model(posterior: &str, model: &str) -> Result<(), PosteriorDbError> {
    if MODELS.contains(&model) {
        return Ok(());
    }
    Err(PosteriorDbError::UnknownModel {
        posterior: posterior.to_string(),
        model: model.to_string(),
        known: MODELS.join(", "),
    })
}

fn load_model(
    name: &str,
    model: &str,
    data: &Data,
    folder: &Path,
    device: &Device,
) -> Result<PosteriorDbModel, PosteriorDbError> {
    let (target, deviation) = build(name, model, data, device)?;
    Ok(PosteriorDbModel {
        name: name.to_string(),
        model: model.to_string(),
        folder: folder.to_path_buf(),
        target,
        deviation,
    })
}

/// A compiled model, and how its build on this device departs from the Stan program (gp_pois_regr
/// without `f64`), if it does.
type Built = (Box<dyn StanModel>, Option<&'static str>);

/// A model written as a [`Program`]: compiled, which runs it once.
fn program<P: Program + 'static>(name: &str, program: P, device: &Device) -> Result<Built, PosteriorDbError> {
    Ok((Box::new(Compiled::new(program, device).map_err(model_error(name))?), None))
}

/// Model `model` on `data` (posterior `name` in errors).
fn build(name: &str, model: &str, data: &Data, device: &Device) -> Result<Built, PosteriorDbError> {
    match model {
        "eight_schools_noncentered" => program(name, eight_schools::EightSchools::new(data, device)?, device),
        "blr" => program(name, sblrc::Blr::new(data, device)?, device),
        "arK" => program(name, ark::Ark::new(data, device)?, device),
        "garch11" => program(name, garch::Garch::new(data, device)?, device),
        "low_dim_gauss_mix" => program(name, low_dim_gauss_mix::GaussMix::new(data, device)?, device),
        "gp_pois_regr" => {
            let gp = gp_pois_regr::GpPoisson::new(data, device)?;
            let deviation = gp.deviation();
            program(name, gp, device).map(|(target, _)| (target, deviation))
        }
        "diamonds" => program(name, diamonds::Diamonds::new(data, device)?, device),
        "earn_height"
        | "logearn_height_male"
        | "logearn_interaction"
        | "kidscore_momiq"
        | "logmesquite_logvas"
        | "kidscore_interaction"
        | "kidscore_mom_work"
        | "logmesquite_logvash"
        | "mesquite"
        | "nes" => program(name, regressions::new(model, data, device)?, device),
        "gp_regr" => program(name, gp_regr::GpRegr::new(data, device)?, device),
        "hmm_example" => program(name, hmm::HmmExample::new(data, device)?, device),
        "hmm_drive_0" => program(name, hmm::HmmDrive::new(data, device)?, device),
        "lotka_volterra" => program(name, lotka_volterra::LotkaVolterra::new(data, device)?, device),
        "accel_gp" => program(name, accel_gp::AccelGp::new(data, device)?, device),
        "eight_schools_centered" => program(name, eight_schools::EightSchoolsCentered::new(data, device)?, device),
        "seeds_model" => program(name, seeds::Seeds::new(data, device)?, device),
        "surgical_model" => program(name, surgical::Surgical::new(data, device)?, device),
        "pilots" => program(name, pilots::Pilots::new(data, device)?, device),
        "GLMM_Poisson_model" => program(name, glmm_poisson::GlmmPoisson::new(data, device)?, device),
        "dugongs_model" => program(name, dugongs::Dugongs::new(data, device)?, device),
        "hmm_gaussian" => program(name, hmm_stancon::HmmGaussian::new(data, device)?, device),
        "iohmm_reg" => program(name, hmm_stancon::IohmmReg::new(data, device)?, device),
        "losscurve_sislob" => program(name, loss_curves::LossCurve::new(data, device)?, device),
        "soil_incubation" => program(name, soil_carbon::SoilIncubation::new(data, device)?, device),
        "bym2_offset_only" => program(name, bym2::Bym2::new(data, device)?, device),
        "election88_full" => program(name, election88::Election88::new(data, device)?, device),
        "hier_2pl" => program(name, hier_2pl::Hier2pl::new(data, device)?, device),
        "Mh_model" => program(name, mh::MhModel::new(data, device)?, device),
        "bones_model" => program(name, bones::Bones::new(data, device)?, device),
        "accel_splines" => program(name, accel_splines::AccelSplines::new(data, device)?, device),
        _ => Err(PosteriorDbError::UnknownModel {
            posterior: name.to_string(),
            model: model.to_string(),
            known: MODELS.join(", "),
        }),
    }
}

/// A loaded posterior: its model as a [`LogDensity`] on unconstrained particles, its layout, and
/// the map to the quantities the reference draws report.
pub struct PosteriorDbModel {
    name: String,
    model: String,
    folder: PathBuf,
    target: Box<dyn StanModel>,
    deviation: Option<&'static str>,
}

impl std::fmt::Debug for PosteriorDbModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PosteriorDbModel").field("name", &self.name).field("layout", self.target.layout()).finish()
    }
}

impl PosteriorDbModel {
    /// The posterior's name (`eight_schools-eight_schools_noncentered`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The Stan model's name (`eight_schools_noncentered`), posteriordb's `model_name`.
    pub fn model_name(&self) -> &str {
        &self.model
    }

    /// The folder it was read from (its reference draws are there).
    pub fn folder(&self) -> &Path {
        &self.folder
    }

    /// The short alias (`eight_schools`) of one of the shared suite's first ten, else the name.
    pub fn alias(&self) -> &str {
        NAMES.iter().position(|n| *n == self.name).and_then(|i| ALIASES.get(i)).copied().unwrap_or(&self.name)
    }

    /// The blocks of the unconstrained particle, in the Stan program's parameter order. Where
    /// Stan reports a transformed quantity (eight_schools' `theta`, gp_pois_regr's `f`, garch's
    /// `beta1`) the block is the one sampled (`theta_trans`, `f_tilde`, `beta1_frac`).
    pub fn layout(&self) -> &ParamLayout {
        self.target.layout()
    }

    /// The reported quantities' names in Stan's naming and order (`theta[1]`, ..., `mu`, `tau`):
    /// the reference draws hold these, or a subset of them.
    pub fn param_names(&self) -> Vec<String> {
        self.target.names().to_vec()
    }

    /// Unconstrained particles `[n, dim]` to the reported quantities `[n, p]`, in
    /// [`PosteriorDbModel::param_names`] order, on the constrained scale.
    pub fn reported(&self, particles: Tensor<2>) -> Tensor<2> {
        let [n, _] = particles.dims();
        let device = particles.device();
        // As `log_prob`: a failure that depends on the particles gives NaN rows, not a panic.
        self.target
            .reported(particles)
            .unwrap_or_else(|_| Tensor::full([n, self.target.names().len()], f32::NAN, &device))
    }

    /// How this build departs from the Stan program, if it does (gp_pois_regr on a device
    /// without `f64`); `None` when the log density is the Stan program's.
    pub fn deviation(&self) -> Option<&'static str> {
        self.deviation
    }

    /// The names a reference may hold: [`PosteriorDbModel::param_names`], then the generated
    /// quantities (surgical's `pop_mean`, GLMM_Poisson's `lambda[i]`), as Stan's output has them.
    pub fn compared_names(&self) -> Vec<String> {
        self.target.names().iter().chain(self.target.generated_names()).cloned().collect()
    }

    /// Unconstrained particles `[n, dim]` to the quantities of
    /// [`PosteriorDbModel::compared_names`] `[n, p + g]`: the reported ones, then the generated
    /// quantities, their random draws (a posterior predictive) from a stream seeded by `seed`.
    pub fn compared(&self, particles: Tensor<2>, seed: u64) -> Result<Tensor<2>, ModelError> {
        let reported = self.target.reported(particles.clone())?;
        if self.target.generated_names().is_empty() {
            return Ok(reported);
        }
        let mut rng = <chacha20::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(seed);
        let generated = self.target.generated(particles, &mut rng)?;
        Ok(Tensor::cat(vec![reported, generated], 1))
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

    fn take_error(&self) -> Option<ModelError> {
        self.target.take_error()
    }
}

impl StanModel for PosteriorDbModel {
    fn layout(&self) -> &ParamLayout {
        self.target.layout()
    }

    fn names(&self) -> &[String] {
        self.target.names()
    }

    fn reported(&self, particles: Tensor<2>) -> Result<Tensor<2>, ModelError> {
        self.target.reported(particles)
    }

    fn generated_names(&self) -> &[String] {
        self.target.generated_names()
    }

    fn generated(&self, particles: Tensor<2>, rng: &mut dyn rand::Rng) -> Result<Tensor<2>, ModelError> {
        self.target.generated(particles, rng)
    }

    fn quantities_at(
        &self,
        constrained: Tensor<2>,
        streams: &mut [parvi_model::program::DrawRng],
    ) -> Result<(Tensor<2>, Tensor<2>), ModelError> {
        self.target.quantities_at(constrained, streams)
    }

    fn constant_names(&self) -> &[String] {
        self.target.constant_names()
    }

    fn constants(&self) -> &[f64] {
        self.target.constants()
    }
}

/// A layout error as a [`PosteriorDbError`] of posterior `name`.
fn model_error(name: &str) -> impl Fn(ModelError) -> PosteriorDbError + '_ {
    move |error| PosteriorDbError::Model { posterior: name.to_string(), error }
}
