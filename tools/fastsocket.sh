#!/usr/bin/env bash
# Google's NCCL net plugin "Fast Socket" (github.com/google/nccl-fastsocket,
# Apache-2.0; exports ncclNetPlugin_v2..v6) built by hand with g++ (no
# bazel), then run under oxccl on host memory beside oxccl's own socket net.
#
#   tools/fastsocket.sh build [OUTDIR]   build OUTDIR/libnccl-net-fastsocket.so
#   tools/fastsocket.sh perf  [OUTDIR]   build, then oxccl perf with 2, 3 and 4 ranks
#                                        (--op all) through each plugin, and 2 ranks in
#                                        two network namespaces (root, iproute2); prints
#                                        every table, checks #wrong 0 and the INFO lines
#
# Sources (neither is copied into this repository; both are extracted into
# OUTDIR/src at build time):
#   FASTSOCKET_SRC  a git dir or a source tree of google/nccl-fastsocket
#                   (default /work/.mirror/google+nccl-fastsocket/repo); FASTSOCKET_REF
#                   the commit of a git dir (HEAD)
#   NCCL_SRC        a git dir or a source tree of NVIDIA/nccl (default
#                   /work/.mirror/NVIDIA+nccl/repo); NCCL_REF the tag of a git dir
#                   (v2.13.4-1, the version fastsocket's WORKSPACE pins). Only two
#                   files are used: src/nccl.h.in and src/include/nccl_net.h.
# What the build does beyond fastsocket's own BUILD:
#   - nccl.h is generated from nccl.h.in as NCCL's build does (sed of the
#     version); it includes <cuda_runtime.h> and <cuda_fp16.h> only for the type
#     cudaStream_t, so two stub headers stand in for CUDA, which the plugin does
#     not use (ptrSupport is NCCL_PTR_HOST): one declares the type and includes
#     the C headers (stddef, stdlib, string) fastsocket relies on CUDA's to bring.
#   - NCCL's debug.cc and misc/utils.cc (bazel's @nccl//:plugin_lib) are not
#     needed: fastsocket's utilities.h defines its own NCCL_PARAM and logging
#     through the logger NCCL passes to init; the link uses -Wl,--no-undefined,
#     so a missing symbol would fail here.
#   - libstdc++ and libgcc are linked statically, so the library needs only
#     glibc (2.34 or later): built on Debian 12, it loads on Ubuntu 24.04.
# perf: OXCCL (oxccl binary; default: cargo build --release -p oxccl-cli),
#   SIZES ("-b 8 -e 16M -f 8"), RANKS ("2 3 4"), NETNS (1: also the namespace
#   run), LIMIT (seconds per run, 300).
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/plugin_bench.sh
mode=${1:-build}
out=$(mkdir -p "${2:-${OUT:-/tmp}/fastsocket}" && cd "${2:-${OUT:-/tmp}/fastsocket}" && pwd)
fs_src=${FASTSOCKET_SRC:-/work/.mirror/google+nccl-fastsocket/repo}
nccl_src=${NCCL_SRC:-/work/.mirror/NVIDIA+nccl/repo}
nccl_ref=${NCCL_REF:-v2.13.4-1}

# Extracts PATHS of SRC (a git dir at REF, or a source tree) into DEST.
extract() {
  local src=$1 ref=$2 dest=$3
  shift 3
  mkdir -p "$dest"
  if git -C "$src" rev-parse -q --verify "$ref^{commit}" >/dev/null 2>&1; then
    git -C "$src" archive "$ref" -- "$@" | tar -xf - -C "$dest"
  elif [ -e "$src/$1" ]; then
    (cd "$src" && tar -cf - "$@") | tar -xf - -C "$dest"
  else
    echo "fastsocket.sh: $src is neither a git dir with $ref nor a source tree with $1" >&2
    exit 2
  fi
}

