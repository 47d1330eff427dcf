//! A data-heavy run with its rows shared among MPI ranks (docs/distributed.md, "Rows"): SVGD on a
//! full-batch Bayesian logistic regression over synthetic rows (`parvi::models::blr`), each rank
//! drawing and holding only its contiguous share of the rows, the scores summed by one
//! all-reduce per step. Prints one JSON line per run (rank 0): ms per step, the share of it in
//! collectives, and with `--compare FILE` the largest gap of the final particles to those of an
//! earlier run (relative to their spread); `--out FILE` writes the final particles as CSV.
//!
//! ```sh
//! cargo build --release --features mpi --example sharded_rows
//! B=target/release/examples/sharded_rows
//! $B --rows 1000000 --out plain.csv                                   # one process
//! mpirun -np 2 $B --rows 1000000 --distributed --shard rows --compare plain.csv
//! ```
//!
//! Flags: `--rows N` (1,000,000), `--features F` (20), `--particles n` (100), `--steps S` (10),
//! `--batch B` (none: every row each step), `--seed`, `--lr` (0.05), `--distributed`,
//! `--shard rows|particles` (rows), `--out FILE.csv`, `--compare FILE.csv`.
//!
//! `mpirun -np 2 $B --collectives` instead times the two collectives a sharded step uses, the
//! all-reduce (sum) and the all-gather of rows, from 1,000 to 10,000,000 floats (median of 7
//! after a warm-up), one JSON line per size: the figures the cost model is fitted to.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use parvi::infer::core::Collective;
use parvi::infer::core::shard::{RowShare, ShardBy, is_lead};
use parvi::infer::mpi::MpiWorld;
use parvi::infer::{AdapterConfig, EngineSpec, KernelConfig, MethodConfig, Particles, RunConfig, Runner};
use parvi::model::BackendKind;
use parvi::model::tensor_ops::to_vec_f32;
use parvi::models::LogisticRegression;
use parvi::models::blr::synthetic_rows;

struct Options {
    rows: usize,
    features: usize,
    particles: usize,
    steps: usize,
    batch: Option<usize>,
    seed: u64,
    lr: f64,
    distributed: bool,
    collectives: bool,
    shard: ShardBy,
    out: Option<PathBuf>,
    compare: Option<PathBuf>,
}

fn options() -> Result<Options> {
    let mut o = Options {
        rows: 1_000_000,
        features: 20,
        particles: 100,
        steps: 10,
        batch: None,
        seed: 1,
        lr: 0.05,
        distributed: false,
        collectives: false,
        shard: ShardBy::Rows,
        out: None,
        compare: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--distributed" || flag == "--collectives" {
            o.distributed = true;
            o.collectives |= flag == "--collectives";
            continue;
        }
        let value = args.next().ok_or_else(|| anyhow!("`{flag}` needs a value"))?;
        let bad = |e: &dyn std::fmt::Display| anyhow!("invalid setting `{flag}`: {e}");
        match flag.as_str() {
            "--rows" => o.rows = value.parse().map_err(|e| bad(&e))?,
            "--features" => o.features = value.parse().map_err(|e| bad(&e))?,
            "--particles" => o.particles = value.parse().map_err(|e| bad(&e))?,
            "--steps" => o.steps = value.parse().map_err(|e| bad(&e))?,
            "--batch" => o.batch = Some(value.parse().map_err(|e| bad(&e))?),
            "--seed" => o.seed = value.parse().map_err(|e| bad(&e))?,
            "--lr" => o.lr = value.parse().map_err(|e| bad(&e))?,
            "--shard" => o.shard = value.parse().map_err(|e| bad(&e))?,
            "--out" => o.out = Some(value.into()),
            "--compare" => o.compare = Some(value.into()),
            other => bail!("unknown flag `{other}`"),
        }
    }
    Ok(o)
}

fn main() {
    parvi::memory::keep_freed_memory();
    let o = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(2);
        }
    };
    // The world finalises MPI when dropped: it outlives the run.
    let world = if o.distributed {
        match MpiWorld::init() {
            Ok(w) => Some(w),
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        }
    } else {
        None
    };
    let group: Option<Arc<dyn Collective>> = world.as_ref().map(|w| w.collective() as Arc<dyn Collective>);
    let result = match &group {
        Some(c) if o.collectives => time_collectives(c.as_ref()),
        _ => run(&o, group.clone()),
    };
    if let Err(e) = result {
        match group {
            Some(c) if c.size() > 1 => c.abort(&format!("{e:#}")),
            _ => {
                eprintln!("error: {e:#}");
                std::process::exit(1);
            }
        }
    }
}

