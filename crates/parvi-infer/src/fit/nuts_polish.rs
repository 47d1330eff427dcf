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
//! leaves correlated (docs/posteriordb.md, accel_gp).

use std::time::Instant;

use burn::tensor::{Device, Int, Tensor, TensorData};
use parvi_model::LogDensity;
use parvi_model::tensor_ops::{matrix_from_vec, to_vec_f32};

use parvi_model::linalg::host::Cholesky;

use crate::engines::{NutsConfig, NutsInit, nuts};
use crate::evaluation::{
    DENSE_MAX_DIM, NUTS_CHAINS, Polish, PolishConfig, PolishKernel, Polished, chains_statistic, regularised_covariance,
};
use crate::{EngineRng, InferError, Whitened};

/// Warm-up iterations and kept draws per chain (Stan's defaults).
const NUTS_WARMUP: usize = 1000;
const NUTS_DRAWS: usize = 1000;

/// NUTS from `starts` `[k, d]` (the chains' positions, `k >= 1`) under `target`, in the frame of
/// `kept` draws' covariance where they suffice (module docs; `&[]` for none). Returns the draws, their report, and Stan's warnings (divergences, tree depth, E-BFMI).
pub(super) fn nuts_polish(
    target: &dyn LogDensity,
    starts: Tensor<2>,
    kept: &[f32],
    config: &PolishConfig,
    seed: u64,
    reported: Option<&dyn Fn(Tensor<2>) -> Tensor<2>>,
    device: &Device,
) -> Result<(Polished, Vec<String>), InferError> {
    let started = Instant::now();
    let [k, d] = starts.dims();
    let mut inits = chain_inits(target, starts, k, seed)?;
    let frame = dense_frame(kept, d);
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
    let sampled: &dyn LogDensity = framed.as_ref().map_or(target, |w| w as &dyn LogDensity);
    let nuts_config = NutsConfig {
        chains: NUTS_CHAINS,
        warmup: NUTS_WARMUP,
        draws: NUTS_DRAWS,
        init: NutsInit::Particles,
        ..NutsConfig::default()
    };
    let run = nuts(sampled, &nuts_config, Some(&inits), &mut EngineRng::new(seed ^ 0x4E55_7450), device)?;
    let rows = run.draws_per_chain * run.chains;
    let draws = matrix_from_vec(run.draws.iter().map(|&v| v as f32).collect(), rows, d, device);
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
        let (framed, _) = nuts_polish(&model, starts.clone(), &kept, &config, 1, None, &device).unwrap();
        let (plain, _) = nuts_polish(&model, starts, &[], &config, 1, None, &device).unwrap();
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
}
