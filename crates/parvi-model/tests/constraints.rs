//! Stan's constraint transforms in the layout (`lower`, `upper`, `offset_multiplier`,
//! `positive_ordered`, `simplex`, `cholesky_factor_corr`, `cholesky_factor_cov`): values against
//! an independent `f64` transcription of Stan math's `*_constrain` written here, log-Jacobians
//! against log |det| of finite-difference Jacobians (of the square part of the non-square maps)
//! and against Stan's formulas, round trips through `unconstrain`, autodiff gradients of the
//! log-Jacobian against finite differences, and errors that name the block.

use parvi_model::burn::tensor::{DType, Device, Tensor, TensorData};
use parvi_model::{BackendKind, Constraint, ModelError, ParamLayout, value_and_grad};
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};

/// An f64 constraint map: values and log-Jacobian.
type ExactMap = Box<dyn Fn(&[f64]) -> (Vec<f64>, f64)>;

fn flex() -> Device {
    BackendKind::Flex.device().unwrap()
}

/// Row-major `[rows, cols]` values as an `f64` tensor.
fn matrix64(values: &[f64], rows: usize, device: &Device) -> Tensor<2> {
    let cols = values.len() / rows;
    Tensor::from_data(TensorData::new(values.to_vec(), [rows, cols]), (device, DType::F64))
}

/// A tensor's values as `f64`, read in its own dtype.
fn host<const D: usize>(t: &Tensor<D>) -> Vec<f64> {
    t.to_data().convert::<f64>().try_to_vec::<f64>().unwrap()
}

/// `n * d` seeded standard normal values, scaled.
fn normals(len: usize, scale: f64, seed: u64) -> Vec<f64> {
    let mut rng = chacha20::ChaCha8Rng::seed_from_u64(seed);
    (0..len).map(|_| scale * Distribution::<f64>::sample(&StandardNormal, &mut rng)).collect::<Vec<f64>>()
}

// ---------------------------------------------------------------------------------------------
// Independent f64 transforms, transcribed from Stan math's `stan/math/prim/constraint/` loops
// (one particle at a time, no tensors): constrained values (row-major) and the log-Jacobian.

fn inv_logit(u: f64) -> f64 {
    1.0 / (1.0 + (-u).exp())
}

fn lower_f64(x: &[f64], lo: f64) -> (Vec<f64>, f64) {
    (x.iter().map(|v| v.exp() + lo).collect(), x.iter().sum())
}

fn upper_f64(x: &[f64], hi: f64) -> (Vec<f64>, f64) {
    (x.iter().map(|v| hi - v.exp()).collect(), x.iter().sum())
}

fn offset_multiplier_f64(x: &[f64], o: f64, m: f64) -> (Vec<f64>, f64) {
    (x.iter().map(|v| o + m * v).collect(), x.len() as f64 * m.ln())
}

fn positive_ordered_f64(x: &[f64]) -> (Vec<f64>, f64) {
    let mut y = vec![x[0].exp()];
    for v in &x[1..] {
        y.push(y[y.len() - 1] + v.exp());
    }
    (y, x.iter().sum())
}

/// Stan math's `simplex_constrain(y, lp)`.
fn simplex_f64(x: &[f64]) -> (Vec<f64>, f64) {
    let km1 = x.len();
    let mut y = vec![0.0; km1 + 1];
    let mut stick = 1.0;
    let mut lp = 0.0;
    for (k, (&free, value)) in x.iter().zip(y.iter_mut()).enumerate() {
        let adj = free - ((km1 - k) as f64).ln();
        let z = inv_logit(adj);
        *value = stick * z;
        lp += stick.ln() - (-adj).exp().ln_1p() - adj.exp().ln_1p();
        stick -= *value;
    }
    y[km1] = stick;
    (y, lp)
}

