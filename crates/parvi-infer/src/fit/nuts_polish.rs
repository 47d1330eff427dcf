//! NUTS as the polish step's last kernel (issue 45: the default path right on latent-variable
//! models). Where MALA, autoMALA and ChEES-HMC leave the chains unmixed (a hierarchical scale
//! against its item effects, a volatility's scale against hundreds of latent innovations), Stan's
//! sampler is what a Stan user would have run: [`NUTS_CHAINS`] chains x (1,000 warm-up + 1,000
//! draws), Stan's adaptation (a diagonal metric per chain), in the coordinates the engine ran in,
//! started from the polish step's chains or Stan's own inits, whichever have the higher log
//! density (a chain stranded in the tail costs NUTS its warm-up to leave). The draws are judged
//! by the polish step's own rule on the same reported quantities ([`chains_statistic`]).
//!
//! Stan's NUTS adapts a diagonal metric; where the chains that did not mix left enough draws (at
//! least 10 per dimension, up to [`DENSE_MAX_DIM`] dimensions), NUTS runs in the frame of their
//! regularised covariance `x = m + L u` instead, so its diagonal adaptation there is a dense
//! metric for the target (Stan's `dense_e`), which a whitening by the Hessian's diagonal alone
//! leaves correlated (docs/posteriordb.md at 8a480ca, accel_gp).
//!
//! Where no such frame applies (more dimensions, too few draws), the frame the engine ran in is
//! verified, not trusted (issue 59): a Laplace mode far from the posterior's mass (group scales
//! 6-9x the posterior's, a scale run down a funnel's neck) whitens by a curvature that is a poor
//! metric. NUTS runs in the frame or in the model's own coordinates, whichever leaves the chains'
//! draws the better conditioned correlation (what a diagonal metric cannot adapt away) by more
//! than sampling noise explains, the frame otherwise ([`choose_coordinates`]); the report keeps
//! both condition numbers.

use std::time::Instant;

use burn::tensor::{Device, Int, Tensor, TensorData};
use parvi_model::LogDensity;
use parvi_model::tensor_ops::{matrix_from_vec, to_vec_f32};

use parvi_model::linalg::host::Cholesky;

use crate::engines::{NutsConfig, NutsInit, nuts};
use crate::samplers::{
    DENSE_MAX_DIM, FrameChoice, NUTS_CHAINS, Polish, PolishConfig, PolishKernel, Polished, chains_statistic,
    regularised_covariance,
};
use crate::{EngineRng, InferError, Whitened};

/// Warm-up iterations and kept draws per chain (Stan's defaults).
const NUTS_WARMUP: usize = 1000;
const NUTS_DRAWS: usize = 1000;

/// The model in its own coordinates beside the frame `target` is in: `x = shift + L z` (`L`
/// lower triangular, row-major `d x d`), so that NUTS may run in either.
pub(super) struct OwnCoordinates<'a> {
    pub model: &'a dyn LogDensity,
    pub shift: &'a [f64],
    pub lower: &'a [f64],
    /// Run in the model's coordinates whatever the evidence ([`super::NutsFrame::Own`]).
    pub forced: bool,
}

impl OwnCoordinates<'_> {
    /// Rows `z` (`d` values each) in the model's coordinates: `shift + L z`.
    fn to_own(&self, z: &[f64]) -> Vec<f64> {
        let d = self.shift.len();
        z.chunks(d)
            .flat_map(|z| {
                (0..d).map(move |i| self.shift[i] + (0..=i).map(|k| self.lower[i * d + k] * z[k]).sum::<f64>())
            })
            .collect()
    }

    /// Rows `x` in the frame: `L^-1 (x - shift)`, by forward substitution.
    fn to_frame(&self, x: &[f64]) -> Vec<f64> {
        let d = self.shift.len();
        let mut z = vec![0.0; x.len()];
        for (x, z) in x.chunks(d).zip(z.chunks_mut(d)) {
            for i in 0..d {
                let dot: f64 = (0..i).map(|k| self.lower[i * d + k] * z[k]).sum();
                z[i] = (x[i] - self.shift[i] - dot) / self.lower[i * d + i];
            }
        }
        z
    }
}

