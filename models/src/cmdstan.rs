//! Draws in CmdStan's CSV format, the file ArviZ (`from_cmdstan`), cmdstanpy (`from_csv`) and
//! R's `posterior`/`cmdstanr` read: comment lines (`# key = value`, nested by indentation) with
//! the method and its settings, a header `lp__,` then every quantity in CmdStan's flattened
//! naming (`theta.1`, a matrix `a.1.2` in column-major order), one row per draw, and the timing
//! block (`#  Elapsed Time: ...`) after the draws.
//!
//! What parvi chose where CmdStan has no convention (docs/cmdstan.md):
//! - `method = sample` with `algorithm = <parvi method>`: every draw set parvi writes stands for
//!   the posterior, as a sampler's does; the `parvi` block names the engine and its settings.
//! - One file per chain, `PREFIX_1.csv`, `PREFIX_2.csv`, ... (cmdstanpy's numbering; `draws`
//!   by default), each with its own `id`, as CmdStan writes them: a reader of the files
//!   (`az.from_cmdstan([...])`, `cmdstanpy.from_csv`) sees the chains. More chains than
//!   [`MAX_CHAIN_FILES`] (the default path's polish step runs up to 1000 short ones) are grouped,
//!   whole chains to a file and as many to each ([`chain_files`]): a file is then a superchain of
//!   nested R-hat (Margossian et al. 2022), and the summary parvi prints treats each file as the
//!   chain a reader sees, so its R-hat and ESS are the reader's. `chains_in_file` says how many.
//! - A particle set is one file, `PREFIX_1.csv`, its one "chain" the particles.
//! - A weighted particle set (MMD-FW, Stein points) is resampled to as many unweighted draws by
//!   systematic resampling with a recorded seed (the `resampling` block), so that every reader's
//!   means are the weighted set's up to the resampling's error; the weights themselves stay in
//!   [`Draws`] for a summary computed before resampling.
//! - `lp__` is the model's log density on the unconstrained scale with the log-Jacobian of every
//!   constraint, up to a constant: Stan's convention.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use burn::tensor::Tensor;
use parvi_model::LogDensity;
use parvi_model::tensor_ops::to_vec_f32;
use rand::{RngExt, SeedableRng};
use thiserror::Error;

use parvi_model::program::{DrawRng, StanModel, draw_stream};

use crate::posteriordb::PosteriorDbModel;

/// What went wrong building, writing or reading draws.
#[derive(Debug, Error)]
pub enum CmdStanError {
    /// The model could not report its quantities or generated quantities for the draws.
    #[error("model: {0}")]
    Model(String),
    /// Names, values, log densities or weights that do not fit together.
    #[error("draws: {0}")]
    Shape(String),
    /// A CSV file that does not follow CmdStan's rules.
    #[error("CmdStan CSV, line {line}: {reason}")]
    Parse {
        /// Line of the file (from 1).
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// A file's content is wrong (the file named, then the reason with its line).
    #[error("{}: {source}", path.display())]
    InFile {
        /// The file.
        path: PathBuf,
        /// What is wrong in it.
        source: Box<CmdStanError>,
    },
    /// A file could not be read or written.
    #[error("cannot {action} {}: {error}", path.display())]
    Io {
        /// `read` or `write`.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The operating system's reason.
        error: std::io::Error,
    },
}

/// Draws of a posterior on the constrained scale, named in Stan's style (`theta[1]`, `a[1,2]`),
/// with the log density of each and, for a weighted particle set, the weights.
///
/// Rows are chain-major: the draws of chain 1, then those of chain 2, ... (one chain for a
/// particle set).
#[derive(Clone, Debug, PartialEq)]
pub struct Draws {
    names: Vec<String>,
    values: Vec<f64>,
    lp: Vec<f64>,
    chains: usize,
    /// The sampler's chains in each of `chains` (more than 1 where chains were grouped into
    /// files: [`Draws::grouped`]).
    chains_per_file: usize,
    weights: Option<Vec<f64>>,
}

impl Draws {
    /// Draws from row-major `values` `[rows, names.len()]` (chain-major rows), their log
    /// densities `lp` `[rows]`, `chains` equal chains, and optional `weights` (non-negative,
    /// summing to a positive total; only for one chain).
    pub fn new(
        names: Vec<String>,
        values: Vec<f64>,
        lp: Vec<f64>,
        chains: usize,
        weights: Option<Vec<f64>>,
    ) -> Result<Self, CmdStanError> {
        let rows = lp.len();
        let shape = |reason: String| Err(CmdStanError::Shape(reason));
        if names.is_empty() {
            return shape("no quantities to write".into());
        }
        if values.len() != rows * names.len() {
            return shape(format!("{} values do not fill {rows} draws of {} quantities", values.len(), names.len()));
        }
        if rows == 0 || chains == 0 || !rows.is_multiple_of(chains) {
            return shape(format!("{rows} draws do not split into {chains} equal chains"));
        }
        if let Some(w) = &weights {
            if chains != 1 {
                return shape("weights are for one particle set, not for chains".into());
            }
            if w.len() != rows {
                return shape(format!("{} weights for {rows} draws", w.len()));
            }
            if let Some(bad) = w.iter().find(|v| !(v.is_finite() && **v >= 0.0)) {
                return shape(format!("weight {bad} is not a finite non-negative number"));
            }
            if w.iter().sum::<f64>() <= 0.0 {
                return shape("the weights sum to zero".into());
            }
        }
        if let Some(bad) = names.iter().find(|n| n.is_empty() || cmdstan_name(n).contains([',', '\n', '"', ' '])) {
            return shape(format!("name `{bad}` cannot be a CSV column"));
        }
        Ok(Self { names, values, lp, chains, chains_per_file: 1, weights })
    }

