//! `parvi bench uci`: the BNN benchmark on the standard UCI splits, mean +- standard error over
//! splits (the PBP and SVGD papers' convention).

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use parvi_data::{DevSplit, Task, prepare};
use parvi_models::predictive::RegressionCalibration;
use serde::Serialize;

use super::bnn_run::{BnnProtocol, ProtocolArgs, UCI_METHOD, fit_split};
use super::write_atomic;

#[derive(Args, Debug)]
pub struct UciArgs {
    /// Data set name or alias (boston, concrete, energy, kin8nm, naval, power-plant, protein,
    /// wine, yacht), or `all` for every regression set.
    #[arg(long)]
    pub dataset: String,
    /// `all`, the number of splits to run (the first K), or a range `A..B` of split indices
    /// (half-open, e.g. `5..20`: long protocols can be run in parts and merged).
    #[arg(long, default_value = "all")]
    pub splits: String,
    /// Early stopping: score the development split every K steps and keep the best particles.
    #[arg(long, value_name = "K")]
    pub eval_every: Option<usize>,
    /// Also run the gap splits (Foong et al. 2019: per input feature, the middle third of the
    /// rows sorted by it held out) and report them beside the standard splits.
    #[arg(long)]
    pub gap: bool,
    /// Which gap splits (one per feature, in feature order) with `--gap`: `all`, the first K, or
    /// a range `A..B`.
    #[arg(long, default_value = "all", requires = "gap")]
    pub gap_splits: String,
    /// With `--gap`, skip the standard splits.
    #[arg(long, requires = "gap")]
    pub gap_only: bool,
    #[command(flatten)]
    pub protocol: ProtocolArgs,
    /// Write per-split results and summaries as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
pub struct SplitRow {
    pub split: usize,
    pub rmse: f64,
    pub ll: f64,
    /// Fraction of test rows inside the central 90% predictive interval.
    pub coverage_90: f64,
    /// Mean gap between the test PIT's CDF and the uniform's (see `parvi_models::predictive`).
    pub calibration_error: f64,
    pub seconds: f64,
    /// Steps run and the size of the particle set used for prediction (a trace's draws, or a
    /// greedy method's particles reached under a time budget).
    pub steps: usize,
    pub particles: usize,
    /// The engine's report at the end of the split.
    pub engine: serde_json::Value,
}

#[derive(Debug, Serialize)]
pub struct DatasetResult {
    pub dataset: String,
    /// `standard` (the data set's own splits) or `gap` (Foong et al.'s, one per feature).
    pub splits_kind: &'static str,
    pub method: String,
    pub protocol: BnnProtocol,
    pub splits: Vec<SplitRow>,
    pub rmse_mean: f64,
    pub rmse_se: f64,
    pub ll_mean: f64,
    pub ll_se: f64,
    pub coverage_90_mean: f64,
    pub calibration_error_mean: f64,
    pub seconds: f64,
}

fn mean_se(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 {
        return (mean, 0.0);
    }
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, (var / n).sqrt())
}

/// The split indices `spec` names among `available`: `all`, the first `K`, or `A..B`; an error
/// names the flag `flag` (`--splits`, `--gap-splits`) it came from.
fn split_range(flag: &str, spec: &str, available: usize) -> Result<std::ops::Range<usize>> {
    let bad = |why: &str| anyhow::anyhow!("invalid setting `{flag}`: {why}, got `{spec}`");
    if spec == "all" {
        return Ok(0..available);
    }
    if let Some((a, b)) = spec.split_once("..") {
        let (a, b): (usize, usize) = (
            a.trim().parse().map_err(|_| bad("expected a range `A..B` of split indices"))?,
            b.trim().parse().map_err(|_| bad("expected a range `A..B` of split indices"))?,
        );
        if a >= b {
            return Err(bad("the range `A..B` must be non-empty (A < B)"));
        }
        if b > available {
            return Err(bad(&format!("the range ends at split {b}, but the data set has {available} splits")));
        }
        return Ok(a..b);
    }
    match spec.parse::<usize>() {
        Ok(k) if k > available => Err(bad(&format!("{k} splits asked for, but the data set has {available}"))),
        Ok(k) if k >= 1 => Ok(0..k),
        _ => Err(bad("expected `all`, a positive count or a range `A..B`")),
    }
}

