//! The fused particle-batched dense layer computes what the same layer built from ordinary tensor
//! operations computes, values and gradients (with respect to the particles and to the input), on
//! flex, ndarray and wgpu; and its gradients agree with central finite differences (in `f64` on
//! the CPU backends, in `f32` on wgpu).

use parvi_model::burn::tensor::{DType, Device, Tensor, TensorData};
use parvi_model::layers::{Activation, DenseLayer, DenseStack, LayerOps};
use parvi_model::{BackendKind, ModelError, ParamLayout, fused, value_and_grad, value_and_grad2};
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};

/// The backends to check: flex and ndarray always; wgpu when it has an adapter (required when
/// `PARVI_REQUIRE_WGPU` is set, as in CI).
fn backends() -> Vec<(BackendKind, Device)> {
    let mut out = vec![
        (BackendKind::Flex, BackendKind::Flex.device().unwrap()),
        (BackendKind::Ndarray, BackendKind::Ndarray.device().unwrap()),
    ];
    match BackendKind::Wgpu.device() {
        Ok(device) => out.push((BackendKind::Wgpu, device)),
        Err(reason) => {
            if std::env::var_os("PARVI_REQUIRE_WGPU").is_some() {
                panic!("PARVI_REQUIRE_WGPU is set but wgpu is unavailable: {reason}");
            }
            eprintln!("SKIPPED wgpu: {reason}");
        }
    }
    out
}

/// A tensor's values as `f64`, read in its own dtype (`tensor_ops::to_vec_f64` reads through
/// `f32`, which would hide the `f64` the finite differences need).
fn to_vec_f64<const D: usize>(t: &Tensor<D>) -> Vec<f64> {
    t.to_data().convert::<f64>().try_to_vec::<f64>().unwrap()
}

/// A seeded standard normal tensor of `shape` in `dtype`.
fn normal<const D: usize>(shape: [usize; D], seed: u64, dtype: DType, device: &Device) -> Tensor<D> {
    let mut rng = chacha20::ChaCha8Rng::seed_from_u64(seed);
    let values: Vec<f64> = (0..shape.iter().product()).map(|_| StandardNormal.sample(&mut rng)).collect();
    Tensor::from_data(TensorData::new(values, shape).convert_dtype(dtype), (device, dtype))
}

/// One layer placement to check.
#[derive(Clone, Copy, Debug)]
struct Case {
    particles: usize,
    rows: usize,
    inputs: usize,
    outputs: usize,
    /// Columns before the layer's weights (the layer never starts at column 0 or ends the particle).
    offset: usize,
    /// Input shared by all particles (`[B, 1, k]`) or one per particle (`[B, n, k]`).
    shared: bool,
    activation: Activation,
}

impl Case {
    fn all() -> Vec<Case> {
        let mut cases = Vec::new();
        for activation in [Activation::Identity, Activation::Relu, Activation::Tanh] {
            for shared in [true, false] {
                for (inputs, outputs) in [(3, 5), (6, 1)] {
                    cases.push(Case { particles: 4, rows: 7, inputs, outputs, offset: 2, shared, activation });
                }
            }
        }
        cases
    }

    fn layer(&self) -> DenseLayer {
        DenseLayer::new(self.offset, self.inputs, self.outputs, self.activation).unwrap()
    }

    /// Particle width: the layer plus three columns after it.
    fn dim(&self) -> usize {
        self.layer().end() + 3
    }

    fn input_shape(&self) -> [usize; 3] {
        [self.rows, if self.shared { 1 } else { self.particles }, self.inputs]
    }

    /// Particles, input and the fixed output weights `R` of the scalar `sum(out * R)`.
    fn tensors(&self, dtype: DType, device: &Device) -> (Tensor<2>, Tensor<3>, Tensor<3>) {
        (
            normal([self.particles, self.dim()], 1, dtype, device),
            normal(self.input_shape(), 2, dtype, device),
            normal([self.rows, self.particles, self.outputs], 3, dtype, device),
        )
    }
}

