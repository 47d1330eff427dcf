//! Radial kernels `k(x, x') = f(||x - x'||^2)` evaluated as matrices.
//!
//! A radial kernel is all the Stein methods need to know through its profile `f` and the first
//! two derivatives of `f` with respect to the squared distance: the repulsion term, the Stein
//! kernel (KSD, control functionals) and the induced kernels are all built from those matrices
//! in [`crate::stein`], in batched `O(n m dim)` operations.

use burn::tensor::Tensor;
use parvi_model::tensor_ops::median_on_host;
use serde::{Deserialize, Serialize};

use crate::InferError;
use crate::error::require_positive;
use crate::kernels::pairs::pair_median_sq;

/// `f(r^2)`, `f'(r^2)` and, when asked for, `f''(r^2)` for a matrix of squared distances.
#[derive(Clone, Debug)]
pub struct RadialEval {
    /// The profile `f(r^2)`: the kernel matrix.
    pub k: Tensor<2>,
    /// `f'(r^2)`, the derivative with respect to the squared distance.
    pub dk: Tensor<2>,
    /// `f''(r^2)`, when asked for.
    pub d2k: Option<Tensor<2>>,
}

/// A radial kernel.
pub trait Kernel: Send + Sync {
    /// The profile and its derivatives at the squared distances `sq` `[n, m]`. With
    /// `second_order`, `d2k` is filled in too.
    fn eval(&self, sq: &Tensor<2>, second_order: bool) -> RadialEval;

    /// A short description for summaries, e.g. `rbf(median)`.
    fn describe(&self) -> String;

    /// For kernels whose profile derivative is a constant multiple of the profile, `f' = c f`
    /// (the RBF, `c = -1/(2 h^2)`): the kernel matrix and `c` as a `[1, 1]` tensor. It lets the
    /// SVGD direction fuse drift and repulsion into one matrix product. `None` otherwise.
    fn eval_proportional(&self, sq: &Tensor<2>) -> Option<(Tensor<2>, Tensor<2>)> {
        let _ = sq;
        None
    }

    /// This kernel with its data-dependent parameters fixed for the pairs of one set of `n`
    /// points, so that any block of the set's pair matrix evaluates as the whole matrix would
    /// (the median rule takes its median over all pairs, not over the block). `median_sq`
    /// gives the median of the set's squared pair distances (the `n x n` matrix's entries, the
    /// diagonal included); only kernels with a median rule call it. `None`: the kernel cannot
    /// be evaluated in blocks, and callers form the whole matrix.
    fn resolved(&self, n: usize, median_sq: &mut dyn FnMut() -> f32) -> Option<Box<dyn Kernel>> {
        let _ = (n, median_sq);
        None
    }

    /// `c` of a kernel with `f' = c f` whose bandwidth is a number already (the RBF with a
    /// fixed `h`, as [`Kernel::resolved`] leaves a median rule): a host path evaluates the
    /// kernel from it with no tensor operation. `None` otherwise.
    fn host_rate(&self) -> Option<f64> {
        None
    }

    /// Whether the kernel adds linear features `x^T y / d + 1` to its radial part
    /// ([`crate::kernels::MomentMatching`]): the Stein directions then add
    /// [`crate::kernels::linear_direction`], and what cannot (a Stein kernel matrix, induced
    /// points) refuses the kernel by name.
    fn linear_features(&self) -> bool {
        false
    }
}

/// How an RBF kernel picks its bandwidth `h` in `exp(-r^2 / (2 h^2))`.
#[derive(Clone, Debug)]
pub enum Bandwidth {
    /// `h^2 = med / (2 log(n + 1))`, `med` the median of the squared distances handed to the
    /// kernel (Liu & Wang's reference code), recomputed at every evaluation (by selection on
    /// the host, see [`median_h2`]). Evaluated in blocks ([`Kernel::resolved`]), `med` is the
    /// median over all pairs of the point set.
    Median,
    /// Han & Liu's rule as printed (their `exp(-r^2 / h)` with `h = med / (2 log(n + 1))`), in
    /// this kernel's convention `h^2 = med / (4 log(n + 1))`: half [`Bandwidth::Median`]'s `h^2`.
    /// The paper most likely meant the reference code's rule with the 2 dropped from the
    /// exponent; kept for comparison with the paper as printed.
    HanLiuMedian,
    /// A fixed `h`.
    Fixed(f64),
    /// `h` as a tensor `[1]`: learnable, gradients flow through it (adversarial induced points).
    Tensor(Box<Tensor<1>>),
}

