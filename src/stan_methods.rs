//! CmdStan's other methods on any [`StanModel`], as a model executable runs them
//! (`my_model optimize`, `pathfinder`, `generate_quantities`, `log_prob`), each a library call
//! whose result writes itself as the CSV CmdStan writes:
//!
//! - [`optimize`]: the posterior mode. By default (CmdStan's `jacobian=0`) the mode of the
//!   density of the constrained parameters, without the constraints' log-Jacobians; with
//!   `jacobian` the MAP in the unconstrained space. The search is the preconditioner's
//!   (`parvi_infer::core::Laplace`: batched Adam from several starts, then Newton's method with
//!   the Hessian of autodiff scores), which converges to the `f32` noise floor where CmdStan's
//!   L-BFGS stops at its relative tolerances, and leaves the Hessian [`laplace_sample`] needs.
//! - [`laplace_sample`]: draws from the normal approximation at the mode in the unconstrained
//!   space (CmdStan's `laplace`), with `log_p__` and `log_g__`.
//! - [`pathfinder_draws`]: multi-path Pathfinder's importance-resampled draws, with
//!   `lp_approx__` and `lp__` (CmdStan's `pathfinder`).
//! - [`generate_quantities`]: the transformed parameters and generated quantities of the
//!   parameter values of draws files (CmdStan's standalone `generate_quantities`); with the
//!   fit's seed they are the fit's own, exactly (see [`parvi_model::program::draw_stream`]).
//! - [`log_prob`]: the log density and its gradient with respect to the unconstrained
//!   parameters at given constrained values (CmdStan's `log_prob` method, BridgeStan's
//!   `log_density_gradient`), the Jacobian included by default.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::tensor::{Device, Tensor};
use parvi_infer::core::{Laplace, LaplaceConfig};
use parvi_infer::engines::pathfinder::{PathfinderConfig, pathfinder};
use parvi_infer::{EngineRng, InferError};
use parvi_model::program::{DrawRng, StanModel, draw_stream, stan_names};
use parvi_model::tensor_ops::{matrix_from_vec, to_vec_f64};
use parvi_model::{LogDensity, Minibatch, ModelError, score};
use parvi_models::cmdstan::{StanCsv, cmdstan_name, cmdstan_order, write_atomic};
use thiserror::Error;

/// What can go wrong in one of these methods: bad input (a parameter missing or misshaped in a
/// file, named with the file), the model, the search.
#[derive(Debug, Error)]
pub enum MethodError {
    /// An input file that does not fit the model, named with the parameter and element.
    #[error("{}: {reason}", file.display())]
    Input {
        /// The file.
        file: PathBuf,
        /// What is wrong, naming the parameter (and the element, 1-based).
        reason: String,
    },
    /// The model failed.
    #[error("model: {0}")]
    Model(#[from] ModelError),
    /// The search or the sampler failed.
    #[error(transparent)]
    Infer(#[from] InferError),
    /// A file could not be read or written.
    #[error(transparent)]
    Io(#[from] parvi_models::cmdstan::CmdStanError),
}

/// A table of values as CmdStan writes its non-sampling outputs: `# key = value` comments, a
/// header of CmdStan's names (`theta.1`), one row per line.
#[derive(Clone, Debug, PartialEq)]
pub struct StanTable {
    /// Comment lines, without the leading `# `.
    pub comments: Vec<String>,
    /// The header's column names, as written.
    pub columns: Vec<String>,
    /// Row-major `[rows, columns.len()]`.
    pub values: Vec<f64>,
}

impl StanTable {
    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.values.len() / self.columns.len().max(1)
    }

    /// Every value of column `name` (CmdStan's `theta.1` or Stan's `theta[1]`).
    pub fn column(&self, name: &str) -> Option<Vec<f64>> {
        let p = self.columns.len();
        let j = self.columns.iter().position(|c| c == name || *c == cmdstan_name(name))?;
        Some((0..self.rows()).map(|r| self.values[r * p + j]).collect())
    }

    /// The CSV text.
    pub fn to_csv(&self) -> String {
        let mut out = String::with_capacity(self.values.len() * 12 + 1024);
        for c in &self.comments {
            let _ = writeln!(out, "# {c}");
        }
        out.push_str(&self.columns.join(","));
        out.push('\n');
        for row in self.values.chunks(self.columns.len().max(1)) {
            for (j, v) in row.iter().enumerate() {
                if j > 0 {
                    out.push(',');
                }
                push_number(&mut out, *v);
            }
            out.push('\n');
        }
        out
    }

    /// Writes the CSV to `path` atomically.
    pub fn write(&self, path: &Path) -> Result<(), MethodError> {
        Ok(write_atomic(path, self.to_csv().as_bytes())?)
    }
}

/// `v` as CmdStan writes it: `nan`, `inf`, `-inf`, else the shortest text that reads back to
/// the same value (the same `f32` for a value that is one, as the model's values are).
fn push_number(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("nan");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "inf" } else { "-inf" });
    } else if f64::from(v as f32) == v {
        let _ = write!(out, "{}", v as f32);
    } else {
        let _ = write!(out, "{v}");
    }
}

