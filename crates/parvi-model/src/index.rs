//! Stan's multi-indexing over the particle batch: `theta[jj]` for a parameter vector per
//! particle `theta` `[n, J]` and an index array `jj` of length `N` is `[n, N]`, one call.
//!
//! An [`IndexArray`] is data: checked once against the size of the axis it indexes (an index
//! out of range is an error naming the array), then held on the device. [`IndexArray::take`]
//! is burn's `select` along that axis, whose backward pass is the scatter-add burn gives: an
//! entry of `theta` used by many data rows (a group's effect) collects the sum of their
//! gradients.
//!
//! Indices are 0-based, as everywhere in Rust; [`IndexArray::from_stan`] takes Stan's 1-based
//! ones (a posteriordb JSON's `jj`) and shifts them.

use burn::tensor::{Device, Int, Tensor, TensorData};

use crate::ModelError;

/// An array of 0-based indices into an axis of a known size, checked and on the device.
#[derive(Clone, Debug)]
pub struct IndexArray {
    name: &'static str,
    size: usize,
    indices: Tensor<1, Int>,
    len: usize,
}

fn invalid(name: &'static str, reason: String) -> ModelError {
    ModelError::InvalidParameter { dist: "index", name, reason }
}

impl IndexArray {
    /// The 0-based `indices` into an axis of `size` entries; `name` names the array in errors.
    ///
    /// # Errors
    /// If an index is `>= size` or the array is empty.
    pub fn new(name: &'static str, indices: &[usize], size: usize, device: &Device) -> Result<Self, ModelError> {
        if indices.is_empty() {
            return Err(invalid(name, "is empty: an index array needs at least one entry".into()));
        }
        if let Some((at, &i)) = indices.iter().enumerate().find(|&(_, &i)| i >= size) {
            return Err(ModelError::InvalidElement {
                dist: "index",
                name,
                element: at,
                reason: format!("index {i} is out of range for an axis of {size} (0-based)"),
            });
        }
        let values: Vec<i64> = indices.iter().map(|&i| i as i64).collect();
        let indices = Tensor::<1, Int>::from_data(TensorData::new(values, [indices.len()]), device);
        Ok(Self { name, size, len: indices.dims()[0], indices })
    }

    /// Stan's 1-based `indices` (`1 ..= size`), shifted to 0-based.
    ///
    /// # Errors
    /// If an index is below 1 or above `size`, or the array is empty.
    pub fn from_stan(name: &'static str, indices: &[i64], size: usize, device: &Device) -> Result<Self, ModelError> {
        if let Some((at, &i)) = indices.iter().enumerate().find(|&(_, &i)| i < 1 || i as u64 > size as u64) {
            return Err(ModelError::InvalidElement {
                dist: "index",
                name,
                element: at,
                reason: format!("index {i} is out of range 1..={size} (Stan's 1-based indices)"),
            });
        }
        let zero_based: Vec<usize> = indices.iter().map(|&i| (i - 1) as usize).collect();
        Self::new(name, &zero_based, size, device)
    }

    /// The number of indices `N`.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: an index array has at least one entry.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The size of the axis the indices point into.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The indices as a device tensor `[N]`, for burn's own `select` or `gather`.
    pub fn tensor(&self) -> Tensor<1, Int> {
        self.indices.clone()
    }

    /// `x` indexed along `axis`: Stan's `theta[jj]` is `jj.take(theta, 1)` for `theta`
    /// `[n, J]` (-> `[n, N]`), and `z[, g]` is `g.take(z, 2)` for `z` `[n, K, J]`
    /// (-> `[n, K, N]`). One `select`; its backward pass adds the gradients of repeated indices.
    ///
    /// # Errors
    /// If `axis` is out of range or `x` does not have `size` entries along it.
    pub fn take<const D: usize>(&self, x: Tensor<D>, axis: usize) -> Result<Tensor<D>, ModelError> {
        let dims = x.dims();
        if axis >= D || dims[axis] != self.size {
            return Err(invalid(
                self.name,
                format!(
                    "indexes an axis of {} entries, but axis {axis} of {dims:?} does not have that size",
                    self.size
                ),
            ));
        }
        Ok(x.select(axis, self.indices.clone()))
    }
}

/// Stan's `theta[jj]` for per-particle vectors: `theta` `[n, J]`, `jj` of length `N`: `[n, N]`
/// ([`IndexArray::take`] along axis 1).
///
/// # Errors
/// If `theta` does not have `J = jj.size()` columns.
pub fn gather(theta: Tensor<2>, jj: &IndexArray) -> Result<Tensor<2>, ModelError> {
    jj.take(theta, 1)
}
