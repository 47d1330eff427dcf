//! Native flex kernels of the particle-batched dense layer: `gemm` on flex's contiguous buffers,
//! the bias and the activation applied around the products, and a backward of one product per
//! parameter block with the activation's derivative and the bias sums in one pass. Other dtypes
//! than `f32`/`f64` fall back to the primitive-op bodies.
//!
//! Rows shared by all particles make one product for every particle at once; one input per
//! particle makes one product per particle on strided views of the shared buffers (or a dot
//! product per row for a one-output layer). What the autodiff graph sees is one node.

use std::ops::{Add, AddAssign, Mul, Sub};

use burn::backend::flex::FlexTensor;
use burn::backend::{Flex, TensorMetadata};
use burn::tensor::{DType, Element, TensorData};

use super::Activation;
use super::ops::{DenseSpec, ParticleDenseOps, generic};
use super::residuals::{JointSpec, StackResidualKernels, StackResidualOps, StackSpec, generic_stack};
use crate::fastmath::{Simd, Vectorised};
use crate::strided_gemm::{GemmScalar, Operand, gemm, gemm_new};

impl ParticleDenseOps for Flex {
    fn particle_dense(input: FlexTensor, particles: FlexTensor, spec: DenseSpec) -> FlexTensor {
        native2(&input, &particles, |x, p| forward::<f32>(x, p, spec), |x, p| forward::<f64>(x, p, spec))
            .unwrap_or_else(|| generic::forward::<Flex>(input, particles, spec))
    }

    fn particle_dense_pre_grad(output: FlexTensor, grad: FlexTensor, activation: Activation) -> FlexTensor {
        if activation == Activation::Identity {
            return grad;
        }
        // The incoming gradient is usually this node's alone: scale it in place.
        let mut grad = grad;
        let output = output.to_contiguous();
        let len = grad.shape().num_elements();
        if grad.is_contiguous() && grad.layout().start_offset() == 0 && output.shape() == grad.shape() {
            match (output.dtype(), grad.dtype()) {
                (DType::F32, DType::F32) => {
                    if let (Some(a), Some(g)) = (output.as_slice::<f32>(), grad.try_storage_mut::<f32>()) {
                        Simd::detect().vectorise(PreGrad { output: a, grad: &mut g[..len], activation });
                        return grad;
                    }
                }
                (DType::F64, DType::F64) => {
                    if let (Some(a), Some(g)) = (output.as_slice::<f64>(), grad.try_storage_mut::<f64>()) {
                        Simd::detect().vectorise(PreGrad { output: a, grad: &mut g[..len], activation });
                        return grad;
                    }
                }
                _ => {}
            }
        }
        native2(&output, &grad, |a, g| pre_grad::<f32>(a, g, activation), |a, g| pre_grad::<f64>(a, g, activation))
            .unwrap_or_else(|| generic::pre_grad::<Flex>(output, grad, activation))
    }

