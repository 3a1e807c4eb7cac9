#!/bin/bash
# Session 20 (one H200, host only): the final code (2cffa65; the direct host path unchanged since
# session 19) against Gloo, 1 to 256 MiB: three alternating rounds at 8 processes, one at 4.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=30 CUDA_VISIBLE_DEVICES= OXCCL_HOST_MEMORY=1
D=.dev/s20e; O=$OUT/o; mkdir -p $O; S=$OUT/summary.txt; : > $S
uname -r >> $S; nproc >> $S; grep -m1 "model name" /proc/cpuinfo >> $S
round() { # procs round
  timeout 150 /opt/torch/.venv/bin/torchrun --nproc-per-node $1 --master-port 29508 tools/gloo_bench.py 1M 256M > $O/gloo$1_r$2.txt 2>&1
  echo "== gloo $1 round $2 rc $?" >> $S; grep -E "^ +[0-9]" $O/gloo$1_r$2.txt >> $S
  timeout 120 $D/oxccl perf --ranks $1 --op all_reduce -b 1M -e 256M -f 4 -n 10 -w 2 > $O/ox$1_r$2.txt 2>&1
  echo "== oxccl $1 round $2 rc $?" >> $S; grep -E "^ +[0-9]" $O/ox$1_r$2.txt | awk '{print $1, $6, $8, $9, $10, $12, $13}' >> $S
}
for r in 1 2 3; do round 8 $r; done
round 4 1
(cd $O && tar czf $OUT/o.tgz .)
cat $S
