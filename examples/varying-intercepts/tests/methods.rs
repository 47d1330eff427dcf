//! The model executable's other CmdStan methods as a user runs them: `generate_quantities`
//! gives a fit's own generated quantities from its draws files, exactly; `log_prob` gives the
//! fit's `lp__` at its draws and a gradient that finite differences of itself confirm;
//! `optimize` and `pathfinder` write CmdStan's columns; bad input (no `--data`, a parameter
//! missing or misshaped) exits 2 naming it, with nothing written; a fit whose stderr is not a
//! terminal prints its phases and its progress.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

fn exe() -> Command {
    Command::new(env!("CARGO_BIN_EXE_varying-intercepts"))
}

fn data_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data.json")
}

/// A CSV file's header and rows (comments skipped).
fn read_csv(path: &Path) -> (Vec<String>, Vec<Vec<f64>>) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut lines = text.lines().filter(|l| !l.starts_with('#') && !l.is_empty());
    let header: Vec<String> = lines.next().expect("a header").split(',').map(str::to_string).collect();
    let rows = lines.map(|l| l.split(',').map(|v| v.parse().expect("a number")).collect()).collect();
    (header, rows)
}

fn column(header: &[String], name: &str) -> usize {
    header.iter().position(|c| c == name).unwrap_or_else(|| panic!("no column {name} in {header:?}"))
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{:?}: {}", cmd, String::from_utf8_lossy(&out.stderr));
    out
}

/// One fit shared by the tests of this file: its output folder and its draws files (one per
/// chain, or one of all chains, whichever the writer makes).
fn fitted() -> &'static (tempfile::TempDir, Vec<PathBuf>) {
    static FIT: OnceLock<(tempfile::TempDir, Vec<PathBuf>)> = OnceLock::new();
    FIT.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("fit");
        // Not quiet, stderr a pipe: phase lines, and a progress line at every look.
        let stderr = run(exe()
            .args(["fit", "--seed", "5", "--data"])
            .arg(data_file())
            .arg("--out")
            .arg(&out)
            .env("PARVI_PROGRESS_EVERY", "0"))
        .stderr;
        let stderr = String::from_utf8_lossy(&stderr);
        for line in [
            "parvi: preconditioner: Laplace mode search",
            "parvi: mode search (Adam): step ",
            "parvi: svgd: 100 particles",
            "parvi: svgd: step 1 of at most 2000",
            "parvi: stationarity check",
            "parvi: polish step",
        ] {
            assert!(stderr.contains(line), "fit's stderr lacks `{line}`:\n{}", &stderr[..stderr.len().min(4000)]);
        }
        let mut files: Vec<PathBuf> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                name.starts_with("draws") && name.ends_with(".csv")
            })
            .collect();
        files.sort();
        assert!(!files.is_empty(), "no draws file in {}", out.display());
        (dir, files)
    })
}

