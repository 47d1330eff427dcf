//! The in-memory data set: features, targets and the standard train/test splits.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::DataError;

/// What the target is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Task {
    /// A real-valued target.
    Regression,
    /// A class label: `0, 1, ..., k - 1`.
    Classification,
}

impl fmt::Display for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Task::Regression => "regression",
            Task::Classification => "classification",
        })
    }
}

/// One train/test partition of a data set's rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Split {
    /// Row indices into [`Dataset`], in index-file order (the order matters: the reference
    /// development set is the tail of this list).
    pub train: Vec<usize>,
    /// Row indices into [`Dataset`] held out for testing.
    pub test: Vec<usize>,
}

/// A loaded data set.
#[derive(Clone, Debug)]
pub struct Dataset {
    /// Canonical registry name (the folder name for the UCI sets).
    pub name: String,
    /// Regression or classification.
    pub task: Task,
    /// Number of input features (columns of `x`).
    pub features: usize,
    /// Number of rows.
    pub rows: usize,
    /// Row-major `[rows, features]`.
    pub x: Vec<f64>,
    /// `[rows]`; the class index `0..k` for classification.
    pub y: Vec<f64>,
    /// The standard splits; seeded 80/20 shuffles for sets that ship none.
    pub splits: Vec<Split>,
}

impl Dataset {
    /// Split `i`, or [`DataError::NoSuchSplit`].
    pub fn split(&self, i: usize) -> Result<&Split, DataError> {
        self.splits.get(i).ok_or_else(|| DataError::NoSuchSplit {
            dataset: self.name.clone(),
            split: i,
            count: self.splits.len(),
        })
    }

    /// Features of row `r`.
    pub fn row(&self, r: usize) -> &[f64] {
        &self.x[r * self.features..(r + 1) * self.features]
    }

    /// The "gap" splits of Foong, Li, Hernández-Lobato & Turner (2019, "In-Between Uncertainty
    /// in Bayesian Neural Networks"), one per input feature: split `f` sorts the rows by feature
    /// `f` (ties by row index) and holds out the middle third, sorted positions
    /// `floor(rows / 3) .. floor(2 rows / 3)`; the outer two thirds train. Both lists are in row
    /// order, so the reference development set (the training list's tail) takes rows from both
    /// sides of the gap.
    pub fn gap_splits(&self) -> Vec<Split> {
        let (lo, hi) = (self.rows / 3, 2 * self.rows / 3);
        (0..self.features)
            .map(|f| {
                let mut order: Vec<usize> = (0..self.rows).collect();
                order.sort_by(|&a, &b| self.x[a * self.features + f].total_cmp(&self.x[b * self.features + f]));
                let mut test = order[lo..hi].to_vec();
                let mut train: Vec<usize> = order[..lo].iter().chain(&order[hi..]).copied().collect();
                test.sort_unstable();
                train.sort_unstable();
                Split { train, test }
            })
            .collect()
    }

    /// The data set with its splits replaced by [`Dataset::gap_splits`].
    pub fn with_gap_splits(&self) -> Dataset {
        Dataset { splits: self.gap_splits(), ..self.clone() }
    }
}
