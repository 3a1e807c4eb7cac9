#!/bin/bash
# Session 18 (one H200, host only): does the kernel's copy into a fresh destination read it for
# ownership? bw.c: process_vm_readv straight into the destination against readv into a small
# scratch then non-temporal stores; pull.c (8 processes x 2 lanes, whole parts): the all-gather
# pulls the same two ways.
export CUDA_VISIBLE_DEVICES=
D=.dev/s18g; S=$OUT/summary.txt; : > $S
for T in 8 16; do for c in 64 256; do timeout 60 $D/bw 2 $T 64 1 $c >> $S; timeout 60 $D/bw 3 $T 64 1 $c >> $S; done; done
timeout 60 $D/bw 0 16 64 1 >> $S
for r in 1 2; do for sz in 16 64 256; do timeout 60 $D/pull 8 2 $sz 0 10 0 0 >> $S; timeout 60 $D/pull 8 2 $sz 0 10 0 1 >> $S; done; done
cat $S
