#!/bin/bash
# Session 18 call 1 (one H200): session 17's review mends on the GPU (gpu_shared, gpu_elastic), then
# the host's ceilings for issue 13 (copy bandwidth of T threads, memcpy and process_vm_readv) and a
# prototype all-reduce through small shared windows, beside oxccl perf and Gloo, 8 processes.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=30
D=.dev/s18a; O=$OUT/o; mkdir -p $O; S=$OUT/summary.txt
nvidia-smi -L > $S; echo "cores $(nproc)" >> $S; lscpu | grep -E "Model name|Thread|Core|Socket|L2|L3" >> $S
which perf >> $S 2>&1; cat /proc/sys/kernel/perf_event_paranoid >> $S 2>&1
OXCCL_BIN=$PWD/$D/oxccl timeout 150 $D/gpu_shared --test-threads 1 > $O/gpu_shared.txt 2>&1; echo "== gpu_shared rc $? $(grep 'test result' $O/gpu_shared.txt)" >> $S
timeout 150 $D/gpu_elastic --test-threads 1 > $O/gpu_elastic.txt 2>&1; echo "== gpu_elastic rc $? $(grep 'test result' $O/gpu_elastic.txt)" >> $S
export CUDA_VISIBLE_DEVICES= OXCCL_HOST_MEMORY=1
for T in 1 2 4 8 16; do timeout 60 $D/bw 0 $T 64 1 >> $S; done
for T in 1 2 4 8 16; do timeout 60 $D/bw 2 $T 64 1 2048 >> $S; done
timeout 60 $D/bw 2 16 64 1 64 >> $S; timeout 60 $D/bw 2 16 64 0 64 >> $S; timeout 60 $D/bw 1 16 64 1 >> $S
timeout 120 /opt/torch/.venv/bin/torchrun --nproc-per-node 8 --master-port 29508 tools/gloo_bench.py 1M 256M > $O/gloo8.txt 2>&1
echo "== gloo 8 rc $?" >> $S; grep -E "^ +[0-9]" $O/gloo8.txt >> $S
ox() { timeout 100 $D/oxccl perf --ranks $1 --op all_reduce -b 1M -e 256M -f 4 -n 10 -w 2 > $O/ox$1_$2.txt 2>&1
  echo "== oxccl $1 rc $?" >> $S; grep -E "^ +[0-9]" $O/ox$1_$2.txt | awk '{print $1, $6, $8, $9, $10, $12, $13}' >> $S; }
ox 8 a
for sz in 1 4 16 64 256; do for sl in 128 512; do timeout 60 $D/proto 8 2 $sz $sl 10 >> $S; done; done
timeout 60 $D/proto 8 1 64 256 10 >> $S; timeout 60 $D/proto 8 2 64 2048 10 >> $S
ox 8 b
for sz in 16 256; do timeout 60 $D/proto 4 2 $sz 256 10 >> $S; timeout 60 $D/proto 4 4 $sz 256 10 >> $S; done
ox 4 a
echo "/dev/shm left: $(ls /dev/shm | grep -c oxccl)" >> $S
(cd $O && tar czf $OUT/o.tgz .)
cat $S
