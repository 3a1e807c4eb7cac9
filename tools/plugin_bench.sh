# Helpers shared by the scripts that run net plugins written by others
# (tools/fastsocket*.sh, tools/aws_ofi_nccl*.sh); sourced, not run. Each
# sets `status` to 1 on a failure and leaves it alone otherwise.

# perf_run LABEL LOG CMD...: one `oxccl perf` run bounded by LIMIT (300 s);
# prints its table rows and its #wrong total.
perf_run() {
  local label=$1 log=$2
  shift 2
  local rc=0
  timeout "${LIMIT:-300}" "$@" >"$log" 2>&1 || rc=$?
  echo "## $label (rc $rc)"
  grep -E '^# [a-z_]+$|^ +[0-9]+ ' "$log" || true
  local wrong
  wrong=$(awk '/^ +[0-9]+ / && NF >= 12 {w += $9 + $13} END {print w + 0}' "$log")
  echo "## $label: #wrong total $wrong"
  [ "$rc" = 0 ] && [ "$wrong" = 0 ] || status=1
}

# want FILE REGEX: says whether FILE has a line matching REGEX.
want() {
  if grep -qE "$2" "$1"; then echo "ok:   $(basename "$1") has /$2/"; else
    echo "FAIL: $(basename "$1") lacks /$2/"
    status=1
  fi
}

# step CMD...: runs CMD, printing it, its exit status and its time.
step() {
  local t
  t=$(date +%s%N)
  echo "=== $*"
  "$@"
  local rc=$?
  echo "=== rc $rc in $((($(date +%s%N) - t) / 1000000)) ms"
  [ $rc = 0 ] || status=1
}

# Rows whose last column (#wrong) is not 0 (torch_bench prints one per size).
wrong_rows() { awk '/^ +[0-9]+ / && $NF != 0 && $NF != "N/A" {n++} END {print n + 0}' "$1"; }

# torch_ops NAME: tools/torch_bench.py for each of $ops between two network
# namespaces, once on PyTorch's NCCL and once with oxccl ($lib) preloaded,
# both with the environment in the array `net`; logs in $out. Checks that
# NCCL loaded the plugin NAME and that both connected through it.
torch_ops() {
  local name=$1 op who log w
  for op in $ops; do
    for who in nccl oxccl; do
      local pre=()
      [ $who = oxccl ] && pre=(LD_PRELOAD="$lib" BENCH_LABEL=oxccl)
      log=$out/torch_${who}_$op.log
      echo "## $op, $who"
      step env "${net[@]}" "${pre[@]}" LIMIT=200 LOG1="$out/torch_${who}_${op}_r1.log" \
        tools/netns_run.sh "$py" tools/torch_bench.py "$op" "$lo" "$hi" >"$log" 2>&1
      grep -E '^#|^ +[0-9]+ ' "$log"
      w=$(wrong_rows "$log")
      echo "## $op, $who: rows with #wrong > 0: $w"
      [ "$w" = 0 ] || status=1
    done
    want "$out/torch_nccl_$op.log" "NET/Plugin: Loaded net plugin $name"
    want "$out/torch_nccl_$op.log" "via NET/$name"
    want "$out/torch_oxccl_$op.log" "loaded net plugin $name from .*ncclNetPlugin_v"
    want "$out/torch_oxccl_$op.log" "via NET/$name"
  done
}

# against_socket TAG NAME RANKS: `oxccl perf --op all` on host memory
# through the plugin and through oxccl's own socket net, alike otherwise:
# on loopback for each of RANKS ranks, then 2 ranks in two network
# namespaces (where root and iproute2 allow, NETNS=0 skips); logs
# $out/perf_{TAG,socket}_N.log and $out/netns_{TAG,socket}.log. Uses $bin,
# $sizes and the arrays `plugin` (the plugin's environment) and `on_lo`
# (what it needs on loopback besides); checks every run names NET/NAME or
# NET/Socket. Callers add their own checks of the logs.
against_socket() {
  local tag=$1 name=$2 n p
  local info=(OXCCL_HOST_DIRECT=0 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET)
  for n in $3; do
    for p in "$tag" socket; do
      local net=("${plugin[@]}" "${on_lo[@]}")
      [ "$p" = socket ] && net=(NCCL_NET_PLUGIN=none)
      perf_run "$p, $n ranks" "$out/perf_${p}_$n.log" env "${net[@]}" "${info[@]}" \
        NCCL_SHM_DISABLE=1 "$bin" perf --ranks "$n" --op all $sizes
    done
    want "$out/perf_${tag}_$n.log" "Using network $name"
    want "$out/perf_${tag}_$n.log" "via NET/$name"
    want "$out/perf_socket_$n.log" 'via NET/Socket'
  done
  [ "${NETNS:-1}" = 1 ] || return 0
  if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null; then
    echo "## network namespaces skipped: need root and iproute2"
    return 0
  fi
  for p in "$tag" socket; do
    local net=("${plugin[@]}")
    [ "$p" = socket ] && net=(NCCL_NET_PLUGIN=none)
    perf_run "$p, 2 ranks in two network namespaces" "$out/netns_$p.log" \
      env "${net[@]}" "${info[@]}" LOG1="$out/netns_${p}_rank1.log" \
      tools/netns_perf.sh "$bin" --op all $sizes
  done
  want "$out/netns_$tag.log" "via NET/$name"
  want "$out/netns_$tag.log" 'nNodes 2|nnodes 2|2 nodes'
  want "$out/netns_socket.log" 'via NET/Socket'
}
