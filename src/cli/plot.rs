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
    let root = SVGBackend::new(path, (640, 640)).into_drawing_area();
    draw_particles_over_density(&root, target, window, particles, device, title)
        .map_err(|e| anyhow!("plot {}: {e}", path.display()))?;
    root.present().map_err(|e| anyhow!("plot {}: {e}", path.display()))?;
    Ok(())
}

/// [`particles_over_density`] with a bar chart of a multiple kernel's weights beside it, one
/// bar per bandwidth `h` (labelled `2^e` for powers of two).
#[allow(clippy::too_many_arguments)]
pub fn particles_with_kernel_weights(
    path: &Path,
    target: &dyn LogDensity,
    window: [f64; 4],
    particles: &Particles,
    device: &Device,
    title: &str,
    bandwidths: &[f64],
    weights: &[f64],
) -> Result<()> {
    let err = |e: &dyn std::fmt::Display| anyhow!("plot {}: {e}", path.display());
    let root = SVGBackend::new(path, (1200, 640)).into_drawing_area();
    let (left, right) = root.split_horizontally(640);
    draw_particles_over_density(&left, target, window, particles, device, title).map_err(|e| err(&e))?;
    draw_kernel_weights(&right, bandwidths, weights).map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

fn draw_kernel_weights(area: &Area, bandwidths: &[f64], weights: &[f64]) -> Result<()> {
    let label = |h: f64| {
        let e = h.log2().round();
        if 2f64.powf(e) == h { format!("2^{e}") } else { format!("{h}") }
    };
    let labels: Vec<String> = bandwidths.iter().map(|&h| label(h)).collect();
    let top = weights.iter().cloned().fold(0.0, f64::max).max(1e-12) * 1.1;
    area.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let mut chart = ChartBuilder::on(area)
        .caption("kernel weights", ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(50)
        // A segmented range `0..k` has k + 1 slots: the last index is k - 1.
        .build_cartesian_2d((0..weights.len().saturating_sub(1)).into_segmented(), 0.0..top)
        .map_err(|e| anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(weights.len())
        .x_desc("bandwidth h in exp(-r^2 / h)")
        .y_desc("weight")
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    let bars = Histogram::vertical(&chart).style(BLUE.mix(0.7).filled()).margin(6);
    chart.draw_series(bars.data(weights.iter().enumerate().map(|(i, w)| (i, *w)))).map_err(|e| anyhow!("{e}"))?;
    Ok(())
}

fn draw_particles_over_density(
    root: &Area,
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

    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(40)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(|e| anyhow!("{e}"))?;
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
    Ok(())
}

/// A 1-D regression predictive to draw: bands over a grid of inputs, and the data.
pub struct PredictivePlot<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    /// The inputs the bands are drawn over, increasing.
    pub grid: &'a [f64],
    /// Predictive mean per grid point.
    pub mean: &'a [f64],
    /// The central 90% interval of the whole predictive (noise included), `(lo, hi)`.
    pub total: (&'a [f64], &'a [f64]),
    /// The central 90% band of the network's mean alone (the particles' spread), `(lo, hi)`.
    pub epistemic: (&'a [f64], &'a [f64]),
    /// The noise-free function, when known.
    pub truth: Option<fn(f64) -> f64>,
    pub train: &'a [(f64, f64)],
    pub test: &'a [(f64, f64)],
}

/// Draws a [`PredictivePlot`]: the total and epistemic bands, the mean, the true function, the
/// training and test points, with a legend and axis labels. Returns how many grid inputs had a
/// non-finite mean or interval end (a diverged run's): those are drawn at the view's edge (the
/// mean left out there), and the caller says so. With nothing finite on the grid nothing is
/// written and the count is the grid's length.
pub fn predictive_bands(path: &Path, plot: &PredictivePlot<'_>) -> Result<usize> {
    let err = |e: &dyn std::fmt::Display| anyhow!("plot {}: {e}", path.display());
    let grid = plot.grid;
    let (x0, x1) = (grid.first().copied().unwrap_or(0.0), grid.last().copied().unwrap_or(1.0));
    let range = |ys: &mut dyn Iterator<Item = f64>| {
        ys.filter(|v| v.is_finite()).fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)))
    };
    let (b0, b1) = range(
        &mut plot.total.0.iter().chain(plot.total.1).copied().chain(plot.train.iter().chain(plot.test).map(|p| p.1)),
    );
    // A wild posterior (an unconverged run) can predict far outside the data, and the axis
    // ticks of a range of 1e30 never finish: the view stops 3 data spans beyond the data.
    let (p0, p1) = range(&mut plot.train.iter().chain(plot.test).map(|p| p.1));
    let (y0, y1) = if p0 <= p1 {
        let span = (p1 - p0).max(1.0);
        (b0.max(p0 - 3.0 * span), b1.min(p1 + 3.0 * span))
    } else {
        (b0, b1)
    };
    let finite_at = |i: usize| {
        [plot.mean, plot.total.0, plot.total.1, plot.epistemic.0, plot.epistemic.1]
            .iter()
            .all(|ys| ys.get(i).is_some_and(|v| v.is_finite()))
    };
    let non_finite = (0..grid.len()).filter(|&i| !finite_at(i)).count();
    if non_finite == grid.len() {
        return Ok(non_finite);
    }
    if !(y0.is_finite() && y1.is_finite() && y0 < y1) {
        anyhow::bail!("plot {}: the predictive has no finite range to draw", path.display());
    }
    // +-inf clamps to the edge; a NaN interval end is drawn at its own side's edge.
    let clip = |v: f64, nan_at: f64| if v.is_nan() { nan_at } else { v.clamp(y0, y1) };
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(plot.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(|e| err(&e))?;
    chart.configure_mesh().x_desc(plot.x_label).y_desc(plot.y_label).draw().map_err(|e| err(&e))?;
    let band = |(lo, hi): (&[f64], &[f64])| -> Vec<(f64, f64)> {
        let upper = grid.iter().zip(hi).map(|(&x, &y)| (x, clip(y, y1)));
        let lower = grid.iter().zip(lo).rev().map(|(&x, &y)| (x, clip(y, y0)));
        upper.chain(lower).collect()
    };
    let total_colour = RGBColor(120, 160, 230);
    let epistemic_colour = RGBColor(20, 40, 140);
    chart
        .draw_series(std::iter::once(Polygon::new(band(plot.total), total_colour.mix(0.3).filled())))
        .map_err(|e| err(&e))?
        .label("90% predictive interval (noise included)")
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 16, y + 5)], total_colour.mix(0.3).filled()));
    chart
        .draw_series(std::iter::once(Polygon::new(band(plot.epistemic), epistemic_colour.mix(0.6).filled())))
        .map_err(|e| err(&e))?
        .label("90% band of the network's mean (epistemic)")
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 16, y + 5)], epistemic_colour.mix(0.6).filled()));
    chart
        .draw_series(LineSeries::new(
            grid.iter().zip(plot.mean).filter(|p| p.1.is_finite()).map(|(&x, &m)| (x, m.clamp(y0, y1))),
            BLUE.stroke_width(2),
        ))
        .map_err(|e| err(&e))?
        .label("predictive mean")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BLUE.stroke_width(2)));
    if let Some(truth) = plot.truth {
        let style = BLACK.stroke_width(1);
        chart
            // Only where the function is inside the view: clipped, it would draw a false flat line.
            .draw_series(DashedLineSeries::new(
                grid.iter().map(|&x| (x, truth(x))).filter(|p| p.1 >= y0 && p.1 <= y1),
                6,
                4,
                style,
            ))
            .map_err(|e| err(&e))?
            .label("true function")
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], style));
    }
    chart
        .draw_series(plot.train.iter().filter(|p| p.1 >= y0 && p.1 <= y1).map(|&p| Circle::new(p, 4, RED.filled())))
        .map_err(|e| err(&e))?
        .label("training data")
        .legend(|(x, y)| Circle::new((x + 8, y), 4, RED.filled()));
    if !plot.test.is_empty() {
        chart
            .draw_series(
                plot.test
                    .iter()
                    .filter(|p| p.1 >= y0 && p.1 <= y1)
                    .map(|&p| Circle::new(p, 2, BLACK.mix(0.5).filled())),
            )
            .map_err(|e| err(&e))?
            .label("test data")
            .legend(|(x, y)| Circle::new((x + 8, y), 2, BLACK.mix(0.5).filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(non_finite)
}

/// A reliability diagram: observed against expected frequency, with the diagonal a calibrated
/// predictive follows. `points` are `(expected, observed)`.
pub fn reliability(path: &Path, points: &[(f64, f64)], title: &str, x_label: &str, y_label: &str) -> Result<()> {
    let err = |e: &dyn std::fmt::Display| anyhow!("plot {}: {e}", path.display());
    if points.iter().any(|(a, b)| !(a.is_finite() && b.is_finite())) {
        anyhow::bail!("plot {}: the reliability curve has non-finite points", path.display());
    }
    let root = SVGBackend::new(path, (560, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..1.0, 0.0..1.0)
        .map_err(|e| err(&e))?;
    chart.configure_mesh().x_desc(x_label).y_desc(y_label).draw().map_err(|e| err(&e))?;
    let diagonal = BLACK.mix(0.5).stroke_width(1);
    chart
        .draw_series(DashedLineSeries::new([(0.0, 0.0), (1.0, 1.0)], 6, 4, diagonal))
        .map_err(|e| err(&e))?
        .label("perfectly calibrated")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], diagonal));
    chart
        .draw_series(LineSeries::new(points.iter().copied(), BLUE.stroke_width(2)))
        .map_err(|e| err(&e))?
        .label("this posterior")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BLUE.stroke_width(2)));
    chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, BLUE.filled()))).map_err(|e| err(&e))?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wild predictive (half-widths of 1e30) is drawn clipped to the data, not given to the
    /// axis as a range of 1e30 (whose ticks never finished); a partly non-finite one is drawn and
    /// its bad inputs counted; one with nothing finite is not drawn.
    #[test]
    fn a_wild_predictive_is_clipped_to_the_data() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bands.svg");
        let grid: Vec<f64> = (0..50).map(|i| i as f64 / 10.0).collect();
        let (zero, lo, hi) = (vec![0.0; 50], vec![-1e30; 50], vec![1e30; 50]);
        let points = [(0.0, -2.0), (1.0, 3.0)];
        let plot = PredictivePlot {
            title: "wild",
            x_label: "x",
            y_label: "y",
            grid: &grid,
            mean: &zero,
            total: (&lo, &hi),
            epistemic: (&lo, &hi),
            truth: None,
            train: &points,
            test: &[],
        };
        assert_eq!(predictive_bands(&path, &plot).unwrap(), 0);
        assert!(std::fs::read_to_string(&path).unwrap().contains("<svg"));
        // Nothing finite: nothing written, the whole grid counted.
        let nan = vec![f64::NAN; 50];
        let empty = dir.path().join("empty.svg");
        assert_eq!(predictive_bands(&empty, &PredictivePlot { mean: &nan, total: (&nan, &nan), ..plot }).unwrap(), 50);
        assert!(!empty.exists());
        // A diverged run's predictive, infinite or undefined at some inputs: drawn, and counted.
        let mut some_bad = lo.clone();
        some_bad[3] = f64::NEG_INFINITY;
        some_bad[7] = f64::NAN;
        let mut mean = zero.clone();
        mean[7] = f64::NAN;
        let partial = PredictivePlot { mean: &mean, total: (&some_bad, &hi), ..plot };
        assert_eq!(predictive_bands(&path, &partial).unwrap(), 2);
        assert!(std::fs::read_to_string(&path).unwrap().contains("<svg"));
    }
}
