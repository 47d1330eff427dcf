//! The polish step's driver: MCMC chains from the stationarity check's (MALA, autoMALA where
//! chains stick, ChEES-HMC; [`crate::samplers::polish`]) until the reported quantities' split
//! R-hat and bulk ESS pass, with NUTS ([`nuts_polish`]) taking over chains left far from mixed.
//! Its draws are the answer; each kernel that ran is a phase of the path.

use burn::tensor::{Device, Tensor};
use parvi_model::LogDensity;

use super::diagnostics::{Diagnostics, Finding};
use super::nuts_polish::{OwnCoordinates, nuts_polish};
use super::particles::ParticleRun;
use super::path::Phase;
use crate::InferError;
use crate::evaluation::MalaChains;
use crate::samplers::{HOPELESS_RHAT, Polish, PolishConfig, PolishKernel, Polished, TakeOver, polish_offering};

/// What the polish step needs beyond its settings.
pub(super) struct Polishing<'a> {
    /// The model in the frame.
    pub target: &'a dyn LogDensity,
    /// The model in its own coordinates, where NUTS may run instead of the frame (the frame
    /// verified); `None`: NUTS runs in the frame.
    pub own: Option<OwnCoordinates<'a>>,
    /// The frame in words.
    pub frame: &'static str,
    /// The map from the frame to what the stop watches (the reported quantities).
    pub watched: &'a dyn Fn(Tensor<2>) -> Tensor<2>,
    /// Whether the diagnostics flagged the particles (the check's chains are then no warm-up).
    pub flagged: bool,
    pub seed: u64,
    pub device: &'a Device,
}

/// Runs the polish step of `p` from the particle run `run` (the check's `chains` where it ran);
/// records its report in `diagnostics`, its kernels in `path`, what went wrong in `findings`, and
/// returns its draws (in the frame), or `None` where it could not run.
pub(super) fn polish(
    on: &Polishing<'_>,
    run: &ParticleRun,
    chains: Option<&MalaChains>,
    p: &PolishConfig,
    diagnostics: &mut Diagnostics,
    findings: &mut Vec<Finding>,
    path: &mut Vec<Phase>,
) -> Option<Tensor<2>> {
    let (target, seed, device, watched) = (on.target, on.seed, on.device, on.watched);
    // A run that moved the set away from the target (SVGD drawn down a funnel's neck, where MALA
    // chains need thousands of steps to climb out) is a worse start for the chains than the set
    // it started from: they start there instead.
    let from_start = run.initial.as_ref().filter(|_| diagnostics.ksd_rose());
    let (from, from_chains) = match from_start {
        Some(initial) => (initial, None),
        None => (&run.outcome.particles, chains),
    };
    crate::core::progress::phase(&format!(
        "polish step ({} kernel): until R-hat and ESS pass, at most {} gradients a chain",
        p.kernel.name(),
        p.steps
    ));
    let mut dropped = Vec::new();
    let result = if p.kernel == PolishKernel::Nuts {
        let starts = from_chains.map_or_else(|| from.positions.clone(), |c| c.end.clone());
        nuts_polish(target, on.own.as_ref(), starts, &[], p, seed, Some(watched), device).map(|(mut run, warnings)| {
            run.report.from_start = from_start.is_some();
            findings.extend(warnings.into_iter().map(Finding::answer));
            run
        })
    } else {
        // `auto` offers chains far from mixed (R-hat above HOPELESS_RHAT) to NUTS once; it takes
        // them where it mixes better (on a funnel it does not, and autoMALA goes on); chains that
        // end their budget that far from mixed without the offer get NUTS after. Chains nearly
        // mixed at the budget are not worth NUTS's 4 x 2,000 iterations (docs/posteriordb.md at 8a480ca,
        // the latent-variable models: gp_pois_regr).
        let offered = p.kernel == PolishKernel::Auto;
        let (mut taken, mut tried) = (None, false);
        let result = {
            let mut take = |positions: Tensor<2>, kept: &[f32], rhat: f64, ess: f64| {
                tried = true;
                match nuts_polish(target, on.own.as_ref(), positions, kept, p, seed, Some(watched), device) {
                    Ok(nuts) if mixes_better(&nuts.0.report, rhat, ess) => {
                        taken = Some(nuts);
                        true
                    }
                    outcome => {
                        dropped.push(declined(outcome, rhat, ess));
                        false
                    }
                }
            };
            let take: Option<TakeOver<'_>> = if offered { Some(&mut take) } else { None };
            // Chains the check passed are MALA's warm-up already (200 steps of it, 50 of them
            // adapting the step size): the polish keeps from its first step.
            let warm = !on.flagged;
            polish_offering(target, from, from_chains, p, seed, Some(watched), take, warm)
        };
        result.map(|mut run| {
            run.report.from_start = from_start.is_some();
            match taken {
                Some((nuts, warnings)) => {
                    findings.extend(warnings.into_iter().map(Finding::answer));
                    // NUTS ran inside the kernel's run, whose seconds count it already: the
                    // kernel's own are the rest, and the two add up to the run's.
                    let seconds = run.report.seconds;
                    let mut before = run.report;
                    before.seconds = (seconds - nuts.report.seconds).max(0.0);
                    let mut nuts = after(nuts, before);
                    nuts.report.seconds = seconds;
                    nuts
                }
                None if offered && !tried && run.report.max_rhat > HOPELESS_RHAT => {
                    nuts_after(on, run, p, findings, &mut dropped)
                }
                None => run,
            }
        })
    };
    match result {
        Ok(run) => {
            path.extend(kernel_phases(&run.report, on.frame, dropped, findings));
            if run.report.failed_evaluations > 0 {
                diagnostics.notes.push(format!(
                    "the polish step: {} proposals rejected for a failed evaluation (first: {})",
                    run.report.failed_evaluations,
                    run.report.first_failure.as_deref().unwrap_or("unknown")
                ));
            }
            diagnostics.polish = Some(run.report);
            Some(run.draws)
        }
        Err(InferError::Model(parvi_model::ModelError::NoGradient)) => {
            findings.push(Finding::answer("no polish step: the target has no gradient for MALA".into()));
            None
        }
        Err(e) => {
            findings.push(Finding::answer(format!("the polish step failed: {e}")));
            None
        }
    }
}

