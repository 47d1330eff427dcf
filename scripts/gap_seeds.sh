#!/usr/bin/env bash
# The gap-split tables of docs/experiments.md ("The acceptance held against the posterior"):
# every gap split (Foong et al. 2019: one per input feature, its middle third held out) of the
# five sets, for each method and seed, one `parvi bench uci` process per split, JOBS at a time;
# then scripts/gap_table.py prints the mean over seeds of each method's mean over the splits,
# the seed-to-seed sd, and the issue-30 tallies (LL against the ensemble's, coverage against
# SVGD's and against NUTS's where NUTS ran).
#
#   scripts/gap_seeds.sh                                   # SEEDS="1 2 3" METHODS="svgd ensemble fpovi"
#   SEEDS="$(seq 1 10)" JOBS=16 scripts/gap_seeds.sh       # the docs' ten seeds (16 cores: ~3 min)
#   METHODS=nuts SEEDS=1 JOBS=16 scripts/gap_seeds.sh      # one NUTS chain a split (~6 min on 16 cores)
#
# Runs are independent and single-threaded (RAYON_NUM_THREADS=1), so JOBS up to the core count
# changes no number; each run's JSON stays under $OUT, and a rerun skips the runs already there.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${PARVI_DATA_DIR:-../shared/uci}
OUT=${OUT:-out/gap}
SEEDS=${SEEDS:-1 2 3}
METHODS=${METHODS:-svgd ensemble fpovi}
NOISE=${NOISE:-per-particle}
JOBS=${JOBS:-$(nproc)}
SETS=${SETS:-bostonHousing concrete energy wine-quality-red yacht}

if [ -z "${PARVI:-}" ]; then
  cargo build --release --bin parvi
  TARGET=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
  PARVI=$TARGET/release/parvi
fi
mkdir -p "$OUT"

# One line a run: data set, gap split, method, seed. The number of gap splits is the number of
# input features, read from the set's own index file.
for method in $METHODS; do
  for seed in $SEEDS; do
    for set in $SETS; do
      features=$(grep -c . "$DATA/$set/index_features.txt")
      for split in $(seq 0 $((features - 1))); do
        echo "$set $split $method $seed"
      done
    done
  done
done > "$OUT/runs.txt"
echo "$(wc -l < "$OUT/runs.txt") runs, $JOBS at a time, into $OUT"

export PARVI DATA OUT NOISE RAYON_NUM_THREADS=1
xargs -P "$JOBS" -L 1 bash -c '
  json="$OUT/${2}_${0}_${1}_seed${3}_${NOISE}.json"
  [ -s "$json" ] && exit 0
  "$PARVI" bench uci --dataset "$0" --gap --gap-only --gap-splits "$1..$(($1 + 1))" --method "$2" \
    --noise "$NOISE" --seed "$3" --data-dir "$DATA" --json "$json.part" > "$json.log" 2>&1 \
    && mv "$json.part" "$json" || { echo "failed: $0 split $1 $2 seed $3 (see $json.log)" >&2; exit 1; }
' < "$OUT/runs.txt" || echo "some runs failed (named above); the table has the others" >&2

python3 scripts/gap_table.py "$OUT"
