//! The frame: the coordinates the particles, the check and the polish step run in, and where
//! the particles start. The Laplace approximation at the mode, or Pathfinder's, whitens the model;
//! a search that failed, ran away or found no mode ([`Laplace::not_a_frame`]) falls back to
//! the other, then to the model's own coordinates. Each search tried is a phase of the path.

use burn::tensor::{Device, Tensor};
use parvi_model::LogDensity;

use super::path::{Counted, Phase};
use super::{FitConfig, MAX_PATH_DISAGREEMENT, Precondition};
use crate::engines::pathfinder::{PathfinderFit, pathfinder};
use crate::{EngineRng, InferError, Laplace, Particles, Whitened};

/// The frame a fit runs in ([`frame`]).
pub(super) struct Frame<'a> {
    /// What the searches found.
    pub pre: Prepared,
    /// The model whitened by the approximation used; `None`: its own coordinates.
    pub whitened: Option<Whitened<'a>>,
}

/// Runs the searches `config` asks for (one [`Phase`] each, appended to `path`) and whitens
/// `model` by the approximation used.
pub(super) fn frame<'a>(
    model: &'a Counted<'a>,
    config: &FitConfig,
    rng: &mut EngineRng,
    device: &Device,
    path: &mut Vec<Phase>,
) -> Result<Frame<'a>, InferError> {
    let pre = precondition(model, config, rng, device, path);
    let whitened = match (&pre.laplace, &pre.whitening) {
        (Some(l), _) => Some(Whitened::new(model, l, device)?),
        (None, Some(w)) => Some(Whitened::affine(model, &w.shift, &w.scale, device)?),
        (None, None) => None,
    };
    Ok(Frame { pre, whitened })
}

impl<'a> Frame<'a> {
    /// The model as the engine sees it: whitened, or as it is.
    pub fn target(&self, model: &'a Counted<'a>) -> &dyn LogDensity {
        match &self.whitened {
            Some(w) => w,
            None => model,
        }
    }

    /// Positions `[n, dim]` in the frame mapped to the model's own coordinates.
    pub fn to_model(&self, z: Tensor<2>) -> Tensor<2> {
        match &self.whitened {
            Some(w) => w.to_original(z),
            None => z,
        }
    }

    /// A particle set in the frame mapped to the model's own coordinates.
    pub fn back(&self, p: &Particles) -> Particles {
        match &self.whitened {
            Some(w) => w.particles_to_original(p),
            None => p.clone(),
        }
    }

    /// The frame's map `x = shift + L z` (`L` lower triangular, row-major), where it whitens.
    pub fn affine(&self) -> Option<(&[f64], &[f64])> {
        match (&self.pre.laplace, &self.pre.whitening) {
            (Some(l), _) => Some((&l.mode, &l.scale)),
            (None, Some(w)) => Some((&w.shift, &w.scale)),
            (None, None) => None,
        }
    }

    /// The frame in words, for the path.
    pub fn describe(&self) -> &'static str {
        match self.pre.used {
            Precondition::Laplace => "in the Laplace frame",
            Precondition::Pathfinder => "in Pathfinder's frame",
            Precondition::None => "in the model's own coordinates",
        }
    }

    /// The start particles in the frame: `N(0, init_std^2 I)`, or Pathfinder's whitened draws
    /// where it whitens; over several modes, spread over all of them in turn (the best mode,
    /// then each other one), each share around its mode as they would be around the one.
    pub fn start(&self, config: &FitConfig, rng: &mut EngineRng, device: &Device) -> Result<Particles, InferError> {
        let dim = self.pre.dim;
        let mut start = Particles::gaussian(config.particles, dim, 0.0, config.init_std, rng, device)?;
        if let Some(w) = &self.pre.whitening {
            start = Particles::from_rows(w.start.iter().map(|&v| v as f32).collect(), config.particles, dim, device)?;
        }
        if let Some(l) = self.pre.laplace.as_ref().filter(|l| !l.other_modes.is_empty()) {
            let centres: Vec<Vec<f64>> = std::iter::once(vec![0.0; dim]).chain(l.other_modes.clone()).collect();
            let offsets: Vec<f32> =
                (0..config.particles).flat_map(|i| centres[i % centres.len()].iter().map(|&v| v as f32)).collect();
            start.positions =
                start.positions + parvi_model::tensor_ops::matrix_from_vec(offsets, config.particles, dim, device);
        }
        Ok(start)
    }
}

