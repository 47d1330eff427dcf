//! Fused pieces of hierarchical Gaussian log-densities evaluated for all particles at once: a
//! Gaussian prior's sum of squares over a block of a particle, a Gaussian likelihood's sum of
//! squared residuals over the rows of a batch, and the terms of sampled log-precisions with Gamma
//! priors. Each is one burn custom operation with a hand-written backward pass (native on flex,
//! burn's primitive operations elsewhere), so autodiff records one node where `narrow`,
//! `square`, `sum_dim`, the elementwise arithmetic and the reshapes around them record between
//! four and a dozen, each allocating its own gradient (a `narrow` a zero-filled `[n, dim]` one).

// burn 0.22 deprecates ndarray; parvi still offers it as a backend, so the sums must serve it.
#![allow(deprecated)]

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Dispatch, Flex, TensorMetadata, backend_extension};
use burn::tensor::{DType, Shape, Slice, Tensor, TensorData};

/// `sum_{j = start}^{start + len - 1} x[i, j]^2` for every row `i` of `x` `[n, d]`: `[n, 1]`.
///
/// # Panics
/// If the columns `start..start + len` are not inside `x`.
pub fn sum_squares_of_columns(x: Tensor<2>, start: usize, len: usize) -> Tensor<2> {
    let [_, d] = x.dims();
    assert!(start + len <= d, "sum of squares over columns {start}..{} of a {d}-column matrix", start + len);
    Tensor::from_dispatch(<Dispatch as FusedSumOps>::sum_squares_of_columns(x.into_dispatch(), start, len))
}

/// `sum_r (y[r, 0] - f[r, i])^2` for every column `i` of `f` `[B, n]`, with `y` `[B, 1]` (one
/// target per row, shared by the columns): `[n, 1]`, the residual sum of squares of `n`
/// predictions.
///
/// # Panics
/// If `y` is not `[B, 1]` for the `B` rows of `f`.
pub fn sum_squared_residuals(y: Tensor<2>, f: Tensor<2>) -> Tensor<2> {
    let ([b, one], [rows, _]) = (y.dims(), f.dims());
    assert!(one == 1 && b == rows, "residuals of targets [{b}, {one}] against predictions with {rows} rows");
    Tensor::from_dispatch(<Dispatch as FusedSumOps>::sum_squared_residuals(y.into_dispatch(), f.into_dispatch()))
}

/// The log-joint terms of sampled log-precisions: `sum_j c1_j u_j - e^{u_j} (c2_j s_j + rate)`
/// for every row, with `u_j = x[:, start + j]` and `s` `[n, k]` the statistics they scale: `[n, 1]`.
///
/// For a precision `tau = e^u` with a `Gamma(a, rate)` prior over a Gaussian block of `N` values
/// whose sum of squares is `s`, seen through a minibatch scale `m` (1 for the whole data), the
/// block's likelihood, the prior and the log-Jacobian of `tau = e^u` add up to
/// `(m N / 2 + a) u - e^u (m s / 2 + rate)` plus a constant: `c1 = m N / 2 + a`, `c2 = m / 2`.
///
/// # Panics
/// If the columns `start..start + k` are not inside `x`, or `stats` is not `[n, k]` for the `k`
/// coefficients given.
pub fn log_precision_terms(
    x: Tensor<2>,
    start: usize,
    stats: Tensor<2>,
    shape_coeffs: &[f64],
    stat_coeffs: &[f64],
    rate: f64,
) -> Tensor<2> {
    let ([n, d], [rows, k]) = (x.dims(), stats.dims());
    assert!(
        k == shape_coeffs.len() && k == stat_coeffs.len() && rows == n && start + k <= d,
        "precision terms over columns {start}..{} of [{n}, {d}] with statistics [{rows}, {k}] and {} / {} coefficients",
        start + k,
        shape_coeffs.len(),
        stat_coeffs.len()
    );
    let terms = PrecisionTerms::new(start, shape_coeffs, stat_coeffs, rate);
    Tensor::from_dispatch(<Dispatch as FusedSumOps>::log_precision_terms(
        x.into_dispatch(),
        stats.into_dispatch(),
        terms,
    ))
}

/// Stan's `normal_lpdf(x | loc, scale)` term by term, `-((x - loc) / scale)^2 / 2 - ln scale -
/// ln(2 pi) / 2`, over the broadcast shape of the three (each dimension equal or 1): one autodiff
/// node where the elementwise form records seven (a likelihood `y ~ normal(mu, sigma)` with
/// `sigma` a parameter or data: most regressions' whole likelihood). Its backward gives each
/// input `-z / scale`, `z / scale` and `(z^2 - 1) / scale` times the output's gradient, summed over
/// the dimensions it was broadcast along.
///
/// # Panics
/// If the shapes do not broadcast.
pub fn normal_log_density<const D: usize>(x: Tensor<D>, loc: Tensor<D>, scale: Tensor<D>) -> Tensor<D> {
    assert_broadcast("normal_lpdf", [x.dims(), loc.dims(), scale.dims()]);
    Tensor::from_dispatch(<Dispatch as FusedDensityOps>::normal_log_density(
        x.into_dispatch(),
        loc.into_dispatch(),
        scale.into_dispatch(),
    ))
}

