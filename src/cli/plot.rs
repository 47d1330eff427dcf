//! Plots (SVG through plotters: no font or system library needed).

use std::path::Path;

use anyhow::{Result, anyhow};
use burn::tensor::Device;
use parvi_infer::Particles;
use parvi_model::LogDensity;
use parvi_model::tensor_ops::{matrix_from_vec, to_vec_f32};
use plotters::prelude::*;

const GRID: usize = 120;
const LEVELS: usize = 9;

/// Particles over filled density contours of a 2-D target. The density is evaluated on a
/// `GRID x GRID` lattice in one batched call; contour bands are equal steps of the density
/// relative to its maximum.
pub fn particles_over_density(
    path: &Path,
    target: &dyn LogDensity,
    window: [f64; 4],
    particles: &Particles,
    device: &Device,
    title: &str,
) -> Result<()> {
    let [x0, x1, y0, y1] = window;
    let (dx, dy) = ((x1 - x0) / GRID as f64, (y1 - y0) / GRID as f64);
    let mut grid = Vec::with_capacity(GRID * GRID * 2);
    for i in 0..GRID {
        for j in 0..GRID {
            grid.push((x0 + (j as f64 + 0.5) * dx) as f32);
            grid.push((y0 + (i as f64 + 0.5) * dy) as f32);
        }
    }
    let lp = to_vec_f32(&target.log_prob(matrix_from_vec(grid, GRID * GRID, 2, device), None));
    let max = lp.iter().cloned().filter(|v| v.is_finite()).fold(f32::NEG_INFINITY, f32::max);

    let root = SVGBackend::new(path, (640, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("plot {}: {e}", path.display()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(40)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(|e| anyhow!("plot {}: {e}", path.display()))?;
    chart.configure_mesh().disable_mesh().draw().map_err(|e| anyhow!("plot: {e}"))?;
    let cells = (0..GRID * GRID).filter_map(|c| {
        let rel = (lp[c] - max).exp();
        let level = (rel * LEVELS as f32).floor() as usize;
        (level > 0).then(|| {
            let (i, j) = (c / GRID, c % GRID);
            let shade = 1.0 - 0.6 * level as f64 / LEVELS as f64;
            let colour = RGBColor((255.0 * shade) as u8, (255.0 * shade) as u8, 255);
            let (cx, cy) = (x0 + j as f64 * dx, y0 + i as f64 * dy);
            Rectangle::new([(cx, cy), (cx + dx, cy + dy)], colour.filled())
        })
    });
    chart.draw_series(cells).map_err(|e| anyhow!("plot: {e}"))?;
    let points = particles.to_rows().into_iter().map(|r| Circle::new((r[0] as f64, r[1] as f64), 3, RED.filled()));
    chart.draw_series(points).map_err(|e| anyhow!("plot: {e}"))?;
    root.present().map_err(|e| anyhow!("plot {}: {e}", path.display()))?;
    Ok(())
}

/// A 1-D predictive: `(x, mean, half_width)` bands with the training points.
pub fn predictive_bands(path: &Path, bands: &[(f64, f64, f64)], points: &[(f64, f64)], title: &str) -> Result<()> {
    let err = |e: &dyn std::fmt::Display| anyhow!("plot {}: {e}", path.display());
    let (x0, x1) = (bands.first().map_or(0.0, |b| b.0), bands.last().map_or(1.0, |b| b.0));
    let ys = bands.iter().flat_map(|b| [b.1 - b.2, b.1 + b.2]).chain(points.iter().map(|p| p.1));
    let (y0, y1) = ys.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)));
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(|e| err(&e))?;
    chart.configure_mesh().draw().map_err(|e| err(&e))?;
    let upper = bands.iter().map(|b| (b.0, b.1 + b.2));
    let lower = bands.iter().rev().map(|b| (b.0, b.1 - b.2));
    chart
        .draw_series(std::iter::once(Polygon::new(upper.chain(lower).collect::<Vec<_>>(), BLUE.mix(0.2).filled())))
        .map_err(|e| err(&e))?;
    chart.draw_series(LineSeries::new(bands.iter().map(|b| (b.0, b.1)), BLUE.stroke_width(2))).map_err(|e| err(&e))?;
    chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, RED.filled()))).map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}