fn run(o: &Options, group: Option<Arc<dyn Collective>>) -> Result<()> {
    let device = BackendKind::Flex.device()?;
    let share = match (o.shard, &group) {
        (ShardBy::Rows, Some(c)) => Some(RowShare::of_rank(o.rows, c.size(), c.rank())?),
        _ => None,
    };
    // This process's rows only: row i depends on the seed and i alone.
    let mine = share.as_ref().map_or(0..o.rows, |s| s.rows.clone());
    let (x, y) = synthetic_rows(mine, o.features, o.seed);
    let model = LogisticRegression::new(&x, &y, o.features, &device)?;
    drop((x, y));
    let start = Particles::new(model.init(o.particles, o.seed, &device));
    let spec =
        EngineSpec::new(MethodConfig::default_for("svgd")?, KernelConfig::default(), AdapterConfig::adagrad(o.lr));
    let mut engine = spec.build()?;
    let config =
        RunConfig { batch_size: o.batch, collective: group.clone(), rows: share, ..RunConfig::new(o.steps, o.seed) };
    let outcome = Runner::new(engine.as_mut(), &model, start, config)?.run(&mut [])?;
    if !is_lead(group.as_deref()) {
        return Ok(());
    }
    let dim = outcome.particles.dim();
    let values = to_vec_f32(&outcome.particles.positions);
    let gap = match &o.compare {
        Some(path) => Some(
            relative_gap(&read_csv(path)?, &values).with_context(|| format!("comparing with {}", path.display()))?,
        ),
        None => None,
    };
    if let Some(path) = &o.out {
        let mut text = String::new();
        for row in values.chunks(dim) {
            text.push_str(&row.iter().map(f32::to_string).collect::<Vec<_>>().join(","));
            text.push('\n');
        }
        std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    let ranks = group.as_ref().map_or(1, |c| c.size());
    let comm = group.as_ref().map(|c| parvi::infer::core::ms_per_step(c.seconds_communicating(), outcome.steps_run));
    println!(
        "{}",
        serde_json::json!({
            "ranks": ranks,
            "shard": group.as_ref().map(|_| o.shard.name()),
            "rows": o.rows,
            "features": o.features,
            "particles": o.particles,
            "steps": outcome.steps_run,
            "ms_per_step": outcome.ms_per_step(),
            "communication_ms_per_step": comm,
            "gap_to_compared": gap,
        })
    );
    Ok(())
}

fn read_csv(path: &PathBuf) -> Result<Vec<f32>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    text.split([',', '\n'])
        .filter(|v| !v.is_empty())
        .map(|v| v.parse::<f32>().with_context(|| format!("{}: `{v}` is not a number", path.display())))
        .collect()
}

/// Largest absolute difference over the reference's standard deviation (all coordinates).
fn relative_gap(reference: &[f32], other: &[f32]) -> Result<f64> {
    if reference.len() != other.len() {
        bail!("{} values against {}", reference.len(), other.len());
    }
    let n = reference.len() as f64;
    let mean = reference.iter().map(|&v| v as f64).sum::<f64>() / n;
    let sd = (reference.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
    let max = reference.iter().zip(other).map(|(a, b)| (a - b).abs() as f64).fold(0.0, f64::max);
    Ok(max / sd)
}

/// Median seconds of the all-reduce and the all-gather of `len` floats in all (each rank sends
/// its share to the gather), for sizes 1e3 to 1e7; printed by rank 0.
fn time_collectives(c: &dyn Collective) -> Result<()> {
    for len in [1_000usize, 10_000, 100_000, 1_000_000, 10_000_000] {
        let counts = parvi::infer::core::shard::shard_counts(len, c.size());
        let local = vec![1f32; counts[c.rank()]];
        let values = vec![1f32; len];
        let (mut reduce, mut gather) = (Vec::new(), Vec::new());
        for rep in 0..8 {
            let t = std::time::Instant::now();
            let sum = c.all_reduce_sum(&values)?;
            if sum.len() != len {
                bail!("the all-reduce returned {} values, expected {len}", sum.len());
            }
            let r = t.elapsed().as_secs_f64();
            let t = std::time::Instant::now();
            let all = c.all_gather_rows(&local, &counts, 1)?;
            let g = t.elapsed().as_secs_f64();
            if all.len() != len {
                bail!("the all-gather returned {} values, expected {len}", all.len());
            }
            if rep > 0 {
                reduce.push(r);
                gather.push(g);
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        if c.rank() == 0 {
            let (r, g) = (median(&mut reduce), median(&mut gather));
            println!(
                "{}",
                serde_json::json!({
                    "ranks": c.size(), "floats": len, "all_reduce_ms": r * 1e3, "all_gather_ms": g * 1e3,
                    "all_reduce_gb_per_s": 4.0 * len as f64 / r / 1e9, "all_gather_gb_per_s": 4.0 * len as f64 / g / 1e9,
                })
            );
        }
    }
    Ok(())
}
