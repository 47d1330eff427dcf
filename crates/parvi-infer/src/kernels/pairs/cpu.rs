//! SVGD's RBF direction in tiles on the host, for a CPU backend: the tiles' distances, their
//! `exp` and their products with the right-hand matrix in native loops over cache-sized tiles,
//! with no tensor operation (and no allocation) per tile.
//!
//! On flex a tile built from tensor operations pays a scalar libm `exp` per entry (about 2.7 ns,
//! most of a 2-D tile's cost) and a pass over memory per operation. Here, in few dimensions
//! ([`FUSED_MAX_DIM`]), one row of a tile at a time is formed from coordinate differences,
//! exponentiated by the vectorised polynomial `exp` ([`parvi_model::fastmath`]) and multiplied
//! into both blocks' sums while it is in the first-level cache, in loops the compiler vectorises
//! (AVX2 and FMA where the CPU has them, chosen at run time). In many dimensions the distances
//! and the products are `gemm` products on the tile, with the vectorised `exp` between them.
//!
//! The mathematics is the tensor path's ([`super::svgd_direction_tiled`]): with `c = f'/f` the
//! RBF's rate, `phi = (1/n) [K (S + 2c X) - 2c X * rowsum(K)]` (Liu & Wang 2016, eq. 8), over
//! the tiles `I <= J` of the symmetric kernel matrix, points centred on their mean.

use burn::tensor::{DType, Tensor, TensorData};
use parvi_model::fastmath::{Simd, Vectorised, exp_f32_flushed, exp_f32_fma_flushed, exp_scaled_flushed_in_place};
use parvi_model::strided_gemm::{Operand, gemm, gemm_new};
use parvi_model::tensor_ops::{median_by_selection, to_vec_f32};

use super::{
    MEDIAN_SAMPLE_SEED, PairTiles, SplitMix, map_indexed, median_is_exact, median_of_tiles, median_sample_pairs,
    share_tiles, workers,
};
use crate::InferError;
use crate::core::shard::ParticleShard;
use crate::kernels::Kernel;

/// Up to this many dimensions a tile's squared distances are formed from coordinate
/// differences in the same pass as its `exp` and products; above, by one `gemm` product per tile
/// (`d` multiply-adds per pair either way, but `gemm` blocks them for the cache).
pub const FUSED_MAX_DIM: usize = 16;

pub(super) use parvi_model::tensor_ops::is_cpu;

/// The point set on the host, centred on its mean (distances do not change; sums of products
/// lose less to cancellation): rows `[n, dim]`, columns `[dim, n]` (few dimensions) and the
/// squared norms.
struct HostSet {
    n: usize,
    dim: usize,
    rows: Vec<f32>,
    cols: Vec<f32>,
    norms: Vec<f32>,
}

impl HostSet {
    fn new(x: &[f32], n: usize, dim: usize) -> Self {
        // Any centre keeps the distances; one near the mean keeps the norms small. An `f32` sum
        // (vectorised over the coordinates) is near enough.
        let mut mean = vec![0.0f32; dim];
        for row in x.chunks_exact(dim) {
            mean.iter_mut().zip(row).for_each(|(m, &v)| *m += v);
        }
        mean.iter_mut().for_each(|m| *m /= n as f32);
        // Loops over preallocated buffers: a `flat_map` collect cannot size its buffer and was
        // most of a 20-particle direction's time.
        let mut rows = x.to_vec();
        for row in rows.chunks_exact_mut(dim) {
            row.iter_mut().zip(&mean).for_each(|(v, m)| *v -= m);
        }
        let norms = rows.chunks_exact(dim).map(|r| r.iter().map(|v| v * v).sum()).collect();
        let cols = if dim <= FUSED_MAX_DIM { transpose(&rows, n, dim) } else { Vec::new() };
        Self { n, dim, rows, cols, norms }
    }

