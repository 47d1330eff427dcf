#!/usr/bin/env python3
"""Stan's NUTS on one Stan program and JSON data file, timed as scripts/stan_compare.py times it
(PyStan 3, 4 chains x (1,000 warm-up + 1,000 draws), seed 1, build excluded), for models that
are not in a posteriordb folder (issue 45's pharmacokinetic model):

    python3 scripts/stan_time.py scripts/stan/one_cpt_mm.stan pk.json [--params ka,V,Vm,Km,sigma]

Prints the build and sampling seconds, Stan's leapfrog steps per draw, divergences, and each
named parameter's mean and sd. httpstan caches a fit by program, data and seed: a repeated run
with the same `--seed` returns in a fraction of a second, so time a re-run with another seed.
Not used by the tests.
"""
import argparse
import json
import time

import stan  # PyStan 3


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("program")
    parser.add_argument("data")
    parser.add_argument("--params", default="", help="comma-separated parameter names to summarise")
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    code = open(args.program).read()
    data = json.load(open(args.data))
    started = time.time()
    model = stan.build(code, data=data, random_seed=args.seed)
    build = time.time() - started
    started = time.time()
    fit = model.sample(num_chains=args.chains, num_warmup=args.warmup, num_samples=args.samples)
    sampling = time.time() - started
    leapfrog = fit["n_leapfrog__"]
    print(f"build {build:.1f} s, sampling {sampling:.1f} s; {leapfrog.mean():.1f} leapfrog steps a draw, "
          f"{int(fit['divergent__'].sum())} divergent")
    for name in filter(None, args.params.split(",")):
        draws = fit[name].ravel()
        print(f"{name:>8} mean {draws.mean():.5g} sd {draws.std(ddof=1):.5g}")


if __name__ == "__main__":
    main()
