//! Step-size adapters: turn an ascent direction into a displacement, with per-coordinate
//! scaling and a learning-rate schedule. State is saved into [`EngineState`] under a prefix.

use burn::tensor::{DType, Device, Tensor, TensorData};
use parvi_model::fastmath::{Simd, Vectorised};
use parvi_model::tensor_ops::{is_cpu, to_vec_f32};
use serde::{Deserialize, Serialize};

use crate::error::require_positive;
use crate::{EngineState, InferError};

/// A learning-rate schedule `lr_t` for step `t = 0, 1, ...`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Schedule {
    /// `lr` at every step.
    Constant,
    /// `lr (b + t)^-gamma / b^-gamma`: polynomial decay from `lr` (Welling & Teh's form).
    Polynomial {
        /// Offset `b > 0` of the step count; a larger `b` delays the decay.
        b: f64,
        /// Decay exponent `gamma >= 0`.
        gamma: f64,
    },
    /// `lr * decay^t`.
    Exponential {
        /// Factor per step, `> 0`.
        decay: f64,
    },
    /// `lr * factor^(t / every)`.
    Step {
        /// Steps between two reductions, `>= 1`.
        every: usize,
        /// Factor applied at each reduction, `> 0`.
        factor: f64,
    },
}

impl Schedule {
    /// The learning rate at step `t` for base rate `lr`.
    pub fn rate(&self, lr: f64, t: usize) -> f64 {
        let t = t as f64;
        match *self {
            Schedule::Constant => lr,
            Schedule::Polynomial { b, gamma } => lr * ((b + t) / b).powf(-gamma),
            Schedule::Exponential { decay } => lr * decay.powf(t),
            Schedule::Step { every, factor } => lr * factor.powf((t / every as f64).floor()),
        }
    }

    fn validate(&self) -> Result<(), InferError> {
        match *self {
            Schedule::Constant => Ok(()),
            Schedule::Polynomial { b, gamma } => {
                require_positive("schedule.b", b)?;
                if !(gamma >= 0.0 && gamma.is_finite()) {
                    return Err(InferError::setting("schedule.gamma", format!("must be >= 0, got {gamma}")));
                }
                Ok(())
            }
            Schedule::Exponential { decay } => require_positive("schedule.decay", decay).map(|_| ()),
            Schedule::Step { every, factor } => {
                if every == 0 {
                    return Err(InferError::setting("schedule.every", "must be >= 1"));
                }
                require_positive("schedule.factor", factor).map(|_| ())
            }
        }
    }
}

/// Turns ascent directions into displacements.
pub trait StepAdapter: Send {
    /// The displacement to add to the particles for direction `phi`.
    fn delta(&mut self, phi: Tensor<2>) -> Tensor<2>;
    /// Writes the adapter's state into `state` under keys starting with `prefix`.
    fn save(&self, state: &mut EngineState, prefix: &str);
    /// Restores the state [`StepAdapter::save`] wrote under `prefix`.
    fn load(&mut self, state: &EngineState, prefix: &str, device: &Device) -> Result<(), InferError>;
}

/// An adapter as a user configures it. The default is Liu & Wang's AdaGrad with momentum at
/// step size 1e-3.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum AdapterConfig {
    /// Liu & Wang's AdaGrad with momentum: `hist = alpha hist + (1 - alpha) g^2` (first step
    /// `hist = g^2`), `x += lr g / (fudge + sqrt(hist))`.
    AdagradMomentum {
        /// Base step size.
        lr: f64,
        /// Momentum of the squared-gradient history, in `[0, 1)`.
        alpha: f64,
        /// Added to `sqrt(hist)` so a flat coordinate does not divide by zero.
        fudge: f64,
        /// Schedule applied to `lr`.
        schedule: Schedule,
    },
    /// Adam (Kingma & Ba), with bias-corrected first and second moments.
    Adam {
        /// Base step size.
        lr: f64,
        /// Decay of the first moment, in `[0, 1)`.
        beta1: f64,
        /// Decay of the second moment, in `[0, 1)`.
        beta2: f64,
        /// Added to the root of the second moment, `> 0`.
        eps: f64,
        /// Schedule applied to `lr`.
        schedule: Schedule,
    },
    /// RMSProp: `v = rho v + (1 - rho) g^2`, `x += lr g / (eps + sqrt(v))`.
    RmsProp {
        /// Base step size.
        lr: f64,
        /// Decay of the squared-gradient average, in `[0, 1)`.
        rho: f64,
        /// Added to `sqrt(v)`, `> 0`.
        eps: f64,
        /// Schedule applied to `lr`.
        schedule: Schedule,
    },
    /// Plain gradient steps: `x += lr g`.
    Sgd {
        /// Base step size.
        lr: f64,
        /// Schedule applied to `lr`.
        schedule: Schedule,
    },
}