/// A univariate log density with scalar parameters, term by term: [`scalar_log_density`].
#[derive(Clone, Debug, PartialEq)]
pub enum ScalarDensity {
    /// `Normal(loc, scale)`: `-(x - loc)^2 / (2 scale^2) - ln scale - ln(2 pi) / 2`.
    Normal {
        /// Location.
        loc: f64,
        /// Scale, `> 0`.
        scale: f64,
    },
    /// `Gamma(shape, rate)` at `x > 0`: `(shape - 1) ln x - rate x + log_norm`.
    Gamma {
        /// Shape.
        shape: f64,
        /// Rate.
        rate: f64,
        /// `shape ln rate - ln Gamma(shape)`.
        log_norm: f64,
    },
    /// `InvGamma(shape, scale)` at `x > 0`: `-(shape + 1) ln x - scale / x + log_norm`.
    InvGamma {
        /// Shape.
        shape: f64,
        /// Scale.
        scale: f64,
        /// `shape ln scale - ln Gamma(shape)`.
        log_norm: f64,
    },
    /// `StudentT(df, loc, scale)`: `log_norm - ln scale - (df + 1) / 2 ln(1 + ((x - loc) /
    /// scale)^2 / df)`.
    StudentT {
        /// Degrees of freedom.
        df: f64,
        /// Location.
        loc: f64,
        /// Scale, `> 0`.
        scale: f64,
        /// The standard t's `ln Gamma((df + 1) / 2) - ln Gamma(df / 2) - ln(df pi) / 2`.
        log_norm: f64,
    },
}

/// `density`'s log density at every element of `x`, as one autodiff node (the elementwise form
/// records three to seven: docs/posteriordb.md at 8a480ca, "Fewer autodiff nodes a score"). The positive
/// densities read `x` clamped to the smallest positive `f32`: the caller masks `x <= 0` to
/// `-inf` (whose gradient the mask zeroes).
pub fn scalar_log_density<const D: usize>(x: Tensor<D>, density: ScalarDensity) -> Tensor<D> {
    Tensor::from_dispatch(<Dispatch as FusedDensityOps>::scalar_log_density(x.into_dispatch(), density))
}

/// Stan's `poisson_log_lpmf(k | f)` term by term, `k f - e^f - ln_factorial` (`ln_factorial =
/// ln k!`, data), over the broadcast shape of the three, as one autodiff node (four
/// elementwise).
///
/// # Panics
/// If the shapes do not broadcast.
pub fn poisson_log_terms<const D: usize>(k: Tensor<D>, log_rate: Tensor<D>, ln_factorial: Tensor<D>) -> Tensor<D> {
    assert_broadcast("poisson_log_lpmf", [k.dims(), log_rate.dims(), ln_factorial.dims()]);
    Tensor::from_dispatch(<Dispatch as FusedDensityOps>::poisson_log_terms(
        k.into_dispatch(),
        log_rate.into_dispatch(),
        ln_factorial.into_dispatch(),
    ))
}

/// Panics, naming `what`, unless the three shapes broadcast (each dimension equal or 1).
fn assert_broadcast<const D: usize>(what: &str, shapes: [[usize; D]; 3]) {
    for axis in 0..D {
        let widest = shapes.iter().map(|s| s[axis]).max().unwrap_or(1);
        assert!(
            shapes.iter().all(|s| s[axis] == widest || s[axis] == 1),
            "{what}: shapes {:?}, {:?} and {:?} do not broadcast",
            shapes[0],
            shapes[1],
            shapes[2]
        );
    }
}

/// The columns and coefficients of [`log_precision_terms`].
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PrecisionTerms {
    pub start: usize,
    pub shape: Vec<f64>,
    pub stat: Vec<f64>,
    pub rate: f64,
}

impl PrecisionTerms {
    /// The terms of [`log_precision_terms`] over columns `start..` with the coefficients given.
    pub fn new(start: usize, shape: &[f64], stat: &[f64], rate: f64) -> Self {
        Self { start, shape: shape.to_vec(), stat: stat.to_vec(), rate }
    }

    /// `c1_j u - e^u (c2_j s + rate)`, the term of precision `j` at `u` with statistic `s`.
    pub fn term(&self, j: usize, u: f64, s: f64) -> f64 {
        self.shape[j] * u - u.exp() * (self.stat[j] * s + self.rate)
    }

    /// Its derivative with respect to `u`: `c1_j - e^u (c2_j s + rate)`.
    pub fn du(&self, j: usize, u: f64, s: f64) -> f64 {
        self.shape[j] - u.exp() * (self.stat[j] * s + self.rate)
    }

