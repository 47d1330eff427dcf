//! Where the time of one SVGD step on the Boston-sized BNN goes (20 particles, minibatch 100,
//! 13 inputs, 50 hidden units, 753 coordinates), part by part, next to the hand-written
//! reference of `parvi bench speed`; and the floor that burn's autodiff puts under any score.
//!
//! `cargo run --release -p parvi-bench --example bnn_step_profile -- [--backend flex|ndarray]`
//!
//! Data: seeded synthetic rows of Boston's shape (455 x 13): the cost of a step does not depend
//! on the values. Each figure is the minimum over 7 blocks of the mean over 200 calls, in
//! microseconds, after a warm-up block.
//!
//! Rows, for the network's layers fused (one autodiff node per layer, the default) and built from
//! plain tensor ops:
//! - `score`: `parvi_model::score` of the BNN log-joint (forward, backward, the leaf's gradient);
//!   `forward`: the same log-joint without autodiff.
//! - `likelihood score floor`: the score of the network's likelihood term alone,
//!   `-sum (y - f(x))^2`, built with the same batched forward and residual sum: no prior, no
//!   precisions. A score of this model through burn's autodiff costs at least this much.
//! - `autodiff node, [20, 1]` / `[20, 753]`: forward and backward of a chain of 40 elementwise
//!   scalar ops, per op: the per-node price of the graph, almost all of it bookkeeping and
//!   allocation on tensors this small.
//! - `svgd direction`, `adagrad update`: the kernel part and the step-size adapter; `dense
//!   tensor ops`: the direction from tensor operations (what a GPU backend runs) beside the
//!   host pass a small set takes on a CPU.
//! - `run loop: minibatch index tensor`, `run loop: finiteness check`: the loop's own work
//!   each step (the next batch's row indices as a tensor; `Particles::is_finite`, read back);
//!   `finiteness check, elementwise`: the check as `is_finite().all()`, which it was before.
//! - `svgd step through the run loop`: one whole step as `parvi bench speed` times it (the
//!   `Runner` with SVGD, the RBF median kernel, AdaGrad 1e-3, minibatches of 100, the divergence
//!   check every step), per step of 200-step runs.
//! - `hand-written score`, `hand-written step`: the reference (analytic gradients, gemm).

use std::time::Instant;

use anyhow::{Result, bail};
use parvi_bench::handwritten::{BnnShape, HandwrittenSvgd};
use parvi_infer::kernels::{svgd_direction, svgd_direction_dense};
use parvi_infer::{
    AdapterConfig, BatchOrder, BatchStream, EngineRng, EngineSpec, KernelConfig, MethodConfig, Particles, Rbf,
    RunConfig, Runner,
};
use parvi_model::burn::tensor::Tensor;
use parvi_model::layers::LayerOps;
use parvi_model::tensor_ops::{to_vec_f32, to_vec_f64};
use parvi_model::{BackendKind, LogDensity, fused, score, value_and_grad};
use parvi_models::{Bnn, BnnConfig};

const ROWS: usize = 455;
const INPUTS: usize = 13;
const HIDDEN: usize = 50;
const PARTICLES: usize = 20;
const BATCH: usize = 100;
const CALLS: usize = 200;
const BLOCKS: usize = 7;
const CHAIN: usize = 40;

/// Minimum over blocks of the mean microseconds per call, after a warm-up block; `sync` runs
/// once at the end of each block (inside the timing).
fn time_blocks(mut call: impl FnMut(), mut sync: impl FnMut()) -> f64 {
    let mut best = f64::INFINITY;
    for block in 0..=BLOCKS {
        let clock = Instant::now();
        for _ in 0..CALLS {
            call();
        }
        sync();
        let us = 1e6 * clock.elapsed().as_secs_f64() / CALLS as f64;
        if block > 0 {
            best = best.min(us);
        }
    }
    best
}

/// [`time_blocks`] of a tensor computation; each block reads one value of its last result back
/// so that a lazy backend has finished the block's work.
fn time_us(mut call: impl FnMut() -> Tensor<2>) -> f64 {
    let last = std::cell::RefCell::new(None);
    time_blocks(
        || *last.borrow_mut() = Some(call()),
        || {
            if let Some(t) = last.borrow_mut().take() {
                let _ = to_vec_f32(&t.narrow(0, 0, 1).narrow(1, 0, 1));
            }
        },
    )
}

