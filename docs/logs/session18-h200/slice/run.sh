#!/bin/bash
# Session 18 call 3 (one H200, host only): all-reduce in 1 MiB slices (the new default) against
# whole parts (OXCCL_HOST_DIRECT_SLICE=0), alternating, 8 and 4 processes, beside Gloo.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=30 CUDA_VISIBLE_DEVICES= OXCCL_HOST_MEMORY=1
D=.dev/s18c; O=$OUT/o; mkdir -p $O; S=$OUT/summary.txt; : > $S
ox() { local n=$1 tag=$2; shift 2; env "$@" timeout 100 $D/oxccl perf --ranks $n --op all_reduce -b 1M -e 256M -f 4 -n 10 -w 2 > $O/ox${n}_$tag.txt 2>&1
  echo "== oxccl $n $tag rc $? $(grep -m1 -i 'huge\|heap' $O/ox${n}_$tag.txt | cut -c1-100)" >> $S; grep -E "^ +[0-9]" $O/ox${n}_$tag.txt | awk '{print $1, $6, $8, $9, $10, $12, $13}' >> $S; }
gloo() { timeout 150 /opt/torch/.venv/bin/torchrun --nproc-per-node $1 --master-port $((29500 + $1)) tools/gloo_bench.py 1M 256M > $O/gloo$1_$2.txt 2>&1
  echo "== gloo $1 $2 rc $?" >> $S; grep -E "^ +[0-9]" $O/gloo$1_$2.txt >> $S; }
gloo 8 a
for r in 1 2 3; do ox 8 slice$r; ox 8 whole$r OXCCL_HOST_DIRECT_SLICE=0; done
gloo 8 b
gloo 4 a
ox 4 slice1; ox 4 whole1 OXCCL_HOST_DIRECT_SLICE=0; ox 4 slice2
$D/oxccl perf --ranks 8 --op all -b 1M -e 64M -f 8 -n 2 -w 1 > $O/all8.txt 2>&1
echo "== all8 rc $? #wrong $(awk '/^ +[0-9]+ / && NF >= 12 {w += $9 + $13; n++} END {print w+0 " over " n+0 " rows"}' $O/all8.txt)" >> $S
echo "/dev/shm left: $(ls /dev/shm | grep -c oxccl)" >> $S
(cd $O && tar czf $OUT/o.tgz .)
cat $S
