//! `bones_data-bones_model`: BUGS's Bones, skeletal maturity `theta[i]` of `nChild` children
//! from graded indicators of varying category counts (a cumulative logistic model with known
//! discriminations `delta[j]` and thresholds `gamma[j, k]`), missing grades (`-1`) left out.
//!
//! With `Q_k = inv_logit(delta[j] (theta[i] - gamma[j, k]))`, the program's `log(p[i, j, g])`
//! is `log(1 - Q_1)` for the first grade, `log Q_{ncat-1}` for the last, `log(Q_{g-1} - Q_g)`
//! between. The observed cells are gathered into those three groups once: each group is one
//! gather of `theta` and one elementwise expression for every particle.

use burn::tensor::{Device, Tensor};
use parvi_model::dist::{LogProb, Normal};
use parvi_model::functions::{log_inv_logit, log_inv_logit_diff, log1m_inv_logit};
use parvi_model::index::IndexArray;
use parvi_model::program::{Program, Target, Vars};
use parvi_model::tensor_ops::matrix_from_vec;
use parvi_model::{ModelError, ParamLayout};

use super::PosteriorDbError;
use super::data::Data;

/// The observed cells of one kind of grade: the child of each, `delta[j]`, and the thresholds
/// of the cumulative probabilities the grade's probability is made of.
#[derive(Debug)]
struct Cells {
    child: IndexArray,
    /// `[1, cells]`
    delta: Tensor<2>,
    /// `gamma[j, g - 1]` (the first grade: `gamma[j, 1]`), `[1, cells]`.
    upper: Tensor<2>,
    /// `gamma[j, g]` for a middle grade, `[1, cells]`.
    lower: Option<Tensor<2>>,
}

impl Cells {
    /// `delta (theta[child] - gamma)` for the thresholds `gamma`.
    fn logit(&self, theta: &Tensor<2>, gamma: &Tensor<2>) -> Result<Tensor<2>, ModelError> {
        Ok((self.child.take(theta.clone(), 1)? - gamma.clone()) * self.delta.clone())
    }
}

/// The host side of [`Cells`] while the data are read.
#[derive(Default)]
struct CellsBuilder {
    child: Vec<usize>,
    delta: Vec<f32>,
    upper: Vec<f32>,
    lower: Vec<f32>,
}

impl CellsBuilder {
    fn build(self, children: usize, middle: bool, device: &Device) -> Result<Option<Cells>, ModelError> {
        if self.child.is_empty() {
            return Ok(None);
        }
        let row = |v: Vec<f32>| {
            let len = v.len();
            matrix_from_vec(v, 1, len, device)
        };
        Ok(Some(Cells {
            child: IndexArray::new("grade", &self.child, children, device)?,
            delta: row(self.delta),
            upper: row(self.upper),
            lower: middle.then(|| row(self.lower)),
        }))
    }
}

/// The model with its data on the device.
#[derive(Debug)]
pub(super) struct Bones {
    children: usize,
    /// Grade 1: `log(1 - Q_1)`.
    first: Option<Cells>,
    /// Grade `ncat[j]`: `log Q_{ncat - 1}`.
    last: Option<Cells>,
    /// Grades in between: `log(Q_{g-1} - Q_g)`.
    middle: Option<Cells>,
}

impl Bones {
    /// Reads `nChild` (at least 1), `nInd`, `gamma[nInd, 4]`, `delta[nInd]`, `ncat[nInd]` and
    /// `grade[nChild, nInd]`. Beyond the data block, the program's indexing needs each
    /// `ncat[j]` in `2..=5` (`p` has 5 categories, `Q` 4) and each grade `-1` or in
    /// `1..=ncat[j]`; the thresholds a grade uses must be finite.
    pub(super) fn new(data: &Data, device: &Device) -> Result<Self, PosteriorDbError> {
        let children = data.size("nChild", 0)?;
        if children == 0 {
            return Err(data.invalid("nChild", "must be at least 1: theta has an element per child"));
        }
        let indicators = data.size("nInd", 0)?;
        let gamma = data.matrix("gamma", (indicators, "nInd"), (4, "4"))?;
        let delta = data.reals("delta", indicators, "nInd")?;
        let ncat = data.ints("ncat", indicators, "nInd")?;
        if let Some(j) = ncat.iter().position(|&k| !(2..=5).contains(&k)) {
            return Err(data.invalid(
                "ncat",
                format!(
                    "element [{}]: value {} must lie in 2..=5: the program's p has 5 categories and Q 4",
                    j + 1,
                    ncat[j]
                ),
            ));
        }
        let grade = data.int_matrix("grade", (children, "nChild"), (indicators, "nInd"))?;
        let (mut first, mut last, mut middle) =
            (CellsBuilder::default(), CellsBuilder::default(), CellsBuilder::default());
        for (cell, &g) in grade.iter().enumerate() {
            let (i, j) = (cell / indicators, cell % indicators);
            if g == -1 {
                continue;
            }
            let k = ncat[j];
            if !(1..=k).contains(&g) {
                return Err(data.invalid(
                    "grade",
                    format!(
                        "element [{},{}]: value {g} must be -1 (missing) or in 1..=ncat[{}] = {k}",
                        i + 1,
                        j + 1,
                        j + 1
                    ),
                ));
            }
            // 0-based threshold columns: grade g uses gamma[j, g - 1] and gamma[j, g] (1-based).
            let threshold = |col: i64| -> Result<f32, PosteriorDbError> {
                let v = gamma[j * 4 + col as usize];
                if !v.is_finite() {
                    return Err(
                        data.invalid("gamma", format!("element [{},{}]: value {v} must be finite", j + 1, col + 1))
                    );
                }
                Ok(v as f32)
            };
            let group = if g == 1 {
                first.upper.push(threshold(0)?);
                &mut first
            } else if g == k {
                last.upper.push(threshold(g - 2)?);
                &mut last
            } else {
                middle.upper.push(threshold(g - 2)?);
                middle.lower.push(threshold(g - 1)?);
                &mut middle
            };
            group.child.push(i);
            group.delta.push(delta[j] as f32);
        }
        let err = super::model_error("bones_model");
        Ok(Self {
            children,
            first: first.build(children, false, device).map_err(&err)?,
            last: last.build(children, false, device).map_err(&err)?,
            middle: middle.build(children, true, device).map_err(&err)?,
        })
    }
}

impl Program for Bones {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        ParamLayout::new().real("theta", &[self.children])
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let theta = p.get("theta")?;
        *target += Normal::new(0.0, 36.0)?.log_prob(theta.clone());
        if let Some(cells) = &self.first {
            *target += log1m_inv_logit(cells.logit(&theta, &cells.upper)?);
        }
        if let Some(cells) = &self.last {
            *target += log_inv_logit(cells.logit(&theta, &cells.upper)?);
        }
        if let Some(cells) = &self.middle
            && let Some(lower) = &cells.lower
        {
            *target += log_inv_logit_diff(cells.logit(&theta, &cells.upper)?, cells.logit(&theta, lower)?);
        }
        Ok(())
    }
}