/// `sum_{rows, units} out * R` per particle: every output's gradient enters with its own weight.
fn weighted(out: Tensor<3>, r: Tensor<3>) -> Tensor<1> {
    let [_, n, _] = out.dims();
    (out * r).sum_dim(2).sum_dim(0).reshape([n])
}

/// Output, particle gradient and input gradient of the layer computed with `ops`.
fn evaluate(case: &Case, ops: LayerOps, p: Tensor<2>, x: Tensor<3>, r: Tensor<3>) -> [Vec<f64>; 3] {
    let layer = case.layer().with_ops(ops);
    let out = layer.forward(p.clone(), x.clone());
    let (_, gp, gx) = value_and_grad2(p, x, |p, x| weighted(layer.forward(p, x), r.clone())).unwrap();
    [to_vec_f64(&out), to_vec_f64(&gp), to_vec_f64(&gx)]
}

fn max_rel_err(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(a, b)| (a - b).abs() / (1.0 + b.abs())).fold(0.0, f64::max)
}

#[test]
fn fused_layer_equals_plain_ops_on_every_backend() {
    for (backend, device) in backends() {
        // f32 sums of at most 7 products of unit normals: agreement to a few ulps of the
        // magnitudes involved, looser on a GPU whose reductions run in another order.
        let tol = if backend == BackendKind::Wgpu { 1e-3 } else { 1e-5 };
        for case in Case::all() {
            let (p, x, r) = case.tensors(DType::F32, &device.clone().autodiff());
            let fused = evaluate(&case, LayerOps::Fused, p.clone(), x.clone(), r.clone());
            let plain = evaluate(&case, LayerOps::Plain, p, x, r);
            for (what, (f, q)) in ["output", "particle gradient", "input gradient"].iter().zip(fused.iter().zip(&plain))
            {
                let err = max_rel_err(f, q);
                assert!(err < tol, "{backend} {case:?}: {what} differs from plain ops by {err}");
            }
            // The columns outside the layer get exactly zero gradient.
            let gp = &fused[1];
            let (layer, dim) = (case.layer(), case.dim());
            for (j, g) in gp.iter().enumerate() {
                let col = j % dim;
                if col < layer.offset() || col >= layer.end() {
                    assert_eq!(*g, 0.0, "{backend} {case:?}: gradient at column {col} outside the layer");
                }
            }
            assert!(gp.iter().any(|g| *g != 0.0) && fused[2].iter().any(|g| *g != 0.0));
        }
    }
}

#[test]
fn fused_layer_gradients_match_finite_differences() {
    for (backend, device) in backends() {
        // f64 where the backend computes it (central differences then agree to ~1e-8); llvmpipe's
        // wgpu runs f32 only: step 1e-2, where truncation (h^2 times third derivatives of order
        // one) and rounding (1e-7 |L| / h) stay below 1e-3 of the typical gradient.
        let (dtype, h, tol) =
            if backend == BackendKind::Wgpu { (DType::F32, 1e-2, 2e-2) } else { (DType::F64, 1e-6, 1e-6) };
        for case in Case::all() {
            if dtype == DType::F32 && case.activation == Activation::Relu {
                // A kink inside +-h would make the f32 difference meaningless; relu is covered by
                // the comparison with plain ops on this backend and by f64 on the CPU.
                continue;
            }
            let layer = case.layer();
            let ad = device.clone().autodiff();
            let (p, x, r) = case.tensors(dtype, &ad);
            let loss = |p: Tensor<2>, x: Tensor<3>| weighted(layer.forward(p, x), r.clone()).sum();
            let (_, gp, gx) = value_and_grad2(p.clone(), x.clone(), |p, x| loss(p, x).reshape([1])).unwrap();
            let (gp, gx) = (to_vec_f64(&gp), to_vec_f64(&gx));
            let scalar = |t: Tensor<1>| to_vec_f64(&t)[0];
            // Every particle coordinate and every input entry, by central differences.
            let (pv, xv) = (to_vec_f64(&p), to_vec_f64(&x));
            let at = |values: &[f64], j: usize, step: f64| {
                let mut v = values.to_vec();
                v[j] += step;
                v
            };
            let pd =
                |v: Vec<f64>| Tensor::<2>::from_data(TensorData::new(v, p.dims()).convert_dtype(dtype), (&ad, dtype));
            let xd =
                |v: Vec<f64>| Tensor::<3>::from_data(TensorData::new(v, x.dims()).convert_dtype(dtype), (&ad, dtype));
            for (j, g) in gp.iter().enumerate() {
                let fd = (scalar(loss(pd(at(&pv, j, h)), x.clone()).reshape([1]))
                    - scalar(loss(pd(at(&pv, j, -h)), x.clone()).reshape([1])))
                    / (2.0 * h);
                let err = (fd - g).abs() / (1.0 + fd.abs());
                assert!(err < tol, "{backend} {case:?}: d/dparticle[{j}] autodiff {g} vs differences {fd}");
            }
            for (j, g) in gx.iter().enumerate() {
                let fd = (scalar(loss(p.clone(), xd(at(&xv, j, h))).reshape([1]))
                    - scalar(loss(p.clone(), xd(at(&xv, j, -h))).reshape([1])))
                    / (2.0 * h);
                let err = (fd - g).abs() / (1.0 + fd.abs());
                assert!(err < tol, "{backend} {case:?}: d/dinput[{j}] autodiff {g} vs differences {fd}");
            }
        }
    }
}

