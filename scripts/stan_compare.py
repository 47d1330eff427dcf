#!/usr/bin/env python3
"""Stan's NUTS beside parvi's default path on posteriordb-style posteriors, on this machine.

For every posterior folder (`model.stan`, `data.json`, `reference_draws.json` or
`reference_moments.json`, `posterior.json`) under the `--posteriordb` folders (one or more; by
default `$PARVI_POSTERIORDB_DIR` and `$PARVI_POSTERIORDB_MORE_DIR`, those set: the suite and the
wider suite of issue 59, all 38 posteriors in one run). A folder without a reference still runs
both samplers, timed, and parvi's draws are scored against Stan's own (its parameters, in Stan's
sds; the row says so):

1. Stan (PyStan 3): builds the program (timed on its own: Stan's build is not counted in the
   ratio; httpstan caches a built program, so a second run shows the cache's ~1 s), then samples
   `--chains` chains x (`--warmup` + `--samples`) draws with the diagonal metric (Stan's default),
   timed from the call to the last draw.
2. parvi: `parvi fit --posterior DIR --seed S --quiet` with every other setting at its default
   (the library's default path: Laplace search, SVGD, the stationarity check, the polish step),
   timed as the whole process (start-up, data reading and writing the files included).
3. Both sets of draws against the reference: for every parameter the error of the mean in
   reference sds and the ratio of sds; a posterior is "right" when every mean is within 0.1 sd
   and every sd within 10% (the acceptance of issue 45 and of the default-path table).

Prints one row per posterior as it finishes and appends it to `OUT/results.jsonl` (a rerun skips
the posteriors already there unless `--again`); `--markdown` prints the table of every row in
`results.jsonl` for docs/posteriordb.md. `--build-only` builds every program first and records
each real build's seconds in `OUT/builds.jsonl`, which the timed run then reports beside the
cache's answer (so the builds need not compete with the timed runs for the cores).

httpstan's `stanc` call has a 1-second timeout, which a loaded 2-core machine overruns
("TimeoutExpired"): this script raises it to `--stanc-timeout` seconds by wrapping the
`subprocess` module that `httpstan.compile` sees (no edit of the installed package). Editing
`httpstan/compile.py`'s `timeout=1` by hand does the same.

Usage:
  pip install pystan            # PyStan 3: builds models with the system g++
  cargo build --release --features wgpu,mpi   # or any build of the `parvi` binary
  python3 scripts/stan_compare.py --posteriordb ../shared/posteriordb ../shared/posteriordb-more \
      --parvi target/release/parvi --out /tmp/stan_compare [--only kidiq-kidscore_momiq ...] [--build-only]
  python3 scripts/stan_compare.py --out /tmp/stan_compare --markdown
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

MEAN_TOL = 0.1  # reference sds
CACHED_BUILD_S = 5.0  # a build this quick came from httpstan's cache
SD_TOL = 0.1  # relative


def raise_stanc_timeout(seconds):
    """httpstan runs stanc with `subprocess.run(..., timeout=1)`: give it `seconds` instead."""
    import httpstan.compile as hc

    real = subprocess

    class Patient:
        def __getattr__(self, name):
            return getattr(real, name)

        @staticmethod
        def run(*args, **kwargs):
            if kwargs.get("timeout") is not None:
                kwargs["timeout"] = max(kwargs["timeout"], seconds)
            return real.run(*args, **kwargs)

    hc.subprocess = Patient()


def reference(folder):
    """name -> (mean, sd) of the reference draws (or of its moments where only those exist);
    None where the folder has no reference."""
    draws = folder / "reference_draws.json"
    if not draws.exists() and not (folder / "reference_moments.json").exists():
        return None
    if draws.exists():
        chains = json.loads(draws.read_text())
        names = list(chains[0].keys())
        return {n: (float(np.mean(v)), float(np.std(v, ddof=1))) for n in names for v in [np.concatenate([c[n] for c in chains])]}
    moments = json.loads((folder / "reference_moments.json").read_text())["parameters"]
    return {n: (float(v["mean"]), float(v["sd"])) for n, v in moments.items()}


def errors(ref, columns):
    """Worst |mean error| in reference sds and worst |sd ratio - 1| over the reference's names."""
    worst_mean, worst_sd, missing = 0.0, 0.0, []
    for name, (mu, sd) in ref.items():
        x = columns.get(name)
        if x is None or len(x) == 0:
            missing.append(name)
            continue
        x = np.asarray(x, dtype=float)
        if not np.all(np.isfinite(x)):
            return float("inf"), float("inf"), missing
        worst_mean = max(worst_mean, abs(float(np.mean(x)) - mu) / sd if sd > 0 else 0.0)
        worst_sd = max(worst_sd, abs(float(np.std(x, ddof=1)) / sd - 1.0) if sd > 0 else 0.0)
    if missing:
        return float("inf"), float("inf"), missing
    return worst_mean, worst_sd, missing


