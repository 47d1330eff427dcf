//! Draws in CmdStan's CSV format (`parvi_models::cmdstan`), the `stansummary`-style summary
//! (`parvi_infer::evaluation::Summary`) and `parvi fit --posterior / --data` writing them: each
//! file parsed back by CmdStan's rules with a reader written here, values compared with
//! independent `f64` computations.

mod common;

use std::path::Path;
use std::process::Command;

use parvi::infer::evaluation::Summary;
use parvi::model::burn::tensor::{Tensor, TensorData};
use parvi::model::tensor_ops::to_vec_f32;
use parvi::model::{BackendKind, LogDensity};
use parvi::models::cmdstan::{self, Draws, RunInfo, StanCsv, cmdstan_name, cmdstan_order, stan_name};
use parvi::models::posteriordb;

/// A CmdStan CSV file by CmdStan's rules, independently of `StanCsv`: `#` lines are comments
/// wherever they stand, the first other line is the header, every other non-empty line a draw.
fn read_by_cmdstan_rules(text: &str) -> (Vec<String>, Vec<String>, Vec<Vec<f64>>) {
    let mut comments = Vec::new();
    let mut header = None;
    let mut rows = Vec::new();
    for line in text.lines() {
        if let Some(c) = line.strip_prefix('#') {
            comments.push(c.trim().to_string());
        } else if header.is_none() {
            header = Some(line.split(',').map(String::from).collect::<Vec<_>>());
        } else if !line.is_empty() {
            rows.push(line.split(',').map(|v| v.parse::<f64>().unwrap()).collect());
        }
    }
    (comments, header.expect("a header"), rows)
}

/// The value of `key = value` among comment lines.
fn config<'a>(comments: &'a [String], key: &str) -> Option<&'a str> {
    comments.iter().find_map(|c| c.split_once(" = ").filter(|(k, _)| k.trim() == key).map(|(_, v)| v.trim()))
}

fn run_info(seed: u64) -> RunInfo {
    RunInfo {
        model: "test_model".into(),
        method: "svgd".into(),
        settings: vec![("particles".into(), "6".into())],
        draws_are: "final particles".into(),
        seed,
        sampling_seconds: 1.5,
        warnings: vec!["a warning".into()],
        ..RunInfo::default()
    }
}

