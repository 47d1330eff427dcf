//! Issue 59, the frame verified: where the polish step's NUTS runs. On each posteriordb posterior
//! named, at seeds 1, 2 and 3, the default path with NUTS always in the Laplace frame
//! (`NutsFrame::Frame`) and always in the model's own coordinates (`NutsFrame::Own`, which records
//! both correlation condition numbers and which one the evidence would pick): NUTS's gradients a
//! chain, step size, the wall seconds of the whole fit, and the largest error of a reported
//! mean (reference sds) and |sd ratio - 1| against the posterior's reference draws. The
//! evidence rule (`NutsFrame::Evidence`, the default) runs exactly the run it picks, so its cost
//! is read off the row it picks.
//!
//! ```sh
//! cargo build --release --workspace --features wgpu,mpi --example frame_choice
//! target/release/examples/frame_choice ../shared/posteriordb nuts kidiq-kidscore_momiq arK-arK
//! ```
//!
//! The second argument is the polish kernel: `nuts` (NUTS from the check's chains: the evidence
//! is their 100 end points) or `auto` (the default: NUTS only where it takes over from chains
//! far from mixed, the evidence their kept draws).

use std::path::Path;
use std::time::Instant;

use parvi_infer::samplers::{PolishConfig, PolishKernel};
use parvi_infer::{AdapterConfig, EngineSpec, FitConfig, KernelConfig, MethodConfig, NutsFrame, fit_reported};
use parvi_model::BackendKind;
use parvi_model::burn::tensor::Tensor;
use parvi_model::tensor_ops::to_vec_f64;
use parvi_models::posteriordb::compare::compare;
use parvi_models::posteriordb::{self, ReferenceDraws};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, kernel, posteriors @ ..] = args.as_slice() else {
        return Err("usage: frame_choice <posteriordb dir> <nuts|auto> <posterior>...".into());
    };
    let kernel = match kernel.as_str() {
        "nuts" => PolishKernel::Nuts,
        "auto" => PolishKernel::Auto,
        other => return Err(format!("unknown kernel {other} (nuts or auto)").into()),
    };
    let device = BackendKind::Flex.device()?;
    let spec =
        EngineSpec::new(MethodConfig::default_for("svgd")?, KernelConfig::default(), AdapterConfig::adagrad(0.05));
    println!(
        "posterior | seed | coordinates | nuts gradients a chain | step | fit s | max mean error (sd) | max |sd ratio - 1| | condition frame / own | evidence picks"
    );
    for name in posteriors {
        let model = posteriordb::load(name, Path::new(dir), &device)?;
        let reference = ReferenceDraws::for_model(&model)?;
        let reported = |x: Tensor<2>| model.reported(x);
        for seed in 1..=3u64 {
            for rule in [NutsFrame::Frame, NutsFrame::Own] {
                let config = FitConfig {
                    seed,
                    progress: false,
                    nuts_frame: rule,
                    polish: Some(PolishConfig { kernel, ..PolishConfig::default() }),
                    ..FitConfig::default()
                };
                let started = Instant::now();
                let result = fit_reported(&model, Some(&reported), &spec, &config, &mut [], &device)?;
                let seconds = started.elapsed().as_secs_f64();
                let values = to_vec_f64(&model.reported(result.draws.positions.clone()));
                let values = reference.select(&values, model.param_names().len());
                let c = compare(reference.values(), &values, reference.params(), None)?;
                let worst_mean = c.mean_error_sd.iter().fold(0.0f64, |a, e| a.max(e.abs()));
                let worst_sd = c.sd_ratio.iter().fold(0.0f64, |a, r| a.max((r - 1.0).abs()));
                let polish = result.diagnostics.polish.as_ref();
                let nuts = polish.filter(|p| p.kernel == PolishKernel::Nuts);
                let (gradients, step) = nuts.map_or((String::from("-"), String::from("-")), |p| {
                    (p.steps.to_string(), format!("{:.3}", p.step_size))
                });
                let choice = nuts.and_then(|p| p.frame_choice.as_ref());
                let (conditions, picks) = choice.map_or((String::from("-"), String::from("-")), |c| {
                    let picks = if c.evidence_picks_own() { "own" } else { "frame" };
                    let numbers = format!(
                        "{:.3e} / {:.3e} (noise {:.2}, {} draws)",
                        c.condition_frame, c.condition_own, c.noise, c.draws
                    );
                    (numbers, picks.into())
                });
                let dense = if nuts.is_some_and(|p| p.dense_metric) { " (dense frame)" } else { "" };
                println!(
                    "{name} | {seed} | {rule:?}{dense} | {gradients} | {step} | {seconds:.1} | {worst_mean:.3} | {worst_sd:.3} | {conditions} | {picks}"
                );
                for phase in &result.path {
                    println!("    {phase}");
                }
                for w in &result.diagnostics.warnings {
                    println!("    warning: {w}");
                }
            }
        }
    }
    Ok(())
}
