//! Preconditioning by the Laplace approximation: the posterior's mode and curvature, and the
//! target seen in whitened coordinates where that approximation is `N(0, I)`.
//!
//! Particle engines' defaults (unit-scale initial particles, a median-bandwidth kernel shared by
//! every coordinate, step sizes of order 0.05) assume a target of unit scale. Real posteriors
//! have scales from 1e-3 to 1e2 and strong correlations. An affine map `x = m + L z`, `m` the
//! mode and `L L^T = (-H)^-1` the Laplace covariance (`H` the Hessian of `log p` at `m`), turns
//! any such posterior into one of unit scale and no linear correlation near its mode, so one
//! default serves them all; the engines run unchanged on the whitened density (the constant
//! `log |det L|` is dropped). This is the mass-matrix adaptation of NUTS (Hoffman & Gelman 2014)
//! taken from the curvature at the mode, and the "Hessian preconditioner at the MAP" of
//! matrix-valued-kernel SVGD (Wang, Tang, Bajaj & Liu 2019) applied as a change of variables.
//!
//! The mode is found from several starts by Adam (batched: all starts in one call) and polished
//! by Newton steps with a batched backtracking line search; the Hessian is central differences of
//! autodiff scores, all `2 dim` points in one call, each coordinate's step half its Laplace
//! standard deviation (exact for a Gaussian, robust to `f32` noise).

use burn::tensor::{Bool, Device, Tensor, TensorData};
use parvi_model::linalg::host::Cholesky;
use parvi_model::tensor_ops::{matrix_from_vec, to_vec_f64};
use parvi_model::{LogDensity, Minibatch, score};
use serde::{Deserialize, Serialize};

use crate::error::require_positive;
use crate::{AdapterConfig, EngineRng, InferError, Particles, Schedule};

/// How the mode and curvature are searched for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct LaplaceConfig {
    /// Independent starts of the mode search, `N(0, start_std^2 I)` in unconstrained space.
    pub starts: usize,
    /// The spread of the starts.
    pub start_std: f64,
    /// Adam iterations from every start at most (it stops once every start has settled), the
    /// step size decaying from `lr` to `lr / 1000` over them.
    pub adam_steps: usize,
    /// Adam's initial step size.
    pub lr: f64,
    /// Newton iterations on the best start.
    pub newton_steps: usize,
}

impl Default for LaplaceConfig {
    fn default() -> Self {
        Self { starts: 8, start_std: 1.0, adam_steps: 2000, lr: 0.05, newton_steps: 30 }
    }
}

/// The Laplace approximation `N(mode, L L^T)` of a posterior in unconstrained coordinates.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Laplace {
    /// The mode `m` (the MAP in unconstrained coordinates).
    pub mode: Vec<f64>,
    /// `L`, row-major lower triangular `dim x dim`, `L L^T` the covariance.
    pub scale: Vec<f64>,
    /// `log p(m)`.
    pub log_prob: f64,
    /// The Newton decrement `g^T (-H)^-1 g` at the mode: below about 1e-6 the search converged.
    pub newton_decrement: f64,
    /// `false` when the Hessian was not negative definite there and only its diagonal was used.
    pub full_rank: bool,
    /// Score evaluations (one per particle) the search took.
    pub score_evals: usize,
    /// Other modes the search's starts ended at, in the whitened coordinates of this
    /// approximation (`z = L^-1 (x - m)`): end points further than [`SEPARATE_MODE`] from the
    /// mode and from each other, where the whitened gradient is small ([`STATIONARY_GRADIENT`]).
    /// Empty for a posterior with one mode.
    #[serde(default)]
    pub other_modes: Vec<Vec<f64>>,
    /// How far the Laplace evidence `log p(x) + log det(-H(x))^(-1/2)` at the mode falls below
    /// its largest value at the points the search passed through where the smallest marginal
    /// sd was more than 100 times the mode's (nats; 0 when it does not): the search ran away
    /// from the mass (see [`RUNAWAY_NATS`]).
    #[serde(default)]
    pub evidence_drop: f64,
}

/// Adam steps between two looks at the starts' log densities.
const ADAM_LOOK: usize = 50;

