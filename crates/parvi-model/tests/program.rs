//! `Program`'s reported quantities and generated-quantities block: Stan's names of any shape,
//! the `_rng` functions' draws against their distributions' moments (Monte Carlo tolerances),
//! a seeded block reproduced exactly, and a badly declared block refused by name.

use burn::tensor::{Device, Tensor};
use parvi_model::burn;
use parvi_model::dist::{LogProb, Normal};
use parvi_model::program::{Compiled, Generated, Program, StanModel, Target, Vars};
use parvi_model::tensor_ops::{cat_columns, matrix_from_vec, to_vec_f32};
use parvi_model::{BackendKind, LogDensity, ModelError, ParamLayout};
use rand::SeedableRng;

fn device() -> Device {
    BackendKind::Flex.device().unwrap()
}

/// `mu ~ normal(0, 1); sigma ~ lognormal(0, 1)`, data `y [1, 3]`; transformed `C[2, 1]` and a
/// generated block of each kind.
#[derive(Debug)]
struct Toy {
    y: Tensor<2>,
    /// Which badly declared block to run (0: none).
    bad: u8,
}

impl Program for Toy {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        ParamLayout::new().real("mu", &[])?.positive("sigma", &[])
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let (mu, sigma) = (p.get("mu")?, p.get("sigma")?);
        p.transformed_shaped("C", &[2, 1], Tensor::cat(vec![mu.clone(), sigma.clone()], 1));
        p.transformed("two_mu", mu.clone().mul_scalar(2.0));
        *target += Normal::new(0.0, 1.0)?.log_prob(mu.clone());
        *target += Normal::new(mu, sigma)?.log_prob(self.y.clone());
        Ok(())
    }

    fn generated(&self, p: &Vars, out: &mut Generated) -> Result<(), ModelError> {
        let (mu, sigma) = (p.get("mu")?, p.get("sigma")?);
        match self.bad {
            1 => out.output("x", Tensor::cat(vec![mu.clone(), mu.clone()], 0)),
            2 => {
                out.output("x", mu.clone());
                out.output("x", mu.clone());
            }
            3 => out.output_shaped("x", &[2, 2], mu.clone()),
            _ => {}
        }
        let y_rep = out.normal_rng(mu.clone().repeat_dim(1, 3), sigma.clone())?;
        out.output("y_rep", y_rep);
        out.output("log_lik", Normal::new(mu.clone(), sigma)?.log_prob(self.y.clone()));
        let counts = out.poisson_log_rng(mu.clone())?;
        out.output("count", counts);
        let coin = out.bernoulli_logit_rng(mu.clone())?;
        out.output_shaped("coin", &[], coin);
        Ok(())
    }
}

fn toy(bad: u8) -> Result<Compiled<Toy>, ModelError> {
    Compiled::new(Toy { y: matrix_from_vec(vec![0.5, -0.2, 1.1], 1, 3, &device()), bad }, &device())
}

#[test]
fn names_follow_stans_shapes_and_order() {
    let model = toy(0).unwrap();
    assert_eq!(model.names(), ["mu", "sigma", "C[1,1]", "C[2,1]", "two_mu"]);
    assert_eq!(
        model.generated_names(),
        ["y_rep[1]", "y_rep[2]", "y_rep[3]", "log_lik[1]", "log_lik[2]", "log_lik[3]", "count", "coin"]
    );
    let x = matrix_from_vec(vec![0.3, 0.0, -1.0, 0.5], 2, 2, &device());
    let reported = to_vec_f32(&StanModel::reported(&model, x).unwrap());
    // sigma = exp(0) = 1 and exp(0.5); C holds (mu, sigma); two_mu = 2 mu.
    let expected = [0.3, 1.0, 0.3, 1.0, 0.6, -1.0, 0.5f32.exp(), -1.0, 0.5f32.exp(), -2.0];
    for (got, want) in reported.iter().zip(expected) {
        assert!((got - want).abs() < 1e-6, "{reported:?}");
    }
}

