//! `parvi bench posteriordb`: every posterior of the posteriordb suite (and of the wider suite,
//! `../shared/posteriordb-more`) fitted by every engine with its defaults (and by parvi's NUTS as
//! the yardstick), compared with the reference draws or moments on the constrained scale.
//!
//! One row a posterior and method. A posterior that cannot run (an unknown model, data that do
//! not fit it, a bad `posterior.json` or reference) is a row naming the cause, and the others
//! run; one without a reference runs and its row says so.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use parvi_bench::reference::{NutsConfig, nuts_run};
use parvi_infer::{AdapterConfig, EngineRng, EngineSpec, FitConfig, MethodConfig, Precondition, fit_reported};
use parvi_model::tensor_ops::{matrix_from_vec, to_vec_f64};
use parvi_model::{BackendKind, LogDensity};
use parvi_models::posteriordb::compare::{Comparison, compare, compare_moments};
use parvi_models::posteriordb::{self, PosteriorDbModel, ReferenceDraws, ReferenceMoments};
use serde::Serialize;

use super::method::{method_config, parse_options};
use super::write_atomic;

/// The yardstick NUTS (parvi-bench's nuts-rs reference) by its `--method` name; `nuts` is the
/// library's batched NUTS (`parvi_infer::engines::nuts`).
pub const NUTS_RS: &str = "nuts-rs";

