//! `parvi bnn` (and `parvi` with no arguments): a BNN posterior on the built-in 1-D toy
//! regression, or on a UCI split with `--dataset`; writes the scores and, for 1-D inputs, a plot
//! of the predictive mean with +-2 standard deviation bands over the data.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use parvi_data::{DevSplit, Prepared, prepare};
use parvi_model::tensor_ops::{matrix_from_vec, to_vec_f32};
use serde::Serialize;

use parvi_data::Task;
use parvi_models::BnnTask;
use parvi_models::predictive::{ClassCalibration, RegressionCalibration, RegressionPredictive};

use super::bnn_run::{
    BNN_METHOD, BnnFit, BnnProtocol, DISTRIBUTED_METHOD, EpistemicSd, ProtocolArgs, SplitCheckpoint, SplitScore,
    fit_split, test_mixture,
};
use super::distributed::{Group, communication_ms_per_step, is_lead, launch, parse_shard};
use super::{plot, write_atomic};
use parvi_infer::core::shard::ShardBy;

#[derive(Args, Debug, Clone)]
pub struct BnnArgs {
    /// UCI data set (name or alias); without it (and without `--csv`), the built-in toy
    /// regression (x ~ U(-4, 4), y = x^3 + N(0, 9), 20 training points).
    #[arg(long, conflicts_with = "csv")]
    pub dataset: Option<String>,
    /// Your own table: a CSV file with a header row (needs `--target`).
    #[arg(long, value_name = "FILE", requires = "target")]
    pub csv: Option<PathBuf>,
    /// The CSV column to predict.
    #[arg(long, value_name = "COLUMN")]
    pub target: Option<String>,
    /// The CSV feature columns, comma-separated [default: every column but the target].
    #[arg(long, value_name = "A,B,C", value_delimiter = ',')]
    pub features: Option<Vec<String>>,
    /// Fraction of the CSV's rows held out for testing (a seeded shuffle, `--seed`).
    #[arg(long, default_value_t = 0.1)]
    pub test_fraction: f64,
    /// With `--csv`: your own held-out rows instead of a random fraction, a CSV file with the
    /// training file's feature and target columns (matched by name; other columns ignored).
    /// Normalisation comes from the training file's rows alone.
    #[arg(long, value_name = "FILE", requires = "csv", conflicts_with = "test_fraction")]
    pub test_csv: Option<PathBuf>,
    /// Drop CSV rows with a missing value in a used column instead of refusing the file.
    #[arg(long)]
    pub drop_missing: bool,
    /// For `--csv`: regression (a numeric target) or classification (the target's distinct
    /// values are the classes). A UCI data set's task comes from the registry.
    #[arg(long, default_value = "regression", value_parser = ["regression", "classification"])]
    pub task: String,
    /// Save the posterior (particles, architecture, features, normalisation, classes, method)
    /// for `parvi predict`.
    #[arg(long, value_name = "FILE")]
    pub save_posterior: Option<PathBuf>,
    /// Write OUT/checkpoint.json every K steps.
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u64).range(1..))]
    pub checkpoint_every: Option<u64>,
    /// Continue from a checkpoint written by an earlier run with the same data and settings.
    #[arg(long, value_name = "FILE")]
    pub resume: Option<PathBuf>,
    /// Which standard split of the data set.
    #[arg(long, default_value_t = 0)]
    pub split: usize,
    /// Fix the weight prior's precision lambda instead of sampling it. The toy regression
    /// (20 points) needs it: with a sampled lambda its particles collapse to the flat predictor.
    /// [default: 1 on the toy, sampled on UCI data]
    #[arg(long)]
    pub lambda: Option<f64>,
    #[command(flatten)]
    pub protocol: ProtocolArgs,
    /// Share the particles among the processes of an MPI job (`mpirun -np K parvi bnn ...
    /// --distributed`; needs the `mpi` feature): the particles of one process, rank 0 prints
    /// and writes.
    #[arg(long)]
    pub distributed: bool,
    /// With `--distributed`: share the `particles` among the ranks (every rank holds all data
    /// rows), or the data `rows` (each rank holds its contiguous share of the training rows and
    /// scores every particle on them; the scores are summed, docs/distributed.md).
    #[arg(long, default_value = "particles", value_parser = parse_shard)]
    pub shard: ShardBy,
    /// Output directory.
    #[arg(long, default_value = "out")]
    pub out: PathBuf,
}

