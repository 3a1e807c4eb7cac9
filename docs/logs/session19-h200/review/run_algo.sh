#!/bin/bash
# Session 19 (one H200): device buffers, two ranks as two hosts through the net (one GPU), with
# NCCL_ALGO (then NCCL_PROTO) set on rank 1 only:
# after NCCL_ALGO became rank 0's on every rank (uncommitted tree on 94edbd1).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=10
D=.dev/s19k; O=$OUT/o; mkdir -p $O; S=$OUT/summary.txt; nvidia-smi -L > $S
w() { awk '/^ +[0-9]+ / && NF >= 12 {w += $9 + $13; n++} END {print "#wrong " w+0 " over " n+0 " rows"}' $1; }
cat > $O/rank.sh <<'EOS'
#!/bin/bash
if [ "$RANK" = 1 ]; then export "$VAR=$VAL"; fi
exec "$@"
EOS
chmod +x $O/rank.sh
for kv in NCCL_ALGO=Ring NCCL_ALGO=Tree NCCL_PROTO=LL; do
  t=net_${kv%%=*}_${kv#*=}
  VAR=${kv%%=*} VAL=${kv#*=} NCCL_DEBUG=WARN LOGDIR=$O LIMIT=45 timeout 50 tools/netns_run.sh $O/rank.sh $D/oxccl perf --device cuda --op all_reduce,all_gather,reduce_scatter,broadcast -b 8 -e 16M -f 64 -n 3 -w 1 > $O/$t.txt 2>&1
  rc=$?; mv $O/rank1.txt $O/${t}_rank1.txt 2>/dev/null
  echo "== $t rc $rc $(w $O/$t.txt)" >> $S
  grep -h -m2 -iE "WARN|error|mismatch" $O/$t.txt $O/${t}_rank1.txt 2>/dev/null | cut -c1-300 >> $S
done
(cd $O && tar czf $OUT/o.tgz .)
cat $S
