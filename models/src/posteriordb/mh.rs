//! `Mh_data-Mh_model`: capture-recapture model M_h (Kéry & Schaub's individual heterogeneity in
//! detection) on a data set augmented to `M` individuals, with the latent inclusion `z[i]`
//! marginalised out: a detected individual contributes `log omega + binomial_logit(y | T, eps)`,
//! one never detected `log_sum_exp(log omega + T log1m_inv_logit(eps), log1m(omega))`. The two
//! groups are gathered once (index arrays), so every particle is one call per group.

use burn::tensor::{Device, Tensor};
use parvi_model::dist::{BinomialLogit, LogProb, Normal};
use parvi_model::functions::{inv_logit, log_sum_exp_pair, log1m, log1m_inv_logit, logit};
use parvi_model::index::IndexArray;
use parvi_model::program::{Generated, Program, Target, Vars};
use parvi_model::tensor_ops::matrix_from_vec;
use parvi_model::{ModelError, ParamLayout};

use super::PosteriorDbError;
use super::data::Data;

/// The individuals detected at least once, with their counts.
#[derive(Debug)]
struct Detected {
    index: IndexArray,
    likelihood: BinomialLogit<2>,
}

/// The model with its data on the device.
#[derive(Debug)]
pub(super) struct MhModel {
    /// `M`, the size of the augmented data set.
    individuals: usize,
    /// `T`, the sampling occasions.
    occasions: f64,
    detected: Option<Detected>,
    /// The individuals never detected (`y[i] == 0`).
    undetected: Option<IndexArray>,
    /// `[1, M]`: 1 where `y[i] > 0`.
    seen: Tensor<2>,
}

impl MhModel {
    /// Reads `M` (at least 1: `eps_raw` has `M` elements), `T` and `y` in `0..=T`.
    pub(super) fn new(data: &Data, device: &Device) -> Result<Self, PosteriorDbError> {
        let m = data.size("M", 0)?;
        if m == 0 {
            return Err(data.invalid("M", "must be at least 1: the model has a parameter per individual"));
        }
        let t = data.size("T", 0)?;
        let y: Vec<f64> = data.ints("y", m, "M")?.iter().map(|&v| v as f64).collect();
        data.check_bounds("y", &y, Some(0.0), Some(t as f64))?;
        let err = super::model_error("Mh_model");
        let (seen, unseen): (Vec<usize>, Vec<usize>) = (0..m).partition(|&i| y[i] > 0.0);
        let detected = if seen.is_empty() {
            None
        } else {
            let counts: Vec<f32> = seen.iter().map(|&i| y[i] as f32).collect();
            let counts = matrix_from_vec(counts, 1, seen.len(), device);
            Some(Detected {
                index: IndexArray::new("y", &seen, m, device).map_err(&err)?,
                likelihood: BinomialLogit::new(counts, t as f64).map_err(&err)?,
            })
        };
        let undetected =
            if unseen.is_empty() { None } else { Some(IndexArray::new("y", &unseen, m, device).map_err(&err)?) };
        let seen_row = y.iter().map(|&v| if v > 0.0 { 1.0 } else { 0.0 }).collect();
        Ok(Self {
            individuals: m,
            occasions: t as f64,
            detected,
            undetected,
            seen: matrix_from_vec(seen_row, 1, m, device),
        })
    }

    /// `eps = logit(mean_p) + sigma * eps_raw`, `[n, M]`.
    fn eps(p: &Vars) -> Result<Tensor<2>, ModelError> {
        Ok(p.get("eps_raw")? * p.get("sigma")? + logit(p.get("mean_p")?))
    }
}

impl Program for MhModel {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        ParamLayout::new()
            .interval("omega", &[], 0.0, 1.0)?
            .interval("mean_p", &[], 0.0, 1.0)?
            .interval("sigma", &[], 0.0, 5.0)?
            .real("eps_raw", &[self.individuals])
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let eps = p.transformed("eps", Self::eps(p)?);
        let omega = p.get("omega")?;
        *target += Normal::new(0.0, 1.0)?.log_prob(p.get("eps_raw")?);
        let log_omega = omega.clone().log();
        if let Some(detected) = &self.detected {
            let eps_seen = detected.index.take(eps.clone(), 1)?;
            *target += detected.likelihood.log_prob(eps_seen) + log_omega.clone();
        }
        if let Some(undetected) = &self.undetected {
            let eps_unseen = undetected.take(eps, 1)?;
            let present = log1m_inv_logit(eps_unseen).mul_scalar(self.occasions) + log_omega;
            let absent = log1m(omega).expand(present.dims());
            *target += log_sum_exp_pair(present, absent);
        }
        Ok(())
    }

    /// `z[i]`: 1 for an individual detected, else `bernoulli_rng(omega q^T / (omega q^T + 1 -
    /// omega))` with `q = inv_logit(-eps[i])`; `N = sum(z)`.
    fn generated(&self, p: &Vars, out: &mut Generated) -> Result<(), ModelError> {
        let eps = Self::eps(p)?;
        let omega = p.get("omega")?;
        let q_t = inv_logit(eps.neg()).powf_scalar(self.occasions);
        let present = q_t * omega.clone();
        let unseen_prob = present.clone() / (present + omega.neg().add_scalar(1.0));
        let dims = unseen_prob.dims();
        let seen = self.seen.clone().equal_elem(1.0).expand(dims);
        let z = out.bernoulli_rng(unseen_prob.mask_fill(seen, 1.0))?;
        out.output("z", z.clone());
        out.output("N", z.sum_dim(1));
        Ok(())
    }
}
