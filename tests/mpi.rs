//! Sharded runs under MPI give the particles of one process: `parvi fit --distributed` under
//! `mpirun -np 1` and `-np 2`, a checkpoint written at 2 ranks resumed at 1, and `parvi bnn
//! --distributed` on 2 ranks.
//!
//! Tolerance: the sharded step computes the same sums in another order (a `[n, rows]` kernel
//! block and the general Stein form instead of the fused whole-matrix product, scores of a
//! slice), so each step differs by float rounding, about `1e-7` relative; over 30 SVGD steps on
//! the 2-D banana (a contracting flow) it stays far below `1e-4` of the particles' spread, which
//! any real difference (another minibatch, a bandwidth from part of the set, a lost row) exceeds
//! by orders of magnitude.
#![cfg(feature = "mpi")]

use std::path::Path;
use std::process::Command;

const PARVI: &str = env!("CARGO_BIN_EXE_parvi");

/// `mpirun` with the flags this machine and CI need (root, more ranks than cores), or `None`
/// (with a message) where it is missing and `PARVI_REQUIRE_MPI` is unset.
fn mpirun() -> Option<Command> {
    let found = Command::new("mpirun").arg("--version").output().is_ok_and(|o| o.status.success());
    if !found {
        assert!(std::env::var_os("PARVI_REQUIRE_MPI").is_none(), "PARVI_REQUIRE_MPI is set but mpirun is missing");
        eprintln!("skipping: mpirun not found (install openmpi-bin)");
        return None;
    }
    let mut cmd = Command::new("mpirun");
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1").env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1").arg("--oversubscribe");
    Some(cmd)
}

fn fit_args(out: &Path, steps: usize) -> Vec<String> {
    ["fit", "--model", "banana", "--particles", "37", "--seed", "3", "--quiet", "--checkpoint-every", "10"]
        .iter()
        .map(|s| s.to_string())
        .chain(["--steps".into(), steps.to_string(), "--out".into(), out.display().to_string()])
        .collect()
}

fn run(mut cmd: Command) {
    let output = cmd.output().expect("start the run");
    assert!(output.status.success(), "{:?} failed: {}", cmd, String::from_utf8_lossy(&output.stderr));
}

fn particles(out: &Path) -> Vec<f64> {
    let text = std::fs::read_to_string(out.join("particles.csv")).expect("particles.csv");
    text.lines().skip(1).flat_map(|l| l.split(',').map(|v| v.parse::<f64>().unwrap()).collect::<Vec<_>>()).collect()
}

/// Largest difference relative to the reference's standard deviation.
fn relative_gap(reference: &[f64], other: &[f64]) -> f64 {
    assert_eq!(reference.len(), other.len());
    let mean = reference.iter().sum::<f64>() / reference.len() as f64;
    let sd = (reference.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / reference.len() as f64).sqrt();
    reference.iter().zip(other).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max) / sd
}

#[test]
fn sharded_runs_match_one_process_and_resume_at_another_rank_count() {
    let Some(_) = mpirun() else { return };
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("plain");
    let mut cmd = Command::new(PARVI);
    cmd.args(fit_args(&plain, 30));
    run(cmd);
    let reference = particles(&plain);
    for ranks in [1, 2] {
        let out = dir.path().join(format!("np{ranks}"));
        let mut cmd = mpirun().unwrap();
        cmd.args(["-np", &ranks.to_string(), PARVI]).args(fit_args(&out, 30)).arg("--distributed");
        run(cmd);
        let gap = relative_gap(&reference, &particles(&out));
        assert!(gap < 1e-4, "{ranks} ranks: particles differ by {gap} of their spread");
    }
    // Checkpoint at step 20 of a 2-rank run, resumed to 30 in one process.
    let half = dir.path().join("half");
    let mut cmd = mpirun().unwrap();
    cmd.args(["-np", "2", PARVI]).args(fit_args(&half, 20)).arg("--distributed");
    run(cmd);
    let resumed = dir.path().join("resumed");
    let mut cmd = Command::new(PARVI);
    cmd.args(fit_args(&resumed, 30)).arg("--resume").arg(half.join("checkpoint.json"));
    run(cmd);
    let gap = relative_gap(&reference, &particles(&resumed));
    assert!(gap < 1e-4, "resumed at 1 rank: particles differ by {gap} of their spread");
}

/// A-SVGD (an annealed score, the same row-block direction) shards as SVGD does.
#[test]
fn annealed_svgd_shards_too() {
    let Some(mut cmd) = mpirun() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (plain, shared) = (dir.path().join("plain"), dir.path().join("shared"));
    let mut one = Command::new(PARVI);
    one.args(fit_args(&plain, 30)).args(["--method", "a-svgd"]);
    run(one);
    cmd.args(["-np", "2", PARVI]).args(fit_args(&shared, 30)).args(["--method", "a-svgd", "--distributed"]);
    run(cmd);
    let gap = relative_gap(&particles(&plain), &particles(&shared));
    assert!(gap < 1e-4, "a-svgd on 2 ranks: particles differ by {gap} of their spread");
}

#[test]
fn an_engine_without_a_sharded_step_is_refused_by_name() {
    let Some(mut cmd) = mpirun() else { return };
    let dir = tempfile::tempdir().unwrap();
    cmd.args(["-np", "2", PARVI]).args(fit_args(dir.path(), 5)).args(["--method", "mmd-fw", "--distributed"]);
    let output = cmd.output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("mmd-fw cannot run sharded yet"), "{stderr}");
}

/// `parvi bnn --distributed` (minibatches, the development monitor off, the toy regression):
/// 2 ranks score the test rows as one process does. Over 30 steps the particles differ by float
/// rounding only, so the test RMSE and log-likelihood agree to `1e-5` relative (a lost or doubled
/// row, another minibatch or a bandwidth from half the set moves them by far more: the steps move
/// the RMSE from 13.8 after 5 steps to 9.0 after 50).
#[test]
fn a_sharded_bnn_scores_as_one_process() {
    let Some(mut cmd) = mpirun() else { return };
    let dir = tempfile::tempdir().unwrap();
    let bnn = |out: &Path| -> Vec<String> {
        ["bnn", "--method", "svgd", "--iters", "30", "--particles", "9", "--seed", "2", "--out"]
            .iter()
            .map(|s| s.to_string())
            .chain([out.display().to_string()])
            .collect()
    };
    let summary = |out: &Path| -> (f64, f64, usize) {
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join("bnn_summary.json")).unwrap()).unwrap();
        (v["test_rmse"].as_f64().unwrap(), v["test_ll"].as_f64().unwrap(), v["ranks"].as_u64().unwrap() as usize)
    };
    let (plain, shared) = (dir.path().join("plain"), dir.path().join("shared"));
    let mut one = Command::new(PARVI);
    one.args(bnn(&plain));
    run(one);
    cmd.args(["-np", "2", PARVI]).args(bnn(&shared)).arg("--distributed");
    run(cmd);
    let ((rmse, ll, _), (rmse2, ll2, ranks)) = (summary(&plain), summary(&shared));
    assert_eq!(ranks, 2);
    assert!((rmse - rmse2).abs() <= 1e-5 * rmse, "RMSE {rmse} alone, {rmse2} on 2 ranks");
    assert!((ll - ll2).abs() <= 1e-5 * ll.abs(), "LL {ll} alone, {ll2} on 2 ranks");
}