/// The mode search's Adam phase stops once no finite start's log density has moved more than
/// this many nats over [`ADAM_LOOK`] steps (Newton's steps finish the best start).
const ADAM_SETTLED_NATS: f64 = 0.01;

/// The mode search's Adam phase also stops once the best start's log density rose less than this
/// over [`ADAM_LOOK`] steps.
const ADAM_CRAWL_NATS: f64 = 0.5;

/// The largest finite value (`-inf` if none).
fn finite_max(v: &[f64]) -> f64 {
    v.iter().copied().filter(|x| x.is_finite()).fold(f64::NEG_INFINITY, f64::max)
}

/// A start further below the best at a look than this, and than [`ADAM_HOPELESS_SPREAD`] times
/// the best's lead over the median start, is moved to the best start (see `Laplace::fit`): an
/// outlier among the starts, not one of a set still spread out (an unscaled regression's starts
/// lie thousands of nats apart for hundreds of steps, and the best of them early is not the
/// one that ends nearest the mode).
const ADAM_HOPELESS_NATS: f64 = 250.0;

/// See [`ADAM_HOPELESS_NATS`].
const ADAM_HOPELESS_SPREAD: f64 = 10.0;

/// The median of the finite values (`-inf` if none).
fn finite_median(v: &[f64]) -> f64 {
    let mut finite: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if finite.is_empty() {
        return f64::NEG_INFINITY;
    }
    finite.sort_by(f64::total_cmp);
    finite[finite.len() / 2]
}

/// Adam steps before the search may stop: half the default budget. Earlier (300 steps) the
/// stop left Newton a start it could not finish on sblrc (an ill-conditioned regression whose
/// starts crawl by less than 0.01 nats per 50 steps far from the mode) and a whitening on
/// gp_pois_regr from which the polish step's chains did not mix (R-hat 1.40).
const ADAM_MIN_STEPS: usize = 1000;
/// Adam steps before a settled search (see [`ADAM_MIN_STEPS`]) may be probed by Newton's method
/// from its best start, and steps between two probes that did not converge. A probe that
/// converges ends the Adam phase there, unless a start may still overtake the best
/// ([`may_overtake`]): on the 20 short posteriordb posteriors the search then stops at 200 to
/// 850 steps on 12 of them, with the modes of the full search (9.5 -> 5.8 s for the 20).
/// A probe is judged by its decrement, which a start Newton cannot finish leaves large (the
/// 300-step stop above left one at 5), and only where `-H` was positive definite without jitter:
/// a jittered decrement proves nothing.
const ADAM_PROBE_FROM: usize = 200;
const ADAM_PROBE_EVERY: usize = 200;
/// A probe converged: Newton's decrement `g^T (-H)^-1 g` below this (a thousandth of a nat
/// squared; the search at its full length reaches 1e-10 and below).
const PROBE_CONVERGED: f64 = 1e-6;
/// A start still climbing fast enough to pass the best start by this many nats before
/// [`ADAM_MIN_STEPS`] (at its climb over the last look) keeps the search going.
const ADAM_OVERTAKE_NATS: f64 = 0.5;

/// Whether a start, climbing on at its rate over the last look `before -> lp`, would pass the
/// best start by more than [`ADAM_OVERTAKE_NATS`] before [`ADAM_MIN_STEPS`]. Lotka-Volterra's
/// best start sits at a local mode (-172.9) from step 300 on while two starts 11 nats below it
/// climb 2 nats a look to the posterior's mode (-133.0): a probe there found the local one.
fn may_overtake(lp: &[f64], before: &[f64], step: usize) -> bool {
    let best = finite_max(lp);
    let looks_left = ADAM_MIN_STEPS.saturating_sub(step) as f64 / ADAM_LOOK as f64;
    lp.iter().zip(before).any(|(now, then)| {
        let climb = if now.is_finite() && then.is_finite() { (now - then).max(0.0) } else { 0.0 };
        now.is_finite() && now + climb * looks_left > best + ADAM_OVERTAKE_NATS
    })
}

/// A Laplace evidence at the mode this many nats below that at a point of the search's path
/// means the search ran away from the posterior's mass: down a funnel's neck, where the density
/// rises without bound while the volume around it shrinks faster. For a Gaussian the evidence
/// is largest at the mode; `e^10` is a ratio of masses no near-Gaussian posterior shows.
pub const RUNAWAY_NATS: f64 = 10.0;

