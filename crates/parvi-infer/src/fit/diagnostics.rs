//! The diagnostics of a fit and what they find wrong, each finding with the phase it concerns.

use parvi_model::LogDensity;
use serde::{Deserialize, Serialize};

use super::check::{checked, stationarity_warning};
use super::path::Phase;
use crate::evaluation::{Stationarity, StationarityConfig};
use crate::samplers::{Polish, PolishKernel};
use crate::{InferError, Laplace, Particles};

/// Whether a run converged, by the diagnostic that fits its engine, and what to warn about.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Diagnostics {
    /// Squared kernel Stein discrepancy (V-statistic, median RBF) of the particles at the start
    /// and at the end, in the engine's coordinates (whitened with the Laplace preconditioner).
    pub ksd_start: Option<f64>,
    /// The same at the end.
    pub ksd_end: Option<f64>,
    /// A direction method's last-step displacement over the particles' spread (see
    /// [`crate::core::relative_movement`]); with a normalising step-size rule (AdaGrad, Adam) it
    /// stays near the step size at equilibrium, so it is reported, not judged.
    pub movement: Option<f64>,
    /// How far the particle set's moments moved over the last tenth of the run (at least its
    /// last 20 steps): the largest
    /// change of a coordinate's mean (in final sds) or of its sd (relative), in the engine's
    /// coordinates. Near zero at equilibrium; `None` for MCMC engines (R-hat judges those).
    pub drift: Option<f64>,
    /// An MCMC engine's largest split R-hat and smallest effective sample size over the trace.
    pub max_rhat: Option<f64>,
    /// The smallest effective sample size over the trace's coordinates.
    pub min_ess: Option<f64>,
    /// The Laplace search's Newton decrement at the mode.
    pub newton_decrement: Option<f64>,
    /// The Pareto k-hat of the Pathfinder run that preconditioned (or was tried), or of the
    /// `pathfinder` engine.
    #[serde(default)]
    pub pareto_k: Option<f64>,
    /// The stationarity check of a non-MCMC engine's final particles (MALA chains started at
    /// them, their moments compared before and after, in the model's unconstrained coordinates);
    /// `None` for MCMC engines, targets without a gradient, or with `check_steps = 0`.
    pub stationarity: Option<Stationarity>,
    /// The polish step, when it ran: its chains' R-hat, ESS and cost.
    pub polish: Option<Polish>,
    /// Human-readable warnings; empty when every diagnostic passed.
    pub warnings: Vec<String>,
    /// What the samplers did that is no warning about the draws: proposals rejected for a failed
    /// evaluation (a NaN, an ODE solve that failed), which Stan prints as informational messages.
    #[serde(default)]
    pub notes: Vec<String>,
}

/// R-hat above this says the chains have not mixed (posteriordb's threshold).
pub const MAX_RHAT: f64 = 1.01;
/// Fewer effective draws than this make the posterior moments unreliable.
pub const MIN_ESS: f64 = 100.0;
/// Moments that moved more than this over the last tenth of the run: still moving.
pub const MAX_DRIFT: f64 = 0.25;

impl Diagnostics {
    /// The diagnostics an engine's own report carries (movement; R-hat and ESS of a trace),
    /// judged: for runs made without [`fit`](super::fit) (a resumed run, say).
    pub fn from_report(method: &str, report: &serde_json::Value) -> Self {
        let mut d = Self::read(report);
        d.judge(method, None);
        d
    }

    /// Runs the stationarity check on a non-MCMC engine's final `particles` under `model` (in the
    /// coordinates they live in, which name the flagged coordinate), records it and adds its
    /// warning: for runs made without [`fit`](super::fit), after [`Diagnostics::from_report`]. A model without
    /// a gradient is skipped; a check that fails otherwise becomes a warning.
    pub fn add_stationarity(
        &mut self,
        method: &str,
        model: &dyn LogDensity,
        particles: &Particles,
        config: &StationarityConfig,
    ) -> Result<(), InferError> {
        config.validate()?;
        match checked(model, particles, config, None).map(|c| c.map(|(s, _)| s)) {
            Ok(Some(s)) => {
                self.warnings.extend(stationarity_warning(method, &s, ""));
                self.stationarity = Some(s);
            }
            Ok(None) => {}
            Err(warning) => self.warnings.push(warning),
        }
        Ok(())
    }

