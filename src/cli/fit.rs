//! `parvi fit`: run an engine on a built-in target or a posteriordb-style posterior and write
//! the draws in CmdStan's CSV format, a `stansummary`-style summary, the particles and (for a
//! 2-D target) a plot.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;
use parvi_infer::CheckpointPolicy;
use parvi_infer::evaluation::Summary;
use parvi_infer::samplers::PolishWhen;
use parvi_infer::{FitConfig, MethodConfig, Particles, Precondition, RunError, RunLabel, core::Checkpoint};
use parvi_model::program::StanModel;
use parvi_model::{BackendKind, LogDensity};
use parvi_models::cmdstan::{self, RunInfo};
use parvi_models::posteriordb::{self, PosteriorDbModel};
use parvi_models::{BUILTIN_TARGETS, BuiltinTarget, builtin_target};
use serde::{Deserialize, Serialize};

use super::distributed::{Group, communication_ms_per_step, is_lead, launch, parse_shard};
use super::method::{adapter_from_name, engine_spec, parse_options};
use super::{plot, read_config, write_atomic};
use parvi_infer::core::shard::ShardBy;

/// Settings of `parvi fit`: the target (a built-in density or a posteriordb posterior) and the
/// settings every fit shares with a model executable's ([`FitCommon`]). Every flag may also come
/// from a TOML file given by `--config` (same names, kebab-case); flags on the command line win
/// over the file.
#[derive(Args, Debug, Default, Clone)]
pub struct FitArgs {
    /// Target: a built-in density (gaussian: correlated 2-D; mixture: two 2-D modes; banana),
    /// or with `--data` a posteriordb model.
    #[arg(long, help = model_help())]
    pub model: Option<String>,
    /// A posteriordb-style posterior folder: its `posterior.json` names a known model and its
    /// `data.json` holds the data (instead of `--model`).
    #[arg(long, value_name = "DIR")]
    pub posterior: Option<PathBuf>,
    /// A Stan-format JSON data file for the posteriordb model named by `--model`.
    #[arg(long, value_name = "FILE.json")]
    pub data: Option<PathBuf>,
    /// The settings of the run.
    #[command(flatten)]
    pub common: FitCommon,
}

