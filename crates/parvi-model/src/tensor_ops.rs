//! Small batched tensor helpers shared by models, kernels and metrics.

use burn::tensor::{Tensor, TensorData};

/// Squared Euclidean distances between the rows of `x` `[n, d]` and `y` `[m, d]`: `[n, m]`.
///
/// Computed as `|x|^2 + |y|^2 - 2 x y^T` (one matrix product), clamped at 0 against rounding.
pub fn pairwise_sq_dists(x: Tensor<2>, y: Tensor<2>) -> Tensor<2> {
    let xx = x.clone().square().sum_dim(1); // [n, 1]
    let yy = y.clone().square().sum_dim(1).transpose(); // [1, m]
    sq_dists_from_products(x.matmul(y.transpose()), xx, yy)
}

/// [`pairwise_sq_dists`] of `x` with itself, `[n, n]`, with no pass over `x` beyond the
/// product: the squared norms are the diagonal of `x x^T`, so the diagonal distances are
/// exactly zero and the norms round as the products do (the two `square().sum` passes over
/// `[n, d]` cost a few percent of a large network's SVGD step).
pub fn self_sq_dists(x: Tensor<2>) -> Tensor<2> {
    let xy = x.clone().matmul(x.transpose()); // [n, n]
    let norms = diagonal_column(xy.clone()); // [n, 1]
    sq_dists_from_products(xy, norms.clone(), norms.transpose())
}

/// `|x_i|^2 + |y_j|^2 - 2 x_i . y_j`, clamped at 0 against rounding, from the products `xy`
/// `[n, m]`, the row norms `x_norms` `[n, 1]` and the column norms `y_norms` `[1, m]`.
pub fn sq_dists_from_products(xy: Tensor<2>, x_norms: Tensor<2>, y_norms: Tensor<2>) -> Tensor<2> {
    (x_norms + y_norms - xy.mul_scalar(2.0)).clamp_min(0.0)
}

/// The diagonal of the square matrix `m` `[n, n]`, as a column `[n, 1]`
/// ([`diagonal`] of a batch of one).
pub fn diagonal_column(m: Tensor<2>) -> Tensor<2> {
    let n = m.dims()[0];
    diagonal(m.unsqueeze::<3>()).reshape([n, 1])
}

/// The diagonals of a batch of square matrices `[m, K, K]`: `[m, K]`.
pub fn diagonal(a: Tensor<3>) -> Tensor<2> {
    let [m, k, _] = a.dims();
    let eye = Tensor::<2>::eye(k, &a.device()).cast(a.dtype()).unsqueeze::<3>();
    (a * eye).sum_dim(2).reshape([m, k])
}

/// Numerically stable `log sum exp` along `dim`, keeping the dimension.
pub fn log_sum_exp<const D: usize>(x: Tensor<D>, dim: usize) -> Tensor<D> {
    let max = x.clone().max_dim(dim).detach();
    (x - max.clone()).exp().sum_dim(dim).log() + max
}

/// Numerically stable `log softmax` along `dim`: `x - log_sum_exp(x)`, with the (detached)
/// maximum subtracted inside [`log_sum_exp`], so no `exp` overflows and the largest entry's
/// log-probability is exact to rounding.
pub fn log_softmax<const D: usize>(x: Tensor<D>, dim: usize) -> Tensor<D> {
    x.clone() - log_sum_exp(x, dim)
}

/// Numerically stable `log mean exp` along `dim`, keeping the dimension.
pub fn log_mean_exp<const D: usize>(x: Tensor<D>, dim: usize) -> Tensor<D> {
    let n = x.dims()[dim] as f64;
    log_sum_exp(x, dim).sub_scalar(n.ln())
}

/// The median of all entries, computed on the device (no host read), with NumPy's convention
/// for an even count (the mean of the two middle values).
pub fn median_all<const D: usize>(x: Tensor<D>) -> Tensor<1> {
    let count = x.shape().num_elements();
    let sorted = x.reshape([count]).sort(0);
    if count % 2 == 1 { sorted.narrow(0, count / 2, 1) } else { sorted.narrow(0, count / 2 - 1, 2).mean() }
}

/// `[n, k_1 + ... + k_m]` from `[n, k_i]` blocks: `Tensor::cat(blocks, 1)`, Stan's
/// `append_col` or an array literal `{ a, b }` of per-row values, built as one copy per block.
/// (burn-flex's `cat` along any dimension but the first copies one row of one block at a time,
/// which dominates for the `[n, 1]` columns of an ODE's right-hand side on a few thousand rows.)
/// The blocks are stacked along the first dimension transposed and the result transposed back,
/// a strided view that later operations read in place.
pub fn cat_columns(blocks: Vec<Tensor<2>>) -> Tensor<2> {
    if blocks.len() == 1 {
        return blocks.into_iter().next().expect("one block");
    }
    Tensor::cat(blocks.into_iter().map(Tensor::transpose).collect(), 0).transpose()
}

