#!/usr/bin/env bash
# PAT against the ring at scale, host memory: all_gather and reduce_scatter
# on RANKS processes (default 64) of one machine, each rank talking to the
# others through the socket network (NCCL_SHM_DISABLE=1), as ranks that are
# nodes of their own do, with the algorithm held by NCCL_ALGO (PAT, Ring).
# Sizes are per rank (MIN..MAX bytes, times FACTOR; default 8 B..1 MiB, 2): oxccl
# perf takes the whole buffer, RANKS times that. The two algorithms
# alternate, ROUNDS times (default 3), so that a slow spell of the machine
# falls on both; the summary takes each one's median over rounds.
#
#   tools/pat_vs_ring.sh                      # build here, 64 ranks
#   OXCCL_BIN=/path/oxccl RANKS=64 tools/pat_vs_ring.sh   # no cargo there
#   RANKS=16 MAX=64K ITERS=50 tools/pat_vs_ring.sh
#
# Prints the machine, the commit, each run's command, then a CSV summary
# (coll, bytes per rank, ring and PAT median time in us, ring/PAT) that
# also goes to OUT/summary.csv; every run's rows are in OUT/*.json.
set -euo pipefail
cd "$(dirname "$0")/.."
# Bytes, with an optional K or M suffix.
bytes() { case $1 in *K) echo $((${1%K} << 10)) ;; *M) echo $((${1%M} << 20)) ;; *) echo "$1" ;; esac; }
ranks=${RANKS:-64}
min=$(bytes "${MIN:-8}")
max=$(bytes "${MAX:-1M}")
factor=${FACTOR:-2}
iters=${ITERS:-20}
warm=${WARM:-5}
rounds=${ROUNDS:-3}
out=${OUT:-/tmp/pat_vs_ring}
limit=${LIMIT:-1200}
if [ -n "${OXCCL_BIN:-}" ]; then
  bin=$OXCCL_BIN
else
  cargo build --release -q -p oxccl-cli
  bin=${CARGO_TARGET_DIR:-target}/release/oxccl
fi
mkdir -p "$out"
rm -f "$out"/*.json
echo "## machine: $(nproc) cores, $(uname -r), $(date -u +%Y-%m-%dT%H:%MZ)"
echo "## commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "## $ranks ranks, $min..$max B per rank, -n $iters -w $warm, $rounds rounds"
for coll in all_gather reduce_scatter; do
  for round in $(seq 1 "$rounds"); do
    for algo in Ring PAT; do
      json="$out/$coll.$algo.$round.json"
      cmd=(env NCCL_SHM_DISABLE=1 NCCL_ALGO=$algo "$bin" perf --ranks "$ranks" --op "$coll"
           -b $((min * ranks)) -e $((max * ranks)) -f "$factor" -n "$iters" -w "$warm" -T "$limit" --json "$json")
      echo "## ${cmd[*]}"
      "${cmd[@]}" | grep -v '^#' | sed "s/^/$coll $algo /"
    done
  done
done
python3 - "$out" "$ranks" <<'EOF' | tee "$out/summary.csv"
import glob, json, os, statistics, sys
out, ranks = sys.argv[1], int(sys.argv[2])
times = {}
for path in glob.glob(os.path.join(out, "*.json")):
    coll, algo, _ = os.path.basename(path).split(".")[:3]
    for row in json.load(open(path)):
        if row["inplace"]:
            continue
        key = (coll, row["bytes"] // ranks)
        times.setdefault(key, {}).setdefault(algo, []).append(row["time_us"])
print("coll,bytes_per_rank,ring_us,pat_us,ring_over_pat")
for (coll, per) in sorted(times):
    t = times[(coll, per)]
    if "Ring" not in t or "PAT" not in t:
        continue
    ring, pat = statistics.median(t["Ring"]), statistics.median(t["PAT"])
    print(f"{coll},{per},{ring:.1f},{pat:.1f},{ring / pat:.2f}")
EOF
