#!/bin/bash
# Issue 13: naps with 1 us of timer slack (s17b) against the default 50 us (s17a), 8 and 4 processes,
# alternating, beside Gloo (THP asked) in the same call.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 CUDA_VISIBLE_DEVICES= OXCCL_HOST_MEMORY=1 NCCL_TIMEOUT=30
O=$OUT/slack; mkdir -p $O; S=$OUT/slack_summary.txt
echo "cores $(nproc)" > $S
ox() { # n build tag
  timeout 100 .dev/$2/oxccl perf --ranks $1 --op all_reduce -b 1M -e 256M -f 4 -n 10 -w 2 > $O/ox$1_$2_$3.txt 2>&1
  echo "== oxccl $1 $2 rc $?" >> $S
  grep -E "^ +[0-9]" $O/ox$1_$2_$3.txt | awk '{print $1, $6, $8, $9, $10, $12, $13}' >> $S
}
timeout 120 env THP_MEM_ALLOC_ENABLE=1 C10_THP_MEM_ALLOC_ENABLE=1 /opt/torch/.venv/bin/torchrun --nproc-per-node 8 tools/gloo_bench.py 1M 256M > $O/gloo8.txt 2>&1
echo "== gloo 8 rc $?" >> $S; grep -E "^ +[0-9]" $O/gloo8.txt >> $S
ox 8 s17b a; ox 8 s17a a; ox 8 s17b b; ox 8 s17a b; ox 8 s17b c
ox 4 s17b a; ox 4 s17a a
(cd $O && tar czf $OUT/slack.tgz .)
cat $S