impl Default for BnnArgs {
    fn default() -> Self {
        Self {
            dataset: None,
            csv: None,
            target: None,
            features: None,
            test_fraction: 0.1,
            test_csv: None,
            drop_missing: false,
            task: "regression".into(),
            save_posterior: None,
            checkpoint_every: None,
            resume: None,
            split: 0,
            lambda: None,
            protocol: ProtocolArgs::default(),
            distributed: false,
            shard: ShardBy::Particles,
            out: "out".into(),
        }
    }
}

#[derive(Serialize)]
struct BnnSummary {
    dataset: String,
    /// The standard split of a UCI data set (or 0 on the toy); absent for `--csv`, whose test
    /// rows `held_out` describes.
    #[serde(skip_serializing_if = "Option::is_none")]
    split: Option<usize>,
    /// Where the test rows came from: `split 3`, `seed 1, 10% held out`, or `test file B.csv`.
    held_out: String,
    /// `--test-csv`: the test file's path.
    #[serde(skip_serializing_if = "Option::is_none")]
    test_csv: Option<PathBuf>,
    backend: String,
    protocol: BnnProtocol,
    /// Rows used for training and testing, and the CSV rows dropped for missing values.
    rows: RowCounts,
    /// The feature columns, in the model's order.
    features: Vec<String>,
    /// The training statistics every input was normalised with.
    normalisation: parvi_data::Normalizer,
    /// Regression: test RMSE and log-likelihood.
    #[serde(skip_serializing_if = "Option::is_none")]
    test_rmse: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    test_ll: Option<f64>,
    /// Regression: calibration of the test predictive.
    #[serde(skip_serializing_if = "Option::is_none")]
    calibration: Option<RegressionCalibration>,
    /// Regression: the mean epistemic sd over the test rows and (toy) beyond the training range.
    #[serde(skip_serializing_if = "Option::is_none")]
    epistemic_sd: Option<EpistemicSd>,
    /// Classification: class names, and accuracy, log-likelihood, Brier score and ECE.
    #[serde(skip_serializing_if = "Option::is_none")]
    classes: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    classification: Option<ClassCalibration>,
    /// The saved posterior, if asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    posterior: Option<PathBuf>,
    seconds: f64,
    /// Wall milliseconds per step of this process's run.
    ms_per_step: f64,
    /// Processes that shared the particles (1 without `--distributed`).
    ranks: usize,
    /// Of `ms_per_step`, the time rank 0 spent in the all-gathers (waiting for the slowest rank
    /// included); absent without `--distributed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    communication_ms_per_step: Option<f64>,
    /// The engine's report at the end of the run.
    engine: serde_json::Value,
    /// What the diagnostics warned about (also printed); empty when they passed.
    warnings: Vec<String>,
}

#[derive(Serialize)]
struct RowCounts {
    train: usize,
    development: usize,
    test: usize,
    dropped_for_missing_values: usize,
}

pub fn run(args: BnnArgs) -> Result<()> {
    let distributed = args.distributed;
    launch(distributed, |group| run_with(args, group))
}

