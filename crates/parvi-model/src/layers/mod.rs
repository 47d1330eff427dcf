//! Particle-batched dense layers: a network's weights for all particles come from the particle
//! matrix `[n, dim]`, and one layer call computes `act(x W_i^T + b_i)` for every particle `i`.
//!
//! A layer's weights `W` `[outputs, inputs]` (row-major) and bias `b` `[outputs]` are consecutive
//! columns of a particle, weights first, as [`ParamLayout::real`] lays out two blocks added one
//! after the other. Activations flow as `[B, m, k]` tensors: `m = 1` for rows every particle
//! sees (the data), `m = n` for one input per particle (a hidden layer's output); every layer
//! returns `[B, n, outputs]`.
//!
//! By default a layer is one fused operation with a hand-written backward pass (a burn backend
//! extension): on flex, native `gemm` kernels that apply bias and activation in the same pass;
//! on every other backend, the same mathematics from burn's primitive operations, still one
//! node for autodiff. [`LayerOps::Plain`] builds the layer from ordinary tensor operations
//! instead, node by node: the reference the fused form is tested and timed against.
//!
//! ```
//! use parvi_model::burn::tensor::{Device, Tensor};
//! use parvi_model::layers::{Activation, DenseStack};
//! use parvi_model::ParamLayout;
//!
//! // A 3 -> 8 (tanh) -> 1 network; its 41 weights and biases open every particle.
//! let net = DenseStack::new(0, &[3, 8, 1], Activation::Tanh, Activation::Identity).unwrap();
//! let layout = ParamLayout::new().real("net", &[net.param_count()]).unwrap().positive("noise", &[]).unwrap();
//! let device = Device::flex();
//! let particles = Tensor::<2>::zeros([5, layout.dim()], &device);
//! let x = Tensor::<2>::ones([10, 3], &device);
//! assert_eq!(net.forward(particles, x).dims(), [10, 5, 1]); // [rows, particles, outputs]
//! ```

mod flex;
mod ops;
mod residuals;

use std::fmt;
use std::str::FromStr;

use burn::backend::Dispatch;
use burn::tensor::{Tensor, activation};
use serde::{Deserialize, Serialize};

use crate::{Constraint, ModelError, ParamLayout};
use ops::{DenseSpec, ParticleDenseOps};
use residuals::{JointSpec, StackResidualOps, StackSpec};

/// The elementwise nonlinearity after a layer's affine map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    /// No nonlinearity: an output layer's logits or means.
    Identity,
    /// `max(z, 0)`.
    #[default]
    Relu,
    /// `tanh(z)`.
    Tanh,
}

impl Activation {
    /// Every activation name, for help texts and error messages.
    pub const NAMES: [&'static str; 3] = ["identity", "relu", "tanh"];

    /// The activation's name, as parsed and shown in messages.
    pub fn name(self) -> &'static str {
        match self {
            Activation::Identity => "identity",
            Activation::Relu => "relu",
            Activation::Tanh => "tanh",
        }
    }
}

impl FromStr for Activation {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "identity" | "linear" => Ok(Activation::Identity),
            "relu" => Ok(Activation::Relu),
            "tanh" => Ok(Activation::Tanh),
            _ => Err(ModelError::InvalidParameter {
                dist: "DenseLayer",
                name: "activation",
                reason: format!("unknown activation `{s}` (expected one of: {})", Activation::NAMES.join(", ")),
            }),
        }
    }
}

impl fmt::Display for Activation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a layer is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LayerOps {
    /// One fused operation with a hand-written backward pass.
    #[default]
    Fused,
    /// Ordinary tensor operations (slices, products, a broadcast add, the activation), each a
    /// node of the autodiff graph.
    Plain,
}

/// One particle-batched dense layer: `act(x W_i^T + b_i)` for every particle `i`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DenseLayer {
    spec: DenseSpec,
    ops: LayerOps,
}

impl DenseLayer {
    /// A layer whose weights `[outputs, inputs]` start at column `offset` of a particle, its bias
    /// `[outputs]` right after them.
    pub fn new(offset: usize, inputs: usize, outputs: usize, activation: Activation) -> Result<Self, ModelError> {
        for (name, value) in [("inputs", inputs), ("outputs", outputs)] {
            if value == 0 {
                return Err(ModelError::InvalidParameter {
                    dist: "DenseLayer",
                    name,
                    reason: "need at least 1 unit".into(),
                });
            }
        }
        Ok(Self { spec: DenseSpec { offset, inputs, outputs, activation }, ops: LayerOps::Fused })
    }

