#!/bin/bash
# Issue 17: session 16's review mends (5e3b2a3) on one GPU: the shared-GPU tests, send/recv
# with 2 and 4 ranks in each mode, all 7 collectives.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=30
D=.dev/s17b; O=$OUT/g; mkdir -p $O; S=$OUT/gpu_summary.txt
nvidia-smi -L > $S
w() { awk '/^ +[0-9]+ / && NF >= 12 {w += $9 + $13; n++} END {print "#wrong " w+0 " over " n+0 " rows"}' $1; }
s() { awk '/^# [a-z_]+$/{op=$2} /^ +[0-9]+ / && NF>=12 {if ($1<1048576) printf "%s %s %s us; ", op, $1, $6"/"$10; else printf "%s %s %s GB/s; ", op, $1, $8"/"$12}' $1; echo; }
p() { # tag limit args...
  local tag=$1 lim=$2; shift 2
  timeout $lim "$@" > $O/$tag.txt 2>&1; echo "== $tag rc $? $(w $O/$tag.txt): $(s $O/$tag.txt)" >> $S
}
P="$D/oxccl perf --device cuda"
p sr2 60 $P --ranks 2 --op sendrecv -b 8 -e 256M -f 32 -n 200 -w 20
p sr2_wait0 60 env OXCCL_SHARED_PUSH_WAIT_US=0 $P --ranks 2 --op sendrecv -b 8 -e 256M -f 32 -n 50 -w 5
p sr2_conn1 60 env CUDA_DEVICE_MAX_CONNECTIONS=1 $P --ranks 2 --op sendrecv -b 8 -e 256M -f 32 -n 200 -w 20
p sr4 60 $P --ranks 4 --op sendrecv -b 8 -e 256M -f 32 -n 50 -w 5
p sr4_server 60 env OXCCL_SHARED_P2P=server $P --ranks 4 --op sendrecv -b 8 -e 256M -f 32 -n 200 -w 20
p ar2 30 $P --ranks 2 --op all_reduce -b 8 -e 8 -n 500 -w 50
p ar4 30 $P --ranks 4 --op all_reduce -b 8 -e 8 -n 500 -w 50
p all2 150 $P --ranks 2 --op all -b 8 -e 1G -f 32 -n 5 -w 2
p all4 120 $P --ranks 4 --op all -b 8 -e 64M -f 32 -n 5 -w 2
timeout 200 env OXCCL_BIN=$PWD/$D/oxccl $D/gpu_shared > $O/gpu_shared.txt 2>&1; echo "== gpu_shared rc $? $(grep -E 'test result' $O/gpu_shared.txt)" >> $S
timeout 120 $D/gpu_elastic > $O/gpu_elastic.txt 2>&1; echo "== gpu_elastic rc $? $(grep -E 'test result' $O/gpu_elastic.txt)" >> $S
timeout 90 $D/gpu_profiler shared_gpu > $O/gpu_profiler.txt 2>&1; echo "== gpu_profiler shared rc $? $(grep -E 'test result' $O/gpu_profiler.txt)" >> $S
echo "/dev/shm left: $(ls /dev/shm | grep -c oxccl)" >> $S
(cd $O && tar czf $OUT/g.tgz .)
cat $S
