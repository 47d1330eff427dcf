//! The examples' timing rule: median wall milliseconds of 15 runs after 3 warm-up runs.

use std::time::Instant;

use anyhow::Result;

pub fn median_ms(mut run: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..3 {
        run()?;
    }
    let mut times = Vec::with_capacity(15);
    for _ in 0..15 {
        let start = Instant::now();
        run()?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}