    fn particle_dense_params_grad(
        input: FlexTensor,
        output: FlexTensor,
        grad: FlexTensor,
        particles: FlexTensor,
        spec: DenseSpec,
    ) -> FlexTensor {
        let dim = particles.shape()[1];
        let output = output.to_contiguous();
        // The gradient becomes the pre-activation gradient in place (copied first if shared).
        let mut grad = owned_contiguous(grad);
        let len = grad.shape().num_elements();
        let fused = match (input.dtype(), output.dtype(), grad.dtype()) {
            (DType::F32, DType::F32, DType::F32) => {
                let (input, x_dims) = (input.to_contiguous(), input.shape().to_vec());
                let g_dims = grad.shape().to_vec();
                match (input.as_slice::<f32>(), output.as_slice::<f32>(), grad.try_storage_mut::<f32>()) {
                    (Some(x), Some(a), Some(g)) => {
                        Some(params_grad(View { values: x, dims: x_dims }, a, &mut g[..len], &g_dims, dim, spec))
                    }
                    _ => None,
                }
            }
            (DType::F64, DType::F64, DType::F64) => {
                let (input, x_dims) = (input.to_contiguous(), input.shape().to_vec());
                let g_dims = grad.shape().to_vec();
                match (input.as_slice::<f64>(), output.as_slice::<f64>(), grad.try_storage_mut::<f64>()) {
                    (Some(x), Some(a), Some(g)) => {
                        Some(params_grad(View { values: x, dims: x_dims }, a, &mut g[..len], &g_dims, dim, spec))
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        fused.unwrap_or_else(|| {
            let pre_grad = generic::pre_grad::<Flex>(output, grad, spec.activation);
            generic::params_grad::<Flex>(input, pre_grad, particles, spec)
        })
    }

    fn particle_dense_input_grad(
        pre_grad: FlexTensor,
        particles: FlexTensor,
        spec: DenseSpec,
        shared: bool,
    ) -> FlexTensor {
        native2(
            &pre_grad,
            &particles,
            |g, p| input_grad::<f32>(g, p, spec, shared),
            |g, p| input_grad::<f64>(g, p, spec, shared),
        )
        .unwrap_or_else(|| generic::input_grad::<Flex>(pre_grad, particles, spec, shared))
    }
}

/// A contiguous view of a tensor's values with its dimensions.
#[derive(Clone)]
struct View<'a, T> {
    values: &'a [T],
    dims: Vec<usize>,
}

/// Runs `f32` or `f64` kernel code on contiguous copies-if-needed of two tensors of one dtype;
/// `None` for any other dtype.
fn native2(
    a: &FlexTensor,
    b: &FlexTensor,
    f32_kernel: impl FnOnce(View<'_, f32>, View<'_, f32>) -> FlexTensor,
    f64_kernel: impl FnOnce(View<'_, f64>, View<'_, f64>) -> FlexTensor,
) -> Option<FlexTensor> {
    let (a, b) = (a.to_contiguous(), b.to_contiguous());
    let view = |t: &FlexTensor| t.shape().to_vec();
    match (a.dtype(), b.dtype()) {
        (DType::F32, DType::F32) => Some(f32_kernel(
            View { values: a.as_slice::<f32>()?, dims: view(&a) },
            View { values: b.as_slice::<f32>()?, dims: view(&b) },
        )),
        (DType::F64, DType::F64) => Some(f64_kernel(
            View { values: a.as_slice::<f64>()?, dims: view(&a) },
            View { values: b.as_slice::<f64>()?, dims: view(&b) },
        )),
        _ => None,
    }
}

/// The float types the native kernels run in.
trait Real:
    GemmScalar
    + Element
    + Copy
    + PartialOrd
    + 'static
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + AddAssign
{
    fn tanh(self) -> Self;
    /// The tensor's values, if it holds this type.
    fn values(t: &FlexTensor) -> Option<&[Self]>;
    /// The tensor's values to write, if it holds this type and owns its buffer alone.
    fn values_mut(t: &mut FlexTensor) -> Option<&mut [Self]>;
}

impl Real for f32 {
    #[inline(always)]
    fn tanh(self) -> Self {
        tanh_f32(self)
    }
    fn values(t: &FlexTensor) -> Option<&[Self]> {
        t.as_slice::<f32>()
    }
    fn values_mut(t: &mut FlexTensor) -> Option<&mut [Self]> {
        if t.dtype() == DType::F32 { t.try_storage_mut::<f32>() } else { None }
    }
}

/// `tanh` for `f32` as a rational function of odd degree 13 over even degree 6 (the minimax
/// approximation Eigen uses for its vectorised float tanh), saturating beyond |x| = 7.9. Unlike
/// the libm call it has no branches, only selects, so the compiler vectorises the loops that
/// call it: a tanh layer's forward pass is dominated by the activation otherwise. Within 4 units
/// in the last place of `f32` (3.4 at worst, near saturation; checked against `f64::tanh` in the
/// tests); NaN stays NaN.
#[inline(always)]
fn tanh_f32(x: f32) -> f32 {
    const CLAMP: f32 = 7.905_311;
    const TINY: f32 = 0.0004;
    const ALPHA: [f32; 7] =
        [4.893_524_6e-3, 6.372_619_3e-4, 1.485_722_4e-5, 5.122_297e-8, -8.604_672e-11, 2.000_188e-13, -2.760_768_5e-16];
    const BETA: [f32; 4] = [4.893_525e-3, 2.268_434_6e-3, 1.185_347_1e-4, 1.198_258_4e-6];
    // NaN passes through `clamp`.
    let c = x.clamp(-CLAMP, CLAMP);
    let x2 = c * c;
    let p = ALPHA.iter().rev().fold(0.0, |acc, a| acc * x2 + a) * c;
    let q = BETA.iter().rev().fold(0.0, |acc, b| acc * x2 + b);
    // Below 4e-4, tanh(x) = x to f32 precision, and the ratio would lose the sign of -0.
    if x.abs() < TINY { x } else { p / q }
}

impl Real for f64 {
    #[inline(always)]
    fn tanh(self) -> Self {
        f64::tanh(self)
    }
    fn values(t: &FlexTensor) -> Option<&[Self]> {
        t.as_slice::<f64>()
    }
    fn values_mut(t: &mut FlexTensor) -> Option<&mut [Self]> {
        if t.dtype() == DType::F64 { t.try_storage_mut::<f64>() } else { None }
    }
}

fn tensor<T: Real>(values: Vec<T>, shape: &[usize]) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(values, shape.to_vec()))
}

/// `act(x W_i^T + b_i)`. Rows shared by all particles make one product `[B, k] x [k, n o]`
/// with every particle's weights packed side by side (a copy of `n o k` values, cheaper than
/// `n` small products), written into a fresh buffer; the bias is added in the activation's
/// pass. One input per particle makes `n` products accumulated onto the broadcast bias. The
/// elementwise passes run as wide as the CPU allows ([`Simd`]), with the baseline's numbers.
fn forward<T: Real>(input: View<'_, T>, particles: View<'_, T>, spec: DenseSpec) -> FlexTensor {
    let ([b, m, k], [n, dim]) = (dims3(&input.dims), dims2(&particles.dims));
    let o = spec.outputs;
    let p = particles.values;
    // Every particle's bias side by side, one `[n o]` row.
    let bias: Vec<T> = (0..n).flat_map(|i| p[i * dim + spec.bias_offset()..][..o].iter().copied()).collect();
    let x = |i: usize| Operand {
        values: input.values,
        start: if m == 1 { 0 } else { i * k },
        row_stride: m * k,
        col_stride: 1,
    };
    let simd = Simd::detect();
    let mut out = if m == 1 {
        let weights = packed_weights(p, n, dim, spec);
        // W^T [k, n o]: element (j, q) is the packed W[q, j].
        let w = Operand { values: &weights, start: 0, row_stride: 1, col_stride: k };
        gemm_new(b, k, n * o, x(0), w, T::ONE)
    } else {
        let mut out = Vec::with_capacity(b * n * o);
        for _ in 0..b {
            out.extend_from_slice(&bias);
        }
        if o == 1 {
            // One output per particle (a regression or binary head): a dot product per row and
            // particle, cheaper than n matrix-vector products through gemm.
            simd.vectorise(HeadDots {
                input: input.values,
                particles: p,
                n,
                dim,
                offset: spec.offset,
                k,
                out: &mut out,
            });
        } else {
            for i in 0..n {
                // W_i^T [k, o]: element (j, u) is W_i[u, j].
                let w = Operand { values: p, start: i * dim + spec.offset, row_stride: 1, col_stride: k };
                gemm(b, k, o, x(i), w, T::ONE, &mut out, (i * o, n * o, 1), true);
            }
        }
        out
    };
    let bias = if m == 1 { Some(&bias[..]) } else { None };
    simd.vectorise(Activate { out: &mut out, bias, activation: spec.activation });
    tensor(out, &[b, n, o])
}

/// `v <- act(v + bias[j])` over the rows of `out` (`[B, n o]`, `bias` `[n o]`), or `v <- act(v)`
/// without a bias.
struct Activate<'a, T> {
    out: &'a mut [T],
    bias: Option<&'a [T]>,
    activation: Activation,
}