/// The model's log density without the constraints' log-Jacobians: the density of the
/// constrained parameters, as CmdStan's `jacobian=0`, on the unconstrained coordinates.
pub struct WithoutJacobian<'a>(pub &'a dyn StanModel);

impl LogDensity for WithoutJacobian<'_> {
    fn dim(&self) -> usize {
        self.0.dim()
    }

    fn data_len(&self) -> Option<usize> {
        self.0.data_len()
    }

    fn log_prob(&self, particles: Tensor<2>, batch: Option<&Minibatch>) -> Tensor<1> {
        let log_jacobian = self.0.layout().unpack(particles.clone()).log_jacobian();
        self.0.log_prob(particles, batch) - log_jacobian
    }

    fn take_error(&self) -> Option<ModelError> {
        self.0.take_error()
    }
}

/// The density `jacobian` selects.
fn density<'a>(model: &'a dyn StanModel, without: &'a WithoutJacobian<'a>, jacobian: bool) -> &'a dyn LogDensity {
    if jacobian { model } else { without }
}

/// Every reported quantity of unconstrained draws `[n, dim]`: the constrained parameters,
/// transformed parameters and generated quantities, draw `i` of chain `chain` drawing from
/// [`draw_stream`]`(seed, chain, i)`. Stan's names and row-major values `[n, names.len()]`.
fn quantities(
    model: &dyn StanModel,
    unconstrained: Tensor<2>,
    seed: u64,
    chain: u64,
) -> Result<(Vec<String>, Vec<f64>), ModelError> {
    let constrained = model.layout().constrain(unconstrained);
    quantities_of_constrained(model, constrained, seed, chain, 0)
}

/// [`quantities`] of constrained parameter values; the streams of draws `first..first + n`.
fn quantities_of_constrained(
    model: &dyn StanModel,
    constrained: Tensor<2>,
    seed: u64,
    chain: u64,
    first: u64,
) -> Result<(Vec<String>, Vec<f64>), ModelError> {
    let n = constrained.dims()[0];
    let mut streams: Vec<DrawRng> = (0..n as u64).map(|i| draw_stream(seed, chain, first + i)).collect();
    let (transformed, generated) = model.quantities_at(constrained.clone(), &mut streams)?;
    let parts: Vec<Tensor<2>> = [constrained, transformed, generated].into_iter().filter(|t| t.dims()[1] > 0).collect();
    let values = to_vec_f64(&Tensor::cat(parts, 1));
    let names = model.names().iter().chain(model.generated_names()).cloned().collect();
    Ok((names, values))
}

/// A table of `leading` columns (`lp__`, ...; `[n, leading.len()]` row-major) then the model's
/// quantities in CmdStan's names and column order.
fn table(comments: Vec<String>, leading: &[&str], lead: &[f64], names: &[String], values: &[f64]) -> StanTable {
    let order = cmdstan_order(names);
    let (k, p) = (leading.len(), names.len());
    let rows = values.len() / p.max(1);
    let columns = leading.iter().map(|s| s.to_string()).chain(order.iter().map(|&j| cmdstan_name(&names[j]))).collect();
    let mut out = Vec::with_capacity(rows * (k + p));
    for r in 0..rows {
        out.extend_from_slice(&lead[r * k..(r + 1) * k]);
        out.extend(order.iter().map(|&j| values[r * p + j]));
    }
    StanTable { comments, columns, values: out }
}

