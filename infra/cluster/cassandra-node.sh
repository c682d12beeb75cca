#!/usr/bin/env bash
# infra/cluster/cassandra-node.sh N start|stop|kill|pid: one node (N = 1, 2, 3) of the three-node
# Cassandra 5.0 cluster on 127.0.0.(N+1). `start` returns once the node's CQL port accepts
# connections (it prints how long that took); `stop` is SIGTERM (a clean shutdown, memtables
# flushed); `kill` is SIGKILL (the node-loss tests' crash); `pid` prints the running node's PID.
# Each signal goes to the recorded PID only after checking its command line carries this node's
# -Dcassandra.config (never by name). Every node lists all three as seeds; a brand-new cluster
# skips bootstrap (auto_bootstrap: false), gossip settling and most of the ring delay.
set -euo pipefail
N="${1:?node number 1-3}"; CMD="${2:?start|stop|kill|pid}"
ENGINE="cassandra-$N"
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
HOST="$(host_of "$N")"
VERSION="${FANOUT_ENGINES_CASSANDRA_VERSION:-5.0.9}"
LIB="$ENGINES_CACHE/cassandra-$VERSION"
BASE="$CLUSTER_DIR/cassandra-$N"
DATA="$BASE/data"; CONF="$BASE/conf"; LOGS="$BASE/logs"
PIDFILE="$BASE/cassandra.pid"
MARK="-Dcassandra.config=file://$CONF/cassandra.yaml "
alive() { [[ -s "$PIDFILE" ]] && cmdline_has "$(cat "$PIDFILE")" "$MARK"; }

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
JAVA="$(pick_java 11 17)" || die "Cassandra $VERSION needs Java 11 or 17 (set JAVA_HOME)"
maven_fetch "$ENGINES_HERE/cassandra-pom.xml" "$LIB" "cassandra-all-$VERSION.jar" -Dcassandra.version="$VERSION"
JAMM="$(ls "$LIB"/jamm-*.jar | head -1)"
port_open "$C_PORT" "$HOST" && die "$HOST:$C_PORT is already in use by another process"
port_open "$C_SPORT" "$HOST" && die "$HOST:$C_SPORT is already in use by another process"
case "${FANOUT_CLUSTER_CASSANDRA_COMMITLOG:-batch}" in
  group) COMMITLOG="commitlog_sync: group\ncommitlog_sync_group_window: 15ms" ;;
  batch) COMMITLOG="commitlog_sync: batch" ;;
  periodic) COMMITLOG="commitlog_sync: periodic\ncommitlog_sync_period: 10000ms" ;;
  *) die "FANOUT_CLUSTER_CASSANDRA_COMMITLOG must be group, batch or periodic" ;;
esac
[[ "${FANOUT_CLUSTER_FRESH:-0}" == 1 ]] && rm -rf "$DATA"
mkdir -p "$CONF/triggers" "$DATA" "$LOGS"
[[ -f "$LOGS/system.log" ]] && mv -f "$LOGS/system.log" "$LOGS/system.log.prev"
SEEDS=""; for h in "${CLUSTER_HOSTS[@]}"; do SEEDS+="${SEEDS:+,}$h:$C_SPORT"; done
# The single-node template, with: all three nodes as seeds, hinted handoff on (a node that was
# away gets the writes it missed, within max_hint_window), and the cluster's own name.
sed -e "s#@DATA@#$DATA#g" -e "s#@HOST@#$HOST#g" -e "s#@CQL_PORT@#$C_PORT#g" \
    -e "s#@STORAGE_PORT@#$C_SPORT#g" -e "s#@CLUSTER@#fanout-cluster#g" -e "s#@COMMITLOG@#$COMMITLOG#g" \
    -e "s#@CONCURRENT_WRITES@#${FANOUT_ENGINES_CASSANDRA_CONCURRENT_WRITES:-128}#g" \
    -e "s#@MEMTABLE_HEAP@#${FANOUT_ENGINES_CASSANDRA_MEMTABLE_HEAP:-128MiB}#g" \
    -e "s#- seeds: .*#- seeds: \"$SEEDS\"#" \
    -e "s#^hinted_handoff_enabled: false#hinted_handoff_enabled: true\nmax_hint_window: 3h#" \
    "$ENGINES_HERE/cassandra.yaml.tmpl" > "$CONF/cassandra.yaml"
cp "$ENGINES_HERE/cassandra-logback.xml" "$CONF/logback.xml"
# the single node's JVM options minus its one-node start-up shortcuts, then the cluster's
mapfile -t JOPTS < <(grep -E '^-' "$ENGINES_HERE/cassandra-jvm.options" |
                     grep -vE 'ring_delay_ms|load_ring_state|skip_wait_for_gossip')
JOPTS+=("-Dcassandra.skip_wait_for_gossip_to_settle=0" "-Dcassandra.ring_delay_ms=${FANOUT_CLUSTER_RING_DELAY_MS:-1000}"
        "-Xms$C_HEAP" "-Xmx$C_HEAP" "-javaagent:$JAMM"
        "-Dcassandra.config=file://$CONF/cassandra.yaml" "-Dcassandra.storagedir=$DATA"
        "-Dcassandra.logdir=$LOGS" "-Dcassandra.triggers_dir=$CONF/triggers"
        "-Dlogback.configurationFile=$CONF/logback.xml" "-Dcassandra-foreground=yes"
        "-XX:HeapDumpPath=$LOGS" -cp "$CONF:$LIB/*" org.apache.cassandra.service.CassandraDaemon -f)
PRE=()
ulimit -l 64 2>/dev/null || true
[[ "$(id -u)" == 0 ]] && command -v setpriv >/dev/null && PRE=(setpriv --bounding-set -ipc_lock --inh-caps -ipc_lock)
t0="$(now)"
start_bg "$PIDFILE" "$LOGS/stdout.log" "${PRE[@]}" "$JAVA" "${JOPTS[@]}"
log "started, pid $(cat "$PIDFILE") on $HOST (heap $C_HEAP), data in $DATA"
while ! port_open "$C_PORT" "$HOST"; do
  if ! alive; then tail_logs "$LOGS/system.log" "$LOGS/stdout.log"; die "exited during start-up"; fi
  if older_than "$t0" "$ENGINES_TIMEOUT"; then
    tail_logs "$LOGS/system.log"; stop_pid "$PIDFILE" "$MARK" 30 || true; die "CQL not open after ${ENGINES_TIMEOUT}s"
  fi
  sleep 0.1
done
log "CQL ready on $HOST:$C_PORT after $(since "$t0")s"
