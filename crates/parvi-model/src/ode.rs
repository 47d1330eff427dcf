//! ODE solutions batched over particles: `dy/dt = f(t, y, theta)` for every particle at once.
//!
//! The state `y0` is `[n, S]` and the parameters `theta` are `[n, P]`, one row per particle; the
//! right-hand side `f` is a closure on burn tensors that sees all particles in one call, row-wise:
//! row `p` of its result depends on row `p` of `y` and `theta` and on data shared by all rows
//! (scalars, `[1, ...]` tensors), so that any batch of rows may be passed (the gradient's
//! Jacobians pass several copies of the batch at once). The solution at the output times `ts` is
//! `[n, T, S]` (particle, output time, state component).
//!
//! Two solvers, both with one step size shared by all particles:
//! - [`ode_rk45`]: Dormand-Prince 4(5), the method behind Stan's `integrate_ode_rk45` / `ode_rk45`
//!   (Boost odeint's `runge_kutta_dopri5` with its default error checker and step adjuster).
//! - [`ode_stiff`]: the Rosenbrock 2(3) method of MATLAB's `ode23s` (Shampine & Reichelt 1997,
//!   "The MATLAB ODE suite", SIAM J. Sci. Comput. 18(1), section 3), L-stable, for stiff systems
//!   where Stan would use `ode_bdf`. It needs no Newton iteration: each step solves three linear
//!   systems with the same matrix `W = I - h d J`, inverted once per step for all particles.
//!
//! **Shared step size.** Every tensor operation runs over all `n` rows, so a batch costs as many
//! steps as its hardest particle whatever the step-size policy; per-particle step sizes would only
//! add per-particle clocks, masks and output times that no longer line up across the batch. The
//! error norm is therefore the max over particles (and components), read to the host once per
//! step (`n` values, one synchronisation), and every particle meets the tolerance (most of them
//! more tightly than asked). A particle's solution does depend on its batch, within the tolerance.
//!
//! **Output times.** The solvers step exactly onto each output time (the step is shortened to land
//! on it, the controller's proposal is kept for the step after), as Stan's `integrate_times`
//! observes; no dense-output interpolation.
//!
//! **Gradients.** Either solver with tracked `y0` or `theta` (and an `f` that closes over no
//! tracked tensor) solves the forward-sensitivity system beside the states, off the tape, and
//! hands autodiff one product per solve (see `solve_with_sensitivities`): the sensitivities'
//! right-hand side by central difference quotients of `f` (as CVODES' internal sensitivities),
//! every direction in one batched call of `f`, the solver's arithmetic on host buffers in `f64`;
//! accurate to `O(max(rel_tol, eps^(2/3)))` relative (exact for `f` bilinear in `(y, theta)`).
//! For [`ode_stiff`] the sensitivities take the same Rosenbrock formula with `W` frozen, as the
//! taped gradient below does. Otherwise by burn's autodiff through the accepted steps: `y0`, `theta` and whatever `f`
//! closes over may be tracked tensors on an autodiff device. Step sizes, accept/reject
//! decisions, and for [`ode_stiff`] the Jacobian `J` and `W^{-1}` are computed on detached
//! values, so the gradient is that of the discrete solution map, accurate to the tolerance like
//! the values (the tests check both against closed forms). For the Rosenbrock method,
//! differentiating with `W` frozen is the same Rosenbrock formula applied to the
//! forward-sensitivity system `s' = J s + f_theta`, whose Jacobian is `J` itself, so the
//! gradient stays a consistent approximation of the sensitivities. Unlike Stan, the
//! sensitivities do not enter the error norm.
//!
//! **Failure is per particle.** A particle the solve cannot carry (step-size underflow, more
//! than `max_num_steps` steps between two output times while it has the largest error, a
//! non-finite state or derivative) is dropped from the step-size control, its states are NaN and
//! [`OdeSolution::failed`] names it with its [`OdeError`] (the time reached and the tolerances):
//! its log density is NaN, which the engines reject as Stan rejects a proposal whose solve
//! fails, and the batch goes on without it. A solve is an error only when every particle has
//! failed, or when an argument is bad (the error names the argument).

use burn::tensor::{Bool, DType, Int, Tensor, TensorData};
use thiserror::Error;

use crate::linalg::host::{lu_factor, lu_solve};

/// Tolerances and step limit, as in Stan's `integrate_ode_rk45(..., rel_tol, abs_tol, max_num_steps)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OdeOptions {
    /// Relative tolerance (Stan's default 1e-6).
    pub rel_tol: f64,
    /// Absolute tolerance (Stan's default 1e-6).
    pub abs_tol: f64,
    /// Most steps (accepted or rejected) between two consecutive output times (Stan's default 1e6).
    pub max_num_steps: usize,
}

impl Default for OdeOptions {
    fn default() -> Self {
        OdeOptions { rel_tol: 1e-6, abs_tol: 1e-6, max_num_steps: 1_000_000 }
    }
}

impl OdeOptions {
    /// Options with the given relative and absolute tolerances and step limit.
    pub fn new(rel_tol: f64, abs_tol: f64, max_num_steps: usize) -> Self {
        OdeOptions { rel_tol, abs_tol, max_num_steps }
    }
}

/// Why an ODE solve failed. Numerical failures name the first offending particle (row of `y0`).
#[derive(Debug, Clone, PartialEq, Error)]
pub enum OdeError {
    #[error("ODE argument `{name}`{}: {reason}", element.map(|e| format!(", element [{}] (1-based)", e + 1)).unwrap_or_default())]
    /// An argument is unusable (`ts`, `t0`, `y0`, `theta`, `f`, `rel_tol`, `abs_tol`, `max_num_steps`).
    InvalidArgument {
        /// Name of the argument.
        name: &'static str,
        /// The element at fault, 0-based (`ts`'s position), where one is.
        element: Option<usize>,
        /// What is wrong with it.
        reason: String,
    },
    #[error(
        "{solver}: step size underflow (h = {step:e}) at t = {t} for particle {particle} \
         (rel_tol {rel_tol:e}, abs_tol {abs_tol:e})"
    )]
    /// The controller shrank the step below the time's resolution.
    StepSizeUnderflow {
        /// `ode_rk45` or `ode_stiff`.
        solver: &'static str,
        /// The particle whose error forced the last reduction.
        particle: usize,
        /// The time reached.
        t: f64,
        /// The step size that was too small.
        step: f64,
        /// The relative tolerance asked for.
        rel_tol: f64,
        /// The absolute tolerance asked for.
        abs_tol: f64,
    },
    #[error(
        "{solver}: max_num_steps = {max_num_steps} exceeded before output time {t_out}, at t = {t}; \
         particle {particle} had the largest error (rel_tol {rel_tol:e}, abs_tol {abs_tol:e})"
    )]
    /// More than `max_num_steps` steps were needed between two output times.
    MaxNumSteps {
        /// `ode_rk45` or `ode_stiff`.
        solver: &'static str,
        /// The particle with the largest error in the last attempted step.
        particle: usize,
        /// The time reached.
        t: f64,
        /// The output time that was not reached.
        t_out: f64,
        /// The step limit.
        max_num_steps: usize,
        /// The relative tolerance asked for.
        rel_tol: f64,
        /// The absolute tolerance asked for.
        abs_tol: f64,
    },
    #[error(
        "{solver}: non-finite state or derivative for particle {particle} at t = {t} \
         (rel_tol {rel_tol:e}, abs_tol {abs_tol:e})"
    )]
    /// The right-hand side or the state became infinite or NaN and smaller steps did not help.
    NonFinite {
        /// `ode_rk45` or `ode_stiff`.
        solver: &'static str,
        /// The first particle with a non-finite value.
        particle: usize,
        /// The time reached.
        t: f64,
        /// The relative tolerance asked for.
        rel_tol: f64,
        /// The absolute tolerance asked for.
        abs_tol: f64,
    },
}

/// Work done by a solve (shared by all particles).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OdeStats {
    /// Accepted steps.
    pub accepted_steps: usize,
    /// Rejected steps.
    pub rejected_steps: usize,
    /// Batched evaluations of `f` (each over all particles), Jacobian columns included.
    pub rhs_evals: usize,
}