/// The run, in this process alone or as one rank of `group`.
fn run_with(args: BnnArgs, group: Group) -> Result<()> {
    let lead = is_lead(&group);
    let distributed = args.distributed;
    let device = args.protocol.device()?;
    let toy = args.dataset.is_none() && args.csv.is_none();
    let (ds, feature_names, target, classes, dropped) = match (&args.dataset, &args.csv) {
        (Some(name), _) => {
            let ds = parvi_data::load(name, &parvi_data::data_dir(args.protocol.data_dir.as_deref()))?;
            let names = (1..=ds.features).map(|i| format!("x{i}")).collect();
            let classes = (ds.task == Task::Classification).then(|| vec!["0".to_string(), "1".to_string()]);
            (ds, names, None, classes, 0)
        }
        (None, Some(path)) => {
            let task = if args.task == "classification" { Task::Classification } else { Task::Regression };
            let spec = parvi_data::TableSpec {
                target: args.target.clone(),
                features: args.features.clone(),
                task,
                drop_missing: args.drop_missing,
                classes: None,
            };
            let table = parvi_data::read_table(path, &spec)?;
            let (names, mut dropped) = (table.feature_names.clone(), table.dropped.len());
            let (target, classes) = (table.target_name.clone(), table.class_names.clone());
            let name = path.file_stem().map_or("table".into(), |s| s.to_string_lossy().into_owned());
            let ds = match &args.test_csv {
                Some(test_path) => {
                    // The test file's columns are matched by name against the training file's.
                    let test = parvi_data::read_table(
                        test_path,
                        &parvi_data::TableSpec::for_test_of(&table, args.drop_missing),
                    )?;
                    dropped += test.dropped.len();
                    table.into_dataset_with_test(test, &name, args.protocol.seed)?
                }
                None => table.into_dataset(&name, args.test_fraction, args.protocol.seed)?,
            };
            (ds, names, target, classes, dropped)
        }
        (None, None) => {
            (parvi_data::synthetic::toy_regression(args.protocol.seed), vec!["x".to_string()], None, None, 0)
        }
    };
    let task = match &classes {
        Some(c) => BnnTask::Classification { classes: c.len() },
        None => BnnTask::Regression,
    };
    let split = if args.csv.is_some() { 0 } else { args.split };
    // What the messages and the summary call the test rows.
    let held_out = match (&args.csv, &args.test_csv) {
        (Some(_), Some(test)) => format!("test file {}", test.display()),
        (Some(_), None) => format!("seed {}, {}% held out", args.protocol.seed, percent(args.test_fraction)),
        (None, _) => format!("split {split}"),
    };
    let data = prepare(&ds, split, if toy { DevSplit::None } else { DevSplit::Reference })?;
    if args.csv.is_some() && lead {
        println!(
            "{}: {} rows for training ({} of them the development set), {} for testing ({held_out}){}; features {}",
            ds.name,
            data.n_train() + data.n_dev(),
            data.n_dev(),
            data.n_test(),
            if dropped > 0 { format!(", {dropped} dropped for missing values") } else { String::new() },
            feature_list(&feature_names, &data.norm)
        );
    }
    let protocol = BnnProtocol {
        fixed_lambda: args.lambda.or(if toy { Some(1.0) } else { None }),
        checkpoint: SplitCheckpoint {
            policy: args.checkpoint_every.map(|every| parvi_infer::CheckpointPolicy {
                path: args.out.join("checkpoint.json"),
                every: usize::try_from(every).unwrap_or(usize::MAX),
            }),
            resume: args.resume.clone(),
            source: format!("{} {held_out}", ds.name),
        },
        shard: args.shard,
        ..args.protocol.protocol(&ds.name, toy, if distributed { DISTRIBUTED_METHOD } else { BNN_METHOD })?
    };
    let fit = fit_split(&data, &protocol, task, &device, true, &group)?;
    if !lead {
        return Ok(());
    }
    std::fs::create_dir_all(&args.out).with_context(|| format!("cannot create {}", args.out.display()))?;
    if let Some(path) = &args.save_posterior {
        fit.posterior(&data, &protocol, &feature_names, target.as_deref(), classes.as_deref())?.save(path)?;
    }
    let (regression, classification) = match &fit.score {
        SplitScore::Regression { score, calibration } => (Some((*score, calibration.clone())), None),
        SplitScore::Classification(c) => (None, Some(c.clone())),
    };
    let summary = BnnSummary {
        dataset: ds.name.clone(),
        split: args.csv.is_none().then_some(split),
        held_out: held_out.clone(),
        test_csv: args.test_csv.clone(),
        rows: RowCounts {
            train: data.n_train(),
            development: data.n_dev(),
            test: data.n_test(),
            dropped_for_missing_values: dropped,
        },
        features: feature_names.clone(),
        normalisation: data.norm.clone(),
        backend: args.protocol.backend.clone().unwrap_or_else(|| parvi_model::BackendKind::DEFAULT.name().into()),
        protocol,
        test_rmse: regression.as_ref().map(|r| r.0.rmse),
        test_ll: regression.as_ref().map(|r| r.0.ll),
        calibration: regression.as_ref().and_then(|r| r.1.clone()),
        epistemic_sd: EpistemicSd::of(&fit, &data, toy, &device),
        classes: classes.clone(),
        classification: classification.clone(),
        posterior: args.save_posterior.clone(),
        seconds: fit.seconds,
        ms_per_step: parvi_infer::core::ms_per_step(fit.seconds, fit.steps_run),
        ranks: group.as_ref().map_or(1, |c| c.size()),
        communication_ms_per_step: communication_ms_per_step(&group, fit.steps_run),
        engine: fit.engine.clone(),
        warnings: fit.warnings.clone(),
    };
    write_atomic(&args.out.join("bnn_summary.json"), &serde_json::to_vec_pretty(&summary)?)?;
    let mut wrote = vec!["bnn_summary.json"];
    if data.features == 1 && regression.is_some() {
        let truth = toy.then_some(parvi_data::synthetic::toy_regression_truth as fn(f64) -> f64);
        let drawn = plot_bands(
            &data,
            &fit,
            &device,
            &feature_names[0],
            &summary.protocol.method,
            // The toy's plot spans the outside grid of `epistemic_sd.outside` too.
            ToyOverlay { truth, span: toy.then_some((-6.0, 6.0)) },
            &args.out.join("bnn_predictive.svg"),
        )?;
        if drawn {
            wrote.push("bnn_predictive.svg");
        }
    }
    if let Some(calibration) = &summary.calibration {
        plot::reliability(
            &args.out.join("bnn_calibration.svg"),
            &calibration.curve,
            &format!("Calibration on the test rows (90% interval covers {:.0}%)", 100.0 * calibration.coverage_90),
            "predictive CDF level p",
            "fraction of test targets below the p-quantile",
        )?;
        wrote.push("bnn_calibration.svg");
    }
    if let Some(c) = &classification {
        let bins: Vec<(f64, f64)> = c.bins.iter().map(|&(confidence, accuracy, _)| (confidence, accuracy)).collect();
        plot::reliability(
            &args.out.join("bnn_calibration.svg"),
            &bins,
            &format!("Reliability on the test rows (ECE {:.3})", c.ece),
            "confidence of the predicted class",
            "accuracy",
        )?;
        wrote.push("bnn_calibration.svg");
    }
    let scores = match (&regression, &classification) {
        (Some((score, calibration)), _) => format!(
            "test RMSE {:.4}, test LL {:.4}, 90% interval coverage {}{}",
            score.rmse,
            score.ll,
            calibration.as_ref().map_or("-".into(), |c| format!("{:.2}", c.coverage_90)),
            summary.epistemic_sd.map_or(String::new(), |e| format!(
                ", epistemic sd {:.3} on the test rows{}",
                e.test,
                e.outside.map_or(String::new(), |o| format!(", {o:.3} beyond the data"))
            ))
        ),
        (_, Some(c)) => format!(
            "test accuracy {:.4}, test LL {:.4}, Brier {:.4}, ECE {:.4}",
            c.accuracy, c.log_likelihood, c.brier, c.ece
        ),
        _ => String::new(),
    };
    let ranks = match summary.communication_ms_per_step {
        Some(comm) => format!(" on {} ranks, {comm:.3} ms/step communicating", summary.ranks),
        None => String::new(),
    };
    println!(
        "BNN ({}) on {} ({held_out}): {scores}, {:.2} s ({:.3} ms/step{ranks}); wrote {} in {}{}",
        summary.protocol.method,
        ds.name,
        fit.seconds,
        summary.ms_per_step,
        wrote.join(", "),
        args.out.display(),
        args.save_posterior.as_ref().map_or(String::new(), |p| format!("; saved the posterior to {}", p.display()))
    );
    Ok(())
}