/// The settings of a fit that `parvi fit` and a model executable's `fit` share: the method, the
/// run, the polish step, the output.
#[derive(Args, Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FitCommon {
    /// TOML file with any of the settings below.
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Particle method [default: svgd].
    #[arg(long, help = method_help())]
    pub method: Option<String>,
    /// Number of particles [default: 100].
    #[arg(long)]
    pub particles: Option<usize>,
    /// Number of steps, at most: where the polish step follows (the default), the run stops
    /// earlier once its particles have settled (their means and sds moved less than 0.1 sd over
    /// 200 steps), unless --all-steps [default: 2000, the library's `DEFAULT_STEPS`].
    #[arg(long)]
    pub steps: Option<usize>,
    /// Run every one of --steps, even once the particles have settled (FitConfig::settle = None).
    #[arg(long)]
    #[serde(default)]
    pub all_steps: bool,
    /// Seed of every random choice (initial particles, minibatches, engine noise) [default: 0].
    #[arg(long)]
    pub seed: Option<u64>,
    /// ndarray, flex or wgpu [default: flex, the faster CPU backend].
    #[arg(long)]
    pub backend: Option<String>,
    /// Step size of the adapter [default: 0.05].
    #[arg(long, allow_negative_numbers = true)]
    pub lr: Option<f64>,
    /// Step-size adapter: adagrad (with momentum, as Liu & Wang), adam, rmsprop or sgd [default: adagrad].
    #[arg(long)]
    pub adapter: Option<String>,
    /// Kernel: rbf, imq, or rbf-linear (the moment-matching kernel of Liu & Wang 2018: the RBF
    /// plus x^T y / d + 1, whose SVGD fixed points have a Gaussian's mean and covariance) [default: rbf].
    #[arg(long)]
    pub kernel: Option<String>,
    /// Fixed RBF bandwidth h in exp(-r^2 / (2 h^2)) [default: median heuristic].
    #[arg(long, allow_negative_numbers = true)]
    pub bandwidth: Option<f64>,
    /// Coordinates the engine works in: laplace (whitened by the Laplace approximation at the
    /// mode, the particles started from it), pathfinder (whitened by Pathfinder's
    /// importance-weighted moments, the particles from its draws) or none (the model's own,
    /// particles from N(0, init-std^2)); a search that ran away falls back to the other, then to
    /// none, with a warning [default: laplace].
    #[arg(long)]
    pub precondition: Option<String>,
    /// Standard deviation of the initial particles, around 0 in the engine's coordinates
    /// (whitened: 1 is the Laplace approximation's spread) [default: 1].
    #[arg(long, allow_negative_numbers = true)]
    pub init_std: Option<f64>,
    /// Write OUT/checkpoint.json every K steps.
    #[arg(long, value_name = "K")]
    pub checkpoint_every: Option<usize>,
    /// Continue from a checkpoint written by an earlier run with the same settings.
    #[arg(long, value_name = "FILE")]
    pub resume: Option<PathBuf>,
    /// A method option, e.g. `--opt subset=10` (repeatable; see the method's docs).
    #[arg(long = "opt", value_name = "KEY=VALUE")]
    #[serde(skip)]
    pub opt: Vec<String>,
    /// Method options from the config file's `[options]` table (`--opt` wins per key).
    #[arg(skip)]
    pub options: Option<toml::Table>,
    /// Output directory (created if missing).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Draws kept of MCMC chains (a sampler's, the polish step's), in all: each chain thinned
    /// evenly (every k-th draw, counted back from its last), every chain kept, at least 4 draws a
    /// chain; a particle set is kept whole [default: 4000, Stan's 4 chains x 1000].
    #[arg(long, value_name = "N")]
    pub draws: Option<usize>,
    /// The draws files' name: PREFIX_1.csv, PREFIX_2.csv, ..., one per chain (more than 20
    /// chains grouped, whole chains to a file) [default: draws].
    #[arg(long, value_name = "PREFIX")]
    pub output_prefix: Option<String>,
    /// Hide the progress bar, and the phase and progress lines printed on stderr.
    #[arg(long)]
    #[serde(default)]
    pub quiet: bool,
    /// Polish every run (the default): continue the stationarity check's chains from a particle
    /// engine's final particles (MALA, adapted) until the rank-normalised split R-hat of
    /// every reported quantity and lp__ is <= 1.01 and its bulk ESS >= 400 (the summary's
    /// statistics), or --polish-steps, and return their draws instead of the particles.
    #[arg(long, conflicts_with = "no_polish")]
    #[serde(default)]
    pub polish: bool,
    /// Never polish: the answer is the engine's own even where the diagnostics flag it.
    #[arg(long)]
    #[serde(default)]
    pub no_polish: bool,
    /// The polish step's budget: gradients per chain after its warm-up (MALA steps, ChEES
    /// leapfrog steps) [default: 5000].
    #[arg(long)]
    pub polish_steps: Option<usize>,
    /// The polish step's kernel: `auto` (MALA, switching to autoMALA when one step size leaves
    /// chains stuck, and handing chains that have not mixed after 1000 steps, or whose R-hat
    /// projects more than 2000, to ChEES-HMC; NUTS
    /// takes over chains still far from mixed, where it mixes better), `chees` (ChEES-HMC from
    /// the start: batched HMC with one adapted, jittered trajectory; fewer gradients where MALA
    /// mixes slowly), `nuts` (Stan's NUTS, 4 chains x (1000 + 1000)), `mala` or `auto-mala`
    /// [default: auto].
    #[arg(long, value_name = "KERNEL")]
    pub polish_kernel: Option<String>,
    /// Share the particles among the processes of an MPI job (`mpirun -np K parvi fit ...
    /// --distributed`; needs the `mpi` feature): the same particles as one process, rank 0
    /// prints and writes.
    #[arg(long)]
    #[serde(default)]
    pub distributed: bool,
    /// With `--distributed`, what the ranks share: `particles` (the default). `rows` is refused
    /// here (fit's preconditioner searches the whole model in every process); `parvi bnn
    /// --shard rows` and the library's `RunConfig::rows` shard data rows.
    #[arg(long, value_parser = parse_shard)]
    pub shard: Option<ShardBy>,
}

/// `--model`'s help, naming every built-in target and posteriordb model from the models' own
/// tables.
fn model_help() -> String {
    format!(
        "Target, one of: {}; or with --data FILE.json a posteriordb model: {}",
        BUILTIN_TARGETS.join(", "),
        posteriordb::MODELS.join(", ")
    )
}

/// `--method`'s help, naming every method from the registry.
fn method_help() -> String {
    format!("Particle method, one of: {} [default: svgd]", MethodConfig::NAMES.join(", "))
}

impl FitArgs {
    /// Flags win over the config file. The file's `model`, `posterior` and `data` set the
    /// target; every other key is one of [`FitCommon`]'s, an unknown one refused by name.
    fn merged(self) -> Result<FitArgs> {
        let Some(path) = self.common.config.clone() else { return Ok(self) };
        let mut table: toml::Table = read_config(&path)?;
        let mut text = |key: &str| -> Result<Option<String>> {
            match table.remove(key) {
                None => Ok(None),
                Some(toml::Value::String(s)) => Ok(Some(s)),
                Some(other) => {
                    bail!("config file {}: `{key}` must be a string, found a {}", path.display(), other.type_str())
                }
            }
        };
        let (model, posterior, data) = (text("model")?, text("posterior")?, text("data")?);
        let file: FitCommon =
            toml::Value::Table(table).try_into().map_err(|e| anyhow::anyhow!("config file {}: {e}", path.display()))?;
        Ok(FitArgs {
            model: self.model.or(model),
            posterior: self.posterior.or(posterior.map(PathBuf::from)),
            data: self.data.or(data.map(PathBuf::from)),
            common: self.common.merged(file),
        })
    }
}