    /// Draws from tensors: the reported quantities `[rows, names.len()]`, the log densities
    /// `[rows]` and optional weights `[rows]`. With `chains = Some(k)` the rows are `k` MCMC
    /// chains stored snapshot-major (draw `s` of chain `c` in row `s * k + c`, the layout of an
    /// MCMC engine's draws and of the polish step's), reordered here chain after chain.
    pub fn from_tensors(
        names: Vec<String>,
        reported: Tensor<2>,
        lp: Tensor<1>,
        weights: Option<Tensor<1>>,
        chains: Option<usize>,
    ) -> Result<Self, CmdStanError> {
        let [rows, p] = reported.dims();
        if p != names.len() {
            return Err(CmdStanError::Shape(format!("{} names for {p} reported quantities", names.len())));
        }
        let values: Vec<f64> = to_vec_f32(&reported).into_iter().map(f64::from).collect();
        let lp: Vec<f64> = to_vec_f32(&lp).into_iter().map(f64::from).collect();
        let weights = weights.map(|w| to_vec_f32(&w).into_iter().map(f64::from).collect());
        let k = chains.unwrap_or(1);
        if k == 0 || rows % k != 0 || lp.len() != rows {
            return Err(CmdStanError::Shape(format!("{rows} draws do not split into {k} equal chains")));
        }
        let per = rows / k;
        // Snapshot-major to chain-major: row s * k + c moves to c * per + s.
        let order: Vec<usize> = (0..k).flat_map(|c| (0..per).map(move |s| s * k + c)).collect();
        let mut moved = Vec::with_capacity(rows * p);
        for &r in &order {
            moved.extend_from_slice(&values[r * p..(r + 1) * p]);
        }
        let values = moved;
        let lp = order.iter().map(|&r| lp[r]).collect();
        Self::new(names, values, lp, k, weights)
    }

    /// The draws of a posteriordb model from unconstrained `draws` `[rows, dim]` (a fit's
    /// `FitResult::draws`), with their weights and MCMC chain count (`FitResult::chains`):
    /// the reported quantities under Stan's names, and `lp__` from the model's log density.
    pub fn of_posterior(
        model: &PosteriorDbModel,
        draws: Tensor<2>,
        weights: Option<Tensor<1>>,
        chains: Option<usize>,
    ) -> Result<Self, CmdStanError> {
        let lp = model.log_prob(draws.clone(), None);
        Self::from_tensors(model.param_names(), model.reported(draws), lp, weights, chains)
    }

    /// The draws of any [`StanModel`] (a compiled `Program`, a posteriordb model, a user's own)
    /// from unconstrained `draws` `[rows, dim]` (a fit's `FitResult::draws`, with its weights
    /// and MCMC chain count `FitResult::chains`): its parameters and transformed parameters under
    /// Stan's names, then its generated quantities (CmdStan's column order), and `lp__` from its
    /// log density. The transformed parameters and generated quantities are computed from the
    /// constrained parameter values as written, draw `s` of chain `c` (snapshot-major row
    /// `s * chains + c`) drawing from [`draw_stream`]`(generated_seed, c + 1, s)`: the standalone
    /// generated quantities of the written draws reproduce them exactly.
    pub fn of_model(
        model: &dyn StanModel,
        draws: Tensor<2>,
        weights: Option<Tensor<1>>,
        chains: Option<usize>,
        generated_seed: u64,
    ) -> Result<Self, CmdStanError> {
        let quantity = |e: parvi_model::ModelError| CmdStanError::Model(e.to_string());
        let lp = model.log_prob(draws.clone(), None);
        let rows = draws.dims()[0];
        let k = chains.unwrap_or(1).max(1);
        let mut streams: Vec<DrawRng> =
            (0..rows).map(|r| draw_stream(generated_seed, (r % k) as u64 + 1, (r / k) as u64)).collect();
        let constrained = model.layout().constrain(draws);
        let (transformed, generated) = model.quantities_at(constrained.clone(), &mut streams).map_err(quantity)?;
        let names: Vec<String> = model.names().iter().chain(model.generated_names()).cloned().collect();
        let parts: Vec<Tensor<2>> =
            [constrained, transformed, generated].into_iter().filter(|t| t.dims()[1] > 0).collect();
        let reported = Tensor::cat(parts, 1);
        Self::from_tensors(names, reported, lp, weights, chains)
    }