/// A solution at the output times.
#[derive(Debug, Clone)]
pub struct OdeSolution {
    /// `[n, T, S]`: particle, output time (`ts[j]`), state component; tracked when the inputs are.
    /// NaN in the rows of the particles in `failed`.
    pub states: Tensor<3>,
    /// Steps and evaluations.
    pub stats: OdeStats,
    /// The particles the solve could not carry, each with its failure (ascending particle).
    pub failed: Vec<(usize, OdeError)>,
}

impl OdeSolution {
    fn new(states: Tensor<3>, stats: OdeStats, failed: Vec<Option<OdeError>>) -> Self {
        let states = nan_rows_of_failed(states, &failed);
        let failed = failed.into_iter().enumerate().filter_map(|(i, e)| e.map(|e| (i, e))).collect();
        Self { states, stats, failed }
    }
}

/// Solves `dy/dt = f(t, y, theta)` from `y(t0) = y0` for all particles with Dormand-Prince 4(5).
///
/// `y0` is `[n, S]`, `theta` `[n, P]`, `f(t, y, theta)` returns `[n, S]`; `ts` must be strictly
/// increasing with `ts[0] > t0`. Stan's `integrate_ode_rk45(f, y0, t0, ts, theta, x_r, x_i,
/// rel_tol, abs_tol, max_num_steps)`, with data closed over by `f`.
pub fn ode_rk45<F>(
    f: F,
    y0: Tensor<2>,
    t0: f64,
    ts: &[f64],
    theta: &Tensor<2>,
    options: &OdeOptions,
) -> Result<OdeSolution, OdeError>
where
    F: Fn(f64, Tensor<2>, &Tensor<2>) -> Tensor<2>,
{
    const SOLVER: &str = "ode_rk45";
    let [n, s] = validate(&y0, t0, ts, theta, options)?;
    let wrt = Wrt { y0: y0.is_tracked(), theta: theta.is_tracked() };
    if wrt.y0 || wrt.theta {
        let (y0_value, theta_value) = (y0.clone().without_autodiff(), theta.clone().without_autodiff());
        // `f` closing over a tracked tensor of its own needs the tape; otherwise the
        // sensitivities carry every gradient there is.
        if !f(t0, y0_value.clone(), &theta_value).is_tracked() {
            return solve_with_sensitivities(HostSolver::Rk45, &f, &y0, t0, ts, theta, options);
        }
    }
    let k1 = f(t0, y0.clone(), theta);
    let mut failed = vec![None; n];
    check_rhs(SOLVER, &k1, [n, s], t0, options, &mut failed)?;
    let mut method = Dopri5 { f: &f, theta, y: y0, k1, candidate: None, options: *options, evals: 1 };
    let (states, _, mut stats) = integrate(SOLVER, &mut method, t0, ts, options, &mut failed)?;
    stats.rhs_evals = method.evals;
    Ok(OdeSolution::new(Tensor::stack(states, 1), stats, failed))
}

/// Solves a stiff `dy/dt = f(t, y, theta)` for all particles with the Rosenbrock 2(3) method of
/// MATLAB's `ode23s` (L-stable; the Jacobian by finite differences of `f` on detached values).
///
/// Same arguments and result as [`ode_rk45`]; meant for small systems (the linear algebra is
/// `O(S^3)` per particle). Where Stan would use `ode_bdf`. Second order: tight tolerances cost
/// many steps. Where `f` closes over no tracked tensor the solve runs on host `f64` buffers
/// ([`HostRosenbrock23`]: the Jacobian by two batched calls of `f` per accepted step), with the
/// forward sensitivities beside it where `y0` or `theta` is tracked (module docs;
/// docs/posteriordb.md at 8a480ca, "The stiff solver's sensitivities on the host"), without them for a
/// value-only solve (generated quantities); an `f` that closes over tracked tensors is taped
/// through the steps (`S + 1` calls of `f` for each Jacobian).
pub fn ode_stiff<F>(
    f: F,
    y0: Tensor<2>,
    t0: f64,
    ts: &[f64],
    theta: &Tensor<2>,
    options: &OdeOptions,
) -> Result<OdeSolution, OdeError>
where
    F: Fn(f64, Tensor<2>, &Tensor<2>) -> Tensor<2>,
{
    const SOLVER: &str = "ode_stiff";
    let [n, s] = validate(&y0, t0, ts, theta, options)?;
    // The host solver wherever `f` closes over no tracked tensor: with the sensitivities where
    // `y0` or `theta` is tracked, the states alone otherwise (generated quantities), so that
    // both solve by the same arithmetic, in `f64`.
    let (y0_value, theta_value) = (y0.clone().without_autodiff(), theta.clone().without_autodiff());
    if !f(t0, y0_value, &theta_value).is_tracked() {
        return solve_with_sensitivities(HostSolver::Stiff, &f, &y0, t0, ts, theta, options);
    }
    let f0 = f(t0, y0.clone(), theta);
    let mut failed = vec![None; n];
    check_rhs(SOLVER, &f0, [n, s], t0, options, &mut failed)?;
    let mut method =
        Rosenbrock23 { f: &f, theta, y: y0, f0, jacobian: None, candidate: None, options: *options, evals: 1 };
    let (states, _, mut stats) = integrate(SOLVER, &mut method, t0, ts, options, &mut failed)?;
    stats.rhs_evals = method.evals;
    Ok(OdeSolution::new(Tensor::stack(states, 1), stats, failed))
}

fn invalid(name: &'static str, reason: impl Into<String>) -> OdeError {
    OdeError::InvalidArgument { name, element: None, reason: reason.into() }
}

/// Stan's checks of the output times: finite, strictly increasing, the first after `t0`. Run
/// by every solve; a builder calls it once on times read from data, so that a bad time is
/// reported when the model is built (`StanData::check` then names the data field and element).
///
/// # Errors
/// [`OdeError::InvalidArgument`] naming `t0` or `ts` and, for `ts`, the 0-based element.
pub fn check_times(t0: f64, ts: &[f64]) -> Result<(), OdeError> {
    let at = |element: usize, reason: String| OdeError::InvalidArgument { name: "ts", element: Some(element), reason };
    if !t0.is_finite() {
        return Err(invalid("t0", format!("must be finite, got {t0}")));
    }
    let Some(&first) = ts.first() else { return Err(invalid("ts", "no output times")) };
    if let Some(i) = ts.iter().position(|t| !t.is_finite()) {
        return Err(at(i, format!("{} is not finite", ts[i])));
    }
    if first <= t0 {
        return Err(at(0, format!("the first output time {first} must be greater than t0 = {t0}")));
    }
    if let Some(i) = ts.windows(2).position(|w| w[1] <= w[0]) {
        return Err(at(
            i + 1,
            format!("must be strictly increasing, but {} follows the time before it, {}", ts[i + 1], ts[i]),
        ));
    }
    Ok(())
}

fn validate(y0: &Tensor<2>, t0: f64, ts: &[f64], theta: &Tensor<2>, o: &OdeOptions) -> Result<[usize; 2], OdeError> {
    if !(o.rel_tol > 0.0 && o.rel_tol.is_finite()) {
        return Err(invalid("rel_tol", format!("must be positive and finite, got {}", o.rel_tol)));
    }
    if !(o.abs_tol > 0.0 && o.abs_tol.is_finite()) {
        return Err(invalid("abs_tol", format!("must be positive and finite, got {}", o.abs_tol)));
    }
    if o.max_num_steps == 0 {
        return Err(invalid("max_num_steps", "must be positive"));
    }
    check_times(t0, ts)?;
    let [n, s] = y0.dims();
    if n == 0 || s == 0 {
        return Err(invalid("y0", format!("shape [{n}, {s}] has no particles or no states")));
    }
    let [n_theta, _] = theta.dims();
    if n_theta != n {
        return Err(invalid("theta", format!("has {n_theta} rows but y0 has {n} particles")));
    }
    if let Some(p) = first_nonfinite_row(y0) {
        return Err(invalid("y0", format!("particle {p} has a non-finite initial state")));
    }
    Ok([n, s])
}

/// `f`'s shape, and its non-finite rows at `t0` as failed particles (an error when all are).
fn check_rhs(
    solver: &'static str,
    k: &Tensor<2>,
    shape: [usize; 2],
    t0: f64,
    o: &OdeOptions,
    failed: &mut [Option<OdeError>],
) -> Result<(), OdeError> {
    if k.dims() != shape {
        return Err(invalid("f", format!("returned shape {:?}, expected {:?} (the shape of y0)", k.dims(), shape)));
    }
    fail_nonfinite_rows(solver, k, t0, o, failed)
}

