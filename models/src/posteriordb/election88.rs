//! `election88-election88_full`: Gelman & Hill's multilevel logistic regression of the 1988
//! presidential vote, with varying intercepts by age, education, age x education, state and
//! region, each with its own scale on `(0, 100)`.

use burn::tensor::{Device, Tensor};
use parvi_model::dist::{BernoulliLogit, LogProb, Normal};
use parvi_model::index::IndexArray;
use parvi_model::program::{Program, Target, Vars};
use parvi_model::tensor_ops::matrix_from_vec;
use parvi_model::{ModelError, ParamLayout};

use super::PosteriorDbError;
use super::data::Data;

/// The five groupings: the effect vector, its scale, the size field, and the index field.
const GROUPS: [(&str, &str, &str, &str); 5] = [
    ("a", "sigma_a", "n_age", "age"),
    ("b", "sigma_b", "n_edu", "edu"),
    ("c", "sigma_c", "n_age_edu", "age_edu"),
    ("d", "sigma_d", "n_state", "state"),
    ("e", "sigma_e", "n_region_full", "region_full"),
];

/// The model with its data on the device.
#[derive(Debug)]
pub(super) struct Election88 {
    /// The rows the five `beta` multiply, `[5, N]`: `1, black, female, v_prev_full,
    /// female .* black` (the program's `beta[1]` to `beta[5]`).
    design: Tensor<2>,
    /// `age`, `edu`, `age_edu`, `state`, `region_full`, in [`GROUPS`] order.
    groups: Vec<IndexArray>,
    likelihood: BernoulliLogit<2>,
}

impl Election88 {
    /// Reads the data block: the sizes, the five index arrays (each in `1..=` its size: the
    /// data block allows 0, the program's indexing does not), `black` and `female` in `[0, 1]`,
    /// `v_prev_full`, and `y` in `{0, 1}`.
    pub(super) fn new(data: &Data, device: &Device) -> Result<Self, PosteriorDbError> {
        let n = data.size("N", 0)?;
        if n == 0 {
            return Err(data.invalid("N", "must be at least 1: the likelihood needs an observation"));
        }
        let mut groups = Vec::with_capacity(GROUPS.len());
        for (_, _, size_field, index_field) in GROUPS {
            let size = data.size(size_field, 0)?;
            if size == 0 {
                return Err(data.invalid(size_field, "must be at least 1: every respondent is in one group"));
            }
            let indices = data.indices(index_field, n, "N", size)?;
            groups.push(
                IndexArray::new(index_field, &indices, size, device).map_err(super::model_error("election88_full"))?,
            );
        }
        let unit = |field: &str| -> Result<Vec<f64>, PosteriorDbError> {
            let v = data.reals(field, n, "N")?;
            data.check_bounds(field, &v, Some(0.0), Some(1.0))?;
            Ok(v)
        };
        let (black, female) = (unit("black")?, unit("female")?);
        let v_prev = data.reals("v_prev_full", n, "N")?;
        let y = data.ints("y", n, "N")?;
        let y: Vec<f64> = y.iter().map(|&v| v as f64).collect();
        data.check_bounds("y", &y, Some(0.0), Some(1.0))?;
        let interaction = female.iter().zip(&black).map(|(f, b)| f * b);
        let rows: Vec<f32> = std::iter::repeat_n(1.0, n)
            .chain(black.iter().copied())
            .chain(female.iter().copied())
            .chain(v_prev.iter().copied())
            .chain(interaction)
            .map(|v| v as f32)
            .collect();
        let row = matrix_from_vec(y.iter().map(|&v| v as f32).collect(), 1, n, device);
        Ok(Self {
            design: matrix_from_vec(rows, 5, n, device),
            groups,
            likelihood: BernoulliLogit::new(row).map_err(super::model_error("election88_full"))?,
        })
    }
}

impl Program for Election88 {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        let mut layout = ParamLayout::new();
        for ((effect, ..), index) in GROUPS.iter().zip(&self.groups) {
            layout = layout.real(effect, &[index.size()])?;
        }
        layout = layout.real("beta", &[5])?;
        for (_, scale, ..) in GROUPS {
            layout = layout.interval(scale, &[], 0.0, 100.0)?;
        }
        Ok(layout)
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let beta = p.get("beta")?;
        let mut y_hat = beta.clone().matmul(self.design.clone());
        for ((effect, scale, ..), index) in GROUPS.iter().zip(&self.groups) {
            let effect = p.get(effect)?;
            y_hat = y_hat + index.take(effect.clone(), 1)?;
            *target += Normal::new(0.0, p.get(scale)?)?.log_prob(effect);
        }
        *target += Normal::new(0.0, 100.0)?.log_prob(beta);
        let y_hat = p.transformed("y_hat", y_hat);
        *target += self.likelihood.log_prob(y_hat);
        Ok(())
    }
}
