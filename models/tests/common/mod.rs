//! What the posteriordb test files share: finding the suite, the flex device, and moving
//! particle rows between the host and tensors.

use std::path::{Path, PathBuf};

use parvi_model::BackendKind;
use parvi_model::burn::tensor::{Device, Tensor, TensorData};
use parvi_model::tensor_ops::to_vec_f32;
use parvi_models::posteriordb::NAMES;

fn suite_dir() -> Option<PathBuf> {
    let mut candidates = Vec::new();
    if let Ok(dir) = std::env::var("PARVI_POSTERIORDB_DIR") {
        candidates.push(PathBuf::from(dir));
    } else {
        if let Ok(dir) = std::env::var("PARVI_DATA_DIR") {
            candidates.push(Path::new(&dir).join("..").join("posteriordb"));
        }
        candidates.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/posteriordb"));
    }
    candidates.into_iter().find(|d| d.join(NAMES[0]).join("data.json").is_file())
}

/// The suite folder, or `None` after a skip note (a failure when the suite is required).
pub fn suite(test: &str) -> Option<PathBuf> {
    let dir = suite_dir();
    if dir.is_none() {
        assert!(
            std::env::var("PARVI_REQUIRE_POSTERIORDB").as_deref() != Ok("1"),
            "{test}: PARVI_REQUIRE_POSTERIORDB=1 but no posteriordb suite was found (set PARVI_POSTERIORDB_DIR)"
        );
        eprintln!("{test}: skipped, no posteriordb suite (set PARVI_POSTERIORDB_DIR to run it)");
    }
    dir
}

pub fn flex() -> Device {
    BackendKind::Flex.device().unwrap()
}

pub fn matrix(rows: &[Vec<f64>], device: &Device) -> Tensor<2> {
    let cols = rows[0].len();
    let flat: Vec<f32> = rows.iter().flatten().map(|&v| v as f32).collect();
    Tensor::from_data(TensorData::new(flat, [rows.len(), cols]), device)
}

pub fn host_rows(t: &Tensor<2>) -> Vec<Vec<f64>> {
    let cols = t.dims()[1];
    to_vec_f32(t).chunks(cols).map(|r| r.iter().map(|&v| f64::from(v)).collect()).collect()
}