/// A host copy of a boolean tensor.
fn host_bools<const D: usize>(x: Tensor<D, Bool>) -> Vec<bool> {
    x.into_data().convert::<bool>().try_into_vec::<bool>().unwrap_or_default()
}

/// The first row holding a non-finite value (one host read).
fn first_nonfinite_row(x: &Tensor<2>) -> Option<usize> {
    let [_, s] = x.dims();
    let finite = x.clone().without_autodiff().is_finite().into_data().convert::<bool>().try_into_vec::<bool>().ok()?;
    finite.iter().position(|ok| !ok).map(|i| i / s)
}

/// A host copy of a small detached tensor.
fn host_f64<const D: usize>(x: Tensor<D>) -> Vec<f64> {
    let data = x.into_data();
    // f32 widened in one pass, without an intermediate f64 copy (the host solver reads `f`'s
    // rows at every stage).
    match data.as_slice::<f32>() {
        Ok(values) => values.iter().map(|&v| f64::from(v)).collect(),
        Err(_) => data.convert::<f64>().try_into_vec::<f64>().unwrap_or_default(),
    }
}

/// `sum_i c_i x_i`.
fn lincomb<const D: usize>(terms: &[(f64, &Tensor<D>)]) -> Tensor<D> {
    let mut sum: Option<Tensor<D>> = None;
    for &(c, x) in terms {
        let term = x.clone().mul_scalar(c);
        sum = Some(match sum {
            Some(acc) => acc + term,
            None => term,
        });
    }
    sum.expect("at least one term")
}

/// Per-particle max over components of `|err| / scale`, non-finite entries made infinite so that
/// the max cannot drop a NaN; returned on the host (the one read per attempted step).
fn scaled_error_norms(err: Tensor<2>, scale: Tensor<2>) -> Vec<f64> {
    let [n, _] = err.dims();
    let ratio = err.abs() / scale;
    let bad = ratio.clone().is_finite().bool_not();
    host_f64(ratio.mask_fill(bad, f64::INFINITY).max_dim(1).reshape([n]))
}

/// One step method driven by [`integrate`].
trait Method {
    /// Tries a step of size `h` from `(t, y)`; keeps the candidate and returns the per-particle
    /// scaled error norms (accept when all are `<= 1`).
    fn attempt(&mut self, t: f64, h: f64) -> Vec<f64>;
    /// Makes the last candidate the current state.
    fn accept(&mut self);
    /// The current state.
    fn state(&self) -> Tensor<2>;
    /// The current state's sensitivities `[n, S, Q]`, where the method carries them.
    fn sensitivities(&self) -> Option<Tensor<3>> {
        None
    }
    /// The step size after a rejected step with error norm `err > 1`.
    fn shrink(&self, h: f64, err: f64) -> f64;
    /// The step size after an accepted step with error norm `err <= 1`.
    fn grow(&self, h: f64, err: f64) -> f64;
}

/// Stan's first trial step (`integrate_ode_rk45` passes `step_size = 0.1` to `integrate_times`).
const INITIAL_STEP: f64 = 0.1;

/// The adaptive driver: steps exactly onto every output time, one shared step size.
///
/// A particle the solve cannot carry (its error stays non-finite, or it alone forces the step
/// below the time's resolution or past `max_num_steps` between two outputs) is dropped from the
/// step-size control with its error recorded in `failed`, and its states are NaN from then on: its
/// log density is NaN and the engines reject it, as Stan rejects a proposal whose solve fails,
/// while the other particles go on. Only when every particle has failed is the solve an error.
fn integrate(
    solver: &'static str,
    method: &mut impl Method,
    t0: f64,
    ts: &[f64],
    o: &OdeOptions,
    failed: &mut [Option<OdeError>],
) -> Result<(Vec<Tensor<2>>, Vec<Tensor<3>>, OdeStats), OdeError> {
    let mut stats = OdeStats::default();
    let mut out = Vec::with_capacity(ts.len());
    let mut out_sensitivities = Vec::new();
    let mut t = t0;
    let mut h = INITIAL_STEP.min(ts[0] - t0);
    let mut last_accepted = h;
    let mut last_errs: Vec<f64> = Vec::new();
    let (rel_tol, abs_tol) = (o.rel_tol, o.abs_tol);
    for &t_out in ts {
        let mut steps = 0;
        while t < t_out {
            let mut failure = None;
            if steps == o.max_num_steps {
                let particle = worst_particle(&last_errs, failed).0;
                failure = Some(OdeError::MaxNumSteps {
                    solver,
                    particle,
                    t,
                    t_out,
                    max_num_steps: o.max_num_steps,
                    rel_tol,
                    abs_tol,
                });
            } else {
                steps += 1;
                // Land on t_out; stretch by up to 1% rather than leave a sliver (Hairer's DOPRI5).
                let clipped = t + 1.01 * h >= t_out;
                let h_try = if clipped { t_out - t } else { h };
                last_errs = method.attempt(t, h_try);
                let (particle, err) = worst_particle(&last_errs, failed);
                if err <= 1.0 {
                    method.accept();
                    stats.accepted_steps += 1;
                    t = if clipped { t_out } else { t + h_try };
                    let grown = method.grow(h_try, err);
                    h = if clipped { h.max(grown) } else { grown };
                    last_accepted = h_try;
                } else {
                    stats.rejected_steps += 1;
                    // A non-finite error says nothing of the error's order: cut the step by 5.
                    h = if err.is_finite() { method.shrink(h_try, err) } else { 0.2 * h_try };
                    if h <= 16.0 * f64::EPSILON * t.abs().max(1.0) {
                        failure = Some(if err.is_finite() {
                            OdeError::StepSizeUnderflow { solver, particle, t, step: h, rel_tol, abs_tol }
                        } else {
                            OdeError::NonFinite { solver, particle, t, rel_tol, abs_tol }
                        });
                    }
                }
            }
            if let Some(error) = failure {
                let particle = failure_particle(&error);
                failed[particle] = Some(error.clone());
                if failed.iter().all(Option::is_some) {
                    return Err(error);
                }
                // The others go on from the last good step size, with a fresh step budget.
                (h, steps) = (last_accepted.min(t_out - t), 0);
            }
        }
        out.push(method.state());
        out_sensitivities.extend(method.sensitivities());
    }
    Ok((out, out_sensitivities, stats))
}

/// The live particle with the largest error norm (the first non-finite one if any) and that
/// norm; failed particles take no part.
fn worst_particle(errs: &[f64], failed: &[Option<OdeError>]) -> (usize, f64) {
    let mut live = (0..errs.len()).filter(|&i| failed.get(i).is_none_or(Option::is_none));
    let mut worst = (live.clone().next().unwrap_or(0), 0.0);
    if let Some(i) = live.clone().find(|&i| !errs[i].is_finite()) {
        return (i, f64::INFINITY);
    }
    for i in live.by_ref() {
        if errs[i] > worst.1 {
            worst = (i, errs[i]);
        }
    }
    worst
}

/// The particle a numerical failure names.
fn failure_particle(error: &OdeError) -> usize {
    match error {
        OdeError::StepSizeUnderflow { particle, .. }
        | OdeError::MaxNumSteps { particle, .. }
        | OdeError::NonFinite { particle, .. } => *particle,
        OdeError::InvalidArgument { .. } => 0,
    }
}

/// The failed particles' rows of `[n, T, S]` states set to NaN.
fn nan_rows_of_failed(states: Tensor<3>, failed: &[Option<OdeError>]) -> Tensor<3> {
    if failed.iter().all(Option::is_none) {
        return states;
    }
    let [n, t, s] = states.dims();
    let flags: Vec<bool> = failed.iter().map(Option::is_some).collect();
    let mask = Tensor::<3, Bool>::from_data(TensorData::new(flags, [n, 1, 1]), &states.device()).expand([n, t, s]);
    states.mask_fill(mask, f64::NAN)
}

