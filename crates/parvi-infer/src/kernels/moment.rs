//! The moment-matching kernel: a radial kernel plus linear features,
//! `k(x, y) = k_rad(x, y) + x^T y / d + 1` (Liu & Wang 2018, "Stein Variational Gradient Descent
//! as Moment Matching", NeurIPS, Sec. 3-4).
//!
//! At a fixed point of SVGD the Stein identity `E_q[A_p f] = 0` holds for every `f` in the span
//! of `k(x_i, .)`; with a kernel whose features contain `1` and `x`, for a Gaussian `p` those
//! `A_p f` span the quadratics, so the particles' mean and covariance are the target's whatever
//! `n` (their Theorem 3.3 for the linear kernel). The radial part keeps the particles apart and
//! the fit flexible where `p` is not Gaussian. With the median rule the radial part is about
//! `1 / (n + 1)` at a typical pair, so the linear part dominates the drift between far pairs.
//!
//! The linear part of the Stein direction at targets `y` from sources `x` with scores `s` and
//! weights `w` (`1/n` for SVGD) is
//!
//! `sum_j w_j [(x_j^T y_i / d + 1) s_j + y_i / d] = Y (X^T W S) / d + sum_j w_j s_j + (sum_j w_j) y_i / d`:
//!
//! a `[d, d]` product and a `[m, d] x [d, d]` one, or `(Y X^T) (W S)` where that is cheaper (`d`
//! above the point counts): at most two `[n, d] x [d, n]`-shaped products beside the radial work.

use burn::tensor::Tensor;

use crate::kernels::{Kernel, RadialEval};

/// A radial kernel with linear features added, `k_rad(x, y) + x^T y / d + 1`: the radial part
/// evaluates as the radial kernel does (so blocks, tiles and shards work as for it), and the
/// Stein directions built from it add [`linear_direction`].
pub struct MomentMatching {
    radial: Box<dyn Kernel>,
}

impl MomentMatching {
    /// `radial` plus linear features.
    pub fn new(radial: Box<dyn Kernel>) -> Self {
        Self { radial }
    }
}

impl Kernel for MomentMatching {
    fn eval(&self, sq: &Tensor<2>, second_order: bool) -> RadialEval {
        self.radial.eval(sq, second_order)
    }

    fn describe(&self) -> String {
        format!("{}+linear", self.radial.describe())
    }

    fn eval_proportional(&self, sq: &Tensor<2>) -> Option<(Tensor<2>, Tensor<2>)> {
        self.radial.eval_proportional(sq)
    }

    fn resolved(&self, n: usize, median_sq: &mut dyn FnMut() -> f32) -> Option<Box<dyn Kernel>> {
        Some(Box::new(MomentMatching { radial: self.radial.resolved(n, median_sq)? }))
    }

    fn linear_features(&self) -> bool {
        true
    }
}

/// The linear features' part of the (weighted) Stein direction at the targets `y` `[m, d]` from
/// sources `x` `[n, d]` with scores `s`: `sum_j w_j [(x_j^T y_i / d + 1) s_j + y_i / d]`, with
/// `w_j = 1/n` when `weights` is `None` (see the module docs for the products).
pub fn linear_direction(x: Tensor<2>, s: Tensor<2>, y: Tensor<2>, weights: Option<Tensor<1>>) -> Tensor<2> {
    let [n, d] = x.dims();
    let m = y.dims()[0];
    let (ws, total) = match weights {
        Some(w) => {
            let total = w.clone().sum().reshape([1, 1]);
            (s * w.reshape([n, 1]), total)
        }
        None => (s.div_scalar(n as f64), Tensor::ones([1, 1], &x.device())),
    };
    let mean_score = ws.clone().sum_dim(0); // [1, d]
    // (n + m) d^2 multiply-adds through the [d, d] matrix, 2 m n d through the [m, n] one.
    let drift = if (n + m) * d <= 2 * m * n {
        y.clone().matmul(x.transpose().matmul(ws))
    } else {
        y.clone().matmul(x.transpose()).matmul(ws)
    };
    (drift + y * total).div_scalar(d as f64) + mean_score
}

/// The linear features' part of the Stein kernel matrix `[n, n]` of `x` with itself (Liu, Lee &
/// Jordan 2016's `k_p` for `k = x^T y / d + 1`, with `grad_x k = y / d`, `grad_x grad_y k = I / d`):
///
/// `k_p(x_i, x_j) = (s_i . s_j) (x_i . x_j / d + 1) + (s_i . x_i + s_j . x_j) / d + 1`.
pub fn linear_stein_kernel(x: Tensor<2>, score: Tensor<2>) -> Tensor<2> {
    let d = x.dims()[1] as f64;
    let ss = score.clone().matmul(score.clone().transpose());
    let xx = x.clone().matmul(x.clone().transpose());
    let diag = (score * x).sum_dim(1).div_scalar(d); // [n, 1]: s_i . x_i / d
    ss * xx.div_scalar(d).add_scalar(1.0) + diag.clone() + diag.transpose() + 1.0
}
