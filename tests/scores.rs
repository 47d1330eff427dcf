//! Autodiff scores equal analytic scores.

mod common;

use common::*;
use parvi::model::burn::tensor::Tensor;
use parvi::model::dist::{Gamma, LogProb};
use parvi::model::tensor_ops::matrix_from_vec;
use parvi::model::{LogDensity, Minibatch, ParamLayout, score};
use parvi::models::Gaussian;
use parvi::models::builtin::{GAUSSIAN_COV, GAUSSIAN_MEAN};

fn assert_rel_close(a: &[f32], b: &[f32], tol: f64) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let (x, y) = (*x as f64, *y as f64);
        let rel = (x - y).abs() / y.abs().max(1e-3);
        assert!(rel < tol, "entry {i}: {x} vs {y} (rel {rel})");
    }
}

#[test]
fn gaussian_autodiff_score_matches_analytic() {
    let device = flex();
    let target = Gaussian::new(&GAUSSIAN_MEAN, &GAUSSIAN_COV, &device).unwrap();
    let x = gaussian_2d_samples([0.3, -0.2], [2.0, 0.3, 0.3, 1.5], 64, 3, &device);
    let s = score(&target as &dyn LogDensity, x.clone(), None).unwrap();
    assert_rel_close(&host(&s.grad), &host(&target.analytic_score(x)), 1e-4);
}

/// `tau ~ Gamma(a, b)` sampled as `u = log tau`, with the Jacobian from the layout.
struct LogGamma {
    layout: ParamLayout,
    a: f64,
    b: f64,
}

impl LogDensity for LogGamma {
    fn dim(&self) -> usize {
        1
    }
    fn log_prob(&self, x: Tensor<2>, _: Option<&Minibatch>) -> Tensor<1> {
        let p = self.layout.unpack(x);
        let tau: Tensor<1> = p.get("tau").unwrap();
        Gamma::new(self.a, self.b).unwrap().log_prob(tau) + p.log_jacobian()
    }
}

#[test]
fn gamma_score_through_log_transform_matches_analytic() {
    let device = flex();
    let model = LogGamma { layout: ParamLayout::new().positive("tau", &[]).unwrap(), a: 2.5, b: 1.5 };
    let u: Vec<f32> = (0..41).map(|i| -2.0 + 0.1 * i as f32).collect();
    let x = matrix_from_vec(u.clone(), u.len(), 1, &device);
    let s = score(&model as &dyn LogDensity, x, None).unwrap();
    // d/du [a log b + (a - 1) u - b e^u - log Gamma(a) + u] = a - b e^u
    let analytic: Vec<f32> = u.iter().map(|&u| (2.5 - 1.5 * (u as f64).exp()) as f32).collect();
    assert_rel_close(&host(&s.grad), &analytic, 1e-4);
    // and the value: the log density of u = log tau
    let lp = parvi::model::tensor_ops::to_vec_f32(&s.log_prob);
    let ln_gamma_a = parvi::model::dist::ln_gamma(2.5);
    for (lp, u) in lp.iter().zip(&u) {
        let u = *u as f64;
        let expected = 2.5 * 1.5f64.ln() + 1.5 * u - 1.5 * u.exp() - ln_gamma_a + u;
        assert!((*lp as f64 - expected).abs() < 1e-4 * expected.abs().max(1.0), "{lp} vs {expected}");
    }
}