impl FitCommon {
    /// These settings over `file`'s (a config file's): flags win.
    fn merged(self, file: FitCommon) -> FitCommon {
        FitCommon {
            config: self.config,
            method: self.method.or(file.method),
            particles: self.particles.or(file.particles),
            steps: self.steps.or(file.steps),
            all_steps: self.all_steps || file.all_steps,
            seed: self.seed.or(file.seed),
            backend: self.backend.or(file.backend),
            lr: self.lr.or(file.lr),
            adapter: self.adapter.or(file.adapter),
            kernel: self.kernel.or(file.kernel),
            bandwidth: self.bandwidth.or(file.bandwidth),
            init_std: self.init_std.or(file.init_std),
            precondition: self.precondition.or(file.precondition),
            checkpoint_every: self.checkpoint_every.or(file.checkpoint_every),
            resume: self.resume.or(file.resume),
            opt: self.opt,
            options: file.options,
            out: self.out.or(file.out),
            draws: self.draws.or(file.draws),
            output_prefix: self.output_prefix.or(file.output_prefix),
            quiet: self.quiet || file.quiet,
            distributed: self.distributed || file.distributed,
            shard: self.shard.or(file.shard),
            polish: self.polish || (file.polish && !self.no_polish),
            no_polish: self.no_polish || (file.no_polish && !self.polish),
            polish_steps: self.polish_steps.or(file.polish_steps),
            polish_kernel: self.polish_kernel.or(file.polish_kernel),
        }
    }
}

/// What `fit` writes to `summary.json`.
#[derive(Debug, Serialize, Deserialize)]
pub struct FitSummary {
    pub method: String,
    pub model: String,
    pub backend: String,
    /// The particle engine's particles (absent for a sampler such as NUTS, which has chains:
    /// `sampler`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub particles: Option<usize>,
    /// Steps the particle run took (fewer than `max_steps` once it settled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<usize>,
    /// The step budget (`--steps`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<usize>,
    pub seed: u64,
    /// The shared step size, for methods that step with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr: Option<f64>,
    /// Wall seconds of the engine's run (a sampler's: warm-up and draws).
    pub seconds: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ms_per_step: Option<f64>,
    /// A sampler's record (NUTS): chains, warm-up, draws, metric, coordinates, and per chain the
    /// step size, divergences and tree-depth hits.
    #[serde(default)]
    pub sampler: Option<crate::workflow::SamplerRecord>,
    /// Each phase that ran with its steps and seconds.
    #[serde(default)]
    pub phases: Vec<crate::workflow::Phase>,
    /// The draws kept and the files that hold them.
    #[serde(default)]
    pub draws: Option<DrawsRecord>,
    pub posterior_mean: Vec<f64>,
    /// Row-major `dim x dim`.
    pub posterior_cov: Vec<f64>,
    pub true_mean: Vec<f64>,
    pub true_cov: Vec<f64>,
    pub engine: serde_json::Value,
    /// A particle engine's stationarity check (MALA chains from the final particles); absent
    /// for MCMC engines and targets without a gradient.
    #[serde(default)]
    pub stationarity: Option<parvi_infer::evaluation::Stationarity>,
    /// The polish step (its kernel, steps, final R-hat and ESS, seconds); absent where it did
    /// not run.
    #[serde(default)]
    pub polish: Option<parvi_infer::samplers::Polish>,
    /// Convergence warnings (empty when the diagnostics passed).
    pub warnings: Vec<String>,
    /// The phases the run took (`parvi_infer::FitResult::path`): what each did, what came of it,
    /// its cost, and what was found wrong with its output.
    #[serde(default)]
    pub path: Vec<parvi_infer::Phase>,
    /// What the samplers did that is no warning about the draws (proposals rejected for a
    /// failed evaluation), printed as `note:` lines.
    #[serde(default)]
    pub notes: Vec<String>,
    /// Processes that shared the particles (1 without `--distributed`).
    #[serde(default)]
    pub ranks: Option<usize>,
    /// Of `ms_per_step`, the time rank 0 spent in the all-gathers (waiting for the slowest
    /// rank included); `None` without `--distributed`.
    #[serde(default)]
    pub communication_ms_per_step: Option<f64>,
    /// PSIS-LOO of the draws, when the model generates a pointwise `log_lik`.
    #[serde(default)]
    pub loo: Option<parvi_infer::evaluation::Loo>,
}

/// The draws a fit kept and wrote, and what it cost.
#[derive(Debug, Serialize, Deserialize)]
pub struct DrawsRecord {
    /// Draws kept (in the files and the summary).
    pub kept: usize,
    /// Draws the fit returned (for the polish step: the ones its convergence rule counted).
    pub counted: usize,
    /// Every this many of a chain's draws kept.
    pub thin: usize,
    /// The draws files, in order.
    pub files: Vec<String>,
    /// The sampler's chains in each file.
    pub chains_in_file: usize,
    /// Draws in each file.
    pub draws_per_file: usize,
    /// Seconds to report the draws on the constrained scale (with the generated quantities).
    pub report_seconds: f64,
    /// Seconds to summarise them.
    pub summary_seconds: f64,
    /// Seconds to write the draws files.
    pub write_seconds: f64,
}

pub fn run(args: FitArgs) -> Result<()> {
    run_for(args, None)
}

