#!/usr/bin/env bash
# infra/engines/kafka-up.sh: start (or reuse) a single-node Apache Kafka 4.x broker in KRaft mode,
# one process acting as broker and controller, on 127.0.0.1, for fanout's tests. Idempotent:
#   1. fetches kafka_2.13 + its runtime deps from Maven Central (kafka-pom.xml) into the cache,
#      once per version;
#   2. formats the data folder once (a fresh cluster id);
#   3. starts the broker unless the one in the PID file is alive and ours (its command line carries
#      this folder's server.properties), then waits until it is ready: "Kafka Server started" in
#      the log and the client port accepting connections;
#   4. prints FANOUT_LOG=kafka://127.0.0.1:PORT on stdout (progress goes to stderr).
# On a start-up failure or timeout it prints the log tail, stops what it started and exits 1.
#
# Settings (environment; see lib.sh for FANOUT_ENGINES_CACHE/_DIR/_START_TIMEOUT/_FRESH):
#   FANOUT_ENGINES_KAFKA_VERSION          default 4.4.0 (3.9.2 also works)
#   FANOUT_ENGINES_KAFKA_PORT             client port, default 19092
#   FANOUT_ENGINES_KAFKA_CONTROLLER_PORT  KRaft controller port, default 19093
#   FANOUT_ENGINES_KAFKA_HEAP             default 512m (-Xmx)
#   FANOUT_ENGINES_KAFKA_JVM_OPTS         default: G1, short pauses, C1-only JIT (about 2x faster
#                                         start on 2 cores), exit on OOM
# Needs Java 17+ (JAVA_HOME honoured) and, for the first fetch only, mvn.
set -euo pipefail
ENGINE=kafka-up
# shellcheck source=lib.sh
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"

VERSION="${FANOUT_ENGINES_KAFKA_VERSION:-4.4.0}"
PORT="${FANOUT_ENGINES_KAFKA_PORT:-19092}"
CPORT="${FANOUT_ENGINES_KAFKA_CONTROLLER_PORT:-19093}"
HEAP="${FANOUT_ENGINES_KAFKA_HEAP:-512m}"
read -r -a JVM_OPTS <<< "${FANOUT_ENGINES_KAFKA_JVM_OPTS:--XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:TieredStopAtLevel=1 -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true}"
LIB="$ENGINES_CACHE/kafka-$VERSION"
BASE="$ENGINES_DIR/kafka"
DATA="$BASE/data"; CONF="$BASE/config"; LOGS="$BASE/logs"
PIDFILE="$BASE/kafka.pid"
TIMINGS="$BASE/timings"
MARK="kafka.Kafka $CONF/server.properties"   # what our broker's command line carries

alive() { [[ -s "$PIDFILE" ]] && cmdline_has "$(cat "$PIDFILE")" "$MARK"; }
ready() { port_open "$PORT" && grep -q 'Kafka Server started' "$LOGS/server.log" 2>/dev/null; }
url() { echo "FANOUT_LOG=kafka://127.0.0.1:$PORT"; }

fail() {   # fail MESSAGE: log tail, stop what is running from this folder, exit 1
  tail_logs "$LOGS/server.log" "$LOGS/stdout.log"
  alive && ENGINE=kafka-up stop_pid "$PIDFILE" "$MARK" 30 || true
  die "$1"
}

wait_ready() {
  local t0="$1"
  while ! ready; do
    alive || fail "the broker exited during start-up (logs in $LOGS)"
    older_than "$t0" "$ENGINES_TIMEOUT" && fail "not ready after ${ENGINES_TIMEOUT}s (FANOUT_ENGINES_START_TIMEOUT)"
    sleep 0.1
  done
  local took; took="$(since "$t0")"
  log "ready on 127.0.0.1:$PORT after ${took}s (pid $(cat "$PIDFILE"), log $LOGS/server.log)"
  [[ "${2:-}" == reused ]] || record_timing "$TIMINGS" start_to_ready_s "$took"
}

