//! Bad input gets a clear error naming the step or setting, never a panic.

mod common;

use std::process::Command;

use common::{NanBeyond, flex};
use parvi::infer::{AdapterConfig, EngineRng, Particles, Rbf, RunConfig, RunError, Runner, Svgd};
use parvi::model::BackendKind;

#[test]
fn nan_log_joint_stops_with_the_step_and_keeps_finite_particles() {
    let device = flex();
    let start = Particles::gaussian(10, 2, 0.0, 0.1, &mut EngineRng::new(0), &device).unwrap();
    let mut svgd = Svgd::new(Box::new(Rbf::median()), AdapterConfig::sgd(0.2).build().unwrap());
    let err = Runner::new(&mut svgd, &NanBeyond, start, RunConfig::new(500, 0)).unwrap().run(&mut []).unwrap_err();
    match err {
        RunError::Diverged { step, cause, last_finite } => {
            assert!(step > 0 && step < 500, "step {step}");
            assert!(cause.contains("non-finite"), "{cause}");
            assert!(last_finite.is_finite());
            let msg = RunError::Diverged { step, cause, last_finite }.to_string();
            assert!(msg.contains(&format!("step {step}")), "{msg}");
        }
        other => panic!("expected divergence, got {other}"),
    }
}

#[test]
fn zero_particles_and_bad_settings_are_named() {
    let device = flex();
    let err = Particles::gaussian(0, 2, 0.0, 1.0, &mut EngineRng::new(0), &device).unwrap_err().to_string();
    assert!(err.contains("`particles`"), "{err}");
    assert!(Rbf::fixed(0.0).unwrap_err().to_string().contains("`bandwidth`"));
    assert!(Rbf::fixed(-1.0).unwrap_err().to_string().contains("`bandwidth`"));
    assert!(AdapterConfig::adagrad(-0.1).build().err().unwrap().to_string().contains("`lr`"));
    assert!("cuda".parse::<BackendKind>().unwrap_err().to_string().contains("unknown backend `cuda`"));
}

fn parvi(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_parvi")).args(args).output().expect("run parvi");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!stderr.contains("panicked"), "parvi panicked: {stderr}");
    (out.status.success(), stderr)
}

#[test]
fn cli_rejects_bad_settings_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let cases: [(&[&str], &str); 14] = [
        (&["fit", "--model", "nope", "--out", out], "unknown model `nope`"),
        (&["fit", "--model", "gaussian", "--backend", "tpu", "--out", out], "unknown backend `tpu`"),
        (&["fit", "--model", "gaussian", "--particles", "0", "--out", out], "`--particles`"),
        (&["fit", "--model", "gaussian", "--lr", "0", "--out", out], "`lr`"),
        (&["fit", "--model", "gaussian", "--bandwidth", "-1", "--out", out], "`bandwidth`"),
        (&["fit", "--model", "gaussian", "--method", "magic", "--out", out], "unknown method `magic`"),
        (&["fit", "--model", "gaussian", "--polish-kernel", "hmc", "--out", out], "`--polish-kernel`: `hmc`"),
        (&["fit", "--model", "gaussian", "--no-polish", "--polish-kernel", "mala", "--out", out], "`--polish-kernel`"),
        // The BNN's own initialisation runs the network before any engine sees the particles.
        (&["bnn", "--particles", "0", "--out", out], "`particles`"),
        (&["bnn", "--method", "svgd", "--particles", "0", "--out", out], "`particles`"),
        // A step size for a method that has its own steps is refused, not ignored.
        (&["bnn", "--method", "sgld", "--lr", "1e-4", "--out", out], "`--lr`"),
        (&["bnn", "--method", "nuts", "--lr", "1e-4", "--out", out], "`--lr`"),
        (&["fit", "--model", "gaussian", "--method", "pathfinder", "--lr", "0.1", "--out", out], "`--lr`"),
        (&["bnn", "--iters", "0", "--out", out], "`--iters`"),
    ];
    for (args, needle) in cases {
        let (ok, stderr) = parvi(args);
        assert!(!ok, "{args:?} should fail");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

#[test]
fn cli_config_file_errors_name_the_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("fit.toml");
    std::fs::write(&cfg, "model = \"gaussian\"\nparticels = 10\n").unwrap();
    let (ok, stderr) = parvi(&["fit", "--config", cfg.to_str().unwrap(), "--out", dir.path().to_str().unwrap()]);
    assert!(!ok);
    assert!(stderr.contains("fit.toml") && stderr.contains("particels"), "{stderr}");
}