/// `fit` for a built-in or posteriordb target, or (`user`) for a user's own model.
pub(crate) fn run_for(args: FitArgs, user: Option<&UserModel<'_>>) -> Result<()> {
    let args = args.merged()?;
    let distributed = args.common.distributed;
    launch(distributed, |group| run_with(args, group, user))
}

/// What `parvi fit` runs on: a built-in 2-D target or a posteriordb posterior.
enum Target {
    Builtin(BuiltinTarget),
    Posterior {
        model: Box<PosteriorDbModel>,
        data: PathBuf,
    },
    /// A user's own model, built by their executable from `--data` ([`super::model::run`]).
    User {
        name: String,
        model: Box<dyn StanModel>,
        data: Option<PathBuf>,
    },
}

impl Target {
    /// From `--posterior DIR`, `--model NAME --data FILE.json` or `--model NAME` (a built-in).
    fn resolve(
        args: &FitArgs,
        device: &parvi_model::burn::tensor::Device,
        user: Option<&UserModel<'_>>,
    ) -> Result<Self> {
        if let Some(user) = user {
            return Self::user(args, device, user);
        }
        let builtins = BUILTIN_TARGETS.join(", ");
        match (&args.posterior, &args.model, &args.data) {
            (Some(dir), None, None) => {
                let model = posteriordb::load_folder(dir, device)?;
                Ok(Target::Posterior { model: Box::new(model), data: dir.join("data.json") })
            }
            (Some(_), _, _) => {
                bail!("`--posterior DIR` names the model and its data itself: give it without `--model` and `--data`")
            }
            (None, Some(name), Some(data)) => {
                let model = posteriordb::load_data_file(name, data, device)?;
                Ok(Target::Posterior { model: Box::new(model), data: data.clone() })
            }
            (None, None, Some(_)) => {
                bail!("`--data FILE.json` needs `--model NAME`, one of: {}", posteriordb::MODELS.join(", "))
            }
            (None, Some(name), None) if posteriordb::MODELS.contains(&name.as_str()) => bail!(
                "model `{name}` is a posteriordb model: give its data with `--data FILE.json` (or a posterior folder with `--posterior DIR`)"
            ),
            (None, Some(name), None) if !BUILTIN_TARGETS.contains(&name.as_str()) => bail!(
                "unknown model `{name}`: the built-in targets are {builtins}; with `--data FILE.json` the posteriordb models {}",
                posteriordb::MODELS.join(", ")
            ),
            (None, Some(name), None) => Ok(Target::Builtin(builtin_target(name, device)?)),
            (None, None, None) => {
                bail!("missing setting `--model` (one of: {builtins}) or `--posterior DIR`")
            }
        }
    }

    /// A user's executable: its model from `--data FILE.json` (no file: a model without data).
    fn user(args: &FitArgs, device: &parvi_model::burn::tensor::Device, user: &UserModel<'_>) -> Result<Self> {
        let name = user.name.to_string();
        for (given, flag) in [(args.model.is_some(), "--model"), (args.posterior.is_some(), "--posterior")] {
            if given {
                bail!(
                    "invalid setting `{flag}`: this executable fits model `{name}`; give its data with `--data FILE.json`"
                );
            }
        }
        let model = super::model::build_model(user, args.data.as_deref(), device)?;
        Ok(Target::User { name, model, data: args.data.clone() })
    }

    fn density(&self) -> &dyn LogDensity {
        match self {
            Target::Builtin(t) => t.density.as_ref(),
            Target::Posterior { model, .. } => model.as_ref(),
            Target::User { model, .. } => model.as_ref(),
        }
    }

    /// The model as the workflow sees it (names, generated quantities), for all but the
    /// built-in 2-D targets.
    fn stan_model(&self) -> Option<&dyn StanModel> {
        match self {
            Target::Builtin(_) => None,
            Target::Posterior { model, .. } => Some(model.as_ref()),
            Target::User { model, .. } => Some(model.as_ref()),
        }
    }

    fn name(&self) -> String {
        match self {
            Target::Builtin(t) => t.name.to_string(),
            Target::Posterior { model, .. } => model.name().to_string(),
            Target::User { name, .. } => name.clone(),
        }
    }
}

/// A user's model as their executable hands it to `fit` ([`super::model::run`]): its name and
/// how to build it from Stan data on a device.
pub struct UserModel<'a> {
    /// The model's name (in the files and messages).
    pub name: &'a str,
    /// Builds the model from the data file's fields.
    pub build: &'a super::model::BuildFn,
}

/// Makes `out` (and its parents) and checks that a file can be created in it, before the run:
/// an output directory that cannot be written is refused by name with nothing written.
fn prepare_output(out: &Path) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("cannot create output directory {}", out.display()))?;
    tempfile::Builder::new()
        .prefix(".probe.tmp-")
        .tempfile_in(out)
        .with_context(|| format!("cannot write to output directory {}", out.display()))?;
    Ok(())
}

