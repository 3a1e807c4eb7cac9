#!/bin/bash
# The PyTorch matrix (torch_matrix.py) on NCCL and on oxccl, on one GPU, then
# a table that sets the runs side by side (OUTDIR/matrix.md).
#
# Usage: run_matrix.sh PATH/TO/oxccl/libnccl.so OUTDIR
#
#   NCCL  world_size 1, INIT=eager and lazy (NCCL refuses 2 ranks on one GPU)
#   oxccl world_size 1 and 2 (both ranks on cuda:0), INIT=eager and lazy
#   oxccl MODE=timeout, world_size 2: with torchrun's default
#         TORCH_NCCL_ASYNC_ERROR_HANDLING=1 (the watchdog aborts the
#         communicators: ncclCommAbort with a collective hung) and with 3
#         (PyTorch's own default: the process exits without aborting), and
#         with lazy init (the hang is in making the communicator); no
#         flight recorder dump (see below)
#
# Every run is bounded by `timeout` (300 s, 120 s for the timeout mode, which
# must end in well under 60 s); its exit status (0: every rank got to the
# end; the verdicts are in the files) and wall time go to OUTDIR/runs.tsv and
# its output to OUTDIR/<name>.log. The comparison exits
# non-zero when an oxccl cell failed or is missing, or a timeout run did not
# end in time. Result tensors saved for the comparison (OUTDIR/*.pt, ~85 MB
# a run) are removed afterwards unless KEEP_TENSORS=1.
#
# PYTHON picks the interpreter (default: python). BACKEND=gloo DEVICE=cpu
# pass through to the script, to check its logic on a machine without a GPU.
set -u
if [ $# -ne 2 ]; then
	sed -n '2,/^set -u/p' "$0" | sed 's/^# \{0,1\}//;/^set -u/d'
	exit 2
fi
LIB=$1 OUT=$2
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1

mkdir -p "$OUT"
# oxccl under the SONAME that torch's libtorch_cuda.so asks for
TMP=$(mktemp -d /tmp/oxccl-matrix.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
cp "$LIB" "$TMP/libnccl.so.2" || exit 2
OXCCL=(LD_PRELOAD="$TMP/libnccl.so.2" NCCL_DEBUG=VERSION)

: > "$OUT/runs.tsv"
port=29600

# run NAME NPROC BOUND_S [VAR=VALUE...]
run() {
	local name=$1 np=$2 bound=$3
	shift 3
	port=$((port + 10)) # each run its own rendezvous port
	rm -f "$OUT/$name".json.rank*
	local t0 t1 rc
	t0=$(date +%s.%N)
	env "$@" timeout "$bound" "$PY" -m torch.distributed.run --nproc-per-node "$np" \
		--master-port "$port" "$HERE/torch_matrix.py" "$OUT/$name.json" > "$OUT/$name.log" 2>&1
	rc=$?
	t1=$(date +%s.%N)
	local wall
	wall=$(awk "BEGIN { printf \"%.1f\", $t1 - $t0 }")
	printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$np" "$rc" "$wall" "$bound" "$t1" >> "$OUT/runs.tsv"
	echo "$name: exit $rc, ${wall} s$([ "$rc" = 124 ] && echo " (killed by timeout $bound)")"
}

for init in eager lazy; do
	run "nccl_ws1_$init" 1 300 INIT=$init NCCL_DEBUG=VERSION
done
for init in eager lazy; do
	for ws in 1 2; do
		run "oxccl_ws${ws}_$init" "$ws" 300 INIT=$init "${OXCCL[@]}"
	done
done
# NCCL cannot run 2 ranks on one GPU, so the timeout mode runs on oxccl only.
# Without a flight recorder dump: by default torch 2.11 waits 60 s for that
# dump after its watchdog caught the timeout, before it takes the process
# down (seen on an H100), so no backend could end the run before rank 0
# wakes; what is measured here is the watchdog and the abort.
NODUMP=(TORCH_NCCL_DUMP_ON_TIMEOUT=0 TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC=1000)
run oxccl_timeout_eager 2 120 MODE=timeout INIT=eager "${NODUMP[@]}" "${OXCCL[@]}"
run oxccl_timeout_eager_skipcleanup 2 120 MODE=timeout INIT=eager "${NODUMP[@]}" \
	TORCH_NCCL_ASYNC_ERROR_HANDLING=3 "${OXCCL[@]}"
run oxccl_timeout_lazy 2 120 MODE=timeout INIT=lazy "${NODUMP[@]}" "${OXCCL[@]}"

grep -h "NCCL version" "$OUT"/*.log | sort | uniq -c
"$PY" "$HERE/torch_matrix.py" --compare "$OUT" # prints the table and writes OUT/matrix.md
rc=$?
[ "${KEEP_TENSORS:-0}" = 1 ] || rm -f "$OUT"/*.pt
exit $rc
