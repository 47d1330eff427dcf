#!/usr/bin/env python3
"""Lines of each posteriordb model in parvi beside its Stan program (issue 27's 1.5x table).

Stan: the non-blank, non-comment lines inside the `parameters`, `transformed parameters` and
`model` blocks of `model.stan` (block headers and closing braces not counted). parvi: the
non-blank, non-comment lines inside the bodies of `fn parameters` and `fn model` of the model's
`impl Program` (signatures and closing braces not counted; data reading is counted separately,
as the lines of the rest of its module). A module that serves several models (the regressions,
the HMMs) counts the lines its `impl Program` has once for each.

Usage: python3 scripts/model_lines.py ../shared/posteriordb [--markdown]
"""
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "models" / "src" / "posteriordb"

# model_name -> (module file, the type whose `impl Program` holds the density)
SOURCES = {
    "earn_height": ("regressions.rs", "LinearRegression"),
    "logearn_height_male": ("regressions.rs", "LinearRegression"),
    "kidscore_interaction": ("regressions.rs", "LinearRegression"),
    "kidscore_mom_work": ("regressions.rs", "LinearRegression"),
    "logmesquite_logvash": ("regressions.rs", "LinearRegression"),
    "mesquite": ("regressions.rs", "LinearRegression"),
    "nes": ("regressions.rs", "LinearRegression"),
    "kidscore_momiq": ("regressions.rs", "LinearRegression"),
    "logearn_interaction": ("regressions.rs", "LinearRegression"),
    "logmesquite_logvas": ("regressions.rs", "LinearRegression"),
    "blr": ("sblrc.rs", "Blr"),
    "eight_schools_noncentered": ("eight_schools.rs", None),
    "arK": ("ark.rs", "Ark"),
    "garch11": ("garch.rs", "Garch"),
    "low_dim_gauss_mix": ("low_dim_gauss_mix.rs", "GaussMix"),
    "gp_pois_regr": ("gp_pois_regr.rs", "GpPoisson"),
    "gp_regr": ("gp_regr.rs", None),
    "diamonds": ("diamonds.rs", "Diamonds"),
    "hmm_example": ("hmm.rs", "HmmExample"),
    "hmm_drive_0": ("hmm.rs", "HmmDrive"),
    "lotka_volterra": ("lotka_volterra.rs", None),
    "accel_gp": ("accel_gp.rs", None),
}


def code_lines(lines, comment="//"):
    out = []
    in_block_comment = False
    for line in lines:
        s = line.strip()
        if in_block_comment:
            if "*/" in s:
                in_block_comment = False
            continue
        if s.startswith("/*"):
            in_block_comment = "*/" not in s
            continue
        if not s or s.startswith(comment):
            continue
        out.append(s)
    return out


def block_body(lines, start):
    """Lines strictly inside the brace block that opens on line `start`."""
    depth = 0
    body = []
    for i in range(start, len(lines)):
        line = re.sub(r"//.*", "", lines[i])
        opened = line.count("{")
        closed = line.count("}")
        if i > start and depth > 0:
            if depth + opened - closed <= 0 and line.strip() == "}":
                return body
            body.append(lines[i])
        depth += opened - closed
        if i > start and depth <= 0:
            return body
    return body


def stan_lines(path):
    lines = path.read_text().splitlines()
    total = 0
    for i, line in enumerate(lines):
        s = re.sub(r"//.*", "", line).strip()
        if re.match(r"^(parameters|transformed parameters|model)\s*\{", s):
            total += len(code_lines(block_body(lines, i)))
    return total


def parvi_lines(path, type_name):
    lines = path.read_text().splitlines()
    start = None
    for i, line in enumerate(lines):
        m = re.match(r"^impl\s+Program\s+for\s+(\w+)", line.strip())
        if m and (type_name is None or m.group(1) == type_name):
            start = i
            break
    if start is None:
        return None, len(code_lines(lines))
    impl = block_body(lines, start)
    density = 0
    for i, line in enumerate(impl):
        if re.match(r"^\s*fn (parameters|model)\b", line):
            density += len(code_lines(block_body(impl, i)))
    return density, len(code_lines(lines))


def main():
    suite = Path(sys.argv[1])
    markdown = "--markdown" in sys.argv
    rows = []
    for folder in sorted(p for p in suite.iterdir() if (p / "posterior.json").is_file()):
        model = json.loads((folder / "posterior.json").read_text())["model_name"]
        stan = stan_lines(folder / "model.stan")
        file, type_name = SOURCES.get(model, (None, None))
        if file is None:
            rows.append((folder.name, model, stan, None, None))
            continue
        density, module = parvi_lines(MODELS / file, type_name)
        rows.append((folder.name, model, stan, density, module))
    if markdown:
        print("| posterior | Stan lines | parvi lines | ratio | module lines (with data reading) |")
        print("|---|---:|---:|---:|---:|")
    worst = 0.0
    for name, model, stan, density, module in rows:
        if density is None:
            ratio = "not a Program yet"
        else:
            worst = max(worst, density / stan)
            ratio = f"{density / stan:.2f}"
        if markdown:
            print(f"| {name} | {stan} | {density if density is not None else '-'} | {ratio} | {module} |")
        else:
            print(f"{name:<42} stan {stan:>3}  parvi {density if density is not None else '-':>3}  ratio {ratio:>6}  module {module}")
    print(f"\nlargest ratio among Program models: {worst:.2f}")


if __name__ == "__main__":
    main()
