#!/usr/bin/env bash
# AWS's NCCL net plugin over libfabric (github.com/aws/aws-ofi-nccl,
# Apache-2.0; exports ncclNetPlugin_v6..v12) built from its source with its
# own autotools build, then run under oxccl on host memory with libfabric's
# tcp provider, beside oxccl's own socket net.
#
#   tools/aws_ofi_nccl.sh build [OUTDIR]   build OUTDIR/lib/libnccl-net-ofi.so (+ what it
#                                          needs at run time, see below)
#   tools/aws_ofi_nccl.sh perf  [OUTDIR]   build, then oxccl perf --op all with 2 and 3
#                                          ranks through each plugin, and 2 ranks in two
#                                          network namespaces (root, iproute2); prints
#                                          every table, checks #wrong 0 and the INFO lines
#
# Source (not copied into this repository; extracted into OUTDIR/src at
# build time): OFI_SRC, a git dir or a source tree of aws/aws-ofi-nccl
# (default /work/.mirror/aws+aws-ofi-nccl/repo); OFI_REF, the tag of a git
# dir (v1.21.1).
# Needs: g++ with C++20, autoconf, automake, libtool, make, libfabric's and
# hwloc's headers (Debian: apt-get install libfabric-dev libhwloc-dev
# autoconf automake libtool), and CUDA headers. configure insists on CUDA
# (or ROCm/Neuron) even for host memory:
#   - CUDA_HOME with include/cuda.h, cudaTypedefs.h and cuda_runtime_api.h
#     serves where there is one; else the headers of NVIDIA's
#     nvidia-cuda-runtime-cu12 wheel (12.9.79, PyPI) are used: CUDA_WHEEL
#     (a .whl), else one found in CUDA_WHEEL_DIR (default OUTDIR/wheel), else
#     `pip download`ed there. That wheel lacks nvcc's crt/host_defines.h,
#     which cuda_runtime_api.h includes: a stand-in with the host-compiler
#     macros (no device code) is written beside it.
#   - The plugin is configured with --enable-cudart-dynamic: at init it
#     dlopens "libcudart.so" and takes every driver function through
#     cudaGetDriverEntryPoint. A stand-in runtime (OUTDIR/lib/libcudart.so,
#     built here from C) answers those through the driver's cuGetProcAddress
#     where libcuda.so.1 is installed, and without a driver reports driver
#     version 0 and "no device" (100) for everything else: enough for host
#     memory, which is all a machine without a GPU has.
# OUTDIR/lib also gets a copy of the libhwloc.so.15 it was linked with, for
# machines that lack one; put OUTDIR/lib on LD_LIBRARY_PATH.
# The .so needs libfabric.so.1 (any 1.x from 1.17 on), glibc 2.34 and the
# libstdc++ of GCC 12 or later: built on Debian 12, it loads on Ubuntu 24.04.
# A build is reused while OUTDIR/stamp names the same source (REBUILD=1 forces).
#
# perf: OXCCL (oxccl binary; default: cargo build --release -p oxccl-cli),
#   SIZES ("-b 8 -e 16M -f 8"), RANKS ("2 3"), NETNS (1: also the namespace
#   run), LIMIT (seconds per run, 300).
# libfabric settings used: FI_PROVIDER=tcp; on one host FI_TCP_IFACE=lo with
# OFI_NCCL_EXCLUDE_TCP_IF=docker0 (the plugin excludes lo by default), in
# the namespaces the veth (the plugin's default exclusion of lo picks it).
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/plugin_bench.sh
mode=${1:-build}
out=$(mkdir -p "${2:-${OUT:-/tmp}/aws-ofi-nccl}" && cd "${2:-${OUT:-/tmp}/aws-ofi-nccl}" && pwd)
ofi_src=${OFI_SRC:-/work/.mirror/aws+aws-ofi-nccl/repo}
ofi_ref=${OFI_REF:-v1.21.1}
lib=$out/lib
so=$lib/libnccl-net-ofi.so

