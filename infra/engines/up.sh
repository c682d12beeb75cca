#!/usr/bin/env bash
# infra/engines/up.sh: start (or reuse) the three engines of the distributed runtime on loopback,
# in parallel (the two Maven fetches take turns on the cache's lock), then write
# $FANOUT_ENGINES_DIR/engines.env with their URLs in fanout's settings vocabulary:
#   FANOUT_EVENT_STORE=postgresql://postgres@127.0.0.1:15432/fanout
#   FANOUT_LOG=kafka://127.0.0.1:19092
#   FANOUT_VIEWS=cassandra://127.0.0.1:19042/fanout
# Use it with:  set -a; . "${FANOUT_ENGINES_DIR:-/tmp/fanout-engines}/engines.env"; set +a
# Idempotent: engines already up are reused. If one engine fails, its log tail has been printed;
# then all three are stopped (FANOUT_ENGINES_KEEP_ON_FAILURE=1 keeps the others) and it exits 1.
# FANOUT_ENGINES=testcontainers is refused here: that is infra/testcontainers/engines.py's job.
# Settings: see lib.sh, kafka-up.sh, cassandra-up.sh and postgres-up.sh.
set -euo pipefail
ENGINE=engines-up
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

case "${FANOUT_ENGINES:-local}" in
  local) ;;
  testcontainers) die "FANOUT_ENGINES=testcontainers: run infra/testcontainers/engines.py up (needs a Docker engine)";;
  *) die "FANOUT_ENGINES=${FANOUT_ENGINES}: expected local or testcontainers";;
esac

mkdir -p "$ENGINES_DIR"
ENVFILE="$ENGINES_DIR/engines.env"
rm -f "$ENVFILE"
t0="$(now)"
declare -A PIDS
for e in postgres kafka cassandra; do
  "$ENGINES_HERE/$e-up.sh" > "$ENGINES_DIR/$e.url" &
  PIDS[$e]=$!
done
FAILED=()
for e in postgres kafka cassandra; do wait "${PIDS[$e]}" || FAILED+=("$e"); done
if (( ${#FAILED[@]} )); then
  if [[ "${FANOUT_ENGINES_KEEP_ON_FAILURE:-0}" != 1 ]]; then
    log "stopping the engines again because ${FAILED[*]} failed"
    "$ENGINES_HERE/down.sh" || true
  fi
  die "${FAILED[*]} did not start (their log tails are above)"
fi
{
  echo "# written by infra/engines/up.sh at $(date -u +%FT%TZ); engines on loopback, data in $ENGINES_DIR"
  echo "# use: set -a; . $ENVFILE; set +a"
  cat "$ENGINES_DIR/postgres.url" "$ENGINES_DIR/kafka.url" "$ENGINES_DIR/cassandra.url"
} > "$ENVFILE.tmp"
mv -f "$ENVFILE.tmp" "$ENVFILE"
rm -f "$ENGINES_DIR"/{postgres,kafka,cassandra}.url
took="$(since "$t0")"
record_timing "$ENGINES_DIR/timings" up_s "$took"
log "all three ready in ${took}s; wrote $ENVFILE"
grep -v '^#' "$ENVFILE"
