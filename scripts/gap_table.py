#!/usr/bin/env python3
"""The gap-split table of docs/experiments.md from the runs of scripts/gap_seeds.sh.

Reads every `METHOD_SET_SPLIT_seedK_NOISE.json` (`parvi bench uci --json` of one gap split)
under the folder given, averages each method's RMSE, test LL and 90% coverage over a set's gap
splits for each seed, and prints the mean over seeds (and the seed-to-seed sd of the LL), then
issue 30's tallies for fpovi (the default): sets where its LL is at least the ensemble's, where
its coverage is nearer 0.9 than SVGD's, and, where NUTS ran, nearer NUTS's coverage than SVGD's
and the ensemble's, each seed on its own and on the seed means. A set a method has not run on
every split of is left out of that method's rows (and named).

Usage: python3 scripts/gap_table.py out/gap
"""
import json
import re
import statistics as st
import sys
from collections import defaultdict
from pathlib import Path

NAME = re.compile(r"^(?P<method>[a-z-]+)_(?P<set>.+)_(?P<split>\d+)_seed(?P<seed>\d+)_(?P<noise>[a-z-]+)\.json$")


def runs(folder):
    """(method, noise) -> set -> seed -> [(rmse, ll, coverage)], one entry a gap split."""
    out = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for path in sorted(Path(folder).glob("*.json")):
        name = NAME.match(path.name)
        if not name:
            continue
        doc = json.loads(path.read_text())
        for result in doc if isinstance(doc, list) else [doc]:
            for split in result["splits"]:
                key = (name["method"], name["noise"])
                out[key][name["set"]][int(name["seed"])].append(
                    (split["rmse"], split["ll"], split["coverage_90"])
                )
    return out


def main(folder):
    data = runs(folder)
    if not data:
        sys.exit(f"no gap-split runs (METHOD_SET_SPLIT_seedK_NOISE.json) under {folder}")
    sets = sorted({s for by_set in data.values() for s in by_set})
    splits = {s: max(len(v) for by_set in data.values() for v in by_set.get(s, {}).values()) for s in sets}
    # method -> set -> seed -> (rmse, ll, coverage), complete sets only.
    means = defaultdict(lambda: defaultdict(dict))
    for (method, noise), by_set in sorted(data.items()):
        label = method if noise == "per-particle" else f"{method} ({noise})"
        for s, by_seed in by_set.items():
            for seed, rows in by_seed.items():
                if len(rows) < splits[s]:
                    print(f"left out: {label} on {s} seed {seed} ({len(rows)} of {splits[s]} gap splits)")
                    continue
                means[label][s][seed] = tuple(st.mean(r[i] for r in rows) for i in range(3))
    print("| gap splits | method | seeds | RMSE | LL (seed sd) | 90% cov. |")
    print("|---|---|---|---|---|---|")
    for s in sets:
        for label in sorted(means):
            by_seed = means[label].get(s)
            if not by_seed:
                continue
            rmse, ll, cov = (st.mean(v[i] for v in by_seed.values()) for i in range(3))
            sd = st.stdev([v[1] for v in by_seed.values()]) if len(by_seed) > 1 else 0.0
            print(f"| {s} ({splits[s]}) | {label} | {len(by_seed)} | {rmse:.3f} | {ll:.3f} ({sd:.3f}) | {cov:.3f} |")
    tally(means, sets)


def tally(means, sets):
    """Issue 30's counts for fpovi, each seed alone and on the seed means."""
    need = ("fpovi", "ensemble", "svgd")
    if not all(m in means for m in need):
        return
    seeds = sorted(set.intersection(*(set(means[m][s]) for m in need for s in sets if s in means[m])))
    common = [s for s in sets if all(s in means[m] for m in need)]
    nuts = {s: st.mean(v[2] for v in means["nuts"][s].values()) for s in common if s in means.get("nuts", {})}

    def count(pick):
        return [sum(pick(s, seed) for s in common) for seed in seeds]

    f = lambda m, s, seed, i: means[m][s][seed][i]  # noqa: E731
    print(f"\nfpovi on {len(common)} sets, seeds {seeds}:")
    ll = count(lambda s, k: f("fpovi", s, k, 1) >= f("ensemble", s, k, 1))
    cov = count(lambda s, k: abs(f("fpovi", s, k, 2) - 0.9) < abs(f("svgd", s, k, 2) - 0.9))
    print(f"  LL at least the ensemble's, per seed: {ll}")
    print(f"  coverage nearer 0.9 than SVGD's, per seed: {cov}")
    if nuts:
        for other in ("svgd", "ensemble"):
            near = [
                sum(abs(f("fpovi", s, k, 2) - nuts[s]) < abs(f(other, s, k, 2) - nuts[s]) for s in nuts)
                for k in seeds
            ]
            print(f"  coverage nearer NUTS's than {other}'s, of {len(nuts)} sets with NUTS, per seed: {near}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
