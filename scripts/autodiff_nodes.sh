#!/usr/bin/env bash
# Autodiff nodes a score records, per posterior: the number of calls of burn's
# `GraphMutexClient::register` (one per operation on an autodiff tensor, tracked or not) in one
# one-position score of `examples/posteriordb_speed`, counted by gdb as the difference between
# runs of 101 and 1 extra scores, divided by 100. On a small model the cost of a score is mostly
# per-node graph bookkeeping, so this count is what a cut of the per-call cost cuts
# (docs/posteriordb.md, "Fewer autodiff nodes a score").
#
# Usage: scripts/autodiff_nodes.sh POSTERIORDB_DIR POSTERIOR [POSTERIOR ...]
#   (build first: cargo build --release --workspace --features wgpu,mpi --example posteriordb_speed)
# Needs gdb and nm. Set SPEED_BIN to time another build of the example.
set -euo pipefail
db=${1:?usage: $0 POSTERIORDB_DIR POSTERIOR...}
shift
bin=${SPEED_BIN:-${CARGO_TARGET_DIR:-target}/release/examples/posteriordb_speed}
[ -x "$bin" ] || { echo "no binary at $bin: build the posteriordb_speed example first" >&2; exit 1; }
addr=$(nm "$bin" | grep 'GraphMutexClient' | grep '8register' | awk '{print $1}' | head -1)
[ -n "$addr" ] || { echo "no GraphMutexClient::register symbol in $bin" >&2; exit 1; }
script=$(mktemp)
trap 'rm -f "$script"' EXIT
# The binary is position-independent: break at the symbol's offset from its first mapping.
cat > "$script" <<EOF
set pagination off
starti
python
import gdb
base = next(int(l.split()[0], 16) for l in gdb.execute("info proc mappings", to_string=True).splitlines() if "$(basename "$bin")" in l)
gdb.execute("break *%d" % (base + 0x$addr))
end
commands
silent
continue
end
continue
info breakpoints
EOF
hits() {
    PARVI_SPEED_CALLS=$1 gdb -batch -x "$script" --args "$bin" "$db" "$2" 2>/dev/null \
        | sed -n 's/.*breakpoint already hit \([0-9]*\) time.*/\1/p'
}
for posterior in "$@"; do
    one=$(hits 1 "$posterior")
    many=$(hits 101 "$posterior")
    echo "$posterior $(( (many - one) / 100 ))"
done
