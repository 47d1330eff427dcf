//! A user's model as an executable, as CmdStan makes one of a Stan program: the user's `main`
//! is one call, and their binary has CmdStan's methods: `fit` (parvi's default path or any
//! `--method`, with every setting `parvi fit` shares), `optimize` (with `--laplace N`, CmdStan's
//! `laplace`), `pathfinder`, `generate_quantities`, `log_prob` and `info`.
//!
//! ```no_run
//! use parvi::model::program::{Compiled, Program, Target, Vars};
//! use parvi::model::{ModelError, ParamLayout};
//! # #[derive(Debug)] struct MyModel;
//! # impl Program for MyModel {
//! #     fn parameters(&self) -> Result<ParamLayout, ModelError> { ParamLayout::new().real("mu", &[]) }
//! #     fn model(&self, _: &Vars, _: &mut Target) -> Result<(), ModelError> { Ok(()) }
//! # }
//! fn main() -> std::process::ExitCode {
//!     parvi::cli::model::run("my_model", |data, device| {
//!         let _n = data.size("N")?; // read the data block's fields ...
//!         Ok(Compiled::new(MyModel, device)?)
//!     })
//! }
//! ```
//!
//! `my_model fit --data data.json --out out` then writes `out/draws_1.csv`, ... (CmdStan's CSV, a file per chain:
//! parameters, transformed parameters, generated quantities), `out/summary.csv` and
//! `out/summary.json`, and prints the `stansummary` table; `my_model --help` lists the commands
//! and `my_model fit --help` their flags. A data file that does not fit the model's data block is
//! refused with the file, the field and the element named, exit status 2, nothing written; so is
//! a model that reads data run without `--data`.
//!
//! Every command prints a line on stderr for each phase and, where stderr is not a terminal, a
//! line of progress every few seconds (`--quiet` silences both and the progress bar).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use parvi_model::BackendKind;
use parvi_model::burn::tensor::Device;
use parvi_model::program::StanModel;
use parvi_models::stan_data::{StanData, StanDataError};

use super::fit::{FitArgs, FitCommon, UserModel};
use crate::stan_methods::{self, GqConfig, OptimizeConfig, PathfinderRun, StanTable};

/// The error a model's builder may return: a data field's ([`parvi_models::stan_data::StanDataError`]),
/// the program's ([`parvi_model::ModelError`]) or the user's own, through `?`.
pub type BuildError = Box<dyn std::error::Error + Send + Sync>;

/// How a user's executable builds its model from the data file.
pub type BuildFn = dyn Fn(&StanData, &Device) -> Result<Box<dyn StanModel>, BuildError>;

/// The command line of a model's executable.
#[derive(Parser, Debug)]
struct ModelCli {
    #[command(subcommand)]
    command: ModelCommand,
}

#[derive(Subcommand, Debug)]
enum ModelCommand {
    /// Fit the model to its data (--data FILE.json) by parvi's default path or any --method;
    /// writes draws_1.csv, ... (CmdStan's format, a file per chain, generated quantities included), summary.csv and
    /// summary.json to --out.
    Fit(Box<ModelFitArgs>),
    /// The posterior mode (CmdStan's optimize: without the Jacobian unless --jacobian), written
    /// as optimize.csv; with --laplace N also N draws from the normal approximation at the mode
    /// (CmdStan's laplace), written as laplace.csv.
    Optimize(OptimizeArgs),
    /// Multi-path Pathfinder's importance-resampled draws (CmdStan's pathfinder), written as
    /// pathfinder.csv.
    Pathfinder(PathfinderArgs),
    /// The transformed parameters and generated quantities of a fitted run's draws (CmdStan's
    /// standalone generate_quantities), one output file per draws file.
    #[command(name = "generate_quantities", alias = "generate-quantities")]
    GenerateQuantities(GqArgs),
    /// The log density and its gradient with respect to the unconstrained parameters at given
    /// constrained parameter values (CmdStan's log_prob method), written as log_prob.csv.
    #[command(name = "log_prob", alias = "log-prob")]
    LogProb(LogProbArgs),
    /// Print the model's parameters and generated quantities by Stan's names (CmdStan's
    /// `info`), built from --data.
    Info(InfoArgs),
}

/// Settings of a model executable's `fit`: its data, and every setting it shares with `parvi fit`.
#[derive(clap::Args, Debug)]
struct ModelFitArgs {
    /// The Stan-format JSON data file of the model's data block (needed where the model reads
    /// data).
    #[arg(long, value_name = "FILE.json")]
    data: Option<PathBuf>,
    #[command(flatten)]
    common: FitCommon,
}