#[derive(Args, Debug)]
pub struct PosteriorDbArgs {
    /// Posterior(s), comma-separated: a folder of the suite (any data set of a known model), a
    /// posterior's name or alias, or `all` (every folder holding a `posterior.json`).
    #[arg(long, default_value = "all")]
    pub posterior: String,
    /// Method(s), comma-separated: any `--method` of `parvi fit` (`nuts` among them), `nuts-rs` for
    /// the yardstick NUTS (nuts-rs, one chain at a time, one position per gradient), or `all`
    /// (every method and nuts-rs).
    #[arg(long, default_value = "all")]
    pub method: String,
    /// A suite folder (one holding posterior folders); repeat it for several, read in the order
    /// given [default: $PARVI_POSTERIORDB_DIR, then $PARVI_POSTERIORDB_MORE_DIR, those set].
    #[arg(long)]
    pub data_dir: Vec<PathBuf>,
    /// Particles per engine.
    #[arg(long, default_value_t = 100)]
    pub particles: usize,
    /// Engine steps (the library's `DEFAULT_STEPS`).
    #[arg(long, default_value_t = parvi_infer::DEFAULT_STEPS)]
    pub steps: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// `laplace` (whiten by the Laplace approximation at the mode) or `none`.
    #[arg(long, default_value = "laplace")]
    pub precondition: String,
    /// Step size of the shared AdaGrad rule.
    #[arg(long, default_value_t = 0.05)]
    pub lr: f64,
    /// MALA steps per particle of the stationarity check on a particle engine's final set (0 turns
    /// it off).
    #[arg(long, default_value_t = 200)]
    pub check_steps: usize,
    /// Overall false-alarm rate of the stationarity check, in (0, 1).
    #[arg(long, default_value_t = 0.01)]
    pub check_level: f64,
    /// The shared kernel: rbf, imq or rbf-linear (the moment-matching kernel).
    #[arg(long, default_value = "rbf")]
    pub kernel: String,
    /// Polish every run (the default): continue the stationarity check's chains until they
    /// mix and compare their draws (the polish step; its cost is in the row's seconds and
    /// evaluations).
    #[arg(long, conflicts_with = "no_polish")]
    pub polish: bool,
    /// Never polish: compare the engine's own answer.
    #[arg(long)]
    pub no_polish: bool,
    /// The polish step's budget: gradients per chain after its warm-up [default: 5000].
    #[arg(long)]
    pub polish_steps: Option<usize>,
    /// The polish step's kernel: auto, chees, nuts, mala or auto-mala [default: auto].
    #[arg(long, value_name = "KERNEL")]
    pub polish_kernel: Option<String>,
    /// A method option (applies to every method run; repeatable).
    #[arg(long)]
    pub opt: Vec<String>,
    /// nuts-rs's warm-up and kept draws.
    #[arg(long, default_value_t = 1000)]
    pub nuts_tune: u64,
    #[arg(long, default_value_t = 2000)]
    pub nuts_draws: u64,
    #[arg(long, default_value = "flex")]
    pub backend: String,
    /// Also write the rows as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// One posterior fitted by one method, compared with the reference.
#[derive(Debug, Serialize)]
pub struct PosteriorDbRow {
    pub posterior: String,
    pub method: String,
    /// Largest `|mean error|` over the reported parameters, in reference sds.
    pub max_mean_error_sd: f64,
    pub mean_mean_error_sd: f64,
    /// Largest `|sd ratio - 1|`.
    pub max_sd_ratio_error: f64,
    /// Energy distance on reference-standardised coordinates.
    pub distance: f64,
    pub seconds: f64,
    /// Model evaluations (one per particle and call).
    pub score_evals: usize,
    /// Draws compared (particles, or the engine's collected draws).
    pub draws: usize,
    /// The parameter with the largest `|mean error|`.
    pub worst_parameter: String,
    /// Per reported parameter: the error of the mean in reference sds, and the sd ratio.
    pub mean_error_sd: Vec<(String, f64)>,
    pub sd_ratio: Vec<(String, f64)>,
    /// The run's convergence diagnostics (engines; NUTS reports none here).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diagnostics: Option<parvi_infer::Diagnostics>,
    /// Why the row is missing numbers, when the method failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Why a row that ran has no comparison: its folder holds no reference.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Wall seconds of the default path's phases (engines; NUTS reports none here).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase_seconds: Option<PhaseSeconds>,
    /// The phases the default path took (`parvi_infer::FitResult::path`; empty for NUTS).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub path: Vec<parvi_infer::Phase>,
}

/// Where a default-path row's wall time went.
#[derive(Debug, Serialize)]
pub struct PhaseSeconds {
    /// The preconditioner's searches (Laplace, Pathfinder).
    pub laplace: f64,
    /// The engine's run.
    pub run: f64,
    /// The stationarity check.
    pub check: f64,
    /// The polish step.
    pub polish: f64,
}

pub fn run(args: PosteriorDbArgs) -> Result<()> {
    let dirs = suite_dirs(&args.data_dir)?;
    let precondition = match args.precondition.as_str() {
        "laplace" => Precondition::Laplace,
        "pathfinder" => Precondition::Pathfinder,
        "none" => Precondition::None,
        other => bail!("invalid setting `--precondition`: `{other}` (expected laplace, pathfinder or none)"),
    };
    let posteriors: Vec<(String, PathBuf)> = if args.posterior == "all" {
        let mut all = Vec::new();
        for dir in &dirs {
            all.extend(posteriordb::folders(dir)?.into_iter().map(|folder| (folder_name(&folder), folder)));
        }
        all
    } else {
        args.posterior
            .split(',')
            .map(|p| Ok((p.trim().to_string(), posteriordb::resolve_in(p.trim(), &dirs)?)))
            .collect::<Result<_>>()?
    };
    let methods: Vec<String> = if args.method == "all" {
        MethodConfig::NAMES.iter().map(|m| m.to_string()).chain([NUTS_RS.to_string()]).collect()
    } else {
        args.method.split(',').map(|m| m.trim().to_string()).collect()
    };
    if !(args.check_level > 0.0 && args.check_level < 1.0) {
        bail!("invalid setting `--check-level`: must be in (0, 1), got {}", args.check_level);
    }
    if args.check_steps > 0 && args.check_steps < 4 {
        bail!(
            "invalid setting `--check-steps`: the check needs at least 4 MALA steps (0 turns it off), got {}",
            args.check_steps
        );
    }
    let options = parse_options(&args.opt)?;
    for m in methods.iter().filter(|m| *m != NUTS_RS) {
        method_config(m, &options)?;
    }
    let backend: BackendKind = args.backend.parse()?;
    let device = backend.device()?;

    println!(
        "{:<42} {:<17} {:>9} {:>9} {:>9} {:>9} {:>8} {:>10}  worst",
        "posterior", "method", "max|err|", "mean|err|", "max|sd-1|", "energy", "seconds", "evals"
    );
    let mut rows = Vec::new();
    let mut unloaded = Vec::new();
    for (name, folder) in posteriors {
        // A posterior whose model is unknown, or whose data or reference do not fit it, is a
        // failed row naming the cause; the other posteriors still run.
        let name = posteriordb::entry(&folder).map_or(name, |e| e.name);
        let loaded = posteriordb::load_folder(&folder, &device)
            .map_err(anyhow::Error::from)
            .and_then(|model| Ok((Reference::for_model(&model)?, model)));
        let (reference, model) = match loaded {
            Ok(loaded) => loaded,
            Err(e) => {
                println!("{name:<42} {:<17} failed: {e:#}", "-");
                rows.push(PosteriorDbRow::failed(&name, "-", &e));
                unloaded.push(name);
                continue;
            }
        };
        for method in &methods {
            let row = match run_one(&model, reference.as_ref(), method, &options, precondition, &args, &device) {
                Ok(row) => row,
                Err(e) => PosteriorDbRow::failed(&name, method, &e),
            };
            match (&row.error, &row.note) {
                (None, Some(note)) => println!(
                    "{:<42} {:<17} {:>9} {:>9} {:>9} {:>9} {:>8.1} {:>10}  {note}",
                    row.posterior, row.method, "-", "-", "-", "-", row.seconds, row.score_evals
                ),
                (None, None) => println!(
                    "{:<42} {:<17} {:>9.3} {:>9.3} {:>9.3} {:>9.4} {:>8.1} {:>10}  {}",
                    row.posterior,
                    row.method,
                    row.max_mean_error_sd,
                    row.mean_mean_error_sd,
                    row.max_sd_ratio_error,
                    row.distance,
                    row.seconds,
                    row.score_evals,
                    row.worst_parameter
                ),
                (Some(e), _) => println!("{:<42} {:<17} failed: {e}", row.posterior, row.method),
            }
            for w in row.diagnostics.iter().flat_map(|d| &d.warnings) {
                println!("    warning: {w}");
            }
            for phase in &row.path {
                println!("    {phase}");
            }
            rows.push(row);
        }
    }
    if let Some(path) = &args.json {
        write_atomic(path, &serde_json::to_vec_pretty(&rows)?)?;
    }
    // The others ran and their rows are printed (and written); the exit status still says that
    // some posteriors could not be run, each cause being in its row above.
    if !unloaded.is_empty() {
        bail!(
            "{} of the posteriors could not be loaded (see their rows above): {}",
            unloaded.len(),
            unloaded.join(", ")
        );
    }
    Ok(())
}

/// The suite folders: those of `--data-dir`, else `$PARVI_POSTERIORDB_DIR` and
/// `$PARVI_POSTERIORDB_MORE_DIR` (those set); each must be a folder.
fn suite_dirs(given: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let dirs: Vec<PathBuf> = if given.is_empty() {
        ["PARVI_POSTERIORDB_DIR", "PARVI_POSTERIORDB_MORE_DIR"]
            .iter()
            .filter_map(|var| std::env::var_os(var).filter(|v| !v.is_empty()).map(PathBuf::from))
            .collect()
    } else {
        given.to_vec()
    };
    if dirs.is_empty() {
        bail!(
            "missing setting `--data-dir` (a posteriordb suite's folder, repeatable; or set PARVI_POSTERIORDB_DIR \
             and PARVI_POSTERIORDB_MORE_DIR)"
        );
    }
    if let Some(dir) = dirs.iter().find(|d| !d.is_dir()) {
        bail!("invalid setting `--data-dir`: {} is not a folder", dir.display());
    }
    Ok(dirs)
}

/// A folder's last component, the posterior's name until its `posterior.json` says otherwise.
fn folder_name(folder: &std::path::Path) -> String {
    folder.file_name().map_or_else(|| folder.display().to_string(), |f| f.to_string_lossy().into_owned())
}

/// What a posterior is compared with: reference draws, or reference moments only (accel_gp and
/// the wider suite's posteriors of more than 300 scalars).
enum Reference {
    Draws(ReferenceDraws),
    Moments(ReferenceMoments),
}

impl Reference {
    /// The posterior's reference; `None` where its folder has neither `reference_draws.json` nor
    /// `reference_moments.json` (the wider suite's posteriors whose Stan run is still to come).
    fn for_model(model: &PosteriorDbModel) -> Result<Option<Self>> {
        let folder = model.folder();
        Ok(if folder.join("reference_draws.json").is_file() {
            Some(Reference::Draws(ReferenceDraws::for_model(model)?))
        } else if folder.join("reference_moments.json").is_file() {
            Some(Reference::Moments(ReferenceMoments::for_model(model)?))
        } else {
            None
        })
    }