    /// The quantities' names in Stan's style (`theta[1]`).
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Number of draws (rows).
    pub fn rows(&self) -> usize {
        self.lp.len()
    }

    /// Number of chains (1 for a particle set).
    pub fn chains(&self) -> usize {
        self.chains
    }

    /// Draws per chain (per file, where chains were grouped).
    pub fn draws_per_chain(&self) -> usize {
        self.rows() / self.chains
    }

    /// The sampler's chains in each chain of these draws: 1, or more where [`Draws::grouped`]
    /// put several whole chains in each file.
    pub fn chains_per_file(&self) -> usize {
        self.chains_per_file
    }

    /// The same draws with every `files`-th share of the chains as one chain (rows are
    /// chain-major, so a group is whole consecutive chains): the chains as the files hold them
    /// ([`chain_files`]), and as a reader of the files, ArviZ included, sees them.
    pub fn grouped(mut self, files: usize) -> Result<Self, CmdStanError> {
        if files == 0 || !self.chains.is_multiple_of(files) {
            return Err(CmdStanError::Shape(format!("{} chains do not group into {files} equal files", self.chains)));
        }
        self.chains_per_file *= self.chains / files;
        self.chains = files;
        Ok(self)
    }

    /// Row-major `[rows, names().len()]`.
    pub fn values(&self) -> &[f64] {
        &self.values
    }

    /// The log density of each draw (`lp__`).
    pub fn lp(&self) -> &[f64] {
        &self.lp
    }

    /// A weighted particle set's weights (as given, not normalised).
    pub fn weights(&self) -> Option<&[f64]> {
        self.weights.as_deref()
    }

    /// Every draw of quantity `name`, in Stan's (`theta[1]`) or CmdStan's (`theta.1`) naming;
    /// `lp__` gives the log densities.
    pub fn column(&self, name: &str) -> Option<Vec<f64>> {
        if name == "lp__" {
            return Some(self.lp.clone());
        }
        // Stan's name first, without a conversion a name.
        let j = self
            .names
            .iter()
            .position(|n| n == name)
            .or_else(|| self.names.iter().position(|n| cmdstan_name(n) == name))?;
        let p = self.names.len();
        Some((0..self.rows()).map(|r| self.values[r * p + j]).collect())
    }

    /// The same number of unweighted draws, by systematic resampling of a weighted set with a
    /// uniform offset from `seed` (each draw is copied `floor(n w_i)` or one more times, the
    /// lowest-variance unbiased scheme: Kitagawa 1996); unweighted draws come back unchanged.
    pub fn resampled(&self, seed: u64) -> Draws {
        let Some(w) = &self.weights else { return self.clone() };
        let n = w.len();
        let total: f64 = w.iter().sum();
        let mut rng = chacha20::ChaCha8Rng::seed_from_u64(seed);
        let offset: f64 = rng.random::<f64>();
        let p = self.names.len();
        let (mut values, mut lp) = (Vec::with_capacity(self.values.len()), Vec::with_capacity(n));
        let mut cumulative = 0.0;
        let mut i = 0;
        for k in 0..n {
            // The k-th pointer at (k + u) / n of the total weight.
            let target = (k as f64 + offset) / n as f64 * total;
            while i + 1 < n && cumulative + w[i] <= target {
                cumulative += w[i];
                i += 1;
            }
            values.extend_from_slice(&self.values[i * p..(i + 1) * p]);
            lp.push(self.lp[i]);
        }
        Draws { names: self.names.clone(), values, lp, chains: 1, chains_per_file: 1, weights: None }
    }

