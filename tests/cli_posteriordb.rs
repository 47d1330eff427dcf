//! `parvi bench posteriordb` end to end: its JSON rows carry the comparison and the diagnostics,
//! and bad input (no suite folder, an unknown posterior or method) is an error naming it, with
//! exit code 2; a posterior folder that cannot run (unknown model, data that do not fit, a bad
//! `posterior.json`) is a row naming the cause while the others run, and one without a reference
//! runs with a row saying so.

use std::process::Command;

fn parvi(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_parvi"))
        .args(args)
        .env_remove("PARVI_POSTERIORDB_DIR")
        .env_remove("PARVI_POSTERIORDB_MORE_DIR")
        .output()
        .unwrap()
}

#[test]
fn bad_input_is_named() {
    let out = parvi(&["bench", "posteriordb"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--data-dir"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let out = parvi(&["bench", "posteriordb", "--data-dir", d, "--posterior", "no-such-posterior"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("no-such-posterior") && err.contains("kidiq"), "{err}");

    let out = parvi(&["bench", "posteriordb", "--data-dir", d, "--posterior", "kidiq", "--method", "svgdd"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("svgdd") && err.contains("mk-svgd"), "{err}");

    let out = parvi(&["bench", "posteriordb", "--data-dir", d, "--posterior", "kidiq", "--check-level", "2"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--check-level"), "{err}");
}

#[test]
fn a_row_carries_the_comparison_and_the_diagnostics() {
    let Some(suite) = std::env::var_os("PARVI_POSTERIORDB_DIR") else {
        eprintln!("skipped: set PARVI_POSTERIORDB_DIR to run it");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("rows.json");
    let out = Command::new(env!("CARGO_BIN_EXE_parvi"))
        .args(["bench", "posteriordb", "--posterior", "kidiq", "--method", "svgd", "--steps", "300", "--json"])
        .arg(&json)
        .arg("--data-dir")
        .arg(&suite)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let row = &rows[0];
    for key in ["max_mean_error_sd", "mean_mean_error_sd", "max_sd_ratio_error", "distance", "seconds"] {
        assert!(row[key].as_f64().is_some_and(f64::is_finite), "{key}: {row}");
    }
    assert!(row["score_evals"].as_u64().unwrap() > 300 * 100, "{row}");
    assert!(row["diagnostics"]["warnings"].is_array(), "{row}");
    assert!(row["diagnostics"]["stationarity"]["score_evals"].as_u64() == Some(201 * 100), "{row}");
    // kidiq is a well-conditioned regression: SVGD's means within 0.3 reference sd.
    assert!(row["max_mean_error_sd"].as_f64().unwrap() < 0.3, "{row}");
}

#[test]
fn the_stationarity_warning_is_printed() {
    // SVGD's biased fixed point on eight_schools (tau over a reference sd off): the bench prints
    // the check's warning under the row and names the coordinate that moved most (log tau, 9, or
    // theta_trans[1], 0, depending on the whitening's last digits: the probed mode search moved
    // it to 0).
    let Some(suite) = std::env::var_os("PARVI_POSTERIORDB_DIR") else {
        eprintln!("skipped: set PARVI_POSTERIORDB_DIR to run it");
        return;
    };
    let out = Command::new(env!("CARGO_BIN_EXE_parvi"))
        .args(["bench", "posteriordb", "--posterior", "eight_schools", "--method", "svgd", "--no-polish", "--data-dir"])
        .arg(&suite)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let named = ["coordinate 0 ", "coordinate 9 "].iter().any(|c| stdout.contains(c));
    assert!(stdout.contains("warning: svgd did not end at the target") && named, "{stdout}");
}

#[test]
fn bad_folders_are_rows_and_the_others_run() {
    let Some(more) = std::env::var_os("PARVI_POSTERIORDB_MORE_DIR") else {
        eprintln!("skipped: set PARVI_POSTERIORDB_MORE_DIR to run it");
        return;
    };
    let source = std::path::Path::new(&more).join("dugongs_data-dugongs_model");
    let (good, bad) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let copy = |root: &std::path::Path, name: &str, posterior: &str, data: &str| {
        let folder = root.join(name);
        std::fs::create_dir(&folder).unwrap();
        std::fs::write(folder.join("posterior.json"), posterior).unwrap();
        std::fs::write(folder.join("data.json"), data).unwrap();
    };
    let posterior = std::fs::read_to_string(source.join("posterior.json")).unwrap();
    let data = std::fs::read_to_string(source.join("data.json")).unwrap();
    // No reference: the fit runs, the row says so.
    copy(good.path(), "dugongs_data-dugongs_model", &posterior, &data);
    copy(
        bad.path(),
        "a-unknown",
        &posterior.replace("\"dugongs_model\"", "\"no_such_model\"").replace("dugongs_data-dugongs_model", "a-unknown"),
        &data,
    );
    let short: serde_json::Value = serde_json::from_str(&data).unwrap();
    let mut short = short.as_object().unwrap().clone();
    short.get_mut("Y").unwrap().as_array_mut().unwrap().pop();
    copy(
        bad.path(),
        "b-short",
        &posterior.replace("dugongs_data-dugongs_model", "b-short"),
        &serde_json::to_string(&short).unwrap(),
    );
    copy(bad.path(), "c-broken", "{", &data);
    let json = good.path().join("rows.json");
    let out = Command::new(env!("CARGO_BIN_EXE_parvi"))
        .args(["bench", "posteriordb", "--method", "svgd", "--steps", "50", "--particles", "20"])
        .args(["--check-steps", "0", "--no-polish", "--data-dir"])
        .arg(good.path())
        .arg("--data-dir")
        .arg(bad.path())
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    // The three that could not run make the status 2, each named; the fourth ran.
    assert_eq!(out.status.code(), Some(2), "{stdout}\n{stderr}");
    assert!(stderr.contains("3 of the posteriors"), "{stderr}");
    let rows: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 4, "{rows:?}");
    let row =
        |name: &str| rows.iter().find(|r| r["posterior"] == name).unwrap_or_else(|| panic!("no row {name}: {rows:?}"));
    let ran = row("dugongs_data-dugongs_model");
    assert!(ran["error"].is_null() && ran["seconds"].as_f64().is_some_and(|s| s > 0.0), "{ran}");
    assert!(ran["note"].as_str().is_some_and(|n| n.contains("no reference")), "{ran}");
    let error = |name: &str| row(name)["error"].as_str().unwrap_or_default().to_string();
    assert!(error("a-unknown").contains("unknown model `no_such_model`"), "{}", error("a-unknown"));
    assert!(error("b-short").contains("`Y`") && error("b-short").contains("N = 27"), "{}", error("b-short"));
    assert!(error("c-broken").contains("posterior.json"), "{}", error("c-broken"));
    assert!(stdout.contains("no reference"), "{stdout}");
}
