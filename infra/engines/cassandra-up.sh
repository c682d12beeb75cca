#!/usr/bin/env bash
# infra/engines/cassandra-up.sh: start (or reuse) a single-node Apache Cassandra 5.0 on 127.0.0.1
# for fanout's tests. Idempotent:
#   1. fetches cassandra-all + its runtime deps from Maven Central (cassandra-pom.xml) into the
#      cache, once per version;
#   2. writes conf/ from cassandra.yaml.tmpl, cassandra-logback.xml and cassandra-jvm.options;
#   3. starts CassandraDaemon unless the one in the PID file is alive and ours (its command line
#      carries this folder's -Dcassandra.config), then waits until the CQL port accepts connections;
#   4. prints FANOUT_VIEWS=cassandra://127.0.0.1:PORT/fanout on stdout (progress goes to stderr).
# On a start-up failure or timeout it prints the log tail, stops what it started and exits 1.
# No JMX (no port 7199, so no nodetool).
#
# Settings (environment; see lib.sh for FANOUT_ENGINES_CACHE/_DIR/_START_TIMEOUT/_FRESH):
#   FANOUT_ENGINES_CASSANDRA_VERSION       default 5.0.9
#   FANOUT_ENGINES_CASSANDRA_PORT          CQL port, default 19042
#   FANOUT_ENGINES_CASSANDRA_STORAGE_PORT  internode port (loopback), default 17000
#   FANOUT_ENGINES_CASSANDRA_HEAP          -Xms/-Xmx, default 2g (512m ran out of heap under the 100k-member crash tests)
#   FANOUT_ENGINES_CASSANDRA_KEYSPACE      keyspace named in the printed URL, default fanout
#   FANOUT_ENGINES_CASSANDRA_CONCURRENT_WRITES  mutation threads, default 128 (with the batch commit log
#                                          each waits for its fsync: see ADR-0033)
#   FANOUT_ENGINES_CASSANDRA_MEMTABLE_HEAP  memtable_heap_space, default 128MiB (a size with its unit)
#   FANOUT_ENGINES_CASSANDRA_UNSAFE_SYSTEM  1 (default): -Dcassandra.unsafesystem=true, schema changes without
#                                          flushing the schema tables (see below); 0: with
#   FANOUT_ENGINES_CASSANDRA_MLOCK=1       let Cassandra mlockall (as root that pins the whole heap)
#   FANOUT_ENGINES_CASSANDRA_COMMITLOG     batch (default: a write is acknowledged once fsynced),
#                                          group (fsync every FANOUT_ENGINES_CASSANDRA_GROUP_WINDOW, default 15ms:
#                                          no better here, see ADR-0021 and ADR-0033) or
#                                          periodic (fsync every 10 s: a crash of the machine can lose the
#                                          last seconds of acknowledged writes)
#   FANOUT_ENGINES_CASSANDRA_COMMITLOG_ACCESS  commitlog_disk_access_mode: legacy (default: mmap, and
#                                          `batch` fsyncs the segment before acknowledging), auto, mmap,
#                                          standard or direct (O_DIRECT writes and no fsync: ~15% less
#                                          CPU here, weaker against a power loss; ADR-0033's update)
# Needs a Java 11 or 17 (Cassandra 5.0 does not run on 21+; JAVA_HOME honoured when it fits) and,
# for the first fetch only, mvn.
set -euo pipefail
ENGINE=cassandra-up
# shellcheck source=lib.sh
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

VERSION="${FANOUT_ENGINES_CASSANDRA_VERSION:-5.0.9}"
PORT="${FANOUT_ENGINES_CASSANDRA_PORT:-19042}"
SPORT="${FANOUT_ENGINES_CASSANDRA_STORAGE_PORT:-17000}"
HEAP="${FANOUT_ENGINES_CASSANDRA_HEAP:-2g}"
case "${FANOUT_ENGINES_CASSANDRA_COMMITLOG:-batch}" in
  group) COMMITLOG="commitlog_sync: group\ncommitlog_sync_group_window: ${FANOUT_ENGINES_CASSANDRA_GROUP_WINDOW:-15ms}" ;;
  batch) COMMITLOG="commitlog_sync: batch" ;;
  periodic) COMMITLOG="commitlog_sync: periodic\ncommitlog_sync_period: 10000ms" ;;
  *) echo "cassandra-up: FANOUT_ENGINES_CASSANDRA_COMMITLOG must be group, batch or periodic" >&2; exit 2 ;;