    /// The first file's CmdStan CSV text: all the draws of a particle set (weighted sets
    /// resampled with `run.seed`; see the module's docs) or the first chain's.
    pub fn to_csv(&self, run: &RunInfo) -> String {
        self.resampled(run.seed).file_csv(0, &self.weighed(run))
    }

    /// `run` with a weighted set's particle count and weights' ESS, for the `resampling` block.
    fn weighed(&self, run: &RunInfo) -> RunInfo {
        let mut run = run.clone();
        if let Some(w) = &self.weights {
            let total: f64 = w.iter().sum();
            run.weights = Some((w.len(), total * total / w.iter().map(|v| v * v).sum::<f64>()));
        }
        run
    }

    /// The CmdStan CSV text of chain `file` (0-based) of unweighted draws: its own header (`id`,
    /// `num_samples` of this chain), the run's record, the chain's own record
    /// (`run.chain_records[file]`: its step size and metric as CmdStan's adaptation lines), the
    /// draws in CmdStan's column order, and the timing block.
    fn file_csv(&self, file: usize, run: &RunInfo) -> String {
        let per = self.draws_per_chain();
        let p = self.names.len();
        // Some 12 characters a value: one allocation for the text, none a value.
        let mut out = String::with_capacity(4096 + per * (p + 1) * 12);
        let mut line = |indent: usize, text: &str| {
            let _ = writeln!(out, "# {}{text}", "  ".repeat(indent));
        };
        line(0, &format!("model = {}", run.model));
        if let Some(p) = &run.posterior {
            line(0, &format!("posterior = {p}"));
        }
        line(0, "method = sample");
        line(1, "sample");
        line(2, &format!("num_samples = {per}"));
        // The iterations before the saved draws (cmdstanpy refuses 0 with adaptation on).
        line(2, &format!("num_warmup = {}", run.warmup.max(1)));
        line(2, "save_warmup = false");
        line(2, &format!("thin = {}", run.thin.max(1)));
        if run.algorithm.is_empty() {
            line(2, &format!("algorithm = {}", run.method));
        }
        for (indent, text) in &run.algorithm {
            line(2 + indent, text);
        }
        line(2, &format!("num_chains = {}", self.chains));
        line(0, "parvi");
        line(1, &format!("parvi_version = {}", env!("CARGO_PKG_VERSION")));
        line(1, &format!("engine = {}", run.method));
        for (key, value) in &run.settings {
            line(1, &format!("{key} = {value}"));
        }
        line(1, &format!("draws_are = {}", run.draws_are));
        line(1, &format!("chains_in_file = {}", self.chains_per_file));
        line(1, &format!("draws_per_chain = {}", per / self.chains_per_file));
        let record = run.chain_records.get(file);
        if let Some(record) = record.filter(|r| !r.settings.is_empty()) {
            line(1, "chain");
            for (key, value) in &record.settings {
                line(2, &format!("{key} = {value}"));
            }
        }
        if let Some(w) = &run.weights {
            line(1, "resampling");
            line(2, "scheme = systematic");
            line(2, &format!("resampling_seed = {}", run.seed));
            line(2, &format!("weighted_particles = {}", w.0));
            line(2, &format!("weights_ess = {:.1}", w.1));
        }
        line(0, &format!("id = {}", file + 1));
        line(0, "data");
        line(1, &format!("file = {}", run.data_file.as_deref().unwrap_or("")));
        line(0, "random");
        line(1, &format!("seed = {}", run.seed));
        line(0, "output");
        line(1, &format!("file = {}", run.output_file.as_deref().unwrap_or("draws_1.csv")));
        // The header and the rows, in CmdStan's column order.
        let order = cmdstan_order(&self.names);
        out.push_str("lp__");
        for &j in &order {
            out.push(',');
            out.push_str(&cmdstan_name(&self.names[j]));
        }
        out.push('\n');
        // CmdStan's adaptation lines, between the header and the draws.
        if let Some(record) = record {
            if let Some(step) = record.step_size {
                out.push_str("# Adaptation terminated\n");
                let _ = writeln!(out, "# Step size = {step}");
            }
            if let Some(metric) = &record.inv_metric {
                out.push_str("# Diagonal elements of inverse mass matrix:\n# ");
                for (i, v) in metric.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    push_number(&mut out, *v);
                }
                out.push('\n');
            }
        }
        for r in file * per..(file + 1) * per {
            push_number(&mut out, self.lp[r]);
            let row = &self.values[r * p..(r + 1) * p];
            for &j in &order {
                out.push(',');
                push_number(&mut out, row[j]);
            }
            out.push('\n');
        }
        // CmdStan's timing block ends the draws (readers count the draws up to it).
        out.push_str("# \n");
        let _ = writeln!(out, "#  Elapsed Time: {:.3} seconds (Warm-up)", run.warmup_seconds);
        let _ = writeln!(out, "#                {:.3} seconds (Sampling)", run.sampling_seconds);
        let _ = writeln!(out, "#                {:.3} seconds (Total)", run.warmup_seconds + run.sampling_seconds);
        out.push_str("# \n");
        for w in &run.warnings {
            let _ = writeln!(out, "# warning: {}", w.replace('\n', " "));
        }
        out
    }

