#!/bin/bash
# Session 22, final check of 46dd0ad on one GPU (kernels keep head and tail): the tests the 2-GPU call did
# not run: gpu_profiler; LL forced through the net.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=60
D=.dev/s22e; O=$OUT/o; mkdir -p $O $(cat $D/fixtures_path); cp $D/libprofiler_tree.so $(cat $D/fixtures_path)/
S=$OUT/summary.txt; nvidia-smi -L > $S; md5sum $D/oxccl >> $S
w() { awk '/^ +[0-9]+ / && NF >= 12 {w += $9 + $13; n++} END {print "#wrong " w+0 " over " n+0 " rows"}' $1; }
timeout 90 $D/gpu_profiler --nocapture --test-threads 1 > $O/gpu_profiler.txt 2>&1; echo "== gpu_profiler rc $? $(grep 'test result' $O/gpu_profiler.txt)" >> $S
grep -E "proxy ops|panicked" $O/gpu_profiler.txt | cut -c1-300 >> $S
timeout 40 env NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo NCCL_PROTO=LL $D/oxccl perf -g 3 --op all -b 8 -e 4M -f 4 -n 3 -w 1 > $O/g3_net_ll.txt 2>&1; echo "== -g 3 net LL forced every coll 8 B-4 MiB rc $? $(w $O/g3_net_ll.txt)" >> $S
echo "/dev/shm left: $(ls /dev/shm | grep -c oxccl)" >> $S
(cd $O && tar czf $OUT/o.tgz .)
cat $S
