//! Pathfinder (Zhang, Carpenter, Gelman & Vehtari 2022, "Pathfinder: Parallel quasi-Newton
//! variational inference", JMLR 23(306)): L-BFGS from several dispersed starts, a normal
//! approximation at every iterate from the L-BFGS inverse-Hessian factors (Alg. 4), the iterate
//! whose approximation has the best ELBO estimate, and multi-path importance resampling with
//! Pareto-smoothed weights (Alg. 5; PSIS, Vehtari, Simpson, Gelman, Yao & Gabry 2024).
//!
//! All paths advance together: their iterates are the rows of one `[paths, dim]` matrix, so an
//! L-BFGS iteration costs one batched score of every path (more only when a line search
//! backtracks); the ELBO draws of many iterates are evaluated in one batched call. The two-loop
//! recursion, the line search and the factors are host `f64` work on `[paths, dim]` arrays.
//!
//! The search uses the full data (an L-BFGS line search needs one deterministic objective): a
//! minibatch size set for the run is ignored here.

use std::collections::VecDeque;

use burn::tensor::Device;
use parvi_model::linalg::host::Cholesky;
use parvi_model::tensor_ops::{matrix_from_vec, to_vec_f64};
use parvi_model::{LogDensity, score};
use serde::{Deserialize, Serialize};

use crate::engines::EngineConfig;
use crate::error::require_positive;
use crate::evaluation::psis;
use crate::{AdapterConfig, Engine, EngineRng, EngineState, InferError, KernelConfig, Particles, StepContext};

/// Pareto k-hat above which importance weights (and so the approximation) are unreliable
/// (Vehtari et al. 2024, for the sample sizes used here).
pub const MAX_PARETO_K: f64 = 0.7;

/// Rows per batched evaluation of ELBO and final draws.
const CHUNK: usize = 2048;

/// Options of `pathfinder` (the defaults are the paper's and Stan's).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct PathfinderConfig {
    /// Independent L-BFGS paths (Stan: 4).
    pub paths: usize,
    /// L-BFGS history `J`: the correction pairs kept (the paper: 6).
    pub history: usize,
    /// L-BFGS iterations per path at most (Stan: 1000).
    pub max_iters: usize,
    /// Monte Carlo draws `K` of each iterate's ELBO estimate (Stan: 25).
    pub elbo_draws: usize,
    /// Draws `M` from each path's chosen approximation before resampling (Stan: 1000).
    pub draws_per_path: usize,
    /// Starts uniform on `(-init_radius, init_radius)` in every unconstrained coordinate (Stan: 2).
    pub init_radius: f64,
    /// A path stops when the objective's relative change `|f_k - f_k+1| / max(|f_k|, |f_k+1|, 1)`
    /// falls below this. Stan's default (1e4 machine epsilons, 2.2e-12) is below `f32`'s
    /// rounding of the objective, so the other criteria end a path; a larger value stops paths
    /// early on posteriors with many data rows (|f| ~ 1e4), far from the mode along flat
    /// directions.
    pub tol_rel_obj: f64,
    /// A path stops when the L-BFGS Newton decrement relative to the objective,
    /// `g^T H g / max(|f|, 1)`, falls below this (Stan's `tol_rel_grad`, 1e7 machine epsilons).
    pub tol_rel_grad: f64,
}

impl Default for PathfinderConfig {
    fn default() -> Self {
        Self {
            paths: 4,
            history: 6,
            max_iters: 1000,
            elbo_draws: 25,
            draws_per_path: 1000,
            init_radius: 2.0,
            tol_rel_obj: 1e4 * f64::EPSILON,
            tol_rel_grad: 1e7 * f64::EPSILON,
        }
    }
}

impl PathfinderConfig {
    /// An error naming the first option out of range.
    pub fn validate(&self) -> Result<(), InferError> {
        let positive = |name: &'static str, v: usize| {
            if v == 0 { Err(InferError::setting(name, "must be at least 1, got 0")) } else { Ok(()) }
        };
        positive("pathfinder.paths", self.paths)?;
        positive("pathfinder.history", self.history)?;
        positive("pathfinder.max-iters", self.max_iters)?;
        positive("pathfinder.elbo-draws", self.elbo_draws)?;
        positive("pathfinder.draws-per-path", self.draws_per_path)?;
        require_positive("pathfinder.init-radius", self.init_radius)?;
        require_positive("pathfinder.tol-rel-obj", self.tol_rel_obj)?;
        require_positive("pathfinder.tol-rel-grad", self.tol_rel_grad)?;
        Ok(())
    }
}

/// How a path's L-BFGS search ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PathStatus {
    /// The objective's relative change, or the relative Newton decrement, fell below its
    /// tolerance.
    Converged,
    /// No step along the search direction increased the density (within `f32` rounding: the
    /// search is at the mode's noise floor, or stuck).
    LineSearchFailed,
    /// The iteration limit was reached while the density still rose.
    IterationLimit,
}

