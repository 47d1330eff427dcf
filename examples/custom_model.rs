//! A custom model in parvi's DSL: `y_i ~ N(mu, 1/tau)`, `mu ~ N(0, 10^2)`, `tau ~ Gamma(2, 1)`,
//! written for all particles at once and fitted by SVGD with minibatches.
//!
//! `cargo run --release --example custom_model`

use parvi::infer::{AdapterConfig, EngineRng, Particles, Rbf, RunConfig, Runner, Svgd};
use parvi::model::burn::{module::Module, tensor::Tensor};
use parvi::model::dist::{Gamma, LogProb, Normal};
use parvi::model::tensor_ops::matrix_from_vec;
use parvi::model::{BackendKind, LogDensity, Minibatch, ParamLayout};

#[derive(Module, Debug)]
struct NormalModel {
    /// `[rows, 1]`
    y: Tensor<2>,
    rows: usize,
    #[module(skip)]
    layout: ParamLayout,
}

impl LogDensity for NormalModel {
    fn dim(&self) -> usize {
        self.layout.dim()
    }

    fn data_len(&self) -> Option<usize> {
        Some(self.rows)
    }

    fn log_prob(&self, x: Tensor<2>, batch: Option<&Minibatch>) -> Tensor<1> {
        let n = x.dims()[0];
        let p = self.layout.unpack(x); // constrained values + log-Jacobian
        let mu: Tensor<1> = p.get("mu").unwrap(); // [n]
        let tau: Tensor<1> = p.get("tau").unwrap(); // [n], positive through exp
        let (y, scale) = Minibatch::select(batch, self.y.clone()); // batch rows and N/B
        let b = y.dims()[0];
        let lik = Normal::with_precision(0.0, tau.clone().reshape([n, 1]))
            .log_prob(y.reshape([1, b]) - mu.clone().reshape([n, 1]))
            .sum_dim(1)
            .reshape([n]);
        let prior = Normal::new(0.0, 10.0).unwrap().log_prob(mu) + Gamma::new(2.0, 1.0).unwrap().log_prob(tau);
        lik.mul_scalar(scale) + prior + p.log_jacobian()
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let device = BackendKind::Flex.device()?;
    // 500 draws from N(3, 0.5^2): the posterior should sit near mu = 3, tau = 4.
    let mut rng = EngineRng::new(0);
    let data: Vec<f32> = (0..500).map(|_| (3.0 + 0.5 * rng.normal()) as f32).collect();
    let model = NormalModel {
        y: matrix_from_vec(data, 500, 1, &device),
        rows: 500,
        layout: ParamLayout::new().real("mu", &[])?.positive("tau", &[])?,
    };
    let particles = Particles::gaussian(50, model.dim(), 0.0, 1.0, &mut rng, &device)?;
    let mut svgd = Svgd::new(Box::new(Rbf::median()), AdapterConfig::adagrad(0.05).build()?);
    let config = RunConfig { batch_size: Some(50), progress: true, ..RunConfig::new(2000, 1) };
    let out = Runner::new(&mut svgd, &model, particles, config)?.run(&mut [])?;
    let constrained = model.layout.constrain(out.particles.positions.clone());
    let means = Particles::new(constrained).mean();
    println!("posterior mean: mu = {:.3}, tau = {:.3} ({:.3} ms/step)", means[0], means[1], out.ms_per_step());
    Ok(())
}
