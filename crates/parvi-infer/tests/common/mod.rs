//! Helpers shared by the engine tests (and, through a path include, the end-to-end tests).
#![allow(dead_code)]

use parvi_infer::EngineRng;
use parvi_model::BackendKind;
use parvi_model::burn::tensor::{Device, Tensor};
use parvi_model::tensor_ops::matrix_from_vec;

pub fn flex() -> Device {
    BackendKind::Flex.device().unwrap()
}

/// Exact draws from `N(mean, cov)` in 2-D (Cholesky on the host).
pub fn gaussian_2d_samples(mean: [f64; 2], cov: [f64; 4], n: usize, seed: u64, device: &Device) -> Tensor<2> {
    let l11 = cov[0].sqrt();
    let l21 = cov[2] / l11;
    let l22 = (cov[3] - l21 * l21).sqrt();
    let mut rng = EngineRng::new(seed);
    let mut v = Vec::with_capacity(2 * n);
    for _ in 0..n {
        let (z1, z2) = (rng.normal(), rng.normal());
        v.push((mean[0] + l11 * z1) as f32);
        v.push((mean[1] + l21 * z1 + l22 * z2) as f32);
    }
    matrix_from_vec(v, n, 2, device)
}

pub fn host(t: &Tensor<2>) -> Vec<f32> {
    parvi_model::tensor_ops::to_vec_f32(t)
}

/// `(mean, standard error)` of a sample.
pub fn mean_se(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, (var / n).sqrt())
}

/// A log-joint that turns NaN once a particle passes x0 > 2, with a drift (about 3) that pushes
/// it there: for the divergence guard's tests.
pub struct NanBeyond;

impl parvi_model::LogDensity for NanBeyond {
    fn dim(&self) -> usize {
        2
    }
    fn log_prob(&self, x: Tensor<2>, _: Option<&parvi_model::Minibatch>) -> Tensor<1> {
        let n = x.dims()[0];
        // sqrt(2 - x0) is NaN past 2.
        let x0 = x.clone().narrow(1, 0, 1);
        (x0.clone().mul_scalar(3.0) + x0.neg().add_scalar(2.0).sqrt().mul_scalar(1e-3)).reshape([n])
    }
}

/// The posteriordb suite folder (`PARVI_POSTERIORDB_DIR`, else `../shared/posteriordb` beside the
/// checkout), or `None` after a skip note; with `PARVI_REQUIRE_POSTERIORDB=1` (CI) a missing
/// suite fails the test instead.
pub fn posteriordb_dir(test: &str) -> Option<std::path::PathBuf> {
    let dir = std::env::var_os("PARVI_POSTERIORDB_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/posteriordb"));
    if dir.join("kidiq-kidscore_momiq").is_dir() {
        return Some(dir);
    }
    assert!(
        std::env::var("PARVI_REQUIRE_POSTERIORDB").as_deref() != Ok("1"),
        "{test}: PARVI_REQUIRE_POSTERIORDB=1 but no posteriordb suite at {}",
        dir.display()
    );
    eprintln!("{test}: skipped, no posteriordb suite (set PARVI_POSTERIORDB_DIR)");
    None
}

/// Neal's funnel in `1 + k` dimensions: `v ~ N(0, 3^2)`, `z_i ~ N(0, e^v)`.
pub struct Funnel {
    pub k: usize,
}

impl parvi_model::LogDensity for Funnel {
    fn dim(&self) -> usize {
        1 + self.k
    }
    fn log_prob(&self, x: Tensor<2>, _: Option<&parvi_model::Minibatch>) -> parvi_model::burn::tensor::Tensor<1> {
        let n = x.dims()[0];
        let v = x.clone().slice([0..n, 0..1]);
        let z = x.slice([0..n, 1..1 + self.k]);
        // log N(v | 0, 9) + sum_i log N(z_i | 0, e^v), constants dropped.
        let lp = v.clone().square().mul_scalar(-1.0 / 18.0)
            - z.square().sum_dim(1).mul(v.clone().neg().exp()).mul_scalar(0.5)
            - v.mul_scalar(0.5 * self.k as f64);
        lp.squeeze_dim(1)
    }
}

/// An in-process group of `size` ranks, one thread each, whose collectives exchange host
/// buffers through shared slots: a sharded step's arithmetic and its exchanges, tested without
/// MPI (tests/mpi.rs runs the real transport).
#[derive(Debug)]
pub struct ThreadGroup {
    rank: usize,
    exchange: std::sync::Arc<Exchange>,
}

#[derive(Debug)]
pub struct Exchange {
    size: usize,
    barrier: std::sync::Barrier,
    slots: std::sync::Mutex<Vec<Vec<f32>>>,
}