/// [`time_blocks`] of host code (the hand-written reference).
fn time_host_us(call: impl FnMut()) -> f64 {
    time_blocks(call, || {})
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let backend: BackendKind = match args.as_slice() {
        [] => BackendKind::Flex,
        [flag, name] if flag == "--backend" => name.parse()?,
        _ => bail!("usage: bnn_step_profile [--backend flex|ndarray|wgpu]"),
    };
    let device = backend.device()?;
    let mut rng = EngineRng::new(0);
    let x: Vec<f64> = to_vec_f64(&rng.normal_tensor(ROWS, INPUTS, &device));
    let y: Vec<f64> = to_vec_f64(&rng.normal_tensor(ROWS, 1, &device));
    let config = |layer_ops| BnnConfig { hidden: vec![HIDDEN], layer_ops, ..BnnConfig::default() };
    let model = Bnn::from_config(&x, &y, INPUTS, &config(LayerOps::Fused), &device)?;
    let plain = Bnn::from_config(&x, &y, INPUTS, &config(LayerOps::Plain), &device)?;
    let particles = model.init(PARTICLES, 0, &device)?;
    let mut batches = BatchStream::new(ROWS, BATCH, BatchOrder::Cycle, 0)?;
    let batch = batches.next_batch(&device);
    let (xb, _) = parvi_model::Minibatch::select(Some(&batch), model_inputs(&x, &device));
    let yb = batch.rows(model_targets(&y, &device));

    let mut rows = Vec::new();
    let mut score_us = 0.0;
    for (name, model) in [("fused layers", &model), ("plain-op layers", &plain)] {
        let us = time_us(|| score(model, particles.clone(), Some(&batch)).expect("finite score").grad);
        score_us = if model.config().layer_ops == LayerOps::Fused { us } else { score_us };
        rows.push((format!("score (forward + backward), {name}"), us));
        let forward = time_us(|| model.log_prob(particles.clone(), Some(&batch)).reshape([PARTICLES, 1]));
        rows.push((format!("forward only, {name}"), forward));
        let floor = time_us(|| {
            value_and_grad(particles.clone(), |p| {
                let f = model.forward(p, xb.clone());
                let ssr = match model.config().layer_ops {
                    LayerOps::Fused => fused::sum_squared_residuals(yb.clone(), f),
                    LayerOps::Plain => (yb.clone() - f).square().sum_dim(0),
                };
                ssr.neg().reshape([PARTICLES])
            })
            .expect("tracked")
            .1
        });
        rows.push((format!("likelihood score floor, {name}"), floor));
    }
    let chain = |shape: [usize; 2]| {
        let leaf = Tensor::<2>::ones(shape, &device);
        time_us(|| {
            value_and_grad(leaf.clone(), |mut t| {
                for i in 0..CHAIN {
                    t = if i % 2 == 0 { t.mul_scalar(1.0001) } else { t.add_scalar(0.0001) };
                }
                t.sum_dim(1).reshape([shape[0]])
            })
            .expect("tracked")
            .1
        }) / CHAIN as f64
    };
    rows.push(("autodiff node, [20, 1]".into(), chain([PARTICLES, 1])));
    rows.push(("autodiff node, [20, 753]".into(), chain([PARTICLES, model.dim()])));
    let grad = score(&model, particles.clone(), Some(&batch))?.grad;
    let kernel = Rbf::median();
    let direction_us = time_us(|| svgd_direction(&kernel, particles.clone(), grad.clone()));
    rows.push(("svgd direction".into(), direction_us));
    let dense_us = time_us(|| svgd_direction_dense(&kernel, particles.clone(), grad.clone()));
    rows.push(("svgd direction, dense tensor ops".into(), dense_us));
    let mut adagrad = AdapterConfig::adagrad(1e-3).build()?;
    let adapter_us = time_us(|| particles.clone() + adagrad.delta(grad.clone()));
    rows.push(("adagrad update".into(), adapter_us));
    let mut stream = BatchStream::new(ROWS, BATCH, BatchOrder::Cycle, 0)?;
    let indices_us = time_blocks(
        || {
            let _ = stream.next_batch(&device);
        },
        || {},
    );
    rows.push(("run loop: minibatch index tensor".into(), indices_us));
    let checked = Particles::new(particles.clone());
    let finite_us = time_blocks(|| assert!(checked.is_finite()), || {});
    rows.push(("run loop: finiteness check".into(), finite_us));
    let elementwise_us = time_blocks(|| assert!(particles.clone().is_finite().all().into_scalar::<bool>()), || {});
    rows.push(("finiteness check, elementwise (before)".into(), elementwise_us));

    let spec = EngineSpec::new(
        MethodConfig::default_for("svgd")?,
        KernelConfig::Rbf { bandwidth: None },
        AdapterConfig::adagrad(1e-3),
    );
    let start = Particles::new(particles.clone());
    let mut run_us = f64::INFINITY;
    for block in 0..=BLOCKS {
        let mut engine = spec.build()?;
        let config = RunConfig { batch_size: Some(BATCH), batch_order: BatchOrder::Cycle, ..RunConfig::new(CALLS, 0) };
        let outcome = Runner::new(engine.as_mut(), &model, start.clone(), config)?.run(&mut [])?;
        if block > 0 {
            run_us = run_us.min(1e3 * outcome.ms_per_step());
        }
    }
    rows.push(("svgd step through the run loop".into(), run_us));

    let shape = BnnShape { inputs: INPUTS, hidden: HIDDEN };
    let (xf, yf): (Vec<f32>, Vec<f32>) = (x.iter().map(|&v| v as f32).collect(), y.iter().map(|&v| v as f32).collect());
    let mut reference = HandwrittenSvgd::new(shape, PARTICLES, &xf, &yf, 1e-3, 0.9, 1e-6);
    let host = to_vec_f32(&particles);
    let indices = (0..BATCH).collect::<Vec<_>>();
    rows.push((
        "hand-written score".into(),
        time_host_us(|| {
            let _ = reference.scores(&host, &indices);
        }),
    ));
    let mut moving = host.clone();
    rows.push(("hand-written step".into(), time_host_us(|| reference.step(&mut moving, &indices))));

    println!(
        "Boston-sized BNN SVGD step on {}, microseconds per call (min of {BLOCKS} blocks of {CALLS})",
        backend.name()
    );
    for (name, us) in &rows {
        println!("{name:<45} {us:>9.1}");
    }
    println!(
        "{:<45} {:>9.1}   (fused score + direction + update)",
        "parvi parts, summed",
        score_us + direction_us + adapter_us
    );
    Ok(())
}

fn model_inputs(x: &[f64], device: &parvi_model::burn::tensor::Device) -> Tensor<2> {
    parvi_model::tensor_ops::matrix_from_vec(x.iter().map(|&v| v as f32).collect(), ROWS, INPUTS, device)
}

fn model_targets(y: &[f64], device: &parvi_model::burn::tensor::Device) -> Tensor<2> {
    parvi_model::tensor_ops::matrix_from_vec(y.iter().map(|&v| v as f32).collect(), ROWS, 1, device)
}