def stan_name(name):
    """`theta[2,3]` -> ("theta", (1, 2)) (0-based indices into PyStan's arrays)."""
    if "[" not in name:
        return name, ()
    base, rest = name.split("[", 1)
    return base, tuple(int(i) - 1 for i in rest.rstrip("]").split(","))


def run_stan(folder, args):
    import stan

    program = (folder / "model.stan").read_text()
    data = json.loads((folder / "data.json").read_text())
    t0 = time.perf_counter()
    model = stan.build(program, data=data, random_seed=args.seed)
    build = time.perf_counter() - t0
    if args.build_only:
        return {"stan_build_s": build}
    # httpstan also caches every fit under its arguments (seed included): a rerun would read
    # the stored draws back in a fraction of a second. Drop them so that every run samples.
    from httpstan.cache import model_directory

    for cached in (model_directory(model.model_name) / "fits").glob("*.jsonlines.gz"):
        cached.unlink()
    t0 = time.perf_counter()
    fit = model.sample(num_chains=args.chains, num_warmup=args.warmup, num_samples=args.samples)
    sample = time.perf_counter() - t0
    columns = {}
    if reference(folder) is None:
        # No reference: Stan's own draws of every parameter stand for one (issue 59: "judge
        # parvi there against a Stan run of your own, and say so").
        for base, dims in zip(fit.param_names, fit.dims):
            # PyStan 3 gives a scalar's draws a leading axis of 1: its dims (`[]`) say it is one.
            values = np.asarray(fit[base]).reshape(*dims, -1)
            for index in np.ndindex(*values.shape[:-1]):
                name = base + ("[" + ",".join(str(i + 1) for i in index) + "]" if index else "")
                columns[name] = values[index]
    for name in reference(folder) or {}:
        base, index = stan_name(name)
        if base in fit.param_names or base in fit.constrained_param_names or base in fit:
            values = fit[base]
            columns[name] = values[index] if index else values.reshape(-1)
    divergent = int(np.sum(fit["divergent__"])) if "divergent__" in fit.sample_and_sampler_param_names else None
    return {
        "stan_build_s": build,
        "stan_sample_s": sample,
        "stan_divergent": divergent,
        "stan_max_rhat": stan_max_rhat(fit, args.chains),
        "stan_columns": columns,
    }


def stan_max_rhat(fit, chains):
    """The largest rank-normalised split R-hat (ArviZ's, as Stan's own summary prints it) over the
    parameters: whether Stan's own run is clean (issue 59's acceptance: R-hat <= 1.01 and no
    divergences). PyStan 3 keeps the draws of a scalar as `[..., draws * chains]`, chain after
    chain. None where ArviZ is missing."""
    try:
        import arviz as az
    except ImportError:
        return None
    worst = 0.0
    for name in fit.param_names:
        values = np.asarray(fit[name])
        flat = values.reshape(-1, values.shape[-1])
        for row in flat:
            series = row.reshape(chains, -1)
            if np.ptp(series) == 0:
                continue
            worst = max(worst, float(az.rhat(series)))
    return worst


