#!/bin/bash
# Session 19 check of main f6b61ea (review mend) on one H200: the rank-facts and direct-terms agreement touch
# every communicator's creation (host and device): GPU tests, 2 ranks of one GPU in two network
# namespaces through the net, device and host perf rows (#wrong only).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=30
D=.dev/s19k; O=$OUT/o; mkdir -p $O; S=$OUT/summary.txt; nvidia-smi -L > $S
w() { awk '/^ +[0-9]+ / && NF >= 12 {w += $9 + $13; n++} END {print "#wrong " w+0 " over " n+0 " rows"}' $1; }
timeout 150 $D/gpu_collectives > $O/gpu_collectives.txt 2>&1; echo "== gpu_collectives rc $? $(grep 'test result' $O/gpu_collectives.txt)" >> $S
timeout 150 env OXCCL_BIN=$PWD/$D/oxccl $D/gpu_shared > $O/gpu_shared.txt 2>&1; echo "== gpu_shared rc $? $(grep 'test result' $O/gpu_shared.txt)" >> $S
timeout 120 $D/gpu_elastic > $O/gpu_elastic.txt 2>&1; echo "== gpu_elastic rc $? $(grep 'test result' $O/gpu_elastic.txt)" >> $S
timeout 90 $D/oxccl perf --device cuda --ranks 2 --op all -b 8 -e 64M -f 16 -n 5 -w 2 > $O/dev2.txt 2>&1; echo "== device 2 ranks one GPU rc $? $(w $O/dev2.txt)" >> $S
LIMIT=120 timeout 130 tools/netns_run.sh $D/oxccl perf --device cuda --op all -b 8 -e 64M -f 16 -n 5 -w 2 > $O/netns.txt 2>&1; echo "== device 2 namespaces through the net rc $? $(w $O/netns.txt)" >> $S
grep -m3 -E "via NET|hosts|nNodes" $O/netns.txt | cut -c1-160 >> $S
CUDA_VISIBLE_DEVICES= OXCCL_HOST_MEMORY=1 timeout 90 $D/oxccl perf --ranks 8 --op all -b 8 -e 64M -f 16 -n 5 -w 2 > $O/host8.txt 2>&1; echo "== host 8 ranks rc $? $(w $O/host8.txt)" >> $S
echo "/dev/shm left: $(ls /dev/shm | grep -c oxccl)" >> $S
(cd $O && tar czf $OUT/o.tgz .)
cat $S
