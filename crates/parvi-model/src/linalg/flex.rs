//! Native flex bodies of the factorisation, the solve and the factorisation's reverse pass: plain
//! loops over each matrix of the batch on flex's contiguous `f32`/`f64` buffers (LAPACK's
//! unblocked `potf2` and `trsm` orders, Murray's unblocked reverse pass), one pass where the
//! primitive-op bodies make `K` rounds of slices, products and assignments. Other dtypes take
//! the primitive-op bodies.

use std::ops::{Add, DivAssign, Mul, Sub, SubAssign};
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

    fn cholesky_grad(l: FlexTensor, grad: FlexTensor) -> FlexTensor {
        if generic_on_flex() {
            return generic::cholesky_grad::<Flex>(l, grad);
        }
        let [m, k, _] = l.shape().dims::<3>();
        let (lc, gc) = (l.to_contiguous(), grad.to_contiguous());
        match (lc.dtype(), gc.dtype()) {
            (DType::F32, DType::F32) => {
                if let (Some(lv), Some(gv)) = (lc.as_slice::<f32>(), gc.as_slice::<f32>()) {
                    return tensor(cholesky_grad_batch(lv, gv, m, k), [m, k, k]);
                }
            }
            (DType::F64, DType::F64) => {
                if let (Some(lv), Some(gv)) = (lc.as_slice::<f64>(), gc.as_slice::<f64>()) {
                    return tensor(cholesky_grad_batch(lv, gv, m, k), [m, k, k]);
                }
            }
            _ => {}
        }
        generic::cholesky_grad::<Flex>(l, grad)
    }
}

/// The arithmetic the loops need, for `f32` and `f64`.
trait Real:
    Copy
    + Element
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + SubAssign
    + DivAssign
{
    const ZERO: Self;
    const ONE: Self;
    fn sqrt(self) -> Self;
}

impl Real for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    fn sqrt(self) -> Self {
        f32::sqrt(self)
    }
}

impl Real for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    fn sqrt(self) -> Self {
        f64::sqrt(self)
    }
}

fn tensor<T: Element>(values: Vec<T>, shape: [usize; 3]) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(values, shape))
}

/// `sum_i x[i] y[i]` with eight partial sums in fixed-size arrays, which the compiler keeps in
/// one vector register (no bounds checks, no reassociation needed).
fn dot<T: Real>(x: &[T], y: &[T]) -> T {
    let len = x.len().min(y.len());
    let (x, y) = (&x[..len], &y[..len]);
    let mut acc = [T::ZERO; 8];
    let (xc, yc) = (x.chunks_exact(8), y.chunks_exact(8));
    let mut rest = T::ZERO;
    for (a, b) in xc.remainder().iter().zip(yc.remainder()) {
        rest = rest + *a * *b;
    }
    for (a, b) in xc.zip(yc) {
        let (a, b): (&[T; 8], &[T; 8]) = (a.try_into().expect("chunk of 8"), b.try_into().expect("chunk of 8"));
        for ((s, &x), &y) in acc.iter_mut().zip(a).zip(b) {
            *s = *s + x * y;
        }
    }
    acc.iter().fold(rest, |s, &v| s + v)
}