/// A fraction as a percentage with at most two decimals and no trailing zeros: `0.1` is `10`
/// (not `10.000000000000002`), `0.125` is `12.5`.
fn percent(fraction: f64) -> String {
    let text = format!("{:.2}", 100.0 * fraction);
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Features printed in full at the start of a run; past this many, the first few and a count
/// (64 pixel columns made a 4,000-character line). `bnn_summary.json` keeps the full list.
const FEATURES_PRINTED: usize = 10;

/// The feature columns with their training mean and sd, abbreviated past [`FEATURES_PRINTED`].
fn feature_list(names: &[String], norm: &parvi_data::Normalizer) -> String {
    let shown = if names.len() > FEATURES_PRINTED { 5 } else { names.len() };
    let mut list: Vec<String> = names
        .iter()
        .zip(norm.x_mean.iter().zip(&norm.x_std))
        .take(shown)
        .map(|(f, (m, s))| format!("{f} (mean {m:.4}, sd {s:.4})"))
        .collect();
    if names.len() > shown {
        list.push(format!("... and {} more (all in bnn_summary.json)", names.len() - shown));
    }
    list.join(", ")
}

/// What the main plot adds on the built-in toy: the true function and the span of its grid.
struct ToyOverlay {
    truth: Option<fn(f64) -> f64>,
    span: Option<(f64, f64)>,
}

/// The predictive over a grid spanning the inputs: mean, the total 90% interval (the mixture's
/// 5% and 95% quantiles) and the epistemic band (the particles' means' 5% and 95% quantiles).
/// `false` when nothing on the grid was finite and no picture was written (said as a warning).
fn plot_bands(
    data: &Prepared,
    fit: &BnnFit,
    device: &burn::tensor::Device,
    feature: &str,
    method: &str,
    overlay: ToyOverlay,
    path: &std::path::Path,
) -> Result<bool> {
    let grid_len = 200;
    let ToyOverlay { truth, span } = overlay;
    let to_x = |v: f64| v * data.norm.x_std[0] + data.norm.x_mean[0];
    let from_x = |v: f64| (v - data.norm.x_mean[0]) / data.norm.x_std[0];
    let xs: Vec<f64> = data.x_train.iter().chain(&data.x_dev).chain(&data.x_test).copied().collect();
    let (lo, hi) = match span {
        Some((a, b)) => (from_x(a), from_x(b)),
        None => {
            let (lo, hi) = xs.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| (a.min(v), b.max(v)));
            let pad = 0.15 * (hi - lo);
            (lo - pad, hi + pad)
        }
    };
    let grid: Vec<f64> = (0..grid_len).map(|i| lo + (hi - lo) * f64::from(i) / f64::from(grid_len - 1)).collect();
    let x = matrix_from_vec(grid.iter().map(|&v| v as f32).collect(), grid.len(), 1, device);
    let pred = to_vec_f32(&fit.model.forward(fit.particles.positions.clone(), x));
    let weights = fit.particles.weights.as_ref().map(parvi_model::tensor_ops::to_vec_f64);
    let n = fit.particles.len();
    let mixture =
        test_mixture(&pred, n, &fit.precisions, weights.as_deref(), data.norm.y_mean, data.norm.y_std, device);
    let predictive = RegressionPredictive::of_mixture(&mixture);
    // The 5% and 95% quantiles of the particles' network means: `mean +- 1.645 sd` would
    // assume them Gaussian, and with 20 skewed particles it stuck out of the total interval.
    let (epistemic_lo, epistemic_hi) = (mixture.mean_quantile(0.05), mixture.mean_quantile(0.95));
    let points = |x: &[f64], y: &[f64]| -> Vec<(f64, f64)> {
        x.iter().zip(y).map(|(&x, &y)| (to_x(x), data.norm.y_to_original(y))).collect()
    };
    let mut train = points(&data.x_train, &data.y_train);
    train.extend(points(&data.x_dev, &data.y_dev));
    let grid: Vec<f64> = grid.into_iter().map(to_x).collect();
    let non_finite = plot::predictive_bands(
        path,
        &plot::PredictivePlot {
            title: &format!("BNN posterior predictive ({method}, {n} particles)"),
            x_label: feature,
            y_label: "y",
            grid: &grid,
            mean: &predictive.mean,
            total: (&predictive.quantiles[0], &predictive.quantiles[2]),
            epistemic: (&epistemic_lo, &epistemic_hi),
            truth,
            train: &train,
            test: &points(&data.x_test, &data.y_test),
        },
    )?;
    // The run's own warnings (convergence, a flat predictor) say why; the scores are written.
    if non_finite == grid.len() {
        eprintln!(
            "warning: the predictive is not finite at any of the plot's {grid_len} inputs (a diverged run?): \
             {} not drawn",
            path.display()
        );
        return Ok(false);
    }
    if non_finite > 0 {
        eprintln!(
            "warning: the predictive is not finite at {non_finite} of the plot's {grid_len} inputs \
             (a diverged run?): drawn at the edge of {}",
            path.display()
        );
    }
    Ok(true)
}
