#!/usr/bin/env bash
# oxccl against NCCL on one machine of several GPUs, through each transport
# a job meets when it leaves one GPU box: both libraries under the same
# PyTorch program (tools/torch_bench.py; oxccl by LD_PRELOAD of its
# libnccl.so.2), same ranks, same GPUs, same environment, one after the
# other. Then `oxccl perf` checks every collective through the same
# setting and its INFO log shows the transport of each connection.
# Needs root (network namespaces: tools/netns_run.sh) and PyTorch.
#
#   LIB=.../libnccl.so.2 OXCCL=.../oxccl tools/multi_gpu_compare.sh [SETTING...]
#
# SETTING (default: every one the GPUs allow):
#   p2p    one host, 2 GPUs, defaults (NVLink or PCIe peer access)
#   shm    one host, 2 GPUs, NCCL_P2P_DISABLE=1: shared memory
#   net    one host, 2 GPUs, P2P and SHM disabled: the socket net
#   hosts  2 hosts (namespaces, distinct NCCL_HOSTID) x 1 GPU: the net
#   nodes  2 hosts x 2 GPUs (4 GPUs): peer access inside, the net between,
#          rings crossing each node once
# OPS (all_reduce all_gather sendrecv), LO (8), HI (256M), FACTOR (8) and
# ITERS (20) go to torch_bench; PERF_HI (1G) bounds the perf check. PY is
# the Python with torch (/opt/torch/.venv/bin/python). Logs in $OUT (or
# /tmp/oxccl-multi-gpu); the summary on stdout: per setting and op, each
# size's time and busbw on both and oxccl's busbw over NCCL's (time over
# oxccl's time below 1 MiB, where latency is what counts).
set -uo pipefail
cd "$(dirname "$0")/.."
LIB=$(realpath "${LIB:?LIB=the path of the libnccl.so.2 of oxccl}")
OXCCL=$(realpath "${OXCCL:?OXCCL=path of the oxccl binary}")
PY=${PY:-/opt/torch/.venv/bin/python}
OUT=${OUT:-/tmp/oxccl-multi-gpu}
OPS=${OPS:-all_reduce all_gather sendrecv}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1
export LO=${LO:-8} HI=${HI:-256M} FACTOR=${FACTOR:-8} ITERS=${ITERS:-20}
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
settings=("$@")
if [ ${#settings[@]} = 0 ]; then
  settings=(p2p shm net hosts)
  [ "$gpus" -ge 4 ] && settings+=(nodes)
fi
status=0

# layout SETTING: "HOSTS PER_HOST" and the setting's environment.
layout() {
  case $1 in
  p2p) echo "1 2" ;;
  shm) echo "1 2 NCCL_P2P_DISABLE=1" ;;
  net) echo "1 2 NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1" ;;
  hosts) echo "2 1" ;;
  nodes) echo "2 2" ;;
  *) return 1 ;;
  esac
}

# side NCCL_LOG OXCCL_LOG: rows of both joined by size.
side() {
  awk 'FNR == 1 {f++} /^ +[0-9]+ / {t[f, $1] = $2; b[f, $1] = $4; w[f, $1] = $5; if (f == 1) s[++n] = $1}
    END {
      printf "  %12s %12s %9s %12s %9s %7s\n", "size(B)", "NCCL us", "busbw", "oxccl us", "busbw", "ratio"
      for (i = 1; i <= n; i++) {
        k = s[i]
        if (t[2, k] == "") continue
        r = (k < 1048576) ? t[1, k] / t[2, k] : (b[1, k] > 0 ? b[2, k] / b[1, k] : 0)
        printf "  %12d %12.1f %9.2f %12.1f %9.2f %6.2fx%s\n", k, t[1, k], b[1, k], t[2, k], b[2, k], r,
          (w[1, k] + w[2, k] > 0 ? "  WRONG" : "")
      }
    }' "$1" "$2"
}

for s in "${settings[@]}"; do
  read -r hosts per env <<<"$(layout "$s")" || { echo "unknown setting $s" >&2; exit 2; }
  need=$((hosts * per))
  if [ "$gpus" -lt "$need" ]; then
    echo "## $s: needs $need GPUs, this machine has $gpus: skipped"
    continue
  fi
  run=(env $env HOSTS="$hosts" PER_HOST="$per" GPUS=split)
  echo "## $s: $hosts host(s) x $per GPU(s) ${env:-(defaults)}"
  for op in $OPS; do
    for who in nccl oxccl; do
      pre=()
      [ $who = oxccl ] && pre=(LD_PRELOAD="$LIB" BENCH_LABEL=oxccl)
      t=$(date +%s)
      "${run[@]}" "${pre[@]}" LIMIT=240 LOGDIR= tools/netns_run.sh "$PY" tools/torch_bench.py "$op" "$LO" "$HI" \
        >"$OUT/${s}_${who}_$op.txt" 2>&1
      rc=$?
      [ $rc = 0 ] || { echo "   $op on $who: rc $rc after $(($(date +%s) - t)) s"; status=1; tail -3 "$OUT/${s}_${who}_$op.txt"; }
    done
    echo "## $s $op"
    side "$OUT/${s}_nccl_$op.txt" "$OUT/${s}_oxccl_$op.txt"
  done
  t=$(date +%s)
  mkdir -p "$OUT/${s}_perf"
  "${run[@]}" NCCL_DEBUG=INFO LIMIT=300 LOGDIR="$OUT/${s}_perf" tools/netns_run.sh "$OXCCL" perf --device cuda \
    --op all -b 8 -e "${PERF_HI:-1G}" -f 8 -n 5 -w 2 >"$OUT/${s}_perf/rank0.txt" 2>&1
  rc=$?
  wrong=$(awk '/^ +[0-9]+ / && NF >= 12 {w += $9 + $13; n++} END {print w + 0, n + 0}' "$OUT/${s}_perf/rank0.txt")
  echo "## $s: oxccl perf --op all rc $rc in $(($(date +%s) - t)) s, #wrong ${wrong% *} over ${wrong#* } rows"
  grep -hE "Channel 00(/0)? : " "$OUT/${s}_perf"/rank*.txt | sed 's/.*NCCL INFO //' | sort -u | head -12
  [ $rc = 0 ] && [ "${wrong% *}" = 0 ] || status=1
done
exit $status
