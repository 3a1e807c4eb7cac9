#!/usr/bin/env bash
# `oxccl perf` as two ranks on two "hosts" (network namespaces, distinct
# NCCL_HOSTID): see tools/netns_run.sh for the setup and its variables.
#
#   tools/netns_perf.sh BIN [oxccl perf arguments...]
set -euo pipefail
bin=$1
shift
exec "$(dirname "$0")/netns_run.sh" "$bin" perf "$@"
