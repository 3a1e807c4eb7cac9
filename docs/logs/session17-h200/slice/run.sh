#!/bin/bash
# Issue 13: all-reduce in slices (OXCCL_HOST_DIRECT_SLICE) on the 16-core machine, 8 and 4 processes,
# beside Gloo (THP asked) in the same call.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 CUDA_VISIBLE_DEVICES= OXCCL_HOST_MEMORY=1 NCCL_TIMEOUT=30
D=.dev/s17a; O=$OUT/slice; mkdir -p $O; S=$OUT/slice_summary.txt
echo "cores $(nproc)" > $S
ox() { # n slice tag
  timeout 100 env OXCCL_HOST_DIRECT_SLICE=$2 $D/oxccl perf --ranks $1 --op all_reduce -b 1M -e 256M -f 4 -n 10 -w 2 > $O/ox$1_$3.txt 2>&1
  echo "== oxccl $1 slice $2 rc $?" >> $S
  grep -E "^ +[0-9]" $O/ox$1_$3.txt | awk '{print $1, $6, $8, $9, $10, $12, $13}' >> $S
}
timeout 120 env THP_MEM_ALLOC_ENABLE=1 C10_THP_MEM_ALLOC_ENABLE=1 /opt/torch/.venv/bin/torchrun --nproc-per-node 8 tools/gloo_bench.py 1M 256M > $O/gloo8.txt 2>&1
echo "== gloo 8 rc $?" >> $S; grep -E "^ +[0-9]" $O/gloo8.txt >> $S
ox 8 0 a; ox 8 1M a; ox 8 256K a; ox 8 4M a; ox 8 0 b; ox 8 1M b; ox 8 2M a
ox 4 0 a; ox 4 1M a
(cd $O && tar czf $OUT/slice.tgz .)
cat $S