impl<T: Real> Vectorised for Activate<'_, T> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        let (out, bias) = (self.out, self.bias);
        match self.activation {
            Activation::Identity if bias.is_none() => {}
            Activation::Identity => add_and_map(out, bias, |v| v),
            // A select, not a branch: the signs are random and a branch mispredicts half the
            // time. NaN stays NaN (it is not below zero), as in burn's relu.
            Activation::Relu => add_and_map(out, bias, |v| if v < T::ZERO { T::ZERO } else { v }),
            Activation::Tanh => add_and_map(out, bias, |v| v.tanh()),
        }
    }
}

#[inline(always)]
fn add_and_map<T: Real>(out: &mut [T], bias: Option<&[T]>, f: impl Fn(T) -> T) {
    match bias {
        Some(bias) if !bias.is_empty() => {
            for row in out.chunks_exact_mut(bias.len()) {
                row.iter_mut().zip(bias).for_each(|(v, &c)| *v = f(*v + c));
            }
        }
        _ => out.iter_mut().for_each(|v| *v = f(*v)),
    }
}

/// Every particle's weights `[o, k]` stacked into one `[n o, k]` matrix.
fn packed_weights<T: Real>(p: &[T], n: usize, dim: usize, spec: DenseSpec) -> Vec<T> {
    let len = spec.weight_len();
    let mut packed = Vec::with_capacity(n * len);
    for i in 0..n {
        let start = i * dim + spec.offset;
        packed.extend_from_slice(&p[start..start + len]);
    }
    packed
}

/// `grad * act'(z)`, read off the output `a = act(z)`.
fn pre_grad<T: Real>(output: View<'_, T>, grad: View<'_, T>, activation: Activation) -> FlexTensor {
    let mut out = grad.values.to_vec();
    Simd::detect().vectorise(PreGrad { output: output.values, grad: &mut out, activation });
    tensor(out, &grad.dims)
}

/// `g <- g * act'(z)` from `a = act(z)`, branch-free.
#[inline(always)]
fn pre_grad_in_place<T: Real>(output: &[T], grad: &mut [T], activation: Activation) {
    let pairs = grad.iter_mut().zip(output);
    match activation {
        Activation::Identity => {}
        Activation::Relu => pairs.for_each(|(g, &a)| *g = if a <= T::ZERO { T::ZERO } else { *g }),
        Activation::Tanh => pairs.for_each(|(g, &a)| *g = *g * (T::ONE - a * a)),
    }
}

/// Particles' gradient `[n, dim]` from the gradient `grad` `[B, n, o]` with respect to the
/// output `a`: one pass turns `grad` into `G = grad * act'(a)` in place and sums its rows into the
/// bias gradient; then `dW_i = G_i^T X_i` (`[o, B] x [B, k]`), zero outside the layer's columns.
fn params_grad<T: Real>(
    input: View<'_, T>,
    output: &[T],
    grad: &mut [T],
    g_dims: &[usize],
    dim: usize,
    spec: DenseSpec,
) -> FlexTensor {
    let n = g_dims[1];
    let mut out = vec![T::ZERO; n * dim];
    pre_grad_and_bias_into(output, grad, n, dim, spec, &mut out);
    weights_grad_into(input, grad, g_dims, dim, spec, &mut out);
    tensor(out, &[n, dim])
}

/// `grad` `[B, n, o]` becomes `G = grad * act'(a)` in place, and its sums over the rows are
/// written into the bias columns of `out` `[n, dim]`, in one pass.
fn pre_grad_and_bias_into<T: Real>(output: &[T], grad: &mut [T], n: usize, dim: usize, spec: DenseSpec, out: &mut [T]) {
    let o = spec.outputs;
    let mut bias = vec![T::ZERO; n * o];
    Simd::detect().vectorise(PreGradAndBias { output, grad, activation: spec.activation, bias: &mut bias });
    for (i, unit) in bias.chunks_exact(o).enumerate() {
        out[i * dim + spec.bias_offset()..][..o].copy_from_slice(unit);
    }
}

/// `dW_i = G_i^T X_i` (`[o, B] x [B, k]`) for the pre-activation gradient `g` `[B, n, o]`,
/// written into the layer's weight columns of `out` `[n, dim]` (added onto them for a
/// one-output layer, which must start from zero there). Shared rows make one product `G^T X`
/// (`[n o, B] x [B, k]`) whose rows are copied into place.
fn weights_grad_into<T: Real>(
    input: View<'_, T>,
    g: &[T],
    g_dims: &[usize],
    dim: usize,
    spec: DenseSpec,
    out: &mut [T],
) {
    let ([b, m, k], [_, n, o]) = (dims3(&input.dims), dims3(g_dims));
    let len = spec.weight_len();
    if m == 1 {
        // (G^T X)^T = X^T G, `[k, B] x [B, n o]`: the long side `n o` is the product's columns,
        // which the microkernels run along in full vectors (G^T X, `[n o, B] x [B, k]`, leaves
        // `k` columns, as few as the data's features: measured 1.7 times slower at k = 13).
        // Its columns are then scattered into each particle's `[o, k]` block.
        let xt = Operand { values: input.values, start: 0, row_stride: 1, col_stride: k };
        let gv = Operand { values: g, start: 0, row_stride: n * o, col_stride: 1 };
        let dwt = gemm_new(k, b, n * o, xt, gv, T::ONE);
        for (i, block) in out.chunks_exact_mut(dim).enumerate() {
            let block = &mut block[spec.offset..][..len];
            for (u, row) in block.chunks_exact_mut(k).enumerate() {
                row.iter_mut().zip(dwt[i * o + u..].iter().step_by(n * o)).for_each(|(d, &v)| *d = v);
            }
        }
    } else if o == 1 {
        // dW_i = sum_r g[r, i] h[r, i, :]: an axpy per row and particle.
        for (rows, gr) in input.values.chunks_exact(n * k).zip(g.chunks_exact(n)) {
            for (i, (h, &gi)) in rows.chunks_exact(k).zip(gr).enumerate() {
                let dw = &mut out[i * dim + spec.offset..][..k];
                dw.iter_mut().zip(h).for_each(|(d, &v)| *d += gi * v);
            }
        }
    } else {
        for i in 0..n {
            // G_i^T [o, B]: element (u, r) is G[r, i, u].
            let gt = Operand { values: g, start: i * o, row_stride: 1, col_stride: n * o };
            let x = Operand { values: input.values, start: i * k, row_stride: m * k, col_stride: 1 };
            gemm(o, b, k, gt, x, T::ONE, out, (i * dim + spec.offset, k, 1), false);
        }
    }
}