/// What the preconditioning chose: the approximation the engine runs in, with the warnings of
/// any fallback on the way.
pub(super) struct Prepared {
    /// The Laplace approximation, when it whitens.
    pub laplace: Option<Laplace>,
    /// Pathfinder's run, when one was made (used or not).
    pub pathfinder: Option<PathfinderFit>,
    /// Pathfinder's whitening, when it whitens.
    pub whitening: Option<Whitening>,
    /// The preconditioner used in the end.
    pub used: Precondition,
    /// Why a preconditioner was not used: the search's name and the reason, with what came
    /// next.
    pub fallbacks: Vec<(&'static str, String)>,
    /// Whether the Laplace search ran away ([`Laplace::runaway`]): the density rose without
    /// bound towards a boundary along its path (a funnel's neck).
    pub ran_away: bool,
    /// The model's dimension.
    dim: usize,
}

/// An affine whitening `x = shift + scale z` and the initial particles in its coordinates.
pub(super) struct Whitening {
    shift: Vec<f64>,
    /// Lower triangular, row-major `dim x dim`.
    scale: Vec<f64>,
    /// Row-major `[particles, dim]`.
    start: Vec<f64>,
}

/// Runs the preconditioner `config` asks for and falls back from one that failed or ran away:
/// Laplace to Pathfinder, Pathfinder to Laplace, either to none. The whitening must never come
/// from a point where the density runs away (a funnel's neck, a flat direction): it would put
/// the engine's whole unit scale where the posterior has no mass.
fn precondition(
    model: &Counted<'_>,
    config: &FitConfig,
    rng: &mut EngineRng,
    device: &Device,
    path: &mut Vec<Phase>,
) -> Prepared {
    let mut out = Prepared {
        laplace: None,
        pathfinder: None,
        whitening: None,
        used: Precondition::None,
        fallbacks: vec![],
        ran_away: false,
        dim: model.dim(),
    };
    let order = match config.precondition {
        Precondition::None => return out,
        Precondition::Laplace => [Precondition::Laplace, Precondition::Pathfinder],
        Precondition::Pathfinder => [Precondition::Pathfinder, Precondition::Laplace],
    };
    for (attempt, kind) in order.into_iter().enumerate() {
        let watch = model.stopwatch();
        let mut did = String::new();
        let problem = match kind {
            Precondition::Laplace => {
                crate::core::progress::phase("preconditioner: Laplace mode search (Adam, then Newton)");
                match Laplace::fit(model, &config.laplace, rng, device) {
                    Ok(l) => {
                        did = format!(
                            "mode at log density {:.4e}, Newton decrement {:.1e}, smallest sd {:.2e}",
                            l.log_prob,
                            l.newton_decrement,
                            l.smallest_sd()
                        );
                        out.ran_away |= l.runaway().is_some();
                        match l.not_a_frame() {
                            Some(why) => Some(why),
                            None => {
                                out.laplace = Some(l);
                                None
                            }
                        }
                    }
                    Err(e) => Some(format!("the Laplace search failed ({e})")),
                }
            }
            _ => {
                let mut options = config.pathfinder.clone();
                options.draws_per_path =
                    options.draws_per_path.max((2 * config.particles).div_ceil(options.paths.max(1)));
                crate::core::progress::phase("preconditioner: Pathfinder");
                match pathfinder(model, &options, rng, device) {
                    Ok(fit) => {
                        did = format!("{} paths, Pareto k-hat {:.2}", fit.paths.len(), fit.pareto_k);
                        let problems = fit.problems(options.max_iters, MAX_PATH_DISAGREEMENT);
                        let verdict = if problems.is_empty() {
                            match pathfinder_whitening(&fit, config, rng) {
                                Ok(w) => {
                                    out.whitening = Some(w);
                                    None
                                }
                                Err(e) => Some(e),
                            }
                        } else {
                            Some(problems.join("; "))
                        };
                        out.pathfinder = Some(fit);
                        verdict
                    }
                    Err(e) => Some(format!("Pathfinder failed ({e})")),
                }
            }
        };
        let name = match kind {
            Precondition::Laplace => "laplace",
            _ => "pathfinder",
        };
        match problem {
            None => {
                path.push(watch.phase(model, name, did, "the frame".into()));
                out.used = kind;
                return out;
            }
            Some(why) => {
                let next = if attempt == 0 {
                    match order[1] {
                        Precondition::Laplace => "trying the Laplace preconditioner",
                        _ => "trying Pathfinder's",
                    }
                } else {
                    "no preconditioning: the particles start from N(0, init_std^2 I) in the model's own coordinates"
                };
                path.push(watch.phase(model, name, did, format!("not used ({next})")));
                out.fallbacks.push((name, format!("{why}; {next}")));
            }
        }
    }
    out
}

/// Pathfinder's whitening: the importance-weighted mean, the Cholesky factor of the weighted
/// covariance, and `particles` distinct resampled draws in those coordinates (times `init_std`).
fn pathfinder_whitening(fit: &PathfinderFit, config: &FitConfig, rng: &mut EngineRng) -> Result<Whitening, String> {
    let d = fit.dim;
    let factor = parvi_model::linalg::host::Cholesky::factor(&fit.covariance, d, 0.0)
        .map_err(|e| format!("Pathfinder's weighted covariance is not positive definite ({e})"))?;
    let l = factor.lower().to_vec();
    let draws = fit.resample(config.particles, false, rng);
    let mut z = vec![0.0; draws.len()];
    for (row, out) in draws.chunks(d).zip(z.chunks_mut(d)) {
        // z = L^-1 (x - m) by forward substitution.
        for i in 0..d {
            let dot: f64 = (0..i).map(|j| l[i * d + j] * out[j]).sum();
            out[i] = (row[i] - fit.mean[i] - dot) / l[i * d + i];
        }
    }
    z.iter_mut().for_each(|v| *v *= config.init_std);
    if !z.iter().all(|v| v.is_finite()) {
        return Err("Pathfinder's draws are non-finite in its whitened coordinates".into());
    }
    Ok(Whitening { shift: fit.mean.clone(), scale: l, start: z })
}