need() {
  local missing=()
  command -v g++ >/dev/null || missing+=(g++)
  command -v make >/dev/null || missing+=(make)
  for t in autoreconf aclocal automake libtoolize; do command -v $t >/dev/null || missing+=("$t"); done
  [ -e /usr/include/rdma/fabric.h ] || [ -n "${LIBFABRIC_HOME:-}" ] || missing+=("rdma/fabric.h (libfabric-dev)")
  [ -e /usr/include/hwloc.h ] || missing+=("hwloc.h (libhwloc-dev)")
  if [ ${#missing[@]} -gt 0 ]; then
    echo "aws_ofi_nccl.sh: missing ${missing[*]}; on Debian: apt-get install g++ make autoconf automake libtool libfabric-dev libhwloc-dev" >&2
    exit 3
  fi
}

source_id() {
  if git -C "$ofi_src" rev-parse -q --verify "$ofi_ref^{commit}" >/dev/null 2>&1; then
    echo "$ofi_ref $(git -C "$ofi_src" rev-parse "$ofi_ref^{commit}")"
  else
    echo "tree $ofi_src"
  fi
}

# The CUDA headers configure and the sources include; prints the --with-cuda dir.
cuda_root() {
  local root=$out/cuda
  if [ -n "${CUDA_HOME:-}" ] && [ -f "$CUDA_HOME/include/cudaTypedefs.h" ]; then
    mkdir -p "$root/lib64"
    ln -sfn "$CUDA_HOME/include" "$root/include"
    echo "$root"
    return
  fi
  local whl=${CUDA_WHEEL:-}
  local dir=${CUDA_WHEEL_DIR:-$out/wheel}
  if [ -z "$whl" ]; then
    whl=$(ls "$dir"/nvidia_cuda_runtime_cu12-*.whl 2>/dev/null | head -1 || true)
  fi
  if [ -z "$whl" ]; then
    mkdir -p "$dir"
    echo "aws_ofi_nccl.sh: no CUDA_HOME; fetching the CUDA runtime wheel's headers with pip" >&2
    python3 -m pip download -q --no-deps -d "$dir" nvidia-cuda-runtime-cu12==12.9.79 >&2 || {
      echo "aws_ofi_nccl.sh: no CUDA headers: set CUDA_HOME, CUDA_WHEEL (nvidia_cuda_runtime_cu12 .whl) or allow pip to reach PyPI" >&2
      exit 3
    }
    whl=$(ls "$dir"/nvidia_cuda_runtime_cu12-*.whl | head -1)
  fi
  rm -rf "$root" && mkdir -p "$root/lib64" "$out/wheel-x"
  python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$whl" "$out/wheel-x"
  cp -r "$out/wheel-x/nvidia/cuda_runtime/include" "$root/include"
  rm -rf "$out/wheel-x"
  if [ ! -f "$root/include/crt/host_defines.h" ]; then
    mkdir -p "$root/include/crt"
    # nvcc's header, for a host compiler: CUDA's qualifiers expand to nothing.
    cat >"$root/include/crt/host_defines.h" <<'H'
#pragma once
#define __host__
#define __device__
#define __global__
#define __shared__
#define __constant__
#define __managed__
#define __launch_bounds__(...)
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __align__(n) __attribute__((aligned(n)))
#define __builtin_align__(a) __align__(a)
#define __thread__ __thread
#define __import__
#define __export__
#define __cdecl
#define __annotate__(a) __attribute__((a))
#define __location__(a) __annotate__(a)
#define CUDARTAPI
#define CUDARTAPI_CDECL
#define __specialization_static
#define __device_builtin__
#define __device_builtin_texture_type__
#define __device_builtin_surface_type__
#define __cudart_builtin__
#define __CUDA_DEPRECATED
#define __dv(v) = v
H
  fi
  echo "$root"
}

# The runtime the plugin dlopens as libcudart.so (see the header).
standin_cudart() {
  local c=$out/cudart_standin.c
  cat >"$c" <<'C'
#include <dlfcn.h>
#include <stddef.h>
#include <string.h>
typedef int (*get_proc_v2)(const char *, void **, int, unsigned long long, int *);
typedef int (*get_proc_v1)(const char *, void **, int, unsigned long long);
/* CUDA_ERROR_NO_DEVICE, for every entry point of a machine without a driver. */
static int no_device(void) { return 100; }
/* As the driver API answers where no driver is installed: version 0. */
static int no_driver_version(int *v) { *v = 0; return 0; }
int cudaRuntimeGetVersion(int *v) { *v = 12090; return 0; }
static int resolve(const char *sym, void **fn, int version, unsigned long long flags, int *status) {
  static void *cu;
  static int looked;
  if (!looked) {
    looked = 1;
    cu = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    /* The real runtime initialises the driver before handing out entry points. */
    int (*init)(unsigned) = cu ? (int (*)(unsigned))dlsym(cu, "cuInit") : NULL;
    if (init) init(0);
  }
  if (status) *status = 0;
  if (cu) {
    get_proc_v2 p2 = (get_proc_v2)dlsym(cu, "cuGetProcAddress_v2");
    if (p2) return p2(sym, fn, version, flags, status) == 0 ? 0 : 500;
    get_proc_v1 p1 = (get_proc_v1)dlsym(cu, "cuGetProcAddress");
    if (p1) return p1(sym, fn, version, flags) == 0 ? 0 : 500;
  }
  *fn = strcmp(sym, "cuDriverGetVersion") == 0 ? (void *)no_driver_version : (void *)no_device;
  return 0;
}
int cudaGetDriverEntryPoint(const char *sym, void **fn, unsigned long long flags, int *status) {
  return resolve(sym, fn, 12090, flags, status);
}
int cudaGetDriverEntryPointByVersion(const char *sym, void **fn, unsigned int version,
                                     unsigned long long flags, int *status) {
  return resolve(sym, fn, (int)version, flags, status);
}
C
  mkdir -p "$lib"
  gcc -shared -fPIC -O2 -Wall -o "$lib/libcudart.so" "$c" -ldl
}

build() {
  need
  local id
  id=$(source_id)
  if [ "${REBUILD:-0}" != 1 ] && [ -f "$so" ] && [ "$(cat "$out/stamp" 2>/dev/null)" = "$id" ]; then
    echo "reusing $so ($id)"
    return
  fi
  local src=$out/src
  rm -rf "$src" "$out/build" "$out/stamp" && mkdir -p "$src" "$out/build" "$lib"
  if git -C "$ofi_src" rev-parse -q --verify "$ofi_ref^{commit}" >/dev/null 2>&1; then
    git -C "$ofi_src" archive "$ofi_ref" | tar -xf - -C "$src"
    # configure takes its version from git or this file; the archive has no git.
    echo "${ofi_ref#v}" >"$src/.release_version"
  elif [ -f "$ofi_src/configure.ac" ]; then
    (cd "$ofi_src" && tar -cf - --exclude=.git .) | tar -xf - -C "$src"
  else
    echo "aws_ofi_nccl.sh: $ofi_src is neither a git dir with $ofi_ref nor a source tree" >&2
    exit 2
  fi
  local cuda
  cuda=$(cuda_root)
  standin_cudart
  # configure links a test program against -lcudart: the stand-in serves.
  cp "$lib/libcudart.so" "$cuda/lib64/libcudart.so"
  (cd "$src" && autoreconf -if) >"$out/autogen.log" 2>&1 || {
    tail -20 "$out/autogen.log"
    exit 1
  }
  (cd "$out/build" && "$src/configure" --with-cuda="$cuda" --enable-cudart-dynamic \
    --disable-tests --disable-platform-aws ${LIBFABRIC_HOME:+--with-libfabric="$LIBFABRIC_HOME"}) \
    >"$out/configure.log" 2>&1 || {
    tail -30 "$out/configure.log"
    exit 1
  }
  nice make -C "$out/build" -j"$(nproc)" >"$out/make.log" 2>&1 || {
    grep -E 'error' "$out/make.log" | head -20
    exit 1
  }
  cp "$out/build/src/.libs/libnccl-net-ofi.so" "$so"
  local hw
  hw=$(ldconfig -p | awk '/libhwloc.so.15 .*x86-64/ {print $NF; exit}')
  [ -n "$hw" ] && cp -L "$hw" "$lib/libhwloc.so.15"
  echo "$id" >"$out/stamp"
  local syms
  syms=$(nm -D --defined-only "$so" | awk '/ncclNetPlugin_v/ {print $3}' | sort -V | tr '\n' ' ')
  echo "built $so exports $syms"
  echo "  needs: $(objdump -T "$so" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1), $(objdump -p "$so" | awk '/NEEDED/ {print $2}' | tr '\n' ' ')"
  echo "  from: aws-ofi-nccl $id; CUDA headers $(awk '/define CUDA_VERSION/ {print $3; exit}' "$cuda/include/cuda.h")"
}

perf() {
  build
  local bin=${OXCCL:-}
  if [ -z "$bin" ]; then
    cargo build --release -q -p oxccl-cli
    bin=${CARGO_TARGET_DIR:-target}/release/oxccl
  fi
  status=0
  local sizes=${SIZES:--b 8 -e 16M -f 8}
  echo "## oxccl: $bin; host: $(uname -n), $(nproc) cores; sizes $sizes"
  local plugin=(NCCL_NET_PLUGIN="$so" LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" FI_PROVIDER=tcp)
  # The plugin skips the loopback interface unless told.
  local on_lo=(FI_TCP_IFACE=lo OFI_NCCL_EXCLUDE_TCP_IF=docker0)
  against_socket ofi Libfabric "${RANKS:-2 3}"
  local n
  for n in ${RANKS:-2 3}; do
    want "$out/perf_ofi_$n.log" 'loaded net plugin Libfabric from .*ncclNetPlugin_v12'
    want "$out/perf_ofi_$n.log" 'NET/OFI Initializing aws-ofi-nccl'
  done
  echo "## logs in $out; $([ $status = 0 ] && echo 'all passed' || echo 'FAILED')"
  return $status
}

case $mode in
build) build ;;
perf) perf ;;
*)
  echo "usage: tools/aws_ofi_nccl.sh build|perf [OUTDIR]" >&2
  exit 2
  ;;
esac