    /// Its derivative with respect to `s`: `-e^u c2_j`.
    pub fn ds(&self, j: usize, u: f64) -> f64 {
        -u.exp() * self.stat[j]
    }
}

/// The fused pieces and their backward passes, per backend.
#[backend_extension(Autodiff, Flex, NdArray, Cube: cfg(feature = "wgpu"))]
pub(crate) trait FusedSumOps: Backend {
    /// `[n, 1]` sums of squares of columns `start..start + len`.
    fn sum_squares_of_columns(x: FloatTensor<Self>, start: usize, len: usize) -> FloatTensor<Self> {
        generic::sum_squares::<Self>(x, start, len)
    }

    /// Gradient `[n, d]`: `2 x g` in the columns, zero elsewhere, for `grad` `[n, 1]`.
    fn sum_squares_of_columns_grad(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        start: usize,
        len: usize,
    ) -> FloatTensor<Self> {
        generic::sum_squares_grad::<Self>(x, grad, start, len)
    }

    /// `[n, 1]` residual sums of squares.
    fn sum_squared_residuals(y: FloatTensor<Self>, f: FloatTensor<Self>) -> FloatTensor<Self> {
        generic::residuals::<Self>(y, f)
    }

    /// Gradient with respect to the predictions `[B, n]`: `-2 (y - f) g` for `grad` `[n, 1]`
    /// (the targets' gradient is minus its sum over columns).
    fn sum_squared_residuals_grad(
        y: FloatTensor<Self>,
        f: FloatTensor<Self>,
        grad: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        generic::residuals_grad::<Self>(y, f, grad)
    }

    /// `[n, 1]` log-precision terms.
    fn log_precision_terms(x: FloatTensor<Self>, stats: FloatTensor<Self>, terms: PrecisionTerms) -> FloatTensor<Self> {
        generic::precision_terms::<Self>(x, stats, &terms)
    }

    /// Gradient `[n, d]` with respect to `x` (`(c1 - e^u (c2 s + rate)) g` in the precision
    /// columns, zero elsewhere) for `grad` `[n, 1]`.
    fn log_precision_terms_x_grad(
        x: FloatTensor<Self>,
        stats: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        terms: PrecisionTerms,
    ) -> FloatTensor<Self> {
        generic::precision_terms_x_grad::<Self>(x, stats, grad, &terms)
    }

    /// Gradient `[n, k]` with respect to the statistics: `-e^u c2 g`.
    fn log_precision_terms_stats_grad(
        x: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        terms: PrecisionTerms,
    ) -> FloatTensor<Self> {
        generic::precision_terms_stats_grad::<Self>(x, grad, &terms)
    }
}

/// Fused log-density terms, per backend: burn's primitive operations on every backend (they
/// record no autodiff node), one node under autodiff.
#[backend_extension(Autodiff, Flex, NdArray, Cube: cfg(feature = "wgpu"))]
pub(crate) trait FusedDensityOps: Backend {
    /// [`normal_log_density`]'s terms.
    fn normal_log_density(x: FloatTensor<Self>, loc: FloatTensor<Self>, scale: FloatTensor<Self>) -> FloatTensor<Self> {
        generic::normal_log_density::<Self>(x, loc, scale)
    }

    /// [`scalar_log_density`]'s terms.
    fn scalar_log_density(x: FloatTensor<Self>, density: ScalarDensity) -> FloatTensor<Self> {
        generic::scalar_log_density::<Self>(x, &density)
    }

    /// Their derivative in `x`.
    fn scalar_log_density_grad(x: FloatTensor<Self>, density: ScalarDensity) -> FloatTensor<Self> {
        generic::scalar_log_density_grad::<Self>(x, &density)
    }

    /// [`poisson_log_terms`]'s terms.
    fn poisson_log_terms(
        k: FloatTensor<Self>,
        log_rate: FloatTensor<Self>,
        ln_factorial: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        generic::poisson_log_terms::<Self>(k, log_rate, ln_factorial)
    }
}

impl FusedDensityOps for Flex {}

impl FusedDensityOps for burn::backend::NdArray {}

#[cfg(feature = "wgpu")]
impl FusedDensityOps for burn::backend::Cube {}

impl<B: FusedDensityOps, C: CheckpointStrategy> FusedDensityOps for Autodiff<B, C> {
    fn normal_log_density(x: FloatTensor<Self>, loc: FloatTensor<Self>, scale: FloatTensor<Self>) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct NormalBackward;

        impl<B: FusedDensityOps> Backward<B, 3> for NormalBackward {
            type State = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>);

            fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
                let [x_node, loc_node, scale_node] = ops.parents;
                let grad = grads.consume::<B>(&ops.node);
                let (x, loc, scale) = ops.state;
                let (x_shape, loc_shape, scale_shape) = (x.shape(), loc.shape(), scale.shape());
                // z / scale times the output's gradient: d/dloc, and -d/dx.
                let z = B::float_div(B::float_sub(x, loc), scale.clone());
                let z_over_scale = B::float_mul(B::float_div(z.clone(), scale.clone()), grad.clone());
                if let Some(node) = x_node {
                    let dx = B::float_neg(z_over_scale.clone());
                    grads.register::<B>(node.id, generic::sum_to_shape::<B>(dx, &x_shape));
                }
                if let Some(node) = loc_node {
                    grads.register::<B>(node.id, generic::sum_to_shape::<B>(z_over_scale, &loc_shape));
                }
                if let Some(node) = scale_node {
                    let z2_minus_1 = B::float_sub_scalar(B::float_mul(z.clone(), z), 1f32.into());
                    let dscale = B::float_mul(B::float_div(z2_minus_1, scale), grad);
                    grads.register::<B>(node.id, generic::sum_to_shape::<B>(dscale, &scale_shape));
                }
            }
        }

        let (x, x_node) = x.into_parts();
        let (loc, loc_node) = loc.into_parts();
        let (scale, scale_node) = scale.into_parts();
        match NormalBackward.prepare::<C>([x_node, loc_node, scale_node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let out = B::normal_log_density(x.clone(), loc.clone(), scale.clone());
                prep.finish((x, loc, scale), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::normal_log_density(x, loc, scale)),
        }
    }

    fn scalar_log_density(x: FloatTensor<Self>, density: ScalarDensity) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct ScalarBackward;

        impl<B: FusedDensityOps> Backward<B, 1> for ScalarBackward {
            type State = (FloatTensor<B>, ScalarDensity);

            fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
                let [node] = ops.parents;
                let grad = grads.consume::<B>(&ops.node);
                let (x, density) = ops.state;
                if let Some(node) = node {
                    grads.register::<B>(node.id, B::float_mul(B::scalar_log_density_grad(x, density), grad));
                }
            }
        }

        let (x, node) = x.into_parts();
        match ScalarBackward.prepare::<C>([node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let out = B::scalar_log_density(x.clone(), density.clone());
                prep.finish((x, density), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::scalar_log_density(x, density)),
        }
    }

    fn poisson_log_terms(
        k: FloatTensor<Self>,
        log_rate: FloatTensor<Self>,
        ln_factorial: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct PoissonBackward;

        impl<B: FusedDensityOps> Backward<B, 3> for PoissonBackward {
            type State = (FloatTensor<B>, FloatTensor<B>, Shape);

            fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
                let [k_node, f_node, c_node] = ops.parents;
                let grad = grads.consume::<B>(&ops.node);
                let (k, f, c_shape) = ops.state;
                let (k_shape, f_shape) = (k.shape(), f.shape());
                if let Some(node) = k_node {
                    let dk = B::float_mul(f.clone(), grad.clone());
                    grads.register::<B>(node.id, generic::sum_to_shape::<B>(dk, &k_shape));
                }
                if let Some(node) = f_node {
                    let df = B::float_mul(B::float_sub(k, B::float_exp(f)), grad.clone());
                    grads.register::<B>(node.id, generic::sum_to_shape::<B>(df, &f_shape));
                }
                if let Some(node) = c_node {
                    grads.register::<B>(node.id, generic::sum_to_shape::<B>(B::float_neg(grad), &c_shape));
                }
            }
        }

        let (k, k_node) = k.into_parts();
        let (f, f_node) = log_rate.into_parts();
        let (c, c_node) = ln_factorial.into_parts();
        match PoissonBackward.prepare::<C>([k_node, f_node, c_node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let c_shape = c.shape();
                let out = B::poisson_log_terms(k.clone(), f.clone(), c);
                prep.finish((k, f, c_shape), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::poisson_log_terms(k, f, c)),
        }
    }
}

impl FusedSumOps for burn::backend::NdArray {}

#[cfg(feature = "wgpu")]
impl FusedSumOps for burn::backend::Cube {}

impl<B: FusedSumOps, C: CheckpointStrategy> FusedSumOps for Autodiff<B, C> {
    fn sum_squares_of_columns(x: FloatTensor<Self>, start: usize, len: usize) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct SumSquaresBackward;

        impl<B: FusedSumOps> Backward<B, 1> for SumSquaresBackward {
            type State = (FloatTensor<B>, usize, usize);

            fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
                let [node] = ops.parents;
                let grad = grads.consume::<B>(&ops.node);
                let (x, start, len) = ops.state;
                if let Some(node) = node {
                    grads.register::<B>(node.id, B::sum_squares_of_columns_grad(x, grad, start, len));
                }
            }
        }

        let (x, node) = x.into_parts();
        match SumSquaresBackward.prepare::<C>([node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let out = B::sum_squares_of_columns(x.clone(), start, len);
                prep.finish((x, start, len), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::sum_squares_of_columns(x, start, len)),
        }
    }

    fn sum_squared_residuals(y: FloatTensor<Self>, f: FloatTensor<Self>) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct ResidualsBackward;

        impl<B: FusedSumOps> Backward<B, 2> for ResidualsBackward {
            type State = (FloatTensor<B>, FloatTensor<B>);

            fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
                let [y_node, f_node] = ops.parents;
                let grad = grads.consume::<B>(&ops.node);
                let (y, f) = ops.state;
                let df = B::sum_squared_residuals_grad(y, f, grad);
                if let Some(node) = y_node {
                    // d/dy = -d/df summed over the columns that share each target.
                    let dy = B::float_neg(B::float_sum_dim(df.clone(), 1));
                    grads.register::<B>(node.id, dy);
                }
                if let Some(node) = f_node {
                    grads.register::<B>(node.id, df);
                }
            }
        }

        let (y, y_node) = y.into_parts();
        let (f, f_node) = f.into_parts();
        match ResidualsBackward.prepare::<C>([y_node, f_node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let out = B::sum_squared_residuals(y.clone(), f.clone());
                prep.finish((y, f), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::sum_squared_residuals(y, f)),
        }
    }

    fn log_precision_terms(x: FloatTensor<Self>, stats: FloatTensor<Self>, terms: PrecisionTerms) -> FloatTensor<Self> {
        #[derive(Debug)]
        struct PrecisionBackward;

        impl<B: FusedSumOps> Backward<B, 2> for PrecisionBackward {
            type State = (FloatTensor<B>, FloatTensor<B>, PrecisionTerms);

            fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
                let [x_node, stats_node] = ops.parents;
                let grad = grads.consume::<B>(&ops.node);
                let (x, stats, terms) = ops.state;
                if let Some(node) = stats_node {
                    let g = B::log_precision_terms_stats_grad(x.clone(), grad.clone(), terms.clone());
                    grads.register::<B>(node.id, g);
                }
                if let Some(node) = x_node {
                    grads.register::<B>(node.id, B::log_precision_terms_x_grad(x, stats, grad, terms));
                }
            }
        }

        let (x, x_node) = x.into_parts();
        let (stats, stats_node) = stats.into_parts();
        match PrecisionBackward.prepare::<C>([x_node, stats_node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let out = B::log_precision_terms(x.clone(), stats.clone(), terms.clone());
                prep.finish((x, stats, terms), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(B::log_precision_terms(x, stats, terms)),
        }
    }
}

/// Native flex bodies for contiguous `f32` (the dtype models run in); anything else takes the
/// primitive-op bodies.
impl FusedSumOps for Flex {
    fn sum_squares_of_columns(x: FlexTensor, start: usize, len: usize) -> FlexTensor {
        let [n, d] = x.shape().dims::<2>();
        let xc = x.to_contiguous();
        let Some(values) = f32_values(&xc) else {
            return generic::sum_squares::<Flex>(x, start, len);
        };
        let sums: Vec<f32> = values.chunks_exact(d).map(|row| sum_squares(&row[start..start + len])).collect();
        f32_tensor(sums, [n, 1])
    }

    fn sum_squares_of_columns_grad(x: FlexTensor, grad: FlexTensor, start: usize, len: usize) -> FlexTensor {
        let [n, d] = x.shape().dims::<2>();
        let (xc, gc) = (x.to_contiguous(), grad.to_contiguous());
        let (Some(values), Some(g)) = (f32_values(&xc), f32_values(&gc)) else {
            return generic::sum_squares_grad::<Flex>(x, grad, start, len);
        };
        let mut out = vec![0f32; n * d];
        for ((row, x_row), gi) in out.chunks_exact_mut(d).zip(values.chunks_exact(d)).zip(g) {
            let scale = 2.0 * gi;
            row[start..start + len].iter_mut().zip(&x_row[start..start + len]).for_each(|(o, v)| *o = scale * v);
        }
        f32_tensor(out, [n, d])
    }

    fn sum_squared_residuals(y: FlexTensor, f: FlexTensor) -> FlexTensor {
        let [_, n] = f.shape().dims::<2>();
        let (yc, fc) = (y.to_contiguous(), f.to_contiguous());
        let (Some(targets), Some(preds)) = (f32_values(&yc), f32_values(&fc)) else {
            return generic::residuals::<Flex>(y, f);
        };
        let mut sums = vec![0f32; n];
        for (row, &t) in preds.chunks_exact(n).zip(targets) {
            sums.iter_mut().zip(row).for_each(|(s, p)| *s += (t - p) * (t - p));
        }
        f32_tensor(sums, [n, 1])
    }