/// What every other command takes: the data, the seed, the backend, the output.
#[derive(clap::Args, Debug)]
struct CommonArgs {
    /// The Stan-format JSON data file of the model's data block (needed where the model reads
    /// data).
    #[arg(long, value_name = "FILE.json")]
    data: Option<PathBuf>,
    /// Seed of every random choice (the starts, the draws, the generated quantities) [default: 0].
    #[arg(long)]
    seed: Option<u64>,
    /// ndarray, flex or wgpu [default: flex, the faster CPU backend].
    #[arg(long)]
    backend: Option<String>,
    /// Output directory (created if missing).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// No phase or progress lines on stderr.
    #[arg(long)]
    quiet: bool,
}

/// Settings of `optimize`.
#[derive(clap::Args, Debug)]
struct OptimizeArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// The MAP in the unconstrained space: the constraints' log-Jacobians in the density
    /// maximised (CmdStan's jacobian=1; without it, the mode of the constrained parameters'
    /// density, CmdStan's default). --laplace implies it.
    #[arg(long)]
    jacobian: bool,
    /// Also write N draws from the normal approximation at the mode in the unconstrained space
    /// (CmdStan's laplace method), with log_p__ and log_g__.
    #[arg(long, value_name = "N")]
    laplace: Option<usize>,
}

/// Settings of `pathfinder`.
#[derive(clap::Args, Debug)]
struct PathfinderArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Independent L-BFGS paths [default: 4].
    #[arg(long)]
    num_paths: Option<usize>,
    /// Draws returned, importance-resampled from every path's draws [default: 1000].
    #[arg(long)]
    draws: Option<usize>,
}

/// Settings of `generate_quantities`.
#[derive(clap::Args, Debug)]
struct GqArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// The fitted run's draws files (CmdStan CSV, one chain each or parvi's draws.csv): their
    /// parameter columns are read.
    #[arg(long, value_name = "FILE.csv", num_args = 1.., required = true)]
    draws: Vec<PathBuf>,
}

/// Settings of `log_prob`.
#[derive(clap::Args, Debug)]
struct LogProbArgs {
    /// The Stan-format JSON data file of the model's data block (needed where the model reads
    /// data).
    #[arg(long, value_name = "FILE.json")]
    data: Option<PathBuf>,
    /// Constrained parameter values: a JSON object of Stan-format values (one point) or a
    /// CmdStan CSV of draws (a point per row).
    #[arg(long, value_name = "FILE")]
    params: PathBuf,
    /// Whether the constraints' log-Jacobians are in the density (CmdStan's default: true).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    jacobian: bool,
    /// ndarray, flex or wgpu [default: flex].
    #[arg(long)]
    backend: Option<String>,
    /// Output directory (created if missing).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
}

/// Settings of `info`.
#[derive(clap::Args, Debug)]
struct InfoArgs {
    /// A Stan-format JSON data file (the model's sizes come from it).
    #[arg(long, value_name = "FILE.json")]
    data: Option<PathBuf>,
}

