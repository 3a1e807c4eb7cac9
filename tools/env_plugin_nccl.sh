#!/usr/bin/env bash
# oxccl's env plugin (liboxccl_env.so) inside real NCCL (2.28.9 from the
# PyTorch environment, which loads ncclEnvPlugin_v1): ncclGetUniqueId and
# one all-reduce on one GPU (tools/nccl_env_demo.c), first without the
# plugin, then with it serving oxccl.toml, both with NCCL_DEBUG=INFO; shows
# the INFO lines that change and checks them (NCCL reads NCCL_DEBUG itself
# with getenv before loading the plugin, so that one stays in the
# environment).
#   tools/env_plugin_nccl.sh [OUTDIR]     (GPU machine)
# NCCL_LIB / CUDART_LIB override the libraries found in the PyTorch venv;
# CUDART_LIB=none (or no CUDA runtime found) runs ncclGetUniqueId alone,
# which needs no GPU: NCCL_LIB=.../libnccl.so.2 CUDART_LIB=none works on
# any machine (a pip wheel of NCCL 2.28.9 has the library).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp}/env-plugin-nccl}
mkdir -p "$out"
venv=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia 2>/dev/null | head -1 || true)
nccl=${NCCL_LIB:-$(ls "$venv"/nccl/lib/libnccl.so.2 2>/dev/null | head -1 || true)}
cudart=${CUDART_LIB:-$(ls "$venv"/cuda_runtime/lib/libcudart.so.* "$venv"/cu*/lib/libcudart.so.* 2>/dev/null | head -1 || true)}
[ -n "$nccl" ] || { echo "no libnccl.so.2 under ${venv:-/opt/torch/.venv}: set NCCL_LIB"; exit 2; }
[ "$cudart" = none ] && cudart=
gpu=${cudart:+yes}
target=${CARGO_TARGET_DIR:-target}
plugin=$target/release/liboxccl_env.so
if command -v cargo >/dev/null; then cargo build --release -q -p oxccl-env; fi
[ -f "$plugin" ] || { echo "no $plugin: cargo build --release -p oxccl-env"; exit 2; }
cc -O1 -o "$out/nccl_env_demo" tools/nccl_env_demo.c -ldl
cat >"$out/oxccl.toml" <<'TOML'
# What the cluster ships: read by oxccl, and by NCCL through liboxccl_env.so.
[env]
NCCL_SOCKET_IFNAME = "lo"
NCCL_MAX_NCHANNELS = 2
NCCL_PROTO = "Simple"
TOML
echo "## NCCL: $nccl"
echo "## plugin: $(readlink -f "$plugin")"
echo "## ${gpu:+ncclGetUniqueId and an all-reduce on GPU 0 (CUDA runtime $cudart)}${gpu:-ncclGetUniqueId only (no CUDA runtime)}"
run() { timeout 120 env NCCL_DEBUG=INFO "$@" "$out/nccl_env_demo" "$nccl" $cudart; }
rc=0
run >"$out/without.log" 2>&1 || rc=$?
echo "## without the plugin (rc $rc)"
pick='env plugin|ENV/Plugin|oxccl-env|set by environment|Bootstrap: Using|NCCL_SOCKET_IFNAME|Channel 0[0-9]/|#wrong|NCCL version|ncclGetUniqueId'
grep -E "$pick" "$out/without.log" | sed -E 's/^[^ ]+:[0-9]+:[0-9]+ //' | awk '!seen[$0]++' || true
rc=0
run NCCL_ENV_PLUGIN="$(readlink -f "$plugin")" OXCCL_CONFIG="$out/oxccl.toml" >"$out/with.log" 2>&1 || rc=$?
echo "## with NCCL_ENV_PLUGIN=liboxccl_env.so, OXCCL_CONFIG=oxccl.toml (rc $rc)"
grep -E "$pick" "$out/with.log" | sed -E 's/^[^ ]+:[0-9]+:[0-9]+ //' | awk '!seen[$0]++' || true
echo "## checks"
check() { if grep -qE "$2" "$out/$1"; then echo "ok:   $1 has /$2/"; else echo "FAIL: $1 lacks /$2/"; rc=1; fi; }
check with.log 'Successfully loaded external env plugin|ENV/Plugin: Using oxccl-env'
check with.log 'NCCL_SOCKET_IFNAME set by environment to lo'
check with.log 'Bootstrap: Using lo:'
check with.log 'ENV/Plugin: Closing env plugin oxccl-env'
if [ -n "$gpu" ]; then
  check with.log 'NCCL_MAX_NCHANNELS set by environment to 2'
  # A one-rank communicator never chooses a protocol, so NCCL_PROTO is
  # served but not logged; the channel count shows the plugin's value used.
  check with.log 'Channel 01/02 :'
  check with.log '#wrong 0'
  check without.log '#wrong 0'
fi
if grep -q 'NCCL_SOCKET_IFNAME set by environment' "$out/without.log"; then echo "FAIL: without.log already had NCCL_SOCKET_IFNAME set"; rc=1; fi
echo "## logs: $out/without.log $out/with.log"
exit "$rc"
