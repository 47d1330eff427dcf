//! The pairs of one point set worked through in square tiles, so that kernel work on `n` points
//! needs `O(n dim + tile^2)` memory instead of `O(n^2)`: the median of the squared pair
//! distances (exact by selection, or from a seeded sample of pairs above a size, with its error
//! bound) and SVGD's direction with no `n x n` matrix formed.
//!
//! Kernel matrices of one set with itself are symmetric, so only the tiles `I <= J` of the
//! block grid are evaluated; an off-diagonal tile serves both its row block (`K_IJ M_J`) and its
//! column block (`K_IJ^T M_I`). On a CPU device the tiles are shared out, in a fixed order, among
//! the machine's cores (burn's flex runs each operation on one thread).

use burn::tensor::{Device, Int, Tensor, TensorData};
use parvi_model::tensor_ops::{median_by_selection, to_vec_f32};

use crate::kernels::{Kernel, linear_direction};

mod cpu;

pub use cpu::FUSED_MAX_DIM;
pub(crate) use cpu::{HOST_DIRECTION_MAX_POINTS, rbf_direction_small, rbf_shard_rows, shard_rows_on_host};

/// Above this many points the median of the squared pair distances is always estimated from a
/// sample of pairs (the exact one reads the `n (n - 1) / 2` pairs to the host: 32 MiB here).
/// See [`median_is_exact`].
pub const EXACT_MEDIAN_MAX_POINTS: usize = 4096;

/// The most pairs drawn for the sampled median (in few dimensions). Drawn uniformly with
/// replacement from the `n^2` ordered pairs (the diagonal included, as in the exact median), `m`
/// pairs give a sample median between the exact `(1/2 - e)` and `(1/2 + e)` quantiles of the
/// squared distances except with probability at most `2 exp(-2 m e^2)` (Hoeffding's inequality
/// at the two quantiles): for `m = 2^18` and `e = 0.005`, `4e-6`. In bandwidth terms: for a 2-D
/// Gaussian (squared distances exponential) a rank error of 0.5% moves `h^2` by at most 1.5%.
pub const MEDIAN_SAMPLE_PAIRS: usize = 1 << 18;

/// The fewest pairs drawn for the sampled median (in many dimensions, where gathering a pair's
/// rows costs `dim`): `e = 0.021` at the same `1e-6`-level probability. Squared distances
/// concentrate as the dimension grows, so the same rank error moves `h^2` less: for a 753-d
/// Gaussian (`2 chi^2_753` distances) a rank error of 2.1% moves `h^2` by 0.3%.
pub const MEDIAN_SAMPLE_MIN_PAIRS: usize = 1 << 14;

/// Pairs drawn for the sampled median in `dim` dimensions: `2^21 / dim` coordinates gathered per
/// endpoint, between [`MEDIAN_SAMPLE_MIN_PAIRS`] and [`MEDIAN_SAMPLE_PAIRS`], so that the
/// gather (a row copy per endpoint) stays small next to the kernel work in many dimensions.
pub fn median_sample_pairs(dim: usize) -> usize {
    ((1usize << 21) / dim.max(1)).clamp(MEDIAN_SAMPLE_MIN_PAIRS, MEDIAN_SAMPLE_PAIRS)
}

/// The seed of the sampled median's pairs: the same pairs at every call, so a run (and a resumed
/// run) is deterministic.
const MEDIAN_SAMPLE_SEED: u64 = 0x5eed_9a1c;

/// Bytes of gathered rows per chunk of the sampled median (the two endpoints of each pair).
const MEDIAN_CHUNK_BYTES: usize = 32 << 20;

/// Memory for the `f32` tiles one worker holds at a time (a tile, its exponential in place and
/// the product's inputs): the tile side is `sqrt(budget / (4 bytes x 3))`, 512 points for
/// 3 MiB, a tile of 1 MiB that stays in a core's cache through its passes (larger tiles were
/// slower; docs/benchmarks.md).
pub const TILE_BUDGET_BYTES: usize = 3 << 20;