/// The phases of a polish step's `report`: the kernel before NUTS (MALA, then autoMALA or
/// ChEES), any NUTS tried and `dropped`, and NUTS where it took over. A dropped NUTS's reason is
/// a finding of its phase.
fn kernel_phases(
    report: &Polish,
    frame: &str,
    dropped: Vec<(String, Phase)>,
    findings: &mut Vec<Finding>,
) -> Vec<Phase> {
    let verdict = |p: &Polish| format!("split R-hat {:.3}, bulk ESS {:.0}", p.max_rhat, p.min_ess);
    let end = |p: &Polish| {
        if p.converged { format!("{}: returned", verdict(p)) } else { format!("{}: did not mix, returned", verdict(p)) }
    };
    let start = if report.from_start { ", from the initial particles" } else { "" };
    let kernel = |p: &Polish, outcome: String| {
        let (name, mala) = match p.mala_before_chees {
            Some(m) => ("mala, chees", format!(" ({m} of them MALA's)")),
            None => (phase_name(p.kernel), String::new()),
        };
        Phase::new(
            name,
            format!("{} chains, {} steps after {} of warm-up{mala} {frame}{start}", p.chains, p.steps, p.warmup),
            outcome,
            p.score_evals,
            p.seconds,
        )
    };
    let mut phases = Vec::new();
    let nuts = |p: &Polish, evals: usize, seconds: f64, outcome: String| {
        let framed = match &p.frame_choice {
            _ if p.dense_metric => "in the frame of the chains' covariance".to_string(),
            Some(c) => format!(
                "{} (the draws' correlation condition {:.3e} there, {:.3e} {})",
                if c.own { "in the model's own coordinates" } else { frame },
                if c.own { c.condition_own } else { c.condition_frame },
                if c.own { c.condition_frame } else { c.condition_own },
                if c.own { frame } else { "in the model's own coordinates" },
            ),
            None => frame.to_string(),
        };
        Phase::new(
            "nuts",
            format!(
                "{}x({}+{}) {framed}, step {:.3}, {} gradients a chain, {} divergences",
                p.chains, p.warmup, p.kept, p.step_size, p.steps, p.divergences
            ),
            outcome,
            evals,
            seconds,
        )
    };
    match &report.before_nuts {
        Some(before) => {
            phases.push(kernel(before, format!("{}: handed to nuts", verdict(before))));
            for (why, phase) in dropped {
                findings.push(Finding::of("nuts", why));
                phases.push(phase);
            }
            let evals = report.score_evals.saturating_sub(before.score_evals);
            phases.push(nuts(report, evals, (report.seconds - before.seconds).max(0.0), end(report)));
        }
        None if report.kernel == PolishKernel::Nuts => {
            phases.push(nuts(report, report.score_evals, report.seconds, end(report)))
        }
        None => {
            phases.push(kernel(report, end(report)));
            for (why, phase) in dropped {
                findings.push(Finding::of("nuts", why));
                phases.push(phase);
            }
        }
    }
    phases
}

