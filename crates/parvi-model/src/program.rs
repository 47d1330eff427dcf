//! Models written the way a Stan program reads: the `parameters` block declared once as a
//! [`ParamLayout`] (constraints and their log-Jacobians come with it), and the `transformed
//! parameters` and `model` blocks as one function that adds its statements to a [`Target`].
//!
//! ```
//! use parvi_model::burn::tensor::Tensor;
//! use parvi_model::dist::{Cauchy, LogProb, Normal};
//! use parvi_model::program::{Program, Target, Vars};
//! use parvi_model::{ModelError, ParamLayout};
//!
//! /// Stan's eight schools, non-centred.
//! #[derive(Debug)]
//! struct EightSchools { y: Tensor<2>, sigma: Tensor<2>, schools: usize }
//!
//! impl Program for EightSchools {
//!     fn parameters(&self) -> Result<ParamLayout, ModelError> {
//!         ParamLayout::new().real("theta_trans", &[self.schools])?.real("mu", &[])?.positive("tau", &[])
//!     }
//!     fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError> {
//!         let (theta_trans, mu, tau) = (p.get("theta_trans")?, p.get("mu")?, p.get("tau")?);
//!         let theta = p.transformed("theta", theta_trans.clone() * tau.clone() + mu.clone());
//!         *target += Normal::new(0.0, 1.0)?.log_prob(theta_trans);
//!         *target += Normal::new(theta, self.sigma.clone())?.log_prob(self.y.clone());
//!         *target += Normal::new(0.0, 5.0)?.log_prob(mu);
//!         *target += Cauchy::new(0.0, 5.0)?.log_prob(tau);
//!         Ok(())
//!     }
//! }
//! ```
//!
//! [`Compiled`] turns a program into a [`LogDensity`] on Stan's unconstrained coordinates, with
//! Stan's names for every reported quantity (`theta[1]`, `L[2,1]`) in Stan's output order: the
//! parameters, then the transformed parameters.

use std::cell::RefCell;
use std::ops::AddAssign;
use std::sync::Mutex;

use burn::tensor::Tensor;

use crate::{LogDensity, Minibatch, ModelError, ParamLayout, Unpacked};

/// A model in the shape of a Stan program.
pub trait Program: std::fmt::Debug {
    /// The `parameters` block: every parameter with its shape and constraint.
    fn parameters(&self) -> Result<ParamLayout, ModelError>;

    /// The `transformed parameters` and `model` blocks for all particles at once: each sampling
    /// statement or `target +=` adds its log density to `target`. Transformed parameters that a
    /// user reads back are declared with [`Vars::transformed`]. An error (a constant outside its
    /// distribution's support, an unknown block) is reported when the model is compiled, which
    /// runs this function once.
    fn model(&self, p: &Vars, target: &mut Target) -> Result<(), ModelError>;

    /// Data rows a minibatch may select ([`Vars::batch`]); `None` for a full-batch model.
    fn data_len(&self) -> Option<usize> {
        None
    }
}

/// The constrained parameters of all particles as the `model` block sees them.
pub struct Vars<'a> {
    unpacked: Unpacked<'a>,
    particles: usize,
    batch: Option<&'a Minibatch>,
    /// Transformed parameters recorded for reporting; `None` while only the density is wanted.
    recorded: Option<RefCell<Vec<(String, Tensor<2>)>>>,
}

impl Vars<'_> {
    /// Parameter `name`, flattened: `[n, size]` (`[n, 1]` for a scalar), on the constrained scale.
    pub fn get(&self, name: &str) -> Result<Tensor<2>, ModelError> {
        self.unpacked.flat(name)
    }

    /// Parameter `name` with its shape: `[n, shape...]`, `D = 1 + shape.len()` (a matrix block is
    /// `get_shaped::<3>`).
    pub fn get_shaped<const D: usize>(&self, name: &str) -> Result<Tensor<D>, ModelError> {
        self.unpacked.get(name)
    }

    /// Number of particles `n`.
    pub fn particles(&self) -> usize {
        self.particles
    }

    /// The minibatch of this evaluation, if any (see [`Minibatch::select`]).
    pub fn batch(&self) -> Option<&Minibatch> {
        self.batch
    }

    /// Declares a transformed parameter (`[n, size]`) and returns it: reported after the
    /// parameters, under `name` (`name[i]` past one element), as Stan's output does.
    pub fn transformed(&self, name: &str, value: Tensor<2>) -> Tensor<2> {
        if let Some(recorded) = &self.recorded {
            recorded.borrow_mut().push((name.to_string(), value.clone()));
        }
        value
    }
}

/// The log density being accumulated, `[n]` (Stan's `target`). `target += term` sums a term over
/// every axis but the first: a `[n, k]` term is one value per particle and element, a `[1, k]` one
/// (data only) is shared by every particle.
#[derive(Debug)]
pub struct Target {
    lp: Tensor<1>,
}

impl Target {
    fn new(particles: usize, device: &burn::tensor::Device) -> Self {
        Self { lp: Tensor::zeros([particles], device) }
    }

    /// The accumulated log density `[n]`.
    pub fn value(self) -> Tensor<1> {
        self.lp
    }
}

impl AddAssign<Tensor<1>> for Target {
    fn add_assign(&mut self, term: Tensor<1>) {
        self.lp = self.lp.clone() + term;
    }
}