    /// Writes one CmdStan CSV file per chain, `dir/PREFIX_1.csv`, ..., each atomically (a
    /// temporary file beside it, renamed into place: an interrupted write leaves no partial file
    /// under the name), and returns their paths. A weighted set is resampled first (one file).
    /// Each file's comments name it (`output.file`).
    pub fn write_files(&self, dir: &Path, prefix: &str, run: &RunInfo) -> Result<Vec<PathBuf>, CmdStanError> {
        let draws = self.resampled(run.seed);
        let run = self.weighed(run);
        let paths: Vec<PathBuf> = (1..=draws.chains).map(|k| dir.join(format!("{prefix}_{k}.csv"))).collect();
        // The files are independent: formatted and written on every core, a share of the files
        // each (formatting the numbers is most of a large run's output time).
        let threads = std::thread::available_parallelism().map_or(1, usize::from).min(draws.chains).max(1);
        let write = |file: usize| {
            let run = RunInfo { output_file: Some(paths[file].display().to_string()), ..run.clone() };
            write_atomic(&paths[file], draws.file_csv(file, &run).as_bytes())
        };
        std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads)
                .map(|t| {
                    let write = &write;
                    scope.spawn(move || (t..draws.chains).step_by(threads).try_for_each(write))
                })
                .collect();
            workers.into_iter().try_for_each(|w| w.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
        })?;
        Ok(paths)
    }

    /// Writes the draws of a particle set or of one chain as one CmdStan CSV file at `path`,
    /// atomically; several chains are refused (they are several files: [`Draws::write_files`]).
    pub fn write_csv(&self, path: &Path, run: &RunInfo) -> Result<(), CmdStanError> {
        if self.chains > 1 {
            return Err(CmdStanError::Shape(format!(
                "{} chains are {} files, not one: write them with Draws::write_files",
                self.chains, self.chains
            )));
        }
        let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let name = path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let prefix = name.strip_suffix("_1.csv").unwrap_or(&name);
        if format!("{prefix}_1.csv") == name {
            self.write_files(dir, prefix, run).map(|_| ())
        } else {
            let run = RunInfo { output_file: Some(path.display().to_string()), ..self.weighed(run) };
            write_atomic(path, self.resampled(run.seed).file_csv(0, &run).as_bytes())
        }
    }

    /// The draws of CmdStan CSV files, one chain a file (as a reader of CmdStan's files takes
    /// them; a file parvi wrote with several chains in it, `chains_in_file`, stays one chain
    /// here, as ArviZ sees it): the quantities in the files' column order under Stan's names,
    /// `lp__` from its column, the sampler's other columns (`accept_stat__`, ...) left out.
    /// Every file must have the same header and as many draws; an error names the file.
    pub fn read_files<P: AsRef<Path>>(paths: &[P]) -> Result<Self, CmdStanError> {
        let Some(first) = paths.first() else {
            return Err(CmdStanError::Shape("no draws files given".into()));
        };
        let in_file = |path: &Path, reason: String| CmdStanError::InFile {
            path: path.to_path_buf(),
            source: Box::new(CmdStanError::Shape(reason)),
        };
        let csv = StanCsv::read(first.as_ref())?;
        let lp_at = csv
            .header
            .iter()
            .position(|h| h == "lp__")
            .ok_or_else(|| in_file(first.as_ref(), "no `lp__` column".into()))?;
        let kept: Vec<usize> = (0..csv.header.len()).filter(|&j| !csv.header[j].ends_with("__")).collect();
        let names: Vec<String> = kept.iter().map(|&j| stan_name(&csv.header[j])).collect();
        let per = csv.rows.len();
        let (mut values, mut lp) = (Vec::new(), Vec::new());
        let mut chains_per_file = csv.config("chains_in_file").and_then(|v| v.parse().ok()).unwrap_or(1);
        for (i, path) in paths.iter().enumerate() {
            let path = path.as_ref();
            let file = if i == 0 { csv.clone() } else { StanCsv::read(path)? };
            if file.header != csv.header {
                return Err(in_file(path, format!("its columns differ from those of {}", first.as_ref().display())));
            }
            if file.rows.len() != per || per == 0 {
                return Err(in_file(
                    path,
                    format!(
                        "{} draws, where {} has {per}: chains must be equally long",
                        file.rows.len(),
                        first.as_ref().display()
                    ),
                ));
            }
            let grouped: usize = file.config("chains_in_file").and_then(|v| v.parse().ok()).unwrap_or(1);
            if grouped != chains_per_file {
                chains_per_file = 1;
            }
            values.reserve(per * kept.len());
            for row in &file.rows {
                lp.push(row[lp_at]);
                values.extend(kept.iter().map(|&j| row[j]));
            }
        }
        let mut draws = Self::new(names, values, lp, paths.len(), None)?;
        draws.chains_per_file = chains_per_file;
        Ok(draws)
    }
}