/// Stan math's `cholesky_corr_constrain(y, K, lp)` (with `corr_constrain`: `tanh`, `log1m(z^2)`).
fn cholesky_corr_f64(x: &[f64], k: usize) -> (Vec<f64>, f64) {
    let mut lp = 0.0;
    let z: Vec<f64> = x
        .iter()
        .map(|v| {
            let t = v.tanh();
            lp += (1.0 - t * t).ln();
            t
        })
        .collect();
    let mut l = vec![0.0; k * k];
    l[0] = 1.0;
    let mut pos = 0;
    for i in 1..k {
        l[i * k] = z[pos];
        pos += 1;
        let mut sum_sqs = l[i * k] * l[i * k];
        for j in 1..i {
            lp += 0.5 * (1.0 - sum_sqs).ln();
            l[i * k + j] = z[pos] * (1.0 - sum_sqs).sqrt();
            pos += 1;
            sum_sqs += l[i * k + j] * l[i * k + j];
        }
        l[i * k + i] = (1.0 - sum_sqs).sqrt();
    }
    (l, lp)
}

/// Stan math's `cholesky_factor_constrain(x, M, N, lp)`.
fn cholesky_cov_f64(x: &[f64], m: usize, n: usize) -> (Vec<f64>, f64) {
    let mut y = vec![0.0; m * n];
    let mut pos = 0;
    let mut lp = 0.0;
    for r in 0..n {
        for c in 0..r {
            y[r * n + c] = x[pos];
            pos += 1;
        }
        y[r * n + r] = x[pos].exp();
        lp += x[pos];
        pos += 1;
    }
    for r in n..m {
        for c in 0..n {
            y[r * n + c] = x[pos];
            pos += 1;
        }
    }
    (y, lp)
}

/// One constrained block to check: its layout, the independent transform, and which constrained
/// coordinates form a square map of the free ones (for log |det| of the Jacobian).
struct Case {
    name: &'static str,
    layout: ParamLayout,
    exact: ExactMap,
    square: Vec<usize>,
    free: usize,
    size: usize,
    /// Scale of the random free values.
    scale: f64,
}

fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    let mut push = |name: &'static str,
                    layout: Result<ParamLayout, ModelError>,
                    exact: ExactMap,
                    square: Vec<usize>,
                    scale: f64| {
        let layout = layout.unwrap();
        let (free, size) = (layout.dim(), layout.constrained_dim());
        out.push(Case { name, layout, exact, square, free, size, scale });
    };
    let all = |n: usize| (0..n).collect::<Vec<_>>();
    push("lower", ParamLayout::new().lower("b", &[2, 2], -1.5), Box::new(|x| lower_f64(x, -1.5)), all(4), 1.0);
    push("upper", ParamLayout::new().upper("b", &[3], 2.5), Box::new(|x| upper_f64(x, 2.5)), all(3), 1.0);
    push(
        "offset_multiplier",
        ParamLayout::new().offset_multiplier("b", &[3], 0.7, 2.5),
        Box::new(|x| offset_multiplier_f64(x, 0.7, 2.5)),
        all(3),
        1.0,
    );
    push("positive_ordered", ParamLayout::new().positive_ordered("b", 4), Box::new(positive_ordered_f64), all(4), 1.0);
    for k in [2usize, 3, 5] {
        // The first K - 1 values determine the last: that map is square.
        push("simplex", ParamLayout::new().simplex("b", k), Box::new(simplex_f64), all(k - 1), 1.0);
    }
    for (m, k) in [(2usize, 2usize), (3, 3)] {
        // `array[M] simplex[K]`: each row a simplex, its first K - 1 values the square part.
        let heads: Vec<usize> = (0..m).flat_map(|r| (0..k - 1).map(move |j| r * k + j)).collect();
        let rows = move |x: &[f64]| {
            let (mut y, mut lj) = (Vec::new(), 0.0);
            for row in x.chunks(k - 1) {
                let (v, l) = simplex_f64(row);
                y.extend(v);
                lj += l;
            }
            (y, lj)
        };
        push("simplex_array", ParamLayout::new().simplex_array("b", m, k), Box::new(rows), heads, 1.0);
    }
    for k in [2usize, 3, 4] {
        // The strict lower triangle determines the diagonal (unit rows): that map is square.
        let strict: Vec<usize> = (0..k).flat_map(|i| (0..i).map(move |j| i * k + j)).collect();
        push(
            "cholesky_factor_corr",
            ParamLayout::new().cholesky_factor_corr("b", k),
            Box::new(move |x| cholesky_corr_f64(x, k)),
            strict,
            0.7,
        );
    }
    for (m, n) in [(1usize, 1usize), (3, 3), (4, 2)] {
        let trapezoid: Vec<usize> = (0..m).flat_map(|r| (0..n.min(r + 1)).map(move |c| r * n + c)).collect();
        push(
            "cholesky_factor_cov",
            ParamLayout::new().cholesky_factor_cov("b", m, n),
            Box::new(move |x| cholesky_cov_f64(x, m, n)),
            trapezoid,
            1.0,
        );
    }
    out
}

