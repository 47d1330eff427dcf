#!/usr/bin/env bash
# Autodiff nodes a score records, per posterior: the number of calls of burn's
# `GraphMutexClient::register` (one per operation on an autodiff tensor, tracked or not) in one
# one-position score of `examples/posteriordb_speed`, counted by gdb as the difference between
# runs of 1 + REPEATS (default 100) and 1 extra scores, divided by REPEATS. On a small model the cost of a score is mostly
# per-node graph bookkeeping, so this count is what a cut of the per-call cost cuts
# (docs/posteriordb.md at 8a480ca, "Fewer autodiff nodes a score").
#
# `COUNT=allocations` counts heap allocations a score instead (mimalloc's `mi_malloc_aligned` and
# `mi_zalloc_aligned`, which every operation's output and every graph node take): it sees the
# operations on data that register no node too (an `ln k!` recomputed at every call).
#
# Usage: scripts/autodiff_nodes.sh POSTERIORDB_DIR POSTERIOR [POSTERIOR ...]
#   (build first: cargo build --release --workspace --features wgpu,mpi --example posteriordb_speed)
# Needs gdb and nm. Set SPEED_BIN to time another build of the example.
set -euo pipefail
db=${1:?usage: $0 POSTERIORDB_DIR POSTERIOR...}
shift
repeats=${REPEATS:-100}
bin=${SPEED_BIN:-${CARGO_TARGET_DIR:-target}/release/examples/posteriordb_speed}
[ -x "$bin" ] || { echo "no binary at $bin: build the posteriordb_speed example first" >&2; exit 1; }
if [ "${COUNT:-nodes}" = allocations ]; then
    addrs=$(nm "$bin" | awk '$3 == "mi_malloc_aligned" || $3 == "mi_zalloc_aligned" {print $1}')
    [ "$(echo "$addrs" | wc -w)" = 2 ] || { echo "no mimalloc allocation symbols in $bin (the mimalloc feature is off?)" >&2; exit 1; }
else
    addrs=$(nm "$bin" | grep 'GraphMutexClient' | grep '8register' | awk '{print $1}' | head -1)
    [ -n "$addrs" ] || { echo "no GraphMutexClient::register symbol in $bin" >&2; exit 1; }
fi
breaks=$(for a in $addrs; do echo "gdb.execute(\"break *%d\" % (base + 0x$a))"; done)
script=$(mktemp)
trap 'rm -f "$script"' EXIT
# The binary is position-independent: break at the symbol's offset from its first mapping.
cat > "$script" <<EOF
set pagination off
starti
python
import gdb
base = next(int(l.split()[0], 16) for l in gdb.execute("info proc mappings", to_string=True).splitlines() if "$(basename "$bin")" in l)
$breaks
end
commands 1-$(echo "$addrs" | wc -w)
silent
continue
end
continue
info breakpoints
EOF
hits() {
    PARVI_SPEED_CALLS=$1 gdb -batch -x "$script" --args "$bin" "$db" "$2" 2>/dev/null \
        | sed -n 's/.*breakpoint already hit \([0-9]*\) time.*/\1/p' | awk '{s += $1} END {print s}'
}
for posterior in "$@"; do
    one=$(hits 1 "$posterior")
    many=$(hits $((1 + repeats)) "$posterior")
    echo "$posterior $(( (many - one) / repeats ))"
done