/// The chain files `dir/PREFIX_1.csv`, `dir/PREFIX_2.csv`, ... that exist, in order (the
/// numbering stops at the first missing one); an error where there is none.
pub fn chain_file_paths(dir: &Path, prefix: &str) -> Result<Vec<PathBuf>, CmdStanError> {
    let paths: Vec<PathBuf> =
        (1..).map(|k| dir.join(format!("{prefix}_{k}.csv"))).take_while(|p| p.is_file()).collect();
    if paths.is_empty() {
        let path = dir.join(format!("{prefix}_1.csv"));
        return Err(CmdStanError::Io { action: "read", path, error: std::io::ErrorKind::NotFound.into() });
    }
    Ok(paths)
}

/// At most this many files for one run's chains: more are grouped ([`chain_files`]).
pub const MAX_CHAIN_FILES: usize = 20;

/// How many files `chains` chains go into: one a chain up to [`MAX_CHAIN_FILES`]; beyond, the
/// largest number of files from 4 to [`MAX_CHAIN_FILES`] that takes as many whole chains each
/// (readers want every file equally long), or one a chain where no such number divides them.
pub fn chain_files(chains: usize) -> usize {
    if chains <= MAX_CHAIN_FILES {
        return chains.max(1);
    }
    (4..=MAX_CHAIN_FILES).rev().find(|f| chains.is_multiple_of(*f)).unwrap_or(chains)
}

/// Which of a chain's `per_chain` draws to keep so that `chains` chains keep about `total` in
/// all: every `thin`-th, counted back from the chain's last draw, `thin` the smallest stride
/// that keeps at most `total` (plus at most one a chain) and at least 4 a chain where the chain
/// has them (split R-hat's least). Returns `(thin, indices)`, the indices ascending; `thin = 1`
/// (every draw) where the chains hold no more than `total`.
pub fn thinning(chains: usize, per_chain: usize, total: usize) -> (usize, Vec<usize>) {
    let available = chains * per_chain;
    let mut thin = available.div_ceil(total.max(1)).max(1);
    if per_chain >= 4 {
        thin = thin.min(per_chain / 4);
    }
    let thin = thin.max(1);
    let mut kept: Vec<usize> = (0..per_chain).rev().step_by(thin).collect();
    kept.reverse();
    (thin, kept)
}

/// One chain's (one file's) own record: its settings (`divergences = 3`, ...) for the `parvi`
/// block's `chain` section, and its adapted step size and diagonal inverse metric, written as
/// CmdStan's adaptation lines after the header.
#[derive(Clone, Debug, Default)]
pub struct ChainRecord {
    /// `key = value` lines of the chain's own.
    pub settings: Vec<(String, String)>,
    /// The step size after warm-up (CmdStan's `# Step size = ...`).
    pub step_size: Option<f64>,
    /// The diagonal of the inverse metric after warm-up.
    pub inv_metric: Option<Vec<f64>>,
}

