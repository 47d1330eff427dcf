//! How true is a particle posterior's uncertainty? On the main job's toy regression (y = x^3 +
//! N(0, 9), 20 training points in [-4, 4], 100 test points over [-4, 4]) the same BNN (one
//! hidden layer of 50 ReLU units, lambda fixed at 1) is fitted by weight-space SVGD, a deep
//! ensemble, function-space particles (`fpovi`, the main job's default, and its kernel-density
//! variant) with the main job's protocol (20 particles, 2000 steps), and by NUTS (1000 warm-up,
//! 1000 draws), and each predictive is scored: 90% interval coverage, PIT calibration error,
//! test log-likelihood, and the mean epistemic sd on the test points and beyond the data
//! (`x` in [-6, -4.5] and [4.5, 6], `epistemic_sd.outside` of `bnn_summary.json`).
//!
//! `cargo run --release --example calibration_toy`

use parvi::cli::bnn_run::{BNN_METHOD, EpistemicSd, ProtocolArgs, SplitScore, fit_split};
use parvi::models::BnnTask;
use parvi_data::{DevSplit, prepare};

fn main() -> anyhow::Result<()> {
    let device = parvi::model::BackendKind::Flex.device()?;
    let ds = parvi_data::synthetic::toy_regression(1);
    let data = prepare(&ds, 0, DevSplit::None)?;
    println!(
        "| method | draws | 90% coverage | calibration error | test LL | epistemic sd inside | outside | outside / inside | ms/step |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let runs: [(&str, &str, &[&str]); 5] = [
        ("svgd (weight space)", "svgd", &[]),
        ("ensemble", "ensemble", &[]),
        ("fpovi, kernel density", "fpovi", &["repulsion=kde"]),
        ("fpovi (main job)", BNN_METHOD, &[]),
        ("nuts (1000 warm-up)", "nuts", &[]),
    ];
    for (label, method, opts) in runs {
        let args = ProtocolArgs {
            method: Some(method.into()),
            opt: opts.iter().map(|s| s.to_string()).collect(),
            ..ProtocolArgs::default()
        };
        let mut protocol = args.protocol(&ds.name, true, BNN_METHOD)?;
        protocol.fixed_lambda = Some(1.0);
        let fit = fit_split(&data, &protocol, BnnTask::Regression, &device, false, &None)?;
        let SplitScore::Regression { score, calibration: Some(cal) } = &fit.score else {
            anyhow::bail!("{label}: no regression score on the test rows");
        };
        let e = EpistemicSd::of(&fit, &data, true, &device).expect("a regression fit");
        let outside = e.outside.expect("the toy's outside grid");
        println!(
            "| {label} | {} | {:.2} | {:.3} | {:.3} | {:.2} | {:.2} | {:.1} | {:.3} |",
            fit.particles.len(),
            cal.coverage_90,
            cal.calibration_error,
            score.ll,
            e.test,
            outside,
            outside / e.test,
            parvi::infer::core::ms_per_step(fit.seconds, fit.steps_run),
        );
    }
    Ok(())
}