impl Default for AdapterConfig {
    fn default() -> Self {
        AdapterConfig::adagrad(1e-3)
    }
}

impl AdapterConfig {
    /// The reference SVGD adapter: AdaGrad with momentum, `alpha = 0.9`, `fudge = 1e-6`.
    pub fn adagrad(lr: f64) -> Self {
        AdapterConfig::AdagradMomentum { lr, alpha: 0.9, fudge: 1e-6, schedule: Schedule::Constant }
    }

    /// Adam at step size `lr` with the usual `beta1 = 0.9`, `beta2 = 0.999`, `eps = 1e-8`.
    pub fn adam(lr: f64) -> Self {
        AdapterConfig::Adam { lr, beta1: 0.9, beta2: 0.999, eps: 1e-8, schedule: Schedule::Constant }
    }

    /// Plain gradient steps at a constant step size `lr`.
    pub fn sgd(lr: f64) -> Self {
        AdapterConfig::Sgd { lr, schedule: Schedule::Constant }
    }

    /// The base step size, whatever the adapter.
    pub fn lr(&self) -> f64 {
        match *self {
            AdapterConfig::AdagradMomentum { lr, .. }
            | AdapterConfig::Adam { lr, .. }
            | AdapterConfig::RmsProp { lr, .. }
            | AdapterConfig::Sgd { lr, .. } => lr,
        }
    }

    /// Validates every setting and builds the adapter.
    pub fn build(&self) -> Result<Box<dyn StepAdapter>, InferError> {
        let unit = |name: &'static str, v: f64| {
            if (0.0..1.0).contains(&v) {
                Ok(v)
            } else {
                Err(InferError::setting(name, format!("must be in [0, 1), got {v}")))
            }
        };
        Ok(match *self {
            AdapterConfig::AdagradMomentum { lr, alpha, fudge, schedule } => {
                schedule.validate()?;
                Box::new(AdagradMomentum {
                    lr: require_positive("lr", lr)?,
                    alpha: unit("alpha", alpha)?,
                    fudge: require_positive("fudge", fudge)?,
                    schedule,
                    t: 0,
                    hist: None,
                })
            }
            AdapterConfig::Adam { lr, beta1, beta2, eps, schedule } => {
                schedule.validate()?;
                Box::new(Adam {
                    lr: require_positive("lr", lr)?,
                    beta1: unit("beta1", beta1)?,
                    beta2: unit("beta2", beta2)?,
                    eps: require_positive("eps", eps)?,
                    schedule,
                    t: 0,
                    m: None,
                    v: None,
                })
            }
            AdapterConfig::RmsProp { lr, rho, eps, schedule } => {
                schedule.validate()?;
                Box::new(RmsProp {
                    lr: require_positive("lr", lr)?,
                    rho: unit("rho", rho)?,
                    eps: require_positive("eps", eps)?,
                    schedule,
                    t: 0,
                    v: None,
                })
            }
            AdapterConfig::Sgd { lr, schedule } => {
                schedule.validate()?;
                Box::new(Sgd { lr: require_positive("lr", lr)?, schedule, t: 0 })
            }
        })
    }
}

fn key(prefix: &str, name: &str) -> String {
    format!("{prefix}{name}")
}

struct AdagradMomentum {
    lr: f64,
    alpha: f64,
    fudge: f64,
    schedule: Schedule,
    t: usize,
    hist: Option<History>,
}

/// AdaGrad's squared-gradient history: a tensor, or on a CPU device in `f32` a host buffer that
/// one pass updates together with the displacement (the tensor form's eight operations each
/// allocate and fill a buffer: about 17 us of the Boston BNN step's `[20, 753]`).
enum History {
    // Boxed: a tensor handle is several hundred bytes, the host variant a hundred.
    Tensor(Box<Tensor<2>>),
    Host { values: Vec<f32>, shape: [usize; 2], device: Device },
}

impl History {
    fn to_tensor(&self) -> Tensor<2> {
        match self {
            History::Tensor(t) => (**t).clone(),
            History::Host { values, shape, device } => {
                Tensor::from_data(TensorData::new(values.clone(), *shape), device)
            }
        }
    }
}

impl AdagradMomentum {
    /// The displacement at rate `lr` from tensor operations; the history stays a tensor.
    fn delta_tensor(&mut self, phi: Tensor<2>, lr: f64) -> Tensor<2> {
        let g2 = phi.clone().square();
        let hist = match self.hist.take() {
            None => g2,
            Some(h) => h.to_tensor().mul_scalar(self.alpha) + g2.mul_scalar(1.0 - self.alpha),
        };
        let delta = phi / hist.clone().sqrt().add_scalar(self.fudge);
        self.hist = Some(History::Tensor(Box::new(hist)));
        delta.mul_scalar(lr)
    }