    /// Whether the particle set, as the diagnostics found it so far, is flagged: the stationarity
    /// check rejected it or could not judge it, its moments still drift, its kernel Stein
    /// discrepancy rose, or a warning (the engine's own, a check that failed) was raised. What
    /// [`crate::samplers::PolishWhen::Flagged`] polishes.
    pub fn particles_flagged(&self) -> bool {
        let stationarity = self.stationarity.as_ref().is_some_and(|s| s.rejected() || s.inconclusive);
        let drifting = self.drift.is_some_and(|m| m.is_nan() || m > MAX_DRIFT);
        stationarity || drifting || self.ksd_rose() || !self.warnings.is_empty()
    }

    /// Whether the run moved the set away from the target: its kernel Stein discrepancy more
    /// than doubled (or became NaN).
    pub fn ksd_rose(&self) -> bool {
        matches!((self.ksd_start, self.ksd_end), (Some(a), Some(b)) if b.is_nan() || b > 2.0 * a)
    }

    /// The report's diagnostics, not yet judged.
    pub(super) fn read(report: &serde_json::Value) -> Self {
        let number = |key: &str| report.get(key).and_then(serde_json::Value::as_f64);
        // An engine's own warnings (Pathfinder's k-hat) come with its report.
        let lines = |key: &str| {
            report
                .get(key)
                .and_then(serde_json::Value::as_array)
                .map(|w| w.iter().filter_map(|v| v.as_str().map(String::from)).collect())
                .unwrap_or_default()
        };
        let (warnings, notes) = (lines("warnings"), lines("notes"));
        Diagnostics {
            movement: number("movement"),
            max_rhat: number("max_rhat"),
            min_ess: number("min_ess"),
            pareto_k: number("pareto_k"),
            warnings,
            notes,
            ..Default::default()
        }
    }

    /// Judges the diagnostics and adds every finding to the warnings: for runs made without
    /// [`fit`](super::fit), where no later phase stands for the answer.
    fn judge(&mut self, method: &str, laplace: Option<&Laplace>) {
        let findings = self.findings(method, laplace);
        self.warnings.extend(findings.into_iter().map(|f| f.text));
    }