#[test]
fn stack_of_fused_layers_equals_plain_ops() {
    for (backend, device) in backends() {
        let tol = if backend == BackendKind::Wgpu { 1e-3 } else { 1e-5 };
        let ad = device.autodiff();
        for hidden in [Activation::Relu, Activation::Tanh] {
            let net = DenseStack::new(1, &[4, 6, 5, 3], hidden, Activation::Identity).unwrap();
            let p = normal([5, net.end() + 2], 4, DType::F32, &ad).mul_scalar(0.5);
            let x = normal([9, 4], 5, DType::F32, &ad);
            let run = |ops: LayerOps| {
                let net = net.clone().with_ops(ops);
                let (v, g) = value_and_grad(p.clone(), |p| {
                    net.forward(p, x.clone()).square().sum_dim(2).sum_dim(0).reshape([5])
                })
                .unwrap();
                (to_vec_f64(&v), to_vec_f64(&g))
            };
            let (fused, plain) = (run(LayerOps::Fused), run(LayerOps::Plain));
            let (ev, eg) = (max_rel_err(&fused.0, &plain.0), max_rel_err(&fused.1, &plain.1));
            assert!(ev < tol && eg < tol, "{backend} {hidden}: value differs by {ev}, gradient by {eg}");
        }
    }
}

#[test]
fn forward_without_autodiff_runs_the_plain_backend() {
    // Prediction runs on a plain device: the layer's concrete kernels, no graph.
    let device = BackendKind::Flex.device().unwrap();
    let case = Case::all()[5];
    let (p, x, _) = case.tensors(DType::F32, &device);
    let fused = case.layer().forward(p.clone(), x.clone());
    let plain = case.layer().with_ops(LayerOps::Plain).forward(p, x);
    assert!(!fused.is_tracked());
    assert!(max_rel_err(&to_vec_f64(&fused), &to_vec_f64(&plain)) < 1e-5);
}

