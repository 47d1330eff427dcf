//! Uncertainty where the data are not (issue 30): the main job reports its epistemic sd on the
//! test rows and beyond the toy's training range; the ensemble and NUTS run through `parvi bnn`;
//! NUTS refuses networks too large for it by name; `parvi bench uci --gap` reports gap splits.

mod common;

use std::process::Command;

fn bnn(args: &[&str]) -> (std::process::Output, Option<serde_json::Value>) {
    let dir = tempfile::tempdir().unwrap();
    let out =
        Command::new(env!("CARGO_BIN_EXE_parvi")).arg("bnn").args(args).arg("--out").arg(dir.path()).output().unwrap();
    let summary = std::fs::read(dir.path().join("bnn_summary.json")).ok().map(|b| serde_json::from_slice(&b).unwrap());
    (out, summary)
}

fn epistemic(summary: &serde_json::Value) -> (f64, f64) {
    let e = &summary["epistemic_sd"];
    (e["test"].as_f64().unwrap(), e["outside"].as_f64().unwrap())
}

/// The main job (function-space particles, seed 1) meets issue 30's toy acceptance against
/// NUTS's 3.40 on the same BNN (docs/experiments.md): an epistemic sd on the test rows within
/// a factor of 2 of NUTS's, and at least 3 times that beyond the data. Weight-space SVGD
/// (0.26) fails both.
#[test]
fn the_main_job_reports_its_epistemic_sd_inside_and_beyond_the_data() {
    const NUTS_TEST_SD: f64 = 3.40;
    let (out, summary) = bnn(&[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let summary = summary.unwrap();
    assert_eq!(summary["protocol"]["method"], "fpovi");
    let (test, outside) = epistemic(&summary);
    assert!((NUTS_TEST_SD / 2.0..=2.0 * NUTS_TEST_SD).contains(&test), "epistemic sd {test} vs NUTS's {NUTS_TEST_SD}");
    assert!(outside >= 3.0 * test, "outside {outside} vs inside {test}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("beyond the data"));
    let (out, summary) = bnn(&["--method", "svgd"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (test, _) = epistemic(&summary.unwrap());
    assert!(test < NUTS_TEST_SD / 2.0, "svgd's epistemic sd {test}");
}

/// More particles than fpovi's Gaussian repulsion was measured at are run, with a warning that
/// says why and what to do.
#[test]
fn fpovi_warns_past_the_particle_count_it_was_measured_at() {
    let (out, _) = bnn(&["--particles", "21", "--iters", "20"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && err.contains("fpovi's Gaussian repulsion") && err.contains("--particles 20"),
        "{err}"
    );
    let (out, _) = bnn(&["--particles", "21", "--iters", "20", "--opt", "repulsion=kde"]);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("fpovi's Gaussian repulsion"));
}

#[test]
fn ensemble_and_function_space_particles_run_as_methods() {
    for method in ["ensemble", "fpovi"] {
        let (out, summary) = bnn(&["--method", method, "--iters", "300"]);
        assert!(out.status.success(), "{method}: {}", String::from_utf8_lossy(&out.stderr));
        let summary = summary.unwrap();
        let (test, outside) = epistemic(&summary);
        assert!(test > 0.0 && outside > 0.0, "{method}: {test} {outside}");
        assert_eq!(summary["protocol"]["method"], method);
    }
}

#[test]
fn nuts_runs_on_the_toy_and_refuses_deep_networks_by_name() {
    let (out, summary) = bnn(&["--method", "nuts", "--opt", "tune=60", "--opt", "draws=40"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let summary = summary.unwrap();
    assert_eq!(summary["engine"]["draws"], 40);
    assert!(summary["engine"]["gradient_evals"].as_u64().unwrap() >= 100);
    let (test, outside) = epistemic(&summary);
    assert!(test > 0.0 && outside > 0.0);
    let (out, _) = bnn(&["--method", "nuts", "--hidden", "20,20"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--method nuts") && err.contains("hidden layer"), "{err}");
    let (out, _) = bnn(&["--method", "nuts", "--opt", "leapfrogs=3"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("leapfrogs"), "{err}");
}

#[test]
fn bench_uci_gap_reports_gap_splits_beside_the_standard_ones() {
    let Some(dir) = common::uci_dir("yacht") else {
        eprintln!("SKIPPED gap splits: no UCI data (set PARVI_DATA_DIR)");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let json = tmp.path().join("yacht.json");
    let out = Command::new(env!("CARGO_BIN_EXE_parvi"))
        .args(["bench", "uci", "--dataset", "yacht", "--splits", "1", "--gap", "--gap-splits", "2", "--iters", "200"])
        .arg("--data-dir")
        .arg(&dir)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let rows = v.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["splits_kind"], "standard");
    assert_eq!(rows[1]["splits_kind"], "gap");
    assert_eq!(rows[1]["splits"].as_array().unwrap().len(), 2);
    for r in rows {
        assert!(r["ll_mean"].as_f64().unwrap().is_finite());
        let c = r["coverage_90_mean"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&c));
    }
    assert!(String::from_utf8_lossy(&out.stdout).contains("| gap 2 |"));
}