/// `t` itself when it is contiguous from offset 0 and its buffer is not shared, else a copy.
fn owned_contiguous(t: FlexTensor) -> FlexTensor {
    if t.is_contiguous() && t.layout().start_offset() == 0 && t.is_unique() {
        t
    } else {
        FlexTensor::from_data(t.into_data())
    }
}

/// Input gradient: `G_i W_i` (`[B, o] x [o, k]`) per particle, or summed over particles into
/// one `[B, 1, k]` when the input is shared.
fn input_grad<T: Real>(pre_grad: View<'_, T>, particles: View<'_, T>, spec: DenseSpec, shared: bool) -> FlexTensor {
    let ([b, n, o], [_, dim]) = (dims3(&pre_grad.dims), dims2(&particles.dims));
    let k = spec.inputs;
    let m = if shared { 1 } else { n };
    if o == 1 && !shared {
        // dX[r, i, :] = g[r, i] W_i: one scaled copy of the weights per row and particle.
        let mut out = Vec::with_capacity(b * n * k);
        for gr in pre_grad.values.chunks_exact(n) {
            for (i, &gi) in gr.iter().enumerate() {
                out.extend(particles.values[i * dim + spec.offset..][..k].iter().map(|&w| gi * w));
            }
        }
        return tensor(out, &[b, n, k]);
    }
    let mut out = vec![T::ZERO; b * m * k];
    for i in 0..n {
        let g = Operand { values: pre_grad.values, start: i * o, row_stride: n * o, col_stride: 1 };
        let w = Operand { values: particles.values, start: i * dim + spec.offset, row_stride: k, col_stride: 1 };
        let dst = if shared { (0, k, 1) } else { (i * k, n * k, 1) };
        gemm(b, o, k, g, w, T::ONE, &mut out, dst, shared && i > 0);
    }
    tensor(out, &[b, m, k])
}

impl StackResidualOps for Flex {
    fn stack_residuals(x: FlexTensor, y: FlexTensor, particles: FlexTensor, stack: StackSpec) -> FlexTensor {
        <Flex as StackResidualKernels>::stack_residuals_forward(x, y, particles, &stack).0
    }

    fn stack_log_joint(
        x: FlexTensor,
        y: FlexTensor,
        particles: FlexTensor,
        stack: StackSpec,
        joint: JointSpec,
    ) -> FlexTensor {
        <Flex as StackResidualKernels>::stack_joint_forward(x, y, particles, &stack, &joint).0
    }
}

impl StackResidualKernels for Flex {
    fn stack_residuals_forward(
        x: FlexTensor,
        y: FlexTensor,
        particles: FlexTensor,
        stack: &StackSpec,
    ) -> (FlexTensor, Vec<FlexTensor>) {
        let (xc, yc, pc) = (x.to_contiguous(), y.to_contiguous(), particles.to_contiguous());
        let native = match (xc.dtype(), yc.dtype(), pc.dtype()) {
            (DType::F32, DType::F32, DType::F32) => stack_forward::<f32>(&xc, &yc, &pc, stack),
            (DType::F64, DType::F64, DType::F64) => stack_forward::<f64>(&xc, &yc, &pc, stack),
            _ => None,
        };
        native.unwrap_or_else(|| generic_stack::forward::<Flex>(x, y, particles, stack))
    }

    fn stack_residuals_grad(
        x: FlexTensor,
        y: FlexTensor,
        particles: FlexTensor,
        outputs: Vec<FlexTensor>,
        grad: FlexTensor,
        stack: &StackSpec,
    ) -> FlexTensor {
        let (xc, yc, pc, gc) = (x.to_contiguous(), y.to_contiguous(), particles.to_contiguous(), grad.to_contiguous());
        let same =
            |d: DType| [&xc, &yc, &pc, &gc].iter().all(|t| t.dtype() == d) && outputs.iter().all(|t| t.dtype() == d);
        let [n, dim] = pc.shape().dims::<2>();
        if same(DType::F32) {
            let g = f32::values(&gc).expect("checked f32");
            tensor(stack_grad::<f32>(&xc, &yc, &pc, outputs, g, stack), &[n, dim])
        } else if same(DType::F64) {
            let g = f64::values(&gc).expect("checked f64");
            tensor(stack_grad::<f64>(&xc, &yc, &pc, outputs, g, stack), &[n, dim])
        } else {
            generic_stack::grad::<Flex>(x, y, particles, outputs, grad, stack)
        }
    }

