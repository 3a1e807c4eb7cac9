#!/bin/bash
# Session 21 final code (276b045) on one GPU: the GPUDirect tests with their LL counts, the kill/revoke and
# shared-GPU tests, every collective/dtype/op through the net on 3 ranks of one process.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=30
D=.dev/s21e; O=$OUT/o; mkdir -p $O; S=$OUT/summary.txt; nvidia-smi -L > $S; md5sum $D/oxccl >> $S
w() { awk '/^ +[0-9]+ / && NF >= 12 {w += $9 + $13; n++} END {print "#wrong " w+0 " over " n+0 " rows"}' $1; }
NET="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo"
for t in gpu_gdr gpu_dmabuf; do
  timeout 100 $D/$t --nocapture > $O/$t.txt 2>&1; echo "== $t rc $? $(grep 'test result' $O/$t.txt)" >> $S
done
grep -h -E "NCCL_NET_GDR_LEVEL=|NCCL_DMABUF_ENABLE=|panicked" $O/gpu_gdr.txt $O/gpu_dmabuf.txt >> $S
timeout 200 env $NET $D/oxccl perf -g 3 --op all -d all -o all -b 8 -e 256K -f 3 -n 2 -w 1 > $O/g3_all.txt 2>&1; echo "== -g 3 net, every coll/dtype/op, 8 B-256 KiB rc $? $(w $O/g3_all.txt)" >> $S
timeout 120 env OXCCL_BIN=$PWD/$D/oxccl $D/gpu_shared > $O/gpu_shared.txt 2>&1; echo "== gpu_shared rc $? $(grep 'test result' $O/gpu_shared.txt)" >> $S
timeout 150 env OXCCL_BIN=$PWD/$D/oxccl $D/gpu_elastic > $O/gpu_elastic.txt 2>&1; echo "== gpu_elastic rc $? $(grep 'test result' $O/gpu_elastic.txt)" >> $S
echo "/dev/shm left: $(ls /dev/shm | grep -c oxccl)" >> $S
(cd $O && gzip -9 g3_all.txt; tar czf $OUT/o.tgz .)
cat $S
