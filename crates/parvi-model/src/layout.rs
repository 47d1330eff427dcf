//! Parameter layouts: named blocks of a particle vector, each with a shape and a constraint.
//!
//! Engines move particles in unconstrained space `R^dim`; a layout maps a particle matrix to the
//! constrained values a model uses, adding the log-Jacobian of every transform, and maps
//! constrained values back (for initialisation from prior draws, and for reporting samples).
//!
//! A block's free width (the columns it takes in the particle, [`Block::free_size`]) can differ
//! from its number of constrained values ([`Block::size`]): a `simplex[K]` takes `K - 1` free
//! values, a `cholesky_factor_corr[K]` takes `K (K - 1) / 2`. The transforms and their
//! log-Jacobians are the ones Stan uses (Stan reference manual, "Constraint transforms"; Stan
//! math's `stan/math/prim/constraint/*_constrain.hpp`), so a model written here has the same
//! unconstrained density as its Stan program.

use burn::tensor::{Device, Int, Tensor, TensorData, activation};
use serde::{Deserialize, Serialize};

use crate::ModelError;

/// How far a simplex's sum or a correlation Cholesky factor's row norm may be from 1 before
/// [`ParamLayout::unconstrain`] refuses it: Stan's `CONSTRAINT_TOLERANCE`.
pub const CONSTRAINT_TOLERANCE: f64 = 1e-8;

/// The support of a parameter block, and the transform from `R` that reaches it.
///
/// Elementwise constraints (`Real`, `Positive`, `Interval`, `Lower`, `Upper`,
/// `OffsetMultiplier`) take blocks of any shape; the vector constraints (`Ordered`,
/// `PositiveOrdered`, `Simplex`) take shape `[K]`; the matrix ones take `[K, K]`
/// (`CholeskyFactorCorr`) or `[M, N]` with `M >= N` (`CholeskyFactorCov`), their values laid
/// out row-major.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Constraint {
    /// `R`: identity.
    Real,
    /// `(0, inf)`: `exp`.
    Positive,
    /// `(lower, upper)`: `lower + (upper - lower) * sigmoid`.
    Interval {
        /// Lower end of the support (finite, excluded).
        lower: f64,
        /// Upper end of the support (finite, excluded).
        upper: f64,
    },
    /// Strictly increasing vectors (Stan's `ordered[K]`, e.g. the component means of a mixture
    /// made identifiable): `y_1 = x_1`, `y_k = y_{k-1} + exp(x_k)`, the transform Stan uses, with
    /// log-Jacobian `sum_{k >= 2} x_k`. Only for one-dimensional blocks.
    Ordered,
    /// `(lower, inf)` (Stan's `<lower=L>`): `y = exp(x) + lower`, log-Jacobian `x`.
    Lower {
        /// Lower end of the support (finite, excluded).
        lower: f64,
    },
    /// `(-inf, upper)` (Stan's `<upper=U>`): `y = upper - exp(x)`, log-Jacobian `x`.
    Upper {
        /// Upper end of the support (finite, excluded).
        upper: f64,
    },
    /// `R` through Stan's affine transform `<offset=o, multiplier=m>`: `y = o + m x`,
    /// log-Jacobian `log m` per element. Used for non-centred parameterisations.
    OffsetMultiplier {
        /// The shift `o` (finite).
        offset: f64,
        /// The scale `m` (finite, positive).
        multiplier: f64,
    },
    /// Strictly increasing positive vectors (Stan's `positive_ordered[K]`):
    /// `y_1 = exp(x_1)`, `y_k = y_{k-1} + exp(x_k)`, log-Jacobian `sum_k x_k`.
    PositiveOrdered,
    /// The interior of the unit simplex (Stan's `simplex[K]`, `K - 1` free values) by Stan's
    /// centred stick-breaking: `z_k = logit^-1(x_k - log(K - k))` (`k` from 1),
    /// `y_k = (1 - sum_{l<k} y_l) z_k`, `y_K` the rest of the stick. Shape `[K]`, or `[M, K]`
    /// for Stan's `array[M] simplex[K]` (each row a simplex, `M (K - 1)` free values, row by
    /// row as Stan lays them out).
    Simplex,
    /// Cholesky factors of `K x K` correlation matrices (Stan's `cholesky_factor_corr[K]`,
    /// `K (K - 1) / 2` free values): `tanh` to canonical partial correlations, rows built as in
    /// Stan math's `cholesky_corr_constrain`.
    CholeskyFactorCorr,
    /// Cholesky factors of covariance matrices, `M x N` lower-trapezoidal with a positive
    /// diagonal (Stan's `cholesky_factor_cov[M, N]`, `N (N + 1) / 2 + (M - N) N` free values,
    /// read row by row, `exp` on the diagonal).
    CholeskyFactorCov,
}

/// An [`ModelError::InvalidBlock`] naming block `name`.
fn invalid(name: &str, reason: String) -> ModelError {
    ModelError::InvalidBlock { name: name.to_string(), reason }
}