def read_cmdstan_csv(paths):
    """The draws of CmdStan CSV files (one per chain, `draws_1.csv`, ...), chain after chain."""
    header, rows = None, []
    for path in paths:
        file_header = None
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.startswith("#") or not line.strip():
                    continue
                if file_header is None:
                    file_header = line.strip().split(",")
                    continue
                rows.append([float(v) for v in line.split(",")])
        header = header or file_header
    values = np.array(rows)
    # CmdStan's `theta.2.3` is Stan's `theta[2,3]`.
    names = [h if "." not in h else h.split(".", 1)[0] + "[" + h.split(".", 1)[1].replace(".", ",") + "]" for h in header]
    return {n: values[:, j] for j, n in enumerate(names)}


def run_parvi(folder, args):
    out = Path(args.out) / "parvi" / folder.name
    cmd = [args.parvi, "fit", "--posterior", str(folder), "--out", str(out), "--seed", str(args.seed), "--quiet"] + args.parvi_arg
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.parvi_timeout)
    except subprocess.TimeoutExpired:
        return {"parvi_s": time.perf_counter() - t0, "parvi_error": f"timed out after {args.parvi_timeout:.0f} s (--parvi-timeout)"}
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        return {"parvi_s": wall, "parvi_error": done.stderr.strip()[-2000:]}
    summary = json.loads((out / "summary.json").read_text())
    row = {"parvi_s": wall, "parvi_warnings": summary.get("warnings", []), "parvi_columns": read_cmdstan_csv(sorted(out.glob("draws_*.csv"), key=lambda p: int(p.stem.rsplit("_", 1)[1])))}
    # The phases the run took (issue 59's acceptance: reported), as `parvi fit` prints them.
    row["parvi_path"] = [f"{p['name']}: {p['did']}; {p['outcome']} ({p['seconds']:.1f} s)" for p in summary.get("path", [])]
    summary_csv = out / "summary.csv"
    if summary_csv.exists():
        rhats = []
        for line in summary_csv.read_text().splitlines()[1:]:
            cells = line.rsplit(",", 1)
            try:
                rhats.append(float(cells[-1]))
            except ValueError:
                pass
        finite = [r for r in rhats if np.isfinite(r)]
        row["parvi_max_rhat"] = max(finite) if finite else None
    if summary.get("polish"):
        p = summary["polish"]
        row["parvi_polish"] = {k: p.get(k) for k in ("kernel", "steps", "kept", "max_rhat", "min_ess", "converged", "seconds")}
    return row


def fmt(x, digits=2):
    return "-" if x is None else ("inf" if x == float("inf") else f"{x:.{digits}f}")


def discarded_share(path):
    """The share of the path's seconds spent on phases whose output was thrown away (issue 59:
    "what was tried and then discarded should cost at most a fifth of a run"): a refused search,
    a kernel that handed its chains on, a NUTS run dropped. None without a path."""
    seconds = []
    for line in path:
        try:
            s = float(line.rsplit("(", 1)[1].split(" s)")[0])
        except (IndexError, ValueError):
            continue
        outcome = line.rsplit("; ", 1)[-1]
        seconds.append((s, any(k in outcome for k in ("not used", "handed to", "dropped"))))
    total = sum(s for s, _ in seconds)
    return sum(s for s, d in seconds if d) / total if total > 0 else None