/// One path's search and its chosen approximation.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PathReport {
    /// L-BFGS iterations taken.
    pub iterations: usize,
    /// How the search ended.
    pub status: PathStatus,
    /// The iterate whose normal approximation had the best ELBO (1-based; 0: none finite).
    pub best_iteration: usize,
    /// That ELBO estimate (up to the density's normalising constant).
    pub elbo: f64,
    /// `log p` at the start and at the last iterate.
    pub log_prob_start: f64,
    /// `log p` at the last iterate.
    pub log_prob_end: f64,
    /// The mean of the chosen approximation.
    pub mean: Vec<f64>,
    /// The standard deviations of the chosen approximation.
    pub sd: Vec<f64>,
    /// The share of the pooled importance weight its draws carry (0 for a path without a
    /// finite ELBO): a path that stopped short (in `f32` an ill-conditioned valley can stall
    /// L-BFGS far from the mode) carries almost none.
    pub weight: f64,
}

/// Paths whose draws carry less than this share of the importance weight are left out of the
/// paths' agreement and mode counts: the resampling gives them no say either.
pub const MIN_PATH_WEIGHT: f64 = 0.05;

/// What [`pathfinder`] returns: every path's report, the pooled draws with their
/// Pareto-smoothed importance weights, and the moments they give.
#[derive(Clone, Debug)]
pub struct PathfinderFit {
    /// The dimension.
    pub dim: usize,
    /// The paths, in order.
    pub paths: Vec<PathReport>,
    /// Draws from every path's chosen approximation, row-major `[draws, dim]`.
    pub draws: Vec<f64>,
    /// Their Pareto-smoothed log importance weights, normalised (`logsumexp = 0`).
    pub log_weights: Vec<f64>,
    /// Each draw's log density under its path's normal approximation (CmdStan's
    /// `lp_approx__`).
    pub log_q: Vec<f64>,
    /// The Pareto k-hat of the raw importance ratios: above [`MAX_PARETO_K`] the
    /// approximation is unreliable.
    pub pareto_k: f64,
    /// The importance-weighted mean of the draws.
    pub mean: Vec<f64>,
    /// The importance-weighted covariance of the draws, row-major `dim x dim`.
    pub covariance: Vec<f64>,
    /// The largest difference between two paths' approximation means, in the weighted sds,
    /// over the paths with at least [`MIN_PATH_WEIGHT`] of the weight: paths that disagree by
    /// many sds found different regions.
    pub disagreement: f64,
    /// Model evaluations with a gradient (one per row).
    pub score_evals: usize,
    /// Model evaluations without a gradient (the ELBO and importance draws).
    pub density_evals: usize,
}

impl PathfinderFit {
    /// `n` draws resampled by their importance weights: with replacement (the importance
    /// resampling of the paper's Alg. 5, unbiased), or without (distinct draws, as initial
    /// particles need: Efraimidis & Spirakis' keys `u^(1/w)`). Row-major `[n, dim]`.
    pub fn resample(&self, n: usize, replace: bool, rng: &mut EngineRng) -> Vec<f64> {
        let d = self.dim;
        let picks = self.resample_picks(n, replace, rng);
        picks.iter().flat_map(|&i| self.draws[i * d..(i + 1) * d].iter().copied()).collect()
    }

    /// The indices of the draws [`PathfinderFit::resample`] picks.
    pub fn resample_picks(&self, n: usize, replace: bool, rng: &mut EngineRng) -> Vec<usize> {
        let total = self.log_weights.len();
        let picks: Vec<usize> = if replace {
            let w: Vec<f64> = self.log_weights.iter().map(|v| v.exp()).collect();
            let sum: f64 = w.iter().sum();
            let mut cumulative = Vec::with_capacity(total);
            let mut acc = 0.0;
            for v in &w {
                acc += v / sum;
                cumulative.push(acc);
            }
            (0..n)
                .map(|_| {
                    let u = rng.uniform();
                    cumulative.partition_point(|c| *c < u).min(total - 1)
                })
                .collect()
        } else {
            // log key = log(u) / w, the largest keys win; a zero weight sorts last.
            let mut keys: Vec<(f64, usize)> = self
                .log_weights
                .iter()
                .enumerate()
                .map(|(i, lw)| {
                    let w = lw.exp();
                    let u = rng.uniform().max(f64::MIN_POSITIVE);
                    (if w > 0.0 { u.ln() / w } else { f64::NEG_INFINITY }, i)
                })
                .collect();
            keys.sort_by(|a, b| b.0.total_cmp(&a.0));
            (0..n).map(|k| keys[k % total].1).collect()
        };
        picks
    }

    /// The reasons this fit should not be trusted as a posterior approximation (empty when
    /// none): k-hat above [`MAX_PARETO_K`], a path that reached its iteration limit with the
    /// ELBO still best at its end (the search running away, down a funnel's neck or along a
    /// flat direction), paths whose approximations disagree by more than `max_disagreement` sds.
    pub fn problems(&self, max_iters: usize, max_disagreement: f64) -> Vec<String> {
        let mut out = Vec::new();
        if self.pareto_k.is_nan() || self.pareto_k > MAX_PARETO_K {
            out.push(format!(
                "Pathfinder's Pareto k-hat is {:.2} (> {MAX_PARETO_K}): its normal approximation is far from the posterior and the resampled draws are unreliable",
                self.pareto_k
            ));
        }
        for (i, p) in self.paths.iter().enumerate() {
            if p.status == PathStatus::IterationLimit && p.best_iteration + max_iters / 10 >= p.iterations {
                out.push(format!(
                    "Pathfinder's path {i} ran away: after {} L-BFGS iterations the log density still rose ({:.3e} to {:.3e}) and the best approximation was among the last ones",
                    p.iterations, p.log_prob_start, p.log_prob_end
                ));
            }
        }
        if self.disagreement.is_nan() || self.disagreement > max_disagreement {
            out.push(format!(
                "Pathfinder's paths disagree: their approximations' means are {:.1} posterior sds apart (> {max_disagreement})",
                self.disagreement
            ));
        }
        out
    }