    fn log_precision_terms(x: FlexTensor, stats: FlexTensor, terms: PrecisionTerms) -> FlexTensor {
        let ([n, d], k) = (x.shape().dims::<2>(), terms.shape.len());
        let (xc, sc) = (x.to_contiguous(), stats.to_contiguous());
        let (Some(xv), Some(sv)) = (f32_values(&xc), f32_values(&sc)) else {
            return generic::precision_terms::<Flex>(x, stats, &terms);
        };
        let out: Vec<f32> = xv
            .chunks_exact(d)
            .zip(sv.chunks_exact(k))
            .map(|(row, s)| {
                let u = &row[terms.start..terms.start + k];
                (0..k)
                    .map(|j| {
                        let uj = f64::from(u[j]);
                        terms.shape[j] * uj - uj.exp() * (terms.stat[j] * f64::from(s[j]) + terms.rate)
                    })
                    .sum::<f64>() as f32
            })
            .collect();
        f32_tensor(out, [n, 1])
    }

    fn log_precision_terms_x_grad(
        x: FlexTensor,
        stats: FlexTensor,
        grad: FlexTensor,
        terms: PrecisionTerms,
    ) -> FlexTensor {
        let ([n, d], k) = (x.shape().dims::<2>(), terms.shape.len());
        let (xc, sc, gc) = (x.to_contiguous(), stats.to_contiguous(), grad.to_contiguous());
        let (Some(xv), Some(sv), Some(g)) = (f32_values(&xc), f32_values(&sc), f32_values(&gc)) else {
            return generic::precision_terms_x_grad::<Flex>(x, stats, grad, &terms);
        };
        let mut out = vec![0f32; n * d];
        for (((o, row), s), &gi) in out.chunks_exact_mut(d).zip(xv.chunks_exact(d)).zip(sv.chunks_exact(k)).zip(g) {
            for j in 0..k {
                let uj = f64::from(row[terms.start + j]);
                let du = terms.shape[j] - uj.exp() * (terms.stat[j] * f64::from(s[j]) + terms.rate);
                o[terms.start + j] = (du * f64::from(gi)) as f32;
            }
        }
        f32_tensor(out, [n, d])
    }

    fn log_precision_terms_stats_grad(x: FlexTensor, grad: FlexTensor, terms: PrecisionTerms) -> FlexTensor {
        let ([n, d], k) = (x.shape().dims::<2>(), terms.shape.len());
        let (xc, gc) = (x.to_contiguous(), grad.to_contiguous());
        let (Some(xv), Some(g)) = (f32_values(&xc), f32_values(&gc)) else {
            return generic::precision_terms_stats_grad::<Flex>(x, grad, &terms);
        };
        let mut out = Vec::with_capacity(n * k);
        for (row, &gi) in xv.chunks_exact(d).zip(g) {
            let u = &row[terms.start..terms.start + k];
            out.extend(u.iter().zip(&terms.stat).map(|(&uj, c2)| (-f64::from(uj).exp() * c2 * f64::from(gi)) as f32));
        }
        f32_tensor(out, [n, k])
    }

    fn sum_squared_residuals_grad(y: FlexTensor, f: FlexTensor, grad: FlexTensor) -> FlexTensor {
        let [b, n] = f.shape().dims::<2>();
        let (yc, fc, gc) = (y.to_contiguous(), f.to_contiguous(), grad.to_contiguous());
        let (Some(targets), Some(preds), Some(g)) = (f32_values(&yc), f32_values(&fc), f32_values(&gc)) else {
            return generic::residuals_grad::<Flex>(y, f, grad);
        };
        let mut out = Vec::with_capacity(b * n);
        for (row, &t) in preds.chunks_exact(n).zip(targets) {
            out.extend(row.iter().zip(g).map(|(p, gi)| -2.0 * (t - p) * gi));
        }
        f32_tensor(out, [b, n])
    }
}

/// `sum_j v[j]^2` with eight partial sums the compiler can keep in one vector register.
pub(crate) fn sum_squares(v: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = v.chunks_exact(8);
    let rest: f32 = chunks.remainder().iter().map(|x| x * x).sum();
    for c in chunks {
        acc.iter_mut().zip(c).for_each(|(s, &x)| *s += x * x);
    }
    acc.iter().sum::<f32>() + rest
}

/// A flex tensor's values when it holds `f32` (contiguous: call `to_contiguous` first).
pub(crate) fn f32_values(t: &FlexTensor) -> Option<&[f32]> {
    if t.dtype() == DType::F32 { t.as_slice::<f32>() } else { None }
}

pub(crate) fn f32_tensor<const D: usize>(values: Vec<f32>, shape: [usize; D]) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(values, shape))
}

/// The sums from burn's primitive operations: every backend without native bodies runs these.
pub(crate) mod generic {
    use super::*;

    /// `-((x - loc) / scale)^2 / 2 - ln scale - ln(2 pi) / 2`, broadcast.
    pub fn normal_log_density<B: Backend>(
        x: FloatTensor<B>,
        loc: FloatTensor<B>,
        scale: FloatTensor<B>,
    ) -> FloatTensor<B> {
        let z = B::float_div(B::float_sub(x, loc), scale.clone());
        let half_z2 = B::float_mul_scalar(B::float_mul(z.clone(), z), (-0.5f32).into());
        let half_ln_2pi = 0.5 * (2.0 * std::f64::consts::PI).ln();
        B::float_sub_scalar(B::float_sub(half_z2, B::float_log(scale)), half_ln_2pi.into())
    }

