#!/bin/bash
# Session 18 call 2 (one H200, host only): the direct path's all-reduce in lanes and slices
# (prototype pull.c) against oxccl perf (whole parts and OXCCL_HOST_DIRECT_SLICE) and Gloo, 8 procs.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=30 CUDA_VISIBLE_DEVICES= OXCCL_HOST_MEMORY=1
D=.dev/s18b; O=$OUT/o; mkdir -p $O; S=$OUT/summary.txt; : > $S
ox() { local tag=$1; shift; env "$@" timeout 100 $D/oxccl perf --ranks 8 --op all_reduce -b 16M -e 256M -f 4 -n 10 -w 2 > $O/ox_$tag.txt 2>&1
  echo "== oxccl 8 $tag rc $?" >> $S; grep -E "^ +[0-9]" $O/ox_$tag.txt | awk '{print $1, $6, $8, $9, $10, $12, $13}' >> $S; }
pr() { for sz in 16 64 256; do timeout 60 $D/pull 8 $1 $sz $2 10 >> $S; done; }
ox whole
pr 2 0; pr 2 256; pr 2 1024; pr 2 4096
ox slice1M OXCCL_HOST_DIRECT_SLICE=1048576
pr 2 0; pr 2 512; pr 2 1024
pr 1 1024; pr 3 1024
ox whole2
timeout 120 /opt/torch/.venv/bin/torchrun --nproc-per-node 8 --master-port 29508 tools/gloo_bench.py 16M 256M > $O/gloo8.txt 2>&1
echo "== gloo 8 rc $?" >> $S; grep -E "^ +[0-9]" $O/gloo8.txt >> $S
(cd $O && tar czf $OUT/o.tgz .)
cat $S