/// Up to this many points SVGD's direction forms the whole `n x n` matrix, which has fewer
/// operations; above, it works in tiles of at most a quarter of the points, so that the cores
/// share at least ten tiles (the crossover measured in docs/benchmarks.md).
pub const DENSE_MAX_POINTS: usize = 256;

/// Whether the median of the squared pair distances of `n` points in `dim` dimensions is exact
/// (by selection over all pairs) rather than sampled: up to [`EXACT_MEDIAN_MAX_POINTS`] points,
/// and while it costs no more than the sample, `n^2 <= 2 m (dim + 1)` with `m` =
/// [`median_sample_pairs`] (the exact median reads and selects `n^2 / 2` pair values, the
/// sample gathers `2 m dim` coordinates at about half the cost each; docs/benchmarks.md). In
/// 2-D the median is exact up to 1,254 points, in 753-D up to 4,096.
pub fn median_is_exact(n: usize, dim: usize) -> bool {
    n <= EXACT_MEDIAN_MAX_POINTS && n * n <= 2 * median_sample_pairs(dim) * (dim + 1)
}

/// A square tiling of the pairs `(i, j)` of `n` points by blocks of `block` points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PairTiles {
    n: usize,
    block: usize,
}

impl PairTiles {
    /// Tiles of `block` points on a side (at least 1, at most `n`).
    pub fn new(n: usize, block: usize) -> Self {
        Self { n, block: block.clamp(1, n.max(1)) }
    }

    /// Tiles whose side fits [`TILE_BUDGET_BYTES`], and at most a quarter of `n` (at least 64
    /// points) so that the cores have tiles to share.
    pub fn for_budget(n: usize) -> Self {
        Self::new(n, tile_side(TILE_BUDGET_BYTES).min(n.div_ceil(4).max(64)))
    }

    /// The tiling for `n` points on `device`: [`PairTiles::for_budget`] on a CPU, tiles of
    /// [`GPU_TILE_SIDE`] points elsewhere. `PARVI_TILE_SIDE` (points) overrides both.
    pub fn for_device(n: usize, device: &Device) -> Self {
        match tile_side_override() {
            Some(side) => Self::new(n, side),
            None if cpu::is_cpu(device) => Self::for_budget(n),
            None => Self::new(n, GPU_TILE_SIDE),
        }
    }

    /// The points on a tile's side.
    pub fn block(&self) -> usize {
        self.block
    }

    fn blocks(&self) -> usize {
        self.n.div_ceil(self.block)
    }

    /// `(start, len)` of block `b`.
    fn range(&self, b: usize) -> (usize, usize) {
        let start = b * self.block;
        (start, self.block.min(self.n - start))
    }

    /// The tiles `(I, J)` with `I <= J`, row by row.
    fn upper(&self) -> Vec<(usize, usize)> {
        let nb = self.blocks();
        (0..nb).flat_map(|i| (i..nb).map(move |j| (i, j))).collect()
    }
}

/// The tile side on a GPU, where a tile's cost is mostly its operations' launches, so fewer,
/// larger tiles win; 8,192 points (256 MiB a tile) still fit a small GPU's memory
/// (measured on an H100 in docs/distributed.md, "SVGD on a GPU").
pub const GPU_TILE_SIDE: usize = 8192;

/// `PARVI_TILE_SIDE`, read once: the tile side in points, for tuning on other hardware. A value
/// that is not a positive integer is reported once and ignored.
fn tile_side_override() -> Option<usize> {
    static SIDE: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *SIDE.get_or_init(|| {
        let value = std::env::var("PARVI_TILE_SIDE").ok()?;
        match value.trim().parse::<usize>() {
            Ok(side) if side > 0 => Some(side),
            _ => {
                eprintln!("warning: PARVI_TILE_SIDE={value:?} is not a positive integer; the default tiles are used");
                None
            }
        }
    })
}

/// The side of a square `f32` tile of which three fit in `budget` bytes.
fn tile_side(budget: usize) -> usize {
    (((budget / 12) as f64).sqrt() as usize).max(1)
}

