#!/usr/bin/env bash
# infra/cluster/up.sh (`make cluster-up`): a three-node Cassandra 5.0 cluster and a three-broker
# Kafka 4.4 KRaft cluster on 127.0.0.2-127.0.0.4 (Cassandra CQL 29042 / storage 27000, Kafka 29092
# / controller 29093 on each address), plus a PostgreSQL of its own on 127.0.0.1:25432, all in
# $FANOUT_CLUSTER_DIR (default /tmp/fanout-cluster); the single-node engines of infra/engines are
# not touched. Everything starts in parallel; then a check (infra/cluster/check.py) writes and
# reads at ALL on a keyspace with RF 3 and waits until a topic with 3 replicas has all three in
# sync; then $FANOUT_CLUSTER_DIR/cluster.env gets the URLs:
#   FANOUT_EVENT_STORE=postgresql://postgres@127.0.0.1:25432/fanout
#   FANOUT_LOG=kafka://127.0.0.2:29092,127.0.0.3:29092,127.0.0.4:29092?replication=3&min_insync=2
#   FANOUT_VIEWS=cassandra://127.0.0.2:29042,127.0.0.3:29042,127.0.0.4:29042/fanout?replication=3&consistency=LOCAL_QUORUM&in_flight=24
# Idempotent (running nodes are reused). Prints how long start-up took. On a failure: the log
# tails, everything stopped (FANOUT_ENGINES_KEEP_ON_FAILURE=1 keeps it), exit 1. Settings: lib.sh.
set -euo pipefail
ENGINE=cluster-up
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
PY="${PY:-$CLUSTER_HERE/../../.venv/bin/python}"
mkdir -p "$CLUSTER_DIR"
ENVFILE="$CLUSTER_DIR/cluster.env"
rm -f "$ENVFILE"
t0="$(now)"
if [[ "${FANOUT_CLUSTER_FRESH:-0}" == 1 ]]; then
  for n in 1 2 3; do
    "$CLUSTER_HERE/kafka-node.sh" "$n" pid >/dev/null 2>&1 || rm -rf "$CLUSTER_DIR/kafka-$n/data"
  done
  rm -f "$CLUSTER_DIR/kafka.cluster-id"
fi
if [[ ! -s "$CLUSTER_DIR/kafka.cluster-id" ]]; then
  CID="-"; while [[ "$CID" == -* ]]; do CID="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')"; done
  echo "$CID" > "$CLUSTER_DIR/kafka.cluster-id"
fi
declare -A PIDS
( FANOUT_ENGINES_DIR="$CLUSTER_DIR" FANOUT_ENGINES_POSTGRES_PORT="$PG_PORT" \
  FANOUT_ENGINES_FRESH="${FANOUT_CLUSTER_FRESH:-0}" "$ENGINES_HERE/postgres-up.sh" > "$CLUSTER_DIR/postgres.url" ) &
PIDS[postgres]=$!
for n in 1 2 3; do
  "$CLUSTER_HERE/kafka-node.sh" "$n" start & PIDS[kafka-$n]=$!
  "$CLUSTER_HERE/cassandra-node.sh" "$n" start & PIDS[cassandra-$n]=$!
done
FAILED=()
for e in "${!PIDS[@]}"; do wait "${PIDS[$e]}" || FAILED+=("$e"); done
stop_all() {
  if [[ "${FANOUT_ENGINES_KEEP_ON_FAILURE:-0}" != 1 ]]; then log "stopping the cluster again"; "$CLUSTER_HERE/down.sh" || true; fi
}
if (( ${#FAILED[@]} )); then stop_all; die "${FAILED[*]} did not start (log tails above)"; fi
log "every process is up after $(since "$t0")s; checking replication"
KAFKA="kafka://"; CASS="cassandra://"
for h in "${CLUSTER_HOSTS[@]}"; do KAFKA+="$h:$K_PORT,"; CASS+="$h:$C_PORT,"; done
KAFKA="${KAFKA%,}?partitions=${FANOUT_CLUSTER_PARTITIONS:-6}&replication=3&min_insync=2"
CASS="${CASS%,}/fanout?replication=3&consistency=LOCAL_QUORUM&in_flight=${FANOUT_CLUSTER_IN_FLIGHT:-24}"
t1="$(now)"
if ! "$PY" "$CLUSTER_HERE/check.py" "$KAFKA" "$CASS"; then stop_all; die "the replication check failed"; fi
log "replication check passed in $(since "$t1")s"
{
  echo "# written by infra/cluster/up.sh at $(date -u +%FT%TZ); 3 Cassandra + 3 Kafka on $(csv_hosts), data in $CLUSTER_DIR"
  echo "# use: set -a; . $ENVFILE; set +a"
  cat "$CLUSTER_DIR/postgres.url"
  echo "FANOUT_LOG=$KAFKA"
  echo "FANOUT_VIEWS=$CASS"
} > "$ENVFILE.tmp"
mv -f "$ENVFILE.tmp" "$ENVFILE"
rm -f "$CLUSTER_DIR/postgres.url"
took="$(since "$t0")"
record_timing "$CLUSTER_DIR/timings" up_s "$took"
log "cluster ready in ${took}s; wrote $ENVFILE"
grep -v '^#' "$ENVFILE"