    /// The layer whose weights are the real block `weights` of shape `[outputs, inputs]` and whose
    /// bias is the real block `bias` `[outputs]` placed right after it.
    pub fn from_layout(
        layout: &ParamLayout,
        weights: &str,
        bias: &str,
        activation: Activation,
    ) -> Result<Self, ModelError> {
        let (w, b) = (layout.block(weights)?, layout.block(bias)?);
        let invalid = |name: &str, reason: String| ModelError::InvalidBlock { name: name.to_string(), reason };
        for block in [w, b] {
            if block.constraint != Constraint::Real {
                return Err(invalid(&block.name, "a layer's weights and bias must be real (unconstrained)".into()));
            }
        }
        let [outputs, inputs] = w.shape[..] else {
            return Err(invalid(weights, format!("weights need shape [outputs, inputs], got {:?}", w.shape)));
        };
        if b.shape != [outputs] {
            return Err(invalid(
                bias,
                format!("bias needs shape [{outputs}] (one per output unit), got {:?}", b.shape),
            ));
        }
        if b.offset != w.offset + w.free_size() {
            return Err(invalid(
                bias,
                format!("the bias must follow the weights block `{weights}` directly in the layout"),
            ));
        }
        Self::new(w.offset, inputs, outputs, activation)
    }

    /// The same layer computed with `ops`.
    pub fn with_ops(mut self, ops: LayerOps) -> Self {
        self.ops = ops;
        self
    }

    /// First column of the weights.
    pub fn offset(&self) -> usize {
        self.spec.offset
    }

    /// Input features.
    pub fn inputs(&self) -> usize {
        self.spec.inputs
    }

    /// Output units.
    pub fn outputs(&self) -> usize {
        self.spec.outputs
    }

    /// The activation.
    pub fn activation(&self) -> Activation {
        self.spec.activation
    }

    /// How the layer is computed.
    pub fn ops(&self) -> LayerOps {
        self.ops
    }

    /// Weights and biases: `outputs * (inputs + 1)` columns.
    pub fn param_count(&self) -> usize {
        self.spec.weight_len() + self.spec.outputs
    }

    /// One past the layer's last column.
    pub fn end(&self) -> usize {
        self.spec.offset + self.param_count()
    }

    /// The layer for every particle: `particles` `[n, dim]`, `input` `[B, m, inputs]` with
    /// `m = 1` (shared rows) or `m = n`; `[B, n, outputs]`.
    ///
    /// # Panics
    /// If the shapes do not fit the layer (a particle narrower than [`DenseLayer::end`], or an
    /// input of the wrong width): a model checks its layout against its layers when it is built.
    pub fn forward(&self, particles: Tensor<2>, input: Tensor<3>) -> Tensor<3> {
        let ([n, dim], [_, m, k]) = (particles.dims(), input.dims());
        assert!(
            dim >= self.end() && k == self.spec.inputs && (m == 1 || m == n),
            "dense layer at columns {}..{} of {}-column particles ({n} of them) with {} inputs got input [_, {m}, {k}]",
            self.spec.offset,
            self.end(),
            dim,
            self.spec.inputs
        );
        if n == 0 {
            // No particles, no outputs (the native kernels split their buffers by particle).
            let b = input.dims()[0];
            return Tensor::zeros([b, 0, self.spec.outputs], &particles.device());
        }
        match self.ops {
            LayerOps::Fused => Tensor::from_dispatch(<Dispatch as ParticleDenseOps>::particle_dense(
                input.into_dispatch(),
                particles.into_dispatch(),
                self.spec,
            )),
            LayerOps::Plain => self.forward_plain(particles, input),
        }
    }

    /// [`DenseLayer::forward`] of rows `x` `[B, inputs]` shared by all particles.
    pub fn forward_shared(&self, particles: Tensor<2>, x: Tensor<2>) -> Tensor<3> {
        let [b, k] = x.dims();
        self.forward(particles, x.reshape([b, 1, k]))
    }

