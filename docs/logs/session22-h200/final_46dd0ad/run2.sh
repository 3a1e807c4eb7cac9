#!/bin/bash
# Session 22, final check of 46dd0ad on one GPU, second part: gpu_dmabuf, LL forced through shared memory,
# 2 hosts x 2 ranks with shared memory inside.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=60
D=.dev/s22e; O=$OUT/o; mkdir -p $O; S=$OUT/summary.txt; md5sum $D/oxccl > $S
w() { awk '/^ +[0-9]+ / && NF >= 12 {w += $9 + $13; n++} END {print "#wrong " w+0 " over " n+0 " rows"}' $1; }
timeout 40 $D/gpu_dmabuf --nocapture > $O/gpu_dmabuf.txt 2>&1; echo "== gpu_dmabuf rc $? $(grep 'test result' $O/gpu_dmabuf.txt)" >> $S
timeout 40 env NCCL_P2P_DISABLE=1 NCCL_PROTO=LL $D/oxccl perf -g 3 --op all -b 8 -e 4M -f 4 -n 3 -w 1 > $O/g3_shm_ll.txt 2>&1; echo "== -g 3 SHM LL forced every coll 8 B-4 MiB rc $? $(w $O/g3_shm_ll.txt)" >> $S
mkdir -p $O/logs_mixed; timeout 70 env NCCL_P2P_DISABLE=1 HOSTS=2 PER_HOST=2 LIMIT=65 LOGDIR=$O/logs_mixed tools/netns_run.sh $D/oxccl perf --device cuda --op all -b 8 -e 1M -f 4 -n 3 -w 1 > $O/mixed.txt 2>&1; echo "== 2 hosts x 2 ranks, SHM inside rc $? $(w $O/mixed.txt)" >> $S
echo "/dev/shm left: $(ls /dev/shm | grep -c oxccl)" >> $S
(cd $O && tar czf $OUT/o.tgz .)
cat $S
