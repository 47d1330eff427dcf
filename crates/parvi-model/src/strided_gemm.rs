//! A bounds-checked, single-threaded matrix product over strided host slices: the one safe
//! wrapper around the `gemm` crate's raw-pointer kernel, shared by the flex layers' native
//! forward and backward passes and the kernel tiles on a CPU (both run their products on one
//! thread each and share the work out themselves).

/// The element types of [`gemm`].
pub trait GemmScalar: Copy + 'static {
    /// The multiplicative identity (the weight of the accumulated destination).
    const ONE: Self;
}

impl GemmScalar for f32 {
    const ONE: Self = 1.0;
}

impl GemmScalar for f64 {
    const ONE: Self = 1.0;
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
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr().add(start),
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
