//! The data block's checks through a model executable: a scalar outside its bounds, a datum
//! that a distribution's constructor refuses (a negative count, a zero scale) and a model's own
//! check are each refused by file, field and 1-based element, exit status 2, nothing written;
//! `info` reports the transformed data once.

use std::path::{Path, PathBuf};
use std::process::Command;

fn exe() -> Command {
    Command::new(env!("CARGO_BIN_EXE_poisson-counts"))
}

fn data_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data.json")
}

/// An edit of a valid data file.
type Edit = dyn Fn(&mut serde_json::Value);

#[test]
fn bad_data_is_refused_by_field_and_element_with_nothing_written() {
    let good: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(data_file()).unwrap()).unwrap();
    let cases: Vec<(&str, Box<Edit>, &str)> = vec![
        (
            "negative-count",
            Box::new(|d| d["y"][2] = (-1).into()),
            "field `y`, element [3]: `counts` of PoissonLog: must be whole numbers >= 0, got -1",
        ),
        ("zero-scale", Box::new(|d| d["prior_scale"] = 0.into()), "field `prior_scale`: `scale` of Normal"),
        (
            "negative-scale",
            Box::new(|d| d["prior_scale"] = (-1.5).into()),
            "field `prior_scale`: value -1.5 is below the lower bound 0 declared in the data block",
        ),
        (
            "no-rows",
            Box::new(|d| {
                d["N"] = 0.into();
                for f in ["y", "x"] {
                    d[f] = serde_json::json!([]);
                }
            }),
            "field `N`: value 0 is below the lower bound 1",
        ),
        ("no-spread", Box::new(|d| d["x"] = serde_json::json!(vec![2.5; 50])), "field `x`: has no spread"),
        ("real-count", Box::new(|d| d["y"][7] = 1.5.into()), "field `y`, element [8]: expected an integer, found 1.5"),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (name, edit, expected) in cases {
        let mut data = good.clone();
        edit(&mut data);
        let file = dir.path().join(format!("{name}.json"));
        std::fs::write(&file, data.to_string()).unwrap();
        let out = dir.path().join(format!("out-{name}"));
        let run = exe().args(["fit", "--quiet", "--data"]).arg(&file).arg("--out").arg(&out).output().unwrap();
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(2), "{name}: {stderr}");
        assert!(stderr.contains(&file.display().to_string()) && stderr.contains(expected), "{name}: {stderr}");
        assert!(!out.exists(), "{name}: wrote {}", out.display());
    }
}

#[test]
fn info_reports_the_transformed_data_once() {
    let run = exe().arg("info").arg("--data").arg(data_file()).output().unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    assert!(stdout.contains("parameters and transformed parameters = beta[1], beta[2]"), "{stdout}");
    assert!(stdout.contains("generated quantities = slope"), "{stdout}");
    // mean and sd (n - 1) of x, as Stan's mean() and sd() compute them.
    let data: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(data_file()).unwrap()).unwrap();
    let x: Vec<f64> = data["x"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    let mean = x.iter().sum::<f64>() / x.len() as f64;
    let sd = (x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (x.len() as f64 - 1.0)).sqrt();
    let line = stdout.lines().find(|l| l.starts_with("transformed data = ")).unwrap_or_else(|| panic!("{stdout}"));
    let value = |name: &str| -> f64 {
        let at = line.find(&format!("{name} = ")).unwrap_or_else(|| panic!("{line}")) + name.len() + 3;
        line[at..].split(',').next().unwrap().trim().parse().unwrap()
    };
    assert!((value("x_mean") - mean).abs() < 1e-12 && (value("x_sd") - sd).abs() < 1e-12, "{line}: {mean} {sd}");
}