/// The rows of the derivative at `t0` that are not finite, as failures (each particle's first).
fn fail_nonfinite_rows(
    solver: &'static str,
    k: &Tensor<2>,
    t0: f64,
    o: &OdeOptions,
    failed: &mut [Option<OdeError>],
) -> Result<(), OdeError> {
    let [_, s] = k.dims();
    let finite = host_bools(k.clone().without_autodiff().is_finite());
    for (row, cells) in finite.chunks(s).enumerate() {
        if cells.iter().any(|ok| !ok) && failed[row].is_none() {
            failed[row] =
                Some(OdeError::NonFinite { solver, particle: row, t: t0, rel_tol: o.rel_tol, abs_tol: o.abs_tol });
        }
    }
    match failed.iter().position(Option::is_some) {
        Some(first) if failed.iter().all(Option::is_some) => Err(failed[first].clone().expect("some")),
        _ => Ok(()),
    }
}

// Dormand & Prince (1980), "A family of embedded Runge-Kutta formulae", J. Comp. Appl. Math. 6,
// table 2; the same tableau as Boost odeint's runge_kutta_dopri5.
const C2: f64 = 1.0 / 5.0;
const C3: f64 = 3.0 / 10.0;
const C4: f64 = 4.0 / 5.0;
const C5: f64 = 8.0 / 9.0;
const A21: f64 = 1.0 / 5.0;
const A31: f64 = 3.0 / 40.0;
const A32: f64 = 9.0 / 40.0;
const A41: f64 = 44.0 / 45.0;
const A42: f64 = -56.0 / 15.0;
const A43: f64 = 32.0 / 9.0;
const A51: f64 = 19372.0 / 6561.0;
const A52: f64 = -25360.0 / 2187.0;
const A53: f64 = 64448.0 / 6561.0;
const A54: f64 = -212.0 / 729.0;
const A61: f64 = 9017.0 / 3168.0;
const A62: f64 = -355.0 / 33.0;
const A63: f64 = 46732.0 / 5247.0;
const A64: f64 = 49.0 / 176.0;
const A65: f64 = -5103.0 / 18656.0;
const B1: f64 = 35.0 / 384.0;
const B3: f64 = 500.0 / 1113.0;
const B4: f64 = 125.0 / 192.0;
const B5: f64 = -2187.0 / 6784.0;
const B6: f64 = 11.0 / 84.0;
// 5th- minus 4th-order weights: the local error estimate.
const E1: f64 = 71.0 / 57600.0;
const E3: f64 = -71.0 / 16695.0;
const E4: f64 = 71.0 / 1920.0;
const E5: f64 = -17253.0 / 339200.0;
const E6: f64 = 22.0 / 525.0;
const E7: f64 = -1.0 / 40.0;

struct Dopri5<'a, F> {
    f: &'a F,
    theta: &'a Tensor<2>,
    y: Tensor<2>,
    /// `f(t, y)`: first-same-as-last, the previous step's seventh stage.
    k1: Tensor<2>,
    candidate: Option<(Tensor<2>, Tensor<2>)>,
    options: OdeOptions,
    evals: usize,
}

impl<F: Fn(f64, Tensor<2>, &Tensor<2>) -> Tensor<2>> Method for Dopri5<'_, F> {
    fn attempt(&mut self, t: f64, h: f64) -> Vec<f64> {
        let (f, th, y, k1) = (self.f, self.theta, &self.y, &self.k1);
        let k2 = f(t + C2 * h, y.clone() + k1.clone().mul_scalar(h * A21), th);
        let k3 = f(t + C3 * h, y.clone() + lincomb(&[(A31, k1), (A32, &k2)]).mul_scalar(h), th);
        let k4 = f(t + C4 * h, y.clone() + lincomb(&[(A41, k1), (A42, &k2), (A43, &k3)]).mul_scalar(h), th);
        let k5 = f(t + C5 * h, y.clone() + lincomb(&[(A51, k1), (A52, &k2), (A53, &k3), (A54, &k4)]).mul_scalar(h), th);
        let k6 = f(
            t + h,
            y.clone() + lincomb(&[(A61, k1), (A62, &k2), (A63, &k3), (A64, &k4), (A65, &k5)]).mul_scalar(h),
            th,
        );
        let y5 = y.clone() + lincomb(&[(B1, k1), (B3, &k3), (B4, &k4), (B5, &k5), (B6, &k6)]).mul_scalar(h);
        let k7 = f(t + h, y5.clone(), th);
        self.evals += 6;
        // The error estimate and its scale off the autodiff backend: control decisions build no
        // graph. (A `detach`ed autodiff tensor still registers every op in a graph of its own
        // that no backward ever visits; burn 0.22 sweeps such graphs one layer per backward, so
        // they piled up over a fit and the sweep grew quadratic: 88% of a Lotka-Volterra fit.)
        let d = |k: &Tensor<2>| k.clone().without_autodiff();
        let (k1d, k7d) = (d(k1), d(&k7));
        let err = lincomb(&[(E1, &k1d), (E3, &d(&k3)), (E4, &d(&k4)), (E5, &d(&k5)), (E6, &d(&k6)), (E7, &k7d)])
            .mul_scalar(h);
        // Boost odeint's default_error_checker: eps_abs + eps_rel * (|x_old| + |dt| |dxdt_old|).
        let scale = (d(y).abs() + k1d.abs().mul_scalar(h.abs()))
            .mul_scalar(self.options.rel_tol)
            .add_scalar(self.options.abs_tol);
        self.candidate = Some((y5, k7));
        scaled_error_norms(err, scale)
    }

    fn accept(&mut self) {
        if let Some((y, k)) = self.candidate.take() {
            self.y = y;
            self.k1 = k;
        }
    }

    fn state(&self) -> Tensor<2> {
        self.y.clone()
    }

    fn shrink(&self, h: f64, err: f64) -> f64 {
        dopri5_shrink(h, err)
    }

    fn grow(&self, h: f64, err: f64) -> f64 {
        dopri5_grow(h, err)
    }
}

// Boost odeint's default_step_adjuster with dopri5's error order 4 and stepper order 5.
fn dopri5_shrink(h: f64, err: f64) -> f64 {
    h * (0.9 * err.powf(-1.0 / 3.0)).max(0.2)
}

fn dopri5_grow(h: f64, err: f64) -> f64 {
    if err < 0.5 { h * 0.9 * err.max(5f64.powi(-5)).powf(-1.0 / 5.0) } else { h }
}

/// Which inputs a forward-sensitivity solve differentiates.
#[derive(Debug, Clone, Copy)]
struct Wrt {
    y0: bool,
    theta: bool,
}

