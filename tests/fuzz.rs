//! Fuzzed inputs never panic. Property-based tests (fixed seeds, modest case counts) feed
//! random argument vectors to every subcommand, random and mutated TOML configs, and mutated
//! checkpoint and posterior files. Every case ends in success or a named error, with exit code
//! 0 or 2 for a process; a panic (exit 101), an abort (a signal) or an error without a message
//! fails the test with the input that caused it.
//!
//! Argument values come from pools of valid values and of hostile ones (empty, negative, NaN,
//! overflowing, non-UTF-8-looking text, paths to missing, garbage and wrong-kind files). Sizes
//! that set the amount of work (steps, iterations, draws, repeats, particles) draw only small
//! valid values or values that do not parse, so that no case runs for minutes; huge sizes are
//! the edge-case tests' subject.
//!
//! `PARVI_FUZZ_CASES=N` runs N cases per fuzzer (a deeper run by hand); `PARVI_FUZZ_TRACE=1`
//! prints every case's outcome, to see how deep the inputs reach.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use parvi::cli::fit::{FitArgs, FitCommon};
use parvi::cli::predict::PredictArgs;
use parvi::infer::core::Checkpoint;
use parvi::models::posterior::Posterior;
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};

// ---------------------------------------------------------------------------------------------
// Fixtures: files every case may point at, made once per test process.

/// A directory of input files shared by every case (kept for the life of the test process).
struct Fixtures {
    dir: PathBuf,
}

impl Fixtures {
    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }
}

fn fixtures() -> &'static Fixtures {
    static FIXTURES: OnceLock<Fixtures> = OnceLock::new();
    FIXTURES.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap().keep();
        let write = |name: &str, bytes: &[u8]| std::fs::write(dir.join(name), bytes).unwrap();
        write("garbage.bin", &[0xff, 0xfe, 0x00, 0x12, 0x80, b'{', b'[', 0x7f]);
        write("empty.txt", b"");
        write("garbage.toml", b"model = [\n[[[ ]]] = \"\x01\"\nsteps = -");
        write("fit.toml", b"model = \"banana\"\nmethod = \"svgd\"\nlr = 0.05\nseed = 3\n[options]\n");
        write("table.csv", b"x,y\n0.5,1.0\n-1.0,2.5\n2.0,-0.5\n1.5,3.0\n-2.0,0.0\n0.0,1.0\n1.0,2.0\n-0.5,0.5\n");
        write("ragged.csv", b"x,y\n1,2,3\n4\n\"unterminated\n");
        write("text.csv", b"x,y\nabc,1\nnan,inf\n,\n");
        write("header-only.csv", b"x,y\n");
        std::fs::create_dir_all(dir.join("adir")).unwrap();
        std::fs::create_dir_all(dir.join("empty-data")).unwrap();
        // A checkpoint of the banana run `fit.toml` describes, and a BNN posterior of the toy
        // regression (feature `x`), written by the binary itself.
        let run = |args: &[&str]| {
            let out = Command::new(env!("CARGO_BIN_EXE_parvi")).args(args).output().unwrap();
            assert!(out.status.success(), "fixture run {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        };
        let d = |name: &str| dir.join(name).display().to_string();
        let (config, fit_out) = (d("fit.toml"), d("fit-out"));
        run(&["fit", "--config", &config, "--particles", "10", "--steps", "4", "--checkpoint-every", "2", "--quiet"]
            .into_iter()
            .chain(["--out", fit_out.as_str()])
            .collect::<Vec<_>>());
        std::fs::copy(dir.join("fit-out/checkpoint.json"), dir.join("checkpoint.json")).unwrap();
        run(&["bnn", "--iters", "20", "--particles", "5", "--out", &d("bnn-out"), "--save-posterior", &d("toy.post")]);
        Fixtures { dir }
    })
}

// ---------------------------------------------------------------------------------------------
// Value pools.

/// Text that a careless parser trips on.
const HOSTILE_TEXT: &[&str] = &[
    "",
    " ",
    "-",
    "--",
    "-1",
    "0",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "1e400",
    "-0",
    "18446744073709551616",
    "18446744073709551615",
    "9223372036854775808",
    "1.5",
    "0x10",
    "+",
    "é",
    "🙂",
    "a=b=c",
    "=1",
    "x=",
    "a,b,,c",
    ",",
    "..",
    "\t",
    "null",
    "[1,2]",
    "{}",
    "true",
];

/// Values for settings that size the work: never a valid large number.
const HOSTILE_SIZE: &[&str] = &[
    "",
    "-1",
    "-0",
    "nan",
    "inf",
    "1e400",
    "1.5",
    "0x10",
    "18446744073709551616",
    "99999999999999999999999",
    "é",
    "x",
];

/// Values for floating-point settings.
const HOSTILE_FLOAT: &[&str] = &[
    "", "nan", "NaN", "inf", "-inf", "1e400", "-1e400", "0", "-0", "-1", "1e-45", "1e38", "1e300", "x", "0x10", "1,5",
];

fn strings(values: &[&str]) -> Vec<String> {
    values.iter().map(|s| s.to_string()).collect()
}

/// One flag's value: mostly from `valid` (which holds values the parser accepts but the
/// validation may refuse), sometimes from `hostile`, now and then random text. Most argument
/// vectors then get past the parser, so that the checks behind it are fuzzed too.
fn value(valid: Vec<String>, hostile: &'static [&'static str]) -> BoxedStrategy<String> {
    prop_oneof![
        22 => select(valid),
        2 => select(strings(hostile)),
        1 => "[ -~]{0,12}",
    ]
    .boxed()
}

/// A flag that appears with probability `p`: `--name VALUE`, or `--name` alone for a switch.
#[derive(Clone)]
struct Flag {
    name: &'static str,
    p: f64,
    value: Option<BoxedStrategy<String>>,
}

