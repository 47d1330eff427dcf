//! Loads protein-tertiary-structure (the largest set) and prepares every split, printing the
//! time. Target: under 500 ms in release. `cargo bench -p parvi-data --bench load`.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Instant;

use parvi_data::{DevSplit, load, prepare};

fn data_dir() -> Option<PathBuf> {
    let from_env = std::env::var_os("PARVI_DATA_DIR").filter(|d| !d.is_empty()).map(PathBuf::from);
    let beside = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/uci");
    from_env.into_iter().chain([beside]).find(|d| d.is_dir())
}

fn main() {
    let Some(dir) = data_dir() else {
        println!("SKIPPED load bench: no UCI data (set PARVI_DATA_DIR)");
        return;
    };
    let mut best = f64::INFINITY;
    for run in 1..=5 {
        let start = Instant::now();
        let ds = load("protein", &dir).unwrap_or_else(|e| panic!("{e}"));
        let loaded = start.elapsed().as_secs_f64() * 1e3;
        for split in 0..ds.splits.len() {
            black_box(prepare(&ds, split, DevSplit::Reference).unwrap());
        }
        let total = start.elapsed().as_secs_f64() * 1e3;
        best = best.min(total);
        println!(
            "run {run}: load protein ({} x {}) {loaded:.1} ms, + prepare {} splits = {total:.1} ms",
            ds.rows,
            ds.features,
            ds.splits.len()
        );
    }
    println!("load + prepare all splits of protein: best {best:.1} ms (target < 500 ms)");
}
