#!/bin/bash
# Session 20 review mend (one H200): the proxy's registration (register_cell) and the GPUDirect
# decision changed shape: gpu_gdr, gpu_dmabuf, gpu_collectives, and the net path's perf rows.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=30
D=.dev/s20j; O=$OUT/o; mkdir -p $O; S=$OUT/summary.txt; nvidia-smi -L > $S
w() { awk '/^ +[0-9]+ / && NF >= 12 {w += $9 + $13; n++} END {print "#wrong " w+0 " over " n+0 " rows"}' $1; }
for t in gpu_gdr gpu_dmabuf gpu_collectives; do
  timeout 150 $D/$t --nocapture > $O/$t.txt 2>&1; echo "== $t rc $? $(grep 'test result' $O/$t.txt)" >> $S
done
grep -h -E "NCCL_NET_GDR_LEVEL=|NCCL_DMABUF_ENABLE=" $O/gpu_gdr.txt $O/gpu_dmabuf.txt >> $S
timeout 90 $D/oxccl perf --device cuda --ranks 2 --op all -b 8 -e 64M -f 16 -n 5 -w 2 > $O/dev2.txt 2>&1; echo "== device 2 ranks one GPU rc $? $(w $O/dev2.txt)" >> $S
LIMIT=120 timeout 130 tools/netns_run.sh $D/oxccl perf --device cuda --op all -b 8 -e 64M -f 16 -n 5 -w 2 > $O/netns.txt 2>&1; echo "== device 2 hosts through the net rc $? $(w $O/netns.txt)" >> $S
echo "/dev/shm left: $(ls /dev/shm | grep -c oxccl)" >> $S
(cd $O && tar czf $OUT/o.tgz .)
cat $S
