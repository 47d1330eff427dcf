//! A user's model as an executable, as CmdStan makes one of a Stan program: the user's `main`
//! is one call, and their binary has the `fit` command with every flag `parvi fit` has.
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
//! `out/summary.json`, and prints the `stansummary` table; `my_model fit --help` lists the flags.
//! A data file that does not fit the model's data block is refused with the file, the field and
//! the element named, exit status 2, nothing written.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use parvi_model::burn::tensor::Device;
use parvi_model::program::StanModel;
use parvi_models::stan_data::StanData;

use super::fit::{FitArgs, UserModel};

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
    /// Fit the model to a Stan JSON data file (--data FILE.json) by the default path; writes
    /// draws_1.csv, ... (CmdStan's format, a file per chain, generated quantities included), summary.csv and
    /// summary.json to --out.
    Fit(Box<FitArgs>),
    /// Print the model's parameters and generated quantities by Stan's names (CmdStan's
    /// `info`), built from --data.
    Info(InfoArgs),
}

/// Settings of `info`.
#[derive(clap::Args, Debug)]
struct InfoArgs {
    /// A Stan-format JSON data file (the model's sizes come from it).
    #[arg(long, value_name = "FILE.json")]
    data: Option<std::path::PathBuf>,
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
    let command = ModelCli::command().name(name).bin_name(name);
    let matches = command.get_matches();
    let cli = match ModelCli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let build: Box<BuildFn> = Box::new(move |data, device| Ok(Box::new(build(data, device)?) as Box<dyn StanModel>));
    let user = UserModel { name, build: &*build };
    let result = match cli.command {
        ModelCommand::Fit(args) => super::fit::run_for(*args, Some(&user)),
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

/// `info`: the model's dimension and its quantities by Stan's names.
fn info(user: &UserModel<'_>, args: InfoArgs) -> anyhow::Result<()> {
    let device = parvi_model::BackendKind::DEFAULT.device()?;
    let data = match &args.data {
        Some(file) => StanData::read(file)?,
        None => StanData::empty("(no --data file)"),
    };
    let model = (user.build)(&data, &device).map_err(|e| anyhow::anyhow!("model `{}`: {e}", user.name))?;
    println!("model = {}", user.name);
    println!("unconstrained dimension = {}", model.dim());
    println!("parameters and transformed parameters = {}", model.names().join(", "));
    println!("generated quantities = {}", model.generated_names().join(", "));
    Ok(())
}
