#!/usr/bin/env bash
# NCCL's own profiler plugins under oxccl: the example profiler
# (plugins/profiler/example) and the Inspector (plugins/profiler/inspector)
# are taken from an NCCL source tree or git dir, built, and run under
# `oxccl perf`; what they recorded is summarised per event kind.
#
#   tools/nccl_profilers.sh [build|run|all] [OUTDIR]
#
#   NCCL_SRC   NCCL source tree or git dir (default: the mirror's git dir)
#   NCCL_TAG   tag to take from a git dir (default v2.30.7-1)
#   NCCL_SUBDIR  where NCCL's tree lies inside that git dir's commit, for a
#              repository that carries NCCL as a folder: NCCL 2.31.2 is
#              read from torchcomms with
#              NCCL_SRC=/work/.mirror/meta-pytorch+torchcomms/repo
#              NCCL_TAG=HEAD NCCL_SUBDIR=comms/ncclx/v2_31
#   OXCCL      the oxccl binary (default $CARGO_TARGET_DIR/release/oxccl,
#              built with cargo where cargo is found)
#   DEVICE     host (default) or cuda: `oxccl perf --device cuda`
#   RANKS      ranks per run (default "2 3" on host, "2" on cuda)
#   ITERS      iterations per size (default 2, warmup 1)
#
# `build` needs g++ and only the plugins' own headers: CUDA headers are
# used where CUDA_HOME has them, else the few CUDA declarations the two
# plugins use are written here (cuda_stub/), with a stand-in
# libcudart.so.12 that forwards them to the CUDA driver (libcuda.so.1)
# where one is installed and reports no device otherwise. On a GPU machine
# a real libcudart.so.12 is put first on LD_LIBRARY_PATH (CUDART_DIR, or
# PyTorch's) where there is one; CUDA 13 machines have none, and the
# stand-in's forwarding serves. The Inspector also
# dlopens libcuda (the driver) and asks cudaGetDevice, cuDeviceGet and
# cuDeviceGetUuid for each communicator; without a driver it disables
# itself. On host memory (DEVICE=host) where no libcuda.so.1 is installed,
# `run` gives the Inspector a stand-in driver with those calls alone
# (device 0, a zero UUID; HOST_DRIVER=0 turns it off) and
# NCCL_INSPECTOR_REQUIRE_KERNEL_TIMING=0: it then starts, tracks every
# collective and p2p, and writes a record for each: it completes an
# operation when the last of its kernel-channel events stops
# (inspector_plugin.cc), which oxccl reports on host memory too, one per
# lane, timed with the host's clock.
# Nothing of NCCL is copied into oxccl: the sources stay in OUTDIR/src.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-all}
out=${2:-${OUT:-/tmp}/nccl-profilers}
src=${NCCL_SRC:-/work/.mirror/NVIDIA+nccl/repo}
tag=${NCCL_TAG:-v2.30.7-1}
subdir=${NCCL_SUBDIR:-}
device=${DEVICE:-host}
iters=${ITERS:-2}
if [ "$device" = cuda ]; then ranks=${RANKS:-2}; else ranks=${RANKS:-"2 3"}; fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
lib=$out/lib

build() {
  rm -rf "$out/src" && mkdir -p "$out/src" "$lib"
  if [ -d "$src/plugins/profiler/example" ]; then
    cp -r "$src/plugins" "$out/src/"
  elif git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
    git -C "$src" archive "$tag${subdir:+:$subdir}" plugins/profiler | tar -x -C "$out/src"
  else
    echo "no NCCL source at $src (set NCCL_SRC to a source tree or git dir)"; exit 2
  fi
  local inc
  if [ -n "${CUDA_HOME:-}" ] && [ -f "$CUDA_HOME/include/cuda_runtime.h" ]; then
    inc=$CUDA_HOME/include
  else
    inc=$out/cuda_stub/include
    mkdir -p "$inc" "$out/cuda_stub/lib"
    # The CUDA runtime and driver declarations the two plugins use, with
    # the C types of CUDA 12/13 (enums are ints, handles are pointers).
    cat >"$inc/cuda_runtime.h" <<'H'
#pragma once
#ifdef __cplusplus
extern "C" {
#endif
typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorNoDevice = 100 };
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
#define cudaEventDisableTiming 0x02
cudaError_t cudaGetDevice(int* device);
const char* cudaGetErrorString(cudaError_t error);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaEventDestroy(cudaEvent_t event);
#ifdef __cplusplus
}
static inline cudaError_t cudaEventCreate(cudaEvent_t* event, unsigned int flags) {
  return cudaEventCreateWithFlags(event, flags);
}
#endif
H
    cat >"$inc/cuda.h" <<'H'
