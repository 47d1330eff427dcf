//! The two hidden Markov models of Luis Damiano's StanCon 2018 case study:
//!
//! - `hmm_gaussian`: `K` states, initial distribution `pi1`, transition rows `A[i]` (simplexes),
//!   normal emissions with ordered means `mu` and scales `sigma`, flat priors. The Stan program
//!   writes the forward algorithm in its transformed parameters (`logalpha`) and adds
//!   `log_sum_exp(logalpha[T])`, which is [`hmm_marginal`] with `rho = pi1`.
//! - `iohmm_reg`: an input-output HMM whose "transition" at `t` is `A[t] = softmax(u[t]' w)`,
//!   normal emissions `y[t] ~ normal(u[t]' b[j], sigma[j])`. Its forward step adds `logA[t][i]`
//!   for the *previous* state `i` (the program's own recursion, reproduced as written), so
//!   `logalpha[t][j] = logoblik[t][j] + c_t` with `c_t` the same for every `j`, and
//!   `log_sum_exp(logalpha[T])` is a sum over time of independent log-sum-exps: no recursion
//!   (see [`IohmmReg::log_terms`]).
//!
//! Both report their transformed parameters under Stan's names; they are computed only when a
//! report asks for them ([`Vars::recording`]): `hmm_gaussian`'s `logalpha` is a recursion over
//! time that the density does not need. Both generated blocks are written as the programs have
//! them (the forward-backward smoother and a Viterbi decoding, 8,001 values a draw;
//! `iohmm_reg`'s also fitted states and outputs by `categorical_rng` and `normal_rng`, 9,501).

use burn::tensor::{Device, Tensor};
use parvi_model::dist::{LogProb, Normal};
use parvi_model::functions::softmax;
use parvi_model::hmm::hmm_marginal;
use parvi_model::program::{Generated, Program, Target, Vars};
use parvi_model::tensor_ops::{log_softmax, log_sum_exp, matrix_from_vec};
use parvi_model::{ModelError, ParamLayout};

use super::PosteriorDbError;
use super::data::Data;

/// `[1, T, 1]` observations, broadcast against `[n, 1, K]` state parameters.
fn series(values: &[f64], device: &Device) -> Tensor<3> {
    matrix_from_vec(values.iter().map(|&v| v as f32).collect(), values.len(), 1, device).unsqueeze_dim(0)
}

/// `hmm_gaussian`: `y[t] ~ normal(mu[z_t], sigma[z_t])`, `z_1 ~ pi1`, `z_t ~ A[z_{t-1}]`.
#[derive(Debug)]
pub(super) struct HmmGaussian {
    /// `[1, T, 1]`
    y: Tensor<3>,
    states: usize,
}

impl HmmGaussian {
    pub(super) fn new(data: &Data, device: &Device) -> Result<Self, PosteriorDbError> {
        let (t, k) = (data.size("T", 1)?, data.size("K", 1)?);
        Ok(Self { y: series(&data.reals("y", t, "T")?, device), states: k })
    }

    /// `log p(y_t | z_t = k)` `[n, T, K]`.
    fn log_omega(&self, p: &Vars) -> Result<Tensor<3>, ModelError> {
        let (mu, sigma) = (p.get("mu")?, p.get("sigma")?);
        Ok(Normal::new(mu.unsqueeze_dim::<3>(1), sigma.unsqueeze_dim::<3>(1))?.log_prob(self.y.clone()))
    }
}

/// Stan's forward recursion `logalpha[t, j] = log_sum_exp_i(logalpha[t-1, i] + log_gamma[i, j]) +
/// log_omega[t, j]` from `logalpha[1] = log_rho + log_omega[1]`, all `T` rows: `[n, T * K]`. A
/// loop over time (batched over particles), run only for a report.
fn forward_rows(log_omega: Tensor<3>, log_gamma: Tensor<3>, log_rho: Tensor<2>) -> Tensor<2> {
    let [n, t, k] = log_omega.dims();
    let row = |s: usize| log_omega.clone().narrow(1, s, 1).reshape([n, k]);
    let mut alpha = log_rho + row(0);
    let mut rows = vec![alpha.clone()];
    for s in 1..t {
        let step = alpha.reshape([n, k, 1]) + log_gamma.clone();
        alpha = log_sum_exp(step, 1).reshape([n, k]) + row(s);
        rows.push(alpha.clone());
    }
    Tensor::cat(rows, 1)
}