/// log |det A| of a square row-major matrix by Gaussian elimination with partial pivoting.
fn log_abs_det(mut a: Vec<f64>, d: usize) -> f64 {
    let mut out = 0.0;
    for col in 0..d {
        let pivot = (col..d).max_by(|&r, &s| a[r * d + col].abs().total_cmp(&a[s * d + col].abs())).unwrap();
        for c in 0..d {
            a.swap(col * d + c, pivot * d + c);
        }
        let p = a[col * d + col];
        out += p.abs().ln();
        for r in col + 1..d {
            let f = a[r * d + col] / p;
            for c in col..d {
                a[r * d + c] -= f * a[col * d + c];
            }
        }
    }
    out
}

/// Values and log-Jacobian of the layout's batched transform, in f64, for `rows` particles.
fn layout_f64(layout: &ParamLayout, x: &[f64], rows: usize, device: &Device) -> (Vec<f64>, Vec<f64>) {
    let unpacked = layout.unpack(matrix64(x, rows, device));
    let lj = host(&unpacked.log_jacobian());
    let y = host(&layout.constrain(matrix64(x, rows, device)));
    (y, lj)
}

/// (a) The batched transform computes Stan's values and log-Jacobian, particle by particle.
#[test]
fn values_and_log_jacobians_match_stan_math() {
    let device = flex();
    for (c, case) in cases().iter().enumerate() {
        let rows = 6;
        let x = normals(rows * case.free, case.scale, 10 + c as u64);
        let (y, lj) = layout_f64(&case.layout, &x, rows, &device);
        assert_eq!(y.len(), rows * case.size, "{}", case.name);
        for r in 0..rows {
            let (want, want_lj) = (case.exact)(&x[r * case.free..(r + 1) * case.free]);
            for (i, (&a, &b)) in y[r * case.size..(r + 1) * case.size].iter().zip(&want).enumerate() {
                assert!((a - b).abs() <= 1e-12 * b.abs().max(1.0), "{} row {r} value {i}: {a} vs {b}", case.name);
            }
            assert!(
                (lj[r] - want_lj).abs() <= 1e-11 * want_lj.abs().max(1.0),
                "{} row {r}: {} vs {want_lj}",
                case.name,
                lj[r]
            );
        }
        // The default f32 path agrees to f32 rounding.
        let x32 = Tensor::<2>::from_data(TensorData::new(x.clone(), [rows, case.free]), &device);
        let y32 = host(&case.layout.constrain(x32.clone()));
        let lj32 = host(&case.layout.unpack(x32).log_jacobian());
        for (a, b) in y32.iter().zip(&y) {
            assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{} f32 value {a} vs {b}", case.name);
        }
        for (a, b) in lj32.iter().zip(&lj) {
            assert!((a - b).abs() <= 1e-4 * b.abs().max(1.0), "{} f32 log-Jacobian {a} vs {b}", case.name);
        }
    }
}