/// The row-major multi-index of flat element `k` of a block of `shape`, as `[i, j]`.
fn element(shape: &[usize], k: usize) -> String {
    let mut rest = k;
    let mut index = vec![0usize; shape.len()];
    for (slot, &extent) in index.iter_mut().zip(shape).rev() {
        *slot = rest % extent.max(1);
        rest /= extent.max(1);
    }
    let parts: Vec<String> = index.iter().map(usize::to_string).collect();
    format!("[{}]", parts.join(", "))
}

/// `[len]` integer indices on `device` (for `select`, which gathers columns in one batched op).
fn indices(values: Vec<i64>, device: &Device) -> Tensor<1, Int> {
    let len = values.len();
    Tensor::from_data(TensorData::new(values, [len]), device)
}

/// A `[1, len]` row of constants with `like`'s device and dtype, to broadcast over particles.
fn const_row(values: Vec<f64>, like: &Tensor<2>) -> Tensor<2> {
    let len = values.len();
    Tensor::from_data(TensorData::new(values, [1, len]), (&like.device(), like.dtype()))
}

/// `[n, k] -> [n]`: the sum over each particle's values.
/// A block's values with its summed log-Jacobian `[n]` as one column `[n, 1]`.
fn column((values, log_jac): (Tensor<2>, Option<Tensor<1>>)) -> (Tensor<2>, Option<Tensor<2>>) {
    let n = values.dims()[0];
    (values, log_jac.map(|lj| lj.reshape([n, 1])))
}

fn row_sum(x: Tensor<2>) -> Tensor<1> {
    let n = x.dims()[0];
    x.sum_dim(1).reshape([n])
}

/// The exclusive cumulative sum along the last axis (`out[.., j] = sum_{l<j} x[.., l]`) from the
/// inclusive one `cs`, shifted by one column: `cs - x` would lose digits where `cs` is large.
fn shift_right<const D: usize>(cs: Tensor<D>) -> Tensor<D> {
    let mut dims = cs.dims();
    let last = D - 1;
    let k = dims[last];
    dims[last] = 1;
    let zeros = Tensor::zeros(dims, (&cs.device(), cs.dtype()));
    if k == 1 {
        return zeros;
    }
    Tensor::cat(vec![zeros, cs.narrow(last, 0, k - 1)], last)
}

/// `i (i - 1) / 2` without underflow at `i = 0`: the free values before row `i` of a strictly
/// lower triangle read row by row.
fn triangle(i: usize) -> usize {
    i * i.saturating_sub(1) / 2
}

impl Constraint {
    /// Number of free (unconstrained) values of a block of `shape`.
    fn free_size(self, shape: &[usize]) -> usize {
        let size: usize = shape.iter().product();
        let first = shape.first().copied().unwrap_or(0);
        match self {
            // Each row (all axes but the last) is a simplex of the last axis' length.
            Constraint::Simplex => {
                let k = shape.last().copied().unwrap_or(0);
                (size / k.max(1)) * k.saturating_sub(1)
            }
            Constraint::CholeskyFactorCorr => triangle(first),
            Constraint::CholeskyFactorCov => {
                let cols = shape.get(1).copied().unwrap_or(0);
                cols * (cols + 1) / 2 + first.saturating_sub(cols) * cols
            }
            _ => size,
        }
    }

    /// The constraint's own numbers are usable and the block's shape fits it.
    fn validate(self, block: &str, shape: &[usize]) -> Result<(), ModelError> {
        let bad = |reason: String| Err(invalid(block, reason));
        match self {
            Constraint::Interval { lower, upper } if !(lower.is_finite() && upper.is_finite() && lower < upper) => {
                bad(format!("interval ({lower}, {upper}) needs finite lower < upper"))
            }
            Constraint::Lower { lower } if !lower.is_finite() => {
                bad(format!("lower bound {lower} must be finite (an unbounded block is `real`)"))
            }
            Constraint::Upper { upper } if !upper.is_finite() => {
                bad(format!("upper bound {upper} must be finite (an unbounded block is `real`)"))
            }
            Constraint::OffsetMultiplier { offset, multiplier }
                if !(offset.is_finite() && multiplier.is_finite() && multiplier > 0.0) =>
            {
                bad(format!("offset {offset} must be finite and multiplier {multiplier} finite and positive"))
            }
            Constraint::Ordered | Constraint::PositiveOrdered if shape.len() != 1 => {
                bad(format!("{} block is a vector: shape must have one axis, got {shape:?}", self.stan_name()))
            }
            Constraint::Simplex if !(1..=2).contains(&shape.len()) => bad(format!(
                "a simplex block is a vector [K] or an array of them [M, K]: shape must have one or two axes, got {shape:?}"
            )),
            Constraint::CholeskyFactorCorr if shape.len() != 2 || shape[0] != shape[1] => {
                bad(format!("a cholesky_factor_corr block is a square matrix [K, K], got shape {shape:?}"))
            }
            Constraint::CholeskyFactorCov if shape.len() != 2 || shape[0] < shape[1] => {
                bad(format!("a cholesky_factor_cov block is a matrix [M, N] with M >= N, got shape {shape:?}"))
            }
            _ => Ok(()),
        }
    }

