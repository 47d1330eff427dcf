//! Native flex bodies of the factorisation and the solve: plain loops over each matrix of the
//! batch on flex's contiguous `f32`/`f64` buffers (LAPACK's unblocked `potf2` and `trsm`
//! orders), one pass where the primitive-op bodies make `K` rounds of slices, products and
//! assignments. Other dtypes take the primitive-op bodies.

use std::ops::{Add, Div, Mul, Sub};
use std::sync::atomic::{AtomicBool, Ordering};

use burn::backend::flex::FlexTensor;
use burn::backend::{Flex, TensorMetadata};
use burn::tensor::{DType, Element, TensorData};

use super::ops::{LinalgOps, SolveSpec, generic};

/// When set, flex runs the primitive-op bodies too (to measure what the native loops buy).
static GENERIC_ON_FLEX: AtomicBool = AtomicBool::new(false);

/// Makes flex run the primitive-op forward passes instead of its native loops (`true`), or the
/// native loops again (`false`). For benchmarks and tests only: both compute the same values.
#[doc(hidden)]
pub fn set_generic_on_flex(on: bool) {
    GENERIC_ON_FLEX.store(on, Ordering::Relaxed);
}

fn generic_on_flex() -> bool {
    GENERIC_ON_FLEX.load(Ordering::Relaxed)
}

impl LinalgOps for Flex {
    fn cholesky(a: FlexTensor, floor: f64) -> FlexTensor {
        if generic_on_flex() {
            return generic::cholesky::<Flex>(a, floor);
        }
        let [m, k, _] = a.shape().dims::<3>();
        let ac = a.to_contiguous();
        match ac.dtype() {
            DType::F32 => {
                if let Some(v) = ac.as_slice::<f32>() {
                    return tensor(cholesky_batch(v, m, k, floor as f32), [m, k, k]);
                }
            }
            DType::F64 => {
                if let Some(v) = ac.as_slice::<f64>() {
                    return tensor(cholesky_batch(v, m, k, floor), [m, k, k]);
                }
            }
            _ => {}
        }
        generic::cholesky::<Flex>(a, floor)
    }

    fn triangular_solve(t: FlexTensor, b: FlexTensor, spec: SolveSpec) -> FlexTensor {
        if generic_on_flex() {
            return generic::triangular_solve::<Flex>(t, b, spec);
        }
        let [m, k, cols] = b.shape().dims::<3>();
        let (tc, bc) = (t.to_contiguous(), b.to_contiguous());
        match (tc.dtype(), bc.dtype()) {
            (DType::F32, DType::F32) => {
                if let (Some(tv), Some(bv)) = (tc.as_slice::<f32>(), bc.as_slice::<f32>()) {
                    return tensor(solve_batch(tv, bv, m, k, cols, spec), [m, k, cols]);
                }
            }
            (DType::F64, DType::F64) => {
                if let (Some(tv), Some(bv)) = (tc.as_slice::<f64>(), bc.as_slice::<f64>()) {
                    return tensor(solve_batch(tv, bv, m, k, cols, spec), [m, k, cols]);
                }
            }
            _ => {}
        }
        generic::triangular_solve::<Flex>(t, b, spec)
    }
}

/// The arithmetic the loops need, for `f32` and `f64`.
trait Real: Copy + Element + Add<Output = Self> + Sub<Output = Self> + Mul<Output = Self> + Div<Output = Self> {
    const ZERO: Self;
    fn sqrt(self) -> Self;
}

impl Real for f32 {
    const ZERO: Self = 0.0;
    fn sqrt(self) -> Self {
        f32::sqrt(self)
    }
}

impl Real for f64 {
    const ZERO: Self = 0.0;
    fn sqrt(self) -> Self {
        f64::sqrt(self)
    }
}

fn tensor<T: Element>(values: Vec<T>, shape: [usize; 3]) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(values, shape))
}

/// `sum_i x[i] y[i]` with eight partial sums the compiler can keep in one vector register.
fn dot<T: Real>(x: &[T], y: &[T]) -> T {
    let mut acc = [T::ZERO; 8];
    let (xc, yc) = (x.chunks_exact(8), y.chunks_exact(8));
    let mut rest = T::ZERO;
    for (a, b) in xc.remainder().iter().zip(yc.remainder()) {
        rest = rest + *a * *b;
    }
    for (a, b) in xc.zip(yc) {
        for l in 0..8 {
            acc[l] = acc[l] + a[l] * b[l];
        }
    }
    acc.iter().fold(rest, |s, &v| s + v)
}

/// Row-oriented Cholesky-Crout of each `k x k` matrix: `L[i, j] = (A[i, j] - L[i, :j] . L[j, :j])
/// / L[j, j]`, both dot products over contiguous rows of `L`.
fn cholesky_batch<T: Real + PartialOrd>(a: &[T], m: usize, k: usize, floor: T) -> Vec<T> {
    let mut out = vec![T::ZERO; m * k * k];
    for (l, a) in out.chunks_exact_mut(k * k).zip(a.chunks_exact(k * k)).take(m) {
        for j in 0..k {
            let pivot = a[j * k + j] - dot(&l[j * k..j * k + j], &l[j * k..j * k + j]);
            // `pivot < floor` is false for NaN, so a NaN pivot stays NaN (and is reported).
            let root = if pivot < floor { floor } else { pivot }.sqrt();
            l[j * k + j] = root;
            for i in j + 1..k {
                let s = dot(&l[i * k..i * k + j], &l[j * k..j * k + j]);
                l[i * k + j] = (a[i * k + j] - s) / root;
            }
        }
    }
    out
}

/// Forward or back substitution for each `k x k` matrix and `k x cols` right-hand side, a row of
/// the solution at a time (`x[i, :] -= T[i, r] x[r, :]` over contiguous rows).
fn solve_batch<T: Real>(t: &[T], b: &[T], m: usize, k: usize, cols: usize, spec: SolveSpec) -> Vec<T> {
    let mut out = b[..m * k * cols].to_vec();
    let coeff = |t: &[T], i: usize, r: usize| if spec.transpose { t[r * k + i] } else { t[i * k + r] };
    for (x, t) in out.chunks_exact_mut(k * cols).zip(t.chunks_exact(k * k)) {
        for step in 0..k {
            let i = if spec.effective_lower() { step } else { k - 1 - step };
            let known = if spec.effective_lower() { 0..i } else { i + 1..k };
            for r in known {
                let c = coeff(t, i, r);
                // Rows r and i are distinct: split the buffer between them.
                let (row_i, row_r) = if r < i {
                    let (head, tail) = x.split_at_mut(i * cols);
                    (&mut tail[..cols], &head[r * cols..(r + 1) * cols])
                } else {
                    let (head, tail) = x.split_at_mut(r * cols);
                    (&mut head[i * cols..(i + 1) * cols], &tail[..cols])
                };
                row_i.iter_mut().zip(row_r).for_each(|(xi, &xr)| *xi = *xi - c * xr);
            }
            let d = t[i * k + i];
            x[i * cols..(i + 1) * cols].iter_mut().for_each(|xi| *xi = *xi / d);
        }
    }
    out
}