/// The Gaussian (RBF) kernel `exp(-||x - x'||^2 / (2 h^2))`.
#[derive(Clone, Debug)]
pub struct Rbf {
    /// How the bandwidth `h` is chosen.
    pub bandwidth: Bandwidth,
}

impl Rbf {
    /// The RBF with the median heuristic ([`Bandwidth::Median`]), Liu & Wang's default.
    pub fn median() -> Self {
        Self { bandwidth: Bandwidth::Median }
    }

    /// The median rule as Han & Liu print it ([`Bandwidth::HanLiuMedian`]).
    pub fn han_liu() -> Self {
        Self { bandwidth: Bandwidth::HanLiuMedian }
    }

    /// The RBF with a fixed bandwidth `h > 0`.
    pub fn fixed(h: f64) -> Result<Self, InferError> {
        Ok(Self { bandwidth: Bandwidth::Fixed(require_positive("bandwidth", h)?) })
    }

    /// `h^2` as a `[1, 1]` tensor broadcast over the distance matrix.
    pub fn h2(&self, sq: &Tensor<2>) -> Tensor<2> {
        let device = sq.device();
        match &self.bandwidth {
            Bandwidth::Median => median_h2(sq, sq.dims()[0]),
            // Exactly half: the kernel's `1 / (2 h^2)` is then the paper's `1 / h` to the bit.
            Bandwidth::HanLiuMedian => median_h2(sq, sq.dims()[0]).div_scalar(2.0),
            Bandwidth::Fixed(h) => Tensor::full([1, 1], h * h, &device),
            Bandwidth::Tensor(h) => (**h).clone().square().reshape([1, 1]),
        }
    }
}

/// The median heuristic `h^2 = med / (2 log(n + 1))` `[1, 1]`, `med` the median of the squared
/// distances `sq` (Liu & Wang's reference code), found by selection on the host: one read of
/// `sq` and `O(n^2)` expected work where a device sort is `O(n^2 log n)`. The value is a
/// constant: no gradient flows through the median, as in the reference code's NumPy median.
pub fn median_h2<const D: usize>(sq: &Tensor<D>, n: usize) -> Tensor<2> {
    let med = median_on_host(sq).unwrap_or(0.0);
    Tensor::full([1, 1], median_rule_h2(med, n), &sq.device())
}

/// `h^2 = med / (2 log(n + 1))` from the median `med` of `n` points' squared pair distances. A
/// zero median (all points equal) would make `h = 0`, and a non-finite one is no bandwidth:
/// then `h^2 = 1`, the reference code's default.
pub fn median_rule_h2(med: f32, n: usize) -> f64 {
    let h2 = f64::from(med) / (2.0 * (n as f64 + 1.0).ln());
    if h2 > 0.0 && h2.is_finite() { h2 } else { 1.0 }
}

/// The median-heuristic bandwidth `h` of a particle set, as a `[1]` tensor: the median of the
/// squared pair distances is exact for small sets and estimated from a seeded sample of pairs
/// for large ones (see [`pair_median_sq`]); no `n x n` matrix is formed.
pub fn median_bandwidth(particles: &Tensor<2>) -> Tensor<1> {
    let n = particles.dims()[0];
    let h2 = median_rule_h2(pair_median_sq(particles), n);
    Tensor::full([1], h2.sqrt(), &particles.device())
}

impl Kernel for Rbf {
    fn eval(&self, sq: &Tensor<2>, second_order: bool) -> RadialEval {
        let h2 = self.h2(sq);
        let inv_2h2 = h2.recip().mul_scalar(0.5);
        let k = (sq.clone() * inv_2h2.clone()).neg().exp();
        let dk = k.clone().neg() * inv_2h2.clone();
        let d2k = second_order.then(|| k.clone() * inv_2h2.square());
        RadialEval { k, dk, d2k }
    }

    fn eval_proportional(&self, sq: &Tensor<2>) -> Option<(Tensor<2>, Tensor<2>)> {
        let inv_2h2 = self.h2(sq).recip().mul_scalar(0.5);
        let k = (sq.clone() * inv_2h2.clone()).neg().exp();
        Some((k, inv_2h2.neg()))
    }

    fn resolved(&self, n: usize, median_sq: &mut dyn FnMut() -> f32) -> Option<Box<dyn Kernel>> {
        let fixed = |h2: f64| Box::new(Rbf { bandwidth: Bandwidth::Fixed(h2.sqrt()) }) as Box<dyn Kernel>;
        Some(match &self.bandwidth {
            Bandwidth::Median => fixed(median_rule_h2(median_sq(), n)),
            Bandwidth::HanLiuMedian => fixed(median_rule_h2(median_sq(), n) / 2.0),
            Bandwidth::Fixed(_) | Bandwidth::Tensor(_) => Box::new(self.clone()),
        })
    }