/// Whitened distance (Laplace sds) beyond which a start's end point is another mode: further
/// than any draw of the approximation is likely to be (the 4-sd ball holds all but about 3e-4
/// of a 2-D Gaussian's mass, more in higher dimensions).
pub const SEPARATE_MODE: f64 = 4.0;
/// Largest whitened gradient norm `|L^T g|` (per sqrt(dim)) at which an end point counts as a
/// stationary point rather than a start still on its way (or stuck on a plateau).
pub const STATIONARY_GRADIENT: f64 = 1e-2;

/// The search's end points (`xs`, `[starts, dim]` row-major, with log densities `lp` and
/// scores `grads`) that are separate stationary points of the density, in the whitened
/// coordinates of `N(m, L L^T)`, one per cluster.
fn other_modes(xs: &[f64], lp: &[f64], grads: &[f64], m: &[f64], l: &[f64], dim: usize) -> Vec<Vec<f64>> {
    let mut found: Vec<Vec<f64>> = Vec::new();
    for (k, lp_k) in lp.iter().enumerate() {
        let (x, g) = (&xs[k * dim..(k + 1) * dim], &grads[k * dim..(k + 1) * dim]);
        if !lp_k.is_finite() || !g.iter().all(|v| v.is_finite()) {
            continue;
        }
        // z = L^-1 (x - m) by forward substitution; the whitened gradient is L^T g.
        let mut z = vec![0.0; dim];
        for i in 0..dim {
            let dot: f64 = (0..i).map(|j| l[i * dim + j] * z[j]).sum();
            z[i] = (x[i] - m[i] - dot) / l[i * dim + i];
        }
        let gw: f64 = (0..dim).map(|j| (j..dim).map(|i| l[i * dim + j] * g[i]).sum::<f64>().powi(2)).sum::<f64>();
        let norm = |v: &[f64]| v.iter().map(|a| a * a).sum::<f64>().sqrt();
        let stationary = gw.sqrt() <= STATIONARY_GRADIENT * (dim as f64).sqrt();
        let separate = norm(&z) > SEPARATE_MODE
            && found.iter().all(|f| norm(&f.iter().zip(&z).map(|(a, b)| a - b).collect::<Vec<_>>()) > SEPARATE_MODE);
        if stationary && separate && z.iter().all(|v| v.is_finite()) {
            found.push(z);
        }
    }
    found
}