    /// How many separate modes the paths' chosen approximations sit at: paths whose means
    /// differ by more than `separation` of their own (larger) sd in some coordinate are at
    /// different modes (clusters formed greedily, in path order). Pooled importance weights can
    /// weight such modes only as well as the few paths that found them.
    pub fn modes(&self, separation: f64) -> usize {
        let chosen: Vec<&PathReport> = self.paths.iter().filter(|p| p.weight >= MIN_PATH_WEIGHT).collect();
        let mut centres: Vec<&PathReport> = Vec::new();
        for p in chosen {
            let apart = |c: &PathReport| {
                (0..self.dim).any(|j| (p.mean[j] - c.mean[j]).abs() > separation * p.sd[j].max(c.sd[j]))
            };
            if centres.iter().all(|c| apart(c)) {
                centres.push(p);
            }
        }
        centres.len()
    }

    /// A summary for reports: k-hat, the paths, the counts.
    pub fn summary(&self) -> serde_json::Value {
        serde_json::json!({
            "pareto_k": self.pareto_k,
            "disagreement": self.disagreement,
            "score_evals": self.score_evals,
            "density_evals": self.density_evals,
            "paths": self.paths.iter().map(|p| serde_json::json!({
                "iterations": p.iterations,
                "status": p.status,
                "best_iteration": p.best_iteration,
                "elbo": p.elbo,
                "weight": p.weight,
            })).collect::<Vec<_>>(),
        })
    }
}

/// A normal approximation `N(mean, H)` with `H = diag(a) + beta gamma beta^T` the L-BFGS
/// inverse Hessian, in the factored form of the paper's Alg. 4: a draw is
/// `mean + sqrt(a) (Q (L - I) Q^T u + u)` for `u ~ N(0, I)`, `Q R` the thin QR of
/// `diag(1/sqrt(a)) beta` and `L L^T = I + R gamma R^T`; when `2 J >= dim` the dense Cholesky
/// factor of `H` serves instead.
#[derive(Clone, Debug)]
struct Normal {
    mean: Vec<f64>,
    form: Form,
    log_det: f64,
}

#[derive(Clone, Debug)]
enum Form {
    /// `sqrt(a)`, `Q` row-major `[dim, k]`, `L - I` row-major `[k, k]`.
    LowRank { sqrt_a: Vec<f64>, q: Vec<f64>, l_minus_i: Vec<f64>, k: usize },
    /// The Cholesky factor of `H`, row-major lower `[dim, dim]`.
    Dense(Vec<f64>),
}

