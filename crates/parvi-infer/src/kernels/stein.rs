//! The Stein operator on radial kernels, in batched tensor form.
//!
//! Conventions: `x` `[n, d]` are source points with scores `s` `[n, d]`; `y` `[m, d]` are
//! target points; kernel matrices are indexed `[source j, target i]`, so `eval.k[j, i] =
//! k(x_j, y_i)`. For a radial kernel `k = f(r^2)`, `grad_{x_j} k(x_j, y_i) = 2 f' (x_j - y_i)`.

use burn::tensor::Tensor;
use parvi_model::tensor_ops::{
    diagonal_column, median_on_host, pairwise_sq_dists, self_sq_dists, sq_dists_from_products,
};

use crate::InferError;
use crate::core::shard::{ParticleShard, not_shardable};
use crate::kernels::pairs::{
    DENSE_MAX_POINTS, HOST_DIRECTION_MAX_POINTS, PairTiles, pair_median_sq, rbf_direction_small, rbf_shard_rows,
    shard_rows_on_host, svgd_direction_tiled,
};
use crate::kernels::{Kernel, RadialEval, linear_direction, linear_stein_kernel};

/// The (weighted) Stein variational direction at the targets `y`:
///
/// `phi(y_i) = sum_j w_j [k(x_j, y_i) s_j + grad_{x_j} k(x_j, y_i)]`
///
/// With `weights = None` the weights are `1/n` (SVGD). Cost: two `[m, n] x [n, d]` products.
pub fn stein_direction(
    eval: &RadialEval,
    x: Tensor<2>,
    score: Tensor<2>,
    y: Tensor<2>,
    weights: Option<Tensor<1>>,
) -> Tensor<2> {
    let n = x.dims()[0];
    let (k, dk) = match weights {
        Some(w) => {
            let w = w.reshape([n, 1]);
            (eval.k.clone() * w.clone(), eval.dk.clone() * w)
        }
        None => (eval.k.clone().div_scalar(n as f64), eval.dk.clone().div_scalar(n as f64)),
    };
    let drift = k.transpose().matmul(score); // [m, d]
    let repulsion = repulsion_from(dk, x, y);
    drift + repulsion
}

/// `sum_j grad_{x_j} k(x_j, y_i) = 2 (sum_j f'_ji x_j - y_i sum_j f'_ji)`, `[m, d]`, from the
/// (already weighted) `f'` matrix `[n, m]`.
pub fn repulsion_from(dk: Tensor<2>, x: Tensor<2>, y: Tensor<2>) -> Tensor<2> {
    let col = dk.clone().sum_dim(0).transpose(); // [m, 1]
    (dk.transpose().matmul(x) - y * col).mul_scalar(2.0)
}

/// The Stein kernel matrix `k_p(x_i, x_j)` `[n, n]` of a radial kernel (Liu, Lee & Jordan 2016):
///
/// `k_p = s_i . s_j k + s_i . grad_{x_j} k + s_j . grad_{x_i} k + tr(grad_{x_i} grad_{x_j} k)`
///
/// which for `k = f(r^2)` is `s_i.s_j f + 2 f' (s_i - s_j).(x_j - x_i) - 4 f'' r^2 - 2 d f'`.
/// `eval` must be of the pairs of `x` with itself and carry `d2k`.
pub fn stein_kernel_matrix(eval: &RadialEval, sq: &Tensor<2>, x: Tensor<2>, score: Tensor<2>) -> Tensor<2> {
    let d = x.dims()[1] as f64;
    let d2k = eval.d2k.clone().expect("stein_kernel_matrix needs the second derivative");
    let ss = score.clone().matmul(score.clone().transpose());
    // a[i, j] = s_i . x_j
    let a = score.clone().matmul(x.clone().transpose());
    let diag = (score * x).sum_dim(1); // [n, 1]: s_i . x_i
    // (s_i - s_j).(x_j - x_i) = a_ij - diag_i - diag_j + a_ji
    let cross = a.clone() + a.transpose() - diag.clone() - diag.transpose();
    ss * eval.k.clone() + (cross * eval.dk.clone()).mul_scalar(2.0)
        - (d2k * sq.clone()).mul_scalar(4.0)
        - eval.dk.clone().mul_scalar(2.0 * d)
}

