#!/usr/bin/env bash
# NCCL's example profiler and Inspector under oxccl on one GPU, 2 ranks
# (`oxccl perf --device cuda --ranks 2`), for the GPU machine (no cargo, no
# network there). Build here first and carry .dev/nccl-profilers:
#   tools/nccl_profilers.sh build .dev/nccl-profilers/build
#   cp $CARGO_TARGET_DIR/release/oxccl .dev/nccl-profilers/oxccl
# Then there:  bash tools/nccl_profilers_gpu.sh     (outputs under $OUT)
# The plugins link libcudart.so.12: PyTorch's runtime is put first on the
# library path (CUDART_DIR overrides); the stand-in next to the plugins is
# the fallback.
set -euo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
out=${OUT:-/tmp}/nccl-profilers-gpu
mkdir -p "$out"
cp -r .dev/nccl-profilers/build/lib "$out/"
nvidia-smi -L 2>&1 | head -2 || true
OXCCL=$(pwd)/.dev/nccl-profilers/oxccl DEVICE=cuda RANKS=${RANKS:-2} bash tools/nccl_profilers.sh run "$out"