#pragma once
typedef int CUresult;
#define CUDA_SUCCESS 0
typedef int CUdevice;
typedef struct CUuuid_st { char bytes[16]; } CUuuid;
H
    cat >"$out/cuda_stub/cudart.c" <<'C'
/* Stand-in CUDA runtime: forwards the few calls the plugins make to the
 * CUDA driver (libcuda.so.1) where one is installed, so that on a GPU
 * machine whose runtime is another major version the plugins still see
 * the device; without a driver it reports no device. */
#include <dlfcn.h>
#include "cuda_runtime.h"
static void* drv(const char* f) {
  static void* h;
  if (!h) h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  return h ? dlsym(h, f) : 0;
}
/* Driver and runtime share these codes (0 success, 600 not ready). */
typedef int (*dev_fn)(int*);
typedef int (*evc_fn)(cudaEvent_t*, unsigned int);
typedef int (*evr_fn)(cudaEvent_t, cudaStream_t);
typedef int (*ev_fn)(cudaEvent_t);
typedef int (*evt_fn)(float*, cudaEvent_t, cudaEvent_t);
#define CALL(type, name, ...) do { type f = (type)drv(name); \
  return f ? f(__VA_ARGS__) : cudaErrorNoDevice; } while (0)
/* The runtime's answer where no context is current on the thread is its
 * default device, 0; the driver's is an error (201). */
cudaError_t cudaGetDevice(int* d) {
  dev_fn f = (dev_fn)drv("cuCtxGetDevice");
  if (!f) return cudaErrorNoDevice;
  int r = f(d);
  if (r == 201) { *d = 0; return cudaSuccess; }
  return r;
}
const char* cudaGetErrorString(cudaError_t e) {
  return e == cudaErrorNoDevice ? "no CUDA device (oxccl's stand-in CUDA runtime)" : e ? "CUDA driver error" : "no error";
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) { CALL(evc_fn, "cuEventCreate", e, flags); }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) { CALL(evr_fn, "cuEventRecord", e, s); }
cudaError_t cudaEventQuery(cudaEvent_t e) { CALL(ev_fn, "cuEventQuery", e); }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) { CALL(evt_fn, "cuEventElapsedTime", ms, a, b); }
cudaError_t cudaEventDestroy(cudaEvent_t e) { CALL(ev_fn, "cuEventDestroy_v2", e); }
C
    gcc -shared -fPIC -O1 -I"$inc" -Wl,-soname,libcudart.so.12 \
      -o "$out/cuda_stub/lib/libcudart.so.12" "$out/cuda_stub/cudart.c" -ldl
    ln -sf libcudart.so.12 "$out/cuda_stub/lib/libcudart.so"
    cp "$out/cuda_stub/lib/libcudart.so.12" "$lib/"
  fi
  # A stand-in CUDA driver for host-memory runs of the Inspector: the
  # three driver calls it makes per communicator, and the current device
  # the stand-in runtime asks for. Kept apart (hostdrv/), put on the
  # library path only where no real driver is installed.
  mkdir -p "$out/hostdrv"
  cat >"$out/hostdrv/cuda_host.c" <<'C'
/* Host-only stand-in for libcuda.so.1: device 0 with a zero UUID, for a
 * profiler that asks which GPU a communicator uses where there is none. */
