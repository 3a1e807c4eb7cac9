#!/bin/bash
# Session 18 last call (one H200, host only): main 55d985c, 8 processes at 16 and 64 MiB, Gloo and
# oxccl alternating, four rounds, for the ratio at the size still short of 3x.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=30 CUDA_VISIBLE_DEVICES= OXCCL_HOST_MEMORY=1
D=.dev/s18k; O=$OUT/o; mkdir -p $O; S=$OUT/summary.txt; : > $S
for r in 1 2 3 4; do
  timeout 100 /opt/torch/.venv/bin/torchrun --nproc-per-node 8 --master-port 29508 tools/gloo_bench.py 16M 64M > $O/gloo_r$r.txt 2>&1
  echo "== gloo round $r rc $?" >> $S; grep -E "^ +[0-9]" $O/gloo_r$r.txt >> $S
  timeout 60 $D/oxccl perf --ranks 8 --op all_reduce -b 16M -e 64M -f 4 -n 20 -w 2 > $O/ox_r$r.txt 2>&1
  echo "== oxccl round $r rc $?" >> $S; grep -E "^ +[0-9]" $O/ox_r$r.txt | awk '{print $1, $6, $8, $9, $10, $12, $13}' >> $S
done
(cd $O && tar czf $OUT/o.tgz .)
cat $S
