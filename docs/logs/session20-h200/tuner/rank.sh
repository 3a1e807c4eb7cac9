#!/bin/bash
# Rank 1 exports $R1, the others $R0 (space-separated VAR=VAL).
if [ "$RANK" = 1 ]; then for kv in $R1; do export "$kv"; done; else for kv in $R0; do export "$kv"; done; fi
exec "$@"
