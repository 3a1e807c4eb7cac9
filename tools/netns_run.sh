#!/usr/bin/env bash
# Runs one command as the ranks of a job spread over "hosts": one network
# namespace per host, all joined by veth links to a bridge in a switch
# namespace, each host with its own address and NCCL_HOSTID, so that a
# communicator sees several nodes and takes the network path between them
# (NCCL_SOCKET_IFNAME = the host's veth). Needs root and iproute2 (tc for
# RATE, nftables for LOSS without netem).
#
#   tools/netns_run.sh COMMAND [ARGS...]
#
# HOSTS (default 2) namespaces, PER_HOST (default 1) ranks in each: rank
# h*PER_HOST+l is local rank l of host h. Each rank gets RANK, LOCAL_RANK,
# WORLD_SIZE, NCCL_COMM_ID (oxccl), MASTER_ADDR and MASTER_PORT
# (torch.distributed), NCCL_HOSTID and NCCL_SOCKET_IFNAME.
# GPUS=split gives each host its own GPUs: host h sees (CUDA_VISIBLE_DEVICES)
# GPUs h*PER_HOST .. h*PER_HOST+PER_HOST-1, modulo the machine's count, so
# 2 hosts x 2 ranks on a 4-GPU machine is two nodes of two GPUs each, and
# 2 hosts x 1 rank on 2 GPUs is two single-GPU nodes. Otherwise every host
# sees the caller's GPUs and ranks pick GPU LOCAL_RANK (so ranks of one-rank
# hosts share GPU 0).
# RATE=1gbit shapes each host's outgoing traffic (tc tbf); otherwise
# DELAY=1ms and/or LOSS=1% add tc netem; where the kernel has no netem,
# LOSS (alone) drops that share of incoming packets with nftables.
# Rank 0's output goes to stdout, rank 1's to $LOG1 (default /dev/null);
# LOGDIR=dir writes every other rank's output to dir/rankR.txt instead.
# The namespaces and links are removed on exit, whatever happens.
# Where namespaces cannot be made (no iproute2, a sandbox without them)
# the hosts share the loopback and are told apart by NCCL_HOSTID alone,
# said on stderr: the same transports, without a link to shape.
# Ranks start once every veth has its carrier (at most 5 s).
# Bounded by LIMIT seconds (600).
set -euo pipefail
hosts=${HOSTS:-2}
per=${PER_HOST:-1}
world=$((hosts * per))
tag=oxp$$
sw="${tag}s"
net=$((1 + $$ % 200))
ns=()
veth=()
addr=()
for ((h = 0; h < hosts; h++)); do
  ns+=("${tag}h$h")
  veth+=("${tag}v$h")
  addr+=("10.234.$net.$((h + 1))")
done
cleanup() {
  for n in "${ns[@]}" "$sw"; do ip netns del "$n" 2>/dev/null || true; done
}
trap cleanup EXIT
if ! command -v ip >/dev/null || ! ip netns add "$sw" 2>/dev/null; then
  [ -z "${RATE:-}${DELAY:-}${LOSS:-}" ] || { echo "no network namespaces here: RATE, DELAY and LOSS cannot be applied" >&2; exit 1; }
  echo "netns_run: no network namespaces here (no iproute2 or not allowed): $hosts hosts share the loopback, told apart by NCCL_HOSTID" >&2
  for ((h = 0; h < hosts; h++)); do ns[$h]=; veth[$h]=lo; addr[$h]=127.0.0.1; done
  sw=
fi
if [ -n "$sw" ]; then
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  for ((h = 0; h < hosts; h++)); do
    n=${ns[$h]}
    v=${veth[$h]}
    ip netns add "$n"
    # Created inside the host namespace so that names never meet the root
    # namespace's; the switch end moves to the bridge.
    ip -n "$n" link add "$v" type veth peer name "${tag}p$h"
    ip -n "$n" link set "${tag}p$h" netns "$sw"
    ip -n "$sw" link set "${tag}p$h" master br0
    ip -n "$sw" link set "${tag}p$h" up
    ip -n "$n" addr add "${addr[$h]}/24" dev "$v"
    ip -n "$n" link set "$v" up
    ip -n "$n" link set lo up
    if [ -n "${RATE:-}" ]; then
      ip netns exec "$n" tc qdisc add dev "$v" root tbf rate "$RATE" burst 1mb latency 50ms
    elif [ -n "${DELAY:-}${LOSS:-}" ]; then
      if ! ip netns exec "$n" tc qdisc add dev "$v" root netem \
        ${DELAY:+delay "$DELAY"} ${LOSS:+loss "$LOSS"} 2>/dev/null; then
        [ -z "${DELAY:-}" ] || { echo "no netem in this kernel: DELAY cannot be applied" >&2; exit 1; }
        printf 'table inet oxloss {\n chain in {\n  type filter hook input priority 0;\n  numgen random mod 100 < %s counter drop\n }\n}\n' \
          "${LOSS%\%}" | ip netns exec "$n" nft -f -
      fi
    fi
  done
  # A veth has no carrier for a moment after it comes up; a rank started
  # then finds its interface down (aws-ofi-nccl: no NIC, and that rank alone
  # fell back to another network). Wait for every link's carrier.
  for ((h = 0; h < hosts; h++)); do
    for ((i = 0; i < 100; i++)); do
      ip -n "${ns[$h]}" link show "${veth[$h]}" | grep -q LOWER_UP && break
      sleep 0.05
    done
    ip -n "${ns[$h]}" link show "${veth[$h]}" | grep -q LOWER_UP ||
      { echo "netns_run: ${veth[$h]} of host $h has no carrier after 5 s" >&2; exit 1; }
  done
fi
gpus=()
if [ "${GPUS:-}" = split ]; then
  count=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  [ "$count" -gt 0 ] || { echo "GPUS=split: nvidia-smi lists no GPU" >&2; exit 1; }
  for ((h = 0; h < hosts; h++)); do
    list=
    for ((l = 0; l < per; l++)); do list+="${list:+,}$(((h * per + l) % count))"; done
    gpus+=("$list")
  done
fi
port=$((20000 + $$ % 20000))
run() {
  local r=$1 h=$(($1 / per))
  shift
  ${ns[$h]:+ip netns exec "${ns[$h]}"} env RANK="$r" LOCAL_RANK=$((r % per)) WORLD_SIZE="$world" \
    LOCAL_WORLD_SIZE="$per" NCCL_COMM_ID="${addr[0]}:$port" MASTER_ADDR="${addr[0]}" \
    MASTER_PORT="$((port + 1))" NCCL_HOSTID="netns-host-$h" NCCL_SOCKET_IFNAME="${veth[$h]}" \
    ${gpus[$h]:+CUDA_VISIBLE_DEVICES=${gpus[$h]}} \
    timeout "${LIMIT:-600}" "$@"
}
pids=()
for ((r = world - 1; r >= 1; r--)); do
  if [ -n "${LOGDIR:-}" ]; then
    log="$LOGDIR/rank$r.txt"
  elif [ "$r" = 1 ]; then
    log=${LOG1:-/dev/null}
  else
    log=/dev/null
  fi
  run "$r" "$@" >"$log" 2>&1 &
  pids+=($!)
done
rc=0
run 0 "$@" || rc=$?
for p in "${pids[@]}"; do wait "$p" || rc=$((rc ? rc : $?)); done
exit "$rc"
