#!/bin/bash
# Session 20 (one H200), main ded1b02: tuner plugins that would choose apart are dropped on every
# rank. GPU tests (gpu_tuner: a tuner alike on every rank is still obeyed), the standard perf rows,
# then two ranks as two hosts through the net with device buffers: a tuner on rank 1 only, and one
# tuner library with a rules file on rank 0 only, on f6b61ea (oxccl_before) and ded1b02; then the
# same rules on both ranks (the tuner must be obeyed: its INFO decisions).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=30
D=.dev/s20a; O=$OUT/o; mkdir -p $O; S=$OUT/summary.txt; nvidia-smi -L > $S
w() { awk '/^ +[0-9]+ / && NF >= 12 {w += $9 + $13; n++} END {print "#wrong " w+0 " over " n+0 " rows"}' $1; }
timeout 150 $D/gpu_collectives > $O/gpu_collectives.txt 2>&1; echo "== gpu_collectives rc $? $(grep 'test result' $O/gpu_collectives.txt)" >> $S
timeout 150 env OXCCL_BIN=$PWD/$D/oxccl $D/gpu_shared > $O/gpu_shared.txt 2>&1; echo "== gpu_shared rc $? $(grep 'test result' $O/gpu_shared.txt)" >> $S
timeout 120 $D/gpu_elastic > $O/gpu_elastic.txt 2>&1; echo "== gpu_elastic rc $? $(grep 'test result' $O/gpu_elastic.txt)" >> $S
timeout 120 $D/gpu_tuner > $O/gpu_tuner.txt 2>&1; echo "== gpu_tuner rc $? $(grep 'test result' $O/gpu_tuner.txt)" >> $S
timeout 90 $D/oxccl perf --device cuda --ranks 2 --op all -b 8 -e 64M -f 16 -n 5 -w 2 > $O/dev2.txt 2>&1; echo "== device 2 ranks one GPU rc $? $(w $O/dev2.txt)" >> $S
LIMIT=120 timeout 130 tools/netns_run.sh $D/oxccl perf --device cuda --op all -b 8 -e 64M -f 16 -n 5 -w 2 > $O/netns.txt 2>&1; echo "== device 2 namespaces through the net rc $? $(w $O/netns.txt)" >> $S
grep -m3 -E "via NET|hosts|nNodes" $O/netns.txt | cut -c1-160 >> $S
CUDA_VISIBLE_DEVICES= OXCCL_HOST_MEMORY=1 timeout 90 $D/oxccl perf --ranks 8 --op all -b 8 -e 64M -f 16 -n 5 -w 2 > $O/host8.txt 2>&1; echo "== host 8 ranks rc $? $(w $O/host8.txt)" >> $S
printf '[[rule]]\ncollective = "all_reduce"\nalgorithm = "ring"\nprotocol = "simple"\n' > $O/rules.toml
cat > $O/rank.sh <<'EOS'
#!/bin/bash
# Rank 1 exports $R1, the others $R0 (space-separated VAR=VAL).
if [ "$RANK" = 1 ]; then for kv in $R1; do export "$kv"; done; else for kv in $R0; do export "$kv"; done; fi
exec "$@"
EOS
chmod +x $O/rank.sh
T=$PWD/$D
run() { # name bin R0 R1 [debug]
  R0="$3" R1="$4" NCCL_DEBUG=${5:-WARN} NCCL_DEBUG_SUBSYS=INIT,TUNING LOGDIR=$O LIMIT=60 timeout 70 tools/netns_run.sh $O/rank.sh $T/$2 perf --device cuda --op all_reduce,all_gather -b 8 -e 64M -f 32 -n 5 -w 2 > $O/$1.txt 2>&1
  rc=$?; mv $O/rank1.txt $O/$1_rank1.txt 2>/dev/null
  echo "== $1 rc $rc $(w $O/$1.txt)" >> $S
  grep -h -m2 -E "WARN|rror" $O/$1.txt $O/$1_rank1.txt 2>/dev/null | cut -c1-330 >> $S
}
for bin in oxccl_before oxccl; do
  run ${bin}_one_rank $bin "NCCL_TUNER_PLUGIN=none" "NCCL_TUNER_PLUGIN=$T/libtuner_ring.so"
  run ${bin}_rules_apart $bin "NCCL_TUNER_PLUGIN=$T/liboxccl_tuner.so OXCCL_TUNER_CONFIG=$O/rules.toml" "NCCL_TUNER_PLUGIN=$T/liboxccl_tuner.so"
done
run oxccl_rules_alike oxccl "NCCL_TUNER_PLUGIN=$T/liboxccl_tuner.so OXCCL_TUNER_CONFIG=$O/rules.toml" "NCCL_TUNER_PLUGIN=$T/liboxccl_tuner.so OXCCL_TUNER_CONFIG=$O/rules.toml" INFO
echo "rules alike: tuner decisions logged on rank 0: $(grep -c 'tuner oxccl' $O/oxccl_rules_alike.txt), on rank 1: $(grep -c 'tuner oxccl' $O/oxccl_rules_alike_rank1.txt); first: $(grep -m1 'tuner oxccl' $O/oxccl_rules_alike.txt | cut -c1-220)" >> $S
echo "/dev/shm left: $(ls /dev/shm | grep -c oxccl)" >> $S
(cd $O && tar czf $OUT/o.tgz .)
cat $S