/// A `[rows, cols]` tensor from row-major `f32` values.
pub fn matrix_from_vec(values: Vec<f32>, rows: usize, cols: usize, device: &burn::tensor::Device) -> Tensor<2> {
    Tensor::from_data(TensorData::new(values, [rows, cols]), device)
}

/// A tensor's values as `f32` on the host (a synchronising read: keep it off hot paths).
pub fn to_vec_f32<const D: usize>(x: &Tensor<D>) -> Vec<f32> {
    x.to_data().convert::<f32>().try_into_vec::<f32>().expect("f32 tensor data")
}

/// A tensor's values widened to `f64` on the host (a synchronising read), for host-side
/// linear algebra and statistics.
pub fn to_vec_f64<const D: usize>(x: &Tensor<D>) -> Vec<f64> {
    to_vec_f32(x).into_iter().map(f64::from).collect()
}

/// Whether `device` computes on this machine's CPU (flex or ndarray, with or without autodiff),
/// where a tensor's values are a host read away: host passes over small tensors pay there.
pub fn is_cpu(device: &burn::tensor::Device) -> bool {
    let inner = device.clone().inner();
    #[allow(deprecated)]
    let cpu = inner == burn::tensor::Device::flex() || inner == burn::tensor::Device::ndarray();
    cpu
}

/// Whether every entry is finite (a host read of one value).
///
/// On a CPU device the sum comes first: IEEE addition carries any infinity or NaN into it, so
/// a finite sum proves every entry finite in one reduction, where `is_finite().all()` fills a
/// boolean tensor and reduces that (about half of the check's cost on the Boston BNN's
/// `[20, 753]`). Only a non-finite sum (a non-finite entry, or finite entries whose sum
/// overflows) takes the elementwise test. GPU shaders may assume no infinities or NaNs in
/// arithmetic, so there the elementwise test stays the only one.
pub fn all_finite<const D: usize>(x: &Tensor<D>) -> bool {
    if is_cpu(&x.device()) && x.clone().sum().into_scalar::<f32>().is_finite() {
        return true;
    }
    x.clone().is_finite().all().into_scalar::<bool>()
}

/// Whether `device` computes in `f64` correctly, not only whether it accepts the dtype.
///
/// Some adapters store `f64` but evaluate transcendental functions at `f32` precision
/// (Vulkan's `GLSL.std.450` `Exp`/`Log` are defined for 16- and 32-bit floats only; Mesa's
/// llvmpipe returns garbage for 64-bit). Models that need `f64` for their accuracy probe the
/// operations they use here once, at construction, and fall back (saying so) where it fails.
pub fn f64_arithmetic(device: &burn::tensor::Device) -> bool {
    use burn::tensor::{DType, FloatDType};
    if !device.supports_dtype(FloatDType::F64) {
        return false;
    }
    // Values whose f32 results differ from the f64 ones in the 8th digit or earlier.
    let x = [-0.123_456_789_012_345_f64, -1.987_654_321_098_765, -7.5, 2.345_678_901_234_567];
    let t = Tensor::<1>::from_data(TensorData::new(x.to_vec(), [x.len()]), (device, DType::F64));
    let results = [
        (t.clone().exp(), x.map(f64::exp)),
        (t.clone().abs().sqrt(), x.map(|v| v.abs().sqrt())),
        (t.clone().abs().log(), x.map(|v| v.abs().ln())),
        (t.clone().recip(), x.map(f64::recip)),
        (t.clone() * t, x.map(|v| v * v)),
    ];
    results.into_iter().all(|(got, want)| {
        let got = got.into_data().convert::<f64>().try_into_vec::<f64>().unwrap_or_default();
        got.len() == want.len() && got.iter().zip(&want).all(|(g, w)| (g - w).abs() <= 1e-12 * w.abs().max(1.0))
    })
}

/// The median of `values` by selection (`O(len)` expected, no sort), with NumPy's convention for
/// an even count (the mean of the two middle values); `values` is reordered. `None` when empty.
/// NaNs order last (`f32::total_cmp`).
pub fn median_by_selection(values: &mut [f32]) -> Option<f32> {
    let len = values.len();
    if len == 0 {
        return None;
    }
    let (lower, upper, _) = values.select_nth_unstable_by(len / 2, f32::total_cmp);
    let upper = *upper;
    if len % 2 == 1 {
        return Some(upper);
    }
    // `lower` holds the `len / 2` smallest values: its maximum is the other middle value.
    let lower = lower.iter().copied().max_by(f32::total_cmp).unwrap_or(upper);
    Some(((f64::from(lower) + f64::from(upper)) / 2.0) as f32)
}