    /// [`AdagradMomentum::delta_tensor`] in one host pass over `f32` values, each operation
    /// rounded as the tensor form rounds it (the scalars in `f32`), so the two agree to the bit.
    fn delta_host(&mut self, phi: Tensor<2>, lr: f64) -> Tensor<2> {
        let (shape, device) = (phi.dims(), phi.device());
        // The direction's own buffer where nothing else holds it (no copy of `[n, d]` floats).
        let data = phi.into_data();
        let g = match data.as_slice::<f32>() {
            Ok(g) => g,
            Err(_) => return self.delta_tensor(Tensor::from_data(data.clone(), &device), lr),
        };
        let previous = self.hist.take().map(|previous| match previous {
            History::Host { values, .. } => values,
            History::Tensor(t) => to_vec_f32(&t),
        });
        let pass = AdagradPass {
            g,
            previous,
            alpha: self.alpha as f32,
            rest: (1.0 - self.alpha) as f32,
            fudge: self.fudge as f32,
            lr: lr as f32,
        };
        let (hist, delta) = Simd::detect().vectorise(pass);
        self.hist = Some(History::Host { values: hist, shape, device: device.clone() });
        Tensor::from_data(TensorData::new(delta, shape), &device)
    }
}

/// AdaGrad with momentum over host `f32` values: the new history from the previous one (the
/// first step's is `g^2`) and the displacement, as wide as the CPU allows (a square root and a
/// division an entry; the same numbers at every width).
struct AdagradPass<'a> {
    g: &'a [f32],
    previous: Option<Vec<f32>>,
    alpha: f32,
    rest: f32,
    fudge: f32,
    lr: f32,
}

impl Vectorised for AdagradPass<'_> {
    type Output = (Vec<f32>, Vec<f32>);
    #[inline(always)]
    fn run(self) -> Self::Output {
        let Self { g, previous, alpha, rest, fudge, lr } = self;
        let hist = match previous {
            None => g.iter().map(|g| g * g).collect(),
            Some(mut hist) => {
                hist.iter_mut().zip(g).for_each(|(h, g)| *h = *h * alpha + g * g * rest);
                hist
            }
        };
        let delta: Vec<f32> = g.iter().zip(&hist).map(|(g, h)| g / (h.sqrt() + fudge) * lr).collect();
        (hist, delta)
    }
}

impl StepAdapter for AdagradMomentum {
    fn delta(&mut self, phi: Tensor<2>) -> Tensor<2> {
        let lr = self.schedule.rate(self.lr, self.t);
        let host = is_cpu(&phi.device()) && phi.dtype() == DType::F32 && !phi.is_tracked();
        let delta = if host { self.delta_host(phi, lr) } else { self.delta_tensor(phi, lr) };
        self.t += 1;
        delta
    }

    fn save(&self, state: &mut EngineState, prefix: &str) {
        state.put_scalar(key(prefix, "t"), self.t as f64);
        if let Some(h) = &self.hist {
            state.put_tensor(key(prefix, "hist"), &h.to_tensor());
        }
    }

    fn load(&mut self, state: &EngineState, prefix: &str, device: &Device) -> Result<(), InferError> {
        self.t = state.scalar(&key(prefix, "t"))? as usize;
        self.hist = state.tensor_opt(&key(prefix, "hist"), device)?.map(|t| History::Tensor(Box::new(t)));
        Ok(())
    }
}

struct Adam {
    lr: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    schedule: Schedule,
    t: usize,
    m: Option<Tensor<2>>,
    v: Option<Tensor<2>>,
}

impl StepAdapter for Adam {
    fn delta(&mut self, phi: Tensor<2>) -> Tensor<2> {
        let m = match self.m.take() {
            None => phi.clone().mul_scalar(1.0 - self.beta1),
            Some(m) => m.mul_scalar(self.beta1) + phi.clone().mul_scalar(1.0 - self.beta1),
        };
        let v = match self.v.take() {
            None => phi.square().mul_scalar(1.0 - self.beta2),
            Some(v) => v.mul_scalar(self.beta2) + phi.square().mul_scalar(1.0 - self.beta2),
        };
        self.t += 1;
        let bias1 = 1.0 - self.beta1.powi(self.t as i32);
        let bias2 = 1.0 - self.beta2.powi(self.t as i32);
        let lr = self.schedule.rate(self.lr, self.t - 1);
        let delta = m.clone().div_scalar(bias1) / v.clone().div_scalar(bias2).sqrt().add_scalar(self.eps);
        self.m = Some(m);
        self.v = Some(v);
        delta.mul_scalar(lr)
    }

    fn save(&self, state: &mut EngineState, prefix: &str) {
        state.put_scalar(key(prefix, "t"), self.t as f64);
        if let (Some(m), Some(v)) = (&self.m, &self.v) {
            state.put_tensor(key(prefix, "m"), m);
            state.put_tensor(key(prefix, "v"), v);
        }
    }

