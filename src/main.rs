use std::process::ExitCode;

use clap::{Parser, Subcommand};
use parvi::cli::{bench, bnn, data, fit, predict, reference};

/// parvi: particle-based variational inference (SVGD and friends) on burn.
#[derive(Parser, Debug)]
#[command(name = "parvi", version, about, long_about = None)]
struct Cli {
    /// Without a subcommand, parvi runs its main job: `parvi bnn` with its defaults (a BNN
    /// posterior on the built-in toy regression, written to out/).
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Fit a built-in target or a posteriordb posterior (--posterior DIR, or --model NAME --data
    /// FILE.json); writes draws_1.csv, ... (CmdStan's format, a file per chain), summary.csv, summary.json and
    /// particles.csv (and particles.svg for a built-in target) to --out.
    Fit(Box<fit::FitArgs>),
    /// Train a BNN posterior on the toy regression or a UCI split; writes scores and a plot.
    Bnn(Box<bnn::BnnArgs>),
    /// Predict new rows with a posterior saved by `parvi bnn --save-posterior`.
    Predict(Box<predict::PredictArgs>),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Ground-truth NUTS draws for a small model (BLR, 2-D targets), as CSV.
    Reference(reference::ReferenceArgs),
    /// UCI data sets: list, info, verify checksums, fetch.
    Data(data::DataArgs),
}

fn main() -> ExitCode {
    parvi::memory::keep_freed_memory();
    let cli = Cli::parse();
    let result = match cli.command {
        None => bnn::run(bnn::BnnArgs::default()),
        Some(Command::Fit(args)) => fit::run(*args),
        Some(Command::Bnn(args)) => bnn::run(*args),
        Some(Command::Predict(args)) => predict::run(*args),
        Some(Command::Bench(cmd)) => bench::run(cmd),
        Some(Command::Reference(args)) => reference::run(args),
        Some(Command::Data(args)) => data::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
