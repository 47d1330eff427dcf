#!/usr/bin/env python3
"""ArviZ's R-hat and bulk ESS of parvi's draws files, set beside parvi's own summary.

Reads the CmdStan CSV files a fit wrote (`OUT/draws_1.csv OUT/draws_2.csv ...`, one chain per
file, as `az.from_cmdstan` takes them), computes ArviZ's rank-normalised split R-hat and bulk ESS
(Vehtari et al. 2021) of every quantity and `lp__`, and compares them with parvi's
`summary.csv` (found beside `--summary summary.json`, or given as `--summary summary.csv`):
R-hat within `--rhat-tol` (0.01) and bulk ESS within `--ess-rel` (10%) on every quantity.
A constant quantity must have NaN R-hat and ESS in both. Exit status 1 on any disagreement.

Usage: python3 scripts/arviz_check.py OUT/draws_*.csv --summary OUT/summary.json
Needs: pip install arviz
"""
import argparse
import csv
import math
import re
import sys
import warnings
from pathlib import Path

import numpy as np


def stan_name(cmdstan):
    """CmdStan's `a.1.2` as Stan's `a[1,2]`."""
    base, _, rest = cmdstan.partition(".")
    return f"{base}[{rest.replace('.', ',')}]" if rest else base


def read_summary(path):
    path = Path(path)
    if path.suffix == ".json":
        path = path.with_name("summary.csv")
    rows = {}
    with open(path, encoding="utf-8") as f:
        for row in csv.DictReader(f):
            value = lambda k: float(row[k]) if row[k] not in ("", None) else None
            rows[row["name"]] = (value("R_hat"), value("ESS_bulk"))
    return path, rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", help="the draws files, one chain each")
    parser.add_argument("--summary", required=True, help="parvi's summary.json or summary.csv")
    parser.add_argument("--rhat-tol", type=float, default=0.01)
    parser.add_argument("--ess-rel", type=float, default=0.10)
    args = parser.parse_args()

    warnings.filterwarnings("ignore", category=FutureWarning)
    import arviz as az

    files = sorted(args.files, key=lambda p: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p)])
    idata = az.from_cmdstan(files)
    chains, draws = idata.posterior.sizes["chain"], idata.posterior.sizes["draw"]
    summary_path, parvi = read_summary(args.summary)
    # lp__ is a sample statistic in ArviZ; log_lik may be read into log_likelihood: every group
    # that holds draws of the files' columns is compared.
    lp = idata.sample_stats["lp"].values if "lp" in idata.sample_stats else None
    groups = [g for g in ("posterior", "log_likelihood", "posterior_predictive") if g in idata.groups()]
    checked, bad, worst_rhat, worst_ess = 0, [], 0.0, 0.0
    for group in groups:
        data = idata[group]
        rhat = az.rhat(data, method="rank")
        ess = az.ess(data, method="bulk")
        for var in data.data_vars:
            r, e = rhat[var].values, ess[var].values
            dims = data[var].dims[2:]
            for index in np.ndindex(*[data.sizes[d] for d in dims]) if dims else [()]:
                name = var + ("[" + ",".join(str(i + 1) for i in index) + "]" if index else "")
                ar, ae = float(r[index]), float(e[index])
                if name not in parvi:
                    bad.append(f"{name}: not in {summary_path}")
                    continue
                pr, pe = parvi[name]
                checked += 1
                if math.isnan(ar) or pr is None or math.isnan(pr):
                    if not (math.isnan(ar) and (pr is None or math.isnan(pr))):
                        bad.append(f"{name}: R-hat ArviZ {ar} parvi {pr}")
                    continue
                worst_rhat = max(worst_rhat, abs(ar - pr))
                worst_ess = max(worst_ess, abs(ae - pe) / ae)
                if abs(ar - pr) > args.rhat_tol:
                    bad.append(f"{name}: R-hat ArviZ {ar:.4f} parvi {pr:.4f}")
                if abs(ae - pe) > args.ess_rel * ae:
                    bad.append(f"{name}: bulk ESS ArviZ {ae:.0f} parvi {pe:.0f}")
    if lp is not None and "lp__" in parvi:
        ar = float(az.rhat(lp, method="rank"))
        ae = float(az.ess(lp, method="bulk"))
        pr, pe = parvi["lp__"]
        checked += 1
        worst_rhat = max(worst_rhat, abs(ar - pr))
        worst_ess = max(worst_ess, abs(ae - pe) / ae)
        if abs(ar - pr) > args.rhat_tol or abs(ae - pe) > args.ess_rel * ae:
            bad.append(f"lp__: R-hat ArviZ {ar:.4f} parvi {pr:.4f}, bulk ESS ArviZ {ae:.0f} parvi {pe:.0f}")
    constants = sum(1 for r, _ in parvi.values() if r is not None and math.isnan(r))
    print(f"ArviZ {az.__version__}: {len(files)} files -> {chains} chains x {draws} draws; {checked} of parvi's {len(parvi)} quantities compared with {summary_path} ({constants} constants: NaN in both)")
    print(f"largest |R-hat difference| {worst_rhat:.5f} (tolerance {args.rhat_tol}), largest bulk-ESS difference {100 * worst_ess:.2f}% (tolerance {100 * args.ess_rel:.0f}%)")
    for line in bad[:20]:
        print("MISMATCH", line)
    if bad:
        print(f"{len(bad)} mismatches")
        sys.exit(1)
    print("OK: every quantity agrees")


if __name__ == "__main__":
    main()