    fn load(&mut self, state: &EngineState, prefix: &str, device: &Device) -> Result<(), InferError> {
        self.t = state.scalar(&key(prefix, "t"))? as usize;
        self.m = state.tensor_opt(&key(prefix, "m"), device)?;
        self.v = state.tensor_opt(&key(prefix, "v"), device)?;
        Ok(())
    }
}

struct RmsProp {
    lr: f64,
    rho: f64,
    eps: f64,
    schedule: Schedule,
    t: usize,
    v: Option<Tensor<2>>,
}

impl StepAdapter for RmsProp {
    fn delta(&mut self, phi: Tensor<2>) -> Tensor<2> {
        let g2 = phi.clone().square().mul_scalar(1.0 - self.rho);
        let v = match self.v.take() {
            None => g2,
            Some(v) => v.mul_scalar(self.rho) + g2,
        };
        let lr = self.schedule.rate(self.lr, self.t);
        let delta = phi / v.clone().sqrt().add_scalar(self.eps);
        self.v = Some(v);
        self.t += 1;
        delta.mul_scalar(lr)
    }

    fn save(&self, state: &mut EngineState, prefix: &str) {
        state.put_scalar(key(prefix, "t"), self.t as f64);
        if let Some(v) = &self.v {
            state.put_tensor(key(prefix, "v"), v);
        }
    }

    fn load(&mut self, state: &EngineState, prefix: &str, device: &Device) -> Result<(), InferError> {
        self.t = state.scalar(&key(prefix, "t"))? as usize;
        self.v = state.tensor_opt(&key(prefix, "v"), device)?;
        Ok(())
    }
}

struct Sgd {
    lr: f64,
    schedule: Schedule,
    t: usize,
}

impl StepAdapter for Sgd {
    fn delta(&mut self, phi: Tensor<2>) -> Tensor<2> {
        let lr = self.schedule.rate(self.lr, self.t);
        self.t += 1;
        phi.mul_scalar(lr)
    }

    fn save(&self, state: &mut EngineState, prefix: &str) {
        state.put_scalar(key(prefix, "t"), self.t as f64);
    }

    fn load(&mut self, state: &EngineState, prefix: &str, _device: &Device) -> Result<(), InferError> {
        self.t = state.scalar(&key(prefix, "t"))? as usize;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_decay_as_documented() {
        let p = Schedule::Polynomial { b: 1.0, gamma: 0.55 };
        assert_eq!(p.rate(0.1, 0), 0.1);
        assert!((p.rate(0.1, 9) - 0.1 * 10f64.powf(-0.55)).abs() < 1e-12);
        assert_eq!(Schedule::Step { every: 10, factor: 0.5 }.rate(1.0, 25), 0.25);
    }

    /// The host pass and the tensor operations give the same displacements and history to the
    /// bit, step after step (the first step's history is the squares alone), and the host
    /// history saves as the tensor history does.
    #[test]
    fn adagrad_host_pass_is_the_tensor_ops_to_the_bit() {
        let device = Device::flex();
        let build = || AdagradMomentum {
            lr: 1e-3,
            alpha: 0.9,
            fudge: 1e-6,
            schedule: Schedule::Polynomial { b: 1.0, gamma: 0.55 },
            t: 0,
            hist: None,
        };
        let (mut host, mut tensor) = (build(), build());
        let mut rng = crate::EngineRng::new(3);
        for step in 0..4 {
            let phi = rng.normal_tensor(5, 7, &device).mul_scalar(10f64.powi(step - 2));
            let lr = host.schedule.rate(host.lr, step as usize);
            let (a, b) = (host.delta_host(phi.clone(), lr), tensor.delta_tensor(phi, lr));
            assert_eq!(to_vec_f32(&a), to_vec_f32(&b), "step {step}: displacement");
            let (ha, hb) = (host.hist.as_ref().unwrap().to_tensor(), tensor.hist.as_ref().unwrap().to_tensor());
            assert_eq!(to_vec_f32(&ha), to_vec_f32(&hb), "step {step}: history");
        }
        assert!(matches!(host.hist, Some(History::Host { .. })));
        // Through the trait on flex: the host pass.
        let mut adapter = build();
        let _ = adapter.delta(Tensor::ones([2, 3], &device));
        assert!(matches!(adapter.hist, Some(History::Host { .. })));
    }

    #[test]
    fn non_positive_step_size_is_rejected_by_name() {
        let err = AdapterConfig::adagrad(0.0).build().err().unwrap().to_string();
        assert!(err.contains("`lr`"), "{err}");
        let err = AdapterConfig::adam(-1.0).build().err().unwrap().to_string();
        assert!(err.contains("`lr`"), "{err}");
    }
}
