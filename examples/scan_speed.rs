//! The linear recurrence `x_t = a x_{t-1} + b_t` (an AR(1) latent, GARCH's variance) for 100
//! particles: `scan::linear_scan` (`ceil(log2 T)` rounds of whole-row operations) beside the
//! per-step loop a Stan program's `for (t in 2:T)` becomes (`scan::recurrence`: one slice, one
//! multiply-add per step, one concatenation at the end). Each figure is the median ms of one score (the
//! log density `-sum x_t^2 / 2` and its gradient with respect to `a` and every `b_t`, by
//! autodiff) over 15 timed calls after 3 warm-up calls, on flex (the default backend).
//!
//! ```sh
//! cargo build --release --workspace --features wgpu,mpi --example scan_speed
//! $CARGO_TARGET_DIR/release/examples/scan_speed
//! ```
//!
//! The two give the same values and gradients (the largest relative difference is printed).

#[path = "common/timing.rs"]
mod timing;
use timing::median_ms;

use anyhow::Result;
use parvi::model::burn::tensor::Tensor;
use parvi::model::scan::{linear_scan, recurrence};
use parvi::model::tensor_ops::{matrix_from_vec, to_vec_f32};
use parvi::model::{BackendKind, value_and_grad};

const PARTICLES: usize = 100;

/// `x_t = a x_{t-1} + b_t`, `x_0 = b_0`, one step at a time: `scan::recurrence`, the loop a
/// non-linear recursion has to take.
fn per_step(a: Tensor<2>, b: Tensor<2>) -> Tensor<2> {
    let [n, t] = b.dims();
    let init = Tensor::zeros([n, 1], (&b.device(), b.dtype()));
    let xs = recurrence(init, t, |step, prev| Ok(prev * a.clone() + b.clone().narrow(1, step, 1)))
        .expect("the state keeps its shape");
    xs.reshape([n, t])
}

/// The score of `-sum_t x_t^2 / 2` for particles `[n, 1 + T]`: `a = 0.9 tanh(p_0)` (inside the
/// unit interval, as an AR(1)'s `phi`), `b = p_1..T`.
fn score(particles: Tensor<2>, scan: bool) -> Result<(Vec<f32>, Vec<f32>)> {
    let (value, grad) = value_and_grad(particles, |p| {
        let [n, width] = p.dims();
        let a = p.clone().narrow(1, 0, 1).tanh().mul_scalar(0.9);
        let b = p.narrow(1, 1, width - 1);
        let x = if scan { linear_scan(a, b).expect("shapes fit") } else { per_step(a, b) };
        x.square().sum_dim(1).mul_scalar(-0.5).reshape([n])
    })?;
    Ok((to_vec_f32(&value), to_vec_f32(&grad)))
}

fn max_relative_difference(x: &[f32], y: &[f32]) -> f32 {
    x.iter().zip(y).map(|(a, b)| (a - b).abs() / a.abs().max(b.abs()).max(1.0)).fold(0.0, f32::max)
}

fn main() -> Result<()> {
    let device = BackendKind::Flex.device()?;
    println!(
        "{:>6} {:>10} {:>16} {:>8} {:>22}",
        "T", "scan ms", "per-step loop ms", "ratio", "max relative difference"
    );
    for t in [200, 2000] {
        // Seeded, deterministic inputs of unit size.
        let values: Vec<f32> = (0..PARTICLES * (t + 1)).map(|i| (0.37 * i as f64).sin() as f32).collect();
        let particles = matrix_from_vec(values, PARTICLES, t + 1, &device);
        let (scan_value, scan_grad) = score(particles.clone(), true)?;
        let (loop_value, loop_grad) = score(particles.clone(), false)?;
        let difference =
            max_relative_difference(&scan_value, &loop_value).max(max_relative_difference(&scan_grad, &loop_grad));
        let scan_ms = median_ms(|| score(particles.clone(), true).map(|_| ()))?;
        let loop_ms = median_ms(|| score(particles.clone(), false).map(|_| ()))?;
        println!("{t:>6} {scan_ms:>10.3} {loop_ms:>16.3} {:>8.1} {difference:>22.1e}", loop_ms / scan_ms);
    }
    Ok(())
}