#[test]
fn generated_block_is_seeded_and_log_lik_is_the_pointwise_density() {
    let model = toy(0).unwrap();
    let x = matrix_from_vec(vec![0.3, 0.0, -1.0, 0.5], 2, 2, &device());
    let run = |seed| {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        to_vec_f32(&model.generated(x.clone(), &mut rng).unwrap())
    };
    let (a, b, c) = (run(7), run(7), run(8));
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_eq!(a.len(), 2 * 8);
    // log_lik[j] of draw 1 (mu 0.3, sigma 1) is N(y_j | 0.3, 1), computed here in f64.
    let y = [0.5f64, -0.2, 1.1];
    for (j, yj) in y.iter().enumerate() {
        let want = -0.5 * (yj - 0.3).powi(2) - 0.5 * (2.0 * std::f64::consts::PI).ln();
        assert!((f64::from(a[3 + j]) - want).abs() < 1e-5, "{a:?}");
    }
    // The sum of log_lik over the data is the likelihood part of the log density.
    let lp = to_vec_f32(&model.log_prob(x.clone(), None));
    let prior_and_jacobian =
        |mu: f64, log_sigma: f64| -0.5 * mu * mu - 0.5 * (2.0 * std::f64::consts::PI).ln() + log_sigma;
    let lik: f64 = (3..6).map(|j| f64::from(a[j])).sum();
    assert!((f64::from(lp[0]) - lik - prior_and_jacobian(0.3, 0.0)).abs() < 1e-4, "{lp:?}");
}

#[test]
fn rng_draws_have_their_distributions_moments() {
    // 20,000 draws at one parameter value each; tolerances are 5 Monte Carlo standard errors.
    let n = 20_000;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(11);
    let model = toy(0).unwrap();
    // mu = 0.7, sigma = exp(-0.4): every draw the same parameters.
    let x = Tensor::<2>::ones([n, 2], &device()) * matrix_from_vec(vec![0.7, -0.4], 1, 2, &device());
    let g = to_vec_f32(&model.generated(x, &mut rng).unwrap());
    let column = |j: usize| (0..n).map(|r| f64::from(g[r * 8 + j])).collect::<Vec<_>>();
    let moments = |v: &[f64]| {
        let m = v.iter().sum::<f64>() / v.len() as f64;
        (m, (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() - 1) as f64).sqrt())
    };
    let sigma = (-0.4f64).exp();
    let (m, s) = moments(&column(0));
    assert!((m - 0.7).abs() < 5.0 * sigma / (n as f64).sqrt(), "normal mean {m}");
    assert!((s - sigma).abs() < 5.0 * sigma / (2.0 * n as f64).sqrt(), "normal sd {s}");
    let rate = 0.7f64.exp();
    let (m, s) = moments(&column(6));
    assert!((m - rate).abs() < 5.0 * (rate / n as f64).sqrt(), "poisson mean {m}");
    assert!((s * s - rate).abs() < 0.1 * rate, "poisson variance {}", s * s);
    let p = 1.0 / (1.0 + (-0.7f64).exp());
    let (m, _) = moments(&column(7));
    assert!((m - p).abs() < 5.0 * (p * (1.0 - p) / n as f64).sqrt(), "bernoulli mean {m}");
}

#[test]
fn badly_declared_blocks_are_refused_by_name() {
    let e = toy(1).unwrap_err().to_string();
    assert!(e.contains("generated quantity `x`") && e.contains("rows"), "{e}");
    let e = toy(2).unwrap_err().to_string();
    assert!(e.contains("quantity `x`") && e.contains("declared twice"), "{e}");
    let e = toy(3).unwrap_err().to_string();
    assert!(e.contains("quantity `x`") && e.contains("shape [2, 2] holds 4 values but 1 were given"), "{e}");
    // An _rng argument outside its support names the function, the argument and the draw.
    let mut rng = rand::rngs::SmallRng::seed_from_u64(0);
    let mut out_of_support = |mu: f32, sigma: f32| {
        #[derive(Debug)]
        struct Bad(f32, f32);
        impl Program for Bad {
            fn parameters(&self) -> Result<ParamLayout, ModelError> {
                ParamLayout::new().real("a", &[])
            }
            fn model(&self, _: &Vars, _: &mut Target) -> Result<(), ModelError> {
                Ok(())
            }
            fn generated(&self, p: &Vars, out: &mut Generated) -> Result<(), ModelError> {
                let a = p.get("a")?;
                let d = a.device();
                let draw =
                    out.normal_rng(matrix_from_vec(vec![self.0], 1, 1, &d), matrix_from_vec(vec![self.1], 1, 1, &d))?;
                out.output("z", draw);
                Ok(())
            }
        }
        Compiled::new(Bad(mu, sigma), &device()).and_then(|m| m.generated(Tensor::zeros([1, 1], &device()), &mut rng))
    };
    let e = out_of_support(0.0, -1.0).unwrap_err().to_string();
    assert!(e.contains("normal_rng(mu, sigma)") && e.contains("draw 1"), "{e}");
    assert!(out_of_support(0.0, 1.0).is_ok());
}

