#!/bin/bash
# Session 19 call 3 (one H200, host only): exp/prof build; the direct path's local meeting of a
# rank's threads: std Barrier (futex) against polling ones, alternating, 8 and 4 ranks.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=30 CUDA_VISIBLE_DEVICES= OXCCL_HOST_MEMORY=1
D=.dev/s19c; O=$OUT/o; mkdir -p $O; S=$OUT/summary.txt; : > $S
run() { # name ranks env...
  local name=$1 n=$2; shift 2
  env "$@" timeout 60 $D/oxccl perf --ranks $n --op all_reduce -b 16M -e 64M -f 4 -n 20 -w 2 > $O/$name.txt 2>&1
  echo "== $name n=$n ($*) rc $?" >> $S; grep -E "^ +[0-9]" $O/$name.txt | awk '{print $1, $6, $8, $9, $10, $12, $13}' >> $S
}
gloo() {
  timeout 100 /opt/torch/.venv/bin/torchrun --nproc-per-node 8 --master-port 29508 tools/gloo_bench.py 16M 64M > $O/gloo$1.txt 2>&1
  echo "== gloo$1 rc $?" >> $S; grep -E "^ +[0-9]" $O/gloo$1.txt >> $S
}
gloo 1
for r in 1 2 3 4; do
  for m in 0 1 2 3; do run m$m.$r 8 OXCCL_X_SPINBAR=$m; done
done
for r in 1 2; do
  for m in 0 2; do run q$m.$r 4 OXCCL_X_SPINBAR=$m; done
done
gloo 2
(cd $O && tar czf $OUT/o.tgz .)
cat $S