impl Normal {
    /// The approximation at `x` (gradient `g` of the objective `-log p`), from the diagonal `a`
    /// and the correction pairs `s`, `y` (oldest first). `None` where the factors break down.
    fn at(x: &[f64], g: &[f64], a: &[f64], s: &VecDeque<Vec<f64>>, y: &VecDeque<Vec<f64>>) -> Option<Self> {
        let d = x.len();
        let m = s.len();
        let step = two_loop(g, a, s, y);
        let mean: Vec<f64> = x.iter().zip(&step).map(|(xi, hi)| xi - hi).collect();
        // beta = [diag(a) Y, S] `[d, 2m]`, gamma `[2m, 2m]` (the paper's eq. II.2; Byrd, Nocedal &
        // Schnabel's compact form of the L-BFGS inverse Hessian).
        let k = 2 * m;
        let mut r_inv = vec![0.0; m * m];
        // R = upper triangle of S^T Y; its inverse by back substitution, column by column.
        let sty = |i: usize, j: usize| dot(&s[i], &y[j]);
        for col in 0..m {
            for row in (0..=col).rev() {
                let mut v = if row == col { 1.0 } else { 0.0 };
                for t in row + 1..=col {
                    v -= sty(row, t) * r_inv[t * m + col];
                }
                r_inv[row * m + col] = v / sty(row, row);
            }
        }
        let mut w = vec![0.0; m * m];
        for i in 0..m {
            for j in 0..m {
                w[i * m + j] =
                    (0..d).map(|t| y[i][t] * a[t] * y[j][t]).sum::<f64>() + if i == j { sty(i, i) } else { 0.0 };
            }
        }
        // gamma = [[0, -R^-1], [-R^-T, R^-T W R^-1]].
        let mut gamma = vec![0.0; k * k];
        for i in 0..m {
            for j in 0..m {
                gamma[i * k + m + j] = -r_inv[i * m + j];
                gamma[(m + j) * k + i] = -r_inv[i * m + j];
                let mut v = 0.0;
                for p in 0..m {
                    for q in 0..m {
                        v += r_inv[p * m + i] * w[p * m + q] * r_inv[q * m + j];
                    }
                }
                gamma[(m + i) * k + m + j] = v;
            }
        }
        let beta = |row: usize, col: usize| if col < m { a[row] * y[col][row] } else { s[col - m][row] };
        let normal = if k >= d {
            let mut h = vec![0.0; d * d];
            for i in 0..d {
                for j in 0..=i {
                    let mut v = if i == j { a[i] } else { 0.0 };
                    for p in 0..k {
                        let bp = beta(i, p);
                        if bp != 0.0 {
                            v += bp * (0..k).map(|q| gamma[p * k + q] * beta(j, q)).sum::<f64>();
                        }
                    }
                    h[i * d + j] = v;
                    h[j * d + i] = v;
                }
            }
            let c = Cholesky::factor(&h, d, 0.0).ok()?;
            Normal { mean, log_det: c.log_det(), form: Form::Dense(c.lower().to_vec()) }
        } else {
            let sqrt_a: Vec<f64> = a.iter().map(|v| v.sqrt()).collect();
            let mut b = vec![0.0; d * k];
            for i in 0..d {
                for p in 0..k {
                    b[i * k + p] = beta(i, p) / sqrt_a[i];
                }
            }
            let (q, r) = thin_qr(&b, d, k);
            // I + R gamma R^T.
            let mut rg = vec![0.0; k * k];
            for i in 0..k {
                for j in 0..k {
                    rg[i * k + j] = (0..k).map(|p| r[i * k + p] * gamma[p * k + j]).sum();
                }
            }
            let mut inner = vec![0.0; k * k];
            for i in 0..k {
                for j in 0..k {
                    inner[i * k + j] =
                        (0..k).map(|p| rg[i * k + p] * r[j * k + p]).sum::<f64>() + if i == j { 1.0 } else { 0.0 };
                }
            }
            let c = Cholesky::factor(&inner, k, 0.0).ok()?;
            let mut l_minus_i = c.lower().to_vec();
            for i in 0..k {
                l_minus_i[i * k + i] -= 1.0;
            }
            let log_det = a.iter().map(|v| v.ln()).sum::<f64>() + c.log_det();
            Normal { mean, log_det, form: Form::LowRank { sqrt_a, q, l_minus_i, k } }
        };
        (normal.log_det.is_finite() && normal.mean.iter().all(|v| v.is_finite())).then_some(normal)
    }

    /// The draw for standard normal `u`, and its log density under the approximation.
    fn draw(&self, u: &[f64]) -> (Vec<f64>, f64) {
        let d = u.len();
        let x = match &self.form {
            Form::Dense(c) => {
                (0..d).map(|i| self.mean[i] + (0..=i).map(|j| c[i * d + j] * u[j]).sum::<f64>()).collect()
            }
            Form::LowRank { sqrt_a, q, l_minus_i, k } => {
                let k = *k;
                let qtu: Vec<f64> = (0..k).map(|p| (0..d).map(|i| q[i * k + p] * u[i]).sum()).collect();
                let lq: Vec<f64> = (0..k).map(|p| (0..k).map(|t| l_minus_i[p * k + t] * qtu[t]).sum()).collect();
                (0..d)
                    .map(|i| self.mean[i] + sqrt_a[i] * ((0..k).map(|p| q[i * k + p] * lq[p]).sum::<f64>() + u[i]))
                    .collect()
            }
        };
        let log_q = -0.5 * (self.log_det + dot(u, u) + d as f64 * (2.0 * std::f64::consts::PI).ln());
        (x, log_q)
    }