/// The programs' Viterbi decoding: `delta[1, K]` alone set to `first[K]` (the programs' loop
/// writes `delta[1, K]` for every `j`; the other starts stay Stan's NaN, which no strict
/// comparison picks, so here `-inf`), then `delta[t, j] = max_i(delta[t-1, i] + step(t)[i, j])`
/// with the first maximising `i` kept, `zstar[T]` the last state reaching `max(delta[T])`, and the
/// path traced back. `step(s)` is `[n, K, K]` for the 0-based time `s`. Returns `zstar`
/// (1-based, `[n, T]`) and `logp_zstar` `[n, 1]`.
fn viterbi(first: Tensor<2>, t: usize, step: impl Fn(usize) -> Tensor<3>) -> (Tensor<2>, Tensor<2>) {
    let [n, k] = first.dims();
    let device = first.device();
    let start = first.narrow(1, k - 1, 1);
    let mut delta = match k {
        1 => start,
        _ => Tensor::cat(vec![Tensor::full([n, k - 1], f32::NEG_INFINITY, &device), start], 1),
    };
    let mut pointers = Vec::with_capacity(t);
    for s in 1..t {
        let paths = delta.reshape([n, k, 1]) + step(s);
        pointers.push(paths.clone().argmax(1).reshape([n, k]));
        delta = paths.max_dim(1).reshape([n, k]);
    }
    let logp_zstar = delta.clone().max_dim(1);
    let mut z = delta.flip([1]).argmax(1).mul_scalar(-1).add_scalar(k as i64 - 1).reshape([n, 1]);
    let mut path = vec![z.clone()];
    for pointer in pointers.into_iter().rev() {
        z = pointer.gather(1, z);
        path.push(z.clone());
    }
    path.reverse();
    (Tensor::cat(path, 1).float().add_scalar(1.0), logp_zstar)
}