build() {
  local src=$out/src
  rm -rf "$src"
  extract "$fs_src" "${FASTSOCKET_REF:-HEAD}" "$src/fastsocket" \
    net_fastsocket.cc utilities.cc utilities.h compat.h LICENSE
  extract "$nccl_src" "$nccl_ref" "$src/nccl" src/nccl.h.in src/include/nccl_net.h
  local inc=$src/include
  mkdir -p "$inc"
  # The version nccl.h states, from makefiles/version.mk as NCCL's build takes it.
  extract "$nccl_src" "$nccl_ref" "$src/nccl" makefiles/version.mk
  local major minor patch
  major=$(awk -F' *:= *' '$1 == "NCCL_MAJOR" {print $2}' "$src/nccl/makefiles/version.mk")
  minor=$(awk -F' *:= *' '$1 == "NCCL_MINOR" {print $2}' "$src/nccl/makefiles/version.mk")
  patch=$(awk -F' *:= *' '$1 == "NCCL_PATCH" {print $2}' "$src/nccl/makefiles/version.mk")
  if [ "$major.$minor" != 2.13 ]; then
    echo "fastsocket.sh: NCCL $major.$minor.$patch headers; fastsocket is written against 2.13 (NCCL_REF=v2.13.4-1)" >&2
  fi
  sed -e "s/\${nccl:Major}/$major/g" -e "s/\${nccl:Minor}/$minor/g" -e "s/\${nccl:Patch}/$patch/g" \
    -e "s/\${nccl:Suffix}//g" -e "s/\${nccl:Version}/$((major * 10000 + minor * 100 + patch))/g" \
    "$src/nccl/src/nccl.h.in" >"$inc/nccl.h"
  cp "$src/nccl/src/include/nccl_net.h" "$inc/"
  # Stand-ins for the CUDA headers nccl.h includes: it names cudaStream_t, nothing
  # else; fastsocket's headers also lean on the C headers the real one brings in.
  printf '#pragma once\n#include <stddef.h>\n#include <stdlib.h>\n#include <string.h>\n%s\n%s\n' \
    'typedef struct CUstream_st* cudaStream_t;' '#define CUDART_VERSION 10000' >"$inc/cuda_runtime.h"
  printf '#pragma once\n' >"$inc/cuda_fp16.h"
  g++ -std=c++17 -O2 -fPIC -shared -w -I"$inc" -I"$src/fastsocket" \
    "$src/fastsocket/net_fastsocket.cc" "$src/fastsocket/utilities.cc" \
    -o "$out/libnccl-net-fastsocket.so" -Wl,--no-undefined -static-libstdc++ -static-libgcc -lpthread
  local syms
  syms=$(nm -D --defined-only "$out/libnccl-net-fastsocket.so" | awk '/ncclNetPlugin_v/ {print $3}' | sort -V | tr '\n' ' ')
  echo "built $out/libnccl-net-fastsocket.so exports $syms"
  echo "  needs: $(objdump -T "$out/libnccl-net-fastsocket.so" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1), $(objdump -p "$out/libnccl-net-fastsocket.so" | awk '/NEEDED/ {print $2}' | tr '\n' ' ')"
  echo "  from: fastsocket $(git -C "$fs_src" rev-parse --short "${FASTSOCKET_REF:-HEAD}" 2>/dev/null || echo "$fs_src"), NCCL headers $major.$minor.$patch"
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
  local plugin=(NCCL_NET_PLUGIN="$out/libnccl-net-fastsocket.so") on_lo=()
  against_socket fastsocket FastSocket "${RANKS:-2 3 4}"
  local n
  for n in ${RANKS:-2 3 4}; do
    want "$out/perf_fastsocket_$n.log" 'loaded net plugin FastSocket from .*ncclNetPlugin_v6'
  done
  echo "## logs in $out; $([ $status = 0 ] && echo 'all passed' || echo 'FAILED')"
  return $status
}

case $mode in
build) build ;;
perf) perf ;;
*)
  echo "usage: tools/fastsocket.sh build|perf [OUTDIR]" >&2
  exit 2
  ;;
esac
