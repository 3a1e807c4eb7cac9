#!/bin/bash
# Session 20 (one H200): the device tree all-reduce. Checks of the tree, one binary tree on every
# channel, through the kernels (OXCCL_SHARED_GPU=kernels: every rank runs its own kernels, ranks
# of one process on the one GPU): NCCL_ALGO=Tree on 3, 4, 5 and 8 ranks, #wrong, and the ring
# forced in the same call for the times; TRACE COLL lines name the algorithm of each call. Then
# 4 and 8 "hosts" (tools/netns_run.sh, one rank each, through the net): the default (the model
# takes the tree for small sizes across 8 nodes) and NCCL_ALGO=Ring. Then the standard checks.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=60
D=.dev/s20b; O=$OUT/o; mkdir -p $O; S=$OUT/summary.txt; nvidia-smi -L > $S
w() { awk '/^ +[0-9]+ / && NF >= 12 {w += $9 + $13; n++} END {print "#wrong " w+0 " over " n+0 " rows"}' $1; }
algos() { grep -o "all_reduce([^)]*) *#*[0-9]*: [A-Za-z]* on [0-9]* channel" $1 | sed 's/.*: //' | sort | uniq -c | tr '\n' ';'; }
for g in 3 4 5 8; do
  OXCCL_SHARED_GPU=kernels NCCL_ALGO=Tree NCCL_DEBUG=TRACE NCCL_DEBUG_SUBSYS=COLL timeout 60 $D/oxccl perf --device cuda -g $g --op all_reduce -b 8 -e 64K -f 32 -n 2 -w 1 > $O/tree_g${g}_trace.txt 2>&1
  echo "== -g $g NCCL_ALGO=Tree TRACE rc $? $(w $O/tree_g${g}_trace.txt); $(algos $O/tree_g${g}_trace.txt)" >> $S
  for a in Tree Ring; do
    OXCCL_SHARED_GPU=kernels NCCL_ALGO=$a timeout 100 $D/oxccl perf --device cuda -g $g --op all_reduce -b 8 -e 256M -f 8 -n 10 -w 3 > $O/${a}_g$g.txt 2>&1
    echo "== -g $g NCCL_ALGO=$a rc $? $(w $O/${a}_g$g.txt)" >> $S
  done
done
for h in 4 8; do
  NCCL_DEBUG=TRACE NCCL_DEBUG_SUBSYS=COLL HOSTS=$h LIMIT=150 timeout 160 tools/netns_run.sh $D/oxccl perf --device cuda --op all_reduce -b 8 -e 4M -f 8 -n 3 -w 1 > $O/hosts${h}_default.txt 2>&1
  echo "== $h hosts default rc $? $(w $O/hosts${h}_default.txt); $(algos $O/hosts${h}_default.txt)" >> $S
  NCCL_ALGO=Ring HOSTS=$h LIMIT=150 timeout 160 tools/netns_run.sh $D/oxccl perf --device cuda --op all_reduce -b 8 -e 4M -f 8 -n 3 -w 1 > $O/hosts${h}_ring.txt 2>&1
  echo "== $h hosts NCCL_ALGO=Ring rc $? $(w $O/hosts${h}_ring.txt)" >> $S
done
timeout 150 $D/gpu_collectives > $O/gpu_collectives.txt 2>&1; echo "== gpu_collectives rc $? $(grep 'test result' $O/gpu_collectives.txt)" >> $S
timeout 150 env OXCCL_BIN=$PWD/$D/oxccl $D/gpu_shared > $O/gpu_shared.txt 2>&1; echo "== gpu_shared rc $? $(grep 'test result' $O/gpu_shared.txt)" >> $S
timeout 120 $D/gpu_tuner > $O/gpu_tuner.txt 2>&1; echo "== gpu_tuner rc $? $(grep 'test result' $O/gpu_tuner.txt)" >> $S
timeout 90 $D/oxccl perf --device cuda --ranks 2 --op all -b 8 -e 64M -f 16 -n 5 -w 2 > $O/dev2.txt 2>&1; echo "== device 2 ranks one GPU rc $? $(w $O/dev2.txt)" >> $S
LIMIT=120 timeout 130 tools/netns_run.sh $D/oxccl perf --device cuda --op all -b 8 -e 64M -f 16 -n 5 -w 2 > $O/netns.txt 2>&1; echo "== device 2 hosts through the net rc $? $(w $O/netns.txt)" >> $S
echo "/dev/shm left: $(ls /dev/shm | grep -c oxccl)" >> $S
(cd $O && tar czf $OUT/o.tgz .)
cat $S