/// Settings of [`optimize`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OptimizeConfig {
    /// The MAP in the unconstrained space (the constraints' log-Jacobians included); `false`
    /// (CmdStan's default, `jacobian=0`): the mode of the constrained parameters' density.
    pub jacobian: bool,
    /// Seed of the search's starts and of the generated quantities.
    pub seed: u64,
    /// The mode search (its starts, Adam's and Newton's steps).
    pub search: LaplaceConfig,
}

/// The posterior mode [`optimize`] found.
#[derive(Clone, Debug)]
pub struct Mode {
    /// The mode in the unconstrained coordinates, with the curvature there (the Laplace
    /// approximation's scale) and the search's record.
    pub laplace: Laplace,
    /// Whether the log-Jacobians were in the density maximised.
    pub jacobian: bool,
    /// The seed.
    pub seed: u64,
    /// The mode's quantities by Stan's names (parameters, transformed parameters, generated
    /// quantities drawn at the mode), with `lp__`, one row: CmdStan's optimize output.
    pub table: StanTable,
    /// Seconds the search took.
    pub seconds: f64,
    /// What the search warns of (a search that ran away, a Hessian that was not negative
    /// definite).
    pub warnings: Vec<String>,
}

/// The posterior mode of `model` (see the module's docs).
pub fn optimize(model: &dyn StanModel, config: &OptimizeConfig, device: &Device) -> Result<Mode, MethodError> {
    let started = Instant::now();
    let without = WithoutJacobian(model);
    let target = density(model, &without, config.jacobian);
    parvi_infer::core::progress::phase(&format!(
        "optimize: mode search ({} starts, Adam then Newton), {}",
        config.search.starts,
        if config.jacobian { "with the Jacobian (MAP in the unconstrained space)" } else { "without the Jacobian" }
    ));
    let mut rng = EngineRng::new(config.seed ^ 0x0971_3173);
    let laplace = Laplace::fit(target, &config.search, &mut rng, device)?;
    let mut warnings = Vec::new();
    if let Some(why) = laplace.runaway() {
        warnings.push(format!("the mode search ran away: {why}"));
    }
    if !laplace.full_rank {
        warnings.push(
            "the Hessian at the mode is not negative definite: the point may be a saddle or the density flat there"
                .into(),
        );
    }
    if laplace.newton_decrement > 1e-3 {
        warnings.push(format!(
            "the mode search did not converge: Newton's decrement is {:.3e} (above 1e-3)",
            laplace.newton_decrement
        ));
    }
    let x = matrix_from_vec(laplace.mode.iter().map(|&v| v as f32).collect(), 1, model.dim(), device);
    let (names, values) = quantities(model, x, config.seed, 1)?;
    let comments = vec![
        "method = optimize".to_string(),
        "  optimize".to_string(),
        "    algorithm = newton (parvi: batched Adam from several starts, then Newton)".to_string(),
        format!("    jacobian = {}", u8::from(config.jacobian)),
        "random".to_string(),
        format!("  seed = {}", config.seed),
    ];
    let table = table(comments, &["lp__"], &[laplace.log_prob], &names, &values);
    Ok(Mode {
        laplace,
        jacobian: config.jacobian,
        seed: config.seed,
        table,
        seconds: started.elapsed().as_secs_f64(),
        warnings,
    })
}

