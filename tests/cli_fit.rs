//! `parvi fit` writes its summary, particles and plot; flags may come from a TOML file.

use std::process::Command;

#[test]
fn fit_writes_summary_particles_and_plot_from_a_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("fit.toml");
    std::fs::write(&cfg, "model = \"gaussian\"\nparticles = 100\nsteps = 600\nlr = 0.05\nseed = 3\nquiet = true\n")
        .unwrap();
    let out_dir = dir.path().join("out");
    let status = Command::new(env!("CARGO_BIN_EXE_parvi"))
        .args(["fit", "--config", cfg.to_str().unwrap(), "--steps", "800", "--out", out_dir.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(status.success());
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("summary.json")).unwrap()).unwrap();
    for key in [
        "method",
        "model",
        "backend",
        "particles",
        "steps",
        "seconds",
        "ms_per_step",
        "posterior_mean",
        "posterior_cov",
    ] {
        assert!(summary.get(key).is_some(), "summary lacks {key}");
    }
    assert_eq!(summary["max_steps"], 800, "the flag wins over the file");
    // The run stops once the particles have settled, within the budget.
    let steps = summary["steps"].as_u64().unwrap();
    assert!(steps > 0 && steps <= 800, "{steps}");
    assert_eq!(summary["backend"], "flex");
    // The phases the run took, one record each (issue 59), the polish step's last.
    let path = summary["path"].as_array().expect("the path");
    let names: Vec<&str> = path.iter().filter_map(|p| p["name"].as_str()).collect();
    assert_eq!(names[..3], ["laplace", "svgd", "stationarity check"], "{path:#?}");
    assert!(path.iter().all(|p| p["evals"].as_u64().is_some_and(|e| e > 0)), "{path:#?}");
    let mean: Vec<f64> = serde_json::from_value(summary["posterior_mean"].clone()).unwrap();
    assert!((mean[0] + 0.6871).abs() < 0.05 && (mean[1] - 0.8010).abs() < 0.05, "{mean:?}");
    let csv = std::fs::read_to_string(out_dir.join("particles.csv")).unwrap();
    assert_eq!(csv.lines().count(), 101);
    assert!(csv.starts_with("x0,x1\n"));
    let svg = std::fs::read_to_string(out_dir.join("particles.svg")).unwrap();
    assert!(svg.contains("<svg") && svg.matches("<circle").count() >= 100);
}