    /// The squared distances of blocks `a` and `b` `[la, lb]`, row-major, clamped at 0.
    fn distances(&self, (sa, la): (usize, usize), (sb, lb): (usize, usize)) -> Vec<f32> {
        let (n, dim) = (self.n, self.dim);
        if dim <= FUSED_MAX_DIM {
            let mut out = vec![0.0f32; la * lb];
            for (i, row) in out.chunks_exact_mut(lb).enumerate() {
                for k in 0..dim {
                    let xi = self.cols[k * n + sa + i];
                    for (v, &xj) in row.iter_mut().zip(&self.cols[k * n + sb..][..lb]) {
                        let t = xi - xj;
                        *v += t * t;
                    }
                }
            }
            return out;
        }
        // |a|^2 + |b|^2 - 2 a.b: one product, then the norms added and clamped in one pass.
        let mut out = vec![0.0f32; la * lb];
        let lhs = Operand { values: &self.rows, start: sa * dim, row_stride: dim, col_stride: 1 };
        let rhs = Operand { values: &self.rows, start: sb * dim, row_stride: 1, col_stride: dim };
        gemm(la, dim, lb, lhs, rhs, -2.0, &mut out, (0, lb, 1), false);
        for (row, &na) in out.chunks_exact_mut(lb).zip(&self.norms[sa..sa + la]) {
            row.iter_mut().zip(&self.norms[sb..sb + lb]).for_each(|(v, &nb)| *v = (*v + na + nb).max(0.0));
        }
        out
    }

    /// The squared distance of points `a` and `b`.
    fn distance(&self, a: usize, b: usize) -> f32 {
        let (ra, rb) = (&self.rows[a * self.dim..][..self.dim], &self.rows[b * self.dim..][..self.dim]);
        ra.iter().zip(rb).map(|(u, v)| (u - v) * (u - v)).sum()
    }
}

/// `[rows, cols]` row-major to `[cols, rows]` row-major.
fn transpose(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; values.len()];
    for (i, row) in values.chunks_exact(cols).enumerate() {
        for (k, &v) in row.iter().enumerate() {
            out[k * rows + i] = v;
        }
    }
    out
}

/// Up to this many points [`rbf_direction_small`] takes a small set's direction on the host.
/// At 20 points and 753 dimensions (the Boston BNN) it took 55 us against 68 for the dense
/// tensor path's two dozen flex operations on a loaded machine (docs/benchmarks.md): the two
/// `n x n x d` products, the same in both, are most of either, and what the host pass saves is
/// the operations' fixed costs, which count while the set is small; above, the products are
/// the cost and stay with the backend.
pub(crate) const HOST_DIRECTION_MAX_POINTS: usize = 64;

/// SVGD's whole direction of a small set under an RBF-type kernel with a host rate
/// ([`Kernel::host_rate`] once resolved) on a CPU device, in one host pass: the points centred
/// on their mean, the Gram matrix by one `gemm`, the squared distances (symmetric by
/// construction, the diagonal exactly 0), their median for the bandwidth, the kernel, and
/// `phi = (1/n) [K (S + 2c X) - 2c X * rowsum(K)]` by one more `gemm` (the dense tensor path's
/// mathematics). The radial part only: `None` for a kernel with linear features, another
/// kernel, another device, or tensors that carry an autodiff graph.
pub(crate) fn rbf_direction_small(kernel: &dyn Kernel, x: &Tensor<2>, s: &Tensor<2>) -> Option<Tensor<2>> {
    let device = x.device();
    let [n, dim] = x.dims();
    if n == 0 || !is_cpu(&device) || x.is_tracked() || s.is_tracked() || kernel.linear_features() {
        return None;
    }
    // A probe with any median: whether the resolved kernel has a rate on the host.
    kernel.resolved(n, &mut || 1.0)?.host_rate()?;
    // The values read in place (one copy each from the device, none more): the centred points
    // and `S + 2c X` are written from them.
    let (x_data, s_data) = (x.to_data(), s.to_data());
    let (Ok(xv), Ok(sv)) = (x_data.as_slice::<f32>(), s_data.as_slice::<f32>()) else {
        return None;
    };
    let phi = Simd::detect().vectorise(SmallDirection { kernel, xv, sv, n, dim })?;
    Some(Tensor::from_data(TensorData::new(phi, [n, dim]), &device))
}