/// The run, in this process alone or as one rank of `collective`'s group.
fn run_with(args: FitArgs, collective: Group, user: Option<&UserModel<'_>>) -> Result<()> {
    // Rank 0 alone prints and writes; the state is replicated on every rank.
    let lead = is_lead(&collective);
    let Some(out) = args.common.out.clone() else { bail!("missing setting `--out DIR`") };
    let method = args.common.method.clone().unwrap_or_else(|| "svgd".into());
    let n = args.common.particles.unwrap_or(100);
    let steps = args.common.steps.unwrap_or(parvi_infer::DEFAULT_STEPS);
    let seed = args.common.seed.unwrap_or(0);
    let lr = args.common.lr.unwrap_or(0.05);
    let max_draws = args.common.draws.unwrap_or(crate::workflow::DEFAULT_DRAWS);
    if max_draws == 0 {
        bail!("invalid setting `--draws`: need at least one draw, got 0");
    }
    let prefix = args.common.output_prefix.clone().unwrap_or_else(|| "draws".into());
    if prefix.is_empty() || prefix.contains(['/', '\\']) || prefix.starts_with('.') {
        bail!(
            "invalid setting `--output-prefix`: `{prefix}` must be a file name without a folder (the files go in --out)"
        );
    }
    let init_std = args.common.init_std.unwrap_or(1.0);
    if !(init_std > 0.0 && init_std.is_finite()) {
        bail!("invalid setting `--init-std`: must be finite and > 0, got {init_std}");
    }
    let backend: BackendKind =
        args.common.backend.as_deref().map(str::parse).transpose()?.unwrap_or(BackendKind::DEFAULT);
    if n == 0 {
        bail!("invalid setting `--particles`: need at least one particle, got 0");
    }
    let kernel =
        super::method::kernel_from_name(args.common.kernel.as_deref().unwrap_or("rbf"), args.common.bandwidth)?;
    let adapter = adapter_from_name(args.common.adapter.as_deref().unwrap_or("adagrad"), lr)?;

    let device = backend.device()?;
    let target = Target::resolve(&args, &device, user)?;
    let model_name = target.name();
    if args.common.shard == Some(ShardBy::Rows) {
        match target.density().data_len() {
            None => bail!("invalid setting `--shard rows`: model `{model_name}` has no data rows to share"),
            Some(_) => bail!(
                "invalid setting `--shard rows`: `parvi fit` shares the particles only (its preconditioner \
                 searches the whole model in every process); shard the rows of a BNN or regression with \
                 `parvi bnn --shard rows`"
            ),
        }
    }
    let mut options = args.common.options.clone().unwrap_or_default();
    options.extend(parse_options(&args.common.opt)?);
    let spec = engine_spec(&method, &options, kernel, adapter)?;
    super::method::refuse_unused_lr(&method, Some(&spec.method), args.common.lr)?;
    // Built here too, so that bad options are refused before any output directory is made.
    spec.build()?;
    if args.common.checkpoint_every == Some(0) {
        bail!("invalid setting `--checkpoint-every`: must be >= 1, got 0");
    }
    let precondition = match args.common.precondition.as_deref().unwrap_or("laplace") {
        "laplace" => Precondition::Laplace,
        "pathfinder" => Precondition::Pathfinder,
        "none" => Precondition::None,
        other => bail!("invalid setting `--precondition`: `{other}` (expected laplace, pathfinder or none)"),
    };
    let density = target.density();
    if args.common.resume.is_none() {
        // Refused by name rather than ending in an allocation abort: the particles, their
        // scores, the step-size history and the update are each an n x dim matrix.
        parvi_infer::kernels::require_matrices_fit(
            "particles",
            n,
            "the particles and their updates",
            n,
            density.dim(),
            4,
        )?;
    }
    let resume = args.common.resume.as_deref().map(Checkpoint::load).transpose()?;
    let polish = polish_config(
        args.common.polish,
        args.common.no_polish,
        args.common.polish_steps,
        args.common.polish_kernel.as_deref(),
    )?;
    // Every rank makes the directory (as before: checkpoints go there); the lead, which writes
    // the outputs, also checks that it can write there.
    if lead {
        prepare_output(&out)?;
    } else {
        std::fs::create_dir_all(&out).with_context(|| format!("cannot create output directory {}", out.display()))?;
    }
    let data_file = match &target {
        Target::Posterior { data, .. } => Some(data.display().to_string()),
        Target::User { data, .. } => data.as_ref().map(|d| d.display().to_string()),
        Target::Builtin(_) => None,
    };
    let config = FitConfig {
        particles: n,
        steps,
        seed,
        precondition,
        init_std,
        progress: !args.common.quiet && lead,
        collective: collective.clone(),
        checkpoint: args
            .common
            .checkpoint_every
            .map(|every| CheckpointPolicy { path: out.join("checkpoint.json"), every }),
        resume,
        // What the checkpoint belongs to: a resume with another model, preconditioner, method,
        // option or particle count is refused by name (the checkpoint holds the engine's
        // coordinates, which the preconditioner sets).
        label: RunLabel {
            model: match precondition {
                Precondition::Laplace => format!("{model_name} (whitened by its Laplace approximation)"),
                Precondition::Pathfinder => format!("{model_name} (whitened by its Pathfinder approximation)"),
                Precondition::None => model_name.clone(),
            },
            data: data_file.clone(),
            engine_options: serde_json::to_value(&spec)?,
            particles: Some(n),
        },
        polish,
        settle: if args.common.all_steps { None } else { FitConfig::default().settle },
        ..FitConfig::default()
    };
    // The polish step stops on the statistics the summary prints, of the reported quantities.
    let reported = |x: parvi_model::burn::tensor::Tensor<2>| match target.stan_model() {
        Some(model) => crate::workflow::reported_or_nan(model, x),
        None => x,
    };
    let result = match parvi_infer::fit_reported(density, Some(&reported), &spec, &config, &mut [], &device) {
        Ok(result) => result,
        Err(RunError::Diverged { step, cause, last_finite }) => {
            if lead {
                write_particles(&out.join("particles.csv"), &last_finite)?;
            }
            bail!(
                "diverged at step {step}: {cause}; the last finite particles are in {}",
                out.join("particles.csv").display()
            )
        }
        Err(e) => return Err(e.into()),
    };
    if !lead {
        return Ok(());
    }
    // What stands for the posterior: the polish step's draws, an MCMC engine's collected draws,
    // else the particles.
    let particles = &result.draws;
    // The particles file and plot show the particle set: the engine's own where the polish step's
    // draws (thousands of MALA states) stand for the posterior.
    let shown = if result.diagnostics.polish.is_some() { &result.particles } else { particles };
    let (diagnostics, report) = (&result.diagnostics, result.report.clone());
    let (true_mean, true_cov) = match &target {
        Target::Builtin(t) => (t.mean.clone(), t.cov.clone()),
        Target::Posterior { .. } | Target::User { .. } => (Vec::new(), Vec::new()),
    };
    let sampler = crate::workflow::sampler_record(&result, &spec);
    let is_sampler = sampler.is_some();
    let uses_lr = spec.method.config().uses_step_rule();
    let mut summary = FitSummary {
        method: method.clone(),
        model: model_name.clone(),
        backend: backend.name().into(),
        particles: (!is_sampler).then_some(shown.len()),
        steps: (!is_sampler).then_some(result.steps),
        max_steps: (!is_sampler).then_some(steps),
        seed,
        lr: (!is_sampler && uses_lr).then_some(lr),
        seconds: result.seconds,
        ms_per_step: (!is_sampler).then(|| result.ms_per_step()),
        sampler,
        phases: crate::workflow::phases(&result, &spec),
        draws: None,
        posterior_mean: particles.mean(),
        posterior_cov: particles.covariance(),
        true_mean,
        true_cov,
        engine: report,
        stationarity: diagnostics.stationarity.clone(),
        polish: diagnostics.polish.clone(),
        warnings: diagnostics.warnings.clone(),
        path: result.path.clone(),
        notes: diagnostics.notes.clone(),
        ranks: Some(collective.as_ref().map_or(1, |c| c.size())),
        communication_ms_per_step: communication_ms_per_step(&collective, result.steps_run),
        loo: None,
    };
    // The draws kept (MCMC chains thinned to about --draws) on the constrained scale under
    // Stan's names, and their summary: made before any file is written, so that a failure leaves
    // none behind.
    let reporting = std::time::Instant::now();
    let kept = crate::workflow::kept_draws(&result, max_draws);
    let draws = match target.stan_model() {
        // Parameters, transformed parameters and generated quantities (drawn with the run's
        // seed) under Stan's names.
        Some(model) => crate::workflow::kept_model_draws(model, &kept, seed)?,
        None => {
            let Target::Builtin(t) = &target else { unreachable!("every other target is a StanModel") };
            let draws =
                cmdstan::builtin_draws(t.density.as_ref(), kept.positions.clone(), kept.weights.clone(), kept.chains)?;
            let files = cmdstan::chain_files(draws.chains());
            draws.grouped(files)?
        }
    };
    let report_seconds = reporting.elapsed().as_secs_f64();
    let summarising = std::time::Instant::now();
    let mcmc = result.chains.is_some();
    let stats = crate::workflow::summarize(&draws, mcmc)?;
    let summary_seconds = summarising.elapsed().as_secs_f64();
    let mut run_info = crate::workflow::run_info(&result, &config, &spec, &draws, &kept);
    run_info.model = match &target {
        Target::Builtin(t) => t.name.to_string(),
        Target::Posterior { model, .. } => model.model_name().to_string(),
        Target::User { name, .. } => name.clone(),
    };
    run_info.posterior = match &target {
        Target::Posterior { model, .. } => Some(model.name().to_string()),
        Target::Builtin(_) | Target::User { .. } => None,
    };
    run_info.data_file = data_file;
    run_info.settings.extend(run_settings(&args, &spec, &result, backend, is_sampler, uses_lr.then_some(lr))?);
    let mut warnings = diagnostics.warnings.clone();
    if mcmc {
        warnings.extend(crate::workflow::summary_warnings(&stats, &diagnostics.warnings));
    }
    // PSIS-LOO from a generated `log_lik`, its k-hat warnings with the run's.
    if let Some(loo) = crate::workflow::loo_of(&draws, seed) {
        let loo = loo?;
        warnings.extend(loo.warnings.iter().map(|w| format!("PSIS-LOO: {w}")));
        summary.loo = Some(loo);
    }
    run_info.warnings = warnings.clone();
    summary.warnings = warnings.clone();
    let header = summary_header(&run_info, &draws, mcmc && draws.draws_per_chain() >= 4);
    if !args.common.quiet {
        eprintln!("parvi: writing {} draws to {}", draws.rows(), out.display());
    }
    let writing = std::time::Instant::now();
    let files = draws.write_files(&out, &prefix, &run_info)?;
    let write_seconds = writing.elapsed().as_secs_f64();
    let names: Vec<String> =
        files.iter().map(|f| f.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned())).collect();
    summary.draws = Some(DrawsRecord {
        kept: draws.rows(),
        counted: kept.counted,
        thin: kept.thin,
        files: names.clone(),
        chains_in_file: draws.chains_per_file(),
        draws_per_file: draws.draws_per_chain(),
        report_seconds,
        summary_seconds,
        write_seconds,
    });
    write_atomic(&out.join("summary.csv"), stats.to_csv().as_bytes())?;
    write_atomic(&out.join("summary.json"), &serde_json::to_vec_pretty(&summary)?)?;
    write_particles(&out.join("particles.csv"), shown)?;
    if let Target::Builtin(t) = &target {
        let (svg, title) = (out.join("particles.svg"), format!("{} on {}", method, t.name));
        match kernel_weights(&summary.engine) {
            // A multiple-kernel engine: its learned weights as bars beside the particles.
            Some((h, w)) => {
                plot::particles_with_kernel_weights(&svg, t.density.as_ref(), t.window, shown, &device, &title, &h, &w)?
            }
            None => plot::particles_over_density(&svg, t.density.as_ref(), t.window, shown, &device, &title)?,
        }
    }
    println!("{header}\n{}", stats.table());
    println!("{}", summary_footer(&stats));
    if !result.path.is_empty() {
        println!("\nThe path:");
        for phase in &result.path {
            println!("  {phase}");
        }
    }
    if let Some(loo) = &summary.loo {
        println!("\nPSIS-LOO from the generated log_lik (Vehtari, Gelman & Gabry 2017):\n{loo}");
    }
    for note in &diagnostics.notes {
        eprintln!("note: {note}");
    }
    for w in &warnings {
        eprintln!("warning: {w}");
    }
    let ranks = match (&collective, summary.communication_ms_per_step) {
        (Some(c), Some(comm)) => format!(" on {} ranks ({comm:.3} ms/step communicating)", c.size()),
        _ => String::new(),
    };
    let files = match names.as_slice() {
        [one] => one.clone(),
        [first, .., last] => format!("{first} ... {last}"),
        [] => String::new(),
    };
    println!(
        "{} on {} ({}){}: {}; kept {} draws; wrote {} ({files}, summary.csv, summary.json) in {:.3} s",
        method,
        model_name,
        backend,
        ranks,
        what_ran(&summary, &result),
        draws.rows(),
        out.display(),
        write_seconds
    );
    Ok(())
}