    /// The constraint's name in Stan, for messages.
    fn stan_name(self) -> &'static str {
        match self {
            Constraint::Ordered => "an ordered",
            Constraint::PositiveOrdered => "a positive_ordered",
            Constraint::Simplex => "a simplex",
            _ => "this",
        }
    }

    /// Constrained values `[n, size]` of the block whose free values are columns
    /// `offset..offset + free_size` of `particles`, and its log-Jacobian `log |dy/dx|` summed per
    /// particle `[n]` (`None` where it is zero).
    /// The block's constrained values `[n, size]` and its log-Jacobian's terms `[n, k]` (their
    /// row sums are the block's log-Jacobian), left unsummed so that the density sums every
    /// block's with its own terms at once.
    fn forward(self, particles: &Tensor<2>, offset: usize, shape: &[usize]) -> (Tensor<2>, Option<Tensor<2>>) {
        let n = particles.dims()[0];
        let free = self.free_size(shape);
        if free == 0 {
            // `simplex[1]` and `cholesky_factor_corr[1]`: the only value is 1, nothing is sampled.
            let size = shape.iter().product::<usize>();
            return (Tensor::ones([n, size], (&particles.device(), particles.dtype())), None);
        }
        let x = particles.clone().narrow(1, offset, free);
        match self {
            Constraint::Real => (x, None),
            Constraint::Positive => (x.clone().exp(), Some(x)),
            Constraint::Interval { lower, upper } => {
                let width = upper - lower;
                let y = activation::sigmoid(x.clone()).mul_scalar(width).add_scalar(lower);
                // log sigma(x) + log(1 - sigma(x)) = -softplus(-x) - softplus(x)
                let log_jac = (activation::softplus(x.clone().neg(), 1.0) + activation::softplus(x, 1.0))
                    .neg()
                    .add_scalar(width.ln());
                (y, Some(log_jac))
            }
            // Stan's lb_constrain / ub_constrain: y = exp(x) + L, y = U - exp(x); |dy/dx| = exp(x).
            Constraint::Lower { lower } => (x.clone().exp().add_scalar(lower), Some(x)),
            Constraint::Upper { upper } => (x.clone().exp().neg().add_scalar(upper), Some(x)),
            // Stan's offset_multiplier_constrain: y = o + m x adds log m per element.
            Constraint::OffsetMultiplier { offset, multiplier } => {
                let y = x.mul_scalar(multiplier).add_scalar(offset);
                let log_jac = (free as f64) * multiplier.ln();
                let log_jac = (log_jac != 0.0).then(|| Tensor::full([n, 1], log_jac, (&y.device(), y.dtype())));
                (y, log_jac)
            }
            Constraint::Ordered => {
                if free == 1 {
                    return (x, None);
                }
                let increments = x.clone().narrow(1, 1, free - 1);
                let steps = Tensor::cat(vec![x.narrow(1, 0, 1), increments.clone().exp()], 1);
                (steps.cumsum(1), Some(increments))
            }
            // Stan's positive_ordered_constrain: y = cumsum(exp(x)), log-Jacobian sum(x).
            Constraint::PositiveOrdered => (x.clone().exp().cumsum(1), Some(x)),
            Constraint::Simplex if shape.len() == 2 => {
                // `array[M] simplex[K]`: the M rows transformed as M particles' simplexes.
                let (rows, k) = (shape[0], shape[1]);
                let (values, log_jac) = Self::simplex(x.reshape([n * rows, k - 1]));
                (values.reshape([n, rows * k]), log_jac.map(|lj| lj.reshape([n, rows])))
            }
            Constraint::Simplex => column(Self::simplex(x)),
            Constraint::CholeskyFactorCorr => column(Self::cholesky_corr(x, shape[0])),
            Constraint::CholeskyFactorCov => column(Self::cholesky_cov(x, shape[0], shape[1])),
        }
    }

    /// Stan math's `simplex_constrain` (centred stick-breaking) for all particles at once, in log
    /// space: break `k` (from 0) takes the share `z_k = logit^-1(x_k - log(K - 1 - k))` of the
    /// stick left, `log stick_k = sum_{l<k} log(1 - z_l)` (a cumulative sum), and Stan adds
    /// `log stick_k + log z_k + log(1 - z_k)` per break.
    fn simplex(x: Tensor<2>) -> (Tensor<2>, Option<Tensor<1>>) {
        let km1 = x.dims()[1];
        let shift = const_row((0..km1).map(|k| -((km1 - k) as f64).ln()).collect(), &x);
        let adj = x + shift;
        let log_z = activation::softplus(adj.clone().neg(), 1.0).neg();
        let log_1mz = activation::softplus(adj, 1.0).neg();
        // Inclusive: the log of the stick left after breaks 0..=k; the last is y_K.
        let log_left = log_1mz.cumsum(1);
        let head = (shift_right(log_left.clone()) + log_z.clone()).exp();
        let last = log_left.clone().narrow(1, km1 - 1, 1).exp();
        // sum_k (log stick_k + log(1 - z_k)) is sum_k log_left_k.
        let log_jac = row_sum(log_left + log_z);
        (Tensor::cat(vec![head, last], 1), Some(log_jac))
    }

    /// Stan math's `cholesky_corr_constrain` for all particles at once. With `z = tanh(x)` the
    /// canonical partial correlations laid into the strict lower triangle row by row,
    /// `L_ij = z_ij sqrt(1 - sum_{l<j} L_il^2)` and `L_ii = sqrt(1 - sum_{l<i} L_il^2)`; since
    /// `1 - sum_{l<=j} L_il^2 = (1 - sum_{l<j} L_il^2)(1 - z_ij^2)`, the log of what is left
    /// before column `j` is the exclusive cumulative sum of `log(1 - z_il^2)` along the row. Stan
    /// adds `sum log(1 - z^2)` (the `tanh`) and `0.5 log(1 - sum_{l<j} L_il^2)` for every
    /// `0 < j < i`.
    fn cholesky_corr(x: Tensor<2>, k: usize) -> (Tensor<2>, Option<Tensor<1>>) {
        let [n, free] = x.dims();
        let (device, dtype) = (x.device(), x.dtype());
        let z = x.clone().tanh();
        // log(1 - tanh(x)^2) = 2 (log 2 - x - softplus(-2x)): finite where 1 - z^2 rounds to 0.
        let log_1mz2 = (x.clone().neg().add_scalar(std::f64::consts::LN_2)
            - activation::softplus(x.mul_scalar(-2.0), 1.0))
        .mul_scalar(2.0);
        // Column `free` of the padded rows holds 0, column `free + 1` holds 1.
        let (mut w_idx, mut l_idx, mut strict) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..k {
            for j in 0..k {
                let (w, l) = match j.cmp(&i) {
                    std::cmp::Ordering::Less => {
                        strict.push((i * k + j) as i64);
                        let pos = (triangle(i) + j) as i64;
                        (pos, pos)
                    }
                    std::cmp::Ordering::Equal => (free as i64 + 1, free as i64),
                    std::cmp::Ordering::Greater => (free as i64, free as i64),
                };
                w_idx.push(w);
                l_idx.push(l);
            }
        }
        let zeros = Tensor::zeros([n, 1], (&device, dtype));
        let ones = Tensor::ones([n, 1], (&device, dtype));
        let w = Tensor::cat(vec![z, zeros.clone(), ones], 1).select(1, indices(w_idx, &device));
        let l = Tensor::cat(vec![log_1mz2.clone(), zeros], 1).select(1, indices(l_idx, &device));
        let log_rest = shift_right(l.reshape([n, k, k]).cumsum(2)).reshape([n, k * k]);
        let factor = w * log_rest.clone().mul_scalar(0.5).exp();
        let log_jac = row_sum(log_1mz2) + row_sum(log_rest.select(1, indices(strict, &device))).mul_scalar(0.5);
        (factor, Some(log_jac))
    }

    /// Stan math's `cholesky_factor_constrain` for all particles at once: the free values fill
    /// the lower trapezoid of an `m x cols` matrix row by row, the diagonal through `exp`; Stan
    /// adds the diagonal's free values.
    fn cholesky_cov(x: Tensor<2>, m: usize, cols: usize) -> (Tensor<2>, Option<Tensor<1>>) {
        let [n, free] = x.dims();
        let device = x.device();
        let row_start = |r: usize| if r < cols { r * (r + 1) / 2 } else { cols * (cols + 1) / 2 + (r - cols) * cols };
        let diag: Vec<i64> = (0..cols).map(|r| (row_start(r) + r) as i64).collect();
        // Only the diagonal goes through exp: an off-diagonal value large enough to overflow it
        // would otherwise leave `0 * inf = NaN` in the backward pass.
        let log_diag = x.clone().select(1, indices(diag, &device));
        let zeros = Tensor::zeros([n, 1], (&device, x.dtype()));
        let mut idx = Vec::with_capacity(m * cols);
        for r in 0..m {
            for c in 0..cols {
                idx.push(match c.cmp(&r) {
                    std::cmp::Ordering::Less => row_start(r) + c,
                    std::cmp::Ordering::Equal => free + r,
                    std::cmp::Ordering::Greater => free + cols,
                } as i64);
            }
        }
        let padded = Tensor::cat(vec![x, log_diag.clone().exp(), zeros], 1);
        (padded.select(1, indices(idx, &device)), Some(row_sum(log_diag)))
    }

    /// The free values of one block's constrained values `ys` (row-major, `shape`); an error
    /// names the block and the element when they are outside the support.
    fn inverse_block(self, ys: &[f64], shape: &[usize], block: &str) -> Result<Vec<f64>, ModelError> {
        let bad = |k: usize, reason: String| Err(invalid(block, format!("element {}: {reason}", element(shape, k))));
        if let Some(k) = ys.iter().position(|y| !y.is_finite()) {
            return bad(k, format!("value {} is not finite", ys[k]));
        }
        match self {
            Constraint::Ordered | Constraint::PositiveOrdered => {
                if self == Constraint::PositiveOrdered && ys[0] <= 0.0 {
                    return bad(0, format!("positive_ordered values must be positive, got {}", ys[0]));
                }
                if let Some(k) = (1..ys.len()).find(|&k| ys[k] <= ys[k - 1]) {
                    return bad(k, format!("ordered values must increase strictly: {} after {}", ys[k], ys[k - 1]));
                }
                let first = if self == Constraint::Ordered { ys[0] } else { ys[0].ln() };
                Ok(std::iter::once(first).chain(ys.windows(2).map(|w| (w[1] - w[0]).ln())).collect())
            }
            Constraint::Simplex if shape.len() == 2 => {
                // One simplex per row; an error names the row's element in the whole block.
                let k = shape[1];
                let mut out = Vec::with_capacity(shape[0] * k.saturating_sub(1));
                for (r, row) in ys.chunks(k).enumerate() {
                    let free = Constraint::Simplex.inverse_block(row, &[k], block).map_err(|e| match e {
                        ModelError::InvalidBlock { name, reason } => {
                            ModelError::InvalidBlock { name, reason: format!("row [{r}]: {reason}") }
                        }
                        other => other,
                    })?;
                    out.extend(free);
                }
                Ok(out)
            }
            Constraint::Simplex => {
                if let Some(k) = ys.iter().position(|&y| y <= 0.0) {
                    return bad(k, format!("simplex entries must be positive (the open simplex), got {}", ys[k]));
                }
                let sum: f64 = ys.iter().sum();
                if (sum - 1.0).abs() > CONSTRAINT_TOLERANCE {
                    return Err(invalid(
                        block,
                        format!("simplex entries sum to {sum}, not 1 (tolerance {CONSTRAINT_TOLERANCE})"),
                    ));
                }
                // Stan math's simplex_free, the stick summed from its far end:
                // x_k = logit(y_k / (y_k + tail_k)) + log(K - 1 - k) = log(y_k / tail_k) + log(K - 1 - k).
                let km1 = ys.len() - 1;
                let mut out = vec![0.0; km1];
                let mut tail = ys[km1];
                for (k, (free, &y)) in out.iter_mut().zip(ys).enumerate().rev() {
                    *free = (y / tail).ln() + ((km1 - k) as f64).ln();
                    tail += y;
                }
                Ok(out)
            }
            Constraint::CholeskyFactorCorr => Self::cholesky_corr_free(ys, shape[0], block),
            Constraint::CholeskyFactorCov => Self::cholesky_cov_free(ys, shape[0], shape[1], block),
            _ => ys
                .iter()
                .enumerate()
                .map(|(k, &y)| {
                    self.inverse(y).ok_or_else(|| {
                        invalid(
                            block,
                            format!(
                                "element {}: value {y} is outside the support {}",
                                element(shape, k),
                                self.support()
                            ),
                        )
                    })
                })
                .collect(),
        }
    }

    /// An elementwise constraint's support, for messages.
    fn support(self) -> String {
        match self {
            Constraint::Positive => "(0, inf)".into(),
            Constraint::Interval { lower, upper } => format!("({lower}, {upper})"),
            Constraint::Lower { lower } => format!("({lower}, inf)"),
            Constraint::Upper { upper } => format!("(-inf, {upper})"),
            _ => "(-inf, inf)".into(),
        }
    }

    /// The free value of one finite constrained value of an elementwise constraint; `None`
    /// outside the support.
    fn inverse(self, y: f64) -> Option<f64> {
        match self {
            Constraint::Positive if y > 0.0 => Some(y.ln()),
            Constraint::Interval { lower, upper } if y > lower && y < upper => {
                let u = (y - lower) / (upper - lower);
                Some((u / (1.0 - u)).ln())
            }
            Constraint::Lower { lower } if y > lower => Some((y - lower).ln()),
            Constraint::Upper { upper } if y < upper => Some((upper - y).ln()),
            Constraint::OffsetMultiplier { offset, multiplier } => Some((y - offset) / multiplier),
            Constraint::Real => Some(y),
            _ => None,
        }
    }

    /// Stan math's `cholesky_corr_free` after the checks of `check_cholesky_factor_corr`: lower
    /// triangular, positive diagonal, rows of unit norm.
    fn cholesky_corr_free(ys: &[f64], k: usize, block: &str) -> Result<Vec<f64>, ModelError> {
        let bad = |i: usize, j: usize, reason: String| Err(invalid(block, format!("element [{i}, {j}]: {reason}")));
        for i in 0..k {
            let row = &ys[i * k..(i + 1) * k];
            if let Some(j) = (i + 1..k).find(|&j| row[j] != 0.0) {
                return bad(i, j, format!("a Cholesky factor is lower triangular: {} above the diagonal", row[j]));
            }
            if row[i] <= 0.0 {
                return bad(i, i, format!("a Cholesky factor has a positive diagonal, got {}", row[i]));
            }
            let norm2: f64 = row.iter().map(|v| v * v).sum();
            if (norm2 - 1.0).abs() > CONSTRAINT_TOLERANCE {
                return Err(invalid(
                    block,
                    format!(
                        "row {i} of a correlation Cholesky factor has squared norm {norm2}, not 1 (tolerance {CONSTRAINT_TOLERANCE})"
                    ),
                ));
            }
        }
        let mut out = Vec::with_capacity(triangle(k));
        for i in 1..k {
            let mut sum_sqs = 0.0_f64;
            for j in 0..i {
                let v = ys[i * k + j];
                let z = v / (1.0 - sum_sqs).sqrt();
                if z.is_nan() || z.abs() >= 1.0 {
                    return bad(i, j, format!("partial correlation {z} is outside (-1, 1)"));
                }
                out.push(z.atanh());
                sum_sqs += v * v;
            }
        }
        Ok(out)
    }

    /// Stan math's `cholesky_factor_free` after the checks of `check_cholesky_factor`: lower
    /// trapezoidal, positive diagonal.
    fn cholesky_cov_free(ys: &[f64], m: usize, cols: usize, block: &str) -> Result<Vec<f64>, ModelError> {
        let mut out = Vec::with_capacity(ys.len());
        for r in 0..m {
            for c in 0..cols {
                let v = ys[r * cols + c];
                let bad = |reason: String| Err(invalid(block, format!("element [{r}, {c}]: {reason}")));
                match c.cmp(&r) {
                    std::cmp::Ordering::Less => out.push(v),
                    std::cmp::Ordering::Equal if v > 0.0 => out.push(v.ln()),
                    std::cmp::Ordering::Equal => {
                        return bad(format!("a Cholesky factor has a positive diagonal, got {v}"));
                    }
                    std::cmp::Ordering::Greater if v != 0.0 => {
                        return bad(format!("a Cholesky factor is lower triangular: {v} above the diagonal"));
                    }
                    std::cmp::Ordering::Greater => {}
                }
            }
        }
        Ok(out)
    }
}