/// `solver` (Dormand-Prince 4(5), or ode23s's Rosenbrock triple) on `y` and its forward
/// sensitivities `Z = dy/d(y0, theta)` together, then one small tracked product that hands
/// autodiff the gradient.
///
/// The variational system `Z' = J_y Z + [0 | J_theta]` (Hairer, Norsett & Wanner, *Solving
/// ODEs I*, section I.14) is integrated with the same method and steps as `y` (the Rosenbrock
/// stages with `y`'s matrix `W`, [`HostRosenbrock23`]). Its right-hand
/// side is `Q` directional derivatives of `f` (column `q` of `Z` with, for a theta column, that
/// parameter's unit vector), taken as central difference quotients, as CVODES' internal
/// difference-quotient sensitivities do (Serban & Hindmarsh 2005, "CVODES: the
/// sensitivity-enabled ODE solver in SUNDIALS", section 2.3): `f` sees the batch `2 Q + 1` times
/// over in one call (the point and both sides of every direction), with no autodiff at all.
/// The solver's own arithmetic (stages, sensitivities, error norm) runs on host buffers in
/// `f64`, all particles in one flat loop, so that a Runge-Kutta stage is one batched call of `f`
/// instead of dozens of small tensor operations and a backward pass, whose fixed costs in burn
/// dominated an ODE fit (docs/posteriordb.md at 8a480ca, "The ODE's gradient without autodiff").
///
/// Accuracy: each direction is scaled so that no coordinate moves by more than `delta` of its
/// size (`|y_i|` floored at `abs_tol / rel_tol`, the error weights' switch point; `|theta_j|`
/// floored at `eps / delta^3` within [1e-3, 1]), with `delta = max(sqrt(rel_tol), eps^(1/3))`
/// of `f`'s dtype. A central
/// quotient's error is `O(delta^2)` in truncation and `O(eps / delta)` in rounding: below the
/// solve's own tolerance in `f64`, and a few 1e-5 relative in `f32` (where `f`'s values carry
/// 1e-7). It is exact for `f` linear or bilinear in `(y, theta)` up to rounding (Lotka-Volterra,
/// decay, oscillators). The error norm is that of `y` alone, as Stan's `integrate_ode_rk45`.
fn solve_with_sensitivities<F>(
    solver: HostSolver,
    f: &F,
    y0: &Tensor<2>,
    t0: f64,
    ts: &[f64],
    theta: &Tensor<2>,
    options: &OdeOptions,
) -> Result<OdeSolution, OdeError>
where
    F: Fn(f64, Tensor<2>, &Tensor<2>) -> Tensor<2>,
{
    let name = solver.name();
    let wrt = Wrt { y0: y0.is_tracked(), theta: theta.is_tracked() };
    let (y_value, theta_value) = (y0.clone().without_autodiff(), theta.clone().without_autodiff());
    let [n, s] = y_value.dims();
    let p = theta_value.dims()[1];
    let q = if wrt.y0 { s } else { 0 } + if wrt.theta { p } else { 0 };
    let (device, dtype) = (y_value.device(), y_value.dtype());
    let y = host_f64(y_value);
    // Z(t0) = dy0/d(y0, theta) = [I | 0], row-major [particle][state][column].
    let mut z = vec![0.0; n * s * q];
    if wrt.y0 {
        for i in 0..n {
            for k in 0..s {
                z[(i * s + k) * q + k] = 1.0;
            }
        }
    }
    let theta_host = host_f64(theta_value);
    let eps = if dtype == DType::F64 { f64::EPSILON } else { f64::from(f32::EPSILON) };
    let delta = options.rel_tol.sqrt().max(eps.cbrt());
    // Each theta column's size in its own parameter's units: 1 / max(|theta_j|, floor). The floor
    // keeps a parameter near zero from a step so small that rounding swamps the quotient: a step
    // of `delta floor` has rounding error `eps / (delta floor)` where `f` is O(1) in theta, no more
    // than the truncation `delta^2` once `floor >= eps / delta^3` (1 in f32 at the default
    // tolerances, where 1e-3 lost 1% on theta = 0; 1e-3 in f64).
    let theta_floor = (eps / delta.powi(3)).clamp(1e-3, 1.0);
    let theta_columns = q - if wrt.theta { p } else { 0 };
    let theta_weight: Vec<f64> = theta_host.iter().map(|th| 1.0 / th.abs().max(theta_floor)).collect();
    let mut rhs = HostRhs {
        f,
        theta_host,
        theta_weight,
        theta_columns,
        shape: [n, s, p, q],
        device,
        dtype,
        delta,
        options: *options,
        evals: 0,
    };
    let first = rhs.derivatives(t0, &y, &z)?;
    let mut failed = vec![None; n];
    check_rhs(name, &rhs.upload(&first.0, [n, s]), [n, s], t0, options, &mut failed)?;
    let (states, sensitivities, stats) = match solver {
        HostSolver::Rk45 => {
            let mut method = HostDopri5 { rhs, y, z, k1: first, candidate: None };
            let solved = integrate(name, &mut method, t0, ts, options, &mut failed)?;
            (solved.0, solved.1, OdeStats { rhs_evals: method.rhs.evals, ..solved.2 })
        }
        HostSolver::Stiff => {
            let mut method = HostRosenbrock23 { rhs, y, z, f0: first, jacobian: None, candidate: None };
            let solved = integrate(name, &mut method, t0, ts, options, &mut failed)?;
            (solved.0, solved.1, OdeStats { rhs_evals: method.rhs.evals, ..solved.2 })
        }
    };
    let t_len = ts.len();
    let states = Tensor::stack::<3>(states, 1); // [n, T, S]
    if q == 0 {
        return Ok(OdeSolution::new(states.autodiff(), stats, failed));
    }
    let sensitivities = Tensor::stack::<4>(sensitivities, 1); // [n, T, S, Q]
    let mut inputs = Vec::new();
    if wrt.y0 {
        inputs.push(y0.clone());
    }
    if wrt.theta {
        inputs.push(theta.clone());
    }
    let u = Tensor::cat(inputs, 1); // [n, Q], tracked
    // Zero in value, the identity in gradient: the states' value is the solve's, their gradient
    // with respect to u is Z.
    let du = u.clone() - u.detach();
    let linear = sensitivities.reshape([n, t_len * s, q]).autodiff().matmul(du.unsqueeze_dim::<3>(2));
    Ok(OdeSolution::new(states.autodiff() + linear.reshape([n, t_len, s]), stats, failed))
}

/// `(y, Z)` or their derivatives `(y', Z')` on the host: `[n, S]` and `[n, S, Q]`, row-major.
type HostPoint = (Vec<f64>, Vec<f64>);

/// The forward-sensitivity solvers that run on host buffers.
#[derive(Debug, Clone, Copy)]
enum HostSolver {
    Rk45,
    Stiff,
}

impl HostSolver {
    fn name(self) -> &'static str {
        match self {
            Self::Rk45 => "ode_rk45",
            Self::Stiff => "ode_stiff",
        }
    }
}

/// `f` on host points `(y, Z)` in `f64`: the states' derivatives and the sensitivities'
/// right-hand side by central difference quotients, one batched call of `f` on burn tensors.
struct HostRhs<'a, F> {
    f: &'a F,
    /// `theta`'s values, row-major.
    theta_host: Vec<f64>,
    /// `1 / max(|theta_j|, floor)` per particle and parameter: a direction's size in theta.
    theta_weight: Vec<f64>,
    /// The first theta column of `Z` (`Q` when theta is not differentiated).
    theta_columns: usize,
    /// `[n, S, P, Q]`.
    shape: [usize; 4],
    device: burn::tensor::Device,
    dtype: DType,
    /// The difference quotients' relative increment.
    delta: f64,
    options: OdeOptions,
    evals: usize,
}

/// Dormand-Prince 4(5) on the state and its sensitivities, on the host in `f64`.
struct HostDopri5<'a, F> {
    rhs: HostRhs<'a, F>,
    /// `[n, S]`.
    y: Vec<f64>,
    /// `[n, S, Q]`.
    z: Vec<f64>,
    /// `(y', Z')` at the current point (first-same-as-last).
    k1: HostPoint,
    candidate: Option<(HostPoint, HostPoint)>,
}

