#!/usr/bin/env bash
# infra/cluster/kafka-node.sh N start|stop|kill|pid: one broker (N = 1, 2, 3) of the three-broker
# Kafka 4.4 KRaft cluster on 127.0.0.(N+1); each process is broker and controller (three voters,
# so the metadata quorum survives one loss). `start` formats the node's folder once (one cluster
# id for all three) and returns when the broker logs "Kafka Server started" and its port is open.
# `kill` is SIGKILL. Signals go to the recorded PID after a command-line check, never by name.
# Replication defaults for every topic the brokers create themselves: 3 replicas,
# min.insync.replicas 2 (__consumer_offsets, __transaction_state included).
set -euo pipefail
N="${1:?node number 1-3}"; CMD="${2:?start|stop|kill|pid}"
ENGINE="kafka-$N"
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
HOST="$(host_of "$N")"
VERSION="${FANOUT_ENGINES_KAFKA_VERSION:-4.4.0}"
LIB="$ENGINES_CACHE/kafka-$VERSION"
BASE="$CLUSTER_DIR/kafka-$N"
DATA="$BASE/data"; CONF="$BASE/config"; LOGS="$BASE/logs"
PIDFILE="$BASE/kafka.pid"
MARK="kafka.Kafka $CONF/server.properties"
alive() { [[ -s "$PIDFILE" ]] && cmdline_has "$(cat "$PIDFILE")" "$MARK"; }
ready() { port_open "$K_PORT" "$HOST" && grep -q 'Kafka Server started' "$LOGS/server.log" 2>/dev/null; }

case "$CMD" in
  pid) alive && cat "$PIDFILE"; exit $?;;
  stop) stop_pid "$PIDFILE" "$MARK" "${FANOUT_ENGINES_STOP_TIMEOUT:-30}"; exit 0;;
  kill) alive || die "not running"; pid="$(cat "$PIDFILE")"; kill -KILL "$pid"
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        log "killed pid $pid (SIGKILL)"; exit 0;;
  start) ;;
  *) die "unknown command $CMD (start|stop|kill|pid)";;
esac
if alive; then log "already running (pid $(cat "$PIDFILE"))"; exit 0; fi
JAVA="$(pick_java 17 99)" || die "Kafka $VERSION needs Java 17 or newer"
maven_fetch "$ENGINES_HERE/kafka-pom.xml" "$LIB" "kafka_2.13-$VERSION.jar" -Dkafka.version="$VERSION"
port_open "$K_PORT" "$HOST" && die "$HOST:$K_PORT is already in use by another process"
port_open "$K_CPORT" "$HOST" && die "$HOST:$K_CPORT is already in use by another process"
[[ "${FANOUT_CLUSTER_FRESH:-0}" == 1 ]] && rm -rf "$DATA"
mkdir -p "$CONF" "$LOGS"
VOTERS=""; for i in 1 2 3; do VOTERS+="${VOTERS:+,}$i@$(host_of "$i"):$K_CPORT"; done
cat > "$CONF/server.properties" <<PROPS
# written by infra/cluster/kafka-node.sh: broker $N of 3, broker and controller, loopback only
process.roles=broker,controller
node.id=$N
controller.quorum.voters=$VOTERS
listeners=PLAINTEXT://$HOST:$K_PORT,CONTROLLER://$HOST:$K_CPORT
advertised.listeners=PLAINTEXT://$HOST:$K_PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$DATA
num.partitions=1
default.replication.factor=3
min.insync.replicas=2
unclean.leader.election.enable=false
auto.create.topics.enable=true
offsets.topic.replication.factor=3
offsets.topic.num.partitions=5
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
transaction.state.log.num.partitions=5
share.coordinator.state.topic.replication.factor=3
share.coordinator.state.topic.min.isr=2
group.initial.rebalance.delay.ms=0
replica.lag.time.max.ms=10000
PROPS
cat > "$CONF/log4j2.properties" <<'PROPS'
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
PROPS
LOGOPTS=("-Dlog4j2.configurationFile=$CONF/log4j2.properties" "-Dkafka.logs.dir=$LOGS")
if [[ ! -f "$DATA/meta.properties" ]]; then
  [[ -s "$CLUSTER_DIR/kafka.cluster-id" ]] || die "no $CLUSTER_DIR/kafka.cluster-id (up.sh writes it)"
  "$JAVA" "-Xmx$K_HEAP" -XX:TieredStopAtLevel=1 "${LOGOPTS[@]}" -cp "$LIB/*" kafka.tools.StorageTool format \
      -t "$(cat "$CLUSTER_DIR/kafka.cluster-id")" -c "$CONF/server.properties" > "$LOGS/format.log" 2>&1 ||
    { tail_logs "$LOGS/format.log"; die "kafka-storage format failed"; }
fi
[[ -f "$LOGS/server.log" ]] && mv -f "$LOGS/server.log" "$LOGS/server.log.prev"
read -r -a JVM_OPTS <<< "${FANOUT_ENGINES_KAFKA_JVM_OPTS:--XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:TieredStopAtLevel=1 -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true}"
t0="$(now)"
start_bg "$PIDFILE" "$LOGS/stdout.log" "$JAVA" "-Xmx$K_HEAP" "${JVM_OPTS[@]}" "${LOGOPTS[@]}" -cp "$LIB/*" kafka.Kafka "$CONF/server.properties"
log "started, pid $(cat "$PIDFILE") on $HOST (heap $K_HEAP)"
while ! ready; do
  if ! alive; then tail_logs "$LOGS/server.log" "$LOGS/stdout.log"; die "the broker exited during start-up"; fi
  if older_than "$t0" "$ENGINES_TIMEOUT"; then
    tail_logs "$LOGS/server.log"; stop_pid "$PIDFILE" "$MARK" 30 || true; die "not ready after ${ENGINES_TIMEOUT}s"
  fi
  sleep 0.1
done
log "ready on $HOST:$K_PORT after $(since "$t0")s"