/// One named block of the particle vector.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Block {
    /// Name the model looks the block up by; unique in its layout.
    pub name: String,
    /// Shape of the block's constrained values for one particle (`[]` for a scalar).
    pub shape: Vec<usize>,
    /// Support of the block's values, and the transform that reaches it from `R`.
    pub constraint: Constraint,
    /// First column of the block's free values in the particle vector.
    pub offset: usize,
}

impl Block {
    /// Number of constrained values in the block (the product of its shape): its width in
    /// [`ParamLayout::constrain`]'s output and in [`Unpacked::flat`].
    pub fn size(&self) -> usize {
        self.shape.iter().product()
    }

    /// Number of free (unconstrained) values: the columns `offset..offset + free_size()` the
    /// block takes in the particle vector (`K - 1` for a `simplex[K]`, `K (K - 1) / 2` for a
    /// `cholesky_factor_corr[K]`, the size for elementwise constraints).
    pub fn free_size(&self) -> usize {
        self.constraint.free_size(&self.shape)
    }
}

/// The named blocks that make up a particle, in order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ParamLayout {
    blocks: Vec<Block>,
    dim: usize,
}

impl ParamLayout {
    /// An empty layout, to be filled with [`ParamLayout::add`] and its shorthands.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a block; names must be unique, shapes non-empty in size and fit the constraint
    /// (one axis for the vector constraints, `[K, K]` for `CholeskyFactorCorr`, `[M, N]` with
    /// `M >= N` for `CholeskyFactorCov`), and the constraint's numbers usable.
    pub fn add(mut self, name: &str, shape: &[usize], constraint: Constraint) -> Result<Self, ModelError> {
        if self.blocks.iter().any(|b| b.name == name) {
            return Err(ModelError::DuplicateBlock(name.to_string()));
        }
        constraint.validate(name, shape)?;
        let block = Block { name: name.to_string(), shape: shape.to_vec(), constraint, offset: self.dim };
        if block.size() == 0 {
            return Err(invalid(name, "block has no elements".into()));
        }
        self.dim += block.free_size();
        self.blocks.push(block);
        Ok(self)
    }

