//! Sharded runs under MPI give the particles of one process: `parvi fit --distributed` under
//! `mpirun -np 1` and `-np 2`, a checkpoint written at 2 ranks resumed at 1, `parvi bnn
//! --distributed` on 2 ranks with the particles or the data rows shared (minibatches and full
//! batches, uneven shares, a rows-sharded checkpoint resumed in one process), and bad input
//! (`--shard rows` on a model without rows, more ranks than rows, a rank that cannot read its
//! data) ending the whole job with a message naming it, without a hang.
//!
//! Tolerance: the sharded step computes the same sums in another order (a `[n, rows]` kernel
//! block and the general Stein form instead of the fused whole-matrix product, scores of a
//! slice), so each step differs by float rounding, about `1e-7` relative; over 30 SVGD steps on
//! the 2-D banana (a contracting flow) it stays far below `1e-4` of the particles' spread, which
//! any real difference (another minibatch, a bandwidth from part of the set, a lost row) exceeds
//! by orders of magnitude.
#![cfg(feature = "mpi")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

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

/// A regression table of `rows` rows (`x1, x2, y`, a smooth function plus fixed noise) in `dir`.
fn table(dir: &Path, name: &str, rows: usize) -> PathBuf {
    let mut text = String::from("x1,x2,y\n");
    for i in 0..rows {
        let (a, b) = ((i as f64 * 0.37).sin() * 2.0, (i as f64 * 0.11).cos());
        let noise = ((i * 7919) % 101) as f64 / 101.0 - 0.5;
        text.push_str(&format!("{a},{b},{}\n", (1.5 * a).sin() + 0.5 * b + 0.2 * noise));
    }
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// `parvi bnn` on `csv` with SVGD (`iters` steps, 9 particles, checkpoints every 10) into `out`,
/// with `extra`. The method is named: a distributed run's default (svgd) is not one process's
/// (fpovi, which cannot be sharded).
fn bnn_csv(csv: &Path, out: &Path, iters: usize, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = ["bnn", "--method", "svgd", "--target", "y", "--particles", "9", "--seed", "2"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(["--iters".into(), iters.to_string()]);
    args.extend(["--checkpoint-every".into(), "10".into(), "--csv".into(), csv.display().to_string()]);
    args.extend(["--out".into(), out.display().to_string()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// Test RMSE and log-likelihood of a `parvi bnn` run, and its rank count.
fn bnn_scores(out: &Path) -> (f64, f64, usize) {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("bnn_summary.json")).unwrap()).unwrap();
    (v["test_rmse"].as_f64().unwrap(), v["test_ll"].as_f64().unwrap(), v["ranks"].as_u64().unwrap() as usize)
}

fn assert_same_scores(what: &str, plain: (f64, f64, usize), other: (f64, f64, usize)) {
    let ((rmse, ll, _), (rmse2, ll2, _)) = (plain, other);
    assert!((rmse - rmse2).abs() <= 1e-5 * rmse, "{what}: RMSE {rmse} alone, {rmse2} sharded");
    assert!((ll - ll2).abs() <= 1e-5 * ll.abs(), "{what}: LL {ll} alone, {ll2} sharded");
}

/// `--shard rows`: each rank holds its share of the 55 training rows (28 and 27 on 2 ranks),
/// scores every particle on them, and the scores are summed. With minibatches of 10 (which fall
/// on one rank's rows, or on both) and with the whole data each step, 1 and 2 ranks give the
/// one process's test RMSE and log-likelihood to `1e-5` relative (float rounding; a prior counted
/// twice or a lost row moves them by far more), and a checkpoint written by 2 ranks at step 20
/// resumes in one process to the one process's result.
#[test]
fn rows_sharded_bnn_scores_as_one_process_and_resumes_alone() {
    let Some(_) = mpirun() else { return };
    let dir = tempfile::tempdir().unwrap();
    let csv = table(dir.path(), "train.csv", 61);
    for batch in ["10", "1000"] {
        let plain = dir.path().join(format!("plain-{batch}"));
        let mut one = Command::new(PARVI);
        one.args(bnn_csv(&csv, &plain, 30, &["--batch", batch]));
        run(one);
        let reference = bnn_scores(&plain);
        for ranks in [1, 2] {
            let out = dir.path().join(format!("rows-{batch}-{ranks}"));
            let mut cmd = mpirun().unwrap();
            cmd.args(["-np", &ranks.to_string(), PARVI]).args(bnn_csv(
                &csv,
                &out,
                30,
                &["--batch", batch, "--distributed", "--shard", "rows"],
            ));
            run(cmd);
            let scores = bnn_scores(&out);
            assert_eq!(scores.2, ranks);
            assert_same_scores(&format!("batch {batch}, {ranks} ranks"), reference, scores);
        }
    }
    let half = dir.path().join("half");
    let mut cmd = mpirun().unwrap();
    cmd.args(["-np", "2", PARVI]).args(bnn_csv(
        &csv,
        &half,
        20,
        &["--batch", "10", "--distributed", "--shard", "rows"],
    ));
    run(cmd);
    let resumed = dir.path().join("resumed");
    let mut one = Command::new(PARVI);
    one.args(bnn_csv(&csv, &resumed, 30, &["--batch", "10", "--resume"])).arg(half.join("checkpoint.json"));
    run(one);
    assert_same_scores("resumed alone", bnn_scores(&dir.path().join("plain-10")), bnn_scores(&resumed));
}

/// Runs `cmd` to its end, failing the test if it is still running after `limit` (a rank left
/// waiting in a collective).
fn finishes(mut cmd: Command, limit: Duration) -> Output {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("start the job");
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            panic!("{cmd:?} still running after {limit:?}: a rank hangs");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    child.wait_with_output().unwrap()
}

fn fails_naming(cmd: Command, needle: &str) {
    let output = finishes(cmd, Duration::from_secs(120));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "the job succeeded: {stderr}");
    assert!(stderr.contains(needle), "no `{needle}` in: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn bad_row_sharding_ends_the_whole_job_by_name() {
    let Some(mut cmd) = mpirun() else { return };
    let dir = tempfile::tempdir().unwrap();
    // A model without data rows.
    cmd.args(["-np", "2", PARVI]).args(fit_args(dir.path(), 5)).args(["--distributed", "--shard", "rows"]);
    fails_naming(cmd, "model `banana` has no data rows to share");
    // Without `--distributed`, in one process.
    let csv = table(dir.path(), "train.csv", 61);
    let mut one = Command::new(PARVI);
    one.args(bnn_csv(&csv, &dir.path().join("alone"), 5, &["--shard", "rows"]));
    fails_naming(one, "add `--distributed`");
    // More ranks than training rows: 4 rows (a test file of its own keeps them all), 5 ranks.
    let (small, test) = (table(dir.path(), "small.csv", 4), table(dir.path(), "test.csv", 5));
    let mut cmd = mpirun().unwrap();
    cmd.args(["-np", "5", PARVI])
        .args(bnn_csv(&small, &dir.path().join("small"), 5, &["--distributed", "--shard", "rows", "--test-csv"]))
        .arg(&test);
    fails_naming(cmd, "cannot be shared among 5 ranks");
    // Rank 1 cannot read its data while rank 0 goes on into the run's collectives: the job ends.
    let missing = dir.path().join("missing.csv");
    let script = format!(
        "if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then exec {PARVI} \"$@\" --csv {}; else exec {PARVI} \"$@\" --csv {}; fi",
        missing.display(),
        csv.display()
    );
    let mut cmd = mpirun().unwrap();
    cmd.args(["-np", "2", "sh", "-c", &script, "sh", "bnn", "--target", "y", "--iters", "200", "--particles", "9"])
        .args(["--distributed", "--shard", "rows", "--out"])
        .arg(dir.path().join("unreadable"));
    fails_naming(cmd, "missing.csv");
}
