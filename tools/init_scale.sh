#!/usr/bin/env bash
# Init time at scale (issue 43, item 1), oxccl beside Gloo: for each count
# (default 16 64 256), ROUNDS (3) rounds alternating `oxccl perf --ranks N
# --init-only` and tools/gloo_init.py N, processes on this machine, host
# memory. Each prints the slowest rank's time to a ready communicator and
# the span from the first rank's call to the last rank ready, in ms.
#   OXCCL=.../oxccl tools/init_scale.sh [N...]         (GPU machine: 16 cores)
# PY: the Python with torch (/opt/torch/.venv/bin/python); without torch
# the Gloo rows are left out, saying so.
set -uo pipefail
cd "$(dirname "$0")/.."
OXCCL=${OXCCL:-${CARGO_TARGET_DIR:-target}/release/oxccl}
PY=${PY:-/opt/torch/.venv/bin/python}
ROUNDS=${ROUNDS:-3}
counts=("$@")
[ ${#counts[@]} = 0 ] && counts=(16 64 256)
[ -x "$OXCCL" ] || { echo "no $OXCCL: cargo build --release -p oxccl-cli, or set OXCCL"; exit 2; }
gloo=yes
"$PY" -c 'import torch' 2>/dev/null || { gloo=; echo "# no torch in $PY: Gloo rows left out"; }
echo "# $(nproc) cores, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u '+%Y-%m-%d %H:%M UTC')"
printf '# %-6s %-6s %-6s %14s %14s\n' lib ranks round 'max_init(ms)' 'span(ms)'
rc=0
for n in "${counts[@]}"; do
  ulimit -n 65536 2>/dev/null || true
  for r in $(seq 1 "$ROUNDS"); do
    row=$(NCCL_SOCKET_IFNAME=lo timeout 600 "$OXCCL" perf --ranks "$n" --init-only 2>/dev/null | tail -1) || rc=1
    echo "$row" | awk -v l=oxccl -v n="$n" -v r="$r" '{printf "  %-6s %-6s %-6s %14s %14s\n", l, n, r, $2, $3}'
    if [ -n "$gloo" ]; then
      row=$(timeout 600 "$PY" tools/gloo_init.py "$n" 2>/dev/null | tail -1) || rc=1
      echo "$row" | awk -v l=gloo -v n="$n" -v r="$r" '{printf "  %-6s %-6s %-6s %14s %14s\n", l, n, r, $2, $3}'
    fi
  done
done
exit $rc