/// NUTS from `starts` `[k, d]` (the chains' positions, `k >= 1`) under `target`, in the frame of
/// `kept` draws' covariance where they suffice (module docs; `&[]` for none), else, given `own`,
/// in the frame or the model's own coordinates, whichever the draws (`kept`, or `starts` where
/// none were kept) pick. Returns the draws (in `target`'s coordinates), their report, and Stan's
/// warnings (divergences, tree depth, E-BFMI).
#[allow(clippy::too_many_arguments)]
pub(super) fn nuts_polish(
    target: &dyn LogDensity,
    own: Option<&OwnCoordinates<'_>>,
    starts: Tensor<2>,
    kept: &[f32],
    config: &PolishConfig,
    seed: u64,
    reported: Option<&dyn Fn(Tensor<2>) -> Tensor<2>>,
    device: &Device,
) -> Result<(Polished, Vec<String>), InferError> {
    let started = Instant::now();
    let [k, d] = starts.dims();
    crate::core::progress::phase(&format!(
        "NUTS: {NUTS_CHAINS} chains of {NUTS_WARMUP} warm-up and {NUTS_DRAWS} draws"
    ));
    let frame = dense_frame(kept, d);
    let choice = match (&frame, own) {
        (None, Some(own)) => {
            let evidence = if kept.len() >= 2 * d { kept.to_vec() } else { to_vec_f32(&starts) };
            Some(choose_coordinates(&evidence, d, own))
        }
        _ => None,
    };
    let own = own.filter(|_| choice.as_ref().is_some_and(|c| c.own));
    let mut inits = chain_inits(target, starts, k, seed)?;
    if let Some(own) = own {
        inits = own.to_own(&inits);
    }
    let framed = match &frame {
        Some((mean, l)) => {
            // The starts in the frame's coordinates: u = L^-1 (x - m).
            inits = inits
                .chunks(d)
                .flat_map(|x| {
                    let centred: Vec<f64> = x.iter().zip(mean).map(|(a, b)| a - b).collect();
                    l.forward(&centred)
                })
                .collect();
            Some(Whitened::affine(target, mean, l.lower(), device)?)
        }
        None => None,
    };
    let sampled: &dyn LogDensity = match (&framed, own) {
        (Some(w), _) => w,
        (None, Some(own)) => own.model,
        (None, None) => target,
    };
    let nuts_config = NutsConfig {
        chains: NUTS_CHAINS,
        warmup: NUTS_WARMUP,
        draws: NUTS_DRAWS,
        init: NutsInit::Particles,
        ..NutsConfig::default()
    };
    let run = nuts(sampled, &nuts_config, Some(&inits), &mut EngineRng::new(seed ^ 0x4E55_7450), device)?;
    let rows = run.draws_per_chain * run.chains;
    let values = match own {
        Some(own) => own.to_frame(&run.draws),
        None => run.draws.clone(),
    };
    let draws = matrix_from_vec(values.iter().map(|&v| v as f32).collect(), rows, d, device);
    let draws = match &framed {
        Some(w) => w.to_original(draws),
        None => draws,
    };
    let log_prob = Tensor::<1>::from_data(
        TensorData::new(run.log_prob.iter().map(|&v| v as f32).collect::<Vec<_>>(), [rows]),
        device,
    );
    let (max_rhat, min_ess) = chains_statistic(draws.clone(), log_prob, run.chains, reported)?;
    let reports = &run.chain_reports;
    let m = reports.len() as f64;
    let report = Polish {
        chains: run.chains,
        warmup: NUTS_WARMUP,
        steps: run.gradients() / run.chains,
        iterations: run.draws_per_chain,
        thin: 1,
        kept: run.draws_per_chain,
        kernel: PolishKernel::Nuts,
        stuck_share: f64::NAN,
        step_size: reports.iter().map(|c| c.step_size).sum::<f64>() / m,
        trajectory_length: None,
        dense_metric: frame.is_some(),
        divergences: reports.iter().map(|c| c.divergences).sum(),
        failed_evaluations: reports.iter().map(|c| c.failed_evaluations).sum(),
        first_failure: reports.iter().find_map(|c| c.first_failure.clone()),
        acceptance: reports.iter().map(|c| c.mean_accept_stat).sum::<f64>() / m,
        max_rhat,
        min_ess,
        converged: max_rhat <= config.rhat && min_ess >= config.ess,
        score_evals: run.gradients(),
        from_start: false,
        seconds: started.elapsed().as_secs_f64(),
        before_nuts: None,
        mala_before_chees: None,
        frame_choice: choice,
    };
    // Stan's warnings name the NUTS method's options; here NUTS is the polish step's.
    let warnings =
        run.warnings.iter().map(|w| format!("the polish step's NUTS: {}", w.trim_start_matches("nuts: "))).collect();
    Ok((Polished { draws, report }, warnings))
}

