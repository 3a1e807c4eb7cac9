#!/usr/bin/env bash
# Many communicators on one GPU (issue 43, item 4), oxccl beside NCCL:
# 2 ranks as 2 hosts (distinct NCCL_HOSTID) on GPU 0, each making one
# communicator and COUNT (64) split from it, then one all_reduce on each
# (tools/many_comms.c, built against capi's nccl.h). The same binary runs
# twice, LD_LIBRARY_PATH picking oxccl's libnccl.so.2, then NCCL's (2.28.9
# from the PyTorch environment). Prints each run's lines, then both side by
# side: split time, first-all_reduce time, the device's free-memory drop
# per communicator per rank (cudaMemGetInfo) and ncclCommMemStats where
# the library has it.
#   tools/many_comms.sh [COUNT]                       (GPU machine)
# NCCL_LIB / CUDART_LIB override the libraries found in the PyTorch venv;
# OXCCL_LIB (default target/release/libnccl.so, built when cargo is here)
# names oxccl's. Logs in $OUT/many-comms (OUT defaults to /tmp).
set -euo pipefail
cd "$(dirname "$0")/.."
count=${1:-64}
out=${OUT:-/tmp}/many-comms
mkdir -p "$out/lib-oxccl" "$out/lib-nccl"
venv=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia 2>/dev/null | head -1 || true)
nccl=${NCCL_LIB:-$(ls "$venv"/nccl/lib/libnccl.so.2 2>/dev/null | head -1 || true)}
cudart=${CUDART_LIB:-$(ls "$venv"/cuda_runtime/lib/libcudart.so.* "$venv"/cu*/lib/libcudart.so.* /usr/local/cuda/lib64/libcudart.so.* 2>/dev/null | head -1 || true)}
[ -n "$nccl" ] || { echo "no NCCL libnccl.so.2 under ${venv:-/opt/torch/.venv}: set NCCL_LIB"; exit 2; }
[ -n "$cudart" ] || { echo "no libcudart.so found: set CUDART_LIB"; exit 2; }
target=${CARGO_TARGET_DIR:-target}
oxccl=${OXCCL_LIB:-$target/release/libnccl.so}
if [ -z "${OXCCL_LIB:-}" ] && command -v cargo >/dev/null; then cargo build --release -q -p oxccl-capi; fi
[ -f "$oxccl" ] || { echo "no $oxccl: cargo build --release -p oxccl-capi"; exit 2; }
ln -sf "$(realpath "$oxccl")" "$out/lib-oxccl/libnccl.so.2"
ln -sf "$(realpath "$nccl")" "$out/lib-nccl/libnccl.so.2"
cc -O2 -Wall -Icapi/include -o "$out/many_comms" tools/many_comms.c \
  -L"$out/lib-oxccl" -l:libnccl.so.2 "$cudart" -Wl,-rpath,"$(dirname "$(realpath "$cudart")")" -ldl
echo "## GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader -i 0 2>/dev/null || echo '?')"
echo "## commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u '+%Y-%m-%d %H:%M UTC')"
rc=0
for lib in oxccl nccl; do
  rm -f "$out/id.$lib"
  pids=()
  for r in 0 1; do
    env NCCL_HOSTID="many-comms-host$r" NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 \
      LD_LIBRARY_PATH="$out/lib-$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
      timeout 600 "$out/many_comms" "$r" 2 "$out/id.$lib" "$count" >"$out/$lib.rank$r.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  echo "## $lib"
  cat "$out/$lib.rank0.log" "$out/$lib.rank1.log"
done
echo "## side by side ($count communicators, 2 ranks as 2 hosts on GPU 0)"
val() { grep -h "^$2" "$out/$1.rank0.log" 2>/dev/null | head -1 | awk '{print $2, $3, $4, $5}'; }
mem() { grep -h "^rank 0 memstats" "$out/$1.rank0.log" 2>/dev/null | sed 's/^rank 0 //'; }
printf '%-40s %-32s %-32s\n' "" oxccl nccl
for k in init_rank_ms split_ms first_all_reduce_ms device_free_drop_after_split_MiB device_free_drop_after_first_all_reduce_MiB destroy_ms; do
  printf '%-40s %-32s %-32s\n' "$k" "$(val oxccl $k)" "$(val nccl $k)"
done
printf '%-40s %-32s %-32s\n' "rank 0 ncclCommMemStats" "$(mem oxccl)" "$(mem nccl)"
exit $rc