#[test]
fn generate_quantities_reproduces_the_fits_generated_quantities_exactly() {
    let (dir, files) = fitted();
    let gq = dir.path().join("gq");
    run(exe()
        .args(["generate_quantities", "--quiet", "--data"])
        .arg(data_file())
        .arg("--draws")
        .args(files)
        .arg("--out")
        .arg(&gq));
    for file in files {
        let (fit_header, fit_rows) = read_csv(file);
        let stem = file.file_stem().unwrap().to_string_lossy().into_owned();
        let (gq_header, gq_rows) = read_csv(&gq.join(format!("{stem}_gq.csv")));
        assert_eq!(fit_rows.len(), gq_rows.len());
        // Every quantity the fit wrote, generated (y_rep from normal_rng, log_lik) and
        // transformed (alpha) alike, is the same number.
        for name in ["y_rep.1", "y_rep.37", "y_rep.60", "log_lik.1", "log_lik.60", "alpha.1", "alpha.6", "lp__", "mu"] {
            let (a, b) = (column(&fit_header, name), column(&gq_header, name));
            for (r, (f, g)) in fit_rows.iter().zip(&gq_rows).enumerate() {
                assert!(f[a] == g[b], "{stem} draw {}: {name} is {} in the fit, {} standalone", r + 1, f[a], g[b]);
            }
        }
    }
    // Another seed draws other replications (and the same log_lik, which draws nothing).
    let other = dir.path().join("gq-seed");
    run(exe()
        .args(["generate_quantities", "--quiet", "--seed", "6", "--data"])
        .arg(data_file())
        .arg("--draws")
        .arg(&files[0])
        .arg("--out")
        .arg(&other));
    let stem = files[0].file_stem().unwrap().to_string_lossy().into_owned();
    let (h0, r0) = read_csv(&files[0]);
    let (h1, r1) = read_csv(&other.join(format!("{stem}_gq.csv")));
    let (y0, y1) = (column(&h0, "y_rep.1"), column(&h1, "y_rep.1"));
    let same = r0.iter().zip(&r1).filter(|(a, b)| a[y0] == b[y1]).count();
    assert!(same < r0.len() / 100 + 1, "{same} of {} y_rep draws unchanged by the seed", r0.len());
    let (l0, l1) = (column(&h0, "log_lik.1"), column(&h1, "log_lik.1"));
    assert!(r0.iter().zip(&r1).all(|(a, b)| a[l0] == b[l1]));
}

/// The parameters in CmdStan's column names and their constraints: `true` for `<lower=0>`.
const PARAMETERS: [(&str, bool); 10] = [
    ("mu", false),
    ("tau", true),
    ("eta.1", false),
    ("eta.2", false),
    ("eta.3", false),
    ("eta.4", false),
    ("eta.5", false),
    ("eta.6", false),
    ("beta", false),
    ("sigma", true),
];

/// A JSON object of Stan-format parameter values from CmdStan-named `values`.
fn params_json(values: &[f64]) -> String {
    let v = |name: &str| values[PARAMETERS.iter().position(|(n, _)| *n == name).unwrap()];
    let eta: Vec<String> = (1..=6).map(|i| v(&format!("eta.{i}")).to_string()).collect();
    format!(
        "{{\"mu\": {}, \"tau\": {}, \"eta\": [{}], \"beta\": {}, \"sigma\": {}}}",
        v("mu"),
        v("tau"),
        eta.join(", "),
        v("beta"),
        v("sigma")
    )
}

