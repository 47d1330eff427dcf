//! A bounds-checked, single-threaded matrix product over strided host slices: the one safe
//! wrapper around the `gemm` crate's raw-pointer kernel, shared by the flex layers' native
//! forward and backward passes and the kernel tiles on a CPU (both run their products on one
//! thread each and share the work out themselves).

/// The element types of [`gemm`].
pub trait GemmScalar: Copy + 'static {
    /// The multiplicative identity (the weight of the accumulated destination).
    const ONE: Self;
    /// The additive identity.
    const ZERO: Self;
}

impl GemmScalar for f32 {
    const ONE: Self = 1.0;
    const ZERO: Self = 0.0;
}

impl GemmScalar for f64 {
    const ONE: Self = 1.0;
    const ZERO: Self = 0.0;
}

/// A matrix operand of [`gemm`]: its first element and (row, column) strides in `values`.
#[derive(Clone, Copy)]
pub struct Operand<'a, T> {
    /// The slice the matrix lies in.
    pub values: &'a [T],
    /// The index of its element `(0, 0)`.
    pub start: usize,
    /// Elements between `(i, j)` and `(i + 1, j)`.
    pub row_stride: usize,
    /// Elements between `(i, j)` and `(i, j + 1)`.
    pub col_stride: usize,
}

impl<T> Operand<'_, T> {
    /// Whether every element of a `[rows, cols]` matrix lies inside `values`.
    pub fn fits(&self, rows: usize, cols: usize) -> bool {
        rows == 0
            || cols == 0
            || self.start + (rows - 1) * self.row_stride + (cols - 1) * self.col_stride < self.values.len()
    }
}

/// `dst = accumulate * dst + scale lhs rhs` for `lhs` `[m, k]`, `rhs` `[k, n]` and `dst` the
/// `[m, n]` block of `out` at `(start, row_stride, col_stride)`. An operand that does not fit
/// its slice is a panic (a caller's indexing bug), never an out-of-bounds access.
#[allow(clippy::too_many_arguments)]
pub fn gemm<T: GemmScalar>(
    m: usize,
    k: usize,
    n: usize,
    lhs: Operand<'_, T>,
    rhs: Operand<'_, T>,
    scale: T,
    out: &mut [T],
    (start, row_stride, col_stride): (usize, usize, usize),
    accumulate: bool,
) {
    let dst_fits = m == 0 || n == 0 || start + (m - 1) * row_stride + (n - 1) * col_stride < out.len();
    assert!(
        lhs.fits(m, k) && rhs.fits(k, n) && dst_fits,
        "matrix product operand out of bounds ({m}x{k} times {k}x{n})"
    );
    if m == 0 || n == 0 {
        return;
    }
    // SAFETY: every element the three (start, strides, extent) triples address lies inside its
    // slice (checked above); `out` is borrowed mutably, so it overlaps neither operand.
    unsafe { raw_product(m, k, n, lhs, rhs, scale, out.as_mut_ptr().add(start), (row_stride, col_stride), accumulate) };
}

/// The `gemm` crate's product on one thread: `dst = accumulate * dst + scale lhs rhs`.
///
/// # Safety
/// `lhs` and `rhs` fit their slices ([`Operand::fits`]) and `dst` addresses `m x n` writable
/// elements at `(row_stride, col_stride)`, overlapping neither operand; those elements are
/// read only when `accumulate`.
#[allow(clippy::too_many_arguments)]
unsafe fn raw_product<T: GemmScalar>(
    m: usize,
    k: usize,
    n: usize,
    lhs: Operand<'_, T>,
    rhs: Operand<'_, T>,
    scale: T,
    dst: *mut T,
    (row_stride, col_stride): (usize, usize),
    accumulate: bool,
) {
    // SAFETY: the caller's contract above is `gemm::gemm`'s.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            col_stride as isize,
            row_stride as isize,
            accumulate,
            lhs.values.as_ptr().add(lhs.start),
            lhs.col_stride as isize,
            lhs.row_stride as isize,
            rhs.values.as_ptr().add(rhs.start),
            rhs.col_stride as isize,
            rhs.row_stride as isize,
            T::ONE,
            scale,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// `scale lhs rhs` for `lhs` `[m, k]` and `rhs` `[k, n]` as a new row-major `[m, n]` buffer.
/// The product is written straight into fresh memory, where filling a buffer first and
/// accumulating onto it passes over the whole output once more (a layer's forward output is
/// `[rows, particles x units]`, hundreds of kilobytes a call).
pub fn gemm_new<T: GemmScalar>(
    m: usize,
    k: usize,
    n: usize,
    lhs: Operand<'_, T>,
    rhs: Operand<'_, T>,
    scale: T,
) -> Vec<T> {
    assert!(lhs.fits(m, k) && rhs.fits(k, n), "matrix product operand out of bounds ({m}x{k} times {k}x{n})");
    let len = m * n;
    if len == 0 || k == 0 {
        return vec![T::ZERO; len];
    }
    let mut out = Vec::with_capacity(len);
    // SAFETY: the operands lie inside their slices (checked above) and the destination is the
    // new buffer's `m n` elements, row-major, which nothing else references. With `read_dst`
    // false (and `k > 0`) the `gemm` crate writes every destination element without reading
    // it (its `alpha` is set to zero and the kernels store `beta * acc`), so all `len`
    // elements are initialised when `set_len` makes them visible.
    unsafe {
        raw_product(m, k, n, lhs, rhs, scale, out.as_mut_ptr(), (n, 1), false);
        out.set_len(len);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(m: usize, k: usize, n: usize, a: &[f32], b: &[f32], scale: f32) -> Vec<f32> {
        let mut out = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = scale * (0..k).map(|l| a[i * k + l] * b[l * n + j]).sum::<f32>();
            }
        }
        out
    }

    /// A fresh product equals the accumulated one onto zeros, on the shapes the `gemm` crate
    /// treats apart (small, a matrix-vector product either way, empty inner dimension).
    #[test]
    fn a_new_product_is_every_element_written() {
        for (m, k, n) in [(100, 13, 1000), (7, 5, 3), (1, 9, 40), (40, 9, 1), (6, 0, 4), (0, 3, 5), (33, 100, 13)] {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 7919) % 23) as f32 / 11.0 - 1.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 104_729) % 31) as f32 / 15.0 - 1.0).collect();
            let lhs = Operand { values: &a, start: 0, row_stride: k, col_stride: 1 };
            let rhs = Operand { values: &b, start: 0, row_stride: n, col_stride: 1 };
            let fresh = gemm_new(m, k, n, lhs, rhs, 0.5);
            let mut onto_zeros = vec![0.0f32; m * n];
            gemm(m, k, n, lhs, rhs, 0.5, &mut onto_zeros, (0, n, 1), false);
            assert_eq!(fresh, onto_zeros, "{m}x{k}x{n}");
            let want = naive(m, k, n, &a, &b, 0.5);
            for (g, w) in fresh.iter().zip(&want) {
                assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "{m}x{k}x{n}: {g} against {w}");
            }
        }
    }
}
