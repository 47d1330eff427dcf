//! The same run on every backend gives the same particles: ndarray and flex to 1e-4, wgpu to
//! 1e-3 (llvmpipe in CI); without a wgpu adapter the test says that it skipped.

mod common;

use common::host;
use parvi::infer::{AdapterConfig, EngineRng, Particles, Rbf, RunConfig, Runner, Svgd};
use parvi::model::BackendKind;
use parvi::models::builtin_target;

fn run_on(backend: BackendKind) -> Result<Vec<f32>, String> {
    let device = backend.device().map_err(|e| e.to_string())?;
    let target = builtin_target("banana", &device).unwrap();
    let start = Particles::gaussian(50, 2, 0.0, 1.0, &mut EngineRng::new(3), &device).unwrap();
    let mut svgd = Svgd::new(Box::new(Rbf::median()), AdapterConfig::adagrad(0.05).build().unwrap());
    let out =
        Runner::new(&mut svgd, target.density.as_ref(), start, RunConfig::new(100, 0)).unwrap().run(&mut []).unwrap();
    Ok(host(&out.particles.positions))
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[test]
fn ndarray_and_flex_agree() {
    let (a, b) = (run_on(BackendKind::Ndarray).unwrap(), run_on(BackendKind::Flex).unwrap());
    let d = max_abs_diff(&a, &b);
    assert!(d < 1e-4, "ndarray vs flex: {d}");
}

#[test]
fn wgpu_agrees_with_flex_or_reports_skip() {
    let flex = run_on(BackendKind::Flex).unwrap();
    match run_on(BackendKind::Wgpu) {
        Ok(w) => {
            let d = max_abs_diff(&w, &flex);
            assert!(d < 1e-3, "wgpu vs flex: {d}");
        }
        Err(reason) => {
            if std::env::var_os("PARVI_REQUIRE_WGPU").is_some() {
                panic!("PARVI_REQUIRE_WGPU is set but wgpu is unavailable: {reason}");
            }
            eprintln!("SKIPPED wgpu_agrees_with_flex: {reason}");
        }
    }
}