/// The mean and the Cholesky factor of the covariance of `kept` draws (row-major, `d` values
/// each), where there are at least `10 d` of them, `d <= DENSE_MAX_DIM`, and the factor exists.
fn dense_frame(kept: &[f32], d: usize) -> Option<(Vec<f64>, Cholesky)> {
    if d > DENSE_MAX_DIM || kept.len() < 10 * d * d {
        return None;
    }
    let (mean, cov) = regularised_covariance(kept, d);
    let l = Cholesky::factor(&cov, d, 0.0).ok()?;
    l.lower().iter().all(|v| v.is_finite()).then_some((mean, l))
}

/// Rows of evidence kept at most by [`choose_coordinates`] (evenly thinned): its cost is
/// `rows d^2` on the host.
const EVIDENCE_ROWS: usize = 2000;

/// Where NUTS runs: in the frame (`evidence`'s coordinates, rows of `d`) or in the model's own
/// coordinates, whichever leaves the draws' correlation matrix the smaller condition number (a
/// diagonal metric adapts the scales, not the correlation), by more than sampling noise
/// explains ([`FrameChoice::evidence_picks_own`]); else the frame stays.
pub(super) fn choose_coordinates(evidence: &[f32], d: usize, own: &OwnCoordinates<'_>) -> FrameChoice {
    let n = evidence.len() / d;
    let every = n.div_ceil(EVIDENCE_ROWS).max(1);
    let z: Vec<f64> = evidence.chunks(d).step_by(every).flatten().map(|&v| f64::from(v)).collect();
    let in_frame = correlation_condition(&z, d);
    let in_own = correlation_condition(&own.to_own(&z), d);
    let rows = z.len() / d;
    let mut choice = FrameChoice {
        own: false,
        condition_frame: in_frame,
        condition_own: in_own,
        noise: noise_condition(rows, d),
        draws: rows,
    };
    choice.own = own.forced || choice.evidence_picks_own();
    choice
}

/// The condition number of the correlation of `n` independent draws in `d` dimensions from
/// sampling noise alone, under [`correlation_condition`]'s shrinkage: the ratio of the
/// Marchenko-Pastur edges `(1 +- sqrt(d / n))^2` (the lower one 0 where `d >= n`), each shrunk
/// towards 1 by `d / (n + d)`.
fn noise_condition(n: usize, d: usize) -> f64 {
    let (n, d) = (n as f64, d as f64);
    let ratio = (d / n).sqrt();
    let lambda = d / (n + d);
    let edge = |mu: f64| (1.0 - lambda) * mu + lambda;
    edge((1.0 + ratio).powi(2)) / edge((1.0 - ratio).max(0.0).powi(2))
}

/// The condition number of the correlation matrix of `rows` (`d` values each), shrunk towards the
/// identity by `d / (n + d)` for `n` rows (so that fewer rows than dimensions still give a
/// finite number, the same shrinkage in every coordinate system compared); infinite where it
/// cannot be factored, NaN for fewer than two rows.
pub(super) fn correlation_condition(rows: &[f64], d: usize) -> f64 {
    let n = rows.len() / d;
    if n < 2 {
        return f64::NAN;
    }
    let mut mean = vec![0.0; d];
    for row in rows.chunks(d) {
        mean.iter_mut().zip(row).for_each(|(m, v)| *m += v / n as f64);
    }
    // The lower triangle of the covariance.
    let mut cov = vec![0.0; d * d];
    let mut centred = vec![0.0; d];
    for row in rows.chunks(d) {
        centred.iter_mut().zip(row).zip(&mean).for_each(|((c, v), m)| *c = v - m);
        for i in 0..d {
            let ci = centred[i];
            for (c, cj) in cov[i * d..=i * d + i].iter_mut().zip(&centred) {
                *c += ci * cj;
            }
        }
    }
    let sd: Vec<f64> = (0..d).map(|i| cov[i * d + i].sqrt()).collect();
    let lambda = d as f64 / (n + d) as f64;
    let mut r = vec![0.0; d * d];
    for i in 0..d {
        for j in 0..i {
            let c = cov[i * d + j] / (sd[i] * sd[j]);
            let c = if c.is_finite() { c } else { 0.0 };
            r[i * d + j] = (1.0 - lambda) * c;
            r[j * d + i] = r[i * d + j];
        }
        r[i * d + i] = 1.0;
    }
    let Ok(factor) = Cholesky::factor(&r, d, 0.0) else { return f64::INFINITY };
    let times = |v: &[f64]| -> Vec<f64> { (0..d).map(|i| (0..d).map(|j| r[i * d + j] * v[j]).sum()).collect() };
    let largest = power_iteration(d, times);
    let smallest = 1.0 / power_iteration(d, |v| factor.solve(v));
    largest / smallest
}