/// What the comment lines of a draws file say about the run.
#[derive(Clone, Debug, Default)]
pub struct RunInfo {
    /// The model's name (posteriordb's `model_name`, or a built-in target's).
    pub model: String,
    /// The posterior's name, for a posteriordb posterior.
    pub posterior: Option<String>,
    /// The parvi method (`svgd`, `nuts`, ...): the `parvi` block's `engine`, and CmdStan's
    /// `algorithm` where [`RunInfo::algorithm`] is empty.
    pub method: String,
    /// The lines of CmdStan's `sample` block that say which sampler made the draws, with their
    /// indentation under it (`(0, "algorithm = hmc")`, `(1, "hmc")`, `(2, "engine = nuts")`, ...);
    /// empty: `algorithm = <method>`.
    pub algorithm: Vec<(usize, String)>,
    /// The run's settings that apply to it (a sampler's chains, warm-up and metric; a particle
    /// engine's particles, steps and step size; each phase's seconds), written as `key = value`
    /// lines of the `parvi` block.
    pub settings: Vec<(String, String)>,
    /// Each file's own record (one per chain or group of chains; may be empty).
    pub chain_records: Vec<ChainRecord>,
    /// Warm-up iterations per chain before the first saved draw, CmdStan's `num_warmup`
    /// (a particle engine's steps before its particles).
    pub warmup: usize,
    /// Iterations per saved draw, CmdStan's `thin` (0 is written as 1).
    pub thin: usize,
    /// What the draws are (`final particles`, `MCMC draws`, `polish-step MALA draws`).
    pub draws_are: String,
    /// The run's seed (also the resampling seed of a weighted set).
    pub seed: u64,
    /// The data file, if any.
    pub data_file: Option<String>,
    /// Seconds of preconditioning (CmdStan's warm-up line).
    pub warmup_seconds: f64,
    /// Seconds of the engine's run.
    pub sampling_seconds: f64,
    /// The run's warnings, written as comment lines after the timing block.
    pub warnings: Vec<String>,
    /// The file written, for the comments' `output.file` (set by [`Draws::write_files`]).
    pub output_file: Option<String>,
    /// A weighted set's particle count and the weights' ESS (set by [`Draws::write_files`]).
    pub weights: Option<(usize, f64)>,
}

/// Writes `bytes` to `path` through a temporary file in the same folder, renamed into place.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), CmdStanError> {
    let io = |error| CmdStanError::Io { action: "write", path: path.to_path_buf(), error };
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    // Hidden and marked as temporary (`.draws.csv.tmp-*`), as the run loop's checkpoints are.
    let name = path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let mut tmp = tempfile::Builder::new().prefix(&format!(".{name}.tmp-")).tempfile_in(dir).map_err(io)?;
    std::io::Write::write_all(&mut tmp, bytes).map_err(io)?;
    // A temporary file is made 0600; the result is an ordinary output, readable by others as
    // CmdStan's files are under the usual umask (0644).
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        tmp.as_file().set_permissions(std::fs::Permissions::from_mode(0o644)).map_err(io)?;
    }
    tmp.as_file().sync_all().map_err(io)?;
    tmp.persist(path).map_err(|e| io(e.error))?;
    Ok(())
}

/// Appends `v` as CmdStan writes it: `nan`, `inf`, `-inf`, else the shortest text that reads back
/// to the same value (to the same `f32` for a value that is one, as parvi's draws are).
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

/// Stan's name (`theta`, `theta[1]`, `a[1,2]`) in CmdStan's CSV naming (`theta`, `theta.1`,
/// `a.1.2`).
pub fn cmdstan_name(stan: &str) -> String {
    match stan.split_once('[') {
        Some((base, rest)) => {
            let index = rest.trim_end_matches(']');
            let parts: Vec<&str> = index.split(',').map(str::trim).collect();
            format!("{base}.{}", parts.join("."))
        }
        None => stan.to_string(),
    }
}

/// CmdStan's CSV name (`a.1.2`) in Stan's naming (`a[1,2]`).
pub fn stan_name(cmdstan: &str) -> String {
    let mut parts = cmdstan.split('.');
    let base = parts.next().unwrap_or_default();
    let index: Vec<&str> = parts.collect();
    if index.is_empty() { base.to_string() } else { format!("{base}[{}]", index.join(",")) }
}

/// The base name and 1-based indices of a Stan name (`a[1,2]` -> `a`, `[1, 2]`); `None` for
/// indices that are not numbers.
fn indices(stan: &str) -> (String, Option<Vec<usize>>) {
    match stan.split_once('[') {
        Some((base, rest)) => {
            let parsed: Result<Vec<usize>, _> =
                rest.trim_end_matches(']').split(',').map(|s| s.trim().parse::<usize>()).collect();
            (base.to_string(), parsed.ok())
        }
        None => (stan.to_string(), Some(Vec::new())),
    }
}