#[test]
fn names_convert_to_cmdstans_and_matrices_go_column_major() {
    assert_eq!(cmdstan_name("theta[1]"), "theta.1");
    assert_eq!(cmdstan_name("a[2,3]"), "a.2.3");
    assert_eq!(cmdstan_name("sigma"), "sigma");
    assert_eq!(stan_name("a.2.3"), "a[2,3]");
    assert_eq!(stan_name("lp__"), "lp__");
    // Stan's names of a 2 x 3 matrix come row-major; CmdStan writes the first index fastest.
    let names: Vec<String> = ["mu", "a[1,1]", "a[1,2]", "a[1,3]", "a[2,1]", "a[2,2]", "a[2,3]", "z[1]", "z[2]"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let order: Vec<&str> = cmdstan_order(&names).iter().map(|&j| names[j].as_str()).collect();
    assert_eq!(order, ["mu", "a[1,1]", "a[2,1]", "a[1,2]", "a[2,2]", "a[1,3]", "a[2,3]", "z[1]", "z[2]"]);
}

#[test]
fn a_written_draws_file_reads_back_by_cmdstans_rules() {
    let names: Vec<String> =
        ["mu", "a[1,1]", "a[1,2]", "a[2,1]", "a[2,2]", "theta[1]"].iter().map(|s| s.to_string()).collect();
    let rows = 6;
    // Values an f32 holds exactly, and one that is not (written in full) and a NaN.
    let mut values: Vec<f64> = (0..rows * names.len()).map(|i| f64::from(i as f32 * 0.37 - 5.0)).collect();
    values[3] = 0.1; // not an f32: written with f64's shortest text
    values[7] = f64::NAN;
    let lp: Vec<f64> = (0..rows).map(|r| -(r as f64) - 0.5).collect();
    let draws = Draws::new(names.clone(), values.clone(), lp.clone(), 1, None).unwrap();
    let text = draws.to_csv(&run_info(7));
    let (comments, header, parsed) = read_by_cmdstan_rules(&text);
    assert_eq!(header, ["lp__", "mu", "a.1.1", "a.2.1", "a.1.2", "a.2.2", "theta.1"]);
    assert_eq!(parsed.len(), rows);
    // Column k of the file is Stan-name column `source[k]` of the values.
    let source = [0, 1, 3, 2, 4, 5];
    for (r, row) in parsed.iter().enumerate() {
        assert_eq!(row[0], lp[r]);
        for (k, &j) in source.iter().enumerate() {
            let (got, want) = (row[k + 1], values[r * names.len() + j]);
            // An f32 value is written as the shortest text that reads back to that f32; any
            // other value in full.
            let same = got == want || (f64::from(want as f32) == want && got as f32 == want as f32);
            assert!(same || (got.is_nan() && want.is_nan()), "row {r} column {}: {got} vs {want}", header[k + 1]);
        }
    }
    assert_eq!(config(&comments, "method"), Some("sample"));
    assert_eq!(config(&comments, "algorithm"), Some("svgd"));
    assert_eq!(config(&comments, "num_samples"), Some("6"));
    assert_eq!(config(&comments, "seed"), Some("7"));
    assert_eq!(config(&comments, "model"), Some("test_model"));
    assert!(comments.iter().any(|c| c.starts_with("Elapsed Time") && c.ends_with("(Warm-up)")));
    assert!(comments.iter().any(|c| c == "warning: a warning"));
    // The library's reader agrees with this one, and finds columns by either naming.
    let csv = StanCsv::parse(&text).unwrap();
    assert_eq!(csv.header, header);
    assert_eq!(csv.rows.len(), rows);
    assert_eq!(csv.config("draws_per_chain"), Some("6"));
    let as_f32 = |c: Option<Vec<f64>>| c.unwrap().into_iter().map(|v| v as f32).collect::<Vec<f32>>();
    assert_eq!(as_f32(csv.column("a[1,2]")), as_f32(draws.column("a.1.2")));
    // Bad files are refused with the line.
    let err = StanCsv::parse("# c\nlp__,x\n1,2\n3\n").unwrap_err().to_string();
    assert!(err.contains("line 4") && err.contains("1 fields"), "{err}");
    let err = StanCsv::parse("lp__,x\n1,two\n").unwrap_err().to_string();
    assert!(err.contains("line 2") && err.contains("`x`"), "{err}");
}

#[test]
fn a_weighted_set_is_resampled_systematically_with_its_seed_recorded() {
    // Ten particles, weights 0, 0.3, 0.05, ...: systematic resampling copies particle i
    // floor(n w_i) or ceil(n w_i) times, never one of weight 0.
    let w = [0.0, 0.3, 0.05, 0.05, 0.2, 0.0, 0.1, 0.1, 0.15, 0.05];
    let n = w.len();
    let values: Vec<f64> = (0..n).map(|i| i as f64).collect();
    let lp = vec![0.0; n];
    let draws = Draws::new(vec!["x".into()], values, lp, 1, Some(w.to_vec())).unwrap();
    for seed in [1, 2, 3] {
        let text = draws.to_csv(&run_info(seed));
        let (comments, _, rows) = read_by_cmdstan_rules(&text);
        assert_eq!(rows.len(), n);
        for (i, wi) in w.iter().enumerate() {
            let copies = rows.iter().filter(|r| r[1] == i as f64).count() as f64;
            let expected = wi * n as f64;
            assert!(
                copies >= expected.floor() - 1e-9 && copies <= expected.ceil() + 1e-9,
                "{i}: {copies} vs {expected}"
            );
        }
        assert_eq!(config(&comments, "scheme"), Some("systematic"));
        assert_eq!(config(&comments, "resampling_seed"), Some(seed.to_string().as_str()));
        assert_eq!(config(&comments, "weighted_particles"), Some("10"));
    }
    // A bad weight is refused by name.
    let err = Draws::new(vec!["x".into()], vec![1.0, 2.0], vec![0.0; 2], 1, Some(vec![1.0, -1.0])).unwrap_err();
    assert!(err.to_string().contains("weight -1"), "{err}");
}

#[test]
fn snapshot_major_chains_are_written_chain_after_chain() {
    let device = BackendKind::Flex.device().unwrap();
    // 3 snapshots of 2 chains, 1 quantity: row s * 2 + c holds 10 c + s.
    let rows: Vec<f32> = (0..3).flat_map(|s| (0..2).map(move |c| 10.0 * c as f32 + s as f32)).collect();
    let x = Tensor::<2>::from_data(TensorData::new(rows.clone(), [6, 1]), &device);
    let lp = Tensor::<1>::from_data(TensorData::new(rows, [6]), &device);
    let draws = Draws::from_tensors(vec!["x".into()], x, lp, None, Some(2)).unwrap();
    assert_eq!(draws.chains(), 2);
    assert_eq!(draws.column("x").unwrap(), [0.0, 1.0, 2.0, 10.0, 11.0, 12.0]);
    assert_eq!(draws.lp(), [0.0, 1.0, 2.0, 10.0, 11.0, 12.0]);
}

/// `n` independent standard normal draws from a fixed seed (Box-Muller on a LCG).
fn normals(n: usize, seed: u64) -> Vec<f64> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut uniform = || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..n).map(|_| (-2.0 * uniform().ln()).sqrt() * (2.0 * std::f64::consts::PI * uniform()).cos()).collect()
}