/// [`rbf_direction_small`]'s host passes, compiled for the CPU's vector width (its `exp` the
/// polynomial one, within 2 ulp, so that the kernel's row vectorises too).
struct SmallDirection<'a> {
    kernel: &'a dyn Kernel,
    xv: &'a [f32],
    sv: &'a [f32],
    n: usize,
    dim: usize,
}

impl Vectorised for SmallDirection<'_> {
    type Output = Option<Vec<f32>>;
    #[inline(always)]
    fn run(self) -> Self::Output {
        let Self { kernel, xv, sv, n, dim } = self;
        let mut mean = vec![0.0f32; dim];
        for row in xv.chunks_exact(dim) {
            mean.iter_mut().zip(row).for_each(|(m, &v)| *m += v);
        }
        mean.iter_mut().for_each(|m| *m /= n as f32);
        let mut rows = Vec::with_capacity(n * dim);
        for row in xv.chunks_exact(dim) {
            rows.extend(row.iter().zip(&mean).map(|(v, m)| v - m));
        }
        // The distances summed directly, a pair at a time: at most 64 points make at most
        // 2,016 pairs, where a Gram matrix by `gemm` packs both operands for a product this
        // small (measured 17-24 us for 20 x 753, the sums 3-5 us) and loses digits to the
        // cancellation in `|x_i|^2 + |x_j|^2 - 2 x_i . x_j`.
        let mut sq = vec![0.0f32; n * n];
        for i in 0..n {
            for j in i + 1..n {
                let d = squared_distance(&rows[i * dim..][..dim], &rows[j * dim..][..dim]);
                sq[i * n + j] = d;
                sq[j * n + i] = d;
            }
        }
        let med = median_by_selection(&mut sq.clone()).unwrap_or(0.0);
        let rate = kernel.resolved(n, &mut || med)?.host_rate()? as f32;
        // K in place of the distances, and its row sums (= column sums: K is symmetric).
        let rowsum = kernel_rows_in_place(&mut sq, n, rate);
        let two_rate = 2.0 * rate;
        let right: Vec<f32> = sv.iter().zip(&rows).map(|(&g, &v)| g + two_rate * v).collect();
        let inv_n = 1.0 / n as f32;
        let mut phi = vec![0.0f32; n * dim];
        let k = Operand { values: &sq, start: 0, row_stride: n, col_stride: 1 };
        let rhs = Operand { values: &right, start: 0, row_stride: dim, col_stride: 1 };
        gemm(n, n, dim, k, rhs, inv_n, &mut phi, (0, dim, 1), false);
        subtract_repulsion(&mut phi, &rows, &rowsum, two_rate, inv_n, dim);
        Some(phi)
    }
}

/// Whether [`rbf_shard_rows`] applies to these tensors: a CPU device, `f32` values, no autodiff
/// graph.
pub(crate) fn shard_rows_on_host(targets: &Tensor<2>, s_rows: &Tensor<2>) -> bool {
    is_cpu(&targets.device())
        && [targets, s_rows].iter().all(|t| t.dtype() == DType::F32 && !t.is_tracked() && t.dims()[0] > 0)
}

