#!/bin/bash
# Session 21: proxy profiler events for LL steps (LL launches announced to the proxy): gpu_profiler on one H200,
# whose net test runs a 4 KiB all_reduce (LL) and a 4 MiB one (Simple) through the proxy.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1
D=.dev/s21h; O=$OUT/o; mkdir -p $O $(cat $D/fixtures_path); cp $D/libprofiler_tree.so $(cat $D/fixtures_path)/
S=$OUT/summary.txt; nvidia-smi -L > $S; md5sum $D/oxccl $D/gpu_profiler >> $S
timeout 400 $D/gpu_profiler --nocapture --test-threads 1 > $O/gpu_profiler.txt 2>&1; echo "== gpu_profiler rc $? $(grep 'test result' $O/gpu_profiler.txt)" >> $S
grep -E "^test |panicked|proxy ops|assert" $O/gpu_profiler.txt | cut -c1-400 | head -20 >> $S
(cd $O && tar czf $OUT/o.tgz .)
cat $S