    /// What the diagnostics find wrong, each finding with the phase it concerns: the frame's
    /// search (`"laplace"`), the particles (`method`), the stationarity check, or the answer
    /// returned (`None`). [`fit`](super::fit) makes a phase's finding a line in the path, and a
    /// warning only where the draws returned did not pass (issue 59: warnings are about the
    /// answer).
    pub(super) fn findings(&mut self, method: &str, laplace: Option<&Laplace>) -> Vec<Finding> {
        let mut out = Vec::new();
        if let Some(l) = laplace {
            self.newton_decrement = Some(l.newton_decrement);
            if !l.other_modes.is_empty() {
                out.push(Finding::answer(format!(
                    "the posterior has at least {} separate modes (the mode search's starts ended at stationary points more than {} Laplace sds apart): the particles started spread over them, but {method} may not weight them right (compare runs with other seeds)",
                    l.other_modes.len() + 1,
                    crate::core::SEPARATE_MODE
                )));
            }
            if l.newton_decrement.is_nan() || l.newton_decrement >= 1e-3 {
                out.push(Finding::of(
                    "laplace",
                    format!(
                        "the mode search did not converge (Newton decrement {:.2e}): the preconditioner may be poor",
                        l.newton_decrement
                    ),
                ));
            }
        }
        if let Some(r) = self.max_rhat
            && (r.is_nan() || r > MAX_RHAT)
        {
            out.push(Finding::answer(format!(
                "{method} has not converged: split R-hat {r:.3} > {MAX_RHAT} (run longer)"
            )));
        }
        if let Some(e) = self.min_ess
            && (e.is_nan() || e < MIN_ESS)
        {
            out.push(Finding::answer(format!("{method}: effective sample size {e:.0} < {MIN_ESS} (run longer)")));
        }
        if let Some(m) = self.drift
            && (m.is_nan() || m > MAX_DRIFT)
        {
            out.push(Finding::of(
                method,
                format!(
                    "{method} has not converged: the particles' moments moved {m:.3} over the last tenth of the run (> {MAX_DRIFT}; run longer)"
                ),
            ));
        }
        if let Some(w) = self
            .stationarity
            .as_ref()
            .and_then(|s| stationarity_warning(method, s, " (of the model's unconstrained parameters)"))
        {
            out.push(Finding::of(CHECK, w));
        }
        if let Some(p) = self.polish.as_ref().filter(|p| !p.converged && p.kernel == PolishKernel::Nuts) {
            out.push(Finding::answer(format!(
                "the polish step's NUTS ({} chains x {} draws after {} warm-up iterations) did not mix: split R-hat {:.3}, bulk ESS {:.0} (run `--method nuts` with more draws, or reparameterise the model)",
                p.chains, p.kept, p.warmup, p.max_rhat, p.min_ess
            )));
        } else if let Some(p) = self.polish.as_ref().filter(|p| !p.converged) {
            out.push(Finding::answer(format!(
                "the polish step's {} chains did not mix within its budget of {} steps: split R-hat {:.3}, bulk ESS {:.0} (raise PolishConfig::steps, `--polish-steps` on the command line)",
                p.kernel.name(),
                p.steps,
                p.max_rhat,
                p.min_ess
            )));
        }
        if let (Some(a), Some(b)) = (self.ksd_start, self.ksd_end)
            && self.ksd_rose()
        {
            let polish = if self.polish.as_ref().is_some_and(|p| p.from_start) {
                " (the polish step's chains started from the initial particles instead)"
            } else {
                ""
            };
            out.push(Finding::of(
                method,
                format!(
                    "{method} moved away from the target: the kernel Stein discrepancy rose from {a:.3e} to {b:.3e}{polish}"
                ),
            ));
        }
        out
    }
}

/// Puts each finding where it belongs: a phase's is a note of that phase in `path`; one about
/// the answer (or of a phase with no record) is a warning. A phase's finding is a warning too
/// only where that phase's output is the answer and it did not pass (`about_answer`: no polish
/// step replaced the particles). Where the polish step's draws are returned, every earlier
/// phase was discarded (issue 59: "an earlier phase's failure is a line in the printed path and
/// in summary.json, not a warning"); the polish step's own verdict is the warning about them.
pub(super) fn sort_findings(
    findings: Vec<Finding>,
    about_answer: bool,
    warnings: &mut Vec<String>,
    path: &mut [Phase],
) {
    for f in findings {
        let record = f.phase.as_ref().and_then(|name| path.iter_mut().rev().find(|p| &p.name == name));
        match record {
            Some(phase) => {
                if about_answer {
                    warnings.push(f.text.clone());
                }
                phase.notes.push(f.text);
            }
            None => warnings.push(f.text),
        }
    }
}

/// The stationarity check's phase name in the path.
pub(super) const CHECK: &str = "stationarity check";

/// One thing the diagnostics found wrong ([`Diagnostics::findings`]).
pub(super) struct Finding {
    /// The phase whose output it concerns; `None`: the answer returned.
    pub phase: Option<String>,
    pub text: String,
}

impl Finding {
    pub fn of(phase: &str, text: String) -> Self {
        Self { phase: Some(phase.to_string()), text }
    }

    pub fn answer(text: String) -> Self {
        Self { phase: None, text }
    }
}