/// The Stein kernel matrix of `x` with itself under `kernel` (with its linear features' part
/// when it has them, [`linear_stein_kernel`]).
pub fn stein_kernel(kernel: &dyn Kernel, x: Tensor<2>, score: Tensor<2>) -> Tensor<2> {
    let sq = pairwise_sq_dists(x.clone(), x.clone());
    let eval = kernel.eval(&sq, true);
    let radial = stein_kernel_matrix(&eval, &sq, x.clone(), score.clone());
    if kernel.linear_features() { radial + linear_stein_kernel(x, score) } else { radial }
}

/// The SVGD direction of particles `x` with scores `s` under `kernel`.
///
/// Above [`DENSE_MAX_POINTS`] particles it is computed in tiles ([`svgd_direction_tiled`]:
/// no `n x n` matrix, memory `O(n d)`) for every kernel that can be evaluated in blocks
/// ([`Kernel::resolved`]: the RBF and the IMQ); below, and for other kernels, from the whole
/// matrix ([`svgd_direction_dense`]), which for a small set on a CPU under the RBF is one host
/// pass (`pairs::rbf_direction_small`: the same mathematics without two dozen tensor
/// operations' fixed costs).
pub fn svgd_direction(kernel: &dyn Kernel, x: Tensor<2>, s: Tensor<2>) -> Tensor<2> {
    let n = x.dims()[0];
    if n <= HOST_DIRECTION_MAX_POINTS
        && let Some(phi) = rbf_direction_small(kernel, &x, &s)
    {
        return phi;
    }
    if n > DENSE_MAX_POINTS
        && let Some(phi) = svgd_direction_tiled(kernel, x.clone(), s.clone(), &PairTiles::for_device(n, &x.device()))
    {
        return phi;
    }
    svgd_direction_dense(kernel, x, s)
}

/// The rows `rows` of [`svgd_direction`]: `phi(x_i)` for `i` in `rows` from all `n` particles
/// `x` and their scores `s`, with the kernel's data-dependent parameters (the median bandwidth)
/// fixed from the whole set ([`Kernel::resolved`]: the value the whole direction uses), so the
/// row blocks of any split make up the whole direction. `None` when `kernel` cannot be
/// evaluated in blocks.
///
/// Up to [`DENSE_MAX_POINTS`] particles the whole `n x n` distance matrix gives both the median
/// and this block, and the RBF takes the dense direction's one-product form; above,
/// the median comes from [`pair_median_sq`] and memory is one `[n, rows]` block.
pub fn svgd_direction_rows(
    kernel: &dyn Kernel,
    x: Tensor<2>,
    s: Tensor<2>,
    rows: std::ops::Range<usize>,
) -> Option<Tensor<2>> {
    let n = x.dims()[0];
    let y = x.clone().slice([rows.clone()]);
    let (kernel, sq) = if n <= DENSE_MAX_POINTS {
        let all = self_sq_dists(x.clone());
        let kernel = kernel.resolved(n, &mut || median_on_host(&all).unwrap_or(0.0))?;
        (kernel, all.slice([0..n, rows]))
    } else {
        let kernel = kernel.resolved(n, &mut || pair_median_sq(&x))?;
        (kernel, pairwise_sq_dists(x.clone(), y.clone()))
    };
    Some(direction_at(kernel.as_ref(), &sq, x, s, y))
}

