#!/bin/bash
# Session 21 final LL code (4 KiB bound) on one GPU: GPUDirect tests, every coll/dtype/op through the net
# on 3 ranks of one process, LL forced, 2 processes as 2 hosts, 2-rank latency (default, LL, Simple),
# the revoke/kill paths (gpu_elastic) and the shared-GPU path.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=30
D=.dev/s21c; O=$OUT/o; mkdir -p $O; S=$OUT/summary.txt; nvidia-smi -L > $S; md5sum $D/oxccl >> $S
w() { awk '/^ +[0-9]+ / && NF >= 12 {w += $9 + $13; n++} END {print "#wrong " w+0 " over " n+0 " rows"}' $1; }
NET="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo"
for t in gpu_gdr gpu_dmabuf; do
  timeout 150 $D/$t --nocapture > $O/$t.txt 2>&1; echo "== $t rc $? $(grep 'test result' $O/$t.txt)" >> $S
done
grep -h -E "NCCL_NET_GDR_LEVEL=|NCCL_DMABUF_ENABLE=|panicked" $O/gpu_gdr.txt $O/gpu_dmabuf.txt >> $S
timeout 200 env $NET NCCL_DEBUG=INFO $D/oxccl perf -g 3 --op all -d all -o all -b 8 -e 256K -f 3 -n 2 -w 1 > $O/g3_all.txt 2>&1; echo "== -g 3 net, every coll/dtype/op, 8 B-256 KiB rc $? $(w $O/g3_all.txt)" >> $S
grep -m1 "LL protocol" $O/g3_all.txt >> $S
timeout 100 env $NET NCCL_PROTO=LL $D/oxccl perf -g 3 --op all -o all -b 8 -e 4M -f 4 -n 2 -w 1 > $O/g3_ll.txt 2>&1; echo "== -g 3 net, NCCL_PROTO=LL every coll/op 8 B-4 MiB rc $? $(w $O/g3_ll.txt)" >> $S
LIMIT=120 timeout 130 tools/netns_run.sh $D/oxccl perf --device cuda --op all -b 8 -e 64M -f 16 -n 5 -w 2 > $O/netns.txt 2>&1; echo "== 2 processes as 2 hosts rc $? $(w $O/netns.txt)" >> $S
lat() { awk '/^ +[0-9]+ / && NF >= 12 {printf "%s %s/%s ", $1, $6, $10} END {print ""}' $1; }
for op in all_reduce all_gather sendrecv; do for i in 1 2; do for p in default LL Simple; do
  P=NCCL_PROTO=$p; [ $p = default ] && P=
  timeout 60 env $NET $P $D/oxccl perf -g 2 --op $op -b 8 -e 16K -f 2 -n 2000 -w 200 > $O/lat_${op}_${p}_$i.txt 2>&1
  echo "lat $op $p $i rc $?: $(lat $O/lat_${op}_${p}_$i.txt) $(w $O/lat_${op}_${p}_$i.txt)" >> $S
done; done; done
timeout 150 env OXCCL_BIN=$PWD/$D/oxccl $D/gpu_shared > $O/gpu_shared.txt 2>&1; echo "== gpu_shared rc $? $(grep 'test result' $O/gpu_shared.txt)" >> $S
timeout 200 env OXCCL_BIN=$PWD/$D/oxccl $D/gpu_elastic > $O/gpu_elastic.txt 2>&1; echo "== gpu_elastic rc $? $(grep 'test result' $O/gpu_elastic.txt)" >> $S
echo "/dev/shm left: $(ls /dev/shm | grep -c oxccl)" >> $S
(cd $O && gzip -9 g3_all.txt; tar czf $OUT/o.tgz .)
cat $S