#[test]
fn layers_refuse_bad_shapes_and_layouts_by_name() {
    let err = DenseLayer::new(0, 0, 3, Activation::Relu).unwrap_err();
    assert!(err.to_string().contains("inputs"), "{err}");
    let err = "sigmoid".parse::<Activation>().unwrap_err();
    assert!(err.to_string().contains("sigmoid") && err.to_string().contains("tanh"), "{err}");
    assert!(DenseStack::new(0, &[3], Activation::Relu, Activation::Identity).is_err());

    let layout = ParamLayout::new()
        .real("w", &[4, 3])
        .unwrap()
        .real("b", &[4])
        .unwrap()
        .real("gap", &[1])
        .unwrap()
        .real("b_late", &[4])
        .unwrap()
        .positive("s", &[4])
        .unwrap();
    let layer = DenseLayer::from_layout(&layout, "w", "b", Activation::Tanh).unwrap();
    assert_eq!((layer.offset(), layer.inputs(), layer.outputs(), layer.end()), (0, 3, 4, 16));
    let reason = |e: ModelError| e.to_string();
    assert!(reason(DenseLayer::from_layout(&layout, "w", "b_late", Activation::Tanh).unwrap_err()).contains("b_late"));
    assert!(reason(DenseLayer::from_layout(&layout, "w", "s", Activation::Tanh).unwrap_err()).contains("real"));
    assert!(
        reason(DenseLayer::from_layout(&layout, "b", "gap", Activation::Tanh).unwrap_err())
            .contains("[outputs, inputs]")
    );
    assert!(reason(DenseLayer::from_layout(&layout, "w", "nope", Activation::Tanh).unwrap_err()).contains("nope"));
}

/// An empty particle matrix (a caller's zero count) gives empty outputs on every backend, fused
/// and plain, instead of the native kernels' panic on a zero-sized chunk of particles.
#[test]
fn zero_particles_give_empty_outputs_not_a_panic() {
    for (_, device) in backends() {
        for ops in [LayerOps::Fused, LayerOps::Plain] {
            let net = DenseStack::new(0, &[3, 4, 1], Activation::Relu, Activation::Identity).unwrap().with_ops(ops);
            let p = Tensor::<2>::zeros([0, net.end() + 2], &device);
            let (x, y) = (normal([5, 3], 1, DType::F32, &device), normal([5, 1], 2, DType::F32, &device));
            assert_eq!(net.forward(p.clone(), x.clone()).dims(), [5, 0, 1]);
            assert_eq!(net.sum_squared_residuals(p.clone(), x.clone(), y.clone()).dims(), [0, 1]);
            let terms = net.residual_precision_terms(p, x, y, net.end(), None, &[1.0], &[-0.5], 0.1);
            assert_eq!(terms.dims(), [0, 1]);
        }
    }
}

/// The networks whose residual sums are checked: one linear layer; one and two hidden layers of
/// each activation (a one-output head above them, and a many-output layer reading one input per
/// particle in the deeper ones); a head with an activation of its own.
fn residual_networks() -> Vec<DenseStack> {
    let mut nets = vec![DenseStack::new(1, &[4, 1], Activation::Identity, Activation::Identity).unwrap()];
    for hidden in [Activation::Relu, Activation::Tanh, Activation::Identity] {
        nets.push(DenseStack::new(1, &[4, 6, 1], hidden, Activation::Identity).unwrap());
        nets.push(DenseStack::new(2, &[4, 6, 5, 1], hidden, Activation::Identity).unwrap());
    }
    nets.push(DenseStack::new(0, &[4, 6, 1], Activation::Relu, Activation::Tanh).unwrap());
    nets
}

/// `sum_i c_i ssr_i` with fixed weights `c` (so that every particle's gradient is scaled
/// differently), through [`DenseStack::sum_squared_residuals`].
fn weighted_residuals(net: &DenseStack, p: Tensor<2>, x: Tensor<2>, y: Tensor<2>, c: Tensor<2>) -> Tensor<1> {
    let n = p.dims()[0];
    (net.sum_squared_residuals(p, x, y) * c).reshape([n])
}