/// The order CmdStan writes `names` in: each run of one variable's elements (given row-major, as
/// Stan's names list them) column-major, the first index varying fastest (`a.1.1, a.2.1, a.1.2,
/// ...`); variables keep their order.
pub fn cmdstan_order(names: &[String]) -> Vec<usize> {
    let parsed: Vec<(String, Option<Vec<usize>>)> = names.iter().map(|n| indices(n)).collect();
    let mut order = Vec::with_capacity(names.len());
    let mut start = 0;
    while start < names.len() {
        let (base, idx) = &parsed[start];
        let rank = idx.as_ref().map(Vec::len);
        let mut end = start + 1;
        while end < names.len() && &parsed[end].0 == base && parsed[end].1.as_ref().map(Vec::len) == rank {
            end += 1;
        }
        let mut run: Vec<usize> = (start..end).collect();
        if rank.is_some_and(|r| r > 1) {
            // Column-major: compare the indices from the last to the first.
            run.sort_by(|&a, &b| {
                let (ia, ib) = (parsed[a].1.as_deref().unwrap_or(&[]), parsed[b].1.as_deref().unwrap_or(&[]));
                ia.iter().rev().cmp(ib.iter().rev())
            });
        }
        order.extend(run);
        start = end;
    }
    order
}

/// A CmdStan CSV file read back by CmdStan's rules: every line starting with `#` is a comment
/// (wherever it stands), the first other line is the header, every later non-empty line a draw
/// with one number per column (`nan`, `inf` and `-inf` included).
#[derive(Clone, Debug, PartialEq)]
pub struct StanCsv {
    /// The comment lines, without the leading `#` and one space.
    pub comments: Vec<String>,
    /// The header's column names, as written (`lp__`, `theta.1`).
    pub header: Vec<String>,
    /// The draws, one row per line.
    pub rows: Vec<Vec<f64>>,
}

impl StanCsv {
    /// Parses CmdStan CSV text.
    pub fn parse(text: &str) -> Result<Self, CmdStanError> {
        let mut comments = Vec::new();
        let mut header: Option<Vec<String>> = None;
        let mut rows = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim_end_matches('\r');
            if let Some(c) = line.strip_prefix('#') {
                comments.push(c.strip_prefix(' ').unwrap_or(c).to_string());
                continue;
            }
            let error = |reason: String| CmdStanError::Parse { line: i + 1, reason };
            match &header {
                None => {
                    let names: Vec<String> = line.split(',').map(|s| s.trim().to_string()).collect();
                    if let Some(bad) = names.iter().find(|n| n.is_empty()) {
                        return Err(error(format!("empty column name in the header `{bad}{line}`")));
                    }
                    header = Some(names);
                }
                Some(names) => {
                    if line.trim().is_empty() {
                        continue;
                    }
                    let fields: Vec<&str> = line.split(',').collect();
                    if fields.len() != names.len() {
                        return Err(error(format!("{} fields, the header has {}", fields.len(), names.len())));
                    }
                    let row = fields
                        .iter()
                        .zip(names)
                        .map(|(f, name)| {
                            f.trim()
                                .parse::<f64>()
                                .map_err(|_| error(format!("column `{name}`: `{f}` is not a number")))
                        })
                        .collect::<Result<Vec<f64>, _>>()?;
                    rows.push(row);
                }
            }
        }
        let header = header.ok_or(CmdStanError::Parse { line: 0, reason: "no header line".into() })?;
        Ok(Self { comments, header, rows })
    }

    /// Reads and parses the file at `path`.
    pub fn read(path: &Path) -> Result<Self, CmdStanError> {
        let text = std::fs::read_to_string(path).map_err(|error| CmdStanError::Io {
            action: "read",
            path: path.to_path_buf(),
            error,
        })?;
        Self::parse(&text).map_err(|e| CmdStanError::InFile { path: path.to_path_buf(), source: Box::new(e) })
    }

    /// The value of the first comment line `key = value` (CmdStan's `(Default)` mark dropped).
    pub fn config(&self, key: &str) -> Option<&str> {
        self.comments.iter().find_map(|c| {
            let (k, v) = c.split_once('=')?;
            (k.trim() == key).then(|| v.trim().trim_end_matches("(Default)").trim())
        })
    }

    /// Every draw of column `name` (CmdStan's `theta.1` or Stan's `theta[1]`).
    pub fn column(&self, name: &str) -> Option<Vec<f64>> {
        let j = self.header.iter().position(|h| h == name || stan_name(h) == name)?;
        Some(self.rows.iter().map(|r| r[j]).collect())
    }
}

/// The draws of a built-in target (`x[1]`, ..., `x[d]`, no constraints) from its draws in its
/// own coordinates, the log density from `model`.
pub fn builtin_draws(
    model: &dyn LogDensity,
    draws: Tensor<2>,
    weights: Option<Tensor<1>>,
    chains: Option<usize>,
) -> Result<Draws, CmdStanError> {
    let d = draws.dims()[1];
    let names = (1..=d).map(|i| format!("x[{i}]")).collect();
    let lp = model.log_prob(draws.clone(), None);
    Draws::from_tensors(names, draws, lp, weights, chains)
}