esac
case "${FANOUT_ENGINES_CASSANDRA_COMMITLOG_ACCESS:-legacy}" in
  legacy|auto|mmap|standard|direct) COMMITLOG="$COMMITLOG\ncommitlog_disk_access_mode: ${FANOUT_ENGINES_CASSANDRA_COMMITLOG_ACCESS:-legacy}" ;;
  *) echo "cassandra-up: FANOUT_ENGINES_CASSANDRA_COMMITLOG_ACCESS must be legacy, auto, mmap, standard or direct" >&2; exit 2 ;;
esac
CONCURRENT_WRITES="${FANOUT_ENGINES_CASSANDRA_CONCURRENT_WRITES:-128}"
MEMTABLE_HEAP="${FANOUT_ENGINES_CASSANDRA_MEMTABLE_HEAP:-128MiB}"
[[ "$MEMTABLE_HEAP" =~ ^[1-9][0-9]*(MiB|GiB)$ ]] || { echo "cassandra-up: FANOUT_ENGINES_CASSANDRA_MEMTABLE_HEAP must be a size such as 128MiB or 1GiB" >&2; exit 2; }
[[ "$CONCURRENT_WRITES" =~ ^[1-9][0-9]*$ ]] || { echo "cassandra-up: FANOUT_ENGINES_CASSANDRA_CONCURRENT_WRITES must be a positive integer" >&2; exit 2; }
KEYSPACE="${FANOUT_ENGINES_CASSANDRA_KEYSPACE:-fanout}"
LIB="$ENGINES_CACHE/cassandra-$VERSION"
BASE="$ENGINES_DIR/cassandra"
DATA="$BASE/data"; CONF="$BASE/conf"; LOGS="$BASE/logs"
PIDFILE="$BASE/cassandra.pid"
TIMINGS="$BASE/timings"
MARK="-Dcassandra.config=file://$CONF/cassandra.yaml "

alive() { [[ -s "$PIDFILE" ]] && cmdline_has "$(cat "$PIDFILE")" "$MARK"; }
url() { echo "FANOUT_VIEWS=cassandra://127.0.0.1:$PORT/$KEYSPACE"; }

fail() {
  tail_logs "$LOGS/system.log" "$LOGS/stdout.log"
  alive && ENGINE=cassandra-up stop_pid "$PIDFILE" "$MARK" 30 || true
  die "$1"
}

wait_ready() {
  local t0="$1"
  while ! port_open "$PORT"; do
    alive || fail "Cassandra exited during start-up (logs in $LOGS)"
    older_than "$t0" "$ENGINES_TIMEOUT" && fail "CQL port $PORT not open after ${ENGINES_TIMEOUT}s (FANOUT_ENGINES_START_TIMEOUT)"
    sleep 0.1
  done
  local took; took="$(since "$t0")"
  log "CQL ready on 127.0.0.1:$PORT after ${took}s (pid $(cat "$PIDFILE"), log $LOGS/system.log)"
  [[ "${2:-}" == reused ]] || record_timing "$TIMINGS" start_to_ready_s "$took"
}

mkdir -p "$BASE"
if alive; then
  log "already running (pid $(cat "$PIDFILE"))"
  wait_ready "$(now)" reused; record_timing "$TIMINGS" reused 1; url; exit 0
fi
rm -f "$PIDFILE" "$TIMINGS"

JAVA="$(pick_java 11 17)" || die "Cassandra $VERSION needs Java 11 or 17, not 21+ (set JAVA_HOME)"
maven_fetch "$ENGINES_HERE/cassandra-pom.xml" "$LIB" "cassandra-all-$VERSION.jar" -Dcassandra.version="$VERSION"
JAMM="$(ls "$LIB"/jamm-*.jar 2>/dev/null | head -1)"
[[ -n "$JAMM" ]] || die "no jamm-*.jar in $LIB (the server needs it as -javaagent)"