/// The largest eigenvalue of a symmetric positive definite operator by 100 power iterations
/// from a fixed start (a Rayleigh quotient: a slight underestimate where eigenvalues cluster).
fn power_iteration(d: usize, apply: impl Fn(&[f64]) -> Vec<f64>) -> f64 {
    let mut v: Vec<f64> = (0..d).map(|i| 1.0 + 0.1 * ((i * 7919) % 13) as f64).collect();
    let mut value = 0.0;
    for _ in 0..100 {
        let norm = v.iter().map(|a| a * a).sum::<f64>().sqrt();
        v.iter_mut().for_each(|a| *a /= norm);
        let w = apply(&v);
        value = v.iter().zip(&w).map(|(a, b)| a * b).sum::<f64>();
        v = w;
    }
    value
}

/// [`NUTS_CHAINS`] starts, row-major: evenly spaced through the better half by log density of
/// `starts` together with as many of Stan's own inits (uniform(-2, 2) in every coordinate the
/// polish step runs in: within two sds of the whitening's centre). Chains that ended in the
/// typical set outrank those inits (each coordinate's `E u^2 = 4/3` puts them below it); chains
/// stranded far out in a tail, where NUTS would spend its warm-up on maximal trees, give way to
/// them.
fn chain_inits(target: &dyn LogDensity, starts: Tensor<2>, k: usize, seed: u64) -> Result<Vec<f64>, InferError> {
    let [_, d] = starts.dims();
    let device = starts.device();
    let mut rng = EngineRng::new(seed ^ 0x1417_5EED);
    let stan_inits: Vec<f32> = (0..k * d).map(|_| (4.0 * rng.uniform() - 2.0) as f32).collect();
    let candidates = Tensor::cat(vec![starts, matrix_from_vec(stan_inits, k, d, &device)], 0);
    // A call the model could not evaluate (every candidate NaN) leaves no start: the error below
    // names the model's cause.
    let scored = parvi_model::score_rows(target, candidates.clone(), None)?;
    let lp = to_vec_f32(&scored.score.log_prob);
    let mut order: Vec<usize> = (0..2 * k).filter(|&i| lp[i].is_finite()).collect();
    if order.is_empty() {
        let cause = scored.failure.map_or(String::new(), |c| format!(" ({c})"));
        return Err(InferError::setting(
            "polish",
            format!(
                "NUTS has no start: every chain of the polish step, and every uniform(-2, 2) init, has a non-finite log density{cause}"
            ),
        ));
    }
    order.sort_by(|&a, &b| lp[b].total_cmp(&lp[a]));
    let better = order.len().div_ceil(2).max(NUTS_CHAINS.min(order.len()));
    let picks: Vec<i64> = (0..NUTS_CHAINS).map(|i| order[(i * better / NUTS_CHAINS) % better] as i64).collect();
    let idx = Tensor::<1, Int>::from_data(TensorData::new(picks, [NUTS_CHAINS]), &device);
    Ok(to_vec_f32(&candidates.select(0, idx)).into_iter().map(f64::from).collect())
}

#[cfg(test)]
mod tests {
    use parvi_model::BackendKind;
    use parvi_models::Gaussian;

    use super::*;

    /// An 8-d Gaussian with sds from 0.1 to 10 and neighbours correlated 0.95: its covariance,
    /// and its Cholesky factor.
    fn correlated(d: usize) -> (Vec<f64>, Vec<f64>, Cholesky) {
        let sd: Vec<f64> = (0..d).map(|i| 0.1 * 100f64.powf(i as f64 / (d - 1) as f64)).collect();
        let mean: Vec<f64> = (0..d).map(|i| i as f64 - 3.0).collect();
        let cov: Vec<f64> =
            (0..d * d).map(|k| sd[k / d] * sd[k % d] * 0.95f64.powi((k / d).abs_diff(k % d) as i32)).collect();
        let l = Cholesky::factor(&cov, d, 0.0).unwrap();
        (mean, cov, l)
    }

