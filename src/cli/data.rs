//! `parvi data`: list, describe, verify and fetch the benchmark data sets of the registry.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use clap::{Args, Subcommand};
use parvi_data::{Entry, FileState, Registry, VerifyReport, data_dir, fetch, load_entry, verify};

#[derive(Args, Debug)]
pub struct DataArgs {
    /// Data directory [default: $PARVI_DATA_DIR, else ./datasets].
    #[arg(long, global = true)]
    pub data_dir: Option<PathBuf>,
    #[command(subcommand)]
    pub command: DataCommand,
}

#[derive(Subcommand, Debug)]
pub enum DataCommand {
    /// Every known data set, with its shape and whether its files are present and verified.
    List,
    /// One data set: description, source, files and their state.
    Info {
        /// Name or alias (e.g. boston, protein, breast-cancer).
        name: String,
    },
    /// Recompute the sha256 of a data set's files (all present data sets if no name is given).
    Verify {
        /// Name or alias.
        name: Option<String>,
    },
    /// Download a data set's missing or stale files, verifying each before it is kept.
    Fetch {
        /// Name or alias, or "all".
        name: String,
        /// Download from {URL}/{name}/{file} instead of the registry's URLs (a mirror laid out
        /// like the data directory).
        #[arg(long, value_name = "URL")]
        base_url: Option<String>,
    },
}

pub fn run(args: DataArgs) -> Result<()> {
    let dir = data_dir(args.data_dir.as_deref());
    let registry = Registry::builtin();
    match args.command {
        DataCommand::List => list(&registry, &dir),
        DataCommand::Info { name } => info(registry.resolve(&name)?, &dir),
        DataCommand::Verify { name: Some(name) } => verify_one(registry.resolve(&name)?, &dir),
        DataCommand::Verify { name: None } => verify_all(&registry, &dir),
        DataCommand::Fetch { name, base_url } => {
            let entries: Vec<&Entry> = if name.eq_ignore_ascii_case("all") {
                registry.entries().iter().collect()
            } else {
                vec![registry.resolve(&name)?]
            };
            fetch_entries(&entries, &dir, base_url.as_deref(), entries.len() > 1)
        }
    }
}

fn list(registry: &Registry, dir: &Path) -> Result<()> {
    println!("data directory: {}\n", dir.display());
    let mut rows = Vec::new();
    for entry in registry.entries() {
        rows.push(vec![
            entry.name.clone(),
            entry.aliases.join(", "),
            entry.task.to_string(),
            entry.rows.to_string(),
            entry.features.to_string(),
            entry.splits.to_string(),
            human_bytes(entry.total_bytes()),
            state_word(entry, dir)?,
        ]);
    }
    print_table(
        &["NAME", "ALIASES", "TASK", "ROWS", "FEATURES", "SPLITS", "SIZE", "STATE"],
        &[false, false, false, true, true, true, true, false],
        &rows,
    );
    Ok(())
}

/// "verified", "not fetched", or what is wrong, for the list view.
fn state_word(entry: &Entry, dir: &Path) -> Result<String> {
    if !entry.folder(dir).is_dir() {
        return Ok("not fetched".into());
    }
    let report = verify(entry, dir)?;
    Ok(summary(&report))
}

/// One-line summary of a verify report.
fn summary(report: &VerifyReport) -> String {
    let missing = count(report, |s| *s == FileState::Missing);
    let bad = count(report, |s| matches!(s, FileState::Mismatch { .. }));
    match (missing, bad) {
        (0, 0) => "verified".into(),
        (m, 0) => format!("{m} missing"),
        (0, b) => format!("{b} corrupt"),
        (m, b) => format!("{m} missing, {b} corrupt"),
    }
}

fn count(report: &VerifyReport, pred: impl Fn(&FileState) -> bool) -> usize {
    report.files.iter().filter(|f| pred(&f.state)).count()
}

fn info(entry: &Entry, dir: &Path) -> Result<()> {
    let folder = entry.folder(dir);
    let field = |key: &str, value: &str| println!("{key:<12} {value}");
    field("name", &entry.name);
    if !entry.aliases.is_empty() {
        field("aliases", &entry.aliases.join(", "));
    }
    field("task", &entry.task.to_string());
    field("description", &entry.description);
    field("shape", &format!("{} rows x {} features", entry.rows, entry.features));
    field("splits", &entry.splits.to_string());
    if let Some(label) = &entry.label {
        field("label", label);
    }
    field("source", &entry.source);
    field("folder", &folder.display().to_string());
    field("size", &format!("{} in {} files", human_bytes(entry.total_bytes()), entry.files.len()));
    for note in entry.files.iter().filter(|f| !f.note.is_empty()) {
        field("note", &format!("{}: {}", note.name, note.note));
    }

    let report = verify(entry, dir)?;
    field("state", &summary(&report));
    if report.is_ok() {
        let ds = load_entry(entry, dir)?;
        let split = ds.split(0)?;
        field(
            "loaded",
            &format!(
                "{} rows x {} features; split 0: {} train / {} test",
                ds.rows,
                ds.features,
                split.train.len(),
                split.test.len()
            ),
        );
    }

    println!();
    let rows: Vec<Vec<String>> = entry
        .files
        .iter()
        .zip(&report.files)
        .map(|(file, check)| {
            vec![
                file.name.clone(),
                file.bytes.to_string(),
                file.sha256[..16].to_string(),
                state_of(&check.state).to_string(),
            ]
        })
        .collect();
    print_table(&["FILE", "BYTES", "SHA256 (PREFIX)", "STATE"], &[false, true, false, false], &rows);
    Ok(())
}

