#!/bin/bash
# Issue 13: host memory, 8 and 4 processes, Gloo (with and without PyTorch's THP setting) against
# oxccl perf (huge-page buffers, then heap), alternating, in one call.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 CUDA_VISIBLE_DEVICES= OXCCL_HOST_MEMORY=1 NCCL_TIMEOUT=30
D=.dev/s17a; O=$OUT/cpu; mkdir -p $O; S=$O/summary.txt
echo "cores $(nproc); THP $(cat /sys/kernel/mm/transparent_hugepage/enabled) defrag $(cat /sys/kernel/mm/transparent_hugepage/defrag)" > $S
lscpu | grep -E "Model name|L3|NUMA node\(s\)" >> $S
gloo() { # n tag env...
  local n=$1 tag=$2; shift 2
  env "$@" timeout 120 /opt/torch/.venv/bin/torchrun --nproc-per-node $n --master-port $((29500 + n)) tools/gloo_bench.py 1M 256M > $O/gloo${n}_$tag.txt 2>&1
  echo "== gloo $n $tag rc $? $(grep -m1 '^# gloo' $O/gloo${n}_$tag.txt)" >> $S; grep -E "^ +[0-9]" $O/gloo${n}_$tag.txt >> $S
}
ox() { # n tag env...
  local n=$1 tag=$2; shift 2
  env "$@" timeout 100 $D/oxccl perf --ranks $n --op all_reduce -b 1M -e 256M -f 4 -n 10 -w 2 > $O/ox${n}_$tag.txt 2>&1
  echo "== oxccl $n $tag rc $? $(grep -m1 -i 'huge\|heap' $O/ox${n}_$tag.txt | cut -c1-120)" >> $S
  grep -E "^ +[0-9]" $O/ox${n}_$tag.txt | awk '{print $1, $6, $8, $9, $10, $12, $13}' >> $S
}
gloo 8 plain
gloo 8 thp THP_MEM_ALLOC_ENABLE=1 C10_THP_MEM_ALLOC_ENABLE=1
ox 8 huge
ox 8 heap OXCCL_PERF_HUGEPAGES=0
gloo 8 thp2 THP_MEM_ALLOC_ENABLE=1 C10_THP_MEM_ALLOC_ENABLE=1
ox 8 huge2
gloo 4 plain
gloo 4 thp THP_MEM_ALLOC_ENABLE=1 C10_THP_MEM_ALLOC_ENABLE=1
ox 4 huge
ox 4 heap OXCCL_PERF_HUGEPAGES=0
ls /dev/shm | head >> $S
cat $S
