//! Rows shared among ranks (`parvi_infer::core::shard::RowShard`): the ranks' shares of the
//! log-joint and of the score add up to the whole model's, with the prior counted once, for
//! every row split, with no minibatch, with a minibatch that spans the shares, and with one that
//! misses some of them. In one process (the MPI runs are in `tests/mpi.rs`).
//!
//! Tolerance: the shares sum the same terms in another order, and each rank's share is
//! `a * (its rows' log-joint) - (a - 1/K) * prior` with `a = N / B` up to 4 here, so float
//! rounding of `f32` sums of a few hundred terms: `1e-4` relative to the largest value compared.
//! Counting the prior `K` times instead of once, or losing a row, moves them by far more.

mod common;

use parvi::infer::Particles;
use parvi::infer::core::shard::{RowShard, RowShare, shard_rows};
use parvi::model::burn::tensor::{Device, Tensor, TensorData};
use parvi::model::tensor_ops::to_vec_f32;
use parvi::model::{LogDensity, Minibatch, score};
use parvi::models::blr::synthetic_rows;
use parvi::models::{Bnn, BnnConfig, BnnTask, LogisticRegression, WeightPrior};

const ROWS: usize = 37;

fn batch(indices: &[i64], device: &Device) -> Minibatch {
    let len = indices.len();
    Minibatch { indices: Tensor::from_data(TensorData::new(indices.to_vec(), [len]), device), len, total: ROWS }
}

/// Largest difference over the largest magnitude of `whole`.
fn gap(whole: &[f32], parts: &[f32]) -> f32 {
    let scale = whole.iter().fold(0f32, |m, v| m.max(v.abs()));
    whole.iter().zip(parts).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale
}

/// Every split into `k` ranks: the shares' log-joints and scores add up to `whole`'s.
fn shares_add_up(
    whole: &dyn LogDensity,
    local: &dyn Fn(std::ops::Range<usize>) -> Box<dyn LogDensity>,
    device: &Device,
) {
    let x =
        Particles::gaussian(6, whole.dim(), 0.0, 0.5, &mut parvi::infer::EngineRng::new(4), device).unwrap().positions;
    // Spanning every share; then rows 0..5 only, which some ranks of 3 and 4 do not hold.
    let batches =
        [None, Some(batch(&[3, 5, 14, 20, 30, 36, 0, 1, 2, 25], device)), Some(batch(&[0, 1, 2, 4, 3], device))];
    for b in &batches {
        let reference = score(whole, x.clone(), b.as_ref()).unwrap();
        let (lp, grad) = (to_vec_f32(&reference.log_prob), to_vec_f32(&reference.grad));
        for k in [1, 2, 3, 4] {
            let (mut lp_sum, mut grad_sum) = (vec![0f32; lp.len()], vec![0f32; grad.len()]);
            for rank in 0..k {
                let rows = shard_rows(ROWS, k, rank);
                let model = local(rows.clone());
                let share = RowShard::new(model.as_ref(), RowShare { total: ROWS, rows }, k, x.clone()).unwrap();
                assert_eq!(share.data_len(), Some(ROWS));
                let s = score(&share, x.clone(), b.as_ref()).unwrap();
                lp_sum.iter_mut().zip(to_vec_f32(&s.log_prob)).for_each(|(a, v)| *a += v);
                grad_sum.iter_mut().zip(to_vec_f32(&s.grad)).for_each(|(a, v)| *a += v);
            }
            let batch_len = b.as_ref().map(|b| b.len);
            assert!(gap(&lp, &lp_sum) < 1e-4, "{k} ranks, batch {batch_len:?}: log-joint off by {}", gap(&lp, &lp_sum));
            assert!(
                gap(&grad, &grad_sum) < 1e-4,
                "{k} ranks, batch {batch_len:?}: score off by {}",
                gap(&grad, &grad_sum)
            );
        }
    }
}

#[test]
fn bnn_row_shares_add_up_to_the_whole_log_joint() {
    let device = common::flex();
    let d = 3;
    let mut rng = parvi::infer::EngineRng::new(9);
    let x: Vec<f64> = (0..ROWS * d).map(|_| rng.normal()).collect();
    let y_reg: Vec<f64> = x.chunks(d).map(|r| r[0] - 0.5 * r[1] + 0.3 * rng.normal()).collect();
    let y_cls: Vec<f64> = y_reg.iter().map(|&v| f64::from(v > -0.4) + f64::from(v > 0.4)).collect();
    let base = BnnConfig { hidden: vec![5], ..BnnConfig::default() };
    let configs = [
        (base.clone(), &y_reg),
        (BnnConfig { prior: WeightPrior::Fixed(2.0), ..base.clone() }, &y_reg),
        (BnnConfig { task: BnnTask::Classification { classes: 3 }, ..base }, &y_cls),
    ];
    for (config, y) in configs {
        let whole = Bnn::from_config(&x, y, d, &config, &device).unwrap();
        let local = |rows: std::ops::Range<usize>| -> Box<dyn LogDensity> {
            Box::new(Bnn::from_config(&x[rows.start * d..rows.end * d], &y[rows], d, &config, &device).unwrap())
        };
        shares_add_up(&whole, &local, &device);
    }
}

#[test]
fn logistic_row_shares_add_up_and_the_synthetic_rows_do_not_depend_on_the_split() {
    let device = common::flex();
    let f = 4;
    let (x, y) = synthetic_rows(0..ROWS, f, 5);
    // Drawn in pieces (across a block boundary too), the rows are the same.
    let (x2, y2) = synthetic_rows(10..ROWS, f, 5);
    assert_eq!((&x[10 * f..], &y[10..]), (&x2[..], &y2[..]));
    let (far, _) = synthetic_rows(4090..4100, f, 5);
    assert_eq!(far[6 * f..7 * f], synthetic_rows(4096..4097, f, 5).0[..]);
    let whole = LogisticRegression::new(&x, &y, f, &device).unwrap();
    let local = |rows: std::ops::Range<usize>| -> Box<dyn LogDensity> {
        let (x, y) = synthetic_rows(rows, f, 5);
        Box::new(LogisticRegression::new(&x, &y, f, &device).unwrap())
    };
    shares_add_up(&whole, &local, &device);
}

/// A share that is not the model's rows, or a model without rows or a separable prior, is
/// refused by name.
#[test]
fn a_share_that_does_not_fit_is_refused_by_name() {
    let device = common::flex();
    let (x, y) = synthetic_rows(0..10, 2, 1);
    let model = LogisticRegression::new(&x, &y, 2, &device).unwrap();
    let probe = Tensor::<2>::zeros([1, 4], &device);
    let err = |share: RowShare, model: &dyn LogDensity| {
        RowShard::new(model, share, 2, probe.clone()).err().unwrap().to_string()
    };
    let e = err(RowShare { total: 20, rows: 0..9 }, &model);
    assert!(e.contains("holds 10 data rows but this rank's share is 9"), "{e}");
    let e = err(RowShare { total: 20, rows: 5..5 }, &model);
    assert!(e.contains("every rank needs at least one row"), "{e}");
    let banana = parvi::models::Banana::default();
    let e = RowShard::new(&banana, RowShare { total: 20, rows: 0..10 }, 2, Tensor::zeros([1, 2], &device))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("no data rows"), "{e}");
    let e = RowShare::of_rank(3, 4, 0).unwrap_err().to_string();
    assert!(e.contains("3 data rows cannot be shared among 4 ranks"), "{e}");
}