fn flag(name: &'static str, p: f64, valid: &[&str], hostile: &'static [&'static str]) -> Flag {
    Flag { name, p, value: Some(value(strings(valid), hostile)) }
}

fn flag_owned(name: &'static str, p: f64, valid: Vec<String>, hostile: &'static [&'static str]) -> Flag {
    Flag { name, p, value: Some(value(valid, hostile)) }
}

fn switch(name: &'static str, p: f64) -> Flag {
    Flag { name, p, value: None }
}

/// Argument vectors `prefix ++ flags ++ junk`: each flag present with its probability (twice,
/// now and then), plus up to two junk tokens.
fn argv(prefix: &[&str], flags: Vec<Flag>) -> BoxedStrategy<Vec<String>> {
    let prefix: Vec<String> = strings(prefix);
    let parts: Vec<BoxedStrategy<Vec<String>>> = flags
        .into_iter()
        .map(|f| {
            let name = format!("--{}", f.name);
            let one: BoxedStrategy<Vec<String>> = match f.value {
                Some(v) => v.prop_map(move |v| vec![name.clone(), v]).boxed(),
                None => Just(vec![name]).boxed(),
            };
            let times = prop_oneof![
                ((1.0 - f.p) * 100.0).max(0.0) as u32 => Just(0usize),
                (f.p * 98.0) as u32 => Just(1usize),
                (f.p * 2.0).max(1.0) as u32 => Just(2usize),
            ];
            (times, one.clone(), one).prop_map(|(t, a, b)| [a, b].into_iter().take(t).flatten().collect()).boxed()
        })
        .collect();
    let junk = proptest::collection::vec(
        prop_oneof!["--[a-z-]{1,10}", "[ -~]{0,8}", Just("--".to_string()), Just("-h".to_string())],
        0..=1,
    );
    let junk_odds = prop_oneof![19 => Just(false), 1 => Just(true)];
    (parts, junk, junk_odds)
        .prop_map(move |(parts, junk, use_junk)| {
            let mut out = prefix.clone();
            out.extend(parts.into_iter().flatten());
            if use_junk {
                out.extend(junk);
            }
            out
        })
        .boxed()
}

/// Output paths, relative to the case's own directory (never absolute: the tests may run as
/// root, and a fuzzed `--out /` must not write into `/`).
fn out_paths() -> Vec<String> {
    strings(&["o", "o/nested/deeper", ".", "afile", "adir", ""])
}

/// Input files of every kind.
fn input_files(extra: &[&str]) -> Vec<String> {
    let f = fixtures();
    let mut v = vec![
        f.path("garbage.bin"),
        f.path("empty.txt"),
        f.path("garbage.toml"),
        f.path("adir"),
        f.path("missing-file"),
        "/dev/null".into(),
    ];
    v.extend(extra.iter().map(|name| f.path(name)));
    v
}

fn data_dirs() -> Vec<String> {
    let f = fixtures();
    let shared = std::env::var("PARVI_DATA_DIR").unwrap_or_else(|_| f.path("empty-data"));
    vec![shared.clone(), shared, f.path("empty-data"), f.path("missing-dir"), f.path("garbage.bin")]
}

fn method_names() -> Vec<String> {
    let mut v: Vec<String> = parvi::infer::MethodConfig::NAMES.iter().map(|s| s.to_string()).collect();
    v.push("svgd".into());
    v
}

const OPTIONS: &[&str] = &[
    "subset=5",
    "subset=0",
    "subset=-3",
    "m=4",
    "m=0",
    "bandwidth=0.5",
    "bandwidths=[0.1, 1.0]",
    "nope=1",
    "=",
    "x",
    "method=svgd",
    "subset=1e400",
    "lr=nan",
    "lazy=true",
    "max-samples=2",
    "temperature=-1",
    "m=\"x\"",
];

// ---------------------------------------------------------------------------------------------
// Running the binary.

/// How one run of the binary ended.
struct Ended {
    code: Option<i32>,
    stderr: String,
}

/// Runs `parvi args` in a fresh directory holding `afile` (a file) and `adir` (a directory),
/// killing it after `limit`.
fn run_parvi(args: &[String], limit: Duration) -> Result<Ended, String> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("afile"), b"not a directory").unwrap();
    std::fs::create_dir_all(dir.path().join("adir")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_parvi"))
        .args(args)
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawn: {e}"))?;
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut std::io::BufReader::new(stderr), &mut s);
        s
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("still running after {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Ok(Ended { code: status.code(), stderr: reader.join().unwrap() })
}

/// The property every argument vector keeps: exit 0, or exit 2 with an `error:` message;
/// never a panic, an abort or a hang.
fn ends_cleanly(args: &[String]) -> Result<(), TestCaseError> {
    let ended = run_parvi(args, Duration::from_secs(90)).map_err(|e| TestCaseError::fail(format!("{args:?}: {e}")))?;
    let stderr = &ended.stderr;
    if std::env::var_os("PARVI_FUZZ_TRACE").is_some() {
        let first = stderr.lines().find(|l| l.contains("error")).unwrap_or("");
        eprintln!("fuzz: {:?} -> {:?} {first}", args, ended.code);
    }
    prop_assert!(!stderr.contains("panicked"), "{args:?} panicked:\n{stderr}");
    match ended.code {
        Some(0) => Ok(()),
        Some(2) => {
            // Our errors and clap's start `error:`; a subcommand given without its own
            // subcommand prints its usage instead.
            let named = stderr.contains("error") || stderr.contains("Usage:");
            prop_assert!(named, "{args:?} exited 2 without an error message:\n{stderr}");
            Ok(())
        }
        Some(code) => Err(TestCaseError::fail(format!("{args:?} exited {code}:\n{stderr}"))),
        None => Err(TestCaseError::fail(format!("{args:?} was killed by a signal (an abort?):\n{stderr}"))),
    }
}

/// A runner of `cases` cases (`PARVI_FUZZ_CASES` overrides the count, for a deeper run by
/// hand) from a fixed seed, without a persistence file.
fn runner(cases: u32, seed: u64) -> TestRunner {
    let cases = std::env::var("PARVI_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(cases);
    TestRunner::new(Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        max_shrink_iters: 48,
        ..Config::default()
    })
}

fn fuzz_argv(strategy: BoxedStrategy<Vec<String>>, cases: u32, seed: u64) {
    if let Err(e) = runner(cases, seed).run(&strategy, |args| ends_cleanly(&args)) {
        panic!("{e}");
    }
}

// ---------------------------------------------------------------------------------------------
// Argument vectors, per subcommand.

fn size_flag(name: &'static str, p: f64, valid: &[&str]) -> Flag {
    flag(name, p, valid, HOSTILE_SIZE)
}

#[test]
fn fuzzed_fit_arguments_end_in_success_or_a_named_error() {
    let flags = vec![
        flag("model", 0.9, &["gaussian", "mixture", "banana"], HOSTILE_TEXT),
        flag_owned("method", 0.6, method_names(), HOSTILE_TEXT),
        size_flag("particles", 0.9, &["1", "2", "7", "16"]),
        size_flag("steps", 0.95, &["0", "1", "3"]),
        flag("seed", 0.3, &["0", "7", "18446744073709551615"], HOSTILE_SIZE),
        flag("backend", 0.2, &["flex", "ndarray"], HOSTILE_TEXT),
        flag("lr", 0.4, &["0.05", "0.5", "1e-3", "10"], HOSTILE_FLOAT),
        flag("adapter", 0.3, &["adagrad", "adam", "rmsprop", "sgd"], HOSTILE_TEXT),
        flag("kernel", 0.3, &["rbf", "imq"], HOSTILE_TEXT),
        flag("bandwidth", 0.2, &["0.5", "1", "1e-6", "1e6"], HOSTILE_FLOAT),
        flag("init-std", 0.2, &["1", "0.01", "1e6", "1e30"], HOSTILE_FLOAT),
        flag("checkpoint-every", 0.2, &["1", "2", "1000"], HOSTILE_SIZE),
        flag_owned("resume", 0.15, input_files(&["checkpoint.json"]), HOSTILE_TEXT),
        flag("opt", 0.3, OPTIONS, HOSTILE_TEXT),
        flag_owned("config", 0.2, input_files(&["fit.toml", "fit.toml"]), HOSTILE_TEXT),
        flag_owned("out", 0.9, out_paths(), HOSTILE_TEXT),
        switch("quiet", 0.7),
    ];
    fuzz_argv(argv(&["fit"], flags), 64, 0xF17);
}

#[test]
fn fuzzed_bnn_arguments_end_in_success_or_a_named_error() {
    let flags = vec![
        flag("dataset", 0.3, &["boston", "yacht", "breast-cancer", "nope"], HOSTILE_TEXT),
        flag_owned(
            "csv",
            0.25,
            input_files(&["table.csv", "table.csv", "ragged.csv", "text.csv", "header-only.csv"]),
            HOSTILE_TEXT,
        ),
        flag("target", 0.3, &["y", "x", "z"], HOSTILE_TEXT),
        flag("features", 0.1, &["x", "y", "x,x", "q"], HOSTILE_TEXT),
        flag("test-fraction", 0.15, &["0.1", "0.5", "0", "1", "0.99"], HOSTILE_FLOAT),
        switch("drop-missing", 0.1),
        flag("task", 0.15, &["regression", "classification"], HOSTILE_TEXT),
        flag("save-posterior", 0.2, &["p.post", "adir", "o/p.post"], HOSTILE_TEXT),
        flag("split", 0.2, &["0", "1", "19", "20", "99"], HOSTILE_SIZE),
        flag("lambda", 0.15, &["1", "0.1", "0", "1e30"], HOSTILE_FLOAT),
        flag_owned("method", 0.4, method_names(), HOSTILE_TEXT),
        size_flag("particles", 0.7, &["1", "3", "8"]),
        size_flag("batch", 0.3, &["0", "1", "5", "100"]),
        size_flag("iters", 1.0, &["0", "1", "3"]),
        flag("seconds", 0.1, &["0.5", "0", "1e-9"], HOSTILE_FLOAT),
        flag("lr", 0.2, &["1e-3", "0.1", "100"], HOSTILE_FLOAT),
        flag("hidden", 0.3, &["5", "5,5", "0", "3,0,3", "100000,100000"], HOSTILE_TEXT),
        switch("linear", 0.05),
        flag("activation", 0.2, &["relu", "tanh"], HOSTILE_TEXT),
        flag("seed", 0.2, &["0", "1", "18446744073709551615"], HOSTILE_SIZE),
        flag("backend", 0.1, &["flex", "ndarray"], HOSTILE_TEXT),
        flag_owned("data-dir", 0.3, data_dirs(), HOSTILE_TEXT),
        flag("opt", 0.2, OPTIONS, HOSTILE_TEXT),
        flag("checkpoint-every", 0.15, &["1", "2"], HOSTILE_SIZE),
        flag_owned("resume", 0.1, input_files(&["checkpoint.json"]), HOSTILE_TEXT),
        flag_owned("out", 1.0, out_paths(), HOSTILE_TEXT),
    ];
    fuzz_argv(argv(&["bnn"], flags), 48, 0xB22);
}

#[test]
fn fuzzed_predict_arguments_end_in_success_or_a_named_error() {
    let flags = vec![
        flag_owned(
            "posterior",
            0.95,
            input_files(&["toy.post", "toy.post", "toy.post", "checkpoint.json"]),
            HOSTILE_TEXT,
        ),
        flag_owned(
            "csv",
            0.95,
            input_files(&["table.csv", "table.csv", "ragged.csv", "text.csv", "header-only.csv"]),
            HOSTILE_TEXT,
        ),
        flag("out", 0.95, &["pred.csv", "o/pred.csv", "adir", "afile"], HOSTILE_TEXT),
        size_flag("batch", 0.4, &["0", "1", "3", "4096"]),
        flag("backend", 0.2, &["flex", "ndarray"], HOSTILE_TEXT),
        switch("drop-missing", 0.2),
    ];
    fuzz_argv(argv(&["predict"], flags), 32, 0x9ED);
}

#[test]
fn fuzzed_bench_arguments_end_in_success_or_a_named_error() {
    // Always one CPU backend: without `--backend` the bench also times all 16 engines on wgpu,
    // which on llvmpipe (MMD-FW: 20 s a step) outlasts the 90 s hang guard on a loaded 2-core
    // machine; the argument handling under test is the same.
    let speed = vec![
        flag("backend", 1.0, &["flex", "ndarray"], HOSTILE_TEXT),
        size_flag("particles", 1.0, &["2", "3"]),
        flag("only", 1.0, &["gaussian", "blr", "bnn", "engines"], HOSTILE_TEXT),
        size_flag("repeats", 1.0, &["1", "2"]),
        size_flag("steps", 1.0, &["1", "2"]),
        flag_owned("data-dir", 0.3, data_dirs(), HOSTILE_TEXT),
        flag("json", 0.3, &["r.json", "adir", "o/r.json"], HOSTILE_TEXT),
    ];
    fuzz_argv(argv(&["bench", "speed"], speed), 12, 0x5EED);

    let uci = vec![
        flag("dataset", 1.0, &["boston", "yacht", "breast-cancer", "nope"], HOSTILE_TEXT),
        flag("splits", 1.0, &["1", "2", "0..1", "19..20", "21", "99", "3..2", "all"], HOSTILE_TEXT),
        flag("eval-every", 0.2, &["1", "2", "0"], HOSTILE_SIZE),
        flag_owned("method", 0.3, method_names(), HOSTILE_TEXT),
        size_flag("particles", 0.5, &["1", "3"]),
        size_flag("batch", 0.3, &["0", "1", "100"]),
        size_flag("iters", 1.0, &["0", "1", "2"]),
        flag("hidden", 0.2, &["3", "3,3", "0"], HOSTILE_TEXT),
        flag("activation", 0.1, &["relu", "tanh"], HOSTILE_TEXT),
        flag("lr", 0.2, &["1e-3", "1"], HOSTILE_FLOAT),
        flag_owned("data-dir", 0.3, data_dirs(), HOSTILE_TEXT),
        flag("opt", 0.2, OPTIONS, HOSTILE_TEXT),
        flag("json", 0.3, &["r.json", "adir"], HOSTILE_TEXT),
    ];
    fuzz_argv(argv(&["bench", "uci"], uci), 16, 0x0C1);

    let posteriordb = std::env::var("PARVI_POSTERIORDB_DIR").unwrap_or_default();
    let posteriordb = vec![
        flag("posterior", 1.0, &["eight_schools", "kidiq", "mesquite", "eight_schools,kidiq", "nope"], HOSTILE_TEXT),
        flag("method", 1.0, &["svgd", "nuts-rs", "sgld", "mmd-fw", "svgd,nuts-rs", "nope"], HOSTILE_TEXT),
        flag_owned(
            "data-dir",
            0.3,
            vec![posteriordb.clone(), posteriordb, fixtures().path("empty-data")],
            HOSTILE_TEXT,
        ),
        size_flag("particles", 1.0, &["2", "5"]),
        size_flag("steps", 1.0, &["1", "3"]),
        flag("seed", 0.2, &["0", "3"], HOSTILE_SIZE),
        flag("precondition", 0.5, &["none", "laplace"], HOSTILE_TEXT),
        flag("lr", 0.2, &["0.05", "1"], HOSTILE_FLOAT),
        flag("opt", 0.2, OPTIONS, HOSTILE_TEXT),
        size_flag("nuts-tune", 1.0, &["2", "5"]),
        size_flag("nuts-draws", 1.0, &["2", "5"]),
        flag("json", 0.2, &["r.json", "adir"], HOSTILE_TEXT),
    ];
    fuzz_argv(argv(&["bench", "posteriordb"], posteriordb), 12, 0x9DB);
}

#[test]
fn fuzzed_reference_data_and_top_level_arguments_end_in_success_or_a_named_error() {
    let reference = vec![
        flag("model", 1.0, &["gaussian", "banana", "mixture", "blr"], HOSTILE_TEXT),
        flag("dataset", 0.4, &["breast-cancer", "boston", "nope"], HOSTILE_TEXT),
        flag("split", 0.2, &["0", "99"], HOSTILE_SIZE),
        size_flag("draws", 1.0, &["0", "1", "10"]),
        size_flag("tune", 1.0, &["0", "5"]),
        flag("seed", 0.2, &["0", "3"], HOSTILE_SIZE),
        flag_owned("data-dir", 0.3, data_dirs(), HOSTILE_TEXT),
        flag("out", 0.9, &["r.csv", "adir", "o/r.csv"], HOSTILE_TEXT),
    ];
    fuzz_argv(argv(&["reference"], reference), 16, 0x8EF);

    for (i, sub) in ["list", "info", "verify", "fetch"].into_iter().enumerate() {
        let mut flags = vec![flag_owned("data-dir", 0.9, data_dirs(), HOSTILE_TEXT)];
        if sub == "fetch" {
            // Never the network: a closed local port, or a data directory of the case's own.
            flags = vec![
                flag("data-dir", 1.0, &["d", "afile", "adir"], HOSTILE_TEXT),
                flag("base-url", 1.0, &["http://127.0.0.1:9", "file:///nonexistent"], &["", "::", "http://"]),
            ];
        }
        let names = prop_oneof![
            3 => select(strings(&["boston", "yacht", "breast-cancer", "nope", "all"])),
            1 => select(strings(HOSTILE_TEXT)),
        ];
        let strategy = (argv(&["data", sub], flags), proptest::option::of(names))
            .prop_map(|(mut a, name)| {
                a.extend(name);
                a
            })
            .boxed();
        fuzz_argv(strategy, 8, 0xDA7A + i as u64);
    }

    // Anything at all after `parvi` (never nothing: that runs the main job).
    let tokens = prop_oneof![
        select(strings(&["fit", "bnn", "predict", "bench", "reference", "data", "help", "--help", "--version", "-V"])),
        select(strings(HOSTILE_TEXT)),
        "--?[a-z]{1,8}",
    ];
    fuzz_argv(proptest::collection::vec(tokens, 1..4).prop_filter("not a run", |a| !is_a_job(a)).boxed(), 24, 0x70);
}

/// Whether `args` would start a default job (the toy BNN, every benchmark): not a parsing test.
fn is_a_job(args: &[String]) -> bool {
    matches!(args.first().map(String::as_str), Some("bnn" | "bench" | "reference"))
        && !args.iter().any(|a| a.starts_with('-'))
}

// ---------------------------------------------------------------------------------------------
// TOML configs: random tables of the known keys (and some unknown), and mutated valid files.

/// Each config key with values of its own type (valid or not for the run), for random tables.
fn fit_key_values() -> Vec<(&'static str, &'static [&'static str])> {
    vec![
        ("model", &["\"gaussian\"", "\"banana\"", "\"mixture\"", "\"nope\"", "\"\""]),
        (
            "method",
            &["\"svgd\"", "\"sgld\"", "\"mmd-fw\"", "\"mk-svgd\"", "\"svgd-cf\"", "\"stein-points\"", "\"a-svgd\""],
        ),
        ("particles", &["1", "3", "0", "-1"]),
        ("steps", &["0", "1", "5", "-3"]),
        ("seed", &["0", "9223372036854775807", "-1"]),
        ("backend", &["\"flex\"", "\"ndarray\"", "\"tpu\""]),
        ("lr", &["0.05", "0.0", "-1.0", "nan", "inf", "1e300", "5"]),
        ("adapter", &["\"adam\"", "\"sgd\"", "\"rmsprop\"", "\"adagrad\"", "\"x\""]),
        ("kernel", &["\"rbf\"", "\"imq\"", "\"x\""]),
        ("bandwidth", &["0.5", "0.0", "-2.0", "nan", "1e-30", "1e30"]),
        ("init-std", &["1.0", "0.0", "1e20", "-1.0", "nan", "inf"]),
        ("checkpoint-every", &["1", "0", "2"]),
        ("resume", &["\"missing.json\"", "\"\"", "\"/dev/null\""]),
        ("out", &["\"elsewhere\""]),
        ("quiet", &["true", "false"]),
        ("options", &["{ subset = 3 }", "{ nope = 1 }", "{ m = -1 }", "{}", "{ bandwidths = [0.5, 1.0] }"]),
        ("opt", &["[\"subset=3\"]"]),
        ("modle", &["\"gaussian\""]),
    ]
}

/// Values of any type, for a key that does not expect them.
fn toml_value() -> BoxedStrategy<String> {
    select(strings(&[
        "\"gaussian\"",
        "\"\"",
        "\"é\"",
        "'literal'",
        "\"\"\"multi\nline\"\"\"",
        "0",
        "-1",
        "9223372036854775807",
        "-9223372036854775808",
        "0x10",
        "0o7",
        "0.05",
        "nan",
        "+inf",
        "-inf",
        "1e308",
        "-0.0",
        "5e-324",
        "true",
        "1979-05-27T07:32:00Z",
        "[]",
        "[1, 2]",
        "[\"a\", 1]",
        "{}",
        "{ subset = 3 }",
    ]))
    .boxed()
}

/// Config files of distinct known keys (and now and then a misspelt one), each value of its
/// key's type most of the time, plus an `[options]` table now and then.
fn random_toml() -> BoxedStrategy<String> {
    let keys = fit_key_values();
    let lines: Vec<BoxedStrategy<Option<String>>> = keys
        .into_iter()
        .map(|(key, values)| {
            let p = match key {
                "model" => 0.9,
                "modle" | "opt" => 0.03,
                _ => 0.3,
            };
            let value = prop_oneof![12 => select(strings(values)), 1 => toml_value()];
            proptest::option::weighted(p, value.prop_map(move |v| format!("{key} = {v}\n"))).boxed()
        })
        .collect();
    let options = proptest::collection::vec(
        (select(strings(&["subset", "m", "bandwidth", "lazy", "nope", "max-samples"])), toml_value())
            .prop_map(|(k, v)| format!("{k} = {v}\n")),
        0..3,
    );
    (lines, proptest::option::weighted(0.15, options))
        .prop_map(|(lines, options)| {
            let mut text: String = lines.into_iter().flatten().collect();
            if let Some(o) = options
                && !text.contains("options =")
            {
                text.push_str("[options]\n");
                text.push_str(&o.concat());
            }
            text
        })
        .boxed()
}

/// A byte-level mutation of `base`: flips, deletions, insertions and truncations.
fn mutated(base: Vec<u8>) -> BoxedStrategy<Vec<u8>> {
    let len = base.len().max(1);
    let edit = prop_oneof![
        1 => (0..len, any::<u8>()).prop_map(|(i, b)| (0u8, i, b)),
        2 => (0..len, any::<u8>()).prop_map(|(i, b)| (1u8, i, b)),
        1 => (0..len, any::<u8>()).prop_map(|(i, b)| (2u8, i, b)),
        4 => (0..len, select(b"{}[]\",:0123456789.-e \n=#'".to_vec())).prop_map(|(i, b)| (2u8, i, b)),
        1 => (0..len).prop_map(|i| (3u8, i, 0)),
    ];
    proptest::collection::vec(edit, 1..4)
        .prop_map(move |edits| {
            let mut bytes = base.clone();
            for (kind, i, b) in edits {
                let i = i.min(bytes.len().saturating_sub(1));
                match kind {
                    0 if !bytes.is_empty() => bytes[i] ^= b.max(1),
                    1 if !bytes.is_empty() => {
                        bytes.remove(i);
                    }
                    2 => bytes.insert(i.min(bytes.len()), b),
                    3 => bytes.truncate(i),
                    _ => {}
                }
            }
            bytes
        })
        .boxed()
}

/// Runs `f` and turns a panic into a test failure naming `what`.
fn no_panic<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, TestCaseError> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| {
        let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
        TestCaseError::fail(format!("{what}: panicked: {}", msg.unwrap_or_default()))
    })
}

