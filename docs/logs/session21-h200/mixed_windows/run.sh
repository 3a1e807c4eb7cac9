#!/bin/bash
# Session 21: LL in windows that mix net peers with P2P or SHM peers: 2 hosts x 2 ranks (4 processes on GPU 0),
# inside a host P2P (IPC) or, with NCCL_P2P_DISABLE=1, shared memory; default bound and NCCL_PROTO=LL.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=60
D=.dev/s21g; O=$OUT/o; mkdir -p $O; S=$OUT/summary.txt; nvidia-smi -L > $S; md5sum $D/oxccl >> $S
w() { awk '/^ +[0-9]+ / && NF >= 12 {w += $9 + $13; n++} END {print "#wrong " w+0 " over " n+0 " rows"}' $1; }
for inside in p2p shm; do for proto in default LL; do
  mkdir -p $O/logs_${inside}_$proto; E=; [ $inside = shm ] && E="NCCL_P2P_DISABLE=1"; P=; [ $proto = LL ] && P="NCCL_PROTO=LL"
  timeout 140 env $E $P NCCL_DEBUG=INFO HOSTS=2 PER_HOST=2 LIMIT=130 LOGDIR=$O/logs_${inside}_$proto tools/netns_run.sh $D/oxccl perf --device cuda --op all -b 8 -e 1M -f 4 -n 3 -w 1 > $O/${inside}_$proto.txt 2>&1
  echo "== 2 hosts x 2 ranks, inside a host $inside, protocol $proto: rc $? $(w $O/${inside}_$proto.txt)" >> $S
  grep -h -o "via [A-Z]*/[^ ]*" $O/${inside}_$proto.txt | sort | uniq -c | head -4 >> $S
  grep -h -m1 "LL protocol[^;]*" -o $O/${inside}_$proto.txt >> $S
done; done
echo "/dev/shm left: $(ls /dev/shm | grep -c oxccl)" >> $S
(cd $O && tar czf $OUT/o.tgz .)
cat $S