impl Laplace {
    /// Searches for the mode of `model` (full data) and takes the curvature there.
    pub fn fit(
        model: &dyn LogDensity,
        config: &LaplaceConfig,
        rng: &mut EngineRng,
        device: &Device,
    ) -> Result<Self, InferError> {
        validate(config)?;
        let dim = model.dim();
        let mut evals = 0;
        // Adam from every start at once.
        let start = Particles::gaussian(config.starts, dim, 0.0, config.start_std, rng, device)?;
        let mut x = start.positions;
        let decay = (1e-3f64).powf(1.0 / config.adam_steps.max(1) as f64);
        let mut adam = AdapterConfig::Adam {
            lr: config.lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            schedule: Schedule::Exponential { decay },
        }
        .build()?;
        // The search's path, at 8 points, for the runaway check.
        let every = (config.adam_steps / 8).max(1);
        let mut path: Vec<Tensor<2>> = Vec::new();
        let mut looked: Option<Vec<f64>> = None;
        let (mut probed, mut next_probe) = (None, 0);
        let mut ticker = super::progress::Ticker::new("mode search (Adam)");
        for step in 0..config.adam_steps {
            ticker.tick(|| format!("step {step} of at most {}", config.adam_steps));
            if step % every == 0 {
                path.push(x.clone());
            }
            let s = score(model, x.clone(), None)?;
            evals += config.starts;
            let lp = to_vec_f64(&s.log_prob);
            // Every start settled: Newton takes it from here. An ODE model's score costs a solve
            // per start, and its 2,000 Adam steps were most of a Lotka-Volterra fit.
            if step > 0 && step % ADAM_LOOK == 0 {
                let settled = looked.as_ref().is_some_and(|before| {
                    let all = lp
                        .iter()
                        .zip(before)
                        .all(|(now, then)| !now.is_finite() || (now - then).abs() < ADAM_SETTLED_NATS);
                    // The best start's climb has slowed to a crawl (Adam's decayed step): Newton
                    // finishes it in a few steps; a start still climbing far below it is no mode
                    // yet (the stationarity test of `other_modes` leaves it out either way).
                    let best = finite_max(&lp);
                    let best_before = finite_max(before);
                    all || best - best_before < ADAM_CRAWL_NATS
                });
                if settled && step >= ADAM_MIN_STEPS {
                    break;
                }
                let before = looked.as_deref().unwrap_or(&lp);
                // Before that, a settled search may still stop if Newton, probing from the best
                // start, converges, and no other start climbs fast enough to pass it (a higher
                // mode it is on its way to).
                if settled && step >= ADAM_PROBE_FROM && step >= next_probe && !may_overtake(&lp, before, step) {
                    let best = lp.iter().enumerate().filter(|(_, v)| v.is_finite()).max_by(|a, b| a.1.total_cmp(b.1));
                    if let Some((best, _)) = best {
                        let row = to_vec_f64(&x.clone().narrow(0, best, 1));
                        let end = newton(model, row, vec![1e-2; dim], config.newton_steps, device)?;
                        evals += end.evals;
                        if end.concave && end.decrement < PROBE_CONVERGED {
                            probed = Some(end);
                            break;
                        }
                        next_probe = step + ADAM_PROBE_EVERY;
                    }
                }
                looked = Some(lp.clone());
            }
            // A start whose log density went non-finite (an ODE its parameters break) is moved to
            // the best start: left in place it would cost a failing solve at every step. So is,
            // at a look, a start [`ADAM_HOPELESS_NATS`] below the best: where the parameters are
            // that wrong an ODE's solve takes the most steps, and its mode, if it climbs to one,
            // would hold a negligible share of the mass.
            let best = lp.iter().enumerate().filter(|(_, v)| v.is_finite()).max_by(|a, b| a.1.total_cmp(b.1));
            let look = step > 0 && step % ADAM_LOOK == 0;
            let gap = match best {
                Some((_, &b)) => ADAM_HOPELESS_NATS.max(ADAM_HOPELESS_SPREAD * (b - finite_median(&lp))),
                None => f64::INFINITY,
            };
            let hopeless = |v: f64| !v.is_finite() || (look && best.is_some_and(|(_, b)| v < b - gap));
            if let (Some((best, _)), true) = (best, lp.iter().any(|&v| hopeless(v))) {
                let dead: Vec<bool> = lp.iter().map(|&v| hopeless(v)).collect();
                let mask = Tensor::<2, Bool>::from_data(TensorData::new(dead, [config.starts, 1]), &x.device())
                    .expand([config.starts, dim]);
                let best_row = x.clone().narrow(0, best, 1).expand([config.starts, dim]);
                x = x.mask_where(mask, best_row);
                continue;
            }
            // A coordinate whose score went non-finite stays put; such a start loses at the end.
            let g = s.grad.clone().mask_fill(s.grad.is_finite().bool_not(), 0.0);
            x = x + adam.delta(g);
        }
        let ends = score(model, x.clone(), None)?;
        let (lp, end_grads) = (to_vec_f64(&ends.log_prob), to_vec_f64(&ends.grad));
        evals += config.starts;
        let best = lp
            .iter()
            .enumerate()
            .filter(|(_, v)| v.is_finite())
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i)
            .ok_or_else(|| {
                InferError::Numerical("every start of the mode search reached a non-finite log density".into())
            })?;
        let xs = to_vec_f64(&x);

        // Newton from the best start, or on from a probe's end: the probe stopped at a decrement of
        // 1e-6, and the curvature below is only reliably negative definite in f32 nearer the mode
        // (gp_pois_regr's was not at 1.6e-7 and is at 2.7e-8).
        let end = match probed {
            Some(end) => newton(model, end.mode, end.step_scales, config.newton_steps, device)?,
            None => {
                newton(model, xs[best * dim..(best + 1) * dim].to_vec(), vec![1e-2; dim], config.newton_steps, device)?
            }
        };
        evals += end.evals;
        let (m, mut step_scales, last_decrement) = (end.mode, end.step_scales, end.decrement);
        let mut full_rank = true;

