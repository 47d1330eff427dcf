//! The stationarity check of a particle engine's final particles: MALA chains from them, their
//! moments compared before and after ([`crate::evaluation::stationarity_check`]). Its chains go
//! on into the polish step; its outcome is a phase of the path.

use burn::tensor::Tensor;
use parvi_model::LogDensity;

use super::diagnostics::{CHECK, Diagnostics, Finding};
use super::path::{Counted, Phase};
use super::precondition::Frame;
use crate::evaluation::{MalaChains, Stationarity, StationarityConfig, stationarity_check_chains};
use crate::{InferError, Particles};

/// Runs the check on `particles` (in `frame`, compared in the model's unconstrained coordinates,
/// so a flagged coordinate is one of the model's own parameters), records it in `diagnostics`
/// and its phase in `path`; returns its chains for the polish step.
#[allow(clippy::too_many_arguments)]
pub(super) fn check(
    counted: &Counted<'_>,
    target: &dyn LogDensity,
    frame: &Frame<'_>,
    particles: &Particles,
    config: &StationarityConfig,
    diagnostics: &mut Diagnostics,
    findings: &mut Vec<Finding>,
    path: &mut Vec<Phase>,
) -> Option<MalaChains> {
    let watch = counted.stopwatch();
    let to_model = |t: Tensor<2>| frame.to_model(t);
    crate::core::progress::phase(&format!("stationarity check: {} MALA steps a particle", config.steps));
    let (did, outcome, chains) = match checked(target, particles, config, Some(&to_model)) {
        Ok(Some((s, chains))) => {
            let did = format!("{} MALA steps from {} particles", s.steps, particles.len());
            let outcome = verdict(&s);
            diagnostics.stationarity = Some(s);
            (did, outcome, Some(chains))
        }
        Ok(None) => return None,
        Err(warning) => {
            findings.push(Finding::of(CHECK, warning));
            (String::new(), "failed".to_string(), None)
        }
    };
    path.push(watch.phase(counted, CHECK, did, outcome));
    chains
}

/// The check's outcome in a few words.
fn verdict(s: &Stationarity) -> String {
    if s.inconclusive {
        format!("inconclusive (MALA accepted {:.1}% at its smallest step)", 100.0 * s.acceptance)
    } else if s.rejected() && s.log_density_worst() {
        format!(
            "rejected (mean log density moved {:+.2} nats, |z| {:.1} > {:.2})",
            s.log_density_shift, s.z_log_density, s.threshold
        )
    } else if s.rejected() {
        format!(
            "rejected (coordinate {} moved {:+.2} sd in mean, x{:.2} in sd, |z| {:.1} > {:.2})",
            s.coordinate,
            s.mean_shift_sd,
            s.sd_ratio,
            s.max_z(),
            s.threshold
        )
    } else {
        format!("passed (largest |z| {:.1} <= {:.2})", s.max_z(), s.threshold)
    }
}

/// The stationarity check of `particles` ([`crate::evaluation::stationarity_check`]) with its
/// chains; `None` where it cannot apply (too few particles, a target without a gradient), and a
/// warning where it failed otherwise.
pub(super) fn checked(
    model: &dyn LogDensity,
    particles: &Particles,
    config: &StationarityConfig,
    view: Option<&dyn Fn(Tensor<2>) -> Tensor<2>>,
) -> Result<Option<(Stationarity, MalaChains)>, String> {
    if particles.len() < crate::evaluation::MIN_PARTICLES {
        return Ok(None);
    }
    match stationarity_check_chains(model, particles, config, view) {
        Ok(s) => Ok(Some(s)),
        Err(InferError::Model(parvi_model::ModelError::NoGradient)) => Ok(None),
        Err(e) => Err(format!("the stationarity check failed: {e}")),
    }
}

/// The warning a stationarity check raises, if any: the particles moved past the threshold, or
/// the check could not judge. `coordinates` says what the coordinate index counts.
pub(super) fn stationarity_warning(method: &str, s: &Stationarity, coordinates: &str) -> Option<String> {
    if s.inconclusive {
        Some(format!(
            "the stationarity check could not judge {method}'s particles: MALA accepted {:.1}% of its proposals at the smallest step it may take (< {:.0}%)",
            100.0 * s.acceptance,
            100.0 * crate::evaluation::MIN_ACCEPTANCE
        ))
    } else if s.rejected() && s.log_density_worst() {
        Some(format!(
            "{method} did not end at the target: {} MALA steps from its particles moved their mean log density by {:+.2} nats (|z| {:.1} > {:.2}, the {}% level; positive: the set was too wide or misplaced, negative: too narrow; of single coordinates, coordinate {}{coordinates} moved most: {:+.2} sd in mean, x{:.2} in sd): the particles sit at a biased fixed point (the polish step continues MALA chains (autoMALA where chains stick) from them until rank-normalised split R-hat <= 1.01 and bulk ESS >= 400 and returns their draws; it runs by default; `FitConfig::polish = None`, `--no-polish` on the command line, skips it)",
            s.steps,
            s.log_density_shift,
            s.z_log_density,
            s.threshold,
            100.0 * s.level,
            s.coordinate,
            s.mean_shift_sd,
            s.sd_ratio
        ))
    } else if s.rejected() {
        Some(format!(
            "{method} did not end at the target: {} MALA steps from its particles moved coordinate {}{coordinates} by {:+.2} sd in mean and x{:.2} in sd (|z| {:.1} > {:.2}, the {}% level): the particles sit at a biased fixed point (the polish step continues MALA chains (autoMALA where chains stick) from them until rank-normalised split R-hat <= 1.01 and bulk ESS >= 400 and returns their draws; it runs by default; `FitConfig::polish = None`, `--no-polish` on the command line, skips it)",
            s.steps,
            s.coordinate,
            s.mean_shift_sd,
            s.sd_ratio,
            s.max_z(),
            s.threshold,
            100.0 * s.level
        ))
    } else {
        None
    }
}