/// How many threads share the tiles: the machine's cores on a CPU backend, one elsewhere (a GPU
/// queue gains nothing from several submitting threads).
fn workers(device: &Device, tiles: usize) -> usize {
    // The count is read once: `available_parallelism` opens the cgroup files at every call (about
    // 20 us, most of a small direction's cost).
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = if tiles > 1 && cpu::is_cpu(device) {
        *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |c| c.get()))
    } else {
        1
    };
    cores.min(tiles).max(1)
}

/// Runs `work(t, acc)` over the tiles `t < count` on `workers` threads, tile `t` on worker
/// `t % workers` (a fixed assignment, so results do not depend on scheduling; their rounding
/// does depend on the number of workers, so runs repeat bit for bit on one machine), each worker
/// with its own accumulator from `fresh`; returns the accumulators in worker order.
fn share_tiles<A: Send>(
    count: usize,
    workers: usize,
    fresh: impl Fn() -> A + Sync,
    work: impl Fn(usize, &mut A) + Sync,
) -> Vec<A> {
    let run = |w: usize| {
        let mut acc = fresh();
        for t in (w..count).step_by(workers) {
            work(t, &mut acc);
        }
        acc
    };
    if workers <= 1 {
        return vec![run(0)];
    }
    std::thread::scope(|scope| {
        let handles: Vec<_> = (1..workers).map(|w| scope.spawn(move || run(w))).collect();
        let mut accs = vec![run(0)];
        accs.extend(handles.into_iter().map(|h| h.join().expect("a kernel tile worker panicked")));
        accs
    })
}

/// `f(i)` for every `i < count`, computed on the workers ([`share_tiles`]), in index order.
fn map_indexed<T: Send>(count: usize, workers: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let mut indexed: Vec<(usize, T)> =
        share_tiles(count, workers, Vec::new, |i, acc| acc.push((i, f(i)))).into_iter().flatten().collect();
    indexed.sort_by_key(|(i, _)| *i);
    indexed.into_iter().map(|(_, v)| v).collect()
}

/// Rows `[start, start + len)` of `x`.
fn rows(x: &Tensor<2>, (start, len): (usize, usize)) -> Tensor<2> {
    x.clone().narrow(0, start, len)
}

/// The point set block by block, each block formed by a worker (no whole-matrix pass on one
/// thread): the rows centred on the set's mean (distances do not change; the
/// `|a|^2 + |b|^2 - 2 a.b` expansion loses less to cancellation) and the factors
/// `[x, |x|^2, 1]` and `[-2 x, 1, |x|^2]` whose product is the squared distance.
struct Blocks {
    centred: Vec<Tensor<2>>,
    left: Vec<Tensor<2>>,
    right: Vec<Tensor<2>>,
}

impl Blocks {
    fn new(x: &Tensor<2>, tiles: &PairTiles, workers: usize) -> Self {
        let mean = x.clone().mean_dim(0);
        let parts = map_indexed(tiles.blocks(), workers, |b| {
            let centred = rows(x, tiles.range(b)) - mean.clone();
            let norms = centred.clone().square().sum_dim(1); // [len, 1]
            let ones = norms.ones_like();
            let left = Tensor::cat(vec![centred.clone(), norms.clone(), ones.clone()], 1);
            let right = Tensor::cat(vec![centred.clone().mul_scalar(-2.0), ones, norms], 1);
            (centred, left, right)
        });
        let mut blocks = Self { centred: Vec::new(), left: Vec::new(), right: Vec::new() };
        for (c, l, r) in parts {
            blocks.centred.push(c);
            blocks.left.push(l);
            blocks.right.push(r);
        }
        blocks
    }

    /// The squared distances of blocks `a` and `b`, clamped at 0 against rounding.
    fn distances(&self, (a, b): (usize, usize)) -> Tensor<2> {
        self.left[a].clone().matmul(self.right[b].clone().transpose()).clamp_min(0.0)
    }
}