    /// `c = -1 / (2 h^2)`, as [`Kernel::eval_proportional`]'s rate.
    fn host_rate(&self) -> Option<f64> {
        match self.bandwidth {
            Bandwidth::Fixed(h) => Some(-0.5 / (h * h)),
            _ => None,
        }
    }

    fn describe(&self) -> String {
        match &self.bandwidth {
            Bandwidth::Median => "rbf(median)".into(),
            Bandwidth::HanLiuMedian => "rbf(han-liu median)".into(),
            Bandwidth::Fixed(h) => format!("rbf(h={h})"),
            Bandwidth::Tensor(_) => "rbf(learned)".into(),
        }
    }
}

/// The inverse multiquadric kernel `(c + ||x - x'||^2)^beta`, `c > 0`, `beta < 0`.
#[derive(Clone, Debug)]
pub struct Imq {
    c: f64,
    beta: f64,
}

impl Imq {
    /// The IMQ kernel with `c > 0` and `beta < 0`.
    pub fn new(c: f64, beta: f64) -> Result<Self, InferError> {
        require_positive("imq.c", c)?;
        if !(beta < 0.0 && beta.is_finite()) {
            return Err(InferError::setting("imq.beta", format!("must be finite and < 0, got {beta}")));
        }
        Ok(Self { c, beta })
    }
}

impl Kernel for Imq {
    fn eval(&self, sq: &Tensor<2>, second_order: bool) -> RadialEval {
        let base = sq.clone().add_scalar(self.c);
        let k = base.clone().powf_scalar(self.beta);
        let dk = base.clone().powf_scalar(self.beta - 1.0).mul_scalar(self.beta);
        let d2k = second_order.then(|| base.powf_scalar(self.beta - 2.0).mul_scalar(self.beta * (self.beta - 1.0)));
        RadialEval { k, dk, d2k }
    }

    fn describe(&self) -> String {
        format!("imq(c={}, beta={})", self.c, self.beta)
    }

    fn resolved(&self, _n: usize, _median_sq: &mut dyn FnMut() -> f32) -> Option<Box<dyn Kernel>> {
        Some(Box::new(self.clone()))
    }
}

/// A kernel as a user writes it in a config file or on the command line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum KernelConfig {
    /// RBF with the median heuristic, or a fixed bandwidth `h`.
    Rbf {
        /// A fixed bandwidth `h`; `None` uses the median heuristic.
        bandwidth: Option<f64>,
    },
    /// IMQ `(c + r^2)^beta`.
    Imq {
        /// The offset `c > 0`.
        c: f64,
        /// The exponent `beta < 0`.
        beta: f64,
    },
    /// The moment-matching kernel (Liu & Wang 2018): the RBF (median heuristic, or a fixed
    /// bandwidth `h`) plus linear features, `k_rbf(x, y) + x^T y / d + 1`
    /// ([`crate::kernels::MomentMatching`]). SVGD's fixed points then have a Gaussian target's
    /// mean and covariance.
    #[serde(rename = "rbf-linear")]
    RbfLinear {
        /// A fixed bandwidth `h` of the RBF part; `None` uses the median heuristic.
        bandwidth: Option<f64>,
    },
}

impl Default for KernelConfig {
    fn default() -> Self {
        KernelConfig::Rbf { bandwidth: None }
    }
}

impl KernelConfig {
    /// The kernel this config describes, validated.
    pub fn build(&self) -> Result<Box<dyn Kernel>, InferError> {
        Ok(match *self {
            KernelConfig::Rbf { bandwidth: None } => Box::new(Rbf::median()),
            KernelConfig::Rbf { bandwidth: Some(h) } => Box::new(Rbf::fixed(h)?),
            KernelConfig::Imq { c, beta } => Box::new(Imq::new(c, beta)?),
            KernelConfig::RbfLinear { bandwidth } => {
                let radial = KernelConfig::Rbf { bandwidth }.build()?;
                Box::new(crate::kernels::MomentMatching::new(radial))
            }
        })
    }

    /// Whether the kernel has linear features (moment matching).
    pub fn is_moment_matching(&self) -> bool {
        matches!(self, KernelConfig::RbfLinear { .. })
    }

    /// `Ok` unless the kernel has linear features, which `method` cannot use (`why`): the error
    /// names the kernel setting and the method.
    pub fn require_radial(&self, method: &str, why: &str) -> Result<(), InferError> {
        if self.is_moment_matching() {
            return Err(InferError::setting(
                "kernel",
                format!("{method} cannot use the moment-matching kernel `rbf-linear`: {why}"),
            ));
        }
        Ok(())
    }
}
