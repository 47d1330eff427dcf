//! Checkpoint at step 100 and resume to 200 gives particles bit-identical to an uninterrupted
//! run, minibatch position and adapter state included.

mod common;

use common::*;
use parvi_infer::CheckpointPolicy;
use parvi_infer::core::Checkpoint;
use parvi_infer::{AdapterConfig, BatchOrder, EngineRng, Particles, Rbf, RunConfig, Runner, Svgd};
use parvi_model::burn::tensor::{Device, Tensor};
use parvi_model::dist::{LogProb, Normal};
use parvi_model::tensor_ops::matrix_from_vec;
use parvi_model::{LogDensity, Minibatch};

/// `y_i ~ N(theta, 1)`, `theta ~ N(0, 10^2)` in 2-D: a model with data, so minibatches matter.
struct NormalMean {
    y: Tensor<2>,
    rows: usize,
}

impl NormalMean {
    fn new(device: &Device) -> Self {
        let mut rng = EngineRng::new(9);
        let rows = 57;
        let v: Vec<f32> = (0..rows * 2).map(|i| (rng.normal() + if i % 2 == 0 { 1.0 } else { -2.0 }) as f32).collect();
        Self { y: matrix_from_vec(v, rows, 2, device), rows }
    }
}

impl LogDensity for NormalMean {
    fn dim(&self) -> usize {
        2
    }
    fn data_len(&self) -> Option<usize> {
        Some(self.rows)
    }
    fn log_prob(&self, theta: Tensor<2>, batch: Option<&Minibatch>) -> Tensor<1> {
        let n = theta.dims()[0];
        let (y, scale) = Minibatch::select(batch, self.y.clone());
        let b = y.dims()[0];
        // [n, 1, 2] against [1, b, 2]
        let diff = y.reshape([1, b, 2]) - theta.clone().reshape([n, 1, 2]);
        let lik = Normal::new(0.0, 1.0).unwrap().log_prob(diff).sum_dim(2).sum_dim(1).reshape([n]);
        let prior = Normal::new(0.0, 10.0).unwrap().log_prob(theta).sum_dim(1).reshape([n]);
        lik.mul_scalar(scale) + prior
    }
}

fn config(steps: usize, checkpoint: Option<CheckpointPolicy>) -> RunConfig {
    RunConfig { batch_size: Some(10), batch_order: BatchOrder::Shuffle, checkpoint, ..RunConfig::new(steps, 42) }
}

#[test]
fn resume_is_bit_identical() {
    let device = flex();
    let model = NormalMean::new(&device);
    let start = Particles::gaussian(30, 2, 0.0, 1.0, &mut EngineRng::new(1), &device).unwrap();
    let engine = || Svgd::new(Box::new(Rbf::median()), AdapterConfig::adagrad(0.05).build().unwrap());

    let mut full = engine();
    let uninterrupted = Runner::new(&mut full, &model, start.clone(), config(200, None)).unwrap().run(&mut []).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ckpt.json");
    let mut first = engine();
    let policy = CheckpointPolicy { path: path.clone(), every: 100 };
    Runner::new(&mut first, &model, start, config(100, Some(policy))).unwrap().run(&mut []).unwrap();
    let ckpt = Checkpoint::load(&path).unwrap();
    assert_eq!(ckpt.step, 100);
    let mut second = engine();
    let resumed = Runner::resume(&mut second, &model, config(200, None), &ckpt, &device).unwrap().run(&mut []).unwrap();

    assert_eq!(resumed.steps, 200);
    let (a, b) = (host(&uninterrupted.particles.positions), host(&resumed.particles.positions));
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "resumed run differs");
    // The run moved the particles (the comparison is not trivially equal).
    let posterior_mean = uninterrupted.particles.mean();
    assert!((posterior_mean[0] - 1.0).abs() < 0.5 && (posterior_mean[1] + 2.0).abs() < 0.5, "{posterior_mean:?}");
}

/// f64 scalars in an engine's state load back to the bits they were saved from, and the
/// checksum holds: these values are among those a best-effort JSON float parser reads one ulp
/// off (serde_json without `float_roundtrip`), which failed the checksum of the loaded file.
#[test]
fn checkpoint_scalars_round_trip_bit_for_bit() {
    let device = flex();
    let model = NormalMean::new(&device);
    let start = Particles::gaussian(5, 2, 0.0, 1.0, &mut EngineRng::new(1), &device).unwrap();
    let mut engine = Svgd::new(Box::new(Rbf::median()), AdapterConfig::adagrad(0.05).build().unwrap());
    let runner = Runner::new(&mut engine, &model, start, config(1, None)).unwrap();
    let mut ckpt = runner.checkpoint().unwrap();
    let awkward = [-1.0729132283643165e-38, -5.791054108416719e-286, 2.744938900923684e-298, -1.8218816927580057e294];
    for (i, v) in awkward.iter().enumerate() {
        ckpt.engine_state.scalars.insert(format!("probe.{i}"), *v);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ckpt.json");
    ckpt.save(&path).unwrap();
    let loaded = Checkpoint::load(&path).unwrap_or_else(|e| panic!("the saved checkpoint does not load: {e}"));
    for (i, v) in awkward.iter().enumerate() {
        assert_eq!(loaded.engine_state.scalars[&format!("probe.{i}")].to_bits(), v.to_bits(), "scalar {v:e}");
    }
}

#[test]
fn checkpoint_of_another_engine_or_garbage_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.json");
    std::fs::write(&path, b"{ not json").unwrap();
    let err = Checkpoint::load(&path).unwrap_err().to_string();
    assert!(err.contains("bad.json"), "{err}");
}

