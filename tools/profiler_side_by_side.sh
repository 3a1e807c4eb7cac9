#!/usr/bin/env bash
# NCCL's example profiler and Inspector under NCCL and under oxccl, the same
# PyTorch program (tools/profile_workload.py) on 2 GPUs, for the GPU
# machine with 2 GPUs (nvidia-h100-x2 / nvidia-h200-x2). Build here first
# and carry .dev/sbs:
#   tools/nccl_profilers.sh build .dev/sbs/prof        (NCCL's plugins)
#   cargo build --release -p oxccl-capi && cp $CARGO_TARGET_DIR/release/libnccl.so .dev/sbs/libnccl.so.2
# Then there:  bash tools/profiler_side_by_side.sh   (outputs under $OUT)
# Two transports: P2P (NVLink, no proxy) and the network (NCCL_P2P_DISABLE=1
# NCCL_SHM_DISABLE=1: proxy ops and steps, socket events). CFGS="p2p" and
# LIBS="oxccl" narrow the runs.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
out=${OUT:-/tmp}/sbs
mkdir -p "$out"
lib=$(pwd)/.dev/sbs/prof/lib
py=/opt/torch/.venv/bin
rt=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/cuda_runtime/lib 2>/dev/null | head -1 || true)
nvidia-smi -L | tee "$out/gpus.txt"
pools=()
for p in GROUP_API COLL_API P2P_API KERNEL_LAUNCH; do pools+=("NCCL_PROFILE_${p}_POOL_SIZE=4096"); done
pools+=(NCCL_PROFILE_COLL_POOL_SIZE=1024 NCCL_PROFILE_P2P_POOL_SIZE=1024)
run() { # lib cfg plugin dir env...
  local which=$1 cfg=$2 plugin=$3 d=$4; shift 4
  local pre=()
  [ "$which" = oxccl ] && pre=(LD_PRELOAD="$(pwd)/.dev/sbs/libnccl.so.2")
  mkdir -p "$d"
  env "${pre[@]}" LD_LIBRARY_PATH="${rt:+$rt:}$lib" NCCL_PROFILER_PLUGIN="$lib/libnccl-profiler-$plugin.so" \
    NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET "$@" \
    timeout 120 "$py/torchrun" --standalone --nproc-per-node 2 tools/profile_workload.py >"$d/run.log" 2>&1
  echo "$which $cfg $plugin: rc $? $(grep -h '#wrong' "$d/run.log" | head -1) $(grep -ho 'via [A-Za-z/0-9_]*' "$d/run.log" | sort | uniq -c | tr '\n' ' ')"
}
for cfg in ${CFGS:-p2p net}; do
  extra=()
  [ "$cfg" = net ] && extra=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1)
  for which in ${LIBS:-nccl oxccl}; do
    d=$out/$which-$cfg
    run "$which" "$cfg" example "$d/example-2" NCCL_PROFILE_EVENT_MASK=4095 \
      NCCL_PROFILE_DUMP_FILE="$d/example-2/trace" "${pools[@]}" "${extra[@]}"
    run "$which" "$cfg" inspector "$d/inspector-2" NCCL_INSPECTOR_ENABLE=1 \
      NCCL_INSPECTOR_DUMP_DIR="$d/inspector-2/dump" NCCL_INSPECTOR_DUMP_VERBOSE=1 \
      NCCL_INSPECTOR_DUMP_MIN_SIZE_BYTES=0 NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS=500 "${extra[@]}"
    bash tools/nccl_profilers.sh summary "$d" >"$d/summary.txt" 2>&1
  done
  [ -d "$out/nccl-$cfg" ] && [ -d "$out/oxccl-$cfg" ] || { cat "$out"/*-"$cfg"/summary.txt; continue; }
  echo "## $cfg: example profiler, NCCL vs oxccl" | tee "$out/compare-$cfg.txt"
  python3 tools/profiler_compare.py "$out/nccl-$cfg/example-2" "$out/oxccl-$cfg/example-2" | tee -a "$out/compare-$cfg.txt"
  grep -h "Inspector\|records" "$out"/*-"$cfg"/summary.txt | tee -a "$out/compare-$cfg.txt"
done