#[test]
fn network_residual_sums_equal_plain_ops_on_every_backend() {
    for (backend, device) in backends() {
        let tol = if backend == BackendKind::Wgpu { 1e-3 } else { 1e-5 };
        let ad = device.autodiff();
        for net in residual_networks() {
            let p = normal([5, net.end() + 3], 4, DType::F32, &ad).mul_scalar(0.5);
            let x = normal([9, 4], 5, DType::F32, &ad);
            let y = normal([9, 1], 6, DType::F32, &ad);
            let c = normal([5, 1], 7, DType::F32, &ad);
            let run = |ops: LayerOps| {
                let net = net.clone().with_ops(ops);
                let (v, g) =
                    value_and_grad(p.clone(), |p| weighted_residuals(&net, p, x.clone(), y.clone(), c.clone()))
                        .unwrap();
                (to_vec_f64(&v), to_vec_f64(&g))
            };
            let (fused, plain) = (run(LayerOps::Fused), run(LayerOps::Plain));
            let (ev, eg) = (max_rel_err(&fused.0, &plain.0), max_rel_err(&fused.1, &plain.1));
            assert!(ev < tol && eg < tol, "{backend} {net:?}: value differs by {ev}, gradient by {eg}");
            // Outside the network's columns the gradient is exactly zero.
            let dim = net.end() + 3;
            for (j, g) in fused.1.iter().enumerate() {
                let col = j % dim;
                if col < net.offset() || col >= net.end() {
                    assert_eq!(*g, 0.0, "{backend} {net:?}: gradient at column {col} outside the network");
                }
            }
        }
    }
}

/// Against an independent evaluation: the residual sums summed in `f64` on the host from the
/// network written out by hand, and their gradient by central differences of that host sum.
#[test]
fn network_residual_sums_match_a_host_f64_evaluation() {
    for (backend, device) in backends().into_iter().filter(|(b, _)| *b != BackendKind::Wgpu) {
        let ad = device.autodiff();
        for net in residual_networks() {
            let (n, rows, k) = (3, 7, 4);
            let dim = net.end() + 2;
            let p = normal([n, dim], 11, DType::F64, &ad).mul_scalar(0.5);
            let x = normal([rows, k], 12, DType::F64, &ad);
            let y = normal([rows, 1], 13, DType::F64, &ad);
            let c = normal([n, 1], 14, DType::F64, &ad);
            let (value, grad) =
                value_and_grad(p.clone(), |p| weighted_residuals(&net, p, x.clone(), y.clone(), c.clone())).unwrap();
            let (pv, xv, yv, cv) = (to_vec_f64(&p), to_vec_f64(&x), to_vec_f64(&y), to_vec_f64(&c));
            // sum_i c_i sum_r (y_r - f_i(x_r))^2 with the network evaluated row by row.
            let host = |pv: &[f64]| -> Vec<f64> {
                (0..n).map(|i| cv[i] * host_residual_sum(&net, &pv[i * dim..(i + 1) * dim], &xv, &yv, k)).collect()
            };
            let want = host(&pv);
            let err = max_rel_err(&to_vec_f64(&value), &want);
            assert!(err < 1e-12, "{backend} {net:?}: value differs from the host f64 sum by {err}");
            assert_gradient_matches_differences(&format!("{backend} {net:?}"), &to_vec_f64(&grad), &pv, dim, &host);
        }
    }
}

/// Asserts that the autodiff gradient `g` of `host` (one `f64` value per particle of `dim`
/// coordinates in `pv`) matches its central differences, relative `1e-6`.
fn assert_gradient_matches_differences(
    what: &str,
    g: &[f64],
    pv: &[f64],
    dim: usize,
    host: &dyn Fn(&[f64]) -> Vec<f64>,
) {
    let h = 1e-6;
    for j in 0..pv.len() {
        let (mut up, mut down) = (pv.to_vec(), pv.to_vec());
        up[j] += h;
        down[j] -= h;
        let fd = (host(&up)[j / dim] - host(&down)[j / dim]) / (2.0 * h);
        let err = (fd - g[j]).abs() / (1.0 + fd.abs());
        assert!(err < 1e-6, "{what}: d/dparticle[{j}] autodiff {} vs host differences {fd}", g[j]);
    }
}