/// The median of the squared distances of all `n^2` ordered pairs of the rows of `x` (the
/// diagonal's zeros included, as the median of the whole matrix): exact by selection where
/// [`median_is_exact`], else from [`median_sample_pairs`] seeded pairs (see
/// [`MEDIAN_SAMPLE_PAIRS`] for the error bound). No `n x n` matrix is formed on the device.
pub fn pair_median_sq(x: &Tensor<2>) -> f32 {
    let [n, dim] = x.dims();
    if median_is_exact(n, dim) {
        let tiles = PairTiles::for_device(n, &x.device());
        let upper = tiles.upper();
        let workers = workers(&x.device(), upper.len());
        let blocks = Blocks::new(x, &tiles, workers);
        let kept = map_indexed(upper.len(), workers, |t| blocks.distances(upper[t]));
        median_of_tiles(&tiles, &upper, workers, |t| to_vec_f32(&kept[t]))
    } else {
        sampled_pair_median_sq(x, median_sample_pairs(dim), MEDIAN_SAMPLE_SEED)
    }
}

/// The exact median (NumPy's convention) of the `n^2` squared distances, the diagonal's zeros
/// included, from the tiles `I <= J`. Sorted, the `n^2` values are the `n` zeros and then every
/// pair `i < j` twice, so the value at rank `t >= n` is the `(t - n) / 2`-th smallest of the
/// `n (n - 1) / 2` pairs: only those are read (by the workers, each from its own tiles) and
/// selected from. `values(t)` gives tile `upper[t]`'s distances, row-major.
fn median_of_tiles(
    tiles: &PairTiles,
    upper: &[(usize, usize)],
    workers: usize,
    values: impl Fn(usize) -> Vec<f32> + Sync,
) -> f32 {
    let n = tiles.n;
    let parts = share_tiles(upper.len(), workers, Vec::new, |t, acc: &mut Vec<f32>| {
        let (a, b) = upper[t];
        let values = values(t);
        if a != b {
            acc.extend_from_slice(&values);
        } else {
            // A diagonal tile: its strictly upper triangle.
            let side = tiles.range(a).1;
            for (row, chunk) in values.chunks_exact(side).enumerate() {
                acc.extend_from_slice(&chunk[row + 1..]);
            }
        }
    });
    let mut pairs: Vec<f32> = parts.concat();
    let count = n * n;
    let ranks = if count % 2 == 1 { [count / 2, count / 2] } else { [count / 2 - 1, count / 2] };
    // Rank t of the n^2 values in the pairs' order; below n, a diagonal zero.
    let pair_rank = |t: usize| t.checked_sub(n).map(|u| u / 2);
    let (low, high) = (pair_rank(ranks[0]), pair_rank(ranks[1]));
    let Some(high) = high.filter(|&h| h < pairs.len()) else {
        return 0.0;
    };
    let (below, at, _) = pairs.select_nth_unstable_by(high, f32::total_cmp);
    let high_value = *at;
    let low_value = match low {
        None => 0.0,
        Some(l) if l == high => high_value,
        // l = high - 1: the largest of the values below.
        Some(_) => below.iter().copied().max_by(f32::total_cmp).unwrap_or(high_value),
    };
    ((f64::from(low_value) + f64::from(high_value)) / 2.0) as f32
}

/// The median of the squared distances of `pairs` ordered pairs of rows of `x` drawn uniformly
/// with replacement (seeded by `seed`), gathered in chunks of bounded memory. With `n^2` pairs
/// and more it is still a sample, not the exact median.
pub fn sampled_pair_median_sq(x: &Tensor<2>, pairs: usize, seed: u64) -> f32 {
    let [n, dim] = x.dims();
    if n == 0 || pairs == 0 {
        return 0.0;
    }
    let mut pairs_drawn = SplitMix::new(seed, n);
    let mut draw = || pairs_drawn.index() as i64;
    let chunk = (MEDIAN_CHUNK_BYTES / (8 * dim.max(1))).clamp(1, pairs);
    let device = x.device();
    let mut values = Vec::with_capacity(pairs);
    let mut done = 0;
    while done < pairs {
        let len = chunk.min(pairs - done);
        let (a, b): (Vec<i64>, Vec<i64>) = (0..len).map(|_| (draw(), draw())).unzip();
        let index = |v: Vec<i64>| Tensor::<1, Int>::from_data(TensorData::new(v, [len]), &device);
        let diff = x.clone().select(0, index(a)) - x.clone().select(0, index(b));
        values.extend(to_vec_f32(&diff.square().sum_dim(1)));
        done += len;
    }
    median_by_selection(&mut values).unwrap_or(0.0)
}