/// The rows of [`svgd_direction`] at this rank's particles (`shard.rows()`, scores `s_rows`
/// `[rows, d]`) in a run that shares the particles: `(1/n) sum_j [k(x_j, x_i) s_j +
/// grad_{x_j} k(x_j, x_i)]` for `i` in the rows, `[rows, d]` (Liu & Wang 2016, eq. 8, split by
/// `i`). The rank computes its `[rows, n]` block of squared distances (the median bandwidth,
/// fixed from the whole set by [`Kernel::resolved`], from the gathered blocks up to
/// [`DENSE_MAX_POINTS`] particles, from [`pair_median_sq`] above; where the particles are at
/// most [`DENSE_MAX_POINTS`] with at least `K n` coordinates, `K` ranks, every rank forms all
/// `n x n` distances from the Gram matrix split by coordinates instead, reading a third of the
/// block's memory at two ranks), and the sources' part is all-gathered: for the RBF (`f' = c f`) each rank's `s_j + 2c x_j`, so the drift and the
/// repulsion share one `[rows, n] x [n, d]` product and no rank forms an `[n, d]` sum; for
/// other kernels the scores. Cost `O(rows n d)` a rank; `Ok(None)` when `kernel` cannot be
/// evaluated in blocks.
pub fn svgd_direction_at_shard(
    kernel: &dyn Kernel,
    x: Tensor<2>,
    s_rows: Tensor<2>,
    shard: &ParticleShard<'_>,
) -> Result<Option<Tensor<2>>, InferError> {
    let [n, dim] = x.dims();
    let targets = x.clone().slice([shard.rows()]);
    if n <= DENSE_MAX_POINTS && n * shard.ranks() <= dim {
        // Many coordinates: every rank gets all `n x n` distances from its coordinates' Gram.
        let all = coordinate_split_sq_dists(x.clone(), shard)?;
        let Some(kernel) = kernel.resolved(n, &mut || median_on_host(&all).unwrap_or(0.0)) else { return Ok(None) };
        let sq = all.slice([shard.rows(), 0..n]); // [rows, n]: targets i, sources j
        return Ok(Some(shard_direction(kernel.as_ref(), sq, x, targets, s_rows, shard)?));
    }
    let sq = shard_sq_dists(targets.clone(), x.clone(), shard)?; // [rows, n]: targets i, sources j
    let mut failed = None;
    let resolved = if n <= DENSE_MAX_POINTS {
        // Every rank asks for the median (or not) alike, so all join the gather or none does.
        kernel.resolved(n, &mut || {
            shard.median_sq(&sq).unwrap_or_else(|e| {
                failed = Some(e);
                f32::NAN
            })
        })
    } else {
        kernel.resolved(n, &mut || pair_median_sq(&x))
    };
    if let Some(e) = failed {
        return Err(e);
    }
    let Some(kernel) = resolved else { return Ok(None) };
    Ok(Some(shard_direction(kernel.as_ref(), sq, x, targets, s_rows, shard)?))
}

/// The direction's rows at this rank's particles `targets` from their squared distances `sq`
/// `[rows, n]` to all particles `x`, with `kernel`'s bandwidth fixed ([`svgd_direction_at_shard`]).
fn shard_direction(
    kernel: &dyn Kernel,
    sq: Tensor<2>,
    x: Tensor<2>,
    targets: Tensor<2>,
    s_rows: Tensor<2>,
    shard: &ParticleShard<'_>,
) -> Result<Tensor<2>, InferError> {
    let n = x.dims()[0];
    if let Some(rate) = kernel.host_rate().filter(|_| !kernel.linear_features())
        && shard_rows_on_host(&targets, &s_rows)
    {
        return rbf_shard_rows(rate, &sq, targets, s_rows, shard);
    }
    let proportional = if kernel.linear_features() { None } else { kernel.eval_proportional(&sq) };
    let phi = match proportional {
        Some((k, c)) => {
            // k[i, j] = k(x_j, x_i) (radial); phi_i = (1/n) [sum_j k_ij (s_j + 2c x_j) - 2c x_i sum_j k_ij].
            let two_c = c.mul_scalar(2.0); // [1, 1]
            let sources = shard.gather_rows(s_rows + targets.clone() * two_c.clone())?;
            let rowsum = k.clone().sum_dim(1); // [rows, 1]
            k.div_scalar(n as f64).matmul(sources) - targets * (rowsum * two_c.div_scalar(n as f64))
        }
        None => {
            let s = shard.gather_rows(s_rows)?;
            direction_at(kernel, &sq.transpose(), x, s, targets)
        }
    };
    Ok(phi)
}

/// All `n x n` squared distances of the particles `x` `[n, d]`, on every rank, with the Gram
/// matrix `x x^T` split by coordinates: each rank multiplies its columns `[n, d/K] x [d/K, n]`
/// (reading `n d / K` floats, where the particles' block `[rows, d] x [d, n]` reads `(1 + 1/K)
/// n d`), and the ranks' parts are summed in rank order ([`ParticleShard::sum_in_rank_order`],
/// `K n^2` floats gathered: the split pays where `K n` is at most `d`). The norms are the sum's
/// diagonal, so no collective besides the one gather, and the median bandwidth comes from the
/// whole matrix, as in one process.
fn coordinate_split_sq_dists(x: Tensor<2>, shard: &ParticleShard<'_>) -> Result<Tensor<2>, InferError> {
    let [n, dim] = x.dims();
    // At least one column a rank: the caller splits only where `K n <= d`.
    let own = x.slice([0..n, shard.coordinates(dim)]);
    let gram = shard.sum_in_rank_order(own.clone().matmul(own.transpose()))?;
    let norms = diagonal_column(gram.clone()); // [n, 1]
    Ok(sq_dists_from_products(gram, norms.clone(), norms.transpose()))
}