/// What ran, in a few words for the last line: a sampler's chains, warm-up and draws; a
/// particle engine's particles and steps, then the polish step's chains and steps.
fn what_ran(summary: &FitSummary, result: &parvi_infer::FitResult) -> String {
    if let Some(s) = &summary.sampler {
        let divergences: usize = s.divergences.iter().sum();
        return format!(
            "{} chains x ({} warm-up + {} draws), {:.3} s, {divergences} divergences",
            s.chains, s.warmup, s.draws_per_chain, s.seconds
        );
    }
    let mut text =
        format!("{} particles, {} steps, {:.3} ms/step", result.particles.len(), result.steps, result.ms_per_step());
    if let Some(p) = &result.diagnostics.polish {
        text.push_str(&format!("; polish: {}", p.describe()));
    }
    text
}

/// The settings of the `parvi` block that [`crate::workflow::run_info`] leaves to the command
/// line: the backend, and for a particle engine its configuration (kernel and step-size rule
/// where it uses them) and the polish step's switch. A sampler (`sampler`) has none of the
/// particle settings.
fn run_settings(
    args: &FitArgs,
    spec: &parvi_infer::EngineSpec,
    result: &parvi_infer::FitResult,
    backend: BackendKind,
    sampler: bool,
    lr: Option<f64>,
) -> Result<Vec<(String, String)>> {
    let mut settings = vec![("backend".to_string(), backend.name().to_string())];
    // The method's own configuration as one JSON line (no spaces: readers split `key = value`
    // on whitespace); the shared kernel and step-size rule only where the method uses them.
    let method = serde_json::to_string(&spec.method)?.replace(' ', "");
    if sampler {
        settings.push(("engine_config".to_string(), method));
        return Ok(settings);
    }
    if let Some(lr) = lr {
        settings.push(("lr".to_string(), lr.to_string()));
    }
    settings.push((
        "polish".to_string(),
        match (&result.diagnostics.polish, args.common.polish) {
            (None, _) if args.common.no_polish => "off".to_string(),
            (None, _) => "not run".to_string(),
            (Some(p), _) => format!("on,kernel={}", p.kernel.name()),
        },
    ));
    let config = if lr.is_some() { serde_json::to_string(spec)?.replace(' ', "") } else { method };
    settings.push(("engine_config".to_string(), config));
    Ok(settings)
}

