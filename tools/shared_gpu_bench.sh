#!/usr/bin/env bash
# Ranks sharing one GPU (issue 17), for the GPU machine (no cargo there).
# Build here and carry .dev/shgpu:
#   tools/shared_gpu_bench.sh build
# Then there (one GPU is enough; at most 7.5 minutes; results under $OUT):
#   bash tools/shared_gpu_bench.sh run
# What it runs, each bounded by `timeout`:
#   - core/tests/gpu_shared_local.rs (ranks of one process on GPU 0, as
#     threads and from one thread, every collective checked) and
#     core/tests/gpu_stream_order.rs (the local reduce kernel with an output
#     aliasing an input);
#   - cli/tests/gpu_shared.rs (-g 2/4, --ranks 2/3, OXCCL_SHARED_GPU=kernels);
#   - oxccl perf all_reduce 8 B-256 MiB with -g 2 and -g 4 (one process,
#     the in-process path), the same with OXCCL_SHARED_GPU=kernels (the
#     ring kernels before it), --ranks 2 and 4 (processes: the fused
#     reduce kernel), and every collective with -g 2 and -g 4.
set -euo pipefail
cd "$(dirname "$0")/.."
dev=.dev/shgpu

if [ "${1:-}" = build ]; then
  : "${CARGO_TARGET_DIR:=target}"
  mkdir -p "$dev"
  cargo build --release -p oxccl-cli --bin oxccl
  cp "$CARGO_TARGET_DIR/release/oxccl" "$dev/oxccl"
  # The test binary is the artifact whose target is the test (cargo also
  # lists the package's binary).
  test_exe() { # package test
    cargo test --release -p "$1" --test "$2" --no-run --message-format=json 2>/dev/null |
      grep "\"kind\":\[\"test\"\],\"crate_types\":\[\"bin\"\],\"name\":\"$2\"" |
      sed -n 's/.*"executable":"\([^"]*\)".*/\1/p'
  }
  cp "$(test_exe oxccl gpu_shared_local)" "$dev/gpu_shared_local"
  cp "$(test_exe oxccl gpu_stream_order)" "$dev/gpu_stream_order"
  cp "$(test_exe oxccl-cli gpu_shared)" "$dev/gpu_shared"
  # Debug info would take the binaries past what travels to the GPU machine.
  strip "$dev"/*
  ls -la "$dev"
  exit 0
fi

export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 CUDA_VISIBLE_DEVICES=0
out=${OUT:-/tmp}/shared-gpu
mkdir -p "$out"
nvidia-smi -L 2>&1 | head -2 | tee "$out/gpu.txt" || true
oxccl=$(pwd)/$dev/oxccl
status=0
step() { # name seconds command...
  local name=$1 secs=$2
  shift 2
  echo "== $name: $*" | tee -a "$out/summary.txt"
  local t0=$SECONDS rc=0
  timeout "$secs" "$@" >"$out/$name.txt" 2>&1 || rc=$?
  echo "   rc $rc in $((SECONDS - t0)) s" | tee -a "$out/summary.txt"
  grep -E "wrong|Avg bus|passed|failed|panicked|shares its GPU" "$out/$name.txt" | head -12 >>"$out/summary.txt" || true
  [ "$rc" = 0 ] || status=1
}

step test_local 90 "$dev/gpu_shared_local" --test-threads 1 --nocapture
step test_stream_order 30 "$dev/gpu_stream_order" --test-threads 1 --nocapture
step test_cli_shared 80 env OXCCL_BIN="$oxccl" "$dev/gpu_shared" --nocapture

ar=(--op all_reduce -b 8 -e 256M -f 4 -n 10 -w 3 --time-limit 30)
step perf_g2_all_reduce 35 env NCCL_DEBUG=INFO "$oxccl" perf --device cuda -g 2 "${ar[@]}"
step perf_g4_all_reduce 35 env NCCL_DEBUG=INFO "$oxccl" perf --device cuda -g 4 "${ar[@]}"
step perf_g2_all_reduce_ring 35 env OXCCL_SHARED_GPU=kernels "$oxccl" perf --device cuda -g 2 "${ar[@]}"
step perf_ranks2_all_reduce 35 "$oxccl" perf --device cuda --ranks 2 "${ar[@]}"
step perf_ranks4_all_reduce 35 "$oxccl" perf --device cuda --ranks 4 "${ar[@]}"
step perf_g2_all 45 "$oxccl" perf --device cuda -g 2 --op all -b 8 -e 256M -f 32 -n 5 -w 1 --time-limit 40
step perf_g4_all 45 "$oxccl" perf --device cuda -g 4 --op all -b 8 -e 64M -f 64 -n 5 -w 1 --time-limit 40

# The lines to read: 8 B time and 256 MiB busbw per run.
for f in "$out"/perf_*all_reduce*.txt; do
  echo "== $(basename "$f")"
  grep -E "^ +(8|268435456) " "$f" || true
done | tee -a "$out/summary.txt"
ls /dev/shm | grep -c oxccl | sed 's/^/oxccl entries left in \/dev\/shm: /' | tee -a "$out/summary.txt" || true
exit $status