/// `parvi fit --config FILE` with the work bounded on the command line (flags win).
fn fit_with_config(config: &Path, out: &Path) -> anyhow::Result<()> {
    parvi::cli::fit::run(FitArgs {
        common: FitCommon {
            config: Some(config.to_path_buf()),
            particles: Some(6),
            steps: Some(2),
            backend: Some("flex".into()),
            out: Some(out.to_path_buf()),
            quiet: true,
            ..FitCommon::default()
        },
        ..FitArgs::default()
    })
}

/// Prints a case's outcome when `PARVI_FUZZ_TRACE` is set (to see what the fuzzers reach).
fn trace(what: &str, outcome: &anyhow::Result<()>) {
    if std::env::var_os("PARVI_FUZZ_TRACE").is_some() {
        let msg = outcome.as_ref().err().map(|e| format!("{e:#}")).unwrap_or_else(|| "ok".into());
        eprintln!("fuzz: {} -> {}", what.chars().take(160).collect::<String>(), msg.lines().next().unwrap_or(""));
    }
}

fn named_error(e: &anyhow::Error) -> Result<(), TestCaseError> {
    let msg = format!("{e:#}");
    prop_assert!(!msg.trim().is_empty(), "an error without a message");
    Ok(())
}

#[test]
fn fuzzed_toml_configs_end_in_success_or_a_named_error() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.toml");
    let base = std::fs::read(fixtures().dir.join("fit.toml")).unwrap();
    let strategy = prop_oneof![
        6 => random_toml().prop_map(String::into_bytes),
        3 => mutated(base),
        1 => proptest::collection::vec(any::<u8>(), 0..64),
    ];
    let result = runner(160, 0x70_41).run(&strategy, |bytes| {
        std::fs::write(&config, &bytes).unwrap();
        let what = format!("config {:?}", String::from_utf8_lossy(&bytes));
        let outcome = no_panic(&what, || fit_with_config(&config, &dir.path().join("out")))?;
        trace(&what, &outcome);
        match outcome {
            Ok(()) => Ok(()),
            Err(e) => {
                named_error(&e)?;
                // A config error names the file.
                let msg = format!("{e:#}");
                let about_file = msg.contains("c.toml") || !msg.contains("config");
                prop_assert!(about_file, "{what}: {msg}");
                Ok(())
            }
        }
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

// ---------------------------------------------------------------------------------------------
// Checkpoints: byte-level damage (refused by the checksum), and structural edits with the
// checksum recomputed (what a resume must survive without one).

/// One step of a path into a JSON value.
#[derive(Clone, Debug)]
enum Step {
    Key(String),
    Index(usize),
}

/// The paths of every value in `v` except the elements of arrays of numbers (the particle and
/// state values): those arrays are edited whole, so that most edits reach the structure.
fn json_paths(v: &serde_json::Value, at: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    match v {
        serde_json::Value::Object(o) => {
            for (k, child) in o {
                at.push(Step::Key(k.clone()));
                out.push(at.clone());
                json_paths(child, at, out);
                at.pop();
            }
        }
        serde_json::Value::Array(a) if !a.iter().all(serde_json::Value::is_number) => {
            for (i, child) in a.iter().enumerate() {
                at.push(Step::Index(i));
                out.push(at.clone());
                json_paths(child, at, out);
                at.pop();
            }
        }
        _ => {}
    }
}

/// What replaces the value an edit picks.
#[derive(Clone, Debug)]
enum Edit {
    /// Removed from its object or array.
    Remove,
    /// Another value of the same JSON type (number for number, array of numbers for one, ...),
    /// the `n`th of that type's pool: most of these still deserialise, so the edit reaches the
    /// code behind the parser.
    SameType(usize),
    /// Any value at all.
    Any(serde_json::Value),
}

/// Values of each JSON type that stress sizes, signs and lengths.
fn same_type(original: &serde_json::Value, n: usize) -> serde_json::Value {
    use serde_json::{Value, json};
    let pool: Vec<Value> = match original {
        Value::Number(_) => {
            vec![json!(0), json!(1), json!(2), json!(-1), json!(1e300), json!(0.5), json!(u64::MAX), json!(7)]
        }
        Value::String(_) => vec![json!(""), json!("svgd"), json!("banana"), json!("é"), json!("0")],
        Value::Bool(b) => vec![json!(!b)],
        Value::Array(a) if a.iter().all(Value::is_number) => {
            let mut longer = a.clone();
            longer.push(json!(1.0));
            let shorter = a.iter().skip(1).cloned().collect::<Vec<_>>();
            // The same numbers in another order: a shape `[a, b]` becomes `[b, a]`, which still
            // fills with the same values.
            let reversed = a.iter().rev().cloned().collect::<Vec<_>>();
            let product = a.iter().filter_map(Value::as_u64).product::<u64>();
            vec![json!([]), json!(longer), json!(shorter), json!(reversed), json!([product]), json!([1]), json!([2, 3])]
        }
        Value::Array(_) => vec![json!([]), json!([{}])],
        Value::Object(_) => vec![json!({}), json!({"shape": [2], "values": [1.0, 2.0]})],
        Value::Null => vec![json!(0), json!([]), json!("x")],
    };
    pool[n % pool.len()].clone()
}

/// The value at path number `pick` (modulo their count) in `v` edited by `edit`.
fn edit_json(v: &mut serde_json::Value, pick: usize, edit: &Edit) {
    edit_json_under(v, None, pick, edit)
}

/// [`edit_json`] among the paths under the top-level keys other than `skip` (all when `None`).
fn edit_json_under(v: &mut serde_json::Value, skip: Option<&[&str]>, pick: usize, edit: &Edit) {
    let mut paths = Vec::new();
    json_paths(v, &mut Vec::new(), &mut paths);
    if let Some(skip) = skip {
        paths.retain(|p| !matches!(p.first(), Some(Step::Key(k)) if skip.contains(&k.as_str())));
    }
    let Some(path) = paths.get(pick % paths.len().max(1)) else { return };
    let (last, parents) = path.split_last().unwrap();
    let mut node = v;
    for step in parents {
        node = match step {
            Step::Key(k) => &mut node[k.as_str()],
            Step::Index(i) => &mut node[*i],
        };
    }
    let target = match last {
        Step::Key(k) => &mut node[k.as_str()],
        Step::Index(i) => &mut node[*i],
    };
    let with = match edit {
        Edit::Remove => None,
        Edit::SameType(n) => Some(same_type(target, *n)),
        Edit::Any(value) => Some(value.clone()),
    };
    match (node, last, with) {
        (serde_json::Value::Object(o), Step::Key(k), Some(new)) => {
            o.insert(k.clone(), new);
        }
        (serde_json::Value::Object(o), Step::Key(k), None) => {
            o.remove(k);
        }
        (serde_json::Value::Array(a), Step::Index(i), Some(new)) => a[*i] = new,
        (serde_json::Value::Array(a), Step::Index(i), None) => {
            a.remove(*i);
        }
        _ => {}
    }
}

fn json_edit() -> BoxedStrategy<Edit> {
    use serde_json::json;
    let anything =
        select(vec![json!(null), json!(""), json!(-1), json!([]), json!({}), json!(true), json!([1.5, "x"])]);
    prop_oneof![
        1 => Just(Edit::Remove),
        6 => any::<usize>().prop_map(Edit::SameType),
        1 => anything.prop_map(Edit::Any),
    ]
    .boxed()
}

#[test]
fn fuzzed_checkpoints_are_refused_by_name_or_resume_without_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    // A checkpoint per engine family: SVGD (AdaGrad history), SGLD (draws kept), MMD-FW (weights
    // and caches), MK-SVGD (kernel weights).
    let mut bases = Vec::new();
    for method in ["svgd", "sgld", "mmd-fw", "mk-svgd"] {
        let out = dir.path().join(format!("base-{method}"));
        let args = FitArgs {
            model: Some("banana".into()),
            common: FitCommon {
                method: Some(method.into()),
                particles: Some(6),
                steps: Some(4),
                checkpoint_every: Some(2),
                out: Some(out.clone()),
                quiet: true,
                ..FitCommon::default()
            },
            ..FitArgs::default()
        };
        parvi::cli::fit::run(args.clone()).unwrap();
        bases.push((args, std::fs::read(out.join("checkpoint.json")).unwrap()));
    }
    let path = dir.path().join("mutated.json");
    let strategy = (0..bases.len(), any::<usize>(), json_edit(), 0..4u8, any::<u64>());
    let result = runner(128, 0xC4E).run(&strategy, |(which, pick, with, kind, seed)| {
        // A quarter byte-level damage; the rest structural edits, two thirds of those of the
        // state itself (not of the run's identity, whose edits are refused by name at once).
        let structural = kind > 0;
        let (args, base) = &bases[which];
        let bytes = if structural {
            let mut value: serde_json::Value = serde_json::from_slice(base).unwrap();
            let skip: &[&str] = &["run", "format", "sha256"];
            edit_json_under(&mut value, (kind > 1).then_some(skip), pick, &with);
            // Re-sealed with a correct checksum when it still parses as a checkpoint.
            match serde_json::from_value::<Checkpoint>(value.clone()) {
                Ok(c) => c.to_bytes().unwrap(),
                Err(_) => serde_json::to_vec(&value).unwrap(),
            }
        } else {
            // A few bytes damaged at seeded places.
            let mut b = base.clone();
            let mut s = seed;
            for _ in 0..1 + (seed % 3) {
                if b.is_empty() {
                    break;
                }
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let i = (s >> 33) as usize % b.len();
                match (s >> 20) % 3 {
                    0 => b[i] ^= 1 << ((s >> 8) % 8),
                    1 => b.truncate(i),
                    _ => b.insert(i, b"0,]}\"e-"[(s as usize >> 4) % 7]),
                }
            }
            b
        };
        std::fs::write(&path, &bytes).unwrap();
        let what = format!(
            "{} checkpoint edit ({pick}, {with:?}, kind {kind}, seed {seed})",
            args.common.method.as_deref().unwrap()
        );
        let loaded = no_panic(&what, || Checkpoint::load(&path))?;
        let resume = FitArgs {
            common: FitCommon {
                resume: Some(path.clone()),
                steps: Some(7),
                checkpoint_every: None,
                ..args.common.clone()
            },
            ..args.clone()
        };
        let outcome = no_panic(&what, || parvi::cli::fit::run(resume))?;
        trace(&what, &outcome);
        match outcome {
            Ok(()) => prop_assert!(loaded.is_ok(), "{what}: resumed from a checkpoint that does not load"),
            Err(e) => {
                named_error(&e)?;
                if loaded.is_err() {
                    prop_assert!(format!("{e:#}").contains("mutated.json"), "{what}: {e:#}");
                }
            }
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

// ---------------------------------------------------------------------------------------------
// Posterior files: byte-level damage, and edits of the metadata and arrays saved with a
// consistent checksum.

#[test]
fn fuzzed_posterior_files_are_refused_by_name_or_predict_without_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let f = fixtures();
    let base_bytes = std::fs::read(f.dir.join("toy.post")).unwrap();
    let base = Posterior::from_bytes(&base_bytes).unwrap();
    let path = dir.path().join("mutated.post");
    let predict = |out: &Path| PredictArgs {
        posterior: path.clone(),
        csv: f.dir.join("table.csv"),
        out: out.to_path_buf(),
        batch: 3,
        backend: None,
        drop_missing: false,
    };
    let structural =
        (0..12usize, any::<usize>(), json_edit()).prop_map(|(field, pick, with)| (true, field, pick, with));
    let damage =
        (0..3usize, any::<usize>(), Just(Edit::Remove)).prop_map(|(field, pick, with)| (false, field, pick, with));
    let strategy = prop_oneof![structural, damage];
    let result = runner(96, 0x905).run(&strategy, |(structural, field, pick, with)| {
        let bytes = if structural {
            let mut p = base.clone();
            let n = p.positions.len().max(1);
            match field {
                0 => p.meta.dim = pick % 2000,
                1 => p.meta.particles = pick % 9,
                2 => p.positions.truncate(pick % n),
                3 => p.positions[pick % n] = [f32::NAN, f32::INFINITY, 1e30, -0.0][pick % 4],
                4 => p.weights.iter_mut().for_each(|w| *w = [-1.0, 0.0, f32::NAN, 2.0][pick % 4]),
                5 => {
                    p.noise_sd =
                        [None, Some(vec![-1.0; 5]), Some(vec![f32::NAN; 5]), Some(vec![0.0; 2])][pick % 4].clone()
                }
                6 => {
                    p.meta.features =
                        [vec![], vec!["y".into()], vec!["x".into(), "x".into()], vec!["q".into()]][pick % 4].clone()
                }
                7 => {
                    let s = &mut p.meta.scaling;
                    match pick % 4 {
                        0 => s.x_std = vec![0.0],
                        1 => s.x_mean = vec![],
                        2 => s.y_std = f64::NAN,
                        _ => s.x_std = vec![f64::INFINITY, 1.0],
                    }
                }
                8 => {
                    p.meta.classes = [None, Some(vec![]), Some(vec!["a".into()]), Some(vec!["a".into(), "b".into()])]
                        [pick % 4]
                        .clone()
                }
                9 | 10 => edit_json(&mut p.meta.model, pick, &with),
                _ => p.meta.model_kind = ["", "blr", "bnn", "BNN"][pick % 4].into(),
            }
            match p.to_bytes() {
                Ok(b) => b,
                Err(_) => return Ok(()), // refused at save: nothing to read back
            }
        } else {
            let mut b = base_bytes.clone();
            let i = pick % b.len();
            match field {
                0 => b[i] ^= 0x55,
                1 => b.truncate(i),
                _ => b.insert(i, b'{'),
            }
            b
        };
        std::fs::write(&path, &bytes).unwrap();
        let what = format!("posterior edit (structural {structural}, field {field}, pick {pick}, {with:?})");
        let _ = no_panic(&what, || Posterior::load(&path))?;
        let outcome = no_panic(&what, || parvi::cli::predict::run(predict(&dir.path().join("pred.csv"))))?;
        trace(&what, &outcome);
        if let Err(e) = outcome {
            named_error(&e)?;
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

// ---------------------------------------------------------------------------------------------
// Stan data files: a user's data block read through the public reader, from byte-level damage
// and structural edits of a valid file.

/// A data block as a user's model reads it (sizes by field, an index array with its bounds, a
/// matrix, a bounded vector), through [`parvi::models::stan_data::StanData`].
fn read_data_block(path: &Path) -> Result<(), parvi::models::stan_data::StanDataError> {
    let data = parvi::models::stan_data::StanData::read(path)?;
    let j = data.size("J")?;
    data.size("N")?;
    let group = data.ints("group", "N")?.lower(1)?.upper_field("J")?;
    group.indices(j)?;
    data.vector("y", "N")?.finite()?;
    data.vector("sigma", "J")?.lower(0.0)?;
    data.matrix("X", "N", 2)?;
    data.real("scale")?;
    Ok(())
}

#[test]
fn fuzzed_stan_data_files_are_refused_by_file_and_field_without_a_panic() {
    use serde_json::json;
    let dir = tempfile::tempdir().unwrap();
    let base = json!({
        "N": 4, "J": 2, "group": [1, 2, 2, 1], "y": [0.5, -1.0, 2.0, 0.0], "sigma": [1.0, 2.5],
        "X": [[1, 0.5], [1, -0.5], [1, 1.5], [1, 0.0]], "scale": 2.5
    });
    let path = dir.path().join("fuzzed-data.json");
    std::fs::write(&path, base.to_string()).unwrap();
    read_data_block(&path).expect("the base file fits its data block");
    let strategy = prop_oneof![
        1 => mutated(base.to_string().into_bytes()).prop_map(|b| (b, 0usize, Edit::Remove, false)),
        3 => (any::<usize>(), json_edit()).prop_map(|(pick, edit)| (Vec::new(), pick, edit, true)),
    ];
    let result = runner(256, 0x57A4).run(&strategy, |(bytes, pick, edit, structural)| {
        let bytes = if structural {
            let mut value = base.clone();
            edit_json_under(&mut value, None, pick, &edit);
            value.to_string().into_bytes()
        } else {
            bytes
        };
        std::fs::write(&path, &bytes).unwrap();
        let what = format!("data file {:?}", String::from_utf8_lossy(&bytes));
        match no_panic(&what, || read_data_block(&path))? {
            Ok(()) => {}
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(msg.contains("fuzzed-data.json"), "{what}: {msg}");
                if let Some(field) = e.field() {
                    prop_assert!(msg.contains(&format!("`{field}`")), "{what}: {msg}");
                }
            }
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
