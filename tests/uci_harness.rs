//! `parvi bench uci` end to end on real data (skipped without a data directory).

mod common;

use std::process::Command;

use common::uci_dir;

#[test]
fn uci_harness_writes_per_split_results_and_summaries() {
    let Some(dir) = uci_dir("yacht") else {
        eprintln!("SKIPPED uci_harness: no UCI data (set PARVI_DATA_DIR)");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let json = tmp.path().join("yacht.json");
    let out = Command::new(env!("CARGO_BIN_EXE_parvi"))
        .args(["bench", "uci", "--dataset", "yacht", "--splits", "2", "--iters", "400", "--eval-every", "100"])
        .arg("--data-dir")
        .arg(&dir)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(v["dataset"], "yacht");
    assert_eq!(v["splits"].as_array().unwrap().len(), 2);
    for key in ["rmse_mean", "rmse_se", "ll_mean", "ll_se"] {
        assert!(v[key].as_f64().unwrap().is_finite(), "{key}");
    }
    // 400 steps of SVGD already beat the prior-mean predictor (yacht's target std is about 15).
    assert!(v["rmse_mean"].as_f64().unwrap() < 10.0, "{v}");
    // Classification data is refused by name.
    let out = Command::new(env!("CARGO_BIN_EXE_parvi"))
        .args(["bench", "uci", "--dataset", "breast-cancer", "--iters", "10"])
        .arg("--data-dir")
        .arg(&dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("classification"), "{err}");
}