/// A particle-sharded rank's rows of SVGD's RBF direction on the host
/// ([`shard_rows_on_host`]): `phi_i = (1/n) [sum_j k_ij (s_j + 2c x_j) - 2c x_i sum_j k_ij]`
/// for this rank's particles `targets` `[rows, d]` with scores `s_rows`, from their squared
/// distances `sq` `[rows, n]` to all particles and the kernel's rate `c` (`rate`, the bandwidth
/// fixed). The rank writes its sources `s_i + 2c x_i` in one pass, gathers all `n`
/// ([`ParticleShard::gather_host_rows`]), and forms its rows by one `gemm` into fresh memory and
/// one pass for the repulsion's last term, where the tensor form's four `[rows, d]` operations
/// each allocate an output (flex's product zeroes its output and copies it once more to align
/// it); on the protein BNN's `d = 42,403` those four took 13-16 ms of a rank's 60.
pub(crate) fn rbf_shard_rows(
    rate: f64,
    sq: &Tensor<2>,
    targets: Tensor<2>,
    s_rows: Tensor<2>,
    shard: &ParticleShard<'_>,
) -> Result<Tensor<2>, InferError> {
    let device = targets.device();
    let ([rows, n], dim) = (sq.dims(), targets.dims()[1]);
    // The scores' own buffer (no copy where nothing else holds it); the targets, a slice of
    // the shared positions, are copied once.
    let (t_data, s_data) = (targets.into_data(), s_rows.into_data());
    let not_f32 = |e| InferError::setting("distributed", format!("the direction's rows are not f32 values: {e:?}"));
    let (t, s) = (t_data.as_slice::<f32>().map_err(not_f32)?, s_data.as_slice::<f32>().map_err(not_f32)?);
    let two_rate = 2.0 * rate as f32;
    let simd = Simd::detect();
    let sources = shard.gather_host_rows(simd.vectorise(ShardSources { t, s, two_rate }), dim)?;
    let mut k = to_vec_f32(sq);
    let rowsum = kernel_rows_in_place(&mut k, n, rate as f32);
    let inv_n = 1.0 / n as f32;
    let lhs = Operand { values: &k, start: 0, row_stride: n, col_stride: 1 };
    let rhs = Operand { values: &sources, start: 0, row_stride: dim, col_stride: 1 };
    let mut phi = gemm_new(rows, n, dim, lhs, rhs, inv_n);
    simd.vectorise(Repulsion { phi: &mut phi, x: t, rowsum: &rowsum, two_rate, inv_n, dim });
    Ok(Tensor::from_data(TensorData::new(phi, [rows, dim]), &device))
}

/// The sources `s_i + 2c x_i` of a rank's particles, as wide as the CPU allows.
struct ShardSources<'a> {
    t: &'a [f32],
    s: &'a [f32],
    two_rate: f32,
}

impl Vectorised for ShardSources<'_> {
    type Output = Vec<f32>;
    #[inline(always)]
    fn run(self) -> Self::Output {
        let Self { t, s, two_rate } = self;
        s.iter().zip(t).map(|(&g, &v)| g + two_rate * v).collect()
    }
}

/// [`subtract_repulsion`] as wide as the CPU allows.
struct Repulsion<'a> {
    phi: &'a mut [f32],
    x: &'a [f32],
    rowsum: &'a [f32],
    two_rate: f32,
    inv_n: f32,
    dim: usize,
}

impl Vectorised for Repulsion<'_> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        let Self { phi, x, rowsum, two_rate, inv_n, dim } = self;
        subtract_repulsion(phi, x, rowsum, two_rate, inv_n, dim);
    }
}

/// The RBF kernel `exp(c r^2)` (the flushed polynomial) in place of the squared distances `sq`
/// `[rows, n]`, and each row's sum.
#[inline(always)]
fn kernel_rows_in_place(sq: &mut [f32], n: usize, rate: f32) -> Vec<f32> {
    sq.chunks_exact_mut(n)
        .map(|row| {
            row.iter_mut().for_each(|v| *v = exp_f32_flushed(*v * rate));
            row.iter().sum()
        })
        .collect()
}

/// The repulsion's last term in place, a row at a time: `phi_i -= (2c / n) x_i sum_j k_ij`.
#[inline(always)]
fn subtract_repulsion(phi: &mut [f32], x: &[f32], rowsum: &[f32], two_rate: f32, inv_n: f32, dim: usize) {
    for ((p, xr), &total) in phi.chunks_exact_mut(dim).zip(x.chunks_exact(dim)).zip(rowsum) {
        let spread = total * two_rate * inv_n;
        p.iter_mut().zip(xr).for_each(|(p, &v)| *p -= v * spread);
    }
}