#include <string.h>
int cuGetErrorString(int e, const char** s) { *s = e ? "error (oxccl's host-only stand-in driver)" : "no error"; return 0; }
int cuDeviceGet(int* d, int ordinal) { *d = ordinal; return 0; }
int cuDeviceGetUuid(char uuid[16], int d) { (void)d; memset(uuid, 0, 16); return 0; }
int cuCtxGetDevice(int* d) { *d = 0; return 0; }
C
  gcc -shared -fPIC -O1 -Wl,-soname,libcuda.so.1 -o "$out/hostdrv/libcuda.so.1" "$out/hostdrv/cuda_host.c"
  local cudalib=${CUDA_HOME:+$CUDA_HOME/lib64}
  [ -f "$inc/../lib/libcudart.so.12" ] && cudalib=$(cd "$inc/../lib" && pwd)
  local ex=$out/src/plugins/profiler/example
  # The example's Makefile includes NCCL's makefiles; its one compile line is this.
  g++ -O1 -fPIC -shared -I"$ex/nccl" -I"$inc" -o "$lib/libnccl-profiler-example.so" "$ex"/*.cc \
    -L"$cudalib" -lcudart -Wl,-rpath,'$ORIGIN'
  local in=$out/src/plugins/profiler/inspector
  printf 'extern "C" const char* get_git_version_info() { return "%s"; }\n' "$tag" >"$in/version.cc"
  local objs=()
  # 2.31 adds inspector_otel (OTLP over plain sockets): built where present.
  local otel=
  [ -f "$in/inspector_otel.cc" ] && otel=inspector_otel
  for f in inspector inspector_json inspector_prom inspector_plugin inspector_cudawrap inspector_ring \
           inspector_event_pool json version $otel; do
    g++ -std=c++17 -O2 -fPIC -I"$in" -I"$in/nccl" -I"$inc" -c "$in/$f.cc" -o "$in/$f.o"
    objs+=("$in/$f.o")
  done
  g++ -shared -o "$lib/libnccl-profiler-inspector.so" "${objs[@]}" -L"$cudalib" -lcudart -ldl -lpthread \
    -Wl,-rpath,'$ORIGIN'
  echo "## built $(cd "$lib" && ls *.so* | tr '\n' ' ')from $src ${tag}"
}

oxccl_bin() {
  local b=${OXCCL:-${CARGO_TARGET_DIR:-target}/release/oxccl}
  if [ -z "${OXCCL:-}" ] && command -v cargo >/dev/null; then
    cargo build --release -q -p oxccl-cli >&2
  fi
  [ -x "$b" ] || { echo "no oxccl binary at $b (set OXCCL)" >&2; exit 2; }
  # Absolute: the runs start in their own folders.
  echo "$(cd "$(dirname "$b")" && pwd)/$(basename "$b")"
}

# One plugin, one rank count: every collective, then a send/recv group.
perf_runs() {
  local name=$1 n=$2 dir=$3; shift 3
  local dev=()
  [ "$device" = cuda ] && dev=(--device cuda)
  mkdir -p "$dir"
  (cd "$dir" && timeout 300 env "$@" "$bin" perf --ranks "$n" "${dev[@]}" --op all -b 64K -e 256K -f 4 \
      -n "$iters" -w 1 >"$dir/perf_all.txt" 2>&1) || echo "!! $name $n ranks --op all: exit $?"
  (cd "$dir" && timeout 300 env "$@" "$bin" perf --ranks "$n" "${dev[@]}" --op sendrecv -b 64K -e 64K \
      -n "$iters" -w 1 >"$dir/perf_sendrecv.txt" 2>&1) || echo "!! $name $n ranks sendrecv: exit $?"
  grep -hE '^#? *Out of bounds|#wrong|^ +[0-9]+ ' "$dir"/perf_*.txt | tail -4 || true
}

run() {
  bin=$(oxccl_bin)
  local libpath=$lib
  if [ "$device" = cuda ]; then
    local rt=${CUDART_DIR:-$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/cuda_runtime/lib 2>/dev/null | head -1 || true)}
    [ -n "$rt" ] && libpath=$rt:$lib
  fi
  # Every event kind (4095), pools large enough to keep a whole run (the
  # example's collective event is 23 MB, its p2p event 0.7 MB: calloc'd,
  # mostly never touched).
  local pools=()
  for p in GROUP_API COLL_API P2P_API KERNEL_LAUNCH; do
    pools+=("NCCL_PROFILE_${p}_POOL_SIZE=2048")
  done
  pools+=(NCCL_PROFILE_COLL_POOL_SIZE=256 NCCL_PROFILE_P2P_POOL_SIZE=256)
  for n in $ranks; do
    local d=$out/example-$n
    rm -rf "$d"
    echo "## example profiler, $n ranks ($device)"
    perf_runs example "$n" "$d" LD_LIBRARY_PATH="$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
      NCCL_PROFILER_PLUGIN="$lib/libnccl-profiler-example.so" NCCL_PROFILE_EVENT_MASK=4095 \
      NCCL_PROFILE_DUMP_FILE="$d/trace" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT "${pools[@]}"
    local d=$out/inspector-$n
    rm -rf "$d"
    local ipath=$libpath host_drv=()
    if [ "$device" = host ] && [ "${HOST_DRIVER:-1}" = 1 ] && ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
      ipath=$out/hostdrv:$libpath
      host_drv=(NCCL_INSPECTOR_REQUIRE_KERNEL_TIMING=0)
      echo "## Inspector, $n ranks ($device, stand-in CUDA driver: no libcuda.so.1 here)"
    else
      echo "## Inspector, $n ranks ($device)"
    fi
    perf_runs inspector "$n" "$d" LD_LIBRARY_PATH="$ipath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "${host_drv[@]}" \
      NCCL_PROFILER_PLUGIN="$lib/libnccl-profiler-inspector.so" NCCL_INSPECTOR_ENABLE=1 \
      NCCL_INSPECTOR_DUMP_DIR="$d/dump" NCCL_INSPECTOR_DUMP_VERBOSE=1 NCCL_INSPECTOR_DUMP_MIN_SIZE_BYTES=0 \
      NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS=${INSPECTOR_INTERVAL_US:-500} \
      NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=ALL
  done
  summary | tee "$out/summary.txt"
}

# Counts per event kind and parent links, from the example's traces (its
# b/e pairs nest as it prints children inside their parents) and the
# Inspector's JSON records.
summary() {
  python3 - "$out" <<'PY'
import collections, glob, json, os, re, sys
sys.path.insert(0, "tools")
from profiler_compare import tally_file
out = sys.argv[1]
for d in sorted(glob.glob(os.path.join(out, "example-*"))):
    files = sorted(glob.glob(os.path.join(d, "trace_*.json")))
    print(f"## example profiler {os.path.basename(d)}: {len(files)} trace files")
    for f in files:
        counts, links = tally_file(f)
        links = {f"{p}>{k}": v for (p, k), v in links.items()}
        name = os.path.basename(f)
        print(f"{name}: " + " ".join(f"{k}={v}" for k, v in sorted(counts.items())))
        print(f"{name} parents: " + " ".join(f"{k}={v}" for k, v in sorted(links.items())))
for d in sorted(glob.glob(os.path.join(out, "inspector-*"))):
    recs = collections.Counter()
    for f in glob.glob(os.path.join(d, "dump", "**", "*"), recursive=True):
        if not os.path.isfile(f):
            continue
        dec = json.JSONDecoder(); text = open(f).read(); i = 0
        while i < len(text):
            while i < len(text) and text[i].isspace():
                i += 1
            if i >= len(text):
                break
            obj, i = dec.raw_decode(text, i)
            for k in ("coll_perf", "p2p_perf"):
                if k in obj:
                    recs[(obj["header"]["rank"], k, obj[k].get("coll") or obj[k].get("p2p_operation") or "?")] += 1
    logs = " ".join(open(p).read() for p in glob.glob(os.path.join(d, "perf_*.txt")))
    why = sorted(set(re.findall(r"Inspector[^\n]*(?:Failed|DISABLED|disabled)[^\n]*", logs)))
    why = [re.sub(r"^.*? plugin ", "", w) for w in why]
    print(f"## Inspector {os.path.basename(d)}: {sum(recs.values())} records")
    for (rank, k, op), v in sorted(recs.items()):
        print(f"rank {rank} {k} {op}={v}")
    for w in why[:3]:
        print(f"note: {w.strip()}")
PY
}

case $mode in
  build) build ;;
  run) run ;;
  summary) summary ;;
  all) build; run ;;
  *) echo "usage: $0 [build|run|summary|all] [OUTDIR]"; exit 2 ;;
esac
