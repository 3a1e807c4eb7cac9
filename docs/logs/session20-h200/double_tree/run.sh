#!/bin/bash
# Session 20 (one H200): the double binary tree on the device (even channels on one tree, odd on the other). NCCL_ALGO=Tree is NCCL's tree row, where up to 8
# ranks recursive doubling (its LL cell) is cheaper; a rules tuner (liboxccl_tuner.so) picking
# tree/simple inside that row runs the tree. Ranks of one process on the one GPU, each running its
# own kernels (OXCCL_SHARED_GPU=kernels): 3, 4, 5, 8 ranks, TRACE COLL names each call's
# algorithm, then 8 B..256 MiB #wrong and times, with the ring forced in the same call; then 8
# "hosts" through the net (tools/netns_run.sh) with the tree forced the same way, 8 B..64 MiB.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=60
D=.dev/s20d; O=$OUT/o; mkdir -p $O; S=$OUT/summary.txt; nvidia-smi -L > $S
w() { awk '/^ +[0-9]+ / && NF >= 12 {w += $9 + $13; n++} END {print "#wrong " w+0 " over " n+0 " rows"}' $1; }
algos() { grep -o "all_reduce([^)]*) *#*[0-9]*: [A-Za-z]* on [0-9]* channel" $1 | sed 's/.*: //' | sort | uniq -c | tr '\n' ';'; }
printf '[[rule]]\ncollective = "all_reduce"\nalgorithm = "tree"\nprotocol = "simple"\n' > $O/tree.toml
export OXCCL_SHARED_GPU=kernels
TREE="NCCL_ALGO=Tree NCCL_TUNER_PLUGIN=$PWD/$D/liboxccl_tuner.so OXCCL_TUNER_CONFIG=$O/tree.toml"
for g in 3 4 5 8; do
  env $TREE NCCL_DEBUG=TRACE NCCL_DEBUG_SUBSYS=COLL timeout 60 $D/oxccl perf --device cuda -g $g --op all_reduce -b 8 -e 64M -f 32 -n 2 -w 1 > $O/tree_g${g}_trace.txt 2>&1
  echo "== -g $g tree TRACE rc $? $(w $O/tree_g${g}_trace.txt); $(algos $O/tree_g${g}_trace.txt)" >> $S
  env $TREE timeout 100 $D/oxccl perf --device cuda -g $g --op all_reduce -b 8 -e 256M -f 8 -n 10 -w 3 > $O/tree_g$g.txt 2>&1
  echo "== -g $g tree rc $? $(w $O/tree_g$g.txt)" >> $S
  NCCL_ALGO=Ring timeout 100 $D/oxccl perf --device cuda -g $g --op all_reduce -b 8 -e 256M -f 8 -n 10 -w 3 > $O/ring_g$g.txt 2>&1
  echo "== -g $g ring rc $? $(w $O/ring_g$g.txt)" >> $S
done
unset OXCCL_SHARED_GPU
env $TREE NCCL_DEBUG=TRACE NCCL_DEBUG_SUBSYS=COLL HOSTS=8 LIMIT=200 timeout 210 tools/netns_run.sh $D/oxccl perf --device cuda --op all_reduce -b 8 -e 64M -f 8 -n 2 -w 1 > $O/hosts8_tree.txt 2>&1
echo "== 8 hosts tree rc $? $(w $O/hosts8_tree.txt); $(algos $O/hosts8_tree.txt)" >> $S
HOSTS=8 NCCL_DEBUG=TRACE NCCL_DEBUG_SUBSYS=COLL LIMIT=150 timeout 160 tools/netns_run.sh $D/oxccl perf --device cuda --op all_reduce -b 8 -e 4M -f 8 -n 3 -w 1 > $O/hosts8_default.txt 2>&1
echo "== 8 hosts default rc $? $(w $O/hosts8_default.txt); $(algos $O/hosts8_default.txt)" >> $S
grep -h -m3 -E "WARN|rror" $O/*.txt | cut -c1-300 >> $S
timeout 150 $D/gpu_collectives > $O/gpu_collectives.txt 2>&1; echo "== gpu_collectives rc $? $(grep 'test result' $O/gpu_collectives.txt)" >> $S
timeout 150 env OXCCL_BIN=$PWD/$D/oxccl $D/gpu_shared > $O/gpu_shared.txt 2>&1; echo "== gpu_shared rc $? $(grep 'test result' $O/gpu_shared.txt)" >> $S
timeout 120 $D/gpu_elastic > $O/gpu_elastic.txt 2>&1; echo "== gpu_elastic rc $? $(grep 'test result' $O/gpu_elastic.txt)" >> $S
timeout 120 $D/gpu_tuner > $O/gpu_tuner.txt 2>&1; echo "== gpu_tuner rc $? $(grep 'test result' $O/gpu_tuner.txt)" >> $S
timeout 90 $D/oxccl perf --device cuda --ranks 2 --op all -b 8 -e 64M -f 16 -n 5 -w 2 > $O/dev2.txt 2>&1; echo "== device 2 ranks one GPU rc $? $(w $O/dev2.txt)" >> $S
LIMIT=120 timeout 130 tools/netns_run.sh $D/oxccl perf --device cuda --op all -b 8 -e 64M -f 16 -n 5 -w 2 > $O/netns.txt 2>&1; echo "== device 2 hosts through the net rc $? $(w $O/netns.txt)" >> $S
CUDA_VISIBLE_DEVICES= OXCCL_HOST_MEMORY=1 timeout 90 $D/oxccl perf --ranks 8 --op all -b 8 -e 64M -f 16 -n 5 -w 2 > $O/host8.txt 2>&1; echo "== host 8 ranks rc $? $(w $O/host8.txt)" >> $S
echo "/dev/shm left: $(ls /dev/shm | grep -c oxccl)" >> $S
(cd $O && tar czf $OUT/o.tgz .)
cat $S
