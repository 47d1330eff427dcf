#!/usr/bin/env python3
"""ArviZ's PSIS-LOO of a CmdStan-format draws file, to set beside parvi's.

Reads `draws_1.csv ...` (CmdStan's CSV: `#` comment lines, a header, one row per draw) whose columns
include the pointwise log-likelihood `log_lik.1..log_lik.N` (CmdStan's naming) or
`log_lik[1]..log_lik[N]` (Stan's), splits its rows into `--chains` chains (chain after chain, as
parvi and CmdStan's per-chain files concatenated write them), and prints `az.loo`'s elpd_loo,
se, p_loo and the largest Pareto k. With several files, each file is one chain (`--chains` is
then ignored).

ArviZ (0.x) computes r_eff from the mean ESS of the posterior's other columns (every non-`__`
column but log_lik); R's loo and parvi compute one r_eff per point from exp(log_lik); and ArviZ's
`se` uses the population sd of the pointwise elpd where loo and parvi use the sample sd (a factor
sqrt((N - 1) / N)). Both differences are small for well-mixed chains.

Usage: python3 scripts/loo_check.py OUT/draws_*.csv [--var log_lik]
Needs: pip install arviz
"""
import argparse
import re
import sys

import numpy as np


def read_csv(path):
    header, rows = None, []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if header is None:
                header = line.split(",")
                continue
            rows.append([float(v) for v in line.split(",")])
    if header is None:
        sys.exit(f"{path}: no header line")
    return header, np.array(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", nargs="+", help="CmdStan-format draws file(s)")
    parser.add_argument("--chains", type=int, default=1, help="chains in a single file, one after the other")
    parser.add_argument("--var", default="log_lik", help="the pointwise log-likelihood's name")
    args = parser.parse_args()

    import arviz as az

    pattern = re.compile(r"^" + re.escape(args.var) + r"(?:\.(\d+)|\[(\d+)\])$")
    chains_ll, chains_other, names = [], [], None
    for path in args.csv:
        header, values = read_csv(path)
        cols = [(int(m.group(1) or m.group(2)), j) for j, h in enumerate(header) if (m := pattern.match(h))]
        if not cols:
            sys.exit(f"{path}: no columns `{args.var}.1..` or `{args.var}[1]..` in the header")
        cols.sort()
        other = [j for j, h in enumerate(header) if not h.endswith("__") and not pattern.match(h)]
        names = [header[j] for j in other]
        chains_ll.append(values[:, [j for _, j in cols]])
        chains_other.append(values[:, other])
    if len(args.csv) == 1 and args.chains > 1:
        ll, other = chains_ll[0], chains_other[0]
        if len(ll) % args.chains:
            sys.exit(f"{len(ll)} draws do not split into {args.chains} chains")
        per = len(ll) // args.chains
        chains_ll = [ll[c * per:(c + 1) * per] for c in range(args.chains)]
        chains_other = [other[c * per:(c + 1) * per] for c in range(args.chains)]
    ll = np.stack(chains_ll)  # [chain, draw, N]
    posterior = {n: np.stack([o[:, j] for o in chains_other]) for j, n in enumerate(names)}
    idata = az.from_dict(posterior=posterior, log_likelihood={args.var: ll})
    result = az.loo(idata, pointwise=True)
    print(f"arviz {az.__version__}: elpd_loo {result.elpd_loo:.4f} se {result.se:.4f} "
          f"p_loo {result.p_loo:.4f} max k-hat {float(np.max(result.pareto_k)):.3f} "
          f"({ll.shape[0]} chains x {ll.shape[1]} draws, {ll.shape[2]} points)")


if __name__ == "__main__":
    main()
