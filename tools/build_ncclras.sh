#!/usr/bin/env bash
# NCCL's RAS client, `ncclras`, built from NCCL's source (not copied into
# this repository) with the host C++ compiler alone: it is one file,
# src/ras/client.cc, which needs none of NCCL's library, only headers
# (nccl.h made from nccl.h.in, os.h, ras_internal.h's client part). nccl.h
# includes CUDA's headers for cudaStream_t and the half types; where no
# CUDA is installed, empty stand-ins are written beside the build (the
# client uses none of it).
#
#   tools/build_ncclras.sh [OUTDIR]       build OUTDIR/ncclras (default /tmp/ncclras)
#
# Then: OXCCL_NCCLRAS=OUTDIR/ncclras cargo test --release -p oxccl-tests --test ras
# checks that NCCL's own client prints the same names as `oxccl ras`.
#
# Source: NCCL_SRC, a git dir of NVIDIA/nccl (default
# /work/.mirror/NVIDIA+nccl/repo) or a source tree; NCCL_REF, the ref of a
# git dir (default dev, NCCL 2.31.0). Needs g++ (C++17) and git.
set -euo pipefail

OUT=${1:-/tmp/ncclras}
SRC=${NCCL_SRC:-/work/.mirror/NVIDIA+nccl/repo}
REF=${NCCL_REF:-dev}
CXX=${CXX:-g++}

mkdir -p "$OUT"
tree="$OUT/src-tree"
rm -rf "$tree" && mkdir -p "$tree"
if [ -d "$SRC/src/ras" ]; then
    cp -r "$SRC/src" "$SRC/makefiles" "$tree/"
else
    git --git-dir="$SRC" archive "$REF" src/include src/ras/client.cc \
        src/ras/ras_internal.h src/nccl.h.in makefiles/version.mk | tar -x -C "$tree"
fi

ver() { sed -n "s/^$1 *:= *//p" "$tree/makefiles/version.mk"; }
major=$(ver NCCL_MAJOR) minor=$(ver NCCL_MINOR) patch=$(ver NCCL_PATCH) suffix=$(ver NCCL_SUFFIX)
code=$((major * 10000 + minor * 100 + patch))
mkdir -p "$OUT/gen" "$OUT/stub"
sed -e "s/\${nccl:Major}/$major/g" -e "s/\${nccl:Minor}/$minor/g" \
    -e "s/\${nccl:Patch}/$patch/g" -e "s/\${nccl:Suffix}/$suffix/g" \
    -e "s/\${nccl:Version}/$code/g" "$tree/src/nccl.h.in" > "$OUT/gen/nccl.h"

# CUDA's headers where there are some, else stand-ins for what nccl.h names.
cuda_inc=()
if [ -f "${CUDA_HOME:-/usr/local/cuda}/include/cuda_runtime.h" ]; then
    cuda_inc=(-I"${CUDA_HOME:-/usr/local/cuda}/include")
else
    for h in cuda_fp16.h cuda_bf16.h cuda_fp8.h; do : > "$OUT/stub/$h"; done
    echo 'typedef struct CUstream_st* cudaStream_t; typedef int cudaError_t;' > "$OUT/stub/cuda_runtime.h"
    cuda_inc=(-I"$OUT/stub")
fi

"$CXX" -O2 -std=c++17 -DNCCL_OS_LINUX -I"$OUT/gen" "${cuda_inc[@]}" \
    -I"$tree/src/include" -I"$tree/src/ras" "$tree/src/ras/client.cc" -o "$OUT/ncclras"
"$OUT/ncclras" --version
echo "built $OUT/ncclras"
