//! Issue 45's latent-variable acceptance: the default path (`fit` with every default) on the
//! two-parameter item-response model and the non-centred stochastic-volatility model of
//! `parvi_models::stan_users` (simulated data), against NUTS through the same density (4 chains
//! x (1,000 + 3,000)) as the reference: the largest error of a reported quantity's mean in NUTS
//! sds, the largest |sd ratio - 1|, and the wall seconds of each. And item 5's stiff
//! pharmacokinetic model: its default path's means, sds and seconds (`pk`; the reference is
//! Stan's run on the data `pk-data` writes, `scripts/stan_time.py`), and the cost of one score
//! at 1, 4 and 100 rows (`pk-speed`).
//!
//! ```sh
//! cargo build --release --workspace --features wgpu,mpi --example latent_default_path
//! target/release/examples/latent_default_path [irt|sv|pk|pk-speed]
//! target/release/examples/latent_default_path pk-data > pk.json   # the PK data, for Stan
//! ```

use std::time::Instant;

use parvi_infer::engines::{MetricEstimate, NutsConfig, nuts};
use parvi_infer::{
    AdapterConfig, EngineRng, EngineSpec, FitConfig, FitResult, KernelConfig, MethodConfig, fit_reported,
};
use parvi_model::BackendKind;
use parvi_model::burn::tensor::{Device, Tensor};
use parvi_model::program::{Compiled, Program};
use parvi_model::tensor_ops::{matrix_from_vec, to_vec_f64};
use parvi_models::stan_users::{ItemResponse2pl, OneCompartmentMm, StochasticVolatility};

/// Kept draws per chain of the reference NUTS run (4 chains): three times Stan's default, so
/// that the reference's own Monte Carlo error in an sd (about `sqrt(1 / (2 ESS))`) is a small
/// share of the 10% bar.
const REFERENCE_DRAWS: usize = 3000;

/// Per reported quantity: mean and sd over the rows of `[rows, width]` values.
fn moments(values: &[f64], width: usize) -> (Vec<f64>, Vec<f64>) {
    let rows = values.len() / width;
    let mean: Vec<f64> =
        (0..width).map(|j| (0..rows).map(|r| values[r * width + j]).sum::<f64>() / rows as f64).collect();
    let sd = (0..width)
        .map(|j| {
            let ss: f64 = (0..rows).map(|r| (values[r * width + j] - mean[j]).powi(2)).sum();
            (ss / (rows as f64 - 1.0)).sqrt()
        })
        .collect();
    (mean, sd)
}

fn compare<P: Program>(label: &str, model: &Compiled<P>, device: &Device) {
    let names = model.names().to_vec();
    let width = names.len();
    let reported = |x: Tensor<2>| model.reported(x).expect("reported quantities");

    let started = Instant::now();
    let config = NutsConfig {
        warmup: 1000,
        draws: REFERENCE_DRAWS,
        metric_estimate: MetricEstimate::DrawVariance,
        ..NutsConfig::default()
    };
    let run = nuts(model, &config, None, &mut EngineRng::new(1), device).expect("nuts");
    let nuts_seconds = started.elapsed().as_secs_f64();
    let rows = run.draws.len() / run.dim;
    let positions = matrix_from_vec(run.draws.iter().map(|&v| v as f32).collect(), rows, run.dim, device);
    let (ref_mean, ref_sd) = moments(&to_vec_f64(&reported(positions)), width);

    let (result, fit_seconds) = default_path(model, device);
    let (mean, sd) = moments(&to_vec_f64(&reported(result.draws.positions.clone())), width);

    let (mut worst_mean, mut worst_mean_at) = (0.0f64, 0);
    let (mut worst_sd, mut worst_sd_at) = (0.0f64, 0);
    for j in 0..width {
        let e = (mean[j] - ref_mean[j]).abs() / ref_sd[j];
        let r = (sd[j] / ref_sd[j] - 1.0).abs();
        if e > worst_mean {
            (worst_mean, worst_mean_at) = (e, j);
        }
        if r > worst_sd {
            (worst_sd, worst_sd_at) = (r, j);
        }
    }
    println!(
        "{label}: {} quantities; default path {fit_seconds:.1} s, NUTS {nuts_seconds:.1} s; \
         max |mean error| {worst_mean:.3} NUTS sd ({}), max |sd ratio - 1| {worst_sd:.3} ({}); {}",
        width,
        names[worst_mean_at],
        names[worst_sd_at],
        if worst_mean <= 0.1 && worst_sd <= 0.1 { "right" } else { "OFF" }
    );
    print_diagnostics(&result);
}

