//! `loss_curves-losscurve_sislob`: hierarchical insurance loss curves (Mick Cooney's
//! `losscurve_sislob`). Cumulative losses `loss[i] ~ normal(LR[c] premium[c] gf[t], loss_sd
//! premium[c])` for cohort `c = cohort_id[i]` at development time `t = t_idx[i]`; the growth
//! factor `gf` is Weibull, `1 - exp(-(t / theta)^omega)`, or log-logistic, `t^omega / (t^omega +
//! theta^omega)` (`growthmodel_id` 1 or 0); `LR ~ lognormal(mu_LR, sd_LR)` with lognormal and
//! normal hyperpriors.
//!
//! Both growth factors are links of `z = omega (ln t - ln theta)`: the Weibull's is
//! `inv_cloglog(z)`, the log-logistic's `inv_logit(z)`, each accurate in its tails.
//!
//! The generated quantities are the program's: `loss_sample`, `loss_prediction` (the observed
//! triangle, completed by the growth factor's step ratios), `step_ratio`, `mu_LR_exp` and the
//! `ppc_*` summaries, all deterministic. As the program writes it, `step_ratio[i, j] =
//! gf[t_idx[j]] / gf[t_idx[j - 1]]` indexes `t_idx` by development time (the first cohort's
//! rows), so the completed losses are `loss_prediction[i, maxtime] gf[t_idx[j]] /
//! gf[t_idx[maxtime]]` (the ratios telescope); cells the program leaves unset are NaN, as in
//! Stan.

use burn::tensor::{Bool, Device, Tensor, TensorData};
use parvi_model::dist::{LogNormal, LogProb, Normal};
use parvi_model::functions::{inv_cloglog, inv_logit};
use parvi_model::index::IndexArray;
use parvi_model::program::{Generated, Program, Target, Vars};
use parvi_model::tensor_ops::matrix_from_vec;
use parvi_model::{ModelError, ParamLayout};

use super::PosteriorDbError;
use super::data::Data;

/// Which growth curve `gf` follows (`growthmodel_id`).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Growth {
    LogLogistic,
    Weibull,
}

#[derive(Debug)]
pub(super) struct LossCurve {
    growth: Growth,
    cohorts: usize,
    times: usize,
    /// `ln t_value` `[1, n_time]` (a time of 0 as a large negative number: `gf = 0` there, with a
    /// finite gradient).
    ln_t: Tensor<2>,
    /// `cohort_id` and `t_idx`, 0-based.
    cohort_id: IndexArray,
    t_idx: IndexArray,
    /// `premium[cohort_id]` `[1, n_data]`.
    premium_rows: Tensor<2>,
    /// `premium` `[1, n_cohort]`.
    premium: Tensor<2>,
    /// `loss` `[1, n_data]`.
    loss: Tensor<2>,
    /// The generated block's completion of the loss triangle (see [`Completion`]).
    completion: Completion,
}

/// `loss_prediction` of the generated block, cell `(i, j)` of `n_cohort x n_time` row-major:
/// the observed loss where `j <= cohort_maxtime[i]` (NaN where no row sets it), else
/// `base[i] gf[t_idx[j]] / gf[t_idx[maxtime_i]]`.
#[derive(Debug)]
struct Completion {
    /// `t_idx[j]` (0-based) for `j` in `1..=n_time`: the development times the step ratios read.
    ratio_times: IndexArray,
    /// Per cell: the column of `gf[t_idx[.]]` of the numerator (`j`) and the denominator
    /// (`cohort_maxtime[i]`).
    numerator: IndexArray,
    denominator: IndexArray,
    /// Per cell `[1, cells]`: the observed value at `(i, maxtime_i)` (NaN if unset).
    base: Tensor<2>,
    /// Per cell `[1, cells]`: the value where it is not extended (observed or NaN).
    fixed: Tensor<2>,
    /// Per cell `[1, cells]`: whether it is extended (`j > cohort_maxtime[i]`).
    extended: Tensor<2, Bool>,
    /// `cohort_maxtime[i] - 1` as cells `(i, maxtime_i)`, for `ppc_EFC`.
    at_maxtime: IndexArray,
}