impl Program for HmmGaussian {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        let k = self.states;
        ParamLayout::new().simplex("pi1", k)?.simplex_array("A", k, k)?.ordered("mu", k)?.positive("sigma", &[k])
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let log_omega = self.log_omega(p)?;
        let log_rho = p.get("pi1")?.log();
        let log_gamma = p.get_shaped::<3>("A")?.log();
        if p.recording() {
            let [_, t, k] = log_omega.dims();
            let rows = forward_rows(log_omega.clone(), log_gamma.clone(), log_rho.clone());
            p.transformed_shaped("logalpha", &[t, k], rows);
        }
        *target += hmm_marginal(log_omega, log_gamma, log_rho)?;
        Ok(())
    }

    /// The program's generated block, as written: the filter `alpha = softmax(logalpha)`, the
    /// backward pass `logbeta` (from `logbeta[T] = 1`) and `beta = softmax(logbeta)`, `loggamma =
    /// alpha .* beta` and its normalisation `gamma`, and the Viterbi path `zstar` with
    /// `logp_zstar`. The program's Viterbi sets only `delta[1, K]` (to state K's emission), so
    /// the other states' start is Stan's NaN, which no comparison picks: every path starts in
    /// state K, reproduced here. Loops over time, batched over draws.
    fn generated(&self, p: &Vars, out: &mut Generated) -> Result<(), ModelError> {
        let log_omega = self.log_omega(p)?;
        let log_gamma = p.get_shaped::<3>("A")?.log(); // [n, i, j]
        let [n, t, k] = log_omega.dims();
        let device = log_omega.device();
        let row = |s: usize| log_omega.clone().narrow(1, s, 1).reshape([n, k]);
        let logalpha = forward_rows(log_omega.clone(), log_gamma.clone(), p.get("pi1")?.log()).reshape([n, t, k]);
        let alpha = softmax(logalpha, 2);
        // logbeta[t - 1, j] = log_sum_exp_i(logbeta[t, i] + log A[j, i] + log_omega[t, i]).
        let mut log_beta = Tensor::<2>::ones([n, k], &device);
        let mut rows = vec![log_beta.clone()];
        for s in (1..t).rev() {
            let paths = (log_beta + row(s)).reshape([n, 1, k]) + log_gamma.clone();
            log_beta = log_sum_exp(paths, 2).reshape([n, k]);
            rows.push(log_beta.clone());
        }
        rows.reverse();
        let log_beta: Tensor<3> = Tensor::stack(rows, 1);
        let beta = softmax(log_beta.clone(), 2);
        let log_gamma_smooth = alpha.clone() * beta.clone();
        let gamma = log_gamma_smooth.clone() / log_gamma_smooth.clone().sum_dim(2);
        let (zstar, logp_zstar) = viterbi(row(0), t, |s| log_gamma.clone() + row(s).reshape([n, 1, k]));
        let flat = |x: Tensor<3>| x.reshape([n, t * k]);
        out.output_shaped("logbeta", &[t, k], flat(log_beta));
        out.output_shaped("loggamma", &[t, k], flat(log_gamma_smooth));
        out.output_shaped("alpha", &[t, k], flat(alpha));
        out.output_shaped("beta", &[t, k], flat(beta));
        out.output_shaped("gamma", &[t, k], flat(gamma));
        out.output_shaped("zstar", &[t], zstar);
        out.output_shaped("logp_zstar", &[], logp_zstar);
        Ok(())
    }
}

/// `iohmm_reg`: inputs `u[t]` (`M` values), `w[j] ~ normal(0, 5)`, `b[j] ~ normal(0, 5)`,
/// `sigma[j] ~ normal(0, 3)`.
#[derive(Debug)]
pub(super) struct IohmmReg {
    /// `u'` `[M, T]`.
    u_t: Tensor<2>,
    /// `[1, T, 1]`
    y: Tensor<3>,
    states: usize,
    inputs: usize,
}

impl IohmmReg {
    pub(super) fn new(data: &Data, device: &Device) -> Result<Self, PosteriorDbError> {
        let (t, k, m) = (data.size("T", 1)?, data.size("K", 1)?, data.size("M", 1)?);
        let y = data.reals("y", t, "T")?;
        let u = data.matrix("u", (t, "T"), (m, "M"))?;
        let u = matrix_from_vec(u.iter().map(|&v| v as f32).collect(), t, m, device);
        Ok(Self { u_t: u.transpose(), y: series(&y, device), states: k, inputs: m })
    }

    /// `u[t]' v[j]` for every `t` and `j` of a parameter `v` (`array[K] vector[M]`): `[n, T, K]`.
    fn regress(&self, v: Tensor<2>) -> Tensor<3> {
        let (n, k, m) = (v.dims()[0], self.states, self.inputs);
        let t = self.u_t.dims()[1];
        v.reshape([n * k, m]).matmul(self.u_t.clone()).reshape([n, k, t]).swap_dims(1, 2)
    }

    /// `unA` (from row 2 on), `logA` (from row 2 on) and `logoblik`, each `[n, T, K]`.
    fn blocks(&self, p: &Vars) -> Result<[Tensor<3>; 3], ModelError> {
        let un_a = self.regress(p.get("w")?);
        let log_a = log_softmax(un_a.clone(), 2);
        let means = self.regress(p.get("b")?);
        let log_oblik = Normal::new(means, p.get("sigma")?.unsqueeze_dim::<3>(1))?.log_prob(self.y.clone());
        Ok([un_a, log_a, log_oblik])
    }