    fn stack_joint_forward(
        x: FlexTensor,
        y: FlexTensor,
        particles: FlexTensor,
        stack: &StackSpec,
        joint: &JointSpec,
    ) -> (FlexTensor, FlexTensor, Vec<FlexTensor>) {
        let pc = particles.to_contiguous();
        if pc.dtype() != DType::F32 {
            return generic_stack::joint_forward::<Flex>(x, y, particles, stack, joint);
        }
        let (sums, outputs) = <Flex as StackResidualKernels>::stack_residuals_forward(x, y, pc.clone(), stack);
        match joint_terms(&pc, &sums.to_contiguous(), joint) {
            Some((terms, stats)) => (terms, stats, outputs),
            None => {
                let stats = generic_stack::joint_stats::<Flex>(sums, pc.clone(), joint);
                let terms = crate::fused::generic::precision_terms::<Flex>(pc, stats.clone(), &joint.terms);
                (terms, stats, outputs)
            }
        }
    }

    fn stack_joint_grad(
        x: FlexTensor,
        y: FlexTensor,
        particles: FlexTensor,
        outputs: Vec<FlexTensor>,
        stats: FlexTensor,
        grad: FlexTensor,
        stack: &StackSpec,
        joint: &JointSpec,
    ) -> FlexTensor {
        let contiguous = [&x, &y, &particles, &stats, &grad].map(|t| t.to_contiguous());
        let all_f32 =
            contiguous.iter().all(|t| t.dtype() == DType::F32) && outputs.iter().all(|t| t.dtype() == DType::F32);
        if !all_f32 {
            return generic_stack::joint_grad::<Flex>(x, y, particles, outputs, stats, grad, stack, joint);
        }
        let [xc, yc, pc, sc, gc] = contiguous;
        joint_grad(&xc, &yc, &pc, outputs, &sc, &gc, stack, joint)
    }
}

/// The statistics `[n, k]` (the residual sums, then the sums of squares of `joint.squares`) and
/// the terms `[n, 1]` of `joint` from the `f32` particles and residual sums, the terms in `f64`
/// as `fused::log_precision_terms` computes them on flex; `None` if a tensor is not `f32`.
fn joint_terms(particles: &FlexTensor, sums: &FlexTensor, joint: &JointSpec) -> Option<(FlexTensor, FlexTensor)> {
    let ([n, dim], k) = (particles.shape().dims::<2>(), joint.k());
    if particles.dtype() != DType::F32 || sums.dtype() != DType::F32 {
        return None;
    }
    let (p, r) = (f32::values(particles)?, f32::values(sums)?);
    let mut stats = Vec::with_capacity(n * k);
    let mut terms = Vec::with_capacity(n);
    for (row, &ssr) in p.chunks_exact(dim).zip(r) {
        stats.push(ssr);
        if let Some((start, len)) = joint.squares {
            stats.push(crate::fused::sum_squares(&row[start..start + len]));
        }
        let s = &stats[stats.len() - k..];
        let u = &row[joint.terms.start..][..k];
        terms.push((0..k).map(|j| joint.terms.term(j, f64::from(u[j]), f64::from(s[j]))).sum::<f64>() as f32);
    }
    Some((tensor(terms, &[n, 1]), tensor(stats, &[n, k])))
}

/// The particles' gradient `[n, dim]` of the joint's terms weighted by `grad` `[n, 1]`, in one
/// buffer: the network's part from [`stack_grad`] with the residual sum's weight `-e^u c2 g`,
/// then `2 (-e^u c2 g) x` added into the squared columns and `(c1 - e^u (c2 s + rate)) g` into
/// the precision columns (each factor rounded to `f32` as the separate fused nodes round it, so
/// the sum is theirs).
#[allow(clippy::too_many_arguments)]
fn joint_grad(
    x: &FlexTensor,
    y: &FlexTensor,
    particles: &FlexTensor,
    outputs: Vec<FlexTensor>,
    stats: &FlexTensor,
    grad: &FlexTensor,
    stack: &StackSpec,
    joint: &JointSpec,
) -> FlexTensor {
    const OWN: &str = "the caller checked every tensor is f32";
    let ([n, dim], k, terms) = (particles.shape().dims::<2>(), joint.k(), &joint.terms);
    let (p, s, g) = (f32::values(particles).expect(OWN), f32::values(stats).expect(OWN), f32::values(grad).expect(OWN));
    let u = |i: usize, j: usize| f64::from(p[i * dim + terms.start + j]);
    let weight: Vec<f32> = (0..n).map(|i| (terms.ds(0, u(i, 0)) * f64::from(g[i])) as f32).collect();
    let mut out = stack_grad::<f32>(x, y, particles, outputs, &weight, stack);
    for (i, (o, row)) in out.chunks_exact_mut(dim).zip(p.chunks_exact(dim)).enumerate() {
        let gi = f64::from(g[i]);
        if let Some((start, len)) = joint.squares {
            let scale = 2.0 * (terms.ds(1, u(i, 1)) * gi) as f32;
            o[start..start + len].iter_mut().zip(&row[start..start + len]).for_each(|(o, &v)| *o += scale * v);
        }
        for j in 0..k {
            o[terms.start + j] += (terms.du(j, u(i, j), f64::from(s[i * k + j])) * gi) as f32;
        }
    }
    tensor(out, &[n, dim])
}

/// Every layer's output `[B, n, o_l]` by the native layer kernel, and the residual sums `[n, 1]`
/// of the last (one output) against `y` `[B, 1]`. `None` if a tensor is not of type `T`.
fn stack_forward<T: Real>(
    x: &FlexTensor,
    y: &FlexTensor,
    particles: &FlexTensor,
    stack: &StackSpec,
) -> Option<(FlexTensor, Vec<FlexTensor>)> {
    let ([b, k], [n, _]) = (x.shape().dims::<2>(), particles.shape().dims::<2>());
    let (xv, yv) = (T::values(x)?, T::values(y)?);
    let p = View { values: T::values(particles)?, dims: particles.shape().to_vec() };
    let mut outputs: Vec<FlexTensor> = Vec::with_capacity(stack.layers.len());
    for &spec in &stack.layers {
        let output = match outputs.last() {
            None => forward::<T>(View { values: xv, dims: vec![b, 1, k] }, p.clone(), spec),
            Some(below) => {
                forward::<T>(View { values: T::values(below)?, dims: below.shape().to_vec() }, p.clone(), spec)
            }
        };
        outputs.push(output);
    }
    let f = T::values(outputs.last()?)?;
    let mut sums = vec![T::ZERO; n];
    for (row, &t) in f.chunks_exact(n).zip(yv) {
        sums.iter_mut().zip(row).for_each(|(s, &v)| *s += (t - v) * (t - v));
    }
    Some((tensor(sums, &[n, 1]), outputs))
}