        // The curvature at the mode, with steps of half the Laplace sd (two passes).
        let (log_prob, _) = value_and_score(model, &m, device)?;
        evals += 1;
        let h = curvature(model, &m, &mut step_scales, device)?;
        evals += 4 * dim;
        let neg_h: Vec<f64> = h.iter().map(|v| -v).collect();
        let scale = match Cholesky::factor(&neg_h, dim, 0.0) {
            Ok(factor) => {
                let cov = factor.inverse();
                match Cholesky::factor(&cov, dim, 0.0) {
                    Ok(l) => l.lower().to_vec(),
                    Err(_) => {
                        full_rank = false;
                        diagonal_scale(&h, dim)
                    }
                }
            }
            Err(_) => {
                full_rank = false;
                diagonal_scale(&h, dim)
            }
        };
        if !scale.iter().all(|v| v.is_finite()) {
            return Err(InferError::Numerical("the Laplace scale at the mode is non-finite".into()));
        }
        let other_modes = other_modes(&xs, &lp, &end_grads, &m, &scale, dim);
        // The runaway check: the best start's path against the mode, by their local evidence.
        // At the mode, the volume of the scale actually chosen (the diagonal one where `-H` is
        // not positive definite): log det L = sum log L_ii.
        let mode_evidence =
            Some(log_prob + (0..dim).map(|i| scale[i * dim + i].ln()).sum::<f64>()).filter(|e: &f64| e.is_finite());
        let smallest_sd = (0..dim)
            .map(|i| (0..=i).map(|k| scale[i * dim + k].powi(2)).sum::<f64>().sqrt())
            .fold(f64::INFINITY, f64::min);
        let mut evidence_drop = 0.0f64;
        for point in &path {
            let row = to_vec_f64(point)[best * dim..(best + 1) * dim].to_vec();
            let (lp_row, _) = value_and_score(model, &row, device)?;
            let mut steps = vec![1e-2; dim];
            evals += 1 + 4 * dim;
            let Ok(h_row) = curvature(model, &row, &mut steps, device) else {
                continue;
            };
            // Only a fall that comes with a direction's scale collapsing (100-fold) counts: near
            // the inflection of a heavy tail the evidence is large because the curvature
            // vanishes there, not because the mode's volume collapsed.
            if let (Some((e, sd_row)), Some(e_mode)) = (evidence(lp_row, &h_row, dim), mode_evidence)
                && smallest_sd < 0.01 * sd_row
            {
                evidence_drop = evidence_drop.max(e - e_mode);
            }
        }
        Ok(Self {
            mode: m,
            scale,
            log_prob,
            newton_decrement: last_decrement,
            full_rank,
            score_evals: evals,
            other_modes,
            evidence_drop,
        })
    }

    /// Why this approximation should not whiten a run, if it should not: the search ran away
    /// (the evidence at the mode fell more than [`RUNAWAY_NATS`] below that on its path).
    pub fn runaway(&self) -> Option<String> {
        (self.evidence_drop > RUNAWAY_NATS).then(|| {
            let smallest = self.smallest_sd();
            format!(
                "the Laplace mode search ran away from the posterior's mass: the log density rose to {:.3e} at the mode while the volume around it shrank faster (smallest Laplace sd {smallest:.2e}; the Laplace evidence there is {:.1} nats below that on the search's path, > {RUNAWAY_NATS})",
                self.log_prob, self.evidence_drop
            )
        })
    }

    /// Why this approximation should not be a frame, if it should not (issue 59: "a mode search
    /// that runs toward a boundary is never a frame"): the search ran away ([`Self::runaway`]),
    /// or it ended where `-H` is not positive definite. There the point is no mode: a scale is
    /// going to 0 (a centred funnel's neck, where the curvature of the group effects grows
    /// without bound while that of their scale turns positive) or the density is flat, and the
    /// diagonal fallback's sds are no posterior's scales. On the posteriordb posteriors at seed 0
    /// (`examples/frame_survey.rs`) the search ends so on eight: eight_schools_centered (smallest
    /// sd 7.3e-7), GLMM_Poisson (Newton decrement 58), pilots, election88, accel_splines,
    /// hier_2pl, soil_incubation and accel_gp; on 28 it ends at a mode (hmm_gaussian's fails;
    /// bym2's did not end in 15 minutes). The diagonal fallback is kept for [`Self::scale`] (the
    /// Laplace draws of `optimize --laplace`), not for a frame.
    pub fn not_a_frame(&self) -> Option<String> {
        if let Some(why) = self.runaway() {
            return Some(why);
        }
        (!self.full_rank).then(|| {
            let smallest = self.smallest_sd();
            format!(
                "the Laplace mode search found no mode: -H is not positive definite where it ended (log density {:.4e}, Newton decrement {:.1e}, smallest sd of the diagonal {smallest:.2e}): a scale going to 0 or a flat direction, whose curvature is no covariance",
                self.log_prob, self.newton_decrement
            )
        })
    }

    /// The dimension.
    pub fn dim(&self) -> usize {
        self.mode.len()
    }

    /// The Laplace standard deviation of every coordinate.
    pub fn sd(&self) -> Vec<f64> {
        let d = self.dim();
        (0..d).map(|i| (0..=i).map(|k| self.scale[i * d + k].powi(2)).sum::<f64>().sqrt()).collect()
    }

    /// The smallest of [`Self::sd`]: near 0, a scale run down a funnel's neck.
    pub fn smallest_sd(&self) -> f64 {
        self.sd().into_iter().fold(f64::INFINITY, f64::min)
    }
}