impl<F: Fn(f64, Tensor<2>, &Tensor<2>) -> Tensor<2>> HostRhs<'_, F> {
    /// `values` as a tensor of `f`'s dtype, converted in one pass (no `f64` copy first).
    fn upload<const D: usize>(&self, values: &[f64], shape: [usize; D]) -> Tensor<D> {
        let data = if self.dtype == DType::F32 {
            TensorData::new(values.iter().map(|&v| v as f32).collect::<Vec<f32>>(), shape)
        } else {
            TensorData::new(values.to_vec(), shape)
        };
        Tensor::from_data(data, (&self.device, self.dtype))
    }

    /// `(y', Z')` at `(t, y, Z)`: `f` once on the point and `Q` pairs of points `x +- h_q v_q`,
    /// `v_q = (Z[:, q], e_q)`, each particle's `h_q` so that no coordinate moves by more than
    /// `delta` of its size; `Z'[:, q] = (f(x + h v) - f(x - h v)) / (2 h)`.
    fn derivatives(&mut self, t: f64, y: &[f64], z: &[f64]) -> Result<HostPoint, OdeError> {
        let [n, s, p, q] = self.shape;
        let blocks = 1 + 2 * q;
        let y_floor = self.options.abs_tol / self.options.rel_tol;
        let mut ys = vec![0.0; blocks * n * s];
        let mut thetas = vec![0.0; blocks * n * p];
        let mut steps = vec![0.0; q * n];
        ys[..n * s].copy_from_slice(y);
        for b in 0..blocks {
            thetas[b * n * p..(b + 1) * n * p].copy_from_slice(&self.theta_host);
        }
        let inverse_sizes: Vec<f64> = y.iter().map(|v| 1.0 / v.abs().max(y_floor)).collect();
        for c in 0..q {
            let theta_index = c.checked_sub(self.theta_columns);
            for i in 0..n {
                let mut size: f64 = 0.0;
                for k in 0..s {
                    size = size.max(z[(i * s + k) * q + c].abs() * inverse_sizes[i * s + k]);
                }
                if let Some(j) = theta_index {
                    size = size.max(self.theta_weight[i * p + j]);
                }
                // A zero direction has a zero quotient whatever the step; so, to rounding, has one
                // so small (a decayed sensitivity, 1e-312) that `delta / size` overflows.
                let h = self.delta / size;
                let h = if size > 0.0 && h.is_finite() { h } else { 1.0 };
                steps[c * n + i] = h;
                for (sign, block) in [(1.0, 1 + c), (-1.0, 1 + q + c)] {
                    for k in 0..s {
                        ys[(block * n + i) * s + k] = y[i * s + k] + sign * h * z[(i * s + k) * q + c];
                    }
                    if let Some(j) = theta_index {
                        thetas[(block * n + i) * p + j] += sign * h;
                    }
                }
            }
        }
        let out = self.call(t, &ys, &thetas, blocks * n)?;
        let dy = out[..n * s].to_vec();
        let mut dz = vec![0.0; n * s * q];
        for c in 0..q {
            for i in 0..n {
                let h = steps[c * n + i];
                let (plus, minus) = ((1 + c) * n + i, (1 + q + c) * n + i);
                for k in 0..s {
                    dz[(i * s + k) * q + c] = (out[plus * s + k] - out[minus * s + k]) / (2.0 * h);
                }
            }
        }
        Ok((dy, dz))
    }

    /// `[n, S]` states as a tensor of `f`'s dtype.
    fn upload_states(&self, y: &[f64]) -> Tensor<2> {
        let [n, s, _, _] = self.shape;
        self.upload(y, [n, s])
    }

    /// `[n, S, Q]` sensitivities as a tensor of `f`'s dtype.
    fn upload_sensitivities(&self, z: &[f64]) -> Tensor<3> {
        let [n, s, _, q] = self.shape;
        self.upload(z, [n, s, q])
    }

    /// `J = df/dy` `[n, S, S]` and `df/dt` `[n, S]` at `(t, y)`, `f0 = f(t, y)`, by forward
    /// differences with MATLAB's `numjac` increments (`sqrt(eps)` of `f`'s dtype relative, at
    /// least `sqrt(eps)`): one call of `f` on `S n` rows and one on `n`; NaN where `f` fails.
    fn jacobian(&mut self, t: f64, y: &[f64], f0: &[f64]) -> (Vec<f64>, Vec<f64>) {
        let [n, s, _, _] = self.shape;
        let eps = if self.dtype == DType::F64 { f64::EPSILON } else { f64::from(f32::EPSILON) };
        let sqrt_eps = eps.sqrt();
        let mut ys = Vec::with_capacity(s * n * s);
        let mut steps = vec![0.0; s * n];
        for j in 0..s {
            for i in 0..n {
                let row = &y[i * s..(i + 1) * s];
                let h = sqrt_eps * row[j].abs().max(1.0);
                steps[j * n + i] = h;
                ys.extend(row.iter().enumerate().map(|(k, &v)| if k == j { v + h } else { v }));
            }
        }
        let thetas: Vec<f64> = (0..s).flat_map(|_| self.theta_host.iter().copied()).collect();
        let shifted = self.call(t, &ys, &thetas, s * n).ok();
        let dt = sqrt_eps * t.abs().max(1.0);
        let theta = self.theta_host.clone();
        let later = self.call(t + dt, y, &theta, n).ok();
        let mut jac = vec![f64::NAN; n * s * s];
        let mut ft = vec![f64::NAN; n * s];
        if let Some(shifted) = shifted {
            for j in 0..s {
                for i in 0..n {
                    for k in 0..s {
                        jac[(i * s + k) * s + j] = (shifted[(j * n + i) * s + k] - f0[i * s + k]) / steps[j * n + i];
                    }
                }
            }
        }
        if let Some(later) = later {
            for (d, (a, b)) in ft.iter_mut().zip(later.iter().zip(f0)) {
                *d = (a - b) / dt;
            }
        }
        (jac, ft)
    }

    /// `f` at `rows` host points (`ys` `[rows, S]`, `thetas` `[rows, P]`), read back to the host.
    fn call(&mut self, t: f64, ys: &[f64], thetas: &[f64], rows: usize) -> Result<Vec<f64>, OdeError> {
        let [_, s, p, _] = self.shape;
        let out = (self.f)(t, self.upload(ys, [rows, s]), &self.upload(thetas, [rows, p]));
        self.evals += 1;
        if out.dims() != [rows, s] {
            return Err(invalid(
                "f",
                format!(
                    "returned shape {:?} for {rows} rows of y, expected [{rows}, {s}] (f must be row-wise: see the module docs)",
                    out.dims(),
                ),
            ));
        }
        Ok(host_f64(out.without_autodiff()))
    }

    /// `f` failing part-way (a wrong shape) fails the step: NaN derivatives, which the error norm
    /// turns into a rejected step and, where it persists, a failed particle.
    fn derivatives_or_nan(&mut self, t: f64, x: &HostPoint) -> HostPoint {
        self.derivatives(t, &x.0, &x.1).unwrap_or_else(|_| (vec![f64::NAN; x.0.len()], vec![f64::NAN; x.1.len()]))
    }
}

impl<F: Fn(f64, Tensor<2>, &Tensor<2>) -> Tensor<2>> HostDopri5<'_, F> {
    /// `(y, Z) + h sum_j a_j k_j` over the stages so far.
    fn stage(&self, h: f64, a: &[f64], k: &[&HostPoint]) -> HostPoint {
        let combine = |x: &[f64], part: fn(&HostPoint) -> &Vec<f64>| {
            let mut out = x.to_vec();
            for (&c, k) in a.iter().zip(k) {
                if c != 0.0 {
                    for (o, v) in out.iter_mut().zip(part(k)) {
                        *o += h * c * v;
                    }
                }
            }
            out
        };
        (combine(&self.y, |k| &k.0), combine(&self.z, |k| &k.1))
    }
}

impl<F: Fn(f64, Tensor<2>, &Tensor<2>) -> Tensor<2>> Method for HostDopri5<'_, F> {
    fn attempt(&mut self, t: f64, h: f64) -> Vec<f64> {
        let k1 = self.k1.clone();
        let x2 = self.stage(h, &[A21], &[&k1]);
        let k2 = self.rhs.derivatives_or_nan(t + C2 * h, &x2);
        let x3 = self.stage(h, &[A31, A32], &[&k1, &k2]);
        let k3 = self.rhs.derivatives_or_nan(t + C3 * h, &x3);
        let x4 = self.stage(h, &[A41, A42, A43], &[&k1, &k2, &k3]);
        let k4 = self.rhs.derivatives_or_nan(t + C4 * h, &x4);
        let x5 = self.stage(h, &[A51, A52, A53, A54], &[&k1, &k2, &k3, &k4]);
        let k5 = self.rhs.derivatives_or_nan(t + C5 * h, &x5);
        let x6 = self.stage(h, &[A61, A62, A63, A64, A65], &[&k1, &k2, &k3, &k4, &k5]);
        let k6 = self.rhs.derivatives_or_nan(t + h, &x6);
        let next = self.stage(h, &[B1, 0.0, B3, B4, B5, B6], &[&k1, &k2, &k3, &k4, &k5, &k6]);
        let k7 = self.rhs.derivatives_or_nan(t + h, &next);
        let [n, s, _, _] = self.rhs.shape;
        // As Dopri5::attempt: Boost odeint's default_error_checker on the states; a non-finite
        // entry makes the norm infinite.
        let o = self.rhs.options;
        let errs = host_error_norms(n, s, &next.0, |k| {
            let e = h * (E1 * k1.0[k] + E3 * k3.0[k] + E4 * k4.0[k] + E5 * k5.0[k] + E6 * k6.0[k] + E7 * k7.0[k]);
            (e, o.rel_tol * (self.y[k].abs() + h.abs() * k1.0[k].abs()) + o.abs_tol)
        });
        self.candidate = Some((next, k7));
        errs
    }

    fn accept(&mut self) {
        if let Some(((y, z), k)) = self.candidate.take() {
            self.y = y;
            self.z = z;
            self.k1 = k;
        }
    }

    fn state(&self) -> Tensor<2> {
        self.rhs.upload_states(&self.y)
    }

    fn sensitivities(&self) -> Option<Tensor<3>> {
        (self.rhs.shape[3] > 0).then(|| self.rhs.upload_sensitivities(&self.z))
    }

    fn shrink(&self, h: f64, err: f64) -> f64 {
        dopri5_shrink(h, err)
    }

    fn grow(&self, h: f64, err: f64) -> f64 {
        dopri5_grow(h, err)
    }
}