impl ThreadGroup {
    /// Runs `body(rank's collective)` on `size` threads; the results in rank order.
    pub fn run<T: Send>(size: usize, body: impl Fn(ThreadGroup) -> T + Sync) -> Vec<T> {
        let exchange = std::sync::Arc::new(Exchange {
            size,
            barrier: std::sync::Barrier::new(size),
            slots: std::sync::Mutex::new(vec![Vec::new(); size]),
        });
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..size)
                .map(|rank| {
                    let group = ThreadGroup { rank, exchange: exchange.clone() };
                    let body = &body;
                    scope.spawn(move || body(group))
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("a rank panicked")).collect()
        })
    }

    /// Every rank's `local`, in rank order.
    fn exchange(&self, local: &[f32]) -> Vec<Vec<f32>> {
        self.exchange.slots.lock().unwrap()[self.rank] = local.to_vec();
        self.exchange.barrier.wait();
        let all = self.exchange.slots.lock().unwrap().clone();
        // No rank writes the next round's slot before every rank has read this one.
        self.exchange.barrier.wait();
        all
    }
}

impl parvi_infer::core::shard::Collective for ThreadGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.exchange.size
    }

    fn all_gather_rows(
        &self,
        local: &[f32],
        counts: &[usize],
        cols: usize,
    ) -> Result<Vec<f32>, parvi_infer::InferError> {
        parvi_infer::core::shard::check_gather(local, counts, cols, self.rank, self.exchange.size)?;
        Ok(self.exchange(local).concat())
    }

    fn all_reduce_sum(&self, local: &[f32]) -> Result<Vec<f32>, parvi_infer::InferError> {
        let all = self.exchange(local);
        Ok((0..local.len()).map(|i| all.iter().map(|v| v[i]).sum()).collect())
    }

    fn abort(&self, message: &str) -> ! {
        panic!("rank {} aborted: {message}", self.rank)
    }
}

/// `x ~ normal(0, I)` in 2-d, written as a `Program`, whose evaluation fails where `x[1] > cut`
/// the way an ODE solve fails: such a row's log density (and gradient) is NaN, and where every
/// row of a call fails (or, with `one_row_fails_call`, any row: an ODE refuses a whole call for
/// one particle's non-finite initial state) the program returns the ODE's error, which
/// `Compiled` records for `take_error` and answers with an untracked NaN. Rejecting every
/// failed proposal samples the normal truncated to `x[1] < cut` ([`truncated_normal`]).
#[derive(Debug)]
pub struct FailsBeyond {
    pub cut: f64,
    pub one_row_fails_call: bool,
}

impl parvi_model::program::Program for FailsBeyond {
    fn parameters(&self) -> Result<parvi_model::ParamLayout, parvi_model::ModelError> {
        parvi_model::ParamLayout::new().real("x", &[2])
    }

    fn model(
        &self,
        p: &parvi_model::program::Vars,
        target: &mut parvi_model::program::Target,
    ) -> Result<(), parvi_model::ModelError> {
        use parvi_model::ode::OdeError;
        let x = p.get("x")?;
        let n = x.dims()[0];
        let x1 = x.clone().narrow(1, 0, 1);
        let beyond: Vec<bool> =
            parvi_model::tensor_ops::to_vec_f32(&x1).iter().map(|&v| f64::from(v) > self.cut).collect();
        let failing = beyond.iter().filter(|&&b| b).count();
        let particle = beyond.iter().position(|&b| b).unwrap_or(0);
        if self.one_row_fails_call && failing > 0 {
            let reason = format!("particle {particle} has a non-finite initial state");
            return Err(OdeError::InvalidArgument { name: "y0", element: None, reason }.into());
        }
        if failing == n {
            let (rel_tol, abs_tol) = (1e-6, 1e-6);
            let (t, t_out, max_num_steps) = (0.5, 1.0, 100);
            return Err(OdeError::MaxNumSteps {
                solver: "ode_rk45",
                particle,
                t,
                t_out,
                max_num_steps,
                rel_tol,
                abs_tol,
            }
            .into());
        }
        *target += x.square().sum_dim(1).mul_scalar(-0.5);
        // NaN past the cut (0 times the root of a negative number), 0 before it.
        *target += x1.neg().add_scalar(self.cut).sqrt().mul_scalar(0.0);
        Ok(())
    }
}

/// The mean and sd of `N(0, 1)` truncated to `(-inf, cut)`: `-phi(c) / Phi(c)` and
/// `sqrt(1 - c phi(c) / Phi(c) - (phi(c) / Phi(c))^2)`.
pub fn truncated_normal(cut: f64) -> (f64, f64) {
    let phi = (-0.5 * cut * cut).exp() / (2.0 * std::f64::consts::PI).sqrt();
    let big_phi = 0.5 * (1.0 + erf(cut / std::f64::consts::SQRT_2));
    let ratio = phi / big_phi;
    (-ratio, (1.0 - cut * ratio - ratio * ratio).sqrt())
}

/// The error function by its Maclaurin series (exact to rounding for the small `x` the tests
/// use).
fn erf(x: f64) -> f64 {
    if x < 0.0 {
        return -erf(-x);
    }
    // Maclaurin series: erf x = 2/sqrt(pi) sum (-1)^k x^(2k+1) / (k! (2k+1)).
    let (mut term, mut sum, mut k) = (x, x, 0.0);
    while term.abs() > 1e-17 {
        k += 1.0;
        term *= -x * x / k;
        sum += term / (2.0 * k + 1.0);
    }
    2.0 / std::f64::consts::PI.sqrt() * sum
}
