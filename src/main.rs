use std::process::ExitCode;

use clap::{Parser, Subcommand};
use parvi::cli::{bench, data, fit};

/// parvi: particle-based variational inference (SVGD and friends) on burn.
#[derive(Parser, Debug)]
#[command(name = "parvi", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Fit a particle approximation to a built-in target; writes summary.json, particles.csv
    /// and particles.svg to --out.
    Fit(Box<fit::FitArgs>),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// UCI data sets: list, info, verify checksums, fetch.
    Data(data::DataArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Fit(args) => fit::run(*args),
        Command::Bench(cmd) => bench::run(cmd),
        Command::Data(args) => data::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
