#!/usr/bin/env bash
# Encrypted against clear socket traffic on this machine, in one command
# (issue 18; docs/performance.md, "Encrypted traffic"): two ranks in two
# network namespaces joined by veth (tools/netns_run.sh; needs root and
# iproute2), all_reduce of SIZE on host memory over the socket network,
# clear and with NCCL_SOCKET_KEY_FILE, alternated ROUNDS times; beside it
# one raw TCP stream over the same kind of link, clear and encrypted, and
# the cipher's own speed on one core (ring; `openssl speed` where the
# openssl command exists).
#
#   tools/secure_perf.sh [ROUNDS (3)] [SIZE (64M)]
#
# Builds what it runs (cargo build --release) unless OXCCL names the oxccl
# binary and STREAM and SEAL_SPEED the examples. Settings in the
# environment (NCCL_SOCKET_NTHREADS, NCCL_NSOCKS_PERTHREAD, ...) reach
# both runs; THREADS="0x1 2x2 4x2" also runs each NTHREADSxNSOCKS setting
# in turn ("default" is the socket network's own choice, which differs:
# from 8 cores 2x2 in clear and 4x2 with a key). Prints a Markdown table
# for docs/performance.md.
#
# Without cargo (the GPU machine), carry release builds and name them:
#   OXCCL=.dev/bin/oxccl STREAM=.dev/bin/stream SEAL_SPEED=.dev/bin/seal_speed \
#     THREADS="default 2x2 4x2 8x1" tools/secure_perf.sh 3 64M
set -euo pipefail
rounds=${1:-3}
size=${2:-64M}
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
target=${CARGO_TARGET_DIR:-$root/target}
if [ -z "${OXCCL:-}" ] || [ -z "${STREAM:-}" ] || [ -z "${SEAL_SPEED:-}" ]; then
  (cd "$root" && cargo build --release -q -p oxccl-cli &&
    cargo build --release -q -p oxccl-secure --example stream --example seal_speed)
fi
oxccl=${OXCCL:-$target/release/oxccl}
stream=${STREAM:-$target/release/examples/stream}
seal=${SEAL_SPEED:-$target/release/examples/seal_speed}
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null; then
  echo "secure_perf: needs root and iproute2 (ip) for the network namespaces" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
key=$tmp/key
"$oxccl" keygen >"$key"
chmod 600 "$key"

echo "# $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(uname -r)"
echo "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "Cipher on one core:"
"$seal" 2048 | sed 's/^/  /'
if command -v openssl >/dev/null; then
  for c in aes-128-gcm aes-256-gcm; do
    openssl speed -evp $c -bytes 262144 -seconds 2 2>/dev/null | tail -1 |
      awk '{printf "  openssl %s %s, 256 KiB blocks: %.2f GB/s\n", "'"$(openssl version | cut -d' ' -f2)"'", "'$c'", $2 * 1000 / 1e9}'
  done
fi
echo
echo "One TCP stream between the namespaces (4 GiB):"
for i in 1 2; do
  echo "  $("$here/netns_run.sh" "$stream" 4096)"
  echo "  $("$here/netns_run.sh" "$stream" 4096 --key "$key")"
done
echo

# busbw out-of-place / in-place and #wrong of one run; "-" (and both
# ranks' last lines on stderr) if it failed.
perf_run() {
  env "$@" LOG1="$tmp/rank1.log" "$here/netns_perf.sh" "$oxccl" --op all_reduce -b "$size" -e "$size" \
    -n 20 -w 5 >"$tmp/rank0.log" 2>&1 || true
  if ! awk '/^ *[0-9]+ +[0-9]+ +float/ {printf "%s %s %s %s", $8, $12, $9, $13; found=1}
            END {exit !found}' "$tmp/rank0.log"; then
    printf -- "- - - -"
    { echo "secure_perf: a run failed ($*):"; tail -n 5 "$tmp/rank0.log" "$tmp/rank1.log"; } >&2
  fi
}

if [ "$(nproc)" -ge 8 ]; then
  echo "# default helper threads x sockets: clear 2x2, encrypted 4x2 (8 cores or more)"
else
  echo "# default helper threads x sockets: 0 (the caller's thread moves the data; under 8 cores)"
fi
settings=("${THREADS:-default}")
[ -n "${THREADS:-}" ] && read -r -a settings <<<"$THREADS"
echo "all_reduce $size, two ranks, busbw GB/s out-of-place / in-place (#wrong), rounds alternated:"
echo
echo "| setting | round | load | clear | encrypted | ratio |"
echo "|---|---|---|---|---|---|"
for s in "${settings[@]}"; do
  extra=()
  if [ "$s" != default ]; then
    extra=(NCCL_SOCKET_NTHREADS="${s%x*}" NCCL_NSOCKS_PERTHREAD="${s#*x}")
  fi
  sum_c=0
  sum_e=0
  for r in $(seq 1 "$rounds"); do
    load=$(cut -d' ' -f1 /proc/loadavg)
    read -r c1 c2 cw1 cw2 <<<"$(perf_run "${extra[@]}" NCCL_SOCKET_KEY_FILE=)"
    read -r e1 e2 ew1 ew2 <<<"$(perf_run "${extra[@]}" NCCL_SOCKET_KEY_FILE="$key")"
    ratio=$(awk -v a="$c1" -v b="$c2" -v c="$e1" -v d="$e2" \
      'BEGIN { if (a + b > 0 && c != "-") printf "%.2f", (c + d) / (a + b); else printf "-" }')
    echo "| $s | $r | $load | $c1 / $c2 ($cw1, $cw2) | $e1 / $e2 ($ew1, $ew2) | $ratio |"
    sum_c=$(awk -v s="$sum_c" -v a="$c1" -v b="$c2" 'BEGIN { printf "%f", s + a + b }')
    sum_e=$(awk -v s="$sum_e" -v a="$e1" -v b="$e2" 'BEGIN { printf "%f", s + a + b }')
  done
  awk -v c="$sum_c" -v e="$sum_e" -v s="$s" \
    'BEGIN { if (c > 0) printf "| %s | all | | | | **%.2f** |\n", s, e / c }'
done
echo
echo "# load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
