#!/usr/bin/env bash
# oxccl perf against OpenMPI's MPI_Allreduce over TCP loopback, in one run,
# plus a raw TCP stream (iperf3) for the machine's loopback limit.
# Needs: apt-get install openmpi-bin libopenmpi-dev iperf3
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=${RANKS:-2}
cargo build --release -q -p oxccl-cli
mpicc -O2 -o target/release/mpi_allreduce tools/mpi_allreduce.c
mpi() { mpirun --allow-run-as-root --oversubscribe -np "$ranks" --mca btl tcp,self --mca btl_tcp_if_include lo \
  --mca pml ob1 target/release/mpi_allreduce "$@"; }
echo "## machine: $(nproc) cores, $(uname -r)"
for size in 8 67108864; do
  iters=$([ "$size" -le 8 ] && echo 2000 || echo 20)
  echo "## $size bytes"
  target/release/oxccl perf --ranks "$ranks" --coll all_reduce -b "$size" -e "$size" -n "$iters" -w 50 | grep -v '^#' || true
  mpi "$size" "$iters"
done
if command -v iperf3 >/dev/null; then
  echo "## raw TCP stream on loopback (iperf3, 1 stream, then 4)"
  iperf3 -s -1 -D -p 5299 >/dev/null; sleep 0.5
  iperf3 -c 127.0.0.1 -p 5299 -t 3 -f g | grep -E 'receiver'
  iperf3 -s -1 -D -p 5299 >/dev/null; sleep 0.5
  iperf3 -c 127.0.0.1 -p 5299 -t 3 -P 4 -f g | grep -E 'SUM.*receiver'
fi