/// With the divergence check every k steps, a blow-up is still caught, and the particles handed
/// back are those of the last passed check: finite.
#[test]
fn sparse_divergence_checks_still_catch_a_blow_up() {
    use parvi_infer::{AdapterConfig, EngineRng, Particles, Rbf, RunConfig, RunError, Runner, Svgd};
    let device = common::flex();
    let target = parvi_models::builtin_target("gaussian", &device).unwrap();
    let start = Particles::gaussian(10, 2, 0.0, 1.0, &mut EngineRng::new(1), &device).unwrap();
    // Plain gradient steps of size 1e6 overshoot to infinity within a few steps.
    let mut svgd = Svgd::new(Box::new(Rbf::median()), AdapterConfig::sgd(1e6).build().unwrap());
    let config = RunConfig { guard_every: 7, ..RunConfig::new(200, 0) };
    match Runner::new(&mut svgd, target.density.as_ref(), start, config).unwrap().run(&mut []) {
        Err(RunError::Diverged { step, cause, last_finite }) => {
            assert!(step < 200, "{step}");
            assert!(last_finite.is_finite(), "{cause}");
            assert!(cause.contains("every 7 steps") || step < 7, "{cause}");
        }
        other => panic!("expected divergence, got {:?}", other.map(|o| o.steps)),
    }
}

/// A wall-clock budget stops the run after the first step past it, long before `steps`.
#[test]
fn a_time_budget_stops_the_run() {
    use parvi_infer::{AdapterConfig, EngineRng, Particles, Rbf, RunConfig, Runner, Svgd};
    let device = common::flex();
    let target = parvi_models::builtin_target("gaussian", &device).unwrap();
    let start = Particles::gaussian(50, 2, 0.0, 1.0, &mut EngineRng::new(1), &device).unwrap();
    let mut svgd = Svgd::new(Box::new(Rbf::median()), AdapterConfig::adagrad(0.05).build().unwrap());
    let config = RunConfig { max_seconds: Some(0.2), ..RunConfig::new(100_000_000, 0) };
    let out = Runner::new(&mut svgd, target.density.as_ref(), start, config).unwrap().run(&mut []).unwrap();
    assert!(out.steps >= 1 && out.steps < 100_000_000, "{} steps", out.steps);
    assert!(out.seconds >= 0.2, "stopped early: {} s", out.seconds);
    assert!(out.particles.is_finite());
}

/// The sharded step in one process ([`SingleProcess`]: the same scores, row block and gathers
/// as an MPI rank, without MPI) gives the plain step's particles up to float rounding, with
/// minibatches; a method without a sharded step is refused by name before any step.
#[test]
fn the_sharded_step_in_one_process_is_the_plain_step() {
    use parvi_infer::core::SingleProcess;
    use std::sync::Arc;
    let device = flex();
    let model = NormalMean::new(&device);
    let start = Particles::gaussian(37, 2, 0.0, 1.0, &mut EngineRng::new(4), &device).unwrap();
    let run = |collective: Option<Arc<dyn parvi_infer::core::Collective>>| {
        let mut engine = Svgd::new(Box::new(Rbf::median()), AdapterConfig::adagrad(0.05).build().unwrap());
        let config = RunConfig { collective, ..config(40, None) };
        host(
            &Runner::new(&mut engine, &model, start.clone(), config).unwrap().run(&mut []).unwrap().particles.positions,
        )
    };
    let (plain, sharded) = (run(None), run(Some(Arc::new(SingleProcess))));
    let gap = plain.iter().zip(&sharded).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(gap < 1e-4, "sharded in one process differs from the plain step by {gap}");

    let spec = parvi_infer::EngineSpec::new(
        parvi_infer::MethodConfig::default_for("mmd-fw").unwrap(),
        parvi_infer::KernelConfig::default(),
        AdapterConfig::adagrad(0.05),
    );
    let mut mmd_fw = spec.build().unwrap();
    let config = RunConfig { collective: Some(Arc::new(SingleProcess)), ..config(5, None) };
    let err = Runner::new(mmd_fw.as_mut(), &model, start, config).err().expect("mmd-fw cannot shard");
    assert!(err.to_string().contains("mmd-fw cannot run sharded yet"), "{err}");
}

