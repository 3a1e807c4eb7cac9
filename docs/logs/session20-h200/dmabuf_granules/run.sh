#!/bin/bash
# Session 20 (one H200): gpu_dmabuf and gpu_gdr after the slots' 2 MiB rounding (b7b97f2's successor),
# with the default NCCL_BUFFSIZE and with a small one (256 KiB: slots far below a granule).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=30
D=.dev/s20i; O=$OUT/o; mkdir -p $O; S=$OUT/summary.txt; nvidia-smi -L > $S
for b in default 262144; do
  for t in gpu_dmabuf gpu_gdr; do
    if [ $b = default ]; then unset NCCL_BUFFSIZE; else export NCCL_BUFFSIZE=$b; fi
    timeout 150 $D/$t --nocapture > $O/${t}_$b.txt 2>&1; echo "== $t BUFFSIZE=$b rc $? $(grep 'test result' $O/${t}_$b.txt)" >> $S
    grep -h -E "NCCL_NET_GDR_LEVEL=|NCCL_DMABUF_ENABLE=|panicked" $O/${t}_$b.txt >> $S
  done
done
(cd $O && tar czf $OUT/o.tgz .)
cat $S
