//! The model executable as a user runs it: `fit` on the Stan data file beside the crate writes
//! CmdStan's CSV, one file per chain, with Stan's names and the generated quantities, and the
//! summary table; a data file that does not fit the data block is refused by file, field and
//! element, exit 2, nothing written.

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

/// The draws of a CmdStan CSV: every line after the header that is not a comment.
fn rows(csv: &str) -> Vec<Vec<f64>> {
    csv.lines()
        .filter(|l| !l.starts_with('#'))
        .skip(1)
        .map(|l| l.split(',').map(|v| v.parse().unwrap()).collect())
        .collect()
}

/// The value of the comment line `key = value` (the first, wherever it is nested).
fn config<'a>(csv: &'a str, key: &str) -> Option<&'a str> {
    csv.lines()
        .filter_map(|l| l.strip_prefix('#'))
        .find_map(|c| c.split_once(" = ").filter(|(k, _)| k.trim() == key).map(|(_, v)| v.trim()))
}

/// The files `out/draws_1.csv`, `draws_2.csv`, ... that exist, read.
fn chain_files(out: &Path) -> Vec<String> {
    (1..)
        .map(|k| out.join(format!("draws_{k}.csv")))
        .take_while(|p| p.is_file())
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect()
}

fn fit(out: &Path, extra: &[&str]) -> serde_json::Value {
    let run = exe()
        .args(["fit", "--data"])
        .arg(data_file())
        .args(["--out"])
        .arg(out)
        .args(["--quiet", "--seed", "3"])
        .args(extra)
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap()
}

/// Four NUTS chains: four files, each its own chain by its header (`id`, `num_samples`,
/// `num_warmup`, its step size and metric), and summary.json holding the chains, warm-up and
/// draws that ran, and no particle settings.
#[test]
fn nuts_writes_one_file_per_chain_with_a_header_true_to_the_run() {
    let out = tempfile::tempdir().unwrap();
    let summary = fit(out.path(), &["--method", "nuts", "--opt", "warmup=150", "--opt", "draws=100"]);
    let files = chain_files(out.path());
    assert_eq!(files.len(), 4, "one file per chain");
    let sampler = &summary["sampler"];
    assert_eq!((sampler["chains"].as_u64(), sampler["warmup"].as_u64()), (Some(4), Some(150)), "{sampler}");
    assert_eq!(sampler["draws_per_chain"].as_u64(), Some(100));
    for key in ["particles", "steps", "lr", "ms_per_step"] {
        assert!(summary.get(key).is_none(), "a NUTS run's summary.json has `{key}`: {summary}");
    }
    assert_eq!(summary["draws"]["kept"].as_u64(), Some(400));
    for (k, csv) in files.iter().enumerate() {
        assert_eq!(config(csv, "id"), Some((k + 1).to_string().as_str()));
        assert_eq!(config(csv, "num_samples"), Some("100"));
        assert_eq!(config(csv, "num_warmup"), Some("150"));
        assert_eq!(config(csv, "num_chains"), Some("4"));
        assert_eq!(config(csv, "thin"), Some("1"));
        assert_eq!(config(csv, "engine"), Some("nuts"));
        assert_eq!(config(csv, "metric"), Some("diag_e"));
        assert_eq!(config(csv, "chains_in_file"), Some("1"));
        for absent in ["particles", "lr", "kernel", "precondition"] {
            assert!(config(csv, absent).is_none(), "chain {}: `{absent}` in\n{csv}", k + 1);
        }
        assert!(!csv.contains("\"kernel\"") && !csv.contains("adagrad"), "SVGD's settings in a NUTS header");
        // The chain's own adapted step size, as CmdStan writes it, and the summary's.
        let step: f64 = config(csv, "Step size").unwrap().parse().unwrap();
        assert_eq!(step, sampler["step_sizes"][k].as_f64().unwrap());
        assert_eq!(
            config(csv, "divergences").unwrap().parse::<u64>().unwrap(),
            sampler["divergences"][k].as_u64().unwrap()
        );
        assert_eq!(rows(csv).len(), 100);
    }
    // The chains differ (each its own stream).
    assert_ne!(rows(&files[0])[0], rows(&files[1])[0]);
    let summary_csv = std::fs::read_to_string(out.path().join("summary.csv")).unwrap();
    let rhat: f64 = summary_csv.lines().nth(1).unwrap().rsplit(',').next().unwrap().parse().unwrap();
    assert!(rhat.is_finite(), "lp__'s R-hat: {summary_csv}");
}