    /// The marginal standard deviations (`diag(C C^T)` for the draw map `x = mean + C u`).
    fn sd(&self) -> Vec<f64> {
        let d = self.mean.len();
        match &self.form {
            Form::Dense(c) => (0..d).map(|i| (0..=i).map(|j| c[i * d + j].powi(2)).sum::<f64>().sqrt()).collect(),
            Form::LowRank { sqrt_a, q, l_minus_i, k } => {
                // C = diag(sqrt a) (I + Q (L - I) Q^T): row i is sqrt(a_i) (e_i + Q_i (L - I) Q^T).
                let k = *k;
                (0..d)
                    .map(|i| {
                        let qi = &q[i * k..(i + 1) * k];
                        let v: Vec<f64> = (0..k).map(|t| (0..k).map(|p| qi[p] * l_minus_i[p * k + t]).sum()).collect();
                        let row: Vec<f64> = (0..d)
                            .map(|j| {
                                (if i == j { 1.0 } else { 0.0 }) + (0..k).map(|t| v[t] * q[j * k + t]).sum::<f64>()
                            })
                            .collect();
                        sqrt_a[i] * dot(&row, &row).sqrt()
                    })
                    .collect()
            }
        }
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `H g` for the L-BFGS inverse Hessian with initial diagonal `a` and pairs `s`, `y` (oldest
/// first): Nocedal & Wright's two-loop recursion (Alg. 7.4).
fn two_loop(g: &[f64], a: &[f64], s: &VecDeque<Vec<f64>>, y: &VecDeque<Vec<f64>>) -> Vec<f64> {
    let m = s.len();
    let mut q = g.to_vec();
    let mut coef = vec![0.0; m];
    for i in (0..m).rev() {
        let rho = 1.0 / dot(&y[i], &s[i]);
        coef[i] = rho * dot(&s[i], &q);
        q.iter_mut().zip(&y[i]).for_each(|(qj, yj)| *qj -= coef[i] * yj);
    }
    let mut r: Vec<f64> = q.iter().zip(a).map(|(qj, aj)| qj * aj).collect();
    for i in 0..m {
        let rho = 1.0 / dot(&y[i], &s[i]);
        let b = rho * dot(&y[i], &r);
        r.iter_mut().zip(&s[i]).for_each(|(rj, sj)| *rj += (coef[i] - b) * sj);
    }
    r
}

/// The diagonal's update from one pair (the paper's Alg. 3, after Gilbert & Lemarechal 1989);
/// the old diagonal where the update is not positive and finite.
fn update_diagonal(a: &[f64], s: &[f64], y: &[f64]) -> Vec<f64> {
    let av = (0..a.len()).map(|i| y[i] * a[i] * y[i]).sum::<f64>();
    let b = dot(y, s);
    let c = (0..a.len()).map(|i| s[i] * s[i] / a[i]).sum::<f64>();
    let next: Vec<f64> = (0..a.len())
        .map(|i| 1.0 / (av / (b * a[i]) + y[i] * y[i] / b - av * s[i] * s[i] / (b * c * a[i] * a[i])))
        .collect();
    if next.iter().all(|v| v.is_finite() && *v > 0.0) { next } else { a.to_vec() }
}

/// Thin Householder QR of `b` (row-major `[d, k]`, `k < d`): `Q` row-major `[d, k]` with
/// orthonormal columns even where `b` is rank deficient, and `R` row-major `[k, k]`.
fn thin_qr(b: &[f64], d: usize, k: usize) -> (Vec<f64>, Vec<f64>) {
    let mut a = b.to_vec();
    let mut vs: Vec<Vec<f64>> = Vec::with_capacity(k);
    for j in 0..k {
        let norm = (j..d).map(|i| a[i * k + j].powi(2)).sum::<f64>().sqrt();
        let mut v: Vec<f64> = (j..d).map(|i| a[i * k + j]).collect();
        v[0] += if v[0] >= 0.0 { norm } else { -norm };
        let vn = dot(&v, &v).sqrt();
        if vn > 0.0 {
            v.iter_mut().for_each(|t| *t /= vn);
            for col in j..k {
                let p: f64 = (j..d).map(|i| v[i - j] * a[i * k + col]).sum();
                for i in j..d {
                    a[i * k + col] -= 2.0 * v[i - j] * p;
                }
            }
        }
        vs.push(v);
    }
    let mut r = vec![0.0; k * k];
    for i in 0..k {
        for j in i..k {
            r[i * k + j] = a[i * k + j];
        }
    }
    let mut q = vec![0.0; d * k];
    for i in 0..k {
        q[i * k + i] = 1.0;
    }
    for j in (0..k).rev() {
        let v = &vs[j];
        if dot(v, v) == 0.0 {
            continue;
        }
        for col in 0..k {
            let p: f64 = (j..d).map(|i| v[i - j] * q[i * k + col]).sum();
            for i in j..d {
                q[i * k + col] -= 2.0 * v[i - j] * p;
            }
        }
    }
    (q, r)
}

/// `log p` and its gradient at the rows of `x` (row-major `[n, d]`), in one batched call.
fn scores(model: &dyn LogDensity, x: &[f64], d: usize, device: &Device) -> Result<(Vec<f64>, Vec<f64>), InferError> {
    let n = x.len() / d;
    let s = score(model, matrix_from_vec(x.iter().map(|&v| v as f32).collect(), n, d, device), None)?;
    Ok((to_vec_f64(&s.log_prob), to_vec_f64(&s.grad)))
}

/// `log p` at the rows of `x`, in batched calls of [`CHUNK`] rows.
fn log_probs(model: &dyn LogDensity, x: &[f64], d: usize, device: &Device) -> Vec<f64> {
    x.chunks(CHUNK * d)
        .flat_map(|c| {
            let t = matrix_from_vec(c.iter().map(|&v| v as f32).collect(), c.len() / d, d, device);
            to_vec_f64(&model.log_prob(t, None))
        })
        .collect()
}

/// A point with its objective `f = -log p` and gradient of `f`.
type Point = (Vec<f64>, f64, Vec<f64>);

/// One path's L-BFGS state on the objective `f = -log p`.
struct Path {
    x: Vec<f64>,
    f: f64,
    g: Vec<f64>,
    a: Vec<f64>,
    s: VecDeque<Vec<f64>>,
    y: VecDeque<Vec<f64>>,
    iterations: usize,
    status: Option<PathStatus>,
    f_start: f64,
    best: Option<(f64, usize, Normal)>,
    /// The history was just cleared after a stop signal; a second signal in a row ends the path.
    restarted: bool,
}

impl Path {
    /// A stop signal (no step improved, or the change fell below tolerance): the first clears
    /// the L-BFGS history and goes on from the gradient, since in `f32` a poorly scaled inverse
    /// Hessian backtracks to steps that change nothing long before the mode (measured on kidiq
    /// and earnings: paths stopped 16 and 70 nats of ELBO short); a second in a row ends it.
    fn stop(&mut self, status: PathStatus) {
        if self.restarted || self.s.is_empty() {
            self.status = Some(status);
        } else {
            self.s.clear();
            self.y.clear();
            self.a.iter_mut().for_each(|v| *v = 1.0);
            self.restarted = true;
        }
    }
}

/// An iterate's approximation waiting for its ELBO draws' log densities.
struct Pending {
    path: usize,
    iteration: usize,
    normal: Normal,
    log_q: Vec<f64>,
}

/// Evaluates the pending ELBO draws in one batched call and keeps each path's best iterate.
fn flush(
    model: &dyn LogDensity,
    paths: &mut [Path],
    pending: &mut Vec<Pending>,
    rows: &mut Vec<f64>,
    d: usize,
    device: &Device,
) -> usize {
    if pending.is_empty() {
        return 0;
    }
    let lp = log_probs(model, rows, d, device);
    let evals = lp.len();
    let mut offset = 0;
    for p in pending.drain(..) {
        let k = p.log_q.len();
        let terms = lp[offset..offset + k].iter().zip(&p.log_q).map(|(l, q)| l - q);
        offset += k;
        // A draw with a non-finite density makes the ELBO -inf: that approximation reaches
        // where the target is not defined.
        let elbo = terms.clone().sum::<f64>() / k as f64;
        let elbo = if elbo.is_nan() { f64::NEG_INFINITY } else { elbo };
        let path = &mut paths[p.path];
        if elbo > f64::NEG_INFINITY && path.best.as_ref().is_none_or(|b| elbo > b.0) {
            path.best = Some((elbo, p.iteration, p.normal));
        }
    }
    rows.clear();
    evals
}

/// Runs multi-path Pathfinder on `model` (full data).
pub fn pathfinder(
    model: &dyn LogDensity,
    config: &PathfinderConfig,
    rng: &mut EngineRng,
    device: &Device,
) -> Result<PathfinderFit, InferError> {
    config.validate()?;
    let d = model.dim();
    let n_paths = config.paths;
    let (mut score_evals, mut density_evals) = (0usize, 0usize);

    // Dispersed starts, uniform(-R, R) as Stan's; a start where the density or its gradient is
    // not finite is drawn again (Stan tries 100 times).
    let mut starts: Vec<Option<Point>> = vec![None; n_paths];
    for _ in 0..100 {
        let missing: Vec<usize> = (0..n_paths).filter(|&i| starts[i].is_none()).collect();
        if missing.is_empty() {
            break;
        }
        let x: Vec<f64> = (0..missing.len() * d).map(|_| config.init_radius * (2.0 * rng.uniform() - 1.0)).collect();
        let (lp, grad) = scores(model, &x, d, device)?;
        score_evals += missing.len();
        for (r, &i) in missing.iter().enumerate() {
            let g = &grad[r * d..(r + 1) * d];
            if lp[r].is_finite() && g.iter().all(|v| v.is_finite()) {
                starts[i] = Some((x[r * d..(r + 1) * d].to_vec(), -lp[r], g.iter().map(|v| -v).collect()));
            }
        }
    }
    let mut paths = Vec::with_capacity(n_paths);
    for (i, s) in starts.into_iter().enumerate() {
        let (x, f, g) = s.ok_or_else(|| {
            InferError::Numerical(format!(
                "Pathfinder's path {i}: the log density or its gradient was non-finite at 100 starts uniform on (-{0}, {0})",
                config.init_radius
            ))
        })?;
        paths.push(Path {
            x,
            f,
            g,
            a: vec![1.0; d],
            s: VecDeque::new(),
            y: VecDeque::new(),
            iterations: 0,
            status: None,
            f_start: f,
            best: None,
            restarted: false,
        });
    }

    let mut pending: Vec<Pending> = Vec::new();
    let mut rows: Vec<f64> = Vec::new();
    let mut ticker = crate::core::progress::Ticker::new("pathfinder (L-BFGS)");
    for iteration in 0..config.max_iters {
        let running: Vec<usize> = (0..n_paths).filter(|&i| paths[i].status.is_none()).collect();
        ticker.tick(|| {
            format!(
                "iteration {iteration} of at most {}, {} of {n_paths} paths running",
                config.max_iters,
                running.len()
            )
        });
        if running.is_empty() {
            break;
        }
        // Search directions p = -H g; a direction that does not descend (rounding in a
        // near-singular history) restarts that path's history from the gradient.
        let mut dirs: Vec<Vec<f64>> = Vec::with_capacity(running.len());
        let mut t: Vec<f64> = Vec::with_capacity(running.len());
        for &i in &running {
            let p = &mut paths[i];
            let mut dir: Vec<f64> = two_loop(&p.g, &p.a, &p.s, &p.y).iter().map(|v| -v).collect();
            let descends = dot(&dir, &p.g) < 0.0;
            if !descends {
                p.s.clear();
                p.y.clear();
                p.a = vec![1.0; d];
                dir = p.g.iter().map(|v| -v).collect();
            }
            // The first step (no curvature yet) is at most of unit length.
            let norm = dot(&dir, &dir).sqrt();
            t.push(if p.iterations == 0 || p.s.is_empty() { (1.0 / norm).min(1.0) } else { 1.0 });
            dirs.push(dir);
        }
        // Backtracking (Armijo, c1 = 1e-4) for all running paths at once: one batched score per
        // trial of the paths still searching.
        let mut searching: Vec<usize> = (0..running.len()).collect();
        let mut accepted: Vec<Option<Point>> = vec![None; running.len()];
        for _ in 0..40 {
            if searching.is_empty() {
                break;
            }
            let x: Vec<f64> = searching
                .iter()
                .flat_map(|&r| {
                    let p = &paths[running[r]];
                    p.x.iter().zip(&dirs[r]).map(|(xi, di)| xi + t[r] * di).collect::<Vec<_>>()
                })
                .collect();
            let (lp, grad) = scores(model, &x, d, device)?;
            score_evals += searching.len();
            let mut still = Vec::new();
            for (row, &r) in searching.iter().enumerate() {
                let p = &paths[running[r]];
                let f_new = -lp[row];
                let g_new: Vec<f64> = grad[row * d..(row + 1) * d].iter().map(|v| -v).collect();
                let armijo = f_new <= p.f + 1e-4 * t[r] * dot(&p.g, &dirs[r]);
                if f_new.is_finite() && g_new.iter().all(|v| v.is_finite()) && armijo {
                    accepted[r] = Some((x[row * d..(row + 1) * d].to_vec(), f_new, g_new));
                } else {
                    t[r] *= 0.5;
                    still.push(r);
                }
            }
            searching = still;
        }
        for (r, &i) in running.iter().enumerate() {
            let p = &mut paths[i];
            let Some((x_new, f_new, g_new)) = accepted[r].take() else {
                p.stop(PathStatus::LineSearchFailed);
                continue;
            };
            let s: Vec<f64> = x_new.iter().zip(&p.x).map(|(a, b)| a - b).collect();
            let y: Vec<f64> = g_new.iter().zip(&p.g).map(|(a, b)| a - b).collect();
            // The curvature condition of the paper's Alg. 3 (with a tolerance for f32 scores):
            // a pair that does not show positive curvature is not kept.
            if dot(&s, &y) > 1e-10 * dot(&y, &y) {
                p.a = update_diagonal(&p.a, &s, &y);
                p.s.push_back(s);
                p.y.push_back(y);
                if p.s.len() > config.history {
                    p.s.pop_front();
                    p.y.pop_front();
                }
            }
            let rel = (p.f - f_new).abs() / p.f.abs().max(f_new.abs()).max(1.0);
            p.x = x_new;
            p.f = f_new;
            p.g = g_new;
            p.iterations += 1;
            let decrement = dot(&p.g, &two_loop(&p.g, &p.a, &p.s, &p.y)) / p.f.abs().max(1.0);
            if rel < config.tol_rel_obj || decrement < config.tol_rel_grad {
                p.stop(PathStatus::Converged);
            } else {
                p.restarted = false;
            }
            // This iterate's approximation and its ELBO draws.
            if let Some(normal) = Normal::at(&p.x, &p.g, &p.a, &p.s, &p.y) {
                let mut log_q = Vec::with_capacity(config.elbo_draws);
                for _ in 0..config.elbo_draws {
                    let u: Vec<f64> = (0..d).map(|_| rng.normal()).collect();
                    let (x, lq) = normal.draw(&u);
                    rows.extend(x);
                    log_q.push(lq);
                }
                pending.push(Pending { path: i, iteration: p.iterations, normal, log_q });
            }
        }
        if rows.len() >= CHUNK * d {
            density_evals += flush(model, &mut paths, &mut pending, &mut rows, d, device);
        }
    }
    density_evals += flush(model, &mut paths, &mut pending, &mut rows, d, device);
    for p in paths.iter_mut() {
        p.status.get_or_insert(PathStatus::IterationLimit);
    }

    // M draws from every path's chosen approximation, pooled (Alg. 5).
    let mut draws: Vec<f64> = Vec::new();
    let mut log_q: Vec<f64> = Vec::new();
    let mut reports = Vec::with_capacity(n_paths);
    for p in &paths {
        let (elbo, best_iteration, mean, sd) = match &p.best {
            Some((elbo, it, normal)) => {
                for _ in 0..config.draws_per_path {
                    let u: Vec<f64> = (0..d).map(|_| rng.normal()).collect();
                    let (x, lq) = normal.draw(&u);
                    draws.extend(x);
                    log_q.push(lq);
                }
                (*elbo, *it, normal.mean.clone(), normal.sd())
            }
            None => (f64::NEG_INFINITY, 0, p.x.clone(), vec![f64::NAN; d]),
        };
        reports.push(PathReport {
            iterations: p.iterations,
            status: p.status.unwrap_or(PathStatus::IterationLimit),
            best_iteration,
            elbo,
            log_prob_start: -p.f_start,
            log_prob_end: -p.f,
            mean,
            sd,
            weight: 0.0,
        });
    }
    if draws.is_empty() {
        return Err(InferError::Numerical(
            "Pathfinder: no path had an approximation with a finite ELBO (the density is non-finite around every iterate)".into(),
        ));
    }
    let lp = log_probs(model, &draws, d, device);
    density_evals += lp.len();
    let mut log_weights: Vec<f64> =
        lp.iter().zip(&log_q).map(|(l, q)| if l.is_finite() { l - q } else { f64::NEG_INFINITY }).collect();
    let pareto_k = psis(&mut log_weights);
    // Each path's share of the weight; its draws are consecutive, in path order.
    let mut offset = 0;
    for r in reports.iter_mut().filter(|r| r.best_iteration > 0) {
        r.weight = log_weights[offset..offset + config.draws_per_path].iter().map(|v| v.exp()).sum();
        offset += config.draws_per_path;
    }
    let (mean, covariance) = weighted_moments(&draws, &log_weights, d);
    let sd: Vec<f64> = (0..d).map(|j| covariance[j * d + j].max(0.0).sqrt()).collect();
    let mut disagreement = 0.0f64;
    let chosen: Vec<&PathReport> = reports.iter().filter(|r| r.weight >= MIN_PATH_WEIGHT).collect();
    for (a, ra) in chosen.iter().enumerate() {
        for rb in &chosen[a + 1..] {
            for ((a_j, b_j), sd_j) in ra.mean.iter().zip(&rb.mean).zip(&sd) {
                let gap = (a_j - b_j).abs() / sd_j;
                disagreement = if gap.is_nan() { f64::NAN } else { disagreement.max(gap) };
            }
        }
    }
    Ok(PathfinderFit {
        dim: d,
        paths: reports,
        draws,
        log_weights,
        log_q,
        pareto_k,
        mean,
        covariance,
        disagreement,
        score_evals,
        density_evals,
    })
}

/// The weighted mean and covariance (row-major) of `draws` with normalised log weights.
fn weighted_moments(draws: &[f64], log_weights: &[f64], d: usize) -> (Vec<f64>, Vec<f64>) {
    let w: Vec<f64> = log_weights.iter().map(|v| v.exp()).collect();
    let total: f64 = w.iter().sum();
    let mut mean = vec![0.0; d];
    for (i, wi) in w.iter().enumerate() {
        for j in 0..d {
            mean[j] += wi / total * draws[i * d + j];
        }
    }
    let mut cov = vec![0.0; d * d];
    for (i, wi) in w.iter().enumerate() {
        if *wi == 0.0 {
            continue;
        }
        let row = &draws[i * d..(i + 1) * d];
        for j in 0..d {
            for k in 0..=j {
                cov[j * d + k] += wi / total * (row[j] - mean[j]) * (row[k] - mean[k]);
            }
        }
    }
    for j in 0..d {
        for k in 0..j {
            cov[k * d + j] = cov[j * d + k];
        }
    }
    (mean, cov)
}

/// Pathfinder as an engine: its first step runs the whole method and puts `n` importance-
/// resampled draws (with replacement, as Stan's) in place of the particles; later steps leave
/// them. The report carries k-hat, the paths and a warning when k-hat > [`MAX_PARETO_K`].
pub struct Pathfinder {
    config: PathfinderConfig,
    done: bool,
    report: serde_json::Value,
}

impl Pathfinder {
    /// The engine with `config`; an error names an option out of range.
    pub fn new(config: &PathfinderConfig) -> Result<Self, InferError> {
        config.validate()?;
        Ok(Self { config: config.clone(), done: false, report: serde_json::Value::Null })
    }
}

impl Engine for Pathfinder {
    fn name(&self) -> &'static str {
        "pathfinder"
    }

    fn init(&mut self, particles: &Particles) -> Result<(), InferError> {
        if particles.is_empty() {
            return Err(InferError::setting("particles", "pathfinder resamples to the particle count; got 0"));
        }
        Ok(())
    }

    fn step(&mut self, ctx: &mut StepContext<'_>, particles: &mut Particles) -> Result<(), InferError> {
        if self.done {
            return Ok(());
        }
        let device = particles.device();
        let fit = pathfinder(ctx.model, &self.config, ctx.rng, &device)?;
        let n = particles.len();
        let rows = fit.resample(n, true, ctx.rng);
        *particles = Particles::new(matrix_from_vec(rows.iter().map(|&v| v as f32).collect(), n, fit.dim, &device));
        let mut report = fit.summary();
        let warnings = fit.problems(self.config.max_iters, f64::INFINITY);
        report["warnings"] = serde_json::json!(warnings);
        self.report = report;
        self.done = true;
        Ok(())
    }

    fn save(&self) -> EngineState {
        let mut state = EngineState::default();
        state.put_scalar("done", if self.done { 1.0 } else { 0.0 });
        state
    }

    fn load(&mut self, state: &EngineState, _device: &Device) -> Result<(), InferError> {
        self.done = state.scalar("done")? > 0.5;
        Ok(())
    }

    fn report(&self) -> serde_json::Value {
        self.report.clone()
    }
}

impl EngineConfig for PathfinderConfig {
    /// Pathfinder takes no kernel and no step-size rule (its L-BFGS has its own line search):
    /// the shared ones are ignored, as SGLD ignores the kernel.
    fn build(&self, _kernel: &KernelConfig, _adapter: &AdapterConfig) -> Result<Box<dyn Engine>, InferError> {
        Ok(Box::new(Pathfinder::new(self)?))
    }

    fn uses_step_rule(&self) -> bool {
        false
    }
}