/// `y[i] -= c x[i]`.
fn axpy<T: Real>(y: &mut [T], c: T, x: &[T]) {
    y.iter_mut().zip(x).for_each(|(yi, &xi)| *yi -= c * xi);
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

/// The factorisation's reverse pass for each matrix, in place on a copy of the gradient's lower
/// triangle: Murray (2016), "Differentiation of the Cholesky decomposition", the unblocked
/// reverse-mode algorithm (`chol_unblocked_rev`), which walks the columns backwards in `K^3 / 3`
/// multiply-adds (the composed `Phi(L^T L_bar)` and two solves take about `7 K^3 / 6`), every
/// update along a contiguous row. It leaves `dA` for `A`'s lower triangle alone; off the
/// diagonal that is split evenly over `(i, j)` and `(j, i)` for a symmetric `A`.
fn cholesky_grad_batch<T: Real>(l: &[T], grad: &[T], m: usize, k: usize) -> Vec<T> {
    let two = T::ONE + T::ONE;
    let mut out = vec![T::ZERO; m * k * k];
    let mut g = vec![T::ZERO; k * k];
    for ((o, l), grad) in out.chunks_exact_mut(k * k).zip(l.chunks_exact(k * k)).zip(grad.chunks_exact(k * k)) {
        // L's upper triangle is structural zeros: their gradient is dropped.
        for i in 0..k {
            g[i * k..i * k + i + 1].copy_from_slice(&grad[i * k..i * k + i + 1]);
        }
        for j in (0..k).rev() {
            let ljj = l[j * k + j];
            // L_ij = (A_ij - L[i, :j] . L[j, :j]) / L_jj for i > j.
            let mut gjj = g[j * k + j];
            for i in j + 1..k {
                let c = g[i * k + j] / ljj;
                g[i * k + j] = c;
                gjj -= c * l[i * k + j];
            }
            for i in j + 1..k {
                let c = g[i * k + j];
                let (head, tail) = g.split_at_mut(i * k);
                axpy(&mut tail[..j], c, &l[j * k..j * k + j]);
                axpy(&mut head[j * k..j * k + j], c, &l[i * k..i * k + j]);
            }
            // L_jj = sqrt(A_jj - |L[j, :j]|^2).
            let pivot_bar = gjj / (two * ljj);
            g[j * k + j] = pivot_bar;
            axpy(&mut g[j * k..j * k + j], two * pivot_bar, &l[j * k..j * k + j]);
        }
        for i in 0..k {
            o[i * k + i] = g[i * k + i];
            for j in 0..i {
                let half = g[i * k + j] / two;
                o[i * k + j] = half;
                o[j * k + i] = half;
            }
        }
    }
    out
}

/// Forward or back substitution for each `k x k` matrix and `k x cols` right-hand side: with
/// one column, dot products over rows of `T` or updates along them (whichever walks `t`'s
/// stored rows contiguously); with several, a row of the solution at a time
/// (`x[i, :] -= T[i, r] x[r, :]` over contiguous rows of `x`).
fn solve_batch<T: Real>(t: &[T], b: &[T], m: usize, k: usize, cols: usize, spec: SolveSpec) -> Vec<T> {
    let mut out = b[..m * k * cols].to_vec();
    for (x, t) in out.chunks_exact_mut(k * cols).zip(t.chunks_exact(k * k)) {
        if cols == 1 {
            solve_vector(t, x, k, spec);
        } else {
            solve_matrix(t, x, k, cols, spec);
        }
    }
    out
}

fn solve_vector<T: Real>(t: &[T], x: &mut [T], k: usize, spec: SolveSpec) {
    match (spec.lower, spec.transpose) {
        // L x = b: x_i = (b_i - L[i, :i] . x[:i]) / L_ii.
        (true, false) => {
            for i in 0..k {
                let s = dot(&t[i * k..i * k + i], &x[..i]);
                x[i] = (x[i] - s) / t[i * k + i];
            }
        }
        // U x = b: x_i = (b_i - U[i, i+1:] . x[i+1:]) / U_ii.
        (false, false) => {
            for i in (0..k).rev() {
                let s = dot(&t[i * k + i + 1..(i + 1) * k], &x[i + 1..]);
                x[i] = (x[i] - s) / t[i * k + i];
            }
        }
        // L^T x = b: once x_r is known, x[:r] -= x_r L[r, :r].
        (true, true) => {
            for r in (0..k).rev() {
                x[r] /= t[r * k + r];
                let (head, tail) = x.split_at_mut(r);
                axpy(head, tail[0], &t[r * k..r * k + r]);
            }
        }
        // U^T x = b: once x_r is known, x[r+1:] -= x_r U[r, r+1:].
        (false, true) => {
            for r in 0..k {
                x[r] /= t[r * k + r];
                let (head, tail) = x.split_at_mut(r + 1);
                axpy(tail, head[r], &t[r * k + r + 1..(r + 1) * k]);
            }
        }
    }
}

fn solve_matrix<T: Real>(t: &[T], x: &mut [T], k: usize, cols: usize, spec: SolveSpec) {
    let coeff = |i: usize, r: usize| if spec.transpose { t[r * k + i] } else { t[i * k + r] };
    for step in 0..k {
        let i = if spec.effective_lower() { step } else { k - 1 - step };
        let known = if spec.effective_lower() { 0..i } else { i + 1..k };
        for r in known {
            // Rows r and i are distinct: split the buffer between them.
            let (row_i, row_r) = if r < i {
                let (head, tail) = x.split_at_mut(i * cols);
                (&mut tail[..cols], &head[r * cols..(r + 1) * cols])
            } else {
                let (head, tail) = x.split_at_mut(r * cols);
                (&mut head[i * cols..(i + 1) * cols], &tail[..cols])
            };
            axpy(row_i, coeff(i, r), row_r);
        }
        let d = t[i * k + i];
        x[i * cols..(i + 1) * cols].iter_mut().for_each(|xi| *xi /= d);
    }
}