pub fn run(args: UciArgs) -> Result<()> {
    let device = args.protocol.device()?;
    let data_dir = parvi_data::data_dir(args.protocol.data_dir.as_deref());
    let registry = parvi_data::Registry::builtin();
    let entries: Vec<&parvi_data::Entry> = if args.dataset == "all" {
        registry.entries().iter().filter(|e| e.task == Task::Regression).collect()
    } else {
        vec![registry.resolve(&args.dataset)?]
    };
    // Every data set's `--splits` is checked before the first run, not after hours of others.
    for entry in &entries {
        split_range("--splits", &args.splits, entry.splits)
            .map_err(|e| anyhow::anyhow!("data set `{}`: {e}", entry.name))?;
    }
    let names: Vec<String> = entries.iter().map(|e| e.name.clone()).collect();
    let mut results = Vec::new();
    for name in names {
        let ds = parvi_data::load(&name, &data_dir)?;
        if ds.task != Task::Regression {
            bail!("data set `{name}` is a {} task; the BNN harness needs regression", ds.task);
        }
        let protocol = BnnProtocol { eval_every: args.eval_every, ..args.protocol.protocol(&name, false, UCI_METHOD)? };
        if !args.gap_only {
            let splits = split_range("--splits", &args.splits, ds.splits.len())?;
            results.push(run_splits(&ds, "standard", splits, &protocol, &device)?);
        }
        if args.gap {
            let gap = ds.with_gap_splits();
            let splits = split_range("--gap-splits", &args.gap_splits, gap.splits.len())
                .map_err(|e| anyhow::anyhow!("data set `{name}` (gap splits, one per feature): {e}"))?;
            results.push(run_splits(&gap, "gap", splits, &protocol, &device)?);
        }
    }
    println!("| dataset | method | splits | test RMSE | test LL | 90% coverage | calibration error | seconds |");
    println!("|---|---|---|---|---|---|---|---|");
    for r in &results {
        println!(
            "| {} | {} | {}{} | {:.3} +- {:.3} | {:.3} +- {:.3} | {:.3} | {:.3} | {:.1} |",
            r.dataset,
            r.method,
            if r.splits_kind == "gap" { "gap " } else { "" },
            r.splits.len(),
            r.rmse_mean,
            r.rmse_se,
            r.ll_mean,
            r.ll_se,
            r.coverage_90_mean,
            r.calibration_error_mean,
            r.seconds
        );
    }
    if let Some(path) = &args.json {
        let value =
            if results.len() == 1 { serde_json::to_value(&results[0])? } else { serde_json::to_value(&results)? };
        write_atomic(path, &serde_json::to_vec_pretty(&value)?)?;
    }
    Ok(())
}

/// Runs `protocol` on `splits` of `ds` and summarises them (mean +- standard error).
fn run_splits(
    ds: &parvi_data::Dataset,
    kind: &'static str,
    splits: std::ops::Range<usize>,
    protocol: &BnnProtocol,
    device: &burn::tensor::Device,
) -> Result<DatasetResult> {
    let name = &ds.name;
    let mut rows = Vec::with_capacity(splits.len());
    for split in splits {
        let data = prepare(ds, split, DevSplit::Reference)?;
        let fit = fit_split(&data, protocol, parvi_models::BnnTask::Regression, device, true, &None)
            .with_context(|| format!("data set `{name}`, {kind} split {split}"))?;
        let (score, calibration) = fit.regression()?;
        let calibration = calibration.cloned().unwrap_or(RegressionCalibration {
            coverage_90: f64::NAN,
            calibration_error: f64::NAN,
            curve: Vec::new(),
        });
        eprintln!(
            "{name} {kind} split {split}: rmse {:.4} ll {:.4} 90% coverage {:.3} ({:.2} s, {} steps, {} particles)",
            score.rmse,
            score.ll,
            calibration.coverage_90,
            fit.seconds,
            fit.steps,
            fit.particles.len()
        );
        rows.push(SplitRow {
            split,
            rmse: score.rmse,
            ll: score.ll,
            coverage_90: calibration.coverage_90,
            calibration_error: calibration.calibration_error,
            seconds: fit.seconds,
            steps: fit.steps,
            particles: fit.particles.len(),
            engine: fit.engine,
        });
    }
    let (rmse_mean, rmse_se) = mean_se(&rows.iter().map(|r| r.rmse).collect::<Vec<_>>());
    let (ll_mean, ll_se) = mean_se(&rows.iter().map(|r| r.ll).collect::<Vec<_>>());
    let seconds = rows.iter().map(|r| r.seconds).sum();
    let mean = |f: fn(&SplitRow) -> f64| rows.iter().map(f).sum::<f64>() / rows.len().max(1) as f64;
    let (coverage_90_mean, calibration_error_mean) = (mean(|r| r.coverage_90), mean(|r| r.calibration_error));
    Ok(DatasetResult {
        dataset: name.clone(),
        splits_kind: kind,
        method: protocol.method.clone(),
        protocol: protocol.clone(),
        splits: rows,
        rmse_mean,
        rmse_se,
        ll_mean,
        ll_se,
        coverage_90_mean,
        calibration_error_mean,
        seconds,
    })
}

#[cfg(test)]
mod tests {
    use super::split_range;

    #[test]
    fn splits_are_all_a_count_or_a_range() {
        assert_eq!(split_range("--splits", "all", 20).unwrap(), 0..20);
        assert_eq!(split_range("--splits", "5", 20).unwrap(), 0..5);
        assert_eq!(split_range("--splits", "20", 20).unwrap(), 0..20);
        assert_eq!(split_range("--splits", "5..20", 20).unwrap(), 5..20);
        for bad in ["0", "x", "5..5", "3..21", "a..4", "-1", "99"] {
            let err = split_range("--splits", bad, 20).unwrap_err().to_string();
            assert!(err.contains("--splits") && err.contains(bad), "{err}");
        }
        // Beyond the set's count: both numbers named.
        let err = split_range("--splits", "99", 20).unwrap_err().to_string();
        assert!(err.contains("99 splits") && err.contains("has 20"), "{err}");
        let err = split_range("--splits", "3..21", 20).unwrap_err().to_string();
        assert!(err.contains("split 21") && err.contains("20 splits"), "{err}");
        // A bad `--gap-splits` is named as that flag, not as `--splits`.
        let err = split_range("--gap-splits", "0", 6).unwrap_err().to_string();
        assert!(err.contains("`--gap-splits`"), "{err}");
    }
}