/// `|a - b|^2` with sixteen partial sums (one 16-lane register, or two of 8), so that the loop
/// vectorises: a single running sum is a chain of additions the compiler may not reorder.
#[inline(always)]
fn squared_distance(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let (a16, b16) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail: f32 = a16.remainder().iter().zip(b16.remainder()).map(|(x, y)| (x - y) * (x - y)).sum();
    for (x, y) in a16.zip(b16) {
        acc.iter_mut().zip(x.iter().zip(y)).for_each(|(s, (xv, yv))| *s += (xv - yv) * (xv - yv));
    }
    acc.iter().sum::<f32>() + tail
}

/// SVGD's direction under an RBF-type kernel (`f' = c f`, [`Kernel::eval_proportional`]) on the
/// host, in the tiles `tiles`; the radial part only (the caller adds linear features). `None`
/// where this path does not apply: not a CPU device, a kernel without a constant rate, or
/// tensors that carry an autodiff graph (a learnable bandwidth), which must stay tensors.
pub(super) fn rbf_direction(kernel: &dyn Kernel, x: &Tensor<2>, s: &Tensor<2>, tiles: &PairTiles) -> Option<Tensor<2>> {
    rbf_direction_with(kernel, x, s, tiles, Simd::detect())
}

/// [`rbf_direction`] with the fused tiles compiled for `simd` (which the CPU must have).
fn rbf_direction_with(
    kernel: &dyn Kernel,
    x: &Tensor<2>,
    s: &Tensor<2>,
    tiles: &PairTiles,
    simd: Simd,
) -> Option<Tensor<2>> {
    let device = x.device();
    if !is_cpu(&device) || x.is_tracked() || s.is_tracked() {
        return None;
    }
    let zero = Tensor::<2>::zeros([1, 1], &device);
    if kernel.eval_proportional(&zero).is_none_or(|(_, rate)| rate.is_tracked()) {
        return None;
    }
    let [n, dim] = x.dims();
    let set = HostSet::new(&to_vec_f32(x), n, dim);
    let upper = tiles.upper();
    let workers = workers(&device, upper.len());
    let fused = dim <= FUSED_MAX_DIM;
    // Where the median is exact the distance tiles are formed for it; in many dimensions they
    // are kept for the kernel (a product each), in few they are cheaper to form again.
    let mut kept: Option<Vec<Vec<f32>>> = None;
    let mut median = || {
        if median_is_exact(n, dim) {
            let d = map_indexed(upper.len(), workers, |t| {
                let (a, b) = upper[t];
                set.distances(tiles.range(a), tiles.range(b))
            });
            let m = median_of_tiles(tiles, &upper, workers, |t| d[t].clone());
            if !fused {
                kept = Some(d);
            }
            m
        } else {
            sampled_median(&set, median_sample_pairs(dim), MEDIAN_SAMPLE_SEED)
        }
    };
    let kernel = kernel.resolved(n, &mut median)?;
    let (_, rate) = kernel.eval_proportional(&zero)?;
    let rate = rate.into_scalar::<f32>();
    let scores = to_vec_f32(s);
    let w = dim + 1;
    let two_rate = 2.0 * rate;
    // The right-hand matrix [S + 2c X, 1]: one product gives K (S + 2c X) and K's row sums.
    let mut right = vec![1.0f32; n * w]; // [n, w]
    for ((rr, sr), xr) in right.chunks_exact_mut(w).zip(scores.chunks_exact(dim)).zip(set.rows.chunks_exact(dim)) {
        rr[..dim].iter_mut().zip(sr.iter().zip(xr)).for_each(|(r, (s, x))| *r = s + two_rate * x);
    }
    let parts = if fused {
        let right = transpose(&right, n, w); // [w, n]
        share_tiles(
            upper.len(),
            workers,
            || (vec![0.0f32; w * n], Scratch::default()),
            |t, (acc, scratch)| {
                let (a, b) = upper[t];
                let tile = FusedTile { cols: &set.cols, right: &right, n, dim, rate };
                tile.run(tiles.range(a), tiles.range(b), a == b, acc, scratch, simd);
            },
        )
        .into_iter()
        .map(|(acc, _)| transpose(&acc, w, n))
        .collect::<Vec<_>>()
    } else {
        share_tiles(
            upper.len(),
            workers,
            || (vec![0.0f32; n * w], Vec::new()),
            |t, (acc, buf)| {
                let (a, b) = upper[t];
                let ((sa, la), (sb, lb)) = (tiles.range(a), tiles.range(b));
                *buf = match &kept {
                    Some(kept) => kept[t].clone(),
                    None => set.distances((sa, la), (sb, lb)),
                };
                exp_scaled_flushed_in_place(buf, rate);
                let e = Operand { values: buf, start: 0, row_stride: lb, col_stride: 1 };
                let rhs = Operand { values: &right, start: sb * w, row_stride: w, col_stride: 1 };
                gemm(la, lb, w, e, rhs, 1.0, acc, (sa * w, w, 1), true);
                if a != b {
                    let et = Operand { values: buf, start: 0, row_stride: 1, col_stride: lb };
                    let rhs = Operand { values: &right, start: sa * w, row_stride: w, col_stride: 1 };
                    gemm(lb, la, w, et, rhs, 1.0, acc, (sb * w, w, 1), true);
                }
            },
        )
        .into_iter()
        .map(|(acc, _)| acc)
        .collect()
    };
    // The workers' sums in worker order, then phi_i = (1/n) [sum_i - 2c x_i rowsum_i].
    let mut total = vec![0.0f32; n * w];
    for part in &parts {
        total.iter_mut().zip(part).for_each(|(t, p)| *t += p);
    }
    let inv_n = 1.0 / n as f32;
    let mut phi = vec![0.0f32; n * dim];
    for ((p, sum), xr) in phi.chunks_exact_mut(dim).zip(total.chunks_exact(w)).zip(set.rows.chunks_exact(dim)) {
        let spread = sum[dim] * two_rate;
        p.iter_mut().zip(sum.iter().zip(xr)).for_each(|(p, (v, x))| *p = (v - x * spread) * inv_n);
    }
    Some(Tensor::from_data(TensorData::new(phi, [n, dim]), &device))
}