    /// Adds an unconstrained block.
    pub fn real(self, name: &str, shape: &[usize]) -> Result<Self, ModelError> {
        self.add(name, shape, Constraint::Real)
    }

    /// Adds a positive block (sampled as its logarithm).
    pub fn positive(self, name: &str, shape: &[usize]) -> Result<Self, ModelError> {
        self.add(name, shape, Constraint::Positive)
    }

    /// Adds a block constrained to `(lower, upper)`.
    pub fn interval(self, name: &str, shape: &[usize], lower: f64, upper: f64) -> Result<Self, ModelError> {
        self.add(name, shape, Constraint::Interval { lower, upper })
    }

    /// Adds a block constrained to `(lower, upper)`: Stan's `<lower=L, upper=U>`, the same as
    /// [`ParamLayout::interval`].
    pub fn bounded(self, name: &str, shape: &[usize], lower: f64, upper: f64) -> Result<Self, ModelError> {
        self.interval(name, shape, lower, upper)
    }

    /// Adds a block bounded below by `lower` (Stan's `<lower=L>`).
    pub fn lower(self, name: &str, shape: &[usize], lower: f64) -> Result<Self, ModelError> {
        self.add(name, shape, Constraint::Lower { lower })
    }

    /// Adds a block bounded above by `upper` (Stan's `<upper=U>`).
    pub fn upper(self, name: &str, shape: &[usize], upper: f64) -> Result<Self, ModelError> {
        self.add(name, shape, Constraint::Upper { upper })
    }

