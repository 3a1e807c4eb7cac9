#!/bin/bash
# Session 18 final call (one H200, host only): main 9c44417 against Gloo, 8 and 4 processes, two
# rounds of the defaults, and OXCCL_HOST_DIRECT_THREADS 3 and 4 at 8 processes (24 and 32 threads
# on 16 cores).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=30 CUDA_VISIBLE_DEVICES= OXCCL_HOST_MEMORY=1
D=.dev/s18f; O=$OUT/o; mkdir -p $O; S=$OUT/summary.txt; : > $S
ox() { local n=$1 tag=$2; shift 2; env "$@" timeout 100 $D/oxccl perf --ranks $n --op all_reduce -b 1M -e 256M -f 4 -n 10 -w 2 > $O/ox${n}_$tag.txt 2>&1
  echo "== oxccl $n $tag rc $?" >> $S; grep -E "^ +[0-9]" $O/ox${n}_$tag.txt | awk '{print $1, $6, $8, $9, $10, $12, $13}' >> $S; }
gloo() { timeout 150 /opt/torch/.venv/bin/torchrun --nproc-per-node $1 --master-port $((29500 + $1)) tools/gloo_bench.py 1M 256M > $O/gloo$1_$2.txt 2>&1
  echo "== gloo $1 $2 rc $?" >> $S; grep -E "^ +[0-9]" $O/gloo$1_$2.txt >> $S; }
gloo 8 a
ox 8 default1; ox 8 threads3 OXCCL_HOST_DIRECT_THREADS=3; ox 8 default2; ox 8 threads4 OXCCL_HOST_DIRECT_THREADS=4
gloo 8 b
gloo 4 a
ox 4 default1; ox 4 default2
echo "/dev/shm left: $(ls /dev/shm | grep -c oxccl)" >> $S
(cd $O && tar czf $OUT/o.tgz .)
cat $S
