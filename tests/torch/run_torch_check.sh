#!/bin/bash
# PyTorch on NCCL, then on oxccl, same GPUs, same script; compares the DDP
# losses. Usage: run_torch_check.sh PATH/TO/oxccl/libnccl.so OUTDIR
set -u
LIB=$1 OUT=$2
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python}
export NCCL_NVLS_ENABLE=0
mkdir -p "$OUT" /tmp/oxccl-torch && cp "$LIB" /tmp/oxccl-torch/libnccl.so.2
TR="$PY -m torch.distributed.run --nproc-per-node 2 --master-port"
timeout 300 $TR 29511 "$HERE/torch_on_oxccl.py" "$OUT/torch_nccl.json" > "$OUT/torch_nccl.log" 2>&1
echo "NCCL run rc=$?"
NCCL_DEBUG=VERSION LD_PRELOAD=/tmp/oxccl-torch/libnccl.so.2 timeout 300 $TR 29512 "$HERE/torch_on_oxccl.py" "$OUT/torch_oxccl.json" > "$OUT/torch_oxccl.log" 2>&1
echo "oxccl run rc=$?"
grep -E "^rank|NCCL version|FAILED" "$OUT/torch_nccl.log" "$OUT/torch_oxccl.log"
$PY "$HERE/torch_on_oxccl.py" --compare "$OUT/torch_nccl.json" "$OUT/torch_oxccl.json" | tee "$OUT/torch_compare.txt"
