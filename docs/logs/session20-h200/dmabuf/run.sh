#!/bin/bash
# Session 20 (one H200): DMA-BUF registration. gpu_gdr: the CUDA-pointer network as before, and
# DmaBufBounce (a test network claiming NCCL_PTR_DMABUF) whose slots must be registered through
# regMrDmaBuf with live dma-buf descriptors, or stay in host memory with NCCL_DMABUF_ENABLE=0.
# Then the regular checks of the net path (2 ranks as 2 hosts through the net) and the GPU tests.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=30
D=.dev/s20g; O=$OUT/o; mkdir -p $O; S=$OUT/summary.txt; nvidia-smi -L > $S
nvidia-smi --query-gpu=driver_version --format=csv,noheader >> $S; uname -r >> $S
w() { awk '/^ +[0-9]+ / && NF >= 12 {w += $9 + $13; n++} END {print "#wrong " w+0 " over " n+0 " rows"}' $1; }
for t in gpu_gdr gpu_dmabuf; do
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT timeout 200 $D/$t --nocapture > $O/$t.txt 2>&1; echo "== $t rc $? $(grep 'test result' $O/$t.txt)" >> $S
  grep -E "NCCL_NET_GDR_LEVEL=|NCCL_DMABUF_ENABLE=|cannot export|panicked" $O/$t.txt | head -8 >> $S
  grep -h -E "DMA-BUF|GPU Direct RDMA" $O/$t.txt | sort | uniq -c | cut -c1-260 >> $S
done
timeout 150 $D/gpu_collectives > $O/gpu_collectives.txt 2>&1; echo "== gpu_collectives rc $? $(grep 'test result' $O/gpu_collectives.txt)" >> $S
timeout 90 $D/oxccl perf --device cuda --ranks 2 --op all -b 8 -e 64M -f 16 -n 5 -w 2 > $O/dev2.txt 2>&1; echo "== device 2 ranks one GPU rc $? $(w $O/dev2.txt)" >> $S
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT LIMIT=120 timeout 130 tools/netns_run.sh $D/oxccl perf --device cuda --op all -b 8 -e 64M -f 16 -n 5 -w 2 > $O/netns.txt 2>&1; echo "== device 2 hosts through the net rc $? $(w $O/netns.txt)" >> $S
grep -h -m3 -E "DMA-BUF|GPU Direct RDMA" $O/netns.txt | cut -c1-200 >> $S
echo "/dev/shm left: $(ls /dev/shm | grep -c oxccl)" >> $S
(cd $O && tar czf $OUT/o.tgz .)
cat $S