/// `draws` draws from the normal approximation `N(mode, (-H)^-1)` in the unconstrained space
/// (CmdStan's `laplace`), with `log_p__` (the model's log density at the draw, with the
/// Jacobian as the mode's search had it) and `log_g__` (the approximation's), then the draws'
/// quantities.
pub fn laplace_sample(
    model: &dyn StanModel,
    mode: &Mode,
    draws: usize,
    device: &Device,
) -> Result<StanTable, MethodError> {
    if draws == 0 {
        return Err(InferError::setting("laplace draws", "must be at least 1, got 0").into());
    }
    parvi_infer::core::progress::phase(&format!("laplace: {draws} draws from the normal approximation at the mode"));
    let d = model.dim();
    let (m, l) = (&mode.laplace.mode, &mode.laplace.scale);
    let mut rng = EngineRng::new(mode.seed ^ 0x1A91_ACE5);
    let log_det: f64 = (0..d).map(|i| l[i * d + i].abs().ln()).sum();
    let mut x = Vec::with_capacity(draws * d);
    let mut log_g = Vec::with_capacity(draws);
    for _ in 0..draws {
        let z: Vec<f64> = (0..d).map(|_| rng.normal()).collect();
        x.extend((0..d).map(|i| m[i] + (0..=i).map(|j| l[i * d + j] * z[j]).sum::<f64>()));
        log_g.push(
            -0.5 * (z.iter().map(|v| v * v).sum::<f64>() + d as f64 * (2.0 * std::f64::consts::PI).ln()) - log_det,
        );
    }
    let x = matrix_from_vec(x.iter().map(|&v| v as f32).collect(), draws, d, device);
    let without = WithoutJacobian(model);
    let log_p = to_vec_f64(&density(model, &without, mode.jacobian).log_prob(x.clone(), None));
    let (names, values) = quantities(model, x, mode.seed, 1)?;
    let lead: Vec<f64> = log_p.iter().zip(&log_g).flat_map(|(p, g)| [*p, *g]).collect();
    let comments = vec![
        "method = laplace".to_string(),
        "  laplace".to_string(),
        format!("    jacobian = {}", u8::from(mode.jacobian)),
        format!("    draws = {draws}"),
        "random".to_string(),
        format!("  seed = {}", mode.seed),
    ];
    Ok(table(comments, &["log_p__", "log_g__"], &lead, &names, &values))
}

/// Settings of [`pathfinder_draws`] (CmdStan's `pathfinder` defaults).
#[derive(Clone, Debug, PartialEq)]
pub struct PathfinderRun {
    /// The paths and their L-BFGS searches (`num_paths`, ...).
    pub config: PathfinderConfig,
    /// Draws returned, importance-resampled with replacement from the paths' pooled draws
    /// (CmdStan's `num_draws` with `psis_resample=1`).
    pub draws: usize,
    /// Seed of the starts, the approximations' draws, the resampling and the generated
    /// quantities.
    pub seed: u64,
}

impl Default for PathfinderRun {
    fn default() -> Self {
        Self { config: PathfinderConfig::default(), draws: 1000, seed: 0 }
    }
}

/// Multi-path Pathfinder's draws (see the module's docs) and its warnings (a k-hat above 0.7,
/// a path that ran away, paths that disagree).
pub fn pathfinder_draws(
    model: &dyn StanModel,
    run: &PathfinderRun,
    device: &Device,
) -> Result<(StanTable, Vec<String>), MethodError> {
    if run.draws == 0 {
        return Err(InferError::setting("pathfinder draws", "must be at least 1, got 0").into());
    }
    parvi_infer::core::progress::phase(&format!(
        "pathfinder: {} L-BFGS paths, {} draws each, {} resampled",
        run.config.paths, run.config.draws_per_path, run.draws
    ));
    let mut rng = EngineRng::new(run.seed ^ 0x9A7_4F1D);
    let fit = pathfinder(model, &run.config, &mut rng, device)?;
    let picks = fit.resample_picks(run.draws, true, &mut rng);
    let d = fit.dim;
    let rows: Vec<f32> = picks.iter().flat_map(|&i| fit.draws[i * d..(i + 1) * d].iter().map(|&v| v as f32)).collect();
    let x = matrix_from_vec(rows, run.draws, d, device);
    let lp = to_vec_f64(&model.log_prob(x.clone(), None));
    let (names, values) = quantities(model, x, run.seed, 1)?;
    let lead: Vec<f64> = picks.iter().zip(&lp).flat_map(|(&i, &p)| [fit.log_q[i], p]).collect();
    let comments = vec![
        "method = pathfinder".to_string(),
        "  pathfinder".to_string(),
        format!("    num_paths = {}", run.config.paths),
        format!("    history_size = {}", run.config.history),
        format!("    num_draws = {}", run.draws),
        format!("    num_elbo_draws = {}", run.config.elbo_draws),
        format!("    max_lbfgs_iters = {}", run.config.max_iters),
        "    psis_resample = 1".to_string(),
        format!("    pareto_k = {:.3}", fit.pareto_k),
        "random".to_string(),
        format!("  seed = {}", run.seed),
    ];
    let warnings = fit.problems(run.config.max_iters, f64::INFINITY);
    Ok((table(comments, &["lp_approx__", "lp__"], &lead, &names, &values), warnings))
}

