#!/bin/bash
# Session 18 (one H200, host only): the direct path's large reads straight into the destination
# (OXCCL_HOST_DIRECT_STREAM=0) against through scratch and streaming stores (=1), 8 processes,
# three alternating rounds, all_reduce and all_gather.
export CUDA_VISIBLE_DEVICES= OXCCL_HOST_MEMORY=1 NCCL_TIMEOUT=30
D=.dev/s18h; O=$OUT/o; mkdir -p $O; S=$OUT/summary.txt; : > $S
for r in 1 2 3; do for st in 0 1; do
  OXCCL_HOST_DIRECT_STREAM=$st timeout 100 $D/oxccl perf --ranks 8 --op all_reduce,all_gather -b 4M -e 256M -f 4 -n 10 -w 2 > $O/r${r}_s$st.txt 2>&1
  echo "== round $r stream $st rc $?" >> $S
  awk '/^# [a-z_]+$/{op=$2} /^ +[0-9]+ / && NF>=12 {print op, $1, $8, $12, $9 + $13}' $O/r${r}_s$st.txt >> $S
done; done
(cd $O && tar czf $OUT/o.tgz .)
cat $S
