#!/bin/bash
# Session 18 review mend (9aec6b8) on 2 GPUs: the mixed layout's splits (hier::made), gpu_elastic
# (resume splits again), and the host direct path with slices and streaming, #wrong only.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=30 CUDA_VISIBLE_DEVICES=0,1
D=.dev/s18m; S=$OUT/summary.txt; nvidia-smi -L > $S
timeout 120 env OXCCL_BIN=$PWD/$D/oxccl $D/gpu_shared --nocapture ranks_of_several > $OUT/mixed.txt 2>&1
echo "== gpu_shared mixed rc $? $(grep 'test result' $OUT/mixed.txt)" >> $S; grep -E "#wrong 0 in" $OUT/mixed.txt | cut -c1-120 >> $S
CUDA_VISIBLE_DEVICES=0 timeout 90 $D/gpu_elastic > $OUT/elastic.txt 2>&1; echo "== gpu_elastic rc $? $(grep 'test result' $OUT/elastic.txt)" >> $S
CUDA_VISIBLE_DEVICES= OXCCL_HOST_MEMORY=1 timeout 60 $D/oxccl perf --ranks 8 --op all_reduce,all_gather -b 64M -e 256M -f 4 -n 3 -w 1 > $OUT/host8.txt 2>&1
echo "== host 8 ranks rc $? $(awk '/^ +[0-9]+ / && NF >= 12 {w += $9 + $13; n++} END {print "#wrong " w+0 " over " n+0 " rows"}' $OUT/host8.txt)" >> $S
echo "/dev/shm left: $(ls /dev/shm | grep -c oxccl)" >> $S
cat $S