/// (b) The log-Jacobian is log |det| of the Jacobian of the map from the free values to the
/// square part of the constrained ones, by central differences of the layout's own transform
/// (all perturbed points in one batch).
#[test]
fn log_jacobians_are_log_det_of_finite_difference_jacobians() {
    let device = flex();
    let h = 1e-6;
    for (c, case) in cases().iter().enumerate() {
        let d = case.free;
        assert_eq!(case.square.len(), d, "{}: the square part has as many values as the free part", case.name);
        for trial in 0..3 {
            let x = normals(d, case.scale, 100 + 7 * c as u64 + trial);
            // Rows 2j and 2j + 1: x + h e_j and x - h e_j; the last row is x itself.
            let mut batch = Vec::with_capacity((2 * d + 1) * d);
            for j in 0..d {
                for sign in [1.0, -1.0] {
                    batch.extend(x.iter().enumerate().map(|(i, &v)| if i == j { v + sign * h } else { v }));
                }
            }
            batch.extend_from_slice(&x);
            let (y, lj) = layout_f64(&case.layout, &batch, 2 * d + 1, &device);
            let size = case.size;
            let mut jac = vec![0.0; d * d];
            for j in 0..d {
                for (a, &i) in case.square.iter().enumerate() {
                    jac[a * d + j] = (y[2 * j * size + i] - y[(2 * j + 1) * size + i]) / (2.0 * h);
                }
            }
            let fd = log_abs_det(jac, d);
            let got = lj[2 * d];
            let (_, stan) = (case.exact)(&x);
            assert!(
                (got - fd).abs() <= 1e-6 * fd.abs().max(1.0),
                "{} trial {trial}: {got} vs log|det J| {fd}",
                case.name
            );
            assert!(
                (got - stan).abs() <= 1e-11 * stan.abs().max(1.0),
                "{} trial {trial}: {got} vs Stan's {stan}",
                case.name
            );
        }
    }
}

/// (c) `unconstrain` inverts `constrain`, on a layout that mixes every constraint.
#[test]
fn unconstrain_inverts_constrain() {
    let device = flex();
    let layout = ParamLayout::new()
        .real("a", &[2])
        .unwrap()
        .lower("lo", &[2], 3.0)
        .unwrap()
        .simplex("theta", 4)
        .unwrap()
        .upper("hi", &[], -2.0)
        .unwrap()
        .cholesky_factor_corr("L", 3)
        .unwrap()
        .offset_multiplier("z", &[2], -1.0, 0.5)
        .unwrap()
        .positive_ordered("c", 3)
        .unwrap()
        .cholesky_factor_cov("S", 3, 2)
        .unwrap()
        .simplex("one", 1)
        .unwrap()
        .cholesky_factor_corr("one_corr", 1)
        .unwrap()
        .interval("p", &[], 0.0, 1.0)
        .unwrap();
    // Free widths: 2 + 2 + 3 + 1 + 3 + 2 + 3 + 5 + 0 + 0 + 1.
    assert_eq!(layout.dim(), 22);
    // Constrained sizes: 2 + 2 + 4 + 1 + 9 + 2 + 3 + 6 + 1 + 1 + 1.
    assert_eq!(layout.constrained_dim(), 32);
    let offsets: Vec<usize> = layout.blocks().iter().map(|b| b.offset).collect();
    assert_eq!(offsets, [0, 2, 4, 7, 8, 11, 13, 16, 21, 21, 21]);
    let rows = 5;
    let x = normals(rows * layout.dim(), 1.0, 7);
    let y = host(&layout.constrain(matrix64(&x, rows, &device)));
    for r in 0..rows {
        let back = layout.unconstrain(&y[r * 32..(r + 1) * 32]).unwrap();
        for (i, (a, b)) in back.iter().zip(&x[r * 22..(r + 1) * 22]).enumerate() {
            assert!((a - b).abs() <= 1e-9 * b.abs().max(1.0), "row {r} coordinate {i}: {a} vs {b}");
        }
    }
    let unpacked = layout.unpack(matrix64(&x, rows, &device));
    assert_eq!(unpacked.get::<3>("L").unwrap().dims(), [rows, 3, 3]);
    assert_eq!(unpacked.get::<3>("S").unwrap().dims(), [rows, 3, 2]);
    assert_eq!(unpacked.get::<2>("theta").unwrap().dims(), [rows, 4]);
    assert_eq!(host(&unpacked.flat("one").unwrap()), vec![1.0; rows]);
    assert_eq!(host(&unpacked.get::<3>("one_corr").unwrap()), vec![1.0; rows]);
}