/// Where Newton's iterations from a start ended.
struct NewtonEnd {
    mode: Vec<f64>,
    /// The finite-difference steps of the last curvature (half the Laplace sds there).
    step_scales: Vec<f64>,
    /// `g^T (-H)^-1 g` at the last iteration.
    decrement: f64,
    /// Whether `-H` was positive definite there without Levenberg-Marquardt's jitter (a
    /// decrement through the jitter is no proof of a mode).
    concave: bool,
    evals: usize,
}

/// Newton's method from `m`, at most `iterations` steps, each with a batched backtracking line
/// search (Levenberg-Marquardt jitter where `-H` is not positive definite); it stops at a
/// decrement below 1e-10 or where no step along the direction raises `log p`.
fn newton(
    model: &dyn LogDensity,
    mut m: Vec<f64>,
    mut step_scales: Vec<f64>,
    iterations: usize,
    device: &Device,
) -> Result<NewtonEnd, InferError> {
    let dim = m.len();
    let (mut evals, mut decrement, mut concave) = (0, f64::INFINITY, false);
    for _ in 0..iterations {
        let (lp0, g) = value_and_score(model, &m, device)?;
        evals += 1;
        let h = curvature(model, &m, &mut step_scales, device)?;
        evals += 4 * dim;
        let neg_h: Vec<f64> = h.iter().map(|v| -v).collect();
        // Levenberg-Marquardt: where `-H` is not positive definite (far from the mode of a
        // non-concave density), jitter on its diagonal turns the step towards the gradient.
        let plain = Cholesky::factor(&neg_h, dim, 0.0);
        concave = plain.is_ok();
        let factor = plain.or_else(|_| Cholesky::factor_with_jitter(&neg_h, dim, 1e-8, 6));
        let Ok(factor) = factor else {
            break;
        };
        let delta = factor.solve(&g);
        decrement = g.iter().zip(&delta).map(|(a, b)| a * b).sum::<f64>();
        if decrement < 1e-10 {
            break;
        }
        let ts: Vec<f64> = (0..10).map(|k| 0.5f64.powi(k)).collect();
        let candidates: Vec<f32> =
            ts.iter().flat_map(|t| m.iter().zip(&delta).map(move |(a, d)| (a + t * d) as f32)).collect();
        let lps = to_vec_f64(&model.log_prob(matrix_from_vec(candidates, ts.len(), dim, device), None));
        evals += ts.len();
        match lps.iter().position(|v| v.is_finite() && *v > lp0) {
            Some(k) => m.iter_mut().zip(&delta).for_each(|(a, d)| *a += ts[k] * d),
            None => break,
        }
    }
    Ok(NewtonEnd { mode: m, step_scales, decrement, concave, evals })
}