// ode23s (Shampine & Reichelt 1997, eq. for the modified Rosenbrock triple): d = 1/(2 + sqrt 2),
// e32 = 6 + sqrt 2.
const D_ROS: f64 = 0.292_893_218_813_452_5; // 1 / (2 + sqrt(2))
const E32: f64 = 7.414_213_562_373_095; // 6 + sqrt(2)

struct Rosenbrock23<'a, F> {
    f: &'a F,
    theta: &'a Tensor<2>,
    y: Tensor<2>,
    /// `f(t, y)`, the previous step's last stage.
    f0: Tensor<2>,
    /// `(J, df/dt)` at the current point, detached; kept across rejected attempts.
    jacobian: Option<(Tensor<3>, Tensor<2>)>,
    candidate: Option<(Tensor<2>, Tensor<2>)>,
    options: OdeOptions,
    evals: usize,
}

impl<F: Fn(f64, Tensor<2>, &Tensor<2>) -> Tensor<2>> Rosenbrock23<'_, F> {
    /// `J = df/dy` `[n, S, S]` and `df/dt` `[n, S]` by forward differences on detached values,
    /// with the increments of MATLAB's `numjac` default (sqrt(eps) relative, at least sqrt(eps)).
    fn jacobian(&mut self, t: f64) -> (Tensor<3>, Tensor<2>) {
        if let Some(j) = &self.jacobian {
            return j.clone();
        }
        // Off the autodiff backend (see Dopri5::attempt): J is a constant of the step.
        let y = self.y.clone().without_autodiff();
        let theta = self.theta.clone().without_autodiff();
        let f0 = self.f0.clone().without_autodiff();
        let [n, s] = y.dims();
        let (device, dtype) = (y.device(), y.dtype());
        let sqrt_eps = if dtype == DType::F64 { f64::EPSILON } else { f64::from(f32::EPSILON) }.sqrt();
        let mut columns = Vec::with_capacity(s);
        for j in 0..s {
            let yj = y.clone().narrow(1, j, 1); // [n, 1]
            // The increment actually applied, so that rounding of y + delta does not bias the slope.
            let delta = ((yj.clone().abs().clamp_min(1.0).mul_scalar(sqrt_eps) + yj.clone()) - yj).reshape([n, 1]);
            let mut unit = vec![0.0; s];
            unit[j] = 1.0;
            let e = Tensor::<2>::from_data(TensorData::new(unit, [1, s]), (&device, dtype));
            let fj = (self.f)(t, y.clone() + e * delta.clone(), &theta).without_autodiff();
            columns.push((fj - f0.clone()) / delta);
        }
        let dt = sqrt_eps * t.abs().max(1.0);
        let ft = ((self.f)(t + dt, y, &theta).without_autodiff() - f0).div_scalar(dt);
        self.evals += s + 1;
        let j = (Tensor::stack::<3>(columns, 2), ft);
        self.jacobian = Some(j.clone());
        j
    }
}

impl<F: Fn(f64, Tensor<2>, &Tensor<2>) -> Tensor<2>> Method for Rosenbrock23<'_, F> {
    fn attempt(&mut self, t: f64, h: f64) -> Vec<f64> {
        let (jac, ft) = self.jacobian(t);
        let [n, s] = self.y.dims();
        let (device, dtype) = (self.y.device(), self.y.dtype());
        let eye = Tensor::<2>::from_data(TensorData::new(identity(s), [s, s]), (&device, dtype))
            .unsqueeze::<3>()
            .expand([n, s, s]);
        let w_inv = batched_inverse(eye - jac.mul_scalar(h * D_ROS));
        let solve = |b: Tensor<2>| w_inv.clone().matmul(b.unsqueeze_dim::<3>(2)).reshape([n, s]);
        let (f, th, y, f0) = (self.f, self.theta, &self.y, &self.f0);
        let hdt = ft.mul_scalar(h * D_ROS);
        let k1 = solve(f0.clone() + hdt.clone());
        let f1 = f(t + 0.5 * h, y.clone() + k1.clone().mul_scalar(0.5 * h), th);
        let k2 = solve(f1.clone() - k1.clone()) + k1.clone();
        let y_new = y.clone() + k2.clone().mul_scalar(h);
        let f2 = f(t + h, y_new.clone(), th);
        let k3 =
            solve(f2.clone() - (k2.clone() - f1).mul_scalar(E32) - (k1.clone() - f0.clone()).mul_scalar(2.0) + hdt);
        self.evals += 2;
        let d = |k: &Tensor<2>| k.clone().without_autodiff();
        let err = (d(&k1) - d(&k2).mul_scalar(2.0) + d(&k3)).mul_scalar(h / 6.0);
        let scale =
            d(y).abs().max_pair(d(&y_new).abs()).mul_scalar(self.options.rel_tol).add_scalar(self.options.abs_tol);
        self.candidate = Some((y_new, f2));
        scaled_error_norms(err, scale)
    }

    fn accept(&mut self) {
        if let Some((y, f)) = self.candidate.take() {
            self.y = y;
            self.f0 = f;
            self.jacobian = None;
        }
    }

    fn state(&self) -> Tensor<2> {
        self.y.clone()
    }

    fn shrink(&self, h: f64, err: f64) -> f64 {
        rosenbrock_shrink(h, err)
    }

    fn grow(&self, h: f64, err: f64) -> f64 {
        rosenbrock_grow(h, err)
    }
}

// The error estimate is O(h^3): the same safety factor and bounds as for rk45, exponent 1/3.
fn rosenbrock_shrink(h: f64, err: f64) -> f64 {
    h * (0.9 * err.powf(-1.0 / 3.0)).max(0.2)
}

fn rosenbrock_grow(h: f64, err: f64) -> f64 {
    if err < 0.5 { h * (0.9 * err.max(1e-12).powf(-1.0 / 3.0)).min(5.0) } else { h }
}

/// Per particle, the largest `|e_k| / scale_k` over its `S` states from `error_and_scale(k)` (`k`
/// the flat index), infinite where that or the candidate state `next[k]` is not finite (as
/// [`scaled_error_norms`] on tensors).
fn host_error_norms(n: usize, s: usize, next: &[f64], error_and_scale: impl Fn(usize) -> (f64, f64)) -> Vec<f64> {
    (0..n)
        .map(|i| {
            let mut worst: f64 = 0.0;
            for (k, candidate) in next.iter().enumerate().skip(i * s).take(s) {
                let (e, scale) = error_and_scale(k);
                let ratio = e.abs() / scale;
                worst = if ratio.is_finite() && candidate.is_finite() { worst.max(ratio) } else { f64::INFINITY };
            }
            worst
        })
        .collect()
}

/// ode23s's Rosenbrock triple on the state and its sensitivities, on the host in `f64`.
///
/// The sensitivities follow the same formula with `W` (and `df/dt`) frozen, as the taped solver's
/// gradient does ([`Rosenbrock23`]): their system `Z' = J Z + f_theta` has Jacobian `J` itself,
/// so each stage is `W k_Z = (the stage's directional derivatives of f) + ...`, solved with the
/// step's inverse of `W`. A stage's `(y', Z')` is one batched call of `f` ([`HostRhs`]); the
/// Jacobian `J` for `W` by forward differences, one call of `f` on `S n` rows and one for
/// `df/dt`, once per accepted step; `W = I - h d J` is inverted per particle (from its factor
/// with partial pivoting, `S x S`) once per attempt.
struct HostRosenbrock23<'a, F> {
    rhs: HostRhs<'a, F>,
    /// `[n, S]`.
    y: Vec<f64>,
    /// `[n, S, Q]`.
    z: Vec<f64>,
    /// `(y', Z')` at the current point, the previous step's last stage.
    f0: HostPoint,
    /// `(J [n, S, S], df/dt [n, S])` at the current point; kept across rejected attempts.
    jacobian: Option<(Vec<f64>, Vec<f64>)>,
    candidate: Option<(HostPoint, HostPoint)>,
}

