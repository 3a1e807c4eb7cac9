#!/bin/bash
# Session 19 (one H200): two ranks as two hosts through the net (tools/netns_run.sh, device
# buffers on the one GPU), rank 1 alone setting NCCL_MAX_NCHANNELS=1, then NCCL_CHUNK_SIZE=128K:
# main 8329a7b, #wrong and
# what rank 1 logged.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=20
D=.dev/s19g; O=$OUT/o; mkdir -p $O; S=$OUT/summary.txt; nvidia-smi -L > $S
w() { awk '/^ +[0-9]+ / && NF >= 12 {w += $9 + $13; n++} END {print "#wrong " w+0 " over " n+0 " rows"}' $1; }
cat > $O/rank.sh <<'EOS'
#!/bin/bash
# Rank 1 alone sets $VAR=$VAL.
if [ "$RANK" = 1 ]; then export "$VAR=$VAL"; fi
exec "$@"
EOS
chmod +x $O/rank.sh
for bin in oxccl oxccl_782; do
  [ -x $D/$bin ] || continue
  for kv in NCCL_MAX_NCHANNELS=1 NCCL_CHUNK_SIZE=131072; do
    t=${bin}_${kv%%=*}
    VAR=${kv%%=*} VAL=${kv#*=} NCCL_DEBUG=WARN LOGDIR=$O LIMIT=60 timeout 70 tools/netns_run.sh $O/rank.sh $D/$bin perf --device cuda --op all_reduce,all_gather -b 8 -e 64M -f 32 -n 5 -w 2 > $O/$t.txt 2>&1
    rc=$?; mv $O/rank1.txt $O/${t}_rank1.txt 2>/dev/null
    echo "== $t rc $rc $(w $O/$t.txt)" >> $S
    grep -h -m2 -E "WARN" $O/${t}_rank1.txt $O/$t.txt 2>/dev/null | cut -c1-260 >> $S
  done
done
(cd $O && tar czf $OUT/o.tgz .)
cat $S