/// The Laplace evidence at a point with log density `lp` and Hessian `h`:
/// `lp - log det(-h) / 2` (the `log 2 pi` term, the same everywhere, dropped), and the smallest
/// marginal sd of `(-h)^-1`; `None` where `-h` is not positive definite (no local Gaussian to
/// integrate).
fn evidence(lp: f64, h: &[f64], dim: usize) -> Option<(f64, f64)> {
    let neg: Vec<f64> = h.iter().map(|v| -v).collect();
    let factor = Cholesky::factor(&neg, dim, 0.0).ok()?;
    let e = lp - 0.5 * factor.log_det();
    let smallest_sd = diagonal_sd(&factor.inverse(), dim).into_iter().fold(f64::INFINITY, f64::min);
    e.is_finite().then_some((e, smallest_sd))
}

/// `log p` and the score at one point, on the host.
fn value_and_score(model: &dyn LogDensity, x: &[f64], device: &Device) -> Result<(f64, Vec<f64>), InferError> {
    let t = matrix_from_vec(x.iter().map(|&v| v as f32).collect(), 1, x.len(), device);
    let s = score(model, t, None)?;
    Ok((to_vec_f64(&s.log_prob)[0], to_vec_f64(&s.grad)))
}

/// The Hessian of `log p` at `x` (row-major, symmetrised) by central differences of the score,
/// step `h_i` in coordinate `i`: all `2 dim` points in one batched call.
fn hessian(model: &dyn LogDensity, x: &[f64], steps: &[f64], device: &Device) -> Result<Vec<f64>, InferError> {
    let d = x.len();
    let mut points = Vec::with_capacity(2 * d * d);
    for sign in [1.0, -1.0] {
        for (i, step) in steps.iter().enumerate() {
            points.extend(x.iter().enumerate().map(|(j, &v)| (if j == i { v + sign * step } else { v }) as f32));
        }
    }
    let g = to_vec_f64(&score(model, matrix_from_vec(points, 2 * d, d, device), None)?.grad);
    let mut h = vec![0.0; d * d];
    for i in 0..d {
        for j in 0..d {
            h[j * d + i] = (g[i * d + j] - g[(d + i) * d + j]) / (2.0 * steps[i]);
        }
    }
    for i in 0..d {
        for j in 0..i {
            let v = 0.5 * (h[i * d + j] + h[j * d + i]);
            h[i * d + j] = v;
            h[j * d + i] = v;
        }
    }
    if let Some(k) = h.iter().position(|v| !v.is_finite()) {
        return Err(InferError::Numerical(format!(
            "the Hessian at the mode is non-finite in entry ({}, {})",
            k / d,
            k % d
        )));
    }
    Ok(h)
}

/// The Hessian at `x` in two passes: a first with the given steps, then with each step half the
/// coordinate's Laplace sd from the first (the conditional sd `1 / sqrt(|H_ii|)` where `-H` is
/// not positive definite). In `f32` a step far below a coordinate's scale leaves the score's
/// change in the rounding of the other coordinates; one near it is exact for a Gaussian. `steps`
/// is updated to the second pass's.
fn curvature(model: &dyn LogDensity, x: &[f64], steps: &mut Vec<f64>, device: &Device) -> Result<Vec<f64>, InferError> {
    let d = x.len();
    let first = hessian(model, x, steps, device)?;
    let neg: Vec<f64> = first.iter().map(|v| -v).collect();
    let sd = match Cholesky::factor(&neg, d, 0.0) {
        Ok(factor) => diagonal_sd(&factor.inverse(), d),
        Err(_) => (0..d).map(|i| 1.0 / first[i * d + i].abs().max(1e-12).sqrt()).collect(),
    };
    let refined: Vec<f64> = sd.iter().map(|s| (0.5 * s).clamp(1e-6, 1e3)).collect();
    // Steps so large that the density goes non-finite keep the first pass.
    match hessian(model, x, &refined, device) {
        Ok(h) => {
            *steps = refined;
            Ok(h)
        }
        Err(_) => Ok(first),
    }
}

fn diagonal_sd(cov: &[f64], d: usize) -> Vec<f64> {
    (0..d).map(|i| cov[i * d + i].max(1e-300).sqrt()).collect()
}

