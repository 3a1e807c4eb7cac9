#!/bin/bash
# Issue 17 on the final tree, one H200: all 7 collectives with 4 processes to 1 GiB, the same with
# 4 threads of one process, PyTorch DDP (2 and 4 processes, with and without device_id) and
# PyTorch sendrecv with 2 processes.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=60
D=.dev/s17c; O=$OUT/f; mkdir -p $O; S=$OUT/final_summary.txt
nvidia-smi -L > $S
w() { awk '/^ +[0-9]+ / && NF >= 12 {w += $9 + $13; n++} END {print "#wrong " w+0 " over " n+0 " rows"}' $1; }
s() { awk '/^# [a-z_]+$/{op=$2} /^ +[0-9]+ / && NF>=12 {if ($1<1048576) printf "%s %s %s us; ", op, $1, $6"/"$10; else printf "%s %s %s GB/s; ", op, $1, $8"/"$12}' $1; echo; }
p() { local tag=$1 lim=$2; shift 2
  timeout $lim "$@" > $O/$tag.txt 2>&1; echo "== $tag rc $? $(w $O/$tag.txt): $(s $O/$tag.txt)" >> $S; }
P="$D/oxccl perf --device cuda"
p g4 100 $P -g 4 --op all -b 8 -e 1G -f 32 -n 5 -w 2
timeout 200 env NO_MPS=1 PYTHON=/opt/torch/.venv/bin/python bash tests/torch/run_shared_gpu.sh $D/libnccl.so.2 $O/ddp > $O/ddp.txt 2>&1
echo "== ddp rc $?" >> $S; grep -iE "match|differ|failed|step" $O/ddp.txt | head -12 >> $S
LD_PRELOAD=$PWD/$D/libnccl.so.2 ITERS=50 timeout 60 /opt/torch/.venv/bin/torchrun --nproc-per-node 2 tools/torch_bench.py sendrecv 8 64M > $O/torch_sr.txt 2>&1
echo "== torch sendrecv 2 rc $?" >> $S; grep -E "^ +[0-9]|^#" $O/torch_sr.txt | head -12 >> $S
p all4 220 $P --ranks 4 --op all -b 8 -e 1G -f 32 -n 5 -w 2
echo "/dev/shm left: $(ls /dev/shm | grep -c oxccl)" >> $S
(cd $O && tar czf $OUT/f.tgz .)
cat $S
