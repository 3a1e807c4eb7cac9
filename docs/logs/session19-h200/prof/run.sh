#!/bin/bash
# Session 19 call 1 (one H200, host only): exp/prof build, per-thread time split of the 8-rank
# direct all_reduce at 16 and 64 MiB, and read-chunk variants, alternating; Gloo once.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=30 CUDA_VISIBLE_DEVICES= OXCCL_HOST_MEMORY=1
D=.dev/s19a; O=$OUT/o; mkdir -p $O; S=$OUT/summary.txt; : > $S
uname -r >> $S; nproc >> $S
run() { # name env...
  local name=$1; shift
  env "$@" OXCCL_DIRECT_PROF=1 timeout 60 $D/oxccl perf --ranks 8 --op all_reduce -b 16M -e 64M -f 4 -n 20 -w 2 > $O/$name.txt 2>&1
  echo "== $name ($*) rc $?" >> $S; grep -E "^ +[0-9]" $O/$name.txt | awk '{print $1, $6, $8, $9, $10, $12, $13}' >> $S
}
timeout 100 /opt/torch/.venv/bin/torchrun --nproc-per-node 8 --master-port 29508 tools/gloo_bench.py 16M 64M > $O/gloo.txt 2>&1
echo "== gloo rc $?" >> $S; grep -E "^ +[0-9]" $O/gloo.txt >> $S
for r in 1 2; do
  run base$r X=1
  run r256k$r OXCCL_X_RCHUNK=256K
  run g256k$r OXCCL_X_GCHUNK=256K
  run g1m$r OXCCL_X_GCHUNK=1M
  run r32k$r OXCCL_X_RCHUNK=32K
  run nostream$r OXCCL_HOST_DIRECT_STREAM=0
done
(cd $O && tar czf $OUT/o.tgz .)
cat $S