/// `sum_r (y_r - f(x_r))^2` of one particle's network `theta`, evaluated row by row in `f64`
/// from the layers written out by hand (rows `x` of `k` inputs, row-major).
fn host_residual_sum(net: &DenseStack, theta: &[f64], x: &[f64], y: &[f64], k: usize) -> f64 {
    let act = |a: Activation, z: f64| match a {
        Activation::Identity => z,
        Activation::Relu => z.max(0.0),
        Activation::Tanh => z.tanh(),
    };
    (0..y.len())
        .map(|r| {
            let mut h = x[r * k..(r + 1) * k].to_vec();
            for layer in net.layers() {
                let (ki, o) = (layer.inputs(), layer.outputs());
                let w = &theta[layer.offset()..layer.offset() + o * ki];
                let b = &theta[layer.offset() + o * ki..layer.end()];
                h = (0..o)
                    .map(|u| {
                        let z: f64 = b[u] + (0..ki).map(|j| w[u * ki + j] * h[j]).sum::<f64>();
                        act(layer.activation(), z)
                    })
                    .collect();
            }
            (y[r] - h[0]).powi(2)
        })
        .sum()
}

/// The squared columns (if any), `c1` and `c2` of one joint.
type JointCase = (Option<std::ops::Range<usize>>, Vec<f64>, Vec<f64>);

/// The precision terms' coefficients checked: the noise precision's alone, and with a second
/// precision over the network's own columns (a hierarchical prior on the weights).
fn joint_cases(net: &DenseStack) -> Vec<JointCase> {
    vec![(None, vec![3.5], vec![0.7]), (Some(net.offset()..net.end()), vec![3.5, 2.25], vec![0.7, 0.5])]
}

const JOINT_RATE: f64 = 0.3;

/// `sum_i c_i terms_i` through [`DenseStack::residual_precision_terms`] (the precisions in the
/// two columns after the network).
fn weighted_joint(
    net: &DenseStack,
    case: &JointCase,
    p: Tensor<2>,
    x: Tensor<2>,
    y: Tensor<2>,
    c: Tensor<2>,
) -> Tensor<1> {
    let n = p.dims()[0];
    let terms = net.residual_precision_terms(p, x, y, net.end(), case.0.clone(), &case.1, &case.2, JOINT_RATE);
    (terms * c).reshape([n])
}

/// The same terms from the separate fused nodes: the residual sum, the columns' sum of squares,
/// their `cat` and `fused::log_precision_terms`.
fn weighted_chain(
    net: &DenseStack,
    case: &JointCase,
    p: Tensor<2>,
    x: Tensor<2>,
    y: Tensor<2>,
    c: Tensor<2>,
) -> Tensor<1> {
    let n = p.dims()[0];
    let ssr = net.sum_squared_residuals(p.clone(), x, y);
    let stats = match &case.0 {
        Some(r) => Tensor::cat(vec![ssr, fused::sum_squares_of_columns(p.clone(), r.start, r.len())], 1),
        None => ssr,
    };
    let terms = fused::log_precision_terms(p, net.end(), stats, &case.1, &case.2, JOINT_RATE);
    (terms * c).reshape([n])
}

/// The one-node joint (network, residual sum, squared columns, precision terms) gives what the
/// separate fused nodes give, values and gradients, on every backend; on flex, whose native
/// backward writes one buffer with the same factors, to the bit.
#[test]
fn network_precision_terms_equal_the_chained_nodes_on_every_backend() {
    for (backend, device) in backends() {
        let tol = if backend == BackendKind::Wgpu { 1e-3 } else { 1e-5 };
        let ad = device.autodiff();
        for net in residual_networks() {
            for case in joint_cases(&net) {
                let p = normal([5, net.end() + 2], 4, DType::F32, &ad).mul_scalar(0.5);
                let x = normal([9, 4], 5, DType::F32, &ad);
                let y = normal([9, 1], 6, DType::F32, &ad);
                let c = normal([5, 1], 7, DType::F32, &ad);
                let run = |f: &dyn Fn(Tensor<2>) -> Tensor<1>| {
                    let (v, g) = value_and_grad(p.clone(), f).unwrap();
                    (to_vec_f64(&v), to_vec_f64(&g))
                };
                let joint = run(&|p| weighted_joint(&net, &case, p, x.clone(), y.clone(), c.clone()));
                let chain = run(&|p| weighted_chain(&net, &case, p, x.clone(), y.clone(), c.clone()));
                let (ev, eg) = (max_rel_err(&joint.0, &chain.0), max_rel_err(&joint.1, &chain.1));
                assert!(ev < tol && eg < tol, "{backend} {net:?} {case:?}: value differs by {ev}, gradient by {eg}");
                if backend == BackendKind::Flex {
                    assert_eq!(joint, chain, "{net:?} {case:?}: flex's one node differs from its chained nodes");
                }
            }
        }
    }
}