fn state_of(state: &FileState) -> &'static str {
    match state {
        FileState::Verified => "verified",
        FileState::Missing => "missing",
        FileState::Mismatch { .. } => "CORRUPT",
    }
}

/// Most problem lines printed per data set; the rest are counted.
const MAX_PROBLEM_LINES: usize = 10;

/// Prints the problems of `report` (one line per bad file, up to [`MAX_PROBLEM_LINES`]);
/// returns whether there were any.
fn print_problems(report: &VerifyReport) -> bool {
    let problems: Vec<_> = report.files.iter().filter(|c| c.state != FileState::Verified).collect();
    for check in problems.iter().take(MAX_PROBLEM_LINES) {
        match &check.state {
            FileState::Verified => {}
            FileState::Missing => println!("  missing  {}", check.path.display()),
            FileState::Mismatch { actual } => {
                println!("  CORRUPT  {}: sha256 expected {}, found {actual}", check.path.display(), check.expected)
            }
        }
    }
    if problems.len() > MAX_PROBLEM_LINES {
        println!("  ... and {} more", problems.len() - MAX_PROBLEM_LINES);
    }
    !problems.is_empty()
}

fn verify_one(entry: &Entry, dir: &Path) -> Result<()> {
    let folder = entry.folder(dir);
    if !folder.is_dir() {
        bail!(
            "{}: not fetched (no folder {}); `parvi data fetch {}` downloads it",
            entry.name,
            folder.display(),
            entry.name
        );
    }
    let report = verify(entry, dir)?;
    println!("{}: {} ({} of {} files verified)", entry.name, summary(&report), report.verified(), report.files.len());
    if print_problems(&report) {
        bail!(
            "{} failed verification; `parvi data fetch {}` replaces missing and corrupt files",
            entry.name,
            entry.name
        );
    }
    Ok(())
}

fn verify_all(registry: &Registry, dir: &Path) -> Result<()> {
    println!("data directory: {}", dir.display());
    let mut failed = Vec::new();
    for entry in registry.entries() {
        if !entry.folder(dir).is_dir() {
            println!("{}: not fetched", entry.name);
            continue;
        }
        let report = verify(entry, dir)?;
        println!(
            "{}: {} ({} of {} files verified)",
            entry.name,
            summary(&report),
            report.verified(),
            report.files.len()
        );
        if print_problems(&report) {
            failed.push(entry.name.as_str());
        }
    }
    if !failed.is_empty() {
        bail!("verification failed for: {}", failed.join(", "));
    }
    Ok(())
}

/// Fetches each entry. With `skip_unfetchable` (for "all"), a set that cannot be downloaded
/// is reported and skipped rather than failing the command.
fn fetch_entries(entries: &[&Entry], dir: &Path, base_url: Option<&str>, skip_unfetchable: bool) -> Result<()> {
    println!("data directory: {}", dir.display());
    for entry in entries {
        match fetch(entry, dir, base_url) {
            Ok(report) => println!(
                "{}: {} downloaded ({}), {} already verified",
                entry.name,
                report.downloaded.len(),
                human_bytes(report.bytes),
                report.already_verified.len()
            ),
            Err(e @ parvi_data::DataError::NotFetchable { .. }) if skip_unfetchable => {
                println!("{}: skipped: {e}", entry.name)
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn human_bytes(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.0} KiB", b as f64 / (1u64 << 10) as f64),
        b => format!("{b} B"),
    }
}

/// Prints `rows` under `headers` in aligned columns (`right[i]`: right-align column i).
fn print_table(headers: &[&str], right: &[bool], rows: &[Vec<String>]) {
    let widths: Vec<usize> = (0..headers.len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).chain([headers[i].len()]).max().unwrap_or(0))
        .collect();
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .zip(right)
            .map(|((cell, &w), &r)| if r { format!("{cell:>w$}") } else { format!("{cell:<w$}") })
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}