    fn forward_plain(&self, particles: Tensor<2>, input: Tensor<3>) -> Tensor<3> {
        let ([n, _], [b, m, k]) = (particles.dims(), input.dims());
        let o = self.spec.outputs;
        let w = particles.clone().narrow(1, self.spec.offset, o * k);
        let bias = particles.narrow(1, self.spec.bias_offset(), o).reshape([1, n, o]);
        let pre = if m == 1 {
            // Hidden-major weights make all particles' weights one [n o, k] matrix.
            let wt = w.reshape([n * o, k]).transpose();
            input.reshape([b, k]).matmul(wt).reshape([b, n, o])
        } else if o == 1 {
            (input * w.reshape([1, n, k])).sum_dim(2)
        } else {
            let z = input.swap_dims(0, 1).matmul(w.reshape([n, o, k]).swap_dims(1, 2)); // [n, B, o]
            z.swap_dims(0, 1)
        };
        let pre = pre + bias;
        match self.spec.activation {
            Activation::Identity => pre,
            Activation::Relu => activation::relu(pre),
            Activation::Tanh => activation::tanh(pre),
        }
    }
}

/// A chain of [`DenseLayer`]s whose parameters sit back to back from one column on: a
/// multilayer perceptron for every particle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DenseStack {
    layers: Vec<DenseLayer>,
}

impl DenseStack {
    /// Layers of `sizes[0] -> sizes[1] -> ... -> sizes[last]` units from column `offset` on,
    /// each layer's weights then bias; `hidden` after every layer but the last, `output` after the
    /// last.
    pub fn new(offset: usize, sizes: &[usize], hidden: Activation, output: Activation) -> Result<Self, ModelError> {
        if sizes.len() < 2 {
            return Err(ModelError::InvalidParameter {
                dist: "DenseStack",
                name: "sizes",
                reason: format!("need input and output sizes at least, got {sizes:?}"),
            });
        }
        let mut layers = Vec::with_capacity(sizes.len() - 1);
        let mut start = offset;
        for (l, pair) in sizes.windows(2).enumerate() {
            let act = if l + 2 == sizes.len() { output } else { hidden };
            let layer = DenseLayer::new(start, pair[0], pair[1], act)?;
            start = layer.end();
            layers.push(layer);
        }
        Ok(Self { layers })
    }

    /// The same stack with every layer computed with `ops`.
    pub fn with_ops(self, ops: LayerOps) -> Self {
        Self { layers: self.layers.into_iter().map(|l| l.with_ops(ops)).collect() }
    }

    /// The layers, input side first.
    pub fn layers(&self) -> &[DenseLayer] {
        &self.layers
    }

    /// Weights and biases of all layers.
    pub fn param_count(&self) -> usize {
        self.layers.iter().map(DenseLayer::param_count).sum()
    }

    /// First column of the first layer.
    pub fn offset(&self) -> usize {
        self.layers[0].offset()
    }

    /// One past the last layer's last column.
    pub fn end(&self) -> usize {
        self.layers[self.layers.len() - 1].end()
    }

    /// Input features of the first layer.
    pub fn inputs(&self) -> usize {
        self.layers[0].inputs()
    }

    /// Output units of the last layer.
    pub fn outputs(&self) -> usize {
        self.layers[self.layers.len() - 1].outputs()
    }

    /// The network for every particle on rows `x` `[B, inputs]`: `[B, n, outputs]`.
    pub fn forward(&self, particles: Tensor<2>, x: Tensor<2>) -> Tensor<3> {
        let [b, k] = x.dims();
        self.layers.iter().fold(x.reshape([b, 1, k]), |h, layer| layer.forward(particles.clone(), h))
    }

    /// `sum_r (y[r] - f_i(x_r))^2` for every particle `i`: the residual sum of squares of a
    /// one-output network on rows `x` `[B, inputs]` against targets `y` `[B, 1]`, `[n, 1]`.
    ///
    /// With every layer fused and data rows and targets (untracked), it is one autodiff node for
    /// the whole network whose backward pass writes every layer's gradient into one buffer
    /// (`residuals`); otherwise the layers and the sum are chained as they are computed.
    ///
    /// # Panics
    /// If the network has more than one output, or the shapes do not fit it.
    pub fn sum_squared_residuals(&self, particles: Tensor<2>, x: Tensor<2>, y: Tensor<2>) -> Tensor<2> {
        let ([b, k], [rows, one], [n, dim]) = (x.dims(), y.dims(), particles.dims());
        assert!(
            self.outputs() == 1 && k == self.inputs() && rows == b && one == 1 && dim >= self.end(),
            "residuals of a {}-input, {}-output network ending at column {} on rows [{b}, {k}], targets [{rows}, {one}], particles [{n}, {dim}]",
            self.inputs(),
            self.outputs(),
            self.end()
        );
        if n == 0 {
            return Tensor::zeros([0, 1], &particles.device());
        }
        let all_fused = self.layers.iter().all(|l| l.ops == LayerOps::Fused);
        if all_fused && !x.is_tracked() && !y.is_tracked() {
            let stack = StackSpec { layers: self.layers.iter().map(|l| l.spec).collect() };
            return Tensor::from_dispatch(<Dispatch as StackResidualOps>::stack_residuals(
                x.into_dispatch(),
                y.into_dispatch(),
                particles.into_dispatch(),
                stack,
            ));
        }
        let f = self.forward(particles, x).reshape([b, n]);
        if all_fused { crate::fused::sum_squared_residuals(y, f) } else { (y - f).square().sum_dim(0).reshape([n, 1]) }
    }