/// The particles' gradient `[n, dim]` of the residual sums weighted by `gv` `[n]`, from the
/// layer outputs of [`stack_forward`], every layer written into one buffer. Walking down from the
/// output, each layer's gradient with respect to its output becomes its pre-activation gradient
/// (bias sums in the same pass), then its weights' gradient and the gradient it passes down. A
/// one-output layer and the layer below it share one pass over the lower layer's output (its
/// weights' gradient `g a`, the gradient passed down `g W act'(a)` written over `a`, and the lower
/// layer's bias sums), which the backward pass owns: nothing else reads it.
fn stack_grad<T: Real>(
    x: &FlexTensor,
    y: &FlexTensor,
    particles: &FlexTensor,
    outputs: Vec<FlexTensor>,
    gv: &[T],
    stack: &StackSpec,
) -> Vec<T> {
    const OWN: &str = "the backward pass's buffers hold the type checked by the caller";
    let ([b, k], [n, dim]) = (x.shape().dims::<2>(), particles.shape().dims::<2>());
    let (xv, yv, pv) = (T::values(x), T::values(y), T::values(particles));
    let (xv, yv, pv) = (xv.expect(OWN), yv.expect(OWN), pv.expect(OWN));
    let p = View { values: pv, dims: vec![n, dim] };
    let layers = &stack.layers;
    let last = layers.len() - 1;
    let mut outputs: Vec<Option<FlexTensor>> = outputs.into_iter().map(|t| Some(t.to_contiguous())).collect();
    let mut out = vec![T::ZERO; n * dim];
    // d/df of sum_r (y_r - f_ri)^2 g_i is -2 (y_r - f_ri) g_i.
    let minus_two = T::ZERO - (T::ONE + T::ONE);
    let f = T::values(outputs[last].as_ref().expect(OWN)).expect(OWN);
    let mut upstream_values = Vec::with_capacity(b * n);
    for (row, &t) in f.chunks_exact(n).zip(yv) {
        upstream_values.extend(row.iter().zip(gv).map(|(&v, &g)| minus_two * (t - v) * g));
    }
    let mut upstream = tensor(upstream_values, &[b, n, 1]);
    // Whether `upstream` is already the pre-activation gradient with the bias sums taken.
    let mut pre_done = false;
    let mut l = last;
    loop {
        let spec = layers[l];
        let g_dims = upstream.shape().to_vec();
        if !pre_done {
            let a = outputs[l].take().expect(OWN);
            let g = T::values_mut(&mut upstream).expect(OWN);
            pre_grad_and_bias_into(T::values(&a).expect(OWN), g, n, dim, spec, &mut out);
        }
        if l == 0 {
            let input = View { values: xv, dims: vec![b, 1, k] };
            weights_grad_into(input, T::values(&upstream).expect(OWN), &g_dims, dim, spec, &mut out);
            break;
        }
        let below = layers[l - 1];
        if spec.outputs == 1 {
            let mut lower = owned_contiguous(outputs[l - 1].take().expect(OWN));
            let a = T::values_mut(&mut lower).expect(OWN);
            let g = T::values(&upstream).expect(OWN);
            one_output_backward(&mut a[..b * n * spec.inputs], g, pv, n, dim, spec, below, &mut out);
            upstream = lower;
            pre_done = true;
        } else {
            let input_tensor = outputs[l - 1].as_ref().expect(OWN);
            let input = View { values: T::values(input_tensor).expect(OWN), dims: input_tensor.shape().to_vec() };
            let g = T::values(&upstream).expect(OWN);
            weights_grad_into(input, g, &g_dims, dim, spec, &mut out);
            upstream = input_grad::<T>(View { values: g, dims: g_dims }, p.clone(), spec, false);
            pre_done = false;
        }
        l -= 1;
    }
    out
}

/// The backward pass through a one-output layer `spec` (pre-activation gradient `g` `[B, n]`)
/// into the layer `below` it, whose output `a` `[B, n, h]` it reads and overwrites: `dW_i +=
/// g[r, i] a[r, i, :]` into `out`, then `a[r, i, :] <- g[r, i] W_i * act'(a[r, i, :])` (the lower
/// layer's pre-activation gradient) and its sums over the rows into the lower layer's bias
/// columns of `out`.
#[allow(clippy::too_many_arguments)]
fn one_output_backward<T: Real>(
    a: &mut [T],
    g: &[T],
    p: &[T],
    n: usize,
    dim: usize,
    spec: DenseSpec,
    below: DenseSpec,
    out: &mut [T],
) {
    Simd::detect().vectorise(OneOutputBackward { a, g, p, n, dim, spec, below, out })
}

