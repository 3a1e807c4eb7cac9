#!/bin/bash
# Issue 17: send/recv and all_to_all on one GPU under MPS (every rank's kernels run together).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=30
D=.dev/s17c; O=$OUT/m; mkdir -p $O; S=$OUT/mps_summary.txt
nvidia-smi -L > $S
w() { awk '/^ +[0-9]+ / && NF >= 12 {w += $9 + $13; n++} END {print "#wrong " w+0 " over " n+0 " rows"}' $1; }
s() { awk '/^# [a-z_]+$/{op=$2} /^ +[0-9]+ / && NF>=12 {if ($1<1048576) printf "%s %s %s us; ", op, $1, $6"/"$10; else printf "%s %s %s GB/s; ", op, $1, $8"/"$12}' $1; echo; }
p() { local tag=$1 lim=$2; shift 2
  timeout $lim "$@" > $O/$tag.txt 2>&1; echo "== $tag rc $? $(w $O/$tag.txt): $(s $O/$tag.txt)" >> $S; }
P="$D/oxccl perf --device cuda"
export CUDA_MPS_PIPE_DIRECTORY=/tmp/oxmps CUDA_MPS_LOG_DIRECTORY=/tmp/oxmps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d; echo "mps start rc $?" >> $S
p mps4 80 $P --ranks 4 --op sendrecv,all_to_all -b 8 -e 256M -f 32 -n 20 -w 5
p mps2 60 $P --ranks 2 --op sendrecv,all_to_all -b 8 -e 256M -f 32 -n 20 -w 5
NCCL_DEBUG=INFO timeout 30 $P --ranks 2 --op all_reduce -b 8 -e 8 -n 2 -w 1 2>&1 | grep -i "share" | head -2 | cut -c1-300 >> $S
echo quit | nvidia-cuda-mps-control; echo "mps stop rc $?" >> $S
echo "/dev/shm left: $(ls /dev/shm | grep -c oxccl)" >> $S
cat $S
