//! Cost of one score (log density and its gradient by autodiff) of a posteriordb model: for 100
//! particles at once, as a particle engine evaluates it, for 4 positions, as the NUTS engine's 4
//! chains batched together do, and for one position, as one chain (and Stan) does. Stan's own figure
//! beside it: `scripts/stan_gradient.py` (issue 44, item 4).
//!
//! ```sh
//! cargo run --release --example posteriordb_speed -- ../shared/posteriordb \
//!     hmm_example-hmm_example,bball_drive_event_0-hmm_drive_0,hudson_lynx_hare-lotka_volterra,gp_pois_regr-gp_regr
//! ```
//!
//! The points are 100 reference draws spread over the reference run, mapped to the
//! unconstrained space (posterior-typical: an ODE's step count depends on where its parameters
//! are); where the reference lacks a parameter, `N(0, 0.5^2)` draws around the origin. The one
//! position is the first of them. Each figure is the median of 15 timed calls after 3 warm-up
//! calls. `PARVI_SPEED_CALLS=N` first runs N one-position scores in a row (for a profiler) and
//! prints their mean. `PARVI_SPEED_ROWS=8,16,32` also times those batch sizes.

use std::path::PathBuf;
#[path = "common/timing.rs"]
mod timing;
use timing::median_ms;

use anyhow::{Context, Result};
use parvi::infer::EngineRng;
use parvi::model::tensor_ops::matrix_from_vec;
use parvi::model::{BackendKind, LogDensity, score};
use parvi::models::posteriordb;

/// `count` reference draws on the unconstrained scale, row-major, if the reference holds every
/// parameter of the layout.
fn reference_points(model: &posteriordb::PosteriorDbModel, count: usize) -> Option<Vec<f32>> {
    let reference = posteriordb::ReferenceDraws::for_model(model).ok()?;
    let layout = model.layout();
    let names = model.param_names();
    // The layout's constrained values come first among the reported quantities.
    let columns: Vec<usize> = names[..layout.constrained_dim()]
        .iter()
        .map(|n| reference.names().iter().position(|r| r == n))
        .collect::<Option<_>>()?;
    let p = reference.params();
    let mut out = Vec::with_capacity(count * layout.dim());
    for i in 0..count {
        let row = &reference.values()[(i * reference.rows() / count) * p..][..p];
        let constrained: Vec<f64> = columns.iter().map(|&j| row[j]).collect();
        out.extend(layout.unconstrain(&constrained).ok()?.into_iter().map(|v| v as f32));
    }
    Some(out)
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().context("usage: posteriordb_speed SUITE_DIR NAME[,NAME...]")?);
    let names = args.next().context("usage: posteriordb_speed SUITE_DIR NAME[,NAME...]")?;
    let device = BackendKind::Flex.device()?;
    println!(
        "{:<36} {:>5} {:>16} {:>15} {:>14} {:>16}",
        "posterior", "dim", "100 particles ms", "4 positions ms", "1 position ms", "per particle ratio"
    );
    for name in names.split(',') {
        let model = posteriordb::load(name, &dir, &device)?;
        let dim = model.dim();
        let mut rng = EngineRng::new(7);
        let points: Vec<f32> = match reference_points(&model, 100) {
            Some(points) => points,
            None => (0..100 * dim).map(|_| 0.5 * rng.normal() as f32).collect(),
        };
        let batch = matrix_from_vec(points.clone(), 100, dim, &device);
        let one = matrix_from_vec(points[..dim].to_vec(), 1, dim, &device);
        let four = matrix_from_vec(points[..4 * dim].to_vec(), 4, dim, &device);
        if std::env::var_os("PARVI_SPEED_ORIGIN").is_some() {
            let s = score(&model, matrix_from_vec(vec![0.0; dim], 1, dim, &device), None)?;
            let lp = parvi::model::tensor_ops::to_vec_f32(&s.log_prob);
            let g = parvi::model::tensor_ops::to_vec_f32(&s.grad);
            println!(
                "{name}: at the origin log p {lp:?}, non-finite gradient entries at {:?}",
                g.iter().enumerate().filter(|(_, v)| !v.is_finite()).map(|(i, _)| i).collect::<Vec<_>>()
            );
        }
        let many = median_ms(|| {
            score(&model, batch.clone(), None)?;
            Ok(())
        })?;
        let lockstep = median_ms(|| {
            score(&model, four.clone(), None)?;
            Ok(())
        })?;
        if let Some(calls) = std::env::var("PARVI_SPEED_CALLS").ok().and_then(|v| v.parse::<usize>().ok()) {
            // For a profiler: `calls` one-position scores in a row, and their mean.
            let started = std::time::Instant::now();
            for _ in 0..calls {
                let s = score(&model, one.clone(), None)?;
                parvi::model::tensor_ops::to_vec_f32(&s.grad);
            }
            println!(
                "{name}: {calls} one-position scores, {:.1} us each",
                1e6 * started.elapsed().as_secs_f64() / calls as f64
            );
        }
        let single = median_ms(|| {
            score(&model, one.clone(), None)?;
            Ok(())
        })?;
        println!("{name:<36} {dim:>5} {many:>16.2} {lockstep:>15.3} {single:>14.3} {:>16.1}", 100.0 * single / many);
        // `PARVI_SPEED_ROWS=8,16,32`: the same score for other batch sizes (a batched chain
        // sampler's call), at most 100 rows.
        if let Ok(rows) = std::env::var("PARVI_SPEED_ROWS") {
            for n in rows.split(',').filter_map(|r| r.trim().parse::<usize>().ok()).filter(|&n| (1..=100).contains(&n))
            {
                let block = matrix_from_vec(points[..n * dim].to_vec(), n, dim, &device);
                let ms = median_ms(|| {
                    score(&model, block.clone(), None)?;
                    Ok(())
                })?;
                println!("{name:<36} {n:>4} rows {ms:>10.3} ms");
            }
        }
    }
    Ok(())
}