def markdown(rows):
    print("| posterior | Stan sampling, s | Stan mean err / sd err | Stan max R-hat | parvi fit, s | parvi mean err / sd err | parvi max R-hat | parvi / Stan | parvi's phases |")
    print("|---|---:|---|---:|---:|---|---:|---:|---|")
    for r in rows:
        ok = lambda m, s: m <= MEAN_TOL and s <= SD_TOL  # noqa: E731
        stan = "-" if r.get("stan_mean_err") is None else f"{fmt(r['stan_mean_err'])} / {fmt(100 * r['stan_sd_err'], 0)}%{'' if ok(r['stan_mean_err'], r['stan_sd_err']) else ' (off)'}"
        if r.get("stan_divergent"):
            stan += f", {r['stan_divergent']} divergent"
        if r.get("no_reference"):
            stan = "no reference" if r.get("stan_sample_s") is not None else "-"
            if r.get("stan_divergent"):
                stan += f", {r['stan_divergent']} divergent"
        if r.get("parvi_error"):
            parvi = "failed: " + r["parvi_error"].splitlines()[-1][:120].replace("|", "/")
        elif r.get("parvi_mean_err") is None:
            parvi = "no reference"
        else:
            parvi = f"{fmt(r['parvi_mean_err'])} / {fmt(100 * r['parvi_sd_err'], 0)}%{'' if ok(r['parvi_mean_err'], r['parvi_sd_err']) else ' (off)'}"
            if r.get("against_stan"):
                parvi += " against Stan's draws"
        ratio = r["parvi_s"] / r["stan_sample_s"] if r.get("stan_sample_s") else None
        phases = "; ".join(p.split(":", 1)[0] + " " + p.rsplit("; ", 1)[-1].split(" (")[0] for p in r.get("parvi_path", []))
        share = discarded_share(r.get("parvi_path", []))
        if share is not None:
            phases += f" (discarded: {100 * share:.0f}% of the path's seconds)"
        print(
            f"| {r['posterior']} | {fmt(r.get('stan_sample_s'), 1)} | {stan} | {fmt(r.get('stan_max_rhat'), 3)} | {fmt(r['parvi_s'], 1)} | {parvi} "
            f"| {fmt(r.get('parvi_max_rhat'), 3)} | {fmt(ratio)} | {phases} |"
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_dirs = [os.environ[v] for v in ("PARVI_POSTERIORDB_DIR", "PARVI_POSTERIORDB_MORE_DIR") if os.environ.get(v)]
    parser.add_argument("--posteriordb", nargs="+", default=default_dirs, help="folders of posterior folders (default: $PARVI_POSTERIORDB_DIR and $PARVI_POSTERIORDB_MORE_DIR, those set)")
    parser.add_argument("--parvi", default="target/release/parvi", help="the parvi binary")
    parser.add_argument("--parvi-arg", action="append", default=[], help="an extra argument for `parvi fit` (repeatable)")
    parser.add_argument("--out", required=True, help="folder for parvi's outputs and results.jsonl")
    parser.add_argument("--only", nargs="*", help="these posterior folders only")
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--stanc-timeout", type=float, default=120.0)
    parser.add_argument("--parvi-timeout", type=float, default=1200.0, help="seconds before a parvi run counts as failed")
    parser.add_argument("--build-only", action="store_true", help="only build the Stan programs (fills httpstan's cache)")
    parser.add_argument("--skip-parvi", action="store_true")
    parser.add_argument("--skip-stan", action="store_true")
    parser.add_argument("--again", action="store_true", help="rerun posteriors already in results.jsonl")
    parser.add_argument("--markdown", action="store_true", help="print results.jsonl as a markdown table and stop")
    args = parser.parse_args()

    # httpstan's builds leave a setuptools `build/` folder in the working directory: work in OUT.
    args.out = os.path.abspath(args.out)
    if os.path.sep in args.parvi:
        args.parvi = os.path.abspath(args.parvi)
    args.posteriordb = [os.path.abspath(d) for d in args.posteriordb]
    Path(args.out).mkdir(parents=True, exist_ok=True)
    os.chdir(args.out)
    results = Path(args.out) / "results.jsonl"
    builds_file = Path(args.out) / "builds.jsonl"
    builds = {}
    if builds_file.exists():
        for line in builds_file.read_text().splitlines():
            row = json.loads(line)
            builds[row["posterior"]] = row["stan_build_s"]
    done = {}
    if results.exists():
        for line in results.read_text().splitlines():
            row = json.loads(line)
            done[row["posterior"]] = row
    if args.markdown:
        markdown(sorted(done.values(), key=lambda r: r["posterior"]))
        return
    if not args.posteriordb:
        sys.exit("--posteriordb DIR [DIR ...] (or PARVI_POSTERIORDB_DIR, PARVI_POSTERIORDB_MORE_DIR) is needed")
    folders = []
    for root in map(Path, args.posteriordb):
        if not root.is_dir():
            sys.exit(f"--posteriordb: {root} is not a folder")
        folders.extend(sorted(p for p in root.iterdir() if (p / "model.stan").exists()))
    if args.only:
        unknown = set(args.only) - {p.name for p in folders}
        if unknown:
            sys.exit(f"{', '.join(args.posteriordb)}: no posterior folder {sorted(unknown)}")
        folders = [p for p in folders if p.name in args.only]
    if not args.skip_stan:
        raise_stanc_timeout(args.stanc_timeout)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    print(f"{'posterior':42} {'build':>6} {'stan s':>7} {'mean/sd err':>12} {'parvi s':>8} {'mean/sd err':>12} {'ratio':>6}", flush=True)
    for folder in folders:
        if folder.name in done and not args.again and not args.build_only:
            continue
        ref = reference(folder)
        row = {"posterior": folder.name}
        if ref is None:
            row["no_reference"] = True
        if not args.skip_stan:
            try:
                stan_row = run_stan(folder, args)
            except Exception as e:  # a failed build or run is a row, not the end of the suite
                stan_row = {"stan_error": f"{type(e).__name__}: {e}"[-2000:]}
            columns = stan_row.pop("stan_columns", None)
            if columns is not None and ref is not None:
                row["stan_mean_err"], row["stan_sd_err"], _ = errors(ref, columns)
            elif columns and "stan_error" not in stan_row:
                # Stan's own moments, for parvi's errors below (in Stan's sds: "against Stan").
                ref = {n: (float(np.mean(x)), float(np.std(x, ddof=1))) for n, x in columns.items() if np.ptp(x) > 0}
                row["against_stan"] = True
            row.update(stan_row)
        if args.build_only:
            print(f"{folder.name:42} built in {fmt(row.get('stan_build_s'), 0)} s {row.get('stan_error', '')}", flush=True)
            if row.get("stan_build_s", 0) > CACHED_BUILD_S:
                with builds_file.open("a") as f:
                    f.write(json.dumps({"posterior": folder.name, "stan_build_s": row["stan_build_s"]}) + "\n")
            continue
        if row.get("stan_build_s") is not None and row["stan_build_s"] <= CACHED_BUILD_S and folder.name in builds:
            # httpstan's cache answered: report the build that filled it.
            row["stan_build_s"], row["stan_build_cached"] = builds[folder.name], True
        if not args.skip_parvi:
            parvi_row = run_parvi(folder, args)
            columns = parvi_row.pop("parvi_columns", None)
            if columns is not None and ref is not None:
                row["parvi_mean_err"], row["parvi_sd_err"], missing = errors(ref, columns)
                if missing:
                    row["parvi_missing"] = missing
            row.update(parvi_row)
        ratio = row["parvi_s"] / row["stan_sample_s"] if row.get("stan_sample_s") and row.get("parvi_s") else None
        row["ratio"] = ratio
        print(
            f"{folder.name:42} {fmt(row.get('stan_build_s'), 0):>6} {fmt(row.get('stan_sample_s'), 1):>7} "
            f"{fmt(row.get('stan_mean_err')) + '/' + fmt(row.get('stan_sd_err')):>12} {fmt(row.get('parvi_s'), 1):>8} "
            f"{fmt(row.get('parvi_mean_err')) + '/' + fmt(row.get('parvi_sd_err')):>12} {fmt(ratio):>6}"
            + (f"  stan: {row['stan_error'][:200]}" if row.get("stan_error") else "")
            + (f"  parvi: {row['parvi_error'][-300:]}" if row.get("parvi_error") else "")
            + ("  no reference" if ref is None else "")
            + ("  (no reference: parvi against Stan's own draws, in Stan's sds)" if row.get("against_stan") else ""),
            flush=True,
        )
        done[folder.name] = row
        with results.open("a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