    /// `k f - e^f - ln_factorial`, broadcast.
    pub fn poisson_log_terms<B: Backend>(
        k: FloatTensor<B>,
        log_rate: FloatTensor<B>,
        ln_factorial: FloatTensor<B>,
    ) -> FloatTensor<B> {
        let rate = B::float_exp(log_rate.clone());
        B::float_sub(B::float_sub(B::float_mul(k, log_rate), rate), ln_factorial)
    }

    /// The smallest positive normal `f32`, where the positive densities clamp `x`.
    const TINY: f64 = f32::MIN_POSITIVE as f64;

    /// [`ScalarDensity`]'s terms at `x`.
    pub fn scalar_log_density<B: Backend>(x: FloatTensor<B>, density: &ScalarDensity) -> FloatTensor<B> {
        match *density {
            ScalarDensity::Normal { loc, scale } => {
                let r = B::float_sub_scalar(x, loc.into());
                let c = -(scale.ln() + 0.5 * (2.0 * std::f64::consts::PI).ln());
                B::float_add_scalar(
                    B::float_mul_scalar(B::float_mul(r.clone(), r), (-0.5 / (scale * scale)).into()),
                    c.into(),
                )
            }
            ScalarDensity::Gamma { shape, rate, log_norm } => {
                let x = B::float_clamp_min(x, TINY.into());
                let linear = B::float_mul_scalar(B::float_log(x.clone()), (shape - 1.0).into());
                B::float_add_scalar(B::float_sub(linear, B::float_mul_scalar(x, rate.into())), log_norm.into())
            }
            ScalarDensity::InvGamma { shape, scale, log_norm } => {
                let x = B::float_clamp_min(x, TINY.into());
                let linear = B::float_mul_scalar(B::float_log(x.clone()), (-(shape + 1.0)).into());
                B::float_add_scalar(
                    B::float_sub(linear, B::float_mul_scalar(B::float_recip(x), scale.into())),
                    log_norm.into(),
                )
            }
            ScalarDensity::StudentT { df, loc, scale, log_norm } => {
                let r = B::float_sub_scalar(x, loc.into());
                let q = B::float_mul_scalar(B::float_mul(r.clone(), r), (1.0 / (df * scale * scale)).into());
                let kernel = B::float_mul_scalar(B::float_log1p(q), (-0.5 * (df + 1.0)).into());
                B::float_add_scalar(kernel, (log_norm - scale.ln()).into())
            }
        }
    }

    /// `d` with an overflow (`1 / x^2` at the clamp) held at the largest finite `f32`: the caller
    /// masks `x <= 0` to `-inf`, whose backward multiplies these entries by 0, which an infinite
    /// derivative would turn into NaN.
    fn finite<B: Backend>(d: FloatTensor<B>) -> FloatTensor<B> {
        B::float_clamp(d, (-f64::from(f32::MAX)).into(), f64::from(f32::MAX).into())
    }

    /// The derivative in `x` of [`scalar_log_density`]'s terms.
    pub fn scalar_log_density_grad<B: Backend>(x: FloatTensor<B>, density: &ScalarDensity) -> FloatTensor<B> {
        match *density {
            ScalarDensity::Normal { loc, scale } => {
                B::float_mul_scalar(B::float_sub_scalar(x, loc.into()), (-1.0 / (scale * scale)).into())
            }
            ScalarDensity::Gamma { shape, rate, .. } => {
                let inv = B::float_recip(B::float_clamp_min(x, TINY.into()));
                finite::<B>(B::float_sub_scalar(B::float_mul_scalar(inv, (shape - 1.0).into()), rate.into()))
            }
            ScalarDensity::InvGamma { shape, scale, .. } => {
                // (scale / x - (shape + 1)) / x
                let inv = B::float_recip(B::float_clamp_min(x, TINY.into()));
                let inner = B::float_sub_scalar(B::float_mul_scalar(inv.clone(), scale.into()), (shape + 1.0).into());
                finite::<B>(B::float_mul(inner, inv))
            }
            ScalarDensity::StudentT { df, loc, scale, .. } => {
                // -(df + 1) r / (df scale^2 + r^2)
                let r = B::float_sub_scalar(x, loc.into());
                let denom = B::float_add_scalar(B::float_mul(r.clone(), r.clone()), (df * scale * scale).into());
                B::float_mul_scalar(B::float_div(r, denom), (-(df + 1.0)).into())
            }
        }
    }

