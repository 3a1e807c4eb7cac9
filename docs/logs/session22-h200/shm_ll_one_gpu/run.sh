#!/bin/bash
# Session 22, one GPU: the LL FIFO in windows whose peers are all in shared memory (NCCL_P2P_DISABLE=1),
# on against off (OXCCL_DEV_LL_SLOT_BYTES=8192 / 0), latency and correctness; then 2 processes as 2 hosts,
# every collective 8 B - 1 GiB through the socket net (issue 13's single-GPU item) on the final LL code.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=60
D=.dev/s22a; O=$OUT/o; mkdir -p $O; S=$OUT/summary.txt; nvidia-smi -L > $S; md5sum $D/oxccl >> $S; nproc >> $S
w() { awk '/^ +[0-9]+ / && NF >= 12 {w += $9 + $13; n++} END {print "#wrong " w+0 " over " n+0 " rows"}' $1; }
s() { awk '/^ +[0-9]+ / && NF>=12 {printf "%s %s/%s ", $1, $6, $10} END {print ""}' $1; }
SHM="NCCL_P2P_DISABLE=1"
for r in 1 2; do for ll in 0 8192; do
  for op in all_reduce all_gather sendrecv; do
    timeout 60 env $SHM OXCCL_DEV_LL_SLOT_BYTES=$ll $D/oxccl perf --device cuda --ranks 2 --op $op -b 8 -e 64K -f 4 -n 500 -w 50 > $O/p2_${op}_${ll}_$r.txt 2>&1
    echo "procs2 $op ll=$ll r$r rc $?: $(s $O/p2_${op}_${ll}_$r.txt) $(w $O/p2_${op}_${ll}_$r.txt)" >> $S
  done
  timeout 60 env $SHM OXCCL_DEV_LL_SLOT_BYTES=$ll $D/oxccl perf --device cuda --ranks 4 --op all_reduce -b 8 -e 64K -f 4 -n 500 -w 50 > $O/p4_ar_${ll}_$r.txt 2>&1
  echo "procs4 all_reduce ll=$ll r$r rc $?: $(s $O/p4_ar_${ll}_$r.txt) $(w $O/p4_ar_${ll}_$r.txt)" >> $S
  timeout 60 env $SHM OXCCL_DEV_LL_SLOT_BYTES=$ll $D/oxccl perf -g 2 --op all_reduce -b 8 -e 64K -f 4 -n 500 -w 50 > $O/g2_ar_${ll}_$r.txt 2>&1
  echo "g2 all_reduce ll=$ll r$r rc $?: $(s $O/g2_ar_${ll}_$r.txt) $(w $O/g2_ar_${ll}_$r.txt)" >> $S
done; done
grep -h -m1 -o "LL protocol[^;]*" $O/p2_all_reduce_8192_1.txt >> $S
timeout 150 env $SHM OXCCL_DEV_LL_SLOT_BYTES=8192 NCCL_PROTO=LL $D/oxccl perf -g 3 --op all -d all -o all -b 8 -e 64K -f 4 -n 2 -w 1 > $O/g3_ll_all.txt 2>&1; echo "== -g 3 SHM NCCL_PROTO=LL every coll/dtype/op 8 B-64 KiB rc $? $(w $O/g3_ll_all.txt)" >> $S
timeout 120 env $SHM OXCCL_DEV_LL_SLOT_BYTES=8192 $D/oxccl perf --device cuda --ranks 3 --op all -b 8 -e 4M -f 4 -n 3 -w 1 > $O/p3_all.txt 2>&1; echo "== 3 procs SHM LL default bound every coll 8 B-4 MiB rc $? $(w $O/p3_all.txt)" >> $S
timeout 120 env $SHM OXCCL_DEV_LL_SLOT_BYTES=8192 NCCL_PROTO=LL $D/oxccl perf --device cuda --ranks 3 --op all -b 8 -e 4M -f 4 -n 3 -w 1 > $O/p3_all_ll.txt 2>&1; echo "== 3 procs SHM LL forced every coll 8 B-4 MiB rc $? $(w $O/p3_all_ll.txt)" >> $S
LIMIT=280 timeout 290 tools/netns_run.sh $D/oxccl perf --device cuda --op all -b 8 -e 1G -f 8 -n 2 -w 1 > $O/netns_1g.txt 2>&1; echo "== 2 processes as 2 hosts, every coll 8 B-1 GiB rc $? $(w $O/netns_1g.txt)" >> $S
echo "/dev/shm left: $(ls /dev/shm | grep -c oxccl)" >> $S
(cd $O && tar czf $OUT/o.tgz .)
cat $S
