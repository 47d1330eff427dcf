//! `sat-hier_2pl`: a hierarchical two-parameter logistic item-response model. Each item's
//! log-discrimination and difficulty `xi[i] = (xi1[i], xi2[i])` are bivariate normal with mean
//! `mu` and Cholesky factor `diag(tau) L_Omega`, `L_Omega ~ lkj_corr_cholesky(4)`.
//!
//! With `K = 2`, `multi_normal_cholesky_lpdf(xi[i] | mu, L)` is the chain rule written out: for
//! `L = [[l11, 0], [l21, l22]]`, `z1 = (xi1 - mu1) / l11` and `xi2 ~ normal(mu2 + l21 z1, l22)`
//! after `xi1 ~ normal(mu1, l11)`; elementwise over the items, one call for every particle.

use burn::tensor::{Device, Tensor};
use parvi_model::dist::{BernoulliLogit, Exponential, LkjCorrCholesky, LogProb, Normal};
use parvi_model::index::IndexArray;
use parvi_model::program::{Generated, Program, Target, Vars};
use parvi_model::tensor_ops::matrix_from_vec;
use parvi_model::{ModelError, ParamLayout};

use super::PosteriorDbError;
use super::data::Data;

/// The model with its data on the device.
#[derive(Debug)]
pub(super) struct Hier2pl {
    /// `ii`: the item of each response.
    item: IndexArray,
    /// `jj`: the person of each response.
    person: IndexArray,
    likelihood: BernoulliLogit<2>,
}

impl Hier2pl {
    /// Reads `I`, `J`, `N` (each at least 1), `ii` in `1..=I`, `jj` in `1..=J`, `y` in `{0, 1}`.
    pub(super) fn new(data: &Data, device: &Device) -> Result<Self, PosteriorDbError> {
        let (items, persons, n) = (data.size("I", 1)?, data.size("J", 1)?, data.size("N", 1)?);
        let ii = data.indices("ii", n, "N", items)?;
        let jj = data.indices("jj", n, "N", persons)?;
        let y: Vec<f64> = data.ints("y", n, "N")?.iter().map(|&v| v as f64).collect();
        data.check_bounds("y", &y, Some(0.0), Some(1.0))?;
        let err = super::model_error("hier_2pl");
        Ok(Self {
            item: IndexArray::new("ii", &ii, items, device).map_err(&err)?,
            person: IndexArray::new("jj", &jj, persons, device).map_err(&err)?,
            likelihood: BernoulliLogit::new(matrix_from_vec(y.iter().map(|&v| v as f32).collect(), 1, n, device))
                .map_err(&err)?,
        })
    }
}

/// Entry `(row, col)` of each particle's `2 x 2` factor `[n, 2, 2]`, as `[n, 1]`.
fn entry(l: &Tensor<3>, row: usize, col: usize) -> Tensor<2> {
    let n = l.dims()[0];
    l.clone().slice([0..n, row..row + 1, col..col + 1]).reshape([n, 1])
}

impl Program for Hier2pl {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        let items = self.item.size();
        ParamLayout::new()
            .real("theta", &[self.person.size()])?
            .real("xi1", &[items])?
            .real("xi2", &[items])?
            .real("mu", &[2])?
            .positive("tau", &[2])?
            .cholesky_factor_corr("L_Omega", 2)
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let (theta, xi1, xi2) = (p.get("theta")?, p.get("xi1")?, p.get("xi2")?);
        let (mu, tau, l_omega) = (p.get("mu")?, p.get("tau")?, p.get_shaped::<3>("L_Omega")?);
        let items = xi1.dims()[1];
        let alpha = p.transformed("alpha", xi1.clone().exp());
        let beta = p.transformed("beta", xi2.clone());
        let n = xi1.dims()[0];
        let xi = Tensor::stack::<3>(vec![xi1.clone(), xi2.clone()], 2).reshape([n, 2 * items]);
        p.transformed_shaped("xi", &[items, 2], xi);

        let (mu1, mu2) = (mu.clone().narrow(1, 0, 1), mu.narrow(1, 1, 1));
        let (tau1, tau2) = (tau.clone().narrow(1, 0, 1), tau.narrow(1, 1, 1));
        // L_Sigma = diag_pre_multiply(tau, L_Omega): rows scaled by tau.
        let l11 = tau1.clone() * entry(&l_omega, 0, 0);
        let l21 = tau2.clone() * entry(&l_omega, 1, 0);
        let l22 = tau2.clone() * entry(&l_omega, 1, 1);
        let z1 = (xi1.clone() - mu1.clone()) / l11.clone();
        *target += Normal::new(mu1.clone(), l11)?.log_prob(xi1);
        *target += Normal::new(z1 * l21 + mu2.clone(), l22)?.log_prob(xi2);

        *target += Normal::new(0.0, 1.0)?.log_prob(theta.clone());
        *target += LkjCorrCholesky::new(4.0)?.log_prob(l_omega);
        *target += Normal::new(0.0, 1.0)?.log_prob(mu1);
        *target += Exponential::new(0.1)?.log_prob(tau1);
        *target += Normal::new(0.0, 5.0)?.log_prob(mu2);
        *target += Exponential::new(0.1)?.log_prob(tau2);
        let eta = self.item.take(alpha, 1)? * (self.person.take(theta, 1)? - self.item.take(beta, 1)?);
        *target += self.likelihood.log_prob(eta);
        Ok(())
    }

    /// `corr_matrix[2] Omega = multiply_lower_tri_self_transpose(L_Omega);`
    fn generated(&self, p: &Vars, out: &mut Generated) -> Result<(), ModelError> {
        let l = p.get_shaped::<3>("L_Omega")?;
        let n = l.dims()[0];
        let omega = l.clone().matmul(l.swap_dims(1, 2)).reshape([n, 4]);
        out.output_shaped("Omega", &[2, 2], omega);
        Ok(())
    }
}