#[test]
fn log_prob_is_the_fits_density_and_its_gradient_matches_finite_differences() {
    let (dir, files) = fitted();
    // At the fit's own draws (the CSV given as it is), lp__ is the fit's lp__: the model's log
    // density at the unconstrained point, with the Jacobian.
    let out = dir.path().join("lp-draws");
    run(exe().args(["log_prob", "--data"]).arg(data_file()).arg("--params").arg(&files[0]).arg("--out").arg(&out));
    let (fit_header, fit_rows) = read_csv(&files[0]);
    let (header, rows) = read_csv(&out.join("log_prob.csv"));
    assert_eq!(header[0], "lp__");
    assert_eq!(
        header[1..],
        ["g_mu", "g_tau", "g_eta.1", "g_eta.2", "g_eta.3", "g_eta.4", "g_eta.5", "g_eta.6", "g_beta", "g_sigma"]
    );
    assert_eq!(rows.len(), fit_rows.len());
    let lp = column(&fit_header, "lp__");
    for (r, (f, g)) in fit_rows.iter().zip(&rows).enumerate() {
        // The constrained values round-trip through the unconstrained space in f32.
        assert!((f[lp] - g[0]).abs() < 2e-3 * f[lp].abs().max(1.0), "draw {}: {} against {}", r + 1, f[lp], g[0]);
    }
    // Central differences of log_prob itself along each unconstrained coordinate (log tau and
    // log sigma for the positive ones), at the first draw given as JSON.
    let at: Vec<f64> = PARAMETERS.iter().map(|(n, _)| fit_rows[0][column(&fit_header, n)]).collect();
    let h = 1e-2;
    let mut points = vec![at.clone()];
    for (k, (_, positive)) in PARAMETERS.iter().enumerate() {
        for sign in [1.0f64, -1.0] {
            let mut p = at.clone();
            p[k] = if *positive { p[k] * (sign * h).exp() } else { p[k] + sign * h };
            points.push(p);
        }
    }
    let mut lps = Vec::new();
    let mut gradient = Vec::new();
    for (i, p) in points.iter().enumerate() {
        let file = dir.path().join(format!("point-{i}.json"));
        std::fs::write(&file, params_json(p)).unwrap();
        let out = dir.path().join(format!("lp-{i}"));
        run(exe().args(["log_prob", "--data"]).arg(data_file()).arg("--params").arg(&file).arg("--out").arg(&out));
        let (_, rows) = read_csv(&out.join("log_prob.csv"));
        lps.push(rows[0][0]);
        if i == 0 {
            gradient = rows[0][1..].to_vec();
        }
    }
    assert!((lps[0] - fit_rows[0][lp]).abs() < 2e-3 * lps[0].abs().max(1.0));
    for (k, (name, _)) in PARAMETERS.iter().enumerate() {
        let fd = (lps[1 + 2 * k] - lps[2 + 2 * k]) / (2.0 * h);
        // f32 log densities of about 1e2: differences over 2e-2 carry about 1e-3 of noise,
        // curvature O(h^2) about as much.
        assert!(
            (fd - gradient[k]).abs() < 0.02 * gradient[k].abs().max(1.0),
            "g_{name}: {} against differences {fd}",
            gradient[k]
        );
    }
    // Without the Jacobian the density drops log tau + log sigma.
    let out = dir.path().join("lp-nojac");
    let file = dir.path().join("point-0.json");
    run(exe()
        .args(["log_prob", "--jacobian", "false", "--data"])
        .arg(data_file())
        .arg("--params")
        .arg(&file)
        .arg("--out")
        .arg(&out));
    let (_, rows) = read_csv(&out.join("log_prob.csv"));
    let log_jacobian = at[1].ln() + at[9].ln();
    assert!(
        (lps[0] - rows[0][0] - log_jacobian).abs() < 1e-3 * lps[0].abs().max(1.0),
        "{} - {} vs {log_jacobian}",
        lps[0],
        rows[0][0]
    );
}

#[test]
fn optimize_laplace_and_pathfinder_write_cmdstans_columns() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("opt");
    let stderr =
        run(exe().args(["optimize", "--laplace", "200", "--data"]).arg(data_file()).arg("--out").arg(&out)).stderr;
    // A line for each phase.
    let stderr = String::from_utf8_lossy(&stderr);
    assert!(stderr.contains("optimize: mode search") && stderr.contains("laplace: 200 draws"), "{stderr}");
    let (header, rows) = read_csv(&out.join("optimize.csv"));
    assert_eq!(rows.len(), 1);
    assert_eq!(header[..3], ["lp__", "mu", "tau"]);
    assert!(header.contains(&"y_rep.60".to_string()) && header.last().unwrap() == "log_lik.60");
    let (lheader, lrows) = read_csv(&out.join("laplace.csv"));
    assert_eq!(lheader[..3], ["log_p__", "log_g__", "mu"]);
    assert_eq!(lrows.len(), 200);
    // The draws centre on the mode (the MAP in the unconstrained space: with --laplace).
    let (m, lm) = (column(&header, "beta"), column(&lheader, "beta"));
    let mean = lrows.iter().map(|r| r[lm]).sum::<f64>() / 200.0;
    let sd = (lrows.iter().map(|r| (r[lm] - mean).powi(2)).sum::<f64>() / 199.0).sqrt();
    assert!((mean - rows[0][m]).abs() < 4.0 * sd / 200f64.sqrt(), "mean {mean}, mode {}, sd {sd}", rows[0][m]);
    let out = dir.path().join("pf");
    run(exe().args(["pathfinder", "--quiet", "--draws", "300", "--data"]).arg(data_file()).arg("--out").arg(&out));
    let (pheader, prows) = read_csv(&out.join("pathfinder.csv"));
    assert_eq!(pheader[..3], ["lp_approx__", "lp__", "mu"]);
    assert_eq!(prows.len(), 300);
}