/// The polish step's last resort ([`PolishKernel::Auto`]) for chains that ended their budget
/// far from mixed: NUTS from where they ended. Its draws replace `run`'s where it mixes better.
fn nuts_after(
    on: &Polishing<'_>,
    run: Polished,
    config: &PolishConfig,
    findings: &mut Vec<Finding>,
    dropped: &mut Vec<(String, Phase)>,
) -> Polished {
    let (chains, kept, rhat, ess) = (run.report.chains, run.report.kept, run.report.max_rhat, run.report.min_ess);
    if kept == 0 {
        return run;
    }
    let last = run.draws.clone().narrow(0, (kept - 1) * chains, chains);
    let draws = parvi_model::tensor_ops::to_vec_f32(&run.draws);
    match nuts_polish(on.target, on.own.as_ref(), last, &draws, config, on.seed, Some(on.watched), on.device) {
        Ok((nuts, nuts_warnings)) if mixes_better(&nuts.report, rhat, ess) => {
            findings.extend(nuts_warnings.into_iter().map(Finding::answer));
            after(nuts, run.report)
        }
        outcome => {
            dropped.push(declined(outcome, rhat, ess));
            run
        }
    }
}

/// Whether NUTS's chains stand for the posterior rather than chains at `rhat` and `ess`: they
/// met the stopping rule, or mixed better on both counts.
fn mixes_better(nuts: &Polish, rhat: f64, ess: f64) -> bool {
    nuts.converged || (nuts.max_rhat < rhat && nuts.min_ess > ess)
}

/// Why NUTS did not take over, and its phase.
fn declined(outcome: Result<(Polished, Vec<String>), InferError>, rhat: f64, ess: f64) -> (String, Phase) {
    match outcome {
        Ok((nuts, _)) => {
            let r = &nuts.report;
            let why = format!(
                "the polish step tried NUTS on chains at split R-hat {rhat:.3} and bulk ESS {ess:.0}; it mixed no better (R-hat {:.3}, ESS {:.0}, {} divergences) and was dropped",
                r.max_rhat, r.min_ess, r.divergences
            );
            let did = format!(
                "{}x({}+{}), step {:.3}, {} divergences",
                r.chains, r.warmup, r.kept, r.step_size, r.divergences
            );
            let outcome = format!("split R-hat {:.3}, bulk ESS {:.0}: mixed no better, dropped", r.max_rhat, r.min_ess);
            (why, Phase::new("nuts", did, outcome, r.score_evals, r.seconds))
        }
        Err(e) => {
            let why = format!(
                "the polish step tried NUTS on chains at split R-hat {rhat:.3}; it failed ({e}) and was dropped"
            );
            (why, Phase::new("nuts", String::new(), format!("failed ({e}), dropped"), 0, 0.0))
        }
    }
}

/// A polish kernel's phase name: its command-line name (`--polish-kernel`).
fn phase_name(kernel: PolishKernel) -> &'static str {
    match kernel {
        PolishKernel::Auto => "auto",
        PolishKernel::Mala => "mala",
        PolishKernel::AutoMala => "auto-mala",
        PolishKernel::Chees => "chees",
        PolishKernel::Nuts => "nuts",
    }
}

/// NUTS's draws after the kernel of `before`, whose cost they carry.
fn after(mut nuts: Polished, before: Polish) -> Polished {
    nuts.report.score_evals += before.score_evals;
    nuts.report.seconds += before.seconds;
    nuts.report.from_start = before.from_start;
    nuts.report.before_nuts = Some(Box::new(before));
    nuts
}