/// (d) Autodiff gradients of the summed log-Jacobian (and of a weighted sum of the values, which
/// runs the backward pass through every gather) against central differences of the f64
/// transcription of Stan math.
#[test]
fn log_jacobian_gradients_match_finite_differences() {
    let device = flex();
    let h = 1e-6;
    for (c, case) in cases().iter().enumerate() {
        let d = case.free;
        let rows = 3;
        let x = normals(rows * d, case.scale, 500 + c as u64);
        let weights = normals(case.size, 1.0, 900 + c as u64);
        let w = matrix64(&weights, 1, &device);
        let layout = &case.layout;
        let (_, grad) = value_and_grad(matrix64(&x, rows, &device), |p| {
            let unpacked = layout.unpack(p.clone());
            let values = (layout.constrain(p) * w.clone()).sum_dim(1).reshape([rows]);
            unpacked.log_jacobian() + values
        })
        .unwrap();
        let grad = host(&grad);
        let objective = |v: &[f64]| {
            let (y, lj) = (case.exact)(v);
            lj + y.iter().zip(&weights).map(|(a, b)| a * b).sum::<f64>()
        };
        for r in 0..rows {
            for j in 0..d {
                let mut plus = x[r * d..(r + 1) * d].to_vec();
                let mut minus = plus.clone();
                plus[j] += h;
                minus[j] -= h;
                let fd = (objective(&plus) - objective(&minus)) / (2.0 * h);
                let ad = grad[r * d + j];
                assert!(
                    (ad - fd).abs() <= 1e-6 * fd.abs().max(1.0),
                    "{} row {r} coordinate {j}: {ad} vs {fd}",
                    case.name
                );
            }
        }
    }
}

/// Far in the tails, the f32 transforms and their gradients stay finite (the saturated `tanh`
/// and stick-breaking are computed in log space; only the diagonal of a covariance factor goes
/// through `exp`).
#[test]
fn tails_stay_finite_in_f32() {
    let device = flex();
    let layout = ParamLayout::new()
        .simplex("s", 4)
        .unwrap()
        .cholesky_factor_corr("L", 3)
        .unwrap()
        .cholesky_factor_cov("S", 2, 2)
        .unwrap();
    assert_eq!(layout.dim(), 3 + 3 + 3);
    for v in [-60.0f32, 60.0, -200.0, 200.0] {
        // The covariance factor's off-diagonal value is large too; its diagonal stays moderate.
        let row = vec![v, -v, v, v, -v, v, 0.5, v, -0.5];
        let x = Tensor::<2>::from_data(TensorData::new(row, [1, 9]), &device);
        let (lj, grad) = value_and_grad(x.clone(), |p| layout.unpack(p).log_jacobian()).unwrap();
        let y = host(&layout.constrain(x));
        assert!(y.iter().all(|v| v.is_finite()), "values at {v}: {y:?}");
        assert!(host(&lj).iter().all(|v| v.is_finite()), "log-Jacobian at {v}");
        assert!(host(&grad).iter().all(|v| v.is_finite()), "gradient at {v}: {:?}", host(&grad));
    }
}

fn message(e: ModelError) -> String {
    e.to_string()
}