impl AddAssign<Tensor<2>> for Target {
    fn add_assign(&mut self, term: Tensor<2>) {
        let rows = term.dims()[0];
        *self += term.sum_dim(1).reshape([rows]);
    }
}

impl AddAssign<Tensor<3>> for Target {
    fn add_assign(&mut self, term: Tensor<3>) {
        let [rows, a, b] = term.dims();
        *self += term.reshape([rows, a * b]);
    }
}

/// A [`Program`] with its layout: a [`LogDensity`] on the unconstrained coordinates (Jacobians
/// added) and the map to the reported quantities.
#[derive(Debug)]
pub struct Compiled<P> {
    program: P,
    layout: ParamLayout,
    names: Vec<String>,
    /// The error of the last evaluation that failed (see [`LogDensity::take_error`]).
    error: Mutex<Option<ModelError>>,
}

impl<P: Program> Compiled<P> {
    /// Builds the layout and runs the model once on one particle at the origin of the
    /// unconstrained space, so that an error in the program (a constant outside its support, a
    /// block it does not declare) is reported here, and the reported names are known.
    pub fn new(program: P, device: &burn::tensor::Device) -> Result<Self, ModelError> {
        let layout = program.parameters()?;
        let origin = Tensor::<2>::zeros([1, layout.dim()], device);
        let transformed = Self::transformed_of(&program, &layout, origin)?;
        let names = layout
            .blocks()
            .iter()
            .flat_map(|b| stan_names(&b.name, &b.shape))
            .chain(transformed.iter().flat_map(|(name, value)| transformed_names(name, value.dims()[1])))
            .collect();
        Ok(Self { program, layout, names, error: Mutex::new(None) })
    }

    /// The parameters' layout (the `parameters` block).
    pub fn layout(&self) -> &ParamLayout {
        &self.layout
    }

    /// The program.
    pub fn program(&self) -> &P {
        &self.program
    }

    /// Stan's names of the reported quantities: every element of every parameter (constrained),
    /// then of every transformed parameter.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The reported quantities `[n, names().len()]` of unconstrained particles `[n, dim]`.
    pub fn reported(&self, particles: Tensor<2>) -> Result<Tensor<2>, ModelError> {
        let mut columns = vec![self.layout.constrain(particles.clone())];
        let transformed = Self::transformed_of(&self.program, &self.layout, particles)?;
        columns.extend(transformed.into_iter().map(|(_, v)| v));
        Ok(Tensor::cat(columns, 1))
    }

    /// Runs the model, recording the transformed parameters it declares.
    fn transformed_of(
        program: &P,
        layout: &ParamLayout,
        particles: Tensor<2>,
    ) -> Result<Vec<(String, Tensor<2>)>, ModelError> {
        let n = particles.dims()[0];
        let device = particles.device();
        let unpacked = layout.unpack(particles);
        let vars = Vars { unpacked, particles: n, batch: None, recorded: Some(RefCell::new(Vec::new())) };
        program.model(&vars, &mut Target::new(n, &device))?;
        Ok(vars.recorded.map(RefCell::into_inner).unwrap_or_default())
    }
}

impl<P: Program> LogDensity for Compiled<P> {
    fn dim(&self) -> usize {
        self.layout.dim()
    }

    fn data_len(&self) -> Option<usize> {
        self.program.data_len()
    }

    fn log_prob(&self, particles: Tensor<2>, batch: Option<&Minibatch>) -> Tensor<1> {
        let n = particles.dims()[0];
        let device = particles.device();
        let unpacked = self.layout.unpack(particles);
        let log_jacobian = unpacked.log_jacobian.clone();
        let vars = Vars { unpacked, particles: n, batch, recorded: None };
        let mut target = Target::new(n, &device);
        match self.program.model(&vars, &mut target) {
            Ok(()) => target.value() + log_jacobian,
            // A failure that depends on the particles (an ODE solve that cannot meet its
            // tolerance): NaN for every particle, which the run loop's guard reports with this
            // error, rather than a panic.
            Err(error) => {
                *self.error.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(error);
                Tensor::full([n], f32::NAN, &device)
            }
        }
    }

    fn take_error(&self) -> Option<ModelError> {
        self.error.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take()
    }
}

/// Stan's output names of a block's elements: `x` for a scalar, `x[i]` for a vector, `x[i,j]`
/// (row-major, 1-based) for a matrix.
pub fn stan_names(name: &str, shape: &[usize]) -> Vec<String> {
    if shape.is_empty() {
        return vec![name.to_string()];
    }
    let total: usize = shape.iter().product();
    (0..total)
        .map(|flat| {
            let mut rest = flat;
            let mut index = vec![0; shape.len()];
            for (axis, &len) in shape.iter().enumerate().rev() {
                index[axis] = rest % len + 1;
                rest /= len;
            }
            let index: Vec<String> = index.iter().map(ToString::to_string).collect();
            format!("{name}[{}]", index.join(","))
        })
        .collect()
}

/// A transformed parameter's names: a single value is reported under its bare name (a Stan
/// `real`), more as a vector.
fn transformed_names(name: &str, size: usize) -> Vec<String> {
    if size == 1 { vec![name.to_string()] } else { stan_names(name, &[size]) }
}