/// An index field read as Stan reads it and checked against `1..=upper` (the size field
/// `upper_field`): every use in the program indexes a vector of that size.
fn index_field(
    data: &Data,
    field: &str,
    len: (usize, &str),
    (upper, upper_field): (usize, &str),
) -> Result<Vec<usize>, PosteriorDbError> {
    let values = data.ints(field, len.0, len.1)?;
    match values.iter().position(|&v| v < 1 || v as u64 > upper as u64) {
        Some(i) => Err(data.invalid(
            field,
            format!(
                "value {} at element {} indexes a vector of {upper_field} = {upper}: out of range",
                values[i],
                i + 1
            ),
        )),
        None => Ok(values.iter().map(|&v| (v - 1) as usize).collect()),
    }
}

fn row(values: Vec<f32>, device: &Device) -> Tensor<2> {
    let len = values.len();
    matrix_from_vec(values, 1, len, device)
}

fn model_error(error: ModelError) -> PosteriorDbError {
    super::model_error("losscurve_sislob")(error)
}

impl LossCurve {
    pub(super) fn new(data: &Data, device: &Device) -> Result<Self, PosteriorDbError> {
        let growth = match data.int("growthmodel_id")? {
            0 => Growth::LogLogistic,
            1 => Growth::Weibull,
            v => {
                return Err(data.invalid(
                    "growthmodel_id",
                    format!("value {v} is outside the constraint <lower=0, upper=1> of the data block"),
                ));
            }
        };
        let (n_data, n_time, n_cohort) = (data.size("n_data", 1)?, data.size("n_time", 1)?, data.size("n_cohort", 1)?);
        let cohort_id = index_field(data, "cohort_id", (n_data, "n_data"), (n_cohort, "n_cohort"))?;
        let t_idx = index_field(data, "t_idx", (n_data, "n_data"), (n_time, "n_time"))?;
        let maxtime = index_field(data, "cohort_maxtime", (n_cohort, "n_cohort"), (n_time, "n_time"))?;
        let t_value = data.reals("t_value", n_time, "n_time")?;
        data.check_bounds("t_value", &t_value, Some(0.0), None)?;
        let premium = data.reals("premium", n_cohort, "n_cohort")?;
        data.check_positive("premium", &premium, "loss_sd * premium is the scale of a normal")?;
        let loss = data.reals("loss", n_data, "n_data")?;
        if n_data < n_time {
            return Err(data.invalid(
                "t_idx",
                format!("the generated quantities read t_idx[j] for j up to n_time = {n_time}, but n_data = {n_data}"),
            ));
        }

        // The generated block's triangle: observed cells, then the extension past maxtime.
        let mut observed = vec![f32::NAN; n_cohort * n_time];
        for ((&c, &t), &l) in cohort_id.iter().zip(&t_idx).zip(&loss) {
            observed[c * n_time + t] = l as f32;
        }
        let cells = n_cohort * n_time;
        let (mut numerator, mut denominator, mut base, mut extended) =
            (Vec::with_capacity(cells), Vec::with_capacity(cells), Vec::with_capacity(cells), Vec::new());
        for (i, &m) in maxtime.iter().enumerate() {
            for j in 0..n_time {
                numerator.push(j);
                denominator.push(m);
                base.push(observed[i * n_time + m]);
                extended.push(j > m);
            }
        }
        let at_maxtime: Vec<usize> = maxtime.iter().enumerate().map(|(i, &m)| i * n_time + m).collect();
        let completion = Completion {
            ratio_times: IndexArray::new("t_idx", &t_idx[..n_time], n_time, device).map_err(model_error)?,
            numerator: IndexArray::new("step_ratio numerator", &numerator, n_time, device).map_err(model_error)?,
            denominator: IndexArray::new("cohort_maxtime", &denominator, n_time, device).map_err(model_error)?,
            base: row(base, device),
            fixed: row(observed, device),
            extended: Tensor::from_data(TensorData::new(extended, [1, cells]), device),
            at_maxtime: IndexArray::new("cohort_maxtime", &at_maxtime, cells, device).map_err(model_error)?,
        };
        let f32s = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<_>>();
        let ln_t: Vec<f32> = t_value.iter().map(|&t| t.ln().max(-1e30) as f32).collect();
        let premium_rows: Vec<f32> = cohort_id.iter().map(|&c| premium[c] as f32).collect();
        Ok(Self {
            growth,
            cohorts: n_cohort,
            times: n_time,
            ln_t: row(ln_t, device),
            cohort_id: IndexArray::new("cohort_id", &cohort_id, n_cohort, device).map_err(model_error)?,
            t_idx: IndexArray::new("t_idx", &t_idx, n_time, device).map_err(model_error)?,
            premium_rows: row(premium_rows, device),
            premium: row(f32s(&premium), device),
            loss: row(f32s(&loss), device),
            completion,
        })
    }