/// (e) Constrained values outside the support are refused with the block and the element named.
#[test]
fn bad_constrained_values_name_the_block_and_element() {
    let refuse = |layout: &ParamLayout, values: &[f64], wants: &[&str]| {
        let msg = message(layout.unconstrain(values).unwrap_err());
        for want in wants {
            assert!(msg.contains(want), "`{msg}` lacks `{want}`");
        }
    };
    let simplex = ParamLayout::new().simplex("theta", 3).unwrap();
    refuse(&simplex, &[0.5, 0.5, 0.1], &["`theta`", "sum to 1.1"]);
    refuse(&simplex, &[0.5, 0.5 + 2e-8, 0.0 - 2e-8], &["`theta`", "element [2]", "positive"]);
    refuse(&simplex, &[1.2, -0.2, 0.0], &["`theta`", "element [1]"]);
    refuse(&simplex, &[0.5, 0.5, 0.0], &["`theta`", "element [2]"]);
    refuse(&simplex, &[0.5, f64::NAN, 0.5], &["`theta`", "element [1]", "not finite"]);
    assert!(simplex.unconstrain(&[0.2, 0.3, 0.5 + 5e-9]).is_ok(), "within Stan's tolerance");
    refuse(&simplex, &[0.5, 0.5], &["2 columns", "dimension 3"]);

    let po = ParamLayout::new().positive_ordered("c", 3).unwrap();
    refuse(&po, &[1.0, 2.0, 2.0], &["`c`", "element [2]", "increase"]);
    refuse(&po, &[0.0, 1.0, 2.0], &["`c`", "element [0]", "positive"]);

    let corr = ParamLayout::new().cholesky_factor_corr("L", 2).unwrap();
    refuse(&corr, &[1.0, 0.0, 0.6, 0.9], &["`L`", "row 1", "norm"]);
    refuse(&corr, &[1.0, 0.1, 0.6, 0.8], &["`L`", "element [0, 1]", "lower triangular"]);
    refuse(&corr, &[1.0, 0.0, 0.6, -0.8], &["`L`", "element [1, 1]", "positive diagonal"]);
    refuse(&corr, &[1.0 + 1e-6, 0.0, 0.6, 0.8], &["`L`", "row 0"]);
    assert!(corr.unconstrain(&[1.0, 0.0, 0.6, 0.8]).is_ok());

    let cov = ParamLayout::new().cholesky_factor_cov("S", 3, 2).unwrap();
    refuse(&cov, &[1.0, 0.0, 0.5, -2.0, 0.1, 0.2], &["`S`", "element [1, 1]", "positive diagonal"]);
    refuse(&cov, &[1.0, 0.3, 0.5, 2.0, 0.1, 0.2], &["`S`", "element [0, 1]", "lower triangular"]);
    assert!(cov.unconstrain(&[1.0, 0.0, 0.5, 2.0, -0.1, 0.2]).is_ok(), "rows below N are free");

    let bounds = ParamLayout::new().lower("lo", &[2], 1.0).unwrap().upper("hi", &[2, 2], 0.0).unwrap();
    refuse(&bounds, &[2.0, 1.0, -1.0, -1.0, -1.0, -1.0], &["`lo`", "element [1]", "(1, inf)"]);
    refuse(&bounds, &[2.0, 3.0, -1.0, -1.0, 0.5, -1.0], &["`hi`", "element [1, 0]", "(-inf, 0)"]);
}

/// (e) Declarations that do not fit the constraint are refused with the block named.
#[test]
fn bad_declarations_name_the_block() {
    let refuse = |result: Result<ParamLayout, ModelError>, wants: &[&str]| {
        let msg = message(result.unwrap_err());
        for want in wants {
            assert!(msg.contains(want), "`{msg}` lacks `{want}`");
        }
    };
    let new = ParamLayout::new;
    refuse(new().add("s", &[2, 2, 2], Constraint::Simplex), &["`s`", "vector"]);
    refuse(new().add("p", &[], Constraint::PositiveOrdered), &["`p`", "vector"]);
    refuse(new().add("L", &[3, 2], Constraint::CholeskyFactorCorr), &["`L`", "[K, K]"]);
    refuse(new().add("L", &[3], Constraint::CholeskyFactorCorr), &["`L`", "[K, K]"]);
    refuse(new().cholesky_factor_cov("S", 2, 3), &["`S`", "M >= N"]);
    refuse(new().simplex("s", 0), &["`s`", "no elements"]);
    refuse(new().cholesky_factor_corr("L", 0), &["`L`", "no elements"]);
    refuse(new().lower("lo", &[1], f64::NEG_INFINITY), &["`lo`", "finite"]);
    refuse(new().upper("hi", &[1], f64::NAN), &["`hi`", "finite"]);
    refuse(new().offset_multiplier("z", &[1], 0.0, 0.0), &["`z`", "multiplier"]);
    refuse(new().offset_multiplier("z", &[1], 0.0, -1.0), &["`z`", "multiplier"]);
    refuse(new().offset_multiplier("z", &[1], f64::INFINITY, 1.0), &["`z`", "offset"]);
    refuse(new().bounded("b", &[1], 1.0, 1.0), &["`b`", "lower < upper"]);
    refuse(new().simplex("s", 3).unwrap().real("s", &[1]), &["`s`", "twice"]);
}
