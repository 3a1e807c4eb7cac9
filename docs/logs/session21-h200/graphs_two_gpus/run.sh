#!/bin/bash
# Session 21: where a small network step's time goes, 2 H200: nccl-tests -g 2 through the socket net on NCCL
# 2.28.9 and oxccl 276b045, launched one by one and replayed from a CUDA graph (-G: no host work per operation).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=30
D=.dev/s21f; O=$OUT/o; mkdir -p $O; S=$OUT/summary.txt; nvidia-smi -L > $S; md5sum $D/libnccl.so.2 >> $S
N=$(ls -d /opt/torch/.venv/lib/python*/site-packages/nvidia/nccl)
mkdir -p /tmp/nh/lib /tmp/ox; ln -sf $N/include /tmp/nh/include; ln -sf $N/lib/libnccl.so.2 /tmp/nh/lib/libnccl.so; ln -sf $N/lib/libnccl.so.2 /tmp/nh/lib/libnccl.so.2
cp $D/libnccl.so.2 /tmp/ox/
CU=$(ls -d /usr/local/cuda* | head -1)
t=$(date +%s); make -C .dev/nt/src -j32 CUDA_HOME=$CU NCCL_HOME=/tmp/nh BUILDDIR=/tmp/ntb NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" /tmp/ntb/all_reduce_perf /tmp/ntb/all_gather_perf /tmp/ntb/sendrecv_perf > $O/build.txt 2>&1; echo "build rc $? in $(($(date +%s)-t)) s" >> $S
w() { awk '/^ +[0-9]+ / && NF >= 12 {w += $9 + $13; n++} END {print "#wrong " w+0 " over " n+0 " rows"}' $1; }
s() { awk '/^ +[0-9]+ / && NF>=12 {printf "%s %s/%s ", $1, $6, $10} END {print ""}' $1; }
E="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo"
for op in all_gather all_reduce sendrecv; do for i in 1 2; do for g in 0 10; do for who in nccl ox; do
  L=/tmp/nh/lib; [ $who = ox ] && L=/tmp/ox
  timeout 60 env $E LD_LIBRARY_PATH=$L /tmp/ntb/${op}_perf -g 2 -b 8 -e 2K -f 4 -n 200 -w 20 -G $g > $O/${op}_${who}_G${g}_$i.txt 2>&1
  echo "$op $who -G $g $i rc $?: $(s $O/${op}_${who}_G${g}_$i.txt) $(w $O/${op}_${who}_G${g}_$i.txt)" >> $S
done; done; done; done
(cd $O && tar czf $OUT/o.tgz .)
cat $S
