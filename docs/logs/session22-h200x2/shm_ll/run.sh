#!/bin/bash
# Session 22 on 2 GPUs: the LL FIFO in shared-memory windows (NCCL_P2P_DISABLE=1). nccl-tests -g 2 on
# NCCL 2.28.9 and on oxccl with LL (default now) and without (OXCCL_DEV_LL_SLOT_BYTES=0), alternating;
# LL forced for the crossover; 2 processes on 2 GPUs; 2 hosts (netns_run GPUS=split) every coll 8 B-1 GiB.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=60
D=.dev/s22b; O=$OUT/o; mkdir -p $O; S=$OUT/summary.txt; nvidia-smi -L > $S; md5sum $D/oxccl $D/libnccl.so.2 >> $S
N=$(ls -d /opt/torch/.venv/lib/python*/site-packages/nvidia/nccl)
mkdir -p /tmp/nh/lib /tmp/ox; ln -sf $N/include /tmp/nh/include; ln -sf $N/lib/libnccl.so.2 /tmp/nh/lib/libnccl.so; ln -sf $N/lib/libnccl.so.2 /tmp/nh/lib/libnccl.so.2
cp $D/libnccl.so.2 /tmp/ox/
CU=$(ls -d /usr/local/cuda* | head -1)
t=$(date +%s); make -C .dev/nt/src -j32 CUDA_HOME=$CU NCCL_HOME=/tmp/nh BUILDDIR=/tmp/ntb NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" /tmp/ntb/all_reduce_perf /tmp/ntb/all_gather_perf /tmp/ntb/sendrecv_perf > $O/build.txt 2>&1; echo "build rc $? in $(($(date +%s)-t)) s" >> $S
w() { awk '/^ +[0-9]+ / && NF >= 12 {w += $9 + $13; n++} END {print "#wrong " w+0 " over " n+0 " rows"}' $1; }
s() { awk '/^ +[0-9]+ / && NF>=12 {printf "%s %s/%s ", $1, $6, $10} END {print ""}' $1; }
E="NCCL_P2P_DISABLE=1"
for op in all_reduce all_gather sendrecv; do for i in 1 2; do for who in nccl ll off; do
  L=/tmp/ox; X=; case $who in nccl) L=/tmp/nh/lib;; off) X="OXCCL_DEV_LL_SLOT_BYTES=0";; esac
  timeout 60 env $E $X LD_LIBRARY_PATH=$L /tmp/ntb/${op}_perf -g 2 -b 8 -e 64K -f 4 -n 1000 -w 100 > $O/${op}_${who}_$i.txt 2>&1
  echo "$op $who $i rc $?: $(s $O/${op}_${who}_$i.txt) $(w $O/${op}_${who}_$i.txt)" >> $S
done; done; done
grep -h "NCCL version" $O/all_reduce_nccl_1.txt $O/all_reduce_ll_1.txt | sort | uniq -c >> $S
for i in 1 2; do for op in all_reduce all_gather; do
  timeout 60 env $E NCCL_PROTO=LL LD_LIBRARY_PATH=/tmp/ox /tmp/ntb/${op}_perf -g 2 -b 2K -e 256K -f 2 -n 500 -w 50 > $O/${op}_forced_$i.txt 2>&1
  echo "$op LL forced $i rc $?: $(s $O/${op}_forced_$i.txt) $(w $O/${op}_forced_$i.txt)" >> $S
done; done
for i in 1 2; do for ll in 8192 0; do
  timeout 60 env $E OXCCL_DEV_LL_SLOT_BYTES=$ll NCCL_DEBUG=INFO $D/oxccl perf --device cuda --ranks 2 --op all_reduce -b 8 -e 64K -f 4 -n 1000 -w 100 > $O/procs2_${ll}_$i.txt 2>&1
  echo "2 procs all_reduce ll_slot=$ll $i rc $?: $(s $O/procs2_${ll}_$i.txt) $(w $O/procs2_${ll}_$i.txt)" >> $S
done; done
grep -m2 -h -E "via SHM|LL protocol" $O/procs2_8192_1.txt | cut -c1-200 >> $S
timeout 100 env $E $D/oxccl perf -g 2 --op all -d all -o all -b 8 -e 64K -f 4 -n 2 -w 1 > $O/g2_all.txt 2>&1; echo "== -g 2 SHM every coll/dtype/op 8 B-64 KiB rc $? $(w $O/g2_all.txt)" >> $S
GPUS=split LIMIT=200 timeout 210 tools/netns_run.sh $D/oxccl perf --device cuda --op all -b 8 -e 1G -f 8 -n 2 -w 1 > $O/netns_1g.txt 2>&1; echo "== 2 hosts (a GPU each) every coll 8 B-1 GiB rc $? $(w $O/netns_1g.txt)" >> $S
echo "/dev/shm left: $(ls /dev/shm | grep -c oxccl)" >> $S
(cd $O && gzip -9 g2_all.txt; tar czf $OUT/o.tgz .)
cat $S
