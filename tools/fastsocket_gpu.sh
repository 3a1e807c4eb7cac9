#!/usr/bin/env bash
# Google's Fast Socket net plugin (built here by tools/fastsocket.sh build)
# on the GPU machine, under NCCL 2.28.9 and under oxccl, same .so: two
# "hosts" as network namespaces joined by veth (tools/netns_run.sh: distinct
# NCCL_HOSTID, NCCL_SOCKET_IFNAME = the veth), both ranks on GPU 0.
#   1. oxccl perf --device cuda --op all through the plugin (#wrong checked
#      on every size of all 7 collectives);
#   2. tools/torch_bench.py, every collective, once on NCCL 2.28.9 (PyTorch's
#      own) and once on oxccl (LD_PRELOAD of its libnccl.so.2), the plugin
#      loaded by both through NCCL_NET_PLUGIN.
# Writes $OUT/fastsocket_gpu.txt (the tables and checks) and one log per run.
#   tools/fastsocket_gpu.sh            (root; run from the repository root)
# Binaries, carried in .dev/ (no cargo there): .dev/oxccl, .dev/lib/libnccl.so.2,
# .dev/bin/{ip,tc}, .dev/fastsocket/libnccl-net-fastsocket.so; override with
# OXCCL, OXCCL_LIB, FASTSOCKET_SO. SIZES for torch_bench ("8 128M", FACTOR 16),
# PERF_SIZES for oxccl perf ("-b 8 -e 128M -f 16"), OPS (all 7), ITERS (10).
set -uo pipefail
cd "$(dirname "$0")/.."
. tools/plugin_bench.sh
out=${OUT:-/tmp}/fastsocket-gpu
mkdir -p "$out"
export PATH=$PWD/.dev/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export OXCCL_CACHE_DIR=${OXCCL_CACHE_DIR:-/tmp/oxk} NCCL_IB_DISABLE=1 ITERS=${ITERS:-10} FACTOR=${FACTOR:-16}
bin=${OXCCL:-$PWD/.dev/oxccl}
lib=${OXCCL_LIB:-$PWD/.dev/lib/libnccl.so.2}
so=${FASTSOCKET_SO:-$PWD/.dev/fastsocket/libnccl-net-fastsocket.so}
py=${PYTHON:-/opt/torch/.venv/bin/python}
ops=${OPS:-all_reduce broadcast reduce all_gather reduce_scatter all_to_all sendrecv}
read -r lo hi <<<"${SIZES:-8 128M}"
status=0
for f in "$bin" "$lib" "$so"; do
  [ -f "$f" ] || { echo "missing $f (see the header of this script)"; exit 2; }
done
net=(NCCL_NET_PLUGIN="$so" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET)
{
  echo "## plugin $so ($(nm -D --defined-only "$so" | grep -o 'ncclNetPlugin_v[0-9]*' | tr '\n' ' '))"
  echo "## oxccl perf --device cuda, 2 namespaces on GPU 0, through Fast Socket"
  step env "${net[@]}" LIMIT=300 LOG1="$out/perf_r1.log" tools/netns_perf.sh "$bin" --device cuda \
    --op all ${PERF_SIZES:--b 8 -e 128M -f 16} -n 5 -w 1 >"$out/perf.log" 2>&1
  grep -E '^# [a-z_]+$|^ +[0-9]+ |Out of bounds' "$out/perf.log"
  want "$out/perf.log" 'loaded net plugin FastSocket from .*ncclNetPlugin_v6'
  want "$out/perf.log" 'via NET/FastSocket'
  want "$out/perf.log" 'Out of bounds values : 0 OK'
  torch_ops FastSocket
  echo "## WARN lines per log (Fast Socket's own 'Maximum retry reached' included):"
  grep -c WARN "$out"/*.log
  echo "## /dev/shm oxccl entries left: $(ls /dev/shm | grep -c oxccl)"
  echo "## $([ $status = 0 ] && echo 'all passed' || echo FAILED)"
  [ $status = 0 ]
} 2>&1 | tee "$out/fastsocket_gpu.txt"
exit "${PIPESTATUS[0]}"