/// The `main` of a model's executable named `name`: parses the command line, builds the model
/// with `build` from the data file, runs the command; exit status 0, or 2 after printing the
/// error.
pub fn run<M, F>(name: &'static str, build: F) -> ExitCode
where
    M: StanModel + 'static,
    F: Fn(&StanData, &Device) -> Result<M, BuildError> + 'static,
{
    crate::memory::keep_freed_memory();
    let command = ModelCli::command().name(name).bin_name(name).about(format!(
        "Model `{name}` as an executable (parvi): CmdStan's methods on it, each reading its data from --data FILE.json"
    ));
    let matches = command.get_matches();
    let cli = match ModelCli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let build: Box<BuildFn> = Box::new(move |data, device| Ok(Box::new(build(data, device)?) as Box<dyn StanModel>));
    let user = UserModel { name, build: &*build };
    let result = match cli.command {
        ModelCommand::Fit(args) => {
            let ModelFitArgs { data, common } = *args;
            super::fit::run_for(FitArgs { data, common, ..FitArgs::default() }, Some(&user))
        }
        ModelCommand::Optimize(args) => optimize(&user, args),
        ModelCommand::Pathfinder(args) => pathfinder(&user, args),
        ModelCommand::GenerateQuantities(args) => generate_quantities(&user, args),
        ModelCommand::LogProb(args) => log_prob(&user, args),
        ModelCommand::Info(args) => info(&user, args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// The user's model from `data` (no file: a model without data). A model that reads a data
/// field when no `--data` was given is a usage error saying so, not a missing field of a file
/// that does not exist.
pub(crate) fn build_model(user: &UserModel<'_>, data: Option<&Path>, device: &Device) -> Result<Box<dyn StanModel>> {
    let stan_data = match data {
        Some(file) => StanData::read(file)?,
        None => StanData::empty("(no --data file)"),
    };
    (user.build)(&stan_data, device).map_err(|e| {
        if data.is_none()
            && let Some(StanDataError::Missing { field, .. }) = e.downcast_ref::<StanDataError>()
        {
            return anyhow::anyhow!(
                "missing setting `--data FILE.json`: model `{}` reads data (its data block declares `{field}`)",
                user.name
            );
        }
        build_error(user.name, &*e)
    })
}

/// The backend's device from `--backend`.
fn device(backend: Option<&str>) -> Result<Device> {
    let backend: BackendKind = backend.map(str::parse).transpose()?.unwrap_or(BackendKind::DEFAULT);
    Ok(backend.device()?)
}

/// Phase and progress lines for this command unless `quiet`.
fn lines(quiet: bool) -> parvi_infer::core::progress::Lines {
    parvi_infer::core::progress::Lines::enable(!quiet)
}

/// Makes `out` and writes `tables` into it by name, each atomically (the results are all made
/// before this, so bad input writes nothing).
fn write_tables(out: &Path, tables: &[(String, &StanTable)]) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("cannot create output directory {}", out.display()))?;
    for (name, table) in tables {
        let path = out.join(name);
        table.write(&path)?;
        eprintln!("wrote {} ({} rows)", path.display(), table.rows());
    }
    Ok(())
}

/// The comment lines naming the model and its data, before a method's own.
fn header(user: &UserModel<'_>, data: Option<&Path>, table: &mut StanTable) {
    let mut lines = vec![format!("model = {}", user.name)];
    lines.extend(std::mem::take(&mut table.comments));
    lines.push("data".into());
    lines.push(format!("  file = {}", data.map(|d| d.display().to_string()).unwrap_or_default()));
    lines.push(format!("parvi_version = {}", env!("CARGO_PKG_VERSION")));
    table.comments = lines;
}

/// `optimize` (and `--laplace N`).
fn optimize(user: &UserModel<'_>, args: OptimizeArgs) -> Result<()> {
    let c = &args.common;
    let _lines = lines(c.quiet);
    if args.laplace == Some(0) {
        bail!("invalid setting `--laplace`: need at least one draw, got 0");
    }
    let device = device(c.backend.as_deref())?;
    let model = build_model(user, c.data.as_deref(), &device)?;
    let config = OptimizeConfig {
        // CmdStan's laplace takes the Jacobian by default, and cmdstanpy's laplace_sample finds
        // the mode with it: the approximation is in the unconstrained space.
        jacobian: args.jacobian || args.laplace.is_some(),
        seed: c.seed.unwrap_or(0),
        ..OptimizeConfig::default()
    };
    let mut mode = stan_methods::optimize(model.as_ref(), &config, &device)?;
    header(user, c.data.as_deref(), &mut mode.table);
    let mut laplace =
        args.laplace.map(|n| stan_methods::laplace_sample(model.as_ref(), &mode, n, &device)).transpose()?;
    let mut tables = vec![("optimize.csv".to_string(), &mode.table)];
    if let Some(table) = laplace.as_mut() {
        header(user, c.data.as_deref(), table);
    }
    if let Some(table) = &laplace {
        tables.push(("laplace.csv".to_string(), table));
    }
    write_tables(&c.out, &tables)?;
    for w in &mode.warnings {
        eprintln!("warning: {w}");
    }
    println!("optimize on {}: lp__ = {:.6} at the mode ({:.3} s)", user.name, mode.laplace.log_prob, mode.seconds);
    Ok(())
}

/// `pathfinder`.
fn pathfinder(user: &UserModel<'_>, args: PathfinderArgs) -> Result<()> {
    let c = &args.common;
    let _lines = lines(c.quiet);
    let device = device(c.backend.as_deref())?;
    let model = build_model(user, c.data.as_deref(), &device)?;
    let defaults = PathfinderRun::default();
    let mut run = PathfinderRun { draws: args.draws.unwrap_or(defaults.draws), seed: c.seed.unwrap_or(0), ..defaults };
    if let Some(paths) = args.num_paths {
        run.config.paths = paths;
    }
    let (mut table, warnings) = stan_methods::pathfinder_draws(model.as_ref(), &run, &device)?;
    header(user, c.data.as_deref(), &mut table);
    write_tables(&c.out, &[("pathfinder.csv".to_string(), &table)])?;
    for w in &warnings {
        eprintln!("warning: {w}");
    }
    Ok(())
}

/// `generate_quantities`: one output a draws file, `<stem>_gq.csv` beside the others in --out.
fn generate_quantities(user: &UserModel<'_>, args: GqArgs) -> Result<()> {
    let c = &args.common;
    let _lines = lines(c.quiet);
    let device = device(c.backend.as_deref())?;
    let model = build_model(user, c.data.as_deref(), &device)?;
    let mut tables =
        stan_methods::generate_quantities(model.as_ref(), &args.draws, &GqConfig { seed: c.seed }, &device)?;
    let mut named = Vec::with_capacity(tables.len());
    for (file, table) in args.draws.iter().zip(tables.iter_mut()) {
        header(user, c.data.as_deref(), table);
        let stem = file.file_stem().map_or_else(|| "draws".to_string(), |s| s.to_string_lossy().into_owned());
        named.push(format!("{stem}_gq.csv"));
    }
    let mut seen = std::collections::HashSet::new();
    if let Some(twice) = named.iter().find(|n| !seen.insert(n.as_str())) {
        bail!("invalid setting `--draws`: two files would both write {twice}; give files of different names");
    }
    let pairs: Vec<(String, &StanTable)> = named.into_iter().zip(tables.iter()).collect();
    write_tables(&c.out, &pairs)
}

/// `log_prob`.
fn log_prob(user: &UserModel<'_>, args: LogProbArgs) -> Result<()> {
    let device = device(args.backend.as_deref())?;
    let model = build_model(user, args.data.as_deref(), &device)?;
    let mut result = stan_methods::log_prob(model.as_ref(), &args.params, args.jacobian, &device)?;
    header(user, args.data.as_deref(), &mut result.table);
    write_tables(&args.out, &[("log_prob.csv".to_string(), &result.table)])
}

/// `info`: the model's dimension and its quantities by Stan's names.
fn info(user: &UserModel<'_>, args: InfoArgs) -> Result<()> {
    let device = BackendKind::DEFAULT.device()?;
    let model = build_model(user, args.data.as_deref(), &device)?;
    println!("model = {}", user.name);
    println!("unconstrained dimension = {}", model.dim());
    println!("parameters and transformed parameters = {}", model.names().join(", "));
    println!("generated quantities = {}", model.generated_names().join(", "));
    let constants: Vec<String> =
        model.constant_names().iter().zip(model.constants()).map(|(name, v)| format!("{name} = {v}")).collect();
    println!("transformed data = {}", constants.join(", "));
    Ok(())
}

/// A builder's error for the command line. A DSL constructor's error on an argument (a scale, a
/// count) whose value came from the data file names the distribution's argument but not the
/// field: the message says how the builder names it.
pub(crate) fn build_error(name: &str, error: &(dyn std::error::Error + Send + Sync + 'static)) -> anyhow::Error {
    let hint = match error.downcast_ref::<parvi_model::ModelError>().and_then(parvi_model::ModelError::argument) {
        Some(_) => {
            " (if this value comes from the data file, the model's builder names its field by building it inside `data.check(\"field\", ...)`)"
        }
        None => "",
    };
    anyhow::anyhow!("model `{name}`: {error}{hint}")
}

#[cfg(test)]
mod tests {
    use super::{BuildError, build_error};

    #[test]
    fn a_dsl_argument_error_says_how_the_builder_names_its_data_field() {
        let dsl: BuildError = Box::new(parvi_model::dist::Exponential::<2>::new(0.0).unwrap_err());
        let message = build_error("m", &*dsl).to_string();
        assert!(message.starts_with("model `m`: parameter `rate` of Exponential"), "{message}");
        assert!(message.contains("data.check(\"field\", ...)"), "{message}");
        let own: BuildError = "no spread".into();
        assert_eq!(build_error("m", &*own).to_string(), "model `m`: no spread");
    }
}
