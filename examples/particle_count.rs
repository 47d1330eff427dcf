//! How many particles: SVGD's sd ratio (the particles' sd over the target's) on whitened standard
//! Gaussians `N(0, I_d)` against the particle count `n` and the dimension `d`, with the RBF
//! kernel (median rule) and with the moment-matching kernel `rbf-linear` (Liu & Wang 2018:
//! `k_rbf + x^T y / d + 1`). Whitened coordinates are where `parvi fit` runs SVGD (Laplace
//! preconditioning), so this is the collapse a near-Gaussian posterior meets there.
//!
//! The sd ratio is `sqrt(mean_j var_j)` over the coordinates (population variances, the
//! particles' own weights); SVGD starts from `N(0, I)` draws and runs `steps` steps of AdaGrad
//! (0.05, the default; 1000 unless given); the ratio half-way is printed beside it to show the run
//! has settled. Also prints SVGD's ms/step for both kernels at every cell.
//!
//! ```text
//! cargo run --release --features wgpu,mpi --example particle_count -- OUT.svg [max_n_times_d] [steps]
//! ```
//!
//! Cells with `n * n * d` above `max_n_times_d` (default `4e8`: about a minute a cell on one
//! core) are skipped.

use std::time::Instant;

use parvi::infer::{AdapterConfig, Callback, EngineRng, InferError, KernelConfig, Particles, RunConfig, Runner, Svgd};
use parvi::model::BackendKind;
use parvi::models::Gaussian;
use plotters::prelude::*;

const DIMS: &[usize] = &[2, 5, 10, 20, 50, 100];
const COUNTS: &[usize] = &[50, 100, 200, 500, 1000, 2000];

/// One cell: `(d, n, kernel, sd ratio at the end, at half-way, ms/step)`.
type Cell = (usize, usize, &'static str, f64, f64, f64);

/// `sqrt(mean_j var_j)` of a particle set.
fn sd_ratio(p: &Particles) -> f64 {
    let d = p.dim();
    let cov = p.covariance();
    ((0..d).map(|j| cov[j * d + j]).sum::<f64>() / d as f64).sqrt()
}

/// The sd ratio half-way through the run (every `.0` steps).
struct Halfway(usize, Option<f64>);

impl Callback for Halfway {
    fn every(&self) -> usize {
        self.0
    }

    fn on_step(&mut self, _step: usize, particles: &Particles) -> Result<(), InferError> {
        self.1.get_or_insert(sd_ratio(particles));
        Ok(())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let out = args.get(1).cloned().unwrap_or_else(|| "particle_count.svg".into());
    let max_work: f64 = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(4e8);
    let steps: usize = args.get(3).map(|s| s.parse()).transpose()?.unwrap_or(1000);
    let device = BackendKind::Flex.device()?;
    let kernels =
        [("rbf", KernelConfig::Rbf { bandwidth: None }), ("rbf-linear", KernelConfig::RbfLinear { bandwidth: None })];
    let mut cells: Vec<Cell> = Vec::new();
    println!(
        "| d | n | sd ratio rbf | sd ratio rbf-linear | (half-way: rbf, rbf-linear) | ms/step rbf | ms/step rbf-linear |"
    );
    println!("|---|---|---|---|---|---|---|");
    for &d in DIMS {
        let target = Gaussian::diagonal(&vec![0.0; d], &vec![1.0; d], &device)?;
        for &n in COUNTS {
            if (n * n * d) as f64 > max_work {
                continue;
            }
            let mut row = Vec::new();
            for (name, kernel) in &kernels {
                let start = Particles::gaussian(n, d, 0.0, 1.0, &mut EngineRng::new(1), &device)?;
                let mut svgd = Svgd::new(kernel.build()?, AdapterConfig::adagrad(0.05).build()?);
                let mut halfway = Halfway((steps / 2).max(1), None);
                let clock = Instant::now();
                let run = Runner::new(&mut svgd, &target, start, RunConfig::new(steps, 0))?.run(&mut [&mut halfway])?;
                let ms = 1e3 * clock.elapsed().as_secs_f64() / steps as f64;
                let cell = (d, n, *name, sd_ratio(&run.particles), halfway.1.unwrap_or(f64::NAN), ms);
                row.push(cell);
                cells.push(cell);
            }
            println!(
                "| {d} | {n} | {:.3} | {:.3} | ({:.3}, {:.3}) | {:.2} | {:.2} |",
                row[0].3, row[1].3, row[0].4, row[1].4, row[0].5, row[1].5
            );
        }
    }
    plot(&out, &cells)?;
    println!("wrote {out}");
    Ok(())
}

fn plot(path: &str, cells: &[Cell]) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("SVGD on N(0, I_d): sd ratio against particles (solid: rbf, dashed: rbf-linear)", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((40f64..2500f64).log_scale(), 0f64..1.2f64)?;
    // Label only the particle counts measured: plotters' log-scale labels crowd past 500.
    let measured =
        |v: &f64| COUNTS.iter().find(|&&n| (v / n as f64 - 1.0).abs() < 0.02).map_or(String::new(), |n| n.to_string());
    chart
        .configure_mesh()
        .x_desc("particles n")
        .y_desc("sd ratio (particles / target)")
        .x_labels(60)
        .x_label_formatter(&measured)
        .disable_x_mesh()
        .draw()?;
    let colors = [RED, BLUE, GREEN, MAGENTA, CYAN, BLACK];
    for (i, &d) in DIMS.iter().enumerate() {
        let color = colors[i % colors.len()];
        for kernel in ["rbf", "rbf-linear"] {
            let pts: Vec<(f64, f64)> =
                cells.iter().filter(|c| c.0 == d && c.2 == kernel).map(|c| (c.1 as f64, c.3)).collect();
            if pts.is_empty() {
                continue;
            }
            if kernel == "rbf" {
                chart
                    .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
                    .label(format!("d = {d}"))
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
            } else {
                // Dashes: every other segment of the polyline, split finely.
                let fine: Vec<(f64, f64)> = pts
                    .windows(2)
                    .flat_map(|w| {
                        (0..8).map(move |k| {
                            let t = k as f64 / 8.0;
                            let x = (w[0].0.ln() * (1.0 - t) + w[1].0.ln() * t).exp();
                            (x, w[0].1 * (1.0 - t) + w[1].1 * t)
                        })
                    })
                    .chain(pts.last().copied())
                    .collect();
                for seg in fine.windows(2).step_by(2) {
                    chart.draw_series(LineSeries::new(seg.to_vec(), color.stroke_width(2)))?;
                }
            }
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
        }
    }
    chart.draw_series(LineSeries::new(vec![(40.0, 1.0), (2500.0, 1.0)], BLACK.mix(0.4)))?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
