#!/usr/bin/env bash
# infra/cluster/down.sh [--wipe] (`make cluster-down`): stop what infra/cluster/up.sh started,
# each process by its recorded PID after a command-line check, in parallel; remove cluster.env.
# --wipe also deletes $FANOUT_CLUSTER_DIR's data. Idempotent.
set -euo pipefail
ENGINE=cluster-down
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
t0="$(now)"
declare -A PIDS
for n in 1 2 3; do
  "$CLUSTER_HERE/kafka-node.sh" "$n" stop & PIDS[kafka-$n]=$!
  "$CLUSTER_HERE/cassandra-node.sh" "$n" stop & PIDS[cassandra-$n]=$!
done
( FANOUT_ENGINES_DIR="$CLUSTER_DIR" "$ENGINES_HERE/postgres-down.sh" "$@" ) & PIDS[postgres]=$!
FAILED=()
for e in "${!PIDS[@]}"; do wait "${PIDS[$e]}" || FAILED+=("$e"); done
rm -f "$CLUSTER_DIR/cluster.env"
if [[ "${1:-}" == --wipe ]]; then
  rm -rf "$CLUSTER_DIR"/kafka-*/data "$CLUSTER_DIR"/cassandra-*/data "$CLUSTER_DIR/kafka.cluster-id"
  log "wiped the nodes' data"
fi
(( ${#FAILED[@]} )) && die "could not stop: ${FAILED[*]}"
log "all stopped in $(since "$t0")s"
