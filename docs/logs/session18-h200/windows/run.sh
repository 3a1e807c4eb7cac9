#!/bin/bash
# Session 18 call 4 (one H200, host only): prototype pull.c, 8 processes x 2 lanes: pulling slices
# from the owners' outputs (process_vm_readv) against copying them from small shared windows.
export CUDA_VISIBLE_DEVICES=
D=.dev/s18d; S=$OUT/summary.txt; : > $S
for r in 1 2; do for sz in 16 64 256; do
  timeout 60 $D/pull 8 2 $sz 0 10 0 >> $S; timeout 60 $D/pull 8 2 $sz 1024 10 0 >> $S
  timeout 60 $D/pull 8 2 $sz 256 10 1 >> $S; timeout 60 $D/pull 8 2 $sz 1024 10 1 >> $S
done; done
cat $S