/// `max |a - b|` over the spread (sd) of `reference`.
fn gap_of_spread(reference: &[f32], other: &[f32]) -> f64 {
    assert_eq!(reference.len(), other.len());
    let mean = reference.iter().map(|&v| f64::from(v)).sum::<f64>() / reference.len() as f64;
    let var = reference.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / reference.len() as f64;
    let gap = reference.iter().zip(other).map(|(a, b)| f64::from((a - b).abs())).fold(0.0, f64::max);
    gap / var.sqrt()
}

/// A run with the particles shared among three in-process ranks (uneven shards of 31), where
/// each rank steps its particles with its own rows of AdaGrad's history, gives one process's
/// particles to float rounding; its checkpoint holds the whole history, gathered from the
/// ranks (a rank's rows alone would not load), and resumes in one process to the same end.
#[test]
fn a_particle_sharded_run_checkpoints_the_whole_step_size_state() {
    use std::sync::Arc;
    let device = flex();
    let engine = || Svgd::new(Box::new(Rbf::median()), AdapterConfig::adagrad(0.05).build().unwrap());
    let start = || Particles::gaussian(31, 2, 0.0, 1.0, &mut EngineRng::new(1), &flex()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (whole_path, shared_path) = (dir.path().join("whole.json"), dir.path().join("shared.json"));

    let model = NormalMean::new(&device);
    let mut one = engine();
    let whole = Runner::new(&mut one, &model, start(), config(60, None)).unwrap().run(&mut []).unwrap();
    let mut one = engine();
    let policy = CheckpointPolicy { path: whole_path.clone(), every: 30 };
    Runner::new(&mut one, &model, start(), config(30, Some(policy))).unwrap().run(&mut []).unwrap();

    let ends = ThreadGroup::run(3, |group| {
        let model = NormalMean::new(&flex());
        let mut engine = engine();
        let policy = CheckpointPolicy { path: shared_path.clone(), every: 30 };
        let config = RunConfig { collective: Some(Arc::new(group)), ..config(30, Some(policy)) };
        let half = Runner::new(&mut engine, &model, start(), config).unwrap().run(&mut []).unwrap();
        host(&half.particles.positions)
    });
    assert!(ends.windows(2).all(|w| w[0] == w[1]), "the ranks end with different particles");
    let shared = Checkpoint::load(&shared_path).unwrap();
    let at_30 = Checkpoint::load(&whole_path).unwrap();
    assert_eq!(shared.step, 30);
    let (hist, reference) = (&shared.engine_state.tensors["adapter.hist"], &at_30.engine_state.tensors["adapter.hist"]);
    assert_eq!(hist.shape, vec![31, 2], "the checkpoint holds {:?} of the history", hist.shape);
    let gap = gap_of_spread(&reference.values, &hist.values);
    assert!(gap < 1e-4, "the gathered history differs from one process's by {gap} of its spread");
    let gap = gap_of_spread(&at_30.particles.values, &shared.particles.values);
    assert!(gap < 1e-4, "the shared run's particles differ from one process's by {gap} of their spread");

    let mut resumed_engine = engine();
    let resumed =
        Runner::resume(&mut resumed_engine, &model, config(60, None), &shared, &device).unwrap().run(&mut []).unwrap();
    let gap = gap_of_spread(&host(&whole.particles.positions), &host(&resumed.particles.positions));
    assert!(gap < 1e-4, "resumed in one process, the particles differ by {gap} of their spread");
}

/// Ranks whose clocks disagree about a time budget stop at the same step: here one rank's
/// budget is spent after its first step and the other's never is. Were each rank to stop by
/// its own clock, the second would wait for ever in its next step's collective (the run is
/// watched from another thread and fails after a minute rather than hang).
#[test]
fn sharded_ranks_stop_together_when_one_runs_out_of_time() {
    use parvi_infer::core::Collective;
    use std::sync::{Arc, mpsc};
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        let steps = ThreadGroup::run(2, |group| {
            let model = NormalMean::new(&flex());
            let start = Particles::gaussian(10, 2, 0.0, 1.0, &mut EngineRng::new(1), &flex()).unwrap();
            let mut engine = Svgd::new(Box::new(Rbf::median()), AdapterConfig::adagrad(0.05).build().unwrap());
            let budget = if group.rank() == 0 { 1e-9 } else { 1e9 };
            let config = RunConfig { collective: Some(Arc::new(group)), max_seconds: Some(budget), ..config(50, None) };
            Runner::new(&mut engine, &model, start, config).unwrap().run(&mut []).unwrap().steps_run
        });
        let _ = done.send(steps);
    });
    let steps = finished.recv_timeout(std::time::Duration::from_secs(60)).expect("a rank was left waiting");
    assert_eq!(steps, vec![1, 1], "the ranks ran {steps:?} steps");
}