#[test]
fn cat_columns_is_cat_along_the_second_dimension_in_values_and_gradients() {
    // Blocks of widths 1, 2 and 1 on 5 rows; the gradient of a weighted sum reaches each block's
    // own columns of the weights.
    let device = device().autodiff();
    let block = |width: usize, offset: f32| {
        let values = (0..5 * width).map(|i| offset + i as f32).collect();
        matrix_from_vec(values, 5, width, &device).require_grad()
    };
    let (a, b, c) = (block(1, 0.0), block(2, 10.0), block(1, 100.0));
    let weights = matrix_from_vec((0..20).map(|i| (i % 7) as f32 - 3.0).collect(), 5, 4, &device);
    let fast = cat_columns(vec![a.clone(), b.clone(), c.clone()]);
    let plain = Tensor::cat(vec![a.clone(), b.clone(), c.clone()], 1);
    assert_eq!(fast.dims(), [5, 4]);
    assert_eq!(to_vec_f32(&fast), to_vec_f32(&plain));
    let grads = (fast * weights.clone()).sum().backward();
    let w = to_vec_f32(&weights);
    let column = |j: usize| (0..5).map(|i| w[i * 4 + j]).collect::<Vec<_>>();
    assert_eq!(to_vec_f32(&a.grad(&grads).unwrap()), column(0));
    let g_b = to_vec_f32(&b.grad(&grads).unwrap());
    assert_eq!(g_b, (0..5).flat_map(|i| [w[i * 4 + 1], w[i * 4 + 2]]).collect::<Vec<_>>());
    assert_eq!(to_vec_f32(&c.grad(&grads).unwrap()), column(3));
}

/// `vector[3] beta; matrix[2, 2] L;` with `theta = beta[2] + L[2,1]` and transformed data
/// reported once (`x_mean`, `x_scale[2]`), optionally a badly declared constant.
#[derive(Debug)]
struct Elements {
    bad: u8,
}

impl Program for Elements {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        ParamLayout::new().real("beta", &[3])?.real("L", &[2, 2])
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let theta = p.element("beta", [2])? + p.element("L", [2, 1])?;
        p.transformed("theta", theta.clone());
        *target += Normal::new(0.0, 1.0)?.log_prob(theta);
        Ok(())
    }

    fn transformed_data(&self, out: &mut parvi_model::program::Constants) -> Result<(), ModelError> {
        out.output("x_mean", &[0.25]);
        out.output_tensor("x_scale", &matrix_from_vec(vec![2.0, 4.0], 1, 2, &device()));
        match self.bad {
            1 => out.output("x_mean", &[1.0]),
            2 => out.output_shaped("m", &[2, 2], &[1.0]),
            3 => out.output("theta", &[1.0]),
            _ => {}
        }
        Ok(())
    }
}

#[test]
fn an_element_is_stans_one_based_index_and_constants_are_reported_once() {
    let model = Compiled::new(Elements { bad: 0 }, &device()).unwrap();
    // beta[2] is column 1 of the particle, L[2,1] column 3 + 2 = 5 (row-major, after beta's 3).
    let x = matrix_from_vec((0..14).map(|v| v as f32).collect(), 2, 7, &device());
    let reported = to_vec_f32(&StanModel::reported(&model, x).unwrap());
    assert_eq!(model.names().last().map(String::as_str), Some("theta"));
    assert_eq!((reported[7], reported[15]), (1.0 + 5.0, 8.0 + 12.0), "{reported:?}");
    assert_eq!(StanModel::constant_names(&model), ["x_mean", "x_scale[1]", "x_scale[2]"]);
    assert_eq!(StanModel::constants(&model), [0.25, 2.0, 4.0]);
    // Out of range, the wrong rank, a constant twice, a wrong shape, a name taken: named.
    #[derive(Debug)]
    struct Bad(u8);
    impl Program for Bad {
        fn parameters(&self) -> Result<ParamLayout, ModelError> {
            ParamLayout::new().real("beta", &[3])
        }
        fn model(&self, p: &Vars, _: &mut Target) -> Result<(), ModelError> {
            match self.0 {
                0 => p.element("beta", [0]),
                1 => p.element("beta", [4]),
                _ => p.element("beta", [1, 1]),
            }
            .map(drop)
        }
    }
    for (case, want) in [(0, "index 0 on axis 1 is outside 1..=3"), (1, "index 4"), (2, "takes 1 indices")] {
        let e = Compiled::new(Bad(case), &device()).unwrap_err().to_string();
        assert!(e.contains("`beta`") && e.contains(want), "{e}");
    }
    for (bad, want) in
        [(1, "`x_mean`: declared twice"), (2, "shape [2, 2] holds 4 values but 1"), (3, "`theta` is already")]
    {
        let e = Compiled::new(Elements { bad }, &device()).unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    }
}
