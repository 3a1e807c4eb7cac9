#!/bin/bash
# PyTorch DDP with 2 and 4 processes on GPU 0 over oxccl (with and without
# device_id), each against one process on the same global batch; then the
# same under MPS when nvidia-cuda-mps-control is there (a private pipe
# directory, stopped at the end; NO_MPS=1 skips it). Usage: run_shared_gpu.sh LIBNCCL OUTDIR
set -u
LIB=$1 OUT=$2
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
mkdir -p "$OUT" /tmp/oxccl-torch && cp "$LIB" /tmp/oxccl-torch/libnccl.so.2
rc=0
round() {
  local tag=$1
  for n in 2 4; do
    $PY "$HERE/shared_gpu_ddp.py" single $n "$OUT/single$n.json" || rc=1
    for dev in "" --no-device-id; do
      f="$OUT/${tag}_n${n}${dev}.json"
      LD_PRELOAD=/tmp/oxccl-torch/libnccl.so.2 timeout 300 $PY -m torch.distributed.run \
        --nproc-per-node $n --master-port $((29600 + n)) "$HERE/shared_gpu_ddp.py" dist "$f" $dev \
        > "$OUT/${tag}_n${n}${dev}.log" 2>&1 || { echo "$tag n=$n $dev failed"; tail -5 "$OUT/${tag}_n${n}${dev}.log"; rc=1; }
      $PY "$HERE/shared_gpu_ddp.py" compare "$OUT/single$n.json" "$f" || rc=1
    done
  done
}
round plain
if [ -z "${NO_MPS:-}" ] && command -v nvidia-cuda-mps-control >/dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/oxmps-torch CUDA_MPS_LOG_DIRECTORY=/tmp/oxmps-torch-log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  nvidia-cuda-mps-control -d && round mps
  echo quit | nvidia-cuda-mps-control
fi
exit $rc