/// `fit` with every default (SVGD, the polish step), and its wall seconds.
fn default_path<P: Program>(model: &Compiled<P>, device: &Device) -> (FitResult, f64) {
    let reported = |x: Tensor<2>| model.reported(x).expect("reported quantities");
    let started = Instant::now();
    let spec =
        EngineSpec::new(MethodConfig::default_for("svgd").unwrap(), KernelConfig::default(), AdapterConfig::default());
    let config = FitConfig { progress: false, ..FitConfig::default() };
    let result = fit_reported(model, Some(&reported), &spec, &config, &mut [], device).expect("fit");
    (result, started.elapsed().as_secs_f64())
}

/// The run's warnings and the path it took.
fn print_diagnostics(result: &FitResult) {
    for w in &result.diagnostics.warnings {
        println!("  warning: {w}");
    }
    for phase in &result.path {
        println!("  {phase}");
    }
}

/// Every model, or the one named by the first argument (`irt`, `sv`, `pk`; `pk-speed`, `pk-data`).
fn main() {
    let only = std::env::args().nth(1);
    let run = |name: &str| only.as_deref().is_none_or(|o| o == name);
    let device = BackendKind::Flex.device().expect("flex");
    if only.as_deref() == Some("pk-speed") {
        let (pk, truth) = OneCompartmentMm::simulate(19, &device).expect("simulate");
        let model = Compiled::new(pk, &device).expect("compile");
        let at: Vec<f32> = truth.iter().map(|(_, v)| v.ln() as f32).collect();
        for rows in [1usize, 4, 100] {
            let x =
                matrix_from_vec(at.iter().cycle().take(rows * at.len()).copied().collect(), rows, at.len(), &device);
            let started = Instant::now();
            for _ in 0..5 {
                let s = parvi_model::score(&model, x.clone(), None).expect("score");
                let _ = to_vec_f64(&s.grad);
            }
            println!("{rows} rows: {:.2} ms a score", started.elapsed().as_secs_f64() * 200.0);
        }
        return;
    }
    if only.as_deref() == Some("pk-data") {
        // The simulated data set as Stan's JSON, for scripts/stan_time.py with
        // scripts/stan/one_cpt_mm.stan.
        let (pk, _) = OneCompartmentMm::simulate(19, &device).expect("simulate");
        let d = pk.data();
        println!("{}", serde_json::json!({ "N": d.ts.len(), "ts": d.ts, "dose": d.dose, "conc": d.conc }));
        return;
    }
    if run("irt") {
        let (irt, _) = ItemResponse2pl::simulate(13, 20, 100, &device).expect("simulate");
        let irt = Compiled::new(irt, &device).expect("compile");
        compare("item-response 2PL (20 items x 100 persons)", &irt, &device);
    }
    if run("sv") {
        let (sv, _) = StochasticVolatility::simulate(17, 300, &device).expect("simulate");
        compare("stochastic volatility (T = 300)", &Compiled::new(sv, &device).expect("compile"), &device);
    }
    if run("pk") {
        // No NUTS reference here (4 x 4,000 iterations of four-row stiff solves take hours): the
        // reference is Stan's own run, `scripts/stan_time.py` on `pk-data`.
        let (pk, _) = OneCompartmentMm::simulate(19, &device).expect("simulate");
        let model = Compiled::new(pk, &device).expect("compile");
        let (result, seconds) = default_path(&model, &device);
        let names = model.names().to_vec();
        let reported = model.reported(result.draws.positions.clone()).expect("reported quantities");
        let (mean, sd) = moments(&to_vec_f64(&reported), names.len());
        println!("pharmacokinetic, Michaelis-Menten (ode_stiff, N = 20): default path {seconds:.1} s");
        for (j, name) in names.iter().enumerate() {
            println!("{name:>8} mean {:.5} sd {:.5}", mean[j], sd[j]);
        }
        print_diagnostics(&result);
    }
}