/// The lines `stansummary` prints above its table: the model, the draws, the times.
fn summary_header(run: &RunInfo, draws: &cmdstan::Draws, mcmc: bool) -> String {
    let model = match &run.posterior {
        Some(p) => format!("{} (posterior {p})", run.model),
        None => run.model.clone(),
    };
    let what = if mcmc && draws.chains_per_file() > 1 {
        format!(
            "{} files of {} chains each ({} chains in all), each file with {} draws saved ({}); R-hat and ESS treat each file as one chain, as a reader of the files does.",
            draws.chains(),
            draws.chains_per_file(),
            draws.chains() * draws.chains_per_file(),
            draws.draws_per_chain(),
            run.draws_are
        )
    } else if mcmc {
        format!("{} chains: each with {} draws saved ({}).", draws.chains(), draws.draws_per_chain(), run.draws_are)
    } else if draws.weights().is_some() {
        format!(
            "{} weighted particles ({}; the summary uses the weights, the draws file resamples them with seed {}).",
            draws.rows(),
            run.draws_are,
            run.seed
        )
    } else {
        format!("{} particles ({}).", draws.rows(), run.draws_are)
    };
    format!(
        "Inference for model: {model}\n{what}\n\nPreconditioning took {:.3} seconds\nSampling took {:.3} seconds\n",
        run.warmup_seconds, run.sampling_seconds
    )
}