/// The default path: the polish step's chains thinned to --draws, every chain kept, grouped whole
/// into at most 20 files of equal length, the header saying so; the phases with their seconds.
#[test]
fn the_default_path_keeps_draws_draws_in_files_of_whole_chains() {
    let out = tempfile::tempdir().unwrap();
    let summary = fit(out.path(), &["--draws", "1000", "--output-prefix", "vi"]);
    assert!(!out.path().join("draws_1.csv").exists());
    let files: Vec<String> = (1..)
        .map(|k| out.path().join(format!("vi_{k}.csv")))
        .take_while(|p| p.is_file())
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    let polish = &summary["polish"];
    let chains = polish["chains"].as_u64().unwrap() as usize;
    let draws = &summary["draws"];
    assert_eq!(draws["files"].as_array().unwrap().len(), files.len());
    let per_file = draws["chains_in_file"].as_u64().unwrap() as usize;
    assert_eq!(files.len() * per_file, chains, "every chain kept, whole");
    assert!(files.len() <= 20 && files.len() >= 4, "{} files", files.len());
    let kept = draws["kept"].as_u64().unwrap() as usize;
    assert!(kept <= 1000 + chains && kept >= 4 * chains, "kept {kept}");
    let counted = polish["chains"].as_u64().unwrap() * polish["kept"].as_u64().unwrap();
    assert_eq!(draws["counted"].as_u64(), Some(counted));
    let thin = draws["thin"].as_u64().unwrap();
    for (k, csv) in files.iter().enumerate() {
        assert_eq!(rows(csv).len(), kept / files.len());
        assert_eq!(config(csv, "id"), Some((k + 1).to_string().as_str()));
        assert_eq!(config(csv, "chains_in_file"), Some(per_file.to_string().as_str()));
        // CmdStan's readers refuse `num_warmup = 0` with adaptation on: at least 1 is written.
        let warmup = polish["warmup"].as_u64().unwrap().max(1);
        assert_eq!(config(csv, "num_warmup"), Some(warmup.to_string().as_str()));
        let written_thin: u64 = config(csv, "thin").unwrap().parse().unwrap();
        assert_eq!(written_thin, polish["thin"].as_u64().unwrap().max(1) * thin);
    }
    let names: Vec<&str> = summary["phases"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert!(names.contains(&"precondition") && names.contains(&"svgd") && names.contains(&"polish"), "{names:?}");
    let polish_phase = summary["phases"].as_array().unwrap().iter().find(|p| p["name"] == "polish").unwrap();
    assert!(polish_phase["seconds"].as_f64().unwrap() > 0.0 && polish_phase["steps"].as_u64().unwrap() > 0);
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
    let files = chain_files(out.path());
    assert!(!files.is_empty());
    let csv = files[0].clone();
    let names = header(&csv);
    // CmdStan's order: lp__, parameters, transformed parameters, generated quantities.
    let at = |n: &str| names.iter().position(|c| c == n).unwrap_or_else(|| panic!("no column {n} in {names:?}"));
    assert_eq!(at("lp__"), 0);
    assert!(at("mu") < at("eta.6") && at("eta.6") < at("alpha.1") && at("alpha.6") < at("y_rep.1"));
    assert!(at("y_rep.60") < at("log_lik.1"));
    assert_eq!(names.last().map(String::as_str), Some("log_lik.60"));
    assert!(csv.contains(&format!("file = {}", out.path().join("draws_1.csv").display())));
    let rows: Vec<Vec<f64>> = files.iter().flat_map(|f| rows(f)).collect();
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