#[test]
fn bad_input_exits_2_naming_it_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("never");
    let check = |args: &[&str], expected: &str| {
        let result = exe().args(args).arg("--out").arg(&out).output().unwrap();
        let stderr = String::from_utf8_lossy(&result.stderr);
        assert_eq!(result.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(!out.exists(), "{args:?} wrote {}", out.display());
    };
    let missing_data = "missing setting `--data FILE.json`: model `varying-intercepts` reads data";
    check(&["fit", "--quiet"], missing_data);
    check(&["optimize"], missing_data);
    check(&["pathfinder"], missing_data);
    let good = dir.path().join("good.json");
    std::fs::write(&good, params_json(&[0.1, 1.0, 0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.3, 1.2])).unwrap();
    check(&["log_prob", "--params", good.to_str().unwrap()], missing_data);
    let data = data_file();
    let data = data.to_str().unwrap();
    let cases = [
        (
            "no-tau",
            "{\"mu\": 0.1, \"eta\": [0,0,0,0,0,0], \"beta\": 0.3, \"sigma\": 1.2}",
            "parameter `tau` is missing",
        ),
        (
            "short-eta",
            "{\"mu\": 0.1, \"tau\": 1, \"eta\": [0,0,0,0,0], \"beta\": 0.3, \"sigma\": 1.2}",
            "parameter `eta`: expected an array of 6 values, found 5",
        ),
        (
            "text-eta",
            "{\"mu\": 0.1, \"tau\": 1, \"eta\": [0,0,\"a\",0,0,0], \"beta\": 0.3, \"sigma\": 1.2}",
            "parameter `eta`, element [3]: expected a number",
        ),
        ("negative-sigma", "{\"mu\": 0.1, \"tau\": 1, \"eta\": [0,0,0,0,0,0], \"beta\": 0.3, \"sigma\": -1}", "sigma"),
    ];
    for (name, text, expected) in cases {
        let file = dir.path().join(format!("{name}.json"));
        std::fs::write(&file, text).unwrap();
        check(&["log_prob", "--data", data, "--params", file.to_str().unwrap()], expected);
    }
    // A draws file without a parameter's column, for either command that reads draws.
    let csv = dir.path().join("draws_1.csv");
    std::fs::write(&csv, "lp__,mu,tau,eta.1,eta.2,eta.3,eta.4,eta.5,beta,sigma\n-1,0,1,0,0,0,0,0,0,1\n").unwrap();
    let csv = csv.to_str().unwrap();
    check(&["log_prob", "--data", data, "--params", csv], "parameter `eta[6]` (column `eta.6`) is missing");
    check(&["generate_quantities", "--data", data, "--draws", csv], "parameter `eta[6]` (column `eta.6`) is missing");
}

#[test]
fn help_lists_only_what_a_model_executable_takes() {
    let help = String::from_utf8(run(exe().args(["fit", "--help"])).stdout).unwrap();
    for absent in ["--model", "--posterior", "posteriordb"] {
        assert!(!help.contains(absent), "fit --help mentions {absent}:\n{help}");
    }
    assert!(help.contains("--data") && help.contains("--method") && help.contains("--polish-kernel"), "{help}");
    let help = String::from_utf8(run(exe().arg("--help")).stdout).unwrap();
    for command in ["fit", "optimize", "pathfinder", "generate_quantities", "log_prob", "info"] {
        assert!(help.contains(command), "--help lacks {command}:\n{help}");
    }
}
