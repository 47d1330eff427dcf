//! Issue 59, "a mode search that runs toward a boundary is never a frame": the Laplace mode
//! search alone on every posterior of the folders named, at the default path's settings and
//! seed, with what it ended at and the verdict of [`Laplace::not_a_frame`] (a frame, or why not).
//!
//! ```sh
//! cargo build --release --workspace --features wgpu,mpi --example frame_survey
//! target/release/examples/frame_survey 0 ../shared/posteriordb ../shared/posteriordb-more
//! ```
//!
//! The first argument is the fit's seed (the search's stream is derived from it as `fit` does).

use std::path::Path;
use std::time::Instant;

use parvi_infer::{EngineRng, Laplace, LaplaceConfig};
use parvi_model::{BackendKind, LogDensity};
use parvi_models::posteriordb;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [seed, dirs @ ..] = args.as_slice() else {
        return Err("usage: frame_survey <seed> <posteriordb dir>...".into());
    };
    let seed: u64 = seed.parse().map_err(|e| format!("seed `{seed}`: {e}"))?;
    let device = BackendKind::Flex.device()?;
    println!(
        "posterior | dim | log p at end | Newton decrement | -H pos. def. | smallest sd | evidence drop | s | frame?"
    );
    for dir in dirs {
        for folder in posteriordb::folders(Path::new(dir))? {
            let name = folder.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let model = match posteriordb::load_folder(&folder, &device) {
                Ok(m) => m,
                Err(e) => {
                    println!("{name} | not loaded: {e}");
                    continue;
                }
            };
            let started = Instant::now();
            let mut rng = EngineRng::new(seed ^ 0x1A9_1ACE);
            match Laplace::fit(&model, &LaplaceConfig::default(), &mut rng, &device) {
                Ok(l) => {
                    let smallest = l.smallest_sd();
                    println!(
                        "{name} | {} | {:.4e} | {:.1e} | {} | {smallest:.2e} | {:.1} | {:.1} | {}",
                        model.dim(),
                        l.log_prob,
                        l.newton_decrement,
                        if l.full_rank { "yes" } else { "no" },
                        l.evidence_drop,
                        started.elapsed().as_secs_f64(),
                        l.not_a_frame()
                            .map(|w| w.chars().take(70).collect::<String>())
                            .unwrap_or_else(|| "frame".into())
                    );
                }
                Err(e) => println!("{name} | search failed: {e}"),
            }
        }
    }
    Ok(())
}