    /// Adds a real block sampled as `(y - offset) / multiplier` (Stan's
    /// `<offset=o, multiplier=m>`, the non-centred parameterisation).
    pub fn offset_multiplier(
        self,
        name: &str,
        shape: &[usize],
        offset: f64,
        multiplier: f64,
    ) -> Result<Self, ModelError> {
        self.add(name, shape, Constraint::OffsetMultiplier { offset, multiplier })
    }

    /// Adds a strictly increasing vector of `len` values (Stan's `ordered[len]`).
    pub fn ordered(self, name: &str, len: usize) -> Result<Self, ModelError> {
        self.add(name, &[len], Constraint::Ordered)
    }

    /// Adds a strictly increasing vector of `len` positive values (Stan's
    /// `positive_ordered[len]`).
    pub fn positive_ordered(self, name: &str, len: usize) -> Result<Self, ModelError> {
        self.add(name, &[len], Constraint::PositiveOrdered)
    }

    /// Adds a simplex of `k` values (Stan's `simplex[k]`; `k - 1` free values).
    pub fn simplex(self, name: &str, k: usize) -> Result<Self, ModelError> {
        self.add(name, &[k], Constraint::Simplex)
    }

    /// Adds `m` simplexes of `k` values each (Stan's `array[m] simplex[k]`, values `[m, k]`,
    /// `m (k - 1)` free values), the rows of a transition matrix for example.
    pub fn simplex_array(self, name: &str, m: usize, k: usize) -> Result<Self, ModelError> {
        self.add(name, &[m, k], Constraint::Simplex)
    }