/// Against an independent evaluation: the terms summed in `f64` on the host from the network
/// written out by hand, and their gradient by central differences of that host sum; in `f64`
/// on the CPU backends (the primitive-op bodies), and flex's native `f32` kernels against the
/// `f64` gradient.
#[test]
fn network_precision_terms_match_a_host_f64_evaluation() {
    for (backend, device) in backends().into_iter().filter(|(b, _)| *b != BackendKind::Wgpu) {
        let ad = device.autodiff();
        for net in residual_networks() {
            for case in joint_cases(&net) {
                let (n, rows, k) = (3, 7, 4);
                let dim = net.end() + 2;
                let p = normal([n, dim], 11, DType::F64, &ad).mul_scalar(0.5);
                let x = normal([rows, k], 12, DType::F64, &ad);
                let y = normal([rows, 1], 13, DType::F64, &ad);
                let c = normal([n, 1], 14, DType::F64, &ad);
                let (value, grad) =
                    value_and_grad(p.clone(), |p| weighted_joint(&net, &case, p, x.clone(), y.clone(), c.clone()))
                        .unwrap();
                let (pv, xv, yv, cv) = (to_vec_f64(&p), to_vec_f64(&x), to_vec_f64(&y), to_vec_f64(&c));
                let (squares, c1, c2) = &case;
                // sum_i c_i sum_j c1_j u_j - e^{u_j} (c2_j s_j + rate), s = (ssr, sum of squares).
                let host = |pv: &[f64]| -> Vec<f64> {
                    (0..n)
                        .map(|i| {
                            let theta = &pv[i * dim..(i + 1) * dim];
                            let mut stats = vec![host_residual_sum(&net, theta, &xv, &yv, k)];
                            if let Some(r) = squares {
                                stats.push(theta[r.clone()].iter().map(|v| v * v).sum());
                            }
                            let terms: f64 = (0..stats.len())
                                .map(|j| {
                                    let u = theta[net.end() + j];
                                    c1[j] * u - u.exp() * (c2[j] * stats[j] + JOINT_RATE)
                                })
                                .sum();
                            cv[i] * terms
                        })
                        .collect()
                };
                let want = host(&pv);
                let err = max_rel_err(&to_vec_f64(&value), &want);
                assert!(err < 1e-12, "{backend} {net:?} {case:?}: value differs from the host f64 sum by {err}");
                let g = to_vec_f64(&grad);
                assert_gradient_matches_differences(&format!("{backend} {net:?} {case:?}"), &g, &pv, dim, &host);
                if backend == BackendKind::Flex {
                    // The native f32 kernels on the same values.
                    let f32_of = |t: &Tensor<2>| Tensor::<2>::from_data(t.to_data().convert_dtype(DType::F32), &ad);
                    let (v32, g32) = value_and_grad(f32_of(&p), |p| {
                        weighted_joint(&net, &case, p, f32_of(&x), f32_of(&y), f32_of(&c))
                    })
                    .unwrap();
                    let (ev, eg) = (max_rel_err(&to_vec_f64(&v32), &want), max_rel_err(&to_vec_f64(&g32), &g));
                    assert!(ev < 1e-5 && eg < 1e-5, "flex f32 {net:?} {case:?}: value off by {ev}, gradient by {eg}");
                }
            }
        }
    }
}
