#!/bin/bash
# Session 18: the same checks on main f567255 (session 17 review mends untested on two GPUs).
# Issue 17: mixed layouts (4 processes on 2 GPUs) with the splits made at creation: send/recv between
# ranks of one GPU through its GPU's communicator; gpu_shared's mixed test; gpu_elastic (resume splits again).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=30 CUDA_VISIBLE_DEVICES=0,1
D=.dev/s18e; O=$OUT/x; mkdir -p $O; S=$OUT/x2_summary.txt
nvidia-smi -L > $S
w() { awk '/^ +[0-9]+ / && NF >= 12 {w += $9 + $13; n++} END {print "#wrong " w+0 " over " n+0 " rows"}' $1; }
s() { awk '/^# [a-z_]+$/{op=$2} /^ +[0-9]+ / && NF>=12 {if ($1<1048576) printf "%s %s %s us; ", op, $1, $6"/"$10; else printf "%s %s %s GB/s; ", op, $1, $8"/"$12}' $1; echo; }
for h in 1 0; do
  timeout 60 env OXCCL_HIER=$h $D/oxccl perf --device cuda --ranks 4 --op sendrecv,all_to_all -b 8 -e 64M -f 64 -n 10 -w 2 > $O/p2p_h$h.txt 2>&1
  echo "== mixed p2p OXCCL_HIER=$h rc $? $(w $O/p2p_h$h.txt): $(s $O/p2p_h$h.txt)" >> $S
done
timeout 150 env OXCCL_BIN=$PWD/$D/oxccl $D/gpu_shared --nocapture ranks_of_several > $O/gpu_shared_mixed.txt 2>&1
echo "== gpu_shared mixed rc $? $(grep -E 'test result' $O/gpu_shared_mixed.txt)" >> $S; grep -E "#wrong 0 in|panicked" $O/gpu_shared_mixed.txt | cut -c1-200 >> $S
CUDA_VISIBLE_DEVICES=0 timeout 90 $D/gpu_elastic > $O/gpu_elastic.txt 2>&1; echo "== gpu_elastic rc $? $(grep -E 'test result' $O/gpu_elastic.txt)" >> $S
timeout 90 env NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 $D/oxccl perf --device cuda --ranks 2 --op all -b 8 -e 64M -f 64 -n 5 -w 2 > $O/net2.txt 2>&1
echo "== net 2 GPUs 2 processes rc $? $(w $O/net2.txt): $(s $O/net2.txt)" >> $S
echo "/dev/shm left: $(ls /dev/shm | grep -c oxccl)" >> $S
(cd $O && tar czf $OUT/x.tgz .)
cat $S