mkdir -p "$BASE"
if alive; then
  log "already running (pid $(cat "$PIDFILE"))"
  wait_ready "$(now)" reused; record_timing "$TIMINGS" reused 1; url; exit 0
fi
rm -f "$PIDFILE" "$TIMINGS"

JAVA="$(pick_java 17 99)" || die "Kafka $VERSION needs Java 17 or newer (set JAVA_HOME)"
maven_fetch "$ENGINES_HERE/kafka-pom.xml" "$LIB" "kafka_2.13-$VERSION.jar" -Dkafka.version="$VERSION"

port_open "$PORT" && die "port 127.0.0.1:$PORT is already in use by another process (FANOUT_ENGINES_KAFKA_PORT)"
port_open "$CPORT" && die "port 127.0.0.1:$CPORT is already in use by another process (FANOUT_ENGINES_KAFKA_CONTROLLER_PORT)"
if [[ "${FANOUT_ENGINES_FRESH:-0}" == 1 ]]; then log "FANOUT_ENGINES_FRESH=1: wiping $DATA"; rm -rf "$DATA"; fi
if [[ -f "$DATA/meta.properties" ]]; then   # KRaft metadata cannot go back to an older version
  FMT_V="$(cat "$DATA/.formatted-by" 2>/dev/null || echo "$VERSION")"
  [[ "$(printf '%s\n%s\n' "$FMT_V" "$VERSION" | sort -V | head -1)" == "$FMT_V" ]] ||
    die "$DATA was formatted by Kafka $FMT_V, newer than $VERSION; rerun with FANOUT_ENGINES_FRESH=1"
fi

# config, rewritten on every start (the ports may change between runs)
mkdir -p "$CONF" "$LOGS"
cat > "$CONF/server.properties" <<EOF
# written by infra/engines/kafka-up.sh: one node, broker and controller, loopback only
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CPORT
listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CPORT
advertised.listeners=PLAINTEXT://127.0.0.1:$PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$DATA
num.partitions=1
auto.create.topics.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=5
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=5
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
EOF
cat > "$CONF/log4j2.properties" <<'EOF'
status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = ${sys:kafka.logs.dir}/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.state.name = state.change.logger
logger.state.level = WARN
EOF
LOGOPTS=("-Dlog4j2.configurationFile=$CONF/log4j2.properties" "-Dkafka.logs.dir=$LOGS")
CP="$LIB/*"

if [[ ! -f "$DATA/meta.properties" ]]; then
  t0="$(now)"
  if [[ ! -s "$BASE/cluster.id" || "${FANOUT_ENGINES_FRESH:-0}" == 1 ]]; then
    # a Kafka cluster id is a base64url UUID (22 chars); avoid a leading '-' (read as an option)
    CID="-"; while [[ "$CID" == -* ]]; do CID="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')"; done
    echo "$CID" > "$BASE/cluster.id"
  fi
  "$JAVA" "-Xmx$HEAP" -XX:TieredStopAtLevel=1 "${LOGOPTS[@]}" -cp "$CP" kafka.tools.StorageTool format \
      -t "$(cat "$BASE/cluster.id")" -c "$CONF/server.properties" > "$LOGS/format.log" 2>&1 ||
    { tail_logs "$LOGS/format.log"; die "kafka-storage format failed"; }
  echo "$VERSION" > "$DATA/.formatted-by"
  took="$(since "$t0")"; record_timing "$TIMINGS" format_s "$took"
  log "formatted $DATA (cluster id $(cat "$BASE/cluster.id")) in ${took}s"
fi

[[ -f "$LOGS/server.log" ]] && mv -f "$LOGS/server.log" "$LOGS/server.log.prev"
t0="$(now)"
start_bg "$PIDFILE" "$LOGS/stdout.log" \
  "$JAVA" "-Xmx$HEAP" "${JVM_OPTS[@]}" "${LOGOPTS[@]}" -cp "$CP" kafka.Kafka "$CONF/server.properties"
log "started Kafka $VERSION, pid $(cat "$PIDFILE") ($JAVA)"
wait_ready "$t0"
url