    /// `gf` `[n, n_time]`.
    fn growth_factor(&self, p: &Vars) -> Result<Tensor<2>, ModelError> {
        let z = p.get("omega")? * (self.ln_t.clone() - p.get("theta")?.log());
        Ok(match self.growth {
            Growth::Weibull => inv_cloglog(z),
            Growth::LogLogistic => inv_logit(z),
        })
    }
}

impl Program for LossCurve {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        ParamLayout::new()
            .positive("omega", &[])?
            .positive("theta", &[])?
            .positive("LR", &[self.cohorts])?
            .real("mu_LR", &[])?
            .positive("sd_LR", &[])?
            .positive("loss_sd", &[])
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let lr = p.get("LR")?;
        let gf = p.transformed_shaped("gf", &[self.times], self.growth_factor(p)?);
        let lm = self.cohort_id.take(lr.clone(), 1)? * self.premium_rows.clone() * self.t_idx.take(gf, 1)?;
        let lm = p.transformed_shaped("lm", &[self.cohort_id.len()], lm);
        *target += Normal::new(0.0, 0.5)?.log_prob(p.get("mu_LR")?);
        *target += LogNormal::new(0.0, 0.5)?.log_prob(p.get("sd_LR")?);
        *target += LogNormal::new(p.get("mu_LR")?, p.get("sd_LR")?)?.log_prob(lr);
        *target += LogNormal::new(0.0, 0.7)?.log_prob(p.get("loss_sd")?);
        *target += LogNormal::new(0.0, 0.5)?.log_prob(p.get("omega")?);
        *target += LogNormal::new(0.0, 0.5)?.log_prob(p.get("theta")?);
        let scale = p.get("loss_sd")? * self.premium_rows.clone();
        *target += Normal::new(lm, scale)?.log_prob(self.loss.clone());
        Ok(())
    }

    fn generated(&self, p: &Vars, out: &mut Generated) -> Result<(), ModelError> {
        let (lr, gf) = (p.get("LR")?, self.growth_factor(p)?);
        let n = lr.dims()[0];
        let (c, t) = (self.cohorts, self.times);
        let scaled = lr.clone() * self.premium.clone(); // [n, C]
        let loss_sample = scaled.reshape([n, c, 1]) * gf.clone().reshape([n, 1, t]);
        let completion = &self.completion;
        let at = completion.ratio_times.take(gf, 1)?; // gf[t_idx[j]], [n, T]
        let ratio = completion.numerator.take(at.clone(), 1)? / completion.denominator.take(at.clone(), 1)?;
        let prediction = (ratio * completion.base.clone()).mask_where(
            completion.extended.clone().bool_not().expand([n, c * t]),
            completion.fixed.clone().expand([n, c * t]),
        );
        // step_ratio[i, 1] = 1, step_ratio[i, j] = gf[t_idx[j]] / gf[t_idx[j - 1]]: alike in every row.
        let steps = match t {
            1 => Tensor::ones([n, 1], &at.device()),
            _ => Tensor::cat(
                vec![Tensor::ones([n, 1], &at.device()), at.clone().narrow(1, 1, t - 1) / at.narrow(1, 0, t - 1)],
                1,
            ),
        };
        let step_ratio = steps.reshape([n, 1, t]).repeat_dim(1, c);
        let last: Vec<usize> = (0..c).map(|i| i * t + t - 1).collect();
        let last = IndexArray::new("n_time", &last, c * t, &prediction.device())?;
        let efc = (last.take(prediction.clone(), 1)? - completion.at_maxtime.take(prediction.clone(), 1)?).sum_dim(1);
        out.output_shaped("loss_sample", &[c, t], loss_sample.reshape([n, c * t]));
        out.output_shaped("loss_prediction", &[c, t], prediction);
        out.output_shaped("step_ratio", &[c, t], step_ratio.reshape([n, c * t]));
        out.output_shaped("mu_LR_exp", &[], p.get("mu_LR")?.exp());
        out.output_shaped("ppc_minLR", &[], lr.clone().min_dim(1));
        out.output_shaped("ppc_maxLR", &[], lr.max_dim(1));
        out.output_shaped("ppc_EFC", &[], efc);
        Ok(())
    }
}
