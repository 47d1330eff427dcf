#!/usr/bin/env bash
# The scaling table of docs/distributed.md, every run interleaved (A, B, C, A, B, C, ...):
#   1. particles: protein BNN(200,200), 100 particles, minibatch 100, 120 steps (over 30 the
#      plain process's first steps weigh more than a rank's): one process,
#      `mpirun -np 1` and `-np 2` with `--distributed` (particles shared);
#   2. rows: full-batch Bayesian logistic regression on 1,000,000 synthetic rows (20 features,
#      100 particles, 10 steps, examples/sharded_rows.rs): one process and `mpirun -np 2
#      --shard rows`, the sharded particles compared with the one process's;
#   3. rows on protein: BNN(200,200), 100 particles, minibatches of 10,000 rows, 5 steps: one
#      process and `mpirun -np 2 --shard rows`;
#   4. the collectives alone: all-reduce and all-gather of 1e3 to 1e7 floats on 2 ranks.
# Prints one line per run and the medians; the raw outputs stay under $OUT.
#
#   scripts/scaling.sh                 # REPEATS=3 OUT=out/scaling PARVI_DATA_DIR=../shared/uci
#   ONLY=rows scripts/scaling.sh       # one part: particles, rows, protein-rows or collectives
#
# Pause everything else on the machine first; report `uptime` with the table.
set -euo pipefail
cd "$(dirname "$0")/.."
REPEATS=${REPEATS:-3}
OUT=${OUT:-out/scaling}
DATA=${PARVI_DATA_DIR:-../shared/uci}
ONLY=${ONLY:-all}
FEATURES=${FEATURES:-mpi}   # wgpu,mpi reuses the test build
ROW_STEPS=${ROW_STEPS:-10}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN=(mpirun --oversubscribe --bind-to none)

cargo build --release --features "$FEATURES" --bin parvi --example sharded_rows
TARGET=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
PARVI=$TARGET/release/parvi
ROWS=$TARGET/release/examples/sharded_rows
mkdir -p "$OUT"
RESULTS=$OUT/results.tsv
: > "$RESULTS"
echo "uptime before: $(uptime)"

bnn_line() { # part config rep dir
    python3 - "$@" <<'PY'
import json, sys
part, config, rep, d = sys.argv[1:5]
s = json.load(open(d + "/bnn_summary.json"))
comm = s.get("communication_ms_per_step")
print("\t".join([part, config, rep, f"{s['ms_per_step']:.1f}", "-" if comm is None else f"{comm:.1f}", f"rmse {s['test_rmse']:.5f}"]))
PY
}
rows_line() { # part config rep json
    python3 - "$@" <<'PY'
import json, sys
part, config, rep, line = sys.argv[1:5]
s = json.loads(line)
comm, gap = s.get("communication_ms_per_step"), s.get("gap_to_compared")
print("\t".join([part, config, rep, f"{s['ms_per_step']:.1f}", "-" if comm is None else f"{comm:.1f}", "-" if gap is None else f"gap {gap:.2e}"]))
PY
}

if [[ $ONLY == all || $ONLY == particles ]]; then
    ARGS=(bnn --method svgd --dataset protein --hidden 200,200 --particles 100 --iters 120 --data-dir "$DATA")
    for rep in $(seq "$REPEATS"); do
        "$PARVI" "${ARGS[@]}" --out "$OUT/p-plain-$rep" > /dev/null
        bnn_line particles plain "$rep" "$OUT/p-plain-$rep" | tee -a "$RESULTS"
        "${MPIRUN[@]}" -np 1 "$PARVI" "${ARGS[@]}" --distributed --out "$OUT/p-np1-$rep" > /dev/null
        bnn_line particles np1 "$rep" "$OUT/p-np1-$rep" | tee -a "$RESULTS"
        "${MPIRUN[@]}" -np 2 "$PARVI" "${ARGS[@]}" --distributed --out "$OUT/p-np2-$rep" > /dev/null
        bnn_line particles np2 "$rep" "$OUT/p-np2-$rep" | tee -a "$RESULTS"
    done
fi

if [[ $ONLY == all || $ONLY == rows ]]; then
    # flex spreads large tensor operations over every core (rayon): one process alone already
    # uses the whole machine here. Ranks are compared at one core each (as one core per node);
    # ROW_THREADS= (empty) compares them with rayon's default instead.
    export RAYON_NUM_THREADS=${ROW_THREADS-1}
    [[ -z $RAYON_NUM_THREADS ]] && unset RAYON_NUM_THREADS
    for rep in $(seq "$REPEATS"); do
        line=$("$ROWS" --rows 1000000 --steps "$ROW_STEPS" --out "$OUT/rows-plain.csv")
        rows_line rows plain "$rep" "$line" | tee -a "$RESULTS"
        line=$("${MPIRUN[@]}" -np 2 "$ROWS" --rows 1000000 --steps "$ROW_STEPS" --distributed --shard rows --compare "$OUT/rows-plain.csv")
        rows_line rows np2-rows "$rep" "$line" | tee -a "$RESULTS"
        line=$("${MPIRUN[@]}" -np 2 "$ROWS" --rows 1000000 --steps "$ROW_STEPS" --distributed --shard particles --compare "$OUT/rows-plain.csv")
        rows_line rows np2-particles "$rep" "$line" | tee -a "$RESULTS"
    done
    unset RAYON_NUM_THREADS
fi

if [[ $ONLY == all || $ONLY == protein-rows ]]; then
    ARGS=(bnn --method svgd --dataset protein --hidden 200,200 --particles 100 --iters 5 --batch 10000 --data-dir "$DATA")
    for rep in $(seq "$REPEATS"); do
        "$PARVI" "${ARGS[@]}" --out "$OUT/pr-plain-$rep" > /dev/null
        bnn_line protein-rows plain "$rep" "$OUT/pr-plain-$rep" | tee -a "$RESULTS"
        "${MPIRUN[@]}" -np 2 "$PARVI" "${ARGS[@]}" --distributed --shard rows --out "$OUT/pr-np2-$rep" > /dev/null
        bnn_line protein-rows np2-rows "$rep" "$OUT/pr-np2-$rep" | tee -a "$RESULTS"
    done
fi

if [[ $ONLY == all || $ONLY == collectives ]]; then
    "${MPIRUN[@]}" -np 2 "$ROWS" --collectives | tee "$OUT/collectives.jsonl"
fi

echo "uptime after: $(uptime)"
# Medians (and ranges) of ms/step per part and configuration.
python3 - "$RESULTS" <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    part, config, rep, ms, comm, answer = line.rstrip("\n").split("\t")
    runs[(part, config)].append((float(ms), comm, answer))
for (part, config), r in runs.items():
    ms = [m for m, _, _ in r]
    comms = [float(c) for _, c, _ in r if c != "-"]
    comm = f"{statistics.median(comms):.1f}" if comms else "-"
    print(f"{part:13} {config:14} ms/step {statistics.median(ms):8.1f} ({min(ms):.1f}-{max(ms):.1f})  communicating {comm:>6}  {r[-1][2]}")
PY