    /// Adds the Cholesky factor of a `k x k` correlation matrix (Stan's
    /// `cholesky_factor_corr[k]`; `k (k - 1) / 2` free values, values `[k, k]`).
    pub fn cholesky_factor_corr(self, name: &str, k: usize) -> Result<Self, ModelError> {
        self.add(name, &[k, k], Constraint::CholeskyFactorCorr)
    }

    /// Adds an `m x n` Cholesky factor of a covariance matrix (Stan's
    /// `cholesky_factor_cov[m, n]`, `m >= n`; values `[m, n]`).
    pub fn cholesky_factor_cov(self, name: &str, m: usize, n: usize) -> Result<Self, ModelError> {
        self.add(name, &[m, n], Constraint::CholeskyFactorCov)
    }

    /// Dimension of a particle: the number of free (unconstrained) values of all blocks.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Number of constrained values of all blocks: the width of [`ParamLayout::constrain`]'s
    /// output and of [`ParamLayout::unconstrain`]'s input.
    pub fn constrained_dim(&self) -> usize {
        self.blocks.iter().map(Block::size).sum()
    }

    /// The blocks in particle order.
    pub fn blocks(&self) -> &[Block] {
        &self.blocks
    }

    /// The block called `name`.
    pub fn block(&self, name: &str) -> Result<&Block, ModelError> {
        self.blocks.iter().find(|b| b.name == name).ok_or_else(|| ModelError::UnknownBlock(name.to_string()))
    }

    /// Constrained values of every block and the summed log-Jacobian, for all particles
    /// `[n, dim]`, in the particles' dtype.
    pub fn unpack(&self, particles: Tensor<2>) -> Unpacked<'_> {
        let [n, _] = particles.dims();
        let mut values = Vec::with_capacity(self.blocks.len());
        let mut log_jacobian = Vec::new();
        for block in &self.blocks {
            let (value, log_jac) = block.constraint.forward(&particles, block.offset, &block.shape);
            log_jacobian.extend(log_jac);
            values.push(value);
        }
        Unpacked {
            layout: self,
            values,
            log_jacobian,
            particles: n,
            device: particles.device(),
            dtype: particles.dtype(),
        }
    }

    /// Constrained values `[n, constrained_dim]` (blocks in layout order, each row-major, as
    /// [`ParamLayout::constrain`] gives them) split into the blocks as the model sees them, with
    /// no log-Jacobian: the generated quantities and transformed parameters of given constrained
    /// values (CmdStan's standalone generated quantities) read them without a round trip through
    /// the unconstrained space, so they see exactly the values written.
    pub fn unpack_constrained(&self, constrained: Tensor<2>) -> Result<Unpacked<'_>, ModelError> {
        let [n, width] = constrained.dims();
        if width != self.constrained_dim() {
            return Err(ModelError::DimensionMismatch { expected: self.constrained_dim(), got: width });
        }
        let mut values = Vec::with_capacity(self.blocks.len());
        let mut start = 0;
        for block in &self.blocks {
            values.push(constrained.clone().narrow(1, start, block.size()));
            start += block.size();
        }
        Ok(Unpacked {
            layout: self,
            values,
            log_jacobian: Vec::new(),
            particles: n,
            device: constrained.device(),
            dtype: constrained.dtype(),
        })
    }

    /// The particle matrix `[n, dim]` mapped to constrained space `[n, constrained_dim]`, blocks
    /// in layout order, each row-major (for reporting samples).
    pub fn constrain(&self, particles: Tensor<2>) -> Tensor<2> {
        let unpacked = self.unpack(particles);
        Tensor::cat(unpacked.values, 1)
    }

    /// One unconstrained particle (`dim` values) from `constrained_dim` constrained values given
    /// block by block, in layout order, each row-major. Values outside a block's support are an
    /// error naming the block and the element; a simplex must sum to 1 and a correlation
    /// Cholesky factor's rows must have unit norm within [`CONSTRAINT_TOLERANCE`], as in Stan.
    pub fn unconstrain(&self, constrained: &[f64]) -> Result<Vec<f64>, ModelError> {
        let expected = self.constrained_dim();
        if constrained.len() != expected {
            return Err(ModelError::DimensionMismatch { expected, got: constrained.len() });
        }
        let mut out = Vec::with_capacity(self.dim);
        let mut start = 0;
        for block in &self.blocks {
            let values = &constrained[start..start + block.size()];
            start += block.size();
            out.extend(block.constraint.inverse_block(values, &block.shape, &block.name)?);
        }
        Ok(out)
    }
}

