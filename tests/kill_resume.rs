//! Interrupted runs: `parvi fit` and `parvi bnn` killed with SIGKILL at three points and resumed
//! from their checkpoints end with particles bit-identical to an uninterrupted run, and no torn
//! or partial file is ever where a result belongs (every read of the checkpoint while the run
//! writes it loads and passes its checksum). Two processes writing one `--out` leave complete
//! files, each from one of them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use parvi::infer::core::Checkpoint;
use parvi::models::posterior::Posterior;

fn parvi() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_parvi"));
    cmd.stdout(Stdio::null()).stderr(Stdio::piped());
    cmd
}

fn run_to_end(mut cmd: Command) {
    let out = cmd.output().expect("run parvi");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{cmd:?} failed: {stderr}");
}

/// The files a finished or killed run may leave in `out` where a result belongs; each must be
/// complete whenever it exists. Hidden temporary files (`.name.tmp-*`) are not results.
fn check_no_torn_results(out: &Path) {
    let Ok(entries) = std::fs::read_dir(out) else { return };
    for entry in entries {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with('.') {
            assert!(name.contains(".tmp-"), "unexpected hidden file {name}");
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        match path.extension().and_then(|e| e.to_str()) {
            Some("json") if name == "checkpoint.json" => {
                Checkpoint::load(&path).unwrap_or_else(|e| panic!("torn checkpoint: {e}"));
            }
            Some("json") => {
                serde_json::from_slice::<serde_json::Value>(&bytes).unwrap_or_else(|e| panic!("torn {name}: {e}"));
            }
            Some("csv") => {
                let text = String::from_utf8(bytes).unwrap();
                // CmdStan's CSV (draws.csv) has comment lines; every other line is one row.
                let widths: Vec<usize> =
                    text.lines().filter(|l| !l.starts_with('#')).map(|l| l.split(',').count()).collect();
                assert!(text.ends_with('\n') && widths.windows(2).all(|w| w[0] == w[1]), "torn {name}");
            }
            Some("svg") => assert!(String::from_utf8(bytes).unwrap().trim_end().ends_with("</svg>"), "torn {name}"),
            Some("safetensors") => {
                Posterior::load(&path).unwrap_or_else(|e| panic!("torn {name}: {e}"));
            }
            _ => panic!("unexpected file {name} in {}", out.display()),
        }
    }
}

/// Polls `out/checkpoint.json` while `child` runs (every read must load: the writes are atomic)
/// and kills the child with SIGKILL once a checkpoint at step `at` or later is on disk. Returns
/// the step of the checkpoint the child left.
fn kill_at(child: &mut Child, out: &Path, at: usize) -> usize {
    let path = out.join("checkpoint.json");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(Instant::now() < deadline, "no checkpoint at step {at} within 120 s");
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the run ended ({status}) before it could be killed at step {at}");
        }
        if path.exists() {
            let ckpt = Checkpoint::load(&path).unwrap_or_else(|e| panic!("a torn checkpoint was visible: {e}"));
            if ckpt.step >= at {
                child.kill().unwrap(); // SIGKILL on Unix.
                child.wait().unwrap();
                check_no_torn_results(out);
                return Checkpoint::load(&path).unwrap().step;
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// What [`interrupted_and_uninterrupted`] leaves: both output directories and the particles
/// of the first kill's checkpoint.
struct Runs {
    reference: PathBuf,
    interrupted: PathBuf,
    first_kill: Vec<f32>,
}

/// Runs `args` (plus `per_out(out)`) once uninterrupted, and once killed at three points and
/// resumed from its checkpoint each time, then to the end.
fn interrupted_and_uninterrupted(
    args: &[&str],
    per_out: impl Fn(&Path) -> Vec<String>,
    steps: usize,
    every: usize,
    dir: &Path,
) -> Runs {
    let reference = dir.join("reference");
    let interrupted = dir.join("interrupted");
    let mut cmd = parvi();
    cmd.args(args).arg("--out").arg(&reference).args(per_out(&reference));
    run_to_end(cmd);
    check_no_torn_results(&reference);

    let every_s = every.to_string();
    let checkpoint = interrupted.join("checkpoint.json");
    let mut last = 0;
    let mut first_kill = Vec::new();
    for (i, fraction) in [0.15, 0.45, 0.7].into_iter().enumerate() {
        let mut cmd = parvi();
        cmd.args(args).arg("--out").arg(&interrupted).args(per_out(&interrupted));
        cmd.args(["--checkpoint-every", &every_s]);
        if i > 0 {
            cmd.arg("--resume").arg(&checkpoint);
        }
        let mut child = cmd.spawn().unwrap();
        // At least one new checkpoint after each resume, so each kill lands in a new stretch.
        let at = ((fraction * steps as f64) as usize).max(last + every);
        let step = kill_at(&mut child, &interrupted, at);
        assert!(step >= at && step < steps, "killed at step {step}, asked for {at} of {steps}");
        if i == 0 {
            first_kill = Checkpoint::load(&checkpoint).unwrap().particles.values;
        }
        last = step;
    }
    let mut cmd = parvi();
    cmd.args(args).arg("--out").arg(&interrupted).args(per_out(&interrupted));
    cmd.args(["--checkpoint-every", &every_s]).arg("--resume").arg(&checkpoint);
    run_to_end(cmd);
    check_no_torn_results(&interrupted);
    assert_eq!(Checkpoint::load(&checkpoint).unwrap().step, steps);
    Runs { reference, interrupted, first_kill }
}

fn host_rows(csv: &str) -> Vec<f32> {
    csv.lines().skip(1).flat_map(|l| l.split(',').map(|v| v.parse::<f32>().unwrap()).collect::<Vec<_>>()).collect()
}

#[test]
fn fit_killed_three_times_and_resumed_matches_an_uninterrupted_run_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let steps = 3000;
    let steps_s = steps.to_string();
    // `--all-steps`: a run of fixed length on both sides (a checkpointing run never settles early).
    let args = [
        "fit",
        "--model",
        "banana",
        "--particles",
        "60",
        "--steps",
        &steps_s,
        "--seed",
        "11",
        "--quiet",
        "--all-steps",
    ];
    let runs = interrupted_and_uninterrupted(&args, |_| Vec::new(), steps, 20, dir.path());
    let a = std::fs::read_to_string(runs.reference.join("particles.csv")).unwrap();
    let b = std::fs::read_to_string(runs.interrupted.join("particles.csv")).unwrap();
    assert_eq!(a.lines().count(), 61);
    let (a, b) = (host_rows(&a), host_rows(&b));
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "the resumed particles differ");
    // The particles moved after the first kill: the comparison is not of two frozen copies.
    assert_ne!(a, runs.first_kill);
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(runs.interrupted.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["steps"], steps);
}

#[test]
fn bnn_killed_three_times_and_resumed_matches_an_uninterrupted_run_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let steps = 2000;
    let steps_s = steps.to_string();
    // The toy regression: 20 training rows in minibatches of 7, checkpointed every 23 steps, so
    // that a checkpoint's batch position (part of the state a resume restores) is mid-epoch.
    let args = ["bnn", "--iters", &steps_s, "--batch", "7", "--particles", "10", "--seed", "5"];
    let posterior = |out: &Path| out.join("posterior.safetensors");
    let save = |out: &Path| vec!["--save-posterior".to_string(), posterior(out).display().to_string()];
    let runs = interrupted_and_uninterrupted(&args, save, steps, 23, dir.path());
    let a = Posterior::load(&posterior(&runs.reference)).unwrap();
    let b = Posterior::load(&posterior(&runs.interrupted)).unwrap();
    assert_eq!(a.positions.len(), 10 * a.meta.dim);
    let same = a.positions.iter().zip(&b.positions).all(|(x, y)| x.to_bits() == y.to_bits());
    assert!(same && a.positions.len() == b.positions.len(), "the resumed BNN particles differ");
    assert_eq!(a.noise_sd, b.noise_sd);
    assert_ne!(a.positions, runs.first_kill);
}