/// The median of the squared distances of `pairs` seeded pairs of points (the draws of
/// [`super::sampled_pair_median_sq`], on the host).
fn sampled_median(set: &HostSet, pairs: usize, seed: u64) -> f32 {
    let mut draw = SplitMix::new(seed, set.n);
    let mut values: Vec<f32> = (0..pairs)
        .map(|_| {
            let (a, b) = (draw.index(), draw.index());
            set.distance(a, b)
        })
        .collect();
    median_by_selection(&mut values).unwrap_or(0.0)
}

/// A worker's buffers for the fused tiles: a row of the tile, and the column block's sums over
/// the tile (added to the worker's sums once per tile, so that no sum runs over more than a
/// tile's terms in `f32`).
#[derive(Default)]
struct Scratch {
    row: Vec<f32>,
    columns: Vec<f32>,
}

/// One tile of the fused few-dimensions path: the centred columns `[dim, n]`, the right-hand
/// matrix's columns `[dim + 1, n]` and the rate `c`.
struct FusedTile<'a> {
    cols: &'a [f32],
    right: &'a [f32],
    n: usize,
    dim: usize,
    rate: f32,
}

impl FusedTile<'_> {
    /// Adds the tile `(a, b)`'s products to the column-major sums `acc` `[dim + 1, n]`: its rows'
    /// `K_ab R_b` to block `a` and, off the diagonal, `K_ab^T R_a` to block `b`.
    fn run(
        &self,
        a: (usize, usize),
        b: (usize, usize),
        diagonal: bool,
        acc: &mut [f32],
        scratch: &mut Scratch,
        simd: Simd,
    ) {
        let (w, lb) = (self.dim + 1, b.1);
        scratch.row.resize(lb, 0.0);
        scratch.columns.clear();
        scratch.columns.resize(w * lb, 0.0);
        let (row, columns) = (&mut scratch.row[..], &mut scratch.columns[..]);
        match simd {
            // SAFETY: the CPU has the features (`Simd::detect`).
            #[cfg(target_arch = "x86_64")]
            Simd::Avx512 => unsafe { self.run_avx512(a, b, diagonal, acc, row, columns) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Simd::Avx2 => unsafe { self.run_avx2(a, b, diagonal, acc, row, columns) },
            _ => self.rows::<false>(a, b, diagonal, acc, row, columns),
        }
        if !diagonal {
            for (k, sums) in columns.chunks_exact(lb).enumerate() {
                acc[k * self.n + b.0..][..lb].iter_mut().zip(sums).for_each(|(a, s)| *a += s);
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx2,fma")]
    fn run_avx512(
        &self,
        a: (usize, usize),
        b: (usize, usize),
        diagonal: bool,
        acc: &mut [f32],
        row: &mut [f32],
        columns: &mut [f32],
    ) {
        self.rows::<true>(a, b, diagonal, acc, row, columns);
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn run_avx2(
        &self,
        a: (usize, usize),
        b: (usize, usize),
        diagonal: bool,
        acc: &mut [f32],
        row: &mut [f32],
        columns: &mut [f32],
    ) {
        self.rows::<true>(a, b, diagonal, acc, row, columns);
    }

    /// The tile row by row: `e_j = exp(c |x_i - x_j|^2)` for the row's `j` in block `b`, then
    /// `acc[:, i] += e . R_b` and `columns += e R_i` (`[dim + 1, lb]`), each a loop over `j`
    /// that vectorises.
    #[inline(always)]
    fn rows<const FMA: bool>(
        &self,
        (sa, la): (usize, usize),
        (sb, lb): (usize, usize),
        diagonal: bool,
        acc: &mut [f32],
        row: &mut [f32],
        columns: &mut [f32],
    ) {
        let (n, dim, w) = (self.n, self.dim, self.dim + 1);
        let e = &mut row[..lb];
        for i in sa..sa + la {
            let xi = self.cols[i];
            for (v, &xj) in e.iter_mut().zip(&self.cols[sb..][..lb]) {
                *v = (xi - xj) * (xi - xj);
            }
            for k in 1..dim {
                let xi = self.cols[k * n + i];
                for (v, &xj) in e.iter_mut().zip(&self.cols[k * n + sb..][..lb]) {
                    let t = xi - xj;
                    *v = madd::<FMA>(t, t, *v);
                }
            }
            let rate = self.rate;
            if FMA {
                e.iter_mut().for_each(|v| *v = exp_f32_fma_flushed(*v * rate));
            } else {
                e.iter_mut().for_each(|v| *v = exp_f32_flushed(*v * rate));
            }
            // Per right-hand column, the row's dot product and the column block's update in one
            // pass over the row (sixteen partial sums: a single running sum would be a chain of
            // additions the compiler may not reorder).
            for k in 0..w {
                let rk = &self.right[k * n + sb..][..lb];
                let r = self.right[k * n + i];
                let mut partial = [0.0f32; 16];
                let whole = lb / 16 * 16;
                if diagonal {
                    for (x, y) in e[..whole].chunks_exact(16).zip(rk.chunks_exact(16)) {
                        for l in 0..16 {
                            partial[l] = madd::<FMA>(x[l], y[l], partial[l]);
                        }
                    }
                } else {
                    let cs = &mut columns[k * lb..][..lb];
                    for ((x, y), c) in e[..whole].chunks_exact(16).zip(rk.chunks_exact(16)).zip(cs.chunks_exact_mut(16))
                    {
                        for l in 0..16 {
                            partial[l] = madd::<FMA>(x[l], y[l], partial[l]);
                            c[l] = madd::<FMA>(x[l], r, c[l]);
                        }
                    }
                    for j in whole..lb {
                        cs[j] += e[j] * r;
                    }
                }
                let tail: f32 = (whole..lb).map(|j| e[j] * rk[j]).sum();
                acc[k * n + i] += partial.iter().sum::<f32>() + tail;
            }
        }
    }
}

/// `a b + c`, fused where the caller is compiled for FMA (see [`parvi_model::fastmath`]).
#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { a * b + c }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Rbf;
    use crate::kernels::svgd_direction_dense;
    use burn::tensor::Device;

    fn points(n: usize, dim: usize, seed: u64) -> Tensor<2> {
        let mut state = seed;
        let values: Vec<f32> = (0..n * dim)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect();
        Tensor::from_data(TensorData::new(values, [n, dim]), &Device::flex())
    }

    /// SVGD's RBF direction in `f64`, one pair at a time: the reference both paths round away from.
    fn reference(x: &[f32], s: &[f32], dim: usize, h: f64) -> Vec<f64> {
        let n = x.len() / dim;
        let c = -1.0 / (2.0 * h * h);
        let mut out = vec![0.0; n * dim];
        for i in 0..n {
            for j in 0..n {
                let r2: f64 = (0..dim).map(|q| f64::from(x[i * dim + q] - x[j * dim + q]).powi(2)).sum();
                let k = (c * r2).exp();
                for q in 0..dim {
                    out[i * dim + q] += (k * f64::from(s[j * dim + q])
                        + 2.0 * c * k * f64::from(x[j * dim + q] - x[i * dim + q]))
                        / n as f64;
                }
            }
        }
        out
    }

    /// The largest difference over the largest entry of `want`.
    fn gap(got: &[f32], want: &[f64]) -> f64 {
        let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        got.iter().zip(want).fold(0.0f64, |m, (a, b)| m.max((f64::from(*a) - b).abs())) / scale
    }

    /// Both native paths (differences in few dimensions, `gemm` in many), on several tiles with ragged edges, keep to `f32` precision of
    /// the `f64` reference at a fixed bandwidth, and give the dense tensor direction to its
    /// rounding under the median rule.
    #[test]
    fn native_tiles_give_the_dense_direction() {
        for (n, dim) in [(150, 2), (131, 3), (150, 7), (150, FUSED_MAX_DIM + 9)] {
            let x = points(n, dim, 1).mul_scalar(2.0).add_scalar(3.0);
            let s = points(n, dim, 2) - x.clone().mul_scalar(0.5);
            let tiles = PairTiles::new(n, 40);
            let fixed = Rbf::fixed(1.3).unwrap();
            let want = reference(&to_vec_f32(&x), &to_vec_f32(&s), dim, 1.3);
            // Every instruction set this CPU has (the fused tiles are compiled for each).
            for simd in Simd::detect().with_narrower() {
                let got = to_vec_f32(&rbf_direction_with(&fixed, &x, &s, &tiles, simd).unwrap());
                let err = gap(&got, &want);
                // Differences in few dimensions are within 2e-6; the gemm path's
                // `|a|^2 + |b|^2 - 2 a.b` loses a little more to cancellation (as the tensor tiles).
                let bound = if dim <= FUSED_MAX_DIM { 2e-6 } else { 1e-5 };
                assert!(err < bound, "n {n}, dim {dim}, {simd:?}: native tiles vs the f64 reference {err}");
            }
            let median = Rbf::median();
            let got = to_vec_f32(&rbf_direction(&median, &x, &s, &tiles).unwrap());
            let want: Vec<f64> =
                to_vec_f32(&svgd_direction_dense(&median, x.clone(), s.clone())).into_iter().map(f64::from).collect();
            let err = gap(&got, &want);
            assert!(err < 1e-4, "n {n}, dim {dim}: native tiles vs dense under the median rule {err}");
        }
    }
}