impl<F: Fn(f64, Tensor<2>, &Tensor<2>) -> Tensor<2>> Method for HostRosenbrock23<'_, F> {
    fn attempt(&mut self, t: f64, h: f64) -> Vec<f64> {
        // The Jacobian at the current point, once per accepted step (kept across rejections).
        if self.jacobian.is_none() {
            self.jacobian = Some(self.rhs.jacobian(t, &self.y, &self.f0.0));
        }
        let (jac, ft) = self.jacobian.as_ref().expect("set above");
        let [n, s, _, q] = self.rhs.shape;
        let hd = h * D_ROS;
        let inverses = invert_stage_matrices(jac, n, s, 1.0, hd);
        let solve = |b: &mut HostPoint| solve_stage(&inverses, b, s, q);
        let axpy = |x: &[f64], a: f64, k: &[f64]| -> Vec<f64> { x.iter().zip(k).map(|(x, k)| x + a * k).collect() };
        let f0 = &self.f0;
        let mut k1 = (axpy(&f0.0, hd, ft), f0.1.clone());
        solve(&mut k1);
        let x1 = (axpy(&self.y, 0.5 * h, &k1.0), axpy(&self.z, 0.5 * h, &k1.1));
        let f1 = self.rhs.derivatives_or_nan(t + 0.5 * h, &x1);
        let mut k2 = (axpy(&f1.0, -1.0, &k1.0), axpy(&f1.1, -1.0, &k1.1));
        solve(&mut k2);
        let k2 = (axpy(&k2.0, 1.0, &k1.0), axpy(&k2.1, 1.0, &k1.1));
        let next = (axpy(&self.y, h, &k2.0), axpy(&self.z, h, &k2.1));
        let f2 = self.rhs.derivatives_or_nan(t + h, &next);
        // k3 = W^-1 (f2 - e32 (k2 - f1) - 2 (k1 - f0) + h d df/dt); the sensitivities' without the
        // frozen df/dt.
        let third = |f2: &[f64], k2: &[f64], f1: &[f64], k1: &[f64], f0: &[f64]| -> Vec<f64> {
            (0..f2.len()).map(|k| f2[k] - E32 * (k2[k] - f1[k]) - 2.0 * (k1[k] - f0[k])).collect()
        };
        let mut k3 =
            (axpy(&third(&f2.0, &k2.0, &f1.0, &k1.0, &f0.0), hd, ft), third(&f2.1, &k2.1, &f1.1, &k1.1, &f0.1));
        solve(&mut k3);
        let options = self.rhs.options;
        // As Rosenbrock23::attempt: the states' error, scaled by the larger of |y| and |y_new|.
        let errs = host_error_norms(n, s, &next.0, |k| {
            let e = h / 6.0 * (k1.0[k] - 2.0 * k2.0[k] + k3.0[k]);
            (e, options.rel_tol * self.y[k].abs().max(next.0[k].abs()) + options.abs_tol)
        });
        self.candidate = Some((next, f2));
        errs
    }

    fn accept(&mut self) {
        if let Some(((y, z), f)) = self.candidate.take() {
            self.y = y;
            self.z = z;
            self.f0 = f;
            self.jacobian = None;
        }
    }

    fn state(&self) -> Tensor<2> {
        self.rhs.upload_states(&self.y)
    }

    fn sensitivities(&self) -> Option<Tensor<3>> {
        (self.rhs.shape[3] > 0).then(|| self.rhs.upload_sensitivities(&self.z))
    }

    fn shrink(&self, h: f64, err: f64) -> f64 {
        rosenbrock_shrink(h, err)
    }

    fn grow(&self, h: f64, err: f64) -> f64 {
        rosenbrock_grow(h, err)
    }
}

/// Per particle, the inverse of `diag I - scale J` (`J` `[n, S, S]`), `[n, S, S]`, from its
/// [`lu_factor`]; NaN where it is singular (that particle's stages are NaN and its step fails).
/// An explicit inverse because every attempt solves with it `3 (1 + Q)` times (each stage's
/// state and sensitivity columns): a small matrix product each (docs/posteriordb.md at 8a480ca, "The stage
/// solves by explicit inverses").
fn invert_stage_matrices(jac: &[f64], n: usize, s: usize, diag: f64, scale: f64) -> Vec<f64> {
    let mut inverses = vec![f64::NAN; n * s * s];
    let (mut unit, mut column) = (vec![0.0; s], vec![0.0; s]);
    for i in 0..n {
        let mut w: Vec<f64> = jac[i * s * s..(i + 1) * s * s].iter().map(|v| -scale * v).collect();
        for k in 0..s {
            w[k * s + k] += diag;
        }
        let Some(pivots) = lu_factor(&mut w, s) else { continue };
        let inverse = &mut inverses[i * s * s..(i + 1) * s * s];
        for j in 0..s {
            unit.fill(0.0);
            unit[j] = 1.0;
            lu_solve(&w, &pivots, &unit, &mut column);
            for (k, v) in column.iter().enumerate() {
                inverse[k * s + j] = *v;
            }
        }
    }
    inverses
}

/// Every particle's stage solved in place with its inverse stage matrix: the state's column and
/// the `Q` sensitivity columns of `b = (y part [n, S], Z part [n, S, Q])`.
fn solve_stage(inverses: &[f64], b: &mut HostPoint, s: usize, q: usize) {
    let mut rhs = vec![0.0; s * q.max(1)];
    for (i, inverse) in inverses.chunks(s * s).enumerate() {
        let y = &mut b.0[i * s..(i + 1) * s];
        rhs[..s].copy_from_slice(y);
        for (k, out) in y.iter_mut().enumerate() {
            *out = (0..s).map(|m| inverse[k * s + m] * rhs[m]).sum();
        }
        let z = &mut b.1[i * s * q..(i + 1) * s * q];
        rhs[..s * q].copy_from_slice(z);
        for k in 0..s {
            for c in 0..q {
                z[k * q + c] = (0..s).map(|m| inverse[k * s + m] * rhs[m * q + c]).sum();
            }
        }
    }
}

fn identity(s: usize) -> Vec<f64> {
    (0..s * s).map(|i| if i / s == i % s { 1.0 } else { 0.0 }).collect()
}

/// Inverses of a batch of small matrices `[n, S, S]` by Gauss-Jordan elimination with partial
/// pivoting, as tensor operations (a loop over the S columns, none over the batch). A singular
/// matrix gives non-finite entries, which the step control treats as a failed step.
pub fn batched_inverse(a: Tensor<3>) -> Tensor<3> {
    let [n, s, _] = a.dims();
    let (device, dtype) = (a.device(), a.dtype());
    let eye = Tensor::<2>::from_data(TensorData::new(identity(s), [s, s]), (&device, dtype))
        .unsqueeze::<3>()
        .expand([n, s, s]);
    let mut m = Tensor::cat(vec![a, eye], 2); // [n, S, 2S]
    let rows = Tensor::<1, Int>::arange(0..s as i64, &device).reshape([1, s, 1]);
    for k in 0..s {
        // Pivot: the largest |m[i, k]| over rows i >= k (rows above k pushed below zero).
        let above = rows.clone().lower_elem(k as i64).expand([n, s, 1]);
        let column = m.clone().narrow(2, k, 1).abs().mask_fill(above, -1.0);
        let p = column.argmax(1); // [n, 1, 1]
        let row_p = m.clone().gather(1, p.clone().expand([n, 1, 2 * s]));
        let row_k = m.clone().narrow(1, k, 1);
        let is_p = rows.clone().expand([n, s, 2 * s]).equal(p.expand([n, s, 2 * s]));
        // Swap rows k and p, then eliminate column k from every other row.
        m = m.mask_where(is_p, row_k.expand([n, s, 2 * s]));
        let pivot = row_p.clone().narrow(2, k, 1);
        let r = row_p / pivot;
        m = m.slice_assign([0..n, k..k + 1, 0..2 * s], r.clone());
        let factors = m.clone().narrow(2, k, 1);
        m = m - factors * r.clone();
        m = m.slice_assign([0..n, k..k + 1, 0..2 * s], r);
    }
    m.narrow(2, s, s)
}
