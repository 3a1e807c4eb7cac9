#!/usr/bin/env bash
# oxccl perf (through shared memory, and with NCCL_SHM_DISABLE=1 through the
# socket network) against OpenMPI's MPI_Allreduce over TCP loopback and over
# its shared-memory transport (vader), in one run, plus the kernel's floor for
# an 8-byte exchange over loopback TCP (tools/tcp_exchange.c: one connection,
# and one each way as NCCL's net ABI has them) in every 8 B round, and a raw
# TCP stream (iperf3) for the machine's loopback limit.
# Needs: apt-get install openmpi-bin libopenmpi-dev iperf3
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=${RANKS:-2}
cargo build --release -q -p oxccl-cli
bin=${CARGO_TARGET_DIR:-target}/release
mpicc -O2 -o "$bin/mpi_allreduce" tools/mpi_allreduce.c
cc -O2 -o "$bin/tcp_exchange" tools/tcp_exchange.c
mpi() { mpirun --allow-run-as-root --oversubscribe -np "$ranks" --mca btl tcp,self --mca btl_tcp_if_include lo \
  --mca pml ob1 "$bin/mpi_allreduce" "$@" | sed 's/^/mpi-tcp /'; }
mpi_shm() { mpirun --allow-run-as-root --oversubscribe -np "$ranks" --mca btl vader,self \
  --mca pml ob1 "$bin/mpi_allreduce" "$@" | sed 's/^/mpi-vader /'; }
echo "## machine: $(nproc) cores, $(uname -r)"
for size in 8 67108864; do
  iters=$([ "$size" -le 8 ] && echo 2000 || echo 20)
  # The same warm-up on every side: a tenth of the timed calls, at least 5.
  warm=$(( iters / 10 > 5 ? iters / 10 : 5 ))
  echo "## $size bytes, $ranks ranks"
  for round in 1 2 3; do
    "$bin/oxccl" perf --ranks "$ranks" --op all_reduce -b "$size" -e "$size" -n "$iters" -w "$warm" | grep -v '^#' | sed 's/^/oxccl-shm /'
    NCCL_SHM_DISABLE=1 "$bin/oxccl" perf --ranks "$ranks" --op all_reduce -b "$size" -e "$size" -n "$iters" -w "$warm" | grep -v '^#' | sed 's/^/oxccl-net /'
    mpi "$size" "$iters" "$warm"
    mpi_shm "$size" "$iters" "$warm"
    if [ "$size" -le 8 ]; then
      "$bin/tcp_exchange" "$iters" "$warm" | sed 's/^/tcp-floor /'
      "$bin/tcp_exchange" "$iters" "$warm" oneway | sed 's/^/tcp-floor /'
    fi
  done
done
if command -v iperf3 >/dev/null; then
  echo "## raw TCP stream on loopback (iperf3, 1 stream)"
  iperf3 -s -1 -D -p 5299 >/dev/null; sleep 0.5
  iperf3 -c 127.0.0.1 -p 5299 -t 3 -f g | grep -E 'receiver'
fi