/// [`one_output_backward`] with the lower layer's `act'` applied by `slope(a, g w)`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn one_output_pass<T: Real>(
    a: &mut [T],
    g: &[T],
    p: &[T],
    n: usize,
    dim: usize,
    spec: DenseSpec,
    below: DenseSpec,
    out: &mut [T],
    slope: impl Fn(T, T) -> T,
) {
    let (h, width) = (spec.inputs, n * spec.inputs);
    if width == 0 {
        return;
    }
    // Each row of `a` is one loop of `n h` entries, with every particle's weights side by side
    // and the row's `g[r, i]` spread over particle `i`'s units: one long loop a row where a
    // loop a particle ran `h` entries (50 in the Boston BNN: three 16-lane vectors and a scalar
    // remainder, twenty times a row).
    let w: Vec<T> = (0..n).flat_map(|i| p[i * dim + spec.offset..][..h].iter().copied()).collect();
    let (mut dw, mut bias, mut spread) = (vec![T::ZERO; width], vec![T::ZERO; width], vec![T::ZERO; width]);
    for (a_row, g_row) in a.chunks_exact_mut(width).zip(g.chunks_exact(n)) {
        for (units, &gi) in spread.chunks_exact_mut(h).zip(g_row) {
            units.fill(gi);
        }
        let entries = a_row.iter_mut().zip(&spread).zip(&w).zip(dw.iter_mut()).zip(bias.iter_mut());
        for ((((av, &gi), &wv), d), s) in entries {
            *d += gi * *av;
            let lower = slope(*av, gi * wv);
            *av = lower;
            *s += lower;
        }
    }
    for (i, (grads, sums)) in dw.chunks_exact(h).zip(bias.chunks_exact(h)).enumerate() {
        out[i * dim + spec.offset..][..h].iter_mut().zip(grads).for_each(|(o, &v)| *o += v);
        out[i * dim + below.bias_offset()..][..h].copy_from_slice(sums);
    }
}

/// `out[r, i] += h[r, i, :] . w_i` for a one-output layer whose input `h` `[B, n, k]` is one
/// per particle, `w_i` the particle's weights at `offset` in its row of `particles`.
struct HeadDots<'a, T> {
    input: &'a [T],
    particles: &'a [T],
    n: usize,
    dim: usize,
    offset: usize,
    k: usize,
    out: &'a mut [T],
}

impl<T: Real> Vectorised for HeadDots<'_, T> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        let (n, k) = (self.n, self.k);
        if n * k == 0 {
            return;
        }
        for (rows, acc) in self.input.chunks_exact(n * k).zip(self.out.chunks_exact_mut(n)) {
            for (i, (h, a)) in rows.chunks_exact(k).zip(acc.iter_mut()).enumerate() {
                *a += dot(h, &self.particles[i * self.dim + self.offset..][..k]);
            }
        }
    }
}

/// [`pre_grad_in_place`] as a [`Vectorised`] kernel.
struct PreGrad<'a, T> {
    output: &'a [T],
    grad: &'a mut [T],
    activation: Activation,
}

impl<T: Real> Vectorised for PreGrad<'_, T> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        pre_grad_in_place(self.output, self.grad, self.activation);
    }
}

/// `grad` `[B, n o]` becomes the pre-activation gradient, row by row, and each row is added
/// into `bias` `[n o]`.
struct PreGradAndBias<'a, T> {
    output: &'a [T],
    grad: &'a mut [T],
    activation: Activation,
    bias: &'a mut [T],
}

impl<T: Real> Vectorised for PreGradAndBias<'_, T> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        let width = self.bias.len();
        if width == 0 {
            return;
        }
        for (g_row, a_row) in self.grad.chunks_exact_mut(width).zip(self.output.chunks_exact(width)) {
            pre_grad_in_place(a_row, g_row, self.activation);
            self.bias.iter_mut().zip(g_row.iter()).for_each(|(acc, &v)| *acc += v);
        }
    }
}

/// [`one_output_backward`]'s pass, for each activation of the layer below.
struct OneOutputBackward<'a, T> {
    a: &'a mut [T],
    g: &'a [T],
    p: &'a [T],
    n: usize,
    dim: usize,
    spec: DenseSpec,
    below: DenseSpec,
    out: &'a mut [T],
}

impl<T: Real> Vectorised for OneOutputBackward<'_, T> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        let Self { a, g, p, n, dim, spec, below, out } = self;
        match below.activation {
            Activation::Identity => one_output_pass(a, g, p, n, dim, spec, below, out, |_, gw| gw),
            // A select, not a branch (random signs); the derivative read off the output, as in
            // `pre_grad_in_place`.
            Activation::Relu => {
                one_output_pass(a, g, p, n, dim, spec, below, out, |av, gw| if av <= T::ZERO { T::ZERO } else { gw })
            }
            Activation::Tanh => one_output_pass(a, g, p, n, dim, spec, below, out, |av, gw| gw * (T::ONE - av * av)),
        }
    }
}

