#!/bin/bash
# Session 22 on 2 GPUs: the kernels keep the highest head and tail they have read per connection
# (across launches), so a slot known free or a slice known posted costs no read of host memory.
# nccl-tests -g 2 through shared memory and through the socket net: NCCL 2.28.9, oxccl a9abdf9 (before),
# oxccl now, alternating; then correctness on every path and the GPU tests.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=60
D=.dev/s22d; O=$OUT/o; mkdir -p $O; S=$OUT/summary.txt; nvidia-smi -L > $S; md5sum $D/oxccl $D/libnccl.so.2 $D/libnccl_before.so.2 >> $S
N=$(ls -d /opt/torch/.venv/lib/python*/site-packages/nvidia/nccl)
mkdir -p /tmp/nh/lib /tmp/ox /tmp/oxb; ln -sf $N/include /tmp/nh/include; ln -sf $N/lib/libnccl.so.2 /tmp/nh/lib/libnccl.so; ln -sf $N/lib/libnccl.so.2 /tmp/nh/lib/libnccl.so.2
cp $D/libnccl.so.2 /tmp/ox/; cp $D/libnccl_before.so.2 /tmp/oxb/libnccl.so.2
CU=$(ls -d /usr/local/cuda* | head -1)
t=$(date +%s); make -C .dev/nt/src -j32 CUDA_HOME=$CU NCCL_HOME=/tmp/nh BUILDDIR=/tmp/ntb NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" /tmp/ntb/all_reduce_perf /tmp/ntb/all_gather_perf /tmp/ntb/sendrecv_perf > $O/build.txt 2>&1; echo "build rc $? in $(($(date +%s)-t)) s" >> $S
w() { awk '/^ +[0-9]+ / && NF >= 12 {w += $9 + $13; n++} END {print "#wrong " w+0 " over " n+0 " rows"}' $1; }
s() { awk '/^ +[0-9]+ / && NF>=12 {printf "%s %s/%s ", $1, $6, $10} END {print ""}' $1; }
timeout 60 env NCCL_P2P_DISABLE=1 $D/oxccl perf -g 2 --op all -b 8 -e 1M -f 8 -n 3 -w 1 > $O/smoke.txt 2>&1; echo "smoke SHM rc $? $(w $O/smoke.txt)" >> $S
if ! grep -q "#wrong 0 over [1-9]" <(w $O/smoke.txt); then tail -30 $O/smoke.txt >> $S; cat $S; exit 1; fi
SHM="NCCL_P2P_DISABLE=1"; NET="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo"
for set in SHM NET; do for op in all_reduce all_gather sendrecv; do
  [ $set = NET ] && [ $op = all_gather ] && continue
  for i in 1 2; do for who in nccl before now; do
    L=/tmp/ox; case $who in nccl) L=/tmp/nh/lib;; before) L=/tmp/oxb;; esac
    timeout 60 env ${!set} LD_LIBRARY_PATH=$L /tmp/ntb/${op}_perf -g 2 -b 8 -e 256K -f 4 -n 500 -w 50 > $O/${set}_${op}_${who}_$i.txt 2>&1
    echo "$set $op $who $i rc $?: $(s $O/${set}_${op}_${who}_$i.txt) $(w $O/${set}_${op}_${who}_$i.txt)" >> $S
  done; done
done; done
for i in 1 2; do for who in before now; do
  L=/tmp/ox; [ $who = before ] && L=/tmp/oxb
  timeout 60 env LD_LIBRARY_PATH=$L /tmp/ntb/all_reduce_perf -g 2 -b 8 -e 256K -f 8 -n 500 -w 50 > $O/P2P_all_reduce_${who}_$i.txt 2>&1
  echo "P2P all_reduce $who $i rc $?: $(s $O/P2P_all_reduce_${who}_$i.txt) $(w $O/P2P_all_reduce_${who}_$i.txt)" >> $S
done; done
timeout 100 env $SHM $D/oxccl perf -g 2 --op all -d all -o all -b 8 -e 64K -f 4 -n 2 -w 1 > $O/g2_shm_all.txt 2>&1; echo "== -g 2 SHM every coll/dtype/op 8 B-64 KiB rc $? $(w $O/g2_shm_all.txt)" >> $S
timeout 60 env $SHM $D/oxccl perf -g 3 --op all -b 8 -e 16M -f 4 -n 3 -w 1 > $O/g3_shm.txt 2>&1; echo "== -g 3 SHM every coll 8 B-16 MiB rc $? $(w $O/g3_shm.txt)" >> $S
timeout 80 env $NET $D/oxccl perf -g 3 --op all -b 8 -e 16M -f 4 -n 3 -w 1 > $O/g3_net.txt 2>&1; echo "== -g 3 net every coll 8 B-16 MiB rc $? $(w $O/g3_net.txt)" >> $S
timeout 60 $D/oxccl perf -g 2 --op all -b 8 -e 64M -f 4 -n 3 -w 1 > $O/g2_p2p.txt 2>&1; echo "== -g 2 P2P every coll 8 B-64 MiB rc $? $(w $O/g2_p2p.txt)" >> $S
GPUS=split LIMIT=80 timeout 90 tools/netns_run.sh $D/oxccl perf --device cuda --op all -b 8 -e 64M -f 16 -n 3 -w 1 > $O/netns.txt 2>&1; echo "== 2 hosts (a GPU each) every coll 8 B-64 MiB rc $? $(w $O/netns.txt)" >> $S
timeout 60 $D/gpu_gdr --nocapture > $O/gpu_gdr.txt 2>&1; echo "== gpu_gdr rc $? $(grep 'test result' $O/gpu_gdr.txt)" >> $S
timeout 100 env OXCCL_BIN=$PWD/$D/oxccl $D/gpu_elastic > $O/gpu_elastic.txt 2>&1; echo "== gpu_elastic rc $? $(grep 'test result' $O/gpu_elastic.txt)" >> $S
timeout 90 env OXCCL_BIN=$PWD/$D/oxccl $D/gpu_shared > $O/gpu_shared.txt 2>&1; echo "== gpu_shared rc $? $(grep 'test result' $O/gpu_shared.txt)" >> $S
echo "/dev/shm left: $(ls /dev/shm | grep -c oxccl)" >> $S
(cd $O && gzip -9 g2_shm_all.txt; tar czf $OUT/o.tgz .)
cat $S
