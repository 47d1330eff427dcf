//! `parvi bnn` (and `parvi` with no arguments): a BNN posterior on the built-in 1-D toy
//! regression, or on a UCI split with `--dataset`; writes the scores and, for 1-D inputs, a plot
//! of the predictive mean with +-2 standard deviation bands over the data.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use parvi_data::{DevSplit, Prepared, prepare};
use parvi_model::tensor_ops::{matrix_from_vec, to_vec_f32};
use serde::Serialize;

use super::bnn_run::{BnnFit, BnnProtocol, ProtocolArgs, fit_split};
use super::{plot, write_atomic};

#[derive(Args, Debug, Clone)]
pub struct BnnArgs {
    /// UCI data set (name or alias); without it, the built-in toy regression
    /// (x ~ U(-4, 4), y = x^3 + N(0, 9), 20 training points).
    #[arg(long)]
    pub dataset: Option<String>,
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
    /// Output directory.
    #[arg(long, default_value = "out")]
    pub out: PathBuf,
}

impl Default for BnnArgs {
    fn default() -> Self {
        Self { dataset: None, split: 0, lambda: None, protocol: ProtocolArgs::default(), out: "out".into() }
    }
}

#[derive(Serialize)]
struct BnnSummary {
    dataset: String,
    split: usize,
    backend: String,
    protocol: BnnProtocol,
    test_rmse: f64,
    test_ll: f64,
    seconds: f64,
    /// The engine's report at the end of the run.
    engine: serde_json::Value,
}

pub fn run(args: BnnArgs) -> Result<()> {
    let device = args.protocol.device()?;
    let toy = args.dataset.is_none();
    let ds = match &args.dataset {
        Some(name) => parvi_data::load(name, &parvi_data::data_dir(args.protocol.data_dir.as_deref()))?,
        None => parvi_data::synthetic::toy_regression(args.protocol.seed),
    };
    if ds.task != parvi_data::Task::Regression {
        anyhow::bail!("data set `{}` is a {} task; the BNN needs regression", ds.name, ds.task);
    }
    let data = prepare(&ds, args.split, if args.dataset.is_some() { DevSplit::Reference } else { DevSplit::None })?;
    let protocol = BnnProtocol {
        fixed_lambda: args.lambda.or(if toy { Some(1.0) } else { None }),
        ..args.protocol.protocol(&ds.name, toy)?
    };
    let fit = fit_split(&data, &protocol, &device, true)?;
    std::fs::create_dir_all(&args.out).with_context(|| format!("cannot create {}", args.out.display()))?;
    let summary = BnnSummary {
        dataset: ds.name.clone(),
        split: args.split,
        backend: args.protocol.backend.clone().unwrap_or_else(|| parvi_model::BackendKind::DEFAULT.name().into()),
        protocol,
        test_rmse: fit.score.rmse,
        test_ll: fit.score.ll,
        seconds: fit.seconds,
        engine: fit.engine.clone(),
    };
    write_atomic(&args.out.join("bnn_summary.json"), &serde_json::to_vec_pretty(&summary)?)?;
    let mut wrote = vec!["bnn_summary.json"];
    if data.features == 1 {
        plot_bands(&data, &fit, &device, &args.out.join("bnn_predictive.svg"))?;
        wrote.push("bnn_predictive.svg");
    }
    println!(
        "BNN ({}) on {} split {}: test RMSE {:.4}, test LL {:.4}, {:.2} s; wrote {} in {}",
        summary.protocol.method,
        ds.name,
        args.split,
        fit.score.rmse,
        fit.score.ll,
        fit.seconds,
        wrote.join(", "),
        args.out.display()
    );
    Ok(())
}

/// Predictive mean and +-2 sd (particle spread plus noise) on a grid over the inputs.
fn plot_bands(data: &Prepared, fit: &BnnFit, device: &burn::tensor::Device, path: &std::path::Path) -> Result<()> {
    let to_x = |v: f64| v * data.norm.x_std[0] + data.norm.x_mean[0];
    let xs: Vec<f64> = data.x_train.iter().chain(&data.x_test).copied().collect();
    let (lo, hi) = xs.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| (a.min(v), b.max(v)));
    let pad = 0.15 * (hi - lo);
    let grid: Vec<f64> = (0..200).map(|i| lo - pad + (hi - lo + 2.0 * pad) * i as f64 / 199.0).collect();
    let x = matrix_from_vec(grid.iter().map(|&v| v as f32).collect(), grid.len(), 1, device);
    let pred = to_vec_f32(&fit.model.forward(fit.particles.positions.clone(), x));
    let n = fit.particles.len();
    let noise: f64 = fit.precisions.iter().map(|p| 1.0 / p).sum::<f64>() / n as f64;
    let bands: Vec<(f64, f64, f64)> = grid
        .iter()
        .enumerate()
        .map(|(r, &g)| {
            let ys: Vec<f64> =
                pred[r * n..(r + 1) * n].iter().map(|&p| data.norm.y_to_original(f64::from(p))).collect();
            let mean = ys.iter().sum::<f64>() / n as f64;
            let var = ys.iter().map(|y| (y - mean).powi(2)).sum::<f64>() / n as f64 + noise;
            (to_x(g), mean, 2.0 * var.sqrt())
        })
        .collect();
    let train: Vec<(f64, f64)> =
        data.x_train.iter().zip(&data.y_train).map(|(&x, &y)| (to_x(x), data.norm.y_to_original(y))).collect();
    plot::predictive_bands(path, &bands, &train, "BNN posterior predictive (mean +- 2 sd)")
}
