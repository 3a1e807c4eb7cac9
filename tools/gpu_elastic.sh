#!/bin/bash
# Issue 16 on a GPU: tests/tests/gpu_elastic.rs (4 processes sharing GPU 0,
# rank 1 SIGKILLed mid-stream; revoke + NCCL_SHRINK_DEFAULT and
# NCCL_SHRINK_ABORT, on the shared-GPU leader path and on every rank's
# kernels; 100 checked all_reduces after), then PyTorch's shrink_group in
# both modes (tests/torch/elastic_shrink.py). The same binary holds the
# suspend/resume tests (gpu_suspend_resume_*: 3 cycles, memory figures and
# checked all-reduces); FILTER=gpu_suspend_resume runs only those (and
# TORCH=0 skips PyTorch).
#
# Built beforehand where cargo runs:
#   cargo test --no-run --release -p oxccl-tests --test gpu_elastic
#   cp target/release/deps/gpu_elastic-<hash> .dev/gt/gpu_elastic && strip .dev/gt/gpu_elastic
# and the library as .dev/lib/libnccl.so.2 (cargo build --release -p oxccl-capi).
# On the device, from the repository root: OUT=<logs> bash tools/gpu_elastic.sh
set -u
GT=${GT:-.dev/gt}
LIB=${LIB:-.dev/lib/libnccl.so.2}
OUT=${OUT:-/tmp/oxccl-gpu-elastic}
mkdir -p "$OUT"
s=$(date +%s)
timeout 420 "$GT/gpu_elastic" ${FILTER:-} --test-threads=1 --nocapture >"$OUT/gpu_elastic.txt" 2>&1
echo "gpu_elastic rc $? in $(($(date +%s) - s)) s"
grep -E "^test |test result|PASS rank|shrink \(|cycle [0-9]:|all_reduce #[0-9]+ (hung|failed)|panicked" "$OUT/gpu_elastic.txt" | tail -80
[ "${TORCH:-1}" = 0 ] && exit 0
for mode in abort default; do
    s=$(date +%s)
    LD_PRELOAD="$PWD/$LIB" NCCL_TIMEOUT=10 OUT="$OUT/torch-$mode" timeout 260 \
        python tests/torch/elastic_shrink.py --nproc 4 --mode "$mode" >"$OUT/torch_$mode.txt" 2>&1
    echo "torch $mode rc $? in $(($(date +%s) - s)) s"
    tail -16 "$OUT/torch_$mode.txt"
done