/// The squared distances `[rows, n]` of this rank's particles `targets` to all `x`, with no
/// pass over `[n, d]`: the products `x_i . x_j` of the block hold this rank's squared norms on
/// their diagonal, and the ranks' norms are all-gathered (`n` floats) instead of every rank
/// squaring all `n d` coordinates (`pairwise_sq_dists`'s two passes, a tenth of the step).
fn shard_sq_dists(targets: Tensor<2>, x: Tensor<2>, shard: &ParticleShard<'_>) -> Result<Tensor<2>, InferError> {
    let rows = shard.rows();
    let xy = targets.matmul(x.transpose()); // [rows, n]
    let own = diagonal_column(xy.clone().slice([0..rows.len(), rows])); // [rows, 1]: |x_i|^2
    let all = shard.gather_rows(own.clone())?.transpose(); // [1, n]
    Ok(sq_dists_from_products(xy, own, all))
}

/// [`svgd_direction_at_shard`] for a sharded step of `method`, or the error naming the method
/// when its kernel cannot be evaluated in blocks.
pub fn svgd_shard_of(
    method: &str,
    kernel: &dyn Kernel,
    x: Tensor<2>,
    s_rows: Tensor<2>,
    shard: &ParticleShard<'_>,
) -> Result<Tensor<2>, InferError> {
    svgd_direction_at_shard(kernel, x, s_rows, shard)?.ok_or_else(|| rows_refused(method, kernel))
}

/// `Ok` when `kernel` can be evaluated in row blocks ([`svgd_direction_rows`]); else the error
/// naming `method`.
pub fn require_row_blocks(method: &str, kernel: &dyn Kernel) -> Result<(), InferError> {
    kernel.resolved(2, &mut || 1.0).map(|_| ()).ok_or_else(|| rows_refused(method, kernel))
}

fn rows_refused(method: &str, kernel: &dyn Kernel) -> InferError {
    not_shardable(method, &format!("its kernel {} cannot be evaluated in row blocks", kernel.describe()))
}

/// The SVGD direction from the whole `n x n` kernel matrix ([`direction_at`] every particle).
pub fn svgd_direction_dense(kernel: &dyn Kernel, x: Tensor<2>, s: Tensor<2>) -> Tensor<2> {
    let sq = self_sq_dists(x.clone());
    direction_at(kernel, &sq, x.clone(), s, x)
}

/// The SVGD direction at the targets `y` from the squared distances `sq` `[n, m]` of all `n`
/// particles `x` (scores `s`) to them. For a kernel with `f' = c f` (the RBF) the drift and the
/// repulsion share one product: `phi = (1/n) [K^T (S + 2c X) - 2c Y colsum(K)]`, one
/// `[m, n] x [n, d]` product instead of two, with `1/n` folded into the small `K`; other
/// kernels take the general [`stein_direction`]. A kernel with linear features adds their part
/// ([`linear_direction`]).
fn direction_at(kernel: &dyn Kernel, sq: &Tensor<2>, x: Tensor<2>, s: Tensor<2>, y: Tensor<2>) -> Tensor<2> {
    let n = x.dims()[0] as f64;
    let phi = match kernel.eval_proportional(sq) {
        Some((k, c)) => {
            let two_c = c.mul_scalar(2.0); // [1, 1]
            let colsum = k.clone().sum_dim(0).transpose(); // [m, 1]
            k.transpose().div_scalar(n).matmul(s.clone() + x.clone() * two_c.clone())
                - y.clone() * (colsum * two_c.div_scalar(n))
        }
        None => stein_direction(&kernel.eval(sq, false), x.clone(), s.clone(), y.clone(), None),
    };
    if kernel.linear_features() { phi + linear_direction(x, s, y, None) } else { phi }
}