    /// The log-precision terms of [`crate::fused::log_precision_terms`] (`sum_j c1_j u_j - e^{u_j}
    /// (c2_j s_j + rate)`, `u_j = particles[:, start + j]`, `[n, 1]`) whose statistics are this
    /// network's residual sum of squares ([`DenseStack::sum_squared_residuals`]) and, with
    /// `squares`, the sum of squares of those columns ([`crate::fused::sum_squares_of_columns`]):
    /// a Gaussian regression's log-joint with a sampled noise precision and, with `squares`, a
    /// sampled precision of a Gaussian prior on those columns, up to a constant. With one
    /// coefficient each there is no `squares`; with two there must be.
    ///
    /// With every layer fused and data rows and targets it is one autodiff node whose backward
    /// pass writes the network's, the squared columns' and the precisions' gradients into one
    /// buffer (`residuals`); otherwise the fused pieces are chained.
    ///
    /// # Panics
    /// As [`DenseStack::sum_squared_residuals`]; and if the coefficients are not one (without
    /// `squares`) or two (with), or the columns are not inside the particles.
    #[allow(clippy::too_many_arguments)]
    pub fn residual_precision_terms(
        &self,
        particles: Tensor<2>,
        x: Tensor<2>,
        y: Tensor<2>,
        start: usize,
        squares: Option<std::ops::Range<usize>>,
        shape_coeffs: &[f64],
        stat_coeffs: &[f64],
        rate: f64,
    ) -> Tensor<2> {
        let k = if squares.is_some() { 2 } else { 1 };
        let dim = particles.dims()[1];
        assert!(
            shape_coeffs.len() == k
                && stat_coeffs.len() == k
                && start + k <= dim
                && squares.as_ref().is_none_or(|r| r.start <= r.end && r.end <= dim),
            "precision terms over columns {start}..{} of {dim}-column particles with squares {squares:?} and {} / {} coefficients",
            start + k,
            shape_coeffs.len(),
            stat_coeffs.len()
        );
        if particles.dims()[0] == 0 {
            return Tensor::zeros([0, 1], &particles.device());
        }
        let all_fused = self.layers.iter().all(|l| l.ops == LayerOps::Fused);
        if !(all_fused && !x.is_tracked() && !y.is_tracked()) {
            let ssr = self.sum_squared_residuals(particles.clone(), x, y);
            let stats = match squares {
                Some(r) => {
                    Tensor::cat(vec![ssr, crate::fused::sum_squares_of_columns(particles.clone(), r.start, r.len())], 1)
                }
                None => ssr,
            };
            return crate::fused::log_precision_terms(particles, start, stats, shape_coeffs, stat_coeffs, rate);
        }
        let ([b, inputs], [rows, one], n) = (x.dims(), y.dims(), particles.dims()[0]);
        assert!(
            self.outputs() == 1 && inputs == self.inputs() && rows == b && one == 1 && dim >= self.end(),
            "residuals of a {}-input, {}-output network ending at column {} on rows [{b}, {inputs}], targets [{rows}, {one}], particles [{n}, {dim}]",
            self.inputs(),
            self.outputs(),
            self.end()
        );
        let stack = StackSpec { layers: self.layers.iter().map(|l| l.spec).collect() };
        let joint = JointSpec {
            terms: crate::fused::PrecisionTerms::new(start, shape_coeffs, stat_coeffs, rate),
            squares: squares.map(|r| (r.start, r.len())),
        };
        Tensor::from_dispatch(<Dispatch as StackResidualOps>::stack_log_joint(
            x.into_dispatch(),
            y.into_dispatch(),
            particles.into_dispatch(),
            stack,
            joint,
        ))
    }
}
