#!/bin/bash
# Session 21 on 2 GPUs: nccl-tests through the network (P2P and SHM off, socket over lo) on NCCL 2.28.9,
# oxccl 4fbcadd (LL, LL links on every channel, every receive tested every pass) and oxccl now (LL links on
# 2 channels, quiet simple links tested every 4th pass); correctness of the latter.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=30
D=.dev/s21d; O=$OUT/o; mkdir -p $O; S=$OUT/summary.txt; nvidia-smi -L > $S; md5sum $D/oxccl $D/libnccl.so.2 $D/libnccl_before.so.2 >> $S
N=$(ls -d /opt/torch/.venv/lib/python*/site-packages/nvidia/nccl)
mkdir -p /tmp/nh/lib /tmp/ox /tmp/oxb; ln -sf $N/include /tmp/nh/include; ln -sf $N/lib/libnccl.so.2 /tmp/nh/lib/libnccl.so; ln -sf $N/lib/libnccl.so.2 /tmp/nh/lib/libnccl.so.2
cp $D/libnccl.so.2 /tmp/ox/; cp $D/libnccl_before.so.2 /tmp/oxb/libnccl.so.2
CU=$(ls -d /usr/local/cuda* | head -1)
t=$(date +%s); make -C .dev/nt/src -j32 CUDA_HOME=$CU NCCL_HOME=/tmp/nh BUILDDIR=/tmp/ntb NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" /tmp/ntb/all_reduce_perf /tmp/ntb/all_gather_perf /tmp/ntb/sendrecv_perf > $O/build.txt 2>&1; echo "build rc $? in $(($(date +%s)-t)) s" >> $S
w() { awk '/^ +[0-9]+ / && NF >= 12 {w += $9 + $13; n++} END {print "#wrong " w+0 " over " n+0 " rows"}' $1; }
s() { awk '/^ +[0-9]+ / && NF>=12 {printf "%s %s/%s ", $1, $6, $10} END {print ""}' $1; }
E="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo"
for op in all_reduce all_gather sendrecv; do for i in 1 2; do for who in nccl before now; do
  L=/tmp/nh/lib; case $who in before) L=/tmp/oxb;; now) L=/tmp/ox;; esac
  timeout 60 env $E LD_LIBRARY_PATH=$L /tmp/ntb/${op}_perf -g 2 -b 8 -e 64K -f 4 -n 1000 -w 100 > $O/${op}_${who}_$i.txt 2>&1
  echo "$op $who $i rc $?: $(s $O/${op}_${who}_$i.txt) $(w $O/${op}_${who}_$i.txt)" >> $S
done; done; done
grep -h "NCCL version" $O/all_reduce_nccl_1.txt $O/all_reduce_now_1.txt | sort | uniq -c >> $S
for t in gpu_gdr gpu_dmabuf; do
  timeout 100 $D/$t --nocapture > $O/$t.txt 2>&1; echo "== $t rc $? $(grep 'test result' $O/$t.txt)" >> $S
done
grep -h -E "NCCL_NET_GDR_LEVEL=|NCCL_DMABUF_ENABLE=|panicked" $O/gpu_gdr.txt $O/gpu_dmabuf.txt >> $S
LIMIT=100 timeout 110 tools/netns_run.sh $D/oxccl perf --device cuda --op all -b 8 -e 64M -f 16 -n 5 -w 2 > $O/netns.txt 2>&1; echo "== 2 processes as 2 hosts rc $? $(w $O/netns.txt)" >> $S
timeout 120 env $E $D/oxccl perf -g 2 --op all -d all -b 8 -e 64K -f 8 -n 2 -w 1 > $O/g2_all.txt 2>&1; echo "== oxccl -g 2 net every coll/dtype 8 B-64 KiB rc $? $(w $O/g2_all.txt)" >> $S
echo "/dev/shm left: $(ls /dev/shm | grep -c oxccl)" >> $S
(cd $O && tar czf $OUT/o.tgz .)
cat $S
