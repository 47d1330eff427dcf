//! A posterior you can keep: particles (or an MCMC trace's draws) with everything needed to
//! predict later, in one file.
//!
//! The file is [safetensors](https://huggingface.co/docs/safetensors) (readable from Python with
//! `safetensors.numpy.load_file`): tensors `positions` `[n, dim]`, `weights` `[n]` and, for a
//! Gaussian-noise regression, `noise_sd` `[n]` (original scale), all `f32`. Its header's
//! metadata holds one entry, `parvi`, a JSON object ([`PosteriorMeta`]): the format name and
//! version, the model's kind and specification, the feature names and order, the normalisation
//! statistics, the class names, the method and its settings, and the SHA-256 of the tensor
//! bytes, so a damaged file is refused rather than predicting from corrupted particles.
//! `docs/posterior-format.md` documents it field by field.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The `format` field of every posterior file.
pub const FORMAT: &str = "parvi-posterior";
/// The version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// The safetensors metadata key holding [`PosteriorMeta`].
const META_KEY: &str = "parvi";

/// Why a posterior file could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum PosteriorError {
    /// Reading or writing the file failed.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        error: std::io::Error,
    },
    /// The file is not a readable posterior (truncated, corrupted, another format or version).
    #[error("{}: not a readable parvi posterior: {reason}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The posterior is for another model than the one asked for.
    #[error("{}: {reason}", path.display())]
    WrongModel {
        /// The file.
        path: PathBuf,
        /// How the model differs.
        reason: String,
    },
}

/// Whether the rows are an interacting particle set or draws of a Markov chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SampleKind {
    /// A particle method's final (possibly weighted) particles.
    Particles,
    /// An MCMC method's retained draws (equal weights).
    Draws,
}

/// The affine maps between the user's units and the model's: `x_model = (x - x_mean) / x_std`
/// per feature, `y = y_mean + y_std y_model` for a regression target.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Scaling {
    /// Per-feature mean of the training rows.
    pub x_mean: Vec<f64>,
    /// Per-feature standard deviation of the training rows (1 where constant).
    pub x_std: Vec<f64>,
    /// Target mean (0 for classification).
    pub y_mean: f64,
    /// Target standard deviation (1 for classification).
    pub y_std: f64,
}

/// Everything about a posterior except its numbers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PosteriorMeta {
    /// Always [`FORMAT`].
    pub format: String,
    /// The format version, [`FORMAT_VERSION`] when written by this build.
    pub version: u32,
    /// Which model family the specification describes, e.g. `"bnn"`.
    pub model_kind: String,
    /// The model's specification (architecture, likelihood, prior) as the family defines it.
    pub model: serde_json::Value,
    /// Feature column names, in the model's input order.
    pub features: Vec<String>,
    /// The target column's name.
    pub target: Option<String>,
    /// Class names in label order, for classification.
    pub classes: Option<Vec<String>>,
    /// Input and target normalisation from the training rows.
    pub scaling: Scaling,
    /// The inference method's name.
    pub method: String,
    /// The method's settings and the run's (steps, seed, ...), as given.
    pub settings: serde_json::Value,
    /// Particles or MCMC draws.
    pub kind: SampleKind,
    /// Number of rows of `positions`.
    pub particles: usize,
    /// Columns of `positions`: the model's parameter dimension.
    pub dim: usize,
    /// SHA-256 (hex) of the tensor bytes in the order positions, weights, noise_sd.
    #[serde(default)]
    pub payload_sha256: String,
}

/// A saved posterior: metadata and the particle arrays, on the host.
#[derive(Clone, Debug, PartialEq)]
pub struct Posterior {
    /// What the numbers mean.
    pub meta: PosteriorMeta,
    /// Row-major `[particles, dim]` positions in the model's unconstrained parameterisation.
    pub positions: Vec<f32>,
    /// `[particles]` weights summing to one.
    pub weights: Vec<f32>,
    /// `[particles]` observation-noise standard deviations on the target's original scale, for
    /// a Gaussian-noise regression.
    pub noise_sd: Option<Vec<f32>>,
}