    fn columns(&self) -> &[usize] {
        match self {
            Reference::Draws(r) => r.columns(),
            Reference::Moments(r) => r.columns(),
        }
    }

    fn names(&self) -> &[String] {
        match self {
            Reference::Draws(r) => r.names(),
            Reference::Moments(r) => r.names(),
        }
    }

    /// The comparison of the model's reported draws `[rows, width]` with the reference.
    fn compare(&self, reported: &[f64], width: usize, weights: Option<&[f64]>) -> Result<Comparison> {
        Ok(match self {
            Reference::Draws(r) => compare(r.values(), &r.select(reported, width), r.params(), weights)?,
            Reference::Moments(r) => compare_moments(r.mean(), r.sd(), &r.select(reported, width), weights)?,
        })
    }
}

impl PosteriorDbRow {
    fn failed(posterior: &str, method: &str, error: &anyhow::Error) -> Self {
        PosteriorDbRow {
            posterior: posterior.to_string(),
            method: method.to_string(),
            max_mean_error_sd: f64::NAN,
            mean_mean_error_sd: f64::NAN,
            max_sd_ratio_error: f64::NAN,
            distance: f64::NAN,
            seconds: f64::NAN,
            score_evals: 0,
            draws: 0,
            worst_parameter: String::new(),
            mean_error_sd: Vec::new(),
            sd_ratio: Vec::new(),
            diagnostics: None,
            error: Some(format!("{error:#}")),
            note: None,
            phase_seconds: None,
            path: Vec::new(),
        }
    }
}

fn run_one(
    model: &PosteriorDbModel,
    reference: Option<&Reference>,
    method: &str,
    options: &toml::Table,
    precondition: Precondition,
    args: &PosteriorDbArgs,
    device: &parvi_model::burn::tensor::Device,
) -> Result<PosteriorDbRow> {
    let started = Instant::now();
    let mut diagnostics = None;
    let mut phase_seconds = None;
    // The draws as the reference names them: reported quantities, and generated ones where the
    // reference holds some (surgical's `pop_mean`).
    let width = model.param_names().len();
    let generated = reference.is_some_and(|r| r.columns().iter().any(|&c| c >= width));
    let compared = |x: parvi_model::burn::tensor::Tensor<2>| -> Result<Vec<f64>> {
        Ok(to_vec_f64(&if generated { model.compared(x, args.seed)? } else { model.reported(x) }))
    };
    let mut path = Vec::new();
    let (reported, weights, score_evals) = if method == NUTS_RS {
        let dim = model.dim();
        let nuts = NutsConfig { tune: args.nuts_tune, draws: args.nuts_draws, seed: args.seed };
        // From the origin of the unconstrained space; where NUTS cannot start there (accel_gp:
        // its scale is 1e5 times off at the origin), from Stan's random inits, uniform(-2, 2),
        // seeded, at most 10 tries as Stan retries its inits.
        let mut inits = EngineRng::new(args.seed ^ 0x1417);
        let mut run = nuts_run(model, &vec![0.0; dim], nuts, device);
        for _ in 0..10 {
            if run.is_ok() {
                break;
            }
            let init: Vec<f64> = (0..dim).map(|_| 4.0 * inits.uniform() - 2.0).collect();
            run = nuts_run(model, &init, nuts, device);
        }
        let run = run.context("NUTS")?;
        let n = run.draws.len();
        let flat: Vec<f32> = run.draws.into_iter().flatten().map(|v| v as f32).collect();
        (compared(matrix_from_vec(flat, n, dim, device))?, None, run.gradient_evals as usize)
    } else {
        let kernel = super::method::kernel_from_name(&args.kernel, None)?;
        let spec = EngineSpec::new(method_config(method, options)?, kernel, AdapterConfig::adagrad(args.lr));
        let config = FitConfig {
            particles: args.particles,
            steps: args.steps,
            seed: args.seed,
            precondition,
            check_steps: args.check_steps,
            check_level: args.check_level,
            // One table row a posterior, not a bar each.
            progress: false,
            polish: super::fit::polish_config(
                args.polish,
                args.no_polish,
                args.polish_steps,
                args.polish_kernel.as_deref(),
            )?,
            ..Default::default()
        };
        // The polish step stops on the reported quantities' statistics, as the summary's.
        let reported = |x: parvi_model::burn::tensor::Tensor<2>| model.reported(x);
        let result = fit_reported(model, Some(&reported), &spec, &config, &mut [], device)?;
        let reported = compared(result.draws.positions.clone())?;
        let weights = result.draws.weights.as_ref().map(to_vec_f64);
        phase_seconds = Some(PhaseSeconds {
            laplace: result.laplace_seconds,
            run: result.seconds,
            check: result.diagnostics.stationarity.as_ref().map_or(0.0, |s| s.seconds),
            polish: result.diagnostics.polish.as_ref().map_or(0.0, |p| p.seconds),
        });
        diagnostics = Some(result.diagnostics);
        path = result.path;
        (reported, weights, result.density_evals)
    };
    let seconds = started.elapsed().as_secs_f64();
    let width = if generated { model.compared_names().len() } else { width };
    let draws = reported.len() / width.max(1);
    let Some(reference) = reference else {
        return Ok(PosteriorDbRow {
            seconds,
            score_evals,
            draws,
            diagnostics,
            phase_seconds,
            error: None,
            note: Some(format!(
                "no reference: {} holds neither reference_draws.json nor reference_moments.json",
                model.folder().display()
            )),
            ..PosteriorDbRow::failed(model.name(), method, &anyhow::anyhow!("no reference"))
        });
    };
    let comparison = reference
        .compare(&reported, width, weights.as_deref())
        .map_err(|e| anyhow::anyhow!("{}: comparing with the reference: {e:#}", model.name()))?;
    let params = reference.names().len();
    let summary = comparison.summary();
    let names = reference.names();
    let worst = (0..params)
        .max_by(|&a, &b| comparison.mean_error_sd[a].abs().total_cmp(&comparison.mean_error_sd[b].abs()))
        .map_or(String::new(), |j| names[j].clone());
    let named = |v: &[f64]| names.iter().cloned().zip(v.iter().copied()).collect::<Vec<_>>();
    Ok(PosteriorDbRow {
        posterior: model.name().to_string(),
        method: method.to_string(),
        max_mean_error_sd: summary.max_mean_error_sd,
        mean_mean_error_sd: summary.mean_mean_error_sd,
        max_sd_ratio_error: summary.max_sd_ratio_error,
        distance: summary.energy_distance,
        seconds,
        score_evals,
        draws,
        worst_parameter: worst,
        mean_error_sd: named(&comparison.mean_error_sd),
        sd_ratio: named(&comparison.sd_ratio),
        diagnostics,
        path,
        error: None,
        note: None,
        phase_seconds,
    })
}