    /// `E[t][i] = logoblik[t][i] + logA[t+1][i]` (no `logA` term at `T`), plus `log pi1[i]` at
    /// `t = 1`: `[n, T, K]`. The program's `log_sum_exp(logalpha[T])` is `sum_t
    /// log_sum_exp_i E[t][i]`, and `logalpha[t][j] = logoblik[t][j] + sum_{s<t}
    /// log_sum_exp_i E[s][i]` for `t >= 2`.
    fn log_terms(log_a: &Tensor<3>, log_oblik: Tensor<3>, log_pi1: Tensor<2>) -> Tensor<3> {
        let [n, t, k] = log_oblik.dims();
        let next = if t > 1 {
            let zeros = Tensor::zeros([n, 1, k], &log_oblik.device());
            Tensor::cat(vec![log_a.clone().narrow(1, 1, t - 1), zeros], 1)
        } else {
            Tensor::zeros([n, 1, k], &log_oblik.device())
        };
        let terms = log_oblik + next;
        let first = terms.clone().narrow(1, 0, 1) + log_pi1.unsqueeze_dim::<3>(1);
        if t == 1 { first } else { Tensor::cat(vec![first, terms.narrow(1, 1, t - 1)], 1) }
    }
}

impl IohmmReg {
    /// `logalpha` `[n, T, K]` from the steps `log_sum_exp_i E[t][i]` `[n, T]`: `logoblik[t][j] +
    /// c_t` with `c_t = sum_{s<t}` of the steps (the exclusive cumulative sum), `log pi1` added at
    /// `t = 1`.
    fn log_alpha(steps: &Tensor<2>, log_oblik: Tensor<3>, log_pi1: Tensor<2>) -> Tensor<3> {
        let [n, t, _] = log_oblik.dims();
        let before = steps.clone().cumsum(1) - steps.clone();
        let log_alpha = log_oblik + before.reshape([n, t, 1]);
        let head = log_alpha.clone().narrow(1, 0, 1) + log_pi1.unsqueeze_dim::<3>(1);
        match t {
            1 => head,
            _ => Tensor::cat(vec![head, log_alpha.narrow(1, 1, t - 1)], 1),
        }
    }
}