#[test]
fn the_summary_of_chains_and_of_particles_matches_direct_computations() {
    let (chains, per) = (4, 1000);
    let x = normals(chains * per, 11);
    let names = vec!["x".to_string()];
    let s = Summary::of_chains(&names, std::slice::from_ref(&x), chains).unwrap();
    let r = &s.rows[0];
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    let sd = (x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
    let mut sorted = x.clone();
    sorted.sort_by(f64::total_cmp);
    // Type-7 quantile: h = (n - 1) p, interpolated.
    let q = |p: f64| {
        let h = (n - 1.0) * p;
        let lo = h.floor() as usize;
        sorted[lo] + (h - h.floor()) * (sorted[lo + 1] - sorted[lo])
    };
    assert!((r.mean - mean).abs() < 1e-12 && (r.sd - sd).abs() < 1e-12);
    assert!((r.q5 - q(0.05)).abs() < 1e-12 && (r.q50 - q(0.5)).abs() < 1e-12 && (r.q95 - q(0.95)).abs() < 1e-12);
    // Independent draws: ESS near 4000 (its estimator's sd is a few percent), MCSE near
    // sd / sqrt(4000), R-hat within 0.01 of 1.
    let (bulk, tail, rhat, mcse) = (r.ess_bulk.unwrap(), r.ess_tail.unwrap(), r.rhat.unwrap(), r.mcse.unwrap());
    assert!(bulk > 3000.0 && bulk < 5000.0, "bulk {bulk}");
    assert!(tail > 2500.0 && tail < 5500.0, "tail {tail}");
    assert!((rhat - 1.0).abs() < 0.01, "rhat {rhat}");
    assert!((mcse / (sd / n.sqrt()) - 1.0).abs() < 0.2, "mcse {mcse}");
    // Chains that disagree: R-hat well above 1.
    let shifted: Vec<f64> = x.iter().enumerate().map(|(i, v)| v + if i < 2 * per { 0.0 } else { 1.0 }).collect();
    let s = Summary::of_chains(&names, &[shifted], chains).unwrap();
    assert!(s.rows[0].rhat.unwrap() > 1.1, "{:?}", s.rows[0]);
    // A weighted particle set: the weighted mean and sd, the inverse weighted CDF, no ESS.
    let values = vec![1.0, 2.0, 3.0, 4.0];
    let w = [0.1, 0.2, 0.3, 0.4];
    let s = Summary::of_particles(&names, &[values], Some(&w)).unwrap();
    let r = &s.rows[0];
    let mean: f64 = 0.1 + 0.4 + 0.9 + 1.6;
    let var = 0.1 * (1.0 - mean).powi(2)
        + 0.2 * (2.0 - mean).powi(2)
        + 0.3 * (3.0 - mean).powi(2)
        + 0.4 * (4.0 - mean).powi(2);
    assert!((r.mean - mean).abs() < 1e-12 && (r.sd - f64::sqrt(var)).abs() < 1e-12);
    assert_eq!((r.q5, r.q50, r.q95), (1.0, 3.0, 4.0));
    assert!(r.mcse.is_none() && r.ess_bulk.is_none() && r.rhat.is_none());
    let table = s.table();
    assert!(table.contains("ESS_bulk") && table.contains("n/a"), "{table}");
    let csv = s.to_csv();
    assert!(
        csv.starts_with("name,Mean,MCSE,StdDev,5%,50%,95%,ESS_bulk,ESS_tail,R_hat\n\"x\",3,,1,1,3,4,,,\n"),
        "{csv}"
    );
}

#[test]
fn a_posteriordb_models_draws_are_named_constrained_and_carry_lp() {
    let Some(dir) = common::posteriordb_dir("a_posteriordb_models_draws_are_named_constrained_and_carry_lp") else {
        return;
    };
    let device = BackendKind::Flex.device().unwrap();
    let model = posteriordb::load_folder(&dir.join("kidiq-kidscore_momiq"), &device).unwrap();
    // Unconstrained points (beta[1], beta[2], log sigma).
    let x: Vec<f32> = vec![26.0, 0.6, 2.9, 25.0, 0.62, 2.8, 27.0, 0.59, 3.0];
    let t = Tensor::<2>::from_data(TensorData::new(x.clone(), [3, 3]), &device);
    let draws = Draws::of_posterior(&model, t.clone(), None, None).unwrap();
    assert_eq!(draws.names(), ["beta[1]", "beta[2]", "sigma"]);
    let lp = to_vec_f32(&model.log_prob(t, None));
    for r in 0..3 {
        assert_eq!(draws.column("beta[1]").unwrap()[r], f64::from(x[3 * r]));
        // sigma = exp(log sigma), to f32's rounding.
        let sigma = draws.column("sigma").unwrap()[r];
        assert!((sigma / f64::from(x[3 * r + 2]).exp() - 1.0).abs() < 1e-6, "{sigma}");
        assert_eq!(draws.lp()[r], f64::from(lp[r]));
    }
}

fn parvi(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_parvi")).args(args).output().expect("run parvi");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).to_string(), stderr)
}

/// Per column of a draws file, the mean over its rows.
fn column_means(path: &Path) -> Vec<(String, f64)> {
    let (_, header, rows) = read_by_cmdstan_rules(&std::fs::read_to_string(path).unwrap());
    header
        .iter()
        .enumerate()
        .map(|(j, h)| (h.clone(), rows.iter().map(|r| r[j]).sum::<f64>() / rows.len() as f64))
        .collect()
}

#[test]
fn fit_posterior_writes_cmdstan_draws_and_a_summary_that_match_the_reference() {
    let Some(dir) = common::posteriordb_dir("fit_posterior_writes_cmdstan_draws") else { return };
    let folder = dir.join("kidiq-kidscore_momiq");
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    // The particles themselves (`--no-polish`): one row each.
    let args = [
        "--particles",
        "50",
        "--steps",
        "300",
        "--seed",
        "1",
        "--quiet",
        "--no-polish",
        "--out",
        out.to_str().unwrap(),
    ];
    let (code, stdout, stderr) = parvi(&[&["fit", "--posterior", folder.to_str().unwrap()][..], &args].concat());
    assert_eq!(code, 0, "{stderr}");
    let text = std::fs::read_to_string(out.join("draws_1.csv")).unwrap();
    let (comments, header, rows) = read_by_cmdstan_rules(&text);
    assert_eq!(header, ["lp__", "beta.1", "beta.2", "sigma"]);
    assert_eq!(rows.len(), 50);
    assert_eq!(config(&comments, "model"), Some("kidscore_momiq"));
    assert_eq!(config(&comments, "posterior"), Some("kidiq-kidscore_momiq"));
    assert!(stdout.contains("wrote"), "{stdout}");
    // The posterior means within 0.3 reference sds (the issue's bar).
    let reference = posteriordb::ReferenceDraws::load("kidiq-kidscore_momiq", &dir).unwrap();
    let (mean, sd) = (reference.mean(), reference.sd());
    for (j, (name, m)) in column_means(&out.join("draws_1.csv")).into_iter().skip(1).enumerate() {
        assert!((m - mean[j]).abs() < 0.3 * sd[j], "{name}: {m} vs reference {} (sd {})", mean[j], sd[j]);
    }
    // The summary: lp__ then the quantities under Stan's names, the means of the draws.
    let summary = std::fs::read_to_string(out.join("summary.csv")).unwrap();
    let lines: Vec<&str> = summary.lines().collect();
    assert_eq!(lines[0], "name,Mean,MCSE,StdDev,5%,50%,95%,ESS_bulk,ESS_tail,R_hat");
    let names: Vec<&str> = lines[1..].iter().map(|l| l.split(',').next().unwrap()).collect();
    assert_eq!(names, ["\"lp__\"", "\"beta[1]\"", "\"beta[2]\"", "\"sigma\""]);
    let beta2: f64 = lines[3].split(',').nth(1).unwrap().parse().unwrap();
    let direct = rows.iter().map(|r| r[2]).sum::<f64>() / rows.len() as f64;
    assert!((beta2 - direct).abs() < 1e-6 * direct.abs(), "{beta2} vs {direct}");
    // lp__ is the model's log density at each draw: recomputed here from the constrained draw
    // (unconstrained log sigma, Jacobian log sigma), to f32's rounding of the sum.
    let device = BackendKind::Flex.device().unwrap();
    let model = posteriordb::load_folder(&folder, &device).unwrap();
    let x: Vec<f32> = rows.iter().flat_map(|r| [r[1] as f32, r[2] as f32, (r[3].ln()) as f32]).collect();
    let lp = to_vec_f32(&model.log_prob(Tensor::<2>::from_data(TensorData::new(x, [rows.len(), 3]), &device), None));
    for (r, row) in rows.iter().enumerate() {
        assert!((row[0] - f64::from(lp[r])).abs() < 1e-3 * row[0].abs().max(1.0), "{} vs {}", row[0], lp[r]);
    }
}

#[test]
fn fit_model_with_data_and_builtin_targets_write_the_same_files() {
    let tmp = tempfile::tempdir().unwrap();
    // A built-in target with an MCMC engine: x.1, x.2, chains, R-hat in the summary.
    let out = tmp.path().join("sgld");
    let (code, stdout, stderr) = parvi(&[
        "fit",
        "--model",
        "gaussian",
        "--method",
        "sgld",
        "--particles",
        "8",
        "--steps",
        "200",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    // One file per chain, each its own `id`; read back together, the chains as the files hold them.
    let paths = cmdstan::chain_file_paths(&out, "draws").unwrap();
    assert_eq!(paths.len(), 8);
    let csv = StanCsv::read(&paths[0]).unwrap();
    assert_eq!(csv.header, ["lp__", "x.1", "x.2"]);
    assert_eq!((csv.config("id"), csv.config("num_chains")), (Some("1"), Some("8")));
    let per: usize = csv.config("num_samples").unwrap().parse().unwrap();
    let draws = Draws::read_files(&paths).unwrap();
    assert_eq!(
        (draws.chains(), draws.rows(), draws.names()),
        (8, 8 * per, &["x[1]".to_string(), "x[2]".to_string()][..])
    );
    assert_eq!(StanCsv::read(&paths[7]).unwrap().config("id"), Some("8"));
    assert!(stdout.contains("R_hat") && stdout.contains("8 chains"), "{stdout}");
    let summary = std::fs::read_to_string(out.join("summary.csv")).unwrap();
    let rhat: f64 = summary.lines().nth(2).unwrap().rsplit(',').next().unwrap().parse().unwrap();
    assert!(rhat.is_finite() && rhat > 0.9, "{summary}");
    // A weighted particle set (MMD-FW): resampled, the seed recorded.
    let out = tmp.path().join("mmd");
    let (code, _, stderr) = parvi(&[
        "fit",
        "--model",
        "banana",
        "--method",
        "mmd-fw",
        "--particles",
        "20",
        "--steps",
        "20",
        "--seed",
        "5",
        "--quiet",
        "--no-polish",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    let csv = StanCsv::read(&out.join("draws_1.csv")).unwrap();
    assert_eq!(csv.config("algorithm"), Some("mmd-fw"));
    assert_eq!(csv.rows.len(), 20);
    if csv.config("scheme").is_some() {
        assert_eq!(csv.config("resampling_seed"), Some("5"));
    }
    // --model NAME --data FILE.json: a posteriordb model with a data file of the user's.
    let Some(dir) = common::posteriordb_dir("fit_model_with_data") else { return };
    let out = tmp.path().join("data");
    let data = dir.join("kidiq-kidscore_momiq").join("data.json");
    let (code, _, stderr) = parvi(&[
        "fit",
        "--model",
        "kidscore_momiq",
        "--data",
        data.to_str().unwrap(),
        "--particles",
        "20",
        "--steps",
        "50",
        "--quiet",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    let csv = StanCsv::read(&out.join("draws_1.csv")).unwrap();
    assert_eq!(csv.header, ["lp__", "beta.1", "beta.2", "sigma"]);
    assert!(csv.config("file").unwrap().ends_with("data.json"));
    assert!(csv.column("sigma").unwrap().iter().all(|s| *s > 0.0));
}

#[test]
fn bad_models_data_and_output_directories_are_named_with_exit_2_and_no_files() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let o = out.to_str().unwrap();
    let bad_data = tmp.path().join("bad.json");
    std::fs::write(&bad_data, r#"{"N": 2, "kid_score": [1.0, 2.0]}"#).unwrap();
    let short_data = tmp.path().join("short.json");
    std::fs::write(&short_data, r#"{"N": 3, "kid_score": [1.0, 2.0], "mom_iq": [1.0, 2.0, 3.0]}"#).unwrap();
    let posterior = tmp.path().join("post");
    std::fs::create_dir(&posterior).unwrap();
    std::fs::write(posterior.join("posterior.json"), r#"{"name": "p", "model_name": "no_such_model"}"#).unwrap();
    let file = tmp.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let under_file = file.join("out");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["fit", "--model", "nope", "--out", o], "unknown model `nope`"),
        (vec!["fit", "--model", "nope", "--data", bad_data.to_str().unwrap(), "--out", o], "unknown model `nope`"),
        (vec!["fit", "--model", "kidscore_momiq", "--out", o], "--data"),
        (vec!["fit", "--model", "kidscore_momiq", "--data", bad_data.to_str().unwrap(), "--out", o], "mom_iq"),
        (vec!["fit", "--model", "kidscore_momiq", "--data", short_data.to_str().unwrap(), "--out", o], "kid_score"),
        (vec!["fit", "--posterior", posterior.to_str().unwrap(), "--out", o], "unknown model `no_such_model`"),
        (vec!["fit", "--model", "gaussian", "--steps", "5", "--out", under_file.to_str().unwrap()], "a-file"),
    ];
    for (args, needle) in cases {
        let (code, _, stderr) = parvi(&args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(!out.exists() || std::fs::read_dir(&out).unwrap().next().is_none(), "{args:?} left files in {o}");
    }
}

#[test]
fn chains_are_thinned_within_and_grouped_whole_into_equal_files() {
    // Every draw where the chains hold no more than asked; else every k-th, counted back from
    // each chain's last, at least 4 a chain.
    assert_eq!(cmdstan::thinning(4, 1000, 4000), (1, (0..1000).collect::<Vec<_>>()));
    let (thin, kept) = cmdstan::thinning(100, 156, 4000);
    assert_eq!((thin, kept.len(), *kept.last().unwrap()), (4, 39, 155));
    assert!(kept.windows(2).all(|w| w[1] - w[0] == 4));
    let (thin, kept) = cmdstan::thinning(1000, 16, 1000);
    assert_eq!((thin, kept), (4, vec![3, 7, 11, 15]));
    // Files: one a chain up to 20, else the most of 4..=20 that divide the chains.
    assert_eq!([4, 20, 100, 1000, 64, 97].map(cmdstan::chain_files), [4, 20, 20, 20, 16, 97]);
    // Grouped chains keep their draws in order; written and read back, each file is a chain.
    let names: Vec<String> = vec!["mu".into(), "c".into()];
    let (chains, per) = (8, 5);
    let values: Vec<f64> = (0..chains * per).flat_map(|r| [r as f64, 2.5]).collect();
    let lp: Vec<f64> = (0..chains * per).map(|r| -(r as f64)).collect();
    let draws = Draws::new(names, values.clone(), lp, chains, None).unwrap().grouped(4).unwrap();
    assert_eq!((draws.chains(), draws.chains_per_file(), draws.draws_per_chain()), (4, 2, 10));
    assert!(Draws::new(vec!["x".into()], vec![0.0; 6], vec![0.0; 6], 3, None).unwrap().grouped(2).is_err());
    let dir = tempfile::tempdir().unwrap();
    let paths = draws.write_files(dir.path(), "fit", &run_info(1)).unwrap();
    assert_eq!(paths, cmdstan::chain_file_paths(dir.path(), "fit").unwrap());
    assert_eq!(paths.len(), 4);
    let second = StanCsv::read(&paths[1]).unwrap();
    assert_eq!(
        (second.config("id"), second.config("num_samples"), second.config("chains_in_file")),
        (Some("2"), Some("10"), Some("2"))
    );
    assert_eq!(second.column("mu").unwrap(), (10..20).map(f64::from).collect::<Vec<_>>());
    let back = Draws::read_files(&paths).unwrap();
    assert_eq!(back, draws);
    // Files that are not one run's chains are refused by name.
    std::fs::write(&paths[2], "lp__,mu\n1,2\n").unwrap();
    let err = Draws::read_files(&paths).unwrap_err().to_string();
    assert!(err.contains("fit_3.csv") && err.contains("columns differ"), "{err}");
    std::fs::write(&paths[2], "lp__,mu,c\n1,2\n").unwrap();
    let err = Draws::read_files(&paths).unwrap_err().to_string();
    assert!(err.contains("fit_3.csv") && err.contains("line 2"), "{err}");
    // The summary of the grouped draws: the constant has NaN MCSE, ESS and R-hat, as Stan
    // prints them; the varying one finite.
    let columns = vec![draws.column("mu").unwrap(), draws.column("c").unwrap()];
    let s = Summary::of_chains(&["mu".into(), "c".into()], &columns, draws.chains()).unwrap();
    assert!(s.rows[0].rhat.unwrap().is_finite() && !s.rows[0].is_constant());
    let c = &s.rows[1];
    assert!(
        c.is_constant() && c.ess_bulk.unwrap().is_nan() && c.ess_tail.unwrap().is_nan() && c.mcse.unwrap().is_nan()
    );
    assert_eq!((c.mean, c.sd), (2.5, 0.0));
    assert!(s.to_csv().lines().nth(2).unwrap().ends_with("NaN,NaN,NaN"), "{}", s.to_csv());
}