/// The median of all entries of `x` by selection on the host (one synchronising read of `x`;
/// `O(len)` expected where a device sort is `O(len log len)`), NumPy's convention for an even
/// count. `None` for an empty tensor.
pub fn median_on_host<const D: usize>(x: &Tensor<D>) -> Option<f32> {
    median_by_selection(&mut to_vec_f32(x))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CPU backend computes `f64` exactly as the host does; the probe must say so (a probe
    /// that always answered `false` would silently send every model to its fallback).
    #[test]
    fn flex_has_f64_arithmetic() {
        let device = crate::BackendKind::Flex.device().unwrap();
        assert!(f64_arithmetic(&device));
    }

    /// The distances of a set with itself from the product's diagonal: the `f64` host values
    /// to `f32` rounding of their scale, the diagonal exactly zero, symmetric.
    #[test]
    fn self_distances_match_the_host_and_vanish_on_the_diagonal() {
        let device = crate::BackendKind::Flex.device().unwrap();
        let (n, d) = (9, 57);
        let v: Vec<f32> = (0..n * d)
            .map(|i| ((i * 7919 % 1013) as f32 / 101.0 - 5.0) * if i % 3 == 0 { 10.0 } else { 1.0 })
            .collect();
        let sq = to_vec_f32(&self_sq_dists(matrix_from_vec(v.clone(), n, d, &device)));
        let reference: Vec<f64> = (0..n * n)
            .map(|k| (0..d).map(|q| (f64::from(v[k / n * d + q]) - f64::from(v[k % n * d + q])).powi(2)).sum())
            .collect();
        let scale = reference.iter().cloned().fold(0.0, f64::max);
        for (k, (&got, &want)) in sq.iter().zip(&reference).enumerate() {
            assert!((f64::from(got) - want).abs() < 1e-5 * scale, "entry {k}: {got} against {want}");
            assert_eq!(got, sq[(k % n) * n + k / n], "entry {k} is not symmetric");
        }
        assert!((0..n).all(|i| sq[i * n + i] == 0.0), "a point's distance to itself is not zero");
    }

    /// The sum's shortcut answers as the elementwise test does: finite entries whose sum
    /// overflows are still all finite, one infinity or NaN anywhere is not, on flex and ndarray,
    /// in `f32` and `f64`.
    #[test]
    fn all_finite_agrees_with_the_elementwise_test() {
        #[allow(deprecated)]
        let devices = [crate::BackendKind::Flex.device().unwrap(), burn::tensor::Device::ndarray()];
        for device in &devices {
            for dtype in [burn::tensor::DType::F32, burn::tensor::DType::F64] {
                let at = |v: Vec<f32>| matrix_from_vec(v, 2, 2, device).cast(dtype);
                let big = f32::MAX;
                let cases = [
                    (vec![1.0, -2.0, 3.0, 0.5], true),
                    (vec![big, big, big, 1.0], true),
                    (vec![-big, -big, 0.0, 1.0], true),
                    (vec![1.0, f32::INFINITY, 3.0, 0.5], false),
                    (vec![f32::NEG_INFINITY, 1.0, 3.0, 0.5], false),
                    (vec![f32::INFINITY, f32::NEG_INFINITY, 0.0, 0.0], false),
                    (vec![1.0, 2.0, f32::NAN, 0.5], false),
                ];
                for (values, finite) in cases {
                    let x = at(values.clone());
                    assert_eq!(all_finite(&x), finite, "{device:?} {dtype:?} {values:?}");
                }
            }
        }
    }

    /// Selection agrees with a full sort for odd and even counts, ties and the empty slice.
    #[test]
    fn median_by_selection_matches_sorting() {
        let mut state = 12345u64;
        for len in [1usize, 2, 3, 4, 7, 10, 101, 1000] {
            let values: Vec<f32> = (0..len)
                .map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    ((state >> 40) % 17) as f32 * 0.25
                })
                .collect();
            let mut sorted = values.clone();
            sorted.sort_by(f32::total_cmp);
            let want = if len % 2 == 1 {
                sorted[len / 2]
            } else {
                ((f64::from(sorted[len / 2 - 1]) + f64::from(sorted[len / 2])) / 2.0) as f32
            };
            assert_eq!(median_by_selection(&mut values.clone()), Some(want), "len {len}");
        }
        assert_eq!(median_by_selection(&mut []), None);
    }
}