/// The model's constrained parameter values of every row of a CmdStan CSV file, in layout order
/// (`[rows, constrained_dim]` row-major); a parameter column missing is an error naming it.
fn parameter_rows(model: &dyn StanModel, csv: &StanCsv, file: &Path) -> Result<Vec<f64>, MethodError> {
    let layout = model.layout();
    let mut columns = Vec::with_capacity(layout.constrained_dim());
    for block in layout.blocks() {
        for name in stan_names(&block.name, &block.shape) {
            let column = cmdstan_name(&name);
            let j = csv.header.iter().position(|h| *h == column).ok_or_else(|| MethodError::Input {
                file: file.to_path_buf(),
                reason: format!(
                    "parameter `{name}` (column `{column}`) is missing: the model's parameters block declares it"
                ),
            })?;
            columns.push(j);
        }
    }
    Ok(csv.rows.iter().flat_map(|row| columns.iter().map(|&j| row[j])).collect())
}

/// Settings of [`generate_quantities`].
#[derive(Clone, Debug, PartialEq)]
pub struct GqConfig {
    /// The seed of the generated quantities' streams; `None`: each file's own (its `seed = `
    /// comment, as parvi's fits write it), else 0.
    pub seed: Option<u64>,
}

/// The standalone generated quantities of the draws in `files` (CmdStan CSV, one chain each as
/// CmdStan writes them, or parvi's one file of several chains, `parvi_chains`): for each file a
/// table with its columns up to the parameters as read, then the transformed parameters and
/// generated quantities recomputed from the parameter values. Draw `s` of chain `c` draws from
/// [`draw_stream`]`(seed, c, s)`, as a fit's do; chain `c` is the file's `id` (or its place in
/// `files`). Every file is read and checked before any result is made.
pub fn generate_quantities(
    model: &dyn StanModel,
    files: &[PathBuf],
    config: &GqConfig,
    device: &Device,
) -> Result<Vec<StanTable>, MethodError> {
    let mut read = Vec::with_capacity(files.len());
    for file in files {
        let csv = StanCsv::read(file).map_err(|e| MethodError::Input { file: file.clone(), reason: e.to_string() })?;
        if csv.rows.is_empty() {
            return Err(MethodError::Input { file: file.clone(), reason: "no draws in the file".into() });
        }
        let params = parameter_rows(model, &csv, file)?;
        read.push((file, csv, params));
    }
    // The model's own columns are recomputed; every other column (lp__, a sampler's
    // diagnostics) is kept as read.
    let own: std::collections::HashSet<String> =
        model.names().iter().chain(model.generated_names()).map(|n| cmdstan_name(n)).collect();
    let constrained_dim = model.layout().constrained_dim();
    let mut tables = Vec::with_capacity(read.len());
    let mut next_chain = 1u64;
    for (k, (file, csv, params)) in read.into_iter().enumerate() {
        parvi_infer::core::progress::phase(&format!(
            "generate_quantities: {} ({} draws, file {} of {})",
            file.display(),
            csv.rows.len(),
            k + 1,
            files.len()
        ));
        let rows = csv.rows.len();
        let number = |key: &str| csv.config(key).and_then(|v| v.parse::<u64>().ok());
        let seed = config.seed.or_else(|| number("seed")).unwrap_or(0);
        // parvi's single file of several chains, chain after chain; else one chain.
        let chains = number("parvi_chains").filter(|&c| c > 1 && (rows as u64).is_multiple_of(c)).unwrap_or(1);
        let first_chain = number("id").unwrap_or(next_chain);
        next_chain = first_chain + chains;
        let per = rows / chains as usize;
        let mut names = Vec::new();
        let mut values = Vec::new();
        for c in 0..chains as usize {
            let block = &params[c * per * constrained_dim..(c + 1) * per * constrained_dim];
            let x = matrix_from_vec(block.iter().map(|&v| v as f32).collect(), per, constrained_dim, device);
            let (n, v) = quantities_of_constrained(model, x, seed, first_chain + c as u64, 0)?;
            names = n;
            values.extend(v);
        }
        let kept: Vec<usize> = (0..csv.header.len()).filter(|&j| !own.contains(&csv.header[j])).collect();
        let lead: Vec<f64> = csv.rows.iter().flat_map(|row| kept.iter().map(|&j| row[j])).collect();
        let leading: Vec<&str> = kept.iter().map(|&j| csv.header[j].as_str()).collect();
        let comments = vec![
            "method = generate_quantities".to_string(),
            "  generate_quantities".to_string(),
            format!("    fitted_params = {}", file.display()),
            format!("id = {first_chain}"),
            "random".to_string(),
            format!("  seed = {seed}"),
        ];
        tables.push(table(comments, &leading, &lead, &names, &values));
    }
    Ok(tables)
}