/// `L = diag(1 / sqrt(|H_ii|))`, the fallback when `-H` is not positive definite.
fn diagonal_scale(h: &[f64], d: usize) -> Vec<f64> {
    let mut l = vec![0.0; d * d];
    for i in 0..d {
        let curvature = h[i * d + i].abs();
        l[i * d + i] = if curvature > 0.0 { 1.0 / curvature.sqrt() } else { 1.0 };
    }
    l
}

fn validate(config: &LaplaceConfig) -> Result<(), InferError> {
    if config.starts == 0 {
        return Err(InferError::setting("laplace.starts", "need at least one start, got 0"));
    }
    require_positive("laplace.start-std", config.start_std)?;
    require_positive("laplace.lr", config.lr)?;
    Ok(())
}

/// A density seen through the affine map `x = m + L z`: `log q(z) = log p(m + L z)` (the constant
/// `log |det L|` dropped). Engines run on it unchanged; [`Whitened::to_original`] maps their
/// particles back.
pub struct Whitened<'a> {
    model: &'a dyn LogDensity,
    /// `m` as `[1, dim]`.
    shift: Tensor<2>,
    /// `L^T` `[dim, dim]`: `x = z L^T + m` for row vectors.
    scale_t: Tensor<2>,
}

impl<'a> Whitened<'a> {
    /// `model` in the coordinates where `laplace` is `N(0, I)`.
    pub fn new(model: &'a dyn LogDensity, laplace: &Laplace, device: &Device) -> Result<Self, InferError> {
        Self::affine(model, &laplace.mode, &laplace.scale, device)
    }

    /// `model` in the coordinates `z` of `x = shift + scale z` (`scale` row-major `dim x dim`,
    /// e.g. the Cholesky factor of an approximation's covariance).
    pub fn affine(
        model: &'a dyn LogDensity,
        shift: &[f64],
        scale: &[f64],
        device: &Device,
    ) -> Result<Self, InferError> {
        let d = model.dim();
        if shift.len() != d || scale.len() != d * d {
            return Err(InferError::setting(
                "precondition",
                format!("an approximation of dimension {} for a model of dimension {d}", shift.len()),
            ));
        }
        let mut lt = vec![0.0f32; d * d];
        for i in 0..d {
            for j in 0..d {
                lt[j * d + i] = scale[i * d + j] as f32;
            }
        }
        Ok(Self {
            model,
            shift: matrix_from_vec(shift.iter().map(|&v| v as f32).collect(), 1, d, device),
            scale_t: matrix_from_vec(lt, d, d, device),
        })
    }

    /// Whitened positions `[n, dim]` in the model's own coordinates.
    pub fn to_original(&self, z: Tensor<2>) -> Tensor<2> {
        z.matmul(self.scale_t.clone()) + self.shift.clone()
    }

    /// A particle set in the model's own coordinates (weights unchanged).
    pub fn particles_to_original(&self, particles: &Particles) -> Particles {
        Particles { positions: self.to_original(particles.positions.clone()), weights: particles.weights.clone() }
    }
}

impl LogDensity for Whitened<'_> {
    fn dim(&self) -> usize {
        self.model.dim()
    }

    fn data_len(&self) -> Option<usize> {
        self.model.data_len()
    }

    fn log_prob(&self, z: Tensor<2>, batch: Option<&Minibatch>) -> Tensor<1> {
        self.model.log_prob(self.to_original(z), batch)
    }

    // The model's own error: without it a failed call (an ODE solve) reads as a density with no
    // gradient.
    fn take_error(&self) -> Option<parvi_model::ModelError> {
        self.model.take_error()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_climbing_towards_a_higher_mode_keeps_the_search_going() {
        // Lotka-Volterra at step 300: the best start at its local mode, one 11 nats below
        // climbing 2 nats a look, one far below climbing slowly, one that is not finite.
        let before = [-172.92, -186.0, -260.0, f64::NAN];
        let now = [-172.91, -184.0, -259.5, f64::NAN];
        assert!(may_overtake(&now, &before, 300));
        // The same climb with two looks left cannot close 11 nats.
        assert!(!may_overtake(&now, &before, 900));
        // Starts that settled at the best start's mode, a hair below it, do not count.
        let settled = [-172.91, -172.9105, -172.911, -200.0];
        assert!(!may_overtake(&settled, &[-172.92, -172.911, -172.912, -200.0], 300));
    }
}
