#!/bin/bash
# Session 21 review mend on one GPU: one connection exchange for both FIFOs, Proto in place of flags and
# strings, the kernels' shared send-slot claim. Every GPU test binary touched, every coll/dtype/op through
# the net, 2 hosts, 2 hosts x 2 ranks with shared memory inside.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=60
D=.dev/s21i; O=$OUT/o; mkdir -p $O $(cat $D/fixtures_path); cp $D/libprofiler_tree.so $(cat $D/fixtures_path)/
S=$OUT/summary.txt; nvidia-smi -L > $S; md5sum $D/oxccl >> $S
w() { awk '/^ +[0-9]+ / && NF >= 12 {w += $9 + $13; n++} END {print "#wrong " w+0 " over " n+0 " rows"}' $1; }
NET="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo"
for t in gpu_gdr gpu_dmabuf; do
  timeout 100 $D/$t --nocapture > $O/$t.txt 2>&1; echo "== $t rc $? $(grep 'test result' $O/$t.txt)" >> $S
done
grep -h -E "NCCL_NET_GDR_LEVEL=|NCCL_DMABUF_ENABLE=|panicked" $O/gpu_gdr.txt $O/gpu_dmabuf.txt >> $S
timeout 120 $D/gpu_profiler --nocapture --test-threads 1 > $O/gpu_profiler.txt 2>&1; echo "== gpu_profiler rc $? $(grep 'test result' $O/gpu_profiler.txt)" >> $S
grep -E "proxy ops|panicked" $O/gpu_profiler.txt | cut -c1-300 >> $S
timeout 150 env $NET NCCL_DEBUG=INFO $D/oxccl perf -g 3 --op all -d all -o all -b 8 -e 256K -f 3 -n 2 -w 1 > $O/g3_all.txt 2>&1; echo "== -g 3 net, every coll/dtype/op, 8 B-256 KiB rc $? $(w $O/g3_all.txt)" >> $S
grep -m1 -o "LL protocol[^;]*" $O/g3_all.txt >> $S; echo "NET connection lines, rank 0: $(grep -c 'vm:[0-9]*:[0-9]* \[0\].*via NET' $O/g3_all.txt)" >> $S
LIMIT=90 timeout 100 tools/netns_run.sh $D/oxccl perf --device cuda --op all -b 8 -e 64M -f 16 -n 5 -w 2 > $O/netns.txt 2>&1; echo "== 2 processes as 2 hosts rc $? $(w $O/netns.txt)" >> $S
mkdir -p $O/logs_mixed; timeout 140 env NCCL_P2P_DISABLE=1 HOSTS=2 PER_HOST=2 LIMIT=130 LOGDIR=$O/logs_mixed tools/netns_run.sh $D/oxccl perf --device cuda --op all -b 8 -e 1M -f 4 -n 3 -w 1 > $O/mixed.txt 2>&1; echo "== 2 hosts x 2 ranks, SHM inside rc $? $(w $O/mixed.txt)" >> $S
timeout 100 env OXCCL_BIN=$PWD/$D/oxccl $D/gpu_elastic > $O/gpu_elastic.txt 2>&1; echo "== gpu_elastic rc $? $(grep 'test result' $O/gpu_elastic.txt)" >> $S
echo "/dev/shm left: $(ls /dev/shm | grep -c oxccl)" >> $S
(cd $O && gzip -9 g3_all.txt; tar czf $OUT/o.tgz .)
cat $S
