#!/usr/bin/env python3
"""Stan's cost of one gradient for each posteriordb posterior (issue 44, item 4), as Stan itself
reports it before sampling ("Gradient evaluation took X seconds": one timed gradient per chain,
at the chain's initial point). Prints, per posterior, the median over `--chains` chains in ms,
for the table beside parvi's own figure (`examples/posteriordb_speed.rs`).

    python3 scripts/stan_gradient.py ../shared/posteriordb [NAME,NAME,...]

Needs PyStan 3 (`pip install pystan`); each model is compiled once and cached by httpstan
(45 to 260 s a model on 2 cores), the sampling is 10 + 10 iterations a chain. Under load,
httpstan's 1-second `stanc` timeout may need raising: `scripts/stan_compare.py` says how.
"""

import contextlib
import io
import json
import pathlib
import re
import statistics
import sys


def gradient_ms(folder, chains):
    import stan

    program = (folder / "model.stan").read_text()
    data = json.loads((folder / "data.json").read_text())
    # PyStan prints its progress and Stan's messages (the gradient timing among them).
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(err):
        model = stan.build(program, data=data, random_seed=1)
        model.sample(num_chains=chains, num_warmup=10, num_samples=10)
    took = [float(s) * 1e3 for s in re.findall(r"Gradient evaluation took ([0-9.eE+-]+) seconds", err.getvalue())]
    return statistics.median(took) if took else float("nan")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    suite = pathlib.Path(sys.argv[1])
    names = sys.argv[2].split(",") if len(sys.argv) > 2 else sorted(p.name for p in suite.iterdir() if "-" in p.name)
    print(f"{'posterior':<42} {'Stan ms per gradient':>21}")
    for name in names:
        print(f"{name:<42} {gradient_ms(suite / name, 4):>21.4f}", flush=True)


if __name__ == "__main__":
    main()
