#!/bin/bash
# Session 20 final code on one H200: every GPU test binary, 3 x 49 perf rows (2 ranks on the GPU,
# 2 hosts through the net, 8 host ranks), the tree forced on 8 ranks of one process.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=30
D=.dev/s20h; O=$OUT/o; mkdir -p $O; S=$OUT/summary.txt; nvidia-smi -L > $S
w() { awk '/^ +[0-9]+ / && NF >= 12 {w += $9 + $13; n++} END {print "#wrong " w+0 " over " n+0 " rows"}' $1; }
for t in gpu_collectives gpu_elastic gpu_tuner gpu_gdr gpu_dmabuf; do
  timeout 150 $D/$t --nocapture > $O/$t.txt 2>&1; echo "== $t rc $? $(grep 'test result' $O/$t.txt)" >> $S
done
grep -h -E "NCCL_NET_GDR_LEVEL=|NCCL_DMABUF_ENABLE=" $O/gpu_gdr.txt $O/gpu_dmabuf.txt >> $S
timeout 150 env OXCCL_BIN=$PWD/$D/oxccl $D/gpu_shared > $O/gpu_shared.txt 2>&1; echo "== gpu_shared rc $? $(grep 'test result' $O/gpu_shared.txt)" >> $S
timeout 90 $D/oxccl perf --device cuda --ranks 2 --op all -b 8 -e 64M -f 16 -n 5 -w 2 > $O/dev2.txt 2>&1; echo "== device 2 ranks one GPU rc $? $(w $O/dev2.txt)" >> $S
LIMIT=120 timeout 130 tools/netns_run.sh $D/oxccl perf --device cuda --op all -b 8 -e 64M -f 16 -n 5 -w 2 > $O/netns.txt 2>&1; echo "== device 2 hosts through the net rc $? $(w $O/netns.txt)" >> $S
CUDA_VISIBLE_DEVICES= OXCCL_HOST_MEMORY=1 timeout 90 $D/oxccl perf --ranks 8 --op all -b 8 -e 64M -f 16 -n 5 -w 2 > $O/host8.txt 2>&1; echo "== host 8 ranks rc $? $(w $O/host8.txt)" >> $S
printf '[[rule]]\ncollective = "all_reduce"\nalgorithm = "tree"\nprotocol = "simple"\n' > $O/tree.toml
OXCCL_SHARED_GPU=kernels NCCL_ALGO=Tree NCCL_TUNER_PLUGIN=$PWD/$D/liboxccl_tuner.so OXCCL_TUNER_CONFIG=$O/tree.toml timeout 100 $D/oxccl perf --device cuda -g 8 --op all_reduce -b 8 -e 256M -f 8 -n 5 -w 2 > $O/tree_g8.txt 2>&1; echo "== -g 8 tree rc $? $(w $O/tree_g8.txt)" >> $S
echo "/dev/shm left: $(ls /dev/shm | grep -c oxccl)" >> $S
(cd $O && tar czf $OUT/o.tgz .)
cat $S
