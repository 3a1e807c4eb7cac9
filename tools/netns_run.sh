#!/usr/bin/env bash
# Runs one command as two ranks on two "hosts": two network namespaces
# joined by a veth pair, each rank with its own address and NCCL_HOSTID,
# so a communicator sees two nodes and takes the network path
# (NCCL_SOCKET_IFNAME = the veth). Needs root and iproute2 (tc for RATE).
#
#   tools/netns_run.sh COMMAND [ARGS...]
#
# Each rank gets RANK, WORLD_SIZE=2, NCCL_COMM_ID (oxccl), MASTER_ADDR and
# MASTER_PORT (torch.distributed), NCCL_HOSTID and NCCL_SOCKET_IFNAME.
# RATE=1gbit shapes both directions of the link (tc tbf); otherwise
# DELAY=1ms and/or LOSS=1% add tc netem; where the kernel has no netem,
# LOSS (alone) drops that share of incoming packets with nftables.
# Rank 0's output goes to stdout, rank 1's to $LOG1 (default /dev/null).
# The namespaces and the link are removed on exit, whatever happens.
# Bounded by LIMIT seconds (600).
set -euo pipefail
tag=oxp$$
ns=("${tag}a" "${tag}b")
veth=("${tag}va" "${tag}vb")
net=$((1 + $$ % 200))
addr=("10.234.$net.1" "10.234.$net.2")
cleanup() {
  ip link del "${veth[0]}" 2>/dev/null || true
  for n in "${ns[@]}"; do ip netns del "$n" 2>/dev/null || true; done
}
trap cleanup EXIT
for n in "${ns[@]}"; do ip netns add "$n"; done
ip link add "${veth[0]}" type veth peer name "${veth[1]}"
for i in 0 1; do
  ip link set "${veth[$i]}" netns "${ns[$i]}"
  ip -n "${ns[$i]}" addr add "${addr[$i]}/24" dev "${veth[$i]}"
  ip -n "${ns[$i]}" link set "${veth[$i]}" up
  ip -n "${ns[$i]}" link set lo up
  if [ -n "${RATE:-}" ]; then
    ip netns exec "${ns[$i]}" tc qdisc add dev "${veth[$i]}" root tbf rate "$RATE" burst 1mb latency 50ms
  elif [ -n "${DELAY:-}${LOSS:-}" ]; then
    if ! ip netns exec "${ns[$i]}" tc qdisc add dev "${veth[$i]}" root netem \
      ${DELAY:+delay "$DELAY"} ${LOSS:+loss "$LOSS"} 2>/dev/null; then
      [ -z "${DELAY:-}" ] || { echo "no netem in this kernel: DELAY cannot be applied" >&2; exit 1; }
      printf 'table inet oxloss {\n chain in {\n  type filter hook input priority 0;\n  numgen random mod 100 < %s counter drop\n }\n}\n' \
        "${LOSS%\%}" | ip netns exec "${ns[$i]}" nft -f -
    fi
  fi
done
port=$((20000 + $$ % 20000))
run() {
  local r=$1
  shift
  ip netns exec "${ns[$r]}" env RANK="$r" LOCAL_RANK=0 WORLD_SIZE=2 \
    NCCL_COMM_ID="${addr[0]}:$port" MASTER_ADDR="${addr[0]}" MASTER_PORT="$((port + 1))" \
    NCCL_HOSTID="netns-host-$r" NCCL_SOCKET_IFNAME="${veth[$r]}" \
    timeout "${LIMIT:-600}" "$@"
}
run 1 "$@" >"${LOG1:-/dev/null}" 2>&1 &
b=$!
rc=0
run 0 "$@" || rc=$?
wait "$b" || rc=$((rc ? rc : $?))
exit "$rc"
