//! The model executable as a user runs it: `fit` on the Stan data file beside the crate writes
//! CmdStan's CSV with Stan's names and the generated quantities, and the summary table; a data
//! file that does not fit the data block is refused by file, field and element, exit 2, nothing
//! written.

use std::path::{Path, PathBuf};
use std::process::Command;

fn exe() -> Command {
    Command::new(env!("CARGO_BIN_EXE_varying-intercepts"))
}

fn data_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data.json")
}

/// The header line of a CmdStan CSV (the first line that is not a comment).
fn header(csv: &str) -> Vec<String> {
    csv.lines().find(|l| !l.starts_with('#')).expect("a header").split(',').map(str::to_string).collect()
}

#[test]
fn fit_writes_stan_names_generated_quantities_and_the_summary() {
    let out = tempfile::tempdir().unwrap();
    let status = exe()
        .args(["fit", "--data"])
        .arg(data_file())
        .args(["--out"])
        .arg(out.path())
        .args(["--quiet", "--seed", "3"])
        .status()
        .unwrap();
    assert!(status.success());
    let csv = std::fs::read_to_string(out.path().join("draws.csv")).unwrap();
    let names = header(&csv);
    // CmdStan's order: lp__, parameters, transformed parameters, generated quantities.
    let at = |n: &str| names.iter().position(|c| c == n).unwrap_or_else(|| panic!("no column {n} in {names:?}"));
    assert_eq!(at("lp__"), 0);
    assert!(at("mu") < at("eta.6") && at("eta.6") < at("alpha.1") && at("alpha.6") < at("y_rep.1"));
    assert!(at("y_rep.60") < at("log_lik.1"));
    assert_eq!(names.last().map(String::as_str), Some("log_lik.60"));
    assert!(csv.contains(&format!("file = {}", out.path().join("draws.csv").display())));
    let rows: Vec<Vec<f64>> = csv
        .lines()
        .filter(|l| !l.starts_with('#'))
        .skip(1)
        .map(|l| l.split(',').map(|v| v.parse().unwrap()).collect())
        .collect();
    assert!(rows.len() >= 400, "{} draws", rows.len());
    // log_lik is the pointwise density of the draw's own parameters: y_1's term from its columns.
    let data: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(data_file()).unwrap()).unwrap();
    let (y1, x1) = (data["y"][0].as_f64().unwrap(), data["x"][0].as_f64().unwrap());
    for row in rows.iter().take(50) {
        let mean = row[at("alpha.1")] + row[at("beta")] * x1;
        let sigma = row[at("sigma")];
        let expected = -0.5 * ((y1 - mean) / sigma).powi(2) - sigma.ln() - 0.5 * (2.0 * std::f64::consts::PI).ln();
        assert!((row[at("log_lik.1")] - expected).abs() < 1e-3 * expected.abs().max(1.0), "{row:?}");
    }
    // y_rep is a draw around the mean: across draws its spread is at least sigma's.
    let rep: Vec<f64> = rows.iter().map(|r| r[at("y_rep.1")]).collect();
    let mean = rep.iter().sum::<f64>() / rep.len() as f64;
    let sd = (rep.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / rep.len() as f64).sqrt();
    let sigma_mean = rows.iter().map(|r| r[at("sigma")]).sum::<f64>() / rows.len() as f64;
    assert!(sd > 0.9 * sigma_mean, "y_rep sd {sd} against sigma {sigma_mean}");
    let summary = std::fs::read_to_string(out.path().join("summary.csv")).unwrap();
    assert!(summary.lines().any(|l| l.starts_with("\"alpha[3]\"") || l.starts_with("alpha[3]")), "{summary}");
    assert!(out.path().join("summary.json").is_file());
}

/// An edit of a valid data file.
type Edit = dyn Fn(&mut serde_json::Value);

#[test]
fn bad_data_is_refused_by_field_and_element_with_nothing_written() {
    let text = std::fs::read_to_string(data_file()).unwrap();
    let good: serde_json::Value = serde_json::from_str(&text).unwrap();
    let cases: Vec<(&str, Box<Edit>, &str)> = vec![
        ("missing", Box::new(|d| drop(d.as_object_mut().unwrap().remove("y"))), "field `y` is missing"),
        ("size", Box::new(|d| d["N"] = 61.into()), "field `group`: the array has 60 values but N = 61"),
        ("int", Box::new(|d| d["group"][4] = 2.5.into()), "field `group`, element [5]: expected an integer, found 2.5"),
        (
            "bound",
            Box::new(|d| d["group"][9] = 7.into()),
            "field `group`, element [10]: value 7 is above the upper bound J = 6",
        ),
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
    // Not UTF-8, and a truncated file.
    let file = dir.path().join("latin1.json");
    std::fs::write(&file, b"{\"N\": 60, \"name\": \"caf\xe9\"}").unwrap();
    let run = exe().args(["fit", "--data"]).arg(&file).args(["--out", "/nonexistent/never"]).output().unwrap();
    assert_eq!(run.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&run.stderr).contains("not UTF-8"));
    let file = dir.path().join("truncated.json");
    std::fs::write(&file, &text[..text.len() / 2]).unwrap();
    let run = exe().args(["fit", "--data"]).arg(&file).args(["--out", "/nonexistent/never"]).output().unwrap();
    assert_eq!(run.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&run.stderr).contains("not valid JSON"));
}