impl Program for IohmmReg {
    fn parameters(&self) -> Result<ParamLayout, ModelError> {
        let (k, m) = (self.states, self.inputs);
        ParamLayout::new().simplex("pi1", k)?.real("w", &[k, m])?.real("b", &[k, m])?.positive("sigma", &[k])
    }

    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
        let [un_a, log_a, log_oblik] = self.blocks(p)?;
        let pi1 = p.get("pi1")?;
        let terms = Self::log_terms(&log_a, log_oblik.clone(), pi1.clone().log());
        let [n, t, k] = terms.dims();
        let steps = log_sum_exp(terms, 2).reshape([n, t]);
        if p.recording() {
            // Row 1 of unA, A and logA is the program's filler, pi1 and its log.
            let first = |rest: Tensor<3>, row: Tensor<2>| match t {
                1 => row,
                _ => Tensor::cat(vec![row, rest.narrow(1, 1, t - 1).reshape([n, (t - 1) * k])], 1),
            };
            let log_alpha = Self::log_alpha(&steps, log_oblik.clone(), pi1.clone().log());
            p.transformed_shaped("logalpha", &[t, k], log_alpha.reshape([n, t * k]));
            p.transformed_shaped("unA", &[t, k], first(un_a.clone(), pi1.clone()));
            p.transformed_shaped("A", &[t, k], first(log_a.clone().exp(), pi1.clone()));
            p.transformed_shaped("logA", &[t, k], first(log_a, pi1.log()));
            p.transformed_shaped("logoblik", &[t, k], log_oblik.reshape([n, t * k]));
        }
        *target += Normal::new(0.0, 5.0)?.log_prob(p.get("w")?);
        *target += Normal::new(0.0, 5.0)?.log_prob(p.get("b")?);
        *target += Normal::new(0.0, 3.0)?.log_prob(p.get("sigma")?);
        *target += steps;
        Ok(())
    }

    /// The program's generated block, as written. Its backward step adds `logA[t][i]` of the
    /// next state `i` alone, so `logbeta[t - 1, j]` is one value for every `j`, `logbeta[t] +
    /// log_sum_exp_i(logA[t][i] + logoblik[t][i])` (a reverse cumulative sum from `logbeta[T] =
    /// 1`), `beta` is uniform and `gamma = alpha`; `hatpi[t] = softmax(u[t]' w)` (at `t = 1`
    /// too), `hatz[t] ~ categorical(hatpi[t])` (as `categorical_logit_rng` of `u[t]' w`), `haty[t]
    /// ~ normal(u[t]' b[hatz[t]], sigma[hatz[t]])`, and the Viterbi path of [`viterbi`].
    fn generated(&self, p: &Vars, out: &mut Generated) -> Result<(), ModelError> {
        let [un_a, log_a, log_oblik] = self.blocks(p)?;
        let pi1 = p.get("pi1")?;
        let terms = Self::log_terms(&log_a, log_oblik.clone(), pi1.clone().log());
        let [n, t, k] = terms.dims();
        let steps = log_sum_exp(terms, 2).reshape([n, t]);
        let alpha = softmax(Self::log_alpha(&steps, log_oblik.clone(), pi1.clone().log()), 2);
        // logbeta[t - 1] = logbeta[t] + back[t], back[t] = log_sum_exp_i(logA[t][i] + logoblik[t][i]).
        let back = log_sum_exp(log_a.clone() + log_oblik.clone(), 2).reshape([n, t]);
        let after = back.clone().flip([1]).cumsum(1).flip([1]) - back; // sum_{s > t} back[s]
        let log_beta = after.add_scalar(1.0).reshape([n, t, 1]).expand([n, t, k]);
        let beta = softmax(log_beta.clone(), 2);
        let log_gamma_smooth = alpha.clone() * beta.clone();
        let gamma = log_gamma_smooth.clone() / log_gamma_smooth.clone().sum_dim(2);
        let hatpi = softmax(un_a.clone(), 2);
        let hatz = out.categorical_logit_rng(un_a.reshape([n * t, k]))?.reshape([n, t]); // 1-based
        let chosen = hatz.clone().sub_scalar(1.0).int().reshape([n, t, 1]);
        let means = self.regress(p.get("b")?).gather(2, chosen.clone()).reshape([n, t]);
        let sigma = p.get("sigma")?.unsqueeze_dim::<3>(1).expand([n, t, k]).gather(2, chosen).reshape([n, t]);
        let haty = out.normal_rng(means, sigma)?;
        // Viterbi: delta[t, j] = max_i(delta[t-1, i] + logA[t][i] + logoblik[t][j]).
        let row = |x: &Tensor<3>, s: usize| x.clone().narrow(1, s, 1).reshape([n, k]);
        let (zstar, logp_zstar) = viterbi(row(&log_oblik, 0), t, |s| {
            row(&log_a, s).reshape([n, k, 1]) + row(&log_oblik, s).reshape([n, 1, k])
        });
        let flat = |x: Tensor<3>| x.reshape([n, t * k]);
        out.output_shaped("logbeta", &[t, k], flat(log_beta));
        out.output_shaped("loggamma", &[t, k], flat(log_gamma_smooth));
        out.output_shaped("alpha", &[t, k], flat(alpha));
        out.output_shaped("beta", &[t, k], flat(beta));
        out.output_shaped("gamma", &[t, k], flat(gamma));
        out.output_shaped("hatpi", &[t, k], flat(hatpi));
        out.output_shaped("hatz", &[t], hatz);
        out.output_shaped("haty", &[t], haty);
        out.output_shaped("zstar", &[t], zstar);
        out.output_shaped("logp_zstar", &[], logp_zstar);
        Ok(())
    }
}