/// The log density and its gradient at each point of `params` (CmdStan's `log_prob`).
#[derive(Clone, Debug, PartialEq)]
pub struct LogProbs {
    /// `lp__` of each point.
    pub log_prob: Vec<f64>,
    /// The gradient with respect to the unconstrained parameters, row-major `[points, dim]`.
    pub gradient: Vec<f64>,
    /// The unconstrained points, row-major `[points, dim]`.
    pub unconstrained: Vec<f64>,
    /// The output: `lp__`, then `g_<name>` for every unconstrained coordinate (CmdStan's).
    pub table: StanTable,
}

/// Reads the constrained parameter values in `file`: a JSON object of Stan-format values (one
/// point: `{"mu": 1.5, "eta": [..], "L": [[..], ..]}`) or a CmdStan CSV of draws (a point per
/// row), named by the file's extension (`.csv`, else JSON). Returns `[points, constrained_dim]`
/// row-major; a parameter missing or of the wrong shape is an error naming it.
pub fn read_params(model: &dyn StanModel, file: &Path) -> Result<Vec<f64>, MethodError> {
    let input = |reason: String| MethodError::Input { file: file.to_path_buf(), reason };
    if file.extension().is_some_and(|e| e.eq_ignore_ascii_case("csv")) {
        let csv = StanCsv::read(file).map_err(|e| input(e.to_string()))?;
        if csv.rows.is_empty() {
            return Err(input("no draws in the file".into()));
        }
        return parameter_rows(model, &csv, file);
    }
    let text = std::fs::read_to_string(file).map_err(|e| input(format!("cannot read it: {e}")))?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| input(format!("not valid JSON (line {}, column {}): {e}", e.line(), e.column())))?;
    let object = value.as_object().ok_or_else(|| input("expected a JSON object of parameter values".into()))?;
    let mut out = Vec::with_capacity(model.layout().constrained_dim());
    for block in model.layout().blocks() {
        let v = object.get(&block.name).ok_or_else(|| {
            input(format!("parameter `{}` is missing: the model's parameters block declares it", block.name))
        })?;
        let mut flat = Vec::with_capacity(block.size());
        flatten(v, &block.shape, &mut Vec::new(), &mut flat)
            .map_err(|reason| input(format!("parameter `{}`{reason}", block.name)))?;
        out.extend(flat);
    }
    Ok(out)
}