/// Constrained block values for all particles (particle axis first) and the log-Jacobian.
pub struct Unpacked<'a> {
    layout: &'a ParamLayout,
    values: Vec<Tensor<2>>,
    /// The blocks' log-Jacobian terms, `[n, k]` each, unsummed.
    log_jacobian: Vec<Tensor<2>>,
    particles: usize,
    device: burn::tensor::Device,
    dtype: burn::tensor::DType,
}

impl Unpacked<'_> {
    /// The summed log-Jacobian `[n]`, to be added to the log-joint.
    pub fn log_jacobian(&self) -> Tensor<1> {
        let n = self.particles;
        match self.log_jacobian.len() {
            0 => Tensor::zeros([n], (&self.device, self.dtype)),
            _ => Tensor::cat(self.log_jacobian.clone(), 1).sum_dim(1).reshape([n]),
        }
    }

    /// The log-Jacobian's terms, `[n, k]` each, whose row sums add up to [`Unpacked::log_jacobian`]
    /// (a density adds them to its own terms before one sum).
    pub fn log_jacobian_columns(&self) -> &[Tensor<2>] {
        &self.log_jacobian
    }

    /// Block `name`'s constrained values flattened row-major: `[n, size]`.
    pub fn flat(&self, name: &str) -> Result<Tensor<2>, ModelError> {
        let i = self.index(name)?;
        Ok(self.values[i].clone())
    }

    /// One element of block `name`, `[n, 1]`, at Stan's 1-based `index` (`beta[2]` is
    /// `element("beta", &[2])`, `L[2,1]` is `element("L", &[2, 1])`).
    ///
    /// # Errors
    /// [`ModelError::UnknownBlock`], or [`ModelError::InvalidBlock`] for an index of the wrong
    /// rank or outside `1..=len` on an axis.
    pub fn element(&self, name: &str, index: &[usize]) -> Result<Tensor<2>, ModelError> {
        let i = self.index(name)?;
        let shape = &self.layout.blocks[i].shape;
        let bad = |reason: String| ModelError::InvalidBlock { name: name.to_string(), reason };
        if index.len() != shape.len() {
            return Err(bad(format!(
                "block has shape {shape:?}: an element takes {} indices, got {index:?}",
                shape.len()
            )));
        }
        let mut flat = 0;
        for (axis, (&at, &len)) in index.iter().zip(shape).enumerate() {
            if at < 1 || at > len {
                return Err(bad(format!(
                    "index {at} on axis {} is outside 1..={len} (Stan's 1-based indices)",
                    axis + 1
                )));
            }
            flat = flat * len + (at - 1);
        }
        Ok(self.values[i].clone().narrow(1, flat, 1))
    }

    /// Block `name` with its shape: `[n, shape...]`, `D = 1 + shape.len()`.
    pub fn get<const D: usize>(&self, name: &str) -> Result<Tensor<D>, ModelError> {
        let i = self.index(name)?;
        let block = &self.layout.blocks[i];
        if D != 1 + block.shape.len() {
            return Err(ModelError::InvalidBlock {
                name: name.to_string(),
                reason: format!("block has shape {:?}: ask for rank {}, not {D}", block.shape, 1 + block.shape.len()),
            });
        }
        let n = self.values[i].dims()[0];
        let mut dims = [0usize; D];
        dims[0] = n;
        dims[1..].copy_from_slice(&block.shape);
        Ok(self.values[i].clone().reshape(dims))
    }

    fn index(&self, name: &str) -> Result<usize, ModelError> {
        self.layout.blocks.iter().position(|b| b.name == name).ok_or_else(|| ModelError::UnknownBlock(name.to_string()))
    }
}
