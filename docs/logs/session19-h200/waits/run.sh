#!/bin/bash
# Session 19 call 2 (one H200, host only): exp/prof build; the 8-rank direct all_reduce at 16 and
# 64 MiB with its waits changed (spinning local barrier, no sleeps, more spins), alternating.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=30 CUDA_VISIBLE_DEVICES= OXCCL_HOST_MEMORY=1
D=.dev/s19b; O=$OUT/o; mkdir -p $O; S=$OUT/summary.txt; : > $S
run() { # name env...
  local name=$1; shift
  env "$@" OXCCL_DIRECT_PROF=1 timeout 60 $D/oxccl perf --ranks 8 --op all_reduce -b 16M -e 64M -f 4 -n 20 -w 2 > $O/$name.txt 2>&1
  echo "== $name ($*) rc $?" >> $S; grep -E "^ +[0-9]" $O/$name.txt | awk '{print $1, $6, $8, $9, $10, $12, $13}' >> $S
}
gloo() {
  timeout 100 /opt/torch/.venv/bin/torchrun --nproc-per-node 8 --master-port 29508 tools/gloo_bench.py 16M 64M > $O/gloo$1.txt 2>&1
  echo "== gloo$1 rc $?" >> $S; grep -E "^ +[0-9]" $O/gloo$1.txt >> $S
}
gloo 1
for r in 1 2 3; do
  run base$r X=1
  run bar$r OXCCL_X_SPINBAR=1
  run nosleep$r OXCCL_X_NOSLEEP=1
  run both$r OXCCL_X_SPINBAR=1 OXCCL_X_NOSLEEP=1
  run spin$r OXCCL_X_SPINBAR=1 OXCCL_X_NOSLEEP=1 OXCCL_X_SPINS=200000
done
gloo 2
(cd $O && tar czf $OUT/o.tgz .)
cat $S