#[test]
fn two_processes_writing_one_out_directory_leave_complete_files() {
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    let args = |seed: &str| {
        ["fit", "--model", "gaussian", "--particles", "50", "--steps", "400", "--seed", seed, "--quiet", "--all-steps"]
            .map(str::to_string)
            .to_vec()
    };
    // Each run alone, for its expected files.
    for seed in ["1", "2"] {
        let mut cmd = parvi();
        cmd.args(args(seed)).arg("--out").arg(dir.path().join(format!("alone-{seed}")));
        run_to_end(cmd);
    }
    // Both at once into one directory, checkpointing every step so the writes overlap.
    for round in 0..3 {
        let children: Vec<Child> = ["1", "2"]
            .iter()
            .map(|seed| {
                let mut cmd = parvi();
                cmd.args(args(seed)).arg("--out").arg(&shared).args(["--checkpoint-every", "1"]);
                cmd.spawn().unwrap()
            })
            .collect();
        for mut child in children {
            let out = child.wait_with_output_stderr();
            assert!(out.0.success(), "round {round}: {}", out.1);
        }
        check_no_torn_results(&shared);
        for file in ["particles.csv", "particles.svg"] {
            let got = std::fs::read(shared.join(file)).unwrap();
            let from_one = ["1", "2"]
                .iter()
                .any(|seed| std::fs::read(dir.path().join(format!("alone-{seed}")).join(file)).unwrap() == got);
            assert!(from_one, "round {round}: {file} is a mix of the two runs");
        }
        let summary: serde_json::Value =
            serde_json::from_slice(&std::fs::read(shared.join("summary.json")).unwrap()).unwrap();
        let seed = summary["seed"].to_string();
        let alone: serde_json::Value = serde_json::from_slice(
            &std::fs::read(dir.path().join(format!("alone-{seed}")).join("summary.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(summary["posterior_mean"], alone["posterior_mean"], "round {round}: summary.json is a mix");
        assert_eq!(Checkpoint::load(&shared.join("checkpoint.json")).unwrap().step, 400);
    }
}

trait WaitStderr {
    fn wait_with_output_stderr(&mut self) -> (std::process::ExitStatus, String);
}

impl WaitStderr for Child {
    fn wait_with_output_stderr(&mut self) -> (std::process::ExitStatus, String) {
        use std::io::Read;
        let mut stderr = String::new();
        if let Some(mut e) = self.stderr.take() {
            let _ = e.read_to_string(&mut stderr);
        }
        (self.wait().unwrap(), stderr)
    }
}