/// The lines `stansummary` prints under its table: what the columns mean.
fn summary_footer(stats: &Summary) -> String {
    let mut text = String::from(
        "Mean, StdDev and the quantiles are of the draws on the constrained scale; lp__ is the log density on the\nunconstrained scale with the Jacobian, up to a constant (Stan's convention).",
    );
    if stats.chains.is_some() {
        text.push_str(
            "\nESS_bulk and ESS_tail are effective sample sizes of the rank-normalised split chains, and R_hat the\nrank-normalised split R-hat (at convergence, R_hat <= 1.01); MCSE is the Monte Carlo standard error of the mean.",
        );
    } else {
        text.push_str(
            "\nA particle set is not a Markov chain: MCSE, ESS and R-hat do not apply (n/a); the run's diagnostics judge it.",
        );
    }
    text
}

/// The polish step's settings from `--polish` (every run, the default), `--no-polish` (none),
/// `--polish-steps` and `--polish-kernel`.
pub(crate) fn polish_config(
    polish: bool,
    no_polish: bool,
    steps: Option<usize>,
    kernel: Option<&str>,
) -> Result<Option<parvi_infer::samplers::PolishConfig>> {
    use parvi_infer::samplers::{PolishConfig, PolishKernel};
    if polish && no_polish {
        bail!("invalid settings `--polish` and `--no-polish`: give one of them");
    }
    if no_polish {
        for (given, flag) in [(steps.is_some(), "--polish-steps"), (kernel.is_some(), "--polish-kernel")] {
            if given {
                bail!("invalid setting `{flag}`: it sets the polish step, which `--no-polish` turns off");
            }
        }
        return Ok(None);
    }
    let default = PolishConfig::default();
    let kernel = match kernel {
        None => default.kernel,
        Some("auto") => PolishKernel::Auto,
        Some("mala") => PolishKernel::Mala,
        Some("auto-mala") => PolishKernel::AutoMala,
        Some("chees") => PolishKernel::Chees,
        Some("nuts") => PolishKernel::Nuts,
        Some(other) => {
            bail!("invalid setting `--polish-kernel`: `{other}` is not one of auto, chees, nuts, mala, auto-mala")
        }
    };
    Ok(Some(PolishConfig {
        when: if polish { PolishWhen::Always } else { default.when },
        steps: steps.unwrap_or(default.steps),
        kernel,
        ..default
    }))
}

/// The `bandwidths` and `weights` of an engine report that has both, of equal length.
fn kernel_weights(report: &serde_json::Value) -> Option<(Vec<f64>, Vec<f64>)> {
    let h: Vec<f64> = serde_json::from_value(report.get("bandwidths")?.clone()).ok()?;
    let w: Vec<f64> = serde_json::from_value(report.get("weights")?.clone()).ok()?;
    (h.len() == w.len() && !w.is_empty()).then_some((h, w))
}

/// Particles as CSV with a header `x0,x1,...` (and `weight` when weighted).
pub fn write_particles(path: &Path, particles: &Particles) -> Result<()> {
    let dim = particles.dim();
    let mut text: String = (0..dim).map(|i| format!("x{i}")).collect::<Vec<_>>().join(",");
    let weights = particles.weights.as_ref().map(parvi_model::tensor_ops::to_vec_f32);
    if weights.is_some() {
        text.push_str(",weight");
    }
    text.push('\n');
    for (i, row) in particles.to_rows().iter().enumerate() {
        let mut line = row.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(",");
        if let Some(w) = &weights {
            line.push_str(&format!(",{}", w[i]));
        }
        text.push_str(&line);
        text.push('\n');
    }
    write_atomic(path, text.as_bytes())
}