    /// In the frame of draws' covariance, NUTS's trees on a correlated, unscaled Gaussian are
    /// far shorter than with its diagonal metric alone, and its draws, mapped back, have the
    /// target's means and variances within four Monte Carlo errors of their ESS (a frame mapped
    /// back wrong would move them by whole sds).
    #[test]
    fn nuts_in_the_frame_of_the_chains_covariance_takes_shorter_trees_and_is_right() {
        let device = BackendKind::Flex.device().unwrap();
        let d = 8;
        let (mean, cov, l) = correlated(d);
        let model = Gaussian::new(&mean, &cov, &device).unwrap();
        let mut rng = EngineRng::new(5);
        let exact = |rng: &mut EngineRng, n: usize| -> Vec<f32> {
            (0..n)
                .flat_map(|_| {
                    let e: Vec<f64> = (0..d).map(|_| rng.normal()).collect();
                    let lower = l.lower();
                    (0..d)
                        .map(|i| (mean[i] + (0..=i).map(|k| lower[i * d + k] * e[k]).sum::<f64>()) as f32)
                        .collect::<Vec<_>>()
                })
                .collect()
        };
        let kept = exact(&mut rng, 40 * d);
        let starts = matrix_from_vec(exact(&mut rng, 8), 8, d, &device);
        let config = PolishConfig::default();
        let (framed, _) = nuts_polish(&model, None, starts.clone(), &kept, &config, 1, None, &device).unwrap();
        let (plain, _) = nuts_polish(&model, None, starts, &[], &config, 1, None, &device).unwrap();
        let (f, p) = (&framed.report, &plain.report);
        assert!(f.dense_metric && !p.dense_metric, "{f:?} {p:?}");
        assert!(3 * f.steps < p.steps, "gradients a chain: framed {}, diagonal {}", f.steps, p.steps);
        assert!(f.converged, "{f:?}");
        let draws = to_vec_f32(&framed.draws);
        let n = (draws.len() / d) as f64;
        for j in 0..d {
            let m = draws.iter().skip(j).step_by(d).map(|&v| f64::from(v)).sum::<f64>() / n;
            let v = draws.iter().skip(j).step_by(d).map(|&x| (f64::from(x) - m).powi(2)).sum::<f64>() / n;
            let var = cov[j * d + j];
            assert!((m - mean[j]).abs() < 4.0 * (var / f.min_ess).sqrt(), "mean {j}: {m} vs {}", mean[j]);
            assert!((v / var - 1.0).abs() < 4.0 * (2.0 / f.min_ess).sqrt(), "variance {j}: {v} vs {var}");
        }
    }

    /// The evidence rule on exact draws: a frame that whitens a strongly correlated Gaussian
    /// (`L` its Cholesky factor) is picked over the model's coordinates, where the correlation
    /// is left; a frame whose `L` correlates independent coordinates is refused for them. The
    /// maps between the two coordinate systems are inverse to each other.
    #[test]
    fn the_evidence_picks_the_coordinates_whose_correlation_is_better_conditioned() {
        let device = BackendKind::Flex.device().unwrap();
        let d = 8;
        let (mean, _, l) = correlated(d);
        let model = Gaussian::new(&mean, &vec_identity(d), &device).unwrap();
        let mut rng = EngineRng::new(3);
        let standard: Vec<f64> = (0..400 * d).map(|_| rng.normal()).collect();
        let own = OwnCoordinates { model: &model, shift: &mean, lower: l.lower(), forced: false };
        // Draws of N(mean, L L^T) seen in the frame of L: independent there.
        let z: Vec<f32> = standard.iter().map(|&v| v as f32).collect();
        let c = choose_coordinates(&z, d, &own);
        assert!(!c.own && c.condition_frame < 3.0 && c.condition_own > 20.0 * c.condition_frame, "{c:?}");
        // Independent draws in the model's coordinates, seen in the same frame: correlated there.
        let x: Vec<f64> = standard.iter().zip(mean.iter().cycle()).map(|(e, m)| e + m).collect();
        let z: Vec<f32> = own.to_frame(&x).into_iter().map(|v| v as f32).collect();
        let c = choose_coordinates(&z, d, &own);
        assert!(c.own && c.condition_own < 3.0 && c.condition_frame > 10.0 * c.condition_own, "{c:?}");
        let back = own.to_own(&own.to_frame(&x));
        assert!(back.iter().zip(&x).all(|(a, b)| (a - b).abs() < 1e-9));
    }

    fn vec_identity(d: usize) -> Vec<f64> {
        (0..d * d).map(|k| if k / d == k % d { 1.0 } else { 0.0 }).collect()
    }
}