/// `sum_j a[j] b[j]` with eight partial sums, so that the compiler can keep them in one vector
/// register (a single running sum is a chain of dependent additions it may not reorder).
#[inline(always)]
fn dot<T: Real>(a: &[T], b: &[T]) -> T {
    let mut acc = [T::ZERO; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (a8.remainder(), b8.remainder());
    for (x, y) in a8.zip(b8) {
        acc.iter_mut().zip(x).zip(y).for_each(|((s, &xv), &yv)| *s += xv * yv);
    }
    let mut total = ra.iter().zip(rb).fold(T::ZERO, |s, (&x, &y)| s + x * y);
    for v in acc {
        total += v;
    }
    total
}

fn dims2(dims: &[usize]) -> [usize; 2] {
    [dims[0], dims[1]]
}

fn dims3(dims: &[usize]) -> [usize; 3] {
    [dims[0], dims[1], dims[2]]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values in [-3, 3) from a fixed integer hash (no RNG crate in the unit tests).
    fn values(len: usize, salt: usize) -> Vec<f32> {
        (0..len).map(|i| ((i * 2_654_435_761 + salt * 40_503) % 6_000) as f32 / 1_000.0 - 3.0).collect()
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Every kernel gives the baseline's numbers to the bit at every vector width the CPU has
    /// (the widths change the lanes, never the operations), and the baseline's numbers are the
    /// scalar formulas': a kernel that fused a multiply-add at one width, or a loop that
    /// skipped a remainder, would fail here. Lengths (50 units, 20 particles, 13 inputs) leave
    /// remainders at 4, 8 and 16 lanes.
    #[test]
    fn every_vector_width_gives_the_baseline_numbers() {
        let levels = Simd::detect().with_narrower();
        let (rows, n, h, k) = (7, 20, 50, 13);
        let dim = k * h + h + h + 1;
        let spec = DenseSpec { offset: k * h + h, inputs: h, outputs: 1, activation: Activation::Identity };
        let p = values(n * dim, 1);
        let bias = values(n * h, 2);
        for activation in [Activation::Identity, Activation::Relu, Activation::Tanh] {
            let act = |v: f32| match activation {
                Activation::Identity => v,
                Activation::Relu => {
                    if v < 0.0 {
                        0.0
                    } else {
                        v
                    }
                }
                Activation::Tanh => tanh_f32(v),
            };
            // The activation with the bias, and without.
            let start = values(rows * n * h, 3);
            for with_bias in [true, false] {
                let want: Vec<f32> = start
                    .iter()
                    .enumerate()
                    .map(|(j, &v)| act(if with_bias { v + bias[j % (n * h)] } else { v }))
                    .collect();
                for &simd in &levels {
                    let mut out = start.clone();
                    simd.vectorise(Activate { out: &mut out, bias: with_bias.then_some(&bias[..]), activation });
                    assert_eq!(bits(&out), bits(&want), "{simd:?} {activation:?} bias {with_bias}");
                }
            }
            // The pre-activation gradient and its bias sums.
            let (a, g) = (values(rows * n * h, 4).iter().map(|v| act(*v)).collect::<Vec<_>>(), values(rows * n * h, 5));
            let slope = |a: f32, g: f32| match activation {
                Activation::Identity => g,
                Activation::Relu => {
                    if a <= 0.0 {
                        0.0
                    } else {
                        g
                    }
                }
                Activation::Tanh => g * (1.0 - a * a),
            };
            let want_g: Vec<f32> = a.iter().zip(&g).map(|(&a, &g)| slope(a, g)).collect();
            let mut want_sums = vec![0.0f32; n * h];
            for row in want_g.chunks_exact(n * h) {
                want_sums.iter_mut().zip(row).for_each(|(s, v)| *s += v);
            }
            // The one-output layer's backward pass into the layer below.
            let head_g = values(rows * n, 6);
            let below = DenseSpec { offset: 0, inputs: k, outputs: h, activation };
            let mut want_dw = vec![0.0f32; n * dim];
            let mut want_lower = a.clone();
            let mut want_bias = vec![0.0f32; n * h];
            for r in 0..rows {
                for i in 0..n {
                    let gi = head_g[r * n + i];
                    for u in 0..h {
                        let av = a[(r * n + i) * h + u];
                        want_dw[i * dim + spec.offset + u] += gi * av;
                        let lower = slope(av, gi * p[i * dim + spec.offset + u]);
                        want_lower[(r * n + i) * h + u] = lower;
                        want_bias[i * h + u] += lower;
                    }
                }
            }
            for i in 0..n {
                want_dw[i * dim + below.bias_offset()..][..h].copy_from_slice(&want_bias[i * h..][..h]);
            }
            for &simd in &levels {
                let mut pre = g.clone();
                simd.vectorise(PreGrad { output: &a, grad: &mut pre, activation });
                assert_eq!(bits(&pre), bits(&want_g), "{simd:?} {activation:?} pre-activation gradient");
                let (mut pre, mut sums) = (g.clone(), vec![0.0f32; n * h]);
                simd.vectorise(PreGradAndBias { output: &a, grad: &mut pre, activation, bias: &mut sums });
                assert_eq!(bits(&pre), bits(&want_g), "{simd:?} {activation:?}");
                assert_eq!(bits(&sums), bits(&want_sums), "{simd:?} {activation:?} bias sums");
                let (mut lower, mut dw) = (a.clone(), vec![0.0f32; n * dim]);
                let pass = OneOutputBackward { a: &mut lower, g: &head_g, p: &p, n, dim, spec, below, out: &mut dw };
                simd.vectorise(pass);
                assert_eq!(bits(&lower), bits(&want_lower), "{simd:?} {activation:?} gradient passed down");
                assert_eq!(bits(&dw), bits(&want_dw), "{simd:?} {activation:?} parameters' gradient");
            }
        }
        // The one-output head's dot products (eight partial sums, as `dot` adds them).
        let hidden = values(rows * n * h, 7);
        let want: Vec<f32> =
            (0..rows * n).map(|j| 0.5 + dot(&hidden[j * h..][..h], &p[(j % n) * dim + spec.offset..][..h])).collect();
        for &simd in &levels {
            let mut out = vec![0.5f32; rows * n];
            simd.vectorise(HeadDots {
                input: &hidden,
                particles: &p,
                n,
                dim,
                offset: spec.offset,
                k: h,
                out: &mut out,
            });
            assert_eq!(bits(&out), bits(&want), "{simd:?} head");
        }
    }

    /// The vectorisable tanh is within 4 units in the last place of `f32` of the exact value on a
    /// dense grid over the whole range where it is not saturated, and exact at the edges.
    #[test]
    fn fast_tanh_matches_the_exact_value() {
        let (mut worst, mut at) = (0.0f64, 0.0f32);
        for i in -200_000..=200_000 {
            let x = i as f32 * 5e-5;
            let exact = f64::from(x).tanh();
            let ulp = f64::from(f32::EPSILON) * exact.abs().max(f64::from(f32::MIN_POSITIVE));
            let err = (f64::from(tanh_f32(x)) - exact).abs() / ulp;
            if err > worst {
                (worst, at) = (err, x);
            }
        }
        assert!(worst <= 4.0, "worst error {worst} ulp at {at}");
        for (x, want) in [(20.0f32, 1.0f32), (-20.0, -1.0), (f32::INFINITY, 1.0), (f32::NEG_INFINITY, -1.0)] {
            assert!((tanh_f32(x) - want).abs() <= f32::EPSILON, "tanh({x}) = {}", tanh_f32(x));
        }
        assert!(tanh_f32(f32::NAN).is_nan());
        assert!(tanh_f32(-0.0).is_sign_negative());
    }
}