/// SplitMix64 (Steele, Lea & Flood 2014): a tenth of the cost of the engines' ChaCha stream
/// for the sampled median's throwaway indices; an index is the high word of `z * n` (bias below
/// `n / 2^64`).
struct SplitMix {
    state: u64,
    n: usize,
}

impl SplitMix {
    fn new(seed: u64, n: usize) -> Self {
        Self { state: seed, n }
    }

    /// The next index below `n`.
    fn index(&mut self) -> usize {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        ((u128::from(z) * self.n as u128) >> 64) as usize
    }
}

#[derive(Clone)]
/// Per-block sums of tile products: `slots` groups of blocks, each block an `Option` until its
/// first product arrives.
struct BlockSums {
    blocks: usize,
    sums: Vec<Option<Tensor<2>>>,
}

impl BlockSums {
    fn new(blocks: usize, slots: usize) -> Self {
        Self { blocks, sums: vec![None; blocks * slots] }
    }

    fn add(&mut self, slot: usize, block: usize, value: Tensor<2>) {
        let entry = &mut self.sums[slot * self.blocks + block];
        *entry = Some(match entry.take() {
            Some(old) => old + value,
            None => value,
        });
    }

    /// Adds `tile @ right_J` to block I and, off the diagonal, `tile^T @ right_I` to block J.
    fn add_symmetric(&mut self, slot: usize, (a, b): (usize, usize), tile: &Tensor<2>, right: &[Tensor<2>]) {
        self.add(slot, a, tile.clone().matmul(right[b].clone()));
        if a != b {
            self.add(slot, b, tile.clone().transpose().matmul(right[a].clone()));
        }
    }

    /// The workers' sums for `block` in `slot`, added in worker order.
    fn total(parts: &[BlockSums], slot: usize, block: usize) -> Tensor<2> {
        parts
            .iter()
            .filter_map(|p| p.sums[slot * p.blocks + block].clone())
            .reduce(|u, v| u + v)
            .expect("every block has its diagonal tile")
    }
}