fn bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn floats(raw: &[u8]) -> Vec<f32> {
    raw.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

impl Posterior {
    /// The model specification as `T`, or [`PosteriorError::WrongModel`] when the file holds
    /// another family's model (`kind` is the family's name).
    pub fn model_as<T: serde::de::DeserializeOwned>(&self, kind: &str, path: &Path) -> Result<T, PosteriorError> {
        if self.meta.model_kind != kind {
            return Err(PosteriorError::WrongModel {
                path: path.to_path_buf(),
                reason: format!("the posterior is for a `{}` model, not a `{kind}`", self.meta.model_kind),
            });
        }
        serde_json::from_value(self.meta.model.clone()).map_err(|e| PosteriorError::Invalid {
            path: path.to_path_buf(),
            reason: format!("its `{kind}` model specification does not parse: {e}"),
        })
    }

    fn tensors(&self) -> Vec<(&'static str, Vec<u8>, Vec<usize>)> {
        let n = self.meta.particles;
        let mut out = vec![
            ("positions", bytes(&self.positions), vec![n, self.meta.dim]),
            ("weights", bytes(&self.weights), vec![n]),
        ];
        if let Some(sd) = &self.noise_sd {
            out.push(("noise_sd", bytes(sd), vec![n]));
        }
        out
    }

    fn checksum(tensors: &[(&'static str, Vec<u8>, Vec<usize>)]) -> String {
        let mut hash = Sha256::new();
        for (_, raw, _) in tensors {
            hash.update(raw);
        }
        hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>, String> {
        self.check_shapes()?;
        let tensors = self.tensors();
        let mut meta = self.meta.clone();
        meta.format = FORMAT.to_string();
        meta.version = FORMAT_VERSION;
        meta.payload_sha256 = Self::checksum(&tensors);
        let json = serde_json::to_string(&meta).map_err(|e| e.to_string())?;
        let views: Vec<(&str, TensorView<'_>)> = tensors
            .iter()
            .map(|(name, raw, shape)| TensorView::new(Dtype::F32, shape.clone(), raw).map(|v| (*name, v)))
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        safetensors::serialize(views, Some(HashMap::from([(META_KEY.to_string(), json)]))).map_err(|e| e.to_string())
    }

    /// Writes the posterior to `path` atomically: a temporary file beside it, renamed into
    /// place, so an interrupted save never leaves a partial file under the name.
    pub fn save(&self, path: &Path) -> Result<(), PosteriorError> {
        let invalid = |reason: String| PosteriorError::Invalid { path: path.to_path_buf(), reason };
        let data = self.to_bytes().map_err(invalid)?;
        let io = |error| PosteriorError::Io { path: path.to_path_buf(), error };
        let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(io)?;
        std::io::Write::write_all(&mut tmp, &data).map_err(io)?;
        tmp.as_file().sync_all().map_err(io)?;
        tmp.persist(path).map_err(|e| io(e.error))?;
        Ok(())
    }

    /// Reads a posterior written by [`Posterior::save`], checking the format, the version, the
    /// shapes and the checksum.
    pub fn load(path: &Path) -> Result<Self, PosteriorError> {
        let data = std::fs::read(path).map_err(|error| PosteriorError::Io { path: path.to_path_buf(), error })?;
        Self::from_bytes(&data).map_err(|reason| PosteriorError::Invalid { path: path.to_path_buf(), reason })
    }

    /// Parses a posterior file's bytes.
    pub fn from_bytes(data: &[u8]) -> Result<Self, String> {
        let (_, header) = SafeTensors::read_metadata(data).map_err(|e| format!("not a safetensors file ({e})"))?;
        let json = header
            .metadata()
            .as_ref()
            .and_then(|m| m.get(META_KEY))
            .ok_or_else(|| format!("a safetensors file without parvi's `{META_KEY}` metadata"))?;
        let format: serde_json::Value = serde_json::from_str(json).map_err(|e| format!("metadata: {e}"))?;
        match (format.get("format").and_then(|f| f.as_str()), format.get("version").and_then(|v| v.as_u64())) {
            (Some(FORMAT), Some(v)) if v == u64::from(FORMAT_VERSION) => {}
            (Some(FORMAT), Some(v)) => {
                return Err(format!(
                    "format version {v}; this build of parvi reads version {FORMAT_VERSION} (re-save it with the \
                     version that wrote it, or refit)"
                ));
            }
            (other, _) => return Err(format!("format {other:?}, expected `{FORMAT}`")),
        }
        let meta: PosteriorMeta = serde_json::from_value(format).map_err(|e| format!("metadata: {e}"))?;
        let tensors = SafeTensors::deserialize(data).map_err(|e| format!("tensors: {e}"))?;
        let read = |name: &str, shape: &[usize]| -> Result<Option<Vec<f32>>, String> {
            match tensors.tensor(name) {
                Err(_) => Ok(None),
                Ok(view) if view.dtype() != Dtype::F32 => {
                    Err(format!("tensor `{name}` is {:?}, expected F32", view.dtype()))
                }
                Ok(view) if view.shape() != shape => {
                    Err(format!("tensor `{name}` has shape {:?}, the metadata says {shape:?}", view.shape()))
                }
                Ok(view) => Ok(Some(floats(view.data()))),
            }
        };
        let n = meta.particles;
        let positions = read("positions", &[n, meta.dim])?.ok_or("no `positions` tensor")?;
        let weights = read("weights", &[n])?.ok_or("no `weights` tensor")?;
        let noise_sd = read("noise_sd", &[n])?;
        let posterior = Self { meta, positions, weights, noise_sd };
        let sum = Self::checksum(&posterior.tensors());
        if sum != posterior.meta.payload_sha256 {
            return Err(format!(
                "the particle data's SHA-256 is {sum}, the header records {}: the file is damaged",
                posterior.meta.payload_sha256
            ));
        }
        posterior.check_shapes()?;
        Ok(posterior)
    }

    /// The invariants a usable posterior keeps.
    fn check_shapes(&self) -> Result<(), String> {
        let m = &self.meta;
        if m.particles == 0 || m.dim == 0 {
            return Err(format!("{} particles of dimension {}: nothing to predict with", m.particles, m.dim));
        }
        if self.positions.len() != m.particles * m.dim || self.weights.len() != m.particles {
            return Err("positions or weights do not match the particle count".into());
        }
        if m.scaling.x_mean.len() != m.features.len() || m.scaling.x_std.len() != m.features.len() {
            return Err(format!(
                "{} feature names but {} normalisation means",
                m.features.len(),
                m.scaling.x_mean.len()
            ));
        }
        if let Some(bad) =
            self.positions.iter().chain(&self.weights).chain(self.noise_sd.iter().flatten()).find(|v| !v.is_finite())
        {
            return Err(format!("a non-finite value {bad} among the particle data"));
        }
        let total: f64 = self.weights.iter().map(|&w| f64::from(w)).sum();
        if (total - 1.0).abs() > 1e-3 {
            return Err(format!("the weights sum to {total}, not 1"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> Posterior {
        Posterior {
            meta: PosteriorMeta {
                format: FORMAT.into(),
                version: FORMAT_VERSION,
                model_kind: "bnn".into(),
                model: serde_json::json!({"hidden": [3]}),
                features: vec!["a".into(), "b".into()],
                target: Some("y".into()),
                classes: None,
                scaling: Scaling { x_mean: vec![0.5, -1.0], x_std: vec![2.0, 1.0], y_mean: 3.0, y_std: 0.5 },
                method: "svgd".into(),
                settings: serde_json::json!({"steps": 10}),
                kind: SampleKind::Particles,
                particles: 2,
                dim: 3,
                payload_sha256: String::new(),
            },
            positions: vec![0.1, -0.2, 0.3, 1.5, 2.5, -3.5],
            weights: vec![0.25, 0.75],
            noise_sd: Some(vec![0.9, 1.1]),
        }
    }

    #[test]
    fn round_trips_bit_for_bit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.safetensors");
        let p = example();
        p.save(&path).unwrap();
        let q = Posterior::load(&path).unwrap();
        assert_eq!((&q.positions, &q.weights, &q.noise_sd), (&p.positions, &p.weights, &p.noise_sd));
        assert_eq!(q.meta.scaling, p.meta.scaling);
        assert_eq!(q.meta.payload_sha256.len(), 64);
        assert!(q.model_as::<serde_json::Value>("blr", &path).unwrap_err().to_string().contains("for a `bnn` model"));
    }

    /// Every truncation and every single flipped byte is refused with a named error, never
    /// accepted silently and never a panic.
    #[test]
    fn damaged_files_are_refused() {
        let data = example().to_bytes().unwrap();
        for cut in 0..data.len() {
            assert!(Posterior::from_bytes(&data[..cut]).is_err(), "truncated at {cut} accepted");
        }
        for i in 0..data.len() {
            let mut bad = data.clone();
            bad[i] ^= 0x5a;
            if let Ok(p) = Posterior::from_bytes(&bad) {
                // A flip inside the JSON can leave it valid (a digit of a name or a setting):
                // the numbers must then be intact.
                assert_eq!(p.positions, example().positions, "byte {i}");
            }
        }
    }

    #[test]
    fn another_version_is_refused_by_name() {
        // `to_bytes` writes the current version; patch the header as a future build would.
        let data = example().to_bytes().unwrap();
        let mut data = data;
        let pattern = br#"\"version\":1"#;
        let at = data.windows(pattern.len()).position(|w| w == pattern).expect("version in the header");
        data[at + pattern.len() - 1] = b'2';
        let err = Posterior::from_bytes(&data).unwrap_err();
        assert!(err.contains("format version 2"), "{err}");
    }
}
