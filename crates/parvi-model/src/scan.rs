//! Time loops without a loop: the linear recurrence `x_t = a_t x_{t-1} + b_t` for all particles
//! and all time points in `ceil(log2 T)` rounds of whole-row tensor operations.
//!
//! This is how to write a state-space or volatility model's recursion (an AR or ARMA's errors,
//! GARCH's variance, a local-level mean, stochastic volatility's AR(1) latent): a per-step loop
//! with `narrow` and `cat` costs `T` rounds of small autodiff nodes (an ARMA(1,1) over 200 steps
//! took 4.5 times the CPU of this scan, issue 43). A recursion that is not linear in `x_{t-1}`
//! has no such scan: [`recurrence`] runs it as a loop whose cost is one round of its own
//! operations per step and one concatenation at the end, nothing more.

use burn::tensor::Tensor;

use crate::ModelError;

fn invalid(name: &'static str, reason: String) -> ModelError {
    ModelError::InvalidParameter { dist: "linear_scan", name, reason }
}

/// `x_t = a_t x_{t-1} + b_t` along axis 1, with `x_{-1} = 0` (so `x_0 = b_0`; put an initial
/// state's `a_0 x_init` into `b_0`): `[n, T]`, `x_t = sum_{j <= t} (a_t ... a_{j+1}) b_j`.
///
/// `b` is `[n, T]` (or `[1, T]`, shared); `a` is `[n, 1]` or `[1, 1]` (one coefficient per
/// particle, the AR(1) and GARCH case) or `[n, T]`/`[1, T]` (one per time point).
///
/// Hillis & Steele's inclusive scan (1986) over the affine maps `x -> a_t x + b_t`: after the
/// round with shift `d`, `x_t` holds the terms `j > t - 2d` and `A_t` their coefficient
/// product; a map shifted in from before time 0 is the identity. With a constant `a` the
/// products are `a^(2d)` for every `t` (the shifted-in terms are zero), one square per round.
/// Each round is a few autodiff nodes over whole rows; the depth is `ceil(log2 T)` (8 for
/// `T = 200`). Sums are formed in the order of the recurrence's terms, so where `a` and `b` are
/// positive (a GARCH variance) nothing cancels; an explosive `|a| > 1` overflows as the
/// recurrence itself does.
///
/// # Errors
/// If the shapes do not fit: `b` not `[n or 1, T]` with `T > 0`, or `a` with a width other than
/// 1 or `T`, or row counts that do not broadcast.
pub fn linear_scan(a: Tensor<2>, b: Tensor<2>) -> Result<Tensor<2>, ModelError> {
    let ([na, ta], [nb, t]) = (a.dims(), b.dims());
    if t == 0 {
        return Err(invalid("b", "has no time points".into()));
    }
    if ta != 1 && ta != t {
        return Err(invalid("a", format!("is [{na}, {ta}]: needs one column or T = {t}")));
    }
    if na != nb && na != 1 && nb != 1 {
        return Err(invalid("a", format!("has {na} rows against b's {nb}")));
    }
    let n = na.max(nb);
    let mut x = if nb == n { b } else { b.expand([n, t]) };
    let device = x.device();
    let dtype = x.dtype();
    if ta == 1 {
        let mut power = a;
        let mut shift = 1;
        while shift < t {
            let lagged =
                Tensor::cat(vec![Tensor::zeros([n, shift], (&device, dtype)), x.clone().narrow(1, 0, t - shift)], 1);
            x = x + lagged * power.clone();
            power = power.square();
            shift *= 2;
        }
        return Ok(x);
    }
    let mut coef = if na == n { a } else { a.expand([n, t]) };
    let mut shift = 1;
    while shift < t {
        let lagged_x =
            Tensor::cat(vec![Tensor::zeros([n, shift], (&device, dtype)), x.clone().narrow(1, 0, t - shift)], 1);
        x = x + lagged_x * coef.clone();
        // The identity map (coefficient 1) shifts in before time 0.
        if shift * 2 < t {
            let lagged_a =
                Tensor::cat(vec![Tensor::ones([n, shift], (&device, dtype)), coef.clone().narrow(1, 0, t - shift)], 1);
            coef = coef * lagged_a;
        }
        shift *= 2;
    }
    Ok(x)
}

/// A recursion that is not linear in its state (a non-linear state-space model, a logistic
/// growth, a GARCH with a leverage term): `x_t = step(t, x_{t-1})` for `t = 0 .. T-1` from
/// `x_{-1} = init` `[n, K]`, all particles at once: `[n, T, K]`, `x_t` at index `t`.
///
/// The cost is what a user can count: `T` calls of `step` (each its own handful of autodiff
/// nodes over `[n, K]`) and one `T`-way concatenation at the end, so it grows at least linearly
/// in `T` where [`linear_scan`]'s grows as `log T` (the two timed in `docs/benchmarks.md`).
/// `step` reads its time point's data by index (`y.clone().narrow(1, t, 1)`, a view, not a
/// copy).
///
/// # Errors
/// If `steps` is 0, `init` has no columns, or `step` returns an error or a state of another shape
/// than `init`'s (naming the time point).
pub fn recurrence(
    init: Tensor<2>,
    steps: usize,
    mut step: impl FnMut(usize, Tensor<2>) -> Result<Tensor<2>, ModelError>,
) -> Result<Tensor<3>, ModelError> {
    let dims = init.dims();
    if steps == 0 {
        return Err(ModelError::InvalidParameter {
            dist: "recurrence",
            name: "steps",
            reason: "must be at least 1".into(),
        });
    }
    if dims[1] == 0 {
        return Err(ModelError::InvalidParameter {
            dist: "recurrence",
            name: "init",
            reason: "has no columns: the state needs at least one".into(),
        });
    }
    let mut states = Vec::with_capacity(steps);
    let mut x = init;
    for t in 0..steps {
        x = step(t, x)?;
        if x.dims() != dims {
            return Err(ModelError::InvalidParameter {
                dist: "recurrence",
                name: "step",
                reason: format!("returned a state of shape {:?} at t = {t}, expected {dims:?}", x.dims()),
            });
        }
        states.push(x.clone().unsqueeze_dim::<3>(1));
    }
    Ok(Tensor::cat(states, 1))
}
