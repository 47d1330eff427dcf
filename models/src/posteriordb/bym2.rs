//! `traffic_accident_nyc-bym2_offset_only`: Mitzi Morris's BYM2 model of counts on areas (the
//! NYC traffic-accident case study, 1,921 census tracts). `y ~ poisson_log(log E + beta0 +
//! sigma convolved_re)` with `convolved_re = sqrt(1 - rho) theta + sqrt(rho / scaling_factor)
//! phi`: `theta ~ normal(0, 1)` heterogeneous effects, `phi` an intrinsic CAR (ICAR) field whose
//! density is the pairwise-difference term `-0.5 sum_edges (phi[node1] - phi[node2])^2` (two index
//! gathers over the edge list; their backward pass scatters into the areas), made identifiable by
//! the program's soft sum-to-zero constraint `sum(phi) ~ normal(0, 0.001 N)`. Priors: `beta0,
//! sigma ~ normal(0, 1)`, `rho ~ beta(0.5, 0.5)`.
//!
//! The generated quantities are the program's: `log_precision`, `logit_rho`, and the linear
//! predictor `eta` with its rate `mu = exp(eta)`.

use burn::tensor::{Device, Tensor};
use parvi_model::dist::{Beta, LogProb, Normal, PoissonLog};
use parvi_model::index::IndexArray;
use parvi_model::program::{Generated, Program, Target, Vars};
use parvi_model::tensor_ops::matrix_from_vec;
use parvi_model::{ModelError, ParamLayout};

use super::PosteriorDbError;
use super::data::Data;

#[derive(Debug)]
pub(super) struct Bym2 {
    areas: usize,
    /// The edges' ends, 0-based; `None` for a graph without edges (no ICAR term).
    edges: Option<(IndexArray, IndexArray)>,
    /// `y` `[1, N]` with its `ln y!`.
    counts: PoissonLog<2>,
    /// `log E` `[1, N]`.
    log_e: Tensor<2>,
    scaling_factor: f64,
}

/// `node1` or `node2`: `array[N_edges] int<lower=1, upper=N>`, 0-based.
fn node_field(data: &Data, field: &str, edges: usize, areas: usize) -> Result<Vec<usize>, PosteriorDbError> {
    let values = data.ints(field, edges, "N_edges")?;
    let as_reals: Vec<f64> = values.iter().map(|&v| v as f64).collect();
    data.check_bounds(field, &as_reals, Some(1.0), Some(areas as f64))?;
    Ok(values.iter().map(|&v| (v - 1) as usize).collect())
}

impl Bym2 {
    pub(super) fn new(data: &Data, device: &Device) -> Result<Self, PosteriorDbError> {
        // `int<lower=0> N`; with no area every vector parameter would be empty.
        let areas = data.size("N", 0)?;
        if areas == 0 {
            return Err(data.invalid("N", "must be at least 1: theta and phi have one value per area"));
        }
        let n_edges = data.size("N_edges", 0)?;
        let node1 = node_field(data, "node1", n_edges, areas)?;
        let node2 = node_field(data, "node2", n_edges, areas)?;
        let y = data.ints("y", areas, "N")?;
        let y: Vec<f64> = y.iter().map(|&v| v as f64).collect();
        data.check_bounds("y", &y, Some(0.0), None)?;
        let e = data.reals("E", areas, "N")?;
        data.check_bounds("E", &e, Some(0.0), None)?;
        data.check_positive("E", &e, "the model takes log(E), the exposure's offset")?;
        let scaling_factor = data.real("scaling_factor")?;
        data.check_bounds("scaling_factor", &[scaling_factor], Some(0.0), None)?;
        data.check_positive("scaling_factor", &[scaling_factor], "the model divides rho by it")?;
        let row = |v: &[f64]| matrix_from_vec(v.iter().map(|&x| x as f32).collect(), 1, areas, device);
        let model_error = super::model_error("bym2_offset_only");
        let counts = PoissonLog::new(row(&y)).map_err(&model_error)?;
        let log_e = row(&e.iter().map(|v| v.ln()).collect::<Vec<_>>());
        let edges = match n_edges {
            0 => None,
            _ => Some((
                IndexArray::new("node1", &node1, areas, device).map_err(&model_error)?,
                IndexArray::new("node2", &node2, areas, device).map_err(&model_error)?,
            )),
        };
        Ok(Self { areas, edges, counts, log_e, scaling_factor })
    }

    /// `convolved_re` `[n, N]`.
    fn convolved(&self, p: &Vars) -> Result<Tensor<2>, ModelError> {
        let rho = p.get("rho")?;
        let heterogeneous = rho.clone().neg().add_scalar(1.0).sqrt() * p.get("theta")?;
        Ok(heterogeneous + rho.div_scalar(self.scaling_factor).sqrt() * p.get("phi")?)
    }

    /// `log_E + beta0 + convolved_re * sigma` `[n, N]`.
    fn eta(&self, p: &Vars, convolved: Tensor<2>) -> Result<Tensor<2>, ModelError> {
        Ok(self.log_e.clone() + p.get("beta0")? + convolved * p.get("sigma")?)
    }
}

impl Program for Bym2 {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        let n = self.areas;
        ParamLayout::new()
            .real("beta0", &[])?
            .positive("sigma", &[])?
            .interval("rho", &[], 0.0, 1.0)?
            .real("theta", &[n])?
            .real("phi", &[n])
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let convolved = p.transformed_shaped("convolved_re", &[self.areas], self.convolved(p)?);
        let phi = p.get("phi")?;
        *target += self.counts.log_prob(self.eta(p, convolved)?);
        if let Some((node1, node2)) = &self.edges {
            let differences = node1.take(phi.clone(), 1)? - node2.take(phi.clone(), 1)?;
            *target += differences.square().sum_dim(1).mul_scalar(-0.5);
        }
        *target += Normal::new(0.0, 1.0)?.log_prob(p.get("beta0")?);
        *target += Normal::new(0.0, 1.0)?.log_prob(p.get("theta")?);
        *target += Normal::new(0.0, 1.0)?.log_prob(p.get("sigma")?);
        *target += Beta::new(0.5, 0.5)?.log_prob(p.get("rho")?);
        *target += Normal::new(0.0, 0.001 * self.areas as f64)?.log_prob(phi.sum_dim(1));
        Ok(())
    }

    fn generated(&self, p: &Vars, out: &mut Generated) -> Result<(), ModelError> {
        let (sigma, rho) = (p.get("sigma")?, p.get("rho")?);
        out.output_shaped("log_precision", &[], sigma.log().mul_scalar(-2.0));
        out.output_shaped("logit_rho", &[], (rho.clone() / rho.neg().add_scalar(1.0)).log());
        let eta = self.eta(p, self.convolved(p)?)?;
        out.output_shaped("eta", &[self.areas], eta.clone());
        out.output_shaped("mu", &[self.areas], eta.exp());
        Ok(())
    }
}
