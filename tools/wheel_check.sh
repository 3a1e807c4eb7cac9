#!/bin/bash
# The oxccl wheel as a user meets it: (a) builds it with pip and the
# registry's setuptools, (b) makes a fresh venv, (c) installs it there,
# (d) runs `oxccl-run -- oxccl perf` on host memory and NCCL's C API from
# Python (ctypes: ncclGetVersion and a 2-rank host-memory all_reduce), and
# (e) with --torch-python PATH, where that Python has torch with CUDA, a
# 2-rank torch.distributed all_reduce on the nccl backend under oxccl-run.
#
# Usage: tools/wheel_check.sh [--torch-python PATH] [--wheel WHL] [--out DIR]
#   --wheel WHL  skip (a) and check this wheel (a machine that cannot reach
#                the registry cannot build one: build it elsewhere, carry it)
#   --out DIR    where the wheel, the venv and the logs go (default
#                /tmp/oxccl-wheel-check; its dist/ and venv/ are made anew)
# PYTHON picks the Python that builds the wheel and makes the venv
# (default python3); CARGO_TARGET_DIR is passed on to cargo.
set -euo pipefail

# NVLink SHARP and multicast memory stay off (the GPU machine's setting).
export NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
OUT=/tmp/oxccl-wheel-check
TORCH_PY=
WHEEL=
while [ $# -gt 0 ]; do
  case $1 in
    --torch-python) TORCH_PY=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --wheel) WHEEL=$(cd "$(dirname "$2")" && pwd)/$(basename "$2"); shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "wheel_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -rf "$OUT/venv"
[ -n "$WHEEL" ] || rm -rf "$OUT/dist"
fails=0
step() { echo; echo "== $*"; }
check() { # NAME COMMAND...: runs it, says ok or FAILED with the exit code
  local name=$1; shift
  if "$@"; then echo "-- $name: ok"; else echo "-- $name: FAILED (exit $?)"; fails=$((fails + 1)); fi
}

if [ -n "$WHEEL" ]; then
  step "(a) skipped: the wheel given"
  whl=$WHEEL
else
  step "(a) pip wheel $ROOT/python"
  "$PY" -m pip wheel --no-deps -w "$OUT/dist" "$ROOT/python" > "$OUT/build.log" 2>&1 \
    || { tail -30 "$OUT/build.log"; echo "wheel build FAILED (log: $OUT/build.log)"; exit 1; }
  whl=$(ls "$OUT"/dist/oxccl-*.whl)
fi
echo "$whl: $(du -k "$whl" | cut -f1) KiB"
"$PY" -m zipfile -l "$whl"

step "(b) $PY -m venv $OUT/venv"
"$PY" -m venv "$OUT/venv"
step "(c) pip install $(basename "$whl")"
"$OUT/venv/bin/pip" install --no-deps "$whl" 2>&1 | tail -1
# As `source venv/bin/activate` would.
export PATH="$OUT/venv/bin:$PATH"
hash -r

step "(d) oxccl-run -- oxccl perf --ranks 2 --op all_reduce -b 8 -e 1M -f 4"
check "oxccl --version" oxccl --version
check "oxccl perf, host memory" oxccl-run -- oxccl perf --ranks 2 --op all_reduce -b 8 -e 1M -f 4
step "(d) oxccl-run -- python host_allreduce.py (ctypes, 2 processes, host memory)"
check "ctypes all_reduce" oxccl-run -- python "$ROOT/python/examples/host_allreduce.py"
step "(d) oxccl-run --plugins=tuner,env and OXCCL_RUN_QUIET=1"
check "plugins set" bash -c 'oxccl-run --plugins=tuner,env -- env | grep -E "^NCCL_(TUNER|ENV)_PLUGIN=.*/oxccl/lib/libnccl-(tuner|env)-oxccl.so$" | sort'
check "quiet" bash -c 'test -z "$(OXCCL_RUN_QUIET=1 oxccl-run -- true 2>&1)"'
check "oxccl.library()" python -c 'import oxccl, os; print(oxccl.describe()); print(sorted(oxccl.plugins())); assert os.path.isfile(oxccl.library())'

if [ -n "$TORCH_PY" ]; then
  step "(e) PyTorch: $TORCH_PY"
  if why=$("$TORCH_PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'torch.cuda.is_available() is False')" 2>&1); then
    # oxccl-run only sets the environment: the venv's copy starts torch's
    # own Python, which needs no oxccl package.
    check "torch all_reduce on oxccl" bash -c "cd '$OUT' && timeout 600 oxccl-run -- '$TORCH_PY' -m torch.distributed.run \
      --nproc-per-node 2 --master-port 29533 '$ROOT/python/examples/torch_allreduce.py' 2>&1 | tee '$OUT/torch.log' \
      | grep -E '^oxccl-run:|^torch all_reduce|Error|error:'; exit \${PIPESTATUS[0]}"
  else
    echo "-- (e) skipped: $TORCH_PY: $(echo "$why" | tail -1)"
  fi
fi

echo
if [ "$fails" -eq 0 ]; then echo "wheel_check: all passed"; else echo "wheel_check: $fails FAILED"; fi
[ "$fails" -eq 0 ]