/// SVGD's direction (Liu & Wang 2016, eq. 8) at the rows of `x` with scores `s`, in tiles:
///
/// `phi(x_i) = (1/n) sum_j [k(x_j, x_i) s_j + grad_{x_j} k(x_j, x_i)]`,
///
/// the same numbers as the whole-matrix [`crate::kernels::svgd_direction`] up to float rounding
/// (the median bandwidth over all pairs: exact where [`median_is_exact`], sampled elsewhere).
/// Memory `O(n dim + workers tile^2)`, plus the distance tiles (`n^2 / 2` values, at most
/// 32 MiB) where the median is exact. `None` when `kernel` cannot be evaluated
/// in blocks ([`Kernel::resolved`]).
///
/// For a kernel with `f' = c f` (the RBF) a tile is `exp(c r^2)`, `c r^2` from one product of
/// the distance factors scaled by `c` (or the kept distances times `c`), and the direction is
/// `(1/n) [K (S + 2c X) - 2c X * rowsum(K)]` with the row sums from a column of ones beside
/// `S + 2c X`. Other kernels give `(1/n) [K S + 2 (K' X - X * rowsum(K'))]`, `K' = f'(r^2)`.
/// A kernel with linear features adds their part ([`linear_direction`]).
pub fn svgd_direction_tiled(kernel: &dyn Kernel, x: Tensor<2>, s: Tensor<2>, tiles: &PairTiles) -> Option<Tensor<2>> {
    // On a CPU backend an RBF-type kernel runs as native loops over the tiles (`cpu`).
    if let Some(phi) = cpu::rbf_direction(kernel, &x, &s, tiles) {
        return Some(with_linear_part(kernel, phi, x, s));
    }
    let [n, dim] = x.dims();
    let upper = tiles.upper();
    let workers = workers(&x.device(), upper.len());
    let nb = tiles.blocks();
    let blocks = Blocks::new(&x, tiles, workers);
    // Where the median is exact the distance tiles are kept: the median reads them and the
    // kernel reuses them. Elsewhere each tile is formed once the bandwidth is known.
    let kept = median_is_exact(n, dim).then(|| map_indexed(upper.len(), workers, |t| blocks.distances(upper[t])));
    let mut median = || match &kept {
        Some(kept) => median_of_tiles(tiles, &upper, workers, |t| to_vec_f32(&kept[t])),
        None => sampled_pair_median_sq(&x, median_sample_pairs(dim), MEDIAN_SAMPLE_SEED),
    };
    let kernel = kernel.resolved(n, &mut median)?;
    let score_rows = |b: usize| rows(&s, tiles.range(b));
    let phi_blocks = match kernel.eval_proportional(&Tensor::zeros([1, 1], &x.device())) {
        Some((_, rate)) => {
            // rate = c = f'/f, [1, 1]. right_J = [S_J + 2c X_J, 1]: one product gives K (S + 2c X)
            // and the row sums of K.
            let two_rate = rate.clone().mul_scalar(2.0);
            let right = map_indexed(nb, workers, |b| {
                let weighted = score_rows(b) + blocks.centred[b].clone() * two_rate.clone();
                let ones = Tensor::ones([tiles.range(b).1, 1], &weighted.device());
                Tensor::cat(vec![weighted, ones], 1)
            });
            let scaled_left =
                kept.is_none().then(|| map_indexed(nb, workers, |b| blocks.left[b].clone() * rate.clone()));
            let parts = share_tiles(
                upper.len(),
                workers,
                || BlockSums::new(nb, 1),
                |t, acc| {
                    let (a, b) = upper[t];
                    let exponent = match (&kept, &scaled_left) {
                        (Some(kept), _) => kept[t].clone() * rate.clone(),
                        (None, Some(scaled_left)) => {
                            scaled_left[a].clone().matmul(blocks.right[b].clone().transpose()).clamp_max(0.0)
                        }
                        (None, None) => unreachable!("the scaled factors exist where no tiles are kept"),
                    };
                    acc.add_symmetric(0, (a, b), &exponent.exp(), &right);
                },
            );
            map_indexed(nb, workers, |b| {
                let total = BlockSums::total(&parts, 0, b); // [len, dim + 1]
                let rowsum = total.clone().narrow(1, dim, 1);
                (total.narrow(1, 0, dim) - blocks.centred[b].clone() * (rowsum * two_rate.clone())).div_scalar(n as f64)
            })
        }
        None => {
            let scores: Vec<Tensor<2>> = (0..nb).map(score_rows).collect();
            let x_ones = map_indexed(nb, workers, |b| {
                let ones = Tensor::ones([tiles.range(b).1, 1], &x.device());
                Tensor::cat(vec![blocks.centred[b].clone(), ones], 1)
            });
            let parts = share_tiles(
                upper.len(),
                workers,
                || BlockSums::new(nb, 2),
                |t, acc| {
                    let sq = match &kept {
                        Some(kept) => kept[t].clone(),
                        None => blocks.distances(upper[t]),
                    };
                    let eval = kernel.eval(&sq, false);
                    acc.add_symmetric(0, upper[t], &eval.k, &scores);
                    acc.add_symmetric(1, upper[t], &eval.dk, &x_ones);
                },
            );
            map_indexed(nb, workers, |b| {
                let drift = BlockSums::total(&parts, 0, b); // [len, dim]
                let repulsion = BlockSums::total(&parts, 1, b); // [len, dim + 1]
                let rowsum = repulsion.clone().narrow(1, dim, 1);
                let spread = repulsion.narrow(1, 0, dim) - blocks.centred[b].clone() * rowsum;
                (drift + spread.mul_scalar(2.0)).div_scalar(n as f64)
            })
        }
    };
    Some(with_linear_part(kernel.as_ref(), Tensor::cat(phi_blocks, 0), x, s))
}

/// The radial direction `phi` plus the linear features' part when `kernel` has them (it needs
/// no pairs: two products over all points).
fn with_linear_part(kernel: &dyn Kernel, phi: Tensor<2>, x: Tensor<2>, s: Tensor<2>) -> Tensor<2> {
    if kernel.linear_features() { phi + linear_direction(x.clone(), s, x, None) } else { phi }
}
