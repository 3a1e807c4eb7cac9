#!/bin/bash
# Session 18 (one H200, host only): streaming stores for the direct path's large reads, by the new
# rule of 728d081 amended (streaming once the buffers, input and output unless in place, exceed half the cache) against never (=0),
# alternating: 8 and 4 processes two rounds each; Gloo 8 before and after.
export CUDA_VISIBLE_DEVICES= OXCCL_HOST_MEMORY=1 NCCL_TIMEOUT=30
D=.dev/s18j; O=$OUT/o; mkdir -p $O; S=$OUT/summary.txt; : > $S
run() { local n=$1 r=$2 st=$3
  env ${st:+OXCCL_HOST_DIRECT_STREAM=$st} timeout 100 $D/oxccl perf --ranks $n --op all_reduce,all_gather -b 4M -e 256M -f 4 -n 10 -w 2 > $O/n${n}_r${r}_s${st:-auto}.txt 2>&1
  echo "== ranks $n round $r stream ${st:-auto} rc $?" >> $S
  awk '/^# [a-z_]+$/{op=$2} /^ +[0-9]+ / && NF>=12 {print op, $1, $8, $12, $9 + $13}' $O/n${n}_r${r}_s${st:-auto}.txt >> $S; }
timeout 150 /opt/torch/.venv/bin/torchrun --nproc-per-node 8 --master-port 29508 tools/gloo_bench.py 4M 256M > $O/gloo8a.txt 2>&1
echo "== gloo 8 a rc $?" >> $S; grep -E "^ +[0-9]" $O/gloo8a.txt >> $S
for r in 1 2; do run 8 $r ""; run 8 $r 0; done
for r in 1 2; do run 4 $r ""; run 4 $r 0; done
timeout 150 /opt/torch/.venv/bin/torchrun --nproc-per-node 8 --master-port 29508 tools/gloo_bench.py 4M 256M > $O/gloo8.txt 2>&1
echo "== gloo 8 rc $?" >> $S; grep -E "^ +[0-9]" $O/gloo8.txt >> $S
(cd $O && tar czf $OUT/o.tgz .)
cat $S