    /// `g` summed over every dimension along which `shape` was broadcast to `g`'s (a gradient
    /// back to a broadcast input).
    pub fn sum_to_shape<B: Backend>(g: FloatTensor<B>, shape: &Shape) -> FloatTensor<B> {
        let out = g.shape();
        let mut g = g;
        for axis in 0..out.num_dims() {
            if shape[axis] == 1 && out[axis] != 1 {
                g = B::float_sum_dim(g, axis);
            }
        }
        g
    }

    pub fn sum_squares<B: Backend>(x: FloatTensor<B>, start: usize, len: usize) -> FloatTensor<B> {
        let [n, _] = x.shape().dims::<2>();
        let block = B::float_slice(x, &[Slice::from(0..n), Slice::from(start..start + len)]);
        B::float_sum_dim(B::float_mul(block.clone(), block), 1)
    }

    pub fn sum_squares_grad<B: Backend>(
        x: FloatTensor<B>,
        grad: FloatTensor<B>,
        start: usize,
        len: usize,
    ) -> FloatTensor<B> {
        let [n, d] = x.shape().dims::<2>();
        let columns = [Slice::from(0..n), Slice::from(start..start + len)];
        let block = B::float_slice(x.clone(), &columns);
        let g = B::float_mul(B::float_mul_scalar(block, 2f32.into()), grad);
        if len == d {
            return g;
        }
        let zeros = B::float_zeros(Shape::new([n, d]), &x.device(), x.dtype().into());
        B::float_slice_assign(zeros, &columns, g)
    }

    pub fn residuals<B: Backend>(y: FloatTensor<B>, f: FloatTensor<B>) -> FloatTensor<B> {
        let r = B::float_sub(y, f);
        let [_, n] = r.shape().dims::<2>();
        B::float_reshape(B::float_sum_dim(B::float_mul(r.clone(), r), 0), Shape::new([n, 1]))
    }

    /// A `[1, k]` row of host coefficients in `like`'s dtype and on its device.
    fn row<B: Backend>(values: &[f64], like: &FloatTensor<B>) -> FloatTensor<B> {
        let data = TensorData::new(values.to_vec(), [1, values.len()]).convert_dtype(like.dtype());
        B::float_from_data(data, &like.device())
    }

    fn precision_columns<B: Backend>(x: FloatTensor<B>, terms: &PrecisionTerms) -> FloatTensor<B> {
        let [n, _] = x.shape().dims::<2>();
        B::float_slice(x, &[Slice::from(0..n), Slice::from(terms.start..terms.start + terms.shape.len())])
    }

    /// `c2 s + rate`, `[n, k]`.
    fn scaled_stats<B: Backend>(stats: FloatTensor<B>, terms: &PrecisionTerms) -> FloatTensor<B> {
        let c2 = row::<B>(&terms.stat, &stats);
        B::float_add_scalar(B::float_mul(stats, c2), terms.rate.into())
    }

    pub fn precision_terms<B: Backend>(
        x: FloatTensor<B>,
        stats: FloatTensor<B>,
        terms: &PrecisionTerms,
    ) -> FloatTensor<B> {
        let u = precision_columns::<B>(x, terms);
        let linear = B::float_mul(u.clone(), row::<B>(&terms.shape, &u));
        let t = B::float_sub(linear, B::float_mul(B::float_exp(u), scaled_stats::<B>(stats, terms)));
        B::float_sum_dim(t, 1)
    }

    pub fn precision_terms_x_grad<B: Backend>(
        x: FloatTensor<B>,
        stats: FloatTensor<B>,
        grad: FloatTensor<B>,
        terms: &PrecisionTerms,
    ) -> FloatTensor<B> {
        let [n, d] = x.shape().dims::<2>();
        let u = precision_columns::<B>(x.clone(), terms);
        let c1 = row::<B>(&terms.shape, &u);
        let du = B::float_sub(c1, B::float_mul(B::float_exp(u), scaled_stats::<B>(stats, terms)));
        let du = B::float_mul(du, grad);
        let k = terms.shape.len();
        if k == d {
            return du;
        }
        let zeros = B::float_zeros(Shape::new([n, d]), &x.device(), x.dtype().into());
        B::float_slice_assign(zeros, &[Slice::from(0..n), Slice::from(terms.start..terms.start + k)], du)
    }

    pub fn precision_terms_stats_grad<B: Backend>(
        x: FloatTensor<B>,
        grad: FloatTensor<B>,
        terms: &PrecisionTerms,
    ) -> FloatTensor<B> {
        let u = precision_columns::<B>(x, terms);
        let c2 = row::<B>(&terms.stat, &u);
        B::float_mul(B::float_neg(B::float_mul(B::float_exp(u), c2)), grad)
    }

    pub fn residuals_grad<B: Backend>(y: FloatTensor<B>, f: FloatTensor<B>, grad: FloatTensor<B>) -> FloatTensor<B> {
        let [_, n] = f.shape().dims::<2>();
        let g = B::float_reshape(grad, Shape::new([1, n]));
        B::float_mul(B::float_mul_scalar(B::float_sub(y, f), (-2f32).into()), g)
    }
}