/// Flattens a Stan JSON value of shape `shape` row-major into `out`; the error names the
/// element (1-based, as Stan prints it) and what is wrong.
fn flatten(value: &serde_json::Value, shape: &[usize], at: &mut Vec<usize>, out: &mut Vec<f64>) -> Result<(), String> {
    let element = |at: &[usize]| {
        if at.is_empty() {
            String::new()
        } else {
            format!(", element [{}]", at.iter().map(ToString::to_string).collect::<Vec<_>>().join(","))
        }
    };
    match shape.split_first() {
        None => {
            let v = match value {
                serde_json::Value::Number(n) => n.as_f64(),
                serde_json::Value::String(s) => match s.as_str() {
                    "NaN" => Some(f64::NAN),
                    "Inf" | "Infinity" | "+Inf" | "+Infinity" => Some(f64::INFINITY),
                    "-Inf" | "-Infinity" => Some(f64::NEG_INFINITY),
                    _ => None,
                },
                // A one-element array stands for a scalar, as Stan's JSON reader allows.
                serde_json::Value::Array(a) if a.len() == 1 => return flatten(&a[0], shape, at, out),
                _ => None,
            };
            out.push(v.ok_or_else(|| format!("{}: expected a number, found {value}", element(at)))?);
            Ok(())
        }
        Some((&len, rest)) => {
            let items = value
                .as_array()
                .ok_or_else(|| format!("{}: expected an array of {len}, found {value}", element(at)))?;
            if items.len() != len {
                return Err(format!("{}: expected an array of {len} values, found {}", element(at), items.len()));
            }
            for (i, item) in items.iter().enumerate() {
                at.push(i + 1);
                flatten(item, rest, at, out)?;
                at.pop();
            }
            Ok(())
        }
    }
}

/// CmdStan's names of the unconstrained coordinates: a block whose free width is its size takes
/// its elements' names, another (a simplex, a Cholesky factor) `name.1`, ... `name.k`.
pub fn unconstrained_names(model: &dyn StanModel) -> Vec<String> {
    model
        .layout()
        .blocks()
        .iter()
        .flat_map(|b| {
            if b.free_size() == b.size() {
                stan_names(&b.name, &b.shape).iter().map(|n| cmdstan_name(n)).collect::<Vec<_>>()
            } else {
                (1..=b.free_size()).map(|k| format!("{}.{k}", b.name)).collect()
            }
        })
        .collect()
}

/// The log density (with the Jacobian where `jacobian`, CmdStan's default) and its gradient
/// with respect to the unconstrained parameters at the constrained values in `file`
/// ([`read_params`]); a value outside its parameter's support is an error naming it.
pub fn log_prob(model: &dyn StanModel, file: &Path, jacobian: bool, device: &Device) -> Result<LogProbs, MethodError> {
    let constrained = read_params(model, file)?;
    let layout = model.layout();
    let (width, d) = (layout.constrained_dim(), model.dim());
    let points = constrained.len() / width.max(1);
    let mut unconstrained = Vec::with_capacity(points * d);
    for (i, row) in constrained.chunks(width.max(1)).enumerate() {
        let x = layout.unconstrain(row).map_err(|e| MethodError::Input {
            file: file.to_path_buf(),
            reason: if points > 1 { format!("draw {}: {e}", i + 1) } else { e.to_string() },
        })?;
        unconstrained.extend(x);
    }
    let x = matrix_from_vec(unconstrained.iter().map(|&v| v as f32).collect(), points, d, device);
    let without = WithoutJacobian(model);
    let s = score(density(model, &without, jacobian), x, None)?;
    let (lp, grad) = (to_vec_f64(&s.log_prob), to_vec_f64(&s.grad));
    let columns: Vec<String> = std::iter::once("lp__".to_string())
        .chain(unconstrained_names(model).iter().map(|n| format!("g_{n}")))
        .collect();
    let mut values = Vec::with_capacity(points * (d + 1));
    for i in 0..points {
        values.push(lp[i]);
        values.extend_from_slice(&grad[i * d..(i + 1) * d]);
    }
    let comments = vec![
        "method = log_prob".to_string(),
        "  log_prob".to_string(),
        format!("    jacobian = {}", u8::from(jacobian)),
        format!("    constrained_params = {}", file.display()),
    ];
    let table = StanTable { comments, columns, values };
    Ok(LogProbs { log_prob: lp, gradient: grad, unconstrained, table })
}