port_open "$PORT" && die "port 127.0.0.1:$PORT is already in use by another process (FANOUT_ENGINES_CASSANDRA_PORT)"
port_open "$SPORT" && die "port 127.0.0.1:$SPORT is already in use by another process (FANOUT_ENGINES_CASSANDRA_STORAGE_PORT)"
if [[ "${FANOUT_ENGINES_FRESH:-0}" == 1 ]]; then log "FANOUT_ENGINES_FRESH=1: wiping $DATA"; rm -rf "$DATA"; fi
mkdir -p "$CONF/triggers" "$DATA" "$LOGS"
[[ -f "$LOGS/system.log" ]] && mv -f "$LOGS/system.log" "$LOGS/system.log.prev"
sed -e "s#@DATA@#$DATA#g" -e "s#@HOST@#127.0.0.1#g" -e "s#@CQL_PORT@#$PORT#g" \
    -e "s#@STORAGE_PORT@#$SPORT#g" -e "s#@CLUSTER@#fanout-local#g" -e "s#@COMMITLOG@#$COMMITLOG#g" \
    -e "s#@CONCURRENT_WRITES@#$CONCURRENT_WRITES#g" -e "s#@MEMTABLE_HEAP@#$MEMTABLE_HEAP#g" \
    "$ENGINES_HERE/cassandra.yaml.tmpl" > "$CONF/cassandra.yaml"
cp "$ENGINES_HERE/cassandra-logback.xml" "$CONF/logback.xml"
mapfile -t JOPTS < <(grep -E '^-' "$ENGINES_HERE/cassandra-jvm.options")
JOPTS+=("-Xms$HEAP" "-Xmx$HEAP" "-javaagent:$JAMM"
        "-Dcassandra.config=file://$CONF/cassandra.yaml" "-Dcassandra.storagedir=$DATA"
        "-Dcassandra.logdir=$LOGS" "-Dcassandra.triggers_dir=$CONF/triggers"
        "-Dlogback.configurationFile=$CONF/logback.xml" "-Dcassandra-foreground=yes"
        "-XX:HeapDumpPath=$LOGS")
# Schema changes (a keyspace of 22 tables: 6-8 s to create, 4-8 s to drop) flush the schema tables
# after each statement unless cassandra.unsafesystem is set; their mutations are in the commit log
# either way (replayed after a crash), so the data's durability is unchanged. Each test makes and
# drops a keyspace: on by default here, FANOUT_ENGINES_CASSANDRA_UNSAFE_SYSTEM=0 for the flushes.
[[ "${FANOUT_ENGINES_CASSANDRA_UNSAFE_SYSTEM:-1}" == 1 ]] && JOPTS+=("-Dcassandra.unsafesystem=true")
JOPTS+=(-cp "$CONF:$LIB/*" org.apache.cassandra.service.CassandraDaemon -f)

# As root, Cassandra's mlockall() succeeds and faults the whole heap in (RSS about 1.5 GB at idle).
# Drop CAP_IPC_LOCK and lower RLIMIT_MEMLOCK so it fails harmlessly (one WARN line).
PRE=()
if [[ "${FANOUT_ENGINES_CASSANDRA_MLOCK:-0}" != 1 ]]; then
  ulimit -l 64 2>/dev/null || true
  [[ "$(id -u)" == 0 ]] && command -v setpriv >/dev/null && PRE=(setpriv --bounding-set -ipc_lock --inh-caps -ipc_lock)
fi

t0="$(now)"
start_bg "$PIDFILE" "$LOGS/stdout.log" "${PRE[@]}" "$JAVA" "${JOPTS[@]}"
log "started Cassandra $VERSION, pid $(cat "$PIDFILE") ($JAVA, heap $HEAP), data in $DATA"
wait_ready "$t0"
url
