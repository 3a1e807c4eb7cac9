#!/bin/bash
# Session 22 on 2 GPUs: LL in shared-memory windows with NCCL's LL step (64 KiB slots, 8 lines a thread,
# loads issued together) up to 64 KiB by default. nccl-tests -g 2 NCCL_P2P_DISABLE=1 on NCCL 2.28.9, oxccl
# default and oxccl NCCL_PROTO=Simple, alternating; LL forced for the crossover; 2 processes; correctness
# through SHM and through the net (whose LL keeps 8 KiB slots); gpu_gdr.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NCCL_IB_DISABLE=1 NCCL_TIMEOUT=60
D=.dev/s22c; O=$OUT/o; mkdir -p $O; S=$OUT/summary.txt; nvidia-smi -L > $S; md5sum $D/oxccl $D/libnccl.so.2 >> $S
N=$(ls -d /opt/torch/.venv/lib/python*/site-packages/nvidia/nccl)
mkdir -p /tmp/nh/lib /tmp/ox; ln -sf $N/include /tmp/nh/include; ln -sf $N/lib/libnccl.so.2 /tmp/nh/lib/libnccl.so; ln -sf $N/lib/libnccl.so.2 /tmp/nh/lib/libnccl.so.2
cp $D/libnccl.so.2 /tmp/ox/
CU=$(ls -d /usr/local/cuda* | head -1)
t=$(date +%s); make -C .dev/nt/src -j32 CUDA_HOME=$CU NCCL_HOME=/tmp/nh BUILDDIR=/tmp/ntb NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" /tmp/ntb/all_reduce_perf /tmp/ntb/all_gather_perf /tmp/ntb/sendrecv_perf > $O/build.txt 2>&1; echo "build rc $? in $(($(date +%s)-t)) s" >> $S
w() { awk '/^ +[0-9]+ / && NF >= 12 {w += $9 + $13; n++} END {print "#wrong " w+0 " over " n+0 " rows"}' $1; }
s() { awk '/^ +[0-9]+ / && NF>=12 {printf "%s %s/%s ", $1, $6, $10} END {print ""}' $1; }
E="NCCL_P2P_DISABLE=1"
# Fail fast if the kernels do not compile.
timeout 60 env $E $D/oxccl perf -g 2 --op all_reduce -b 8 -e 64K -f 8 -n 5 -w 1 > $O/smoke.txt 2>&1; echo "smoke rc $? $(w $O/smoke.txt)" >> $S
if ! grep -q "#wrong 0 over [1-9]" <(w $O/smoke.txt); then tail -30 $O/smoke.txt >> $S; cat $S; exit 1; fi
for op in all_reduce all_gather sendrecv; do for i in 1 2; do for who in nccl ll simple; do
  L=/tmp/ox; X=; case $who in nccl) L=/tmp/nh/lib;; simple) X="NCCL_PROTO=Simple";; esac
  timeout 60 env $E $X LD_LIBRARY_PATH=$L /tmp/ntb/${op}_perf -g 2 -b 8 -e 256K -f 4 -n 1000 -w 100 > $O/${op}_${who}_$i.txt 2>&1
  echo "$op $who $i rc $?: $(s $O/${op}_${who}_$i.txt) $(w $O/${op}_${who}_$i.txt)" >> $S
done; done; done
for op in all_reduce all_gather; do
  timeout 60 env $E NCCL_PROTO=LL LD_LIBRARY_PATH=/tmp/ox /tmp/ntb/${op}_perf -g 2 -b 16K -e 1M -f 2 -n 500 -w 50 > $O/${op}_forced.txt 2>&1
  echo "$op LL forced rc $?: $(s $O/${op}_forced.txt) $(w $O/${op}_forced.txt)" >> $S
  timeout 60 env $E NCCL_PROTO=Simple LD_LIBRARY_PATH=/tmp/ox /tmp/ntb/${op}_perf -g 2 -b 16K -e 1M -f 2 -n 500 -w 50 > $O/${op}_simple_wide.txt 2>&1
  echo "$op Simple rc $?: $(s $O/${op}_simple_wide.txt) $(w $O/${op}_simple_wide.txt)" >> $S
  timeout 60 env $E LD_LIBRARY_PATH=/tmp/nh/lib /tmp/ntb/${op}_perf -g 2 -b 16K -e 1M -f 2 -n 500 -w 50 > $O/${op}_nccl_wide.txt 2>&1
  echo "$op NCCL rc $?: $(s $O/${op}_nccl_wide.txt) $(w $O/${op}_nccl_wide.txt)" >> $S
done
for i in 1 2; do for p in LL Simple; do
  timeout 60 env $E NCCL_PROTO=$p NCCL_DEBUG=INFO $D/oxccl perf --device cuda --ranks 2 --op all_reduce -b 8 -e 256K -f 4 -n 1000 -w 100 > $O/procs2_${p}_$i.txt 2>&1
  echo "2 procs all_reduce $p $i rc $?: $(s $O/procs2_${p}_$i.txt) $(w $O/procs2_${p}_$i.txt)" >> $S
done; done
grep -m1 -h -o "LL protocol[^;]*" $O/procs2_LL_1.txt >> $S
timeout 120 env $E $D/oxccl perf -g 2 --op all -d all -o all -b 8 -e 256K -f 3 -n 2 -w 1 > $O/g2_all.txt 2>&1; echo "== -g 2 SHM every coll/dtype/op 8 B-256 KiB rc $? $(w $O/g2_all.txt)" >> $S
timeout 100 env $E NCCL_PROTO=LL $D/oxccl perf -g 3 --op all -b 8 -e 1M -f 3 -n 2 -w 1 > $O/g3_ll.txt 2>&1; echo "== -g 3 SHM LL forced every coll 8 B-1 MiB rc $? $(w $O/g3_ll.txt)" >> $S
timeout 100 env $E NCCL_SHM_DISABLE=1 NCCL_SOCKET_IFNAME=lo $D/oxccl perf -g 2 --op all -d all -b 8 -e 64K -f 3 -n 2 -w 1 > $O/g2_net.txt 2>&1; echo "== -g 2 net every coll/dtype 8 B-64 KiB rc $? $(w $O/g2_net.txt)" >> $S
timeout 100 $D/gpu_gdr --nocapture > $O/gpu_gdr.txt 2>&1; echo "== gpu_gdr rc $? $(grep 'test result' $O/gpu_gdr.txt)" >> $S
mkdir -p $O/logs_mixed; timeout 140 env NCCL_P2P_DISABLE=1 GPUS=split HOSTS=2 PER_HOST=2 LIMIT=130 LOGDIR=$O/logs_mixed tools/netns_run.sh $D/oxccl perf --device cuda --op all -b 8 -e 1M -f 4 -n 3 -w 1 > $O/mixed.txt 2>&1; echo "== 2 hosts x 2 ranks, SHM inside rc $? $(w $O/mixed.txt)" >> $S
echo "/dev/shm left: $(ls /dev/shm | grep -c oxccl)" >> $S
(cd $O && gzip -9 g2_all.txt; tar czf $OUT/o.tgz .)
cat $S
